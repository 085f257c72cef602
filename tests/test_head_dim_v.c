/*
 * desc.shape.head_dim_v: v and o (d_o and dv in the backward) with a head dim of
 * their own, as MLA-style models use (DeepSeek's prefill: d_qk = 192,
 * d_v = 128).
 *
 * Each case runs the forward and then the backward on fresh random inputs,
 * outputs poisoned with NaN and followed by a poisoned guard region, against
 * the double reference (reference.c / reference_bwd.c, which take v's head dim
 * from v): O and LSE by relative L2 (fp32 1e-5, fp16 2e-3, bf16 1e-2; LSE 1e-5 /
 * 1e-4), dQ, dK and dV the same with test_backward's rounding-noise allowance
 * (4 fp32 ulps of the terms' size, ref_attention_backward_mag). Every element of
 * each view must be written and nothing past it.
 *
 * Cases: (d_qk, d_v) = (64, 32), (32, 64), (192, 128), (128, 192); causal and
 * not, GQA 2:1, f32 / f16 / bf16, dropout, the score variants (a window,
 * softcap, ALiBi, sinks and their gradient, against reference_masks.c), the flash kernels (CPU variant, the GPU
 * mapping through fwd map=0, the backward's split/warp-tiled/read-ahead build
 * and its atomic dQ) and the naive path, and a varlen batch. Then the error
 * paths: a head_dim_v that v or o does not have, head_dim_v = 0 with v's head
 * dim apart from q's (as before the field existed), d_o / dv with the wrong head
 * dim, a negative or unsupported head_dim_v: each refused with its status, the
 * outputs untouched. The queries (flashcl_attention_config, kernel_family,
 * workspace_size) report the portable kernels and the scratch for the right
 * dims. FLASHCL_KERNEL_NVIDIA_MMA cannot run on a device without tensor cores:
 * its refusal is only checked where the call gets that far (see
 * test_nvidia_mma_refused).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "reference_bwd.h"
#include "reference_masks.h"

#define NOISE_ULPS 4.0
#define U32 5.9604644775390625e-8 /* 2^-24 */

typedef struct hdv_case {
  flashcl_dtype dtype;
  int dqk, dv;
  int causal;
  int batch, nq, nk, hq, hkv;
  flashcl_algo algo;
  int gpu_map;          /* forward through the GPU mapping (fwd map=0) */
  const char *bwd_tune; /* per-call bwd tuning text, NULL: the context's */
  int atomic_dq;        /* desc.backward.deterministic = 0 */
  int varlen;           /* three packed sequences instead of the batch */
  float dropout;        /* desc.dropout.p (seed and offset fixed) */
  int variants;         /* 1: window (8, 2), softcap 20, ALiBi, sinks and their gradient */
} hdv_case;

/* Device tensors and the reference of one case. */
typedef struct hdv_run {
  const hdv_case *c;
  char name[160];
  int64_t B, Nq, Nk;
  fct_tensor q, k, v, o, lse, d_o, dq, dk, dv;
  int32_t cu_q[4], cu_k[4];
  cl_mem cu_q_mem, cu_k_mem;
  int max_q, max_k;
  ref_attention_params rp;
  ref_dropout dr;
  float slopes[8], sinks[8];
  double dsinks_ref[8], dsinks_rss2[8];
  cl_mem slopes_mem, sinks_mem, dsinks_mem;
  ref_masks rm;
} hdv_run;

static const int VARLEN_Q[3] = {5, 17, 9}, VARLEN_K[3] = {12, 17, 3};

static size_t view_elems(const fct_tensor *t) {
  return (size_t)(t->t.shape[0] * t->t.shape[1] * t->t.shape[2] * t->t.shape[3]);
}

/* ||got - ref|| / ||ref|| over a view, with the allowance NOISE_ULPS * u32 *
 * ||mag|| added to the tolerance where mag is given; counts NaN. */
