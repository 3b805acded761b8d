"""Tile kernels that the runtime can run natively, without Python.

Most kernels are plain Python callables over torch tensors (defined beside their
ops). The ones here are also described as data, so that the runtime can run them
in C on the StarPU worker (no interpreter, no GIL) when the platform allows; called
as Python they give the same result through torch.
"""

from __future__ import annotations

from functools import cache

import torch


class Gemm:
    """``o = alpha * op(x) @ op(y)``, plus ``o`` when ``accumulate``; ``op`` transposes
    when ``ta`` / ``tb`` is set. Tiles are contiguous row-major matrices. With
    ``packed_b``, ``y`` is a ``PackB`` result (already transposed and scaled): such
    products run only natively."""

    __slots__ = ("ta", "tb", "alpha", "accumulate", "packed_b")

    def __init__(self, ta: bool, tb: bool, alpha: float, accumulate: bool, packed_b: bool = False) -> None:
        self.ta, self.tb, self.alpha, self.accumulate, self.packed_b = ta, tb, alpha, accumulate, packed_b

    def __call__(self, o: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.packed_b:
            raise RuntimeError("a product with a packed operand can only run as a native kernel")
        x = x.t() if self.ta else x
        y = y.t() if self.tb else y
        if self.accumulate:
            o.addmm_(x, y, alpha=self.alpha)
        else:
            torch.mm(x, y, out=o)
            if self.alpha != 1:
                o.mul_(self.alpha)


class PackB:
    """Packs a float32 B operand (k x n; stored n x k when ``tb``), scaled by ``alpha``,
    into the BLAS's internal layout for products with ``m`` rows, so that products
    sharing it skip their own packing. Native only: the layout is the BLAS's secret."""

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
