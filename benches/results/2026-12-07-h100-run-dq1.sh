#!/usr/bin/env bash
# Run DQ1 (build 0f7eb21 and later): our LZ4 kernel with the tile's input in shared memory,
# 16-bit entries and threads from the launch (1,024 for few streams); zstd's blocks split into
# spans of sequences in launches of few blocks. Against e98499b's build (the one-warp LZ4 walk,
# zstd's one-lane sequences) in the same call: the harnesses (every dumped case equal to the CPU
# shim; LZ4 phases and #define variants; zstd split and not, HEAD's kernels), B1 and Z2 size rows
# and whole 1 GiB reads through the pipeline with both builds (nvCOMP named too), a traced
# small read, tiles, the LZ4/Blosc/zstd tests.
set -uo pipefail
root=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
start=$(date +%s)
el() { echo $(( $(date +%s) - start ))s; }
left() { echo $(( 420 - ($(date +%s) - start) )); }
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
LZ4_PHASES=1 LZ4_VARIANTS="THREADS=512;THREADS=1024;TILE=2048,WINDOW=2048" \
  timeout 150 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > $OUT/harness-lz4.txt 2>&1
echo "lz4 harness rc=$? $(el)" >> $OUT/log.txt; grep -v "^phases of 1024 chunks, stream" $OUT/harness-lz4.txt >> $OUT/log.txt
rows() {  # label binary case env...
  local label=$1 bin=$2 case=$3; shift 3
  [ $(left) -lt 60 ] && { echo "rows $label $case: not run (time)" >> $OUT/log.txt; return; }
  env "$@" timeout 100 $bin --dir /tmp/b --gib 1 --cases $case --sizes 1,16,64,288,1024 --size-reads 7 --ours-only --tiles 0 --repeat 3 --label $label --json $OUT/rows.jsonl > /tmp/s.log 2>&1 || { echo "bench $label $case rc=$?"; tail -5 /tmp/s.log; } >> $OUT/log.txt
  cat /tmp/s.log >> $OUT/bench.log
  echo "$label $case done $(el)" >> $OUT/log.txt
}
rows new bench z2
# zstd: the dumped cases (split 32 and 1), then decoder-only timings on the bench's Z2 chunks.
z="timeout 100 python3 benches/zstd_decoder.py .gpu/zcases.bin.xz --chunks /tmp/b/z2.zarr/c --json $OUT/zstd-rows.jsonl"
$z --frames 1,16,64,1024 --decoders blocks --label new > $OUT/harness-zstd.txt 2>&1
echo "zstd harness rc=$? $(el)" >> $OUT/log.txt; cat $OUT/harness-zstd.txt >> $OUT/log.txt
rows new bench b1
rows old-e98499b /tmp/old-bench b1
rows old-e98499b /tmp/old-bench z2
[ $(left) -gt 40 ] && {
ZSTD_SKIP_REPLAY=1 $z --frames 1,16,64 --decoders blocks --split 1 --label new > $OUT/harness-zstd-split1.txt 2>&1
echo "zstd harness split 1 rc=$? $(el)" >> $OUT/log.txt; grep "^ours" $OUT/harness-zstd-split1.txt >> $OUT/log.txt
ZSTD_SKIP_REPLAY=1 $z --frames 1,16,64 --decoders blocks --source .gpu/zhead --label 3694320 > $OUT/harness-zstd-head.txt 2>&1
echo "zstd harness 3694320 rc=$? $(el)" >> $OUT/log.txt; grep "^ours\|cases" $OUT/harness-zstd-head.txt >> $OUT/log.txt
}
while read -r name pkg; do
  case $name in device*|zarrs_gpu_codecs*) ;; *) continue;; esac
  l=$(left); [ $l -lt 40 ] && { echo "$name: not run (time)" >> $OUT/log.txt; continue; }
  case $name in device*) filt="blosc lz4 zstd corrupt";; *) filt="lz4 blosc zstd";; esac
  (cd "$root/$pkg" && timeout $((l - 20)) /tmp/gpu-bin/bin/tests/$name --include-ignored --test-threads=1 --skip remote:: --skip dump_cases $filt) > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -E '^test result' /tmp/$name.log | tail -1) $(el)" >> $OUT/log.txt
  grep -E "^test .* FAILED|^---- |damaged frames that|panicked" /tmp/$name.log | head -20 >> $OUT/log.txt
  grep -E "^test " /tmp/$name.log | sed 's/^test //' >> $OUT/tests.txt
done < /tmp/gpu-bin/bin/tests/dirs
[ $(left) -gt 40 ] && {
LZ4_SOURCE=.gpu/head/lz4_decode.cu LZ4_TIMINGS_ONLY=1 timeout 60 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > $OUT/harness-lz4-head.txt 2>&1
echo "lz4 harness 3694320 rc=$? $(el)" >> $OUT/log.txt; cat $OUT/harness-lz4-head.txt >> $OUT/log.txt
LZ4_SOURCE=.gpu/old/lz4_decode.cu LZ4_SHAPE=warp LZ4_TIMINGS_ONLY=1 timeout 60 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > $OUT/harness-lz4-old.txt 2>&1
echo "lz4 harness e98499b rc=$? $(el)" >> $OUT/log.txt; cat $OUT/harness-lz4-old.txt >> $OUT/log.txt
}
# Where a small read's time goes: every read's stages (the size rows' reads, each mode).
[ $(left) -gt 60 ] && { ZARRS_GPU_TRACE=1 timeout 40 bench --dir /tmp/b --gib 1 --cases b1,z2 --sizes 1,64 --size-reads 3 --ours-only --tiles 0 --repeat 1 > $OUT/trace.log 2>&1; echo "trace rc=$? $(el)" >> $OUT/log.txt; }
[ $(left) -gt 30 ] && { timeout 25 bench --dir /tmp/b --gib 1 --cases b1,z2 --ours-only --tiles-only --tiles 9 --repeat 2 --label new --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { echo "tiles rc=$?"; tail -5 /tmp/t.log; } >> $OUT/log.txt; echo "tiles done $(el)" >> $OUT/log.txt; }
rows nvcomp bench b1 ZARRS_GPU_LZ4_DECODER=nvcomp
python3 - >> $OUT/log.txt <<'PY'
import json, os
for f in ("rows.jsonl", "tiles.jsonl"):
    p = os.path.join(os.environ["OUT"], f)
    if not os.path.exists(p): continue
    for line in open(p):
        r = json.loads(line)
        runs = sorted(r.get("runs") or [r.get("seconds", 0)])
        med = runs[len(runs) // 2] * 1e3; p90 = runs[min(len(runs) - 1, int(0.9 * len(runs)))] * 1e3
        if "median_ms" in r: med, p90 = r["median_ms"], r.get("p90_ms", 0)
        print(f'{r["peer"][:28]:28} {r["case"][:60]:60} med {med:7.2f} p90 {p90:7.2f} {r.get("gib_s", 0):6.2f} GiB/s {r.get("decoder") or ""} | {r.get("io","")[-50:]}')
PY
cat $OUT/log.txt
