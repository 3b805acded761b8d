"""Forward and backward parity of every supported op against CPU PyTorch (rel. err <= 1e-5),
untiled and with even and uneven tilings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, check_op

import torch_nntile
from torch_nntile.kernels import PackB

torch.manual_seed(0)
A = torch.randn(12, 10)
B = torch.randn(12, 10)
W = torch.randn(8, 10)
BIAS = torch.randn(8)
ROW = torch.randn(10)

# tilings of the first input's dims: untiled, even, uneven
TILINGS = [None, {(0, 0): 4, (0, 1): 5}, {(0, 0): [5, 4, 3], (0, 1): [3, 7]}]
IDS = ["untiled", "even", "uneven"]

ELEMENTWISE = {
    "add": (lambda a, b: a + b, [A, B]),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=0.5), [A, B]),
    "sub": (lambda a, b: a - b, [A, B]),
    "mul": (lambda a, b: a * b, [A, B]),
    "div": (lambda a, b: a / (b.abs() + 1), [A, B]),
    "add_scalar": (lambda a: a + 2.5, [A]),
    "rsub_scalar": (lambda a: 1 - a, [A]),
    "mul_scalar": (lambda a: a * -3, [A]),
    "div_scalar": (lambda a: a / 4, [A]),
    "pow": (lambda a: a ** 2, [A]),
    "pow3": (lambda a: a.pow(3), [A]),
    "relu": (torch.relu, [A]),
    "bias_row": (lambda a, r: a + r, [A, ROW]),
    "bias_row_mul": (lambda a, r: a * r, [A, ROW]),
    "neg_exp": (lambda a: torch.exp(-a.abs()), [A]),
}


@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise(name, tiles):
    fn, inputs = ELEMENTWISE[name]
    check_op(fn, inputs, tiles)


REDUCTIONS = {
    "sum": lambda a: a.sum(),
    "sum0": lambda a: a.sum(0),
    "sum1_keepdim": lambda a: a.sum(1, keepdim=True),
    "mean": lambda a: a.mean(),
    "mean0": lambda a: a.mean(0),
    "mean1_keepdim": lambda a: a.mean(-1, keepdim=True),
    "sum01": lambda a: a.sum((0, 1)),
}


@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions(name, tiles):
    check_op(REDUCTIONS[name], [A], tiles)


MATMUL = {
    "mm": (lambda a, w: torch.mm(a, w.t()), [A, W]),
    "matmul": (lambda a, w: a @ w.t(), [A, W]),
    "matmul_tt": (lambda a, w: (a.t() @ a) @ w.t() + (w @ a.t()).t().sum(), [A, W]),
    "linear": (lambda a, w: F.linear(a, w), [A, W]),
    "linear_bias": (lambda a, w, b: F.linear(a, w, b), [A, W, BIAS]),
    "addmm": (lambda a, w, b: torch.addmm(b, a, w.t(), beta=0.5, alpha=2.0), [A, W, BIAS]),
}
MM_TILINGS = [None, {(0, 0): 4, (0, 1): 5, (1, 0): 3}, {(0, 0): [7, 5], (0, 1): [2, 8], (1, 0): [5, 3]}]


@pytest.mark.parametrize("tiles", MM_TILINGS, ids=IDS)
@pytest.mark.parametrize("name", list(MATMUL))
def test_matmul(name, tiles):
    fn, inputs = MATMUL[name]
    check_op(fn, inputs, tiles)


@pytest.fixture(params=[True, False], ids=["native", "python"])
def gemm_path(request):
    """Matrix-product tiles run by BLAS from C on the worker, or as torch calls."""
    rt = torch_nntile.session.SESSION_STATE.runtime()
    if request.param and not rt.native_gemm:
        pytest.skip("torch's BLAS exports no sgemm_ here: products run as torch calls")
    saved, rt.native_gemm = rt.native_gemm, request.param
    yield request.param
    torch_nntile.wait()
    rt.native_gemm = saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["matmul_tt", "addmm"])
def test_matmul_both_kernel_paths(name, dtype, gemm_path):
    """Both ways a product tile runs agree with CPU PyTorch, in both precisions,
    with transposed operands, alpha/beta, uneven tiles and split reductions."""
    fn, inputs = MATMUL[name]
    check_op(fn, [x.to(dtype) for x in inputs], MM_TILINGS[2], rtol=1e-5 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("rows, ktiles, packs, ta, tb", [
    # packs: (with MKL's packing, with the shim's own: Runtime.own_sgemm)
    ([16, 16, 16, 16], [256], (1, 1), False, False),  # one B tile, shared by 4 row tiles
    ([16, 16, 16, 16], [128, 128], (2, 2), False, False),  # one per K tile
    ([20, 20, 24], [256], (1, 1), False, False),  # MKL: only the two rows of height 20 share a pack
    ([16, 16, 16, 16], [128, 128], (2, 2), True, False),  # A stored transposed
    ([16, 16, 16, 16], [256], (0, 1), False, True),  # B transposed: MKL's pack does not pay for 64 rows
    ([1024, 1024], [256], (1, 1), False, True),  # for 2048 rows it does
    ([40], [256], (0, 0), False, False),  # a single row tile: nothing to share
])
def test_shared_operand_packed_once(rows, ktiles, packs, ta, tb, gemm_path):
    """A large B tile that several row tiles multiply is packed once per compile (native
    path; with MKL's packing, a transposed one only for 2048 rows or more); results
    match CPU PyTorch forward and backward either way."""
    x, w = torch.randn(sum(rows), 256), torch.randn(512, 256)
    if ta:
        x = x.t().contiguous()  # stored K x M, used transposed
    if not tb:
        w = w.t().contiguous()  # stored K x N

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.t() if ta else a) @ (b.t() if tb else b)

    tiles = {(0, int(ta)): rows, (0, 1 - int(ta)): ktiles}
    check_op(fn, [x, w], tiles)
    xn, wn = x.to("nntile"), w.to("nntile")
    for (_, d), t in tiles.items():
        name = f"packed_{d}_{len(rows)}_{len(ktiles)}_{ta}_{tb}"
        torch_nntile.set_axis_group_name(xn, {d: name})
        torch_nntile.set_axis_group_tiling(name, t)
    torch_nntile.execute()
    torch_nntile.wait()
    torch_nntile.reset_info()
    y = fn(xn, wn)
    assert_close(y.cpu(), fn(x, w))
    torch_nntile.wait()
    products = len(rows) * len(ktiles)
    want = packs[int(torch_nntile.session.SESSION_STATE.runtime().own_sgemm)] if gemm_path else 0
    assert torch_nntile.metrics()["kernels"]["mm"]["tasks"] == products + want


@pytest.mark.parametrize("rows, k, ktiles, n, ta, tb", [
    ([5, 13], 2100, None, 33, False, False),  # rows not a multiple of 12, k in three blocks
    ([12, 12, 1], 8500, [4000, 4500], 17, False, True),  # 17 columns: a part-filled panel; K tiles
    ([40, 24], 700, None, 100, True, False),  # A stored transposed
    ([40, 24], 700, None, 100, True, True),
    ([7, 9], 128, None, 513, False, True),  # 513 columns: the last panel holds one
    ([64, 64], 1024, None, 256, False, True),  # whole 16 x 16 transposes only
])
def test_packed_products_edges(rows, k, ktiles, n, ta, tb):
    """Products on a B tile packed once (with the shim's own kernels, every edge of
    their 12 x 32 blocks and 1024-deep k blocks; else MKL's): CPU's values; addmm's
    alpha (applied when packing), beta 0 (its bias never read: NaN ignored) and beta 1."""
    torch.manual_seed(3)
    m = sum(rows)
    a = torch.randn(k, m) if ta else torch.randn(m, k)
    b = torch.randn(n, k) if tb else torch.randn(k, n)
    bias = torch.randn(m, n)
    nan_bias = torch.full((m, n), float("nan"))

    def fns(a, b, bias, nan_bias):
        x, y = (a.t() if ta else a), (b.t() if tb else b)
        return x @ y, torch.addmm(bias, x, y, alpha=2.0), torch.addmm(nan_bias, x, y, beta=0)

    an = a.to("nntile")
    name = f"edges_{len(rows)}_{k}_{n}_{ta}_{tb}"
    torch_nntile.set_axis_group_name(an, {int(ta): name})
    torch_nntile.set_axis_group_tiling(name, rows)
    if ktiles is not None:
        torch_nntile.set_axis_group_name(an, {1 - int(ta): name + "_k"})
        torch_nntile.set_axis_group_tiling(name + "_k", ktiles)
    torch_nntile.execute()
    torch_nntile.wait()
    torch_nntile.reset_info()
    got = fns(an, b.to("nntile"), bias.to("nntile"), nan_bias.to("nntile"))
    torch_nntile.compile_graph()
    packs = sum(type(t[0]) is PackB for t in torch_nntile.session.SESSION_STATE.compiled.tasks)
    for g, w in zip(got, fns(a, b, bias, nan_bias)):
        assert_close(g.cpu(), w)
    if torch_nntile.session.SESSION_STATE.runtime().own_sgemm:
        assert packs == 3 * len(ktiles or [k])  # one a K tile and op: B is packed


@pytest.mark.parametrize("m, k, n, ta, ktiles", [
    (100, 70, 45, False, None),  # rows and columns not multiples of the 12 x 32 blocks
    (150, 1100, 40, True, None),  # A stored transposed; k in two blocks of 1024 and 76
    (300, 256, 1024, True, [64, 64, 128]),  # a weight gradient's shape: K tiles accumulate (beta 1)
    (70, 1024, 4100, False, None),  # B too large for a thread's buffer: MKL's sgemm
])
def test_unpacked_products_own_kernels(m, k, n, ta, ktiles):
    """Float32 products whose B (read as stored) feeds one row tile run the shim's own
    kernels with B packed in the call: CPU's values, and the same bits every run."""
    torch.manual_seed(4)
    a = torch.randn(k, m) if ta else torch.randn(m, k)
    b = torch.randn(k, n)

    def fn(a, b):
        return (a.t() if ta else a) @ b

    an = a.to("nntile")
    if ktiles is not None:
        name = f"own_k_{m}_{k}_{n}"
        torch_nntile.set_axis_group_name(an, {0 if ta else 1: name})
        torch_nntile.set_axis_group_tiling(name, ktiles)
    bn = b.to("nntile")
    first = fn(an, bn).cpu()
    assert_close(first, fn(a, b))
    for _ in range(2):
        assert torch.equal(fn(an, bn).cpu(), first)


VIEWS = {
    "view": lambda a: a.view(4, 30) * 2,
    "reshape": lambda a: a.reshape(120) + 1,
    "t": lambda a: a.t() * 1,
    "transpose": lambda a: a.transpose(0, 1) + 0,
    "permute3": lambda a: a.view(3, 4, 10).permute(2, 0, 1) * 3,
    "unsqueeze": lambda a: a.unsqueeze(1) * 2,
    "expand": lambda a: a.sum(0, keepdim=True).expand(6, 10) * 2,
    "clone": lambda a: a.clone() * 2,
    "slice": lambda a: a[2:7, 1:4] * 2,
}


@pytest.mark.parametrize("tiles", [None, {(0, 0): 4}], ids=["untiled", "tiled"])
@pytest.mark.parametrize("name", list(VIEWS))
def test_views(name, tiles):
    if name in ("view", "reshape", "permute3") and tiles:
        pytest.skip("merging a tiled dim in a reshape is rejected (see test_errors)")
    check_op(VIEWS[name], [A], tiles)


@pytest.mark.parametrize("tiles", [None, {(0, 0): 4}, {(0, 0): [5, 7]}], ids=IDS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy(tiles, reduction):
    target = torch.randint(0, 10, (12,))
    check_op(lambda a, t: F.cross_entropy(a, t, reduction=reduction), [A, target], tiles)


@pytest.mark.parametrize("tiles", [None, {(0, 0): 4}], ids=["untiled", "tiled"])
def test_cross_entropy_ignore_index_and_none(tiles):
    target = torch.randint(0, 10, (12,))
    target[3] = -100
    check_op(lambda a, t: F.cross_entropy(a, t), [A, target], tiles)
    check_op(lambda a, t: F.cross_entropy(a, t, reduction="none"), [A, target], tiles)


@pytest.mark.parametrize("tiles", [None, {(0, 0): 4}], ids=["untiled", "tiled"])
def test_log_softmax(tiles):
    check_op(lambda a: F.log_softmax(a, dim=-1), [A], tiles)


def _inplace_chain(a, b):
    c = a * 1
    c.add_(b)
    c.mul_(2)
    c.sub_(b, alpha=0.5)
    c.div_(3)
    return c


@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
def test_inplace(tiles):
    check_op(_inplace_chain, [A, B], tiles)


@pytest.mark.parametrize("tiles", [None, {(0, 0): 4}], ids=["untiled", "tiled"])
def test_fill_zero_copy(tiles):
    def fn(a, b):
        c = a * 1
        c.copy_(b)
        d = a * 1
        d.fill_(3.0)
        e = a * 1
        e.zero_()
        return c + d + e
    check_op(fn, [A, B], tiles)


def test_inplace_through_view():
    def fn(a):
        c = a * 1
        c.t().mul_(2)
        c[1:3].add_(1)
        return c
    check_op(fn, [A])


def test_dtype_conversion():
    def fn(a):
        return (a.double() * 2).float()
    check_op(fn, [A])
    x = torch.arange(6).to("nntile")
    assert torch.equal((x * 2).cpu(), torch.arange(6) * 2)
    assert (x / 2).dtype == torch.float32


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (5, 5)])
def test_linear_reads_transposed_weight_without_copy(shape):
    """F.linear(x, W) multiplies by W.t(): the transpose is folded into the mm kernel
    for square and non-square weights alike (no permute copy is recorded)."""
    out_f, in_f = shape
    x = torch.randn(3, in_f).to("nntile")
    w = torch.randn(out_f, in_f).to("nntile")
    torch_nntile.execute()
    y = torch.nn.functional.linear(x, w)
    assert torch_nntile.pending_op_names() == ["mm"]
    assert_close(y.cpu(), torch.nn.functional.linear(x.cpu(), w.cpu()))


@pytest.mark.parametrize("tiles", [None, [1, 2]])
def test_weight_gradient_reads_transposed_reshape_without_copy(tiles):
    """A weight gradient ``x.view(-1, n).t() @ g`` of a 3-D input (HF's Conv1D, any
    linear on a batch of sequences) multiplies by the transposed reshape in the mm
    kernel: no permute copy is recorded, under the batch tiling (uneven) or none; the
    values and the whole backward match CPU's."""
    x, w, b = torch.randn(3, 4, 6), torch.randn(6, 5), torch.randn(5)
    xn = x.to("nntile")
    if tiles is not None:
        torch_nntile.set_axis_group_name(xn, {0: "wgrad_batch"})
        torch_nntile.set_axis_group_tiling("wgrad_batch", tiles)
    g = torch.randn(12, 5)
    gn = g.to("nntile")
    torch_nntile.execute()
    dw = torch.mm(xn.view(-1, 6).t(), gn)
    assert "permute" not in torch_nntile.pending_op_names()
    assert_close(dw.cpu(), x.view(-1, 6).t() @ g)

    def conv1d(x, w, b):  # GPT-2's Conv1D forward
        return torch.addmm(b, x.view(-1, x.size(-1)), w).view(*x.shape[:-1], w.shape[1])
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    conv1d(*leaves).square().sum().backward()
    on = [t.to("nntile").detach().requires_grad_() for t in (x, w, b)]
    conv1d(*on).square().sum().backward()
    for cpu_leaf, nn_leaf in zip(leaves, on):
        assert_close(nn_leaf.grad.cpu(), cpu_leaf.grad)


def _tasks_run(fn) -> int:
    """Tasks submitted for the ops ``fn`` records (inputs already on the device)."""
    torch_nntile.wait()
    n0 = torch_nntile.info()["tasks_submitted"]
    fn()
    torch_nntile.execute()
    torch_nntile.wait()
    return torch_nntile.info()["tasks_submitted"] - n0


def test_split_reduction_only_without_independent_work():
    """A gradient-like product g^T x over 4 batch tiles into one output tile is split
    into 2 parallel chains (4 mm tasks + 1 sum) when nothing else can run beside it,
    and accumulated in one chain (no sum) when an independent product follows."""
    g, x = torch.randn(64, 8), torch.randn(64, 6)
    a, b = torch.randn(8, 64), torch.randn(64, 6)
    gn, xn, an, bn = (t.to("nntile") for t in (g, x, a, b))
    torch_nntile.set_axis_group_name(gn, {0: "split_k"})
    torch_nntile.set_axis_group_name(xn, {0: "split_k"})
    torch_nntile.set_axis_group_tiling("split_k", 16)
    torch_nntile.execute()  # the inputs' tiles, in the tiling the products read
    out = {}
    tail = _tasks_run(lambda: out.update(dw=gn.t() @ xn))
    assert tail == 5
    assert_close(out["dw"].cpu(), g.t() @ x)
    both = _tasks_run(lambda: out.update(dw=gn.t() @ xn, other=an @ bn))
    assert both == 4 + 1
    assert_close(out["dw"].cpu(), g.t() @ x)
    assert_close(out["other"].cpu(), a @ b)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.int16])
