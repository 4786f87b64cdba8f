#!/usr/bin/env bash
# Run DS6 (build 550a7d5; NOT RUN: the session's device time could not start another machine): the tests that need an S3 server (s3s-fs staged as .gpu/s3s-fs.xz):
# the device tests' remote:: and the Python package's RemoteGpuTests (obstore, zarr-python
# 3.4.2); then every other device test, while time is left.
set -uo pipefail
. benches/gpu_run.sh 290
xz -dc .gpu/s3s-fs.xz > /tmp/s3s-fs && chmod +x /tmp/s3s-fs
export S3S_FS=/tmp/s3s-fs ZARRS_GPU_REQUIRE_S3=1
read -r dev pkg < <(awk '$1 ~ /^device/' /tmp/gpu-bin/bin/tests/dirs | head -1)
(cd "$pkg" && timeout 90 /tmp/gpu-bin/bin/tests/$dev --include-ignored --test-threads=1 remote::) > /tmp/remote.log 2>&1
log "$dev remote:: rc=$? $(grep -E '^test result' /tmp/remote.log | tail -1) $(el)"
grep -E "^test .* FAILED|^---- |panicked" /tmp/remote.log | head -20 >> $OUT/log.txt
grep -E "^test " /tmp/remote.log | sed 's/^test //' >> $OUT/tests.txt
(cd python/tests && timeout 90 python3 -m unittest -v test_gpu.RemoteGpuTests) > $OUT/python.log 2>&1
log "python RemoteGpuTests rc=$? $(el)"; grep -E "^Ran |^OK|^FAILED|ERROR:|FAIL:|skipped" $OUT/python.log | head -20 >> $OUT/log.txt
staged_tests "" ""
cat $OUT/log.txt
