#!/usr/bin/env bash
# Every staged test binary, the ignored GPU tests included, but the corruption sweep (g9.sh runs it).
set -uo pipefail
root=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/summary.txt
start=$(date +%s)
while read -r name pkg; do
  left=$((560 - ($(date +%s) - start)))
  [ $left -lt 20 ] && { echo "$name: not run (time)" >> $OUT/summary.txt; continue; }
  (cd "$root/$pkg" && timeout $left /tmp/gpu-bin/bin/tests/$name --include-ignored --test-threads=1 --skip sweep::) > /tmp/$name.log 2>&1
  rc=$?
  echo "$name rc=$rc $(grep -E '^test result' /tmp/$name.log | tail -1) $(( $(date +%s) - start ))s" >> $OUT/summary.txt
  { echo "=== $name"; cat /tmp/$name.log; } >> $OUT/tests.log
  grep -E "^test .* FAILED|^---- " /tmp/$name.log | head -12 >> $OUT/summary.txt
done < /tmp/gpu-bin/bin/tests/dirs
cat $OUT/summary.txt
