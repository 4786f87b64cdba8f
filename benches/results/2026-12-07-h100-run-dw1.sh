#!/usr/bin/env bash
# Run DW1: the zstd kernels of session 42 (not run on the GPU when written), each change apart.
# Prepare here: `../shared/gpu/stage --tests '^device'`, then `bash benches/gpu_extras.sh
# --kernels 24d44dd 21f04bc 98eac0a ee1220c 4c49d13 3143014 --zcases`. On the GPU host:
#   BUDGET=540 bash .gpu/run bash benches/results/2026-12-07-h100-run-dw1.sh
# The checkout's kernels (HEAD) replayed three ways of executor threads against the CPU shim;
# decoder-only rows (288, 1,024, 2,048 and 8,192 Z2 frames) of HEAD and of each commit before
# it: 24d44dd (session 41's end), 21f04bc (a match's bytes i % off), 98eac0a (16-byte loads),
# ee1220c (tables 2 bytes a state, 8 lanes a thread block), 4c49d13 (done bits, a barrier a
# phase; then HEAD: a round's places in one scan), 3143014's warp at 8,192; HEAD's jumps
# against its executor at 1, 16 and 64 frames; HEAD's lanes with 4 and 16 threads; ncu's warp
# states of HEAD's two long launches at 1,024 frames; the device tests of the zstd paths; the
# bench's Z2 rows of this build.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-540}
timeout 150 bench --dir /tmp/b --gib 1 --cases z2,z2c --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
J="--json $OUT/harness.jsonl"
timeout 100 $H --frames 288,1024,2048,8192 --label HEAD $J > $OUT/harness.txt 2>&1
log "harness rc=$? $(el)"
for t in 128 32; do
  ZSTD_REPLAY_ONLY=1 timeout 60 $H --exec-threads $t >> $OUT/harness.txt 2>&1; log "replay $t rc=$? $(el)"
done
staged_tests "compressed:: retrieval:: sharding::" "none_here"
export ZSTD_SKIP_REPLAY=1
for c in 24d44dd 21f04bc 98eac0a ee1220c 4c49d13; do
  [ "$(left)" -lt 60 ] && { log "$c: not run (time)"; continue; }
  timeout 60 $H --frames 288,1024,8192 --source .gpu/src-$c --label $c $J >> $OUT/harness.txt 2>&1; log "$c rc=$? $(el)"
done
unset ZSTD_SKIP_REPLAY
rows HEAD bench z2
export ZSTD_SKIP_REPLAY=1
# Optional, while time is left: 3143014's warp; the jumps (64 MiB or less) against the executor,
# now that its rounds wait less; HEAD's lanes 4 and 16 a thread block; ncu.
opt() { [ "$(left)" -gt "$1" ]; }
opt 50 && timeout 40 $H --frames 8192 --source .gpu/src-3143014 --label "3143014 warp" $J >> $OUT/harness.txt 2>&1
opt 50 && timeout 40 python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders "blocks,blocks executed" \
  --frames 1,16,64 --label "HEAD, jumps or executed" $J >> $OUT/harness.txt 2>&1
for t in 4 16; do
  opt 45 && timeout 40 $H --frames 1024,8192 --lane-threads $t --label "HEAD, $t lanes a thread block" $J >> $OUT/harness.txt 2>&1
done
log "harness variants $(el)"; grep -E "mismatch|ours|Error|error" $OUT/harness.txt | cut -c1-230 >> $OUT/log.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1); log "ncu: $NCU"
S="--section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis"
opt 80 && timeout $(( $(left) - 10 )) $NCU --kernel-name regex:"zstd_sequence_lanes|zstd_execute" --launch-count 2 $S $H --frames 1024 > $OUT/ncu.txt 2>&1
log "ncu rc=$? $(el)"
summary
