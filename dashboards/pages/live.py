"""Live page: a run from the run store, its loss, accuracy, throughput and bytes every second.

The page keeps the steps it has read in a ``dcc.Store`` and asks the store only for steps
after the last one (``RunStore.steps(run_id, after_step=...)``), so a long run costs one
small query per tick. The measured iteration time is drawn beside the emulator's prediction
(the ``predicted_iteration_s`` step metric that ``qsgd-emu train`` logs, else the run
config's ``predicted_iteration_s``).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from dash import Input, Output, State, dcc, html, no_update

from dashboards import figures
from dashboards.forms import field

NAME = "live"
PATH = "/live"
TITLE = "Live runs"

#: Steps kept in the browser per run; older ones are dropped (a plot of 20k points is plenty).
MAX_STEPS = 20_000

_PANELS = ("loss", "test_accuracy", "samples_per_s", "bytes_sent", "iteration_s")


def _store(ctx):
    import testbench

    return testbench.RunStore(ctx.store_path)


def run_options(runs: list[Mapping[str, Any]]) -> list[dict]:
    """Dropdown options for runs, newest first: ``#id name (kind, status)``."""
    out = []
    for run in sorted(runs, key=lambda r: r["id"], reverse=True):
        label = f"#{run['id']} {run.get('name') or ''} ({run.get('kind', '?')}, {run.get('status', '?')})"
        out.append({"label": label, "value": run["id"]})
    return out


def empty_state(run_id: int | None = None) -> dict:
    return {"run_id": run_id, "last_step": -1, "steps": [], "status": None, "config": {}}


def poll(store, run_id: int | None, state: Mapping[str, Any] | None) -> dict | None:
    """New state after reading the steps written since the last poll; None when unchanged.

    Parameters
    ----------
    store : testbench.RunStore
    run_id : int or None
        The selected run; a change of run starts a fresh state.
    state : dict or None
        The previous state (``run_id``, ``last_step``, ``steps``, ``status``, ``config``).
    """
    if run_id is None:
        return empty_state() if state and state.get("run_id") is not None else None
    fresh = not state or state.get("run_id") != run_id
    state = empty_state(run_id) if fresh else dict(state)
    new = store.steps(run_id, after_step=int(state["last_step"]))
    run = store.get_run(run_id)
    if not new and not fresh and run.get("status") == state.get("status"):
        return None
    steps = list(state["steps"]) + [
        {"step": int(s["step"]), "time_s": s.get("time_s"), "metrics": dict(s.get("metrics") or {})}
        for s in new
    ]
    state.update(
        steps=steps[-MAX_STEPS:],
        last_step=steps[-1]["step"] if steps else -1,
        status=run.get("status"),
        config=run.get("config") or {},
        name=run.get("name"),
    )
    return state


def predicted_iteration_s(state: Mapping[str, Any]) -> float | None:
    """The run config's prediction (seconds), used when steps carry none."""
    value = (state.get("config") or {}).get("predicted_iteration_s")
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def panel_figures(state: Mapping[str, Any] | None) -> list:
    """The five live figures for a state."""
    if not state or state.get("run_id") is None:
        return [figures.message_figure("pick a run", figures.LIVE_METRICS[m][0]) for m in _PANELS]
    pred = predicted_iteration_s(state)
    return [figures.live_figure(state["steps"], m, predicted_iteration_s=pred) for m in _PANELS]


def status_text(state: Mapping[str, Any] | None) -> str:
    if not state or state.get("run_id") is None:
        return "No run selected."
    steps = state["steps"]
    text = f"run #{state['run_id']} {state.get('name') or ''}: {state.get('status')}, {len(steps)} steps"
    if steps:
        last = steps[-1]["metrics"]
        if last.get("loss") is not None:
            text += f", last loss {last['loss']:.4g}"
        if last.get("iteration_s") is not None:
            text += f", last iteration {last['iteration_s'] * 1e3:.3g} ms"
    pred = next((s["metrics"]["predicted_iteration_s"] for s in reversed(steps)
                 if s["metrics"].get("predicted_iteration_s") is not None), None)
    pred = pred if pred is not None else predicted_iteration_s(state)
    if pred is not None:
        text += f", predicted {pred * 1e3:.3g} ms"
    return text


def layout(query: Mapping[str, str], ctx) -> Any:
    run = query.get("run")
    try:
        run = int(run) if run is not None else None
    except ValueError:
        run = None
    graphs = [dcc.Graph(id=f"live-{m.replace('_', '-')}", className="panel") for m in _PANELS]
    return html.Div([
        html.H2("Live runs"),
        html.Div([
            field("run", dcc.Dropdown(id="live-run", value=run, clearable=True,
                                      placeholder="pick a run from the store")),
        ], className="row"),
        html.Div(id="live-status", className="status"),
        html.Div(id="live-error", className="error"),
        dcc.Interval(id="live-interval", interval=ctx.live_interval_ms, n_intervals=0),
        dcc.Store(id="live-state", data=None),
        html.Div(graphs, className="grid"),
    ], id="live-page")


def register(app, ctx) -> None:
    @app.callback(Output("live-run", "options"), Output("live-error", "children"),
                  Input("live-interval", "n_intervals"), State("live-run", "options"))
    def _runs(_n, old):
        try:
            options = run_options(_store(ctx).list_runs())
        except (ValueError, RuntimeError, OSError) as exc:
            return no_update, f"run store: {exc}"
        return (no_update if options == old else options), ""

    @app.callback(Output("live-state", "data"), Input("live-interval", "n_intervals"),
                  Input("live-run", "value"), State("live-state", "data"))
    def _poll(_n, run_id, state):
        try:
            new = poll(_store(ctx), run_id, state)
        except (ValueError, RuntimeError, OSError):
            return no_update
        return no_update if new is None else new

    @app.callback([Output(f"live-{m.replace('_', '-')}", "figure") for m in _PANELS]
                  + [Output("live-status", "children")],
                  Input("live-state", "data"))
    def _draw(state):
        return panel_figures(state) + [status_text(state)]
