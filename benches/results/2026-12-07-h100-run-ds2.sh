#!/usr/bin/env bash
# Run DS2 (build 3d71a64): where a small read's time goes (ZARRS_GPU_TRACE, Z2 and B1, 1 and 16
# chunks); the rows and tiles beside e5913c2's bench (DS1's build: chains walked before host
# threads start, the old LZ4 rates); the device tests of the codecs; the Python package's GPU
# tests (zarr-python 3.4.2, dask, distributed, xarray, torch).
set -uo pipefail
. benches/gpu_run.sh 500
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
rows new bench z2
rows old-e5913c2 /tmp/old-bench z2
rows new bench b1
rows old-e5913c2 /tmp/old-bench b1
for c in z2 b1; do
  ZARRS_GPU_TRACE=1 timeout 40 bench --dir /tmp/b --gib 1 --cases $c --sizes 1,16 --size-reads 5 --ours-only --tiles 0 --repeat 1 --label trace --json /tmp/trace.jsonl > /dev/null 2> /tmp/trace-$c.log
  log "trace $c rc=$? $(el)"; grep "zarrs_gpu trace" /tmp/trace-$c.log | cut -c1-600 >> $OUT/trace.txt
done
for who in new old-e5913c2; do
  bin=bench; [ $who = new ] || bin=/tmp/old-bench
  [ $(left) -gt 100 ] && { timeout 30 $bin --dir /tmp/b --gib 1 --cases b1,z2 --ours-only --tiles-only --tiles 9 --repeat 2 --label $who --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { log "tiles $who rc=$?"; tail -5 /tmp/t.log >> $OUT/log.txt; }; log "tiles $who done $(el)"; }
done
staged_tests "blosc lz4 zstd corrupt" "lz4 blosc zstd"
python3 -c "import zarr, zarrs_gpu, zarrs_gpu._zarr_hooks as h; print('zarr', zarr.__version__, 'hooks supported', h.supported(zarr.__version__))" >> $OUT/log.txt 2>&1
l=$(left); [ $l -gt 40 ] && { (cd python/tests && timeout $((l - 15)) python3 -m unittest -v test_gpu.GpuTests test_gpu.XarrayCFDecodingGpuTests test_gpu.TorchGpuTests test_gpu.DistributedGpuTests test_gpu.InterruptGpuTests) > $OUT/python.log 2>&1; log "python GPU tests rc=$? $(el)"; grep -E "^Ran |^OK|^FAILED|Error:|ERROR:|FAIL:" $OUT/python.log | head -30 >> $OUT/log.txt; }
summary
cat $OUT/log.txt