static void check_view(const hdv_run *r, const char *what, const fct_tensor *t, const double *ref, const double *mag,
                       double tol) {
  const int64_t B = t->t.shape[0], N = t->t.shape[1], H = t->t.shape[2], D = t->t.shape[3];
  double e2 = 0, r2 = 0, m2 = 0;
  size_t nan_count = 0, inf_bad = 0, written;
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t x = 0; x < D; x++) {
          const size_t i = (size_t)(((b * N + n) * H + h) * D + x);
          const double g = fct_tensor_get(t, b, n, h, x);
          if (isnan(g)) {
            nan_count++;
            continue;
          }
          /* LSE of a row that sees no key: -inf on both sides, nothing to add. */
          if (isinf(ref[i]) || isinf(g)) {
            inf_bad += g != ref[i];
            continue;
          }
          e2 += (g - ref[i]) * (g - ref[i]);
          r2 += ref[i] * ref[i];
          if (mag) m2 += mag[i] * mag[i];
        }
  const double allow = NOISE_ULPS * U32 * sqrt(m2), err = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
  FCT_CHECK(nan_count == 0, "%s: %zu NaN in %s", r->name, nan_count, what);
  FCT_CHECK(inf_bad == 0, "%s: %zu elements of %s infinite on one side only", r->name, inf_bad, what);
  FCT_CHECK(r2 > 0, "%s: the reference %s is all zero (the case checks nothing)", r->name, what);
  FCT_CHECK(sqrt(e2) <= tol * sqrt(r2) + allow, "%s: %s relative L2 error %.3e > %.1e (+ allowance %.1e)", r->name,
            what, err, tol, allow / sqrt(r2));
  written = fct_tensor_count_unpoisoned(t);
  FCT_CHECK(written == view_elems(t), "%s: %zu elements of %s's buffer written, its view has %zu", r->name, written,
            what, view_elems(t));
}

static double *ref_alloc(int64_t B, int64_t N, int64_t H, int64_t D) {
  double *p = calloc((size_t)(B * N * H * D), sizeof(double));
  if (!p) fail_msg("out of memory");
  return p;
}

/* The score variants of a variants case: slopes and sink logits drawn per
 * query head, the reference's masks, and the dsinks output poisoned. */
static void hdv_variants(hdv_run *r, fct_rng *rng) {
  const int hq = r->c->hq;
  const float nan = NAN;
  FCT_CHECK(hq <= 8, "at most 8 query heads");
  for (int h = 0; h < hq; h++) {
    r->slopes[h] = (float)(0.05 + 0.3 * fct_rng_uniform(rng));
    r->sinks[h] = (float)(2.0 * fct_rng_uniform(rng) - 0.5);
  }
  r->slopes_mem = fct_create_buffer(sizeof(float) * (size_t)hq, r->slopes);
  r->sinks_mem = fct_create_buffer(sizeof(float) * (size_t)hq, r->sinks);
  r->dsinks_mem = fct_create_buffer(sizeof(float) * (size_t)hq, NULL);
  FCT_CHECK(clEnqueueFillBuffer(fct_env_get()->queue, r->dsinks_mem, &nan, sizeof nan, 0, sizeof(float) * (size_t)hq,
                                0, NULL, NULL) == CL_SUCCESS,
            "poison dsinks");
  r->rm.window_left = 8, r->rm.window_right = 2, r->rm.softcap = 20.0;
  r->rm.alibi = r->slopes, r->rm.sinks = r->sinks, r->rm.dsinks = r->dsinks_ref, r->rm.dsinks_rss2 = r->dsinks_rss2;
}

