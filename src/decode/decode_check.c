/* The validation of flashcl_attention_decode's arguments, and the cache and
 * key-count checks it shares with flashcl_kv_cache_append. Nothing is
 * enqueued before these pass, so a refused call has no side effects. */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "decode/decode.h"
#include "nvidia/nvidia.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fcl_kv_plain_dtype(const flashcl_tensor *kc, const flashcl_tensor *vc) {
  if (!fcl_dtype_is_kv_quant(kc->dtype)) return (int)kc->dtype;
  return fcl_dtype_is_kv_quant(vc->dtype) ? -1 : (int)vc->dtype;
}

void fcl_kv_quant_options(const fcl_kv_info *kv, const flashcl_tensor *kc, const flashcl_tensor *vc,
                          flashcl_dtype dtype, char *buf, size_t cap) {
  /* A plain side is named by the tokens' dtype with scale kind 0, so that the
   * ignored scale fields of a plain cache do not build programs of their own. */
  snprintf(buf, cap, " -DK_DTYPE=%d -DV_DTYPE=%d -DK_SCALE=%d -DV_SCALE=%d",
           kv->k_quant ? (int)kc->dtype : (int)dtype, kv->v_quant ? (int)vc->dtype : (int)dtype, kv->k_scale_kind,
           kv->v_scale_kind);
}

/* The quantized sides of a validated layout: their scales, recorded in out. */
static flashcl_status fcl_check_kv_quant(flashcl_context *ctx, const flashcl_kv_layout *cache,
                                         const flashcl_tensor *kc, const flashcl_tensor *vc, fcl_kv_info *out) {
  flashcl_status st;
  const uint64_t rows = (uint64_t)out->num_pages * (uint64_t)(out->paged ? out->page_size : out->capacity);
  out->k_quant = fcl_dtype_is_kv_quant(kc->dtype);
  out->v_quant = fcl_dtype_is_kv_quant(vc->dtype);
  out->k_dtype = kc->dtype;
  out->v_dtype = vc->dtype;
  if (out->k_quant) {
    if ((st = fcl_check_kv_scale(ctx, cache->k_scale, cache->k_scale_kind, out->head_dim, "desc.cache.k", "k_cache", rows,
                                 out->heads_kv,
                                 &out->k_scale_bytes)))
      return st;
    out->k_scale_kind = (int)cache->k_scale_kind;
  }
  if (out->v_quant) {
    if ((st = fcl_check_kv_scale(ctx, cache->v_scale, cache->v_scale_kind, out->head_dim_v, "desc.cache.v", "v_cache", rows,
                                 out->heads_kv,
                                 &out->v_scale_bytes)))
      return st;
    out->v_scale_kind = (int)cache->v_scale_kind;
  }
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_check_kv_cache(flashcl_context *ctx, const flashcl_kv_layout *cache, const flashcl_tensor *kc,
                                  const flashcl_tensor *vc, int batch, fcl_kv_info *out) {
  flashcl_status st;
  if (!cache) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
  if ((st = fcl_check_kv_tensor(ctx, kc, "k_cache")) || (st = fcl_check_kv_tensor(ctx, vc, "v_cache"))) return st;
  /* Each side is plain or quantized on its own; two plain sides share a dtype. */
  if (kc->dtype != vc->dtype && !fcl_dtype_is_kv_quant(kc->dtype) && !fcl_dtype_is_kv_quant(vc->dtype))
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "k_cache and v_cache dtypes differ (%s, %s)",
                    flashcl_dtype_name(kc->dtype), flashcl_dtype_name(vc->dtype));
  /* v_cache may have a head dim of its own (MLA-like); checked by the callers. */
  for (int i = 0; i < 3; i++)
    if (kc->shape[i] != vc->shape[i])
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                      "k_cache and v_cache must have the same pages (or batch), slots and heads");
  memset(out, 0, sizeof *out);
  out->heads_kv = (int)kc->shape[2];
  out->head_dim = (int)fcl_kv_head_dim(kc);
  out->head_dim_v = (int)fcl_kv_head_dim(vc);
  if (cache->block_table) {
    if (cache->page_size <= 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "paged cache: desc.cache.page_size must be >= 1, got %d",
                      cache->page_size);
    if (cache->max_pages <= 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "paged cache: desc.cache.max_pages must be >= 1, got %d",
                      cache->max_pages);
    if (kc->shape[1] != cache->page_size)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                      "paged cache: k_cache.shape[1] (%lld) must equal desc.cache.page_size (%d); the cache tensors are "
                      "(num_pages, page_size, heads_kv, head_dim)",
                      (long long)kc->shape[1], cache->page_size);
    if ((int64_t)cache->max_pages * cache->page_size > INT_MAX)
      return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "max_pages * page_size exceeds the int32 range");
    size_t have = 0;
    if ((st = fcl_buffer_size(ctx, cache->block_table, "desc.cache.block_table", &have)) != FLASHCL_SUCCESS) return st;
    size_t need = (size_t)batch * (size_t)cache->max_pages * sizeof(cl_int);
    if (have < need)
      return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                      "desc.cache.block_table holds %zu bytes but batch %d x max_pages %d int32 need %zu", have, batch,
                      cache->max_pages, need);
    out->paged = 1;
    out->page_size = cache->page_size;
    out->max_pages = cache->max_pages;
    out->num_pages = (int)kc->shape[0];
    out->capacity = cache->max_pages * cache->page_size;
  } else {
    if (cache->page_size != 0 || cache->max_pages != 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                      "desc.cache.page_size/max_pages (%d, %d) are set but desc.cache.block_table is NULL", cache->page_size,
                      cache->max_pages);
    if (kc->shape[0] != batch)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                      "contiguous cache: k_cache batch (%lld) must equal the batch (%d)", (long long)kc->shape[0],
                      batch);
    out->capacity = (int)kc->shape[1];
    out->num_pages = batch;
  }
  return fcl_check_kv_quant(ctx, cache, kc, vc, out);
}

