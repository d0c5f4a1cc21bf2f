"""Where memory lives: :class:`Location`. Import it from :mod:`trtio._cuda.backend`.

It sits beneath the backend protocol and both backends (:mod:`trtio._cuda.device`,
:mod:`trtio._cuda.host`), which all take a Location, so that :mod:`trtio._cuda.backend` can build
either backend without an import cycle.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

from trtio.errors import InvalidValueError

__all__ = ["Location", "LocationLike"]


class Location(enum.Enum):
    """Where a tensor's memory lives."""

    DEVICE = "device"
    PINNED = "pinned"  # page-locked host memory; async copies, visible to the device
    HOST = "host"  # pageable host memory (host-located engine tensors, tests)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def coerce(cls, value: LocationLike, what: str = "location") -> Location:
        """A Location from a member, its value (``"device"``) or its name (``"DEVICE"``).

        Anything else raises :class:`InvalidValueError` naming ``what`` and the locations that exist.
        """
        if isinstance(value, Location):
            return value
        if isinstance(value, str):
            found = _LOCATIONS.get(value.lower())
            if found is not None:
                return found
        raise InvalidValueError(
            f"{what}: {value!r} is not a memory location; expected one of "
            + ", ".join(repr(m.value) for m in cls) + " (trtio.Location.DEVICE, PINNED, HOST)")


LocationLike: TypeAlias = "Location | str"
_LOCATIONS = {m.value: m for m in Location}
