"""A SimPy flow-level network emulator that replays QSGD payloads through collective algorithms.

Layers: :mod:`emulator.collectives` turns (op, algorithm, ranks, bytes) into a schedule of
transfers (pure functions, no SimPy); :mod:`emulator.engine` moves the transfers over a
topology's links; :func:`replay` puts a measured model's buckets on that network and
:func:`run_study` sweeps it; :mod:`emulator.validation` compares predictions with real runs.
torch is imported only by the functions that read a :class:`qsgd.PayloadTrace`.

>>> import emulator, topologies
>>> G = topologies.from_spec("ring:4,bw=10GB/s,lat=1us")
>>> r = emulator.run_collective(G, "allreduce", "ring", 4_000_000)
>>> round(r.time_s * 1e6, 2)   # 2(p-1) (alpha + n/(p B)) = 6 (1 + 100) us
606.0
"""
import importlib

from .closed_form import closed_form
from .collectives import (ALGORITHMS, NCCL_ALGORITHMS, Route, Schedule, Transfer, build_schedule,
                          busbw_factor)
from .collectives.nccl import NcclSystem, Plan as NcclPlan, plan as nccl_plan
from .compute import ATTENTION_KERNELS, DEVICES, PRECISIONS, ComputeModel
from .engine import run_collective, simulate
from .errors import (CalibrationError, ConfigError, EmulatorError, ScheduleError, SimulationError,
                     TraceError)
from .faults import DegradedLink, Fault, RemovedLink, Straggler
from .network import Network
from .recommend import Budget, Candidate, Recommendation, VarianceModel, pareto_front, recommend
from .result import CollectiveResult
from .sweep import size_sweep, sweep_sizes

# The layers above the engine (replay, studies, reports, validation) load on first use (PEP
# 562): ``qsgd-emu simulate`` needs none of them. (``recommend`` stays eager: a lazy import
# of emulator.recommend would bind the module over the function of the same name.)
_LAZY = {
    ".replaying": ("TRANSPORTS", "Prediction", "bucket_plan", "collective_requests", "replay"),
    ".report": ("write_report",),
    ".sharded": ("replay_sharded", "sharded_plan", "machine_size", "SHARDED_TRANSPORTS"),
    ".memory": ("Memory", "memory_per_gpu"),
    ".strategy": ("recommend_strategy", "StrategyChoice", "StrategyOption", "BUDGET_KINDS",
                  "budget_for", "recommend_parallelism"),
    ".studyconfig": ("StudyConfig",),
    ".study": ("placement_notes", "resolve_compute", "run_study", "topology_for"),
    ".studyresult": ("Study", "StudyRow", "read_study"),
    ".validation": ("CollectivePoint", "MeasuredTrace", "TrainingPoint", "ValidationReport",
                    "calibrate", "compare", "import_nccl_tests"),
}
_HOME = {name: module for module, names in _LAZY.items() for name in names}
_SUBMODULES = ("figures", "validation", "replaying", "report", "study", "studyresult",
               "fastpath", "sharded", "memory", "strategy")


def __getattr__(name):
    if name in _HOME:
        module = importlib.import_module(_HOME[name], __name__)
        for exported in _LAZY[_HOME[name]]:
            globals()[exported] = getattr(module, exported)
        return globals()[name]
    if name in _SUBMODULES:
        value = globals()[name] = importlib.import_module(f".{name}", __name__)
        return value
    raise AttributeError(f"module 'emulator' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_HOME) | set(_SUBMODULES))


__all__ = [
    "EmulatorError", "ConfigError", "ScheduleError", "SimulationError", "TraceError",
    "CalibrationError",
    "Route", "Transfer", "Schedule", "ALGORITHMS", "NCCL_ALGORITHMS", "build_schedule",
    "busbw_factor", "closed_form", "nccl_plan", "NcclPlan", "NcclSystem",
    "simulate", "run_collective", "CollectiveResult", "Fault", "DegradedLink", "RemovedLink",
    "Straggler", "size_sweep", "sweep_sizes",
    "ComputeModel", "DEVICES", "PRECISIONS", "ATTENTION_KERNELS", "Network", "replay", "bucket_plan", "collective_requests",
    "Prediction", "TRANSPORTS", "replay_sharded", "sharded_plan", "machine_size",
    "SHARDED_TRANSPORTS", "Memory", "recommend_strategy", "StrategyChoice", "StrategyOption",
    "BUDGET_KINDS", "budget_for", "recommend_parallelism", "memory_per_gpu",
    "StudyConfig", "run_study", "placement_notes", "resolve_compute", "topology_for", "Study",
    "StudyRow", "read_study", "write_report", "figures", "fastpath",
    "Budget", "Candidate", "Recommendation", "VarianceModel", "pareto_front", "recommend",
    "MeasuredTrace", "CollectivePoint", "TrainingPoint", "ValidationReport", "calibrate",
    "compare", "import_nccl_tests",
]
