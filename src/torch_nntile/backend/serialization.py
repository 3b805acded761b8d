"""``torch.save`` and ``torch.load`` for nntile tensors.

PyTorch serializes a tensor as its storage's bytes and restores a storage onto the
device ``map_location`` names. An nntile storage holds no bytes (values live in tiles)
and cannot be made from bytes, so nntile tensors are saved as CPU copies (rebuilt on
nntile when loaded), and a load whose ``map_location`` names nntile restores those
storages on the CPU and moves the loaded tensors to nntile afterwards.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from torch_nntile.backend.device import DEVICE, NNTILE, to_cpu


def _install_save() -> None:
    """Pickle nntile tensors as a CPU copy that ``torch.load`` moves back to nntile
    (the path PyTorch takes for storage-less PrivateUse1 tensors)."""
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


def _is_nntile(where: Any) -> bool:
    try:
        return torch.device(where).type == DEVICE
    except (TypeError, RuntimeError):
        return False


def _split(map_location: Any) -> tuple[Any, Any] | None:
    """(a test of a saved location: does it go to nntile?, the map_location for the
    rest), or None where no storage goes to nntile (a callable is the caller's)."""
    if isinstance(map_location, (str, torch.device)):
        return (lambda loc: True, None) if _is_nntile(map_location) else None
    if isinstance(map_location, dict):
        ours = {k for k, v in map_location.items() if _is_nntile(v)}
        if not ours:
            return None
        return (lambda loc: loc in ours), {k: v for k, v in map_location.items() if k not in ours}
    return None


def _move(obj: Any, storages: set[int], memo: dict[int, Any]) -> Any:
    """``obj`` with its CPU tensors whose storage was mapped to nntile moved there.
    Containers are rebuilt (a state dict keeps its class and ``_metadata``); one tensor
    object stays one tensor (tied weights stay tied); modules move as a whole."""
    key = id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, torch.Tensor):
        new = obj
        if obj.device.type == "cpu" and obj.layout == torch.strided and obj.untyped_storage()._cdata in storages:
            with torch.no_grad():
                new = obj.to(NNTILE)
            if isinstance(obj, torch.nn.Parameter):
                new = torch.nn.Parameter(new, requires_grad=obj.requires_grad)
            elif obj.requires_grad:
                new.requires_grad_()
    elif isinstance(obj, torch.nn.Module):
        new = obj.to(NNTILE) if any(t.untyped_storage()._cdata in storages
                                    for t in (*obj.parameters(), *obj.buffers())) else obj
    elif isinstance(obj, dict):
        new = copy.copy(obj)
        for k, v in obj.items():
            new[k] = _move(v, storages, memo)
    elif isinstance(obj, list):
        new = copy.copy(obj)
        new[:] = [_move(v, storages, memo) for v in obj]
    elif isinstance(obj, tuple):
        items = [_move(v, storages, memo) for v in obj]
        new = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    else:
        new = obj
    memo[key] = new
    return new


def _install_load() -> None:
    """``torch.load(f, map_location="nntile")`` (or a dict mapping a location to nntile).

    PyTorch would make an nntile storage from bytes, which this device cannot hold:
    the storages mapped to nntile are restored on the CPU, and the tensors over them
    are moved to nntile once the file is read. A tensor loads as one nntile tensor;
    two different views of one saved storage load as two tensors."""
    if getattr(torch.load, "_nntile", False):
        return
    orig = torch.load

    @functools.wraps(orig)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        split = _split(map_location)
        if split is None:
            return orig(f, map_location, *args, **kwargs)
        ours, rest = split
        restore = torch.serialization._get_restore_location(rest)
        storages: set[int] = set()

        def mapper(storage: torch.UntypedStorage, location: str) -> torch.UntypedStorage:
            if ours(location):
                storages.add(storage._cdata)
                return storage
            return restore(storage, location)

        return _move(orig(f, mapper, *args, **kwargs), storages, {})

    load._nntile = True  # type: ignore[attr-defined]
    torch.load = torch.serialization.load = load


_install_save()
_install_load()
