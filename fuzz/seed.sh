#!/usr/bin/env bash
# Seeds the fuzz corpora with valid frames, members and chunks (the zstd, gzip and lz4 tools,
# python3's zlib, numcodecs' Blosc).
# Each input starts with the bytes the targets read first: zstd_frame a mode byte (0: the rest is
# the chunk) and the chunk's size / 97; gzip_member the chunk's size / 13.
set -eu
cd "$(dirname "${BASH_SOURCE[0]}")"
mkdir -p corpus/zstd_frame corpus/gzip_member
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for k in 1 3 17 60 200; do
  for kind in text random zeros; do
    case $kind in
      text) yes "zarr chunk $k of floats 0.25 0.5" | head -c $((k * 97)) > "$tmp/z" ;;
      random) head -c $((k * 97)) /dev/urandom | od -An -tx1 | head -c $((k * 97)) > "$tmp/z" ;;
      zeros) head -c $((k * 97)) /dev/zero > "$tmp/z" ;;
    esac
    for level in 1 3 19 --fast=3; do
      [[ $level == --* ]] && opt=$level || opt=-$level
      { printf "\\x00\\x$(printf %02x "$k")"; zstd -q -c --no-check "$opt" "$tmp/z"; } > "corpus/zstd_frame/$kind-$k-$level"
    done
    head -c $((k * 13)) "$tmp/z" > "$tmp/g"
    { printf "\\x$(printf %02x "$k")"; gzip -n -c "$tmp/g"; } > "corpus/gzip_member/$kind-$k"
  done
done
# zlib_stream: the chunk's size / 13, then a zlib stream (python3's zlib, every level).
mkdir -p corpus/zlib_stream
python3 - <<'PY'
import zlib
for k in (1, 3, 17, 60, 200):
    for kind, raw in (("text", (b"zarr chunk %d of floats 0.25 0.5 " % k) * 40), ("zeros", bytes(k * 13))):
        raw = raw[: k * 13]
        for level in (0, 1, 6, 9):
            open(f"corpus/zlib_stream/{kind}-{k}-{level}", "wb").write(bytes([k]) + zlib.compress(raw, level))
PY
# subset: the dimensionality, a byte per dimension picking its extent (5 or 6 mod 8: the byte / 8;
# 7: the next 8 bytes), then the text. shard_index: a mode byte (even: an entry of four u64; odd:
# shapes), then its numbers.
mkdir -p corpus/subset corpus/shard_index
printf '\x03\xfd\x07\x00\x08\x00\x00\x00\x00\x00\x00\x02%s' '0:16, :,100:' > corpus/subset/slices
printf '\x02\x04\x07\x00\x10\x00\x00\x00\x00\x00\x00%s' '18446744073709551614,3:' > corpus/subset/edges
printf '\x01\x0d%s' '7' > corpus/subset/index
printf '\x06\x04\x00\x00\x00\x00\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00\x00\x0a\x00\x00\x00\x00\x00\x00\x00\x64\x00\x00\x00\x00\x00\x00\x00' > corpus/shard_index/entry
printf '\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' > corpus/shard_index/missing
printf '\x05\x04\x08\x08\x10' > corpus/shard_index/shapes
# lz4_block: the expected length (u16 LE), then one raw LZ4 block, cut out of a one-block lz4
# frame (7 header bytes, a 4-byte block size, the block). blosc_header: a mode byte (3: the
# expected size is the header's, the stored size the chunk's), a size byte, then a Blosc1 chunk:
# one LZ4 block as its one stream, or the bytes memcpyed.
mkdir -p corpus/lz4_block corpus/blosc_header
for k in 1 3 17 60 200; do
  for kind in text zeros; do
    case $kind in
      text) yes "zarr chunk $k of floats 0.25 0.5" | head -c $((k * 97)) > "$tmp/l" ;;
      zeros) head -c $((k * 97)) /dev/zero > "$tmp/l" ;;
    esac
    lz4 -q -c -B4 --no-frame-crc "$tmp/l" > "$tmp/l.lz4"
    python3 - "$tmp/l" "$tmp/l.lz4" "corpus/lz4_block/$kind-$k" "corpus/blosc_header/$kind-$k" <<'PY'
import struct, sys
raw, frame = open(sys.argv[1], 'rb').read(), open(sys.argv[2], 'rb').read()
size, = struct.unpack_from('<I', frame, 7)
if size & 0x80000000:
    sys.exit(0)  # stored uncompressed: no LZ4 block to seed
block = frame[11:11 + size]
open(sys.argv[3], 'wb').write(struct.pack('<H', len(raw)) + block)
n = len(raw)
chunk = bytes([2, 1, 1 << 5 | 0x10, 1]) + struct.pack('<IIII', n, n, 24 + len(block), 20) + struct.pack('<I', len(block)) + block
copied = bytes([2, 1, 0x02, 1]) + struct.pack('<III', n, n, 16 + n) + raw
open(sys.argv[4], 'wb').write(bytes([3, 0]) + chunk)
open(sys.argv[4] + '-memcpyed', 'wb').write(bytes([3, 0]) + copied)
PY
  done
