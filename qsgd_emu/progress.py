"""Progress of a long command on stderr: never a silent wait, never a log full of redraws.

:class:`ProgressBar` (a study's tasks): on a terminal it redraws one line (``\\r``) as tasks
finish and as the running task reports how far it has come. On anything else (``make run 2>
log``, a CI log, a pipe) redraws would pile up as hundreds of lines, so it writes one line
per finished task and, while a task runs, at most one line every ``interval_s`` seconds (10),
as tqdm and pip do; every line carries the estimate of the time left.

>>> import io
>>> out = io.StringIO()                      # not a terminal
>>> bar = ProgressBar("study", stream=out, clock=iter([0.0, 1.0, 2.0, 20.0]).__next__)
>>> bar(1, 3, 30.0)                          # a task finished: a line
>>> bar.detail("fp32 at 8 GPUs")             # 1 s later: quiet
>>> bar.detail("fp32 at 16 GPUs")            # 19 s after the last line: a line
>>> print(out.getvalue(), end="")
study 1/3 tasks, 1.0 s, ~30 s left
study 1/3 tasks, 20.0 s, ~30 s left | fp32 at 16 GPUs

:class:`Watch` (one long command, ``simulate``): a daemon thread that stays quiet for the
first :data:`QUIET_S` seconds (a quick command prints nothing) and then prints, every
:data:`EVERY_S` seconds, one line: the elapsed time, the current stage, how far it has come
when the stage reports it, and the time left by the estimate the command gave. The engine's
compiled loop releases the GIL, so the thread speaks while a simulation runs.
"""
from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import Callable, TextIO

__all__ = ["ProgressBar", "Watch", "QUIET_S", "EVERY_S", "counted", "duration"]

#: Seconds before the first line (the issue's 2 s: a first line within 2 s of the start).
QUIET_S = 1.5
#: Seconds between lines.
EVERY_S = 5.0


def duration(seconds: float) -> str:
    """``"4.5 s"``, ``"42 s"``, ``"5.0 min"``: a rounded duration for a person.

    >>> duration(4.52), duration(42.4), duration(300)
    ('4.5 s', '42 s', '5.0 min')
    """
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


