"""The fused decode graph of the onnxruntime backend (``devices.with.graph: fused``).

The exported graph is QEfficient's (the one a QAIC host compiles): attention over every cache
slot with a mask, RoPE and RMSNorm as plain ops, ``CtxScatter``/``CtxGather`` on the cache. ORT's
optimiser fuses none of it. This module writes a second graph for the same Hugging Face weights
that ORT runs with its own fused CPU kernels, used for the decode steps only:

* ``GroupQueryAttention`` (com.microsoft) with packed q/k/v, RoPE inside (``do_rotary``, cos/sin
  caches computed here from the model's ``inv_freq`` and ``attention_scaling``, so every static
  RoPE scaling the export supports is covered) and the KV cache shared in place: the session
  binds one buffer as ``past_*`` input and ``*_RetainedState`` output, as for the exported graph;
* ``SimplifiedLayerNormalization`` / ``SkipSimplifiedLayerNormalization`` for the RMSNorms and
  the residual adds; SiLU as ``x * Sigmoid(x)``.

The cache layout is the exported graph's ([rows, kv_heads, slots, head_dim]), so prefill runs on
the exported graph and decode on this one over the same arrays. Two differences:

* ORT's CPU kernel takes ``seq_len > 1`` with a past only at batch 1, so each batch row has its
  own GQA node and its own cache inputs (``past_key.{layer}.row{r}``), which the session binds to
  row views of the one cache array.
* GQA writes a step's ``seq_len`` keys at consecutive slots ``seqlens_k + 1 - seq_len ...
  seqlens_k``, derived here from ``position_ids``: a row's first position ``p`` gives
  ``seqlens_k = p + seq_len - 1`` (its padding, -1 at the end, is written after its last real
  token, where nothing valid lives), and a row of padding only (an idle row, a cost
  measurement) writes the last ``seq_len`` slots. So the cache gets ``max decode seq_len`` extra
  slots (:func:`kv_slots`) beyond ``ctx_len``: no write of a decode step can reach a slot a real
  token owns. Positions must be consecutive from a row's first; the session checks it.

Logits are those of the exported graph: ``num_logits_to_keep`` rows ending at the row's last
valid position. onnx and transformers are imported inside functions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from spdflow.errors import StageError

#: Bumped when the graph this module writes changes: part of the program's compile key.
FUSED_VERSION = 1
FUSED_WEIGHTS = "fused.onnx.data"
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
MS = "com.microsoft"
#: tensors this big or bigger go to the external data file
_EXTERNAL_BYTES = 1024


def row_input(kind: str, layer: int, row: int) -> str:
    """The cache input of one layer and batch row, e.g. ``past_key.3.row0``."""
    return f"past_{kind}.{layer}.row{row}"


def kv_slots(ctx_len: int, specializations) -> int:
    """Cache slots of a program with the fused graph: ctx_len plus the longest decode step."""
    longest = max((s.seq_len for s in specializations if s.kind == "decode"), default=1)
    return ctx_len + longest


def fused_problem(*, model_type: str, continuous_batching: bool, kv_dtype: str, execution_provider: str,
                  extra_outputs: list[str], head_dim: int) -> str | None:
    """Why the fused graph cannot serve this program (one sentence with what to do), or None."""
    fix = "or set devices.with.graph: reference"
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (f"the fused graph supports model types {', '.join(SUPPORTED_MODEL_TYPES)}, not "
                f"'{model_type}'; {fix}")
    if continuous_batching:
        return f"the fused graph does not support continuous batching (full_batch_size); {fix}"
    if kv_dtype != "float32":
        return f"the fused graph is built for float32 models only (this one is {kv_dtype}); {fix}"
    if execution_provider != "cpu":
        return f"the fused graph runs on the CPU execution provider only; {fix}"
    if extra_outputs:
        return (f"the fused graph returns logits only, but the target exports {', '.join(extra_outputs)} "
                f"for its proposer; {fix}")
    if head_dim % 16:
        return (f"ONNX Runtime's GroupQueryAttention needs a head_dim that is a multiple of 16 "
                f"(this model has {head_dim}); {fix}")
    return None


# ------------------------------------------------------------------------------- weights


class _Weights:
    """Initializers written one at a time into one external data file."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "wb")
        self.tensors: list = []

    def add(self, name: str, array: np.ndarray) -> str:
        from onnx import TensorProto, numpy_helper

        array = np.ascontiguousarray(array)
        if array.nbytes < _EXTERNAL_BYTES:
            self.tensors.append(numpy_helper.from_array(array, name))
            return name
        tensor = TensorProto(name=name, dims=list(array.shape),
                             data_type=numpy_helper.helper.np_dtype_to_tensor_dtype(array.dtype))
        offset = self.file.tell()
        self.file.write(memoryview(array).cast("B"))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", offset), ("length", array.nbytes)):
            tensor.external_data.add(key=key, value=str(value))
        self.tensors.append(tensor)
        return name

    def close(self) -> None:
        self.file.close()


