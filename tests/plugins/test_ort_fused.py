"""The onnxruntime backend's fused decode graph (``devices.with.graph: fused``, spdflow_ort/fused.py).

It must give the reference graph's tokens (greedy, no-spec and K > 0), logits close to the
reference's at rows sitting at different positions, and write the KV cache where the exported
graph does, never into a slot a real token owns.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from spdflow.api import Specialization
from spdflow.errors import StageError
from tests.plugins.test_ort import CTX, KS, PREFILL, Built, greedy, prefill, prompt, specs_for

ort = pytest.importorskip("onnxruntime")


def _has_gqa() -> bool:
    from onnx import TensorProto, helper

    node = helper.make_node("GroupQueryAttention", ["q", "", "", "", "", "s", "t"], ["o"], domain="com.microsoft",
                            num_heads=1, kv_num_heads=1)
    graph = helper.make_graph([node], "probe", [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 1, 48]),
        helper.make_tensor_value_info("s", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("t", TensorProto.INT32, [])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any failure means: no usable kernel
        return False
    return True


pytestmark = pytest.mark.skipif(not _has_gqa(), reason="this onnxruntime has no CPU GroupQueryAttention kernel")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache: dict = {}

    def get(arch="llama") -> Built:
        if arch not in cache:
            cache[arch] = Built(tmp_path_factory.mktemp(f"fused-{arch}"), arch)
        return cache[arch]

    return get


def step(session, ids, pos):
    """One verify step of rows ``ids``/``pos`` (lists, -1 padded); a copy of its logits."""
    ids = np.array(ids, dtype=np.int64)
    return session.run(ids, np.array(pos, dtype=np.int64), ids.shape[1]).copy()


def verify_greedy(session, tokens, k, steps=24):
    """Greedy decode with a verify step of K+1 tokens whose proposals are the model's own
    one-at-a-time continuation except every third step (all wrong); returns the tokens."""
    out = [prefill(session, tokens)]
    rng = np.random.default_rng(k)
    while len(out) < steps:
        anchor = len(tokens) + len(out) - 1
        guess = rng.integers(2, 4096, size=k)
        logits = step(session, [[out[-1], *guess]], [list(range(anchor, anchor + k + 1))])[0]
        for j in range(k + 1):
            out.append(int(logits[j].argmax()))
            if j == k or out[-1] != guess[j]:
                break
    return out[:steps]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_greedy_gives_the_reference_tokens(models, arch):
    built = models(arch)
    tokens = prompt(13, seed=3)
    reference = greedy(built.session(), tokens)
    fused = built.session(graph="fused")
    assert fused.graph == "fused" and fused.runtime_facts()["graph"] == "fused"
    assert greedy(fused, tokens) == reference


@pytest.mark.parametrize("k", [1, 4, 7])
def test_fused_verify_steps_are_lossless_and_match_the_reference(models, k):
    built = models()
    tokens = prompt(11, seed=4)
    expected = greedy(built.session(), tokens, steps=24)
    assert verify_greedy(built.session(graph="fused"), tokens, k) == expected
    assert verify_greedy(built.session(), tokens, k) == expected


@pytest.mark.parametrize("session_mode", ["static", "dynamic"])
def test_fused_logits_match_the_reference_at_batch_two_with_rows_at_other_positions(models, session_mode):
    built = models()
    specs = specs_for([0, 3], batch=2)
    sessions = {graph: built.session(specs, ks=[0, 3], graph=graph, session_mode=session_mode)
                for graph in ("reference", "fused")}
    prompts = [prompt(13, seed=8), prompt(6, seed=9)]
    logits = {}
    for graph, session in sessions.items():
        got = []
        for start in range(0, 16, PREFILL):  # prefill both rows (reference graph either way)
            ids = np.ones((2, PREFILL), dtype=np.int64)
            pos = np.full((2, PREFILL), -1, dtype=np.int64)
            for row, p in enumerate(prompts):
                chunk = p[start:start + PREFILL]
                ids[row, :len(chunk)] = chunk
                pos[row, :len(chunk)] = np.arange(start, start + len(chunk))
            session.run(ids, pos, 1)
        # K=3 with a short row (1 proposal, padded), K=0, then an idle row beside a live one.
        got.append(step(session, [[5, 6, 7, 8], [9, 10, 1, 1]], [[13, 14, 15, 16], [6, 7, -1, -1]]))
        got.append(step(session, [[11], [12]], [[15], [8]]))
        got.append(step(session, [[13, 14, 15, 16], [1, 1, 1, 1]], [[16, 17, 18, 19], [-1, -1, -1, -1]]))
        got.append(step(session, [[17], [18]], [[20], [9]]))
        logits[graph] = got
    valid = [(slice(None), slice(None)), (slice(None), slice(None)), (0, slice(None)), (slice(None), slice(None))]
    for ref, fused, rows in zip(logits["reference"], logits["fused"], valid):
        ref_rows, fused_rows = ref[rows], fused[rows]
        if ref.shape[1] == 4:  # the short row's padding logits are garbage in both graphs
            ref_rows, fused_rows = ref_rows.copy(), fused_rows.copy()
            if ref_rows.ndim == 3:
                ref_rows[1, 2:] = fused_rows[1, 2:] = 0
        assert np.abs(ref_rows - fused_rows).max() <= 1e-4
        assert (ref_rows.argmax(-1) == fused_rows.argmax(-1)).all()


def test_fused_steps_write_only_slots_no_real_token_owns(models):
    built = models()
    session = built.session(graph="fused")
    assert session.kv_slots == CTX + max(KS) + 1
    tokens = prompt(13, seed=5)
    prefill(session, tokens)
    before = {name: array.copy() for name, array in session.kv_cache().items()}
    # A cost measurement: every position -1, the longest step. Writes only beyond ctx_len.
    step(session, [[1] * 8], [[-1] * 8])
    for name, array in session.kv_cache().items():
        assert np.array_equal(array[:, :, :CTX], before[name][:, :, :CTX])
        assert not np.array_equal(array[:, :, CTX:], before[name][:, :, CTX:])
    # A K=4 step with one proposal at positions 13, 14 (padding after): slots 0..12 untouched,
    # 13 and 14 written as the reference graph writes them.
    reference = built.session()
    prefill(reference, tokens)
    step(reference, [[7, 8]], [[13, 14]])
    step(session, [[7, 8, 1, 1, 1]], [[13, 14, -1, -1, -1]])
    for name, array in session.kv_cache().items():
        assert np.array_equal(array[:, :, :13], before[name][:, :, :13])
        assert np.abs(array[:, :, 13:15] - reference.kv_cache()[name][:, :, 13:15]).max() <= 1e-5


def test_fused_refuses_positions_it_cannot_place(models):
    session = models().session(graph="fused")
    prefill(session, prompt(13, seed=5))
    with pytest.raises(StageError, match="consecutive"):
        step(session, [[1, 2]], [[13, 15]])
    with pytest.raises(StageError, match="consecutive"):
        step(session, [[1, 2]], [[-1, 13]])


def test_fused_is_refused_where_it_cannot_serve(models):
    built = models("qwen3")
    with pytest.raises(StageError, match="graph: reference"):
        built.compile(graph="fused")


def test_fused_and_reference_programs_have_different_keys(models):
    built = models()
    assert built.compile(graph="fused").key != built.compile().key
    assert built.compile(graph="fused").cached


def test_embedded_model_run_on_the_fused_graph_gives_the_reference_tokens(tmp_path, monkeypatch):
    """The README's varK recipe on the embedded model: the fused graph's run is lossless against
    its own no-spec and emits the reference graph's tokens."""
    import json

    from click.testing import CliRunner

    from spdflow.cli import cli
    from tests.conftest import REPO

    tokens = {}
    for graph in ("reference", "fused"):
        folder = tmp_path / graph
        folder.mkdir()
        monkeypatch.chdir(folder)
        result = CliRunner().invoke(cli, [
            "run", str(REPO / "recipes" / "tinycode_varK.yaml"), "--check-lossless", "--set", "workload.count=2",
            "--set", "workload.max_new_tokens=24", "--set", f"devices.with.graph={graph}"])
        assert result.exit_code == 0, result.output
        run = folder / "runs" / "tinycode-varK"
        report = json.loads((run / "report.json").read_text())
        assert report["lossless"]["checked"] and report["lossless"]["identical"]
        assert f'"graph": "{graph}"' in (run / "report.json").read_text()
        lines = (run / "outputs.jsonl").read_text().splitlines()
        tokens[graph] = [json.loads(line)["tokens"] for line in lines]
    assert len(tokens["fused"]) == 2 and tokens["fused"] == tokens["reference"]


def test_a_draft_models_program_stays_on_the_reference_graph(models):
    """A draft model's catch-up steps feed left-padded rows, which GQA cannot place: its program
    keeps the reference graph while the target's runs the fused one."""
    from dataclasses import replace

    from spdflow_ort.backend import OrtBackend

    built = models()
    draft = OrtBackend().compile(replace(built.request(specs_for(), graph="fused"), role="draft"))
    assert draft.graph == "reference"
    assert "fused" not in json.loads((draft.qpc_dir / "qpc" / "manifest.json").read_text())
    assert built.compile(graph="fused").graph == "fused"
