"""Progress of a long command on stderr: never a silent wait.

A command that may run for more than a couple of seconds names what it is doing and how
long it expects to take. :class:`Watch` runs a daemon thread that stays quiet for the first
:data:`QUIET_S` seconds (a quick command prints nothing) and then prints, every
:data:`EVERY_S` seconds, one line: the elapsed time, the current stage, how far it has come
when the stage reports it, and the time left by the estimate the command gave. The engine's
compiled loop releases the GIL, so the thread speaks while a simulation runs.
"""
from __future__ import annotations

import sys
import threading
import time

__all__ = ["Watch", "QUIET_S", "EVERY_S", "duration"]

#: Seconds before the first line (the issue's 2 s: a first line within 2 s of the start).
QUIET_S = 1.5
#: Seconds between lines.
EVERY_S = 5.0


def duration(seconds: float) -> str:
    """``"12 s"``, ``"4.5 min"``: a rounded duration for a person."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


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
