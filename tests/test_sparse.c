/*
 * Block-sparse and bitmask attention (flashcl_attention_desc.mask: kind / bits /
 * block_q / block_k / per_head), forward, flash and naive, against
 * a double reference computed here from the same host mask words.
 *
 *   - The seed-003 speculative-decoding tree as a FLASHCL_MASK_BITS mask: a few
 *     tree tokens (queries) against a cached prefix plus the tree (keys).
 *   - Random bit masks (some rows fully masked, some coarse regions empty so that
 *     whole tiles are skipped), shared and per head.
 *   - FLASHCL_MASK_BLOCK masks of the local / strided / butterfly layouts of
 *     flashcl_block_mask_fill, with mask blocks that are and are not multiples of
 *     the kernel tiles (and smaller than them); each also runs as the equivalent
 *     dense BITS mask, and the two results must agree.
 *   - Composition with causal, a sliding window, GQA, varlen; fp32/fp16/bf16; one
 *     case per kind with the fwd tuning map=0 (the GPU variant of the kernel).
 *   - Fresh random inputs every run (seed printed; FLASHCL_TEST_SEED reproduces);
 *     outputs NaN-poisoned before every call; relative L2 of O: fp32 1e-5, fp16
 *     2e-3, bf16 1e-2; a row's LSE is -inf iff the reference's is (O row then 0).
 *   - Backward (cases marked so): dQ / dK / dV of flash with both dQ modes
 *     (desc.backward.deterministic 1 and 0) and of naive against a double reference
 *     computed here with the same mask (one case with dropout 0.1, applied to the
 *     backward only: the reference uses the device's O for D); rows that see no
 *     key must get dQ = 0 and keys that no query sees dK = dV = 0, exactly;
 *     gradients NaN-poisoned before every call.
 *   - Error paths (short mask buffer, bad block sizes, unknown kind, NULL mask)
 *     leave every output untouched, forward and backward; a valid mask is accepted
 *     by the backward.
 *   - The host layout helpers against hand-computed small cases.
 */
#include "common.h"

#include <limits.h>
#include "reference_bwd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SP_TREE = 0, SP_RANDOM = 1, SP_LOCAL = 2, SP_STRIDED = 3, SP_BUTTERFLY = 4 };

typedef struct sp_case {
  const char *name;
  flashcl_dtype dtype;
  int batch, nq, nk; /* ignored for varlen */
  int hq, hkv, d;
  int causal;
  int window_left;   /* -1: unbounded */
  int kind;          /* FLASHCL_MASK_BITS or FLASHCL_MASK_BLOCK */
  int bq, bk;        /* mask block (BLOCK) */
  int per_head;
  int pattern;       /* SP_* */
  int param;         /* layout parameter, or random density in percent */
  int num_seqs;      /* varlen when > 0 */
  const int *lens_q, *lens_k;
  int block;         /* flash block_r = block_c (0: automatic) */
  int gpu_map;
  int backward;      /* 1: also check dQ / dK / dV */
  float dropout;     /* backward only: desc.dropout.p */
  int mma;           /* 1: flash runs with desc.algorithm.kernel = NVIDIA_MMA (skipped where there is none) */
} sp_case;

typedef struct sp_inputs {
  int64_t B, Nq, Nk;
  fct_tensor q, k, v;
  cl_mem cu_q, cu_k;
  int32_t cu_q_host[17], cu_k_host[17];
  int nseq, Lq, Lk; /* mask geometry: sequences and per-sequence lengths */
} sp_inputs;

/* Mask geometry of a kind for the inputs. */
typedef struct sp_mask {
  int kind, bq, bk, per_head, heads, rows, cols, words;
  size_t count; /* uint32 words in all */
  uint32_t *bits;
  cl_mem mem;
} sp_mask;

static void sp_inputs_create(sp_inputs *in, const sp_case *c, fct_rng *rng) {
  memset(in, 0, sizeof *in);
  if (c->num_seqs > 0) {
    in->B = 1;
    for (int s = 0; s < c->num_seqs; s++) {
      in->cu_q_host[s + 1] = in->cu_q_host[s] + c->lens_q[s];
      in->cu_k_host[s + 1] = in->cu_k_host[s] + c->lens_k[s];
      if (c->lens_q[s] > in->Lq) in->Lq = c->lens_q[s];
      if (c->lens_k[s] > in->Lk) in->Lk = c->lens_k[s];
    }
    in->Nq = in->cu_q_host[c->num_seqs];
    in->Nk = in->cu_k_host[c->num_seqs];
    in->nseq = c->num_seqs;
    in->cu_q = fct_create_buffer((size_t)(c->num_seqs + 1) * 4, in->cu_q_host);
    in->cu_k = fct_create_buffer((size_t)(c->num_seqs + 1) * 4, in->cu_k_host);
  } else {
    in->B = c->batch;
    in->Nq = in->Lq = c->nq;
    in->Nk = in->Lk = c->nk;
    in->nseq = c->batch;
  }
  fct_tensor_create(&in->q, c->dtype, FCT_BNHD, in->B, in->Nq, c->hq, c->d, 0);
  fct_tensor_create(&in->k, c->dtype, FCT_BNHD, in->B, in->Nk, c->hkv, c->d, 1);
  fct_tensor_create(&in->v, c->dtype, FCT_BNHD, in->B, in->Nk, c->hkv, c->d, 2);
  fct_tensor_fill_random(&in->q, rng);
  fct_tensor_fill_random(&in->k, rng);
  fct_tensor_fill_random(&in->v, rng);
}

static void sp_inputs_release(sp_inputs *in) {
  fct_tensor_release(&in->q);
  fct_tensor_release(&in->k);
  fct_tensor_release(&in->v);
  if (in->cu_q) clReleaseMemObject(in->cu_q);
  if (in->cu_k) clReleaseMemObject(in->cu_k);
}

static void sp_mask_alloc(sp_mask *m, const sp_inputs *in, int kind, int bq, int bk, int per_head, int hq) {
  memset(m, 0, sizeof *m);
  m->kind = kind;
  m->bq = kind == FLASHCL_MASK_BLOCK ? bq : 1;
  m->bk = kind == FLASHCL_MASK_BLOCK ? bk : 1;
  m->per_head = per_head;
  m->heads = per_head ? hq : 1;
  m->rows = (in->Lq + m->bq - 1) / m->bq;
  m->cols = (in->Lk + m->bk - 1) / m->bk;
  size_t w = 0;
  FCT_CHECK(flashcl_mask_words(m->rows, m->cols, &w) == FLASHCL_SUCCESS, "flashcl_mask_words");
  m->words = (m->cols + 31) / 32;
  FCT_CHECK(w == (size_t)m->rows * (size_t)m->words, "flashcl_mask_words(%d, %d) = %zu", m->rows, m->cols, w);
  m->count = (size_t)in->nseq * m->heads * w;
  m->bits = calloc(m->count, sizeof(uint32_t));
}

