"""A SimPy flow-level network emulator that replays QSGD payloads through collective algorithms.

The public names are loaded on first use (PEP 562): ``import emulator`` does not import
SimPy, torch or numpy until a name that needs them is touched.
"""
from __future__ import annotations

import importlib

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    # errors
    "EmulatorError": "emulator.errors",
    "ConfigError": "emulator.errors",
    "ScheduleError": "emulator.errors",
    "SimulationError": "emulator.errors",
    "TraceError": "emulator.errors",
    "StoreError": "emulator.errors",
    "CalibrationError": "emulator.errors",
    # collectives: pure schedules, no SimPy
    "Transfer": "emulator.collectives",
    "Schedule": "emulator.collectives",
    "ALGORITHMS": "emulator.collectives",
    "build_schedule": "emulator.collectives",
    "busbw_factor": "emulator.collectives",
    "closed_form": "emulator.closed_form",
    # engine
    "simulate": "emulator.engine",
    "run_collective": "emulator.engine",
    "CollectiveResult": "emulator.result",
    "Fault": "emulator.faults",
    "DegradedLink": "emulator.faults",
    "RemovedLink": "emulator.faults",
    "Straggler": "emulator.faults",
    "size_sweep": "emulator.sweep",
    # replay and studies
    "ComputeModel": "emulator.compute",
    "DEVICES": "emulator.compute",
    "replay": "emulator.replaying",
    "Prediction": "emulator.replaying",
    "TRANSPORTS": "emulator.replaying",
    "StudyConfig": "emulator.study",
    "run_study": "emulator.study",
    "topology_for": "emulator.study",
    "write_report": "emulator.report",
    # validation
    "MeasuredTrace": "emulator.validation",
    "ValidationReport": "emulator.validation",
    "calibrate": "emulator.validation",
    "compare": "emulator.validation",
    "import_nccl_tests": "emulator.validation",
    # the run store
    "RunStore": "emulator.store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'emulator' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
