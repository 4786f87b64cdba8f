#!/usr/bin/env bash
# Run DN1: session 30's GPU changes on the device (the bit reader refilled from registers; Blosc's
# zstd streams on our kernels) and session 31s (encoders owned by the codec families): the device tests they touch, then Z2 and B2 rows of this build
# (auto and nvCOMP named) against f137216's build on the same data, one machine, one call.
set -uo pipefail
root=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
start=$(date +%s)
dev=$(awk '$1 ~ /^device/ {print $1}' /tmp/gpu-bin/bin/tests/dirs | head -1)
timeout 210 /tmp/gpu-bin/bin/tests/$dev --include-ignored --test-threads=1 --skip remote:: --skip dump_cases blosc:: faults:: sweep:: compressed:: sharding:: write:: > /tmp/dev.log 2>&1
echo "$dev rc=$? $(grep -E '^test result' /tmp/dev.log | tail -1) $(( $(date +%s) - start ))s" >> $OUT/log.txt
grep -E "^test .* FAILED|^---- |damaged frames that|damaged zstd streams|panicked" /tmp/dev.log | head -40 >> $OUT/log.txt
cp /tmp/dev.log $OUT/tests.log
xz -dc .gpu/bench-base.xz > /tmp/bench-base && chmod +x /tmp/bench-base; base=/tmp/bench-base
rows() {  # label binary case env...
  local label=$1 bin=$2 case=$3; shift 3
  local left=$((420 - ($(date +%s) - start)))
  [ $left -lt 30 ] && { echo "$label $case: not run (time)" >> $OUT/log.txt; return; }
  env "$@" timeout $left $bin --dir /tmp/b --gib 1 --cases $case --sizes 1,64,1024 --size-reads 9 --ours-only --tiles 0 --repeat 3 --label $label --json $OUT/rows.jsonl > /tmp/s.log 2>&1 || { echo "bench $label $case rc=$?"; tail -5 /tmp/s.log; } >> $OUT/log.txt
  echo "$label $case done $(( $(date +%s) - start ))s" >> $OUT/log.txt
}
for c in z2 b2; do
  rows new-auto bench $c ZARRS_GPU_ZSTD_DECODER=auto
  rows base-auto $base $c ZARRS_GPU_ZSTD_DECODER=auto
  rows new-nvcomp bench $c ZARRS_GPU_ZSTD_DECODER=nvcomp
done
python3 - >> $OUT/log.txt <<'PY'
import json, os
for line in open(os.path.join(os.environ["OUT"], "rows.jsonl")):
    r = json.loads(line)
    runs = sorted(r.get("runs") or [r.get("seconds", 0)])
    med = runs[len(runs) // 2] * 1e3; p90 = runs[min(len(runs) - 1, int(0.9 * len(runs)))] * 1e3
    print(f'{r["peer"][:28]:28} {r["case"][:44]:44} med {med:7.2f} p90 {p90:7.2f} {r.get("gib_s", 0):6.2f} GiB/s {r.get("decoder") or ""} | {r.get("io","")[-70:]}')
PY
cat $OUT/log.txt
