/* Tensor views, the attention descriptor, and argument validation.
 *
 * Everything a kernel could trip over is checked here, before anything is
 * enqueued, so a failed call has no side effects on the device. */
#include "internal.h"

#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

size_t flashcl_dtype_size(flashcl_dtype dtype) {
  switch (dtype) {
  case FLASHCL_F32: return 4;
  case FLASHCL_F16: return 2;
  case FLASHCL_BF16: return 2;
  }
  return 0;
}

const char *flashcl_dtype_name(flashcl_dtype dtype) {
  switch (dtype) {
  case FLASHCL_F32: return "f32";
  case FLASHCL_F16: return "f16";
  case FLASHCL_BF16: return "bf16";
  }
  return "invalid";
}

/* a * b * c (a * b when c is 1) for the contiguous strides. Dimensions below 1
 * are left to the operations' validation, which names them (INVALID_SHAPE);
 * their product is formed in unsigned arithmetic, where wrapping is defined. A
 * product of positive dimensions past INT64_MAX is an overflow. */
static int fcl_stride_product(int64_t a, int64_t b, int64_t c, int64_t *out) {
  if (a < 1 || b < 1 || c < 1) {
    *out = (int64_t)((uint64_t)a * (uint64_t)b * (uint64_t)c);
    return 1;
  }
  if (a > INT64_MAX / b || a * b > INT64_MAX / c) return 0;
  *out = a * b * c;
  return 1;
}

/* The contiguous strides of (d0, d1, d2, d3) in memory order perm (outermost
 * first): 0 when their products overflow int64. */
static int fcl_contiguous_strides(const int64_t shape[4], const int order[4], int64_t stride[4]) {
  int64_t s[4];
  s[order[3]] = 1;
  if (!fcl_stride_product(shape[order[3]], 1, 1, &s[order[2]]) ||
      !fcl_stride_product(shape[order[3]], shape[order[2]], 1, &s[order[1]]) ||
      !fcl_stride_product(shape[order[3]], shape[order[2]], shape[order[1]], &s[order[0]]))
    return 0;
  memcpy(stride, s, sizeof s);
  return 1;
}

static flashcl_status fcl_tensor_fill(flashcl_tensor *t, cl_mem buffer, size_t offset, flashcl_dtype dtype,
                                      int64_t b, int64_t n, int64_t h, int64_t d) {
  if (!t) return FLASHCL_ERROR_INVALID_ARGUMENT;
  memset(t, 0, sizeof *t);
  t->buffer = buffer;
  t->offset = offset;
  t->dtype = dtype;
  t->shape[0] = b;
  t->shape[1] = n;
  t->shape[2] = h;
  t->shape[3] = d;
  return FLASHCL_SUCCESS;
}

/* Fills *t as a contiguous view whose dimensions lie in memory in `order`
 * (outermost first). Nothing is written when the strides overflow. */
