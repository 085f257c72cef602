#!/usr/bin/env bash
# Runs a selection of the test cases, on small shapes, under Oclgrind's OpenCL
# simulator with its checkers on (docs/reliability.md):
#   --data-races      races between work-items in local and global memory
#   --uninitialized   reads of uninitialised private / local / global memory
#   --check-api       OpenCL API misuse (errors returned by any API call)
# plus its built-in checks of out-of-bounds accesses and of barrier divergence.
# Every portable kernel family runs: forward (f32, f16, bf16; causal, window,
# ALiBi, softcap, bit and block masks, dropout, varlen, paged; GPU and CPU
# work-item mappings; a quantized paged source), backward (both dQ modes), decode (contiguous, paged,
# split-KV, tree mask), kv_cache_append, the state merge and the naive
# algorithm (CLBlast GEMMs). The kernels' compile-time variants that the
# default rules do not pick on Oclgrind's simulated GPU (unrolls, padded rows,
# prefetch off, separate K/V, -cl-denorms-are-zero, the backward's warp-tiled,
# split and read-ahead forms, other decode tilings) run through
# tests/tuning/knobs_a.tune and knobs_b.tune.
# Slow (an interpreter), so it is not in CTest.
#
#   FLASHCL_OCLGRIND_BUILD_DIR  a normal (not sanitized) build, built here if
#                               missing (default: build-oclgrind)
#   FLASHCL_OCLGRIND_JOBS       cases run at once (default: number of CPUs)
#   FLASHCL_OCLGRIND_LOGS       directory of the per-case logs (default: <build>/oclgrind-logs)
# Arguments: case-name patterns (grep -E) to run only some, e.g.
#   bash scripts/oclgrind.sh 'decode|merge'
# Exit status 0 only when every case passes and Oclgrind reported nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"

if ! command -v oclgrind >/dev/null 2>&1; then
  echo "oclgrind.sh: oclgrind not found (Debian: apt-get install oclgrind)" >&2
  exit 2
fi
build_dir="${FLASHCL_OCLGRIND_BUILD_DIR:-build-oclgrind}"
jobs="${FLASHCL_OCLGRIND_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"
if [ ! -x "$build_dir/tests/test_decode" ]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$build_dir" -j "$jobs"
fi
build_dir="$(cd "$build_dir" && pwd)"
logs="${FLASHCL_OCLGRIND_LOGS:-$build_dir/oclgrind-logs}"
rm -rf "$logs"
mkdir -p "$logs"

# -cl-opt-disable: Oclgrind 21.10's --uninitialized stops with "Unsupported
# instruction: freeze" on the optimised kernels; unoptimised ones have none.
# --max-errors: Oclgrind stops reporting after 1000 by default, and CLBlast's
# own reports (counted apart below) must not hide a later one of flashcl's.
all_checks="--data-races --uninitialized --check-api --max-errors 100000 --build-options -cl-opt-disable"
# Oclgrind 21.10 itself crashes (SIGSEGV in Uninitialized::instructionExecuted)
# with --uninitialized on a shufflevector whose mask has undef elements (its
# shadow code tests them against Value::UndefValueVal instead of -1 and reads
# far out of bounds). Clang emits those at -O0 for a vector built from smaller
# vectors, e.g. (float8)(a4, b4): the kernels build such vectors element by
# element instead (decode.cl's Q load, kv_quant.cl's kvq_load4).
no_uninit="--data-races --check-api --max-errors 100000 --build-options -cl-opt-disable"
# Oclgrind 21.10 gives a new buffer a released one's index, and its
# --uninitialized plugin keeps the released buffer's shadow memory (it has no
# hook for releases): a kernel's writes past the old size are dropped and later
# reads of them are reported as uninitialized (finding 3 of
# docs/reliability.md: the append case's decode workspace took the index of
# its test's released k_new, 24576 bytes, so decode_merge's reads of the split
# LSEs at 786432 bytes and on were all reported; CLBlast's temporary buffers
# likewise, finding 2). Every case runs with scripts/oclgrind_keep_buffers.c
# preloaded, in front of Oclgrind's own runtime (which defines
# clReleaseMemObject too, and which `oclgrind` puts first in LD_PRELOAD): no
# buffer is ever released, so no index is reused.
keep_so="$logs/oclgrind_keep_buffers.so"
cc -shared -fPIC -O2 -o "$keep_so" "$repo/scripts/oclgrind_keep_buffers.c"

