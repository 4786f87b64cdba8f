#!/usr/bin/env bash
# Run DQ2 (build 3167e37): our LZ4 kernel reading literals from the tile's bytes in shared memory,
# threads a launch by DQ1's figures. The harness (every dumped case equal to the CPU shim; phases;
# 256, 512 and 1,024 threads) beside 0f7eb21's kernel, B1 size rows and the whole 1 GiB read with
# this build and e98499b's, a traced small read, the LZ4/Blosc tests. At most 8 files come back.
set -uo pipefail
root=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
start=$(date +%s)
el() { echo $(( $(date +%s) - start ))s; }
left() { echo $(( 170 - ($(date +%s) - start) )); }
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
LZ4_PHASES=1 LZ4_VARIANTS="THREADS=512;THREADS=1024" timeout 90 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h1.txt 2>&1
echo "lz4 harness 3167e37 rc=$? $(el)" >> $OUT/log.txt; grep -v "^phases of 1024 chunks, stream" /tmp/h1.txt >> $OUT/log.txt
rows() {  # label binary case env...
  local label=$1 bin=$2 case=$3; shift 3
  [ $(left) -lt 40 ] && { echo "rows $label $case: not run (time)" >> $OUT/log.txt; return; }
  env "$@" timeout 80 $bin --dir /tmp/b --gib 1 --cases $case --sizes 1,16,64,288,1024 --size-reads 7 --ours-only --tiles 0 --repeat 3 --label $label --json $OUT/rows.jsonl > /tmp/s.log 2>&1 || { echo "bench $label $case rc=$?"; tail -5 /tmp/s.log; } >> $OUT/log.txt
  cat /tmp/s.log >> $OUT/bench.log
  echo "$label $case done $(el)" >> $OUT/log.txt
}
rows new bench b1
rows old-e98499b /tmp/old-bench b1
[ $(left) -gt 30 ] && {
LZ4_SOURCE=.gpu/q1/lz4_decode.cu LZ4_TIMINGS_ONLY=1 LZ4_VARIANTS="THREADS=512;THREADS=1024" timeout 60 python3 benches/lz4_decoder.py .gpu/lz4cases.bin.xz > /tmp/h2.txt 2>&1
echo "lz4 harness 0f7eb21 rc=$? $(el)" >> $OUT/log.txt; grep -E "variant|each stream|chunks " /tmp/h2.txt >> $OUT/log.txt
}
cat /tmp/h1.txt /tmp/h2.txt > $OUT/harness.txt 2>/dev/null
while read -r name pkg; do
  case $name in device*|zarrs_gpu_codecs*) ;; *) continue;; esac
  l=$(left); [ $l -lt 30 ] && { echo "$name: not run (time)" >> $OUT/log.txt; continue; }
  case $name in device*) filt="blosc lz4 corrupt";; *) filt="lz4 blosc";; esac
  (cd "$root/$pkg" && timeout $((l - 20)) /tmp/gpu-bin/bin/tests/$name --include-ignored --test-threads=1 --skip remote:: --skip dump_cases $filt) > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -E '^test result' /tmp/$name.log | tail -1) $(el)" >> $OUT/log.txt
  grep -E "^test .* FAILED|^---- |panicked" /tmp/$name.log | head -20 >> $OUT/log.txt
  grep -E "^test " /tmp/$name.log | sed 's/^test //' >> $OUT/tests.txt
done < /tmp/gpu-bin/bin/tests/dirs
[ $(left) -gt 25 ] && { ZARRS_GPU_TRACE=1 timeout 30 bench --dir /tmp/b --gib 1 --cases b1 --sizes 1,16 --size-reads 3 --ours-only --tiles 0 --repeat 1 > $OUT/trace.log 2>&1; echo "trace rc=$? $(el)" >> $OUT/log.txt; }
python3 - >> $OUT/log.txt <<'PY'
import json, os
p = os.path.join(os.environ["OUT"], "rows.jsonl")
for line in open(p) if os.path.exists(p) else []:
    r = json.loads(line)
    runs = sorted(r.get("runs") or [r.get("seconds", 0)])
    med = runs[len(runs) // 2] * 1e3; p90 = runs[min(len(runs) - 1, int(0.9 * len(runs)))] * 1e3
    print(f'{r["peer"][:28]:28} {r["case"][:60]:60} med {med:7.2f} p90 {p90:7.2f} {r.get("gib_s", 0):6.2f} GiB/s | {r.get("io","")[-60:]}')
PY
cat $OUT/log.txt