flashcl_status fcl_check_seqlens(flashcl_context *ctx, cl_mem seqlens, const char *name, int batch) {
  if (!seqlens) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
  size_t have = 0;
  flashcl_status st = fcl_buffer_size(ctx, seqlens, name, &have);
  if (st != FLASHCL_SUCCESS) return st;
  if (have < (size_t)batch * sizeof(cl_int))
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL, "%s holds %zu bytes but batch %d int32 need %zu", name,
                    have, batch, (size_t)batch * sizeof(cl_int));
  return FLASHCL_SUCCESS;
}

/* desc itself, the tensors and the cache, and their dtypes; fills p->kv. */
static flashcl_status fcl_decode_check_inputs(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                              const flashcl_tensor *q, const flashcl_tensor *kc,
                                              const flashcl_tensor *vc, const flashcl_tensor *o,
                                              const flashcl_tensor *lse, fcl_decode_plan *p) {
  flashcl_status st;
  if (!desc) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
  if ((st = fcl_check_tensor(ctx, q, "q", 1))) return st;
  if (o && (st = fcl_check_tensor(ctx, o, "o", 1))) return st;
  if (lse && (st = fcl_check_tensor(ctx, lse, "lse", 0))) return st;
  if ((st = fcl_check_kv_cache(ctx, &desc->cache, kc, vc, (int)q->shape[0], &p->kv))) return st;
  const int plain = fcl_kv_plain_dtype(kc, vc);
  if ((plain >= 0 && plain != (int)q->dtype) || (o && o->dtype != q->dtype))
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH,
                    "q, the plain caches and o must share one dtype (q %s, k_cache %s, v_cache %s%s%s); a cache may "
                    "instead be quantized (i8, f8e4m3, f8e5m2)",
                    flashcl_dtype_name(q->dtype), flashcl_dtype_name(kc->dtype), flashcl_dtype_name(vc->dtype),
                    o ? ", o " : "", o ? flashcl_dtype_name(o->dtype) : "");
  if (lse && lse->dtype != FLASHCL_F32)
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "lse must be f32, got %s", flashcl_dtype_name(lse->dtype));
  return FLASHCL_SUCCESS;
}

