import importlib.util
import logging

import pytest

from trtio import EngineError
from trtio.trt import import_trt, load_engine, module_of, trt_logger

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
    bad.write_bytes(b"not a plan at all")
    with caplog.at_level(logging.ERROR, logger="trtio.trt"):
        with pytest.raises(EngineError) as info:
            load_engine(bad, module="tensorrt_rtx")
    msg = str(info.value)
    assert "bad.plan" in msg and "17 bytes" in msg and "tensorrt_rtx" in msg and "corrupt or truncated" in msg
    assert any(r.name == "trtio.trt" for r in caplog.records), "TensorRT's log is bridged to trtio.trt"


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
