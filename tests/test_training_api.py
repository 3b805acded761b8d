"""torch_nntile.training: losses over logits of any rank and a whole training step,
on nntile against the same code on CPU; version and build facts."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_close

import torch_nntile
from torch_nntile import training
from torch_nntile.nn.model import DeepReLU


@pytest.mark.parametrize("shape", [(11,), (6, 11), (2, 5, 11), (2, 3, 2, 11), (0, 11)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_any_rank(shape, reduction):
    torch.manual_seed(7)
    logits = torch.randn(shape)
    labels = torch.randint(0, 11, shape[:-1])
    if labels.numel() > 2:
        labels.view(-1)[1] = -100
    lc = logits.clone().requires_grad_()
    ln = logits.to("nntile").requires_grad_()
    want = training.cross_entropy(lc, labels, reduction=reduction)
    got = training.cross_entropy(ln, labels.to("nntile"), reduction=reduction)
    assert got.shape == want.shape == (labels.shape if reduction == "none" else ())
    if want.isnan().any():  # the mean over no rows, as on CPU
        assert torch.equal(got.cpu().isnan(), want.isnan())
        return
    assert_close(got.cpu(), want.detach())
    if want.numel() and want.requires_grad:
        g = torch.rand_like(want)
        want.backward(g)
        got.backward(g.to("nntile"))
        assert_close(ln.grad.cpu(), lc.grad)


def test_cross_entropy_checks_shapes():
    with pytest.raises(ValueError, match=r"labels of shape \[4\] do not match the leading dims \[3\]"):
        training.cross_entropy(torch.randn(3, 5).to("nntile"), torch.zeros(4, dtype=torch.long).to("nntile"))
    with pytest.raises(ValueError, match="need a class dim"):
        training.cross_entropy(torch.tensor(1.0), torch.tensor(0))


def test_cross_entropy_label_smoothing_matches_cpu():
    logits, labels = torch.randn(4, 3, 7), torch.randint(0, 7, (4, 3))
    want = training.cross_entropy(logits, labels, label_smoothing=0.1)
    got = training.cross_entropy(logits.to("nntile"), labels.to("nntile"), label_smoothing=0.1)
    assert_close(got.cpu(), want)


def test_mse_loss_matches_cpu():
    a, b = torch.randn(5, 4), torch.randn(5, 4)
    for reduction in ("mean", "sum", "none"):
        assert_close(training.mse_loss(a.to("nntile"), b.to("nntile"), reduction).cpu(),
                     training.mse_loss(a, b, reduction))


@pytest.mark.parametrize("tiling", [None, 6, [10, 6]])
def test_train_full_batch_step_matches_cpu(tiling):
    """Ten steps of the helper with AdamW: the same losses and weights as on CPU, with
    the batch untiled or tiled by name through the helper."""
    torch.manual_seed(8)
    cpu = DeepReLU(12, 16, 5, depth=3)
    dev = copy.deepcopy(cpu).to("nntile")
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    xn, yn = x.to("nntile"), y.to("nntile")
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_n = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    name = f"batch_api_{tiling}".replace(" ", "")
    for step in range(10):
        want = training.train_full_batch_step(cpu, x, y, opt_c)
        kw = {"name_axes": {0: name}, "tilings": {name: tiling}} if tiling is not None and step == 0 else {}
        got = training.train_full_batch_step(dev, xn, yn, opt_n, **kw)
        assert isinstance(got, float)
        assert abs(got - want) <= 1e-5 * max(abs(want), 1e-6), (step, got, want)
    assert torch_nntile.pending_op_names() == []
    for pc, pn in zip(cpu.parameters(), dev.parameters()):
        assert_close(pn.grad.cpu(), pc.grad, 1e-5)  # the last step's gradients stay
        assert_close(pn.detach().cpu(), pc.detach(), 1e-5)


def test_train_full_batch_step_with_mse_and_names_on_cpu_rejected():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    loss = training.train_full_batch_step(model, x, y, opt, loss_fn=training.mse_loss)
    assert isinstance(loss, float)
    with pytest.raises(ValueError, match="need x on nntile"):
        training.train_full_batch_step(model, x, y, opt, loss_fn=training.mse_loss, name_axes={0: "b"})


def test_version_and_build():
    """A CUDA wheel's version carries its CUDA (``0.1.0+cu130``), as torch's does."""
    version, _, local = torch_nntile.__version__.partition("+")
    assert version == "0.1.0"
    assert torch_nntile.built_with_cuda() in (True, False)
    assert not local.startswith("cu") or torch_nntile.built_with_cuda()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradient_accumulation_over_micro_batches(set_to_none):
    """Several backward() calls, then step(): gradients add up as on CPU, and
    zero_grad(set_to_none=...) leaves None or zeros as on CPU."""
    torch.manual_seed(9)
    cpu = DeepReLU(6, 8, 3, depth=3)
    dev = copy.deepcopy(cpu).to("nntile")
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    opt_n = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9)
    xs, ys = torch.randn(3, 4, 6), torch.randint(0, 3, (3, 4))
    for _ in range(3):
        for x, y in zip(xs, ys):  # three micro-batches per step
            (training.cross_entropy(cpu(x), y) / 3).backward()
            (training.cross_entropy(dev(x.to("nntile")), y.to("nntile")) / 3).backward()
        for pc, pn in zip(cpu.parameters(), dev.parameters()):
            assert_close(pn.grad.cpu(), pc.grad)
        opt_c.step()
        opt_n.step()
        opt_c.zero_grad(set_to_none=set_to_none)
        opt_n.zero_grad(set_to_none=set_to_none)
        for pc, pn in zip(cpu.parameters(), dev.parameters()):
            if set_to_none:
                assert pn.grad is None and pc.grad is None
            else:
                assert pn.grad.device.type == "nntile" and torch.equal(pn.grad.cpu(), pc.grad)
    for pc, pn in zip(cpu.parameters(), dev.parameters()):
        assert_close(pn.detach().cpu(), pc.detach())
