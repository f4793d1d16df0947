"""``qsgd-emu train`` for real: 2 local gloo ranks (``--spawn 2``), digits, 2 epochs of 10 steps
(64 samples per rank per step), logging into a run store; plus its option errors (exit 2).

The MLP on digits is 64 -> 256 -> 128 -> 10: 50,826 parameters, one DDP bucket (under DDP's
1 MB first-bucket cap). QSGD compresses the two weight matrices (16,384 + 32,768 = 49,152
elements >= min_numel 10,000) and sends the 1,674 other elements (biases, the 10x128 output
weight) as fp32, so every byte count below is exact arithmetic.
"""
from __future__ import annotations

import json
import math

import pytest

import emulator
import qsgd
import topologies
from tests.qsgd_emu.cli_run import run_cli
from testbench.store import RunStore

P = 2                               # ranks
EPOCHS, BATCH = 2, 64
STEPS_PER_EPOCH = 1348 // (BATCH * P)  # 1,797 digits, 449 held out for test
PARAMS, COMPRESSED = 50_826, 49_152
RAW_BYTES = 4 * (PARAMS - COMPRESSED)
FP32_STEP = 2 * (P - 1) * 4 * PARAMS // P  # ring allreduce, bytes per rank per step


_main = run_cli


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return tmp_path_factory.mktemp("train") / "runs.sqlite"


@pytest.fixture(scope="module")
def train(store_path):
    """``train(*options) -> (summary, run, steps)``, each distinct run done once per module."""
    done = {}

    def run(*options):
        if options not in done:
            code, out, err = _main(["train", "--spawn", str(P), "--epochs", str(EPOCHS), "--batch-size",
                                    str(BATCH), "--seed", "0", "--store", str(store_path), "--json",
                                    *options])
            assert code == 0, err
            summary = json.loads(out)
            store = RunStore(store_path)
            done[options] = (summary, store.get_run(summary["run_id"]), store.steps(summary["run_id"]))
        return done[options]
    return run


