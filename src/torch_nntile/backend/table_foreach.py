"""ATen table: the ``_foreach_*`` ops of ``torch.optim``, through the native per-tensor
ops (imported last: it registers only those). Elements alike in dtypes, dimensions and
scalars are recorded as one ``foreach`` graph op (a list of parameters is one op, not
one per parameter); others run element by element."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.backend.aten import (
    FORMS,
    IMPLS,
    REGISTERED,
    aten,
    check_live,
    inplace_error,
    overload_exists,
    register,
    write_inplace,
)
from torch_nntile.backend.device import NNTILE, _buf, is_nntile, new_tensor, read, to_cpu, write
from torch_nntile.backend.fallback import run_fallback
from torch_nntile.graph.nodes import DataNode
from torch_nntile.ops.base import MAP, NotNative, call_out, foreach_op

# ``_foreach_X`` runs ``X`` per list element through the dispatcher. Where ``X`` has
# no tensor-scalar overload, another op stands in (as ATen's own slow path does).
_FOREACH_STAND_IN = {("maximum", "Scalar"): "clamp_min", ("maximum", "ScalarList"): "clamp_min",
                     ("minimum", "Scalar"): "clamp_max", ("minimum", "ScalarList"): "clamp_max"}


def _foreach(name: str) -> bool:
    """Register the overload ``_foreach_X[_].ov`` when ``X`` is native here; whether it was.

    Arguments map onto ``X``'s by position: lists (``Tensor[]``, ``Scalar[]``) and the
    1-D ``Tensor scalars`` are indexed per element; a position where ``X`` takes a
    keyword-only argument (``addcmul``'s ``value``) is passed by that name."""
    base, _, ov = name.partition(".")
    op = getattr(aten, base)
    schema = getattr(op, ov or "default")._schema
    per_name = base[len("_foreach_"):]
    inplace = per_name.endswith("_")
    stem = per_name[:-1] if inplace else per_name
    stem = _FOREACH_STAND_IN.get((stem, ov), stem)
    per_name = stem + "_" if inplace else stem
    if not any(r.partition(".")[0] == per_name for r in REGISTERED):
        return False
    per = getattr(aten, per_name)
    per_ov = _PER_OVERLOAD.get((stem, ov), _PER_OVERLOAD.get(ov, "default"))
    if per_ov not in per.overloads():
        per_ov = next(o for o in per.overloads() if "out" not in o)
    per_schema = getattr(per, per_ov)._schema
    per_key = per_name if per_ov == "default" else f"{per_name}.{per_ov}"
    kwnames = {i: a.name for i, a in enumerate(per_schema.arguments) if a.kwarg_only}
    kinds = []  # per positional argument: "list", "scalar_list", "scalars" (1-D tensor of values) or "same"
    for a in schema.arguments:
        if a.kwarg_only:
            break
        listed = isinstance(a.type, torch.ListType)
        scalar_list = listed and isinstance(a.type.getElementType(), torch.NumberType)
        kinds.append("scalar_list" if scalar_list else "list" if listed
                     else "scalars" if a.name == "scalars" and str(a.type) == "Tensor" else "same")
    # Called from inside a kernel of ours (below autograd), the element op's own kernel
    # here is what the dispatcher would pick: run it directly, skipping the dispatch.
    # Where defop / forms derived it, run its functional form and do per element only
    # what its kernel would beyond that (the liveness check and the record phase are
    # this call's, once).
    form, overload = FORMS.get(per_key), getattr(per, per_ov)
    elements = _direct(form, overload, f"aten::{per_key}") if form else _through(IMPLS.get(per_key, overload))

    def f(*args: Any, **kw: Any) -> Any:
        args = list(args)
        for j, k in enumerate(kinds[:len(args)]):
            if k == "scalars":
                v = args[j]
                args[j] = (to_cpu(v) if is_nntile(v) else v).tolist()
        n = next(len(a) for a, k in zip(args, kinds) if k != "same")
        for a, k in zip(args, kinds):
            if k != "same" and len(a) != n:
                raise RuntimeError(_length_error(k, n, len(a)))
        cols: list[Any] = []  # per positional argument of X: its values, one per element
        kws = dict(kw)
        listed: list[tuple[str, list[Any]]] = []  # X's keyword arguments that vary per element
        for j, (a, k) in enumerate(zip(args, kinds)):
            if j in kwnames:
                if k == "same":
                    kws[kwnames[j]] = a
                else:
                    listed.append((kwnames[j], a))
            else:
                cols.append(repeat(a, n) if k == "same" else a)
        if listed:
            per_kw = [{**kws, **{key: a[i] for key, a in listed}} for i in range(n)]
        else:
            per_kw = repeat(kws, n)
        outs = elements(zip(*cols), per_kw) if n else []
        return None if inplace else outs

    register(name, f)
    return True


def _length_error(kind: str, n: int, m: int) -> str:
    """CPU's message for a list argument of ``m`` elements beside ``n`` tensors."""
    if kind == "scalar_list":
        return "Tensor list must have same number of elements as scalar list."
    if kind == "scalars":
        return f"Expected length of scalars to match input of length {n} but got {m} instead."
    return f"Tensor lists must have the same number of tensors, got {n} and {m}"


Elements = Callable[[Iterable[tuple], Iterable[dict[str, Any]]], list[Any]]


def _through(kernel: Callable[..., Any]) -> Elements:
    """Run each element through the element op's registered kernel."""
    def run(pos: Iterable[tuple], kws: Iterable[dict[str, Any]]) -> list[Any]:
        return [kernel(*p, **k) for p, k in zip(pos, kws)]
    return run


def _direct(form: tuple[Callable[..., DataNode], bool], overload: Any, key: str) -> Elements:
    """Run each element through the element op's functional form, as its kernel
    (``recorded`` over the form's ``functional`` / ``in_place``) would, less what one
    foreach call does once: an element the form declines runs on the fallback; each
    one recorded natively counts as a call of the element op."""
    fn, in_place = form
    calls = stats.OP_CALLS

    def run(pos: Iterable[tuple], kws: Iterable[dict[str, Any]]) -> list[Any]:
        check_live()
        pos, kws = list(pos), list(kws)
        outs = _together(fn, in_place, pos, kws)
        if outs is not None:
            calls[key] += len(outs)
            return outs
        outs = []
        for p, k in zip(pos, kws):
            try:
                value = fn(*p, **k)
                if in_place:
                    write_inplace(p[0], value)
                    out = p[0]
                else:
                    out = new_tensor(value)
            except NotNative as e:
                outs.append(run_fallback(overload, p, dict(k), str(e)))
                continue
            calls[key] += 1
            outs.append(out)
        return outs
    return run


def _together(fn: Callable[..., DataNode], in_place: bool, pos: list[tuple], kws: list[dict[str, Any]]) -> list[Any] | None:
    """The elements recorded as ``foreach`` graph ops, one per group of elements alike in
    what an elementwise form's kernel and dtype depend on (``_alike``); None (nothing
    written) where that does not apply: then element by element, as before.

    Each element's tensors and their payloads are looked up once, for the grouping,
    the aliasing check and the reads (an optimizer step meets every parameter in
    each of its calls)."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    tensors: list[list[torch.Tensor]] = []
    for i, (p, k) in enumerate(zip(pos, kws)):
        ts: list[torch.Tensor] = []
        sig = _alike(p, k, ts)
        if sig is None:
            return None
        groups.setdefault(sig, []).append(i)
        tensors.append(ts)
    if len(groups) == len(pos):
        return None  # no two alike
    bufs = [[_buf(a) for a in ts] for ts in tensors]
    if in_place and _aliased(bufs):
        return None
    values: list[Any] = [None] * len(pos)
    for sig, idx in groups.items():
        got = _record_alike(fn, sig, [pos[i] for i in idx], [kws[i] for i in idx], [tensors[i] for i in idx],
                            [bufs[i] for i in idx])
        if got is None:
            return None
        for i, v in zip(idx, got):
            values[i] = v
    if not in_place:
        return [new_tensor(v) for v in values]
    targets = [p[0] for p in pos]
    if any(inplace_error(t, v) is not None for t, v in zip(targets, values)):
        return None  # element by element, each raising as its op would (the ops recorded are left unread)
    for t, v in zip(targets, values):
        write(t, v)
    return targets


# (form, signature, keyword names, default dtype) -> the (kernel, name, dtype) its probe
# recorded: an optimizer's calls repeat every step, most with the same scalars.
_PROBED: dict[tuple[Any, ...], tuple[Any, str, torch.dtype]] = {}
_PROBED_MAX = 256  # distinct signatures kept (changing scalars, e.g. bias corrections, make new ones)


def _record_alike(fn: Callable[..., DataNode], sig: tuple[Any, ...], pos: list[tuple], kws: list[dict[str, Any]],
                  tensors: list[list[torch.Tensor]], bufs: list[list[Any]]) -> list[DataNode] | None:
    """The results of alike elements (signature ``sig``): one ``foreach`` op where the
    element op is one map of the element's tensors (``tensors``, their payloads
    ``bufs``), in order, whose kernel is made from the arguments alone (``call_out``).
    The first element runs the form to learn that kernel (its op is left unread and
    pruned, unless it is the only element); a later call with the same signature takes
    the kernel learned then, since the signature is all the kernel depends on."""
    key = (fn, sig, tuple(kws[0]), torch.get_default_dtype())
    known = _PROBED.get(key) if len(pos) > 1 else None
    if known is None:
        try:
            probe = fn(*pos[0], **kws[0])
        except NotNative:
            return None
        if len(pos) == 1:
            return [probe]
        op = probe.op
        if (op is None or op.opdef is not MAP or op.outputs[0] is not probe
                or getattr(op.attrs[0], "fn", None) is not call_out):
            return None
    nodes = [[_read(a, b) for a, b in zip(ts, bs)] for ts, bs in zip(tensors, bufs)]
    if known is None:
        if op.inputs != tuple(nodes[0]):  # nodes compare by identity
            return None
        known = (*op.attrs, probe.dtype)
        if len(_PROBED) >= _PROBED_MAX:
            _PROBED.clear()
        _PROBED[key] = known
    kernel, name, dtype = known
    try:
        return list(foreach_op(name, kernel, nodes, dtype))
    except RuntimeError:  # shapes that do not broadcast: raised element by element, as the op would
        return None


def _read(t: torch.Tensor, buf: Any) -> DataNode:
    """``read(t)`` for ``t`` with payload ``buf``: its node itself where ``t`` is the whole
    contiguous value (a parameter, a gradient, an optimizer state), else through ``read``."""
    node = buf.node
    if t.shape == node.shape and t.is_contiguous() and not (t.is_conj() or t.is_neg()):
        return node
    return read(t)


def _aliased(bufs: list[list[Any]]) -> bool:
    """Whether an in-place call's elements share storage (``bufs``: per element the
    payloads of its tensors, the target first): two targets, or a target and another
    element's input. Element by element, a later element then reads (or writes again)
    what an earlier one wrote, as on CPU; one op would read every value before."""
    owner: dict[int, int] = {}
    for i, bs in enumerate(bufs):
        if owner.setdefault(id(bs[0]), i) != i:
            return True
    for i, bs in enumerate(bufs):
        for b in bs:
            if owner.get(id(b), i) != i:
                return True
    return False


def _alike(p: tuple, k: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[Any, ...] | None:
    """What an elementwise form's kernel and dtype depend on: per argument a tensor's
    dtype and dimensions, a number's type and value (-0.0 told from 0.0); None for
    other arguments (CPU tensors, lists). The element's tensors are appended to
    ``tensors``, in argument order. (A lazily conjugated or negated tensor reads as a
    value of its own: ``read`` resolves the bits.)"""
    sig: list[Any] = []
    for a in (*p, *k.values()) if k else p:
        t = type(a)
        if t is float:
            sig.append((float, a, math.copysign(1.0, a)))
        elif isinstance(a, torch.Tensor):
            if a.device != NNTILE:
                return None
            sig.append((a.dtype, a.dim()))
            tensors.append(a)
        elif t is int or t is bool or t is str or a is None:
            sig.append((t, a))
        else:
            return None
    return tuple(sig)


# The element op overload each foreach overload runs: by (op, overload), else by overload.
_PER_OVERLOAD = {"List": "Tensor", "Tensor": "Tensor", "Scalar": "Scalar", "ScalarList": "Scalar",
                 ("pow", "List"): "Tensor_Tensor", ("pow", "Scalar"): "Tensor_Scalar",
                 ("pow", "ScalarList"): "Tensor_Scalar", ("pow", "ScalarAndTensor"): "Scalar",
                 ("addcmul", "Scalar"): "default", ("addcmul", "ScalarList"): "default",
                 ("addcmul", "Tensor"): "default", ("addcdiv", "Scalar"): "default",
                 ("addcdiv", "ScalarList"): "default", ("addcdiv", "Tensor"): "default",
                 ("clamp_min", "List"): "Tensor", ("clamp_max", "List"): "Tensor"}

_UNARY_FOREACH = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor",
                  "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt",
                  "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc")
_LIST_FOREACH = {
    "add": ("List", "Scalar", "ScalarList", "Tensor"), "sub": ("List", "Scalar", "ScalarList"),
    "mul": ("List", "Scalar", "ScalarList", "Tensor"), "div": ("List", "Scalar", "ScalarList", "Tensor"),
    "pow": ("List", "Scalar", "ScalarList", "ScalarAndTensor"),
    "maximum": ("List", "Scalar", "ScalarList"), "minimum": ("List", "Scalar", "ScalarList"),
    "clamp_min": ("List", "Scalar", "ScalarList"), "clamp_max": ("List", "Scalar", "ScalarList"),
    "addcmul": ("Scalar", "ScalarList", "Tensor"), "addcdiv": ("Scalar", "ScalarList", "Tensor"),
    "lerp": ("List", "Scalar", "ScalarList"),
}


def _register_foreach() -> None:
    names = [f"_foreach_{u}{s}" for u in _UNARY_FOREACH for s in ("", "_")]
    names += [f"_foreach_{b}{s}.{ov}" for b, ovs in _LIST_FOREACH.items() for ov in ovs for s in ("", "_")]
    names += ["_foreach_zero_", "_foreach_copy_", "_foreach_clone"]  # _foreach_zero/copy return self_out: not ours
    for n in names:
        if overload_exists(n):
            _foreach(n)


_register_foreach()
