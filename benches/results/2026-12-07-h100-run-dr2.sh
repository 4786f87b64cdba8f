#!/usr/bin/env bash
# Run DR2 (build 7c9077d): LZ4 windows a thread a byte (d54e13f), extensions four bytes a step
# (cd081e1), tables copied four bytes a thread (3ac162b) beside 531427d's kernel (.gpu/r1);
# zstd chain walk as selects (d4aff10) without the L1 prefetch (7c9077d) beside 7a99649's
# (.gpu/r1z); B1 and Z2 rows and tiles with this build; the LZ4/Blosc/zstd tests.
set -uo pipefail
. benches/gpu_run.sh 230
LZ4_PHASES=1 LZ4_VARIANTS="THREADS=512;THREADS=256" timeout 60 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h1.txt 2>&1
log "lz4 harness HEAD rc=$? $(el)"; grep -v "^phases of 1024 chunks, stream" /tmp/h1.txt >> $OUT/log.txt
LZ4_SOURCE=.gpu/r1/lz4_decode.cu LZ4_TIMINGS_ONLY=1 LZ4_VARIANTS="THREADS=512" timeout 40 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h2.txt 2>&1
log "lz4 harness 531427d rc=$? $(el)"; grep -E "variant|each stream|chunks " /tmp/h2.txt >> $OUT/log.txt
rows new bench z2
z="timeout 100 python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --json $OUT/zstd-rows.jsonl"
$z --frames 1,16,64,1024 --decoders blocks --label new --cycles > /tmp/hz.txt 2>&1
log "zstd harness HEAD rc=$? $(el)"; grep -v "^   block" /tmp/hz.txt >> $OUT/log.txt
ZSTD_SKIP_REPLAY=1 $z --frames 1,16,64 --decoders blocks --source .gpu/r1z --label 7a99649 --cycles > /tmp/hz2.txt 2>&1
log "zstd harness 7a99649 rc=$? $(el)"; grep -v "^   block" /tmp/hz2.txt >> $OUT/log.txt
rows new bench b1
[ $(left) -gt 40 ] && { timeout 30 bench --dir /tmp/b --gib 1 --cases b1,z2 --ours-only --tiles-only --tiles 9 --repeat 2 --label new --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { log "tiles rc=$?"; tail -5 /tmp/t.log >> $OUT/log.txt; }; log "tiles done $(el)"; }
staged_tests "blosc lz4 zstd corrupt" "lz4 blosc zstd"
cat /tmp/h1.txt /tmp/h2.txt /tmp/hz.txt /tmp/hz2.txt > $OUT/harness.txt 2>/dev/null
summary
cat $OUT/log.txt
