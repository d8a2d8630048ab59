"""Make the ~50M-parameter random-weight Llama that ``recipes/bench_50m_synthetic.yaml`` uses.

Vocabulary 4096 with the embedded tokenizer (so the engine tokenizes the usual workloads), and
the parameters spent on layers instead of a 32000-row embedding: 9 layers, hidden 768, 12 heads,
4 KV heads, intermediate 1536 — about 52M parameters. Random weights, so only the synthetic
proposer means anything on it; it is there to make the verify step dominate the host loop.

    python benchmarks/make_50m_model.py            # writes runs/models/llama-50m
    python benchmarks/make_50m_model.py OUT_DIR
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

#: Under runs/ (git-ignored); recipes/bench_50m_synthetic.yaml points here.
DEFAULT = Path(__file__).resolve().parents[1] / "runs" / "models" / "llama-50m"


def make_50m_model(path: Path) -> Path:
    """Save the model (safetensors + config + zoo tokenizer) to ``path``; returns ``path``."""
    from spdflow.testing.models import make_tiny_model

    return make_tiny_model(path, num_layers=9, hidden_size=768, num_heads=12, num_kv_heads=4,
                           max_position_embeddings=2048)


def count_parameters(path: Path) -> int:
    """Parameters in the saved safetensors file(s)."""
    from safetensors import safe_open

    total = 0
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), "np") as handle:
            for name in handle.keys():
                total += math.prod(handle.get_slice(name).get_shape())
    return total


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if (path / "config.json").is_file():
        print(f"{path} exists; delete it to rebuild", file=sys.stderr)
    else:
        make_50m_model(path)
    config = json.loads((path / "config.json").read_text())
    print(f"{path}: {count_parameters(path) / 1e6:.1f}M parameters, {config['num_hidden_layers']} layers, "
          f"hidden {config['hidden_size']}, vocab {config['vocab_size']}")


if __name__ == "__main__":
    main()
