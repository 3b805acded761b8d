"""The ops stock transformer models need, natively (no CPU fallback): the unary and
binary math family, activations, tril/triu, dropout, embeddings, gather/scatter,
advanced indexing, nonzero, padding, cumulative ops, flip/roll. Each against CPU
PyTorch, forward and backward, untiled and with uneven tiles."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, check_op

import torch_nntile

torch.manual_seed(0)
X = torch.randn(7, 6)
POS = X.abs() + 0.5  # in the domain of log-like ops
UNIT = X.tanh() * 0.9  # in (-1, 1)
INTS = torch.randint(-6, 7, (7, 6))
UNEVEN = {(0, 0): [4, 3], (0, 1): [1, 5]}
TILINGS = [None, UNEVEN]
IDS = ["untiled", "uneven"]


def _dev(t: torch.Tensor) -> torch.Tensor:
    return t.to("nntile")


def _tile(t: torch.Tensor, dims: dict[int, int | list[int]]) -> torch.Tensor:
    for d, sizes in dims.items():
        name = f"tt{id(t)}_{d}"
        torch_nntile.set_axis_group_name(t, {d: name})
        torch_nntile.set_axis_group_tiling(name, sizes)
    return t


def _same(fn, *args, tiles: dict[int, int | list[int]] | None = None) -> None:
    """``fn`` on nntile equals ``fn`` on CPU (no gradients), values and dtype."""
    want = fn(*args)
    dev = [_dev(a) if isinstance(a, torch.Tensor) else a for a in args]
    if tiles:
        _tile(dev[0], tiles)
    got = fn(*dev)
    assert got.device.type == "nntile"
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if want.dtype.is_floating_point:
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True), (got, want)
    else:
        assert torch.equal(got, want), (got, want)


# -- unary math ---------------------------------------------------------------------

UNARY = {
    "sin": (torch.sin, X), "cos": (torch.cos, X), "tan": (torch.tan, UNIT), "asin": (torch.asin, UNIT),
    "acos": (torch.acos, UNIT), "atan": (torch.atan, X), "sinh": (torch.sinh, X), "cosh": (torch.cosh, X),
    "asinh": (torch.asinh, X), "acosh": (torch.acosh, POS + 1), "atanh": (torch.atanh, UNIT),
    "erf": (torch.erf, X), "erfc": (torch.erfc, X), "erfinv": (torch.erfinv, UNIT), "expm1": (torch.expm1, X),
    "log1p": (torch.log1p, POS), "log2": (torch.log2, POS), "log10": (torch.log10, POS), "exp2": (torch.exp2, X),
    "floor": (torch.floor, X * 3), "ceil": (torch.ceil, X * 3), "round": (torch.round, X * 3),
    "round_decimals": (lambda t: torch.round(t, decimals=2), X), "trunc": (torch.trunc, X * 3),
    "frac": (torch.frac, X * 3), "square": (torch.square, X), "sinc": (torch.sinc, X),
    "nan_to_num": (lambda t: torch.nan_to_num(t.log(), neginf=-5.0), X),
}


@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name, tiles):
    fn, x = UNARY[name]
    check_op(fn, [x], tiles)


@pytest.mark.parametrize("fn", [torch.sin, torch.exp2, torch.erfinv, torch.floor, torch.round, torch.trunc,
                                torch.signbit, torch.isnan, torch.isinf, torch.isfinite, torch.square, torch.log2,
                                torch.nan_to_num, torch.bitwise_not, torch.sinc],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.float64])
def test_unary_dtypes(fn, dtype):
    """The result dtype of every dtype is CPU's (int -> float for sin, kept for floor,
    bool for signbit); a dtype CPU refuses raises CPU's error."""
    x = INTS.to(dtype) if dtype != torch.float64 else X.double()
    try:
        want = fn(x)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            fn(_dev(x))
        return
    _same(fn, x, tiles={0: [3, 4]})
    assert want.dtype == fn(_dev(x)).dtype


def test_frac_of_integers_raises_as_on_cpu():
    with pytest.raises(NotImplementedError, match="frac"):
        torch.frac(_dev(INTS))


SPECIAL = torch.tensor([[0.0, -0.0, 1.5, -2.5], [math.inf, -math.inf, math.nan, 3.0]])


