#!/usr/bin/env bash
# Run DX4: the chain walk's words loaded with its table reads and the bit reader's word combined
# when the window moves (dd73e1e, 1e87364), a table's symbols spread by the warp (430ea18), and
# the replayed cases' frame of 74-77-bit sequences (which take the chain walk's lowest word),
# beside afca841's kernels: the harness's
# decoder-only rows and a block's cycles by phase for each kernel source (base: afca841's; HEAD:
# this checkout's; R: HEAD with `2026-12-08-dx4-r.patch`, a sequence's offset picked without
# branches), each replayed against the CPU shim's cases; then the Z2 and B1 rows of this build and
# ae80fe8's bench (afca841's kernels) in turn, tiles and crops, the device tests of the zstd routes,
# and, time allowing, ncu's source counters of HEAD's block decode at 64 frames.
# Prepare here: `../shared/gpu/stage --tests '^device'`, then
# `bash benches/gpu_extras.sh --kernels afca841 --bench ae80fe8 --zcases`. On the GPU host:
#   BUDGET=480 bash .gpu/run bash benches/results/2026-12-08-h100-run-dx4.sh
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-480}
xz -dc .gpu/bench-ae80fe8.xz > /tmp/bench-old && chmod +x /tmp/bench-old
timeout 150 bench --dir /tmp/b --gib 1 --cases z2,b1 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
R=/tmp/R:R
mkdir -p /tmp/R && cp zarrs_gpu_codecs/src/codecs/zstd/*.cu /tmp/R/ &&
  (cd /tmp/R && patch -s -p1 < "$OLDPWD/benches/results/2026-12-08-dx4-r.patch") || { log "patch R failed"; R=; }
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
for v in .gpu/src-afca841:base zarrs_gpu_codecs/src/codecs/zstd:HEAD $R; do
  timeout 100 $H --source ${v%%:*} --label ${v##*:} --frames 1,16,64,288,1024 --cycles --cycles-frames 1,16,64 \
    --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
  log "harness ${v##*:} rc=$? $(el)"
done
for r in 1 2; do
  rows HEAD bench z2
  rows ae80fe8 /tmp/bench-old z2
done
rows HEAD bench b1
rows ae80fe8 /tmp/bench-old b1
tiles bench bench z2
tiles /tmp/bench-old /tmp/bench-old z2
staged_tests "compressed:: retrieval:: sharding::" "none_here"
summary
# Where HEAD's block decode now waits (ncu's source counters by line, as DX3), time allowing.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ "$(left)" -gt 90 ] && [ -n "$NCU" ]; then
  ZSTD_SKIP_REPLAY=1 timeout $(( $(left) - 30 )) $NCU --kernel-name regex:zstd_decode_blocks --launch-skip 2 \
    --launch-count 1 --section SourceCounters --section WarpStateStats --import-source yes -o /tmp/b64 -f \
    $H --lineinfo --frames 64 > $OUT/ncu.txt 2>&1
  timeout 30 $NCU -i /tmp/b64.ncu-rep --page source --csv --print-source cuda,sass 2>> $OUT/log.txt |
    xz -T0 > $OUT/source-blocks64.csv.xz
  log "ncu blocks64 $(el)"
fi
