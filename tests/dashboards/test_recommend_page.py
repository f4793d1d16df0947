"""The Recommend page's batch, precision, activation checkpointing, attention kernel and data
parallelism: the
form's parsing and one-line errors, and the job's strategy path (``qsgd-emu recommend
--parallelism``'s, through the same emulator function)."""
from __future__ import annotations

import pytest

from dashboards import recommendjobs
from dashboards.errors import DashboardError
from dashboards.pages import recommend

FORM = dict(model="mlp", trace_upload=None, trace_filename=None, spec="cluster:dgx_a100x{N}",
            size="16", budget="bits_per_element", value="8", transports=["qsgd_allgather"],
            device=None)


def test_the_new_fields_default_to_what_the_page_did_before():
    p = recommend.params_from_form(**FORM)
    assert (p["batch_size"], p["precision"], p["checkpointing"], p["attention"],
            p["parallelism"]) == (None, None, None, None, "ddp")
    p = recommend.params_from_form(**dict(FORM, batch="96", precision="amp-fp16",
                                          checkpointing="blocks_full", attention="flash1",
                                          parallelism=["ddp"]))
    assert (p["batch_size"], p["precision"], p["checkpointing"], p["attention"],
            p["parallelism"]) == (96, "amp-fp16", "blocks_full", "flash1", "ddp")


@pytest.mark.parametrize("picked, parallelism", [
    (None, "ddp"), ([], "ddp"), (["ddp"], "ddp"), ("ddp", "ddp"),
    (["auto"], "auto"), (["fsdp", "auto"], "auto"),
    (["zero2", "fsdp", "zero2"], "zero2,fsdp"), (["ddp", "hsdp"], "ddp,hsdp"),
    ("zero3, fsdp", "zero3,fsdp"),                      # as a shared URL gives it
])
def test_parallelism_reads_as_the_clis_option(picked, parallelism):
    assert recommend.params_from_form(**dict(FORM, parallelism=picked))["parallelism"] == parallelism


def _allowed(module: str, name: str) -> str:
    import importlib

    return ", ".join(getattr(importlib.import_module(module), name))


@pytest.mark.parametrize("change, message", [
    ({"batch": "0"}, lambda: "recommend-batch: 0 is outside [1, 1048576]"),
    ({"batch": "many"}, lambda: "recommend-batch: 'many' is not a number"),
    ({"precision": "fp64"}, lambda: "recommend-precision: 'fp64' is not one of "
                                    + _allowed("emulator", "PRECISIONS")),
    ({"checkpointing": "layers"}, lambda: "recommend-checkpointing: 'layers' is not one of "
                                          + _allowed("qsgd", "CHECKPOINTING")),
    ({"attention": "flash3"}, lambda: "recommend-attention: 'flash3' is not one of "
                                      + _allowed("emulator", "ATTENTION_KERNELS")),
    ({"parallelism": ["fsdp", "pipeline"]}, lambda: "recommend-parallelism: 'pipeline' is not "
                                                    "one of auto, " + _allowed("qsgd", "STRATEGIES")),
])
def test_bad_fields_are_one_line_errors_naming_the_field(change, message):
    with pytest.raises(DashboardError) as err:
        recommend.params_from_form(**dict(FORM, **change))
    assert str(err.value) == message()


def test_the_strategy_path_picks_as_the_cli_does_and_draws_a_table(tmp_path):
    """A strategy under a bits-per-element budget: the MLP recorded on the meta device, timed
    at the batch and precision asked for; the pick is the CLI's (the same emulator function)
    and the page shows every option in a table, the pick marked, the front replaced by a
    message."""
    import emulator

    form = dict(FORM, value="4", batch="64", precision="amp-fp16", attention="triton",
                parallelism=["zero2", "fsdp", "ddp"])
    params = dict(recommend.params_from_form(**form), cache_dir=str(tmp_path))
    out = recommendjobs.recommend_job(params)
    assert not (tmp_path / "traces").exists()           # recorded on meta, not measured here
    choice = out["strategy"]
    assert {o["strategy"] for o in choice["options"]} == {"ddp", "zero2", "fsdp"}
    fits = [o for o in choice["options"] if o["fits"]]
    assert choice["best"]["iteration_s"] == min(o["iteration_s"] for o in fits)
    # the budget of 4 bits per element leaves the 4-bit QSGD options beside the dense ones
    assert {o["bits"] for o in choice["options"] if o["transport"] != "fp32"} == {4}
    assert (out["compute"]["batch_size"], out["compute"]["precision"],
            out["compute"]["device"]) == (64, "amp-fp16", "A100-80GB")
    assert out["text"].startswith(f"# {choice['best']['strategy']} with ")
    assert "# assumed: A100-80GB amp-fp16 at batch 64 per GPU" in out["text"]
    # the kernel reaches the compute model; the MLP has no fused attention for it to time
    assert out["compute"]["attention"] == "triton"
    assert "; attention kernel 'triton' not applied: the trace has no fused attention " \
        "operator" in out["text"].splitlines()[1]
    # what `qsgd-emu recommend --parallelism zero2,fsdp,ddp --max-bits-per-element 4` computes
    import qsgd

    trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")
    G = emulator.topology_for("cluster:dgx_a100x{N}", 16)
    same = emulator.strategy.recommend_parallelism(
        trace, G, world_size=16, parallelism="zero2,fsdp,ddp", budget=("bits_per_element", 4),
        compute=emulator.ComputeModel.for_topology(G, trace, batch_size=64, precision="amp-fp16"))
    assert same.to_dict() == choice

    front, bits, text, table = recommend.draw(out)
    assert front.layout.annotations[0].text == "strategy recommendation: see the table"
    assert bits.layout.annotations[0].text == "strategy recommendation: see the table"
    assert text == out["text"]
    pick, rows = table.children[0], table.children[1]
    assert pick.children.startswith(f"picked: {choice['best']['strategy']} with ")
    head, body = rows.children
    assert [th.children for th in head.children.children][:6] == [
        "strategy", "transport", "bits", "iteration ms", "memory per GPU GB", "fits"]
    assert len(body.children) == len(choice["options"])
    assert [r.className for r in body.children].count("picked") == 1
    # the widths path is drawn as before: no table
    assert recommend.draw(None)[3] == ""


