"""One training step of a stock HuggingFace GPT-2 (GPT2LMHeadModel from a config, the
loss from ``labels``, ``torch.optim.AdamW``) on a GPU: torch's CUDA eager against
nntile with CUDA workers (a CUDA build; ``init_context(ncuda=1)``), timed side by side
in one process in alternating blocks (``_common.alternate``). Needs a GPU: it is the
benchmark ``scripts/gpu_check.sh`` runs.

  --size gpt2 (default): 12 layers, n_embd 768, 12 heads, vocabulary 50257, sequence
                         1024, batch 8 (the issue's bar: at most 1.1 times eager)
  --size small:          2 layers, n_embd 128, 4 heads, vocabulary 1000, seq 64, batch 8

The CUDA eager step ends with ``loss.item()``, which waits for the whole step (one
stream, in order); the nntile step with ``torch_nntile.wait()`` at the end of a block.

``--mem-frac F`` limits what StarPU keeps on the GPU to F times eager's peak allocation
(``torch.cuda.max_memory_allocated`` over the eager warm-up: the step's working set) with
``STARPU_LIMIT_CUDA_MEM``, so StarPU evicts tiles to the host and loads them back; the
losses of both sides' warm-up steps are printed and written, to show they are kept.
``--json PATH`` writes the options, the machine, every block's step time, the losses
and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import transformers as hf
from _common import alternate, dump_json, machine_facts, run_record, utc_now

import torch_nntile

hf.logging.set_verbosity_error()

SIZES = {  # n_layer, n_embd, n_head, vocab, seq, batch
    "gpt2": (12, 768, 12, 50257, 1024, 8),
    "small": (2, 128, 4, 1000, 64, 8),
}


def make_side(device: str, size: str, tile_batch: int | None):
    """One side's step (returning the loss as a float) and the list its losses go to."""
    n_layer, n_embd, n_head, vocab, seq, batch = SIZES[size]
    cfg = hf.GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=seq,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        pad_token_id=0, tie_word_embeddings=True, attn_implementation="eager")
    torch.manual_seed(0)
    model = hf.GPT2LMHeadModel(cfg).to(device)
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    if device == "nntile" and tile_batch:
        wte = model.get_input_embeddings()
        torch_nntile.set_axis_group_name(ids, {0: "batch"})
        wte.register_forward_hook(lambda mod, args, out: torch_nntile.set_axis_group_name(out, {0: "batch"}))
        torch_nntile.set_axis_group_tiling("batch", tile_batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses: list[float] = []

    def step() -> float:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        v = loss.item()
        losses.append(v)
        return v

    return step, losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="gpt2")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per side")
    ap.add_argument("--block", type=int, default=2, help="consecutive steps timed together")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ncpu", type=int, default=4, help="StarPU CPU workers beside the CUDA worker")
    ap.add_argument("--scheduler", default=None, help="StarPU scheduler (default dmdas with CUDA workers)")
    ap.add_argument("--tile-batch", type=int, default=None, help="tile the batch axis group (default: untiled)")
    ap.add_argument("--mem-frac", type=float, default=None, help="GPU memory limit as a fraction of the working set")
    ap.add_argument("--restrict-cuda", action="store_true", help="every nntile task on the CUDA worker")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("no GPU: torch.cuda.is_available() is False")
    date, t_start = utc_now(), time.perf_counter()

    eager, eager_losses = make_side("cuda", args.size, None)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        eager()
    working_set = torch.cuda.max_memory_allocated()
    limit_mib = None
    if args.mem_frac is not None:  # StarPU reads it once, at init
        limit_mib = max(1, int(working_set * args.mem_frac / 2**20))
        os.environ["STARPU_LIMIT_CUDA_MEM"] = str(limit_mib)
    torch_nntile.init_context(ncpu=args.ncpu, ncuda=1, scheduler=args.scheduler)
    if args.restrict_cuda:
        torch_nntile.restrict_cuda()
    dev, dev_losses = make_side("nntile", args.size, args.tile_batch)
    for _ in range(args.warmup):
        dev()
    torch_nntile.wait()
    warm = {"cuda_eager": list(eager_losses), "nntile": list(dev_losses)}
    print(f"losses over the warm-up: cuda eager {warm['cuda_eager']}, nntile {warm['nntile']}")
    torch_nntile.reset_info()
    eager_t, dev_t, _ = alternate(eager, dev, args.steps, args.block)
    e_med, d_med = statistics.median(eager_t), statistics.median(dev_t)
    info = torch_nntile.info()
    print(f"GPT-2 {args.size} {SIZES[args.size]}, AdamW; GPU working set {working_set / 2**20:.0f} MiB"
          + (f", STARPU_LIMIT_CUDA_MEM {limit_mib} MiB" if limit_mib else ""))
    print(f"cuda eager step: median {e_med * 1e3:8.2f} ms; nntile step: median {d_med * 1e3:8.2f} ms "
          f"({info['cuda']['tasks'] if info['cuda'] else 0} tasks on CUDA workers, "
          f"{info['tasks_submitted']} submitted)")
    if args.json:
        record = run_record("cuda_step", args, date, time.perf_counter() - t_start,
                            machine_facts(args.ncpu) | {"gpu": torch.cuda.get_device_name(0)})
        record |= {"cuda_eager": {"median_ms": e_med * 1e3, "block_ms": [t * 1e3 for t in eager_t]},
                   "nntile": {"median_ms": d_med * 1e3, "block_ms": [t * 1e3 for t in dev_t]},
                   "ratio": d_med / e_med, "working_set_mib": working_set / 2**20, "limit_mib": limit_mib,
                   "warmup_losses": warm, "cuda_tasks": info["cuda"], "tasks_submitted": info["tasks_submitted"]}
        dump_json(args.json, record)
    print(f"ratio nntile/cuda eager: {d_med / e_med:.2f}")
    torch_nntile.shutdown_context()


if __name__ == "__main__":
    main()
