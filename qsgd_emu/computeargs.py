"""The compute model's command-line inputs, shared by ``study``, ``demo`` and ``recommend``.

``--device`` (default ``auto``: each topology's own GPU), ``--batch-size`` (samples per GPU;
default: the model's training batch), ``--precision`` (default: what people train with on
the GPU), ``--activation-checkpointing`` (default: as the trace was recorded) and
``--attention-kernel`` (default: FlashAttention-2). The chosen
and the assumed values are printed, one line per topology.
"""
from __future__ import annotations

import argparse
import sys

#: ``qsgd.CHECKPOINTING``'s and ``qsgd.STRATEGIES``' keys, written out: a parser built from
#: them would import torch (2-4 s) before ``--help`` or a typo's error could be printed.
#: tests/qsgd_emu/test_computeargs.py holds them equal to the registries.
CHECKPOINTING_CHOICES = ("none", "blocks", "blocks_full", "selective")
STRATEGY_CHOICES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp_grad_op", "hsdp")


def positive_int(name: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive integer, got {text!r}")
        if v < 1:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive integer, got {text!r}")
        return v
    return parse


def add_arguments(parser: argparse.ArgumentParser, *, device: str = "auto") -> None:
    """Add ``--device``, ``--batch-size``, ``--precision``, ``--activation-checkpointing``,
    ``--attention-kernel`` and ``--codec`` to ``parser``."""
    import emulator

    devices = ", ".join(sorted(emulator.DEVICES))
    parser.add_argument("--device", default=device,
                        help="GPU the compute model times the model's operators on: auto (each "
                             "topology's own GPU), measured (the trace's seconds as they are), or "
                             f"one of {devices}")
    parser.add_argument("--batch-size", type=positive_int("batch-size"), default=None,
                        help="samples per GPU per iteration (default: the model's usual "
                             "training batch)")
    parser.add_argument("--precision", choices=list(emulator.PRECISIONS), default=None,
                        help="training precision (default: amp-bf16 where the GPU has bf16 units, "
                             "amp-fp16 on Volta/Turing, fp32 before)")
    parser.add_argument("--activation-checkpointing", default=None,
                        choices=CHECKPOINTING_CHOICES,
                        help="time the step with every block's activations checkpointed "
                             "(blocks: torch's non-reentrant checkpoint with its early stop; "
                             "blocks_full: the whole block again, reentrant; selective: torchtitan's "
                             "op policy, products' and attention's outputs kept) or not (none); "
                             "default: as the trace was recorded. Re-records the operators")
    parser.add_argument("--attention-kernel", choices=sorted(emulator.ATTENTION_KERNELS),
                        default=None,
                        help="the fused attention kernel the training runs (default flash2: "
                             "FlashAttention-2, PyTorch SDPA's flash backend; flash1: flash-attn "
                             "1.x, about half its speed; triton: FlashAttention in Triton, "
                             "1.4x slower forward and 2x backward)")
    parser.add_argument("--codec", choices=("today", "fused"), default="today",
                        help="QSGD's codec on the GPU: today's, as measured on an H200, or "
                             "'fused', a single-pass codec at half the copy bandwidth (the "
                             "GPU-codec issue's target): what QSGD would buy once it exists")


def ensure_operators(trace, precision: str | None = None, checkpointing: str | None = None,
                     memory: bool = False):
    """``trace`` with operator records (recorded from its model when an older trace lacks
    them, or lacks the operator family of ``precision``, or was recorded with other activation
    ``checkpointing`` than asked for, or, where ``memory`` is reported, before backward's
    transients were recorded): one :func:`qsgd.add_operators`, which owns what to record, and
    a note on stderr saying why."""
    import emulator
    import qsgd

    family = None if precision is None else emulator.PRECISIONS[precision].family
    ops = trace.operators
    if ops is None:
        why = f"the trace of {trace.model} has no operator records; recording them"
    elif checkpointing is not None and ops.extra.get("checkpointing", "none") != checkpointing:
        why = f"recording the operators of {trace.model} with activation checkpointing " \
              f"{checkpointing!r}"
    elif family is not None and family not in ops.families:
        why = f"the trace of {trace.model} has no {family!r} operator records ({precision}); " \
              f"recording them"
    elif memory and ops.without_transients:
        why = f"the trace of {trace.model} was recorded before backward's transient memory " \
              f"was; recording it"
    else:
        return trace
    print(f"note: {why} from the model (meta device)", file=sys.stderr)
    # the precision's family only where it is known (one recording, not three)
    return qsgd.add_operators(trace, families=(family,) if family else None,
                              checkpointing=checkpointing, transients=memory)


def operators_for(trace, args):
    """``trace`` as a study or a recommendation of ``args`` times it: unchanged for
    ``--device measured`` (the trace's own seconds, which ``--activation-checkpointing``
    cannot re-record: refused), else :func:`ensure_operators`."""
    if args.device != "measured":
        return ensure_operators(trace, args.precision, args.activation_checkpointing,
                                memory=getattr(args, "parallelism", "ddp") != "ddp")
    if args.activation_checkpointing is not None:
        raise ValueError(f"--activation-checkpointing {args.activation_checkpointing} re-records "
                         f"the step for the compute model; --device measured replays the "
                         f"trace's own seconds")
    return trace


def say_assumed(models: dict) -> None:
    """One line per topology on stderr: what the compute model assumed."""
    for spec, m in models.items():
        print(f"compute on {spec}: {m.source}", file=sys.stderr)
