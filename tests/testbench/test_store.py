"""RunStore: schema, round trips, polling, errors, one writer + readers in other processes."""
from __future__ import annotations

import csv
import json
import multiprocessing as mp
import sqlite3
import threading
import time

import pytest

import testbench
from testbench.store import RunStore, default_path


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "runs.sqlite")


def test_schema_matches_formats_doc_and_uses_wal(store):
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cols = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in ("runs", "steps", "results")}
    assert cols["runs"] == ["id", "kind", "name", "status", "config", "created_s", "finished_s"]
    assert cols["steps"] == ["run_id", "step", "time_s", "metrics"]
    assert cols["results"] == ["id", "run_id", "kind", "payload"]
    pk = [r[1] for r in conn.execute("PRAGMA table_info(steps)") if r[5]]
    assert pk == ["run_id", "step"]


def test_run_lifecycle_and_steps_round_trip(store):
    t0 = time.time()
    rid = store.create_run("train", "mlp qsgd4", {"bits": 4, "lr": 0.1})
    assert isinstance(rid, int)
    run = store.get_run(rid)
    assert run["status"] == "running" and run["config"] == {"bits": 4, "lr": 0.1}
    assert run["created_s"] >= t0 - 1 and run["finished_s"] is None
    for step in range(5):
        store.log_step(rid, step, {"loss": 1.0 / (step + 1), "bytes_sent": 100 * step})
    store.log_step(rid, 5, {"loss": float("nan")}, time_s=123.5)
    steps = store.steps(rid)
    assert [s["step"] for s in steps] == list(range(6))
    assert steps[2]["metrics"] == {"loss": pytest.approx(1 / 3), "bytes_sent": 200}
    # A diverged loss is stored as JSON null, never as a non-standard NaN token.
    assert steps[5] == {"step": 5, "time_s": 123.5, "metrics": {"loss": None}}
    assert [s["step"] for s in store.steps(rid, after_step=3)] == [4, 5]
    assert store.steps(rid, after_step=5) == []
    store.finish_run(rid, update={"final_accuracy": 0.9})
    run = store.get_run(rid)
    assert run["status"] == "finished" and run["finished_s"] >= run["created_s"]
    assert run["config"]["final_accuracy"] == 0.9 and run["config"]["bits"] == 4


def test_list_runs_filters_by_kind_and_counts_steps(store):
    a = store.create_run("train", "a", {})
    b = store.create_run("validate", "b", {})
    store.log_step(a, 0, {"loss": 1.0})
    runs = store.list_runs()
    assert [r["id"] for r in runs] == [a, b]
    assert runs[0]["steps"] == 1 and runs[1]["steps"] == 0
    assert [r["id"] for r in store.list_runs(kind="validate")] == [b]


def test_results_round_trip(store):
    rid = store.create_run("validate", "v", {})
    r1 = store.save_result(rid, "validation-report", {"points": [1, 2], "summary": {"x": 0.5}})
    r2 = store.save_result(None, "convergence", {"rows": []})
    assert store.results(kind="validation-report") == [
        {"id": r1, "run_id": rid, "kind": "validation-report",
         "payload": {"points": [1, 2], "summary": {"x": 0.5}}}]
    assert [r["id"] for r in store.results()] == [r1, r2]
    assert [r["id"] for r in store.results(run_id=rid)] == [r1]


def test_numpy_and_torch_scalars_are_stored_as_numbers(store):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    rid = store.create_run("train", "x", {"n": np.int64(3)})
    store.log_step(rid, np.int64(0), {"loss": torch.tensor(0.25), "acc": np.float32(0.5)})
    assert store.get_run(rid)["config"] == {"n": 3}
    assert store.steps(rid)[0]["metrics"] == {"loss": 0.25, "acc": 0.5}


@pytest.mark.parametrize("call, field", [
    (lambda s, r: s.create_run("", "n", {}), "kind"),
    (lambda s, r: s.create_run("train", None, {}), "name"),
    (lambda s, r: s.create_run("train", "n", [1]), "config"),
    (lambda s, r: s.create_run("train", "n", {"f": object()}), "config.f"),
    (lambda s, r: s.log_step(r + 99, 0, {}), "run_id"),
    (lambda s, r: s.log_step(r, -1, {}), "step"),
    (lambda s, r: s.log_step(r, 1.5, {}), "step"),
    (lambda s, r: s.log_step(r, 0, "loss=1"), "metrics"),
    (lambda s, r: s.log_step(r, 0, {}, time_s=float("inf")), "time_s"),
    (lambda s, r: s.finish_run(r, "done"), "status"),
    (lambda s, r: s.get_run(r + 99), "run_id"),
    (lambda s, r: s.steps(r + 99), "run_id"),
    (lambda s, r: s.save_result(r, "", {}), "kind"),
    (lambda s, r: s.save_result(r + 99, "k", {}), "run_id"),
])
def test_bad_input_names_the_field(store, call, field):
    rid = store.create_run("train", "ok", {})
    with pytest.raises(testbench.StoreError, match=rf"^{field}\b"):
        call(store, rid)


