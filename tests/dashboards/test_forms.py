"""Input parsing at the dashboard's edge: every bad value gets a message naming the field."""
import base64
import json

import pytest

from dashboards import forms
from dashboards.errors import DashboardError


def _data_url(data: bytes, mime="application/json") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def test_int_list_sorted_unique():
    assert forms.parse_int_list(" 64, 8,16 ,8", "sizes") == (8, 16, 64)
    assert forms.parse_int_list([4, "2"], "sizes") == (2, 4)


@pytest.mark.parametrize("text, match", [
    ("", "sizes: empty"), (None, "sizes: empty"), (" , ,", "sizes: empty"),
    ("8,x", "sizes: 'x' is not a whole number"), ("0", r"sizes: 0 is outside \[1, "),
    ("8.5", "sizes: '8.5' is not a whole number"),
])
def test_int_list_errors(text, match):
    with pytest.raises(DashboardError, match=match):
        forms.parse_int_list(text, "sizes")


def test_parse_int():
    assert forms.parse_int("512", "bucket") == 512
    assert forms.parse_int(512.0, "bucket") == 512
    for bad, match in [(None, "empty"), ("abc", "'abc' is not a number"),
                       (1.5, "1.5 is not a whole number"), (0, "0 is outside")]:
        with pytest.raises(DashboardError, match="bucket: " + match):
            forms.parse_int(bad, "bucket")


def test_require_selection():
    assert forms.require_selection([4, None, 8], "bits") == [4, 8]
    with pytest.raises(DashboardError, match="bits: nothing selected"):
        forms.require_selection([], "bits")
    with pytest.raises(DashboardError, match="bits: nothing selected"):
        forms.require_selection(None, "bits")


def test_uploads():
    url = _data_url(json.dumps({"format": "x", "version": 1}).encode())
    assert forms.upload_json(url, "a.json", "up") == {"format": "x", "version": 1}
    with pytest.raises(DashboardError, match="up: no file uploaded"):
        forms.upload_json(None, None, "up")
    with pytest.raises(DashboardError, match=r"up: 'b.json' is not JSON \(line 1, column 2"):
        forms.upload_json(_data_url(b"{nope"), "b.json", "up")
    with pytest.raises(DashboardError, match="holds a JSON list, not an object"):
        forms.upload_json(_data_url(b"[1, 2]"), "c.json", "up")
    with pytest.raises(DashboardError, match="not UTF-8 text"):
        forms.upload_text(_data_url(b"\xff\xfe\x00bad"), "d.log", "up")
    with pytest.raises(DashboardError, match="not valid base64"):
        forms.upload_text("data:text/plain;base64,@@@", "e.log", "up")
    with pytest.raises(DashboardError, match="did not arrive as a base64 data URL"):
        forms.upload_text("plain text", "f.log", "up")


def test_query_round_trip():
    state = {"bits": [4, 8], "model": "resnet50", "spec": "", "device": None, "sizes": "8,16"}
    q = forms.to_query(state)
    assert q.startswith("?") and "spec" not in q and "device" not in q
    back = forms.from_query(q)
    assert back == {"bits": "4,8", "model": "resnet50", "sizes": "8,16"}
    assert forms.query_list(back, "bits", [32], int) == [4, 8]
    assert forms.query_list(back, "absent", [32], int) == [32]
    assert forms.query_list({"bits": "x,4"}, "bits", [32], int) == [32]
    assert forms.to_query({}) == ""


def test_compute_fields_restore_the_query_and_offer_the_attention_kernels():
    """The What-if's and the Recommend's compute fields: ids under the page's name, each value
    the URL's, empty (its placeholder saying the default) otherwise."""
    fields = forms.compute_fields("whatif", {"batch": "32", "attention": "triton"}, ["H100-SXM"],
                                  ["amp-bf16"], ["none", "blocks"], ["flash2", "flash1", "triton"])
    inputs = {f.children[1].id: f.children[1] for f in fields}
    assert list(inputs) == ["whatif-device", "whatif-batch", "whatif-precision",
                            "whatif-checkpointing", "whatif-attention"]
    assert [f.children[0].children for f in fields][-1] == "attention kernel"
    attention = inputs["whatif-attention"]
    assert (attention.value, attention.options) == ("triton", ["flash2", "flash1", "triton"])
    assert inputs["whatif-batch"].value == "32" and inputs["whatif-device"].value is None
    empty = forms.compute_fields("recommend", {}, [], [], [], ["flash2"])[-1].children[1]
    assert (empty.id, empty.value) == ("recommend-attention", None)
    assert empty.placeholder.startswith("FlashAttention-2")
