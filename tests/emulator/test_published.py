"""The registry of published training runs: every file read, bad files refused in one line
naming the file and the field, the whole registry predicted, and the command."""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re

import pytest

import qsgd
import topologies
from emulator.errors import TraceError
from emulator.validation import load_published, predict_case, validate_published
from emulator.validation.compute import load_cases
from emulator.validation.published import (DEFAULT_DIR, build_topology, load_run,
                                           method_transport, topology_spec)
from emulator.validation.publishedrun import TARGETS, predict_run, summarize
from emulator.validation.publishedtable import summary_lines, table_rows, text_lines, to_html

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGISTRY = os.path.join(ROOT, DEFAULT_DIR)
GRACE = os.path.join(REGISTRY, "grace-resnet50-tf-v100-10g-mpi.json")


@pytest.fixture(scope="module")
def registry():
    return load_published()


@pytest.fixture(scope="module")
def predicted():
    # the whole registry; points of more than 16 GPUs (the K80 clusters') left out for time
    return validate_published(max_world_size=16, diagnose=False)


def test_every_file_reads_and_the_registry_holds_what_the_issue_asks(registry):
    assert len(registry) == len([n for n in os.listdir(REGISTRY) if n.endswith(".json")])
    points = [p for r in registry for p in r.points]
    sources = {r.source for r in registry}
    assert len(points) >= 15 and len(sources) >= 5
    compressed = [(r.network["nic_gbit"], p) for r in registry for p in r.points
                  if p.method != "none" and r.baseline(p.world_size) is not None]
    assert len(compressed) >= 6 and len({gbit for gbit, _ in compressed}) >= 2
    # llm-foundry's A100 MPT-7B rows and its large-scale H100 rows checkpoint every block,
    # torchtitan's with its selective op policy
    assert {r.id: r.activation_checkpointing for r in registry
            if r.activation_checkpointing != "none"} == \
        {"llmfoundry-mpt7b-fsdp-a100-40gb-bf16": "blocks_full",
         **{f"llmfoundry-mpt{m}-fsdp-h100-bf16-ckpt": "blocks" for m in ("13b", "30b", "70b")},
         **{f"torchtitan-llama3-8b-fsdp-{m}-h100": "selective" for m in ("eager", "compile")}}
    # llm-foundry's benchmark scripts default to its Triton FlashAttention (attn_impl: triton);
    # torchtitan runs PyTorch's SDPA (FlashAttention-2, the default)
    assert {r.id for r in registry if r.attention_kernel == "triton"} == \
        {r.id for r in registry if r.id.startswith("llmfoundry-")}
    assert {r.attention_kernel for r in registry if not r.id.startswith("llmfoundry-")} == {"flash2"}
    for r in registry:
        for name in r.methods:       # every method resolves to a transport or a reason
            m = method_transport(r, name)
            assert (m.transport is None) != (m.unpredicted == "")


