/*
 * Paged K/V source for the forward pass (desc.paged.cache.block_table): chunked prefill
 * over an existing paged KV cache.
 *
 * Each case builds a paged cache on the host (pages in random order, page sizes 16
 * and 64, unused slots and pages NaN so that any read outside a sequence shows up
 * as NaN), runs the paged forward (flash or naive) of Nq new queries per sequence
 * against cache lengths (1, 17, 200, 1000) in one batch, causal, GQA, and compares
 * with the double-precision reference run on the equivalent contiguous K/V
 * (q = the last Nq positions: bottom-right alignment). Outputs are NaN-poisoned
 * before the call; tolerances (relative L2 of O): fp32 1e-5, fp16 2e-3, bf16 1e-2.
 * Rows that see no key (L_b < Nq - i) must give O = 0 and LSE = -inf exactly.
 * Also: the GPU work-item mapping forced on (the fwd tuning map=0, per call), an end-to-end
 * flashcl_kv_cache_append + paged forward against the contiguous forward over the
 * whole sequences, dropout/window/ALiBi/softcap against the contiguous forward,
 * packed varlen chunks (also with a speculative-decoding tree mask), the
 * tensor-core forward where the device has it, and the error paths (outputs
 * untouched).
 */
#include "common.h"
#include "reference_kvq.h"
#include "reference_masks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void upload(fct_tensor *t) {
  cl_int err = clEnqueueWriteBuffer(fct_env_get()->queue, t->t.buffer, CL_TRUE, 0, t->bytes, t->host, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueWriteBuffer failed: %d", (int)err);
}

static cl_mem int_buffer(const int32_t *v, size_t n) { return fct_create_buffer(n * sizeof(int32_t), v); }

/* Elements of t's buffer outside its view whose bits are no longer the poison
 * (call after fct_tensor_download): 0 unless a kernel wrote past the view, into
 * the guard after it. */
static size_t written_outside_view(const fct_tensor *t) {
  size_t inside = 0;
  for (int64_t b = 0; b < t->t.shape[0]; b++)
    for (int64_t n = 0; n < t->t.shape[1]; n++)
      for (int64_t h = 0; h < t->t.shape[2]; h++)
        for (int64_t x = 0; x < t->t.shape[3]; x++)
          inside += fct_is_poison(t->t.dtype, t->host, fct_tensor_index(t, b, n, h, x)) ? 0 : 1;
  return fct_tensor_count_unpoisoned(t) - inside;
}

static void contiguous_tensor(fct_tensor *t, flashcl_dtype dtype, int64_t B, int64_t N, int64_t H, int64_t D) {
  int64_t shape[4] = {B, N, H, D}, stride[4] = {N * H * D, H * D, D, 1};
  fct_tensor_create_custom(t, dtype, (size_t)(B * N * H * D) * fct_dtype_size(dtype), 0, shape, stride);
}

#define MAXB 4

typedef struct pp_case {
  const char *name;
  flashcl_dtype dtype;
  int batch;
  int lens[MAXB]; /* cache lengths L_b, including the Nq new tokens */
  int nq, hq, hkv, d, page_size;
  flashcl_algo algo;
  int gpu_map;                 /* 1: the fwd tuning map=0 (the GPU mapping) */
  flashcl_kernel_family kernel; /* NVIDIA_MMA: the tensor-core forward (skipped where it is not available) */
  int varlen;                  /* 1: packed queries (cu_seqlens_q), nqs[b] of them for sequence b */
  int nqs[MAXB];
} pp_case;

/* A paged K and V pool with a random page order. */
typedef struct pp_cache {
  fct_tensor k, v;
  int num_pages, max_pages;
  int32_t *table; /* [batch][max_pages] */
  cl_mem bt, lens;
} pp_cache;

