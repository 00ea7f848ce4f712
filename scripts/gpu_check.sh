#!/usr/bin/env bash
# The GPU acceptance run (scripts/gpu_check.py): the Triton kernel tests on CUDA, pytest -m gpu, maskattn bench --suite gpu, and 50 training
# steps of each multi30k-*-gpu preset with train.compile; writes OUTDIR/gpu.md and OUTDIR/gpu.json.
# Usage: scripts/gpu_check.sh OUTDIR [--budget 510] [--data ../shared/data/multi30k] [--steps 50] [--skip kernels,tests,bench,training]
set -euo pipefail
exec python "$(dirname "$0")/gpu_check.py" "$@"
