#!/usr/bin/env bash
# Run DR2 (built at d54e13f, not run: the session's device time was spent): the LZ4 harness on
# the byte-a-thread windows (every dumped case equal to the CPU shim; phases; 1,024, 512 and
# 256 threads) beside 531427d's kernel (DR1's). Carry .gpu2: this script, the LZ4 dump (.xz)
# and `git show 531427d:zarrs_gpu_codecs/src/codecs/lz4/decode.cu` as r1/lz4_decode.cu.
set -uo pipefail
. benches/gpu_run.sh 100
LZ4_PHASES=1 LZ4_VARIANTS="THREADS=512;THREADS=256" timeout 60 python3 benches/lz4_decoder.py .gpu2/lz4cases.bin.xz > /tmp/h1.txt 2>&1
log "lz4 harness HEAD rc=$? $(el)"; grep -v "^phases of 1024 chunks, stream" /tmp/h1.txt >> $OUT/log.txt
LZ4_SOURCE=.gpu2/r1/lz4_decode.cu LZ4_TIMINGS_ONLY=1 LZ4_VARIANTS="THREADS=512;THREADS=256" timeout 40 python3 benches/lz4_decoder.py .gpu2/lz4cases.bin.xz > /tmp/h2.txt 2>&1
log "lz4 harness 531427d rc=$? $(el)"; grep -E "variant|each stream|chunks " /tmp/h2.txt >> $OUT/log.txt
cat $OUT/log.txt