static flashcl_status fcl_tensor_init(flashcl_tensor *t, cl_mem buffer, size_t offset, flashcl_dtype dtype,
                                      const int64_t shape[4], const int order[4]) {
  int64_t stride[4];
  if (!t) return FLASHCL_ERROR_INVALID_ARGUMENT;
  if (!fcl_contiguous_strides(shape, order, stride)) return FLASHCL_ERROR_OVERFLOW;
  fcl_tensor_fill(t, buffer, offset, dtype, shape[0], shape[1], shape[2], shape[3]);
  memcpy(t->stride, stride, sizeof stride);
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_tensor_init_bnhd(flashcl_tensor *t, cl_mem buffer, size_t offset, flashcl_dtype dtype,
                                        int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  const int64_t shape[4] = {batch, seqlen, heads, head_dim};
  static const int order[4] = {0, 1, 2, 3};
  return fcl_tensor_init(t, buffer, offset, dtype, shape, order);
}

flashcl_status flashcl_tensor_init_bhnd(flashcl_tensor *t, cl_mem buffer, size_t offset, flashcl_dtype dtype,
                                        int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  const int64_t shape[4] = {batch, seqlen, heads, head_dim};
  static const int order[4] = {0, 2, 1, 3};
  return fcl_tensor_init(t, buffer, offset, dtype, shape, order);
}

flashcl_status flashcl_tensor_init_lse(flashcl_tensor *t, cl_mem buffer, size_t offset, int64_t batch,
                                       int64_t seqlen, int64_t heads) {
  /* (batch, heads, seqlen) in memory, with a unit "head_dim" of stride 1. */
  const int64_t shape[4] = {batch, seqlen, heads, 1};
  static const int order[4] = {0, 2, 1, 3};
  return fcl_tensor_init(t, buffer, offset, FLASHCL_F32, shape, order);
}

void flashcl_attention_desc_init(flashcl_attention_desc *desc) {
  if (!desc) return;
  memset(desc, 0, sizeof *desc);
  desc->algo = FLASHCL_ALGO_AUTO;
  desc->kernel = FLASHCL_KERNEL_AUTO;
  desc->deterministic = 1;
  desc->window_left = -1;
  desc->window_right = -1;
}

int fcl_vec_aligned(const flashcl_tensor *t) {
  if (!t || t->offset % (4 * flashcl_dtype_size(t->dtype))) return 0;
  for (int i = 0; i < 3; i++)
    if (t->stride[i] % 4) return 0;
  return 1;
}

flashcl_status fcl_buffer_size(flashcl_context *ctx, cl_mem m, const char *name, size_t *size) {
  cl_mem_object_type type = 0;
  cl_context owner = NULL;
  cl_int err = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof *size, size, NULL);
  if (err == CL_SUCCESS) err = clGetMemObjectInfo(m, CL_MEM_TYPE, sizeof type, &type, NULL);
  if (err == CL_SUCCESS) err = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
  if (err != CL_SUCCESS)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s is not a valid cl_mem (%s)", name,
                    fcl_cl_error_name(err));
  if (type != CL_MEM_OBJECT_BUFFER)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s is not a buffer object (an image or a pipe)", name);
  if (owner != ctx->context)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                    "%s belongs to another cl_context than the flashcl context's", name);
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_check_tensor(flashcl_context *ctx, const flashcl_tensor *t, const char *name,
                                int need_unit_last_stride) {
  static const char *dims[4] = {"batch", "seqlen", "heads", "head_dim"};
  if (!t) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
  if (!t->buffer) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s.buffer is NULL", name);
  size_t es = flashcl_dtype_size(t->dtype);
  if (es == 0) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s has an unknown dtype %d", name, (int)t->dtype);
  for (int i = 0; i < 4; i++) {
    if (t->shape[i] <= 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "%s.shape[%d] (%s) is %lld; every dimension must be >= 1",
                      name, i, dims[i], (long long)t->shape[i]);
    if (t->shape[i] > INT_MAX)
      return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "%s.shape[%d] (%s) = %lld exceeds the int32 range", name, i,
                      dims[i], (long long)t->shape[i]);
    if (t->stride[i] < 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_STRIDE, "%s.stride[%d] (%s) is negative (%lld)", name, i, dims[i],
                      (long long)t->stride[i]);
  }
  if (need_unit_last_stride && t->stride[3] != 1)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_STRIDE, "%s.stride[3] (head_dim) must be 1, got %lld", name,
                    (long long)t->stride[3]);
  if (t->offset % es != 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s.offset %zu is not a multiple of the element size %zu",
                    name, t->offset, es);
  /* Last element index, then bytes, all overflow-checked. */
  size_t last = 0;
  for (int i = 0; i < 4; i++) {
    size_t term;
    if (!fcl_mul_size((size_t)(t->shape[i] - 1), (size_t)t->stride[i], &term) || !fcl_add_size(last, term, &last))
      return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "%s: shape x stride overflows size_t", name);
  }
  size_t end;
  if (!fcl_add_size(last, 1, &end) || !fcl_mul_size(end, es, &end) || !fcl_add_size(end, t->offset, &end))
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "%s: byte extent overflows size_t", name);
  size_t mem_size = 0;
  char what[64];
  snprintf(what, sizeof what, "%s.buffer", name);
  flashcl_status st = fcl_buffer_size(ctx, t->buffer, what, &mem_size);
  if (st != FLASHCL_SUCCESS) return st;
  if (end > mem_size)
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                    "%s needs %zu bytes (offset %zu + extent) but its cl_mem holds %zu", name, end, t->offset,
                    mem_size);
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_check_variants(flashcl_context *ctx, int window_left, int window_right, float softcap,
                                  cl_mem alibi_slopes, int64_t hq) {
  if (window_left < -1 || window_right < -1)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                    "desc.window_left/window_right (%d, %d) must be -1 (unbounded) or >= 0", window_left,
                    window_right);
  if (!(softcap >= 0.0f) || !isfinite(softcap))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.softcap must be 0 (off) or finite and > 0, got %g",
                    (double)softcap);
  if (alibi_slopes) {
    size_t have = 0, need = (size_t)hq * sizeof(float);
    flashcl_status st = fcl_buffer_size(ctx, alibi_slopes, "desc.alibi_slopes", &have);
    if (st != FLASHCL_SUCCESS) return st;
    if (have < need)
      return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                      "desc.alibi_slopes needs %zu bytes (heads_q = %lld floats) but holds %zu", need, (long long)hq,
                      have);
  }
  return FLASHCL_SUCCESS;
}

