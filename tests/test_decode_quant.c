/*
 * Quantized KV caches (flashcl.h, "Quantized KV cache"): I8, F8E4M3 and F8E5M2
 * caches with TENSOR, HEAD and TOKEN scales, written by the host (as a backend
 * would) and by flashcl_kv_cache_append, read by flashcl_attention_decode.
 *
 * Each decode case draws fresh inputs, prefills all but the last q_len tokens
 * of every sequence on the host with the host quantizer (reference_kvq.c),
 * appends the last q_len through the library, then checks the appended codes
 * and TOKEN scales against the host quantizer (a code may differ by one step
 * where the device's x / scale lands on the other side of a tie; a scale by
 * 3 ulp, OpenCL's bound for fp32 division) and that nothing else of the
 * caches and scale buffers changed. The double reference dequantizes the
 * bytes read back from the caches, so the attention is compared on the very
 * values the device read (relative L2: q f32 1e-5, f16 2e-3, bf16 1e-2). The
 * outputs are NaN before each run, unused cache bytes are 0xff (NaN in both
 * fp8 formats) and unused TOKEN scales NaN; NaN never passes.
 * Exact checks: the device's decoding of all 256 codes of each format, its
 * encoding of every code's value, the midpoints between codes (ties) and
 * out-of-range values; the host decoder against closed-form values. Bad
 * input: a missing or short scale buffer, a bad scale kind and a quantized
 * dtype where only a cache may have one are refused with a named status and
 * leave every output byte as it was.
 */
#include "common.h"
#include "reference_kvq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- helpers -- */

/* A device buffer with a host mirror. */
typedef struct qbuf {
  cl_mem mem;
  unsigned char *host;
  size_t bytes;
} qbuf;

