/*
 * Inference features: flashcl_merge_states, flashcl_attention_decode (split-KV,
 * paged and contiguous caches, GQA) and flashcl_kv_cache_append.
 *
 * Every case draws fresh random inputs (seed printed by the harness), poisons its
 * outputs with NaN before the call and compares against a double-precision CPU
 * reference by relative L2 (fp32 1e-5, fp16 2e-3, bf16 1e-2 for O; the LSE
 * tolerance of fct_lse_tolerance). Unused cache slots and pages are NaN, so a
 * read of a key outside a sequence shows up as NaN in the output; NaN never
 * passes. Rows that see no key must give O = 0 and LSE = -inf exactly.
 */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- helpers -- */

static void upload(fct_tensor *t) {
  cl_int err = clEnqueueWriteBuffer(fct_env_get()->queue, t->t.buffer, CL_TRUE, 0, t->bytes, t->host, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueWriteBuffer failed: %d", (int)err);
}

static cl_mem int_buffer(const int32_t *v, size_t n) { return fct_create_buffer(n * sizeof(int32_t), v); }

static void contiguous_tensor(fct_tensor *t, flashcl_dtype dtype, int64_t B, int64_t N, int64_t H, int64_t D) {
  int64_t shape[4] = {B, N, H, D}, stride[4] = {N * H * D, H * D, D, 1};
  fct_tensor_create_custom(t, dtype, (size_t)(B * N * H * D) * fct_dtype_size(dtype), 0, shape, stride);
}

/* fp32 (B, N, H, 1) with (B, N, H) row-major strides, so that row r of an LSE
 * buffer is row r of a contiguous (B, N, H, d) tensor. */
static void lse_bnh(fct_tensor *t, int64_t B, int64_t N, int64_t H) {
  int64_t shape[4] = {B, N, H, 1}, stride[4] = {N * H, H, 1, 1};
  fct_tensor_create_custom(t, FLASHCL_F32, (size_t)(B * N * H) * 4, 0, shape, stride);
}

static float rand_value(flashcl_dtype dtype, fct_rng *rng) {
  float v;
  do v = fct_quantize(dtype, (float)fct_rng_normal(rng));
  while (fabsf(v) < 1e-3f);
  return v;
}

/* Relative-L2 accumulator with NaN tracking. */
typedef struct l2acc {
  double num, den;
  size_t nonfinite, bad_empty;
} l2acc;

static void l2_add(l2acc *a, double got, double want) {
  if (!isfinite(got)) {
    a->nonfinite++;
    return;
  }
  a->num += (got - want) * (got - want);
  a->den += want * want;
}
static double l2_rel(const l2acc *a) { return a->den > 0 ? sqrt(a->num / a->den) : sqrt(a->num); }

/* LSE comparison: -inf must match exactly, otherwise relative L2. */
static void lse_add(l2acc *a, double got, double want) {
  if (isinf(want) && want < 0) {
    if (!(isinf(got) && got < 0)) a->bad_empty++;
    return;
  }
  l2_add(a, got, want);
}

/* ------------------------------------------------ decode: the reference -- */

typedef struct dec_case {
  const char *name;
  flashcl_dtype dtype;
  int batch, q_len, heads_q, heads_kv, head_dim;
  const int *seqlens; /* KV lengths after the append, batch entries */
  int page_size;      /* 0: contiguous */
  int num_splits;
  int padded_q;       /* 1: q/o/lse as FCT_PADDED views; 2: only o/lse (q aligned) */
  int append;         /* 1: the last q_len tokens go in via flashcl_kv_cache_append */
  int user_workspace; /* 1: pass a workspace buffer of exactly the queried size */
  int tree;           /* 1: desc.tree_mask from tree_word() */
  flashcl_kernel_family kernel; /* desc.kernel */
  float scale;                  /* desc.score.scale (0: 1/sqrt(d)) */
  int window, wl, wr;           /* window 1: desc.score.window_left/right = wl, wr */
  int alibi;                    /* 1: desc.score.alibi_slopes from alibi_slope() */
  float softcap;                /* desc.score.softcap */
  int sinks;                    /* 1: desc.score.sinks from sink_logit() */
  int head_dim_v;               /* v_cache's and o's head dim (0: head_dim) */
} dec_case;

static int case_dv(const dec_case *c) { return c->head_dim_v ? c->head_dim_v : c->head_dim; }

/* ALiBi slope of query head h of Hq (the geometric sequence of the ALiBi paper). */
static float alibi_slope(int h, int Hq) { return (float)pow(2.0, -8.0 * (h + 1) / Hq); }

/* The attention sink of query head h: -1.5 .. 2, within the scores' range. */
static float sink_logit(int h) { return 0.5f * (float)(h % 8) - 1.5f; }

/* The seed-003 tree: 9 tokens, parents - 0 1 1 2 2 3 3 4. */
static const int TREE_PARENT[9] = {-1, 0, 1, 1, 2, 2, 3, 3, 4};

/* desc.tree_mask word of query t in sequence b: the seed-003 tree's ancestors
 * (and t itself) for even b; for odd b the tree of a shifted numbering, token t
 * seeing t and t - 2, t - 4, ... (so a sequence's word is not its neighbour's),
 * plus bit 31, past any q_len, which the library must ignore. */
static uint32_t tree_word(int b, int t) {
  uint32_t w = 0;
  if (b % 2 == 0)
    for (int a = t; a >= 0; a = a < 9 ? TREE_PARENT[a] : a - 1) w |= 1u << a;
  else
    for (int a = t; a >= 0; a -= 2) w |= 1u << a;
  return b % 2 ? w | 0x80000000u : w;
}

/* The case's tree word: tree 2 lets every draft token see every other one (so
 * that a right window has keys past the query to hide). */
static uint32_t case_tree_word(const dec_case *c, int b, int t) { return c->tree == 2 ? 0xffffffffu : tree_word(b, t); }

/* Query t of sequence b (KV length L, T new tokens) sees key j. */
static int dec_visible(const dec_case *c, int b, int L, int t, int j) {
  const int u = j - (L - c->q_len), i = L - c->q_len + t;
  if (c->window && ((c->wl >= 0 && j < i - c->wl) || (c->wr >= 0 && j > i + c->wr))) return 0;
  if (!c->tree) return u <= t;
  return u < 0 || (u < c->q_len && ((case_tree_word(c, b, t) >> u) & 1u));
}

/* Logical K/V of sequence b, token j, head h, dim x: kv[(off[b] + j) * Hkv * d + h * d + x]. */
typedef struct dec_data {
  float *k, *v;
  size_t *off;
  int max_len;
} dec_data;

static void ref_decode(const dec_case *c, const fct_tensor *q, const dec_data *dd, double *ref_o, double *ref_lse) {
  const int B = c->batch, T = c->q_len, Hq = c->heads_q, Hkv = c->heads_kv, d = c->head_dim, G = Hq / Hkv;
  const int dv = case_dv(c);
  const double scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)d);
  int max_len = 0;
  for (int b = 0; b < B; b++)
    if (c->seqlens[b] > max_len) max_len = c->seqlens[b];
  double *s = malloc(sizeof(double) * (size_t)(max_len + 1));
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < Hq; h++) {
        const int L = c->seqlens[b], hk = h / G;
        int nvis = 0;
        double *o = ref_o + (((size_t)b * T + t) * Hq + h) * dv;
        double m = -INFINITY, l = 0, qr[576];
        for (int x = 0; x < d; x++) qr[x] = fct_tensor_get(q, b, t, h, x);
        for (int x = 0; x < dv; x++) o[x] = 0;
        for (int j = 0; j < L; j++) {
          s[j] = -INFINITY;
          if (!dec_visible(c, b, L, t, j)) continue;
          const float *kr = dd->k + (dd->off[b] + j) * (size_t)Hkv * d + (size_t)hk * d;
          double a = 0;
          for (int x = 0; x < d; x++) a += qr[x] * kr[x];
          s[j] = a * scale;
          if (c->softcap > 0.0f) s[j] = c->softcap * tanh(s[j] / c->softcap);
          if (c->alibi) s[j] -= alibi_slope(h, Hq) * fabs((double)(j - (L - T + t)));
          if (s[j] > m) m = s[j];
          nvis++;
        }
        /* A sink joins the softmax with no value: a row with no key gets O = 0, LSE = sink. */
        if (c->sinks && sink_logit(h) > m) m = sink_logit(h);
        if (c->sinks) l += exp(sink_logit(h) - m);
        for (int j = 0; j < L; j++) {
          if (s[j] == -INFINITY) continue;
          const float *vr = dd->v + (dd->off[b] + j) * (size_t)Hkv * dv + (size_t)hk * dv;
          const double p = exp(s[j] - m);
          l += p;
          for (int x = 0; x < dv; x++) o[x] += p * vr[x];
        }
        if (l > 0)
          for (int x = 0; x < dv; x++) o[x] /= l;
        ref_lse[((size_t)b * T + t) * Hq + h] = l > 0 ? m + log(l) : -INFINITY;
      }
  free(s);
}

/* The cache: contiguous (B, cap, Hkv, d), or a pool of pages assigned to the
 * sequences in shuffled order plus two spare pages. Unused slots stay NaN. */
typedef struct dec_cache {
  fct_tensor k, v;
  cl_mem block_table;
  int32_t *bt;
  int max_pages, num_pages, capacity;
} dec_cache;

static void cache_create(dec_cache *cc, const dec_case *c, fct_rng *rng) {
  const int B = c->batch, Hkv = c->heads_kv, d = c->head_dim, dv = case_dv(c);
  int max_len = 1;
  memset(cc, 0, sizeof *cc);
  for (int b = 0; b < B; b++)
    if (c->seqlens[b] > max_len) max_len = c->seqlens[b];
  if (!c->page_size) {
    cc->capacity = max_len + 3;
    contiguous_tensor(&cc->k, c->dtype, B, cc->capacity, Hkv, d);
    contiguous_tensor(&cc->v, c->dtype, B, cc->capacity, Hkv, dv);
    return;
  }
  const int P = c->page_size;
  cc->max_pages = (max_len + P - 1) / P + 1;
  cc->capacity = cc->max_pages * P;
  int used = 0;
  for (int b = 0; b < B; b++) used += (c->seqlens[b] + P - 1) / P;
  cc->num_pages = used + 2;
  int *perm = malloc(sizeof(int) * (size_t)cc->num_pages);
  for (int i = 0; i < cc->num_pages; i++) perm[i] = i;
  for (int i = cc->num_pages - 1; i > 0; i--) {
    int j = (int)(fct_rng_u64(rng) % (uint64_t)(i + 1)), tmp = perm[i];
    perm[i] = perm[j];
    perm[j] = tmp;
  }
  cc->bt = malloc(sizeof(int32_t) * (size_t)B * cc->max_pages);
  int next = 0;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < cc->max_pages; i++)
      cc->bt[(size_t)b * cc->max_pages + i] = i < (c->seqlens[b] + P - 1) / P ? perm[next++] : -12345; /* unused */
  free(perm);
  cc->block_table = int_buffer(cc->bt, (size_t)B * cc->max_pages);
  contiguous_tensor(&cc->k, c->dtype, cc->num_pages, P, Hkv, d);
  contiguous_tensor(&cc->v, c->dtype, cc->num_pages, P, Hkv, dv);
}

static void cache_release(dec_cache *cc) {
  fct_tensor_release(&cc->k);
  fct_tensor_release(&cc->v);
  if (cc->block_table) clReleaseMemObject(cc->block_table);
  free(cc->bt);
}