static uint32_t *sp_row(const sp_mask *m, int s, int h, int r) {
  return m->bits + (((size_t)s * m->heads + h) * m->rows + r) * m->words;
}
static int sp_get(const sp_mask *m, int s, int h, int r, int c) { return (sp_row(m, s, h, r)[c / 32] >> (c % 32)) & 1u; }
static void sp_set(sp_mask *m, int s, int h, int r, int c) { sp_row(m, s, h, r)[c / 32] |= 1u << (c % 32); }

/* Visible under the mask alone: query i, key j of sequence s, head h. */
static int sp_visible(const sp_mask *m, int s, int h, int i, int j) {
  return sp_get(m, s, m->per_head ? h : 0, i / m->bq, j / m->bk);
}

/* The seed-003 tree: 9 tokens, parents - 0 1 1 2 2 3 3 4. */
static const int TREE_PARENT[9] = {-1, 0, 1, 1, 2, 2, 3, 3, 4};

static void sp_mask_fill(sp_mask *m, const sp_case *c, const sp_inputs *in, fct_rng *rng) {
  for (int s = 0; s < in->nseq; s++)
    for (int h = 0; h < m->heads; h++) {
      if (c->pattern == SP_TREE) {
        /* Query t (tree token t) sees the whole prefix, its tree ancestors and itself. */
        const int nq = c->num_seqs > 0 ? c->lens_q[s] : in->Lq, nk = c->num_seqs > 0 ? c->lens_k[s] : in->Lk;
        const int prefix = nk - nq;
        for (int t = 0; t < nq; t++) {
          for (int j = 0; j < prefix; j++) sp_set(m, s, h, t, j);
          for (int a = t; a >= 0; a = TREE_PARENT[a]) sp_set(m, s, h, t, prefix + a);
        }
      } else if (c->pattern == SP_RANDOM) {
        /* Coarse 24 x 24 regions, each empty with probability 1/2 (so whole tiles
         * are skipped), bits inside at param percent; every 7th row empty. */
        const int rg = (m->rows + 23) / 24, cg = (m->cols + 23) / 24;
        unsigned char *on = malloc((size_t)rg * cg);
        for (int t = 0; t < rg * cg; t++) on[t] = fct_rng_uniform(rng) < 0.5;
        for (int r = 0; r < m->rows; r++) {
          if (r % 7 == 3) continue;
          for (int col = 0; col < m->cols; col++)
            if (on[(r / 24) * cg + col / 24] && fct_rng_uniform(rng) * 100.0 < c->param) sp_set(m, s, h, r, col);
        }
        free(on);
      } else {
        const flashcl_block_layout lay = c->pattern == SP_LOCAL     ? FLASHCL_BLOCK_LOCAL
                                         : c->pattern == SP_STRIDED ? FLASHCL_BLOCK_STRIDED
                                                                    : FLASHCL_BLOCK_BUTTERFLY;
        FCT_CHECK_STATUS(flashcl_block_mask_fill(lay, m->rows, m->cols, c->param, sp_row(m, s, h, 0),
                                                 (size_t)m->rows * m->words),
                         FLASHCL_SUCCESS, "%s: flashcl_block_mask_fill", c->name);
      }
    }
  /* Random garbage in the padding bits past the last column: they must be ignored. */
  if (m->cols % 32)
    for (int s = 0; s < in->nseq; s++)
      for (int h = 0; h < m->heads; h++)
        for (int r = 0; r < m->rows; r++) sp_row(m, s, h, r)[m->words - 1] |= ~0u << (m->cols % 32);
  m->mem = fct_create_buffer(m->count * sizeof(uint32_t), m->bits);
}

/* The dense BITS mask equivalent to a BLOCK mask. */
static void sp_mask_expand(sp_mask *dense, const sp_mask *blk, const sp_inputs *in, int hq) {
  sp_mask_alloc(dense, in, FLASHCL_MASK_BITS, 1, 1, blk->per_head, hq);
  for (int s = 0; s < in->nseq; s++)
    for (int h = 0; h < dense->heads; h++)
      for (int i = 0; i < in->Lq; i++)
        for (int j = 0; j < in->Lk; j++)
          if (sp_get(blk, s, h, i / blk->bq, j / blk->bk)) sp_set(dense, s, h, i, j);
  dense->mem = fct_create_buffer(dense->count * sizeof(uint32_t), dense->bits);
}

static void sp_mask_release(sp_mask *m) {
  free(m->bits);
  if (m->mem) clReleaseMemObject(m->mem);
}

static void sp_desc(const sp_case *c, const sp_inputs *in, const sp_mask *m, flashcl_algo algo,
                    flashcl_attention_desc *desc) {
  flashcl_attention_desc_init(desc);
  desc->algorithm.algo = algo;
  desc->mask.causal = c->causal;
  desc->score.window_left = c->window_left;
  desc->algorithm.block_r = desc->algorithm.block_c = c->block;
  desc->algorithm.kernel = c->mma ? FLASHCL_KERNEL_NVIDIA_MMA : FLASHCL_KERNEL_PORTABLE;
  if (m) {
    desc->mask.kind = m->kind;
    desc->mask.bits = m->mem;
    desc->mask.block_q = m->kind == FLASHCL_MASK_BLOCK ? m->bq : 0;
    desc->mask.block_k = m->kind == FLASHCL_MASK_BLOCK ? m->bk : 0;
    desc->mask.per_head = m->per_head;
  }
  if (c->num_seqs > 0) {
    desc->varlen.cu_seqlens_q = in->cu_q;
    desc->varlen.cu_seqlens_k = in->cu_k;
    desc->varlen.num_seqs = c->num_seqs;
    desc->varlen.max_seqlen_q = in->Lq;
    desc->varlen.max_seqlen_k = in->Lk;
  }
}

