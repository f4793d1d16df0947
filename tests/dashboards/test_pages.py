"""The pages' callbacks as plain functions: parsing forms, building graphs, drawing results."""
import base64
import json

import pytest

from dashboards import jobs, recommendjobs
from dashboards.errors import DashboardError
from dashboards.pages import recommend, topology, validation, whatif


def _data_url(data: bytes) -> str:
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode()


# --- what-if ---------------------------------------------------------------------------

FORM = dict(topology="dgx_a100", spec="", topology_upload=None, topology_filename=None,
            model="mlp", trace_upload=None, trace_filename=None, bits=[32, 4],
            bucket="512", transports=["qsgd_allgather"], sizes="8, 2,4", device=None)


def test_whatif_form_to_params():
    p = whatif.params_from_form(**FORM)
    # A machine preset grows with the world size: as many machines as the GPUs need.
    assert p == {"topology": "cluster:dgx_a100x{N}", "model": "mlp", "bits": [32, 4],
                 "bucket_size": 512,
                 "transports": ["qsgd_allgather"], "world_sizes": [2, 4, 8], "device": None,
                 "batch_size": None, "precision": None, "parallelism": "ddp",
                 "checkpointing": None, "attention": None}
    p = whatif.params_from_form(**dict(FORM, spec=" switch:{n} "))
    assert p["topology"] == "switch:{n}"
    # Only fp32/fp16 picked: no QSGD transport is needed.
    p = whatif.params_from_form(**dict(FORM, bits=[32, 16], transports=[]))
    assert p["transports"] == []


@pytest.mark.slow
def test_whatif_batch_and_precision_fields():
    p = whatif.params_from_form(**dict(FORM, batch="96", precision="amp-fp16", device="V100"))
    assert (p["batch_size"], p["precision"], p["device"]) == (96, "amp-fp16", "V100")
    with pytest.raises(DashboardError, match="whatif-batch"):
        whatif.params_from_form(**dict(FORM, batch="0"))


def test_whatif_job_times_the_batch_and_precision_asked_for(tmp_path):
    params = dict(whatif.params_from_form(**dict(FORM, sizes="8", batch="32", precision="tf32")),
                  cache_dir=str(tmp_path))
    out = jobs.whatif_job(params)
    assert {(r["batch_size"], r["precision"], r["device"]) for r in out["rows"]} == {
        (32, "tf32", "A100-80GB")}
    with pytest.raises(DashboardError, match="needs bf16 units, which V100 does not have"):
        jobs.whatif_job(dict(params, device="V100", precision="amp-bf16"))
    # the fp16 precision's operator family is recorded when asked for (a kept or uploaded
    # trace has the default ones)
    trace = jobs.workload(params, variance=False)
    assert "half" not in trace.operators.families
    out = jobs.whatif_job(dict(params, precision="fp16", trace=trace.to_dict()))
    assert {r["precision"] for r in out["rows"]} == {"fp16"}


@pytest.mark.slow
def test_whatif_records_a_7b_model_on_the_meta_device():
    # no weights and no step: the layout and the operators, which the GPU's model times; a
    # model 17x over what the page would measure on a CPU (the 70B layouts record the same
    # way, tests/qsgd/test_transformers.py, in 4x the time)
    trace = jobs.workload({"model": "llama2-7b", "bits": [32, 4], "bucket_size": 512})
    assert trace.parameters == 6_738_415_616 > 16 * jobs.CPU_MEASURE_MAX_PARAMETERS
    assert not trace.timed
    assert trace.operators.family("amp").optimizer == "adamw"


def test_measuring_on_this_cpu_still_refuses_a_model_too_big_for_it():
    # real gradients (the recommender's variance) need real steps: counted on meta, refused
    params = {"model": "llama2-70b", "bits": [32, 4], "bucket_size": 512}
    with pytest.raises(DashboardError, match="whatif-model: 'llama2-70b' has 68,976,648,192 parameters, "
                                             "more than the 400,000,000 this page measures on a CPU"):
        jobs.workload(params, run=True)


