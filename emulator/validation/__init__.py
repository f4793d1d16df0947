"""Validation of the emulator against real runs.

Measure real collectives and real QSGD training steps (:mod:`.harness`, or import NVIDIA
nccl-tests logs with :func:`import_nccl_tests`) into a :class:`MeasuredTrace`, fit link
latency and bandwidth per link class (:func:`calibrate`), predict the other points with the
emulator and score them (:func:`compare` -> :class:`ValidationReport`). :mod:`.testbed`
builds a shaped multi-host network out of Linux network namespaces on one machine.

Names load on first use, so ``import emulator.validation`` does not import torch.
"""
from __future__ import annotations

import importlib

_EXPORTS: dict[str, str] = {
    "MeasuredTrace": "emulator.validation.trace",
    "CollectivePoint": "emulator.validation.trace",
    "TrainingPoint": "emulator.validation.trace",
    "ValidationReport": "emulator.validation.compare",
    "import_nccl_tests": "emulator.validation.nccl_tests",
    "Calibration": "emulator.validation.calibrate",
    "calibrate": "emulator.validation.calibrate",
    "compare": "emulator.validation.compare",
    "HarnessConfig": "emulator.validation.harness",
    "Testbed": "emulator.validation.testbed",
    "TestbedConfig": "emulator.validation.testbed",
}

__all__ = sorted(_EXPORTS)


# ``calibrate`` and ``compare`` are both submodules and functions: importing a submodule
# binds its name on the package, which would shadow the lazy function, so these two are
# bound eagerly (numpy and networkx only; no torch).
from .calibrate import Calibration, calibrate  # noqa: E402
from .compare import ValidationReport, compare  # noqa: E402


def __getattr__(name: str):
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'emulator.validation' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