static void qbuf_make(qbuf *b, size_t bytes) {
  b->bytes = bytes;
  b->host = malloc(bytes);
  FCT_CHECK(b->host != NULL, "out of host memory");
  b->mem = fct_create_buffer(bytes, NULL);
}
static void qbuf_upload(qbuf *b) {
  cl_int err = clEnqueueWriteBuffer(fct_env_get()->queue, b->mem, CL_TRUE, 0, b->bytes, b->host, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueWriteBuffer: %d", (int)err);
}
static void qbuf_download(const qbuf *b, unsigned char *dst) {
  cl_int err = clEnqueueReadBuffer(fct_env_get()->queue, b->mem, CL_TRUE, 0, b->bytes, dst, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueReadBuffer: %d", (int)err);
}
static void qbuf_free(qbuf *b) {
  if (b->mem) clReleaseMemObject(b->mem);
  free(b->host);
  memset(b, 0, sizeof *b);
}
static float get_f32(const qbuf *b, size_t i) {
  float f;
  memcpy(&f, b->host + 4 * i, 4);
  return f;
}
static void set_f32(qbuf *b, size_t i, float f) { memcpy(b->host + 4 * i, &f, 4); }

static int is_quant(flashcl_dtype t) {
  return t == FLASHCL_I8 || t == FLASHCL_F8E4M3 || t == FLASHCL_F8E5M2 || t == FLASHCL_I4X2;
}

/* Steps between two floats of one sign (ulps). */
static long ulp_distance(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  return labs((long)ia - (long)ib);
}

/* ----------------------------------------------------------- the cases -- */

typedef struct qcase {
  const char *name;
  flashcl_dtype dtype;        /* q, o, k_new, v_new and a plain cache side */
  flashcl_dtype kfmt, vfmt;   /* the caches: dtype (plain) or I8 / F8E4M3 / F8E5M2 */
  flashcl_kv_scale kkind, vkind;
  int batch, q_len, heads_q, heads_kv, head_dim;
  int seqlens[4];             /* KV lengths after the append (>= q_len) */
  int page_size;              /* 0: contiguous */
  int num_splits;             /* desc.split.num_splits (0: the library's choice) */
  const char *tuning;         /* a decode tuning for the call ("decode prefetch=2"), or NULL */
  int elem_offset;            /* both caches start this many elements into their buffers */
  int zero_v_rows;            /* 1: every fifth V row is all zeros (a TOKEN scale of 0) */
} qcase;

#define I8 FLASHCL_I8
#define E4 FLASHCL_F8E4M3
#define E5 FLASHCL_F8E5M2
#define I4 FLASHCL_I4X2
#define TOK FLASHCL_KV_SCALE_TOKEN
#define HEAD FLASHCL_KV_SCALE_HEAD
#define TENS FLASHCL_KV_SCALE_TENSOR
#define BLK FLASHCL_KV_SCALE_BLOCK32
static const qcase QCASES[] = {
    {"quant_i8_token_contig_f32_split1", FLASHCL_F32, I8, I8, TOK, TOK, 2, 1, 8, 2, 64, {37, 70}, 0, 1},
    {"quant_i8_token_paged16_f16_split3", FLASHCL_F16, I8, I8, TOK, TOK, 3, 2, 8, 2, 64, {33, 80, 17}, 16, 3},
    {"quant_e4m3_head_paged8_f16_split2", FLASHCL_F16, E4, E4, HEAD, HEAD, 2, 1, 4, 1, 32, {50, 91}, 8, 2},
    {"quant_e5m2_tensor_contig_f32_auto", FLASHCL_F32, E5, E5, TENS, TENS, 2, 3, 4, 4, 64, {64, 29}, 0, 0},
    {"quant_e4m3_tensor_paged16_f32_split1", FLASHCL_F32, E4, E4, TENS, TENS, 2, 1, 8, 2, 32, {40, 21}, 16, 1},
    {"quant_e5m2_head_contig_f16_split4", FLASHCL_F16, E5, E5, HEAD, HEAD, 1, 4, 8, 2, 64, {120}, 0, 4},
    {"quant_k_e4m3tok_v_i8head_paged16_bf16", FLASHCL_BF16, E4, I8, TOK, HEAD, 2, 1, 8, 2, 64, {45, 77}, 16, 2},
    {"quant_k_f16_v_e5m2tok_contig_f16", FLASHCL_F16, FLASHCL_F16, E5, TOK, TOK, 2, 2, 4, 1, 32, {30, 61}, 0, 1},
    {"quant_k_i8tens_v_f32_paged12_f32", FLASHCL_F32, I8, FLASHCL_F32, TENS, TOK, 2, 1, 8, 2, 64, {55, 26}, 12, 2},
    {"quant_k_e5m2tok_v_e4m3tok_contig_f32", FLASHCL_F32, E5, E4, TOK, TOK, 1, 4, 8, 2, 32, {100}, 0, 3},
    /* Other load schedules: 4 keys per work-item, and K loaded at the end of
     * the tile (prefetch 0) with 1 key per work-item. */
    {"quant_k_i8_v_e5m2_paged16_f16_kpt4", FLASHCL_F16, I8, E5, TOK, TOK, 2, 2, 8, 2, 64, {70, 33}, 16, 2,
     "decode map=0 kpt=4 stages=0"},
    {"quant_e4m3_token_contig_f32_prefetch0", FLASHCL_F32, E4, I8, TOK, TOK, 2, 1, 4, 1, 64, {90, 41}, 0, 2,
     "decode map=0 prefetch=0 kpt=1 stages=0"},
    /* Caches 3 elements into their buffers: rows not 8-byte aligned (the
     * kernel loads codes with vload8, which must not assume alignment). */
    {"quant_i8_e4m3_token_paged16_f16_offset3", FLASHCL_F16, I8, E4, TOK, TOK, 2, 1, 8, 2, 64, {47, 19}, 16, 2, NULL,
     3},
    /* Shapes the NVIDIA tensor-core decode takes (d = 128, 16-bit tokens): one
     * token and four (several m-tiles), split and not, paged with a page size
     * that is and one that is not a power of two, every format and scale kind,
     * a quantized side beside a plain one. */
    {"quant_i8_token_contig_f16_d128_split5", FLASHCL_F16, I8, I8, TOK, TOK, 2, 1, 16, 4, 128, {300, 97}, 0, 5},
    {"quant_e4m3_head_paged32_bf16_d128", FLASHCL_BF16, E4, E4, HEAD, HEAD, 2, 4, 16, 2, 128, {130, 66}, 32, 0},
    {"quant_e5m2_tensor_paged24_f16_d128_q4", FLASHCL_F16, E5, E5, TENS, TENS, 2, 4, 32, 2, 128, {75, 150}, 24, 3},
    {"quant_k_i8_v_f16_contig_f16_d128", FLASHCL_F16, I8, FLASHCL_F16, TOK, TOK, 1, 2, 8, 1, 128, {211}, 0, 2},
    {"quant_k_bf16_v_e4m3tok_paged16_bf16_d64", FLASHCL_BF16, FLASHCL_BF16, E4, TOK, TOK, 3, 1, 32, 4, 64,
     {17, 64, 129}, 16, 0},
    /* BLOCK32 scales (one per 32 elements of a row, as ggml's q8_0): every
     * format, paged and contiguous, beside TOKEN, TENSOR and plain sides, at
     * d = 32 (one block, the portable kernel), 64 and 128 (the tensor-core
     * decode where it runs; bf16 at d = 64 with K's blocks too). */
    {"quant_i8_block32_contig_f16_d128_split3", FLASHCL_F16, I8, I8, BLK, BLK, 2, 1, 16, 4, 128, {150, 71}, 0, 3},
    {"quant_i8_block32_paged16_f32_d64", FLASHCL_F32, I8, I8, BLK, BLK, 2, 2, 8, 2, 64, {45, 90}, 16, 2},
    {"quant_k_e4m3blk_v_e5m2blk_paged8_bf16_d32", FLASHCL_BF16, E4, E5, BLK, BLK, 2, 1, 4, 1, 32, {33, 17}, 8, 0},
    {"quant_k_e5m2blk_v_i8blk_paged16_bf16_d64_q2", FLASHCL_BF16, E5, I8, BLK, BLK, 2, 2, 8, 2, 64, {70, 41}, 16, 2},
    {"quant_k_i8blk_v_e4m3tok_contig_f16_d64", FLASHCL_F16, I8, E4, BLK, TOK, 1, 3, 8, 2, 64, {77}, 0, 2},
    {"quant_k_f16_v_i8blk_paged12_f16_d128_kpt4", FLASHCL_F16, FLASHCL_F16, I8, TOK, BLK, 2, 1, 8, 2, 128, {40, 25},
     12, 1, "decode map=0 kpt=4 stages=0"},
    {"quant_k_e5m2tens_v_i8blk_contig_f32_d64_offset3", FLASHCL_F32, E5, I8, TENS, BLK, 2, 1, 4, 2, 64, {31, 58}, 0,
     2, NULL, 3},
    /* int4, two codes a byte (q4_0-like with BLOCK32 scales): every scale
     * kind, beside int8 / fp8 / plain sides, a cache 3 bytes into its buffer
     * (odd addresses for the 4-byte code loads), and 4 keys per work-item;
     * the first two are tensor-core shapes (16-bit tokens, d 128 / 64). */
    {"quant_i4_block32_paged16_f16_d128_split3", FLASHCL_F16, I4, I4, BLK, BLK, 2, 1, 16, 4, 128, {150, 71}, 16, 3},
    {"quant_k_i4tok_v_i4head_paged16_bf16_d64_q4", FLASHCL_BF16, I4, I4, TOK, HEAD, 2, 4, 16, 2, 64, {130, 66}, 16,
     0},
    /* fp16 with an e5m2 V under row scales, long rows: e5m2's scales are
     * tiny (absmax / 57344), so a kernel that put them on P instead of V
     * would push p * scale below fp16's normal range. */
    {"quant_k_i8_v_e5m2tok_contig_f16_d128_long", FLASHCL_F16, I8, E5, TOK, TOK, 2, 1, 16, 4, 128, {900, 610}, 0, 2},
    /* V rows of zeros among the others: their TOKEN scale is 0, and their
     * keys still count in the softmax's sum (the tensor-core decode puts V's
     * row scales on P; a zero scale must not drop its key from the sum). */
    {"quant_i8_token_zero_rows_contig_f16_d128", FLASHCL_F16, I8, I8, TOK, TOK, 2, 1, 16, 4, 128, {260, 133}, 0, 2,
     NULL, 0, 1},
    {"quant_e4m3_token_zero_rows_paged16_bf16_d64", FLASHCL_BF16, E4, E4, TOK, TOK, 2, 2, 8, 2, 64, {97, 150}, 16, 0,
     NULL, 0, 1},
    {"quant_k_e4m3blk_v_e5m2blk_paged16_f16_d128", FLASHCL_F16, E4, E5, BLK, BLK, 2, 2, 16, 4, 128, {700, 333}, 16,
     0},
    {"quant_i4_token_contig_f32_d64_q2", FLASHCL_F32, I4, I4, TOK, TOK, 2, 2, 8, 2, 64, {45, 90}, 0, 2},
    {"quant_k_i4blk_v_i8tok_paged12_bf16_d64_offset3", FLASHCL_BF16, I4, I8, BLK, TOK, 2, 1, 8, 2, 64, {33, 70}, 12, 2,
     NULL, 3},
    {"quant_k_f16_v_i4head_paged8_f16_d32", FLASHCL_F16, FLASHCL_F16, I4, TOK, HEAD, 2, 1, 4, 1, 32, {50, 91}, 8, 0},
    {"quant_k_i4tens_v_e4m3blk_contig_f32_d64_kpt4", FLASHCL_F32, I4, E4, TENS, BLK, 1, 3, 8, 2, 64, {77}, 0, 2,
     "decode map=0 kpt=4 stages=0"},
};

/* One side (K or V) of a cache: codes or plain elements, dense
 * [pages][rows][Hkv][d] (contiguous: pages = batch, rows = capacity), and its
 * scales in the layout of its kind. */
typedef struct qside {
  flashcl_dtype fmt;
  flashcl_kv_scale kind;
  size_t es;
  qbuf data, scale;
  unsigned char *expect, *expect_scale; /* what the buffers must hold after the append */
  flashcl_tensor t;
} qside;

typedef struct qcache {
  int pages, rows, max_pages, capacity;
  int32_t *bt;
  cl_mem block_table;
  qside k, v;
} qcache;

/* A side's tensor elements per (row, kv head): d, or d / 2 bytes of int4. */
static size_t row_elems(flashcl_dtype fmt, const qcase *c) {
  return is_quant(fmt) ? kvq_ref_row_bytes(fmt, (size_t)c->head_dim) : (size_t)c->head_dim;
}

/* Element x = 0 of (row, h) in a side's buffer (its tensor's elements). */
static size_t elem_at(const qside *s, const qcase *c, size_t row, int h) {
  return (row * (size_t)c->heads_kv + (size_t)h) * row_elems(s->fmt, c) + (size_t)c->elem_offset;
}

/* Row (page * rows + slot) of sequence b's token j. */
static size_t cache_row(const qcache *cc, const qcase *c, int b, int j) {
  if (!c->page_size) return (size_t)b * cc->rows + (size_t)j;
  return (size_t)cc->bt[(size_t)b * cc->max_pages + j / c->page_size] * cc->rows + (size_t)(j % c->page_size);
}

/* Scales per (row, kv head): d / 32 for BLOCK32, else 1. */
static size_t row_scales(const qcase *c, flashcl_kv_scale kind) {
  return kind == BLK ? (size_t)c->head_dim / 32 : 1;
}

static size_t scale_floats(const qcache *cc, const qcase *c, flashcl_kv_scale kind) {
  return kind == TENS   ? 1
         : kind == HEAD ? (size_t)c->heads_kv
                        : (size_t)cc->pages * cc->rows * c->heads_kv * row_scales(c, kind);
}

/* The scale of element x of (row, h), flashcl.h's layouts. */
static size_t scale_index(const qcase *c, flashcl_kv_scale kind, size_t row, int h, int x) {
  if (kind == BLK) return (row * (size_t)c->heads_kv + (size_t)h) * row_scales(c, kind) + (size_t)x / 32;
  return kind == TENS ? 0 : kind == HEAD ? (size_t)h : row * (size_t)c->heads_kv + (size_t)h;
}

/* The elements a row-written scale covers: the row (TOKEN) or a 32-block. */
static int scale_span(const qcase *c, flashcl_kv_scale kind) { return kind == BLK ? 32 : c->head_dim; }

static void side_make(qside *s, const qcache *cc, const qcase *c, flashcl_dtype fmt, flashcl_kv_scale kind) {
  memset(s, 0, sizeof *s);
  s->fmt = fmt;
  s->kind = kind;
  s->es = fct_dtype_size(fmt);
  const size_t n = (size_t)cc->pages * cc->rows * c->heads_kv * row_elems(fmt, c) + (size_t)c->elem_offset;
  qbuf_make(&s->data, n * s->es);
  if (is_quant(fmt)) {
    memset(s->data.host, 0xff, s->data.bytes);
  } else {
    for (size_t i = 0; i < n; i++) fct_store_poison(fmt, s->data.host, i);
  }
  if (is_quant(fmt)) {
    const size_t ns = scale_floats(cc, c, kind);
    qbuf_make(&s->scale, ns * 4);
    for (size_t i = 0; i < ns; i++) set_f32(&s->scale, i, NAN);
  }
  FCT_CHECK(flashcl_tensor_init_bnhd(&s->t, s->data.mem, (size_t)c->elem_offset * s->es, fmt, cc->pages, cc->rows,
                                     c->heads_kv, (int64_t)row_elems(fmt, c)) ==
                FLASHCL_SUCCESS,
            "tensor init");
}

static void side_free(qside *s) {
  qbuf_free(&s->data);
  qbuf_free(&s->scale);
  free(s->expect);
  free(s->expect_scale);
}

static void cache_make(qcache *cc, const qcase *c, fct_rng *rng) {
  memset(cc, 0, sizeof *cc);
  int max_len = 1;
  for (int b = 0; b < c->batch; b++) max_len = c->seqlens[b] > max_len ? c->seqlens[b] : max_len;
  if (!c->page_size) {
    cc->pages = c->batch;
    cc->rows = cc->capacity = max_len + 3;
  } else {
    const int P = c->page_size;
    cc->max_pages = (max_len + P - 1) / P + 1;
    cc->capacity = cc->max_pages * P;
    cc->rows = P;
    int used = 0;
    for (int b = 0; b < c->batch; b++) used += (c->seqlens[b] + P - 1) / P;
    cc->pages = used + 2;
    int *perm = malloc(sizeof(int) * (size_t)cc->pages);
    for (int i = 0; i < cc->pages; i++) perm[i] = i;
    for (int i = cc->pages - 1; i > 0; i--) {
      const int j = (int)(fct_rng_u64(rng) % (uint64_t)(i + 1)), tmp = perm[i];
      perm[i] = perm[j];
      perm[j] = tmp;
    }
    cc->bt = malloc(sizeof(int32_t) * (size_t)c->batch * cc->max_pages);
    int next = 0;
    for (int b = 0; b < c->batch; b++)
      for (int i = 0; i < cc->max_pages; i++)
        cc->bt[(size_t)b * cc->max_pages + i] = i < (c->seqlens[b] + P - 1) / P ? perm[next++] : -7;
    free(perm);
    cc->block_table = fct_create_buffer(sizeof(int32_t) * (size_t)c->batch * cc->max_pages, cc->bt);
  }
  side_make(&cc->k, cc, c, c->kfmt, c->kkind);
  side_make(&cc->v, cc, c, c->vfmt, c->vkind);
}

static void cache_free(qcache *cc) {
  side_free(&cc->k);
  side_free(&cc->v);
  if (cc->block_table) clReleaseMemObject(cc->block_table);
  free(cc->bt);
}

static flashcl_tuning g_tuning; /* the running case's (cases run one at a time) */

static void case_desc(const qcase *c, const qcache *cc, flashcl_decode_desc *desc) {
  flashcl_decode_desc_init(desc);
  if (c->tuning) {
    FCT_CHECK_STATUS(flashcl_tuning_parse(fct_env_get()->ctx, c->tuning, &g_tuning), FLASHCL_SUCCESS, "%s: tuning",
                     c->name);
    desc->tuning = &g_tuning;
  }
  desc->split.num_splits = c->num_splits;
  if (c->page_size) {
    desc->cache.page_size = c->page_size;
    desc->cache.block_table = cc->block_table;
    desc->cache.max_pages = cc->max_pages;
  }
  desc->cache.k_scale = cc->k.scale.mem;
  desc->cache.v_scale = cc->v.scale.mem;
  desc->cache.k_scale_kind = c->kkind;
  desc->cache.v_scale_kind = c->vkind;
}

/* Logical values: vals[((b * maxL + j) * Hkv + h) * d + x]. */
typedef struct qvals {
  float *k, *v;
  int max_len;
} qvals;

static const float *row_of(const float *a, const qcase *c, const qvals *qv, int b, int j, int h) {
  return a + (((size_t)b * qv->max_len + j) * c->heads_kv + h) * c->head_dim;
}

/* TENSOR / HEAD scales the caller chooses: 0.8 of the covering scale, so
 * that the largest values saturate (the append must clamp them as the host
 * does); per head for HEAD. */
static void side_fixed_scales(qside *s, const qcase *c, const float *vals, const qvals *qv) {
  if (!is_quant(s->fmt) || s->kind == TOK || s->kind == BLK) return;
  for (int h = 0; h < (s->kind == HEAD ? c->heads_kv : 1); h++) {
    float amax = 0.0f;
    for (int b = 0; b < c->batch; b++)
      for (int j = 0; j < c->seqlens[b]; j++)
        for (int hh = 0; hh < c->heads_kv; hh++) {
          if (s->kind == HEAD && hh != h) continue;
          const float *r = row_of(vals, c, qv, b, j, hh);
          for (int x = 0; x < c->head_dim; x++) amax = fabsf(r[x]) > amax ? fabsf(r[x]) : amax;
        }
    set_f32(&s->scale, (size_t)h, 0.8f * amax / kvq_ref_qmax(s->fmt));
  }
}

/* The host writes row (b, j, h) as a backend would. */
static void side_host_row(qside *s, const qcache *cc, const qcase *c, const float *r, int b, int j, int h) {
  const size_t row = cache_row(cc, c, b, j), at = elem_at(s, c, row, h);
  if (!is_quant(s->fmt)) {
    for (int x = 0; x < c->head_dim; x++) fct_store(s->fmt, s->data.host, at + x, r[x]);
    return;
  }
  const int span = scale_span(c, s->kind);
  for (int x0 = 0; x0 < c->head_dim; x0 += span) {
    const size_t si = scale_index(c, s->kind, row, h, x0);
    if (s->kind == TOK || s->kind == BLK) set_f32(&s->scale, si, kvq_ref_token_scale(s->fmt, r + x0, span));
    const float sc = get_f32(&s->scale, si);
    for (int x = x0; x < x0 + span; x++)
      kvq_ref_put(s->fmt, s->data.host + at, (size_t)x, kvq_ref_encode(s->fmt, r[x], sc));
  }
}

/* After the append: the new rows against the host quantizer (adopting the
 * device's bytes into expect), then every byte of the buffers. */
static void side_check_append(qside *s, const qcache *cc, const qcase *c, const float *vals, const qvals *qv,
                              const char *what) {
  unsigned char *got = malloc(s->data.bytes), *got_s = s->scale.bytes ? malloc(s->scale.bytes) : NULL;
  qbuf_download(&s->data, got);
  if (got_s) qbuf_download(&s->scale, got_s);
  size_t off_by_one = 0, scale_inexact = 0;
  for (int b = 0; b < c->batch; b++)
    for (int j = c->seqlens[b] - c->q_len; j < c->seqlens[b]; j++)
      for (int h = 0; h < c->heads_kv; h++) {
        const float *r = row_of(vals, c, qv, b, j, h);
        const size_t row = cache_row(cc, c, b, j), at = elem_at(s, c, row, h);
        if (!is_quant(s->fmt)) {
          for (int x = 0; x < c->head_dim; x++)
            FCT_CHECK(fct_load(s->fmt, got, at + x) == (double)r[x], "%s %s: plain element (b %d, j %d, h %d, x %d)",
                      c->name, what, b, j, h, x);
          memcpy(s->expect + at * s->es, got + at * s->es, (size_t)c->head_dim * s->es);
          continue;
        }
        const int span = scale_span(c, s->kind);
        for (int x = 0; x < c->head_dim; x++) {
          const size_t si = scale_index(c, s->kind, row, h, x);
          float sc;
          memcpy(&sc, got_s + 4 * si, 4);
          if ((s->kind == TOK || s->kind == BLK) && x % span == 0) {
            const float want = kvq_ref_token_scale(s->fmt, r + x, span);
            const long du = ulp_distance(sc, want);
            FCT_CHECK(du <= 3, "%s %s: %s scale of (b %d, j %d, h %d, x %d) is %.9g, the host's %.9g (%ld ulp)",
                      c->name, what, s->kind == BLK ? "BLOCK32" : "TOKEN", b, j, h, x, (double)sc, (double)want, du);
            scale_inexact += du != 0;
            memcpy(s->expect_scale + 4 * si, &sc, 4);
          }
          const uint8_t want = kvq_ref_encode(s->fmt, r[x], sc), have = kvq_ref_get(s->fmt, got + at, (size_t)x);
          const int dist = kvq_ref_code_distance(s->fmt, have, want);
          FCT_CHECK(dist <= 1, "%s %s: code of (b %d, j %d, h %d, x %d) = %.9g / %.9g is 0x%02x, the host's 0x%02x",
                    c->name, what, b, j, h, x, (double)r[x], (double)sc, have, want);
          off_by_one += dist != 0;
          kvq_ref_put(s->fmt, s->expect + at, (size_t)x, have);
        }
      }
  FCT_CHECK(memcmp(got, s->expect, s->data.bytes) == 0, "%s %s: the append changed bytes outside its rows", c->name,
            what);
  FCT_CHECK(!got_s || memcmp(got_s, s->expect_scale, s->scale.bytes) == 0,
            "%s %s: the append changed scales outside its rows (or a TENSOR / HEAD scale)", c->name, what);
  if (off_by_one || scale_inexact)
    print_message("[ QUANT    ] %s %s: %zu codes one step off the host's, %zu scales inexact\n", c->name, what,
                  off_by_one, scale_inexact);
  /* The reference reads what the device holds. */
  memcpy(s->data.host, got, s->data.bytes);
  if (got_s) memcpy(s->scale.host, got_s, s->scale.bytes);
  free(got);
  free(got_s);
}

/* The value the device reads at (b, j, h, x): code * scale in fp32, or the plain element. */
static double side_value(const qside *s, const qcache *cc, const qcase *c, int b, int j, int h, int x) {
  const size_t row = cache_row(cc, c, b, j), at = elem_at(s, c, row, h);
  if (!is_quant(s->fmt)) return fct_load(s->fmt, s->data.host, at + (size_t)x);
  const float v = kvq_ref_decode(s->fmt, kvq_ref_get(s->fmt, s->data.host + at, (size_t)x)) *
                  get_f32(&s->scale, scale_index(c, s->kind, row, h, x));
  return v;
}

/* Double attention of the new tokens (bottom-right causal) over the cache's values. */
/* raw NULL: over the values the cache's bytes hold; else over the values
 * before quantization (for the quantization error the case prints). */
static double ref_value(const qside *s, const qcache *cc, const qcase *c, const float *raw, const qvals *qv, int b,
                        int j, int h, int x) {
  return raw ? (double)row_of(raw, c, qv, b, j, h)[x] : side_value(s, cc, c, b, j, h, x);
}

static void ref_attention(const qcase *c, const qcache *cc, const fct_tensor *q, const qvals *raw, double *ref_o,
                          double *ref_lse) {
  const int T = c->q_len, Hq = c->heads_q, d = c->head_dim, G = Hq / c->heads_kv;
  const double scale = 1.0 / sqrt((double)d);
  for (int b = 0; b < c->batch; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < Hq; h++) {
        const int L = c->seqlens[b], last = L - T + t, hk = h / G;
        double *o = ref_o + (((size_t)b * T + t) * Hq + h) * d, m = -INFINITY, l = 0;
        double *s = malloc(sizeof(double) * (size_t)(last + 1));
        for (int x = 0; x < d; x++) o[x] = 0;
        for (int j = 0; j <= last; j++) {
          double a = 0;
          for (int x = 0; x < d; x++)
            a += fct_tensor_get(q, b, t, h, x) * ref_value(&cc->k, cc, c, raw ? raw->k : NULL, raw, b, j, hk, x);
          s[j] = a * scale;
          m = s[j] > m ? s[j] : m;
        }
        for (int j = 0; j <= last; j++) {
          const double p = exp(s[j] - m);
          l += p;
          for (int x = 0; x < d; x++) o[x] += p * ref_value(&cc->v, cc, c, raw ? raw->v : NULL, raw, b, j, hk, x);
        }
        for (int x = 0; x < d; x++) o[x] /= l;
        ref_lse[((size_t)b * T + t) * Hq + h] = m + log(l);
        free(s);
      }
}

/* Host prefill of tokens [0, L - q_len), then the append of the last q_len. */
static void fill_cache(const qcase *c, qcache *cc, const qvals *qv) {
  fct_env *env = fct_env_get();
  const int B = c->batch, T = c->q_len, Hkv = c->heads_kv, d = c->head_dim;
  side_fixed_scales(&cc->k, c, qv->k, qv);
  side_fixed_scales(&cc->v, c, qv->v, qv);
  for (int b = 0; b < B; b++)
    for (int j = 0; j < c->seqlens[b] - T; j++)
      for (int h = 0; h < Hkv; h++) {
        side_host_row(&cc->k, cc, c, row_of(qv->k, c, qv, b, j, h), b, j, h);
        side_host_row(&cc->v, cc, c, row_of(qv->v, c, qv, b, j, h), b, j, h);
      }
  qside *sides[2] = {&cc->k, &cc->v};
  for (int i = 0; i < 2; i++) {
    qside *s = sides[i];
    qbuf_upload(&s->data);
    s->expect = malloc(s->data.bytes);
    memcpy(s->expect, s->data.host, s->data.bytes);
    if (s->scale.bytes) {
      qbuf_upload(&s->scale);
      s->expect_scale = malloc(s->scale.bytes);
      memcpy(s->expect_scale, s->scale.host, s->scale.bytes);
    }
  }
  fct_tensor kn, vn;
  const int64_t shape[4] = {B, T, Hkv, d}, stride[4] = {(int64_t)T * Hkv * d, (int64_t)Hkv * d, d, 1};
  const size_t bytes = (size_t)B * T * Hkv * d * fct_dtype_size(c->dtype);
  fct_tensor_create_custom(&kn, c->dtype, bytes, 0, shape, stride);
  fct_tensor_create_custom(&vn, c->dtype, bytes, 0, shape, stride);
  int32_t lens[4];
  for (int b = 0; b < B; b++) {
    lens[b] = c->seqlens[b] - T;
    for (int t = 0; t < T; t++)
      for (int h = 0; h < Hkv; h++)
        for (int x = 0; x < d; x++) {
          const size_t i = fct_tensor_index(&kn, b, t, h, x);
          fct_store(c->dtype, kn.host, i, row_of(qv->k, c, qv, b, lens[b] + t, h)[x]);
          fct_store(c->dtype, vn.host, i, row_of(qv->v, c, qv, b, lens[b] + t, h)[x]);
        }
  }
  FCT_CHECK(clEnqueueWriteBuffer(env->queue, kn.t.buffer, CL_TRUE, 0, kn.bytes, kn.host, 0, NULL, NULL) == CL_SUCCESS &&
                clEnqueueWriteBuffer(env->queue, vn.t.buffer, CL_TRUE, 0, vn.bytes, vn.host, 0, NULL, NULL) ==
                    CL_SUCCESS,
            "upload");
  cl_mem before = fct_create_buffer(sizeof(int32_t) * (size_t)B, lens);
  flashcl_decode_desc desc;
  case_desc(c, cc, &desc);
  flashcl_status st = flashcl_kv_cache_append(env->ctx, FCT_APPEND_DESC(&desc), &kn.t, &vn.t, &cc->k.t, &cc->v.t, before, 0, NULL, NULL);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: flashcl_kv_cache_append", c->name);
  fct_finish();
  side_check_append(&cc->k, cc, c, qv->k, qv, "k");
  side_check_append(&cc->v, cc, c, qv->v, qv, "v");
  clReleaseMemObject(before);
  fct_tensor_release(&kn);
  fct_tensor_release(&vn);
}

static void run_quant_case(const qcase *c) {
  fct_env *env = fct_env_get();
  const int B = c->batch, T = c->q_len, Hq = c->heads_q, d = c->head_dim;
  fct_rng rng;
  char tag[256];
  snprintf(tag, sizeof tag, "decode_quant/%s", c->name);
  fct_rng_init(&rng, tag);

  qvals qv;
  qv.max_len = 0;
  for (int b = 0; b < B; b++) qv.max_len = c->seqlens[b] > qv.max_len ? c->seqlens[b] : qv.max_len;
  const size_t nv = (size_t)B * qv.max_len * c->heads_kv * d;
  qv.k = malloc(sizeof(float) * nv);
  qv.v = malloc(sizeof(float) * nv);
  /* Blocks of 32 values (whole rows at d = 32) of different magnitudes, so
   * that TOKEN scales differ from row to row and BLOCK32 scales within one. */
  for (size_t i = 0; i < nv; i++) {
    const float mag = (float)(0.25 + 2.0 * (double)((i / 32) % 5) / 4.0);
    qv.k[i] = fct_quantize(c->dtype, mag * (float)fct_rng_normal(&rng));
    qv.v[i] = fct_quantize(c->dtype, mag * (float)fct_rng_normal(&rng));
  }
  if (c->zero_v_rows)
    for (int b = 0; b < B; b++)
      for (int j = 2; j < c->seqlens[b]; j += 5)
        for (int h = 0; h < c->heads_kv; h++) memset((void *)row_of(qv.v, c, &qv, b, j, h), 0, sizeof(float) * (size_t)d);
  qcache cc;
  cache_make(&cc, c, &rng);
  fill_cache(c, &cc, &qv);

  fct_tensor q, o, lse;
  fct_tensor_create(&q, c->dtype, FCT_BNHD, B, T, Hq, d, 1);
  fct_tensor_create(&o, c->dtype, FCT_BNHD, B, T, Hq, d, 2);
  fct_tensor_create_lse(&lse, FCT_BNHD, B, T, Hq, 3);
  fct_tensor_fill_random(&q, &rng);
  int32_t lens[4];
  for (int b = 0; b < B; b++) lens[b] = c->seqlens[b];
  cl_mem seqlens = fct_create_buffer(sizeof(int32_t) * (size_t)B, lens);

  flashcl_decode_desc desc;
  case_desc(c, &cc, &desc);
  flashcl_config cfg;
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &q.t, &cc.k.t, &cc.v.t, &cfg), FLASHCL_SUCCESS,
                   "%s: config", c->name);
  /* The tensor-core kernel dequantizes in local memory where it covers the
   * call (16-bit tokens, d 64 or 128, 16-byte aligned cache rows) on a device
   * that must have it; decode.cl's register path takes every other call on a
   * GPU, decode_cpu.cl's kernel on other devices (both dequantize on load),
   * unless a tuning (the case's, or an override file) sets map. */
  char what[128];
  const int mma_case = c->dtype != FLASHCL_F32 && (d == 64 || d == 128) && c->elem_offset % 16 == 0 && !c->tuning;
  const int want_mma = mma_case && fct_device_requires_mma(env->device, what, sizeof what);
  int map = -1;
  FCT_CHECK(flashcl_tuning_get(&cfg.tuning, "map", &map) == FLASHCL_SUCCESS &&
                (c->tuning || getenv("FLASHCL_TUNING") || map == !env->info.is_gpu),
            "%s: map %d on a %sGPU device", c->name, map, env->info.is_gpu ? "" : "non-");
  const char *portable = map == 1 ? "decode_attn_cpu" : "decode_attn";
  FCT_CHECK(strcmp(cfg.kernel, want_mma ? "decode_mma" : portable) == 0 ||
                (!want_mma && strcmp(cfg.kernel, "decode_mma") == 0 && mma_case),
            "%s: a quantized call reports kernel %s", c->name, cfg.kernel);
  int splits = -1;
  size_t ws = 0;
  FCT_CHECK_STATUS(flashcl_attention_decode_workspace_size(env->ctx, &desc, &q.t, &cc.k.t, &cc.v.t, &ws, &splits),
                   FLASHCL_SUCCESS, "%s: workspace size", c->name);
  FCT_CHECK(c->num_splits == 0 || splits == c->num_splits, "%s: %d splits", c->name, splits);
  double *ref_o = malloc(sizeof(double) * (size_t)B * T * Hq * d), *ref_lse = malloc(sizeof(double) * (size_t)B * T * Hq);
  ref_attention(c, &cc, &q, NULL, ref_o, ref_lse);

  flashcl_status st =
      flashcl_attention_decode(env->ctx, &desc, &q.t, &cc.k.t, &cc.v.t, seqlens, &o.t, &lse.t, 0, NULL, NULL);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: flashcl_attention_decode", c->name);
  fct_finish();
  fct_tensor_download(&o);
  fct_tensor_download(&lse);
  double eo = 0, ro = 0, el = 0, rl = 0;
  size_t nonfinite = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < Hq; h++) {
        const size_t r = ((size_t)b * T + t) * Hq + h;
        for (int x = 0; x < d; x++) {
          const double got = fct_tensor_get(&o, b, t, h, x), want = ref_o[r * d + x];
          if (!isfinite(got)) nonfinite++;
          eo += (got - want) * (got - want);
          ro += want * want;
        }
        const double gl = fct_tensor_get(&lse, b, t, h, 0);
        if (!isfinite(gl)) nonfinite++;
        el += (gl - ref_lse[r]) * (gl - ref_lse[r]);
        rl += ref_lse[r] * ref_lse[r];
      }
  const double err_o = sqrt(eo / ro), err_l = sqrt(el / rl);
  print_message("[ QUANT    ] %-40s q %s splits %d: O relL2 %.2e, LSE relL2 %.2e\n", c->name, fct_dtype_str(c->dtype),
                splits, err_o, err_l);
  FCT_CHECK(nonfinite == 0, "%s: %zu non-finite outputs", c->name, nonfinite);
  FCT_CHECK(err_o <= fct_tolerance(c->dtype), "%s: O relL2 %.3e > %.1e", c->name, err_o, fct_tolerance(c->dtype));
  {
    /* The quantization error itself: the device's O against the attention
     * over the values before quantization (what an unquantized cache of
     * those values would give, up to its own rounding). Printed, for
     * BENCHMARKS.md and docs/inference.md; the check above is over the bytes
     * the cache holds. */
    double *raw_o = malloc(sizeof(double) * (size_t)B * T * Hq * d), *raw_l = malloc(sizeof(double) * (size_t)B * T * Hq);
    ref_attention(c, &cc, &q, &qv, raw_o, raw_l);
    double qe = 0, qr = 0;
    for (size_t i = 0; i < (size_t)B * T * Hq; i++)
      for (int x = 0; x < d; x++) {
        const int64_t h = (int64_t)(i % (size_t)Hq), t = (int64_t)(i / (size_t)Hq % (size_t)T),
                      b = (int64_t)(i / ((size_t)Hq * T));
        const double g = fct_tensor_get(&o, b, t, h, x), w = raw_o[i * d + x];
        qe += (g - w) * (g - w), qr += w * w;
      }
    print_message("[ QUANT    ] %-40s quantization error of O (vs the values before quantization): relL2 %.2e\n",
                  c->name, sqrt(qe / qr));
    free(raw_o);
    free(raw_l);
  }
  /* K's codes are exact and its scales multiply the scores in fp32 on every
   * kernel: the LSE keeps the dtype's tolerance. */
  FCT_CHECK(err_l <= fct_lse_tolerance(c->dtype), "%s: LSE relL2 %.3e > %.1e", c->name, err_l,
            fct_lse_tolerance(c->dtype));

  free(ref_o);
  free(ref_lse);
  clReleaseMemObject(seqlens);
  fct_tensor_release(&q);
  fct_tensor_release(&o);
  fct_tensor_release(&lse);
  cache_free(&cc);
  free(qv.k);
  free(qv.v);
}

