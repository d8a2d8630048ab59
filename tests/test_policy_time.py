"""benchmarks/policy_time.py: a policy's own time per step, timed inside bench-style runs."""
from __future__ import annotations

from conftest import REPO, load_benchmark, markdown_rows, run_table_benchmark


def test_policy_time_times_each_policy_inside_the_runs_and_checks_the_tokens(tmp_path, capsys):
    rows = run_table_benchmark("policy_time", tmp_path, capsys, "--batch", "1", "--repeats", "1",
                                  "--modes", "nospec,fixed,goodput", "--set", "workload.count=2",
                                  "--set", "workload.max_new_tokens=16")
    from spdflow.engine.generate import Generator
    assert "timed" not in Generator._call_policy.__qualname__  # the wrapping does not outlive the run
    assert set(rows) == {"nospec", "fixed", "varK:goodput"}
    assert float(rows["nospec"][4]) == 0.0  # no proposer: the policy is never called
    for row in ("fixed", "varK:goodput"):
        propose_budget, see_grades, choose_k, observe, policy = map(float, rows[row][:5])
        assert min(propose_budget, choose_k, observe) > 0
        assert (see_grades > 0) == (row == "varK:goodput")  # only a policy that reads grades is handed them
        assert abs(policy - (propose_budget + see_grades + choose_k + observe)) < 0.25  # (each rounded to 0.1)
        assert rows[row][-1] == "yes"  # tokens equal no-spec's


def test_policy_time_pinned_runs_every_mode_on_one_schedule(tmp_path, capsys):
    """--pin K: every mode verifies K each step (same steps as fixed:K, same tokens), while its
    policy's methods still run; a K outside the K-list is refused before any run."""
    module = load_benchmark("policy_time")
    common = [str(REPO / "recipes" / "tinycode_varK.yaml"), "--batch", "2", "--repeats", "1",
              "--set", f"output={tmp_path / 'run'}", "--set", "workload.count=4", "--set", "workload.max_new_tokens=24"]
    rc = module.main([*common, "--modes", "fixed:2,goodput", "--pin", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = markdown_rows(out, "mode")
    assert set(rows) == {"fixed:2", "varK:goodput"}
    assert rows["varK:goodput"][6] == rows["fixed:2"][6]  # steps: one schedule
    assert float(rows["varK:goodput"][4]) > 0  # goodput's methods ran
    assert rows["varK:goodput"][-1] == rows["fixed:2"][-1] == "yes"
    assert rows["fixed:2"][-2] == "1.000" and float(rows["varK:goodput"][-2]) > 0  # verify time paired with the first mode
    assert module.main([*common, "--modes", "fixed:2,goodput", "--pin", "3"]) == 2
    assert "not in the recipe's K-list" in capsys.readouterr().err
    from spdflow.engine.generate import Generator
    assert "timed" not in Generator._call_policy.__qualname__  # neither run leaves its wrapping behind


def test_policy_time_main_with_registers_a_probe_policy_for_one_run(tmp_path, capsys):
    """main_with: a plugin registered for the run (a probe's K policies) is a mode like any other, and is gone after."""
    from spdflow.api import KPolicy
    from spdflow.hookspecs import hookimpl
    import spdflow.plugins as plugins

    class Probe(KPolicy):
        name = "probe_largest"

        def choose_k(self, proposal_counts, compiled_ks):
            return max(compiled_ks)

    class Plugin:
        @hookimpl
        def spdflow_register_k_policies(self, register):
            register("probe_largest", Probe, description="a test probe: the largest K")

    module = load_benchmark("policy_time")
    original = plugins.get_plugin_manager
    rc = module.main_with(Plugin(), "test-probe", [
        str(REPO / "recipes" / "tinycode_varK.yaml"), "--batch", "1", "--repeats", "1", "--modes", "fixed:7,probe_largest",
        "--pin", "7", "--set", f"output={tmp_path / 'run'}", "--set", "workload.count=2", "--set", "workload.max_new_tokens=16"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = markdown_rows(out, "mode")
    assert set(rows) == {"fixed:7", "varK:probe_largest"} and rows["varK:probe_largest"][-1] == "yes"
    assert plugins.get_plugin_manager is original
    assert "probe_largest" not in plugins.get_plugin_manager().registry()["k_policy"]
