"""ATen table: matrix products (2-D and batched), reductions, softmax, layer norm and losses."""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.backend.aten import Scalar, check_live, defop, forms, promote, register, type_name
from torch_nntile.backend.device import DEVICE, new_tensor, read, read_opt, read_transposable, resize_output, write
from torch_nntile.graph.nodes import DataNode
from torch_nntile.kernels import Kernel
from torch_nntile.ops import linalg, loss, norm, reduce, softmax, vector_norm
from torch_nntile.ops.base import NotNative, map_op, wrap_dim
from torch_nntile.ops.views import reshape

# -- linear algebra ------------------------------------------------------------


@defop("mm.default")
def _mm(self: torch.Tensor, mat2: torch.Tensor) -> DataNode:
    a, ta = read_transposable(self)
    b, tb = read_transposable(mat2)
    return linalg.mm(a, ta, b, tb, promote(self, mat2))


def _check_bias(bias: torch.Tensor, m: int, n: int) -> None:
    """A linear layer's bias (addmm's ``self``) that cannot broadcast to the ``[m, n]``
    output: CPU's error, saying also what the published torch_nntile's does (the bias
    size against the output features)."""
    if bias.dim() == 1 and bias.shape[0] not in (1, n):
        try:
            torch.empty(bias.shape, device="meta").expand(m, n)
        except RuntimeError as e:
            raise RuntimeError(f"{e} (linear: bias size {bias.shape[0]} does not match the {n} output features)") from None


@defop("addmm.default")
def _addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Scalar = 1, alpha: Scalar = 1) -> DataNode:
    if mat1.dim() == 2 and mat2.dim() == 2:
        _check_bias(self, mat1.shape[0], mat2.shape[1])
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


def _read_batched(t: torch.Tensor) -> tuple[DataNode, bool]:
    """For bmm operands: a 3-D tensor that is a contiguous value with its last two dims
    transposed (what autograd passes: ``mat2.transpose(1, 2)``) is read as that value,
    transposed by the kernel instead of copied."""
    if t.device.type == DEVICE and t.dim() == 3 and t.numel() and not (t.is_conj() or t.is_neg()):
        b, m, k = t.shape
        st = t.stride()
        if m != 1 and k != 1 and st[1] == 1 and st[2] == m and (b == 1 or st[0] == m * k):
            return read(t.transpose(1, 2)), True
    return read(t), False


def _check_bmm(batch1: torch.Tensor, batch2: torch.Tensor) -> None:
    for name, t in (("batch1", batch1), ("batch2", batch2)):
        if t.dim() != 3:
            raise RuntimeError(f"{name} must be a 3D tensor")
    b, _, k = batch1.shape
    if tuple(batch2.shape[:2]) != (b, k):
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: [{b}, {k}] but got: "
                           f"[{batch2.shape[0]}, {batch2.shape[1]}].")


def _dtype_word(dt: torch.dtype) -> str:
    return type_name(dt).lower()


@defop("bmm.default")
def _bmm(self: torch.Tensor, mat2: torch.Tensor) -> DataNode:
    _check_bmm(self, mat2)
    if self.dtype != mat2.dtype:
        raise RuntimeError(f"expected scalar type {type_name(self.dtype)} but found {type_name(mat2.dtype)}")
    a, ta = _read_batched(self)
    b, tb = _read_batched(mat2)
    return linalg.bmm(a, ta, b, tb, self.dtype)


@defop("baddbmm.default")
def _baddbmm(self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: Scalar = 1,
             alpha: Scalar = 1) -> DataNode:
    _check_bmm(batch1, batch2)
    if not (self.dtype == batch1.dtype == batch2.dtype):
        raise RuntimeError(f"Input dtypes must be the same, got: input {_dtype_word(self.dtype)}, batch1: "
                           f"{_dtype_word(batch1.dtype)}, batch2: {_dtype_word(batch2.dtype)}")
    target = (batch1.shape[0], batch1.shape[1], batch2.shape[2])
    linalg._check_bias(tuple(self.shape), target)
    a, ta = _read_batched(batch1)
    b, tb = _read_batched(batch2)
    if beta == 0:  # the input is ignored, NaN included
        return linalg.bmm(a, ta, b, tb, batch1.dtype, alpha=alpha)
    return linalg.bmm(a, ta, b, tb, batch1.dtype, bias=read(self), alpha=alpha, beta=beta)


# -- reductions ----------------------------------------------------------------


def _red_dtype(self: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return torch.int64 if not (self.dtype.is_floating_point or self.dtype.is_complex) else self.dtype


def _dims(dim: Any) -> tuple[int, ...]:
    if dim is None:
        return ()
    return (dim,) if isinstance(dim, int) else tuple(dim)


def _real(t: torch.Tensor, op: str) -> DataNode:
    if t.dtype.is_complex:
        raise NotNative(f"{op} of a complex tensor")
    return read(t)


@defop("sum.default", inplace=False)
def _sum_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), (), False, _red_dtype(self, dtype))


