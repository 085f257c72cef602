/*
 * Sliding window, ALiBi, logit soft-capping and attention sinks
 * (flashcl_attention_desc.score: window_left / window_right / alibi_slopes /
 * softcap / sinks; backward.dsinks), forward and backward, flash and naive,
 * against the double reference of reference_masks.c.
 *
 *   - Fresh random inputs every run (seed printed; FLASHCL_TEST_SEED reproduces).
 *   - Outputs are NaN-poisoned before every call; NaN never passes.
 *   - Relative L2 of O, dQ, dK, dV: fp32 1e-5, fp16 2e-3, bf16 1e-2 (common.h);
 *     LSE: fct_lse_tolerance, and a row's LSE is -inf on the device iff it is in
 *     the reference (then its O row is exactly 0).
 *   - One case runs the GPU variant of the portable forward (the fwd tuning map=0, per call).
 *   - Error paths: bad window / softcap values and a short alibi buffer leave the
 *     outputs untouched.
 */
#include "common.h"
#include "reference_masks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mt_case {
  const char *name;
  flashcl_dtype dtype;
  int batch, nq, nk; /* ignored for varlen */
  int hq, hkv, d;
  int causal;
  int wl, wr;     /* -1: unbounded */
  int alibi;      /* 1: slopes per query head */
  float softcap;  /* 0: off */
  float scale;    /* 0: default */
  float dropout;
  int num_seqs;   /* varlen when > 0 */
  const int *lens_q, *lens_k;
  int backward;
  int gpu_map;    /* forward with the fwd tuning map=0 (the GPU mapping) */
  int block;      /* flash block_r = block_c (0: automatic); small tiles make the window skip tiles */
  int mma;        /* 1: flash only, desc.algorithm.kernel = NVIDIA_MMA, backward in both dQ modes (skipped where
                   * there is no tensor-core path) */
  int sinks;      /* 1: attention sinks (desc.score.sinks), and their gradient in the backward */
} mt_case;

typedef struct mt_inputs {
  int64_t B, Nq, Nk;
  fct_tensor q, k, v, d_o;
  cl_mem cu_q, cu_k, alibi, sinks;
  int32_t cu_q_host[17], cu_k_host[17];
  int max_q, max_k;
  float slopes[64], sink_vals[64];
} mt_inputs;

static void mt_inputs_create(mt_inputs *in, const mt_case *c) {
  fct_rng rng;
  memset(in, 0, sizeof *in);
  fct_rng_init(&rng, c->name);
  if (c->num_seqs > 0) {
    in->B = 1;
    in->cu_q_host[0] = in->cu_k_host[0] = 0;
    for (int s = 0; s < c->num_seqs; s++) {
      in->cu_q_host[s + 1] = in->cu_q_host[s] + c->lens_q[s];
      in->cu_k_host[s + 1] = in->cu_k_host[s] + c->lens_k[s];
      if (c->lens_q[s] > in->max_q) in->max_q = c->lens_q[s];
      if (c->lens_k[s] > in->max_k) in->max_k = c->lens_k[s];
    }
    in->Nq = in->cu_q_host[c->num_seqs];
    in->Nk = in->cu_k_host[c->num_seqs];
    in->cu_q = fct_create_buffer((size_t)(c->num_seqs + 1) * 4, in->cu_q_host);
    in->cu_k = fct_create_buffer((size_t)(c->num_seqs + 1) * 4, in->cu_k_host);
  } else {
    in->B = c->batch;
    in->Nq = c->nq;
    in->Nk = c->nk;
  }
  fct_tensor_create(&in->q, c->dtype, FCT_BNHD, in->B, in->Nq, c->hq, c->d, 0);
  fct_tensor_create(&in->k, c->dtype, FCT_BNHD, in->B, in->Nk, c->hkv, c->d, 1);
  fct_tensor_create(&in->v, c->dtype, FCT_BNHD, in->B, in->Nk, c->hkv, c->d, 2);
  fct_tensor_fill_random(&in->q, &rng);
  fct_tensor_fill_random(&in->k, &rng);
  fct_tensor_fill_random(&in->v, &rng);
  if (c->backward) {
    fct_tensor_create(&in->d_o, c->dtype, FCT_BNHD, in->B, in->Nq, c->hq, c->d, 3);
    fct_tensor_fill_random(&in->d_o, &rng);
  }
  if (c->alibi) {
    /* The geometric ALiBi slopes 2^(-8 (h + 1) / H), scaled up so they matter at these lengths. */
    for (int h = 0; h < c->hq; h++) in->slopes[h] = 4.0f * powf(2.0f, -8.0f * (float)(h + 1) / (float)c->hq);
    in->alibi = fct_create_buffer((size_t)c->hq * sizeof(float), in->slopes);
  }
  if (c->sinks) {
    /* Around the scores' own range, so that the sink takes a real share of each row. */
    for (int h = 0; h < c->hq; h++) in->sink_vals[h] = (float)(1.5 * fct_rng_normal(&rng) + 0.5);
    in->sinks = fct_create_buffer((size_t)c->hq * sizeof(float), in->sink_vals);
  }
}

