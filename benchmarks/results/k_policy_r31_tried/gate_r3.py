"""R3's and R4's live gate: round 30's gate_r7.py with synthetic 0.3 b2 among the cells where skipping is right.
    python benchmarks/results/k_policy_r31_tried/gate_r3.py DIR [DIR ...] VARIANT_ROW"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gate_r7_module import gate_r7

gate_r7.main(sys.argv[1:], safe=[("rare", 4), ("rare", 8), ("synthetic_0.3", 1), ("synthetic_0.3", 2),
                                 ("synthetic_0.3", 4), ("synthetic_0.3", 8)])
