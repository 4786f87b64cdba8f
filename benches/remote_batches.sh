#!/usr/bin/env bash
# Object-store reads in one batch against batches fetched ahead (issue 30), in one run: Z2 served
# by SeaweedFS on loopback, `zarrs-gpu read` of the whole array from S3 in a fresh process each,
# alternating ZARRS_GPU_REMOTE_BATCH_BYTES=0 (one batch: every value fetched, then decoded) and the
# default (256 MiB batches, each fetched while the one before decodes), beside `remote_get`'s
# fetch-only rates (fetch_many, fetch_values in one batch, fetch_value_batches of 256 values).
#   bash benches/remote_batches.sh [GIB] [REPEAT]
# `weed` from $WEED (else PATH); `bench`, `zarrs-gpu` and `remote_get` from PATH, else cargo.
# Into OUT (default /tmp/out): ceiling.jsonl, batches.jsonl (one row per process, with
# "remote_batch_bytes"), batches.log (the reads' stage traces), weed.log.
set -euo pipefail
gib=${1:-1}
repeat=${2:-5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
weed=${WEED:-$(command -v weed)}

step "z2 (written once)"
[ -f "$dir/z2.zarr/zarr.json" ] || "${bench[@]}" --dir "$dir" --gib "$gib" --cases z2 --ours-only --tiles-only --tiles 0 > /dev/null
root=$(mktemp -d /tmp/zarrs-gpu-s3.XXXXXX)
export AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 AWS_ENDPOINT=http://127.0.0.1:8333
export AWS_ACCESS_KEY_ID=zarrs-gpu-bench AWS_SECRET_ACCESS_KEY=zarrs-gpu-bench-secret
"$weed" mini -dir="$root" -ip=127.0.0.1 -ip.bind=127.0.0.1 -bucket=bench -admin.ui=false -s3.port=8333 \
  > "$out/weed.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$root"' EXIT
for _ in $(seq 300); do grep -q "components are running" "$out/weed.log" && break; sleep 0.1; done
url=s3://bench/z2.zarr
step upload
"${get[@]}" put "$dir/z2.zarr" "$url"
step "fetch only"
"${get[@]}" "$url" 64 "$repeat" > "$out/ceiling.jsonl"
step "zarrs-gpu read, one batch and batches fetched ahead, alternating"
rm -f "$out/batches.jsonl" "$out/batches.log"
for r in $(seq "$repeat"); do
  for bytes in 0 $((256 << 20)); do
    ZARRS_GPU_REMOTE_BATCH_BYTES=$bytes ZARRS_GPU_TRACE=1 "${cli[@]}" read "$url" --repeat 3 --json 2>> "$out/batches.log" |
      sed "s/^{/{\"remote_batch_bytes\":$bytes,\"run\":$r,/" >> "$out/batches.jsonl"
  done
done
step done
