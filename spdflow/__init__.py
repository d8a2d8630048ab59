"""spdflow: declarative speculative decoding for static-shape accelerators."""
from spdflow.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["hookimpl", "__version__"]
