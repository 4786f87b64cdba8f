#!/usr/bin/env bash
# NOT RUN (session 39 ran out of device time: refused starts). Restage at HEAD first (`../shared/gpu/stage
# --tests '^device'`, the benches below as .gpu/bench-*.xz, nvCOMP's wheel slimmed), then
# `BUDGET=150 bash .gpu/run bash benches/results/2026-12-07-h100-run-dt7.sh`.
# Run DT7 (build ea811eb, beside the benches of 4c89d53 (DT1's), 7f2a6c8 (placement in
# parts, Blosc assembly in spans), f6de86f (the warp's FSE and Huffman tables, the LZ4 race fix)
# b9d03a3 (the literals apart) and 5739f4d (one chunk's frame rate for the split too), as
# .gpu/bench-*.xz): which change made DT6's whole Z2 read
# 4% slower (59.2 against 56.7 ms): each build's whole-array reads of Z2 and B1 in turn, one
# round; this build's Z2 rows; then the device test DT6 failed, fixed (the 16 MiB chunks' split).
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-110}
builds="bench"
for c in 4c89d53 7f2a6c8 f6de86f b9d03a3 5739f4d; do
  xz -dc .gpu/bench-$c.xz > /tmp/bench-$c && chmod +x /tmp/bench-$c; builds="$builds /tmp/bench-$c"
done
timeout 120 bench --dir /tmp/b --gib 1 --cases z2,b1 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
for round in 1; do
  for b in $builds; do
    for c in z2 b1; do
      timeout 40 $b --dir /tmp/b --gib 1 --cases $c --ours-only --tiles 0 --repeat 5 --label "r$round $b" \
        --json $OUT/rows.jsonl > /tmp/w.log 2>&1 || { log "$b $c rc=$?"; tail -2 /tmp/w.log >> $OUT/log.txt; }
    done
  done
  log "round $round $(el)"
done
rows head bench z2
staged_tests "compressed::data_types_and_chunk_sizes" "none_here"
summary
cat $OUT/log.txt
