#!/usr/bin/env bash
# Run DO1: HEAD (a491712: e98499b and the LZ4 kernel's batches) on the device: the LZ4 kernel's
# batches against e98499b's one-token walk (B1's streams, same bytes, kernel times); our zstd kernels alone (the harness: every dumped case
# equal to the CPU shim, then decoder-only timings, each jump launch timed) with this build's
# bytes.cu and 3b86314's (one-link passes) in one call; Z2 and B2 size rows of this build against
# f137216's build on the same data; the tile, crop-batch and filled-device rows; then every device
# test and the codec crate's GPU tests.
set -uo pipefail
root=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
start=$(date +%s)
el() { echo $(( $(date +%s) - start ))s; }
timeout 70 python3 benches/zstd_decoder.py .gpu/zcases.bin.gz --frames 1,16,64,1024 --decoders blocks --label new --json $OUT/harness.jsonl > $OUT/harness-new.txt 2>&1
echo "harness new rc=$? $(el)" >> $OUT/log.txt
old=/tmp/oldsrc; mkdir -p $old && cp zarrs_gpu_codecs/src/codecs/zstd/*.cu $old/ && cp .gpu/old/bytes.cu $old/
timeout 50 python3 benches/zstd_decoder.py .gpu/zcases.bin.gz --source $old --frames 1,16,64 --decoders blocks --label 3b86314 --json $OUT/harness.jsonl > $OUT/harness-old.txt 2>&1
echo "harness old rc=$? $(el)" >> $OUT/log.txt
grep -E "cases|^ours" $OUT/harness-new.txt $OUT/harness-old.txt >> $OUT/log.txt
timeout 60 python3 .gpu/lz4ab.py .gpu/lz4b1.bin .gpu/old/lz4_decode.cu > $OUT/lz4ab.txt 2>&1; echo "lz4 a/b rc=$? $(el)" >> $OUT/log.txt; cat $OUT/lz4ab.txt >> $OUT/log.txt
xz -dc .gpu/bench-base.xz > /tmp/bench-base && chmod +x /tmp/bench-base; base=/tmp/bench-base
rows() {  # label binary case env...
  local label=$1 bin=$2 case=$3; shift 3
  env "$@" timeout 60 $bin --dir /tmp/b --gib 1 --cases $case --sizes 1,16,64,288,1024 --size-reads 9 --ours-only --tiles 0 --repeat 3 --label $label --json $OUT/rows.jsonl > /tmp/s.log 2>&1 || { echo "bench $label $case rc=$?"; tail -5 /tmp/s.log; } >> $OUT/log.txt
  echo "$label $case done $(el)" >> $OUT/log.txt
}
for c in z2 b2 b1; do
  rows new bench $c
  rows base $base $c
done
while read -r name pkg; do
  case $name in device*|zarrs_gpu_codecs*) ;; *) continue;; esac
  left=$((470 - ($(date +%s) - start)))
  [ $left -lt 20 ] && { echo "$name: not run (time)" >> $OUT/log.txt; continue; }
  (cd "$root/$pkg" && timeout $left /tmp/gpu-bin/bin/tests/$name --include-ignored --test-threads=1 --skip remote:: --skip dump_cases) > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -E '^test result' /tmp/$name.log | tail -1) $(el)" >> $OUT/log.txt
  grep -E "^test .* FAILED|^---- |damaged frames that|panicked" /tmp/$name.log | head -20 >> $OUT/log.txt
  grep -E "^test " /tmp/$name.log | sed 's/^test //' >> $OUT/tests.txt
  cat /tmp/$name.log >> $OUT/tests.log
done < /tmp/gpu-bin/bin/tests/dirs
[ $(( $(date +%s) - start )) -lt 480 ] && {
timeout 50 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --tiles-only --tiles 16 --repeat 3 --label new --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { echo "tiles rc=$?"; tail -5 /tmp/t.log; } >> $OUT/log.txt
echo "tiles done $(el)" >> $OUT/log.txt
timeout 55 bench --dir /tmp/b --gib 1 --cases z2 --ours-only --filled 512 --batch 32 --repeat 3 --label new --json $OUT/tiles.jsonl > /tmp/f.log 2>&1 || { echo "filled/batch rc=$?"; tail -5 /tmp/f.log; } >> $OUT/log.txt
echo "filled/batch done $(el)" >> $OUT/log.txt
}
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
        print(f'{r["peer"][:24]:24} {r["case"][:56]:56} med {med:7.2f} p90 {p90:7.2f} {r.get("gib_s", 0):6.2f} GiB/s {r.get("decoder") or ""} | {r.get("io","")[-60:]}')
PY
cat $OUT/log.txt
