"""benchmarks/recorded_calls.py: goodput's recorded calls made again on a fresh policy per generation."""
from __future__ import annotations

import pickle

from conftest import REPO, load_benchmark

from spdflow.api import NoServices, StepContext, StepOutcome


def test_drive_makes_each_recorded_call_again_on_a_fresh_policy_per_generation(tmp_path):
    module = load_benchmark("recorded_calls")
    goodput = module.load_goodput(REPO / "plugins" / "spdflow_decoding" / "goodput.py")
    grid = {0: 1.0e-3, 2: 1.2e-3, 4: 1.4e-3, 7: 1.8e-3}
    step = StepContext((20, 18), 0, 2, (0, 1))
    outcome = StepOutcome(7, (7, 3), (7, 0), 1.8e-3, 1e-4, 2e-4, ((7, 7), (1, 0)), (0, 1), (None, None))
    # (recorded answers no policy gives, so that an answer passed through from the recording shows)
    generation = [("start", ([0, 2, 4, 7], 2, grid), None), ("propose_budget", (7, step), -1),
                  ("choose_k", ([7, 3], [0, 2, 4, 7]), -1), ("observe", (outcome,), None)]
    path = tmp_path / "calls.pkl"
    path.write_bytes(pickle.dumps(generation * 2))

    made = list(module.drive(module.load_calls(path), goodput, margin=0.05))
    assert [(g, method) for g, method, *_ in made] == [(g, m) for g in (1, 2) for m in ("propose_budget", "choose_k", "observe")]
    assert made[0][-1] is made[2][-1] and made[0][-1] is not made[3][-1]  # one policy per generation
    assert made[0][-1].config.margin == 0.05  # the fields given reach GoodputConfig
    direct = goodput.Goodput(goodput.GoodputConfig(margin=0.05))  # the same calls made by hand answer alike
    direct.start([0, 2, 4, 7], 2, NoServices(grid))
    assert made[3][3] == -1 and made[3][4] == direct.propose_budget(7, step)
    assert made[4][4] == direct.choose_k([7, 3], [0, 2, 4, 7]) in (0, 2, 4, 7)
