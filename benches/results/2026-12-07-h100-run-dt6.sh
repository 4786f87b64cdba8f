#!/usr/bin/env bash
# Run DT6 (build 3822211, beside 4c89d53's bench, DT1's, as .gpu/bench-4c89d53.xz): the host's
# chain walk on the host's 16 cores (a broadcast against the pool's iterator); the size and
# whole-array rows of this build and DT1's in turn, twice (DT4's whole Z2 read was 63 ms against
# DT1's 55: which build?); traced 1-chunk reads; the zstd kernels' replay of the CPU shim's
# cases (HEAD's kernels never replayed on the GPU); the device tests DT4 left out, then the
# decoders' own again.
set -uo pipefail
. benches/gpu_run.sh ${BUDGET:-400}
xz -dc .gpu/bench-4c89d53.xz > /tmp/bench-old && chmod +x /tmp/bench-old
read -r cod cpkg < <(awk '$1 ~ /^zarrs_gpu_codecs/' /tmp/gpu-bin/bin/tests/dirs | head -1)
(cd "$cpkg" && timeout 60 /tmp/gpu-bin/bin/tests/$cod --ignored --nocapture --test-threads=1 time_the_parts_of_the_hosts_chain_walk) > /tmp/walk.log 2>&1
log "walk timing rc=$? $(el)"; grep -E "blocks" /tmp/walk.log >> $OUT/log.txt
timeout 120 bench --dir /tmp/b --gib 1 --cases z2,b1 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
for round in 1 2; do
  rows new$round bench z2
  rows old$round /tmp/bench-old z2
  rows new$round bench b1
  rows old$round /tmp/bench-old b1
done
for b in bench /tmp/bench-old; do
  ZARRS_GPU_TRACE=1 timeout 60 $b --dir /tmp/b --gib 1 --cases z2 --sizes 1,16 --size-reads 5 --ours-only --tiles 0 \
    --repeat 1 --label "trace $b" --json /tmp/trace-rows.jsonl > /tmp/trace.out 2> /tmp/trace.log
  log "trace $b rc=$? $(el)"; grep "zarrs_gpu trace" /tmp/trace.log | sed "s|^|$b |" | cut -c1-400 >> $OUT/trace.txt
done
[ "$(left)" -gt 200 ] && timeout 120 python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c \
  --frames 1,16,64 --decoders blocks > $OUT/harness.txt 2>&1
log "zstd replay rc=$? $(el)"; grep -E "mismatch|frames|Error|error" $OUT/harness.txt | head -12 >> $OUT/log.txt
staged_tests "compress:: delta:: dlpack:: load:: memory:: multi_gpu:: plugin:: read_ahead:: reader:: zlib::" "none_here"
staged_tests "compressed:: retrieval::" "none_here"
summary
cat $OUT/log.txt
