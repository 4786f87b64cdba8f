#!/usr/bin/env bash
# Steps of zstd's sequence execution on Z2's chunks (benches/zstd_rounds.c): four 1 MiB chunks of
# the bench's sample data (src/sample.rs, 64x64x64 float32 at four places of its array),
# compressed by libzstd level 3 (zstd-sys' sources in cargo's registry, as the crate builds them).
#   bash benches/zstd_rounds.sh            (needs gcc and python3; run `cargo fetch` first)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
lib=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/zstd-sys-*/zstd/lib | sort | tail -1)
gcc -O2 -w -I"$lib" -I"$lib/common" -o "$work/zstd_rounds" "$root/benches/zstd_rounds.c" \
    "$lib"/common/*.c "$lib"/compress/*.c -lpthread
python3 - "$work" <<'PY'
import math, struct, sys
shape, mask = (1024, 2048, 2048), (1 << 64) - 1
f32 = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]
for k, (z0, y0, x0) in enumerate([(0, 0, 0), (128, 512, 768), (512, 1024, 64), (960, 1920, 1920)]):
    out = bytearray()
    for z in range(z0, z0 + 64):
        for y in range(y0, y0 + 64):
            cy = math.cos(f32(y * f32(0.007)))
            for x in range(x0, x0 + 64):
                smooth = f32(math.sin(f32(x * f32(0.011))) * cy * 1000.0 + z * 0.5)
                h = ((z * shape[1] + y) * shape[2] + x) * 0x9E3779B97F4A7C15 & mask
                h ^= h >> 29
                out += struct.pack("<f", float(math.floor(smooth + 0.5)) + (h & 0xF))
    open(f"{sys.argv[1]}/c{k}.raw", "wb").write(out)
PY
for k in 0 1 2 3; do "$work/zstd_rounds" "$work/c$k.raw" | sed "s|$work/||"; done
