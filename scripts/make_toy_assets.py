"""Write the runtime files of the toy engine directories in TensorRT Edge-LLM's layout.

Each toy directory of ``engines/`` (``trtio.testing.toy_dirs.TOY_DIRECTORIES``) holds what Edge-LLM's builder
writes beside its engines for a runtime to use. The directories share one model, so the files exist once, in
``engines/toy-assets/``, and each directory links to them (``trtio/testing/toy_dirs.py`` says how a wheel, which
cannot hold links, lays the directories out):

* ``tokenizer.json`` + ``tokenizer_config.json``: a byte-level BPE tokenizer (Hugging Face ``tokenizers``)
  trained on the English text below, with exactly the configs' ``vocab_size`` (512) entries: ``<unk>``,
  ``<s>``, ``</s>`` (id 2, the configs' ``eos_token_id``), for the vision-language toy (``toy-vlm-ragged``)
  its vision markers (ids 3 .. 6), the 256 bytes, then merges. Any English prompt round-trips: every byte
  has a token;
* ``embedding.safetensors``: the toy token embedding table the demo and the tests use,
  ``trtio.testing.toy_model.toy_embedding(vocab, hidden, seed)`` as float16, under Edge-LLM's tensor name
  ``"embedding"``;
* the Gemma-4-like toy's own ``toy-gemma4-ragged/ple_embedding.safetensors``: its per-layer embedding table,
  ``trtio.testing.reference_gemma4.toy_ple_embedding(cfg)``, under Edge-LLM's tensor name ``"weight"``.

``tests/test_generate.py`` checks that the committed files and links are what this script makes. Run it after
changing the toy configs or this text::

    python3 scripts/make_toy_assets.py            # rewrite engines/toy-assets/ and the directories' links
    python3 scripts/make_toy_assets.py --check    # exit 1 when a committed file or link differs
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtio.edgellm import EMBEDDING_FILE, EngineDir  # noqa: E402 - after the path set-up
from trtio.families.gemma4.gemma4_config import PLE_EMBEDDING_FILE  # noqa: E402 - after the path set-up
from trtio.testing.reference_gemma4 import toy_ple_embedding  # noqa: E402
from trtio.testing.toy_dirs import ASSETS_DIR, OWN_ASSETS, TOY_ASSETS, TOY_DIRECTORIES, linked_assets  # noqa: E402
from trtio.testing.toy_engines import RaggedToyEngines, ToyEngines, VisionToyEngines  # noqa: E402

TOKENIZER_FILE = "tokenizer.json"
GEMMA4_DIR = "toy-gemma4-ragged"  # its per-layer embedding table is its own
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: the toy configs' eos_token_id is [2]
# The vision-language toy's markers, ids 3 .. 6 (its configs' vision_start / vision_end / image / video token ids).
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# The training text: plain English, so that English prompts split into a few tokens each.
TEXT = """\
The quick brown fox jumps over the lazy dog. A small model can still tell a story, one token at a time.
Once upon a time there was a little engine that lived on a graphics card. Every morning it woke up, read
its prompt, and wrote the next word. It did not know many words, but it knew every letter, so it could
spell anything it was asked to say.

The engine had a friend called the runtime. The runtime kept the memory tidy: every buffer was made once,
at the largest size the day could need, and never moved again. When the engine asked where to write, the
runtime always gave the same address. That is why they could record their work as a graph and play it back
in a single step, faster than anyone could count.

Hello, world! How are you today? I am fine, thank you. What is your name? My name is Toy, and I am a tiny
transformer with four layers, four heads and sixty four numbers for every token. I like numbers: one, two,
three, four, five, six, seven, eight, nine, ten. I also like colours: red, green, blue, yellow and white.

In the beginning the prompt is read all at once. Then the model writes one token, and another, and another,
until it reaches the end of the text or the end of its memory. A draft model can guess several tokens ahead;
the base model checks the guesses in one pass and keeps the ones it agrees with. When the draft is good,
many tokens are accepted for the price of one.

