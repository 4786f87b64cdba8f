#!/usr/bin/env bash
# Run DT3 (build 1c7f0ea, beside 3d033c8's bench as .gpu/old/bench.xz): the LZ4 kernel's race
# (1c7f0ea: the round's flags read before thread 0's next chain) looked for in 10 B1 runs of
# 288 and 1,024 chunks and the whole array (DT1: about one run in four failed); then the size
# rows, Z2 and B1, this build and 3d033c8's in turn, and the traced stages of 1 and 16 chunks;
# the zstd block phases with the Huffman tree's build timed apart.
set -uo pipefail
. benches/gpu_run.sh 560
xz -dc .gpu/old/bench.xz > /tmp/bench-old && chmod +x /tmp/bench-old
timeout 120 bench --dir /tmp/b --gib 1 --cases z2,b1 --ours-only --tiles 0 --repeat 1 > /tmp/make.log 2>&1
log "arrays rc=$? $(el)"
fails=0
for i in $(seq 10); do
  timeout 60 bench --dir /tmp/b --gib 1 --cases b1 --sizes 288,1024 --size-reads 9 --ours-only --tiles 0 --repeat 2 > /tmp/s.log 2>&1 ||
    { fails=$((fails + 1)); grep -i error /tmp/s.log | head -2 >> $OUT/log.txt; }
done
log "B1 stress, this build: $fails of 10 runs failed $(el)"
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
# The zstd block phases again, the Huffman tree's build timed apart.
: > /tmp/empty.bin
ZSTD_SKIP_REPLAY=1 timeout 60 python3 benches/zstd_decoder.py /tmp/empty.bin --chunks /tmp/b/z2.zarr/c --frames 1 \
  --decoders blocks --cycles --cycles-frames 1,16 > $OUT/harness.txt 2>&1
log "zstd harness phases rc=$? $(el)"; tail -8 $OUT/harness.txt >> $OUT/log.txt
summary
cat $OUT/log.txt
