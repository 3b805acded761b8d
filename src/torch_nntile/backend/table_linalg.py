"""ATen table: matrix products, reductions, layer norm and the ops of cross-entropy."""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.backend.aten import Scalar, check_live, defop, promote, register, type_name
from torch_nntile.backend.device import new_tensor, read, read_transposable
from torch_nntile.graph.nodes import DataNode
from torch_nntile.ops import linalg, norm, reduce
from torch_nntile.ops.views import reshape

# -- linear algebra ------------------------------------------------------------


@defop("mm.default")
def _mm(self: torch.Tensor, mat2: torch.Tensor) -> DataNode:
    a, ta = read_transposable(self)
    b, tb = read_transposable(mat2)
    return linalg.mm(a, ta, b, tb, promote(self, mat2))


@defop("addmm.default")
def _addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Scalar = 1, alpha: Scalar = 1) -> DataNode:
    a, ta = read_transposable(mat1)
    b, tb = read_transposable(mat2)
    if beta == 0:
        return linalg.mm(a, ta, b, tb, promote(mat1, mat2), alpha=alpha)
    return linalg.mm(a, ta, b, tb, promote(mat1, mat2), bias=read(self), alpha=alpha, beta=beta)


def _check_mv(bias: DataNode | None, a: DataNode, v: DataNode) -> None:
    if len(a.shape) != 2 or len(v.shape) != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got 1, {len(a.shape)}, {len(v.shape)}")
    m, k = a.shape
    if v.shape[0] != k or (bias is not None and bias.shape not in ((), (1,), (m,))):
        n = bias.shape[0] if bias is not None and bias.shape else m
        raise RuntimeError(f"size mismatch, got input ({n}), mat ({m}x{k}), vec ({v.shape[0]})")


@defop("mv.default")
def _mv(self: torch.Tensor, vec: torch.Tensor) -> DataNode:
    a, v = read(self), read(vec)
    _check_mv(None, a, v)
    out = linalg.mm(a, False, reshape(v, (v.shape[0], 1)), False, promote(self, vec))
    return reshape(out, (a.shape[0],))


@defop("addmv.default")
def _addmv(self: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor, *, beta: Scalar = 1,
           alpha: Scalar = 1) -> DataNode:
    a, v, bias = read(mat), read(vec), read(self)
    _check_mv(bias, a, v)
    m = a.shape[0]
    col = reshape(v, (v.shape[0], 1))
    bias2 = reshape(bias, (m, 1)) if bias.shape == (m,) else bias
    dt = promote(self, mat, vec)
    out = (linalg.mm(a, False, col, False, dt, alpha=alpha) if beta == 0
           else linalg.mm(a, False, col, False, dt, bias=bias2, alpha=alpha, beta=beta))
    return reshape(out, (m,))


@defop("dot.default", inplace=False)
def _dot(self: torch.Tensor, tensor: torch.Tensor) -> DataNode:
    a, b = read(self), read(tensor)
    if len(a.shape) != 1 or len(b.shape) != 1:
        raise RuntimeError(f"1D tensors expected, but got {len(a.shape)}D and {len(b.shape)}D tensors")
    if a.shape != b.shape:
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{a.shape[0]}] and src [{b.shape[0]}] to have "
                           "the same number of elements, but got {} and {} elements respectively"
                           .format(a.shape[0], b.shape[0]))
    if self.dtype != tensor.dtype:
        raise RuntimeError(f"dot : expected both vectors to have same dtype, but found {type_name(self.dtype)} and "
                           f"{type_name(tensor.dtype)}")
    out = linalg.mm(reshape(a, (1, a.shape[0])), False, reshape(b, (b.shape[0], 1)), False, self.dtype)
    return reshape(out, ())


# -- reductions ----------------------------------------------------------------


def _red_dtype(self: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return torch.int64 if not (self.dtype.is_floating_point or self.dtype.is_complex) else self.dtype


def _dims(dim: Any) -> tuple[int, ...]:
    if dim is None:
        return ()
    return (dim,) if isinstance(dim, int) else tuple(dim)


@defop("sum.default", inplace=False)
def _sum_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), (), False, _red_dtype(self, dtype))


@defop("sum.dim_IntList", inplace=False)
def _sum(self: torch.Tensor, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), _dims(dim), keepdim, _red_dtype(self, dtype))


def _mean_dtype(self: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    dt = dtype or self.dtype
    if not (dt.is_floating_point or dt.is_complex):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point "
                           f"or complex dtype. Got: {dt}")
    return dt


@defop("mean.default", inplace=False)
def _mean_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), (), False, _mean_dtype(self, dtype), mean=True)


@defop("mean.dim", inplace=False)
def _mean(self: torch.Tensor, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), _dims(dim), keepdim, _mean_dtype(self, dtype), mean=True)


# -- normalization -----------------------------------------------------------------


def _opt(t: torch.Tensor | None) -> DataNode | None:
    return read(t) if t is not None else None


def _layer_norm(input: torch.Tensor, normalized_shape: Any, weight: torch.Tensor | None, bias: torch.Tensor | None,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_live()
    outs = norm.layer_norm(read(input), tuple(normalized_shape), _opt(weight), _opt(bias), eps)
    return tuple(new_tensor(n) for n in outs)  # type: ignore[return-value]


def _layer_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, normalized_shape: Any, mean: torch.Tensor,
                         rstd: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                         output_mask: Any) -> tuple[torch.Tensor | None, ...]:
    check_live()
    outs = norm.layer_norm_backward(read(grad_out), read(input), tuple(normalized_shape), read(mean), read(rstd),
                                    _opt(weight), _opt(bias), tuple(output_mask))
    return tuple(new_tensor(n) if n is not None else None for n in outs)


register("native_layer_norm", _layer_norm)
register("native_layer_norm_backward", _layer_norm_backward)


# -- cross-entropy ----------------------------------------------------------------


@defop("_log_softmax.default", inplace=False)
def _log_softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> DataNode:
    return reduce.log_softmax(read(self), dim)


@defop("_log_softmax_backward_data.default", inplace=False)
def _log_softmax_bw(grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> DataNode:
    return reduce.log_softmax_backward(read(grad_output), read(output), dim, input_dtype)


def _nll_forward(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                 ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_live()
    w = read(weight) if weight is not None else None
    loss, tw = reduce.nll_loss(read(self), read(target), w, reduction, ignore_index)
    return new_tensor(loss), new_tensor(tw)


register("nll_loss_forward", _nll_forward)


@defop("nll_loss_backward.default", inplace=False)
def _nll_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                  reduction: int, ignore_index: int, total_weight: torch.Tensor) -> DataNode:
    w = read(weight) if weight is not None else None
    return reduce.nll_loss_backward(read(grad_output), read(self), read(target), w, reduction, ignore_index,
                                    read(total_weight))