static void hdv_create(hdv_run *r, const hdv_case *c) {
  fct_rng rng;
  memset(r, 0, sizeof *r);
  r->c = c;
  snprintf(r->name, sizeof r->name, "%s dqk=%d dv=%d causal=%d B=%d Nq=%d Nk=%d H=%d:%d %s%s%s%s%s dropout=%g",
           fct_dtype_str(c->dtype), c->dqk, c->dv, c->causal, c->batch, c->nq, c->nk, c->hq, c->hkv,
           fct_algo_str(c->algo), c->gpu_map ? " gpu_map" : "", c->bwd_tune ? " bwd_tuning" : "",
           c->atomic_dq ? " atomic_dq" : "", c->varlen ? " varlen" : "", (double)c->dropout);
  r->dr.p = c->dropout, r->dr.seed = 0x5eed0123456789ull, r->dr.offset = 7;
  r->B = c->batch, r->Nq = c->nq, r->Nk = c->nk, r->max_q = c->nq, r->max_k = c->nk;
  if (c->varlen) {
    r->B = 1, r->max_q = r->max_k = 0;
    for (int s = 0; s < 3; s++) {
      r->cu_q[s + 1] = r->cu_q[s] + VARLEN_Q[s];
      r->cu_k[s + 1] = r->cu_k[s] + VARLEN_K[s];
      if (VARLEN_Q[s] > r->max_q) r->max_q = VARLEN_Q[s];
      if (VARLEN_K[s] > r->max_k) r->max_k = VARLEN_K[s];
    }
    r->Nq = r->cu_q[3], r->Nk = r->cu_k[3];
    r->cu_q_mem = fct_create_buffer(sizeof r->cu_q, r->cu_q);
    r->cu_k_mem = fct_create_buffer(sizeof r->cu_k, r->cu_k);
    r->rp.cu_seqlens_q = r->cu_q, r->rp.cu_seqlens_k = r->cu_k, r->rp.num_seqs = 3;
  }
  r->rp.causal = c->causal;
  fct_tensor_create(&r->q, c->dtype, FCT_BNHD, r->B, r->Nq, c->hq, c->dqk, 0);
  fct_tensor_create(&r->k, c->dtype, FCT_BNHD, r->B, r->Nk, c->hkv, c->dqk, 1);
  fct_tensor_create(&r->v, c->dtype, FCT_BNHD, r->B, r->Nk, c->hkv, c->dv, 2);
  fct_tensor_create(&r->d_o, c->dtype, FCT_BNHD, r->B, r->Nq, c->hq, c->dv, 3);
  fct_tensor_create_guarded(&r->o, c->dtype, FCT_BNHD, r->B, r->Nq, c->hq, c->dv, 4, FCT_OUTPUT_GUARD);
  fct_tensor_create_lse_guarded(&r->lse, FCT_BNHD, r->B, r->Nq, c->hq, 5, FCT_OUTPUT_GUARD);
  fct_tensor_create_guarded(&r->dq, c->dtype, FCT_BNHD, r->B, r->Nq, c->hq, c->dqk, 6, FCT_OUTPUT_GUARD);
  fct_tensor_create_guarded(&r->dk, c->dtype, FCT_BNHD, r->B, r->Nk, c->hkv, c->dqk, 7, FCT_OUTPUT_GUARD);
  fct_tensor_create_guarded(&r->dv, c->dtype, FCT_BNHD, r->B, r->Nk, c->hkv, c->dv, 8, FCT_OUTPUT_GUARD);
  fct_rng_init(&rng, r->name);
  fct_tensor_fill_random(&r->q, &rng);
  fct_tensor_fill_random(&r->k, &rng);
  fct_tensor_fill_random(&r->v, &rng);
  fct_tensor_fill_random(&r->d_o, &rng);
  fct_tensor_poison(&r->o);
  fct_tensor_poison(&r->lse);
  fct_tensor_poison(&r->dq);
  fct_tensor_poison(&r->dk);
  fct_tensor_poison(&r->dv);
  if (c->variants) hdv_variants(r, &rng);
}

static void hdv_release(hdv_run *r) {
  fct_tensor *all[9] = {&r->q, &r->k, &r->v, &r->o, &r->lse, &r->d_o, &r->dq, &r->dk, &r->dv};
  for (int i = 0; i < 9; i++) fct_tensor_release(all[i]);
  if (r->cu_q_mem) clReleaseMemObject(r->cu_q_mem);
  if (r->cu_k_mem) clReleaseMemObject(r->cu_k_mem);
  cl_mem extra[3] = {r->slopes_mem, r->sinks_mem, r->dsinks_mem};
  for (int i = 0; i < 3; i++)
    if (extra[i]) clReleaseMemObject(extra[i]);
}

static void hdv_desc(const hdv_run *r, flashcl_attention_desc *desc) {
  flashcl_attention_desc_init(desc);
  desc->shape.head_dim_v = r->c->dv;
  desc->mask.causal = r->c->causal;
  desc->algorithm.algo = r->c->algo;
  desc->backward.deterministic = !r->c->atomic_dq;
  desc->dropout.p = r->dr.p, desc->dropout.seed = r->dr.seed, desc->dropout.offset = r->dr.offset;
  if (r->c->varlen) {
    desc->varlen.cu_seqlens_q = r->cu_q_mem, desc->varlen.cu_seqlens_k = r->cu_k_mem;
    desc->varlen.num_seqs = 3, desc->varlen.max_seqlen_q = r->max_q, desc->varlen.max_seqlen_k = r->max_k;
  }
  if (r->c->variants) {
    desc->score.window_left = r->rm.window_left, desc->score.window_right = r->rm.window_right;
    desc->score.softcap = (float)r->rm.softcap;
    desc->score.alibi_slopes = r->slopes_mem, desc->score.sinks = r->sinks_mem;
  }
}

