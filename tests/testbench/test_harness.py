"""The harness on real gloo process groups (local ranks), and its configuration errors."""
import statistics

import pytest

from testbench import ConfigError
from qsgd_emu.cli import main
from emulator.validation import MeasuredTrace
from testbench.harness import HarnessConfig, sizes


def test_sizes_follow_nccl_tests():
    assert sizes(1 << 20, 16 << 20, 2) == [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20]
    assert sizes(1000, 10**6, 10) == [1000, 10000, 100000, 1000000]
    assert sizes(7, 7, 2) == [4]          # rounded down to whole float32 elements


@pytest.mark.parametrize("kw, field", [
    ({"ops": ("broadcast",)}, "ops"), ({"min_bytes": 0}, "min_bytes"),
    ({"min_bytes": 10, "max_bytes": 5}, "max_bytes"), ({"factor": 1}, "factor"),
    ({"iters": 0}, "iters"), ({"train_bits": (1,)}, "train_bits"),
    ({"train_transport": "ring"}, "train_transport"), ({"timeout_s": 0}, "timeout_s"),
    ({"bucket_cap_mb": 0}, "bucket_cap_mb"), ({"train_warmup": 1}, "train_warmup"),
    ({"loaded": "yes"}, "loaded"),
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
    # every other size again, while both ranks compute
    assert [(c.op, c.bytes) for c in trace.loaded] == [("allreduce", 65536), ("allgather", 65536)]
    assert all(c.extra == {"load": "compute"} and len(c.samples_s) == 9 for c in trace.loaded)


def test_spawn_reports_bad_options_before_starting(tmp_path, capsys):
    rc = main(["validate", "run", "--spawn", "2", "--out", str(tmp_path / "t.json"),
               "--min-bytes", "1MB", "--max-bytes", "1kB"])
    assert rc == 2 and "max_bytes" in capsys.readouterr().err
    rc = main(["validate", "run", "--spawn", "2", "--out", str(tmp_path / "t.json"),
               "--min-bytes", "lots"])
    assert rc == 2 and "lots" in capsys.readouterr().err


@pytest.mark.slow
def test_spawned_training_times_every_bucket_and_stores_its_replay_trace(tmp_path, capsys):
    """2 gloo ranks, an MLP of 3 x 256 hidden (0.25 MiB buckets: the output layer goes with the
    last hidden one, the others alone: 3 buckets): fp32, fp16 and
    QSGD 4-bit steps with their per-bucket timelines, and the payload trace the replay reads."""
    import emulator
    import qsgd
    import topologies

    out = tmp_path / "trace.json"
    rc = main(["validate", "run", "--spawn", "2", "--out", str(out), "--ops", "allreduce",
               "--min-bytes", "64KiB", "--max-bytes", "64KiB", "--iters", "2", "--train-bits", "4",
               "--width", "256", "--depth", "3", "--batch-size", "8", "--bucket-cap-mb", "0.25",
               "--train-warmup", "2", "--train-steps", "3", "--timeout", "60",
               "--wall-timeout", "240"])
    assert rc == 0, capsys.readouterr().err
    trace = MeasuredTrace.load(out)
    pts = {(t.transport, t.bits): t for t in trace.training}
    assert set(pts) == {("allreduce", 32), ("allreduce", 16), ("allgather", 4)}
    # the compute-alone steps again beside a running allreduce: the pace the compute keeps
    paces = {t.get("compute_pace") for t in trace.training}
    assert len(paces) == 1 and 0 < paces.pop() <= 1
    assert all(t.get("compute_busy_s") > 0 for t in trace.training)
    G = topologies.from_spec("switch:2")
    for (transport, bits), t in pts.items():
        assert t.get("buckets") == 3 and len(t.samples_s) == 3
        assert t.get("replay_transport") == {32: "fp32", 16: "fp16", 4: "qsgd_allgather"}[bits]
        tl = t.get("timeline")
        assert [b["bucket"] for b in tl] == [0, 1, 2]
        for b in tl:
            assert 0 < b["ready"] <= b["issued"] <= b["comm_done"] <= b["done"] <= t.iteration_s * 1.5
        # buckets are handed over in order during backward, after forward
        assert all(a["ready"] <= b["ready"] for a, b in zip(tl, tl[1:]))
        assert tl[0]["ready"] >= t.get("forward_end_s") * 0.5
        ptrace = qsgd.PayloadTrace.from_dict(t.get("payload_trace"))
        assert ptrace.num_buckets == 3 and ptrace.parameters == t.get("numel")
        pred = emulator.replay(ptrace, G, transport=t.get("replay_transport"), world_size=2)
        assert pred.iteration_s > 0 and len(pred.buckets) == 3
        # what a rank sends: the buckets' wire plans
        assert t.bytes_per_step == sum(emulator.bucket_plan(ptrace, k, t.get("replay_transport"), 2).wire_bytes
                                       for k in range(3))
        assert t.get("compute_s") > 0
    q = pts[("allgather", 4)]
    ptrace = qsgd.PayloadTrace.from_dict(q.get("payload_trace"))
    # the hook's own stage seconds, per bucket; the packed payloads' exact sizes
    assert all(b.encode_s > 0 and b.decode_s > 0 for b in ptrace.iterations[0].buckets)
    assert [b.payload_bytes for b in ptrace.iterations[0].buckets] == [
        qsgd.payload_nbytes(b.compressed_numel, ptrace.config) for b in ptrace.buckets]
    assert q.bytes_per_step < pts[("allreduce", 16)].bytes_per_step < pts[("allreduce", 32)].bytes_per_step


def test_no_loaded_reaches_every_spawned_rank(tmp_path):
    from qsgd_emu.cli import build_parser
    from qsgd_emu.commands.validate import _harness_argv, harness_config

    argv = ["validate", "run", "--spawn", "2", "--out", str(tmp_path / "t.json")]
    args = build_parser(argv).parse_args(argv)
    assert harness_config(args).loaded and "--no-loaded" not in _harness_argv(args)
    args = build_parser(argv + ["--no-loaded"]).parse_args(argv + ["--no-loaded"])
    assert not harness_config(args).loaded and "--no-loaded" in _harness_argv(args)
