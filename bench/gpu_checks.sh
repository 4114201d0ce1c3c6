#!/usr/bin/env bash
# The checks that need a GPU, as one prepared run of a few minutes per phase.
#
# Here, once (the GPU machine reaches no package index; its image has jax with CUDA, torch,
# transformers, cython and pytest):
#   bash bench/gpu_checks.sh wheels       # the other dependencies as wheels in .whl/ (ignored)
# There, from a copy of the project's root with .whl/ beside it:
#   bash bench/gpu_checks.sh setup tests  # install the wheels, build, the GPU tests
#   bash bench/gpu_checks.sh startup      # start-up with the grid compiled behind it
#   bash bench/gpu_checks.sh grid         # XLA's compile options: the grid's time, and W1/W2's
#   bash bench/gpu_checks.sh attention    # the attention kernels on the same packed batches
#   bash bench/gpu_checks.sh bench        # W1 and W2 on Qwen3-0.6B's shape beside transformers
#                                         # on cuda, Triton and Mosaic forms
#   bash bench/gpu_checks.sh host         # the host bench on that machine's processor
# Reports and whole test logs go to $OUT (default /tmp/gpu-checks). MODEL_TESTS names the second
# group of tests (default tests/test_models.py tests/test_paging.py), STARTUP_S the start-up's
# limit in seconds (default 240), COMPILE_WORKERS the programs it compiles at once (default 1).
# QUICK=1 runs the benches at their smallest, to try the script on a machine without a GPU (where
# the GPU-only tests skip).
# Two phases may run side by side on one GPU when each is given part of its memory
# (XLA_PYTHON_CLIENT_MEM_FRACTION); the timings of such a run share the processor.
# On one H100 (16 cores) the phases took: setup 25 s (the build, when it fails, 3 s), the kernel
# tests 68 s, the model and paging tests 285 s, attention 20 s, bench's W1 beside transformers
# 72 s and W2 47 s. On one H200 (16 cores): setup 75 s (the build 60 s), `setup bench attention`
# 242 s, then `tests` (MODEL_TESTS=tests/test_paging.py: 58 s + 186 s) beside `startup` (269 s)
# in a second call of 274 s. A new machine's start and the transfers took about 33 s. On another
# H200 (2e74959): setup 149 s (the build 131 s), then `tests` (MODEL_TESTS=tests/test_models.py:
# the Triton tests 33 s, the Mosaic GPU module 123 s, the models 91 s) beside `startup` (108 s)
# in 261 s, and `bench` 153 s in a second call on the same machine (built outputs kept).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-checks}
SITE=${SITE:-/tmp/gpu-site}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
# the dependencies the GPU image lacks, for its Python (3.12)
WHEELS="trio outcome sniffio sortedcontainers attrs msgspec gguf starlette hypercorn h11 h2 hpack
hyperframe priority wsproto taskgroup prometheus_client anyio hypothesis absl-py"

log() { echo "=== $(date +%T) $*"; }
# `limited SECONDS CMD...`: CMD's last lines, and its exit status (124: it ran out of time)
limited() { { timeout "$1" "${@:2}"; echo "exit status $?"; } 2>&1 | grep -v "it/s]" | tail -6; }

wheels() {
  log "wheels for Python 3.12 into .whl/"
  mkdir -p .whl
  # shellcheck disable=SC2086
  pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl $WHEELS
  ls .whl | wc -l
}

setup() {
  log setup
  nvidia-smi -L 2>/dev/null || echo "no GPU here"
  nproc
  if [ -d .whl ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1
  fi
  $PY -c "import jax, torch, transformers; print('jax', jax.__version__, jax.devices(),
    'torch', torch.__version__, 'transformers', transformers.__version__)"
  log build
  (time $PY setup.py -q build_ext --inplace -j "$(nproc)") > "$OUT/build.log" 2>&1
  grep -iE -m 20 "error|fatal|no module|not found" "$OUT/build.log"
  tail -4 "$OUT/build.log"
  $PY -c "import _native, score_kernels.schedule as s, engine.text.native_tokenizer as t
print('compiled', _native.COMPILED, 'schedule', sorted(s.IMPLEMENTATIONS), 'bpe', t._byte_bpe is not None)"
}

# `pytest_ NAME SECONDS ARGS...`: the whole log in $OUT/NAME.log, its end here
pytest_() {
  { timeout "$2" $PY -m pytest -q -p no:cacheprovider -rfE --durations 5 "${@:3}"
    echo "exit status $?"; } > "$OUT/$1.log" 2>&1
  tail -25 "$OUT/$1.log"
}

