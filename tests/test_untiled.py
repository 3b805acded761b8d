"""Ops with no tiled lowering, run in the graph as untiled tasks (backend/untiled.py).

With ``cpu_fallback=False`` nothing may reach the host fallback; the results are
CPU's, untiled and with the batch in two tiles, for zero-size and 0-dim inputs too.
``tiled_only=True`` refuses them by name; a Meta kernel's rejection of bad arguments
is CPU's exception."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import run_python
from torch.testing import assert_close

import torch_nntile
from torch_nntile import stats


def _dev(x: torch.Tensor, tiled: bool, grad: bool = False) -> torch.Tensor:
    d = x.detach().to("nntile").requires_grad_(grad)
    if tiled and x.dim():
        name = f"b{id(d)}"
        torch_nntile.set_axis_group_name(d, {0: name})
        torch_nntile.set_axis_group_tiling(name, max(1, x.shape[0] // 2))
    return d


@pytest.fixture(params=[False, True], ids=["untiled", "tiled"])
def tiled(request):
    torch_nntile.reset_info()
    yield request.param
    assert stats.FALLBACK_CALLS == {}, stats.FALLBACK_CALLS


def test_multi_output_ops(tiled):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8)
    xn = _dev(x, tiled)
    v, i = torch.topk(x.flatten(), 5)
    vn, i_n = torch.topk(xn.flatten(), 5)  # along dim 0: no batch to split, one task
    assert torch.equal(vn.cpu(), v) and torch.equal(i_n.cpu(), i)
    m, mi = torch.sort(x, 0)
    mn, min_ = torch.sort(xn, 0)  # along the batch: split along the other dims (one tile each: one task)
    assert torch.equal(mn.cpu(), m) and torch.equal(min_.cpu(), mi)
    m, mi = torch.sort(x.flatten(), 0, descending=True)
    mn, min_ = torch.sort(xn.flatten(), 0, descending=True)  # nothing to split: one untiled task
    assert torch.equal(mn.cpu(), m) and torch.equal(min_.cpu(), mi)
    assert torch.equal(torch.histc(xn, 10).cpu(), torch.histc(x, 10))
    assert {"aten::topk.values", "aten::sort.values_stable", "aten::histc"} <= set(stats.UNTILED_CALLS)
    assert "aten::sort.values_stable" in stats.BATCHED_CALLS


@pytest.mark.parametrize("calls", [1, 2], ids=["once", "twice"])
def test_written_arguments(tiled, calls):
    """In place, out= (resized), out= that is also the input; called twice, the second
    call's Meta result comes from the cache (meta_calls), out= resized from it."""
    for _ in range(calls):
        _written_arguments(tiled)


def _written_arguments(tiled):
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    c, cn = x.abs() + 0.5, _dev(x.abs() + 0.5, tiled)
    c.digamma_()
    cn.digamma_()  # in place (through digamma.out into self): the argument gets the new value
    assert_close(cn.cpu(), c)
    o, on = torch.empty(0), _dev(torch.empty(0), tiled)
    torch.polygamma(1, x, out=o)
    out = torch.polygamma(1, _dev(x, tiled), out=on)  # out=: resized, written, returned
    assert out is on and on.shape == (4, 3)
    assert_close(on.cpu(), o)
    a, an = x.clone(), _dev(x, tiled)
    torch.special.bessel_j0(a, out=a)
    torch.special.bessel_j0(an, out=an)  # out= is also the input: read, then written
    assert_close(an.cpu(), a)
    assert {"aten::digamma.out", "aten::polygamma.out", "aten::special_bessel_j0.out"} <= set(stats.UNTILED_CALLS)


def test_zero_size_and_0dim(tiled):
    e = torch.empty(0, 3)
    assert torch.equal(torch.histc(_dev(e, tiled), 4).cpu(), torch.histc(e, 4))
    v0, i0 = torch.topk(torch.tensor(2.5).to("nntile"), 1)
    assert (v0.item(), i0.item(), v0.shape, i0.shape) == (2.5, 0, (), ())


def test_no_meta_kernel_is_refused_without_the_cpu_fallback():
    xn = torch.randn(5).to("nntile")
    with pytest.raises(NotImplementedError, match=r"^torch_nntile: aten::_logcumsumexp is not supported on the "
                                                   r"nntile device: PyTorch gives it no Meta kernel \("):
        torch.logcumsumexp(xn, 0)


