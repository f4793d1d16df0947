"""The what-if page's default study (DGX A100 machines, ResNet-50 measured on this CPU, 8 to
128 GPUs, every width and QSGD transport) runs to its figures in a real headless Chromium.

Its wall time is a benchmark figure (benchmarks/RESULTS.md, the engine section), not asserted
here; the timeout only bounds a hang.
"""
from __future__ import annotations

import pytest

from tests.dashboards.test_browser import assert_readable, figure, wait_figure

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_default_whatif_draws_its_figures(server, page):
    page.goto(f"{server.url}/whatif")
    page.wait_for_selector("#whatif-run")
    assert page.input_value("#whatif-sizes") == "8,16,32,64,128"
    page.click("#whatif-run")
    fig = wait_figure(page, "whatif-scaling",
                      lambda f: len(f["names"]) >= 3 and f["xs"][0] == [8, 16, 32, 64, 128], 600)
    assert fig["names"][:2] == ["fp32 allreduce", "fp16 allreduce"]
    assert {n.rsplit(" ", 1)[0] for n in fig["names"][2:]} == {
        "QSGD all-gather", "QSGD scatter-reduce-allgather"}
    # every row drawn: one point per world size on every line, all throughputs positive
    assert all(len(ys) == 5 and min(ys) > 0 for ys in fig["ys"])
    names = figure(page, "whatif-breakdown")["names"]
    assert names[0] == "compute" and "exposed communication, fp16 allreduce" in names
    assert "collective" in figure(page, "whatif-gantt")["names"]
    headline = figure(page, "whatif-headline")
    assert {"best QSGD over fp32 allreduce", "best QSGD over fp16 allreduce"} <= set(
        headline["names"])
    # what the browser drew reads cleanly: the throughput axis labelled the log
    # scale's minor ticks ("5, 2, 100, 5, 2, 10"), the breakdown's names overlapped and the
    # timeline's title was cut off at "on cluster:"
    figs = {f["title"]["text"][:20]: f for f in assert_readable(page)}
    ticks = [t["text"] for t in figs["throughput against G"]["axes"]["y"]["ticks"]]
    assert ticks and all(t[0] in "125" for t in ticks), ticks
    assert "bucket by bucket" in figs["One iteration, bucke"]["title"]["text"]