/* Byte range [begin, end) a validated tensor can touch. */
static void fcl_byte_range(const flashcl_tensor *t, size_t *begin, size_t *end) {
  size_t last = 0;
  for (int i = 0; i < 4; i++) last += (size_t)(t->shape[i] - 1) * (size_t)t->stride[i];
  *begin = t->offset;
  *end = t->offset + (last + 1) * flashcl_dtype_size(t->dtype);
}

static int fcl_same_view(const flashcl_tensor *a, const flashcl_tensor *b) {
  if (a->buffer != b->buffer || a->offset != b->offset || a->dtype != b->dtype) return 0;
  for (int i = 0; i < 4; i++)
    if (a->shape[i] != b->shape[i] || a->stride[i] != b->stride[i]) return 0;
  return 1;
}

/* Bytes a view spans within one period S (bytes): its dims whose byte stride is
 * a multiple of S only move it by whole periods; the others add their extent.
 * Returns the span, which is > S when the view does not fit in a period. */
static uint64_t fcl_inner_span(const flashcl_tensor *t, uint64_t S) {
  const uint64_t es = flashcl_dtype_size(t->dtype);
  uint64_t span = es;
  for (int i = 0; i < 4; i++) {
    const uint64_t st = (uint64_t)t->stride[i] * es;
    if (t->shape[i] > 1 && st % S) span += (uint64_t)(t->shape[i] - 1) * st;
  }
  return span;
}

/* 1 if the two views provably touch no common byte although their byte ranges
 * overlap: for some period S (a byte stride of either view), every element of
 * each lies in a window [offset, offset + span) modulo S, and the two windows
 * are disjoint on the circle of length S. This admits interleaved layouts such
 * as a packed QKV / dQKV or a K|V page pool ([pages][2][page][H][d]). */
static int fcl_views_interleave(const flashcl_tensor *a, const flashcl_tensor *b) {
  const flashcl_tensor *v[2] = {a, b};
  for (int w = 0; w < 2; w++)
    for (int i = 0; i < 4; i++) {
      if (v[w]->shape[i] <= 1 || v[w]->stride[i] <= 0) continue;
      const uint64_t S = (uint64_t)v[w]->stride[i] * flashcl_dtype_size(v[w]->dtype);
      const uint64_t ea = fcl_inner_span(a, S), eb = fcl_inner_span(b, S);
      if (ea + eb > S) continue;
      const uint64_t ra = a->offset % S, rb = b->offset % S;
      /* Disjoint arcs [ra, ra + ea) and [rb, rb + eb) on a circle of length S. */
      const uint64_t d = (rb + S - ra) % S; /* b's start, seen from a's */
      if (d >= ea && d + eb <= S) return 1;
    }
  return 0;
}

/* 1 if out and in share bytes of one cl_mem without being the same view
 * (identical views are allowed when allow_same). */
