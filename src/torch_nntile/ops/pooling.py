"""C kernels for ATen ops that otherwise run PyTorch's CPU kernel on their tiles
(``backend/untiled.py``, ``ops/batched.py``): 2-d max pooling with its indices, and its
backward, over float32 tiles ``[..., H, W]``.

Such a task's kernel is ``untiled.run_untiled`` with the op among its parameters;
``c_record`` gives its C record (``csrc/rows.h``) where the op and the tiles have one,
so that the workers run it without Python. PyTorch's CPU max pooling (channels first)
takes about 5 ns an input element for 2x2 windows here, ten times a pass over memory;
the C kernel takes each window's maximum as PyTorch does (NaN taken, the first of
equal values kept), so values and indices match exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.kernels import Slot, native
from torch_nntile.ops.base import by_name

_aten = torch.ops.aten
_F32, _I64 = torch.float32, torch.int64
Record = tuple[list[int], tuple[float, ...]]


def _pair(v: Any, default: tuple[int, int] | None = None) -> tuple[int, int]:
    """An int-list argument of a 2-d pooling as two ints (one value serves both; empty:
    ``default``)."""
    v = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if not v and default is not None:
        return default
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _window(a: dict[str, Any]) -> list[int]:
    """kh, kw, sh, sw, ph, pw, dh, dw of a 2-d max pooling's arguments by name."""
    k = _pair(a["kernel_size"])
    return [*k, *_pair(a["stride"], k), *_pair(a["padding"]), *_pair(a["dilation"])]


def _planes(x: tuple[int, ...], y: tuple[int, ...]) -> int | None:
    """The planes of input ``x`` and output ``y`` (``[..., H, W]`` each), or None where
    their leading dims differ."""
    if len(x) < 3 or len(y) != len(x) or x[:-2] != y[:-2]:
        return None
    return native.numel(x[:-2])


def _max_pool(a: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
              dtypes: tuple[torch.dtype, ...]) -> Record | None:
    if dtypes != (_F32, _I64, _F32) or a["self"] != Slot(0) or shapes[0] != shapes[1]:
        return None
    y, _, x = shapes
    planes = _planes(x, y)
    ints = [planes, x[-2], x[-1], y[-2], y[-1], *_window(a)] if planes is not None else []
    return ([native.MAX_POOL2D, *ints], ()) if ints and native.fits_int32(*ints) else None


def _max_pool_grad(a: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
                   dtypes: tuple[torch.dtype, ...]) -> Record | None:
    if (dtypes != (_F32, _F32, _F32, _I64) or (a["grad_output"], a["self"], a["indices"]) != (Slot(0), Slot(1), Slot(2))
            or shapes[0] != shapes[2] or shapes[1] != shapes[3]):
        return None
    gi, g = shapes[:2]
    planes = _planes(gi, g)
    ints = [planes, gi[-2], gi[-1], g[-2], g[-1]] if planes is not None else []
    return ([native.MAX_POOL2D_GRAD, *ints], ()) if ints and native.fits_int32(*ints) else None


_FORMS: dict[Any, tuple[Callable[..., Record | None], int]] = {  # op -> record builder, its buffers
    _aten.max_pool2d_with_indices.default: (_max_pool, 3),
    _aten.max_pool2d_with_indices.out: (_max_pool, 3),
    _aten.max_pool2d_with_indices_backward.default: (_max_pool_grad, 4),
    _aten.max_pool2d_with_indices_backward.grad_input: (_max_pool_grad, 4),
}


def c_record(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
             dtypes: tuple[torch.dtype, ...]) -> Record | None:
    """``native.TYPED`` of ``run_untiled``: the C record of a task running op ``params[0]``
    on these tiles (outputs first, then the inputs its ``Slot``s name), or None."""
    form = _FORMS.get(params[0])
    if form is None or len(shapes) != form[1]:
        return None
    build, _ = form
    return build(by_name(params[0], params[1], dict(params[2])), shapes, dtypes)
