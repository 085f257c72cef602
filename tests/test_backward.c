/*
 * Backward pass and dropout tests.
 *
 *  - Gradients dQ, dK, dV of flashcl_attention_backward (flash with deterministic
 *    and atomic dQ, and the naive baseline) against the double CPU reference in
 *    reference_bwd.c, which consumes the same quantized q, k, v, o and dO the
 *    device reads and applies the same dropout mask (Philox in philox_ref.c).
 *    Relative L2 per gradient: fp32 1e-5, fp16 2e-3, bf16 1e-2. Outputs are
 *    poisoned with NaN before every run; NaN never passes; query rows that see no
 *    key must have dQ exactly 0; nothing outside the views may be written.
 *    Where a gradient is ~0 by cancellation (rows that see one key) a rounding-
 *    noise allowance of 4 fp32 ulps of the terms' size applies (see check_grad).
 *  - The backward's o and lse are, by default, the double reference forward
 *    (with dropout) rounded to the dtype / fp32, so a backward case does not
 *    depend on the forward; "pipeline" cases feed it the device forward's output
 *    (flash and naive, with dropout: the forward's and backward's masks agree).
 *  - The forward with dropout (naive and flash) against the reference. Both
 *    support dropout: any status but SUCCESS (UNSUPPORTED included) fails.
 *  - flashcl_dropout_mask: bit-exact with the C Philox, kept fraction within 4
 *    sigma, (seed, offset) dependence and the counter layout.
 *  - Host only: Philox known answers, and the CPU backward against central finite
 *    differences of the CPU forward.
 *  - Error paths of the backward (status, and poisoned gradients left untouched)
 *    and the backward workspace size (flash O(N), naive O(N^2)).
 *
 * Built three times: test_backward (default suite); with -DFCT_BWD_LONG,
 * test_backward_long (label "long": a sweep over dtype x head_dim x causal x
 * dropout x shapes); and with -DFCT_BWD_MMA, test_backward_mma (its own table,
 * run with desc.kernel = NVIDIA_MMA: the tensor-core backward where the device
 * has it, and a check that the explicit request is refused cleanly elsewhere). PoCL compiles one program per (dtype, head_dim, causal,
 * varlen, dQ mode, dropout), so the default table reuses a few configurations.
 *
 *   FLASHCL_TEST_SEED=<n>        reproduce a run (the seed is printed)
 *   FLASHCL_TEST_FILTER=<glob>   run only matching test names
 */
#include "common.h"
#include "philox_ref.h"
#include "reference_bwd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define F32 FLASHCL_F32
#define F16 FLASHCL_F16
#define BF16 FLASHCL_BF16

static double now_s(void) {
#if defined(CLOCK_MONOTONIC) && !defined(_WIN32)
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#else
  return (double)clock() / CLOCKS_PER_SEC;
#endif
}

static void appendf(char *buf, size_t cap, const char *fmt, ...) {
  size_t len = strlen(buf);
  va_list ap;
  if (len >= cap) return;
  va_start(ap, fmt);
  vsnprintf(buf + len, cap - len, fmt, ap);
  va_end(ap);
}

