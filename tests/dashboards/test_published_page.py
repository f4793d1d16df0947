"""The Validation page's published-runs table: the command's rows, coloured by target."""
import base64
import json

import pytest

from dashboards.errors import DashboardError
from dashboards.pages import validation


@pytest.fixture(scope="module")
def out():
    from emulator.validation import validate_published

    return validate_published(ids={"grace-resnet50-tf-v100-10g-nccl"}, max_world_size=2,
                              diagnose=False)


def _url(doc) -> str:
    return "data:application/json;base64," + base64.b64encode(json.dumps(doc).encode()).decode()


def test_the_table_is_the_commands_rows_coloured_by_target(out):
    from emulator.validation import PUBLISHED_COLUMNS, published_rows

    table = validation.published_table(out)
    head, body = table.children
    assert [th.children for th in head.children.children] == [h for _, h in PUBLISHED_COLUMNS]
    rows = published_rows(out)
    assert len(body.children) == len(rows) == 3
    for tr, row in zip(body.children, rows):
        assert [td.children for td in tr.children] == [row[k] for k, _ in PUBLISHED_COLUMNS]
        for td, (key, _) in zip(tr.children, PUBLISHED_COLUMNS):
            flag = row["ok"].get(key)
            assert td.style == ({} if flag is None else validation.OK_STYLE[flag])
    summary = validation.published_summary(out)
    assert any("speedup within 0.1x" in li.children for li in summary.children)


def test_the_commands_json_uploads_and_other_files_are_refused(out):
    assert validation.load_published_upload(_url(out), "published.json")["rows"] == out["rows"]
    with pytest.raises(DashboardError, match="validation-published-upload: 'r.json' is not a "
                                             "qsgd-published-validation file"):
        validation.load_published_upload(_url({"format": "qsgd-validation-report"}), "r.json")
    assert validation.published_table(None).children == "No published runs predicted yet."
