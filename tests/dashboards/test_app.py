"""The shell: create_app, routing, the callbacks each page registers, the CLI's options."""
import pytest

from dashboards import create_app
from dashboards.app import AppContext, render_page
from dashboards.errors import DashboardError


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("app")
    return create_app(store_path=tmp / "runs.sqlite", cache_dir=str(tmp / "cache"))


def _ids(component) -> set:
    out = set()
    stack = [component]
    while stack:
        c = stack.pop()
        if isinstance(c, (list, tuple)):
            stack.extend(c)
            continue
        cid = getattr(c, "id", None)
        if cid is not None:
            out.add(cid)
        children = getattr(c, "children", None)
        if children is not None and not isinstance(children, str):
            stack.append(children)
    return out


def test_every_page_is_routed_and_ids_are_prefixed(app):
    from dashboards.pages import PAGES

    ctx = app._qsgd_context
    by_path = {p.PATH: p for p in PAGES}
    seen = set()
    for page in PAGES:
        ids = _ids(render_page(page.PATH, "", by_path, ctx))
        assert f"{page.NAME}-page" in ids
        assert all(i.startswith(page.NAME + "-") for i in ids), page.NAME
        assert not ids & seen  # no id shared between pages
        seen |= ids
    assert "whatif-page" in _ids(render_page("/", None, by_path, ctx))
    assert "not-found" in _ids(render_page("/nope", None, by_path, ctx))
    shell = _ids(app.layout)
    assert {"url", "page-content", "nav-whatif", "nav-topology", "nav-live", "nav-validation"} <= shell


def test_url_query_restores_whatif_inputs(app):
    from dashboards.pages import PAGES, whatif

    by_path = {p.PATH: p for p in PAGES}
    page = render_page("/whatif", "?sizes=2%2C4&bits=32%2C4&model=mlp&metric=iteration_s"
                                  "&attention=flash1&checkpointing=blocks",
                       by_path, app._qsgd_context)
    values = {}
    stack = [page]
    while stack:
        c = stack.pop()
        if isinstance(c, (list, tuple)):
            stack.extend(c)
            continue
        if getattr(c, "id", None) in whatif.QUERY_IDS.values():
            values[c.id] = getattr(c, "value", None)
        ch = getattr(c, "children", None)
        if ch is not None and not isinstance(ch, str):
            stack.append(ch)
    assert values["whatif-sizes"] == "2,4"
    assert values["whatif-bits"] == [32, 4]
    assert values["whatif-model"] == "mlp"
    assert values["whatif-metric"] == "iteration_s"
    assert (values["whatif-attention"], values["whatif-checkpointing"]) == ("flash1", "blocks")
    # every field the URL holds is on the page
    assert set(values) == set(whatif.QUERY_IDS.values())


def test_callbacks_registered(app):
    outputs = " ".join(app.callback_map)
    for target in ("page-content.children", "whatif-results.data", "whatif-download.data",
                   "url.search", "topology-graph.figure", "topology-sim.data",
                   "live-state.data", "live-loss.figure", "validation-scatter.figure"):
        assert target in outputs, target
    # Long jobs are background callbacks (their own processes, progress and cancel).
    background = [k for k, v in app.callback_map.items() if v.get("background")]
    assert any("whatif-results.data" in k for k in background)
    assert any("topology-sim.data" in k for k in background)


def test_context_validation():
    with pytest.raises(DashboardError, match="live_interval_ms: must be an int >= 100 ms, got 5"):
        AppContext(store_path=None, cache_dir="/tmp", manager=None, live_interval_ms=5)


def test_cli_options():
    from qsgd_emu.cli import build_parser, main

    args = build_parser(["dashboard"]).parse_args(["dashboard"])
    assert (args.host, args.port, args.store, args.debug) == ("127.0.0.1", 8050, None, False)
    args = build_parser(["dashboard"]).parse_args(
        ["dashboard", "--host", "0.0.0.0", "--port", "9000", "--store", "x.sqlite", "--debug"])
    assert (args.host, args.port, args.store, args.debug) == ("0.0.0.0", 9000, "x.sqlite", True)
    with pytest.raises(SystemExit) as exc:
        main(["dashboard", "--port", "70000"])
    assert exc.value.code == 2
