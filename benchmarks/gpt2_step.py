"""One training step of a stock HuggingFace GPT-2 (GPT2LMHeadModel built from a config:
tied embeddings, eager attention unless ``--attn sdpa``, no dropout unless ``--dropout``), the loss computed by the model from
``labels``, ``torch.optim.AdamW``: nntile on StarPU and CPU eager, timed side by side
in one process. ``--size`` picks the model:

  small (default): 2 layers, n_embd 128, 4 heads, vocabulary 1000, batch 8, sequence 64,
                   untiled, 20 timed steps
  medium:          4 layers, n_embd 512, 8 heads, vocabulary 8192, batch 8, sequence 256,
                   vocab tiled by 2048 (the LM head, its gradients and the loss in 4 tiles)
                   and batch by 2 (every op in 4 tasks the two workers share; measured
                   faster than batch 4 or untiled, than seq 128, and than hidden 64),
                   10 timed steps (a step takes seconds)

As in ``mlp_step.py``: ``loss.item()`` on nntile returns once the loss is known while
the step's backward and update go on, so steps are timed in blocks of ``--block``
consecutive steps, the nntile block ending with ``torch_nntile.wait()``; blocks of the
two sides alternate (which side goes first swaps every block) so that machine noise
hits both alike. Prints the median step time of each (warm-up excluded), the arithmetic
floor (``floor ms``, ``nntile/floor``), each side's peak resident memory (``peak rss
MiB``, each side in its own process: see ``_common.py``) and, last, ``ratio nntile/cpu``;
``--json PATH`` also writes all of it, with every block's time, the options and the
machine, as one JSON object (``report_pages.py`` makes the docs' Benchmarks page from it).

Multiply-adds of a step (batch b, sequence s, n_embd E, heads h of size d = E / h,
vocabulary V, L layers): per layer the qkv projection b*s*E*3E, the output projection
b*s*E*E, the MLP 2 * b*s*E*4E, the attention scores and values b*h*s*s*d each (eager
attention computes all s*s scores; the causal mask is applied after); the LM head
b*s*E*V. The backward computes two products the size of each forward one (grad input,
grad weight or the other operand; every input needs its gradient since the embedding
is trained), so a step is 3 * (L * (12*b*s*E^2 + 2*b*h*s*s*d) + b*s*E*V).

``--attn sdpa`` runs HF's SDPA attention instead: ``scaled_dot_product_attention``, on
nntile the tiled flash op (the ``[seq, seq]`` scores never exist whole), on CPU ATen's
flash kernel; with ``--seq`` (the preset's sequence by default) it shows how each
side's peak memory grows with the sequence. The floor still counts all ``s*s`` scores.

``--dropout P``: HF's dropouts (embeddings, attention probabilities, residuals) at
``P`` (GPT-2's own default is 0.1). Both sides draw their masks with CPU's generator
(as PyTorch does, so nntile's masks are CPU's); on nntile they are copied in and
applied in C.

``--fused``: ``AdamW(fused=True)`` on both sides (on nntile one update op a parameter,
``_fused_adamw_``, instead of about nine per-parameter ops inside the foreach calls).

``--capture``: the nntile step is ``torch_nntile.capture(fn)`` (recorded in the warm-up
steps, replayed in the timed ones) and its AdamW is ``capturable=True`` (the step count
and bias corrections as tensors, so a replay repeats them); CPU eager keeps the default
AdamW.

Tiling (``--tile-*``, a size, a comma-separated list of sizes or ``none``; a preset's
tilings apply to the groups not given): the axis groups are named from the inputs and
the weights, as the README's HuggingFace section advises: ``batch`` and ``seq`` (dims 0
and 1 of ``input_ids``, and of the embedding's output, named by a forward hook: the
embedding gathers rows by the flattened ids, so names on the ids do not reach the hidden
states), ``vocab`` and ``hidden`` (dims 0 and 1 of ``wte.weight``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass, field

import torch
import transformers as hf
from _common import (
    add_common_args,
    alternate,
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

hf.logging.set_verbosity_error()

Tiling = int | list[int] | None


@dataclass(frozen=True)
class Preset:
    n_layer: int
    n_embd: int
    n_head: int
    vocab: int
    seq: int
    batch: int
    steps: int
    tilings: dict[str, Tiling] = field(default_factory=dict)
    attn: str = "eager"  # HF's attn_implementation
    dropout: float = 0.0  # HF's resid_pdrop, embd_pdrop and attn_pdrop


PRESETS = {
    "small": Preset(n_layer=2, n_embd=128, n_head=4, vocab=1000, seq=64, batch=8, steps=20),
    "medium": Preset(n_layer=4, n_embd=512, n_head=8, vocab=8192, seq=256, batch=8, steps=10,
                     tilings={"vocab": 2048, "batch": 2}),
}


def gpt2(p: Preset) -> torch.nn.Module:
    cfg = hf.GPT2Config(n_layer=p.n_layer, n_embd=p.n_embd, n_head=p.n_head, vocab_size=p.vocab, n_positions=p.seq,
                        resid_pdrop=p.dropout, embd_pdrop=p.dropout, attn_pdrop=p.dropout,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0,
                        tie_word_embeddings=True, attn_implementation=p.attn)
    torch.manual_seed(0)
    return hf.GPT2LMHeadModel(cfg)


def step_macs(p: Preset) -> int:
    """Multiply-adds of one training step (the formula in the module docstring)."""
    bs, e = p.batch * p.seq, p.n_embd
    attention = 2 * p.batch * p.n_head * p.seq * p.seq * (e // p.n_head)
    return 3 * (p.n_layer * (12 * bs * e * e + attention) + bs * e * p.vocab)


def _tiling(text: str | None) -> Tiling | str:
    """A ``--tile-*`` value: None when not given, "none" for untiled."""
    if text is None or text == "none":
        return text
    sizes = [int(s) for s in text.split(",")]
    return sizes[0] if len(sizes) == 1 else sizes


def tile(model: torch.nn.Module, ids: torch.Tensor, tilings: dict[str, Tiling]) -> None:
    """Name the axis groups of a GPT-2 on nntile and tile those given a tiling."""
    wte = model.get_input_embeddings()
    torch_nntile.set_axis_group_name(ids, {0: "batch", 1: "seq"})
    torch_nntile.set_axis_group_name(wte.weight, {0: "vocab", 1: "hidden"})
    wte.register_forward_hook(lambda mod, args, out: torch_nntile.set_axis_group_name(out, {0: "batch", 1: "seq"}))
    for name, t in tilings.items():
        if t is not None:
            torch_nntile.set_axis_group_tiling(name, t)


def make_side(device: str, p: Preset, tilings: dict[str, Tiling], capture: bool = False, fused: bool = False):
    """One side's training step as a callable returning the loss, the same weights and data on both."""
    model = gpt2(p).to(device)
    ids = torch.randint(0, p.vocab, (p.batch, p.seq), generator=torch.Generator().manual_seed(1)).to(device)
    captured = capture and device == "nntile"
    if device == "nntile":
        tile(model, ids, tilings)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=captured, fused=fused or None)

    def train(ids: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    fn = torch_nntile.capture(train) if captured else train

    def step() -> float:
        return fn(ids).item()  # on nntile this flushes and waits for the loss

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(PRESETS), default="small", help="model preset (default small)")
    ap.add_argument("--steps", type=int, help="timed steps per side, at least 10 (default: the preset's)")
    ap.add_argument("--block", type=int, default=2, help="consecutive steps timed together")
    ap.add_argument("--cpu-fallback", action="store_true", help="run the ops nntile lacks on the CPU")
    for group, extent in (("batch", "8"), ("seq", "64 small, 256 medium"), ("hidden", "128 small, 512 medium"),
                          ("vocab", "1000 small, 8192 medium")):
        ap.add_argument(f"--tile-{group}", help=f"tile size(s) of the {group} axis group (extent {extent}), or none")
    ap.add_argument("--fused", action="store_true", help="AdamW(fused=True) on both sides")
    ap.add_argument("--attn", choices=["eager", "sdpa"], default="eager", help="HF attention implementation")
    ap.add_argument("--seq", type=int, help="sequence length (default: the preset's)")
    ap.add_argument("--dropout", type=float, default=0.0, help="HF's dropout probabilities (default 0: none)")
    add_common_args(ap)
    args = ap.parse_args()
    date, t_start = utc_now(), time.perf_counter()
    preset = dataclasses.replace(PRESETS[args.size], attn=args.attn, seq=args.seq or PRESETS[args.size].seq,
                                 dropout=args.dropout)
    steps = preset.steps if args.steps is None else args.steps
    if steps < 10:
        ap.error("--steps must be at least 10")
    tilings: dict[str, Tiling] = {}
    for group in ("batch", "seq", "hidden", "vocab"):
        given = _tiling(getattr(args, f"tile_{group}"))
        tilings[group] = preset.tilings.get(group) if given is None else None if given == "none" else given

    torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=args.cpu_fallback, scheduler=args.scheduler)
    if args.rss_side is not None:
        rss_side(make_side(args.rss_side, preset, tilings, args.capture, args.fused), args.warmup, args.rss_steps,
                 args.rss_side == "nntile")
        torch_nntile.shutdown_context()
        return
    probe = mm_probe(args.mm_size)  # eager's threads; timed before the steps and between their blocks
    rate = mm_rate(probe)
    cpu_step = make_side("cpu", preset, tilings, fused=args.fused)
    dev_step = make_side("nntile", preset, tilings, args.capture, args.fused)
    for _ in range(args.warmup):
        want, got = cpu_step(), dev_step()
    torch_nntile.wait()
    print(f"loss after warm-up: cpu {want:.6f}, nntile {got:.6f}")
    torch_nntile.reset_info()
    cpu_t, dev_t, rates = alternate(cpu_step, dev_step, steps, args.block, probe)
    tiled = ", ".join(f"{k} {v}" for k, v in tilings.items() if v is not None) or "untiled"
    model = (f"GPT-2 {args.size}: {preset.n_layer} layers, n_embd {preset.n_embd}, {preset.n_head} heads, "
             f"vocab {preset.vocab}, seq {preset.seq}, batch {preset.batch}, AdamW{' (fused)' if args.fused else ''}, "
             f"{preset.attn} attention")
    print(model)
    cpu_med, dev_med, fallbacks, report = print_steps(args, cpu_t, dev_t, tiled)
    rss = peak_rss(sys.argv[0], sys.argv[1:]) if args.rss_steps > 0 else None
    figures = print_figures(step_macs(preset), rates, rate, args.mm_size, cpu_med, dev_med, rss, args.rss_steps)
    if args.json:
        write_result(args.json, "gpt2_step", args, date, time.perf_counter() - t_start, args.block, cpu_t, dev_t,
                     figures, model=model, tiling=tiled, captured=args.capture, report=report,
                     loss_after_warmup={"cpu": want, "nntile": got}, fallback_ops_per_step=fallbacks)
    print(f"ratio nntile/cpu: {dev_med / cpu_med:.2f}")
    torch_nntile.shutdown_context()


if __name__ == "__main__":
    main()
