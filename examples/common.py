"""What the examples share: opening an engine directory, prompts, and the array library that samples.

An example runs on the toy engines trtio comes with by default (``toy-llm-ragged``, ``toy-eagle3-ragged``: in a
checkout ``engines/``; configs without engine files, so the engines are ReferenceEngines computing
the toy model) or on an Edge-LLM engine directory given as an argument (with ``llm.engine``, or
``spec_base.engine`` + ``spec_draft.engine``: TensorRT engines, Edge-LLM's plugin in EDGELLM_PLUGIN_PATH).

Sampling runs where the logits are. On a GPU: torch, else CuPy, each on trtio's stream, reading the
logits in place (DLPack) and handing the steps their own arrays, which trtio reads in place (a steady decode
reads a torch tensor without a DLPack capsule); nothing is copied to the host until the tokens are printed.
Without a GPU: numpy.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import trtio
from trtio.testing import ReferenceEngine, ToyWeights
from trtio.testing.toy_dirs import default_engines_dir

ENGINES = default_engines_dir()  # the toy engine directories trtio comes with (a checkout's engines/, or a wheel's)
PROMPTS = ("Once upon a time", "The quick brown fox jumps over the lazy dog.")


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (a usage error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def parser(description: str, default_dir: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("engine_dir", nargs="?", type=Path, default=ENGINES / default_dir,
                   help=f"an Edge-LLM engine directory (default: engines/{default_dir})")
    p.add_argument("--max-new-tokens", type=positive_int, default=32)
    p.add_argument("--backend", default="auto", choices=["auto", "host", "cuda"])
    p.add_argument("--array", default="auto", choices=["auto", "torch", "cupy", "numpy"],
                   help="the library that samples (default: torch, else CuPy, on a GPU; numpy without one; torch "
                        "runs on the CPU with the host backend)")
    return p


def run(main: Callable[[], None]) -> None:
    """Run an example's ``main``: an error ends it with one line on stderr (``NAME: error: ...``) and exit status 1,
    without a traceback (usage errors stay argparse's: status 2)."""
    prog = Path(sys.argv[0]).name
    try:
        main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - one clear line, whatever failed
        text = " ".join(str(exc).split()) or type(exc).__name__
        if not isinstance(exc, (trtio.TrtioError, OSError)):
            text = f"{type(exc).__name__}: {text}"
        print(f"{prog}: error: {text}", file=sys.stderr)
        sys.exit(1)


def check_kind(p: argparse.ArgumentParser, path: Path, kind: str) -> trtio.EngineDir:
    """The engine directory at ``path``, which must hold ``kind`` (``"llm"``: a plain LLM, ``"spec_decode"``: a
    speculative pair); another kind is a usage error naming what the example takes."""
    d = trtio.EngineDir.open(path)
    if d.kind != kind:
        held, wanted = (("a speculative pair", "a plain LLM directory") if kind == "llm" else
                        ("a plain LLM", "a speculative pair (base_config.json + draft_config.json)"))
        p.error(f"{path} holds {held}; {Path(sys.argv[0]).name} takes {wanted}")
    return d


def check_budget(d: trtio.EngineDir, longest_prompt: int, max_new_tokens: int, extra: int = 0) -> None:
    """Refuse ``--max-new-tokens`` where a sequence of ``longest_prompt`` tokens would outgrow the KV cache
    (``extra``: entries a step writes past a sequence's length, e.g. a speculative round's tree). The last new
    token is never written to the cache: a sequence holds ``prompt + new - 1`` entries at most."""
    cfg = d.config if d.kind == "llm" else d.base_config
    need = longest_prompt + max_new_tokens - 1 + extra
    if need > cfg.max_kv_cache_capacity:
        room = cfg.max_kv_cache_capacity - longest_prompt - extra + 1
        past = f" (and {extra} entries a round writes past it)" if extra else ""
        raise trtio.ConfigError("--max-new-tokens", f"{max_new_tokens} tokens after a prompt of {longest_prompt}{past}"
                                                    f" outgrow the KV cache of {cfg.max_kv_cache_capacity} "
                                                    f"(max_kv_cache_capacity): at most {max(room, 0)} here")


def open_directory(path: Path, backend: str, **tree: int) -> tuple[Any, Any, np.ndarray | None]:
    """(setup, the directory's token embeddings on the setup's device (``EngineDir.embeddings``), draft-to-target
    map or None) of an engine directory; close the embeddings with the setup. ``tree`` is a pair's draft_top_k,
    draft_step and verify_size."""
    d = trtio.EngineDir.open(path)
    d2t = d.draft_to_target() if d.kind == "spec_decode" else None
    setup = _setup(d, path, backend, tree)
    return setup, d.embeddings(setup.io.backend, trtio.Stream.default(setup.io.backend)), d2t


def _setup(d: trtio.EngineDir, path: Path, backend: str, tree: dict[str, int]) -> Any:
    be = None if backend == "auto" else backend
    if d.has_engines:
        return trtio.create_from_engine_dir(path, graphs=True, backend=be, **tree)
    # Configs only (the toys): ReferenceEngines with the toy model's seeded weights, computing where the backend is.
    device = {"cuda": "gpu"}.get(backend, backend)
    if d.kind == "llm":
        engine = ReferenceEngine.from_config(d.config, weights=ToyWeights.generate(d.config), device=device)
        return trtio.create_for_llm(engine, d.config, graphs=True)
    weights = ToyWeights.generate(d.base_config)
    base = ReferenceEngine.from_config(d.base_config, weights=weights, device=device)
    draft = ReferenceEngine.from_config(d.draft_config, device=device,
                                        weights=ToyWeights.generate_draft(d.draft_config, weights))
    bundle = d.deployment(tree["draft_top_k"], tree["draft_step"], tree["verify_size"])
    return trtio.create_for_spec_decode(base, draft, bundle, graphs=True)


def embedded(emb: Any, lib: Any, ids: Any) -> tuple[Any, dict[str, Any]]:
    """A step's ``inputs_embeds`` for token ids ``[batch, seq]`` (host ints or ``lib``'s arrays on the device),
    gathered on the device by the directory's embeddings (``emb``, from :func:`open_directory`) on trtio's stream,
    and the step's other embedding inputs as keywords (a Gemma 4 directory's ``ple_embeds``)."""
    out = emb.embed(lib.ids(ids), lib.stream)
    if isinstance(out, tuple):
        return out[0], {"ple_embeds": out[1]}
    return out, {}


def prompt_ids(path: Path) -> list[list[int]]:
    """The prompts as token ids: with the directory's tokenizer.json where Hugging Face tokenizers is installed,
    else fixed ids."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    return [tokenizer.encode(p).ids for p in PROMPTS]


def padded(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token rows right-padded with 0 into one [batch, longest] array, and their lengths."""
    lengths = np.array([len(r) for r in rows])
    out = np.zeros((len(rows), int(lengths.max())), np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out, lengths


class Numpy:
    """Sampling on the host: the logits are copied out, the embeddings staged in by trtio."""

    name = "numpy"

    def __init__(self, stream: trtio.Stream) -> None:
        self.stream = stream

    def array(self, host: np.ndarray) -> Any:
        return host

    def logits(self, t: trtio.Tensor) -> Any:
        return t.to_numpy(self.stream)

    def topk(self, x: Any, k: int) -> Any:
        return np.argsort(-x, axis=-1, kind="stable")[..., :k]

    def cat(self, parts: list[Any]) -> Any:
        return np.concatenate(parts, axis=1)

    def gather(self, x: Any, index: Any) -> Any:
        """``out[b, i] = x[b, index[b, i]]``."""
        return np.take_along_axis(x, index, axis=1)

    def to_input(self, x: Any) -> Any:
        return x

    def ids(self, x: Any) -> Any:
        """Token ids as the directory's embeddings take them: host ints, or int32 on the device."""
        return np.asarray(x)

    def host(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def running(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


class Torch(Numpy):
    """Sampling with torch, on trtio's stream: logits read in place, inputs handed over in place. On the GPU
    with the cuda backend; on the CPU with the host backend (the same code, as CI runs it)."""

    name = "torch"

    def __init__(self, stream: trtio.Stream) -> None:
        import torch

        super().__init__(stream)
        self.torch = torch
        self.device = "cuda" if stream.backend.name == "cuda" else "cpu"

    def array(self, host: np.ndarray) -> Any:
        return self.torch.as_tensor(host, device=self.device)

    def logits(self, t: trtio.Tensor) -> Any:
        return self.torch.from_dlpack(t)  # zero copy; ordered after trtio's write of it

    def topk(self, x: Any, k: int) -> Any:
        return x.topk(k, dim=-1).indices

    def cat(self, parts: list[Any]) -> Any:
        return self.torch.cat(parts, dim=1)

    def gather(self, x: Any, index: Any) -> Any:
        return self.torch.gather(x, 1, index)

    def to_input(self, x: Any) -> Any:
        return x.contiguous()  # a step reads it in place, on trtio's stream, which torch runs on

    def ids(self, x: Any) -> Any:
        if isinstance(x, np.ndarray):  # a prompt's ids, from the host
            return x
        return x.to(self.torch.int32).contiguous()  # read in place on the device (host ints on the CPU)

    def host(self, x: Any) -> np.ndarray:
        return np.asarray(x.cpu().numpy())

    def running(self) -> Any:
        if self.device == "cpu":
            return super().running()
        return self.torch.cuda.stream(self.torch.cuda.ExternalStream(self.stream.handle))


class Cupy(Numpy):
    """Sampling on the GPU with CuPy, on trtio's stream."""

    name = "cupy"

    def __init__(self, stream: trtio.Stream) -> None:
        import cupy

        super().__init__(stream)
        self.cupy = cupy
        self.cupy_stream = cupy.cuda.ExternalStream(stream.handle)

    def array(self, host: np.ndarray) -> Any:
        return self.cupy.asarray(host)

    def logits(self, t: trtio.Tensor) -> Any:
        return self.cupy.from_dlpack(t)

    def topk(self, x: Any, k: int) -> Any:
        return self.cupy.argsort(-x, axis=-1)[..., :k]

    def cat(self, parts: list[Any]) -> Any:
        return self.cupy.concatenate(parts, axis=1)

    def gather(self, x: Any, index: Any) -> Any:
        return self.cupy.take_along_axis(x, index, axis=1)

    def to_input(self, x: Any) -> Any:
        return self.cupy.ascontiguousarray(x)  # a step reads it in place (DLPack), on trtio's stream

    def ids(self, x: Any) -> Any:
        if isinstance(x, np.ndarray):  # a prompt's ids, from the host
            return x
        return self.cupy.ascontiguousarray(x, dtype=self.cupy.int32)  # read in place on the device

    def host(self, x: Any) -> np.ndarray:
        return np.asarray(self.cupy.asnumpy(x))

    def running(self) -> Any:
        return self.cupy_stream


def array_library(choice: str, setup: Any) -> Numpy:
    """The library that samples: ``choice``, or on the cuda backend torch (with CUDA), else CuPy, else numpy."""
    stream = trtio.Stream.default(setup.io.backend)  # the setups here run on the thread's default stream
    if choice == "auto":
        choice = "numpy"
        if setup.io.backend.name == "cuda":
            try:
                import torch

                choice = "torch" if torch.cuda.is_available() else choice
            except ImportError:
                pass
            if choice == "numpy":
                try:
                    import cupy  # noqa: F401

                    choice = "cupy"
                except ImportError:
                    pass
    try:
        return {"numpy": Numpy, "torch": Torch, "cupy": Cupy}[choice](stream)
    except ImportError as exc:
        raise trtio.NotAvailableError(f"--array {choice}: {exc.name or choice} is not installed here") from None
