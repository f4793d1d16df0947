"""The harness on real gloo process groups (local ranks), and its configuration errors."""
import statistics

import pytest

from testbench import ConfigError
from qsgd_emu.cli import main
from emulator.validation import MeasuredTrace
from testbench.harness import HarnessConfig, critical_busy, sizes


def test_sizes_follow_nccl_tests():
    assert sizes(1 << 20, 16 << 20, 2) == [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20]
    assert sizes(1000, 10**6, 10) == [1000, 10000, 100000, 1000000]
    assert sizes(7, 7, 2) == [4]          # rounded down to whole float32 elements


@pytest.mark.parametrize("kw, field", [
    ({"ops": ("broadcast",)}, "ops"), ({"min_bytes": 0}, "min_bytes"),
    ({"min_bytes": 10, "max_bytes": 5}, "max_bytes"), ({"factor": 1}, "factor"),
    ({"iters": 0}, "iters"), ({"train_bits": (1,)}, "train_bits"),
    ({"train_transport": "ring"}, "train_transport"), ({"timeout_s": 0}, "timeout_s"),
])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        HarnessConfig(**kw)


@pytest.mark.slow
def test_spawned_sweep_writes_a_valid_trace(tmp_path, capsys):
    out = tmp_path / "trace.json"
    rc = main(["validate", "run", "--spawn", "2", "--out", str(out), "--min-bytes", "64KiB",
               "--max-bytes", "256KiB", "--factor", "4", "--warmup", "1", "--iters", "3",
               "--train-bits", "", "--timeout", "60", "--wall-timeout", "120"])
    assert rc == 0, capsys.readouterr().err
    trace = MeasuredTrace.load(out)
    env = trace.environment
    assert env["backend"] == "gloo" and env["world_size"] == 2 and len(env["hosts"]) == 2
    assert env["source"] == "harness" and env["torch_version"]
    assert [(c.op, c.bytes) for c in trace.points()] == [
        ("allgather", 65536), ("allgather", 262144), ("allreduce", 65536), ("allreduce", 262144)]
    for c in trace.collectives:
        assert len(c.samples_s) == 3 and c.time_s == statistics.median(c.samples_s)
        assert c.algbw == pytest.approx(c.bytes / c.time_s)
        factor = 2 * (2 - 1) / 2 if c.op == "allreduce" else (2 - 1) / 2
        assert c.busbw == pytest.approx(c.algbw * factor)
    # allgather bytes are the gathered total, count the elements per rank (nccl-tests)
    ag = trace.points("allgather")[0]
    assert ag.count * 4 * 2 == ag.bytes
    assert trace.training == ()


def test_spawn_reports_bad_options_before_starting(tmp_path, capsys):
    rc = main(["validate", "run", "--spawn", "2", "--out", str(tmp_path / "t.json"),
               "--min-bytes", "1MB", "--max-bytes", "1kB"])
    assert rc == 2 and "max_bytes" in capsys.readouterr().err
    rc = main(["validate", "run", "--spawn", "2", "--out", str(tmp_path / "t.json"),
               "--min-bytes", "lots"])
    assert rc == 2 and "lots" in capsys.readouterr().err


def test_critical_busy_takes_the_slowest_rank_per_segment():
    # two ranks, two steps; each step is cut by two collectives into three segments
    seg = [[[1.0, 5.0, 1.0], [2.0, 2.0, 2.0]],
           [[3.0, 1.0, 1.0], [1.0, 1.0, 4.0]]]
    # a collective waits for the last rank: 3 + 5 + 1, not max(7, 5)
    assert critical_busy(seg) == [9.0, 2.0 + 2.0 + 4.0]
    # ranks that cut a step differently: the slower rank's whole step
    assert critical_busy([[[1.0, 2.0]], [[4.0]]]) == [4.0]
