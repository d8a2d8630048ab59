"""The KV-cache and RMSNorm ops QEfficient 1.22 writes, as ONNX local functions.

The QAIC compiler knows these ops by domain and name; their bodies are standard ONNX, so
ONNX Runtime runs the same file (it inlines local functions at load):

* ``com.qualcomm.cloud`` ``CtxScatter(data, position_ids, updates)``: ``updates`` [b, h, s, d]
  written into the cache ``data`` [b, h, ctx, d] at slot ``position_ids`` [b, s] of each row.
* ``com.qualcomm.cloud`` ``CtxGather(data, ctx_indices, comp_ctx_len)``: slots ``ctx_indices``
  (broadcast to [b, h, comp_ctx_len]) of every row, [b, h, comp_ctx_len, d]. ``comp_ctx_len``
  is the compute context length: the number of cache slots a step reads.
* ``CtxScatterCB(data, batch_index, position_ids, updates)`` and
  ``CtxGatherCB(data, batch_index, ctx_indices, comp_ctx_len)``: the same on the cache rows
  named by ``batch_index`` [b, 1] (continuous batching; the cache has full_batch_size rows).
* ``com.qti.aisw.onnx`` ``CustomRMSNorm(hidden_states, weight)`` with float attribute
  ``epsilon``: ``weight * hidden_states / sqrt(mean(hidden_states², -1) + epsilon)``.

Domains, names, inputs, attributes and the order of the body ops follow the captured reference
(``onnx_signature.json`` of the QEfficient 1.22 capture). A slot index of -1 counts from the end
(ONNX ScatterND/GatherND semantics), so a padding position writes slot ctx_len - 1, which no
valid query ever attends to.

Each op is a ``torch.autograd.Function`` whose ``symbolic`` emits the custom node during the
TorchScript export; :func:`add_functions` then attaches the bodies to the exported model.
"""
from __future__ import annotations

import torch

CLOUD = "com.qualcomm.cloud"
AISW = "com.qti.aisw.onnx"
#: The opset of the standard ops inside the function bodies (that of the exported graph).
BODY_OPSET = 17
CUSTOM_OPSETS = {AISW: 1, CLOUD: 1}


def _slots(position_ids: torch.Tensor, ctx: int) -> torch.Tensor:
    # Negative slots count from the end, as ScatterND/GatherND define it.
    return torch.where(position_ids < 0, position_ids + ctx, position_ids)


def _gather_slots(rows: torch.Tensor, ctx_indices: torch.Tensor, n: int) -> torch.Tensor:
    """Slots ``ctx_indices`` (broadcast to [b, h, n]) of every row of ``rows`` [b, h, ctx, d]."""
    b, h, ctx, d = rows.shape
    index = _slots(ctx_indices, ctx).expand(b, h, n).unsqueeze(-1).expand(b, h, n, d)
    return torch.gather(rows, 2, index)


def _emit(g, op: str, like, *inputs, **attributes):
    """The custom node ``op`` ("domain::Name"), typed like the value ``like``."""
    return g.op(op, *inputs, **attributes).setType(like.type())


class CtxScatter(torch.autograd.Function):
    """``data`` with ``updates`` written at ``position_ids`` (every row)."""

    @staticmethod
    def forward(ctx, data, position_ids, updates):
        b, h, s, d = updates.shape
        index = _slots(position_ids, data.shape[2]).view(b, 1, s, 1).expand(b, h, s, d)
        return data.scatter(2, index, updates)

    @staticmethod
    def symbolic(g, data, position_ids, updates):
        return _emit(g, f"{CLOUD}::CtxScatter", data, data, position_ids, updates)


