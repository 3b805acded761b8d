"""Train the bias-free DeepReLU MLP on MNIST on the nntile device, the whole training
set as one batch per epoch (SGD with momentum, cross-entropy), with tilings by name.

    .venv/bin/python examples/train_deep_relu_mnist.py --compare-torch                   # offline digits
    .venv/bin/python examples/train_deep_relu_mnist.py --data-dir DIR --hidden-dim 1024 \\
        --axis-tiling batch=10000 --axis-tiling hidden1=256 --print-axis-groups

Data: the MNIST IDX files in --data-dir (28x28, 784 features), or without it
scikit-learn's bundled 8x8 digits (64 features), split 80/20 by a fixed seed.

Axis groups you can tile with --axis-tiling NAME=SIZES (SIZES: a tile size, "256",
or tile sizes summing to the extent, "600,838"): "batch" and "features" (the dims of
the input), "hidden1" ... "hidden{depth-1}" (the output dim of each hidden layer's
weight) and "classes" (the logits). --compare-torch trains a CPU copy of the same
initial weights alongside and prints both losses each epoch and, at the end, the
largest difference between the two models' weights.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
from _mnist_data import load
from tqdm import tqdm

import torch_nntile
from torch_nntile import training
from torch_nntile.nn.model import DeepReLU


def axis_tiling(text: str) -> tuple[str, int | list[int]]:
    """Parse NAME=SIZES: "batch=256" -> ("batch", 256), "batch=100,200" -> ("batch", [100, 200])."""
    name, sep, sizes = text.partition("=")
    try:
        if not sep or not name.strip():
            raise ValueError
        values = [int(s) for s in sizes.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE or NAME=SIZE,SIZE,..., got {text!r}") from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"tile sizes must be positive, got {text!r}")
    return name.strip(), values[0] if "," not in sizes else values


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", help="folder with the four MNIST IDX files (.gz or not); default: offline digits")
    ap.add_argument("--epochs", type=int, default=50, help="full-batch steps (default 50)")
    ap.add_argument("--depth", type=int, default=4, help="Linear layers, at least 2 (default 4)")
    ap.add_argument("--hidden-dim", type=int, default=256, help="width of the hidden layers (default 256)")
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    ap.add_argument("--ncpu", type=int, default=2, help="StarPU CPU workers (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    ap.add_argument("--axis-tiling", type=axis_tiling, action="append", default=[], metavar="NAME=SIZES",
                    help="tile an axis group (repeatable): batch=256, hidden1=100,156, ...")
    ap.add_argument("--print-axis-groups", action="store_true", help="print the axis groups after the first epoch")
    ap.add_argument("--compare-torch", action="store_true", help="train a CPU reference from the same initial weights")
    ap.add_argument("--info", action="store_true", help="print torch_nntile.print_info() at the end")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (there is none when stderr is not a tty)")
    args = ap.parse_args(argv)
    for name in ("epochs", "hidden_dim", "ncpu"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.depth < 2:
        ap.error("--depth must be at least 2")
    return ap, args


def name_axes(model: DeepReLU, x: torch.Tensor) -> None:
    """Name the axis groups --axis-tiling refers to (see the module docstring)."""
    torch_nntile.set_axis_group_name(x, {0: "batch", 1: "features"})
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    for i, layer in enumerate(linears):
        torch_nntile.set_axis_group_name(layer.weight, {0: "classes" if i == len(linears) - 1 else f"hidden{i + 1}"})


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return (model(x).argmax(dim=1).cpu() == y.cpu()).double().mean().item()


def main(argv: list[str] | None = None) -> int:
    ap, args = parse_args(argv)
    data = load(args.data_dir)
    torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=False)
    torch.manual_seed(args.seed)
    reference = DeepReLU(data.train_x.shape[1], args.hidden_dim, 10, depth=args.depth)
    model = copy.deepcopy(reference).to("nntile")
    x, y = data.train_x.to("nntile"), data.train_y.to("nntile")
    name_axes(model, x)
    for name, sizes in args.axis_tiling:
        try:
            torch_nntile.set_axis_group_tiling(name, sizes)
        except ValueError as e:  # an unknown name, or sizes that do not sum to the extent
            ap.error(f"--axis-tiling {name}: {e}")
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=args.lr, momentum=args.momentum)

    print(data.describe())
    print(f"DeepReLU {x.shape[1]}-{args.hidden_dim}x{args.depth - 1}-10, one batch of {len(data.train_y)}, "
          f"SGD lr {args.lr} momentum {args.momentum}, tilings {dict(args.axis_tiling) or 'none'}")
    bar = tqdm(range(1, args.epochs + 1), desc="epochs", unit="epoch", file=sys.stderr,
               disable=args.no_progress or not sys.stderr.isatty())
    for epoch in bar:
        loss = training.train_full_batch_step(model, x, y, opt, training.cross_entropy)
        line = f"epoch {epoch}: loss nntile {loss:.6f}"
        if args.compare_torch:
            ref = training.train_full_batch_step(reference, data.train_x, data.train_y, ref_opt, training.cross_entropy)
            line += f" cpu {ref:.6f} diff {abs(loss - ref):.2e}"
        bar.set_postfix(loss=f"{loss:.4f}")
        tqdm.write(line)
        if epoch == 1 and args.print_axis_groups:
            torch_nntile.print_axis_groups()
    bar.close()
    if args.compare_torch:
        diff = max((p.detach().cpu() - q.detach()).abs().max().item()
                   for p, q in zip(model.parameters(), reference.parameters()))
        largest = max(q.detach().abs().max().item() for q in reference.parameters())
        print(f"max weight difference: {diff:.3e} (largest weight {largest:.3e})")
        print(f"cpu test accuracy: {accuracy(reference, data.test_x, data.test_y):.4f}")
    print(f"test accuracy: {accuracy(model, data.test_x.to('nntile'), data.test_y):.4f}")
    if args.info or torch_nntile.info()["dry_run"]:
        torch_nntile.print_info()
    torch_nntile.shutdown_context()
    return 0


if __name__ == "__main__":
    sys.exit(main())
