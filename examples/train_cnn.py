"""Train a plain convolutional network on scikit-learn's bundled 8x8 digits on the nntile
device, the batch tiled: two 3x3 convolutions, each with batch norm, ReLU and 2x2 max
pooling (8x8 -> 4x4 -> 2x2), then a linear layer to the 10 classes; cross-entropy, SGD
with momentum, mini-batches drawn from a seeded permutation of the training set.

    .venv/bin/python examples/train_cnn.py --compare-torch
    .venv/bin/python examples/train_cnn.py --steps 400 --batch-size 64 --batch-tile 16 --print-axis-groups

Data: the 1797 digits (1 channel, values scaled to [0, 1]), no download, split 80/20 by
a fixed seed (--seed draws the weights and the batch order). Each batch's first dim is
named "batch" and tiled by --batch-tile: the convolutions and pooling run once per
batch tile, batch norm's statistics are reductions over the tiles; nothing runs on the
host fallback (init_context(cpu_fallback=False)), and the script prints the fallback
counts, empty, at the end. --compare-torch trains a CPU copy of the same initial
weights on the same batches alongside, prints both losses at each logged step and, at
the end, the largest difference between the two models' weights and batch norm
statistics. The last line is `test accuracy: 0.XXXX` (batch norm in eval mode).
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Iterator

import torch
from _mnist_data import Dataset, load_digits
from torch import nn
from tqdm import tqdm

import torch_nntile
from torch_nntile import training

SIDE = 8  # the digits are 8x8


def build_model(channels: int) -> nn.Sequential:
    """conv(1 -> c) -> BN -> ReLU -> pool, conv(c -> 2c) -> BN -> ReLU -> pool, linear(2c * 2 * 2 -> 10)."""
    c = channels
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * c * (SIDE // 4) ** 2, 10),
    )


def batches(n: int, size: int, seed: int) -> Iterator[torch.Tensor]:
    """Index batches over seeded permutations of ``n`` samples, a new one per epoch
    (the same sequence for both models); the last partial batch of an epoch is dropped."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n, generator=gen)
        for start in range(0, n - size + 1, size):
            yield order[start:start + size]


def images(x: torch.Tensor) -> torch.Tensor:
    """Flattened digits [N, 64] -> images [N, 1, 8, 8]."""
    return x.reshape(-1, 1, SIDE, SIDE)


def to_nntile(x: torch.Tensor) -> torch.Tensor:
    """``x`` on nntile with its first dim in the "batch" axis group."""
    d = x.to("nntile")
    torch_nntile.set_axis_group_name(d, {0: "batch"})
    return d


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()  # batch norm with its running statistics
    try:
        return (model(x).argmax(dim=1).cpu() == y).double().mean().item()
    finally:
        model.train()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    ap.add_argument("--batch-size", type=int, default=128, help="samples per step (default 128)")
    ap.add_argument("--batch-tile", type=int, default=32, help="tile size of the batch on nntile (default 32)")
    ap.add_argument("--channels", type=int, default=16, help="channels of the first convolution (default 16)")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    ap.add_argument("--ncpu", type=int, default=2, help="StarPU CPU workers (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the batch order")
    ap.add_argument("--log-every", type=int, default=20, metavar="N", help="print the loss every N steps (0: never)")
    ap.add_argument("--print-axis-groups", action="store_true", help="print the axis groups after the first step")
    ap.add_argument("--compare-torch", action="store_true", help="train a CPU reference from the same initial weights")
    ap.add_argument("--info", action="store_true", help="print torch_nntile.print_info() at the end")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (there is none when stderr is not a tty)")
    args = ap.parse_args(argv)
    for name in ("steps", "batch_size", "batch_tile", "channels", "ncpu"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.log_every < 0:
        ap.error("--log-every must not be negative")
    return args


def max_difference(model: nn.Module, reference: nn.Module) -> tuple[float, float]:
    """The largest difference between the two models' parameters and floating-point
    buffers (batch norm's running statistics), and the largest of the reference's values."""
    pairs = list(zip(model.parameters(), reference.parameters()))
    pairs += [(b, r) for b, r in zip(model.buffers(), reference.buffers()) if r.is_floating_point()]
    diff = max((p.detach().cpu() - q.detach()).abs().max().item() for p, q in pairs)
    largest = max(q.detach().abs().max().item() for _, q in pairs)
    return diff, largest


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data: Dataset = load_digits(side=SIDE)
    if len(data.train_y) < args.batch_size:
        raise SystemExit(f"--batch-size {args.batch_size} exceeds the {len(data.train_y)} training samples")
    train_x, test_x = images(data.train_x), images(data.test_x)
    torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=False)
    torch.manual_seed(args.seed)
    reference = build_model(args.channels)
    model = copy.deepcopy(reference).to("nntile")
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=args.lr, momentum=args.momentum)

    print(data.describe())
    c = args.channels
    print(f"CNN 1x{SIDE}x{SIDE} conv{c}-bn-relu-pool conv{2 * c}-bn-relu-pool linear-10, batch {args.batch_size} "
          f"tiled by {args.batch_tile}, SGD lr {args.lr} momentum {args.momentum}, {args.steps} steps")
    batch = batches(len(data.train_y), args.batch_size, args.seed)
    bar = tqdm(range(1, args.steps + 1), desc="steps", unit="step", file=sys.stderr,
               disable=args.no_progress or not sys.stderr.isatty())
    for step in bar:
        idx = next(batch)
        x, y = to_nntile(train_x[idx]), data.train_y[idx].to("nntile")
        if step == 1:
            torch_nntile.set_axis_group_tiling("batch", args.batch_tile)
        loss = training.train_full_batch_step(model, x, y, opt, training.cross_entropy)
        line = f"step {step}: loss nntile {loss:.6f}"
        if args.compare_torch:
            ref = training.train_full_batch_step(reference, train_x[idx], data.train_y[idx], ref_opt,
                                                 training.cross_entropy)
            line += f" cpu {ref:.6f} diff {abs(loss - ref):.2e}"
        if args.log_every and step % args.log_every == 0:
            bar.set_postfix(loss=f"{loss:.4f}")
            tqdm.write(line)
        if step == 1 and args.print_axis_groups:
            torch_nntile.print_axis_groups()
    bar.close()
    if args.compare_torch:
        diff, largest = max_difference(model, reference)
        print(f"max weight difference: {diff:.3e} (largest weight {largest:.3e})")
        print(f"cpu test accuracy: {accuracy(reference, test_x, data.test_y):.4f}")
    acc = accuracy(model, to_nntile(test_x), data.test_y)
    print(f"host fallbacks: {torch_nntile.fallback_counts() or 'none'}")
    if args.info or torch_nntile.info()["dry_run"]:
        torch_nntile.print_info()
    torch_nntile.shutdown_context()
    print(f"test accuracy: {acc:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
