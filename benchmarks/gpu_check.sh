#!/usr/bin/env bash
# The GPU checks in one run, for a lent CUDA machine (about 3 minutes of device time):
# the CUDA tests (bit-identical payloads on CPU and CUDA, no host synchronisation in the device
# codec, two CUDA ranks training identically through the hook, measurement on CUDA), then
# benchmarks/cuda_hook.py (host synchronisations and step times of the hook on CUDA), then
# `qsgd-emu bench qsgd --device cuda` (its table reports GB/s against a device-to-device copy),
# then benchmarks/gpu_compute.py (the compute model per operator class against the profiled
# kernels of ResNet-50, GPT-2 and a Llama block at two batches and two precisions).
# The tests import simpy (through testbench); where the machine has no simpy and no index,
# carry its wheel and put it on PYTHONPATH first.
#
#   bash benchmarks/gpu_check.sh [PYTHON]    # PYTHON: an interpreter whose torch sees CUDA
#
# Writes its output to $OUT (or out/gpu) as device.txt, gpu_tests.txt, cuda_hook.txt,
# bench_cuda.txt and gpu_compute.txt, and prints
# them; copy the figures, with the card's name, into benchmarks/RESULTS.md.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${1:-${PYTHON:-python3}}
DEST=${OUT:-out/gpu}
mkdir -p "$DEST"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: $PY's torch does not see a CUDA device; nothing to run" >&2
    exit 2
fi
"$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| CUDA", torch.version.cuda)' | tee "$DEST/device.txt"

status=0
timeout 300 "$PY" -m pytest -q -m gpu tests/qsgd -p no:cacheprovider 2>&1 | tee "$DEST/gpu_tests.txt" || status=1
timeout 300 "$PY" benchmarks/cuda_hook.py --json "$DEST/cuda_hook.json" 2>&1 | tee "$DEST/cuda_hook.txt" || status=1
timeout 300 "$PY" -m qsgd_emu bench qsgd --device cuda 2>&1 | tee "$DEST/bench_cuda.txt" || status=1
timeout 300 "$PY" benchmarks/gpu_compute.py --json "$DEST/gpu_compute.json" 2>&1 | tee "$DEST/gpu_compute.txt" || status=1
exit $status
