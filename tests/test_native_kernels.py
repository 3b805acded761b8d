"""Elementwise tile kernels run as C programs (kernels.native, runtime/csrc/ew.c):
the same values as CPU PyTorch, special values included, under broadcasting, views
and tilings; which tasks get a program and which stay Python."""

from __future__ import annotations

import contextlib
import gc
import math
import random
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close

import torch_nntile
from torch_nntile.kernels import native
from torch_nntile.session import SESSION_STATE

SPECIAL = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e-30, -1e-30, 1e30, -1e30, 80.0, -80.0, 89.0,
                        -104.0, 0.6, -0.63, 9.5, -20.0, math.inf, -math.inf, math.nan, 1e-3, 7.25])


def _dev(t: torch.Tensor, tiles: int | list[int] | None = None) -> torch.Tensor:
    d = t.to("nntile")
    if tiles is not None:
        name = f"native_{id(d)}"
        torch_nntile.set_axis_group_name(d, {0: name})
        torch_nntile.set_axis_group_tiling(name, tiles)
    return d


def _lowered() -> list[tuple[object, list, str]]:
    torch_nntile.compile_graph()
    out = [(t[0], t[3], t[4]) for t in SESSION_STATE.compiled.tasks]
    torch_nntile.run()
    torch_nntile.wait()
    return out


def _same_bits(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """NaN where CPU has NaN, the same infinities, finite values within tolerance."""
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan()), (got, want)
    fin = want.isfinite()
    assert torch.equal(got[~fin & ~want.isnan()], want[~fin & ~want.isnan()])
    g, w = got[fin].double(), want[fin].double()
    assert ((g - w).abs() <= rtol * w.abs() + atol).all(), ((g - w).abs().max(), got, want)


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
    "exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "square": lambda x: x ** 2, "cube": lambda x: x ** 3, "pow_half": lambda x: x ** 0.5,
    "pow_neg_half": lambda x: x ** -0.5, "pow_neg2": lambda x: x ** -2, "pow_frac": lambda x: x.abs() ** 1.7,
    "clamp_min": lambda x: x.clamp_min(0.5), "clamp_max": lambda x: x.clamp_max(-0.5),
    "scaled": lambda x: x * 2.5 - 1, "div_scalar": lambda x: x / 3, "sin": torch.sin, "cos": torch.cos,
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_special_values(name):
    fn = UNARY[name]
    x = torch.cat([SPECIAL, torch.linspace(-12, 12, 997)])
    with torch.no_grad():
        _same_bits(fn(_dev(x, [400, 621])).cpu(), fn(x))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward_special_values_in_c(python_tasks, approximate):
    x = torch.cat([SPECIAL, torch.linspace(-12, 12, 997)])
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    want = torch.ops.aten.gelu_backward(g, x, approximate=approximate)
    got = torch.ops.aten.gelu_backward(_dev(g, [400, 621]), _dev(x, [400, 621]), approximate=approximate)
    # near x = -5 the tanh form's derivative is about -1e-6; PyTorch's float tanh has
    # reached -1 there and gives 0, this one's not yet
    _same_bits(got.cpu(), want, atol=2e-6 if approximate == "tanh" else 1e-6)
    _in_c(python_tasks)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=-0.25), "sub_alpha": lambda a, b: torch.sub(a, b, alpha=3),
    "maximum": torch.maximum, "minimum": torch.minimum, "pow": lambda a, b: a.abs() ** b,
    "tanh_backward": lambda a, b: torch.ops.aten.tanh_backward(a, b.tanh()),
    "sigmoid_backward": lambda a, b: torch.ops.aten.sigmoid_backward(a, b.sigmoid()),
    "threshold_backward": lambda a, b: torch.ops.aten.threshold_backward(a, b, 0.0),
    "lerp": lambda a, b: torch.lerp(a, b, 0.7), "lerp_small": lambda a, b: torch.lerp(a, b, 0.2),
}


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shapes", [((6, 7), (6, 7)), ((6, 7), (7,)), ((6, 7), (6, 1)), ((6, 1), (1, 7)), ((), (5,))])
def test_binary_broadcasting(name, shapes):
    fn = BINARY[name]
    torch.manual_seed(1)
    a, b = (torch.randn(s) * 3 for s in shapes)
    if a.numel() > 1:
        a.view(-1)[0] = math.nan
    with torch.no_grad():
        _same_bits(fn(_dev(a), _dev(b)).cpu(), fn(a, b))


def test_adamw_style_chain_runs_as_one_c_task_per_tile():
    torch.manual_seed(2)
    p, g, m, v = (torch.randn(50, 8) for _ in range(4))
    v = v.abs()

    def chain(p, g, m, v):
        m = torch.lerp(m, g, 0.1)
        v = v * 0.999 + 0.001 * g * g
        return torch.addcdiv(p * (1 - 1e-3 * 0.01), m, v.sqrt() / 0.97 + 1e-8, value=-1e-3 / 0.9)

    want = chain(p, g, m, v)
    got = chain(*(_dev(t, [20, 30]) for t in (p, g, m, v)))
    tasks = _lowered()
    assert_close(got.cpu(), want)
    elementwise = [(k, specs) for k, specs, name in tasks if name not in ("ingress", "readout")]
    assert len(elementwise) == 2  # one fused task per tile
    assert all(native.record(k, specs) is not None for k, specs in elementwise)


@pytest.mark.parametrize("tiles", [None, [20, 30]])
def test_in_place_updates_of_held_values_run_as_one_c_task_per_tile(tiles):
    """The running averages are held tensors updated in place: the fused task writes
    them as further outputs (STORE steps), in C."""
    torch.manual_seed(2)
    p, g, m, v = (torch.randn(50, 8) for _ in range(4))
    v = v.abs()
    devs = [_dev(t, tiles) for t in (p, g, m, v)]

    def update(p, g, m, v):
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.mul_(1 - 1e-3 * 0.01).addcdiv_(m, v.sqrt().div_(0.97).add_(1e-8), value=-1e-3 / 0.9)

    update(*devs)
    update(p, g, m, v)
    tasks = [(k, specs) for k, specs, name in _lowered() if name not in ("ingress", "readout")]
    assert len(tasks) == (1 if tiles is None else 2)
    for k, specs in tasks:
        ints, _ = native.record(k, specs)
        nbuf, nd = ints[1], ints[2]
        at = 3 + nd + nbuf * nd + nbuf  # the buffers' kinds (csrc/ew.h's layout, after the record's kind)
        assert ints[at:at + nbuf] == [native.EW_F32] + [native.EW_OUT] * 2 + [native.EW_F32] * 4  # p; m, v; p g m v
    for got, want in zip(devs, (p, g, m, v)):
        _same_bits(got.cpu(), want)


def _break_stores(ints: list[int], how: str) -> list[int]:
    """A copy of an ew.h record with two STORE steps, made malformed as ``how`` says."""
    ints = list(ints)
    nbuf, nd = ints[1], ints[2]
    at = 3 + nd + nbuf * nd + 2 * nbuf + 1  # the first step (after the record's kind and the step count)
    steps = [at + 5 * s for s in range(ints[at - 1])]
    stores = [i for i in steps if ints[i] == native.STORE]
    if how == "store_of_a_store":
        ints[stores[1] + 1] = native.TEMP + steps.index(stores[0])
    elif how == "store_last":
        ints[steps[-1]:steps[-1] + 5] = ints[stores[0]:stores[0] + 5]
    else:  # a written buffer read as an operand
        ints[steps[0] + 1] = ints[stores[0] + 2]
    return ints


@pytest.mark.parametrize("how", ["store_of_a_store", "store_last", "written_buffer_read"])
def test_malformed_store_programs_are_refused(monkeypatch, how):
    """csrc/ew.c checks every program before its task goes in: a malformed one with
    further results is refused with an error naming its task, and writes nothing."""
    from torch_nntile.runtime import submission

    real = submission.ew_record

    def record(fn, specs):
        rec = real(fn, specs)
        if rec is not None and rec[0][0] == 0 and len(specs) == 7:  # the update below: p; m, v; p, g, m, v
            rec = (_break_stores(rec[0], how), rec[1])
        return rec

    monkeypatch.setattr(submission, "ew_record", record)
    p, g, m, v = (_dev(t) for t in (torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3), torch.rand(4, 3)))
    torch_nntile.execute()
    torch_nntile.wait()
    m.lerp_(g, 0.1)
    v.mul_(0.9).addcmul_(g, g, value=0.1)
    p.addcdiv_(m, v.sqrt().add_(1e-8), value=-0.5)
    with pytest.raises(RuntimeError, match=r"starpu_task_submit failed \(-22\) for lerp\+mul\+addcmul"):
        torch_nntile.execute()
    with pytest.raises(RuntimeError, match="lerp"):
        p.cpu()


