"""The C forms (runtime/csrc/nn.c) of the fused optimizer updates, RMS norm and rope:
float32 tasks get a C record, and run in C they give the values of the Python
kernels (run here too, by turning the runtime's C kernels off), on tiled inputs with
uneven tiles; an optimizer step within 1e-6 of the Python one, step after step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, rel_err
from torch import nn

import torch_nntile
import torch_nntile.nn.functional as NF
from torch_nntile.kernels import native
from torch_nntile.rope import rope
from torch_nntile.runtime import context
from torch_nntile.session import SESSION_STATE
from torch_nntile.training import SGD, AdamW

STEP_RTOL = 1e-6  # an optimizer step in C against the Python kernel's


def _tile(t: torch.Tensor, tilings: dict[int, int | list[int]]) -> torch.Tensor:
    for d, tiling in tilings.items():
        name = f"nn_c_{id(t)}_{d}"
        torch_nntile.set_axis_group_name(t, {d: name})
        torch_nntile.set_axis_group_tiling(name, tiling)
    return t


def _tasks(names: set[str]) -> list[tuple[object, list]]:
    """Lower what is pending; the (kernel, specs) of the tasks called ``names``; then run them."""
    torch_nntile.compile_graph()
    out = [(t[0], t[3]) for t in SESSION_STATE.compiled.tasks if t[4] in names]
    torch_nntile.run()
    torch_nntile.wait()
    return out


def _assert_native(tasks: list[tuple[object, list]], kind: int) -> None:
    assert tasks
    for kernel, specs in tasks:
        rec = native.record(kernel, specs)
        assert rec is not None and rec[0][0] == kind, (kernel, specs)


@pytest.fixture
def python_kernels():
    """A switch between the C kernels and the Python ones (the runtime's own flag)."""
    rt = context.current()
    was = rt.native_ew

    def use(python: bool) -> None:
        torch_nntile.execute()
        torch_nntile.wait()
        rt.native_ew = was and not python

    yield use
    use(False)
    rt.native_ew = was


# -- optimizers ---------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd": (SGD, torch.optim.SGD, {"lr": 0.1}, "sgd_step"),
    "sgd_momentum_wd": (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
                        "sgd_step"),
    "sgd_nesterov_max": (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "maximize": True},
                         "sgd_step"),
    "adamw": (AdamW, torch.optim.AdamW, {"lr": 0.01}, "adamw_step"),
    "adamw_amsgrad_max": (AdamW, torch.optim.AdamW, {"lr": 0.02, "amsgrad": True, "maximize": True,
                                                      "weight_decay": 0.1}, "adamw_step"),
    "adamw_low_beta1": (AdamW, torch.optim.AdamW, {"lr": 0.01, "betas": (0.3, 0.9), "weight_decay": 0.0},
                        "adamw_step"),  # lerp's other branch: weight 1 - beta1 >= 0.5
}


def _state_tensors(opt: torch.optim.Optimizer, p: torch.Tensor) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in opt.state.get(p, {}).items() if k != "step"}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_in_c_match_the_python_kernel(name, python_kernels):
    cls, ref_cls, kw, task = OPTIMIZERS[name]
    kind = native.SGD if cls is SGD else native.ADAMW
    init = torch.randn(9, 7, generator=torch.Generator().manual_seed(1))
    ps = {}
    for mode in ("c", "python"):
        p = nn.Parameter(_tile(init.to("nntile"), {0: [4, 5], 1: [2, 3, 2]}))
        ps[mode] = (p, cls([p], **kw))
    q = nn.Parameter(init.clone())
    ref = ref_cls([q], **kw)
    for step in range(4):
        g = torch.randn(init.shape, generator=torch.Generator().manual_seed(10 + step))
        got = {}
        for mode, (p, opt) in ps.items():
            python_kernels(mode == "python")
            p.grad = g.to("nntile")
            opt.step()
            if mode == "c":
                _assert_native(_tasks({task}), kind)
            got[mode] = (p.detach().cpu(), _state_tensors(opt, p))
        q.grad = g.clone()
        ref.step()
        (pc, sc), (pp, sp) = got["c"], got["python"]
        assert rel_err(pc, pp) <= STEP_RTOL, (step, rel_err(pc, pp))
        assert set(sc) == set(sp) == set(_state_tensors(ref, q))
        for k in sc:
            assert rel_err(sc[k], sp[k]) <= STEP_RTOL, (step, k)
        assert_close(pc, q.detach())


