"""``trtio plan`` and ``trtio inspect`` on TensorRT Edge-LLM 0.11 engine directories (trtio._tools.engine_dirs).

The directories are the real-format configs of ``tests/fixtures/edgellm*`` (written by NVIDIA's package; no
engine files) and the ragged toy engines of ``engines/``. Plans that "deserialize" are ReferenceEngines handed
out by a patched ``trtio._trt.load_engine``, so the plan code path runs here; everything else is the real code.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
from trtio import create_for_llm, create_for_spec_decode
from trtio._cli import build_parser, main
from trtio._cuda.backend import cuda_available
from trtio._tools.engine_dirs import edgellm_directory, runtime_values
from trtio._tools.inspection import plan_config
from trtio.edgellm import EngineDir
from trtio.testing.reference_engine import ReferenceEngine
from trtio.testing.toy_engines import default_engines_dir

FIXTURES = Path(__file__).parent / "fixtures"
EDGELLM = FIXTURES / "edgellm"
EDGELLM_011 = FIXTURES / "edgellm-0.11"
ENGINES = default_engines_dir()
RAGGED_LLM = ENGINES / "toy-llm-ragged"
RAGGED_PAIR = ENGINES / "toy-eagle3-ragged"

PLAIN = [EDGELLM_011 / "qwen3-tiny-llm", EDGELLM / "llama3.1-tiny", EDGELLM / "qwen3-fp8kv-tiny",
         EDGELLM / "qwen2.5-vl-tiny", EDGELLM / "qwen3-vl-tiny", EDGELLM / "llama3.1-hublayout-tiny",
         EDGELLM / "llama-linear-tiny", EDGELLM / "mistral-dynamic-swa-tiny", EDGELLM / "qwen3-yarn-tiny",
         EDGELLM / "qwen3-reduced-vocab-tiny", EDGELLM / "phi4mm-longrope-tiny", EDGELLM / "qwen2.5-vl-hublayout-tiny",
         RAGGED_LLM]
PAIRS = [EDGELLM_011 / "qwen3-tiny-eagle3", EDGELLM / "qwen3-eagle3-tiny", RAGGED_PAIR]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, command: str, *needles: str) -> str:
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"trtio {command}: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def _pool_shape(cfg: trtio.LLMEngineConfig) -> list[int]:
    return [2, cfg.kv_pool_pages, 128, cfg.num_kv_heads, cfg.head_dim]


# -- telling the targets apart ----------------------------------------------------------------------------


def test_edgellm_targets_are_told_from_trtios_own(tmp_path: Path) -> None:
    assert edgellm_directory(RAGGED_LLM) == RAGGED_LLM
    assert edgellm_directory(RAGGED_LLM / "config.json") == RAGGED_LLM
    assert edgellm_directory(RAGGED_PAIR) == RAGGED_PAIR
    assert edgellm_directory(RAGGED_PAIR / "draft_config.json") == RAGGED_PAIR
    assert edgellm_directory(EDGELLM / "qwen3-tp2-tiny") == EDGELLM / "qwen3-tp2-tiny"  # tensor parallel
    for own in (ENGINES / "toy-llm", ENGINES / "toy-llm" / "config.json", ENGINES / "toy-eagle",
                ENGINES / "toy-eagle" / "base" / "config.json"):
        assert edgellm_directory(own) is None
    (tmp_path / "llm.engine").write_bytes(b"x")
    assert edgellm_directory(tmp_path / "llm.engine") == tmp_path  # an engine file names its directory
    assert edgellm_directory(tmp_path) == tmp_path


# -- plan ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", PLAIN, ids=_ids(PLAIN))
def test_plan_a_plain_llm_directory_lists_its_paged_pools(capsys: pytest.CaptureFixture[str], directory: Path) -> None:
    cfg = EngineDir.open(directory).config
    rc, out, err = run(capsys, "plan", str(directory), "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["kind"] == "edgellm" and result["directory_kind"] == "llm"
    assert result["factory"] == "create_for_llm" and result["contract"] == "ragged"
    assert result["runtime"] is None and result["engine_files"] == {"llm": None}
    [kv] = result["kv_state"]
    pages_per_sequence = -(-cfg.max_kv_cache_capacity // 128)
    assert kv["role"] == "llm" and kv["layout"] == "paged"
    assert kv["names"] == [f"past_key_values_{i}" for i in range(cfg.num_attention_layers)]
    assert kv["shape"] == _pool_shape(cfg) and kv["dtype"] == cfg.kv_cache_dtype
    assert kv["page_size"] == 128 and kv["pool_pages"] == cfg.kv_pool_pages
    assert kv["pages_per_sequence"] == pages_per_sequence
    assert kv["page_table_shape"] == [cfg.max_supported_batch_size, 2, pages_per_sequence]
    entries = {f"{e['group']}/{e['name']}": e for e in result["memory"]["entries"]}
    pool_bytes = trtio.DType.coerce(cfg.kv_cache_dtype).nbytes(2 * cfg.kv_pool_pages * 128 * cfg.num_kv_heads
                                                                * cfg.head_dim)
    for i in range(cfg.num_attention_layers):
        assert entries[f"llm state/past_key_values_{i}"]["nbytes"] == pool_bytes
    assert kv["bytes"] == cfg.num_attention_layers * pool_bytes
    assert "PipelineIO(llm, ragged)/kv_page_table" in entries and "context_memory" not in entries  # staged per step

    rc, text, _ = run(capsys, "plan", str(directory))
    assert rc == 0
    assert text.startswith(f"create_for_llm for the Edge-LLM engine directory {directory} (config.json; engine "
                           "files: none (configs only))")
    assert f"llm: {cfg.num_attention_layers} paged KV pool" in text
    assert f"page table [{cfg.max_supported_batch_size},2,{pages_per_sequence}] int32" in text
    assert "past_key_values_0" in text and "context memory: not included" in text


@pytest.mark.parametrize("directory", PAIRS, ids=_ids(PAIRS))
def test_plan_a_speculative_pair_defaults_to_the_largest_tree(capsys: pytest.CaptureFixture[str],
                                                              directory: Path) -> None:
    d = EngineDir.open(directory)
    rc, out, err = run(capsys, "plan", str(directory), "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["directory_kind"] == "spec_decode" and result["factory"] == "create_for_spec_decode"
    assert result["runtime"] == {"draft_top_k": 1, "draft_step": d.draft_config.max_draft_tree_size,
                                 "verify_size": d.base_config.max_verify_tree_size,
                                 "defaulted": ["draft_top_k", "draft_step", "verify_size"]}
    kv = {r["role"]: r for r in result["kv_state"]}
    for role, cfg in (("base", d.base_config), ("draft", d.draft_config)):
        assert kv[role]["layout"] == "paged" and kv[role]["tensors"] == cfg.num_attention_layers
        assert kv[role]["shape"] == _pool_shape(cfg)
    names = {f"{e['group']}/{e['name']}" for e in result["memory"]["entries"]}
    assert {"base state/past_key_values_0", "draft state/past_key_values_0",
            "PipelineIO(spec_decode, ragged)/kv_page_table", "PipelineIO(spec_decode, ragged)/draft_kv_page_table"} \
        <= names  # the page tables are staged per step with the step's inputs
    rc, text, _ = run(capsys, "plan", str(directory))
    assert "run-time values: --draft-top-k 1" in text and "(defaulted: --draft-top-k, --draft-step, --verify-size;" \
        in text
    pools = d.draft_config.num_attention_layers  # the toy draft copies its base's 4 layers; real EAGLE3 drafts have 1
    assert "base: " in text and f"draft: {pools} paged KV pool{'s' if pools > 1 else ''}," in text


def test_plan_takes_edgellms_run_time_values(capsys: pytest.CaptureFixture[str]) -> None:
    directory = EDGELLM / "qwen3-eagle3-tiny"  # caps: verify 48, draft tree 24
    rc, out, _ = run(capsys, "plan", str(directory), "--draft-top-k", "2", "--draft-step", "3", "--verify-size", "8",
                     "--json")
    assert rc == 0 and json.loads(out)["runtime"] == {"draft_top_k": 2, "draft_step": 3, "verify_size": 8,
                                                      "defaulted": []}
    rc, out, _ = run(capsys, "plan", str(directory), "--draft-top-k", "5", "--json")
    assert rc == 0 and json.loads(out)["runtime"]["draft_step"] == 4  # the largest 5 x step <= 24
    rc, out, _ = run(capsys, "plan", str(directory), "--draft-step", "6", "--verify-size", "48", "--json")
    assert rc == 0 and json.loads(out)["runtime"] == {"draft_top_k": 1, "draft_step": 6, "verify_size": 48,
                                                      "defaulted": ["draft_top_k"]}


def test_plan_help_says_the_defaults(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside hyphenated words
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["plan", "--help"])
    assert info.value.code == 0, "help is not an error"
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("--draft-top-k N", "--draft-step N", "--verify-size N", "(default: 1)",
                   "(default: the largest that fits, builder_config.max_draft_tree_size // draft-top-k)",
                   "(default: builder_config.max_verify_tree_size)", "Edge-LLM engine directories",
                   "--verify-size = builder_config.max_verify_tree_size of base_config.json, --draft-top-k 1 and "
                   "--draft-step = builder_config.max_draft_tree_size of draft_config.json"):
        assert needle in text


def test_plan_of_a_config_inside_a_directory_is_the_directorys(capsys: pytest.CaptureFixture[str]) -> None:
    rc, a, _ = run(capsys, "plan", str(RAGGED_PAIR), "--json")
    rc2, b, _ = run(capsys, "plan", str(RAGGED_PAIR / "base_config.json"), "--json")
    assert rc == rc2 == 0
    assert json.loads(a)["memory"] == json.loads(b)["memory"]


@pytest.mark.parametrize("directory", [RAGGED_LLM, RAGGED_PAIR], ids=["llm", "pair"])
def test_plan_is_the_live_setups_memory_without_context_memory(directory: Path) -> None:
    d = EngineDir.open(directory)
    bundle, runtime = runtime_values(d, 2, 3, 8) if d.kind == "spec_decode" else runtime_values(d)
    if bundle.draft is None:
        setup: Any = create_for_llm(ReferenceEngine.from_config(bundle.base, device="host"), bundle.base,
                                    backend="host")
    else:
        setup = create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device="host"),
                                       ReferenceEngine.from_config(bundle.draft, device="host"), bundle, backend="host")
    with setup:
        live = setup.memory_report()
    kwargs = {"draft_top_k": 2, "draft_step": 3, "verify_size": 8} if runtime is not None else {}
    planned = plan_config(directory, **kwargs)["memory"]
    got = [(e["name"], list(e["shape"]), e["nbytes"], e["location"]) for e in planned["entries"]]
    want = [(e.name, list(e.shape), e.nbytes, str(e.location)) for e in live.entries if e.name != "context_memory"]
    assert got == want
    assert planned["total_required"] == live.total_required - live.entry("context_memory").nbytes


def test_plan_an_8b_class_directory_allocates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((EDGELLM / "llama3.1-tiny" / "config.json").read_text())
    data.update(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                vocab_size=128256, intermediate_size=14336)
    data["builder_config"].update(max_batch_size=8, max_input_len=4096, max_kv_cache_capacity=8192,
                                  max_kv_pool_pages=8 * 64)
    (tmp_path / "config.json").write_text(json.dumps(data))
    t0 = time.perf_counter()
    rc, out, err = run(capsys, "plan", str(tmp_path), "--json")
    assert rc == 0, err
    assert time.perf_counter() - t0 < 10
    pool = 2 * 512 * 128 * 8 * 128 * 2  # [2, pages, 128, kv heads, head dim] fp16: 256 MiB a layer
    entries = {f"{e['group']}/{e['name']}": e for e in json.loads(out)["memory"]["entries"]}
    assert entries["llm state/past_key_values_35"]["nbytes"] == pool
    assert json.loads(out)["memory"]["total_required"] > 36 * pool  # 9 GiB laid out, none of it allocated


# -- the sequence budget: how many sequences of a given length fit the KV pools ----------------------------------


def _small_pool(src: Path, root: Path, pages: int) -> Path:
    """A copy of a ragged toy directory whose pools hold ``pages`` pages (4 slots x 2 pages would be 8)."""
    names = ["base_config.json", "draft_config.json"] if (src / "base_config.json").is_file() else ["config.json"]
    d = _copy(src, root, *names)
    for name in names:
        _edit(d / name, builder_config__max_kv_pool_pages=pages)
    return d


def _grow(setup: trtio.LLMSetup, slot: int, tokens: int) -> None:
    """Admit a sequence into ``slot`` and prefill it to ``tokens`` tokens in chunks of max_input_len."""
    hidden, chunk = setup.cfg.hidden_size, setup.cfg.max_supported_input_length
    done = 0
    while done < tokens:
        n = min(chunk, tokens - done)
        x = np.zeros((1, n, hidden), np.float16)
        setup.prefill(x, [n], slots=[slot], past_lengths=None if done == 0 else [done])
        done += n


@pytest.mark.parametrize(("length", "pages", "fit"), [(None, 2, 2), (100, 1, 4), (128, 1, 4), (129, 2, 2),
                                                      (256, 2, 2)])
def test_plan_counts_the_sequences_a_pool_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                length: int | None, pages: int, fit: int) -> None:
    """A plain LLM: a sequence of N tokens takes ceil(N / 128) pages; a pool of 5 pages holds 5 // pages of them,
    and never more than the 4 slots. A live setup of the same directory admits exactly that many."""
    d = _small_pool(RAGGED_LLM, tmp_path / "llm", 5)
    argv = [] if length is None else ["--sequence-length", str(length)]
    rc, out, err = run(capsys, "plan", str(d), "--json", *argv)
    assert rc == 0, err
    seqs = json.loads(out)["sequences"]
    n = 256 if length is None else length
    assert seqs["length"] == n and seqs["defaulted"] == (length is None) and seqs["longest"] == 256
    [llm] = seqs["engines"]
    assert llm == {"role": "llm", "layout": "paged", "round_width": 0, "entries": n, "slots": 4, "pages": pages,
                   "page_size": 128, "pool_pages": 5, "fit_pool": 5 // pages, "fit": fit}
    assert seqs["fit"] == fit
    rc, text, _ = run(capsys, "plan", str(d), *argv)
    source = "default: max_kv_cache_capacity" if length is None else "--sequence-length"
    limit = "the slots" if fit == 4 else "the pool"
    assert f"sequences of {n} tokens ({source}):" in text
    assert (f"  llm: {n} entries, {pages} page{'s' if pages > 1 else ''} of 128 tokens each; the pool's 5 pages hold "
            f"{5 // pages} such sequences, with 4 slots: {fit} fit (limited by {limit})") in text

    cfg = EngineDir.open(d).config
    with create_for_llm(ReferenceEngine.from_config(cfg, null_compute=True, device="host"), cfg,
                        backend="host") as setup:
        for slot in range(fit):
            _grow(setup, slot, n)
        assert setup.kv_pages.used == fit * pages
        if fit < 4:
            with pytest.raises(trtio.CapacityError, match=r"slot 3 needs 1 more KV page"):
                _grow(setup, 3, n)


def test_plan_counts_a_speculative_pairs_rounds_past_each_sequence(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A pair: the base's verify writes its tree (8 entries) past a sequence's length, the draft's proposal round
    its tree (2 x 3) or a catch-up the longest path (3 + 1): the default length leaves room for the widest, and
    each pool counts the sequence with its own round; the pair holds what both pools hold."""
    tree = ["--draft-top-k", "2", "--draft-step", "3", "--verify-size", "8"]
    rc, out, err = run(capsys, "plan", str(RAGGED_PAIR), "--json", *tree)
    assert rc == 0, err
    seqs = json.loads(out)["sequences"]
    assert seqs["length"] == seqs["longest"] == 256 - 8 and seqs["defaulted"]
    base, draft = seqs["engines"]
    assert (base["role"], base["round_width"], base["entries"], base["pages"], base["fit"]) == ("base", 8, 256, 2, 4)
    assert (draft["role"], draft["round_width"], draft["entries"], draft["pages"], draft["fit"]) == \
        ("draft", 6, 254, 2, 4)
    rc, out, _ = run(capsys, "plan", str(RAGGED_PAIR), "--json", "--draft-top-k", "1", "--draft-step", "5",
                     "--verify-size", "8")
    assert [e["round_width"] for e in json.loads(out)["sequences"]["engines"]] == [8, 6], "a catch-up of 5 + 1"

    d = _small_pool(RAGGED_PAIR, tmp_path / "pair", 5)
    rc, out, err = run(capsys, "plan", str(d), "--json", "--sequence-length", "121", *tree)
    assert rc == 0, err
    seqs = json.loads(out)["sequences"]
    base, draft = seqs["engines"]
    assert (base["entries"], base["pages"], base["fit_pool"], base["fit"]) == (129, 2, 2, 2)
    assert (draft["entries"], draft["pages"], draft["fit_pool"], draft["fit"]) == (127, 1, 5, 4)
    assert seqs["fit"] == 2
    rc, text, _ = run(capsys, "plan", str(d), "--sequence-length", "121", *tree)
    assert "  base: 121 + 8 entries a verify writes past them = 129 entries, 2 pages of 128 tokens each" in text
    assert "  draft: 121 + 6 entries a proposal round or catch-up writes past them = 127 entries, 1 page" in text
    assert "  2 fit in every engine's KV state" in text
    rc, text, _ = run(capsys, "plan", str(d), *tree)
    assert ("sequences of 248 tokens (default: the longest a speculative pair runs rounds on, max_kv_cache_capacity "
            "less its widest round of 8 entries):") in text


