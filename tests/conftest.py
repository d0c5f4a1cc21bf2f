"""Shared fixtures: backends, and skipping of gpu / trt / rtx tests where they cannot run."""

from __future__ import annotations

import importlib.util
import os

import pytest

import trtio
from trtio.cuda.backend import Backend, cuda_available

try:  # GPU machines may run the gpu tests without hypothesis installed
    from hypothesis import settings
except ImportError:  # pragma: no cover - exercised where hypothesis is absent
    settings = None

# CI must not flake: the "ci" profile (the default) draws the same examples on every run and keeps
# no example database between runs. "dev" draws new examples each run (use it with --hypothesis-seed
# to sweep seeds: HYPOTHESIS_PROFILE=dev pytest --hypothesis-seed=N).
if settings is not None:
    settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True)
    settings.register_profile("dev", deadline=None, database=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _cuda_devices() -> int:
    from trtio.cuda.device import probe_device_count

    return probe_device_count() if cuda_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = cuda_available()
    trt = gpu and _has_module("tensorrt")
    rtx = _has_module("tensorrt_rtx")
    gpu2 = _cuda_devices() >= 2 if any("gpu2" in item.keywords for item in items) else False
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="no CUDA device answers here"))
        if "gpu2" in item.keywords and not gpu2:
            item.add_marker(pytest.mark.skip(reason="needs two CUDA devices"))
        if "trt" in item.keywords and not trt:
            item.add_marker(pytest.mark.skip(reason="needs full TensorRT and a CUDA device"))
        if "rtx" in item.keywords and not rtx:
            item.add_marker(pytest.mark.skip(reason="tensorrt_rtx is not installed"))


@pytest.fixture(params=["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each test using it runs on the host backend, and on the cuda backend where a GPU answers."""
    return trtio.get_backend(request.param)


@pytest.fixture(params=["host", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    """Each test using it runs on the host device of the reference engines, and on the GPU (CuPy) where one
    answers; a module may define its own."""
    if request.param == "gpu":
        pytest.importorskip("cupy")
    return str(request.param)


@pytest.fixture
def host() -> Backend:
    return trtio.get_backend("host")


@pytest.fixture
def cuda() -> Backend:
    if not cuda_available():
        pytest.skip("no CUDA device answers here")
    return trtio.get_backend("cuda")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything made before the first test (modules, test items, fixtures' parameters) lives until the end: kept
    out of the collector's generations, each ``gc.collect()`` the lifetime tests make walks only what the tests
    made (it walked the whole interpreter before, a third of the suite's time). The objects made before then are
    no longer traversed (garbage among them would stay); what the tests make is collected as before."""
    import gc

    gc.collect()
    gc.freeze()
