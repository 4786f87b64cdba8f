#!/usr/bin/env bash
# Run DP1: the LZ4 kernel of a thread block per LZ4 block (tables, chain, prefix-sum places,
# window passes) on the device: the harness (every dumped case equal to the CPU shim; B1's
# streams, kernel alone) against e98499b's one-warp walk in the same call; B1 size rows through
# the pipeline (scheduled, all on our device decoder, all host threads; nvCOMP named); the
# device tests and the codec crate's GPU tests.
set -uo pipefail
root=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
start=$(date +%s)
el() { echo $(( $(date +%s) - start ))s; }
timeout 90 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.gz > $OUT/harness-new.txt 2>&1
echo "harness new rc=$? $(el)" >> $OUT/log.txt; cat $OUT/harness-new.txt >> $OUT/log.txt
LZ4_SOURCE=.gpu/old/lz4_decode.cu LZ4_SHAPE=warp LZ4_TIMINGS_ONLY=1 timeout 90 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.gz > $OUT/harness-old.txt 2>&1
echo "harness old (e98499b) rc=$? $(el)" >> $OUT/log.txt; cat $OUT/harness-old.txt >> $OUT/log.txt
rows() {  # label case env...
  local label=$1 case=$2; shift 2
  env "$@" timeout 100 bench --dir /tmp/b --gib 1 --cases $case --sizes 1,16,64,288,1024 --size-reads 7 --ours-only --tiles 0 --repeat 3 --label $label --json $OUT/rows.jsonl > /tmp/s.log 2>&1 || { echo "bench $label $case rc=$?"; tail -5 /tmp/s.log; } >> $OUT/log.txt
  cat /tmp/s.log >> $OUT/bench.log
  echo "$label $case done $(el)" >> $OUT/log.txt
}
rows new b1
while read -r name pkg; do
  case $name in device*|zarrs_gpu_codecs*) ;; *) continue;; esac
  left=$((200 - ($(date +%s) - start)))
  [ $left -lt 20 ] && { echo "$name: not run (time)" >> $OUT/log.txt; continue; }
  case $name in device*) filt="blosc lz4 corrupt";; *) filt="lz4 blosc";; esac
  (cd "$root/$pkg" && timeout $left /tmp/gpu-bin/bin/tests/$name --include-ignored --test-threads=1 --skip remote:: --skip dump_cases $filt) > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -E '^test result' /tmp/$name.log | tail -1) $(el)" >> $OUT/log.txt
  grep -E "^test .* FAILED|^---- |damaged frames that|panicked" /tmp/$name.log | head -20 >> $OUT/log.txt
  grep -E "^test " /tmp/$name.log | sed 's/^test //' >> $OUT/tests.txt
done < /tmp/gpu-bin/bin/tests/dirs
rows nvcomp b1 ZARRS_GPU_LZ4_DECODER=nvcomp
timeout 40 bench --dir /tmp/b --gib 1 --cases b1 --ours-only --tiles-only --tiles 9 --repeat 2 --label new --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { echo "tiles rc=$?"; tail -5 /tmp/t.log; } >> $OUT/log.txt
echo "tiles done $(el)" >> $OUT/log.txt
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
        print(f'{r["peer"][:24]:24} {r["case"][:60]:60} med {med:7.2f} p90 {p90:7.2f} {r.get("gib_s", 0):6.2f} GiB/s {r.get("decoder") or ""} | {r.get("io","")[-50:]}')
PY
cat $OUT/log.txt