def test_refusals_come_before_measuring_and_name_the_field(tmp_path):
    params = dict(recommend.params_from_form(**dict(FORM, parallelism="auto", device="measured")),
                  cache_dir=str(tmp_path))
    with pytest.raises(DashboardError, match=r"^recommend-parallelism: 'auto' compares strategies "
                                             r".*'measured' replays"):
        recommendjobs.recommend_job(params)
    with pytest.raises(DashboardError, match=r"^recommend-checkpointing: 'blocks' re-records the "
                                             r"step.*'measured' replays"):
        recommendjobs.recommend_job(dict(params, parallelism="ddp", checkpointing="blocks"))
    assert not (tmp_path / "traces").exists()


def test_a_variance_budget_on_a_trace_without_variance_says_it_was_not_applied(tmp_path):
    """An uploaded trace recorded on the meta device has no variance records: the strategy's
    variance budget is not applied, and the table's notes say so (the CLI prints the same)."""
    import qsgd

    trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta").to_dict()
    params = dict(recommend.params_from_form(**dict(FORM, budget="variance_as_bits", value="4",
                                                    parallelism="fsdp")),
                  cache_dir=str(tmp_path), trace=trace)
    out = recommendjobs.recommend_job(params)
    assert out["strategy"]["notes"][0] == "no variance budget applied: the trace has no " \
                                          "variance records"
    assert "# note: no variance budget applied" in out["text"]
    assert {o["strategy"] for o in out["strategy"]["options"]} == {"fsdp"}


def test_a_model_too_large_to_measure_here_gets_a_strategy_from_the_meta_device(tmp_path,
                                                                               monkeypatch):
    """A strategy for a model larger than the page measures on a CPU (llama2-7b: 6.7e9
    parameters; here the MLP against a lowered limit) is recorded on the meta device instead of
    refused, its variance budget said not applied; widths per bucket are still refused."""
    from dashboards import jobs

    monkeypatch.setattr(jobs, "CPU_MEASURE_MAX_PARAMETERS", 1000)
    form = dict(FORM, budget="variance_as_bits", value="4", parallelism="fsdp")
    params = dict(recommend.params_from_form(**form), cache_dir=str(tmp_path))
    out = recommendjobs.recommend_job(params)
    assert not (tmp_path / "traces").exists()           # recorded on meta, not measured here
    assert out["strategy"]["notes"][0].startswith("no variance budget applied")
    with pytest.raises(DashboardError, match=r"^recommend-model: 'mlp' has [\d,]+ parameters"):
        recommendjobs.recommend_job(dict(params, parallelism="ddp"))


def test_a_shared_url_restores_the_new_fields():
    """The page writes its fields into the URL (as the What-if page) and reads them back."""
    from dashboards import forms

    query = forms.to_query({"model": "mlp", "batch": 32, "precision": "amp-fp16",
                            "checkpointing": "blocks", "attention": "triton",
                            "parallelism": ["ddp", "fsdp"],
                            "transports": ["qsgd_allgather"]})
    values, stack = {}, [recommend.layout(forms.from_query(query), None)]
    while stack:
        c = stack.pop()
        if isinstance(c, (list, tuple)):
            stack.extend(c)
            continue
        if getattr(c, "id", None) in recommend.QUERY_IDS.values():
            values[c.id] = c.value
        if getattr(c, "children", None) is not None and not isinstance(c.children, str):
            stack.append(c.children)
    assert set(values) == set(recommend.QUERY_IDS.values())
    assert (values["recommend-batch"], values["recommend-precision"],
            values["recommend-checkpointing"], values["recommend-attention"],
            values["recommend-parallelism"], values["recommend-transports"]) == (
        "32", "amp-fp16", "blocks", "triton", ["ddp", "fsdp"], ["qsgd_allgather"])
