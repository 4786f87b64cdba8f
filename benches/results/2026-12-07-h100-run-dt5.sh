#!/usr/bin/env bash
# Run DT5 (DT4's payload, build 0071292; about 70 s of device time were left): DS6's tests that
# need an S3 server first, then as much of the LZ4 race's check and the decoders' device tests
# as time allows.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-70}
xz -dc .gpu2/s3s-fs.xz > /tmp/s3s-fs && chmod +x /tmp/s3s-fs
read -r dev pkg < <(awk '$1 ~ /^device/' /tmp/gpu-bin/bin/tests/dirs | head -1)
(cd "$pkg" && S3S_FS=/tmp/s3s-fs ZARRS_GPU_REQUIRE_S3=1 timeout 40 /tmp/gpu-bin/bin/tests/$dev --include-ignored --test-threads=1 remote::) > /tmp/remote.log 2>&1
log "$dev remote:: rc=$? $(grep -E '^test result' /tmp/remote.log | tail -1) $(el)"
grep -E "^test .* FAILED|^---- |panicked" /tmp/remote.log | head -10 >> $OUT/log.txt
grep -E "^test " /tmp/remote.log | sed 's/^test //' >> $OUT/tests.txt
(cd python/tests && S3S_FS=/tmp/s3s-fs ZARRS_GPU_REQUIRE_S3=1 timeout 30 python3 -m unittest -v test_gpu.RemoteGpuTests) > $OUT/python.log 2>&1
log "python RemoteGpuTests rc=$? $(el)"; grep -E "^Ran |^OK|^FAILED|ERROR:|FAIL:|skipped" $OUT/python.log | head -10 >> $OUT/log.txt
staged_tests "blosc::" ""
cat $OUT/log.txt