/* Double reference: O and LSE, contiguous (B, Nq, Hq, D) / (B, Nq, Hq). */
static void sp_reference(const sp_case *c, const sp_inputs *in, const sp_mask *m, double *ref_o, double *ref_lse) {
  ref_attention_params rp;
  memset(&rp, 0, sizeof rp);
  if (c->num_seqs > 0) {
    rp.cu_seqlens_q = in->cu_q_host;
    rp.cu_seqlens_k = in->cu_k_host;
    rp.num_seqs = c->num_seqs;
  }
  ref_tensor rq = fct_tensor_ref(&in->q), rk = fct_tensor_ref(&in->k), rv = fct_tensor_ref(&in->v);
  ref_out ro = ref_out_bnhd(ref_o, in->B, in->Nq, c->hq, c->d), rl = ref_out_bnhd(ref_lse, in->B, in->Nq, c->hq, 1);
  const double scale = ref_attention_scale(&rp, &rq);
  double *sc = malloc((size_t)in->Lk * sizeof(double));
  for (int s = 0; s < in->nseq; s++) {
    ref_segment seg = ref_attention_segment(&rp, &rq, &rk, s);
    const int64_t diag = seg.nk - seg.nq;
    for (int h = 0; h < c->hq; h++) {
      const int64_t hk = ref_attention_kv_head(&rq, &rk, h);
      for (int64_t i = 0; i < seg.nq; i++) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < seg.nk; j++) {
          int vis = sp_visible(m, s, h, (int)i, (int)j);
          if (c->causal && j > i + diag) vis = 0;
          if (c->window_left >= 0 && j < i + diag - c->window_left) vis = 0;
          sc[j] = -INFINITY;
          if (!vis) continue;
          double dot = 0.0;
          for (int x = 0; x < c->d; x++)
            dot += ref_get(&rq, seg.q_batch, seg.q_row0 + i, h, x) * ref_get(&rk, seg.k_batch, seg.k_row0 + j, hk, x);
          sc[j] = dot * scale;
          if (sc[j] > mx) mx = sc[j];
        }
        double l = 0.0;
        for (int64_t j = 0; j < seg.nk; j++)
          if (sc[j] != -INFINITY) l += exp(sc[j] - mx);
        for (int x = 0; x < c->d; x++) {
          double acc = 0.0;
          if (mx != -INFINITY)
            for (int64_t j = 0; j < seg.nk; j++)
              if (sc[j] != -INFINITY) acc += exp(sc[j] - mx) / l * ref_get(&rv, seg.k_batch, seg.k_row0 + j, hk, x);
          *ref_at(&ro, seg.q_batch, seg.q_row0 + i, h, x) = acc;
        }
        *ref_at(&rl, seg.q_batch, seg.q_row0 + i, h, 0) = mx == -INFINITY ? -INFINITY : mx + log(l);
      }
    }
  }
  free(sc);
}

static double sp_rel_l2(const fct_tensor *t, const double *ref) {
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

/* Runs one forward and checks it against the reference; o is left downloaded. */
static void sp_run_one(const sp_case *c, const sp_inputs *in, const sp_mask *m, flashcl_algo algo,
                       const double *ref_o, const double *ref_lse, fct_tensor *o, const char *tag) {
  fct_env *env = fct_env_get();
  const int64_t B = in->B, Nq = in->Nq, Hq = c->hq, D = c->d;
  const char *an = algo == FLASHCL_ALGO_NAIVE ? "naive" : "flash";
  fct_tensor lse;
  fct_tensor_create(o, c->dtype, FCT_BNHD, B, Nq, Hq, D, 4);
  fct_tensor_create_lse(&lse, FCT_BNHD, B, Nq, Hq, 5);
  fct_tensor_poison(o);
  fct_tensor_poison(&lse);
  flashcl_attention_desc desc;
  sp_desc(c, in, m, algo, &desc);
  if (c->gpu_map) desc.algorithm.tuning = fct_gpu_map_tuning();
  flashcl_status st = flashcl_attention_forward(env->ctx, &desc, &in->q.t, &in->k.t, &in->v.t, &o->t, &lse.t, 0, NULL,
                                                NULL);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s (%s, %s): forward", c->name, an, tag);
  fct_finish();
  fct_tensor_download(o);
  fct_tensor_download(&lse);

  const double err_o = sp_rel_l2(o, ref_o);
  double le2 = 0.0, lr2 = 0.0;
  size_t empty = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < Nq; n++)
      for (int64_t h = 0; h < Hq; h++) {
        const double g = fct_tensor_get(&lse, b, n, h, 0), r = ref_lse[(b * Nq + n) * Hq + h];
        FCT_CHECK(!isnan(g), "%s (%s, %s): LSE NaN at (%lld, %lld, %lld)", c->name, an, tag, (long long)b,
                  (long long)n, (long long)h);
        if (r == -INFINITY) {
          empty++;
          FCT_CHECK(g == -INFINITY, "%s (%s, %s): row (%lld, %lld, %lld) sees no key but LSE = %g", c->name, an, tag,
                    (long long)b, (long long)n, (long long)h, g);
          for (int64_t x = 0; x < D; x++)
            FCT_CHECK(fct_tensor_get(o, b, n, h, x) == 0.0, "%s (%s, %s): empty row's O is not 0", c->name, an, tag);
          continue;
        }
        FCT_CHECK(isfinite(g), "%s (%s, %s): LSE %g at (%lld, %lld, %lld), reference %g", c->name, an, tag, g,
                  (long long)b, (long long)n, (long long)h, r);
        le2 += (g - r) * (g - r);
        lr2 += r * r;
      }
  const double err_lse = lr2 > 0 ? sqrt(le2 / lr2) : sqrt(le2);
  print_message("  %-28s %s %-5s %s: O err %.2e, LSE err %.2e, empty rows %zu\n", c->name, an, tag,
                fct_dtype_str(c->dtype), err_o, err_lse, empty);
  FCT_CHECK(err_o <= fct_tolerance(c->dtype), "%s (%s, %s): O relative L2 %.3e > %.1e", c->name, an, tag, err_o,
            fct_tolerance(c->dtype));
  FCT_CHECK(err_lse <= fct_lse_tolerance(c->dtype), "%s (%s, %s): LSE relative L2 %.3e", c->name, an, tag, err_lse);
  fct_tensor_release(&lse);
}

/* ------------------------------------------------------------- backward -- */

#define SP_SEED 0x0123456789abcdefull
#define SP_OFFSET 40

/* Double reference gradients, contiguous (B, Nq, Hq, D) / (B, Nk, Hkv, D), from
 * the device's O (for D = rowsum(dO * O)); seen_k (B, Nk, Hkv) marks keys that at
 * least one query of the kv head's group sees. */
