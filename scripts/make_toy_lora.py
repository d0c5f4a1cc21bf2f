"""Write the toy LoRA engine directory, ``engines/toy-lora-ragged`` (issue 37), from the repository root::

    PYTHONPATH=. python3 scripts/make_toy_lora.py

``config.json`` is ``engines/toy-llm-ragged``'s with ``builder_config.max_lora_rank`` 8 (Edge-LLM's builder writes
the key into every config; a LoRA build sets it); ``adapters/<name>/adapter_model.safetensors`` are two toy adapters
in the layout Edge-LLM's ``process-lora`` writes (``{module}.lora_A.weight`` FP16 ``[in, r]``,
``{module}.lora_B.weight`` FP16 ``[r, out]``): ``chat`` (rank 8, every linear, seed 1) and ``terse`` (rank 4,
q_proj and v_proj only, seed 2), both ``trtio.testing.reference_lora.toy_adapter``'s, which the tests compare
them against. Beside each, ``config.json`` is the PEFT ``adapter_config.json`` that ``process-lora`` copies there
(``lora_alpha`` = ``r``: the toy's B is the scaled one; no rsLoRA, no per-module ranks or alphas, which
``trtio.LoraAdapter.load`` refuses).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from trtio.edgellm import EngineDir
from trtio.testing.reference_lora import toy_adapter
from trtio.testing.toy_dirs import toy_engine_dir

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "engines" / "toy-lora-ragged"
#: name -> (rank, seed, modules: None for every one)
ADAPTERS = {"chat": (8, 1, None), "terse": (4, 2, ("q_proj", "v_proj"))}
MAX_RANK = 8


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype="<f2").tobytes()
        header[name] = {"dtype": "F16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main() -> None:
    source = toy_engine_dir("toy-llm-ragged") / "config.json"
    raw = json.loads(source.read_text())
    raw["builder_config"]["max_lora_rank"] = MAX_RANK
    TARGET.mkdir(parents=True, exist_ok=True)
    (TARGET / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    cfg = EngineDir.open(TARGET).config
    for name, (rank, seed, modules) in ADAPTERS.items():
        adapter = toy_adapter(cfg, rank, seed=seed, name=name, modules=modules)
        tensors = {}
        for module, (a, b) in adapter.weights.items():
            tensors[f"{module}.lora_A.weight"] = a
            tensors[f"{module}.lora_B.weight"] = b
        _write_safetensors(TARGET / "adapters" / name / "adapter_model.safetensors", tensors)
        targets = sorted({module.rsplit(".", 1)[-1] for module in adapter.weights})
        peft = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": targets, "use_rslora": False,
                "rank_pattern": {}, "alpha_pattern": {}}
        (TARGET / "adapters" / name / "config.json").write_text(json.dumps(peft, indent=2) + "\n")


if __name__ == "__main__":
    main()
