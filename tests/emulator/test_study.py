"""Studies: run_study's rows (order, columns, arithmetic, bytes), serial = local processes = a
real Dask cluster, the CSV/JSON writers, the self-contained HTML report, config errors, and the
``qsgd-emu study`` command end to end.

The trace is hand-made (tests/emulator/test_replay_limits.py: 3 DDP buckets, 4-bit packed
payloads of exact size, compute 6.3 ms per iteration, batch 8), so every figure below is
deterministic; the grid is 2 topology specs x world sizes (2, 4) x {fp32, QSGD 8 and 4 bits over
both transports}: 12 tasks (one per topology, size and transport), 20 rows.
"""
from __future__ import annotations

import csv
import json
import re
import shutil
from html.parser import HTMLParser

import pytest

import emulator
import qsgd
from qsgd_emu import cli
from emulator.compute import ComputeModel
from emulator import Study, StudyConfig, read_study, run_study, topology_for
from emulator.studyresult import COLUMNS, write_csv, write_json
from tests.emulator.test_replay_limits import BUCKETS, make_trace
from tests.rendered import problems, read_figures

TRACE = make_trace()
SPECS = ("switch:{N}", "cluster:dgx_a100x{N}")
SIZES = (2, 4)
QSGD_T = ("qsgd_allgather", "qsgd_scatter_reduce_allgather")
# the hand-made trace's own seconds: these tests are about the study's mechanics
GRID = dict(world_sizes=SIZES, bits=(32, 8, 4), transports=("fp32", *QSGD_T), topologies=SPECS,
            device="measured")
#: (bits, transport) per (topology, world size), in row order
COMBOS = [(32, "fp32"), (8, QSGD_T[0]), (8, QSGD_T[1]), (4, QSGD_T[0]), (4, QSGD_T[1])]


def grid(**kw) -> StudyConfig:
    return StudyConfig(trace=TRACE, **{**GRID, **kw})


@pytest.fixture(scope="module")
def study() -> Study:
    return run_study(grid())


@pytest.fixture(scope="module")
def rows(study) -> tuple:
    return study.rows


