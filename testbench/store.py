"""The run store: an embedded SQLite database of training runs, their steps and saved results.

One writer (a training run logging a step per iteration) and many readers (the dashboard polling
for new steps) share one file. SQLite's write-ahead log gives exactly that: readers never block
the writer and always see a consistent snapshot (https://sqlite.org/wal.html). Every operation
opens its own short transaction, so a reader sees a step as soon as ``log_step`` returns.

Schema (docs/formats.md, ``PRAGMA user_version`` = :data:`SCHEMA_VERSION`)::

    runs(id INTEGER PRIMARY KEY, kind TEXT, name TEXT, status TEXT, config TEXT JSON,
         created_s REAL, finished_s REAL)
    steps(run_id, step INTEGER, time_s REAL, metrics TEXT JSON, PRIMARY KEY(run_id, step))
    results(id INTEGER PRIMARY KEY, run_id, kind TEXT, payload TEXT JSON)

Times are Unix time in seconds. JSON columns hold strict JSON: non-finite floats (a diverged
loss) are stored as ``null``.
"""
from __future__ import annotations

import csv
import json
import math
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import StoreError
from ._checks import is_int, is_number

SCHEMA_VERSION = 1

#: Environment variable naming the default store file.
ENV_VAR = "QSGD_EMU_STORE"