static void test_quant_case(void **state) { run_quant_case((const qcase *)*state); }

/* -------------------------------------------------- exact format checks -- */

/* The host decoder against values written out by hand from the formats. */
static void test_host_formats(void **state) {
  (void)state;
  static const struct {
    flashcl_dtype fmt;
    uint8_t code;
    float value;
  } known[] = {
      {E4, 0x00, 0.0f},          {E4, 0x01, 0.001953125f}, {E4, 0x07, 0.013671875f}, {E4, 0x08, 0.015625f},
      {E4, 0x38, 1.0f},          {E4, 0x39, 1.125f},       {E4, 0x7e, 448.0f},       {E4, 0xfe, -448.0f},
      {E4, 0xb8, -1.0f},         {E5, 0x00, 0.0f},         {E5, 0x01, 1.52587890625e-05f},
      {E5, 0x04, 6.103515625e-05f}, {E5, 0x3c, 1.0f},      {E5, 0x3d, 1.25f},        {E5, 0x7b, 57344.0f},
      {E5, 0xfb, -57344.0f},     {E5, 0x7c, INFINITY},     {E5, 0xfc, -INFINITY},    {I8, 0x7f, 127.0f},
      {I8, 0x81, -127.0f},       {I8, 0x80, -128.0f},      {I8, 0xff, -1.0f},
  };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    FCT_CHECK(kvq_ref_decode(known[i].fmt, known[i].code) == known[i].value, "%s 0x%02x: %.9g, expected %.9g",
              fct_dtype_str(known[i].fmt), known[i].code, (double)kvq_ref_decode(known[i].fmt, known[i].code),
              (double)known[i].value);
  FCT_CHECK(isnan(kvq_ref_decode(E4, 0x7f)) && isnan(kvq_ref_decode(E4, 0xff)), "e4m3 NaN codes");
  for (int c = 0x7d; c <= 0x7f; c++)
    FCT_CHECK(isnan(kvq_ref_decode(E5, (uint8_t)c)) && isnan(kvq_ref_decode(E5, (uint8_t)(c | 0x80))),
              "e5m2 NaN code 0x%02x", c);
  FCT_CHECK(signbit(kvq_ref_decode(E4, 0x80)) && kvq_ref_decode(E4, 0x80) == 0.0f, "e4m3 -0");
  /* Every finite code encodes back to itself; ties go to the even code,
   * values past the largest saturate, NaN stays NaN. */
  const flashcl_dtype fmts[2] = {E4, E5};
  for (int f = 0; f < 2; f++) {
    const flashcl_dtype fmt = fmts[f];
    for (int c = 0; c < 256; c++) {
      const float v = kvq_ref_decode(fmt, (uint8_t)c);
      if (isfinite(v) && c != 0x80)
        FCT_CHECK(kvq_ref_encode(fmt, v, 1.0f) == c, "%s: code 0x%02x does not round-trip", fct_dtype_str(fmt), c);
    }
    const int maxc = fmt == E4 ? 0x7e : 0x7b;
    for (int c = 0; c < maxc; c++) {
      const float mid = 0.5f * (kvq_ref_decode(fmt, (uint8_t)c) + kvq_ref_decode(fmt, (uint8_t)(c + 1)));
      FCT_CHECK(kvq_ref_encode(fmt, mid, 1.0f) == (c % 2 ? c + 1 : c), "%s: tie between 0x%02x and 0x%02x",
                fct_dtype_str(fmt), c, c + 1);
    }
    FCT_CHECK(kvq_ref_encode(fmt, 1e30f, 1.0f) == maxc && kvq_ref_encode(fmt, -INFINITY, 1.0f) == (0x80 | maxc),
              "%s saturation", fct_dtype_str(fmt));
    FCT_CHECK(isnan(kvq_ref_decode(fmt, kvq_ref_encode(fmt, NAN, 1.0f))), "%s NaN", fct_dtype_str(fmt));
  }
  FCT_CHECK(kvq_ref_encode(I8, 2.5f, 1.0f) == 2 && kvq_ref_encode(I8, -3.5f, 1.0f) == (uint8_t)-4 &&
                kvq_ref_encode(I8, 300.0f, 1.0f) == 127 && kvq_ref_encode(I8, -300.0f, 1.0f) == (uint8_t)-127 &&
                kvq_ref_encode(I8, NAN, 1.0f) == 0 && kvq_ref_encode(I8, 5.0f, 0.0f) == 0,
            "int8 rounding, clamping, NaN and scale 0");
}