@defop("sum.dim_IntList", inplace=False)
def _sum(self: torch.Tensor, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), _dims(dim), keepdim, _red_dtype(self, dtype))


forms(_sum, out="sum.IntList_out")


def _mean_dtype(self: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    dt = dtype or self.dtype
    if not (dt.is_floating_point or dt.is_complex):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point "
                           f"or complex dtype. Got: {dt}")
    return dt


@defop("mean.default", inplace=False, out=False)
def _mean_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), (), False, _mean_dtype(self, dtype), mean=True)


@defop("mean.dim", inplace=False)
def _mean(self: torch.Tensor, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), _dims(dim), keepdim, _mean_dtype(self, dtype), mean=True)


forms(_mean_all, out="mean.dtype_out")
forms(_mean, out="mean.out")


def _same_dtype_out(f: Any, name: str) -> None:
    """The ``out=`` overload ``name`` of ``f``, for ops whose ``out`` must have the input's dtype."""
    def out_variant(self: torch.Tensor, *args: Any, out: torch.Tensor, **kw: Any) -> torch.Tensor:
        check_live()
        if out.dtype != self.dtype:
            raise RuntimeError(f"Expected the dtype for input and out to match, but got {type_name(self.dtype)} for "
                               f"input's dtype and {type_name(out.dtype)} for out's dtype.")
        value = f(self, *args, **kw)
        resize_output(out, value.shape)
        write(out, value)
        return out
    register(name, out_variant)