/* V's pool has head dim dv (d: q's and K's). */
static void cache_build_dv(pp_cache *c, flashcl_dtype dt, int B, const int *lens, int hkv, int d, int dv, int ps,
                           fct_rng *rng) {
  int used = 0, maxl = 0;
  for (int b = 0; b < B; b++) {
    used += (lens[b] + ps - 1) / ps;
    if (lens[b] > maxl) maxl = lens[b];
  }
  c->max_pages = (maxl + ps - 1) / ps + 1;
  c->num_pages = used + 3; /* a few pages no sequence owns */
  int *perm = malloc(sizeof *perm * (size_t)c->num_pages);
  for (int i = 0; i < c->num_pages; i++) perm[i] = i;
  for (int i = c->num_pages - 1; i > 0; i--) {
    int j = (int)(fct_rng_u64(rng) % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  c->table = malloc(sizeof *c->table * (size_t)B * (size_t)c->max_pages);
  int next = 0;
  for (int b = 0; b < B; b++)
    for (int p = 0; p < c->max_pages; p++)
      c->table[b * c->max_pages + p] = p < (lens[b] + ps - 1) / ps ? perm[next++] : -7; /* never read */
  free(perm);
  contiguous_tensor(&c->k, dt, c->num_pages, ps, hkv, d);
  contiguous_tensor(&c->v, dt, c->num_pages, ps, hkv, dv);
  fct_tensor *pools[2] = {&c->k, &c->v};
  for (int t = 0; t < 2; t++) {
    fct_tensor *pt = pools[t];
    size_t n = pt->bytes / fct_dtype_size(dt);
    for (size_t i = 0; i < n; i++) fct_store_poison(dt, pt->host, i);
    for (int b = 0; b < B; b++)
      for (int j = 0; j < lens[b]; j++) {
        int page = c->table[b * c->max_pages + j / ps];
        for (int h = 0; h < hkv; h++)
          for (int x = 0; x < (t ? dv : d); x++)
            fct_store(dt, pt->host, fct_tensor_index(pt, page, j % ps, h, x), (float)fct_rng_normal(rng));
      }
    upload(pt);
  }
  c->bt = int_buffer(c->table, (size_t)B * (size_t)c->max_pages);
  c->lens = int_buffer((const int32_t *)lens, (size_t)B);
}

static void cache_build(pp_cache *c, flashcl_dtype dt, int B, const int *lens, int hkv, int d, int ps, fct_rng *rng) {
  cache_build_dv(c, dt, B, lens, hkv, d, d, ps, rng);
}

static void cache_release(pp_cache *c) {
  fct_tensor_release(&c->k);
  fct_tensor_release(&c->v);
  free(c->table);
  clReleaseMemObject(c->bt);
  clReleaseMemObject(c->lens);
}

/* Sequence b's keys (or values) as a contiguous double (L_b, hkv, d) array. */
static double *gather(const pp_cache *c, const fct_tensor *pool, int b, int len, int hkv, int d, int ps) {
  double *out = malloc(sizeof *out * (size_t)(len > 0 ? len : 1) * (size_t)hkv * (size_t)d);
  for (int j = 0; j < len; j++) {
    int page = c->table[b * c->max_pages + j / ps];
    for (int h = 0; h < hkv; h++)
      for (int x = 0; x < d; x++)
        out[((size_t)j * hkv + h) * d + x] = fct_tensor_get(pool, page, j % ps, h, x);
  }
  return out;
}

static void paged_desc(flashcl_attention_desc *desc, const pp_cache *c, int ps) {
  flashcl_attention_desc_init(desc);
  desc->mask.causal = 1;
  desc->paged.cache.block_table = c->bt;
  desc->paged.cache.page_size = ps;
  desc->paged.cache.max_pages = c->max_pages;
  desc->paged.seqlens = c->lens;
}

static void run_case(const pp_case *pc) {
  fct_env *env = fct_env_get();
  fct_rng rng;
  fct_rng_init(&rng, pc->name);
  const int B = pc->batch, hq = pc->hq, hkv = pc->hkv, d = pc->d, ps = pc->page_size;
  /* Sequence b's queries: rows [row0[b], row0[b] + nqb[b]) of batch entry qb[b]. */
  int nqb[MAXB], row0[MAXB], qb[MAXB], total = 0, nq_max = 0;
  int32_t cu[MAXB + 1] = {0};
  for (int b = 0; b < B; b++) {
    nqb[b] = pc->varlen ? pc->nqs[b] : pc->nq;
    row0[b] = pc->varlen ? total : 0;
    qb[b] = pc->varlen ? 0 : b;
    total += nqb[b];
    cu[b + 1] = total;
    if (nqb[b] > nq_max) nq_max = nqb[b];
  }
  const int QB = pc->varlen ? 1 : B, QN = pc->varlen ? total : pc->nq;
  pp_cache c;
  cache_build(&c, pc->dtype, B, pc->lens, hkv, d, ps, &rng);
  fct_tensor q, o, lse;
  contiguous_tensor(&q, pc->dtype, QB, QN, hq, d);
  fct_tensor_fill_random(&q, &rng);
  fct_tensor_create_guarded(&o, pc->dtype, FCT_BNHD, QB, QN, hq, d, 0, 64);
  fct_tensor_create_lse_guarded(&lse, FCT_BNHD, QB, QN, hq, 0, 64);
  fct_tensor_poison(&o);
  fct_tensor_poison(&lse);

  flashcl_attention_desc desc;
  paged_desc(&desc, &c, ps);
  desc.algorithm.algo = pc->algo;
  desc.algorithm.kernel = pc->kernel;
  cl_mem cub = NULL;
  if (pc->varlen) {
    cub = int_buffer(cu, (size_t)B + 1);
    desc.varlen.cu_seqlens_q = cub;
    desc.varlen.num_seqs = B;
    desc.varlen.max_seqlen_q = nq_max;
  }
  if (pc->kernel == FLASHCL_KERNEL_NVIDIA_MMA &&
      !fct_mma_ready(pc->name, &desc, &q.t, &c.k.t, &c.v.t, FLASHCL_PASS_FORWARD)) {
    /* No tensor-core path here (fct_mma_ready fails the test on an NVIDIA device
     * of compute capability >= 8.0): an explicit skip. */
    if (cub) clReleaseMemObject(cub);
    fct_tensor_release(&q);
    fct_tensor_release(&o);
    fct_tensor_release(&lse);
    cache_release(&c);
    FCT_SKIP();
    return;
  }
  if (pc->gpu_map) desc.algorithm.tuning = fct_gpu_map_tuning();
  flashcl_status st = flashcl_attention_forward(env->ctx, &desc, &q.t, &c.k.t, &c.v.t, &o.t, &lse.t, 0, NULL, NULL);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: paged forward", pc->name);
  fct_finish();
  fct_tensor_download(&o);
  fct_tensor_download(&lse);

  double num = 0, den = 0, lnum = 0, lden = 0;
  size_t nonfinite = 0, bad_empty = 0;
  double *ro = malloc(sizeof *ro * (size_t)(nq_max + 1) * hq * d), *rl = malloc(sizeof *rl * (size_t)(nq_max + 1) * hq);
  for (int b = 0; b < B; b++) {
    const int L = pc->lens[b], nq = nqb[b];
    if (nq == 0) continue;
    double *kd = gather(&c, &c.k, b, L, hkv, d, ps), *vd = gather(&c, &c.v, b, L, hkv, d, ps);
    ref_tensor qr = fct_tensor_ref(&q);
    qr.offset += (int64_t)qb[b] * qr.stride[0] + (int64_t)row0[b] * qr.stride[1];
    qr.shape[0] = 1;
    qr.shape[1] = nq;
    ref_tensor kr = ref_tensor_bnhd(kd, 1, L, hkv, d), vr = ref_tensor_bnhd(vd, 1, L, hkv, d);
    ref_out orr = ref_out_bnhd(ro, 1, nq, hq, d), lr = ref_out_bnhd(rl, 1, nq, hq, 1);
    ref_attention_params rp = {0};
    rp.causal = 1;
    FCT_CHECK(ref_attention_forward(&rp, &qr, &kr, &vr, &orr, &lr) == 0, "reference failed");
    for (int i = 0; i < nq; i++)
      for (int h = 0; h < hq; h++) {
        const double want_l = rl[(size_t)i * hq + h], got_l = fct_tensor_get(&lse, qb[b], row0[b] + i, h, 0);
        if (isinf(want_l)) {
          if (!(isinf(got_l) && got_l < 0)) bad_empty++;
        } else if (!isfinite(got_l)) {
          nonfinite++;
        } else {
          lnum += (got_l - want_l) * (got_l - want_l);
          lden += want_l * want_l;
        }
        for (int x = 0; x < d; x++) {
          const double want = ro[((size_t)i * hq + h) * d + x], got = fct_tensor_get(&o, qb[b], row0[b] + i, h, x);
          if (!isfinite(got)) {
            nonfinite++;
            continue;
          }
          if (isinf(want_l) && got != 0.0) bad_empty++;
          num += (got - want) * (got - want);
          den += want * want;
        }
      }
    free(kd);
    free(vd);
  }
  free(ro);
  free(rl);
  const double err = den > 0 ? sqrt(num / den) : sqrt(num), lerr = lden > 0 ? sqrt(lnum / lden) : sqrt(lnum);
  FCT_CHECK(nonfinite == 0, "%s: %zu non-finite outputs (NaN: a read outside the sequence or an unwritten row)",
            pc->name, nonfinite);
  FCT_CHECK(bad_empty == 0, "%s: %zu entries of rows without keys are not O = 0 / LSE = -inf", pc->name, bad_empty);
  FCT_CHECK(err <= fct_tolerance(pc->dtype), "%s: O rel L2 %.3g > %.3g", pc->name, err, fct_tolerance(pc->dtype));
  FCT_CHECK(lerr <= fct_lse_tolerance(pc->dtype), "%s: LSE rel L2 %.3g > %.3g", pc->name, lerr,
            fct_lse_tolerance(pc->dtype));
  /* The 64-element guards after o and lse are still poison: nothing written past the views. */
  const size_t o_out = written_outside_view(&o), l_out = written_outside_view(&lse);
  FCT_CHECK(o_out == 0 && l_out == 0, "%s: %zu element(s) of o's buffer and %zu of lse's outside the views written",
            pc->name, o_out, l_out);
  if (cub) clReleaseMemObject(cub);
  fct_tensor_release(&q);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
  cache_release(&c);
}

#define LENS {1, 17, 200, 1000}
#define MMA FLASHCL_KERNEL_NVIDIA_MMA
#define NQS {5, 0, 64, 130} /* varlen: a sequence without queries, one longer than its cache */
static const pp_case CASES[] = {
    {"paged_flash_f32_ps16_nq1", FLASHCL_F32, 4, LENS, 1, 4, 2, 64, 16, FLASHCL_ALGO_FLASH, 0},
    {"paged_flash_f32_ps16_nq7", FLASHCL_F32, 4, LENS, 7, 4, 2, 64, 16, FLASHCL_ALGO_FLASH, 0},
    {"paged_flash_f32_ps64_nq64", FLASHCL_F32, 4, LENS, 64, 4, 2, 64, 64, FLASHCL_ALGO_FLASH, 0},
    {"paged_flash_f16_ps64_nq7", FLASHCL_F16, 4, LENS, 7, 4, 1, 64, 64, FLASHCL_ALGO_FLASH, 0},
    {"paged_flash_f16_ps16_nq64", FLASHCL_F16, 4, LENS, 64, 8, 2, 32, 16, FLASHCL_ALGO_FLASH, 0},
    {"paged_flash_bf16_ps16_nq64", FLASHCL_BF16, 4, LENS, 64, 4, 2, 64, 16, FLASHCL_ALGO_FLASH, 0},
    {"paged_naive_f32_ps64_nq7", FLASHCL_F32, 4, LENS, 7, 4, 2, 64, 64, FLASHCL_ALGO_NAIVE, 0},
    {"paged_naive_f32_ps16_nq64", FLASHCL_F32, 4, LENS, 64, 4, 2, 64, 16, FLASHCL_ALGO_NAIVE, 0},
    {"paged_naive_f16_ps16_nq1", FLASHCL_F16, 4, LENS, 1, 4, 2, 64, 16, FLASHCL_ALGO_NAIVE, 0},
    {"paged_naive_bf16_ps64_nq64", FLASHCL_BF16, 4, LENS, 64, 4, 1, 64, 64, FLASHCL_ALGO_NAIVE, 0},
    {"paged_gpu_map_f32_ps16_nq64", FLASHCL_F32, 4, LENS, 64, 4, 2, 64, 16, FLASHCL_ALGO_FLASH, 1},
    {"paged_gpu_map_bf16_ps64_nq7", FLASHCL_BF16, 4, LENS, 7, 4, 2, 64, 64, FLASHCL_ALGO_FLASH, 1},
    /* Packed queries over the paged source (cu_seqlens_q + kv_seqlens). */
    {"paged_varlen_flash_f32_ps16", FLASHCL_F32, 4, LENS, 0, 4, 2, 64, 16, FLASHCL_ALGO_FLASH, 0, 0, 1, NQS},
    {"paged_varlen_flash_f16_ps64", FLASHCL_F16, 4, LENS, 0, 8, 2, 32, 64, FLASHCL_ALGO_FLASH, 0, 0, 1, NQS},
    {"paged_varlen_gpu_map_f32_ps16", FLASHCL_F32, 4, LENS, 0, 4, 2, 64, 16, FLASHCL_ALGO_FLASH, 1, 0, 1, NQS},
    {"paged_varlen_naive_f32_ps16", FLASHCL_F32, 4, LENS, 0, 4, 2, 64, 16, FLASHCL_ALGO_NAIVE, 0, 0, 1, NQS},
    /* The tensor-core forward (NVIDIA only): tiles of 32 / 64 keys over pages of
     * 16 (a tile spans pages), 64, and 24 (not a power of two: no shift). */
    {"paged_mma_f16_d128_ps16_nq64", FLASHCL_F16, 4, LENS, 64, 8, 2, 128, 16, FLASHCL_ALGO_FLASH, 0, MMA},
    {"paged_mma_bf16_d64_ps64_nq7", FLASHCL_BF16, 4, LENS, 7, 4, 1, 64, 64, FLASHCL_ALGO_FLASH, 0, MMA},
    {"paged_mma_f16_d64_ps24_nq130", FLASHCL_F16, 4, LENS, 130, 4, 2, 64, 24, FLASHCL_ALGO_FLASH, 0, MMA},
    {"paged_mma_varlen_f16_d128_ps64", FLASHCL_F16, 4, LENS, 0, 4, 2, 128, 64, FLASHCL_ALGO_FLASH, 0, MMA, 1, NQS},
    {"paged_mma_varlen_bf16_d64_ps16", FLASHCL_BF16, 4, LENS, 0, 8, 2, 64, 16, FLASHCL_ALGO_FLASH, 0, MMA, 1, NQS},
};

static void test_case(void **state) { run_case((const pp_case *)*state); }

/* flashcl_kv_cache_append a chunk of T tokens, then the paged forward of that chunk
 * equals the last T rows of the contiguous forward over the whole sequences. */
static void test_append_then_prefill(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  fct_rng rng;
  fct_rng_init(&rng, "paged/append_then_prefill");
  const flashcl_dtype dt = FLASHCL_F32;
  enum { B = 2, T = 7, HQ = 4, HKV = 2, D = 64, PS = 16 };
  const int prior[B] = {100, 37}, total[B] = {107, 44};
  pp_cache c;
  cache_build(&c, dt, B, total, HKV, D, PS, &rng); /* pages for the whole sequences */
  /* Full sequences (contiguous), one tensor per sequence. */
  fct_tensor kf[B], vf[B], qf[B], of[B], kn, vn, qc, oc;
  contiguous_tensor(&kn, dt, B, T, HKV, D);
  contiguous_tensor(&vn, dt, B, T, HKV, D);
  contiguous_tensor(&qc, dt, B, T, HQ, D);
  for (int b = 0; b < B; b++) {
    contiguous_tensor(&kf[b], dt, 1, total[b], HKV, D);
    contiguous_tensor(&vf[b], dt, 1, total[b], HKV, D);
    contiguous_tensor(&qf[b], dt, 1, total[b], HQ, D);
    contiguous_tensor(&of[b], dt, 1, total[b], HQ, D);
    fct_tensor_fill_random(&qf[b], &rng);
    fct_tensor_poison(&of[b]);
    /* The cache's first prior[b] tokens are the sequence's keys; the new chunk's
     * tokens are poisoned in the pool, to be written by the append. */
    for (int j = 0; j < total[b]; j++) {
      const int page = c.table[b * c.max_pages + j / PS];
      for (int h = 0; h < HKV; h++)
        for (int x = 0; x < D; x++) {
          const float kx = (float)fct_rng_normal(&rng), vx = (float)fct_rng_normal(&rng);
          fct_store(dt, kf[b].host, fct_tensor_index(&kf[b], 0, j, h, x), kx);
          fct_store(dt, vf[b].host, fct_tensor_index(&vf[b], 0, j, h, x), vx);
          if (j < prior[b]) {
            fct_store(dt, c.k.host, fct_tensor_index(&c.k, page, j % PS, h, x), kx);
            fct_store(dt, c.v.host, fct_tensor_index(&c.v, page, j % PS, h, x), vx);
          } else {
            fct_store_poison(dt, c.k.host, fct_tensor_index(&c.k, page, j % PS, h, x));
            fct_store_poison(dt, c.v.host, fct_tensor_index(&c.v, page, j % PS, h, x));
            fct_store(dt, kn.host, fct_tensor_index(&kn, b, j - prior[b], h, x), kx);
            fct_store(dt, vn.host, fct_tensor_index(&vn, b, j - prior[b], h, x), vx);
          }
        }
    }
    for (int i = 0; i < T; i++)
      for (int h = 0; h < HQ; h++)
        for (int x = 0; x < D; x++)
          fct_store(dt, qc.host, fct_tensor_index(&qc, b, i, h, x), (float)fct_tensor_get(&qf[b], 0, total[b] - T + i, h, x));
    upload(&kf[b]);
    upload(&vf[b]);
  }
  upload(&c.k);
  upload(&c.v);
  upload(&kn);
  upload(&vn);
  upload(&qc);
  contiguous_tensor(&oc, dt, B, T, HQ, D);
  fct_tensor_poison(&oc);

  flashcl_decode_desc dd;
  flashcl_decode_desc_init(&dd);
  dd.cache.page_size = PS;
  dd.cache.block_table = c.bt;
  dd.cache.max_pages = c.max_pages;
  cl_mem before = int_buffer(prior, B);
  FCT_CHECK_STATUS(flashcl_kv_cache_append(env->ctx, FCT_APPEND_DESC(&dd), &kn.t, &vn.t, &c.k.t, &c.v.t, before, 0, NULL, NULL),
                   FLASHCL_SUCCESS, "append");
  flashcl_attention_desc desc;
  paged_desc(&desc, &c, PS); /* c.lens holds total[] */
  FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &desc, &qc.t, &c.k.t, &c.v.t, &oc.t, NULL, 0, NULL, NULL),
                   FLASHCL_SUCCESS, "paged forward after the append");
  for (int b = 0; b < B; b++) {
    flashcl_attention_desc cd;
    flashcl_attention_desc_init(&cd);
    cd.mask.causal = 1;
    FCT_CHECK_STATUS(
        flashcl_attention_forward(env->ctx, &cd, &qf[b].t, &kf[b].t, &vf[b].t, &of[b].t, NULL, 0, NULL, NULL),
        FLASHCL_SUCCESS, "contiguous forward");
  }
  fct_finish();
  fct_tensor_download(&oc);
  double num = 0, den = 0;
  size_t nonfinite = 0;
  for (int b = 0; b < B; b++) {
    fct_tensor_download(&of[b]);
    for (int i = 0; i < T; i++)
      for (int h = 0; h < HQ; h++)
        for (int x = 0; x < D; x++) {
          const double got = fct_tensor_get(&oc, b, i, h, x), want = fct_tensor_get(&of[b], 0, total[b] - T + i, h, x);
          if (!isfinite(got) || !isfinite(want)) {
            nonfinite++;
            continue;
          }
          num += (got - want) * (got - want);
          den += want * want;
        }
  }
  const double err = sqrt(num / den);
  FCT_CHECK(nonfinite == 0, "%zu non-finite outputs", nonfinite);
  FCT_CHECK(err <= fct_tolerance(dt), "paged chunk vs contiguous: rel L2 %.3g", err);
  clReleaseMemObject(before);
  fct_tensor *all[] = {&kn, &vn, &qc, &oc};
  for (size_t i = 0; i < 4; i++) fct_tensor_release(all[i]);
  for (int b = 0; b < B; b++) {
    fct_tensor_release(&kf[b]);
    fct_tensor_release(&vf[b]);
    fct_tensor_release(&qf[b]);
    fct_tensor_release(&of[b]);
  }
  cache_release(&c);
}

