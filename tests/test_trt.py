import enum
import gc
import importlib.util
import logging
import os
import types
import weakref
from pathlib import Path

import numpy as np
import pytest

import trtio._trt
from trtio import EngineError
from trtio._trt import import_trt, load_engine, load_plugins, loaded_plugins, module_of, plan_format, trt_logger

HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None


def test_unknown_module_name_is_one_clear_error():
    with pytest.raises(EngineError,
                       match=r"unknown TensorRT module 'trt'; expected 'auto', 'tensorrt' or 'tensorrt_rtx'"):
        import_trt("trt")


def test_module_object_passes_through():
    import math

    assert import_trt(math) is math


def test_missing_and_empty_plan_files(tmp_path):
    with pytest.raises(EngineError, match=r"plan file '.*nope.plan' does not exist"):
        load_engine(tmp_path / "nope.plan")
    empty = tmp_path / "empty.plan"
    empty.write_bytes(b"")
    with pytest.raises(EngineError, match="is empty"):
        load_engine(empty)
    with pytest.raises(EngineError, match="is a directory"):
        load_engine(tmp_path)


@pytest.mark.rtx
def test_corrupt_plan_names_file_size_and_tensorrt_reason(tmp_path, caplog):
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"vtrt but not a plan at all")  # a plan's magic, then garbage: only TensorRT can tell
    with caplog.at_level(logging.ERROR, logger="trtio.trt"):
        with pytest.raises(EngineError) as info:
            load_engine(bad, module="tensorrt_rtx")
    msg = str(info.value)
    assert "bad.plan" in msg and "26 bytes" in msg and "tensorrt_rtx" in msg and "corrupt or truncated" in msg
    assert any(r.name == "trtio.trt" for r in caplog.records), "TensorRT's log is bridged to trtio.trt"


@pytest.mark.parametrize("data,hint", [
    (b"\x00\x01garbage", ""),
    (b"\x7fELF\x02\x01\x01\x00" + bytes(56), "an ELF shared library (a plugin library goes in plugins=, not here)"),
    (b'{"engine_role": "llm"}', "it looks like JSON text (a config?)"),
    (b"\x08\x07\x12\x07pytorch", "it may be an ONNX model"),
    (b"\x10\x00\x00\x00meta-json-here..ftrt\x00\x00\x00\x00", "a TensorRT plan seems to start at byte 20"),
])
def test_a_file_that_is_not_a_plan_is_refused_before_tensorrt(tmp_path, data, hint):
    """No TensorRT (and no GPU) is needed to see that these are not plans; TensorRT would only say
    "no CUDA device" on a machine without one."""
    path = tmp_path / "model.plan"
    path.write_bytes(data)
    with pytest.raises(EngineError) as info:
        load_engine(path, module="no-such-module-is-imported")
    msg = str(info.value)
    assert msg.startswith(f"{str(path)!r} ({len(data)} bytes) is not a TensorRT plan: a plan starts with 'ftrt' "
                          "(TensorRT) or 'vtrt' (TensorRT-RTX), this file starts with ")
    assert hint in msg


def test_eight_garbage_bytes_say_not_a_plan(tmp_path):
    path = tmp_path / "x.plan"
    path.write_bytes(b"garbage!")
    with pytest.raises(EngineError, match=r"\(8 bytes\) is not a TensorRT plan.*starts with b'garbage!'"):
        load_engine(path)


def test_plan_magics_are_what_the_builders_write():
    assert plan_format(b"ftrt\x00\x00\x00\x00") == ("TensorRT", "tensorrt")
    assert plan_format(b"vtrt\x00\x00\x00\x00") == ("TensorRT-RTX", "tensorrt_rtx")
    assert plan_format(b"xtrt") is None


@pytest.mark.rtx
def test_tensorrt_rtx_plans_start_with_vtrt(tmp_path):
    """Build a one-layer network with tensorrt_rtx on this CPU and look at its first bytes."""
    trt = import_trt("tensorrt_rtx")
    builder = trt.Builder(trt_logger(trt))
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    x = network.add_input("x", trt.float32, (2, 3))
    y = network.add_identity(x).get_output(0)
    y.name = "y"
    network.mark_output(y)
    plan = builder.build_serialized_network(network, builder.create_builder_config())
    assert plan is not None
    assert plan_format(bytes(plan)) == ("TensorRT-RTX", "tensorrt_rtx")


# -- a stand-in TensorRT module: what load_engine does around deserialization, without a GPU ------

