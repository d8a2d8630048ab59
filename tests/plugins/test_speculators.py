"""Multi-projection heads and the EAGLE layer (plugins/spdflow_onnx/speculators.py) and the
export's optional outputs, against torch references built from the same weights."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file

from spdflow.api import ExportRequest
from spdflow.errors import StageError
from spdflow.recipe.schema import ModelSpec
from spdflow.testing.models import add_speculators, make_tiny_model
from spdflow_onnx import speculators as spec
from spdflow_onnx import spdflow_export
from spdflow_onnx.export import load_hf_model
from spdflow_ort.session import session_options

CTX = 32
HEADS = 3


def export(model_dir, work_dir, outputs=()):
    work_dir.mkdir(parents=True, exist_ok=True)
    return spdflow_export(request=ExportRequest(model=ModelSpec(id=str(model_dir)), model_dir=model_dir, role="target",
                                                continuous_batching=False, work_dir=work_dir, outputs=outputs))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    return add_speculators(make_tiny_model(root / "base"), root / "model", heads=HEADS)


@pytest.fixture(scope="module")
def exports(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("spec-export")
    return {name: export(model_dir, root / name, outputs) for name, outputs in
            [("plain", ()), ("heads", ("head_logits",)), ("both", ("head_logits", "hidden_states"))]}


def run(result, ids, positions, nlk):
    info = result.model_info
    feeds = {"input_ids": ids, "position_ids": positions, "num_logits_to_keep": np.zeros((nlk, 1), dtype=np.int64)}
    for i in range(info.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}.{i}"] = np.zeros((ids.shape[0], info.num_kv_heads, CTX, info.head_dim), np.float32)
    session = ort.InferenceSession(str(result.onnx_path), sess_options=session_options(None))
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def test_heads_files_use_the_key_names_qefficient_loads(model_dir):
    keys = set(load_file(str(model_dir / spec.SPECULATOR_WEIGHTS)))
    assert keys == {f"projections.{h}.0.linear.{p}" for h in range(HEADS) for p in ("weight", "bias")}
    config = json.loads((model_dir / spec.SPECULATOR_CONFIG).read_text())
    assert config == {"model_type": "turbo", "turbo_num_heads": HEADS, "turbo_num_layers": 1}


def test_default_export_has_no_extra_outputs(exports):
    graph = onnx.load(str(exports["plain"].onnx_path), load_external_data=False).graph
    assert [o.name for o in graph.output][0] == "logits"
    assert "hidden_states" not in [o.name for o in graph.output]
    assert len(graph.output[0].type.tensor_type.shape.dim) == 3


def test_multi_projection_logits_match_a_torch_reference(model_dir, exports):
    """logits [b, nlk, heads+1, vocab]: row 0 the LM head, row i head i, on the kept rows."""
    ids = np.array([[5, 17, 300, 42, 9, 77], [8, 8, 1000, 3, 2, 1]], dtype=np.int64)
    positions = np.array([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, -1, -1]], dtype=np.int64)
    nlk = 3
    out = run(exports["heads"], ids, positions, nlk)
    logits = out["logits"]
    assert logits.shape == (2, nlk, HEADS + 1, 4096)

    hf = load_hf_model(model_dir)
    weights = load_file(str(model_dir / spec.SPECULATOR_WEIGHTS))  # written independently of the export

    def head(h, i):
        w, b = weights[f"projections.{i}.0.linear.weight"], weights[f"projections.{i}.0.linear.bias"]
        return h + torch.nn.functional.silu(h @ w.T + b)

    with torch.no_grad():
        for row, last in ((0, 5), (1, 3)):
            n = last + 1
            hidden = hf.model(input_ids=torch.from_numpy(ids[row:row + 1, :n])).last_hidden_state[0]
            kept = hidden[n - nlk:n]  # the nlk rows ending at the last valid position
            reference = torch.stack([hf.lm_head(kept)] + [hf.lm_head(head(kept, i)) for i in range(HEADS)], dim=1).numpy()
            np.testing.assert_allclose(logits[row], reference, atol=2e-4, rtol=1e-4)
            assert not np.allclose(reference[:, 0], reference[:, 1], atol=1e-2)  # the heads do something

    plain = run(exports["plain"], ids, positions, nlk)["logits"]
    np.testing.assert_allclose(logits[:, :, 0], plain, atol=1e-5)


def test_hidden_states_output_is_the_final_norm_of_every_row(model_dir, exports):
    ids = np.array([[5, 17, 300, 42]], dtype=np.int64)
    positions = np.arange(4, dtype=np.int64)[None]
    out = run(exports["both"], ids, positions, 1)
    assert out["logits"].shape == (1, 1, HEADS + 1, 4096)
    hf = load_hf_model(model_dir)
    with torch.no_grad():
        reference = hf.model(input_ids=torch.from_numpy(ids)).last_hidden_state.numpy()
    np.testing.assert_allclose(out["hidden_states"], reference, atol=2e-5)


def test_export_asking_for_heads_without_files_names_the_fix(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model")
    with pytest.raises(StageError, match="speculator_config.json") as info:
        export(model_dir, tmp_path / "export", ("head_logits",))
    assert "train_heads" in info.value.hint


def test_eagle_layer_round_trips_and_reuses_the_target(model_dir):
    hf = load_hf_model(model_dir)
    draft = spec.load_eagle(model_dir, hf.config)
    names = set(load_file(str(model_dir / spec.EAGLE_WEIGHTS)))
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight"} <= names
    x = torch.randn(1, 5, hf.config.hidden_size)
    assert draft(x, x).shape == (1, 5, hf.config.hidden_size)


def test_eagle_program_matches_the_torch_layer_chunked_and_stepwise(model_dir, tmp_path):
    """The EAGLE ONNX program with its KV cache (catch-up in two chunks, then one drafted step)
    gives the torch layer's logits and features for the same sequence."""
    from spdflow_onnx.eagle import export_eagle

    facts = export_eagle(model_dir, tmp_path / "eagle.onnx")
    session = ort.InferenceSession(str(tmp_path / "eagle.onnx"), sess_options=session_options(None))
    hf = load_hf_model(model_dir)
    draft = spec.load_eagle(model_dir, hf.config)
    d, n = facts["hidden_size"], 7
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 4096, n).astype(np.int64)
    feats = rng.standard_normal((n, d)).astype(np.float32)
    with torch.no_grad():
        predicted = draft(hf.model.embed_tokens(torch.from_numpy(tokens))[None], torch.from_numpy(feats)[None])[0]
        reference_logits = hf.lm_head(predicted).numpy()
    kv = np.zeros((1, facts["num_kv_heads"], CTX, facts["head_dim"]), np.float32)
    key, value = kv, kv.copy()
    for lo, hi in ((0, 4), (4, 6), (6, 7)):  # two catch-up chunks, then one step of seq_len 1
        logits, hidden, key, value = session.run(None, {
            "input_ids": tokens[None, lo:hi], "hidden_states": feats[None, lo:hi],
            "position_ids": np.arange(lo, hi, dtype=np.int64)[None], "past_key.0": key, "past_value.0": value,
            "num_logits_to_keep": np.zeros((1, 1), np.int64)})
        np.testing.assert_allclose(logits[0, -1], reference_logits[hi - 1], atol=2e-4, rtol=1e-4)
        np.testing.assert_allclose(hidden[0, -1], predicted[hi - 1].numpy(), atol=2e-5, rtol=1e-4)
