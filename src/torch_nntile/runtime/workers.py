"""Waiting and the workers: idle StarPU workers poll, so they are paused whenever nothing
is queued (by ``wait()``, or by the pauser thread once the tasks of a run drain), and
every blocking wait goes in slices so that Ctrl-C gets through. See
docs/architecture/failures.md.
"""

from __future__ import annotations

import _thread
import os
import signal
import time
from collections.abc import Callable

from torch_nntile import stats
from torch_nntile.runtime.failures import _UNREPORTED, Failure, _new_failure
from torch_nntile.runtime.interrupts import SHIELD

SLICE_S = 0.05  # longest a blocking wait goes without looking at pending signals (Ctrl-C)
WORKER_NICE = 5
"""How much nicer than the process the CPU workers' threads run (``TORCH_NNTILE_WORKER_NICE``
overrides; 0 keeps them at the process's priority). The thread that records ops makes
the workers' work: where a worker and it share a core, the recording should run first.
At 0, on the 2-core machine a small GPT-2 step's main thread waited 18 ms a step for a
core held by busy workers (runnable, not running); at 5, about 8 ms (10-11 against 7
when the machine was quiet). 5, not more: against another process on its core, such
as a data loader's, a worker then still gets about a quarter of it."""


def _worker_nice() -> int:
    """WORKER_NICE, or ``TORCH_NNTILE_WORKER_NICE`` where set (an integer, 0 or more)."""
    text = os.environ.get("TORCH_NNTILE_WORKER_NICE")
    if text is None:
        return WORKER_NICE
    try:
        nice = int(text)
    except ValueError:
        nice = -1
    if nice < 0:
        raise ValueError(f"TORCH_NNTILE_WORKER_NICE must be an integer of 0 or more, got {text!r}")
    return nice


class Latch:
    """Set once, by any thread; waited for in slices by the thread Ctrl-C reaches.

    A raw lock, not a ``threading.Condition``: a KeyboardInterrupt raised at any line of
    ``wait`` leaves it consistent, whereas one raised inside ``Condition.wait`` after its
    wait and before it takes its lock back makes the ``with`` around it fail with
    "release unlocked lock" instead.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        """Called once (a second call does nothing)."""
        if not self._set:
            self._set = True  # before the release: a waiter that wakes sees it
            self._lock.release()

    def wait(self, timeout: float) -> bool:
        """Whether it is set, after waiting at most ``timeout`` seconds for it."""
        return self._set or self._lock.acquire(timeout=timeout) or self._set


class Done(Latch):
    """Set once a readout's task has run; ``failure`` is then the id of the failure
    its tiles held (0: they held values)."""

    __slots__ = ("failure",)

    def __init__(self) -> None:
        super().__init__()
        self.failure = 0



class Workers:
    """Pausing and resuming the workers, the pauser thread, and the waits: a part of
    ``Runtime`` (runtime/context.py sets up its state)."""

    def _kick(self) -> None:
        """Tasks went in: let the workers run them, and the pauser pause them afterwards."""
        with self._lock:
            if self.paused:
                self.lib.tnt_resume()
                self.paused = False
            self._epoch += 1
        self._drain.set()

    def _pause_when_drained(self) -> None:
        # Ctrl-C goes to the main thread (or another one that can act on it), not here.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        while True:
            self._drain.wait()
            with self._lock:
                if not self.alive:
                    return
                self._drain.clear()
                epoch = self._epoch
            self.lib.tnt_wait_all()
            with self._lock:
                if self.alive and epoch == self._epoch and not self.paused:
                    self.lib.tnt_pause()
                    self.paused = True
            with self._lock:
                if epoch > self._drained:
                    self._drained = epoch
                left = []
                for target, latch in self._waiters:
                    if target <= self._drained:
                        latch.set()
                    else:
                        left.append((target, latch))
                self._waiters = left
            self._trim_due()  # idle now

    def _wait_drained(self) -> int:
        """Block until every task submitted so far has run; return that submission count.

        Waits for a latch the pauser sets, in slices: Ctrl-C raises KeyboardInterrupt here
        within about SLICE_S while tasks still run (they go on).
        """
        latch = Latch()
        with self._lock:
            target = self._epoch
            if self._drained >= target:
                return target
            self._waiters.append((target, latch))
        self.wait_for(latch, self._pauser_gone)
        return target

    def _pauser_gone(self) -> bool:
        if self._pauser.is_alive():
            return False
        self.lib.tnt_wait_all()  # the pauser is gone (it never should be): wait here
        return True

    def wait_for(self, done: Latch, gone: Callable[[], bool] | None = None) -> None:
        """Block until ``done`` is set (or ``gone()``, asked after each slice), in slices:
        Ctrl-C gets through. Meanwhile the workers may share products
        (``tnt_host_waiting``): this thread leaves its core free."""
        self.lib.tnt_host_waiting(1)
        try:
            while not done.wait(SLICE_S):
                if gone is not None and gone():
                    break
                if self.ooc is not None:
                    self.check_stall()
        finally:
            self.lib.tnt_host_waiting(-1)

    def tasks_done(self) -> int:
        return sum(stats.DONE) + self.lib.tnt_gemm_done()

    def wait(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Wait for every submitted task; raise the first failure no readout has reported
        (a kernel's error naming its op, or a tile that got no memory).

        ``progress(done, total)`` is called about every 0.1 s while tasks remain.
        """
        self.check_alive()
        sub0, done0 = self._waited
        total = self.tasks_submitted - sub0
        if progress is not None:
            while (done := self.tasks_done() - done0) < total:
                progress(done, total)
                time.sleep(0.1)
                if self.ooc is not None:
                    self.check_stall()
        self.pause()
        self._waited = (self.tasks_submitted, self.tasks_done())
        if progress is not None:
            progress(total, total)
        self.raise_unreported()

    def raise_unreported(self) -> None:
        """Raise the first failure not reported yet (counting the others in its message)."""
        new = []
        with SHIELD:  # Ctrl-C waits: a failure taken from the queue is not lost
            while _UNREPORTED:
                f = _UNREPORTED.popleft()
                if not f.reported:
                    f.reported = True
                    new.append(f)
        if new:
            err = new[0].error()
            if len(new) > 1:
                err.args = (f"{err.args[0]} (and {len(new) - 1} more failures)",)
            raise err from new[0].exc

    def pause(self) -> None:
        """Wait for every submitted task, then keep the workers from polling."""
        target = self._wait_drained()
        with self._lock:
            if not self.paused and self._epoch == target:
                self.lib.tnt_pause()
                self.paused = True

    def abandon(self) -> None:
        """From now on tasks that have not started skip their kernels (what they write
        holds no value): for an exit, where nothing can read them any more."""
        if not self._abandoned:
            self._abandoned = True
            fid = _new_failure(Failure(None, note="the context was shut down before this value was computed"),
                               reported=True)
            self.lib.tnt_set_abandon(fid)
