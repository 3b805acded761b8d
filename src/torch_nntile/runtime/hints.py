"""Out of core: graph-aware eviction hints, learned from the batches as they run.

StarPU evicts the least recently used tile when it needs room, and writes it to disk
then, on the worker that needs the room. The graph says more: which tile each task
uses, in order, and which tiles died. ``Hints`` measures, at each read of a tile, the
bytes of the distinct live tiles used since its previous use. Where they exceed
``memory_limit`` the tile could not have stayed in memory for that read anyway (an
LRU keeps a tile only while less than the limit of other tiles was used since): the
next time the same batch runs (a compile of the same structure, in a training loop
the next step), the task that used the tile before that gap evicts it as soon as it
has run (``tnt_hints_run`` in csrc/disk.c), rather than StarPU keeping it while it
evicts tiles that are needed sooner. The first run of each batch goes by StarPU's LRU
alone. ``TORCH_NNTILE_OOC_HINTS=0`` turns the hints off. With CUDA workers and a GPU
memory limit (``STARPU_LIMIT_CUDA_MEM``) the same hints, against that limit, mark the
tiles StarPU should evict from the GPUs first (``starpu_data_wont_use``: written back
to RAM while the bus is idle). Measured on a medium GPT-2
under a third of its memory: the workers waited a third as long for tiles, the step
was a few per cent faster (docs/benchmarks-log.md); prefetching ahead of the read
after such a gap loaded more than it saved and is not done.
"""

from __future__ import annotations

import os
from typing import Any

from torch_nntile.runtime.memory import paged_bytes

_CLOCK = 1 << 20  # task times kept (a Fenwick tree of this many ints); past it the gaps start anew
_LAYOUTS = 256  # batch layouts learned about at most


class Hints:
    """Which tiles each batch (known by its layout: tasks' handle counts and access
    modes) should evict after which task, learned from the gaps between uses."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._tree = [0] * (_CLOCK + 1)  # at each task time, the bytes of the live tiles it used last
        self._clock = 0
        self._last: dict[Any, tuple[int, Any, int, int, int]] = {}  # tile -> (time, batch, task, position, bytes)
        self._evict: dict[Any, dict[int, set[int]]] = {}  # batch -> task -> positions of tiles to evict after it
        self._keys: dict[Any, Any] = {}
        self._dead: list[Any] = []  # tiles released since the last plan (appended from any thread)

    def key(self, layout: Any) -> Any:
        """The one object that stands for batches of ``layout`` (compared by identity).
        Past ``_LAYOUTS`` layouts (a program whose batches keep changing, so that little
        repeats) what was learned is dropped and learning starts anew, memory bounded."""
        key = self._keys.get(layout)
        if key is None:
            if len(self._keys) >= _LAYOUTS:
                self._keys.clear()
                self._evict.clear()
                self._restart()
            key = self._keys[layout] = layout
        return key

    def _restart(self) -> None:
        """Measure the gaps anew (what was learned stays)."""
        self._tree = [0] * (_CLOCK + 1)
        self._clock = 0
        self._last.clear()

    def forget(self, handles: list[Any]) -> None:
        """Tiles that died: their memory is free, they no longer push others out. Safe
        from any thread (a finalizer's): the next ``plan`` takes them into account."""
        self._dead.extend(handles)

    def plan(self, key: Any, tasks: list[tuple[list[Any], list[int], list[int]]],
             size: dict[Any, tuple[int, int]]) -> tuple[int, list[int]]:
        """The hints for a batch about to be submitted, as ``tnt_submit_batch`` takes them
        (how many tasks have hints, and their records by task index: task, count, then
        as many positions in the batch's handles), from what earlier runs of batches of
        ``key`` taught; then learn from this one. ``tasks``: each task's handles, modes and tiles' bytes (0: an empty
        tile, never evicted)."""
        out: list[int] = []
        ntasks = 0
        for i, pos in sorted(self._evict.setdefault(key, {}).items()):
            if pos:
                out += (i, len(pos), *pos)
                ntasks += 1
        self._learn(key, tasks, size)
        return ntasks, out

    def _add(self, i: int, v: int) -> None:
        tree = self._tree
        i += 1
        while i <= _CLOCK:
            tree[i] += v
            i += i & -i

    def _before(self, i: int) -> int:
        """Bytes at task times < i."""
        tree, s = self._tree, 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    def _learn(self, key: Any, tasks: list[tuple[list[Any], list[int], list[int]]],
               size: dict[Any, tuple[int, int]]) -> None:
        last, evict, limit = self._last, self._evict, self.limit
        dead, self._dead = self._dead, []
        for h in dead:
            prev = last.pop(h, None)
            if prev is not None:
                self._add(prev[0], -prev[4])
        if self._clock + len(tasks) > _CLOCK:
            self._restart()
        now, off = self._clock, 0
        for i, (hs, modes, nbytes) in enumerate(tasks):
            here: dict[Any, list[Any]] = {}  # the task's distinct tiles: position, reads, bytes
            for j, h in enumerate(hs):
                u = here.get(h)
                if u is None:
                    here[h] = [off + j, modes[j] & 1, paged_bytes(size[h]) if nbytes[j] else 0]
                elif modes[j] & 1:
                    u[1] = 1
            off += len(hs)
            for h, (_pos, reads, nb) in here.items():
                prev = last.get(h)
                if prev is None:
                    continue
                pt, pkey, pi, ppos, pnb = prev
                if reads and nb:
                    after = evict.setdefault(pkey, {}).setdefault(pi, set())
                    if self._before(now) - self._before(pt + 1) + nb > limit:  # live tiles used between, and this
                        after.add(ppos)
                    else:
                        after.discard(ppos)
                self._add(pt, -pnb)
            for h, (pos, _reads, nb) in here.items():
                last[h] = (now, key, i, pos, nb)
                self._add(now, nb)
            now += 1
        self._clock = now


def enabled() -> bool:
    return os.environ.get("TORCH_NNTILE_OOC_HINTS", "1") != "0"


def cuda_hints(ncuda: int) -> Hints | None:
    """With CUDA workers and ``STARPU_LIMIT_CUDA_MEM`` (MiB a GPU): hints against that limit."""
    mib = os.environ.get("STARPU_LIMIT_CUDA_MEM", "").strip()
    if not ncuda or not mib.isdigit() or not enabled():
        return None
    return Hints(int(mib) << 20)
