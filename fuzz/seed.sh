#!/usr/bin/env bash
# Seeds the fuzz corpora with valid frames and members (the zstd and gzip command-line tools).
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