/* Element index of (sequence b, token j, head h, dim x) in cache tensor t (K or V). */
static size_t cache_index(const dec_cache *cc, const fct_tensor *t, const dec_case *c, int b, int j, int h, int x) {
  if (!c->page_size) return fct_tensor_index(t, b, j, h, x);
  const int P = c->page_size;
  return fct_tensor_index(t, cc->bt[(size_t)b * cc->max_pages + j / P], j % P, h, x);
}

static void decode_desc(const dec_case *c, const dec_cache *cc, flashcl_decode_desc *desc) {
  flashcl_decode_desc_init(desc);
  desc->split.num_splits = c->num_splits;
  desc->kernel = c->kernel;
  desc->score.scale = c->scale;
  desc->score.softcap = c->softcap;
  if (c->window) {
    desc->score.window_left = c->wl;
    desc->score.window_right = c->wr;
  }
  if (c->page_size) {
    desc->cache.page_size = c->page_size;
    desc->cache.block_table = cc->block_table;
    desc->cache.max_pages = cc->max_pages;
  }
}

static void run_decode_case(const dec_case *c) {
  fct_env *env = fct_env_get();
  const int B = c->batch, T = c->q_len, Hq = c->heads_q, Hkv = c->heads_kv, d = c->head_dim, dv = case_dv(c);
  fct_rng rng;
  char tag[256];
  snprintf(tag, sizeof tag, "decode/%s", c->name);
  fct_rng_init(&rng, tag);

  fct_tensor q, o, lse;
  const fct_layout lay = c->padded_q ? FCT_PADDED : FCT_BNHD;
  fct_tensor_create(&q, c->dtype, c->padded_q == 1 ? FCT_PADDED : FCT_BNHD, B, T, Hq, d, 1);
  fct_tensor_create(&o, c->dtype, lay, B, T, Hq, dv, 2);
  fct_tensor_create_lse(&lse, lay, B, T, Hq, 3);
  fct_tensor_fill_random(&q, &rng);

  dec_data dd;
  dd.off = malloc(sizeof(size_t) * (size_t)B);
  size_t total = 0;
  for (int b = 0; b < B; b++) {
    dd.off[b] = total;
    total += (size_t)c->seqlens[b];
  }
  dd.k = malloc(sizeof(float) * (total * Hkv * d + 1));
  dd.v = malloc(sizeof(float) * (total * Hkv * dv + 1));
  for (size_t i = 0; i < total * Hkv * d; i++) dd.k[i] = rand_value(c->dtype, &rng);
  for (size_t i = 0; i < total * Hkv * dv; i++) dd.v[i] = rand_value(c->dtype, &rng);

  dec_cache cc;
  cache_create(&cc, c, &rng);
  /* Tokens [0, L - T) are in the cache already when appending, else all L. */
  for (int b = 0; b < B; b++) {
    const int pre = c->append ? (c->seqlens[b] - T > 0 ? c->seqlens[b] - T : 0) : c->seqlens[b];
    for (int j = 0; j < pre; j++)
      for (int h = 0; h < Hkv; h++) {
        for (int x = 0; x < d; x++)
          fct_store(c->dtype, cc.k.host, cache_index(&cc, &cc.k, c, b, j, h, x),
                    dd.k[(dd.off[b] + j) * (size_t)Hkv * d + (size_t)h * d + x]);
        for (int x = 0; x < dv; x++)
          fct_store(c->dtype, cc.v.host, cache_index(&cc, &cc.v, c, b, j, h, x),
                    dd.v[(dd.off[b] + j) * (size_t)Hkv * dv + (size_t)h * dv + x]);
      }
  }
  upload(&cc.k);
  upload(&cc.v);

  flashcl_decode_desc desc;
  decode_desc(c, &cc, &desc);
  cl_mem tree = NULL;
  if (c->tree) {
    uint32_t *w = malloc(sizeof(uint32_t) * (size_t)B * T);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) w[(size_t)b * T + t] = case_tree_word(c, b, t);
    tree = fct_create_buffer(sizeof(uint32_t) * (size_t)B * T, w);
    free(w);
    desc.tree_mask = tree;
  }
  cl_mem slopes = NULL;
  if (c->alibi) {
    float *sl = malloc(sizeof(float) * (size_t)Hq);
    for (int h = 0; h < Hq; h++) sl[h] = alibi_slope(h, Hq);
    slopes = fct_create_buffer(sizeof(float) * (size_t)Hq, sl);
    free(sl);
    desc.score.alibi_slopes = slopes;
  }
  cl_mem sinks = NULL;
  if (c->sinks) {
    float sv[64];
    for (int h = 0; h < Hq; h++) sv[h] = sink_logit(h);
    sinks = fct_create_buffer(sizeof(float) * (size_t)Hq, sv);
    desc.score.sinks = sinks;
  }
  int32_t *lens = malloc(sizeof(int32_t) * (size_t)B);
  flashcl_status st;
  if (c->append) {
    /* Sequences shorter than T get only their last tokens (the first T - L new
     * tokens land at negative positions and are skipped). */
    fct_tensor kn, vn;
    contiguous_tensor(&kn, c->dtype, B, T, Hkv, d);
    contiguous_tensor(&vn, c->dtype, B, T, Hkv, dv);
    for (int b = 0; b < B; b++) {
      lens[b] = c->seqlens[b] - T;
      for (int t = 0; t < T; t++) {
        const int j = lens[b] + t; /* j < 0: a value that must never be written */
        for (int h = 0; h < Hkv; h++) {
          for (int x = 0; x < d; x++)
            fct_store(c->dtype, kn.host, fct_tensor_index(&kn, b, t, h, x),
                      j < 0 ? 1e4f : dd.k[(dd.off[b] + j) * (size_t)Hkv * d + (size_t)h * d + x]);
          for (int x = 0; x < dv; x++)
            fct_store(c->dtype, vn.host, fct_tensor_index(&vn, b, t, h, x),
                      j < 0 ? 1e4f : dd.v[(dd.off[b] + j) * (size_t)Hkv * dv + (size_t)h * dv + x]);
        }
      }
    }
    upload(&kn);
    upload(&vn);
    cl_mem before = int_buffer(lens, (size_t)B);
    st = flashcl_kv_cache_append(env->ctx, FCT_APPEND_DESC(&desc), &kn.t, &vn.t, &cc.k.t, &cc.v.t, before, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: flashcl_kv_cache_append", c->name);
    fct_finish();
    /* The cache now holds exactly the full sequences (and NaN elsewhere). */
    fct_tensor_download(&cc.k);
    fct_tensor_download(&cc.v);
    for (int b = 0; b < B; b++)
      for (int j = 0; j < c->seqlens[b]; j++)
        for (int h = 0; h < Hkv; h++)
          for (int x = 0; x < d; x++) {
            const size_t ks = (dd.off[b] + j) * (size_t)Hkv * d + (size_t)h * d + x;
            const size_t vs = (dd.off[b] + j) * (size_t)Hkv * dv + (size_t)h * dv + x;
            FCT_CHECK(fct_load(c->dtype, cc.k.host, cache_index(&cc, &cc.k, c, b, j, h, x)) == dd.k[ks] &&
                          (x >= dv || fct_load(c->dtype, cc.v.host, cache_index(&cc, &cc.v, c, b, j, h, x)) == dd.v[vs]),
                      "%s: cache entry (b %d, j %d, h %d, x %d) after the append is wrong", c->name, b, j, h, x);
          }
    size_t expect = 0;
    for (int b = 0; b < B; b++) expect += (size_t)c->seqlens[b] * Hkv;
    FCT_CHECK(fct_tensor_count_unpoisoned(&cc.k) == expect * d && fct_tensor_count_unpoisoned(&cc.v) == expect * dv,
              "%s: the append wrote outside the new tokens' slots", c->name);
    clReleaseMemObject(before);
    fct_tensor_release(&kn);
    fct_tensor_release(&vn);
  }
  for (int b = 0; b < B; b++) lens[b] = c->seqlens[b];
  cl_mem seqlens = int_buffer(lens, (size_t)B);

  size_t ws = 0;
  int splits = -1;
  cl_mem wbuf = NULL;
  st = flashcl_attention_decode_workspace_size(env->ctx, &desc, &q.t, &cc.k.t, &cc.v.t, &ws, &splits);
  if (c->kernel == FLASHCL_KERNEL_NVIDIA_MMA && st == FLASHCL_ERROR_UNSUPPORTED) {
    /* No cp.async path on this device: the call is refused and writes nothing. */
    st = flashcl_attention_decode(env->ctx, &desc, &q.t, &cc.k.t, &cc.v.t, seqlens, &o.t, &lse.t, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_UNSUPPORTED, "%s: decode without the NVIDIA path", c->name);
    FCT_CHECK(strlen(flashcl_context_last_error(env->ctx)) > 0, "%s: no message for the refusal", c->name);
    fct_finish();
    fct_tensor_download(&o);
    fct_tensor_download(&lse);
    FCT_CHECK(fct_tensor_count_unpoisoned(&o) == 0 && fct_tensor_count_unpoisoned(&lse) == 0,
              "%s: a refused call wrote its outputs", c->name);
    /* Right everywhere except on an NVIDIA device of compute capability >= 8.0. */
    fct_mma_unavailable(env->device, c->name, flashcl_context_last_error(env->ctx));
    print_message("[ DECODE   ] %-28s refused on this device, as it should be (%s)\n", c->name,
                  flashcl_context_last_error(env->ctx));
    goto done;
  }
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: workspace size", c->name);
  FCT_CHECK(splits >= 1 && (c->num_splits == 0 || splits == c->num_splits), "%s: splits %d", c->name, splits);
  FCT_CHECK((splits == 1) == (ws == 0), "%s: %d splits but workspace %zu", c->name, splits, ws);
  if (c->user_workspace && ws) {
    wbuf = fct_create_buffer(ws + 64, NULL);
    desc.split.workspace = wbuf;
    desc.split.workspace_offset = 64;
  }

  double *ref_o = malloc(sizeof(double) * (size_t)B * T * Hq * dv);
  double *ref_lse = malloc(sizeof(double) * (size_t)B * T * Hq);
  ref_decode(c, &q, &dd, ref_o, ref_lse);

  cl_event ev = NULL;
  st = flashcl_attention_decode(env->ctx, &desc, &q.t, &cc.k.t, &cc.v.t, seqlens, &o.t, &lse.t, 0, NULL, &ev);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: flashcl_attention_decode", c->name);
  FCT_CHECK(ev != NULL && clWaitForEvents(1, &ev) == CL_SUCCESS, "%s: out_event", c->name);
  clReleaseEvent(ev);
  fct_finish();
  fct_tensor_download(&o);
  fct_tensor_download(&lse);

  l2acc eo = {0}, el = {0};
  size_t empty_bad = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < Hq; h++) {
        const double *ro = ref_o + (((size_t)b * T + t) * Hq + h) * dv;
        const double rl = ref_lse[((size_t)b * T + t) * Hq + h];
        for (int x = 0; x < dv; x++) {
          const double g = fct_tensor_get(&o, b, t, h, x);
          if (isinf(rl) && g != 0.0) empty_bad++;
          if (!isfinite(g) && x == 0 && getenv("DBG")) fprintf(stderr, "bad b=%d t=%d h=%d L=%d rl=%g g=%g lse=%g\n", b, t, h, c->seqlens[b], rl, g, fct_tensor_get(&lse, b, t, h, 0));
          l2_add(&eo, g, ro[x]);
        }
        lse_add(&el, fct_tensor_get(&lse, b, t, h, 0), rl);
      }
  const double tol = fct_tolerance(c->dtype), ltol = fct_lse_tolerance(c->dtype);
  print_message("[ DECODE   ] %-28s %s B=%d q_len=%d %d:%d d=%d/%d %s splits=%d: relL2 O %.2e LSE %.2e\n", c->name,
                fct_dtype_str(c->dtype), B, T, Hq, Hkv, d, dv, c->page_size ? "paged" : "contig", splits, l2_rel(&eo),
                l2_rel(&el));
  FCT_CHECK(eo.nonfinite == 0 && el.nonfinite == 0, "%s: %zu non-finite O and %zu LSE values", c->name,
            eo.nonfinite, el.nonfinite);
  FCT_CHECK(empty_bad == 0 && el.bad_empty == 0, "%s: rows without keys must give O = 0, LSE = -inf (%zu, %zu)",
            c->name, empty_bad, el.bad_empty);
  FCT_CHECK(l2_rel(&eo) <= tol, "%s: O relL2 %.3e > %.1e", c->name, l2_rel(&eo), tol);
  FCT_CHECK(l2_rel(&el) <= ltol, "%s: LSE relL2 %.3e > %.1e", c->name, l2_rel(&el), ltol);
  /* Nothing written outside the o / lse views. */
  FCT_CHECK(fct_tensor_count_unpoisoned(&o) == (size_t)B * T * Hq * dv &&
                fct_tensor_count_unpoisoned(&lse) == (size_t)B * T * Hq,
            "%s: writes outside the o/lse views", c->name);

  free(ref_o);
  free(ref_lse);
