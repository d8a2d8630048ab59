"""Export an EAGLE draft layer (speculators.EagleDraft) to its own fixed-KV-cache ONNX program.

The graph follows the target's conventions (DESIGN §4): a KV cache of fixed ctx_len written at
``position_ids`` (-1 writes the reserved last slot), the mask derived from positions, and
``num_logits_to_keep`` rows kept ending at the last valid position; under continuous batching
the cache has ``full_batch_size`` rows addressed by ``batch_index``, and with compute context
lengths a step reads the first ``len(comp_ctx_lengths)`` slots. It reuses the target's token
embedding and LM head (read from the target's weights at export time; the EAGLE files hold
neither).

Inputs: ``input_ids`` [batch, seq_len] (token t+1), ``hidden_states`` [batch, seq_len, hidden]
(feature t), ``position_ids`` [batch, seq_len] (t), ``past_key.0``, ``past_value.0``,
[``comp_ctx_lengths``], [``batch_index``], ``num_logits_to_keep`` [nlk, 1]. Outputs:
``logits`` [batch, nlk, vocab] (next-token guesses), ``hidden_states_out`` [batch, nlk, hidden]
(the predicted features, fed back when drafting further), ``past_key.0_RetainedState``,
``past_value.0_RetainedState``.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from spdflow.api import ExportRequest, ExportResult
from spdflow.errors import StageError
from spdflow_onnx.custom_ops import CUSTOM_OPSETS, add_functions, rms_norm
from spdflow_onnx.export import OPSET, KVCacheLM, load_hf_model, model_info
from spdflow_onnx.speculators import EagleDraft, SpeculatorFilesError, load_eagle

OUTPUTS = ["logits", "hidden_states_out", "past_key.0_RetainedState", "past_value.0_RetainedState"]


def input_names(continuous_batching: bool = False, ccl: bool = False) -> list[str]:
    """The layer's graph inputs, in order (the optional ones where the target has them)."""
    names = ["input_ids", "hidden_states", "position_ids", "past_key.0", "past_value.0"]
    if ccl:
        names.append("comp_ctx_lengths")
    if continuous_batching:
        names.append("batch_index")
    return names + ["num_logits_to_keep"]


INPUTS = input_names()


class EagleKV(KVCacheLM):
    """The EAGLE layer with an explicit KV cache, reusing KVCacheLM's attention and RoPE."""

    def __init__(self, target: nn.Module, draft: EagleDraft, continuous_batching: bool = False, ccl: bool = False):
        shim = SimpleNamespace(
            config=draft.config, lm_head=target.lm_head,
            model=SimpleNamespace(embed_tokens=target.model.embed_tokens, layers=draft.layers,
                                  norm=nn.Identity(), rotary_emb=draft.rotary_emb))
        super().__init__(shim, continuous_batching=continuous_batching, ccl=ccl)
        self.fc = draft.fc

    def forward(self, input_ids, hidden_states, position_ids, past_key, past_value, *rest):
        comp_ctx_lengths = rest[0] if self.ccl else None
        batch_index = rest[int(self.ccl)] if self.continuous_batching else None
        num_logits_to_keep = rest[-1]
        hidden = self.fc(torch.cat([self.embed_tokens(input_ids), hidden_states.to(self.fc.weight.dtype)], dim=-1))
        cos, sin = self._rope(position_ids, hidden.dtype)
        b, s = position_ids.shape
        if comp_ctx_lengths is None:
            comp_ctx_len = torch._shape_as_tensor(past_key)[2:3]
            ctx_indices = torch.arange(past_key.shape[2], dtype=torch.int64).view(1, 1, -1)
        else:
            comp_ctx_len = torch._shape_as_tensor(comp_ctx_lengths)[0:1]
            ctx_indices = torch.arange(comp_ctx_lengths.shape[0], dtype=torch.int64).view(1, 1, -1)
        mask = ctx_indices.view(1, 1, 1, 1, -1) <= position_ids.view(b, 1, 1, s, 1)
        layer = self.layers[0]  # no input norm (EAGLE-1's first layer)
        attn_out, key_cache, value_cache = self._attend(layer, hidden, cos, sin, past_key, past_value, mask,
                                                        position_ids, batch_index, ctx_indices, comp_ctx_len)
        hidden = hidden + attn_out
        hidden = hidden + layer.mlp(rms_norm(layer.post_attention_layernorm, hidden))
        kept = self._keep_rows(hidden, position_ids, num_logits_to_keep)
        return self.lm_head(kept).float(), kept, key_cache, value_cache