@pytest.mark.parametrize("fn", [torch.signbit, torch.isnan, torch.isinf, torch.isposinf, torch.isneginf,
                                torch.isfinite, torch.nan_to_num, lambda t: torch.nan_to_num(t, 1.0, 2.0, -3.0),
                                torch.floor, torch.frac, torch.round, torch.sign],
                         ids=["signbit", "isnan", "isinf", "isposinf", "isneginf", "isfinite", "nan_to_num",
                              "nan_to_num_values", "floor", "frac", "round", "sign"])
def test_special_values(fn):
    _same(fn, SPECIAL, tiles={1: [1, 3]})


def test_unary_in_place_and_out():
    x = _dev(X)
    x.sin_()
    assert_close(x.cpu(), X.sin())
    out = torch.empty(0, device="nntile")
    torch.erf(_dev(X), out=out)
    assert_close(out.cpu(), torch.erf(X))
    i = _dev(INTS)
    i.floor_()
    assert_close(i.cpu(), INTS)
    with pytest.raises(RuntimeError, match="can't be cast"):
        _dev(INTS).sin_()
    with pytest.raises(RuntimeError, match="can't be cast"):
        _dev(INTS > 0).exp2_()


def test_unary_zero_dim_and_empty():
    for x in (torch.tensor(0.3), torch.randn(0, 3)):
        for fn in (torch.sin, torch.erfinv, torch.isnan, torch.trunc):
            check_op(fn, [x], grad=x.dim() == 0 and fn in (torch.sin, torch.erfinv))


# -- binary math --------------------------------------------------------------------

Y = torch.randn(7, 6).abs() + 0.5
ROW = torch.randn(6)

BINARY = {
    "atan2": (torch.atan2, [X, Y]), "atan2_row": (torch.atan2, [X, ROW]),
    "fmod": (torch.fmod, [X * 4, Y]), "fmod_scalar": (lambda a: torch.fmod(a, 1.5), [X * 4]),
    "remainder": (torch.remainder, [X * 4, Y]), "remainder_scalar": (lambda a: a % -1.5, [X * 4]),
    "rremainder": (lambda a: 2.5 % a.detach(), [Y]),  # no derivative on CPU either
    "hypot": (torch.hypot, [X, Y]), "copysign": (torch.copysign, [Y, X]),
    "copysign_scalar": (lambda a: torch.copysign(a, -1.0), [X]),
    "xlogy": (torch.xlogy, [X, Y]), "xlogy_scalar_self": (lambda b: torch.xlogy(2.0, b), [Y]),
    "xlogy_scalar_other": (lambda a: torch.xlogy(a, 3.0), [X]),
    "fmax": (torch.fmax, [X, Y - 1]), "fmin": (torch.fmin, [X, Y - 1]),
    "float_power": (lambda a: torch.float_power(a, 2), [X]),
    "floor_divide": (lambda a, b: torch.floor_divide(a.detach(), b.detach()), [X * 4, Y]),  # no derivative
}


@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name, tiles):
    fn, inputs = BINARY[name]
    check_op(fn, inputs, tiles, rtol=1e-5 if name != "float_power" else 1e-7)


@pytest.mark.parametrize("fn", [torch.atan2, torch.fmod, torch.remainder, torch.hypot, torch.copysign, torch.xlogy,
                                torch.floor_divide, torch.fmax],
                         ids=lambda f: f.__name__)
def test_binary_dtypes(fn):
    a, b = INTS, INTS.abs() + 1
    for x, y in [(a, b), (a, b.float()), (a.to(torch.int32), b), (a, 2), (a.float(), b[0]), (a, torch.tensor(2.0))]:
        try:
            fn(x, y)
        except Exception as e:  # noqa: BLE001
            with pytest.raises(type(e)):
                fn(_dev(x), _dev(y) if isinstance(y, torch.Tensor) and y.dim() else y)
            continue
        _same(lambda u, v=y: fn(u, _dev(v) if isinstance(v, torch.Tensor) and v.dim() and u.device.type == "nntile"
                                else v), x)


def test_integer_remainder_by_zero_raises():
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.remainder(_dev(INTS), 0)


# -- bitwise ops on bool and integer tensors -----------------------------------------------

