#!/usr/bin/env bash
# Run DR2 (written at c459bc4, not run: the session's device time was spent). Stage first
# (`../shared/gpu/stage --tests 'device|zarrs_gpu_codecs'`), then put in .gpu: the LZ4 and zstd
# dumps as .xz (lz4cases.bin.xz with its .b1 file, zcases.bin.xz), 531427d's LZ4 kernel as
# r1/lz4_decode.cu and 7a99649's four zstd sources in r1z/ (`git show REV:PATH`), e98499b's
# bench as old/bench.xz; then `bash .gpu/run bash .gpu/dr2.sh`. Measures: the LZ4 windows a
# thread a byte (d54e13f) and extensions four bytes a step (cd081e1) beside 531427d's kernel;
# the zstd chain walk's selects (d4aff10) beside 7a99649's; B1 and Z2 rows beside e98499b's
# build; the tests.
set -uo pipefail
. benches/gpu_run.sh 300
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
LZ4_PHASES=1 LZ4_VARIANTS="THREADS=512;THREADS=256" timeout 60 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h1.txt 2>&1
log "lz4 harness HEAD rc=$? $(el)"; grep -v "^phases of 1024 chunks, stream" /tmp/h1.txt >> $OUT/log.txt
LZ4_SOURCE=.gpu/r1/lz4_decode.cu LZ4_TIMINGS_ONLY=1 LZ4_VARIANTS="THREADS=512;THREADS=256" timeout 40 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h2.txt 2>&1
log "lz4 harness 531427d rc=$? $(el)"; grep -E "variant|each stream|chunks " /tmp/h2.txt >> $OUT/log.txt
rows new bench z2
z="timeout 100 python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --json $OUT/zstd-rows.jsonl"
$z --frames 1,16,64,1024 --decoders blocks --label new --cycles > /tmp/hz.txt 2>&1
log "zstd harness HEAD rc=$? $(el)"; grep -v "^   block" /tmp/hz.txt >> $OUT/log.txt
ZSTD_SKIP_REPLAY=1 $z --frames 1,16,64 --decoders blocks --source .gpu/r1z --label 7a99649 --cycles > /tmp/hz2.txt 2>&1
log "zstd harness 7a99649 rc=$? $(el)"; grep -v "^   block" /tmp/hz2.txt >> $OUT/log.txt
staged_tests "blosc lz4 zstd corrupt" "lz4 blosc zstd"
rows new bench b1
rows old-e98499b /tmp/old-bench b1
rows old-e98499b /tmp/old-bench z2
staged_tests "--skip blosc --skip lz4 --skip zstd --skip corrupt" "--skip lz4 --skip blosc --skip zstd"
cat /tmp/h1.txt /tmp/h2.txt /tmp/hz.txt /tmp/hz2.txt > $OUT/harness.txt 2>/dev/null
summary
cat $OUT/log.txt