static void mt_inputs_release(mt_inputs *in) {
  fct_tensor_release(&in->q);
  fct_tensor_release(&in->k);
  fct_tensor_release(&in->v);
  if (in->d_o.host) fct_tensor_release(&in->d_o);
  if (in->cu_q) clReleaseMemObject(in->cu_q);
  if (in->cu_k) clReleaseMemObject(in->cu_k);
  if (in->alibi) clReleaseMemObject(in->alibi);
  if (in->sinks) clReleaseMemObject(in->sinks);
}

static int mt_deterministic = 1; /* desc.backward.deterministic of the next mt_run */

static void mt_desc(const mt_case *c, const mt_inputs *in, flashcl_algo algo, flashcl_attention_desc *desc) {
  flashcl_attention_desc_init(desc);
  desc->backward.deterministic = mt_deterministic;
  desc->algorithm.algo = algo;
  desc->mask.causal = c->causal;
  desc->score.scale = c->scale;
  desc->score.window_left = c->wl;
  desc->score.window_right = c->wr;
  desc->score.alibi_slopes = in->alibi;
  desc->score.softcap = c->softcap;
  desc->score.sinks = in->sinks;
  desc->dropout.p = c->dropout;
  desc->dropout.seed = 0x1234567890abcdefull;
  desc->dropout.offset = 77;
  desc->algorithm.block_r = desc->algorithm.block_c = c->block;
  if (c->mma) desc->algorithm.kernel = FLASHCL_KERNEL_NVIDIA_MMA;
  if (c->num_seqs > 0) {
    desc->varlen.cu_seqlens_q = in->cu_q;
    desc->varlen.cu_seqlens_k = in->cu_k;
    desc->varlen.num_seqs = c->num_seqs;
    desc->varlen.max_seqlen_q = in->max_q;
    desc->varlen.max_seqlen_k = in->max_k;
  }
}

static void mt_params(const mt_case *c, const mt_inputs *in, ref_attention_params *rp, ref_masks *rm,
                      ref_dropout *rd) {
  memset(rp, 0, sizeof *rp);
  rp->scale = c->scale;
  rp->causal = c->causal;
  if (c->num_seqs > 0) {
    rp->cu_seqlens_q = in->cu_q_host;
    rp->cu_seqlens_k = in->cu_k_host;
    rp->num_seqs = c->num_seqs;
  }
  rm->window_left = c->wl;
  rm->window_right = c->wr;
  rm->alibi = c->alibi ? in->slopes : NULL;
  rm->softcap = c->softcap;
  rm->sinks = c->sinks ? in->sink_vals : NULL;
  rm->dsinks = NULL;
  rm->dsinks_rss2 = NULL;
  rd->p = c->dropout;
  rd->seed = 0x1234567890abcdefull;
  rd->offset = 77;
}

/* Relative L2 of a device tensor against a contiguous (B, N, H, D) double array;
 * NaN anywhere gives +inf. */
static double mt_rel_l2(const fct_tensor *t, const double *ref) {
  const int64_t B = t->t.shape[0], N = t->t.shape[1], H = t->t.shape[2], D = t->t.shape[3];
  double e2 = 0.0, r2 = 0.0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t x = 0; x < D; x++) {
          const double g = fct_tensor_get(t, b, n, h, x), r = ref[((b * N + n) * H + h) * D + x];
          if (isnan(g)) return INFINITY;
          e2 += (g - r) * (g - r);
          r2 += r * r;
        }
  return r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}