def _extrema(largest: bool) -> None:
    base = "amax" if largest else "amin"
    full = "max" if largest else "min"

    @defop(f"{base}.default", inplace=False, out=False)
    def amax(self: torch.Tensor, dim: Any = (), keepdim: bool = False) -> DataNode:
        return reduce.extremum(_real(self, base), _dims(dim), keepdim, largest, base)

    _same_dtype_out(amax, f"{base}.out")

    @defop(f"{full}.default", inplace=False, out=False)
    def whole(self: torch.Tensor) -> DataNode:
        return reduce.extremum(_real(self, full), (), False, largest, full)

    forms(whole, out=f"{full}.unary_out")

    def along(self: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        check_live()
        v, i = reduce.extremum_dim(_real(self, full), dim, keepdim, largest)
        return new_tensor(v), new_tensor(i)

    register(f"{full}.dim", along)

    @defop(f"arg{full}.default", inplace=False)
    def arg(self: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> DataNode:
        return reduce.arg_extremum(_real(self, f"arg{full}"), dim, keepdim, largest)


_extrema(True)
_extrema(False)


def nonzero_tile(o: torch.Tensor, t: torch.Tensor) -> None:
    o.copy_(t != 0)  # bool, or 0 / 1 in uint8


def _any_all(is_any: bool) -> None:
    name = "any" if is_any else "all"

    @defop(f"{name}.default", inplace=False, out=False)
    def whole(self: torch.Tensor) -> DataNode:
        return reduce.any_all(read(self), (), False, is_any)

    @defop(f"{name}.dim", inplace=False, out=False)
    def one(self: torch.Tensor, dim: int, keepdim: bool = False) -> DataNode:
        return reduce.any_all(read(self), (dim,), keepdim, is_any)

    @defop(f"{name}.dims", inplace=False)
    def some(self: torch.Tensor, dim: Any = None, keepdim: bool = False) -> DataNode:
        x = read(self)
        if dim is not None and not len(dim) and x.shape:  # an empty list reduces nothing
            return map_op(name, Kernel(nonzero_tile), [x], torch.uint8 if x.dtype == torch.uint8 else torch.bool)
        return reduce.any_all(x, _dims(dim), keepdim, is_any)

    forms(whole, out=f"{name}.all_out")
    forms(one, out=f"{name}.out")


_any_all(True)
_any_all(False)


def nan_to_zero_tile(o: torch.Tensor, t: torch.Tensor) -> None:
    o.copy_(t)
    o.masked_fill_(torch.isnan(t), 0)


@defop("count_nonzero.dim_IntList", inplace=False, out=False)
def _count_nonzero(self: torch.Tensor, dim: Any) -> DataNode:
    x = read(self)
    nz = map_op("count_nonzero", Kernel(nonzero_tile), [x], torch.bool)
    return reduce.sum_op(nz, _dims(dim), False, torch.int64)


@defop("nansum.default", inplace=False)
def _nansum(self: torch.Tensor, dim: Any = None, keepdim: bool = False, *,
            dtype: torch.dtype | None = None) -> DataNode:
    x = _real(self, "nansum")
    if x.dtype.is_floating_point:
        x = map_op("nansum", Kernel(nan_to_zero_tile), [x], x.dtype)
    return reduce.sum_op(x, _dims(dim), keepdim, _red_dtype(self, dtype))


def _aminmax(self: torch.Tensor, *, dim: int | None = None, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_live()
    x = _real(self, "aminmax")
    if dim is None and x.numel == 0:
        raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity.")
    dims = () if dim is None else (dim,)
    if dim is not None:
        d = wrap_dim(dim, len(x.shape))
        if x.shape and x.shape[d] == 0:
            raise IndexError(f"aminmax: Expected reduction dim {d} to have non-zero size.")
    lo = reduce.extremum(x, dims, keepdim, False, "aminmax")
    hi = reduce.extremum(x, dims, keepdim, True, "aminmax")
    return new_tensor(lo), new_tensor(hi)


register("aminmax", _aminmax)


def _correction(correction: Any) -> float:
    return 1 if correction is None else correction


@defop("var.correction", inplace=False)
def _var(self: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> DataNode:
    return reduce.moments(_real(self, "var"), _dims(dim), _correction(correction), keepdim, False, False)[0]


@defop("std.correction", inplace=False)
def _std(self: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> DataNode:
    return reduce.moments(_real(self, "std"), _dims(dim), _correction(correction), keepdim, True, False)[0]


def _moments_mean(root: bool) -> None:
    name = "std_mean" if root else "var_mean"

    def f(self: torch.Tensor, dim: Any = None, *, correction: Any = None,
          keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        check_live()
        v, m = reduce.moments(_real(self, name), _dims(dim), _correction(correction), keepdim, root, True)
        return new_tensor(v), new_tensor(m)

    register(f"{name}.correction", f)


_moments_mean(False)
_moments_mean(True)


@defop("linalg_vector_norm.default", inplace=False)
def _vector_norm(self: torch.Tensor, ord: Scalar = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: torch.dtype | None = None) -> DataNode:
    return vector_norm.vector_norm(_real(self, "linalg_vector_norm"), float(ord), _dims(dim), keepdim, dtype)


# -- softmax ---------------------------------------------------------------------


def _no_half_to_float(half_to_float: bool) -> None:
    if half_to_float:
        raise RuntimeError("softmax with half to float conversion is not supported on CPU")


@defop("_softmax.default", inplace=False)
def _softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> DataNode:
    _no_half_to_float(half_to_float)
    return softmax.softmax(read(self), dim, False)


@defop("_log_softmax.default", inplace=False)
def _log_softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> DataNode:
    _no_half_to_float(half_to_float)
    return softmax.softmax(read(self), dim, True)


@defop("_softmax_backward_data.default", inplace=False)
def _softmax_bw(grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> DataNode:
    return softmax.softmax_backward(read(grad_output), read(output), dim, False, input_dtype)


@defop("_log_softmax_backward_data.default", inplace=False)
def _log_softmax_bw(grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> DataNode:
    return softmax.softmax_backward(read(grad_output), read(output), dim, True, input_dtype)


# -- normalization -----------------------------------------------------------------


def _layer_norm(input: torch.Tensor, normalized_shape: Any, weight: torch.Tensor | None, bias: torch.Tensor | None,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_live()
    outs = norm.layer_norm(read(input), tuple(normalized_shape), read_opt(weight), read_opt(bias), eps)
    return tuple(new_tensor(n) for n in outs)  # type: ignore[return-value]


def _layer_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, normalized_shape: Any, mean: torch.Tensor,
                         rstd: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                         output_mask: Any) -> tuple[torch.Tensor | None, ...]:
    check_live()
    outs = norm.layer_norm_backward(read(grad_out), read(input), tuple(normalized_shape), read(mean), read(rstd),
                                    read_opt(weight), read_opt(bias), tuple(output_mask))
    return tuple(new_tensor(n) if n is not None else None for n in outs)


register("native_layer_norm", _layer_norm)
register("native_layer_norm_backward", _layer_norm_backward)


# -- losses -------------------------------------------------------------------------


def _nll(spatial: bool) -> None:
    stem = "nll_loss2d" if spatial else "nll_loss"

    def forward(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        check_live()
        out, tw = loss.nll_loss(read(self), read(target), read_opt(weight), reduction, ignore_index, spatial)
        return new_tensor(out), new_tensor(tw)

    register(f"{stem}_forward", forward)

    @defop(f"{stem}_backward.default", inplace=False, out=False)
    def backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                 reduction: int, ignore_index: int, total_weight: torch.Tensor) -> DataNode:
        return loss.nll_loss_backward(read(grad_output), read(self), read(target), read_opt(weight), reduction,
                                      ignore_index, read(total_weight), spatial)

    forms(backward, out=f"{stem}_backward.grad_input")


_nll(False)
_nll(True)


@defop("mse_loss.default", inplace=False)
def _mse_loss(self: torch.Tensor, target: torch.Tensor, reduction: int = 1) -> DataNode:
    return loss.mse_loss(read(self), read(target), reduction, promote(self, target))


@defop("mse_loss_backward.default", inplace=False, out=False)
def _mse_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                       reduction: int) -> DataNode:
    return loss.mse_loss_backward(read(grad_output), read(self), read(target), reduction,
                                  promote(grad_output, self, target))


forms(_mse_loss_backward, out="mse_loss_backward.grad_input")