# name | executable | FLASHCL_TEST_FILTER | extra environment | checks
cases=(
  "fwd_f32_N7|test_forward|f32_d64_N7||all"
  "fwd_f32_d8_N40|test_forward|f32_d8_N40||all"
  "fwd_f32_padded_Nq33_Nk45|test_forward|f32_d64_padded_strides_offsets||all"
  "fwd_f16_padded_Nq33_Nk45|test_forward|f16_d64_padded||all"
  "fwd_bf16_padded_causal|test_forward|bf16_d64_padded_causal||all"
  "fwd_bf16_d256_causal|test_forward|bf16_d256_Nq33_Nk20_causal||all"
  "fwd_f32_blocks_8x8_d32|test_forward|f32_d32_blocks_8x8_Nq9||all"
  "fwd_varlen_empty_seqs|test_forward|f32_d64_varlen_empty_sequences||all"
  "fwd_cpu_map_padded_causal|test_forward|f32_d64_padded_strides_causal|FLASHCL_TUNING=$repo/tests/tuning/cpu_map.tune|all"
  "fwd_cpu_map_varlen_empty|test_forward|f32_d64_varlen_empty_sequences|FLASHCL_TUNING=$repo/tests/tuning/cpu_map.tune|all"
  "fwd_sep_kv_padded|test_forward|f32_d64_padded_strides_offsets|FLASHCL_TUNING=$repo/tests/tuning/gpu_map_sep_kv.tune|all"
  "fwd_knobs_a_padded|test_forward|f32_d64_padded_strides_offsets|FLASHCL_TUNING=$repo/tests/tuning/knobs_a.tune|all"
  "fwd_knobs_b_f16_padded|test_forward|f16_d64_padded|FLASHCL_TUNING=$repo/tests/tuning/knobs_b.tune|all"
  "mask_window_empty_rows|test_masks|window_empty_rows||all"
  "mask_window_right_f16|test_masks|window_right||all"
  "mask_alibi_causal_gqa|test_masks|alibi_causal_gqa||all"
  "mask_softcap_causal_f16|test_masks|softcap_causal||all"
  "mask_all_varlen_dropout|test_masks|all_varlen_dropout_gpu_map||all"
  "sparse_tree_bits|test_sparse|tree_decode_gqa||all"
  "sparse_block_strided_f16|test_sparse|block_strided_gpu_map_f16||all"
  "paged_prefill_f32_nq7|test_paged_prefill|paged_flash_f32_ps16_nq7||all"
  "paged_prefill_naive_f32_nq7|test_paged_prefill|paged_naive_f32_ps64_nq7||all"
  "paged_quant_f32_i8_e4m3|test_paged_prefill|paged_quant_f32_k_i8_token_v_e4m3_block32||all"
  "paged_quant_cpu_map_f16_e5m2_i8|test_paged_prefill|paged_quant_f16_k_e5m2_head_v_i8_tensor|FLASHCL_TUNING=$repo/tests/tuning/cpu_map.tune|all"
  "paged_quant_naive_f32_e4m3_e5m2|test_paged_prefill|paged_quant_naive_f32_k_e4m3_block32_v_e5m2_head||all"
  "bwd_f32_padded_causal_gqa_det01|test_backward|f32_d64_padded_gqa_4_2_causal||all"
  "bwd_f32_dropout_det1|test_backward|f32_d64_dropout_offset_carry||all"
  "bwd_f16_causal_det01_naive|test_backward|f16_d64_scale_5_large_scores_causal||all"
  "bwd_dropout_mask_philox|test_backward|dropout_mask_matches_c_philox||all"
  "bwd_knobs_a_padded_causal_gqa|test_backward|f32_d64_padded_gqa_4_2_causal|FLASHCL_TUNING=$repo/tests/tuning/knobs_a.tune|all"
  "bwd_knobs_b_padded_causal_gqa|test_backward|f32_d64_padded_gqa_4_2_causal|FLASHCL_TUNING=$repo/tests/tuning/knobs_b.tune|all"
  "naive_f32_padded|test_naive|f32_d64_padded||all"
  "decode_contig_f32_split7|test_decode|contig_q4_f32_split7_padded||all"
  "decode_paged16_f16_split4|test_decode|paged16_q4_f16_split4||all"
  "decode_tree9_f32|test_decode|tree9_contig_f32_unsplit||all"
  "kv_append_paged16_f16|test_decode|append_paged16_q4_f16||all"
  "decode_knobs_a_contig_f32_split7|test_decode|contig_q4_f32_split7_padded|FLASHCL_TUNING=$repo/tests/tuning/knobs_a.tune|all"
  "decode_knobs_b_paged16_f16|test_decode|paged16_q4_f16_split4|FLASHCL_TUNING=$repo/tests/tuning/knobs_b.tune|all"
  "merge_f32|test_decode|merge_assoc_f32||all"
)