/* Dropout, window, ALiBi and softcap compose with a paged source: with equal
 * lengths the paged forward must match the contiguous forward of the same keys
 * (same (b, h, i, j) indices, hence the same dropout mask) closely. */
static void variants_compose(const char *name, flashcl_dtype dt, flashcl_kernel_family kernel) {
  fct_env *env = fct_env_get();
  fct_rng rng;
  fct_rng_init(&rng, name);
  enum { B = 2, L = 200, NQ = 24, HQ = 4, HKV = 2, D = 64, PS = 16 };
  const int lens[B] = {L, L};
  pp_cache c;
  cache_build(&c, dt, B, lens, HKV, D, PS, &rng);
  fct_tensor kf, vf, q, op, oc, lp, lc;
  contiguous_tensor(&kf, dt, B, L, HKV, D);
  contiguous_tensor(&vf, dt, B, L, HKV, D);
  for (int b = 0; b < B; b++)
    for (int j = 0; j < L; j++)
      for (int h = 0; h < HKV; h++)
        for (int x = 0; x < D; x++) {
          const int page = c.table[b * c.max_pages + j / PS];
          fct_store(dt, kf.host, fct_tensor_index(&kf, b, j, h, x), (float)fct_tensor_get(&c.k, page, j % PS, h, x));
          fct_store(dt, vf.host, fct_tensor_index(&vf, b, j, h, x), (float)fct_tensor_get(&c.v, page, j % PS, h, x));
        }
  upload(&kf);
  upload(&vf);
  contiguous_tensor(&q, dt, B, NQ, HQ, D);
  fct_tensor_fill_random(&q, &rng);
  contiguous_tensor(&op, dt, B, NQ, HQ, D);
  contiguous_tensor(&oc, dt, B, NQ, HQ, D);
  fct_tensor_create_lse(&lp, FCT_BNHD, B, NQ, HQ, 0);
  fct_tensor_create_lse(&lc, FCT_BNHD, B, NQ, HQ, 0);
  const float slopes[HQ] = {0.5f, 0.25f, 0.125f, 0.0625f};
  cl_mem alibi = fct_create_buffer(sizeof slopes, slopes);
  /* The tensor-core kernels run only the flash path. */
  const int last = kernel == FLASHCL_KERNEL_NVIDIA_MMA ? FLASHCL_ALGO_FLASH : FLASHCL_ALGO_NAIVE;
  int no_mma = 0;
  for (int algo = FLASHCL_ALGO_FLASH; algo <= last; algo++) {
    fct_tensor *outs[4] = {&op, &oc, &lp, &lc};
    for (int i = 0; i < 4; i++) fct_tensor_poison(outs[i]);
    flashcl_attention_desc dp, dc;
    paged_desc(&dp, &c, PS);
    dp.varlen.max_seqlen_k = L;
    dp.algorithm.algo = (flashcl_algo)algo;
    dp.score.window_left = 50;
    dp.score.window_right = 0;
    dp.score.alibi_slopes = alibi;
    dp.score.softcap = 20.0f;
    dp.dropout.p = 0.2f;
    dp.dropout.seed = 0x1234567890abcdefull;
    dp.dropout.offset = 77;
    dp.algorithm.kernel = kernel;
    if (kernel == FLASHCL_KERNEL_NVIDIA_MMA && !fct_mma_ready(name, &dp, &q.t, &c.k.t, &c.v.t, FLASHCL_PASS_FORWARD)) {
      no_mma = 1; /* skipped below, after the release */
      break;
    }
    dc = dp;
    dc.paged.cache.block_table = NULL;
    dc.paged.seqlens = NULL;
    dc.paged.cache.page_size = dc.paged.cache.max_pages = 0;
    dc.varlen.max_seqlen_k = 0;
    FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &dp, &q.t, &c.k.t, &c.v.t, &op.t, &lp.t, 0, NULL, NULL),
                     FLASHCL_SUCCESS, "paged forward with variants (algo %d)", algo);
    FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &dc, &q.t, &kf.t, &vf.t, &oc.t, &lc.t, 0, NULL, NULL),
                     FLASHCL_SUCCESS, "contiguous forward with variants (algo %d)", algo);
    fct_finish();
    for (int i = 0; i < 4; i++) fct_tensor_download(outs[i]);
    double num = 0, den = 0, lmax = 0;
    size_t nonfinite = 0;
    for (int b = 0; b < B; b++)
      for (int i = 0; i < NQ; i++)
        for (int h = 0; h < HQ; h++) {
          const double gl = fct_tensor_get(&lp, b, i, h, 0), wl = fct_tensor_get(&lc, b, i, h, 0);
          if (!isfinite(gl) || !isfinite(wl)) nonfinite++;
          else if (fabs(gl - wl) > lmax) lmax = fabs(gl - wl);
          for (int x = 0; x < D; x++) {
            const double g = fct_tensor_get(&op, b, i, h, x), w = fct_tensor_get(&oc, b, i, h, x);
            if (!isfinite(g) || !isfinite(w)) {
              nonfinite++;
              continue;
            }
            num += (g - w) * (g - w);
            den += w * w;
          }
        }
    FCT_CHECK(nonfinite == 0, "algo %d: %zu non-finite outputs", algo, nonfinite);
    /* Both calls run the same arithmetic on the same keys; only the addresses differ. */
    FCT_CHECK(sqrt(num / den) <= 1e-5, "algo %d: paged vs contiguous rel L2 %.3g", algo, sqrt(num / den));
    FCT_CHECK(lmax <= 1e-4, "algo %d: paged vs contiguous LSE max diff %.3g", algo, lmax);
  }
  clReleaseMemObject(alibi);
  fct_tensor *all[] = {&kf, &vf, &q, &op, &oc, &lp, &lc};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fct_tensor_release(all[i]);
  cache_release(&c);
  if (no_mma) FCT_SKIP(); /* no tensor-core path (fct_mma_ready failed the test where one is required) */
}

