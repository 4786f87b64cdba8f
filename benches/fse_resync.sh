#!/usr/bin/env bash
# Whether zstd's sequence bitstreams resynchronise (benches/fse_resync.cpp): Z2-like chunks (a
# float32 random walk, 1 MiB, `zstd -3`), each block's sequences started 40 times at a wrong place.
#   bash benches/fse_resync.sh            (needs g++, python3 and the zstd command line)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
src=$root/zarrs_gpu_codecs/src/codecs
mkdir "$work/zstd" && cp "$src"/zstd/{entropy.cu,decode.cu,blocks.cu,bytes.cu,host_shim.cpp} "$work/zstd/" && cp "$src"/host_shim.h "$work"/
# The hook: each compressed block's tables, once built, handed to exp_block.
python3 - "$work/zstd/blocks.cu" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
anchor = "    if (ZS_LANE == 0) {\n        status = ZS_OK;\n        ZsBits b;"
assert s.count(anchor) == 1, "blocks.cu changed: move the hook"
s = s.replace(anchor, "    exp_block(ll_t, ml_t, of_t, ll_log, of_log, ml_log, in + p->stream_at, p->in_at + len - p->stream_at, count);\n" + anchor)
open(p, "w").write("void exp_block(const zs_u64*, const zs_u64*, const zs_u32*, zs_u32, zs_u32, zs_u32, const zs_u8*, zs_u64, zs_u64);\n" + s)
PY
g++ -O2 -w -I"$work" -o "$work/fse_resync" "$root/benches/fse_resync.cpp"
python3 - "$work" <<'PY'
import random, struct, sys
random.seed(5)
for k in range(4):
    v, out = 0, bytearray()
    for i in range(262144):
        v += random.randint(-3, 3)
        out += struct.pack("<f", v * 0.25 + k)
    open(f"{sys.argv[1]}/c{k}.raw", "wb").write(out)
PY
for k in 0 1 2 3; do
  zstd -q -3 --no-check "$work/c$k.raw" -o "$work/c$k.zst"
  echo "anywhere:      $("$work/fse_resync" "$work/c$k.zst" 0 | sed "s|$work/||")"
  echo "a state wrong: $("$work/fse_resync" "$work/c$k.zst" 1 | sed "s|$work/||")"
done