static void sp_reference_bwd(const sp_case *c, const sp_inputs *in, const sp_mask *m, const fct_tensor *o,
                             const fct_tensor *d_o, double *rdq, double *rdk, double *rdv, unsigned char *seen_k) {
  ref_attention_params rp;
  memset(&rp, 0, sizeof rp);
  if (c->num_seqs > 0) {
    rp.cu_seqlens_q = in->cu_q_host;
    rp.cu_seqlens_k = in->cu_k_host;
    rp.num_seqs = c->num_seqs;
  }
  const ref_dropout rd = {c->dropout, SP_SEED, SP_OFFSET};
  ref_tensor rq = fct_tensor_ref(&in->q), rk = fct_tensor_ref(&in->k), rv = fct_tensor_ref(&in->v);
  ref_tensor ro = fct_tensor_ref(o), rdo = fct_tensor_ref(d_o);
  ref_out odq = ref_out_bnhd(rdq, in->B, in->Nq, c->hq, c->d), odk = ref_out_bnhd(rdk, in->B, in->Nk, c->hkv, c->d),
          odv = ref_out_bnhd(rdv, in->B, in->Nk, c->hkv, c->d);
  const double scale = ref_attention_scale(&rp, &rq);
  double *sc = malloc((size_t)in->Lk * sizeof(double));
  for (int s = 0; s < in->nseq; s++) {
    ref_segment seg = ref_attention_segment(&rp, &rq, &rk, s);
    const int64_t diag = seg.nk - seg.nq;
    for (int h = 0; h < c->hq; h++) {
      const int64_t hk = ref_attention_kv_head(&rq, &rk, h);
      for (int64_t i = 0; i < seg.nq; i++) {
        const int64_t qi = seg.q_row0 + i;
        double mx = -INFINITY;
        for (int64_t j = 0; j < seg.nk; j++) {
          int vis = sp_visible(m, s, h, (int)i, (int)j);
          if (c->causal && j > i + diag) vis = 0;
          if (c->window_left >= 0 && j < i + diag - c->window_left) vis = 0;
          sc[j] = -INFINITY;
          if (!vis) continue;
          double dot = 0.0;
          for (int x = 0; x < c->d; x++)
            dot += ref_get(&rq, seg.q_batch, qi, h, x) * ref_get(&rk, seg.k_batch, seg.k_row0 + j, hk, x);
          sc[j] = dot * scale;
          if (sc[j] > mx) mx = sc[j];
        }
        if (mx == -INFINITY) continue; /* sees no key: dQ row 0, no contribution */
        double l = 0.0, dsum = 0.0;
        for (int64_t j = 0; j < seg.nk; j++)
          if (sc[j] != -INFINITY) l += exp(sc[j] - mx);
        for (int x = 0; x < c->d; x++) dsum += ref_get(&ro, seg.q_batch, qi, h, x) * ref_get(&rdo, seg.q_batch, qi, h, x);
        for (int64_t j = 0; j < seg.nk; j++) {
          if (sc[j] == -INFINITY) continue;
          const int64_t kj = seg.k_row0 + j;
          const double pr = exp(sc[j] - mx) / l, f = ref_dropout_factor(&rd, (int64_t)s * c->hq + h, i, j);
          double dp = 0.0;
          for (int x = 0; x < c->d; x++) dp += ref_get(&rdo, seg.q_batch, qi, h, x) * ref_get(&rv, seg.k_batch, kj, hk, x);
          const double ds = pr * (dp * f - dsum);
          seen_k[(seg.k_batch * in->Nk + kj) * c->hkv + hk] = 1;
          for (int x = 0; x < c->d; x++) {
            *ref_at(&odv, seg.k_batch, kj, hk, x) += pr * f * ref_get(&rdo, seg.q_batch, qi, h, x);
            *ref_at(&odq, seg.q_batch, qi, h, x) += scale * ds * ref_get(&rk, seg.k_batch, kj, hk, x);
            *ref_at(&odk, seg.k_batch, kj, hk, x) += scale * ds * ref_get(&rq, seg.q_batch, qi, h, x);
          }
        }
      }
    }
  }
  free(sc);
}

/* Rows of t (B, N, H, D) whose flag is set must be exactly 0; returns how many are. */
static size_t sp_zero_rows(const sp_case *c, const fct_tensor *t, const unsigned char *flag, const char *what,
                           const char *tag) {
  const int64_t B = t->t.shape[0], N = t->t.shape[1], H = t->t.shape[2], D = t->t.shape[3];
  size_t n = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t r = 0; r < N; r++)
      for (int64_t h = 0; h < H; h++) {
        if (!flag[(b * N + r) * H + h]) continue;
        n++;
        for (int64_t x = 0; x < D; x++)
          FCT_CHECK(fct_tensor_get(t, b, r, h, x) == 0.0, "%s (%s): %s row (%lld, %lld, %lld) is %g, not 0", c->name,
                    tag, what, (long long)b, (long long)r, (long long)h, fct_tensor_get(t, b, r, h, x));
      }
  return n;
}

/* The backward of case c (flash deterministic, flash atomic dQ, naive) from the
 * forward's O and LSE. */
static void sp_backward(const sp_case *c, const sp_inputs *in, const sp_mask *m, const fct_tensor *o,
                        const double *ref_lse, fct_rng *rng) {
  fct_env *env = fct_env_get();
  const int64_t B = in->B, Nq = in->Nq, Nk = in->Nk, Hq = c->hq, Hkv = c->hkv, D = c->d;
  const double tol = fct_tolerance(c->dtype);
  fct_tensor lse, d_o;
  fct_tensor_create_lse(&lse, FCT_BNHD, B, Nq, Hq, 5);
  fct_tensor_create(&d_o, c->dtype, FCT_BNHD, B, Nq, Hq, D, 3);
  fct_tensor_fill_random(&d_o, rng);
  /* The forward's LSE from the naive path would do as well; recompute it with flash. */
  {
    flashcl_attention_desc desc;
    sp_desc(c, in, m, FLASHCL_ALGO_FLASH, &desc);
    fct_tensor o2;
    fct_tensor_create(&o2, c->dtype, FCT_BNHD, B, Nq, Hq, D, 4);
    FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &desc, &in->q.t, &in->k.t, &in->v.t, &o2.t, &lse.t, 0, NULL,
                                               NULL),
                     FLASHCL_SUCCESS, "%s: forward for the backward", c->name);
    fct_finish();
    fct_tensor_release(&o2);
  }
  const size_t nq_el = (size_t)(B * Nq * Hq * D), nk_el = (size_t)(B * Nk * Hkv * D);
  double *rdq = calloc(nq_el, sizeof(double)), *rdk = calloc(nk_el, sizeof(double)), *rdv = calloc(nk_el, sizeof(double));
  unsigned char *seen = calloc((size_t)(B * Nk * Hkv), 1), *unseen = calloc((size_t)(B * Nk * Hkv), 1);
  unsigned char *empty = calloc((size_t)(B * Nq * Hq), 1);
  sp_reference_bwd(c, in, m, o, &d_o, rdq, rdk, rdv, seen);
  /* Only rows and keys inside the sequences (varlen: padding past cu_seqlens is never written). */
  for (int s = 0; s < in->nseq; s++) {
    const int64_t b = c->num_seqs > 0 ? 0 : s, q0 = c->num_seqs > 0 ? in->cu_q_host[s] : 0,
                  q1 = c->num_seqs > 0 ? in->cu_q_host[s + 1] : Nq, k0 = c->num_seqs > 0 ? in->cu_k_host[s] : 0,
                  k1 = c->num_seqs > 0 ? in->cu_k_host[s + 1] : Nk;
    for (int64_t r = q0; r < q1; r++)
      for (int64_t h = 0; h < Hq; h++) empty[(b * Nq + r) * Hq + h] = ref_lse[(b * Nq + r) * Hq + h] == -INFINITY;
    for (int64_t r = k0; r < k1; r++)
      for (int64_t h = 0; h < Hkv; h++) unseen[(b * Nk + r) * Hkv + h] = !seen[(b * Nk + r) * Hkv + h];
  }
  for (int run = 0; run < 3; run++) {
    const char *tag = run == 0 ? "flash det" : run == 1 ? "flash atomic" : "naive";
    flashcl_attention_desc desc;
    sp_desc(c, in, m, run == 2 ? FLASHCL_ALGO_NAIVE : FLASHCL_ALGO_FLASH, &desc);
    desc.backward.deterministic = run == 0;
    desc.dropout.p = c->dropout;
    desc.dropout.seed = SP_SEED;
    desc.dropout.offset = SP_OFFSET;
    fct_tensor dq, dk, dv;
    fct_tensor_create(&dq, c->dtype, FCT_BNHD, B, Nq, Hq, D, 6);
    fct_tensor_create(&dk, c->dtype, FCT_BNHD, B, Nk, Hkv, D, 7);
    fct_tensor_create(&dv, c->dtype, FCT_BNHD, B, Nk, Hkv, D, 8);
    fct_tensor_poison(&dq);
    fct_tensor_poison(&dk);
    fct_tensor_poison(&dv);
    flashcl_status st = flashcl_attention_backward(env->ctx, &desc, &in->q.t, &in->k.t, &in->v.t, &o->t, &lse.t,
                                                   &d_o.t, &dq.t, &dk.t, &dv.t, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s (%s): backward", c->name, tag);
    fct_finish();
    fct_tensor_download(&dq);
    fct_tensor_download(&dk);
    fct_tensor_download(&dv);
    const double e_dq = sp_rel_l2(&dq, rdq), e_dk = sp_rel_l2(&dk, rdk), e_dv = sp_rel_l2(&dv, rdv);
    const size_t ne = sp_zero_rows(c, &dq, empty, "dQ of a row that sees no key", tag);
    const size_t nu = sp_zero_rows(c, &dk, unseen, "dK of a key no query sees", tag);
    sp_zero_rows(c, &dv, unseen, "dV of a key no query sees", tag);
    print_message("  %-28s %-12s %s: dQ %.2e dK %.2e dV %.2e, empty rows %zu, unseen keys %zu%s\n", c->name, tag,
                  fct_dtype_str(c->dtype), e_dq, e_dk, e_dv, ne, nu, c->dropout > 0 ? " (dropout)" : "");
    FCT_CHECK(e_dq <= tol && e_dk <= tol && e_dv <= tol, "%s (%s): gradient relative L2 (%.3e, %.3e, %.3e) > %.1e",
              c->name, tag, e_dq, e_dk, e_dv, tol);
    fct_tensor_release(&dq);
    fct_tensor_release(&dk);
    fct_tensor_release(&dv);
  }
  free(rdq);
  free(rdk);
  free(rdv);
  free(seen);
  free(unseen);
  free(empty);
  fct_tensor_release(&lse);
  fct_tensor_release(&d_o);
}

