"""Faults: a program gets CPU's answer or a clear error, never a hang, a crash or a wrong value.

Tiles that get no memory, kernels that raise in the middle of a graph, Ctrl-C while
waiting, exit with work in flight, use after shutdown and re-initialisation, mixed
devices, shape mismatches and two threads at once. Where a process must die, be
interrupted or be limited, the test runs it as a subprocess.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, run_python

import torch_nntile
from torch_nntile.backend.device import new_tensor, read
from torch_nntile.kernels import Kernel
from torch_nntile.nn.model import DeepReLU
from torch_nntile.ops.base import map_op
from torch_nntile.runtime import interrupts

CRASH_MARKS = ("Segmentation fault", "Aborted", "Fatal Python error", "core dumped", "SIGSEGV", "SIGABRT")


def _no_crash(stderr: str) -> None:
    for mark in CRASH_MARKS:
        assert mark not in stderr, stderr[-3000:]


def _raise_in_kernel(exc: BaseException, out: torch.Tensor, a: torch.Tensor) -> None:
    raise exc


def _failing(x: torch.Tensor, exc: BaseException) -> torch.Tensor:
    """An nntile tensor like ``x`` whose kernel raises ``exc`` when it runs."""
    return new_tensor(map_op("boom", Kernel(_raise_in_kernel, exc), [read(x)], x.dtype))


# -- tiles that get no memory ------------------------------------------------------


_NO_MEMORY = """
import json, resource
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # 8 GiB of address space
import torch, torch_nntile
res = {}
try:
    torch.ones(3 * 10**9)  # what CPU PyTorch does with the same request
except Exception as e:
    res["cpu"] = [type(e).__name__, [c.__name__ for c in type(e).__mro__]]
torch_nntile.init_context(ncpu=2)
x = torch.ones(3 * 10**9, device="nntile")  # 12 GB
try:
    x.sum().cpu()
    res["readout"] = None
except Exception as e:
    res["readout"] = [type(e).__name__, str(e), isinstance(e, MemoryError), isinstance(e, RuntimeError)]
try:
    torch_nntile.wait()  # the readout reported it: nothing left to raise
    res["wait_after_readout"] = None
except Exception as e:
    res["wait_after_readout"] = str(e)
ok = torch.arange(6.0).to("nntile")
res["later"] = (ok * 2 + 1).sum().item()  # later work still runs
del x
y = torch.full((3 * 10**9,), 2.0, device="nntile")
torch_nntile.execute()
try:
    torch_nntile.wait()  # no readout: wait() raises it
    res["wait"] = None
except Exception as e:
    res["wait"] = [type(e).__name__, str(e), isinstance(e, MemoryError)]
res["after"] = (ok - 1).cpu().tolist()
print(json.dumps(res))
"""


def test_tile_without_memory_raises_at_readout_and_wait():
    """The reported case: 12 GB of ones in 8 GiB of address space hung forever inside
    StarPU. Now the read-back raises a MemoryError naming the op and the size, and
    later work still runs."""
    out = run_python(_NO_MEMORY, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    _no_crash(out.stderr)
    res = json.loads(out.stdout.splitlines()[-1])
    name, msg, is_mem, is_rt = res["readout"]
    assert name == "TileMemoryError" and is_mem and is_rt
    assert "RuntimeError" in res["cpu"][1]  # CPU PyTorch raises a RuntimeError: so do we
    assert "not enough memory for a tile of fill" in msg
    assert "you tried to allocate 12000000000 bytes (11.18 GiB)" in msg
    assert res["wait_after_readout"] is None
    assert res["later"] == 36.0
    name, msg, is_mem = res["wait"]
    assert name == "TileMemoryError" and is_mem
    assert "fill" in msg and "12000000000 bytes" in msg
    assert res["after"] == [-1.0, 0.0, 1.0, 2.0, 3.0, 4.0]


_SPARES_FREED = """
import json, resource
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # about 2 GB left once torch is in
import torch, torch_nntile
from torch_nntile.session import SESSION_STATE
torch_nntile.init_context(ncpu=2)
a = torch.empty(3 * 10**8, device="nntile")  # 1.2 GB (empty: one tile, no second fill)
a.sum().item()
del a  # its memory stays as a spare of that size
rt = SESSION_STATE.runtime()
before = sorted(k for k in rt._spares if k[0] == 3 * 10**8)
b = torch.empty(4 * 10**8, device="nntile")  # 1.6 GB: fits only once the spare is freed
b.sum().item()  # raises if b got no memory
print(json.dumps({"before": before, "after": sorted(k for k in rt._spares if k[0] == 3 * 10**8)}))
"""


@pytest.mark.slow
def test_spares_are_freed_before_an_allocation_fails():
    """Like PyTorch's caching allocators, memory kept for reuse is freed and the
    allocation tried again before a tile is declared out of memory."""
    out = run_python(_SPARES_FREED, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["before"] == [[3 * 10**8, 4]]  # the spare was there
    assert res["after"] == []  # and was freed to make room


# -- kernel errors in the middle of a graph -----------------------------------------


def _bad_nll() -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and a target with a class out of range: nll_loss raises inside its kernel."""
    return torch.randn(4, 3), torch.tensor([0, 1, 7, 2])


