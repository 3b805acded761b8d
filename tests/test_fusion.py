"""Elementwise chains run as one task per tile: intermediate results nothing holds
never become tiles, held ones are further outputs of the task; results are CPU's."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close

import torch_nntile
from torch_nntile.session import SESSION_STATE


def _tasks() -> dict[str, int]:
    torch_nntile.wait()
    return {k: v["tasks"] for k, v in torch_nntile.metrics()["kernels"].items()}


def _tiled(x: torch.Tensor, name: str, tiling) -> torch.Tensor:
    xn = x.to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: name})
    torch_nntile.set_axis_group_tiling(name, tiling)
    torch_nntile.execute()
    torch_nntile.wait()
    return xn


def test_a_chain_is_one_task_per_tile(python_tasks):
    """Float chains fold into one task per tile; a comparison's bool result is a task
    of its own (a C map), read by the fused chain of its float reader."""
    x, row = torch.randn(10, 6), torch.randn(6)
    rn = row.to("nntile")
    xn = _tiled(x, "rows_fc", [4, 6])  # runs rn's copy too
    torch_nntile.reset_info()
    y = torch.where((xn * 2 + rn).exp() > 1.5, xn - rn, (-xn).sigmoid())  # bool and float steps, broadcast row
    want = torch.where((x * 2 + row).exp() > 1.5, x - row, (-x).sigmoid())
    assert_close(y.cpu(), want)
    assert _tasks() == {"mul+add+exp": 2, "gt": 2, "sub+neg+sigmoid+where": 2, "readout": 1}  # per row tile
    assert set(python_tasks) <= {"readout"}, python_tasks


@pytest.mark.parametrize("tiles", [None, [3, 5]])
def test_integer_and_bool_chains_run_op_by_op_in_c(python_tasks, tiles):
    """Mask arithmetic (a padded batch's positions and masks) is not fused: a chain with
    integer or bool steps would run as Python, its ops each run in C."""
    g = torch.Generator().manual_seed(4)
    pos = torch.randint(0, 9, (8, 5), generator=g)
    keep = torch.rand(8, 5, generator=g) > 0.3
    scores = torch.randn(8, 5, generator=g)
    pn, kn, sn = (t.to("nntile") for t in (pos, keep, scores))
    if tiles is not None:
        for t in (pn, kn, sn):
            torch_nntile.set_axis_group_name(t, {0: "rows_fi"})
        torch_nntile.set_axis_group_tiling("rows_fi", tiles)

    def masked(pos, keep, scores):
        allowed = (pos <= 4) & keep ^ (pos == 7)
        return torch.where(allowed, scores, -1e9), (pos * 3 - 1) | 8

    for got, want in zip(masked(pn, kn, sn), masked(pos, keep, scores)):
        got = got.cpu()
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert set(python_tasks) <= {"readout"}, python_tasks


def test_shared_results_are_not_folded_held_ones_are_kept():
    """A result two ops read is computed once as tiles of its own; one a tensor holds
    folds into its only reader, whose tasks then write it too."""
    x = torch.randn(8, 4)
    xn = _tiled(x, "rows_fh", 4)
    torch_nntile.reset_info()
    held = xn * 3
    shared = xn + 1
    a, b = (held + shared).relu(), shared * shared.exp()
    assert_close(a.cpu(), ((x * 3) + (x + 1)).relu())
    assert_close(b.cpu(), (x + 1) * (x + 1).exp())
    assert_close(held.cpu(), x * 3)
    tasks = _tasks()
    assert tasks == {"add": 2, "mul+add+relu": 2, "exp+mul": 2, "readout": 3}, tasks


@pytest.mark.parametrize("native", [True, False])  # the C program; the Python kernel
@pytest.mark.parametrize("tiles", [None, [3, 5, 2]])  # untiled; uneven row tiles
def test_held_intermediates_are_further_outputs(monkeypatch, native, tiles):
    """In-place updates of held tensors feeding one last op (an optimizer's running
    averages and its parameter) run as one task per tile that writes every held value."""
    monkeypatch.setattr(SESSION_STATE.runtime(), "native_ew", native)
    torch.manual_seed(3)
    p, g, m, v = (torch.randn(10, 6) for _ in range(4))
    v = v.abs()
    devs = [t.to("nntile") for t in (p, g, m, v)]
    if tiles is not None:
        for d in devs:
            torch_nntile.set_axis_group_name(d, {0: "rows_fk"})
        torch_nntile.set_axis_group_tiling("rows_fk", tiles)
    torch_nntile.execute()
    torch_nntile.wait()

    def update(p, g, m, v):
        m.lerp_(g, 0.1)
        v.mul_(0.99).addcmul_(g, g, value=0.01)
        p.addcdiv_(m, v.sqrt().add_(1e-8), value=-0.5)

    torch_nntile.reset_info()
    update(*devs)
    update(p, g, m, v)
    for got, want in zip(devs, (p, g, m, v)):
        assert_close(got.cpu(), want)
    tasks = _tasks()
    fused = [k for k in tasks if "lerp" in k]
    assert len(fused) == 1 and "addcdiv" in fused[0], tasks
    assert tasks[fused[0]] == (1 if tiles is None else 3), tasks  # one task per tile writes p, m and v
    assert set(tasks) == {fused[0], "readout"}, tasks


def test_held_results_of_other_dtypes_keep_their_own_tasks():
    """Only float32 groups keep held results as further outputs (they run as C
    programs); others compute a held result as tiles of its own, as before."""
    x = torch.randn(6, 4, dtype=torch.float64)
    xn = x.to("nntile")
    torch_nntile.execute()
    torch_nntile.wait()
    torch_nntile.reset_info()
    held = xn * 3
    out = held.exp()
    assert_close(out.cpu(), (x * 3).exp())
    assert_close(held.cpu(), x * 3)
    assert _tasks() == {"mul": 1, "exp": 1, "readout": 2}


@pytest.mark.parametrize("shape", [(), (0, 4), (5,), (3, 1, 40)])
def test_held_intermediates_of_zero_dim_and_empty_values(shape):
    x = torch.randn(shape)
    xn = x.to("nntile")
    torch_nntile.execute()
    torch_nntile.wait()
    torch_nntile.reset_info()
    half = xn * 0.5
    out = half.exp() * 2
    assert_close(out.cpu(), (x * 0.5).exp() * 2)
    assert_close(half.cpu(), x * 0.5)
    assert half.shape == x.shape and out.shape == x.shape
    assert _tasks() == {"mul+exp+mul": 1, "readout": 2}


def test_foreach_adamw_is_one_task_per_parameter():
    """``torch.optim.AdamW`` (foreach, the default here) updates each parameter, its
    average and its square average in one task: as with ``fused=True``."""
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    ref.load_state_dict(model.state_dict())
    model = model.to("nntile")
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.1)
    x = torch.randn(7, 6)
    for step in range(3):
        for m, inp, o in ((model, x.to("nntile"), opt), (ref, x, ref_opt)):
            m(inp).square().mean().backward()
            if step == 2 and m is model:
                torch_nntile.wait()
                torch_nntile.reset_info()
            o.step()
            o.zero_grad(set_to_none=True)
    torch_nntile.execute()
    tasks = _tasks()
    updates = {k: v for k, v in tasks.items() if "addcdiv" in k}
    assert sum(updates.values()) == 4 and all("lerp" in k for k in updates), tasks  # 4 parameters
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            assert_close(opt.state[p][key].cpu(), ref_opt.state[q][key], rtol=1e-5)


def test_fused_gradients_and_optimizer_step_match_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    ref = torch.nn.Linear(6, 5)
    ref.load_state_dict(lin.state_dict())
    lin = lin.to("nntile")
    x = torch.randn(12, 6)
    xn = _tiled(x, "rows_fo", [5, 7])
    opt, ref_opt = torch.optim.AdamW(lin.parameters(), lr=0.1), torch.optim.AdamW(ref.parameters(), lr=0.1)
    torch_nntile.reset_info()
    for _ in range(3):
        for model, inp, o in ((lin, xn, opt), (ref, x, ref_opt)):
            loss = torch.nn.functional.gelu(model(inp)).pow(2).mean()
            loss.backward()
            o.step()
            o.zero_grad(set_to_none=True)
    for p, q in zip(lin.parameters(), ref.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-5)
    assert any("addcdiv" in k and "+" in k for k in _tasks())  # the update runs fused


@pytest.mark.parametrize("tiles", [None, [2, 3]])  # untiled; uneven row tiles of the first element
def test_foreach_chains_write_only_held_results(monkeypatch, tiles):
    """Each element of a fused foreach chain writes the parameter and the values tensors
    still hold (AdamW's running averages), not the intermediate results the step drops:
    the per-element input slices fusion reads once counted as holders of every result."""
    from torch_nntile import session
    from torch_nntile.ops.base import FOREACH
    from torch_nntile.ops.fusion import fuse_elementwise

    seen: list[tuple[str, tuple[int, ...]]] = []

    def spy(ops):
        out = fuse_elementwise(ops)
        seen.extend((op.attrs[1], op.attrs[0].params[1]) for op in out if op.opdef is FOREACH)
        return out

    monkeypatch.setattr(session, "fuse_elementwise", spy)
    torch.manual_seed(5)
    shapes = [(5, 3), (4, 3), (4, 2)]  # alike: one group of three elements
    cpu = [[torch.randn(s) for s in shapes] for _ in range(4)]
    for v in cpu[3]:
        v.abs_()
    dev = [[t.to("nntile") for t in ts] for ts in cpu]
    if tiles is not None:
        torch_nntile.set_axis_group_name(dev[0][0], {0: "rows_fe"})
        torch_nntile.set_axis_group_tiling("rows_fe", tiles)
    torch_nntile.execute()
    torch_nntile.wait()

    def update(ps, gs, ms, vs):
        torch._foreach_mul_(ps, 0.99)
        torch._foreach_lerp_(ms, gs, 0.1)
        torch._foreach_mul_(vs, 0.999)
        torch._foreach_addcmul_(vs, gs, gs, value=0.001)
        den = torch._foreach_sqrt(vs)
        torch._foreach_div_(den, 0.5)
        torch._foreach_add_(den, 1e-8)
        torch._foreach_addcdiv_(ps, ms, den, value=-0.01)

    update(*dev)
    update(*cpu)
    torch_nntile.execute()
    for got, want in zip(dev, cpu):
        for g, w in zip(got, want):
            assert_close(g.cpu(), w)
    name = "mul+lerp+mul+addcmul+sqrt+div+add+addcdiv"
    assert seen == [(name, (1, 3))], seen  # the lerp's and addcmul's results: m and v


@pytest.mark.parametrize("shape", [(2, 3, 300), (3, 5, 257), (2, 4, 16, 40)])
def test_per_channel_operands_over_long_rows(shape):
    """Operands of one value along a row (a per-channel statistic broadcast over the
    spatial dims) in a fused program whose rows span several blocks, the last one short;
    a bool operand among them."""
    torch.manual_seed(0)
    bshape = (1, shape[1]) + (1,) * (len(shape) - 2)
    x, m, s = torch.randn(shape), torch.randn(bshape), torch.rand(bshape)
    b, mask = torch.randn(shape[-1]), torch.rand(bshape) > 0.5

    def f(x, m, s, b, mask):
        return torch.where(mask, torch.relu((x - m) * s + b), x * 2)

    want = f(x, m, s, b, mask)
    got = f(*(t.to("nntile") for t in (x, m, s, b, mask)))
    assert torch.equal(got.cpu(), want)