def test_meta_rejection_is_cpus_error():
    """Wrong arguments raise CPU's exception, not an 'unsupported' one."""
    w = torch.randn(5, 3, 3, 3)
    with pytest.raises(RuntimeError) as cpu:
        F.conv2d(torch.randn(3, 4), w)
    with pytest.raises(RuntimeError) as dev:
        F.conv2d(torch.randn(3, 4).to("nntile"), w.to("nntile"))
    assert str(dev.value) == str(cpu.value)


def test_tiled_only_names_the_first_untiled_op():
    x = torch.randn(2, 3, 8, 8).to("nntile")
    w = torch.randn(4, 3, 3, 3).to("nntile")
    torch_nntile.init_context(ncpu=2, tiled_only=True)
    y = F.conv2d(torch.relu(x), w)  # tiled kernels (the convolution per batch tile): fine
    with pytest.raises(NotImplementedError, match=r"^torch_nntile: aten::histc has no tiled kernel "
                                                   r"on the nntile device and init_context\(tiled_only=True\)"):
        torch.histc(y, 4)
    torch_nntile.init_context(ncpu=2, cpu_fallback=True, tiled_only=True)  # the host fallback is no way out
    with pytest.raises(NotImplementedError, match="aten::_logcumsumexp has no tiled kernel"):
        torch.logcumsumexp(x, 0)


def test_switched_off_runs_them_on_the_host():
    """``TORCH_NNTILE_UNTILED=0`` (debugging) sends them to the host fallback."""
    out = run_python("""
        import torch, torch_nntile
        torch_nntile.init_context(ncpu=2, cpu_fallback=True)
        x = torch.randn(5)
        assert torch.equal(torch.histc(x.to("nntile"), 4).cpu(), torch.histc(x, 4))
        fb = torch_nntile.metrics()["fallbacks"]
        assert torch_nntile.metrics()["untiled"] == {} and fb["aten::histc"]["count"] == 1, fb
        assert fb["aten::histc"]["reason"] == "untiled tasks are off (TORCH_NNTILE_UNTILED=0)", fb
        print("ok")
    """, env={**os.environ, "TORCH_NNTILE_UNTILED": "0"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_histc_of_integers_as_cuda():
    """CPU's histc refuses integers; CUDA's takes them, and an accelerator does as CUDA
    (HF's mixture-of-experts code calls it on int32 on every device but CPU and MPS)."""
    x = torch.tensor([0, 1, 2, 3, 3, 7, 7, 2, -4, 9], dtype=torch.int32)
    got = torch.histc(x.to("nntile"), bins=4, min=0, max=7)
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), torch.histc(x.float(), bins=4, min=0, max=7).int())
    got = torch.histc(x.to("nntile"), bins=13)  # bounds from the values
    assert torch.equal(got.cpu(), torch.histc(x.double(), bins=13).int())
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x.to("nntile"), bins=0).cpu()


def test_host_fallback_writes_back_what_batch_norm_updates():
    """CPU's native_batch_norm updates the running statistics in place, which its schema
    does not mark as written: the host path copies them back all the same."""
    x = torch.randn(4, 3, 2, 2).to(torch.bfloat16)  # no tiled batch norm for bfloat16
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm0, rmn, rvn = rm.clone(), rm.to("nntile"), rv.to("nntile")
    with pytest.raises(NotImplementedError, match="running statistics"):
        torch.ops.aten.native_batch_norm(x.to("nntile"), None, None, rmn, rvn, True, 0.1, 1e-5)
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    want = torch.ops.aten.native_batch_norm(x, None, None, rm, rv, True, 0.1, 1e-5)
    got = torch.ops.aten.native_batch_norm(x.to("nntile"), None, None, rmn, rvn, True, 0.1, 1e-5)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
    assert torch.equal(rmn.cpu(), rm) and torch.equal(rvn.cpu(), rv)
    assert not torch.equal(rm, rm0)  # it did update them