static void upload(fct_tensor *t) {
  cl_int err = clEnqueueWriteBuffer(fct_env_get()->queue, t->t.buffer, CL_TRUE, 0, t->bytes, t->host, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueWriteBuffer(%zu bytes) failed: %d", t->bytes, (int)err);
}

static size_t view_elems(const fct_tensor *t) {
  return (size_t)(t->t.shape[0] * t->t.shape[1] * t->t.shape[2] * t->t.shape[3]);
}

/* Waits for a call's out_event and checks it completed. */
static void wait_event(cl_event ev, const char *what, const char *desc) {
  cl_int err, status = -1;
  FCT_CHECK(ev != NULL, "%s succeeded but returned no out_event: %s", what, desc);
  err = clWaitForEvents(1, &ev);
  FCT_CHECK(err == CL_SUCCESS, "clWaitForEvents on the out_event of %s failed: %d: %s", what, (int)err, desc);
  err = clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  FCT_CHECK(err == CL_SUCCESS && status == CL_COMPLETE, "%s: out_event status %d (err %d): %s", what, (int)status,
            (int)err, desc);
  clReleaseEvent(ev);
  fct_finish();
}

/* ================================================================ cases == */

enum { R_DET = 1, R_ATOMIC = 2, R_NAIVE = 4, R_REPEAT = 8, R_SPLIT = 16, R_ALL = R_DET | R_ATOMIC | R_NAIVE };
/* R_SPLIT (tensor-core table): the deterministic dQ accumulated by the dK/dV
 * kernel in split accumulators, forced to 1 and 3 splits with
 * the mma_bwd tuning's dq_splits (the automatic choice takes it only for shapes that fill
 * the device), each run twice and compared bit for bit. */
/* Where the backward's o / lse come from: the double reference rounded to the
 * dtype, the device's flash forward, or the device's naive forward. */
enum { SRC_REF = 0, SRC_FWD = 1, SRC_FWD_NAIVE = 2 };
enum { K_BWD = 0, K_FWD_DROPOUT = 1 };          /* what the case checks */
enum { OFS_RANDOM = 0, OFS_CARRY = 1 };         /* dropout offset: random, or t crosses 2^32 */

typedef struct bwd_case {
  const char *name;
  int kind;
  flashcl_dtype dtype;
  int batch, seqlen_q, seqlen_k; /* batch/seqlens ignored for varlen */
  int heads_q, heads_kv, head_dim;
  int causal;
  float dropout_p;
  unsigned runs;   /* R_* */
  int o_source;    /* SRC_* */
  fct_layout layout;
  float scale;
  int offset_mode; /* OFS_* */
  int num_seqs;
  const int *seqlens_q, *seqlens_k;
  const char *bwd_plan; /* the bwd tuning's plan for the flash runs, "bc,br,threads[/...]" (NULL: the automatic plan) */
} bwd_case;

#ifndef FCT_BWD_MMA
static const int VL_Q[] = {1, 70, 33};
static const int VL_K[] = {5, 70, 1};
#endif

/* name, kind, dtype, B, Nq, Nk, Hq, Hkv, d, causal, dropout_p, runs, o_source, layout, scale, offset_mode,
 * num_seqs, seqlens_q, seqlens_k */
#define BWD(name, dt, B, nq, nk, hq, hkv, d, causal, p, runs) \
  {name, K_BWD, dt, B, nq, nk, hq, hkv, d, causal, p, runs, SRC_REF, FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL}
#define BWD_VL(name, dt, hq, hkv, d, causal, p, runs, n, lq, lk) \
  {name, K_BWD, dt, 1, 0, 0, hq, hkv, d, causal, p, runs, SRC_REF, FCT_BNHD, 0.0f, OFS_RANDOM, n, lq, lk}
#define FWD_DROP(name, dt, B, nq, nk, hq, hkv, d, causal, p) \
  {name, K_FWD_DROPOUT, dt, B, nq, nk, hq, hkv, d, causal, p, 0, SRC_REF, FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL}

#if !defined(FCT_BWD_LONG) || defined(FCT_BWD_MMA)
static const int VL_Q_EMPTY[] = {3, 0, 17, 9};
static const int VL_K_EMPTY[] = {0, 9, 17, 4};
#endif

#ifdef FCT_BWD_MMA
/* The tensor-core backward (desc.kernel = NVIDIA_MMA): fp16/bf16 at head dims
 * 16 to 256 with 16-byte aligned rows (BNHD/BHND, offset 0), so that every case
 * runs bwd_dkdv_mma and, per dQ mode, bwd_dq_mma or its atomic dQ (checked with
 * flashcl_attention_kernel_family). Sizes cross the tiles (64 keys / 32 or 64
 * queries) on both sides. */
static const int VL_Q_MMA[] = {130, 1, 77};
static const int VL_K_MMA[] = {200, 65, 31};
static const bwd_case CASES[] = {
    BWD("mma_f16_d128_B2_N200", F16, 2, 200, 200, 4, 4, 128, 0, 0.0f, R_DET | R_ATOMIC | R_SPLIT | R_REPEAT),
    BWD("mma_f16_d128_causal_gqa_4_1_Nq129_Nk300", F16, 1, 129, 300, 4, 1, 128, 1, 0.0f, R_DET | R_ATOMIC | R_SPLIT),
    BWD("mma_f16_d128_causal_empty_rows_Nq300_Nk129", F16, 1, 300, 129, 2, 2, 128, 1, 0.0f, R_DET | R_ATOMIC | R_SPLIT),
    BWD("mma_bf16_d128_causal_N257", BF16, 1, 257, 257, 2, 1, 128, 1, 0.0f, R_DET | R_ATOMIC),
    BWD("mma_f16_d64_N1_B3", F16, 3, 1, 1, 2, 2, 64, 0, 0.0f, R_DET | R_ATOMIC),
    BWD("mma_f16_d64_causal_gqa_8_2_N321", F16, 1, 321, 321, 8, 2, 64, 1, 0.0f, R_DET | R_ATOMIC | R_SPLIT | R_REPEAT),
    BWD("mma_bf16_d64_Nq65_Nk33", BF16, 2, 65, 33, 2, 2, 64, 0, 0.0f, R_DET | R_ATOMIC | R_SPLIT),
    {"mma_f16_d128_bhnd_scale_0.2", K_BWD, F16, 2, 100, 140, 2, 2, 128, 0, 0.0f, R_DET | R_ATOMIC, SRC_REF,
     FCT_BHND, 0.2f, OFS_RANDOM, 0, NULL, NULL},
    BWD_VL("mma_f16_d128_varlen_causal_gqa_4_2", F16, 4, 2, 128, 1, 0.0f, R_DET | R_ATOMIC | R_SPLIT, 3, VL_Q_MMA, VL_K_MMA),
    BWD_VL("mma_bf16_d64_varlen_empty_sequences", BF16, 2, 1, 64, 0, 0.0f, R_DET | R_ATOMIC | R_SPLIT, 4, VL_Q_EMPTY,
           VL_K_EMPTY),
    /* o / lse from the device forward (the tensor-core one where it runs) */
    {"mma_f16_d128_pipeline_fwd_causal", K_BWD, F16, 2, 190, 190, 4, 2, 128, 1, 0.0f, R_DET | R_ATOMIC, SRC_FWD,
     FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL},
    /* dropout: the tensor-core kernels regenerate the portable kernels' Philox mask */
    BWD("mma_f16_d64_dropout", F16, 1, 65, 65, 2, 2, 64, 0, 0.1f, R_DET | R_ATOMIC),
    BWD("mma_bf16_d128_dropout_causal_gqa_4_2", BF16, 1, 130, 170, 4, 2, 128, 1, 0.2f, R_DET | R_ATOMIC | R_SPLIT),
    /* Head dims besides 64 and 128 (local rows padded to 64 or 128 elements; the
     * atomic dQ tile picks a warp split that divides the head dim). */
    BWD("mma_f16_d96_causal_gqa_4_2_N150", F16, 1, 150, 150, 4, 2, 96, 1, 0.0f, R_DET | R_ATOMIC | R_SPLIT),
    BWD("mma_bf16_d80_Nq70_Nk130", BF16, 2, 70, 130, 2, 2, 80, 0, 0.0f, R_DET | R_ATOMIC),
    BWD("mma_f16_d32_causal_N200", F16, 1, 200, 200, 4, 4, 32, 1, 0.0f, R_DET | R_ATOMIC | R_SPLIT),
    BWD("mma_f16_d48_N99", F16, 1, 99, 99, 2, 1, 48, 0, 0.0f, R_DET | R_ATOMIC),
    BWD("mma_bf16_d16_causal_N130", BF16, 1, 130, 130, 2, 2, 16, 1, 0.0f, R_DET | R_ATOMIC),
    BWD("mma_f16_d112_varlen_like_Nq40_Nk90", F16, 2, 40, 90, 2, 1, 112, 1, 0.1f, R_DET | R_ATOMIC),
    /* Past d = 128: two warps per 16-key slice, each with half of dK's and dV's
     * columns (uneven at d = 144: 5 and 4 column pairs), and the dQ from the
     * atomic tile in both modes (split accumulators when deterministic), whose
     * warps may hold unequal column shares (d = 160, 144). */
    BWD("mma_f16_d256_causal_gqa_4_2_N150", F16, 1, 150, 150, 4, 2, 256, 1, 0.0f, R_DET | R_ATOMIC | R_SPLIT | R_REPEAT),
    BWD("mma_bf16_d256_Nq70_Nk130", BF16, 2, 70, 130, 2, 2, 256, 0, 0.0f, R_DET | R_ATOMIC),
    BWD("mma_f16_d192_dropout_causal_Nq129_Nk200", F16, 1, 129, 200, 2, 1, 192, 1, 0.1f, R_DET | R_ATOMIC),
    BWD_VL("mma_bf16_d192_varlen_causal_gqa_4_2", BF16, 4, 2, 192, 1, 0.0f, R_DET | R_ATOMIC | R_SPLIT, 3, VL_Q_MMA,
           VL_K_MMA),
    BWD("mma_f16_d160_N99", F16, 1, 99, 99, 2, 2, 160, 0, 0.0f, R_DET | R_ATOMIC),
    BWD("mma_bf16_d144_causal_Nq65_Nk97", BF16, 2, 65, 97, 2, 1, 144, 1, 0.0f, R_DET | R_ATOMIC),
    BWD("mma_f16_d240_N80", F16, 1, 80, 80, 2, 2, 240, 0, 0.0f, R_DET | R_ATOMIC),
    /* Head dims that are multiples of 8 but not 16: the Hopper kernels pad
     * them to a multiple of 64 columns in local memory, mma.sync to the next
     * multiple of 16 (checked on Hopper through mma_bwd wgmma=0). */
    BWD("mma_f16_d72_causal_gqa_4_2_N150", F16, 1, 150, 150, 4, 2, 72, 1, 0.0f,
        R_DET | R_ATOMIC | R_SPLIT | R_REPEAT),
    BWD_VL("mma_bf16_d120_varlen_causal_gqa_4_2", BF16, 4, 2, 120, 1, 0.0f, R_DET | R_ATOMIC, 3, VL_Q_MMA,
           VL_K_MMA),
    BWD("mma_f16_d40_dropout_Nq70_Nk130", F16, 2, 70, 130, 2, 2, 40, 0, 0.1f, R_DET | R_ATOMIC),
    BWD("mma_bf16_d8_N99", BF16, 1, 99, 99, 2, 1, 8, 0, 0.0f, R_DET | R_ATOMIC),
    /* ... and past d = 128 (flash_bwd_wgmma_wide.cl: tiles of 192 or 256
     * columns, dQ accumulated in both modes). */
    BWD("mma_f16_d136_causal_gqa_4_2_N150", F16, 1, 150, 150, 4, 2, 136, 1, 0.0f,
        R_DET | R_ATOMIC | R_SPLIT | R_REPEAT),
    BWD("mma_bf16_d200_dropout_Nq70_Nk130", BF16, 2, 70, 130, 2, 2, 200, 0, 0.1f, R_DET | R_ATOMIC),
    BWD_VL("mma_f16_d248_varlen_causal_gqa_4_2", F16, 4, 2, 248, 1, 0.0f, R_DET | R_ATOMIC, 3, VL_Q_MMA,
           VL_K_MMA),
};
#elif !defined(FCT_BWD_LONG)
static const bwd_case CASES[] = {
    /* ---- f32, d = 64, no dropout: shapes, masks, GQA, layouts ---- */
    BWD("f32_d64_N63_B2_H2", F32, 2, 63, 63, 2, 2, 64, 0, 0.0f, R_ALL | R_REPEAT),
    BWD("f32_d64_N1_B3", F32, 3, 1, 1, 2, 2, 64, 0, 0.0f, R_DET | R_ATOMIC),
    BWD("f32_d64_Nq33_Nk65", F32, 1, 33, 65, 2, 2, 64, 0, 0.0f, R_DET | R_NAIVE),
    BWD("f32_d64_Nq65_Nk33", F32, 1, 65, 33, 2, 2, 64, 0, 0.0f, R_DET | R_ATOMIC),
    BWD("f32_d64_gqa_8_1_Nq40_Nk63", F32, 1, 40, 63, 8, 1, 64, 0, 0.0f, R_DET | R_ATOMIC),
    {"f32_d64_bhnd_scale_0.3", K_BWD, F32, 2, 45, 33, 2, 2, 64, 0, 0.0f, R_DET | R_NAIVE, SRC_REF, FCT_BHND, 0.3f,
     OFS_RANDOM, 0, NULL, NULL},
    BWD("f32_d64_N65_causal", F32, 1, 65, 65, 2, 2, 64, 1, 0.0f, R_ALL),
    BWD("f32_d64_N1_causal", F32, 2, 1, 1, 2, 2, 64, 1, 0.0f, R_DET),
    BWD("f32_d64_Nq65_Nk33_causal_empty_rows", F32, 1, 65, 33, 2, 2, 64, 1, 0.0f, R_ALL),
    BWD("f32_d64_Nq33_Nk65_causal", F32, 1, 33, 65, 2, 2, 64, 1, 0.0f, R_DET | R_ATOMIC),
    BWD("f32_d64_N257_causal", F32, 1, 257, 257, 1, 1, 64, 1, 0.0f, R_DET | R_ATOMIC),
    BWD("f32_d64_gqa_4_2_causal_Nq65_Nk70", F32, 1, 65, 70, 4, 2, 64, 1, 0.0f, R_ALL),
    {"f32_d64_padded_gqa_4_2_causal", K_BWD, F32, 2, 33, 45, 4, 2, 64, 1, 0.0f, R_DET | R_ATOMIC, SRC_REF,
     FCT_PADDED, 0.0f, OFS_RANDOM, 0, NULL, NULL},
    /* ---- varlen ---- */
    BWD_VL("f32_d64_varlen_causal_gqa_4_2", F32, 4, 2, 64, 1, 0.0f, R_ALL, 3, VL_Q, VL_K),
    BWD_VL("f32_d64_varlen_causal_empty_sequences", F32, 2, 1, 64, 1, 0.0f, R_DET | R_ATOMIC, 4, VL_Q_EMPTY,
           VL_K_EMPTY),
    BWD_VL("f32_d64_varlen_empty_sequences", F32, 2, 2, 64, 0, 0.0f, R_DET, 4, VL_Q_EMPTY, VL_K_EMPTY),
    /* ---- dropout 0.1 ---- */
    BWD("f32_d64_dropout", F32, 2, 65, 65, 2, 2, 64, 0, 0.1f, R_ALL | R_REPEAT),
    BWD("f32_d64_dropout_causal_gqa_8_1_Nq65_Nk40", F32, 1, 65, 40, 8, 1, 64, 1, 0.1f, R_DET | R_NAIVE),
    {"f32_d64_dropout_offset_carry", K_BWD, F32, 2, 33, 45, 4, 4, 64, 0, 0.1f, R_DET, SRC_REF, FCT_BNHD, 0.0f,
     OFS_CARRY, 0, NULL, NULL},
    BWD_VL("f32_d64_dropout_varlen_causal", F32, 2, 2, 64, 1, 0.1f, R_DET, 3, VL_Q, VL_K),
    /* ---- o / lse from the device forward ---- */
    {"f32_d64_pipeline_flash_fwd_causal", K_BWD, F32, 2, 65, 65, 2, 2, 64, 1, 0.0f, R_DET, SRC_FWD, FCT_BNHD, 0.0f,
     OFS_RANDOM, 0, NULL, NULL},
    {"f32_d64_pipeline_dropout_flash_fwd", K_BWD, F32, 2, 65, 65, 2, 2, 64, 0, 0.1f, R_DET | R_ATOMIC, SRC_FWD,
     FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL},
    {"f32_d64_pipeline_dropout_naive_fwd_causal", K_BWD, F32, 1, 65, 40, 8, 1, 64, 1, 0.1f, R_DET | R_NAIVE,
     SRC_FWD_NAIVE, FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL},
    /* ---- f16 / bf16 ---- */
    BWD("f16_d64_gqa_4_2_causal_Nq65_Nk70", F16, 1, 65, 70, 4, 2, 64, 1, 0.0f, R_ALL),
    BWD("f16_d64_dropout_causal", F16, 2, 63, 63, 2, 2, 64, 1, 0.1f, R_DET),
    /* Scores with std 40 (beyond expf's range): exp must never see a raw score. In
     * fp16 because at this scale fp32's own noise is ~1e-5 (|LSE| ~ 200 in an fp32
     * LSE gives P a relative error of ~200 ulps), the fp32 tolerance. */
    {"f16_d64_scale_5_large_scores_causal", K_BWD, F16, 1, 50, 70, 2, 2, 64, 1, 0.0f, R_DET | R_ATOMIC | R_NAIVE,
     SRC_REF, FCT_BNHD, 5.0f, OFS_RANDOM, 0, NULL, NULL},
    BWD("bf16_d64_causal_Nq65_Nk33_empty_rows", BF16, 1, 65, 33, 2, 2, 64, 1, 0.0f, R_DET),
    BWD("bf16_d64_dropout_gqa_8_1", BF16, 1, 65, 65, 8, 1, 64, 0, 0.1f, R_DET | R_ATOMIC | R_NAIVE),
    /* ---- other head dims (small) ---- */
    BWD("f16_d32_gqa_8_1_causal", F16, 1, 40, 40, 8, 1, 32, 1, 0.0f, R_DET),
    BWD("f32_d128_Nq63_Nk65_causal", F32, 1, 63, 65, 2, 2, 128, 1, 0.0f, R_DET),
    BWD("f32_d256_Nq23_Nk9_causal_dropout", F32, 1, 23, 9, 2, 1, 256, 1, 0.1f, R_DET),
    /* ---- the GPU work-item counts of the portable backward, forced on any device ---- */
    {"f32_d64_plan_16x16x64_causal_gqa_4_2", K_BWD, F32, 1, 65, 70, 4, 2, 64, 1, 0.0f, R_DET | R_ATOMIC, SRC_REF,
     FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL, "16,16,64"},
    {"f16_d128_plan_32x8x64_dropout", K_BWD, F16, 1, 40, 50, 2, 1, 128, 0, 0.1f, R_DET, SRC_REF, FCT_BNHD, 0.0f,
     OFS_RANDOM, 0, NULL, NULL, "32,8,64"},
    /* The plans of a probed local-memory budget (NVIDIA): 128 work-items on 32x32
     * at d = 128 and on 64x32 at d = 64, 256 on 32x32 past d = 128. */
    {"f32_d128_plan_32x32x128_causal_gqa_4_2", K_BWD, F32, 1, 70, 65, 4, 2, 128, 1, 0.0f, R_DET | R_ATOMIC, SRC_REF,
     FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL, "32,32,128"},
    {"f16_d64_plan_64x32x128_dropout", K_BWD, F16, 1, 80, 90, 2, 2, 64, 0, 0.1f, R_DET | R_ATOMIC, SRC_REF, FCT_BNHD,
     0.0f, OFS_RANDOM, 0, NULL, NULL, "64,32,128"},
    {"bf16_d192_plan_32x32x256_causal", K_BWD, BF16, 1, 70, 75, 2, 1, 192, 1, 0.0f, R_DET | R_ATOMIC, SRC_REF,
     FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL, "32,32,256"},
    /* NVIDIA's plan at d = 128 (src/portable/backward.c): 48 keys, 256 work-items. */
    {"f16_d128_plan_48x32x256_gqa_4_2", K_BWD, F16, 1, 100, 70, 4, 2, 128, 0, 0.0f, R_DET | R_ATOMIC, SRC_REF,
     FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL, "48,32,256"},
    /* NVIDIA's plans at d = 128 (src/portable/backward.c): dK/dV on 48x32 at 128
     * work-items, dQ on its own 32x64 at 128 (a second build); the atomic dQ
     * runs inside the dK/dV kernel's plan. */
    {"bf16_d128_plan_48x32x128_dq_32x64x128_causal_gqa_4_2", K_BWD, BF16, 1, 100, 90, 4, 2, 128, 1, 0.0f,
     R_DET | R_ATOMIC,
     SRC_REF, FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL, "48,32,128/32,64,128"},
    /* NVIDIA's atomic-mode dK/dV plan at d = 128: 56 keys (not a divisor of
     * the lengths), with dropout; with the bwd tuning's split=1 (test_backward_split)
     * the halves take 7 x 4 scores and 14 x 8 of dK or dV each. */
    {"f16_d128_plan_56x32x128_dq_32x64x128_causal_dropout", K_BWD, F16, 1, 90, 100, 2, 1, 128, 1, 0.1f,
     R_DET | R_ATOMIC, SRC_REF, FCT_BNHD, 0.0f, OFS_RANDOM, 0, NULL, NULL, "56,32,128/32,64,128"},
    /* The same plan on views at odd offsets and strides: the 16-bit tiles are
     * then read element by element, not as aligned 64-bit words. */
    {"f16_d128_plan_48x32x256_padded_causal", K_BWD, F16, 1, 70, 75, 2, 1, 128, 1, 0.0f, R_DET | R_ATOMIC, SRC_REF,
     FCT_PADDED, 0.0f, OFS_RANDOM, 0, NULL, NULL, "48,32,256"},
    /* ---- forward with dropout: naive and flash against the reference ---- */
    FWD_DROP("fwd_dropout_f32_d64", F32, 2, 65, 65, 2, 2, 64, 0, 0.1f),
    FWD_DROP("fwd_dropout_f32_d64_causal_gqa_8_1_empty_rows", F32, 1, 65, 40, 8, 1, 64, 1, 0.1f),
    FWD_DROP("fwd_dropout_bf16_d64_p0.5", BF16, 1, 65, 65, 8, 1, 64, 0, 0.5f),
};
#endif

/* ============================================================== problem == */

typedef struct bwd_problem {
  const bwd_case *c;
  fct_problem fp; /* q, k, v, cu_seqlens, reference LSE */
  char desc[768];
  ref_dropout drop;
  int64_t B, Nq, Nk, Hq, Hkv, D;
  fct_tensor o, lse, d_o;
  double *ref_o;                  /* reference O with dropout, (B, Nq, Hq, D) */
  double *ref_dq, *ref_dk, *ref_dv; /* contiguous BNHD */
  double *mag[3];                 /* rounding-noise scale of dq, dk, dv (ref_attention_backward_mag) */
  size_t empty_rows;              /* (row, head) pairs that see no key */
  double ref_seconds;
} bwd_problem;

static ref_attention_params bwd_ref_params(const bwd_problem *bp) {
  ref_attention_params rp;
  memset(&rp, 0, sizeof rp);
  rp.scale = bp->c->scale;
  rp.causal = bp->c->causal;
  rp.cu_seqlens_q = bp->fp.cu_q_host;
  rp.cu_seqlens_k = bp->fp.cu_k_host;
  rp.num_seqs = bp->c->num_seqs;
  return rp;
}

/* The per-call tuning the flash runs of a case take (a forced plan, split
 * counts, the second queue on or off), or none. bwd_tuning_begin starts one of
 * a family, with the parameters of $FLASHCL_TEST_TUNING ("bwd ahead=1", set by
 * the CTest variants) when it names the same family. */
static flashcl_tuning g_tuning;
static int g_tuning_on;

static void bwd_tuning_begin(flashcl_tuning_family family) {
  const char *extra = getenv("FLASHCL_TEST_TUNING");
  flashcl_tuning_init(&g_tuning, family);
  if (extra && *extra) {
    flashcl_tuning t;
    flashcl_status st = flashcl_tuning_parse(NULL, extra, &t);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "FLASHCL_TEST_TUNING=\"%s\" does not parse", extra);
    if (t.family == family) g_tuning = t;
  }
  g_tuning_on = 1;
}

static void bwd_tuning_set(const char *name, int value) {
  FCT_CHECK_STATUS(flashcl_tuning_set(NULL, &g_tuning, name, value), FLASHCL_SUCCESS, "tuning %s = %d", name, value);
}