static void sp_case_run(void **state) {
  const sp_case *c = (const sp_case *)*state;
  fct_rng rng;
  fct_rng_init(&rng, c->name);
  sp_inputs in;
  sp_inputs_create(&in, c, &rng);
  sp_mask m;
  sp_mask_alloc(&m, &in, c->kind, c->bq, c->bk, c->per_head, c->hq);
  sp_mask_fill(&m, c, &in, &rng);
  if (c->mma) {
    flashcl_attention_desc desc;
    sp_desc(c, &in, &m, FLASHCL_ALGO_FLASH, &desc);
    if (!fct_mma_ready(c->name, &desc, &in.q.t, &in.k.t, &in.v.t, FLASHCL_PASS_FORWARD) ||
        (c->backward && !fct_mma_ready(c->name, &desc, &in.q.t, &in.k.t, &in.v.t, FLASHCL_PASS_BACKWARD))) {
      sp_mask_release(&m);
      sp_inputs_release(&in);
      FCT_SKIP();
      return;
    }
  }
  const size_t no = (size_t)(in.B * in.Nq * c->hq * c->d), nl = (size_t)(in.B * in.Nq * c->hq);
  double *ref_o = calloc(no, sizeof(double)), *ref_lse = calloc(nl, sizeof(double));
  sp_reference(c, &in, &m, ref_o, ref_lse);

  fct_tensor o_flash, o_naive;
  sp_run_one(c, &in, &m, FLASHCL_ALGO_FLASH, ref_o, ref_lse, &o_flash, c->kind == FLASHCL_MASK_BLOCK ? "block" : "bits");
  sp_run_one(c, &in, &m, FLASHCL_ALGO_NAIVE, ref_o, ref_lse, &o_naive, c->kind == FLASHCL_MASK_BLOCK ? "block" : "bits");
  if (c->kind == FLASHCL_MASK_BLOCK) {
    /* The same mask as one bit per pair: the flash results must agree. */
    sp_mask dense;
    sp_mask_expand(&dense, &m, &in, c->hq);
    fct_tensor o_dense;
    sp_run_one(c, &in, &dense, FLASHCL_ALGO_FLASH, ref_o, ref_lse, &o_dense, "dense");
    double e2 = 0.0, r2 = 0.0;
    for (int64_t n = 0; n < in.Nq; n++)
      for (int64_t h = 0; h < c->hq; h++)
        for (int64_t x = 0; x < c->d; x++)
          for (int64_t b = 0; b < in.B; b++) {
            const double a = fct_tensor_get(&o_flash, b, n, h, x), d = fct_tensor_get(&o_dense, b, n, h, x);
            e2 += (a - d) * (a - d);
            r2 += d * d;
          }
    const double diff = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
    FCT_CHECK(diff <= fct_tolerance(c->dtype), "%s: block mask vs its dense bit mask differ by %.3e", c->name, diff);
    fct_tensor_release(&o_dense);
    sp_mask_release(&dense);
  }
  if (c->backward) sp_backward(c, &in, &m, &o_flash, ref_lse, &rng);
  fct_tensor_release(&o_flash);
  fct_tensor_release(&o_naive);
  free(ref_o);
  free(ref_lse);
  sp_mask_release(&m);
  sp_inputs_release(&in);
}

static const int VQ[3] = {37, 1, 80}, VK[3] = {50, 64, 20};
static const int TQ[2] = {9, 9}, TK[2] = {30, 9};

#define BITS FLASHCL_MASK_BITS
#define BLOCK FLASHCL_MASK_BLOCK
/* name, dtype, batch, nq, nk, hq, hkv, d, causal, window_left, kind, bq, bk, per_head, pattern, param,
 * num_seqs, lens_q, lens_k, block, gpu_map, backward, dropout */