selected=()
for c in "${cases[@]}"; do
  name="${c%%|*}"
  if [ "$#" -eq 0 ]; then selected+=("$c"); continue; fi
  for pat in "$@"; do
    if printf '%s\n' "$name" | grep -Eq -- "$pat"; then selected+=("$c"); break; fi
  done
done

run_case() {
  IFS='|' read -r name exe filter extra checks <<<"$1"
  local log="$logs/$name.log" flags="$all_checks" start end rc pre=()
  [ "$checks" = "no_uninit" ] && flags="$no_uninit"
  if [ ! -f "$keep_so" ]; then
    echo "oclgrind.sh: $name: the keep-buffers shim ($keep_so) is missing" >&2
    return 1
  fi
  # shellcheck disable=SC2016 # expanded by the inner shell, after Oclgrind set LD_PRELOAD
  pre=(sh -c 'LD_PRELOAD="$0${LD_PRELOAD:+:$LD_PRELOAD}" exec "$@"' "$keep_so")
  start=$(date +%s)
  set +e
  # A private program cache: flashcl's cache key does not include Oclgrind's
  # build options, and a cached binary would skip -cl-opt-disable. Verbose: the
  # log names every program built and its options (the variants covered).
  # shellcheck disable=SC2086 # flags is a list of words on purpose
  env FLASHCL_CACHE_DIR="$logs/cache-$name" FLASHCL_TEST_FILTER="$filter" FLASHCL_TEST_SEED=1 FLASHCL_TEST_VERBOSE=1 $extra \
    timeout 1800 oclgrind $flags "${pre[@]}" "$build_dir/tests/$exe" >"$log" 2>&1
  rc=$?
  set -e
  end=$(date +%s)
  local diags clblast ran
  # One report per block of lines. "Uninitialized" reports inside CLBlast's
  # direct GEMM kernels (and the naive path's kernels that copy their results
  # on) are also shown apart as clblast-uninit: before the keep-buffers shim,
  # Oclgrind's stale shadow memory gave them there (finding 2 of
  # docs/reliability.md, the same cause as finding 3). They fail a case like
  # any other report.
  read -r diags clblast < <(awk '
    function flush() {
      if (hdr) {
        if (hdr ~ /^(Uninitiali|Controlflow)/ && clb) c++
        else if (hdr ~ /^(Uninitiali|Controlflow)/ && naive) p++
        else d++
      }
      hdr = ""; clb = naive = 0
    }
    /^(Invalid (read|write)|.*data race|Uninitiali[sz]ed|Controlflow depends|OCLGRIND FATAL|Oclgrind - |Work-group divergence|Barrier divergence)/ {
      flush(); hdr = $0; next }
    /^[^ \t]/ { flush(); next }
    /Kernel: XgemmDirect/ { clb = 1 }
    /Kernel: naive_/ { naive = 1 }
    END { flush(); if (c) c += p; else d += p; printf "%d %d\n", d, c }' "$log")
  ran=$(grep -c '^\[       OK \]' "$log" || true)
  local verdict=ok
  if [ "$rc" -ne 0 ] || [ "$diags" -ne 0 ] || [ "$clblast" -ne 0 ] || [ "$ran" -eq 0 ]; then verdict=FAIL; fi
  printf '%-34s %-5s rc=%-3s reports=%-4s clblast-uninit=%-4s tests-ok=%-2s %4ss  %s\n' "$name" \
    "$verdict" "$rc" "$diags" "$clblast" "$ran" \
    "$((end - start))" "$( [ "$checks" = no_uninit ] && echo '(without --uninitialized)')"
}
export -f run_case
# keep_so too: run_case runs in a child bash (xargs), where an unexported
# keep_so would be empty and the shim silently not loaded.
export logs build_dir all_checks no_uninit keep_so

echo "oclgrind.sh: ${#selected[@]} case(s), $jobs at a time, logs in $logs"
t0=$(date +%s)
printf '%s\n' "${selected[@]}" | xargs -d '\n' -P "$jobs" -I{} bash -c 'run_case "$1"' _ {} | tee "$logs/summary.txt"
t1=$(date +%s)
echo "oclgrind.sh: $((t1 - t0)) s in all"
if grep -q ' FAIL ' "$logs/summary.txt"; then
  echo "oclgrind.sh: failures (see the logs above):" >&2
  grep ' FAIL ' "$logs/summary.txt" >&2
  exit 1
fi
