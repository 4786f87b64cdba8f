#!/usr/bin/env bash
# A process's first read pins its buffers (issue 30): how fast each way of pinning is, and what
# it does to one-shot reads, all in one run:
#   bash benches/pinning.sh [GIB] [REPEAT]
# as root (the cold reads write /proc/sys/vm/drop_caches), from a checkout on a machine with an
# NVIDIA GPU and nvCOMP's library. `bench`, `cold_read` and `zarrs-gpu` are taken from PATH when
# there, else run with cargo. For CASES (default z2), into OUT (default /tmp/out):
#   pin.jsonl       `cold_read --pin 256 MiB,1.19 GB`: cuMemHostAlloc, huge pages and 4 KiB pages
#                   registered, each then copied to the device once (with the THP settings)
#   pinning.jsonl   `zarrs-gpu read --json`, a fresh process each, REPEAT times cold (page cache
#                   dropped) and REPEAT times warm, under ZARRS_GPU_PINNED_PAGES=alloc, huge, alloc
# BENCH_DIR (default /tmp/zarrs-gpu-bench) keeps the arrays, written once (by `bench`).
set -euo pipefail
gib=${1:-8}
repeat=${2:-3}
cases=${CASES:-z2}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
[ -w /proc/sys/vm/drop_caches ] || { echo "pinning.sh: /proc/sys/vm/drop_caches is not writable (run as root)" >&2; exit 1; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

step "pinning rates"
"${cold_read[@]}" --pin $((256 << 20)),1190000000 > "$out/pin.jsonl"
rm -f "$out/pinning.jsonl" "$out/pinning.log"
for case in ${cases//,/ }; do
  array="$dir/$case.zarr"
  step "$case: the array (written once)"
  [ -f "$array/zarr.json" ] || "${bench[@]}" --dir "$dir" --gib "$gib" --cases "$case" --ours-only --tiles-only > /dev/null
  sync
  for pages in alloc huge alloc; do
    for temp in cold warm; do
      step "$case: ZARRS_GPU_PINNED_PAGES=$pages, $temp, a fresh process each"
      [ "$temp" = warm ] && ZARRS_GPU_PINNED_PAGES=$pages "${cli[@]}" read "$array" --repeat 1 > /dev/null
      for r in $(seq "$repeat"); do
        [ "$temp" = cold ] && drop
        ZARRS_GPU_PINNED_PAGES=$pages ZARRS_GPU_TRACE=1 "${cli[@]}" read "$array" --repeat 1 --json 2>> "$out/pinning.log" |
          sed "s/^{/{\"array\":\"$case\",\"pinned_pages\":\"$pages\",\"cache\":\"$temp\",\"run\":$r,/" >> "$out/pinning.jsonl"
      done
    done
  done
done
step done
