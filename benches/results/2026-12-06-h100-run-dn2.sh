#!/usr/bin/env bash
# Run DN2: why the register bit reader moved Z2 by 2% where a third was predicted: our zstd
# kernels alone (decoder-only, the harness: every dumped case equal to the CPU shim's, then
# per-launch timings on Z2-like frames) with this build's entropy.cu and f137216's, one call;
# Needs, beside ../shared/gpu/stage's .gpu: .gpu/zcases.bin.gz (the dumped cases, gzipped),
# .gpu/old/entropy.cu (git show f137216:zarrs_gpu_codecs/src/codecs/zstd/entropy.cu) and
# numcodecs' wheel in .gpu/wheels (pip download --no-deps numcodecs==0.17.1, cp312 manylinux).
set -uo pipefail
root=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
start=$(date +%s)
timeout 75 python3 benches/zstd_decoder.py .gpu/zcases.bin.gz --json $OUT/harness.jsonl > $OUT/harness-new.txt 2>&1
echo "harness new rc=$? $(( $(date +%s) - start ))s" >> $OUT/log.txt
old=/tmp/oldroot; mkdir -p $old/zarrs_gpu_codecs/src/codecs/zstd $old/benches
cp zarrs_gpu_codecs/src/codecs/zstd/*.cu $old/zarrs_gpu_codecs/src/codecs/zstd/ && cp .gpu/old/entropy.cu $old/zarrs_gpu_codecs/src/codecs/zstd/
(cd $old && timeout 65 python3 $root/benches/zstd_decoder.py $root/.gpu/zcases.bin.gz > $OUT/harness-old.txt 2>&1)
echo "harness old rc=$? $(( $(date +%s) - start ))s" >> $OUT/log.txt
tail -25 $OUT/harness-new.txt; echo ===; tail -25 $OUT/harness-old.txt
cat $OUT/log.txt
