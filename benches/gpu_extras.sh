#!/usr/bin/env bash
# What a GPU run's scripts take beside `../shared/gpu/stage`'s build (run after it: stage empties
# .gpu/bin only), into .gpu/ (git-ignored):
#   bash benches/gpu_extras.sh [--kernels C...] [--bench C...] [--zcases]
# --kernels: each commit's zstd kernels as .gpu/src-C (benches/zstd_decoder.py --source);
# --bench: each commit's `bench` example, built in a worktree with this checkout's target
#   directory, as .gpu/bench-C.xz; --zcases: the zstd cases the CPU shim decoded, for the harness's
#   replay (.gpu/zcases.bin.xz). The slim nvCOMP wheel, where one was kept, is not this script's.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
mkdir -p .gpu
mode=
while (($#)); do
  case $1 in
    --kernels | --bench) mode=$1 ;;
    --zcases)
      ZSTD_DUMP=/tmp/zcases.bin cargo test -q -p zarrs_gpu_codecs --lib \
        codecs::zstd::decode::tests::dump_cases_for_the_gpu_harness -- --ignored > /dev/null
      xz -T0 -c /tmp/zcases.bin > .gpu/zcases.bin.xz && rm -f /tmp/zcases.bin ;;
    *)
      c=$(git rev-parse --short "$1")
      case $mode in
        --kernels)
          mkdir -p ".gpu/src-$c"
          for f in entropy decode blocks bytes; do
            git show "$c:zarrs_gpu_codecs/src/codecs/zstd/$f.cu" > ".gpu/src-$c/$f.cu"
          done ;;
        --bench)
          wt=$(mktemp -d); git worktree add -q --detach "$wt" "$c"
          (cd "$wt" && CARGO_TARGET_DIR="$root/target" cargo build -q --release --example bench)
          xz -T0 -c target/release/examples/bench > ".gpu/bench-$c.xz"
          git worktree remove --force "$wt" ;;
        *) echo "gpu_extras: --kernels or --bench before $1" >&2; exit 2 ;;
      esac ;;
  esac
  shift
done
du -sh .gpu
