"""``qsgd-emu train``: train a real model with DDP and a gradient-compression hook, logging live.

Three ways to launch:

- one process (world size 1): ``qsgd-emu train --compression qsgd --bits 4``;
- N local gloo ranks started by the command itself: ``qsgd-emu train --spawn 4 ...``;
- ``torchrun`` (gloo on CPU, NCCL when CUDA is there)::

      torchrun --nproc-per-node 4 -m qsgd_emu train --compression qsgd --bits 4 \\
          --transport scatter_reduce_allgather --store runs.sqlite

  On SLURM, one torchrun per node, rendezvous on the first node (PyTorch's torchrun docs)::

      #SBATCH --nodes=4 --ntasks-per-node=1 --gpus-per-node=8
      head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
      srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 \\
          --rdzv-backend c10d --rdzv-id "$SLURM_JOB_ID" --rdzv-endpoint "$head:29500" \\
          -m qsgd_emu train --compression qsgd --bits 4 --store "$HOME/runs.sqlite"

Rank 0 writes every step (loss, test accuracy, bytes sent, iteration time, samples/s and the
emulator's predicted iteration time) into the run store that ``qsgd-emu dashboard`` reads.
``--json`` prints the run's summary as JSON.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from testbench.training.compression import COMPRESSIONS
from testbench.training.datasets import DATASETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mlp", help="a qsgd.MODELS name sized to the dataset (mlp)")
    parser.add_argument("--dataset", default="digits", choices=sorted(DATASETS),
                        help="offline dataset: scikit-learn's 8x8 digits, or a synthetic one")
    parser.add_argument("--compression", default="qsgd", choices=sorted(COMPRESSIONS),
                        help="gradient transport: DDP's fp32 allreduce, fp16_compress_hook, "
                             "PowerSGD, or the QSGD hook")
    parser.add_argument("--bits", type=int, default=4, help="QSGD bits per coordinate (8, 4, 2, ...)")
    parser.add_argument("--transport", default="allgather",
                        choices=["allgather", "scatter_reduce_allgather"],
                        help="how the QSGD hook moves payloads: all-gather every payload, or "
                             "scatter chunks to owners that reduce and re-quantize, then all-gather")
    parser.add_argument("--bit-policy", metavar="PATH",
                        help="QSGD width per parameter: a JSON object name -> bits, or the --out file "
                             "of qsgd-emu recommend (its first recommendation's policy)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DDP bucket cap, MiB (a bit policy acts per bucket)")
    parser.add_argument("--parallelism", default="ddp",
                        choices=["ddp", "zero1", "fsdp", "fsdp_grad_op", "hsdp", "zero2", "zero3"],
                        help="data parallelism: DDP, ZeRO-1 (DDP with a sharded optimizer), or "
                             "FSDP2 under a sharded strategy with --compression fp32 or qsgd "
                             "(the quantized reduce-scatter)")
    parser.add_argument("--weight-bits", type=int, default=0,
                        help="sharded runs with qsgd: QSGD bits of the parameter all-gathers "
                             "(QSDP); 0 keeps them dense")
    parser.add_argument("--shard-size", type=int, default=0,
                        help="HSDP's shard group (0: the world size)")
    parser.add_argument("--epochs", type=int, default=5, help="passes over the training set")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the model, the data split and order, and QSGD's randomness")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="also evaluate every K steps (0: at each epoch's end only)")
    parser.add_argument("--hidden", default="256,128", help="MLP hidden widths, comma-separated")
    parser.add_argument("--bucket-size", type=int, default=512, help="QSGD coordinates per scale")
    parser.add_argument("--codec", default="packed", choices=["packed", "elias"],
                        help="QSGD wire coding: fixed-width packing or Elias integer codes")
    parser.add_argument("--min-numel", type=int, default=10_000,
                        help="tensors with fewer elements are sent uncompressed")
    parser.add_argument("--warmup-steps", type=int, default=0, help="plain allreduce steps first")
    parser.add_argument("--error-feedback", action="store_true", help="QSGD with error feedback")
    parser.add_argument("--powersgd-rank", type=int, default=2, help="PowerSGD matrix rank")
    parser.add_argument("--timeout", type=float, default=120.0, dest="timeout_s",
                        help="seconds a collective may take before the run fails")
    parser.add_argument("--topology", default=None,
                        help="topology spec the emulator predicts the iteration time on "
                             "(default switch:N for N ranks; 'none' turns prediction off)")
    parser.add_argument("--store", default=None, help="run store file (default $QSGD_EMU_STORE "
                        "or .qsgd-emu/runs.sqlite)")
    parser.add_argument("--no-store", action="store_true", help="do not log into a run store")
    parser.add_argument("--name", default="", help="run name shown by the dashboard")
    parser.add_argument("--spawn", type=int, default=None, metavar="N",
                        help="start N local gloo ranks (instead of torchrun)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _hidden(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise ValueError(f"--hidden: expected comma-separated ints, got {text!r}") from None
    if not widths or any(w < 1 for w in widths):
        raise ValueError(f"--hidden: expected positive widths, got {text!r}")
    return widths


def read_policy(path: str | None) -> tuple:
    """``(name, bits)`` pairs of a ``--bit-policy`` file (empty without one)."""
    if path is None:
        return ()
    with open(path, encoding="utf-8") as fh:
        try:
            doc = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--bit-policy {path}: not JSON: {exc}") from None
    if isinstance(doc, dict) and "recommendations" in doc:
        recs = doc["recommendations"]
        doc = recs[0].get("policy") if isinstance(recs, list) and recs and isinstance(recs[0], dict) else None
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in doc.items()):
        raise ValueError(f"--bit-policy {path}: expected a JSON object of parameter name -> bits")
    return tuple(sorted(doc.items()))


def config_from_args(args):
    from testbench.training.loop import TrainConfig

    return TrainConfig(model=args.model, dataset=args.dataset, compression=args.compression,
                       bits=args.bits, transport=args.transport, epochs=args.epochs,
                       batch_size=args.batch_size, lr=args.lr, momentum=args.momentum, seed=args.seed,
                       eval_every=args.eval_every, hidden=_hidden(args.hidden),
                       bucket_size=args.bucket_size, codec=args.codec, min_numel=args.min_numel,
                       warmup_steps=args.warmup_steps, error_feedback=args.error_feedback,
                       powersgd_rank=args.powersgd_rank, timeout_s=args.timeout_s, name=args.name,
                       bit_policy=read_policy(args.bit_policy), bucket_cap_mb=args.bucket_cap_mb,
                       parallelism=args.parallelism, weight_bits=args.weight_bits,
                       shard_size=args.shard_size)


def _rank_main(rank: int, world: int, cfg, store_path, run_id, topology):
    """What every rank runs (also the body of --spawn workers); rank 0 logs and returns the summary."""
    from testbench.training.loop import train
    from testbench.training.predict import make_predictor

    store = None
    if rank == 0 and run_id is not None:
        from testbench.store import RunStore

        store = RunStore(store_path)
    predictor = make_predictor(cfg, world, topology) if rank == 0 else None
    try:
        summary = train(cfg, store=store, run_id=run_id, predictor=predictor)
    except BaseException as exc:
        if store is not None:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            store.finish_run(run_id, status, update={"error": f"{type(exc).__name__}: {exc}"})
        raise
    summary.pop("checkpoint", None)
    summary["run_id"] = run_id
    summary["topology"] = None if predictor is None else (topology or f"switch:{world}")
    if store is not None:
        store.finish_run(run_id, "finished", update={
            "final_test_accuracy": summary["final_test_accuracy"], "final_loss": summary["final_loss"],
            "bytes_sent_per_step": summary["bytes_sent_per_step"], "steps": summary["steps"],
            "iteration_s": summary["iteration_s"],
            "predicted_iteration_s": summary["predicted_iteration_s"],
            "topology": summary["topology"]})
    return summary


def _print(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=1, default=str))
        return
    c = summary["config"]
    label = f"qsgd {c['bits']}-bit {c['transport']}" if c["compression"] == "qsgd" else c["compression"]
    if c.get("parallelism", "ddp") not in ("ddp", "zero1"):
        # a sharded run's QSGD is its quantized reduce-scatter (and, with weight bits, gathers)
        label = (f"qsgd {c['bits']}-bit reduce-scatter" + (f", {c['weight_bits']}-bit gathers"
                 if c.get("weight_bits") else "") if c["compression"] == "qsgd" else c["compression"])
    if c.get("parallelism", "ddp") != "ddp":
        label += f" under {c['parallelism']}"
    print(f"run #{summary['run_id']}: {c['model']} on {c['dataset']}, {label}, "
          f"world size {summary['world_size']}, {summary['steps']} steps")
    print(f"  final loss          {summary['final_loss']:.4f}")
    print(f"  final test accuracy {summary['final_test_accuracy'] * 100:.2f} %")
    print(f"  bytes sent / step   {summary['bytes_sent_per_step']:,.0f} bytes per rank")
    measured, predicted = summary.get("iteration_s"), summary.get("predicted_iteration_s")
    if measured is not None:
        print(f"  iteration time      {measured * 1e3:.3f} ms measured (median)")
    if measured and predicted is not None:
        print(f"  predicted           {predicted * 1e3:.3f} ms by the emulator on "
              f"{summary['topology']} ({predicted / measured - 1:+.1%} against measured)")
    elif measured is not None:
        print("  predicted           - (no emulator prediction for this run)")


def run(args) -> int:
    cfg = config_from_args(args)
    from testbench.training import launch

    if args.spawn is not None and args.spawn < 1:
        raise ValueError(f"--spawn: expected a number of ranks >= 1, got {args.spawn}")
    if args.spawn is not None and launch.launched_by_torchrun():
        raise ValueError("--spawn: cannot be combined with torchrun (RANK/WORLD_SIZE are set)")
    world = args.spawn or None
    store_path = None
    run_id = None

    def open_run(world_size):
        nonlocal store_path, run_id
        if args.no_store:
            return
        from testbench.store import RunStore

        store = RunStore(args.store)
        store_path = str(store.path)
        run_id = store.create_run("train", cfg.label(), dict(asdict(cfg), world_size=world_size))

    if world is not None:
        if args.topology is not None:
            # Check --topology here (one line, exit 2) rather than in rank 0 after the ranks
            # started, where a bad spec failed the whole run with a traceback.
            from testbench.training.predict import make_predictor

            make_predictor(cfg, world, args.topology)
        open_run(world)
        try:
            summary = launch.spawn(_rank_main, world, cfg, store_path, run_id, args.topology,
                                   timeout_s=max(600.0, cfg.timeout_s * 4))[0]
        except BaseException as exc:
            if run_id is not None:
                from testbench.store import RunStore

                run = RunStore(store_path).get_run(run_id)
                if run["status"] == "running":
                    RunStore(store_path).finish_run(run_id, "failed", update={"error": str(exc)[:2000]})
            raise
        _print(summary, args.json)
        return 0

    import torch.distributed as dist

    rank, world = launch.init(timeout_s=cfg.timeout_s)
    try:
        if rank == 0:
            open_run(world)
        meta = [(store_path, run_id)]
        dist.broadcast_object_list(meta, src=0)
        summary = _rank_main(rank, world, cfg, store_path, run_id, args.topology)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        _print(summary, args.json)
    return 0
