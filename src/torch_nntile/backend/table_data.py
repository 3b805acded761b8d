"""ATen table: factories, fills, copies and casts, random fills, index ops, cat, and
views (metadata over their base's storage, in C++ where built)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.backend.aten import META, REGISTERED, Scalar, aten, check_live, defop, out_kernel, promote, register, type_name
from torch_nntile.backend.device import (
    DEVICE,
    NATIVE,
    cast,
    from_cpu,
    is_nntile,
    new_tensor,
    read,
    reserve,
    resize,
    resize_output,
    to_cpu,
    write,
)
from torch_nntile.graph.axes import new_group
from torch_nntile.graph.nodes import DataNode
from torch_nntile.kernels import native
from torch_nntile.ops import index as ix
from torch_nntile.ops import reduce, views
from torch_nntile.ops.base import whole_op, wrap_dim
from torch_nntile.ops.data import arange, fill, ingress
from torch_nntile.ops.views import expand
from torch_nntile.session import SESSION_STATE

# -- fills, copies, conversions --------------------------------------------------


def _fill_value(value: Any) -> Scalar:
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with {value.dim()} dimensions.")
        return value.item() if value.device.type != DEVICE else to_cpu(value).item()
    return value


@defop("fill.Scalar", "fill.Tensor")
def _fill(self: torch.Tensor, value: Any) -> DataNode:
    return fill(tuple(self.shape), self.dtype, _fill_value(value))


@defop("zero.default")
def _zero(self: torch.Tensor) -> DataNode:
    return fill(tuple(self.shape), self.dtype, 0)


def _empty(size: Any, dtype: torch.dtype | None = None, layout: Any = None, device: Any = None,
           pin_memory: Any = None, memory_format: Any = None) -> torch.Tensor:
    check_live()
    dt = dtype or torch.get_default_dtype()
    shape = tuple(int(s) for s in size)
    if any(s < 0 for s in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(shape)}: {list(shape)}")
    return new_tensor(fill(shape, dt, 0))


def _empty_strided(size: Any, stride: Any, dtype: torch.dtype | None = None, layout: Any = None,
                   device: Any = None, pin_memory: Any = None) -> torch.Tensor:
    return _empty(size, dtype)


register("empty.memory_format", _empty)
register("_efficientzerotensor", _empty)  # autograd's zero gradients: plain zeros here
register("empty_strided", _empty_strided)


def _copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    check_live()
    if self.device.type != DEVICE:
        return self.copy_(to_cpu(src))
    value = read(src) if is_nntile(src) else ingress(src)
    write(self, value)
    return self


register("copy_", _copy_)


def _to_copy(self: torch.Tensor, *, dtype: torch.dtype | None = None, layout: Any = None, device: Any = None,
             pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None) -> torch.Tensor:
    check_live()
    dev = torch.device(device) if device is not None else self.device
    if dev.type == DEVICE:
        if self.device.type != DEVICE:
            t = from_cpu(self if dtype is None else self.to(dtype))
            return t
        node = read(self)
        return new_tensor(cast(node, dtype) if dtype is not None and dtype != node.dtype else node)
    if dev.type != "cpu":
        raise RuntimeError(f"torch_nntile: copies from nntile go to the CPU only, not to {dev}")
    cpu = to_cpu(self)
    return cpu.to(dtype) if dtype is not None else cpu


register("_to_copy", _to_copy)


def _clone(self: torch.Tensor, *, memory_format: Any = None) -> torch.Tensor:
    check_live()
    return new_tensor(read(self))  # values are immutable: a clone shares the node


register("clone", _clone)


_ARANGE_FAST = (torch.int64, torch.int32, torch.float32, torch.float64)


def _arange_len(start: Scalar, end: Scalar, step: Scalar, dtype: torch.dtype) -> int:
    """How many values ``arange`` makes: counted here for small integer bounds (a
    causal mask's positions, every step), else by PyTorch's own rule and checks on
    the meta device (40 us a call, most of the op's record time)."""
    if (type(start) is int and type(end) is int and type(step) is int and dtype in _ARANGE_FAST
            and step and max(abs(start), abs(end)) < 1 << 24):
        d = end - start
        if d == 0 or (d > 0) == (step > 0):
            return (d + step - 1) // step if step > 0 else (d + step + 1) // step
    return torch.arange(start, end, step, dtype=dtype, device="meta").shape[0]


def _arange_out(start: Scalar, end: Scalar, step: Scalar = 1, *, out: torch.Tensor) -> torch.Tensor:
    check_live()
    n = _arange_len(start, end, step, out.dtype)
    resize_output(out, (n,))
    write(out, arange(n, start, step, out.dtype))
    return out


register("arange.start_out", _arange_out)


@defop("index_add.default")
def _index_add(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *,
               alpha: Scalar = 1) -> DataNode:
    x, i, src = read(self), read(index), read(source)
    d = wrap_dim(dim, len(x.shape))
    torch.index_add(torch.empty(x.shape, dtype=x.dtype, device="meta"), d,
                    torch.empty(i.shape, dtype=i.dtype, device="meta"),
                    torch.empty(src.shape, dtype=src.dtype, device="meta"), alpha=alpha)  # PyTorch's checks
    if len(src.shape) != len(x.shape) and src.numel > 1 or any(
            a != b for k, (a, b) in enumerate(zip(x.shape, src.shape)) if k != d):
        raise RuntimeError(f"source tensor shape must match self tensor shape, excluding the specified dimension. "
                           f"Got self.shape = {list(x.shape)} source.shape = {list(src.shape)}")
    kernel, nodes = out_kernel(torch.index_add, [self, d, index, source], alpha=alpha)
    return along_dim("index_add", kernel, nodes, index, d, x.shape, x.dtype, x.axes)


def along_dim(name: str, kernel: Any, nodes: list[DataNode], index: torch.Tensor, d: int, shape: tuple[int, ...],
              dtype: torch.dtype, axes: Any = None, rows: bool = False) -> DataNode:
    """An index op along dim ``d``: tiled over the other dims where its tensors share them
    (the index vector, and 0-dim values, go whole to every tile), else one task (whose
    output takes the axis groups ``axes``, or new ones). ``rows``: the output's dim ``d``
    holds a row per entry of the index vector (``index_select``), so it shares the
    vector's axis group and is tiled with it, each task reading its rows' index tile."""
    nd = len(shape)
    inode = read(index) if is_nntile(index) else None
    whole = tuple(k for k, n in enumerate(nodes) if n is inode or not n.shape)
    tiled = [n for k, n in enumerate(nodes) if k not in whole]
    if nd and all(len(n.shape) == nd and all(a == b for k, (a, b) in enumerate(zip(n.shape, shape)) if k != d)
                  for n in tiled):
        follow = None
        if rows and inode is not None and len(inode.shape) == 1 and inode.shape[0] == shape[d]:
            follow = (max(k for k, n in enumerate(nodes) if n is inode), d)
        return ix.along(name, kernel, nodes, (d,), shape, dtype, whole, follow)
    return whole_op(name, kernel, nodes, [(shape, dtype, axes)])[0]


def _check_index(index: torch.Tensor, op: str) -> None:
    if index.dim() > 1:
        raise IndexError(f"{op}(): Index is supposed to be a vector")
    if index.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{op}(): Expected dtype int32 or int64 for index")


def _index_select_rows(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
                       dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple[float, ...]] | None:
    """Rows of a float32 tile picked along dim 0 run in C (an embedding's lookup)."""
    _, d, _ = args
    if len(shapes) != 3:  # a 0-dim CPU index is baked into the kernel
        return None
    o, w, i = shapes
    if d != 0 or kw or dtypes[:2] != (torch.float32, torch.float32) or dtypes[2] not in native.INDEX_DTYPES \
            or len(w) < 1 or len(i) > 1:
        return None
    return [native.GATHER, native.numel(i), native.numel(w[1:]), w[0], int(dtypes[2] is torch.int64)], ()


native.CALLS[torch.index_select] = _index_select_rows


@defop("index_select.default", inplace=False)
def _index_select(self: torch.Tensor, dim: int, index: torch.Tensor) -> DataNode:
    if not is_nntile(index) and index.dim():  # F.embedding's lookup with CPU ids lands here
        raise RuntimeError(f"Expected all tensors to be on the same device, but found tensors on {index.device} and "
                           "nntile:0 (index_select, an embedding's lookup: indices must be on device nntile)")
    x, i = read(self), read(index)
    d = wrap_dim(dim, len(x.shape))
    _check_index(index, "index_select")
    shape = list(x.shape)
    if shape:
        shape[d] = i.numel
    kernel, nodes = out_kernel(torch.index_select, [self, d, index])
    return along_dim("index_select", kernel, nodes, index, d, tuple(shape), x.dtype, rows=True)


def _fill_axes(axes: tuple[Any, ...], shape: list[int]) -> tuple[Any, ...]:
    """Kept groups where given, new groups for the dims an op makes (``None``)."""
    return tuple(a if a is not None else new_group(s) for a, s in zip(axes, shape))


@defop("masked_select.default", inplace=False)
def _masked_select(self: torch.Tensor, mask: torch.Tensor) -> DataNode:
    """The output's length depends on the mask's values: counting them waits for them."""
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    x, m = read(self), read(mask)
    bm = expand(m, tuple(shape)) if m.shape != tuple(shape) else m
    n = int(SESSION_STATE.to_cpu(reduce.sum_op(bm, (), False, torch.int64)).item())
    kernel, nodes = out_kernel(torch.masked_select, [self, mask])
    return whole_op("masked_select", kernel, nodes, [((n,), x.dtype, None)])[0]


def _legacy_empty(t: torch.Tensor) -> bool:
    return t.dim() == 1 and t.shape[0] == 0  # cat skips such tensors, whatever the others' shapes


@defop("cat.default", inplace=False)
def _cat(tensors: list[torch.Tensor], dim: int = 0) -> DataNode:
    for i, t in enumerate(tensors):
        if t.dim() == 0:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    dtype = promote(*tensors)
    kept = [(i, t) for i, t in enumerate(tensors) if not _legacy_empty(t)]
    if not kept:
        return cast(read(tensors[0]), dtype)
    ref = kept[0][1]
    d = wrap_dim(dim, ref.dim())
    for i, t in kept[1:]:
        if t.dim() != ref.dim():
            raise RuntimeError(f"Tensors must have same number of dimensions: got {ref.dim()} and {t.dim()}")
        for k, (a, b) in enumerate(zip(ref.shape, t.shape)):
            if k != d and a != b:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected size {a} but got "
                                   f"size {b} for tensor number {i} in the list.")
    if len(kept) == 1:  # a cache's first update, cat([empty, x]): x's value (immutable, as clone shares it)
        x = read(kept[0][1])
        return x if x.dtype == dtype else cast(x, dtype)
    return views.cat([read(t) for _, t in kept], d, dtype)


@defop("masked_scatter.default")
def _masked_scatter(self: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> DataNode:
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_scatter_ only supports boolean masks, but got mask with dtype "
                           f"{str(mask.dtype).removeprefix('torch.')}")
    if self.dtype != source.dtype:
        raise RuntimeError(f"masked_scatter_: expected self and source to have same dtypes but got "
                           f"{type_name(self.dtype)} and {type_name(source.dtype)}")
    shape = tuple(torch.broadcast_shapes(self.shape, mask.shape))
    kernel, nodes = out_kernel(aten.masked_scatter.out, [self, mask, source])
    return whole_op("masked_scatter", kernel, nodes, [(shape, self.dtype, None)])[0]


@defop("narrow_copy.default", inplace=False)
def _narrow_copy(self: torch.Tensor, dim: int, start: int, length: int) -> DataNode:
    # CPU's kernel: a negative dim is wrapped (IndexError), too large a one fails a check
    # (RuntimeError); PyTorch's composite kernel, which other devices run, raises IndexError for both.
    if dim < 0:
        dim = wrap_dim(dim, self.dim())
    elif dim >= self.dim():
        raise RuntimeError("Expected dim < static_cast<int64_t>(self_sizes.size()) to be true, but got false.")
    return read(self.narrow(dim, start, length))


def _local_scalar_dense(self: torch.Tensor) -> Scalar:
    check_live()
    return to_cpu(self).item()


register("_local_scalar_dense", _local_scalar_dense)


def _random_inplace(name: str) -> None:
    """In-place random fills draw from the CPU generator, then move the values in."""

    base, _, ov = name.partition(".")
    fill_ = getattr(getattr(aten, base), ov or "default")

    def f(self: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        check_live()
        cpu = torch.empty(tuple(self.shape), dtype=self.dtype)
        fill_(cpu, *args, **kw)
        write(self, ingress(cpu))
        return self

    register(name, f)


for _name in ("normal_", "uniform_", "bernoulli_.float", "random_", "random_.from", "random_.to", "exponential_",
              "cauchy_", "geometric_", "log_normal_"):
    _random_inplace(_name)


# -- views: metadata over the same storage ---------------------------------------

_VIEWS = ("view", "_reshape_alias", "as_strided")
"""Views registered from C++ (``csrc/views.cpp``) where the backend's C++ library was built."""


def _meta_view(op: Any) -> Callable[..., torch.Tensor]:
    def f(*args: Any, **kw: Any) -> torch.Tensor:
        return op.redispatch(META, *args, **kw)
    return f


def _as_strided(self: torch.Tensor, size: Any, stride: Any, storage_offset: int | None = None) -> torch.Tensor:
    """A view of any geometry; one reaching past the storage raises as on CPU."""
    offset = self.storage_offset() if storage_offset is None else storage_offset
    need, have = _buf_extent(size, stride, offset) * self.element_size(), self.untyped_storage().nbytes()
    if need > have:
        raise RuntimeError(f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and "
                           f"itemsize {self.element_size()} requiring a storage size of {need} are out of bounds "
                           f"for storage of size {have}")
    return aten.as_strided.default.redispatch(META, self, size, stride, storage_offset)


if NATIVE:  # the backend's C++ library, loaded by ``device``, registered them
    REGISTERED.update(_VIEWS)
else:
    for _name in ("view", "_reshape_alias"):
        register(_name, _meta_view(getattr(aten, _name).default))
    register("as_strided", _as_strided)


def _as_strided_(self: torch.Tensor, size: Any, stride: Any, storage_offset: int | None = None) -> torch.Tensor:
    """In-place view (``squeeze_``, ``t_``, ... come here): new geometry, same storage."""
    check_live()
    offset = self.storage_offset() if storage_offset is None else storage_offset
    reserve(self, _buf_extent(size, stride, offset))
    return aten.as_strided_.default.redispatch(META, self, size, stride, storage_offset)


def _buf_extent(size: Any, stride: Any, offset: int) -> int:
    """Items of storage a geometry reaches (0 for an empty one)."""
    if any(s == 0 for s in size):
        return 0
    return offset + 1 + sum((s - 1) * st for s, st in zip(size, stride))


def _resize_(self: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    check_live()
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(size)}: {list(size)}")
    resize(self, tuple(int(s) for s in size))
    return self


register("as_strided_", _as_strided_)
register("resize_", _resize_)
register("unfold", _meta_view(aten.unfold.default))  # a view: windows over the same storage


def _unfold_backward(grad: torch.Tensor, input_sizes: Any, dim: int, size: int, step: int) -> torch.Tensor:
    """The gradient of ``unfold``: each window's values added where they came from. Window
    position ``k`` of every window is a strided slice of the input (no two windows share
    one), so ``size`` strided in-place additions do it, whatever the overlap."""
    check_live()
    out = grad.new_zeros(list(input_sizes))
    if not input_sizes:  # a 0-dim input: one window of one value
        return out.add_(grad.reshape(()))
    dim = wrap_dim(dim, len(input_sizes))
    windows = grad.shape[dim]
    if windows == 0:
        return out
    lead = (slice(None),) * dim
    for k in range(size):
        out[lead + (slice(k, k + (windows - 1) * step + 1, step),)].add_(grad.select(-1, k))
    return out


register("unfold_backward", _unfold_backward)
