"""Out-of-core memory: tiles in at most ``memory_limit`` bytes of RAM, the rest on disk.

StarPU evicts only memory it allocated itself. In this mode tiles are registered with
no home (StarPU allocates each on its first write), ``STARPU_LIMIT_CPU_MEM`` bounds
what it allocates in RAM, and a disk node in ``swap_dir`` (written with O_DIRECT, so
the page cache does not keep evicted tiles in RAM either) takes what does not fit;
StarPU loads a tile back before a task reads it.

StarPU waits forever where it cannot fit a task's tiles. Two guards: a task whose
tiles exceed a worker's share of the limit is not submitted (``TileMemory.too_big``:
a TileMemoryError naming it), and a watchdog raises where no kernel has begun or
ended for ``TORCH_NNTILE_OOC_STALL_S`` seconds during a wait (``Swap.check_stall``:
a full swap disk, tiles outgrowing limit and swap). See docs/guide/out-of-core.md.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from typing import Any

from torch_nntile import stats
from torch_nntile.runtime.failures import TileMemoryError, _human
from torch_nntile.runtime.hints import Hints
from torch_nntile.runtime.hints import enabled as hints_enabled

_MIB = 1 << 20
STALL_S = 30.0  # out of core: no task began or ended for this long while tasks wait: StarPU is stuck


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
        if isinstance(swap_size, bool) or not isinstance(swap_size, int) or swap_size < 16 * _MIB:
            raise ValueError(f"swap_size must be a number of bytes of at least 16 MiB (StarPU's smallest disk), "
                             f"got {swap_size!r}")
        if swap_size > free:
            raise OSError(f"torch_nntile: swap_size {swap_size} bytes ({swap_size / 2**30:.2f} GiB) is more than the "
                          f"{free} bytes ({free / 2**30:.2f} GiB) free in swap_dir {path!r}")
        return OutOfCore(memory_limit, path, swap_size)

    @property
    def limit_mib(self) -> int:
        return self.memory_limit // _MIB


class Swap:
    """Out of core, what the runtime adds: the disk counters in ``info()`` and the
    watchdog that turns a stuck StarPU into an error. A part of ``Runtime``
    (runtime/context.py sets up its state)."""

    def _start_swap(self, ooc: OutOfCore) -> None:
        """Add the disk node (after tnt_init, which ran with tile memory managed by StarPU)."""
        node = self.lib.tnt_add_disk(ooc.swap_dir.encode(), ooc.swap_size)
        if node < 0:
            self.lib.tnt_shutdown()
            self.lib.tnt_set_managed(0)
            raise OSError(f"torch_nntile: StarPU could not open a disk node of {ooc.swap_size} bytes in swap_dir "
                          f"{ooc.swap_dir!r} (error {node})")
        self._swap_out = self.ffi.new("double[8]")
        self._hints = Hints(ooc.memory_limit) if hints_enabled() else None
        self._swap_seen = (0.0,) * 5
        self._progress = (-1, -1, time.monotonic())
        self._stall_s = float(os.environ.get("TORCH_NNTILE_OOC_STALL_S", STALL_S))
        stats.COLLECTORS.append(self._collect_swap)

    def _collect_swap(self) -> None:
        """Fold what StarPU moved to and from the disk, the workers' waits and the hints
        taken into stats (the C side keeps totals)."""
        out = self._swap_out
        self.lib.tnt_ooc_stats(out)
        now = (out[0], out[1], out[2], out[6], out[7])
        d = [a - b for a, b in zip(now, self._swap_seen)]
        self._swap_seen = now
        c = stats.COUNTS
        c["bytes_evicted"] += int(d[0])
        c["bytes_loaded"] += int(d[1])
        stats.DATA_WAIT[0] += d[2]
        c["hint_evictions"] += int(d[3])
        c["hint_evictions_declined"] += int(d[4])

    def _plan_hints(self, b: Any, handles: list[Any]) -> tuple[int, Any]:
        """Out of core, the graph-aware hints for batch ``b`` on ``handles`` (``Hints``):
        (tasks with hints, their records for tnt_submit_batch)."""
        hints = self._hints
        if hints is None:
            return 0, self.ffi.NULL
        if b.hint_key is None:  # once a prepared batch: its layout
            ffi = self.ffi
            b.hint_key = hints.key((bytes(ffi.buffer(b.nbufs)), bytes(ffi.buffer(b.modes))))
            b.hint_layout = [(len(modes), modes, [s[0] for s in specs]) for _fn, _hs, modes, specs, _name in b._tasks]
        tasks, off = [], 0
        for n, modes, nbytes in b.hint_layout:
            tasks.append((handles[off:off + n], modes, nbytes))
            off += n
        count, rec = hints.plan(b.hint_key, tasks, self._size)
        return count, self.ffi.new("int32_t[]", rec) if rec else self.ffi.NULL

    def _stop_swap(self) -> None:
        self._collect_swap()
        stats.COLLECTORS.remove(self._collect_swap)
        self.lib.tnt_disk_gone()

    def check_stall(self) -> None:
        """During a wait, out of core: raise if no kernel has begun or ended for
        ``TORCH_NNTILE_OOC_STALL_S`` seconds (30) while none runs. That is StarPU
        unable to fit the tiles of the waiting tasks (a full swap disk, or tiles that
        outgrew the limit), which it would wait on forever."""
        started, done, since = self._progress
        now_started, now_done = int(self.lib.tnt_kernels_started()), self.tasks_done()
        now = time.monotonic()
        if (now_started, now_done) != (started, done):
            self._progress = (now_started, now_done, now)
            return
        if now_started != now_done or now - since < self._stall_s:
            return  # a kernel runs (it may be long), or not long enough
        self._stuck = self._stall_message(now - since)
        raise TileMemoryError(self._stuck)

    def _stall_message(self, idle: float) -> str:
        ooc, out = self.ooc, self._swap_out
        self.lib.tnt_ooc_stats(out)
        msg = (f"torch_nntile: out of core, no task has run for {idle:.0f} s while {self.tasks_submitted - self.tasks_done()}"
               f" wait: StarPU cannot fit their tiles in the memory_limit of {ooc.memory_limit} bytes "
               f"({_human(ooc.memory_limit)})")
        if out[3]:
            msg += (f"; the swap disk refused {int(out[3])} evictions ({_human(int(out[4]))}): swap_dir "
                    f"{ooc.swap_dir!r} is full ({os.strerror(int(out[5]))}, {_human(shutil.disk_usage(ooc.swap_dir).free)}"
                    f" free)")
        else:
            msg += f", nor evict enough of the others to the swap_size of {ooc.swap_size} bytes ({_human(ooc.swap_size)})"
        return (msg + ". The context is stuck: values read back so far are kept; restart the process, with more "
                "memory_limit, swap space or finer tiles")

    def swap_info(self) -> dict[str, Any] | None:
        """Out of core, the limit and the swap folder; None in memory."""
        if self.ooc is None:
            return None
        return {"memory_limit": self.ooc.memory_limit, "swap_dir": self.ooc.swap_dir, "swap_size": self.ooc.swap_size}
