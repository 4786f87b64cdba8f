#!/usr/bin/env bash
# Run DX3: where the instructions of the lane a block's sequences and of the executor stall, by
# source line (ncu's source counters of the kernels compiled with --lineinfo), 1,024 Z2 frames.
# Prepare here: a stage with `bench` (e.g. DX2's) and `.gpu/zcases.bin.xz`. On the GPU host:
#   BUDGET=150 bash .gpu/run bash benches/results/2026-12-08-h100-run-dx3.sh
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-150}
timeout 60 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); log "ncu: $NCU"
H="python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --decoders blocks --lineinfo --frames 1024"
ZSTD_SKIP_REPLAY=1 timeout $(( $(left) - 30 )) $NCU --kernel-name regex:"zstd_sequence_lanes|zstd_execute" --launch-count 2 \
  --section SourceCounters --section WarpStateStats --import-source yes -o /tmp/dx3 -f $H > $OUT/ncu.txt 2>&1
log "ncu rc=$? $(el)"
timeout 20 $NCU -i /tmp/dx3.ncu-rep --page source --csv --print-source cuda > /tmp/source.csv 2> /tmp/source.err
log "source page rc=$? $(wc -c < /tmp/source.csv) bytes $(head -c 300 /tmp/source.err)"
xz -T0 -c /tmp/source.csv > $OUT/source.csv.xz
ls -la /tmp/dx3.ncu-rep >> $OUT/log.txt 2>&1
[ "$(stat -c %s /tmp/dx3.ncu-rep 2>/dev/null || echo 0)" -lt 20000000 ] && xz -T0 -c /tmp/dx3.ncu-rep > $OUT/dx3.ncu-rep.xz
log "done $(el)"
