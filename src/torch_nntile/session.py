"""The session: one runtime, one graph, and the compile / run / wait / readout cycle.

A context can be shut down and started again with another configuration; tensors of
the old context are then dead (``generation`` tells them apart). At process exit the
work still in flight is dropped: nothing can read it any more.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import itertools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.graph import axes
from torch_nntile.graph.dot import tensor_dot
from torch_nntile.graph.nodes import SESSION, DataNode, lower_pending
from torch_nntile.ops.data import readout
from torch_nntile.ops.fusion import fuse_elementwise
from torch_nntile.runtime.context import Runtime, built_with_cuda
from torch_nntile.runtime.interrupts import SHIELD
from torch_nntile.runtime.ooc import OutOfCore
from torch_nntile.tiling.reuse import StepCache
from torch_nntile.tiling.tiles import Lowering

Progress = bool | Callable[[int, int], None] | None  # run/wait/execute(progress=...)
FLUSH_OPS = 256
"""Pending ops at which recording lowers and submits what it has and goes on: the
workers run the start of a long program (a forward pass) while Python records the
rest, instead of waiting for the first read-back. Small graphs are not split, so
they keep whole-graph pruning and fusion."""
THREAD_FLUSH_OPS = 16
"""Pending ops at which recording on a new thread first lowers and submits what the
previous thread recorded (``Session.thread_switched``)."""


class _GcPaused:
    """``with GC_PAUSED:`` Python's cyclic collector does not run inside (re-entrant; it
    is left as found). A compile builds and drops large young containers (task lists,
    the reuse key's tables): a collection started inside traverses them all, about a
    millisecond each time, and they are freed by reference counting anyway."""

    __slots__ = ("depth", "was_enabled")

    def __init__(self) -> None:
        self.depth, self.was_enabled = 0, False

    def __enter__(self) -> None:
        if self.depth == 0:
            self.was_enabled = gc.isenabled()
            gc.disable()
        self.depth += 1

    def __exit__(self, *exc: Any) -> None:
        self.depth -= 1
        if self.depth == 0 and self.was_enabled:
            gc.enable()


GC_PAUSED = _GcPaused()


def default_ncpu() -> int:
    """One CPU worker per core this process may run on, or StarPU's ``STARPU_NCPU`` where
    it is set. The workers run at a lower priority than the process
    (``TORCH_NNTILE_WORKER_NICE``), so the thread recording ops takes a core from them
    when it needs one instead of having one kept idle for it."""
    env = os.environ.get("STARPU_NCPU", "").strip()
    if env.lstrip("-").isdigit() and int(env) > 0:
        return int(env)
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may run on
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_ncuda() -> int:
    """``TORCH_NNTILE_NCUDA`` (a count of GPUs, -1 for all), else 0: CPU workers alone
    unless asked for, so that a CUDA build behaves as the CPU one where nothing says so."""
    text = os.environ.get("TORCH_NNTILE_NCUDA", "").strip()
    try:
        return int(text) if text else 0
    except ValueError:
        raise ValueError(f"TORCH_NNTILE_NCUDA={text!r}: a count of GPUs, or -1 for every GPU") from None


class Session:
    def __init__(self) -> None:
        self.rt: Runtime | None = None
        self.cpu_fallback = False
        self.tiled_only = False  # ops with no tiled kernel raise (see backend/fallback.py)
        self.shut_down = False
        self.compiled: Lowering | None = None
        self.lock = threading.RLock()
        self.config: tuple[Any, ...] | None = None
        self.progress: Callable[[int, int], None] | None = None  # set by run(progress=...), used by the next wait
        self.generation = 0  # shutdowns so far: a tensor made in an earlier generation has no value any more
        self.flush_ops = FLUSH_OPS  # see flush_early; sys.maxsize after one failed, until an explicit compile
        self._dumps = itertools.count()
        self.tracer: Any = None  # capture: sees every batch of tasks submitted and every value read back
        self.steps: StepCache | None = None  # lowered steps of this runtime, for reuse
        self.thread = 0  # the thread that recorded the last op (see thread_switched)
        self.thread_flush_ops = THREAD_FLUSH_OPS
        self.eager = False  # init_context(runtime_mode="eager"): every op runs, and is waited for, as it is recorded

    def init(self, ncpu: int | None, ncuda: int | None, cpu_fallback: bool, scheduler: str | None,
             ooc: OutOfCore | None = None, tiled_only: bool = False, eager: bool | None = None,
             verbose: int = 0) -> None:
        if ncuda is None:
            ncuda = default_ncuda()
        if ncuda and not built_with_cuda():
            raise ValueError(f"ncuda={ncuda}: this build's StarPU has no CUDA workers (see built_with_cuda()); "
                             "use ncuda=0, or the CUDA build")
        if ncpu is None or ncpu == -1:  # -1: every core, as the reference's default
            ncpu = default_ncpu()
        config = (ncpu, scheduler, ooc, ncuda)
        if self.live_runtime() is not None:
            if config != self.config:
                raise RuntimeError(
                    f"init_context: the torch_nntile context is already initialized with ncpu={self.config[0]}, "
                    f"ncuda={self.config[3]}, scheduler={self.config[1]!r}, out of core {self.config[2]}; "
                    "call shutdown_context() first to "
                    f"start one with ncpu={ncpu}, ncuda={ncuda}, scheduler={scheduler!r}, out of core {ooc}"
                )
            self.cpu_fallback, self.tiled_only = cpu_fallback, tiled_only
            self._set_mode(eager)
            return
        self.rt = Runtime(ncpu, scheduler, ooc, ncuda)
        self._set_mode(eager)
        self.steps = StepCache()
        self.config = config
        self.cpu_fallback, self.tiled_only = cpu_fallback, tiled_only
        self.shut_down = False
        if verbose:
            rt = self.rt
            print(f"torch_nntile: StarPU started with {rt.ncpu} CPU and {rt.ncuda} CUDA worker(s), scheduler "
                  f"{rt.scheduler}, rank {rt.rank} of {rt.world_size}, "
                  f"{'eager' if self.eager else 'graph'} mode, CPU fallback {'on' if cpu_fallback else 'off'}"
                  + (f", out of core {ooc}" if ooc is not None else ""), flush=True)

    def _set_mode(self, eager: bool | None) -> None:
        """Eager (every op flushed and waited for) or graph mode; None keeps the current one."""
        if eager is not None:
            self.eager = eager
            self._reset_flush()

    def _reset_flush(self) -> None:
        """Flush early again after ``FLUSH_OPS`` ops (after every op in eager mode)."""
        self.flush_ops = 1 if self.eager else FLUSH_OPS

    def live_runtime(self) -> Runtime | None:
        """The running runtime, or None (nothing is started)."""
        rt = self.rt
        return rt if rt is not None and rt.alive else None

    def runtime(self) -> Runtime:
        rt = self.rt
        if rt is None or not rt.alive:
            if self.shut_down:
                raise RuntimeError("torch_nntile: the context has been shut down; nntile tensors can no longer be used")
            self.init(None, None, self.cpu_fallback, None, tiled_only=self.tiled_only)
            rt = self.rt
        return rt  # type: ignore[return-value]

    def compile(self) -> None:
        """Lower the pending graph into tile tasks (nothing runs yet)."""
        with self.lock:
            self._reset_flush()
            self._compile()

    def flush_early(self) -> None:
        """Compile and run the pending graph in the middle of recording (``FLUSH_OPS``).

        Nothing changes for the program: values are the same either way, and an error
        the compile meets (an invalid tiling) is left where it would have been raised
        without this, at the next compile the program asks for (the graph stays
        pending, and recording stops flushing early until then)."""
        with self.lock:
            if self.live_runtime() is None:
                return
            if self.eager:  # a debugging mode: the op's own errors, kernel ones too, raise at the op
                self.execute()
                self.wait()
                return
            try:
                self._compile()
            except Exception:  # noqa: BLE001 - raised again by the next compile of the same graph
                self.flush_ops = sys.maxsize
                return
            self.run()

    def thread_switched(self, thread: int) -> None:
        """An op is about to be recorded on ``thread``, another thread than the last op's.

        In a training step that marks the end of a phase: ``loss.backward()`` records
        on autograd's device thread once the forward is complete, and the optimizer
        step on the caller's thread once the backward is. The workers start on the
        finished phase while the next one is recorded, instead of waiting for the
        readout at the end of the step (measured: the loss readout then waits for the
        forward's last ops only). A graph of a few ops is left to grow."""
        self.thread = thread
        if len(SESSION.pending) >= self.thread_flush_ops:
            self.flush_early()

    def _compile(self) -> None:
        with self.lock, SHIELD, GC_PAUSED:  # Ctrl-C waits for the end: stopped half-way, ops were lost
            rt = self.runtime()
            if rt.distributed and SESSION.pending:
                rt.agree("compile", [_describe(op) for op in SESSION.pending])
            t0 = stats.enter()
            try:
                folder = os.environ.get("TORCH_NNTILE_DUMP_GRAPH")
                if folder:
                    self._dump(folder)
                ctx = lower_pending(SESSION, lambda: Lowering(rt), fuse_elementwise, self.steps)
            finally:
                stats.leave("compile", t0)
            if self.compiled is not None:
                self.compiled.reused = None  # two compiles' tasks: prepared as one batch
                self.compiled.tasks.extend(ctx.tasks)
                self.compiled.keep.extend(ctx.keep)
                self.compiled.labels.update(ctx.labels)
            else:
                self.compiled = ctx
            rt.recycle()

    def _dump(self, folder: str) -> None:
        """TORCH_NNTILE_DUMP_GRAPH=folder: the tensor graph of every compile as DOT."""
        ops = SESSION.snapshot()
        if ops:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"graph_{os.getpid()}_{next(self._dumps):05d}.dot")
            with open(path, "w") as f:
                f.write(tensor_dot(ops))

    def run(self, progress: Progress = None) -> None:
        """Submit compiled tasks to StarPU and return at once.

        ``progress`` (a callback ``(done, total)``, or True for a bar on stderr) is
        reported by the next ``wait()``.
        """
        with self.lock, SHIELD, GC_PAUSED:  # Ctrl-C waits for the end: stopped half-way, tasks were lost
            if progress is not None:
                self.progress = _hook(progress)
            ctx = self.compiled
            if ctx is None:
                return
            rt = self.runtime()
            t0 = stats.enter()
            try:
                rt.sent = 0
                self.compiled = None
                if self.tracer is not None:
                    self.tracer.tasks(ctx.tasks)
                if ctx.reused is not None:
                    ctx.reused.submit(rt, ctx.tasks)
                else:
                    rt.submit(ctx.tasks)
            except BaseException:
                if rt.sent == 0:  # nothing reached StarPU (e.g. Ctrl-C): the next run() submits it
                    self.compiled = ctx
                raise
            finally:
                stats.leave("run", t0)

    def execute(self, progress: Progress = None) -> None:
        with self.lock:
            self.compile()
            self.run(progress)

    def wait(self, progress: Progress = None) -> None:
        with self.lock:
            hook = _hook(progress) or self.progress
            self.progress = None
            t0 = stats.enter()
            try:
                self.runtime().wait(hook)
            finally:
                stats.leave("wait", t0)

    def to_cpu(self, node: DataNode) -> torch.Tensor:
        """Flush everything pending, then gather ``node`` into a CPU tensor."""
        with self.lock:
            if node.value is None or SESSION.pending or self.compiled is not None:
                self.execute()
            if self.progress is not None:
                self.wait()  # run(progress=...) reports through the wait of its value
            rt = self.runtime()
            alone = rt.distributed and not rt.agree_read(f"a value of shape {list(node.shape)} and dtype {node.dtype}",
                                                         node.value.handles)
            with rt.alone() if alone else contextlib.nullcontext():  # alone: the others sent its tiles (runtime/agree.py)
                cpu = readout(rt, node)
            if self.tracer is not None:
                self.tracer.read(node.value, cpu)
            return cpu

    def empty_cache(self) -> None:
        with self.lock:
            self.runtime().empty_cache()

    def has_pending(self) -> bool:
        """Whether ops were recorded (or compiled) that have not been submitted yet."""
        return bool(SESSION.pending) or self.compiled is not None

    def reset(self) -> None:
        """Submit what is pending and wait for everything (no value is lost), then forget
        the tilings and distributions set and the lowered steps kept for reuse."""
        with self.lock:
            if self.live_runtime() is not None:
                self.execute()
                self.wait()
                self.steps = StepCache()
            axes.clear_all()

    def shutdown(self, abandon: bool = False) -> None:
        """Stop the runtime after its tasks (``abandon``: skip those not started yet)."""
        with self.lock:
            SESSION.take()
            self.compiled = None
            if self.live_runtime() is not None:
                self.generation += 1
                self.shut_down = True
                self.steps = None
                self.rt.shutdown(abandon)

    def at_exit(self) -> None:
        """Process exit: tasks that have not started are dropped (no one can read their
        values); failures no one read back are named on stderr."""
        rt = self.rt
        try:
            if rt is not None and rt.alive and not rt.distributed:  # over several ranks, after they agree
                rt.abandon()  # first, without the lock: a thread still reading back then finishes at once
            self.shutdown(abandon=True)
        except Exception as exc:  # noqa: BLE001 - exiting: report, do not raise
            sys.stderr.write(f"torch_nntile: at exit: {exc}\n")
            if rt is not None and rt.alive and rt.distributed:  # the others would wait for this rank forever
                sys.stderr.flush()
                rt.lib.tnt_mpi_abort(1)


def _describe(op: Any) -> str:
    """An op as the ranks compare it (runtime/agree.py): its name, its attributes (a
    scalar's value too, not a CPU tensor's data: the tile's owner copies its own) and
    its results' shapes."""
    outs = ", ".join(f"{list(o.shape)} {o.dtype}" for o in op.outputs)
    return f"{op.label}{_attr_text(op.attrs)} -> {outs}"


def _attr_text(x: Any, depth: int = 0) -> str:
    """``x`` as text that is the same in every process (no addresses)."""
    if x is None or isinstance(x, (bool, int, float, str, complex, torch.dtype)):
        return repr(x)
    if isinstance(x, (tuple, list)) and depth < 4:
        return "(" + ",".join(_attr_text(y, depth + 1) for y in x[:16]) + (",..." if len(x) > 16 else "") + ")"
    if isinstance(x, torch.Tensor):
        return f"tensor{list(x.shape)}{x.dtype}"
    fn, params = getattr(x, "fn", None), getattr(x, "params", None)
    if fn is not None and params is not None and depth < 4:  # a Kernel: its function and parameters
        return f"{_attr_text(fn, depth + 1)}{_attr_text(params, depth + 1)}"
    name = getattr(x, "__qualname__", None) or getattr(x, "__name__", None)
    return name if isinstance(name, str) else type(x).__name__


def _hook(progress: Progress) -> Callable[[int, int], None] | None:
    """A progress argument as a callback: True is the stderr bar, False/None none."""
    return progress_bar if progress is True else progress or None


def progress_bar(done: int, total: int) -> None:
    """The ``progress=True`` display: one line on stderr, redrawn in place."""
    width = 30
    fill = width * done // total if total else width
    sys.stderr.write(f"\rtorch_nntile [{'#' * fill}{'.' * (width - fill)}] {done}/{total} tasks")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


SESSION_STATE = Session()
atexit.register(SESSION_STATE.at_exit)
