#!/usr/bin/env bash
# Run DT4 (build b9d03a3; .gpu with the device tests, the package's wheel,
# zarr-python 3.4.2, obstore 0.12.1, rangehttpserver, s3s-fs as s3s-fs.xz): DS6's tests that need
# an S3 server (device `remote::`, Python `RemoteGpuTests`); the LZ4 race looked for in 3 B1 runs
# of 288 and 1,024 chunks (DT1: about one run in four failed; 3 runs here, device time); this build's size rows; the zstd
# block phases with the Huffman tree's build apart; then the device tests of the decoders'
# paths first, others while time is left.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-430}
xz -dc .gpu/s3s-fs.xz > /tmp/s3s-fs && chmod +x /tmp/s3s-fs
read -r dev pkg < <(awk '$1 ~ /^device/' /tmp/gpu-bin/bin/tests/dirs | head -1)
(cd "$pkg" && S3S_FS=/tmp/s3s-fs ZARRS_GPU_REQUIRE_S3=1 timeout 90 /tmp/gpu-bin/bin/tests/$dev --include-ignored --test-threads=1 remote::) > /tmp/remote.log 2>&1
log "$dev remote:: rc=$? $(grep -E '^test result' /tmp/remote.log | tail -1) $(el)"
grep -E "^test .* FAILED|^---- |panicked" /tmp/remote.log | head -20 >> $OUT/log.txt
grep -E "^test " /tmp/remote.log | sed 's/^test //' >> $OUT/tests.txt
(cd python/tests && S3S_FS=/tmp/s3s-fs ZARRS_GPU_REQUIRE_S3=1 timeout 90 python3 -m unittest -v test_gpu.RemoteGpuTests) > $OUT/python.log 2>&1
log "python RemoteGpuTests rc=$? $(el)"; grep -E "^Ran |^OK|^FAILED|ERROR:|FAIL:|skipped" $OUT/python.log | head -20 >> $OUT/log.txt
timeout 120 bench --dir /tmp/b --gib 1 --cases z2,b1 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
fails=0
for i in $(seq 3); do
  timeout 60 bench --dir /tmp/b --gib 1 --cases b1 --sizes 288,1024 --size-reads 9 --ours-only --tiles 0 --repeat 2 > /tmp/s.log 2>&1 ||
    { fails=$((fails + 1)); grep -i error /tmp/s.log | head -2 >> $OUT/log.txt; }
done
log "B1 stress: $fails of 3 runs failed $(el)"
[ "$(left)" -gt 250 ] && rows dt4 bench b1
[ "$(left)" -gt 230 ] && rows dt4 bench z2
: > /tmp/empty.bin
[ "$(left)" -gt 200 ] && ZSTD_SKIP_REPLAY=1 timeout 60 python3 benches/zstd_decoder.py /tmp/empty.bin --chunks /tmp/b/z2.zarr/c --frames 1 \
  --decoders blocks --cycles --cycles-frames 1,16 > $OUT/harness.txt 2>&1
log "zstd harness phases rc=$? $(el)"; tail -8 $OUT/harness.txt >> $OUT/log.txt
staged_tests "blosc:: compressed:: retrieval:: boxes::" ""
staged_tests "sharding:: write:: batch:: hostile:: integrity:: sweep:: faults::" ""
summary
cat $OUT/log.txt
