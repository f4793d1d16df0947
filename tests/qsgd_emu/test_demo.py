"""``qsgd-emu demo`` (the README's ``make run``) end to end on a reduced grid: it measures a small
model on this CPU (the MLP, batch 4, 1 iteration), replays it over both default cluster presets
at 2 and 4 GPUs for fp32 and QSGD 4-bit (both transports), writes study.csv, study.json,
report.html and trace.json under ``--out`` and prints the summary table."""
from __future__ import annotations

import csv
import json
import shutil

import os

import pytest

import qsgd
from qsgd_emu import cli
from tests.qsgd_emu.cli_run import run_cli
from qsgd_emu.commands.demo import DEFAULT_MAX_GPUS, DEFAULT_TOPOLOGIES
from emulator import read_study
from emulator.studyresult import COLUMNS
from tests.emulator.test_study import plotly_figures

COMBOS = [(32, "fp32"), (4, "qsgd_allgather"), (4, "qsgd_scatter_reduce_allgather")]


_main = run_cli


def test_defaults_are_the_readmes_main_job():
    args = cli.build_parser(["demo"]).parse_args(["demo"])
    # GPT-2 recorded on the meta device (no step runs), 8..256, 2,048 and 8,192 GPUs,
    # approximate
    assert args.model == "gpt2" and args.trace is None and args.measure_device == "meta"
    assert args.world_sizes == (8, 16, 32, 64, 128, 256, 2048, 8192)
    # the consumer boxes stop at 256 GPUs (their all-to-all has no per-machine form)
    assert DEFAULT_MAX_GPUS == {"cluster:rtx4090_boxx{N}": 256}
    assert args.bits == (32, 16, 8, 4, 2) and args.exact is False
    assert args.out == "out/demo" and args.measure_bits == 4
    # one local process per core, as many as the machine gives this process, at most 4
    assert args.workers == max(1, min(4, len(os.sched_getaffinity(0))))
    # a DGX cluster and a cluster of consumer-card boxes on 25 GbE, where communication matters
    assert DEFAULT_TOPOLOGIES == ("cluster:dgx_a100x{N}", "cluster:rtx4090_boxx{N}")
    # each topology's own GPU, at the model's training batch and the GPU's usual precision
    # (GPT-2: 12 sequences of 1024 per GPU, autocast bf16), today's codec
    assert args.device == "auto" and args.batch_size is None and args.precision is None
    assert args.codec == "today"