BOOLS = torch.rand(7, 6) > 0.5
BOOLS2 = torch.rand(7, 6) > 0.5


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.int32, torch.uint8])
def test_bitwise(dtype):
    a = BOOLS.to(dtype) if dtype == torch.bool else INTS.abs().to(dtype)
    b = BOOLS2.to(dtype) if dtype == torch.bool else (INTS * 3).abs().to(dtype)
    for fn in (lambda u, v: u & v, lambda u, v: u | v, lambda u, v: u ^ v, lambda u, v: ~u,
               lambda u, v: torch.bitwise_and(u, v[0]), lambda u, v: u & True if dtype == torch.bool else u & 5,
               lambda u, v: torch.bitwise_xor(u, 1), lambda u, v: torch.bitwise_or(u, v)):
        want = fn(a, b)
        an, bn = _dev(a), _dev(b)
        _tile(an, {0: [2, 5]})
        got = fn(an, bn).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_bitwise_in_place_and_floats():
    m = _dev(BOOLS)
    m &= _dev(BOOLS2)
    m |= _dev(BOOLS)
    m ^= _dev(BOOLS2)
    want = BOOLS.clone()
    want &= BOOLS2
    want |= BOOLS
    want ^= BOOLS2
    assert torch.equal(m.cpu(), want)
    with pytest.raises(RuntimeError, match="bitwise_and"):
        _dev(X) & _dev(X)
    with pytest.raises(RuntimeError, match="bitwise_not"):
        torch.bitwise_not(_dev(X))


# -- activations ---------------------------------------------------------------------------

ACTIVATIONS = {
    "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu,
    "softplus": F.softplus, "softplus_beta": lambda t: F.softplus(t * 10, beta=2, threshold=5),
    "elu": F.elu, "elu_alpha": lambda t: F.elu(t, alpha=0.5), "celu": lambda t: F.celu(t, 0.7), "selu": F.selu,
    "leaky_relu": F.leaky_relu, "leaky_relu_slope": lambda t: F.leaky_relu(t, 0.2),
    "hardtanh": F.hardtanh, "hardtanh_bounds": lambda t: F.hardtanh(t, -0.5, 0.7), "relu6": F.relu6,
    "mish": F.mish, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
}


@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation(name, tiles):
    check_op(ACTIVATIONS[name], [X], tiles)


@pytest.mark.parametrize("fn", [lambda t: F.elu(t * 1, inplace=True), lambda t: F.leaky_relu(t * 1, 0.1, inplace=True),
                                lambda t: F.hardtanh(t * 1, inplace=True), lambda t: F.silu(t * 1, inplace=True),
                                lambda t: F.mish(t * 1, inplace=True), lambda t: F.gelu(t).add_(1)],
                         ids=["elu_", "leaky_relu_", "hardtanh_", "silu_", "mish_", "gelu"])
def test_activation_in_place(fn):
    check_op(fn, [X], UNEVEN)


def test_activation_backward_ops_directly():
    g, x = torch.randn(7, 6), X
    aten = torch.ops.aten
    for op, args in [(aten.gelu_backward, (g, x)), (aten.softplus_backward, (g, x, 1.0, 20.0)),
                     (aten.elu_backward, (g, 1.0, 1.0, 1.0, False, x)), (aten.elu_backward, (g, 1.0, 1.0, 1.0, True, x)),
                     (aten.leaky_relu_backward, (g, x, 0.01, False)), (aten.hardtanh_backward, (g, x, -1.0, 1.0))]:
        _same(lambda *a, op=op: op(*a), *args)
    _same(lambda a, b: aten.gelu_backward(a, b, approximate="tanh"), g, x)


def test_activation_of_integers_raises():
    with pytest.raises(NotImplementedError):
        F.gelu(_dev(INTS))


# -- tril / triu -----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [-3, -1, 0, 1, 4, 9])
@pytest.mark.parametrize("upper", [False, True], ids=["tril", "triu"])
@pytest.mark.parametrize("tiles", [None, UNEVEN, {(0, 0): 2, (0, 1): 2}], ids=["untiled", "uneven", "even"])
def test_tril_triu(k, upper, tiles):
    fn = torch.triu if upper else torch.tril
    check_op(lambda t: fn(t, k), [X], tiles)


