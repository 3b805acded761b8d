"""Edge shapes through the native ops: zero-size dims, 0-dim tensors, size-1 dims next
to tiled ones, non-contiguous and expanded inputs, every kind of broadcasting. Each
case gives CPU's values, shape and dtype, or raises CPU's exception type."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import torch_nntile

_names = itertools.count()


def _same(fn, inputs: list[torch.Tensor], tiles: dict[int, tuple[int, int | list[int]]] | None = None) -> None:
    """``fn`` on nntile copies of ``inputs`` (dims tiled as ``tiles``: input -> (dim,
    tiling)) against CPU: values within 1e-5 (NaN where CPU has NaN), exact shape and
    dtype; where CPU raises, nntile raises the same exception type."""
    try:
        want, raised = fn(*[x.clone() for x in inputs]), None
    except Exception as e:  # noqa: BLE001 - the exception type is the expectation
        want, raised = None, e
    dev = [x.to("nntile") for x in inputs]
    for i, (dim, tiling) in (tiles or {}).items():
        name = f"edge{next(_names)}"
        torch_nntile.set_axis_group_name(dev[i], {dim: name})
        torch_nntile.set_axis_group_tiling(name, tiling)
    if raised is not None:
        with pytest.raises(type(raised)):
            out = fn(*dev)
            out.cpu()
        return
    got = fn(*dev).cpu()
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if want.dtype.is_floating_point:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    else:
        assert torch.equal(got, want)


SHAPES = {"zero_rows": (0, 3), "zero_cols": (3, 0), "scalar": (), "vector": (4,), "column": (3, 1), "matrix": (3, 4),
          "size1_middle": (6, 1, 4)}
UNARY = {
    "relu": torch.relu, "neg": torch.neg, "exp": torch.exp, "abs": torch.abs, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "sqrt_abs": lambda a: a.abs().sqrt(), "pow": lambda a: a ** 2, "reciprocal": torch.reciprocal,
    "sum": lambda a: a.sum(), "sum0": lambda a: a.sum(0), "sum_last_keepdim": lambda a: a.sum(-1, keepdim=True),
    "mean": lambda a: a.mean(), "mean0": lambda a: a.mean(0), "log_softmax": lambda a: F.log_softmax(a, -1),
    "clone": lambda a: a.clone(), "reshape_flat": lambda a: a.reshape(-1) * 2,
    "expand_new_dim": lambda a: a.expand(2, *a.shape) + 0, "step_slice": lambda a: a[::2] * 1 if a.dim() else a + 0,
    "transpose": lambda a: a.transpose(0, -1).contiguous() if a.dim() else a + 0,
    "add_inplace": lambda a: a.add_(1), "fill": lambda a: a.fill_(2), "zero": lambda a: a.zero_(),
    "maximum": lambda a: torch.maximum(a, a * 0), "clamp": lambda a: a.clamp(-0.5, 0.5),
    "masked_fill": lambda a: a.masked_fill(a > 0, 0.0), "where": lambda a: torch.where(a > 0, a, 0.0),
    "eq": lambda a: a == 0.5, "to_double": lambda a: a.to(torch.float64),
    "to_int": lambda a: (a * 10).to(torch.int64) + 1, "cat_self": lambda a: torch.cat([a, a]) if a.dim() else a + 0,
}


def _layouts(shape: tuple[int, ...]) -> list[tuple[str, dict | None]]:
    out: list[tuple[str, dict | None]] = [("untiled", None)]
    if shape and shape[0] >= 2:
        out.append(("dim0_tiled", {0: (0, 2)}))
    if len(shape) == 3:
        out.append(("next_to_size1_uneven", {0: (2, [1, 3])}))
    return out


UNARY_CASES = [(u, s, lay, tiles) for u in UNARY for s in SHAPES for lay, tiles in _layouts(SHAPES[s])]


@pytest.mark.parametrize("op, shape, layout, tiles", UNARY_CASES,
                         ids=[f"{u}-{s}-{lay}" for u, s, lay, _ in UNARY_CASES])
def test_unary_edge_shapes(op, shape, layout, tiles):
    torch.manual_seed(0)
    _same(UNARY[op], [torch.randn(SHAPES[shape])], tiles)


BINARY = {
    "add": torch.add, "mul": torch.mul, "sub": torch.sub, "div": torch.div, "maximum": torch.maximum,
    "lt": torch.lt, "add_inplace": lambda a, b: a.add_(b), "mul_inplace": lambda a, b: a.mul_(b),
    "where": lambda a, b: torch.where(a > b, a, b), "matmul": lambda a, b: a @ b,
}
PAIRS = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((4,), (3, 4)), ((), (3, 4)), ((3, 4), ()), ((0, 4), (4,)),
         ((3, 4), (3, 1)), ((2, 3, 4), (3, 1)), ((3, 4), (4, 5)), ((0, 4), (4, 5)), ((3, 0), (0, 5)), ((4,), (4,)),
         ((4,), (4, 3)), ((3, 4), (4,)), ((2, 3, 4), (4, 5)), ((3, 4), (5, 4))]
BINARY_CASES = [(b, a, c, t) for b in BINARY for a, c in PAIRS for t in ([False, True] if a and a[0] >= 2 else [False])]


@pytest.mark.parametrize("op, a, b, tiled", BINARY_CASES,
                         ids=[f"{o}-{list(a)}-{list(b)}{'-tiled' if t else ''}" for o, a, b, t in BINARY_CASES])
def test_binary_broadcasting(op, a, b, tiled):
    torch.manual_seed(1)
    _same(BINARY[op], [torch.randn(a), torch.randn(b)], {0: (0, 2)} if tiled else None)


VIEWS = {
    "transposed_operands": lambda a: a.t() + a.t(),
    "expanded_operand": lambda a: a[:1].expand(4, 6) * a,
    "write_through_expanded_view": lambda a: a.expand(3, 4, 6).add_(1),
    "overlapping_strided_read": lambda a: torch.as_strided(a, (3, 3), (1, 1)) * 2,
    "write_through_slice": lambda a: a[:, 1:3].mul_(2).sum() + a.sum(),
    "write_through_select": lambda a: a[1].zero_().sum() + a.sum(),
    "write_through_transpose": lambda a: a.t().add_(1).t().contiguous(),
    "read_column": lambda a: a[:, 2] * 3,
}


@pytest.mark.parametrize("tiled", [False, True], ids=["untiled", "tiled"])
@pytest.mark.parametrize("name", list(VIEWS))
def test_non_contiguous_and_overlapping(name, tiled):
    torch.manual_seed(2)
    _same(VIEWS[name], [torch.randn(4, 6)], {0: (0, [1, 3])} if tiled else None)


def test_write_through_expanded_view_of_an_empty_tensor():
    """No element is written twice when there are none: allowed, as on CPU."""
    _same(lambda a: a.unsqueeze(0).expand(2, 5, 0).add_(1), [torch.zeros(5, 0)])
