"""One training step of a small ResNet (convolutions, batch norm, ReLU, max pooling,
residual additions, global average pooling, a linear head; cross-entropy, SGD with
momentum) on a batch of 64 random 3x64x64 images: nntile on StarPU and CPU eager, timed
side by side in one process.

The model (``--width`` w, 16 by default): a stem (3x3 convolution 3 -> w, batch norm,
ReLU, 2x2 max pooling: 64x64 -> 32x32), three basic residual blocks (two 3x3
convolutions with batch norm, ReLU after the first and after the sum) of w, 2w and 4w
channels at 32x32, 16x16 and 8x8 (the last two halve the size by a stride of 2 and
bring the shortcut to their shape by a strided 1x1 convolution with batch norm), then
global average pooling and a linear layer 4w -> ``--classes`` (10). Convolutions have no
bias (batch norm follows each). ``torch.optim.SGD`` with learning rate 0.01 and momentum
0.9.

On nntile the batch is named ``batch`` and tiled by ``--tile`` (16: four tiles). The
convolutions and pooling run PyTorch's CPU kernel once per batch tile (their weight
gradients summed over the tiles), batch norm's statistics are combined over the batch
tiles, and the ops around them (ReLU, the additions, the linear layer, the loss, the
update) run tiled. With ``--cpu-fallback`` ops nntile cannot record run on the CPU
instead of failing, and the benchmark prints how many did so per step.

As in ``mlp_step.py``: ``loss.item()`` on nntile returns once the loss is known while
the step's backward and update go on, so steps are timed in blocks of ``--block``
consecutive steps, the nntile block ending with ``torch_nntile.wait()``; blocks of the
two sides alternate (which side goes first swaps every block) so that machine noise
hits both alike. Prints the losses after warm-up, the median step time of each side
(warm-up excluded), the arithmetic floor (``floor ms``, ``nntile/floor``), each side's
peak resident memory (``peak rss MiB``, each side in its own process: see
``_common.py``) and, last, ``ratio nntile/cpu``; ``--json PATH`` also writes all of it,
with every block's time, the options and the machine, as one JSON object.

Multiply-adds of a step, from the model's shapes (the output size of every layer from a
forward on the meta device): a convolution with output ``[b, C_out, H, W]`` and kernel
``k x k`` over ``C_in`` channels costs ``b * H * W * C_out * C_in * k * k`` forward, a
linear layer ``b * in * out``. The backward computes two products the size of each
forward one (the input's gradient and the weight's) except the stem's input gradient,
which autograd skips (the images need no gradient): a step is ``3 * fwd - stem``. The
floor prices them at the rate of ``torch.mm``, like the other benchmarks' floors; eager
convolutions (im2col and products, or oneDNN) run below that rate, so ``cpu/floor``
sits further above 1 than for the MLP.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F
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
from torch import nn

import torch_nntile


class Block(nn.Module):
    """A basic residual block: two 3x3 convolutions with batch norm; a strided 1x1
    convolution with batch norm on the shortcut where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet(width: int, classes: int) -> nn.Sequential:
    """The model of the module docstring, its weights drawn from seed 0."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        Block(width, width, 1), Block(width, 2 * width, 2), Block(2 * width, 4 * width, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, classes),
    )


def step_macs(model: nn.Module, batch: int, image: int) -> int:
    """Multiply-adds of one training step (the formula in the module docstring)."""
    meta = copy.deepcopy(model).to("meta")
    costs: list[int] = []  # forward multiply-adds of each conv and linear, in call order

    def hook(mod: nn.Module, args: tuple, out: torch.Tensor) -> None:
        if isinstance(mod, nn.Conv2d):
            kh, kw = mod.kernel_size
            costs.append(out.numel() * mod.in_channels // mod.groups * kh * kw)
        else:
            costs.append(out.numel() * mod.in_features)

    for mod in meta.modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            mod.register_forward_hook(hook)
    with torch.no_grad():
        meta(torch.empty(batch, 3, image, image, device="meta"))
    return 3 * sum(costs) - costs[0]


def make_side(device: str, args: argparse.Namespace):
    """Model and one step's callable of one side, the same weights and data on both."""
    model = resnet(args.width, args.classes).to(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 3, args.image, args.image, generator=gen).to(device)
    y = torch.randint(0, args.classes, (args.batch,), generator=gen).to(device)
    if device == "nntile":
        torch_nntile.set_axis_group_name(x, {0: "batch"})
        torch_nntile.set_axis_group_tiling("batch", args.tile)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, classifier_step(model, opt, x, y, args.capture and device == "nntile")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per side (a step takes about a second)")
    ap.add_argument("--block", type=int, default=2, help="consecutive steps timed together")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=64, help="height and width of the images, a multiple of 8")
    ap.add_argument("--width", type=int, default=16, help="channels of the stem and the first block")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--tile", type=int, default=16, help="batch tile size on nntile")
    ap.add_argument("--cpu-fallback", action="store_true", help="run the ops nntile cannot record on the CPU")
    add_common_args(ap)
    args = ap.parse_args()
    for name in ("steps", "block", "warmup", "batch", "width", "classes", "tile", "ncpu"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if args.image < 8 or args.image % 8:
        ap.error("--image must be a positive multiple of 8")
    date, t_start = utc_now(), time.perf_counter()

    torch_nntile.init_context(ncpu=args.ncpu, cpu_fallback=args.cpu_fallback, scheduler=args.scheduler)
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
        want, got = cpu_step(), dev_step()
    torch_nntile.wait()
    print(f"loss after warm-up: cpu {want:.6f}, nntile {got:.6f}")
    torch_nntile.reset_info()
    cpu_t, dev_t, rates = alternate(cpu_step, dev_step, args.steps, args.block, probe)
    model = (f"ResNet width {args.width}, 3 blocks, batch {args.batch} of 3x{args.image}x{args.image}, "
             f"{args.classes} classes, SGD momentum 0.9")
    print(model)
    cpu_med, dev_med, fallbacks, report = print_steps(args, cpu_t, dev_t, f"batch tile {args.tile}")
    rss = peak_rss(sys.argv[0], sys.argv[1:]) if args.rss_steps > 0 else None
    figures = print_figures(step_macs(cpu_model, args.batch, args.image), rates, rate, args.mm_size, cpu_med, dev_med,
                            rss, args.rss_steps)
    if args.json:
        write_result(args.json, "cnn_step", args, date, time.perf_counter() - t_start, args.block, cpu_t, dev_t,
                     figures, model=model, tiling=f"batch {args.tile}", captured=args.capture, report=report,
                     loss_after_warmup={"cpu": want, "nntile": got}, fallback_ops_per_step=fallbacks)
    print(f"ratio nntile/cpu: {dev_med / cpu_med:.2f}")
    torch_nntile.shutdown_context()


if __name__ == "__main__":
    main()
