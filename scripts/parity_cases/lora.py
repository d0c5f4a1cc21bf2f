"""LoRA: Qwen3 through the ONNX LoRA path (``tensorrt-edgellm-export`` + ``tensorrt-edgellm-insert-lora``), two PEFT
adapters processed by ``tensorrt-edgellm-process-lora``, compared with Hugging Face + PEFT on the merged weights.

The case ``qwen3-lora`` holds two graphs of one checkpoint (the dense case's ``qwen3`` model, seed 1):

* ``llm/``: each weight ``MatMul`` of the export renamed ``/<module>/MatMul`` from torch.onnx's own name-scope
  metadata (``pkg.torch.onnx.name_scopes``), then ``insert-lora`` run on it: its LoRA inputs carry module names
  (``model.layers.0.mlp.down_proj.lora_A.weight``, ``model.layers.0.self_attn.qkv_proj_fused.lora_A.weight``);
* ``nodes/``: ``insert-lora`` run on the export as it is (NVIDIA's chain alone): its LoRA inputs are named after the
  graph nodes (``ode_linear_N.lora_A.weight``), which no adapter can be matched to; trtio binds it without an
  adapter (rank 0) and its logits must equal the base model's.

The adapters (``adapters/<name>/``, ``process-lora``'s output as it writes it):

* ``a``: PEFT ``r`` 8, ``lora_alpha`` 16 on ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``;
* ``b``: PEFT ``r`` 2, ``lora_alpha`` 1 on every projection; ``adapters/b-unfused/`` is ``process-lora``'s output,
  whose ``q_proj`` / ``k_proj`` / ``v_proj`` can bind to no input of the graph (the exporter fuses q/k/v into one
  ``qkv_proj_fused`` linear), and ``adapters/b/`` folds those three into ``qkv_proj_fused`` (A side by side, B
  block-diagonal: rank 6), which is the same update.

Every A and B is drawn seeded and rounded so that its fp16 value and ``B * lora_alpha / r`` (a power of two) are
exact: PEFT's fp32 merge and the fp16 graph then add the same numbers. The references: Hugging Face's fp32 forward
of the base checkpoint with ``PeftModel.from_pretrained(adapter).merge_and_unload()`` for ``a`` and ``b``, and of
the base alone for ``none``.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import make_parity_fixtures as mpf
import numpy as np
from make_parity_fixtures import CONTINUATION, TEXT_BUILDER, Case, Role, Sequence, load_hf

from parity_cases.dense import qwen3

BUILDER = {**TEXT_BUILDER, "max_lora_rank": 8}
# (PEFT target modules, r, lora_alpha, the scale of B) of each adapter; alpha / r is a power of two.
ADAPTERS: dict[str, tuple[tuple[str, ...], int, int, float]] = {
    "a": (("o_proj", "gate_proj", "up_proj", "down_proj"), 8, 16, 0.1),
    "b": (("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), 2, 1, 0.6),
}
QKV = ("q_proj", "k_proj", "v_proj")
# The requests of the switch scenario: two prompts with adapter a, two with b, two without an adapter.
SEQUENCES = (Sequence("a", 5), Sequence("a", 11), Sequence("b", 7), Sequence("b", 13),
             Sequence("none", 9), Sequence("none", 6))
NOTES = """\
The chain: `tensorrt-edgellm-export CKPT OUT`; for `llm/`, the MatMuls renamed (below), then
`tensorrt-edgellm-insert-lora --onnx_dir` (its `lora_model.onnx` is the role's `model.onnx`, sharing
`model.onnx.data`); for `nodes/`, `insert-lora` alone. Adapters: PEFT `save_pretrained`, then
`tensorrt-edgellm-process-lora --input_dir PEFT --output_dir adapters/<name>` (`processed_adapter_model.safetensors`
and the adapter's `config.json`): `a` (r 8, lora_alpha 16: o/gate/up/down_proj), `b-unfused` (r 2, lora_alpha 1:
every projection), `b` (`b-unfused` folded, below). The references: Hugging Face's fp32 forward with
`PeftModel.from_pretrained(base, adapter).merge_and_unload()` (sequences `a`, `b`) and of the base (`none`);
`reference.json` says how far each adapter moves the base's logits.

Steps outside NVIDIA's chain, and why:

- `llm/`: before `insert-lora`, each weight `MatMul` node of the export (named `node_linear_N` by torch's dynamo
  exporter, which the 0.11 exporter always uses) is renamed `/<module>/MatMul`, the module read from torch.onnx's own
  `pkg.torch.onnx.name_scopes` metadata of that node. `insert-lora` names a MatMul's LoRA inputs after its node, so
  the inputs then carry module names (`model.layers.0.mlp.up_proj.lora_A.weight`) that `process-lora`'s adapter keys
  match. `nodes/` is `insert-lora` on the export as it is: inputs `ode_linear_N.lora_A.weight`, which no adapter
  matches (Edge-LLM's runtime binds a zero rank-1 dummy to an input no adapter key names; trtio binds rank 0 and
  refuses `set_lora`).
