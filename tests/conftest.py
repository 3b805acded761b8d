"""Tests run on StarPU with 2 CPU workers and no CPU fallback unless stated."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

os.environ.setdefault("STARPU_HOME", os.path.join(tempfile.gettempdir(), "torch_nntile_test_starpu"))

import torch_nntile  # noqa: E402
from torch_nntile.graph import axes  # noqa: E402
from torch_nntile.session import SESSION_STATE  # noqa: E402

# TORCH_NNTILE_NCUDA=N (a CUDA build on a GPU machine: scripts/gpu_check.sh) runs the
# tests with N CUDA workers, each test's tasks restricted to them; float tolerances are
# then TOL_SCALE times the CPU ones (cuBLAS and torch's CUDA kernels sum in other orders).
NCUDA = int(os.environ.get("TORCH_NNTILE_NCUDA", "0") or 0)
TOL_SCALE = 10.0 if NCUDA else 1.0

torch_nntile.init_context(ncpu=2, cpu_fallback=False)

RTOL = 1e-5 * TOL_SCALE  # relative error allowed against CPU PyTorch in fp32


@pytest.fixture
def python_tasks(monkeypatch):
    """The names of the tasks the runtime prepares as Python callbacks from here on."""
    rt = SESSION_STATE.runtime()
    names: list[str] = []
    real = rt.prepare

    def prepare(tasks, *a):
        b = real(tasks, *a)
        names.extend(c[3] for c in b.closures)
        return b

    monkeypatch.setattr(rt, "prepare", prepare)
    return names


@pytest.fixture(autouse=True)
def _clean_tilings():
    """Each test starts with no tilings and without the CPU fallback (with CUDA workers:
    on them alone)."""
    axes._TILINGS.clear()
    if NCUDA:
        torch_nntile.restrict_cuda()
    yield
    axes._TILINGS.clear()
    torch_nntile.init_context(ncpu=2, cpu_fallback=False)
    torch_nntile.execute()  # a test that left work pending must not leak it into the next
    torch_nntile.wait()


def run_python(code: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (for what would end or upset this one); a hang
    fails the test through the timeout."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, **kw)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / max(b.norm().item(), 1e-30)).item()


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float = RTOL) -> None:
    assert got.device.type == "cpu"
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.is_floating_point:
        err = rel_err(got, want)
        assert err <= rtol, f"relative error {err:.3g} > {rtol}"
    else:
        assert torch.equal(got, want)


_names = itertools.count()


def check_op(fn, inputs: list[torch.Tensor], tiles: dict[tuple[int, int], int | list[int]] | None = None,
             grad: bool = True, rtol: float = RTOL) -> None:
    """Compare ``fn`` on nntile against CPU, forward and backward.

    ``tiles`` maps (input index, dim) to a tiling for that dimension's axis group.
    """
    cpu_in = [x.detach().clone().requires_grad_(grad and x.dtype.is_floating_point) for x in inputs]
    dev_in = [x.detach().to("nntile").requires_grad_(grad and x.dtype.is_floating_point) for x in inputs]
    for (i, d), t in (tiles or {}).items():
        name = f"g{next(_names)}"
        torch_nntile.set_axis_group_name(dev_in[i], {d: name})
        torch_nntile.set_axis_group_tiling(name, t)
    want = fn(*cpu_in)
    got = fn(*dev_in)
    assert got.device.type == "nntile"
    assert_close(got.cpu(), want.detach(), rtol)
    if grad and want.requires_grad:
        g = torch.randn_like(want)
        want.backward(g)
        got.backward(g.to("nntile"))
        for c, n in zip(cpu_in, dev_in):
            if c.requires_grad:
                assert n.grad is not None and n.grad.device.type == "nntile"
                assert_close(n.grad.cpu(), c.grad, rtol)
