#!/usr/bin/env bash
# Issue 47's route on the GPU host: the corruption sweep on the default route, then size rows,
# whole reads and tiles for Z2 (auto -> ours, against nvCOMP named), B1 (our LZ4 unwalked,
# against nvCOMP's walked) and B2 (host threads under checked, against nvCOMP trusted).
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
D=$(ls /tmp/gpu-bin/bin/tests/device-* | head -1)
{
  echo "== corruption sweep, default route"
  timeout 230 $D --include-ignored --test-threads=1 --nocapture sweep:: 2>&1 | grep -vE "^\s*$" | tail -16
} >> $OUT/log.txt 2>&1
rows() {  # label case env...
  local label=$1 case=$2; shift 2
  env "$@" timeout 150 bench --dir /tmp/b --gib 1 --cases $case --sizes 1,16,64,288,1024 --size-reads 9 --ours-only --tiles 0 --repeat 3 --label $label --json $OUT/sizes.jsonl > /tmp/s.log 2>&1 || { echo "bench $label $case rc=$?"; tail -3 /tmp/s.log; } >> $OUT/log.txt
}
for i in 1 2; do
  rows auto z2 ZARRS_GPU_ZSTD_DECODER=auto
  rows nvcomp z2 ZARRS_GPU_ZSTD_DECODER=nvcomp
done
rows ours-lz4 b1 ZARRS_GPU_LZ4_DECODER=ours
rows nvcomp-lz4 b1 ZARRS_GPU_LZ4_DECODER=nvcomp
rows ours-lz4 b1 ZARRS_GPU_LZ4_DECODER=ours
rows checked b2 ZARRS_GPU_DECODE_TRUST=checked
rows trusted b2 ZARRS_GPU_DECODE_TRUST=trusted
for d in auto nvcomp; do
  ZARRS_GPU_ZSTD_DECODER=$d timeout 100 bench --dir /tmp/b --gib 1 --cases z2 --tiles 9 --tiles-only --batch 32 --label $d --json $OUT/tiles.jsonl > /tmp/t.log 2>&1 || { echo "tiles $d rc=$?"; tail -3 /tmp/t.log; } >> $OUT/log.txt
done
python3 - >> $OUT/log.txt <<'PY'
import json, os
for f in ("sizes.jsonl", "tiles.jsonl"):
    p = os.path.join(os.environ["OUT"], f)
    if not os.path.exists(p):
        continue
    for line in open(p):
        r = json.loads(line)
        ms = r.get("median_ms", r.get("seconds", 0) * 1e3)
        print(f'{r["peer"][:34]:34} {r["case"][:58]:58} {ms:8.2f} ms p90 {r.get("p90_ms", 0):7.2f} {r.get("gib_s", 0):6.2f} GiB/s {r.get("decoder") or ""} {r.get("io","")[:40]}')
PY
cat $OUT/log.txt
