/* Tensor views and the checks of single tensors and buffers the calls share.
 *
 * Everything a kernel could trip over is checked here, before anything is
 * enqueued, so a failed call has no side effects on the device. */
#include "core/internal.h"

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
  case FLASHCL_I8:
  case FLASHCL_F8E4M3:
  case FLASHCL_F8E5M2:
  case FLASHCL_I4X2: return 1;
  }
  return 0;
}

const char *flashcl_dtype_name(flashcl_dtype dtype) {
  switch (dtype) {
  case FLASHCL_F32: return "f32";
  case FLASHCL_F16: return "f16";
  case FLASHCL_BF16: return "bf16";
  case FLASHCL_I8: return "i8";
  case FLASHCL_F8E4M3: return "f8e4m3";
  case FLASHCL_F8E5M2: return "f8e5m2";
  case FLASHCL_I4X2: return "i4x2";
  }
  return "invalid";
}

int fcl_dtype_is_kv_quant(flashcl_dtype dtype) {
  return dtype == FLASHCL_I8 || dtype == FLASHCL_F8E4M3 || dtype == FLASHCL_F8E5M2 || dtype == FLASHCL_I4X2;
}

int64_t fcl_kv_head_dim(const flashcl_tensor *t) {
  return t->dtype == FLASHCL_I4X2 ? 2 * t->shape[3] : t->shape[3];
}

flashcl_status fcl_check_kv_scale(flashcl_context *ctx, cl_mem scale, flashcl_kv_scale kind, int d, const char *name,
                                  const char *tensor, uint64_t rows, int heads_kv, size_t *bytes) {
  static const char *const kinds[4] = {"TOKEN", "HEAD", "TENSOR", "BLOCK32"}; /* flashcl_kv_scale order */
  /* Each factor is below 2^31 (validated shapes), the head dim's blocks below
   * 2^26: the product fits 64 bits. */
  uint64_t floats = 1;
  if (kind == FLASHCL_KV_SCALE_HEAD) floats = (uint64_t)heads_kv;
  else if (kind == FLASHCL_KV_SCALE_TOKEN)
    floats = rows * (uint64_t)heads_kv;
  else if (kind == FLASHCL_KV_SCALE_BLOCK32) {
    if (d % 32)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                      "%s_scale_kind is BLOCK32 (one scale per 32 elements) but %s's head dim %d is not "
                      "a multiple of 32", name, tensor, d);
    floats = rows * (uint64_t)heads_kv * (uint64_t)(d / 32);
  } else if (kind != FLASHCL_KV_SCALE_TENSOR)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s_scale_kind (%d) is not a flashcl_kv_scale", name,
                    (int)kind);
  if (!scale)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                    "%s is quantized but %s_scale is NULL: a quantized cache needs its fp32 scales",
                    tensor, name);
  const uint64_t need = floats * sizeof(float);
  if (need > SIZE_MAX) return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "%s_scale's size overflows size_t", name);
  size_t have = 0;
  char what[48];
  snprintf(what, sizeof what, "%s_scale", name);
  flashcl_status st = fcl_buffer_size(ctx, scale, what, &have);
  if (st != FLASHCL_SUCCESS) return st;
  if (have < need)
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL, "%s_scale holds %zu bytes but its %s layout needs %zu",
                    name, have, kinds[kind], (size_t)need);
  *bytes = (size_t)need;
  return FLASHCL_SUCCESS;
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

int fcl_vec_aligned(const flashcl_tensor *t) {
  if (!t || t->offset % (4 * flashcl_dtype_size(t->dtype))) return 0;
  for (int i = 0; i < 3; i++)
    if (t->stride[i] % 4) return 0;
  return 1;
}