done:
  if (tree) clReleaseMemObject(tree);
  if (slopes) clReleaseMemObject(slopes);
  if (sinks) clReleaseMemObject(sinks);
  if (wbuf) clReleaseMemObject(wbuf);
  clReleaseMemObject(seqlens);
  free(lens);
  cache_release(&cc);
  free(dd.k);
  free(dd.v);
  free(dd.off);
  fct_tensor_release(&q);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
}

/* The mixed batch; the f32 case adds an empty sequence. */
static const int MIXED[6] = {1, 15, 16, 17, 1000, 4097};
static const int MIXED0[7] = {17, 0, 4097, 1, 1000, 16, 15};
static const int MIXED_T[6] = {1000, 9, 4, 4097, 17, 130};

static const dec_case DEC_CASES[] = {
    /* name, dtype, B, q_len, Hq, Hkv, d, seqlens, page, splits, padded, append, user_ws */
    {"contig_q1_f16_auto", FLASHCL_F16, 6, 1, 32, 8, 64, MIXED, 0, 0, 0, 0, 0},
    {"contig_q1_f16_split3", FLASHCL_F16, 6, 1, 32, 8, 64, MIXED, 0, 3, 0, 0, 0},
    {"paged16_q4_f16_split4", FLASHCL_F16, 6, 4, 32, 8, 64, MIXED, 16, 4, 0, 0, 0},
    {"paged64_q1_bf16_split5", FLASHCL_BF16, 6, 1, 32, 8, 64, MIXED, 64, 5, 0, 0, 0},
    {"paged64_q4_f16_unsplit", FLASHCL_F16, 6, 4, 32, 8, 64, MIXED, 64, 1, 0, 0, 0},
    {"contig_q4_f32_split7_padded", FLASHCL_F32, 7, 4, 32, 8, 64, MIXED0, 0, 7, 1, 0, 1},
    {"paged16_q1_f16_d128", FLASHCL_F16, 6, 1, 8, 2, 128, MIXED, 16, 3, 0, 0, 0},
    /* Not a power of two: the kernel divides instead of shifting. */
    {"paged24_q1_f16_split3", FLASHCL_F16, 6, 1, 32, 8, 64, MIXED, 24, 3, 0, 0, 0},
    {"append_paged16_q4_f16", FLASHCL_F16, 6, 4, 32, 8, 64, MIXED, 16, 4, 0, 1, 0},
    {"append_contig_q1_f16", FLASHCL_F16, 6, 1, 32, 8, 64, MIXED, 0, 3, 0, 1, 0},
    /* Speculative verification: the seed-003 tree's 9 draft tokens (odd
     * sequences another tree), split and unsplit, paged and contiguous; MIXED_T
     * has sequences shorter than the tree (some drafts at negative positions)
     * and one of exactly the tree. */
    {"tree9_paged16_f16_split4", FLASHCL_F16, 6, 9, 32, 8, 64, MIXED_T, 16, 4, 0, 0, 0, 1},
    {"tree9_contig_f32_unsplit", FLASHCL_F32, 6, 9, 8, 2, 64, MIXED_T, 0, 1, 1, 0, 0, 1},
    {"tree9_append_paged64_bf16_auto", FLASHCL_BF16, 6, 9, 32, 8, 128, MIXED_T, 64, 0, 0, 1, 0, 1},
    /* 64 and 16 rows per kv head (the tensor-core kernel's cases on NVIDIA):
     * 16 tokens with GQA 4 (4 m-tiles), sequences shorter than the tokens;
     * 2 tokens with GQA 8. */
    {"contig_q16_bf16_d128_auto", FLASHCL_BF16, 6, 16, 16, 4, 128, MIXED_T, 0, 0, 0, 0, 0},
    {"contig_q2_f16_g8_split5", FLASHCL_F16, 6, 2, 32, 4, 64, MIXED, 0, 5, 0, 0, 0},
    /* o and lse at odd offsets and strides with an aligned q (the NVIDIA
     * kernels' case): split with a workspace of exactly the queried size, and
     * unsplit (the attention kernel writes o itself). */
    {"contig_q4_f16_odd_o_user_ws", FLASHCL_F16, 6, 4, 32, 8, 128, MIXED, 0, 0, 2, 0, 1},
    {"contig_q4_bf16_odd_o_unsplit", FLASHCL_BF16, 6, 4, 32, 8, 64, MIXED, 0, 1, 2, 0, 0},
    /* A negative scale (the softmax then favours the smallest dot products):
     * kernels that take the row max of raw scores must not run it. */
    {"paged16_q4_f16_negative_scale", FLASHCL_F16, 6, 4, 32, 8, 128, MIXED, 16, 0, 0, 0, 0, 0, FLASHCL_KERNEL_AUTO,
     -0.2f},
    /* Kernel families: on NVIDIA devices AUTO takes the cp.async path for the
     * 16-bit cases above, so these keep the portable kernel tested there; the
     * NVIDIA ones are refused elsewhere (16 rows per kv head). */
    {"contig_q1_f16_d128_portable", FLASHCL_F16, 6, 1, 32, 8, 128, MIXED, 0, 0, 0, 0, 0, 0, FLASHCL_KERNEL_PORTABLE},
    {"paged16_q4_bf16_d128_portable", FLASHCL_BF16, 6, 4, 32, 8, 128, MIXED, 16, 4, 0, 0, 0, 0,
     FLASHCL_KERNEL_PORTABLE},
    {"contig_q1_f16_d128_nvidia", FLASHCL_F16, 6, 1, 32, 8, 128, MIXED, 0, 0, 0, 0, 0, 0, FLASHCL_KERNEL_NVIDIA_MMA},
    {"paged16_q4_bf16_d128_nvidia", FLASHCL_BF16, 6, 4, 32, 8, 128, MIXED, 16, 4, 0, 0, 0, 0,
     FLASHCL_KERNEL_NVIDIA_MMA},
    /* Score variants (name, ..., kernel, scale, window, wl, wr, alibi, softcap).
     * A left window of 100 keys: the 1000- and 4097-key sequences split only
     * the window, the short ones see everything; with pages of 16 and 24 (a
     * window start inside a page), split and automatic. */
    {"window100_paged16_q4_f16_split4", FLASHCL_F16, 6, 4, 32, 8, 64, MIXED, 16, 4, 0, 0, 0, 0, FLASHCL_KERNEL_AUTO,
     0.0f, 1, 100, -1},
    {"window37_paged24_q1_bf16_d128_auto", FLASHCL_BF16, 6, 1, 32, 8, 128, MIXED, 24, 0, 0, 0, 0, 0,
     FLASHCL_KERNEL_AUTO, 0.0f, 1, 37, -1},
    /* A window of 0 keys to the left: each query sees only itself. */
    {"window0_contig_q4_f32_split3", FLASHCL_F32, 7, 4, 8, 2, 64, MIXED0, 0, 3, 0, 0, 0, 0, FLASHCL_KERNEL_AUTO, 0.0f,
     1, 0, -1},
    /* Drafts that see every other draft (tree 2), cut by a right window of 1
     * and a left one of 5. */
    {"tree_all_window5_1_contig_f16", FLASHCL_F16, 6, 9, 32, 8, 64, MIXED_T, 0, 4, 0, 0, 0, 2, FLASHCL_KERNEL_AUTO,
     0.0f, 1, 5, 1},
    /* ALiBi and softcap (1.5: most scores are bent by the tanh), alone and
     * with the window, on the cp.async path where the device has one and the
     * portable kernel forced. */
    {"alibi_softcap_contig_q1_f16_d128_auto", FLASHCL_F16, 6, 1, 32, 8, 128, MIXED, 0, 0, 0, 0, 0, 0,
     FLASHCL_KERNEL_AUTO, 0.0f, 0, 0, 0, 1, 1.5f},
    {"alibi_paged16_q4_bf16_portable", FLASHCL_BF16, 6, 4, 32, 8, 64, MIXED, 16, 5, 0, 0, 0, 0,
     FLASHCL_KERNEL_PORTABLE, 0.0f, 0, 0, 0, 1},
    {"softcap_window64_paged64_q4_f16", FLASHCL_F16, 6, 4, 32, 8, 128, MIXED, 64, 0, 0, 0, 0, 0, FLASHCL_KERNEL_AUTO,
     0.0f, 1, 64, -1, 1, 0.75f},
    /* Attention sinks, split (each split's partial without the sink, the merge
     * adding it once) and unsplit, with a window of 0 keys (the sink takes half
     * of a row) and a tree; on the cp.async path where the device has one. */
    {"sinks_contig_q1_f16_d128_split4", FLASHCL_F16, 6, 1, 32, 8, 128, MIXED, 0, 4, 0, 0, 0, 0, FLASHCL_KERNEL_AUTO,
     0.0f, 0, 0, 0, 0, 0.0f, 1},
    {"sinks_window0_paged16_q4_f32_unsplit", FLASHCL_F32, 7, 4, 8, 2, 64, MIXED0, 16, 1, 0, 0, 0, 0,
     FLASHCL_KERNEL_AUTO, 0.0f, 1, 0, -1, 0, 0.0f, 1},
    {"sinks_tree_alibi_softcap_contig_bf16", FLASHCL_BF16, 6, 9, 32, 8, 64, MIXED_T, 0, 3, 0, 0, 0, 1,
     FLASHCL_KERNEL_AUTO, 0.0f, 0, 0, 0, 1, 1.5f, 1},
    /* V (and o) with a head dim of their own, below q's and K's (MLA-like,
     * and 192 / 128 prefill shapes): split and unsplit, paged and contiguous,
     * appended, with a tree, a window and sinks, f32 / f16 / bf16. AUTO runs
     * the portable kernel for them on every device. */
    {"dv128_d192_paged16_q1_f16_split3", FLASHCL_F16, 6, 1, 32, 8, 192, MIXED, 16, 3, 0, 0, 0, .head_dim_v = 128},
    {"dv32_d64_contig_q4_f32_auto_append", FLASHCL_F32, 7, 4, 8, 2, 64, MIXED0, 0, 0, 0, 1, 0, .head_dim_v = 32},
    {"dv64_d128_tree9_append_paged24_bf16", FLASHCL_BF16, 6, 9, 32, 8, 128, MIXED_T, 24, 4, 0, 1, 1, 1,
     .head_dim_v = 64},
    {"dv8_d256_window_sinks_contig_f16", FLASHCL_F16, 6, 2, 16, 4, 256, MIXED, 0, 0, 2, 0, 0, 0, FLASHCL_KERNEL_AUTO,
     0.0f, 1, 40, -1, 0, 0.0f, 1, 8},
    /* MLA's decode shape: one latent KV head of 576 (512 + 64 rope) shared by
     * 16 query heads, values of 512, paged, appended, split and automatic; and
     * a 320 / 320 head past 256. */
    {"mla_d576_dv512_paged64_q1_bf16_split3", FLASHCL_BF16, 6, 1, 16, 1, 576, MIXED, 64, 3, 0, 1, 0,
     .head_dim_v = 512},
    {"mla_d576_dv512_contig_q2_f32_auto", FLASHCL_F32, 7, 2, 16, 1, 576, MIXED0, 0, 0, 0, 0, 0, .head_dim_v = 512},
    {"d320_contig_q1_f16_split2", FLASHCL_F16, 6, 1, 8, 2, 320, MIXED, 0, 2, 0, 1, 0},
};