- `adapters/b/`: `process-lora`'s output with `q_proj` / `k_proj` / `v_proj` folded into the exporter's fused
  `qkv_proj_fused` (A `[in, 3r]` side by side, B `[3r, q+k+v]` block-diagonal: the same update). Unfolded
  (`adapters/b-unfused/`, as `process-lora` wrote it) those three keys name no input of the ONNX graph.
- A and B are drawn seeded and rounded to fp16 values, and lora_alpha / r is a power of two, so PEFT's fp32 merge
  and the fp16 graph add the same numbers. PEFT's `adapter_config.json` (which `process-lora` copies to
  `config.json`) gets `base_model_name_or_path` `CKPT` and its targets sorted, so the files are reproducible.
- Edge-LLM's checkpoint builder (`experimental/builder`, `--max-lora-rank`) builds from the checkpoint, not from
  this ONNX: it names each input after its module and keeps q/k/v apart; its profiles for the LoRA inputs are the
  ones `profiles.json` records (`_setup_llm_profiles`, on these graphs' inputs)."""


def checkpoint(folder: Path, seed: int) -> None:
    qwen3(folder, seed)


def _tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{args[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def rename_matmuls(model_file: Path) -> int:
    """Rename every MatMul of ``model_file`` whose weight is an initializer ``/<module>/MatMul``, the module the
    last name scope around it (torch.onnx's ``pkg.torch.onnx.name_scopes``: ``['', '_model.<module>',
    'linear_N']``, the wrapper's ``_model.`` dropped). Returns how many were renamed."""
    import onnx

    model = onnx.load(str(model_file), load_external_data=False)
    weights = {i.name for i in model.graph.initializer}
    names = set()
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights:
            continue
        meta = {p.key: p.value for p in node.metadata_props}
        scopes = ast.literal_eval(meta["pkg.torch.onnx.name_scopes"])
        module = scopes[-2]
        if not module.startswith("_model."):
            raise RuntimeError(f"{node.name}: name scopes {scopes} hold no module of the model")
        node.name = "/" + module[len("_model."):].replace(".", "/") + "/MatMul"
        names.add(node.name)
    onnx.save(model, str(model_file))
    return len(names)


def export_lora(ckpt: Path, out: Path) -> None:
    """The export, then ``insert-lora`` on it as it is (``nodes/``) and on its MatMuls renamed (``llm/``)."""
    mpf.export(ckpt, out / "export", ())
    for role, rename in (("nodes", False), ("llm", True)):
        folder = out / role
        shutil.copytree(out / "export" / "llm", folder)
        if rename:
            renamed = rename_matmuls(folder / "model.onnx")
            if renamed != 20:  # 4 layers x (fused qkv, o, gate, up, down)
                raise RuntimeError(f"renamed {renamed} MatMuls, expected 20")
        _run(_tool("tensorrt-edgellm-insert-lora"), "--onnx_dir", str(folder))
        (folder / "lora_model.onnx").replace(folder / "model.onnx")


def _exact(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def peft_adapter(ckpt: Path, name: str, seed: int, folder: Path) -> None:
    """A PEFT adapter of ``ADAPTERS[name]`` on the checkpoint, its A and B drawn seeded (B nonzero), saved with
    ``save_pretrained`` (``adapter_model.safetensors`` + ``adapter_config.json``)."""
    import torch
    from peft import LoraConfig, get_peft_model

    targets, r, alpha, b_scale = ADAPTERS[name]
    model = get_peft_model(load_hf(ckpt), LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                                                     lora_dropout=0.0, bias="none"))
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for key, param in sorted(model.named_parameters()):
            if ".lora_A." in key:  # [r, in]
                value = rng.standard_normal(param.shape) / np.sqrt(param.shape[1])
            elif ".lora_B." in key:  # [out, r]
                value = rng.standard_normal(param.shape) * b_scale
            else:
                continue
            param.copy_(torch.from_numpy(_exact(value)))
    model.save_pretrained(folder)
    # Reproducible metadata (process-lora copies this file): no temporary path, the targets in order.
    config_file = folder / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = "CKPT"
    config["target_modules"] = sorted(config["target_modules"])
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def fold_qkv(src: Path, dst: Path) -> None:
    """``process-lora``'s output at ``src`` with each layer's q/k/v pairs folded into ``qkv_proj_fused``."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(src / "processed_adapter_model.safetensors")
    out = {k: v for k, v in tensors.items() if not any(f".self_attn.{p}." in k for p in QKV)}
    layers = sorted({k.split(".self_attn.")[0] for k in tensors if ".self_attn.q_proj." in k})
    for layer in layers:
        a = [tensors[f"{layer}.self_attn.{p}.lora_A.weight"] for p in QKV]  # [in, r] each
        b = [tensors[f"{layer}.self_attn.{p}.lora_B.weight"] for p in QKV]  # [r, out_p] each
        fused_b = np.zeros((sum(x.shape[0] for x in b), sum(x.shape[1] for x in b)), np.float16)
        row = col = 0
        for x in b:
            fused_b[row:row + x.shape[0], col:col + x.shape[1]] = x
            row, col = row + x.shape[0], col + x.shape[1]
        out[f"{layer}.self_attn.qkv_proj_fused.lora_A.weight"] = np.concatenate(a, axis=1)
        out[f"{layer}.self_attn.qkv_proj_fused.lora_B.weight"] = fused_b
    dst.mkdir(parents=True)
    shutil.copy2(src / "config.json", dst / "config.json")
    save_file(dict(sorted(out.items())), dst / "processed_adapter_model.safetensors")


def lora_reference(case: Case, ckpt: Path, out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The adapters (PEFT, then ``process-lora``) into ``out/adapters/``, and HF's fp32 logits of each sequence on
    the base merged with its adapter (``merge_and_unload``; ``none``: the base)."""
    from peft import PeftModel

    models: dict[str, Any] = {"none": load_hf(ckpt)}
    adapters: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(ADAPTERS):
            peft_dir = Path(tmp) / name
            peft_adapter(ckpt, name, case.seed * 100 + i, peft_dir)
            processed = out / "adapters" / (f"{name}-unfused" if name == "b" else name)
            _run(_tool("tensorrt-edgellm-process-lora"), "--input_dir", str(peft_dir), "--output_dir", str(processed))
            if name == "b":
                fold_qkv(processed, out / "adapters" / name)
            models[name] = PeftModel.from_pretrained(load_hf(ckpt), peft_dir).merge_and_unload().eval()
            config = json.loads((peft_dir / "adapter_config.json").read_text())
            adapters[name] = {"target_modules": sorted(config["target_modules"]), "r": config["r"],
                              "lora_alpha": config["lora_alpha"]}
    vocab = int(models["none"].config.vocab_size)
    arrays: dict[str, np.ndarray] = {}
    sequences = []
    for i, seq in enumerate(case.sequences):
        rng = np.random.default_rng(case.seed * 1000 + i)
        tokens, logits = mpf.draw(models[seq.purpose], vocab, seq.length, rng)
        rows = mpf.stored_positions(seq)
        arrays[f"tokens_{i}"] = tokens
        arrays[f"positions_{i}"] = rows
        arrays[f"logits_{i}"] = logits[rows].astype(np.float32)
        greedy = logits[seq.length - 1:seq.length - 1 + CONTINUATION]
        sequences.append({"purpose": seq.purpose, "prompt_length": seq.length, "marks": [],
                          "smallest_greedy_gap": round(min(mpf.gap(r) for r in greedy), 4)})
    # How far each adapter moves the base's logits on its own rows (what a dropped adapter would leave).
    moved = {}
    for name in ADAPTERS:
        deltas = [float(np.abs(arrays[f"logits_{i}"] - _hf_rows(models["none"], arrays, i)).max())
                  for i, seq in enumerate(case.sequences) if seq.purpose == name]
        moved[name] = round(min(deltas), 3)
    return arrays, {"sequences": sequences, "continuation": CONTINUATION, "adapters": adapters,
                    "adapter_moves_base_logits_by_at_least": moved}


def _hf_rows(model: Any, arrays: dict[str, np.ndarray], i: int) -> np.ndarray:
    tokens = arrays[f"tokens_{i}"]
    return mpf.hf_logits(model, tokens[:-1])[arrays[f"positions_{i}"]]


CASES = [
    Case("qwen3-lora", "LoRA on the dense Qwen3 (4 layers of 64, vocab 512) through the ONNX path: the export with "
         "`insert-lora`, module-named (`llm/`) and as NVIDIA's chain names it (`nodes/`); two PEFT adapters processed "
         "by `process-lora`, against Hugging Face + PEFT's merged weights.",
         checkpoint, {"llm": Role("llm", BUILDER), "nodes": Role("nodes", BUILDER)},
         export=export_lora, seed=1, sequences=SEQUENCES, reference=lora_reference, notes=NOTES),
]
