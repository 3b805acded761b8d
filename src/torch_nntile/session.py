"""The session: one runtime, one graph, and the compile / run / wait / readout cycle."""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.graph.dot import tensor_dot
from torch_nntile.graph.nodes import SESSION, DataNode, lower_pending
from torch_nntile.ops.data import readout
from torch_nntile.runtime.context import Runtime
from torch_nntile.tiling.tiles import Lowering

Progress = bool | Callable[[int, int], None] | None  # run/wait/execute(progress=...)


class Session:
    def __init__(self) -> None:
        self.rt: Runtime | None = None
        self.cpu_fallback = False
        self.shut_down = False
        self.compiled: Lowering | None = None
        self.lock = threading.RLock()
        self.config: tuple[Any, ...] | None = None
        self.progress: Callable[[int, int], None] | None = None  # set by run(progress=...), used by the next wait
        self._dumps = itertools.count()

    def init(self, ncpu: int, ncuda: int, cpu_fallback: bool, scheduler: str | None) -> None:
        if ncuda:
            raise ValueError(f"ncuda={ncuda}: this StarPU build has no CUDA workers; use ncuda=0")
        config = (ncpu, scheduler)
        if self.rt is not None and self.rt.alive:
            if config != self.config:
                raise RuntimeError(
                    f"torch_nntile context already initialized with ncpu={self.config[0]}, "
                    f"scheduler={self.config[1]!r}; call shutdown_context() first"
                )
            self.cpu_fallback = cpu_fallback
            return
        self.rt = Runtime(ncpu, scheduler)
        self.config = config
        self.cpu_fallback = cpu_fallback
        self.shut_down = False

    def runtime(self) -> Runtime:
        rt = self.rt
        if rt is None or not rt.alive:
            if self.shut_down:
                raise RuntimeError("torch_nntile: the context has been shut down; nntile tensors can no longer be used")
            self.init(2, 0, self.cpu_fallback, None)
            rt = self.rt
        return rt  # type: ignore[return-value]

    def compile(self) -> None:
        """Lower the pending graph into tile tasks (nothing runs yet)."""
        with self.lock:
            rt = self.runtime()
            t0 = stats.enter()
            try:
                folder = os.environ.get("TORCH_NNTILE_DUMP_GRAPH")
                if folder:
                    self._dump(folder)
                ctx = lower_pending(SESSION, lambda: Lowering(rt))
            finally:
                stats.leave("compile", t0)
            rt.recycle()
            if self.compiled is not None:
                self.compiled.tasks.extend(ctx.tasks)
                self.compiled.keep.extend(ctx.keep)
                self.compiled.labels.update(ctx.labels)
            else:
                self.compiled = ctx

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
        with self.lock:
            if progress is not None:
                self.progress = _hook(progress)
            if self.compiled is None:
                return
            ctx, self.compiled = self.compiled, None
            t0 = stats.enter()
            try:
                self.runtime().submit(ctx.tasks)
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
            return readout(self.runtime(), node)

    def shutdown(self) -> None:
        with self.lock:
            SESSION.take()
            self.compiled = None
            if self.rt is not None and self.rt.alive:
                self.rt.shutdown()
                self.shut_down = True


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
atexit.register(SESSION_STATE.shutdown)