def test_tril_batched_and_causal_mask():
    x = torch.randn(3, 2, 5, 7)
    check_op(lambda t: torch.tril(t, -1) + torch.triu(t, 2), [x], {(0, 0): [1, 2], (0, 2): [2, 3], (0, 3): [4, 3]})
    # the causal mask of HF models: full(min) -> triu(1) in place, on a tiled sequence dim
    s = 9
    want = torch.full((s, s), torch.finfo(torch.float32).min).triu_(1)
    got = torch.full((s, s), torch.finfo(torch.float32).min, device="nntile")
    _tile(got, {0: [4, 5], 1: [2, 7]})
    got.triu_(1)
    assert_close(got.cpu(), want)
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    gotm = torch.ones(s, s, dtype=torch.bool, device="nntile")
    _tile(gotm, {0: 4})
    assert torch.equal(torch.tril(gotm).cpu(), mask)
    out = torch.empty(0, device="nntile")
    torch.tril(_dev(X), 1, out=out)
    assert_close(out.cpu(), torch.tril(X, 1))


def test_tril_needs_two_dims_and_is_not_retiled():
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        torch.tril(_dev(torch.randn(4)))
    torch_nntile.reset_info()
    check_op(lambda t: torch.tril(t, 1), [X], UNEVEN)
    torch_nntile.wait()
    assert "tril" not in torch_nntile.metrics()["retiles"]
    assert torch.equal(torch.tril(_dev(torch.randn(0, 3))).cpu(), torch.randn(0, 3))


# -- dropout and Bernoulli draws -----------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_native_dropout_matches_cpu_bit_for_bit(p):
    x = torch.randn(33, 17)
    torch.manual_seed(123)
    want, want_mask = torch.ops.aten.native_dropout(x, p, True)
    g = torch.randn(33, 17)
    want_g = torch.ops.aten.native_dropout_backward(g, want_mask, 1 / (1 - p))
    xn = _tile(_dev(x), {0: [10, 23], 1: [5, 12]})
    torch.manual_seed(123)
    got, got_mask = torch.ops.aten.native_dropout(xn, p, True)
    after = torch.rand(())  # the nntile draw moved the generator as the CPU's did
    assert torch.equal(got.cpu(), want) and torch.equal(got_mask.cpu(), want_mask)
    assert got_mask.dtype == torch.bool
    torch.manual_seed(123)
    torch.ops.aten.native_dropout(x, p, True)
    assert torch.equal(after, torch.rand(()))
    got_g = torch.ops.aten.native_dropout_backward(_dev(g), got_mask, 1 / (1 - p))
    assert torch.equal(got_g.cpu(), want_g)


def test_dropout_module_trains_like_cpu():
    x = torch.randn(16, 12)
    torch.manual_seed(7)
    xc = x.clone().requires_grad_()
    want = F.dropout(xc, 0.3)
    want.sum().backward()
    torch.manual_seed(7)
    xn = _dev(x).requires_grad_()
    got = F.dropout(xn, 0.3)
    got.sum().backward()
    assert_close(got.cpu(), want.detach())
    assert_close(xn.grad.cpu(), xc.grad)
    assert torch_nntile.metrics()["ops"].get("aten::native_dropout", 0) >= 1


def test_dropout_edges():
    x = torch.randn(5, 4)
    for p, train in [(0.0, True), (1.0, True), (0.5, False)]:
        torch.manual_seed(1)
        want = F.dropout(x, p, train)
        torch.manual_seed(1)
        assert_close(F.dropout(_dev(x), p, train).cpu(), want)
    out, mask = torch.ops.aten.native_dropout(_dev(x), 0.5, False)
    assert_close(out.cpu(), x)
    assert mask.dtype == torch.bool and bool(mask.cpu().all())
    out, mask = torch.ops.aten.native_dropout(_dev(torch.randn(0, 3)), 0.5, True)
    assert out.shape == (0, 3) and mask.shape == (0, 3)
    assert F.dropout(_dev(torch.randn(0, 3)), 0.5).cpu().shape == (0, 3)


def test_bernoulli_draws_as_on_cpu():
    p = torch.rand(6, 5)
    for fn in (torch.bernoulli, lambda t: torch.bernoulli(t, 0.3), lambda t: torch.empty_like(t).bernoulli_(t),
               lambda t: torch.empty_like(t).bernoulli_(0.25)):
        torch.manual_seed(5)
        want = fn(p)
        torch.manual_seed(5)
        got = fn(_dev(p))
        assert got.device.type == "nntile" and torch.equal(got.cpu(), want)


# -- embedding ------------------------------------------------------------------------------------

IDX = torch.tensor([[1, 4, 4, 0], [9, 1, 2, 4], [0, 0, 3, 4]])


