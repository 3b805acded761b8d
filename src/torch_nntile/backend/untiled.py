"""ATen ops with no tiled lowering, run inside the graph.

PyTorch's Meta kernel of the op gives the shapes and dtypes of its results without
data (``meta_calls``: once per signature). The call is then recorded like any other
op: where ``table_batched`` has a row for it and the call has a batch to split, one
task per batch tile runs the op's CPU kernel on its slice (``ops.batched``);
otherwise its inputs are gathered into single tiles (counted as re-tiles), one StarPU
task runs the op's CPU kernel on them and writes its results, which are re-tiled as
planned (``ops.base.whole_op``, counted in ``stats.UNTILED_CALLS``). Nothing is
flushed or waited for, and a kernel's exception belongs to the values it writes.
Arguments the schema marks as written (in-place ops, ``out=``) get the new values.

Where that cannot be (no Meta kernel, results whose shape depends on values, results
that are not tensors, random ops whose draws must happen in program order, CPU
tensors of one or more dims among the arguments) ``record`` returns a ``HostOnly``
saying why, and the host fallback takes the call (backend/fallback.py).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torch_nntile import stats
from torch_nntile.backend.device import NNTILE, new_tensor, read, resize_output, write
from torch_nntile.backend.meta_calls import meta_call
from torch_nntile.backend.table_batched import Axis, Split, split_of
from torch_nntile.backend.table_shapes import META_FORMS
from torch_nntile.kernels import CpuScalar, Kernel, Slot
from torch_nntile.ops.base import by_name, whole_op, wrap_dim
from torch_nntile.ops.batched import Extent, batched_op

_META = torch.device("meta")
TILE_OUT = "tile"  # see run_untiled


class HostOnly:
    """Why a call cannot be an untiled task; ``error``: what the op's Meta kernel raised
    for these arguments (the error CPU gives, where the kernel checks as CPU's does)."""

    __slots__ = ("reason", "error")

    def __init__(self, reason: str, error: Exception | None = None) -> None:
        self.reason = reason
        self.error = error


_RANDOM = HostOnly("random: its draws follow the program's order on the CPU generator")
_NOT_TENSORS = HostOnly("it returns other than tensors")
_VALUE_SHAPE = HostOnly("the shape of its results depends on the values")
_DIFFERS = HostOnly("PyTorch's Meta kernel gives other shapes than its CPU kernel")
_SPARSE = HostOnly("sparse tensors among its arguments: their ops run on the host")
_CPU_ARGS = HostOnly("a CPU tensor of one or more dims among its arguments")
_FACTORY = HostOnly("no nntile tensor among its arguments")
_WRITES_OTHER = HostOnly("it writes an argument that is not an nntile tensor")
_NO_META = HostOnly("PyTorch gives it no Meta kernel")
_UNMARKED = HostOnly("it updates arguments its schema does not mark as written (running statistics)")
_NO_TILED = HostOnly("no tiled kernel")


def _thawed(v: Any, tiles: tuple[torch.Tensor, ...]) -> Any:
    """A kernel parameter as the op's argument (ATen takes lists where params hold tuples)."""
    t = type(v)
    if t is Slot:
        return tiles[v.i]
    if t is CpuScalar:
        return v.tensor()
    if t is tuple:
        return [_thawed(x, tiles) for x in v]
    return v


def run_untiled(op: Any, args: tuple[Any, ...], kw: tuple[tuple[str, Any], ...], fresh: tuple[int, ...],
                written: tuple[int | torch.dtype | str, ...], *tiles: torch.Tensor) -> None:
    """The task: ``op`` on the input tiles. The result's leaves at positions ``fresh``
    (in ``tree_flatten`` order) are copied into the first output tiles. Each argument
    the op writes, ``written[k]``, is given as a tensor (on the tiles' device) whose values end in output
    tile ``len(fresh) + k``: a copy of input tile ``written[k]`` (an in-place op reads
    it), or, for an ``out=`` argument nothing else reads, an empty tensor of that dtype
    (an ``out=`` kernel may resize it, or use it as scratch in another shape first,
    which a tile cannot be), or, where ``written[k]`` is ``TILE_OUT`` (ops known to
    write their ``out=`` only once, in its shape), the output tile itself (arguments
    ``Slot(j)`` with ``j < 0`` count from the end of the inputs, where these are put)."""
    nfresh = len(fresh)
    outs, ins = tiles[:nfresh + len(written)], list(tiles[nfresh + len(written):])
    scratch = []
    for k, w in enumerate(written):
        if type(w) is int:
            ins[w] = t = ins[w].clone()
        else:
            t = outs[nfresh + k] if w is TILE_OUT else torch.empty(0, dtype=w, device=tiles[0].device)
            ins.append(t)
        scratch.append(t)
    got = tuple(ins)
    res = op(*[_thawed(a, got) for a in args], **{k: _thawed(v, got) for k, v in kw})
    leaves = tree_flatten(res)[0]
    for o, at in zip(outs, fresh):
        o.copy_(leaves[at])
    for o, x in zip(outs[nfresh:], scratch):
        if o is not x:
            o.copy_(x)


# Ops whose Meta kernel gives other shapes than their CPU kernel (embedding_bag's
# bookkeeping outputs): they stay on the host.
_META_DIFFERS = {"aten::_embedding_bag", "aten::_embedding_bag_forward_only"}
# Batch norm without batch statistics (eval mode: the flag named here is False, or
# always where None): CPU's saved mean and inverse deviation are empty, Meta's are not.
# Arguments CPU kernels update in place that their schema does not mark as written:
# the host fallback writes them back; an untiled task could not.
UNMARKED_WRITES = {"aten::native_batch_norm": ("running_mean", "running_var")}
_EVAL_EMPTY = {"aten::native_batch_norm": "training", "aten::_native_batch_norm_legit": "training",
               "aten::_native_batch_norm_legit_functional": "training",
               "aten::_native_batch_norm_legit_no_training": None}


@functools.cache
def _host_only(op: Any, name: str) -> HostOnly | None:
    """Why ``op`` stays with the host whatever its arguments, or None (per op, once:
    it reads only the schema and the tags)."""
    schema = op._schema
    if not schema.returns and not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return _NOT_TENSORS  # nothing to show for it
    if any(str(r.type) not in ("Tensor", "Tensor[]", "Tensor?") for r in schema.returns):
        return _NOT_TENSORS
    tags = op.tags
    if torch.Tag.nondeterministic_seeded in tags or any(str(a.type).startswith("Generator") for a in schema.arguments):
        return _RANDOM
    if torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags:
        return _VALUE_SHAPE
    if name in _META_DIFFERS:
        return _DIFFERS
    return None


def record(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, run: Any = None,
           only_split: bool = False) -> Any:
    """Record ``op(*args, **kwargs)`` as an untiled task, or per batch tile where
    ``table_batched`` says it splits along the batch, and return its results as nntile
    tensors, or a ``HostOnly``. ``run``: what computes it on the CPU (and on meta
    tensors), where that is not ``op`` itself (a backend hook with no CPU kernel).
    ``only_split``: a call that does not split along the batch is not recorded."""
    run = op if run is None else run
    meta_run = META_FORMS.get(name)
    host = _host_only(op, name) if meta_run is None else None
    if host is not None:
        return host
    metas: dict[int, torch.Tensor] = {}  # id of a meta argument -> the nntile tensor it stands for
    ok = True
    sparse = False

    def to_meta(x: Any) -> Any:
        nonlocal ok, sparse
        if isinstance(x, torch.device):
            return _META if x == NNTILE else x
        if not isinstance(x, torch.Tensor):
            return x
        if x.device == NNTILE and x.layout == torch.strided:
            m = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_META)
            metas[id(m)] = x
            return m
        if x.layout != torch.strided:
            sparse = True
            return x
        if x.device.type != "cpu" or x.dim() != 0:
            ok = False
        return x.to(_META)

    meta_args, meta_kwargs = tree_map(to_meta, (list(args), kwargs))
    if sparse:
        return _SPARSE
    if not ok:
        return _CPU_ARGS
    if not metas:
        return _FACTORY
    written_meta = _written(op, meta_args, meta_kwargs)
    if not all(id(m) in metas for m, _ in written_meta):
        return _WRITES_OTHER
    try:
        meta_res = meta_call(meta_run or run, meta_args, meta_kwargs, [m for m, _ in written_meta])
    except NotImplementedError:
        return _NO_META
    except Exception as e:  # noqa: BLE001 - the arguments are wrong, or the Meta kernel is
        if "meta" in str(e).lower():  # a kernel that reads values ("cannot be called on meta tensors")
            return _VALUE_SHAPE
        return _ask_cpu(run, args, kwargs)
    named = by_name(op, args, kwargs)
    mask = named.get("output_mask")
    if mask is not None and isinstance(meta_res, tuple):  # CPU gives None where the mask says so; Meta may not
        meta_res = tuple(None if i < len(mask) and not mask[i] else r for i, r in enumerate(meta_res))
    flag = _EVAL_EMPTY.get(name.split(".")[0], "")
    if flag != "":
        if flag is None or not named[flag]:
            meta_res = (meta_res[0], meta_res[1].new_empty(0), meta_res[2].new_empty(0), *meta_res[3:])
        elif name in UNMARKED_WRITES:  # training: the running statistics change
            return _UNMARKED
    leaves = tree_flatten(meta_res)[0]
    if not all(r is None or isinstance(r, torch.Tensor) and r.device == _META for r in leaves):
        return _NOT_TENSORS

    nodes: list[Any] = []
    index: dict[int, int] = {}  # id of an nntile argument -> its input tile
    # out= arguments that no other argument is: the task needs not read them
    out_metas = {id(m) for m, is_out in written_meta if is_out}
    read_ids = {id(t) for k, t in metas.items() if k not in out_metas}
    out_only: dict[int, int] = {}
    for m, is_out in written_meta:
        if is_out and id(metas[id(m)]) not in read_ids:
            out_only.setdefault(id(metas[id(m)]), len(out_only))

    def operand(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if x.device != NNTILE:
                return CpuScalar(x)  # a CPU 0-dim tensor
            k = out_only.get(id(x))
            if k is not None:
                return Slot(k - len(out_only))
            i = index.get(id(x))
            if i is None:
                i = index[id(x)] = len(nodes)
                nodes.append(read(x))
            return Slot(i)
        if isinstance(x, torch.device):
            return torch.device("cpu") if x == NNTILE else x
        if isinstance(x, (list, tuple)):
            return tuple(operand(v) for v in x)
        return x

    p_args = tuple(operand(a) for a in args)
    p_kw = tuple((k, operand(v)) for k, v in kwargs.items())
    at = [k for k, r in enumerate(leaves) if r is not None and id(r) not in metas]  # results, not arguments
    fresh = [leaves[k] for k in at]
    wrote = [metas[id(m)] for m, _ in written_meta]
    written = tuple(t.dtype if id(t) in out_only else index[id(t)] for t in wrote)
    outs = [(tuple(r.shape), r.dtype) for r in fresh] + [(tuple(m.shape), m.dtype) for m, _ in written_meta]
    row = split_of(name.split(".")[0], named)
    plan = None
    if row is not None and len(leaves) == len(op._schema.returns):
        plan = _split_plan(op, row, named, list(index), at, written, outs)
    if plan is not None:
        axes_in, axes_out, dims = plan
        p_args, p_kw = _mark_extents(op, row.sizes, dims, p_args, p_kw)
        written = tuple(TILE_OUT if type(w) is not int else w for w in written)  # these ops write out= in place
        stats.BATCHED_CALLS[name] += 1
        values = batched_op(name, Kernel(run_untiled, run, p_args, p_kw, tuple(at), written), nodes, outs, axes_in,
                            axes_out)
    elif only_split:
        return _NO_TILED
    else:
        stats.count_untiled(name, sum(n.numel * n.dtype.itemsize for n in nodes))
        values = whole_op(name, Kernel(run_untiled, run, p_args, p_kw, tuple(at), written), nodes,
                          [(s, d, None) for s, d in outs])
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


_META_WRONG = HostOnly("PyTorch's Meta kernel rejects arguments its CPU kernel takes")


def _ask_cpu(run: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> HostOnly:
    """The Meta kernel rejected the call: the CPU kernel, run on zeros of the arguments'
    shapes, tells wrong arguments (its exception, in CPU's words) from a Meta kernel
    that is wrong (a zero-size pooling): that call takes the host path."""
    def zeros(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device == NNTILE:
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).zero_() if x.layout == torch.strided else x
        return torch.device("cpu") if isinstance(x, torch.device) and x == NNTILE else x

    try:
        run(*tree_map(zeros, list(args)), **tree_map(zeros, kwargs))
    except Exception as e:  # noqa: BLE001 - CPU's own error for these arguments
        return HostOnly("its arguments are wrong", e)
    return _META_WRONG


def _written(op: Any, args: list[Any], kwargs: dict[str, Any]) -> list[tuple[torch.Tensor, bool]]:
    """The tensors among the (meta) arguments that the schema marks as written, each
    with whether it is an ``out=`` argument (whose values the op does not read)."""
    out = []
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = kwargs.get(a.name) if a.name in kwargs else args[i] if i < len(args) else None
        out += [(t, a.is_out) for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    return out


Axes = tuple[tuple[int | None, ...], ...]


def _split_plan(op: Any, row: Split, named: dict[str, Any], inputs: list[int], at: list[int],
                written: tuple[int | torch.dtype, ...], outs: list[tuple[tuple[int, ...], torch.dtype]]
                ) -> tuple[Axes, Axes, tuple[int, ...]] | None:
    """The split axes of a call: first the row's ``dims`` of its lead argument (the batch,
    or more), carried by the row's arguments, then its further axes (``row.more``) that
    apply; per input (by the ids of their tensors, ``inputs``) and per result the dim
    carrying each axis (None: the input is whole along it, the result sums over it); and
    the lead dims. None where this call does not split: an argument both carries the
    lead dims and not, an argument written in place, a carrying argument or result whose
    extents there differ. Results are the op's returns at positions ``at``, or its
    ``out=`` arguments in order."""
    carried: list[torch.Tensor] = []
    other: set[int] = set()
    for a in op._schema.arguments:
        if a.is_out:
            continue
        v = named.get(a.name)
        for t in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(t, torch.Tensor):
                if a.name in row.args:
                    carried.append(t)
                else:
                    other.add(id(t))
    carry = {id(t) for t in carried}
    if not carried or carry & other or any(type(w) is int for w in written):
        return None
    if written and at:
        return None
    lead = carried[0]
    dims = row.dims(named) if row.dims is not None else (0,)
    if not dims or any(d >= lead.dim() for d in dims):
        return None
    extents = [lead.shape[d] for d in dims]
    if any(t.dim() <= max(dims) or [t.shape[d] for d in dims] != extents for t in carried):
        return None
    reduced = wrap_dim(named[row.reduced], lead.dim()) if row.reduced in named else None
    returns = list(at if at else range(len(written)))
    axes_in = {i: list(dims) if i in carry else [None] * len(dims) for i in inputs}
    axes_out: list[list[int | None]] = []
    for k, (shape, _) in zip(returns, outs):
        if k in row.sums:
            axes_out.append([None] * len(dims))
            continue
        if len(shape) == lead.dim():
            od = dims
        elif reduced is not None and len(shape) == lead.dim() - 1:  # the reduced dim dropped (no keepdim)
            od = tuple(d - (d > reduced) for d in dims)
        elif dims == (0,) and shape:  # led by the batch, of another rank (im2col's, col2im's)
            od = dims
        else:
            return None
        if [shape[d] for d in od] != extents:
            return None
        axes_out.append(list(od))
    for axis in row.more:
        got = _further_axis(axis, named, returns, outs)
        if got is not None:
            by_input, by_result = got
            for i, ax in axes_in.items():
                ax.append(by_input.get(i))
            for ax, d in zip(axes_out, by_result):
                ax.append(d)
    return tuple(tuple(axes_in[i]) for i in inputs), tuple(tuple(ax) for ax in axes_out), dims


def _further_axis(axis: Axis, named: dict[str, Any], returns: list[int], outs: list[tuple[tuple[int, ...], torch.dtype]]
                  ) -> tuple[dict[int, int], list[int | None]] | None:
    """A further axis of a call, where it applies: the dim carrying it per input (by the
    id of its tensor) and per result; None where it does not apply (its condition, no
    argument carrying it, extents that differ)."""
    if axis.when is not None and not axis.when(named):
        return None
    by_input: dict[int, int] = {}
    extent = None
    for arg, d in axis.args.items():
        t = named.get(arg)
        if not isinstance(t, torch.Tensor):
            continue
        if t.dim() <= d or by_input.get(id(t), d) != d or extent not in (None, t.shape[d]):
            return None
        extent = t.shape[d]
        by_input[id(t)] = d
    if extent is None:
        return None
    by_result = [axis.results.get(k) for k in returns]
    if any(d is not None and (len(shape) <= d or shape[d] != extent) for d, (shape, _) in zip(by_result, outs)):
        return None
    return by_input, by_result


def _mark_extents(op: Any, names: tuple[str, ...], dims: tuple[int, ...], p_args: tuple[Any, ...],
           p_kw: tuple[tuple[str, Any], ...]) -> tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]]:
    """The kernel's arguments with those ``names`` (the batch size, or int lists of the
    lead argument's extents) holding ``Extent(i)`` where they give split dim ``i``'s
    extent, which each tile's task replaces by its own."""
    if not names:
        return p_args, p_kw

    def mark(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            at = {d: i for i, d in enumerate(dims)}
            return tuple(Extent(at[k]) if k in at else x for k, x in enumerate(v))
        return Extent(0)  # an int: the batch size (dim 0 is split first)

    pos = {a.name: i for i, a in enumerate(op._schema.arguments)}
    p_args = tuple(mark(v) if any(pos.get(n) == i for n in names) else v for i, v in enumerate(p_args))
    return p_args, tuple((k, mark(v) if k in names else v) for k, v in p_kw)