static void test_decode_case(void **state) { run_decode_case((const dec_case *)*state); }

/* K and V interleaved in one page pool, [pages][2][page][Hkv][d] (FlashInfer's
 * layout): the two cache views share a buffer but no element, so the append
 * takes them, and writes exactly the new tokens' slots, across a page boundary,
 * through a shuffled block table. */
static void test_append_interleaved_pool(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  enum { PAGES = 4, P = 16, H = 2, D = 64, T = 5, LEN = 14 };
  const int32_t table[PAGES] = {2, 0, 3, 1};
  const int64_t shape[4] = {PAGES, P, H, D}, stride[4] = {2 * P * H * D, H * D, D, 1};
  fct_rng rng;
  fct_rng_init(&rng, "decode/append_interleaved");
  fct_tensor pool, kn, vn;
  fct_tensor_create_custom(&pool, FLASHCL_F32, (size_t)PAGES * 2 * P * H * D * 4, 0, shape, stride);
  fct_tensor_poison(&pool);
  flashcl_tensor vview = pool.t;
  vview.offset = (size_t)P * H * D * 4;
  contiguous_tensor(&kn, FLASHCL_F32, 1, T, H, D);
  contiguous_tensor(&vn, FLASHCL_F32, 1, T, H, D);
  fct_tensor_fill_random(&kn, &rng);
  fct_tensor_fill_random(&vn, &rng);
  flashcl_decode_desc desc;
  flashcl_decode_desc_init(&desc);
  desc.cache.page_size = P;
  desc.cache.max_pages = PAGES;
  desc.cache.block_table = int_buffer(table, PAGES);
  const int32_t len = LEN;
  cl_mem lens = int_buffer(&len, 1);
  flashcl_status st = flashcl_kv_cache_append(env->ctx, FCT_APPEND_DESC(&desc), &kn.t, &vn.t, &pool.t, &vview, lens, 0, NULL, NULL);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "append into an interleaved K|V pool");
  fct_finish();
  fct_tensor_download(&pool);
  size_t bad = 0;
  for (int t = 0; t < T; t++) {
    const int j = LEN + t, page = table[j / P], slot = j % P;
    for (int h = 0; h < H; h++)
      for (int x = 0; x < D; x++) {
        const size_t ki = (size_t)page * stride[0] + (size_t)slot * stride[1] + (size_t)h * D + x;
        const size_t vi = ki + vview.offset / 4;
        if (fct_load(FLASHCL_F32, pool.host, ki) != fct_tensor_get(&kn, 0, t, h, x)) bad++;
        if (fct_load(FLASHCL_F32, pool.host, vi) != fct_tensor_get(&vn, 0, t, h, x)) bad++;
      }
  }
  FCT_CHECK(bad == 0, "interleaved pool: %zu K/V elements differ from the new tokens", bad);
  FCT_CHECK(fct_tensor_count_unpoisoned(&pool) == (size_t)2 * T * H * D,
            "interleaved pool: %zu elements written, want exactly the %d new K and V rows",
            fct_tensor_count_unpoisoned(&pool), T);
  clReleaseMemObject(lens);
  clReleaseMemObject(desc.cache.block_table);
  fct_tensor_release(&pool);
  fct_tensor_release(&kn);
  fct_tensor_release(&vn);
}

/* A corrupt block table (indices far outside the pool) reads clamped pages: the
 * call succeeds and the outputs stay finite. */
static void test_decode_corrupt_block_table(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  const int B = 2, T = 1, Hq = 4, Hkv = 1, d = 64, P = 16, max_pages = 4, num_pages = 3;
  fct_rng rng;
  fct_rng_init(&rng, "decode/corrupt");
  fct_tensor q, o, kc, vc;
  contiguous_tensor(&q, FLASHCL_F32, B, T, Hq, d);
  contiguous_tensor(&o, FLASHCL_F32, B, T, Hq, d);
  contiguous_tensor(&kc, FLASHCL_F32, num_pages, P, Hkv, d);
  contiguous_tensor(&vc, FLASHCL_F32, num_pages, P, Hkv, d);
  fct_tensor_fill_random(&q, &rng);
  fct_tensor_fill_random(&kc, &rng);
  fct_tensor_fill_random(&vc, &rng);
  int32_t bt[8] = {0, 2000000000, -5, 1, -2147483647 - 1, 7, 2, 3};
  int32_t lens[2] = {64, 1000000}; /* the second is clamped to the capacity (64) */
  cl_mem btm = int_buffer(bt, 8), lm = int_buffer(lens, 2);
  flashcl_decode_desc desc;
  flashcl_decode_desc_init(&desc);
  desc.cache.page_size = P;
  desc.cache.block_table = btm;
  desc.cache.max_pages = max_pages;
  for (int splits = 1; splits <= 2; splits++) {
    desc.split.num_splits = splits;
    fct_tensor_poison(&o);
    flashcl_status st = flashcl_attention_decode(env->ctx, &desc, &q.t, &kc.t, &vc.t, lm, &o.t, NULL, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "corrupt block table, %d splits", splits);
    fct_finish();
    fct_tensor_download(&o);
    for (size_t i = 0; i < (size_t)B * T * Hq * d; i++)
      FCT_CHECK(isfinite(fct_load(FLASHCL_F32, o.host, i)), "non-finite output at %zu", i);
  }
  clReleaseMemObject(btm);
  clReleaseMemObject(lm);
  fct_tensor_release(&q);
  fct_tensor_release(&o);
  fct_tensor_release(&kc);
  fct_tensor_release(&vc);
}

/* Auto splits: batch 1 at 128K context must use enough work-groups to fill the
 * device (checked through the workspace query, no launch). */
static void test_decode_auto_splits(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  const int P = 64, max_pages = 2048; /* 128K tokens */
  fct_tensor q, kc, vc;
  contiguous_tensor(&q, FLASHCL_F16, 1, 1, 32, 128);
  contiguous_tensor(&kc, FLASHCL_F16, 8, P, 8, 128); /* a small pool is enough for the query */
  contiguous_tensor(&vc, FLASHCL_F16, 8, P, 8, 128);
  cl_mem bt = fct_create_buffer(sizeof(int32_t) * max_pages, NULL);
  flashcl_decode_desc desc;
  flashcl_decode_desc_init(&desc);
  desc.cache.page_size = P;
  desc.cache.block_table = bt;
  desc.cache.max_pages = max_pages;
  size_t ws = 0;
  int splits = 0;
  flashcl_status st = flashcl_attention_decode_workspace_size(env->ctx, &desc, &q.t, &kc.t, &vc.t, &ws, &splits);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "workspace query");
  const int cus = (int)env->info.compute_units;
  print_message("[ DECODE   ] batch 1, 8 kv heads, 128K keys, %d CUs: %d splits, workspace %zu bytes\n", cus, splits, ws);
  /* AUTO: at least 2 work-groups per compute unit (the NVIDIA cp.async path's
   * choice); the portable kernel plans 4. */
  FCT_CHECK(8 * splits >= (2 * cus < 8 ? 8 : 2 * cus) || splits == FLASHCL_DECODE_MAX_SPLITS,
            "%d splits x 8 kv heads do not fill %d compute units", splits, cus);
  FCT_CHECK(ws == (size_t)splits * 32 * (128 + 1) * 4 || (splits == 1 && ws == 0), "workspace %zu", ws);
  desc.kernel = FLASHCL_KERNEL_PORTABLE;
  st = flashcl_attention_decode_workspace_size(env->ctx, &desc, &q.t, &kc.t, &vc.t, &ws, &splits);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "workspace query (portable)");
  FCT_CHECK(8 * splits >= (4 * cus < 8 ? 8 : 4 * cus) || splits == FLASHCL_DECODE_MAX_SPLITS,
            "portable: %d splits x 8 kv heads do not fill %d compute units at 4 work-groups each", splits, cus);
  FCT_CHECK(ws == (size_t)splits * 32 * (128 + 1) * 4 || (splits == 1 && ws == 0), "workspace %zu", ws);
  desc.kernel = FLASHCL_KERNEL_AUTO;
  /* A short max_seqlen_k hint caps the splits at one per 256 keys (portable)
   * or 64 (the NVIDIA tensor-core kernel). */
  desc.split.max_seqlen_k = 300;
  st = flashcl_attention_decode_workspace_size(env->ctx, &desc, &q.t, &kc.t, &vc.t, &ws, &splits);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "workspace query");
  FCT_CHECK(splits <= 5, "%d splits for 300 keys", splits);
  desc.kernel = FLASHCL_KERNEL_PORTABLE;
  st = flashcl_attention_decode_workspace_size(env->ctx, &desc, &q.t, &kc.t, &vc.t, &ws, &splits);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "workspace query (portable)");
  FCT_CHECK(splits <= 2, "portable: %d splits for 300 keys", splits);
  clReleaseMemObject(bt);
  fct_tensor_release(&q);
  fct_tensor_release(&kc);
  fct_tensor_release(&vc);
}

/* ------------------------------------- decode: the context's cached scratch -- */

/* One contiguous-cache f32 problem, set up on the host and device with its
 * reference, launched later (possibly with others in flight). */
typedef struct scr_prob {
  dec_case c;
  int32_t lens[8];
  fct_tensor q, o, lse;
  dec_cache cc;
  dec_data dd;
  cl_mem seqlens;
  double *ref_o, *ref_lse;
} scr_prob;

