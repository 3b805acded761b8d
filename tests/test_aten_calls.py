"""Untiled and batched tasks called from C++ (backend/aten_calls.py): the ops run with
an ATEN record (no Python on the worker) and give CPU's values, written arguments
included; an op that raises on the worker fails its task with CPU's exception; a
kernel written in Python runs as Python."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import torch_nntile
from torch_nntile import stats
from torch_nntile.backend import aten_calls
from torch_nntile.backend.untiled import run_untiled
from torch_nntile.kernels import CpuScalar, Slot, native
from torch_nntile.runtime.failures import KernelError
from torch_nntile.session import SESSION_STATE


def _untiled_records(wait: bool = True) -> list[int | None]:
    """Lower what is pending; the record kind of each untiled or batched task; run."""
    torch_nntile.compile_graph()
    recs = [native.record(t[0], t[3]) for t in SESSION_STATE.compiled.tasks if t[0].fn is run_untiled]
    torch_nntile.run()
    if wait:
        torch_nntile.wait()
    return [None if r is None else r[0][0] for r in recs]


def _batch(x: torch.Tensor, tiles: int | list[int]) -> torch.Tensor:
    torch_nntile.set_axis_group_name(x, {0: f"b{id(x)}"})
    torch_nntile.set_axis_group_tiling(f"b{id(x)}", tiles)
    return x


OPS = {  # ops with no tiled kernel: lists of ints and floats, optional tensors, scalars, several results
    "conv_transpose_groups": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1, groups=2),
                              (5, 4, 6, 5), (4, 3, 3, 3)),
    "upsample_bilinear": (lambda x: F.interpolate(x, scale_factor=(1.5, 2.0), mode="bilinear"), (5, 2, 4, 6)),
    "avg_pool_divisor": (lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, divisor_override=2), (5, 2, 7, 6)),
    "grid_sample": (lambda x, g: F.grid_sample(x, g.tanh(), align_corners=False), (5, 2, 4, 6), (5, 3, 4, 2)),
    "softshrink": (lambda x: F.softshrink(x, 0.3), (5, 4)),
    "huber": (lambda x, y: F.huber_loss(x, y, delta=0.7, reduction="sum"), (5, 4), (5, 4)),
    "adaptive_max_pool": (lambda x: F.adaptive_max_pool2d(x, (2, 3), return_indices=True), (5, 2, 7, 6)),
}


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("tiles", [None, [3, 2]], ids=["untiled", "batch_tiled"])
def test_untiled_ops_run_from_cpp(name, tiles):
    """Values and gradients are CPU's, and every task of these ops has a C record."""
    torch.manual_seed(0)
    fn, *shapes = OPS[name]
    xs = [torch.randn(s).requires_grad_() for s in shapes]
    ds = [x.detach().to("nntile") for x in xs]
    if tiles is not None:
        _batch(ds[0], tiles)
    ds = [d.requires_grad_() for d in ds]
    torch_nntile.reset_info()
    want, got = fn(*xs), fn(*ds)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    cot = torch.randn(want[0].shape)
    want[0].backward(cot)
    got[0].backward(cot.to("nntile"))
    kinds = _untiled_records()
    assert kinds and all(k in (native.ATEN, native.MAX_POOL2D, native.MAX_POOL2D_GRAD) for k in kinds), kinds
    for g, w in zip(got, want):
        assert_close(g.detach().cpu(), w.detach(), rtol=1e-5, atol=1e-5)
    for d, x in zip(ds, xs):
        assert_close(d.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
    assert stats.FALLBACK_CALLS == {}


def test_an_op_raising_on_the_worker_fails_its_task_with_cpus_error():
    x, bad = torch.randn(4, 3), torch.tensor([0, 1, 7, 2])
    with pytest.raises(RuntimeError) as cpu:
        F.multi_margin_loss(x, bad)
    loss = F.multi_margin_loss(x.to("nntile"), bad.to("nntile"))
    assert _untiled_records(wait=False) == [native.ATEN]
    with pytest.raises(KernelError) as dev:
        loss.item()
    assert type(dev.value.__cause__) is RuntimeError and str(dev.value.__cause__) == str(cpu.value)
    assert "aten::multi_margin_loss" in str(dev.value)
    ok = torch.tensor([0, 1, 2, 2])  # the next call of the same prepared op runs
    assert_close(F.multi_margin_loss(x.to("nntile"), ok.to("nntile")).cpu(), F.multi_margin_loss(x, ok))


def test_arguments_the_encoding_takes_and_refuses():
    def t(ty, v):  # buffers: Slot(0) is buffer 3, Slot(-1) (an out= argument) buffer 1
        return aten_calls._token(ty, v, {0: 3, -1: 1})

    assert t("Tensor", Slot(0)) == (aten_calls.SLOT, 3)
    assert t("Tensor", Slot(-1)) == (aten_calls.SLOT, 1)
    assert t("Tensor", Slot(1)) is None  # not among the task's buffers
    assert t("Optional[Tensor]", None) == (aten_calls.NONE,)
    assert t("Tensor", None) is None
    assert t("Tensor", CpuScalar(torch.tensor(2.5))) == (aten_calls.SCALAR_TENSOR, 2.5, 6)
    assert t("Tensor", CpuScalar(torch.tensor(1j))) is None
    assert t("List[Optional[Tensor]]", (Slot(0), None)) == (aten_calls.OPT_SLOTS, (3, -1))
    assert t("List[Tensor]", (Slot(0), None)) is None
    assert t("Optional[int]", torch.float64) == (aten_calls.INT, 7)
    assert t("Optional[int]", torch.channels_last) == (aten_calls.INT, 2)
    assert t("int", True) is None
    assert t("float", 2) == (aten_calls.FLOAT, 2.0)
    assert t("number", 3) == (aten_calls.INT, 3) and t("number", 0.5) == (aten_calls.FLOAT, 0.5)
    assert t("number", 1j) is None
    assert t("List[int]", (1, 2)) == (aten_calls.INTS, (1, 2))
    assert t("List[int]", (1, True)) is None and t("List[int]", 3) is None
    assert t("List[bool]", (True, False)) == (aten_calls.BOOLS, (True, False))
    assert t("Device", torch.device("cpu")) == (aten_calls.DEVICE_CPU,)
    assert t("Generator", object()) is None


def test_written_arguments_from_cpp():
    """In place (the input copied first), out= resized from an empty tensor, out= that is
    also the input: as run_untiled does them, from C++."""
    x = torch.rand(4, 3) + 0.5
    xn = x.to("nntile")
    xn.digamma_()
    on = torch.empty(0).to("nntile")
    torch.polygamma(1, x.to("nntile"), out=on)
    an = x.to("nntile")
    torch.special.bessel_j0(an, out=an)
    assert _untiled_records() == [native.ATEN] * 3
    assert_close(xn.cpu(), x.digamma())
    assert on.shape == (4, 3) and on.cpu().equal(torch.polygamma(1, x))
    assert_close(an.cpu(), torch.special.bessel_j0(x))


def test_python_forms_run_the_python_kernel():
    """A kernel written in Python (CUDA's integer histc) has no call to prepare."""
    xn = torch.tensor([1, 3, 3, 7], dtype=torch.int32).to("nntile")
    h = torch.histc(xn, 4, 0, 8)
    assert _untiled_records() == [None]
    assert h.cpu().tolist() == [1, 2, 0, 1]