def test_optimizer_state_of_other_dtypes_stays_python():
    p = nn.Parameter(torch.randn(5, 3, dtype=torch.float64).to("nntile"))
    opt = AdamW([p], lr=0.01)
    p.grad = torch.randn(5, 3, dtype=torch.float64).to("nntile")
    opt.step()
    tasks = _tasks({"adamw_step"})
    assert tasks and all(native.record(k, specs) is None for k, specs in tasks)


# -- RMS norm -----------------------------------------------------------------------------


@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("lead_tiles", [None, [3, 1, 4]])
def test_rms_norm_rows_in_c(weight, lead_tiles, python_kernels):
    """Forward and both gradients (the weight's summed over uneven row tiles) with the
    normalized dim whole in a tile."""
    torch.manual_seed(3)
    x = torch.randn(8, 2, 33) * 2 + 1
    w = torch.randn(33) if weight else None
    g = torch.randn(8, 2, 33)
    got = {}
    for mode in ("c", "python"):
        python_kernels(mode == "python")
        xn = x.to("nntile")
        if lead_tiles is not None:
            _tile(xn, {0: lead_tiles})
        xn.requires_grad_()
        wn = w.to("nntile").requires_grad_() if weight else None
        y = NF.rms_norm(xn, 33, wn, eps=1e-5)
        y.backward(g.to("nntile"))
        got[mode] = [y.detach().cpu(), xn.grad.cpu()] + ([wn.grad.cpu()] if weight else [])
    python_kernels(False)
    xc = x.clone().requires_grad_()
    wc = w.clone().requires_grad_() if weight else None
    want = F.rms_norm(xc, (33,), wc, eps=1e-5)
    want.backward(g)
    wants = [want.detach(), xc.grad] + ([wc.grad] if weight else [])
    for c, p, r in zip(got["c"], got["python"], wants):
        assert_close(c, p, rtol=1e-6)
        assert_close(c, r)
    xn = _tile(x.to("nntile"), {0: [3, 5]}).requires_grad_()
    wn = w.to("nntile").requires_grad_() if weight else None
    y = NF.rms_norm(xn, 33, wn, eps=1e-5)
    y.backward(g.to("nntile"))
    names = {"rms_norm"}
    _assert_native(_tasks(names), native.RMS_NORM)
    y = NF.rms_norm(xn, 33, wn, eps=1e-5)
    y.backward(g.to("nntile"))
    _assert_native(_tasks({"rms_norm_backward"}), native.RMS_NORM_GRAD)


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_tiled_rows_apply_their_statistics_in_c(norm, python_kernels):
    """Rows split over uneven tiles: the partial sums stay Python, the normalization and
    the input gradient from the combined row statistics are C programs."""
    torch.manual_seed(4)
    x, w, g = torch.randn(6, 20) * 2 + 1, torch.randn(20), torch.randn(6, 20)
    fn, ref = {"rms": (lambda x, w: NF.rms_norm(x, 20, w, eps=1e-6), lambda x, w: F.rms_norm(x, (20,), w, eps=1e-6)),
               "layer": (lambda x, w: F.layer_norm(x, (20,), w), lambda x, w: F.layer_norm(x, (20,), w))}[norm]
    got = {}
    for mode in ("c", "python"):
        python_kernels(mode == "python")
        xn = _tile(x.to("nntile"), {0: [4, 2], 1: [7, 13]}).requires_grad_()
        y = fn(xn, w.to("nntile"))
        y.backward(g.to("nntile"))
        got[mode] = (y.detach().cpu(), xn.grad.cpu())
    python_kernels(False)
    xc = x.clone().requires_grad_()
    want = ref(xc, w)
    want.backward(g)
    for c, p, r in zip(got["c"], got["python"], (want.detach(), xc.grad)):
        assert_close(c, p, rtol=1e-6)
        assert_close(c, r)
    xn = _tile(x.to("nntile"), {1: [7, 13]}).requires_grad_()
    y = fn(xn, w.to("nntile"))
    y.backward(g.to("nntile"))
    names = {"rms_norm", "rms_norm_backward"} if norm == "rms" else {"native_layer_norm", "native_layer_norm_backward"}
    tasks = _tasks(names)
    apply = [t for t in tasks if t[0].fn.__name__ in ("norm_apply", "norm_backward_apply")]
    assert len(apply) == 4 and all(native.record(*t) is not None for t in apply)