class CtxScatterCB(torch.autograd.Function):
    """``data`` with ``updates`` written at ``position_ids`` of the rows ``batch_index``."""

    @staticmethod
    def forward(ctx, data, batch_index, position_ids, updates):
        b, h, s, _ = updates.shape
        rows = batch_index.view(b, 1, 1).expand(b, h, s)
        heads = torch.arange(h, dtype=torch.int64).view(1, h, 1).expand(b, h, s)
        slots = _slots(position_ids, data.shape[2]).view(b, 1, s).expand(b, h, s)
        return data.index_put((rows, heads, slots), updates)

    @staticmethod
    def symbolic(g, data, batch_index, position_ids, updates):
        return _emit(g, f"{CLOUD}::CtxScatterCB", data, data, batch_index, position_ids, updates)


class CtxGather(torch.autograd.Function):
    """Slots ``ctx_indices`` (broadcast to [b, h, comp_ctx_len]) of every row of ``data``."""

    @staticmethod
    def forward(ctx, data, ctx_indices, comp_ctx_len):
        return _gather_slots(data, ctx_indices, int(comp_ctx_len.reshape(-1)[0]))

    @staticmethod
    def symbolic(g, data, ctx_indices, comp_ctx_len):
        return _emit(g, f"{CLOUD}::CtxGather", data, data, ctx_indices, comp_ctx_len)


class CtxGatherCB(torch.autograd.Function):
    """Slots ``ctx_indices`` [.., .., comp_ctx_len] of the rows ``batch_index`` of ``data``."""

    @staticmethod
    def forward(ctx, data, batch_index, ctx_indices, comp_ctx_len):
        return _gather_slots(data[batch_index.view(-1)], ctx_indices, ctx_indices.shape[-1])

    @staticmethod
    def symbolic(g, data, batch_index, ctx_indices, comp_ctx_len):
        return _emit(g, f"{CLOUD}::CtxGatherCB", data, data, batch_index, ctx_indices, comp_ctx_len)


class CustomRMSNorm(torch.autograd.Function):
    """``weight * x / sqrt(mean(x², -1) + epsilon)`` in float32."""

    @staticmethod
    def forward(ctx, hidden_states, weight, epsilon: float):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return weight.float() * (hidden_states * torch.rsqrt(variance + epsilon))

    @staticmethod
    def symbolic(g, hidden_states, weight, epsilon: float):
        return _emit(g, f"{AISW}::CustomRMSNorm", hidden_states, hidden_states, weight, epsilon_f=float(epsilon))