def test_what_stays_python():
    def kernel_of(fn, *args):
        held = fn(*(_dev(a) for a in args))  # noqa: F841 - a value nothing holds is not computed
        (task,) = [(k, specs) for k, specs, name in _lowered() if name not in ("ingress", "readout")]
        return native.record(*task)

    x = torch.randn(4, 5)
    assert kernel_of(lambda a: torch.div(a, 2, rounding_mode="floor"), x) is None  # no such step
    assert kernel_of(lambda a: a * 2, x.double()) is None  # float arithmetic: float32 only
    assert kernel_of(lambda a: a * 2.5, x.to(torch.int32)) is None  # float32 arithmetic of integer tiles
    assert kernel_of(lambda a: a > 0, x.half()) is None  # no half-precision maps
    assert kernel_of(lambda a: torch.erfinv(a), x) is None
    assert kernel_of(lambda a: a * 2, x) is not None
    assert kernel_of(lambda a: a * 2, x.to(torch.int32)) is not None  # integer arithmetic (kernels.typed)


def test_views_fill_and_partial_sums():
    torch.manual_seed(3)
    x = torch.randn(6, 5, 4)
    xn = _dev(x, [2, 4])
    assert_close(xn.permute(2, 0, 1).contiguous().cpu(), x.permute(2, 0, 1).contiguous())
    assert_close(xn.transpose(0, 2).reshape(-1).cpu(), x.transpose(0, 2).reshape(-1))
    assert_close(xn.as_strided((3, 4), (7, 2), 3).cpu(), x.as_strided((3, 4), (7, 2), 3))
    assert_close(torch.full((7, 3), -1.5, device="nntile").cpu(), torch.full((7, 3), -1.5))
    w = torch.randn(4, 3)
    assert_close((xn @ _dev(w)).sum(0).cpu(), (x @ w).sum(0))  # partial sums over dim-0 tiles


@pytest.mark.parametrize("shape,perm", [
    ((8, 64, 4, 32), (0, 2, 1, 3)),  # rows of 32: the heads of an attention, split and merged
    ((3, 70, 45), (0, 2, 1)),  # the last two dims swapped: 32 x 32 blocks and their ragged edges
    ((70, 45), (1, 0)),
    ((5, 3, 200), (1, 0, 2)),  # long rows
    ((4, 6, 5), (2, 0, 1)),  # a stride-1 source dim that is not next to the output's last
    ((33, 1, 31), (2, 1, 0)),  # a size-1 dim among them
])
@pytest.mark.parametrize("tiled", [False, True])
def test_copies_of_permutations_in_c(shape, perm, tiled):
    """Permuting copies (the copy-only C programs) give CPU's exact values, untiled and
    with dim 0 in two uneven tiles."""
    torch.manual_seed(4)
    x = torch.randn(shape)
    first = shape[0] // 2 + 1
    got = _dev(x, [first, shape[0] - first] if tiled else None).permute(perm).contiguous()
    tasks = [(k, specs) for k, specs, name in _lowered() if name == "permute"]
    assert tasks and all(native.record(k, specs) is not None for k, specs in tasks)
    assert torch.equal(got.cpu(), x.permute(perm).contiguous())


def test_copies_of_strided_views_in_c():
    x = torch.randn(9, 70)
    xn = _dev(x)
    views = [((5, 40), (70, 1), 3), ((40, 5), (1, 70), 2), ((6, 30), (35, 2), 1), ((4, 3, 5), (1, 140, 5), 0)]
    for size, stride, offset in views:
        assert torch.equal(xn.as_strided(size, stride, offset).contiguous().cpu(), x.as_strided(size, stride, offset))


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
def test_batched_products_in_c(ta, tb):
    torch.manual_seed(4)
    a = torch.randn(6, 5, 7) if not ta else torch.randn(6, 7, 5)
    b = torch.randn(6, 7, 3) if not tb else torch.randn(6, 3, 7)

    def f(a, b):
        return torch.bmm(a.transpose(1, 2) if ta else a, b.transpose(1, 2) if tb else b)

    assert_close(f(_dev(a, [2, 4]), _dev(b, [2, 4])).cpu(), f(a, b))
    assert_close(f(_dev(a), _dev(b)).cpu(), f(a, b))


