"""Tile kernels as data.

Every tile task's kernel is data: a ``Kernel`` (a module-level function, defined
beside its op, and the static parameters it is called with) or one of the kernels
below that the runtime can also run in C on the StarPU worker (no interpreter, no
GIL) when the platform allows; called as Python they give the same result through
torch. Equal kernels compare equal, so a lowered step can be recognized, and a
kernel's identity says which C implementation could run it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import torch


class Kernel:
    """``fn(*params, *tiles)``: ``fn`` a module-level function, ``params`` its static
    (hashable) parameters, the tiles the task's operands in order."""

    __slots__ = ("fn", "params", "_hash")

    def __init__(self, fn: Callable[..., None], *params: Any) -> None:
        self.fn, self.params = fn, params
        self._hash: int | None = None

    def __call__(self, *tiles: torch.Tensor) -> None:
        self.fn(*self.params, *tiles)

    def __eq__(self, other: object) -> bool:  # the hashes tell -0.0 from 0.0, 1.0 from 1, which == does not
        return type(other) is Kernel and other.fn is self.fn and hash(other) == hash(self) and other.params == self.params

    def __hash__(self) -> int:  # worked out once: kernels of fused chains nest
        h = self._hash
        if h is None:
            h = self._hash = hash((self.fn, self.params, _number_kinds(self.params)))
        return h

    def __repr__(self) -> str:
        return f"Kernel({self.fn.__name__}{self.params!r})"


def _number_kinds(params: tuple[Any, ...]) -> int:
    """Where floats (``-0.0`` apart) and bools sit among ``params`` (0 if nowhere): equal
    kernels must not differ there, as numbers that compare equal may act differently (a
    fill of -0.0 is not one of 0.0; ``x == 16777217`` compares int64 values where
    ``x == 16777217.0`` compares float32 ones). Nested kernels' hashes tell their own."""
    out = 0
    for i, p in enumerate(params):
        t = type(p)
        if t is float:
            out ^= hash(("-0" if p == 0.0 and math.copysign(1.0, p) < 0 else "f", i))
        elif t is bool:
            out ^= hash(("b", i))
        elif t is tuple:
            inner = _number_kinds(p)
            if inner:
                out ^= hash((i, inner))
    return out


class Marker:
    """A kernel parameter standing for something of each task, numbered ``i``: equal
    only to a marker of its own class and number (never to an int), so kernels that
    hold one are told apart in every cache."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.i == self.i  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.i))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.i})"


class Slot(Marker):
    """A kernel parameter that stands for the task's input tile ``i``, where a kernel
    calls an op with its tiles among other arguments (``backend/untiled.py``)."""

    __slots__ = ()


class CpuScalar:
    """A CPU 0-dim tensor an op was called with, as a kernel parameter: its value and
    dtype (it promotes as a tensor, and the caller may change the tensor later)."""

    __slots__ = ("value", "dtype")

    def __init__(self, t: torch.Tensor) -> None:
        self.value, self.dtype = t.item(), t.dtype

    def tensor(self) -> torch.Tensor:
        return torch.tensor(self.value, dtype=self.dtype)

    def __eq__(self, other: object) -> bool:
        return type(other) is CpuScalar and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Any, ...]:  # -0.0, 0.0, 0 and False are different values here
        v = self.value
        return (type(v), v.hex() if type(v) is float else v, self.dtype)

    def __repr__(self) -> str:
        return f"CpuScalar({self.value!r}, {self.dtype})"


class Gemm:
    """``o = alpha * op(x) @ op(y)``, plus ``o`` when ``accumulate``; ``op`` transposes
    when ``ta`` / ``tb`` is set. Tiles are contiguous row-major matrices, or batches of
    them (3-D tiles: one product per batch item). With ``packed_b``, ``y`` is a
    ``PackB`` result (already transposed and scaled): such products run only natively."""

    __slots__ = ("ta", "tb", "alpha", "accumulate", "packed_b")

    def __init__(self, ta: bool, tb: bool, alpha: float, accumulate: bool, packed_b: bool = False) -> None:
        self.ta, self.tb, self.alpha, self.accumulate, self.packed_b = ta, tb, alpha, accumulate, packed_b

    def __call__(self, o: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.packed_b:
            raise RuntimeError("a product with a packed operand can only run as a native kernel")
        x = x.mT if self.ta else x
        y = y.mT if self.tb else y
        batched = o.dim() == 3
        if self.accumulate:
            (o.baddbmm_ if batched else o.addmm_)(x, y, alpha=self.alpha)
        else:
            (torch.bmm if batched else torch.mm)(x, y, out=o)
            if self.alpha != 1:
                o.mul_(self.alpha)


class PackB:
    """Packs a float32 B operand (k x n; stored n x k when ``tb``), scaled by ``alpha``,
    into the layout of the kernels that run the packed products (the shim's own, for
    any row count; else the BLAS's internal one for products with ``m`` rows), so that
    products sharing it skip their own packing. Native only."""

    __slots__ = ("tb", "m", "n", "k", "alpha")

    def __init__(self, tb: bool, m: int, n: int, k: int, alpha: float) -> None:
        self.tb, self.m, self.n, self.k, self.alpha = tb, m, n, k, alpha

    def __call__(self, *tiles: torch.Tensor) -> None:
        raise RuntimeError("packing an operand can only run as a native kernel")


@cache
def gemm(ta: bool, tb: bool, alpha: float, accumulate: bool, packed_b: bool = False) -> Gemm:
    """The (shared) kernel for one combination of flags."""
    return Gemm(ta, tb, alpha, accumulate, packed_b)


@cache
def pack_b(tb: bool, m: int, n: int, k: int, alpha: float) -> PackB:
    return PackB(tb, m, n, k, alpha)


KernelData = Kernel | Gemm | PackB
KERNEL_TYPES = (Kernel, Gemm, PackB)