def test_unfold_is_a_view_and_repeat_uses_it(tiled):
    """``unfold`` aliases its base as on CPU (ATen builds ``repeat`` by copying into an
    unfold view of its result: BLOOM's ALiBi, DeBERTa, Whisper call it)."""
    x = torch.randn(4, 6, 5)
    xn = _dev(x, tiled)
    assert torch.equal(xn.unfold(2, 3, 2).cpu(), x.unfold(2, 3, 2))
    xn.unfold(1, 2, 2).mul_(2)  # windows that do not overlap: the writes reach the base
    x.unfold(1, 2, 2).mul_(2)
    assert torch.equal(xn.cpu(), x)
    assert torch.equal(xn.repeat(2, 1, 3).cpu(), x.repeat(2, 1, 3))
    assert stats.UNTILED_CALLS == {}, stats.UNTILED_CALLS


@pytest.mark.parametrize("fill", [
    lambda t: t.normal_(1.0, 2.0), lambda t: t.uniform_(-1, 3), lambda t: t.exponential_(2.0),
    lambda t: t.cauchy_(0.5, 2.0), lambda t: t.geometric_(0.3), lambda t: t.log_normal_(0.0, 0.5),
    lambda t: t.bernoulli_(0.4), lambda t: t.random_(0, 9),
], ids=["normal", "uniform", "exponential", "cauchy", "geometric", "log_normal", "bernoulli", "random"])
def test_random_fills_draw_as_cpu(fill):
    """In-place random fills draw from the CPU generator in program order: the same
    seed gives CPU's values, in the graph (no host fallback)."""
    torch_nntile.reset_info()
    torch.manual_seed(5)
    want = fill(torch.empty(37))
    torch.manual_seed(5)
    got = fill(torch.empty(37).to("nntile"))
    assert torch.equal(got.cpu(), want)
    assert stats.FALLBACK_CALLS == {}


@pytest.mark.parametrize("tiled_", [False, True], ids=["untiled", "tiled"])
def test_bincount_in_the_graph(tiled_):
    """bincount reads back only its length (the largest value), then counts in the graph."""
    torch_nntile.reset_info()
    x = torch.tensor([1, 3, 3, 0, 7, 3], dtype=torch.int32)
    xn = _dev(x, tiled_)
    assert torch.equal(torch.bincount(xn).cpu(), torch.bincount(x))
    assert torch.equal(torch.bincount(xn, minlength=11).cpu(), torch.bincount(x, minlength=11))
    for w in (torch.rand(6), torch.rand(6, dtype=torch.float64), torch.arange(6, dtype=torch.int32)):
        want = torch.bincount(x, w)
        got = torch.bincount(xn, _dev(w, tiled_))
        assert got.dtype == want.dtype
        assert_close(got.cpu(), want)
    e = torch.tensor([], dtype=torch.int64)
    assert torch.equal(torch.bincount(e.to("nntile"), minlength=3).cpu(), torch.bincount(e, minlength=3))
    for bad, kind, msg in ((torch.tensor([-1, 2]), RuntimeError, "non-negative"),
                           (torch.tensor([[1]]), RuntimeError, "1-d non-negative"),
                           (torch.tensor([1.0]), NotImplementedError, "bincount_cpu")):
        with pytest.raises(kind, match=msg):
            torch.bincount(bad.to("nntile"))
    assert stats.FALLBACK_CALLS == {} and "aten::bincount" not in stats.UNTILED_CALLS


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_ctc_loss_in_the_graph(reduction):
    """PyTorch marks _ctc_loss as shaped by values; its integer lengths decide the shape,
    so nntile supplies the Meta form and the loss and its backward are untiled tasks."""
    torch_nntile.reset_info()
    torch.manual_seed(0)
    lp = torch.randn(12, 3, 6).log_softmax(2).detach().requires_grad_()
    tg, il, tl = torch.randint(1, 6, (3, 5)), torch.full((3,), 12), torch.tensor([5, 3, 4])
    want = F.ctc_loss(lp, tg, il, tl, reduction=reduction)
    want.sum().backward()
    lpn = lp.detach().to("nntile").requires_grad_()
    got = F.ctc_loss(lpn, tg.to("nntile"), il.to("nntile"), tl.to("nntile"), reduction=reduction)
    got.sum().backward()
    assert_close(got.detach().cpu(), want.detach())
    assert_close(lpn.grad.cpu(), lp.grad, rtol=1e-4, atol=1e-5)
    assert stats.FALLBACK_CALLS == {}
    assert {"aten::_ctc_loss", "aten::_ctc_loss_backward"} <= set(stats.UNTILED_CALLS)
