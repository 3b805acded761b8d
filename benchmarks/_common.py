"""What the step benchmarks (``mlp_step.py``, ``gpt2_step.py``, ``cnn_step.py``) share:
timing the two sides in alternating blocks, the lines of step times, the arithmetic
floor and the peak resident memory.

Every timed block and floor product starts after a pause (``SETTLE_S``), so that it
does not share the cores with the previous block's spinning threads.

Arithmetic floor: a step's multiply-add count (counted by each benchmark from its model's
shapes) over the rate of ``torch.mm`` on all cores, measured in the same process: the
time the step would take if it were nothing but matrix products running as fast as
eager's own. The rate is the median of one product timed after each pair of blocks,
so that it meets the machine's noise as the steps' medians do; the best of ten products
timed before the steps (the figure printed before 2026-12-04) is printed beside it. On
a shared machine that best was 4-23 % above what the products ran at while the steps
did, which put even eager's step (nearly all products of the floor's kind) at 1.15-1.36
times the floor.

Peak resident memory: each side runs in a process of its own (the benchmark re-runs its
script with ``--rss-side cpu|nntile``) that builds only that side, with the same imports
and the same StarPU context, runs the warm-up steps, resets the kernel's high-water mark
(``/proc/self/clear_refs``) and runs ``--rss-steps`` steps; the peak is ``VmHWM`` after
them, nothing subtracted. In one process the two sides' models, optimizer states and
allocator caches would sit in both figures; separate processes keep them apart and keep
the timed steps free of any sampling.

Results as JSON (``--json PATH``): one object with the run's options, the machine, the
step times of every block and the figures printed (``write_result``), so that the pages
of ``docs/`` are made from measurements (``report_pages.py``), not copied by hand.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import torch_nntile

Step = Callable[[], float]
_RSS_LINE = "rss-side peak MiB:"
BEST_OF = 10  # products timed one after the other before the steps, for the best-of floor line
# Pause before each timed block and probe: torch's OpenMP team (libgomp here) spins on
# a core for about 10 ms after its last parallel region, which would take that core
# from the next block's start; that is eager's block or the probe before every nntile
# block, and never the other way (StarPU's idle workers sleep). Seen here: the team's
# thread used 1.5 ms of CPU per nntile step of a block of 5 without the pause, 0 with it.
SETTLE_S = 0.05


def mm_probe(n: int = 2048) -> Callable[[], float]:
    """A callable returning the multiply-adds per second of one float32 ``n`` x ``n``
    ``torch.mm`` on torch's default threads. Its operands and result are made once (one
    product untimed): a new result would be memory the allocator may have just given
    back to the kernel (nntile trims malloc's free pages), its page faults timed too."""
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    torch.mm(a, b, out=c)

    def rate() -> float:
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        return n**3 / (time.perf_counter() - t0)

    return rate


def mm_rate(probe: Callable[[], float], reps: int = BEST_OF) -> float:
    """The best of ``reps`` rates of ``probe`` (``mm_probe``), timed one after the other."""
    return max(probe() for _ in range(reps))


def classifier_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                    capture: bool) -> Step:
    """One training step on ``(x, y)`` as a callable returning the loss: cross-entropy,
    backward, ``opt``'s update; ``capture``: replayed with ``torch_nntile.capture``. On
    nntile the ``.item()`` flushes and waits for the loss only."""

    def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if capture:
        import torch_nntile

        fn = torch_nntile.capture(train)
    else:
        fn = train
    return lambda: fn(x, y).item()


def timed_block(step: Step, n: int, on_nntile: bool) -> float:
    """Seconds per step over ``n`` consecutive steps, all their work finished: on nntile
    ``loss.item()`` returns before the step's backward and update are done."""
    time.sleep(SETTLE_S)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    if on_nntile:
        torch_nntile.wait()
    return (time.perf_counter() - t0) / n


