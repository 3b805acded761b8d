"""Device behaviours: creation, transfer, printing, modules, serialization."""

from __future__ import annotations

import io

import pytest
import torch
from conftest import assert_close
from torch import nn

import torch_nntile


def test_device_registered():
    assert torch.nntile.is_available()
    assert torch.nntile.device_count() == 1
    assert torch.device("nntile").type == "nntile"


def test_to_and_back():
    x = torch.randn(5, 7)
    n = x.to("nntile")
    assert n.device.type == "nntile" and n.shape == x.shape and n.dtype == x.dtype
    assert n.untyped_storage().nbytes() == x.untyped_storage().nbytes()  # sized like CPU's; values live in tiles
    assert torch.equal(n.cpu(), x)
    assert torch.equal(n.to("cpu"), x)
    assert torch.equal(x.nntile().cpu(), x)
    assert n.is_nntile


def test_inference_mode_reads_back_an_inference_tensor():
    """A read under inference mode gives what CPU gives there; the worker writes the
    inference tensor it was handed."""
    x = torch.randn(4, 6)
    with torch.inference_mode():
        want = torch.nn.functional.linear(x, x) * 2
        got = (torch.nn.functional.linear(x.to("nntile"), x.to("nntile")) * 2).cpu()
        assert got.is_inference() == want.is_inference()
        assert_close(got, want)


def test_factories():
    assert torch.equal(torch.tensor([1.0, 2.0], device="nntile").cpu(), torch.tensor([1.0, 2.0]))
    assert torch.equal(torch.zeros(2, 3, device="nntile").cpu(), torch.zeros(2, 3))
    assert torch.equal(torch.ones(2, 3, device="nntile").cpu(), torch.ones(2, 3))
    assert torch.equal(torch.full((2, 2), 7.0, device="nntile").cpu(), torch.full((2, 2), 7.0))
    assert torch.empty(4, 2, device="nntile").cpu().shape == (4, 2)
    torch.manual_seed(3)
    r = torch.randn(3, 4, device="nntile").cpu()
    torch.manual_seed(3)
    assert torch.equal(r, torch.randn(3, 4))  # drawn from the CPU generator
    assert torch.equal(torch.tensor([1, 2], device="nntile").cpu(), torch.tensor([1, 2]))


@pytest.mark.parametrize("cpu", [torch.tensor([]), torch.zeros(0, 3, dtype=torch.int64), torch.ones(2, 0, 4).bool(),
                                 torch.zeros(3, 4)[:, 4:]], ids=["1d", "int64", "bool", "strided"])
def test_zero_size_copies_in_without_host_copy(cpu):
    """A CPU tensor of no elements comes in as a fill of its shape (HF's cache makes
    ``torch.tensor([])`` every step): no bytes are copied, and it behaves as CPU's."""
    torch_nntile.wait()
    torch_nntile.reset_info()
    n = cpu.to("nntile")
    assert torch_nntile.pending_op_names()[-1:] == ["fill"]
    assert n.shape == cpu.shape and n.dtype == cpu.dtype
    got = n.cpu()
    assert got.shape == cpu.shape and got.dtype == cpu.dtype
    assert torch_nntile.info()["bytes_in"] == 0
    x = torch.randn(2, 3, 5)
    assert torch.equal(torch.cat([torch.tensor([], device="nntile"), x.to("nntile")], dim=-2).cpu(),
                       torch.cat([torch.tensor([]), x], dim=-2))


def test_print():
    t = torch.tensor([1.5, -2.0], device="nntile")
    s = repr(t)
    assert "1.5000" in s and "-2.0000" in s and "device='nntile:0'" in s
    print(t * 2)


def test_item_and_scalar_ops():
    t = torch.tensor([1.0, 2.0, 3.0], device="nntile")
    assert t.sum().item() == 6.0
    assert (t * torch.tensor(2.0)).cpu().tolist() == [2.0, 4.0, 6.0]  # CPU 0-dim tensors mix in


def test_module_to_keeps_tied_weights():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.weight = self.a.weight

    m = Tied()
    w = m.a.weight.detach().clone()
    m = m.to("nntile")
    assert m.a.weight is m.b.weight
    assert m.a.weight.device.type == "nntile"
    assert torch.equal(m.b.weight.detach().cpu(), w)