/* "bc,br,threads" forces both kernels' plans, "bc,br,threads/bc,br,threads"
 * gives bwd_dq the second. */
static void bwd_tuning_plan(const char *plan) {
  int v[6] = {0}, n = sscanf(plan, "%d,%d,%d/%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
  static const char *const names[6] = {"bc", "br", "threads", "dq_bc", "dq_br", "dq_threads"};
  FCT_CHECK(n == 3 || n == 6, "bad plan \"%s\"", plan);
  bwd_tuning_begin(FLASHCL_TUNE_BWD);
  for (int i = 0; i < n; i++) bwd_tuning_set(names[i], v[i]);
}

static void bwd_desc(const bwd_problem *bp, flashcl_algo algo, int deterministic, flashcl_attention_desc *desc) {
  fct_run run;
  memset(&run, 0, sizeof run);
  run.algo = algo;
  fct_problem_desc(&bp->fp, &run, desc);
  desc->backward.deterministic = deterministic;
#ifdef FCT_BWD_MMA
  desc->algorithm.kernel = FLASHCL_KERNEL_NVIDIA_MMA;
#endif
  desc->dropout.p = bp->drop.p;
  desc->dropout.seed = bp->drop.seed;
  desc->dropout.offset = bp->drop.offset;
  if (g_tuning_on && algo == FLASHCL_ALGO_FLASH) desc->algorithm.tuning = &g_tuning;
}

static double rel_l2_view(const fct_tensor *t, const double *ref, size_t *nan_count) {
  const int64_t B = t->t.shape[0], N = t->t.shape[1], H = t->t.shape[2], D = t->t.shape[3];
  double e2 = 0, r2 = 0;
  int64_t b, n, h, x;
  *nan_count = 0;
  for (b = 0; b < B; b++)
    for (n = 0; n < N; n++)
      for (h = 0; h < H; h++)
        for (x = 0; x < D; x++) {
          const double g = fct_tensor_get(t, b, n, h, x), r = ref[((b * N + n) * H + h) * D + x];
          if (isnan(g)) {
            (*nan_count)++;
            continue;
          }
          e2 += (g - r) * (g - r);
          r2 += r * r;
        }
  return r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}

/* Runs the forward (algo) into the problem's o / lse; returns its status. */
static flashcl_status bwd_device_forward(bwd_problem *bp, flashcl_algo algo, fct_tensor *o, fct_tensor *lse) {
  flashcl_attention_desc desc;
  cl_event ev = NULL;
  flashcl_status st;
  bwd_desc(bp, algo, 1, &desc);
  desc.algorithm.tuning = NULL; /* the case's tuning is the backward's */
  st = flashcl_attention_forward(fct_env_get()->ctx, &desc, &bp->fp.q.t, &bp->fp.k.t, &bp->fp.v.t, &o->t, &lse->t, 0,
                                 NULL, &ev);
  if (st != FLASHCL_SUCCESS) return st;
  wait_event(ev, "flashcl_attention_forward", bp->desc);
  fct_tensor_download(o);
  fct_tensor_download(lse);
  return st;
}

/* Checks a forward result against the reference O (with dropout) and LSE. */
static void check_forward_result(const bwd_problem *bp, const fct_tensor *o, const fct_tensor *lse, const char *what) {
  const double tol = fct_tolerance(bp->c->dtype), lse_tol = fct_lse_tolerance(bp->c->dtype);
  size_t nan_o = 0, bad_empty = 0;
  double err_o = rel_l2_view(o, bp->ref_o, &nan_o), le2 = 0, lr2 = 0;
  int64_t b, n, h, x;
  char first[256] = "";
  for (b = 0; b < bp->B; b++)
    for (n = 0; n < bp->Nq; n++)
      for (h = 0; h < bp->Hq; h++) {
        const double r = bp->fp.ref_lse[(b * bp->Nq + n) * bp->Hq + h], g = fct_tensor_get(lse, b, n, h, 0);
        if (isinf(r)) {
          int zero = 1;
          for (x = 0; x < bp->D; x++) zero = zero && fct_tensor_get(o, b, n, h, x) == 0.0;
          if (!zero || !(isinf(g) && g < 0)) {
            if (!bad_empty++)
              snprintf(first, sizeof first, "row (b=%lld, n=%lld, h=%lld) sees no key: o[0]=%g lse=%g, want 0 and -inf",
                       (long long)b, (long long)n, (long long)h, fct_tensor_get(o, b, n, h, 0), g);
          }
          continue;
        }
        if (!isfinite(g)) {
          if (!bad_empty++)
            snprintf(first, sizeof first, "row (b=%lld, n=%lld, h=%lld): lse=%g, reference %.9g", (long long)b,
                     (long long)n, (long long)h, g, r);
          continue;
        }
        le2 += (g - r) * (g - r);
        lr2 += r * r;
      }
  FCT_CHECK(nan_o == 0, "%s (%s): %zu NaN in O", bp->desc, what, nan_o);
  FCT_CHECK(bad_empty == 0, "%s (%s): %zu bad row(s); first: %s", bp->desc, what, bad_empty, first);
  FCT_CHECK(err_o <= tol, "%s (%s): O relative L2 error %.3e > %.1e against the reference with the C Philox mask",
            bp->desc, what, err_o, tol);
  FCT_CHECK(lr2 == 0 || sqrt(le2 / lr2) <= lse_tol, "%s (%s): LSE relative L2 error %.3e > %.1e", bp->desc, what,
            sqrt(le2 / lr2), lse_tol);
  FCT_CHECK(fct_tensor_count_unpoisoned(o) == view_elems(o), "%s (%s): %zu elements of o's buffer written, view has %zu",
            bp->desc, what, fct_tensor_count_unpoisoned(o), view_elems(o));
  FCT_CHECK(fct_tensor_count_unpoisoned(lse) == view_elems(lse),
            "%s (%s): %zu elements of lse's buffer written, view has %zu", bp->desc, what,
            fct_tensor_count_unpoisoned(lse), view_elems(lse));
  print_message("    ok  %s %s: err_o=%.2e err_lse=%.2e\n", bp->desc, what, err_o, lr2 > 0 ? sqrt(le2 / lr2) : 0.0);
}

static void bwd_problem_create(bwd_problem *bp, const bwd_case *c, int need_backward) {
  fct_case fc;
  fct_rng rng;
  ref_attention_params rp;
  ref_tensor rq, rk, rv, ro, rdo;
  ref_out out_o, out_dq, out_dk, out_dv, mag_dq, mag_dk, mag_dv;
  int64_t b, n, h, x;
  double t0;

  memset(bp, 0, sizeof *bp);
  bp->c = c;
  memset(&fc, 0, sizeof fc);
  fc.dtype = c->dtype;
  fc.batch = c->batch;
  fc.seqlen_q = c->seqlen_q;
  fc.seqlen_k = c->seqlen_k;
  fc.heads_q = c->heads_q;
  fc.heads_kv = c->heads_kv;
  fc.head_dim = c->head_dim;
  fc.causal = c->causal;
  fc.scale = c->scale;
  fc.layout = c->layout;
  fc.num_seqs = c->num_seqs;
  fc.seqlens_q = c->seqlens_q;
  fc.seqlens_k = c->seqlens_k;
  fct_problem_create(&bp->fp, &fc);
  bp->B = bp->fp.B, bp->Nq = bp->fp.Nq, bp->Nk = bp->fp.Nk;
  bp->Hq = c->heads_q, bp->Hkv = c->heads_kv, bp->D = c->head_dim;

  /* Dropout seed and offset: fresh each run (from the run's seed), printed in the description. */
  snprintf(bp->desc, sizeof bp->desc, "%s", bp->fp.desc);
  fct_rng_init(&rng, bp->desc);
  (void)fct_rng_u64(&rng);
  bp->drop.p = c->dropout_p;
  if (c->dropout_p > 0.0f) {
    bp->drop.seed = fct_rng_u64(&rng);
    bp->drop.offset = c->offset_mode == OFS_CARRY ? 0xffffffffull - 3ull : fct_rng_u64(&rng) >> 1;
    appendf(bp->desc, sizeof bp->desc, " dropout_p=%g seed=0x%llx offset=0x%llx", (double)c->dropout_p,
            (unsigned long long)bp->drop.seed, (unsigned long long)bp->drop.offset);
  }

  for (b = 0; b < bp->B; b++)
    for (n = 0; n < bp->Nq; n++)
      for (h = 0; h < bp->Hq; h++) bp->empty_rows += isinf(bp->fp.ref_lse[(b * bp->Nq + n) * bp->Hq + h]) ? 1 : 0;

  /* Reference O with dropout (the problem's ref_o has none). */
  bp->ref_o = (double *)malloc((size_t)(bp->B * bp->Nq * bp->Hq * bp->D + 1) * sizeof(double));
  FCT_CHECK(bp->ref_o != NULL, "malloc failed");
  rp = bwd_ref_params(bp);
  rq = fct_tensor_ref(&bp->fp.q);
  rk = fct_tensor_ref(&bp->fp.k);
  rv = fct_tensor_ref(&bp->fp.v);
  out_o = ref_out_bnhd(bp->ref_o, bp->B, bp->Nq, bp->Hq, bp->D);
  t0 = now_s();
  FCT_CHECK(ref_attention_forward_dropout(&rp, &bp->drop, &rq, &rk, &rv, &out_o, NULL) == 0,
            "reference forward rejected the case: %s", bp->desc);
  bp->ref_seconds = now_s() - t0;
  if (!need_backward) return;

  /* dO, o and lse: the backward's other inputs. */
  fct_tensor_create(&bp->d_o, c->dtype, c->layout, bp->B, bp->Nq, bp->Hq, bp->D, 8);
  {
    char tag[800];
    snprintf(tag, sizeof tag, "%s|dO", bp->desc);
    fct_rng_init(&rng, tag);
  }
  fct_tensor_fill_random(&bp->d_o, &rng);
  fct_tensor_create(&bp->o, c->dtype, c->layout, bp->B, bp->Nq, bp->Hq, bp->D, 3);
  fct_tensor_create_lse(&bp->lse, c->layout, bp->B, bp->Nq, bp->Hq, 4);
  if (c->o_source != SRC_REF) {
    flashcl_algo algo = c->o_source == SRC_FWD_NAIVE ? FLASHCL_ALGO_NAIVE : FLASHCL_ALGO_FLASH;
    /* The flash forward supports dropout (src/portable/forward.c): no fallback to the naive
     * forward, an UNSUPPORTED answer fails the case. */
    flashcl_status st = bwd_device_forward(bp, algo, &bp->o, &bp->lse);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "forward (%s) producing the backward's o/lse: %s", fct_algo_str(algo),
                     bp->desc);
    check_forward_result(bp, &bp->o, &bp->lse, algo == FLASHCL_ALGO_NAIVE ? "naive forward for the backward"
                                                                          : "flash forward for the backward");
    appendf(bp->desc, sizeof bp->desc, " o/lse=device %s forward", fct_algo_str(algo));
  } else {
    for (b = 0; b < bp->B; b++)
      for (n = 0; n < bp->Nq; n++)
        for (h = 0; h < bp->Hq; h++) {
          const size_t row = (size_t)((b * bp->Nq + n) * bp->Hq + h);
          for (x = 0; x < bp->D; x++)
            fct_store(c->dtype, bp->o.host, fct_tensor_index(&bp->o, b, n, h, x), (float)bp->ref_o[row * bp->D + x]);
          fct_store(F32, bp->lse.host, fct_tensor_index(&bp->lse, b, n, h, 0), (float)bp->fp.ref_lse[row]);
        }
    upload(&bp->o);
    upload(&bp->lse);
  }

  /* Reference gradients from exactly the bytes the device reads (o included, for D). */
  bp->ref_dq = (double *)malloc((size_t)(bp->B * bp->Nq * bp->Hq * bp->D + 1) * sizeof(double));
  bp->ref_dk = (double *)malloc((size_t)(bp->B * bp->Nk * bp->Hkv * bp->D + 1) * sizeof(double));
  bp->ref_dv = (double *)malloc((size_t)(bp->B * bp->Nk * bp->Hkv * bp->D + 1) * sizeof(double));
  bp->mag[0] = (double *)malloc((size_t)(bp->B * bp->Nq * bp->Hq * bp->D + 1) * sizeof(double));
  bp->mag[1] = (double *)malloc((size_t)(bp->B * bp->Nk * bp->Hkv * bp->D + 1) * sizeof(double));
  bp->mag[2] = (double *)malloc((size_t)(bp->B * bp->Nk * bp->Hkv * bp->D + 1) * sizeof(double));
  FCT_CHECK(bp->ref_dq && bp->ref_dk && bp->ref_dv && bp->mag[0] && bp->mag[1] && bp->mag[2], "malloc failed");
  mag_dq = ref_out_bnhd(bp->mag[0], bp->B, bp->Nq, bp->Hq, bp->D);
  mag_dk = ref_out_bnhd(bp->mag[1], bp->B, bp->Nk, bp->Hkv, bp->D);
  mag_dv = ref_out_bnhd(bp->mag[2], bp->B, bp->Nk, bp->Hkv, bp->D);
  ro = fct_tensor_ref(&bp->o);
  rdo = fct_tensor_ref(&bp->d_o);
  out_dq = ref_out_bnhd(bp->ref_dq, bp->B, bp->Nq, bp->Hq, bp->D);
  out_dk = ref_out_bnhd(bp->ref_dk, bp->B, bp->Nk, bp->Hkv, bp->D);
  out_dv = ref_out_bnhd(bp->ref_dv, bp->B, bp->Nk, bp->Hkv, bp->D);
  t0 = now_s();
  FCT_CHECK(ref_attention_backward_mag(&rp, &bp->drop, &rq, &rk, &rv, &ro, &rdo, &out_dq, &out_dk, &out_dv, &mag_dq,
                                       &mag_dk, &mag_dv) == 0,
            "reference backward rejected the case: %s", bp->desc);
  bp->ref_seconds += now_s() - t0;
}

