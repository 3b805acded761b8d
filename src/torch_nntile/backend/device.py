"""The ``nntile`` device: registration, and the link from a tensor to its graph node.

Every nntile tensor is a plain ``torch.Tensor`` with 0-byte storage. Its value is a
``Buf`` hung on the storage object, so views, ``.detach()``, ``.data`` and
autograd's saved tensors (which all share the storage) share it too. The Buf
holds the current node of the *base* (the contiguous tensor the storage was made
for); a view reads and writes through its geometry over that base.
"""

from __future__ import annotations

import itertools

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from torch_nntile.graph.nodes import DataNode
from torch_nntile.ops.base import map_op
from torch_nntile.ops.data import ingress
from torch_nntile.ops.views import expand, read_view, write_view
from torch_nntile.session import SESSION_STATE

DEVICE = "nntile"


class _BackendModule:
    """What ``torch.nntile`` exposes."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:  # random ops draw from the CPU generator
        pass

    @staticmethod
    def get_rng_state(device: object = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: object = None) -> None:
        torch.set_rng_state(state)


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() == DEVICE:
        return
    _setup_privateuseone_for_python_backend(DEVICE, backend_module=_BackendModule)


_register()
_create = torch._C._acc.create_empty_tensor
_fake_ptr = itertools.count(1 << 44, 1 << 20)


class Buf:
    """The payload of one storage: the current node of its base tensor."""

    __slots__ = ("node", "views", "fake_ptr")

    def __init__(self, node: DataNode) -> None:
        self.node = node
        self.views: dict[tuple, DataNode] = {}
        self.fake_ptr = next(_fake_ptr)


def new_tensor(node: DataNode) -> torch.Tensor:
    """A fresh nntile tensor whose value is ``node``."""
    t = _create(list(node.shape), node.dtype)
    t.untyped_storage()._nnt = Buf(node)
    return t


def _buf(t: torch.Tensor) -> Buf:
    try:
        return t.untyped_storage()._nnt
    except AttributeError:
        raise RuntimeError(
            f"torch_nntile: tensor on {t.device} has no nntile payload (was it made outside torch_nntile?)"
        ) from None


def is_nntile(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE


def read(t: torch.Tensor) -> DataNode:
    """The node holding the current value of tensor ``t`` (recording view ops if needed)."""
    if t.device.type != DEVICE:
        if t.device.type == "cpu" and t.dim() == 0:
            return ingress(t)
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found tensors on {t.device} and nntile:0"
        )
    buf = _buf(t)
    node = buf.node
    if t.shape == node.shape and t.is_contiguous():
        return node
    key = (tuple(t.shape), t.stride(), t.storage_offset())
    v = buf.views.get(key)
    if v is None:
        v = buf.views[key] = read_view(node, *key)
    return v


def read_transposable(t: torch.Tensor) -> tuple[DataNode, bool]:
    """For matmul operands: a 2-D tensor that is the transpose of its base is read
    as (base, True) so the kernel transposes the tile view instead of copying."""
    if t.device.type == DEVICE and t.dim() == 2:
        base = _buf(t).node
        st = t.stride()
        if (len(base.shape) == 2 and t.storage_offset() == 0 and base.shape == (t.shape[1], t.shape[0])
                and st == (1, t.shape[0]) and t.shape[0] != 1 and t.shape[1] != 1):
            return base, True
    return read(t), False


def write(t: torch.Tensor, value: DataNode) -> None:
    """Make ``value`` the new content of tensor ``t`` (in place, through views)."""
    if t.device.type != DEVICE:
        raise RuntimeError(f"torch_nntile: cannot write an nntile value into a tensor on {t.device}")
    shape = tuple(t.shape)
    if value.dtype != t.dtype:
        value = cast(value, t.dtype)
    if value.shape != shape:
        value = expand(value, shape)
    buf = _buf(t)
    if shape == buf.node.shape and t.is_contiguous():
        buf.node = value
        buf.views = {}
        return
    key = (shape, t.stride(), t.storage_offset())
    buf.node = write_view(buf.node, value, *key)
    buf.views = {key: value}


def _copy_kernel(o: torch.Tensor, a: torch.Tensor) -> None:
    o.copy_(a)


def cast(node: DataNode, dtype: torch.dtype) -> DataNode:
    return map_op("_to_copy", _copy_kernel, [node], dtype)


def to_cpu(t: torch.Tensor) -> torch.Tensor:
    """Gather an nntile tensor's value into a new CPU tensor (flushes pending work)."""
    return SESSION_STATE.to_cpu(read(t))


def from_cpu(t: torch.Tensor) -> torch.Tensor:
    SESSION_STATE.runtime()
    return new_tensor(ingress(t))


def fake_data_ptr(t: torch.Tensor) -> int:
    """A distinct address per storage, for code that compares data pointers."""
    return _buf(t).fake_ptr + t.storage_offset() * t.element_size()


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


def _install_serialization() -> None:
    """``torch.save`` pickles a storage's bytes, and ours has none: pickle nntile
    tensors as a CPU copy that ``torch.load`` moves back to nntile (the path
    PyTorch takes for storage-less PrivateUse1 tensors)."""
    if getattr(torch.Tensor._reduce_ex_internal, "_nntile", False):
        return
    orig = torch.Tensor._reduce_ex_internal

    def _reduce_ex_internal(self: torch.Tensor, proto: int):  # noqa: ANN202
        if self.device.type == DEVICE:
            with torch.no_grad():
                cpu = to_cpu(self)
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                    (cpu, self.dtype, str(self.device), self.requires_grad))
        return orig(self, proto)

    _reduce_ex_internal._nntile = True  # type: ignore[attr-defined]
    torch.Tensor._reduce_ex_internal = _reduce_ex_internal  # type: ignore[method-assign]


_install_serialization()
