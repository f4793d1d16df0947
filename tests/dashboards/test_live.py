"""The Live page's polling against a real run store: incremental reads, run switches, figures."""
import pytest

from dashboards.pages import live


@pytest.fixture
def store(tmp_path):
    import testbench

    return testbench.RunStore(tmp_path / "runs.sqlite")


def test_poll_reads_only_new_steps(store):
    rid = store.create_run("train", "mlp-qsgd4", {"model": "mlp", "predicted_iteration_s": 0.02})
    assert live.poll(store, None, None) is None
    state = live.poll(store, rid, None)
    assert state["run_id"] == rid and state["steps"] == [] and state["status"] == "running"
    for step in range(3):
        store.log_step(rid, step, {"loss": 1.0 / (step + 1), "iteration_s": 0.03})
    state = live.poll(store, rid, state)
    assert [s["step"] for s in state["steps"]] == [0, 1, 2] and state["last_step"] == 2
    assert live.poll(store, rid, state) is None  # nothing new: no redraw
    store.log_step(rid, 3, {"loss": 0.2, "iteration_s": 0.03})
    state = live.poll(store, rid, state)
    assert [s["step"] for s in state["steps"]] == [0, 1, 2, 3]
    store.finish_run(rid)
    state = live.poll(store, rid, state)
    assert state["status"] == "finished" and len(state["steps"]) == 4
    # Another run: a fresh state; clearing the pick empties it.
    other = store.create_run("train", "other", {})
    fresh = live.poll(store, other, state)
    assert fresh["run_id"] == other and fresh["steps"] == []
    assert live.poll(store, None, fresh)["run_id"] is None


def test_figures_and_status_use_the_prediction(store):
    rid = store.create_run("train", "mlp", {"predicted_iteration_s": 0.02})
    for step in range(4):
        store.log_step(rid, step, {"loss": 2.0 - step * 0.1, "iteration_s": 0.025,
                                   "samples_per_s": 1000.0, "bytes_sent": 4096})
    state = live.poll(store, rid, None)
    figs = live.panel_figures(state)
    assert len(figs) == 5
    loss, acc, thr, sent, it = figs
    assert list(loss.data[0].y) == pytest.approx([2.0, 1.9, 1.8, 1.7])
    assert list(sent.data[0].y) == [4096] * 4
    assert [t.name for t in it.data] == ["measured", "predicted (emulator)"]
    assert list(it.data[1].y) == [0.02, 0.02]
    text = live.status_text(state)
    assert f"run #{rid} mlp: running, 4 steps" in text and "predicted 20 ms" in text
    assert live.status_text(None) == "No run selected."
    options = live.run_options(store.list_runs())
    assert options[0]["value"] == rid and options[0]["label"].startswith(f"#{rid} mlp")
