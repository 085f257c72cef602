/*
 * Forward correctness, default suite: every output is checked against the double
 * reference (relative L2, per-row error, NaN poison, O == 0 / LSE == -inf on rows
 * with no key, nothing written outside the views).
 *
 * PoCL builds one program per (dtype, head_dim, causal, varlen, block sizes), so
 * most cases share a few configurations (f32/f16/bf16 at d = 64); other head dims
 * get one small case each. The naive algorithm (and flash vs naive) is in
 * test_naive; the full sweep is test_forward_long (label "long").
 */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK FCT_CHECK_RUN

static const int VL_Q[] = {1, 300, 77};
static const int VL_K_SAME[] = {1, 300, 77};
static const int VL_K_DIFF[] = {5, 120, 300};
static const int VL_Q_EMPTY[] = {3, 0, 5, 2};
static const int VL_K_EMPTY[] = {0, 4, 6, 9};

/* fct_case fields in order: dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv,
 * head_dim, causal, scale, layout, no_lse, kv_batch_stride0, num_seqs, seqlens_q,
 * seqlens_k. fct_run: algo, block_r, block_c, kernel. */
#define F32 FLASHCL_F32
#define F16 FLASHCL_F16
#define BF16 FLASHCL_BF16
#define FLASH {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO}
#define AUTO {FLASHCL_ALGO_AUTO, 0, 0, FLASHCL_KERNEL_AUTO}
#define BLOCKS(r, c) {FLASHCL_ALGO_FLASH, r, c, FLASHCL_KERNEL_AUTO}