def test_arange_lengths_and_errors_match_cpu(dtype):
    # small integer bounds are counted without PyTorch's meta rule: every sign and step
    # gives CPU's values, and CPU's error where the bounds and step disagree
    for start, end, step in [(0, 64, 1), (3, 10, 3), (10, 3, -2), (-5, 5, 4), (2, 2, 1), (2, 2, -3),
                             (-7, -1, 2), (0, 1 << 24, 1 << 22)]:
        assert torch.equal(torch.arange(start, end, step, dtype=dtype, device="nntile").cpu(),
                           torch.arange(start, end, step, dtype=dtype))
    for start, end, step in [(0, 5, 0), (5, 0, 1), (0, 5, -1)]:
        with pytest.raises(RuntimeError) as cpu:
            torch.arange(start, end, step, dtype=dtype)
        with pytest.raises(RuntimeError) as ours:
            torch.arange(start, end, step, dtype=dtype, device="nntile")
        assert str(ours.value) == str(cpu.value)


@pytest.mark.parametrize("empty_dtype", [torch.float32, torch.float64])
def test_cat_of_one_kept_tensor_is_a_new_value(empty_dtype):
    # a cache's first update: cat([empty 1-D, x]) gives x's values (promoted as on CPU)
    # in a tensor of its own: writes to either side leave the other alone
    x = torch.randn(2, 3, 4)
    for parts in ([torch.tensor([], dtype=empty_dtype), x.transpose(1, 2)], [x]):
        want = torch.cat(parts, dim=-2)
        dev = [p.to("nntile") for p in parts]
        got = torch.cat(dev, dim=-2)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
        got.add_(1)
        assert torch.equal(dev[-1].cpu(), parts[-1]) and torch.equal(got.cpu(), want + 1)
        dev[-1].mul_(0)
        assert torch.equal(got.cpu(), want + 1)
    w = torch.randn(3, 4, requires_grad=True)
    wn = w.detach().to("nntile").requires_grad_()
    torch.cat([torch.tensor([]), w * 2]).sum().backward()
    torch.cat([torch.tensor([]).to("nntile"), wn * 2]).sum().backward()
    assert torch.equal(wn.grad.cpu(), w.grad)