/* Batched tree verification: each sequence's draft tokens (its last Nq_s keys,
 * packed varlen queries over the paged cache) see the whole prefix and, among the
 * drafts, only their ancestors in a binary tree (parent of draft t: (t - 1) / 2),
 * through a FLASHCL_MASK_BITS mask, with causal on. Compared with a double
 * reference computed here; a sequence without drafts sits in the middle. */
static int tree_visible(int L, int nq, int i, int j) {
  const int prefix = L - nq;
  if (j < prefix) return 1;
  int a = i, t = j - prefix;
  if (t > i) return 0;
  while (a > t) a = (a - 1) / 2;
  return a == t;
}

static void varlen_tree(const char *name, flashcl_dtype dt, flashcl_kernel_family kernel) {
  fct_env *env = fct_env_get();
  fct_rng rng;
  fct_rng_init(&rng, name);
  enum { B = 3, HQ = 4, HKV = 2, D = 64, PS = 16, LK = 130 };
  const int lens[B] = {40, 75, 130}, nqs[B] = {7, 0, 12};
  int32_t cu[B + 1] = {0};
  for (int b = 0; b < B; b++) cu[b + 1] = cu[b] + nqs[b];
  const int total = cu[B], rows = 12;
  pp_cache c;
  cache_build(&c, dt, B, lens, HKV, D, PS, &rng);
  fct_tensor q, o, lse;
  contiguous_tensor(&q, dt, 1, total, HQ, D);
  fct_tensor_fill_random(&q, &rng);
  fct_tensor_create_guarded(&o, dt, FCT_BNHD, 1, total, HQ, D, 0, 64);
  fct_tensor_create_lse_guarded(&lse, FCT_BNHD, 1, total, HQ, 0, 64);
  fct_tensor_poison(&o);
  fct_tensor_poison(&lse);
  size_t words = 0;
  FCT_CHECK_STATUS(flashcl_mask_words(rows, LK, &words), FLASHCL_SUCCESS, "flashcl_mask_words");
  const size_t W = words / rows;
  uint32_t *bits = calloc(words * B, sizeof *bits);
  for (int b = 0; b < B; b++)
    for (int i = 0; i < nqs[b]; i++)
      for (int j = 0; j < lens[b]; j++)
        if (tree_visible(lens[b], nqs[b], i, j)) bits[((size_t)b * rows + i) * W + j / 32] |= 1u << (j % 32);
  cl_mem mask = fct_create_buffer(words * B * sizeof *bits, bits), cub = int_buffer(cu, B + 1);

  flashcl_attention_desc desc;
  paged_desc(&desc, &c, PS);
  desc.algorithm.kernel = kernel;
  desc.varlen.cu_seqlens_q = cub;
  desc.varlen.num_seqs = B;
  desc.varlen.max_seqlen_q = rows;
  desc.varlen.max_seqlen_k = LK;
  desc.mask.kind = FLASHCL_MASK_BITS;
  desc.mask.bits = mask;
  const int run = kernel != FLASHCL_KERNEL_NVIDIA_MMA ||
                  fct_mma_ready(name, &desc, &q.t, &c.k.t, &c.v.t, FLASHCL_PASS_FORWARD);
  if (run) {
    FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &desc, &q.t, &c.k.t, &c.v.t, &o.t, &lse.t, 0, NULL, NULL),
                     FLASHCL_SUCCESS, "%s: paged varlen forward with a tree mask", name);
    fct_finish();
    fct_tensor_download(&o);
    fct_tensor_download(&lse);
    const double scale = 1.0 / sqrt((double)D);
    double num = 0, den = 0, lnum = 0, lden = 0, *s = malloc(sizeof *s * LK);
    size_t nonfinite = 0;
    for (int b = 0; b < B; b++) {
      double *kd = gather(&c, &c.k, b, lens[b], HKV, D, PS), *vd = gather(&c, &c.v, b, lens[b], HKV, D, PS);
      for (int i = 0; i < nqs[b]; i++)
        for (int h = 0; h < HQ; h++) {
          const int hk = h / (HQ / HKV);
          double m = -INFINITY, l = 0;
          for (int j = 0; j < lens[b]; j++) {
            s[j] = -INFINITY;
            if (!tree_visible(lens[b], nqs[b], i, j)) continue;
            double dot = 0;
            for (int x = 0; x < D; x++)
              dot += fct_tensor_get(&q, 0, cu[b] + i, h, x) * kd[((size_t)j * HKV + hk) * D + x];
            s[j] = dot * scale;
            if (s[j] > m) m = s[j];
          }
          for (int j = 0; j < lens[b]; j++) l += s[j] > -INFINITY ? exp(s[j] - m) : 0.0;
          for (int x = 0; x < D; x++) {
            double want = 0;
            for (int j = 0; j < lens[b]; j++)
              if (s[j] > -INFINITY) want += exp(s[j] - m) / l * vd[((size_t)j * HKV + hk) * D + x];
            const double got = fct_tensor_get(&o, 0, cu[b] + i, h, x);
            if (!isfinite(got)) nonfinite++;
            num += (got - want) * (got - want);
            den += want * want;
          }
          const double wl = m + log(l), gl = fct_tensor_get(&lse, 0, cu[b] + i, h, 0);
          if (!isfinite(gl)) nonfinite++;
          lnum += (gl - wl) * (gl - wl);
          lden += wl * wl;
        }
      free(kd);
      free(vd);
    }
    free(s);
    FCT_CHECK(nonfinite == 0, "%s: %zu non-finite outputs", name, nonfinite);
    FCT_CHECK(sqrt(num / den) <= fct_tolerance(dt), "%s: O rel L2 %.3g > %.3g", name, sqrt(num / den),
              fct_tolerance(dt));
    FCT_CHECK(sqrt(lnum / lden) <= fct_lse_tolerance(dt), "%s: LSE rel L2 %.3g", name, sqrt(lnum / lden));
    /* The 64-element guards after o and lse are still poison. */
    const size_t o_out = written_outside_view(&o), l_out = written_outside_view(&lse);
    FCT_CHECK(o_out == 0 && l_out == 0, "%s: %zu element(s) of o's buffer and %zu of lse's outside the views written",
              name, o_out, l_out);
  }
  free(bits);
  clReleaseMemObject(mask);
  clReleaseMemObject(cub);
  fct_tensor_release(&q);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
  cache_release(&c);
  if (!run) FCT_SKIP(); /* no tensor-core path (fct_mma_ready failed the test where one is required) */
}

