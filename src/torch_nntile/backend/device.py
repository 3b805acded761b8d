"""The ``nntile`` device: registration, and the link from a tensor to its graph node.

Every nntile tensor is a plain ``torch.Tensor`` whose storage holds no bytes (it
reports a CPU tensor's size; the data lives in tiles). Its value is a ``Buf`` hung on
the storage object, so views, ``.detach()``, ``.data`` and
autograd's saved tensors (which all share the storage) share it too. The Buf
holds the current node of the *base* (the contiguous tensor the storage was made
for); a view reads and writes through its geometry over that base.

Each storage with bytes has an address of its own (``untyped_storage().data_ptr()``,
and ``data_ptr()`` offset by the storage offset, as on CPU), so code that tells
storages apart by address (HuggingFace's tied-weight detection in ``save_pretrained``,
safetensors' shared-tensor check) sees one storage per storage. The addresses are
fake: nothing reads through them (every kernel on an nntile tensor is ours), and
they lie above 2**57, outside any process's address space, so a read through one
would fault at once instead of reading someone else's memory.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import warnings

import torch
from torch.utils.backend_registration import _DummyDeviceGuard, _DummyPrivateUse1Hook

from torch_nntile import stats
from torch_nntile.backend.device_module import DEVICE, BackendModule
from torch_nntile.backend.native_lib import native_library
from torch_nntile.graph.nodes import DataNode
from torch_nntile.kernels import Kernel, native, typed
from torch_nntile.ops.base import TILE, call_out, map_op
from torch_nntile.ops.data import fill, ingress
from torch_nntile.ops.index import COPY, copy_tile
from torch_nntile.ops.views import expand, read_view, reshape, write_view
from torch_nntile.session import SESSION_STATE


def _register() -> bool:
    """Name PrivateUse1 ``nntile`` and give it what PyTorch expects of a backend: the
    ``torch.nntile`` module, ``Tensor.nntile()``, a device guard and hooks. The steps of
    ``_setup_privateuseone_for_python_backend``, except that the hooks come from the C++
    library where it was built (PyTorch takes one hooks object per process, and only C++
    hooks can hand out pinned memory). Returns whether that library is loaded."""
    lib = native_library()
    if torch._C._get_privateuse1_backend_name() == DEVICE:  # this module imported again
        return lib is not None and os.path.realpath(lib) in torch.ops.loaded_libraries
    torch.utils.rename_privateuse1_backend(DEVICE)
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module(DEVICE, BackendModule)
    if lib is not None:  # its static registrars run on load: the view kernels (csrc/views.cpp),
        try:  # the C++ device guard (csrc/device_guard.cpp), the hooks (csrc/hooks.cpp)
            torch.ops.load_library(lib)
            return True
        except OSError as e:  # nothing of it ran: a build older than its torch record, for another torch
            warnings.warn(f"torch_nntile: running without its C++ library, which does not load: {e.__cause__ or e}",
                          RuntimeWarning, stacklevel=2)
    torch._C._acc.register_python_privateuseone_hook(_DummyPrivateUse1Hook())
    torch._C._acc.register_python_privateuseone_device_guard(_DummyDeviceGuard())
    _pin_in_python()
    return False


def _pin_in_python() -> None:
    """Without the C++ library there is no pinned-memory allocator, and PyTorch asks the
    current accelerator (nntile) for one on every ``Tensor.pin_memory()`` (as
    ``DataLoader(pin_memory=True)`` does). nntile reads host memory as it is, so pinning
    for it is a plain contiguous copy; pinning for another device type is refused by name."""
    def pin(self: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
        if device is not None and torch.device(device).type != DEVICE:
            raise NotImplementedError(f"torch_nntile: pinning memory for {device} needs the backend's C++ library")
        return self.clone(memory_format=torch.contiguous_format)

    _PIN_LIB.impl("_pin_memory", pin, "CPU")


_PIN_LIB = torch.library.Library("aten", "IMPL")
NATIVE = _register()
_create = torch._C._acc.create_empty_tensor
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_AS_STRIDED_ = torch.ops.aten.as_strided_.default._handle.redispatch_boxed
_storage_at = torch._C._construct_storage_from_data_pointer  # a non-owning storage over an address
NNTILE = torch.device(DEVICE, 0)  # the one device of this backend


def _address_classes() -> list[itertools.count]:
    """Fake storage addresses, by size class: a storage of ``n`` bytes takes the next
    address of class ``k = n.bit_length()`` (class ``k`` hands out ``2**k``-byte slots
    in its own ``2**57``-byte region), so the byte ranges of live storages never
    overlap and an address is never handed out twice (2**45 storages of the smallest
    class, 2**11 of the largest, 64 TiB). All below 2**63 (a C ``int64_t``)."""
    regions = {k: itertools.count((k - 11) << 57, 1 << k) for k in range(12, 47)}
    return [regions[min(max(k, 12), 46)] for k in range(65)]


_ADDRESS = _address_classes()


class Buf:
    """The payload of one storage: the current node of its base tensor, and the
    context generation it belongs to (its value dies with that context)."""

    __slots__ = ("node", "views", "generation", "__weakref__")

    def __init__(self, node: DataNode) -> None:
        self.node = node
        self.views: dict[tuple, DataNode] | None = None  # (shape, strides, offset) -> node; made on first view
        self.generation = SESSION_STATE.generation


def new_tensor(node: DataNode) -> torch.Tensor:
    """A fresh nntile tensor whose value is ``node``.

    Its storage holds no bytes (values live in tiles) but reports the size a CPU
    tensor's would: PyTorch's C++ code sizes copies and checks in-place geometry
    changes by it (``clone_preserve_strides``, ``as_strided_``). It also has an
    address of its own (see the module docstring)."""
    t = _create(list(node.shape), node.dtype)  # contiguous, on a storage of 0 bytes
    nbytes = node.numel * node.dtype.itemsize
    if not nbytes:
        t.untyped_storage()._nnt = Buf(node)
    elif _SWAP:  # the storage takes over the size and address of a non-owning one
        st = t.untyped_storage()
        st._nnt = Buf(node)
        st._swap_data_ptr_(_storage_at(next(_ADDRESS[nbytes.bit_length()]), NNTILE, nbytes))
    elif _PLACE is not None:
        t.untyped_storage()._nnt = Buf(node)
        _PLACE(t, next(_ADDRESS[nbytes.bit_length()]), nbytes)
    else:
        st = _storage_at(next(_ADDRESS[nbytes.bit_length()]), NNTILE, nbytes)
        st._nnt = Buf(node)
        _move(t, st)
    return t


# How a storage gets its size and fake address. torch 2.13 swaps them in from a storage
# made over the address; torch 2.11 has no swap, and there the C++ library sets them
# (csrc/views.cpp) or, without it, a tensor moves onto a storage made over the address.
_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_")
_PLACE = None if _SWAP or not NATIVE else getattr(torch.ops.torch_nntile_native, "place_storage", None)
_PLACE = None if _PLACE is None else _PLACE.default
_SET_ = torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed


def _move(t: torch.Tensor, st: torch.UntypedStorage) -> None:
    """Put ``t``, geometry kept, on storage ``st`` (which must be large enough for it).

    ATen's Meta ``set_`` does it for any device, but insists that a storage it may have
    to grow be resizable, and a storage over an address never is: so ``t`` moves on as
    an empty tensor and gets its geometry back by ``as_strided_``, which only checks
    that the geometry fits."""
    shape, stride, offset = list(t.shape), list(t.stride()), t.storage_offset()
    _SET_(_META, t, st, offset, [0], [1])
    _AS_STRIDED_(_META, t, shape, stride, offset)


def _grow(t: torch.Tensor, nbytes: int) -> None:
    """Give ``t``'s storage ``nbytes`` bytes and a new address, as a CPU realloc would:
    every tensor on that storage sees them.

    Storages are not resizable (a storage over an address never is), so the size
    comes in by swapping: first a 0-byte one out, then the new size in. With neither
    the swap nor the C++ library (torch 2.11 without it), ``t`` alone moves to a new
    storage with the same payload: its views keep the old address and size, but read
    and write the same value."""
    address = next(_ADDRESS[nbytes.bit_length()])
    st = t.untyped_storage()
    if _SWAP:
        if st.nbytes():
            st._swap_data_ptr_(_storage_at(0, NNTILE, 0))
        st._swap_data_ptr_(_storage_at(address, NNTILE, nbytes))
    elif _PLACE is not None:
        _PLACE(t, address, nbytes)
    else:
        new = _storage_at(address, NNTILE, nbytes)
        new._nnt = st._nnt
        _move(t, new)


def _buf(t: torch.Tensor) -> Buf:
    try:
        buf = t.untyped_storage()._nnt
    except AttributeError:
        raise RuntimeError(
            f"torch_nntile: tensor on {t.device} has no nntile payload (was it made outside torch_nntile?)"
        ) from None
    if buf.generation != SESSION_STATE.generation:
        raise RuntimeError(
            "torch_nntile: this nntile tensor was made before shutdown_context(); its value went with that "
            "context (move a CPU copy to nntile again)"
        )
    return buf


def is_nntile(t: object) -> bool:
    # comparing devices is 4x cheaper than reading ``.device.type``, and these checks run several times an op
    return isinstance(t, torch.Tensor) and t.device == NNTILE


def read(t: torch.Tensor) -> DataNode:
    """The node holding the current value of tensor ``t`` (recording view ops if needed)."""
    if t.device != NNTILE:
        if t.device.type == "cpu" and t.dim() == 0:
            return ingress(t)
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found tensors on {t.device} and nntile:0"
        )
    buf = _buf(t)
    node = buf.node
    if t.is_conj() or t.is_neg():  # lazy conjugate / negative views: the bits apply on read
        return _resolve_bits(t, node)
    if t.shape == node.shape and t.is_contiguous():
        return node
    return _view(buf, (tuple(t.shape), t.stride(), t.storage_offset()))


def _view(buf: Buf, key: tuple[tuple[int, ...], tuple[int, ...], int]) -> DataNode:
    """The node of the view ``key`` (sizes, strides, offset) of ``buf``'s value, recorded
    once per value: a view read again (in the backward, say) is the same node."""
    views = buf.views
    v = views.get(key) if views is not None else None
    if v is None:
        v = read_view(buf.node, *key)
        if views is None:
            buf.views = {key: v}
        else:
            views[key] = v
    return v


def _resolve_bits(t: torch.Tensor, base: DataNode) -> DataNode:
    key = (tuple(t.shape), t.stride(), t.storage_offset())
    v = base if key[0] == base.shape and t.is_contiguous() else read_view(base, *key)
    if t.is_conj():
        v = map_op("_conj_physical", _CONJ, [v], v.dtype)
    if t.is_neg():
        v = map_op("neg", _NEG, [v], v.dtype)
    return v


_CONJ = Kernel(call_out, torch.conj_physical, (), (TILE,))
_NEG = Kernel(call_out, torch.neg, (), (TILE,))


def read_opt(t: torch.Tensor | None) -> DataNode | None:
    """``read`` of an optional argument (a norm's weight or bias)."""
    return read(t) if t is not None else None


def read_transposable(t: torch.Tensor) -> tuple[DataNode, bool]:
    """For matmul operands: a 2-D tensor that is the transpose of its whole base, or
    of a 2-D reshape of it (``x.view(-1, n).t()``, a weight gradient's input), is read
    as (that matrix, True) so the kernel transposes the tile view instead of copying."""
    if t.device == NNTILE and t.dim() == 2 and not (t.is_conj() or t.is_neg()):
        m, n = t.shape
        if t.storage_offset() == 0 and t.stride() == (1, m) and m != 1 and n != 1:
            buf = _buf(t)
            base = buf.node
            if base.shape == (n, m):
                return base, True
            if base.numel == m * n:
                return _view(buf, ((n, m), (m, 1), 0)), True
    return read(t), False


def write(t: torch.Tensor, value: DataNode) -> None:
    """Make ``value`` the new content of tensor ``t`` (in place, through views)."""
    if t.device != NNTILE:
        raise RuntimeError(f"torch_nntile: cannot write an nntile value into a tensor on {t.device}")
    shape = tuple(t.shape)
    if value.dtype != t.dtype:
        value = cast(value, t.dtype)
    if value.shape != shape:
        _check_writable(value.shape, shape)
        value = expand(value, shape)
    buf = _buf(t)
    if shape == buf.node.shape and t.is_contiguous():
        buf.node = value
        buf.views = None
        return
    key = (shape, t.stride(), t.storage_offset())
    if t.numel() and any(st == 0 and sz > 1 for sz, st in zip(shape, key[1])):
        raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a single "
                           "memory location. Please clone() the tensor before performing the operation.")
    buf.node = write_view(buf.node, value, *key)
    buf.views = {key: value}