@pytest.mark.parametrize("kw", [{}, {"padding_idx": 4}, {"scale_grad_by_freq": True},
                                {"padding_idx": 0, "scale_grad_by_freq": True}],
                         ids=["plain", "padding_idx", "scale_grad_by_freq", "both"])
@pytest.mark.parametrize("tiles", [None, {(0, 1): [3, 5]}, {(0, 0): [6, 4], (0, 1): 4}], ids=["untiled", "dim", "both"])
def test_embedding(kw, tiles):
    w = torch.randn(10, 8)
    check_op(lambda weight, i: F.embedding(i, weight, **kw) * 2, [w, IDX], tiles)


def test_embedding_dense_backward_tiled_and_direct():
    g = torch.randn(3, 4, 8)
    for args in [(10, -1, False), (10, 4, True), (12, 0, False)]:
        _same(lambda gg, i, a=args: torch.ops.aten.embedding_dense_backward(gg, i, *a), g, IDX, tiles={2: [3, 5]})
        # rows tiled too (batch, sequence): each row tile adds its part
        _same(lambda gg, i, a=args: torch.ops.aten.embedding_dense_backward(gg, i, *a), g, IDX,
              tiles={0: [1, 2], 1: [3, 1], 2: [3, 5]})
    _same(lambda gg, i: torch.ops.aten.embedding_dense_backward(gg, i, 10, -1, False), torch.randn(8),
          torch.tensor(3))
    torch_nntile.reset_info()
    check_op(lambda weight, i: F.embedding(i, weight), [torch.randn(10, 8), IDX], {(0, 1): [3, 5]})
    torch_nntile.wait()
    retiled = torch_nntile.metrics()["retiles"]
    assert "index_select" not in retiled and "embedding_dense_backward" not in retiled, retiled


# -- gather / scatter ---------------------------------------------------------------------------------

GIDX = torch.randint(0, 6, (7, 6))
GIDX0 = torch.randint(0, 7, (7, 6))


@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
def test_gather(tiles):
    check_op(lambda x, i: torch.gather(x, 1, i), [X, GIDX], tiles)
    check_op(lambda x, i: torch.gather(x, 0, i), [X, GIDX0], tiles)
    check_op(lambda x, i: torch.gather(x, 1, i[:5, :3]), [X, GIDX], tiles)  # a smaller index: one task
    check_op(lambda x, i: torch.take_along_dim(x, i, 1), [X, GIDX], tiles)


@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
def test_scatter(tiles):
    src = torch.randn(7, 6)
    perm = torch.argsort(torch.rand(7, 6), dim=1)  # no duplicates: the gradient of src is defined
    check_op(lambda x, s, i: torch.scatter(x, 1, i, s), [X, src, perm], tiles)
    check_op(lambda x, i: torch.scatter(x, 1, i, -2.5), [X, GIDX], tiles)
    check_op(lambda x, s, i: torch.scatter_add(x, 1, i, s), [X, src, GIDX], tiles)
    check_op(lambda x, s, i: torch.scatter_add(x, 0, i, s), [X, src, GIDX0], tiles)
    check_op(lambda x, s, i: torch.scatter_add(x, 0, i[:4], s[:4]), [X, src, GIDX0], tiles)  # fewer rows: one task
    for reduce in ("add", "multiply"):
        _same(lambda x, s, i, r=reduce: torch.scatter(x, 1, i, s, reduce=r), X, src, GIDX, tiles={0: [2, 5]})
        _same(lambda x, i, r=reduce: torch.scatter(x, 1, i, 1.5, reduce=r), X, GIDX, tiles={0: [2, 5]})


def test_gather_scatter_in_place_out_and_errors():
    x = _dev(X)
    x.scatter_(1, _dev(GIDX), 0.0)
    assert_close(x.cpu(), X.scatter(1, GIDX, 0.0))
    x.scatter_add_(1, _dev(GIDX), _dev(X))
    assert_close(x.cpu(), X.scatter(1, GIDX, 0.0).scatter_add(1, GIDX, X))
    out = torch.empty(0, device="nntile")
    torch.gather(_dev(X), 1, _dev(GIDX), out=out)
    assert_close(out.cpu(), torch.gather(X, 1, GIDX))
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype"):
        torch.gather(_dev(X), 1, _dev(GIDX), out=torch.empty(7, 6, dtype=torch.float64, device="nntile"))
    with pytest.raises(RuntimeError, match="dtype"):
        torch.scatter(_dev(X), 1, _dev(GIDX), _dev(X.double()))
    with pytest.raises(RuntimeError, match="out of bounds"):  # a value error: raised when read
        torch.gather(_dev(X), 1, _dev(GIDX + 10)).cpu()