/* desc's scalar fields that do not depend on the tensors. */
static flashcl_status fcl_decode_check_desc(flashcl_context *ctx, const flashcl_decode_desc *desc) {
  if (!isfinite(desc->score.scale)) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.score.scale must be finite");
  if (desc->split.num_splits < 0 || desc->split.num_splits > FLASHCL_DECODE_MAX_SPLITS)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.split.num_splits must be in [0, %d], got %d",
                    FLASHCL_DECODE_MAX_SPLITS, desc->split.num_splits);
  if (desc->split.max_seqlen_k < 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.split.max_seqlen_k must be >= 0, got %d",
                    desc->split.max_seqlen_k);
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_check_kv_head_dims(flashcl_context *ctx, int d, int dv) {
  if (dv > d)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "v_cache's head dim %d is above k_cache's %d: decode and the append take a V head dim of at "
                    "most K's (MLA-like)",
                    dv, d);
  if (dv % 8 != 0 || dv < 8 || dv > FCL_DECODE_MAX_HEAD_DIM_V)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "v_cache's head dim %d is not supported: it must be a multiple of 8 in [8, %d]", dv,
                    FCL_DECODE_MAX_HEAD_DIM_V);
  return FLASHCL_SUCCESS;
}

/* Head dims, q_len and head counts, and o's and lse's shapes against q's (o
 * with v_cache's head dim). */
static flashcl_status fcl_decode_check_shapes(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                              const flashcl_tensor *q, const flashcl_tensor *kc,
                                              const flashcl_tensor *vc, const flashcl_tensor *o,
                                              const flashcl_tensor *lse) {
  const int64_t d = q->shape[3], dv = fcl_kv_head_dim(vc);
  if (fcl_kv_head_dim(kc) != d)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "head_dim differs: q %lld, k_cache %lld%s", (long long)d,
                    (long long)fcl_kv_head_dim(kc), kc->dtype == FLASHCL_I4X2 ? " (i4x2: 2 * shape[3])" : "");
  if (d % 8 != 0 || d < 8 || d > FCL_DECODE_MAX_HEAD_DIM)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "head_dim %lld is not supported: decode takes a multiple of 8 in [8, %d]", (long long)d,
                    FCL_DECODE_MAX_HEAD_DIM);
  const int64_t q_len = q->shape[1];
  if (q_len > FLASHCL_DECODE_MAX_Q_LEN)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "q_len (q.shape[1]) is %lld; decode takes 1 to %d tokens",
                    (long long)q_len, FLASHCL_DECODE_MAX_Q_LEN);
  const int64_t hq = q->shape[2], hkv = kc->shape[2];
  if (desc->heads_q < 0 || desc->heads_kv < 0 || (desc->heads_q && desc->heads_q != hq) ||
      (desc->heads_kv && desc->heads_kv != hkv))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "desc.heads_q/heads_kv (%d, %d) do not match the tensors (%lld, %lld)", desc->heads_q,
                    desc->heads_kv, (long long)hq, (long long)hkv);
  if (hq % hkv != 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "heads_q (%lld) must be a multiple of heads_kv (%lld)",
                    (long long)hq, (long long)hkv);
  if (o && (o->shape[0] != q->shape[0] || o->shape[1] != q_len || o->shape[2] != hq || o->shape[3] != dv))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "o must have q's shape with v_cache's head dim (%lld, %lld, %lld, %lld)", (long long)q->shape[0],
                    (long long)q_len, (long long)hq, (long long)dv);
  if (lse && (lse->shape[0] != q->shape[0] || lse->shape[1] != q_len || lse->shape[2] != hq || lse->shape[3] != 1))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "lse must have logical shape (batch, q_len, heads_q, 1)");
  /* After o's check: caches of two head dims beside an o of q's shape are a
   * shape mismatch (INVALID_SHAPE, as before a V head dim of its own existed). */
  return fcl_check_kv_head_dims(ctx, (int)d, (int)dv);
}

