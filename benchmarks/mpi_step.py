"""One training step of the bias-free ReLU MLP 784-1024x4-10 (batch 1024 in tiles of 256,
cross-entropy, AdamW) over 1, 2 and 4 processes (``python -m torch_nntile.launch``), its
batch tiles spread over the ranks: data-parallel, from the tiling alone.

For each process count N prints and (``--json PATH``) writes:

- the step time (rank 0's median over blocks of ``--block`` steps, each block ending
  with a wait);
- the tile bytes each rank sent a step (the most of any rank, and the mean), against
  the least data parallelism needs: a ring all-reduce of the gradients sends
  ``2 (N - 1) / N`` of their bytes from each rank;
- per rank, after a step, the bytes of the tiles it owns (parameters, AdamW's state and
  its batch tiles: they should fall as 1/N) and of those in its memory (its own and
  the copies it received), and its peak resident memory.

The processes share the machine's cores: each gets ``--workers // N`` StarPU workers
(at least one), so every run has about the same workers in all. On a machine with as
many cores as workers the ranks run side by side; with fewer (2 cores and 4 ranks) they
take turns, and no speed-up is to be expected.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import classifier_step, dump_json, machine_facts, run_record, timed_block, utc_now

HERE = Path(__file__).resolve().parent


def worker(args: argparse.Namespace) -> None:
    """One rank: train, time, measure, write ``rank<r>.json`` into ``args.worker``."""
    import torch

    import torch_nntile
    from torch_nntile.nn.model import DeepReLU
    from torch_nntile.report import info

    torch_nntile.init_context(ncpu=args.ncpu)
    torch.manual_seed(0)
    model = DeepReLU(784, 1024, 10, depth=5).to("nntile")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 784, generator=gen).to("nntile")
    y = torch.randint(0, 10, (args.batch,), generator=gen).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "batch"})
    torch_nntile.set_axis_group_tiling("batch", args.tile)
    step = classifier_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), x, y, False)
    for _ in range(args.warmup):
        step()
    torch_nntile.wait()
    torch_nntile.reset_info()
    blocks = [timed_block(step, args.block, True) for _ in range(args.steps // args.block)]
    torch_nntile.empty_cache()  # one rank keeps dead tiles' memory as spares: count the live tiles only
    d = info()
    one = {"tile_bytes_owned": d["tile_bytes"], "tile_bytes_held": d["tile_bytes"]}  # one rank: every tile is its own
    mpi = d["mpi"] or one
    steps = len(blocks) * args.block
    rec = {
        "rank": torch_nntile.rank(),
        "step_ms": statistics.median(blocks) * 1e3,
        "block_ms": [t * 1e3 for t in blocks],
        "sent_per_step": mpi.get("bytes_sent", 0) / steps,
        "received_per_step": mpi.get("bytes_received", 0) / steps,
        "tile_bytes_owned": mpi.get("tile_bytes_owned"),
        "tile_bytes_held": mpi.get("tile_bytes_held"),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    with open(Path(args.worker) / f"rank{rec['rank']}.json", "w") as f:
        json.dump(rec, f)
    torch_nntile.shutdown_context()


def run(n: int, args: argparse.Namespace, out: Path) -> dict:
    """Launch ``n`` ranks; their figures, summed up."""
    ncpu = max(1, args.workers // n)
    cmd = [sys.executable, "-m", "torch_nntile.launch", "-n", str(n), str(Path(__file__)), "--worker", str(out),
           "--ncpu", str(ncpu), "--steps", str(args.steps), "--block", str(args.block), "--warmup", str(args.warmup),
           "--batch", str(args.batch), "--tile", str(args.tile)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI"))}
    subprocess.run(cmd, check=True, env=env)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]
    grads = ranks[0]["param_bytes"]
    least = 2 * (n - 1) / n * grads
    sent = [r["sent_per_step"] for r in ranks]
    owned = [r["tile_bytes_owned"] for r in ranks if r["tile_bytes_owned"] is not None]
    held = [r["tile_bytes_held"] for r in ranks if r["tile_bytes_held"] is not None]
    return {
        "ranks": n,
        "workers_per_rank": ncpu,
        "step_ms": ranks[0]["step_ms"],
        "block_ms": ranks[0]["block_ms"],
        "sent_mib_max": max(sent) / 2**20,
        "sent_mib_mean": statistics.mean(sent) / 2**20,
        "ring_allreduce_mib": least / 2**20,
        "sent_over_ring": max(sent) / least if least else None,
        "owned_mib_max": max(owned) / 2**20 if owned else None,
        "held_mib_max": max(held) / 2**20 if held else None,
        "peak_rss_mib_max": max(r["peak_rss_mib"] for r in ranks),
        "param_mib": grads / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1,2,4", help="process counts, comma-separated")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="StarPU workers of all ranks together")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--block", type=int, default=5, help="consecutive steps timed together")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--tile", type=int, default=256, help="batch tile size")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)  # a rank of a run (launched by run())
    ap.add_argument("--ncpu", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    date, t0 = utc_now(), time.perf_counter()
    runs = []
    print(f"{'ranks':>5} {'workers':>7} {'step ms':>8} {'sent MiB/step (max, mean)':>26} {'ring min':>9} "
          f"{'sent/ring':>9} {'owned MiB':>9} {'held MiB':>9} {'peak RSS MiB':>12}")
    for n in [int(v) for v in args.ranks.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            r = run(n, args, Path(tmp))
        runs.append(r)
        ratio = f"{r['sent_over_ring']:.2f}" if r["sent_over_ring"] is not None else "-"
        owned = f"{r['owned_mib_max']:.1f}" if r["owned_mib_max"] is not None else "-"
        held = f"{r['held_mib_max']:.1f}" if r["held_mib_max"] is not None else "-"
        print(f"{n:>5} {r['workers_per_rank']:>7} {r['step_ms']:>8.1f} "
              f"{r['sent_mib_max']:>12.2f} {r['sent_mib_mean']:>13.2f} {r['ring_allreduce_mib']:>9.2f} {ratio:>9} "
              f"{owned:>9} {held:>9} {r['peak_rss_mib_max']:>12.0f}", flush=True)
    if args.json:
        from torch_nntile.runtime import _shim  # noqa: F401 - loads the libstarpu whose version machine_facts reads
        rec = run_record("mpi_step", args, date, time.perf_counter() - t0, machine_facts(args.workers),
                         internal=("json", "worker", "ncpu"))
        rec |= {"model": "DeepReLU 784-1024x4-10, AdamW", "tiling": f"batch {args.tile}", "runs": runs}
        dump_json(args.json, rec)


if __name__ == "__main__":
    main()
