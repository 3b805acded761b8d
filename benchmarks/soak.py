"""Soak test: train the bias-free ReLU MLP with torch.optim.AdamW on a tiled batch for
many steps and check that nothing accumulates from step to step.

Each step moves a new batch in from the CPU and records the same graph, so after
the first steps the process should reach a steady state: the same number of live
tiles after every ``torch_nntile.wait()`` and a flat resident set (dead tiles'
buffers are reused by the next step's tiles). Every ``--every`` steps this prints the RSS (VmRSS from
/proc/self/status), the live tiles and the mean step time since the last report.
At the end it checks that the RSS at the last report is within ``--rss-tol-mib`` of
the first report and that the live tiles never changed; the exit status is 1 if not.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from _common import status_mib

import torch_nntile
from torch_nntile.nn.model import DeepReLU


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="training steps (default 1000)")
    ap.add_argument("--every", type=int, default=100, help="report every this many steps (default 100)")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--tile", type=int, default=128, help="batch tile size (default 128)")
    ap.add_argument("--batches", type=int, default=8, help="distinct CPU batches, cycled (default 8)")
    ap.add_argument("--hidden", type=int, default=512, help="hidden width of DeepReLU(784, hidden, 10)")
    ap.add_argument("--depth", type=int, default=4, help="Linear layers of the MLP (default 4)")
    ap.add_argument("--foreach", choices=["default", "on", "off"], default="default",
                    help="AdamW's foreach= (default: PyTorch's choice for the device)")
    ap.add_argument("--ncpu", type=int, default=2)
    ap.add_argument("--rss-tol-mib", type=float, default=20.0, help="allowed RSS growth, first to last report")
    args = ap.parse_args()
    if args.steps < 2 * args.every:
        ap.error("--steps must be at least twice --every (the check compares the first report with the last)")

    torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=False)
    torch.manual_seed(0)
    model = DeepReLU(784, args.hidden, 10, depth=args.depth).to("nntile")
    # a new batch moves in from the CPU every step, as in a real loop (cycling a few keeps
    # the CPU-side data fixed, so that any growth is the device's)
    data = [(torch.randn(args.batch, 784), torch.randint(0, 10, (args.batch,))) for _ in range(args.batches)]
    foreach = {"default": None, "on": True, "off": False}[args.foreach]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, foreach=foreach)
    print(f"DeepReLU(784, {args.hidden}, 10, depth={args.depth}), batch {args.batch} in tiles of {args.tile}, "
          f"AdamW (foreach={args.foreach}), {args.steps} steps", flush=True)
    print(f"{'step':>6} {'loss':>9} {'RSS MiB':>9} {'tiles live':>10} {'ms/step':>8}", flush=True)

    reports: list[tuple[int, float, int]] = []  # (step, RSS MiB, live tiles)
    t0 = time.perf_counter()
    loss_value = float("nan")
    for step in range(1, args.steps + 1):
        xc, yc = data[step % len(data)]
        x, y = xc.to("nntile"), yc.to("nntile")
        torch_nntile.set_axis_group_name(x, {0: "batch"})
        if step == 1:
            torch_nntile.set_axis_group_tiling("batch", args.tile)  # kept by name for later batches
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        del loss, x, y
        if step % args.every == 0:
            torch_nntile.wait()
            ms = 1e3 * (time.perf_counter() - t0) / args.every
            rss, live = status_mib("VmRSS"), torch_nntile.info()["tiles_live"]
            reports.append((step, rss, live))
            print(f"{step:>6} {loss_value:>9.4f} {rss:>9.1f} {live:>10} {ms:>8.1f}", flush=True)
            t0 = time.perf_counter()

    (s0, rss0, live0), (s1, rss1, _) = reports[0], reports[-1]
    lives = sorted({r[2] for r in reports})
    rss_ok = rss1 - rss0 <= args.rss_tol_mib
    tiles_ok = len(lives) == 1
    print(f"RSS step {s0}: {rss0:.1f} MiB, step {s1}: {rss1:.1f} MiB, growth {rss1 - rss0:+.1f} MiB "
          f"(allowed {args.rss_tol_mib:g}): {'ok' if rss_ok else 'FAIL'}")
    print(f"live tiles: {'constant at ' + str(live0) if tiles_ok else 'changed: ' + str(lives)}: "
          f"{'ok' if tiles_ok else 'FAIL'}")
    print("soak: " + ("PASS" if rss_ok and tiles_ok else "FAIL"), flush=True)
    return 0 if rss_ok and tiles_ok else 1


if __name__ == "__main__":
    sys.exit(main())
