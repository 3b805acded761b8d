"""Ops run by PyTorch's CPU kernel one batch tile at a time (ops/batched.py): values and
gradients are CPU's with the batch untiled, in uneven tiles and in tiles of one sample;
a batch tiled in k tiles runs k tasks of the op; weight gradients are summed over them."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

import torch_nntile
from torch_nntile import stats
from torch_nntile.backend.untiled import run_untiled
from torch_nntile.kernels import native
from torch_nntile.session import SESSION_STATE

LAYOUTS = {"untiled": None, "uneven": [3, 2], "ones": 1}


def _run(fn, inputs: list[torch.Tensor], tiling, grads: bool = True) -> None:
    """``fn`` on CPU and on nntile with dim 0 of ``inputs[0]`` (the batch) tiled as given:
    outputs within 1e-5, gradients of every input that requires them within 1e-4."""
    cpu = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    dev = [x.detach().to("nntile").requires_grad_(x.requires_grad) for x in inputs]
    if tiling is not None:
        torch_nntile.set_axis_group_name(dev[0], {0: "batch"})
        torch_nntile.set_axis_group_tiling("batch", tiling)
    want, got = fn(*cpu), fn(*dev)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert_close(g.detach().cpu(), w.detach(), rtol=1e-5, atol=1e-5)
    if not grads:
        return
    torch.manual_seed(1)
    cots = [torch.randn(w.shape) for w in want if w.dtype.is_floating_point]
    diff = [w for w in want if w.dtype.is_floating_point]
    torch.autograd.backward(diff, cots)
    torch.autograd.backward([g for g in got if g.dtype.is_floating_point], [c.to("nntile") for c in cots])
    for c, d in zip(cpu, dev):
        if c.requires_grad:
            assert_close(d.grad.cpu(), c.grad, rtol=1e-4, atol=1e-4)


@pytest.fixture(params=list(LAYOUTS), ids=list(LAYOUTS))
def tiling(request):
    torch_nntile.reset_info()
    yield LAYOUTS[request.param]
    assert stats.FALLBACK_CALLS == {} and stats.UNTILED_CALLS == {}, (stats.FALLBACK_CALLS, stats.UNTILED_CALLS)


def _t(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


CONVS = {
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1), (5, 4, 9), (6, 4, 3), (6,)),
    "conv2d_groups": (lambda x, w, b: F.conv2d(x, w, b, padding=1, dilation=2, groups=2), (5, 4, 7, 6), (6, 2, 3, 3),
                      (6,)),
    "conv2d_depthwise": (lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), groups=4), (5, 4, 7, 6), (4, 1, 3, 2), (4,)),
    "conv3d": (lambda x, w, b: F.conv3d(x, w, b, padding=1), (5, 2, 4, 5, 3), (3, 2, 3, 3, 3), (3,)),
    "conv_transpose2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, output_padding=1), (5, 4, 5, 4),
                         (4, 3, 3, 3), (3,)),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_convolutions(name, tiling):
    fn, xs, ws, bs = CONVS[name]
    torch.manual_seed(0)
    _run(fn, [_t(*xs), _t(*ws), _t(*bs)], tiling)


def test_convolution_runs_one_task_per_batch_tile():
    """One call of PyTorch's CPU kernel per batch tile, forward and backward, each from
    C++ on the worker (an ATEN record: no Python, no GIL)."""
    torch.manual_seed(0)
    x, w = torch.randn(6, 3, 8, 8).to("nntile"), torch.randn(4, 3, 3, 3).to("nntile").requires_grad_()
    torch_nntile.set_axis_group_name(x, {0: "batch"})
    torch_nntile.set_axis_group_tiling("batch", 2)
    y = F.conv2d(x, w)
    y.sum().backward()
    torch_nntile.compile_graph()
    calls = [t for t in SESSION_STATE.compiled.tasks if t[0].fn is run_untiled]
    torch_nntile.run()
    y.cpu()
    names = [t[4] for t in calls]
    assert names.count("aten::convolution_overrideable") == 3
    assert names.count("aten::convolution_backward_overrideable") == 3
    assert all(native.record(t[0], t[3])[0][0] == native.ATEN for t in calls)
    assert stats.BATCHED_CALLS["aten::convolution_overrideable"] >= 1


def test_zero_size_batch():
    w = torch.randn(4, 3, 3, 3)
    x = torch.randn(0, 3, 8, 8)
    assert F.conv2d(x.to("nntile"), w.to("nntile")).cpu().shape == (0, 4, 6, 6)
    assert torch.equal(F.avg_pool2d(x.to("nntile"), 2).cpu(), F.avg_pool2d(x, 2))


def _meta_max_pool_rejects_an_empty_batch() -> bool:
    """Whether this torch's Meta kernel of ``max_pool2d_with_indices.out`` (what an nntile
    max pooling records) fails on an empty batch: torch 2.13's does, 2.11's does not."""
    x = torch.empty(0, 3, 8, 8, device="meta")
    out, indices = torch.empty(0, device="meta"), torch.empty(0, dtype=torch.long, device="meta")
    try:
        torch.ops.aten.max_pool2d_with_indices.out(x, [2], [], [0], [1], False, out=out, indices=indices)
    except RuntimeError:
        return True
    return False


def test_meta_kernel_wrong_where_cpu_is_right():
    """PyTorch's Meta kernel of max pooling fails on an empty batch, its CPU kernel does
    not: the call takes the host path, which ``cpu_fallback=False`` refuses by name.
    Where the Meta kernel is right, the call records as any other."""
    x = torch.randn(0, 3, 8, 8)
    if _meta_max_pool_rejects_an_empty_batch():
        with pytest.raises(NotImplementedError, match="Meta kernel rejects arguments its CPU kernel takes"):
            F.max_pool2d(x.to("nntile"), 2)
    else:
        assert torch.equal(F.max_pool2d(x.to("nntile"), 2).cpu(), F.max_pool2d(x, 2))
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    assert torch.equal(F.max_pool2d(x.to("nntile"), 2).cpu(), F.max_pool2d(x, 2))


POOLS = {
    "max_pool2d": lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True),
    "max_pool2d_ceil": lambda x: F.max_pool2d(x, 2, ceil_mode=True),
    "max_pool1d": lambda x: F.max_pool1d(x.flatten(2), 4),
    "avg_pool2d": lambda x: F.avg_pool2d(x, 2, padding=1, count_include_pad=False),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
    "adaptive_max_pool2d": lambda x: F.adaptive_max_pool2d(x, 3, return_indices=True),
    "max_pool3d": lambda x: F.max_pool3d(x.unsqueeze(2).expand(-1, -1, 2, -1, -1), 2),
    "upsample_nearest": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "upsample_bilinear": lambda x: F.interpolate(x, size=(9, 11), mode="bilinear", align_corners=False),
    "pixel_shuffle": lambda x: F.pixel_shuffle(x, 2),
    "reflection_pad": lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"),
    "unfold_im2col": lambda x: F.unfold(x, 3, padding=1),
    "group_norm": lambda x: F.group_norm(x, 2, torch.linspace(0.5, 1.5, 4).to(x.device),
                                         torch.linspace(-1, 1, 4).to(x.device)),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pooling_upsampling_norms(name, tiling):
    torch.manual_seed(0)
    _run(POOLS[name], [_t(5, 4, 6, 8)], tiling)


def test_group_norm_weight_gradients_sum_over_the_batch(tiling):
    torch.manual_seed(0)
    _run(lambda x, w, b: F.group_norm(x, 2, w, b), [_t(5, 4, 3, 3), _t(4), _t(4)], tiling)


def test_batch_norm_eval(tiling):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4).eval()
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2)

    def fn(x, w, b):
        return F.batch_norm(x, bn.running_mean.to(x.device), bn.running_var.to(x.device), w, b, training=False)

    _run(fn, [_t(5, 4, 3, 3), _t(4), _t(4)], tiling)


def test_sorting_along_a_dim_that_is_not_the_batch(tiling):
    torch.manual_seed(0)
    _run(lambda x: torch.topk(x, 3, dim=1), [_t(5, 7)], tiling)
    _run(lambda x: torch.sort(x, dim=-1, descending=True), [_t(5, 7)], tiling)
    _run(lambda x: torch.kthvalue(x, 2, dim=1), [_t(5, 7)], tiling)


@pytest.mark.parametrize("drop", [False, True], ids=["kept", "output_dropped"])
def test_batch_norm_training_tiled(tiling, drop):
    """Batch statistics as tiled reductions over the batch tiles; the running statistics
    updated as CPU updates them, also when nothing reads the output."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    bnn = nn.BatchNorm2d(4).to("nntile")
    bnn.load_state_dict(bn.state_dict())
    x = (torch.randn(5, 4, 3, 3) * 3 + 1).requires_grad_()
    xn = x.detach().to("nntile").requires_grad_()
    if tiling is not None:
        torch_nntile.set_axis_group_name(xn, {0: "batch"})
        torch_nntile.set_axis_group_tiling("batch", tiling)
    y, yn = bn(x), bnn(xn)
    if not drop:
        g = torch.randn(y.shape)
        y.backward(g)
        yn.backward(g.to("nntile"))
        assert_close(yn.detach().cpu(), y.detach(), rtol=1e-5, atol=1e-5)
        for p, q in ((xn, x), (bnn.weight, bn.weight), (bnn.bias, bn.bias)):
            assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-4)
    del yn
    assert_close(bnn.running_mean.cpu(), bn.running_mean)
    assert_close(bnn.running_var.cpu(), bn.running_var)
    assert int(bnn.num_batches_tracked.cpu()) == 1


