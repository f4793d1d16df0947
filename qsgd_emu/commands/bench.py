"""``qsgd-emu bench TARGET [options]``: run one package's benchmark and print its table.

Targets are registered by module path in :data:`TARGETS`; a target module defines
``add_arguments(parser)`` and ``run(args) -> int`` like a sub-command, and is imported only
when chosen (``bench topologies`` never imports torch).
"""
from __future__ import annotations

import argparse
import importlib

#: target -> module with add_arguments(parser) and run(args) -> int
TARGETS: dict[str, str] = {
    "qsgd": "qsgd_emu.bench.qsgd",
    "emulator": "qsgd_emu.bench.emulator",
    "topologies": "qsgd_emu.bench.topologies",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", choices=sorted(TARGETS), help="which benchmark to run")
    parser.add_argument("options", nargs=argparse.REMAINDER,
                        help="options of the target (see qsgd-emu bench TARGET --help)")


def run(args: argparse.Namespace) -> int:
    module_path = TARGETS[args.target]
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        if exc.name != module_path:
            raise
        raise ValueError(f"bench target {args.target!r} is not available: module {module_path} "
                         "is not installed") from None
    from qsgd_emu.cli import HelpFormatter, describe

    parser = argparse.ArgumentParser(prog=f"qsgd-emu bench {args.target}",
                                     description=describe(module), formatter_class=HelpFormatter)
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(args.options)) or 0)
