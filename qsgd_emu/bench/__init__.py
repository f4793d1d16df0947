"""Benchmarks that print a table (``qsgd-emu bench TARGET``), one module per subject.

Each module defines ``add_arguments(parser)`` and ``run(args) -> int`` like a sub-command and
measures its own baseline in the same run, so its ratios mean something on any machine.
"""
