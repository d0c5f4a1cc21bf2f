"""One integer check: every place that takes a whole number accepts and refuses the same values.

A NumPy integer (``np.int64(2)``, what indexing an array gives) is accepted, and stored as a Python
``int`` where trtio keeps it; ``True`` and ``2.0`` are refused with a TrtioError, everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _configs import llm_config

from trtio import names
from trtio._checks import check_int, is_int
from trtio._config import LLMEngineConfig, SpecDecodeConfig
from trtio._dims import InferenceDims
from trtio._dlpack import make_capsule
from trtio._dtypes import DType
from trtio._rope import rope_cos_sin_table
from trtio._tensor import Tensor
from trtio.edgellm import EngineDir
from trtio.errors import ConfigError, InvalidValueError, ShapeError, TrtioError

EDGELLM = Path(__file__).parent / "fixtures" / "edgellm-0.11"


def _edgellm_batch(v: Any) -> int:
    data = json.loads((EDGELLM / "qwen3-tiny-llm" / "config.json").read_text())
    data["builder_config"]["max_batch_size"] = v
    return LLMEngineConfig.from_edgellm(data).max_supported_batch_size


def _engine_dir_top_k(v: Any) -> int:
    bundle = EngineDir.open(EDGELLM / "qwen3-tiny-eagle3").deployment(draft_top_k=v, draft_step=1, verify_size=2)
    assert bundle.spec is not None
    return bundle.spec.drafting_top_k


# Each site takes the value 2 as a whole number and returns what it kept of it.
SITES: dict[str, Callable[[Any], Any]] = {
    "LLMEngineConfig field": lambda v: llm_config(num_attention_layers=v).num_attention_layers,
    "LLMEngineConfig.eagle_hidden_state_layers": lambda v: llm_config(
        num_attention_layers=3, is_spec_decode_base=True, max_verify_tree_size=8,
        eagle_hidden_state_layers=(0, v)).eagle_hidden_state_layers[1],
    "SpecDecodeConfig field": lambda v: SpecDecodeConfig(64, 64, 8, 8, drafting_top_k=v).validate().drafting_top_k,
    "shape recipe": lambda v: llm_config().prefill_dims(v, 4).batch,
    "InferenceDims": lambda v: InferenceDims(v, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0).batch,
    "Edge-LLM config key": _edgellm_batch,
    "EngineDir.deployment": _engine_dir_top_k,
    "RoPE table": lambda v: rope_cos_sin_table(4, 8, batch=v).shape[0],
    "binding name": lambda v: int(names.past_key_values(v).rsplit("_", 1)[1]),
    "TensorRT DataType value": lambda v: DType.from_trt(v).value.trt_value,
    "tensor shape": lambda v: Tensor.empty((v, 3), "float32", backend="host").shape[0],
    "tensor capacity": lambda v: Tensor.empty((1,), "int8", capacity=v, backend="host").capacity,
    "DLPack shape": lambda v: make_capsule(4096, (v,), type_code=2, bits=32, device_type=1, device_id=0,
                                           owner=None) and v,
    "check_int": lambda v: check_int(v, "n", minimum=0),
}


@pytest.mark.parametrize("site", SITES)
def test_a_numpy_integer_is_accepted_and_kept_as_an_int(site: str) -> None:
    kept = SITES[site](np.int64(2))
    assert kept == 2 and (type(kept) is int or site == "DLPack shape")


@pytest.mark.parametrize("value", [True, 2.0], ids=["True", "2.0"])
@pytest.mark.parametrize("site", SITES)
def test_a_bool_or_a_float_is_refused(site: str, value: Any) -> None:
    with pytest.raises(TrtioError):
        SITES[site](value)


def test_is_int() -> None:
    assert all(is_int(v) for v in (0, -3, np.int8(1), np.uint64(7), np.int64(2)))
    assert not any(is_int(v) for v in (True, np.bool_(False), 2.0, np.float32(1), "2", None, np.array(2)))


def test_check_int_names_the_value_and_the_range() -> None:
    with pytest.raises(ShapeError, match=r"^batch: expected an integer in 1\.\.4, got 5$"):
        check_int(5, "batch", minimum=1, maximum=4)
    with pytest.raises(InvalidValueError, match=r"^n: expected an integer >= 0, got bool True$"):
        check_int(True, "n", minimum=0, error=InvalidValueError)
    with pytest.raises(ConfigError) as info:
        check_int(2.0, "rope_scaling.original_max_position_embeddings", minimum=1, error=ConfigError)
    assert info.value.field == "rope_scaling.original_max_position_embeddings"
    assert info.value.message == "expected an integer >= 1, got float 2.0"
