"""ATen table: triangles, cumulative sums and products, gather / scatter, advanced
indexing (``index``, ``index_put``), ``nonzero``, flips, rolls and constant padding,
dropout and Bernoulli draws, the embedding gradient, ``repeat_interleave``.

Ops whose result size depends on values (``nonzero``, boolean masks) count them
first: that waits for the values, as on CPU, which reads them too.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torch_nntile.backend.aten import Scalar, aten, check_live, defop, ew, forms, out_kernel, register, type_name
from torch_nntile.backend.device import (
    DEVICE,
    is_nntile,
    new_tensor,
    read,
    resize_output,
    to_cpu,
    write,
)
from torch_nntile.backend.table_data import along_dim
from torch_nntile.graph.nodes import DataNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops import index as ix
from torch_nntile.ops import reduce
from torch_nntile.ops.base import NotNative, map_op, whole_op, wrap_dim
from torch_nntile.ops.data import fill, ingress
from torch_nntile.ops.views import expand, reshape
from torch_nntile.session import SESSION_STATE


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
    return x


def _count(mask: DataNode) -> int:
    """How many items of a value are nonzero (waits for the value)."""
    nz = mask if mask.dtype == torch.bool else map_op("ne", _NONZERO, [mask], torch.bool)
    return int(SESSION_STATE.to_cpu(reduce.sum_op(nz, (), False, torch.int64)).item())


def nonzero_tile(o: torch.Tensor, t: torch.Tensor) -> None:
    torch.ne(t, 0, out=o)


_NONZERO = Kernel(nonzero_tile)


def _node(t: torch.Tensor) -> DataNode:
    """An index argument's node: nntile tensors as they are, CPU ones moved in."""
    return read(t) if t.device.type == DEVICE or t.dim() == 0 else ingress(t)


# -- tril / triu ------------------------------------------------------------------


def _tri(name: str, upper: bool) -> None:
    @defop(f"{name}.default")
    def f(self: torch.Tensor, diagonal: int = 0) -> DataNode:
        if self.dim() < 2:
            raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
        return ix.tri(read(self), int(diagonal), upper)


_tri("tril", False)
_tri("triu", True)


# -- cumulative sums and products: the dim whole, tiled over the others -------------


def cum_tile(op: Any, dim: int, dtype: torch.dtype, o: torch.Tensor, t: torch.Tensor) -> None:
    op(t, dim, dtype=dtype, out=o)