def rms_norm(module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """An HF RMSNorm module (weight, variance_epsilon) applied through CustomRMSNorm.

    The op works in float32, as HF's RMSNorm does; a float16 model casts in and out around it.
    """
    eps = getattr(module, "variance_epsilon", None)
    if eps is None:
        eps = module.eps
    dtype = hidden_states.dtype
    x = hidden_states if dtype == torch.float32 else hidden_states.float()
    out = CustomRMSNorm.apply(x, module.weight, float(eps))
    return out if dtype == torch.float32 else out.to(dtype)


# ------------------------------------------------------------------------ function bodies


def _bodies():
    """name -> (domain, inputs, attributes, body nodes) of every function, in standard ops."""
    from onnx import AttributeProto, TensorProto, helper

    def const(name, values):
        return helper.make_node(
            "Constant", [], [name],
            value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values),
        )

    def node(op, inputs, outputs, **attrs):
        return helper.make_node(op, inputs, outputs, **attrs)

    def dim(source, axis, out, tmp, index_name):
        # `out` = Shape(source)[axis] as a 1-D tensor.
        return [node("Shape", [source], [tmp]), const(index_name, [axis]),
                node("Gather", [tmp, index_name], [out])]

    def _range(start, limit, delta, out):
        # Range takes scalars; QEfficient passes the 1-element tensors its Concat also uses,
        # which ONNX Runtime's shape inference rejects once the graph's dims are fixed.
        names = [f"{out}_{name}" for name in (start, limit, delta)]
        return [*(node("Squeeze", [src], [dst]) for src, dst in zip((start, limit, delta), names)),
                node("Range", names, [out])]

    epsilon = helper.make_node("Constant", [], ["epsilon"])
    epsilon.attribute.append(
        AttributeProto(name="value_float", ref_attr_name="epsilon", type=AttributeProto.FLOAT)
    )
    rms = [
        node("Cast", ["weight"], ["weight_0"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["int64_2"], value=helper.make_tensor("int64_2", TensorProto.INT64, [], [2])),
        node("Pow", ["hidden_states", "int64_2"], ["tmp"]),
        node("ReduceMean", ["tmp"], ["variance"], axes=[-1], keepdims=1),
        epsilon,
        node("Shape", ["variance"], ["tmp_1"]),
        node("Expand", ["epsilon", "tmp_1"], ["epsilon_2"]),
        node("Add", ["variance", "epsilon_2"], ["tmp_3"]),
        node("Sqrt", ["tmp_3"], ["tmp_4"]),
        node("Reciprocal", ["tmp_4"], ["tmp_5"]),
        node("Mul", ["hidden_states", "tmp_5"], ["hidden_states_6"]),
        node("Mul", ["weight_0", "hidden_states_6"], ["return_val"]),
    ]

    def scatter(cb: bool):
        batch_source = "batch_index" if cb else "data"
        nodes = [
            *dim(batch_source, 0, "batch_size", "tmp", "int64_0_1d"),
            *dim("data", 1, "num_heads", "tmp_0", "int64_1_1d"),
            *dim("position_ids", 1, "seq_len", "tmp_1", "int64_1_1d_2"),
            const("zero", [0]),
            const("one", [1]),
            node("Concat", ["batch_size", "num_heads", "seq_len", "one"], ["exp_shape"], axis=0),
        ]
        if cb:
            nodes += [const("const", [2, 3]), node("Unsqueeze", ["batch_index", "const"], ["tmp_3"]),
                      node("Expand", ["tmp_3", "exp_shape"], ["batch_idx"])]
            n = 4
        else:
            nodes += [*_range("zero", "batch_size", "one", "tmp_3"),
                      const("const", [1, 2, 3]), node("Unsqueeze", ["tmp_3", "const"], ["tmp_4"]),
                      node("Expand", ["tmp_4", "exp_shape"], ["batch_idx"])]
            n = 5
        nodes += [
            *_range("zero", "num_heads", "one", f"tmp_{n}"),
            const(f"const_{n + 1}", [0, 2, 3]),
            node("Unsqueeze", [f"tmp_{n}", f"const_{n + 1}"], [f"tmp_{n + 2}"]),
            node("Expand", [f"tmp_{n + 2}", "exp_shape"], ["head_idx"]),
            const(f"const_{n + 3}", [1, 3]),
            node("Unsqueeze", ["position_ids", f"const_{n + 3}"], [f"tmp_{n + 4}"]),
            node("Expand", [f"tmp_{n + 4}", "exp_shape"], ["ctx_idx"]),
            node("Concat", ["batch_idx", "head_idx", "ctx_idx"], ["indices"], axis=3),
            node("ScatterND", ["data", "indices", "updates"], ["return_val"]),
        ]
        return nodes

    gather = [
        node("Shape", ["data"], ["tmp"]),
        const("int64_0_1d", [0]),
        const("int64_1_1d", [1]),
        const("int64_2_1d", [2]),
        node("Slice", ["tmp", "int64_0_1d", "int64_2_1d", "int64_0_1d", "int64_1_1d"], ["tmp_subscripted"]),
        const("int64_1_1d_0", [1]),
        node("Reshape", ["comp_ctx_len", "int64_1_1d_0"], ["tmp_1"]),
        node("Concat", ["tmp_subscripted", "tmp_1"], ["shape_tensor"], axis=0),
        node("Expand", ["ctx_indices", "shape_tensor"], ["ctx_indices_2"]),
        const("int64_m1_1d", [-1]),
        node("Unsqueeze", ["ctx_indices_2", "int64_m1_1d"], ["ctx_indices_3"]),
        node("GatherND", ["data", "ctx_indices_3"], ["return_val"], batch_dims=2),
    ]
    gather_cb = [
        *dim("batch_index", 0, "batch_size", "tmp", "int64_0_1d"),
        *dim("data", 1, "num_heads", "tmp_0", "int64_1_1d"),
        *dim("ctx_indices", 2, "ctx_len", "tmp_1", "int64_2_1d"),
        const("zero", [0]),
        const("one", [1]),
        const("int64_1_1d_2", [1]),
        node("Reshape", ["batch_size", "int64_1_1d_2"], ["tmp_3"]),
        const("int64_1_1d_4", [1]),
        node("Reshape", ["num_heads", "int64_1_1d_4"], ["tmp_5"]),
        const("int64_1_1d_6", [1]),
        node("Reshape", ["ctx_len", "int64_1_1d_6"], ["tmp_7"]),
        node("Concat", ["tmp_3", "tmp_5", "tmp_7", "one"], ["exp_shape"], axis=0),
        const("const", [2, 3]),
        node("Unsqueeze", ["batch_index", "const"], ["tmp_8"]),
        node("Expand", ["tmp_8", "exp_shape"], ["batch_idx"]),
        *_range("zero", "num_heads", "one", "tmp_9"),
        const("const_10", [0, 2, 3]),
        node("Unsqueeze", ["tmp_9", "const_10"], ["tmp_11"]),
        node("Expand", ["tmp_11", "exp_shape"], ["head_idx"]),
        const("int64_3_1d", [3]),
        node("Unsqueeze", ["ctx_indices", "int64_3_1d"], ["tmp_12"]),
        node("Expand", ["tmp_12", "exp_shape"], ["ctx_idx"]),
        node("Concat", ["batch_idx", "head_idx", "ctx_idx"], ["indices"], axis=3),
        node("GatherND", ["data", "indices"], ["return_val"]),
    ]
    return {
        "CustomRMSNorm": (AISW, ["hidden_states", "weight"], ["epsilon"], rms),
        "CtxScatter": (CLOUD, ["data", "position_ids", "updates"], [], scatter(cb=False)),
        "CtxGather": (CLOUD, ["data", "ctx_indices", "comp_ctx_len"], [], gather),
        "CtxScatterCB": (CLOUD, ["data", "batch_index", "position_ids", "updates"], [], scatter(cb=True)),
        "CtxGatherCB": (CLOUD, ["data", "batch_index", "ctx_indices", "comp_ctx_len"], [], gather_cb),
    }


def function_protos(names):
    """The FunctionProtos of ``names`` (e.g. ["CustomRMSNorm", "CtxScatter", "CtxGather"])."""
    from onnx import helper

    bodies = _bodies()
    protos = []
    for name in names:
        domain, inputs, attributes, nodes = bodies[name]
        protos.append(helper.make_function(
            domain, name, inputs, ["return_val"], nodes,
            [helper.make_opsetid("", BODY_OPSET)], attributes=attributes,
        ))
    return protos


def add_functions(model) -> None:
    """Attach the body of every custom op ``model``'s graph uses, and its domain's opset.

    Functions come in the reference's order (CustomRMSNorm, then the scatter, then the gather).
    """
    from onnx import helper

    used = {(node.domain, node.op_type) for node in model.graph.node}
    order = ["CustomRMSNorm", "CtxScatter", "CtxScatterCB", "CtxGather", "CtxGatherCB"]
    bodies = _bodies()
    names = [name for name in order if (bodies[name][0], name) in used]
    del model.functions[:]
    model.functions.extend(function_protos(names))
    have = {opset.domain for opset in model.opset_import}
    for domain, version in CUSTOM_OPSETS.items():
        if domain not in have and any(bodies[n][0] == domain for n in names):
            model.opset_import.append(helper.make_opsetid(domain, version))
