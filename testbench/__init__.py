"""Real runs: DDP training with any gradient hook, the timing harness, the netns testbed, the run store.

Everything here touches real processes, sockets and network namespaces; the maths of
comparing what it measures with the emulator lives in :mod:`emulator.validation`.

- :func:`train` (with :class:`TrainConfig`, :data:`COMPRESSIONS`, :data:`DATASETS`): real DDP
  training on one process group, logging into a :class:`RunStore`; :func:`spawn` and
  :func:`init` start or join the group.
- :func:`run_harness` (with :class:`HarnessConfig`): times real collectives and training steps
  into an :class:`emulator.MeasuredTrace`.
- :class:`Testbed`: hosts as Linux network namespaces with shaped links (root only);
  :func:`run_local_ranks` starts ranks as local processes.
"""
from .errors import ConfigError, StoreError, TestbedError, TestbenchError
from .harness import HarnessConfig
from .harness import run as run_harness
from .processes import RankResult, free_port, kill_group, run_local_ranks
from .store import RunStore, default_path
from .testbed import Testbed, TestbedConfig, available, cleanup_stale
from .training.compression import COMPRESSIONS
from .training.datasets import DATASETS, load_dataset
from .training.launch import init, launched_by_torchrun, spawn
from .training.loop import TrainConfig, train
from .training.predict import make_predictor

__all__ = [
    "TestbenchError", "ConfigError", "StoreError", "TestbedError",
    "TrainConfig", "train", "COMPRESSIONS", "DATASETS", "load_dataset", "spawn", "init",
    "launched_by_torchrun", "make_predictor",
    "HarnessConfig", "run_harness",
    "Testbed", "TestbedConfig", "available", "cleanup_stale", "RankResult", "run_local_ranks",
    "free_port", "kill_group",
    "RunStore", "default_path",
]
