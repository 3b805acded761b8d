"""Over several ranks: the ranks check, at each compile and each readout, that they run the
same program, and stop together instead of waiting forever for one another.

Every rank records the same ops and reads the same values: that is how they agree on
owners and tags without talking (runtime/csrc/dist.c). A rank that recorded other ops,
or read a value the others did not, would wait for tiles nobody sends. So at each such
point the ranks exchange a hash of what they are about to do; where the hashes differ,
they exchange the descriptions and raise ``ProgramsDivergedError`` naming the first
difference, every rank alike. One exception: a rank that reads a value the others do
not read (``torch.save`` on rank 0) is served: the others, at their next check, send it
the tiles they own, and check their own step again. A rank that does not arrive within
``TORCH_NNTILE_MPI_TIMEOUT`` seconds (it stopped, or waits for something that never
comes) stops every rank (``MPI_Abort``: mpirun names the rank). So does an exception no
one catches on any rank (``install_excepthook``).
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import traceback
import zlib
from collections.abc import Iterator
from typing import Any

TIMEOUT_S = 300.0  # TORCH_NNTILE_MPI_TIMEOUT's default


class ProgramsDivergedError(RuntimeError):
    """The ranks recorded different ops, or read different values, at the same point."""


def timeout_s() -> float:
    raw = os.environ.get("TORCH_NNTILE_MPI_TIMEOUT", "")
    try:
        value = float(raw) if raw else TIMEOUT_S
    except ValueError:
        raise ValueError(f"TORCH_NNTILE_MPI_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"TORCH_NNTILE_MPI_TIMEOUT must be positive, got {raw!r}")
    return value


_HEAD = struct.Struct("<qqqq")  # crc of the description, its length, a read?, tiles requested


class Agreement:
    """The ranks' checks: a part of ``Runtime`` (runtime/context.py sets up its state)."""

    def agree(self, what: str, items: list[str]) -> None:
        """Check that every rank is at the same point, about to do the same: ``what`` (a
        compile, the end) with ``items`` (the ops it records). Raises
        ``ProgramsDivergedError`` on every rank where they differ; serves the reads of
        ranks that read a value alone meanwhile (``agree_read``)."""
        self._agree(what, items, None)

    def agree_read(self, item: str, handles: list[Any]) -> bool:
        """Before reading the value on tiles ``handles``: True when every rank reads it
        now (the readout runs on every rank); False when this rank reads it alone (the
        others, at their next check, sent the tiles they own: submit the readout with
        ``alone()``). Raises where an owner no longer holds a tile."""
        return self._agree("readout", [item], handles)

    def _agree(self, what: str, items: list[str], handles: list[Any] | None) -> bool:
        text = "\n".join([what, *items]).encode()
        request: list[int] = []  # (tag, owner) pairs of the tiles a read needs
        if handles is not None:
            tag, owner = self.lib.tnt_dist_tag, self.lib.tnt_dist_owner
            for h in handles:
                request += (tag(h), owner(h))
        crc = zlib.crc32(text)
        while True:
            k = self._agreements = self._agreements + 1
            heads = [_HEAD.unpack(b) for b in self._exchange(_HEAD.pack(crc, len(text), handles is not None,
                                                                           len(request)), what)]
            if all(h == heads[0] for h in heads):
                return True  # every rank does the same
            size = max(n + 8 * m for _, n, _, m in heads)
            mine = (text + struct.pack(f"<{len(request)}q", *request)).ljust(size, b"\0")
            texts, requests = [], []
            for b, (_, n, _, m) in zip(self._exchange(mine, what), heads):
                texts.append(b[:n].decode(errors="replace").split("\n"))
                requests.append(struct.unpack_from(f"<{m}q", b, n))
            readers = [r for r, h in enumerate(heads) if h[2]]
            others = {heads[r][0] for r in range(self.world_size) if r not in readers}
            if not readers or len(others) > 1:
                raise ProgramsDivergedError(_difference(texts, k))
            self._serve(readers, requests, texts, k)
            if handles is not None:
                return False  # read alone: its tiles are on their way
            # the readers go on; this rank checks its own step again

    def _serve(self, readers: list[int], requests: list[tuple[int, ...]], texts: list[list[str]], k: int) -> None:
        """Each reader gets the tiles it asked for from their owners; every rank calls this
        alike. A reader raises where an owner no longer holds a tile."""
        me, by_tag, fetch = self.rank, self._by_tag, self.lib.tnt_dist_fetch
        missing = [0] * self.world_size  # per reader: tiles this rank should own and lacks
        for q in readers:
            req = requests[q]
            for i in range(0, len(req), 2):
                t, owner = req[i], req[i + 1]
                if owner < 0 or (me != q and me != owner):
                    continue
                h = by_tag.get(t)
                if h is None:
                    missing[q] += 1
                else:
                    fetch(h, q)
        lacks = [struct.unpack("<" + "q" * self.world_size, b)
                 for b in self._exchange(struct.pack("<" + "q" * self.world_size, *missing), "readout")]
        if me in readers and any(row[me] for row in lacks):
            who = [r for r, row in enumerate(lacks) if row[me]]
            raise RuntimeError(f"torch_nntile: rank {me} read a value ({texts[me][-1]}) alone, and rank(s) {who} "
                               f"no longer hold its tiles (they were at: {', '.join(texts[r][0] for r in who)}). "
                               "Read it on every rank")

    def _exchange(self, mine: bytes, what: str) -> list[bytes]:
        n = len(mine)
        ffi = self.ffi
        buf = ffi.new("char[]", n * self.world_size)
        src = ffi.new("char[]", mine)
        if self.lib.tnt_dist_exchange(src, n, buf, self._timeout):
            sys.stderr.write(f"torch_nntile: rank {self.rank} of {self.world_size}: the other ranks did not reach "
                             f"{what} #{self._agreements} within {self._timeout:g} s (TORCH_NNTILE_MPI_TIMEOUT); "
                             "stopping every rank\n")
            sys.stderr.flush()
            self.lib.tnt_mpi_abort(1)
        raw = ffi.buffer(buf, n * self.world_size)[:]
        return [raw[r * n:(r + 1) * n] for r in range(self.world_size)]

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """Tasks submitted meanwhile run here, unplaced: a read by this rank alone."""
        self.lib.tnt_dist_set_alone(1)
        try:
            yield
        finally:
            self.lib.tnt_dist_set_alone(0)

    def install_excepthook(self) -> None:
        """An exception no one catches on this rank stops every rank, after its traceback:
        the others would wait for this one's tiles forever."""
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            previous(kind, exc, tb)
            if self.alive and self.world_size > 1:
                err = sys.__stderr__ or sys.stderr
                if sys.stderr is not err:  # torch.distributed's hook captures ours, to print it after: too late
                    traceback.print_exception(kind, exc, tb, file=err)
                err.write(f"torch_nntile: rank {self.rank} of {self.world_size} stopped on {kind.__name__}; "
                          "stopping every rank\n")
                err.flush()
                self.lib.tnt_mpi_abort(1)

        sys.excepthook = hook


def _difference(texts: list[list[str]], k: int) -> str:
    """The first point where the ranks' descriptions differ, in words."""
    what = [t[0] if t else "?" for t in texts]
    if len(set(what)) > 1:
        parts = "; ".join(f"rank {r}: {w}" for r, w in enumerate(what))
        return f"torch_nntile: the ranks' programs diverged at check #{k}: {parts}"
    longest = max(len(t) for t in texts)
    for i in range(1, longest):
        seen = [t[i] if i < len(t) else "(nothing more)" for t in texts]
        if len(set(seen)) > 1:
            parts = "; ".join(f"rank {r}: {s}" for r, s in enumerate(seen))
            return (f"torch_nntile: the ranks' programs diverged at {what[0]} #{k}, op {i}: {parts}. Every rank "
                    "must record the same ops and read the same values")
    return f"torch_nntile: the ranks' programs diverged at {what[0]} #{k}"
