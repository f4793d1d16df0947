"""qsgd-emu simulate --exact (default) / --approx [TOL]: the engine's mode from the CLI."""
import json

import pytest

from qsgd_emu.cli import main

ARGS = ["simulate", "--topology", "fat_tree:k=4", "--op", "alltoall", "--algorithm", "direct",
        "--bytes", "10MB", "--json"]


def _run(capsys, *extra):
    assert main([*ARGS, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_exact_is_the_default_and_approx_is_close(capsys):
    default, exact = _run(capsys), _run(capsys, "--exact")
    assert default == exact
    approx = _run(capsys, "--approx")
    loose = _run(capsys, "--approx", "0.05")
    for r in (approx, loose):
        assert r["time_s"] == pytest.approx(exact["time_s"], rel=0.05)
        assert r["events"] <= exact["events"]


def test_approx_in_a_sweep(capsys):
    assert main(["simulate", "--topology", "switch:8", "--op", "alltoall", "--algorithm",
                 "direct", "--min-bytes", "1MB", "--max-bytes", "4MB", "--approx", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["size"] for r in rows] == [1_000_000, 2_000_000, 4_000_000]


@pytest.mark.parametrize("extra, words", [
    (["--approx", "x"], "--approx 'x' is not a number"),
    (["--approx", "0.6"], "--approx '0.6' must be a fraction in (0, 0.5)"),
    (["--approx", "0"], "--approx '0'"),
])
def test_bad_approx(capsys, extra, words):
    assert main([*ARGS, *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_exact_and_approx_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        main([*ARGS, "--exact", "--approx"])
    assert "not allowed with argument" in capsys.readouterr().err
