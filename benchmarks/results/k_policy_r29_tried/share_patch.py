"""Monkeypatch: every InferenceSession made from a graph file gets the external initializers from one shared set of OrtValues."""
import os
import onnx, numpy as np
import onnxruntime as ort
from onnx import numpy_helper
_orig = ort.InferenceSession
_values = {}
_arrays = {}
_done = set()
class Shared(_orig):
    def __init__(self, path, sess_options=None, *a, **kw):
        m = onnx.load(str(path), load_external_data=False)
        base = os.path.dirname(str(path))
        names = []
        for init in m.graph.initializer:
            if init.data_location != 1:
                continue
            info = {e.key: e.value for e in init.external_data}
            key = (os.path.realpath(os.path.join(base, info["location"])), info.get("offset", "0"), init.name)
            if key not in _values:
                dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
                off = int(info.get("offset", 0)); n = int(np.prod(init.dims)) if init.dims else 1
                arr = np.fromfile(key[0], dtype=dtype, count=n, offset=off).reshape(list(init.dims))
                _arrays[key] = arr
                _values[key] = ort.OrtValue.ortvalue_from_numpy(arr)
            names.append((init.name, _values[key]))
        so = ort.SessionOptions() if sess_options is None else sess_options
        # options are shared between the sessions of one OrtSession: add each name once
        if id(so) not in _done:
            for n, v in names:
                so.add_initializer(n, v)
            _done.add(id(so))
        if os.environ.get("NOPREPACK"):
            try: so.add_session_config_entry("session.disable_prepacking", "1")
            except Exception: pass
        super().__init__(path, so, *a, **kw)
ort.InferenceSession = Shared