def test_zero_size_and_zero_dim():
    for shape in [(0, 3), (), (1,)]:
        x = torch.randn(shape)
        assert_close(torch.tanh(_dev(x) * 2 + 1).cpu(), torch.tanh(x * 2 + 1))


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dim", [-1, 1])
def test_softmax_rows_in_c(log, dim):
    torch.manual_seed(5)
    x = torch.randn(6, 9, 5, requires_grad=True)
    x.data[0, 0, 0] = math.nan
    x.data[1, :, 2] = -math.inf if dim == 1 else x.data[1, :, 2]
    x.data[2, 3, :] = -math.inf if dim == -1 else x.data[2, 3, :]
    fn = F.log_softmax if log else F.softmax
    want = fn(x, dim)
    g = torch.randn_like(want)
    (gx,) = torch.autograd.grad(want, x, g)
    xn = x.detach().to("nntile").requires_grad_()
    got = fn(xn, dim)
    (gxn,) = torch.autograd.grad(got, xn, g.to("nntile"))
    _same_bits(got.detach().cpu(), want.detach())
    _same_bits(gxn.cpu(), gx)


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("tiles", [None, [3, 5]])
@pytest.mark.parametrize("width, offset", [(40, 2.0), (13, 2.0), (3, 0.0), (136, 100.0)])
def test_layer_norm_rows_in_c(affine, tiles, width, offset):
    """Rows of whole lanes (40), lanes and a tail (13, 136), a tail only (3); a mean far
    from 0 (the variance is summed about the mean, not from the squares)."""
    torch.manual_seed(6)
    x = (torch.randn(8, 3, width) * 4 + offset).requires_grad_()
    ln = torch.nn.LayerNorm(width, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ln.weight.normal_()
            ln.bias.normal_()
    want = ln(x)
    g = torch.randn_like(want)
    grads = torch.autograd.grad(want, [x, *ln.parameters()], g)
    lnn = torch.nn.LayerNorm(width, elementwise_affine=affine).to("nntile")
    lnn.load_state_dict(ln.state_dict())
    xn = _dev(x.detach(), tiles).requires_grad_()
    got = lnn(xn)
    gotg = torch.autograd.grad(got, [xn, *lnn.parameters()], g.to("nntile"))
    assert_close(got.detach().cpu(), want.detach())
    for a, b in zip(gotg, grads):
        assert_close(a.cpu(), b, rtol=1e-4)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("tiles", [None, [2, 4]])
def test_softmax_rows_wider_than_the_lanes(log, tiles):
    """Rows of 37 (four lanes of 8 and a tail): a NaN inside the lanes makes its row NaN,
    a row of -inf in the lanes and a finite tail keeps its finite values, and a row
    spanning 400 needs its true max (exp of anything else overflows)."""
    torch.manual_seed(7)
    x = torch.randn(6, 37) * 3
    x[1, 10] = math.nan
    x[2, :32] = -math.inf
    x[3, 36] = math.nan
    x[4] = torch.linspace(200, -200, 37)
    x[5] = torch.linspace(-200, 200, 37)
    fn = F.log_softmax if log else F.softmax
    got = fn(_dev(x, tiles), -1).cpu()
    assert torch.isnan(got[1]).all() and torch.isnan(got[3]).all()
    _same_bits(got, fn(x, -1))


def test_row_kernels_get_c_records():
    x = torch.randn(4, 6).to("nntile")
    held = [F.softmax(x, -1), F.log_softmax(x, 0), F.layer_norm(x, (6,))]  # noqa: F841
    tasks = [(k, specs) for k, specs, name in _lowered() if name not in ("ingress", "readout")]
    assert len(tasks) == 3 and all(native.record(k, specs) is not None for k, specs in tasks)


@pytest.mark.parametrize("tiles", [[3, 5], [1, 4, 3]])
def test_retiles_and_concatenations_copy_boxes_in_c(tiles):
    torch.manual_seed(7)
    x, y = torch.randn(8, 6), torch.randn(8, 2)
    xn = _dev(x, tiles)
    yn = _dev(y)
    assert_close(torch.cat([xn, yn], 1).cpu(), torch.cat([x, y], 1))
    assert_close(xn.reshape(4, 12).cpu(), x.reshape(4, 12))
    assert_close(xn.t().contiguous().cpu(), x.t().contiguous())
    held = torch.cat([xn, yn], 1)  # noqa: F841
    tasks = [(k, specs, name) for k, specs, name in _lowered() if name == "cat"]
    assert tasks and all(native.record(k, specs) is not None for k, specs, _ in tasks)


@pytest.mark.parametrize("tiles", [None, [3, 5], [1, 4, 3]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
def test_box_copies_slices_pads_flips_rolls_in_c(tiles, dtype):
    """Box copies (HF's split of the qkv projection, padding with its fill, crops, flips
    by negative strides, rolls: two boxes from one tile) are strided C copies of any
    element size, with CPU's exact values."""
    x = (torch.randn(8, 12) * 4).to(dtype)
    xn = _dev(x, tiles)
    cases = {"slice": lambda t: t[:, 4:8], "split": lambda t: t.split(5, 1)[1], "pad": lambda t: F.pad(t, (1, 2)),
             "pad_value": lambda t: F.pad(t, (2, 0, 0, 1), value=-100), "crop": lambda t: F.pad(t, (-1, 2, 1, -3)),
             "flip": lambda t: t.flip(1), "flip_both": lambda t: t.flip(0, 1), "roll": lambda t: t.roll((3, -2), (0, 1))}
    for name, fn in cases.items():
        held = fn(xn).clone()  # a view is read (a box copy) when something reads it
        boxes = [(k, specs) for k, specs, kname in _lowered() if kname in ("slice", "constant_pad_nd", "flip", "roll")]
        assert boxes, name
        assert all(native.record(k, specs) is not None for k, specs in boxes), name
        assert torch.equal(held.cpu(), fn(x)), name


@pytest.mark.parametrize("n", [12, 70])
def test_tasks_with_many_tiles(n):
    """More tiles than StarPU's fixed buffer slots (and than a C program takes)."""
    parts = [torch.randn(2, 3) for _ in range(n)]
    got = torch.cat([p.to("nntile") for p in parts], 0)
    assert_close(got.cpu(), torch.cat(parts, 0))
    assert_close(torch.stack([p.to("nntile") for p in parts]).sum(0).cpu(), torch.stack(parts).sum(0))


def test_kernel_caches_keep_no_data_and_stay_bounded():
    """What kernels.native caches are kernels with a C form: an ingress kernel (which
    holds its CPU source) is not kept, and kernels whose scalars change every step
    (Adam's bias corrections) do not pile up."""
    import gc
    import weakref

    x = torch.randn(64, 32)
    seen = weakref.ref(x)
    xn = x.to("nntile")
    assert_close(xn.cpu(), x)
    del x, xn
    gc.collect()
    assert seen() is None
    y = torch.randn(8, 4).to("nntile")
    sizes = []
    for step in range(native._CACHED + 10):
        y = y * (1 + step * 1e-9)
        y.cpu()  # one compile a step, as in training
        sizes.append(len(native._RECORDS))
    assert 0 < max(sizes) <= native._CACHED + 1 and len(native._PROGRAMS) <= native._CACHED + 1


@pytest.mark.parametrize("tiles", [None, [3, 5]])
def test_sums_bias_gradients_and_means_in_c(tiles):
    """Sums of float32 over consecutive dims, tiled or not, and the mean's scaling, in C."""
    torch.manual_seed(4)
    x = torch.randn(8, 6, 33)
    xn = _dev(x, tiles)
    held = [xn.sum(0), xn.sum((0, 1)), xn.mean(-1), xn.sum(1, keepdim=True)]
    for got, want in zip(held, [x.sum(0), x.sum((0, 1)), x.mean(-1), x.sum(1, keepdim=True)]):
        assert_close(got.cpu(), want)
    held = [xn.sum(0)]
    tasks = [(k, specs) for k, specs, name in _lowered() if name == "sum"]
    assert tasks and all(native.record(k, specs) is not None for k, specs in tasks)
    assert_close(held[0].cpu(), x.sum(0))
    h = xn.sum((0, 2))  # not consecutive: stays Python, same values
    assert_close(h.cpu(), x.sum((0, 2)))


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("tiles", [None, [2, 6]])
def test_embedding_lookup_and_gradient_in_c(index_dtype, tiles):
    torch.manual_seed(5)
    w = torch.randn(20, 7)
    idx = torch.randint(0, 20, (8, 3), dtype=index_dtype)
    idx[0, 0] = 4  # the padding row appears
    wc = w.clone().requires_grad_()
    wn = w.to("nntile").requires_grad_()
    want = F.embedding(idx, wc, padding_idx=4)
    got = F.embedding(_dev(idx, tiles), wn, padding_idx=4)
    assert_close(got.cpu(), want.detach())
    g = torch.randn_like(want)
    want.backward(g)
    got.backward(_dev(g, tiles))
    assert_close(wn.grad.cpu(), wc.grad)
    got = F.embedding(_dev(idx, tiles), wn.detach())
    assert_close(got.cpu(), F.embedding(idx, w))
    sel = torch.index_select(wn.detach(), 0, _dev(idx[:, 0].contiguous()))
    tasks = [(k, specs) for k, specs, name in _lowered() if name == "index_select"]
    assert tasks and all(native.record(k, specs) is not None for k, specs in tasks)
    assert_close(sel.cpu(), torch.index_select(w, 0, idx[:, 0].contiguous()))


def test_lookup_out_of_range_raises_the_cpu_error_from_c():
    w = torch.randn(5, 3).to("nntile")
    for bad in (5, -1):
        with pytest.raises(IndexError, match="index out of range in self"):
            torch.index_select(w, 0, torch.tensor([0, bad]).to("nntile")).cpu()
    assert_close(torch.index_select(w, 0, torch.tensor([4, 0]).to("nntile")).cpu(), w.cpu()[[4, 0]])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("tiles", [None, [4, 7]])
@pytest.mark.parametrize("rows", [None, [2, 1, 2, 1, 2]], ids=["rows whole", "5 row tiles"])
def test_cross_entropy_in_c(reduction, tiles, rows):
    """The loss, its total weight and its gradient of float32 logits and int64 targets
    (ignore_index included) run in C, with the classes whole or tiled, the rows whole
    or tiled (the tiles' partial sums are added in C too)."""
    torch.manual_seed(6)
    x = torch.randn(8, 11)
    t = torch.randint(0, 11, (8,))
    t[2] = -100
    xc = x.clone().requires_grad_()
    xn = x.to("nntile")
    name = f"ce_{reduction}_{tiles}_{rows}"
    torch_nntile.set_axis_group_name(xn, {0: name + "_rows", 1: name})
    if tiles is not None:
        torch_nntile.set_axis_group_tiling(name, tiles)
    if rows is not None:
        torch_nntile.set_axis_group_tiling(name + "_rows", rows)
    xn.requires_grad_()
    want = F.cross_entropy(xc, t, reduction=reduction)
    got = F.cross_entropy(xn, t.to("nntile"), reduction=reduction)
    assert_close(got.cpu(), want.detach())
    g = torch.rand_like(want)
    want.backward(g)
    got.backward(g.to("nntile"))
    assert_close(xn.grad.cpu(), xc.grad)
    held = F.nll_loss(xn.detach(), t.to("nntile"), reduction=reduction)  # noqa: F841
    tasks = [(k, specs) for k, specs, n in _lowered() if n == "nll_loss_forward"]
    assert tasks and all(native.record(k, specs) is not None for k, specs in tasks), tasks


def test_target_out_of_bounds_raises_the_cpu_error_from_c():
    x = torch.randn(4, 6).to("nntile")
    with pytest.raises(IndexError, match="Target 6 is out of bounds"):
        F.cross_entropy(x, torch.tensor([0, 6, 1, 2]).to("nntile")).item()
    with pytest.raises(IndexError, match="Target -3 is out of bounds"):
        F.nll_loss(x, torch.tensor([0, -3, 1, 2]).to("nntile"), reduction="sum").item()
    assert abs(F.cross_entropy(x, torch.tensor([0, 5, 1, 2]).to("nntile")).item()
               - F.cross_entropy(x.cpu(), torch.tensor([0, 5, 1, 2])).item()) < 1e-5


@pytest.mark.parametrize("args,dtype", [((3, 70, 2), torch.int64), ((-5, 40), torch.int64), ((0, 60), torch.float32),
                                        ((0.5, 7.5, 0.25), torch.float32)])
@pytest.mark.parametrize("tiles", [None, [7, 100]])
def test_arange_in_c(args, dtype, tiles):
    want = torch.arange(*args, dtype=dtype)
    if tiles is not None:
        tiles = [tiles[0], want.numel() - tiles[0]]
    got = torch.arange(*args, dtype=dtype, device="nntile")
    if tiles is not None:
        torch_nntile.set_axis_group_name(got, {0: f"ar_{id(got)}"})
        torch_nntile.set_axis_group_tiling(f"ar_{id(got)}", tiles)
    tasks = [(k, specs) for k, specs, n in _lowered() if n == "arange"]
    assert tasks and all(native.record(k, specs) is not None for k, specs in tasks)
    assert torch.equal(got.cpu(), want)


def test_exp_underflows_to_exact_zero_like_cpu():
    """exp of -inf and of values past the smallest subnormal is 0, as on CPU, so that
    log(sum(exp(x))) of a row with nothing left is -inf (not about -103)."""
    x = torch.cat([torch.linspace(-105, -80, 5001), torch.tensor([-math.inf, -104.0, -103.9])])
    got = torch.exp(_dev(x)).cpu()
    assert torch.equal(got == 0, torch.exp(x) == 0)
    rows = torch.full((3, 2), -math.inf)
    rows[0, 0] = 1.0
    assert torch.equal(torch.logsumexp(_dev(rows), 0).cpu(), torch.logsumexp(rows, 0))
    assert torch.equal(F.softmax(_dev(rows.t().contiguous()), -1).cpu() == 0, F.softmax(rows.t(), -1) == 0)


def test_fills_of_zeros_of_either_sign_keep_their_sign():
    """Kernels whose parameters differ only by the sign of a zero are different kernels
    (the C programs are cached by kernel)."""
    for value in (0.0, -0.0, 0.0, -0.0):
        got = torch.full((4,), value, device="nntile").cpu()
        assert torch.equal(torch.signbit(got), torch.signbit(torch.full((4,), value)))


def test_tasks_past_the_named_ones_still_run_in_c(monkeypatch, python_tasks):
    """The C side counts tasks under at most 128 names; once as many names are in use,
    tasks of new names still run in C (counted together as ``OTHER_C_TASKS``), not as
    Python callbacks."""
    from torch_nntile.runtime import submission

    rt = SESSION_STATE.runtime()
    torch_nntile.wait()
    torch_nntile.metrics()  # the counts so far are folded in under the real names
    full = {f"earlier_{k}": k for k in range(submission._GEMM_NAMES - 1)}
    monkeypatch.setattr(rt, "_gemm_names", full)
    torch_nntile.reset_info()
    x = torch.randn(6, 5)
    got = torch.tanh(_dev(x, [4, 2]) * 2 + 1).cpu()
    assert_close(got, torch.tanh(x * 2 + 1))
    torch_nntile.wait()
    kernels = torch_nntile.metrics()["kernels"]
    assert kernels[submission.OTHER_C_TASKS]["tasks"] == 4, kernels  # x's two tiles copied in, the fused chain's two
    assert set(python_tasks) == {"readout"}, python_tasks  # only it runs as Python
    assert len(full) == submission._GEMM_NAMES - 1


@pytest.fixture
def split_all():
    """Every product large enough to split runs in two parts (restored after)."""
    lib = SESSION_STATE.runtime().lib
    lib.tnt_set_split_macs(0.0)
    yield lib
    lib.tnt_set_split_macs(1048576.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m,n", [(64, 40), (16, 48), (37, 33), (8, 8)], ids=["rows", "columns", "odd", "whole"])
def test_products_in_two_parts(split_all, dtype, ta, tb, m, n):
    """A product in two parts (by rows of the result, else its columns; a small one
    whole), on one worker or half on an idle one while this thread waits: CPU's values,
    and the same bits each time, whoever ran which part."""
    torch.manual_seed(5)
    a = torch.randn(m, 24, dtype=dtype) if not ta else torch.randn(24, m, dtype=dtype)
    b = torch.randn(24, n, dtype=dtype) if not tb else torch.randn(n, 24, dtype=dtype)

    def f(a, b):
        return (a.t() if ta else a) @ (b.t() if tb else b)

    an, bn = _dev(a), _dev(b)
    first = f(an, bn).cpu()
    assert_close(first, f(a, b))
    for _ in range(5):
        assert torch.equal(f(an, bn).cpu(), first)
    assert_close(f(_dev(a, 10), bn).cpu(), f(a, b))  # uneven tiles: each tile's product in parts


def test_batched_products_in_two_parts(split_all):
    torch.manual_seed(6)
    a, b = torch.randn(5, 9, 7), torch.randn(5, 7, 4)
    an, bn = _dev(a), _dev(b)
    first = torch.bmm(an, bn).cpu()
    assert_close(first, torch.bmm(a, b))
    assert torch.equal(torch.bmm(an, bn).cpu(), first)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dim", [-1, 1])
def test_large_softmax_rows_shared(log, dim):
    """A softmax large enough to share (its rows in two parts, the second maybe on an
    idle worker while this thread waits) and its backward: CPU's values, the same bits
    on every read."""
    torch.manual_seed(7)
    x = torch.randn(9, 700, 8, requires_grad=True)
    fn = F.log_softmax if log else F.softmax
    w = torch.randn(9, 700, 8)
    xn = x.detach().to("nntile").requires_grad_()
    yn = fn(xn, dim)
    (yn * w.to("nntile")).sum().backward()
    y = fn(x, dim)
    (y * w).sum().backward()
    first, grad = yn.detach().cpu(), xn.grad.cpu()
    _same_bits(first, y.detach())
    _same_bits(grad, x.grad)
    for _ in range(3):
        assert torch.equal(fn(xn.detach(), dim).cpu(), first)


def _ew_cases() -> dict[str, tuple]:
    """Programs that walk their tiles each way ew.c knows: one contiguous run with a
    partial last block, long rows beside a broadcast (several blocks a row), short rows
    gathered several to a block, a transposed read, a bool mask, several results
    (stores), an in-place update (the output read), a 0-dim and an empty tile."""
    g = torch.Generator().manual_seed(11)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    def two_results(x, y):
        a = (x * 1.5 + y).tanh()
        return a, a * y - x

    def inplace(x, y):
        z = x * 1.0
        z.add_(y.sigmoid(), alpha=-0.5)
        return z

    return {
        "contiguous": (lambda x: F.gelu(x * 0.7 - 0.2, approximate="tanh"), [r(7, 333)]),
        "long_rows_broadcast": (lambda x, b: (x + b).exp() * b, [r(37, 700), r(700)]),
        "short_rows": (lambda x, b: x * b - (x / (b.abs() + 1)), [r(100, 33), r(100, 1)]),
        "transposed": (lambda x, y: x.t() * 2 + y, [r(300, 40), r(40, 300)]),
        "bool_mask": (lambda x, m: x * m * 2.0, [r(9, 530), r(9, 530) > 0]),
        "two_results": (two_results, [r(13, 400), r(13, 400)]),
        "inplace": (inplace, [r(21, 260), r(21, 260)]),
        "zero_dim": (lambda x: x.exp() + 1, [torch.tensor(0.75)]),
        "empty": (lambda x: x.exp() + 1, [r(0, 40)]),
    }


@pytest.mark.parametrize("tiles", [None, "uneven"])
@pytest.mark.parametrize("case", list(_ew_cases()))
def test_elementwise_programs_in_two_parts(python_tasks, case, tiles):
    """An elementwise program in two parts gives the bits it gives whole, every time,
    whoever ran which part; and CPU's values."""
    fn, args = _ew_cases()[case]

    held = []  # results stay alive: their tiles are not reused, only the NaN ones of run(nan)

    def run(args=args):
        outs = fn(*(_dev(a, [a.shape[0] // 3 + 1, a.shape[0] - a.shape[0] // 3 - 1])
                    if tiles and a.dim() and a.shape[0] > 2 else _dev(a) for a in args))
        outs = outs if isinstance(outs, tuple) else (outs,)
        if args is not nan:
            held.append(outs)
        return [o.cpu() for o in outs]

    nan = [torch.full_like(a, math.nan) if a.is_floating_point() else a for a in args]

    whole = run()
    want = fn(*args)
    for got, w in zip(whole, want if isinstance(want, tuple) else (want,)):
        assert_close(got, w)
    lib = SESSION_STATE.runtime().lib
    lib.tnt_set_split_ew_cost(0.0)
    try:
        for _ in range(3):
            run(nan)  # its tiles of NaN freed for the next run's results: a value no part wrote shows
            for got, w in zip(run(), whole):
                assert got.shape == w.shape and torch.equal(got.view(torch.int32), w.view(torch.int32)), case
    finally:
        lib.tnt_set_split_ew_cost(262144.0)
    _in_c(python_tasks)


# -- tiles of other dtypes than float32: copies, comparisons, integer maps, where, any, index --------


def _in_c(python_tasks: list[str]) -> None:
    assert set(python_tasks) <= {"readout"}, python_tasks


def _parity(fn, *args, tiles=None):
    """``fn`` on nntile (the first tensor argument tiled along dim 0 by ``tiles``) gives
    CPU's exact result: same dtype, shape and bits (NaN where CPU has NaN)."""
    want = fn(*args)
    got = fn(*(_dev(a, tiles if i == 0 else None) if isinstance(a, torch.Tensor) else a
               for i, a in enumerate(args))).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
    if want.is_floating_point():
        assert torch.equal(got.isnan(), want.isnan()), (got, want)
        got, want = got.nan_to_num(), want.nan_to_num()
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)) if got.dim() else got == want, (got, want)
    else:
        assert torch.equal(got, want), (got, want)


COMPARISONS = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
_I = torch.tensor([[3, -2, 0, 7, -9, 2**40, -2**62], [1, 1, -1, 0, 5, 2**63 - 1, -2**63]]).repeat(3, 1)
_F = torch.tensor([[0.0, -0.0, 1.5, math.nan, math.inf, -math.inf, 16777216.0]]).repeat(6, 1)
COMPARE_CASES = {
    "int64 rows": (lambda a, b: (a, b[0]), _I, _I.flip(0)),
    "int64 columns": (lambda a, b: (a, b[:, :1]), _I, _I.flip(1)),
    "int64 scalar": (lambda a, b: (a, 7), _I, None),
    "int32": (lambda a, b: (a.int(), b.int()), _I.remainder(1000), _I.flip(1).remainder(1000)),
    "int32 wrapped scalar": (lambda a, b: (a.int() * 0, 2**32), _I, None),  # 2**32 is 0 in int32
    "uint8 -1": (lambda a, b: (a.remainder(256).to(torch.uint8), -1), _I, None),  # -1 is 255 in uint8
    "float32": (lambda a, b: (a, b), _F, _F.roll(1, 1)),
    "float32 scalar": (lambda a, b: (a, 0.1), _F, None),
    "float32 int scalar": (lambda a, b: (a, 16777217), _F, None),  # 16777217 is 16777216.0 in float32
    "int64 float scalar": (lambda a, b: (a, 2.5), _I, None),  # compared in float32
    "int64 float32 tile": (lambda a, b: (a, b), _I, _F),
    "float32 float64 0-dim": (lambda a, b: (a, torch.tensor(0.1, dtype=torch.float64)), _F + 0.1, None),
    "bool int scalar": (lambda a, b: (a > 0, 2), _I, None),
    "0-dim": (lambda a, b: (a[0, 0], b[1, 1]), _I, _I.flip(1)),
    "zero-size": (lambda a, b: (a[:0], b[0]), _I, _I.flip(0)),
}


@pytest.mark.parametrize("case", list(COMPARE_CASES))
@pytest.mark.parametrize("name", list(COMPARISONS))
def test_comparisons_in_c(python_tasks, name, case):
    """Comparisons of integer, bool and float32 tiles (broadcast, against numbers and CPU
    scalars, mixed dtypes promoted as PyTorch does, wrapped numbers) write CPU's bools."""
    op, (prep, a, b) = COMPARISONS[name], COMPARE_CASES[case]
    x, y = prep(a, b if b is not None else a)
    tiles = [2, 4] if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == 6 else None
    if isinstance(y, torch.Tensor) and y.dim() == 0 and y.dtype is torch.float64:
        _parity(lambda t: op(t, y), x, tiles=tiles)  # a CPU scalar
    else:
        _parity(op, x, y, tiles=tiles)
    _in_c(python_tasks)


def test_comparisons_not_covered_stay_python():
    x = torch.randn(4, 5)
    held = torch.gt(_dev(x.half()), 0)  # noqa: F841 - no half-precision maps
    (task,) = [(k, specs) for k, specs, name in _lowered() if name == "gt"]
    assert native.record(*task) is None
    assert torch.equal(torch.gt(_dev(x.half()), 0).cpu(), torch.gt(x.half(), 0))


@pytest.mark.parametrize("tiles", [None, [2, 4]])
def test_integer_arithmetic_in_c(python_tasks, tiles):
    """add / sub (with alpha) and mul of integer tiles wrap as CPU's do."""
    b = torch.tensor([[5, -3, 2**62, 1, 0, -7, 3]])
    cases = [
        lambda x, y: x + y, lambda x, y: torch.add(x, y, alpha=3), lambda x, y: torch.sub(x, y, alpha=-2**40),
        lambda x, y: x * y, lambda x, y: x - 1, lambda x, y: 5 - x, lambda x, y: x * 2**62,
        lambda x, y: x[0, 0] * y[0, 1], lambda x, y: x[:0] + y,
    ]
    for fn in cases:
        _parity(fn, _I, b, tiles=tiles)
    i32, i16, u8 = _I.remainder(2**31).int(), _I.remainder(2**15).short(), _I.remainder(256).to(torch.uint8)
    for fn, x in [(lambda x, y: x + 2**31, i32), (lambda x, y: x * y, i32), (lambda x, y: x * 300, i16),
                  (lambda x, y: x + 250, u8), (lambda x, y: torch.sub(x, y, alpha=3), u8)]:
        _parity(fn, x, x.flip(1), tiles=tiles)
    _in_c(python_tasks)
    held = _dev(_I) * 1.5  # noqa: F841 - float32 arithmetic of an integer tile stays Python
    (task,) = [(k, specs) for k, specs, name in _lowered() if name == "mul"]
    assert native.record(*task) is None


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64])
@pytest.mark.parametrize("name", ["bitwise_and", "bitwise_or", "bitwise_xor"])
def test_bitwise_ops_in_c(python_tasks, dtype, name):
    """Tensor and tensor (broadcast, and promoted to int64), tensor and number, in place."""
    g = torch.Generator().manual_seed(6)
    if dtype is torch.bool:
        a, b, s = torch.rand(5, 7, generator=g) > 0.5, torch.rand(7, generator=g) > 0.5, True
    else:
        a, b, s = (torch.randint(-100, 100, (5, 7), generator=g).to(dtype),
                   torch.randint(-100, 100, (7,), generator=g).to(dtype), 77)
    f = getattr(torch, name)
    for x, y in ((a, b), (a, s), (a, b.long())):
        _parity(f, x, y, tiles=[2, 3])
    x = _dev(a, [4, 1])
    getattr(x, name + "_")(_dev(b))
    assert torch.equal(x.cpu(), f(a, b))
    _in_c(python_tasks)


@pytest.mark.parametrize("tiles", [None, [1, 2]])
def test_where_in_c(python_tasks, tiles):
    """where of float32 (bits kept: NaN, -0.0), int64, bool and float64 values, 0-dim value
    tiles (an attention's mask fill), numbers, promotion, a broadcast condition."""
    torch.manual_seed(8)
    cond = torch.rand(3, 1, 6, 7) > 0.5
    f = torch.randn(3, 1, 6, 7)
    f[0, 0, 0, :3] = torch.tensor([math.nan, -0.0, math.inf])
    i = torch.randint(-2**62, 2**62, (3, 1, 6, 7))
    lo = torch.tensor(torch.finfo(torch.float32).min)
    # (operands computed here: an elementwise producer would fold into the where, and
    # fused chains with steps of other dtypes than float32 run as Python)
    cases = [
        lambda c, v, w, u, d: torch.where(c, v, lo), lambda c, v, w, u, d: torch.where(c, torch.tensor(0.0), lo),
        lambda c, v, w, u, d: torch.where(c, v, -0.0), lambda c, v, w, u, d: torch.where(c, w, w.flip(2)),
        lambda c, v, w, u, d: torch.where(c, w, -3), lambda c, v, w, u, d: torch.where(c, w, torch.tensor(0.5)),
        lambda c, v, w, u, d: torch.where(c[:1, :, :, :1], v, u), lambda c, v, w, u, d: torch.where(c, c, c.flip(3)),
        lambda c, v, w, u, d: torch.where(c, d, 2.0), lambda c, v, w, u, d: torch.where(c[0, 0, 0, 0], v, u),
        lambda c, v, w, u, d: torch.where(c[:0], v[:0], 1.0),
    ]
    for fn in cases:
        _parity(fn, cond, f, i, -f, f.double() * 3, tiles=tiles)
    _in_c(python_tasks)


_CAST_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32,
                torch.float64]
_CAST_SOURCES = {
    "int": torch.tensor([[0, 1, -1, 127, -128, 255, 256], [2**31 - 1, -2**31, 2**40 + 3, -2**53 - 1, 16777217, 7, -3]]),
    "float": torch.tensor([[0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 16777217.0],
                           [1e-30, 1e30, -1e30, 255.7, math.inf, -math.inf, math.nan]], dtype=torch.float64),
}


@pytest.mark.parametrize("tiles", [None, [1, 2, 1]])
@pytest.mark.parametrize("src", _CAST_DTYPES)
def test_casts_between_dtypes_in_c(python_tasks, src, tiles):
    """``.to(dtype)`` between bool, integers and floats converts as CPU does (integers
    wrap; -0.0, infinities and NaN kept; a bool is nonzero, NaN included), in C; floats
    to integers (PyTorch leaves values out of range unspecified) stay Python."""
    x = _CAST_SOURCES["float" if src.is_floating_point else "int"].to(src).repeat(2, 1)
    for out in _CAST_DTYPES:
        if src.is_floating_point and not (out.is_floating_point or out is torch.bool):
            continue
        _parity(lambda t: t.to(out), x, tiles=tiles)
        _parity(lambda t: t[0, 1].to(out), x)  # 0-dim
        _parity(lambda t: t[:0].to(out), x)
    _in_c(python_tasks)
    held = _dev(_CAST_SOURCES["float"].float()).to(torch.int32)  # noqa: F841
    (task,) = [(k, specs) for k, specs, name in _lowered() if name == "_to_copy"]
    assert native.record(*task) is None
    finite = _CAST_SOURCES["float"][:, :4]
    _parity(lambda t: t.to(torch.int16), finite)  # as Python, the same values


@pytest.mark.parametrize("tiles", [None, [1, 2]])
def test_infinity_tests_and_masked_fill_in_c(python_tasks, tiles):
    """``isposinf`` / ``isneginf`` of float32 and float64 tiles, and ``masked_fill`` of
    tiles of any dtype (a number converted to the tile's dtype, a 0-dim tile, a CPU
    scalar, a broadcast mask; bits kept): CPU's values, in C; a value out of the dtype's
    range raises CPU's error."""
    torch.manual_seed(9)
    f = torch.randn(3, 1, 6, 7)
    f[0, 0, 0, :4] = torch.tensor([math.nan, -0.0, math.inf, -math.inf])
    mask = torch.rand(3, 1, 6, 7) > 0.5
    for x in (f, f.double()):
        _parity(torch.isneginf, x, tiles=tiles)
        _parity(torch.isposinf, x, tiles=tiles)
    seven = torch.tensor(7)
    for x in (f, f.double(), (f * 100).long(), (f * 100).int(), f > 0, (f.abs() * 9).to(torch.uint8)):
        for value in (-3, 2.7, True, -0.0, float("-inf") if x.is_floating_point() else 5):
            _parity(lambda t, m: t.masked_fill(m, value), x, mask, tiles=tiles)
        _parity(lambda t, m: t.masked_fill(m[:1, :, :, :1], torch.tensor(1.5)), x, mask, tiles=tiles)  # a CPU scalar
        _parity(lambda t, m, v: t.masked_fill(m, v), x, mask, seven.to(x.dtype), tiles=tiles)  # a 0-dim tile
    _in_c(python_tasks)
    u8 = _dev(torch.arange(3, dtype=torch.uint8), tiles)
    for value in (300, -1.5, torch.tensor(256)):  # out of uint8's range: CPU's error, at the call
        with pytest.raises(RuntimeError, match="value cannot be converted to type uint8_t without overflow"):
            u8.masked_fill(u8 > 2, value)


@pytest.mark.parametrize("tiles", [None, [3, 1]])
def test_masks_expanded_and_any_all_in_c(python_tasks, tiles):
    """A causal mask (``le`` of broadcast positions, expanded: a strided bool copy), and
    any / all of bool and uint8 tiles, whole or over dims: CPU's values."""
    pos = torch.arange(9)
    _parity(lambda p: (p.view(1, 1, 1, 9) <= p.view(1, 1, 9, 1)).expand(4, 1, 9, 9).contiguous(), pos)
    m = torch.tensor([[0, 1, 0], [0, 0, 0], [1, 1, 1], [2, 0, 3]], dtype=torch.uint8)
    for fn in [lambda t: t.any(), lambda t: t.all(), lambda t: (t > 0).any(1), lambda t: (t > 0).all(1, keepdim=True),
               lambda t: t.any(-1), lambda t: (t > 0)[:0].all(), lambda t: (t > 0)[:0].any(), lambda t: (t[0, 1] > 0).any(),
               lambda t: (t > 0).all(0)]:
        _parity(fn, m, tiles=tiles)
    if tiles is None:
        _in_c(python_tasks)  # (tiled along a reduced dim, the parts are combined in Python)
    held = (_dev(m, tiles) > 0).any(0)  # noqa: F841
    parts = [(k, specs) for k, specs, name in _lowered() if name == "any" and k.fn.__name__ != "anyall_combine"]
    assert parts and all(native.record(k, specs) is not None for k, specs in parts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
def test_tril_tiles_kept_whole_are_c_copies(dtype):
    """``tril`` / ``triu`` of a tiled matrix: a tile the diagonal leaves whole is a plain
    copy, which runs in C for any dtype (it was a Python task); CPU's values, tiles cut
    by the diagonal included."""
    x = torch.randint(-9, 9, (7, 9)).to(dtype)
    for fn in (lambda t: t.tril(1), lambda t: t.triu(-2), lambda t: t.tril(-7), lambda t: t.triu(9)):
        want = fn(x)
        d = x.to("nntile")
        name = f"tri_{id(d)}"
        torch_nntile.set_axis_group_name(d, {0: name + "r", 1: name + "c"})
        torch_nntile.set_axis_group_tiling(name + "r", [2, 3, 2])
        torch_nntile.set_axis_group_tiling(name + "c", [4, 1, 4])
        got = fn(d)
        copies = [(k, specs) for k, specs, n in _lowered() if n in ("tril", "triu") and k.fn.__name__ == "copy_tile"]
        assert all(native.record(k, specs) is not None for k, specs in copies)
        assert torch.equal(got.cpu(), want)
    held = x.to("nntile").tril(20)  # noqa: F841 - every tile kept whole
    copies = [(k, specs) for k, specs, n in _lowered() if n == "tril"]
    assert copies and all(k.fn.__name__ == "copy_tile" and native.record(k, specs) is not None for k, specs in copies)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float64, torch.int16])
