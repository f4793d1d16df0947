"""End to end in a real headless Chromium: a real ``qsgd-emu dashboard`` server, every page.

Each test drives the page like a person (URL, typing, clicking, uploading) and asserts on the
figures that Plotly drew in the browser (trace names and counts, axis titles, values), read
back from the plot's ``data``/``layout``. Screenshots land in ``test-artifacts/dashboards/``.
"""
from __future__ import annotations

import json
import subprocess
import time
from urllib.parse import urlparse

import pytest

from tests.dashboards.conftest import ROOT, qsgd_emu
from tests.rendered import problems, read_figures

pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: Small study inputs (an MLP recorded on the meta device, timed on an H100; two world sizes;
#: one QSGD width).
# a generic switch names no GPU: the device is picked
STUDY_QUERY = "model=mlp&topology=&spec=switch:{n}&bits=32,4&sizes=2,4&bucket=512&device=H100-SXM"


def figure(page, graph_id: str) -> dict:
    """The figure Plotly drew inside ``dcc.Graph(id=graph_id)``: trace names and axis titles."""
    return page.evaluate(
        """(id) => {
            const el = document.querySelector('#' + id + ' .js-plotly-plot');
            if (!el || !el.data) return null;
            const lay = el.layout || {};
            const title = (ax) => ax && ax.title ? (ax.title.text ?? ax.title) : null;
            return {names: el.data.map(t => t.name ?? null),
                    ys: el.data.map(t => Array.from(t.y || [])),
                    xs: el.data.map(t => Array.from(t.x || [])),
                    title: title(lay), xaxis: title(lay.xaxis), yaxis: title(lay.yaxis)};
        }""", graph_id)


def wait_figure(page, graph_id: str, predicate, timeout_s: float = 60.0) -> dict:
    """Poll the drawn figure until ``predicate(fig)`` holds (the callbacks are asynchronous)."""
    deadline = time.monotonic() + timeout_s
    fig = None
    while time.monotonic() < deadline:
        fig = figure(page, graph_id)
        try:
            if fig is not None and predicate(fig):
                return fig
        except (IndexError, KeyError, TypeError, ValueError):
            pass  # not drawn yet (a placeholder figure has no traces)
        page.wait_for_timeout(250)
    raise AssertionError(f"figure {graph_id} never satisfied the condition; last: {fig}")


def error_text(page, error_id: str, timeout_s: float = 30.0) -> str:
    page.wait_for_function(
        "(id) => (document.getElementById(id)?.innerText || '').trim().length > 0",
        arg=error_id, timeout=timeout_s * 1000)
    return page.inner_text("#" + error_id)


def type_into(page, selector: str, text: str) -> None:
    """Replace a (debounced) input's text and commit it with Enter, as a person would."""
    page.fill(selector, text)
    page.press(selector, "Enter")


def upload(page, upload_id: str, name: str, data: bytes, mime="application/octet-stream"):
    page.set_input_files(f"#{upload_id} input[type=file]",
                         files=[{"name": name, "mimeType": mime, "buffer": data}])


def assert_readable(page) -> list[dict]:
    """Every figure of the page reads cleanly as drawn (tests.rendered.problems): whole
    titles, 1-2-5 log ticks, category labels apart, one meaning per colour, no two lines of
    a panel alike, the legend clear of the axes."""
    figs = [f for f in read_figures(page) if f["legend"] or f["axes"]]
    assert figs
    found = [p for f in figs for p in problems(f)]
    assert found == [], found
    return figs


def test_every_page_opens_from_the_navigation(server, page):
    page.goto(server.url + "/")
    page.wait_for_selector("#whatif-page")
    for name, marker in [("topology", "#topology-page"), ("live", "#live-page"),
                         ("validation", "#validation-page"), ("whatif", "#whatif-page")]:
        page.click(f"#nav-{name}")
        page.wait_for_selector(marker)
        assert urlparse(page.url).path == "/" + name
    page.goto(server.url + "/nowhere")
    page.wait_for_selector("#not-found")
    assert page.js_errors == []


def test_whatif_study_in_two_tabs_with_url_state_and_download(server, page, browser):
    other = browser.new_page()
    try:
        for pg in (page, other):
            pg.goto(f"{server.url}/whatif?{STUDY_QUERY}")
            pg.wait_for_selector("#whatif-run")
            assert pg.input_value("#whatif-sizes") == "2,4"
        # Both tabs start a study; both run in their own background process.
        page.click("#whatif-run")
        other.click("#whatif-run")
        fig = wait_figure(page, "whatif-scaling", lambda f: len(f["names"]) >= 2, 120)
        fig2 = wait_figure(other, "whatif-scaling", lambda f: len(f["names"]) >= 2, 120)
    finally:
        other.close()
    assert fig["xaxis"] == "GPUs" and fig["yaxis"] == "throughput (samples/s)"
    assert any(n.startswith("fp32") for n in fig["names"])
    assert any("4-bit" in n for n in fig["names"])
    assert all(xs == [2, 4] for xs in fig["xs"])
    assert fig2["names"] == fig["names"]
    speed = figure(page, "whatif-speedup")
    fp32 = speed["names"].index(next(n for n in speed["names"] if n.startswith("fp32")))
    assert speed["ys"][fp32] == pytest.approx([1.0, 1.0])
    breakdown = figure(page, "whatif-breakdown")
    assert breakdown["names"][:4] == [
        "compute", "exposed communication, fp32 allreduce",
        "exposed communication, QSGD all-gather",
        "exposed communication, QSGD scatter-reduce-allgather"]
    assert "encode + decode (total, partly hidden)" in breakdown["names"]
    gantt = figure(page, "whatif-gantt")
    assert "collective" in gantt["names"]
    headline = wait_figure(page, "whatif-headline", lambda f: len(f["names"]) >= 2)
    assert headline["names"][0] == "best QSGD over fp32 allreduce"
    assert "best QSGD over fp16 allreduce" not in headline["names"]     # no fp16 in this study
    assert_readable(page)
    # the conclusions say first what the compute model assumed
    said = page.inner_text("#whatif-conclusions").splitlines()
    assert said[0].startswith("compute assumed on switch:{n}: H100-SXM amp-bf16 at batch"), said

    # Switching the metric redraws without rerunning the study.
    page.click("#whatif-metric >> text=iteration time (s)")
    wait_figure(page, "whatif-scaling", lambda f: f["yaxis"] == "iteration time (s)", 20)

    # Changing an input puts it in the URL, so the state can be shared.
    type_into(page, "#whatif-sizes", "2,4,8")
    page.wait_for_function("() => window.location.search.includes('sizes=2%2C4%2C8')")

    with page.expect_download() as dl:
        page.click("#whatif-download-csv")
    csv_text = open(dl.value.path()).read()
    header = csv_text.splitlines()[0].split(",")
    assert "world_size" in header and "speedup_vs_fp32" in header
    assert len(csv_text.strip().splitlines()) == 1 + len(fig["names"]) * 2


def test_whatif_bad_input_shows_a_message_and_the_server_stays_up(server, page):
    page.goto(f"{server.url}/whatif?{STUDY_QUERY}")
    page.wait_for_selector("#whatif-run")
    type_into(page, "#whatif-sizes", "2,lots")
    page.click("#whatif-run")
    assert "whatif-sizes: 'lots' is not a whole number" in error_text(page, "whatif-error")
    upload(page, "whatif-trace-upload", "trace.json", b"{ not json")
    type_into(page, "#whatif-sizes", "2")
    page.click("#whatif-run")
    page.wait_for_function(
        "() => document.getElementById('whatif-error').innerText.includes('is not JSON')")
    assert "trace: trace.json" in page.inner_text("#whatif-upload-names")
    page.click("#whatif-clear-uploads")
    page.wait_for_function(
        "() => document.getElementById('whatif-upload-names').innerText === 'no uploads'")
    # a shared URL restores the activation checkpointing and the attention kernel picked
    page.goto(f"{server.url}/whatif?{STUDY_QUERY}&checkpointing=blocks_full&attention=triton")
    page.wait_for_selector("#whatif-run")
    assert page.inner_text("#whatif-checkpointing").strip() == "blocks_full"
    assert page.inner_text("#whatif-attention").strip() == "triton"
    assert server.alive()


def test_topology_graph_simulation_colours_links(server, page):
    page.goto(f"{server.url}/topology?spec=fat_tree:k=4")
    fig = wait_figure(page, "topology-graph", lambda f: "gpu" in f["names"])
    assert "switch" in fig["names"]
    type_into(page, "#topology-bytes", "16MB")
    page.click("#topology-run")
    # The links are drawn in "utilization N%" bins before any simulation (all at 0%); the
    # simulation has landed when the title names it.
    fig = wait_figure(page, "topology-graph", lambda f: "allreduce" in f["title"], 90)
    assert "ms" in fig["title"]
    used = [n for n in fig["names"] if n and n.startswith("utilization") and n != "utilization 0%"]
    assert used, fig["names"]  # a 16 MB ring allreduce keeps some links busy
    # A hover target per link, with bandwidth, latency and bytes.
    hover = page.evaluate("""() => {
        const el = document.querySelector('#topology-graph .js-plotly-plot');
        return el.data.find(t => t.name === 'links').text; }""")
    assert len(hover) == 48 and all("bandwidth" in h and "latency" in h and "bytes" in h
                                    for h in hover)


def test_topology_bad_spec_and_upload_show_messages(server, page):
    page.goto(f"{server.url}/topology?spec=ring:4")
    wait_figure(page, "topology-graph", lambda f: "gpu" in f["names"])
    # A bad spec: a message, the server up.
    type_into(page, "#topology-spec", "fat_tree:k=banana")
    assert "fat_tree:k=banana" in error_text(page, "topology-error")
    upload(page, "topology-upload", "broken.json", b'{"format": "qsgd-topology"}')
    page.wait_for_function(
        "() => document.getElementById('topology-error').innerText.includes('broken.json')")
    assert server.alive()


def test_validation_report_and_bad_log(server, page, tmp_path):
    report = {
        "format": "qsgd-validation-report", "version": 1, "topology": "switch:4",
        "calibration": {"alpha_s": 1e-4, "bandwidth": 1.2e8, "link": "ethernet",
                        "fitted_on": [1048576, 16777216]},
        "points": [
            {"op": "allreduce", "bytes": 2**20, "measured_s": 0.010, "predicted_s": 0.0105,
             "rel_error": 0.05, "held_out": False},
            {"op": "allreduce", "bytes": 2**22, "measured_s": 0.040, "predicted_s": 0.038,
             "rel_error": -0.05, "held_out": True},
            {"op": "allgather", "bytes": 2**22, "measured_s": 0.030, "predicted_s": 0.033,
             "rel_error": 0.1, "held_out": True}],
        "summary": {"median_abs_rel_error": 0.05, "max_abs_rel_error": 0.1, "points": 3}}
    page.goto(f"{server.url}/validation")
    upload(page, "validation-upload", "report.json", json.dumps(report).encode(), "application/json")
    fig = wait_figure(page, "validation-scatter", lambda f: "y = x" in f["names"])
    assert set(fig["names"]) == {"allgather", "allreduce", "y = x"}
    assert fig["xaxis"] == "measured time (s)" and fig["yaxis"] == "predicted time (s)"
    err = figure(page, "validation-errors")   # measured and predicted per size, and the error
    assert err["ys"][err["names"].index("allreduce error")] == pytest.approx([0.05, -0.05])
    assert "allgather measured" in err["names"] and "allreduce emulator" in err["names"]
    assert "median |error| 5.0%" in page.inner_text("#validation-summary")

    upload(page, "validation-upload", "garbled.log", b"this is not\nan nccl-tests log\n", "text/plain")
    assert "garbled.log" in error_text(page, "validation-error")
    assert server.alive()


def test_validation_nccl_tests_log_is_predicted(server, page):
    # A real-format nccl-tests log (2 nodes x 8 H100): predicted on the matching cluster.
    page.goto(f"{server.url}/validation")
    type_into(page, "#validation-topology", "cluster:dgx_h100x2")
    log = (ROOT / "tests/emulator/data/validation/all_reduce_perf_srun.log").read_bytes()
    upload(page, "validation-upload", "all_reduce_perf_srun.log", log, "text/plain")
    fig = wait_figure(page, "validation-scatter",
                      lambda f: f["names"] == ["allreduce", "y = x"] and len(f["xs"][0]) == 9, 90)
    assert fig["xs"][0][0] == pytest.approx(98.14e-6)
    assert all(y > 0 for y in fig["ys"][0])
    assert "predicted on cluster:dgx_h100x2" in page.inner_text("#validation-summary")


def _wait_for_run(store_path, timeout_s=60.0) -> int:
    import testbench

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if store_path.exists():
            runs = testbench.RunStore(store_path).list_runs()
            if runs:
                return max(r["id"] for r in runs)
        time.sleep(0.3)
    raise AssertionError(f"no run appeared in {store_path} within {timeout_s} s")


def test_live_run_points_appear_while_training(server, page):
    cmd = qsgd_emu() + ["train", "--model", "mlp", "--dataset", "digits", "--compression", "qsgd",
                        "--bits", "4", "--epochs", "40", "--batch-size", "32",
                        "--store", str(server.store), "--seed", "0"]
    train = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_id = _wait_for_run(server.store)
        page.goto(f"{server.url}/live")
        # The run appears in the picker (read from the store every second); pick it.
        page.click("#live-run")
        page.get_by_role("option", name=f"#{run_id} ").click()
        first = wait_figure(page, "live-loss", lambda f: len(f["ys"][0]) >= 1, 90)
        later = wait_figure(page, "live-loss", lambda f: len(f["ys"][0]) > len(first["ys"][0]), 90)
        assert later["yaxis"] == "loss" and later["xaxis"] == "step"
        it = wait_figure(page, "live-iteration-s", lambda f: len(f["names"]) == 2, 90)
        assert it["names"] == ["measured", "predicted (emulator)"]
        assert f"run #{run_id}" in page.inner_text("#live-status")
        out, _ = train.communicate(timeout=240)
    finally:
        if train.poll() is None:
            train.kill()
            train.communicate()
    assert train.returncode == 0, out[-2000:]
    # After the run ends every logged step is on the page.
    import testbench

    total = len(testbench.RunStore(server.store).steps(run_id))
    wait_figure(page, "live-loss", lambda f: len(f["ys"][0]) == total, 20)
    page.wait_for_function(
        "() => document.getElementById('live-status').innerText.includes('finished')")
