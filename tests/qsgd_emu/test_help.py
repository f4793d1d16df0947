"""Every option explains itself; defaults are the ones the code uses, shown by argparse."""
import argparse
import importlib
import re

import pytest

from qsgd_emu import cli
from qsgd_emu.commands.bench import TARGETS
from tests.qsgd_emu.cli_run import run_cli


def _options(parser, where):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _options(sub, f"{where} {name}")
        elif not isinstance(a, argparse._HelpAction):
            yield where, a


def _all_options():
    for name in cli.COMMANDS:
        yield from _options(cli.build_parser([name]), "qsgd-emu")
    for target, module in TARGETS.items():
        p = argparse.ArgumentParser()
        importlib.import_module(module).add_arguments(p)
        yield from _options(p, f"qsgd-emu bench {target}")


def test_every_option_has_a_help_line():
    bare = sorted({f"{w} {'/'.join(a.option_strings) or a.dest}" for w, a in _all_options()
                   if not a.help or a.help == argparse.SUPPRESS})
    assert not bare


def test_help_lines_leave_the_default_to_argparse():
    """A help line that states its own default drifts from the code; argparse prints the
    real one. Options without a default value (None, a flag) may say what happens instead."""
    stated = sorted({f"{w} {'/'.join(a.option_strings)}: {a.help}" for w, a in _all_options()
                     if a.default not in (None, False) and re.search(r"\(default[ :]", a.help or "")})
    assert not stated


def test_demo_help_shows_the_defaults_the_demo_uses():
    code, out, _ = run_cli(["demo", "--help"])
    assert code == 0
    args = cli.build_parser(["demo"]).parse_args(["demo"])
    sizes = ",".join(str(w) for w in args.world_sizes)
    assert f"(default: {sizes})" in " ".join(out.split())
    from qsgd_emu.commands.demo import DEFAULT_TOPOLOGIES

    assert " and ".join(DEFAULT_TOPOLOGIES) in "".join(out.split()).replace("and", " and ")


@pytest.mark.parametrize("argv", [["bench", "emulator", "--help"], ["bench", "qsgd", "--help"],
                                  ["simulate", "--help"], ["validate", "--help"]])
def test_help_is_plain_text(argv):
    code, out, _ = run_cli(argv)
    assert code == 0 and "``" not in out and ":func:" not in out and ":data:" not in out


def test_train_help_shows_torchrun_and_slurm():
    code, out, _ = run_cli(["train", "--help"])
    assert code == 0
    assert "torchrun --nproc-per-node" in out and "srun torchrun" in out and "#SBATCH" in out


def test_the_license_is_an_spdx_string():
    """A license table draws setuptools' deprecation warning on every install (PEP 639)."""
    import tomllib

    from tests.qsgd_emu.test_readme import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert any(r.startswith("setuptools>=77") for r in project["build-system"]["requires"])