This is a test of the system. If this had been a real model, you would have read something wise here.
Instead you will read whatever the toy model thinks comes next, which is mostly nonsense, but it is fast.
"""


def train_tokenizer(vocab_size: int, specials: tuple[str, ...] = SPECIAL_TOKENS) -> str:
    """The toy tokenizer as ``tokenizer.json`` text: byte-level BPE, ``vocab_size`` entries in all, ``specials``
    first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(TEXT.splitlines(), trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise SystemExit(f"make_toy_assets: the tokenizer has {tokenizer.get_vocab_size()} entries, the configs' "
                         f"vocab_size is {vocab_size}; write more text")
    return tokenizer.to_str(pretty=True) + "\n"


def tokenizer_config(max_length: int) -> str:
    """``tokenizer_config.json``: the special tokens and the prompt length the engines take."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": SPECIAL_TOKENS[0],
        "bos_token": SPECIAL_TOKENS[1],
        "eos_token": SPECIAL_TOKENS[2],
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    return json.dumps(config, indent=2) + "\n"


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """A ``.safetensors`` file: the header length, the JSON header padded to 8 bytes, the little-endian data."""
    header: dict[str, object] = {}
    blobs, offset = [], 0
    tags = {"float16": "F16", "float32": "F32"}
    for name, value in tensors.items():
        data = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": tags[value.dtype.name], "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def make_assets(engines: Path) -> dict[str, bytes]:
    """Every file this script writes, by path relative to ``engines`` (all under ``toy-assets/``). One set serves
    every directory only while their models agree on what the files depend on: SystemExit where they do not."""
    ragged, batch = RaggedToyEngines.load(engines), ToyEngines.load(engines)
    cfg = ragged.llm_config
    vlm = VisionToyEngines.load(engines / "toy-vlm-ragged")
    for toys in (ragged, batch):
        got = (toys.llm_config.vocab_size, toys.llm_config.hidden_size, toys.llm_config.max_supported_input_length,
               toys.seed)
        if got != (cfg.vocab_size, cfg.hidden_size, cfg.max_supported_input_length, ragged.seed):
            raise SystemExit(f"make_toy_assets: the toy models differ in vocab, hidden size, prompt length or seed "
                             f"({got}); one {ASSETS_DIR}/ cannot serve them all")
    if (vlm.config.vocab_size, vlm.config.hidden_size) != (cfg.vocab_size, cfg.hidden_size):
        raise SystemExit("make_toy_assets: the vision-language toy's vocabulary or hidden size differs from the "
                         f"others': it cannot link {ASSETS_DIR}/{EMBEDDING_FILE}")
    table = ragged.embedding().astype(np.float16)
    files = {TOKENIZER_FILE: train_tokenizer(cfg.vocab_size).encode(),
             TOKENIZER_CONFIG_FILE: tokenizer_config(cfg.max_supported_input_length).encode(),
             EMBEDDING_FILE: safetensors_bytes({"embedding": table})}
    assert sorted(files) == sorted(TOY_ASSETS)
    out = {f"{ASSETS_DIR}/{name}": data for name, data in files.items()}
    # The vision-language toy's own tokenizer: the same vocabulary with its image markers as special tokens.
    vlm_files = {TOKENIZER_FILE: train_tokenizer(cfg.vocab_size, SPECIAL_TOKENS + VISION_TOKENS).encode(),
                 TOKENIZER_CONFIG_FILE: tokenizer_config(vlm.config.max_supported_input_length).encode()}
    for name in OWN_ASSETS["toy-vlm-ragged"]:
        out[f"toy-vlm-ragged/{name}"] = vlm_files[name]
    gemma4 = EngineDir.open(engines / GEMMA4_DIR).config
    if (gemma4.vocab_size, gemma4.hidden_size) != (cfg.vocab_size, cfg.hidden_size):
        raise SystemExit(f"make_toy_assets: {GEMMA4_DIR}'s vocabulary or hidden size differs from the others': it "
                         f"cannot link {ASSETS_DIR}/{EMBEDDING_FILE}")
    out[f"{GEMMA4_DIR}/{PLE_EMBEDDING_FILE}"] = safetensors_bytes({"weight": toy_ple_embedding(gemma4)})
    return out


def links() -> dict[str, str]:
    """Each toy directory's asset links: path relative to the engines folder -> the link's target."""
    return {f"{d}/{a}": f"../{ASSETS_DIR}/{a}" for d in TOY_DIRECTORIES for a in linked_assets(d)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=Path, default=ROOT / "engines", help="the engines folder (default: engines/)")
    parser.add_argument("--check", action="store_true", help="compare with the files there instead of writing")
    args = parser.parse_args(argv)
    differ = []
    for rel, data in make_assets(args.engines).items():
        path = args.engines / rel
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                differ.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path} ({len(data)} bytes)")
    for rel, target in links().items():
        path = args.engines / rel
        if args.check:
            if not path.is_symlink() or str(path.readlink()) != target:
                differ.append(rel)
            continue
        path.unlink(missing_ok=True)
        path.symlink_to(target)
    if differ:
        print("make_toy_assets: these files differ from what the script makes: " + ", ".join(differ), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