@pytest.mark.parametrize("tiles", [None, [3, 4]])
def test_copies_of_any_dtype_in_c(python_tasks, dtype, tiles):
    """Permutations, strided views, broadcasts, concatenations, re-tilings and fills of
    tiles of any element size are strided C copies."""
    x = torch.randint(-100, 100, (7, 6, 5)).to(dtype)
    for fn in [lambda t: t.permute(2, 0, 1).contiguous(), lambda t: t.transpose(0, 1).contiguous(),
               lambda t: t.as_strided((3, 4), (7, 2), 3).contiguous(), lambda t: t[:, :1].expand(7, 6, 5).contiguous(),
               lambda t: torch.cat([t, t[:, :2]], 1), lambda t: t.reshape(5, 42), lambda t: t.flatten()[:0],
               lambda t: t[2, 3, 4].expand(2, 3).contiguous(),
               lambda t: torch.full((7, 2, 5), 3, dtype=t.dtype, device=t.device) if t.device.type == "nntile"
               else torch.full((7, 2, 5), 3, dtype=t.dtype)]:
        _parity(fn, x, tiles=tiles)
    _in_c(python_tasks)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool])
def test_index_in_c(python_tasks, index_dtype, dtype):
    """``x[..., index, ...]`` with one integer index tile (negative indices, 2-D and 0-dim
    index tiles, empty ones, the kept dims tiled unevenly): CPU's values, in C."""
    x = torch.randint(-50, 50, (7, 6, 5)).to(dtype)
    i1 = torch.tensor([-1, 0, 4, -6, 2], dtype=index_dtype)
    i2 = torch.tensor([[4, -5], [0, 0]], dtype=index_dtype)
    cases = [lambda t, i, j: t[i], lambda t, i, j: t[:, i], lambda t, i, j: t[:, :, j], lambda t, i, j: t[:, i[0]],
             lambda t, i, j: t[:, i[:0]], lambda t, i, j: t[:0, i]]
    for tiles in (None, [3, 4]):  # (indexing dim 0, its tiles are gathered first)
        for fn in cases:
            _parity(fn, x, i1, i2, tiles=tiles)
    _in_c(python_tasks)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_integer_sums_in_c(python_tasks, dtype):
    """Sums of bool and integer tiles (into int64, as PyTorch sums them; int64 sums
    wrap): whole, over leading, middle and trailing dims, kept, empty; CPU's values, in
    C also where the reduced dim is tiled (the tiles' sums added into one in C)."""
    x = torch.randint(-100, 100, (6, 5, 7)).to(dtype)
    big = torch.full((6, 3), 2**62, dtype=torch.int64)
    for tiles in (None, [2, 4]):
        for fn in (lambda t: t.sum(), lambda t: t.sum(0), lambda t: t.sum((1, 2)), lambda t: t.sum(1, keepdim=True),
                   lambda t: t.sum(-1), lambda t: t[:0].sum(), lambda t: t[:, :0].sum(1)):
            _parity(fn, x, tiles=tiles)
        _parity(lambda t: t.sum(0), big, tiles=tiles)
        _in_c(python_tasks)
        held = _dev(x, tiles).sum(0)  # noqa: F841 - tiled: partial sums, then add_into
        tasks = [(k, specs) for k, specs, n in _lowered() if n == "sum"]
        assert tasks and all(native.record(k, specs) is not None for k, specs in tasks)
        if tiles is not None:
            assert any(k.fn.__name__ == "add_into" for k, _ in tasks), tasks


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int16])
def test_index_with_several_index_tiles_in_c(python_tasks, index_dtype, dtype):
    """``x[i, j]`` with several integer index tiles broadcast together (a padding mask
    looked up by batch and key positions; adjacent and apart indexed dims; negative,
    empty and int32 indices; the kept dims tiled): CPU's values, in C."""
    x = torch.randint(-50, 50, (8, 6, 5)).to(dtype)
    b = torch.arange(8, dtype=index_dtype).view(8, 1, 1)
    k = torch.tensor([4, -1, 0], dtype=index_dtype).view(1, 1, 3)
    r = torch.tensor([[1], [-6]], dtype=index_dtype)
    cases = [lambda t: t[b, :, k], lambda t: t[:, 0][b.view(8, 1), k.view(1, 3)],
             lambda t: t[:, r, k.view(3)], lambda t: t[r, k.view(3)], lambda t: t[r[:0], k.view(3)[:0]],
             lambda t: t[:, b.view(8)[:3], k.view(3)]]
    for tiles in (None, [3, 5]):
        for fn in cases:
            _parity(fn, x, tiles=tiles)
    _in_c(python_tasks)
    empty = torch.zeros(3, 4, 0).to(dtype)  # a result with no elements: no index is read
    _parity(lambda t, i, j: t[i, j], empty, torch.tensor([1, -3, 9]), torch.tensor([2]))
    none = torch.zeros(0, 3, 0).to(dtype)
    with pytest.raises(IndexError) as cpu:  # but indices into a dim of no elements are refused, result or not
        none[torch.tensor([0]), torch.tensor([1])]
    with pytest.raises(IndexError, match=re.escape(str(cpu.value))):
        _dev(none)[_dev(torch.tensor([0])), _dev(torch.tensor([1]))].cpu()
    for bad in ((r.clone().fill_(-7), k.view(3)), (r, k.view(3) + 5)):  # the first index tile, the second
        with pytest.raises(IndexError) as cpu:
            x[:, bad[0], bad[1]]
        assert "out of bounds for dimension" in str(cpu.value)
        with pytest.raises(IndexError, match=re.escape(str(cpu.value))):
            _dev(x)[:, _dev(bad[0]), _dev(bad[1])].cpu()


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool, torch.int16])
def test_gather_in_c(python_tasks, dtype):
    """``torch.gather`` of tiles of any dtype (along each dim, an index smaller than the
    input in the other dims, tiled alongside it, empty): CPU's values, in C; an index
    outside [0, n) (negative ones included) raises CPU's error."""
    x = torch.randint(-50, 50, (6, 5, 4)).to(dtype)
    i0 = torch.randint(0, 6, (6, 5, 4))
    i1 = torch.randint(0, 5, (3, 2, 4))
    for tiles in (None, [2, 4]):
        _parity(lambda t, i: torch.gather(t, 0, i), x, i0)
        _parity(lambda t, i: torch.gather(t, 1, i), x, i0.clamp(max=4), tiles=tiles)
        _parity(lambda t, i: torch.gather(t, 1, i), x, i1)
        _parity(lambda t, i: torch.gather(t, -1, i), x, i0.clamp(max=3), tiles=tiles)
        _parity(lambda t, i: torch.gather(t, 2, i[:, :0]), x, i1)
    _in_c(python_tasks)
    for bad in (5, -1):
        i = i1.clone()
        i[1, 1, 2] = bad
        with pytest.raises(RuntimeError) as cpu:
            torch.gather(x, 1, i)
        with pytest.raises(RuntimeError, match=re.escape(str(cpu.value))):
            torch.gather(_dev(x), 1, _dev(i)).cpu()


