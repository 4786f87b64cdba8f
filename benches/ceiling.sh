#!/usr/bin/env bash
# The disk's own rates, for the write and cold-read figures to be measured against (run in the
# same call as the benchmark they bound):
#
#   bash benches/ceiling.sh DIR [GIB]
#
# writes GIB (default 8) of incompressible data into DIR as files of 16 MiB and of 1 MiB, by 1, 8
# and 16 writers at once, each file flushed on its own (fsync, as GdsStore's Durability::Sync
# does) and, separately, written then flushed by one `sync` (as NoSync and a final sync do); then
# reads the 16 MiB files back by 8, 32 and 128 parallel `cat`s, from a cold page cache where the
# caches can be dropped (root), else says the cache was warm. One JSON line per row on stdout.
# DIR is emptied first and removed after.
set -euo pipefail
dir=${1:?usage: ceiling.sh DIR [GIB]}
gib=${2:-8}
rm -rf "$dir" && mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
src="$dir/random.bin"
# One 64 MiB block of random bytes, copied: incompressible, and cheap to make.
head -c $((64 << 20)) /dev/urandom > "$src"

now() { date +%s.%N; }
row() { # what writers file_mib seconds bytes
  python3 -c "import json,sys; w,n,f,s,b=sys.argv[1:]; print(json.dumps({'peer':'disk','case':w,'writers':int(n),'file_mib':int(f),'seconds':float(s),'gib_s':int(b)/2**30/float(s)}))" "$@"
}

# write_files N FILE_MIB FLUSH: N writers, GIB in files of FILE_MIB, each fsynced when FLUSH=each.
write_files() {
  local n=$1 mib=$2 flush=$3 files=$(( (gib << 10) / $2 ))
  rm -rf "$dir/w" && mkdir -p "$dir/w" && sync
  local start; start=$(now)
  local conv=notrunc
  [ "$flush" = each ] && conv=fsync
  seq 0 $((files - 1)) | xargs -P "$n" -I{} dd if="$src" of="$dir/w/{}" bs=1M count="$mib" conv="$conv" status=none
  [ "$flush" = end ] && sync
  row "write, flush $flush" "$n" "$mib" "$(python3 -c "print($(now) - $start)")" $((files * mib << 20))
}

for mib in 16 1; do
  for n in 1 8 16; do
    write_files "$n" "$mib" each
    write_files "$n" "$mib" end
  done
done

# Cold reads of the last 16 MiB files.
write_files 16 16 end > /dev/null
for n in 8 32 128; do
  cold=warm
  if [ -w /proc/sys/vm/drop_caches ]; then sync; echo 3 > /proc/sys/vm/drop_caches; cold=cold; fi
  start=$(now)
  find "$dir/w" -type f -print0 | xargs -0 -P "$n" -n 8 cat > /dev/null
  row "read ($cold page cache), parallel cat" "$n" 16 "$(python3 -c "print($(now) - $start)")" $((gib << 30))
done