class ProgressBar:
    """Progress of ``total`` tasks on ``stream`` (stderr by default).

    On a terminal a bar redrawn in place, ``study [#####     ] 3/6 1.2 s, ~40 s left | text``;
    elsewhere lines, ``study 3/6 tasks, 1.2 s, ~40 s left``.

    Parameters
    ----------
    label : str
        Names what progresses (``study``).
    stream : file, optional
        Where to write; ``sys.stderr`` by default.
    width : int
        Characters of the bar (terminal only).
    columns : int, optional
        Longest line on a terminal; the terminal's width less one by default (a wrapped
        line would not be overwritten by ``\\r``).
    tty : bool, optional
        Draw the bar (True) or write lines (False); by default, whether ``stream`` is a
        terminal.
    interval_s : float
        Without a terminal, the least time between two lines about the running task.
    unit : str
        What is counted (``tasks``; ``points``, ``cases``).
    clock : callable, optional
        Seconds (``time.perf_counter`` by default; a test passes its own).

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> bar = ProgressBar("study", stream=out, tty=True, width=4, columns=60)
    >>> bar(1, 2, 5.0); bar(2, 2, 0.0)
    >>> out.getvalue().split("\\r")[-1].split(" 0.0 s")[0].split(" ")[:3]
    ['study', '[####]', '2/2']
    """

    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30,
                 columns: int | None = None, *, tty: bool | None = None,
                 interval_s: float = 10.0, unit: str = "tasks",
                 clock: Callable[[], float] | None = None):
        if not interval_s > 0:
            raise ValueError(f"interval_s: must be > 0 seconds, got {interval_s!r}")
        self.label, self.stream, self.width = label, stream or sys.stderr, width
        if tty is None:
            try:
                tty = bool(self.stream.isatty())
            except (AttributeError, ValueError):   # no isatty, or a closed stream
                tty = False
        self.tty, self.interval_s, self.unit = tty, interval_s, unit
        self.columns = columns or max(40, shutil.get_terminal_size().columns - 1)
        self.clock = clock or time.perf_counter
        self.t0 = self.clock()
        self._state = (0, 1, None)
        self._counted = False           # no count yet: the first task may report before it
        self._shown = 0                 # terminal: length of the line on screen
        self._last_line = None          # log: when the last line was written
        self._last_done = None          # log: the count of the last line

    def __call__(self, done: int, total: int, eta_s: float | None = None) -> None:
        """``done`` of ``total`` tasks finished; ``eta_s`` seconds estimated to go."""
        self._state, self._counted = (done, total, eta_s), True
        if self.tty:
            self._draw("")
            if done >= total:
                self.stream.write("\n")
                self._shown = 0
        elif done != self._last_done or done >= total:
            self._line("")
        self.stream.flush()

    def detail(self, text: str) -> None:
        """How far the running task has come: redrawn after the bar on a terminal, a line at
        most every ``interval_s`` seconds elsewhere."""
        if self.tty:
            self._draw(text)
        else:
            now = self.clock()
            if self._last_line is None or now - self._last_line >= self.interval_s:
                self._line(text, now)
        self.stream.flush()

    def _status(self, now: float) -> tuple[int, int, str]:
        done, total, eta_s = self._state
        left = "" if eta_s is None or done >= total else f", ~{duration(eta_s)} left"
        return done, total, f"{now - self.t0:.1f} s{left}"

    def _line(self, text: str, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        done, total, status = self._status(now)
        self._last_line = now
        counts = "starting"
        if self._counted:
            self._last_done, counts = done, f"{done}/{total} {self.unit}"
        self.stream.write(f"{self.label} {counts}, {status}" + (f" | {text}" if text else "")
                          + "\n")

    def _draw(self, text: str) -> None:
        done, total, status = self._status(self.clock())
        filled = self.width * done // max(total, 1)
        counts = f"{done}/{total}" if self._counted else "starting"
        line = (f"{self.label} [{'#' * filled}{' ' * (self.width - filled)}] {counts} "
                f"{status}" + (f" | {text}" if text else ""))
        line = line[:self.columns]
        self.stream.write("\r" + line + " " * max(0, self._shown - len(line)))
        self._shown = len(line)


def counted(label: str, unit: str, stream: TextIO | None = None,
            clock: Callable[[], float] | None = None) -> Callable[[int, int, str], None]:
    """A ``progress(done, total, what)`` callback over a :class:`ProgressBar` that estimates
    the time left from the pace so far (elapsed / done x what remains), for a loop whose
    items cost alike (``validate``'s cases and points); ``total`` None (not known yet)
    reports only ``what``.

    >>> import io
    >>> out = io.StringIO()
    >>> ticks = [0.0] + [0.0] * 3 + [2.0] * 3 + [4.0] * 2   # the start, then each call's reads
    >>> report = counted("validate", "cases", out, iter(ticks).__next__)
    >>> report(0, 2, "a"); report(1, 2, "b"); report(2, 2, "")
    >>> print(out.getvalue(), end="")
    validate 0/2 cases, 0.0 s
    validate 1/2 cases, 2.0 s, ~2.0 s left
    validate 2/2 cases, 4.0 s
    """
    clock = clock or time.perf_counter
    bar = ProgressBar(label, stream=stream, unit=unit, clock=clock)
    t0 = bar.t0

    def report(done: int, total: int | None, what: str) -> None:
        if total is None:                   # not counted yet: what it is doing
            bar.detail(what)
            return
        now = clock()
        bar(done, total, (now - t0) / done * (total - done) if done else None)
        if what:
            bar.detail(what)
    return report


class Watch:
    """Prints ``label: 3.1 s: simulating (42 %); about 9 s left`` lines on ``stream``.

    Parameters
    ----------
    label : str
        The command's name, first on every line.
    stream : file, optional
        Default ``sys.stderr``.
    quiet_s, every_s : float
        Silence at the start, and between lines (s).

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> with Watch("simulate", out, quiet_s=0.0, every_s=0.05) as w:
    ...     w.stage("analysing 16 GPUs", 0.2)
    ...     time.sleep(0.12)
    >>> "simulate: " in out.getvalue() and "analysing 16 GPUs" in out.getvalue()
    True
    """

    def __init__(self, label: str, stream=None, *, quiet_s: float = QUIET_S,
                 every_s: float = EVERY_S):
        self.label, self.stream = label, stream or sys.stderr
        self.quiet_s, self.every_s = quiet_s, every_s
        self.t0 = time.perf_counter()
        self._stage, self._stage_t0, self._stage_s = "starting", self.t0, None
        self._later_s = 0.0
        self._fraction = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._printed = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        if self._printed and exc[0] is None:
            self._line(f"done in {duration(time.perf_counter() - self.t0)}")

    def stage(self, name: str, estimate_s: float | None = None, later_s: float = 0.0) -> None:
        """Start stage ``name``, expected to take ``estimate_s`` seconds, with ``later_s``
        seconds of later stages still to come."""
        with self._lock:
            self._stage, self._stage_t0, self._stage_s = name, time.perf_counter(), estimate_s
            self._later_s, self._fraction = later_s, None

    def fraction(self, done: float) -> None:
        """How far the current stage has come (0..1)."""
        with self._lock:
            self._fraction = max(0.0, min(1.0, float(done)))

    def left_s(self) -> float | None:
        """Seconds left by the estimate: the current stage's rest (by its fraction when
        known) and the later stages'."""
        with self._lock:
            if self._stage_s is None:
                return None
            spent = time.perf_counter() - self._stage_t0
            if self._fraction:
                rest = spent * (1 - self._fraction) / self._fraction
            else:
                rest = max(self._stage_s - spent, 0.0)
            return rest + self._later_s

    def _run(self) -> None:
        if self._done.wait(self.quiet_s):
            return
        while True:
            self._report()
            if self._done.wait(self.every_s):
                return

    def _report(self) -> None:
        with self._lock:
            stage, frac = self._stage, self._fraction
        left = self.left_s()
        text = stage + (f" ({frac:.0%})" if frac is not None else "")
        with self._lock:
            over = (self._stage_s is not None and frac is None
                    and time.perf_counter() - self._stage_t0 > self._stage_s)
            est = self._stage_s
        if over:
            text += f"; longer than the {duration(est)} estimated"
        elif left is not None:
            text += f"; about {duration(left)} left"
        self._line(text)

    def _line(self, text: str) -> None:
        self._printed = True
        self.stream.write(f"{self.label}: {duration(time.perf_counter() - self.t0)}: {text}\n")
        self.stream.flush()