static const sp_case CASES[] = {
    /* Speculative decoding: 9 tree tokens against a 40-token prefix + the tree. */
    {"tree_decode_gqa", FLASHCL_F32, 2, 9, 49, 4, 2, 32, 0, -1, BITS, 0, 0, 0, SP_TREE, 0, 0, NULL, NULL, 0, 0, 1, 0.0f},
    {"tree_decode_causal_f16", FLASHCL_F16, 1, 9, 49, 8, 2, 64, 1, -1, BITS, 0, 0, 0, SP_TREE, 0, 0, NULL, NULL, 16, 0},
    {"tree_varlen_bf16", FLASHCL_BF16, 0, 0, 0, 4, 1, 32, 0, -1, BITS, 0, 0, 0, SP_TREE, 0, 2, TQ, TK, 0, 0, 1, 0.0f},
    /* Random bit masks. */
    {"bits_random_per_head", FLASHCL_F32, 2, 70, 90, 2, 1, 32, 0, -1, BITS, 0, 0, 1, SP_RANDOM, 40, 0, NULL, NULL, 16, 0, 1, 0.0f},
    {"bits_random_causal_f16", FLASHCL_F16, 1, 96, 96, 4, 2, 32, 1, -1, BITS, 0, 0, 0, SP_RANDOM, 60, 0, NULL, NULL, 0, 0},
    {"bits_random_window_bf16", FLASHCL_BF16, 1, 64, 80, 2, 2, 32, 0, 20, BITS, 0, 0, 0, SP_RANDOM, 70, 0, NULL, NULL, 16, 0, 1, 0.0f},
    {"bits_random_varlen_gpu_map", FLASHCL_F32, 0, 0, 0, 4, 2, 32, 1, -1, BITS, 0, 0, 1, SP_RANDOM, 50, 3, VQ, VK, 16, 1},
    /* Block masks: blocks equal to, multiples of, not multiples of, and smaller than the tiles. */
    {"block_local_16", FLASHCL_F32, 1, 128, 128, 2, 1, 32, 0, -1, BLOCK, 16, 16, 0, SP_LOCAL, 2, 0, NULL, NULL, 16, 0, 1, 0.0f},
    {"block_strided_24x40", FLASHCL_F32, 2, 100, 130, 2, 2, 32, 0, -1, BLOCK, 24, 40, 0, SP_STRIDED, 2, 0, NULL, NULL, 16, 0, 1, 0.0f},
    {"block_butterfly_8_causal", FLASHCL_F16, 1, 128, 128, 4, 2, 32, 1, -1, BLOCK, 8, 8, 0, SP_BUTTERFLY, 0, 0, NULL, NULL, 16, 0, 1, 0.0f},
    {"block_butterfly_32x5_bf16", FLASHCL_BF16, 1, 96, 120, 2, 1, 64, 0, -1, BLOCK, 32, 5, 1, SP_BUTTERFLY, 2, 0, NULL, NULL, 0, 0},
    {"block_local_varlen_causal", FLASHCL_F32, 0, 0, 0, 4, 2, 32, 1, -1, BLOCK, 12, 20, 0, SP_LOCAL, 1, 3, VQ, VK, 16, 0, 1, 0.1f},
    {"block_strided_gpu_map_f16", FLASHCL_F16, 1, 80, 112, 2, 1, 32, 0, -1, BLOCK, 16, 48, 0, SP_STRIDED, 3, 0, NULL, NULL, 16, 1},
    /* The tensor-core kernels (NVIDIA only; skipped elsewhere), forward and backward
     * (both dQ modes): forward work-groups of 128 queries with 64-key (d = 64) or
     * 32-key (d = 128) tiles, backward ones of 64-128 keys with 32-64-query tiles, so
     * these shapes skip whole tiles per work-group and per warp, and mix full,
     * partial and empty tiles. */
    {"mma_tree_decode_d128", FLASHCL_F16, 2, 9, 49, 8, 2, 128, 0, -1, BITS, 0, 0, 0, SP_TREE, 0, 0, NULL, NULL, 0, 0, 1, 0.0f, 1},
    {"mma_bits_random_causal_d64", FLASHCL_F16, 1, 300, 300, 4, 2, 64, 1, -1, BITS, 0, 0, 0, SP_RANDOM, 60, 0, NULL, NULL, 0, 0, 1, 0.0f, 1},
    {"mma_bits_window_per_head_bf16", FLASHCL_BF16, 1, 256, 320, 2, 2, 128, 0, 100, BITS, 0, 0, 1, SP_RANDOM, 70, 0, NULL, NULL, 0, 0, 1, 0.0f, 1},
    {"mma_block_local_64_d64", FLASHCL_F16, 2, 512, 512, 2, 1, 64, 0, -1, BLOCK, 64, 64, 0, SP_LOCAL, 2, 0, NULL, NULL, 0, 0, 1, 0.0f, 1},
    {"mma_block_strided_128x32_bf16", FLASHCL_BF16, 1, 600, 700, 2, 2, 64, 0, -1, BLOCK, 128, 32, 1, SP_STRIDED, 3, 0, NULL, NULL, 0, 0, 1, 0.0f, 1},
    {"mma_block_butterfly_varlen_causal", FLASHCL_F16, 0, 0, 0, 4, 2, 128, 1, -1, BLOCK, 12, 20, 0, SP_BUTTERFLY, 0, 3, VQ, VK, 0, 0, 1, 0.0f, 1},
};

/* ------------------------------------------------------------ error paths -- */

