"""Out-of-core memory: tiles in at most ``memory_limit`` bytes of RAM, the rest on disk.

StarPU evicts only memory it allocated itself. In this mode tiles are registered with
no home (StarPU allocates each on its first write), ``STARPU_LIMIT_CPU_MEM`` bounds
what it allocates in RAM, and a disk node in ``swap_dir`` (written with O_DIRECT, so
the page cache does not keep evicted tiles in RAM either) takes what does not fit;
StarPU loads a tile back before a task reads it. Experimental, behind
``TORCH_NNTILE_EXPERIMENTAL_OOC=1``: some runs under a small limit stall in StarPU.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

_MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class OutOfCore:
    """What ``init_context(memory_limit=..., swap_dir=..., swap_size=...)`` asked for."""

    memory_limit: int
    swap_dir: str
    swap_size: int

    @staticmethod
    def make(memory_limit: int | None, swap_dir: str | os.PathLike | None, swap_size: int | None) -> OutOfCore | None:
        """Check the request before anything starts; None where no limit is set. Errors
        name the argument and the folder, so that nothing fails later inside StarPU
        (which aborts on a disk it cannot write and livelocks on a limit without one)."""
        if memory_limit is None:
            if swap_dir is not None or swap_size is not None:
                raise ValueError("swap_dir and swap_size take effect with memory_limit; pass memory_limit too")
            return None
        if os.environ.get("TORCH_NNTILE_EXPERIMENTAL_OOC", "") in ("", "0"):
            raise NotImplementedError(
                "torch_nntile: out-of-core memory (memory_limit=...) is experimental: a training step can still "
                "stall inside StarPU under a small limit. Set TORCH_NNTILE_EXPERIMENTAL_OOC=1 to try it")
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, int) or memory_limit < _MIB:
            raise ValueError(f"memory_limit must be a number of bytes of at least 1 MiB, got {memory_limit!r}")
        if swap_dir is None:
            raise ValueError("memory_limit needs swap_dir: without a disk to evict tiles to, StarPU waits forever "
                             "once the tiles outgrow the limit")
        path = os.path.abspath(os.fspath(swap_dir))
        if not os.path.isdir(path):
            raise FileNotFoundError(f"torch_nntile: swap_dir {path!r} does not exist or is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"torch_nntile: swap_dir {path!r} is not writable")
        free = shutil.disk_usage(path).free
        if swap_size is None:
            swap_size = free // 2
        if isinstance(swap_size, bool) or not isinstance(swap_size, int) or swap_size < _MIB:
            raise ValueError(f"swap_size must be a number of bytes of at least 1 MiB, got {swap_size!r}")
        if swap_size > free:
            raise OSError(f"torch_nntile: swap_size {swap_size} bytes ({swap_size / 2**30:.2f} GiB) is more than the "
                          f"{free} bytes ({free / 2**30:.2f} GiB) free in swap_dir {path!r}")
        return OutOfCore(memory_limit, path, swap_size)

    @property
    def limit_mib(self) -> int:
        return self.memory_limit // _MIB
