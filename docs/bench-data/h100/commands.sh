#!/usr/bin/env bash
# Issue 25 speed guard: the same forward, backward and decode figures before and
# after the refactor, with flashcl's naive path and PyTorch SDPA in the same call.
source .device-kit/env.sh
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git log --oneline | head -1
s0=$(date +%s); cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /tmp/cmake.log 2>&1 && cmake --build build -j16 >> /tmp/cmake.log 2>&1; echo "build rc=$? $(( $(date +%s)-s0 ))s"; tail -2 /tmp/cmake.log
B=build/tools/flashcl-bench
tag=${1:-x}
{
echo "## fwd f16/bf16 flash+naive"
$B --n 4096,16384 --d 64,128 --dtype f16,bf16 --causal both --algo flash,naive --reps 10 --warmup 3 --no-check --csv
echo "## fwd d=256 f16"
$B --n 4096 --d 256 --dtype f16 --causal both --algo flash --reps 10 --warmup 3 --no-check --csv
echo "## fwd+bwd f16 det 0/1"
$B --n 4096 --d 64,128 --dtype f16 --causal both --algo flash,naive --bwd --deterministic 0 --reps 5 --warmup 2 --no-check --csv
$B --n 4096 --d 64,128 --dtype f16 --causal 0 --algo flash --bwd --deterministic 1 --reps 5 --warmup 2 --no-check --csv
echo "## fwd f32 portable"
$B --n 4096 --d 64,128 --dtype f32 --causal 0 --algo flash,naive --reps 5 --warmup 2 --no-check --csv
echo "## fwd sweep f16 d=64 (runtime and memory against N)"
$B --n 512,1024,2048,4096,8192,16384 --d 64 --dtype f16 --causal 0 --algo flash,naive --reps 10 --warmup 3 --no-check --csv
echo "## decode"
$B --decode --n 4096,32768 --decode-batch 1,8,64 --d 128 --dtype f16 --reps 10 --warmup 3 --csv
} > $OUT/speed_$tag.csv 2> $OUT/speed_$tag.err
echo "bench rc=$?"
timeout 200 python3 tools/sdpa_compare.py --bench $B --n 4096,16384 --d 64,128 --causal 0,1 --backends flash,cudnn > $OUT/sdpa_fwd_$tag.md 2>&1; echo "sdpa fwd rc=$?"
for be in flash cudnn; do timeout 100 python3 tools/sdpa_bench.py --n 4096 --d 64,128 --causal 0 --backend $be --bwd --reps 5; done > $OUT/sdpa_bwd_$tag.txt 2>&1
for be in flash cudnn; do timeout 100 python3 tools/sdpa_bench.py --decode --n 4096,32768 --decode-batch 1,8,64 --d 128 --backend $be; done > $OUT/sdpa_dec_$tag.txt 2>&1
echo done; date -u
