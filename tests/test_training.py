"""DeepReLU trained with SGD on nntile matches CPU PyTorch step by step."""

from __future__ import annotations

import copy
import gc
import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err

import torch_nntile
from torch_nntile.graph.nodes import SESSION, DataNode
from torch_nntile.nn.model import DeepReLU
from torch_nntile.runtime.memory import SPARE_COMPILES
from torch_nntile.session import SESSION_STATE, THREAD_FLUSH_OPS


def _train(tiling, loss_kind: str, steps: int = 20):
    torch.manual_seed(1)
    model = DeepReLU(64, 128, 10, depth=5)
    ref = copy.deepcopy(model)
    model = model.to("nntile")
    x = torch.randn(96, 64)
    y = torch.randint(0, 10, (96,))
    xn, yn = x.to("nntile"), y.to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "batch"})
    if tiling is not None:
        torch_nntile.set_axis_group_tiling("batch", tiling)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)

    def loss_fn(out, target):
        return F.cross_entropy(out, target) if loss_kind == "ce" else (out ** 2).mean()

    losses = []
    for _ in range(steps):
        loss = loss_fn(model(xn), yn)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ref_loss = loss_fn(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        losses.append((loss.item(), ref_loss.item()))
    return model, ref, losses


@pytest.mark.parametrize("tiling", [None, 32, [40, 30, 26]], ids=["untiled", "even", "uneven"])
@pytest.mark.parametrize("loss_kind", ["ce", "mse"])
def test_deeprelu_sgd_matches_cpu(tiling, loss_kind):
    model, ref, losses = _train(tiling, loss_kind)
    for got, want in losses:
        assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), (got, want)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert rel_err(p.detach().cpu(), q.detach()) <= 1e-4


def _finished(loss: torch.Tensor) -> float:
    """``loss.item()``, then wait for the rest of the step. A kernel closure holds its
    inputs until its task has run, and the tail of a step runs after ``item()``
    returns: only once it is done are the nodes and tiles that die with it dead, so
    counts of them (and which spares the next step finds) do not depend on timing."""
    value = loss.item()
    torch_nntile.wait()
    return value


def test_repeated_steps_release_nodes():
    """Steps of a training loop leave no pending ops and a bounded number of live nodes."""
    torch.manual_seed(2)
    model = DeepReLU(32, 64, 10, depth=3).to("nntile")
    x = torch.randn(64, 32).to("nntile")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return _finished(loss)

    def live_nodes():
        gc.collect()
        return sum(type(o) is DataNode for o in gc.get_objects())

    step()
    step()
    before = live_nodes()
    for _ in range(10):
        step()
    assert not SESSION.pending
    assert live_nodes() <= before


def test_repeated_steps_reuse_tile_memory():
    """From the third step on, a training loop's tiles take the handles (and memory)
    of the previous step's dead tiles: no new StarPU data is registered, the number of
    live tiles stays the same, and spares of a size no longer asked for are freed."""
    torch.manual_seed(3)
    model = DeepReLU(32, 64, 10, depth=3).to("nntile")
    x = torch.randn(64, 32).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "batch_reuse"})
    torch_nntile.set_axis_group_tiling("batch_reuse", 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(inp):
        loss = (model(inp) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return _finished(loss)

    step(x)
    step(x)
    before = torch_nntile.info()
    for _ in range(3):
        step(x)
    after = torch_nntile.info()
    assert after["tiles_registered"] == before["tiles_registered"]
    assert after["tiles_live"] == before["tiles_live"]
    assert after["tiles_spare"] > 0
    # Steps on another batch size need other tile sizes: the spares left by the first
    # batch go unused, so they are unregistered, and the first batch allocates again.
    x2 = torch.randn(48, 32).to("nntile")
    for _ in range(SPARE_COMPILES + 1):  # each step compiles at least once
        step(x2)
    again = torch_nntile.info()["tiles_registered"]
    step(x)
    assert torch_nntile.info()["tiles_registered"] > again
    # empty_cache() frees every spare at once: the next step allocates all it needs
    step(x)
    assert torch_nntile.info()["tiles_spare"] > 0
    torch_nntile.empty_cache()
    assert torch_nntile.info()["tiles_spare"] == 0
    before = torch_nntile.info()["tiles_registered"]
    step(x)
    assert torch_nntile.info()["tiles_registered"] > before


def test_a_new_recording_thread_submits_what_the_last_one_recorded():
    """Recording on another thread first lowers and submits the pending graph of the
    thread before it (``Session.thread_switched``) once it has THREAD_FLUSH_OPS ops; a
    shorter graph waits. Values are those of CPU either way."""
    x = torch.randn(6, 5)
    xn = x.to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "rows_thr"})
    torch_nntile.set_axis_group_tiling("rows_thr", [4, 2])  # uneven tiles
    for n, flushed in ((THREAD_FLUSH_OPS - 1, False), (THREAD_FLUSH_OPS + 3, True)):
        torch_nntile.execute()
        y, want = xn * 1.0, x * 1.0  # the first op makes this thread the last recorder
        for _ in range(n - 1):
            y, want = y * 0.5, want * 0.5
        assert len(SESSION.pending) == n
        out: list[torch.Tensor] = []
        worker = threading.Thread(target=lambda: out.append(y.exp()))
        worker.start()
        worker.join()
        assert len(SESSION.pending) == (1 if flushed else n + 1)
        assert SESSION_STATE.thread == worker.ident
        torch.testing.assert_close(out[0].cpu(), want.exp())


def test_backward_and_the_optimizer_step_submit_the_phase_before_them():
    """In a training step the forward is submitted when autograd's thread starts the
    backward, and the backward when the optimizer step starts on this thread: the
    loss's readout finds only the optimizer's ops pending. Results match CPU."""
    torch.manual_seed(0)
    model = DeepReLU(16, 32, 5, depth=10)
    ref = copy.deepcopy(model)
    model = model.to("nntile")
    x, y = torch.randn(24, 16), torch.randint(0, 5, (24,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    xn, yn = x.to("nntile"), y.to("nntile")
    for _ in range(3):
        torch_nntile.execute()
        loss = F.cross_entropy(model(xn), yn)
        forward = list(SESSION.pending)
        loss.backward()
        backward = list(SESSION.pending)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ref_loss = F.cross_entropy(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        assert len(forward) >= 16 and backward and not {id(op) for op in forward} & {id(op) for op in backward}
        assert SESSION.pending and not {id(op) for op in backward} & {id(op) for op in SESSION.pending}
        assert abs(loss.item() - ref_loss.item()) < 1e-5
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