/* A comparison run once per kernel family: fp32 on AUTO (the portable kernels on
 * PoCL), fp16 on the tensor cores where the device has them. */
typedef struct pp_family_case {
  const char *name;
  void (*run)(const char *name, flashcl_dtype dt, flashcl_kernel_family kernel);
  flashcl_dtype dtype;
  flashcl_kernel_family kernel;
} pp_family_case;

static const pp_family_case FAMILY_CASES[] = {
    {"paged_variants_compose", variants_compose, FLASHCL_F32, FLASHCL_KERNEL_AUTO},
    {"paged_variants_compose_mma", variants_compose, FLASHCL_F16, FLASHCL_KERNEL_NVIDIA_MMA},
    {"paged_varlen_tree", varlen_tree, FLASHCL_F32, FLASHCL_KERNEL_AUTO},
    {"paged_varlen_tree_mma", varlen_tree, FLASHCL_F16, FLASHCL_KERNEL_NVIDIA_MMA},
};

static void test_family_case(void **state) {
  const pp_family_case *fc = (const pp_family_case *)*state;
  fc->run(fc->name, fc->dtype, fc->kernel);
}

/* ---- a quantized paged source (desc.paged.cache.k_scale / v_scale) ---- */

/* One pool side: fmt FLASHCL_I8 / F8E4M3 / F8E5M2 / I4X2 with scales of `kind`, or
 * plain (fmt = q's dtype). */
typedef struct pq_case {
  const char *name;
  flashcl_dtype dtype; /* q's */
  flashcl_dtype kfmt, vfmt;
  flashcl_kv_scale kkind, vkind;
  int gpu_map;
  flashcl_algo algo;
  int dv; /* v's and o's head dim (desc.shape.head_dim_v); 0: q's */
  flashcl_kernel_family kernel; /* NVIDIA_MMA: the tensor-core forward (skipped where it is not available) */
  int d;                        /* q's and k's head dim; 0: 64 */
  const char *tuning;           /* desc.algorithm.tuning as flashcl_tuning_parse reads it, or NULL */
  float softcap;                /* desc.score.softcap (0: off) */
  int window;                   /* > 0: desc.score.window_left = window */
} pq_case;

/* A pool in fmt coded from src's values at the rows sequences own (the
 * others: code 0xff, NaN in both fp8 formats, and a NaN scale under TOKEN and
 * BLOCK32, so that a read of them shows up), its scale buffer, and the
 * dequantized values (double, src's contiguous index) for the reference. */
typedef struct pq_pool {
  fct_tensor codes;
  cl_mem scale;
  double *deq;
} pq_pool;

static size_t pq_scale_index(flashcl_kv_scale kind, size_t row, int hkv, int h, int d, int x) {
  if (kind == FLASHCL_KV_SCALE_BLOCK32) return (row * (size_t)hkv + (size_t)h) * (size_t)(d / 32) + (size_t)(x / 32);
  return kind == FLASHCL_KV_SCALE_TENSOR ? 0 : kind == FLASHCL_KV_SCALE_HEAD ? (size_t)h : row * (size_t)hkv + (size_t)h;
}

static void pq_pool_build(pq_pool *pp, const pp_cache *c, const fct_tensor *src, flashcl_dtype fmt,
                          flashcl_kv_scale kind, int B, const int *lens, int hkv, int d, int ps) {
  const size_t rows = (size_t)c->num_pages * (size_t)ps, n = rows * (size_t)hkv * (size_t)d;
  const size_t ns = kind == FLASHCL_KV_SCALE_TENSOR ? 1 : kind == FLASHCL_KV_SCALE_HEAD ? (size_t)hkv
                    : kind == FLASHCL_KV_SCALE_TOKEN ? rows * (size_t)hkv : rows * (size_t)hkv * (size_t)(d / 32);
  float *scale = malloc(sizeof *scale * ns), *x = malloc(sizeof *x * n);
  char *used = calloc(rows, 1);
  for (size_t i = 0; i < ns; i++) scale[i] = NAN;
  for (int b = 0; b < B; b++)
    for (int j = 0; j < lens[b]; j++) used[(size_t)c->table[b * c->max_pages + j / ps] * ps + (size_t)(j % ps)] = 1;
  float amax[8] = {0}, all = 0.0f; /* per head (HEAD), and over the pool (TENSOR) */
  for (size_t r = 0; r < rows; r++)
    for (int h = 0; h < hkv; h++)
      for (int e = 0; e < d; e++) {
        const size_t i = (r * (size_t)hkv + (size_t)h) * (size_t)d + (size_t)e;
        x[i] = used[r] ? (float)fct_tensor_get(src, (int64_t)(r / (size_t)ps), (int64_t)(r % (size_t)ps), h, e) : 0.0f;
        if (fabsf(x[i]) > amax[h]) amax[h] = fabsf(x[i]);
        if (fabsf(x[i]) > all) all = fabsf(x[i]);
      }
  for (size_t r = 0; r < rows; r++)
    for (int h = 0; h < hkv && used[r]; h++)
      for (int e = 0; e < d; e += kind == FLASHCL_KV_SCALE_BLOCK32 ? 32 : d) {
        const float *row = x + (r * (size_t)hkv + (size_t)h) * (size_t)d;
        const float s = kind == FLASHCL_KV_SCALE_TENSOR ? all / kvq_ref_qmax(fmt)
                        : kind == FLASHCL_KV_SCALE_HEAD ? amax[h] / kvq_ref_qmax(fmt)
                        : kind == FLASHCL_KV_SCALE_TOKEN ? kvq_ref_token_scale(fmt, row, d)
                                                         : kvq_ref_token_scale(fmt, row + e, 32);
        scale[pq_scale_index(kind, r, hkv, h, d, e)] = s;
      }
  /* int4: a row is d / 2 bytes of two codes each */
  const size_t rb = kvq_ref_row_bytes(fmt, (size_t)d);
  contiguous_tensor(&pp->codes, fmt, c->num_pages, ps, hkv, (int)rb);
  uint8_t *codes = pp->codes.host;
  pp->deq = malloc(sizeof *pp->deq * n);
  for (size_t r = 0; r < rows; r++)
    for (int h = 0; h < hkv; h++)
      for (int e = 0; e < d; e++) {
        const size_t i = (r * (size_t)hkv + (size_t)h) * (size_t)d + (size_t)e;
        uint8_t *row = codes + (r * (size_t)hkv + (size_t)h) * rb;
        const float s = scale[pq_scale_index(kind, r, hkv, h, d, e)];
        kvq_ref_put(fmt, row, (size_t)e, used[r] ? kvq_ref_encode(fmt, x[i], s) : 0xff);
        pp->deq[i] = used[r] ? (double)kvq_ref_decode(fmt, kvq_ref_get(fmt, row, (size_t)e)) * (double)s : NAN;
      }
  upload(&pp->codes);
  pp->scale = fct_create_buffer(sizeof *scale * ns, scale);
  free(scale);
  free(x);
  free(used);
}

static void pq_pool_release(pq_pool *pp) {
  fct_tensor_release(&pp->codes);
  clReleaseMemObject(pp->scale);
  free(pp->deq);
}

/* Sequence b's rows of a dequantized pool as a contiguous double (L_b, hkv, d) array. */
static double *gather_deq(const pp_cache *c, const double *deq, int b, int len, int hkv, int d, int ps) {
  double *out = malloc(sizeof *out * (size_t)(len > 0 ? len : 1) * (size_t)hkv * (size_t)d);
  for (int j = 0; j < len; j++) {
    const size_t row = (size_t)c->table[b * c->max_pages + j / ps] * ps + (size_t)(j % ps);
    memcpy(out + (size_t)j * hkv * d, deq + row * hkv * d, sizeof *out * (size_t)hkv * (size_t)d);
  }
  return out;
}

/* The paged forward over quantized pools (a plain side keeps q's dtype)
 * against the double reference over the same dequantized values. */