int fcl_views_conflict(const flashcl_tensor *out, const flashcl_tensor *in, int allow_same) {
  if (!out || !in || out->buffer != in->buffer) return 0;
  if (allow_same && fcl_same_view(out, in)) return 0;
  size_t ob, oe, ib, ie;
  fcl_byte_range(out, &ob, &oe);
  fcl_byte_range(in, &ib, &ie);
  if (!(ob < ie && ib < oe)) return 0;
  return !fcl_views_interleave(out, in);
}

/* 1 if two different indices of the view can name the same element: sorted by
 * stride, each dimension of size > 1 must step past the whole extent of the
 * smaller ones (sufficient; a zero stride on a dimension of size > 1 fails). */
static int fcl_view_self_overlaps(const flashcl_tensor *t) {
  int idx[4] = {0, 1, 2, 3};
  for (int i = 1; i < 4; i++)
    for (int j = i; j > 0 && t->stride[idx[j]] < t->stride[idx[j - 1]]; j--) {
      const int x = idx[j];
      idx[j] = idx[j - 1];
      idx[j - 1] = x;
    }
  uint64_t extent = 0; /* last element offset of the dims so far */
  for (int i = 0; i < 4; i++) {
    const int k = idx[i];
    if (t->shape[k] <= 1) continue;
    if ((uint64_t)t->stride[k] <= extent) return 1;
    extent += (uint64_t)(t->shape[k] - 1) * (uint64_t)t->stride[k];
  }
  return 0;
}

int fcl_range_conflict(const flashcl_tensor *out, cl_mem m, size_t begin, size_t bytes) {
  if (!out || !m || !bytes || out->buffer != m) return 0;
  /* The range as a contiguous byte view, so that the interleave proof applies. */
  flashcl_tensor r;
  memset(&r, 0, sizeof r);
  r.buffer = m;
  r.offset = begin;
  r.dtype = FLASHCL_F16; /* 2-byte elements: any even range; odd ones round up */
  r.shape[0] = r.shape[1] = r.shape[2] = 1;
  r.shape[3] = (int64_t)((bytes + 1) / 2);
  r.stride[0] = r.stride[1] = r.stride[2] = r.shape[3];
  r.stride[3] = 1;
  return fcl_views_conflict(out, &r, 0);
}

flashcl_status fcl_check_aux_buffers(flashcl_context *ctx, const fcl_aux *aux, int naux,
                                     const flashcl_tensor *const *outs, const char *const *out_names, int nouts) {
  for (int i = 0; i < naux; i++)
    for (int j = 0; j < nouts; j++)
      if (fcl_range_conflict(outs[j], aux[i].mem, aux[i].offset, aux[i].bytes))
        return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                        "%s overlaps %s: a buffer the call reads (or, for a workspace, writes) must not share bytes "
                        "with an output",
                        aux[i].name, out_names[j]);
  return FLASHCL_SUCCESS;
}

int fcl_problem_aux(const fcl_problem *p, const flashcl_attention_desc *desc, fcl_aux *aux) {
  int n = 0;
  if (p->varlen) {
    const size_t cu = ((size_t)p->batch + 1) * sizeof(cl_int);
    aux[n++] = (fcl_aux){desc->cu_seqlens_q, 0, cu, "desc.cu_seqlens_q"};
    if (!p->paged_kv) aux[n++] = (fcl_aux){desc->cu_seqlens_k, 0, cu, "desc.cu_seqlens_k"};
  }
  if (p->alibi) aux[n++] = (fcl_aux){p->alibi, 0, (size_t)p->heads_q * sizeof(float), "desc.alibi_slopes"};
  if (p->mask_kind)
    aux[n++] = (fcl_aux){p->mask, 0, (size_t)p->mask_bstride * (size_t)p->batch * sizeof(cl_uint), "desc.mask"};
  if (p->paged_kv) {
    aux[n++] = (fcl_aux){desc->kv_block_table, 0, (size_t)p->batch * (size_t)desc->kv_max_pages * sizeof(cl_int),
                         "desc.kv_block_table"};
    aux[n++] = (fcl_aux){desc->kv_seqlens, 0, (size_t)p->batch * sizeof(cl_int), "desc.kv_seqlens"};
  }
  return n;
}