@pytest.mark.parametrize("change, message", [
    ({"topology": None, "spec": ""}, "whatif-topology: nothing selected"),
    ({"model": None}, "whatif-model: nothing selected"),
    ({"bits": []}, "whatif-bits: nothing selected"),
    ({"transports": []}, "whatif-transports: nothing selected"),
    ({"bucket": "abc"}, "whatif-bucket: 'abc' is not a number"),
    ({"sizes": "8,x"}, "whatif-sizes: 'x' is not a whole number"),
    ({"sizes": ""}, "whatif-sizes: empty"),
    ({"trace_upload": _data_url(b"{oops"), "trace_filename": "t.json"},
     r"whatif-trace-upload: 't.json' is not JSON"),
    ({"trace_upload": _data_url(b'{"format": "qsgd-measured-trace"}'), "trace_filename": "t.json"},
     "has format 'qsgd-measured-trace', expected 'qsgd-payload-trace'"),
])
def test_whatif_form_errors_name_the_field(change, message):
    with pytest.raises(DashboardError, match=message):
        whatif.params_from_form(**dict(FORM, **change))


def test_whatif_job_runs_the_form_as_submitted(tmp_path):
    """The job behind Run, on what the form gives: no device picked on a preset (its own GPU),
    a device picked for a {n} spec that names none."""
    for form, gpu in ((dict(FORM, sizes="2,16"), "A100-80GB"),
                      (dict(FORM, spec="switch:{n}", sizes="2,4", device="H100-SXM"), "H100-SXM")):
        params = dict(whatif.params_from_form(**form), cache_dir=str(tmp_path))
        out = jobs.whatif_job(params)
        sizes = params["world_sizes"]
        assert [(r["world_size"], r["bits"]) for r in out["rows"]] == [
            (w, b) for w in sizes for b in (32, 4)]
        assert all(r["device"] == gpu and r["precision"] == "amp-bf16" for r in out["rows"])
        # the timeline is the best QSGD row at the largest size, on a graph that big
        assert f"at {max(sizes)} GPUs on " in out["gantt"]["label"]
        assert out["gantt"]["world_size"] == max(sizes)
    # 16 GPUs of DGX A100 boxes: two machines joined by the fabric
    assert out["rows"][0]["topology"] == "switch:{n}"


def test_whatif_job_takes_a_sharded_strategy(tmp_path):
    """The form's data parallelism reaches the study; a strategy that reduce-scatters keeps
    QSGD's quantized reduce-scatter of the transports picked."""
    form = dict(FORM, transports=["qsgd_allgather", "qsgd_scatter_reduce_allgather"], sizes="8,16",
                parallelism="fsdp")
    out = jobs.whatif_job(dict(whatif.params_from_form(**form), cache_dir=str(tmp_path)))
    assert {r["parallelism"] for r in out["rows"]} == {"fsdp"}
    assert [r["transport"] for r in out["rows"][:2]] == ["fp32", "qsgd_scatter_reduce_allgather"]
    assert all(r["memory_per_gpu"] > 0 for r in out["rows"])


@pytest.fixture(scope="module")
def gpt2_trace() -> dict:
    """GPT-2's layout and operators recorded once on the meta device, given as an uploaded
    trace would be (each job would otherwise record them again: 3-8 s each)."""
    import qsgd

    return qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta").to_dict()


def test_whatif_job_checkpoints_activations_when_asked(tmp_path, gpt2_trace):
    """The form's activation checkpointing re-records the model's step: a batch whose
    activations do not fit an H100 under FSDP fits with every block checkpointed, and the
    conclusions say what the compute model assumed."""
    import qsgd

    form = dict(FORM, topology="dgx_h100", model="gpt2", bits=[32], transports=[], sizes="8",
                batch="96", precision="amp-bf16", parallelism="fsdp")
    params = dict(whatif.params_from_form(**form), cache_dir=str(tmp_path), trace=gpt2_trace)
    with pytest.raises(DashboardError, match="gpt2 at batch 96 per GPU needs"):
        jobs.whatif_job(params)
    out = jobs.whatif_job(dict(params, checkpointing="blocks"))
    (row,) = out["rows"]
    assert row["memory_per_gpu"] < 80e9
    assert out["conclusions"][0].startswith("compute assumed on cluster:dgx_h100x{N}: H100-SXM "
                                            "amp-bf16 at batch 96 per GPU")
    assert f"activation checkpointing: {qsgd.CHECKPOINTING['blocks']}" in out["conclusions"][0]
    # refused in one line: the measured seconds cannot be re-recorded
    with pytest.raises(DashboardError, match="whatif-checkpointing: 'blocks' re-records the "
                                             "step.*'measured' replays"):
        jobs.whatif_job(dict(params, checkpointing="blocks", device="measured"))


