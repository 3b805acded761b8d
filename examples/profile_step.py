"""Why is a training step slow? Phase times, op and kernel metrics, a task trace,
graph dumps and a progress bar, on the DeepReLU MLP.

    .venv/bin/python examples/profile_step.py [--out DIR]

Writes DIR/step_trace.json (open it in https://ui.perfetto.dev or chrome://tracing),
DIR/step_tensor.dot and DIR/step_tile.dot (render with `dot -Tsvg`).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

import torch_nntile
from torch_nntile.nn.model import DeepReLU


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="profile_out", help="folder for the trace and the graph dumps")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    torch.manual_seed(0)
    model = DeepReLU(784, 1024, 10, depth=5).to("nntile")
    x = torch.randn(1024, 784).to("nntile")
    labels = torch.randint(0, 10, (1024,)).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "batch"})
    torch_nntile.set_axis_group_tiling("batch", 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def step() -> torch.Tensor:
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    step().item()  # warm-up: first-touch allocations
    torch_nntile.wait()  # .item() waits for the loss only; let the rest of the step finish
    torch_nntile.reset_info()
    for _ in range(args.steps):
        loss = step()
        loss.cumsum(0).item()  # cumsum has no nntile kernel: it runs on the CPU fallback
    torch_nntile.wait()

    print(f"== torch_nntile.print_info() after {args.steps} steps")
    torch_nntile.print_info()
    print("\n== torch_nntile.metrics_report()")
    print(torch_nntile.metrics_report())

    trace = os.path.join(args.out, "step_trace.json")
    with torch_nntile.trace(trace):
        step().item()
    print(f"\n== one step traced into {trace}")

    loss = step()  # recorded, not run yet
    print("\n== what the pending step will produce: format_pending_data_sizes()")
    print(torch_nntile.format_pending_data_sizes())
    torch_nntile.dump_graph(os.path.join(args.out, "step_tensor.dot"))
    torch_nntile.dump_graph(os.path.join(args.out, "step_tile.dot"), level="tile")
    print(f"graph dumps written to {args.out}/step_tensor.dot and step_tile.dot")

    print("\n== three steps recorded, then run with a progress bar")
    for _ in range(2):
        loss = step()
    torch_nntile.execute(progress=True)
    torch_nntile.wait()
    print(f"loss after the last step: {loss.item():.6f}")
    torch_nntile.shutdown_context()


if __name__ == "__main__":
    main()