flashcl_status fcl_check_output_distinct(flashcl_context *ctx, const flashcl_tensor *t, const char *name) {
  if (t && fcl_view_self_overlaps(t))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_STRIDE,
                    "%s names one element twice (a zero or too small stride): each output element needs its own "
                    "memory",
                    name);
  return FLASHCL_SUCCESS;
}

static int fcl_same_shape(const flashcl_tensor *a, const flashcl_tensor *b) {
  return a->shape[0] == b->shape[0] && a->shape[1] == b->shape[1] && a->shape[2] == b->shape[2] &&
         a->shape[3] == b->shape[3];
}

/* The attention mask of desc against the validated sizes in p (batch, lengths,
 * heads); fills p's mask fields. */
static flashcl_status fcl_check_mask(flashcl_context *ctx, const flashcl_attention_desc *desc, fcl_problem *p) {
  if (desc->mask_kind == FLASHCL_MASK_NONE) return FLASHCL_SUCCESS;
  if (desc->mask_kind != FLASHCL_MASK_BLOCK && desc->mask_kind != FLASHCL_MASK_BITS)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.mask_kind %d is not a flashcl_mask_kind",
                    desc->mask_kind);
  if (!desc->mask) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.mask_kind is set but desc.mask is NULL");
  int bq = 1, bk = 1;
  if (desc->mask_kind == FLASHCL_MASK_BLOCK) {
    if (desc->mask_block_q <= 0 || desc->mask_block_k <= 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                      "desc.mask_block_q/mask_block_k (%d, %d) must be >= 1 for FLASHCL_MASK_BLOCK", desc->mask_block_q,
                      desc->mask_block_k);
    bq = desc->mask_block_q;
    bk = desc->mask_block_k;
  }
  const int rows = (int)(((int64_t)p->seqlen_q + bq - 1) / bq), cols = (int)(((int64_t)p->seqlen_k + bk - 1) / bk);
  const int heads = desc->mask_per_head ? p->heads_q : 1;
  const size_t words = ((size_t)cols + 31) / 32;
  size_t per_seq, need, have = 0;
  if (!fcl_mul_size(words, (size_t)rows, &per_seq) || per_seq > (size_t)INT64_MAX / 8 ||
      !fcl_mul_size(per_seq, (size_t)heads * (size_t)p->batch, &need) || !fcl_mul_size(need, 4, &need))
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "the attention mask's size overflows size_t");
  flashcl_status st = fcl_buffer_size(ctx, desc->mask, "desc.mask", &have);
  if (st != FLASHCL_SUCCESS) return st;
  if (have < need)
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                    "desc.mask needs %zu bytes (%d sequences x %d heads x %d rows x %zu words) but holds %zu", need,
                    p->batch, heads, rows, words, have);
  p->mask_kind = desc->mask_kind;
  p->mask = desc->mask;
  p->mask_bq = bq;
  p->mask_bk = bk;
  p->mask_words = (int)words;
  p->mask_hstride = desc->mask_per_head ? (int64_t)per_seq : 0;
  p->mask_bstride = (int64_t)per_seq * heads;
  return FLASHCL_SUCCESS;
}

/* The paged K/V source of desc (k/v are page pools) against p's batch; fills p's
 * paged fields and sets p->seqlen_k to the bound on the per-sequence key counts. */
