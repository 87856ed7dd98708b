#!/usr/bin/env bash
# The GPU checks, as one command for a machine with CuPy and a CUDA device
# (the project's lent GPU machine: `device run`, command `bash benchmarks/on_gpu.sh`).
# Runs from the source tree (no install), writes its logs to $OUT (or ./gpu-out):
#   env.log    the device, driver and package versions
#   bench.log  benchmarks/gpu.py, full size
#   tests.log  every test written against the CUDA emulator, on the real device
#              (TRACEGRAD_TEST_ON_GPU=1, tests/conftest.py), plus the GPU-only tests
# Each step has its own time limit, so one that hangs still leaves the others' logs.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BENCH_S=${BENCH_S:-150}
TESTS_S=${TESTS_S:-300}
FILES=${FILES:-"test_cuda.py test_cuda_device.py test_control_flow.py test_cli.py test_injection.py
  test_loops.py test_numpy_coverage.py test_numpy_fft.py test_random.py test_while_orders.py
  test_saved_hooks.py test_devices.py"}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import sys, numpy, cupy; print(sys.version); print('numpy', numpy.__version__, 'cupy', cupy.__version__, 'CUDA runtime', cupy.cuda.runtime.runtimeGetVersion())"
  nproc; } >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

echo "== benchmarks/gpu.py"
timeout "$BENCH_S" $PY benchmarks/gpu.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"

echo "== tests on the device"
(cd tests && TRACEGRAD_TEST_ON_GPU=1 timeout "$TESTS_S" $PY -m pytest -q -p no:cacheprovider \
   -n "${WORKERS:-8}" --timeout 120 -rfE --tb=short $FILES) >"$OUT/tests.log" 2>&1
echo "pytest exit: $?" | tee -a "$OUT/tests.log"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -60
