"""Tiles of values that die inside a compile are reused by the values lowered after
them (``Lowering``): results stay CPU's, held values and views are never overwritten,
and a chain of products needs a few tiles, not one per product."""

from __future__ import annotations

import copy
import threading

import torch
from conftest import assert_close

import torch_nntile
from torch_nntile.session import SESSION_STATE
from torch_nntile.tiling.tiles import REUSE_DISTANCE, W


def _chain(x: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        x = torch.tanh(x @ w)  # a product and an activation: not fused into one op
    return x


def test_chain_reuses_tiles_and_matches_cpu():
    torch.manual_seed(0)
    x, w = torch.randn(16, 16), torch.randn(16, 16) / 4
    want = _chain(x, w, 30)
    xd, wd = x.to("nntile"), w.to("nntile")
    torch_nntile.execute()
    torch_nntile.wait()
    torch_nntile.reset_info()
    live = torch_nntile.info()["tiles_live"]
    got = _chain(xd, wd, 30)
    torch_nntile.compile_graph()
    peak = torch_nntile.info()["tiles_peak"]
    assert_close(got.cpu(), want)
    assert peak - live <= 6, f"{peak - live} tiles for a chain of 60 values: dead values' tiles were not reused"


def test_tiled_chain_matches_cpu():
    torch.manual_seed(1)
    x, w = torch.randn(10, 12), torch.randn(12, 12) / 4
    want = _chain(x, w, 12)
    xd = x.to("nntile")
    torch_nntile.set_axis_group_name(xd, {0: "rows", 1: "cols"})
    torch_nntile.set_axis_group_tiling("rows", [3, 7])
    torch_nntile.set_axis_group_tiling("cols", [5, 7])
    assert_close(_chain(xd, w.to("nntile"), 12).cpu(), want)


def test_held_values_and_views_keep_their_tiles():
    torch.manual_seed(2)
    x, w = torch.randn(8, 8), torch.randn(8, 8) / 3
    xd, wd = x.to("nntile"), w.to("nntile")
    held = torch.relu(xd @ wd)  # the user holds it: never given away
    view = torch.sin(xd @ wd).reshape(4, 16)  # a view of a value nothing else holds
    later = _chain(xd, wd, 10)  # values of the same size, lowered after both
    assert_close(held.cpu(), torch.relu(x @ w))
    assert_close(view.cpu(), torch.sin(x @ w).reshape(4, 16))
    assert_close(later.cpu(), _chain(x, w, 10))


def test_training_steps_with_reuse_match_cpu():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 5))

    dev = copy.deepcopy(model).to("nntile")
    opt, dopt = torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(dev.parameters(), lr=1e-2)
    x, y = torch.randn(9, 12), torch.randint(0, 5, (9,))
    xd, yd = x.to("nntile"), y.to("nntile")
    torch_nntile.set_axis_group_name(xd, {0: "batch"})
    torch_nntile.set_axis_group_tiling("batch", [4, 5])
    for _ in range(4):
        for m, o, a, b in ((model, opt, x, y), (dev, dopt, xd, yd)):
            loss = torch.nn.functional.cross_entropy(m(a), b)
            loss.backward()
            o.step()
            o.zero_grad(set_to_none=True)
    for p, q in zip(dev.parameters(), model.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-5)


class _CountTrims:
    """The runtime's C library, counting the main thread's ``tnt_trim`` calls (the
    pauser's, when the workers go idle, are not counted)."""

    def __init__(self, lib) -> None:
        self._lib, self.trims = lib, 0

    def tnt_trim(self) -> None:
        self.trims += threading.current_thread() is threading.main_thread()
        self._lib.tnt_trim()

    def __getattr__(self, name):
        return getattr(self._lib, name)


def test_heap_trimmed_while_the_workers_never_go_idle(monkeypatch):
    """A training loop that never waits keeps the workers busy, so the pauser never
    trims malloc's free pages: compiles do it too, at most every TRIM_S (else the
    medium GPT-2 grew by 50-100 MiB a step, to 3.3 GiB after 12 steps, against 1.9)."""
    from torch_nntile.runtime import memory
    from torch_nntile.session import SESSION_STATE

    rt = SESSION_STATE.runtime()
    counted = _CountTrims(rt.lib)
    monkeypatch.setattr(rt, "lib", counted)
    monkeypatch.setattr(memory, "TRIM_S", 0.0)
    x = torch.randn(32, 32).to("nntile")
    for _ in range(3):
        x = torch.tanh(x @ x) * 0.5
        torch_nntile.execute()  # a compile, no wait
    assert counted.trims >= 3
    assert_close(x.cpu().isfinite().all(), torch.tensor(True))


def test_a_freed_tile_waits_reuse_distance_tasks():
    """A dead value's handle goes to a new value only REUSE_DISTANCE tasks after its
    last reader: the new value's first write does not wait on work just queued, so
    independent branches stay parallel. Reuse still happens, and values are CPU's."""
    torch.manual_seed(2)
    x, w = torch.randn(16, 16), torch.randn(16, 16) / 4
    xd, wd = x.to("nntile"), w.to("nntile")
    torch_nntile.execute()
    got = _chain(xd, wd, 30)
    torch_nntile.compile_graph()
    last: dict[object, int] = {}  # handle -> index of the last task using it
    gaps = []
    for i, (_, handles, modes, _, _) in enumerate(SESSION_STATE.compiled.tasks):
        for h, mode in zip(handles, modes):
            if mode == W and h in last:  # a new value in a handle used before in this compile
                gaps.append(i - last[h])
            last[h] = i
    torch_nntile.run()
    assert gaps, "no tile was reused"
    assert min(gaps) > REUSE_DISTANCE, gaps
    assert_close(got.cpu(), _chain(x, w, 30))
