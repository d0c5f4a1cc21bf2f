"""Test helpers for threads: a call made from a second thread while a step of the first is inside its engine,
and calls run on several threads at once with thread switches as frequent as the interpreter allows."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest


def from_another_thread_inside(monkeypatch: pytest.MonkeyPatch, call: Callable[[], Any]) -> list[Any]:
    """Patch the engine call so that the first one runs ``call`` on a second thread (and waits for it): what
    that call returned or raised, once the patched step has run."""
    from trtio._engine import EngineExecutor

    seen: list[Any] = []
    real = EngineExecutor.execute

    def execute(self: Any, *args: Any, **kw: Any) -> Any:
        if not seen:
            def other() -> None:
                try:
                    seen.append(call())
                except BaseException as exc:  # noqa: BLE001 - what the test looks at
                    seen.append(exc)
            t = threading.Thread(target=other)
            t.start()
            t.join()
        return real(self, *args, **kw)

    monkeypatch.setattr(EngineExecutor, "execute", execute)
    return seen


def run_at_once(calls: list[Callable[[], Any]]) -> None:
    """Run each of ``calls`` on a thread of its own, all at once, switching threads as often as the interpreter
    allows; returns when every thread has ended (each call records its own failures)."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=call) for call in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
