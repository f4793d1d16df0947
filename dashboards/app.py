"""The dashboard's shell: navigation, URL routing, the background-callback manager.

``create_app`` builds a fresh :class:`dash.Dash` each call (tests build several); nothing is
computed at import time. Pages live in :mod:`dashboards.pages`, one module each, registered
in :data:`dashboards.pages.PAGES`; each exposes ``PATH``, ``TITLE``, ``layout(query, ctx)``
and ``register(app, ctx)``, and prefixes its component ids with its name.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import dash
from dash import Input, Output, State, dcc, html

from dashboards.errors import DashboardError
from dashboards.forms import MAX_UPLOAD_BYTES


@dataclass(frozen=True)
class AppContext:
    """What callbacks share: where runs are stored and how background jobs run.

    Attributes
    ----------
    store_path : str or None
        Run store file (None: the RunStore default, ``$QSGD_EMU_STORE`` or ``.qsgd-emu/``).
    cache_dir : str
        Directory of the diskcache that carries background jobs' progress and results.
    manager : dash.DiskcacheManager
        The background-callback manager (one subprocess per job, so two tabs run at once).
    live_interval_ms : int
        Refresh period of the Live page (milliseconds).
    """

    store_path: str | None
    cache_dir: str
    manager: Any = field(repr=False)
    live_interval_ms: int = 1000

    def __post_init__(self):
        if not isinstance(self.live_interval_ms, int) or self.live_interval_ms < 100:
            raise DashboardError(
                f"live_interval_ms: must be an int >= 100 ms, got {self.live_interval_ms!r}")


def make_manager(cache_dir: str) -> dash.DiskcacheManager:
    """A DiskcacheManager over ``cache_dir`` (created when missing)."""
    import diskcache

    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    # Results expire after an hour: a finished job nobody polls must not fill the disk.
    return dash.DiskcacheManager(diskcache.Cache(cache_dir), expire=3600)


def _nav(pages) -> html.Nav:
    return html.Nav(
        [html.Span("qsgd-emulator", className="brand")]
        + [dcc.Link(p.TITLE, href=p.PATH, id=f"nav-{p.NAME}", className="nav-link") for p in pages],
        className="nav",
    )


def create_app(store_path: str | os.PathLike | None = None, *, cache_dir: str | None = None,
               live_interval_ms: int = 1000, title: str = "qsgd-emulator") -> dash.Dash:
    """Build the dashboard.

    Parameters
    ----------
    store_path : path, optional
        The run store the Live page reads (None: the RunStore default).
    cache_dir : str, optional
        Directory for background jobs (default: a fresh temporary directory).
    live_interval_ms : int
        Refresh period of the Live page, milliseconds.
    title : str
        Browser tab title.

    Returns
    -------
    dash.Dash
        The app; serve it with ``app.run(host=..., port=...)``.
    """
    from dashboards.pages import PAGES

    if cache_dir is None:
        cache_dir = tempfile.mkdtemp(prefix="qsgd-emu-dash-")
    ctx = AppContext(store_path=None if store_path is None else str(store_path),
                     cache_dir=str(cache_dir), manager=make_manager(str(cache_dir)),
                     live_interval_ms=live_interval_ms)
    app = dash.Dash(
        __name__, title=title, background_callback_manager=ctx.manager,
        assets_folder=str(Path(__file__).with_name("assets")),
        # Pages are rendered on navigation; the validation layout below declares all their ids.
        suppress_callback_exceptions=False,
    )
    shell = html.Div([
        dcc.Location(id="url", refresh="callback-nav"),
        _nav(PAGES),
        html.Main(id="page-content", className="page"),
    ])
    app.layout = shell
    app.validation_layout = html.Div([shell] + [p.layout({}, ctx) for p in PAGES])

    by_path = {p.PATH: p for p in PAGES}

    @app.callback(Output("page-content", "children"), Input("url", "pathname"),
                  State("url", "search"))
    def _route(pathname, search):
        return render_page(pathname, search, by_path, ctx)

    for page in PAGES:
        page.register(app, ctx)
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_UPLOAD_BYTES * 2
    app._qsgd_context = ctx  # for tests and the CLI: where jobs and runs live
    return app


def render_page(pathname: str | None, search: str | None, by_path: dict, ctx: AppContext):
    """The layout for ``pathname`` with the inputs given in the query string ``search``."""
    from dashboards.pages import PAGES

    query = dict(parse_qsl((search or "").lstrip("?")))
    if pathname in (None, "", "/"):
        return PAGES[0].layout(query, ctx)
    page = by_path.get(pathname.rstrip("/") or "/")
    if page is None:
        return html.Div([html.H2("Page not found"),
                         html.P(f"No page at {pathname!r}; pick one above.")],
                        id="not-found", className="error")
    return page.layout(query, ctx)
