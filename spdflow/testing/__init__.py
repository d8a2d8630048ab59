"""Test helpers for spdflow and for plugin authors.

* :mod:`spdflow.testing.models` — tiny random-init Hugging Face models (``make_tiny_model``).
* :mod:`spdflow.testing.fixtures` — plain functions behind the fixtures: a fresh plugin
  manager, a tiny program built through the real engine, running a recipe in-process.
* :mod:`spdflow.testing.pytest_plugin` — the fixtures themselves (``spdflow_pm``,
  ``tiny_model_dir``, ``tiny_program``, ...), loaded by pytest through the ``pytest11`` entry
  point of the ``spdflow`` distribution: installing spdflow is enough to use them.
* :mod:`spdflow.testing.conformance` — ``ProposerConformance``, the suite every proposer should
  pass: subclass it in your plugin's tests with two lines.

Importing this package is cheap: torch and onnxruntime load only when a model is built or run.
"""
