#!/usr/bin/env bash
# Run DX3: where the chain walk's and the spans' steps go (the block decode at 64 Z2 frames, lane 0
# walking each block's chain) and the lanes' and the executor's (1,024 frames): ncu's source
# counters and warp states by source line, and the harness's instrumented cycles of a block's
# phases for each kernel source in .gpu/variants/NAME/ (run DX3: afca841's as base, L and LS).
# Prepare here: a stage with `bench` (e.g. DX2's) and `.gpu/zcases.bin.xz`. On the GPU host:
#   BUDGET=300 bash .gpu/run bash benches/results/2026-12-08-h100-run-dx3.sh
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-300}
timeout 60 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); log "ncu: $NCU"
# (The run also dumped each source's machine code with a script since removed: the cubin that
# CuPy's NVRTC returned was not an ELF file nvdisasm reads. `benches/sass.py` prints it without a
# GPU.)
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks"
for v in .gpu/variants/*; do
  # (Each variant's kernels replayed on the CPU shim's cases too: same statuses and bytes.)
  timeout 100 $H --source $v --label $(basename $v) --frames 64,288,1024 --cycles --cycles-frames 1,16,64 \
    --json $OUT/harness.jsonl >> $OUT/harness.txt 2>&1
  log "harness $v rc=$? $(el)"
done
# ncu: the block decode at 64 frames (lane 0 walks each chain, 32 spans), then the lanes and the
# executor at 1,024 frames.
profile() {  # NAME REGEX FRAMES
  ZSTD_SKIP_REPLAY=1 timeout $(( $(left) - 40 )) $NCU --kernel-name regex:"$2" --launch-skip 2 --launch-count 2 \
    --section SourceCounters --section WarpStateStats --import-source yes -o /tmp/$1 -f $H --lineinfo --frames $3 \
    > /tmp/ncu-$1.txt 2>&1
  log "ncu $1 rc=$? $(el)"; tail -40 /tmp/ncu-$1.txt >> $OUT/ncu.txt
  timeout 30 $NCU -i /tmp/$1.ncu-rep --page source --csv --print-source cuda,sass > /tmp/src-$1.csv 2> /tmp/src-$1.err
  log "source page $1 rc=$? $(wc -c < /tmp/src-$1.csv) bytes $(head -c 300 /tmp/src-$1.err)"
  [ -s /tmp/src-$1.csv ] || timeout 30 $NCU -i /tmp/$1.ncu-rep --page source --csv --print-source cuda > /tmp/src-$1.csv 2>> $OUT/log.txt
  xz -T0 -c /tmp/src-$1.csv > $OUT/source-$1.csv.xz
}
profile blocks64 "zstd_decode_blocks" 64
[ "$(left)" -gt 70 ] && profile lanes1024 "zstd_sequence_lanes|zstd_execute" 1024
log "done $(el)"
