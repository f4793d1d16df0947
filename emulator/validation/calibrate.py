"""Fit per-link-class latency (s) and bandwidth (bytes/s) so the emulator matches measurements.

The unknowns are, for every link class ``k`` of the topology (edge attribute ``link``;
``"default"`` where absent), the latency ``L_k`` (s) and the inverse bandwidth ``1/B_k``
(s/byte) that every link of that class gets. The prediction is the emulator's own (by default
a full simulation, :func:`emulator.run_collective`), not a formula next to it, so calibrated
links give the emulator's numbers for the calibration points.

Why a linear least-squares problem: in a flow-level model a collective's time is a sum, along
its critical path, of link latencies and of bytes over max-min fair rates, and every rate is
a link bandwidth divided by a flow count. Scaling all latencies and inverse bandwidths by ``c``
scales the time by ``c``, and within one routing/bottleneck pattern the time is linear in
``theta = (L_k, 1/B_k)_k``: ``T(theta) = J(theta) . theta`` (Euler's theorem for homogeneous
functions). For the alpha-beta closed forms (Thakur, Rabenseifner & Gropp 2005) it is exactly
``T = a(n) * alpha + b(n) * beta``, e.g. ring allreduce ``a = 2(p-1)``, ``b = 2(p-1)/p * n``.
We take ``J`` by finite differences of the emulator, solve the non-negative least-squares
problem in relative error (rows divided by the measured time), and iterate (Gauss-Newton)
until the bottleneck pattern stops changing; one iteration is exact on a uniform topology.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from ..errors import CalibrationError
from .trace import CollectivePoint, MeasuredTrace

__all__ = ["Calibration", "calibrate", "PREDICTORS", "predict", "link_classes", "apply_links"]

DEFAULT_CLASS = "default"

#: Smallest latency a fit returns (s). NNLS puts a latency the data cannot resolve (shaped
#: links where 1 MiB already takes milliseconds) at exactly 0, which no topology accepts
#: (validate_topology wants latency > 0); 1 ns is far below any real link's latency.
MIN_LATENCY_S = 1e-9


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

    ``fitted_on`` lists the (op, bytes) points used; ``fit_rel_errors`` the relative error
    of the calibrated prediction at each of them; ``iterations`` the Gauss-Newton steps.
    """

    links: dict
    fitted_on: tuple
    fit_rel_errors: tuple = ()
    iterations: int = 0
    predictor: str = "simulate"
    extra: dict = field(default_factory=dict, compare=False)

    def apply(self, G: nx.Graph) -> nx.Graph:
        """A copy of ``G`` with the fitted latency and bandwidth on every link of each class."""
        return apply_links(G, self.links)

    def to_dict(self) -> dict:
        """JSON-ready; with one class, also the flat ``alpha_s``/``bandwidth``/``link`` keys of
        docs/formats.md (``alpha_s`` is the latency of one link, s)."""
        d = {"links": {k: {"alpha_s": a, "bandwidth": b} for k, (a, b) in self.links.items()},
             "fitted_on": [{"op": op, "bytes": n} for op, n in self.fitted_on],
             "fit_rel_errors": list(self.fit_rel_errors), "iterations": self.iterations,
             "predictor": self.predictor}
        if len(self.links) == 1:
            (k, (a, b)), = self.links.items()
            d.update(alpha_s=a, bandwidth=b, link=k)
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        if not isinstance(d, dict) or not isinstance(d.get("links"), dict):
            raise CalibrationError("calibration.links: missing or not an object")
        links = {}
        for k, v in d["links"].items():
            try:
                a, b = float(v["alpha_s"]), float(v["bandwidth"])
            except (KeyError, TypeError, ValueError):
                raise CalibrationError(f"calibration.links.{k}: needs alpha_s and bandwidth") from None
            if a < 0 or not b > 0:
                raise CalibrationError(f"calibration.links.{k}: alpha_s {a} must be >= 0 and "
                                       f"bandwidth {b} > 0")
            links[k] = (a, b)
        fitted = tuple((f["op"], int(f["bytes"])) for f in d.get("fitted_on", []))
        return cls(links=links, fitted_on=fitted, fit_rel_errors=tuple(d.get("fit_rel_errors", ())),
                   iterations=int(d.get("iterations", 0)), predictor=d.get("predictor", "simulate"))


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
        The topology the measurements ran on (its ranks = the trace's world size).
    fit_sizes : iterable of int, optional
        Message sizes (bytes, nccl-tests convention) to fit on; default the smallest and the
        largest measured size of each op.
    ops : iterable of str, optional
        Ops to fit on (default all in the trace).
    algorithm : str, optional
        Algorithm the library ran; default each point's own (``"ring"`` for gloo).
    predictor : str
        Key of :data:`PREDICTORS`: ``"simulate"`` (the engine) or ``"closed_form"``.

    Raises
    ------
    CalibrationError
        Fewer points than unknowns, sizes not measured, ranks not matching, no solution.

    Examples
    --------
    >>> import emulator, topologies
    >>> G = topologies.from_spec("switch:4,bw=1Gbit,lat=20us,link=ethernet")
    >>> pts = [emulator.CollectivePoint("allreduce", n, emulator.run_collective(
    ...     G, "allreduce", "ring", n).time_s, 4) for n in (2**16, 2**22)]
    >>> trace = emulator.MeasuredTrace({"backend": "gloo", "world_size": 4, "source": "harness"},
    ...                                tuple(pts))
    >>> cal = emulator.calibrate(trace, topologies.from_spec("switch:4,link=ethernet"))
    >>> latency, bandwidth = cal.links["ethernet"]
    >>> round(latency * 1e6, 3), round(bandwidth * 8 / 1e9, 6)      # us, Gbit/s
    (20.0, 1.0)
    """
    import topologies

    ops = None if ops is None else tuple(ops)
    points = _select(trace, fit_sizes, ops)
    classes = link_classes(G)
    n_ranks = len(topologies.gpus(G))
    if n_ranks != trace.world_size:
        raise CalibrationError(f"topology {G.graph.get('name')!r} has {n_ranks} ranks but the trace "
                               f"was measured on world_size {trace.world_size}")
    n_unknowns = 2 * len(classes)
    if len(points) < n_unknowns:
        raise CalibrationError(f"fit points: {len(points)} given, {n_unknowns} needed for link "
                               f"classes {classes} (a latency and a bandwidth each)")
    measured = np.array([c.time_s for c in points])
    algos = [algorithm or c.algorithm for c in points]

    def times(theta):
        params = {k: (theta[2 * i], 1.0 / theta[2 * i + 1]) for i, k in enumerate(classes)}
        H = apply_links(G, params)
        return np.array([predict(H, c.op, a, c.bytes, predictor) for c, a in zip(points, algos)])

    # Start: each class at its current mean latency, and a bandwidth that makes the largest
    # point's bandwidth term right on its own (any positive start works; this one is close).
    theta = np.empty(n_unknowns)
    for i, k in enumerate(classes):
        edges = [d for _, _, d in G.edges(data=True) if (d.get("link") or DEFAULT_CLASS) == k]
        theta[2 * i] = max(1e-7, float(np.mean([d["latency"] for d in edges])))
        theta[2 * i + 1] = 1.0 / float(np.mean([d["bandwidth"] for d in edges]))
    scale = measured / times(theta)
    theta *= float(np.median(scale))        # homogeneous of degree 1: rescale to the data

    from scipy.optimize import nnls

    iterations = 0
    for iterations in range(1, max_iterations + 1):
        base = times(theta)
        J = np.empty((len(points), n_unknowns))
        for j in range(n_unknowns):
            step = theta.copy()
            h = theta[j] * 1e-3 if theta[j] > 0 else 1e-9
            step[j] += h
            J[:, j] = (times(step) - base) / h
        # Relative-error least squares: row i divided by the measured time t_i.
        A = J / measured[:, None]
        b = np.ones(len(points))
        # Column scaling keeps nnls well conditioned (latencies ~1e-5 s, 1/B ~1e-8 s/B).
        col = np.maximum(np.abs(A).max(axis=0), 1e-300)
        sol, _ = nnls(A / col, b)
        new = sol / col
        new[0::2] = np.maximum(new[0::2], MIN_LATENCY_S)
        # Zero inverse bandwidth means infinite bandwidth: the data did not pin it down.
        for i, k in enumerate(classes):
            if not new[2 * i + 1] > 0:
                raise CalibrationError(f"link class {k!r}: the fit points do not determine its "
                                       "bandwidth (use larger sizes, or points that cross it)")
        change = float(np.max(np.abs(new - theta) / np.maximum(np.abs(theta), 1e-30)))
        theta = new
        if change < tol:
            break
    fitted = times(theta)
    links = {k: (float(theta[2 * i]), float(1.0 / theta[2 * i + 1])) for i, k in enumerate(classes)}
    return Calibration(links=links, fitted_on=tuple((c.op, c.bytes) for c in points),
                       fit_rel_errors=tuple(float(x) for x in (fitted - measured) / measured),
                       iterations=iterations, predictor=predictor)
