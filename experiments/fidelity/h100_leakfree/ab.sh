P=$PWD/experiments/fidelity/h100_leakfree/profile.csv.gz
for tag in a1 b a2; do
  if [ $tag = b ]; then PR=null; else PR=$P; fi
  OUT=$OUT/$tag MODEL=qwen3-0.6b WORKLOADS=prefill_heavy LOADS=0.8 NUM_REQUESTS=80 WHEELS=.hyd PROFILE=$PR bash experiments/fidelity/run_gpu.sh > $OUT/$tag.log 2>&1
  cp $OUT/$tag/qwen3-0.6b/prefill_heavy/heldout.csv $OUT/heldout_$tag.csv; rm -rf $OUT/$tag
  grep -E "prefill_heavy +0.8 +(ttft|tpot)_p[59]0_s .*profiled" $OUT/heldout_$tag.csv | head; grep "profiled" $OUT/heldout_$tag.csv | grep "0.8,ttft_p50\|0.8,tpot_p50" 
done