def test_kernel_error_poisons_dependents_only():
    logits, target = _bad_nll()
    with pytest.raises(IndexError) as cpu_err:
        F.nll_loss(logits, target)
    a = torch.randn(16, 16)
    an = a.to("nntile")
    torch_nntile.set_axis_group_name(an, {0: "fault_rows"})
    torch_nntile.set_axis_group_tiling("fault_rows", 4)
    loss = F.nll_loss(logits.to("nntile"), target.to("nntile"))  # fails when run
    before = (an @ an.t()).relu()  # recorded before, independent
    dep = loss * 2 + an.sum()  # depends on the failure
    per_row = F.nll_loss(logits.to("nntile"), target.to("nntile"), reduction="none")  # fails too
    chain = (per_row.unsqueeze(1) * torch.ones(1, 16).to("nntile")) @ an  # a native product reads it
    after = an * 3 - 1  # recorded after, independent
    torch_nntile.execute()
    assert_close(before.cpu(), (a @ a.t()).relu(), rtol=1e-5)  # nobody else's error
    assert_close(after.cpu(), a * 3 - 1)
    with pytest.raises(torch_nntile.KernelError, match=r"tile kernel of nll_loss_forward failed: IndexError: "
                                                       r"Target 7 is out of bounds") as err:
        dep.cpu()
    assert type(err.value.__cause__) is type(cpu_err.value)  # CPU's exception, as the cause
    with pytest.raises(torch_nntile.KernelError, match="nll_loss_forward"):
        chain.cpu()
    with pytest.raises(torch_nntile.KernelError, match="nll_loss_forward"):
        loss.item()  # the failed value itself, read again: raises again
    torch_nntile.wait()  # both failures were reported by readouts: nothing left
    assert_close((an + 1).cpu(), a + 1)  # the context stays usable


def test_wait_raises_failures_not_read_back():
    logits, target = _bad_nll()
    x = torch.randn(5)
    xn = x.to("nntile")
    loss = F.nll_loss(logits.to("nntile"), target.to("nntile"))
    good = xn.exp()
    torch_nntile.execute()
    with pytest.raises(torch_nntile.KernelError, match="tile kernel of nll_loss_forward failed"):
        torch_nntile.wait()
    torch_nntile.wait()  # reported once
    assert_close(good.cpu(), x.exp())
    with pytest.raises(torch_nntile.KernelError, match="nll_loss_forward"):
        loss.cpu()  # still has no value
    torch_nntile.wait()


def test_wait_counts_several_failures():
    x = torch.randn(6).to("nntile")
    a = _failing(x, ValueError("first"))
    b = _failing(x, ZeroDivisionError("second"))
    torch_nntile.execute()
    with pytest.raises(torch_nntile.KernelError, match=r"tile kernel of boom failed: (ValueError: first|"
                                                       r"ZeroDivisionError: second) \(and 1 more failures\)"):
        torch_nntile.wait()
    del a, b


