# What a GPU host run's script shares (sourced from the checkout's root there, after `bash
# .gpu/run`): a time budget, the bench's size rows, the staged tests filtered, the rows'
# summary. Everything goes to $OUT/log.txt (a call brings back 8 files at most).
#   . benches/gpu_run.sh 300   # seconds the script may take
start=$(date +%s)
budget=${1:-500}
el() { echo $(( $(date +%s) - start ))s; }
left() { echo $(( budget - ($(date +%s) - start) )); }
log() { echo "$*" >> "$OUT/log.txt"; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/log.txt"

# rows LABEL BENCH CASE [VAR=VALUE...]: the size rows and the whole read of CASE by the bench
# program BENCH (this build's `bench`, or another build's), labelled, into $OUT/rows.jsonl.
rows() {
  local label=$1 bin=$2 case=$3; shift 3
  [ "$(left)" -lt 40 ] && { log "rows $label $case: not run (time)"; return; }
  env "$@" timeout 80 "$bin" --dir /tmp/b --gib 1 --cases "$case" --sizes 1,16,64,288,1024 --size-reads 7 \
    --ours-only --tiles 0 --repeat 3 --label "$label" --json "$OUT/rows.jsonl" > /tmp/rows.log 2>&1 ||
    { log "bench $label $case rc=$?"; tail -5 /tmp/rows.log >> "$OUT/log.txt"; }
  log "$label $case done $(el)"
}

# tiles LABEL BENCH CASES: random tiles and crop batches of CASES by the bench program BENCH,
# labelled, into $OUT/tiles.jsonl.
tiles() {
  local label=$1 bin=$2 cases=$3
  [ "$(left)" -lt 40 ] && { log "tiles $label: not run (time)"; return; }
  timeout 60 "$bin" --dir /tmp/b --gib 1 --cases "$cases" --ours-only --tiles-only --tiles 9 --repeat 2 --batch 32 \
    --label "$label" --json "$OUT/tiles.jsonl" > /tmp/t.log 2>&1 ||
    { log "tiles $label rc=$?"; tail -5 /tmp/t.log >> "$OUT/log.txt"; }
  log "tiles $label done $(el)"
}

# staged_tests DEVICE_FILTER CODECS_FILTER: the device tests and the codec crate's (GPU ones
# included) whose names hold a filter's words, while time is left; names into $OUT/tests.txt.
staged_tests() {
  local root=$PWD name pkg l filt
  while read -r name pkg; do
    case $name in device*) filt=$1;; zarrs_gpu_codecs*) filt=$2;; *) continue;; esac
    l=$(left); [ "$l" -lt 30 ] && { log "$name: not run (time)"; continue; }
    # shellcheck disable=SC2086 # the filter's words are separate filters
    (cd "$root/$pkg" && timeout $((l - 20)) /tmp/gpu-bin/bin/tests/$name --include-ignored --test-threads=1 \
      --skip remote:: --skip dump_cases $filt) > "/tmp/$name.log" 2>&1
    log "$name rc=$? $(grep -E '^test result' "/tmp/$name.log" | tail -1) $(el)"
    grep -E "^test .* FAILED|^---- |panicked" "/tmp/$name.log" | head -20 >> "$OUT/log.txt"
    grep -E "^test " "/tmp/$name.log" | sed 's/^test //' >> "$OUT/tests.txt"
  done < /tmp/gpu-bin/bin/tests/dirs
}

# summary: a line a row of $OUT/rows.jsonl and $OUT/tiles.jsonl (median, p90, GiB/s, the route).
summary() {
  python3 - >> "$OUT/log.txt" <<'PY'
import json, os
for f in ("rows.jsonl", "tiles.jsonl"):
    p = os.path.join(os.environ["OUT"], f)
    for line in open(p) if os.path.exists(p) else []:
        r = json.loads(line)
        runs = sorted(r.get("runs") or [r.get("seconds", 0)])
        med, p90 = runs[len(runs) // 2] * 1e3, runs[min(len(runs) - 1, int(0.9 * len(runs)))] * 1e3
        print(f'{r["peer"][:28]:28} {r["case"][:60]:60} med {med:7.2f} p90 {p90:7.2f} '
              f'{r.get("gib_s", 0):6.2f} GiB/s | {r.get("io", "")[-60:]}')
PY
}
