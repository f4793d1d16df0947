"""The Validation page draws a report's measured and predicted bucket timelines side by side
(a real Dash server and headless Chromium, as the other page tests)."""
import json

import pytest

from dashboards.pages import validation
from emulator.validation import compare
from tests.dashboards.test_browser import upload, wait_figure
from tests.emulator.test_replay_validation import CAL, _trace, training_points


@pytest.fixture(scope="module")
def report():
    fp32, q = training_points()
    return compare(_trace((fp32, q)), calibration=CAL).to_dict()


def test_steps_with_timelines_become_options_and_figures(report):
    steps = validation.training_steps(report)
    assert [s["bits"] for s in steps] == [32, 4]
    opts = validation.step_options({"training": steps})
    assert [o["value"] for o in opts] == [0, 1] and opts[1]["label"].startswith("qsgd_allgather 4")
    fig = validation.draw_timeline({"training": steps}, 1)
    assert {t.name for t in fig.data} >= {"decode and average"}
    # nothing to draw: a message, not an error
    assert validation.draw_timeline({"training": steps}, 7).data == ()
    assert validation.training_steps({"training": [{"bits": 4}]}) == []


@pytest.mark.browser
@pytest.mark.slow
def test_uploaded_report_shows_the_timelines(server, page, report):
    page.goto(f"{server.url}/validation")
    upload(page, "validation-upload", "report.json", json.dumps(report).encode(), "application/json")
    fig = wait_figure(page, "validation-timeline", lambda f: "decode and average" in f["names"])
    # the last step (QSGD) is shown first: its three phases on both sides
    assert fig["names"].count("collectives (queued and on the wire)") == 2
    assert "qsgd_allgather 4 bits" in fig["title"]
    assert fig["ys"][0] == ["bucket 0", "bucket 1", "bucket 2"]
    assert server.alive()
