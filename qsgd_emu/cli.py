"""The ``qsgd-emu`` command line: one entry point, one module per sub-command.

Sub-commands are registered by module path in :data:`COMMANDS` and imported only when
invoked, so ``qsgd-emu topology ring:8`` never pays for importing torch or dash.
Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys

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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