static const fct_table_entry TESTS[] = {
    /* ---- f32, d = 64: sequence lengths, both masks ---- */
    {"f32_d64_N127_B2_H4", CHECK, {F32, 2, 127, 127, 4, 4, 64, 0, 0, FCT_BNHD}, AUTO},
    {"f32_d64_N1_B3", CHECK, {F32, 3, 1, 1, 2, 2, 64, 0, 0, FCT_BNHD}, FLASH},
    {"f32_d64_N1_B3_causal", CHECK, {F32, 3, 1, 1, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d64_N7", CHECK, {F32, 2, 7, 7, 2, 2, 64, 0, 0, FCT_BNHD}, FLASH},
    {"f32_d64_N7_causal", CHECK, {F32, 2, 7, 7, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d64_N129_causal", CHECK, {F32, 2, 129, 129, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d64_N1000_causal", CHECK, {F32, 1, 1000, 1000, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d64_N1000", CHECK, {F32, 1, 1000, 1000, 1, 1, 64, 0, 0, FCT_BNHD}, FLASH},
    {"f32_d64_Nq7_Nk129", CHECK, {F32, 2, 7, 129, 2, 2, 64, 0, 0, FCT_BNHD}, FLASH},
    {"f32_d64_Nq7_Nk129_causal", CHECK, {F32, 2, 7, 129, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d64_Nq129_Nk7", CHECK, {F32, 2, 129, 7, 2, 2, 64, 0, 0, FCT_BNHD}, FLASH},
    {"f32_d64_Nq129_Nk7_causal_empty_rows", CHECK, {F32, 2, 129, 7, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d64_Nq1_Nk300_causal", CHECK, {F32, 1, 1, 300, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d64_Nq300_Nk1_causal", CHECK, {F32, 1, 300, 1, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    /* ---- scale, optional LSE, GQA/MQA, layouts ---- */
    {"f32_d64_scale_0.3", CHECK, {F32, 2, 50, 60, 2, 2, 64, 0, 0.3f, FCT_BNHD}, FLASH},
    {"f32_d64_scale_2_causal", CHECK, {F32, 1, 60, 50, 2, 2, 64, 1, 2.0f, FCT_BNHD}, FLASH},
    {"f32_d64_no_lse", CHECK, {F32, 2, 65, 65, 2, 2, 64, 0, 0, FCT_BNHD, 1}, FLASH},
    {"f32_d64_gqa_8_2", CHECK, {F32, 2, 65, 80, 8, 2, 64, 0, 0, FCT_BNHD}, FLASH},
    {"f32_d64_gqa_8_1", CHECK, {F32, 2, 65, 80, 8, 1, 64, 0, 0, FCT_BNHD}, FLASH},
    {"f32_d64_gqa_8_2_causal", CHECK, {F32, 1, 100, 77, 8, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d64_gqa_8_1_causal", CHECK, {F32, 1, 77, 100, 8, 1, 64, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d64_bhnd", CHECK, {F32, 2, 77, 90, 3, 3, 64, 0, 0, FCT_BHND}, FLASH},
    {"f32_d64_bhnd_causal_gqa", CHECK, {F32, 2, 90, 77, 4, 2, 64, 1, 0, FCT_BHND}, FLASH},
    {"f32_d64_padded_strides_offsets", CHECK, {F32, 2, 33, 45, 4, 2, 64, 0, 0, FCT_PADDED}, FLASH},
    {"f32_d64_padded_strides_causal", CHECK, {F32, 2, 45, 33, 2, 1, 64, 1, 0, FCT_PADDED}, FLASH},
    {"f32_d64_kv_batch_stride0", CHECK, {F32, 3, 20, 30, 2, 2, 64, 0, 0, FCT_BNHD, 0, 1}, FLASH},
    /* ---- varlen ---- */
    {"f32_d64_varlen_1_300_77", CHECK, {F32, 1, 0, 0, 2, 2, 64, 0, 0, FCT_BNHD, 0, 0, 3, VL_Q, VL_K_SAME}, FLASH},
    {"f32_d64_varlen_1_300_77_causal", CHECK, {F32, 1, 0, 0, 2, 2, 64, 1, 0, FCT_BNHD, 0, 0, 3, VL_Q, VL_K_SAME},
     FLASH},
    {"f32_d64_varlen_q_ne_k_causal_gqa", CHECK, {F32, 1, 0, 0, 4, 2, 64, 1, 0, FCT_BNHD, 0, 0, 3, VL_Q, VL_K_DIFF},
     FLASH},
    {"f32_d64_varlen_q_ne_k", CHECK, {F32, 1, 0, 0, 2, 1, 64, 0, 0, FCT_BNHD, 0, 0, 3, VL_Q, VL_K_DIFF}, FLASH},
    {"f32_d64_varlen_empty_sequences", CHECK, {F32, 1, 0, 0, 2, 2, 64, 0, 0, FCT_BNHD, 0, 0, 4, VL_Q_EMPTY, VL_K_EMPTY},
     FLASH},
    {"f32_d64_varlen_padded_causal", CHECK, {F32, 1, 0, 0, 2, 2, 64, 1, 0, FCT_PADDED, 0, 0, 3, VL_Q, VL_K_DIFF},
     FLASH},
    {"f32_d64_kernel_portable", CHECK, {F32, 2, 65, 70, 2, 2, 64, 0, 0, FCT_BNHD},
     {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_PORTABLE}},
    /* ---- explicit block sizes ---- */
    {"f32_d64_blocks_8x8", CHECK, {F32, 2, 129, 100, 2, 2, 64, 0, 0, FCT_BNHD}, BLOCKS(8, 8)},
    {"f32_d64_blocks_8x8_causal_empty_rows", CHECK, {F32, 1, 129, 40, 2, 2, 64, 1, 0, FCT_BNHD}, BLOCKS(8, 8)},
    {"f32_d64_blocks_8x8_causal_Nq_lt_Nk", CHECK, {F32, 1, 100, 200, 2, 2, 64, 1, 0, FCT_BNHD}, BLOCKS(8, 8)},
    {"f32_d64_blocks_16x32", CHECK, {F32, 2, 129, 100, 2, 2, 64, 0, 0, FCT_BNHD}, BLOCKS(16, 32)},
    {"f32_d32_blocks_8x8_Nq9", CHECK, {F32, 2, 9, 20, 2, 2, 32, 0, 0, FCT_BNHD}, BLOCKS(8, 8)},
    {"f32_d64_blocks_32x16_varlen", CHECK, {F32, 1, 0, 0, 2, 2, 64, 1, 0, FCT_BNHD, 0, 0, 3, VL_Q, VL_K_DIFF},
     BLOCKS(32, 16)},
    /* ---- f16 / bf16 at d = 64 ---- */
    {"f16_d64_N127_B2_H4", CHECK, {F16, 2, 127, 127, 4, 4, 64, 0, 0, FCT_BNHD}, FLASH},
    {"f16_d64_N1000", CHECK, {F16, 1, 1000, 1000, 1, 1, 64, 0, 0, FCT_BNHD}, FLASH},
    {"f16_d64_bhnd_gqa_8_2", CHECK, {F16, 2, 65, 80, 8, 2, 64, 0, 0, FCT_BHND}, FLASH},
    {"f16_d64_padded", CHECK, {F16, 2, 33, 45, 2, 2, 64, 0, 0, FCT_PADDED}, FLASH},
    {"bf16_d64_N129_causal", CHECK, {BF16, 2, 129, 129, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"bf16_d64_Nq129_Nk7_causal_empty_rows", CHECK, {BF16, 1, 129, 7, 2, 2, 64, 1, 0, FCT_BNHD}, FLASH},
    {"bf16_d64_Nq7_Nk129_causal_gqa_8_1", CHECK, {BF16, 1, 7, 129, 8, 1, 64, 1, 0, FCT_BNHD}, FLASH},
    {"bf16_d64_padded_causal", CHECK, {BF16, 2, 45, 33, 2, 2, 64, 1, 0, FCT_PADDED}, FLASH},
    {"f16_d64_varlen_causal", CHECK, {F16, 1, 0, 0, 2, 2, 64, 1, 0, FCT_BNHD, 0, 0, 3, VL_Q, VL_K_DIFF}, FLASH},
    {"bf16_d64_varlen", CHECK, {BF16, 1, 0, 0, 4, 2, 64, 0, 0, FCT_BNHD, 0, 0, 3, VL_Q, VL_K_SAME}, FLASH},
    /* ---- other head dims: one small case each ---- */
    {"f32_d8_N40", CHECK, {F32, 2, 40, 40, 2, 2, 8, 0, 0, FCT_BNHD}, FLASH},
    {"f16_d32_N100_causal", CHECK, {F16, 2, 100, 100, 2, 2, 32, 1, 0, FCT_BNHD}, FLASH},
    {"bf16_d96_Nq50_Nk70", CHECK, {BF16, 1, 50, 70, 2, 2, 96, 0, 0, FCT_BNHD}, FLASH},
    {"f32_d128_Nq70_Nk50_causal", CHECK, {F32, 1, 70, 50, 2, 1, 128, 1, 0, FCT_BNHD}, FLASH},
    /* The "wide" cases also run under the probed-budget plans (test_forward_wide_tiles):
     * 128 x 64 at d = 128 (more than one row tile, several key tiles), 80 x 32 at
     * d = 176 and 64 x 32 at d = 256. */
    {"f16_d128_N300_gqa_4_2_wide", CHECK, {F16, 1, 300, 300, 4, 2, 128, 0, 0, FCT_BNHD}, FLASH},
    {"bf16_d176_Nq90_Nk140_wide", CHECK, {BF16, 1, 90, 140, 2, 1, 176, 0, 0, FCT_BNHD}, FLASH},
    {"f32_d256_N150_causal_wide", CHECK, {F32, 1, 150, 150, 2, 2, 256, 1, 0, FCT_BNHD}, FLASH},
    {"f32_d256_N40", CHECK, {F32, 1, 40, 40, 2, 2, 256, 0, 0, FCT_BNHD}, FLASH},
    {"bf16_d256_Nq33_Nk20_causal", CHECK, {BF16, 1, 33, 20, 2, 2, 256, 1, 0, FCT_BNHD}, FLASH},
};

/* Two identical calls give bit-identical outputs. */
static void test_deterministic(void **state) {
  fct_case c;
  fct_problem p;
  fct_result a, b;
  fct_run run;
  (void)state;
  memset(&c, 0, sizeof c);
  memset(&run, 0, sizeof run);
  c.dtype = F32, c.batch = 2, c.seqlen_q = 129, c.seqlen_k = 129, c.heads_q = 2, c.heads_kv = 2, c.head_dim = 64,
  c.causal = 1;
  run.algo = FLASHCL_ALGO_FLASH;
  fct_problem_create(&p, &c);
  fct_problem_run(&p, &run, &a);
  fct_problem_run(&p, &run, &b);
  FCT_CHECK(memcmp(a.o.host, b.o.host, a.o.bytes) == 0 && memcmp(a.lse.host, b.lse.host, a.lse.bytes) == 0,
            "%s: two identical flash calls differ (O diff %.3e)", p.desc, fct_result_diff_o(&p, &a, &b));
  fct_result_release(&a);
  fct_result_release(&b);
  fct_problem_release(&p);
}

/* The forward waits for its wait list: gated on a user event, it must not have
 * written o until the event completes. */
static void test_wait_list_and_event(void **state) {
  fct_env *env = fct_env_get();
  fct_case c;
  fct_problem p;
  fct_tensor o, lse;
  flashcl_attention_desc desc;
  cl_event gate, done = NULL;
  cl_int err, status = 0;
  flashcl_status st;
  (void)state;
  memset(&c, 0, sizeof c);
  c.dtype = F32, c.batch = 1, c.seqlen_q = 64, c.seqlen_k = 64, c.heads_q = 2, c.heads_kv = 2, c.head_dim = 64;
  fct_problem_create(&p, &c);
  fct_tensor_create(&o, F32, FCT_BNHD, 1, 64, 2, 64, 0);
  fct_tensor_create_lse(&lse, FCT_BNHD, 1, 64, 2, 0);
  gate = clCreateUserEvent(env->cl_ctx, &err);
  FCT_CHECK(err == CL_SUCCESS, "clCreateUserEvent: %d", (int)err);
  fct_problem_desc(&p, NULL, &desc);
  st = flashcl_attention_forward(env->ctx, &desc, &p.q.t, &p.k.t, &p.v.t, &o.t, &lse.t, 1, &gate, &done);
  if (st != FLASHCL_SUCCESS) clSetUserEventStatus(gate, CL_COMPLETE);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "forward gated on a user event");
  FCT_CHECK(done != NULL, "no out_event");
  clFlush(env->queue);
  err = clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  FCT_CHECK(err == CL_SUCCESS && status != CL_COMPLETE,
            "the forward completed (status %d) before its wait-list event was set", (int)status);
  err = clSetUserEventStatus(gate, CL_COMPLETE);
  FCT_CHECK(err == CL_SUCCESS, "clSetUserEventStatus: %d", (int)err);
  err = clWaitForEvents(1, &done);
  FCT_CHECK(err == CL_SUCCESS, "clWaitForEvents(out_event): %d", (int)err);
  fct_tensor_download(&o);
  fct_tensor_download(&lse);
  {
    /* Compare against the reference. */
    double e2 = 0, r2 = 0;
    int64_t n, h, x;
    for (n = 0; n < 64; n++)
      for (h = 0; h < 2; h++)
        for (x = 0; x < 64; x++) {
          double g = fct_tensor_get(&o, 0, n, h, x), r = p.ref_o[(n * 2 + h) * 64 + x];
          e2 += (g - r) * (g - r), r2 += r * r;
        }
    FCT_CHECK(sqrt(e2 / r2) <= fct_tolerance(F32), "%s (gated): O relative L2 error %.3e", p.desc, sqrt(e2 / r2));
  }
  clReleaseEvent(done);
  clReleaseEvent(gate);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
  fct_problem_release(&p);
}

/* Large scores: the online softmax must subtract the running max. Scale 5 on
 * N(0,1) inputs at d = 64 gives scores with std 40 (max > 88, where expf overflows). */
static void test_large_scores(void **state) {
  fct_case c;
  fct_run run;
  (void)state;
  memset(&c, 0, sizeof c);
  memset(&run, 0, sizeof run);
  c.dtype = F32, c.batch = 1, c.seqlen_q = 100, c.seqlen_k = 130, c.heads_q = 2, c.heads_kv = 2, c.head_dim = 64,
  c.scale = 5.0f;
  run.algo = FLASHCL_ALGO_FLASH;
  fct_check_case(&c, &run);
}

int main(void) {
  const struct CMUnitTest extra[] = {
      {"deterministic", test_deterministic, NULL, NULL, NULL},
      {"wait_list_and_out_event", test_wait_list_and_event, NULL, NULL, NULL},
      {"large_scores_scale_5", test_large_scores, NULL, NULL, NULL},
  };
  return fct_run_table("forward", TESTS, sizeof TESTS / sizeof TESTS[0], extra, sizeof extra / sizeof extra[0]);
}
