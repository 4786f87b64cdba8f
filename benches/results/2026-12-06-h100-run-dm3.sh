#!/usr/bin/env bash
# The final state on the GPU host: the device tests (the sweep on the default route included),
# then Z2 (auto -> ours, against nvCOMP named) and B1 whole reads and size rows.
set -uo pipefail
root=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
start=$(date +%s)
while read -r name pkg; do
  left=$((330 - ($(date +%s) - start)))
  [ $left -lt 20 ] && { echo "$name: not run (time)" >> $OUT/log.txt; continue; }
  (cd "$root/$pkg" && timeout $left /tmp/gpu-bin/bin/tests/$name --include-ignored --test-threads=1 --skip remote:: --skip dump_cases) > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -E '^test result' /tmp/$name.log | tail -1) $(( $(date +%s) - start ))s" >> $OUT/log.txt
  grep -E "^test .* FAILED|^---- |damaged frames that|^\| " /tmp/$name.log | head -12 >> $OUT/log.txt
  cat /tmp/$name.log >> $OUT/tests.log
done < /tmp/gpu-bin/bin/tests/dirs
rows() {  # label case env...
  local label=$1 case=$2; shift 2
  env "$@" timeout 100 bench --dir /tmp/b --gib 1 --cases $case --sizes 1,64,1024 --size-reads 15 --ours-only --tiles 0 --repeat 5 --label $label --json $OUT/rows.jsonl > /tmp/s.log 2>&1 || { echo "bench $label $case rc=$?"; tail -3 /tmp/s.log; } >> $OUT/log.txt
}
rows auto z2 ZARRS_GPU_ZSTD_DECODER=auto
rows nvcomp z2 ZARRS_GPU_ZSTD_DECODER=nvcomp
rows auto z2 ZARRS_GPU_ZSTD_DECODER=auto
rows ours-lz4 b1 ZARRS_GPU_LZ4_DECODER=ours
python3 - >> $OUT/log.txt <<'PY'
import json, os
for line in open(os.path.join(os.environ["OUT"], "rows.jsonl")):
    r = json.loads(line)
    runs = sorted(r.get("runs") or [r.get("seconds", 0)])
    med = runs[len(runs) // 2] * 1e3; p90 = runs[min(len(runs) - 1, int(0.9 * len(runs)))] * 1e3
    print(f'{r["peer"][:32]:32} {r["case"][:52]:52} median {med:7.2f} ms p90 {p90:7.2f} {r.get("gib_s", 0):6.2f} GiB/s {r.get("decoder") or ""} | {r.get("io","")[-90:]}')
PY
cat $OUT/log.txt