@pytest.mark.parametrize("case", ["channels_and_space_tiled", "no_affine_no_running", "float64_3d"])
def test_batch_norm_training_other_layouts(case):
    """Channels tiled unevenly and spatial dims tiled (a channel's parts in many tiles),
    no weight, bias or running statistics, float64 and a 3-D input."""
    torch.manual_seed(0)
    dt = torch.float64 if case == "float64_3d" else torch.float32
    shape = (6, 4, 10) if case == "float64_3d" else (6, 4, 5, 6)
    affine = case != "no_affine_no_running"
    bn = nn.BatchNorm1d(4, affine=affine, track_running_stats=affine, dtype=dt) if len(shape) == 3 else \
        nn.BatchNorm2d(4, affine=affine, track_running_stats=affine, dtype=dt)
    bnn = type(bn)(4, affine=affine, track_running_stats=affine, dtype=dt).to("nntile")
    bnn.load_state_dict(bn.state_dict())
    x = (torch.randn(shape, dtype=dt) * 2 + 3).requires_grad_()
    xn = x.detach().to("nntile").requires_grad_()
    if case == "channels_and_space_tiled":
        torch_nntile.set_axis_group_name(xn, {0: "n", 1: "c", 2: "h", 3: "w"})
        for group, tiles in (("n", [4, 2]), ("c", [3, 1]), ("h", 2), ("w", [4, 2])):
            torch_nntile.set_axis_group_tiling(group, tiles)
    else:
        torch_nntile.set_axis_group_name(xn, {0: "n"})
        torch_nntile.set_axis_group_tiling("n", 4)
    y, yn = bn(x), bnn(xn)
    g = torch.randn(y.shape, dtype=dt)
    y.backward(g)
    yn.backward(g.to("nntile"))
    assert_close(yn.detach().cpu(), y.detach())
    assert_close(xn.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
    if affine:
        for p, q in ((bnn.weight, bn.weight), (bnn.bias, bn.bias)):
            assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-4)
        assert_close(bnn.running_mean.cpu(), bn.running_mean)
        assert_close(bnn.running_var.cpu(), bn.running_var)
    assert "aten::native_batch_norm" not in stats.UNTILED_CALLS


