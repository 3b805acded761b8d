"""Train a stock HuggingFace GPT2LMHeadModel on CPU or on nntile, and compare checkpoints.

  train_gpt2_hf.py train --device nntile --output-dir out/nntile   # or --device cpu
  train_gpt2_hf.py compare out/nntile out/cpu

``train`` builds the model from a JSON config (``--config``, default gpt2_tiny.json
beside this script; nothing is downloaded) after ``torch.manual_seed(--seed)``, on CPU,
then moves it to the device: one seed gives both devices the same initial weights.
The tokens are a seeded synthetic stream (each token's successor is fixed by a random
permutation of the vocabulary, so the loss falls quickly towards 0) or, with
``--text FILE``, the file's bytes (vocabulary at least 256). Each epoch visits the same
windows of ``--seq-len`` tokens in an order drawn from (seed, epoch), or in file order
with ``--no-shuffle``; the model computes its loss from ``labels``; AdamW updates it.

After every epoch ``--output-dir`` holds the model (``save_pretrained``), the optimizer
state, the epoch and loss history and the run's settings (``trainer_state.pt``), and
the loss curve (``loss.png``). ``--checkpoint DIR`` resumes such a run up to
``--epochs`` epochs in all, with the settings it saved: the result is the one training
straight through gives.

``compare A B`` prints, per parameter, ``name ||A - B||_F / ||B||_F``, then
``max relative difference: X``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import transformers as hf
from tqdm import tqdm

import torch_nntile

hf.logging.set_verbosity_error()
hf.utils.logging.disable_progress_bar()  # save_pretrained's shard bar; ours is the training loop's

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "gpt2_tiny.json"
STATE_FILE = "trainer_state.pt"
# Settings a checkpoint keeps: a resumed run takes them from it (an explicit different
# value is an error), so that it continues the same run.
RUN_DEFAULTS: dict[str, Any] = {"seed": 0, "seq_len": 32, "batch_size": 8, "steps_per_epoch": None, "lr": 3e-3,
                                "adam_eps": 1e-6, "weight_decay": 0.01, "shuffle": True, "text": None}
SYNTHETIC_STEPS = 20  # steps per epoch of the synthetic stream unless --steps-per-epoch


# -- data -------------------------------------------------------------------------------

def synthetic_windows(n: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """``n`` windows ``[n, seq_len]``: random first tokens, then each token's successor
    given by one seeded permutation of the vocabulary (a bigram the model learns fast)."""
    g = torch.Generator().manual_seed(seed)
    successor = torch.randperm(vocab, generator=g)
    ids = torch.empty(n, seq_len, dtype=torch.long)
    ids[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for i in range(1, seq_len):
        ids[:, i] = successor[ids[:, i - 1]]
    return ids


def text_windows(path: str, seq_len: int) -> torch.Tensor:
    """The file's bytes as tokens, cut into consecutive windows of ``seq_len``."""
    data = Path(path).read_bytes()
    n = len(data) // seq_len
    return torch.frombuffer(bytearray(data[:n * seq_len]), dtype=torch.uint8).long().view(n, seq_len)


def epoch_batches(windows: torch.Tensor, batch_size: int, steps: int, epoch: int, seed: int,
                  shuffle: bool) -> Iterator[torch.Tensor]:
    """The batches of one epoch; their order depends only on (seed, epoch), so a resumed
    run draws what a straight one would."""
    if shuffle:
        order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch + 1))
    else:
        order = torch.arange(len(windows))
    for s in range(steps):
        yield windows[order[s * batch_size:(s + 1) * batch_size]]


def make_data(run: dict[str, Any], vocab: int) -> tuple[torch.Tensor, int]:
    """(windows, steps per epoch) for the run's settings."""
    b, steps = run["batch_size"], run["steps_per_epoch"]
    if run["text"] is None:
        steps = steps or SYNTHETIC_STEPS
        return synthetic_windows(steps * b, run["seq_len"], vocab, run["seed"]), steps
    if vocab < 256:
        raise SystemExit(f"--text needs a vocabulary of at least 256 (byte tokens); the config has {vocab}")
    windows = text_windows(run["text"], run["seq_len"])
    steps = steps or len(windows) // b
    if steps < 1 or steps * b > len(windows):
        raise SystemExit(f"{run['text']}: {len(windows)} windows of {run['seq_len']} bytes, too few for "
                         f"{max(steps, 1)} steps of batch {b}")
    return windows, steps


# -- model, tiling, checkpoints -----------------------------------------------------------

def _tiling(text: str | None) -> int | list[int] | None:
    if text is None:
        return None
    sizes = [int(s) for s in text.split(",")]
    return sizes[0] if len(sizes) == 1 else sizes