/* A one-key decode (key count 1 in *lens, unsplit) over caches whose scales
 * are ks / vs of kinds kk / vk (NULL: a plain side). */
static void one_key_call(flashcl_decode_desc *desc, cl_mem *lens, cl_mem ks, flashcl_kv_scale kk, cl_mem vs,
                         flashcl_kv_scale vk) {
  const int32_t one = 1;
  *lens = fct_create_buffer(4, &one);
  flashcl_decode_desc_init(desc);
  desc->split.num_splits = 1;
  desc->cache.k_scale = ks;
  desc->cache.k_scale_kind = kk;
  desc->cache.v_scale = vs;
  desc->cache.v_scale_kind = vk;
}

/* A one-key decode returns that key's V row: with V holding every code of
 * fmt under a TENSOR scale of 2, o must be each code's value times 2,
 * exactly (NaN where the code is NaN, inf where inf). int4: 16 bytes hold
 * every code in either nibble (code i low, 15 - i high). */
static void device_decodes_codes(flashcl_dtype fmt) {
  fct_env *env = fct_env_get();
  const int d = fmt == I4 ? 32 : 256;
  fct_rng rng;
  fct_rng_init(&rng, fct_dtype_str(fmt));
  fct_tensor q, o, kc;
  fct_tensor_create(&q, FLASHCL_F32, FCT_BNHD, 1, 1, 1, d, 1);
  fct_tensor_create(&o, FLASHCL_F32, FCT_BNHD, 1, 1, 1, d, 2);
  fct_tensor_create(&kc, FLASHCL_F32, FCT_BNHD, 1, 1, 1, d, 3);
  fct_tensor_fill_random(&q, &rng);
  fct_tensor_fill_random(&kc, &rng);
  qbuf vc, sc;
  const size_t bytes = kvq_ref_row_bytes(fmt, (size_t)d);
  qbuf_make(&vc, bytes);
  for (size_t x = 0; x < bytes; x++) vc.host[x] = (unsigned char)(fmt == I4 ? x | (15 - x) << 4 : x);
  qbuf_upload(&vc);
  qbuf_make(&sc, 4);
  set_f32(&sc, 0, 2.0f);
  qbuf_upload(&sc);
  flashcl_tensor vt;
  flashcl_tensor_init_bnhd(&vt, vc.mem, 0, fmt, 1, 1, 1, (int64_t)bytes);
  cl_mem lens;
  flashcl_decode_desc desc;
  one_key_call(&desc, &lens, NULL, TOK, sc.mem, TENS);
  FCT_CHECK_STATUS(flashcl_attention_decode(env->ctx, &desc, &q.t, &kc.t, &vt, lens, &o.t, NULL, 0, NULL, NULL),
                   FLASHCL_SUCCESS, "decode of every %s code", fct_dtype_str(fmt));
  fct_finish();
  fct_tensor_download(&o);
  for (int x = 0; x < d; x++) {
    const uint8_t code = kvq_ref_get(fmt, vc.host, (size_t)x);
    const float want = kvq_ref_decode(fmt, code) * 2.0f;
    const float got = (float)fct_tensor_get(&o, 0, 0, 0, x);
    FCT_CHECK(isnan(want) ? isnan(got) : got == want, "%s code 0x%02x: the device reads %.9g, the format says %.9g",
              fct_dtype_str(fmt), code, (double)got, (double)want);
  }
  clReleaseMemObject(lens);
  qbuf_free(&vc);
  qbuf_free(&sc);
  fct_tensor_release(&q);
  fct_tensor_release(&o);
  fct_tensor_release(&kc);
}