def _same_outcome(fn, *args) -> None:
    """``fn`` on nntile gives CPU's values, or raises CPU's exception (its first line)."""
    try:
        fn(*args)
    except (IndexError, RuntimeError) as e:
        with pytest.raises(type(e), match=re.escape(str(e).splitlines()[0])):
            fn(*(_dev(a) if isinstance(a, torch.Tensor) else a for a in args)).cpu()
        with contextlib.suppress(IndexError, RuntimeError):
            torch_nntile.wait()
        return
    _parity(fn, *args)


@pytest.mark.parametrize("seed", range(4))
def test_gather_sums_and_indexing_match_cpu_on_random_shapes(seed):
    """Random shapes with zero-size and unit dims, dtypes, dims and indices (some out of
    range, some negative): gather, integer sums and indexing by two index tiles give
    CPU's values or CPU's error."""
    rng = random.Random(seed)
    for _ in range(25):
        nd = rng.randint(1, 3)
        shape = [rng.choice([0, 1, 2, 3, 5]) for _ in range(nd)]
        dt = rng.choice([torch.float32, torch.int64, torch.bool, torch.int16, torch.uint8])
        x = (torch.randn(shape) * 50).to(dt)
        d = rng.randrange(nd)
        ishape = [rng.randint(0, s) if k != d else rng.randint(0, 4) for k, s in enumerate(shape)]
        idx = torch.randint(-1 if rng.random() < 0.1 else 0, max(shape[d], 1) + (rng.random() < 0.1), ishape)
        _same_outcome(lambda t, i: torch.gather(t, d, i), x, idx)
        if not dt.is_floating_point:
            lo = rng.randrange(nd)
            dims = list(range(lo, rng.randint(lo, nd - 1) + 1))
            _same_outcome(lambda t: t.sum(dims), x)
        if nd >= 2:
            a = torch.randint(-shape[0], max(shape[0], 1), (rng.randint(0, 3), 1))
            b = torch.randint(-shape[1], max(shape[1], 1), (rng.randint(1, 3),))
            _same_outcome(lambda t, i, j: t[i, j], x, a, b)


