#!/usr/bin/env bash
# Run DW2: session 42's build through the pipeline, beside 3143014's bench (DV1's peer).
# Prepare here: `../shared/gpu/stage --tests none` (or DW1's stage), then `bash benches/gpu_extras.sh --bench 3143014`.
# On the GPU host:   BUDGET=500 bash .gpu/run bash benches/results/2026-12-07-h100-run-dw2.sh
# The size rows of Z2 and B1 (this build, 3143014's); the read overlapped with the decode, tried by
# the batch budget alone (ZARRS_GPU_STAGING_BYTES: 1,024 chunks and the whole 1 GiB in batches of
# 256 and 512 MiB, where one batch reads everything before any decode); the checksummed whole
# read; the slab beside a device filled but for 512 MiB; the random tiles and crops.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-500}
xz -dc .gpu/bench-3143014.xz > /tmp/bench-old && chmod +x /tmp/bench-old
timeout 150 bench --dir /tmp/b --gib 1 --cases z2,z2c,b1 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
rows new bench z2
rows old /tmp/bench-old z2
rows new bench b1
rows old /tmp/bench-old b1
for s in 268435456 536870912; do
  for c in b1 z2; do
    ZARRS_GPU_STAGING_BYTES=$s timeout 60 bench --dir /tmp/b --gib 1 --cases $c --sizes 1024 --size-reads 7 --ours-only \
      --tiles 0 --repeat 3 --label "batches of $((s >> 20)) MiB" --json $OUT/rows.jsonl > /tmp/s.log 2>&1 ||
      { log "staging $s $c rc=$?"; tail -3 /tmp/s.log >> $OUT/log.txt; }
  done
done
log "staging $(el)"
for b in bench /tmp/bench-old; do
  timeout 40 $b --dir /tmp/b --gib 1 --cases z2c --ours-only --tiles 0 --repeat 5 --label "whole $b" \
    --json $OUT/rows.jsonl > /tmp/w.log 2>&1 || { log "$b z2c rc=$?"; tail -3 /tmp/w.log >> $OUT/log.txt; }
done
timeout 60 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --filled 512 --batch 32 --repeat 3 --label new \
  --json $OUT/tiles.jsonl > /tmp/f.log 2>&1 || { log "filled rc=$?"; tail -5 /tmp/f.log >> $OUT/log.txt; }
log "filled $(el)"
timeout 80 bench --dir /tmp/b --gib 1 --cases z2,b1 --ours-only --tiles-only --tiles 9 --repeat 2 --label new \
  --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { log "tiles rc=$?"; tail -5 /tmp/t.log >> $OUT/log.txt; }
log "tiles $(el)"
summary
