"""One training step of the bias-free ReLU MLP 784-1024x4-10 (batch 1024, cross-entropy,
SGD): nntile on StarPU and CPU eager, timed side by side in one process.

On nntile, ``loss.item()`` waits for the loss only: the rest of the step (backward,
update) keeps running while the next step is recorded. A step's own time is then
not observable, so both sides are timed in blocks of ``--block`` consecutive steps,
the nntile block ending with ``torch_nntile.wait()``; a step's time is its block's
time over the block size. Blocks alternate between the two sides so that machine
noise hits both alike. Prints the median step time of each (warm-up excluded), the
arithmetic floor (``floor ms``, ``nntile/floor``), the peak resident memory of each
side (``peak rss MiB``, each side in its own process: see ``_common.py``) and, last,
``ratio nntile/cpu``. ``--json PATH`` also writes all of it, with every block's time,
the options and the machine, as one JSON object (``report_pages.py`` makes the docs'
Benchmarks page from such files).

Multiply-adds of a step, from the weights' shapes (``W_i`` is ``d_{i+1} x d_i``, batch
``b``): forward ``b * sum_i d_i * d_{i+1}``; backward twice that (grad input and grad
weight, one product each of the forward's size) except the first layer's grad input,
which autograd skips (the input needs no gradient): ``3 * fwd - b * d_0 * d_1``.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from _common import (
    add_common_args,
    alternate,
    classifier_step,
    mm_probe,
    mm_rate,
    peak_rss,
    print_figures,
    print_steps,
    rss_side,
    utc_now,
    write_result,
)

import torch_nntile
from torch_nntile.nn.model import DeepReLU


def step_macs(model: torch.nn.Module, batch: int) -> int:
    """Multiply-adds of one training step (the formula in the module docstring)."""
    shapes = [p.shape for p in model.parameters()]  # (out, in) per Linear, input first
    fwd = sum(batch * i * o for o, i in shapes)
    return 3 * fwd - batch * shapes[0][1] * shapes[0][0]


def make_side(device: str, args: argparse.Namespace):
    """Model, optimizer and one step's callable of one side, the same weights and data on both."""
    torch.manual_seed(0)
    model = DeepReLU(784, 1024, 10, depth=5).to(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 784, generator=gen).to(device)
    y = torch.randint(0, 10, (args.batch,), generator=gen).to(device)
    if device == "nntile":
        torch_nntile.set_axis_group_name(x, {0: "batch"})
        torch_nntile.set_axis_group_tiling("batch", args.tile)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return model, classifier_step(model, opt, x, y, args.capture and device == "nntile")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50, help="timed steps per side")
    ap.add_argument("--block", type=int, default=5, help="consecutive steps timed together")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--tile", type=int, default=256, help="batch tile size on nntile")
    ap.add_argument("--trace", metavar="PATH", help="write a Chrome trace of one extra nntile step")
    add_common_args(ap)
    args = ap.parse_args()
    date, t_start = utc_now(), time.perf_counter()

    torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=False, scheduler=args.scheduler)
    if args.rss_side is not None:
        _, step = make_side(args.rss_side, args)
        rss_side(step, args.warmup, args.rss_steps, args.rss_side == "nntile")
        torch_nntile.shutdown_context()
        return
    probe = mm_probe(args.mm_size)  # eager's threads; timed before the steps and between their blocks
    rate = mm_rate(probe)
    cpu_model, cpu_step = make_side("cpu", args)
    _, dev_step = make_side("nntile", args)
    for _ in range(args.warmup):
        cpu_step()
        dev_step()
    torch_nntile.wait()
    torch_nntile.reset_info()
    cpu_t, dev_t, rates = alternate(cpu_step, dev_step, args.steps, args.block, probe)
    cpu_med, dev_med, _, report = print_steps(args, cpu_t, dev_t, f"batch tile {args.tile}")
    if args.trace:
        with torch_nntile.trace(args.trace):
            dev_step()
        print(f"trace of one step written to {args.trace}")
    rss = peak_rss(sys.argv[0], sys.argv[1:]) if args.rss_steps > 0 else None
    figures = print_figures(step_macs(cpu_model, args.batch), rates, rate, args.mm_size, cpu_med, dev_med, rss,
                            args.rss_steps)
    if args.json:
        write_result(args.json, "mlp_step", args, date, time.perf_counter() - t_start, args.block, cpu_t, dev_t,
                     figures, model=f"DeepReLU 784-1024x4-10, batch {args.batch}, cross-entropy, SGD",
                     tiling=f"batch {args.tile}", captured=args.capture, report=report, trace=args.trace)
    print(f"ratio nntile/cpu: {dev_med / cpu_med:.2f}")
    torch_nntile.shutdown_context()


if __name__ == "__main__":
    main()