static void hdv_forward(hdv_run *r) {
  const hdv_case *c = r->c;
  flashcl_attention_desc desc;
  hdv_desc(r, &desc);
  if (c->gpu_map) desc.algorithm.tuning = fct_gpu_map_tuning();
  FCT_CHECK_STATUS(flashcl_attention_forward(fct_env_get()->ctx, &desc, &r->q.t, &r->k.t, &r->v.t, &r->o.t,
                                             &r->lse.t, 0, NULL, NULL),
                   FLASHCL_SUCCESS, "%s: forward", r->name);
  fct_finish();
  fct_tensor_download(&r->o);
  fct_tensor_download(&r->lse);
  const ref_tensor q = fct_tensor_ref(&r->q), k = fct_tensor_ref(&r->k), v = fct_tensor_ref(&r->v);
  double *ro = ref_alloc(r->B, r->Nq, c->hq, c->dv), *rl = ref_alloc(r->B, r->Nq, c->hq, 1);
  const ref_out oo = ref_out_bnhd(ro, r->B, r->Nq, c->hq, c->dv), lo = ref_out_bnhd(rl, r->B, r->Nq, c->hq, 1);
  FCT_CHECK((c->variants ? ref_masks_forward(&r->rp, &r->rm, &r->dr, &q, &k, &v, &oo, &lo)
                         : ref_attention_forward_dropout(&r->rp, &r->dr, &q, &k, &v, &oo, &lo)) == 0,
            "%s: the reference refused the case", r->name);
  check_view(r, "O", &r->o, ro, NULL, fct_tolerance(c->dtype));
  check_view(r, "LSE", &r->lse, rl, NULL, fct_lse_tolerance(c->dtype));
  free(ro);
  free(rl);
}

/* The sinks' gradient against the reference's (ref_dsinks_error: relative L2
 * over the heads, against the terms' root sum of squares where they cancel). */
static void hdv_check_dsinks(hdv_run *r) {
  const int hq = r->c->hq;
  float got[8];
  FCT_CHECK(clEnqueueReadBuffer(fct_env_get()->queue, r->dsinks_mem, CL_TRUE, 0, sizeof(float) * (size_t)hq, got, 0,
                                NULL, NULL) == CL_SUCCESS,
            "read dsinks");
  double r2 = 0;
  for (int h = 0; h < hq; h++) {
    FCT_CHECK(!isnan(got[h]), "%s: dsinks[%d] is NaN (not written)", r->name, h);
    r2 += r->dsinks_ref[h] * r->dsinks_ref[h];
  }
  const double err = ref_dsinks_error(got, r->dsinks_ref, r->dsinks_rss2, hq);
  FCT_CHECK(r2 > 0 && err <= fct_tolerance(r->c->dtype), "%s: dsinks relative L2 error %.3e", r->name, err);
}

/* The backward from the device's O and LSE, against the reference fed that O. */
static void hdv_backward(hdv_run *r) {
  const hdv_case *c = r->c;
  flashcl_attention_desc desc;
  flashcl_tuning tune;
  hdv_desc(r, &desc);
  if (c->bwd_tune) {
    FCT_CHECK_STATUS(flashcl_tuning_parse(NULL, c->bwd_tune, &tune), FLASHCL_SUCCESS, "parse '%s'", c->bwd_tune);
    desc.algorithm.tuning = &tune;
  }
  if (c->variants) desc.backward.dsinks = r->dsinks_mem;
  FCT_CHECK_STATUS(flashcl_attention_backward(fct_env_get()->ctx, &desc, &r->q.t, &r->k.t, &r->v.t, &r->o.t,
                                              &r->lse.t, &r->d_o.t, &r->dq.t, &r->dk.t, &r->dv.t, 0, NULL, NULL),
                   FLASHCL_SUCCESS, "%s: backward", r->name);
  fct_finish();
  fct_tensor_download(&r->dq);
  fct_tensor_download(&r->dk);
  fct_tensor_download(&r->dv);
  const ref_tensor q = fct_tensor_ref(&r->q), k = fct_tensor_ref(&r->k), v = fct_tensor_ref(&r->v);
  const ref_tensor o = fct_tensor_ref(&r->o), d_o = fct_tensor_ref(&r->d_o);
  double *g[3], *m[3];
  const int64_t rows[3] = {r->Nq, r->Nk, r->Nk}, heads[3] = {c->hq, c->hkv, c->hkv}, dims[3] = {c->dqk, c->dqk, c->dv};
  ref_out go[3], mo[3];
  for (int i = 0; i < 3; i++) {
    g[i] = ref_alloc(r->B, rows[i], heads[i], dims[i]);
    m[i] = ref_alloc(r->B, rows[i], heads[i], dims[i]);
    go[i] = ref_out_bnhd(g[i], r->B, rows[i], heads[i], dims[i]);
    mo[i] = ref_out_bnhd(m[i], r->B, rows[i], heads[i], dims[i]);
  }
  /* The variants' reference has no rounding-noise magnitudes: no allowance there. */
  FCT_CHECK((c->variants ? ref_masks_backward(&r->rp, &r->rm, &r->dr, &q, &k, &v, &o, &d_o, &go[0], &go[1], &go[2])
                         : ref_attention_backward_mag(&r->rp, &r->dr, &q, &k, &v, &o, &d_o, &go[0], &go[1], &go[2],
                                                      &mo[0], &mo[1], &mo[2])) == 0,
            "%s: the backward reference refused the case", r->name);
  const fct_tensor *got[3] = {&r->dq, &r->dk, &r->dv};
  static const char *const names[3] = {"dQ", "dK", "dV"};
  for (int i = 0; i < 3; i++) check_view(r, names[i], got[i], g[i], c->variants ? NULL : m[i], fct_tolerance(c->dtype));
  if (c->variants) hdv_check_dsinks(r);
  for (int i = 0; i < 3; i++) free(g[i]), free(m[i]);
}