@pytest.mark.parametrize("tiles", [None, [3, 4]])
def test_index_out_of_range_raises_the_cpu_error_from_c(python_tasks, tiles):
    x = torch.randint(0, 9, (7, 6))
    for index in ([0, 6], [-7, 1], [2**40]):
        i = torch.tensor(index)
        with pytest.raises(IndexError) as cpu:
            x[:, i]
        with pytest.raises(IndexError, match=re.escape(str(cpu.value))):
            _dev(x, tiles)[:, _dev(i)].cpu()
        with contextlib.suppress(IndexError):  # the other tile's failure, unless it was counted with the first
            torch_nntile.wait()
    _in_c(python_tasks)
    assert torch.equal(_dev(x, tiles)[:, _dev(torch.tensor([5, -6]))].cpu(), x[:, [5, -6]])


def test_gpt2_step_ops_on_integer_and_bool_tiles_run_in_c(python_tasks):
    """The integer and bool work of a GPT-2 training step (position ids, causal mask,
    labels shifted by padding and slicing, a lookup of pad tokens) runs in C."""
    ids = torch.randint(0, 50, (4, 16))
    pad = torch.tensor([-1, 0])
    scores = torch.randn(4, 1, 16, 16)

    def step(ids, pad, scores):
        pos = torch.arange(16, device=ids.device) + 0
        causal = pos.view(1, 1, 1, 16) <= pos.view(1, 1, 16, 1)
        masked = torch.where(causal.expand(4, 1, 16, 16), scores, torch.tensor(torch.finfo(torch.float32).min))
        labels = F.pad(ids, (0, 1), value=-100)[:, 1:]
        found = (ids[:, pad] == 0).any()
        return masked, labels, found

    want = step(ids, pad, scores)
    got = step(_dev(ids), _dev(pad), _dev(scores))
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
    _in_c(python_tasks)


