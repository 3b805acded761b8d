"""Untiled and batched tasks run as C++ calls of their ATen op, without the GIL.

A task of an op with no tiled kernel (``untiled.run_untiled``: a convolution per batch
tile, any op with a Meta kernel) would call the op from Python: the worker takes the
GIL for the call's glue, and waits for it while the host records in Python. Its C
record (``native.TYPED`` of ``run_untiled``) is instead, in order:

- the op's own C kernel where ``ops/pooling.py`` has one (2-d max pooling);
- else a call of the op prepared in the backend's C++ library
  (``csrc/aten_calls.cpp``) from the arguments encoded here, once per op, arguments
  and tile shapes: the worker wraps its buffers in tensors, calls the op through the
  dispatcher and copies the results into its output tiles.

Arguments the op writes are handled as ``run_untiled`` handles them (an input it writes
in place is copied first, an ``out=`` argument nothing reads is an empty tensor, both
copied into the output tile after the call). Calls this encoding does not cover (a
kernel written in Python such as CUDA's integer ``histc``, an argument type it does not
know) and builds without the C++ library run as Python.
An exception the op raises fails the task with the Python type and message PyTorch
gives it (``native.ATEN_ERROR``).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from torch_nntile.backend.device import NATIVE
from torch_nntile.backend.native_lib import native_library
from torch_nntile.backend.untiled import TILE_OUT, run_untiled
from torch_nntile.kernels import CpuScalar, Slot, native
from torch_nntile.ops import pooling
from torch_nntile.ops.base import by_name

# argument tokens and error types of csrc/aten_calls.cpp, in its order
(NONE, INT, FLOAT, BOOL, STR, INTS, FLOATS, BOOLS, SLOT, SLOTS, OPT_SLOTS, SCALAR_TENSOR, DEVICE_CPU) = range(13)
_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, IndexError, ValueError, TypeError, NotImplementedError,
                                            torch.linalg.LinAlgError, torch.OutOfMemoryError)
# c10::ScalarType, Layout and MemoryFormat by their enums' values
_DTYPES = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
           torch.float32: 6, torch.float64: 7, torch.complex64: 9, torch.complex128: 10, torch.bool: 11,
           torch.bfloat16: 15}
_ENUMS = {torch.strided: 0, torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
          torch.channels_last_3d: 3}
_LISTS = {"List[int]": (INTS, (int,)), "List[float]": (FLOATS, (int, float)), "List[bool]": (BOOLS, (bool,))}
_OVERLOAD = torch._ops.OpOverload

# Python forms of ops (backend/fallback.py's CPU forms of the backend hooks) that are a
# call of another op: form -> (op, function giving its arguments from the form's
# arguments and the tiles' shapes by Slot)
REWRITES: dict[Any, tuple[Any, Any]] = {}


def _lib() -> Any:
    path = native_library()
    if path is None or not NATIVE:  # not built, or built for another torch (native_lib.native_library)
        return None
    lib = ctypes.PyDLL(path)
    lib.tnt_aten_prepare.restype = ctypes.c_size_t
    lib.tnt_aten_prepare.argtypes = [ctypes.py_object]
    lib.tnt_aten_last_error.restype = ctypes.c_int
    lib.tnt_aten_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib


_LIB = _lib()
# (params, shapes, dtypes) -> the prepared call's address (0: none). Apart from native's
# record cache, which is bounded and cleared: a key seen again must find its call, not
# prepare (and keep) another.
_CALLS: dict[Any, int] = {}


def last_error() -> BaseException:
    """The exception of the last call that raised on this (worker) thread."""
    buf = ctypes.create_string_buffer(4096)
    kind = _LIB.tnt_aten_last_error(buf, len(buf))
    return _ERRORS[kind](buf.value.decode(errors="replace"))


def _token(t: str, v: Any, buf: dict[int, int]) -> tuple[Any, ...] | None:
    """The token of argument value ``v`` of schema type ``t`` (as ``str`` of the
    argument's type: ``Optional[Tensor]``, ``List[int]``, ``number`` for a Scalar; a
    ScalarType, Layout or MemoryFormat is an ``int``), tiles by ``Slot`` (``Slot(i)``:
    the task's buffer ``buf[i]``); None for one the C++ side does not take."""
    if t.startswith("Optional["):
        return (NONE,) if v is None else _token(t[9:-1], v, buf)
    tv = type(v)
    if t == "Tensor":
        if tv is Slot:
            return (SLOT, buf[v.i]) if v.i in buf else None
        if tv is CpuScalar and v.dtype in _DTYPES and not v.dtype.is_complex:
            return (SCALAR_TENSOR, v.value, _DTYPES[v.dtype])
        return None
    if t in ("List[Tensor]", "List[Optional[Tensor]]"):
        opt = t != "List[Tensor]"
        if tv is not tuple or not all(type(x) is Slot and x.i in buf or opt and x is None for x in v):
            return None
        return (OPT_SLOTS if opt else SLOTS, tuple(-1 if x is None else buf[x.i] for x in v))
    if t == "int":
        code = _DTYPES.get(v) if tv is torch.dtype else _ENUMS.get(v) if tv in (torch.layout, torch.memory_format) \
            else v if tv is int else None
        return (INT, code) if code is not None and type(code) is int else None
    if t == "float":
        return (FLOAT, float(v)) if tv in (int, float) else None
    if t == "bool":
        return (BOOL, v) if tv is bool else None
    if t == "number":
        return {bool: (BOOL, v), int: (INT, v), float: (FLOAT, v)}.get(tv)
    if t == "str":
        return (STR, v) if tv is str else None
    if t == "Device":
        return (DEVICE_CPU,) if tv is torch.device and v.type == "cpu" else None
    kind = _LISTS.get(t)
    if kind is None or tv not in (tuple, list) or not all(type(x) in kind[1] for x in v):
        return None
    return (kind[0], tuple(float(x) for x in v) if kind[0] == FLOATS else tuple(v))


def _spec(op: Any, args: tuple[Any, ...], kw: dict[str, Any], fresh: tuple[int, ...], written: tuple[Any, ...],
          shapes: tuple[tuple[int, ...], ...], dtypes: tuple[torch.dtype, ...]) -> tuple[Any, ...] | None:
    """csrc/aten_calls.cpp's spec of a ``run_untiled`` task (its params but the op, and its
    tiles), or None."""
    if not all(d in _DTYPES for d in dtypes):
        return None
    nfresh, nout = len(fresh), len(fresh) + len(written)
    buf = {i: nout + i for i in range(len(shapes) - nout)}  # the input tiles
    appended = [k for k, w in enumerate(written) if type(w) is not int]  # run_untiled's extra arguments, in order
    buf.update({j - len(appended): nfresh + k for j, k in enumerate(appended)})
    writes = tuple((1, nout + w) if type(w) is int else (0, 0) if w == TILE_OUT else (2, _DTYPES.get(w, -1))
                   for w in written)
    if any(v < 0 for _, v in writes):
        return None
    named = by_name(op, args, kw)
    toks = []
    for a in op._schema.arguments:
        tok = _token(str(a.type), named[a.name], buf) if a.name in named else None
        if tok is None:
            return None
        toks.append(tok)
    s = op._schema
    return s.name, s.overload_name, tuple(shapes), tuple(_DTYPES[d] for d in dtypes), fresh, writes, tuple(toks)


def _aten_record(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                 dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple[float, ...]] | None:
    key = (params, shapes, dtypes)
    addr = _CALLS.get(key)
    if addr is None:
        run, args, kw, fresh, written = params
        rewrite = REWRITES.get(run)
        if rewrite is not None:
            run, (args, kw) = rewrite[0], rewrite[1](args, dict(kw), shapes, len(fresh) + len(written))
        spec = _spec(run, args, dict(kw), fresh, written, shapes, dtypes) if type(run) is _OVERLOAD else None
        addr = _CALLS[key] = _LIB.tnt_aten_prepare(spec) if spec is not None else 0
    return ([native.ATEN, len(shapes)], (float(addr),)) if addr else None


def _record(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
            dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple[float, ...]] | None:
    got = pooling.c_record(params, shapes, dtypes)
    return got if got is not None else _aten_record(params, shapes, dtypes)


if _LIB is not None:
    native.TYPED[run_untiled] = _record
    native.ATEN_RUNNER = ctypes.cast(_LIB.tnt_aten_run, ctypes.c_void_p).value or 0
    native.ATEN_ERROR = last_error
else:
    native.TYPED[run_untiled] = pooling.c_record
