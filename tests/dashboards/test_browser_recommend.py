"""The Recommend page in a real headless Chromium against a real ``qsgd-emu dashboard`` server:
the background job measures an MLP here, searches, and the page draws the Pareto front, the
per-layer bits and the configuration to copy; bad input is a message naming the field."""
from __future__ import annotations

import pytest

from tests.dashboards.test_browser import error_text, type_into, wait_figure

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUERY = "model=mlp&spec=switch:{n},bw=1Gbit&size=4&device=measured&budget=variance_as_bits&value=4"


def test_recommend_draws_front_bits_and_config(server, page):
    page.goto(f"{server.url}/recommend?{QUERY}")
    page.wait_for_selector("#recommend-run")
    page.click("#recommend-run")
    front = wait_figure(page, "recommend-front", lambda f: "Pareto front" in f["names"], 180)
    assert front["names"] == ["Pareto front", "uniform widths", "recommended"]
    assert front["xaxis"] == "gradient variance increase (relative)"
    assert all(y > 0 for y in front["ys"][0]) and len(front["ys"][2]) == 1
    bits = wait_figure(page, "recommend-bits", lambda f: len(f["xs"][0]) >= 1, 30)
    assert all(2 <= b <= 8 for b in bits["ys"][0])
    assert all(name.startswith("layers.") for name in bits["xs"][0])
    text = page.inner_text("#recommend-config")
    assert "qsgd.QSGDState(" in text and "bit_policy=" in text
    assert "done:" in page.inner_text("#recommend-progress-text")
    assert page.js_errors == []


def test_recommend_bad_budget_names_the_field(server, page):
    page.goto(f"{server.url}/recommend?{QUERY}")
    page.wait_for_selector("#recommend-run")
    type_into(page, "#recommend-value", "lots")
    page.click("#recommend-run")
    assert "recommend-value: expected a number, got 'lots'" in error_text(page, "recommend-error")
    page.click("#recommend-budget")
    page.click("text=max variance increase")
    type_into(page, "#recommend-value", "-1")
    page.click("#recommend-run")
    page.wait_for_function(
        "() => document.getElementById('recommend-error').innerText.includes('budget variance must be')",
        timeout=180_000)
    assert server.alive()