def _check_writable(value: tuple[int, ...], shape: tuple[int, ...]) -> None:
    """A value written into a tensor must broadcast to its shape; else PyTorch's error:
    the in-place op's (the result outgrew the tensor) or copy_'s (no common shape)."""
    if len(value) <= len(shape) and all(v == s or v == 1 for v, s in zip(reversed(value), reversed(shape))):
        return
    both = torch._C._infer_size(torch.Size(shape), torch.Size(value))  # raises PyTorch's "The size of tensor a ..." if none
    raise RuntimeError(f"output with shape {list(shape)} doesn't match the broadcast shape {list(both)}")


def reserve(t: torch.Tensor, nelems: int) -> None:
    """Let ``t``'s storage report room for ``nelems`` items. Storages hold no bytes
    (values live in tiles), but PyTorch's in-place metadata ops (``as_strided_``,
    ``squeeze_``, ``resize_``) check the new geometry against the storage size."""
    nbytes = nelems * t.element_size()
    if t.untyped_storage().nbytes() < nbytes:
        _grow(t, nbytes)


def resize(t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """``t.resize_(shape)``: contiguous ``shape`` at ``t``'s storage offset; items kept
    in storage order, new ones zero (PyTorch leaves them uninitialized)."""
    if tuple(t.shape) == shape and t.is_contiguous():
        return
    buf = _buf(t)
    base = buf.node
    offset = t.storage_offset()
    n = math.prod(shape)
    stride = contiguous_strides(shape)
    if offset + n > base.numel:  # the storage grows: a new, longer base value
        grown = fill((offset + n,), base.dtype, 0)
        if base.numel:
            grown = write_view(grown, reshape(base, (base.numel,)), (base.numel,), (1,), 0)
        buf.node, buf.views = grown, None
    reserve(t, offset + n)
    _AS_STRIDED_(_META, t, list(shape), list(stride), offset)
    if offset == 0 and n == buf.node.numel and buf.node.shape != shape:
        buf.node, buf.views = reshape(buf.node, shape), None  # t is the whole storage: make it the base


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def resize_output(t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Fit an ``out=`` tensor to its result's shape the way PyTorch does: silently
    when it is empty, with PyTorch's deprecation warning otherwise."""
    if tuple(t.shape) == shape:
        return
    if t.numel():
        stats.warn_user(
            f"An output with one or more elements was resized since it had shape {list(t.shape)}, which does not "
            f"match the required output shape {list(shape)}. This behavior is deprecated, and in a future PyTorch "
            "release outputs will not be resized unless they have zero elements. You can explicitly reuse an out "
            "tensor t by resizing it, inplace, to zero elements with t.resize_(0).", UserWarning)
    resize(t, shape)


native.TYPED[copy_tile] = typed.cast_record  # a copy into another dtype: a conversion in C


def cast(node: DataNode, dtype: torch.dtype) -> DataNode:
    return map_op("_to_copy", COPY, [node], dtype)


def to_cpu(t: torch.Tensor) -> torch.Tensor:
    """Gather an nntile tensor's value into a new CPU tensor (flushes pending work)."""
    return SESSION_STATE.to_cpu(read(t))


def from_cpu(t: torch.Tensor) -> torch.Tensor:
    SESSION_STATE.runtime()
    return new_tensor(ingress(t))


def _install_printing() -> None:
    """``print(t)`` formats the values with a dozen ATen ops; run them on a CPU copy.

    PyTorch has no hook for a device's printing, so the private formatter is wrapped
    (the suffix still shows ``device='nntile:0'``)."""
    import torch._tensor_str as ts

    if getattr(ts._tensor_str, "_nntile", False):
        return
    orig = ts._tensor_str

    def _tensor_str(self: torch.Tensor, indent: int) -> str:
        if self.device.type == DEVICE:
            with torch.no_grad():
                self = to_cpu(self)
        return orig(self, indent)

    _tensor_str._nntile = True  # type: ignore[attr-defined]
    ts._tensor_str = _tensor_str


_install_printing()


def _install_deepcopy() -> None:
    """``copy.deepcopy`` of a plain tensor copies its storage, through
    ``torch.UntypedStorage(nbytes, device=...)``, which crashes the process for this
    device: copy nntile tensors as PyTorch copies those of storage-less devices, by
    ``clone()`` (a ``Parameter`` already does). Aliasing between deep-copied views is not kept."""
    if getattr(torch.Tensor.__deepcopy__, "_nntile", False):
        return
    orig = torch.Tensor.__deepcopy__

    def __deepcopy__(self: torch.Tensor, memo: dict):  # noqa: ANN202
        if (self.device.type != DEVICE or type(self) is not torch.Tensor or self.layout != torch.strided
                or not self.is_leaf or id(self) in memo):
            return orig(self, memo)  # also raises PyTorch's error for a non-leaf
        with torch.no_grad():
            new = self.clone()
        if self.requires_grad:
            new.requires_grad_()
        if self.grad is not None:
            new.grad = self.grad.__deepcopy__(memo)
        new.__dict__ = copy.deepcopy(self.__dict__, memo)
        memo[id(self)] = new
        return new

    __deepcopy__._nntile = True  # type: ignore[attr-defined]
    torch.Tensor.__deepcopy__ = __deepcopy__  # type: ignore[method-assign]


_install_deepcopy()
