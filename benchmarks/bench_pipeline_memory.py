"""PipelineIO memory for an 8B-class config and an EAGLE-3 bundle: bytes allocated vs required,
and what sharing one PipelineIO between base and draft saves.

Run: ``python benchmarks/bench_pipeline_memory.py [--backend host|cuda]``. On the host backend the
buffers are numpy allocations that are never touched, so this runs on any machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import table  # noqa: E402

import trtio  # noqa: E402
from trtio import DeploymentConfig, LLMEngineConfig, PipelineIO, SpecDecodeConfig  # noqa: E402

MIB = 1 << 20

BASE_8B = dict(hidden_size=4096, vocab_size=151936, max_supported_batch_size=8, max_supported_input_length=4096,
               max_kv_cache_capacity=4096, num_attention_layers=36, num_attention_heads=32, num_kv_heads=8,
               head_dim=128, rotary_dim=128)


def configs() -> tuple[LLMEngineConfig, DeploymentConfig]:
    llm = LLMEngineConfig(**BASE_8B).validate()
    base = LLMEngineConfig(**BASE_8B, is_spec_decode_base=True, max_verify_tree_size=64).validate()
    # EAGLE-3: the draft reads 3 x hidden of base features, proposes top-10 x 6 steps, verifies 60.
    draft = LLMEngineConfig(hidden_size=4096, vocab_size=32000, max_supported_batch_size=8,
                            max_supported_input_length=4096, max_kv_cache_capacity=4096, num_attention_layers=1,
                            num_attention_heads=32, num_kv_heads=8, head_dim=128, base_model_hidden_size=3 * 4096,
                            max_draft_tree_size=64).validate()
    spec = SpecDecodeConfig(base_output_hidden_dim=3 * 4096, draft_hidden_size=4096, max_verify_size=64,
                            max_draft_proposal_size=60, drafting_top_k=10, drafting_step=6, verify_size=60)
    return llm, DeploymentConfig(base, draft, spec).validate()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="host")
    args = ap.parse_args()
    be = trtio.get_backend(args.backend)
    llm, bundle = configs()
    rows = []
    io = PipelineIO.create_for_llm(llm, backend=be)
    rep = io.memory_report()
    rows.append(["create_for_llm (8B-class)", f"{rep.total_required / MIB:.2f}", f"{rep.total_allocated / MIB:.2f}",
                 rep.alignment_waste, f"{rep.ratio:.6f}"])
    io.close()
    io = PipelineIO.create_for_spec_decode(bundle, backend=be)
    base_map = io.build_tensor_map(bundle.base)
    draft_map = io.build_tensor_map_for_spec_decode_draft(bundle.draft)
    rep = io.memory_report()
    rows.append(["create_for_spec_decode (8B + EAGLE-3 draft)", f"{rep.total_required / MIB:.2f}",
                 f"{rep.total_allocated / MIB:.2f}", rep.alignment_waste, f"{rep.ratio:.6f}"])
    shared = {}
    for name in base_map.names():
        if name in draft_map and draft_map[name] is base_map[name]:
            shared[name] = base_map[name]
    shared_via_alias = {"hidden_states (base) = hidden_states_input (draft)": io.base_hidden_states}
    saved = sum(t.capacity for t in shared.values()) + sum(t.capacity for t in shared_via_alias.values())
    print("### PipelineIO memory (worst case, one arena)\n")
    print(table(["pipeline", "required MiB", "allocated MiB", "alignment waste (B)", "allocated / required"], rows))
    print("\nBuffers base and draft share in spec decode (one allocation serves both engines; separate "
          "per-engine buffers would allocate each twice, and the draft would need a copy of the base's "
          "hidden states):\n")
    srows = [[n, "x".join(map(str, t.shape)), t.dtype, f"{t.capacity / MIB:.2f}"] for n, t in shared.items()]
    srows += [[n, "x".join(map(str, t.shape)), t.dtype, f"{t.capacity / MIB:.2f}"] for n, t in shared_via_alias.items()]
    print(table(["binding", "worst-case shape", "dtype", "MiB"], srows))
    print(f"\nSaving from shared buffers: **{saved / MIB:.2f} MiB** "
          f"({saved / rep.total_required:.1%} of the shared PipelineIO's {rep.total_required / MIB:.2f} MiB).")
    io.close()


if __name__ == "__main__":
    main()
