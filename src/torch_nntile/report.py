"""What the device did: phase timings, op and kernel metrics, graph dumps, task traces.

Everything here reads the counters in ``stats`` (written by every layer) or the
pending graph; nothing here changes what runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch_nntile import stats
from torch_nntile.graph.dot import tensor_dot, tile_dot
from torch_nntile.graph.nodes import SESSION
from torch_nntile.runtime.submission import worker_label
from torch_nntile.session import SESSION_STATE
from torch_nntile.tiling.tiles import Lowering, PlanHandles, TileArray

_PHASE_LABELS = {
    "record": "record (host, inside ATen ops)",
    "ingress": "ingress (copies from CPU)",
    "fallback": "CPU fallback ops",
    "compile": "compile",
    "compile.reuse": "  reuse of lowered steps",
    "compile.axis_groups": "  axis groups",
    "compile.lowering": "  lowering to tile tasks",
    "run": "run (submit to StarPU)",
    "replay": "replay (captured steps)",
    "wait": "wait",
    "readout": "readout (copies to CPU)",
}


def _live_runtime() -> Any:
    """The running runtime, or None: reports never start (or restart) StarPU."""
    return SESSION_STATE.live_runtime()


def _dry_run() -> str | None:
    rt = _live_runtime()
    return rt.dry_run if rt is not None else None


# -- info ----------------------------------------------------------------------


def info() -> dict[str, Any]:
    """Cumulative phase times (seconds, exclusive of nested phases) and counters.

    ``phases["compile"]`` includes its sub-phases ``compile.reuse``,
    ``compile.axis_groups`` and ``compile.lowering``. ``compiles_reused`` counts the
    compiles that took the tasks of an earlier compile of the same structure instead
    of lowering (``tiling.reuse``), ``compiles_lowered`` the others (``compiles_checked``:
    those of them lowered again to check a template, ``TORCH_NNTILE_CHECK_REUSE=1``).
    ``tiles_registered`` counts tiles that needed a new StarPU handle (and memory)
    rather than a spare left by dead tiles of the same size;
    ``tiles_spare`` is how many such spares are kept now, ``tile_bytes`` the bytes
    of every tile's handle, spares included (out of core, in RAM or on disk). ``ops_pruned`` counts
    recorded ops whose results nothing could read by compile time (not lowered).
    ``dry_run`` names the active dry-run switch, if any. Over several processes, ``mpi``
    gives this rank, the world size, the bytes of tiles it sent and received and the
    tasks it ran (``tasks_here``) and left to the other ranks (``tasks_elsewhere``), and
    the bytes of the live tiles it owns (``tile_bytes_owned``) and holds in its memory,
    received copies included (``tile_bytes_held``). Out of core
    (``init_context(memory_limit=...)``), ``out_of_core`` gives the limit and swap
    folder, ``bytes_evicted`` and ``bytes_loaded`` what StarPU wrote to the swap disk
    and read back, ``data_wait_s`` the seconds workers waited for tiles to arrive, and
    ``hint_evictions`` the tiles evicted right after a use because the graph showed
    their next read too far off to keep them (``hint_evictions_declined``: such
    evictions StarPU refused, the tile being in use then; runtime/hints.py). With CUDA
    workers, ``cuda`` gives their count, their GPUs and the tasks they ran.
    """
    stats.collect()
    phases = {p: {"calls": stats.PHASE_CALLS[p], "seconds": stats.PHASE_TIME[p]} for p in stats.PHASES}
    for sub in ("compile.reuse", "compile.axis_groups", "compile.lowering"):
        phases["compile"]["seconds"] += phases[sub]["seconds"]
    c = stats.COUNTS
    return {
        "phases": phases,
        "tasks_submitted": c["tasks_submitted"],
        "tasks_skipped": c["tasks_skipped"],
        "ops_pruned": c["ops_pruned"],
        "compiles_reused": c["compiles_reused"],
        "compiles_lowered": c["compiles_lowered"],
        "compiles_checked": c["compiles_checked"],
        "tiles_live": c["tiles_live"],
        "tiles_peak": stats.TILES_PEAK[0],
        "tiles_registered": c["tiles_registered"],
        "tiles_spare": rt.spare_count() if (rt := _live_runtime()) is not None else 0,
        "tile_bytes": rt.tile_bytes() if rt is not None else 0,
        "bytes_in": c["bytes_in"],
        "bytes_out": c["bytes_out"],
        "out_of_core": rt.swap_info() if rt is not None else None,
        "bytes_evicted": c["bytes_evicted"],
        "bytes_loaded": c["bytes_loaded"],
        "data_wait_s": stats.DATA_WAIT[0],
        "hint_evictions": c["hint_evictions"],
        "hint_evictions_declined": c["hint_evictions_declined"],
        "dry_run": _dry_run(),
        "mpi": rt.dist_info() if rt is not None else None,
        "cuda": rt.cuda_info() if rt is not None else None,
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 10_000 else f"{n} B"


def _dry_banner(dry: str | None, what: str) -> list[str]:
    return [f"!! {dry} is set: {what}"] if dry else []


def format_info() -> str:
    """``info()`` as a readable table: calls, total seconds and milliseconds per call of
    each phase (record, ingress, compile and its parts, run, replay, wait, readout),
    then tasks submitted, compiles that reused a lowered step, live and peak tiles,
    StarPU handles, and bytes copied in and out.

    The first thing to look at when a step is slow: it shows whether the time goes to
    the host (recording, lowering) or to the workers (waiting). A banner warns when a
    dry-run switch makes the numbers timings only.
    """
    d = info()
    lines = _dry_banner(d["dry_run"], "timings only, results are not numerically meaningful")
    lines.append(f"{'phase':<34} {'calls':>8} {'total s':>10} {'ms/call':>9}")
    for p, v in d["phases"].items():
        n, sec = v["calls"], v["seconds"]
        per = f"{1e3 * sec / n:9.3f}" if n else f"{'-':>9}"
        lines.append(f"{_PHASE_LABELS[p]:<34} {n:>8} {sec:>10.4f} {per}")
    skipped = f" ({d['tasks_skipped']} not submitted: dry run)" if d["tasks_skipped"] else ""
    pruned = f"; ops dropped as dead before lowering: {d['ops_pruned']}" if d["ops_pruned"] else ""
    lines.append(f"tasks submitted: {d['tasks_submitted']}{skipped}{pruned}")
    compiles = d["compiles_reused"] + d["compiles_lowered"]
    if compiles:
        lines.append(f"compiles that reused a lowered step: {d['compiles_reused']} of {compiles} "
                     f"({100 * d['compiles_reused'] / compiles:.0f}%)")
    lines.append(f"tiles live: {d['tiles_live']}, peak {d['tiles_peak']}; new StarPU handles: "
                 f"{d['tiles_registered']}, spare handles kept for reuse: {d['tiles_spare']}")
    lines.append(f"bytes in: {_mb(d['bytes_in'])}, out: {_mb(d['bytes_out'])}")
    if d["mpi"] is not None:
        m = d["mpi"]
        lines.append(f"rank {m['rank']} of {m['world_size']}: sent {_mb(m['bytes_sent'])}, received "
                     f"{_mb(m['bytes_received'])}; tasks run here {m['tasks_here']}, on other ranks "
                     f"{m['tasks_elsewhere']}; tiles owned {_mb(m['tile_bytes_owned'])}, held "
                     f"{_mb(m['tile_bytes_held'])}")
    if d["out_of_core"] is not None:
        lines.append(f"out of core, limit {_mb(d['out_of_core']['memory_limit'])}: evicted to disk "
                     f"{_mb(d['bytes_evicted'])}, loaded back {_mb(d['bytes_loaded'])}; workers waited "
                     f"{d['data_wait_s']:.3f} s for tiles; {d['hint_evictions']} evicted early (graph-aware hints)")
    return "\n".join(lines)


def print_info() -> None:
    """Print ``format_info()``."""
    print(format_info())


def reset_info() -> None:
    """Zero the phase times, counters and metrics (tiles live are kept; peak restarts from them)."""
    stats.reset()
    rt = _live_runtime()
    if rt is not None:
        rt.dist_info(reset=True)


# -- metrics -------------------------------------------------------------------


def metrics() -> dict[str, Any]:
    """Recorded calls per ATen op; ops run by PyTorch's CPU kernel per tile of the dims
    they map over (the batch, the channels, ...: ``batched``: calls); ops that ran as untiled tasks in the graph (``untiled``:
    count, first user source line, bytes of the inputs they read whole); CPU fallbacks
    (count, first user source line, why the op could not be an untiled task); per tile
    kernel the task count and total kernel seconds (all workers); and per op and axis
    group how many values were copied into another tiling because the op could not use
    theirs (``retiles``: op -> group -> count)."""
    stats.collect()
    kernels: dict[str, dict[str, float]] = {}
    for per_worker in stats.KERNELS:
        for name, (n, sec) in list(per_worker.items()):
            k = kernels.setdefault(name, {"tasks": 0, "seconds": 0.0})
            k["tasks"] += int(n)
            k["seconds"] += sec
    return {
        "ops": dict(stats.OP_CALLS),
        "batched": dict(stats.BATCHED_CALLS),
        "untiled": {op: {"count": n, "first_source": stats.UNTILED_SOURCE.get(op, "<unknown>"),
                         "bytes_gathered": stats.UNTILED_BYTES[op]}
                    for op, n in stats.UNTILED_CALLS.items()},
        "fallbacks": {op: {"count": n, "first_source": stats.FALLBACK_SOURCE.get(op, "<unknown>"),
                           "reason": stats.FALLBACK_REASON.get(op, "")}
                      for op, n in stats.FALLBACK_CALLS.items()},
        "kernels": kernels,
        "retiles": _retiles(),
        "dry_run": _dry_run(),
    }


def _retiles() -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (op, group), n in stats.RETILES.items():
        out.setdefault(op, {})[group] = n
    return out


def metrics_report() -> str:
    """``metrics()`` as readable tables: recorded calls per ATen op (most frequent
    first), the ops run by PyTorch's CPU kernel per tile, the ops that ran as
    untiled tasks (calls, bytes read whole, first call's source line), the ops that
    ran on the CPU fallback (calls, first call's source line, why), re-tilings per op
    and axis group, and per tile kernel its tasks, total seconds, microseconds per
    task and share of all kernel time.

    Use it to find which kernels dominate a step, which ops have no tiled kernel or
    fell back to the CPU, and which axis groups an op had to re-tile (a hint to tile
    them alike).
    """
    m = metrics()
    lines = _dry_banner(m["dry_run"], "kernel times are not real")
    lines.append(f"{'ATen op':<44} {'calls':>8}")
    for op, n in sorted(m["ops"].items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"{op:<44} {n:>8}")
    if m["batched"]:
        lines.append("")
        lines.append(f"{'ran per tile (CPU kernel of PyTorch)':<44} {'calls':>8}")
        for op, n in sorted(m["batched"].items()):
            lines.append(f"{op:<44} {n:>8}")
    if m["untiled"]:
        lines.append("")
        lines.append(f"{'ran as untiled tasks':<44} {'calls':>8} {'read whole':>10}  first called from")
        for op, v in sorted(m["untiled"].items()):
            lines.append(f"{op:<44} {v['count']:>8} {_mb(v['bytes_gathered']):>10}  {v['first_source']}")
    if m["fallbacks"]:
        lines.append("")
        lines.append(f"{'ran on the CPU fallback':<44} {'calls':>8}  first called from; why")
        for op, v in sorted(m["fallbacks"].items()):
            lines.append(f"{op:<44} {v['count']:>8}  {v['first_source']}; {v['reason']}")
    if m["retiles"]:
        lines.append("")
        lines.append(f"{'re-tiled for an op':<24} {'along axis group':<28} {'times':>8}")
        rows = [(op, g, n) for op, per in m["retiles"].items() for g, n in per.items()]
        for op, g, n in sorted(rows, key=lambda r: (-r[2], r[0], r[1])):
            lines.append(f"{op:<24} {g:<28} {n:>8}")
    lines.append("")
    total = sum(k["seconds"] for k in m["kernels"].values()) or 1.0
    lines.append(f"{'tile kernel':<28} {'tasks':>8} {'total s':>10} {'us/task':>9} {'share':>6}")
    for name, k in sorted(m["kernels"].items(), key=lambda kv: -kv[1]["seconds"]):
        n, sec = int(k["tasks"]), k["seconds"]
        lines.append(f"{name:<28} {n:>8} {sec:>10.4f} {1e6 * sec / max(n, 1):>9.1f} {100 * sec / total:>5.1f}%")
    return "\n".join(lines)


# -- graph ---------------------------------------------------------------------


def pending_op_names() -> list[str]:
    """Names of the recorded ops not yet compiled, in record order."""
    return SESSION.pending_names()


def format_pending_data_sizes() -> str:
    """The values pending ops will produce: op, shape, dtype, bytes, and the total."""
    lines = [f"{'op':<24} {'shape':<22} {'dtype':<10} {'bytes':>12}"]
    total = count = 0
    for op in SESSION.snapshot():
        for n in op.outputs:
            nbytes = n.numel * n.dtype.itemsize
            total += nbytes
            count += 1
            lines.append(f"{op.label:<24} {str(list(n.shape)):<22} {str(n.dtype).removeprefix('torch.'):<10} {nbytes:>12}")
    lines.append(f"total: {count} values, {total} bytes ({_mb(total)})")
    return "\n".join(lines)


def dump_graph(path: str | os.PathLike[str], level: str = "tensor") -> None:
    """Write the pending graph as Graphviz DOT.

    ``level="tensor"``: ops and values (shape, dtype, tiling). ``level="tile"``:
    the tile tasks the graph lowers to (compiled-but-not-run tasks first), each
    tile version a node; pending elementwise chains are drawn op by op (the compile
    fuses them). Nothing is compiled or run by dumping.
    """
    if level == "tensor":
        text = tensor_dot(SESSION.snapshot())
    elif level == "tile":
        text = _tile_level()
    else:
        raise ValueError(f"dump_graph: level must be 'tensor' or 'tile', got {level!r}")
    with open(path, "w") as f:
        f.write(text)


def _tile_level() -> str:
    s = SESSION_STATE
    with s.lock:
        names: dict[Any, str] = {}
        tasks: list[Any] = []
        for ctx in ([s.compiled] if s.compiled is not None else []):
            tasks += ctx.tasks
            _name_tiles(ctx, names)
        ctx = Lowering(PlanHandles(s.runtime()))
        try:
            ops = SESSION.snapshot()
            ctx.plan(ops)
            for op in ops:
                ctx.lower(op)
            _name_tiles(ctx, names)
            return tile_dot(tasks + ctx.tasks, names)
        finally:
            ctx.discard()


def _name_tiles(ctx: Lowering, names: dict[Any, str]) -> None:
    label = dict(ctx.labels)
    for node, arr in ctx.values.items():
        if node.op is not None:
            label[id(arr)] = node.op.label
    for arr in ctx.keep:
        _name_array(arr, label.get(id(arr), "value"), names)


def _name_array(arr: TileArray, what: str, names: dict[Any, str]) -> None:
    for idx in arr.indices():
        names.setdefault(arr.handles[arr.flat(idx)], f"{what} {list(arr.shape)} tile {list(idx)}")


# -- traces --------------------------------------------------------------------


def start_trace() -> None:
    """Record every task's worker, start and end from now on (and host phases)."""
    SESSION_STATE.wait()
    stats.TRACE = []
    stats.TRACE_HOST.clear()


def stop_trace(path: str | os.PathLike[str]) -> int:
    """Wait for submitted tasks, write Chrome trace-event JSON; return the task count."""
    try:
        SESSION_STATE.wait()
    finally:
        stats.collect()
        events, host = stats.TRACE or [], list(stats.TRACE_HOST)
        stats.TRACE = None
        stats.TRACE_HOST.clear()
    t0 = min([e[3] for e in events] + [h[1] for h in host], default=0.0)
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "host (Python)"}},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "StarPU workers"}},
    ]
    for w in sorted({e[2] for e in events}):
        out.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": w, "args": {"name": worker_label(w)}})
    for key, name, worker, start, end in events:
        out.append({"name": name, "cat": "task", "ph": "X", "pid": 1, "tid": worker,
                    "ts": (start - t0) * 1e6, "dur": (end - start) * 1e6, "args": {"task": key}})
    for name, start, end in host:
        out.append({"name": name, "cat": "phase", "ph": "X", "pid": 0, "tid": 0,
                    "ts": (start - t0) * 1e6, "dur": (end - start) * 1e6})
    with open(path, "w") as f:
        json.dump({"traceEvents": out, "displayTimeUnit": "ms"}, f)
    return len(events)


@contextmanager
def trace(path: str | os.PathLike[str]) -> Iterator[None]:
    """``with torch_nntile.trace("step.json"): ...`` — open the file in Perfetto."""
    start_trace()
    try:
        yield
    finally:
        stop_trace(path)
