/* The validation of an attention call (forward or backward) into an
 * fcl_problem: shapes, heads, varlen, paged source, mask and score variants.
 * Everything a kernel could trip over is checked here, before anything is
 * enqueued, so a failed call has no side effects on the device. */
#include "core/internal.h"
#include "attention/attention.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

int fcl_problem_aux(const fcl_problem *p, const flashcl_attention_desc *desc, fcl_aux *aux) {
  int n = 0;
  if (p->varlen) {
    const size_t cu = ((size_t)p->batch + 1) * sizeof(cl_int);
    aux[n++] = (fcl_aux){desc->varlen.cu_seqlens_q, 0, cu, "desc.varlen.cu_seqlens_q"};
    if (!p->paged_kv) aux[n++] = (fcl_aux){desc->varlen.cu_seqlens_k, 0, cu, "desc.varlen.cu_seqlens_k"};
  }
  if (p->alibi) aux[n++] = (fcl_aux){p->alibi, 0, (size_t)p->heads_q * sizeof(float), "desc.score.alibi_slopes"};
  if (p->sinks) aux[n++] = (fcl_aux){p->sinks, 0, (size_t)p->heads_q * sizeof(float), "desc.score.sinks"};
  if (p->mask_kind)
    aux[n++] = (fcl_aux){p->mask, 0, (size_t)p->mask_bstride * (size_t)p->batch * sizeof(cl_uint), "desc.mask.bits"};
  if (p->paged_kv) {
    aux[n++] = (fcl_aux){desc->paged.cache.block_table, 0, (size_t)p->batch * (size_t)desc->paged.cache.max_pages * sizeof(cl_int),
                         "desc.paged.cache.block_table"};
    aux[n++] = (fcl_aux){desc->paged.seqlens, 0, (size_t)p->batch * sizeof(cl_int), "desc.paged.seqlens"};
  }
  if (p->k_quant) aux[n++] = (fcl_aux){p->k_scale, 0, p->k_scale_bytes, "desc.paged.cache.k_scale"};
  if (p->v_quant) aux[n++] = (fcl_aux){p->v_scale, 0, p->v_scale_bytes, "desc.paged.cache.v_scale"};
  return n;
}

/* The attention mask of desc against the validated sizes in p (batch, lengths,
 * heads); fills p's mask fields. */
static flashcl_status fcl_check_mask(flashcl_context *ctx, const flashcl_attention_desc *desc, fcl_problem *p) {
  if (desc->mask.kind == FLASHCL_MASK_NONE) return FLASHCL_SUCCESS;
  if (desc->mask.kind != FLASHCL_MASK_BLOCK && desc->mask.kind != FLASHCL_MASK_BITS)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.mask.kind %d is not a flashcl_mask_kind",
                    desc->mask.kind);
  if (!desc->mask.bits) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.mask.kind is set but desc.mask.bits is NULL");
  int bq = 1, bk = 1;
  if (desc->mask.kind == FLASHCL_MASK_BLOCK) {
    if (desc->mask.block_q <= 0 || desc->mask.block_k <= 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                      "desc.mask.block_q/block_k (%d, %d) must be >= 1 for FLASHCL_MASK_BLOCK", desc->mask.block_q,
                      desc->mask.block_k);
    bq = desc->mask.block_q;
    bk = desc->mask.block_k;
  }
  const int rows = (int)(((int64_t)p->seqlen_q + bq - 1) / bq), cols = (int)(((int64_t)p->seqlen_k + bk - 1) / bk);
  const int heads = desc->mask.per_head ? p->heads_q : 1;
  const size_t words = ((size_t)cols + 31) / 32;
  size_t per_seq, need, have = 0;
  if (!fcl_mul_size(words, (size_t)rows, &per_seq) || per_seq > (size_t)INT64_MAX / 8 ||
      !fcl_mul_size(per_seq, (size_t)heads * (size_t)p->batch, &need) || !fcl_mul_size(need, 4, &need))
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "the attention mask's size overflows size_t");
  flashcl_status st = fcl_buffer_size(ctx, desc->mask.bits, "desc.mask.bits", &have);
  if (st != FLASHCL_SUCCESS) return st;
  if (have < need)
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                    "desc.mask.bits needs %zu bytes (%d sequences x %d heads x %d rows x %zu words) but holds %zu", need,
                    p->batch, heads, rows, words, have);
  p->mask_kind = desc->mask.kind;
  p->mask = desc->mask.bits;
  p->mask_bq = bq;
  p->mask_bk = bk;
  p->mask_words = (int)words;
  p->mask_hstride = desc->mask.per_head ? (int64_t)per_seq : 0;
  p->mask_bstride = (int64_t)per_seq * heads;
  return FLASHCL_SUCCESS;
}

