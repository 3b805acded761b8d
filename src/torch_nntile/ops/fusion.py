"""Fusion of elementwise chains: one task per tile instead of one per op.

Before lowering, an elementwise op whose result only one later elementwise op of the
same shape reads, and that nothing else holds (no tensor, view or other op), is folded
into that reader: the group runs as one task per output tile, the intermediate
results as temporaries inside the kernel, never registered as tiles. An optimizer's
per-parameter update (AdamW: a dozen ops per parameter) becomes a few tasks.

``foreach`` ops (one op over the elements of tensor lists) fold the same way, element
by element: a producer whose every result only the same element of one later foreach op
reads folds into it, when all elements then run one program (they do unless their
inputs alias differently). ``torch.optim``'s foreach AdamW becomes three such ops per
group of alike parameters.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.graph.nodes import DataNode, OpNode, outside_refs
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import FOREACH, MAP, Op, _lower_map, elements

Step = tuple[Kernel, tuple[int, ...], torch.dtype]  # kernel, operands (>= 0: input tile, < 0: step ~k), dtype


def fused_tile(program: tuple[Step, ...], o: torch.Tensor, *tiles: torch.Tensor) -> None:
    """Run the steps in order; each writes a temporary of the output tile's shape,
    the last writes the output tile."""
    done: list[torch.Tensor] = []
    last = len(program) - 1
    for j, (kernel, refs, dtype) in enumerate(program):
        out = o if j == last else torch.empty(o.shape, dtype=dtype)
        kernel(out, *[tiles[r] if r >= 0 else done[~r] for r in refs])
        done.append(out)


def _fused_program(p: native.Program, params: tuple[Any, ...], refs: list[native.Ref]) -> native.Ref:
    (program,) = params
    done: list[native.Ref] = []
    for kernel, operands, dtype in program:
        tr = native.TRANSLATORS.get(kernel.fn)
        if tr is None or dtype is not torch.float32:
            raise native.Unsupported
        done.append(tr(p, kernel.params, [refs[r] if r >= 0 else done[~r] for r in operands]))
    return done[-1]


native.TRANSLATORS[fused_tile] = _fused_program


FUSED = Op("fused", _lower_map, lambda node: node.attrs[1], binds_kernel=True)
"""Lowered like an elementwise op: ``attrs = (Kernel(fused_tile, program), name)``."""


def fuse_elementwise(ops: list[OpNode]) -> list[OpNode]:
    """The ops with elementwise chains folded into single ops (see module docstring);
    chains of ``_foreach_*`` ops fold element by element into one such op."""
    uses: dict[int, int] = {}
    reader: dict[int, OpNode] = {}
    for op in ops:
        for key in map(id, op.inputs):  # ids only: a local holding a node would count as a reference
            uses[key] = uses.get(key, 0) + 1
            reader[key] = op
    # a producer folds into its only reader when nothing outside these ops holds its result
    producers: dict[OpNode, list[OpNode]] = {}
    folded: set[OpNode] = set()
    for op in ops:
        kind = op.opdef
        if kind is not MAP and kind is not FOREACH:
            continue
        refs = outside_refs(op)
        r = reader.get(id(op.outputs[0]))
        if r is None or r.opdef is not kind or len(r.outputs) != len(refs):
            continue
        if not all(reader.get(id(o)) is r and o.shape == ro.shape and uses[id(o)] == c == sum(1 for n in ins if n is o)
                   for o, (ins, ro), c in zip(op.outputs, elements(r), refs)):
            continue  # r is not the only reader of each result (of that result's element)
        producers.setdefault(r, []).append(op)
        folded.add(op)
    if not folded:
        return ops
    index = {op: i for i, op in enumerate(ops)}
    out: list[OpNode] = []
    for op in ops:
        if op in folded:
            continue
        if op not in producers:
            out.append(op)
            continue
        group, stack = [op], [op]
        while stack:
            for p in producers.get(stack.pop(), ()):
                group.append(p)
                stack.append(p)
        group.sort(key=index.__getitem__)  # record order: every producer before its reader
        fused = _fused(group)
        if fused is None:  # elements that would need programs of their own: left as they are
            out.extend(group)
        else:
            out.append(fused)
    return out


def _program(steps: list[tuple[Kernel, tuple[DataNode, ...], DataNode]]) -> tuple[list[DataNode], tuple[Step, ...]]:
    """The outside inputs and the program of a chain of ``(kernel, inputs, result)``
    steps, each reading outside inputs or earlier steps' results."""
    step_of = {id(out): j for j, (_, _, out) in enumerate(steps)}
    inputs: list[DataNode] = []
    slot: dict[int, int] = {}
    program: list[Step] = []
    for kernel, ins, out in steps:
        refs = []
        for n in ins:
            j = step_of.get(id(n))
            if j is not None:
                refs.append(~j)
                continue
            if id(n) not in slot:
                slot[id(n)] = len(inputs)
                inputs.append(n)
            refs.append(slot[id(n)])
        program.append((kernel, tuple(refs), out.dtype))
    return inputs, tuple(program)


def _fused(order: list[OpNode]) -> OpNode | None:
    """One op computing the last op's results from the group's outside inputs (None for
    a foreach chain whose elements' programs differ)."""
    last = order[-1]
    name = "+".join(o.attrs[1] for o in order)
    per_op = [elements(o) for o in order]
    flat: list[DataNode] = []
    program = None
    for e in range(len(last.outputs)):
        ins, prog = _program([(o.attrs[0], *els[e]) for o, els in zip(order, per_op)])
        if program is None:
            program = prog
        elif prog != program:
            return None
        flat.extend(ins)
    fused = OpNode(FUSED if last.opdef is MAP else FOREACH, tuple(flat), (Kernel(fused_tile, program), name))
    fused.outputs = last.outputs
    for n in fused.outputs:
        n.op = fused
    for o in order[:-1]:  # the folded ops: break their node <-> op cycles, which would keep inputs alive
        for n in o.outputs:
            n.op = None
        o.inputs = o.outputs = ()
    return fused