tests() {
  log "tests: the compiled kernels (Pallas' Triton form; the Mosaic GPU form's whole module)"
  pytest_ tests-kernels 150 tests/test_pallas.py -k compiled
  pytest_ tests-mosaic 200 tests/test_mosaic_gpu.py
  log "tests: the families beside transformers, f32 exact, paging, on the GPU"
  # shellcheck disable=SC2086
  pytest_ tests-models 300 ${MODEL_TESTS:-tests/test_models.py tests/test_paging.py}
}

# QUICK=1: SmolLM2's shape at its smallest
quick_args() { [ "${QUICK:-0}" = 1 ] && echo "--shape smollm2-135m --quick" || echo "--shape qwen3-0.6b"; }

attention() {
  local kernels=(--kernels pallas mosaic xla)
  [ "${QUICK:-0}" = 1 ] && kernels=(--kernels xla --tokens 1024 --repeats 1)
  log "bench attention: the kernels on the same packed batches"
  limited 120 $PY -m bench attention --dtype bfloat16 "${kernels[@]}" --json "$OUT/attention.json"
}

bench() {
  # JAX allocates as it needs beside the torch baseline (bench's own default; a baseline batch size
  # that does not fit is left out). QUICK=1 (no GPU): the smallest runs of SmolLM2's shape, XLA's
  # attention alone, the baseline on the CPU
  local device=cuda forms=(mosaic pallas)
  local w1=(--repeats 5 --batch-sizes 16 32 64)
  local w2=(--repeats 3 --batch-sizes 32 128 --naive-sample 16 --naive-batch-sizes 8 32)
  if [ "${QUICK:-0}" = 1 ]; then
    device=cpu forms=(xla) w1=() w2=()
  fi
  # shellcheck disable=SC2207
  local common=($(quick_args) --no-progress --no-precompile)
  log "bench w1 beside transformers on $device (${forms[0]} attention)"
  limited 150 $PY -m bench w1 "${common[@]}" --attention "${forms[0]}" \
    --baseline-device $device "${w1[@]}" --json "$OUT/w1.json"
  log "bench w2 beside transformers on $device (${forms[0]} attention)"
  limited 200 $PY -m bench w2 "${common[@]}" --attention "${forms[0]}" \
    --baseline-device $device "${w2[@]}" --json "$OUT/w2.json"
  for form in "${forms[@]:1}"; do
    log "bench w1 and w2, $form attention"
    limited 90 $PY -m bench w1 "${common[@]}" --engine-only --attention "$form" --repeats 5
    limited 90 $PY -m bench w2 "${common[@]}" --engine-only --attention "$form" --repeats 3
  done
  log done
}

host() {
  log "bench host"
  # shellcheck disable=SC2046
  limited 90 $PY -m bench host $(quick_args) --no-progress --no-precompile --json "$OUT/host.json"
}

startup() {
  log "bench startup: ready, and the whole grid compiled behind it (no compile cache)"
  # shellcheck disable=SC2046
  limited "${STARTUP_S:-240}" $PY -m bench startup $(quick_args) --no-progress --modes background \
    --compile-workers "${COMPILE_WORKERS:-1}" \
    --json "$OUT/startup.json"
}

# XLA's GPU compile options that may shorten the grid's compile (about 4.5 s a program on the H200,
# 20 programs at the default budget), each beside the default: the grid at token budget 1536 (6
# programs), then W1 and W2 on the engine alone, to see what each costs once compiled. The last
# records while loops in command buffers: the score rows' loop (`engine.models.rows`) has a
# dynamic trip count, which XLA's GPU runtime otherwise reads back to the host every step
GRID_FLAGS=("" "--xla_gpu_autotune_level=0" "--xla_gpu_enable_triton_gemm=false"
  "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL")

# `xla FLAGS CMD...`: CMD with FLAGS added to XLA_FLAGS (none: as it is)
xla() {
  if [ -n "$1" ]; then XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }$1" "${@:2}"; else "${@:2}"; fi
}

grid() {
  local budget=1536 i=0 flags
  [ "${QUICK:-0}" = 1 ] && budget=512
  # shellcheck disable=SC2046
  for flags in "${GRID_FLAGS[@]}"; do
    i=$((i + 1))
    log "the grid at token budget $budget, XLA_FLAGS ${flags:-as they are}"
    xla "$flags" limited "${GRID_S:-150}" $PY -m bench startup $(quick_args) --no-progress \
      --modes background --token-budget $budget --json "$OUT/grid-$i.json"
    xla "$flags" limited 90 $PY -m bench w1 $(quick_args) --no-progress --no-precompile \
      --engine-only --repeats 5
    xla "$flags" limited 90 $PY -m bench w2 $(quick_args) --no-progress --no-precompile \
      --engine-only --repeats 3
  done
}

export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
for phase in "$@"; do
  case "$phase" in
    wheels | setup | tests | startup | grid | attention | bench | host) "$phase" ;;
    *) echo "unknown phase $phase: wheels, setup, tests, startup, grid, attention, bench or host" >&2
      exit 2 ;;
  esac
done
