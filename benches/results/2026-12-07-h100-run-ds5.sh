#!/usr/bin/env bash
# Run DS5 (build 78de42e): zstd entries made by 8 warps a block (bytes.cu zstd_entries) beside
# d0db0e2's kernels (.gpu/r2z) in the harness (the dumped cases replayed against the CPU shim,
# then 1, 16 and 64 Z2 frames' phases); Z2 rows of this build; the zstd device and codec tests.
set -uo pipefail
. benches/gpu_run.sh 240
rows new bench z2
z="timeout 100 python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --json $OUT/zstd-rows.jsonl"
$z --frames 1,16,64 --decoders blocks --label new > /tmp/hz.txt 2>&1
log "zstd harness HEAD rc=$? $(el)"; grep -v "^   block" /tmp/hz.txt >> $OUT/log.txt
ZSTD_SKIP_REPLAY=1 $z --frames 1,16,64 --decoders blocks --source .gpu/r2z --label d0db0e2 > /tmp/hz2.txt 2>&1
log "zstd harness d0db0e2 rc=$? $(el)"; grep -v "^   block" /tmp/hz2.txt >> $OUT/log.txt
staged_tests "zstd corrupt blosc" "zstd blosc"
cat /tmp/hz.txt /tmp/hz2.txt > $OUT/harness.txt 2>/dev/null
summary
cat $OUT/log.txt