static void test_quant_case(void **state) {
  const pq_case *pc = (const pq_case *)*state;
  fct_env *env = fct_env_get();
  fct_rng rng;
  fct_rng_init(&rng, pc->name);
  enum { B = 3, NQ = 40, HQ = 4, HKV = 2, PS = 16 };
  const int lens[B] = {17, 200, 90}, D = pc->d ? pc->d : 64, DV = pc->dv ? pc->dv : D;
  pp_cache c;
  cache_build_dv(&c, pc->dtype, B, lens, HKV, D, DV, PS, &rng);
  const int kq = pc->kfmt != pc->dtype, vq = pc->vfmt != pc->dtype;
  pq_pool kp = {0}, vp = {0};
  if (kq) pq_pool_build(&kp, &c, &c.k, pc->kfmt, pc->kkind, B, lens, HKV, D, PS);
  if (vq) pq_pool_build(&vp, &c, &c.v, pc->vfmt, pc->vkind, B, lens, HKV, DV, PS);
  fct_tensor q, o, lse;
  contiguous_tensor(&q, pc->dtype, B, NQ, HQ, D);
  fct_tensor_fill_random(&q, &rng);
  fct_tensor_create_guarded(&o, pc->dtype, FCT_BNHD, B, NQ, HQ, DV, 0, 64);
  fct_tensor_create_lse_guarded(&lse, FCT_BNHD, B, NQ, HQ, 0, 64);
  fct_tensor_poison(&o);
  fct_tensor_poison(&lse);
  flashcl_attention_desc desc;
  paged_desc(&desc, &c, PS);
  if (DV != D) desc.shape.head_dim_v = DV;
  desc.paged.cache.k_scale = kq ? kp.scale : NULL;
  desc.paged.cache.v_scale = vq ? vp.scale : NULL;
  desc.paged.cache.k_scale_kind = pc->kkind;
  desc.paged.cache.v_scale_kind = pc->vkind;
  if (pc->gpu_map) desc.algorithm.tuning = fct_gpu_map_tuning();
  flashcl_tuning tune;
  if (pc->tuning) {
    FCT_CHECK_STATUS(flashcl_tuning_parse(env->ctx, pc->tuning, &tune), FLASHCL_SUCCESS, "%s: tuning", pc->name);
    desc.algorithm.tuning = &tune;
  }
  desc.algorithm.algo = pc->algo;
  desc.algorithm.kernel = pc->kernel;
  desc.score.softcap = pc->softcap;
  if (pc->window > 0) desc.score.window_left = pc->window;
  if (pc->kernel == FLASHCL_KERNEL_NVIDIA_MMA &&
      !fct_mma_ready(pc->name, &desc, &q.t, kq ? &kp.codes.t : &c.k.t, vq ? &vp.codes.t : &c.v.t,
                     FLASHCL_PASS_FORWARD)) {
    if (kq) pq_pool_release(&kp);
    if (vq) pq_pool_release(&vp);
    fct_tensor_release(&q), fct_tensor_release(&o), fct_tensor_release(&lse);
    cache_release(&c);
    FCT_SKIP();
    return;
  }
  FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &desc, &q.t, kq ? &kp.codes.t : &c.k.t,
                                             vq ? &vp.codes.t : &c.v.t, &o.t, &lse.t, 0, NULL, NULL),
                   FLASHCL_SUCCESS, "%s: quantized paged forward", pc->name);
  fct_finish();
  fct_tensor_download(&o);
  fct_tensor_download(&lse);
  double num = 0, den = 0, lnum = 0, lden = 0, rl[NQ * HQ], *ro = malloc(sizeof *ro * NQ * HQ * (size_t)DV);
  FCT_CHECK(ro != NULL, "out of host memory");
  size_t nonfinite = 0;
  for (int b = 0; b < B; b++) {
    double *kd = kq ? gather_deq(&c, kp.deq, b, lens[b], HKV, D, PS) : gather(&c, &c.k, b, lens[b], HKV, D, PS);
    double *vd = vq ? gather_deq(&c, vp.deq, b, lens[b], HKV, DV, PS) : gather(&c, &c.v, b, lens[b], HKV, DV, PS);
    ref_tensor qr = fct_tensor_ref(&q);
    qr.offset += (int64_t)b * qr.stride[0];
    qr.shape[0] = 1;
    ref_tensor kr = ref_tensor_bnhd(kd, 1, lens[b], HKV, D), vr = ref_tensor_bnhd(vd, 1, lens[b], HKV, DV);
    ref_out orr = ref_out_bnhd(ro, 1, NQ, HQ, DV), lr = ref_out_bnhd(rl, 1, NQ, HQ, 1);
    ref_attention_params rp = {0};
    rp.causal = 1;
    const ref_masks rm = {pc->window > 0 ? pc->window : -1, -1, NULL, pc->softcap, NULL, NULL, NULL};
    FCT_CHECK(ref_masks_forward(&rp, &rm, NULL, &qr, &kr, &vr, &orr, &lr) == 0, "reference failed");
    for (int i = 0; i < NQ; i++)
      for (int h = 0; h < HQ; h++) {
        const double want_l = rl[i * HQ + h], got_l = fct_tensor_get(&lse, b, i, h, 0);
        if (isinf(want_l) != isinf(got_l) || isnan(got_l)) nonfinite++;
        if (isfinite(want_l) && isfinite(got_l)) {
          lnum += (got_l - want_l) * (got_l - want_l);
          lden += want_l * want_l;
        }
        for (int x = 0; x < DV; x++) {
          const double want = ro[(i * HQ + h) * DV + x], got = fct_tensor_get(&o, b, i, h, x);
          if (!isfinite(got)) nonfinite++;
          else {
            num += (got - want) * (got - want);
            den += want * want;
          }
        }
      }
    free(kd);
    free(vd);
  }
  const double err = sqrt(num / den), lerr = sqrt(lnum / lden);
  /* The tensor cores read K as code * scale rounded to bf16 (2^-9) where its
   * scales vary by row or block (flash_fwd_mma.cl, "Quantized pools"): that
   * rounding, absent from the reference, reaches the LSE at ~1e-4. */
  const int k_rounded = pc->kernel == FLASHCL_KERNEL_NVIDIA_MMA && kq && pc->dtype == FLASHCL_BF16 &&
                        (pc->kkind == FLASHCL_KV_SCALE_TOKEN || pc->kkind == FLASHCL_KV_SCALE_BLOCK32);
  const double ltol = fct_lse_tolerance(pc->dtype) * (k_rounded ? 4.0 : 1.0);
  FCT_CHECK(nonfinite == 0, "%s: %zu non-finite or misplaced -inf outputs (a read outside the sequences?)",
            pc->name, nonfinite);
  FCT_CHECK(err <= fct_tolerance(pc->dtype), "%s: O rel L2 %.3g > %.3g", pc->name, err, fct_tolerance(pc->dtype));
  FCT_CHECK(lerr <= ltol, "%s: LSE rel L2 %.3g > %.3g", pc->name, lerr, ltol);
  FCT_CHECK(written_outside_view(&o) == 0 && written_outside_view(&lse) == 0, "%s: written past the views",
            pc->name);
  free(ro);
  print_message("    ok  %s: O rel L2 %.3g, LSE rel L2 %.3g\n", pc->name, err, lerr);
  if (kq) pq_pool_release(&kp);
  if (vq) pq_pool_release(&vp);
  fct_tensor_release(&q);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
  cache_release(&c);
}

