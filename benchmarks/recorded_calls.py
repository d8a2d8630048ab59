"""goodput's recorded calls, driven again into a fresh policy (issue 23's trace scripts).

``benchmarks/results/k_policy_r24_tried/record_calls.py`` pickles every call a bench made to goodput: a ``start`` per
generation, then ``propose_budget``, ``see_grades``, ``choose_k`` and ``observe`` with their arguments and answers.
:func:`drive` makes each call again on a fresh policy per generation, so a script can compare answers, time a
``goodput.py`` against another, or read the policy's state at a given step.
"""
from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from spdflow.api import NoServices


def load_goodput(path: str | Path = "plugins/spdflow_decoding/goodput.py", name: str = "goodput_file") -> ModuleType:
    """A ``goodput.py`` loaded as a module of its own (so two versions can run side by side)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_calls(path: str | Path) -> list[tuple[str, Any, Any]]:
    """record_calls.py's pickle: (method, args, recorded answer) per call."""
    with open(path, "rb") as handle:
        return pickle.load(handle)


def drive(calls, module: ModuleType, **fields) -> Iterator[tuple[int, str, Any, Any, Any, Any]]:
    """Make the recorded calls again on ``module.Goodput(GoodputConfig(**fields))``, a fresh one per recorded
    generation, yielding (generation from 1, method, args, recorded answer, answer now, policy) after each call."""
    generation, policy = 0, None
    for method, args, recorded in calls:
        if method == "start":
            generation += 1
            policy = module.Goodput(module.GoodputConfig(**fields))
            policy.start(args[0], args[1], NoServices(args[2]))
            continue
        yield generation, method, args, recorded, getattr(policy, method)(*args), policy