def test_failed_tiles_are_reused_clean():
    """A failed value's handles go back to the spares; the next value written into
    them holds its own result, not the old failure."""
    x = torch.randn(8, 8)
    xn = x.to("nntile")
    torch_nntile.execute()
    torch_nntile.wait()
    bad = _failing(xn, RuntimeError("no"))
    with pytest.raises(torch_nntile.KernelError, match="boom failed: RuntimeError: no"):
        bad.cpu()
    del bad
    torch_nntile.wait()
    registered = torch_nntile.info()["tiles_registered"]
    good = xn + 1
    assert_close(good.cpu(), x + 1)
    assert torch_nntile.info()["tiles_registered"] == registered  # it took the failed value's tile


def test_in_place_update_of_a_failed_value_stays_failed():
    """An optimizer step on a parameter whose gradient failed: the parameter has no
    value any more, and says why, instead of holding garbage."""
    w = torch.randn(4, 4).to("nntile")
    g = _failing(w, ArithmeticError("bad gradient"))
    w.sub_(g, alpha=0.1)
    with pytest.raises(torch_nntile.KernelError, match="ArithmeticError: bad gradient"):
        w.cpu()
    torch_nntile.wait()


# -- Ctrl-C --------------------------------------------------------------------------


_INTERRUPTED = """
import sys, time, torch, torch_nntile
torch_nntile.init_context(ncpu=2)
x = torch.randn(2048, 2048).to("nntile")
torch_nntile.set_axis_group_name(x, {0: "r", 1: "c"})
torch_nntile.set_axis_group_tiling("r", 512)
torch_nntile.set_axis_group_tiling("c", 512)

def long_work():  # ~1.7 TFLOP: a minute or more on two cores
    y = x
    for _ in range(100):
        y = (y @ x) * 1e-3
    return y

y = long_work()
torch_nntile.execute()
print("in cpu", flush=True)
try:
    y.cpu()
    print("cpu finished", flush=True)
except KeyboardInterrupt:
    print("caught in cpu", flush=True)
z = long_work()
torch_nntile.execute()
print("in wait", flush=True)
try:
    torch_nntile.wait()
    print("wait finished", flush=True)
except KeyboardInterrupt:
    print("caught in wait", flush=True)
if len(sys.argv) > 1:  # uncaught: Python's own KeyboardInterrupt exit
    w = long_work()
    print("in item", flush=True)
    w.sum().item()
print("exiting", flush=True)
"""


def _interrupt_each_wait(*args: str) -> tuple[list[tuple[str, float]], int, str]:
    """Run ``_INTERRUPTED``; send SIGINT, as Ctrl-C does, 0.3 s after each "in ..." line.
    Returns (line, seconds since the last SIGINT or since "exiting") per line, the
    exit status and stderr."""
    proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[tuple[str, float]] = []
    sent = time.perf_counter()
    try:
        for raw in proc.stdout:
            line = raw.strip()
            now = time.perf_counter()
            lines.append((line, now - sent))
            if line.startswith("in "):
                time.sleep(0.3)
                sent = time.perf_counter()
                proc.send_signal(signal.SIGINT)
            elif line == "exiting":
                sent = now
        rc = proc.wait(timeout=60)
        lines.append(("exit", time.perf_counter() - sent))
    finally:
        if proc.poll() is None:
            proc.kill()
    return lines, rc, proc.stderr.read()


@pytest.mark.parametrize("how", ["signal", "raised"])
def test_ctrl_c_inside_a_tile_finalizer_is_not_lost(monkeypatch, how):
    """Ctrl-C can land while a dead value's tiles are handed back (a ``__del__``, where
    Python would report the KeyboardInterrupt and drop it): it is raised right after.
    ``signal``: SIGINT arrives there (our handler defers it); ``raised``: another
    handler raised KeyboardInterrupt there."""
    from torch_nntile.runtime.context import Runtime

    x = torch.randn(6, 5).to("nntile")
    y = x * 2
    y.cpu()

    if how == "signal":
        assert signal.getsignal(signal.SIGINT) is interrupts._sigint  # Python's own handler, wrapped
    hit = []
    release = Runtime.release

    def interrupted(self, handles):
        if not hit:
            hit.append(len(handles))
            if how == "raised":
                raise KeyboardInterrupt
            signal.raise_signal(signal.SIGINT)  # its handler runs here, inside the finalizer
        return release(self, handles)

    monkeypatch.setattr(Runtime, "release", interrupted)
    with pytest.raises(KeyboardInterrupt):
        del y  # its tiles are released here
        for _ in range(500):  # the interrupt is raised a moment later, not lost
            time.sleep(0.01)
    assert hit
    assert_close(x.cpu() * 2, (x * 2).cpu())  # the context goes on


