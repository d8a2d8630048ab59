"""Write a float GGUF file from a Hugging Face Llama-family directory, for the llama.cpp peer.

llama.cpp reads GGUF only; the peer must run the *same* weights spdflow runs, so this writes
the HF directory's tensors unchanged in value (f32 or f16) under llama.cpp's names, with the
model's hyper-parameters and its byte-level BPE vocabulary. Only the Llama layout is written
(``LlamaForCausalLM`` and ``MistralForCausalLM`` without a sliding window); anything else is
refused with one sentence. llama.cpp applies RoPE to interleaved pairs where HF rotates halves,
so the q and k projections are permuted the way llama.cpp's own converter does.

Uses the ``gguf`` package (``pip install gguf``, in the ``llamacpp`` extra).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM")


class GGUFExportError(ValueError):
    """The directory cannot be written as a llama.cpp GGUF (one sentence why)."""


def _permute_rope(weight: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half q/k rows → llama.cpp's interleaved pairs, per head."""
    rows = weight.shape[0]
    return (weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _check(config: dict, model_dir: Path) -> None:
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED:
        raise GGUFExportError(f"the llama.cpp peer writes GGUF for {', '.join(SUPPORTED)} only; "
                              f"'{model_dir}' is {arch}")
    if config.get("sliding_window"):
        raise GGUFExportError(f"'{model_dir}' uses a sliding attention window, which the llama.cpp peer's GGUF "
                              "writer does not carry over")
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind != "default":
        raise GGUFExportError(f"'{model_dir}' uses RoPE scaling '{kind}', which the llama.cpp peer's GGUF writer "
                              "does not carry over")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise GGUFExportError(f"'{model_dir}' has attention or MLP biases, which the Llama GGUF layout has no "
                              "place for")


def _rope_theta(config: dict) -> float:
    rope = config.get("rope_parameters") or {}
    return float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))


def _vocabulary(model_dir: Path, vocab_size: int):
    """(tokens, token types, merges) of a byte-level BPE tokenizer.json, padded to vocab_size."""
    import gguf

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise GGUFExportError(f"'{model_dir}' has no tokenizer.json; the llama.cpp peer needs its vocabulary")
    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise GGUFExportError(f"'{path}' is a {model.get('type')} tokenizer; the llama.cpp peer writes byte-level "
                              "BPE vocabularies only")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, index in model["vocab"].items():
        if index < vocab_size:
            tokens[index], types[index] = text, gguf.TokenType.NORMAL
    for added in data.get("added_tokens", []):
        if added["id"] < vocab_size:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def write_gguf(model_dir: Path | str, out_path: Path | str, dtype: str = "f32") -> Path:
    """Write ``out_path`` (a GGUF of ``model_dir``'s weights in ``dtype``: f32 or f16)."""
    import gguf
    from safetensors.numpy import load_file

    model_dir, out_path = Path(model_dir), Path(out_path)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    _check(config, model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    files = [f for f in files if f.name.startswith("model")]
    if not files:
        raise GGUFExportError(f"'{model_dir}' has no model*.safetensors weights")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // heads
    vocab = config["vocab_size"]
    float_type = np.float16 if dtype == "f16" else np.float32

    tmp = out_path.with_name(out_path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(model_dir.name)
    writer.add_context_length(int(config.get("max_position_embeddings", 2048)))
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    tokens, types, merges = _vocabulary(model_dir, vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):
        value = config.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            add(int(value))

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    for hf_name, value in tensors.items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # llama.cpp reuses token_embd when output.weight is absent
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise GGUFExportError(f"'{model_dir}' has tensor '{hf_name}', which has no llama.cpp name")
        value = np.asarray(value, dtype=np.float32)
        if hf_name.endswith("q_proj.weight"):
            value = _permute_rope(value, heads)
        elif hf_name.endswith("k_proj.weight"):
            value = _permute_rope(value, kv_heads)
        # norms stay f32 (llama.cpp's own converter keeps 1-D tensors in f32)
        writer.add_tensor(name, value if value.ndim == 1 else value.astype(float_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out_path)
    return out_path
