#!/usr/bin/env bash
# Run DU3 (build 04c11ef, beside 3143014's bench, DU2's, as .gpu/bench-3143014.xz, and its kernels
# in .gpu/src-3143014 for the harness): zstd_execute resolves a round's bytes in shared memory
# (pointer jumps), one wait on memory a round. The kernels' replay (six ways: the executed path
# too); decoder-only rows of this source and 3143014's; the bench's Z2 rows and whole reads of
# both builds; the device tests compressed:: and sharding::.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-330}
xz -dc .gpu/bench-3143014.xz > /tmp/bench-old && chmod +x /tmp/bench-old
timeout 150 bench --dir /tmp/b --gib 1 --cases z2,z2c,b2 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
timeout 150 $H --frames 1,64,288,1024,8192 --label 04c11ef --json $OUT/harness.jsonl > $OUT/harness.txt 2>&1
log "harness rc=$? $(el)"
ZSTD_SKIP_REPLAY=1 timeout 60 $H --frames 288,1024,8192 --source .gpu/src-3143014 --label 3143014 \
  --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
log "harness 3143014 $(el)"; grep -E "mismatch|MISMATCH|ours|Error|error" $OUT/harness.txt | cut -c1-230 >> $OUT/log.txt
rows new bench z2
rows old /tmp/bench-old z2
for b in bench /tmp/bench-old; do
  for c in z2c b2; do
    timeout 40 $b --dir /tmp/b --gib 1 --cases $c --ours-only --tiles 0 --repeat 5 --label "whole $b" \
      --json $OUT/rows.jsonl > /tmp/w.log 2>&1 || { log "$b $c rc=$?"; tail -3 /tmp/w.log >> $OUT/log.txt; }
  done
done
log "whole reads $(el)"
staged_tests "compressed:: sharding::" "none_here"
summary