/* 16-byte aligned rows: offset and (batch, seq, head) strides multiples of 8 elements. */
int fcl_rows_aligned16(const flashcl_tensor *t) {
  if (t->offset % 16) return 0;
  for (int i = 0; i < 3; i++)
    if (t->stride[i] % 8) return 0;
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

/* The checks of fcl_check_tensor; kv_cache admits the quantized cache formats. */
static flashcl_status fcl_check_view(flashcl_context *ctx, const flashcl_tensor *t, const char *name,
                                     int need_unit_last_stride, int kv_cache) {
  static const char *dims[4] = {"batch", "seqlen", "heads", "head_dim"};
  if (!t) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
  if (!t->buffer) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s.buffer is NULL", name);
  size_t es = flashcl_dtype_size(t->dtype);
  if (es == 0) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s has an unknown dtype %d", name, (int)t->dtype);
  if (!kv_cache && fcl_dtype_is_kv_quant(t->dtype))
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH,
                    "%s has dtype %s, a quantized KV-cache format: only the k_cache / v_cache of decode and "
                    "flashcl_kv_cache_append, and k / v of a forward with a paged source, take it (f32, f16 or "
                    "bf16 here)",
                    name, flashcl_dtype_name(t->dtype));
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

flashcl_status fcl_check_tensor(flashcl_context *ctx, const flashcl_tensor *t, const char *name,
                                int need_unit_last_stride) {
  return fcl_check_view(ctx, t, name, need_unit_last_stride, 0);
}

flashcl_status fcl_check_kv_tensor(flashcl_context *ctx, const flashcl_tensor *t, const char *name) {
  return fcl_check_view(ctx, t, name, 1, 1);
}

flashcl_status fcl_check_variants(flashcl_context *ctx, int window_left, int window_right, float softcap,
                                  cl_mem alibi_slopes, int64_t hq) {
  if (window_left < -1 || window_right < -1)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                    "desc.score.window_left/window_right (%d, %d) must be -1 (unbounded) or >= 0", window_left,
                    window_right);
  if (!(softcap >= 0.0f) || !isfinite(softcap))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.score.softcap must be 0 (off) or finite and > 0, got %g",
                    (double)softcap);
  return fcl_check_head_floats(ctx, alibi_slopes, hq, "desc.score.alibi_slopes");
}

flashcl_status fcl_check_head_floats(flashcl_context *ctx, cl_mem buf, int64_t hq, const char *name) {
  if (!buf) return FLASHCL_SUCCESS;
  size_t have = 0, need = (size_t)hq * sizeof(float);
  flashcl_status st = fcl_buffer_size(ctx, buf, name, &have);
  if (st != FLASHCL_SUCCESS) return st;
  if (have < need)
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL, "%s needs %zu bytes (heads_q = %lld floats) but holds %zu",
                    name, need, (long long)hq, have);
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

flashcl_status fcl_check_output_distinct(flashcl_context *ctx, const flashcl_tensor *t, const char *name) {
  if (t && fcl_view_self_overlaps(t))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_STRIDE,
                    "%s names one element twice (a zero or too small stride): each output element needs its own "
                    "memory",
                    name);
  return FLASHCL_SUCCESS;
}

void fcl_kvq_options(const fcl_problem *p, char *buf, size_t cap) {
  if (!p->k_quant && !p->v_quant) return;
  const size_t n = strlen(buf);
  snprintf(buf + n, cap - n, " -DK_DTYPE=%d -DV_DTYPE=%d -DK_SCALE=%d -DV_SCALE=%d",
           (int)(p->k_quant ? p->k_dtype : p->dtype), (int)(p->v_quant ? p->v_dtype : p->dtype), p->k_scale_kind,
           p->v_scale_kind);
}

const char *fcl_variant_options(const fcl_problem *p, char *buf, size_t cap) {
  /* A v head dim apart from q's is an option only where it differs, like the
   * variants: the programs of the common case keep their options. */
  char dv[32] = "";
  if (p->head_dim_v && p->head_dim_v != p->head_dim) snprintf(dv, sizeof dv, " -DHEAD_DIM_V=%d", p->head_dim_v);
  snprintf(buf, cap, "%s%s%s%s%s%s%s", p->window ? " -DWINDOW=1" : "", p->alibi ? " -DALIBI=1" : "",
           p->softcap > 0.0f ? " -DSOFTCAP=1" : "", p->sinks ? " -DSINKS=1" : "",
           p->mask_kind == FLASHCL_MASK_BLOCK ? " -DMASK=1" : p->mask_kind == FLASHCL_MASK_BITS ? " -DMASK=2" : "",
           p->paged_kv ? " -DPAGED_KV=1" : "", dv);
  return buf;
}
