"""Exceptions of :mod:`testbench`. Every message names the bad field and its value."""
from __future__ import annotations


class TestbenchError(Exception):
    """Base class of every error raised by :mod:`testbench`."""

    __test__ = False   # not a pytest test class, despite the name


class ConfigError(TestbenchError, ValueError):
    """A run's configuration field (ranks, sizes, model, ...) is not valid."""


class StoreError(TestbenchError, RuntimeError):
    """The run store cannot be opened, read or written."""


class TestbedError(TestbenchError, RuntimeError):
    """A namespace testbed could not be created, or a command inside it failed."""

    __test__ = False
