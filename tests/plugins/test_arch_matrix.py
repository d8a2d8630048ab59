"""The architecture matrix: tiny random-init Llama, Qwen2, Qwen2.5, Qwen3 and Mistral configs, tied
embeddings and RoPE scaling variants export and match HF transformers' logits; what the exporter
cannot do exactly (sliding windows shorter than the context, run-time RoPE scaling) is refused
with one sentence; a tied embedding is stored once."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from spdflow.api import ExportRequest
from spdflow.errors import StageError
from spdflow.recipe.schema import ModelSpec
from spdflow.testing.models import TINY_VOCAB, make_tiny_model
from spdflow_onnx import spdflow_export
from spdflow_onnx.export import load_hf_model
from spdflow_ort.session import session_options

CTX = 64

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 10000.0}

#: name -> (arch, config fields). Qwen2.5 is model_type qwen2 with q/k/v biases and tied embeddings.
EXPORTED = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2": ("qwen2", {}),
    "qwen2.5": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"tie_word_embeddings": True}),
    "mistral": ("mistral", {"sliding_window": None}),
    "mistral-window-covers-context": ("mistral", {"sliding_window": 512}),
    "rope-llama3": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "rope-linear": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}}),
    "rope-yarn": ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                "original_max_position_embeddings": 128}}),
}

REFUSED = {
    "mistral-sliding-window": ("mistral", {"sliding_window": 16}, "sliding-window attention (window 16)"),
    "qwen2-sliding-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 16}, "sliding-window attention"),
    "rope-dynamic": ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
                     "'dynamic' RoPE scaling"),
}


def _export(model_dir, work_dir):
    work_dir.mkdir(parents=True, exist_ok=True)
    request = ExportRequest(model=ModelSpec(id=str(model_dir)), model_dir=model_dir, role="target",
                            continuous_batching=False, work_dir=work_dir, progress=lambda m: None)
    return spdflow_export(request=request)


def _feeds(info, ids, positions, nlk):
    feeds = {"input_ids": ids, "position_ids": positions}
    for i in range(info.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}.{i}"] = np.zeros((ids.shape[0], info.num_kv_heads, CTX, info.head_dim), np.float32)
    feeds["num_logits_to_keep"] = np.zeros((nlk, 1), dtype=np.int64)
    return feeds


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_architecture_exports_and_matches_hf(name, tmp_path):
    arch, fields = EXPORTED[name]
    model_dir = make_tiny_model(tmp_path / "model", arch=arch, **fields)
    result = _export(model_dir, tmp_path / "export")
    model = load_hf_model(model_dir)
    # the engine's options: once a test made ORT's process-wide thread pool, every session must use it
    session = ort.InferenceSession(str(result.onnx_path), sess_options=session_options(None))
    # positions past the scaled RoPE's original context, so scaling matters
    seq = 48
    ids = np.random.default_rng(3).integers(2, TINY_VOCAB, size=(1, seq))
    positions = np.arange(seq)[None]
    logits = session.run(None, _feeds(result.model_info, ids, positions, nlk=seq))[0]
    with torch.no_grad():
        reference = model(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(logits[0], reference[0], atol=2e-4, rtol=1e-4)
    assert (np.argmax(logits[0], -1) == np.argmax(reference[0], -1)).all()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_architecture_the_exporter_cannot_do_exactly_is_refused_in_one_sentence(name, tmp_path):
    arch, fields, why = REFUSED[name]
    model_dir = make_tiny_model(tmp_path / "model", arch=arch, **fields)
    with pytest.raises(StageError) as info:
        _export(model_dir, tmp_path / "export")
    assert why in info.value.message and "\n" not in info.value.message


def _vocab_tensors(onnx_path):
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    return [t.name for t in graph.initializer if TINY_VOCAB in t.dims]


def test_tied_embedding_is_stored_once_and_untied_heads_are_kept(tmp_path):
    tied = _export(make_tiny_model(tmp_path / "tied", tie_word_embeddings=True), tmp_path / "tied-export")
    untied = _export(make_tiny_model(tmp_path / "untied"), tmp_path / "untied-export")
    assert len(_vocab_tensors(tied.onnx_path)) == 1
    assert len(_vocab_tensors(untied.onnx_path)) == 2
    embedding = TINY_VOCAB * 64 * 4
    tied_bytes = (tied.onnx_path.parent / "model.onnx.data").stat().st_size
    untied_bytes = (untied.onnx_path.parent / "model.onnx.data").stat().st_size
    assert untied_bytes - tied_bytes >= embedding * 0.99


def test_share_tied_embedding_leaves_a_head_that_is_not_the_transpose(tmp_path):
    """An untied head of the transposed shape is not shared: equality is checked, not shapes."""
    from onnx import helper, numpy_helper

    from spdflow_onnx.export import share_tied_embedding

    rng = np.random.default_rng(0)
    embed = rng.standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["h"]), helper.make_node("MatMul", ["h", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3, 8])],
        [numpy_helper.from_array(embed, "E"), numpy_helper.from_array(embed.T.copy() + 1e-7, "W")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert share_tied_embedding(proto) == []
    proto.graph.initializer[1].CopyFrom(numpy_helper.from_array(embed.T.copy(), "W"))
    assert share_tied_embedding(proto) == ["W"]
    assert [t.name for t in proto.graph.initializer if t.name in ("E", "W")] == ["E"]
    session = ort.InferenceSession(proto.SerializeToString(), sess_options=session_options(None))
    ids = np.array([[1, 2, 3], [7, 0, 5]])
    np.testing.assert_allclose(session.run(None, {"ids": ids})[0], embed[ids] @ embed.T, rtol=1e-6, atol=1e-6)


def test_export_in_a_child_process_gives_the_same_graph_and_one_sentence_errors(tmp_path, monkeypatch):
    """Large models export in a child (SPDFLOW_EXPORT_CHILD=1 forces it here): same files and
    model info as in-process, progress streamed, a refusal comes back as the same sentence."""
    from spdflow_onnx.child import ENV

    model_dir = make_tiny_model(tmp_path / "model", tie_word_embeddings=True)
    here = _export(model_dir, tmp_path / "here")
    monkeypatch.setenv(ENV, "1")
    messages = []
    request = ExportRequest(model=ModelSpec(id=str(model_dir)), model_dir=model_dir, role="target",
                            continuous_batching=False, work_dir=tmp_path / "child", progress=messages.append)
    (tmp_path / "child").mkdir()
    child = spdflow_export(request=request)
    assert child.model_info == here.model_info
    assert sorted(p.name for p in child.files) == sorted(p.name for p in here.files)
    assert (tmp_path / "child" / "model.onnx.data").read_bytes() == (tmp_path / "here" / "model.onnx.data").read_bytes()
    assert any(m.startswith("tracing llama") for m in messages) and "child process" in messages[-1]
    refused = make_tiny_model(tmp_path / "refused", arch="mistral", sliding_window=16)
    with pytest.raises(StageError) as info:
        _export(refused, tmp_path / "refused-export")
    assert "sliding-window attention (window 16)" in info.value.message