def check_logged_run(summary, run, steps, label):
    """One store row per step with the documented metrics; accuracy at each epoch's end."""
    n = EPOCHS * STEPS_PER_EPOCH
    assert summary["world_size"] == P and summary["steps"] == n == len(steps)
    assert summary["steps_per_epoch"] == STEPS_PER_EPOCH
    assert [s["step"] for s in steps] == list(range(n))
    for s in steps:
        m = s["metrics"]
        assert math.isfinite(m["loss"]) and m["loss"] > 0
        assert m["iteration_s"] > 0 and m["samples_per_s"] == pytest.approx(BATCH * P / m["iteration_s"])
        assert m["bytes_sent"] > 0 and m["epoch"] == s["step"] // STEPS_PER_EPOCH
        assert m["predicted_iteration_s"] > 0  # the emulator on the default switch:2
    evaluated = [s["step"] for s in steps if "test_accuracy" in s["metrics"]]
    assert evaluated == [STEPS_PER_EPOCH * (e + 1) - 1 for e in range(EPOCHS)]
    assert steps[-1]["metrics"]["test_accuracy"] == pytest.approx(summary["final_test_accuracy"])
    # 20 steps of SGD reach well above chance (10 %) on digits
    assert summary["final_test_accuracy"] > 0.5
    assert steps[-1]["metrics"]["loss"] < steps[0]["metrics"]["loss"]
    assert run["kind"] == "train" and run["status"] == "finished" and run["name"] == label
    assert run["config"]["world_size"] == P and run["config"]["steps"] == n
    assert run["config"]["final_test_accuracy"] == pytest.approx(summary["final_test_accuracy"])
    assert run["config"]["bytes_sent_per_step"] == pytest.approx(summary["bytes_sent_per_step"])
    # the run ends with measured against predicted step time, and stores both
    predicted = sorted(s["metrics"]["predicted_iteration_s"] for s in steps)
    assert summary["predicted_iteration_s"] == pytest.approx(
        (predicted[(n - 1) // 2] + predicted[n // 2]) / 2)
    assert summary["topology"] == f"switch:{P}"
    assert run["config"]["iteration_s"] == pytest.approx(summary["iteration_s"])
    assert run["config"]["predicted_iteration_s"] == pytest.approx(summary["predicted_iteration_s"])
    assert run["config"]["topology"] == f"switch:{P}"


def test_the_table_ends_with_measured_against_predicted(store_path):
    code, out, err = _main(["train", "--spawn", str(P), "--epochs", "1", "--batch-size", str(BATCH),
                            "--store", str(store_path)])
    assert code == 0, err
    lines = out.splitlines()
    measured = next(ln for ln in lines if ln.strip().startswith("iteration time"))
    predicted = next(ln for ln in lines if ln.strip().startswith("predicted"))
    assert "ms measured (median)" in measured
    assert f"ms by the emulator on switch:{P} (" in predicted and "against measured)" in predicted


def bytes_per_step(steps) -> list[int]:
    return [s["metrics"]["bytes_sent"] for s in steps]


def test_fp32_allreduce(train):
    summary, run, steps = train("--compression", "fp32")
    check_logged_run(summary, run, steps, "mlp/digits fp32")
    assert set(bytes_per_step(steps)) == {FP32_STEP} == {203_304}


@pytest.mark.parametrize("transport", ["allgather", "scatter_reduce_allgather"])
def test_qsgd_4bit_sends_about_an_eighth_of_fp32(train, transport):
    summary, run, steps = train("--compression", "qsgd", "--bits", "4", "--transport", transport)
    check_logged_run(summary, run, steps, f"mlp/digits qsgd4-{transport}")
    cfg = qsgd.QSGDConfig.from_bits(4)
    if transport == "allgather":
        # (p-1) payloads of the whole compressed part, plus a ring allreduce of the fp32 rest
        want = (P - 1) * qsgd.payload_nbytes(COMPRESSED, cfg) + RAW_BYTES
    else:
        # the other rank's chunk, then this rank's re-quantized chunk (2 chunks of 24,576)
        want = 2 * qsgd.payload_nbytes(COMPRESSED // 2, cfg) + RAW_BYTES
    assert set(bytes_per_step(steps)) == {want}
    # 4 of 32 bits plus per-512 scales, headers and the uncompressed 1,674 elements: ~0.156
    ratio = want / FP32_STEP
    assert ratio == pytest.approx((COMPRESSED * 4 / 8 + 4 * COMPRESSED / 512 + RAW_BYTES) / (4 * PARAMS),
                                  rel=0.01)
    assert 0.125 < ratio < 0.17


def test_qsgd_bytes_fall_with_bits(train):
    four = train("--compression", "qsgd", "--bits", "4", "--transport", "allgather")
    fp32 = train("--compression", "fp32")
    assert four[0]["bytes_sent_per_step"] < fp32[0]["bytes_sent_per_step"] / 6


@pytest.mark.slow
def test_fp16_compress_hook(train):
    summary, run, steps = train("--compression", "fp16")
    check_logged_run(summary, run, steps, "mlp/digits fp16")
    assert set(bytes_per_step(steps)) == {FP32_STEP // 2}


@pytest.mark.slow
def test_powersgd_hook(train):
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    summary, run, steps = train("--compression", "powersgd")
    check_logged_run(summary, run, steps, "mlp/digits powersgd")
    # PyTorch's own rule decides which (out x in) matrices go as P and Q (rank 2)
    low = 0
    for n, m in ((256, 64), (128, 256), (10, 128)):
        r = min(n, m, 2)
        low += 4 * ((n + m) * r if _should_compress(n, m, r, 2)[0] else n * m)
    low += 4 * (256 + 128 + 10)  # biases: always allreduced as they are
    # plain allreduce for the first start_powerSGD_iter = 2 steps, then P and Q
    assert bytes_per_step(steps) == [FP32_STEP] * 2 + [low] * (len(steps) - 2)
    assert low == 8312


class _FakeDDP:
    """Just what compression._powersgd reads: ``module`` and ``register_comm_hook``."""

    def __init__(self, module):
        self.module = module

    def register_comm_hook(self, state, hook):
        pass


def test_powersgd_bytes_follow_torchs_compression_rule_at_the_boundary():
    """An 8x8 weight is exactly at PowerSGD's threshold (8*8 = 2 * (8+8) * 2): PyTorch sends
    it whole; bytes_sent must count 64 elements, not P and Q (32)."""
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    from testbench.training.compression import COMPRESSIONS
    from testbench.training.loop import TrainConfig

    assert not _should_compress(8, 8, 2, 2)[0]
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 20, bias=False))  # 8x8, 20x8
    comp = COMPRESSIONS["powersgd"](_FakeDDP(model), TrainConfig(compression="powersgd"), 2)
    big = 4 * (20 + 8) * 2 if _should_compress(20, 8, 2, 2)[0] else 4 * 160
    assert comp.payload_bytes(0) == 4 * (64 + 160)
    assert comp.payload_bytes(5) == 4 * 64 + big
    assert comp.bytes_sent(5) == comp.payload_bytes(5)  # ring allreduce on 2 ranks: n bytes


def test_predictor_replays_the_step_on_the_runs_ranks_only():
    """The prediction is the replay of the step's trace, of the run's 2 ranks even with a
    larger --topology."""
    from testbench.training.loop import TrainConfig
    from testbench.training.predict import make_predictor
    from tests.emulator.test_replay_limits import make_trace

    trace = make_trace()
    for compression, transport in (("fp32", "fp32"), ("qsgd", "qsgd_allgather")):
        cfg = TrainConfig(compression=compression)
        two = emulator.replay(trace, topologies.from_spec("switch:2,bw=1Gbit"), transport=transport)
        eight = emulator.replay(trace, topologies.from_spec("switch:8,bw=1Gbit"), transport=transport)
        assert eight.iteration_s > two.iteration_s * 1.05
        assert make_predictor(cfg, 2, "switch:8,bw=1Gbit")(trace) == pytest.approx(two.iteration_s,
                                                                                    rel=1e-12)
        local = emulator.replay(trace, topologies.from_spec("switch:2"), transport=transport)
        assert make_predictor(cfg, 2, None)(trace) == pytest.approx(local.iteration_s, rel=1e-12)
    assert make_predictor(TrainConfig(compression="fp32"), 2, "none") is None
    with pytest.raises(ValueError, match="fewer than the 4 ranks"):
        make_predictor(TrainConfig(compression="fp32"), 4, "switch:2")


@pytest.mark.parametrize("options, needle", [
    (["--bits", "1"], "bits: expected an int >= 2"),
    (["--bits", "17"], "bits: expected 2..16"),
    (["--epochs", "0"], "epochs: expected an int >= 1"),
    (["--lr", "0"], "lr: must be > 0"),
    (["--hidden", "64,x"], "--hidden"),
    (["--spawn", "0"], "--spawn: expected a number of ranks >= 1"),
    (["--model", "resnet50"], "model: expected one of ['mlp']"),
    (["--topology", "nosuchfamily:2"], "nosuchfamily"),
    (["--topology", "switch:1"], "fewer than the 2 ranks"),
    (["--compression", "topk"], "invalid choice: 'topk'"),
    (["--transport", "ring"], "invalid choice: 'ring'"),
])
def test_bad_options_fail_with_one_line_and_exit_2(tmp_path, options, needle):
    store = tmp_path / "runs.sqlite"
    argv = ["train", "--store", str(store), "--epochs", "1"]
    if "--spawn" not in options:
        argv += ["--spawn", "2"]
    code, out, err = _main(argv + options)
    assert code == 2
    assert needle in err and "Traceback" not in err
    # nothing was started: no run in the store
    if store.exists():
        assert RunStore(store).list_runs() == []


def test_a_bit_policy_sizes_each_bucket_by_its_width(train, tmp_path_factory):
    # DDP buckets of 0.05 MiB put the two compressed weights in different buckets after its
    # rebuild; the policy gives them 2 and 8 bits, so each step sends both payload sizes
    path = tmp_path_factory.mktemp("policy") / "rec.json"
    path.write_text(json.dumps({"recommendations": [{"policy": {"layers.0.weight": 2,
                                                                 "layers.2.weight": 8}}]}))
    summary, run, steps = train("--compression", "qsgd", "--transport", "allgather",
                                "--bit-policy", str(path), "--bucket-cap-mb", "0.05")
    assert dict(map(tuple, summary["config"]["bit_policy"])) == {"layers.0.weight": 2, "layers.2.weight": 8}
    want = (P - 1) * (qsgd.payload_nbytes(16_384, qsgd.QSGDConfig.from_bits(2))
                      + qsgd.payload_nbytes(32_768, qsgd.QSGDConfig.from_bits(8))) + RAW_BYTES
    # the first step runs DDP's construction-time buckets; from the second on, the rebuilt ones
    assert set(bytes_per_step(steps)[1:]) == {want}
    code, _, err = _main(["train", "--bit-policy", str(path.parent / "missing.json"), "--no-store"])
    assert code == 2 and "missing.json" in err
