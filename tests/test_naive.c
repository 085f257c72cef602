/*
 * The naive algorithm (CLBlast GEMMs + softmax): each case runs with
 * desc.algorithm.algo = FLASHCL_ALGO_FLASH and FLASHCL_ALGO_NAIVE, checks both against the
 * double reference and the two against each other.
 *
 * A separate executable because CLBlast's first GEMM compiles its kernels, which is
 * slow on PoCL with a cold kernel cache; `ctest -j2` then overlaps it with
 * test_forward.
 */
#include "common.h"

#include <string.h>

#define VS FCT_FLASH_VS_NAIVE
#define F32 FLASHCL_F32
#define F16 FLASHCL_F16
#define BF16 FLASHCL_BF16

static const int VL_Q[] = {1, 300, 77};
static const int VL_K_DIFF[] = {5, 120, 300};
static const int VL_Q_EMPTY[] = {3, 0, 5, 2};
static const int VL_K_EMPTY[] = {0, 4, 6, 9};

/* fct_case fields in order: dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv,
 * head_dim, causal, scale, layout, no_lse, kv_batch_stride0, num_seqs, seqlens_q,
 * seqlens_k. */
static const fct_table_entry TESTS[] = {
    {"f32_d64", VS, {F32, 2, 129, 129, 2, 2, 64, 0, 0, FCT_BNHD}},
    {"f32_d64_N1_causal", VS, {F32, 2, 1, 1, 2, 2, 64, 1, 0, FCT_BNHD}},
    {"f32_d64_causal_Nq129_Nk7_empty_rows", VS, {F32, 1, 129, 7, 2, 2, 64, 1, 0, FCT_BNHD}},
    {"f32_d64_causal_Nq7_Nk129_gqa_4_2", VS, {F32, 1, 7, 129, 4, 2, 64, 1, 0, FCT_BNHD}},
    {"f32_d64_gqa_8_1_no_lse", VS, {F32, 1, 40, 50, 8, 1, 64, 0, 0, FCT_BNHD, 1}},
    {"f32_d64_varlen_causal", VS, {F32, 1, 0, 0, 2, 2, 64, 1, 0, FCT_BNHD, 0, 0, 3, VL_Q, VL_K_DIFF}},
    {"f32_d64_varlen_empty_sequences", VS, {F32, 1, 0, 0, 2, 2, 64, 0, 0, FCT_BNHD, 0, 0, 4, VL_Q_EMPTY, VL_K_EMPTY}},
    {"f32_d64_padded", VS, {F32, 2, 33, 45, 4, 2, 64, 0, 0, FCT_PADDED}},
    {"f32_d64_bhnd_causal", VS, {F32, 2, 45, 33, 2, 2, 64, 1, 0, FCT_BHND}},
    {"f32_d64_scale_5_large_scores", VS, {F32, 1, 100, 130, 2, 2, 64, 0, 5.0f, FCT_BNHD}},
    {"f16_d64", VS, {F16, 2, 127, 127, 4, 4, 64, 0, 0, FCT_BNHD}},
    {"bf16_d64_causal_Nq129_Nk7", VS, {BF16, 1, 129, 7, 2, 2, 64, 1, 0, FCT_BNHD}},
};

/* Twenty calls in a row on one problem (the naive path's scratch memory comes and
 * goes per call) all succeed and stay correct. */
static void test_naive_repeated(void **state) {
  fct_case c;
  fct_problem p;
  fct_run run;
  int i;
  (void)state;
  memset(&c, 0, sizeof c);
  memset(&run, 0, sizeof run);
  c.dtype = F32, c.batch = 2, c.seqlen_q = 64, c.seqlen_k = 96, c.heads_q = 2, c.heads_kv = 2, c.head_dim = 64;
  run.algo = FLASHCL_ALGO_NAIVE;
  fct_problem_create(&p, &c);
  for (i = 0; i < 20; i++) {
    fct_result r;
    fct_problem_run(&p, &run, &r);
    fct_result_release(&r);
  }
  fct_problem_release(&p);
}

int main(void) {
  const struct CMUnitTest extra[] = {
      {"naive_repeated_calls", test_naive_repeated, NULL, NULL, NULL},
  };
  return fct_run_table("naive", TESTS, sizeof TESTS / sizeof TESTS[0], extra, sizeof extra / sizeof extra[0]);
}