#: Run statuses; a run is created ``running`` and ends in one of the others.
STATUSES = ("running", "finished", "failed", "interrupted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    config TEXT NOT NULL,
    created_s REAL NOT NULL,
    finished_s REAL
);
CREATE TABLE IF NOT EXISTS steps (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    time_s REAL NOT NULL,
    metrics TEXT NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY,
    run_id INTEGER REFERENCES runs(id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_kind ON results(kind);
"""


def default_path() -> Path:
    """``$QSGD_EMU_STORE``, else ``.qsgd-emu/runs.sqlite`` under the working directory."""
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else Path.cwd() / ".qsgd-emu" / "runs.sqlite"


def _strict(value: Any, where: str) -> Any:
    """``value`` with non-finite floats replaced by None; raises on what JSON cannot hold."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise StoreError(f"{where}: key {k!r} is not a string")
            out[k] = _strict(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_strict(v, f"{where}[{i}]") for i, v in enumerate(value)]
    # numpy / torch scalars: use their Python value.
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return _strict(item(), where)
        except (TypeError, ValueError):
            pass
    raise StoreError(f"{where}: value {value!r} of type {type(value).__name__} is not JSON-serialisable")


def _dumps(value: Any, where: str) -> str:
    return json.dumps(_strict(value, where), allow_nan=False, separators=(",", ":"))


def _check_int(name: str, value, low: int) -> int:
    if not is_int(value):
        raise StoreError(f"{name}: expected an integer, got {value!r}")
    if value < low:
        raise StoreError(f"{name}: must be >= {low}, got {value}")
    return int(value)


class RunStore:
    """Runs, per-step metrics and saved results in one SQLite file (WAL mode).

    Parameters
    ----------
    path : str or PathLike, optional
        The database file; created with its parent directory when missing. None:
        :func:`default_path`. ``":memory:"`` gives a private in-memory store (one process).
    timeout_s : float
        How long a writer waits for a competing writer's lock (seconds) before
        :class:`~testbench.StoreError`.

    Notes
    -----
    Safe to share between threads (one connection, serialised by a lock) and between processes
    (each opens its own connection; after ``fork`` the child reconnects). Every public method
    raises :class:`~testbench.StoreError` for a bad argument, a missing run or an unusable file.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, timeout_s: float = 10.0):
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) \
                or not math.isfinite(timeout_s) or timeout_s <= 0:
            raise StoreError(f"timeout_s: must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.memory = str(path) == ":memory:"
        self.path = Path(":memory:") if self.memory else Path(path) if path is not None else default_path()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = None
        self._connect()

    def __repr__(self) -> str:
        return f"RunStore({str(self.path)!r})"

    # --- connection ------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        # A connection inherited over fork() must not be used (sqlite.org/howtocorrupt.html 2.6).
        target = ":memory:" if self.memory else str(self.path)
        try:
            if not self.memory:
                if self.path.is_dir():
                    raise StoreError(f"path: {str(self.path)!r} is a directory, not a store file")
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(target, timeout=self.timeout_s, isolation_level=None,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                conn.close()
                raise StoreError(f"path: {target!r} has schema version {version}; this version of "
                                 f"qsgd-emulator reads up to {SCHEMA_VERSION}")
            if not self.memory:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    conn.close()
                    raise StoreError(f"path: {target!r} cannot use write-ahead logging "
                                     f"(journal_mode={mode}); use a local file system")
                # In WAL mode NORMAL keeps the database consistent on power loss (sqlite.org/wal.html).
                conn.execute("PRAGMA synchronous = NORMAL")
            if version < SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for stmt in _SCHEMA.strip().split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise StoreError(f"path: cannot open run store {target!r}: {exc}") from None
        except OSError as exc:
            raise StoreError(f"path: cannot create run store {target!r}: {exc}") from None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _read(self, sql: str, params: Iterable = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._connect().execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"run store {str(self.path)!r}: {exc}") from None

    def _write(self, fn):
        """Run ``fn(conn)`` inside one IMMEDIATE transaction (takes the write lock up front)."""
        with self._lock:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreError(f"run store {str(self.path)!r}: cannot take the write lock within "
                                 f"{self.timeout_s:g} s: {exc}") from None
            try:
                out = fn(conn)
                conn.execute("COMMIT")
                return out
            except BaseException as exc:
                conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"run store {str(self.path)!r}: {exc}") from None
                raise

    def close(self) -> None:
        """Close this process's connection (reopened on the next call)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- runs ------------------------------------------------------------------------

    def create_run(self, kind: str, name: str, config: Mapping[str, Any] | None = None) -> int:
        """A new run in status ``running``; returns its id.

        Parameters
        ----------
        kind : str
            What made it (``"train"``, ``"validate"``, ...).
        name : str
            A human label shown by the dashboard.
        config : dict
            The run's settings (JSON-serialisable).
        """
        for field, value in (("kind", kind), ("name", name)):
            if not isinstance(value, str) or not value:
                raise StoreError(f"{field}: expected a non-empty string, got {value!r}")
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise StoreError(f"config: expected a dict, got {type(config).__name__}")
        text = _dumps(config, "config")
        now = time.time()
        return self._write(lambda c: c.execute(
            "INSERT INTO runs(kind, name, status, config, created_s) VALUES (?, ?, 'running', ?, ?)",
            (kind, name, text, now)).lastrowid)

    def _require_run(self, conn, run_id) -> int:
        run_id = _check_int("run_id", run_id, 1)
        if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            raise StoreError(f"run_id: no run {run_id} in {str(self.path)!r}")
        return run_id

    def log_step(self, run_id: int, step: int, metrics: Mapping[str, Any],
                 time_s: float | None = None, *, replace: bool = False) -> None:
        """Record the metrics of one step of a run.

        Parameters
        ----------
        run_id : int
        step : int
            0-based; each step is logged once (``replace=True`` overwrites, e.g. after a resume).
        metrics : dict
            ``loss``, ``test_accuracy``, ``bytes_sent`` (bytes), ``iteration_s`` (seconds),
            ``samples_per_s``, ... (JSON-serialisable).
        time_s : float, optional
            Unix time of the step in seconds (default: now).
        """
        step = _check_int("step", step, 0)
        if not isinstance(metrics, Mapping):
            raise StoreError(f"metrics: expected a dict, got {type(metrics).__name__}")
        text = _dumps(metrics, "metrics")
        if time_s is None:
            time_s = time.time()
        elif not is_number(time_s) or not math.isfinite(time_s):
            raise StoreError(f"time_s: expected a finite number of seconds, got {time_s!r}")

        def write(conn):
            rid = self._require_run(conn, run_id)
            verb = "INSERT OR REPLACE" if replace else "INSERT"
            try:
                conn.execute(f"{verb} INTO steps(run_id, step, time_s, metrics) VALUES (?, ?, ?, ?)",
                             (rid, step, float(time_s), text))
            except sqlite3.IntegrityError:
                raise StoreError(f"step: run {rid} already has step {step} "
                                 f"(pass replace=True to overwrite)") from None

        self._write(write)

    def log_steps(self, run_id: int, rows: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
        """Several ``(step, metrics)`` in one transaction (time: now)."""
        now = time.time()
        prepared = [(_check_int("step", s, 0), _dumps(m, f"metrics[{s}]")) for s, m in rows]

        def write(conn):
            rid = self._require_run(conn, run_id)
            try:
                conn.executemany("INSERT INTO steps(run_id, step, time_s, metrics) VALUES (?, ?, ?, ?)",
                                 [(rid, s, now, t) for s, t in prepared])
            except sqlite3.IntegrityError as exc:
                raise StoreError(f"step: run {rid} already has one of the steps: {exc}") from None

        self._write(write)

    def finish_run(self, run_id: int, status: str = "finished", *,
                   update: Mapping[str, Any] | None = None) -> None:
        """Mark a run ended (``finished``, ``failed`` or ``interrupted``).

        ``update`` merges extra keys into the run's config (e.g. the final accuracy).
        """
        if status not in STATUSES or status == "running":
            raise StoreError(f"status: expected one of {[s for s in STATUSES if s != 'running']}, "
                             f"got {status!r}")
        now = time.time()

        def write(conn):
            rid = self._require_run(conn, run_id)
            if update:
                config = json.loads(conn.execute("SELECT config FROM runs WHERE id = ?",
                                                 (rid,)).fetchone()[0])
                config.update(_strict(dict(update), "update"))
                conn.execute("UPDATE runs SET config = ? WHERE id = ?",
                             (_dumps(config, "config"), rid))
            conn.execute("UPDATE runs SET status = ?, finished_s = ? WHERE id = ?", (status, now, rid))

        self._write(write)

    @staticmethod
    def _run_dict(row: sqlite3.Row) -> dict:
        return {"id": row["id"], "kind": row["kind"], "name": row["name"], "status": row["status"],
                "config": json.loads(row["config"]), "created_s": row["created_s"],
                "finished_s": row["finished_s"]}

    def list_runs(self, kind: str | None = None) -> list[dict]:
        """Every run (optionally of one ``kind``), oldest first, with ``steps`` = steps logged."""
        sql = ("SELECT r.*, (SELECT COUNT(*) FROM steps s WHERE s.run_id = r.id) AS n_steps "
               "FROM runs r")
        rows = self._read(sql + (" WHERE kind = ? ORDER BY id" if kind else " ORDER BY id"),
                          (kind,) if kind else ())
        out = []
        for row in rows:
            d = self._run_dict(row)
            d["steps"] = row["n_steps"]
            out.append(d)
        return out

    def get_run(self, run_id: int) -> dict:
        """One run as a dict (``id``, ``kind``, ``name``, ``status``, ``config``, times)."""
        rid = _check_int("run_id", run_id, 1)
        rows = self._read("SELECT * FROM runs WHERE id = ?", (rid,))
        if not rows:
            raise StoreError(f"run_id: no run {rid} in {str(self.path)!r}")
        return self._run_dict(rows[0])

    def steps(self, run_id: int, after_step: int = -1) -> list[dict]:
        """The steps of a run with ``step > after_step``, in order.

        Each is ``{"step": int, "time_s": float, "metrics": dict}``; polling with the last step
        seen returns only what is new.
        """
        rid = _check_int("run_id", run_id, 1)
        if not is_int(after_step):
            raise StoreError(f"after_step: expected an integer, got {after_step!r}")
        rows = self._read("SELECT step, time_s, metrics FROM steps WHERE run_id = ? AND step > ? "
                          "ORDER BY step", (rid, after_step))
        if not rows and not self._read("SELECT 1 FROM runs WHERE id = ?", (rid,)):
            raise StoreError(f"run_id: no run {rid} in {str(self.path)!r}")
        return [{"step": r["step"], "time_s": r["time_s"], "metrics": json.loads(r["metrics"])}
                for r in rows]

    def delete_run(self, run_id: int) -> None:
        """Remove a run with its steps and results."""
        def write(conn):
            rid = self._require_run(conn, run_id)
            conn.execute("DELETE FROM runs WHERE id = ?", (rid,))

        self._write(write)

    # --- results ---------------------------------------------------------------------

    def save_result(self, run_id: int | None, kind: str, payload: Mapping[str, Any]) -> int:
        """Store a document (a ValidationReport, a convergence table, ...); returns its id.

        Parameters
        ----------
        run_id : int or None
            The run it belongs to, or None for a free-standing result.
        kind : str
            E.g. ``"validation-report"``, ``"convergence"``.
        payload : dict
            JSON-serialisable.
        """
        if not isinstance(kind, str) or not kind:
            raise StoreError(f"kind: expected a non-empty string, got {kind!r}")
        if not isinstance(payload, Mapping):
            raise StoreError(f"payload: expected a dict, got {type(payload).__name__}")
        text = _dumps(payload, "payload")

        def write(conn):
            rid = None if run_id is None else self._require_run(conn, run_id)
            return conn.execute("INSERT INTO results(run_id, kind, payload) VALUES (?, ?, ?)",
                                (rid, kind, text)).lastrowid

        return self._write(write)

    def results(self, kind: str | None = None, *, run_id: int | None = None) -> list[dict]:
        """Saved results (``id``, ``run_id``, ``kind``, ``payload``), oldest first."""
        where, params = [], []
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        if run_id is not None:
            where.append("run_id = ?")
            params.append(_check_int("run_id", run_id, 1))
        sql = "SELECT * FROM results" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        return [{"id": r["id"], "run_id": r["run_id"], "kind": r["kind"],
                 "payload": json.loads(r["payload"])} for r in self._read(sql, params)]

    # --- export ----------------------------------------------------------------------

    def export_json(self, path: str | os.PathLike, run_ids: Iterable[int] | None = None) -> Path:
        """Write runs (all, or ``run_ids``) with their steps and results as one JSON file.

        Format ``{"format": "qsgd-run-store-export", "version": 1, "runs": [...]}``; each run
        carries ``steps`` (a list) and ``results``.
        """
        runs = self._select(run_ids)
        doc = {"format": "qsgd-run-store-export", "version": 1, "runs": []}
        for run in runs:
            run = dict(run, steps=self.steps(run["id"]), results=self.results(run_id=run["id"]))
            doc["runs"].append(run)
        path = Path(path)
        try:
            path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
        except OSError as exc:
            raise StoreError(f"path: cannot write {str(path)!r}: {exc}") from None
        return path

    def export_csv(self, path: str | os.PathLike, run_ids: Iterable[int] | None = None) -> Path:
        """Write one CSV row per step: ``run_id, run_name, step, time_s`` then one column per metric.

        Metric columns are the union over the exported steps, sorted; a missing value is empty.
        """
        runs = self._select(run_ids)
        rows, keys = [], set()
        for run in runs:
            for s in self.steps(run["id"]):
                keys.update(s["metrics"])
                rows.append((run, s))
        columns = sorted(keys)
        path = Path(path)
        try:
            with path.open("w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["run_id", "run_name", "step", "time_s", *columns])
                for run, s in rows:
                    w.writerow([run["id"], run["name"], s["step"], repr(float(s["time_s"])),
                                *["" if s["metrics"].get(k) is None else s["metrics"][k]
                                  for k in columns]])
        except OSError as exc:
            raise StoreError(f"path: cannot write {str(path)!r}: {exc}") from None
        return path

    def _select(self, run_ids) -> list[dict]:
        if run_ids is None:
            return self.list_runs()
        return [self.get_run(r) for r in run_ids]