@pytest.mark.parametrize(("directory", "length", "needles"), [
    (RAGGED_LLM, "257", ["257 tokens", "at most 256", "max_kv_cache_capacity is 256"]),
    (RAGGED_PAIR, "249", ["249 tokens", "at most 248", "base: a verify writes 8 entries past a sequence's length"]),
], ids=["llm", "pair"])
def test_a_sequence_longer_than_the_engines_run_is_one_line(capsys: pytest.CaptureFixture[str], directory: Path,
                                                            length: str, needles: list[str]) -> None:
    rc, out, err = run(capsys, "plan", str(directory), "--sequence-length", length)
    assert_one_line_error(rc, err, "plan", "--sequence-length", *needles)
    assert out == ""
    rc, _, err = run(capsys, "plan", str(directory), "--sequence-length", "0")
    assert rc == 2 and "--sequence-length" in err and "positive int" in err


def test_plan_of_contiguous_caches_fits_a_sequence_per_slot(capsys: pytest.CaptureFixture[str]) -> None:
    """trtio's batch toy contract: each slot owns a cache of max_kv_cache_capacity entries; no pool to share."""
    rc, out, err = run(capsys, "plan", str(ENGINES / "toy-llm" / "config.json"), "--json", "--sequence-length", "100")
    assert rc == 0, err
    seqs = json.loads(out)["sequences"]
    cfg = trtio.DeploymentConfig.from_json(ENGINES / "toy-llm" / "config.json").base
    assert seqs["fit"] == cfg.max_supported_batch_size and seqs["longest"] == cfg.max_kv_cache_capacity
    assert seqs["engines"][0]["layout"] == "contiguous" and seqs["engines"][0]["pages"] is None
    rc, text, _ = run(capsys, "plan", str(ENGINES / "toy-llm" / "config.json"), "--sequence-length", "100")
    assert (f"  llm: 100 entries in a contiguous cache per slot; {cfg.max_supported_batch_size} slots: "
            f"{cfg.max_supported_batch_size} fit") in text


