"""The session: one runtime, one graph, and the compile / run / wait / readout cycle."""

from __future__ import annotations

import atexit
import threading
from typing import Any

import torch

from torch_nntile.graph.nodes import SESSION, DataNode, lower_pending
from torch_nntile.ops.data import readout
from torch_nntile.runtime.context import Runtime
from torch_nntile.tiling.tiles import Lowering


class Session:
    def __init__(self) -> None:
        self.rt: Runtime | None = None
        self.cpu_fallback = False
        self.shut_down = False
        self.compiled: Lowering | None = None
        self.lock = threading.RLock()
        self.config: tuple[Any, ...] | None = None

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
            ctx = lower_pending(SESSION, lambda: Lowering(rt))
            if self.compiled is not None:
                self.compiled.tasks.extend(ctx.tasks)
                self.compiled.keep.extend(ctx.keep)
            else:
                self.compiled = ctx

    def run(self) -> None:
        """Submit compiled tasks to StarPU and return at once."""
        with self.lock:
            if self.compiled is None:
                return
            ctx, self.compiled = self.compiled, None
            self.runtime().submit(ctx.tasks)

    def execute(self) -> None:
        with self.lock:
            self.compile()
            self.run()

    def wait(self) -> None:
        with self.lock:
            self.runtime().wait()

    def to_cpu(self, node: DataNode) -> torch.Tensor:
        """Flush everything pending, then gather ``node`` into a CPU tensor."""
        with self.lock:
            if node.value is None or SESSION.pending or self.compiled is not None:
                self.execute()
            return readout(self.runtime(), node)

    def shutdown(self) -> None:
        with self.lock:
            SESSION.take()
            self.compiled = None
            if self.rt is not None and self.rt.alive:
                self.rt.shutdown()
                self.shut_down = True


SESSION_STATE = Session()
atexit.register(SESSION_STATE.shutdown)
