"""From a real Edge-LLM engine directory and its plugin library to tokens.

    python3 examples/real_engine.py ENGINE_DIR --plugin PATH/libNvInfer_edgellm_plugin.so
    python3 examples/real_engine.py ENGINE_DIR --plugin PATH --prompt "Once upon a time" --max-new-tokens 32
    python3 examples/real_engine.py ENGINE_DIR --plugin PATH --load-engine     # the same, one call at a time

ENGINE_DIR is what TensorRT Edge-LLM 0.11's builder wrote: ``config.json`` + ``llm.engine`` (a plain LLM), or
``base_config.json`` + ``spec_base.engine`` and ``draft_config.json`` + ``spec_draft.engine`` (an EAGLE3 pair),
with ``embedding.safetensors`` and ``tokenizer.json`` beside them. ``--plugin`` is the path of Edge-LLM's plugin
library (``EDGELLM_PLUGIN_PATH`` is read too); it needs full TensorRT and a GPU the plugin was built for (README,
"Real Edge-LLM engines"). The toy directories of this repository hold configs only: use
``examples/generate.py`` for them.

By default ``trtio.create_from_engine_dir`` opens the directory, loads the plugin, deserializes the engines and binds
them. ``--load-engine`` does the same one call at a time: ``trtio.EngineDir.open``, ``trtio.load_engine`` for each
engine file, then ``trtio.create_for_llm`` (or ``trtio.create_for_spec_decode`` with the directory's
``deployment``). Tokens come from greedy decoding (``examples/generate.py``'s loop; a pair decodes speculatively
with ``examples/speculative.py``'s, whose tokens are the base's greedy ones), the embedding rows gathered on the
device by the directory's ``EngineDir.embeddings()`` (a Gemma 4 directory's per-layer rows too), the logits sampled
with numpy. Prints each prompt's tokens, the text, and the tokens per second.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from common import Numpy, positive_int, run
from generate import generate
from speculative import Tree, speculative

import trtio

PROMPT = "Once upon a time"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engine_dir", type=Path, help="an Edge-LLM engine directory with its engine files")
    p.add_argument("--plugin", action="append", default=[], metavar="PATH",
                   help="the path of Edge-LLM's plugin library, libNvInfer_edgellm_plugin.so (repeatable; "
                        "EDGELLM_PLUGIN_PATH is loaded too)")
    p.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                   help=f"a prompt (repeatable; default {PROMPT!r}), tokenized with the directory's tokenizer.json")
    p.add_argument("--max-new-tokens", type=positive_int, default=32)
    p.add_argument("--draft-top-k", type=positive_int, default=2, help="a pair's candidates per drafted node")
    p.add_argument("--draft-step", type=positive_int, default=3, help="a pair's draft levels per round")
    p.add_argument("--load-engine", action="store_true",
                   help="load and bind each engine with load_engine and create_for_* instead of create_from_engine_dir")
    return p


def bind(d: trtio.EngineDir, plugins: list[Path], tree: dict[str, int], by_hand: bool) -> Any:
    """The directory's engines bound: an LLMSetup or a SpecDecodeSetup (graphs on)."""
    if not by_hand:
        return trtio.create_from_engine_dir(d.path, graphs=True, plugins=plugins,
                                            **(tree if d.kind == "spec_decode" else {}))
    if d.is_tensor_parallel:
        raise trtio.ConfigError("--load-engine", f"{d.path} is tensor-parallel (one engine per rank, bound on "
                                                 "several GPUs): create_from_engine_dir binds it; leave "
                                                 "--load-engine out")
    if d.kind == "llm":
        engine = trtio.load_engine(d.engine_path("llm"), plugins=plugins)
        return trtio.create_for_llm(engine, d.config, graphs=True)
    base = trtio.load_engine(d.engine_path("base"), plugins=plugins)
    draft = trtio.load_engine(d.engine_path("draft"), plugins=plugins)
    bundle = d.deployment(tree["draft_top_k"], tree["draft_step"], tree["verify_size"])
    return trtio.create_for_spec_decode(base, draft, bundle, graphs=True)


def tokens_of(d: trtio.EngineDir, setup: Any, prompts: list[list[int]], count: int,
              tree: dict[str, int]) -> tuple[list[list[int]], str]:
    """Each prompt's ``count`` greedy tokens, and how they were decoded."""
    stream = trtio.Stream.default(setup.io.backend)  # the setup runs on the thread's default stream
    lib = Numpy(stream)
    with d.embeddings(setup.io.backend, stream) as emb:
        if d.kind == "llm":
            return generate(setup, emb, prompts, count, lib).tolist(), "greedy"
        tokens, stats = speculative(setup, emb, d.draft_to_target(), prompts, count, lib,
                                    Tree(tree["draft_top_k"], tree["draft_step"]))
    return tokens, f"speculative, {stats['accepted_per_verify']:.2f} accepted tokens per verify"


def main() -> None:
    p = build_parser()
    args = p.parse_args()
    d = trtio.EngineDir.open(args.engine_dir)
    if not d.has_engines:
        p.error(f"{d.path} holds configs only (no {', '.join(e.name for e in d.engine_paths)}): build the engines "
                "with Edge-LLM's builder; for trtio's toy directories use examples/generate.py")
    if not args.plugin and not os.environ.get("EDGELLM_PLUGIN_PATH"):
        p.error("Edge-LLM's engines need its plugin library: pass --plugin PATH (or set EDGELLM_PLUGIN_PATH)")
    from tokenizers import Tokenizer  # pip install 'trtio[generate]'

    tokenizer = Tokenizer.from_file(str(d.path / "tokenizer.json"))
    prompts = [tokenizer.encode(text).ids for text in (args.prompt or [PROMPT])]
    k, step = args.draft_top_k, args.draft_step
    tree = {"draft_top_k": k, "draft_step": step, "verify_size": 1 + k * step}
    with bind(d, args.plugin, tree, args.load_engine) as setup:
        start = time.perf_counter()
        tokens, how = tokens_of(d, setup, prompts, args.max_new_tokens, tree)
        seconds = time.perf_counter() - start
    for i, row in enumerate(tokens):
        print(f"tokens {i}: {row}")
        print(f"text {i}: {tokenizer.decode(row)!r}")
    count = sum(map(len, tokens))
    print(f"{count} tokens in {seconds:.3f} s: {count / seconds:.1f} tokens/s ({how}, {setup.io.backend.name} backend)")


if __name__ == "__main__":
    run(main)