static void scr_setup(scr_prob *p, const char *name, int B, int T, int Hq, int Hkv, int d, int L, int splits) {
  fct_rng rng;
  char tag[128];
  memset(p, 0, sizeof *p);
  snprintf(tag, sizeof tag, "decode/scratch/%s", name);
  fct_rng_init(&rng, tag);
  for (int b = 0; b < B; b++) p->lens[b] = L - 37 * b;
  p->c = (dec_case){name, FLASHCL_F32, B, T, Hq, Hkv, d, p->lens, 0, splits, 0, 0, 0};
  contiguous_tensor(&p->q, FLASHCL_F32, B, T, Hq, d);
  contiguous_tensor(&p->o, FLASHCL_F32, B, T, Hq, d);
  lse_bnh(&p->lse, B, T, Hq);
  fct_tensor_fill_random(&p->q, &rng);
  fct_tensor_poison(&p->o);
  fct_tensor_poison(&p->lse);
  size_t total = 0;
  p->dd.off = malloc(sizeof(size_t) * (size_t)B);
  for (int b = 0; b < B; b++) {
    p->dd.off[b] = total;
    total += (size_t)p->lens[b];
  }
  p->dd.k = malloc(sizeof(float) * total * Hkv * d);
  p->dd.v = malloc(sizeof(float) * total * Hkv * d);
  for (size_t i = 0; i < total * Hkv * d; i++) {
    p->dd.k[i] = rand_value(FLASHCL_F32, &rng);
    p->dd.v[i] = rand_value(FLASHCL_F32, &rng);
  }
  cache_create(&p->cc, &p->c, &rng);
  for (int b = 0; b < B; b++)
    for (int j = 0; j < p->lens[b]; j++)
      for (int h = 0; h < Hkv; h++)
        for (int x = 0; x < d; x++) {
          const size_t src = (p->dd.off[b] + j) * (size_t)Hkv * d + (size_t)h * d + x;
          const size_t dst = cache_index(&p->cc, &p->cc.k, &p->c, b, j, h, x);
          fct_store(FLASHCL_F32, p->cc.k.host, dst, p->dd.k[src]);
          fct_store(FLASHCL_F32, p->cc.v.host, dst, p->dd.v[src]);
        }
  upload(&p->cc.k);
  upload(&p->cc.v);
  p->seqlens = int_buffer(p->lens, (size_t)B);
  p->ref_o = malloc(sizeof(double) * (size_t)B * T * Hq * d);
  p->ref_lse = malloc(sizeof(double) * (size_t)B * T * Hq);
  ref_decode(&p->c, &p->q, &p->dd, p->ref_o, p->ref_lse);
}

/* Enqueues the decode without a workspace (no wait, no event). */
static void scr_launch(flashcl_context *ctx, scr_prob *p, size_t *ws) {
  flashcl_decode_desc desc;
  decode_desc(&p->c, &p->cc, &desc);
  int splits = 0;
  flashcl_status st = flashcl_attention_decode_workspace_size(ctx, &desc, &p->q.t, &p->cc.k.t, &p->cc.v.t, ws, &splits);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: workspace size", p->c.name);
  FCT_CHECK(splits == p->c.num_splits, "%s: %d splits", p->c.name, splits);
  st = flashcl_attention_decode(ctx, &desc, &p->q.t, &p->cc.k.t, &p->cc.v.t, p->seqlens, &p->o.t, &p->lse.t, 0, NULL,
                                NULL);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: flashcl_attention_decode", p->c.name);
}

/* After the queue has finished: downloads and compares against the reference. */
static void scr_check(scr_prob *p, const char *label) {
  const dec_case *c = &p->c;
  fct_tensor_download(&p->o);
  fct_tensor_download(&p->lse);
  l2acc eo = {0}, el = {0};
  for (int b = 0; b < c->batch; b++)
    for (int t = 0; t < c->q_len; t++)
      for (int h = 0; h < c->heads_q; h++) {
        const size_t r = ((size_t)b * c->q_len + t) * c->heads_q + h;
        for (int x = 0; x < c->head_dim; x++) l2_add(&eo, fct_tensor_get(&p->o, b, t, h, x), p->ref_o[r * c->head_dim + x]);
        lse_add(&el, fct_tensor_get(&p->lse, b, t, h, 0), p->ref_lse[r]);
      }
  print_message("[ DECODE   ] scratch %-9s %-4s B=%d q_len=%d %d:%d d=%d splits=%d: relL2 O %.2e LSE %.2e\n", label,
                c->name, c->batch, c->q_len, c->heads_q, c->heads_kv, c->head_dim, c->num_splits, l2_rel(&eo),
                l2_rel(&el));
  FCT_CHECK(eo.nonfinite == 0 && el.nonfinite == 0 && el.bad_empty == 0, "%s %s: %zu/%zu non-finite O/LSE values",
            label, c->name, eo.nonfinite, el.nonfinite);
  FCT_CHECK(l2_rel(&eo) <= fct_tolerance(FLASHCL_F32), "%s %s: O relL2 %.3e", label, c->name, l2_rel(&eo));
  FCT_CHECK(l2_rel(&el) <= fct_lse_tolerance(FLASHCL_F32), "%s %s: LSE relL2 %.3e", label, c->name, l2_rel(&el));
}

static void scr_release(scr_prob *p) {
  free(p->ref_o);
  free(p->ref_lse);
  clReleaseMemObject(p->seqlens);
  cache_release(&p->cc);
  free(p->dd.k);
  free(p->dd.v);
  free(p->dd.off);
  fct_tensor_release(&p->q);
  fct_tensor_release(&p->o);
  fct_tensor_release(&p->lse);
}

/* Decodes without desc.split.workspace on a fresh context over `queue`: a small
 * problem alone (first allocation), then, with no host wait in between, a larger
 * one (the scratch grows), a smaller one of another head_dim and the first again
 * (both on the grown scratch). Every result must match the reference, which on an
 * out-of-order queue needs each call to wait for the previous one's merge. */
static void scr_run(cl_command_queue queue, const char *label) {
  fct_env *env = fct_env_get();
  flashcl_context *ctx = NULL;
  flashcl_status st = flashcl_context_create_from_cl(env->cl_ctx, env->device, queue, NULL, &ctx);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: flashcl_context_create_from_cl", label);
  scr_prob a, b, c;
  scr_setup(&a, "A", 2, 1, 8, 2, 64, 300, 3);    /* 12,480-byte scratch */
  scr_setup(&b, "B", 4, 2, 32, 8, 64, 700, 16);  /* 1,064,960 bytes: grows */
  scr_setup(&c, "C", 3, 1, 8, 2, 128, 500, 5);   /* 61,920 bytes */
  size_t wa = 0, wb = 0, wc = 0;
  scr_launch(ctx, &a, &wa);
  FCT_CHECK(clFinish(queue) == CL_SUCCESS, "%s: clFinish", label);
  scr_check(&a, label);
  fct_tensor_poison(&a.o);
  fct_tensor_poison(&a.lse);
  scr_launch(ctx, &b, &wb);
  scr_launch(ctx, &c, &wc);
  scr_launch(ctx, &a, &wa);
  FCT_CHECK(wb > 64 * 1024 && wb > wa && wb > wc, "%s: workspaces %zu %zu %zu do not make the scratch grow", label,
            wa, wb, wc);
  FCT_CHECK(clFinish(queue) == CL_SUCCESS, "%s: clFinish", label);
  scr_check(&b, label);
  scr_check(&c, label);
  scr_check(&a, label);
  /* A caller's workspace bypasses the scratch; the cached one still works after. */
  fct_tensor_poison(&c.o);
  fct_tensor_poison(&c.lse);
  cl_mem wbuf = fct_create_buffer(wc, NULL);
  flashcl_decode_desc desc;
  decode_desc(&c.c, &c.cc, &desc);
  desc.split.workspace = wbuf;
  st = flashcl_attention_decode(ctx, &desc, &c.q.t, &c.cc.k.t, &c.cc.v.t, c.seqlens, &c.o.t, &c.lse.t, 0, NULL, NULL);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: decode with a workspace", label);
  fct_tensor_poison(&b.o);
  fct_tensor_poison(&b.lse);
  scr_launch(ctx, &b, &wb);
  FCT_CHECK(clFinish(queue) == CL_SUCCESS, "%s: clFinish", label);
  scr_check(&c, label);
  scr_check(&b, label);
  clReleaseMemObject(wbuf);
  scr_release(&a);
  scr_release(&b);
  scr_release(&c);
  flashcl_context_destroy(ctx);
}

static void test_decode_cached_scratch(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  scr_run(env->queue, "in-order");
  cl_command_queue_properties dq = 0;
  clGetDeviceInfo(env->device, CL_DEVICE_QUEUE_PROPERTIES, sizeof dq, &dq, NULL);
  if (!(dq & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
    print_message("[ DECODE   ] scratch: the device has no out-of-order queues; skipped that part\n");
    return;
  }
  cl_int err = CL_SUCCESS;
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  cl_command_queue ooo = clCreateCommandQueue(env->cl_ctx, env->device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
  FCT_CHECK(err == CL_SUCCESS && ooo, "clCreateCommandQueue(out-of-order): %d", (int)err);
  scr_run(ooo, "ooo");
  clReleaseCommandQueue(ooo);
}

/* ----------------------------------------------------------------- merge -- */

/* Double reference of a merge: rows of (o, lse) pairs. */
static void ref_merge(int d, double la, const double *oa, double lb, const double *ob, double *lo, double *o) {
  const double m = la > lb ? la : lb;
  if (isinf(m) && m < 0) {
    *lo = -INFINITY;
    for (int x = 0; x < d; x++) o[x] = 0;
    return;
  }
  const double wa = exp(la - m), wb = exp(lb - m);
  *lo = m + log(wa + wb);
  for (int x = 0; x < d; x++) o[x] = ((wa > 0 ? wa * oa[x] : 0) + (wb > 0 ? wb * ob[x] : 0)) / (wa + wb);
}

/* Splitting the keys at s and merging the two forward results equals the full
 * attention. s = 0 and s = N leave one side empty: that side is (NaN, -inf). */
static void test_merge_split_ranges(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  const int B = 2, Nq = 5, N = 77, H = 4, Hkv = 2, d = 64;
  const int cuts[] = {0, 1, 37, 76, 77};
  fct_rng rng;
  fct_rng_init(&rng, "merge/split");
  fct_tensor q, k, v, oa, ob, la, lb, o, l;
  contiguous_tensor(&q, FLASHCL_F32, B, Nq, H, d);
  contiguous_tensor(&k, FLASHCL_F32, B, N, Hkv, d);
  contiguous_tensor(&v, FLASHCL_F32, B, N, Hkv, d);
  fct_tensor_fill_random(&q, &rng);
  fct_tensor_fill_random(&k, &rng);
  fct_tensor_fill_random(&v, &rng);
  fct_tensor_create(&oa, FLASHCL_F32, FCT_BNHD, B, Nq, H, d, 0);
  fct_tensor_create(&ob, FLASHCL_F32, FCT_BNHD, B, Nq, H, d, 0);
  fct_tensor_create(&o, FLASHCL_F32, FCT_PADDED, B, Nq, H, d, 1);
  fct_tensor_create_lse(&la, FCT_BNHD, B, Nq, H, 0);
  fct_tensor_create_lse(&lb, FCT_BNHD, B, Nq, H, 0);
  fct_tensor_create_lse(&l, FCT_PADDED, B, Nq, H, 2);

  /* Full reference (non-causal). */
  double *ro = malloc(sizeof(double) * B * Nq * H * d), *rl = malloc(sizeof(double) * B * Nq * H);
  for (int b = 0; b < B; b++)
    for (int i = 0; i < Nq; i++)
      for (int h = 0; h < H; h++) {
        double s[77], m = -INFINITY, sum = 0;
        double *orow = ro + (((size_t)b * Nq + i) * H + h) * d;
        for (int j = 0; j < N; j++) {
          double a = 0;
          for (int x = 0; x < d; x++) a += fct_tensor_get(&q, b, i, h, x) * fct_tensor_get(&k, b, j, h / 2, x);
          s[j] = a / 8.0;
          if (s[j] > m) m = s[j];
        }
        for (int x = 0; x < d; x++) orow[x] = 0;
        for (int j = 0; j < N; j++) {
          double p = exp(s[j] - m);
          sum += p;
          for (int x = 0; x < d; x++) orow[x] += p * fct_tensor_get(&v, b, j, h / 2, x);
        }
        for (int x = 0; x < d; x++) orow[x] /= sum;
        rl[((size_t)b * Nq + i) * H + h] = m + log(sum);
      }

  flashcl_attention_desc ad;
  flashcl_attention_desc_init(&ad);
  for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
    const int cut = cuts[ci];
    fct_tensor *side_o[2] = {&oa, &ob}, *side_l[2] = {&la, &lb};
    for (int sdx = 0; sdx < 2; sdx++) {
      const int j0 = sdx ? cut : 0, n = sdx ? N - cut : cut;
      fct_tensor_poison(side_o[sdx]);
      fct_tensor_poison(side_l[sdx]);
      if (n == 0) { /* empty side: LSE -inf, O stays NaN */
        for (int i = 0; i < B * Nq * H; i++) ((float *)side_l[sdx]->host)[i] = -INFINITY;
        upload(side_l[sdx]);
        continue;
      }
      flashcl_tensor ks = k.t, vs = v.t;
      ks.offset += (size_t)j0 * k.t.stride[1] * 4;
      vs.offset += (size_t)j0 * v.t.stride[1] * 4;
      ks.shape[1] = vs.shape[1] = n;
      flashcl_status st =
          flashcl_attention_forward(env->ctx, &ad, &q.t, &ks, &vs, &side_o[sdx]->t, &side_l[sdx]->t, 0, NULL, NULL);
      FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "forward on keys [%d, %d)", j0, j0 + n);
    }
    /* Out of place into padded views, then in place into side a. */
    for (int inplace = 0; inplace < 2; inplace++) {
      fct_tensor *to = inplace ? &oa : &o, *tl = inplace ? &la : &l;
      if (!inplace) {
        fct_tensor_poison(&o);
        fct_tensor_poison(&l);
      }
      flashcl_status st = flashcl_merge_states(env->ctx, &oa.t, &la.t, &ob.t, &lb.t, &to->t, &tl->t, 0, NULL, NULL);
      FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "merge at cut %d", cut);
      fct_finish();
      fct_tensor_download(to);
      fct_tensor_download(tl);
      l2acc eo = {0}, el = {0};
      for (int b = 0; b < B; b++)
        for (int i = 0; i < Nq; i++)
          for (int h = 0; h < H; h++) {
            for (int x = 0; x < d; x++)
              l2_add(&eo, fct_tensor_get(to, b, i, h, x), ro[(((size_t)b * Nq + i) * H + h) * d + x]);
            lse_add(&el, fct_tensor_get(tl, b, i, h, 0), rl[((size_t)b * Nq + i) * H + h]);
          }
      FCT_CHECK(eo.nonfinite == 0 && el.nonfinite == 0 && el.bad_empty == 0, "cut %d: non-finite output", cut);
      FCT_CHECK(l2_rel(&eo) <= 1e-5 && l2_rel(&el) <= 1e-5, "cut %d%s: relL2 O %.3e LSE %.3e", cut,
                inplace ? " (in place)" : "", l2_rel(&eo), l2_rel(&el));
      if (!inplace)
        FCT_CHECK(fct_tensor_count_unpoisoned(&o) == (size_t)B * Nq * H * d &&
                      fct_tensor_count_unpoisoned(&l) == (size_t)B * Nq * H,
                  "cut %d: merge wrote outside its views", cut);
    }
  }
  free(ro);
  free(rl);
  fct_tensor *all[] = {&q, &k, &v, &oa, &ob, &la, &lb, &o, &l};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fct_tensor_release(all[i]);
}