/* Every code through the kernel AUTO picks for f16 tokens at d = 128 (the
 * tensor-core decode on NVIDIA, with its own conversions: byte permutes,
 * sm_89's e4m3 conversion; the portable kernel elsewhere), in two calls of
 * 128 codes: one key whose K and V rows hold the codes, and 128 query heads of
 * one kv head, head h's q one-hot at dim h. Then o (every head) is V's row
 * times the scale, and head h's LSE (its only score) is K's code h times K's
 * scale times desc.score.scale. Both exact: every code and every scaled value here
 * is an fp16 value. K's non-finite codes become 0 (with a one-hot q a NaN
 * anywhere in K's row would make every score NaN), and K's scale keeps every
 * score below 1 in magnitude: the kernels subtract the row max in the log2
 * domain as fma(s, c, -round(m * c)), whose rounding residual (up to half an
 * ulp of s * c) leaves p = 2^r slightly off 1 for a large score, and o = P V / l
 * one fp16 ulp off. kkind / vkind: the scales' layouts (a TOKEN V is
 * dequantized with its scale, a TENSOR V scaled at the end). */
static void mma_decodes_codes(flashcl_dtype fmt, flashcl_kv_scale kkind, flashcl_kv_scale vkind) {
  fct_env *env = fct_env_get();
  enum { D = 128, H = 128 };
  /* 2^-8, 2^-10, 2^-17, 2^-4: |code * ks| <= 0.5 */
  const float vs = 0.125f, ks = fmt == I8   ? 0.00390625f
                                : fmt == E4 ? 0.0009765625f
                                : fmt == I4 ? 0.0625f
                                            : 0.00000762939453125f;
  const size_t rb = kvq_ref_row_bytes(fmt, D);
  const float scale = 0.5f;
  char what[128];
  for (int half = 0; half < 2; half++) {
    fct_tensor q, o, lse;
    fct_tensor_create(&q, FLASHCL_F16, FCT_BNHD, 1, 1, H, D, 1);
    fct_tensor_create(&o, FLASHCL_F16, FCT_BNHD, 1, 1, H, D, 2);
    fct_tensor_create_lse(&lse, FCT_BNHD, 1, 1, H, 3);
    fct_tensor_poison(&o);
    fct_tensor_poison(&lse);
    for (int h = 0; h < H; h++)
      for (int x = 0; x < D; x++) fct_store(FLASHCL_F16, q.host, fct_tensor_index(&q, 0, 0, h, x), x == h ? 1.0f : 0.0f);
    cl_int err = clEnqueueWriteBuffer(env->queue, q.t.buffer, CL_TRUE, 0, q.bytes, q.host, 0, NULL, NULL);
    FCT_CHECK(err == CL_SUCCESS, "clEnqueueWriteBuffer: %d", (int)err);
    qbuf kc, vc, ksc, vsc;
    qbuf_make(&kc, rb);
    qbuf_make(&vc, rb);
    float kval[D];
    uint8_t vcode[D], kcode[D];
    for (int x = 0; x < D; x++) {
      /* int4: the 16 codes eight times, in the other order in the second call */
      const uint8_t c = (uint8_t)(fmt == I4 ? (half ? 15 - x % 16 : x % 16) : 128 * half + x);
      vcode[x] = c;
      kcode[x] = isfinite(kvq_ref_decode(fmt, c)) ? c : 0;
      kval[x] = kvq_ref_decode(fmt, kcode[x]);
      kvq_ref_put(fmt, vc.host, (size_t)x, vcode[x]);
      kvq_ref_put(fmt, kc.host, (size_t)x, kcode[x]);
    }
    qbuf_make(&ksc, 4);
    qbuf_make(&vsc, 4);
    set_f32(&ksc, 0, ks);
    set_f32(&vsc, 0, vs);
    qbuf_upload(&kc);
    qbuf_upload(&vc);
    qbuf_upload(&ksc);
    qbuf_upload(&vsc);
    flashcl_tensor kt, vt;
    flashcl_tensor_init_bnhd(&kt, kc.mem, 0, fmt, 1, 1, 1, (int64_t)rb);
    flashcl_tensor_init_bnhd(&vt, vc.mem, 0, fmt, 1, 1, 1, (int64_t)rb);
    cl_mem lens;
    flashcl_decode_desc desc;
    one_key_call(&desc, &lens, ksc.mem, kkind, vsc.mem, vkind);
    desc.score.scale = scale;
    flashcl_config cfg;
    FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &q.t, &kt, &vt, &cfg), FLASHCL_SUCCESS, "config");
    FCT_CHECK(!fct_device_requires_mma(env->device, what, sizeof what) || strcmp(cfg.kernel, "decode_mma") == 0,
              "every %s code: kernel %s on an %s", fct_dtype_str(fmt), cfg.kernel, what);
    FCT_CHECK_STATUS(flashcl_attention_decode(env->ctx, &desc, &q.t, &kt, &vt, lens, &o.t, &lse.t, 0, NULL, NULL),
                     FLASHCL_SUCCESS, "decode of every %s code", fct_dtype_str(fmt));
    fct_finish();
    fct_tensor_download(&o);
    fct_tensor_download(&lse);
    int bad = 0;
    for (int h = 0; h < H && bad < 4; h++) {
      for (int x = 0; x < D && bad < 4; x++) {
        const float want = kvq_ref_decode(fmt, vcode[x]) * vs, got = (float)fct_tensor_get(&o, 0, 0, h, x);
        if (isnan(want) ? !isnan(got) : got != want) {
          bad++;
          print_message("  %s %s V code 0x%02x (head %d, %s): o %.9g, the format says %.9g\n", fct_dtype_str(fmt),
                        cfg.kernel, vcode[x], h, vkind == TOK ? "TOKEN" : "TENSOR", (double)got, (double)want);
        }
      }
      const double want = (double)kval[h] * ks * scale, got = fct_tensor_get(&lse, 0, 0, h, 0);
      if (!(fabs(got - want) <= 1e-6 * fabs(want) + 1e-30)) {
        bad++;
        print_message("  %s %s K code 0x%02x: LSE %.9g, want %.9g\n", fct_dtype_str(fmt), cfg.kernel, kcode[h], got,
                      want);
      }
    }
    FCT_CHECK(bad == 0, "every %s code through %s: %d mismatches (first ones above)", fct_dtype_str(fmt), cfg.kernel, bad);
    clReleaseMemObject(lens);
    qbuf_free(&kc);
    qbuf_free(&vc);
    qbuf_free(&ksc);
    qbuf_free(&vsc);
    fct_tensor_release(&q);
    fct_tensor_release(&o);
    fct_tensor_release(&lse);
  }
}

