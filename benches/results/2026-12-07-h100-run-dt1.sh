#!/usr/bin/env bash
# Run DT1 (build 4c89d53, beside 3d033c8's bench as .gpu/old/bench.xz): where a small read's
# device time goes: each zstd block phase's clock64 cycles (the harness instrumented, 1, 16 and
# 64 Z2 frames) and every kernel of 1- and 16-chunk reads on our decoders timed by ncu; the size
# rows and the traced stages of this build and 3d033c8's, Z2 and B1, in turn.
set -uo pipefail
. benches/gpu_run.sh 560
xz -dc .gpu/old/bench.xz > /tmp/bench-old && chmod +x /tmp/bench-old
rows new bench z2
rows old /tmp/bench-old z2
rows new bench b1
rows old /tmp/bench-old b1
for b in bench /tmp/bench-old; do
  for c in z2 b1; do
    ZARRS_GPU_TRACE=1 timeout 60 $b --dir /tmp/b --gib 1 --cases $c --sizes 1,16 --size-reads 5 --ours-only --tiles 0 \
      --repeat 1 --label "trace $b" --json /tmp/trace-rows.jsonl > /tmp/trace.out 2> /tmp/trace.log
    log "trace $b $c rc=$? $(el)"; grep "zarrs_gpu trace" /tmp/trace.log | sed "s|^|$b $c |" | cut -c1-700 >> $OUT/trace.txt
  done
done
# Each block phase of 1, 16 and 64 Z2 frames (lane 0 walks the chains: the harness has no host walk).
: > /tmp/empty.bin
ZSTD_SKIP_REPLAY=1 timeout 100 python3 benches/zstd_decoder.py /tmp/empty.bin --chunks /tmp/b/z2.zarr/c --frames 1,16 \
  --decoders blocks --cycles --cycles-frames 1,16,64 > $OUT/harness.txt 2>&1
log "zstd harness phases rc=$? $(el)"; tail -14 $OUT/harness.txt >> $OUT/log.txt
# Every kernel of reads on our decoders, by ncu (kernels serialised; durations, not the gaps).
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1); log "ncu: $NCU"
for c in z2 b1; do
  [ "$(left)" -lt 60 ] && { log "ncu $c: not run (time)"; continue; }
  timeout $(( $(left) - 30 )) $NCU --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --log-file /tmp/ncu-$c.csv env ZARRS_GPU_HOST_DECODE_FRACTION=0 bench --dir /tmp/b --gib 1 \
    --cases $c --sizes 1,16 --size-reads 2 --ours-only --tiles 0 --repeat 1 --label ncu > /tmp/ncu-$c.out 2> /tmp/ncu-$c.err
  log "ncu $c rc=$? $(el)"; tail -2 /tmp/ncu-$c.err >> $OUT/log.txt
  python3 - /tmp/ncu-$c.csv >> $OUT/ncu.txt 2>&1 <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
col = {k: i for i, k in enumerate(head)}
print(sys.argv[1], len(rows), "kernel rows")
for r in rows:
    if r[col["Metric Name"]] == "gpu__time_duration.sum":
        print(r[col["ID"]], r[col["Kernel Name"]][:40], r[col["Grid Size"]], r[col["Block Size"]], r[col["Metric Value"]], r[col["Metric Unit"]])
PY
done
summary
cat $OUT/log.txt