/* The paged K/V source of desc (k/v are page pools) against p's batch; fills p's
 * paged fields and sets p->seqlen_k to the bound on the per-sequence key counts. */
static flashcl_status fcl_check_paged_kv(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                         const flashcl_tensor *k, fcl_problem *p) {
  if (desc->paged.cache.page_size < 1 || desc->paged.cache.page_size != k->shape[1])
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "desc.paged.cache.page_size (%d) must be >= 1 and equal the pools' page dimension k.shape[1] (%lld)",
                    desc->paged.cache.page_size, (long long)k->shape[1]);
  if (desc->paged.cache.max_pages < 1)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "desc.paged.cache.max_pages (%d) must be >= 1", desc->paged.cache.max_pages);
  const int64_t capacity = (int64_t)desc->paged.cache.max_pages * desc->paged.cache.page_size;
  if (capacity > INT_MAX)
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "desc.paged.cache.max_pages x page_size exceeds the int32 range");
  if (desc->varlen.max_seqlen_k < 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "desc.varlen.max_seqlen_k (%d) must be >= 0", desc->varlen.max_seqlen_k);
  size_t need, have = 0;
  if (!fcl_mul_size((size_t)p->batch * sizeof(cl_int), (size_t)desc->paged.cache.max_pages, &need))
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "the block table's size overflows size_t");
  flashcl_status st = fcl_buffer_size(ctx, desc->paged.cache.block_table, "desc.paged.cache.block_table", &have);
  if (st != FLASHCL_SUCCESS) return st;
  if (have < need)
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                    "desc.paged.cache.block_table holds %zu bytes but batch %d x max_pages %d int32 need %zu", have,
                    p->batch, desc->paged.cache.max_pages, need);
  if (!desc->paged.seqlens)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.paged.cache.block_table is set but desc.paged.seqlens is NULL");
  if ((st = fcl_buffer_size(ctx, desc->paged.seqlens, "desc.paged.seqlens", &have)) != FLASHCL_SUCCESS) return st;
  if (have < (size_t)p->batch * sizeof(cl_int))
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL, "desc.paged.seqlens holds %zu bytes but batch %d int32 need %zu",
                    have, p->batch, (size_t)p->batch * sizeof(cl_int));
  p->paged_kv = 1;
  p->kv_page_size = desc->paged.cache.page_size;
  p->kv_max_pages = desc->paged.cache.max_pages;
  p->kv_num_pages = (int)k->shape[0];
  p->kv_block_table = desc->paged.cache.block_table;
  p->kv_seqlens = desc->paged.seqlens;
  p->seqlen_k = (desc->varlen.max_seqlen_k == 0 || desc->varlen.max_seqlen_k > capacity) ? (int)capacity : desc->varlen.max_seqlen_k;
  return FLASHCL_SUCCESS;
}

/* k or v as a paged source's pool, which may hold a quantized cache format. */
static flashcl_status fcl_check_source(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                       const flashcl_tensor *t, const char *name) {
  if (desc->paged.cache.block_table && t && fcl_dtype_is_kv_quant(t->dtype)) return fcl_check_kv_tensor(ctx, t, name);
  return fcl_check_tensor(ctx, t, name, 1);
}

/* The scales of a paged source's quantized pools (rows: page * page_size +
 * slot), recorded in p. */