static void sp_error_paths(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  const sp_case c = {"errors", FLASHCL_F32, 2, 20, 40, 4, 2, 32, 0, -1, BITS, 0, 0, 0, SP_RANDOM, 50, 0, NULL, NULL, 0, 0};
  fct_rng rng;
  fct_rng_init(&rng, c.name);
  sp_inputs in;
  sp_inputs_create(&in, &c, &rng);
  /* BITS shared: 2 sequences x 20 rows x 2 words = 320 bytes; per head: 1280. */
  uint32_t host[80];
  memset(host, 0xff, sizeof host);
  cl_mem good = fct_create_buffer(sizeof host, host), small = fct_create_buffer(316, host);
  fct_tensor o, lse, dq, dk, dv, d_o;
  fct_tensor_create(&o, c.dtype, FCT_BNHD, 2, 20, 4, 32, 4);
  fct_tensor_create_lse(&lse, FCT_BNHD, 2, 20, 4, 5);
  fct_tensor_create(&d_o, c.dtype, FCT_BNHD, 2, 20, 4, 32, 3);
  fct_tensor_create(&dq, c.dtype, FCT_BNHD, 2, 20, 4, 32, 6);
  fct_tensor_create(&dk, c.dtype, FCT_BNHD, 2, 40, 2, 32, 7);
  fct_tensor_create(&dv, c.dtype, FCT_BNHD, 2, 40, 2, 32, 8);
  fct_tensor_fill_random(&d_o, &rng);

  for (int t = 0; t < 9; t++) {
    for (int bwd = 0; bwd < 2; bwd++) {
      for (int naive = 0; naive < 2; naive++) {
        flashcl_attention_desc desc;
        sp_desc(&c, &in, NULL, naive ? FLASHCL_ALGO_NAIVE : FLASHCL_ALGO_FLASH, &desc);
        desc.mask.kind = FLASHCL_MASK_BITS;
        desc.mask.bits = good;
        flashcl_status want = FLASHCL_ERROR_INVALID_ARGUMENT;
        const char *what = "";
        switch (t) {
        case 0: desc.mask.bits = small; want = FLASHCL_ERROR_BUFFER_TOO_SMALL; what = "bits mask 316 bytes"; break;
        case 1: desc.mask.per_head = 1; want = FLASHCL_ERROR_BUFFER_TOO_SMALL; what = "per-head bits mask"; break;
        case 2: desc.mask.kind = FLASHCL_MASK_BLOCK; desc.mask.block_q = 0; desc.mask.block_k = 8; what = "block_q 0"; break;
        case 3: desc.mask.kind = FLASHCL_MASK_BLOCK; desc.mask.block_q = 8; desc.mask.block_k = -1; what = "block_k -1"; break;
        case 4: desc.mask.kind = 7; what = "mask_kind 7"; break;
        case 5: desc.mask.kind = -1; what = "mask_kind -1"; break;
        case 6: desc.mask.bits = NULL; what = "mask NULL"; break;
        case 7: /* BLOCK 1 x 1 blocks need the same 320 bytes as BITS: 2 x 20 x 2 words; 2 x 4 needs 2 x 10 x 1 x 4 = 80. */
          desc.mask.kind = FLASHCL_MASK_BLOCK; desc.mask.block_q = 1; desc.mask.block_k = 1; desc.mask.bits = small;
          want = FLASHCL_ERROR_BUFFER_TOO_SMALL; what = "block mask 1x1 short"; break;
        case 8: /* valid: the backward accepts a mask (checked in the cases above) */
          desc.mask.kind = FLASHCL_MASK_BLOCK; desc.mask.block_q = 2; desc.mask.block_k = 4;
          want = FLASHCL_SUCCESS; what = "backward with a mask"; break;
        }
        if (t == 8 && !bwd) continue;
        fct_tensor_poison(&o);
        fct_tensor_poison(&lse);
        fct_tensor_poison(&dq);
        fct_tensor_poison(&dk);
        fct_tensor_poison(&dv);
        flashcl_status st;
        if (!bwd)
          st = flashcl_attention_forward(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t, &o.t, &lse.t, 0, NULL, NULL);
        else
          st = flashcl_attention_backward(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t, &o.t, &lse.t, &d_o.t, &dq.t,
                                          &dk.t, &dv.t, 0, NULL, NULL);
        FCT_CHECK_STATUS(st, want, "%s (%s, %s)", what, bwd ? "backward" : "forward", naive ? "naive" : "flash");
        if (want == FLASHCL_SUCCESS) { /* the valid case: the call wrote its outputs */
          size_t ws = 0;
          FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, &in.q.t, &in.k.t, &in.v.t,
                                                            FLASHCL_PASS_BACKWARD, &ws),
                           FLASHCL_SUCCESS, "%s: workspace_size", what);
          fct_finish();
          continue;
        }
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
  }
  /* The default is no mask; the mask fields are ignored then (here: a NULL mask). */
  flashcl_attention_desc d0;
  flashcl_attention_desc_init(&d0);
  FCT_CHECK(d0.mask.kind == FLASHCL_MASK_NONE && d0.mask.bits == NULL && d0.mask.per_head == 0, "desc_init mask defaults");
  d0.mask.block_q = -5;
  FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &d0, &in.q.t, &in.k.t, &in.v.t, &o.t, NULL, 0, NULL, NULL),
                   FLASHCL_SUCCESS, "mask fields ignored with FLASHCL_MASK_NONE");
  fct_finish();
  clReleaseMemObject(good);
  clReleaseMemObject(small);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
  fct_tensor_release(&d_o);
  fct_tensor_release(&dq);
  fct_tensor_release(&dk);
  fct_tensor_release(&dv);
  sp_inputs_release(&in);
}

/* An all-ones mask gives plain attention; an all-zeros mask O = 0, LSE = -inf. */
static void sp_full_and_empty(void **state) {
  (void)state;
  for (int fill = 0; fill < 2; fill++) {
    const sp_case c = {fill ? "all_ones" : "all_zeros", FLASHCL_F32, 1, 40, 72, 2, 1, 32, 1, -1, BLOCK, 8, 8, 0,
                       SP_RANDOM, 0, 0, NULL, NULL, 16, 0};
    fct_rng rng;
    fct_rng_init(&rng, c.name);
    sp_inputs in;
    sp_inputs_create(&in, &c, &rng);
    sp_mask m;
    sp_mask_alloc(&m, &in, c.kind, c.bq, c.bk, 0, c.hq);
    if (fill) memset(m.bits, 0xff, m.count * sizeof(uint32_t));
    m.mem = fct_create_buffer(m.count * sizeof(uint32_t), m.bits);
    const size_t no = (size_t)(in.B * in.Nq * c.hq * c.d), nl = (size_t)(in.B * in.Nq * c.hq);
    double *ref_o = calloc(no, sizeof(double)), *ref_lse = calloc(nl, sizeof(double));
    sp_reference(&c, &in, &m, ref_o, ref_lse);
    for (int naive = 0; naive < 2; naive++) {
      fct_tensor o;
      sp_run_one(&c, &in, &m, naive ? FLASHCL_ALGO_NAIVE : FLASHCL_ALGO_FLASH, ref_o, ref_lse, &o, "block");
      fct_tensor_release(&o);
    }
    free(ref_o);
    free(ref_lse);
    sp_mask_release(&m);
    sp_inputs_release(&in);
  }
}

/* ------------------------------------------------------ layout helpers -- */