static flashcl_status fcl_check_paged_kv(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                         const flashcl_tensor *k, fcl_problem *p) {
  if (desc->kv_page_size < 1 || desc->kv_page_size != k->shape[1])
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "desc.kv_page_size (%d) must be >= 1 and equal the pools' page dimension k.shape[1] (%lld)",
                    desc->kv_page_size, (long long)k->shape[1]);
  if (desc->kv_max_pages < 1)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "desc.kv_max_pages (%d) must be >= 1", desc->kv_max_pages);
  const int64_t capacity = (int64_t)desc->kv_max_pages * desc->kv_page_size;
  if (capacity > INT_MAX)
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "desc.kv_max_pages x kv_page_size exceeds the int32 range");
  if (desc->max_seqlen_k < 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "desc.max_seqlen_k (%d) must be >= 0", desc->max_seqlen_k);
  size_t need, have = 0;
  if (!fcl_mul_size((size_t)p->batch * sizeof(cl_int), (size_t)desc->kv_max_pages, &need))
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "the block table's size overflows size_t");
  flashcl_status st = fcl_buffer_size(ctx, desc->kv_block_table, "desc.kv_block_table", &have);
  if (st != FLASHCL_SUCCESS) return st;
  if (have < need)
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                    "desc.kv_block_table holds %zu bytes but batch %d x kv_max_pages %d int32 need %zu", have,
                    p->batch, desc->kv_max_pages, need);
  if (!desc->kv_seqlens)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.kv_block_table is set but desc.kv_seqlens is NULL");
  if ((st = fcl_buffer_size(ctx, desc->kv_seqlens, "desc.kv_seqlens", &have)) != FLASHCL_SUCCESS) return st;
  if (have < (size_t)p->batch * sizeof(cl_int))
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL, "desc.kv_seqlens holds %zu bytes but batch %d int32 need %zu",
                    have, p->batch, (size_t)p->batch * sizeof(cl_int));
  p->paged_kv = 1;
  p->kv_page_size = desc->kv_page_size;
  p->kv_max_pages = desc->kv_max_pages;
  p->kv_num_pages = (int)k->shape[0];
  p->kv_block_table = desc->kv_block_table;
  p->kv_seqlens = desc->kv_seqlens;
  p->seqlen_k = (desc->max_seqlen_k == 0 || desc->max_seqlen_k > capacity) ? (int)capacity : desc->max_seqlen_k;
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_check_problem(flashcl_context *ctx, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                                 const flashcl_tensor *k, const flashcl_tensor *v, const flashcl_tensor *o,
                                 const flashcl_tensor *lse, fcl_problem *p) {
  if (!desc) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
  flashcl_status st;
  if ((st = fcl_check_tensor(ctx, q, "q", 1)) || (st = fcl_check_tensor(ctx, k, "k", 1)) ||
      (st = fcl_check_tensor(ctx, v, "v", 1)))
    return st;
  if (o && (st = fcl_check_tensor(ctx, o, "o", 1))) return st;
  if (lse && (st = fcl_check_tensor(ctx, lse, "lse", 0))) return st;

  if (k->dtype != q->dtype || v->dtype != q->dtype || (o && o->dtype != q->dtype))
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "q, k, v and o must share one dtype (q %s, k %s, v %s%s%s)",
                    flashcl_dtype_name(q->dtype), flashcl_dtype_name(k->dtype), flashcl_dtype_name(v->dtype),
                    o ? ", o " : "", o ? flashcl_dtype_name(o->dtype) : "");
  if (lse && lse->dtype != FLASHCL_F32)
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "lse must be f32, got %s", flashcl_dtype_name(lse->dtype));
  if (desc->algo < FLASHCL_ALGO_AUTO || desc->algo > FLASHCL_ALGO_NAIVE)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.algo %d is not a flashcl_algo", (int)desc->algo);
  if (desc->kernel < FLASHCL_KERNEL_AUTO || desc->kernel > FLASHCL_KERNEL_NVIDIA_MMA)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.kernel %d is not a flashcl_kernel_family",
                    (int)desc->kernel);
  if (desc->block_r < 0 || desc->block_c < 0 || desc->block_r % 8 || desc->block_c % 8)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                    "desc.block_r/block_c (%d, %d) must be 0 (automatic) or positive multiples of 8", desc->block_r,
                    desc->block_c);
  if (!isfinite(desc->scale))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.scale must be finite");

  if (!(desc->dropout_p >= 0.0f && desc->dropout_p < 1.0f))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.dropout_p must be in [0, 1), got %g",
                    (double)desc->dropout_p);

  int64_t d = q->shape[3];
  if (k->shape[3] != d || v->shape[3] != d)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "head_dim differs: q %lld, k %lld, v %lld", (long long)d,
                    (long long)k->shape[3], (long long)v->shape[3]);
  if (d % 8 != 0 || d < 8 || d > 256)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "head_dim %lld is not supported: it must be a multiple of 8 in [8, 256]", (long long)d);
  if (o && !fcl_same_shape(o, q))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "o must have q's shape");
  if (!fcl_same_shape(k, v))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "k and v must have the same shape");
  if (!desc->kv_block_table && k->shape[0] != q->shape[0]) /* paged: k's batch counts pages */
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "q and k batch differ (%lld vs %lld)",
                    (long long)q->shape[0], (long long)k->shape[0]);
  int64_t hq = q->shape[2], hkv = k->shape[2];
  if ((desc->heads_q && desc->heads_q != hq) || (desc->heads_kv && desc->heads_kv != hkv))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "desc.heads_q/heads_kv (%d, %d) do not match the tensors (%lld, %lld)", desc->heads_q,
                    desc->heads_kv, (long long)hq, (long long)hkv);
  if (desc->heads_q < 0 || desc->heads_kv < 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "desc.heads_q/heads_kv must not be negative");
  if (hq % hkv != 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "heads_q (%lld) must be a multiple of heads_kv (%lld)",
                    (long long)hq, (long long)hkv);
  if (lse && (lse->shape[0] != q->shape[0] || lse->shape[1] != q->shape[1] || lse->shape[2] != hq ||
              lse->shape[3] != 1))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "lse must have logical shape (batch, seqlen_q, heads_q, 1)");

  if ((st = fcl_check_variants(ctx, desc->window_left, desc->window_right, desc->softcap, desc->alibi_slopes, hq)))
    return st;

  memset(p, 0, sizeof *p);
  p->dtype = q->dtype;
  p->heads_q = (int)hq;
  p->heads_kv = (int)hkv;
  p->head_dim = (int)d;
  p->causal = desc->causal != 0;
  p->scale = desc->scale != 0.0f ? desc->scale : (float)(1.0 / sqrt((double)d));
  p->dropout = desc->dropout_p > 0.0f;
  p->threshold = fcl_dropout_threshold(desc->dropout_p);
  p->keep_scale = (float)(1.0 / (1.0 - (double)desc->dropout_p));
  p->seed = desc->seed;
  p->offset = desc->offset;

  if (desc->cu_seqlens_q || desc->cu_seqlens_k) {
    /* With a paged K/V source the key counts come from kv_seqlens and the keys from
     * the page pools, so only the queries are packed. */
    const int paged = desc->kv_block_table != NULL;
    if (paged && desc->cu_seqlens_k)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                      "with a paged K/V source (desc.kv_block_table) the key counts come from desc.kv_seqlens: "
                      "cu_seqlens_k must be NULL");
    if (!desc->cu_seqlens_q || (!paged && !desc->cu_seqlens_k))
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "varlen needs both cu_seqlens_q and cu_seqlens_k");
    if (desc->num_seqs <= 0 || desc->max_seqlen_q <= 0 || (!paged && desc->max_seqlen_k <= 0))
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                      "varlen needs num_seqs, max_seqlen_q and max_seqlen_k >= 1 (got %d, %d, %d)", desc->num_seqs,
                      desc->max_seqlen_q, desc->max_seqlen_k);
    if (q->shape[0] != 1)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "varlen tensors must have batch 1 (packed tokens)");
    if (desc->max_seqlen_q > q->shape[1] || (!paged && desc->max_seqlen_k > k->shape[1]))
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "max_seqlen_q/k exceed the packed token counts");
    size_t need = ((size_t)desc->num_seqs + 1) * sizeof(cl_int), have_q = 0, have_k = need;
    flashcl_status st = fcl_buffer_size(ctx, desc->cu_seqlens_q, "desc.cu_seqlens_q", &have_q);
    if (st == FLASHCL_SUCCESS && !paged) st = fcl_buffer_size(ctx, desc->cu_seqlens_k, "desc.cu_seqlens_k", &have_k);
    if (st != FLASHCL_SUCCESS) return st;
    if (have_q < need || have_k < need)
      return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL, "cu_seqlens_q/k need %zu bytes (num_seqs + 1 int32)",
                      need);
    p->varlen = 1;
    p->batch = desc->num_seqs;
    p->seqlen_q = desc->max_seqlen_q;
    p->seqlen_k = desc->max_seqlen_k; /* paged: replaced by the pools' bound below */
  } else {
    p->batch = (int)q->shape[0];
    p->seqlen_q = (int)q->shape[1];
    p->seqlen_k = (int)k->shape[1];
  }
  if (desc->kv_block_table && (st = fcl_check_paged_kv(ctx, desc, k, p))) return st;

  /* Score variants. A window wider than any distance |j - (i + diag)| (at most
   * max(Nq, Nk)) is the same as unbounded; clamping keeps the kernels' int bounds
   * small. Causal is the right window 0, so with a window the kernels mask through
   * the window alone. */
  p->alibi = desc->alibi_slopes;
  p->softcap = desc->softcap;
  if (desc->window_left >= 0 || desc->window_right >= 0) {
    const int wide = p->seqlen_q > p->seqlen_k ? p->seqlen_q : p->seqlen_k;
    p->window = 1;
    p->window_left = (desc->window_left < 0 || desc->window_left > wide) ? wide : desc->window_left;
    p->window_right = (desc->window_right < 0 || desc->window_right > wide) ? wide : desc->window_right;
    if (p->causal) p->window_right = 0;
  }
  return fcl_check_mask(ctx, desc, p);
}