def test_a_sharded_job_records_the_transients_an_older_trace_lacks(gpt2_trace):
    """As the command line's studies: a trace recorded before backward's transients gets them
    where a sharded strategy reports memory, and is used as it is under DDP."""
    import qsgd

    doc = json.loads(json.dumps(gpt2_trace))
    for fam in doc["operators"]["families"].values():
        fam.pop("transient")
    older = qsgd.PayloadTrace.from_dict(doc)
    assert older.operators.without_transients
    assert jobs.with_operators(older, {"parallelism": "ddp"}) is older
    fsdp = jobs.with_operators(older, {"parallelism": "fsdp"})
    assert fsdp.operators.without_transients == ()
    assert fsdp.operators.families == qsgd.PayloadTrace.from_dict(gpt2_trace).operators.families


def test_whatif_checkpointing_field():
    assert whatif.params_from_form(**dict(FORM, checkpointing="blocks_full"))[
        "checkpointing"] == "blocks_full"
    with pytest.raises(DashboardError, match="whatif-checkpointing: 'layers' is not one of "
                                             "none, blocks, blocks_full"):
        whatif.params_from_form(**dict(FORM, checkpointing="layers"))


def test_whatif_attention_field():
    """The kernel picked reaches the study's parameters; empty is the default (None:
    FlashAttention-2); an unknown one is a one-line error naming the field and the value."""
    import emulator

    assert whatif.params_from_form(**dict(FORM, attention="triton"))["attention"] == "triton"
    assert whatif.params_from_form(**dict(FORM, attention=""))["attention"] is None
    with pytest.raises(DashboardError) as err:
        whatif.params_from_form(**dict(FORM, attention="flash3"))
    assert str(err.value) == ("whatif-attention: 'flash3' is not one of "
                              + ", ".join(emulator.ATTENTION_KERNELS))


def test_whatif_job_times_the_attention_kernel_asked_for(tmp_path, gpt2_trace):
    """GPT-2's fused attention on the kernel picked: a slower step than on FlashAttention-2,
    and the conclusions name the kernel, as ``qsgd-emu study --attention-kernel`` prints it."""
    import emulator

    form = dict(FORM, topology="dgx_h100", model="gpt2", bits=[32], transports=[], sizes="8")
    params = dict(whatif.params_from_form(**form), cache_dir=str(tmp_path), trace=gpt2_trace)
    fa2, triton = (jobs.whatif_job(dict(params, attention=name)) for name in (None, "triton"))
    assert triton["rows"][0]["iteration_s"] > fa2["rows"][0]["iteration_s"]
    for out, name in ((fa2, "flash2"), (triton, "triton")):
        assert f"; attention: {emulator.ATTENTION_KERNELS[name].label};" in out["conclusions"][0]


def test_the_assumed_line_says_when_the_attention_kernel_did_not_apply(tmp_path):
    """A trace without fused attention (the MLP) or the device "measured" times no kernel: the
    line says so rather than leave the kernel picked unmentioned."""
    for device, why in (("H100", "the trace has no fused attention operator"),
                        ("measured", "the device 'measured' replays the trace's own seconds")):
        params = whatif.params_from_form(
            topology="dgx_h100", spec="", topology_upload=None, topology_filename=None,
            model="mlp", trace_upload=None, trace_filename=None, bits=[32], bucket=512,
            transports=[], sizes="8", device=device, attention="flash1")
        params["cache_dir"] = str(tmp_path)
        (line,) = [c for c in jobs.whatif_job(params)["conclusions"]
                   if c.startswith("compute assumed")]
        assert f"attention kernel 'flash1' not applied: {why}" in line, line


