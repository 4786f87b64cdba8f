#!/usr/bin/env bash
# The benchmark of record: ours and the peers in one run, on the same data, warm page cache.
#   bash benches/run.sh [GIB] [PEER_REPEAT]
# from a checkout, on a machine with an NVIDIA GPU and its driver, nvCOMP's library
# (pip install nvidia-libnvcomp-cu13; NVCOMP_LIBRARY_PATH if it is not found) and, for the peers,
# Python with zarr, numcodecs, cupy (and tensorstore, nvidia-nvcomp-cu13 where installed). The
# `bench` program is taken from PATH when there (a machine without a Rust toolchain, given the
# built program), else built and run with cargo.
# CASES (default u1,z1,z2,s1; also z2c (Z2 with zstd checksums), g2, s1r, s1g) picks cases; BENCH_DIR (default /tmp/zarrs-gpu-bench) keeps the
# arrays, which are written once. OUT (default /tmp/out) receives bench.jsonl.
set -euo pipefail
gib=${1:-8}
prep=${2:-3}
cases=${CASES:-u1,z1,z2,s1}
out=${OUT:-/tmp/out}; mkdir -p "$out"
dir=${BENCH_DIR:-/tmp/zarrs-gpu-bench}
export PYTHONUNBUFFERED=1
rm -f "$out/bench.jsonl"
if command -v bench >/dev/null; then bench=(bench); else bench=(cargo run --release --example bench --); fi
"${bench[@]}" --dir "$dir" --gib "$gib" --repeat 5 --cases "$cases" --json "$out/bench.jsonl"
peers() { python3 benches/peers.py --array "$dir/$1.zarr" "${@:2}" --json "$out/bench.jsonl"; }
for case in ${cases//,/ }; do
  # This project's Python package (where installed: pip install ./python), beside the Rust figures.
  case $case in
    u1|z1|z2|s1) peers "$case" --peers zarrs-gpu-python,zarr-gpu-zarrs --repeat 5
                 [ "$case" = s1 ] && peers s1 --subset 0:64 --peers zarrs-gpu-python,zarr-gpu-zarrs --repeat 5 ;;
  esac
  case $case in
    u1)
      peers u1 --repeat "$prep"
      peers u1 --subset 0:64 --repeat "$prep"
      peers u1 --subset 0:16 --repeat "$prep" ;;
    z1|z2)
      # zarr-python's host decode on the whole array; its GPU buffers (enable_gpu(), zstd still
      # decoded on the host) and with an nvCOMP zstd codec (zarr-python PR #2863's approach;
      # one chunk per codec call as shipped, then codec_pipeline.batch_size 256) on 16-plane
      # slabs, since they run at 0.1 to 1 GiB/s; nvCOMP's Python API on the chunks already on
      # the device (the decode ceiling).
      peers "$case" --peers zarr-host,nvcomp-ceiling --repeat 1
      peers "$case" --subset 0:16 --peers zarr-gpu --repeat 1
      peers "$case" --subset 0:16 --peers zarr-gpu-nvcomp --repeat 1
      peers "$case" --subset 0:16 --peers zarr-gpu-nvcomp --batch-size 256 --repeat 1 ;;
    s1)
      # tensorstore (host read, then one copy) runs where its wheel is in .gpu/wheels (stage
      # --peers does not fetch it: put tensorstore and ml_dtypes cp312 wheels there by hand).
      peers s1 --peers zarr-host,tensorstore --repeat 1
      peers s1 --subset 0:64 --peers zarr-host,zarr-gpu,tensorstore --repeat 1
      peers s1 --subset 0:64 --peers zarr-gpu-nvcomp --batch-size 256 --repeat 1 ;;
    s1g)
      # gzip members without crc32c decode on host threads by default; trusted, on nvCOMP.
      ZARRS_GPU_DECODE_TRUST=trusted bench --dir "$dir" --gib "$gib" --repeat 5 --cases s1g --json "$out/bench.jsonl"
      peers s1g --subset 0:64 --peers zarr-host,zarr-gpu,tensorstore --repeat 1 ;;
  esac
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
