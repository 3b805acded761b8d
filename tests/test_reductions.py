"""Reductions, softmax, norms, losses and batched products against CPU: untiled, with
the reduced dim tiled (even and uneven tiles; per-tile partials combined), with other
dims tiled, and on 0-dim / zero-size values. No CPU fallback: every op runs natively."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, check_op

import torch_nntile


def _retiles() -> dict[str, int]:
    torch_nntile.wait()
    return {op: sum(per.values()) for op, per in torch_nntile.metrics()["retiles"].items()}


def _no_retiles(*ops: str) -> None:
    got = _retiles()
    assert not any(got.get(op) for op in ops), got


REDUCED = [None, 3, [3, 5], [1, 7]]
REDUCED_IDS = ["untiled", "even", "uneven", "uneven1"]


# -- softmax / log-softmax -------------------------------------------------------------


@pytest.mark.parametrize("tiling", REDUCED, ids=REDUCED_IDS)
@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_reduced_dim_tiled(fn, tiling):
    torch_nntile.reset_info()
    tiles = {(0, 1): tiling} if tiling else None
    check_op(lambda a: fn(a, dim=1) * 2, [torch.randn(6, 8) * 3], tiles)
    _no_retiles("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data")


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_any_dim_every_dim_tiled(fn, dim):
    check_op(lambda a: fn(a, dim=dim), [torch.randn(5, 6, 7)], {(0, 0): [2, 3], (0, 1): [4, 2], (0, 2): [3, 4]})


def test_softmax_other_dims_tiled():
    check_op(lambda a: F.softmax(a, dim=-1), [torch.randn(6, 4, 5)], {(0, 0): 4, (0, 1): [1, 3]})


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_masked_rows(fn):
    """-inf in some tiles of a row, a row all -inf (NaN, as on CPU), +inf."""
    x = torch.randn(4, 8)
    x[0, :3] = -math.inf
    x[1, :] = -math.inf
    x[2, 5] = math.inf
    x[3, 4:] = -math.inf
    want = fn(x, dim=1)
    xn = x.to("nntile")
    torch_nntile.set_axis_group_name(xn, {1: "cols_mask"})
    torch_nntile.set_axis_group_tiling("cols_mask", [3, 5])
    got = fn(xn, dim=1).cpu()
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.allclose(got[ok], want[ok], atol=1e-6)


def test_softmax_0dim_and_empty():
    check_op(lambda a: F.softmax(a, dim=0), [torch.tensor(1.5)])
    check_op(lambda a: F.log_softmax(a, dim=1), [torch.randn(0, 4)], grad=False)
    check_op(lambda a: F.softmax(a, dim=0), [torch.randn(0, 4)], grad=False)


def test_softmax_double_and_integer_error():
    check_op(lambda a: F.softmax(a, dim=0), [torch.randn(7, 3, dtype=torch.float64)], {(0, 0): [3, 4]})
    with pytest.raises(NotImplementedError, match="not implemented for 'int64'"):
        torch._softmax(torch.arange(3).to("nntile"), 0, False)


# -- layer norm, RMS norm -----------------------------------------------------------------


@pytest.mark.parametrize("tiling", [3, [3, 5], [1, 7]], ids=["even", "uneven", "uneven1"])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_normalized_dim_tiled(tiling, affine):
    torch_nntile.reset_info()
    x = torch.randn(6, 8) * 2 + 1
    tiles = {(0, 1): tiling, (0, 0): [2, 4]}
    if affine:
        check_op(lambda a, w, b: F.layer_norm(a, (8,), w, b) * 3, [x, torch.randn(8), torch.randn(8)], tiles)
    else:
        check_op(lambda a: F.layer_norm(a, (8,)) * 3, [x], tiles)
    _no_retiles("native_layer_norm", "native_layer_norm_backward")


def test_layer_norm_two_normalized_dims_tiled():
    x, w, b = torch.randn(4, 5, 6) + 3, torch.randn(5, 6), torch.randn(5, 6)
    check_op(lambda a, w, b: F.layer_norm(a, (5, 6), w, b), [x, w, b], {(0, 1): [2, 3], (0, 2): [4, 2]})
    check_op(lambda a, w: F.layer_norm(a, (5, 6), w), [x, w], {(0, 2): 4})


def test_layer_norm_whole_value_normalized():
    check_op(lambda a, w, b: F.layer_norm(a, (4, 6), w, b), [torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6)],
             {(0, 1): [2, 4]})


def test_layer_norm_large_mean_is_accurate():
    """Per-tile moments combined (Chan): no cancellation with a large offset."""
    check_op(lambda a: F.layer_norm(a, (64,)), [torch.randn(4, 64) + 1000], {(0, 1): 16}, rtol=1e-4)


@pytest.mark.parametrize("tiles", [None, {(0, 1): [3, 5]}, {(0, 0): 2, (0, 1): 3}], ids=["untiled", "hidden", "both"])
def test_rms_norm(tiles):
    x, w = torch.randn(4, 8), torch.randn(8)
    check_op(lambda a, w: F.rms_norm(a, (8,), w, 1e-6), [x, w], tiles)
    check_op(lambda a: F.rms_norm(a, (8,)), [x], tiles)


class LlamaRMSNorm(torch.nn.Module):
    """The module of HF Llama: pow, mean, rsqrt, mul."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden))
        self.variance_epsilon = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        dtype = h.dtype
        h = h.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * h.to(dtype)