def _copy(src: Path, dst: Path, *names: str) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(src / name, dst / name)
    return dst


def _edit(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        node = data
        *parents, last = key.split("__")
        for p in parents:
            node = node[p]
        if value is None:
            del node[last]
        else:
            node[last] = value
    path.write_text(json.dumps(data))


def _broken(kind: str, root: Path) -> tuple[Path, list[str], list[str]]:
    """(directory, extra argv, needles of its one-line error)."""
    if kind == "missing key":
        d = _copy(RAGGED_LLM, root, "config.json")
        _edit(d / "config.json", hidden_size=None)
        return d, [], ["config.json: hidden_size: is required"]
    if kind == "missing builder key":
        d = _copy(RAGGED_LLM, root, "config.json")
        _edit(d / "config.json", builder_config__max_batch_size=None)
        return d, [], ["config.json: builder_config.max_batch_size: is required"]
    if kind == "unsupported family":  # Gemma 4's keys on a model that is not Gemma 4
        d = _copy(EDGELLM / "gemma4-keqv-tiny", root, "config.json")
        _edit(d / "config.json", model="qwen3")
        return d, [], ["global_head_dim", "per-layer KV head dims", "not support"]
    if kind == "unsupported spec family":  # a block draft family trtio does not run
        d = _copy(EDGELLM / "qwen3-dflash-tiny", root, "base_config.json", "draft_config.json")
        for name in ("base_config.json", "draft_config.json"):
            _edit(d / name, spec_decode_type="dspark",
                  dspark_config={"target_layer_ids": [1, 3], "block_size": 8, "mask_token_id": 511})
        return d, [], ["spec_decode_type", "dspark", "Markov head"]
    if kind == "gemma":  # K == V layers (Gemma 4 31B): their pools' layout is not known
        d = _copy(EDGELLM / "gemma4-ple-tiny", root, "config.json")
        _edit(d / "config.json", attention_k_eq_v=True)
        return d, [], ["config.json: attention_k_eq_v", "refused rather than bound wrong"]
    if kind == "non-JSON":
        d = _copy(RAGGED_PAIR, root, "base_config.json", "draft_config.json")
        (d / "draft_config.json").write_text('{"engine_role": "draft",')
        return d, [], ["draft_config.json", "is not valid JSON"]
    if kind == "one spec config":
        return _copy(RAGGED_PAIR, root, "base_config.json"), [], ["draft_config.json: is missing",
                                                                  "base_config.json is here without it"]
    if kind == "wrong role":
        d = _copy(RAGGED_PAIR, root, "base_config.json", "draft_config.json")
        shutil.copy(d / "base_config.json", d / "draft_config.json")
        return d, [], ["draft_config.json: engine_role", "'base'"]
    if kind == "verify cap":
        return (_copy(RAGGED_PAIR, root, "base_config.json", "draft_config.json"), ["--verify-size", "9"],
                ["--verify-size: 9 exceeds builder_config.max_verify_tree_size (8)", "base_config.json",
                 "(defaulted: --draft-top-k 1, --draft-step 8)"])
    if kind == "draft cap":
        return (_copy(RAGGED_PAIR, root, "base_config.json", "draft_config.json"),
                ["--draft-top-k", "3", "--draft-step", "3"],
                ["--draft-top-k", "3 x 3 = 9 exceeds builder_config.max_draft_tree_size (8)", "draft_config.json"])
    if kind == "run-time value on a plain LLM":
        return _copy(RAGGED_LLM, root, "config.json"), ["--draft-step", "2"], ["--draft-step", "plain LLM"]
    if kind.startswith("tp "):
        return _broken_tp(kind, root)
    if kind == "plain and pair":
        d = _copy(RAGGED_PAIR, root, "base_config.json", "draft_config.json")
        shutil.copy(RAGGED_LLM / "config.json", d / "config.json")
        return d, [], ["holds both a plain LLM", "one deployment"]
    raise AssertionError(kind)


def _broken_tp(kind: str, root: Path) -> tuple[Path, list[str], list[str]]:
    """A broken copy of the tensor-parallel toy directory (``kind`` "tp ...")."""
    d = _copy(ENGINES / "toy-llm-tp2", root, "config_world2.json")
    path = d / "config_world2.json"
    data = json.loads(path.read_text())
    ranks = data["rank_configs"]
    needles = {
        "tp rank count": ["config_world2.json: rank_configs", "has 1 entries, but tp_size is 2"],
        "tp rank twice": ["config_world2.json: rank_configs[1].rank", "rank 0 is listed twice"],
        "tp unknown override": ["rank_configs[1].config_overrides.num_experts",
                                "overrides a key config_world2.json does not have"],
        "tp uneven heads": ["rank_configs[1].config_overrides.num_attention_heads", "rank 1 has 3 attention heads",
                            "split the model's 4 evenly"],
        "tp speculative": ["config_world2.json: engine_role", "tensor-parallel speculative decoding is not supported"],
        "tp world size": ["config_world2.json: builder_config.tp_size", "is 4, but the file name says 2 ranks"],
        "tp devices flag": ["--draft-step", "plain LLM"],
    }[kind]
    argv: list[str] = []
    if kind == "tp rank count":
        del ranks[1]
    elif kind == "tp rank twice":
        ranks[1]["rank"] = 0
    elif kind == "tp unknown override":
        ranks[1]["config_overrides"]["num_experts"] = 2
    elif kind == "tp uneven heads":
        ranks[1]["config_overrides"]["num_attention_heads"] = 3
    elif kind == "tp speculative":
        data["engine_role"] = "base"
    elif kind == "tp world size":
        data["builder_config"]["tp_size"] = 4
    else:
        argv = ["--draft-step", "2"]
    path.write_text(json.dumps(data))
    return d, argv, needles


BROKEN_TP = ["tp rank count", "tp rank twice", "tp unknown override", "tp uneven heads", "tp speculative",
             "tp world size", "tp devices flag"]
BROKEN = ["missing key", "missing builder key", "unsupported family", "unsupported spec family", "gemma", "non-JSON",
          "one spec config", "wrong role", "verify cap", "draft cap", "run-time value on a plain LLM",
          *BROKEN_TP, "plain and pair"]


@pytest.mark.parametrize("kind", BROKEN)
def test_plan_a_broken_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    directory, argv, needles = _broken(kind, tmp_path / "engine")
    rc, out, err = run(capsys, "plan", str(directory), *argv)
    assert_one_line_error(rc, err, "plan", *needles)
    assert out == ""


@pytest.mark.parametrize("kind", ["missing key", "unsupported family", "non-JSON", "one spec config",
                                  *BROKEN_TP[:-1]])
def test_inspect_a_broken_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                kind: str) -> None:
    directory, _, needles = _broken(kind, tmp_path / "engine")
    rc, _, err = run(capsys, "inspect", str(directory))
    assert_one_line_error(rc, err, "inspect", *needles)


