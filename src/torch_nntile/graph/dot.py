"""Graphviz DOT text for the pending graph (tensor level) or its tile tasks.

Tensor level: one box per value (shape, dtype, tiling), one ellipse per op.
Tile level: one ellipse per task and one box per *version* of a tile, so a task
that updates a tile in place reads one box and writes the next: the picture is
the dependency DAG StarPU sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch_nntile.graph.axes import tiling_of
from torch_nntile.graph.nodes import DataNode, OpNode


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _tiling(node: DataNode) -> str:
    parts = []
    for ax in node.axes:
        try:
            t = tiling_of(ax.root())
        except ValueError:
            t = ("?",)
        parts.append(str(t[0]) if len(t) == 1 else "|".join(map(str, t)))
    return "x".join(parts) if parts else "scalar"


def tensor_dot(ops: Sequence[OpNode]) -> str:
    """DOT of pending ops and the values they read and write."""
    lines = ["digraph tensor_graph {", "  rankdir=TB;", "  node [fontname=Helvetica, fontsize=10];"]
    seen: set[int] = set()
    produced = {id(o) for op in ops for o in op.outputs}

    def data(n: DataNode) -> str:
        nid = f"d{id(n)}"
        if id(n) not in seen:
            seen.add(id(n))
            kind = "" if id(n) in produced else "\nmaterialized"
            label = f"{list(n.shape)} {str(n.dtype).removeprefix('torch.')}\ntiles {_tiling(n)}{kind}"
            style = "" if id(n) in produced else ", style=filled, fillcolor=lightgrey"
            lines.append(f"  {nid} [shape=box, label={_q(label)}{style}];")
        return nid

    for i, op in enumerate(ops):
        oid = f"op{i}"
        lines.append(f"  {oid} [shape=ellipse, label={_q(op.label)}];")
        for n in op.inputs:
            lines.append(f"  {data(n)} -> {oid};")
        for n in op.outputs:
            lines.append(f"  {oid} -> {data(n)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def tile_dot(tasks: Iterable[tuple[Any, ...]], tile_names: dict[Any, str]) -> str:
    """DOT of tile tasks ``(fn, handles, modes, specs, name)`` in submission order.

    ``tile_names`` maps a handle to a readable name; modes are StarPU's R=1, W=2.
    """
    lines = ["digraph tile_graph {", "  rankdir=TB;", "  node [fontname=Helvetica, fontsize=9];"]
    version: dict[Any, int] = {}
    ids: dict[Any, int] = {}

    def tile(h: Any, spec: tuple[Any, ...], bump: bool) -> str:
        n = ids.setdefault(h, len(ids))
        v = version.get(h, -1) + 1 if bump else version.get(h, 0)
        nid = f"t{n}_{v}"
        if bump or h not in version:
            version[h] = v
            name = tile_names.get(h, f"tile {n}")
            label = f"{name}\n{list(spec[2])} v{v}"
            lines.append(f"  {nid} [shape=box, label={_q(label)}];")
        return nid

    for i, (_fn, handles, modes, specs, name) in enumerate(tasks):
        tid = f"k{i}"
        lines.append(f"  {tid} [shape=ellipse, label={_q(name)}];")
        for h, m, spec in zip(handles, modes, specs):
            if m & 1:
                lines.append(f"  {tile(h, spec, False)} -> {tid};")
        for h, m, spec in zip(handles, modes, specs):
            if m & 2:
                lines.append(f"  {tid} -> {tile(h, spec, True)};")
    lines.append("}")
    return "\n".join(lines) + "\n"