def test_ctrl_c_interrupts_readout_and_wait():
    """SIGINT while a read-back or wait() blocks on a minute of matrix products:
    KeyboardInterrupt within a second (bound: 5 s), then a normal exit, soon, though
    the work was not done (what had not started is dropped at exit)."""
    lines, rc, err = _interrupt_each_wait()
    assert rc == 0, err[-3000:]
    _no_crash(err)
    names = [ln for ln, _ in lines]
    assert names == ["in cpu", "caught in cpu", "in wait", "caught in wait", "exiting", "exit"], (names, err[-2000:])
    latency = dict(lines)
    assert latency["caught in cpu"] < 5.0 and latency["caught in wait"] < 5.0, lines
    assert latency["exit"] < 30.0, lines  # not the minute of work left


@pytest.mark.parametrize("kind", ["readout", "wait"])
def test_ctrl_c_at_any_line_of_a_wait(kind):
    """A KeyboardInterrupt raised on entry to each Python function a read-back or a
    wait() calls, in turn (where a SIGINT's handler can run: Python looks for pending
    signals there): that is what the caller gets, never another error (``Condition.wait``
    interrupted between its wait and taking its lock back made "release unlocked
    lock"), and the session goes on with the right values."""
    x = torch.randn(64, 48)
    xn = x.to("nntile")
    hit = 0
    for n in range(2000):
        y = torch.tanh(xn @ xn.T) * 0.5
        events = [0]

        def tracer(frame, event, arg, n=n, events=events):
            f = frame
            while f is not None:
                if f.f_code in interrupts._FINALIZERS:  # deferred (test above): raised later
                    return
                f = f.f_back
            events[0] += 1  # only calls: tracing lines would raise where no handler runs
            if events[0] == n:
                interrupts._sigint(signal.SIGINT, frame)  # as a SIGINT arriving there

        sys.settrace(tracer)
        try:
            y.cpu() if kind == "readout" else torch_nntile.wait()
        except KeyboardInterrupt:
            hit += 1
        finally:
            sys.settrace(None)
        if events[0] < n:  # ran to its end before the n-th event
            break
        assert_close(y.cpu(), torch.tanh(x @ x.T) * 0.5)
    assert hit >= 10 and events[0] < n, (hit, n)


def test_uncaught_ctrl_c_exits_likerun_python():
    """Not caught, KeyboardInterrupt ends the process the way it ends a CPU-only Python
    program: killed by SIGINT after the interpreter cleaned up, traceback on stderr."""
    lines, rc, err = _interrupt_each_wait("uncaught")
    assert [ln for ln, _ in lines][-2:] == ["in item", "exit"], (lines, err[-2000:])
    assert rc == -signal.SIGINT, err[-3000:]
    assert "KeyboardInterrupt" in err
    _no_crash(err)


# -- exit with tasks in flight -------------------------------------------------------


