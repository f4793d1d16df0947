"""Exceptions of :mod:`emulator`. Every message names the bad field and its value."""
from __future__ import annotations


class EmulatorError(Exception):
    """Base class of every error raised by :mod:`emulator`."""


class ConfigError(EmulatorError, ValueError):
    """A configuration field (algorithm, op, bytes, ranks, ...) is not valid."""


class ScheduleError(EmulatorError, ValueError):
    """A schedule of transfers is inconsistent (unknown dependency, cycle, bad rank)."""


class SimulationError(EmulatorError, RuntimeError):
    """The simulation cannot proceed (a flow has no route, a deadlock, ...)."""


class TraceError(EmulatorError, ValueError):
    """A measured trace or report file is malformed; the message names the field."""


class CalibrationError(EmulatorError, ValueError):
    """Link parameters cannot be fitted from the given measurements."""
