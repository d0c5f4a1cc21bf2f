"""JSON files as trtio reads and writes its configs: strict JSON, errors that name the file and the key.

JSON has no NaN or Infinity (RFC 8259; Edge-LLM's C++ reader refuses them too), although Python's
reader takes them: :func:`read_json` refuses such a literal, naming its key, and :func:`write_json`
never writes one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from trtio.errors import ConfigError, InvalidTypeError

__all__ = ["json_kind", "read_json", "write_json"]


class _NonFinite:
    """What the JSON reader puts where a file says ``NaN``, ``Infinity`` or ``-Infinity``."""

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _find_non_finite(value: Any, key: str = "") -> tuple[str, str] | None:
    if isinstance(value, _NonFinite):
        return key, value.literal
    if isinstance(value, dict):
        for k, v in value.items():
            found = _find_non_finite(v, f"{key}.{k}" if key else str(k))
            if found is not None:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _find_non_finite(v, f"{key}[{i}]")
            if found is not None:
                return found
    return None


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON value in ``path``; :class:`ConfigError` naming the file for a missing, unreadable or
    invalid one, and the key too for a NaN or Infinity literal."""
    if not isinstance(path, (str, bytes, os.PathLike)):  # open() would take an int as a file descriptor
        raise InvalidTypeError(f"a config path must be a str or os.PathLike, got {type(path).__name__} {path!r}")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        data = json.loads(raw.decode("utf-8"), parse_constant=_NonFinite)
    except FileNotFoundError:
        raise ConfigError(str(path), "no such config file") from None
    except IsADirectoryError:
        hint = ""
        if any(os.path.isfile(os.path.join(path, name)) for name in ("config.json", "base_config.json")):
            hint = ("; it looks like an Edge-LLM engine directory: open it with "
                    "trtio.edgellm.EngineDir.open(path) (and .deployment(...) for a DeploymentConfig)")
        raise ConfigError(str(path), f"is a directory, not a config file{hint}") from None
    except PermissionError as exc:
        raise ConfigError(str(path), f"cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                                     f"{exc.start}); a JSON config is UTF-8") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), f"is not valid JSON: {exc}") from None
    found = _find_non_finite(data)
    if found is not None:
        key, literal = found
        raise ConfigError(f"{path}: {key}" if key else str(path),
                          f"is {literal}, which JSON does not allow; give a finite number")
    return data


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` to ``path`` as indented, strict JSON (no NaN or Infinity)."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, allow_nan=False)
        fh.write("\n")


def json_kind(value: Any) -> str:
    """How JSON names the type of ``value`` ("list" for a JSON array, "number", ...)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Sequence):
        return "list"
    return "null" if value is None else type(value).__name__
