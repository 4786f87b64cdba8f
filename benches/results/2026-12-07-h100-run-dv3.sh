#!/usr/bin/env bash
# Run DV3 (build b2f4e76's kernels, beside 3143014's in .gpu/src-3143014): what DV2 was to
# measure first, in the device time left: zstd_execute with 32 threads (decode.rs' choice above
# 2,048 frames) against 3143014's warp at 2,048 and 8,192 Z2 frames, and the replay with it.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-90}
timeout 40 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
timeout 50 $H --frames 2048,8192 --exec-threads 32 --label "execute 32" --json $OUT/harness.jsonl > $OUT/harness.txt 2>&1
log "harness rc=$? $(el)"
ZSTD_SKIP_REPLAY=1 timeout 30 $H --frames 2048,8192 --source .gpu/src-3143014 --label "3143014 warp" \
  --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
log "old rc=$? $(el)"; grep -E "mismatch|ours|Error|error" $OUT/harness.txt | cut -c1-230 >> $OUT/log.txt