def test_whatif_csv_and_empty_figures():
    rows = [{"world_size": 2, "bits": 32, "transport": "fp32"},
            {"world_size": 4, "bits": 4, "transport": "qsgd_allgather", "extra": 1.5}]
    text = whatif.rows_csv(rows)
    assert text.splitlines() == ["world_size,bits,transport,extra", "2,32,fp32,",
                                 "4,4,qsgd_allgather,1.5"]
    figs = whatif.draw(None, "throughput_samples_s")
    assert len(figs) == 5
    assert all(f.layout.annotations[0].text == "press Run to start a study" for f in figs)


def test_whatif_measures_without_variance_records_and_reuses_a_trace_with_them(tmp_path):
    """Measured on this CPU (the device "measured"; otherwise a study records on the meta
    device), a study reads no quantization-variance records, so the What-if's measurement
    skips them (half of measuring ResNet-50 on a CPU); a recommendation needs them and never
    gets a trace without them, while a What-if reuses a trace that has them."""
    params = dict(model="mlp", bits=[32, 4], bucket_size=512, cache_dir=str(tmp_path),
                  device="measured")
    quick = jobs.workload(params, variance=False)
    assert all(b.variance is None for b in quick.buckets) and quick.timed
    traces = tmp_path / "traces"
    assert sorted(p.name for p in traces.iterdir()) == ["mlp-4b-d512-novariance.json"]
    full = jobs.workload(params, run=True)                      # as the Recommend page asks
    assert all(b.variance is not None for b in full.buckets)
    assert sorted(p.name for p in traces.iterdir()) == ["mlp-4b-d512-novariance.json",
                                                        "mlp-4b-d512.json"]
    again = jobs.workload(params, variance=False)                # the full one serves a study
    assert all(b.variance is not None for b in again.buckets)
    meta = jobs.workload(dict(params, device=None))              # the What-if's default
    assert not meta.timed and sorted(p.name for p in traces.iterdir()) == [
        "mlp-4b-d512-novariance.json", "mlp-4b-d512.json"]


# --- topology --------------------------------------------------------------------------

def test_topology_graph_layout_is_deterministic_and_complete():
    a = topology.load_graph("fat_tree:k=4", None, None, "auto", 0)
    b = topology.load_graph("fat_tree:k=4", None, None, "auto", 0)
    assert a == b
    assert a["summary"]["gpus"] == 16 and a["summary"]["links"] == 48
    assert len(a["graph"]["nodes"]) == 36 and len(a["graph"]["links"]) == 48
    assert set(a["positions"]) == {n["id"] for n in a["graph"]["nodes"]}
    # Layered: every GPU on the bottom row, switches above.
    ys = {n["id"]: a["positions"][n["id"]][1] for n in a["graph"]["nodes"]}
    gpu_y = {ys[n["id"]] for n in a["graph"]["nodes"] if n["kind"] == "gpu"}
    assert len(gpu_y) == 1
    json.dumps(a)  # what the dcc.Store carries must be JSON
    s1 = topology.load_graph("ring:8", None, None, "spring", 1)["positions"]
    s2 = topology.load_graph("ring:8", None, None, "spring", 2)["positions"]
    assert s1 != s2
    assert s1 == topology.load_graph("ring:8", None, None, "spring", 1)["positions"]


def test_topology_uploaded_file_round_trip(tmp_path):
    import topologies

    G = topologies.from_spec("switch:4")
    path = topologies.save(G, tmp_path / "mine.json")
    url = _data_url(path.read_bytes())
    state = topology.load_graph(None, url, "mine.json", "auto", 0)
    assert state["summary"]["gpus"] == 4 and state["upload"]["filename"] == "mine.json"
    with pytest.raises(DashboardError, match="topology upload 'bad.json'"):
        topology.load_graph(None, _data_url(b'{"format": "qsgd-topology"}'), "bad.json", "auto", 0)
    with pytest.raises(DashboardError, match="topology: 'fat_tree:k=banana'"):
        topology.load_graph("fat_tree:k=banana", None, None, "auto", 0)
    with pytest.raises(DashboardError, match="topology-seed: -1 is outside"):
        topology.load_graph("ring:4", None, None, "auto", -1)
    with pytest.raises(DashboardError, match="layout: unknown method 'zigzag'"):
        topology.load_graph("ring:4", None, None, "zigzag", 0)