done
# lz4_decode reads what lz4_block reads.
mkdir -p corpus/lz4_decode
cp corpus/lz4_block/* corpus/lz4_decode/
# blosc_header, more: real Blosc1 chunks from numcodecs' Blosc (c-blosc 1.21) with zstd, zlib,
# lz4hc and lz4 streams, no, byte and bit shuffle, typesizes 1, 2, 4 and 8, and split or unsplit
# blocks (c-blosc reads BLOSC_SPLITMODE on each threaded compression). Unsplit blocks are the
# blocksize asked for (256 or 1024 bytes: a chunk of a few KB has several, the last one short);
# c-blosc makes a split block (`typesize` streams) at least 64 KiB, so split chunks of
# compressible data decode to 305,000 bytes (five blocks, the last one short), and the others to
# 61 * k bytes (the size byte k gives the expected size whatever the mode; a split chunk that
# small is one block and, where the typesize leaves a remainder, a last block of just that
# remainder). Modes rotate through 3, 1 and 0 (1 and 3 only
# where the size byte cannot say the size). Chunks over 19998 bytes are left out (run with
# -max_len=20000). c-blosc compresses with numcodecs' default threads, which store blocks in the
# order they finish, so some chunks have blocks out of order and differ from run to run (both
# as zarr writes them). Needs a python with numcodecs (NUMCODECS_PYTHON, else
# target/interop-venv/bin/python, else python3); skipped without one.
py=${NUMCODECS_PYTHON:-}
[[ -z $py && -x ../target/interop-venv/bin/python ]] && py=$PWD/../target/interop-venv/bin/python
py=${py:-python3}
rm -f corpus/blosc_header/nc-*
if ! "$py" -c 'import numcodecs' 2>/dev/null; then
  echo "seed.sh: no numcodecs in $py: blosc_header gets no zstd, zlib or lz4hc chunks" >&2
else "$py" - <<'PY'
import itertools, os, struct
import numpy as np
from numcodecs import Blosc, blosc

blosc.use_threads = True  # c-blosc's global path, which reads BLOSC_SPLITMODE
rng = np.random.default_rng(61)


def data(kind, n, ts):
    if kind == "ramp":
        return (np.arange(n // ts + 1, dtype=f"<u{ts}") * 3).tobytes()[:n]
    if kind == "floats":
        dtype = {1: "<u1", 2: "<f2", 4: "<f4", 8: "<f8"}[ts]
        return (np.round(np.sin(np.arange(n // ts + 1) / 50) * 64) / (1 if ts == 1 else 64)).astype(dtype).tobytes()[:n]
    if kind == "noisy":  # random low bytes: some streams stored as they are
        return rng.integers(0, 256, n // ts + 1).astype(f"<u{ts}").tobytes()[:n]
    return (b"zarr chunk of floats 0.25 0.5 " * (n // 30 + 1))[:n]


cases = itertools.product(("zstd", "zlib", "lz4hc", "lz4"), (0, 1, 2), (1, 2, 4, 8), ("ALWAYS", "NEVER"))
kinds = ("ramp", "floats", "noisy", "text")
written = 0
for i, (cname, shuffle, ts, split) in enumerate(cases):
    kind, k, mode = kinds[(i // 2 + i // 8) % 4], (50, 130, 250, 21)[i // 8 % 4], (3, 1, 0)[i % 3]
    clevel, blocksize = (1, 5, 9)[i // 3 % 3], (256, 1024)[i // 5 % 2]
    n = 61 * k
    if split == "ALWAYS" and kind != "noisy":
        n, mode = 305000, mode | 1
    os.environ["BLOSC_SPLITMODE"] = split
    codec = Blosc(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize, typesize=ts)
    raw = data(kind, n, ts)
    chunk = codec.encode(raw)
    assert bytes(codec.decode(chunk)) == raw
    assert struct.unpack("<II", chunk[4:8] + chunk[12:16]) == (len(raw), len(chunk))
    if len(chunk) + 2 > 20000:
        continue
    shuf = ("noshuffle", "shuffle", "bitshuffle")[shuffle]
    name = f"corpus/blosc_header/nc-{cname}-{shuf}-t{ts}-{split.lower()}-{kind}-{n}"
    open(name, "wb").write(bytes([mode, n // 61 % 256]) + chunk)
    written += 1
print(f"seed.sh: {written} numcodecs Blosc chunks in corpus/blosc_header")
PY
fi
# redact_url: a form byte, then user, password and the rest split by 0xFF bytes.
mkdir -p corpus/redact_url
printf '\x00alice\xffhun?ter2\xffhost/x' > corpus/redact_url/query-in-password
printf '\x00alice\xff12/cd#ef@gh\xffbucket/k@v?q=1' > corpus/redact_url/slash-and-at
printf '\x05\xffp@ss:w0rd\xff[::1]:9000/x' > corpus/redact_url/no-slashes
