"""One training step of the bias-free ReLU MLP 784-1024x4-10 (batch 1024, cross-entropy,
SGD): nntile on StarPU and CPU eager, timed side by side in one process.

On nntile, ``loss.item()`` waits for the loss only: the rest of the step (backward,
update) keeps running while the next step is recorded. A step's own time is then
not observable, so both sides are timed in blocks of ``--block`` consecutive steps,
the nntile block ending with ``torch_nntile.wait()``; a step's time is its block's
time over the block size. Blocks alternate between the two sides so that machine
noise hits both alike. Prints the median step time of each (warm-up excluded) and,
last, the ratio.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

import torch_nntile
from torch_nntile.nn.model import DeepReLU


def _step(model, opt, x, y) -> float:
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()  # on nntile this flushes and waits for the loss


def _timed_block(model, opt, x, y, n: int) -> float:
    """Seconds per step over ``n`` consecutive steps, all their work finished."""
    t0 = time.perf_counter()
    for _ in range(n):
        _step(model, opt, x, y)
    if x.device.type == "nntile":
        torch_nntile.wait()
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=50, help="timed steps per side")
    ap.add_argument("--block", type=int, default=5, help="consecutive steps timed together")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--tile", type=int, default=256, help="batch tile size on nntile")
    ap.add_argument("--ncpu", type=int, default=2)
    ap.add_argument("--scheduler", default=None, help="StarPU scheduler (default lws)")
    ap.add_argument("--report", action="store_true", help="print phase timings and kernel metrics of the nntile steps")
    ap.add_argument("--trace", metavar="PATH", help="write a Chrome trace of one extra nntile step")
    args = ap.parse_args()

    torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=False, scheduler=args.scheduler)
    torch.manual_seed(0)
    cpu_model = DeepReLU(784, 1024, 10, depth=5)
    dev_model = copy.deepcopy(cpu_model).to("nntile")
    x = torch.randn(args.batch, 784)
    y = torch.randint(0, 10, (args.batch,))
    xn, yn = x.to("nntile"), y.to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "batch"})
    torch_nntile.set_axis_group_tiling("batch", args.tile)

    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.01)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.01)
    for _ in range(args.warmup):
        _step(cpu_model, cpu_opt, x, y)
        _step(dev_model, dev_opt, xn, yn)
    torch_nntile.wait()
    torch_nntile.reset_info()
    # Alternate blocks; swap which side goes first every other pair of blocks.
    cpu_t, dev_t = [], []
    for i in range(max(1, args.steps // args.block)):
        sides = [(cpu_t, (cpu_model, cpu_opt, x, y)), (dev_t, (dev_model, dev_opt, xn, yn))]
        for times, a in (sides if i % 2 == 0 else sides[::-1]):
            times.append(_timed_block(*a, args.block))
    cpu_med, dev_med = statistics.median(cpu_t), statistics.median(dev_t)
    print(f"torch threads (CPU eager): {torch.get_num_threads()}, StarPU CPU workers: {args.ncpu}")
    nsteps = len(cpu_t) * args.block
    print(f"cpu eager step:  median {cpu_med * 1e3:8.2f} ms over {nsteps} steps (blocks of {args.block})")
    print(f"nntile step:     median {dev_med * 1e3:8.2f} ms over {nsteps} steps (blocks of {args.block}, "
          f"batch tile {args.tile})")
    if args.report:
        print(torch_nntile.format_info())
        print(torch_nntile.metrics_report())
    if args.trace:
        with torch_nntile.trace(args.trace):
            _step(dev_model, dev_opt, xn, yn)
        print(f"trace of one step written to {args.trace}")
    print(f"ratio nntile/cpu: {dev_med / cpu_med:.2f}")
    torch_nntile.shutdown_context()


if __name__ == "__main__":
    main()