def _axes(continuous_batching: bool, ccl: bool) -> dict[str, dict[int, str]]:
    kv_axes = {0: "full_batch_size" if continuous_batching else "batch_size", 2: "ctx_len"}
    axes = {"input_ids": {0: "batch_size", 1: "seq_len"}, "hidden_states": {0: "batch_size", 1: "seq_len"},
            "position_ids": {0: "batch_size", 1: "seq_len"}, "num_logits_to_keep": {0: "num_logits_to_keep"},
            "logits": {0: "batch_size", 1: "num_logits_to_keep"},
            "hidden_states_out": {0: "batch_size", 1: "num_logits_to_keep"},
            "past_key.0": kv_axes, "past_value.0": kv_axes,
            "past_key.0_RetainedState": kv_axes, "past_value.0_RetainedState": kv_axes}
    if continuous_batching:
        axes["batch_index"] = {0: "batch_size"}
    if ccl:
        axes["comp_ctx_lengths"] = {0: "comp_ctx_lengths"}
    return axes


def export_eagle(model_dir: Path, onnx_path: Path, *, dtype: str = "float32", continuous_batching: bool = False,
                 ccl: bool = False) -> dict:
    """Write the EAGLE program of ``model_dir`` to ``onnx_path`` (weights inline; a few MB).

    Returns the facts a runtime needs: hidden size, KV heads, head dim, vocab size.
    """
    target = load_hf_model(Path(model_dir), dtype)
    draft = load_eagle(Path(model_dir), target.config).to(getattr(torch, dtype))
    wrapper = EagleKV(target, draft, continuous_batching, ccl).eval()
    d = target.config.hidden_size
    batch, seq_len, ctx, nlk, ccl_len = 2, 3, 8, 2, 6
    kv_rows = 3 if continuous_batching else batch
    kv = torch.zeros(kv_rows, wrapper.num_kv_heads, ctx, wrapper.head_dim, dtype=getattr(torch, dtype))
    extra = [torch.zeros(ccl_len, dtype=torch.int64)] if ccl else []
    extra += [torch.tensor([[2], [0]], dtype=torch.int64)] if continuous_batching else []
    example = (torch.zeros(batch, seq_len, dtype=torch.int64), torch.zeros(batch, seq_len, d),
               torch.arange(seq_len).repeat(batch, 1), kv, kv.clone(), *extra, torch.zeros(nlk, 1, dtype=torch.int64))
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, example, str(onnx_path), input_names=input_names(continuous_batching, ccl),
                          output_names=OUTPUTS, dynamic_axes=_axes(continuous_batching, ccl), opset_version=OPSET,
                          do_constant_folding=True, custom_opsets=CUSTOM_OPSETS, dynamo=False)
    import onnx

    proto = onnx.load(str(onnx_path))
    for value in proto.graph.output:  # the tracer leaves the gathered rows' width symbolic
        if value.name == "hidden_states_out":
            value.type.tensor_type.shape.dim[2].dim_value = d
    add_functions(proto)  # the custom ops as ONNX functions, so ONNX Runtime runs them
    onnx.save_model(proto, str(onnx_path))
    return {"hidden_size": d, "num_kv_heads": wrapper.num_kv_heads, "head_dim": wrapper.head_dim,
            "vocab_size": int(target.config.vocab_size)}


def export_eagle_layer(request: ExportRequest) -> ExportResult:
    """The export stage for ``ExportRequest.graph == "eagle_layer"``: the EAGLE layer of the
    model directory as its own program (``model.onnx``, weights inline) and its ModelInfo (one
    KV layer; the target's vocabulary, EOS and tokenizer)."""
    work = Path(request.work_dir)
    request.progress(f"exporting the EAGLE layer of {request.model_dir}")
    try:
        facts = export_eagle(Path(request.model_dir), work / "model.onnx", dtype=request.model.dtype,
                             continuous_batching=request.continuous_batching, ccl=bool(request.ccl))
    except SpeculatorFilesError as exc:
        raise StageError(f"export: {exc}; the proposer asked for the EAGLE layer",
                         hint="train a layer with tools/train_heads.py or pick another proposer") from exc
    target = load_hf_model(Path(request.model_dir), "float32")
    base = model_info(target, request)
    import dataclasses

    info = dataclasses.replace(base, name=f"{base.name} (EAGLE layer)", model_type="eagle", num_layers=1,
                               num_kv_heads=facts["num_kv_heads"], head_dim=facts["head_dim"])
    (work / "model_info.json").write_text(json.dumps(info.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return ExportResult(onnx_path=work / "model.onnx", model_info=info,
                        files=[work / "model.onnx", work / "model_info.json"])
