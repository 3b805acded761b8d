"""torch_nntile.nn.functional: each function against torch.nn.functional on CPU, forward
and backward, on CPU and on nntile (untiled and tiled, uneven tiles, tiles on the dims
that must be whole), the number of graph ops each call records, and CPU's errors."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import RTOL, assert_close

import torch_nntile
import torch_nntile.nn.functional as NF
from torch_nntile import training

_names = itertools.count()
VIEWS = {"ingress", "reshape", "as_strided"}  # values that cost no graph op of their own


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    """``assert_close``, with NaNs required at the same places."""
    got = got.cpu()
    if want.dtype.is_floating_point and want.isnan().any():
        assert torch.equal(got.isnan(), want.isnan())
        got, want = got.nan_to_num(0.0), want.nan_to_num(0.0)
    assert_close(got, want, rtol)


def parity(ours, ref, inputs: list[torch.Tensor], tiles: dict[tuple[int, int], int | list[int]] | None = None,
           grad: tuple[int, ...] | None = None, rtol: float = RTOL) -> None:
    """``ours`` on CPU and on nntile (``tiles``: (input, dim) -> tiling of that dim's
    group) against ``ref`` on CPU: the value, and the gradients of the floating inputs
    (or of those listed in ``grad``) for a random output gradient."""
    wants_grad = [x.dtype.is_floating_point and (grad is None or i in grad) for i, x in enumerate(inputs)]

    def run(fn, device: str) -> tuple[list[torch.Tensor], torch.Tensor]:
        xs = [(x.detach().clone() if device == "cpu" else x.detach().to(device)).requires_grad_(w)
              for x, w in zip(inputs, wants_grad)]
        if device == "nntile":
            for (i, d), t in (tiles or {}).items():
                name = f"f{next(_names)}"
                torch_nntile.set_axis_group_name(xs[i], {d: name})
                torch_nntile.set_axis_group_tiling(name, t)
        return xs, fn(*xs)

    ref_in, want = run(ref, "cpu")
    g = torch.randn_like(want) if want.requires_grad else None
    if g is not None:
        want.backward(g)
    for device in ("cpu", "nntile"):
        xs, got = run(ours, device)
        assert got.device.type == device
        _close(got.detach(), want.detach(), rtol)
        if g is None:
            continue
        got.backward(g.to(device))
        for x, r in zip(xs, ref_in):
            if r.requires_grad:
                assert x.grad is not None and x.grad.device.type == device
                _close(x.grad, r.grad if r.grad is not None else torch.zeros_like(r), rtol)  # None: zeros


# -- linear ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,tiles", [
    ((8,), {}), ((5, 8), {}), ((3, 4, 8), {}), ((2, 3, 2, 8), {}), ((0, 8), {}),
    ((7, 8), {(0, 0): [3, 4], (0, 1): [5, 3], (1, 0): 2}),        # rows, contraction and outputs tiled
    ((3, 4, 8), {(0, 0): 2, (0, 2): 3}), ((2, 3, 2, 8), {(0, 1): [1, 2]})])
@pytest.mark.parametrize("bias", [False, True])
def test_linear(shape, tiles, bias):
    torch.manual_seed(0)
    inputs = [torch.randn(shape), torch.randn(5, 8)] + ([torch.randn(5)] if bias else [])
    parity(NF.linear, F.linear, inputs, tiles)


# -- activations, softmax -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["relu", "gelu", "gelutanh", "silu"])
@pytest.mark.parametrize("shape,tiles", [((), {}), ((7,), {(0, 0): [3, 4]}), ((4, 6), {(0, 1): 4}),
                                         ((2, 3, 5), {(0, 0): 1, (0, 2): [2, 3]}), ((0, 3), {})])
def test_activations(name, shape, tiles):
    ref = {"relu": F.relu, "gelu": F.gelu, "gelutanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}[name]
    torch.manual_seed(1)
    x = torch.randn(shape)
    if x.numel() > 1:
        x.view(-1)[0] = 0.0  # relu's kink
    parity(getattr(NF, name), ref, [x], tiles)


@pytest.mark.parametrize("shape,dim,tiles", [((), -1, {}), ((7,), 0, {(0, 0): [3, 4]}), ((4, 6), -1, {(0, 1): [2, 4]}),
                                             ((4, 6), 0, {(0, 0): 3, (0, 1): 2}), ((2, 3, 5), 1, {(0, 1): [1, 2]}),
                                             ((0, 5), -1, {})])
def test_softmax(shape, dim, tiles):
    torch.manual_seed(2)
    parity(lambda x: NF.softmax(x, dim), lambda x: F.softmax(x, dim), [torch.randn(shape)], tiles)


# -- normalizations ------------------------------------------------------------------------


NORM_CASES = [((6,), (6,), {}), ((4, 6), (6,), {}), ((4, 6), (6,), {(0, 0): [1, 3]}),
              ((4, 6), (6,), {(0, 1): [2, 4]}),                      # the normalized dim tiled
              ((2, 3, 6), (3, 6), {(0, 1): [1, 2], (0, 2): 4}), ((2, 3, 6), (6,), {(0, 0): 1, (0, 2): 3}),
              ((2, 2, 3, 4), (4,), {(0, 1): 1}), ((0, 6), (6,), {})]


@pytest.mark.parametrize("shape,nshape,tiles", NORM_CASES)
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
def test_layer_norm(shape, nshape, tiles, affine):
    torch.manual_seed(3)
    inputs = [torch.randn(shape) * 2 + 1] + [torch.randn(nshape) for _ in range({"none": 0, "weight": 1}.get(affine, 2))]
    parity(lambda x, *wb: NF.layer_norm(x, nshape, *wb), lambda x, *wb: F.layer_norm(x, nshape, *wb), inputs, tiles)


@pytest.mark.parametrize("shape,nshape,tiles", NORM_CASES)
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm(shape, nshape, tiles, weight, eps):
    torch.manual_seed(4)
    inputs = [torch.randn(shape) * 2 + 1] + ([torch.randn(nshape)] if weight else [])
    parity(lambda x, *w: NF.rms_norm(x, nshape, *w, eps=eps), lambda x, *w: F.rms_norm(x, nshape, *w, eps=eps),
           inputs, tiles)


def test_norms_take_an_int_shape():
    x = torch.randn(3, 5)
    assert_close(NF.layer_norm(x.to("nntile"), 5).cpu(), F.layer_norm(x, (5,)))
    assert_close(NF.rms_norm(x.to("nntile"), 5).cpu(), F.rms_norm(x, (5,)))


# -- embedding -------------------------------------------------------------------------------


@pytest.mark.parametrize("ishape,tiles", [((), {}), ((6,), {}), ((2, 5), {(1, 1): [3, 5]}),
                                          ((2, 3, 2), {(0, 0): 1, (1, 0): 4}), ((0, 3), {})])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_embedding(ishape, tiles, dtype):
    torch.manual_seed(5)
    idx = torch.randint(0, 9, ishape, dtype=dtype)
    if idx.numel() > 1:
        idx.view(-1)[1] = idx.view(-1)[0]  # a repeated row: its gradients add up
    parity(lambda i, w: NF.embedding(i, w), lambda i, w: F.embedding(i, w), [idx, torch.randn(9, 8)], tiles)


# -- losses ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,tiles", [((11,), {}), ((6, 11), {}), ((6, 11), {(0, 1): [4, 7]}),
                                         ((6, 11), {(0, 0): [2, 4], (0, 1): 3}), ((2, 5, 11), {(0, 1): 2, (0, 2): 5}),
                                         ((2, 3, 2, 11), {(0, 0): 1, (0, 3): [10, 1]}), ((0, 11), {}), ((4, 0, 11), {})])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(shape, tiles, reduction):
    torch.manual_seed(6)
    labels = torch.randint(0, 11, shape[:-1])
    if labels.numel() > 2:
        labels.view(-1)[1] = -100
    parity(lambda x, t: NF.cross_entropy(x, t, reduction=reduction),
           lambda x, t: training.cross_entropy(x, t, reduction=reduction), [torch.randn(shape) * 3, labels], tiles)


def test_cross_entropy_ignore_index_and_all_ignored():
    torch.manual_seed(7)
    x, t = torch.randn(5, 6), torch.tensor([0, 3, 3, 5, 1])
    parity(lambda x, t: NF.cross_entropy(x, t, ignore_index=3), lambda x, t: F.cross_entropy(x, t, ignore_index=3),
           [x, t], {(0, 1): [2, 4]})
    parity(lambda x, t: NF.cross_entropy(x, t), lambda x, t: F.cross_entropy(x, t), [x, torch.full((5,), -100)],
           {(0, 0): 2})  # the mean over no labels: NaN, and zero gradients


@pytest.mark.parametrize("shape,tiles", [((), {}), ((7,), {(0, 0): [3, 4]}), ((4, 6), {(0, 0): 1, (0, 1): [2, 4]}),
                                         ((2, 3, 4), {(0, 2): 3}), ((0, 4), {})])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(shape, tiles, reduction):
    torch.manual_seed(8)
    parity(lambda x, y: NF.mse_loss(x, y, reduction), lambda x, y: F.mse_loss(x, y, reduction=reduction),
           [torch.randn(shape), torch.randn(shape)], tiles)


def test_mse_loss_broadcasts_with_cpu_warning():
    x, y = torch.randn(3, 4), torch.randn(4)
    with pytest.warns(UserWarning, match="different to the input size"):
        parity(lambda x, y: NF.mse_loss(x, y), lambda x, y: F.mse_loss(x, y), [x, y], {(0, 0): 2})


@pytest.mark.parametrize("ord", [2, 1, 3, 1.5, 0.5, 0, math.inf, -math.inf])
@pytest.mark.parametrize("shape,dim,keepdim,tiles", [
    ((7,), None, False, {(0, 0): [3, 4]}), ((4, 6), -1, False, {}), ((4, 6), 1, True, {(0, 1): [2, 4]}),
    ((4, 6), None, False, {(0, 0): 3, (0, 1): 4}), ((2, 3, 4), (0, 2), False, {(0, 0): 1, (0, 2): 3}),
    ((2, 3, 4), (1,), True, {(0, 1): [1, 2], (0, 2): 2})])
def test_vector_norm(ord, shape, dim, keepdim, tiles):
    torch.manual_seed(9)
    x = torch.randn(shape)
    x.view(-1)[0] = 0.0  # where the gradient of norms below 1 is masked
    if math.isinf(ord):  # ties at the norm share the gradient, also across tiles
        x = x.round()
    parity(lambda x: NF.vector_norm(x, ord, dim, keepdim), lambda x: torch.linalg.vector_norm(x, ord, dim, keepdim),
           [x], tiles)


def test_vector_norm_edges():
    parity(lambda x: NF.vector_norm(x), lambda x: torch.linalg.vector_norm(x), [torch.tensor(-2.0)])
    parity(lambda x: NF.vector_norm(x, 2, 1), lambda x: torch.linalg.vector_norm(x, 2, 1), [torch.zeros(3, 4)])


# -- one graph op per forward and per gradient ---------------------------------------------------


def _recorded(fn) -> list[str]:
    """The graph ops ``fn`` records (views aside)."""
    torch_nntile.compile_graph()
    fn()
    names = [n for n in torch_nntile.pending_op_names() if n not in VIEWS]
    torch_nntile.compile_graph()
    return names


OP_CASES = [
    ("linear", lambda p: NF.linear(p["x"], p["w"], p["c"]), ["mm"], ["mm", "mm", "sum"]),
    ("linear_2d", lambda p: NF.linear(p["m"], p["w"]), ["mm"], ["mm", "mm"]),
    ("relu", lambda p: NF.relu(p["x"]), ["relu"], ["threshold_backward"]),
    ("gelu", lambda p: NF.gelu(p["x"]), ["gelu"], ["gelu_backward"]),
    ("gelutanh", lambda p: NF.gelutanh(p["x"]), ["gelu"], ["gelu_backward"]),
    ("silu", lambda p: NF.silu(p["x"]), ["silu"], ["silu_backward"]),
    ("layer_norm", lambda p: NF.layer_norm(p["x"], 8, p["a"], p["b"]), ["native_layer_norm"],
     ["native_layer_norm_backward"]),
    ("rms_norm", lambda p: NF.rms_norm(p["x"], 8, p["a"]), ["rms_norm"], ["rms_norm_backward"]),
    ("embedding", lambda p: NF.embedding(p["t"], p["w"]), ["index_select"], ["embedding_dense_backward"]),
    ("softmax", lambda p: NF.softmax(p["x"], 1), ["_softmax"], ["_softmax_backward_data"]),
    ("cross_entropy", lambda p: NF.cross_entropy(p["x"], p["t"]), ["cross_entropy"], ["cross_entropy_backward"]),
    ("mse_loss", lambda p: NF.mse_loss(p["x"], p["y"]), ["mse_loss"], ["mse_loss_backward", "mse_loss_backward"]),
    ("vector_norm", lambda p: NF.vector_norm(p["x"], 2, -1), ["linalg_vector_norm"], ["vector_norm_backward"]),
    ("vector_norm_inf", lambda p: NF.vector_norm(p["x"], math.inf, (0, 2)), ["linalg_vector_norm"],
     ["vector_norm_backward"]),
]


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("case", OP_CASES, ids=[c[0] for c in OP_CASES])
def test_one_graph_op_per_call(case, tiled):
    _, fn, forward, backward = case
    shapes = {"x": (3, 4, 8), "m": (4, 8), "y": (3, 4, 8), "w": (6, 8), "c": (6,), "a": (8,), "b": (8,)}
    p = {k: torch.randn(s).to("nntile").requires_grad_() for k, s in shapes.items()}
    p["t"] = torch.randint(0, 6, (3, 4)).to("nntile")
    if tiled:
        torch_nntile.set_axis_group_name(p["x"], {0: "ops_b", 2: "ops_h"})
        torch_nntile.set_axis_group_tiling("ops_b", [1, 2])
        torch_nntile.set_axis_group_tiling("ops_h", [3, 5])
    out: list[torch.Tensor] = []
    assert _recorded(lambda: out.append(fn(p))) == forward
    g = torch.randn(out[0].shape).to("nntile")
    assert sorted(_recorded(lambda: out[0].backward(g))) == sorted(backward)
    torch_nntile.execute()
    torch_nntile.wait()


# -- errors: CPU's exception types -----------------------------------------------------------------


ERROR_CASES = [
    ("linear shapes", lambda d: NF.linear(torch.randn(4, 8, device=d), torch.randn(5, 7, device=d)),
     lambda: F.linear(torch.randn(4, 8), torch.randn(5, 7))),
    ("linear 0-dim", lambda d: NF.linear(torch.tensor(1.0, device=d), torch.randn(5, 8, device=d)),
     lambda: F.linear(torch.tensor(1.0), torch.randn(5, 8))),
    ("linear dtypes", lambda d: NF.linear(torch.randn(4, 8, device=d, dtype=torch.float64), torch.randn(5, 8, device=d)),
     lambda: F.linear(torch.randn(4, 8, dtype=torch.float64), torch.randn(5, 8))),
    ("layer_norm shape", lambda d: NF.layer_norm(torch.randn(3, 4, device=d), (5,)),
     lambda: F.layer_norm(torch.randn(3, 4), (5,))),
    ("layer_norm weight", lambda d: NF.layer_norm(torch.randn(3, 4, device=d), 4, torch.ones(3, device=d)),
     lambda: F.layer_norm(torch.randn(3, 4), (4,), torch.ones(3))),
    ("rms_norm shape", lambda d: NF.rms_norm(torch.randn(3, 4, device=d), (2, 4)),
     lambda: F.rms_norm(torch.randn(3, 4), (2, 4))),
    ("rms_norm empty shape", lambda d: NF.rms_norm(torch.randn(3, 4, device=d), []),
     lambda: F.rms_norm(torch.randn(3, 4), [])),
    ("rms_norm weight", lambda d: NF.rms_norm(torch.randn(3, 4, device=d), 4, torch.ones(5, device=d)),
     lambda: F.rms_norm(torch.randn(3, 4), (4,), torch.ones(5))),
    ("softmax dim", lambda d: NF.softmax(torch.randn(3, device=d), 2), lambda: F.softmax(torch.randn(3), 2)),
    ("cross_entropy reduction", lambda d: NF.cross_entropy(torch.randn(3, 4, device=d),
                                                           torch.zeros(3, dtype=torch.long, device=d), reduction="x"),
     lambda: F.cross_entropy(torch.randn(3, 4), torch.zeros(3, dtype=torch.long), reduction="x")),
    ("cross_entropy label dtype", lambda d: NF.cross_entropy(torch.randn(3, 4, device=d),
                                                             torch.zeros(3, dtype=torch.int32, device=d)),
     lambda: F.cross_entropy(torch.randn(3, 4), torch.zeros(3, dtype=torch.int32))),
    ("cross_entropy shapes", lambda d: NF.cross_entropy(torch.randn(3, 4, device=d),
                                                        torch.zeros(2, dtype=torch.long, device=d)),
     lambda: F.cross_entropy(torch.randn(3, 4), torch.zeros(2, dtype=torch.long))),
    ("mse_loss integers", lambda d: NF.mse_loss(torch.ones(3, dtype=torch.long, device=d),
                                                torch.ones(3, dtype=torch.long, device=d)),
     lambda: F.mse_loss(torch.ones(3, dtype=torch.long), torch.ones(3, dtype=torch.long))),
    ("vector_norm integers", lambda d: NF.vector_norm(torch.ones(3, dtype=torch.long, device=d)),
     lambda: torch.linalg.vector_norm(torch.ones(3, dtype=torch.long))),
    # found by the kernels: raised by the read-back
    ("embedding index", lambda d: NF.embedding(torch.tensor([1, 5], device=d), torch.randn(3, 2, device=d)).cpu(),
     lambda: F.embedding(torch.tensor([1, 5]), torch.randn(3, 2))),
    ("cross_entropy label", lambda d: NF.cross_entropy(torch.randn(3, 4, device=d),
                                                       torch.tensor([0, 4, 1], device=d)).cpu(),
     lambda: F.cross_entropy(torch.randn(3, 4), torch.tensor([0, 4, 1]))),
]


OWN_WORDS = {"cross_entropy shapes"}  # training.cross_entropy's message (labels of the leading shape), not F's


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_errors_as_on_cpu(case):
    name, ours, ref = case
    with pytest.raises(Exception) as want:
        ref()
    for device in ("cpu", "nntile"):
        with pytest.raises(type(want.value), match=None if name in OWN_WORDS else re.escape(str(want.value))):
            ours(device)


def test_cross_entropy_label_error_in_a_tiled_class_dim():
    x, t = torch.randn(4, 9).to("nntile"), torch.tensor([0, 8, 9, 1]).to("nntile")
    torch_nntile.set_axis_group_name(x, {1: "err_c"})
    torch_nntile.set_axis_group_tiling("err_c", [4, 5])
    with pytest.raises(IndexError, match="Target 9 is out of bounds"):
        NF.cross_entropy(x, t).cpu()
