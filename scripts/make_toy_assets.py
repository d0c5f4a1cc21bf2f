"""Write the runtime files of the toy engine directories in TensorRT Edge-LLM's layout.

Each toy directory of ``engines/`` (``toy-llm-ragged``, ``toy-eagle3-ragged``, ``toy-llm``, ``toy-eagle``) gets
what Edge-LLM's builder writes beside its engines for a runtime to use:

* ``tokenizer.json`` + ``tokenizer_config.json``: a byte-level BPE tokenizer (Hugging Face ``tokenizers``)
  trained on the English text below, with exactly the configs' ``vocab_size`` (512) entries: ``<unk>``,
  ``<s>``, ``</s>`` (id 2, the configs' ``eos_token_id``), for the vision-language toy (``toy-vlm-ragged``)
  its vision markers (ids 3 .. 6), the 256 bytes, then merges. Any English prompt round-trips: every byte
  has a token;
* ``embedding.safetensors``: the toy token embedding table the demo and the tests use,
  ``trtio.testing.toy_model.toy_embedding(vocab, hidden, seed)`` as float16, under Edge-LLM's tensor name
  ``"embedding"``.

``tests/test_generate.py`` checks that the committed files are what this script makes. Run it after
changing the toy configs or this text::

    python3 scripts/make_toy_assets.py            # rewrite the files under engines/
    python3 scripts/make_toy_assets.py --check    # exit 1 when a committed file differs
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtio.edgellm import EMBEDDING_FILE  # noqa: E402 - after the path set-up, so a checkout runs as it is
from trtio.testing.toy_engines import RaggedToyEngines, ToyEngines, VisionToyEngines  # noqa: E402

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: the toy configs' eos_token_id is [2]
# The vision-language toy's markers, ids 3 .. 6 (its configs' vision_start / vision_end / image / video token ids).
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
DIRECTORIES = ("toy-llm-ragged", "toy-eagle3-ragged", "toy-llm", "toy-eagle", "toy-vlm-ragged")

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
    """Every file this script writes, by path relative to ``engines``."""
    ragged, batch = RaggedToyEngines.load(engines), ToyEngines.load(engines)
    vlm = VisionToyEngines.load(engines / "toy-vlm-ragged")
    out: dict[str, bytes] = {}
    tokenizers: dict[tuple[int, tuple[str, ...]], str] = {}
    for name in DIRECTORIES:
        toys: Any = vlm if name == "toy-vlm-ragged" else \
            ragged if name in ("toy-llm-ragged", "toy-eagle3-ragged") else batch
        cfg = toys.config if name == "toy-vlm-ragged" else toys.llm_config
        specials = SPECIAL_TOKENS + (VISION_TOKENS if name == "toy-vlm-ragged" else ())
        if (cfg.vocab_size, specials) not in tokenizers:
            tokenizers[cfg.vocab_size, specials] = train_tokenizer(cfg.vocab_size, specials)
        out[f"{name}/{TOKENIZER_FILE}"] = tokenizers[cfg.vocab_size, specials].encode()
        out[f"{name}/{TOKENIZER_CONFIG_FILE}"] = tokenizer_config(cfg.max_supported_input_length).encode()
        table = toys.embedding().astype(np.float16)
        out[f"{name}/{EMBEDDING_FILE}"] = safetensors_bytes({"embedding": table})
    return out


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
        path.write_bytes(data)
        print(f"wrote {path} ({len(data)} bytes)")
    if differ:
        print("make_toy_assets: these files differ from what the script makes: " + ", ".join(differ), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
