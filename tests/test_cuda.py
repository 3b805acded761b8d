"""CUDA workers. Without a GPU (CI, this machine): what a CPU build and a CUDA build
without a GPU do when asked for CUDA workers. With one, run with
``TORCH_NNTILE_NCUDA=1`` on a CUDA build (``scripts/gpu_check.sh``): every test's tasks
then run on the CUDA worker, and the tests marked ``gpu`` below check that they did,
what they computed and that a GPU memory limit keeps the losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import NCUDA, assert_close, run_python

import torch_nntile

CUDA_BUILD = torch_nntile.built_with_cuda()
gpu = pytest.mark.skipif(not NCUDA, reason="needs a GPU, a CUDA build and TORCH_NNTILE_NCUDA=1 (scripts/gpu_check.sh)")


@pytest.mark.skipif(CUDA_BUILD, reason="a CPU build's behaviour")
def test_cpu_build_refuses_cuda_workers():
    code = """
        import torch_nntile
        assert torch_nntile.built_with_cuda() is False
        for ask in (1, -1):
            try:
                torch_nntile.init_context(ncpu=1, ncuda=ask)
            except ValueError as e:
                print("ValueError", e)
        torch_nntile.init_context(ncpu=1)
        assert torch_nntile.cuda_worker_count() == 0
        try:
            torch_nntile.restrict_cuda()
        except RuntimeError as e:
            print("RuntimeError", e)
    """
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ValueError ncuda=1: this build's StarPU has no CUDA workers"), lines
    assert lines[1].startswith("ValueError ncuda=-1:"), lines
    assert lines[2] == ("RuntimeError torch_nntile: no CUDA workers: this StarPU build has none (see built_with_cuda()); "
                        "restrict_cuda() is unavailable"), lines


@pytest.mark.skipif(not CUDA_BUILD or torch.cuda.is_available(), reason="a CUDA build on a machine without a GPU")
def test_cuda_build_without_gpu_runs_on_cpu_workers():
    code = """
        import torch, torch_nntile
        torch_nntile.init_context(ncpu=2, ncuda=-1)  # every GPU: none here
        assert torch_nntile.cuda_worker_count() == 0
        assert torch_nntile.info()["cuda"] is None
        x = torch.randn(37, 23)
        a = x.to("nntile")
        torch_nntile.set_axis_group_name(a, {0: "rows"})
        torch_nntile.set_axis_group_tiling("rows", [20, 17])
        assert torch.allclose((a @ a.T).cpu(), x @ x.T, rtol=1e-5, atol=1e-5)
        torch_nntile.shutdown_context()
        torch_nntile.init_context(ncpu=2, ncuda=1)
    """
    out = run_python(code)
    assert out.returncode != 0
    assert "RuntimeError: torch_nntile: ncuda=1, but StarPU started 0 CUDA worker(s)" in out.stderr, out.stderr


def test_ncuda_from_the_environment_must_be_a_number():
    out = run_python("import torch, torch_nntile\ntorch.ones(2).to('nntile').cpu()",
                     env={**os.environ, "TORCH_NNTILE_NCUDA": "one"})
    assert out.returncode != 0
    assert "ValueError: TORCH_NNTILE_NCUDA='one': a count of GPUs, or -1 for every GPU" in out.stderr, out.stderr


def _cuda_tasks() -> int:
    torch_nntile.wait()
    return torch_nntile.info()["cuda"]["tasks"]


@gpu
def test_tasks_run_on_cuda_workers():
    """Products (float32 and float64: cuBLAS), elementwise chains, softmax and a
    reduction (torch's CUDA kernels) on uneven tiles, all on the CUDA worker."""
    assert torch_nntile.cuda_worker_count() == NCUDA
    before = _cuda_tasks()
    for dtype in (torch.float32, torch.float64):
        x, w = torch.randn(70, 48, dtype=dtype), torch.randn(48, 33, dtype=dtype)
        a, b = x.to("nntile"), w.to("nntile")
        torch_nntile.set_axis_group_name(a, {0: f"r{dtype}", 1: f"k{dtype}"})
        torch_nntile.set_axis_group_tiling(f"r{dtype}", [30, 40])
        torch_nntile.set_axis_group_tiling(f"k{dtype}", 20)
        y = torch.softmax(torch.tanh(a @ b) * 2 + 1, dim=1).sum(0)
        want = torch.softmax(torch.tanh(x @ w) * 2 + 1, dim=1).sum(0)
        assert_close(y.cpu(), want, 1e-4 if dtype is torch.float32 else 1e-10)
    assert _cuda_tasks() - before >= 10


@gpu
def test_untiled_task_and_zero_size_on_cuda():
    x = torch.randn(5, 6)
    a = x.to("nntile")
    assert_close(torch.cumsum(a, 1).cpu(), torch.cumsum(x, 1), 1e-5)  # an untiled task
    z = torch.randn(0, 4).to("nntile")
    assert (z * 2).cpu().shape == (0, 4)
    s = torch.tensor(3.0).to("nntile")
    assert (s * a).sum().item() == pytest.approx(3 * x.sum().item(), rel=1e-5)


@gpu
def test_kernel_error_on_cuda_names_the_op():
    logits = torch.randn(4, 3).to("nntile")
    target = torch.tensor([0, 1, 7, 2]).to("nntile")
    with pytest.raises(torch_nntile.KernelError, match="nll_loss"):
        F.nll_loss(logits, target).cpu()
    ok = torch.randn(3).to("nntile")
    assert_close((ok + 1).cpu(), ok.cpu() + 1)


@gpu
def test_trace_names_cuda_workers(tmp_path):
    x = torch.randn(64, 64).to("nntile")
    with torch_nntile.trace(tmp_path / "t.json"):
        (x @ x).cpu()
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert any(n.startswith("CUDA worker") for n in names), names


_LIMITED = """
import json, os, sys, torch, torch_nntile
torch_nntile.init_context(ncpu=2, ncuda=1)
torch_nntile.restrict_cuda()
torch.manual_seed(0)
layers = [torch.nn.Linear(1024, 1024, bias=False) for _ in range(12)]  # 48 MiB of weights, 96 MiB with SGD's grads
model = torch.nn.Sequential(*[m for lin in layers for m in (lin, torch.nn.ReLU())]).to("nntile")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(512, 1024).to("nntile"), torch.randn(512, 1024).to("nntile")
torch_nntile.set_axis_group_name(x, {0: "batch"})
torch_nntile.set_axis_group_tiling("batch", 128)
for p in model.parameters():
    torch_nntile.set_axis_group_name(p, {0: "out", 1: "in"})
torch_nntile.set_axis_group_tiling("out", 256)
torch_nntile.set_axis_group_tiling("in", 256)
losses = []
for _ in range(3):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
print(json.dumps(losses))
"""


@gpu
def test_gpu_memory_limit_keeps_the_losses():
    """A working set of about 3 times ``STARPU_LIMIT_CUDA_MEM`` (weights, gradients and
    activations of ~150 MiB against 48 MiB): StarPU evicts tiles to the host and brings
    them back, and the losses are those of the unlimited run."""
    free = run_python(_LIMITED, timeout=600)
    assert free.returncode == 0, free.stderr
    limited = run_python(_LIMITED, timeout=600, env={**os.environ, "STARPU_LIMIT_CUDA_MEM": "48"})
    assert limited.returncode == 0, limited.stderr
    a, b = json.loads(free.stdout.splitlines()[-1]), json.loads(limited.stdout.splitlines()[-1])
    assert a == pytest.approx(b, rel=1e-5), (a, b)


BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "cuda_step.py")


def _bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, BENCH, *argv], capture_output=True, text=True, timeout=900)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_cuda_benchmark_without_gpu_says_so():
    out = _bench()
    assert out.returncode == 2
    assert "no GPU: torch.cuda.is_available() is False" in out.stderr, out.stderr


@gpu
def test_cuda_benchmark_small_writes_json(tmp_path):
    out = _bench("--size", "small", "--steps", "2", "--block", "1", "--warmup", "2", "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr
    rec = json.loads((tmp_path / "r.json").read_text())
    assert rec["cuda_tasks"]["tasks"] > 0 and rec["ratio"] > 0
    losses = rec["warmup_losses"]
    assert losses["nntile"] == pytest.approx(losses["cuda_eager"], rel=1e-4)