/* What the queries say about the case: the portable kernels (AUTO on any
 * device: the tensor cores do not take head_dim_v), a plan, and scratch for
 * dQ's head dim. */
static void hdv_queries(hdv_run *r) {
  flashcl_context *ctx = fct_env_get()->ctx;
  flashcl_attention_desc desc;
  flashcl_config cfg;
  flashcl_kernel_family fam = FLASHCL_KERNEL_AUTO;
  size_t ws = 0;
  hdv_desc(r, &desc);
  if (r->c->algo == FLASHCL_ALGO_NAIVE) return;
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(ctx, &desc, &r->q.t, &r->k.t, &r->v.t, &r->o.t,
                                                   FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_SUCCESS, "%s: kernel_family", r->name);
  FCT_CHECK(fam == FLASHCL_KERNEL_PORTABLE, "%s: kernel_family %d, expected PORTABLE", r->name, (int)fam);
  FCT_CHECK_STATUS(flashcl_attention_config(ctx, &desc, &r->q.t, &r->k.t, &r->v.t, &r->o.t, FLASHCL_PASS_FORWARD,
                                            &cfg),
                   FLASHCL_SUCCESS, "%s: config", r->name);
  FCT_CHECK(cfg.family == FLASHCL_TUNE_FWD && !strcmp(cfg.kernel, "flash_fwd") && cfg.block_r > 0 &&
                cfg.local_bytes > 0,
            "%s: config family %d kernel %s Br %d local %zu", r->name, (int)cfg.family, cfg.kernel, cfg.block_r,
            cfg.local_bytes);
  FCT_CHECK_STATUS(flashcl_attention_config(ctx, &desc, &r->q.t, &r->k.t, &r->v.t, &r->o.t, FLASHCL_PASS_BACKWARD,
                                            &cfg),
                   FLASHCL_SUCCESS, "%s: backward config", r->name);
  FCT_CHECK(cfg.family == FLASHCL_TUNE_BWD, "%s: backward config family %d", r->name, (int)cfg.family);
  /* D (one float per query row and head) and, for the atomic dQ, dQ's fp32
   * accumulator: d_qk floats per row, not d_v. */
  desc.backward.deterministic = 0;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(ctx, &desc, &r->q.t, &r->k.t, &r->v.t, FLASHCL_PASS_BACKWARD,
                                                    &ws),
                   FLASHCL_SUCCESS, "%s: workspace", r->name);
  const size_t rows = (size_t)(r->c->varlen ? 3 * r->max_q : r->B * r->Nq) * (size_t)r->c->hq;
  FCT_CHECK(ws == rows * (1 + (size_t)r->c->dqk) * sizeof(float), "%s: backward workspace %zu, expected %zu", r->name,
            ws, rows * (1 + (size_t)r->c->dqk) * sizeof(float));
}

static void hdv_check(const hdv_case *c) {
  hdv_run r;
  hdv_create(&r, c);
  hdv_forward(&r);
  hdv_backward(&r);
  hdv_queries(&r);
  hdv_release(&r);
}

#define FLASH FLASHCL_ALGO_FLASH
#define NAIVE FLASHCL_ALGO_NAIVE
#define SPLIT_TUNE "bwd split=1 unroll=1 warp=1 ahead=1"

/* dtype, dqk, dv, causal, batch, nq, nk, hq, hkv, algo, gpu_map, bwd_tune, atomic_dq, varlen, dropout,
 * variants */