def alternate(cpu_step: Step, dev_step: Step, steps: int, block: int,
              probe: Callable[[], float] | None = None) -> tuple[list[float], list[float], list[float]]:
    """Per-step times of blocks of ``block`` steps, the two sides alternating (which side
    goes first swaps every block) so that machine noise hits both alike; and what
    ``probe`` (``mm_probe``) returned after each pair of blocks."""
    cpu_t: list[float] = []
    dev_t: list[float] = []
    rates: list[float] = []
    for i in range(max(1, steps // block)):
        sides = [(cpu_t, cpu_step, False), (dev_t, dev_step, True)]
        for times, step, on_nntile in sides if i % 2 == 0 else sides[::-1]:
            times.append(timed_block(step, block, on_nntile))
        if probe is not None:
            time.sleep(SETTLE_S)
            rates.append(probe())
    return cpu_t, dev_t, rates


def add_common_args(ap: argparse.ArgumentParser) -> None:
    """Options every step benchmark has: warm-up, StarPU's workers and scheduler, the
    nntile reports, capture, and those of the floor and the memory figures."""
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ncpu", type=int, default=2)
    ap.add_argument("--scheduler", default=None, help="StarPU scheduler (default lws)")
    ap.add_argument("--report", action="store_true", help="print phase timings and kernel metrics of the nntile steps")
    ap.add_argument("--capture", action="store_true",
                    help="replay the nntile step with torch_nntile.capture (recorded in the warm-up steps)")
    ap.add_argument("--mm-size", type=int, default=2048, help="size of the square torch.mm that measures the floor's rate")
    ap.add_argument("--rss-steps", type=int, default=3,
                    help="steps after warm-up in each side's own process for the peak RSS (0: skip it)")
    ap.add_argument("--rss-side", choices=["cpu", "nntile"], help=argparse.SUPPRESS)  # internal: one side's process
    ap.add_argument("--json", metavar="PATH", help="also write the run's options, machine and figures to PATH as JSON")


def _reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status in MiB: ``VmRSS`` (resident
    now), ``VmHWM`` (its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} line in /proc/self/status")


def _peak_mib(reset: bool) -> float:
    if reset:
        return status_mib("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux: the process's lifetime peak


def rss_side(step: Step, warmup: int, steps: int, on_nntile: bool) -> None:
    """The body of a ``--rss-side`` process: warm up, reset the peak, run ``steps`` steps
    and print their peak resident set."""
    for _ in range(max(1, warmup)):  # the optimizer's state exists from the first step on
        step()
    if on_nntile:
        torch_nntile.wait()
    reset = _reset_peak()
    for _ in range(steps):
        step()
    if on_nntile:
        torch_nntile.wait()
    print(f"{_RSS_LINE} {_peak_mib(reset):.1f} {'since-reset' if reset else 'lifetime'}", flush=True)


def peak_rss(script: str, argv: list[str]) -> tuple[float, float, str]:
    """Peak RSS in MiB of the cpu and the nntile side, each in its own run of ``script``
    with ``argv`` (run one after the other), and what the figure covers."""
    peaks, kinds = [], set()
    for side in ("cpu", "nntile"):
        cmd = [sys.executable, script, *argv, "--rss-side", side]
        res = subprocess.run(cmd, capture_output=True, text=True)
        m = re.search(rf"^{_RSS_LINE} ([0-9.]+) (\S+)$", res.stdout, re.M)
        if res.returncode != 0 or m is None:
            raise RuntimeError(f"the {side} side's memory run failed ({res.returncode}):\n{res.stdout}{res.stderr}")
        peaks.append(float(m.group(1)))
        kinds.add(m.group(2))
    what = "after warm-up" if kinds == {"since-reset"} else "over each process's life"
    return peaks[0], peaks[1], what


def print_steps(args: argparse.Namespace, cpu_t: list[float], dev_t: list[float],
                tiling: str) -> tuple[float, float, dict[str, float], str | None]:
    """Print the threads, each side's median step time (``tiling``: how nntile tiled the
    step), the ops that ran on the host fallback per step and, with ``--report``, the
    phase and kernel tables; return the medians, those fallbacks and the report."""
    import torch_nntile

    cpu_med, dev_med = statistics.median(cpu_t), statistics.median(dev_t)
    nsteps = len(cpu_t) * args.block
    print(f"torch threads (CPU eager): {torch.get_num_threads()}, StarPU CPU workers: {args.ncpu}")
    print(f"cpu eager step:  median {cpu_med * 1e3:8.2f} ms over {nsteps} steps (blocks of {args.block})")
    captured = "; captured" if getattr(args, "capture", False) else ""
    print(f"nntile step:     median {dev_med * 1e3:8.2f} ms over {nsteps} steps (blocks of {args.block}; {tiling}"
          f"{captured})")
    fallbacks = {op: n / nsteps for op, n in sorted(torch_nntile.fallback_counts().items())}
    if fallbacks:
        print(f"CPU fallback ops per nntile step: {', '.join(f'{op} {n:g}' for op, n in fallbacks.items())}")
    report = None
    if args.report:
        report = f"{torch_nntile.format_info()}\n{torch_nntile.metrics_report()}"
        print(report)
    return cpu_med, dev_med, fallbacks, report


def print_figures(macs: int, rates: list[float], best: float, mm_size: int, cpu_med: float, dev_med: float,
                  rss: tuple[float, float, str] | None, rss_steps: int) -> dict[str, Any]:
    """Print the floor, nntile/floor and peak RSS lines (step times in seconds; ``rates``
    timed between the blocks, ``best`` before the steps; the caller prints the ratio line
    last) and return the same figures, unrounded, for ``write_result``."""
    rate = statistics.median(rates)
    floor, peak = macs / rate, macs / best
    print(f"floor ms: {floor * 1e3:.2f} ({macs / 1e9:.3f} GMAC a step at {rate / 1e9:.1f} GMAC/s, the median of "
          f"{len(rates)} torch.mm {mm_size}x{mm_size} float32 on {torch.get_num_threads()} threads timed between "
          f"the blocks; cpu/floor {cpu_med / floor:.2f})")
    print(f"nntile/floor: {dev_med / floor:.2f}")
    print(f"floor at the best of {BEST_OF} products before the steps: {peak * 1e3:.2f} ms ({best / 1e9:.1f} GMAC/s; "
          f"nntile/floor {dev_med / peak:.2f}, cpu/floor {cpu_med / peak:.2f})")
    figures: dict[str, Any] = {
        "floor": {"ms": floor * 1e3, "gmac": macs / 1e9, "rate_gmac_s": rate / 1e9,
                  "rates_gmac_s": [r / 1e9 for r in rates], "mm_size": mm_size,
                  "nntile_over_floor": dev_med / floor, "cpu_over_floor": cpu_med / floor},
        "best_floor": {"ms": peak * 1e3, "products": BEST_OF, "rate_gmac_s": best / 1e9,
                       "nntile_over_floor": dev_med / peak, "cpu_over_floor": cpu_med / peak},
        "rss": None,
    }
    if rss is not None:
        cpu_mib, dev_mib, what = rss
        print(f"peak rss MiB: cpu {cpu_mib:.1f} nntile {dev_mib:.1f} (nntile/cpu {dev_mib / cpu_mib:.2f}; "
              f"each side in its own process, VmHWM over {rss_steps} steps {what}, nothing subtracted)")
        figures["rss"] = {"cpu_mib": cpu_mib, "nntile_mib": dev_mib, "nntile_over_cpu": dev_mib / cpu_mib,
                          "steps": rss_steps, "covers": what}
    return figures


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def starpu_version() -> str:
    """The version of the libstarpu this process has loaded (``starpu_get_version``): the
    package has no call that reports it, and the library the shim links against at run
    time is the one that counts, not the headers it was built with. Call it after
    ``init_context``, which loads the shim."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "/libstarpu-" in ln})
        lib = ctypes.CDLL(paths[0])  # already mapped: this only finds its handle
        v = [ctypes.c_int() for _ in range(3)]
        lib.starpu_get_version(*(ctypes.byref(x) for x in v))
        return ".".join(str(x.value) for x in v)
    except (OSError, IndexError, AttributeError):
        return "unknown"


def _commit() -> str | None:
    """The checkout's short commit, ``-dirty`` when tracked files differ from it (other
    than results and the pages made from them, which a run of ``make bench-pages``
    rewrites as it goes); None outside git."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        dirty = subprocess.run(["git", "-C", str(here.parent), "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":!benchmarks/results", ":!docs"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine_facts(ncpu: int) -> dict[str, Any]:
    """What a step time depends on besides the code: the CPU, its cores, the libraries'
    versions and the thread counts of the two sides."""
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
            "torch": torch.__version__, "torch_nntile": torch_nntile.__version__, "starpu": starpu_version(),
            "python": platform.python_version(), "torch_threads": torch.get_num_threads(), "starpu_workers": ncpu}


def utc_now() -> str:
    """The current time in UTC as ISO 8601, to the second."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def write_result(path: str, benchmark: str, args: argparse.Namespace, date: str, wall_s: float, block: int,
                 cpu_t: list[float], dev_t: list[float], figures: dict[str, Any], **extra: Any) -> None:
    """Write one run as a JSON object (``--json``): step times in ms (the median and every
    block's per-step time), the figures of ``print_figures`` and what ``extra`` adds.
    ``wall_s`` is the run from its options to here; ``load_avg`` the machine's load
    averages (1, 5, 15 minutes) at the end, this run included, a hint of how shared the
    cores were."""
    def side(times: list[float]) -> dict[str, Any]:
        return {"median_ms": statistics.median(times) * 1e3, "block_ms": [t * 1e3 for t in times]}

    rss = figures.get("rss")
    record = {
        **run_record(benchmark, args, date, wall_s, machine_facts(args.ncpu)),
        "steps": len(cpu_t) * block,
        "block": block,
        "cpu": side(cpu_t) | {"peak_rss_mib": rss["cpu_mib"] if rss else None},
        "nntile": side(dev_t) | {"peak_rss_mib": rss["nntile_mib"] if rss else None},
        "ratio": statistics.median(dev_t) / statistics.median(cpu_t),
        **figures,
        **extra,
    }
    dump_json(path, record)


def run_record(benchmark: str, args: argparse.Namespace, date: str, wall_s: float, machine: dict[str, Any],
               internal: tuple[str, ...] = ("rss_side", "json")) -> dict[str, Any]:
    """The fields every result file starts with, so that all benchmarks' files say the
    same things about a run the same way; ``internal`` names options that are no setting
    of the run (a hidden per-process option, where the file went)."""
    return {
        "schema": 1,
        "benchmark": benchmark,
        "argv": sys.argv[1:],
        "options": {k: v for k, v in sorted(vars(args).items()) if k not in internal},
        "date": date,
        "wall_s": wall_s,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "commit": _commit(),
        "machine": machine,
    }


def dump_json(path: str, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` (its folder made if missing) and say so."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"results written to {path}")
