#!/usr/bin/env bash
# Run DS4 (build e4e3657): the host's chain walk timed on the GPU host's CPU (16 threads): its
# parts, rayon's pool after its threads slept, a thread a block; with 1, 4 and 16 threads.
set -uo pipefail
. benches/gpu_run.sh 100
t=$(awk '$1 ~ /^zarrs_gpu_codecs/ {print $1}' /tmp/gpu-bin/bin/tests/dirs | head -1)
for n in 16 4 1; do
  (cd zarrs_gpu_codecs && RAYON_NUM_THREADS=$n timeout 40 /tmp/gpu-bin/bin/tests/$t --ignored --nocapture --test-threads=1 time_the_parts_of_the_hosts_chain_walk time_the_hosts_chain_walk) > /tmp/w$n.log 2>&1
  log "threads $n rc=$?"; grep -E "blocks," /tmp/w$n.log >> $OUT/log.txt
done
nproc >> $OUT/log.txt; lscpu | grep -E "Model name|Thread|Core|Socket|MHz" >> $OUT/log.txt
cat $OUT/log.txt