_EXITS = """
import json, os, sys, threading
import torch, torch_nntile  # imported once; each child starts and ends its own StarPU

def work(tile):
    x = torch.randn(384, 384).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "r", 1: "c"})
    torch_nntile.set_axis_group_tiling("r", tile)
    torch_nntile.set_axis_group_tiling("c", tile)
    y = x
    for _ in range(12):
        y = (y @ x).relu() * 0.01
    return y

def variant(i):
    torch_nntile.init_context(ncpu=2)
    y = work(96 if i % 2 else 128)
    kind = i % 6
    if kind == 0:  # submitted, no wait
        torch_nntile.execute()
    elif kind == 1:  # a read-back returned; the rest of the work goes on
        loss = y.sum()
        z = (y @ y).exp()
        loss.item()
    elif kind == 2:  # tasks in flight and more recorded, not compiled
        torch_nntile.execute()
        z = y @ y
    elif kind == 3:  # compiled, never run
        torch_nntile.execute()
        z = work(128)
        torch_nntile.compile_graph()
    elif kind == 4:  # another thread is still reading back
        def reader():
            try:
                (y @ y).sum().item()
            except Exception:
                pass
        threading.Thread(target=reader, daemon=True).start()
    else:  # sys.exit from inside a wait (a progress callback)
        torch_nntile.execute()
        torch_nntile.wait(progress=lambda done, total: sys.exit(0))

n = int(sys.argv[1])
statuses = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        variant(i)
        break  # the child leaves the loop and ends like any script: the interpreter exits
    statuses.append(os.waitpid(pid, 0)[1])
else:
    print(json.dumps(statuses))
"""


def _exit_runs(n: int) -> None:
    out = subprocess.run([sys.executable, "-c", _EXITS, str(n)], capture_output=True, text=True,
                         timeout=60 + 10 * n)
    assert out.returncode == 0, out.stderr[-3000:]
    _no_crash(out.stderr)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    statuses = json.loads(out.stdout.splitlines()[-1])
    assert len(statuses) == n
    bad = [(i, os.waitstatus_to_exitcode(s)) for i, s in enumerate(statuses) if s != 0]
    assert not bad, f"runs that did not exit with status 0 (index, code): {bad}"


def test_exit_with_tasks_in_flight():
    """10 processes exit in the middle of their work in six ways; each exits with 0."""
    _exit_runs(10)


@pytest.mark.slow
def test_exit_with_tasks_in_flight_50_runs():
    _exit_runs(50)


def test_exit_with_tasks_in_flight_fresh_interpreter():
    out = run_python("""
        import torch, torch_nntile
        x = torch.randn(512, 512).to("nntile")
        y = x
        for _ in range(30):
            y = (y @ x).relu() * 0.01
        torch_nntile.execute()
        print("submitted")
    """)
    assert out.returncode == 0 and out.stdout.strip() == "submitted", out.stderr[-3000:]
    _no_crash(out.stderr)


# -- shutdown and a new context --------------------------------------------------------


_RESTART = """
import copy, json
import torch, torch.nn.functional as F, torch_nntile
from torch_nntile.nn.model import DeepReLU
from torch_nntile.session import SESSION_STATE
res = {}

def err(f):
    try:
        f()
        return None
    except Exception as e:
        return [type(e).__name__, str(e)]

torch_nntile.init_context(ncpu=2)
x = torch.ones(3).to("nntile")
res["first"] = (x * 2).cpu().tolist()
res["other_config_live"] = err(lambda: torch_nntile.init_context(ncpu=1))
res["same_config_live"] = err(lambda: torch_nntile.init_context(ncpu=2, cpu_fallback=True))
torch_nntile.shutdown_context()
res["tiles_live_after_shutdown"] = torch_nntile.info()["tiles_live"]
res["op_after_shutdown"] = err(lambda: x + 1)
res["read_after_shutdown"] = err(lambda: x.cpu())
res["new_after_shutdown"] = err(lambda: torch.ones(2, device="nntile"))
torch_nntile.init_context(ncpu=1)  # another configuration
res["ncpu"] = SESSION_STATE.runtime().ncpu
res["old_tensor_op"] = err(lambda: x + 1)
res["old_tensor_read"] = err(lambda: x.cpu())
torch.manual_seed(0)
model = DeepReLU(16, 32, 4, depth=2)
ref = copy.deepcopy(model)
model = model.to("nntile")
inp, lab = torch.randn(8, 16), torch.randint(0, 4, (8,))
opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
losses = []
for _ in range(3):
    loss = F.cross_entropy(model(inp.to("nntile")), lab.to("nntile"))
    loss.backward(); opt.step(); opt.zero_grad()
    r = F.cross_entropy(ref(inp), lab)
    r.backward(); ref_opt.step(); ref_opt.zero_grad()
    losses.append([loss.item(), r.item()])
res["losses"] = losses
torch_nntile.shutdown_context()
torch_nntile.init_context(ncpu=2, scheduler="eager")  # and a third
res["third"] = (torch.arange(4.0).to("nntile") * 3).cpu().tolist()
print(json.dumps(res))
"""