def test_topology_draw_without_and_with_simulation():
    state = topology.load_graph("switch:4", None, None, "auto", 0)
    fig = topology.draw(state, None)
    names = [t.name for t in fig.data]
    assert "gpu" in names and "switch" in names
    assert not any(n.startswith("utilization") and t.showlegend for t, n in zip(fig.data, names))
    assert topology.draw(None, None).layout.annotations[0].text == "pick a topology"


# --- validation ------------------------------------------------------------------------

def test_validation_summary_and_bad_uploads():
    pts = [{"rel_error": 0.1}, {"rel_error": -0.02}, {"rel_error": 0.04}, {"rel_error": None}]
    s = validation.summarize(pts)
    assert s == {"points": 4, "median_abs_rel_error": 0.04, "max_abs_rel_error": 0.1}
    with pytest.raises(DashboardError, match="validation-upload: no file uploaded"):
        validation.load_upload(None, None, "switch:4", "ring")
    with pytest.raises(DashboardError, match="not UTF-8"):
        validation.load_upload(_data_url(b"\xff\xfe"), "x.log", "switch:4", "ring")


REPORT = {
    "format": "qsgd-validation-report", "version": 1, "topology": "switch:4",
    "calibration": {"alpha_s": 1e-4, "bandwidth": 1.2e8, "link": "ethernet",
                    "fitted_on": [1048576, 16777216]},
    "points": [{"op": "allreduce", "bytes": 4194304, "measured_s": 0.1, "predicted_s": 0.097,
                "rel_error": -0.03, "held_out": True},
               {"op": "allreduce", "bytes": 16777216, "measured_s": 0.4, "predicted_s": 0.42,
                "rel_error": 0.05, "held_out": True}],
    "summary": {"median_abs_rel_error": 0.04, "max_abs_rel_error": 0.05, "points": 2},
}


def test_validation_report_upload_is_validated_and_drawn():
    url = _data_url(json.dumps(REPORT).encode())
    result = validation.load_upload(url, "r.json", "", "ring")
    assert [p["bytes"] for p in result["points"]] == [4194304, 16777216]
    assert result["summary"]["median_abs_rel_error"] == pytest.approx(0.04)
    scatter, errors = validation.draw(result)
    assert [t.name for t in scatter.data] == ["allreduce", "y = x"]
    assert "median |error| 4.0%" in validation.summary_text(result)
    broken = dict(REPORT, points=[{"op": "allreduce", "bytes": "many"}])
    with pytest.raises(DashboardError, match=r"validation-upload: 'bad.json': .*points\[0\]"):
        validation.load_upload(_data_url(json.dumps(broken).encode()), "bad.json", "", "ring")


def test_validation_garbled_log_names_the_file_and_the_problem():
    with pytest.raises(DashboardError, match="'garbled.log' is neither a report, a trace nor an "
                                             "nccl-tests log: .*no nccl-tests result table"):
        validation.load_upload(_data_url(b"hello\nworld\n"), "garbled.log", "switch:8", "ring")


# --- recommend -------------------------------------------------------------------------

RECOMMEND_FORM = dict(model="mlp", trace_upload=None, trace_filename=None,
                      spec="cluster:dgx_a100x{N}", size="16", budget="variance_as_bits", value="4",
                      transports=["qsgd_scatter_reduce_allgather"], device=None)


def test_recommend_times_the_topologys_gpu_unless_told_and_says_so(tmp_path):
    """No device picked: the topology's own GPU (as the What-if), never this CPU's speed; the
    configuration text says what the compute half assumed."""
    params = dict(recommend.params_from_form(**RECOMMEND_FORM), cache_dir=str(tmp_path))
    assert params["device"] == "auto"
    out = recommendjobs.recommend_job(params)
    assert out["compute"]["device"] == "A100-80GB" and out["compute"]["batch_size"] is not None
    assert "# assumed: A100-80GB" in out["text"]
    measured = recommendjobs.recommend_job(dict(params, device="measured"))
    assert measured["compute"]["device"] == "measured"
    assert measured["compute"]["backward_s"] != out["compute"]["backward_s"]
