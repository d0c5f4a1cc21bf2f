"""Shared fixtures: backends, and skipping of gpu / trt / rtx tests where they cannot run; the record of the tests
that skipped for want of a package, which ``--rerun-import-skips`` runs again."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

import trtio
from trtio._cuda.backend import Backend, cuda_available

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
    from trtio._cuda.device import probe_device_count

    return probe_device_count() if cuda_available() else 0


# A test that skips because a package is missing (pytest.importorskip's "could not import 'torch'", or a skip whose
# reason says "torch is not installed") is recorded in pytest's cache when the run ends, as --lf records failures;
# --rerun-import-skips runs only the tests the last run recorded. .ci/run runs the README's test command in a fresh
# virtual environment (a newcomer's: the torch, transformers and Pillow tests skip), installs .ci/requirements.txt,
# then runs what those packages enable with --rerun-import-skips, so that nothing runs twice.
IMPORT_SKIPS = "trtio/import-skips"
_MISSING_PACKAGE = re.compile(r"could not import '|\bnot installed\b")
_import_skips: set[str] = set()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rerun-import-skips", action="store_true",
                     help="run only the tests the last run skipped because a package could not be imported "
                          "(.ci/run: after installing .ci/requirements.txt)")


def _skipped_for_a_package(report: pytest.CollectReport | pytest.TestReport) -> bool:
    if not report.skipped or hasattr(report, "wasxfail"):
        return False
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return _MISSING_PACKAGE.search(reason) is not None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _skipped_for_a_package(report):  # under xdist the controller sees every worker's reports too
        _import_skips.add(report.nodeid)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _skipped_for_a_package(report):  # a module that skips as a whole: its node id is its path
        _import_skips.add(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if cache is not None and not hasattr(session.config, "workerinput"):  # the controller writes, no xdist worker
        cache.set(IMPORT_SKIPS, sorted(_import_skips))


def _select_import_skips(config: pytest.Config, items: list[pytest.Item]) -> None:
    cache = getattr(config, "cache", None)
    recorded = cache.get(IMPORT_SKIPS, None) if cache is not None else None
    if recorded is None:
        raise pytest.UsageError("--rerun-import-skips: no run recorded the tests it skipped for want of a package "
                                "(run pytest without it first, with pytest's cache on)")
    wanted = set(recorded)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:  # the test itself, or its whole module where that skipped at collection
        (kept if item.nodeid in wanted or item.nodeid.split("::")[0] in wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("rerun_import_skips"):
        _select_import_skips(config, items)
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
