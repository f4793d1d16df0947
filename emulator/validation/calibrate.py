"""Fit per-link-class latency (s) and bandwidth (bytes/s) so the emulator matches measurements.

The unknowns are, for every link class ``k`` of the topology (edge attribute ``link``;
``"default"`` where absent), a latency scale and an inverse-bandwidth scale that multiply the
class's own figures (a preset's datasheet values), so links of one class keep their
differences (one or two NVLink lanes). The prediction is the emulator's own (by default a full
simulation, :func:`emulator.run_collective`), not a formula next to it, so calibrated links
give the emulator's numbers for the calibration points.

How: Gauss-Newton on the relative errors. At the current scales ``theta`` the predictions
``T(theta)`` and their Jacobian ``J`` (finite differences of the emulator) give the linear
model ``T ~ T(theta) + J (theta' - theta)``; rows are divided by the measured times so every
point weighs by its relative error, and non-negative least squares gives ``theta'``. For a
flow model without fixed offsets ``T`` is linear in the scales (a collective's time is a sum of
link latencies and bytes over bandwidth shares, Thakur, Rabenseifner & Gropp 2005), so one step
is exact; NCCL's per-step latencies make it affine, which the ``T(theta)`` term absorbs.

What the data determine: a scale whose column of the relative Jacobian is (numerically) zero,
or a combination of scales the points cannot tell apart (QR with column pivoting, Golub & Van
Loan section 5.4.1), is kept at its current value, the topology's own figure, and reported as
kept; at most one scale per measured point is fitted. A class no collective crosses, or a
latency hidden behind NCCL's larger per-step latency, is therefore kept rather than refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from ..errors import CalibrationError
from .trace import CollectivePoint, MeasuredTrace

__all__ = ["Calibration", "calibrate", "PREDICTORS", "predict", "link_classes", "apply_links",
           "scale_links"]

DEFAULT_CLASS = "default"

#: Smallest latency a fit returns (s). NNLS puts a latency the data cannot resolve (shaped
#: links where 1 MiB already takes milliseconds) at exactly 0, which no topology accepts
#: (validate_topology wants latency > 0); 1 ns is far below any real link's latency.
MIN_LATENCY_S = 1e-9

#: A scale is determined when its pivot in the QR of the relative Jacobian is at least this
#: fraction of the largest pivot (a 1e-3 relative change of the predictions per unit of it).
DETERMINED = 1e-3


def link_classes(G: nx.Graph) -> list[str]:
    """Sorted link classes of ``G`` (edge attribute ``link``; ``"default"`` where absent)."""
    return sorted({d.get("link") or DEFAULT_CLASS for _, _, d in G.edges(data=True)})


def apply_links(G: nx.Graph, params: dict) -> nx.Graph:
    """A copy of ``G`` whose links of each class get ``params[class] = (latency_s, bandwidth)``.

    Classes not in ``params`` keep their attributes.
    """
    H = G.copy()
    for _, _, d in H.edges(data=True):
        k = d.get("link") or DEFAULT_CLASS
        if k in params:
            latency, bandwidth = params[k]
            d["latency"] = float(latency)
            d["bandwidth"] = float(bandwidth)
    return H


def scale_links(G: nx.Graph, scales: dict) -> nx.Graph:
    """A copy of ``G`` whose links of each class have their latency multiplied by
    ``scales[class][0]`` and their bandwidth divided by ``scales[class][1]`` (the inverse
    bandwidth's scale); latencies stay at least :data:`MIN_LATENCY_S`."""
    H = G.copy()
    for _, _, d in H.edges(data=True):
        k = d.get("link") or DEFAULT_CLASS
        if k in scales:
            s_lat, s_inv = scales[k]
            d["latency"] = max(float(d["latency"]) * s_lat, MIN_LATENCY_S)
            d["bandwidth"] = float(d["bandwidth"]) / s_inv
    return H


def _class_means(G: nx.Graph) -> dict:
    """class -> (mean latency s, mean bandwidth bytes/s) of its links."""
    acc: dict = {}
    for _, _, d in G.edges(data=True):
        k = d.get("link") or DEFAULT_CLASS
        acc.setdefault(k, []).append((float(d["latency"]), float(d["bandwidth"])))
    return {k: (float(np.mean([a for a, _ in v])), float(np.mean([b for _, b in v])))
            for k, v in acc.items()}


# -- predictors: (G, op, algorithm, nbytes) -> seconds --------------------------------------
def _simulate(G, op, algorithm, nbytes) -> float:
    import emulator

    # The emulator's sizes follow nccl-tests too (allgather: the gathered total).
    return float(emulator.run_collective(G, op, algorithm, int(nbytes)).time_s)


def _closed_form(G, op, algorithm, nbytes) -> float:
    """Alpha-beta closed form with alpha = path latency and beta = 1/bottleneck of rank 0 -> 1."""
    import emulator
    import topologies

    ranks = topologies.gpus(G)
    if len(ranks) < 2:
        raise CalibrationError(f"topology {G.graph.get('name')!r}: fewer than 2 ranks")
    path = topologies.Router(G).path(ranks[0], ranks[1])
    edges = [G.edges[u, v] for u, v in zip(path, path[1:])]
    alpha = sum(e["latency"] for e in edges)
    beta = 1.0 / min(e["bandwidth"] for e in edges)
    return float(emulator.closed_form(op, algorithm, len(ranks), nbytes, alpha, beta))


#: predictor name -> function(G, op, algorithm, nbytes) -> seconds.
PREDICTORS = {"simulate": _simulate, "closed_form": _closed_form}


def predict(G, op: str, algorithm: str, nbytes: int, predictor: str = "simulate") -> float:
    """Seconds the emulator predicts for one collective (nccl-tests ``nbytes`` convention)."""
    try:
        fn = PREDICTORS[predictor]
    except KeyError:
        raise CalibrationError(f"predictor {predictor!r} not one of {', '.join(PREDICTORS)}") from None
    return fn(G, op, algorithm, nbytes)


@dataclass(frozen=True)
class Calibration:
    """Fitted link parameters: ``links[class] = (latency_s, bandwidth_bytes_per_s)``.

    ``scales[class] = (latency scale, inverse-bandwidth scale)`` relative to the topology it
    was fitted on (applied per link, so a class keeps its links' differences; ``links`` holds
    the class means for people); ``fitted[class]`` and ``kept[class]`` say which of
    ``"latency"`` and ``"bandwidth"`` the data determined and which kept the topology's own
    figure. ``fitted_on`` lists the (op, bytes) points used; ``fit_rel_errors`` the relative
    error of the calibrated prediction at each; ``iterations`` the Gauss-Newton steps.
    """

    links: dict
    fitted_on: tuple
    fit_rel_errors: tuple = ()
    iterations: int = 0
    predictor: str = "simulate"
    extra: dict = field(default_factory=dict, compare=False)
    scales: dict = field(default_factory=dict)
    fitted: dict = field(default_factory=dict)
    kept: dict = field(default_factory=dict)

    def apply(self, G: nx.Graph) -> nx.Graph:
        """A copy of ``G`` with the fitted figures: scaled per link when the calibration has
        scales, else every link of a class set to its ``links`` values."""
        if self.scales:
            return scale_links(G, self.scales)
        return apply_links(G, self.links)

    def to_dict(self) -> dict:
        """JSON-ready; with one class, also the flat ``alpha_s``/``bandwidth``/``link`` keys of
        docs/formats.md (``alpha_s`` is the latency of one link, s)."""
        links = {}
        for k, (a, b) in self.links.items():
            links[k] = {"alpha_s": a, "bandwidth": b}
            if k in self.scales:
                links[k].update(latency_scale=self.scales[k][0],
                                inverse_bandwidth_scale=self.scales[k][1])
        d = {"links": links,
             "fitted_on": [{"op": op, "bytes": n} for op, n in self.fitted_on],
             "fit_rel_errors": list(self.fit_rel_errors), "iterations": self.iterations,
             "predictor": self.predictor,
             "fitted": {k: list(v) for k, v in self.fitted.items()},
             "kept": {k: list(v) for k, v in self.kept.items()}}
        if len(self.links) == 1:
            (k, (a, b)), = self.links.items()
            d.update(alpha_s=a, bandwidth=b, link=k)
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        if not isinstance(d, dict) or not isinstance(d.get("links"), dict):
            raise CalibrationError("calibration.links: missing or not an object")
        links, scales = {}, {}
        for k, v in d["links"].items():
            try:
                a, b = float(v["alpha_s"]), float(v["bandwidth"])
            except (KeyError, TypeError, ValueError):
                raise CalibrationError(f"calibration.links.{k}: needs alpha_s and bandwidth") from None
            if a < 0 or not b > 0:
                raise CalibrationError(f"calibration.links.{k}: alpha_s {a} must be >= 0 and "
                                       f"bandwidth {b} > 0")
            links[k] = (a, b)
            if "latency_scale" in v or "inverse_bandwidth_scale" in v:
                try:
                    sl, sb = float(v["latency_scale"]), float(v["inverse_bandwidth_scale"])
                except (KeyError, TypeError, ValueError):
                    raise CalibrationError(f"calibration.links.{k}: latency_scale and "
                                           f"inverse_bandwidth_scale go together") from None
                if sl < 0 or not sb > 0:
                    raise CalibrationError(f"calibration.links.{k}: latency_scale {sl} must be "
                                           f">= 0 and inverse_bandwidth_scale {sb} > 0")
                scales[k] = (sl, sb)
        fitted = tuple((f["op"], int(f["bytes"])) for f in d.get("fitted_on", []))
        return cls(links=links, fitted_on=fitted, fit_rel_errors=tuple(d.get("fit_rel_errors", ())),
                   iterations=int(d.get("iterations", 0)), predictor=d.get("predictor", "simulate"),
                   scales=scales, fitted={k: tuple(v) for k, v in (d.get("fitted") or {}).items()},
                   kept={k: tuple(v) for k, v in (d.get("kept") or {}).items()})

    def describe(self) -> list[str]:
        """One line per class: its figures and which the data fitted and which were kept."""
        out = []
        for k, (a, b) in self.links.items():
            fit = ", ".join(self.fitted.get(k, ())) or "nothing"
            keep = ", ".join(self.kept.get(k, ())) or "nothing"
            out.append(f"link class {k:10s} latency {a * 1e6:10.3f} us   bandwidth "
                       f"{b / 1e9:10.3f} GB/s   fitted: {fit}; kept from the topology: {keep}")
        return out


def _select(trace: MeasuredTrace, fit_sizes, ops) -> list[CollectivePoint]:
    pts = [c for c in trace.collectives if ops is None or c.op in ops]
    if not pts:
        raise CalibrationError(f"ops {ops!r}: the trace has no collective points of these ops")
    if fit_sizes is None:
        # Two sizes: the smallest and the largest measured (per op).
        chosen = []
        for op in sorted({c.op for c in pts}):
            mine = sorted((c for c in pts if c.op == op), key=lambda c: c.bytes)
            chosen += [mine[0]] + ([mine[-1]] if len(mine) > 1 else [])
        return chosen
    wanted = {int(s) for s in fit_sizes}
    chosen = [c for c in pts if c.bytes in wanted]
    missing = wanted - {c.bytes for c in chosen}
    if missing:
        raise CalibrationError(f"fit_sizes: {sorted(missing)} bytes not measured (have "
                               f"{sorted({c.bytes for c in pts})})")
    return chosen


def calibrate(trace: MeasuredTrace, G: nx.Graph, *, fit_sizes=None, ops=None,
              algorithm: str | None = None, predictor: str = "simulate",
              max_iterations: int = 8, tol: float = 1e-6) -> Calibration:
    """Fit (latency, bandwidth) per link class of ``G`` to ``trace``'s collective points.

    Parameters
    ----------
    trace : MeasuredTrace
    G : nx.Graph
        The topology the measurements ran on (its ranks = the trace's world size); its own
        figures are the starting point and stay where the data say nothing.
    fit_sizes : iterable of int, optional
        Message sizes (bytes, nccl-tests convention) to fit on; default the smallest and the
        largest measured size of each op.
    ops : iterable of str, optional
        Ops to fit on (default all in the trace).
    algorithm : str, optional
        Algorithm the library ran; default each point's own (``"ring"`` for gloo, ``"nccl"``
        for nccl-tests logs).
    predictor : str
        Key of :data:`PREDICTORS`: ``"simulate"`` (the engine) or ``"closed_form"``.

    Returns
    -------
    Calibration
        With ``fitted`` and ``kept`` per class.

    Raises
    ------
    CalibrationError
        Sizes not measured, ranks not matching, no point to fit, a predictor unknown.

    Examples
    --------
    >>> import topologies
    >>> from emulator.validation import import_nccl_tests
    >>> t = import_nccl_tests("tests/emulator/data/nccl_tests/b200_1node_allreduce.log")
    >>> cal = calibrate(t, topologies.from_spec("hgx_b200"), fit_sizes=[1 << 30, 1 << 34])
    >>> sorted(cal.fitted["nvswitch"]), sorted(cal.kept["pcie"])
    (['bandwidth'], ['bandwidth', 'latency'])
    """
    import topologies

    if predictor not in PREDICTORS:
        raise CalibrationError(f"predictor {predictor!r} not one of {', '.join(PREDICTORS)}")
    ops = None if ops is None else tuple(ops)
    points = _select(trace, fit_sizes, ops)
    classes = link_classes(G)
    n_ranks = len(topologies.gpus(G))
    if n_ranks != trace.world_size:
        raise CalibrationError(f"topology {G.graph.get('name')!r} has {n_ranks} ranks but the trace "
                               f"was measured on world_size {trace.world_size}")
    if not points:
        raise CalibrationError("fit points: none given; a calibration needs at least one")
    measured = np.array([c.time_s for c in points])
    algos = [algorithm or c.algorithm for c in points]
    n = 2 * len(classes)
    means = _class_means(G)

    def scales_of(theta):
        return {k: (float(theta[2 * i]), float(theta[2 * i + 1])) for i, k in enumerate(classes)}

    def times(theta):
        H = scale_links(G, scales_of(theta))
        return np.array([predict(H, c.op, a, c.bytes, predictor) for c, a in zip(points, algos)])

    from scipy.optimize import nnls

    theta = np.ones(n)
    # Latency scales stop at MIN_LATENCY_S on the class's mean link.
    floor = np.zeros(n)
    for i, k in enumerate(classes):
        floor[2 * i] = MIN_LATENCY_S / max(means[k][0], MIN_LATENCY_S)
    free = np.zeros(n, dtype=bool)
    base = times(theta)
    iterations = 0
    for iterations in range(1, max_iterations + 1):
        J = np.empty((len(points), n))
        for j in range(n):
            step = theta.copy()
            h = max(theta[j], 1e-6) * 1e-3
            step[j] += h
            J[:, j] = (times(step) - base) / h
        # Relative sensitivities: a relative change of scale j moves prediction i by A[i, j].
        A = J * theta[None, :] / measured[:, None]
        free = _determined(A, len(points))
        if not free.any():
            break
        Af = J[:, free] / measured[:, None]
        rhs = (measured - base) / measured + Af @ theta[free]
        col = np.maximum(np.abs(Af).max(axis=0), 1e-300)
        sol, _ = nnls(Af / col, rhs)
        new = theta.copy()
        new[free] = np.maximum(sol / col, floor[free])
        # An inverse bandwidth at 0 would be infinite bandwidth: keep the figure instead.
        for j in np.flatnonzero(free):
            if j % 2 == 1 and not sol[list(np.flatnonzero(free)).index(j)] > 0:
                new[j] = theta[j]
                free[j] = False
        change = float(np.max(np.abs(new - theta) / np.maximum(np.abs(theta), 1e-30)))
        theta = new
        base = times(theta)
        if change < tol:
            break
    scales = scales_of(theta)
    links = {k: (means[k][0] * scales[k][0], means[k][1] / scales[k][1]) for k in classes}
    fitted, kept = {}, {}
    for i, k in enumerate(classes):
        for j, what in ((2 * i, "latency"), (2 * i + 1, "bandwidth")):
            (fitted if free[j] else kept).setdefault(k, []).append(what)
    return Calibration(links=links, fitted_on=tuple((c.op, c.bytes) for c in points),
                       fit_rel_errors=tuple(float(x) for x in (base - measured) / measured),
                       iterations=iterations, predictor=predictor, scales=scales,
                       fitted={k: tuple(v) for k, v in fitted.items()},
                       kept={k: tuple(v) for k, v in kept.items()})


def _determined(A: np.ndarray, n_points: int) -> np.ndarray:
    """Columns of the relative Jacobian ``A`` the points determine: QR with column pivoting,
    pivots of at least :data:`DETERMINED` of the largest, at most one per point."""
    from scipy.linalg import qr

    free = np.zeros(A.shape[1], dtype=bool)
    if not np.any(A):
        return free
    _, R, piv = qr(A, pivoting=True, mode="economic")
    diag = np.abs(np.diag(R))
    top = diag[0] if len(diag) else 0.0
    for r, j in enumerate(piv[:len(diag)]):
        if r >= n_points or not diag[r] >= DETERMINED * top:
            break
        free[j] = True
    return free