def _cum(name: str) -> None:
    fn = getattr(torch, name)

    @defop(f"{name}.default")
    def f(self: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> DataNode:
        x = read(self)
        d = wrap_dim(dim, len(x.shape))
        dt = dtype or (self.dtype if self.dtype.is_floating_point or self.dtype.is_complex else torch.int64)
        return ix.along(name, Kernel(cum_tile, fn, d, dt), [x], (d,) if x.shape else (), x.shape, dt)


_cum("cumsum")
_cum("cumprod")


# -- gather / scatter along a dim ------------------------------------------------------


def _tiled_along(d: int, index: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether every tensor has the index's rank and extents outside dim ``d``."""
    nd = index.dim()
    return nd > 0 and all(t.dim() == nd and all(t.shape[k] == index.shape[k] for k in range(nd) if k != d)
                          for t in others)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two nntile tensors share items of one storage (as CPU tells for dense ones)."""
    if not (is_nntile(a) and is_nntile(b)) or a.untyped_storage()._nnt is not b.untyped_storage()._nnt:
        return False
    if not a.numel() or not b.numel():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        lo = t.storage_offset()
        return lo, lo + 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


_OVERLAP = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
            "memory location. Please clone() the tensor before performing the operation.")


def _gather_out(self: torch.Tensor, dim: int, index: torch.Tensor, *, sparse_grad: bool = False,
                out: torch.Tensor) -> torch.Tensor:
    check_live()
    if out.dtype != self.dtype:
        raise RuntimeError(f"gather(): Expected out tensor to have dtype {self.dtype}, but got {out.dtype} instead")
    if any(st == 0 and n > 1 for n, st in zip(out.shape, out.stride())) or _overlap(out, self) or _overlap(out, index):
        raise RuntimeError(_OVERLAP)
    value = _gather(self, dim, index)
    resize_output(out, value.shape)
    write(out, value)
    return out


@defop("gather.default", inplace=False, out=False)
def _gather(self: torch.Tensor, dim: int, index: torch.Tensor, *, sparse_grad: bool = False) -> DataNode:
    aten.gather(_meta(self), dim, _meta(index))  # PyTorch's checks
    d = wrap_dim(dim, self.dim())
    kernel, nodes = out_kernel(aten.gather.out, [self, d, index])
    shape = tuple(index.shape)
    if _tiled_along(d, index, self):
        return ix.along("gather", kernel, nodes, (d,), shape, self.dtype)
    return whole_op("gather", kernel, nodes, [(shape, self.dtype, None)])[0]


register("gather.out", _gather_out)


def _scatter(name: str, out_op: Any) -> None:
    base, _, ov = name.partition(".")

    @defop(name)
    def f(self: torch.Tensor, dim: int, index: torch.Tensor, src: Any, **kw: Any) -> DataNode:
        getattr(getattr(aten, base), ov or "default")(_meta(self), dim, _meta(index), _meta(src), **kw)  # checks
        if isinstance(src, torch.Tensor) and src.dtype != self.dtype:
            raise RuntimeError(f"{base}(): Expected self.dtype to be equal to src.dtype")
        d = wrap_dim(dim, self.dim())
        kernel, nodes = out_kernel(out_op, [self, d, index, src], **kw)
        tensors = [self] + ([src] if isinstance(src, torch.Tensor) else [])
        if index.numel() and _tiled_along(d, index, *tensors):
            return ix.along(base, kernel, nodes, (d,), tuple(self.shape), self.dtype)
        return whole_op(base, kernel, nodes, [(tuple(self.shape), self.dtype, None)])[0]


for _name, _out in [("scatter.src", aten.scatter.src_out), ("scatter.value", aten.scatter.value_out),
                    ("scatter.reduce", aten.scatter.reduce_out), ("scatter.value_reduce", aten.scatter.value_reduce_out),
                    ("scatter_add.default", aten.scatter_add.out)]:
    _scatter(_name, _out)


# -- advanced indexing ---------------------------------------------------------------


class _Indices:
    """An index list (``x[i, None, mask]`` as ATen gets it), checked as PyTorch checks it:
    which entries are tensors, the dims of ``x`` they index, their broadcast shape
    (a boolean mask counts as one index of its count of true items), the result's shape."""

    def __init__(self, x: torch.Tensor, indices: list[torch.Tensor | None]) -> None:
        nd = x.dim()
        self.pattern: list[bool] = []
        self.dims: list[int] = []
        self.nodes: list[DataNode] = []
        shapes: list[tuple[int, ...]] = []
        d = 0
        for t in indices:
            if t is None:
                self.pattern.append(False)
                d += 1
                continue
            if t.dtype not in (torch.int64, torch.int32, torch.uint8, torch.bool):
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            self.pattern.append(True)
            node = _node(t)
            self.nodes.append(node)
            if t.dtype in (torch.uint8, torch.bool):
                if t.dim() == 0:
                    raise NotNative("a 0-dim boolean index")
                if d + t.dim() > nd:
                    raise IndexError(f"too many indices for tensor of dimension {nd} (got {d + t.dim()})")
                for k, s in enumerate(t.shape):
                    if s != x.shape[d + k]:
                        raise IndexError(f"The shape of the mask {list(t.shape)} at index {k} does not match the "
                                         f"shape of the indexed tensor {list(x.shape)} at index {d + k}")
                self.dims += range(d, d + t.dim())
                d += t.dim()
                shapes.append((_count(node),))
            else:
                self.dims.append(d)
                d += 1
                shapes.append(tuple(t.shape))
        if d > nd:
            raise IndexError(f"too many indices for tensor of dimension {nd} (got {d})")
        try:
            self.bshape = tuple(torch.broadcast_shapes(*shapes)) if shapes else ()
        except RuntimeError:
            raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                             + ", ".join(str(list(s)) for s in shapes)) from None
        start, kept = ix.index_layout(nd, tuple(self.dims), self.bshape) if shapes else (0, {})
        shape = [0] * (nd - len(self.dims) + len(self.bshape))
        for xd, od in kept.items():
            shape[od] = x.shape[xd]
        shape[start:start + len(self.bshape)] = self.bshape
        self.shape = tuple(shape)


@defop("index.Tensor", inplace=False)
def _index(self: torch.Tensor, indices: list[torch.Tensor | None]) -> DataNode:
    ind = _Indices(self, list(indices))
    if not ind.nodes:
        return read(self)
    return ix.index(read(self), tuple(ind.pattern), tuple(ind.dims), ind.nodes, ind.shape, ind.bshape)


def _index_put_value(self: torch.Tensor, indices: list[torch.Tensor | None], values: torch.Tensor,
                     accumulate: bool = False, unsafe: bool = False) -> DataNode:
    if values.dtype != self.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{type_name(self.dtype)} for the destination and {type_name(values.dtype)} for the source.")
    ind = _Indices(self, list(indices))
    v = read(values)
    if not ind.nodes:  # no index tensors: all of x
        return expand(v, tuple(self.shape)) if not accumulate else ew("add", torch.add, [self, values], self.dtype)
    shape = ind.shape
    if len(v.shape) > len(shape) or any(a != b and a != 1 for a, b in zip(reversed(v.shape), reversed(shape))):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(v.shape)} cannot be broadcast to indexing "
                           f"result of shape {list(shape)}")
    return ix.index_put(read(self), tuple(ind.pattern), tuple(ind.dims), ind.nodes, expand(v, shape), ind.bshape,
                        accumulate)


