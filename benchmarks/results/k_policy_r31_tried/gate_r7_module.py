"""Round 30's gate_r7.py, loaded as a module for this folder's gates."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "gate_r7", Path(__file__).resolve().parents[1] / "k_policy_r30_tried" / "gate_r7.py")
gate_r7 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate_r7)
