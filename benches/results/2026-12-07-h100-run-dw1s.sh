#!/usr/bin/env bash
# Run DW1s: DW1 cut to what the session's last device time holds (prepared as DW1): HEAD's
# kernels replayed against the CPU shim (five ways, executed with 64 threads), the device tests
# of the zstd paths, decoder-alone rows of HEAD and 24d44dd at 1,024 and 8,192 Z2 frames, the
# replay executed with 32 threads.
#   BUDGET=230 bash .gpu/run bash benches/results/2026-12-07-h100-run-dw1s.sh
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-230}
timeout 60 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
J="--json $OUT/harness.jsonl"
timeout 70 $H --frames 1024,8192 --label HEAD $J > $OUT/harness.txt 2>&1
log "harness rc=$? $(el)"
staged_tests "compressed:: retrieval:: sharding::" "none_here"
export ZSTD_SKIP_REPLAY=1
[ "$(left)" -gt 35 ] && timeout 30 $H --frames 1024,8192 --source .gpu/src-24d44dd --label 24d44dd $J >> $OUT/harness.txt 2>&1
unset ZSTD_SKIP_REPLAY
[ "$(left)" -gt 30 ] && ZSTD_REPLAY_ONLY=1 timeout 25 $H --exec-threads 32 >> $OUT/harness.txt 2>&1
log "end $(el)"; grep -E "mismatch|ours|Error|error" $OUT/harness.txt | cut -c1-230 >> $OUT/log.txt
