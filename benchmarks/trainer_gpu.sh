#!/usr/bin/env bash
# The built-in trainer on one GPU shared by two ranks under CUDA MPS: the synchronous baseline
# against each knob, DBP included (it hung under MPS before it ran on one thread).
#
#   benchmarks/trainer_gpu.sh OUT
#
# Starts an MPS daemon of its own, runs benchmarks/trainer_gpu.py (two jobs of two torchruns;
# at most 120 s of runs, start-ups included), stops the daemon, times the synthetic data source
# on the GPU (benchmarks/data_source.py, ~15 s), and leaves OUT/table.md (also printed),
# OUT/results.json, OUT/logs/ (each node's output), OUT/runs/<config>/, OUT/data_source.md and
# OUT/mps/ (the daemon's logs): under 150 s in all. Without a GPU it says so and exits 0;
# without MPS it runs the GPU time-sliced and says so in the table.
set -u
out=${1:?usage: benchmarks/trainer_gpu.sh OUT}
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
if ! "$py" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  exec "$py" benchmarks/trainer_gpu.py "$out"  # prints that there is no GPU, exits 0
fi
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  echo "trainer_gpu.sh: nvidia-cuda-mps-control not found: running time-sliced"
  exec "$py" benchmarks/trainer_gpu.py "$out" --sharing "time slices (no MPS daemon)"
fi
export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/recprof_mps_pipe.XXXX)
CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/recprof_mps_log.XXXX)
if ! nvidia-cuda-mps-control -d; then
  echo "trainer_gpu.sh: the MPS daemon did not start: running time-sliced"
  exec "$py" benchmarks/trainer_gpu.py "$out" --sharing "time slices (MPS failed to start)"
fi
mps_up=1
stop_mps() {
  [ "$mps_up" = 1 ] || return 0
  mps_up=0
  echo quit | nvidia-cuda-mps-control
  mkdir -p "$out/mps" && cp "$CUDA_MPS_LOG_DIRECTORY"/* "$out/mps/" 2>/dev/null
}
trap stop_mps EXIT
"$py" benchmarks/trainer_gpu.py "$out" --sharing "CUDA MPS" --budget 120
status=$?
stop_mps
"$py" benchmarks/data_source.py --device cuda --repeat 5 | tee "$out/data_source.md"
exit $status
