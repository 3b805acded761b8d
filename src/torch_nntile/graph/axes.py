"""Axis groups: dimensions that must be tiled alike, merged by a union-find.

Each dimension of a data node points at an ``AxisGroup``; ops merge the groups of
dimensions that must share a tiling (``union``). Users name a group through any
member dimension and set tile sizes per name. Tiling is plain data: a tuple of
tile sizes per group, derived by ``normalize_tiling``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass


class AxisGroup:
    """A union-find element; the root of a set carries the set's metadata."""

    __slots__ = ("parent", "extent", "name", "aliases", "derive", "__weakref__")

    def __init__(self, extent: int) -> None:
        self.parent: AxisGroup | None = None
        self.extent = extent
        self.name: str | None = None
        self.aliases: tuple[str, ...] = ()  # names of named groups merged into this one
        # (source group, factor) pairs: with no tiling of its own, this group takes a
        # source's tile sizes times factor (> 0) or divided by -factor (< 0) where
        # they divide (a reshape merging or splitting a dim keeps its tiles). A merged
        # group keeps its members' (up to MAX_LINKS): reshapes back and forth link
        # groups both ways, and only some links lead to a named tiling.
        self.derive: tuple[tuple[AxisGroup, int], ...] = ()

    def names(self) -> tuple[str, ...]:
        return ((self.name,) if self.name is not None else ()) + self.aliases

    def root(self) -> AxisGroup:
        g = self
        while g.parent is not None:
            if g.parent.parent is not None:
                g.parent = g.parent.parent  # path halving
            g = g.parent
        return g


# Every group ever created and still alive; used only for reports.
_ALL: weakref.WeakSet[AxisGroup] = weakref.WeakSet()
# Name -> the group most recently given that name.
_NAMES: dict[str, weakref.ref[AxisGroup]] = {}
@dataclass(frozen=True)
class Split:
    """A tiling into ``parts`` tiles as even as the extent allows (fewer where it is
    shorter): data parallelism's, which may be set before any group has the name."""

    parts: int


# Name -> tiling (tuple of tile sizes, an int tile size, or a Split).
_TILINGS: dict[str, int | tuple[int, ...] | Split] = {}
# Name -> how its tiles map to the ranks of an MPI world: "cyclic", "block", "none", or a
# rank per tile. A tiled group without one is "cyclic" (tiling/distribution.py).
_DISTRIBUTIONS: dict[str, str | tuple[int, ...]] = {}
DISTRIBUTION_RULES = ("cyclic", "block", "none")
_DIST_VERSION = [0]  # changes with every rule set: a lowered step is kept per version


MAX_LINKS = 4  # derivation links a merged group keeps (groups merged every step must not grow; see _link_rank)
LINK_SEARCH = 16  # groups looked at per link when a merge keeps the links that lead to names


def new_group(extent: int, derive: tuple[AxisGroup, int] | None = None) -> AxisGroup:
    g = AxisGroup(extent)
    if derive is not None:
        g.derive = (derive,)
    _ALL.add(g)
    return g


def union(a: AxisGroup, b: AxisGroup) -> AxisGroup:
    """Merge two groups; both must have the same extent."""
    ra, rb = a.root(), b.root()
    if ra is rb:
        return ra
    if ra.extent != rb.extent:
        raise ValueError(f"cannot merge axis groups of extents {ra.extent} and {rb.extent}")
    if rb.derive:
        links = ra.derive + tuple(d for d in rb.derive if d not in ra.derive)
        if len(links) > MAX_LINKS:
            links = tuple(sorted(links, key=lambda d: _link_rank(d[0].root(), ra, rb)))[:MAX_LINKS]
        ra.derive = links
        rb.derive = ()  # only a root's links are read: the merged group's keep what they lead to alive
    if ra.name is None:
        ra.name, ra.aliases = rb.name, rb.aliases
    else:
        ra.aliases += tuple(n for n in rb.names() if n not in ra.names())
    rb.parent = ra
    return ra


def _link_rank(src: AxisGroup, ra: AxisGroup, rb: AxisGroup) -> int:
    """Which links a merged group keeps first (a stable sort, then the first MAX_LINKS):
    0, a link to a named group, or to one whose links lead to a named group within
    LINK_SEARCH groups (names are set on a model's inputs before it runs; their tilings
    may come later); 2, a round trip (a reshape back of a reshape of this very group:
    the source is unnamed and all its links lead back into ``ra`` or ``rb``); 1, any
    other. Without it a residual stream, reshaped by every linear layer, keeps the
    first links it is merged with and drops the one that leads to the named batch (a
    two-block DiT whose conditioning is unnamed: 4 links of 5 are dead ends)."""
    if src.name is not None:
        return 0
    if src.derive and all(s.root() in (ra, rb) for s, _ in src.derive):
        return 2
    todo, seen = [src], {src, ra, rb}
    while todo and len(seen) < LINK_SEARCH:
        for s, _ in todo.pop(0).derive:
            r = s.root()
            if r in seen:
                continue
            if r.name is not None:
                return 0
            seen.add(r)
            todo.append(r)
    return 1