#define TOK FLASHCL_KV_SCALE_TOKEN
#define BLK FLASHCL_KV_SCALE_BLOCK32
#define FLASH FLASHCL_ALGO_FLASH
static const pq_case QUANT_CASES[] = {
    {"paged_quant_f32_k_i8_token_v_e4m3_block32", FLASHCL_F32, FLASHCL_I8, FLASHCL_F8E4M3, TOK, BLK, 0, FLASH},
    {"paged_quant_f16_k_e5m2_head_v_i8_tensor", FLASHCL_F16, FLASHCL_F8E5M2, FLASHCL_I8, FLASHCL_KV_SCALE_HEAD,
     FLASHCL_KV_SCALE_TENSOR, 0, FLASH},
    {"paged_quant_bf16_k_i8_block32_v_plain_gpu_map", FLASHCL_BF16, FLASHCL_I8, FLASHCL_BF16, BLK, TOK, 1, FLASH},
    {"paged_quant_f16_k_plain_v_e4m3_token_gpu_map", FLASHCL_F16, FLASHCL_F16, FLASHCL_F8E4M3, TOK, TOK, 1, FLASH},
    /* The naive path dequantizes as it gathers the pools (naive_pack_paged_q). */
    {"paged_quant_naive_f32_k_e4m3_block32_v_e5m2_head", FLASHCL_F32, FLASHCL_F8E4M3, FLASHCL_F8E5M2, BLK,
     FLASHCL_KV_SCALE_HEAD, 0, FLASHCL_ALGO_NAIVE},
    {"paged_quant_naive_f16_k_i8_token_v_plain", FLASHCL_F16, FLASHCL_I8, FLASHCL_F16, TOK, TOK, 0,
     FLASHCL_ALGO_NAIVE},
    /* V with a head dim of its own (MLA-like): its BLOCK32 scales count V's row. */
    {"paged_quant_f32_dv32_k_i8_block32_v_e4m3_block32", FLASHCL_F32, FLASHCL_I8, FLASHCL_F8E4M3, BLK, BLK, 0, FLASH,
     32},
    {"paged_quant_naive_f16_dv32_k_e5m2_token_v_i8_block32", FLASHCL_F16, FLASHCL_F8E5M2, FLASHCL_I8, TOK, BLK, 0,
     FLASHCL_ALGO_NAIVE, 32},
    /* The tensor-core forward (flash_fwd_mma.cl's quantized sides): both
     * layouts of its K/V stages (d = 64: two stages, Q in registers; d = 128:
     * Q in local memory), every format and scale layout, a plain side beside a
     * quantized one; skipped where the tensor cores are not available. */
    {"paged_quant_mma_f16_k_i8_token_v_e4m3_head", FLASHCL_F16, FLASHCL_I8, FLASHCL_F8E4M3, TOK,
     FLASHCL_KV_SCALE_HEAD, 0, FLASH, 0, MMA},
    {"paged_quant_mma_bf16_k_e5m2_block32_v_i8_tensor", FLASHCL_BF16, FLASHCL_F8E5M2, FLASHCL_I8, BLK,
     FLASHCL_KV_SCALE_TENSOR, 0, FLASH, 0, MMA},
    {"paged_quant_mma_f16_d128_k_e4m3_block32_v_i8_token", FLASHCL_F16, FLASHCL_F8E4M3, FLASHCL_I8, BLK, TOK, 0,
     FLASH, 0, MMA, 128},
    {"paged_quant_mma_f16_d128_k_plain_v_e5m2_block32", FLASHCL_F16, FLASHCL_F16, FLASHCL_F8E5M2, TOK, BLK, 0, FLASH,
     0, MMA, 128},
    {"paged_quant_mma_bf16_d96_k_i8_head_v_plain", FLASHCL_BF16, FLASHCL_I8, FLASHCL_BF16, FLASHCL_KV_SCALE_HEAD, TOK,
     0, FLASH, 0, MMA, 96},
    /* d = 72: a zero-filled padding chunk per row, chunks spread over the
     * work-items without a fixed column; one K/V stage (K and V quantized in
     * turn, V published before the second barrier). */
    {"paged_quant_mma_f16_d72_k_e4m3_tensor_v_i8_token", FLASHCL_F16, FLASHCL_F8E4M3, FLASHCL_I8,
     FLASHCL_KV_SCALE_TENSOR, TOK, 0, FLASH, 0, MMA, 72},
    {"paged_quant_mma_f16_d128_one_stage_k_i8_token_v_e5m2_head", FLASHCL_F16, FLASHCL_I8, FLASHCL_F8E5M2, TOK,
     FLASHCL_KV_SCALE_HEAD, 0, FLASH, 0, MMA, 128, "mma_fwd kv_stages=1"},
    /* d = 56: a fixed column per work-item and a padding chunk; K's one scale
     * before the softcap and the window (score variants on the tensor cores). */
    {"paged_quant_mma_f16_d56_softcap_window_k_e5m2_head_v_e4m3_token", FLASHCL_F16, FLASHCL_F8E5M2,
     FLASHCL_F8E4M3, FLASHCL_KV_SCALE_HEAD, TOK, 0, FLASH, 0, MMA, 56, NULL, 4.0f, 37},
    /* The same variants on the portable kernel (both mappings). */
    {"paged_quant_f32_softcap_window_k_i8_block32_v_e5m2_head", FLASHCL_F32, FLASHCL_I8, FLASHCL_F8E5M2, BLK,
     FLASHCL_KV_SCALE_HEAD, 0, FLASH, 0, FLASHCL_KERNEL_AUTO, 64, NULL, 4.0f, 37},
    {"paged_quant_f16_softcap_window_gpu_map_k_e4m3_token_v_i8_token", FLASHCL_F16, FLASHCL_F8E4M3, FLASHCL_I8, TOK,
     TOK, 1, FLASH, 0, FLASHCL_KERNEL_AUTO, 64, NULL, 4.0f, 37},
    /* int4 pools (two codes a byte): both mappings, the naive path, and V
     * with a head dim of its own. */
    {"paged_quant_f16_k_i4_block32_v_i4_token", FLASHCL_F16, FLASHCL_I4X2, FLASHCL_I4X2, BLK, TOK, 0, FLASH},
    {"paged_quant_bf16_k_i4_head_v_i8_block32_gpu_map", FLASHCL_BF16, FLASHCL_I4X2, FLASHCL_I8,
     FLASHCL_KV_SCALE_HEAD, BLK, 1, FLASH},
    {"paged_quant_naive_f32_k_i4_block32_v_i4_tensor", FLASHCL_F32, FLASHCL_I4X2, FLASHCL_I4X2, BLK,
     FLASHCL_KV_SCALE_TENSOR, 0, FLASHCL_ALGO_NAIVE},
    {"paged_quant_f32_dv32_k_e4m3_token_v_i4_block32", FLASHCL_F32, FLASHCL_F8E4M3, FLASHCL_I4X2, TOK, BLK, 0, FLASH,
     32},
    /* int4 on the tensor-core forward: codes under one scale, code * scale
     * under row scales, one K/V stage at d = 80 (40-byte rows). */
    {"paged_quant_mma_f16_d128_k_i4_block32_v_i4_head", FLASHCL_F16, FLASHCL_I4X2, FLASHCL_I4X2, BLK,
     FLASHCL_KV_SCALE_HEAD, 0, FLASH, 0, MMA, 128},
    {"paged_quant_mma_bf16_k_i4_token_v_plain", FLASHCL_BF16, FLASHCL_I4X2, FLASHCL_BF16, TOK, TOK, 0, FLASH, 0, MMA},
    {"paged_quant_mma_f16_d80_one_stage_k_e5m2_tensor_v_i4_token", FLASHCL_F16, FLASHCL_F8E5M2, FLASHCL_I4X2,
     FLASHCL_KV_SCALE_TENSOR, TOK, 0, FLASH, 0, MMA, 80, "mma_fwd kv_stages=1"},
};
#undef FLASH
#undef TOK
#undef BLK

static void expect_untouched(fct_tensor *t, const char *what) {
  fct_tensor_download(t);
  FCT_CHECK(fct_tensor_count_unpoisoned(t) == 0, "%s: a failed call wrote to its output", what);
}

