#!/usr/bin/env bash
# The GPU check of temper, on a machine with one CUDA GPU: the tests marked `gpu`, then benchmarks/gpu.py, which
# writes benchmarks/results/gpu.md (or DIR/gpu.md). Needs no network: on a machine without temper's Python
# dependencies, put their wheels in .whl/ first (see the README, "Training on GPUs"); they are installed into
# /tmp/site and put first on PYTHONPATH.
#   bash benchmarks/gpu.sh [DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out_dir=${1:-benchmarks/results}
mkdir -p "$out_dir"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::FutureWarning TOKENIZERS_PARALLELISM=false
export TEMPER_COMMIT=${TEMPER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS
"$py" -m pytest -q -p no:cacheprovider -m gpu tests/gpu 2>&1 | tee "$out_dir/gpu-tests.log"
echo "gpu tests: $((SECONDS - t0)) s"
"$py" benchmarks/gpu.py --out "$out_dir/gpu.md" --tests-log "$out_dir/gpu-tests.log" "${@:2}"