def test_llama_rms_norm_hidden_tiled():
    x = torch.randn(2, 5, 12)
    m = LlamaRMSNorm(12)
    mn = LlamaRMSNorm(12)
    mn.load_state_dict(m.state_dict())
    mn = mn.to("nntile")
    xc, xn = x.clone().requires_grad_(), x.to("nntile").requires_grad_()
    torch_nntile.set_axis_group_name(xn, {2: "hidden_rms", 0: "batch_rms"})
    torch_nntile.set_axis_group_tiling("hidden_rms", [5, 7])
    torch_nntile.set_axis_group_tiling("batch_rms", 1)
    want, got = m(xc), mn(xn)
    assert_close(got.cpu(), want.detach())
    g = torch.randn_like(want)
    want.backward(g)
    got.backward(g.to("nntile"))
    assert_close(xn.grad.cpu(), xc.grad)
    assert_close(mn.weight.grad.cpu(), m.weight.grad)


# -- cross-entropy over a tiled vocabulary -------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_vocab_tiled(reduction):
    torch_nntile.reset_info()
    x, t = torch.randn(12, 1000), torch.randint(0, 1000, (12,))
    t[3] = -100
    check_op(lambda a, t: F.cross_entropy(a, t, reduction=reduction), [x, t], {(0, 1): 256, (0, 0): [5, 7]})
    _no_retiles("_log_softmax", "nll_loss_forward", "nll_loss_backward", "_log_softmax_backward_data")


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_label_smoothing_weight_ignore(smoothing):
    x, t, w = torch.randn(10, 30), torch.randint(0, 30, (10,)), torch.rand(30) + 0.5
    t[[2, 7]] = 4
    for weight in (None, w):
        for red in ("mean", "sum", "none"):
            check_op(lambda a, t: F.cross_entropy(a, t, weight=None if weight is None else weight.to(a.device),
                                                  ignore_index=4, label_smoothing=smoothing, reduction=red),
                     [x, t], {(0, 1): [8, 8, 14], (0, 0): 4})


def test_cross_entropy_probabilities_tiled():
    x, p = torch.randn(6, 20), torch.softmax(torch.randn(6, 20), 1)
    check_op(lambda a, p: F.cross_entropy(a, p, label_smoothing=0.2), [x, p], {(0, 1): [7, 13]})


def test_nll_one_sample_and_classes_tiled():
    x, t = torch.randn(9), torch.tensor(7)
    check_op(lambda a, t: F.nll_loss(a, t), [x, t], {(0, 0): [4, 5]})


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss2d_tiled(reduction):
    x, t = torch.randn(2, 5, 3, 4), torch.randint(0, 5, (2, 3, 4))
    t[0, 1, 2] = -100
    check_op(lambda a, t: F.cross_entropy(a, t, reduction=reduction), [x, t], {(0, 1): [2, 3], (0, 2): [1, 2]})
    check_op(lambda a, t: F.nll_loss(a, t, weight=torch.arange(1.0, 6.0).to(a.device), reduction=reduction),
             [x, t], {(0, 1): [2, 3]})


def test_nll_target_out_of_range_with_classes_tiled():
    x = torch.randn(4, 6).to("nntile")
    torch_nntile.set_axis_group_name(x, {1: "classes_oob"})
    torch_nntile.set_axis_group_tiling("classes_oob", [2, 4])
    loss = F.nll_loss(x, torch.tensor([0, 1, 9, 2]).to("nntile"))
    with pytest.raises(IndexError, match="Target 9 is out of bounds"):
        loss.cpu()


