"""Memory backends: ``cuda`` (cuda-python) and ``host`` (numpy), behind one small protocol."""

from trtio._cuda.backend import Backend, Location, get_backend

__all__ = ["Backend", "Location", "get_backend"]
