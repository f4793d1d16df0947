"""QSGD gradient quantization and encoding in PyTorch (Alistarh et al., NeurIPS 2017).

The public names are loaded on first use (PEP 562), so ``import qsgd`` stays cheap and
sub-commands that need only part of the package do not pay for the rest.
"""
from __future__ import annotations

import importlib

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    "QSGDConfig": "qsgd.config",
    "Quantized": "qsgd.quantizer",
    "quantize": "qsgd.quantizer",
    "dequantize": "qsgd.quantizer",
    "encode": "qsgd.codec",
    "decode": "qsgd.codec",
    "payload_nbytes": "qsgd.codec",
    "QSGDError": "qsgd.errors",
    "ConfigError": "qsgd.errors",
    "PayloadError": "qsgd.errors",
    "TraceError": "qsgd.errors",
    "HookError": "qsgd.errors",
    "ModelError": "qsgd.errors",
    "QSGDState": "qsgd.hook",
    "qsgd_hook": "qsgd.hook",
    "MODELS": "qsgd.models",
    "build_model": "qsgd.models",
    "BucketSpec": "qsgd.buckets",
    "ddp_buckets": "qsgd.buckets",
    "measure": "qsgd.measurement",  # not qsgd.measure: importing it would shadow the function
    "PayloadTrace": "qsgd.trace",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'qsgd' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
