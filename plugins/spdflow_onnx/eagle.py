"""Export an EAGLE draft layer (speculators.EagleDraft) to its own fixed-KV-cache ONNX program.

The graph follows the target's conventions (DESIGN §4): a KV cache of fixed ctx_len written at
``position_ids`` (-1 writes the reserved last slot), the mask derived from positions, and
``num_logits_to_keep`` rows kept ending at the last valid position. It reuses the target's
token embedding and LM head (read from the target's weights at export time; the EAGLE files
hold neither).

Inputs: ``input_ids`` [batch, seq_len] (token t+1), ``hidden_states`` [batch, seq_len, hidden]
(feature t), ``position_ids`` [batch, seq_len] (t), ``past_key.0``, ``past_value.0``,
``num_logits_to_keep`` [nlk, 1]. Outputs: ``logits`` [batch, nlk, vocab] (next-token guesses),
``hidden_states_out`` [batch, nlk, hidden] (the predicted features, fed back when drafting
further), ``past_key.0_RetainedState``, ``past_value.0_RetainedState``.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from spdflow_onnx.custom_ops import CUSTOM_OPSETS, add_functions, rms_norm
from spdflow_onnx.export import OPSET, KVCacheLM, load_hf_model
from spdflow_onnx.speculators import EagleDraft, load_eagle

INPUTS = ["input_ids", "hidden_states", "position_ids", "past_key.0", "past_value.0", "num_logits_to_keep"]
OUTPUTS = ["logits", "hidden_states_out", "past_key.0_RetainedState", "past_value.0_RetainedState"]


class EagleKV(KVCacheLM):
    """The EAGLE layer with an explicit KV cache, reusing KVCacheLM's attention and RoPE."""

    def __init__(self, target: nn.Module, draft: EagleDraft):
        shim = SimpleNamespace(
            config=draft.config, lm_head=target.lm_head,
            model=SimpleNamespace(embed_tokens=target.model.embed_tokens, layers=draft.layers,
                                  norm=nn.Identity(), rotary_emb=draft.rotary_emb))
        super().__init__(shim)
        self.fc = draft.fc

    def forward(self, input_ids, hidden_states, position_ids, past_key, past_value, num_logits_to_keep):
        hidden = self.fc(torch.cat([self.embed_tokens(input_ids), hidden_states], dim=-1))
        cos, sin = self._rope(position_ids, hidden.dtype)
        b, s = position_ids.shape
        comp_ctx_len = torch._shape_as_tensor(past_key)[2:3]
        ctx_indices = torch.arange(past_key.shape[2], dtype=torch.int64).view(1, 1, -1)
        mask = ctx_indices.view(1, 1, 1, 1, -1) <= position_ids.view(b, 1, 1, s, 1)
        layer = self.layers[0]  # no input norm (EAGLE-1's first layer)
        attn_out, key_cache, value_cache = self._attend(layer, hidden, cos, sin, past_key, past_value, mask,
                                                        position_ids, None, ctx_indices, comp_ctx_len)
        hidden = hidden + attn_out
        hidden = hidden + layer.mlp(rms_norm(layer.post_attention_layernorm, hidden))
        kept = self._keep_rows(hidden, position_ids, num_logits_to_keep)
        return self.lm_head(kept).float(), kept, key_cache, value_cache


def export_eagle(model_dir: Path, onnx_path: Path) -> dict:
    """Write the EAGLE program of ``model_dir`` to ``onnx_path`` (weights inline; a few MB).

    Returns the facts a runtime needs: hidden size, KV heads, head dim, vocab size.
    """
    target = load_hf_model(Path(model_dir))
    draft = load_eagle(Path(model_dir), target.config)
    wrapper = EagleKV(target, draft).eval()
    d = target.config.hidden_size
    batch, seq_len, ctx, nlk = 2, 3, 8, 2
    kv = torch.zeros(batch, wrapper.num_kv_heads, ctx, wrapper.head_dim)
    example = (torch.zeros(batch, seq_len, dtype=torch.int64), torch.zeros(batch, seq_len, d),
               torch.arange(seq_len).repeat(batch, 1), kv, kv.clone(), torch.zeros(nlk, 1, dtype=torch.int64))
    kv_axes = {0: "batch_size", 2: "ctx_len"}
    axes = {"input_ids": {0: "batch_size", 1: "seq_len"}, "hidden_states": {0: "batch_size", 1: "seq_len"},
            "position_ids": {0: "batch_size", 1: "seq_len"}, "num_logits_to_keep": {0: "num_logits_to_keep"},
            "logits": {0: "batch_size", 1: "num_logits_to_keep"},
            "hidden_states_out": {0: "batch_size", 1: "num_logits_to_keep"},
            "past_key.0": kv_axes, "past_value.0": kv_axes,
            "past_key.0_RetainedState": kv_axes, "past_value.0_RetainedState": kv_axes}
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, example, str(onnx_path), input_names=INPUTS, output_names=OUTPUTS,
                          dynamic_axes=axes, opset_version=OPSET, do_constant_folding=True,
                          custom_opsets=CUSTOM_OPSETS, dynamo=False)
    import onnx

    proto = onnx.load(str(onnx_path))
    add_functions(proto)  # the custom ops as ONNX functions, so ONNX Runtime runs them
    onnx.save_model(proto, str(onnx_path))
    return {"hidden_size": d, "num_kv_heads": wrapper.num_kv_heads, "head_dim": wrapper.head_dim,
            "vocab_size": int(target.config.vocab_size)}
