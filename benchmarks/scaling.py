"""How the step time scales with the cores given: the MLP step of ``mlp_step.py`` and the
medium GPT-2 step of ``gpt2_step.py --size medium``, nntile with 1, 2, 4, ... StarPU CPU
workers next to CPU eager with as many torch threads (``torch.set_num_threads``), up to
``--max-workers`` (default: the cores this process may run on), that count included
when it is not a power of two.

StarPU's worker count is fixed for a context, and nntile tensors do not outlive it, so
each (model, count) runs in a process of its own (this script with ``--one N``): the
model, optimizer and data built afresh, the two sides warmed up and timed as the other
benchmarks time them (alternating blocks, each nntile block ending with
``torch_nntile.wait()``; ``_common.alternate``). The process prints one JSON line this
script collects.

StarPU may start fewer workers than asked (Debian's 1.3 build caps CPU workers at 4,
the project's 1.4 build at 256): each row shows the count the runtime reports, marked
where it differs from the request, as is a torch thread count that differs.

The tilings are the benchmarks' own (MLP: batch 1024 in tiles of 256; GPT-2: batch 8
in tiles of 2, vocabulary 8192 in tiles of 2048), made for two workers: most ops of a
step are 4 tasks, which bounds what more than 4 workers can share.

Prints a table per model: eager and nntile ms a step (medians), nntile/cpu, and each
side's speedup over its own 1-thread/1-worker time. ``--json PATH`` writes the run's
options, machine and every row (block times included) as one JSON object (the fields
of the other benchmarks' files first: ``_common.run_record``). ``--quick``: tiny shapes
and 2 steps, to check that it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
from _common import Step, alternate, dump_json, machine_facts, run_record, starpu_version, utc_now

import torch_nntile
from torch_nntile.session import SESSION_STATE

MODELS = ("mlp", "gpt2-medium")
# Per model: timed steps, steps a block, warm-up steps. About 1 (MLP) and 2 (GPT-2)
# minutes on 2 cores for the rows 1 and 2, each process's imports and first compile included.
DEFAULTS = {"mlp": (30, 5, 3), "gpt2-medium": (6, 2, 2)}
QUICK = (2, 1, 1)
ONE_LINE = "scaling-one:"  # prefix of the JSON line a --one process prints


def worker_counts(max_workers: int) -> list[int]:
    """1, 2, 4, ... up to ``max_workers``, which is included even if not a power of two."""
    counts = [1]
    while counts[-1] * 2 <= max_workers:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == max_workers else [*counts, max_workers]


def build(model: str, quick: bool) -> tuple[Step, Step, str]:
    """The eager and the nntile step of ``model`` (the benchmarks' own builders: same
    weights and data on both sides) and what the model is. Imported here: GPT-2 brings
    in transformers, which the MLP's processes need not load."""
    if model == "mlp":
        import mlp_step

        opts = argparse.Namespace(batch=64 if quick else 1024, tile=32 if quick else 256, capture=False)
        _, cpu = mlp_step.make_side("cpu", opts)
        _, dev = mlp_step.make_side("nntile", opts)
        return cpu, dev, f"DeepReLU 784-1024x4-10, batch {opts.batch}, cross-entropy, SGD; nntile batch tile {opts.tile}"
    import gpt2_step

    p = gpt2_step.PRESETS["medium"]
    if quick:
        p = dataclasses.replace(p, n_layer=1, n_embd=64, n_head=2, vocab=256, seq=32, batch=4,
                                tilings={"batch": 2, "vocab": 128})
    cpu = gpt2_step.make_side("cpu", p, p.tilings)
    dev = gpt2_step.make_side("nntile", p, p.tilings)
    tiled = ", ".join(f"{k} {v}" for k, v in p.tilings.items())
    return cpu, dev, (f"GPT-2 {p.n_layer} layers, n_embd {p.n_embd}, {p.n_head} heads, vocab {p.vocab}, seq {p.seq}, "
                      f"batch {p.batch}, AdamW, {p.attn} attention; nntile tiles {tiled}")


def run_one(args: argparse.Namespace) -> None:
    """The body of a ``--one N`` process: one model at N threads and N workers asked,
    its result printed as one JSON line."""
    n, model = args.one, args.models
    t0 = time.perf_counter()
    torch.set_num_threads(n)
    torch_nntile.init_context(ncpu=n, cpu_fallback=False)
    workers = SESSION_STATE.runtime().ncpu  # what StarPU started, which its build may cap
    cpu_step, dev_step, what = build(model, args.quick)
    for _ in range(args.warmup):
        cpu_step()
        dev_step()
    torch_nntile.wait()
    cpu_t, dev_t, _ = alternate(cpu_step, dev_step, args.steps, args.block)
    result = {"model": what, "torch_threads": torch.get_num_threads(), "starpu_workers": workers,
              "starpu": starpu_version(), "cpu_ms": [t * 1e3 for t in cpu_t], "nntile_ms": [t * 1e3 for t in dev_t],
              "wall_s": time.perf_counter() - t0}
    torch_nntile.shutdown_context()
    print(ONE_LINE, json.dumps(result), flush=True)