/* Random partial states with some -inf rows: merge((a, b), c) and merge(a, (b, c))
 * both match the three-way reference; fully empty sides pass the other side through
 * bit-exactly; both empty gives O = 0, LSE = -inf. */
#define MERGE_MAX_D 512
static void run_merge_assoc(flashcl_dtype dt, int d) {
  fct_env *env = fct_env_get();
  const int B = 2, N = 9, H = 3, R = B * N * H;
  fct_rng rng;
  char tag[64];
  snprintf(tag, sizeof tag, "merge/assoc/%s/%d", fct_dtype_str(dt), d);
  fct_rng_init(&rng, tag);
  fct_tensor os[3], ls[3], t1, t1l, out, outl;
  for (int i = 0; i < 3; i++) {
    contiguous_tensor(&os[i], dt, B, N, H, d);
    lse_bnh(&ls[i], B, N, H);
    fct_tensor_fill_random(&os[i], &rng);
    for (int r = 0; r < R; r++) {
      /* Row pattern r % 8: bit i set -> side i is empty. Row 7: all three empty. */
      const int empty = (r % 8) >> i & 1;
      ((float *)ls[i].host)[r] = empty ? -INFINITY : (float)(5.0 * fct_rng_normal(&rng));
      if (empty)
        for (int x = 0; x < d; x++) fct_store_poison(dt, os[i].host, (size_t)r * d + x); /* must not be read */
    }
    upload(&os[i]);
    upload(&ls[i]);
  }
  contiguous_tensor(&t1, dt, B, N, H, d);
  contiguous_tensor(&out, dt, B, N, H, d);
  lse_bnh(&t1l, B, N, H);
  lse_bnh(&outl, B, N, H);

  /* Reference: the three-way merge. */
  double *ro = malloc(sizeof(double) * R * d), *rl = malloc(sizeof(double) * R);
  for (int r = 0; r < R; r++) {
    double o3[3][MERGE_MAX_D], l3[3], tmp[MERGE_MAX_D], tl;
    for (int i = 0; i < 3; i++) {
      l3[i] = ((float *)ls[i].host)[r];
      for (int x = 0; x < d; x++) o3[i][x] = isinf(l3[i]) ? 0 : fct_load(dt, os[i].host, (size_t)r * d + x);
    }
    ref_merge(d, l3[0], o3[0], l3[1], o3[1], &tl, tmp);
    ref_merge(d, tl, tmp, l3[2], o3[2], &rl[r], ro + (size_t)r * d);
  }

  for (int order = 0; order < 2; order++) {
    flashcl_status st;
    fct_tensor_poison(&t1);
    fct_tensor_poison(&t1l);
    fct_tensor_poison(&out);
    fct_tensor_poison(&outl);
    if (order == 0) { /* (a + b) + c */
      st = flashcl_merge_states(env->ctx, &os[0].t, &ls[0].t, &os[1].t, &ls[1].t, &t1.t, &t1l.t, 0, NULL, NULL);
      if (!st) st = flashcl_merge_states(env->ctx, &t1.t, &t1l.t, &os[2].t, &ls[2].t, &out.t, &outl.t, 0, NULL, NULL);
    } else { /* a + (b + c), the inner one in place on b's copy t1 */
      cl_int err = clEnqueueCopyBuffer(env->queue, os[1].t.buffer, t1.t.buffer, 0, 0, t1.bytes, 0, NULL, NULL);
      err |= clEnqueueCopyBuffer(env->queue, ls[1].t.buffer, t1l.t.buffer, 0, 0, t1l.bytes, 0, NULL, NULL);
      FCT_CHECK(err == CL_SUCCESS, "copy");
      st = flashcl_merge_states(env->ctx, &t1.t, &t1l.t, &os[2].t, &ls[2].t, &t1.t, &t1l.t, 0, NULL, NULL);
      if (!st) st = flashcl_merge_states(env->ctx, &os[0].t, &ls[0].t, &t1.t, &t1l.t, &out.t, &outl.t, 0, NULL, NULL);
    }
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "merge order %d", order);
    fct_finish();
    fct_tensor_download(&out);
    fct_tensor_download(&outl);
    l2acc eo = {0}, el = {0};
    for (int r = 0; r < R; r++) {
      const int pat = r % 8;
      for (int x = 0; x < d; x++) l2_add(&eo, fct_load(dt, out.host, (size_t)r * d + x), ro[(size_t)r * d + x]);
      const float got_l = ((float *)outl.host)[r];
      lse_add(&el, got_l, rl[r]);
      if (pat == 7) {
        for (int x = 0; x < d; x++)
          FCT_CHECK(fct_load(dt, out.host, (size_t)r * d + x) == 0.0, "row %d: all sides empty, O must be 0", r);
      }
      /* Exactly one side non-empty: the result is that side, bit for bit. */
      const int only = pat == 6 ? 0 : pat == 5 ? 1 : pat == 3 ? 2 : -1;
      if (only >= 0) {
        FCT_CHECK(got_l == ((float *)ls[only].host)[r], "row %d: LSE %.9g, want side %d's %.9g", r, got_l, only,
                  ((float *)ls[only].host)[r]);
        for (int x = 0; x < d; x++)
          FCT_CHECK(fct_load(dt, out.host, (size_t)r * d + x) == fct_load(dt, os[only].host, (size_t)r * d + x),
                    "row %d x %d: O must equal side %d", r, x, only);
      }
    }
    FCT_CHECK(eo.nonfinite == 0 && el.nonfinite == 0 && el.bad_empty == 0, "%s order %d: non-finite or bad empty",
              fct_dtype_str(dt), order);
    /* Two roundings to the storage dtype still sit well inside the dtype's tolerance. */
    FCT_CHECK(l2_rel(&eo) <= fct_tolerance(dt) && l2_rel(&el) <= 1e-6, "%s order %d: relL2 O %.3e LSE %.3e",
              fct_dtype_str(dt), order, l2_rel(&eo), l2_rel(&el));
  }
  free(ro);
  free(rl);
  for (int i = 0; i < 3; i++) {
    fct_tensor_release(&os[i]);
    fct_tensor_release(&ls[i]);
  }
  fct_tensor_release(&t1);
  fct_tensor_release(&t1l);
  fct_tensor_release(&out);
  fct_tensor_release(&outl);
}

static void test_merge_assoc_f32(void **state) { (void)state; run_merge_assoc(FLASHCL_F32, 32); }
static void test_merge_assoc_f16(void **state) { (void)state; run_merge_assoc(FLASHCL_F16, 32); }
static void test_merge_assoc_bf16(void **state) { (void)state; run_merge_assoc(FLASHCL_BF16, 32); }
/* MLA's value head dim (512): the merge of its decode partials. */
static void test_merge_assoc_f16_d512(void **state) { (void)state; run_merge_assoc(FLASHCL_F16, 512); }

/* ---------------------------------------------------------------- errors -- */

/* A valid small decode problem whose outputs must stay poisoned after failures. */
typedef struct err_fx {
  fct_tensor q, o, lse, kc, vc, kp, vp, kn, vn;
  cl_mem lens, bt, small;
} err_fx;

static void err_fx_make(err_fx *f) {
  fct_rng rng;
  fct_rng_init(&rng, "decode/errors");
  contiguous_tensor(&f->q, FLASHCL_F32, 2, 2, 4, 64);
  contiguous_tensor(&f->o, FLASHCL_F32, 2, 2, 4, 64);
  fct_tensor_create_lse(&f->lse, FCT_BNHD, 2, 2, 4, 0);
  contiguous_tensor(&f->kc, FLASHCL_F32, 2, 32, 2, 64);
  contiguous_tensor(&f->vc, FLASHCL_F32, 2, 32, 2, 64);
  contiguous_tensor(&f->kp, FLASHCL_F32, 4, 16, 2, 64);
  contiguous_tensor(&f->vp, FLASHCL_F32, 4, 16, 2, 64);
  contiguous_tensor(&f->kn, FLASHCL_F32, 2, 2, 2, 64);
  contiguous_tensor(&f->vn, FLASHCL_F32, 2, 2, 2, 64);
  fct_tensor *in[] = {&f->q, &f->kc, &f->vc, &f->kp, &f->vp, &f->kn, &f->vn};
  for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) fct_tensor_fill_random(in[i], &rng);
  int32_t lens[2] = {20, 30}, bt[4] = {0, 1, 2, 3};
  f->lens = int_buffer(lens, 2);
  f->bt = int_buffer(bt, 4);
  f->small = fct_create_buffer(4, NULL);
}