def _np(tensor) -> np.ndarray:
    return tensor.detach().float().numpy()


class FusedModel:
    """The fused graph's weights (written once) and the facts its graphs need."""

    def __init__(self, hf_model, slots: int, weights_path: Path):
        config = hf_model.config
        inner = hf_model.model
        self.num_layers = int(config.num_hidden_layers)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.num_heads)
        self.hidden = int(config.hidden_size)
        self.vocab = int(config.vocab_size)
        self.slots = int(slots)
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise StageError(f"onnxruntime compile: the fused graph implements the SiLU MLP, not '{act}'; "
                             "set devices.with.graph: reference")
        attention = inner.layers[0].self_attn
        if hasattr(attention, "q_norm"):
            raise StageError("onnxruntime compile: the fused graph has no per-head q/k norm (Qwen3); "
                             "set devices.with.graph: reference")
        self.scale = float(attention.scaling)
        self.epsilon = [float(layer.input_layernorm.variance_epsilon) for layer in inner.layers]
        self.epsilon_post = [float(layer.post_attention_layernorm.variance_epsilon) for layer in inner.layers]
        self.epsilon_final = float(inner.norm.variance_epsilon)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self._write(hf_model, weights_path)

    def _write(self, hf_model, weights_path: Path) -> None:
        inner = hf_model.model
        w = _Weights(weights_path)
        try:
            w.add("embed", _np(inner.embed_tokens.weight))
            rotary = inner.rotary_emb
            inv_freq = rotary.inv_freq.detach().float().numpy()
            scaling = np.float32(getattr(rotary, "attention_scaling", 1.0))
            # As the exported graph computes them: angle in float32, cos/sin, times the scaling.
            angles = np.arange(self.slots, dtype=np.float32)[:, None] * inv_freq[None, :]
            w.add("cos_cache", (np.cos(angles.astype(np.float64)).astype(np.float32) * scaling))
            w.add("sin_cache", (np.sin(angles.astype(np.float64)).astype(np.float32) * scaling))
            self.biases: dict[str, bool] = {}
            for i, layer in enumerate(inner.layers):
                attn, mlp = layer.self_attn, layer.mlp
                w.add(f"l{i}.in_norm", _np(layer.input_layernorm.weight))
                w.add(f"l{i}.post_norm", _np(layer.post_attention_layernorm.weight))
                projections = (attn.q_proj, attn.k_proj, attn.v_proj)
                w.add(f"l{i}.qkv", np.concatenate([_np(p.weight).T for p in projections], axis=1))
                if attn.q_proj.bias is not None:
                    w.add(f"l{i}.qkv_bias", np.concatenate([_np(p.bias) for p in projections]))
                for name, linear in (("o", attn.o_proj), ("gate", mlp.gate_proj), ("up", mlp.up_proj),
                                     ("down", mlp.down_proj)):
                    w.add(f"l{i}.{name}", _np(linear.weight).T)
                    if linear.bias is not None:
                        w.add(f"l{i}.{name}_bias", _np(linear.bias))
            w.add("final_norm", _np(inner.norm.weight))
            if not self.tied:
                w.add("lm_head", _np(hf_model.lm_head.weight).T)
        finally:
            w.close()
        self.initializers = w.tensors
        self.names = {t.name for t in w.tensors}

    # -- graph ---------------------------------------------------------------------------

    def graph(self, batch: int):
        """The fused decode graph for ``batch`` rows (seq_len and num_logits_to_keep symbolic)."""
        from onnx import TensorProto, helper

        nodes: list = []
        consts: list = []

        def const(name, values, dtype=np.int64):
            consts.append(helper.make_tensor(name, _TENSOR[dtype], [len(values)] if isinstance(values, list) else [],
                                             values if isinstance(values, list) else [values]))
            return name

        def node(op, inputs, outputs, domain="", **attrs):
            nodes.append(helper.make_node(op, inputs, outputs, domain=domain, **attrs))
            return outputs[0]

        def linear(x, name, out):
            y = node("MatMul", [x, f"{name}"], [out if f"{name}_bias" not in self.names else out + "_mm"])
            if f"{name}_bias" in self.names:
                y = node("Add", [y, f"{name}_bias"], [out])
            return y

        # seqlens_k per row from position_ids (see the module docstring).
        const("zero", [0]), const("one", [1]), const("one_s", 1), const("last_slot", self.slots - 1)
        node("Shape", ["input_ids"], ["seq_len"], start=1, end=2)
        node("Slice", ["position_ids", "zero", "one", "one"], ["first_pos2"])
        node("Squeeze", ["first_pos2", "one"], ["first_pos"])
        node("GreaterOrEqual", ["first_pos", "zero"], ["has_tokens"])
        node("Add", ["first_pos", "seq_len"], ["end_pos"])
        node("Sub", ["end_pos", "one"], ["last_pos"])
        node("Where", ["has_tokens", "last_pos", "last_slot"], ["seqlens64"])
        node("Cast", ["seqlens64"], ["seqlens"], to=TensorProto.INT32)
        for r in range(batch):
            const(f"r{r}", [r]), const(f"r{r}_end", [r + 1])
            node("Slice", ["seqlens", f"r{r}", f"r{r}_end"], [f"seqlens.row{r}"])
            node("Add", [f"seqlens.row{r}", "one32"], [f"total1.row{r}"])
            node("Squeeze", [f"total1.row{r}", "zero"], [f"total.row{r}"])
        consts.append(helper.make_tensor("one32", TensorProto.INT32, [1], [1]))

        x = node("Gather", ["embed", "input_ids"], ["embedded"])
        residual = None
        outputs = []
        for i in range(self.num_layers):
            if residual is None:
                h = node("SimplifiedLayerNormalization", [x, f"l{i}.in_norm"], [f"l{i}.h"], axis=-1,
                         epsilon=self.epsilon[i])
                residual = x
            else:
                node("SkipSimplifiedLayerNormalization", [x, residual, f"l{i}.in_norm"],
                     [f"l{i}.h", "", "", f"l{i}.res"], domain=MS, epsilon=self.epsilon[i])
                h, residual = f"l{i}.h", f"l{i}.res"
            qkv = linear(h, f"l{i}.qkv", f"l{i}.qkv_out")
            rows = [qkv] if batch == 1 else [f"l{i}.qkv.row{r}" for r in range(batch)]
            if batch > 1:
                node("Split", [qkv], rows, axis=0)
            attended = []
            for r, row in enumerate(rows):
                past = [row_input("key", i, r), row_input("value", i, r)]
                node("GroupQueryAttention",
                     [row, "", "", *past, f"seqlens.row{r}", f"total.row{r}", "cos_cache", "sin_cache"],
                     [f"l{i}.attn.row{r}", *(f"{p}_RetainedState" for p in past)], domain=MS,
                     num_heads=self.num_heads, kv_num_heads=self.num_kv_heads, scale=self.scale,
                     do_rotary=1, rotary_interleaved=0)
                outputs += [f"{p}_RetainedState" for p in past]
                attended.append(f"l{i}.attn.row{r}")
            attn = attended[0] if batch == 1 else node("Concat", attended, [f"l{i}.attn"], axis=0)
            o = linear(attn, f"l{i}.o", f"l{i}.o_out")
            node("SkipSimplifiedLayerNormalization", [o, residual, f"l{i}.post_norm"],
                 [f"l{i}.h2", "", "", f"l{i}.res2"], domain=MS, epsilon=self.epsilon_post[i])
            residual = f"l{i}.res2"
            gate = linear(f"l{i}.h2", f"l{i}.gate", f"l{i}.gate_out")
            up = linear(f"l{i}.h2", f"l{i}.up", f"l{i}.up_out")
            node("Sigmoid", [gate], [f"l{i}.sig"])
            node("Mul", [gate, f"l{i}.sig"], [f"l{i}.silu"])
            node("Mul", [f"l{i}.silu", up], [f"l{i}.act"])
            x = linear(f"l{i}.act", f"l{i}.down", f"l{i}.mlp")
        node("SkipSimplifiedLayerNormalization", [x, residual, "final_norm"], ["final"], domain=MS,
             epsilon=self.epsilon_final)

        # num_logits_to_keep rows ending at each row's last valid position (as the export does).
        node("ArgMax", ["position_ids"], ["last_row"], axis=1, keepdims=1)
        node("Shape", ["num_logits_to_keep"], ["nlk"], start=0, end=1)
        node("Add", ["last_row", "one"], ["after_last"])
        node("Sub", ["after_last", "nlk"], ["lower_raw"])
        node("Max", ["lower_raw", "zero"], ["lower"])
        node("Squeeze", ["nlk", "zero"], ["nlk_s"])
        node("Range", ["zero_s", "nlk_s", "one_s"], ["offsets"])
        const("zero_s", 0)
        node("Add", ["lower", "offsets"], ["rows_raw"])
        node("Sub", ["seq_len", "one"], ["last_index"])
        node("Min", ["rows_raw", "last_index"], ["rows"])
        const("axis2", [2])
        node("Unsqueeze", ["rows", "axis2"], ["rows3"])
        const("hidden_dims", [1, 1, self.hidden])
        node("Shape", ["rows3"], ["rows3_shape"])
        node("Mul", ["rows3_shape", "hidden_dims"], ["kept_shape"])  # [b, nlk, hidden]
        node("Expand", ["rows3", "kept_shape"], ["index"])
        node("GatherElements", ["final", "index"], ["kept"], axis=1)
        if self.tied:
            const("flat", [-1, self.hidden])
            node("Reshape", ["kept", "flat"], ["kept2d"])
            node("Gemm", ["kept2d", "embed"], ["logits2d"], transB=1)
            const("vocab", [self.vocab])
            node("Shape", ["kept"], ["lead"], start=0, end=2)
            node("Concat", ["lead", "vocab"], ["logits_shape"], axis=0)
            node("Reshape", ["logits2d", "logits_shape"], ["logits"])
        else:
            node("MatMul", ["kept", "lm_head"], ["logits"])

        f32, i64 = TensorProto.FLOAT, TensorProto.INT64
        cache = [1, self.num_kv_heads, self.slots, self.head_dim]
        inputs = [helper.make_tensor_value_info("input_ids", i64, [batch, "seq_len"]),
                  helper.make_tensor_value_info("position_ids", i64, [batch, "seq_len"])]
        for i in range(self.num_layers):
            for r in range(batch):
                inputs += [helper.make_tensor_value_info(row_input(kind, i, r), f32, cache)
                           for kind in ("key", "value")]
        inputs.append(helper.make_tensor_value_info("num_logits_to_keep", i64, ["num_logits_to_keep", 1]))
        graph_outputs = [helper.make_tensor_value_info("logits", f32, [batch, "num_logits_to_keep", self.vocab])]
        graph_outputs += [helper.make_tensor_value_info(name, f32, cache) for name in outputs]
        graph = helper.make_graph(nodes, f"spdflow_fused_b{batch}", inputs, graph_outputs,
                                  initializer=list(self.initializers) + consts)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                                 producer_name="spdflow", ir_version=8)


_TENSOR = {np.int64: 7, np.int32: 6, np.float32: 1}


def load_source_model(source_dir: Path):
    """The HF model the export read (same directory, float32), for the fused graph's weights."""
    try:
        from spdflow_onnx.export import load_hf_model
    except ImportError as exc:  # torch / transformers missing
        raise StageError(f"onnxruntime compile: the fused graph reads the model's weights with transformers, "
                         f"which cannot be imported here ({exc}); install spdflow's export extras or set "
                         "devices.with.graph: reference") from exc
    return load_hf_model(Path(source_dir), "float32")
