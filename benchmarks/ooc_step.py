"""Out-of-core training: a GPT-2 trained with its tiles in a third of the memory they
need (``init_context(memory_limit=..., swap_dir=...)``), next to the same run in memory.

Each side runs in a process of its own, as a context's memory is fixed when it starts.
The in-memory side runs first and measures the tile memory a step needs
(``info()["tile_bytes"]`` after the warm-up: parameters, gradients, AdamW's moments and
activations, with the spares kept for the next step); the out-of-core side gets
``--fraction`` of it (default a third) as ``memory_limit``, a swap folder under
``--swap-dir`` (default: the system's temporary folder), which StarPU writes with
O_DIRECT, and ``--scheduler``'s StarPU scheduler if given. Both train the same model on
the same data with the GPT-2 benchmark's tilings (``gpt2_step.py``). The losses agree
to rounding: out of core, products do not use MKL's packed operands.

Each side: ``--warmup`` steps, then ``--steps`` steps each timed to its loss read back.
Prints per side the median ms a step; the peak resident memory above the process's own
once a CPU copy of the model was built and dropped (VmHWM reset after the warm-up where
the kernel allows, else the process's lifetime peak); out of core, the bytes evicted to
disk and loaded back a step and the seconds workers waited for tiles; then the ratio of
the step times and the largest relative difference of the losses. ``--lru`` adds a
third side: out of core without the runtime's graph-aware hints
(``TORCH_NNTILE_OOC_HINTS=0``), StarPU's LRU eviction alone. ``--json PATH``
writes the options, machine and both sides' figures. ``--quick``: a tiny model, 2 steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import _peak_mib, _reset_peak, dump_json, machine_facts, run_record, starpu_version, status_mib, utc_now

import torch_nntile

ONE_LINE = "ooc-one:"  # prefix of the JSON line a side's process prints


def preset(size: str, quick: bool) -> Any:
    import gpt2_step

    p = gpt2_step.PRESETS[size]
    if quick:
        p = dataclasses.replace(p, n_layer=1, n_embd=64, n_head=2, vocab=512, seq=32, batch=4,
                                tilings={"batch": 2, "vocab": 128})
    return p


def run_side(args: argparse.Namespace) -> None:
    """One side, in its own process: in memory (``--limit 0``) or out of core."""
    import gpt2_step

    p = preset(args.size, args.quick)
    t0 = time.perf_counter()
    limit = args.limit or None
    swap = tempfile.mkdtemp(prefix="torch_nntile_swap_", dir=args.swap_dir) if limit else None
    torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=False, memory_limit=limit, swap_dir=swap,
                              scheduler=args.scheduler if limit else None)
    gpt2_step.gpt2(p)  # the CPU model that make_side builds (and drops) leaves its traces in the heap
    base = status_mib("VmRSS")
    step = gpt2_step.make_side("nntile", p, p.tilings)
    losses = [step() for _ in range(args.warmup)]
    torch_nntile.wait()
    tile_bytes = torch_nntile.info()["tile_bytes"]
    reset = _reset_peak()
    before = torch_nntile.info()
    times = []
    for _ in range(args.steps):
        s = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - s)
    torch_nntile.wait()
    after = torch_nntile.info()
    n = len(times)
    result = {"losses": losses, "step_ms": [t * 1e3 for t in times], "median_ms": statistics.median(times) * 1e3,
              "tile_bytes": tile_bytes, "memory_limit": limit, "base_rss_mib": base,
              "peak_rss_mib": _peak_mib(reset), "peak_covers": "after warm-up" if reset else "process lifetime",
              "evicted_per_step": (after["bytes_evicted"] - before["bytes_evicted"]) / n,
              "loaded_per_step": (after["bytes_loaded"] - before["bytes_loaded"]) / n,
              "data_wait_s_per_step": (after["data_wait_s"] - before["data_wait_s"]) / n,
              "hint_evictions_per_step": (after["hint_evictions"] - before["hint_evictions"]) / n,
              "starpu": starpu_version(), "wall_s": time.perf_counter() - t0}
    torch_nntile.shutdown_context()
    if swap:
        os.rmdir(swap)  # StarPU removed what it wrote there: the folder is empty
    print(ONE_LINE, json.dumps(result), flush=True)


def side(args: argparse.Namespace, limit: int, hints: bool = True) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", "--limit", str(limit), "--size", args.size,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--ncpu", str(args.ncpu),
           *(["--scheduler", args.scheduler] if args.scheduler else []),
           *(["--swap-dir", args.swap_dir] if args.swap_dir else []), *(["--quick"] if args.quick else [])]
    res = subprocess.run(cmd, capture_output=True, text=True,
                         env={**os.environ, "TORCH_NNTILE_OOC_HINTS": "1" if hints else "0"})
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(ONE_LINE)]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"the {'out-of-core' if limit else 'in-memory'} side failed ({res.returncode}):\n"
                           f"{res.stdout}{res.stderr}")
    return json.loads(lines[-1].removeprefix(ONE_LINE))


def _loss_diff(mem: dict[str, Any], side: dict[str, Any]) -> float:
    """The largest relative difference of a side's losses from the in-memory ones."""
    return max(abs(a - b) / abs(a) for a, b in zip(mem["losses"], side["losses"]))


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=("small", "medium"), default="medium", help="GPT-2 preset (default medium)")
    ap.add_argument("--fraction", type=float, default=1 / 3,
                    help="memory_limit as a fraction of the in-memory tile bytes (default 1/3)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps a side (default 4)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps a side first (default 2)")
    ap.add_argument("--ncpu", type=int, default=len(os.sched_getaffinity(0)), help="StarPU workers (default: the cores)")
    ap.add_argument("--scheduler", help="the out-of-core side's StarPU scheduler (default: init_context's)")
    ap.add_argument("--swap-dir", help="folder for the swap folder (default: the system's temporary folder)")
    ap.add_argument("--lru", action="store_true", help="also run out of core without the graph-aware hints")
    ap.add_argument("--quick", action="store_true", help="a tiny model, 2 steps: checks that it runs")
    ap.add_argument("--json", metavar="PATH", help="also write the options, machine and figures to PATH as JSON")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # internal: one side
    ap.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)  # internal: that side's limit
    args = ap.parse_args()
    if args.quick:
        args.steps, args.warmup = 2, 1
    if args.one:
        run_side(args)
        return
    if not 0 < args.fraction <= 1:
        ap.error("--fraction must be in (0, 1]")
    date, t_start = utc_now(), time.perf_counter()
    facts = machine_facts(0)
    mem = side(args, 0)
    limit = max(1 << 20, int(mem["tile_bytes"] * args.fraction) >> 20 << 20)
    ooc = side(args, limit)
    lru = side(args, limit, hints=False) if args.lru else None
    p = preset(args.size, args.quick)
    print(f"{facts['cpu']}, {args.ncpu} workers; StarPU {mem['starpu']}; GPT-2 {args.size}{' (quick)' if args.quick else ''}: "
          f"{p.n_layer} layers, n_embd {p.n_embd}, vocab {p.vocab}, batch {p.batch}, seq {p.seq}, AdamW")
    print(f"tile memory a step needs (in memory): {_mib(mem['tile_bytes'])}; memory_limit out of core: "
          f"{_mib(limit)} ({mem['tile_bytes'] / limit:.2f}x less)")
    print(f"{'':<14} {'ms/step':>9} {'peak rss above base':>20} {'evicted/step':>13} {'loaded/step':>12} "
          f"{'data wait s/step':>17} {'hinted evictions/step':>22}")
    sides = [("in memory", mem), ("out of core", ooc), *([("ooc, LRU only", lru)] if lru else [])]
    for name, r in sides:
        hinted = f"{r['hint_evictions_per_step']:.0f}" if r["memory_limit"] else ""
        print(f"{name:<14} {r['median_ms']:9.1f} {r['peak_rss_mib'] - r['base_rss_mib']:16.1f} MiB "
              f"{_mib(r['evicted_per_step']):>13} {_mib(r['loaded_per_step']):>12} {r['data_wait_s_per_step']:17.3f} "
              f"{hinted:>22}")
    ratio = ooc["median_ms"] / mem["median_ms"]
    diff = _loss_diff(mem, ooc)
    print(f"out of core / in memory: {ratio:.2f}x the step time; losses' largest relative difference {diff:.2e}")
    lru_ratio = lru["median_ms"] / mem["median_ms"] if lru else None
    if lru:
        lru_diff = _loss_diff(mem, lru)
        print(f"out of core with StarPU's LRU alone / in memory: {lru_ratio:.2f}x the step time; losses' largest "
              f"relative difference {lru_diff:.2e}")
    wall = time.perf_counter() - t_start
    print(f"wall {wall:.0f} s")
    if args.json:
        machine = facts | {"starpu": mem["starpu"], "torch_threads": None, "starpu_workers": args.ncpu}
        dump_json(args.json, {**run_record("ooc_step", args, date, wall, machine, internal=("one", "limit", "json")),
                              "memory_limit": limit, "ratio": ratio, "loss_max_rel_diff": diff,
                              "in_memory": mem, "out_of_core": ooc, "lru_ratio": lru_ratio, "out_of_core_lru": lru})


if __name__ == "__main__":
    main()
