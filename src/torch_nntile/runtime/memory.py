"""Tile memory: handles registered with StarPU, kept as spares once their tiles die, freed
once no compile asks for their size.

A training loop then reuses last step's buffers instead of allocating (and
page-faulting) them again. See docs/architecture/memory.md.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from torch_nntile import stats
from torch_nntile.runtime.failures import Failure, _new_failure

TRIM_S = 0.25  # at most this often, when the workers go idle, malloc's free pages go back to the system
PAGE = 4096  # out of core, a tile is registered as the whole pages that hold it (tnt_register)


def paged_bytes(key: tuple[int, int]) -> int:
    """Out of core, the bytes StarPU gives a tile of ``key``'s size (items, item size):
    the whole pages that hold it."""
    return -(-key[0] * key[1] // PAGE) * PAGE
SPARE_COMPILES = 4  # compiles a size of spare handles may go unasked for before they are freed
_BYTES_LOCK = threading.RLock()  # the byte counts change on any thread (tiles die anywhere), and in a finalizer


def _nbytes(key: tuple[int, ...]) -> int:
    return key[0] * key[1]


class TileMemory:
    """Tile handles, their memory and the spares: a part of ``Runtime`` (runtime/context.py
    sets up its state)."""

    _reserved_bytes = 0  # bytes of every registered handle's tile: tile_bytes(), counted as it changes
    _spare_bytes = 0  # ... of the spares among them

    def _count_bytes(self, reserved: int, spare: int = 0) -> None:
        """The registered bytes changed by ``reserved``, the spares' by ``spare``: the
        peaks (``stats.TILE_BYTES_PEAK``) follow."""
        with _BYTES_LOCK:
            self._reserved_bytes += reserved
            self._spare_bytes += spare
            if reserved > 0 or reserved > spare:  # a peak may have grown
                stats.tile_bytes_now(self._reserved_bytes - self._spare_bytes, self._reserved_bytes)

    def memory_bytes(self) -> tuple[int, int]:
        """(allocated, reserved): the bytes of the live tiles' handles (the spares left
        out; tiles given away inside a compile count as live), and of every handle."""
        with _BYTES_LOCK:
            return self._reserved_bytes - self._spare_bytes, self._reserved_bytes

    def reset_peak_bytes(self) -> None:
        """Let the byte peaks restart from the current counts."""
        with _BYTES_LOCK:
            stats.reset_tile_bytes_peak(self._reserved_bytes - self._spare_bytes, self._reserved_bytes)

    def register_many(self, sizes: list[int], elemsize: int, owners: list[int] | None = None) -> list[Any]:
        """Handles for the tiles of one value, of ``sizes`` items each: for each, a spare
        of that size, else a new one.

        A spare's old content is garbage; every tile's first task writes it (W). A
        tile that gets no memory, even after the spares are freed, still gets a
        handle: the values that need it fail when read (``TileMemoryError``).
        Over several ranks each tile is a new handle, owned by its rank in ``owners``
        (None, or -1: by the rank of the first task that writes it).
        """
        stats.tiles_added(len(sizes))
        if self.distributed:
            return self._register_dist(sizes, elemsize, owners)
        keys = [(max(n, 1), elemsize) for n in sizes]
        wanted, compiles = self._wanted, self._compiles
        out: list[Any] = []
        missed = reused = 0
        with self._spare_lock:  # once for the value's spares, not once a tile
            spares = self._spares
            for key in keys:
                wanted[key] = compiles
                free = spares.get(key)
                if free:
                    out.append(free.pop(0))  # the longest dead: its last readers are the likeliest done
                    reused += _nbytes(key)
                else:
                    out.append(None)
                    missed += 1
            if reused:  # under the lock: a spare is never counted out before it was counted in
                self._count_bytes(0, -reused)
        if missed:  # registered outside the lock: freeing the spares to find memory takes it
            out = [self._register(k) if h is None else h for h, k in zip(out, keys)]
        return out

    def _register(self, key: tuple[int, int]) -> Any:
        """A new handle of ``key``'s size (items, item size), with memory where there is some."""
        elemsize = key[1]
        ok = self._alloc_ok
        h = self.lib.tnt_register(key[0], elemsize, ok)
        if not ok[0] and self._spares:  # as PyTorch's caching allocators do: free the cache, try again
            self.lib.tnt_unregister_now(h)
            self._free_spares_now()
            stats.COUNTS["alloc_retries"] += 1
            h = self.lib.tnt_register(key[0], elemsize, ok)
        self._size[h] = key
        self._count_bytes(_nbytes(key))
        stats.COUNTS["tiles_registered"] += 1
        if not ok[0]:
            stats.COUNTS["alloc_failures"] += 1
            f = Failure(None, nbytes=key[0] * elemsize, limit=self.ooc.memory_limit if self.ooc else None)
            self.lib.tnt_set_no_memory(h, _new_failure(f))
            self._no_memory[h] = self._unnamed[h] = f
        return h

    def _register_dist(self, sizes: list[int], elemsize: int, owners: list[int] | None) -> list[Any]:
        """New handles owned as ``register_many`` says, with tags in registration order
        (the same on every rank). StarPU allocates their memory where a rank needs it."""
        reg, tag, size, owner_of, by_tag = self.lib.tnt_register_dist, self.lib.tnt_dist_tag, self._size, self._owner, \
            self._by_tag
        out = []
        for k, n in enumerate(sizes):
            owner = -1 if owners is None else owners[k]
            h = reg(max(n, 1), elemsize, owner)
            size[h] = (max(n, 1), elemsize)
            owner_of[h] = owner
            by_tag[tag(h)] = h  # a read by another rank alone names its tiles by tag (runtime/agree.py)
            out.append(h)
        self._count_bytes(sum(max(n, 1) for n in sizes) * elemsize)
        stats.COUNTS["tiles_registered"] += len(sizes)
        return out

    def keep_replicas(self) -> None:
        """From now on each rank keeps values of its own, as a process of its own would
        (torch.distributed's process group: every rank a replica of the model, on data of
        its own); only collectives move tiles. Before any tile is placed over the ranks."""
        if not self.distributed:
            return
        if self._by_tag:
            raise RuntimeError("torch_nntile: init_process_group('nntile') must come before any tensor is moved to "
                               "nntile: the tensors made before are spread over the ranks, not one per rank")
        self.distributed = False
        self.lib.tnt_dist_set_placed(0)

    def owner_of(self, h: Any) -> int:
        """Over several ranks, the owner handle ``h`` was registered with (or pinned to):
        -1 where the first task writing it decides."""
        return self._owner.get(h, -1)

    def pin_owner(self, h: Any, rank: int) -> None:
        """Give a tile registered without an owner, before any task of it is submitted, the
        owner ``rank`` (the lowering of a sum over several ranks' tiles chooses it)."""
        self._owner[h] = rank
        self.lib.tnt_set_owner(h, rank)

    def next_turn(self) -> int:
        """A counter every rank advances alike, in lowering order: ties between ranks are
        broken in turn."""
        self._turn += 1
        return self._turn

    def dist_info(self, reset: bool = False) -> dict[str, int] | None:
        """Over several ranks: this rank's bytes sent and received (tiles StarPU-MPI moved)
        and the tasks it ran and left to other ranks, since the start or the last reset;
        the bytes of the live tiles it owns and of those in its memory (its own and the
        copies it received), now."""
        if not self.distributed:
            return None
        out = self.ffi.new("int64_t[4]")
        self.lib.tnt_dist_stats(out, int(reset))
        handles = list(self._size)
        held = self.ffi.new("int64_t[2]")
        self.lib.tnt_dist_held(self.ffi.new("tnt_handle[]", handles), len(handles), held)
        return {"rank": self.rank, "world_size": self.world_size, "bytes_sent": out[0], "bytes_received": out[1],
                "tasks_here": out[2], "tasks_elsewhere": out[3], "tile_bytes_owned": held[0], "tile_bytes_held": held[1]}

    def too_big(self, tasks: list[Any]) -> list[tuple[int, int]]:
        """Out of core: (index, bytes) of the tasks among ``tasks`` whose tiles need more
        than a worker's share of ``memory_limit`` at once (each tile as the whole pages
        StarPU gives it). A worker holds a task's tiles while it fetches the rest: two
        workers each holding part of what they need, with no room left for the rest,
        wait for each other forever (starpu-runtime/starpu#38; seen here with two
        tasks of 7 MiB under a limit of 8 MiB). Within the share they always fit. A
        task of one tile holds nothing while it waits: its tile needs only to fit the
        limit (checked when it is registered)."""
        limit, size, bad, out = self.ooc.memory_limit // self.ncpu, self._size, self._no_memory, []
        for i, task in enumerate(tasks):
            hs = set(task[1])
            if len(hs) < 2:  # it holds nothing while it waits: a tile within the whole limit will do
                continue
            nbytes = sum(paged_bytes(size[h]) for h in hs if h not in bad)  # no memory: empty
            if nbytes > limit:
                out.append((i, nbytes))
        return out

    def reuse_key(self, h: Any) -> tuple[int, ...] | None:
        """The size of handle ``h`` (items, item size), or None if it may not hold another
        tile (it got no memory: a new tile of its size may find some). Over several ranks
        its owner comes third (-1: the rank that writes it first), and no handle holds
        another tile (``Lowering`` gives none away)."""
        if self.distributed:
            return (*self._size[h], self._owner[h])
        return None if h in self._no_memory else self._size[h]

    def _free_spares_now(self) -> None:
        """Wait for every task, then unregister the spares and free their memory at once."""
        self.pause()
        with self._spare_lock:
            spares, self._spares = self._spares, {}
        freed = sum(_nbytes(k) * len(v) for k, v in spares.items())
        self._count_bytes(-freed, -freed)
        for handles in spares.values():
            for h in handles:
                del self._size[h]
                self.lib.tnt_unregister_now(h)

    def tile_bytes(self) -> int:
        """Bytes of every registered handle's tile, spares included (a copy of the sizes:
        handles are registered and unregistered without the spares' lock)."""
        return sum(n * size for n, size in list(self._size.values()))

    def spare_count(self) -> int:
        with self._spare_lock:
            return sum(len(v) for v in self._spares.values())

    def release(self, handles: list[Any]) -> None:
        """Return dead tiles' handles to the spares (safe from any thread, after shutdown too)."""
        if self.alive and self.distributed:  # no spares: a handle holds one value (see _register_dist)
            stats.tiles_added(-len(handles))
            unreg, tag, size, owner, by_tag = self.lib.tnt_unregister_submit, self.lib.tnt_dist_tag, self._size, \
                self._owner, self._by_tag
            self._count_bytes(-sum(_nbytes(size[h]) for h in handles))
            for h in handles:  # after their tasks (no kick: this may run inside a submission's lock)
                del size[h]
                owner.pop(h, None)
                by_tag.pop(tag(h), None)
                unreg(h)
        elif self.alive:
            stats.tiles_added(-len(handles))
            size, spares, bad = self._size, self._spares, self._no_memory
            spared = 0
            with self._spare_lock:
                for h in handles:
                    if bad and h in bad:  # never reused: a new tile of that size may find memory
                        self._dead_no_memory.append(h)
                    else:
                        key = size[h]
                        spares.setdefault(key, []).append(h)
                        spared += _nbytes(key)
                        if self.ooc is not None:  # not worth a disk write: see tnt_invalidate_submit
                            self.lib.tnt_invalidate_submit(h)
                self._count_bytes(0, spared)
                if self._hints is not None:
                    self._hints.forget(handles)

    def empty_cache(self) -> None:
        """Unregister every spare handle now (their memory is freed once their last tasks ran)."""
        self.check_alive()
        with self._spare_lock:
            spares, self._spares = self._spares, {}
        for handles in spares.values():
            self._unregister(handles, spares=True)

    def recycle(self, keep: int = SPARE_COMPILES) -> None:
        """After a compile: unregister spares of sizes not asked for in ``keep`` compiles."""
        self._compiles += 1
        now, wanted = self._compiles, self._wanted
        for key in [k for k, last in wanted.items() if now - last > keep]:
            del wanted[key]
        with self._spare_lock:
            stale = [self._spares.pop(k) for k in [k for k in list(self._spares) if k not in wanted]]
            dead, self._dead_no_memory = self._dead_no_memory, []
        for h in dead:
            self._no_memory.pop(h, None)
            self._unnamed.pop(h, None)
        for handles in stale:
            self._unregister(handles, spares=True)
        self._unregister(dead)
        self._trim_due()  # the workers may never go idle (a loop without waits): the pauser would not trim

    def _trim_due(self) -> None:
        """Return malloc's free pages to the system (see tnt_trim), at most every TRIM_S."""
        now = time.monotonic()
        if now - self._trimmed >= TRIM_S:
            self._trimmed = now
            self.lib.tnt_trim()

    def _unregister(self, handles: list[Any], spares: bool = False) -> None:
        """Unregister handles after their submitted tasks; a task frees their memory.
        ``spares``: they were spares (taken out of ``_spares`` by the caller)."""
        if not handles:
            return
        unreg, size = self.lib.tnt_unregister_submit, self._size
        freed = 0
        for h in handles:
            freed += _nbytes(size.pop(h))
            unreg(h)
        self._count_bytes(-freed, -freed if spares else 0)
        self._kick()