static const hdv_case CASES[] = {
    {FLASHCL_F32, 64, 32, 0, 2, 37, 45, 4, 2, FLASH, 0, NULL, 0, 0},
    {FLASHCL_F32, 64, 32, 1, 1, 45, 37, 2, 1, FLASH, 1, SPLIT_TUNE, 1, 0},
    {FLASHCL_F32, 32, 64, 1, 2, 33, 33, 2, 2, FLASH, 0, NULL, 1, 0, 0.2f},
    {FLASHCL_F16, 32, 64, 0, 1, 29, 51, 4, 2, FLASH, 1, SPLIT_TUNE, 0, 0},
    {FLASHCL_F32, 192, 128, 1, 1, 40, 40, 2, 1, FLASH, 0, NULL, 0, 0},
    {FLASHCL_F16, 192, 128, 0, 1, 24, 40, 2, 1, FLASH, 1, SPLIT_TUNE, 1, 0},
    {FLASHCL_BF16, 192, 128, 1, 1, 24, 24, 2, 2, FLASH, 0, NULL, 0, 0},
    {FLASHCL_F32, 128, 192, 0, 1, 24, 31, 2, 1, FLASH, 0, NULL, 0, 0},
    {FLASHCL_F32, 64, 32, 1, 2, 21, 30, 4, 2, NAIVE, 0, NULL, 0, 0},
    {FLASHCL_F16, 192, 128, 0, 1, 17, 23, 2, 1, NAIVE, 0, NULL, 0, 0},
    {FLASHCL_F32, 32, 64, 0, 1, 19, 19, 2, 1, NAIVE, 0, NULL, 0, 0, 0.2f},
    {FLASHCL_F32, 64, 32, 1, 1, 0, 0, 4, 2, FLASH, 0, NULL, 0, 1},
    {FLASHCL_F32, 32, 64, 0, 1, 0, 0, 2, 1, NAIVE, 0, NULL, 0, 1},
    /* window, softcap, ALiBi, sinks and dsinks with the separate V head dim */
    {FLASHCL_F32, 192, 128, 0, 1, 33, 41, 4, 2, FLASH, 0, NULL, 0, 0, 0.0f, 1},
    {FLASHCL_F16, 64, 32, 1, 2, 29, 35, 2, 1, FLASH, 1, SPLIT_TUNE, 1, 0, 0.0f, 1},
    {FLASHCL_F32, 32, 64, 0, 1, 27, 31, 2, 2, NAIVE, 0, NULL, 0, 0, 0.0f, 1},
    /* Past 256: MLA's 576 / 512 (prefill on the latent head) on both mappings
     * and the naive path, and 320 / 320 with the NVIDIA build choices. */
    {FLASHCL_F32, 576, 512, 1, 1, 23, 30, 2, 1, FLASH, 0, NULL, 0, 0},
    {FLASHCL_F16, 576, 512, 0, 1, 17, 21, 2, 2, FLASH, 1, SPLIT_TUNE, 1, 0},
    {FLASHCL_F32, 576, 512, 1, 1, 19, 19, 2, 1, NAIVE, 0, NULL, 0, 0},
    {FLASHCL_BF16, 320, 320, 1, 1, 20, 26, 2, 1, FLASH, 0, NULL, 0, 0, 0.0f, 1},
};
#define NCASES (sizeof CASES / sizeof CASES[0])

static void test_case(void **state) { hdv_check((const hdv_case *)*state); }

/* ------------------------------------------------------------ bad input -- */

typedef struct hdv_bad {
  fct_tensor q, k, v, o, lse, d_o, dq, dk, dv;
} hdv_bad;

static void bad_create(hdv_bad *b, int dqk, int dv_v, int dv_o) {
  fct_rng rng;
  fct_rng_init(&rng, "bad input");
  fct_tensor_create(&b->q, FLASHCL_F32, FCT_BNHD, 1, 16, 2, dqk, 0);
  fct_tensor_create(&b->k, FLASHCL_F32, FCT_BNHD, 1, 16, 2, dqk, 1);
  fct_tensor_create(&b->v, FLASHCL_F32, FCT_BNHD, 1, 16, 2, dv_v, 2);
  fct_tensor_create(&b->d_o, FLASHCL_F32, FCT_BNHD, 1, 16, 2, dv_o, 3);
  fct_tensor_create_guarded(&b->o, FLASHCL_F32, FCT_BNHD, 1, 16, 2, dv_o, 4, 64);
  fct_tensor_create_lse_guarded(&b->lse, FCT_BNHD, 1, 16, 2, 5, 64);
  fct_tensor_create_guarded(&b->dq, FLASHCL_F32, FCT_BNHD, 1, 16, 2, dqk, 6, 64);
  fct_tensor_create_guarded(&b->dk, FLASHCL_F32, FCT_BNHD, 1, 16, 2, dqk, 7, 64);
  fct_tensor_create_guarded(&b->dv, FLASHCL_F32, FCT_BNHD, 1, 16, 2, dv_v, 8, 64);
  fct_tensor *in[4] = {&b->q, &b->k, &b->v, &b->d_o}, *out[5] = {&b->o, &b->lse, &b->dq, &b->dk, &b->dv};
  for (int i = 0; i < 4; i++) fct_tensor_fill_random(in[i], &rng);
  for (int i = 0; i < 5; i++) fct_tensor_poison(out[i]);
}

