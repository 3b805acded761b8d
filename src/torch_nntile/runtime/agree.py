"""Over several ranks: the ranks check, at each compile and each readout, that they run the
same program, and stop together instead of waiting forever for one another.

Every rank records the same ops and reads the same values: that is how they agree on
owners and tags without talking (runtime/csrc/dist.c). A rank that recorded other ops,
or read a value the others did not, would wait for tiles nobody sends. So at each such
point the ranks exchange a hash of what they are about to do; where the hashes differ,
they exchange the descriptions and raise ``ProgramsDivergedError`` naming the first
difference, every rank alike. A rank that does not arrive within
``TORCH_NNTILE_MPI_TIMEOUT`` seconds (it stopped, or waits for something that never
comes) stops every rank (``MPI_Abort``: mpirun names the rank). So does an exception no
one catches on any rank (``install_excepthook``).
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
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


class Agreement:
    """The ranks' checks: a part of ``Runtime`` (runtime/context.py sets up its state)."""

    def agree(self, what: str, items: list[str]) -> None:
        """Check that every rank is at the same point, about to do the same: ``what`` (a
        compile, a readout, the end) with ``items`` (the ops it records, the value it
        reads). Raises ``ProgramsDivergedError`` on every rank where they differ."""
        self._agreements += 1
        text = "\n".join([what, *items]).encode()
        mine = struct.pack("<qq", zlib.crc32(text), len(text))
        hashes = [struct.unpack_from("<qq", b) for b in self._exchange(mine, what)]
        if all(h == hashes[0] for h in hashes):
            return
        size = max(n for _, n in hashes)
        texts = [b.rstrip(b"\0").decode(errors="replace").split("\n")
                 for b in self._exchange(text.ljust(size, b"\0"), what)]
        raise ProgramsDivergedError(_difference(texts, self._agreements))

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

    def install_excepthook(self) -> None:
        """An exception no one catches on this rank stops every rank, after its traceback:
        the others would wait for this one's tiles forever."""
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            previous(kind, exc, tb)
            if self.alive and self.distributed:
                sys.stderr.write(f"torch_nntile: rank {self.rank} of {self.world_size} stopped on "
                                 f"{kind.__name__}; stopping every rank\n")
                sys.stderr.flush()
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