def test_use_after_shutdown_and_init_with_another_config():
    out = run_python(_RESTART)
    assert out.returncode == 0, out.stderr[-3000:]
    _no_crash(out.stderr)
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["first"] == [2.0, 2.0, 2.0]
    name, msg = res["other_config_live"]
    assert name == "RuntimeError" and "already initialized with ncpu=2" in msg and "shutdown_context()" in msg
    assert res["same_config_live"] is None  # the same workers: only cpu_fallback changes
    assert res["tiles_live_after_shutdown"] == 0  # every tile's memory was freed
    for key in ("op_after_shutdown", "read_after_shutdown", "new_after_shutdown"):
        name, msg = res[key]
        assert name == "RuntimeError" and "shut down" in msg, (key, msg)
    assert res["ncpu"] == 1
    for key in ("old_tensor_op", "old_tensor_read"):
        name, msg = res[key]
        assert name == "RuntimeError" and "made before shutdown_context()" in msg, (key, msg)
    for got, want in res["losses"]:
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), res["losses"]
    assert res["third"] == [0.0, 3.0, 6.0, 9.0]


# -- PyTorch's exceptions for mixed devices and shape mismatches -----------------------


def _raises_like_cpu(fn, args: list, match: str | None = None, same_message: bool = False) -> None:
    """``fn`` raises on nntile what it raises on CPU (the same exception type), when
    called, not later at a read-back; ``match`` must be in the message. With
    ``same_message``, CPU's message, alone or followed by a parenthesis in the words of
    the published torch_nntile (a linear bias of the wrong size)."""
    with pytest.raises(Exception) as cpu:
        fn(*args)
    dev = [a.to("nntile") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(Exception) as got:
        fn(*dev)
    assert type(got.value) is type(cpu.value), (got.value, cpu.value)
    if same_message:
        msg, want = str(got.value), str(cpu.value)
        assert msg == want or msg.startswith(want + " (") and msg.endswith(")"), (msg, want)
    if match is not None:
        assert match in str(got.value), str(got.value)


def _mixed(fn, nntile_args: list, cpu_args: list) -> None:
    """nntile and CPU (non-scalar) tensors in one call: the RuntimeError PyTorch raises
    for two devices (CUDA and CPU), when called."""
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        fn(*[a.to("nntile") for a in nntile_args], *cpu_args)


@pytest.mark.parametrize("case", ["add", "mul", "radd", "mm", "matmul", "linear", "addmm", "where", "add_"])
def test_mixed_devices_raise(case):
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    fns = {
        "add": (lambda x, y: x + y, [a], [b]),
        "mul": (torch.mul, [a], [b]),
        "radd": (lambda x, y: y + x, [a], [b]),
        "mm": (torch.mm, [a], [b]),
        "matmul": (torch.matmul, [a], [b]),
        "linear": (lambda w, x: F.linear(x, w), [a], [b]),
        "addmm": (lambda bias, x, y: torch.addmm(bias, x, y), [a, a], [b]),
        "where": (lambda c, x, y: torch.where(c > 0, x, y), [a, a], [b]),
        "add_": (lambda x, y: x.add_(y), [a], [b]),
    }
    fn, dev, cpu = fns[case]
    _mixed(fn, dev, cpu)


def test_mixed_devices_raise_through_the_cpu_fallback():
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    a, b = torch.randn(5), torch.randn(5)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.atan2(a.to("nntile"), b)  # not native: runs on the CPU fallback, which must not mix devices


def test_cpu_scalar_tensors_mix_in():
    """A 0-dim CPU tensor is a scalar to PyTorch on any device: allowed, as on CUDA."""
    a = torch.randn(3, 3)
    assert_close((a.to("nntile") * torch.tensor(2.0)).cpu(), a * 2)


@pytest.mark.parametrize("case", ["mm", "matmul", "at", "addmm", "linear", "linear_bias", "addmm_bias", "mv",
                                  "bmm", "add_inplace", "copy_", "view", "expand"])
def test_shape_mismatch_same_error_as_cpu(case):
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    cases = {
        "mm": (torch.mm, [a, b]),
        "matmul": (torch.matmul, [a, b]),
        "at": (lambda x, y: x @ y, [a, b]),
        "addmm": (torch.addmm, [torch.randn(3, 5), a, b]),
        "linear": (F.linear, [a, torch.randn(5, 3)]),
        "linear_bias": (F.linear, [a, torch.randn(5, 4), torch.randn(3)]),
        "addmm_bias": (torch.addmm, [torch.randn(4, 5), a, b.t()]),
        "mv": (torch.mv, [a, torch.randn(5)]),
        "bmm": (torch.bmm, [torch.randn(2, 3, 4), torch.randn(2, 5, 4)]),
        "add_inplace": (lambda x, y: x.add_(y), [torch.randn(1, 4), a]),
        "copy_": (lambda x, y: x.copy_(y), [a, b]),
        "view": (lambda x: x.view(5, 3), [a]),
        "expand": (lambda x: x.expand(5, 4), [a]),
    }
    fn, args = cases[case]
    _raises_like_cpu(fn, args, same_message=True)


@pytest.mark.parametrize("case", ["add", "mul", "sub", "where", "maximum"])
def test_broadcast_mismatch_same_error_as_cpu(case):
    fns = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "maximum": torch.maximum,
           "where": lambda x, y: torch.where(x > 0, x, y)}
    _raises_like_cpu(fns[case], [torch.randn(3, 4), torch.randn(5, 4)], same_message=True,
                     match="The size of tensor a (3) must match the size of tensor b (5) at non-singleton dimension 0")