def test_state_dict_save_load_roundtrip():
    m = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)).to("nntile")
    sd = m.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    for k, v in sd.items():
        assert loaded[k].device.type == "nntile"
        assert torch.equal(loaded[k].cpu(), v.cpu())
    m2 = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
    m2.load_state_dict({k: v.cpu() for k, v in loaded.items()})
    x = torch.randn(3, 6)
    assert_close(m(x.to("nntile")).detach().cpu(), m2(x).detach())
    m3 = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)).to("nntile")
    m3.load_state_dict(m2.state_dict())  # CPU state into an nntile module
    assert_close(m3(x.to("nntile")).detach().cpu(), m2(x).detach())


def test_deferred_execution_api():
    x = torch.randn(8, 4).to("nntile")
    y = (x * 2).relu()
    assert torch_nntile.pending_op_names()[-2:] == ["mul", "relu"]
    torch_nntile.compile_graph()
    assert torch_nntile.pending_op_names() == []
    torch_nntile.run()
    torch_nntile.wait()
    z = y + 1
    torch_nntile.execute()
    torch_nntile.wait()
    assert_close(z.cpu(), (x.cpu() * 2).relu() + 1)


def test_axis_groups_report():
    x = torch.randn(16, 6).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "rows", 1: "cols"})
    y = (x * 2).sum(1)
    torch_nntile.set_axis_group_tiling("rows", [10, 6])
    text = torch_nntile.format_axis_groups()
    line = next(ln for ln in text.splitlines() if ln.startswith("name='rows' "))
    assert "extent=16" in line and line.endswith(" pending_ntiles=2 pending_tiles=10,6"), line
    assert next(ln for ln in text.splitlines() if ln.startswith("name='cols' ")).split()[1] == "extent=6"
    assert_close(y.cpu(), (x.cpu() * 2).sum(1))


def test_restrict_and_restore():
    torch_nntile.restrict_cpu()
    x = torch.randn(4, 4).to("nntile")
    assert_close((x + x).cpu(), x.cpu() * 2)
    torch_nntile.restore_where()


def test_workers_pause_when_work_drains_after_a_readout():
    """.cpu() waits for its own value; work submitted with it goes on afterwards, and
    once it drains the StarPU workers are paused instead of polling the cores."""
    import time

    x = torch.randn(64, 64)
    xn = x.to("nntile")
    first = xn + 1
    later, want = first, x + 1
    for _ in range(20):  # submitted with the readout below, not needed by it
        later = later @ xn / 64
        want = want @ x / 64
    assert_close(first.cpu(), x + 1)
    # No wait(): the runtime pauses the workers by itself once the work drains. How
    # soon depends on the machine's load, so look for the pause (a hang bound, not a
    # timing) before measuring what the idle process costs.
    rt = torch_nntile.session.SESSION_STATE.runtime()
    deadline = time.monotonic() + 60
    while not rt.paused and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rt.paused, "the workers were not paused after the work drained"
    t0, c0 = time.perf_counter(), time.process_time()
    time.sleep(0.3)
    cores = (time.process_time() - c0) / (time.perf_counter() - t0)
    assert cores < 0.3, f"idle process used {cores:.2f} cores"
    assert_close(later.cpu(), want, rtol=1e-4)


def _worker_niceness() -> list[int]:
    """The niceness of each StarPU CPU worker thread of this process (named ``CPU <n>``)."""
    import os

    out = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().startswith("CPU "):
                out.append(os.getpriority(os.PRIO_PROCESS, int(tid)))
    return out


def test_workers_yield_the_cores_to_the_recording_thread():
    """The CPU workers run at WORKER_NICE, the recording threads at the process's own
    priority; TORCH_NNTILE_WORKER_NICE=0 leaves the workers at it too (a fresh process:
    a thread's niceness cannot go back down without privileges)."""
    import os

    from conftest import run_python

    from torch_nntile.runtime.workers import WORKER_NICE

    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert WORKER_NICE > 0
    assert _worker_niceness() == [min(own + WORKER_NICE, 19)] * 2
    code = """
        import torch, torch_nntile
        from test_device import _worker_niceness
        torch_nntile.init_context(ncpu=2)
        assert ((torch.ones(3).to("nntile") + 1).cpu() == 2).all()
        print(_worker_niceness())
    """
    env = {**os.environ, "TORCH_NNTILE_WORKER_NICE": "0"}
    done = run_python(code, env=env, cwd=os.path.dirname(__file__))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == f"[{own}, {own}]"


