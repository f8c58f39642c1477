#!/usr/bin/env bash
# fastloader's GPU checks in one run (see benchmarks/gpu_check.py for what each step shows).
#
# On the GPU machine (one CUDA GPU, 16 cores, its own Python 3.12 + torch, no network), from the repo root:
#   OUT=$OUT bash benchmarks/gpu_check.sh            # about 6-8 minutes; GLC_BUDGET (s, default 500) caps it
# CPU smoke run of the script itself (tiny sizes; CUDA-only steps record {"skipped": "needs CUDA"}):
#   GLC_SMALL=1 GLC_DEVICE=cpu OUT=/tmp/glc_smoke bash benchmarks/gpu_check.sh
#
# Packages the GPU machine lacks travel as wheels in .whl/ (git-ignored) and are unpacked into /tmp/site here
# (GLC_WHEELS=0: not). Results: $OUT/results.jsonl (one JSON line per step, and a {"step": "driver"} line
# per step with its exit status), $OUT/log.txt, $OUT/pytest.txt. Other settings: GLC_STEPS (a subset, in
# order), PYTHON (default python3), SAMPLE (default /tmp/fl_sample), GLC_N_SAMPLE (default 4000).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/glc_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SMALL=${GLC_SMALL:-0}
export OUT GLC_SMALL=$SMALL SAMPLE=${SAMPLE:-/tmp/fl_sample}
PY=${PYTHON:-python3}
T0=$(date +%s)
BUDGET=${GLC_BUDGET:-500}  # seconds; give the run call a timeout_s of about BUDGET + 40
exec > >(tee -a "$OUT/log.txt") 2>&1

# None of these comes with torch: fastloader.datasets imports lmdb and crc32c, ImageFolder's first scan
# tqdm, iterating a DataLoaderX psutil; the pytest step needs pytest (+ pluggy, iniconfig, packaging, pygments).
# On a machine with internet, from the repo root (pins: the versions this project is tested with):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     lmdb==3.0.0 crc32c==2.9.post0 psutil==7.2.2 tqdm==4.70.1 \
#     pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.21.0
# decode_on="cuda" decodes with torchcodec when it is there (else torchvision's deprecated decode_jpeg; the
# env step records which ran and why): carry the torchcodec wheel built for the GPU machine's torch and CUDA
# (env records both; this project is tested with torchcodec 0.17.0, torch 2.14.1, CUDA 13.0), from PyTorch's index:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --index-url https://download.pytorch.org/whl/cu130 -d .whl torchcodec==0.17.0
if [ "${GLC_WHEELS:-1}" != 0 ] && ls .whl/*.whl >/dev/null 2>&1; then
  mkdir -p /tmp/site
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
    echo "pip failed: unpacking the wheels instead"
    "$PY" -c "import sys, zipfile; [zipfile.ZipFile(w).extractall('/tmp/site') for w in sys.argv[1:]]" .whl/*.whl
  fi
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

driver_line() {  # driver_line NAME RC SECONDS: one line per step in results.jsonl, even when it died silently
  printf '{"step": "driver", "name": "%s", "rc": %s, "s": %s, "total_s": %s}\n' "$1" "$2" "$3" \
    "$(($(date +%s) - T0))" >>"$OUT/results.jsonl"
}

step() {  # step NAME SECONDS: its own process, under its own limit, never past the budget
  local name=$1 limit=$2 left t rc
  left=$((BUDGET - ($(date +%s) - T0)))
  if ((left < 15)); then
    echo "### skip $name: out of budget"
    driver_line "$name" '"skipped: out of budget"' 0
    return 0
  fi
  ((limit > left)) && limit=$left
  t=$(date +%s)
  echo "### step $name (limit ${limit}s)"
  timeout -k 5 "$limit" "$PY" benchmarks/gpu_check.py "$name"
  rc=$?
  echo "### step $name rc=$rc in $(($(date +%s) - t))s (total $(($(date +%s) - T0))s)"
  driver_line "$name" "$rc" "$(($(date +%s) - t))"
}

# Most valuable first; the limits are upper bounds (the whole run is expected to take 5-7 minutes).
DEFAULT_STEPS="sample env pytest decode_race decode_equality corrupt rng graph_thread_local graph_global copy_race
  ring throughput wait_fraction scaling"
declare -A LIMIT=(
  [sample]=90 [env]=40 [pytest]=170 [decode_race]=80 [decode_equality]=80 [corrupt]=50 [rng]=50
  [graph_thread_local]=35 [graph_global]=35 [copy_race]=60 [ring]=90 [throughput]=90 [wait_fraction]=90 [scaling]=100
)
for name in ${GLC_STEPS:-$DEFAULT_STEPS}; do
  step "$name" "${LIMIT[$name]:-60}"
done
echo "### done in $(($(date +%s) - T0))s: $OUT/results.jsonl"