def test_duplicate_step_is_an_error_unless_replaced(store):
    rid = store.create_run("train", "x", {})
    store.log_step(rid, 0, {"loss": 1.0})
    with pytest.raises(testbench.StoreError, match="already has step 0"):
        store.log_step(rid, 0, {"loss": 2.0})
    store.log_step(rid, 0, {"loss": 3.0}, replace=True)
    assert store.steps(rid)[0]["metrics"] == {"loss": 3.0}


def test_unusable_files_raise_store_error(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(testbench.StoreError, match="path: cannot open"):
        RunStore(junk)
    with pytest.raises(testbench.StoreError, match="is a directory"):
        RunStore(tmp_path)
    newer = tmp_path / "newer.sqlite"
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(testbench.StoreError, match="schema version 99"):
        RunStore(newer)
    with pytest.raises(testbench.StoreError, match="timeout_s"):
        RunStore(tmp_path / "x.sqlite", timeout_s=0)


def test_default_path_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("QSGD_EMU_STORE", str(tmp_path / "env.sqlite"))
    assert default_path() == tmp_path / "env.sqlite"
    RunStore().create_run("train", "x", {})
    assert (tmp_path / "env.sqlite").exists()
    monkeypatch.delenv("QSGD_EMU_STORE")
    monkeypatch.chdir(tmp_path)
    assert RunStore().path == tmp_path / ".qsgd-emu" / "runs.sqlite"


def test_memory_store_works_in_one_process():
    s = RunStore(":memory:")
    rid = s.create_run("train", "m", {})
    s.log_step(rid, 0, {"loss": 1.0})
    assert s.steps(rid)[0]["metrics"]["loss"] == 1.0


def test_exports(store, tmp_path):
    a = store.create_run("train", "a", {"bits": 8})
    store.log_step(a, 0, {"loss": 1.5, "bytes_sent": 10})
    store.log_step(a, 1, {"loss": 1.0, "test_accuracy": 0.5, "bytes_sent": 10})
    store.save_result(a, "convergence", {"ok": True})
    doc = json.loads(store.export_json(tmp_path / "out.json").read_text())
    assert doc["format"] == "qsgd-run-store-export" and doc["version"] == 1
    assert doc["runs"][0]["config"] == {"bits": 8}
    assert [s["step"] for s in doc["runs"][0]["steps"]] == [0, 1]
    assert doc["runs"][0]["results"][0]["payload"] == {"ok": True}
    with open(store.export_csv(tmp_path / "out.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["run_id", "run_name", "step", "time_s", "bytes_sent", "loss", "test_accuracy"]
    assert rows[0]["test_accuracy"] == "" and rows[1]["test_accuracy"] == "0.5"
    assert float(rows[1]["loss"]) == 1.0


def test_threads_share_one_store(store):
    rid = store.create_run("train", "t", {})
    errors = []

    def writer(offset):
        try:
            for i in range(50):
                store.log_step(rid, offset + i, {"i": i})
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k * 100,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert len(store.steps(rid)) == 200


def _write_steps(path, run_id, n, ready):
    s = RunStore(path)
    ready.wait(10)
    for i in range(n):
        s.log_step(run_id, i, {"loss": float(i)})
        time.sleep(0.002)
    s.finish_run(run_id)


def test_reader_in_this_process_sees_a_writer_process_live(tmp_path):
    path = tmp_path / "live.sqlite"
    reader = RunStore(path)
    rid = reader.create_run("train", "live", {})
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_write_steps, args=(path, rid, 200, ready))
    p.start()
    seen, last, polls = [], -1, 0
    try:
        ready.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = reader.steps(rid, after_step=last)
            polls += 1
            seen += [s["step"] for s in new]
            if new:
                last = new[-1]["step"]
            if reader.get_run(rid)["status"] == "finished" and last == 199:
                break
            time.sleep(0.005)
    finally:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    assert p.exitcode == 0
    # Polling after the last step seen returns each step exactly once, in order.
    assert seen == list(range(200))
    assert polls > 1
