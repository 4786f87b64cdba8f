#!/usr/bin/env bash
# Run DS1 (build e5913c2): zstd chains walked on the host for small launches (100e34e) and LZ4's
# 512 threads (b0d075b), through the pipeline beside 7c9077d's bench (DR2's build) in one call;
# LZ4 1,024 against 512 threads a stream for one chunk; tiles of both builds; then every staged
# test (device and codec crate, GPU ones included).
set -uo pipefail
. benches/gpu_run.sh 560
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
rows new bench z2
rows old-7c9077d /tmp/old-bench z2
rows new bench b1
rows old-7c9077d /tmp/old-bench b1
LZ4_TIMINGS_ONLY=1 LZ4_VARIANTS="THREADS=512;THREADS=1024" timeout 50 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h1.txt 2>&1
log "lz4 harness HEAD rc=$? $(el)"; grep -E "variant|each stream|chunks " /tmp/h1.txt >> $OUT/log.txt
for who in new old-7c9077d; do
  bin=bench; [ $who = new ] || bin=/tmp/old-bench
  [ $(left) -gt 100 ] && { timeout 30 $bin --dir /tmp/b --gib 1 --cases b1,z2 --ours-only --tiles-only --tiles 9 --repeat 2 --label $who --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { log "tiles $who rc=$?"; tail -5 /tmp/t.log >> $OUT/log.txt; }; log "tiles $who done $(el)"; }
done
rows new2 bench z2
rows old2-7c9077d /tmp/old-bench z2
staged_tests "" ""
cp /tmp/h1.txt $OUT/harness.txt 2>/dev/null
summary
cat $OUT/log.txt