static flashcl_status fcl_check_quant_source(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                             const flashcl_tensor *k, const flashcl_tensor *v, fcl_problem *p) {
  const uint64_t rows = (uint64_t)k->shape[0] * (uint64_t)k->shape[1];
  flashcl_status st;
  p->k_quant = fcl_dtype_is_kv_quant(k->dtype);
  p->v_quant = fcl_dtype_is_kv_quant(v->dtype);
  if (p->k_quant) {
    if ((st = fcl_check_kv_scale(ctx, desc->paged.cache.k_scale, desc->paged.cache.k_scale_kind, p->head_dim, "desc.paged.cache.k", "k", rows, p->heads_kv,
                                 &p->k_scale_bytes)))
      return st;
    p->k_scale = desc->paged.cache.k_scale;
    p->k_scale_kind = (int)desc->paged.cache.k_scale_kind;
  }
  if (p->v_quant) {
    if ((st = fcl_check_kv_scale(ctx, desc->paged.cache.v_scale, desc->paged.cache.v_scale_kind, p->head_dim_v, "desc.paged.cache.v", "v", rows, p->heads_kv,
                                 &p->v_scale_bytes)))
      return st;
    p->v_scale = desc->paged.cache.v_scale;
    p->v_scale_kind = (int)desc->paged.cache.v_scale_kind;
  }
  return FLASHCL_SUCCESS;
}

/* The tensors themselves and their dtypes: one dtype, but for the quantized
 * pools of a paged source. */
static flashcl_status fcl_check_inputs(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                       const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                       const flashcl_tensor *o, const flashcl_tensor *lse) {
  flashcl_status st;
  if ((st = fcl_check_tensor(ctx, q, "q", 1)) || (st = fcl_check_source(ctx, desc, k, "k")) ||
      (st = fcl_check_source(ctx, desc, v, "v")))
    return st;
  if (o && (st = fcl_check_tensor(ctx, o, "o", 1))) return st;
  if (lse && (st = fcl_check_tensor(ctx, lse, "lse", 0))) return st;

  const int kq = fcl_dtype_is_kv_quant(k->dtype), vq = fcl_dtype_is_kv_quant(v->dtype);
  if ((!kq && k->dtype != q->dtype) || (!vq && v->dtype != q->dtype) || (o && o->dtype != q->dtype))
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "q, k, v and o must share one dtype (q %s, k %s, v %s%s%s)",
                    flashcl_dtype_name(q->dtype), flashcl_dtype_name(k->dtype), flashcl_dtype_name(v->dtype),
                    o ? ", o " : "", o ? flashcl_dtype_name(o->dtype) : "");
  if (lse && lse->dtype != FLASHCL_F32)
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "lse must be f32, got %s", flashcl_dtype_name(lse->dtype));
  return FLASHCL_SUCCESS;
}

/* desc's scalar fields that do not depend on the tensors. */
static flashcl_status fcl_check_desc_fields(flashcl_context *ctx, const flashcl_attention_desc *desc) {
  if (desc->algorithm.algo < FLASHCL_ALGO_AUTO || desc->algorithm.algo > FLASHCL_ALGO_NAIVE)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.algorithm.algo %d is not a flashcl_algo", (int)desc->algorithm.algo);
  if (desc->algorithm.kernel < FLASHCL_KERNEL_AUTO || desc->algorithm.kernel > FLASHCL_KERNEL_NVIDIA_MMA)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.algorithm.kernel %d is not a flashcl_kernel_family",
                    (int)desc->algorithm.kernel);
  if (desc->algorithm.block_r < 0 || desc->algorithm.block_c < 0 || desc->algorithm.block_r % 8 || desc->algorithm.block_c % 8)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                    "desc.algorithm.block_r/block_c (%d, %d) must be 0 (automatic) or positive multiples of 8", desc->algorithm.block_r,
                    desc->algorithm.block_c);
  if (!isfinite(desc->score.scale))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.score.scale must be finite");

  if (!(desc->dropout.p >= 0.0f && desc->dropout.p < 1.0f))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.dropout.p must be in [0, 1), got %g",
                    (double)desc->dropout.p);
  return FLASHCL_SUCCESS;
}

