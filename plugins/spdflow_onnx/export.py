"""Export a Hugging Face causal LM to the fixed-KV-cache ONNX of DESIGN §4.

HF classes are not patched: :class:`KVCacheLM` reuses the HF submodules (embeddings, each
layer's projections, norms and MLP, the final norm, lm_head, the rotary inv_freq) and
reimplements only the decoder loop, with

* new K/V written into the fixed-size cache at ``position_ids`` and read back through
  QEfficient's ``CtxScatter``/``CtxGather`` ONNX functions (``…CB`` on the rows
  ``batch_index`` names under continuous batching), so one graph serves every seq_len, stale
  slots need no cleanup and the QAIC compiler sees the ops it is tuned for (custom_ops.py);
* every RMSNorm as ``CustomRMSNorm`` (same module);
* the attention mask derived from ``position_ids`` (key slot > query position is masked), so a
  padding position of -1 masks its whole row and writes only slot ctx_len-1, which no valid
  query ever sees;
* hidden states gathered to ``num_logits_to_keep`` rows ending at the last valid position
  before ``lm_head``;
* with compute context lengths (``ccl``), an input ``comp_ctx_lengths`` whose length is the
  number of cache slots the gathers read (the first ones) and the mask covers, as QEfficient's
  CCL graphs take it; the scatter still writes the whole cache. Without, the graph reads all
  ctx_len slots and is exactly the default export.

torch and transformers are imported here only; the plugin's ``__init__`` imports this module
lazily so ``spdflow lint`` never loads them.
"""
from __future__ import annotations

import contextlib
import gc
import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from spdflow.api import ExportRequest, ExportResult, ModelInfo
from spdflow.errors import StageError
from spdflow_onnx.custom_ops import (
    CUSTOM_OPSETS,
    CtxGather,
    CtxGatherCB,
    CtxScatter,
    CtxScatterCB,
    add_functions,
    rms_norm,
)
from spdflow_onnx.speculators import SpeculatorFilesError, load_projections, project_hidden_states

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
OPSET = 17
ONNX_NAME = "model.onnx"
#: Extra target outputs a proposer may ask for (ExportRequest.outputs); none by default.
TARGET_OUTPUTS = ("head_logits", "hidden_states")
DATA_NAME = "model.onnx.data"
#: tensors this big or bigger (as onnx.save_model measures them) go to the external data file
SIZE_THRESHOLD = 1024