static void bwd_problem_release(bwd_problem *bp) {
  if (bp->d_o.host) fct_tensor_release(&bp->d_o);
  if (bp->o.host) fct_tensor_release(&bp->o);
  if (bp->lse.host) fct_tensor_release(&bp->lse);
  free(bp->ref_o);
  free(bp->ref_dq);
  free(bp->ref_dk);
  free(bp->ref_dv);
  free(bp->mag[0]);
  free(bp->mag[1]);
  free(bp->mag[2]);
  fct_problem_release(&bp->fp);
  memset(bp, 0, sizeof *bp);
}

/* ================================================================= runs == */

typedef struct bwd_result {
  fct_tensor dq, dk, dv;
  double err[3];
  double seconds;
} bwd_result;

static const char *GRAD_NAMES[3] = {"dq", "dk", "dv"};

static void run_str(flashcl_algo algo, int deterministic, char *buf, size_t cap) {
  if (algo == FLASHCL_ALGO_NAIVE)
    snprintf(buf, cap, "algo=naive");
  else
    snprintf(buf, cap, "algo=%s %s dQ", fct_algo_str(algo), deterministic ? "deterministic" : "atomic");
}

/* Rows that must be exactly zero whatever the rounding: dq rows that see no key
 * (reference LSE = -inf), and dk/dv rows of keys no query row sees (a key is seen
 * by the last query row of its sequence whenever the sequence has queries, causal
 * or not, so these are the keys of sequences with no queries). */
static unsigned char *structural_zero_rows(const bwd_problem *bp, int which) {
  const int64_t N = which == 0 ? bp->Nq : bp->Nk;
  unsigned char *z = (unsigned char *)calloc((size_t)(bp->B * N) + 1, 1);
  int64_t b, n, s;
  FCT_CHECK(z != NULL, "calloc failed");
  if (which == 0) {
    for (b = 0; b < bp->B; b++)
      for (n = 0; n < N; n++) z[b * N + n] = isinf(bp->fp.ref_lse[(b * N + n) * bp->Hq]) ? 1 : 0;
  } else if (bp->c->num_seqs > 0) {
    for (s = 0; s < bp->c->num_seqs; s++)
      if (bp->fp.cu_q_host[s + 1] == bp->fp.cu_q_host[s])
        for (n = bp->fp.cu_k_host[s]; n < bp->fp.cu_k_host[s + 1]; n++) z[n] = 1;
  }
  return z;
}

/* The rounding-noise allowance: 4 fp32 units of roundoff (the math is fp32 for
 * every dtype) times the reference's noise scale (ref_attention_backward_mag).
 * It is what lets gradients that are ~0 by cancellation pass (a row that sees a
 * single key has dS = P (dP - D) = 0, so with Nk = 1 dq and dk are pure rounding
 * noise: observed ~0.2 of the allowance over the long sweep). Elsewhere it adds
 * up to ~0.5 * tol in fp32 (printed as "dq_floor=..*tol" when above 1%) and
 * nothing noticeable for fp16/bf16. */
#define NOISE_ULPS 4.0
#define U32 5.9604644775390625e-8 /* 2^-24 */

/* Checks one gradient against the reference: no NaN, nothing written outside the
 * view, exact zeros on structural zero rows, and
 *   ||got - ref||_2 <= tol * ||ref||_2 + NOISE_ULPS * u32 * ||mag||_2.
 * Returns the relative L2 error; *floor gets the allowance relative to tol * ||ref||. */
static double check_grad(const bwd_problem *bp, const char *rs, int which, const fct_tensor *t, const double *ref,
                         double *floor_out) {
  const int64_t B = t->t.shape[0], N = t->t.shape[1], H = t->t.shape[2], D = t->t.shape[3];
  const double tol = fct_tolerance(bp->c->dtype);
  const char *name = GRAD_NAMES[which];
  unsigned char *zero_row = structural_zero_rows(bp, which);
  const double *mag = bp->mag[which];
  double e2 = 0, r2 = 0, m2 = 0, worst = -1, err, allow;
  size_t nan_count = 0, bad_zero = 0, written;
  int64_t b, n, h, x, wb = 0, wn = 0, wh = 0;
  char first_nan[256] = "", first_zero[256] = "";

  for (b = 0; b < B; b++)
    for (n = 0; n < N; n++)
      for (h = 0; h < H; h++) {
        const double *r = ref + ((b * N + n) * H + h) * D;
        double re2 = 0, rr2 = 0;
        int got_zero = 1;
        for (x = 0; x < D; x++) {
          const double g = fct_tensor_get(t, b, n, h, x);
          if (isnan(g)) {
            if (!nan_count++)
              snprintf(first_nan, sizeof first_nan, "first at (b=%lld, n=%lld, h=%lld, x=%lld), reference %.7g",
                       (long long)b, (long long)n, (long long)h, (long long)x, r[x]);
            got_zero = 0;
            continue;
          }
          got_zero = got_zero && g == 0.0;
          re2 += (g - r[x]) * (g - r[x]);
          rr2 += r[x] * r[x];
          m2 += mag[((b * N + n) * H + h) * D + x] * mag[((b * N + n) * H + h) * D + x];
        }
        if (zero_row[b * N + n] && !got_zero && !bad_zero++)
          snprintf(first_zero, sizeof first_zero, "row (b=%lld, n=%lld, h=%lld) %s, got [0]=%.7g", (long long)b,
                   (long long)n, (long long)h,
                   which == 0 ? "sees no key: dq must be exactly 0" : "is seen by no query: must be exactly 0",
                   fct_tensor_get(t, b, n, h, 0));
        e2 += re2;
        r2 += rr2;
        if (re2 > worst) worst = re2, wb = b, wn = n, wh = h;
      }
  free(zero_row);
  err = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
  allow = NOISE_ULPS * U32 * sqrt(m2);
  *floor_out = r2 > 0 ? allow / (tol * sqrt(r2)) : INFINITY;
  FCT_CHECK(nan_count == 0, "%s %s: %zu NaN in %s (%s)", bp->desc, rs, nan_count, name, first_nan);
  FCT_CHECK(bad_zero == 0, "%s %s: %zu %s row(s) not exactly 0; first: %s", bp->desc, rs, bad_zero, name, first_zero);
  FCT_CHECK(sqrt(e2) <= tol * sqrt(r2) + allow,
            "%s %s: %s relative L2 error %.3e > tolerance %.1e (+ rounding-noise allowance %.1e relative: %.0f fp32 "
            "ulps of the terms' size); worst row (b=%lld, n=%lld, h=%lld) holds %.0f%% of the error: got [0..1]=(%.7g, "
            "%.7g), reference (%.7g, %.7g)",
            bp->desc, rs, name, err, tol, r2 > 0 ? allow / sqrt(r2) : allow, NOISE_ULPS, (long long)wb, (long long)wn,
            (long long)wh, e2 > 0 ? 100.0 * worst / e2 : 0.0,
            fct_tensor_get(t, wb, wn, wh, 0), D > 1 ? fct_tensor_get(t, wb, wn, wh, 1) : 0.0,
            ref[((wb * N + wn) * H + wh) * D], D > 1 ? ref[((wb * N + wn) * H + wh) * D + 1] : 0.0);
  written = fct_tensor_count_unpoisoned(t);
  FCT_CHECK(written == view_elems(t), "%s %s: %zu elements of %s's buffer were written, its view has %zu", bp->desc, rs,
            written, name, view_elems(t));
  return err;
}

static void bwd_run(bwd_problem *bp, flashcl_algo algo, int deterministic, bwd_result *r) {
  const bwd_case *c = bp->c;
  flashcl_attention_desc desc;
  flashcl_status st;
  cl_event ev = NULL;
  char rs[96];

  run_str(algo, deterministic, rs, sizeof rs);
  memset(r, 0, sizeof *r);
  /* Fresh NaN-poisoned gradient buffers, with a poisoned guard after each view. */
  fct_tensor_create_guarded(&r->dq, c->dtype, c->layout, bp->B, bp->Nq, bp->Hq, bp->D, 5, FCT_OUTPUT_GUARD);
  fct_tensor_create_guarded(&r->dk, c->dtype, c->layout, bp->B, bp->Nk, bp->Hkv, bp->D, 6, FCT_OUTPUT_GUARD);
  fct_tensor_create_guarded(&r->dv, c->dtype, c->layout, bp->B, bp->Nk, bp->Hkv, bp->D, 7, FCT_OUTPUT_GUARD);
  bwd_desc(bp, algo, deterministic, &desc);
#ifdef FCT_BWD_MMA
  {
    /* Every case of this table must run the tensor-core kernels, not a silent
     * portable fallback. */
    flashcl_kernel_family fam = FLASHCL_KERNEL_AUTO;
    st = flashcl_attention_kernel_family(fct_env_get()->ctx, &desc, &bp->fp.q.t, &bp->fp.k.t, &bp->fp.v.t, &bp->o.t,
                                         FLASHCL_PASS_BACKWARD, &fam);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "flashcl_attention_kernel_family: %s %s", bp->desc, rs);
    FCT_CHECK(fam == FLASHCL_KERNEL_NVIDIA_MMA, "%s %s: the backward ran kernel family %d, not the tensor cores",
              bp->desc, rs, (int)fam);
  }
#endif
  r->seconds = now_s();
  st = flashcl_attention_backward(fct_env_get()->ctx, &desc, &bp->fp.q.t, &bp->fp.k.t, &bp->fp.v.t, &bp->o.t,
                                  &bp->lse.t, &bp->d_o.t, &r->dq.t, &r->dk.t, &r->dv.t, 0, NULL, &ev);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "flashcl_attention_backward: %s %s", bp->desc, rs);
  wait_event(ev, "flashcl_attention_backward", bp->desc);
  r->seconds = now_s() - r->seconds;
  fct_tensor_download(&r->dq);
  fct_tensor_download(&r->dk);
  fct_tensor_download(&r->dv);
  {
    double fl[3];
    char floors[96] = "";
    int i;
    r->err[0] = check_grad(bp, rs, 0, &r->dq, bp->ref_dq, &fl[0]);
    r->err[1] = check_grad(bp, rs, 1, &r->dk, bp->ref_dk, &fl[1]);
    r->err[2] = check_grad(bp, rs, 2, &r->dv, bp->ref_dv, &fl[2]);
    for (i = 0; i < 3; i++)
      if (fl[i] > 0.01) appendf(floors, sizeof floors, " %s_floor=%.2g*tol", GRAD_NAMES[i], fl[i]);
    print_message("    ok  %s %s: err dq=%.2e dk=%.2e dv=%.2e%s empty_rows=%zu (device %.2fs, ref %.2fs)\n", bp->desc,
                  rs, r->err[0], r->err[1], r->err[2], floors, bp->empty_rows, r->seconds, bp->ref_seconds);
  }
}

static void bwd_result_release(bwd_result *r) {
  fct_tensor_release(&r->dq);
  fct_tensor_release(&r->dk);
  fct_tensor_release(&r->dv);
}

static int same_bits(const fct_tensor *a, const fct_tensor *b) {
  return a->bytes == b->bytes && memcmp(a->host, b->host, a->bytes) == 0;
}

/* The table tests' cmocka teardown ends a case's tuning, so that a failed
 * check (cmocka longjmps out of the case) cannot leak it into the next case. */
static int bwd_table_teardown(void **state) {
  (void)state;
  g_tuning_on = 0;
  return 0;
}

#ifdef FCT_BWD_MMA
/* 1 if the default backward of bp runs the Hopper dK/dV kernel (the name
 * flashcl_attention_config reports). */
static int bwd_runs_wgmma(const bwd_problem *bp) {
  flashcl_attention_desc desc;
  flashcl_config cfg;
  bwd_desc(bp, FLASHCL_ALGO_FLASH, 0, &desc);
  flashcl_status st = flashcl_attention_config(fct_env_get()->ctx, &desc, &bp->fp.q.t, &bp->fp.k.t, &bp->fp.v.t,
                                               &bp->o.t, FLASHCL_PASS_BACKWARD, &cfg);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "flashcl_attention_config: %s", bp->desc);
  return strcmp(cfg.kernel, "bwd_dkdv_wgmma") == 0;
}
#endif

