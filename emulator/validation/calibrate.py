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
point weighs by its relative error, and least squares (bounded below: latencies >= 1 ns,
bandwidths <= 1000x the figure) gives ``theta'``. For a
flow model without fixed offsets ``T`` is linear in the scales (a collective's time is a sum of
link latencies and bytes over bandwidth shares, Thakur, Rabenseifner & Gropp 2005), so one step
is exact; NCCL's per-step latencies make it affine, which the ``T(theta)`` term absorbs.

What the data determine: a scale whose column of the relative Jacobian is negligible, or a
combination of scales the points cannot tell apart (column pivoting and Gram-Schmidt, Golub &
Van Loan section 5.4.1; :func:`_determined`), is kept at the topology's own figure and
reported as kept; at most one scale per measured point is fitted, and the choice is made once,
at the topology's own figures. A class no collective crosses, or a
latency hidden behind NCCL's larger per-step latency, is therefore kept rather than refused.

Calibration changes link figures, not paths: routes are shortest-latency, so a latency scaled
far enough would send traffic another way (GPU to GPU over PCIe instead of NVSwitch), which no
real system does. A step that would change a route between GPUs and NICs, or raise the misfit,
is damped (Levenberg-Marquardt) until it does neither, or the fit stops.
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

#: Smallest latency a fit returns (s). Least squares may push a latency the data barely
#: resolve (shaped links where 1 MiB already takes milliseconds) to 0 or below, which no
#: topology accepts (validate_topology wants latency > 0); 1 ns is far below any real link's.
MIN_LATENCY_S = 1e-9

#: Relative step of the finite differences: a secant over 5 % rather than a tangent, since
#: the engine's times are only piecewise smooth in the link figures (max-min shares change
#: where flows meet) and a tiny step can land on one piece's edge.
FD_STEP = 0.05

#: Most GPU/NIC node pairs whose routes a step must keep (the first ones in node order).
MAX_ROUTE_PAIRS = 4096
#: Most damped retries of a step that would change routes or raise the misfit.
MAX_TRIES = 8
#: Most a fit may raise a class's bandwidth over the topology's own figure.
MAX_SPEEDUP = 1000.0

#: Norm of a relative-Jacobian column below which the data say nothing about that scale: a
#: 100-fold change of it would move the predictions by less than 1 %.
NEGLIGIBLE = 1e-4
#: Least distance of a unit column from the span of the columns fitted before it (the sine of
#: the angle, about 3 degrees): closer, and the points cannot tell the two apart.
INDEPENDENT = 0.05


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
def _simulate(G, op, algorithm, nbytes, protocol=None) -> float:
    import emulator
    import topologies

    # The emulator's sizes follow nccl-tests too (allgather: the gathered total).
    if protocol is None:
        return float(emulator.run_collective(G, op, algorithm, int(nbytes)).time_s)
    sched = emulator.build_schedule(op, algorithm, len(topologies.gpus(G)), int(nbytes), graph=G,
                                    protocol=protocol)
    return float(emulator.simulate(G, sched).time_s)


def _closed_form(G, op, algorithm, nbytes, protocol=None) -> float:
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


#: predictor name -> function(G, op, algorithm, nbytes[, protocol]) -> seconds.
PREDICTORS = {"simulate": _simulate, "closed_form": _closed_form}


def predict(G, op: str, algorithm: str, nbytes: int, predictor: str = "simulate",
            protocol: str | None = None) -> float:
    """Seconds the emulator predicts for one collective (nccl-tests ``nbytes`` convention);
    ``protocol`` pins an NCCL algorithm's protocol (the simulating predictor only)."""
    try:
        fn = PREDICTORS[predictor]
    except KeyError:
        raise CalibrationError(f"predictor {predictor!r} not one of {', '.join(PREDICTORS)}") from None
    if protocol is None:
        return fn(G, op, algorithm, nbytes)
    return fn(G, op, algorithm, nbytes, protocol)