static void bad_release(hdv_bad *b) {
  fct_tensor *all[9] = {&b->q, &b->k, &b->v, &b->o, &b->lse, &b->d_o, &b->dq, &b->dk, &b->dv};
  for (int i = 0; i < 9; i++) fct_tensor_release(all[i]);
}

/* The forward and the backward with desc refuse the call with `want` and a
 * message, and write none of the outputs. */
static void bad_expect(hdv_bad *b, const flashcl_attention_desc *desc, flashcl_status want, const char *what) {
  flashcl_context *ctx = fct_env_get()->ctx;
  FCT_CHECK_STATUS(flashcl_attention_forward(ctx, desc, &b->q.t, &b->k.t, &b->v.t, &b->o.t, &b->lse.t, 0, NULL, NULL),
                   want, "forward: %s", what);
  FCT_CHECK(strlen(flashcl_context_last_error(ctx)) > 0, "forward (%s): no message", what);
  FCT_CHECK_STATUS(flashcl_attention_backward(ctx, desc, &b->q.t, &b->k.t, &b->v.t, &b->o.t, &b->lse.t, &b->d_o.t,
                                              &b->dq.t, &b->dk.t, &b->dv.t, 0, NULL, NULL),
                   want, "backward: %s", what);
  FCT_CHECK(strlen(flashcl_context_last_error(ctx)) > 0, "backward (%s): no message", what);
  fct_finish();
  fct_tensor *out[5] = {&b->o, &b->lse, &b->dq, &b->dk, &b->dv};
  const size_t written = fct_tensors_written(out, 5);
  FCT_CHECK(written == 0, "%s: a refused call wrote %zu output elements", what, written);
}

static void test_bad_input(void **state) {
  flashcl_attention_desc desc;
  hdv_bad b;
  (void)state;
  /* v and o have 32 columns, q and k 64. */
  bad_create(&b, 64, 32, 32);
  flashcl_attention_desc_init(&desc);
  bad_expect(&b, &desc, FLASHCL_ERROR_INVALID_SHAPE, "head_dim_v = 0 with v's head dim 32 != q's 64");
  FCT_CHECK(strstr(flashcl_context_last_error(fct_env_get()->ctx), "head_dim differs") != NULL, "message: %s",
            flashcl_context_last_error(fct_env_get()->ctx));
  desc.shape.head_dim_v = 40;
  bad_expect(&b, &desc, FLASHCL_ERROR_INVALID_SHAPE, "head_dim_v 40 but v.shape[3] 32");
  desc.shape.head_dim_v = -32;
  bad_expect(&b, &desc, FLASHCL_ERROR_INVALID_SHAPE, "negative head_dim_v");
  desc.shape.head_dim_v = 64; /* q's: then v must have 64 columns too */
  bad_expect(&b, &desc, FLASHCL_ERROR_INVALID_SHAPE, "head_dim_v = q's head dim, v 32");
  bad_release(&b);

  /* v right, o (and d_o) with q's head dim. */
  bad_create(&b, 64, 32, 64);
  desc.shape.head_dim_v = 32;
  bad_expect(&b, &desc, FLASHCL_ERROR_INVALID_SHAPE, "o.shape[3] 64 != head_dim_v 32");
  bad_release(&b);

  /* A v head dim the kernels do not take. */
  bad_create(&b, 64, 12, 12);
  desc.shape.head_dim_v = 12;
  bad_expect(&b, &desc, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM, "head_dim_v 12");
  bad_release(&b);

  /* Forward shapes right, d_o (and so the backward) wrong: only the backward is
   * refused, and it writes no gradient. */
  bad_create(&b, 64, 32, 32);
  fct_tensor_release(&b.d_o);
  fct_tensor_create(&b.d_o, FLASHCL_F32, FCT_BNHD, 1, 16, 2, 64, 3);
  FCT_CHECK_STATUS(flashcl_attention_backward(fct_env_get()->ctx, &desc, &b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t,
                                              &b.d_o.t, &b.dq.t, &b.dk.t, &b.dv.t, 0, NULL, NULL),
                   FLASHCL_ERROR_INVALID_SHAPE, "backward with d_o of q's head dim");
  fct_finish();
  fct_tensor *grads[3] = {&b.dq, &b.dk, &b.dv};
  FCT_CHECK(fct_tensors_written(grads, 3) == 0, "a refused backward wrote gradients");
  bad_release(&b);
}

/* desc.algorithm.kernel = NVIDIA_MMA with head_dim_v != head_dim is UNSUPPORTED on
 * every device: without the tensor cores (PoCL) because they are missing, with
 * them because they do not take the call. Either way nothing is written. */
