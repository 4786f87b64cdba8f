#!/usr/bin/env bash
# The benchmark of record: ours and the peers in one run, on the same data, warm page cache.
# On the GPU host (after ../shared/gpu/stage --peers):  bash .gpu/run bash benches/run.sh [GIB]
set -euo pipefail
gib=${1:-8}
out=${OUT:-/tmp/out}; mkdir -p "$out"
dir=/tmp/zarrs-gpu-bench
export PYTHONUNBUFFERED=1
rm -f "$out/bench.jsonl"
bench --dir "$dir" --gib "$gib" --repeat 5 --json "$out/bench.jsonl"
python3 benches/peers.py --array "$dir/u1.zarr" --repeat 3 --json "$out/bench.jsonl"
python3 benches/peers.py --array "$dir/u1.zarr" --subset "0:64" --repeat 3 --json "$out/bench.jsonl"
python3 benches/peers.py --array "$dir/u1.zarr" --subset "0:16" --repeat 5 --json "$out/bench.jsonl"
python3 - "$out/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'who':<20} {'subset':<40} {'GiB':>7} {'s':>8} {'GiB/s':>8}")
for r in rows:
    if "gib_s" in r:
        print(f"{r['peer']:<20} {str(r.get('case', r.get('subset')))[:40]:<40} {r['bytes']/2**30:7.3f} {r['seconds']:8.4f} {r['gib_s']:8.2f}")
    else:
        print(f"{r['peer']:<20} {r.get('error') or r.get('skipped')}")
PY