static void sp_fill_helpers(void **state) {
  (void)state;
  uint32_t w[256];
  size_t n = 0;
  FCT_CHECK_STATUS(flashcl_mask_words(3, 33, &n), FLASHCL_SUCCESS, "mask_words(3, 33)");
  FCT_CHECK(n == 6, "mask_words(3, 33) = %zu", n);
  FCT_CHECK_STATUS(flashcl_mask_words(5, 32, &n), FLASHCL_SUCCESS, "mask_words(5, 32)");
  FCT_CHECK(n == 5, "mask_words(5, 32) = %zu", n);
  /* Error calls: the exact status, and *words (a sentinel) left unchanged. */
  n = (size_t)0xA5A5A5A5u;
  FCT_CHECK_STATUS(flashcl_mask_words(0, 1, &n), FLASHCL_ERROR_INVALID_ARGUMENT, "mask_words(0, 1)");
  FCT_CHECK(n == (size_t)0xA5A5A5A5u, "mask_words(0, 1) failed but wrote *words = %zu", n);
  FCT_CHECK_STATUS(flashcl_mask_words(1, -3, &n), FLASHCL_ERROR_INVALID_ARGUMENT, "mask_words(1, -3)");
  FCT_CHECK(n == (size_t)0xA5A5A5A5u, "mask_words(1, -3) failed but wrote *words = %zu", n);
  FCT_CHECK_STATUS(flashcl_mask_words(1, 1, NULL), FLASHCL_ERROR_INVALID_ARGUMENT, "mask_words NULL");

  /* LOCAL w = 2, 4 x 4: |i - j| < 2. */
  static const uint32_t local[4] = {0x3, 0x7, 0xe, 0xc};
  memset(w, 0xab, sizeof w);
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_LOCAL, 4, 4, 2, w, 4), FLASHCL_SUCCESS, "local");
  FCT_CHECK(memcmp(w, local, sizeof local) == 0, "local 4x4 w=2: %x %x %x %x", w[0], w[1], w[2], w[3]);
  FCT_CHECK(w[4] == 0xabababab, "local wrote past its words");
  /* STRIDED s = 2, 4 x 5: |i - j| < 2 or j % 2 == 1. */
  static const uint32_t strided[4] = {0xb, 0xf, 0xe, 0x1e};
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_STRIDED, 4, 5, 2, w, 4), FLASHCL_SUCCESS, "strided");
  FCT_CHECK(memcmp(w, strided, sizeof strided) == 0, "strided 4x5 s=2: %x %x %x %x", w[0], w[1], w[2], w[3]);
  /* BUTTERFLY, 8 x 8, all levels: i == j or i ^ j a power of two. */
  static const uint32_t bfly[8] = {0x17, 0x2b, 0x4d, 0x8e, 0x71, 0xb2, 0xd4, 0xe8};
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_BUTTERFLY, 8, 8, 0, w, 8), FLASHCL_SUCCESS, "butterfly");
  FCT_CHECK(memcmp(w, bfly, sizeof bfly) == 0, "butterfly 8x8: %x %x %x %x %x %x %x %x", w[0], w[1], w[2], w[3], w[4],
            w[5], w[6], w[7]);
  /* BUTTERFLY with 2 levels: strides 1 and 2 only. */
  static const uint32_t bfly2[8] = {0x07, 0x0b, 0x0d, 0x0e, 0x70, 0xb0, 0xd0, 0xe0};
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_BUTTERFLY, 8, 8, 2, w, 8), FLASHCL_SUCCESS, "butterfly L=2");
  FCT_CHECK(memcmp(w, bfly2, sizeof bfly2) == 0, "butterfly 8x8 L=2: %x %x %x %x %x %x %x %x", w[0], w[1], w[2], w[3],
            w[4], w[5], w[6], w[7]);
  /* BUTTERFLY with L >= 31 levels (found by test_fuzz): k < L holds for every
   * level, so it is the all-levels layout, not an empty one. */
  for (int L = 31; L <= 33; L += 2) {
    FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_BUTTERFLY, 8, 8, L, w, 8), FLASHCL_SUCCESS, "butterfly L");
    FCT_CHECK(memcmp(w, bfly, sizeof bfly) == 0, "butterfly 8x8 L=%d: %x %x %x %x %x %x %x %x", L, w[0], w[1], w[2],
              w[3], w[4], w[5], w[6], w[7]);
  }
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_BUTTERFLY, 8, 8, INT_MAX, w, 8), FLASHCL_SUCCESS, "butterfly max");
  FCT_CHECK(memcmp(w, bfly, sizeof bfly) == 0, "butterfly 8x8 L=INT_MAX differs from all levels");
  /* Two words per row: LOCAL w = 1 (the diagonal), 40 x 40; padding bits 0. */
  memset(w, 0xab, sizeof w);
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_LOCAL, 40, 40, 1, w, 80), FLASHCL_SUCCESS, "local 40");
  for (int i = 0; i < 40; i++)
    FCT_CHECK(w[2 * i] == (i < 32 ? 1u << i : 0u) && w[2 * i + 1] == (i < 32 ? 0u : 1u << (i - 32)),
              "local 40x40 w=1 row %d: %x %x", i, w[2 * i], w[2 * i + 1]);
  FCT_CHECK(w[80] == 0xabababab, "local 40 wrote past its words");
  /* Every layout against its definition on a non-square 37 x 70 matrix. */
  for (int lay = 0; lay < 3; lay++)
    for (int param = lay == 2 ? 0 : 1; param <= 5; param++) {
      FCT_CHECK_STATUS(flashcl_block_mask_fill((flashcl_block_layout)lay, 37, 70, param, w, 111), FLASHCL_SUCCESS,
                       "layout %d param %d", lay, param);
      for (int i = 0; i < 37; i++)
        for (int j = 0; j < 96; j++) {
          const int d = i > j ? i - j : j - i, x = i ^ j;
          int want = 0;
          if (j < 70) {
            if (lay == 0) want = d < param;
            if (lay == 1) want = d < param || j % param == param - 1;
            if (lay == 2) want = x == 0 || ((x & (x - 1)) == 0 && (param == 0 || x < (1 << param)));
          }
          FCT_CHECK((int)((w[i * 3 + j / 32] >> (j % 32)) & 1u) == want, "layout %d param %d: bit (%d, %d) != %d",
                    lay, param, i, j, want);
        }
    }
  /* Errors: nothing written. */
  memset(w, 0xab, sizeof w);
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_LOCAL, 4, 4, 2, w, 3), FLASHCL_ERROR_BUFFER_TOO_SMALL,
                   "capacity 3 of 4");
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_LOCAL, 0, 4, 2, w, 64), FLASHCL_ERROR_INVALID_ARGUMENT, "nbq 0");
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_LOCAL, 4, -1, 2, w, 64), FLASHCL_ERROR_INVALID_ARGUMENT, "nbk -1");
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_LOCAL, 4, 4, 0, w, 64), FLASHCL_ERROR_INVALID_ARGUMENT, "w 0");
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_STRIDED, 4, 4, 0, w, 64), FLASHCL_ERROR_INVALID_ARGUMENT, "s 0");
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_BUTTERFLY, 4, 4, -1, w, 64), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "L -1");
  FCT_CHECK_STATUS(flashcl_block_mask_fill((flashcl_block_layout)9, 4, 4, 1, w, 64), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "layout 9");
  FCT_CHECK_STATUS(flashcl_block_mask_fill(FLASHCL_BLOCK_LOCAL, 4, 4, 1, NULL, 64), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "NULL words");
  for (int i = 0; i < 256; i++) FCT_CHECK(w[i] == 0xabababab, "a failed fill wrote word %d", i);
}

int main(void) {
  enum { NC = sizeof CASES / sizeof CASES[0] };
  struct CMUnitTest tests[NC + 3];
  for (int i = 0; i < NC; i++) {
    struct CMUnitTest t = {CASES[i].name, sp_case_run, NULL, NULL, (void *)&CASES[i]};
    tests[i] = t;
  }
  struct CMUnitTest e = cmocka_unit_test(sp_error_paths), f = cmocka_unit_test(sp_full_and_empty),
                    h = cmocka_unit_test(sp_fill_helpers);
  tests[NC] = h;
  tests[NC + 1] = e;
  tests[NC + 2] = f;
  return fct_run_group("sparse", tests, NC + 3, 1);
}
