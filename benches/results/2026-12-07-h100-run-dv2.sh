#!/usr/bin/env bash
# Run DV2 (build b2f4e76, beside 3143014's bench as .gpu/bench-3143014.xz): zstd_execute's threads
# by the launch's frames (decode.rs `exec_threads`: 128 up to 512 frames, 64 up to 2,048, else
# 32). The replay with each thread count; decoder-only rows of the counts DV1 left out; the Z2
# rows and the checksummed whole read of this build and 3143014's.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-240}
xz -dc .gpu/bench-3143014.xz > /tmp/bench-old && chmod +x /tmp/bench-old
timeout 150 bench --dir /tmp/b --gib 1 --cases z2,z2c --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
timeout 100 $H --frames 2048,8192 --exec-threads 32 --label "execute 32" --json $OUT/harness.jsonl > $OUT/harness.txt 2>&1
log "harness rc=$? $(el)"
for t in 128 64; do
  ZSTD_REPLAY_ONLY=1 timeout 60 $H --exec-threads $t >> $OUT/harness.txt 2>&1; log "replay $t rc=$? $(el)"
done
export ZSTD_SKIP_REPLAY=1
timeout 60 $H --frames 288,1024 --exec-threads 32 --label "execute 32" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
timeout 60 $H --frames 2048 --exec-threads 64 --label "execute 64" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
timeout 60 $H --frames 2048 --exec-threads 128 --label "execute 128" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
unset ZSTD_SKIP_REPLAY
log "harness variants $(el)"; grep -E "mismatch|ours|Error|error" $OUT/harness.txt | cut -c1-230 >> $OUT/log.txt
rows new bench z2
rows old /tmp/bench-old z2
for b in bench /tmp/bench-old; do
  timeout 40 $b --dir /tmp/b --gib 1 --cases z2c --ours-only --tiles 0 --repeat 5 --label "whole $b" \
    --json $OUT/rows.jsonl > /tmp/w.log 2>&1 || { log "$b z2c rc=$?"; tail -3 /tmp/w.log >> $OUT/log.txt; }
done
log "whole reads $(el)"
summary
