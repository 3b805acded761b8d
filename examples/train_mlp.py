"""Train the bias-free ReLU MLP on nntile (StarPU, tiled batch) and on CPU side by side."""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

import torch_nntile
from torch_nntile.nn.model import DeepReLU


def main(steps: int = 10, batch: int = 1024, tile: int = 256) -> None:
    torch_nntile.init_context(ncpu=2, ncuda=0, cpu_fallback=False)
    torch.manual_seed(0)
    cpu_model = DeepReLU(784, 1024, 10, depth=5)
    model = copy.deepcopy(cpu_model).to("nntile")
    x = torch.randn(batch, 784)
    labels = torch.randint(0, 10, (batch,))
    xn, ln = x.to("nntile"), labels.to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "batch", 1: "features"})
    torch_nntile.set_axis_group_tiling("batch", tile)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.05)

    print(f"DeepReLU 784-1024x4-10, batch {batch} tiled by {tile}, SGD lr 0.05, cross-entropy")
    print(f"{'step':>4} {'loss nntile':>12} {'loss cpu':>12} {'abs diff':>10} {'nntile s':>9} {'cpu s':>7}")
    for step in range(steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(xn), ln)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.cpu().item()  # .cpu() flushes (compile, run on StarPU) and waits for the loss
        torch_nntile.wait()  # the rest of the step (backward, update) ran on meanwhile: time it all
        t1 = time.perf_counter()
        cpu_loss = F.cross_entropy(cpu_model(x), labels)
        cpu_loss.backward()
        cpu_opt.step()
        cpu_opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        print(f"{step:>4} {value:>12.6f} {cpu_loss.item():>12.6f} {abs(value - cpu_loss.item()):>10.2e} "
              f"{t1 - t0:>9.3f} {t2 - t1:>7.3f}")
    print()
    torch_nntile.print_axis_groups()
    torch_nntile.shutdown_context()


if __name__ == "__main__":
    main()
