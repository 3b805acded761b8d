"""ATen ops with no tiled lowering, run inside the graph as one untiled task each.

PyTorch's Meta kernel of the op gives the shapes and dtypes of its results without
data. The call is then recorded like any other op (``ops.base.whole_op``): its inputs
are gathered into single tiles (counted as re-tiles), one StarPU task runs the op's
CPU kernel on them and writes its results, which are re-tiled as planned. Nothing is
flushed or waited for, and a kernel's exception belongs to the values it writes.
Arguments the schema marks as written (in-place ops, ``out=``) get the new values.

Where that cannot be (no Meta kernel, results whose shape depends on values, results
that are not tensors, random ops whose draws must happen in program order, CPU
tensors of one or more dims among the arguments) ``record`` returns ``NOT_RECORDED``
and the host fallback takes the call (backend/fallback.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torch_nntile import stats
from torch_nntile.backend.device import NNTILE, new_tensor, read, resize_output, write
from torch_nntile.kernels import CpuScalar, Kernel
from torch_nntile.ops.base import whole_op

NOT_RECORDED = object()
_META = torch.device("meta")


class _In:
    """Where input tile ``i`` goes among the op's arguments."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __eq__(self, other: object) -> bool:
        return type(other) is _In and other.i == self.i

    def __hash__(self) -> int:
        return hash(("in", self.i))

    def __repr__(self) -> str:
        return f"_In({self.i})"


def _thawed(v: Any, tiles: tuple[torch.Tensor, ...]) -> Any:
    """A kernel parameter as the op's argument (ATen takes lists where params hold tuples)."""
    t = type(v)
    if t is _In:
        return tiles[v.i]
    if t is CpuScalar:
        return v.tensor()
    if t is tuple:
        return [_thawed(x, tiles) for x in v]
    return v


def run_untiled(op: Any, args: tuple[Any, ...], kw: tuple[tuple[str, Any], ...], fresh: tuple[int, ...],
                written: tuple[int, ...], *tiles: torch.Tensor) -> None:
    """The task: ``op`` on the input tiles. The result's leaves at positions ``fresh``
    (in ``tree_flatten`` order) are copied into the first output tiles. Each argument
    the op writes (input tile ``written[k]``) is given as a CPU copy of its input (an
    in-place op reads it; an ``out=`` kernel may resize it, or use it as scratch in
    another shape first, which a tile cannot be), then copied into output tile
    ``len(fresh) + k``."""
    nfresh = len(fresh)
    outs, ins = tiles[:nfresh + len(written)], list(tiles[nfresh + len(written):])
    scratch = []
    for i in written:
        ins[i] = ins[i].clone()
        scratch.append(ins[i])
    got = tuple(ins)
    res = op(*[_thawed(a, got) for a in args], **{k: _thawed(v, got) for k, v in kw})
    leaves = tree_flatten(res)[0]
    for o, at in zip(outs, fresh):
        o.copy_(leaves[at])
    for o, x in zip(outs[nfresh:], scratch):
        o.copy_(x)


# Ops whose Meta kernel gives other shapes than their CPU kernel (batch norm's saved
# statistics in eval mode, embedding_bag's bookkeeping outputs): they stay on the host.
_META_DIFFERS = {"aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit.no_stats",
                 "aten::_native_batch_norm_legit_functional", "aten::_embedding_bag",
                 "aten::_embedding_bag_forward_only"}


def _skip(op: Any) -> bool:
    """Ops that stay with the host: random ones (their draws must follow the program's
    order on the CPU generator) and those returning other than tensors."""
    if torch.Tag.nondeterministic_seeded in op.tags:
        return True
    schema = op._schema
    if any(str(a.type).startswith("Generator") for a in schema.arguments):
        return True
    return not schema.returns or any(str(r.type) not in ("Tensor", "Tensor[]", "Tensor?") for r in schema.returns)


def record(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, run: Any = None) -> Any:
    """Record ``op(*args, **kwargs)`` as an untiled task and return its results as nntile
    tensors, or ``NOT_RECORDED``. ``run``: what computes it on the CPU (and on meta
    tensors), where that is not ``op`` itself (a backend hook with no CPU kernel)."""
    run = op if run is None else run
    if name in _META_DIFFERS or _skip(op):
        return NOT_RECORDED
    metas: dict[int, torch.Tensor] = {}  # id of a meta argument -> the nntile tensor it stands for
    ok = True

    def to_meta(x: Any) -> Any:
        nonlocal ok
        if isinstance(x, torch.device):
            return _META if x == NNTILE else x
        if not isinstance(x, torch.Tensor):
            return x
        if x.device == NNTILE and x.layout == torch.strided:
            m = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_META)
            metas[id(m)] = x
            return m
        if x.device.type != "cpu" or x.dim() != 0:
            ok = False
        return x.to(_META)

    meta_args, meta_kwargs = tree_map(to_meta, (list(args), kwargs))
    if not ok or not metas:
        return NOT_RECORDED
    written_meta = _written(op, meta_args, meta_kwargs)
    if not all(id(m) in metas for m in written_meta):
        return NOT_RECORDED
    try:
        meta_res = run(*meta_args, **meta_kwargs)
    except Exception:  # no Meta kernel, a shape that depends on values, or an error CPU gives in its words
        return NOT_RECORDED
    leaves = tree_flatten(meta_res)[0]
    if not all(r is None or isinstance(r, torch.Tensor) and r.device == _META for r in leaves):
        return NOT_RECORDED

    nodes: list[Any] = []
    index: dict[int, int] = {}  # id of an nntile argument -> its input tile

    def operand(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if x.device != NNTILE:
                return CpuScalar(x)  # a CPU 0-dim tensor
            i = index.get(id(x))
            if i is None:
                i = index[id(x)] = len(nodes)
                nodes.append(read(x))
            return _In(i)
        if isinstance(x, torch.device):
            return torch.device("cpu") if x == NNTILE else x
        if isinstance(x, (list, tuple)):
            return tuple(operand(v) for v in x)
        return x

    p_args = tuple(operand(a) for a in args)
    p_kw = tuple((k, operand(v)) for k, v in kwargs.items())
    at = [k for k, r in enumerate(leaves) if r is not None and id(r) not in metas]  # results, not arguments
    fresh = [leaves[k] for k in at]
    wrote = [metas[id(m)] for m in written_meta]
    written = tuple(index[id(t)] for t in wrote)
    outs = [(tuple(r.shape), r.dtype, None) for r in fresh]
    outs += [(tuple(m.shape), m.dtype, None) for m in written_meta]
    kernel = Kernel(run_untiled, run, p_args, p_kw, tuple(at), written)
    stats.UNTILED_CALLS[name] += 1
    values = whole_op(name, kernel, nodes, outs)
    for t, v in zip(wrote, values[len(fresh):], strict=True):
        if tuple(t.shape) != v.shape:
            resize_output(t, v.shape)
        write(t, v)
    made = {id(r): new_tensor(v) for r, v in zip(fresh, values)}

    def back(r: Any) -> Any:
        if isinstance(r, torch.Tensor):
            orig = metas.get(id(r))
            return orig if orig is not None else made[id(r)]  # an argument returned (in place, out=), or a result
        return r

    return tree_map(back, meta_res)


def _written(op: Any, args: list[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among the (meta) arguments that the schema marks as written."""
    out = []
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = kwargs.get(a.name) if a.name in kwargs else args[i] if i < len(args) else None
        out += [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    return out
