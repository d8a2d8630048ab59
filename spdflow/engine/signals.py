"""SIGINT and SIGTERM: both stop a run like Ctrl-C, and the report says interrupted.

The handlers are spdflow's own (installed by the CLI at start and by every run), whatever the
process inherited: a shell starts background jobs with SIGINT ignored. Each signal is also
remembered, because an interrupt can be swallowed: a library import with a bare ``except:``
(torch and transformers are imported lazily, during export) ate Ctrl-C, and the run went on to
finish "ok". :meth:`SignalGuard.check` raises a remembered signal at every stage boundary, and
signals are deferred while the report is written, so the report on disk is always complete and
says what happened.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from spdflow.errors import RunInterrupted, RunTerminated

#: exit status by signal: 128 + the signal number, as shells report it
EXIT_CODES = {signal.SIGINT: RunInterrupted.exit_code, signal.SIGTERM: RunTerminated.exit_code}
DESCRIPTIONS = {signal.SIGINT: "interrupted by the user (Ctrl-C, SIGINT)", signal.SIGTERM: "terminated (SIGTERM)"}

_state = {"received": None, "deferring": 0}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so every stage cleans up the same way."""


def interrupt_for(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _handle(signum: int, frame) -> None:
    if _state["received"] is None:
        _state["received"] = signum
    if not _state["deferring"]:
        raise interrupt_for(signum)


def install() -> dict[int, object]:
    """Install the handlers (main thread only); returns the previous ones."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, _handle) for signum in EXIT_CODES}


class SignalGuard:
    """spdflow's handlers for the duration of one run; the remembered signal is cleared after it."""

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}

    @property
    def received(self) -> int | None:
        return _state["received"]

    def __enter__(self) -> "SignalGuard":
        self._previous = install()
        return self

    def __exit__(self, *exc) -> bool:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        _state["received"] = None
        return False

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals arriving inside are only remembered (see :meth:`check`)."""
        _state["deferring"] += 1
        try:
            yield
        finally:
            _state["deferring"] -= 1

    def check(self) -> None:
        """Raise the interrupt of a signal that arrived but did not stop the run (it was swallowed)."""
        if _state["received"] is not None and not _state["deferring"]:
            raise interrupt_for(_state["received"])

    def signum_of(self, exc: BaseException | None) -> int:
        """The signal behind an interrupt: the one received, else SIGTERM/SIGINT by type."""
        if _state["received"] is not None:
            return _state["received"]
        return signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
