"""Output paths are created or refused when the command line is read, before any work."""
import pytest

from tests.emulator.test_replay_limits import make_trace
from tests.qsgd_emu.cli_run import run_cli

UNWRITABLE = "/proc/qsgd-emu-nope/sub"   # /proc refuses new folders, even to root
LOG = "tests/emulator/data/validation/all_reduce_perf_srun.log"


def test_measure_creates_the_folders_of_its_output(tmp_path):
    out = tmp_path / "nodir" / "sub" / "trace.json"
    code, _, err = run_cli(["measure", "--model", "mlp", "--bits", "4", "--device", "cpu",
                            "--iterations", "1", "--batch-size", "2", "--out", str(out)])
    assert code == 0, err
    assert out.exists() and not list(out.parent.glob(".qsgd-emu-probe-*"))


@pytest.mark.parametrize("argv, before", [
    (["measure", "--model", "mlp", "--device", "cpu", "--out", f"{UNWRITABLE}/t.json"], "measuring"),
    (["validate", "import-nccl-tests", LOG, "--out", f"{UNWRITABLE}/m.json"], "wrote"),
    (["study", "--trace", "TRACE", "--world-sizes", "2", "--bits", "32", "--out", UNWRITABLE],
     "study [#"),
    (["demo", "--trace", "TRACE", "--world-sizes", "2", "--bits", "32", "--out", UNWRITABLE],
     "study [#"),
])
def test_unwritable_outputs_are_refused_before_the_work(tmp_path, argv, before):
    trace = tmp_path / "trace.json"
    make_trace().save(trace)
    argv = [str(trace) if a == "TRACE" else a for a in argv]
    code, out, err = run_cli(argv)
    assert code == 2
    # one line naming the path as given, and nothing of the work was started
    assert repr(argv[argv.index("--out") + 1]) in err and "cannot write in" in err
    assert before not in err and before not in out


def test_a_folder_is_not_an_output_file(tmp_path):
    code, _, err = run_cli(["validate", "import-nccl-tests", LOG, "--out", str(tmp_path)])
    assert code == 2 and "is a folder, not a file" in err
    (tmp_path / "f").write_text("x")
    code, _, err = run_cli(["study", "--trace", str(tmp_path / "f"), "--out", str(tmp_path / "f")])
    assert code == 2 and "is a file, not a folder" in err


def test_a_world_size_on_part_of_a_machine_is_said(tmp_path):
    trace = tmp_path / "trace.json"
    make_trace().save(trace)
    code, _, err = run_cli(["study", "--trace", str(trace), "--world-sizes", "3,8", "--bits", "32",
                            "--topology", "cluster:dgx_a100x{N}", "--device", "measured",
                            "--out", str(tmp_path / "o")])
    assert code == 0, err
    assert ("note: cluster:dgx_a100x{N} at 3 GPUs: 3 of the 8 GPUs of 1 machine take part, "
            "5 idle") in err
    assert "at 8 GPUs" not in err
