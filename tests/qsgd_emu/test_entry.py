"""The program's entry: collector thresholds for the process, and an exit without teardown
that still runs what teardown would run for the program (atexit, flushing, threads)."""
from __future__ import annotations

import gc
import subprocess
import sys

from qsgd_emu import cli


def _program(prelude: str, argv: list[str]) -> subprocess.CompletedProcess:
    code = (f"import atexit, gc, sys, threading, time\nfrom qsgd_emu import cli\n{prelude}\n"
            f"sys.argv = ['qsgd-emu', *{argv!r}]\ncli.entry()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_the_exit_keeps_output_atexit_functions_and_the_exit_code():
    done = _program("atexit.register(lambda: print('atexit ran', gc.get_threshold()))",
                    ["topology", "ring:4"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "4" in " ".join(lines[:-1])            # the command's own output came out
    assert lines[-1] == f"atexit ran {cli.GC_THRESHOLDS}"
    bad = _program("", ["topology", "ring:0"])
    assert bad.returncode == 2
    assert bad.stderr.startswith("qsgd-emu topology: error:")


def test_a_running_thread_gets_the_ordinary_exit_which_waits_for_it():
    done = _program("threading.Thread(target=lambda: (time.sleep(0.5), print('thread done')))"
                    ".start()", ["topology", "ring:4"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "thread done"


def test_main_in_process_leaves_the_collector_as_it_was():
    before = gc.get_threshold()
    assert cli.main(["topology", "ring:4"]) == 0
    assert gc.get_threshold() == before
    assert before != cli.GC_THRESHOLDS
