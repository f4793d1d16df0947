"""The Examples in the docstrings of the NCCL model and the validation modules run as written."""
import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["emulator.collectives.nccl", "emulator.collectives.nccl.system",
           "emulator.collectives.nccl.channels", "emulator.collectives.nccl.cost",
           "emulator.collectives.nccl.pipeline", "emulator.collectives.nccl.transports",
           "emulator.collectives.nccl.p2p", "topologies.machines.parts",
           "emulator.validation.calibrate", "emulator.validation.compare",
           "emulator.validation.nccl_tests", "topologies.machines.nvidia",
           "topologies.machines.cloud", "topologies.machines.pcie"]


@pytest.mark.parametrize("name", MODULES)
def test_examples(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples read the test data by relative path
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