static void check_backward_case(const bwd_case *c) {
  bwd_problem bp;
  bwd_result det, other;
  bwd_problem_create(&bp, c, 1);
#ifdef FCT_BWD_MMA
#endif
  if (c->bwd_plan) bwd_tuning_plan(c->bwd_plan);
  if (c->runs & R_DET) {
    bwd_run(&bp, FLASHCL_ALGO_FLASH, 1, &det);
    if (c->runs & R_REPEAT) {
      /* deterministic = 1 promises bit-reproducible results. */
      bwd_run(&bp, FLASHCL_ALGO_FLASH, 1, &other);
      FCT_CHECK(same_bits(&det.dq, &other.dq) && same_bits(&det.dk, &other.dk) && same_bits(&det.dv, &other.dv),
                "%s: two deterministic flash backward calls differ (dq %s, dk %s, dv %s)", bp.desc,
                same_bits(&det.dq, &other.dq) ? "same" : "differs", same_bits(&det.dk, &other.dk) ? "same" : "differs",
                same_bits(&det.dv, &other.dv) ? "same" : "differs");
      print_message("    ok  %s: deterministic dQ mode is bit-reproducible\n", bp.desc);
      bwd_result_release(&other);
    }
    bwd_result_release(&det);
  }
#ifdef FCT_BWD_MMA
  if (c->runs & R_SPLIT) {
    static const char *const counts[2] = {"1", "3"};
    for (int i = 0; i < 2; i++) {
      const int n = atoi(counts[i]);
      flashcl_attention_desc desc;
      size_t bytes = 0, dq_elems = (size_t)bp.B * bp.Nq * bp.Hq * bp.D;
      bwd_tuning_begin(FLASHCL_TUNE_MMA_BWD);
      bwd_tuning_set("dq_splits", n);
      bwd_desc(&bp, FLASHCL_ALGO_FLASH, 1, &desc);
      /* The workspace shows that the split path is the one planned: D plus n
       * fp32 copies of dQ (the separate dQ kernel needs D only). */
      flashcl_status st = flashcl_attention_workspace_size(fct_env_get()->ctx, &desc, &bp.fp.q.t, &bp.fp.k.t,
                                                           &bp.fp.v.t, FLASHCL_PASS_BACKWARD, &bytes);
      if (st == FLASHCL_SUCCESS && bytes >= (size_t)n * dq_elems * sizeof(float)) {
        bwd_run(&bp, FLASHCL_ALGO_FLASH, 1, &det);
        bwd_run(&bp, FLASHCL_ALGO_FLASH, 1, &other);
      }
      g_tuning_on = 0;
      FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "flashcl_attention_workspace_size: %s", bp.desc);
      FCT_CHECK(bytes >= (size_t)n * dq_elems * sizeof(float),
                "%s: with mma_bwd dq_splits=%d the deterministic backward plans %zu bytes of scratch, not the %d "
                "dQ accumulators of the split path",
                bp.desc, n, bytes, n);
      FCT_CHECK(same_bits(&det.dq, &other.dq) && same_bits(&det.dk, &other.dk) && same_bits(&det.dv, &other.dv),
                "%s: two deterministic backward calls with %d dQ splits differ (dq %s, dk %s, dv %s)", bp.desc, n,
                same_bits(&det.dq, &other.dq) ? "same" : "differs", same_bits(&det.dk, &other.dk) ? "same" : "differs",
                same_bits(&det.dv, &other.dv) ? "same" : "differs");
      print_message("    ok  %s: deterministic dQ in %d split accumulator(s) is bit-reproducible\n", bp.desc, n);
      bwd_result_release(&det);
      bwd_result_release(&other);
    }
  }
  if (bwd_runs_wgmma(&bp)) {
    /* On Hopper the default is bwd_dkdv_wgmma: the mma.sync kernel it replaces
     * stays reachable through the mma_bwd tuning and is checked too (where its
     * atomic dQ has no tile for the head dim, the call runs deterministic). */
    print_message("    ok  %s: bwd_dkdv_wgmma by default; bwd_dkdv_mma through mma_bwd wgmma=0\n", bp.desc);
    for (int det_mode = 1; det_mode >= 0; det_mode--) {
      if (!(c->runs & (det_mode ? R_DET : R_ATOMIC))) continue;
      bwd_tuning_begin(FLASHCL_TUNE_MMA_BWD);
      bwd_tuning_set("wgmma", 0);
      bwd_run(&bp, FLASHCL_ALGO_FLASH, det_mode, &other);
      g_tuning_on = 0;
      bwd_result_release(&other);
    }
  }
  if ((c->runs & R_ATOMIC) && (c->runs & R_REPEAT)) {
    /* mma_bwd atomic_dq = 0: a call that permits the atomic dQ runs the
     * deterministic kernels, says so, and gives the same bits every run. */
    flashcl_attention_desc desc;
    flashcl_config cfg;
    int ran = -1;
    bwd_tuning_begin(FLASHCL_TUNE_MMA_BWD);
    bwd_tuning_set("atomic_dq", 0);
    bwd_desc(&bp, FLASHCL_ALGO_FLASH, 0, &desc);
    FCT_CHECK_STATUS(flashcl_attention_config(fct_env_get()->ctx, &desc, &bp.fp.q.t, &bp.fp.k.t, &bp.fp.v.t, &bp.o.t,
                                              FLASHCL_PASS_BACKWARD, &cfg),
                     FLASHCL_SUCCESS, "config with atomic_dq=0: %s", bp.desc);
    FCT_CHECK(flashcl_tuning_get(&cfg.tuning, "atomic_dq", &ran) == FLASHCL_SUCCESS && ran == 0,
              "%s: atomic_dq=0 reported as %d", bp.desc, ran);
    bwd_run(&bp, FLASHCL_ALGO_FLASH, 0, &det);
    bwd_run(&bp, FLASHCL_ALGO_FLASH, 0, &other);
    g_tuning_on = 0;
    FCT_CHECK(same_bits(&det.dq, &other.dq) && same_bits(&det.dk, &other.dk) && same_bits(&det.dv, &other.dv),
              "%s: two atomic-mode calls with atomic_dq=0 differ", bp.desc);
    print_message("    ok  %s: atomic mode with mma_bwd atomic_dq=0 runs the deterministic dQ, bit-reproducible\n",
                  bp.desc);
    bwd_result_release(&det);
    bwd_result_release(&other);
  }
  if ((c->runs & R_ATOMIC) && bwd_runs_wgmma(&bp)) {
    /* On Hopper the rule sends atomic-mode calls at most head dims to the
     * deterministic kernels: the atomic dQ kernels are checked through
     * atomic_dq = 1. */
    bwd_tuning_begin(FLASHCL_TUNE_MMA_BWD);
    bwd_tuning_set("atomic_dq", 1);
    bwd_run(&bp, FLASHCL_ALGO_FLASH, 0, &other);
    g_tuning_on = 0;
    bwd_result_release(&other);
  }
#endif
  if (c->runs & R_ATOMIC) {
    bwd_run(&bp, FLASHCL_ALGO_FLASH, 0, &other);
    bwd_result_release(&other);
  }
  if (c->runs & R_NAIVE) {
    bwd_run(&bp, FLASHCL_ALGO_NAIVE, 1, &other);
    bwd_result_release(&other);
  }
  g_tuning_on = 0;
  bwd_problem_release(&bp);
}

/* The forward with dropout, naive and flash, against the reference. */
static void check_forward_dropout_case(const bwd_case *c) {
  bwd_problem bp;
  int a;
  bwd_problem_create(&bp, c, 0);
  for (a = 0; a < 2; a++) {
    const flashcl_algo algo = a == 0 ? FLASHCL_ALGO_NAIVE : FLASHCL_ALGO_FLASH;
    fct_tensor o, lse;
    flashcl_status st;
    char what[64];
    fct_tensor_create_guarded(&o, c->dtype, c->layout, bp.B, bp.Nq, bp.Hq, bp.D, 3, FCT_OUTPUT_GUARD);
    fct_tensor_create_lse_guarded(&lse, c->layout, bp.B, bp.Nq, bp.Hq, 4, FCT_OUTPUT_GUARD);
    st = bwd_device_forward(&bp, algo, &o, &lse);
    /* Both forwards support dropout: any other status (UNSUPPORTED included) fails. */
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "flashcl_attention_forward (%s) with dropout: %s", fct_algo_str(algo),
                     bp.desc);
    snprintf(what, sizeof what, "%s forward", fct_algo_str(algo));
    check_forward_result(&bp, &o, &lse, what);
    fct_tensor_release(&o);
    fct_tensor_release(&lse);
  }
  bwd_problem_release(&bp);
}

#ifdef FCT_BWD_MMA
/* Set by mma_probe (the first test, or the first table case when a filter left
 * the first test out): 1 runs, 0 refused, -1 not probed yet, -2 the probe failed. */
static int mma_available = -1;
static void mma_probe(void);
#endif

static void run_table_test(void **state) {
  const bwd_case *c = (const bwd_case *)*state;
  FCT_CHECK(c != NULL, "test without a case");
#ifdef FCT_BWD_MMA
  if (mma_available == -1) mma_probe();
  if (mma_available != 1) {
    /* A failure on an NVIDIA device of compute capability >= 8.0, else a skip. */
    fct_mma_unavailable(fct_env_get()->device, c->name,
                        mma_available < 0 ? "the availability probe failed" : "the device has no tensor-core path");
    FCT_SKIP();
  }
#endif
  if (c->kind == K_FWD_DROPOUT)
    check_forward_dropout_case(c);
  else
    check_backward_case(c);
}

#ifndef FCT_BWD_LONG
/* ========================================================= dropout mask == */

static unsigned char *device_mask(const flashcl_attention_desc *desc, int B, int H, int nq, int nk) {
  fct_env *env = fct_env_get();
  const size_t n = (size_t)B * H * nq * nk;
  unsigned char *host = (unsigned char *)malloc(n + 1);
  cl_mem buf;
  cl_event ev = NULL;
  cl_int err;
  flashcl_status st;
  FCT_CHECK(host != NULL, "malloc(%zu) failed", n);
  memset(host, 0xAB, n); /* neither 0 nor 1 */
  buf = fct_create_buffer(n, host);
  st = flashcl_dropout_mask(env->ctx, desc, B, H, nq, nk, buf, 0, NULL, &ev);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "flashcl_dropout_mask(B=%d H=%d Nq=%d Nk=%d p=%g seed=0x%llx offset=0x%llx)",
                   B, H, nq, nk, (double)desc->dropout.p, (unsigned long long)desc->dropout.seed,
                   (unsigned long long)desc->dropout.offset);
  wait_event(ev, "flashcl_dropout_mask", "");
  err = clEnqueueReadBuffer(env->queue, buf, CL_TRUE, 0, n, host, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueReadBuffer(mask) failed: %d", (int)err);
  clReleaseMemObject(buf);
  return host;
}

static void mask_desc(flashcl_attention_desc *desc, float p, uint64_t seed, uint64_t offset) {
  flashcl_attention_desc_init(desc);
  desc->dropout.p = p;
  desc->dropout.seed = seed;
  desc->dropout.offset = offset;
}

/* The device mask equals the C Philox mask bit for bit: odd shapes (columns not
 * a multiple of 4), 64-bit seeds, offsets where t = b*H + h + offset carries into
 * its high word, and p = 0 (everything kept). */
static void test_dropout_mask_matches_c_philox(void **state) {
  fct_rng rng;
  int t;
  (void)state;
  fct_rng_init(&rng, "dropout_mask_matches_c_philox");
  for (t = 0; t < 5; t++) {
    const int B = 2, H = 3, nq = 37, nk = t == 4 ? 1 : 45;
    const float p = t == 1 ? 0.5f : t == 3 ? 0.0f : 0.1f;
    const uint64_t seed = fct_rng_u64(&rng);
    const uint64_t offset = t == 2 ? 0xffffffffull - 2 : t == 3 ? 0xfffffffffffffffeull : fct_rng_u64(&rng);
    const size_t n = (size_t)B * H * nq * nk;
    flashcl_attention_desc desc;
    unsigned char *got, *want = (unsigned char *)malloc(n);
    size_t i, diff = 0, first = 0, kept = 0;
    FCT_CHECK(want != NULL, "malloc failed");
    mask_desc(&desc, p, seed, offset);
    got = device_mask(&desc, B, H, nq, nk);
    philox_ref_mask(seed, offset, p, B, H, nq, nk, want);
    for (i = 0; i < n; i++) {
      if (got[i] != want[i] && !diff++) first = i;
      kept += want[i];
    }
    FCT_CHECK(diff == 0,
              "dropout mask (B=%d H=%d Nq=%d Nk=%d p=%g seed=0x%llx offset=0x%llx): %zu of %zu entries differ from the "
              "C Philox; first at (bh=%zu, i=%zu, j=%zu): device %d, C %d",
              B, H, nq, nk, (double)p, (unsigned long long)seed, (unsigned long long)offset, diff, n,
              first / ((size_t)nq * nk), first / nk % nq, first % nk, (int)got[first], (int)want[first]);
    if (p == 0.0f) FCT_CHECK(kept == n, "p = 0 must keep everything, the C mask keeps %zu of %zu", kept, n);
    print_message("    ok  mask B=%d H=%d Nq=%d Nk=%d p=%g seed=0x%llx offset=0x%llx: bit-exact, kept %zu/%zu\n", B, H, nq,
                  nk, (double)p, (unsigned long long)seed, (unsigned long long)offset, kept, n);
    free(got);
    free(want);
  }
}

/* Kept fraction within 4 sigma of 1 - p on 2 x 4 x 128 x 128 entries, and within
 * 5 sigma for each of the four Philox output words (columns with the same j & 3). */
static void test_dropout_mask_statistics(void **state) {
  static const float ps[2] = {0.1f, 0.5f};
  const int B = 2, H = 4, nq = 128, nk = 128;
  const size_t n = (size_t)B * H * nq * nk;
  fct_rng rng;
  int t;
  (void)state;
  fct_rng_init(&rng, "dropout_mask_statistics");
  for (t = 0; t < 2; t++) {
    const double p = (double)ps[t];
    flashcl_attention_desc desc;
    unsigned char *m;
    size_t i, kept = 0, lane[4] = {0, 0, 0, 0};
    double frac, sigma;
    int l;
    mask_desc(&desc, ps[t], fct_rng_u64(&rng), fct_rng_u64(&rng));
    m = device_mask(&desc, B, H, nq, nk);
    for (i = 0; i < n; i++) {
      FCT_CHECK(m[i] <= 1, "mask byte %zu is %d, want 0 or 1", i, (int)m[i]);
      kept += m[i];
      lane[i % nk % 4] += m[i];
    }
    frac = (double)kept / (double)n;
    sigma = sqrt(p * (1 - p) / (double)n);
    FCT_CHECK(fabs(frac - (1 - p)) <= 4 * sigma,
              "p=%g seed=0x%llx offset=0x%llx: kept fraction %.5f, expected %.5f +- %.5f (4 sigma)", p,
              (unsigned long long)desc.dropout.seed, (unsigned long long)desc.dropout.offset, frac, 1 - p, 4 * sigma);
    for (l = 0; l < 4; l++) { /* 5 sigma: eight more checks should not make the test flaky */
      const double lf = (double)lane[l] / (double)(n / 4), ls = sqrt(p * (1 - p) / (double)(n / 4));
      FCT_CHECK(fabs(lf - (1 - p)) <= 5 * ls,
                "p=%g seed=0x%llx: columns j %% 4 == %d (Philox word %d) keep %.5f, expected %.5f +- %.5f (5 sigma)", p,
                (unsigned long long)desc.dropout.seed, l, l, lf, 1 - p, 5 * ls);
    }
    print_message("    ok  p=%g: kept %.5f (expected %.5f, 4 sigma %.5f) over %zu entries\n", p, frac, 1 - p, 4 * sigma, n);
    free(m);
  }
}

