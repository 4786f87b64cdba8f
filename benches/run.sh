#!/usr/bin/env bash
# The benchmark of record: ours and the peers in one run, on the same data, warm page cache.
# On the GPU host (after ../shared/gpu/stage --peers):  bash .gpu/run bash benches/run.sh [GIB] [PEER_REPEAT]
set -euo pipefail
gib=${1:-8}
prep=${2:-3}
out=${OUT:-/tmp/out}; mkdir -p "$out"
dir=/tmp/zarrs-gpu-bench
export PYTHONUNBUFFERED=1
rm -f "$out/bench.jsonl"
bench --dir "$dir" --gib "$gib" --repeat 5 --cases u1,z1,z2 --json "$out/bench.jsonl"
python3 benches/peers.py --array "$dir/u1.zarr" --repeat "$prep" --json "$out/bench.jsonl"
python3 benches/peers.py --array "$dir/u1.zarr" --subset "0:64" --repeat "$prep" --json "$out/bench.jsonl"
python3 benches/peers.py --array "$dir/u1.zarr" --subset "0:16" --repeat "$prep" --json "$out/bench.jsonl"
# zstd arrays: zarr-python's host decode on the whole array; its GPU path (nvCOMP zstd, one chunk
# per call as shipped) on a 16-plane slab, since it runs at about 0.1 GiB/s.
for z in z1 z2; do
  python3 benches/peers.py --array "$dir/$z.zarr" --peers zarr-host,nvcomp-ceiling --repeat 1 --json "$out/bench.jsonl"
  python3 benches/peers.py --array "$dir/$z.zarr" --subset "0:16" --peers zarr-gpu --repeat 1 --json "$out/bench.jsonl"
  python3 benches/peers.py --array "$dir/$z.zarr" --subset "0:16" --peers zarr-gpu --batch-size 256 --repeat 1 --json "$out/bench.jsonl"
done
python3 - "$out/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'who':<28} {'case':<34} {'GiB':>7} {'s':>8} {'GiB/s':>8}")
for r in rows:
    if "gib_s" in r:
        print(f"{r['peer']:<28} {str(r.get('case', r.get('subset')))[:34]:<34} {r['bytes']/2**30:7.3f} {r['seconds']:8.4f} {r['gib_s']:8.2f}")
    else:
        print(f"{r['peer']:<28} {r.get('error') or r.get('skipped')}")
PY
