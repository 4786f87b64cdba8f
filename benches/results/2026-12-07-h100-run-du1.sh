#!/usr/bin/env bash
# Run DU1 (build 1cc3af8, beside 923810a's bench as .gpu/bench-923810a.xz, and 923810a's kernels in
# .gpu/src-923810a for the harness): launches of more than 1,024 zstd blocks decode their
# sequences a lane a block (zstd_sequence_lanes). The zstd kernels' replay of the CPU shim's cases
# (four ways: 32 spans, one, literals first, a lane a block); decoder-only rows, this source (a
# lane a block by decode.rs' rule, and 8 / 32 lanes a warp) against a warp a block (--split 1) and
# 923810a's kernels; the bench's Z2 rows and whole reads (Z2, Z2 checksummed: every frame's XXH64
# verified on the device, B2) of this build and 923810a's; the device tests of the decoders' paths.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-430}
xz -dc .gpu/bench-923810a.xz > /tmp/bench-old && chmod +x /tmp/bench-old
timeout 150 bench --dir /tmp/b --gib 1 --cases z2,z2c,b2 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"; tail -3 /tmp/make.log >> $OUT/log.txt
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
timeout 150 $H --frames 1,64,288,1024,8192 --label lanes --json $OUT/harness.jsonl > $OUT/harness.txt 2>&1
log "harness rc=$? $(el)"
export ZSTD_SKIP_REPLAY=1
timeout 60 $H --frames 288,1024 --split 1 --label "warp a block" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
timeout 60 $H --frames 1024,8192 --lane-threads 32 --label "32 lanes" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
timeout 60 $H --frames 288,1024 --lane-threads 4 --label "4 lanes" --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
timeout 60 $H --frames 1,64,288,1024 --source .gpu/src-923810a --label 923810a --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
unset ZSTD_SKIP_REPLAY
log "harness variants $(el)"; grep -E "mismatch|ours|Error|error" $OUT/harness.txt | cut -c1-230 >> $OUT/log.txt
rows new bench z2
rows old /tmp/bench-old z2
for b in bench /tmp/bench-old; do
  for c in z2c b2; do
    timeout 40 $b --dir /tmp/b --gib 1 --cases $c --ours-only --tiles 0 --repeat 5 --label "whole $b" \
      --json $OUT/rows.jsonl > /tmp/w.log 2>&1 || { log "$b $c rc=$?"; tail -3 /tmp/w.log >> $OUT/log.txt; }
  done
done
log "whole reads $(el)"
staged_tests "compressed:: retrieval:: blosc:: sharding:: batch:: hostile:: sweep::" "none_here"
summary
