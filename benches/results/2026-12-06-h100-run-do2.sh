#!/usr/bin/env bash
# Run DO2: HEAD (e8a4979) on the device: where our LZ4 kernel's time goes (e98499b's one-token
# walk, variants with copies taken out or pointers restrict-qualified, and a491712's batches, on
# B1's streams); then the device tests DO1 failed (reads of raw bits and UTF-32; DLPack's refusal
# message) with their modules.
set -uo pipefail
root=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
start=$(date +%s)
el() { echo $(( $(date +%s) - start ))s; }
timeout 120 python3 .gpu/lz4abl2.py .gpu/lz4b1.bin .gpu/old/lz4_batches.cu > $OUT/lz4abl.txt 2>&1; echo "lz4 ablations rc=$? $(el)" >> $OUT/log.txt; cat $OUT/lz4abl.txt >> $OUT/log.txt
dev=$(awk '$1 ~ /^device/ {print $1}' /tmp/gpu-bin/bin/tests/dirs | head -1)
timeout 200 /tmp/gpu-bin/bin/tests/$dev --include-ignored --test-threads=1 dlpack:: retrieval:: > /tmp/dev.log 2>&1
echo "$dev rc=$? $(grep -E '^test result' /tmp/dev.log | tail -1) $(el)" >> $OUT/log.txt
grep -E "^test .* FAILED|^---- |panicked" /tmp/dev.log | head -30 >> $OUT/log.txt
grep -E "^test " /tmp/dev.log | sed 's/^test //' > $OUT/tests.txt
cp /tmp/dev.log $OUT/tests.log
# The Python package's core GPU tests (zarr-python 3.4.2, the newest the hooks support) with the
# wheel CI built from this tree.
python3 -c "import zarr, zarrs_gpu, zarrs_gpu._zarr_hooks as h; print('zarr', zarr.__version__, 'hooks supported', h.supported(zarr.__version__))" >> $OUT/log.txt 2>&1
(cd python/tests && timeout 170 python3 -m unittest -v test_gpu.GpuTests) > $OUT/python.log 2>&1
echo "python GpuTests rc=$? $(el)" >> $OUT/log.txt
grep -E "^Ran |^OK|^FAILED|Error|error" $OUT/python.log | head -20 >> $OUT/log.txt
cat $OUT/log.txt
