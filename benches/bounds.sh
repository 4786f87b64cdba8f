#!/usr/bin/env bash
# The idle bounds' effect on whole reads (issue 30): each case read whole, warm and then cold, in
# a process under the device's bound alone for pinned memory too (the rule before the pinned
# bound of its own: ZARRS_GPU_POOL_KEEP_BYTES at 2% of the device), and in one under the default
# bounds (`default_pool_keep`, `default_pinned_keep`), then the first again; the disk's ceiling on
# the same files; all in one run:
#   bash benches/bounds.sh [GIB] [REPEAT]
# as root (the cold reads write /proc/sys/vm/drop_caches), from a checkout on a machine with an
# NVIDIA GPU and nvCOMP's library. `bench` and `cold_read` are taken from PATH when there, else
# run with cargo. For CASES (default z2), into OUT (default /tmp/out):
#   bounds.jsonl   `bench --repeat REPEAT --cold REPEAT --sizes 1,288` rows, labelled `device-bound`,
#                  `default-bounds` and `device-bound-again`; each whole-array row ends with what
#                  the pools held idle after a freed result and their bounds (device and pinned MiB)
#   bounds-ceiling.jsonl  `cold_read ARRAY pread 16,128 2`
# BENCH_DIR (default /tmp/zarrs-gpu-bench) keeps the arrays, written once (by `bench`).
set -euo pipefail
gib=${1:-8}
repeat=${2:-5}
cases=${CASES:-z2}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
[ -w /proc/sys/vm/drop_caches ] || { echo "bounds.sh: /proc/sys/vm/drop_caches is not writable (run as root)" >&2; exit 1; }
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
device_bound=$((total_mib * 1048576 / 50)) # default_pool_keep: 2% of the device (at least 1 GiB)
((device_bound >= 1 << 30)) || device_bound=$((1 << 30))
step "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), ${total_mib} MiB; host: $(free -g | awk '/Mem:/ {print $2}') GiB; device bound $device_bound"

rm -f "$out"/bounds.jsonl "$out"/bounds-ceiling.jsonl
for case in ${cases//,/ }; do
  array="$dir/$case.zarr"
  step "$case: the array (written once), then synced so that no write-back meets the reads"
  [ -f "$array/zarr.json" ] || "${bench[@]}" --dir "$dir" --gib "$gib" --cases "$case" --ours-only --tiles-only > /dev/null
  sync
  run() {
    "${bench[@]}" --dir "$dir" --gib "$gib" --cases "$case" --ours-only --repeat "$repeat" --cold "$repeat" \
      --sizes 1,288 --size-reads 15 --label "$1" --json "$out/bounds.jsonl"
  }
  step "$case: the device's bound for pinned memory too"
  ZARRS_GPU_POOL_KEEP_BYTES=$device_bound run device-bound
  step "$case: the default bounds"
  run default-bounds
  step "$case: the device's bound again"
  ZARRS_GPU_POOL_KEEP_BYTES=$device_bound run device-bound-again
  step "$case: the disk's ceiling on the same files"
  "${cold_read[@]}" "$array" pread 16,128 2 | sed "s/^{/{\"array\":\"$case\",/" >> "$out/bounds-ceiling.jsonl"
done
step done
