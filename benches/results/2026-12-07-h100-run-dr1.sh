#!/usr/bin/env bash
# Run DR1 (build 531427d, staged and in the harnesses: LZ4 with batched window
# loads (LZ4_BATCH), zstd's lean chain walk (7a99649)): zstd against c68d642's (prefetch only,
# .gpu/r0z) and 0f7eb21's kernels (.gpu/q1z) in one call; LZ4 literals from shared memory and DQ1's thread counts
# (3167e37); B1 and Z2 rows with this build and e98499b's; tiles;
# the LZ4/Blosc/zstd tests, then the rest of the device and codec crate tests while time is left.
set -uo pipefail
. benches/gpu_run.sh 190
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
rows new bench z2
z="timeout 100 python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --json $OUT/zstd-rows.jsonl"
$z --frames 1,16,64,1024 --decoders blocks --label new --cycles > /tmp/hz.txt 2>&1
log "zstd harness HEAD rc=$? $(el)"; grep -v "^   block" /tmp/hz.txt >> $OUT/log.txt
ZSTD_SKIP_REPLAY=1 $z --frames 1,16,64 --decoders blocks --source .gpu/r0z --label c68d642 --cycles > /tmp/hz3.txt 2>&1
log "zstd harness c68d642 (prefetch) rc=$? $(el)"; grep -v "^   block" /tmp/hz3.txt >> $OUT/log.txt
ZSTD_SKIP_REPLAY=1 $z --frames 1,16,64 --decoders blocks --source .gpu/q1z --label 0f7eb21 --cycles > /tmp/hz2.txt 2>&1
log "zstd harness 0f7eb21 rc=$? $(el)"; grep -v "^   block" /tmp/hz2.txt >> $OUT/log.txt
LZ4_PHASES=1 LZ4_VARIANTS="BATCH=1;BATCH=8;THREADS=512" timeout 90 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h1.txt 2>&1
log "lz4 harness HEAD rc=$? $(el)"; grep -v "^phases of 1024 chunks, stream" /tmp/h1.txt >> $OUT/log.txt
staged_tests "blosc lz4 zstd corrupt" "lz4 blosc zstd"
rows new bench b1
rows old-e98499b /tmp/old-bench b1
rows old-e98499b /tmp/old-bench z2
[ $(left) -gt 40 ] && { timeout 30 bench --dir /tmp/b --gib 1 --cases b1,z2 --ours-only --tiles-only --tiles 9 --repeat 2 --label new --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { log "tiles rc=$?"; tail -5 /tmp/t.log >> $OUT/log.txt; }; log "tiles done $(el)"; }
# The rest of both test binaries while time is left (the full suite on this build).
staged_tests "--skip blosc --skip lz4 --skip zstd --skip corrupt" "--skip lz4 --skip blosc --skip zstd"
cat /tmp/hz.txt /tmp/hz3.txt /tmp/hz2.txt /tmp/h1.txt /tmp/h2.txt > $OUT/harness.txt 2>/dev/null
summary
cat $OUT/log.txt