def test_mse_loss():
    x, y = torch.randn(6, 7), torch.randn(6, 7)
    for red in ("mean", "sum", "none"):
        check_op(lambda a, b: F.mse_loss(a, b, reduction=red), [x, y], {(0, 0): [2, 4], (0, 1): 3})
    check_op(lambda a: F.mse_loss(a, torch.zeros(()).to(a.device).expand(6, 7)), [x])


# -- amax / max / argmax / any / all ------------------------------------------------------------


@pytest.mark.parametrize("tiles", [None, {(0, 1): [3, 5]}, {(0, 0): [2, 4], (0, 1): 3}], ids=["untiled", "dim", "both"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_amax_amin(tiles, keepdim):
    x = torch.randn(6, 8)
    for dims in ((1,), (0,), (0, 1), ()):
        check_op(lambda a: a.amax(dims, keepdim) * 2, [x], tiles)
        check_op(lambda a: a.amin(dims, keepdim), [x], tiles)


def test_amax_ties_share_the_gradient():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 1.0, 0.0, -1.0]])
    check_op(lambda a: a.amax(1), [x], {(0, 1): [2, 3]})
    check_op(lambda a: a.max(), [x], {(0, 1): [2, 3], (0, 0): 1})


@pytest.mark.parametrize("tiles", [None, {(0, 1): [3, 5]}, {(0, 0): [2, 4], (0, 1): [1, 7]}], ids=["untiled", "dim", "both"])
def test_max_min_full_and_dim(tiles):
    x = torch.randn(6, 8)
    x[2, [1, 4, 6]] = 9.0  # ties across tiles: the first index wins
    x[3, [0, 7]] = -9.0
    check_op(lambda a: a.max(), [x], tiles)
    check_op(lambda a: a.min(), [x], tiles)
    for keepdim in (False, True):
        for dim in (0, 1, -1):
            check_op(lambda a: a.max(dim, keepdim).values * 2, [x], tiles)
            check_op(lambda a: a.max(dim, keepdim).indices, [x], tiles, grad=False)
            check_op(lambda a: a.min(dim, keepdim).values, [x], tiles)
            check_op(lambda a: a.min(dim, keepdim).indices, [x], tiles, grad=False)


def test_max_with_nan_tiled():
    x = torch.randn(3, 8)
    x[1, 5] = math.nan
    x[2, [2, 6]] = math.nan
    for f in (lambda a: a.max(1).indices, lambda a: a.argmax(1), lambda a: a.argmin(), lambda a: a.amax(1)):
        want = f(x)
        xn = x.to("nntile")
        torch_nntile.set_axis_group_name(xn, {1: "cols_nan"})
        torch_nntile.set_axis_group_tiling("cols_nan", [3, 5])
        got = f(xn).cpu()
        assert torch.equal(got.isnan(), want.isnan()) if want.is_floating_point() else torch.equal(got, want)


@pytest.mark.parametrize("tiles", [None, {(0, 1): [3, 5]}, {(0, 0): [2, 4], (0, 1): 3}], ids=["untiled", "dim", "both"])
def test_argmax_argmin(tiles):
    x = torch.randn(6, 8)
    x[1, 2] = x[4, 6] = 10.0  # a tie across tiles of both dims: the first in row-major order
    x[5, 0] = x[0, 7] = -10.0
    for f in (torch.argmax, torch.argmin):
        check_op(lambda a: f(a), [x], tiles, grad=False)
        check_op(lambda a: f(a, keepdim=True), [x], tiles, grad=False)
        for dim in (0, 1):
            check_op(lambda a: f(a, dim), [x], tiles, grad=False)
            check_op(lambda a: f(a, dim, keepdim=True), [x], tiles, grad=False)
    check_op(lambda a: a.argmax(), [torch.randint(0, 4, (5, 7))], {(0, 0): [2, 3], (0, 1): 3}, grad=False)