/* Different seeds (also in the high word only) and offsets give different masks,
 * with the disagreement rate of independent masks, 2p(1-p) (5 sigma); and offset + 1 shifts
 * the streams: the mask of (b, h) at offset o + 1 is the mask of stream
 * b*H + h + 1 at offset o. */
static void test_dropout_mask_seed_offset(void **state) {
  const int B = 2, H = 4, nq = 64, nk = 64;
  const size_t n = (size_t)B * H * nq * nk, per = (size_t)nq * nk;
  const float p = 0.5f;
  fct_rng rng;
  uint64_t seed, offset;
  flashcl_attention_desc desc;
  unsigned char *base, *other;
  size_t i, diff;
  double expect = 2.0 * p * (1 - p), sigma = sqrt(expect * (1 - expect) / (double)n);
  int v;
  (void)state;
  fct_rng_init(&rng, "dropout_mask_seed_offset");
  seed = fct_rng_u64(&rng);
  offset = fct_rng_u64(&rng) >> 1;
  mask_desc(&desc, p, seed, offset);
  base = device_mask(&desc, B, H, nq, nk);
  for (v = 0; v < 4; v++) {
    const char *what = v == 0 ? "seed + 1" : v == 1 ? "seed ^ (1 << 40) (high word)" : v == 2 ? "offset + 1000" : "offset + 2^32";
    if (v == 0) mask_desc(&desc, p, seed + 1, offset);
    if (v == 1) mask_desc(&desc, p, seed ^ (1ull << 40), offset);
    if (v == 2) mask_desc(&desc, p, seed, offset + 1000);
    if (v == 3) mask_desc(&desc, p, seed, offset + (1ull << 32));
    other = device_mask(&desc, B, H, nq, nk);
    for (i = 0, diff = 0; i < n; i++) diff += base[i] != other[i];
    FCT_CHECK(fabs((double)diff / n - expect) <= 5 * sigma,
              "%s: masks differ in %.4f of entries, independent masks differ in %.4f +- %.4f (5 sigma; seed 0x%llx "
              "offset 0x%llx)",
              what, (double)diff / n, expect, 5 * sigma, (unsigned long long)seed, (unsigned long long)offset);
    print_message("    ok  %s: %.4f of entries differ (expected %.4f)\n", what, (double)diff / n, expect);
    free(other);
  }
  /* Stream shift. */
  mask_desc(&desc, p, seed, offset + 1);
  other = device_mask(&desc, B, H, nq, nk);
  diff = 0;
  for (i = 0; i + per < n; i++) diff += other[i] != base[i + per];
  FCT_CHECK(diff == 0,
            "offset + 1 must shift the streams by one (t = b*heads_q + h + offset): %zu entries of stream s at offset+1 "
            "differ from stream s+1 at offset",
            diff);
  for (i = 0, diff = 0; i < per; i++) diff += other[i] != base[i];
  FCT_CHECK(diff > 0, "offset + 1 left stream 0 unchanged");
  free(other);
  free(base);
  print_message("    ok  offset + 1 shifts the (b, h) streams by one\n");
}

/* flashcl_dropout_mask's own error paths: the exact status, and the output
 * buffer, filled with 0xAB (neither 0 nor 1) before every call, left untouched. */