def expected_bytes_per_gpu(transport: str, bits: int, p: int) -> float:
    """Mean bytes a GPU sends per iteration, from the payload sizes alone.

    Ring allreduce of n bytes: 2 (p-1)/p n per GPU. QSGD all-gather: (p-1) payloads. QSGD
    scatter-reduce-allgather: each rank sends (p-1) of its p chunk payloads (one per owner,
    each chunk a payload of its own, header included), then all-gathers its owned mean chunk
    padded to the largest: (p-1)/p of their total plus (p-1) times the largest. The
    uncompressed small tensors add a ring allreduce of their fp32, except in a mixed bucket of
    the all-gather transport, whose payloads carry them: (p-1) x.
    """
    ring = 2 * (p - 1) / p
    if transport == "fp32":
        return sum(ring * 4 * (c + r) for _, c, r in BUCKETS)
    cfg = qsgd.QSGDConfig.from_bits(bits, bucket_size=512, norm="max", codec="packed")
    total = 0.0
    for _, c, r in BUCKETS:
        if c:
            payload = qsgd.payload_nbytes(c, cfg)
            if transport == "qsgd_allgather":
                total += (p - 1) * (payload + 4 * r)
                continue
            # the elements torch.tensor_split puts in each of the p chunks
            sizes = [qsgd.payload_nbytes(c // p + (1 if j < c % p else 0), cfg) for j in range(p)]
            total += (p - 1) / p * sum(sizes) + (p - 1) * max(sizes)
        total += ring * 4 * r
    return total


# ---------------------------------------------------------------- rows
def test_rows_order_and_columns(rows):
    assert len(rows) == len(SPECS) * len(SIZES) * len(COMBOS) == 20
    want = [(s, w, b, t) for s in SPECS for w in SIZES for b, t in COMBOS]
    assert [(r.topology, r.world_size, r.bits, r.transport) for r in rows] == want
    for r in rows:
        assert tuple(r.to_dict()) == COLUMNS
        assert r.model == "tiny" and r.batch_size == 8 and r.device == "measured"
        assert r.algorithm == "nccl"


def test_rows_arithmetic(rows):
    for i in range(0, len(rows), len(COMBOS)):
        block = rows[i:i + len(COMBOS)]
        fp32 = block[0]
        assert fp32.transport == "fp32" and fp32.speedup_vs_fp32 == 1.0
        assert all(r.speedup_vs_fp16 is None for r in block)  # the grid has no fp16
        for r in block:
            w = r.world_size
            assert r.speedup_vs_fp32 == pytest.approx(fp32.iteration_s / r.iteration_s, rel=1e-12)
            assert r.scaling_efficiency == pytest.approx(r.compute_s / r.iteration_s, rel=1e-12)
            assert r.throughput_samples_s == pytest.approx(w * 8 / r.iteration_s, rel=1e-12)
            assert r.compute_s == pytest.approx(6.3e-3, rel=1e-12)
            assert r.compute_s + r.exposed_comm_s == pytest.approx(r.iteration_s, rel=1e-12)
            assert 0 < r.scaling_efficiency <= 1.0
            if r.transport == "fp32":
                assert r.encode_decode_s == 0.0
            else:
                # mean encode 0.2 + 0.4 ms and decode half of that per payload, measured at 4
                # bits: all-gather encodes once and decodes p payloads; scatter-reduce-allgather
                # encodes its bucket, re-encodes 1/p of it and decodes it twice; the 8-bit row
                # scales them by payload bytes
                enc, dec = 0.6e-3, 0.3e-3
                want = (enc + w * dec if r.transport == "qsgd_allgather"
                        else enc * (1 + 1 / w) + 2 * dec)
                if r.bits == 4:
                    assert r.encode_decode_s == pytest.approx(want, rel=1e-12)
                    assert r.source.startswith("measured payloads")
                else:
                    assert r.encode_decode_s > want
                    assert r.source.startswith("packed payload sizes at 8 bits")


def test_bytes_per_gpu_follow_the_payload_sizes(rows):
    for r in rows:
        want = expected_bytes_per_gpu(r.transport, r.bits, r.world_size)
        assert r.bytes_per_gpu == pytest.approx(want, rel=1e-12), r
    # fewer bits, fewer bytes; all-gather sends (p-1) payloads where the two-phase transport
    # sends 2 (p-1)/p of one: the same at 2 GPUs (up to the chunks' own headers), twice at 4
    by = {r.key: r.bytes_per_gpu for r in rows}
    for s in SPECS:
        for t in QSGD_T:
            for w in SIZES:
                assert by[s, w, 4, t] < by[s, w, 8, t] < by[s, w, 32, "fp32"]
        assert by[s, 2, 4, QSGD_T[0]] == pytest.approx(by[s, 2, 4, QSGD_T[1]], rel=0.01)
        assert by[s, 4, 4, QSGD_T[0]] == pytest.approx(2 * by[s, 4, 4, QSGD_T[1]], rel=0.02)


def test_rows_match_single_replays(rows):
    """Each row is the replay of its (topology, world size, transport, bits) on its own graph."""
    for r in rows:
        G = topology_for(r.topology, r.world_size)
        pred = emulator.replay(TRACE, G, transport=r.transport, world_size=r.world_size,
                               compute=ComputeModel(),
                               bits=None if r.transport == "fp32" else r.bits)
        assert r.iteration_s == pytest.approx(pred.iteration_s, rel=1e-12)
        assert r.exposed_comm_s == pytest.approx(pred.exposed_comm_s, rel=1e-12, abs=1e-15)


def test_topology_placeholder_sizes_the_cluster():
    import topologies

    assert len(topologies.gpus(topology_for("switch:{N}", 4))) == 4
    assert len(topologies.gpus(topology_for("cluster:dgx_a100x{N}", 4))) == 8     # one 8-GPU node
    assert len(topologies.gpus(topology_for("cluster:dgx_a100x{N}", 12))) == 16   # two


# ---------------------------------------------------------------- who runs the tasks
def test_serial_and_two_local_processes_give_the_same_table(rows):
    ticks1, ticks2 = [], []
    serial = run_study(grid(), progress=lambda d, t, eta: ticks1.append((d, t)))
    parallel = run_study(grid(), workers=2, progress=lambda d, t, eta: ticks2.append((d, t)))
    assert serial.rows == rows
    assert parallel.rows == serial.rows
    assert ticks1 == [(k, 12) for k in range(1, 13)]
    assert sorted(ticks2) == ticks1


def test_one_set_of_local_processes_serves_the_pilot_and_the_rest(rows, monkeypatch):
    # the pilot (2 GPUs) and the rest (4 GPUs) are two batches; starting processes for each
    # cost every process its imports again
    import concurrent.futures as cf

    started = []

    class Counted(cf.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            started.append(kwargs.get("max_workers"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(cf, "ProcessPoolExecutor", Counted)
    study = run_study(grid(), workers=2, time_limit_s=3600, task_progress=lambda text: None)
    assert study.rows == rows and started == [2]


def test_tasks_report_how_far_they_have_come_serial_and_in_processes(rows):
    """Within a task: the bit width replayed and the collectives simulated, also relayed from
    worker processes."""
    serial, parallel = [], []
    assert run_study(grid(), task_progress=serial.append).rows == rows
    assert run_study(grid(), workers=2, task_progress=parallel.append).rows == rows
    # each task says first that it builds and analyses its topology (seconds at 8,192 GPUs:
    # no silent wait), then that it chooses NCCL's algorithms, then what it simulates
    stages = ("building the topology and NCCL's analysis of it",
              "choosing NCCL's algorithm for each collective size")
    by_task: dict = {}
    for t in serial:
        by_task.setdefault(t.split(": ")[0], []).append(t.split(": ", 1)[1])
    assert all(said[:2] == list(stages) for said in by_task.values())
    serial = [t for t in serial if not t.endswith(stages)]
    parallel = [t for t in parallel if not t.endswith(stages)]
    assert serial and all("collectives simulated, last " in t for t in serial)
    # every task simulates at least one collective of its own (a task has its own Network)
    labels = {t.split(": ")[0] for t in serial}
    assert len(labels) == 12
    assert {t.split(": ")[0] for t in parallel} == labels
    assert sorted(parallel) != [] and len(parallel) == len(serial)
    # counts rise within a task: 1, 2, ... collectives
    first = [t for t in serial if t.startswith(sorted(labels)[0] + ":")]
    counts = [int(t.split(" collectives simulated")[0].rsplit(" ", 1)[1]) for t in first]
    assert counts == list(range(1, len(counts) + 1))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_real_local_dask_cluster_gives_the_same_rows(rows, tmp_path, capsys):
    """A Dask LocalCluster started here (one worker process, one thread; no dashboard):
    run_study(cluster=ADDRESS) and ``qsgd-emu study --cluster ADDRESS`` give the local rows."""
    import distributed  # a dependency of the project (pyproject), never skipped
    with distributed.LocalCluster(n_workers=1, processes=True, threads_per_worker=1,
                                  dashboard_address=None, death_timeout=60) as cluster:
        addr = cluster.scheduler_address
        assert addr.startswith("tcp://")
        ticks = []
        got = run_study(grid(), cluster=addr, progress=lambda d, t, eta: ticks.append(d))
        assert got.rows == rows and ticks == list(range(1, 13))
        trace_path = tmp_path / "trace.json"
        TRACE.save(trace_path)
        out = tmp_path / "study"
        argv = _study_argv(trace_path, out) + ["--cluster", addr, "--json"]
        assert cli.main(argv) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed == _json_rows(read_study(out / "study.json").rows) == _json_rows(rows)


def test_unreachable_cluster_names_the_address():
    from emulator.distributed import map_on_cluster

    with pytest.raises(emulator.ConfigError, match=r"tcp://127\.0\.0\.1:9"):
        map_on_cluster(abs, [1], "tcp://127.0.0.1:9", timeout_s=1.0)
    with pytest.raises(emulator.ConfigError, match="cluster"):
        run_study(grid(), cluster="")


# ---------------------------------------------------------------- files
def _json_rows(rows):
    return json.loads(json.dumps([r.to_dict() for r in rows]))


def test_csv_round_trip(study, rows, tmp_path):
    path = tmp_path / "study.csv"
    write_csv(study, path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS
        back = list(reader)
    assert len(back) == len(rows)
    for r, b in zip(rows, back):
        for k, v in r.to_dict().items():
            if v is None:
                assert b[k] == "", (k, b[k])
                continue
            kind = type(v)
            assert kind(b[k]) == v, (k, b[k], v)  # floats are written with repr: exact


def test_json_round_trip_and_format(study, tmp_path):
    path = tmp_path / "study.json"
    write_json(study, path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "qsgd-study" and doc["version"] == 3
    assert doc["config"]["world_sizes"] == [2, 4] and doc["config"]["topologies"] == list(SPECS)
    assert doc["rows"][doc["best"]] == study.best().to_dict()
    assert doc["timeline"] == study.prediction(study.best()).to_dict()
    back = read_study(path)
    assert back == study and back.rows == study.rows and back.best() == study.best()
    doc["format"] = "something-else"
    path.write_text(json.dumps(doc))
    with pytest.raises(emulator.TraceError, match="format"):
        read_study(path)
    doc["format"], doc["version"] = "qsgd-study", 7
    path.write_text(json.dumps(doc))
    with pytest.raises(emulator.TraceError, match="version"):
        read_study(path)
    doc["version"], doc["best"] = 3, 0
    path.write_text(json.dumps(doc))
    with pytest.raises(emulator.TraceError, match="best: 0 is not the index"):
        read_study(path)
    doc["best"] = study.rows.index(study.best())
    doc["rows"][3]["iteration_s"] = "fast"
    path.write_text(json.dumps(doc))
    with pytest.raises(emulator.TraceError, match=r"rows\[3\]\.iteration_s: 'fast'"):
        read_study(path)


def test_version_2_files_are_still_read(study, tmp_path):
    """A study.json of format version 2 (rows without precision) reads them 'as measured'."""
    doc = {"format": "qsgd-study", "version": 2, "config": None,
           "rows": [{k: v for k, v in r.to_dict().items() if k != "precision"} for r in study.rows],
           "best": study.rows.index(study.best())}
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(doc))
    back = read_study(path)
    assert [r.key for r in back.rows] == [r.key for r in study.rows]
    assert {r.precision for r in back.rows} == {"as measured"}
    assert [r.iteration_s for r in back.rows] == [r.iteration_s for r in study.rows]


def test_version_1_files_are_still_read(study, tmp_path):
    """A study.json of format version 1 (rows without topology_name, speedup_vs_fp16, bound)."""
    old = [{k: v for k, v in r.to_dict().items()
            if k not in ("topology_name", "speedup_vs_fp16", "bound")} for r in study.rows]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps({"format": "qsgd-study", "version": 1, "config": None, "rows": old}))
    back = read_study(path)
    assert [r.key for r in back.rows] == [r.key for r in study.rows]
    for a, b in zip(back.rows, study.rows):
        assert a.topology_name == a.topology and a.bound == b.bound
        assert a.iteration_s == b.iteration_s and a.speedup_vs_fp16 is None


# ---------------------------------------------------------------- the report
class _Scripts(HTMLParser):
    """Collects every <script>'s attributes and text, and every <link>/<img> with a URL."""

    def __init__(self):
        super().__init__()
        self.scripts, self.external, self._cur = [], [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self._cur = [a, ""]
        for key in ("src", "href"):
            if a.get(key) and tag in ("script", "link", "img", "iframe"):
                self.external.append((tag, a[key]))

    def handle_data(self, data):
        if self._cur is not None:
            self._cur[1] += data

    def handle_endtag(self, tag):
        if tag == "script" and self._cur is not None:
            self.scripts.append(tuple(self._cur))
            self._cur = None


def plotly_figures(text: str) -> list[dict]:
    """``{"data": [...], "layout": {...}}`` of every ``Plotly.newPlot(id, data, layout)`` call."""
    dec = json.JSONDecoder()
    figs = []
    for m in re.finditer(r"Plotly\.newPlot\(\s*", text):
        i = m.end()
        _, i = dec.raw_decode(text, i)               # the div id
        i = re.compile(r"\s*,\s*").match(text, i).end()
        data, i = dec.raw_decode(text, i)
        i = re.compile(r"\s*,\s*").match(text, i).end()
        layout, i = dec.raw_decode(text, i)
        figs.append({"data": data, "layout": layout})
    return figs


@pytest.fixture(scope="module")
def report(study, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    assert emulator.write_report(study, path, title="Tiny <study>", notes="notes & things",
                                 png=False) == str(path)
    return path


def figure_titled(figs: list[dict], start: str) -> dict:
    """The one figure of ``figs`` whose title starts with ``start``."""
    found = [f for f in figs if f["layout"]["title"]["text"].startswith(start)]
    assert len(found) == 1, [f["layout"]["title"]["text"] for f in figs]
    return found[0]


def test_report_is_self_contained(report):
    text = report.read_text(encoding="utf-8")
    p = _Scripts()
    p.feed(text)
    p.close()
    assert p.external == []  # no CDN script, stylesheet or image: it opens offline
    assert len(p.scripts) >= 5
    # plotly.js itself is inlined (once), the figures call it
    lib = [s for a, s in p.scripts if "plotly.js" in s[:2000].lower() and len(s) > 1_000_000]
    assert len(lib) == 1
    assert text.count("Plotly.newPlot(") == 5
    assert "<title>Tiny &lt;study&gt;</title>" in text and "notes &amp; things" in text


def test_report_figures_have_the_expected_traces(report, study, rows):
    figs = plotly_figures(report.read_text(encoding="utf-8"))
    assert len(figs) == 5
    labels = ["fp32 allreduce", "QSGD all-gather 8-bit", "QSGD all-gather 4-bit",
              "QSGD scatter-reduce-allgather 8-bit", "QSGD scatter-reduce-allgather 4-bit"]
    raw = {"fp32 allreduce": "fp32"} | {
        f"QSGD {name} {b}-bit": f"{t} {b}-bit" for b in (8, 4)
        for name, t in (("all-gather", "qsgd_allgather"),
                        ("scatter-reduce-allgather", "qsgd_scatter_reduce_allgather"))}
    axis_of = {f"x{i + 1}" if i else "x": spec for i, spec in enumerate(SPECS)}
    for start, col in (("throughput against GPUs", "throughput_samples_s"),
                       ("speedup over fp32 allreduce against GPUs", "speedup_vs_fp32")):
        fig = figure_titled(figs, start)
        # one line per configuration in each topology's panel, the legend listing each once
        assert sorted((t["name"], axis_of[t["xaxis"]]) for t in fig["data"]) == sorted(
            (label, spec) for label in labels for spec in SPECS)
        assert [t["name"] for t in fig["data"] if t.get("showlegend", True)] == labels
        assert fig["layout"]["xaxis"]["tickvals"] == list(SIZES)
        for trace in fig["data"]:
            spec = axis_of[trace["xaxis"]]
            assert trace["x"] == list(SIZES)
            want = [getattr(r, col) for r in rows
                    if r.topology == spec and r.label == raw[trace["name"]]]
            assert trace["y"] == pytest.approx(want, rel=1e-12)
    bars = figure_titled(figs, "One iteration at 4 GPUs")
    assert [t["name"] for t in bars["data"]][:4] == [
        "compute", "exposed communication, fp32 allreduce",
        "exposed communication, QSGD all-gather",
        "exposed communication, QSGD scatter-reduce-allgather"]
    first = [r for r in rows if r.world_size == 4 and r.topology == SPECS[0]]
    by_label = {raw[lab]: lab for lab in labels}
    assert dict(zip(bars["data"][0]["y"], bars["data"][0]["x"])) == pytest.approx(
        {by_label[r.label]: 1e3 * r.compute_s for r in first})
    timeline = figure_titled(figs, "One iteration, bucket by bucket")
    assert [t["name"] for t in timeline["data"]][:4] == ["waiting for the stream", "encode",
                                                         "collective", "decode"]
    assert timeline["data"][0]["y"] == ["bucket 0", "bucket 1", "bucket 2"]
    best = study.best()
    assert best.compressed and best.world_size == 4 and best.topology == SPECS[0]
    assert by_label[best.label] in timeline["layout"]["title"]["text"]
    headline = figs[0]
    assert headline["layout"]["title"]["text"].startswith("Where QSGD pays")


def test_report_opens_with_the_headline_then_the_conclusions(report, study):
    text = report.read_text(encoding="utf-8")
    calls = [m.start() for m in re.finditer(r"Plotly\.newPlot\(", text)]
    between = text[calls[0]:calls[1]]          # after the headline, before the other figures
    for line in study.conclusions():
        assert line.replace("&", "&amp;") in between
    # a sentence per (topology, size), then one per topology on where QSGD pays
    assert len(study.conclusions()) == len(SPECS) * len(SIZES) + len(SPECS)
    # the key of the figures is given once, before them
    assert between.count("Colour is the transport") == 1


def test_conclusions_say_where_qsgd_pays_as_the_rows_do(study):
    said = {line.split(": QSGD ")[0]: line for line in study.conclusions() if ": QSGD " in line}
    assert set(said) == set(SPECS)
    for top, line in said.items():
        best = [study.fastest(top, w, compressed=True) for w in SIZES]
        for base in ("fp32", "fp16"):
            speed = [getattr(r, f"speedup_vs_{base}") for r in best]
            if None in speed:           # the study ran no such baseline: nothing said of it
                assert f"beats {base}" not in line
                continue
            top_speed = f"{max(speed):.2f}x"
            part = next(p for p in line.split(";") if f"beats {base}" in p)
            assert top_speed in part
            assert ("never" in part) == (max(speed) <= 1.0)


def test_report_table_lists_every_row(report, rows):
    text = report.read_text(encoding="utf-8")
    table = text[text.index("<h2>Rows</h2>"):]
    assert table.count("<tr>") == len(rows) + 1


def test_report_without_rows_is_refused(tmp_path):
    with pytest.raises(emulator.ConfigError, match="rows"):
        Study(())
    with pytest.raises(emulator.ConfigError, match="study must be an emulator.Study"):
        emulator.write_report([], tmp_path / "r.html")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_report_opens_offline_in_a_browser(report):
    """Headless Chromium (Debian's, via Playwright) with every non-file request blocked draws
    all four figures from the file alone."""
    import shutil

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True,
                                     args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            requested, errors = [], []
            page.route("**/*", lambda route: (requested.append(route.request.url),
                                              route.continue_() if route.request.url.startswith("file:")
                                              else route.abort()))
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(report.as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 5",
                                   timeout=60_000)
            names = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot'))"
                                  ".map(d => d.data.map(t => t.name))")
            drawn = read_figures(page)
        finally:
            browser.close()
    assert errors == []
    assert [u for u in requested if not u.startswith("file:")] == []
    assert len(names) == 5 and names[3][0] == "compute" and names[4][0] == "waiting for the stream"
    # every figure reads cleanly as drawn: whole titles, 1-2-5 log ticks, category labels
    # apart, the legend clear of the axes, one colour per transport, no two lines alike
    assert [p for f in drawn for p in problems(f)] == []
    throughput = next(f for f in drawn if f["title"]["text"].startswith("throughput"))
    assert len(throughput["panels"]) == len(SPECS)              # a panel per topology
    legend = [e["text"] for e in throughput["legend"]]
    assert len(legend) == len(set(legend)) == 5                 # each configuration once


# ---------------------------------------------------------------- config errors
@pytest.mark.parametrize("kw, field", [
    ({"trace": {"model": "x"}}, "trace"),
    ({"world_sizes": ()}, "world_sizes"),
    ({"world_sizes": (2, 0)}, "world_sizes"),
    ({"world_sizes": "2,4"}, "world_sizes"),
    ({"bits": (32, 1)}, "bits"),
    ({"bits": (17,)}, "bits"),
    ({"transports": ("fp8",)}, "transports"),
    ({"topologies": ("",)}, "topologies"),
    ({"device": "TPUv5"}, "device"),
    ({"compute": "fast"}, "compute"),
    ({"precision": "fp4"}, "precision"),
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"),
])
def test_config_errors_name_the_field(kw, field):
    args = {**GRID, "trace": TRACE, **kw}
    with pytest.raises(emulator.ConfigError, match=rf"StudyConfig\.{field}"):
        StudyConfig(**args)


def test_run_errors_before_any_work():
    with pytest.raises(emulator.ConfigError, match="no .bits, transport. pair"):
        run_study(grid(bits=(16,), transports=("fp32",)))
    with pytest.raises(emulator.ConfigError, match="fewer than world_size=4"):
        run_study(grid(topologies=("switch:2",)))
    with pytest.raises(ValueError, match="nosuchfamily"):
        run_study(grid(topologies=("switch:{N}", "nosuchfamily:{N}")))
    with pytest.raises(emulator.ConfigError, match="workers"):
        run_study(grid(), workers=0)


# ---------------------------------------------------------------- the command
def _study_argv(trace_path, out) -> list[str]:
    return ["study", "--trace", str(trace_path), "--world-sizes", "2,4", "--bits", "32,8,4",
            "--transports", "fp32," + ",".join(QSGD_T), "--topology", SPECS[0], "--topology", SPECS[1],
            "--device", "measured", "--out", str(out)]


def test_study_command_end_to_end(study, rows, tmp_path, capsys):
    trace_path = tmp_path / "trace.json"
    TRACE.save(trace_path)
    out = tmp_path / "out"
    assert cli.main(_study_argv(trace_path, out)) == 0
    cap = capsys.readouterr()
    # progress goes to stderr (as lines: capsys is not a terminal), the table to stdout
    assert "study 12/12 tasks" in cap.err and "\r" not in cap.err
    assert "12/12" not in cap.out
    lines = cap.out.splitlines()
    assert lines[0].split()[:5] == ["topology", "GPUs", "batch/GPU", "bits", "transport"]
    table = [ln for ln in lines if ln.startswith(("switch:", "cluster:dgx_a100x"))
             and not ln.split()[0].endswith((",", ":"))]  # not the conclusions
    assert len(table) == len(rows)
    assert {ln.split()[0] for ln in table} == {r.topology_name for r in rows}
    assert all(ln.split()[2] == "8" for ln in table)       # the batch per GPU is shown
    assert "eff: scaling efficiency" in cap.out            # the legend
    for line in study.conclusions():
        assert line in cap.out
    assert "study.csv" in cap.out and "report.html" in cap.out
    assert _json_rows(read_study(out / "study.json").rows) == _json_rows(rows)
    with open(out / "study.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    figs = plotly_figures((out / "report.html").read_text(encoding="utf-8"))
    assert len(figs) == 5  # the headline, three study figures, the fastest QSGD row's timeline
    fastest = min((r for r in rows if r.topology == SPECS[0] and r.world_size == 4
                   and r.transport != "fp32"), key=lambda r: r.iteration_s)
    timeline = figure_titled(figs, "One iteration, bucket by bucket")
    assert f"{emulator.figures.row_label(fastest)} at 4 GPUs" in timeline["layout"]["title"]["text"]
    assert (out / "headline.png").exists() == (shutil.which("chromium") is not None)


@pytest.mark.parametrize("extra, needle", [
    (["--world-sizes", "2,x"], "--world-sizes must be comma-separated integers"),
    (["--transports", "fp8"], "transports"),
    (["--topology", "nosuchfamily:4"], "nosuchfamily"),
    (["--device", "TPUv5"], "device"),
    (["--batch-size", "0"], "--batch-size must be a positive integer, got '0'"),
    (["--precision", "fp4"], "--precision"),
    (["--device", "V100", "--precision", "amp-bf16"], "needs bf16 units, which V100 does not have"),
    (["--device", "auto", "--topology", "switch:{N}"], "does not name its GPU"),
])
def test_study_command_bad_options_exit_2(tmp_path, capsys, extra, needle):
    trace_path = tmp_path / "trace.json"
    qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta").save(trace_path)
    argv = ["study", "--trace", str(trace_path), "--world-sizes", "2", "--bits", "32",
            "--device", "measured", "--out", str(tmp_path / "o")] + extra
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o" / "study.csv").exists()


def test_study_command_bad_trace_names_the_field(tmp_path, capsys):
    doc = TRACE.to_dict()
    doc["iterations"][1]["buckets"][0]["raw_bytes"] = 3
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    assert cli.main(["study", "--trace", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "iterations[1].buckets[0].raw_bytes" in capsys.readouterr().err


def test_study_command_timeline_uses_the_rows_compute_model(tmp_path, capsys):
    """With a target device, the rows and the report's timeline (end of backward) come from
    one compute model: the trace's operators timed on an A100 at the batch asked for, said on
    stderr with what was assumed."""
    trace_path = tmp_path / "trace.json"
    trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")
    trace.save(trace_path)
    out = tmp_path / "o"
    assert cli.main(["study", "--trace", str(trace_path), "--world-sizes", "4", "--bits", "32,4",
                     "--topology", "switch:{N}", "--device", "A100", "--batch-size", "512",
                     "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "compute on switch:{N}: A100-80GB amp-bf16 at batch 512 per GPU (given)" in err
    rows_ = read_study(out / "study.json").rows
    assert rows_[0].device == "A100-80GB" and rows_[0].precision == "amp-bf16"
    assert rows_[0].batch_size == 512
    model = ComputeModel.for_device("A100", trace, batch_size=512)
    fwd_m, bwd_m, opt_m, _ = model.phases(trace)
    assert rows_[0].compute_s == pytest.approx(fwd_m + bwd_m + opt_m, rel=1e-12)
    timeline = figure_titled(plotly_figures((out / "report.html").read_text(encoding="utf-8")),
                             "One iteration, bucket by bucket")
    # the timeline's forward and backward are the model's (drawn in ms)
    compute = [t for t in timeline["data"] if t["y"] == ["compute"]]
    fwd, bwd = compute[0]["x"][0], compute[1]["x"][0]
    assert fwd + bwd == pytest.approx(1e3 * (fwd_m + bwd_m), rel=1e-9)
    # and the timeline shows a QSGD row (the fastest of them), not fp32
    assert "<br>QSGD " in timeline["layout"]["title"]["text"]


# ---------------------------------------------------------------- estimates and limits
def test_estimate_extrapolates_from_the_largest_world_size_run():
    from emulator.estimate import COST_EXPONENT, estimate

    cfg = grid()
    tasks = [(cfg, "s", 2, ((32, "fp32"),)), (cfg, "s", 2, ((4, "qsgd_allgather"),)),
             (cfg, "s", 8, ((32, "fp32"),)), (cfg, "s", 8, ((4, "qsgd_allgather"),)),
             (cfg, "s", 4, ((32, "fp32"),))]
    plan = estimate(tasks, {0: 0.5, 1: 2.0}, workers=1)
    grow = (8 / 2) ** COST_EXPONENT
    assert plan.by_task == pytest.approx({2: 0.5 * grow, 3: 2.0 * grow,
                                          4: 0.5 * (4 / 2) ** COST_EXPONENT})
    assert plan.seconds == pytest.approx(2.5 * grow + 0.5 * 4)
    assert plan.parts[0] == ("s at 8 GPUs, qsgd_allgather", pytest.approx(2.0 * grow))
    # many workers: the largest task still bounds the wall time
    assert estimate(tasks, {0: 0.5, 1: 2.0}, workers=8).seconds == pytest.approx(2.0 * grow)
    # fp32 has run at 4 GPUs too: its 8-GPU task is extrapolated from there
    plan = estimate(tasks, {0: 0.5, 1: 2.0, 4: 0.7}, workers=1)
    assert plan.by_task[2] == pytest.approx(0.7 * (8 / 4) ** COST_EXPONENT)
    assert "2, 4-GPU tasks took 3.2 s" in plan.basis


def _synthetic_walls(monkeypatch, wall_of_gpus):
    """Tasks run for real, but report ``wall_of_gpus(world size)`` seconds; returns the
    world sizes of each batch of tasks run, in order."""
    from emulator import study

    batches = []
    run_tasks = study._run_tasks

    def fake(tasks, which, done, *args, **kwargs):
        batches.append(sorted({tasks[i][2] for i in which}))
        return run_tasks(tasks, which, lambda i, _wall, out: done(i, wall_of_gpus(tasks[i][2]),
                                                                  out), *args, **kwargs)

    monkeypatch.setattr(study, "_run_tasks", fake)
    monkeypatch.setattr(study, "warm_up", lambda: None, raising=False)
    return batches


def test_a_larger_pilot_replaces_an_estimate_over_the_limit(monkeypatch):
    # Tasks of 1 s of overheads plus 0.01 s x GPUs**2: GPUs**2 from the 2-GPU pilot says 125 s
    # for the 4- and 8-GPU tasks (6 of each), over 60 s; the 4-GPU tasks' own estimate (25 s)
    # fits, so they run, and from them the 8-GPU ones come out at 28 s: the study runs.
    walls = lambda p: 1.0 + 0.01 * p * p                   # noqa: E731
    batches = _synthetic_walls(monkeypatch, walls)
    study = run_study(grid(world_sizes=(2, 4, 8)), time_limit_s=60)
    assert batches == [[2], [4], [8]] and len(study.rows) > 0
    # with 30 s, the 4-GPU pilot itself (6 + 25 s by the estimate) does not fit: refused after 2
    batches.clear()
    with pytest.raises(emulator.ConfigError, match="more than the limit of 30 s"):
        run_study(grid(world_sizes=(2, 4, 8)), time_limit_s=30)
    assert batches == [[2]]


def test_a_study_over_its_time_limit_stops_after_the_pilot_and_says_how_to_shrink():
    ticks = []
    with pytest.raises(emulator.ConfigError) as err:
        run_study(grid(), time_limit_s=1e-9, progress=lambda d, t, eta: ticks.append((d, eta)))
    text = str(err.value)
    assert "the study would take about" in text and "more than the limit of 0 s" in text
    assert "at 4 GPUs" in text and "Make it smaller: fewer or smaller --world-sizes" in text
    # only the 2-GPU tasks (2 topologies x 3 transports) ran, with nothing estimated yet
    assert ticks == [(d, None) for d in range(1, 7)]


def test_the_pilot_is_timed_after_the_kernels_are_compiled(monkeypatch):
    # a fresh checkout compiles numba's kernels in its first simulation (~14 s on 2 cores):
    # inside the pilot, that was extrapolated to the largest world size and refused the demo
    from emulator import engine, study

    order = []
    monkeypatch.setattr(engine, "warm_up", lambda: order.append("warm up"))
    run_tasks = study._run_tasks

    def recording(tasks, which, *args, **kwargs):
        order.append(sorted({tasks[i][2] for i in which}))
        return run_tasks(tasks, which, *args, **kwargs)

    monkeypatch.setattr(study, "_run_tasks", recording)
    run_study(grid(), time_limit_s=3600)
    assert order == ["warm up", [2], [4]]          # before the 2-GPU pilot, once
    order.clear()
    run_study(grid())                               # nothing extrapolated: no warm-up
    assert order == [[2], [4]]


def test_progress_carries_an_estimate_of_the_time_left(rows):
    seen = []
    run_study(grid(), progress=lambda d, t, eta: seen.append((d, t, eta)))
    # the 2-GPU pilot's six tasks: no estimate until they have all run
    assert [eta is None for _, _, eta in seen[:6]] == [True] * 6
    assert all(eta is not None and eta >= 0 for _, _, eta in seen[6:])
    assert seen[-1][2] == 0.0


def test_study_command_time_limit(tmp_path, capsys):
    trace_path = tmp_path / "trace.json"
    TRACE.save(trace_path)
    code = cli.main(_study_argv(trace_path, tmp_path / "o") + ["--time-limit", "1e-9"])
    assert code == 2
    err = capsys.readouterr().err
    assert "the study would take about" in err and "--time-limit" in err


def test_with_local_processes_the_kernels_compile_there_not_here(tmp_path):
    """The warm-up before the pilot runs in the study's processes, one engine path in each
    (their compiling overlaps); this process never loads numba, and every task still runs in
    the processes, the single-task stages too."""
    import subprocess
    import sys

    code = ("import emulator, json\n"
            "from emulator import _jit, engine, study\n"
            "from tests.emulator.test_study import grid\n"
            "seen = []\n"
            "s = study.run_study(grid(), workers=2, progress=lambda d, t, eta: seen.append(d))\n"
            "print(json.dumps([_jit.compiled(), len(s.rows), seen[-1]]))\n")
    env = dict(__import__("os").environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout
    compiled, rows, done = json.loads(out.strip().splitlines()[-1])
    assert compiled is False and rows == len(run_study(grid()).rows) and done == 12
    # both paths' kernels reached numba's cache from the two processes
    assert any(p.suffix == ".nbi" for p in tmp_path.rglob("*"))


def test_warm_up_names_bad_paths():
    from emulator import engine

    with pytest.raises(emulator.ConfigError, match="paths='events' must name some of"):
        engine.warm_up("events")
    with pytest.raises(emulator.ConfigError, match="'nope'"):
        engine.warm_up(("nope",))