class KVCacheLM(nn.Module):
    """A causal LM with an explicit fixed-size KV cache, built on an HF model's submodules.

    ``forward(input_ids, position_ids, *past, [comp_ctx_lengths,] [batch_index,]
    num_logits_to_keep)`` returns ``(logits, *retained)`` where ``past``/``retained`` alternate
    key, value per layer.
    """

    def __init__(self, hf_model: nn.Module, continuous_batching: bool = False,
                 projections: nn.ModuleList | None = None, hidden_output: bool = False, ccl: bool = False):
        super().__init__()
        #: take ``comp_ctx_lengths``: attend over its length of cache slots instead of all
        self.ccl = ccl
        #: multi-projection heads: logits become [b, nlk, heads+1, vocab] (row 0 the LM head)
        self.projections = projections
        #: also return ``hidden_states`` [b, seq_len, hidden]: the final-norm output of every row
        self.hidden_output = hidden_output
        config = hf_model.config
        inner = hf_model.model
        self.embed_tokens = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.lm_head = hf_model.lm_head
        self.continuous_batching = continuous_batching
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        rotary = inner.rotary_emb
        # inv_freq and attention_scaling already include any static rope scaling (llama3, yarn).
        self.register_buffer("inv_freq", rotary.inv_freq.detach().clone().float(), persistent=False)
        self.rope_scaling = float(getattr(rotary, "attention_scaling", 1.0))

    # -- pieces ------------------------------------------------------------------------------

    def _rope(self, position_ids: torch.Tensor, dtype: torch.dtype):
        """cos/sin [b, 1, s, head_dim] for the given positions, computed inside the graph."""
        freqs = position_ids.unsqueeze(-1).float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scaling).to(dtype).unsqueeze(1)
        sin = (emb.sin() * self.rope_scaling).to(dtype).unsqueeze(1)
        return cos, sin

    @staticmethod
    def _rotate(x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @staticmethod
    def _write(cache, new, position_ids, batch_index):
        """The cache with ``new`` [b, kv, s, d] written at ``position_ids`` (rows ``batch_index``).

        Slot -1 (padding) is slot ctx_len-1, never visible to a valid query.
        """
        if batch_index is None:
            return CtxScatter.apply(cache, position_ids, new)
        return CtxScatterCB.apply(cache, batch_index, position_ids, new)

    @staticmethod
    def _read(cache, ctx_indices, comp_ctx_len, batch_index):
        """Slots ``ctx_indices`` [1, 1, comp_ctx_len] of the cache rows the step attends to."""
        if batch_index is None:
            return CtxGather.apply(cache, ctx_indices, comp_ctx_len)
        return CtxGatherCB.apply(cache, batch_index, ctx_indices, comp_ctx_len)

    def _attend(self, layer, hidden, cos, sin, key_cache, value_cache, mask, position_ids, batch_index,
                ctx_indices, comp_ctx_len):
        """One self-attention block; returns (output, new key cache, new value cache)."""
        attn = layer.self_attn
        b, s, _ = hidden.shape
        q = attn.q_proj(hidden).view(b, s, self.num_heads, self.head_dim)
        k = attn.k_proj(hidden).view(b, s, self.num_kv_heads, self.head_dim)
        v = attn.v_proj(hidden).view(b, s, self.num_kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm per head before RoPE
            q, k = rms_norm(attn.q_norm, q), rms_norm(attn.k_norm, k)
        q = self._rotate(q.transpose(1, 2), cos, sin)
        k = self._rotate(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)

        key_cache = self._write(key_cache, k, position_ids, batch_index)
        value_cache = self._write(value_cache, v, position_ids, batch_index)
        keys = self._read(key_cache, ctx_indices, comp_ctx_len, batch_index)
        values = self._read(value_cache, ctx_indices, comp_ctx_len, batch_index)

        # GQA by grouping queries per KV head: broadcasting matmul, no copy of the whole cache.
        groups = self.num_heads // self.num_kv_heads
        qg = q.reshape(b, self.num_kv_heads, groups * s, self.head_dim)
        scores = torch.matmul(qg, keys.transpose(2, 3)) * attn.scaling
        scores = scores.view(b, self.num_kv_heads, groups, s, -1)
        # finfo.min rather than -inf: an all-masked padding row gives a uniform softmax, not NaN.
        scores = torch.where(mask, scores.float(), torch.finfo(torch.float32).min)
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        out = torch.matmul(probs.view(b, self.num_kv_heads, groups * s, -1), values)
        out = out.view(b, self.num_heads, s, self.head_dim).transpose(1, 2).reshape(b, s, -1)
        return attn.o_proj(out), key_cache, value_cache

    def _keep_rows(self, hidden, position_ids, num_logits_to_keep):
        """``num_logits_to_keep`` consecutive hidden rows ending at the last valid position."""
        b, s, h = hidden.shape
        nlk = num_logits_to_keep.shape[0]
        last = torch.argmax(position_ids, dim=1, keepdim=True)  # [b, 1]
        lower = torch.clamp(last + 1 - nlk, min=0)
        rows = lower + torch.arange(nlk, dtype=torch.int64).view(1, -1)
        rows = torch.clamp(rows, max=s - 1)
        return torch.gather(hidden, 1, rows.unsqueeze(-1).expand(b, nlk, h))

    # -- forward -----------------------------------------------------------------------------

    def forward(self, input_ids, position_ids, *rest):
        n = 2 * self.num_layers
        past = rest[:n]
        comp_ctx_lengths = rest[n] if self.ccl else None
        batch_index = rest[n + int(self.ccl)] if self.continuous_batching else None
        num_logits_to_keep = rest[-1]

        hidden = self.embed_tokens(input_ids)
        cos, sin = self._rope(position_ids, hidden.dtype)
        # The compute context length: how many cache slots a step reads (all of them without CCL).
        if comp_ctx_lengths is None:
            comp_ctx_len = torch._shape_as_tensor(past[0])[2:3]
            ctx_indices = torch.arange(past[0].shape[2], dtype=torch.int64).view(1, 1, -1)
        else:
            comp_ctx_len = torch._shape_as_tensor(comp_ctx_lengths)[0:1]
            ctx_indices = torch.arange(comp_ctx_lengths.shape[0], dtype=torch.int64).view(1, 1, -1)
        b, s = position_ids.shape
        mask = ctx_indices.view(1, 1, 1, 1, -1) <= position_ids.view(b, 1, 1, s, 1)

        retained = []
        for i, layer in enumerate(self.layers):
            residual = hidden
            attn_out, key_cache, value_cache = self._attend(
                layer, rms_norm(layer.input_layernorm, hidden), cos, sin,
                past[2 * i], past[2 * i + 1], mask, position_ids, batch_index,
                ctx_indices, comp_ctx_len,
            )
            hidden = residual + attn_out
            hidden = hidden + layer.mlp(rms_norm(layer.post_attention_layernorm, hidden))
            retained += [key_cache, value_cache]

        final = rms_norm(self.norm, hidden)
        hidden = self._keep_rows(final, position_ids, num_logits_to_keep)
        if self.projections is not None:
            hidden = project_hidden_states(hidden, self.projections)
        logits = self.lm_head(hidden).float()
        return (logits, *retained, final) if self.hidden_output else (logits, *retained)


# ------------------------------------------------------------------------------- names


def input_names(num_layers: int, continuous_batching: bool, ccl: bool = False) -> list[str]:
    """The graph inputs of DESIGN §4, in order (``comp_ctx_lengths`` where QEfficient puts it)."""
    names = ["input_ids", "position_ids"]
    for i in range(num_layers):
        names += [f"past_key.{i}", f"past_value.{i}"]
    if ccl:
        names.append("comp_ctx_lengths")
    if continuous_batching:
        names.append("batch_index")
    names.append("num_logits_to_keep")
    return names


def output_names(num_layers: int, hidden_output: bool = False) -> list[str]:
    """The graph outputs of DESIGN §4, in order; ``hidden_states`` last when asked for."""
    names = ["logits"]
    for i in range(num_layers):
        names += [f"past_key.{i}_RetainedState", f"past_value.{i}_RetainedState"]
    return names + ["hidden_states"] if hidden_output else names


def dynamic_axes(num_layers: int, continuous_batching: bool, hidden_output: bool = False,
                 ccl: bool = False) -> dict[str, dict[int, str]]:
    """Axis symbols per IO; exactly the names specializations.json binds."""
    kv_rows = "full_batch_size" if continuous_batching else "batch_size"
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch_size", 1: "seq_len"},
        "position_ids": {0: "batch_size", 1: "seq_len"},
        "num_logits_to_keep": {0: "num_logits_to_keep"},
        "logits": {0: "batch_size", 1: "num_logits_to_keep"},
    }
    if continuous_batching:
        axes["batch_index"] = {0: "batch_size"}
    if ccl:
        axes["comp_ctx_lengths"] = {0: "comp_ctx_lengths"}
    if hidden_output:
        axes["hidden_states"] = {0: "batch_size", 1: "seq_len"}
    for i in range(num_layers):
        for kind in ("key", "value"):
            axes[f"past_{kind}.{i}"] = {0: kv_rows, 2: "ctx_len"}
            axes[f"past_{kind}.{i}_RetainedState"] = {0: kv_rows, 2: "ctx_len"}
    return axes


# ------------------------------------------------------------------------------- export


def _check_model_dir(model_dir: Path) -> None:
    if not (model_dir / "config.json").is_file():
        raise StageError(
            f"export: {model_dir} has no config.json; point model.id at a Hugging Face model directory"
        )
    weights = list(model_dir.glob("*.safetensors")) + list(model_dir.glob("*.bin"))
    if not weights:
        raise StageError(
            f"export: {model_dir} has no weights (*.safetensors or *.bin); download or save the model there first"
        )


def load_hf_model(model_dir: Path, dtype: str = "float32"):
    """The HF causal LM in ``model_dir`` in eval mode, loaded offline in ``dtype``."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    _check_model_dir(model_dir)
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, dtype=getattr(torch, dtype)
        )
    except Exception as exc:
        raise StageError(
            f"export: cannot load the model in {model_dir} ({type(exc).__name__}: {exc}); "
            "check that its config and weights are complete"
        ) from exc
    model_type = model.config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise StageError(
            f"export: model type '{model_type}' in {model_dir} is not supported; "
            f"use one of {', '.join(SUPPORTED_MODEL_TYPES)} or install an export plugin for it"
        )
    _check_supported_attention(model.config, model_dir)
    return model.eval()


def _check_supported_attention(config, model_dir: Path) -> None:
    """Refuse configs whose attention the wrapper would silently get wrong."""
    window = getattr(config, "sliding_window", None)
    # Qwen2/Qwen3 apply the window only with use_sliding_window; Mistral whenever it is set. A
    # window as long as the model's context never masks anything.
    applies = getattr(config, "use_sliding_window", config.model_type == "mistral")
    if applies and window and window < getattr(config, "max_position_embeddings", window + 1):
        raise StageError(
            f"export: {model_dir} uses sliding-window attention (window {window}), which this exporter does not "
            "implement; if ctx_len never exceeds the window, set sliding_window to null in its config.json "
            "(use_sliding_window to false for Qwen), else use another model"
        )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type in ("dynamic", "longrope"):
        # These rescale RoPE from the sequence length at run time; a fixed graph cannot.
        raise StageError(
            f"export: {model_dir} uses '{rope_type}' RoPE scaling, which depends on the sequence "
            "length at run time; use a model with static RoPE (default, linear, llama3, yarn)"
        )


def _example_inputs(wrapper: KVCacheLM, dtype: torch.dtype, continuous_batching: bool):
    """Inputs for tracing; seq_len and batch >= 2 so no axis is specialized to 1, and a
    compute context length unlike every other size."""
    batch, seq_len, ctx, nlk, ccl = 2, 3, 8, 2, 6
    kv_rows = 3 if continuous_batching else batch
    ids = torch.zeros(batch, seq_len, dtype=torch.int64)
    pos = torch.arange(seq_len, dtype=torch.int64).repeat(batch, 1)
    shape = (kv_rows, wrapper.num_kv_heads, ctx, wrapper.head_dim)
    past = [torch.zeros(shape, dtype=dtype) for _ in range(2 * wrapper.num_layers)]
    extra = [torch.zeros(ccl, dtype=torch.int64)] if wrapper.ccl else []
    extra += [torch.tensor([[2], [0]], dtype=torch.int64)] if continuous_batching else []
    return (ids, pos, *past, *extra, torch.zeros(nlk, 1, dtype=torch.int64))


def model_info(model, request: ExportRequest) -> ModelInfo:
    """The engine-facing facts of an HF model: sizes, eos/pad ids, tokenizer file."""
    config = model.config
    eos = None
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        eos = generation.eos_token_id
    if eos is None:
        eos = config.eos_token_id
    eos_ids = tuple(int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos]) if t is not None)
    pad = getattr(config, "pad_token_id", None)
    if pad is None and generation is not None:
        pad = generation.pad_token_id
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    tokenizer = request.model_dir / "tokenizer.json"
    heads = config.num_attention_heads
    return ModelInfo(
        name=request.model.id,
        model_type=config.model_type,
        vocab_size=int(config.vocab_size),
        num_layers=int(config.num_hidden_layers),
        num_kv_heads=int(config.num_key_value_heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        eos_token_ids=eos_ids,
        pad_token_id=int(pad),
        source_dir=request.model_dir,
        tokenizer_file=tokenizer if tokenizer.is_file() else None,
    )


def export_model(request: ExportRequest) -> ExportResult:
    """Export ``request.model_dir`` to ``request.work_dir/model.onnx`` (+ one external data file)."""
    request.progress(f"loading {request.model_dir}")
    model = load_hf_model(Path(request.model_dir), request.model.dtype)
    outputs = set(request.outputs)
    unknown = outputs - set(TARGET_OUTPUTS)
    if unknown:
        raise StageError(f"export: unknown extra output(s) {sorted(unknown)}; known: {', '.join(TARGET_OUTPUTS)}")
    projections = _projections(model, request.model_dir) if "head_logits" in outputs else None
    hidden_output = "hidden_states" in outputs
    ccl = bool(getattr(request, "ccl", False))
    wrapper = KVCacheLM(model, request.continuous_batching, projections, hidden_output, ccl).eval()
    n_layers = wrapper.num_layers
    dtype = next(model.parameters()).dtype
    work = Path(request.work_dir)
    raw_dir = work / "_trace"
    raw_dir.mkdir(parents=True, exist_ok=True)
    raw = raw_dir / ONNX_NAME

    request.progress(f"tracing {model.config.model_type} ({n_layers} layers) to ONNX opset {OPSET}")
    info = model_info(model, request)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    trace_args = dict(
        example=_example_inputs(wrapper, dtype, request.continuous_batching),
        input_names=input_names(n_layers, request.continuous_batching, ccl),
        output_names=output_names(n_layers, hidden_output),
        dynamic_axes=dynamic_axes(n_layers, request.continuous_batching, hidden_output, ccl),
    )
    onnx_path = work / ONNX_NAME
    traced = trace_without_weights(wrapper, raw, **trace_args)
    del model, projections
    if traced is not None:
        proto, weights = traced
        del wrapper
        request.progress("writing weights one tensor at a time into one external data file")
        write_model(proto, weights, onnx_path, tied)
        del proto, weights
    else:
        request.progress("this torch's exporter keeps the weights in its proto: exporting them with the graph "
                         "(about three weight copies in memory)")
        trace_with_weights(wrapper, raw, **trace_args)
        del wrapper
        gc.collect()
        save_traced(raw, onnx_path, tied)
    shutil.rmtree(raw_dir)
    (work / "model_info.json").write_text(
        json.dumps(info.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    request.progress(f"exported {onnx_path.name}")
    return ExportResult(
        onnx_path=onnx_path,
        model_info=info,
        files=[onnx_path, work / DATA_NAME, work / "model_info.json"],
    )


# ------------------------------------------------------------------------------- tracing and writing
#
# torch.onnx.export with export_params=True serializes every weight into its proto and keeps the
# torch model, the folded (transposed) weights and that proto alive at once: about three weight
# copies. So the graph is traced with export_params=False, the exporter's own initializer dict
# (names, and the constant-folded tensors, which are views of the model's weights) is taken as
# it hands it to the serializer, and the initializers are written one at a time into the
# external data file: the process holds one copy of the weights. The result is the same
# model.onnx and model.onnx.data, byte for byte, as exporting the weights with the graph and
# saving through onnx.save_model (tests/plugins/test_export.py compares them).

#: torch._C passes the capture wraps (private; if a torch lacks them the export keeps the weights in)
_DEDUPLICATE = "_jit_pass_onnx_deduplicate_initializers"
_SHAPE_INFERENCE = "_jit_pass_onnx_graph_shape_type_inference"


def _export_kwargs(input_names, output_names, dynamic_axes) -> dict:
    return dict(input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes,
                opset_version=OPSET, do_constant_folding=True, custom_opsets=CUSTOM_OPSETS, dynamo=False)


def trace_with_weights(wrapper, raw: Path, *, example, input_names, output_names, dynamic_axes) -> None:
    """The plain export: the weights inside the traced proto at ``raw``."""
    with torch.no_grad(), warnings.catch_warnings():
        # The legacy exporter's DeprecationWarning and TracerWarnings are expected here.
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, example, str(raw), **_export_kwargs(input_names, output_names, dynamic_axes))


@contextlib.contextmanager
def _initializers_captured():
    """While exporting, record the exporter's final initializer dict and keep float weights out of
    its whole-graph shape inference (which copies every initializer it is given into ONNX
    tensors; weights never decide a shape: their types are already on the graph inputs).

    Yields the dict that fills in when the exporter deduplicates its initializers (its last step
    before serializing), or None when this torch lacks the passes."""
    passes = torch._C
    if not (hasattr(passes, _DEDUPLICATE) and hasattr(passes, _SHAPE_INFERENCE)):
        yield None
        return
    deduplicate, infer = getattr(passes, _DEDUPLICATE), getattr(passes, _SHAPE_INFERENCE)
    captured: dict = {}

    def record(graph, params, *rest):
        result = deduplicate(graph, params, *rest)
        captured.clear()
        captured.update(result)
        return result

    def infer_without_weights(graph, params, *rest):
        return infer(graph, {k: v for k, v in params.items() if not v.is_floating_point()}, *rest)

    setattr(passes, _DEDUPLICATE, record)
    setattr(passes, _SHAPE_INFERENCE, infer_without_weights)
    try:
        yield captured
    finally:
        setattr(passes, _DEDUPLICATE, deduplicate)
        setattr(passes, _SHAPE_INFERENCE, infer)


def trace_without_weights(wrapper, raw: Path, *, example, input_names, output_names, dynamic_axes):
    """Trace ``wrapper`` to ``raw`` with no weights in the proto.

    Returns ``(proto, weights)``: the graph with every initializer declared (name, type, shape,
    in the exporter's order) but holding no data, and ``{name: tensor}`` for their values. None
    when this torch's exporter cannot be followed that way (the caller then exports with weights).
    """
    import onnx

    with torch.no_grad(), warnings.catch_warnings(), _initializers_captured() as captured:
        warnings.simplefilter("ignore")
        if captured is None:
            return None
        torch.onnx.export(wrapper, example, str(raw), export_params=False,
                          **_export_kwargs(input_names, output_names, dynamic_axes))
    proto = onnx.load(str(raw))
    graph = proto.graph
    declared = {v.name: v for v in graph.input}
    weights = {name: tensor.detach() for name, tensor in captured.items()}
    if not weights or graph.initializer or any(
            name not in declared or _onnx_dtype(t) is None for name, t in weights.items()):
        return None
    # export_params=True writes the initializers in graph-input order after the real inputs.
    kept = [v for v in graph.input if v.name not in weights]
    order = [v.name for v in graph.input if v.name in weights]
    del graph.input[:]
    graph.input.extend(kept)
    for name in order:
        tensor = weights[name]
        graph.initializer.add(name=name, dims=list(tensor.shape), data_type=_onnx_dtype(tensor))
    return proto, weights


_ONNX_DTYPES = {
    torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6, torch.int64: 7,
    torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16,
}


def _onnx_dtype(tensor) -> int | None:
    return _ONNX_DTYPES.get(tensor.dtype)


def _as_numpy(tensor) -> np.ndarray:
    """A numpy array of ``tensor`` sharing its memory where numpy can (bfloat16 as raw uint16)."""
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy()


def _raw_bytes(tensor) -> memoryview:
    """``tensor``'s bytes in row-major order (one copy of one tensor when it is a transposed view)."""
    return memoryview(np.ascontiguousarray(_as_numpy(tensor))).cast("B")


def write_model(proto, weights: dict, onnx_path: Path, tied: bool) -> None:
    """Write ``proto`` (initializers declared, values in ``weights``) as ``onnx_path`` plus one
    external data file, one tensor at a time, laid out exactly as ``onnx.save_model`` lays out
    the same model with its data inline (:func:`save_traced`)."""
    import onnx
    from onnx import numpy_helper

    def value(name: str) -> np.ndarray:
        return _as_numpy(weights[name]) if name in weights else numpy_helper.to_array(inits[name])

    inits = {t.name: t for t in proto.graph.initializer}
    if tied:
        share_tied_embedding(proto, value)
    add_functions(proto)
    empty = sys.getsizeof(b"")  # onnx.save_model compares sys.getsizeof(raw_data) with the threshold
    with open(onnx_path.parent / DATA_NAME, "wb") as data:
        for tensor in proto.graph.initializer:
            if tensor.HasField("raw_data"):
                raw = memoryview(tensor.raw_data)
            else:
                raw = _raw_bytes(weights.pop(tensor.name))
            if empty + raw.nbytes < SIZE_THRESHOLD:
                tensor.raw_data = bytes(raw)
                continue
            offset = data.tell()
            data.write(raw)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, entry in (("location", DATA_NAME), ("offset", offset), ("length", raw.nbytes)):
                tensor.external_data.add(key=key, value=str(entry))
            del raw
    onnx.save_model(proto, str(onnx_path))


def save_traced(raw: Path, onnx_path: Path, tied: bool) -> None:
    """Load a proto traced with its weights and save it as ``onnx_path`` + one external data file."""
    import onnx

    proto = onnx.load(str(raw))
    if tied:
        share_tied_embedding(proto)
    add_functions(proto)
    onnx.save_model(proto, str(onnx_path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=DATA_NAME, size_threshold=SIZE_THRESHOLD)


def _projections(model, model_dir: Path) -> nn.ModuleList:
    """The multi-projection heads of ``model_dir`` in the model's dtype (StageError if absent)."""
    try:
        heads = load_projections(Path(model_dir), model.config.hidden_size)
    except SpeculatorFilesError as exc:
        raise StageError(f"export: {exc}; the proposer asked for multi-projection logits",
                         hint="train heads with tools/train_heads.py or pick another proposer") from exc
    return heads.to(next(model.parameters()).dtype)


# ------------------------------------------------------------------------------- tied embeddings


def share_tied_embedding(proto, value=None) -> list[str]:
    """Store a tied embedding once: every ``MatMul(x, W)`` whose initializer W is exactly the
    transpose of another initializer E (the tracer folds ``lm_head.weight.T`` into a copy of the
    embedding) becomes ``Gemm(x as 2-D, E, transB=1)`` reshaped back, and W is dropped.

    Returns the names of the dropped initializers. Exact equality is checked, so an untied head
    that happens to have the transposed shape is never touched. ``value(name)`` gives an
    initializer's array (default: its data in the proto).
    """
    from onnx import helper, numpy_helper

    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    if value is None:
        def value(name):
            return numpy_helper.to_array(inits[name])
    by_shape: dict[tuple, list[str]] = {}
    for t in graph.initializer:
        if len(t.dims) == 2:
            by_shape.setdefault(tuple(t.dims), []).append(t.name)
    dropped: list[str] = []
    new_nodes = []
    extra_inits = []
    for node in graph.node:
        weight = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else None
        source = None
        if weight in inits and len(inits[weight].dims) == 2:
            rows, cols = inits[weight].dims
            candidates = [n for n in by_shape.get((cols, rows), []) if n != weight]
            if candidates:
                w = value(weight)
                source = next((n for n in candidates if np.array_equal(value(n).T, w)), None)
        if source is None:
            new_nodes.append(node)
            continue
        hidden, vocab = inits[weight].dims
        base = f"{node.name or weight}_tied"
        consts = {
            f"{base}_flat": np.array([-1, hidden], dtype=np.int64),
            f"{base}_start": np.array([0], dtype=np.int64),
            f"{base}_end": np.array([-1], dtype=np.int64),
            f"{base}_vocab": np.array([vocab], dtype=np.int64),
        }
        extra_inits += [numpy_helper.from_array(v, k) for k, v in consts.items()]
        x, y = node.input[0], node.output[0]
        new_nodes += [
            helper.make_node("Shape", [x], [f"{base}_shape"], name=f"{base}/Shape"),
            helper.make_node("Slice", [f"{base}_shape", f"{base}_start", f"{base}_end"], [f"{base}_lead"],
                             name=f"{base}/Slice"),
            helper.make_node("Reshape", [x, f"{base}_flat"], [f"{base}_x2d"], name=f"{base}/Flatten"),
            helper.make_node("Gemm", [f"{base}_x2d", source], [f"{base}_y2d"], name=f"{base}/Gemm", transB=1),
            helper.make_node("Concat", [f"{base}_lead", f"{base}_vocab"], [f"{base}_yshape"], name=f"{base}/Concat",
                             axis=0),
            helper.make_node("Reshape", [f"{base}_y2d", f"{base}_yshape"], [y], name=f"{base}/Unflatten"),
        ]
        dropped.append(weight)
    if dropped:
        still_used = {i for n in new_nodes for i in n.input}
        gone = [t for t in graph.initializer if t.name in dropped and t.name not in still_used]
        for t in gone:
            graph.initializer.remove(t)
        del graph.node[:]
        graph.node.extend(new_nodes)
        graph.initializer.extend(extra_inits)
    return dropped