static void mt_run(const mt_case *c, flashcl_algo algo) {
  fct_env *env = fct_env_get();
  mt_inputs in;
  mt_inputs_create(&in, c);
  const int64_t B = in.B, Nq = in.Nq, Nk = in.Nk, Hq = c->hq, Hkv = c->hkv, D = c->d;
  const char *an = algo == FLASHCL_ALGO_NAIVE ? "naive" : "flash";
  const double tol = fct_tolerance(c->dtype), lse_tol = fct_lse_tolerance(c->dtype);

  /* Reference. */
  ref_attention_params rp;
  ref_masks rm;
  ref_dropout rd;
  mt_params(c, &in, &rp, &rm, &rd);
  ref_tensor rq = fct_tensor_ref(&in.q), rk = fct_tensor_ref(&in.k), rv = fct_tensor_ref(&in.v);
  double *ref_o = calloc((size_t)(B * Nq * Hq * D), sizeof(double));
  double *ref_lse = calloc((size_t)(B * Nq * Hq), sizeof(double));
  ref_out ro = ref_out_bnhd(ref_o, B, Nq, Hq, D), rl = ref_out_bnhd(ref_lse, B, Nq, Hq, 1);
  FCT_CHECK(ref_masks_forward(&rp, &rm, &rd, &rq, &rk, &rv, &ro, &rl) == 0, "%s: reference forward", c->name);

  /* Forward. */
  fct_tensor o, lse;
  fct_tensor_create(&o, c->dtype, FCT_BNHD, B, Nq, Hq, D, 4);
  fct_tensor_create_lse(&lse, FCT_BNHD, B, Nq, Hq, 5);
  fct_tensor_poison(&o);
  fct_tensor_poison(&lse);
  flashcl_attention_desc desc;
  mt_desc(c, &in, algo, &desc);
  if (c->gpu_map) desc.algorithm.tuning = fct_gpu_map_tuning();
  flashcl_status st = flashcl_attention_forward(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t, &o.t, &lse.t, 0, NULL, NULL);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s (%s): forward", c->name, an);
  fct_finish();
  fct_tensor_download(&o);
  fct_tensor_download(&lse);

  const double err_o = mt_rel_l2(&o, ref_o);
  double le2 = 0.0, lr2 = 0.0;
  size_t empty = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < Nq; n++)
      for (int64_t h = 0; h < Hq; h++) {
        const double g = fct_tensor_get(&lse, b, n, h, 0), r = ref_lse[(b * Nq + n) * Hq + h];
        FCT_CHECK(!isnan(g), "%s (%s): LSE NaN at (%lld, %lld, %lld)", c->name, an, (long long)b, (long long)n,
                  (long long)h);
        if (r == -INFINITY) {
          empty++;
          FCT_CHECK(g == -INFINITY, "%s (%s): row (%lld, %lld, %lld) sees no key but LSE = %g", c->name, an,
                    (long long)b, (long long)n, (long long)h, g);
          for (int64_t x = 0; x < D; x++)
            FCT_CHECK(fct_tensor_get(&o, b, n, h, x) == 0.0, "%s (%s): empty row's O is not 0", c->name, an);
          continue;
        }
        FCT_CHECK(isfinite(g), "%s (%s): LSE %g at (%lld, %lld, %lld), reference %g", c->name, an, g, (long long)b,
                  (long long)n, (long long)h, r);
        if (c->sinks) { /* a row that sees no key holds only its sink: O = 0 exactly */
          int keyless = 1;
          for (int64_t x = 0; x < D; x++) keyless = keyless && ref_o[((b * Nq + n) * Hq + h) * D + x] == 0.0;
          for (int64_t x = 0; keyless && x < D; x++)
            FCT_CHECK(fct_tensor_get(&o, b, n, h, x) == 0.0, "%s (%s): a sink-only row's O is not 0", c->name, an);
          empty += keyless;
        }
        le2 += (g - r) * (g - r);
        lr2 += r * r;
      }
  const double err_lse = lr2 > 0 ? sqrt(le2 / lr2) : sqrt(le2);
  print_message("  %-26s %s %s: O err %.2e, LSE err %.2e, empty rows %zu\n", c->name, an, fct_dtype_str(c->dtype),
                err_o, err_lse, empty);
  FCT_CHECK(err_o <= tol, "%s (%s): O relative L2 %.3e > %.1e", c->name, an, err_o, tol);
  FCT_CHECK(err_lse <= lse_tol, "%s (%s): LSE relative L2 %.3e > %.1e", c->name, an, err_lse, lse_tol);

  if (c->backward) {
    fct_tensor dq, dk, dv;
    fct_tensor_create(&dq, c->dtype, FCT_BNHD, B, Nq, Hq, D, 6);
    fct_tensor_create(&dk, c->dtype, FCT_BNHD, B, Nk, Hkv, D, 7);
    fct_tensor_create(&dv, c->dtype, FCT_BNHD, B, Nk, Hkv, D, 8);
    fct_tensor_poison(&dq);
    fct_tensor_poison(&dk);
    fct_tensor_poison(&dv);
    desc.algorithm.tuning = NULL; /* gpu_map tunes the forward; a fwd tuning is refused by the backward */
    float dsinks_dev[64];
    double dsinks_ref[64], dsinks_rss2[64];
    cl_mem dsinks = NULL;
    if (c->sinks) {
      for (int h = 0; h < Hq; h++) dsinks_dev[h] = NAN;
      dsinks = fct_create_buffer((size_t)Hq * sizeof(float), dsinks_dev);
      desc.backward.dsinks = dsinks;
      rm.dsinks = dsinks_ref;
      rm.dsinks_rss2 = dsinks_rss2;
    }
    st = flashcl_attention_backward(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t, &o.t, &lse.t, &in.d_o.t, &dq.t,
                                    &dk.t, &dv.t, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s (%s): backward", c->name, an);
    fct_finish();
    fct_tensor_download(&dq);
    fct_tensor_download(&dk);
    fct_tensor_download(&dv);
    double *rdq = calloc((size_t)(B * Nq * Hq * D), sizeof(double));
    double *rdk = calloc((size_t)(B * Nk * Hkv * D), sizeof(double));
    double *rdv = calloc((size_t)(B * Nk * Hkv * D), sizeof(double));
    ref_out odq = ref_out_bnhd(rdq, B, Nq, Hq, D), odk = ref_out_bnhd(rdk, B, Nk, Hkv, D),
            odv = ref_out_bnhd(rdv, B, Nk, Hkv, D);
    ref_tensor r_o = fct_tensor_ref(&o), r_do = fct_tensor_ref(&in.d_o);
    FCT_CHECK(ref_masks_backward(&rp, &rm, &rd, &rq, &rk, &rv, &r_o, &r_do, &odq, &odk, &odv) == 0,
              "%s: reference backward", c->name);
    const double e_dq = mt_rel_l2(&dq, rdq), e_dk = mt_rel_l2(&dk, rdk), e_dv = mt_rel_l2(&dv, rdv);
    print_message("  %-26s %s %s: dQ err %.2e, dK err %.2e, dV err %.2e\n", c->name, an, fct_dtype_str(c->dtype),
                  e_dq, e_dk, e_dv);
    FCT_CHECK(e_dq <= tol && e_dk <= tol && e_dv <= tol, "%s (%s): gradient relative L2 (%.3e, %.3e, %.3e) > %.1e",
              c->name, an, e_dq, e_dk, e_dv, tol);
    if (dsinks) {
      FCT_CHECK(clEnqueueReadBuffer(env->queue, dsinks, CL_TRUE, 0, (size_t)Hq * sizeof(float), dsinks_dev, 0, NULL,
                                    NULL) == CL_SUCCESS,
                "%s: reading dsinks", c->name);
      for (int h = 0; h < Hq; h++) FCT_CHECK(!isnan(dsinks_dev[h]), "%s (%s): dsinks[%d] is NaN", c->name, an, h);
      const double e_ds = ref_dsinks_error(dsinks_dev, dsinks_ref, dsinks_rss2, Hq);
      print_message("  %-26s %s %s: dsinks err %.2e\n", c->name, an, fct_dtype_str(c->dtype), e_ds);
      FCT_CHECK(e_ds <= tol, "%s (%s): dsinks relative L2 %.3e > %.1e", c->name, an, e_ds, tol);
      clReleaseMemObject(dsinks);
    }
    free(rdq);
    free(rdk);
    free(rdv);
    fct_tensor_release(&dq);
    fct_tensor_release(&dk);
    fct_tensor_release(&dv);
  }
  free(ref_o);
  free(ref_lse);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
  mt_inputs_release(&in);
}