def set_name(g: AxisGroup, name: str) -> None:
    r = g.root()
    if r.name is not None and r.name != name:
        r.aliases += (r.name,)  # a group may carry several names; all stay usable
    r.name = name
    r.aliases = tuple(n for n in r.aliases if n != name)
    _NAMES[name] = weakref.ref(r)


def group_by_name(name: str) -> AxisGroup:
    ref = _NAMES.get(name)
    g = ref() if ref is not None else None
    if g is None:
        raise ValueError(f"unknown axis group name {name!r}; known: {sorted(live_names())}")
    return g.root()


def live_names() -> list[str]:
    return [n for n, r in _NAMES.items() if r() is not None]


class TilingError(ValueError, RuntimeError):
    """An invalid tiling: a ``ValueError`` (a bad argument), and a ``RuntimeError`` as the
    published torch_nntile raises it, so that code catching either sees it."""


def normalize_tiling(tiling: int | tuple[int, ...] | list[int] | Split, extent: int, label: str) -> tuple[int, ...]:
    """Turn a tile size or a list of tile sizes into the tuple of tile sizes.

    >>> normalize_tiling(256, 1000, "batch")
    (256, 256, 256, 232)
    >>> normalize_tiling([600, 400], 1000, "batch")
    (600, 400)
    """
    if isinstance(tiling, bool):
        raise TilingError(f"axis group {label}: tiling must be an int or a list of ints")
    if isinstance(tiling, Split):
        n = max(1, min(tiling.parts, extent))
        base, extra = divmod(extent, n)
        return tuple(base + (i < extra) for i in range(n))
    if isinstance(tiling, int):
        if tiling <= 0:
            raise TilingError(f"axis group {label}: tile size must be positive, got {tiling}")
        if extent == 0:
            return (0,)
        full, rest = divmod(extent, tiling)
        return (tiling,) * full + ((rest,) if rest else ())
    sizes = tuple(int(s) for s in tiling)
    if not sizes or any(s <= 0 for s in sizes):
        raise TilingError(f"axis group {label}: tile sizes must be positive, got {list(sizes)}")
    if sum(sizes) != extent:
        raise TilingError(
            f"axis group {label}: tile sizes {list(sizes)} sum to {sum(sizes)}, "
            f"but the extent is {extent}"
        )
    return sizes


def describe(g: AxisGroup) -> str:
    r = g.root()
    return f"{' = '.join(map(repr, r.names()))} (extent {r.extent})" if r.name else f"<unnamed, extent {r.extent}>"


def set_tiling(name: str, tiling: int | list[int] | tuple[int, ...], check: bool = True) -> None:
    """Tile the groups named ``name``; ``check=False`` leaves the sizes to be checked
    against the extent when the next graph is compiled (as the published torch_nntile's
    private setter does)."""
    g = group_by_name(name)
    if not check:
        _TILINGS[name] = tiling if isinstance(tiling, int) else tuple(tiling)
        return
    sizes = normalize_tiling(tiling, g.extent, repr(name))
    _TILINGS[name] = tiling if isinstance(tiling, int) else sizes


def set_split(name: str, parts: int) -> None:
    """Tile every group named ``name``, now or created later, into ``parts`` even tiles."""
    if parts < 1:
        raise TilingError(f"axis group {name!r}: a split needs at least one part, got {parts}")
    _TILINGS[name] = Split(parts)


def split_names() -> list[str]:
    """The names tiled by ``set_split`` (and not tiled otherwise since)."""
    return [n for n, t in _TILINGS.items() if isinstance(t, Split)]


def set_distribution(name: str, rule: str | list[int] | tuple[int, ...] | None) -> None:
    """How the tiles of ``name``'s group map to ranks; None goes back to the default."""
    group_by_name(name)
    if rule is None:
        _DISTRIBUTIONS.pop(name, None)
    elif isinstance(rule, str):
        if rule not in DISTRIBUTION_RULES:
            raise ValueError(f"axis group {name!r}: distribution must be one of {list(DISTRIBUTION_RULES)} or a "
                             f"list of ranks, got {rule!r}")
        _DISTRIBUTIONS[name] = rule
    else:
        ranks = tuple(rule)
        if not ranks or any(type(r) is not int or r < 0 for r in ranks):
            raise ValueError(f"axis group {name!r}: a distribution list holds a rank (an int >= 0) per tile, "
                             f"got {list(ranks)}")
        _DISTRIBUTIONS[name] = ranks
    _DIST_VERSION[0] += 1


def distribution_of(root: AxisGroup) -> str | tuple[int, ...]:
    """The distribution rule of a root group (the first of its names that has one), else
    "cyclic"."""
    if _DISTRIBUTIONS:
        for n in root.names():
            rule = _DISTRIBUTIONS.get(n)
            if rule is not None:
                return rule
    return "cyclic"