defop("index_put.default")(_index_put_value)
forms(_index_put_value, inplace="_index_put_impl_")


@defop("nonzero.default", inplace=False)
def _nonzero(self: torch.Tensor) -> DataNode:
    x = read(self)
    n = _count(x)
    kernel, nodes = out_kernel(aten.nonzero.out, [self])
    return whole_op("nonzero", kernel, nodes, [((n, len(x.shape)), torch.int64, None)])[0]


def _bincount(self: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0) -> torch.Tensor:
    """Counts (or sums of ``weights``) per value: the length is read back (the smallest
    and largest value, one wait), then an ``index_add_`` into zeros, tiled."""
    check_live()
    if self.dtype.is_floating_point or self.dtype.is_complex or self.dtype == torch.bool:
        raise NotImplementedError(f'"bincount_cpu" not implemented for \'{type_name(self.dtype)}\'')
    if self.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    n = minlength
    if self.numel():
        lo, hi = torch.stack([self.min(), self.max()]).cpu().tolist()
        if lo < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        n = max(n, hi + 1)
    if weights is None:
        dtype = torch.int64
    else:
        dtype = weights.dtype if weights.dtype in (torch.float32, torch.float64) else torch.float64
    src = torch.ones_like(self, dtype=dtype) if weights is None else weights.to(dtype)
    return torch.zeros(n, dtype=dtype, device=self.device).index_add_(0, self.long(), src)


register("bincount", _bincount)


# -- flip, roll, constant padding: box copies, tiled -------------------------------------


@defop("flip.default", inplace=False)
def _flip(self: torch.Tensor, dims: list[int]) -> DataNode:
    aten.flip(_meta(self), dims)  # PyTorch's checks
    x = read(self)
    return ix.flip(x, tuple(sorted({wrap_dim(d, len(x.shape)) for d in dims}))) if x.shape else x


@defop("roll.default", inplace=False)
def _roll(self: torch.Tensor, shifts: list[int], dims: list[int] = ()) -> DataNode:
    aten.roll(_meta(self), shifts, dims)  # PyTorch's checks
    x = read(self)
    if not x.numel:
        return x
    if not dims:  # over the flattened value
        return reshape(ix.roll(reshape(x, (x.numel,)), {0: int(shifts[0])}), x.shape)
    by_dim: dict[int, int] = {}
    for s, d in zip(shifts, dims):
        w = wrap_dim(d, len(x.shape))
        by_dim[w] = by_dim.get(w, 0) + int(s)
    return ix.roll(x, by_dim)