/* Each format's tests (state: its fmt_case): the kernel AUTO runs with TOKEN
 * scales, then with the uniform (K, V) kinds named here. */
typedef struct fmt_case {
  const char *name;
  flashcl_dtype fmt;
  flashcl_kv_scale k2, v2;
} fmt_case;
enum { NFMT = 4 };
static const fmt_case FMTS[NFMT] = {
    {"i8", I8, HEAD, TENS}, {"e4m3", E4, TENS, HEAD}, {"e5m2", E5, HEAD, TENS}, {"i4x2", I4, TENS, HEAD}};

static void test_mma_codes(void **state) {
  const fmt_case *f = (const fmt_case *)*state;
  mma_decodes_codes(f->fmt, TOK, TOK);
  mma_decodes_codes(f->fmt, f->k2, f->v2);
}
static void test_device_decode(void **state) { device_decodes_codes(((const fmt_case *)*state)->fmt); }

/* Values that probe the encoder: every code's value, the midpoints between
 * neighbouring codes (ties) and a hair either side, past the largest, zeros,
 * inf and NaN, times the scale s. Returns the count. */
static int encoder_probes(flashcl_dtype fmt, float s, float *out, int cap) {
  int n = 0;
#define PUT(v) \
  if (n < cap) out[n++] = (v)
  for (int c = 0; c < 256; c++) {
    const float v = kvq_ref_decode(fmt, (uint8_t)c), w = kvq_ref_decode(fmt, (uint8_t)(c + 1));
    PUT(v * s);
    if (c == 0x7f || c == 0xff || !isfinite(v) || !isfinite(w)) continue;
    const float mid = 0.5f * (v + w);
    PUT(mid * s);
    PUT(nextafterf(mid, INFINITY) * s);
    PUT(nextafterf(mid, -INFINITY) * s);
  }
  PUT(1e30f);
  PUT(-1e30f);
  PUT(INFINITY);
  PUT(-INFINITY);
  PUT(NAN);
  PUT(0.0f);
  PUT(-0.0f);
  PUT(kvq_ref_qmax(fmt) * 1.01f * s);
#undef PUT
  return n;
}

/* The append of the probes (K quantized, TENSOR scale 0.5, so that x / s is
 * exact) writes the host encoder's codes, bit for bit; V is a plain copy. */
