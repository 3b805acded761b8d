"""Ctrl-C that lands where raising it would lose work is raised a moment later.

``with SHIELD:`` defers a KeyboardInterrupt to the end of the outermost section; one
landing in a tile finalizer is raised in the main thread after it returns; elsewhere it
is raised at once. Installed only over Python's own SIGINT handler. See
docs/architecture/failures.md (Ctrl-C).
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from types import CodeType
from typing import Any

_FINALIZERS: set[CodeType] = set()  # code of the finalizers that release tiles
_MAIN = threading.main_thread().ident
_depth = 0  # shielded sections the main thread is in
_held = False  # a SIGINT arrived inside one


def in_finalizer(*codes: CodeType) -> None:
    """Register the code of finalizers that release tiles: a KeyboardInterrupt landing in
    one is raised in the main thread just after it returns, instead of being reported
    and dropped by Python. See docs/architecture/failures.md (Ctrl-C)."""
    _FINALIZERS.update(codes)


def _interrupt_after(left: threading.Event) -> None:
    left.wait()
    time.sleep(0.005)  # the finalizer's last lines run meanwhile (it holds the interpreter)
    _thread.interrupt_main()


def interrupt_later() -> None:
    """Raise KeyboardInterrupt in the main thread a moment from now (for a finalizer
    that caught one raised by a handler other than ours)."""
    left = threading.Event()
    threading.Thread(target=_interrupt_after, args=(left,), daemon=True).start()
    left.set()


class Shield:
    """``with SHIELD:``: a SIGINT arriving inside is raised as KeyboardInterrupt when the
    outermost section ends (a moment later if that end is an exception). Re-entrant;
    only the main thread's sections count, as only it runs signal handlers."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _depth
        if _thread.get_ident() == _MAIN:
            _depth += 1

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        global _depth, _held
        if _thread.get_ident() != _MAIN:
            return
        _depth -= 1
        if _depth == 0 and _held:
            _held = False
            if kind is None:
                raise KeyboardInterrupt
            interrupt_later()  # the exception under way is raised first


SHIELD = Shield()


def _sigint(signum: int, frame: Any) -> None:
    global _held
    if _depth:
        _held = True
        return
    f = frame
    for _ in range(8):  # the finalizer, or what it calls
        if f is None:
            break
        if f.f_code in _FINALIZERS:
            interrupt_later()
            return
        f = f.f_back
    raise KeyboardInterrupt


def install() -> None:
    """Put ``_sigint`` in place of Python's own SIGINT handler (only that one)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _sigint)
