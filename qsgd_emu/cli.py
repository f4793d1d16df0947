"""The ``qsgd-emu`` command line: one entry point, one module per sub-command.

Sub-commands are registered by module path in :data:`COMMANDS` and imported only when
invoked, so ``qsgd-emu topology ring:8`` never pays for importing torch or dash.
Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import re
import sys
import threading

#: sub-command -> (module, one-line help). Modules live in :mod:`qsgd_emu.commands`.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("qsgd_emu.commands.demo", "the main job: measure, replay and study on an embedded default"),
    "bench": ("qsgd_emu.commands.bench", "benchmarks that print a table (qsgd, emulator, topologies)"),
    "topology": ("qsgd_emu.commands.topology", "build a topology from a spec and print its figures"),
    "measure": ("qsgd_emu.commands.measure", "measure real QSGD payloads of a real model into a PayloadTrace"),
    "simulate": ("qsgd_emu.commands.simulate", "simulate one collective (or a size sweep) over a topology"),
    "study": ("qsgd_emu.commands.study", "what-if sweep over world sizes x bits x transports x topologies"),
    "recommend": ("qsgd_emu.commands.recommend", "recommend QSGD widths per layer group under a variance budget"),
    "validate": ("qsgd_emu.commands.validate", "measure real collectives, calibrate, compare with predictions"),
    "train": ("qsgd_emu.commands.train", "train a real model with DDP and a compression hook"),
    "dashboard": ("qsgd_emu.commands.dashboard", "serve the Dash dashboard"),
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Help as the user reads it: defaults shown by argparse itself, descriptions as written.

    An option whose default is None or False (a flag) has no value to show; its help says
    what happens when it is not given.
    """

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def describe(module) -> str:
    """A command module's docstring as terminal help, without reStructuredText markup
    (``literal`` quotes, :role:`target` references, the ``::`` of literal blocks)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", module.__doc__ or "")
    return text.replace("``", "").replace("::\n", ":\n").strip()


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qsgd-emu", formatter_class=HelpFormatter,
        description="QSGD gradient compression and a network emulator that predicts its speedup.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    wanted = None
    if argv:
        wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_path, help_text) in COMMANDS.items():
        # Import only the module of the command being run; the others just list their help.
        if name == wanted:
            module = importlib.import_module(module_path)
            p = sub.add_parser(name, help=help_text, description=describe(module),
                               formatter_class=HelpFormatter)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
        else:
            sub.add_parser(name, help=help_text, description=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:
        # Bad input is reported in one line naming what was wrong; tracebacks are for bugs.
        print(f"qsgd-emu {args.command}: error: {exc}", file=sys.stderr)
        return 2


#: The cyclic collector's thresholds for a command's process (CPython's are 700, 10, 10).
#: A big simulation makes millions of tuples and dicts that live to the end: at the default
#: the collector traversed them 14 times in full and 5,700 times young, 0.9 s of an 8,192-GPU
#: ``simulate`` (8.0 s); reference counting still frees acyclic garbage at once (the gc
#: module's documentation, "set_threshold").
GC_THRESHOLDS = (50_000, 20, 100)


def entry() -> None:
    """The ``qsgd-emu`` program (console script and ``python -m qsgd_emu``): :func:`main`
    with the process's collector thresholds (:data:`GC_THRESHOLDS`), then :func:`leave`.

    In-process callers use :func:`main`, which changes neither.

    Examples
    --------
    From a shell (it ends the process)::

        $ python -m qsgd_emu topology ring:4
    """
    gc.set_threshold(*GC_THRESHOLDS)
    leave(main())


def leave(code: int) -> None:
    """Exit with ``code`` without the interpreter's teardown, which frees every cached object
    one by one (0.6 s of an 8,192-GPU ``simulate``, its routes and hop tables), as clang's
    driver runs its compiler with ``-disable-free``. What teardown would still do for the
    program is done first: the ``atexit`` functions (the testbed's namespaces, logging's
    flush) and flushing stdout and stderr. With a non-daemon thread still running, the exit
    is the ordinary one, which waits for it.
    """
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120      # what CPython exits with when its final flush fails
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