static void mt_both(void **state) {
  const mt_case *c = (const mt_case *)*state;
  if (c->mma) {
    mt_inputs in;
    flashcl_attention_desc desc;
    mt_inputs_create(&in, c);
    mt_desc(c, &in, FLASHCL_ALGO_FLASH, &desc);
    const int ready = fct_mma_ready(c->name, &desc, &in.q.t, &in.k.t, &in.v.t, FLASHCL_PASS_FORWARD) &&
                      (!c->backward || fct_mma_ready(c->name, &desc, &in.q.t, &in.k.t, &in.v.t, FLASHCL_PASS_BACKWARD));
    mt_inputs_release(&in);
    if (!ready) {
      FCT_SKIP();
      return;
    }
    mt_run(c, FLASHCL_ALGO_FLASH);
    if (c->backward) { /* and the atomic dQ mode */
      mt_deterministic = 0;
      mt_run(c, FLASHCL_ALGO_FLASH);
      mt_deterministic = 1; /* and mt_both_teardown, when a failed check leaves mt_run early */
    }
    return;
  }
  mt_run(c, FLASHCL_ALGO_FLASH);
  mt_run(c, FLASHCL_ALGO_NAIVE);
}

/* cmocka teardown of every table case, run on every path (also after a failed
 * check longjmps out of mt_both): the next case starts deterministic. */