@pytest.mark.parametrize("tiles", [None, {(0, 1): [3, 5]}, {(0, 0): [2, 4], (0, 1): 3}], ids=["untiled", "dim", "both"])
def test_any_all(tiles):
    b = torch.rand(6, 8) > 0.8
    b[3] = True
    n = (torch.rand(6, 8) > 0.5).float() * torch.randn(6, 8)
    u = torch.randint(0, 2, (6, 8), dtype=torch.uint8)
    for x in (b, n, u):
        for f in (torch.any, torch.all):
            check_op(lambda a: f(a), [x], tiles, grad=False)
            for dim in (0, 1):
                check_op(lambda a: f(a, dim), [x], tiles, grad=False)
                check_op(lambda a: f(a, dim, keepdim=True), [x], tiles, grad=False)
            check_op(lambda a: f(a, (0, 1)), [x], tiles, grad=False)
            check_op(lambda a: f(a, ()), [x], tiles, grad=False)


# -- var / std / norms -------------------------------------------------------------------------


@pytest.mark.parametrize("tiles", [None, {(0, 1): [3, 5]}, {(0, 0): [2, 4], (0, 1): 3}], ids=["untiled", "dim", "both"])
def test_var_std(tiles):
    x = torch.randn(6, 8) * 3 + 5
    for dims in (None, 1, 0, (0, 1)):
        for corr in (0, 1, 2.5):
            for keepdim in (False, True):
                check_op(lambda a: torch.var(a, dims, correction=corr, keepdim=keepdim), [x], tiles, rtol=1e-4)
                check_op(lambda a: torch.std(a, dims, correction=corr, keepdim=keepdim), [x], tiles, rtol=1e-4)
    check_op(lambda a: sum(v.sum() * (i + 1) for i, v in enumerate(torch.var_mean(a, 1))), [x], tiles, rtol=1e-4)
    check_op(lambda a: torch.std_mean(a, (0, 1), keepdim=True)[0], [x], tiles, rtol=1e-4)
    check_op(lambda a: torch.std_mean(a, 0)[1], [x], tiles, rtol=1e-4)


@pytest.mark.parametrize("tiles", [None, {(0, 1): [3, 5]}, {(0, 0): [2, 4], (0, 1): 3}], ids=["untiled", "dim", "both"])
def test_vector_norm(tiles):
    x = torch.randn(6, 8)
    x[1, 3] = 0.0
    for order in (2, 1, math.inf, -math.inf, 0, 3.5, -1.5):
        for dims in (None, 1, (0, 1)):
            check_op(lambda a: torch.linalg.vector_norm(a, order, dims), [x], tiles, grad=order != 0, rtol=1e-4)
        check_op(lambda a: torch.linalg.vector_norm(a, order, 0, keepdim=True), [x], tiles, grad=order != 0,
                 rtol=1e-4)
    check_op(lambda a: torch.linalg.vector_norm(a, dtype=torch.float64), [x], tiles)
    check_op(lambda a: torch.norm(a), [x], tiles)


def test_logsumexp_tiled():
    x = torch.randn(5, 9)
    x[0, 2] = -math.inf
    check_op(lambda a: torch.logsumexp(a, 1), [x], {(0, 1): [4, 5]})
    check_op(lambda a: torch.logsumexp(a, (0, 1), keepdim=True), [x], {(0, 0): 2, (0, 1): 3})


def test_clip_grad_norm_runs_natively():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    dev = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    dev.load_state_dict(model.state_dict())
    dev = dev.to("nntile")
    x = torch.randn(8, 6)
    model(x).pow(2).sum().backward()
    dev(x.to("nntile")).pow(2).sum().backward()
    for order in (2.0, math.inf):
        want = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=order)
        got = torch.nn.utils.clip_grad_norm_(dev.parameters(), 0.5, norm_type=order)
        assert_close(got.cpu(), want)
    for p, q in zip(model.parameters(), dev.parameters()):
        assert_close(q.grad.cpu(), p.grad)


def test_reductions_0dim_and_empty():
    s = torch.tensor(2.5)
    for f in (lambda a: a.amax(), lambda a: a.max(), lambda a: torch.linalg.vector_norm(a),
              lambda a: torch.var(a, correction=0), lambda a: a.std(0, correction=0)):
        check_op(f, [s])
    for f in (lambda a: a.max(0).values, lambda a: a.min(-1, True).values):
        check_op(f, [s])
    check_op(lambda a: a.argmax(0), [s], grad=False)
    check_op(lambda a: a.any(), [s], grad=False)
    e = torch.randn(0, 4)
    check_op(lambda a: a.amax(1), [e], grad=False)
    check_op(lambda a: a.max(1).indices, [e], grad=False)
    check_op(lambda a: torch.linalg.vector_norm(a), [e], grad=False)
    check_op(lambda a: torch.linalg.vector_norm(a, math.inf, 1), [e], grad=False)
    check_op(lambda a: a.any(), [e], grad=False)
    check_op(lambda a: a.all(0), [e], grad=False)
    check_op(lambda a: torch.var(a, 1), [e], grad=False)