def test_run_time_values_on_a_trtio_config_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "plan", str(ENGINES / "toy-eagle" / "config.json"), "--verify-size", "3")
    assert_one_line_error(rc, err, "plan", "--verify-size", "trtio config", "spec section")


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_run_time_values_must_be_positive_ints(capsys: pytest.CaptureFixture[str], value: str) -> None:
    rc, _, err = run(capsys, "plan", str(RAGGED_PAIR), "--draft-top-k", value)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--draft-top-k" in err and "positive int" in err


# -- inspect ------------------------------------------------------------------------------------------------


def _reference_names(cfg: trtio.LLMEngineConfig) -> list[str]:
    return [row["name"] for row in ReferenceEngine.from_config(cfg, null_compute=True, device="host").io_contract()]


@pytest.mark.parametrize("directory", PLAIN[:6] + PAIRS, ids=_ids(PLAIN[:6] + PAIRS))
def test_inspect_a_directory_of_configs(capsys: pytest.CaptureFixture[str], directory: Path) -> None:
    d = EngineDir.open(directory)
    rc, out, err = run(capsys, "inspect", str(directory), "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["kind"] == "edgellm" and result["directory_kind"] == d.kind
    assert [e["role"] for e in result["engines"]] == list(d.roles)
    for entry, (role, cfg) in zip(result["engines"], d):
        file = {"llm": "llm.engine", "base": "spec_base.engine", "draft": "spec_draft.engine"}[role]
        assert entry["name"] == file and entry["source"] == "config" and entry["plan"] is None
        assert entry["plan_not_read"] == f"no engine file {file} here (the directory holds configs only)"
        assert entry["config"] == str(d.config_path(role)) and entry["contract"] == "ragged"
        assert entry["num_profiles"] == 2
        assert [t["name"] for t in entry["tensors"]] == _reference_names(cfg)
        by = {t["name"]: t for t in entry["tensors"]}
        assert all(t["binding"] for t in entry["tensors"]), [t["name"] for t in entry["tensors"] if not t["binding"]]
        assert by["past_key_values_0"]["binding"] == by["present_key_values_0"]["binding"] \
            == f"state[{role}].past_key_values_0"
        assert by["kv_page_table"]["binding"] == f"state[{role}].kv_page_table"
        # a spec-decode base binds its own tree inputs, offsets included (the step block's verify_* tensors)
        own = role == "base"
        assert by["query_start_offsets"]["binding"] == \
            ("tensor 'verify_query_start_offsets'" if own else "PipelineIO.query_start_offsets")
        assert by["query_lengths"]["binding"] == \
            ("tensor 'verify_query_lengths'" if own else "PipelineIO.query_lengths")
        assert by["past_key_values_0"]["max_bytes"] > 0
    if d.kind == "spec_decode":
        base, draft = ({t["name"]: t["binding"] for t in e["tensors"]} for e in result["engines"])
        assert base["hidden_states"] == draft["hidden_states_input"] == "PipelineIO.base_hidden_states"
    rc, text, _ = run(capsys, "inspect", str(directory))
    assert rc == 0
    assert text.startswith(f"Edge-LLM engine directory {directory}: ")
    assert "plan not read: no engine file" in text and "a null-compute ReferenceEngine of the ragged contract" in text
    assert "profile 1 min / opt / max" in text and "state[" in text


def test_inspect_a_file_that_is_not_a_plan_shows_the_configs_view(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(RAGGED_LLM, tmp_path / "engine", "config.json")
    (d / "llm.engine").write_bytes(b"garbage!")
    for target in (d, d / "llm.engine"):
        rc, out, err = run(capsys, "inspect", str(target), "--json")
        assert rc == 0, err
        [entry] = json.loads(out)["engines"]
        assert entry["source"] == "config" and "is not a TensorRT plan" in entry["plan_not_read"]
        assert "CUDA" not in entry["plan_not_read"]
    rc, text, _ = run(capsys, "inspect", str(d))
    assert "  plan not read: " in text and "is not a TensorRT plan" in text


@pytest.mark.skipif(cuda_available(), reason="a CUDA device answers here")
def test_inspect_says_when_no_cuda_device_can_read_the_plan(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tensorrt_rtx")
    d = _copy(RAGGED_LLM, tmp_path / "engine", "config.json")
    (d / "llm.engine").write_bytes(b"vtrt" + b"\x00not a plan" * 10)  # the magic passes the header check
    rc, out, err = run(capsys, "inspect", str(d), "--json")
    assert rc == 0, err
    [entry] = json.loads(out)["engines"]
    assert entry["source"] == "config" and "no usable CUDA device" in entry["plan_not_read"]
    assert "\n" not in entry["plan_not_read"]


class FakePlans:
    """What the patched ``trtio._trt.load_engine`` did (``calls``: path, module, plugins) and, where set, the
    config every "plan" is made from (``override``) instead of the one beside it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, tuple[str, ...]]] = []
        self.override: trtio.LLMEngineConfig | None = None


@pytest.fixture
def plans_load(monkeypatch: pytest.MonkeyPatch) -> FakePlans:
    """Make ``trtio._trt.load_engine`` hand out the null-compute ReferenceEngine of the config beside the
    "plan", as if TensorRT had deserialized it."""
    import trtio._trt

    fake = FakePlans()

    def load(path: Any, module: Any = "auto", *, plugins: Any = ()) -> Any:
        fake.calls.append((str(path), module, tuple(str(p) for p in plugins)))
        role = {"llm.engine": "llm", "spec_base.engine": "base", "spec_draft.engine": "draft"}[Path(path).name]
        cfg = fake.override or dict(EngineDir.open(Path(path).parent))[role]
        return ReferenceEngine.from_config(cfg, null_compute=True, device="host", name=f"plan:{role}")

    monkeypatch.setattr(trtio._trt, "load_engine", load)
    return fake


def test_inspect_reads_the_plans_where_they_deserialize(tmp_path: Path, plans_load: FakePlans,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(RAGGED_PAIR, tmp_path / "engine", "base_config.json", "draft_config.json")
    for name in ("spec_base.engine", "spec_draft.engine"):
        (d / name).write_bytes(b"ftrt plan")
    plugin = tmp_path / "libNvInfer_edgellm_plugin.so"
    plugin.write_bytes(b"\x7fELF")
    rc, out, err = run(capsys, "inspect", str(d), "--plugin", str(plugin), "--module", "tensorrt", "--json")
    assert rc == 0, err
    entries = json.loads(out)["engines"]
    assert [(e["role"], e["source"], e["plan_not_read"]) for e in entries] == [("base", "plan", None),
                                                                              ("draft", "plan", None)]
    assert entries[0]["plan"] == str(d / "spec_base.engine")
    assert all(t["binding"] for e in entries for t in e["tensors"])
    assert plans_load.calls == [(str(d / "spec_base.engine"), "tensorrt", (str(plugin),)),
                              (str(d / "spec_draft.engine"), "tensorrt", (str(plugin),))]
    rc, text, _ = run(capsys, "inspect", str(d))
    assert f"spec_base.engine (base): plan {d / 'spec_base.engine'}, bindings for {d / 'base_config.json'}" in text
    assert "plan not read" not in text


def test_inspect_a_plan_its_config_does_not_fit_is_one_line(tmp_path: Path, plans_load: FakePlans,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(RAGGED_LLM, tmp_path / "engine", "config.json")
    (d / "llm.engine").write_bytes(b"ftrt plan")
    other = json.loads((RAGGED_LLM / "config.json").read_text())
    other["num_hidden_layers"] = 2
    plans_load.override = trtio.LLMEngineConfig.from_edgellm(other)
    rc, _, err = run(capsys, "inspect", str(d))
    assert_one_line_error(rc, err, "inspect", "config.json", "does not fit plan", "llm.engine", "past_key_values_2")


def test_inspect_plugin_and_config_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inspect", str(RAGGED_LLM), "--plugin", str(tmp_path / "missing.so"))
    assert_one_line_error(rc, err, "inspect", "--plugin", "missing.so", "libNvInfer_edgellm_plugin.so")
    rc, _, err = run(capsys, "inspect", str(RAGGED_LLM), "--config", str(ENGINES / "toy-llm" / "config.json"))
    assert_one_line_error(rc, err, "inspect", "--config", "does not apply", "Edge-LLM engine directory")


# -- --debug and --verbose on either side of the command ----------------------------------------------------


@pytest.mark.parametrize("argv", [["--debug", "inspect", "X"], ["inspect", "X", "--debug"],
                                  ["--debug", "inspect", "X", "--debug"]])
def test_debug_before_or_after_the_command(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           argv: list[str]) -> None:
    argv = [str(tmp_path / "missing.plan") if a == "X" else a for a in argv]
    rc, _, err = run(capsys, *argv)
    assert rc == 1
    assert "Traceback (most recent call last)" in err and "EngineError" in err
    assert err.strip().splitlines()[-1].startswith("trtio inspect: error: ")


@pytest.mark.parametrize("argv, debug, verbose", [
    (["-v", "plan", "P"], False, True), (["plan", "P", "--verbose"], False, True), (["plan", "P"], False, False),
    (["--debug", "-v", "plan", "P"], True, True), (["--verbose", "plan", "P", "--debug"], True, True),
])
def test_flags_parse_on_either_side(argv: list[str], debug: bool, verbose: bool) -> None:
    args = build_parser().parse_args(argv)
    assert (args.debug, args.verbose) == (debug, verbose)


def test_verbose_before_the_command_logs(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    def plan(args: Any) -> int:
        logging.getLogger("trtio").info("hello from the command")
        return 0

    monkeypatch.setattr("trtio._cli._cmd_plan", plan)
    rc, _, err = run(capsys, "-v", "plan", "X")
    assert rc == 0 and "trtio: INFO: hello from the command" in err
    rc, _, err = run(capsys, "plan", "X")
    assert rc == 0 and "hello" not in err


# -- tensor-parallel directories: every rank --------------------------------------------------------------

TP2 = ENGINES / "toy-llm-tp2"
TINY_TP = EDGELLM_011 / "qwen3-tiny-tp2"


@pytest.mark.parametrize("directory", [TP2, ENGINES / "toy-llm-tp4", TINY_TP], ids=lambda p: p.name)
def test_plan_a_tensor_parallel_directory_shows_every_rank(capsys: pytest.CaptureFixture[str],
                                                           directory: Path) -> None:
    d = EngineDir.open(directory)
    rc, out, err = run(capsys, "plan", str(directory), "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["tp_size"] == d.tp_size and [r["rank"] for r in result["ranks"]] == list(range(d.tp_size))
    assert result["configs"] == [str(d.config_path("llm"))]
    bindings = {b.engine_name: b for b in d.checkpoint_bindings()}
    for r, rank in enumerate(result["ranks"]):
        cfg = d.rank_config(r)
        assert rank["engine"] == d.engine_path(r).name and rank["engine_file"] is None
        assert (rank["heads"], rank["kv_heads"]) == (cfg.num_attention_heads, cfg.num_kv_heads)
        (kv,) = rank["kv_state"]
        assert kv["shape"] == _pool_shape(cfg) and kv["tensors"] == cfg.num_attention_layers
        weights = {e["name"]: e for e in rank["memory"]["entries"] if e["group"] == f"rank {r} checkpoint weights"}
        assert {n: e["shape"] for n, e in weights.items()} == {n: list(b.shape) for n, b in bindings.items()}
    groups = {e["group"].split(" ")[1] for e in result["memory"]["entries"]}
    assert groups == {str(r) for r in range(d.tp_size)}
    rc, text, _ = run(capsys, "plan", str(directory))
    assert text.startswith(f"create_from_engine_dir ({d.tp_size} tensor-parallel ranks) for the Edge-LLM engine "
                           f"directory {directory} ({d.config_path('llm').name}; engine files: none")
    for r in range(d.tp_size):
        cfg = d.rank_config(r)
        shape = ",".join(map(str, _pool_shape(cfg)))
        line = next(ln for ln in text.splitlines() if ln.startswith(f"  rank {r} ({d.engine_path(r).name}): "))
        assert f"each [{shape}]" in line and f"{cfg.num_kv_heads} KV head" in line


def test_inspect_a_tensor_parallel_directory_shows_every_rank_engine(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "inspect", str(TP2), "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["tp_size"] == 2
    engines = result["engines"]
    assert [(e["name"], e["role"], e["source"]) for e in engines] == [
        ("llm_world2_rank0.engine", "rank 0", "config"), ("llm_world2_rank1.engine", "rank 1", "config")]
    for r, e in enumerate(engines):
        rows = {t["name"]: t for t in e["tensors"]}
        assert rows["past_key_values_0"]["shape"] == [2, -1, 128, 1, 16]
        assert rows["lm_head.weight"]["binding"] == "checkpoint weight lm_head.weight"
        assert rows["model.layers.3.mlp.down_proj.weight"]["binding"] == (
            f"checkpoint weight model.layers.3.mlp.down_proj.weight (part {r} of 2 along axis 1)")
        assert rows["model.layers.3.mlp.down_proj.weight"]["shape"] == [64, 64]
    rc, text, _ = run(capsys, "inspect", str(TP2))
    assert "llm_world2_rank1.engine (rank 1): the engine" in text


def test_inspect_reads_each_rank_plan_and_refuses_one_its_rank_does_not_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import trtio._trt

    d = tmp_path / "tp"
    shutil.copytree(TP2, d)
    (d / "config_world2.json").write_text((TP2 / "config_world2.json").read_text().replace(
        '"../toy-checkpoint"', json.dumps(str(ENGINES / "toy-checkpoint"))))
    for r in range(2):
        (d / f"llm_world2_rank{r}.engine").write_bytes(b"ftrt plan")
    directory = EngineDir.open(d)
    calls: list[str] = []
    heads = {"n": None}

    def load(path: Any, module: Any = "auto", *, plugins: Any = ()) -> Any:
        calls.append(Path(path).name)
        r = int(Path(path).stem[-1])
        cfg = directory.rank_config(r)
        if heads["n"] is not None:
            cfg = dataclasses.replace(cfg, num_kv_heads=heads["n"], num_attention_heads=heads["n"])
        return ReferenceEngine.from_config(cfg, null_compute=True, device="host", tp_rank=r, tp_size=2)

    monkeypatch.setattr(trtio._trt, "load_engine", load)
    rc, out, err = run(capsys, "inspect", str(d), "--json")
    assert rc == 0, err
    assert calls == ["llm_world2_rank0.engine", "llm_world2_rank1.engine"]
    assert [e["source"] for e in json.loads(out)["engines"]] == ["plan", "plan"]
    heads["n"] = 2  # a rank plan built with the whole model's 2 KV heads
    rc, _, err = run(capsys, "inspect", str(d))
    assert_one_line_error(rc, err, "inspect", "config_world2.json: does not fit plan", "llm_world2_rank0.engine",
                          "past_key_values_0")


@pytest.mark.parametrize("command", ["plan", "inspect"])
def test_a_tensor_parallel_config_file_names_its_directory(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """config_world2.json given as the target was read as one of trtio's own configs ("builder_config: is not a
    LLMEngineConfig field; known fields: [...]"); config.json of a plain directory already worked."""
    rc, out, err = run(capsys, command, str(ENGINES / "toy-llm-tp2" / "config_world2.json"))
    assert rc == 0, err
    assert "toy-llm-tp2" in out and "rank 1" in out


def test_a_run_time_flag_for_a_tensor_parallel_directory_names_its_config(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _out, err = run(capsys, "plan", str(ENGINES / "toy-llm-tp2"), "--draft-top-k", "2")
    assert_one_line_error(rc, err, "plan", "--draft-top-k: is for a speculative pair",
                          "holds a plain LLM (config_world2.json)")
