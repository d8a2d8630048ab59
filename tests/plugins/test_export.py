"""The built-in export plugin (plugins/spdflow_onnx) against the ONNX contract of DESIGN §4."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from spdflow.api import ExportRequest
from spdflow.errors import StageError
from spdflow.recipe.schema import ModelSpec
from spdflow.testing.models import make_tiny_model
from spdflow_onnx import spdflow_export
from spdflow_onnx.export import load_hf_model
from spdflow_ort.session import session_options


def ort_session(path):
    # The engine's options: once a test made ORT's process-wide thread pool, every session must use it.
    return ort.InferenceSession(str(path), sess_options=session_options(None))


CTX = 32


def export(model_dir: Path, work_dir: Path, continuous_batching=False, progress=None):
    work_dir.mkdir(parents=True, exist_ok=True)
    request = ExportRequest(
        model=ModelSpec(id=str(model_dir)),
        model_dir=model_dir,
        role="target",
        continuous_batching=continuous_batching,
        work_dir=work_dir,
        progress=progress or (lambda message: None),
    )
    return spdflow_export(request=request)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def exported(request, tmp_path_factory):
    """(hf model, export result) per architecture; exported once per module."""
    root = tmp_path_factory.mktemp(request.param)
    model_dir = make_tiny_model(root / "model", arch=request.param)
    messages: list[str] = []
    result = export(model_dir, root / "export", progress=messages.append)
    return load_hf_model(model_dir), result, messages


@pytest.fixture(scope="module")
def exported_cb(tmp_path_factory):
    root = tmp_path_factory.mktemp("cb")
    model_dir = make_tiny_model(root / "model", arch="llama")
    return export(model_dir, root / "export", continuous_batching=True)


def dims(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def feeds_for(info, ids, positions, nlk, kv_rows=None, ctx=CTX, batch_index=None, seed=0):
    rng = np.random.default_rng(seed)
    rows = kv_rows or ids.shape[0]
    feeds = {"input_ids": ids, "position_ids": positions}
    for i in range(info.num_layers):
        for kind in ("key", "value"):
            shape = (rows, info.num_kv_heads, ctx, info.head_dim)
            feeds[f"past_{kind}.{i}"] = rng.standard_normal(shape).astype(np.float32)
    if batch_index is not None:
        feeds["batch_index"] = batch_index
    feeds["num_logits_to_keep"] = np.zeros((nlk, 1), dtype=np.int64)
    return feeds


def test_export_writes_contract_io_names_order_and_axes(exported):
    _, result, _ = exported
    graph = onnx.load(str(result.onnx_path), load_external_data=False).graph
    n = result.model_info.num_layers
    past = [f"past_{kind}.{i}" for i in range(n) for kind in ("key", "value")]
    assert [v.name for v in graph.input] == ["input_ids", "position_ids", *past, "num_logits_to_keep"]
    assert [v.name for v in graph.output] == ["logits", *[f"{p}_RetainedState" for p in past]]
    by_name = {v.name: v for v in list(graph.input) + list(graph.output)}
    kv, hd = result.model_info.num_kv_heads, result.model_info.head_dim
    assert dims(by_name["input_ids"]) == ["batch_size", "seq_len"]
    assert dims(by_name["position_ids"]) == ["batch_size", "seq_len"]
    assert dims(by_name["past_key.0"]) == ["batch_size", kv, "ctx_len", hd]
    assert dims(by_name["past_value.1_RetainedState"]) == ["batch_size", kv, "ctx_len", hd]
    assert dims(by_name["num_logits_to_keep"]) == ["num_logits_to_keep", 1]
    assert dims(by_name["logits"]) == ["batch_size", "num_logits_to_keep", 4096]
    assert by_name["input_ids"].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert by_name["logits"].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_export_uses_opset_17_and_custom_ops_only_as_local_functions(exported):
    _, result, _ = exported
    model = onnx.load(str(result.onnx_path), load_external_data=False)
    assert {o.domain: o.version for o in model.opset_import}.get("", None) == 17
    functions = {(f.domain, f.name) for f in model.functions}
    custom = {(node.domain, node.op_type) for node in model.graph.node if node.domain}
    assert custom == functions
    assert {node.domain for f in model.functions for node in f.node} == {""}


def test_export_writes_weights_as_one_external_file_inside_work_dir(exported):
    _, result, messages = exported
    work = result.onnx_path.parent
    graph = onnx.load(str(result.onnx_path), load_external_data=False).graph
    locations = {e.value for t in graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"model.onnx.data"}
    assert (work / "model.onnx.data").stat().st_size > 4096 * 64 * 4
    assert sorted(p.name for p in work.iterdir()) == ["model.onnx", "model.onnx.data", "model_info.json"]
    assert all(p.parent == work for p in result.files)
    assert messages and messages[-1].startswith("exported")


def test_export_model_info_has_ids_and_tokenizer(exported):
    _, result, _ = exported
    info = result.model_info
    assert (info.eos_token_ids, info.pad_token_id, info.vocab_size) == ((0,), 1, 4096)
    assert (info.num_layers, info.num_kv_heads, info.head_dim) == (2, 2, 16)
    assert info.tokenizer_file is not None and info.tokenizer_file.name == "tokenizer.json"


def test_export_prefill_matches_hf_and_keeps_last_valid_row(exported):
    model, result, _ = exported
    session = ort_session(result.onnx_path)
    ids = np.random.default_rng(1).integers(2, 4096, size=(2, 10))
    positions = np.tile(np.arange(10), (2, 1))
    positions[1, 6:] = -1  # row 1 has 6 real tokens, then padding
    with torch.no_grad():
        ref0 = model(torch.tensor(ids[:1])).logits.numpy()[0]
        ref1 = model(torch.tensor(ids[1:, :6])).logits.numpy()[0]
    logits = session.run(None, feeds_for(result.model_info, ids, positions, nlk=3))[0]
    assert logits.shape == (2, 3, 4096)
    # Row 0: positions 7, 8, 9; row 1: the three rows ending at its last valid position 5.
    np.testing.assert_allclose(logits[0], ref0[7:10], atol=1e-4)
    np.testing.assert_allclose(logits[1], ref1[3:6], atol=1e-4)


def test_export_scatters_new_kv_at_positions_and_padding_at_last_slot(exported):
    _, result, _ = exported
    session = ort_session(result.onnx_path)
    ids = np.array([[5, 6, 7]])
    positions = np.array([[4, 5, -1]])
    feeds = feeds_for(result.model_info, ids, positions, nlk=1)
    out = session.run(None, feeds)
    before, after = feeds["past_key.0"], out[1]
    changed = np.nonzero(np.any(before != after, axis=(0, 1, 3)))[0].tolist()
    assert changed == [4, 5, CTX - 1]


def test_export_continuous_batching_touches_only_batch_index_rows(exported_cb):
    result = exported_cb
    graph = onnx.load(str(result.onnx_path), load_external_data=False).graph
    names = [v.name for v in graph.input]
    assert names[-2:] == ["batch_index", "num_logits_to_keep"]
    by_name = {v.name: v for v in graph.input}
    assert dims(by_name["past_key.0"])[0] == "full_batch_size"
    assert dims(by_name["batch_index"]) == ["batch_size", 1]
    session = ort_session(result.onnx_path)
    feeds = feeds_for(result.model_info, np.array([[9, 10, 11]]), np.array([[0, 1, 2]]), nlk=1,
                      kv_rows=3, batch_index=np.array([[2]]))
    out = session.run(None, feeds)
    for i, name in enumerate(n for n in names if n.startswith("past_")):
        np.testing.assert_array_equal(out[1 + i][:2], feeds[name][:2])
        assert not np.array_equal(out[1 + i][2], feeds[name][2])


def test_export_without_config_is_a_stage_error(tmp_path):
    (tmp_path / "model").mkdir()
    with pytest.raises(StageError, match="no config.json"):
        export(tmp_path / "model", tmp_path / "export")


def test_export_without_weights_is_a_stage_error(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(StageError, match="has no weights"):
        export(model_dir, tmp_path / "export")


def test_export_plugin_import_does_not_load_torch():
    import subprocess
    import sys

    code = "import sys, spdflow_onnx, spdflow_ort; print('torch' in sys.modules, 'onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def _export_with_weights_in_the_trace(model_dir: Path, work: Path, continuous_batching: bool, ccl: bool,
                                      outputs: tuple[str, ...]) -> None:
    """The export as it was before weights were written one at a time: the traced proto holds
    every weight, then onnx.save_model moves them to the external data file."""
    from spdflow_onnx import export as ex

    model = load_hf_model(model_dir)
    projections = ex._projections(model, model_dir) if "head_logits" in outputs else None
    hidden = "hidden_states" in outputs
    wrapper = ex.KVCacheLM(model, continuous_batching, projections, hidden, ccl).eval()
    n = wrapper.num_layers
    work.mkdir(parents=True)
    raw = work / "traced.onnx"
    ex.trace_with_weights(wrapper, raw, example=ex._example_inputs(wrapper, torch.float32, continuous_batching),
                          input_names=ex.input_names(n, continuous_batching, ccl),
                          output_names=ex.output_names(n, hidden),
                          dynamic_axes=ex.dynamic_axes(n, continuous_batching, hidden, ccl))
    ex.save_traced(raw, work / "model.onnx", bool(model.config.tie_word_embeddings))


@pytest.mark.parametrize("tied, continuous_batching, ccl, outputs", [
    (True, False, False, ()),
    (False, True, True, ("hidden_states",)),
    (False, False, False, ("head_logits",)),
])
def test_export_writes_the_same_files_as_tracing_with_the_weights(tmp_path, tiny_speculator_model_dir, tied,
                                                                   continuous_batching, ccl, outputs):
    if "head_logits" in outputs:
        model_dir = tiny_speculator_model_dir
    else:
        model_dir = make_tiny_model(tmp_path / "model", tie_word_embeddings=tied, num_layers=3)
    messages: list[str] = []
    request = ExportRequest(model=ModelSpec(id=str(model_dir)), model_dir=model_dir, role="target",
                            continuous_batching=continuous_batching, work_dir=tmp_path / "streamed",
                            progress=messages.append, outputs=outputs, ccl=ccl)
    (tmp_path / "streamed").mkdir()
    result = spdflow_export(request=request)
    assert any("one tensor at a time" in m for m in messages), messages
    _export_with_weights_in_the_trace(model_dir, tmp_path / "reference", continuous_batching, ccl, outputs)

    ours = onnx.load(str(result.onnx_path), load_external_data=False)
    ref = onnx.load(str(tmp_path / "reference" / "model.onnx"), load_external_data=False)
    assert [(t.name, t.data_type, list(t.dims)) for t in ours.graph.initializer] == \
        [(t.name, t.data_type, list(t.dims)) for t in ref.graph.initializer]
    assert [n.SerializeToString() for n in ours.graph.node] == [n.SerializeToString() for n in ref.graph.node]
    if tied:
        # the embedding is stored once: no initializer holds its transpose
        shapes = [tuple(t.dims) for t in ours.graph.initializer if len(t.dims) == 2]
        assert (4096, 64) in shapes and (64, 4096) not in shapes
    assert result.onnx_path.read_bytes() == (tmp_path / "reference" / "model.onnx").read_bytes()
    assert (result.onnx_path.parent / "model.onnx.data").read_bytes() == \
        (tmp_path / "reference" / "model.onnx.data").read_bytes()
