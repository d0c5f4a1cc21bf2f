"""The one integer check: what trtio accepts where it takes a whole number.

A Python ``int`` or a NumPy integer scalar (``np.int64(3)`` from an array) counts; ``bool`` and
``np.bool_`` do not (``True`` as a size or an index is always a mistake), nor do floats, even whole
ones (``int()`` would take ``1.5`` for ``1``).
"""

from __future__ import annotations

from typing import Any, TypeGuard

import numpy as np

from trtio.errors import ConfigError, ShapeError, TrtioError

__all__ = ["check_int", "is_int"]


def is_int(value: Any) -> TypeGuard[int | np.integer[Any]]:
    """True for an ``int`` or a NumPy integer scalar, False for bools and everything else."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(value: Any, what: str, *, minimum: int | None = None, maximum: int | None = None,
              error: type[TrtioError] = ShapeError) -> int:
    """``value`` as a Python int, checked by :func:`is_int` and against ``minimum`` / ``maximum``
    (inclusive); otherwise ``error`` (a :class:`ShapeError` by default) naming ``what``, the value and the
    range expected. A :class:`ConfigError` gets ``what`` as its field."""
    if minimum is not None and maximum is not None:
        want = f"an integer in {minimum}..{maximum}"
    elif minimum is not None:
        want = f"an integer >= {minimum}"
    elif maximum is not None:
        want = f"an integer <= {maximum}"
    else:
        want = "an integer"
    if not is_int(value):
        raise _error(error, what, f"expected {want}, got {type(value).__name__} {value!r}")
    v = int(value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise _error(error, what, f"expected {want}, got {v}")
    return v


def _error(error: type[TrtioError], what: str, message: str) -> TrtioError:
    if issubclass(error, ConfigError):
        return error(what, message)
    return error(f"{what}: {message}")
