"""ATen table: the ``_foreach_*`` ops of ``torch.optim``, run element by element
through the native per-tensor ops (imported last: it registers only those)."""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.backend.aten import IMPLS, REGISTERED, aten, overload_exists, register
from torch_nntile.backend.device import is_nntile, to_cpu

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
    # Called from inside a kernel of ours (below autograd), the element op's own kernel
    # here is what the dispatcher would pick: call it directly, skipping the dispatch.
    per = IMPLS.get(per_name if per_ov == "default" else f"{per_name}.{per_ov}", per)
    kwnames = {i: a.name for i, a in enumerate(per_schema.arguments) if a.kwarg_only}
    kinds = []  # per positional argument: "list", "scalars" (1-D tensor of values) or "same"
    for a in schema.arguments:
        if a.kwarg_only:
            break
        listed = isinstance(a.type, torch.ListType)
        kinds.append("list" if listed else "scalars" if a.name == "scalars" and str(a.type) == "Tensor" else "same")

    def f(*args: Any, **kw: Any) -> Any:
        args = list(args)
        for j, k in enumerate(kinds[:len(args)]):
            if k == "scalars":
                v = args[j]
                args[j] = (to_cpu(v) if is_nntile(v) else v).tolist()
        n = next(len(a) for a, k in zip(args, kinds) if k != "same")
        for a, k in zip(args, kinds):
            if k != "same" and len(a) != n:
                raise RuntimeError(f"{name}: Tensor lists must have the same number of tensors, got {n} and {len(a)}")
        outs = []
        for i in range(n):
            pos: list[Any] = []
            kws = dict(kw)
            for j, (a, k) in enumerate(zip(args, kinds)):
                v = a if k == "same" else a[i]
                if j in kwnames:
                    kws[kwnames[j]] = v
                else:
                    pos.append(v)
            outs.append(per(*pos, **kws))
        return None if inplace else outs

    register(name, f)
    return True


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
