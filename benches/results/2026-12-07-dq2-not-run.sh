#!/usr/bin/env bash
# Run DQ2 (staged at 3167e37, not run: the device budget was spent): our LZ4 kernel reading
# literals from the tile's bytes in shared memory, threads a launch by DQ1's figures. The harness
# (every dumped case equal to the CPU shim; phases; 256, 512 and 1,024 threads) beside 0f7eb21's
# kernel (.gpu/q1), B1 size rows and the whole 1 GiB read with this build and e98499b's
# (.gpu/old/bench.xz), a traced small read, the LZ4/Blosc tests.
set -uo pipefail
. benches/gpu_run.sh 170
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
LZ4_PHASES=1 LZ4_VARIANTS="THREADS=512;THREADS=1024" timeout 90 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h1.txt 2>&1
log "lz4 harness 3167e37 rc=$? $(el)"; grep -v "^phases of 1024 chunks, stream" /tmp/h1.txt >> $OUT/log.txt
rows new bench b1
rows old-e98499b /tmp/old-bench b1
[ $(left) -gt 30 ] && {
  LZ4_SOURCE=.gpu/q1/lz4_decode.cu LZ4_TIMINGS_ONLY=1 LZ4_VARIANTS="THREADS=512;THREADS=1024" timeout 60 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h2.txt 2>&1
  log "lz4 harness 0f7eb21 rc=$? $(el)"; grep -E "variant|each stream|chunks " /tmp/h2.txt >> $OUT/log.txt
}
cat /tmp/h1.txt /tmp/h2.txt > $OUT/harness.txt 2>/dev/null
staged_tests "blosc lz4 corrupt" "lz4 blosc"
[ $(left) -gt 25 ] && { ZARRS_GPU_TRACE=1 timeout 30 bench --dir /tmp/b --gib 1 --cases b1 --sizes 1,16 --size-reads 3 --ours-only --tiles 0 --repeat 1 > $OUT/trace.log 2>&1; log "trace rc=$? $(el)"; }
summary
cat $OUT/log.txt
