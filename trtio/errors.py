"""trtio's exceptions.

Every error trtio raises derives from :class:`TrtioError`, so callers can catch one type.
Messages name the tensor, binding, field or call involved and the values that were expected.
"""

from __future__ import annotations

__all__ = [
    "TrtioError",
    "CudaError",
    "CapacityError",
    "BindingError",
    "ShapeError",
    "ConfigError",
    "FrozenError",
    "EngineError",
    "ClosedError",
    "InvalidValueError",
    "InvalidTypeError",
    "UnknownNameError",
    "ExportError",
    "NotAvailableError",
]


class TrtioError(Exception):
    """Base class of every error trtio raises."""


class CudaError(TrtioError):
    """A CUDA call failed, or no CUDA device is usable.

    ``call`` is the API call that failed (``"cudaMalloc"``), ``name`` the CUDA error name
    (``"cudaErrorMemoryAllocation"``) or ``None`` when CUDA itself could not be loaded.
    """

    def __init__(self, call: str, name: str | None, detail: str = "") -> None:
        self.call = call
        self.name = name
        self.detail = detail
        text = f"{call}: {name}" if name else call
        if detail:
            text = f"{text}: {detail}"
        super().__init__(text)


class CapacityError(TrtioError):
    """A shape needs more bytes than a tensor's fixed capacity."""


class InvalidValueError(TrtioError, ValueError):
    """An argument has a value trtio cannot use: a pointer, a stream handle, a location, a fill value.

    The message names the object involved (tensor, stream, arena), the value, and what was expected.
    """


class InvalidTypeError(TrtioError, TypeError):
    """An argument has a type trtio cannot use (a config where an engine belongs, a str where a path list
    does); the message names the argument, the type given and what was expected."""


class UnknownNameError(TrtioError, KeyError):
    """A lookup by name found nothing (a tensor, a binding, a member); the message names it and what
    exists."""

    def __str__(self) -> str:  # KeyError quotes its argument; the message reads better as written
        return str(self.args[0]) if self.args else ""


class ExportError(TrtioError, BufferError):
    """A tensor cannot be exported through DLPack as asked (a copy, another device, a dtype DLPack cannot
    carry); a ``BufferError``, as the DLPack protocol requires."""


class NotAvailableError(TrtioError, AttributeError):
    """An attribute the object does not offer: an array interface of memory the interface cannot reach
    (``__cuda_array_interface__`` of host memory), or any attribute of a read-only object being set. An
    ``AttributeError``, so that ``hasattr`` and the array protocols' probes read it as absent."""


class ShapeError(TrtioError, ValueError):
    """A shape is malformed (negative, non-integer) or does not match what is required."""


class BindingError(TrtioError):
    """One or more engine bindings are wrong; ``problems`` lists every one found."""

    def __init__(self, engine: str, problems: list[str]) -> None:
        self.engine = engine
        self.problems = list(problems)
        head = f"{len(self.problems)} binding problem(s) for engine {engine!r}:"
        super().__init__("\n  - ".join([head, *self.problems]))


class ConfigError(TrtioError, ValueError):
    """A configuration field has a bad value; ``field`` names it and ``message`` says what is wrong
    (``str(error)`` is ``"field: message"``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class FrozenError(TrtioError):
    """Something would break the pointer-stability invariant after a tensor map was built."""


class EngineError(TrtioError):
    """An engine could not be loaded, or TensorRT reported a failure."""


class ClosedError(TrtioError):
    """An object was used after ``close()``."""
