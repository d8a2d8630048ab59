"""Round 28's mix_probe.py with round 29's probe_zero registered (zero_probe.py). From the repository root:
    python benchmarks/results/k_policy_r29_tried/mix_zero.py recipes/tinycode_varK.yaml --batch 4 --repeats 10 \\
        --modes nospec,probe_zero,goodput --set workload.count=16 --set 'proposer={uses: synthetic, with: {acceptance_rate: 0.3}}'"""
import sys
sys.path.insert(0, "benchmarks/results/k_policy_r29_tried"); sys.path.insert(0, "benchmarks/results/k_policy_r28_tried")
import zero_probe, mix_probe
import spdflow.plugins as plugins
original = plugins.get_plugin_manager
def with_plugin(*a, **k):
    pm = original(*a, **k); pm.add_plugin(zero_probe.Plugin(), "zero-probe", version="1.0"); return pm
plugins.get_plugin_manager = with_plugin
sys.exit(mix_probe.main(sys.argv[1:]))
