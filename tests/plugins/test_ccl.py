"""Compute context lengths (CCL): shapes, lint, the export's comp_ctx_lengths input, runtime."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from spdflow.api import ExportRequest
from spdflow.ccl import pick_ccl
from spdflow.recipe.schema import ModelSpec
from spdflow.testing.models import make_tiny_model
from spdflow_shapes import ccl_lists, specialize
from tests.plugins.test_export import feeds_for

CTX = 32


# ------------------------------------------------------------------------------- shapes


def test_ccl_lists_sort_dedupe_and_end_with_ctx_len():
    assert ccl_lists(None, None, 128, 32) is None
    assert ccl_lists([64, 16, 64], None, 128, 32) == ([64, 128], [16, 64, 128])
    assert ccl_lists([16, 128], [32], 128, 32) == ([32, 128], [16, 128])
    assert ccl_lists(None, [64], 128, 32) == ([64, 128], [128])


@pytest.mark.parametrize("ccl, prefill", [([0], None), ([256], None), ([64], [16])])
def test_ccl_lists_refuse_out_of_range(ccl, prefill):
    with pytest.raises(ValueError, match="between"):
        ccl_lists(ccl, prefill, 128, 32)


def test_specialize_crosses_every_k_with_every_ccl():
    specs = specialize([0, 3], 32, 128, 1, None, comp_ctx_lengths=[16, 64])
    got = [(s.kind, s.k, s.comp_ctx_lengths) for s in specs]
    assert got == [("prefill", None, 64), ("prefill", None, 128),
                   ("decode", 0, 16), ("decode", 0, 64), ("decode", 0, 128),
                   ("decode", 3, 16), ("decode", 3, 64), ("decode", 3, 128)]
    assert list(specs[2].symbols()) == ["batch_size", "seq_len", "ctx_len", "comp_ctx_lengths", "num_logits_to_keep"]


def test_specialize_without_ccl_is_unchanged():
    specs = specialize([0, 3], 32, 128, 1, None)
    assert all(s.comp_ctx_lengths is None and "comp_ctx_lengths" not in s.symbols() for s in specs)
    assert len(specs) == 3


def test_pick_ccl_is_the_smallest_that_holds_the_last_position():
    ccls = [16, 64, 128]
    assert pick_ccl(np.array([[15]]), ccls) == 16  # slots 0..15
    assert pick_ccl(np.array([[13, 14, 15, 16]]), ccls) == 64  # a verify crossing the boundary
    assert pick_ccl(np.array([[3, -1], [40, 41]]), ccls) == 64  # the longest row decides
    assert pick_ccl(np.array([[-1]]), ccls) == 16
    assert pick_ccl(np.array([[500]]), ccls) == 128


# ------------------------------------------------------------------------------- export


def _export(model_dir: Path, work_dir: Path, *, ccl: bool, cb: bool = False):
    from spdflow_onnx import spdflow_export

    work_dir.mkdir(parents=True, exist_ok=True)
    request = ExportRequest(model=ModelSpec(id=str(model_dir)), model_dir=model_dir, role="target",
                            continuous_batching=cb, work_dir=work_dir, ccl=ccl)
    return spdflow_export(request=request)


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "cb"])
def exports(request, tmp_path_factory):
    """(default export, CCL export) of one tiny Llama, without and with continuous batching."""
    root = tmp_path_factory.mktemp("ccl_cb" if request.param else "ccl")
    model_dir = make_tiny_model(root / "model", arch="llama")
    return (_export(model_dir, root / "full", ccl=False, cb=request.param),
            _export(model_dir, root / "ccl", ccl=True, cb=request.param), request.param)


def _session(path):
    import onnxruntime as ort

    from spdflow_ort.session import session_options

    return ort.InferenceSession(str(path), sess_options=session_options(None))


def _feeds(info, ids, positions, nlk, rows, batch_index=None, seed=0):
    return feeds_for(info, ids, positions, nlk, kv_rows=rows, ctx=CTX, batch_index=batch_index, seed=seed)


def test_ccl_export_has_the_comp_ctx_lengths_input_where_qefficient_puts_it(exports):
    full, ccl, cb = exports
    inputs = {v.name: v for v in onnx.load(str(ccl.onnx_path), load_external_data=False).graph.input}
    names = list(inputs)
    n = ccl.model_info.num_layers
    assert names.index("comp_ctx_lengths") == 2 + 2 * n  # after the past KV, before batch_index
    dims = [d.dim_param or d.dim_value for d in inputs["comp_ctx_lengths"].type.tensor_type.shape.dim]
    assert dims == ["comp_ctx_lengths"] and inputs["comp_ctx_lengths"].type.tensor_type.elem_type == onnx.TensorProto.INT64
    plain = [v.name for v in onnx.load(str(full.onnx_path), load_external_data=False).graph.input]
    assert "comp_ctx_lengths" not in plain and [x for x in names if x != "comp_ctx_lengths"] == plain


@pytest.mark.parametrize("ccl_len", [8, 20, CTX])
def test_ccl_export_reads_only_the_first_slots_and_agrees_with_the_full_graph(exports, ccl_len):
    """Rows of different lengths whose last position fits the CCL: logits equal the full graph's
    (stale slots beyond hold random values the CCL graph never reads) and the scatter is the same."""
    full, ccl, cb = exports
    info = full.model_info
    ids = np.array([[5, 6, 7, 8], [9, 10, 11, 12]], dtype=np.int64)
    top = ccl_len - 1
    positions = np.array([[top - 3, top - 2, top - 1, top], [2, 3, -1, -1]], dtype=np.int64)
    rows = 3 if cb else 2
    index = np.array([[2], [0]], dtype=np.int64) if cb else None
    feeds = _feeds(info, ids, positions, 4, rows, index)
    want = _session(full.onnx_path).run(None, feeds)
    got = _session(ccl.onnx_path).run(None, {**feeds, "comp_ctx_lengths": np.zeros(ccl_len, dtype=np.int64)})
    np.testing.assert_allclose(got[0][0], want[0][0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[0][1, :2], want[0][1, :2], rtol=1e-4, atol=1e-5)  # row 1's valid rows
    for a, b in zip(got[1:], want[1:]):
        # KV scatter unchanged; the padding rows' slot ctx_len-1 holds values never read.
        np.testing.assert_array_equal(a[..., :CTX - 1, :], b[..., :CTX - 1, :])


def test_ccl_export_too_short_for_the_sequence_differs(exports):
    """The check above can fail: a CCL shorter than the sequence drops keys, so logits change."""
    full, ccl, cb = exports
    info = full.model_info
    ids = np.array([[5]], dtype=np.int64)
    positions = np.array([[20]], dtype=np.int64)
    rows = 3 if cb else 1
    index = np.array([[1]], dtype=np.int64) if cb else None
    feeds = _feeds(info, ids, positions, 1, rows, index)
    want = _session(full.onnx_path).run(None, feeds)[0]
    got = _session(ccl.onnx_path).run(None, {**feeds, "comp_ctx_lengths": np.zeros(8, dtype=np.int64)})[0]
    assert np.abs(got - want).max() > 1e-3


# ------------------------------------------------------------------------------- runtime, end to end

PROMPTS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n",
    "import os\nimport sys\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
]
CCLS = [24, 40, 64]


def _recipe(tmp_path, name, *, ks, proposer=None, batching=None, devices=None, k_policy=None):
    import json

    lines = ["version: 1", f"name: {name}", "model: {id: 'spdflow:tinycode-target'}",
             f"num_speculative_tokens: {json.dumps(ks)}", f"output: {json.dumps(str(tmp_path / name))}",
             f"specialization: {json.dumps({'prefill_seq_len': 16, 'ctx_len': 128, **(batching or {})})}",
             f"workload: {json.dumps({'prompts': PROMPTS, 'max_new_tokens': 48, 'ignore_eos': True})}",
             f"devices: {json.dumps({'backend': 'onnxruntime', 'with': devices or {}})}"]
    if proposer:
        lines.append(f"proposer: {json.dumps(proposer)}")
    if k_policy:
        lines.append(f"k_policy: {k_policy}")
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


_CACHE: list = []  # one export/compile cache for the whole module (the runs differ in shapes only)


@pytest.fixture(scope="module", autouse=True)
def _shared_cache(tmp_path_factory):
    _CACHE.append(tmp_path_factory.mktemp("ccl_cache"))
    yield
    _CACHE.pop()


def _run(pm, path, **options):
    from spdflow.engine.run import Engine, RunOptions
    from spdflow.recipe.loader import load_recipe

    return Engine(pm, load_recipe(path, pm), RunOptions(cache_dir=_CACHE[-1], **options)).run()


@pytest.fixture(scope="module")
def nospec_tokens(tmp_path_factory):
    """Greedy no-spec tokens without CCL, per batching mode (the reference)."""
    from spdflow.plugins import get_plugin_manager

    root = tmp_path_factory.mktemp("ccl_ref")
    cache: dict = {}

    def get(batching_name):
        if batching_name not in cache:
            state = _run(get_plugin_manager(), _recipe(root, f"ref-{batching_name}", ks=0,
                                                       batching=BATCHING[batching_name]))
            cache[batching_name] = [o["tokens"] for o in state.outputs]
        return cache[batching_name]

    return get


BATCHING = {"batch1": {"batch_size": 1}, "batch3": {"batch_size": 3}, "cb2": {"batch_size": 1, "full_batch_size": 2}}
SPD = {
    "nospec": (0, None, None),
    # smallest_covering: every proposal is verified, so acceptance is asserted whatever the timings
    # (goodput may skip proposing on a tiny model by its timings; it did once in CI at batch 3)
    "prompt_lookup": ([0, 2, 4, 7], {"uses": "prompt_lookup", "with": {"prompt_lookup_min": 1, "prompt_lookup_max": 3}},
                      "smallest_covering"),
    "draft_model": ([0, 3], {"uses": "draft_model", "with": {"model": "spdflow:tinycode-draft"}}, None),
}


@pytest.mark.parametrize("spd, batching", [("nospec", "batch3"), ("nospec", "cb2"), ("prompt_lookup", "batch1"),
                                           ("prompt_lookup", "batch3"), ("prompt_lookup", "cb2"),
                                           ("draft_model", "batch3")])
def test_greedy_with_ccl_is_token_identical_to_nospec_without(pm, tmp_path, monkeypatch, nospec_tokens, spd, batching):
    """Sequences cross CCL boundaries (24, 40, 64) in prefill and decode, rows of different
    lengths share a step (batch 3, CB 2): tokens equal the no-spec run without CCL, and the
    session really ran the shorter CCLs."""
    import spdflow_ort.session as ort_session

    picked = []
    original = ort_session.pick_ccl

    def spy(positions, available):
        picked.append(original(positions, available))
        return picked[-1]

    monkeypatch.setattr(ort_session, "pick_ccl", spy)
    ks, proposer, policy = SPD[spd]
    path = _recipe(tmp_path, f"ccl-{spd}-{batching}", ks=ks, proposer=proposer, batching=BATCHING[batching],
                   devices={"comp_ctx_lengths": CCLS}, k_policy=policy)
    state = _run(pm, path)
    assert [o["tokens"] for o in state.outputs] == nospec_tokens(batching)
    assert {24, 40, 64} <= set(picked)
    if proposer:
        rows = [row for r in state.records if r["kind"] == "step" for row in r["rows"]]
        assert sum(row["accepted"] for row in rows) > 0


@pytest.mark.parametrize("session_mode", ["static", "dynamic"])
def test_fused_graph_with_ccl_at_batch_three_gives_the_nospec_tokens(pm, tmp_path, nospec_tokens, session_mode):
    """devices.with.graph fused (GroupQueryAttention, one node per batch row): rows of different
    lengths, idle and padded rows, K up to 7 and CCL shapes: the no-spec tokens without CCL."""
    path = _recipe(tmp_path, f"ccl-fused-{session_mode}", ks=[0, 2, 4, 7], proposer=SPD["prompt_lookup"][1],
                   batching=BATCHING["batch3"], k_policy="smallest_covering",  # goodput may skip: timing-driven
                   devices={"comp_ctx_lengths": CCLS, "graph": "fused", "session_mode": session_mode})
    state = _run(pm, path)
    assert state.stages["generate"].detail["runtime"]["graph"] == "fused"
    assert [o["tokens"] for o in state.outputs] == nospec_tokens("batch3")
    rows = [row for r in state.records if r["kind"] == "step" for row in r["rows"]]
    assert sum(row["accepted"] for row in rows) > 0


def test_dynamic_session_serves_every_ccl(pm, tmp_path, nospec_tokens):
    path = _recipe(tmp_path, "ccl-dynamic", ks=[0, 2, 4, 7],
                   proposer=SPD["prompt_lookup"][1], batching=BATCHING["batch3"],
                   devices={"comp_ctx_lengths": CCLS, "session_mode": "dynamic"})
    state = _run(pm, path)
    assert [o["tokens"] for o in state.outputs] == nospec_tokens("batch3")
