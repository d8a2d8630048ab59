"""Random-init Hugging Face causal LMs for tests and benchmarks.

Built from a config in a second, with no network: unit tests export and run them in seconds.
Imports torch and transformers lazily so importing ``spdflow.testing`` stays cheap.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

#: The vocabulary of the embedded tokenizer, so tiny models can share it.
TINY_VOCAB = 4096
#: Token ids the embedded models use (``<|endoftext|>`` and ``<|pad|>``).
EOS_ID, PAD_ID = 0, 1

_ARCHS = ("llama", "qwen2", "qwen3", "mistral")


def _config(arch: str, **shape):
    """A transformers config for ``arch`` with the given shape fields."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}
    if arch not in classes:
        raise ValueError(f"unknown tiny-model architecture {arch!r}; choose one of {', '.join(_ARCHS)}")
    common = dict(
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )
    if arch == "qwen2":
        # Qwen2's signature detail: biases on q/k/v; keep it so the export covers it.
        common["attention_bias"] = True
    return classes[arch](**{**common, **shape})


def _save_random_model(path: Path, config, seed: int) -> Path:
    """Instantiate ``config`` with seeded random weights and save it (safetensors + configs)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # tests and benchmarks print their own output
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # HF's default init (std 0.02) gives near-uniform logits; a wider init makes greedy argmax
    # margins large enough that equivalence tests are not at the mercy of float rounding.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.1 if "embed" not in name else 1.0)
    model.eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    GenerationConfig(bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(path)
    return path


def make_tiny_model(
    path,
    arch: str = "llama",
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 512,
    **config_fields,
) -> Path:
    """Save a random-init causal LM of ``arch`` ("llama", "qwen2", "qwen3" or "mistral") to ``path``.

    ``config_fields`` go into the config as they are (``tie_word_embeddings=True``,
    ``rope_scaling={...}``, ``sliding_window=...``).

    The vocabulary (4096) and tokenizer files are those of the embedded ``tinycode-target``,
    with eos id 0 and pad id 1 like the zoo, so a tiny model runs end to end on text prompts.
    Returns ``path``.
    """
    from spdflow.zoo import zoo_path

    path = Path(path)
    config = _config(
        arch,
        vocab_size=TINY_VOCAB,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        **config_fields,
    )
    _save_random_model(path, config, seed)
    source = zoo_path("tinycode-target")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(source / name, path / name)
    return path


def make_50m_llama(path, seed: int = 0) -> Path:
    """Save a ~56M-parameter random-init Llama (8 layers, hidden 512, vocab 32000) for benchmarks.

    No tokenizer: benchmarks feed token ids directly. Returns ``path``.
    """
    config = _config(
        "llama",
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=2048,
    )
    return _save_random_model(Path(path), config, seed)


def add_speculators(model_dir, path, heads: int = 3, seed: int = 0) -> Path:
    """A copy of ``model_dir`` at ``path`` with random multi-projection heads and a random EAGLE
    layer (the files ``tools/train_heads.py`` writes), for tests of those proposers.

    The heads' blocks get non-zero weights, so each head's logits differ from the LM head's.
    Returns ``path``.
    """
    import torch
    from safetensors.torch import save_file
    from spdflow_onnx import speculators as spec
    from transformers import AutoConfig

    path = Path(path)
    shutil.copytree(model_dir, path, dirs_exist_ok=True)
    config = AutoConfig.from_pretrained(path)
    torch.manual_seed(seed)
    projections = spec.build_projections(config.hidden_size, heads, 1)
    with torch.no_grad():
        for param in projections.parameters():
            param.normal_(0.0, 0.5)
    save_file(spec.projection_state(projections), str(path / spec.SPECULATOR_WEIGHTS))
    (path / spec.SPECULATOR_CONFIG).write_text(
        json.dumps({"model_type": "turbo", "turbo_num_heads": heads, "turbo_num_layers": 1}) + "\n")
    draft = spec.EagleDraft(spec.eagle_layer_config(config))
    save_file(draft.state(), str(path / spec.EAGLE_WEIGHTS))
    (path / spec.EAGLE_CONFIG).write_text(json.dumps(spec.eagle_config_json(draft.config)) + "\n")
    return path
