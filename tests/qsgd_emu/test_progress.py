"""Progress on stderr: a bar redrawn in place on a terminal, a few readable lines in a log."""
import io
import os
import pty
import subprocess
import sys

import pytest

from qsgd_emu.progress import ProgressBar


class Clock:
    """Seconds that a test moves forward by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_on_a_terminal_the_bar_is_redrawn_on_one_line():
    out = io.StringIO()
    bar = ProgressBar("study", stream=out, width=10, columns=60, tty=True)
    bar(1, 4, 30.0)
    bar.detail("switch:{n} at 8 GPUs, fp32: fp32 32-bit (1/1), 3 collectives simulated, last x")
    bar(2, 4, 20.0)
    lines = out.getvalue().split("\r")[1:]
    assert "~30 s left | switch:{n} at 8 G" in lines[1] and len(lines[1]) == 60
    assert lines[2].startswith("study [#####     ] 2/4") and "|" not in lines[2]
    assert len(lines[2]) == 60          # padded over the longer line before it
    bar(4, 4, 0.0)
    assert out.getvalue().endswith("\n") and "\n" not in out.getvalue()[:-1]


def test_in_a_log_one_line_per_finished_task_and_at_most_one_per_interval_between():
    out, clock = io.StringIO(), Clock()
    bar = ProgressBar("study", stream=out, clock=clock)
    assert bar.tty is False                     # a StringIO is not a terminal
    bar.detail("measuring")                     # before the study counts its tasks
    bar(0, 3, None)
    for t in range(1, 100):                     # a task reporting 10 times a second for 9.9 s
        clock.now = t / 10
        bar.detail(f"step {t}")
    clock.now = 12.0
    bar.detail("step 120")                      # 12 s after the last line: one line
    clock.now = 15.0
    bar(1, 3, 60.0)                             # a task finished: a line, whatever the time
    clock.now = 15.5
    bar(2, 3, 200.0)
    clock.now = 16.0
    bar(2, 3, 190.0)                            # the same count again: quiet
    clock.now = 30.0
    bar(3, 3, 0.0)
    lines = out.getvalue().splitlines()
    assert lines == ["study starting, 0.0 s | measuring",
                     "study 0/3 tasks, 0.0 s",
                     "study 0/3 tasks, 12.0 s | step 120",
                     "study 1/3 tasks, 15.0 s, ~60 s left",
                     "study 2/3 tasks, 15.5 s, ~3.3 min left",
                     "study 3/3 tasks, 30.0 s"]
    assert "\r" not in out.getvalue()


def test_a_bad_interval_is_named():
    with pytest.raises(ValueError, match="interval_s: must be > 0 seconds, got 0"):
        ProgressBar("study", stream=io.StringIO(), interval_s=0)


def test_a_real_terminal_gets_the_bar_and_a_pipe_gets_lines():
    """The choice is the stream's own: a pseudo-terminal is a terminal, a pipe is not."""
    code = ("import sys; from qsgd_emu.progress import ProgressBar\n"
            "b = ProgressBar('study'); b(1, 2, 5.0); b.detail('x'); b(2, 2, 0.0)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, check=True).stderr
    assert piped.splitlines()[0].startswith("study 1/2 tasks, ") and "\r" not in piped
    leader, follower = pty.openpty()
    try:
        subprocess.run([sys.executable, "-c", code], stderr=follower, env=env, check=True)
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:                     # the terminal closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    assert b"\rstudy [" in seen and b"2/2" in seen