/* Head dim, shapes against each other, and the head counts. */
static flashcl_status fcl_check_shapes(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                       const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                       const flashcl_tensor *o, const flashcl_tensor *lse) {
  /* k and v rows count their elements (an i4x2 pool has two per byte). */
  const int64_t d = q->shape[3], kd = fcl_kv_head_dim(k), vd = fcl_kv_head_dim(v);
  if (desc->shape.head_dim_v < 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "desc.shape.head_dim_v is %d: it must be 0 (v and o have q's head dim) or v's head dim",
                    desc->shape.head_dim_v);
  if (!desc->shape.head_dim_v && (kd != d || vd != d))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "head_dim differs: q %lld, k %lld, v %lld", (long long)d,
                    (long long)kd, (long long)vd);
  if (desc->shape.head_dim_v && (kd != d || vd != desc->shape.head_dim_v))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "head_dim differs: q %lld, k %lld (must be equal), v %lld (desc.shape.head_dim_v %d)", (long long)d,
                    (long long)kd, (long long)vd, desc->shape.head_dim_v);
  const int64_t dv = vd;
  if (d % 8 != 0 || d < 8 || d > 576 || dv % 8 != 0 || dv < 8 || dv > 512)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "head_dim %lld is not supported: q/k take multiples of 8 in [8, 576], v/o in [8, 512]",
                    (long long)(d % 8 != 0 || d < 8 || d > 576 ? d : dv));
  if (o && (o->shape[0] != q->shape[0] || o->shape[1] != q->shape[1] || o->shape[2] != q->shape[2] ||
            o->shape[3] != dv))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    desc->shape.head_dim_v ? "o must have q's shape with head dim desc.shape.head_dim_v" : "o must have q's shape");
  if (k->shape[0] != v->shape[0] || k->shape[1] != v->shape[1] || k->shape[2] != v->shape[2])
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "k and v must have the same shape");
  if (!desc->paged.cache.block_table && k->shape[0] != q->shape[0]) /* paged: k's batch counts pages */
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "q and k batch differ (%lld vs %lld)",
                    (long long)q->shape[0], (long long)k->shape[0]);
  int64_t hq = q->shape[2], hkv = k->shape[2];
  if ((desc->shape.heads_q && desc->shape.heads_q != hq) || (desc->shape.heads_kv && desc->shape.heads_kv != hkv))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "desc.shape.heads_q/heads_kv (%d, %d) do not match the tensors (%lld, %lld)", desc->shape.heads_q,
                    desc->shape.heads_kv, (long long)hq, (long long)hkv);
  if (desc->shape.heads_q < 0 || desc->shape.heads_kv < 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "desc.shape.heads_q/heads_kv must not be negative");
  if (hq % hkv != 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "heads_q (%lld) must be a multiple of heads_kv (%lld)",
                    (long long)hq, (long long)hkv);
  if (lse && (lse->shape[0] != q->shape[0] || lse->shape[1] != q->shape[1] || lse->shape[2] != hq ||
              lse->shape[3] != 1))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "lse must have logical shape (batch, seqlen_q, heads_q, 1)");
  return FLASHCL_SUCCESS;
}

/* The packed (varlen) sequences of desc, else the tensors' batch and lengths;
 * fills p's batch, lengths and varlen. */
static flashcl_status fcl_check_varlen(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                       const flashcl_tensor *q, const flashcl_tensor *k, fcl_problem *p) {
  if (!desc->varlen.cu_seqlens_q && !desc->varlen.cu_seqlens_k) {
    p->batch = (int)q->shape[0];
    p->seqlen_q = (int)q->shape[1];
    p->seqlen_k = (int)k->shape[1];
    return FLASHCL_SUCCESS;
  }
  /* With a paged K/V source the key counts come from desc.paged.seqlens and the keys from
   * the page pools, so only the queries are packed. */
  const int paged = desc->paged.cache.block_table != NULL;
  if (paged && desc->varlen.cu_seqlens_k)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                    "with a paged K/V source (desc.paged.cache.block_table) the key counts come from desc.paged.seqlens: "
                    "cu_seqlens_k must be NULL");
  if (!desc->varlen.cu_seqlens_q || (!paged && !desc->varlen.cu_seqlens_k))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "varlen needs both cu_seqlens_q and cu_seqlens_k");
  if (desc->varlen.num_seqs <= 0 || desc->varlen.max_seqlen_q <= 0 || (!paged && desc->varlen.max_seqlen_k <= 0))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "varlen needs num_seqs, max_seqlen_q and max_seqlen_k >= 1 (got %d, %d, %d)", desc->varlen.num_seqs,
                    desc->varlen.max_seqlen_q, desc->varlen.max_seqlen_k);
  if (q->shape[0] != 1)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "varlen tensors must have batch 1 (packed tokens)");
  if (desc->varlen.max_seqlen_q > q->shape[1] || (!paged && desc->varlen.max_seqlen_k > k->shape[1]))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "max_seqlen_q/k exceed the packed token counts");
  size_t need = ((size_t)desc->varlen.num_seqs + 1) * sizeof(cl_int), have_q = 0, have_k = need;
  flashcl_status st = fcl_buffer_size(ctx, desc->varlen.cu_seqlens_q, "desc.varlen.cu_seqlens_q", &have_q);
  if (st == FLASHCL_SUCCESS && !paged) st = fcl_buffer_size(ctx, desc->varlen.cu_seqlens_k, "desc.varlen.cu_seqlens_k", &have_k);
  if (st != FLASHCL_SUCCESS) return st;
  if (have_q < need || have_k < need)
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL, "cu_seqlens_q/k need %zu bytes (num_seqs + 1 int32)",
                    need);
  p->varlen = 1;
  p->batch = desc->varlen.num_seqs;
  p->seqlen_q = desc->varlen.max_seqlen_q;
  p->seqlen_k = desc->varlen.max_seqlen_k; /* paged: replaced by the pools' bound */
  return FLASHCL_SUCCESS;
}

