"""A d_model-768 decoder on the A100 two ways: llm-foundry's MPT-125M and flash-attn's GPT3-125M.

The published-run registry's MPT-125M rows (llm-foundry, A100 40GB, Triton FlashAttention,
pure bf16) are predicted 34-38 % fast. This prints where the predicted step goes (device
seconds per operator class) and, beside it, the same decoder shape as flash-attn's own
training code runs it (``training/configs/experiment/pile/gpt3s-flash.yaml`` at 80 GB: 32
sequences of 2,048 per GPU, bf16 autocast) on each attention kernel, against the throughput
its training README prints for GPT3-125M on 8 x A100 80GB (1,310k tokens/s: 163.75k per GPU).
That README does not say which FlashAttention it ran, so the figure is a diagnostic, not
test data (benchmarks/RESULTS.md, "The attention kernel each run used").

    python benchmarks/small_decoder.py
"""
from __future__ import annotations

import collections
import os

import torch

import qsgd
from emulator.compute import ATTENTION_KERNELS, device, kernel_seconds, precision, step_times
from emulator.validation.attention import AttentionCase, predict_attention_case
from emulator.validation.published import DEFAULT_DIR, load_run

#: flash-attn's training README, "Training speed": GPT3-125M, 1310k tokens/s on 8 x A100 80GB.
FLASH_ATTN_TOKENS_PER_GPU = 1_310_000 / 8


def mpt125m_breakdown() -> None:
    run = load_run(os.path.join(DEFAULT_DIR, "llmfoundry-mpt125m-fsdp-a100-40gb-bf16.json"))
    name, args = run.zoo
    prec, dev = precision(run.precision), device(run.device)
    with torch.device("meta"):
        model = qsgd.build_model(name, **args)
    fam = qsgd.record_operators(model, families=(prec.family,)).family(prec.family)
    t = step_times(fam, run.batch_size, dev, prec, attention=run.attention_kernel)
    by_kind: dict = collections.Counter()
    for (_, kind), s in t.kernel_s.items():
        by_kind[kind] += s
    total = sum(by_kind.values())
    print(f"MPT-125M as the registry runs it: {dev.name} {prec.name}, batch {run.batch_size} x "
          f"{args['seq_len']}, attention {run.attention_kernel}: step {t.step_s * 1e3:.1f} ms")
    for kind, s in by_kind.most_common():
        print(f"  {kind:12s} {s * 1e3:8.1f} ms {s / total:6.1%}")
    vocab = [kernel_seconds(op, run.batch_size, dev, prec.mode(op.kind, op.dtype, dev))
             for op in fam.ops if op.kind == "gemm"
             and args["vocab_size"] in op.gemms_at(run.batch_size)[0]]
    print(f"  of the products, the {len(vocab)} with the vocabulary: {sum(vocab) * 1e3:.1f} ms")


def gpt3_125m() -> None:
    args = {"n_layer": 12, "n_embd": 768, "n_head": 12, "seq_len": 2048, "n_positions": 2048,
            "vocab_size": 50264}
    print(f"GPT3-125M as flash-attn's training code runs it (A100-80GB amp-bf16, batch 32 x "
          f"2048); published {FLASH_ATTN_TOKENS_PER_GPU / 1e3:.2f}k tokens/s per GPU")
    cache: dict = {}
    for kernel in ATTENTION_KERNELS:
        r = predict_attention_case(AttentionCase("gpt3-125m", "", "", args, kernel, "A100-80GB",
                                                 "amp-bf16", 32, 1.0), cache=cache)
        print(f"  {kernel:7s} {r['tokens_per_s'] / 1e3:7.1f}k tokens/s per GPU "
              f"({r['tokens_per_s'] / FLASH_ATTN_TOKENS_PER_GPU - 1:+.1%})")


if __name__ == "__main__":
    mpt125m_breakdown()
    gpt3_125m()