static void expect_mask_error(const flashcl_attention_desc *desc, int B, int H, int nq, int nk, cl_mem buf,
                              size_t bytes, flashcl_status expected, const char *what) {
  fct_env *env = fct_env_get();
  unsigned char *host = (unsigned char *)malloc(bytes);
  cl_event ev = NULL;
  flashcl_status st;
  cl_int err;
  size_t i, changed = 0;
  FCT_CHECK(host != NULL, "malloc(%zu) failed", bytes);
  memset(host, 0xAB, bytes);
  err = clEnqueueWriteBuffer(env->queue, buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueWriteBuffer(mask poison) failed: %d", (int)err);
  st = flashcl_dropout_mask(env->ctx, desc, B, H, nq, nk, buf, 0, NULL, &ev);
  if (st == FLASHCL_SUCCESS && ev) {
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
  }
  fct_finish();
  memset(host, 0, bytes);
  err = clEnqueueReadBuffer(env->queue, buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueReadBuffer(mask) failed: %d", (int)err);
  for (i = 0; i < bytes; i++) changed += host[i] != 0xAB;
  free(host);
  FCT_CHECK_STATUS(st, expected, "flashcl_dropout_mask with %s", what);
  FCT_CHECK(ev == NULL, "flashcl_dropout_mask with %s failed but set *out_event", what);
  FCT_CHECK(changed == 0, "flashcl_dropout_mask with %s failed with %s but changed %zu of the %zu output bytes", what,
            flashcl_status_string(st), changed, bytes);
}

static void test_dropout_mask_errors(void **state) {
  flashcl_attention_desc desc;
  cl_mem small = fct_create_buffer(100, NULL);
  (void)state;
  mask_desc(&desc, 0.1f, 1, 2);
  expect_mask_error(&desc, 1, 1, 10, 11, small, 100, FLASHCL_ERROR_BUFFER_TOO_SMALL, "a 110-entry mask in a 100-byte buffer");
  expect_mask_error(&desc, 1, 1, 0, 10, small, 100, FLASHCL_ERROR_INVALID_SHAPE, "seqlen_q = 0");
  desc.dropout.p = 1.0f;
  expect_mask_error(&desc, 1, 1, 5, 5, small, 100, FLASHCL_ERROR_INVALID_ARGUMENT, "dropout_p = 1");
  expect_mask_error(NULL, 1, 1, 5, 5, small, 100, FLASHCL_ERROR_INVALID_ARGUMENT, "desc = NULL");
  print_message("    ok  every error path returned its status and left the 100-byte mask buffer untouched\n");
  clReleaseMemObject(small);
}

/* ============================================================ host only == */

/* Random123's known answers for Philox4x32-10, and the threshold rule. */
static void test_philox_known_answers(void **state) {
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
      {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du, 0x41c83b0eu,
       0xa20bc7c6u, 0x6d5451fdu},
      {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u, 0x94fdccebu,
       0x5001e420u, 0x24126ea1u},
  };
  int t, w;
  (void)state;
  for (t = 0; t < 3; t++) {
    uint32_t out[4];
    philox_ref_4x32_10(kat[t], kat[t] + 4, out);
    for (w = 0; w < 4; w++)
      FCT_CHECK(out[w] == kat[t][6 + w], "Philox4x32-10 known answer %d word %d: got 0x%08x, want 0x%08x", t, w,
                out[w], kat[t][6 + w]);
  }
  FCT_CHECK(philox_ref_threshold(0.0f) == 0, "threshold(0)");
  FCT_CHECK(philox_ref_threshold(0.5f) == 0x80000000u, "threshold(0.5) = 0x%08x", philox_ref_threshold(0.5f));
  FCT_CHECK(philox_ref_threshold(0.1f) == 429496736u, "threshold(0.1f) = %u, want floor(0.1f * 2^32) = 429496736",
            philox_ref_threshold(0.1f));
  FCT_CHECK(philox_ref_threshold(0.99999994f) == 0xffffff00u, "threshold(1 - 2^-24) = 0x%08x",
            philox_ref_threshold(0.99999994f));
}

/* Central differences of L = sum(dO * O(q, k, v)), the CPU reference forward in
 * double, against the CPU reference backward. Inputs are fp32 values. */
typedef struct fd_shape {
  const char *what;
  int B, nq, nk, hq, hkv, d, causal;
  double scale;
  float p;
  int num_seqs;
  const int *lq, *lk;
} fd_shape;

static double fd_loss(const ref_attention_params *rp, const ref_dropout *dr, const ref_tensor *q, const ref_tensor *k,
                      const ref_tensor *v, const double *d_o, double *o_buf) {
  ref_out o = ref_out_bnhd(o_buf, q->shape[0], q->shape[1], q->shape[2], q->shape[3]);
  const size_t n = (size_t)(q->shape[0] * q->shape[1] * q->shape[2] * q->shape[3]);
  double l = 0;
  size_t i;
  if (ref_attention_forward_dropout(rp, dr, q, k, v, &o, NULL) != 0) return NAN;
  for (i = 0; i < n; i++) l += d_o[i] * o_buf[i];
  return l;
}

static void fd_check(const fd_shape *s) {
  int32_t cu_q[8], cu_k[8];
  const int varlen = s->num_seqs > 0;
  int64_t B = s->B, Nq = s->nq, Nk = s->nk, i;
  size_t nqe, nke, t;
  double *q, *k, *v, *d_o, *o, *dq, *dk, *dv, *dq2, *dk2, *dv2;
  double *xs[3], *gs[3];
  size_t ns[3];
  ref_attention_params rp;
  ref_dropout dr;
  ref_tensor rq, rk, rv, rdo, ro;
  ref_out oq, ok, ov;
  fct_rng rng;
  const double h = 1e-6;
  int g, seg;

  if (varlen) {
    cu_q[0] = cu_k[0] = 0;
    for (seg = 0; seg < s->num_seqs; seg++) cu_q[seg + 1] = cu_q[seg] + s->lq[seg], cu_k[seg + 1] = cu_k[seg] + s->lk[seg];
    B = 1, Nq = cu_q[s->num_seqs], Nk = cu_k[s->num_seqs];
  }
  nqe = (size_t)(B * Nq * s->hq * s->d);
  nke = (size_t)(B * Nk * s->hkv * s->d);
  q = (double *)malloc(nqe * sizeof(double)), d_o = (double *)malloc(nqe * sizeof(double));
  o = (double *)malloc(nqe * sizeof(double)), dq = (double *)malloc(nqe * sizeof(double));
  dq2 = (double *)malloc(nqe * sizeof(double));
  k = (double *)malloc(nke * sizeof(double)), v = (double *)malloc(nke * sizeof(double));
  dk = (double *)malloc(nke * sizeof(double)), dv = (double *)malloc(nke * sizeof(double));
  dk2 = (double *)malloc(nke * sizeof(double)), dv2 = (double *)malloc(nke * sizeof(double));
  FCT_CHECK(q && d_o && o && dq && dq2 && k && v && dk && dv && dk2 && dv2, "malloc failed");
  fct_rng_init(&rng, s->what);
  for (t = 0; t < nqe; t++) q[t] = (float)fct_rng_normal(&rng), d_o[t] = (float)fct_rng_normal(&rng);
  for (t = 0; t < nke; t++) k[t] = (float)fct_rng_normal(&rng), v[t] = (float)fct_rng_normal(&rng);

  memset(&rp, 0, sizeof rp);
  rp.scale = s->scale;
  rp.causal = s->causal;
  if (varlen) rp.cu_seqlens_q = cu_q, rp.cu_seqlens_k = cu_k, rp.num_seqs = s->num_seqs;
  dr.p = s->p;
  dr.seed = fct_rng_u64(&rng);
  dr.offset = fct_rng_u64(&rng);
  rq = ref_tensor_bnhd(q, B, Nq, s->hq, s->d);
  rk = ref_tensor_bnhd(k, B, Nk, s->hkv, s->d);
  rv = ref_tensor_bnhd(v, B, Nk, s->hkv, s->d);
  rdo = ref_tensor_bnhd(d_o, B, Nq, s->hq, s->d);
  oq = ref_out_bnhd(dq, B, Nq, s->hq, s->d);
  ok = ref_out_bnhd(dk, B, Nk, s->hkv, s->d);
  ov = ref_out_bnhd(dv, B, Nk, s->hkv, s->d);
  FCT_CHECK(ref_attention_backward(&rp, &dr, &rq, &rk, &rv, NULL, &rdo, &oq, &ok, &ov) == 0,
            "reference backward rejected %s", s->what);
  /* Passing the forward's O explicitly must give the same gradients. */
  FCT_CHECK(!isnan(fd_loss(&rp, &dr, &rq, &rk, &rv, d_o, o)), "reference forward rejected %s", s->what);
  ro = ref_tensor_bnhd(o, B, Nq, s->hq, s->d);
  oq.data = dq2, ok.data = dk2, ov.data = dv2;
  FCT_CHECK(ref_attention_backward(&rp, &dr, &rq, &rk, &rv, &ro, &rdo, &oq, &ok, &ov) == 0, "reference backward");
  for (t = 0; t < nqe; t++) FCT_CHECK(fabs(dq[t] - dq2[t]) <= 1e-12 * (1 + fabs(dq[t])), "%s: dq with o given", s->what);
  for (t = 0; t < nke; t++)
    FCT_CHECK(fabs(dk[t] - dk2[t]) <= 1e-12 * (1 + fabs(dk[t])) && dv[t] == dv2[t], "%s: dk/dv with o given", s->what);

  xs[0] = q, xs[1] = k, xs[2] = v;
  gs[0] = dq, gs[1] = dk, gs[2] = dv;
  ns[0] = nqe, ns[1] = nke, ns[2] = nke;
  for (g = 0; g < 3; g++) {
    double e2 = 0, r2 = 0, worst = 0;
    size_t wi = 0;
    for (t = 0; t < ns[g]; t++) {
      const double x0 = xs[g][t];
      double lp, lm, num;
      xs[g][t] = x0 + h;
      lp = fd_loss(&rp, &dr, &rq, &rk, &rv, d_o, o);
      xs[g][t] = x0 - h;
      lm = fd_loss(&rp, &dr, &rq, &rk, &rv, d_o, o);
      xs[g][t] = x0;
      num = (lp - lm) / (2 * h);
      e2 += (num - gs[g][t]) * (num - gs[g][t]);
      r2 += num * num;
      if (fabs(num - gs[g][t]) > worst) worst = fabs(num - gs[g][t]), wi = t;
    }
    FCT_CHECK(r2 > 0 && sqrt(e2 / r2) <= 1e-6,
              "%s: reference %s differs from central differences: relative L2 %.3e (worst element %zu: analytic %.10g, "
              "numeric error %.3e)",
              s->what, GRAD_NAMES[g], r2 > 0 ? sqrt(e2 / r2) : -1.0, wi, gs[g][wi], worst);
    print_message("    ok  %s: %s vs finite differences: relative L2 %.2e\n", s->what, GRAD_NAMES[g], sqrt(e2 / r2));
  }
  /* Rows that see no key: dq exactly 0. Per sequence (the whole batch entry when
   * not varlen), causal is bottom-right aligned, so the first nq - nk rows see no
   * key (all rows when nk == 0); the reference LSE must be -inf exactly there. */
  {
    const int nseg = varlen ? s->num_seqs : 1;
    double *lse = (double *)malloc((size_t)(B * Nq * s->hq + 1) * sizeof(double));
    ref_out olse = ref_out_bnhd(lse, B, Nq, s->hq, 1), oo = ref_out_bnhd(o, B, Nq, s->hq, s->d);
    size_t checked = 0, lse_empty = 0;
    FCT_CHECK(lse != NULL, "malloc failed");
    FCT_CHECK(ref_attention_forward_dropout(&rp, &dr, &rq, &rk, &rv, &oo, &olse) == 0, "reference forward (lse) %s",
              s->what);
    for (t = 0; t < (size_t)(B * Nq * s->hq); t++) lse_empty += isinf(lse[t]) ? 1 : 0;
    for (seg = 0; seg < nseg; seg++) {
      const int64_t q0 = varlen ? cu_q[seg] : 0, nq = varlen ? s->lq[seg] : Nq, nk = varlen ? s->lk[seg] : Nk;
      const int64_t n_empty = nk == 0 ? nq : (s->causal && nq > nk ? nq - nk : 0);
      int64_t b2, hh, x;
      for (i = 0; i < n_empty; i++)
        for (b2 = 0; b2 < B; b2++)
          for (hh = 0; hh < s->hq; hh++) {
            const size_t row = (size_t)((b2 * Nq + q0 + i) * s->hq + hh);
            FCT_CHECK(isinf(lse[row]) && lse[row] < 0, "%s: row %lld of sequence %d (b=%lld, h=%lld) sees no key but "
                      "the reference LSE is %g", s->what, (long long)(q0 + i), seg, (long long)b2, (long long)hh,
                      lse[row]);
            for (x = 0; x < s->d; x++)
              FCT_CHECK(dq[row * s->d + x] == 0.0, "%s: dq of row %lld (sequence %d, b=%lld, h=%lld; no key) is %g, "
                        "not 0", s->what, (long long)(q0 + i), seg, (long long)b2, (long long)hh, dq[row * s->d + x]);
            checked++;
          }
    }
    FCT_CHECK(checked == lse_empty, "%s: %zu (row, head) pairs see no key by the causal rule, the reference LSE has %zu",
              s->what, checked, lse_empty);
    if (checked) print_message("    ok  %s: dq exactly 0 on the %zu (row, head) pairs that see no key\n", s->what, checked);
    free(lse);
  }
  free(q), free(k), free(v), free(d_o), free(o), free(dq), free(dk), free(dv), free(dq2), free(dk2), free(dv2);
}

static void test_reference_finite_differences(void **state) {
  static const int lq[3] = {2, 0, 3}, lk[3] = {3, 2, 1};
  static const fd_shape shapes[] = {
      {"fd B=1 H=1 N=5 d=8", 1, 5, 5, 1, 1, 8, 0, 0.0, 0.0f, 0, NULL, NULL},
      {"fd B=2 Hq=2 Hkv=1 Nq=6 Nk=4 d=8 causal scale=0.7 dropout=0.3", 2, 6, 4, 2, 1, 8, 1, 0.7, 0.3f, 0, NULL, NULL},
      {"fd varlen q={2,0,3} k={3,2,1} Hq=2 Hkv=2 d=8 causal dropout=0.2", 1, 0, 0, 2, 2, 8, 1, 0.0, 0.2f, 3, lq, lk},
  };
  size_t i;
  (void)state;
  for (i = 0; i < sizeof shapes / sizeof shapes[0]; i++) fd_check(&shapes[i]);
}

/* ========================================================= error paths == */

typedef struct err_fixture {
  bwd_case c;
  bwd_problem bp;
  fct_tensor dq, dk, dv;
} err_fixture;

static void err_fixture_create(err_fixture *f) {
  static const bwd_case c = BWD("errors", F32, 1, 8, 8, 2, 1, 32, 0, 0.0f, 0);
  memset(f, 0, sizeof *f);
  f->c = c;
  bwd_problem_create(&f->bp, &f->c, 1);
  fct_tensor_create(&f->dq, F32, FCT_BNHD, 1, 8, 2, 32, 5);
  fct_tensor_create(&f->dk, F32, FCT_BNHD, 1, 8, 1, 32, 6);
  fct_tensor_create(&f->dv, F32, FCT_BNHD, 1, 8, 1, 32, 7);
}

static void err_fixture_release(err_fixture *f) {
  fct_tensor_release(&f->dq);
  fct_tensor_release(&f->dk);
  fct_tensor_release(&f->dv);
  bwd_problem_release(&f->bp);
}

/* Calls the backward, expects `expected`, and checks that the poisoned gradient
 * buffers are bit-for-bit unchanged. */
static void expect_backward_error(err_fixture *f, const flashcl_attention_desc *desc, const fct_tensor *lse,
                                  const fct_tensor *d_o, const fct_tensor *dq, const fct_tensor *dk,
                                  const fct_tensor *dv, flashcl_status expected, const char *what) {
  fct_env *env = fct_env_get();
  cl_event ev = NULL;
  const fct_tensor *outs[3];
  flashcl_status st;
  int i;
  outs[0] = dq, outs[1] = dk, outs[2] = dv;
  st = flashcl_attention_backward(env->ctx, desc, &f->bp.fp.q.t, &f->bp.fp.k.t, &f->bp.fp.v.t, &f->bp.o.t,
                                  lse ? &lse->t : NULL, d_o ? &d_o->t : NULL, &dq->t, &dk->t, &dv->t, 0, NULL, &ev);
  if (st == FLASHCL_SUCCESS && ev) clWaitForEvents(1, &ev);
  if (ev && st == FLASHCL_SUCCESS) clReleaseEvent(ev);
  FCT_CHECK_STATUS(st, expected, "backward with %s (algo=%s)", what, fct_algo_str(desc->algorithm.algo));
  FCT_CHECK(flashcl_context_last_error(env->ctx)[0] != '\0', "backward with %s failed without a last-error message",
            what);
  fct_finish();
  for (i = 0; i < 3; i++) {
    fct_tensor *t = (fct_tensor *)outs[i];
    size_t changed;
    fct_tensor_download(t);
    changed = fct_tensor_count_unpoisoned(t);
    FCT_CHECK(changed == 0, "backward with %s (algo=%s) failed with %s but changed %zu element(s) of %s's buffer", what,
              fct_algo_str(desc->algorithm.algo), flashcl_status_string(st), changed, GRAD_NAMES[i]);
  }
}

static void test_backward_errors(void **state) {
  err_fixture f;
  flashcl_attention_desc desc;
  fct_tensor dq_long, dq_f16, do_f16, dk_gqa;
  int a;
  (void)state;
  err_fixture_create(&f);
  /* dq with q's shape but one more row (its buffer is big enough: the shape is wrong). */
  fct_tensor_create(&dq_long, F32, FCT_BNHD, 1, 9, 2, 32, 5);
  fct_tensor_create(&dq_f16, F16, FCT_BNHD, 1, 8, 2, 32, 5);
  fct_tensor_create(&do_f16, F16, FCT_BNHD, 1, 8, 2, 32, 8);
  fct_tensor_create(&dk_gqa, F32, FCT_BNHD, 1, 8, 2, 32, 6); /* q's heads, not k's */
  for (a = 0; a < 2; a++) {
    const flashcl_algo algo = a == 0 ? FLASHCL_ALGO_FLASH : FLASHCL_ALGO_NAIVE;
    bwd_desc(&f.bp, algo, 1, &desc);
    expect_backward_error(&f, &desc, NULL, &f.bp.d_o, &f.dq, &f.dk, &f.dv, FLASHCL_ERROR_INVALID_ARGUMENT, "lse = NULL");
    expect_backward_error(&f, &desc, &f.bp.lse, NULL, &f.dq, &f.dk, &f.dv, FLASHCL_ERROR_INVALID_ARGUMENT, "d_o = NULL");
    expect_backward_error(&f, &desc, &f.bp.lse, &f.bp.d_o, &dq_long, &f.dk, &f.dv, FLASHCL_ERROR_INVALID_SHAPE,
                          "dq of shape (1, 9, 2, 32) for q (1, 8, 2, 32)");
    expect_backward_error(&f, &desc, &f.bp.lse, &f.bp.d_o, &f.dq, &dk_gqa, &f.dv, FLASHCL_ERROR_INVALID_SHAPE,
                          "dk with q's head count (2) instead of k's (1)");
    expect_backward_error(&f, &desc, &f.bp.lse, &f.bp.d_o, &dq_f16, &f.dk, &f.dv, FLASHCL_ERROR_DTYPE_MISMATCH,
                          "an f16 dq for f32 inputs");
    expect_backward_error(&f, &desc, &f.bp.lse, &do_f16, &f.dq, &f.dk, &f.dv, FLASHCL_ERROR_DTYPE_MISMATCH,
                          "an f16 d_o for f32 inputs");
    desc.dropout.p = 1.0f;
    expect_backward_error(&f, &desc, &f.bp.lse, &f.bp.d_o, &f.dq, &f.dk, &f.dv, FLASHCL_ERROR_INVALID_ARGUMENT,
                          "dropout_p = 1.0");
    desc.dropout.p = -0.1f;
    expect_backward_error(&f, &desc, &f.bp.lse, &f.bp.d_o, &f.dq, &f.dk, &f.dv, FLASHCL_ERROR_INVALID_ARGUMENT,
                          "dropout_p = -0.1");
    desc.dropout.p = NAN;
    expect_backward_error(&f, &desc, &f.bp.lse, &f.bp.d_o, &f.dq, &f.dk, &f.dv, FLASHCL_ERROR_INVALID_ARGUMENT,
                          "dropout_p = NaN");
    print_message("    ok  algo=%s: every error path returned its status and left dq/dk/dv untouched\n",
                  fct_algo_str(algo));
  }
  fct_tensor_release(&dq_long);
  fct_tensor_release(&dq_f16);
  fct_tensor_release(&do_f16);
  fct_tensor_release(&dk_gqa);
  err_fixture_release(&f);
}

/* ============================================================ workspace == */

static size_t bwd_workspace(int N, int D, flashcl_algo algo, int deterministic, cl_mem qb, cl_mem kb) {
  fct_env *env = fct_env_get();
  flashcl_attention_desc desc;
  flashcl_tensor q, k;
  size_t bytes = 0;
  flashcl_tensor_init_bnhd(&q, qb, 0, F32, 1, N, 1, D);
  flashcl_tensor_init_bnhd(&k, kb, 0, F32, 1, N, 1, D);
  flashcl_attention_desc_init(&desc);
  desc.algorithm.algo = algo;
  desc.backward.deterministic = deterministic;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, &q, &k, &k, FLASHCL_PASS_BACKWARD, &bytes),
                   FLASHCL_SUCCESS, "workspace_size(BACKWARD, N=%d, d=%d, algo=%s)", N, D, fct_algo_str(algo));
  return bytes;
}

/* Flash backward scratch is O(N) and at N = 4096, d = 64 at most a tenth of the
 * naive backward's (which holds two N x N matrices). Size queries only. */
static void test_backward_workspace(void **state) {
  const int D = 64;
  cl_mem qb = fct_create_buffer((size_t)8192 * D * 4, NULL), kb = fct_create_buffer((size_t)8192 * D * 4, NULL);
  size_t f_det, f_atomic, naive, f_det2, f_atomic2, naive2;
  (void)state;
  f_det = bwd_workspace(4096, D, FLASHCL_ALGO_FLASH, 1, qb, kb);
  f_atomic = bwd_workspace(4096, D, FLASHCL_ALGO_FLASH, 0, qb, kb);
  naive = bwd_workspace(4096, D, FLASHCL_ALGO_NAIVE, 1, qb, kb);
  f_det2 = bwd_workspace(8192, D, FLASHCL_ALGO_FLASH, 1, qb, kb);
  f_atomic2 = bwd_workspace(8192, D, FLASHCL_ALGO_FLASH, 0, qb, kb);
  naive2 = bwd_workspace(8192, D, FLASHCL_ALGO_NAIVE, 1, qb, kb);
  FCT_CHECK(naive >= (size_t)2 * 4096 * 4096 * 4, "naive backward workspace at N=4096 is %zu bytes, less than P and dP",
            naive);
  FCT_CHECK(f_det <= naive / 10 && f_atomic <= naive / 10,
            "N=4096 d=64: flash backward workspace (deterministic %zu, atomic %zu bytes) exceeds a tenth of the naive "
            "backward's %zu",
            f_det, f_atomic, naive);
  FCT_CHECK(f_det2 <= 2 * f_det + 4096 && f_atomic2 <= 2 * f_atomic + 4096,
            "flash backward workspace is not O(N): N=4096 -> %zu / %zu bytes, N=8192 -> %zu / %zu", f_det, f_atomic,
            f_det2, f_atomic2);
  FCT_CHECK(naive2 >= 3 * naive, "naive backward workspace should grow as N^2: N=4096 %zu, N=8192 %zu", naive, naive2);
  print_message("    ok  N=4096 d=64: flash %zu (deterministic) / %zu (atomic) bytes, naive %zu; N=8192: %zu / %zu / %zu\n",
                f_det, f_atomic, naive, f_det2, f_atomic2, naive2);
  clReleaseMemObject(qb);
  clReleaseMemObject(kb);
}
/* ====================================================== wait list, event == */

/* The backward waits for its wait list: gated on a user event it must not have
 * completed before the event is set; then its out_event completes and the
 * gradients are right. Flash (both dQ modes) and naive; the deterministic flash
 * run once with dQ on the caller's queue and once on the context's second queue
 * (the bwd tuning's concurrent, the GPU default), whose events must still chain the
 * wait list to out_event. */