def test_other_dims_tiled_are_gathered():
    """A convolution and a pooling whose input is tiled along the channels and the
    height as well as the batch: those dims are gathered for the op (counted as
    re-tiles), the batch stays split, and the values and gradients are CPU's."""
    torch.manual_seed(0)
    x, w = torch.randn(5, 4, 9, 8, requires_grad=True), torch.randn(6, 4, 3, 3, requires_grad=True)
    xn, wn = x.detach().to("nntile").requires_grad_(), w.detach().to("nntile").requires_grad_()
    torch_nntile.set_axis_group_name(xn, {0: "b", 1: "c", 2: "h"})
    for group, tiles in (("b", [2, 3]), ("c", [3, 1]), ("h", 4)):
        torch_nntile.set_axis_group_tiling(group, tiles)
    torch_nntile.reset_info()
    y = F.max_pool2d(F.conv2d(xn, wn, padding=1), 2)
    want = F.max_pool2d(F.conv2d(x, w, padding=1), 2)
    g = torch.randn(want.shape)
    want.backward(g)
    y.backward(g.to("nntile"))
    assert_close(y.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    assert_close(xn.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
    assert_close(wn.grad.cpu(), w.grad, rtol=1e-4, atol=1e-4)
    retiled = torch_nntile.metrics()["retiles"]
    assert any(op.startswith("aten::convolution_overrideable") for op in retiled), retiled
    assert stats.UNTILED_CALLS == {} and stats.FALLBACK_CALLS == {}


PLANE_OPS = {
    "max_pool2d": lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True),
    "avg_pool2d": lambda x: F.avg_pool2d(x, 2, ceil_mode=True),
    "adaptive_max_pool2d": lambda x: F.adaptive_max_pool2d(x, (2, 3), return_indices=True),
    "upsample_bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "upsample_nearest": lambda x: F.interpolate(x, size=(5, 7), mode="nearest"),
    "replication_pad": lambda x: F.pad(x, (1, 2, 0, 1), mode="replicate"),
}


@pytest.mark.parametrize("name", list(PLANE_OPS))
def test_plane_ops_split_along_batch_and_channels(name):
    """Pooling, upsampling and padding map over planes: with the batch and the channels
    in uneven tiles, one task per (batch, channel) tile, nothing re-tiled for them, and
    CPU's values and gradients (an upsampling's backward gets its tile's input size)."""
    torch.manual_seed(0)
    x = torch.randn(5, 4, 6, 8, requires_grad=True)
    xn = x.detach().to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "b", 1: "c"})
    torch_nntile.set_axis_group_tiling("b", [3, 2])
    torch_nntile.set_axis_group_tiling("c", [1, 3])
    xn.requires_grad_()
    torch_nntile.reset_info()
    want, got = PLANE_OPS[name](x), PLANE_OPS[name](xn)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    g = torch.randn(want[0].shape)
    want[0].backward(g)
    gn = g.to("nntile")
    torch_nntile.set_axis_group_name(gn, {0: "b", 1: "c"})  # as a gradient from tiled ops would be
    got[0].backward(gn)
    torch_nntile.compile_graph()
    calls = [t for t in SESSION_STATE.compiled.tasks if t[0].fn is run_untiled]
    torch_nntile.run()
    for a, b in zip(got, want):
        assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-5)
    assert_close(xn.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
    assert len(calls) == 8  # 2 x 2 tiles, forward and backward
    assert not torch_nntile.metrics()["retiles"], torch_nntile.metrics()["retiles"]
    assert stats.UNTILED_CALLS == {} and stats.FALLBACK_CALLS == {}


SELECTS = {
    "sort": lambda x: torch.sort(x, dim=2, descending=True),
    "topk": lambda x: torch.topk(x, 3, dim=-2, largest=False),
    "kthvalue": lambda x: torch.kthvalue(x, 2, dim=2),
    "kthvalue_keepdim": lambda x: torch.kthvalue(x, 4, dim=2, keepdim=True),
    "median": lambda x: torch.median(x, dim=2),
    "mode": lambda x: torch.mode(x.round(), dim=2),
    "argsort": lambda x: torch.argsort(x, dim=2, stable=True),
}


@pytest.mark.parametrize("name", list(SELECTS))
def test_sorting_and_selecting_split_along_every_other_dim(name):
    """Along dim 2 of a value tiled along dims 0, 1 and 3: one task per tile of those
    dims (results without ``keepdim`` carry them one dim lower), CPU's values and
    indices, and the values' gradient."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, 6, requires_grad=True)
    xn = x.detach().to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "n", 1: "c", 3: "w"})
    for group, tiles in (("n", [2, 1]), ("c", 2), ("w", [4, 2])):
        torch_nntile.set_axis_group_tiling(group, tiles)
    xn.requires_grad_()
    torch_nntile.reset_info()
    want, got = SELECTS[name](x), SELECTS[name](xn)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.equal(a.detach().cpu(), b.detach())
    if want[0].dtype.is_floating_point:
        g = torch.randn(want[0].shape)
        want[0].backward(g)
        got[0].backward(g.to("nntile"))
        assert_close(xn.grad.cpu(), x.grad)
    assert stats.BATCHED_CALLS and stats.UNTILED_CALLS == {} and stats.FALLBACK_CALLS == {}
    assert not any(op.startswith(("aten::sort", "aten::topk", "aten::kthvalue", "aten::median", "aten::mode"))
                   for op in torch_nntile.metrics()["retiles"])


@pytest.mark.parametrize("case", ["bias", "no_bias", "groups", "transposed"])
def test_convolution_split_along_output_channels(case):
    """A convolution whose output channels are tiled (its weight's dim 0 named and tiled)
    runs one task per (batch, output-channel) tile; its input's gradient sums over the
    output-channel tiles and its weight's over the batch tiles. Grouped and transposed
    convolutions need every input channel: there the channels are gathered."""
    torch.manual_seed(0)
    x = torch.randn(5, 4, 7, 6, requires_grad=True)
    if case == "transposed":
        w = torch.randn(4, 6, 3, 3, requires_grad=True)
        fn = lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2)  # noqa: E731
    else:
        w = torch.randn(6, 2 if case == "groups" else 4, 3, 3, requires_grad=True)
        fn = lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2 if case == "groups" else 1)  # noqa: E731
    b = torch.randn(6, requires_grad=True) if case != "no_bias" else None
    xn = x.detach().to("nntile")
    wn = w.detach().to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "batch"})
    torch_nntile.set_axis_group_name(wn, {1 if case == "transposed" else 0: "cout"})
    torch_nntile.set_axis_group_tiling("batch", [3, 2])
    torch_nntile.set_axis_group_tiling("cout", [2, 4])
    xn.requires_grad_()
    wn.requires_grad_()
    bn = b.detach().to("nntile").requires_grad_() if b is not None else None
    torch_nntile.reset_info()
    want, got = fn(x, w, b), fn(xn, wn, bn)
    g = torch.randn(want.shape)
    want.backward(g)
    got.backward(g.to("nntile"))
    torch_nntile.compile_graph()
    calls = [t[4] for t in SESSION_STATE.compiled.tasks if t[0].fn is run_untiled]
    torch_nntile.run()
    assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    for p, q in ((xn, x), (wn, w), (bn, b)):
        if q is not None:
            assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-4)
    per_cout = 2 if case in ("bias", "no_bias") else 1
    assert calls.count("aten::convolution_overrideable") == 2 * per_cout
    assert calls.count("aten::convolution_backward_overrideable") == 2 * per_cout
    assert stats.UNTILED_CALLS == {} and stats.FALLBACK_CALLS == {}