static void test_errors(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  flashcl_context *ctx = env->ctx;
  fct_rng rng;
  fct_rng_init(&rng, "paged/errors");
  const int lens[2] = {20, 30};
  pp_cache c;
  cache_build(&c, FLASHCL_F32, 2, lens, 2, 64, 16, &rng);
  fct_tensor q, o, lse, k8;
  contiguous_tensor(&q, FLASHCL_F32, 2, 4, 4, 64);
  fct_tensor_fill_random(&q, &rng);
  contiguous_tensor(&o, FLASHCL_F32, 2, 4, 4, 64);
  fct_tensor_create_lse(&lse, FCT_BNHD, 2, 4, 4, 0);
  contiguous_tensor(&k8, FLASHCL_F32, c.num_pages, 8, 2, 64); /* page dimension 8 */
  fct_tensor_fill_random(&k8, &rng);
  fct_tensor_poison(&o);
  fct_tensor_poison(&lse);
  cl_mem small = fct_create_buffer(4, NULL);
  const int32_t cu[3] = {0, 2, 4};
  cl_mem cub = int_buffer(cu, 3);
  flashcl_attention_desc base, d;
  paged_desc(&base, &c, 16);

#define EXPECT(expr, status, what)                        \
  do {                                                    \
    FCT_CHECK_STATUS((expr), (status), "%s", what);       \
    expect_untouched(&o, what);                           \
    expect_untouched(&lse, what);                         \
  } while (0)
#define FWD(dd, kk, vv) flashcl_attention_forward(ctx, &(dd), &q.t, &(kk), &(vv), &o.t, &lse.t, 0, NULL, NULL)
  for (int algo = FLASHCL_ALGO_FLASH; algo <= FLASHCL_ALGO_NAIVE; algo++) {
    d = base; d.algorithm.algo = (flashcl_algo)algo; d.paged.cache.page_size = 0;
    EXPECT(FWD(d, c.k.t, c.v.t), FLASHCL_ERROR_INVALID_SHAPE, "page_size 0");
    d = base; d.algorithm.algo = (flashcl_algo)algo; d.paged.cache.page_size = 8;
    EXPECT(FWD(d, c.k.t, c.v.t), FLASHCL_ERROR_INVALID_SHAPE, "page_size != k.shape[1]");
    d = base; d.algorithm.algo = (flashcl_algo)algo;
    EXPECT(FWD(d, k8.t, c.v.t), FLASHCL_ERROR_INVALID_SHAPE, "k and v pools of different shapes");
    d = base; d.algorithm.algo = (flashcl_algo)algo; d.paged.cache.max_pages = 0;
    EXPECT(FWD(d, c.k.t, c.v.t), FLASHCL_ERROR_INVALID_SHAPE, "max_pages 0");
    d = base; d.algorithm.algo = (flashcl_algo)algo; d.paged.cache.block_table = small;
    EXPECT(FWD(d, c.k.t, c.v.t), FLASHCL_ERROR_BUFFER_TOO_SMALL, "block table too small");
    d = base; d.algorithm.algo = (flashcl_algo)algo; d.paged.cache.max_pages = c.max_pages + 1;
    EXPECT(FWD(d, c.k.t, c.v.t), FLASHCL_ERROR_BUFFER_TOO_SMALL, "block table smaller than batch x max_pages");
    d = base; d.algorithm.algo = (flashcl_algo)algo; d.paged.seqlens = NULL;
    EXPECT(FWD(d, c.k.t, c.v.t), FLASHCL_ERROR_INVALID_ARGUMENT, "kv_seqlens NULL");
    d = base; d.algorithm.algo = (flashcl_algo)algo; d.paged.seqlens = small;
    EXPECT(FWD(d, c.k.t, c.v.t), FLASHCL_ERROR_BUFFER_TOO_SMALL, "kv_seqlens too small");
    d = base; d.algorithm.algo = (flashcl_algo)algo; d.varlen.max_seqlen_k = -1;
    EXPECT(FWD(d, c.k.t, c.v.t), FLASHCL_ERROR_INVALID_SHAPE, "max_seqlen_k < 0");
    d = base; d.algorithm.algo = (flashcl_algo)algo; d.shape.heads_kv = 4;
    EXPECT(FWD(d, c.k.t, c.v.t), FLASHCL_ERROR_INVALID_SHAPE, "heads_kv does not match the pools");
  }
  /* Varlen with a paged source takes the key counts from kv_seqlens: cu_seqlens_k is refused. */
  {
    fct_tensor qv, ov;
    contiguous_tensor(&qv, FLASHCL_F32, 1, 4, 4, 64);
    fct_tensor_fill_random(&qv, &rng);
    contiguous_tensor(&ov, FLASHCL_F32, 1, 4, 4, 64);
    fct_tensor_poison(&ov);
    d = base;
    d.varlen.cu_seqlens_q = cub;
    d.varlen.cu_seqlens_k = cub;
    d.varlen.num_seqs = 2;
    d.varlen.max_seqlen_q = 2;
    d.varlen.max_seqlen_k = 2;
    FCT_CHECK_STATUS(flashcl_attention_forward(ctx, &d, &qv.t, &c.k.t, &c.v.t, &ov.t, NULL, 0, NULL, NULL),
                     FLASHCL_ERROR_INVALID_ARGUMENT, "varlen + paged with cu_seqlens_k");
    expect_untouched(&ov, "varlen + paged with cu_seqlens_k");
    d.varlen.cu_seqlens_k = NULL;
    d.varlen.num_seqs = 3; /* the block table holds 2 rows */
    FCT_CHECK_STATUS(flashcl_attention_forward(ctx, &d, &qv.t, &c.k.t, &c.v.t, &ov.t, NULL, 0, NULL, NULL),
                     FLASHCL_ERROR_BUFFER_TOO_SMALL, "varlen + paged, num_seqs past the block table");
    expect_untouched(&ov, "varlen + paged, num_seqs past the block table");
    fct_tensor_release(&qv);
    fct_tensor_release(&ov);
  }
  /* Backward with a paged source: UNSUPPORTED, nothing written. */
  {
    fct_tensor dq, dk, dv;
    contiguous_tensor(&dq, FLASHCL_F32, 2, 4, 4, 64);
    contiguous_tensor(&dk, FLASHCL_F32, c.num_pages, 16, 2, 64);
    contiguous_tensor(&dv, FLASHCL_F32, c.num_pages, 16, 2, 64);
    fct_tensor *g[3] = {&dq, &dk, &dv};
    for (int i = 0; i < 3; i++) fct_tensor_poison(g[i]);
    fct_tensor lse_in;
    fct_tensor_create_lse(&lse_in, FCT_BNHD, 2, 4, 4, 0);
    fct_tensor_fill_random(&lse_in, &rng);
    for (int algo = FLASHCL_ALGO_FLASH; algo <= FLASHCL_ALGO_NAIVE; algo++) {
      d = base;
      d.algorithm.algo = (flashcl_algo)algo;
      FCT_CHECK_STATUS(flashcl_attention_backward(ctx, &d, &q.t, &c.k.t, &c.v.t, &q.t, &lse_in.t, &q.t, &dq.t, &dk.t,
                                                  &dv.t, 0, NULL, NULL),
                       FLASHCL_ERROR_UNSUPPORTED, "backward + paged");
      for (int i = 0; i < 3; i++) expect_untouched(g[i], "backward + paged");
      size_t bytes = 0;
      FCT_CHECK_STATUS(flashcl_attention_workspace_size(ctx, &d, &q.t, &c.k.t, &c.v.t, FLASHCL_PASS_BACKWARD, &bytes),
                       FLASHCL_ERROR_UNSUPPORTED, "backward workspace + paged");
      FCT_CHECK_STATUS(flashcl_attention_workspace_size(ctx, &d, &q.t, &c.k.t, &c.v.t, FLASHCL_PASS_FORWARD, &bytes),
                       FLASHCL_SUCCESS, "forward workspace + paged");
    }
    for (int i = 0; i < 3; i++) fct_tensor_release(g[i]);
    fct_tensor_release(&lse_in);
  }
  /* A quantized pool: its scales checked, a call without a paged source refused. */
  {
    fct_tensor kq;
    contiguous_tensor(&kq, FLASHCL_I8, c.num_pages, 16, 2, 64);
    for (size_t i = 0; i < kq.bytes; i++) ((uint8_t *)kq.host)[i] = (uint8_t)(fct_rng_u64(&rng) % 21u) - 10u;
    upload(&kq);
    const size_t ns = (size_t)c.num_pages * 16 * 2;
    float *sv = malloc(sizeof *sv * ns);
    for (size_t i = 0; i < ns; i++) sv[i] = 0.05f;
    cl_mem sc = fct_create_buffer(sizeof *sv * ns, sv), sc_small = fct_create_buffer(sizeof *sv * (ns - 1), sv);
    free(sv);
    flashcl_attention_desc qd = base;
    qd.paged.cache.k_scale = sc;
    d = qd;
    d.paged.cache.block_table = NULL;
    d.paged.cache.page_size = d.paged.cache.max_pages = 0;
    d.paged.seqlens = NULL;
    EXPECT(FWD(d, kq.t, c.v.t), FLASHCL_ERROR_DTYPE_MISMATCH, "quantized k without a paged source");
    d = qd; d.paged.cache.k_scale = NULL;
    EXPECT(FWD(d, kq.t, c.v.t), FLASHCL_ERROR_INVALID_ARGUMENT, "quantized k without desc.paged.cache.k_scale");
    FCT_CHECK(strstr(flashcl_context_last_error(ctx), "desc.paged.cache.k_scale is NULL") != NULL,
              "message: %s", flashcl_context_last_error(ctx));
    d = qd; d.paged.cache.k_scale = sc_small;
    EXPECT(FWD(d, kq.t, c.v.t), FLASHCL_ERROR_BUFFER_TOO_SMALL, "desc.paged.cache.k_scale one float short of TOKEN");
    d = qd; d.paged.cache.k_scale_kind = (flashcl_kv_scale)7;
    EXPECT(FWD(d, kq.t, c.v.t), FLASHCL_ERROR_INVALID_ARGUMENT, "desc.paged.cache.k_scale_kind not a flashcl_kv_scale");
    d = qd; d.paged.cache.k_scale = o.t.buffer;
    EXPECT(FWD(d, kq.t, c.v.t), FLASHCL_ERROR_INVALID_ARGUMENT, "desc.paged.cache.k_scale is o's buffer");
    d = qd;
    FCT_CHECK_STATUS(FWD(d, kq.t, c.v.t), FLASHCL_SUCCESS, "valid quantized paged call");
    fct_finish();
    fct_tensor_poison(&o);
    fct_tensor_poison(&lse);
    clReleaseMemObject(sc);
    clReleaseMemObject(sc_small);
    fct_tensor_release(&kq);
  }
  /* The valid call succeeds (the fixture is sound). */
  d = base;
  FCT_CHECK_STATUS(FWD(d, c.k.t, c.v.t), FLASHCL_SUCCESS, "valid paged call");
  fct_finish();
#undef FWD
#undef EXPECT
  clReleaseMemObject(small);
  clReleaseMemObject(cub);
  fct_tensor_release(&q);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
  fct_tensor_release(&k8);
  cache_release(&c);
}

int main(void) {
  enum { N = sizeof CASES / sizeof CASES[0], NF = sizeof FAMILY_CASES / sizeof FAMILY_CASES[0],
         NQ = sizeof QUANT_CASES / sizeof QUANT_CASES[0] };
  struct CMUnitTest tests[N + NF + NQ + 2];
  size_t n = 0;
  for (size_t i = 0; i < N; i++) tests[n++] = (struct CMUnitTest){CASES[i].name, test_case, NULL, NULL, (void *)&CASES[i]};
  tests[n++] = (struct CMUnitTest){"paged_append_then_prefill", test_append_then_prefill, NULL, NULL, NULL};
  for (size_t i = 0; i < NF; i++)
    tests[n++] = (struct CMUnitTest){FAMILY_CASES[i].name, test_family_case, NULL, NULL, (void *)&FAMILY_CASES[i]};
  for (size_t i = 0; i < NQ; i++)
    tests[n++] = (struct CMUnitTest){QUANT_CASES[i].name, test_quant_case, NULL, NULL, (void *)&QUANT_CASES[i]};
  tests[n++] = (struct CMUnitTest){"paged_errors", test_errors, NULL, NULL, NULL};
  return fct_run_group("paged_prefill", tests, n, 1);
}
