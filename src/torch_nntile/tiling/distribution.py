"""Which rank of an MPI world owns each tile of a value: data derived from the tiling,
the same on every rank without talking (runtime/csrc/dist.c places the tasks).

A dim whose axis group has several tiles is distributed by its group's rule
(``set_axis_group_distribution``; "cyclic" unless set): tile i of n goes to rank
``i % world`` ("cyclic"), ``i * world // n`` ("block"), or the rank the list names; "none"
leaves the dim out. A tile's owner is the sum of its distributed dims' ranks, modulo the
world: one distributed dim gives its rule's rank, two spread the tiles over diagonals.
A value with no distributed dim gets no owners here: the runtime gives each tile the
rank of the first task that writes it (where that task's inputs live).
"""

from __future__ import annotations

from typing import Any

from torch_nntile.graph.axes import describe, distribution_of


def _ranks(rule: Any, n: int, world: int, root: Any) -> list[int]:
    """The rank of each of ``n`` tiles of a group under ``rule``."""
    if rule == "cyclic":
        return [i % world for i in range(n)]
    if rule == "block":
        return [i * world // n for i in range(n)]
    if len(rule) != n or any(r >= world for r in rule):
        raise ValueError(f"axis group {describe(root)}: the distribution {list(rule)} must give a rank below "
                         f"{world} (the world size) to each of its {n} tiles")
    return list(rule)


def tile_owners(axes: tuple[Any, ...], tiling: tuple[tuple[int, ...], ...], world: int) -> list[int] | None:
    """Per tile of a value (flat, C order over its grid), its owner rank; None when no
    dim of it is distributed."""
    per_dim: list[list[int] | None] = []
    any_dim = False
    for ax, sizes in zip(axes, tiling):
        if len(sizes) < 2:
            per_dim.append(None)
            continue
        root = ax.root()
        rule = distribution_of(root)
        if rule == "none":
            per_dim.append(None)
            continue
        per_dim.append(_ranks(rule, len(sizes), world, root))
        any_dim = True
    if not any_dim:
        return None
    owners = [0]
    for ranks, sizes in zip(per_dim, tiling):
        if ranks is None:
            owners = [o for o in owners for _ in sizes]
        else:
            owners = [(o + r) % world for o in owners for r in ranks]
    return owners
