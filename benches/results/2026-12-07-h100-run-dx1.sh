#!/usr/bin/env bash
# Run DX1: the scheduler's rule for our zstd decoder (822dc60: frames under 4 MiB stay on the
# device) through the pipeline, and the spans against a lane a block at a few hundred frames.
# Prepare here: `../shared/gpu/stage --tests '^device'`, then `bash benches/gpu_extras.sh --zcases`.
# On the GPU host:   BUDGET=300 bash .gpu/run bash benches/results/2026-12-07-h100-run-dx1.sh
# Decoder alone: decode.rs' rule (spans up to 1,024 blocks, then a lane a block) against spans of
# 32 at every size (`--split 32`: a lane walks each block's chain, then a warp decodes its spans),
# 128 to 2,048 frames; the bench's Z2 rows (scheduled now all on the device below 4 MiB frames),
# tiles and crops; the device tests of the routes.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-300}
timeout 150 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks --json $OUT/harness.jsonl"
ZSTD_SKIP_REPLAY=1 timeout 60 $H --frames 128,288,512,1024,2048 --label "rule" > $OUT/harness.txt 2>&1
log "rule rc=$? $(el)"
ZSTD_SKIP_REPLAY=1 timeout 60 $H --frames 128,288,512,1024,2048 --split 32 --label "split 32" >> $OUT/harness.txt 2>&1
log "split 32 rc=$? $(el)"
grep -E "^ours" $OUT/harness.txt | cut -c1-230 >> $OUT/log.txt
rows HEAD bench z2
timeout 80 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --tiles-only --tiles 9 --repeat 2 --batch 32 --label HEAD \
  --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { log "tiles rc=$?"; tail -5 /tmp/t.log >> $OUT/log.txt; }
log "tiles $(el)"
staged_tests "compressed:: retrieval::" "none_here"
summary
