"""policy_time.py with goodput variants registered as modes (policy_ab.py's NAME=FIELD=VALUE form).

    python benchmarks/results/k_policy_r32_tried/pinned.py 'goodput_pu=price_ungraded=false' -- <policy_time.py arguments>
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from policy_ab import parse_variant, variant_plugin  # noqa: E402
from policy_time import main_with  # noqa: E402

split = sys.argv.index("--")
variants = [parse_variant(v) for v in sys.argv[1:split]]
sys.exit(main_with(variant_plugin(variants), "pinned-variants", sys.argv[split + 1:]))
