"""The onnxruntime backend's bodies for the custom ops equal the exported (QEfficient) bodies."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from spdflow.testing.models import make_tiny_model
from spdflow_ort.lowering import lower_custom_ops
from spdflow_ort.session import session_options
from tests.plugins.test_export import export, feeds_for


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lowering")
    result = export(make_tiny_model(root / "model"), root / "export")
    reference = onnx.load(str(result.onnx_path))
    lowered = onnx.ModelProto()
    lowered.CopyFrom(reference)
    names = lower_custom_ops(lowered)
    return result.model_info, reference, lowered, names


def _session(model, optimized=None):
    options = session_options(None)
    if optimized:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(model.SerializeToString(), sess_options=options)


def test_lowering_replaces_rms_norm_and_scatter_only(graphs):
    _, reference, lowered, names = graphs
    assert names == ["CustomRMSNorm", "CtxScatter"]
    kept = {f.name: list(f.node) for f in reference.functions}
    for function in lowered.functions:
        assert (list(function.node) == kept[function.name]) == (function.name not in names)
        assert list(function.input) == list(next(f for f in reference.functions if f.name == function.name).input)


def test_lowered_graph_computes_what_the_exported_one_does(graphs):
    info, reference, lowered, _ = graphs
    ids = np.array([[5, 6, 7, 8], [9, 10, 11, 12]])
    positions = np.array([[3, 4, 5, 6], [7, 8, -1, -1]])  # row 1 pads: slot ctx-1
    feeds = feeds_for(info, ids, positions, nlk=4, seed=2)
    expected = _session(reference).run(None, feeds)
    actual = _session(lowered).run(None, feeds)
    np.testing.assert_allclose(actual[0][0], expected[0][0], atol=1e-5)
    np.testing.assert_allclose(actual[0][1, :2], expected[0][1, :2], atol=1e-5)
    for got, want in zip(actual[1:], expected[1:]):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_lowered_rms_norm_fuses_into_one_ort_kernel(graphs, tmp_path):
    _, _, lowered, _ = graphs
    _session(lowered, optimized=tmp_path / "optimized.onnx")
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node]
    assert ops.count("SimplifiedLayerNormalization") == 5  # two per layer and the final norm