static void test_backward_wait_list(void **state) {
  static const bwd_case c = BWD("wait_list", F32, 1, 40, 40, 2, 2, 64, 0, 0.0f, 0);
  fct_env *env = fct_env_get();
  bwd_problem bp;
  int v;
  (void)state;
  bwd_problem_create(&bp, &c, 1);
  for (v = 0; v < 4; v++) {
    const flashcl_algo algo = v == 2 ? FLASHCL_ALGO_NAIVE : FLASHCL_ALGO_FLASH;
    const int deterministic = v != 1;
    flashcl_attention_desc desc;
    fct_tensor g[3];
    cl_event gate, done = NULL;
    cl_int err, status = 0;
    flashcl_status st;
    char rs[96];
    double fl;
    int i;
    run_str(algo, deterministic, rs, sizeof rs);
    if (v == 0 || v == 3) {
      bwd_tuning_begin(FLASHCL_TUNE_BWD);
      bwd_tuning_set("concurrent", v == 3);
      appendf(rs, sizeof rs, v == 3 ? ", dQ on the second queue" : ", one queue");
    }
    fct_tensor_create(&g[0], F32, FCT_BNHD, 1, 40, 2, 64, 5);
    fct_tensor_create(&g[1], F32, FCT_BNHD, 1, 40, 2, 64, 6);
    fct_tensor_create(&g[2], F32, FCT_BNHD, 1, 40, 2, 64, 7);
    gate = clCreateUserEvent(env->cl_ctx, &err);
    FCT_CHECK(err == CL_SUCCESS, "clCreateUserEvent: %d", (int)err);
    bwd_desc(&bp, algo, deterministic, &desc);
    st = flashcl_attention_backward(env->ctx, &desc, &bp.fp.q.t, &bp.fp.k.t, &bp.fp.v.t, &bp.o.t, &bp.lse.t,
                                    &bp.d_o.t, &g[0].t, &g[1].t, &g[2].t, 1, &gate, &done);
    g_tuning_on = 0; /* read during the call only; a failed check below skips the loop's end */
    if (st != FLASHCL_SUCCESS) clSetUserEventStatus(gate, CL_COMPLETE);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "backward gated on a user event (%s)", rs);
    FCT_CHECK(done != NULL, "backward (%s) returned no out_event", rs);
    clFlush(env->queue);
    err = clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    FCT_CHECK(err == CL_SUCCESS && status != CL_COMPLETE,
              "backward (%s) completed (status %d) before its wait-list event was set", rs, (int)status);
    err = clSetUserEventStatus(gate, CL_COMPLETE);
    FCT_CHECK(err == CL_SUCCESS, "clSetUserEventStatus: %d", (int)err);
    err = clWaitForEvents(1, &done);
    FCT_CHECK(err == CL_SUCCESS, "clWaitForEvents(out_event) (%s): %d", rs, (int)err);
    err = clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    FCT_CHECK(err == CL_SUCCESS && status == CL_COMPLETE, "backward (%s): out_event status %d", rs, (int)status);
    for (i = 0; i < 3; i++) {
      const double *ref = i == 0 ? bp.ref_dq : i == 1 ? bp.ref_dk : bp.ref_dv;
      fct_tensor_download(&g[i]);
      (void)check_grad(&bp, rs, i, &g[i], ref, &fl);
      fct_tensor_release(&g[i]);
    }
    print_message("    ok  %s: waited for its wait list, out_event completed, gradients correct\n", rs);
    clReleaseEvent(done);
    clReleaseEvent(gate);
  }
  bwd_problem_release(&bp);
}
#endif /* !FCT_BWD_LONG */

/* =========================================================== long sweep == */

#if defined(FCT_BWD_LONG) && !defined(FCT_BWD_MMA)
static const int LVL_QE[] = {3, 0, 17, 130};
static const int LVL_KE[] = {0, 9, 17, 129};

static bwd_case *build_sweep(size_t *count) {
  static const flashcl_dtype dts[3] = {F32, F16, BF16};
  static const int dims[4] = {32, 64, 128, 256};
  static const float ps[2] = {0.0f, 0.1f};
  /* Shapes: B, Nq, Nk, Hq, Hkv (0 = varlen set index 1 or 2 via Nq). */
  static const int shapes[][5] = {{2, 1, 1, 2, 2},     {2, 63, 63, 2, 2},   {1, 65, 65, 4, 2},  {1, 257, 257, 2, 2},
                                  {1, 63, 257, 8, 1},  {1, 257, 63, 8, 1},  {1, 1, 65, 2, 1},   {1, 65, 1, 2, 2},
                                  {0, 1, 0, 4, 2},     {0, 2, 0, 2, 1}};
  const size_t nshapes = sizeof shapes / sizeof shapes[0];
  bwd_case *cases = (bwd_case *)calloc(3 * 4 * 2 * 2 * nshapes + 8, sizeof *cases);
  size_t n = 0, di, dd, cc, pp, s;
  if (!cases) return NULL;
  for (di = 0; di < 3; di++)
    for (dd = 0; dd < 4; dd++)
      for (cc = 0; cc < 2; cc++)
        for (pp = 0; pp < 2; pp++)
          for (s = 0; s < nshapes; s++) {
            bwd_case *c = &cases[n];
            char *name = (char *)malloc(128);
            const int *sh = shapes[s];
            if (!name) return NULL;
            memset(c, 0, sizeof *c);
            c->kind = K_BWD;
            c->dtype = dts[di];
            c->head_dim = dims[dd];
            c->causal = (int)cc;
            c->dropout_p = ps[pp];
            c->runs = R_ALL;
            c->layout = s % 3 == 1 ? FCT_PADDED : FCT_BNHD;
            c->heads_q = sh[3], c->heads_kv = sh[4];
            if (sh[0] == 0) {
              c->batch = 1;
              c->num_seqs = sh[1] == 1 ? 3 : 4;
              c->seqlens_q = sh[1] == 1 ? VL_Q : LVL_QE;
              c->seqlens_k = sh[1] == 1 ? VL_K : LVL_KE;
              snprintf(name, 128, "%s_d%d%s%s_varlen%s_gqa_%d_%d", fct_dtype_str(c->dtype), c->head_dim,
                       cc ? "_causal" : "", pp ? "_dropout" : "", sh[1] == 1 ? "" : "_empty", sh[3], sh[4]);
            } else {
              /* d = 256 keeps N small: its tiles are narrow and PoCL slow. */
              c->batch = sh[0];
              c->seqlen_q = sh[1];
              c->seqlen_k = sh[2];
              snprintf(name, 128, "%s_d%d%s%s_B%d_Nq%d_Nk%d_gqa_%d_%d%s", fct_dtype_str(c->dtype), c->head_dim,
                       cc ? "_causal" : "", pp ? "_dropout" : "", sh[0], sh[1], sh[2], sh[3], sh[4],
                       c->layout == FCT_PADDED ? "_padded" : "");
            }
            c->name = name;
            n++;
          }
  /* The forward with dropout at every dtype / head dim. */
  for (di = 0; di < 3; di++)
    for (dd = 0; dd < 4; dd += 3) {
      bwd_case *c = &cases[n];
      char *name = (char *)malloc(128);
      if (!name) return NULL;
      memset(c, 0, sizeof *c);
      c->kind = K_FWD_DROPOUT;
      c->dtype = dts[di], c->head_dim = dims[dd], c->batch = 2, c->seqlen_q = 129, c->seqlen_k = 100;
      c->heads_q = 4, c->heads_kv = 2, c->causal = 1, c->dropout_p = 0.1f;
      snprintf(name, 128, "fwd_dropout_%s_d%d_causal_Nq129_Nk100", fct_dtype_str(c->dtype), c->head_dim);
      c->name = name;
      n++;
    }
  *count = n;
  return cases;
}
#endif

#ifdef FCT_BWD_MMA
/* ============================================== tensor-core availability == */


/* One small backward with desc.kernel = NVIDIA_MMA: it runs where the device has
 * the tensor-core path; elsewhere it must be refused with UNSUPPORTED, a reason
 * naming the tensor-core kernels, and untouched outputs (the table then skips). */
static void mma_probe(void) {
  static const bwd_case c = BWD("probe", F16, 1, 40, 40, 2, 2, 64, 0, 0.0f, R_DET);
  fct_env *env = fct_env_get();
  bwd_problem bp;
  fct_tensor g[3];
  flashcl_attention_desc desc;
  flashcl_status st;
  size_t written = 0;
  int i;
  mma_available = -2; /* stays if a check below fails */
  bwd_problem_create(&bp, &c, 1);
  fct_tensor_create_guarded(&g[0], F16, FCT_BNHD, bp.B, bp.Nq, bp.Hq, bp.D, 5, FCT_OUTPUT_GUARD);
  fct_tensor_create_guarded(&g[1], F16, FCT_BNHD, bp.B, bp.Nk, bp.Hkv, bp.D, 6, FCT_OUTPUT_GUARD);
  fct_tensor_create_guarded(&g[2], F16, FCT_BNHD, bp.B, bp.Nk, bp.Hkv, bp.D, 7, FCT_OUTPUT_GUARD);
  bwd_desc(&bp, FLASHCL_ALGO_FLASH, 1, &desc);
  st = flashcl_attention_backward(env->ctx, &desc, &bp.fp.q.t, &bp.fp.k.t, &bp.fp.v.t, &bp.o.t, &bp.lse.t,
                                  &bp.d_o.t, &g[0].t, &g[1].t, &g[2].t, 0, NULL, NULL);
  FCT_CHECK(clFinish(env->queue) == CL_SUCCESS, "clFinish failed");
  for (i = 0; i < 3; i++) fct_tensor_download(&g[i]);
  if (st == FLASHCL_SUCCESS) {
    double fl;
    for (i = 0; i < 3; i++)
      (void)check_grad(&bp, "probe", i, &g[i], i == 0 ? bp.ref_dq : i == 1 ? bp.ref_dk : bp.ref_dv, &fl);
    mma_available = 1;
    print_message("    ok  the device runs the tensor-core backward\n");
  } else {
    const char *msg = flashcl_context_last_error(env->ctx);
    for (i = 0; i < 3; i++) written += fct_tensor_count_unpoisoned(&g[i]);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_UNSUPPORTED, "explicit NVIDIA_MMA backward on a device without it");
    FCT_CHECK(strstr(msg, "tensor-core") != NULL, "the refusal does not give the reason: \"%s\"", msg);
    FCT_CHECK(written == 0, "the refused call wrote %zu gradient element(s)", written);
    /* Refusing is right except on an NVIDIA device of compute capability >= 8.0. */
    fct_mma_unavailable(env->device, "explicit NVIDIA_MMA backward", msg);
    mma_available = 0;
    print_message("    ok  refused cleanly: %s\n", msg);
  }
  for (i = 0; i < 3; i++) fct_tensor_release(&g[i]);
  bwd_problem_release(&bp);
}

static void test_mma_backward_available(void **state) {
  (void)state;
  mma_probe();
}
#endif

/* ================================================================= main == */

int main(void) {
  struct CMUnitTest *tests;
  size_t i, n_cases;
  int failed = 0;
  const bwd_case *cases;
#if defined(FCT_BWD_MMA)
  cases = CASES;
  n_cases = sizeof CASES / sizeof CASES[0];
  tests = (struct CMUnitTest *)calloc(n_cases + 1, sizeof *tests);
  if (!tests) return 1;
  tests[0].name = "tensor_core_backward_available_or_refused";
  tests[0].test_func = test_mma_backward_available;
  for (i = 0; i < n_cases; i++) {
    tests[1 + i].name = cases[i].name;
    tests[1 + i].test_func = run_table_test;
    tests[1 + i].teardown_func = bwd_table_teardown;
    tests[1 + i].initial_state = (void *)&cases[i];
  }
  failed += fct_run_group("backward_mma", tests, n_cases + 1, 1);
#elif defined(FCT_BWD_LONG)
  bwd_case *sweep = build_sweep(&n_cases);
  if (!sweep) return 1;
  cases = sweep;
  tests = (struct CMUnitTest *)calloc(n_cases, sizeof *tests);
  if (!tests) return 1;
  for (i = 0; i < n_cases; i++) {
    tests[i].name = cases[i].name;
    tests[i].test_func = run_table_test;
    tests[i].teardown_func = bwd_table_teardown;
    tests[i].initial_state = (void *)&cases[i];
  }
  failed += fct_run_group("backward_long", tests, n_cases, 1);
#else
  const struct CMUnitTest host[] = {
      {"philox_known_answers", test_philox_known_answers, NULL, NULL, NULL},
      {"reference_backward_vs_finite_differences", test_reference_finite_differences, NULL, NULL, NULL},
  };
  const struct CMUnitTest extra[] = {
      {"dropout_mask_matches_c_philox", test_dropout_mask_matches_c_philox, NULL, NULL, NULL},
      {"dropout_mask_statistics", test_dropout_mask_statistics, NULL, NULL, NULL},
      {"dropout_mask_seed_offset", test_dropout_mask_seed_offset, NULL, NULL, NULL},
      {"dropout_mask_errors", test_dropout_mask_errors, NULL, NULL, NULL},
      {"backward_errors", test_backward_errors, NULL, NULL, NULL},
      {"backward_workspace", test_backward_workspace, NULL, NULL, NULL},
      {"backward_wait_list_and_out_event", test_backward_wait_list, NULL, NULL, NULL},
  };
  const size_t n_extra = sizeof extra / sizeof extra[0];
  cases = CASES;
  n_cases = sizeof CASES / sizeof CASES[0];
  tests = (struct CMUnitTest *)calloc(n_extra + n_cases, sizeof *tests);
  if (!tests) return 1;
  for (i = 0; i < n_extra; i++) tests[i] = extra[i];
  for (i = 0; i < n_cases; i++) {
    tests[n_extra + i].name = cases[i].name;
    tests[n_extra + i].test_func = run_table_test;
    tests[n_extra + i].teardown_func = bwd_table_teardown;
    tests[n_extra + i].initial_state = (void *)&cases[i];
  }
  failed += fct_run_group("backward_host", host, sizeof host / sizeof host[0], 0);
  failed += fct_run_group("backward", tests, n_extra + n_cases, 1);
#endif
  free(tests);
  return failed;
}