@defop("constant_pad_nd.default", inplace=False)
def _constant_pad_nd(self: torch.Tensor, pad: list[int], value: Scalar = 0) -> DataNode:
    shape = tuple(aten.constant_pad_nd(_meta(self), pad, value).shape)  # PyTorch's checks and size rule
    nd = self.dim()
    pads = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        pads[nd - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return ix.constant_pad(read(self), pads, value, shape)


# -- dropout and Bernoulli draws: masks from the CPU generator, as CPU draws them -----------


def dropout_tile(scale: float, o: torch.Tensor, x: torch.Tensor, m: torch.Tensor) -> None:
    torch.mul(x, m, out=o)  # CPU: input.mul(mask).mul_(scale)
    o.mul_(scale)


def dropout_backward_tile(scale: float, o: torch.Tensor, g: torch.Tensor, m: torch.Tensor) -> None:
    torch.mul(g, m.to(g.dtype) * scale, out=o)  # CPU: grad_output * (mask.type_as(grad_output) * scale)


# In C (float32 with a bool mask, read as 0 and 1), in the same order of roundings.
native.TRANSLATORS[dropout_tile] = lambda p, params, refs: p.emit(native.MUL, p.emit(native.MUL, *refs), params[0])
native.TRANSLATORS[dropout_backward_tile] = lambda p, params, refs: p.emit(
    native.MUL, refs[0], p.emit(native.MUL, refs[1], params[0]))


def _native_dropout(input: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU's native_dropout: a bool mask drawn by ``bernoulli_(1 - p)`` on the CPU (the
    same draws, so the same mask for the same seed), then ``input * mask * scale``."""
    check_live()
    x = read(input)
    shape = x.shape
    if not x.numel:
        return new_tensor(x), new_tensor(fill(shape, x.dtype, 0))
    if train is not None and not train:
        return new_tensor(x), new_tensor(fill(shape, torch.bool, True))
    p1m = 1.0 - p
    scale = 0.0 if p1m == 0 else 1.0 / p1m
    mask = ingress(torch.empty(shape, dtype=torch.bool).bernoulli_(p1m))
    out = map_op("native_dropout", Kernel(dropout_tile, scale), [x, mask], x.dtype)
    return new_tensor(out), new_tensor(mask)


register("native_dropout", _native_dropout)


@defop("native_dropout_backward.default")
def _native_dropout_backward(grad_output: torch.Tensor, mask: torch.Tensor, scale: float) -> DataNode:
    return map_op("native_dropout_backward", Kernel(dropout_backward_tile, float(scale)),
                  [read(grad_output), read(mask)], grad_output.dtype)


def _cpu_probabilities(p: Any) -> Any:
    return to_cpu(p) if is_nntile(p) else p


@defop("bernoulli.default", inplace=False)
def _bernoulli(self: torch.Tensor, *, generator: Any = None) -> DataNode:
    """Draws with the probabilities ``self`` (read back: the draws depend on them)."""
    return ingress(torch.bernoulli(to_cpu(self), generator=generator))


@defop("bernoulli.p", inplace=False)
def _bernoulli_p(self: torch.Tensor, p: float, *, generator: Any = None) -> DataNode:
    return ingress(torch.empty(tuple(self.shape), dtype=self.dtype).bernoulli_(p, generator=generator))


@defop("bernoulli.Tensor", inplace=False)
def _bernoulli_tensor(self: torch.Tensor, p: torch.Tensor, *, generator: Any = None) -> DataNode:
    cpu = torch.empty(tuple(self.shape), dtype=self.dtype)
    return ingress(cpu.bernoulli_(_cpu_probabilities(p), generator=generator))


forms(_bernoulli_tensor, inplace="bernoulli_.Tensor")


# -- the embedding gradient, tiled along the embedding dim ------------------------------------


@defop("embedding_dense_backward.default", inplace=False)
def _embedding_dense_backward(grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int,
                              scale_grad_by_freq: bool) -> DataNode:
    if indices.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"embedding_dense_backward(): Expected dtype int32 or int64 for indices, got "
                           f"{indices.dtype}")
    g, i = read(grad_output), read(indices)
    if not g.shape or math.prod(g.shape[:-1]) != i.numel:
        return whole_op("embedding_dense_backward", *out_kernel(
            aten.embedding_dense_backward.out, [grad_output, indices, num_weights, padding_idx, scale_grad_by_freq]),
            [((int(num_weights), grad_output.shape[-1]), g.dtype, None)])[0]
    return ix.embedding_backward(g, i, int(num_weights), int(padding_idx), bool(scale_grad_by_freq))


# -- repeat_interleave ---------------------------------------------------------------------


@defop("repeat_interleave.Tensor", inplace=False)
def _repeat_interleave(repeats: torch.Tensor, *, output_size: int | None = None) -> DataNode:
    if output_size is None:  # the size depends on the values: read them (a short vector) and count on the CPU
        return ingress(torch.repeat_interleave(to_cpu(repeats)))
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int64, torch.int32):
        raise RuntimeError("repeats has to be Long or Int tensor")
    kernel, nodes = out_kernel(aten.repeat_interleave.Tensor_out, [repeats], output_size=int(output_size))
    return whole_op("repeat_interleave", kernel, nodes, [((int(output_size),), repeats.dtype, None)])[0]



# -- index_copy / index_fill along a dim ------------------------------------------------


@defop("index_copy.default")
def _index_copy(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> DataNode:
    aten.index_copy(_meta(self), dim, _meta(index), _meta(source))  # PyTorch's checks
    d = wrap_dim(dim, self.dim())
    kernel, nodes = out_kernel(aten.index_copy.out, [self, d, index, source])
    return along_dim("index_copy", kernel, nodes, index, d, tuple(self.shape), self.dtype, read(self).axes)


def _index_fill(ov: str) -> None:
    @defop(f"index_fill.{ov}")
    def f(self: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> DataNode:
        if isinstance(value, torch.Tensor) and value.dim() != 0:
            raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                               f"{value.dim()} dimension(s).")
        if index.dim() > 1:
            raise IndexError("Index is supposed to be a vector")
        if index.dtype != torch.int64:
            raise IndexError("index_fill_(): Expected dtype int64 for index.")
        d = wrap_dim(dim, self.dim())
        kernel, nodes = out_kernel(getattr(aten.index_fill, f"{ov}_out"), [self, d, index, value])
        return along_dim("index_fill", kernel, nodes, index, d, tuple(self.shape), self.dtype, read(self).axes)


_index_fill("int_Scalar")
_index_fill("int_Tensor")


# -- unique: the result's size depends on every value: computed from a read-back -----------


def _on_cpu(op: Any) -> Any:
    def f(self: torch.Tensor, *args: Any, **kw: Any) -> Any:
        check_live()
        out = op(to_cpu(self), *args, **kw)
        return tuple(new_tensor(ingress(t)) for t in out)
    return f


register("_unique", _on_cpu(aten._unique.default))
register("_unique2", _on_cpu(aten._unique2.default))


# -- membership (generate()'s stopping criteria) ---------------------------------------


@defop("isin.Tensor_Tensor", inplace=False)
def _isin(elements: torch.Tensor, test_elements: torch.Tensor, *, assume_unique: bool = False,
          invert: bool = False) -> DataNode:
    """Tiled like ``elements``; every task reads all of ``test_elements``."""
    kernel, nodes = out_kernel(torch.isin, [elements, test_elements], assume_unique=assume_unique, invert=invert)
    return ix.along("isin", kernel, nodes, (), tuple(elements.shape), torch.bool, whole=(1,))


@defop("isin.Tensor_Scalar", inplace=False)
def _isin_scalar(elements: torch.Tensor, test_element: Scalar, *, assume_unique: bool = False,
                 invert: bool = False) -> DataNode:
    return ew("isin", torch.isin, [elements, test_element], torch.bool, assume_unique=assume_unique, invert=invert)


@defop("isin.Scalar_Tensor", inplace=False)
def _isin_of_scalar(element: Scalar, test_elements: torch.Tensor, *, assume_unique: bool = False,
                    invert: bool = False) -> DataNode:
    kernel, nodes = out_kernel(torch.isin, [element, test_elements], assume_unique=assume_unique, invert=invert)
    return whole_op("isin", kernel, nodes, [((), torch.bool, None)])[0]
