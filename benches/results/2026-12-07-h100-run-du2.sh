#!/usr/bin/env bash
# Run DU2 (build 3143014, beside 923810a's bench as .gpu/bench-923810a.xz): zstd_sequence_lanes
# with each lane's tables in its thread block's shared memory (4 bytes a state). The kernels'
# replay (four ways); decoder-only rows with 4 lanes a thread block (decode.rs' LANE_THREADS),
# 2 and 8, and a warp a block; the bench's Z2 rows and whole reads (Z2 checksummed, B2) of this
# build and 923810a's; a 1,024-chunk read traced; the device tests of the zstd paths.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-400}
xz -dc .gpu/bench-923810a.xz > /tmp/bench-old && chmod +x /tmp/bench-old
timeout 150 bench --dir /tmp/b --gib 1 --cases z2,z2c,b2 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
timeout 150 $H --frames 1,64,288,1024,8192 --label "4 lanes" --json $OUT/harness.jsonl > $OUT/harness.txt 2>&1
log "harness rc=$? $(el)"
export ZSTD_SKIP_REPLAY=1
timeout 60 $H --frames 288,1024,8192 --lane-threads 2 --label "2 lanes" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
timeout 60 $H --frames 288,1024,8192 --lane-threads 8 --label "8 lanes" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
timeout 60 $H --frames 1024 --split 1 --label "warp a block" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
unset ZSTD_SKIP_REPLAY
log "harness variants $(el)"; grep -E "mismatch|ours|Error|error" $OUT/harness.txt | cut -c1-230 >> $OUT/log.txt
rows new bench z2
rows old /tmp/bench-old z2
for b in bench /tmp/bench-old; do
  for c in z2c b2; do
    timeout 40 $b --dir /tmp/b --gib 1 --cases $c --ours-only --tiles 0 --repeat 5 --label "whole $b" \
      --json $OUT/rows.jsonl > /tmp/w.log 2>&1 || { log "$b $c rc=$?"; tail -3 /tmp/w.log >> $OUT/log.txt; }
  done
done
log "whole reads $(el)"
ZARRS_GPU_TRACE=1 timeout 60 bench --dir /tmp/b --gib 1 --cases z2 --sizes 1024 --size-reads 3 --ours-only --tiles 0 \
  --repeat 1 --label trace --json /tmp/trace-rows.jsonl > /tmp/trace.out 2> /tmp/trace.log
log "trace rc=$? $(el)"; grep "zarrs_gpu trace" /tmp/trace.log | cut -c1-600 > $OUT/trace.txt
staged_tests "compressed:: retrieval:: blosc:: sharding::" "none_here"
summary