def name_axes(model: torch.nn.Module) -> None:
    """Name the ``batch`` and ``seq`` axis groups of the hidden states on nntile: the
    embedding gathers rows by the flattened ids, so names on the ids do not reach its
    output; a forward hook names that too."""
    model.get_input_embeddings().register_forward_hook(
        lambda mod, args, out: torch_nntile.set_axis_group_name(out, {0: "batch", 1: "seq"}))


def name_batch(ids: torch.Tensor, tilings: dict[str, int | list[int] | None]) -> None:
    """Name the axis groups of a batch on nntile and tile those given a tiling (a group
    must be live to take one; the tiling then holds for every later group of that name)."""
    torch_nntile.set_axis_group_name(ids, {0: "batch", 1: "seq"})
    for name, t in tilings.items():
        if t is not None:
            torch_nntile.set_axis_group_tiling(name, t)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def save_checkpoint(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """The model by ``save_pretrained`` (from nntile it writes CPU's files), the rest by
    ``torch.save`` with every tensor on CPU, and the loss curve."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    torch.save({**state, "optimizer": _to_cpu(opt.state_dict()), "rng": torch.get_rng_state()}, out / STATE_FILE)
    plot_losses(out / "loss.png", state["history"], state["device"])


def plot_losses(path: Path, history: list[list[float]], device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    losses = [x for epoch in history for x in epoch]
    ax.plot(range(1, len(losses) + 1), losses, lw=1, label="step")
    ends = [0, *itertools.accumulate(len(e) for e in history)]
    mids = [(a + b + 1) / 2 for a, b in zip(ends, ends[1:])]
    ax.plot(mids, [sum(e) / len(e) for e in history], "o-", label="epoch mean")
    ax.set(xlabel="step", ylabel="loss", title=f"GPT-2 training loss ({device})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- commands -------------------------------------------------------------------------

def _run_settings(args: argparse.Namespace, saved: dict[str, Any] | None) -> dict[str, Any]:
    given = {k: getattr(args, k, None) for k in RUN_DEFAULTS}
    given["shuffle"] = False if args.no_shuffle else None
    if given["text"] is not None:
        given["text"] = str(Path(given["text"]).resolve())  # a resume may start elsewhere
    if saved is None:
        return {k: RUN_DEFAULTS[k] if v is None else v for k, v in given.items()}
    for k, v in given.items():
        if v is not None and v != saved[k]:
            raise SystemExit(f"--{k.replace('_', '-')} {v} differs from the checkpoint's {saved[k]}: "
                             "a resumed run keeps its settings")
    return dict(saved)


def setup(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, Any],
                                              list[list[float]]]:
    """(model on the device, its AdamW, the run's settings, the loss history): new from
    the config, or as ``--checkpoint`` left them."""
    saved = None
    if args.checkpoint:
        if args.config:
            raise SystemExit("--config with --checkpoint: the checkpoint holds its config")
        saved = torch.load(Path(args.checkpoint) / STATE_FILE, weights_only=True)
    run = _run_settings(args, saved and saved["run"])
    torch.manual_seed(run["seed"])
    if saved:
        model = hf.GPT2LMHeadModel.from_pretrained(args.checkpoint, attn_implementation=args.attn or saved["attn"])
        torch.set_rng_state(saved["rng"])  # dropout, if the config has any, goes on as it would have
    else:
        config = hf.GPT2Config.from_json_file(args.config or DEFAULT_CONFIG)
        if args.attn:
            config._attn_implementation = args.attn
        model = hf.GPT2LMHeadModel(config)  # built on CPU: the same weights for every device
    if run["seq_len"] > model.config.n_positions:
        raise SystemExit(f"--seq-len {run['seq_len']} exceeds the model's {model.config.n_positions} positions")
    if args.device == "nntile":
        torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=args.cpu_fallback)
        model = model.to("nntile")
        name_axes(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=run["lr"], eps=run["adam_eps"], weight_decay=run["weight_decay"])
    if saved:
        opt.load_state_dict(saved["optimizer"])  # moves the moments to the parameters' device
    return model, opt, run, saved["history"] if saved else []


def train(args: argparse.Namespace) -> None:
    model, opt, run, history = setup(args)
    cfg, attn, on_nntile = model.config, model.config._attn_implementation, args.device == "nntile"
    windows, steps = make_data(run, cfg.vocab_size)
    tilings = {"batch": _tiling(args.tile_batch), "seq": _tiling(args.tile_seq)}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT-2 {cfg.n_layer} layers x {cfg.n_embd} dims, vocabulary {cfg.vocab_size}, {n_params} parameters, "
          f"{attn} attention, on {args.device}; {'text ' + run['text'] if run['text'] else 'synthetic tokens'}, "
          f"{steps} steps of {run['batch_size']} x {run['seq_len']} tokens per epoch, AdamW lr {run['lr']}")
    if len(history) >= args.epochs:
        raise SystemExit(f"nothing to train: {len(history)} epochs done, --epochs {args.epochs}")
    out = Path(args.output_dir)
    for epoch in range(len(history), args.epochs):
        t0 = time.perf_counter()
        losses: list[float] = []
        bar = tqdm(epoch_batches(windows, run["batch_size"], steps, epoch, run["seed"], run["shuffle"]), total=steps,
                   desc=f"epoch {epoch + 1}/{args.epochs}", leave=False, disable=None)
        for ids in bar:
            ids = ids.to(args.device)
            if on_nntile:
                name_batch(ids, tilings)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())  # on nntile this flushes the step and waits for its loss
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if on_nntile:
            torch_nntile.wait()
        history.append(losses)
        print(f"epoch {epoch + 1}/{args.epochs}: mean loss {sum(losses) / steps:.6f}, last {losses[-1]:.6f} "
              f"({time.perf_counter() - t0:.1f} s)")
        save_checkpoint(out, model, opt, {"epoch": epoch + 1, "history": history, "run": run, "attn": attn,
                                          "device": args.device})
    if on_nntile and torch_nntile.fallback_counts():
        print(f"CPU fallback ops: {dict(sorted(torch_nntile.fallback_counts().items()))}")
    print(f"checkpoint: {out} (model.safetensors, config.json, {STATE_FILE}, loss.png)")


def _parameters(path: str) -> dict[str, torch.Tensor]:
    model = hf.GPT2LMHeadModel.from_pretrained(path)
    return {k: p.detach() for k, p in model.named_parameters()}  # tied weights once


def compare(args: argparse.Namespace) -> None:
    a, b = _parameters(args.a), _parameters(args.b)
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        raise SystemExit(f"{args.a} and {args.b} hold different parameters")
    worst = 0.0
    for name in a:
        x, y = a[name].double(), b[name].double()
        diff, ref = (x - y).norm().item(), y.norm().item()
        rel = diff / ref if ref > 0 else (0.0 if diff == 0 else math.inf)
        worst = max(worst, rel)
        print(f"{name} {rel:.3e}")
    print(f"max relative difference: {worst:.3e}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train (or resume) and checkpoint every epoch")
    t.add_argument("--config", help=f"GPT2Config JSON (default {DEFAULT_CONFIG.name} beside this script)")
    t.add_argument("--device", choices=["cpu", "nntile"], default="cpu", help="default cpu")
    t.add_argument("--output-dir", required=True, help="checkpoint folder, rewritten after every epoch")
    t.add_argument("--checkpoint", help="resume the run saved in this folder (may be --output-dir)")
    t.add_argument("--epochs", type=int, default=3, help="epochs in all, those of --checkpoint included (default 3)")
    d = RUN_DEFAULTS
    t.add_argument("--seed", type=int, help=f"initial weights and data (default {d['seed']})")
    t.add_argument("--text", help="train on this file's bytes instead of synthetic tokens")
    t.add_argument("--seq-len", type=int, help=f"tokens per window (default {d['seq_len']})")
    t.add_argument("--batch-size", type=int, help=f"windows per step (default {d['batch_size']})")
    t.add_argument("--steps-per-epoch", type=int,
                   help=f"default {SYNTHETIC_STEPS} on synthetic tokens, all whole batches of --text")
    t.add_argument("--no-shuffle", action="store_true", help="visit the windows in order every epoch")
    t.add_argument("--lr", type=float, help=f"AdamW learning rate (default {d['lr']})")
    t.add_argument("--adam-eps", type=float,
                   help=f"AdamW eps (default {d['adam_eps']}, as BERT's; with torch's 1e-8 the key biases, whose "
                        "gradient is zero in exact arithmetic, move by rounding noise / eps and devices drift apart)")
    t.add_argument("--weight-decay", type=float, help=f"AdamW weight decay (default {d['weight_decay']})")
    t.add_argument("--attn", choices=["eager", "sdpa"], help="attention implementation (default: the config's)")
    t.add_argument("--ncpu", type=int, default=2, help="StarPU CPU workers (nntile; default 2)")
    t.add_argument("--cpu-fallback", action="store_true", help="run ATen ops nntile lacks on the CPU (nntile)")
    t.add_argument("--tile-batch", help="tile size(s) of the batch axis group, e.g. 4 or 3,5 (nntile)")
    t.add_argument("--tile-seq", help="tile size(s) of the sequence axis group (nntile)")
    t.set_defaults(fn=train)
    c = sub.add_parser("compare", help="relative Frobenius norm of each parameter's difference")
    c.add_argument("a", help="checkpoint folder")
    c.add_argument("b", help="reference checkpoint folder (the norms are relative to its weights)")
    c.set_defaults(fn=compare)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
