# What the bench scripts share (sourced): where they write and keep arrays, and their programs,
# run as staged on the GPU host (on PATH) or else through cargo from this checkout.
out=${OUT:-/tmp/out}; mkdir -p "$out"
dir=${BENCH_DIR:-/tmp/zarrs-gpu-bench}
export PYTHONUNBUFFERED=1
# The command running example (or, with --bin, binary) NAME, into the array named by $2.
program() {
  local -n cmd=$2
  if command -v "$1" >/dev/null; then cmd=("$1")
  elif [ "${3:-}" = --bin ]; then cmd=(cargo run --release --bin "$1" --)
  else cmd=(cargo run --release --example "$1" --); fi
}
program bench bench
program zarrs-gpu cli --bin
program cold_read cold_read
program remote_get get
step() { echo "=== $(date +%T) $*"; }