@pytest.mark.parametrize("call, kind", [
    (lambda a: a.amax(), RuntimeError), (lambda a: a.amax(0), IndexError), (lambda a: a.max(), RuntimeError),
    (lambda a: a.max(0), IndexError), (lambda a: a.argmax(), IndexError), (lambda a: a.argmin(0), IndexError),
    (lambda a: torch.linalg.vector_norm(a, math.inf), RuntimeError),
    (lambda a: torch.linalg.vector_norm(a, -1, 0), RuntimeError),
])
def test_reductions_without_identity_raise_on_empty(call, kind):
    e = torch.randn(0, 4)
    with pytest.raises(kind):
        call(e)
    with pytest.raises(kind):
        call(e.to("nntile"))


def test_reduction_errors_like_cpu():
    xn = torch.arange(6).reshape(2, 3).to("nntile")
    with pytest.raises(RuntimeError, match="std and var only support floating point"):
        torch.var(xn)
    with pytest.raises(RuntimeError, match="Expected a floating point or complex tensor"):
        torch.linalg.vector_norm(xn)
    with pytest.raises(RuntimeError, match="does not support bool input"):
        torch.argmax(xn > 2)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        torch.amax(xn, (0, 0))
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.amax(xn, 2)


# -- batched products ------------------------------------------------------------------------


BMM_TILES = [None, {(0, 0): [1, 3]}, {(0, 0): 2, (0, 1): [2, 3], (0, 2): [3, 4], (1, 2): [4, 2]}]


@pytest.mark.parametrize("tiles", BMM_TILES, ids=["untiled", "batch", "all"])
def test_bmm(tiles):
    a, b = torch.randn(4, 5, 7), torch.randn(4, 7, 6)
    check_op(torch.bmm, [a, b], tiles)
    check_op(lambda a, b: torch.bmm(a.transpose(1, 2).contiguous().transpose(1, 2), b.transpose(1, 2).contiguous()
                                    .transpose(1, 2)), [a, b], tiles)


@pytest.mark.parametrize("tiles", BMM_TILES, ids=["untiled", "batch", "all"])
def test_baddbmm(tiles):
    a, b = torch.randn(4, 5, 7), torch.randn(4, 7, 6)
    tiles = {(i + 1, d): t for (i, d), t in tiles.items()} if tiles else None
    for bias in (torch.randn(4, 5, 6), torch.randn(5, 6), torch.randn(6), torch.randn(4, 1, 6)):
        check_op(lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), [bias, a, b], tiles)
    check_op(lambda c, a, b: torch.baddbmm(c, a, b, beta=0), [torch.full((4, 5, 6), math.nan), a, b], tiles)


def test_bmm_integer_and_empty():
    check_op(torch.bmm, [torch.randint(-3, 4, (3, 2, 4)), torch.randint(-3, 4, (3, 4, 5))], {(0, 2): [1, 3]},
             grad=False)
    check_op(torch.bmm, [torch.randn(2, 3, 0), torch.randn(2, 0, 4)], grad=False)
    check_op(torch.bmm, [torch.randn(0, 3, 2), torch.randn(0, 2, 4)], grad=False)


def test_bmm_errors():
    a = torch.randn(2, 3, 4).to("nntile")
    with pytest.raises(RuntimeError, match="batch1 must be a 3D tensor"):
        torch.bmm(a[0], a)
    with pytest.raises(RuntimeError, match="Expected size for first two dimensions"):
        torch.bmm(a, torch.randn(2, 3, 5).to("nntile"))
    with pytest.raises(RuntimeError, match="expected scalar type"):
        torch.bmm(a, torch.randn(2, 4, 5, dtype=torch.float64).to("nntile"))


@pytest.mark.parametrize("tiles", [None, {(0, 0): 1, (0, 1): [1, 2], (0, 2): [2, 3]}], ids=["untiled", "tiled"])
def test_attention_scores_matmul(tiles):
    """q @ k^T and (scores @ v) on 4-D values with broadcasting: bmm, forward and backward."""
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    check_op(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 2, -1) @ v, [q, k, v], tiles)
    check_op(lambda q, w: q @ w, [q, torch.randn(3, 4, 6)], tiles)
