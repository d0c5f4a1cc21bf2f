"""Reading a component's folder: its ``config.json`` and, where present, its ``preprocessor_config.json``, each error
naming the file and the key.

Every component's typed config (``trtio/components/<name>/*_config.py``) reads its folder the same way: the JSON
objects of the two files, and a :class:`~trtio.errors.ConfigError` raised while reading a file's keys re-raised
naming ``"<file>: <key>"``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trtio._json import read_json
from trtio.errors import ConfigError, InvalidTypeError

__all__ = ["PREPROCESSOR_FILE", "ComponentFiles", "keys_of"]

PREPROCESSOR_FILE = "preprocessor_config.json"


@contextlib.contextmanager
def keys_of(what: str) -> Iterator[None]:
    """A ConfigError raised inside, re-raised naming the file ``what`` before its key (``"<what>: <key>"``)."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc.field}" if exc.field else what, exc.message) from None


class ComponentFiles:
    """The two JSON files of a component's folder, read: ``data`` (its config, as read: the typed config checks it is
    an object) and ``preprocessor`` (a JSON object, or None where the folder has none), with their paths as the names
    errors give (``what``, ``preprocessor_what``)."""

    def __init__(self, call: str, path: str | os.PathLike[str], config_file: str) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidTypeError(f"{call}: expected a directory path, got {type(path).__name__}")
        root = Path(path)
        file, pre_file = root / config_file, root / PREPROCESSOR_FILE
        self.data: Any = read_json(file)
        pre = read_json(pre_file) if pre_file.is_file() else None
        if pre is not None and not isinstance(pre, Mapping):
            raise ConfigError(str(pre_file), f"expected a JSON object, got {type(pre).__name__}")
        self.preprocessor: Mapping[str, Any] | None = pre
        self.what, self.preprocessor_what = str(file), str(pre_file)
