"""What the step benchmarks (``mlp_step.py``, ``gpt2_step.py``) share: timing the two
sides in alternating blocks, the arithmetic floor and the peak resident memory.

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
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

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
    """Options of both benchmarks for the floor and the memory figures."""
    ap.add_argument("--mm-size", type=int, default=2048, help="size of the square torch.mm that measures the floor's rate")
    ap.add_argument("--rss-steps", type=int, default=3,
                    help="steps after warm-up in each side's own process for the peak RSS (0: skip it)")
    ap.add_argument("--rss-side", choices=["cpu", "nntile"], help=argparse.SUPPRESS)  # internal: one side's process


def _reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_mib(reset: bool) -> float:
    if reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
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


def print_figures(macs: int, rates: list[float], best: float, mm_size: int, cpu_med: float, dev_med: float,
                  rss: tuple[float, float, str] | None, rss_steps: int) -> None:
    """The floor, nntile/floor and peak RSS lines (step times in seconds; ``rates`` timed
    between the blocks, ``best`` before the steps); the caller prints the ratio line last."""
    rate = statistics.median(rates)
    floor, peak = macs / rate, macs / best
    print(f"floor ms: {floor * 1e3:.2f} ({macs / 1e9:.3f} GMAC a step at {rate / 1e9:.1f} GMAC/s, the median of "
          f"{len(rates)} torch.mm {mm_size}x{mm_size} float32 on {torch.get_num_threads()} threads timed between "
          f"the blocks; cpu/floor {cpu_med / floor:.2f})")
    print(f"nntile/floor: {dev_med / floor:.2f}")
    print(f"floor at the best of {BEST_OF} products before the steps: {peak * 1e3:.2f} ms ({best / 1e9:.1f} GMAC/s; "
          f"nntile/floor {dev_med / peak:.2f}, cpu/floor {cpu_med / peak:.2f})")
    if rss is not None:
        cpu_mib, dev_mib, what = rss
        print(f"peak rss MiB: cpu {cpu_mib:.1f} nntile {dev_mib:.1f} (nntile/cpu {dev_mib / cpu_mib:.2f}; "
              f"each side in its own process, VmHWM over {rss_steps} steps {what}, nothing subtracted)")

