#!/usr/bin/env bash
# The benchmark of record: ours and the peers in one run, on the same data, warm page cache.
#   bash benches/run.sh [GIB] [PEER_REPEAT]
# from a checkout, on a machine with an NVIDIA GPU and its driver, nvCOMP's library
# (pip install nvidia-libnvcomp-cu13; NVCOMP_LIBRARY_PATH if it is not found) and, for the peers,
# Python with zarr, numcodecs, cupy (and tensorstore, nvidia-nvcomp-cu13 where installed). The
# `bench` program is taken from PATH when there (a machine without a Rust toolchain, given the
# built program), else built and run with cargo.
# CASES (default u1,z1,z2,s1,b1,b2; also z2c (Z2 with zstd checksums), g2, s1r, s1g) picks cases
# (b1, b2: Blosc lz4 + byte shuffle, zstd + bit shuffle); BENCH_DIR (default /tmp/zarrs-gpu-bench) keeps the
# arrays, which are written once. OUT (default /tmp/out) receives bench.jsonl.
# The tile step (issue 17), after the cases: `bench --tiles N --tiles-only` (random, chunk-aligned
# and one-chunk reads of 64 x 256 x 256 tiles, median and p90 ms, the host-thread bound beside the
# compressed ones), then benches/tiles.py on each array: the Python peers (zarrs_gpu's API,
# zarr-python in gpu_zarr_context(), enable_gpu(), host + cupy.asarray) on the same tiles, and a
# tile loop with a compute step, without and with prefetch. TILES (default 48; 0 skips the step)
# is N; TILE_CASES (default: those of u1, z2, s1 in CASES) picks its arrays.
set -euo pipefail
gib=${1:-8}
prep=${2:-3}
cases=${CASES:-u1,z1,z2,s1,b1,b2}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
rm -f "$out/bench.jsonl"
tiles=${TILES:-48}
if [ -n "${TILE_CASES+set}" ]; then
  tile_cases=$TILE_CASES
else
  tile_cases=
  for c in ${cases//,/ }; do case $c in u1|z2|s1) tile_cases+="${tile_cases:+,}$c" ;; esac; done
fi
"${bench[@]}" --dir "$dir" --gib "$gib" --repeat 5 --cases "$cases" --tiles 0 --json "$out/bench.jsonl"
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
    b1|b2)
      # zarr-python's host decode (c-blosc through numcodecs) on the whole array.
      peers "$case" --peers zarr-host --repeat 1 ;;
    s1)
      # tensorstore (host read, then one copy) runs where its wheel is in .gpu/wheels (stage
      # --peers does not fetch it: put tensorstore and ml_dtypes cp312 wheels there by hand).
      peers s1 --peers zarr-host,tensorstore --repeat 1
      peers s1 --subset 0:64 --peers zarr-host,zarr-gpu,tensorstore --repeat 1
      peers s1 --subset 0:64 --peers zarr-gpu-nvcomp --batch-size 256 --repeat 1 ;;
    s1g)
      # gzip members without crc32c decode on host threads by default; trusted, on nvCOMP.
      ZARRS_GPU_DECODE_TRUST=trusted "${bench[@]}" --dir "$dir" --gib "$gib" --repeat 5 --cases s1g --tiles 0 \
        --json "$out/bench.jsonl"
      peers s1g --subset 0:64 --peers zarr-host,zarr-gpu,tensorstore --repeat 1 ;;
  esac
done
if [ "$tiles" -gt 0 ] && [ -n "$tile_cases" ]; then
  # Tiles: ours from Rust (with the host-thread bound), then the Python peers on the same tiles
  # and the tile loop with a compute step.
  "${bench[@]}" --dir "$dir" --gib "$gib" --cases "$tile_cases" --tiles "$tiles" --tiles-only --json "$out/bench.jsonl"
  for case in ${tile_cases//,/ }; do
    python3 benches/tiles.py --array "$dir/$case.zarr" --tiles "$tiles" --json "$out/bench.jsonl"
  done
fi
python3 - "$out/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# Tile rows (median_ms) add their median and p90 latency, the host-thread bound or the loop's figures.
print(f"{'who':<34} {'case':<52} {'GiB':>7} {'s':>8} {'GiB/s':>8} {'ms (p90)':>16}  notes")
for r in rows:
    case = str(r.get('case', r.get('subset', '')))[:52]
    if "gib_s" not in r:
        print(f"{r['peer']:<34} {case:<52} {r.get('error') or r.get('skipped')}")
        continue
    gib_s = f"{r['gib_s']:8.2f}" if r['gib_s'] is not None else f"{'':>8}"
    ms = f"{r['median_ms']:7.2f} ({r['p90_ms']:6.2f})" if "median_ms" in r else ""
    notes = []
    if "host_bound_ms" in r:
        notes.append(f"host-thread bound {r['host_bound_ms']:.2f} ms (ours {r['host_bound_ratio']:.2f}x it)")
    if r.get("efficiency") is not None:
        notes.append(f"{r['loop_ms']:.2f} ms/tile; read {r['read_ms']:.2f}, compute {r['compute_ms']:.2f}; "
                     f"efficiency {r['efficiency']:.2f}")
    print(f"{r['peer']:<34} {case:<52} {r['bytes']/2**30:7.3f} {r['seconds']:8.4f} {gib_s} {ms:>16}  {'; '.join(notes)}")
PY