def test_demo_on_a_reduced_grid_writes_everything(tmp_path):
    out = tmp_path / "demo"
    code, stdout, stderr = _main(["demo", "--model", "mlp", "--measure-device", "cpu",
                                  "--measure-batch-size", "4",
                                  "--iterations", "1", "--batch-size", "64",
                                  "--world-sizes", "2,4", "--bits", "32,4", "--out", str(out)])
    assert code == 0, stderr
    # the headline figure as a PNG too, where Debian's chromium can draw it
    png = ["headline.png"] if shutil.which("chromium") else []
    assert sorted(p.name for p in out.iterdir()) == png + ["report.html", "study.csv",
                                                          "study.json", "trace.json"]

    # the measured trace: the real MLP, batch 4, one iteration, QSGD 4-bit payloads
    trace = qsgd.PayloadTrace.load(out / "trace.json")
    assert trace.model == "mlp" and trace.batch_size == 4 and trace.num_iterations == 1
    assert trace.config.bits == 4 and trace.device == "cpu" and trace.parameters == 235_146
    assert "measuring mlp (batch 4, 1 iterations, QSGD 4 bits)" in stderr
    assert "study 12/12 tasks" in stderr and "\r" not in stderr   # lines: not a terminal
    assert ("compute on cluster:dgx_a100x{N}: A100-80GB amp-bf16 at batch 64 per GPU (given)"
            in stderr)

    # rows: both default presets x (2, 4) GPUs x (fp32, QSGD 4-bit x 2 transports)
    rows = read_study(out / "study.json").rows
    want = [(t, w, b, tr) for t in DEFAULT_TOPOLOGIES for w in (2, 4) for b, tr in COMBOS]
    assert [r.key for r in rows] == want
    assert all(r.model == "mlp" and r.batch_size == 64 and r.precision == "amp-bf16" for r in rows)
    assert all(r.speedup_vs_fp32 == 1.0 for r in rows if r.transport == "fp32")
    with open(out / "study.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS
        assert [(r["topology"], int(r["world_size"])) for r in reader] == [(t, w) for t, w, _, _ in want]
    # the summary table on stdout: a header and one line per row, then where the files went
    lines = stdout.splitlines()
    assert lines[0].split()[:5] == ["topology", "GPUs", "batch/GPU", "bits", "transport"]
    table = [ln for ln in lines if ln.startswith("cluster:")
             and not ln.split()[0].endswith((",", ":"))]  # not the conclusions
    assert len(table) == len(rows)
    assert table[0].split()[:5] == ["cluster:dgx_a100x1", "2", "64", "32", "fp32"]
    assert f"{rows[0].speedup_vs_fp32:.2f}x" in table[0]
    assert str(out / "report.html") in stdout
    # the report: the headline, three study figures and a bucket timeline of a QSGD row
    figs = plotly_figures((out / "report.html").read_text(encoding="utf-8"))
    assert len(figs) == 5
    assert figs[0]["layout"]["title"]["text"].startswith("Where QSGD pays")
    assert figs[4]["layout"]["title"]["text"].startswith("One iteration, bucket by bucket")
    assert "<br>QSGD " in figs[4]["layout"]["title"]["text"]


def test_demo_records_the_model_on_the_meta_device_by_default(tmp_path):
    """No step runs by default: the model's layout and operators, timed on each topology's
    GPU (an A100 in the DGX, an RTX 4090 in the consumer box)."""
    out = tmp_path / "demo"
    code, _, stderr = _main(["demo", "--model", "mlp", "--world-sizes", "8", "--bits", "32,4",
                             "--transports", "fp32,qsgd_scatter_reduce_allgather",
                             "--out", str(out)])
    assert code == 0, stderr
    assert "recording mlp's layout and operators on the meta device" in stderr
    trace = qsgd.PayloadTrace.load(out / "trace.json")
    assert trace.device == "meta" and not trace.timed and trace.operators is not None
    rows = read_study(out / "study.json").rows
    assert {r.topology: r.device for r in rows} == {"cluster:dgx_a100x{N}": "A100-80GB",
                                                   "cluster:rtx4090_boxx{N}": "RTX4090"}
    assert {r.batch_size for r in rows} == {64} and {r.precision for r in rows} == {"amp-bf16"}


def test_demo_with_a_saved_trace_skips_measuring_and_prints_json(tmp_path):
    from tests.emulator.test_replay_limits import make_trace

    path = tmp_path / "tiny.json"
    make_trace().save(path)
    out = tmp_path / "o"
    code, stdout, stderr = _main(["demo", "--trace", str(path), "--world-sizes", "2", "--bits", "32,4",
                                  "--topology", "switch:{N}", "--device", "measured", "--json",
                                  "--out", str(out)])
    assert code == 0, stderr
    assert "measuring" not in stderr
    printed = json.loads(stdout)
    assert printed == [r.to_dict() for r in read_study(out / "study.json").rows]
    assert [(r["topology"], r["world_size"], r["transport"]) for r in printed] == [
        ("switch:{N}", 2, t) for _, t in COMBOS]
    assert all(r["model"] == "tiny" for r in printed)
    assert (out / "report.html").exists()


@pytest.mark.parametrize("options, needle", [
    (["--world-sizes", "two"], "--world-sizes must be comma-separated integers"),
    (["--bits", "1"], "StudyConfig.bits"),
])
def test_demo_bad_options_exit_2(tmp_path, options, needle):
    from tests.emulator.test_replay_limits import make_trace

    path = tmp_path / "tiny.json"
    make_trace().save(path)
    code, _, err = _main(["demo", "--trace", str(path), "--device", "measured",
                          "--out", str(tmp_path / "o"), *options])
    assert code == 2 and needle in err
    assert not (tmp_path / "o").exists()


def test_demo_reaches_8192_gpus_and_says_how_the_largest_point_was_computed(tmp_path):
    """The default topologies at 8 and 8,192 GPUs (a small model, one QSGD width): the DGX
    cluster runs both, the consumer boxes stop at 256 GPUs; at 8,192 GPUs the ring all-gather
    (millions of transfers) takes NCCL's closed form calibrated on a smaller cluster, and the
    row, the printed conclusions and the report say so; at 8 GPUs everything is the engine's."""
    out = tmp_path / "demo"
    code, stdout, stderr = _main(["demo", "--model", "mlp", "--world-sizes", "8,8192",
                                  "--bits", "4", "--transports", "qsgd_allgather",
                                  "--out", str(out)])
    assert code == 0, stderr
    rows = read_study(out / "study.json").rows
    assert [(r.topology, r.world_size) for r in rows] == [
        ("cluster:dgx_a100x{N}", 8), ("cluster:dgx_a100x{N}", 8192),
        ("cluster:rtx4090_boxx{N}", 8)]
    small, big, box = rows
    assert small.comm_method == "engine" and box.comm_method == "engine"
    assert big.topology_name == "cluster:dgx_a100x1024"
    assert big.comm_method.startswith("NCCL's closed form calibrated by the engine on ")
    assert "within 5% of the engine where both ran" in big.comm_method
    said = [ln for ln in stdout.splitlines() if ln.startswith("cluster:dgx_a100x1024, 8192 GPUs")]
    assert len(said) == 1 and "Not all by the engine: 1 of 1 rows took NCCL's closed form" in said[0]
    assert not any("Not all by the engine" in ln for ln in stdout.splitlines()
                   if ln.startswith(("cluster:dgx_a100x1,", "cluster:rtx4090_boxx1,")))
    with open(out / "study.csv", newline="") as f:
        assert [r["comm_method"] for r in csv.DictReader(f)] == [r.comm_method for r in rows]
    assert "Not all by the engine" in (out / "report.html").read_text(encoding="utf-8")