def test_numbers_equal_in_python_but_not_in_kind_get_their_own_c_records(python_tasks):
    """``x == 16777217`` compares int64 values and ``x == 16777217.0`` float32 ones (as
    on CPU): kernels whose numbers differ only by type are different kernels."""
    x = torch.tensor([16777216, 16777217])
    xn = _dev(x)
    for v in (16777217, 16777217.0, 16777217, True, 1, 1.0):
        assert torch.equal((xn == v).cpu(), x == v), v
        assert torch.equal((xn * 0 + 1 == v).cpu(), x * 0 + 1 == v), v
    _in_c(python_tasks)


# -- float32 arithmetic reading bool tiles (dropout masks) ---------------------------------------


@pytest.mark.parametrize("tiles", [None, [2, 3]])
def test_float_arithmetic_with_bool_tiles_in_c(python_tasks, tiles):
    """float32 maps and fused chains read bool tiles as 0 and 1, as PyTorch promotes them:
    ``x * mask`` keeps CPU's bits where x is negative, infinite or NaN (-0.0, NaN), and
    broadcast, transposed, 0-dim and empty bool tiles give CPU's values, in C."""
    x = SPECIAL[:20].reshape(5, 4)
    m = torch.tensor([[1, 0, 1, 0], [0, 0, 1, 1], [1, 1, 1, 0], [0, 1, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)
    cases = [lambda a, b: a * b, lambda a, b: (a * b) * 2.5 + a, lambda a, b: a + b, lambda a, b: b / (a.abs() + 1),
             lambda a, b: a * b[:1], lambda a, b: a[:, :1] * b, lambda a, b: a[:4] * b[:4].t(),
             lambda a, b: torch.where(b, a, 0.0) * b, lambda a, b: a[0, 0] * b[1, 0], lambda a, b: a[:0] * b[:0]]
    for fn in cases:
        _parity(fn, x, m, tiles=tiles)
    _in_c(python_tasks)


def test_bool_tiles_alone_keep_their_own_arithmetic():
    """Where no float32 tile is read, an op's common dtype is not float32: ``True + True``
    added into a float32 tensor is 1.0 (bool addition), as on CPU."""
    a, b = torch.tensor([True, True, False]), torch.tensor([True, False, False])
    want = torch.add(a, b, out=torch.empty(3))
    got = torch.empty(3).to("nntile")
    torch.add(_dev(a), _dev(b), out=got)
    assert torch.equal(got.cpu(), want), got
    assert torch.equal((_dev(a) * 1.5).cpu(), a * 1.5)


@pytest.mark.parametrize("tiles", [None, [3, 5]])
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_forward_backward_in_c(python_tasks, tiles, p):
    """Dropout draws CPU's mask for the same seed; forward, backward and a residual add
    folded into it give CPU's bits (NaN and infinities of the input included), in C."""
    x = torch.randn(8, 6)
    x[0, :4] = torch.tensor([-1.0, math.inf, math.nan, -0.0])
    res = torch.randn(8, 6)
    g = torch.randn(8, 6)

    def run(t, r, grad):
        torch.manual_seed(5)
        t = t.detach().requires_grad_()
        out = F.dropout(t, p) + r
        out.backward(grad)
        return out.detach(), t.grad

    got = run(_dev(x, tiles), _dev(res), _dev(g))
    for gv, wv in zip(got, run(x, res, g)):
        gv = gv.cpu()
        assert torch.equal(gv.isnan(), wv.isnan()), (gv, wv)
        assert torch.equal(gv.nan_to_num().view(torch.int32), wv.nan_to_num().view(torch.int32)), (gv, wv)
    _in_c(python_tasks)


# -- CPU data copied in (ingress) ------------------------------------------------------------


@pytest.mark.parametrize("tiles", [None, [3, 4]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16, torch.complex64,
                                   torch.complex128])
def test_cpu_data_is_copied_in_by_c_tasks(python_tasks, tiles, dtype):
    """CPU tensors moved to nntile are copied into their tiles in C (elements of 1 to 8
    bytes; complex128's 16 by Python): non-contiguous and conjugated sources, 0-dim and
    empty ones, a source changed after the move (the move took its values then)."""
    x = (torch.randn(7, 5) * 100).to(dtype)
    views = [lambda t: t, lambda t: t.t(), lambda t: t[::2, 1:], lambda t: t[0, 0], lambda t: t[:0]]
    if dtype.is_complex:
        views += [lambda t: t.conj(), lambda t: t.t().conj()]
    for view in views:
        base = x.clone()
        src = view(base)
        want = src.clone()
        d = _dev(src, tiles if src.dim() == 2 and src.shape[0] == 7 else None)
        base.zero_()
        got = d.cpu()
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    if dtype.itemsize <= 8:
        _in_c(python_tasks)


def test_host_copies_outlive_python_until_their_tasks_have_run():
    """A host copy's bytes stay until the C tasks reading them have run, however early
    Python drops it: copies large enough to have pages of their own (unmapped when
    freed), moved and dropped at once, many in flight, keep their values."""
    outs = []
    for k in range(24):
        src = torch.full((256, 300), float(k))
        outs.append(_dev(src, [100, 156]) * 2)
        del src
        gc.collect()
    for k, o in enumerate(outs):
        assert torch.equal(o.cpu(), torch.full((256, 300), 2.0 * k)), k