static int mt_both_teardown(void **state) {
  (void)state;
  mt_deterministic = 1;
  return 0;
}

static const int VQ[3] = {37, 1, 80}, VK[3] = {50, 64, 20};

/* name, dtype, batch, nq, nk, hq, hkv, d, causal, wl, wr, alibi, softcap, scale, dropout, num_seqs, lens_q,
 * lens_k, backward, gpu_map, block, mma, sinks */
static const mt_case CASES[] = {
    {"window_left_small_tiles", FLASHCL_F32, 2, 70, 70, 2, 1, 32, 0, 9, -1, 0, 0, 0, 0, 0, NULL, NULL, 1, 0, 16},
    {"window_right", FLASHCL_F16, 1, 50, 70, 2, 2, 32, 0, -1, 5, 0, 0, 0, 0, 0, NULL, NULL, 0, 0},
    {"window_both", FLASHCL_BF16, 1, 70, 70, 2, 2, 64, 0, 7, 3, 0, 0, 0, 0, 0, NULL, NULL, 0, 0},
    {"window_causal_nq_lt_nk", FLASHCL_F32, 1, 40, 90, 2, 2, 32, 1, 12, -1, 0, 0, 0, 0, 0, NULL, NULL, 0, 0},
    {"window_empty_rows", FLASHCL_F32, 1, 64, 30, 2, 1, 32, 0, 2, 1, 0, 0, 0, 0, 0, NULL, NULL, 1, 0},
    {"alibi_causal_gqa", FLASHCL_F32, 2, 45, 45, 4, 2, 32, 1, -1, -1, 1, 0, 0, 0, 0, NULL, NULL, 0, 0},
    {"alibi_noncausal", FLASHCL_F16, 1, 33, 60, 4, 1, 32, 0, -1, -1, 1, 0, 0, 0, 0, NULL, NULL, 0, 0},
    {"softcap", FLASHCL_F32, 1, 50, 50, 2, 2, 32, 0, -1, -1, 0, 3.0f, 1.0f, 0, 0, NULL, NULL, 1, 0},
    {"softcap_causal", FLASHCL_F16, 2, 40, 56, 2, 1, 32, 1, -1, -1, 0, 2.0f, 0.5f, 0, 0, NULL, NULL, 0, 0},
    {"all_varlen_gqa", FLASHCL_F32, 0, 0, 0, 4, 2, 32, 1, 6, -1, 1, 4.0f, 0.5f, 0, 3, VQ, VK, 1, 0},
    {"all_varlen_dropout_gpu_map", FLASHCL_F32, 0, 0, 0, 4, 2, 32, 0, 6, 4, 1, 4.0f, 0.5f, 0.2f, 3, VQ, VK, 1, 1, 16},
    /* The tensor-core kernels (NVIDIA only; skipped elsewhere), forward and backward
     * in both dQ modes. Forward work-groups take 128 queries and 64-key (d = 64) or
     * 32-key (d = 128) tiles, backward ones 64-128 keys and 32-64-query tiles: these
     * windows skip whole tiles at both ends, per work-group and per warp. */
    {"mma_window_both_gqa", FLASHCL_F16, 2, 517, 517, 4, 2, 64, 0, 100, 30, 0, 0, 0, 0, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_window_causal_d128", FLASHCL_F16, 1, 300, 450, 2, 1, 128, 1, 64, -1, 0, 0, 0, 0, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_window_empty_rows_bf16", FLASHCL_BF16, 1, 450, 300, 2, 2, 64, 0, 20, 0, 0, 0, 0, 0, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_alibi_causal_gqa_d128", FLASHCL_F16, 1, 333, 333, 4, 2, 128, 1, -1, -1, 1, 0, 0, 0, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_softcap_d64", FLASHCL_F16, 2, 400, 380, 2, 2, 64, 0, -1, -1, 0, 2.0f, 1.0f, 0, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_softcap_large_scores", FLASHCL_F16, 1, 300, 300, 2, 1, 128, 0, -1, -1, 0, 30.0f, 4.0f, 0, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_all_varlen_bf16_d128", FLASHCL_BF16, 0, 0, 0, 4, 2, 128, 1, 6, -1, 1, 4.0f, 0.5f, 0, 3, VQ, VK, 1, 0, 0, 1},
    {"mma_all_long_d64", FLASHCL_F16, 1, 1000, 1000, 2, 2, 64, 1, 300, -1, 1, 10.0f, 0, 0, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_dropout_causal_gqa", FLASHCL_F16, 2, 300, 300, 4, 2, 64, 1, -1, -1, 0, 0, 0, 0.1f, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_dropout_d128_nq_lt_nk", FLASHCL_F16, 1, 257, 390, 2, 2, 128, 0, -1, -1, 0, 0, 0, 0.3f, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_dropout_all_varlen_bf16", FLASHCL_BF16, 0, 0, 0, 4, 2, 128, 1, 6, -1, 1, 4.0f, 0.5f, 0.2f, 3, VQ, VK, 1, 0, 0, 1},
    /* Past d = 128 (on Hopper: flash_bwd_wgmma_wide.cl; the forward with dropout runs mma.sync). */
    {"mma_all_varlen_bf16_d256", FLASHCL_BF16, 0, 0, 0, 4, 2, 256, 1, 6, -1, 1, 4.0f, 0.5f, 0, 3, VQ, VK, 1, 0, 0, 1},
    /* An odd multiple of 8: the forward with dropout on mma.sync (padded to 80
     * columns in local memory), the backward on the Hopper kernels (mma.sync,
     * padded the same way, on 8.x). */
    {"mma_dropout_window_d72", FLASHCL_F16, 2, 200, 260, 4, 2, 72, 1, 40, -1, 0, 0, 0, 0.15f, 0, NULL, NULL, 1, 0, 0, 1},
    {"mma_dropout_softcap_d208", FLASHCL_F16, 1, 257, 390, 2, 2, 208, 0, -1, -1, 0, 2.0f, 1.0f, 0.2f, 0, NULL, NULL, 1, 0,
     0, 1},
    /* Attention sinks: forward, backward with dsinks, flash and naive. The window
     * leaves rows with no key (O = 0, LSE = the sink); the last case runs the GPU
     * mapping of the portable forward with every variant on. */
    {"sinks_causal_gqa", FLASHCL_F32, 2, 40, 40, 4, 2, 32, 1, -1, -1, 0, 0, 0, 0, 0, NULL, NULL, 1, 0, 0, 0, 1},
    {"sinks_window_empty_rows_f16", FLASHCL_F16, 1, 64, 30, 2, 1, 32, 0, 2, 1, 0, 0, 0, 0, 0, NULL, NULL, 1, 0, 0, 0, 1},
    {"sinks_all_varlen_gpu_map", FLASHCL_F32, 0, 0, 0, 4, 2, 32, 1, 6, -1, 1, 4.0f, 0.5f, 0, 3, VQ, VK, 1, 1, 16, 0, 1},
    /* 2 x 1500 rows: the sinks' gradient sums its rows in two parts per head. */
    {"sinks_many_rows", FLASHCL_F32, 2, 1500, 12, 2, 1, 32, 0, -1, -1, 0, 0, 0, 0, 0, NULL, NULL, 1, 0, 0, 0, 1},
    /* Sinks on the tensor cores (NVIDIA only): the wgmma forward (d = 64/128 on
     * Hopper), the mma.sync forward (dropout; d = 256, forward only), and the
     * tensor-core backward with dsinks in both dQ modes. */
    {"mma_sinks_window_gqa", FLASHCL_F16, 2, 300, 300, 4, 2, 64, 1, 50, -1, 0, 0, 0, 0, 0, NULL, NULL, 1, 0, 0, 1, 1},
    {"mma_sinks_softcap_d128_bf16", FLASHCL_BF16, 1, 257, 390, 2, 1, 128, 0, -1, -1, 1, 2.0f, 1.0f, 0, 0, NULL, NULL, 1,
     0, 0, 1, 1},
    {"mma_sinks_dropout_d64", FLASHCL_F16, 1, 200, 200, 2, 2, 64, 1, -1, -1, 0, 0, 0, 0.1f, 0, NULL, NULL, 1, 0, 0, 1, 1},
    {"mma_sinks_d256_fwd", FLASHCL_F16, 1, 130, 170, 2, 2, 256, 0, -1, -1, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, 0, 1, 1},
};

/* ------------------------------------------------------------ error paths -- */

static void mt_error_paths(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  const mt_case c = {"errors", FLASHCL_F32, 1, 16, 16, 4, 2, 32, 0, -1, -1, 0, 0, 0, 0, 0, NULL, NULL, 1, 0};
  mt_inputs in;
  mt_inputs_create(&in, &c);
  fct_tensor o, lse, dq, dk, dv;
  fct_tensor_create(&o, c.dtype, FCT_BNHD, 1, 16, 4, 32, 4);
  fct_tensor_create_lse(&lse, FCT_BNHD, 1, 16, 4, 5);
  fct_tensor_create(&dq, c.dtype, FCT_BNHD, 1, 16, 4, 32, 6);
  fct_tensor_create(&dk, c.dtype, FCT_BNHD, 1, 16, 2, 32, 7);
  fct_tensor_create(&dv, c.dtype, FCT_BNHD, 1, 16, 2, 32, 8);
  const float three[3] = {0.5f, 0.25f, 0.125f};
  cl_mem short_alibi = fct_create_buffer(sizeof three, three); /* heads_q = 4 needs 16 bytes */

  for (int t = 0; t < 8; t++) {
    for (int bwd = 0; bwd < 2; bwd++) {
      flashcl_attention_desc desc;
      mt_desc(&c, &in, FLASHCL_ALGO_AUTO, &desc);
      flashcl_status want = FLASHCL_ERROR_INVALID_ARGUMENT;
      const char *what = "";
      switch (t) {
      case 0: desc.score.window_left = -2; what = "window_left = -2"; break;
      case 1: desc.score.window_right = -7; what = "window_right = -7"; break;
      case 2: desc.score.softcap = -1.0f; what = "softcap = -1"; break;
      case 3: desc.score.softcap = NAN; what = "softcap = NaN"; break;
      case 4: desc.score.softcap = INFINITY; what = "softcap = inf"; break;
      case 5: desc.score.alibi_slopes = short_alibi; want = FLASHCL_ERROR_BUFFER_TOO_SMALL; what = "alibi 12 bytes"; break;
      case 6: desc.score.window_left = INT32_MIN; what = "window_left = INT_MIN"; break;
      case 7: desc.score.sinks = short_alibi; want = FLASHCL_ERROR_BUFFER_TOO_SMALL; what = "sinks 12 bytes"; break;
      }
      fct_tensor_poison(&o);
      fct_tensor_poison(&lse);
      fct_tensor_poison(&dq);
      fct_tensor_poison(&dk);
      fct_tensor_poison(&dv);
      flashcl_status st;
      if (!bwd) {
        st = flashcl_attention_forward(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t, &o.t, &lse.t, 0, NULL, NULL);
      } else {
        /* o and lse are poison here: the call must fail before reading anything. */
        st = flashcl_attention_backward(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t, &o.t, &lse.t, &in.d_o.t, &dq.t,
                                        &dk.t, &dv.t, 0, NULL, NULL);
      }
      FCT_CHECK_STATUS(st, want, "%s (%s)", what, bwd ? "backward" : "forward");
      FCT_CHECK(strlen(flashcl_context_last_error(env->ctx)) > 0, "%s: no error message", what);
      size_t ws = 0;
      FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t,
                                                        bwd ? FLASHCL_PASS_BACKWARD : FLASHCL_PASS_FORWARD, &ws),
                       want, "%s: workspace_size", what);
      fct_finish();
      fct_tensor *const outs[] = {&o, &lse, &dq, &dk, &dv};
      FCT_CHECK(fct_tensors_written(outs, 5) == 0, "%s: a failed call wrote to an output", what);
    }
  }
  /* desc.backward.dsinks (backward only): it needs desc.score.sinks, heads_q floats, and memory of its own. */
  {
    const float four[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    cl_mem sinks = fct_create_buffer(sizeof four, four), dsinks = fct_create_buffer(sizeof four, four);
    for (int t = 0; t < 4; t++) {
      flashcl_attention_desc desc;
      mt_desc(&c, &in, FLASHCL_ALGO_AUTO, &desc);
      flashcl_status want = FLASHCL_ERROR_INVALID_ARGUMENT;
      const char *what = "";
      desc.score.sinks = sinks;
      desc.backward.dsinks = dsinks;
      switch (t) {
      case 0: desc.score.sinks = NULL; what = "dsinks without sinks"; break;
      case 1: desc.backward.dsinks = short_alibi; want = FLASHCL_ERROR_BUFFER_TOO_SMALL; what = "dsinks 12 bytes"; break;
      case 2: desc.backward.dsinks = sinks; what = "dsinks = sinks"; break;
      case 3: desc.backward.dsinks = in.q.t.buffer; what = "dsinks over q"; break;
      }
      fct_tensor_poison(&dq);
      fct_tensor_poison(&dk);
      fct_tensor_poison(&dv);
      const flashcl_status st = flashcl_attention_backward(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t, &o.t, &lse.t,
                                                           &in.d_o.t, &dq.t, &dk.t, &dv.t, 0, NULL, NULL);
      FCT_CHECK_STATUS(st, want, "%s (backward)", what);
      FCT_CHECK(strlen(flashcl_context_last_error(env->ctx)) > 0, "%s: no error message", what);
      fct_finish();
      fct_tensor *const outs[] = {&dq, &dk, &dv};
      FCT_CHECK(fct_tensors_written(outs, 3) == 0, "%s: a failed call wrote to an output", what);
      float back[4];
      FCT_CHECK(clEnqueueReadBuffer(env->queue, dsinks, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL) == CL_SUCCESS &&
                    memcmp(back, four, sizeof four) == 0,
                "%s: a failed call wrote dsinks", what);
    }
    clReleaseMemObject(sinks);
    clReleaseMemObject(dsinks);
  }
  /* The defaults: -1 / NULL / 0. */
  flashcl_attention_desc d0;
  flashcl_attention_desc_init(&d0);
  FCT_CHECK(d0.score.sinks == NULL && d0.backward.dsinks == NULL, "desc_init: sinks %p, dsinks %p", (void *)d0.score.sinks,
            (void *)d0.backward.dsinks);
  FCT_CHECK(d0.score.window_left == -1 && d0.score.window_right == -1 && d0.score.alibi_slopes == NULL && d0.score.softcap == 0.0f,
            "desc_init defaults (%d, %d, %p, %g)", d0.score.window_left, d0.score.window_right, (void *)d0.score.alibi_slopes,
            (double)d0.score.softcap);
  clReleaseMemObject(short_alibi);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
  fct_tensor_release(&dq);
  fct_tensor_release(&dk);
  fct_tensor_release(&dv);
  mt_inputs_release(&in);
}

