"""Bad input gets a clear error: wrong tiling, unsupported ops, mixed devices, kernel errors."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, run_python

import torch_nntile
from torch_nntile.graph import axes


def test_tiling_sum_mismatch_names_group():
    x = torch.randn(10, 4).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "rows_bad"})
    with pytest.raises(ValueError, match=r"'rows_bad'.*sum to 9.*extent is 10"):
        torch_nntile.set_axis_group_tiling("rows_bad", [5, 4])
    with pytest.raises(ValueError, match="'rows_bad'.*positive"):
        torch_nntile.set_axis_group_tiling("rows_bad", 0)


def test_unknown_group_name():
    with pytest.raises(ValueError, match="unknown axis group name 'no_such_group'"):
        torch_nntile.set_axis_group_tiling("no_such_group", 4)


def test_a_tiling_outlives_its_groups_until_cleared():
    """A tiling is kept by name, so clearing it must work once the groups are gone (the
    old tiling would come back on the next group given that name)."""
    x = torch.randn(8, 3).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "gone_rows"})
    torch_nntile.set_axis_group_tiling("gone_rows", 4)
    torch_nntile.execute()
    torch_nntile.wait()
    del x
    gc.collect()
    assert "gone_rows" not in axes.live_names()
    torch_nntile.set_axis_group_tiling("gone_rows", None)
    y = torch.randn(8, 3).to("nntile")
    torch_nntile.set_axis_group_name(y, {0: "gone_rows"})
    rows = [line for line in torch_nntile.format_axis_groups().splitlines() if line.startswith("name='gone_rows' ")]
    assert rows and all(line.endswith(" pending_ntiles=1 pending_tiles=8") for line in rows), rows
    with pytest.raises(ValueError, match="unknown axis group name 'never_named'"):
        torch_nntile.set_axis_group_tiling("never_named", None)


def test_naming_a_cpu_tensor_says_to_move_it_first():
    with pytest.raises(TypeError, match=r"set_axis_group_name needs a tensor on nntile, got cpu"):
        torch_nntile.set_axis_group_name(torch.randn(3), {0: "batch"})


def test_bad_dim_in_name():
    x = torch.randn(3).to("nntile")
    with pytest.raises(ValueError, match="dimension 2 out of range"):
        torch_nntile.set_axis_group_name(x, {2: "z"})


def test_merged_named_groups_keep_both_names():
    """An op merging two named groups: either name tiles the result; two different
    tilings are an error naming both groups, and nothing pending is lost."""
    a = torch.randn(8, 3).to("nntile")
    b = torch.randn(8, 3).to("nntile")
    torch_nntile.set_axis_group_name(a, {0: "rows_m1"})
    torch_nntile.set_axis_group_name(b, {0: "rows_m2"})
    y = (a + b) * 2
    torch_nntile.set_axis_group_tiling("rows_m2", 3)
    assert "name='rows_m1=rows_m2'" in torch_nntile.format_axis_groups()
    assert "pending_ntiles=3 pending_tiles=3,3,2" in torch_nntile.format_axis_groups()
    torch_nntile.set_axis_group_tiling("rows_m1", 4)
    with pytest.raises(ValueError, match=r"'rows_m1'.*'rows_m2'.*tiled differently.*\[4, 4\].*\[3, 3, 2\]"):
        y.cpu()
    torch_nntile.set_axis_group_tiling("rows_m1", 3)  # the same tiling under both names is fine
    assert_close(y.cpu(), (a.cpu() + b.cpu()) * 2)


def test_a_tiling_error_of_a_long_recording_is_raised_where_it_would_be():
    """Recording that flushes early (FLUSH_OPS pending ops) and meets an invalid tiling
    does not raise from some op in the middle: the graph stays pending, the read-back
    raises as it would for a short program, and nothing recorded is lost."""
    from torch_nntile.session import FLUSH_OPS
    a = torch.randn(8, 3)
    an, bn = a.to("nntile"), torch.ones(8, 3).to("nntile")
    torch_nntile.set_axis_group_name(an, {0: "rows_l1"})
    torch_nntile.set_axis_group_name(bn, {0: "rows_l2"})
    torch_nntile.set_axis_group_tiling("rows_l1", 4)
    torch_nntile.set_axis_group_tiling("rows_l2", 3)
    y, want = an, a
    for _ in range(FLUSH_OPS + 10):  # no op raises: the early flush found the error and left it
        y, want = y + bn, want + 1
    with pytest.raises(ValueError, match=r"'rows_l1'.*'rows_l2'.*tiled differently"):
        y.cpu()
    torch_nntile.set_axis_group_tiling("rows_l2", 4)
    assert_close(y.cpu(), want)


def test_unsupported_op_names_aten_op():
    x = torch.randn(5).to("nntile")
    with pytest.raises(RuntimeError, match=r"aten::_logcumsumexp.* not supported on the nntile device"):
        torch.logcumsumexp(x, 0)


def test_cpu_fallback_counts_each_call():
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    before = torch_nntile.fallback_counts().get("aten::_logcumsumexp", 0)
    x = torch.randn(5)
    xn = x.to("nntile")
    y = torch.logcumsumexp(xn, 0)
    z = torch.logcumsumexp(y * 2, 0)
    assert y.device.type == "nntile"
    assert_close(z.cpu(), torch.logcumsumexp(torch.logcumsumexp(x, 0) * 2, 0))
    assert torch_nntile.fallback_counts()["aten::_logcumsumexp"] == before + 2


def test_cpu_fallback_inplace_writes_back():
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    x = torch.randn(6)
    xn = x.to("nntile")
    xn.clamp_(min=0)
    assert_close(xn.cpu(), x.clamp(min=0))


def test_mixed_devices():
    x = torch.randn(3, 3).to("nntile")
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.randn(3, 3)


def test_kernel_error_raised_from_wait_naming_op():
    logits = torch.randn(4, 3).to("nntile")
    target = torch.tensor([0, 1, 7, 2]).to("nntile")  # 7 is out of range for 3 classes
    loss = F.nll_loss(logits, target)
    with pytest.raises(torch_nntile.KernelError, match="nll_loss_forward"):
        loss.cpu()
    ok = torch.randn(2, 2).to("nntile")
    assert_close((ok + 1).cpu(), ok.cpu() + 1)  # the runtime is still usable


def test_use_after_shutdown_raises():
    code = (
        "import torch, torch_nntile\n"
        "torch_nntile.init_context(ncpu=1)\n"
        "x = torch.ones(3).to('nntile')\n"
        "print((x * 2).cpu().tolist())\n"
        "torch_nntile.shutdown_context()\n"
        "try:\n"
        "    x + 1\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
        "try:\n"
        "    x.cpu()\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[2.0, 2.0, 2.0]"
    assert sum("shut down" in ln for ln in lines if ln.startswith("ERR")) == 2


def test_kernel_error_is_also_the_kernels_exception_type():
    """CPU raises IndexError for an index out of range; on nntile the kernel finds it, and
    the error raised at the read-back is both a KernelError and an IndexError."""
    x, i = torch.randn(3, 4), torch.tensor([0, 7])
    with pytest.raises(IndexError):
        torch.index_select(x, 0, i)
    y = torch.index_select(x.to("nntile"), 0, i.to("nntile"))
    with pytest.raises(IndexError, match="index_select.*out of range") as info:
        y.cpu()
    assert isinstance(info.value, torch_nntile.KernelError)
