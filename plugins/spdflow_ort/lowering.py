"""ONNX Runtime's bodies for the custom ops of the exported graph (its "kernels").

The export writes QEfficient's custom ops (``CustomRMSNorm``, ``CtxScatter`` ...) as ONNX local
functions with QEfficient's own bodies, so the file a QAIC host compiles is the one QEfficient
would write. The QAIC compiler brings its own kernels for these ops; this module is the
onnxruntime backend's counterpart: when it writes the graphs of a program it swaps in bodies
with the same semantics that ONNX Runtime optimises better.

* ``CustomRMSNorm``: ``x / sqrt(mean(x²) + epsilon)`` with a Div instead of Reciprocal + Mul
  and the epsilon added as a constant, the pattern ORT fuses into one
  SimplifiedLayerNormalization kernel.
* ``CtxScatter``: ScatterElements on the slot axis instead of ScatterND with built (b, h, slot)
  index tuples; the same writes, without building the index tensor every call.

Every other function keeps the exported body. ``benchmarks/kv_ops.py`` measures the effect.
"""
from __future__ import annotations

#: Bumped when a body here changes: it is part of the program's compile key.
LOWERING_VERSION = 1

AISW = "com.qti.aisw.onnx"
CLOUD = "com.qualcomm.cloud"


def _rms_norm_nodes():
    from onnx import AttributeProto, TensorProto, helper

    epsilon = helper.make_node("Constant", [], ["epsilon"])
    epsilon.attribute.append(
        AttributeProto(name="value_float", ref_attr_name="epsilon", type=AttributeProto.FLOAT)
    )
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    return [
        helper.make_node("Cast", ["weight"], ["weight_f"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["two"], value=two),
        helper.make_node("Pow", ["hidden_states", "two"], ["squares"]),
        helper.make_node("ReduceMean", ["squares"], ["variance"], axes=[-1], keepdims=1),
        epsilon,
        helper.make_node("Add", ["variance", "epsilon"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["rms"]),
        helper.make_node("Div", ["hidden_states", "rms"], ["normalized"]),
        helper.make_node("Mul", ["weight_f", "normalized"], ["return_val"]),
    ]


def _scatter_nodes():
    from onnx import TensorProto, helper

    axes = helper.make_tensor("axes", TensorProto.INT64, [2], [1, 3])
    return [
        helper.make_node("Constant", [], ["axes"], value=axes),
        helper.make_node("Unsqueeze", ["position_ids", "axes"], ["slots"]),  # [b, 1, s, 1]
        helper.make_node("Shape", ["updates"], ["update_shape"]),
        helper.make_node("Expand", ["slots", "update_shape"], ["index"]),  # [b, h, s, d]
        helper.make_node("ScatterElements", ["data", "index", "updates"], ["return_val"], axis=2),
    ]


_BODIES = {(AISW, "CustomRMSNorm"): _rms_norm_nodes, (CLOUD, "CtxScatter"): _scatter_nodes}


def lower_custom_ops(model) -> list[str]:
    """Replace the bodies of the functions ORT has its own bodies for; their names."""
    lowered = []
    for function in model.functions:
        make = _BODIES.get((function.domain, function.name))
        if make is None:
            continue
        del function.node[:]
        function.node.extend(make())
        lowered.append(function.name)
    return lowered
