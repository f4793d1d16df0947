"""The command line's written-out choices stay the registries' (qsgd_emu/computeargs.py)."""
from __future__ import annotations

import subprocess
import sys

import qsgd
from qsgd_emu import computeargs


def test_the_written_out_choices_are_the_registries_keys():
    assert computeargs.CHECKPOINTING_CHOICES == tuple(qsgd.CHECKPOINTING)
    assert computeargs.STRATEGY_CHOICES == tuple(qsgd.STRATEGIES)


def test_study_help_and_a_typo_need_no_torch():
    """``study --help`` and a bad option are answered without importing torch."""
    code = ("import sys; from qsgd_emu.cli import main\n"
            "for argv in (['study', '--help'], ['study', '--parallelism', 'fdsp']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
    assert "invalid choice: 'fdsp'" in out.stderr