def _write(tmp_path, doc, name="bad.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def _grace():
    with open(GRACE, encoding="utf-8") as fh:
        return json.load(fh)


def _drop(key):
    def edit(d):
        del d[key]
    return edit


def _set(*path_value):
    *path, value = path_value

    def edit(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


@pytest.mark.parametrize("edit, field", [
    (_drop("batch_size"), "field batch_size is missing"),
    (_drop("points"), "field points is missing"),
    (_set("model", "resnet51"), "field model 'resnet51' is neither a zoo model"),
    (_set("device", "TPUv4"), "field device 'TPUv4' is not one of"),
    (_set("precision", "fp64"), "field precision 'fp64' is not one of"),
    (_set("parallelism", "pipeline"), "field parallelism 'pipeline' is not one of"),
    (_set("methods", "8bit", "settings", "family", "zip"),
     "methods.8bit.settings.family='zip' is not a known GRACE compressor"),
    (_set("methods", "topk_ratio=0.5", "settings", "ratio", None),
     r"methods.topk_ratio=0.5.settings: CompressorConfig.ratio"),
    (_set("network", "nic_gbit", None), r"points\[0\]: network: network.nic_gbit is null"),
    (_set("network", "transport", "carrier-pigeon"), "field network.transport 'carrier-pigeon'"),
    (_set("points", 0, "method", "gzip"), r"points\[0\].method 'gzip' is not one of"),
    (_set("points", 0, "throughput", -3), r"points\[0\].throughput must be a number > 0"),
    (_set("points", 0, "memory_gib", "lots"),
     r"points\[0\].memory_gib must be a number > 0 \(GiB per GPU\), got 'lots'"),
    (_set("points", 0, "nodes", 9), r"points\[0\].nodes must be an int in \[1, world_size=1\]"),
    (_set("version", 2), "field format/version must be 'qsgd-published-run' version 1"),
    (_set("device_memory_gb", 0), r"field device_memory_gb must be a number > 0 \(GB a GPU\), got 0"),
    (_set("attention_kernel", "sdpa"),
     r"field attention_kernel must be one of \['flash1', 'flash2', 'triton'\], got 'sdpa'"),
    (_set("activation_checkpointing", True),
     r"field activation_checkpointing must be one of \['none', 'blocks', 'blocks_full', 'selective'\], got True"),
])
def test_a_bad_file_is_refused_in_one_line_naming_the_file_and_field(tmp_path, edit, field):
    doc = _grace()
    edit(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(TraceError) as info:
        load_run(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(path) and re.search(field, msg), msg


def test_a_registry_refuses_unreadable_files_and_unknown_references(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(TraceError, match=r"broken.json: cannot read"):
        load_published(tmp_path)
    os.remove(tmp_path / "broken.json")
    doc = _grace()
    doc["reference_run"] = "no-such-run"
    _write(tmp_path, doc, "ref.json")
    with pytest.raises(TraceError, match="field reference_run 'no-such-run' is not a registry id"):
        load_published(tmp_path)


def test_the_stated_network_becomes_one_topology(registry):
    by_id = {r.id: r for r in registry}
    grace = by_id["grace-resnet50-tf-v100-25g-mpi"]
    assert topology_spec(grace, 8, 8) == "switch:8,bw=25Gbit"
    G = build_topology(topology_spec(grace, 8, 8))
    assert {d["bandwidth"] for *_, d in G.edges(data=True)} == {25e9 / 8}
    assert topology_spec(by_id["lambda-resnet50-pt-h100-sxm5-amp"], 4, 1) == "dgx_h100"
    k80 = by_id["tfbench-resnet50-k80-p2-8xlarge-distributed"]
    spec = topology_spec(k80, 32, 4)
    G = build_topology(spec)
    assert spec == "p2_8xlarge:4,nic_bw=10Gbit" and len(topologies.gpus(G)) == 32
    assert {G.nodes[g]["model"] for g in topologies.gpus(G)} == {"K80-GK210"}
    nic = [d["bandwidth"] for a, b, d in G.edges(data=True)
           if "nic" in (G.nodes[a]["kind"], G.nodes[b]["kind"]) and
           "switch" in (G.nodes[a]["kind"], G.nodes[b]["kind"])]
    assert nic and set(nic) == {10e9 / 8}
    # torchtitan states its rate per GPU: every NIC of a DGX H100 at 400 Gbit/s
    assert topology_spec(by_id["torchtitan-llama3-8b-fsdp-eager-h100"], 128, 16) == \
        "cluster:dgx_h100x16,nic_bw=400Gbit"


def test_models_outside_the_zoo_map_onto_it(registry):
    import torch

    mpt = next(r for r in registry if r.model == "mpt-7b")
    name, args = mpt.zoo
    with torch.device("meta"):
        model = qsgd.build_model(name, **args)
    n = sum(p.numel() for p in model.parameters())
    printed = mpt.model_args["n_params_as_printed"]
    assert name == "gpt2" and abs(n / printed - 1) < 0.01     # ALiBi/no-bias differences only
    # MPT pretrains without dropout (llm-foundry's yamls): no dropout masks among the saved
    # activations, which is what lets MPT-7B at batch 6 fit an 80 GB H100 under FSDP
    assert args["dropout"] == 0.0
    assert not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def test_the_whole_registry_is_predicted_and_scored(predicted):
    rows = predicted["rows"]
    assert {r["run"] for r in rows} == set(predicted["files"])
    for r in rows:
        if r["parallelism"] == "fsdp":     # studied sharded, or refused with the memory it needs
            assert r["status"] == "predicted" or (
                r["status"].startswith("sharded study failed") and " GB " in r["status"])
        if r["status"] == "predicted":
            assert r["predicted"] > 0 and math.isfinite(r["predicted"])
            if r["published"]:
                assert r["error"] == pytest.approx(r["predicted"] / r["published"] - 1)
        else:
            assert r["predicted"] is None
    s = predicted["summary"]
    assert s["points"] == len(rows) and s["predicted"] + sum(s["unpredicted"].values()) == len(rows)
    assert s["speedup"]["points"] >= 6 and s["efficiency"]["points"] >= 15


def test_one_gpu_matches_the_compute_validator(predicted):
    # one owner: the registry's single-GPU prediction is the compute model's, nothing added
    rows = {(r["run"], r["world_size"]): r for r in predicted["rows"]}
    case = next(c for c in load_cases() if c.id == "lambda-a100-80gb-sxm-resnet50-tf32-b640")
    row = rows["lambda-resnet50-pt-a100-80gb-sxm4-tf32", 1]
    assert row["predicted"] == pytest.approx(predict_case(case)["predicted"], rel=1e-9)


def test_predictions_move_the_way_the_network_and_the_codec_say(predicted):
    rows = {(r["run"], r["method"], r["world_size"]): r for r in predicted["rows"]}
    eff = [rows[f"grace-resnet50-tf-v100-{g}-mpi", "none", 8]["predicted_efficiency"]
           for g in ("1g", "10g", "25g")]
    assert eff[0] < eff[1] < eff[2] <= 1
    # GRACE's allgather decompresses p payloads: its speedup falls as workers are added
    sp = [rows["grace-resnet50-tf-v100-10g-mpi", "qsgd_q=64", n]["predicted_speedup"]
          for n in (2, 4, 8)]
    assert sp[0] > sp[1] > sp[2]
    # at 8 workers an allgather of one byte per element receives as much as a ring allreduce
    # of four sends: no gain to pay the codec with, even at 1 Gbit/s; top-1 % pays off there
    assert rows["grace-resnet50-tf-v100-1g-mpi", "qsgd_q=64", 8]["predicted_speedup"] < 1
    assert rows["grace-resnet50-tf-v100-1g-mpi", "topk_ratio=0.01", 8]["predicted_speedup"] > 2
    # int16 levels send twice the bytes of int8 ones
    assert rows["grace-resnet50-tf-v100-10g-mpi", "qsgd_q=128", 8]["predicted"] < \
        rows["grace-resnet50-tf-v100-10g-mpi", "qsgd_q=64", 8]["predicted"]


def test_the_diagnostic_replays_with_the_published_single_gpu_speed():
    out = validate_published(ids={"grace-resnet50-tf-v100-10g-nccl"}, max_world_size=2)
    rows = {r["method"]: r for r in out["rows"]}
    given = rows["none"]["given_compute"]
    # the reference run's single GPU ran at 409.45 images/s; compute scaled to it
    assert given["predicted"] > rows["none"]["predicted"]
    assert given["predicted"] <= 2 * 409.4513000000001
    assert out["summary_given_compute"]["throughput"]["points"] == 3


def test_summaries_count_against_the_targets():
    rows = [{"error": e, "efficiency_error": f, "speedup_error": s, "status": "predicted"}
            for e, f, s in ((0.05, 0.01, None), (-0.3, 0.06, 0.12), (0.1, -0.05, -0.05))]
    rows.append({"error": None, "efficiency_error": None, "speedup_error": None, "status": "why"})
    s = summarize(rows)
    assert s["throughput"] == {"points": 3, "median_abs": 0.1, "max_abs": 0.3, "within": 2,
                               "limit": TARGETS["throughput_max"], "within_10": 2}
    assert s["efficiency"]["within"] == 2 and s["speedup"]["within"] == 1
    assert s["unpredicted"] == {"why": 1} and s["predicted"] == 3


def test_the_table_marks_misses_and_the_html_is_escaped(predicted):
    out = {"rows": predicted["rows"][:20], "summary": summarize(predicted["rows"][:20])}
    rows = table_rows(out)
    assert len(rows) == 20 and all(set(r["ok"]) == {"error", "efficiency_error", "speedup_error"}
                                   for r in rows)
    lines = text_lines(out)
    assert lines[0].startswith("run") and any("[missed]" in x or "[met]" in x for x in lines)
    evil = copy.deepcopy(out)
    evil["rows"][0]["method"] = "<script>"
    page = to_html(evil)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_the_command_prints_the_table_and_writes_json_and_html(tmp_path, capsys):
    from qsgd_emu.cli import main

    out = tmp_path / "pub"
    assert main(["validate", "published", "--ids", "grace-resnet50-tf-v100-10g-nccl",
                 "--max-world-size", "2", "--no-diagnose", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    text = cap.out
    assert "powersgd_mem" in text and "speedup within 0.1x" in text
    # never a silent wait: a line on stderr before the registry is read, one per file, the last
    # with every point (lines, not redraws: stderr is not a terminal here)
    lines = cap.err.splitlines()
    assert lines[0].startswith("validate published starting") and "\r" not in cap.err
    assert lines[-1].startswith("validate published 3/3 points")
    doc = json.loads((out / "published.json").read_text())
    assert doc["format"] == "qsgd-published-validation" and len(doc["rows"]) == 3
    assert "<table>" in (out / "published.html").read_text()
    assert main(["validate", "published", "--ids", "nope", "--out", str(out)]) == 2
    assert "ids: ['nope'] are not registry files" in capsys.readouterr().err


def test_sharded_points_go_to_a_sharded_study():
    # the registry's FSDP points are predicted by a sharded study (issue 31); one that does not
    # fit the GPU is refused with the memory it needs (test_the_whole_registry_...)
    out = validate_published(ids={"llmfoundry-mpt125m-fsdp-a100-40gb-bf16"},
                             max_world_size=16, diagnose=False)
    (row,) = out["rows"]
    assert row["status"] == "predicted" and row["parallelism"] == "fsdp"
    assert row["predicted"] > 0



def test_a_published_peak_memory_is_set_beside_the_predicted_one():
    """torchtitan prints each run's peak memory per GPU: the rows carry it (bytes) beside the
    sharded study's :func:`emulator.memory_per_gpu`, and the summary tells their error."""
    run = load_run(os.path.join(DEFAULT_DIR, "torchtitan-llama3-8b-fsdp-eager-h100.json"))
    assert [p.memory_bytes / 2 ** 30 for p in run.points] == [82.4, 67.0]
    rows = predict_run(dataclasses.replace(run, points=run.points[:1]), diagnose=False)
    row, = rows
    assert row["published_memory"] == 82.4 * 2 ** 30
    assert 40e9 < row["predicted_memory"] < 100e9
    assert row["memory_error"] == pytest.approx(row["predicted_memory"] / row["published_memory"] - 1)
    mem = summarize(rows)["memory"]
    assert mem["points"] == 1 and mem["median_abs"] == pytest.approx(abs(row["memory_error"]))
    # the runs' H100s have 96 GB (device_memory_gb); held to the catalogue's 80 GB part the
    # step, with backward's transients, does not fit, and the point is refused
    assert run.device_memory_bytes == 96 * 2 ** 30 and row["predicted_memory"] > 80 * 2 ** 30
    refused, = predict_run(dataclasses.replace(run, points=run.points[:1],
                                               device_memory_bytes=None), diagnose=False)
    assert refused["predicted"] is None and "more than the H100-SXM's 80 GiB" in refused["status"]
    assert any("memory per GPU against the published peak" in line
               for line in summary_lines({"summary": summarize(rows)}))