class _Severity(enum.Enum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


class _FakeLogger:
    Severity = _Severity

    def __init__(self):
        pass


class _FakeEngine:
    def __init__(self, runtime, plugins):
        self.runtime = runtime  # as TensorRT's binding does (keep_alive): the engine keeps its runtime
        self.plugins_at_load = plugins


class _FakeRuntime:
    def __init__(self, logger):
        self.logger = logger

    def deserialize_cuda_engine(self, data):
        return _FakeEngine(self, trtio._trt.loaded_plugins())


def _fake_trt(name="faketrt"):
    mod = types.ModuleType(name)
    mod.ILogger = _FakeLogger
    mod.Runtime = _FakeRuntime
    mod.__version__ = "0"
    return mod


def _plan(tmp_path):
    path = tmp_path / "model.plan"
    path.write_bytes(b"ftrt" + bytes(60))
    return path


def test_trtio_keeps_no_runtime_alive(tmp_path):
    """The engine's runtime lives exactly as long as the engine (no module-level cache keyed by id())."""
    engine = load_engine(_plan(tmp_path), _fake_trt())
    runtime = weakref.ref(engine.runtime)
    del engine
    gc.collect()
    assert runtime() is None
    assert not hasattr(trtio._trt, "_keepalive")


def _a_shared_library():
    """A real shared library file this process has loaded already (so loading it again is harmless):
    the C math library where /proc names it, else numpy's compiled core."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libm.so") and os.path.isfile(path):
                    return path
    except OSError:
        pass
    core = getattr(np, "_core", None) or np.core
    return core._multiarray_umath.__file__


def test_plugins_load_once_and_before_deserialization(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGELLM_PLUGIN_PATH", raising=False)
    lib = _a_shared_library()
    real = os.path.realpath(lib)
    engine = load_engine(_plan(tmp_path), _fake_trt(), plugins=[lib])
    assert real in engine.plugins_at_load, "plugins are loaded before the plan is deserialized"
    assert load_plugins([lib, Path(lib)]) == [real, real]
    assert loaded_plugins().count(real) == 1
    monkeypatch.setenv("EDGELLM_PLUGIN_PATH", lib)
    assert load_plugins() == [real], "EDGELLM_PLUGIN_PATH names one library file"
    assert load_plugins(lib) == [real, real], "a single path is taken as one library"


def test_missing_plugin_is_an_error_naming_the_path(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGELLM_PLUGIN_PATH", raising=False)
    missing = tmp_path / "libNvInfer_edgellm_plugin.so"
    with pytest.raises(EngineError) as info:
        load_engine(_plan(tmp_path), _fake_trt(), plugins=[missing])
    assert str(info.value) == f"plugin library {str(missing)!r} (from plugins) does not exist"
    monkeypatch.setenv("EDGELLM_PLUGIN_PATH", str(missing))
    with pytest.raises(EngineError, match=r"\(from EDGELLM_PLUGIN_PATH\) does not exist"):
        load_engine(_plan(tmp_path), _fake_trt())


def test_a_directory_in_edgellm_plugin_path_is_refused_naming_the_file_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGELLM_PLUGIN_PATH", str(tmp_path))
    with pytest.raises(EngineError) as info:
        load_plugins()
    msg = str(info.value)
    assert f"plugin library {str(tmp_path)!r} (from EDGELLM_PLUGIN_PATH) is a directory" in msg
    assert "names the library file itself" in msg and "did you mean" not in msg
    (tmp_path / "libNvInfer_edgellm_plugin.so").write_bytes(b"")
    with pytest.raises(EngineError, match=r"did you mean '.*/libNvInfer_edgellm_plugin\.so'\?"):
        load_plugins()


def test_an_unloadable_plugin_names_the_path(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGELLM_PLUGIN_PATH", raising=False)
    fake = tmp_path / "libfake.so"
    fake.write_text("not a shared library")
    with pytest.raises(EngineError, match=r"plugin library '.*libfake\.so' \(from plugins\) cannot be loaded: "):
        load_plugins([fake])
    assert os.path.realpath(fake) not in loaded_plugins()


def test_auto_prefers_the_module_the_plan_names(monkeypatch):
    asked = []

    def fake_import(name):
        asked.append(name)
        if name == "tensorrt_rtx":
            raise ImportError("not here")
        return _fake_trt(name)

    monkeypatch.setattr(trtio._trt.importlib, "import_module", fake_import)
    assert trtio._trt._module_for("auto", ("TensorRT-RTX", "tensorrt_rtx")).__name__ == "tensorrt"
    assert asked == ["tensorrt_rtx", "tensorrt"]


@pytest.mark.rtx
def test_logger_bridge_is_one_per_module():
    trt = import_trt("tensorrt_rtx")
    assert trt_logger(trt) is trt_logger(trt)
    assert isinstance(trt_logger(trt), trt.ILogger)


def test_module_of_finds_the_defining_module():
    class Engine:  # defined in this test module
        pass

    assert module_of(Engine()).__name__ == __name__


@pytest.mark.rtx
def test_truncated_plan_is_a_clear_error(tmp_path):
    """A real plan (built with tensorrt_rtx on this CPU), cut in half, is refused with the file named."""
    from _configs import llm_config

    from trtio.testing.toy_build import build_plan
    from trtio.testing.toy_model import ToyWeights

    cfg = llm_config(num_attention_layers=1)
    plan = tmp_path / "model.plan"
    build_plan("tensorrt_rtx", cfg, ToyWeights.generate(cfg, 0), plan, progress=False)
    data = plan.read_bytes()
    cut = tmp_path / "cut.plan"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(EngineError) as info:
        load_engine(cut, module="tensorrt_rtx")
    msg = str(info.value)
    assert "cut.plan" in msg and f"({len(data) // 2} bytes)" in msg and "could not be deserialized" in msg


class _RefusingRuntime:
    """A runtime that logs its reason through the logger it was given and returns None, as TensorRT does."""

    def __init__(self, logger):
        self.logger = logger

    def deserialize_cuda_engine(self, data):
        self.logger.log(_Severity.ERROR, f"plan of {len(data)} bytes refused: serialization version mismatch")
        return None


def test_a_failed_load_names_its_own_reason_after_many_earlier_errors(tmp_path):
    """The bridge keeps only the latest errors; a load long after the first 20 must still find its own."""
    trt = _fake_trt("faketrt_many_errors")
    trt.Runtime = _RefusingRuntime
    bridge = trt_logger(trt)
    for i in range(25):
        bridge.log(_Severity.ERROR, f"earlier error {i}")
    with pytest.raises(EngineError) as info:
        load_engine(_plan(tmp_path), trt)
    msg = str(info.value)
    assert "plan of 64 bytes refused: serialization version mismatch" in msg
    assert "TensorRT gave no reason" not in msg and "earlier error" not in msg