# -- advanced indexing ----------------------------------------------------------------------------------

X3 = torch.randn(5, 6, 4)
I2 = torch.tensor([4, 0, 0, 2])
I3 = torch.tensor([[1, 3], [5, 0]])
MASK = X3[:, :, 0] > 0


INDEXING = {
    "int": lambda x: x[_on(I2, x)],
    "int_2d": lambda x: x[_on(I3, x) % 5],
    "middle": lambda x: x[:, _on(I3, x)],
    "last": lambda x: x[..., _on(torch.tensor([3, 1]), x)],
    "two": lambda x: x[_on(I2, x), _on(torch.tensor([1, 5, 2, 2]), x)],
    "broadcast": lambda x: x[_on(I2[:2, None], x), :, _on(torch.tensor([0, 3, 1]), x)],  # a None gap: dims first
    "broadcast_adjacent": lambda x: x[:, _on(I3, x), _on(torch.tensor([[0], [3]]), x)],
    "negative": lambda x: x[_on(-I2 - 1, x)],
    "mask": lambda x: x[_on(MASK, x)],
    "mask_3d": lambda x: x[_on(X3 > 0.5, x)],
    "mask_middle": lambda x: x[:, _on(X3[0, :, 0] > 0, x)],
    "mask_and_int": lambda x: x[_on(X3[:, 0, 0] > -0.2, x)[:5], :, _on(torch.tensor([2]), x)],
    "cpu_index": lambda x: x[I2],
}


