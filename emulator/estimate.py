"""How long a study's remaining tasks should take, from the tasks that have run.

:func:`emulator.run_study` times its smallest world size first (a pilot) and extrapolates the
rest with :func:`estimate`, to refuse a study over its time limit before its large tasks start
and to show the time left; while that is over the limit, larger world sizes join the pilot.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["COST_EXPONENT", "StudyEstimate", "estimate", "wall_of", "task_label"]


#: How a task's work grows with its GPUs p: every schedule here (rings, trees, all-to-all, the
#: QSGD transports) has O(p) steps of p transfers, so O(p**2) transfers to route and time.
COST_EXPONENT = 2


@dataclass(frozen=True)
class StudyEstimate:
    """How long the rest of a study should take, from the tasks that have run.

    Attributes
    ----------
    seconds : float
        Estimated wall seconds of the remaining tasks on the workers given.
    parts : tuple of (str, float)
        ``(task label, estimated seconds)`` of the remaining tasks, largest first.
    basis : str
        What the estimate extrapolates from.
    by_task : dict
        Task index -> estimated seconds, for the remaining tasks.
    """

    seconds: float
    parts: tuple
    basis: str
    by_task: dict = field(default_factory=dict, compare=False, repr=False)

    def advice(self, limit_s: float) -> str:
        """Why the study is refused, and how to make it smaller."""
        big = "; ".join(f"{label} ~{_minutes(s)}" for label, s in self.parts[:3])
        return (f"the study would take about {_minutes(self.seconds)} on this machine "
                f"({self.basis}), more than the limit of {_minutes(limit_s)}. The largest parts: "
                f"{big}. Make it smaller: fewer or smaller --world-sizes, fewer --transports or "
                f"--bits, more --workers, or a larger --time-limit.")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def task_label(task) -> str:
    """``"SPEC at W GPUs, TRANSPORT"`` of a study task ``(config, spec, world_size, combos)``.

    Examples
    --------
    >>> task_label((None, "switch:{n}", 8, ((32, "fp32"),)))
    'switch:{n} at 8 GPUs, fp32'
    """
    _, spec, w, combos = task
    return f"{spec} at {w} GPUs, {combos[0][1]}"


def wall_of(seconds, workers: int) -> float:
    """Wall seconds of tasks taking ``seconds`` each on ``workers`` processes: their sum
    shared out, but never less than the longest (it cannot be split).

    Examples
    --------
    >>> wall_of([1.0, 1.0, 4.0], workers=2), wall_of([1.0, 1.0, 1.0], workers=2)
    (4.0, 1.5)
    """
    seconds = list(seconds)
    return max(sum(seconds) / max(1, workers), max(seconds, default=0.0))


def estimate(tasks: list, seconds: dict, workers: int, cap=None) -> StudyEstimate:
    """Seconds the tasks not in ``seconds`` should take, from those that are.

    Each task is extrapolated from the largest world size of its (topology, transport) that
    has run, as GPUs**:data:`COST_EXPONENT`. That overestimates from small sizes, whose tasks
    are mostly per-simulation overheads, so :func:`run_study` runs larger pilots while the
    estimate is over its limit.

    Parameters
    ----------
    tasks : list
        The study's tasks ``(config, spec, world_size, combos)``.
    seconds : dict
        Task index -> measured wall seconds, for the tasks already run (at least one per
        (topology, transport)).
    workers : int
        Tasks run at once.
    cap : callable, optional
        ``cap(task)``: at most this many seconds for a task, whatever the extrapolation says
        (an approximate study gives a collective whose engine run would take longer than its
        budget the calibrated closed form, so its largest tasks stop growing as GPUs**2).

    Returns
    -------
    StudyEstimate

    Examples
    --------
    An fp32 task took 0.5 s on 8 GPUs and 2.0 s on 16; its 64-GPU task is extrapolated from
    the 16-GPU one:

    >>> tasks = [(None, "switch:{n}", w, ((32, "fp32"),)) for w in (8, 16, 64)]
    >>> estimate(tasks, {0: 0.5, 1: 2.0}, workers=1).by_task
    {2: 32.0}
    """
    base = {}
    for i, s in seconds.items():
        _, spec, w, combos = tasks[i]
        key = (spec, combos[0][1])
        if key not in base or w > base[key][0]:
            base[key] = (w, s)
    by_task = {}
    for i, task in enumerate(tasks):
        if i in seconds:
            continue
        _, spec, w, combos = task
        w0, s0 = base[(spec, combos[0][1])]
        by_task[i] = s0 * (w / w0) ** COST_EXPONENT
        if cap is not None:
            by_task[i] = min(by_task[i], cap(task))
    parts = sorted(((task_label(tasks[i]), s) for i, s in by_task.items()), key=lambda p: -p[1])
    sizes = sorted({tasks[i][2] for i in seconds})
    basis = (f"its {', '.join(map(str, sizes))}-GPU tasks took {sum(seconds.values()):.1f} s; "
             f"work grows as GPUs**{COST_EXPONENT} from the largest"
             + (", up to the closed form's bound per task" if cap is not None else ""))
    return StudyEstimate(wall_of(by_task.values(), workers), tuple(parts), basis, by_task)
