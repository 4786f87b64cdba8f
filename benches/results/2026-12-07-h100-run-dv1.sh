#!/usr/bin/env bash
# Run DV1 (build 0626a68, beside 3143014's bench as .gpu/bench-3143014.xz and its kernels in
# .gpu/src-3143014): zstd_execute a thread block a frame, rounds of 128 sequences in phases. The
# kernels' replay (five ways, the executed ones by the new executor); decoder-only rows with 128,
# 64 and 256 threads and 3143014's warp; the bench's Z2 rows and whole reads (Z2 checksummed:
# every frame's XXH64 verified) of this build and 3143014's; the device tests of the zstd paths.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-420}
xz -dc .gpu/bench-3143014.xz > /tmp/bench-old && chmod +x /tmp/bench-old
timeout 150 bench --dir /tmp/b --gib 1 --cases z2,z2c --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
timeout 150 $H --frames 1,64,288,1024,8192 --label "execute 128" --json $OUT/harness.jsonl > $OUT/harness.txt 2>&1
log "harness rc=$? $(el)"
export ZSTD_SKIP_REPLAY=1
timeout 60 $H --frames 288,1024,8192 --exec-threads 256 --label "execute 256" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
timeout 60 $H --frames 288,1024,8192 --exec-threads 64 --label "execute 64" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
timeout 60 $H --frames 288,1024,8192 --source .gpu/src-3143014 --label "3143014 warp" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
unset ZSTD_SKIP_REPLAY
log "harness variants $(el)"; grep -E "mismatch|ours|Error|error" $OUT/harness.txt | cut -c1-230 >> $OUT/log.txt
rows new bench z2
rows old /tmp/bench-old z2
for b in bench /tmp/bench-old; do
  timeout 40 $b --dir /tmp/b --gib 1 --cases z2c --ours-only --tiles 0 --repeat 5 --label "whole $b" \
    --json $OUT/rows.jsonl > /tmp/w.log 2>&1 || { log "$b z2c rc=$?"; tail -3 /tmp/w.log >> $OUT/log.txt; }
done
# The whole read with the host's share given (the scheduler's rates aside): none, an eighth.
for f in 0 0.125; do
  ZARRS_GPU_HOST_DECODE_FRACTION=$f timeout 40 bench --dir /tmp/b --gib 1 --cases z2c --ours-only --tiles 0 --repeat 5 \
    --label "whole, host share $f" --json $OUT/rows.jsonl > /tmp/w.log 2>&1 || { log "share $f rc=$?"; tail -3 /tmp/w.log >> $OUT/log.txt; }
done
log "whole reads $(el)"
staged_tests "compressed:: retrieval:: sharding::" "none_here"
summary