def distribution_version() -> int:
    return _DIST_VERSION[0]


def clear_tiling(name: str) -> None:
    """Forget the tiling set for ``name``; a name no live group carries and no tiling
    was set for is unknown, and raises."""
    if _TILINGS.pop(name, None) is None:
        group_by_name(name)


def clear_all() -> None:
    """Forget every tiling and distribution set (the names stay with their groups)."""
    _TILINGS.clear()
    if _DISTRIBUTIONS:
        _DISTRIBUTIONS.clear()
        _DIST_VERSION[0] += 1


def tiling_of(root: AxisGroup, cache: dict[AxisGroup, tuple[int, ...]] | None = None) -> tuple[int, ...]:
    """The tile sizes of a root group: its named tiling, a tiling derived from the
    group it was reshaped from, or a single tile. ``cache`` (root -> sizes) holds the
    answers of one compile, derivation chains included.

    A group that carries several names (ops merged named groups) takes the tiling
    set for any of them; two different tilings are an error naming both.
    """
    if not _TILINGS:
        sizes = (root.extent,)
        if cache is not None:
            cache[root] = sizes
        return sizes
    if cache is not None:
        done = cache.get(root)
        if done is not None:
            return done
    set_for = [(n, _TILINGS[n]) for n in root.names() if n in _TILINGS]
    if not set_for:
        sizes = _derived(root, cache, set())
    else:
        sizes = normalize_tiling(set_for[0][1], root.extent, describe(root))
        for n, t in set_for[1:]:
            other = normalize_tiling(t, root.extent, describe(root))
            if other != sizes:
                raise TilingError(
                    f"axis group {describe(root)}: ops merged groups tiled differently "
                    f"({set_for[0][0]!r}: {list(sizes)}, {n!r}: {list(other)}); give them one tiling"
                )
    if cache is not None:
        cache[root] = sizes
    return sizes


def _derived(root: AxisGroup, cache: dict[AxisGroup, tuple[int, ...]] | None,
             seen: set[AxisGroup]) -> tuple[int, ...]:
    """The tiling a group with none of its own takes from a group it was reshaped from:
    the first link, depth first, that leads to more than one tile (``seen``: the groups
    visited, so cycles of links end and each group is looked at once); untiled if none
    does."""
    found = _follow(root, cache, seen)
    return found if found is not None else (root.extent,)


def _follow(root: AxisGroup, cache: dict[AxisGroup, tuple[int, ...]] | None,
            seen: set[AxisGroup]) -> tuple[int, ...] | None:
    if root in seen:
        return None
    seen.add(root)
    for src, factor in root.derive:
        src = src.root()
        if src in seen:
            continue
        if any(n in _TILINGS for n in src.names()):
            base: tuple[int, ...] | None = tiling_of(src, cache)
        else:
            base = cache.get(src) if cache is not None else None
            if base is None:
                base = _follow(src, cache, seen)
                if base is not None and cache is not None:
                    cache[src] = base  # a tiling found is the group's (a dead end may depend on the path)
        if base is None or len(base) < 2:
            continue
        if factor > 0:
            sizes = tuple(s * factor for s in base)
        elif all(s % -factor == 0 for s in base):
            sizes = tuple(s // -factor for s in base)
        else:
            continue
        if sum(sizes) == root.extent:
            return sizes
    return None


def groups_report() -> list[tuple[AxisGroup, int]]:
    """Live root groups with their member counts, named ones first."""
    counts: dict[AxisGroup, int] = {}
    for g in list(_ALL):
        r = g.root()
        counts[r] = counts.get(r, 0) + 1
    return sorted(counts.items(), key=lambda kv: (kv[0].name is None, kv[0].name or "", -kv[0].extent))


def format_groups(pending: bool = False) -> str:
    """One line of ``key=value`` tokens per live group (named first): ``name='a=b'``
    (``name=-`` if unnamed), ``extent``, ``members``, then ``ntiles`` and ``tiles`` (the
    sizes joined by commas), or ``pending_ntiles`` / ``pending_tiles`` where ``pending``
    (ops recorded, not yet submitted: the tiling their compile will give), or
    ``tiling=invalid: <reason>``. A ``DDP axis='<name>' replicas=<parts>`` line comes
    first per name split for data parallelism."""
    lines = [f"DDP axis='{n}' replicas={t.parts}" for n, t in _TILINGS.items() if isinstance(t, Split)]
    prefix = "pending_" if pending else ""
    for r, n in groups_report():
        names = "=".join(r.names())
        head = f"name='{names}'" if names else "name=-"
        try:
            tiles = tiling_of(r)
            tdesc = f"{prefix}ntiles={len(tiles)} {prefix}tiles={','.join(map(str, tiles))}"
        except ValueError as e:
            tdesc = f"tiling=invalid: {e}"
        lines.append(f"{head} extent={r.extent} members={n} {tdesc}")
    return "\n".join(lines)
