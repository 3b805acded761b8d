"""``torch.nntile``: what PyTorch finds for the device as it finds ``torch.cuda``, with
``torch.cuda``'s functions where their meaning carries over (memory statistics over
the tiles, ``synchronize``, seeding, device name and properties)."""

from __future__ import annotations

import collections
import os
import types

import torch

from torch_nntile import stats
from torch_nntile.session import SESSION_STATE

DEVICE = "nntile"


class BackendModule:
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
    def is_initialized() -> bool:
        """Whether a context is running (started by ``init_context`` or the first op that
        needs one): ``torch_nntile.is_context_initialized()``."""
        return SESSION_STATE.live_runtime() is not None

    @staticmethod
    def manual_seed(seed: int) -> None:
        """Seed the CPU generator: random ops on nntile draw from it (so this is
        ``torch.manual_seed`` without the other devices).

        Args:
            seed: the seed.
        """
        torch.default_generator.manual_seed(int(seed))

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """``manual_seed``: one device, whose random ops draw from the CPU generator
        (``torch.manual_seed`` calls this too, with the seed it gives the CPU).

        Args:
            seed: the seed.
        """
        torch.default_generator.manual_seed(int(seed))

    @staticmethod
    def seed() -> None:
        """Seed the CPU generator, which random ops on nntile draw from, with a
        non-deterministic number."""
        torch.default_generator.seed()

    @staticmethod
    def initial_seed() -> int:
        """The CPU generator's initial seed: random ops on nntile draw from it."""
        return torch.default_generator.initial_seed()

    @staticmethod
    def get_rng_state(device: object = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: object = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        """None yet: ``torch.autocast("nntile")`` warns and runs in the tensors' own dtypes.
        (Autocast asks even when disabled, as ``torch.utils.checkpoint`` does on replay.)"""
        return []

    @staticmethod
    def set_device(device: object) -> None:  # one device: nothing to switch
        pass

    @staticmethod
    def synchronize(device: object = None) -> None:
        """Run what is recorded and wait for every submitted task, as
        ``torch.cuda.synchronize`` waits for the queued kernels: ``torch_nntile.execute()``
        then ``wait()``. Recorded ops start a context if none runs; without them and
        without a context there is nothing to wait for.

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
        """
        _check_device(device)
        s = SESSION_STATE
        if s.has_pending():
            s.execute()
        if s.live_runtime() is not None:
            s.wait()

    @staticmethod
    def empty_cache() -> None:
        """Free the tile memory kept for reuse (``torch_nntile.empty_cache()``); nothing
        without a context."""
        if SESSION_STATE.live_runtime() is not None:
            SESSION_STATE.empty_cache()

    @staticmethod
    def memory_allocated(device: object = None) -> int:
        """Bytes of the live tiles: every registered tile handle's but the spares kept
        for reuse. Tiles get their handles when their ops are compiled and give them
        back when their values die; read after ``synchronize()`` for a settled count.
        0 without a context.

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
        """
        return _memory_bytes(device)[0]

    @staticmethod
    def memory_reserved(device: object = None) -> int:
        """Bytes of every registered tile handle, the spares kept for reuse included
        (``info()["tile_bytes"]``). 0 without a context.

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
        """
        return _memory_bytes(device)[1]

    @staticmethod
    def max_memory_allocated(device: object = None) -> int:
        """The peak of ``memory_allocated()`` since the start or the last
        ``reset_peak_memory_stats()``.

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
        """
        _check_device(device)
        return stats.TILE_BYTES_PEAK[0]

    @staticmethod
    def max_memory_reserved(device: object = None) -> int:
        """The peak of ``memory_reserved()`` since the start or the last
        ``reset_peak_memory_stats()``.

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
        """
        _check_device(device)
        return stats.TILE_BYTES_PEAK[1]

    @staticmethod
    def reset_peak_memory_stats(device: object = None) -> None:
        """Let the peaks of ``max_memory_allocated()`` and ``max_memory_reserved()``
        restart from the current values.

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
        """
        _check_device(device)
        rt = SESSION_STATE.live_runtime()
        if rt is not None:
            rt.reset_peak_bytes()
        else:
            stats.reset_tile_bytes_peak()

    @staticmethod
    def memory_stats(device: object = None) -> dict[str, int]:
        """The tile memory under ``torch.cuda.memory_stats()``'s key names, those that
        apply: ``allocated_bytes.all.{current,peak}``, ``reserved_bytes.all.{current,peak}``,
        ``num_alloc_retries`` (registrations that freed the spares and tried again) and
        ``num_ooms`` (tiles that got no memory; both since the start or ``reset_info()``).

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
        """
        allocated, reserved = _memory_bytes(device)
        peak = stats.TILE_BYTES_PEAK
        return collections.OrderedDict(sorted({
            "allocated_bytes.all.current": allocated,
            "allocated_bytes.all.peak": peak[0],
            "reserved_bytes.all.current": reserved,
            "reserved_bytes.all.peak": peak[1],
            "num_alloc_retries": stats.COUNTS["alloc_retries"],
            "num_ooms": stats.COUNTS["alloc_failures"],
        }.items()))

    @staticmethod
    def memory_summary(device: object = None, abbreviated: bool = False) -> str:
        """``memory_stats()`` as a few readable lines.

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
            abbreviated: leave out the line on spares and failed allocations.
        """
        m = BackendModule.memory_stats(device)
        lines = [
            "nntile tile memory (StarPU handles)",
            f"allocated: {_bytes(m['allocated_bytes.all.current'])}, peak {_bytes(m['allocated_bytes.all.peak'])}",
            f"reserved:  {_bytes(m['reserved_bytes.all.current'])}, peak {_bytes(m['reserved_bytes.all.peak'])}",
        ]
        if not abbreviated:
            rt = SESSION_STATE.live_runtime()
            lines.append(f"spare handles kept for reuse: {rt.spare_count() if rt is not None else 0} "
                         f"(freed by empty_cache()); allocation retries: {m['num_alloc_retries']}, "
                         f"tiles without memory: {m['num_ooms']}")
        return "\n".join(lines)

    @staticmethod
    def get_device_name(device: object = None) -> str:
        """``"nntile (StarPU, 2 CPU workers, scheduler lws)"``: the running context's
        workers and scheduler; ``"nntile"`` without a context (none is started).

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
        """
        _check_device(device)
        rt = SESSION_STATE.live_runtime()
        if rt is None:
            return DEVICE
        workers = [_count(rt.ncpu, "CPU worker")] + ([_count(rt.ncuda, "CUDA worker")] if rt.ncuda else [])
        return f"{DEVICE} (StarPU, {', '.join(workers)}, scheduler {rt.scheduler})"

    @staticmethod
    def get_device_properties(device: object = None) -> types.SimpleNamespace:
        """The device's ``name`` (``get_device_name()``), ``cpu_workers``,
        ``cuda_workers``, ``scheduler`` (0, 0 and None without a context) and
        ``total_memory``: out of core the memory limit, else the machine's RAM (bytes).

        Args:
            device: ``None``, ``0`` or the nntile device (there is one).
        """
        _check_device(device)
        rt = SESSION_STATE.live_runtime()
        if rt is not None and rt.ooc is not None:
            total = rt.ooc.memory_limit
        else:
            try:
                total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (AttributeError, ValueError, OSError):  # no sysconf (not POSIX), or no such name
                total = 0
        return types.SimpleNamespace(
            name=BackendModule.get_device_name(), cpu_workers=rt.ncpu if rt is not None else 0,
            cuda_workers=rt.ncuda if rt is not None else 0, scheduler=rt.scheduler if rt is not None else None,
            total_memory=total)

    class device:  # noqa: N801  (``torch.cuda.device``'s name)
        """``with torch.nntile.device(0):`` -- the device is always nntile:0."""

        def __init__(self, device: object) -> None:
            self.idx = 0

        def __enter__(self) -> None:
            pass

        def __exit__(self, *exc: object) -> bool:
            return False


def _check_device(device: object) -> None:
    """``device`` must name nntile:0 (or be None), as ``torch.cuda``'s functions check theirs."""
    if device is None:
        return
    d = torch.device(DEVICE, device) if isinstance(device, int) else torch.device(device)
    if d.type != DEVICE or d.index not in (None, 0):
        raise ValueError(f"Expected the nntile device, but got: {device}")


def _memory_bytes(device: object) -> tuple[int, int]:
    """(allocated, reserved) tile bytes of the running context; zeros without one."""
    _check_device(device)
    rt = SESSION_STATE.live_runtime()
    return rt.memory_bytes() if rt is not None else (0, 0)


def _bytes(n: int) -> str:
    return f"{n} B ({n / 2**20:.2f} MiB)" if n >= 2**20 else f"{n} B"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"
