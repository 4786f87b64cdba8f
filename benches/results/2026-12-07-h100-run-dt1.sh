#!/usr/bin/env bash
# Run DT1 (build HEAD of session 38): DS6's tests that need an S3 server (device `remote::`,
# Python `RemoteGpuTests`, s3s-fs staged as .gpu/s3s-fs.xz); where a small read's device time
# goes: each zstd block phase's clock64 cycles (the harness instrumented, 1 and 16 Z2 frames) and
# every kernel of a 1-chunk and a 16-chunk read on our decoders timed by ncu; then every device test.
set -uo pipefail
. benches/gpu_run.sh 560
xz -dc .gpu/s3s-fs.xz > /tmp/s3s-fs && chmod +x /tmp/s3s-fs
read -r dev pkg < <(awk '$1 ~ /^device/' /tmp/gpu-bin/bin/tests/dirs | head -1)
(cd "$pkg" && S3S_FS=/tmp/s3s-fs ZARRS_GPU_REQUIRE_S3=1 timeout 90 /tmp/gpu-bin/bin/tests/$dev --include-ignored --test-threads=1 remote::) > /tmp/remote.log 2>&1
log "$dev remote:: rc=$? $(grep -E '^test result' /tmp/remote.log | tail -1) $(el)"
grep -E "^test .* FAILED|^---- |panicked" /tmp/remote.log | head -20 >> $OUT/log.txt
grep -E "^test " /tmp/remote.log | sed 's/^test //' >> $OUT/tests.txt
(cd python/tests && S3S_FS=/tmp/s3s-fs ZARRS_GPU_REQUIRE_S3=1 timeout 90 python3 -m unittest -v test_gpu.RemoteGpuTests) > $OUT/python.log 2>&1
log "python RemoteGpuTests rc=$? $(el)"; grep -E "^Ran |^OK|^FAILED|ERROR:|FAIL:|skipped" $OUT/python.log | head -20 >> $OUT/log.txt
# The arrays (and this build's rows, beside which the kernels' times are read).
rows dt1 bench z2
rows dt1 bench b1
# Each block phase of one and 16 Z2 frames (lane 0 walks the chains: the harness has no host walk).
: > /tmp/empty.bin
ZSTD_SKIP_REPLAY=1 timeout 100 python3 benches/zstd_decoder.py /tmp/empty.bin --chunks /tmp/b/z2.zarr/c --frames 1,16 \
  --decoders blocks --cycles --cycles-frames 1,16,64 > $OUT/harness.txt 2>&1
log "zstd harness phases rc=$? $(el)"; grep -v "^   block" $OUT/harness.txt | tail -12 >> $OUT/log.txt
# Every kernel of reads on our decoders, by ncu (kernels serialised; durations, not the gaps).
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1); log "ncu: $NCU"
for c in z2 b1; do
  [ "$(left)" -lt 150 ] && { log "ncu $c: not run (time)"; continue; }
  timeout 100 $NCU --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --log-file /tmp/ncu-$c.csv env ZARRS_GPU_HOST_DECODE_FRACTION=0 ZARRS_GPU_TRACE=1 bench --dir /tmp/b --gib 1 \
    --cases $c --sizes 1,16 --size-reads 2 --ours-only --tiles 0 --repeat 1 --label ncu > /tmp/ncu-$c.out 2> /tmp/ncu-$c.err
  log "ncu $c rc=$? $(el)"; tail -3 /tmp/ncu-$c.err >> $OUT/log.txt
  python3 - /tmp/ncu-$c.csv >> $OUT/ncu.txt <<'PY'
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
staged_tests "" ""
summary
cat $OUT/log.txt