def test_a_bad_worker_niceness_is_named():
    import os

    from conftest import run_python

    code = """
        import torch_nntile
        torch_nntile.shutdown_context()
        try:
            torch_nntile.init_context(ncpu=2)
        except ValueError as e:
            print(e)
    """
    for bad in ("high", "-3"):
        done = run_python(code, env={**os.environ, "TORCH_NNTILE_WORKER_NICE": bad})
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"TORCH_NNTILE_WORKER_NICE must be an integer of 0 or more, got {bad!r}"


def test_views_run_as_cpp_kernels_with_cpu_errors():
    # the build compiles the backend's C++ library (backend/csrc/views.cpp): views then
    # record no Python call (not counted as ATen calls) and raise CPU's errors, a
    # geometry past the storage included
    from torch_nntile import stats
    from torch_nntile.backend import table_data

    assert table_data.NATIVE
    x = torch.arange(24.0)
    xn = x.to("nntile")
    before = stats.OP_CALLS.copy()
    v = xn.view(4, 6).t()[1:3].as_strided((2, 3), (1, 4), 2)
    assert not {k for k in stats.OP_CALLS - before if "view" in k or "strided" in k}
    assert torch.equal(v.cpu(), x.view(4, 6).t()[1:3].as_strided((2, 3), (1, 4), 2))
    for bad in (lambda t: t.view(5, 5), lambda t: t.as_strided((5, 5), (5, 1)), lambda t: t.view(4, 6).t().view(-1)):
        with pytest.raises(RuntimeError) as cpu:
            bad(x)
        with pytest.raises(RuntimeError) as ours:
            bad(xn)
        assert str(ours.value) == str(cpu.value)


def test_native_library_records_its_torch(tmp_path):
    """The build's C++ library records the torch it was compiled against, and a library
    recorded against another torch (a tree built by another environment) is not loaded:
    it would fail on a missing symbol, or load and crash."""
    from torch_nntile.backend import native_lib

    path = native_lib.native_library()
    assert path is not None and native_lib.built_against(path) == torch.__version__.split("+")[0]
    assert native_lib._loadable(path)
    other = tmp_path / "_native.so"
    other.write_bytes(b"\x7fELF\0\0torch_nntile: built against torch 2.0.1\0\0")
    assert native_lib.built_against(str(other)) == "2.0.1"
    with pytest.warns(RuntimeWarning, match="built against torch 2.0.1, not this torch"):
        assert not native_lib._loadable(str(other))
    other.write_bytes(b"\x7fELF\0\0")  # a build older than the record: loaded as before
    assert native_lib.built_against(str(other)) is None and native_lib._loadable(str(other))


def test_device_guard_runs_in_cpp(monkeypatch):
    """The build's C++ device guard answers PyTorch's device and stream questions
    (about 800 a GPT-2 step, most on autograd's thread) instead of the Python guard
    PyTorch gives a Python backend, which takes the GIL for each: a training step
    asks Python nothing, and autograd's answers are CPU's."""
    import torch.utils.backend_registration as registration

    from torch_nntile.backend import table_data

    assert table_data.NATIVE
    asked = []
    monkeypatch.setattr(registration._DummyDeviceGuard, "type_", lambda self: asked.append(1) or
                        torch._C._autograd.DeviceType.PrivateUse1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    x = torch.randn(5, 6)
    want = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
    dev = model.to("nntile")
    got = torch.autograd.grad(dev(x.to("nntile")).square().sum(), list(dev.parameters()))
    with torch.device("nntile"):
        made = torch.zeros(2)
    assert made.device == torch.device("nntile", 0)
    for g, w in zip(got, want):
        assert g.device == torch.device("nntile", 0)
        assert_close(g.cpu(), w)
    assert asked == []