static void device_encodes(flashcl_dtype fmt) {
  fct_env *env = fct_env_get();
  const int d = 256, T = 8;
  float *probe = calloc((size_t)T * d, sizeof(float));
  const int n = encoder_probes(fmt, 0.5f, probe, T * d);
  FCT_CHECK(n > 256 && n <= T * d, "%d probes", n);
  fct_tensor kn, vn, vc;
  const int64_t shape[4] = {1, T, 1, d}, stride[4] = {(int64_t)T * d, d, d, 1};
  fct_tensor_create_custom(&kn, FLASHCL_F32, (size_t)T * d * 4, 0, shape, stride);
  fct_tensor_create_custom(&vn, FLASHCL_F32, (size_t)T * d * 4, 0, shape, stride);
  fct_tensor_create_custom(&vc, FLASHCL_F32, (size_t)T * d * 4, 0, shape, stride);
  memcpy(kn.host, probe, (size_t)T * d * 4);
  memcpy(vn.host, probe, (size_t)T * d * 4);
  FCT_CHECK(clEnqueueWriteBuffer(env->queue, kn.t.buffer, CL_TRUE, 0, kn.bytes, kn.host, 0, NULL, NULL) == CL_SUCCESS &&
                clEnqueueWriteBuffer(env->queue, vn.t.buffer, CL_TRUE, 0, vn.bytes, vn.host, 0, NULL, NULL) ==
                    CL_SUCCESS,
            "upload");
  qbuf kc, sc;
  qbuf_make(&kc, (size_t)T * kvq_ref_row_bytes(fmt, (size_t)d));
  memset(kc.host, 0xff, kc.bytes);
  qbuf_upload(&kc);
  qbuf_make(&sc, 4);
  set_f32(&sc, 0, 0.5f);
  qbuf_upload(&sc);
  flashcl_tensor kt;
  flashcl_tensor_init_bnhd(&kt, kc.mem, 0, fmt, 1, T, 1, (int64_t)kvq_ref_row_bytes(fmt, (size_t)d));
  const int32_t zero = 0;
  cl_mem lens = fct_create_buffer(4, &zero);
  flashcl_decode_desc desc;
  flashcl_decode_desc_init(&desc);
  desc.cache.k_scale = sc.mem;
  desc.cache.k_scale_kind = TENS;
  FCT_CHECK_STATUS(flashcl_kv_cache_append(env->ctx, FCT_APPEND_DESC(&desc), &kn.t, &vn.t, &kt, &vc.t, lens, 0, NULL, NULL),
                   FLASHCL_SUCCESS, "append of the %s probes", fct_dtype_str(fmt));
  fct_finish();
  unsigned char *got = malloc(kc.bytes);
  qbuf_download(&kc, got);
  for (int i = 0; i < T * d; i++) {
    /* Rows are dense, so element i of the flat probe list is code i. */
    const uint8_t want = kvq_ref_encode(fmt, probe[i], 0.5f), have = kvq_ref_get(fmt, got, (size_t)i);
    if (isnan(probe[i]) && fmt != I8 && fmt != I4) { /* the sign of a NaN quotient is not defined */
      FCT_CHECK(isnan(kvq_ref_decode(fmt, have)), "%s: NaN encodes as 0x%02x", fct_dtype_str(fmt), have);
      continue;
    }
    FCT_CHECK(have == want, "%s: %.9g / 0.5 encodes as 0x%02x on the device, 0x%02x on the host", fct_dtype_str(fmt),
              (double)probe[i], have, want);
  }
  fct_tensor_download(&vc);
  FCT_CHECK(memcmp(vc.host, probe, vc.bytes) == 0, "the plain V side is not a bit-exact copy");
  free(got);
  free(probe);
  clReleaseMemObject(lens);
  qbuf_free(&kc);
  qbuf_free(&sc);
  fct_tensor_release(&kn);
  fct_tensor_release(&vn);
  fct_tensor_release(&vc);
}

static void test_device_encode(void **state) { device_encodes(((const fmt_case *)*state)->fmt); }

/* ------------------------------------------------------------ bad input -- */

/* A valid quantized call (I8 caches, TOKEN scales, one sequence of 8 keys),
 * its outputs poisoned. */
typedef struct qerr {
  fct_tensor q, o, lse, kn, vn;
  qbuf kc, vc, ks, vs;
  flashcl_tensor kt, vt;
  cl_mem lens;
  flashcl_decode_desc desc;
} qerr;

static void qerr_make(qerr *f) {
  fct_rng rng;
  fct_rng_init(&rng, "decode_quant/errors");
  const int L = 8, d = 8;
  memset(f, 0, sizeof *f);
  fct_tensor_create(&f->q, FLASHCL_F32, FCT_BNHD, 1, 1, 1, d, 1);
  fct_tensor_create(&f->o, FLASHCL_F32, FCT_BNHD, 1, 1, 1, d, 2);
  fct_tensor_create_lse(&f->lse, FCT_BNHD, 1, 1, 1, 3);
  fct_tensor_create(&f->kn, FLASHCL_F32, FCT_BNHD, 1, 1, 1, d, 4);
  fct_tensor_create(&f->vn, FLASHCL_F32, FCT_BNHD, 1, 1, 1, d, 5);
  fct_tensor_fill_random(&f->q, &rng);
  fct_tensor_fill_random(&f->kn, &rng);
  fct_tensor_fill_random(&f->vn, &rng);
  qbuf *codes[2] = {&f->kc, &f->vc}, *scales[2] = {&f->ks, &f->vs};
  for (int i = 0; i < 2; i++) {
    qbuf_make(codes[i], (size_t)L * d);
    for (int e = 0; e < L * d; e++) codes[i]->host[e] = (unsigned char)(fct_rng_u64(&rng) % 255);
    qbuf_upload(codes[i]);
    qbuf_make(scales[i], (size_t)L * 4);
    for (int e = 0; e < L; e++) set_f32(scales[i], (size_t)e, 0.01f * (float)(e + 1));
    qbuf_upload(scales[i]);
  }
  flashcl_tensor_init_bnhd(&f->kt, f->kc.mem, 0, I8, 1, L, 1, d);
  flashcl_tensor_init_bnhd(&f->vt, f->vc.mem, 0, I8, 1, L, 1, d);
  const int32_t len = L;
  f->lens = fct_create_buffer(4, &len);
  flashcl_decode_desc_init(&f->desc);
  f->desc.cache.k_scale = f->ks.mem;
  f->desc.cache.v_scale = f->vs.mem;
}

static void qerr_free(qerr *f) {
  fct_tensor_release(&f->q);
  fct_tensor_release(&f->o);
  fct_tensor_release(&f->lse);
  fct_tensor_release(&f->kn);
  fct_tensor_release(&f->vn);
  qbuf_free(&f->kc);
  qbuf_free(&f->vc);
  qbuf_free(&f->ks);
  qbuf_free(&f->vs);
  clReleaseMemObject(f->lens);
}

/* Every byte of the fixture's outputs (o, lse, the caches and scales an
 * append would write) as it was. */
static void qerr_untouched(qerr *f, const char *what) {
  FCT_CHECK(strlen(flashcl_context_last_error(fct_env_get()->ctx)) > 0, "%s: no message", what);
  fct_finish();
  fct_tensor_download(&f->o);
  fct_tensor_download(&f->lse);
  FCT_CHECK(fct_tensor_count_unpoisoned(&f->o) == 0 && fct_tensor_count_unpoisoned(&f->lse) == 0,
            "%s: a refused call wrote o or lse", what);
  qbuf *bufs[4] = {&f->kc, &f->vc, &f->ks, &f->vs};
  for (int i = 0; i < 4; i++) {
    unsigned char *got = malloc(bufs[i]->bytes);
    qbuf_download(bufs[i], got);
    FCT_CHECK(memcmp(got, bufs[i]->host, bufs[i]->bytes) == 0, "%s: a refused call wrote a cache or scale buffer",
              what);
    free(got);
  }
}

