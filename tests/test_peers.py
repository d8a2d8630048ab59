"""bench peers: divergence reports, skipping absent engines, the child protocol, the GGUF writer,
and (where the engines are installed) token identity of ort-genai and llama.cpp with spdflow."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from spdflow import peers
from spdflow.errors import StageError
from spdflow.peers import first_divergence, peer_rows

HAS_GENAI = importlib.util.find_spec("onnxruntime_genai") is not None
HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
HAS_GGUF = importlib.util.find_spec("gguf") is not None


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from spdflow.testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("peers") / "model")


def test_first_divergence_names_request_position_and_tokens():
    reference = {0: [5, 6, 7], 1: [8, 9, 10, 11], 2: [1]}
    assert first_divergence({0: [5, 6, 7], 1: [8, 9, 10, 11], 2: [1]}, reference) is None
    got = first_divergence({0: [5, 6, 7], 1: [8, 9, 3, 11], 2: [2]}, reference)
    assert got == {"request": 1, "position": 2, "spdflow": 10, "peer": 3, "requests_differing": 2, "requests": 3}
    shorter = first_divergence({0: [5, 6], 1: [8, 9, 10, 11], 2: [1]}, reference)
    assert (shorter["position"], shorter["spdflow"], shorter["peer"]) == (2, 7, None)


def test_peer_rows_mark_divergence_only_when_tokens_differ():
    run = {"mode": "x_greedy", "batch_size": 1, "tokens_per_s": 10.0, "requests_per_s": 1.0, "tpot_ms": 5.0,
           "peak_rss_mb": 100.0, "generated_tokens": 3, "engine": "x 1.0"}
    same = peer_rows([dict(run, tokens={"0": [1, 2, 3]})], 1, {0: [1, 2, 3]})[0]
    assert same["identical_to_nospec"] is True and "divergence" not in same and same["engine"] == "x 1.0"
    differ = peer_rows([dict(run, tokens={"0": [1, 4, 3]})], 1, {0: [1, 2, 3]})[0]
    assert differ["identical_to_nospec"] is False
    assert differ["divergence"]["position"] == 1


def test_absent_engine_is_skipped_with_one_line(monkeypatch, tiny_model):
    import importlib.util as util

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    lines: list[str] = []

    class Recipe:
        class workload:
            temperature = 0

    started = peers.start_peers(["llama.cpp"], None, Recipe, None, [], 1, 1, tiny_model.parent, lines.append)
    assert started == []
    assert lines == ["peer 'llama.cpp' skipped: llama_cpp is not installed (pip install -e \".[llamacpp]\" "
                     "(compiles llama.cpp: several minutes))"]


def test_child_failure_is_one_stage_error(tmp_path):
    job = {"model_dir": str(tmp_path / "missing"), "draft_dir": None, "modes": ["hf_greedy"], "prompts": [[1, 2]],
           "max_new_tokens": 2, "eos_token_ids": [], "pad_token_id": 0, "batch_size": 1, "repeats": 1, "k": 2,
           "lookup_ngram": 2, "threads": 1, "work_dir": str(tmp_path)}
    with pytest.raises(StageError, match=r"^the hf peer failed: .*missing"):
        peers.PeerProcess("hf", job)


def _job(model_dir, tmp_path, prompts, max_new=12):
    return {"model_dir": str(model_dir), "draft_dir": None, "modes": ["hf_greedy"], "prompts": prompts,
            "max_new_tokens": max_new, "eos_token_ids": [], "pad_token_id": 0, "batch_size": 1, "repeats": 1,
            "k": 3, "lookup_ngram": 2, "threads": 1, "work_dir": str(tmp_path / "work")}


def _runs(family, job):
    peer = peers.PeerProcess(family, job)
    try:
        return {mode: peer.run(mode) for mode in peer.modes}
    finally:
        peer.close()


PROMPTS = [[3, 4, 5, 6, 3, 4, 5], [7, 8, 9, 10, 11, 7, 8]]


@pytest.mark.skipif(not HAS_GENAI, reason="onnxruntime-genai not installed (pip install -e '.[ortgenai]')")
def test_ort_genai_peer_gives_hf_greedy_tokens(tiny_model, tmp_path):
    job = _job(tiny_model, tmp_path, PROMPTS)
    hf = _runs("hf", job)["hf_greedy"]["tokens"]
    genai = _runs("ort-genai", job)["ort_genai_greedy"]
    assert genai["tokens"] == hf and all(len(t) == 12 for t in hf.values())
    assert genai["engine"].startswith("onnxruntime-genai")
    assert _runs("ort-genai", dict(job, batch_size=2)) == {}  # batch 1 only: no modes at batch 2


@pytest.mark.skipif(not HAS_GGUF, reason="gguf not installed (pip install -e '.[llamacpp]')")
def test_gguf_writer_layout(tiny_model, tmp_path):
    import gguf
    from safetensors.numpy import load_file

    from spdflow.peer_engines.gguf_export import _permute_rope, write_gguf

    path = write_gguf(tiny_model, tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    config = json.loads((tiny_model / "config.json").read_text())
    weights = load_file(str(tiny_model / "model.safetensors"))
    assert "output.weight" not in tensors or not config.get("tie_word_embeddings")
    q = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(weights["model.layers.0.self_attn.q_proj.weight"].shape)
    expected = _permute_rope(weights["model.layers.0.self_attn.q_proj.weight"], config["num_attention_heads"])
    np.testing.assert_array_equal(q, expected)
    up = np.asarray(tensors["blk.0.ffn_up.weight"].data).reshape(weights["model.layers.0.mlp.up_proj.weight"].shape)
    np.testing.assert_array_equal(up, weights["model.layers.0.mlp.up_proj.weight"])
    fields = {f.name: f for f in reader.fields.values()}
    assert int(fields["llama.attention.head_count_kv"].parts[-1][0]) == config["num_key_value_heads"]


def test_permute_rope_pairs_halves_per_head():
    from spdflow.peer_engines.gguf_export import _permute_rope

    # one head of dim 4: HF rows [x0, x1 | y0, y1] (rotate-half) -> llama.cpp [x0, y0, x1, y1]
    w = np.arange(4, dtype=np.float32).reshape(4, 1)
    assert _permute_rope(w, 1)[:, 0].tolist() == [0, 2, 1, 3]


@pytest.mark.skipif(not HAS_GGUF, reason="gguf not installed")
def test_gguf_writer_refuses_other_layouts_in_one_sentence(tiny_model, tmp_path):
    import shutil

    from spdflow.peer_engines.gguf_export import GGUFExportError, write_gguf

    other = tmp_path / "qwen"
    shutil.copytree(tiny_model, other)
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["Qwen2ForCausalLM"]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(GGUFExportError, match=r"writes GGUF for LlamaForCausalLM, MistralForCausalLM only; .* is Qwen2"):
        write_gguf(other, tmp_path / "q.gguf")


@pytest.mark.skipif(not HAS_LLAMA_CPP or not HAS_GGUF,
                    reason="llama-cpp-python / gguf not installed (pip install -e '.[llamacpp]')")
def test_llama_cpp_peer_gives_hf_greedy_tokens(tiny_model, tmp_path):
    job = _job(tiny_model, tmp_path, PROMPTS)
    hf = _runs("hf", job)["hf_greedy"]["tokens"]
    runs = _runs("llama.cpp", job)
    assert set(runs) == {"llama_cpp_greedy", "llama_cpp_prompt_lookup"}
    assert runs["llama_cpp_greedy"]["tokens"] == hf
    assert runs["llama_cpp_prompt_lookup"]["tokens"] == hf


@pytest.mark.parametrize("proposer, batch, modes, ngram", [
    ("{uses: prompt_lookup, with: {prompt_lookup_max: 4}}", 1, ["hf_greedy", "hf_prompt_lookup"], 4),
    ("{uses: ngram, with: {prompt_lookup_max: 2}}", 1, ["hf_greedy", "hf_prompt_lookup"], 2),  # the alias too
    ("{uses: prompt_lookup, with: {prompt_lookup_max: 4}}", 2, ["hf_greedy"], 4),
    ("{uses: draft_model, with: {model: MODEL}}", 1, ["hf_greedy", "hf_assisted"], 2),
    ("{uses: suffix}", 1, ["hf_greedy"], 2),
])
def test_peer_modes_follow_what_the_proposer_declares(tiny_model, tmp_path, pm, proposer, batch, modes, ngram):
    from types import SimpleNamespace

    from spdflow.recipe.loader import load_recipe

    path = tmp_path / "recipe.yaml"
    path.write_text(f"version: 1\nname: peers\nmodel: {{id: {tiny_model}}}\nproposer: {proposer.replace('MODEL', str(tiny_model))}\n"
                    f"num_speculative_tokens: [0, 3]\noutput: {tmp_path / 'runs'}\n")
    loaded = load_recipe(path, pm, allow_outside_paths=True)
    loaded.allow_outside_paths = True
    requests = [SimpleNamespace(prompt_ids=np.array([1, 2, 3]))]
    info = SimpleNamespace(eos_token_ids=(0,), pad_token_id=0)
    job = peers.peer_job(loaded, loaded.recipe, info, requests, batch, 1)
    assert job["modes"] == modes and job["lookup_ngram"] == ngram and job["k"] == 3
    assert (job["draft_dir"] is not None) == ("hf_assisted" in modes)
