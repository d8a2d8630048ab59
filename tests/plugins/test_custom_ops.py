"""The exported graph against QEfficient 1.22's (tests/fixtures/qefficient-1.22/onnx_signature.json)
and against the Hugging Face model it was exported from.

The signature is compared on the embedded tinycode-target, the model the reference was captured
on. The standard-op census is not compared: spdflow's wrapper computes RoPE in the graph and
builds fewer index tensors, so counts of Constant, Shape, Unsqueeze ... differ by design
(docs/qaic.md, "Differences from QEfficient").
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from spdflow.testing.models import make_tiny_model
from spdflow.zoo import zoo_path
from spdflow_onnx.export import load_hf_model
from tests.plugins.test_export import export, ort_session

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "qefficient-1.22" / "onnx_signature.json"
#: Output axis names the reference got from its exporter (``Castlogits_dim_0``); spdflow names
#: them after the symbols specializations.json binds.
LOGITS_AXES = ["batch_size", "num_logits_to_keep"]


@pytest.fixture(scope="module", params=["noncb", "cb"])
def embedded(request, tmp_path_factory):
    cb = request.param == "cb"
    result = export(zoo_path("tinycode-target"), tmp_path_factory.mktemp(request.param), continuous_batching=cb)
    model = onnx.load(str(result.onnx_path), load_external_data=False)
    return model, json.loads(REFERENCE.read_text())[request.param]


def _io(value):
    tensor = value.type.tensor_type
    dims = [d.dim_param or d.dim_value for d in tensor.shape.dim]
    return {"name": value.name, "elem_type": onnx.TensorProto.DataType.Name(tensor.elem_type), "shape": dims}


def test_export_opsets_and_ir_version_equal_the_reference(embedded):
    model, ref = embedded
    assert model.ir_version == ref["ir_version"]
    assert [[o.domain, o.version] for o in model.opset_import] == ref["opset_import"]


def test_export_inputs_and_outputs_equal_the_reference(embedded):
    model, ref = embedded
    assert [_io(v) for v in model.graph.input] == ref["inputs"]
    outputs = [_io(v) for v in model.graph.output]
    assert outputs[0]["shape"][:2] == LOGITS_AXES
    outputs[0]["shape"][:2] = [d for d in ref["outputs"][0]["shape"][:2]]
    assert outputs == ref["outputs"]


def test_export_custom_op_census_equals_the_reference(embedded):
    model, ref = embedded
    census = collections.Counter(f"{n.domain}:{n.op_type}" for n in model.graph.node if n.domain)
    expected = {op: count for op, count in ref["op_counts"].items() if ":" in op}
    assert dict(census) == expected


def _body(function):
    """The body as the reference lists it, minus the Squeezes that give Range scalar inputs.

    QEfficient feeds Range the 1-element tensors its Concat also takes; ONNX Runtime rejects
    that once dims are fixed (the onnxruntime backend fixes them per specialization).
    """
    squeezed = {n.output[0]: n.input[0] for n in function.node if n.op_type == "Squeeze"}
    return [
        [n.domain, n.op_type, [squeezed.get(i, i) for i in n.input], list(n.output)]
        for n in function.node
        if n.op_type != "Squeeze"
    ]


def test_export_function_signatures_and_bodies_equal_the_reference(embedded):
    model, ref = embedded
    mine = [
        {
            "domain": f.domain,
            "name": f.name,
            "inputs": list(f.input),
            "outputs": list(f.output),
            "attributes": list(f.attribute),
            "nodes": _body(f),
        }
        for f in model.functions
    ]
    assert mine == ref["functions"]
    ranges = [n for f in model.functions for n in f.node if n.op_type == "Range"]
    assert ranges and all(i.endswith(("_zero", "_one", "_batch_size", "_num_heads")) for n in ranges for i in n.input)


def test_custom_rms_norm_keeps_epsilon_as_attribute(embedded):
    model, _ = embedded
    norms = [n for n in model.graph.node if n.op_type == "CustomRMSNorm"]
    assert len(norms) == 9  # two per layer and the final norm
    for norm in norms:
        assert [a.name for a in norm.attribute] == ["epsilon"]
        assert onnx.helper.get_attribute_value(norm.attribute[0]) == pytest.approx(1e-6)


def test_ctx_gather_reads_comp_ctx_len_from_the_cache_shape(embedded):
    model, _ = embedded
    gathers = [n for n in model.graph.node if n.op_type.startswith("CtxGather")]
    producers = {out: n for n in model.graph.node for out in n.output}
    for gather in gathers:
        # A real graph value (Shape of the cache), not a constant folded into the op.
        source = producers[gather.input[-1]]
        assert source.op_type in ("Slice", "Gather"), source.op_type


# ------------------------------------------------------------------------------ numerics


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("numerics")
    model_dir = make_tiny_model(root / "model", num_layers=2)
    hf = load_hf_model(model_dir)
    plain = export(model_dir, root / "plain")
    cb = export(model_dir, root / "cb", continuous_batching=True)
    return hf, plain, cb


CTX, PREFILL = 64, 32


def _empty_cache(info, rows):
    shape = (rows, info.num_kv_heads, CTX, info.head_dim)
    return {f"past_{kind}.{i}": np.zeros(shape, np.float32)
            for i in range(info.num_layers) for kind in ("key", "value")}


def _run(session, cache, ids, positions, nlk, batch_index=None):
    """One step; the retained states replace the cache (as the backends bind them)."""
    feeds = {"input_ids": ids, "position_ids": positions, **cache,
             "num_logits_to_keep": np.zeros((nlk, 1), np.int64)}
    if batch_index is not None:
        feeds["batch_index"] = batch_index
    outputs = session.run(None, feeds)
    names = [o.name for o in session.get_outputs()]
    for name, value in zip(names[1:], outputs[1:]):
        cache[name.removesuffix("_RetainedState")] = value
    return outputs[0]


def _prefill_inputs(tokens):
    ids = np.full((1, PREFILL), 1, np.int64)
    positions = np.full((1, PREFILL), -1, np.int64)
    ids[0, : len(tokens)] = tokens
    positions[0, : len(tokens)] = np.arange(len(tokens))
    return ids, positions


def _hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits.numpy()[0]


def test_prefill_then_k3_decode_matches_hf(tiny):
    hf, plain, _ = tiny
    tokens = np.random.default_rng(3).integers(2, 4096, size=24).tolist()
    reference = _hf_logits(hf, tokens)
    session = ort_session(plain.onnx_path)
    cache = _empty_cache(plain.model_info, 1)
    first = _run(session, cache, *_prefill_inputs(tokens[:20]), nlk=1)
    np.testing.assert_allclose(first[0, 0], reference[19], atol=1e-4)
    # K = 3: the anchor at position 20 and three proposals, four logits rows.
    decode = _run(session, cache, np.array([tokens[20:24]]), np.arange(20, 24)[None], nlk=4)
    np.testing.assert_allclose(decode[0], reference[20:24], atol=1e-4)
    assert (decode[0].argmax(-1) == reference[20:24].argmax(-1)).all()


def test_continuous_batching_decode_with_a_padded_slot_matches_hf(tiny):
    hf, _, cb = tiny
    rng = np.random.default_rng(4)
    prompts = {1: rng.integers(2, 4096, size=14).tolist(), 3: rng.integers(2, 4096, size=9).tolist()}
    session = ort_session(cb.onnx_path)
    cache = _empty_cache(cb.model_info, 4)
    for slot, tokens in prompts.items():
        _run(session, cache, *_prefill_inputs(tokens[:-3]), nlk=1, batch_index=np.array([[slot]]))
    before = {name: value.copy() for name, value in cache.items()}
    # One K = 2 decode over all four slots: slots 1 and 3 decode their last three prompt tokens,
    # slots 0 and 2 are idle (position -1 everywhere).
    ids = np.ones((4, 3), np.int64)
    positions = np.full((4, 3), -1, np.int64)
    for slot, tokens in prompts.items():
        ids[slot] = tokens[-3:]
        positions[slot] = np.arange(len(tokens) - 3, len(tokens))
    logits = _run(session, cache, ids, positions, nlk=3, batch_index=np.arange(4)[:, None])
    for slot, tokens in prompts.items():
        np.testing.assert_allclose(logits[slot], _hf_logits(hf, tokens)[-3:], atol=1e-4)
    for name, value in cache.items():
        # An idle slot's padding writes only its last slot, which no valid query attends to.
        for idle in (0, 2):
            np.testing.assert_array_equal(value[idle, :, : CTX - 1], before[name][idle, :, : CTX - 1])