def test_rms_norm_of_other_dtypes_stays_python():
    xd = torch.randn(6, 20, dtype=torch.float64)
    y = NF.rms_norm(xd.to("nntile"), 20, eps=1e-6)
    tasks = _tasks({"rms_norm"})
    assert tasks and all(native.record(k, specs) is None for k, specs in tasks)
    assert_close(y.cpu(), F.rms_norm(xd, (20,), eps=1e-6))


# -- rope ---------------------------------------------------------------------------------


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[2] // 2
    return torch.cat((-t[:, :, half:], t[:, :, :half]), dim=2)


@pytest.mark.parametrize("cos_batch", [None, 1, 3])
def test_rope_in_c_forward_and_transpose(cos_batch, python_kernels):
    gen = torch.Generator().manual_seed(8)
    lead = (5, 8) if cos_batch is None else (cos_batch, 5, 8)
    x, cos, sin = torch.randn(3, 5, 8, 4, generator=gen), torch.randn(lead, generator=gen), torch.randn(lead, generator=gen)
    g = torch.randn(3, 5, 8, 4, generator=gen)
    got = {}
    for mode in ("c", "python"):
        python_kernels(mode == "python")
        xn = _tile(x.to("nntile"), {0: [2, 1], 1: [2, 3], 3: [3, 1]}).requires_grad_()
        y = rope(x=xn, cos=cos.to("nntile"), sin=sin.to("nntile"))
        y.backward(g.to("nntile"))
        got[mode] = (y.detach().cpu(), xn.grad.cpu())
    python_kernels(False)
    want = x * cos[..., None] + _rotate_half(x) * sin[..., None]
    want_g = g * cos[..., None] - _rotate_half(g * sin[..., None])
    for c, p, r in zip(got["c"], got["python"], (want, want_g)):
        assert_close(c, p, rtol=1e-6)
        assert_close(c, r)
    xn = _tile(x.to("nntile"), {1: [4, 1]}).requires_grad_()
    y = rope(x=xn, cos=cos.to("nntile"), sin=sin.to("nntile"))
    y.backward(g.to("nntile"))
    _assert_native(_tasks({"rope_fwd", "rope_bwd"}), native.ROPE)


# -- max pooling and batch norm's per-tile sums --------------------------------------------

POOL_ARGS = {
    "2x2": {"kernel_size": 2},
    "padded_strided": {"kernel_size": 3, "stride": 2, "padding": 1},
    "dilated": {"kernel_size": 3, "stride": 1, "padding": 1, "dilation": 2},
    "ceil_rect": {"kernel_size": (2, 3), "stride": (1, 2), "ceil_mode": True},
}