const char *fcl_variant_options(const fcl_problem *p, char *buf, size_t cap) {
  snprintf(buf, cap, "%s%s%s%s%s", p->window ? " -DWINDOW=1" : "", p->alibi ? " -DALIBI=1" : "",
           p->softcap > 0.0f ? " -DSOFTCAP=1" : "",
           p->mask_kind == FLASHCL_MASK_BLOCK ? " -DMASK=1" : p->mask_kind == FLASHCL_MASK_BITS ? " -DMASK=2" : "",
           p->paged_kv ? " -DPAGED_KV=1" : "");
  return buf;
}

/* ---------------------------------------------------- host mask layouts -- */

flashcl_status flashcl_mask_words(int nrows, int ncols, size_t *words) {
  if (!words || nrows < 1 || ncols < 1) return FLASHCL_ERROR_INVALID_ARGUMENT;
  if (!fcl_mul_size((size_t)nrows, ((size_t)ncols + 31) / 32, words)) return FLASHCL_ERROR_OVERFLOW;
  return FLASHCL_SUCCESS;
}

static int fcl_block_visible(flashcl_block_layout layout, int i, int j, int param) {
  const int dist = i > j ? i - j : j - i;
  switch (layout) {
  case FLASHCL_BLOCK_LOCAL: return dist < param;
  case FLASHCL_BLOCK_STRIDED: return dist < param || j % param == param - 1;
  case FLASHCL_BLOCK_BUTTERFLY: {
    const unsigned x = (unsigned)i ^ (unsigned)j;
    if (x == 0) return 1;
    if (x & (x - 1)) return 0; /* not a power of two */
    return param == 0 || (param < 31 && x < (1u << param));
  }
  }
  return 0;
}

