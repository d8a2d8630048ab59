"""Record goodput's calls in a bench of the code workload at batch B, from the repository root:
    python benchmarks/results/k_policy_r24_tried/record_calls.py B OUT.pkl [--set KEY=VALUE ...]
(round 24: B = 1 and 8, and 2 with --set workload.builtin=stdlib_tests)"""
import copy, pickle, sys
import spdflow.engine.generate as generate
from spdflow.cli import main as cli_main
batch, out = int(sys.argv[1]), sys.argv[2]
calls = []
orig = generate.Generator._call_policy
def rec(self, method, *args):
    result = orig(self, method, *args)
    if type(self.policy).__name__ == "Goodput":
        if method == "start":
            calls.append(("start", (args[0], args[1], self.policy.costs.grid if hasattr(self.policy, "costs") else None), None))
        else:
            calls.append((method, copy.deepcopy(args), result))
    return result
generate.Generator._call_policy = rec
sys.argv = ["spdflow", "bench", "recipes/tinycode_varK.yaml", "--batch-sizes", str(batch), "--modes", "goodput",
            "--repeats", "2", "--set", "workload.count=16", *sys.argv[3:]]
try:
    cli_main()
except SystemExit:
    pass
pickle.dump(calls, open(out, "wb"))
print(len(calls), "calls")