def _on(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return i.to(x.device)


@pytest.mark.parametrize("tiles", [None, {(0, 0): [2, 3], (0, 1): [4, 2], (0, 2): [1, 3]}], ids=IDS)
@pytest.mark.parametrize("name", list(INDEXING))
def test_index(name, tiles):
    check_op(INDEXING[name], [X3], tiles)


def test_index_is_tiled_over_the_dims_it_keeps():
    torch_nntile.reset_info()
    check_op(INDEXING["middle"], [X3], {(0, 0): [2, 3], (0, 2): [1, 3]})
    check_op(INDEXING["broadcast"], [X3], {(0, 1): [4, 2]})
    check_op(PUTS["accumulate"], [X3, torch.randn(5, 6, 4)], {(0, 1): [4, 2], (0, 2): [1, 3]})
    torch_nntile.wait()
    retiled = torch_nntile.metrics()["retiles"]
    assert "index" not in retiled and "index_put" not in retiled, retiled


def test_index_errors():
    x = _dev(X3)
    with pytest.raises(IndexError, match="tensors used as indices"):
        x[_dev(torch.tensor([1.0]))]
    with pytest.raises(IndexError, match="too many indices"):
        torch.ops.aten.index.Tensor(x, [None, None, None, _dev(I2)])
    with pytest.raises(IndexError, match="shape of the mask"):
        x[_dev(torch.tensor([True, False]))]
    with pytest.raises(IndexError, match="could not be broadcast"):
        x[_dev(I2), _dev(torch.tensor([1, 2]))]
    with pytest.raises(IndexError, match="out of bounds"):
        x[_dev(I2 + 10)].cpu()


PUTS = {
    "int": lambda x, v: x.index_put((_on(I2, x),), v[:4]),
    "int_broadcast": lambda x, v: x.index_put((_on(torch.tensor([1, 3]), x),), v[0, 0]),
    "accumulate": lambda x, v: x.index_put((_on(I2, x),), v[:4], accumulate=True),
    "two": lambda x, v: x.index_put((_on(I2, x), _on(torch.tensor([1, 5, 2, 2]), x)), v[0, :4], accumulate=True),
    "mask": lambda x, v: x.index_put((_on(MASK, x),), v.reshape(-1, 4)[: int(MASK.sum())]),
    "mask_scalar": lambda x, v: x.index_put((_on(MASK, x),), v[0, 0, 0]),
}


@pytest.mark.parametrize("tiles", [None, {(0, 0): [2, 3], (0, 1): [4, 2], (0, 2): [1, 3]}], ids=IDS)
@pytest.mark.parametrize("name", list(PUTS))
def test_index_put(name, tiles):
    check_op(PUTS[name], [X3, torch.randn(5, 6, 4)], tiles)


def test_setitem():
    def put(x, v):
        x = x * 1
        x[:, _on(torch.tensor([0, 4]), x)] = v[:, :2]
        x[_on(MASK, x)] = v[0, 0, 0] * 3
        x[_on(I2, x), 1] += v[:4, 0]
        return x
    check_op(put, [X3, torch.randn(5, 6, 4)], {(0, 2): [1, 3]})
    with pytest.raises(RuntimeError, match="shape mismatch"):
        _dev(X3).index_put_((_dev(I2),), _dev(torch.randn(3)))
    with pytest.raises(RuntimeError, match="dtypes match"):
        _dev(X3).index_put_((_dev(I2),), _dev(torch.randn(4, 6, 4, dtype=torch.float64)))


@pytest.mark.parametrize("x", [X3 > 0, INTS, torch.tensor(3.0), torch.tensor(0), torch.zeros(0, 3), torch.zeros(4, 2)],
                         ids=["bool", "int", "0-dim", "0-dim-zero", "empty", "zeros"])
def test_nonzero(x):
    _same(torch.nonzero, x, tiles={0: [1, x.shape[0] - 1]} if x.dim() and x.shape[0] > 1 else None)
    _same(lambda t: torch.argwhere(t), x)


# -- padding, flip, roll --------------------------------------------------------------------------------


@pytest.mark.parametrize("pad", [(1, 2), (0, 0, 2, 1), (-1, 2, 3, -2), (2, 1, 0, 0, 1, 1), (-2, -1)],
                         ids=["last", "two", "crop", "three", "crop_only"])
@pytest.mark.parametrize("tiles", [None, {(0, 0): [2, 3], (0, 1): [4, 2], (0, 2): [1, 3]}], ids=IDS)
def test_constant_pad(pad, tiles):
    check_op(lambda t: F.pad(t, pad, value=-1.5), [X3], tiles)


def test_constant_pad_dtypes_and_errors():
    _same(lambda t: F.pad(t, (1, 1), value=7), INTS, tiles={1: [2, 4]})
    _same(lambda t: F.pad(t, (0, 2), value=True), BOOLS)
    _same(lambda t: F.pad(t, (2, 0, 1, 1)), torch.zeros(0, 3))
    with pytest.raises(RuntimeError):
        F.pad(_dev(X), (1, 2, 3))
    with pytest.raises(RuntimeError, match="non-negative"):
        F.pad(_dev(X), (-4, -3))


@pytest.mark.parametrize("dims", [(0,), (1,), (0, 2), (-1, 0, 1)])
@pytest.mark.parametrize("tiles", [None, {(0, 0): [2, 3], (0, 1): [4, 2], (0, 2): [1, 3]}], ids=IDS)
def test_flip(dims, tiles):
    check_op(lambda t: torch.flip(t, dims), [X3], tiles)


@pytest.mark.parametrize("shifts, dims", [(2, 0), (-1, 1), ((1, 3), (0, 2)), ((7, -9), (1, 1)), (11, None), (0, 1)])
@pytest.mark.parametrize("tiles", [None, {(0, 0): [2, 3], (0, 1): [4, 2], (0, 2): [1, 3]}], ids=IDS)
def test_roll(shifts, dims, tiles):
    check_op(lambda t: torch.roll(t, shifts, dims), [X3], tiles)


def test_flip_roll_edges():
    _same(lambda t: torch.flip(t, [0]), torch.tensor(2.0))
    _same(lambda t: torch.roll(t, 1, 0), torch.zeros(0, 3))
    _same(lambda t: torch.flip(t, [0, 1]), BOOLS, tiles={0: [3, 4]})
    _same(lambda t: torch.fliplr(torch.flipud(t)), INTS)
    _same(lambda t: torch.rot90(t, 1, (0, 1)), X, tiles={0: [3, 4]})
    with pytest.raises(RuntimeError):
        torch.flip(_dev(X), [0, 0])
    torch_nntile.reset_info()
    check_op(lambda t: torch.roll(torch.flip(t, [0]), 2, 1), [X], UNEVEN)
    torch_nntile.wait()
    assert not torch_nntile.metrics()["retiles"], torch_nntile.metrics()["retiles"]


# -- cumulative sums and products -------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
def test_cumsum_cumprod(dim, tiles):
    check_op(lambda t: torch.cumsum(t, dim), [X], tiles)
    check_op(lambda t: torch.cumprod(t, dim), [X], tiles)
    zeros = X.clone()
    zeros[2, 3] = zeros[5, 1] = zeros[5, 4] = 0  # cumprod's backward through zeros
    check_op(lambda t: torch.cumprod(t, dim), [zeros], tiles, rtol=1e-4)


def test_cumsum_dtypes_and_forms():
    for x in (INTS, INTS.to(torch.int32), BOOLS, X.double()):
        _same(lambda t: torch.cumsum(t, 1), x, tiles={0: [3, 4]})
        _same(lambda t: torch.cumprod(t, 0), x, tiles={1: [3, 3]})
    _same(lambda t: torch.cumsum(t, 0, dtype=torch.float64), X)
    _same(lambda t: torch.cumsum(t, 0, dtype=torch.float32), INTS)
    _same(lambda t: torch.cumsum(t, 0), torch.tensor(2.5))
    _same(lambda t: torch.cumsum(t, 1), torch.zeros(3, 0))
    x = _dev(X)
    x.cumsum_(1)
    assert_close(x.cpu(), X.cumsum(1))
    out = torch.empty(0, device="nntile")
    torch.cumprod(_dev(X), 0, out=out)
    assert_close(out.cpu(), X.cumprod(0))
    torch_nntile.reset_info()
    check_op(lambda t: torch.cumsum(t, 1), [X], {(0, 0): [4, 3]})
    torch_nntile.wait()
    assert "cumsum" not in torch_nntile.metrics()["retiles"]  # tiled over the other dim as it is


# -- index_select / index_add / index_copy / index_fill, repeat_interleave -------------------------------------


@pytest.mark.parametrize("tiles", TILINGS, ids=IDS)
def test_index_along_dim(tiles):
    i = torch.tensor([5, 0, 2, 2])
    j = torch.tensor([5, 0, 2])
    src = torch.randn(7, 3)
    check_op(lambda x, ii: torch.index_select(x, 1, ii), [X, i], tiles)
    check_op(lambda x, s, ii: torch.index_add(x, 1, ii, s, alpha=2.0), [X, src, j], tiles)
    check_op(lambda x, s, ii: torch.index_copy(x, 1, ii, s), [X, src, j], tiles)
    check_op(lambda x, ii: torch.index_fill(x, 1, ii, -1.0), [X, j], tiles)
    check_op(lambda x, ii: torch.index_fill(x, 0, ii, -1.0), [X, j], tiles)


def test_repeat_interleave():
    r = torch.tensor([2, 0, 3, 1])
    _same(torch.repeat_interleave, r)
    _same(lambda t: torch.repeat_interleave(t, output_size=6), r)
    check_op(lambda x: torch.repeat_interleave(x, 2, dim=1), [X], UNEVEN)
    check_op(lambda x, rr: torch.repeat_interleave(x, rr, dim=0), [X[:4], r])


def test_unique_from_a_read_back():
    x = torch.tensor([3, 1, 3, 0, 1, 7])
    _same(torch.unique, x)
    for kw in ({"return_inverse": True}, {"return_counts": True}, {"sorted": False, "return_inverse": True}):
        want = torch.unique(x, **kw)
        got = torch.unique(_dev(x), **kw)
        for g, w in zip(got, want):
            assert g.device.type == "nntile" and torch.equal(g.cpu(), w)
    # index_fill with a tensor value: its gradient sums over the unique indices
    check_op(lambda t, v: torch.index_fill(t, 1, _on(torch.tensor([1, 4, 1]), t), v), [X, torch.tensor(0.5)])


@pytest.mark.parametrize("invert", [False, True])
def test_isin(invert):
    """generate()'s stopping criteria: tiled over the elements, the test set whole."""
    x, test = torch.randint(0, 10, (7, 5)), torch.tensor([1, 3, 3, 8])
    xn, tn = x.to("nntile"), test.to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "isin_rows"})
    torch_nntile.set_axis_group_tiling("isin_rows", [3, 4])
    assert torch.equal(torch.isin(xn, tn, invert=invert).cpu(), torch.isin(x, test, invert=invert))
    assert torch.equal(torch.isin(xn, 3, invert=invert).cpu(), torch.isin(x, 3, invert=invert))
    assert torch.equal(torch.isin(8, tn, invert=invert).cpu(), torch.isin(8, test, invert=invert))
