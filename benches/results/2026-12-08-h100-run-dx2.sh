#!/usr/bin/env bash
# Run DX2: the host's chain walk with four blocks side by side a thread (5c1ab28, host_walks now
# up to about 26 Z2 chunks) and spans up to 3,072 blocks (ae80fe8), beside ae80fe8's bench.
# Prepare here: `../shared/gpu/stage --tests '^(device|zarrs_gpu_codecs)'`, then
# `bash benches/gpu_extras.sh --bench ae80fe8`. On the GPU host:
#   BUDGET=300 bash .gpu/run bash benches/results/2026-12-08-h100-run-dx2.sh
# The walk timed on the host's 16 cores (one after another, two and four side by side, the
# broadcast); the Z2 rows of this build and ae80fe8's in turn, twice; tiles and crops of both;
# the device tests of the zstd routes.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-300}
xz -dc .gpu/bench-ae80fe8.xz > /tmp/bench-old && chmod +x /tmp/bench-old
timeout 150 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
T=$(ls /tmp/gpu-bin/bin/tests/zarrs_gpu_codecs-* | head -1)
for i in 1 2 3; do
  (cd zarrs_gpu_codecs && timeout 30 $T --ignored --exact codecs::zstd::decode::tests::time_the_parts_of_the_hosts_chain_walk \
    --nocapture 2>&1 | grep blocks >> $OUT/log.txt)
done
log "walk timed $(el)"
for r in 1 2; do
  rows HEAD bench z2
  rows ae80fe8 /tmp/bench-old z2
done
tiles bench bench z2
tiles /tmp/bench-old /tmp/bench-old z2
staged_tests "compressed:: retrieval::" "none_here"
summary
