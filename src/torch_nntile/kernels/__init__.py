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
    when ``ta`` / ``tb`` is set. Tiles are contiguous row-major matrices."""

    __slots__ = ("ta", "tb", "alpha", "accumulate")

    def __init__(self, ta: bool, tb: bool, alpha: float, accumulate: bool) -> None:
        self.ta, self.tb, self.alpha, self.accumulate = ta, tb, alpha, accumulate

    def __call__(self, o: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        x = x.t() if self.ta else x
        y = y.t() if self.tb else y
        if self.accumulate:
            o.addmm_(x, y, alpha=self.alpha)
        else:
            torch.mm(x, y, out=o)
            if self.alpha != 1:
                o.mul_(self.alpha)


@cache
def gemm(ta: bool, tb: bool, alpha: float, accumulate: bool) -> Gemm:
    """The (shared) kernel for one combination of flags."""
    return Gemm(ta, tb, alpha, accumulate)
