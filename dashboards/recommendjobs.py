"""The Recommend page's job: QSGD widths per layer group, or a data-parallel strategy.

:func:`recommend_job` runs inside a Dash background callback, as the What-if's
(:mod:`dashboards.jobs`), and returns a JSON-ready dict. With the data parallelism ``ddp``
(the default) it is :func:`emulator.recommend`, the widths per DDP bucket of
``qsgd-emu recommend``; with anything else (``"auto"``: every strategy, or named ones) it is
``emulator.recommend_parallelism``, the function ``qsgd-emu recommend --parallelism``
calls: the fastest strategy, transport and uniform width that fit the GPU. Only the public
APIs of ``emulator`` and ``qsgd`` are used.
"""
from __future__ import annotations

from typing import Any, Mapping

from dashboards import jobs
from dashboards.errors import DashboardError

#: the prefix of the Recommend page's field ids, which its errors name
PAGE = "recommend"


def _no_progress(done: int, total: int, text: str) -> None:
    pass


def _refusal(exc: Exception) -> DashboardError:
    """One line: as it is where it names a field of the page (the budget's value), else after
    ``recommend:``."""
    text = str(exc)
    return DashboardError(text if text.startswith(f"{PAGE}-") else f"recommend: {text}")


def recommend_job(params: Mapping[str, Any], progress: jobs.Progress = _no_progress) -> dict:
    """The recommendation of the form's model (or uploaded trace), topology, world size,
    budget, batch, precision, activation checkpointing, attention kernel and data parallelism.

    ``params`` comes from :func:`dashboards.pages.recommend.params_from_form` (plus
    ``cache_dir``). Widths (parallelism ``ddp``): the
    :meth:`~emulator.Recommendation.to_dict` plus ``"text"``, the configuration to paste.
    A strategy (anything else): ``{"strategy": StrategyChoice.to_dict(), "text", ...}``.
    Both carry ``"compute"``, the compute model's ``to_dict()``, whose assumption the text
    says.
    """
    jobs.check_operators(params, PAGE)  # refusals before measuring
    parallelism = params.get("parallelism") or "ddp"
    if parallelism != "ddp" and params.get("device") == "measured":
        raise DashboardError(f"{PAGE}-parallelism: {parallelism!r} compares strategies by the "
                             f"compute model's times of the trace's operators; the device "
                             f"'measured' replays the trace's own seconds")
    kind, value = params["budget"]
    # Widths per bucket and a variance budget need real gradients: measured on this CPU (with
    # variance records, cached). A strategy under a bits-per-element budget needs only the
    # model's layout and operators: recorded on the meta device, any size; so does one of a
    # model too large to measure here, whose variance budget then cannot apply (said).
    run = parallelism == "ddp" or kind != "bits_per_element"
    if run and parallelism != "ddp" and not params.get("trace") and \
            jobs.model_parameters(params["model"], PAGE) > jobs.CPU_MEASURE_MAX_PARAMETERS:
        run = False
    trace = jobs.with_operators(jobs.workload(dict(params, bits=[4]), progress, run=run, page=PAGE),
                                params, PAGE)
    import emulator

    w = int(params["world_size"])
    try:
        G = emulator.topology_for(str(params["topology"]), w)
        compute = emulator.ComputeModel.for_topology(
            G, trace, device=params.get("device") or "auto", batch_size=params.get("batch_size"),
            precision=params.get("precision"), attention=params.get("attention"))
    except ValueError as exc:
        raise _refusal(exc) from None
    if parallelism != "ddp":
        return _strategy(emulator, trace, G, compute, params, progress)
    return _widths(emulator, trace, G, compute, params, progress)


def _widths(emulator, trace, G, compute, params, progress) -> dict:
    """:func:`emulator.recommend`: widths per bucket, the front and the ``QSGDState`` to paste."""
    w = int(params["world_size"])
    progress(0, 1, f"searching widths at {w} GPUs")
    count = [0]

    def on_progress(msg: str) -> None:
        count[0] += 25
        progress(count[0], count[0] + 25, msg)

    try:
        budget = emulator.budget_for(trace, w, *params["budget"], name=f"{PAGE}-value")
        rec = emulator.recommend(trace, G, world_size=w, budget=budget, compute=compute,
                                 transports=tuple(params["transports"]), progress=on_progress)
    except ValueError as exc:
        raise _refusal(exc) from None
    progress(1, 1, f"done: {rec.evaluated} candidates in {rec.search_s:.1f} s")
    out = rec.to_dict()
    out["text"] = "\n".join([
        f"# {rec.best.transport}, widths per bucket {list(rec.best.bits)}: "
        f"{rec.best.iteration_s * 1e3:.2f} ms per iteration, {rec.speedup_fp32:.2f}x over fp32, "
        f"{rec.speedup_fp16:.2f}x over fp16, variance increase {rec.best.variance:.4g}",
        *([f"# {rec.note}"] if rec.note else []),
        f"# assumed: {compute.source}",
        rec.state_snippet()])
    out["compute"] = compute.to_dict()
    return out


def _strategy(emulator, trace, G, compute, params, progress) -> dict:
    """``emulator.recommend_parallelism``, as ``qsgd-emu recommend --parallelism``."""
    w = int(params["world_size"])
    parallelism = params["parallelism"]
    progress(0, 1, f"predicting {parallelism} at {w} GPUs")
    try:
        choice = emulator.recommend_parallelism(
            trace, G, world_size=w, compute=compute, parallelism=parallelism,
            budget=tuple(params["budget"]), budget_name=f"{PAGE}-value")
    except ValueError as exc:
        raise _refusal(exc) from None
    b = choice.best
    progress(1, 1, f"done: {len(choice.options)} options")
    width = "" if b.transport == "fp32" else f" {b.bits}-bit"
    text = "\n".join([
        f"# {b.strategy} with {b.transport}{width}: {b.iteration_s * 1e3:.2f} ms per iteration, "
        f"{b.memory_per_gpu / 1e9:.3g} GB per GPU of {choice.device_memory}, at "
        f"{choice.world_size} GPUs",
        *[f"# note: {n}" for n in choice.notes],
        f"# assumed: {compute.source}"])
    return {"strategy": choice.to_dict(), "text": text, "compute": compute.to_dict(),
            "parallelism": parallelism}