static void test_nvidia_mma_refused(void **state) {
  flashcl_attention_desc desc;
  hdv_bad b;
  flashcl_kernel_family fam;
  (void)state;
  bad_create(&b, 64, 32, 32);
  flashcl_attention_desc_init(&desc);
  desc.shape.head_dim_v = 32;
  desc.algorithm.kernel = FLASHCL_KERNEL_NVIDIA_MMA;
  bad_expect(&b, &desc, FLASHCL_ERROR_UNSUPPORTED, "kernel NVIDIA_MMA with head_dim_v");
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(fct_env_get()->ctx, &desc, &b.q.t, &b.k.t, &b.v.t, &b.o.t,
                                                   FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_ERROR_UNSUPPORTED, "kernel_family with NVIDIA_MMA and head_dim_v");
  desc.algorithm.kernel = FLASHCL_KERNEL_PORTABLE;
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(fct_env_get()->ctx, &desc, &b.q.t, &b.k.t, &b.v.t, &b.o.t,
                                                   FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_SUCCESS, "kernel_family with PORTABLE and head_dim_v");
  FCT_CHECK(fam == FLASHCL_KERNEL_PORTABLE, "family %d", (int)fam);
  bad_release(&b);
}

/* The naive path's scratch counts v/o with their own head dim: its figure
 * grows with d_v alone. */
static void test_naive_workspace(void **state) {
  flashcl_context *ctx = fct_env_get()->ctx;
  flashcl_attention_desc desc;
  hdv_bad b, c;
  size_t ws_b = 0, ws_c = 0;
  (void)state;
  bad_create(&b, 64, 32, 32);
  bad_create(&c, 64, 64, 64);
  flashcl_attention_desc_init(&desc);
  desc.algorithm.algo = FLASHCL_ALGO_NAIVE;
  desc.shape.head_dim_v = 32;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(ctx, &desc, &b.q.t, &b.k.t, &b.v.t, FLASHCL_PASS_FORWARD, &ws_b),
                   FLASHCL_SUCCESS, "naive workspace, dv 32");
  desc.shape.head_dim_v = 0;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(ctx, &desc, &c.q.t, &c.k.t, &c.v.t, FLASHCL_PASS_FORWARD, &ws_c),
                   FLASHCL_SUCCESS, "naive workspace, dv 64");
  /* Q (then O) keeps 64 columns; V loses 32 columns of 16 rows x 2 heads. */
  FCT_CHECK(ws_c - ws_b == 16 * 2 * 32 * sizeof(float), "forward: %zu vs %zu", ws_b, ws_c);
  desc.shape.head_dim_v = 32;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(ctx, &desc, &b.q.t, &b.k.t, &b.v.t, FLASHCL_PASS_BACKWARD, &ws_b),
                   FLASHCL_SUCCESS, "naive backward workspace, dv 32");
  desc.shape.head_dim_v = 0;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(ctx, &desc, &c.q.t, &c.k.t, &c.v.t, FLASHCL_PASS_BACKWARD, &ws_c),
                   FLASHCL_SUCCESS, "naive backward workspace, dv 64");
  /* dO and dV lose 32 columns each; the buffers of V and O keep the 64 that dK
   * and dQ take over. */
  FCT_CHECK(ws_c - ws_b == 2 * 16 * 2 * 32 * sizeof(float), "backward: %zu vs %zu", ws_b, ws_c);
  bad_release(&b);
  bad_release(&c);
}

int main(void) {
  struct CMUnitTest tests[NCASES + 3];
  static char names[NCASES][96];
  for (size_t i = 0; i < NCASES; i++) {
    const hdv_case *c = &CASES[i];
    snprintf(names[i], sizeof names[i], "%s_dqk%d_dv%d_%s%s%s%s%s%s", fct_dtype_str(c->dtype), c->dqk, c->dv,
             fct_algo_str(c->algo), c->causal ? "_causal" : "", c->hq != c->hkv ? "_gqa" : "",
             c->varlen ? "_varlen" : c->dropout > 0 ? "_dropout" : "", c->gpu_map || c->bwd_tune ? "_mappings" : "",
             c->variants ? "_variants" : "");
    tests[i] = (struct CMUnitTest){names[i], test_case, NULL, NULL, (void *)c};
  }
  const struct CMUnitTest bad = cmocka_unit_test(test_bad_input), mma = cmocka_unit_test(test_nvidia_mma_refused),
                          naive_ws = cmocka_unit_test(test_naive_workspace);
  tests[NCASES] = bad;
  tests[NCASES + 1] = mma;
  tests[NCASES + 2] = naive_ws;
  return fct_run_group("head_dim_v", tests, NCASES + 3, 1);
}
