"""Test helper: a call made from a second thread while a step of the first is inside its engine."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest


def from_another_thread_inside(monkeypatch: pytest.MonkeyPatch, call: Callable[[], Any]) -> list[Any]:
    """Patch the engine call so that the first one runs ``call`` on a second thread (and waits for it): what
    that call returned or raised, once the patched step has run."""
    from trtio.engine import EngineExecutor

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
