"""Elementwise chains whose intermediate results nothing holds run as one task per
tile (the intermediates never become tiles); results are CPU's."""

from __future__ import annotations

import torch
from conftest import assert_close

import torch_nntile


def _tasks() -> dict[str, int]:
    torch_nntile.wait()
    return {k: v["tasks"] for k, v in torch_nntile.metrics()["kernels"].items()}


def _tiled(x: torch.Tensor, name: str, tiling) -> torch.Tensor:
    xn = x.to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: name})
    torch_nntile.set_axis_group_tiling(name, tiling)
    torch_nntile.execute()
    torch_nntile.wait()
    return xn


def test_a_chain_is_one_task_per_tile():
    x, row = torch.randn(10, 6), torch.randn(6)
    xn, rn = _tiled(x, "rows_fc", [4, 6]), row.to("nntile")
    torch_nntile.reset_info()
    y = torch.where((xn * 2 + rn).exp() > 1.5, xn - rn, (-xn).sigmoid())  # bool and float steps, broadcast row
    want = torch.where((x * 2 + row).exp() > 1.5, x - row, (-x).sigmoid())
    assert_close(y.cpu(), want)
    tasks = _tasks()
    fused = [k for k in tasks if "+" in k]
    assert len(fused) == 1 and tasks[fused[0]] == 2, tasks  # one task per row tile
    assert set(fused[0].split("+")) == {"mul", "add", "exp", "gt", "sub", "neg", "sigmoid", "where"}


def test_held_and_shared_results_are_not_folded():
    """A result some tensor holds, or that two ops read, is computed once as tiles."""
    x = torch.randn(8, 4)
    xn = _tiled(x, "rows_fh", 4)
    torch_nntile.reset_info()
    held = xn * 3
    shared = xn + 1
    a, b = (held + shared).relu(), shared * shared.exp()
    assert_close(a.cpu(), ((x * 3) + (x + 1)).relu())
    assert_close(b.cpu(), (x + 1) * (x + 1).exp())
    assert_close(held.cpu(), x * 3)
    tasks = _tasks()
    assert tasks["mul"] == 2 and tasks["add"] == 2, tasks  # held, shared: their own tasks
    assert tasks["add+relu"] == 2 and tasks["exp+mul"] == 2, tasks


def test_fused_gradients_and_optimizer_step_match_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    ref = torch.nn.Linear(6, 5)
    ref.load_state_dict(lin.state_dict())
    lin = lin.to("nntile")
    x = torch.randn(12, 6)
    xn = _tiled(x, "rows_fo", [5, 7])
    opt, ref_opt = torch.optim.AdamW(lin.parameters(), lr=0.1), torch.optim.AdamW(ref.parameters(), lr=0.1)
    torch_nntile.reset_info()
    for _ in range(3):
        for model, inp, o in ((lin, xn, opt), (ref, x, ref_opt)):
            loss = torch.nn.functional.gelu(model(inp)).pow(2).mean()
            loss.backward()
            o.step()
            o.zero_grad(set_to_none=True)
    for p, q in zip(lin.parameters(), ref.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-5)
    assert any("addcdiv" in k and "+" in k for k in _tasks())  # the update runs fused
