"""Fusion of elementwise chains: one task per tile instead of one per op.

``fuse_elementwise`` folds a floating-point elementwise op (or ``foreach`` op) into its
only reader before lowering; results held outside the compile become further outputs
of the fused task. ``fused_tile`` is its kernel, with a C translation. See
docs/architecture/kernels.md (fusion of elementwise chains).
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.graph.nodes import DataNode, OpNode, outside_refs
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import FOREACH, MAP, Op, _lower_map, elements

Step = tuple[Kernel, tuple[int, ...], torch.dtype]  # kernel, operands (>= 0: input tile, < 0: step ~k), dtype


def fused_tile(program: tuple[Step, ...], stores: tuple[int, ...], o: torch.Tensor, *tiles: torch.Tensor) -> None:
    """Run the steps in order; the last writes the output tile ``o``, step ``stores[i]``
    the further output tile ``tiles[i]``, the others temporaries of ``o``'s shape. The
    input tiles follow the further outputs."""
    done: list[torch.Tensor] = []
    last = len(program) - 1
    into = dict(zip(stores, tiles))
    ins = tiles[len(stores):]
    for j, (kernel, refs, dtype) in enumerate(program):
        out = o if j == last else into.get(j)
        if out is None:
            out = torch.empty(o.shape, dtype=dtype, device=o.device)
        kernel(out, *[ins[r] if r >= 0 else done[~r] for r in refs])
        done.append(out)


def _fused_program(p: native.Program, params: tuple[Any, ...], refs: list[native.Ref]) -> native.Ref:
    program, stores = params
    into = dict(zip(stores, refs))
    ins = refs[len(stores):]
    done: list[native.Ref] = []
    for j, (kernel, operands, dtype) in enumerate(program):
        tr = native.TRANSLATORS.get(kernel.fn)
        if tr is None or dtype is not torch.float32:
            raise native.Unsupported
        done.append(tr(p, kernel.params, [ins[r] if r >= 0 else done[~r] for r in operands]))
        if j in into:
            p.emit(native.STORE, done[-1], into[j])
    return done[-1]


native.TRANSLATORS[fused_tile] = _fused_program


FUSED = Op("fused", _lower_map, lambda node: node.attrs[1], binds_kernel=True)
"""Lowered like an elementwise op: ``attrs = (Kernel(fused_tile, program, stores), name,
results per element)``."""


def fuse_elementwise(ops: list[OpNode]) -> list[OpNode]:
    """The ops with elementwise chains folded into single ops, so a chain runs as one
    task per output tile. A floating-point elementwise op folds into its reader when
    that reader is an elementwise op of the same kind (map or ``foreach``) and the only
    op reading its result; a result also held outside the compile folds only in float32
    chains, as a further output of the fused task. Chains of ``_foreach_*`` ops fold
    element by element into one such op. See docs/architecture/kernels.md (fusion of
    elementwise chains)."""
    uses: dict[int, int] = {}
    reader: dict[int, OpNode] = {}
    for op in ops:
        for key in map(id, op.inputs):  # ids only: a local holding a node would count as a reference
            uses[key] = uses.get(key, 0) + 1
            reader[key] = op
    # a producer folds into its only reader; where something outside these ops also
    # holds its result, the group keeps that result as a further output
    producers: dict[OpNode, list[OpNode]] = {}
    folded: set[OpNode] = set()
    kept: set[OpNode] = set()
    for op in ops:
        kind = op.opdef
        if kind is not MAP and kind is not FOREACH:
            continue
        r = reader.get(id(op.outputs[0]))
        if r is None or r.opdef is not kind or len(r.outputs) != len(op.outputs):
            continue
        if not (op.outputs[0].dtype.is_floating_point and r.outputs[0].dtype.is_floating_point):
            continue  # integer or bool steps make a chain Python; such ops alone mostly run in typed.c
        reads = _sole_reads(op, r, reader, uses)
        if reads is None:
            continue  # r is not the only reader of each result (of that result's element)
        if any(held > c for held, c in zip(outside_refs(op), reads)):
            if op.outputs[0].dtype is not torch.float32 or r.outputs[0].dtype is not torch.float32:
                continue  # as a further output only where the group can run as a C program
            kept.add(op)
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
        fused = _fused(group, kept)
        if fused is None:  # elements that would need programs of their own: left as they are
            out.extend(group)
        else:
            out.append(fused)
    return out


def _sole_reads(op: OpNode, r: OpNode, reader: dict[int, OpNode], uses: dict[int, int]) -> list[int] | None:
    """Per result of ``op``: how often the same element of ``r`` reads it, where ``r`` is
    its only reader (else None). A function of its own so that the per-element input
    tuples it slices are gone when the caller counts the results' outside references
    (each would count as one more holder, and every result of a foreach chain would
    look held)."""
    els = elements(r)
    reads = [sum(1 for n in ins if n is o) for o, (ins, _) in zip(op.outputs, els)]
    if not all(reader.get(id(o)) is r and o.shape == res[0].shape and uses[id(o)] == c
               for o, (_, res), c in zip(op.outputs, els, reads)):
        return None
    return reads


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


def _fused(order: list[OpNode], kept: set[OpNode]) -> OpNode | None:
    """One op computing the last op's results, and those of the ops in ``kept``, from
    the group's outside inputs (None for a foreach chain whose elements' programs
    differ)."""
    last = order[-1]
    name = "+".join(o.attrs[1] for o in order)
    per_op = [elements(o) for o in order]
    stores = tuple(j for j, o in enumerate(order) if o in kept)
    flat: list[DataNode] = []
    outs: list[DataNode] = []
    program = None
    for e in range(len(last.outputs)):
        ins, prog = _program([(o.attrs[0], els[e][0], els[e][1][0]) for o, els in zip(order, per_op)])
        if program is None:
            program = prog
        elif prog != program:
            return None
        flat.extend(ins)
        outs.append(last.outputs[e])
        outs.extend(order[j].outputs[e] for j in stores)
    attrs = (Kernel(fused_tile, program, stores), name) + ((1 + len(stores),) if stores else ())
    fused = OpNode(FUSED if last.opdef is MAP else FOREACH, tuple(flat), attrs)
    fused.outputs = tuple(outs)
    for n in fused.outputs:
        n.op = fused
    for o in order[:-1]:  # the folded ops: break their node <-> op cycles, which would keep inputs alive
        o.inputs = ()
        if o not in kept:  # a kept op's outputs stay listed: reuse (tiling.reuse) finds its values by them
            for n in o.outputs:
                n.op = None
            o.outputs = ()
    return fused
