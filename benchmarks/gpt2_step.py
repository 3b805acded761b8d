"""One training step of a small stock HuggingFace GPT-2 (GPT2LMHeadModel built from a
config: 2 layers, 128 dims, 4 heads, vocabulary 1000, tied embeddings, eager attention,
no dropout; batch 8, sequence 64), the loss computed by the model from ``labels``,
``torch.optim.AdamW``: nntile on StarPU and CPU eager, timed side by side in one process.

As in ``mlp_step.py``: ``loss.item()`` on nntile returns once the loss is known while
the step's backward and update go on, so steps are timed in blocks of ``--block``
consecutive steps, the nntile block ending with ``torch_nntile.wait()``; blocks of the
two sides alternate (which side goes first swaps every block) so that machine noise
hits both alike. Prints the median step time of each (warm-up excluded) and, last,
``ratio nntile/cpu: X.XX``.

Tiling (``--tile-*``, a size or a comma-separated list of sizes): the axis groups are
named from the inputs and the weights: ``batch`` and ``seq`` (dims 0 and 1 of
``input_ids``, and of the embedding's output, named by a forward hook: the embedding
gathers rows by the flattened ids, so names on the ids do not reach the hidden
states), ``vocab`` and ``hidden`` (dims 0 and 1 of ``wte.weight``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import transformers as hf

import torch_nntile

hf.logging.set_verbosity_error()


def gpt2() -> torch.nn.Module:
    cfg = hf.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                        tie_word_embeddings=True, attn_implementation="eager")
    torch.manual_seed(0)
    return hf.GPT2LMHeadModel(cfg)


def _step(model, opt, ids) -> float:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()  # on nntile this flushes and waits for the loss


def _timed_block(model, opt, ids, n: int) -> float:
    """Seconds per step over ``n`` consecutive steps, all their work finished."""
    t0 = time.perf_counter()
    for _ in range(n):
        _step(model, opt, ids)
    if ids.device.type == "nntile":
        torch_nntile.wait()
    return (time.perf_counter() - t0) / n


def _tiling(text: str | None) -> int | list[int] | None:
    if text is None:
        return None
    sizes = [int(s) for s in text.split(",")]
    return sizes[0] if len(sizes) == 1 else sizes


def tile(model: torch.nn.Module, ids: torch.Tensor, tilings: dict[str, int | list[int] | None]) -> None:
    """Name the axis groups of a GPT-2 on nntile and tile those given a tiling."""
    wte = model.get_input_embeddings()
    torch_nntile.set_axis_group_name(ids, {0: "batch", 1: "seq"})
    torch_nntile.set_axis_group_name(wte.weight, {0: "vocab", 1: "hidden"})
    wte.register_forward_hook(lambda mod, args, out: torch_nntile.set_axis_group_name(out, {0: "batch", 1: "seq"}))
    for name, t in tilings.items():
        if t is not None:
            torch_nntile.set_axis_group_tiling(name, t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per side (at least 10)")
    ap.add_argument("--block", type=int, default=2, help="consecutive steps timed together")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ncpu", type=int, default=2)
    ap.add_argument("--scheduler", default=None, help="StarPU scheduler (default lws)")
    ap.add_argument("--cpu-fallback", action="store_true", help="run the ops nntile lacks on the CPU")
    ap.add_argument("--tile-batch", help="tile size(s) of the batch axis group (extent 8)")
    ap.add_argument("--tile-seq", help="tile size(s) of the sequence axis group (extent 64)")
    ap.add_argument("--tile-hidden", help="tile size(s) of the hidden axis group (extent 128)")
    ap.add_argument("--tile-vocab", help="tile size(s) of the vocabulary axis group (extent 1000)")
    ap.add_argument("--report", action="store_true", help="print phase timings and kernel metrics of the nntile steps")
    args = ap.parse_args()
    if args.steps < 10:
        ap.error("--steps must be at least 10")

    torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=args.cpu_fallback, scheduler=args.scheduler)
    cpu_model = gpt2()
    dev_model = copy.deepcopy(cpu_model).to("nntile")
    ids = torch.randint(0, 1000, (8, 64), generator=torch.Generator().manual_seed(1))
    idn = ids.to("nntile")
    tilings = {"batch": _tiling(args.tile_batch), "seq": _tiling(args.tile_seq),
               "hidden": _tiling(args.tile_hidden), "vocab": _tiling(args.tile_vocab)}
    tile(dev_model, idn, tilings)

    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-3)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-3)
    for _ in range(args.warmup):
        want, got = _step(cpu_model, cpu_opt, ids), _step(dev_model, dev_opt, idn)
    torch_nntile.wait()
    print(f"loss after warm-up: cpu {want:.6f}, nntile {got:.6f}")
    torch_nntile.reset_info()
    cpu_t, dev_t = [], []
    for i in range(max(1, args.steps // args.block)):
        sides = [(cpu_t, (cpu_model, cpu_opt, ids)), (dev_t, (dev_model, dev_opt, idn))]
        for times, a in (sides if i % 2 == 0 else sides[::-1]):
            times.append(_timed_block(*a, args.block))
    cpu_med, dev_med = statistics.median(cpu_t), statistics.median(dev_t)
    nsteps = len(cpu_t) * args.block
    tiled = ", ".join(f"{k} {v}" for k, v in tilings.items() if v is not None) or "untiled"
    print(f"torch threads (CPU eager): {torch.get_num_threads()}, StarPU CPU workers: {args.ncpu}")
    print(f"cpu eager step:  median {cpu_med * 1e3:8.2f} ms over {nsteps} steps (blocks of {args.block})")
    print(f"nntile step:     median {dev_med * 1e3:8.2f} ms over {nsteps} steps (blocks of {args.block}; {tiled})")
    fallbacks = torch_nntile.fallback_counts()
    if fallbacks:
        per_step = ", ".join(f"{op} {n / nsteps:g}" for op, n in sorted(fallbacks.items()))
        print(f"CPU fallback ops per nntile step: {per_step}")
    if args.report:
        print(torch_nntile.format_info())
        print(torch_nntile.metrics_report())
    print(f"ratio nntile/cpu: {dev_med / cpu_med:.2f}")
    torch_nntile.shutdown_context()


if __name__ == "__main__":
    main()
