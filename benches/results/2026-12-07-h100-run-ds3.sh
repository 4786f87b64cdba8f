#!/usr/bin/env bash
# Run DS3 (build 90f2967): where a small read's time goes (ZARRS_GPU_TRACE: each read's stages,
# Z2 and B1, 1 and 16 chunks, scheduled, all on the device, all on host threads); the Python
# package's interrupt tests with their range server staged (rangehttpserver).
set -uo pipefail
. benches/gpu_run.sh 200
for c in z2 b1; do
  ZARRS_GPU_TRACE=1 timeout 60 bench --dir /tmp/b --gib 1 --cases $c --sizes 1,16 --size-reads 5 --ours-only --tiles 0 --repeat 1 --label trace --json $OUT/rows.jsonl > /tmp/trace-$c.out 2> /tmp/trace-$c.log
  log "trace $c rc=$? $(el)"; grep "zarrs_gpu trace" /tmp/trace-$c.log | cut -c1-700 >> $OUT/trace.txt
  grep -v "zarrs_gpu trace" /tmp/trace-$c.log | tail -3 >> $OUT/log.txt
done
python3 -c "import RangeHTTPServer; print('RangeHTTPServer', RangeHTTPServer.__file__)" >> $OUT/log.txt 2>&1
l=$(left); [ $l -gt 40 ] && { (cd python/tests && timeout $((l - 15)) python3 -m unittest -v test_gpu.InterruptGpuTests) > $OUT/python.log 2>&1; log "python InterruptGpuTests rc=$? $(el)"; grep -E "^Ran |^OK|^FAILED|ERROR:|FAIL:" $OUT/python.log | head -20 >> $OUT/log.txt; }
summary
cat $OUT/log.txt