flashcl_status flashcl_block_mask_fill(flashcl_block_layout layout, int nbq, int nbk, int param, uint32_t *words,
                                       size_t capacity) {
  size_t need;
  if (!words || nbq < 1 || nbk < 1) return FLASHCL_ERROR_INVALID_ARGUMENT;
  if (layout != FLASHCL_BLOCK_LOCAL && layout != FLASHCL_BLOCK_STRIDED && layout != FLASHCL_BLOCK_BUTTERFLY)
    return FLASHCL_ERROR_INVALID_ARGUMENT;
  if (layout == FLASHCL_BLOCK_BUTTERFLY ? param < 0 : param < 1) return FLASHCL_ERROR_INVALID_ARGUMENT;
  flashcl_status st = flashcl_mask_words(nbq, nbk, &need);
  if (st != FLASHCL_SUCCESS) return st;
  if (capacity < need) return FLASHCL_ERROR_BUFFER_TOO_SMALL;
  const size_t w = ((size_t)nbk + 31) / 32;
  memset(words, 0, need * sizeof *words);
  for (int i = 0; i < nbq; i++)
    for (int j = 0; j < nbk; j++)
      if (fcl_block_visible(layout, i, j, param)) words[(size_t)i * w + (size_t)j / 32] |= 1u << (j % 32);
  return FLASHCL_SUCCESS;
}
