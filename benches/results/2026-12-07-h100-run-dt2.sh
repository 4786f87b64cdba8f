#!/usr/bin/env bash
# Run DT2 (build 1c7f0ea; .gpu2 staged with the device tests, the package's wheel, zarr-python
# 3.4.2, obstore 0.12.1, rangehttpserver and s3s-fs as s3s-fs.xz): DS6's tests that need an S3
# server (device `remote::`, Python `RemoteGpuTests`), every other device test, then the
# package's GPU tests.
set -uo pipefail
. benches/gpu_run.sh 560
xz -dc .gpu2/s3s-fs.xz > /tmp/s3s-fs && chmod +x /tmp/s3s-fs
export S3S_FS=/tmp/s3s-fs ZARRS_GPU_REQUIRE_S3=1
read -r dev pkg < <(awk '$1 ~ /^device/' /tmp/gpu-bin/bin/tests/dirs | head -1)
(cd "$pkg" && timeout 90 /tmp/gpu-bin/bin/tests/$dev --include-ignored --test-threads=1 remote::) > /tmp/remote.log 2>&1
log "$dev remote:: rc=$? $(grep -E '^test result' /tmp/remote.log | tail -1) $(el)"
grep -E "^test .* FAILED|^---- |panicked" /tmp/remote.log | head -20 >> $OUT/log.txt
grep -E "^test " /tmp/remote.log | sed 's/^test //' >> $OUT/tests.txt
(cd python/tests && timeout 90 python3 -m unittest -v test_gpu.RemoteGpuTests) > $OUT/python-remote.log 2>&1
log "python RemoteGpuTests rc=$? $(el)"; grep -E "^Ran |^OK|^FAILED|ERROR:|FAIL:|skipped" $OUT/python-remote.log | head -20 >> $OUT/log.txt
staged_tests "" ""
l=$(left); [ $l -gt 40 ] && { (cd python/tests && timeout $((l - 10)) python3 -m unittest -v test_gpu.XarrayCFDecodingGpuTests test_gpu.TorchGpuTests test_gpu.InterruptGpuTests) > $OUT/python.log 2>&1; log "python GPU tests rc=$? $(el)"; grep -E "^Ran |^OK|^FAILED|ERROR:|FAIL:" $OUT/python.log | head -20 >> $OUT/log.txt; }
cat $OUT/log.txt