def measure(model: str, n: int, steps: int, block: int, warmup: int, quick: bool) -> dict[str, Any]:
    """Run ``model`` at ``n`` in a process of its own and return what it printed."""
    cmd = [sys.executable, os.path.abspath(__file__), "--one", str(n), "--models", model, "--steps", str(steps),
           "--block", str(block), "--warmup", str(warmup), *(["--quick"] if quick else [])]
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(ONE_LINE)]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"{model} at {n} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    return json.loads(lines[-1].removeprefix(ONE_LINE))


def row(n: int, got: dict[str, Any], first: dict[str, Any] | None) -> dict[str, Any]:
    """One row's figures (ms a step are the medians of the blocks); speedups against
    ``first``, the row of 1 (None: this is it)."""
    cpu, dev = statistics.median(got["cpu_ms"]), statistics.median(got["nntile_ms"])
    base = first or {"cpu": {"median_ms": cpu}, "nntile": {"median_ms": dev}}
    return {"workers": n, "torch_threads": got["torch_threads"], "starpu_workers": got["starpu_workers"],
            "cpu": {"median_ms": cpu, "block_ms": got["cpu_ms"]}, "nntile": {"median_ms": dev, "block_ms": got["nntile_ms"]},
            "ratio": dev / cpu, "cpu_speedup": base["cpu"]["median_ms"] / cpu,
            "nntile_speedup": base["nntile"]["median_ms"] / dev, "wall_s": got["wall_s"]}


HEADER = f"{'workers/threads':>15} {'eager ms':>10} {'nntile ms':>10} {'nntile/cpu':>11} {'eager x':>8} {'nntile x':>9}"


def format_row(r: dict[str, Any]) -> str:
    """A table line; the count marked ``*`` with what was started where StarPU or torch
    did not take the count asked."""
    n, w, t = r["workers"], r["starpu_workers"], r["torch_threads"]
    label = str(n) if w == t == n else f"{n}*({w}/{t})"
    return (f"{label:>15} {r['cpu']['median_ms']:10.2f} {r['nntile']['median_ms']:10.2f} {r['ratio']:11.2f} "
            f"{r['cpu_speedup']:8.2f} {r['nntile_speedup']:9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)} (default: both)")
    ap.add_argument("--max-workers", type=int, default=len(os.sched_getaffinity(0)),
                    help="largest worker/thread count (default: the cores this process may run on)")
    ap.add_argument("--steps", type=int, help="timed steps per side and count (default: MLP 30, GPT-2 6)")
    ap.add_argument("--block", type=int, help="consecutive steps timed together (default: MLP 5, GPT-2 2)")
    ap.add_argument("--warmup", type=int, help="untimed steps per side first (default: MLP 3, GPT-2 2)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 2 steps: checks that it runs")
    ap.add_argument("--json", metavar="PATH", help="also write the run's options, machine and rows to PATH as JSON")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one model at one count
    args = ap.parse_args()
    if args.one is not None:
        run_one(args)
        return
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - set(MODELS):
        ap.error(f"--models takes a comma-separated list of {', '.join(MODELS)}")
    if args.max_workers < 1:
        ap.error("--max-workers must be at least 1")
    date, t_start = utc_now(), time.perf_counter()
    counts = worker_counts(args.max_workers)
    facts = machine_facts(0)
    print(f"{facts['cpu']}, {facts['cores_usable']} usable cores; torch {facts['torch']}; "
          f"worker/thread counts {', '.join(map(str, counts))}")
    results: dict[str, Any] = {}
    starpu = "unknown"
    for model in models:
        steps, block, warmup = QUICK if args.quick else DEFAULTS[model]
        steps, warmup = args.steps or steps, args.warmup if args.warmup is not None else warmup
        block = min(args.block or block, steps)
        rows: list[dict[str, Any]] = []
        for n in counts:
            got = measure(model, n, steps, block, warmup, args.quick)
            if not rows:
                starpu = got["starpu"]
                print(f"\n{model}: {got['model']}")
                print(f"{steps // block * block} timed steps a side in blocks of {block}, {warmup} warm-up; "
                      f"StarPU {starpu}; eager x, nntile x: speedup over the side's own 1-thread/1-worker time")
                print(HEADER)
            rows.append(row(n, got, rows[0] if rows else None))
            print(format_row(rows[-1]), flush=True)
        if any(r["starpu_workers"] != r["workers"] or r["torch_threads"] != r["workers"] for r in rows):
            print("* fewer StarPU workers or torch threads than asked: (StarPU workers/torch threads) started")
        results[model] = {"model": got["model"], "steps": steps // block * block, "block": block, "warmup": warmup,
                          "rows": rows}
    wall = time.perf_counter() - t_start
    print(f"\nwall {wall:.0f} s")
    if args.json:
        machine = facts | {"starpu": starpu, "torch_threads": None, "starpu_workers": None}  # per row
        dump_json(args.json, {**run_record("scaling", args, date, wall, machine, internal=("one", "json")),
                              "counts": counts, "models": results})


if __name__ == "__main__":
    main()
