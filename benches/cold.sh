#!/usr/bin/env bash
# The cold-read benchmark of record (issue 30): for each case, the disk's ceiling measured on the
# array's own files and this project's reads of them, the page cache dropped before every timed
# read, all in one run:
#   bash benches/cold.sh [GIB] [REPEAT]
# as root (it writes /proc/sys/vm/drop_caches), from a checkout on a machine with an NVIDIA GPU
# and nvCOMP's library. `bench`, `cold_read` and `zarrs-gpu` are taken from PATH when there, else
# run with cargo. Steps, for CASES (default u1,z2), each into OUT (default /tmp/out):
#   cold-ceiling.jsonl  the ceiling, `cold_read` REPEAT times: pread and io_uring at 16 and 128
#                       reads in flight, parallel `cat` by 32 and 128; then the ladder down to the
#                       pipeline's read on as many threads as the reader has (the cores): phased
#                       (the store's phases mimicked), store (the GdsStore's own opens and reads),
#                       reader (the device reader into pinned memory), mirrored (each piece also
#                       copied to the device: a checked batch's whole read);
#   cold-bench.jsonl    `bench --cold REPEAT`: the whole array read cold in a process whose pools
#                       are warm (a process that has read before), with each stage's median;
#   cold-cli.jsonl      `zarrs-gpu read --json` in a fresh process, REPEAT times: CUDA's start and
#                       the first allocations included; its stages (ZARRS_GPU_TRACE) in cold-cli.log.
# BENCH_DIR (default /tmp/zarrs-gpu-bench) keeps the arrays, written once (by `bench`).
set -euo pipefail
gib=${1:-8}
repeat=${2:-3}
cases=${CASES:-u1,z2}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
[ -w /proc/sys/vm/drop_caches ] || { echo "cold.sh: /proc/sys/vm/drop_caches is not writable (run as root)" >&2; exit 1; }
now() { date +%s.%N; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

rm -f "$out"/cold-ceiling.jsonl "$out"/cold-bench.jsonl "$out"/cold-cli.jsonl "$out"/cold-cli.log
for case in ${cases//,/ }; do
  array="$dir/$case.zarr"
  step "$case: the array (written once)"
  # Made by bench when absent; its warm read here also leaves nothing timed.
  [ -f "$array/zarr.json" ] || "${bench[@]}" --dir "$dir" --gib "$gib" --cases "$case" --ours-only --tiles-only > /dev/null

  step "$case: the ceiling"
  "${cold_read[@]}" "$array" pread,uring 16,128 "$repeat" | sed "s/^{/{\"array\":\"$case\",/" >> "$out/cold-ceiling.jsonl"
  bytes=$(du -sb "$array" | cut -f1)
  for n in 32 128; do
    drop
    start=$(now)
    find "$array" -type f -print0 | xargs -0 -n 4 -P "$n" cat > /dev/null
    python3 -c "import json,sys; c,n,s,b=sys.argv[1:]; print(json.dumps({'array':c,'reader':'parallel cat','threads':int(n),'seconds':float(s),'bytes':int(b),'gib_s':int(b)/2**30/float(s)}))" \
      "$case" "$n" "$(python3 -c "print($(now) - $start)")" "$bytes" >> "$out/cold-ceiling.jsonl"
  done

  step "$case: the project's layers"
  "${cold_read[@]}" "$array" phased,store,reader,mirrored "$(nproc)" "$repeat" |
    sed "s/^{/{\"array\":\"$case\",/" >> "$out/cold-ceiling.jsonl"

  step "$case: bench --cold $repeat (pools warm)"
  "${bench[@]}" --dir "$dir" --gib "$gib" --cases "$case" --ours-only --tiles-only --cold "$repeat" \
    --json "$out/cold-bench.jsonl" > /dev/null

  step "$case: zarrs-gpu read, a fresh process each"
  for r in $(seq "$repeat"); do
    drop
    ZARRS_GPU_TRACE=1 "${cli[@]}" read "$array" --repeat 1 --json 2>> "$out/cold-cli.log" |
      sed "s/^{/{\"array\":\"$case\",\"cold_run\":$r,/" >> "$out/cold-cli.jsonl"
  done
done
step done