static void err_fx_release(err_fx *f) {
  fct_tensor *all[] = {&f->q, &f->o, &f->lse, &f->kc, &f->vc, &f->kp, &f->vp, &f->kn, &f->vn};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fct_tensor_release(all[i]);
  clReleaseMemObject(f->lens);
  clReleaseMemObject(f->bt);
  clReleaseMemObject(f->small);
}

static void expect_untouched(fct_tensor *t, const char *what) {
  fct_tensor_download(t);
  FCT_CHECK(fct_tensor_count_unpoisoned(t) == 0, "%s: a failed call wrote to its output", what);
}

static void test_errors(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  flashcl_context *ctx = env->ctx;
  err_fx f;
  err_fx_make(&f);
  flashcl_decode_desc d0, d;
  flashcl_decode_desc_init(&d0);
  flashcl_tensor t;
  flashcl_status st;

#define DEC(desc, q, kc, vc, lens, o, lse) flashcl_attention_decode(ctx, desc, q, kc, vc, lens, o, lse, 0, NULL, NULL)
#define EXPECT(call, status, what)                   \
  do {                                               \
    st = (call);                                     \
    FCT_CHECK_STATUS(st, status, "%s", what);        \
    fct_finish();                                    \
    expect_untouched(&f.o, what);                    \
    expect_untouched(&f.lse, what);                  \
  } while (0)

  /* Sanity: the fixture is valid. */
  d = d0;
  d.split.num_splits = 2;
  st = DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "valid fixture");
  fct_finish();
  fct_tensor_poison(&f.o);
  fct_tensor_poison(&f.lse);

  EXPECT(DEC(NULL, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "desc NULL");
  /* desc.struct_size (found by test_fuzz): decode, its workspace query and its
   * config refuse a tiny or a too large size, as kv_cache_append does. */
  {
    static const size_t bad_sizes[] = {1, 7, sizeof(flashcl_decode_desc) + 1};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
      size_t ws = 0;
      flashcl_config cfg;
      d = d0;
      d.struct_size = bad_sizes[i];
      st = DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t);
      FCT_CHECK(st == FLASHCL_ERROR_INVALID_ARGUMENT || st == FLASHCL_ERROR_UNSUPPORTED,
                "decode accepted struct_size %zu (status %d)", bad_sizes[i], st);
      fct_finish();
      expect_untouched(&f.o, "struct_size");
      expect_untouched(&f.lse, "struct_size");
      FCT_CHECK(flashcl_attention_decode_workspace_size(ctx, &d, &f.q.t, &f.kc.t, &f.vc.t, &ws, NULL) < 0,
                "decode_workspace_size accepted struct_size %zu", bad_sizes[i]);
      FCT_CHECK(flashcl_decode_config(ctx, &d, &f.q.t, &f.kc.t, &f.vc.t, &cfg) < 0,
                "decode_config accepted struct_size %zu", bad_sizes[i]);
    }
    d = d0;
    d.struct_size = 0; /* a struct zeroed by hand: this header's size */
    d.score.window_left = d.score.window_right = -1;
    st = DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "struct_size 0");
    fct_finish();
    fct_tensor_poison(&f.o);
    fct_tensor_poison(&f.lse);
  }
  d = d0;
  d.kernel = (flashcl_kernel_family)7;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT,
         "desc.kernel out of range");
  {
    /* v_cache's head dim (views of the fixture's buffers with fewer columns,
     * every range in bounds): o must take it, and it may not exceed q's. */
    flashcl_tensor vh = f.vc.t, qh = f.q.t, kh = f.kc.t;
    vh.shape[3] /= 2;
    EXPECT(DEC(&d0, &f.q.t, &f.kc.t, &vh, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE,
           "o with q's head dim, v_cache's half of it");
    qh.shape[3] /= 2;
    kh.shape[3] /= 2;
    EXPECT(DEC(&d0, &qh, &kh, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE,
           "v_cache's head dim above q's");
  }
  FCT_CHECK(d0.score.window_left == -1 && d0.score.window_right == -1 && d0.score.softcap == 0.0f && d0.score.alibi_slopes == NULL,
            "flashcl_decode_desc_init: the score variants must default to off");
  d = d0;
  d.score.window_left = -2;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT,
         "window_left -2");
  d = d0;
  d.score.window_right = -5;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT,
         "window_right -5");
  d = d0;
  d.score.softcap = -1.0f;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "softcap -1");
  d.score.softcap = NAN;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "softcap NaN");
  d.score.softcap = INFINITY;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "softcap inf");
  d = d0;
  d.score.alibi_slopes = f.small; /* fewer bytes than heads_q floats */
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_BUFFER_TOO_SMALL,
         "alibi_slopes too small");
  EXPECT(DEC(&d0, &f.q.t, &f.kc.t, &f.vc.t, NULL, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "seqlens NULL");
  EXPECT(DEC(&d0, &f.q.t, &f.kc.t, &f.vc.t, f.small, &f.o.t, &f.lse.t), FLASHCL_ERROR_BUFFER_TOO_SMALL,
         "seqlens too small");
  EXPECT(DEC(&d0, &f.q.t, &f.kc.t, &f.vc.t, f.lens, NULL, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "o NULL");
  /* q_len > 16 */
  {
    fct_tensor qb, ob;
    contiguous_tensor(&qb, FLASHCL_F32, 2, 17, 4, 64);
    contiguous_tensor(&ob, FLASHCL_F32, 2, 17, 4, 64);
    st = DEC(&d0, &qb.t, &f.kc.t, &f.vc.t, f.lens, &ob.t, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_SHAPE, "q_len 17");
    fct_finish();
    expect_untouched(&ob, "q_len 17");
    fct_tensor_release(&qb);
    fct_tensor_release(&ob);
  }
  t = f.o.t;
  t.shape[2] = 2;
  EXPECT(DEC(&d0, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE, "o shape");
  t = f.lse.t;
  t.shape[1] = 1;
  EXPECT(DEC(&d0, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &t), FLASHCL_ERROR_INVALID_SHAPE, "lse shape");
  t = f.kc.t;
  t.shape[0] = 1;
  EXPECT(DEC(&d0, &f.q.t, &t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE, "k/v shapes differ");
  {
    flashcl_tensor k1 = f.kc.t, v1 = f.vc.t;
    k1.shape[0] = v1.shape[0] = 1;
    EXPECT(DEC(&d0, &f.q.t, &k1, &v1, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE, "cache batch");
    k1 = f.kc.t, v1 = f.vc.t;
    k1.shape[2] = v1.shape[2] = 3;
    k1.stride[1] = v1.stride[1] = 3 * 64;
    k1.stride[0] = v1.stride[0] = 32 * 3 * 64;
    EXPECT(DEC(&d0, &f.q.t, &k1, &v1, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_BUFFER_TOO_SMALL, "cache too small");
    k1.shape[1] = v1.shape[1] = 16;
    k1.stride[0] = v1.stride[0] = 16 * 3 * 64;
    EXPECT(DEC(&d0, &f.q.t, &k1, &v1, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE, "heads_q % heads_kv");
  }
  t = f.o.t;
  t.dtype = FLASHCL_F16;
  EXPECT(DEC(&d0, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &t, &f.lse.t), FLASHCL_ERROR_DTYPE_MISMATCH, "o dtype");
  d = d0;
  d.heads_q = 8;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE, "heads_q mismatch");
  d = d0;
  d.split.num_splits = FLASHCL_DECODE_MAX_SPLITS + 1;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "num_splits");
  d = d0;
  d.score.scale = NAN;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "scale NaN");
  d = d0;
  d.cache.page_size = 16; /* without a block table */
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT,
         "page_size without block_table");
  /* Paged. */
  d = d0;
  d.cache.block_table = f.bt;
  d.cache.max_pages = 2;
  d.cache.page_size = 0;
  EXPECT(DEC(&d, &f.q.t, &f.kp.t, &f.vp.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "page_size 0");
  d.cache.page_size = 32;
  EXPECT(DEC(&d, &f.q.t, &f.kp.t, &f.vp.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE,
         "page_size != pool shape");
  d.cache.page_size = 16;
  d.cache.max_pages = 0;
  EXPECT(DEC(&d, &f.q.t, &f.kp.t, &f.vp.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "max_pages 0");
  d.cache.max_pages = 3; /* 2 x 3 entries > 4 */
  EXPECT(DEC(&d, &f.q.t, &f.kp.t, &f.vp.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_BUFFER_TOO_SMALL,
         "block table too small");
  d.cache.max_pages = 2;
  st = DEC(&d, &f.q.t, &f.kp.t, &f.vp.t, f.lens, &f.o.t, &f.lse.t);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "valid paged fixture");
  fct_finish();
  fct_tensor_poison(&f.o);
  fct_tensor_poison(&f.lse);
  /* Workspace. */
  d = d0;
  d.split.num_splits = 3;
  size_t ws = 0;
  st = flashcl_attention_decode_workspace_size(ctx, &d, &f.q.t, &f.kc.t, &f.vc.t, &ws, NULL);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "workspace size");
  FCT_CHECK(ws == (size_t)2 * 2 * 4 * 3 * 65 * 4, "workspace %zu", ws);
  cl_mem wb = fct_create_buffer(ws, NULL);
  d.split.workspace = wb;
  d.split.workspace_offset = 4;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_BUFFER_TOO_SMALL,
         "workspace too small");
  d.split.workspace_offset = 2;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT,
         "workspace offset misaligned");
  clReleaseMemObject(wb);
  {
    /* One buffer holding q and, after it, room for the partials (an arena): a
     * workspace that starts inside q's bytes would overwrite q, so it is refused
     * and q stays as it was; one that starts after them is fine. */
    const int64_t shape[4] = {2, 2, 4, 64}, stride[4] = {2 * 4 * 64, 4 * 64, 64, 1};
    const size_t qbytes = (size_t)2 * 2 * 4 * 64 * 4;
    fct_tensor arena;
    fct_rng rng;
    fct_rng_init(&rng, "decode/errors/arena");
    fct_tensor_create_custom(&arena, FLASHCL_F32, qbytes + ws, 0, shape, stride);
    fct_tensor_fill_random(&arena, &rng);
    fct_tensor_download(&arena);
    unsigned char *a0 = malloc(qbytes);
    FCT_CHECK(a0 != NULL, "malloc failed");
    memcpy(a0, arena.host, qbytes);
    d.split.workspace = arena.t.buffer;
    d.split.workspace_offset = qbytes - 256;
    EXPECT(DEC(&d, &arena.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT,
           "workspace overlapping q");
    fct_tensor_download(&arena);
    FCT_CHECK(memcmp(arena.host, a0, qbytes) == 0, "workspace overlapping q: q changed");
    d.split.workspace_offset = qbytes;
    st = DEC(&d, &arena.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "workspace after q in one buffer");
    fct_finish();
    fct_tensor_download(&arena);
    FCT_CHECK(memcmp(arena.host, a0, qbytes) == 0, "workspace after q: q changed");
    fct_tensor_poison(&f.o);
    fct_tensor_poison(&f.lse);
    free(a0);
    fct_tensor_release(&arena);
  }
  /* seqlens_k inside o's buffer: o would overwrite the lengths being read. */
  {
    const int32_t lens[2] = {20, 30};
    fct_tensor_poison(&f.o);
    cl_int err = clEnqueueWriteBuffer(env->queue, f.o.t.buffer, CL_TRUE, 0, sizeof lens, lens, 0, NULL, NULL);
    FCT_CHECK(err == CL_SUCCESS, "writing the lengths into o's buffer: %d", (int)err);
    st = DEC(&d0, &f.q.t, &f.kc.t, &f.vc.t, f.o.t.buffer, &f.o.t, &f.lse.t);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_ARGUMENT, "seqlens_k inside o");
    fct_finish();
    int32_t back[2] = {0, 0};
    err = clEnqueueReadBuffer(env->queue, f.o.t.buffer, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL);
    FCT_CHECK(err == CL_SUCCESS && back[0] == 20 && back[1] == 30, "seqlens_k inside o: o's buffer changed");
    fct_tensor_poison(&f.o);
  }
  /* A tree mask of 4 bytes where batch 2 x q_len 2 words (16 bytes) are needed. */
  d = d0;
  d.tree_mask = f.small;
  EXPECT(DEC(&d, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &f.lse.t), FLASHCL_ERROR_BUFFER_TOO_SMALL,
         "tree mask too small");
  st = flashcl_attention_decode_workspace_size(ctx, &d, &f.q.t, &f.kc.t, &f.vc.t, &ws, NULL);
  FCT_CHECK_STATUS(st, FLASHCL_ERROR_BUFFER_TOO_SMALL, "workspace size with a tree mask too small");
  /* Overlapping outputs. */
  t = f.lse.t; /* an lse view inside o's buffer */
  t.buffer = f.o.t.buffer;
  EXPECT(DEC(&d0, &f.q.t, &f.kc.t, &f.vc.t, f.lens, &f.o.t, &t), FLASHCL_ERROR_INVALID_ARGUMENT, "lse overlaps o");
  /* Append. */
  {
    fct_tensor_poison(&f.kp);
    fct_tensor_poison(&f.vp);
    /* The contiguous caches hold random keys: snapshot them, and every failed
     * append into them must leave them bit-for-bit as they were. */
    fct_tensor_download(&f.kc);
    fct_tensor_download(&f.vc);
    unsigned char *kc0 = malloc(f.kc.bytes), *vc0 = malloc(f.vc.bytes);
    FCT_CHECK(kc0 && vc0, "malloc failed");
    memcpy(kc0, f.kc.host, f.kc.bytes);
    memcpy(vc0, f.vc.host, f.vc.bytes);
#define EXPECT_CACHE_UNCHANGED(what)                                                                      \
  do {                                                                                                    \
    fct_finish();                                                                                         \
    fct_tensor_download(&f.kc);                                                                           \
    fct_tensor_download(&f.vc);                                                                           \
    FCT_CHECK(memcmp(f.kc.host, kc0, f.kc.bytes) == 0 && memcmp(f.vc.host, vc0, f.vc.bytes) == 0,         \
              "%s: a failed append changed the contiguous cache (k %s, v %s)", what,                      \
              memcmp(f.kc.host, kc0, f.kc.bytes) ? "changed" : "same",                                    \
              memcmp(f.vc.host, vc0, f.vc.bytes) ? "changed" : "same");                                   \
  } while (0)
    flashcl_tensor kn = f.kn.t;
    kn.shape[3] = 32;
    d = d0;
    st = flashcl_kv_cache_append(ctx, FCT_APPEND_DESC(&d), &kn, &f.vn.t, &f.kc.t, &f.vc.t, f.lens, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_SHAPE, "append: k_new/v_new shapes differ");
    EXPECT_CACHE_UNCHANGED("append: k_new/v_new shapes differ");
    st = flashcl_kv_cache_append(ctx, FCT_APPEND_DESC(&d), &f.kn.t, &f.vn.t, &f.kc.t, &f.vc.t, f.small, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_BUFFER_TOO_SMALL, "append: seqlens too small");
    EXPECT_CACHE_UNCHANGED("append: seqlens too small");
    {
      /* A cache view whose rows all land on one row: INVALID_STRIDE. */
      flashcl_tensor kz = f.kc.t;
      kz.stride[1] = 0;
      st = flashcl_kv_cache_append(ctx, FCT_APPEND_DESC(&d), &f.kn.t, &f.vn.t, &kz, &f.vc.t, f.lens, 0, NULL, NULL);
      FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_STRIDE, "append: k_cache with a zero seqlen stride");
      EXPECT_CACHE_UNCHANGED("append: k_cache with a zero seqlen stride");
      /* A head dim decode could not read (12): refused before the cache is filled. */
      {
        fct_tensor k12, v12, kn12, vn12;
        contiguous_tensor(&k12, FLASHCL_F32, 2, 32, 2, 12);
        contiguous_tensor(&v12, FLASHCL_F32, 2, 32, 2, 12);
        contiguous_tensor(&kn12, FLASHCL_F32, 2, 2, 2, 12);
        contiguous_tensor(&vn12, FLASHCL_F32, 2, 2, 2, 12);
        fct_tensor_poison(&k12);
        fct_tensor_poison(&v12);
        st = flashcl_kv_cache_append(ctx, FCT_APPEND_DESC(&d), &kn12.t, &vn12.t, &k12.t, &v12.t, f.lens, 0, NULL, NULL);
        FCT_CHECK_STATUS(st, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM, "append: head_dim 12");
        fct_finish();
        expect_untouched(&k12, "append: head_dim 12 (k_cache)");
        expect_untouched(&v12, "append: head_dim 12 (v_cache)");
        fct_tensor_release(&k12);
        fct_tensor_release(&v12);
        fct_tensor_release(&kn12);
        fct_tensor_release(&vn12);
      }
      /* The lengths read from inside the cache the append writes. */
      st = flashcl_kv_cache_append(ctx, FCT_APPEND_DESC(&d), &f.kn.t, &f.vn.t, &f.kc.t, &f.vc.t, f.kc.t.buffer, 0, NULL, NULL);
      FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_ARGUMENT, "append: seqlens inside k_cache");
      EXPECT_CACHE_UNCHANGED("append: seqlens inside k_cache");
    }
#undef EXPECT_CACHE_UNCHANGED
    free(kc0);
    free(vc0);
    d.cache.block_table = f.bt;
    d.cache.max_pages = 2;
    d.cache.page_size = 0;
    st = flashcl_kv_cache_append(ctx, FCT_APPEND_DESC(&d), &f.kn.t, &f.vn.t, &f.kp.t, &f.vp.t, f.lens, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_ARGUMENT, "append: page_size 0");
    d.cache.page_size = 16;
    st = flashcl_kv_cache_append(ctx, FCT_APPEND_DESC(&d), &f.kn.t, &f.vn.t, &f.kp.t, &f.kp.t, f.lens, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_ARGUMENT, "append: k_cache == v_cache");
    fct_finish();
    fct_tensor_download(&f.kp);
    fct_tensor_download(&f.vp);
    FCT_CHECK(fct_tensor_count_unpoisoned(&f.kp) == 0 && fct_tensor_count_unpoisoned(&f.vp) == 0,
              "a failed append wrote to the cache");
  }
  /* Merge. */
  {
    fct_tensor oa, ob, la, lb;
    contiguous_tensor(&oa, FLASHCL_F32, 2, 2, 4, 64);
    contiguous_tensor(&ob, FLASHCL_F32, 2, 2, 4, 64);
    fct_tensor_create_lse(&la, FCT_BNHD, 2, 2, 4, 0);
    fct_tensor_create_lse(&lb, FCT_BNHD, 2, 2, 4, 0);
#define MERGE(a, al, b, bl, o, l) flashcl_merge_states(ctx, a, al, b, bl, o, l, 0, NULL, NULL)
    EXPECT(MERGE(&oa.t, &la.t, &ob.t, &lb.t, NULL, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "merge o NULL");
    EXPECT(MERGE(&oa.t, NULL, &ob.t, &lb.t, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_ARGUMENT, "merge lse_a NULL");
    t = ob.t;
    t.shape[1] = 1;
    EXPECT(MERGE(&oa.t, &la.t, &t, &lb.t, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE, "merge shapes");
    t = lb.t;
    t.shape[2] = 2;
    EXPECT(MERGE(&oa.t, &la.t, &ob.t, &t, &f.o.t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE, "merge lse shape");
    t = lb.t;
    t.dtype = FLASHCL_F16;
    EXPECT(MERGE(&oa.t, &la.t, &ob.t, &t, &f.o.t, &f.lse.t), FLASHCL_ERROR_DTYPE_MISMATCH, "merge lse dtype");
    /* The next three cases' o is a view into o_a's buffer, which is what such a
     * call would write: o_a (poisoned, as it was created) must stay untouched. */
    fct_tensor_poison(&oa);
    t = oa.t;
    t.offset = 4;
    EXPECT(MERGE(&oa.t, &la.t, &ob.t, &lb.t, &t, &f.lse.t), FLASHCL_ERROR_BUFFER_TOO_SMALL, "merge o past its buffer");
    expect_untouched(&oa, "merge o past its buffer (o_a's buffer)");
    t.shape[0] = 1;
    EXPECT(MERGE(&oa.t, &la.t, &ob.t, &lb.t, &t, &f.lse.t), FLASHCL_ERROR_INVALID_SHAPE, "merge o shape");
    expect_untouched(&oa, "merge o shape (o_a's buffer)");
    {
      /* o shifted by one row inside o_a: overlapping but not identical. */
      flashcl_tensor ov = oa.t, oav = oa.t, obv = ob.t;
      flashcl_tensor lav = la.t, lbv = lb.t, lov = f.lse.t;
      ov.shape[1] = oav.shape[1] = obv.shape[1] = 1;
      lav.shape[1] = lbv.shape[1] = lov.shape[1] = 1;
      ov.offset += 4 * 64;
      st = MERGE(&oav, &lav, &obv, &lbv, &ov, &lov);
      FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_ARGUMENT, "merge partial overlap");
      fct_finish();
      expect_untouched(&oa, "merge partial overlap (o_a's buffer, which holds o)");
      expect_untouched(&f.lse, "merge partial overlap");
    }
#undef MERGE
    fct_tensor_release(&oa);
    fct_tensor_release(&ob);
    fct_tensor_release(&la);
    fct_tensor_release(&lb);
  }
#undef EXPECT
#undef DEC
  err_fx_release(&f);
}

int main(void) {
  enum { NDEC = sizeof DEC_CASES / sizeof DEC_CASES[0] };
  struct CMUnitTest tests[NDEC + 16];
  size_t n = 0;
  tests[n++] = (struct CMUnitTest){"merge_split_ranges", test_merge_split_ranges, NULL, NULL, NULL};
  tests[n++] = (struct CMUnitTest){"merge_assoc_f32", test_merge_assoc_f32, NULL, NULL, NULL};
  tests[n++] = (struct CMUnitTest){"merge_assoc_f16", test_merge_assoc_f16, NULL, NULL, NULL};
  tests[n++] = (struct CMUnitTest){"merge_assoc_bf16", test_merge_assoc_bf16, NULL, NULL, NULL};
  tests[n++] = (struct CMUnitTest){"merge_assoc_f16_d512", test_merge_assoc_f16_d512, NULL, NULL, NULL};
  for (size_t i = 0; i < NDEC; i++)
    tests[n++] = (struct CMUnitTest){DEC_CASES[i].name, test_decode_case, NULL, NULL, (void *)&DEC_CASES[i]};
  tests[n++] = (struct CMUnitTest){"decode_corrupt_block_table", test_decode_corrupt_block_table, NULL, NULL, NULL};
  tests[n++] = (struct CMUnitTest){"append_interleaved_pool", test_append_interleaved_pool, NULL, NULL, NULL};
  tests[n++] = (struct CMUnitTest){"decode_auto_splits", test_decode_auto_splits, NULL, NULL, NULL};
  tests[n++] = (struct CMUnitTest){"decode_cached_scratch", test_decode_cached_scratch, NULL, NULL, NULL};
  tests[n++] = (struct CMUnitTest){"decode_errors", test_errors, NULL, NULL, NULL};
  return fct_run_group("decode", tests, n, 1);
}
