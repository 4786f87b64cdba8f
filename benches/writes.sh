#!/usr/bin/env bash
# The write benchmark of record (issue 29): the disk's ceiling, then ours and the peers on the same
# data in one run.
#   bash benches/writes.sh [GIB] [REPEAT]
# from a checkout on a machine with an NVIDIA GPU, nvCOMP's library and, for the peers, Python with
# zarr, numcodecs, cupy and tensorstore. `bench` and `zarrs-gpu` are taken from PATH when there
# (a machine without a Rust toolchain, given the built programs), else run with cargo.
# Steps, each into OUT (default /tmp/out):
#   ceiling.jsonl     benches/ceiling.sh: flushed and unflushed file writes, cold reads;
#   write.jsonl       bench --write (durability sync) for CASES (default z2,u1,s1,b1,g2): each
#                     array written whole from device memory (median of REPEAT after one), a tile
#                     row (random unaligned 64x256x256 tiles), an all-nvCOMP row for compressed
#                     cases, zarrs' own writer from host memory; then libzstd's ratios at levels 1
#                     and 3 on 256 chunks of Z2's data (bench --ratios), beside nvCOMP's;
#   convert.log       zarrs-gpu convert of B1 into 128 MiB shards of zstd inner chunks;
#   write-peers.jsonl benches/write_peers.py (1 GiB): zarr-python (numpy, GPU mode), tensorstore,
#                     zarrs_gpu (CuPy, numpy) into zstd, gzip and Blosc arrays, each read back.
# BENCH_DIR (default /tmp/zarrs-gpu-bench) keeps the source arrays, written once.
set -euo pipefail
gib=${1:-8}
repeat=${2:-2}
cases=${CASES:-z2,u1,s1,b1,g2}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"

step ceiling
bash "$here/ceiling.sh" /tmp/zarrs-gpu-ceiling 4 > "$out/ceiling.jsonl"

step "bench --write ($cases)"
rm -f "$out/write.jsonl"
"${bench[@]}" --dir "$dir" --gib "$gib" --cases "$cases" --ours-only --tiles-only --tiles 0 \
  --write --write-durability sync --repeat "$repeat" --json "$out/write.jsonl" > "$out/write.log" 2>&1
"${bench[@]}" --dir "$dir" --gib "$gib" --cases z2 --ratios 256 --json "$out/write.jsonl" >> "$out/write.log" 2>&1

step convert
sync
"${cli[@]}" convert "$dir/b1.zarr" /tmp/zarrs-gpu-convert.zarr --codec zstd --chunks 64,64,64 \
  --shard 128,512,512 > "$out/convert.log" 2>&1
rm -rf /tmp/zarrs-gpu-convert.zarr

step write peers
python3 "$here/write_peers.py" --dir /tmp/zarrs-gpu-write-peers --gib 1 --repeat "$repeat" \
  --cases zstd,gzip,blosc --json "$out/write-peers.jsonl" > /dev/null 2> "$out/write-peers.err"
step done
