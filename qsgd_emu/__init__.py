"""The ``qsgd-emu`` application: the command line, its commands, the benchmarks and the demo.

It sits on top of every other package (``dashboards``, ``testbench``, ``emulator``, ``qsgd``,
``topologies``) and is the only one that wires them together. ``python -m qsgd_emu`` is the
same as the ``qsgd-emu`` console script.
"""
from .cli import main

__all__ = ["main"]