# -- two threads at once ---------------------------------------------------------------


def _train_in_thread(kind: str, steps: int, out: dict) -> None:
    """``steps`` forward/backward/update steps on nntile and on CPU side by side."""
    try:
        g = torch.Generator().manual_seed(7 if kind == "relu" else 11)
        if kind == "relu":
            model = DeepReLU(24, 48, 6, depth=3)
            x, y = torch.randn(32, 24, generator=g), torch.randint(0, 6, (32,), generator=g)

            def loss_fn(m, a, b):
                return F.cross_entropy(m(a), b)
            make_opt = lambda p: torch.optim.SGD(p, lr=0.05)
        else:
            model = torch.nn.Sequential(torch.nn.Linear(20, 40), torch.nn.Tanh(), torch.nn.Linear(40, 5))
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            x, y = torch.randn(40, 20, generator=g), torch.randn(40, 5, generator=g)

            def loss_fn(m, a, b):
                return ((m(a) - b) ** 2).mean()
            make_opt = lambda p: torch.optim.Adam(p, lr=0.01)
        ref = copy.deepcopy(model)
        model = model.to("nntile")
        xn, yn = x.to("nntile"), y.to("nntile")
        name = f"thread_batch_{kind}"
        torch_nntile.set_axis_group_name(xn, {0: name})
        torch_nntile.set_axis_group_tiling(name, 8)
        opt, ref_opt = make_opt(model.parameters()), make_opt(ref.parameters())
        losses = []
        for _ in range(steps):
            loss = loss_fn(model, xn, yn)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            want = loss_fn(ref, x, y)
            want.backward()
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
            losses.append((loss.item(), want.item()))
        out["losses"] = losses
        out["params"] = [(p.detach().cpu(), q.detach()) for p, q in zip(model.parameters(), ref.parameters())]
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        out["error"] = exc


def test_two_threads_record_and_read_back_at_once():
    results: dict[str, dict] = {"relu": {}, "tanh": {}}
    threads = [threading.Thread(target=_train_in_thread, args=(k, 20, results[k]), name=f"train-{k}")
               for k in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a training thread hung"
    for kind, res in results.items():
        assert "error" not in res, (kind, res.get("error"))
        assert len(res["losses"]) == 20
        for got, want in res["losses"]:
            assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), (kind, got, want)
        for p, q in res["params"]:
            assert_close(p, q, rtol=1e-4)