/* window_right = 0 without causal is causal; an unbounded window is no window. */
static void mt_equivalences(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  const mt_case c = {"equiv", FLASHCL_F32, 1, 40, 48, 2, 2, 32, 0, -1, -1, 0, 0, 0, 0, 0, NULL, NULL, 0, 0};
  mt_inputs in;
  mt_inputs_create(&in, &c);
  fct_tensor o[2];
  for (int t = 0; t < 2; t++) {
    fct_tensor_create(&o[t], c.dtype, FCT_BNHD, 1, 40, 2, 32, 4 + t);
  }
  for (int pair = 0; pair < 2; pair++) {
    for (int t = 0; t < 2; t++) {
      flashcl_attention_desc desc;
      mt_desc(&c, &in, FLASHCL_ALGO_FLASH, &desc);
      if (pair == 0) {
        if (t == 0) desc.mask.causal = 1;
        else desc.score.window_right = 0;
      } else {
        if (t == 1) desc.score.window_left = desc.score.window_right = 1000000;
      }
      fct_tensor_poison(&o[t]);
      FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t, &o[t].t, NULL, 0, NULL,
                                                 NULL),
                       FLASHCL_SUCCESS, "equivalence %d/%d", pair, t);
      fct_finish();
      fct_tensor_download(&o[t]);
    }
    double e2 = 0.0;
    for (int64_t n = 0; n < 40; n++)
      for (int64_t h = 0; h < 2; h++)
        for (int64_t x = 0; x < 32; x++) {
          const double a = fct_tensor_get(&o[0], 0, n, h, x), b = fct_tensor_get(&o[1], 0, n, h, x);
          FCT_CHECK(!isnan(a) && !isnan(b), "equivalence %d: NaN", pair);
          e2 += (a - b) * (a - b);
        }
    FCT_CHECK(sqrt(e2) <= 1e-5, "%s: outputs differ by %.3e", pair == 0 ? "window_right = 0 vs causal"
                                                                      : "huge window vs none", sqrt(e2));
  }
  fct_tensor_release(&o[0]);
  fct_tensor_release(&o[1]);
  mt_inputs_release(&in);
}

int main(void) {
  enum { NC = sizeof CASES / sizeof CASES[0] };
  struct CMUnitTest tests[NC + 2];
  for (int i = 0; i < NC; i++) {
    struct CMUnitTest t = {CASES[i].name, mt_both, NULL, mt_both_teardown, (void *)&CASES[i]};
    tests[i] = t;
  }
  struct CMUnitTest e = cmocka_unit_test(mt_error_paths), q = cmocka_unit_test(mt_equivalences);
  tests[NC] = e;
  tests[NC + 1] = q;
  return fct_run_group("masks", tests, NC + 2, 1);
}