def _pinned(G, op: str, algorithm: str, nbytes: int, predictor: str) -> tuple:
    """(algorithm, protocol) the fit predicts a point with: NCCL's choice on the topology's own
    figures, held through the fit (``nccl`` re-chooses with every trial figure, and a choice
    that flips between two finite differences makes the Jacobian meaningless)."""
    import emulator
    from emulator.collectives.nccl import NAMES

    if algorithm != "nccl" or predictor != "simulate":
        return algorithm, None
    plan = emulator.nccl_plan(G, op, int(nbytes))
    name = next(k for k, v in NAMES.items() if v == plan.algorithm)
    return name, plan.protocol


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
    (['bandwidth', 'latency'], ['bandwidth', 'latency'])
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

    pinned = [_pinned(G, c.op, a, c.bytes, predictor) for c, a in zip(points, algos)]

    def times(theta):
        H = scale_links(G, scales_of(theta))
        return np.array([predict(H, c.op, a, c.bytes, predictor, proto)
                         for c, (a, proto) in zip(points, pinned)])

    def misfit(t):
        return float(np.sum(((t - measured) / measured) ** 2))

    theta = np.ones(n)
    # Lower bounds: a latency of MIN_LATENCY_S on the class's mean link; a bandwidth at most
    # MAX_SPEEDUP times the topology's own figure.
    floor = np.full(n, 1.0 / MAX_SPEEDUP)
    for i, k in enumerate(classes):
        floor[2 * i] = MIN_LATENCY_S / max(means[k][0], MIN_LATENCY_S)
    free = np.ones(n, dtype=bool)
    routes = _routes(G)
    base = times(theta)
    lam = 0.0
    iterations = 0
    for iterations in range(1, max_iterations + 1):
        J = np.zeros((len(points), n))
        for j in np.flatnonzero(free):
            step = theta.copy()
            h = max(theta[j], 1e-6) * FD_STEP
            step[j] += h
            J[:, j] = (times(step) - base) / h
        if iterations == 1:
            # What the data determine is decided once, at the topology's own figures: the
            # relative change of prediction i per relative change of scale j.
            free = _determined(J / measured[:, None], len(points))
        if not free.any():
            break
        Af = J[:, free] / measured[:, None]
        r = (measured - base) / measured
        M, g = Af.T @ Af, Af.T @ r
        # Gauss-Newton first (exact where the model is linear); Levenberg-Marquardt damping
        # (Marquardt 1963) when a step would change a route or raise the misfit, as the
        # model is only piecewise smooth (NCCL's per-step latencies, max-min shares).
        trial = None
        for _ in range(MAX_TRIES):
            delta = np.linalg.lstsq(M + lam * np.diag(np.diag(M)), g, rcond=None)[0]
            new = theta.copy()
            new[free] = np.maximum(theta[free] + delta, floor[free])
            if _routes(scale_links(G, scales_of(new))) == routes:
                trial = times(new)
                if misfit(trial) < misfit(base):
                    break
            trial = None
            lam = max(lam * 10.0, 1e-3)
        if trial is None:
            break
        lam = lam / 10.0 if lam > 1e-6 else 0.0
        change = float(np.max(np.abs(new - theta) / np.maximum(np.abs(theta), 1e-30)))
        theta, base = new, trial
        if change < tol:
            break
    scales = scales_of(theta)
    links = {k: (means[k][0] * scales[k][0], means[k][1] / scales[k][1]) for k in classes}
    fitted, kept = {}, {}
    for i, k in enumerate(classes):
        for j, what in ((2 * i, "latency"), (2 * i + 1, "bandwidth")):
            (fitted if free[j] and theta[j] != 1.0 else kept).setdefault(k, []).append(what)
    return Calibration(links=links, fitted_on=tuple((c.op, c.bytes) for c in points),
                       fit_rel_errors=tuple(float(x) for x in (base - measured) / measured),
                       iterations=iterations, predictor=predictor, scales=scales,
                       fitted={k: tuple(v) for k, v in fitted.items()},
                       kept={k: tuple(v) for k, v in kept.items()})


def _routes(G: nx.Graph) -> tuple:
    """The link classes (in order) of the shortest-latency route between each of the first
    :data:`MAX_ROUTE_PAIRS` GPU/NIC pairs that carry collective traffic: what a calibration
    must not change (a route may still move between equal links, an ECMP tie broken the
    other way)."""
    import itertools

    import topologies

    ends = [n for n, d in G.nodes(data=True) if d.get("kind") in ("gpu", "nic")]
    router = topologies.Router(G)

    def carries(a, b) -> bool:
        # Collectives move data GPU to GPU, GPU to a NIC of its own host, NIC to a NIC of
        # another host; a NIC-to-NIC route inside a host carries nothing.
        ka, kb = G.nodes[a].get("kind"), G.nodes[b].get("kind")
        ha, hb = G.nodes[a].get("host"), G.nodes[b].get("host")
        if ka == kb == "gpu" or ha is None or hb is None:
            return True
        return (ha == hb) == (ka != kb)

    pairs = itertools.islice(((a, b) for a, b in itertools.combinations(ends, 2)
                              if carries(a, b)), MAX_ROUTE_PAIRS)
    out = []
    for a, b in pairs:
        path = router.path(a, b)
        out.append(tuple(G.edges[u, v].get("link") or DEFAULT_CLASS
                         for u, v in zip(path, path[1:])))
    return tuple(out)


def _determined(A: np.ndarray, n_points: int) -> np.ndarray:
    """Columns of the relative Jacobian ``A`` the points determine.

    Largest effect first (column pivoting, Golub & Van Loan section 5.4.1), a column is taken
    when a 100-fold change of its scale moves the predictions by at least 1 % (norm at least
    :data:`NEGLIGIBLE`) and its direction is at least :data:`INDEPENDENT` away from the span
    of the columns taken before it (Gram-Schmidt on unit columns): a small figure that the
    data still resolve (1 us of latency where the truth is 30 us) counts, a combination the
    points cannot tell apart does not. At most one column per point.
    """
    norms = np.linalg.norm(A, axis=0)
    free = np.zeros(A.shape[1], dtype=bool)
    basis: list = []
    for j in np.argsort(-norms, kind="stable"):
        if len(basis) >= n_points or not norms[j] >= NEGLIGIBLE:
            break
        v = A[:, j] / norms[j]
        for q in basis:
            v = v - (q @ v) * q
        r = float(np.linalg.norm(v))
        if r >= INDEPENDENT:
            basis.append(v / r)
            free[j] = True
    return free