static void test_quant_errors(void **state) {
  (void)state;
  flashcl_context *ctx = fct_env_get()->ctx;
  qerr f;
  qerr_make(&f);
  flashcl_decode_desc d;
  flashcl_status st;
#define DEC(desc, q, kc, vc, o) flashcl_attention_decode(ctx, desc, q, kc, vc, f.lens, o, &f.lse.t, 0, NULL, NULL)
#define APP(desc, kn, vn, kc, vc) flashcl_kv_cache_append(ctx, FCT_APPEND_DESC(desc), kn, vn, kc, vc, f.lens, 0, NULL, NULL)
#define EXPECT(call, status, what)            \
  do {                                        \
    st = (call);                              \
    FCT_CHECK_STATUS(st, status, "%s", what); \
    qerr_untouched(&f, what);                 \
  } while (0)

  /* The fixture is valid: decode runs (and is then forgotten). The append is
   * not run: its seqlens (8) point past this cache's capacity. */
  st = DEC(&f.desc, &f.q.t, &f.kt, &f.vt, &f.o.t);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "valid quantized fixture");
  fct_finish();
  fct_tensor_poison(&f.o);
  fct_tensor_poison(&f.lse);

  d = f.desc;
  d.cache.k_scale = NULL;
  EXPECT(DEC(&d, &f.q.t, &f.kt, &f.vt, &f.o.t), FLASHCL_ERROR_INVALID_ARGUMENT, "decode: k_cache without k_scale");
  FCT_CHECK(strstr(flashcl_context_last_error(ctx), "desc.cache.k_scale is NULL") != NULL, "message: %s",
            flashcl_context_last_error(ctx));
  EXPECT(APP(&d, &f.kn.t, &f.vn.t, &f.kt, &f.vt), FLASHCL_ERROR_INVALID_ARGUMENT, "append: k_cache without k_scale");
  FCT_CHECK(strstr(flashcl_context_last_error(ctx), "desc.cache.k_scale is NULL") != NULL, "message: %s",
            flashcl_context_last_error(ctx));
  d = f.desc;
  d.cache.v_scale = NULL;
  EXPECT(DEC(&d, &f.q.t, &f.kt, &f.vt, &f.o.t), FLASHCL_ERROR_INVALID_ARGUMENT, "decode: v_cache without v_scale");
  {
    /* One float short of the TOKEN layout (8 rows): BUFFER_TOO_SMALL. */
    const float z[7] = {0};
    cl_mem shortbuf = fct_create_buffer(sizeof z, z);
    d = f.desc;
    d.cache.v_scale = shortbuf;
    EXPECT(DEC(&d, &f.q.t, &f.kt, &f.vt, &f.o.t), FLASHCL_ERROR_BUFFER_TOO_SMALL, "decode: v_scale too small");
    EXPECT(APP(&d, &f.kn.t, &f.vn.t, &f.kt, &f.vt), FLASHCL_ERROR_BUFFER_TOO_SMALL, "append: v_scale too small");
    d = f.desc;
    d.cache.k_scale = shortbuf;
    EXPECT(DEC(&d, &f.q.t, &f.kt, &f.vt, &f.o.t), FLASHCL_ERROR_BUFFER_TOO_SMALL, "decode: k_scale too small");
    clReleaseMemObject(shortbuf);
  }
  d = f.desc;
  d.cache.k_scale_kind = (flashcl_kv_scale)7;
  EXPECT(DEC(&d, &f.q.t, &f.kt, &f.vt, &f.o.t), FLASHCL_ERROR_INVALID_ARGUMENT, "decode: k_scale_kind 7");
  d = f.desc;
  d.cache.v_scale_kind = (flashcl_kv_scale)-1;
  EXPECT(APP(&d, &f.kn.t, &f.vn.t, &f.kt, &f.vt), FLASHCL_ERROR_INVALID_ARGUMENT, "append: v_scale_kind -1");
  /* BLOCK32 scales need a head dim that is a multiple of 32 (the fixture's is 8). */
  d = f.desc;
  d.cache.k_scale_kind = BLK;
  EXPECT(DEC(&d, &f.q.t, &f.kt, &f.vt, &f.o.t), FLASHCL_ERROR_INVALID_SHAPE, "decode: BLOCK32 k_scale at d = 8");
  FCT_CHECK(strstr(flashcl_context_last_error(ctx), "multiple of 32") != NULL, "message: %s",
            flashcl_context_last_error(ctx));
  d = f.desc;
  d.cache.v_scale_kind = BLK;
  EXPECT(APP(&d, &f.kn.t, &f.vn.t, &f.kt, &f.vt), FLASHCL_ERROR_INVALID_SHAPE, "append: BLOCK32 v_scale at d = 8");
  /* A scale buffer the call reads must not be its output. */
  d = f.desc;
  d.cache.k_scale = f.o.t.buffer;
  d.cache.k_scale_kind = TENS;
  EXPECT(DEC(&d, &f.q.t, &f.kt, &f.vt, &f.o.t), FLASHCL_ERROR_INVALID_ARGUMENT, "decode: k_scale is o's buffer");
  /* A TOKEN scale the append writes must not be an input. */
  d = f.desc;
  d.cache.v_scale = f.kn.t.buffer;
  EXPECT(APP(&d, &f.kn.t, &f.vn.t, &f.kt, &f.vt), FLASHCL_ERROR_INVALID_ARGUMENT, "append: v_scale is k_new's buffer");

  /* Quantized dtypes anywhere but a cache. */
  flashcl_tensor t = f.q.t;
  t.dtype = I8;
  EXPECT(DEC(&f.desc, &t, &f.kt, &f.vt, &f.o.t), FLASHCL_ERROR_DTYPE_MISMATCH, "decode: q i8");
  t = f.o.t;
  t.dtype = E4;
  EXPECT(DEC(&f.desc, &f.q.t, &f.kt, &f.vt, &t), FLASHCL_ERROR_DTYPE_MISMATCH, "decode: o f8e4m3");
  t = f.kn.t;
  t.dtype = E5;
  EXPECT(APP(&f.desc, &t, &f.vn.t, &f.kt, &f.vt), FLASHCL_ERROR_DTYPE_MISMATCH, "append: k_new f8e5m2");
  t = f.q.t;
  t.dtype = I4;
  EXPECT(DEC(&f.desc, &t, &f.kt, &f.vt, &f.o.t), FLASHCL_ERROR_DTYPE_MISMATCH, "decode: q i4x2");
  {
    /* An int4 cache counts bytes: shape[3] is d / 2. The fixture's d-element
     * rows read as i4x2 hold 2 d values, which is not q's head dim. */
    flashcl_tensor k4 = f.kt, v4 = f.vt;
    k4.dtype = I4;
    EXPECT(DEC(&f.desc, &f.q.t, &k4, &f.vt, &f.o.t), FLASHCL_ERROR_INVALID_SHAPE, "decode: i4x2 k_cache of d bytes");
    FCT_CHECK(strstr(flashcl_context_last_error(ctx), "i4x2") != NULL, "message: %s", flashcl_context_last_error(ctx));
    v4.dtype = I4;
    EXPECT(APP(&f.desc, &f.kn.t, &f.vn.t, &f.kt, &v4), FLASHCL_ERROR_INVALID_SHAPE, "append: i4x2 v_cache of d bytes");
  }
  {
    /* A plain side must still be q's dtype: V as 4 rows of f16 (the same 64 bytes). */
    flashcl_tensor vf, kf;
    flashcl_tensor_init_bnhd(&vf, f.vc.mem, 0, FLASHCL_F16, 1, 4, 1, 8);
    flashcl_tensor_init_bnhd(&kf, f.kc.mem, 0, I8, 1, 4, 1, 8);
    EXPECT(DEC(&f.desc, &f.q.t, &kf, &vf, &f.o.t), FLASHCL_ERROR_DTYPE_MISMATCH, "decode: plain f16 v_cache, q f32");
  }
  {
    flashcl_attention_desc ad;
    flashcl_attention_desc_init(&ad);
    flashcl_tensor q8 = f.q.t, k8 = f.kt;
    q8.dtype = I8;
    EXPECT(flashcl_attention_forward(ctx, &ad, &q8, &f.kt, &f.vt, &f.o.t, NULL, 0, NULL, NULL),
           FLASHCL_ERROR_DTYPE_MISMATCH, "forward: q i8");
    k8.shape[1] = 1;
    EXPECT(flashcl_attention_forward(ctx, &ad, &f.q.t, &k8, &k8, &f.o.t, NULL, 0, NULL, NULL),
           FLASHCL_ERROR_DTYPE_MISMATCH, "forward: k/v i8 (a quantized cache is for decode only)");
    flashcl_tensor oa = f.q.t;
    oa.dtype = E4;
    EXPECT(flashcl_merge_states(ctx, &oa, &f.lse.t, &f.q.t, &f.lse.t, &f.o.t, NULL, 0, NULL, NULL),
           FLASHCL_ERROR_DTYPE_MISMATCH, "merge: o_a f8e4m3");
    flashcl_block_plan bp;
    FCT_CHECK_STATUS(flashcl_attention_block_plan(ctx, 64, I8, 0, 0, &bp), FLASHCL_ERROR_DTYPE_MISMATCH,
                     "block plan for i8");
  }
  FCT_CHECK(strcmp(flashcl_dtype_name(I8), "i8") == 0 && strcmp(flashcl_dtype_name(E4), "f8e4m3") == 0 &&
                strcmp(flashcl_dtype_name(E5), "f8e5m2") == 0 && flashcl_dtype_size(I8) == 1 &&
                flashcl_dtype_size(E4) == 1 && flashcl_dtype_size(E5) == 1 && strcmp(flashcl_dtype_name(I4), "i4x2") == 0 &&
                flashcl_dtype_size(I4) == 1 && flashcl_dtype_size((flashcl_dtype)7) == 0,
            "dtype names and sizes");
  {
    flashcl_decode_desc dd;
    flashcl_decode_desc_init(&dd);
    FCT_CHECK(dd.cache.k_scale == NULL && dd.cache.v_scale == NULL && dd.cache.k_scale_kind == TOK && dd.cache.v_scale_kind == TOK,
              "decode desc defaults of the scale fields");
  }
#undef EXPECT
#undef APP
#undef DEC
  qerr_free(&f);
}

int main(void) {
  enum { NQ = sizeof QCASES / sizeof QCASES[0] };
  struct CMUnitTest tests[NQ + 3 * NFMT + 2];
  size_t n = 0;
  tests[n++] = (struct CMUnitTest){"quant_host_formats", test_host_formats, NULL, NULL, NULL};
  static char names[3][NFMT][40];
  static const char *const kinds[3] = {"quant_device_decode_", "quant_kernel_codes_", "quant_device_encode_"};
  void (*const funcs[3])(void **) = {test_device_decode, test_mma_codes, test_device_encode};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < NFMT; i++) {
      snprintf(names[k][i], sizeof names[k][i], "%s%s", kinds[k], FMTS[i].name);
      tests[n++] = (struct CMUnitTest){names[k][i], funcs[k], NULL, NULL, (void *)&FMTS[i]};
    }
  for (size_t i = 0; i < NQ; i++)
    tests[n++] = (struct CMUnitTest){QCASES[i].name, test_quant_case, NULL, NULL, (void *)&QCASES[i]};
  tests[n++] = (struct CMUnitTest){"quant_errors", test_quant_errors, NULL, NULL, NULL};
  return fct_run_group("decode_quant", tests, n, 1);
}