/* p's fields that come straight from the validated tensors and desc: dtype,
 * heads, scale, causal and dropout. */
static void fcl_fill_problem(const flashcl_attention_desc *desc, const flashcl_tensor *q, const flashcl_tensor *k,
                             const flashcl_tensor *v, fcl_problem *p) {
  const int64_t d = q->shape[3];
  memset(p, 0, sizeof *p);
  p->dtype = q->dtype;
  p->k_dtype = k->dtype;
  p->v_dtype = v->dtype;
  p->heads_q = (int)q->shape[2];
  p->heads_kv = (int)k->shape[2];
  p->head_dim = (int)d;
  p->head_dim_v = (int)fcl_kv_head_dim(v);
  p->causal = desc->mask.causal != 0;
  p->scale = desc->score.scale != 0.0f ? desc->score.scale : (float)(1.0 / sqrt((double)d));
  p->dropout = desc->dropout.p > 0.0f;
  p->threshold = fcl_dropout_threshold(desc->dropout.p);
  p->keep_scale = (float)(1.0 / (1.0 - (double)desc->dropout.p));
  p->seed = desc->dropout.seed;
  p->offset = desc->dropout.offset;
}

/* Score variants. A window wider than any distance |j - (i + diag)| (at most
 * max(Nq, Nk)) is the same as unbounded; clamping keeps the kernels' int bounds
 * small. Causal is the right window 0, so with a window the kernels mask through
 * the window alone. */
static void fcl_fill_variants(const flashcl_attention_desc *desc, fcl_problem *p) {
  p->alibi = desc->score.alibi_slopes;
  p->softcap = desc->score.softcap;
  p->sinks = desc->score.sinks;
  if (desc->score.window_left >= 0 || desc->score.window_right >= 0) {
    const int wide = p->seqlen_q > p->seqlen_k ? p->seqlen_q : p->seqlen_k;
    p->window = 1;
    p->window_left = (desc->score.window_left < 0 || desc->score.window_left > wide) ? wide : desc->score.window_left;
    p->window_right = (desc->score.window_right < 0 || desc->score.window_right > wide) ? wide : desc->score.window_right;
    if (p->causal) p->window_right = 0;
  }
}

flashcl_status fcl_check_problem(flashcl_context *ctx, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                                 const flashcl_tensor *k, const flashcl_tensor *v, const flashcl_tensor *o,
                                 const flashcl_tensor *lse, fcl_problem *p) {
  if (!desc) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
  flashcl_status st;
  if ((st = fcl_check_inputs(ctx, desc, q, k, v, o, lse)) || (st = fcl_check_desc_fields(ctx, desc)) ||
      (st = fcl_check_shapes(ctx, desc, q, k, v, o, lse)))
    return st;
  if ((st = fcl_check_variants(ctx, desc->score.window_left, desc->score.window_right, desc->score.softcap, desc->score.alibi_slopes,
                               q->shape[2])) ||
      (st = fcl_check_head_floats(ctx, desc->score.sinks, q->shape[2], "desc.score.sinks")))
    return st;

  fcl_fill_problem(desc, q, k, v, p);
  if ((st = fcl_check_varlen(ctx, desc, q, k, p))) return st;
  if (desc->paged.cache.block_table &&
      ((st = fcl_check_paged_kv(ctx, desc, k, p)) || (st = fcl_check_quant_source(ctx, desc, k, v, p))))
    return st;
  fcl_fill_variants(desc, p);
  return fcl_check_mask(ctx, desc, p);
}