def _pool_input(fill: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Values that tell pooling kernels apart: NaNs (the last NaN of a window is taken),
    windows of -inf only, ties (the first is taken)."""
    gen = torch.Generator().manual_seed(5)
    if fill == "ties":
        return torch.randint(0, 2, shape, generator=gen).float()
    x = torch.randn(shape, generator=gen)
    if fill == "nan":
        x[..., ::3, ::2] = float("nan")
        x[..., 1::4, 1::3] = float("nan")
    elif fill == "ninf":
        x.fill_(float("-inf"))
        x[..., 1::4, :] = 0
    return x


@pytest.mark.parametrize("fill", ["random", "nan", "ninf", "ties"])
@pytest.mark.parametrize("args", list(POOL_ARGS))
@pytest.mark.parametrize("shape", [(5, 3, 8, 9), (3, 7, 7)], ids=["batched", "unbatched"])
def test_max_pool2d_in_c_is_cpus_to_the_bit(fill, args, shape):
    """Values, indices and the input's gradient exactly as CPU's, the batch in uneven
    tiles (per tile tasks) or one (the unbatched form, one task)."""
    kw = POOL_ARGS[args]
    x = _pool_input(fill, shape)
    g = torch.randn(F.max_pool2d(x, **kw).shape, generator=torch.Generator().manual_seed(6))
    xc = x.clone().requires_grad_()
    want, want_i = F.max_pool2d(xc, return_indices=True, **kw)
    want.backward(g)
    xn = x.to("nntile")
    if len(shape) == 4:
        _tile(xn, {0: [3, 2]})
    xn.requires_grad_()
    got, got_i = F.max_pool2d(xn, return_indices=True, **kw)
    got.backward(g.to("nntile"))
    assert torch.equal(got_i.cpu(), want_i)
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=0, atol=0, equal_nan=True)


def test_max_pool2d_runs_in_c_and_other_dtypes_call_pytorchs_kernel():
    x = _tile(torch.randn(4, 2, 6, 6).to("nntile"), {0: 2}).requires_grad_()
    y = F.max_pool2d(x, 2)
    y.backward(torch.ones(y.shape).to("nntile"))
    tasks = _tasks({"aten::max_pool2d_with_indices.out", "aten::max_pool2d_with_indices_backward.grad_input"})
    assert len(tasks) == 4
    assert sorted(native.record(*t)[0][0] for t in tasks) == [native.MAX_POOL2D] * 2 + [native.MAX_POOL2D_GRAD] * 2
    xd = torch.randn(4, 2, 6, 6, dtype=torch.float64)
    y = F.max_pool2d(xd.to("nntile"), 2)
    tasks = _tasks({"aten::max_pool2d_with_indices.out"})
    assert tasks and all(native.record(*t)[0][0] == native.ATEN for t in tasks)  # from C++ (backend/aten_calls.py)
    assert torch.equal(y.cpu(), F.max_pool2d(xd, 2))


def test_max_pool2d_backward_with_an_index_out_of_range_fails_the_task():
    """CPU's kernel does not check the indices it is given; the C kernel does (no write
    outside the gradient's tile) and the error reaches the reader."""
    x, g = torch.randn(1, 1, 4, 4), torch.randn(1, 1, 2, 2)
    bad = torch.tensor([[[[0, 3], [8, 16]]]])
    gi = torch.ops.aten.max_pool2d_with_indices_backward(g.to("nntile"), x.to("nntile"), [2, 2], [2, 2], [0, 0],
                                                         [1, 1], False, bad.to("nntile"))
    with pytest.raises(IndexError, match="index out of range"):
        gi.cpu()
    ok = torch.tensor([[[[0, 3], [8, 15]]]])
    want = torch.ops.aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, ok)
    got = torch.ops.aten.max_pool2d_with_indices_backward(g.to("nntile"), x.to("nntile"), [2, 2], [2, 2], [0, 0],
                                                          [1, 1], False, ok.to("nntile"))
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("tiles", [{0: [3, 2]}, {0: [2, 3], 1: [1, 3], 2: [4, 3]}], ids=["batch", "all_dims"])
def test_batch_norm_tile_sums_in_c(tiles, python_kernels):
    """Each tile's statistics and backward sums in C, and their combination per channel
    tile, as the Python kernels give them (and CPU's batch norm), with the channels and
    spatial dims tiled too."""
    gen = torch.Generator().manual_seed(7)
    x, g = torch.randn(5, 4, 7, 3, generator=gen) * 3 + 2, torch.randn(5, 4, 7, 3, generator=gen)
    bn = nn.BatchNorm2d(4)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5, generator=gen)
        bn.bias.uniform_(-1, 1, generator=gen)
    got = {}
    for mode in ("c", "python"):
        python_kernels(mode == "python")
        bnn = nn.BatchNorm2d(4).to("nntile")
        bnn.load_state_dict(bn.state_dict())
        xn = _tile(x.to("nntile"), tiles).requires_grad_()
        y = bnn(xn)
        y.backward(g.to("nntile"))
        got[mode] = [y.detach().cpu(), xn.grad.cpu(), bnn.weight.grad.cpu(), bnn.bias.grad.cpu(),
                     bnn.running_var.cpu()]
    python_kernels(False)
    xc = x.clone().requires_grad_()
    want = bn(xc)
    want.backward(g)
    for c, p, r in zip(got["c"], got["python"], (want.detach(), xc.grad, bn.weight.grad, bn.bias.grad, bn.running_var)):
        assert_close(c, p, rtol=1e-5)
        assert_close(c, r)
    bnn = nn.BatchNorm2d(4).to("nntile")
    xn = _tile(x.to("nntile"), {0: [3, 2]}).requires_grad_()
    bnn(xn).backward(g.to("nntile"))
    tasks = _tasks({"batch_norm_stats", "batch_norm_sums"})
    kinds = [native.record(*t)[0][0] for t in tasks]
    assert sorted(kinds) == sorted([native.BN_STATS] * 2 + [native.BN_SUMS] * 2 + [native.BN_COMBINE, native.BN_GRAD_COMBINE])
