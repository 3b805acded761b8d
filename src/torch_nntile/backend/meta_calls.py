"""PyTorch's Meta kernels, called once per signature.

A training loop calls the same ops on the same shapes every step, and some Meta kernels
are slow Python (max pooling's decomposition takes milliseconds). What a Meta call gave
is kept per op and signature of its arguments (shapes, strides and dtypes of tensors,
values of the rest): which results are which arguments (in place, ``out=``), the shape,
strides and dtype of each new one, and the shapes ``out=`` arguments were resized to.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

_CACHE: dict[Any, Any] = {}
_LIMIT = 4096  # signatures kept; past that, the cache starts anew
_META = torch.device("meta")


def _sig(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.stride(), x.dtype)
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_sig(v) for v in x))
    if isinstance(x, dict):
        return tuple((k, _sig(v)) for k, v in x.items())
    hash(x)  # TypeError: not kept
    return (type(x), x)


def meta_call(run: Any, args: list[Any], kwargs: dict[str, Any], written: list[torch.Tensor]) -> Any:
    """``run(*args, **kwargs)`` on meta tensors, from the cache where it has been seen;
    ``written``: the arguments the call may resize."""
    try:
        key = (run, _sig(args), _sig(kwargs))
    except TypeError:
        return run(*args, **kwargs)
    flat = tree_flatten((args, kwargs))[0]
    hit = _CACHE.get(key)
    if hit is not None:
        spec, template, resized = hit
        for i, shape, stride in resized:
            t = flat[i]
            if tuple(t.shape) != shape:
                t.resize_(shape)
            if t.stride() != stride:
                t.as_strided_(shape, stride)
        return tree_unflatten([t if t is None else flat[t] if type(t) is int else
                               torch.empty_strided(t[0], t[1], dtype=t[2], device=_META) for t in template], spec)
    res = run(*args, **kwargs)
    at = {id(t): i for i, t in enumerate(flat) if isinstance(t, torch.Tensor)}
    leaves, spec = tree_flatten(res)
    template: list[Any] = []
    for r in leaves:
        if r is None:
            template.append(None)
        elif isinstance(r, torch.Tensor) and r.device == _META:
            template.append(at[id(r)] if id(r) in at else (tuple(r.shape), r.stride(), r.dtype))
        else:
            return res  # not tensors: not kept
    if len(_CACHE) >= _LIMIT:
        _CACHE.clear()
    _CACHE[key] = (spec, template, [(at[id(t)], tuple(t.shape), t.stride()) for t in written if id(t) in at])
    return res