/* o and lse against each other and the inputs, and desc's buffers. */
static flashcl_status fcl_decode_check_buffers(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                               const flashcl_tensor *q, const flashcl_tensor *kc,
                                               const flashcl_tensor *vc, const flashcl_tensor *o,
                                               const flashcl_tensor *lse) {
  flashcl_status st;
  if ((st = fcl_check_output_distinct(ctx, o, "o")) || (st = fcl_check_output_distinct(ctx, lse, "lse"))) return st;
  if (fcl_views_conflict(o, q, 0) || fcl_views_conflict(o, kc, 0) || fcl_views_conflict(o, vc, 0) ||
      fcl_views_conflict(lse, q, 0) || fcl_views_conflict(lse, kc, 0) || fcl_views_conflict(lse, vc, 0) ||
      fcl_views_conflict(lse, o, 0))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "o or lse overlaps q, the caches or each other");
  if (desc->split.workspace && desc->split.workspace_offset % sizeof(float))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.split.workspace_offset must be a multiple of 4");
  if ((st = fcl_check_variants(ctx, desc->score.window_left, desc->score.window_right, desc->score.softcap, desc->score.alibi_slopes,
                               q->shape[2])) ||
      (st = fcl_check_head_floats(ctx, desc->score.sinks, q->shape[2], "desc.score.sinks")))
    return st;
  if (desc->tree_mask) {
    size_t have = 0;
    const int batch = (int)q->shape[0];
    const int64_t q_len = q->shape[1];
    const size_t need = (size_t)batch * (size_t)q_len * sizeof(cl_uint); /* q_len <= 16: no overflow */
    if ((st = fcl_buffer_size(ctx, desc->tree_mask, "desc.tree_mask", &have)) != FLASHCL_SUCCESS) return st;
    if (have < need)
      return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                      "desc.tree_mask holds %zu bytes; batch %d x q_len %lld uint32 words (%zu bytes) are needed",
                      have, batch, (long long)q_len, need);
  }
  return FLASHCL_SUCCESS;
}

/* Everything of the call that the plan does not choose: checked, then
 * recorded in p (kv, sizes, scale, window). */
flashcl_status fcl_decode_validate(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                          const flashcl_tensor *q, const flashcl_tensor *kc,
                                          const flashcl_tensor *vc, const flashcl_tensor *o,
                                          const flashcl_tensor *lse, fcl_decode_plan *p) {
  flashcl_status st;
  if ((st = fcl_decode_check_inputs(ctx, desc, q, kc, vc, o, lse, p)) || (st = fcl_decode_check_desc(ctx, desc)) ||
      (st = fcl_decode_check_shapes(ctx, desc, q, kc, vc, o, lse)) ||
      (st = fcl_decode_check_buffers(ctx, desc, q, kc, vc, o, lse)))
    return st;
  const int64_t d = q->shape[3], hq = q->shape[2], hkv = kc->shape[2];
  p->batch = (int)q->shape[0];
  p->q_len = (int)q->shape[1];
  p->heads_q = (int)hq;
  p->heads_kv = (int)hkv;
  p->head_dim = (int)d;
  p->head_dim_v = (int)fcl_kv_head_dim(vc);
  p->group = (int)(hq / hkv);
  p->scale = desc->score.scale != 0.0f ? desc->score.scale : (float)(1.0 / sqrt((double)d));
  p->window = desc->score.window_left >= 0 || desc->score.window_right >= 0;
  if (desc->kernel < FLASHCL_KERNEL_AUTO || desc->kernel > FLASHCL_KERNEL_NVIDIA_MMA)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.kernel (%d) is not a flashcl_kernel_family",
                    (int)desc->kernel);
  return FLASHCL_SUCCESS;
}
