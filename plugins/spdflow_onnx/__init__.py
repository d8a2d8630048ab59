"""Built-in export plugin: Hugging Face causal LM (Llama, Qwen2, Qwen3) -> the ONNX of DESIGN §4.

The implementation lives in :mod:`spdflow_onnx.export`, imported only when an export runs so
that loading this plugin (``spdflow lint``, ``spdflow plugins``) does not import torch.
"""
from __future__ import annotations

from spdflow.hookspecs import hookimpl


@hookimpl(trylast=True)
def spdflow_export(request):
    """Export ``request.model_dir`` to ``request.work_dir/model.onnx`` + ``model.onnx.data``
    (a large model in a child process: see :mod:`spdflow_onnx.child`)."""
    if getattr(request, "graph", "causal_lm") == "eagle_layer":  # a few MB: always in process
        from spdflow_onnx.eagle import export_eagle_layer

        return export_eagle_layer(request)
    if getattr(request, "graph", "causal_lm") != "causal_lm":
        from spdflow.errors import StageError

        raise StageError(f"export: unknown graph '{request.graph}'; the onnx plugin builds 'causal_lm' and 'eagle_layer'")
    from spdflow_onnx.child import export_in_child, wants_child

    if wants_child(request.model_dir):
        return export_in_child(request)
    from spdflow_onnx.export import export_model

    return export_model(request)
