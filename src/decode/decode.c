/* flashcl_attention_decode: split-KV decoding against a paged or contiguous KV
 * cache (cl/decode/decode.cl), and the cache validation shared with kv_cache.c.
 *
 * Plan (per call, from the shapes only):
 *   rows per work-group: the GQA group's G * q_len (query head, token) rows,
 *     rounded up to a power of two in [1, 8] (Q and the O accumulators of every
 *     row live in registers), more rows in further row blocks;
 *   work-group: TPK = head_dim / 8 work-items per key row times KG = 128 / TPK key
 *     groups (128 work-items for head_dim 8..128 and 256; fewer if the device
 *     allows fewer);
 *   KPT (keys per work-item per tile): 2, halved until the local memory fits
 *     min(device local memory, 48 KiB); tile = KG * KPT keys (16 at d = 128).
 *     With K prefetch this is 128 registers on the H100 (4 work-groups per SM);
 *     KPT 4 needs 165 (3 per SM);
 *   splits (num_splits = 0): one wave of work-groups at W = 4 per compute unit
 *     (2 on the cp.async path below), floor(W * CUs / (B * Hkv * row_blocks))
 *     (at least 1), but at least 256 keys of max_seqlen_k (or the capacity) per
 *     split, and at most FLASHCL_DECODE_MAX_SPLITS. 132 CUs, 8 kv heads, W = 4:
 *     batch 1 -> 66 splits, batch 8 -> 8, batch 64 -> 1 (unsplit, no merge).
 *   merge: 128 work-items per (sequence, token, query head) row, the splits spread
 *     over them;
 *   stages (NVIDIA, fp16/bf16 caches with 16-byte aligned rows): K and V reach
 *     local memory through cp.async, FCL_DEC_STAGES tiles deep (fewer, down to
 *     2, then fewer keys per work-item, if the local memory does not fit; else
 *     the register path), with splits for 2 work-groups per compute unit;
 *   tensor cores (NVIDIA as above, head_dim 64 or 128, q with 16-byte aligned
 *     rows too): cl/nvidia/decode_mma.cl instead, 16 * WR rows per work-group
 *     (WR = ceil(rows / 16), at most 4, more row blocks past 64 rows), one
 *     warp per 16-row m-tile (WK = 1 key slice: 16-key tiles; 2 at WR = 3),
 *     2 or 3 stages, splits for 4 work-groups per compute unit (2 at WR = 3)
 *     with at least 64 keys each (not 256);
 *     scale > 0 only (it takes the row max of raw scores); its partials go to
 *     the same decode_merge;
 *   the decode tuning (src/core/tuning_space.c) overrides every number above:
 *     kpt, prefetch, wg_per_cu, threads (work-items per work-group before the
 *     fit to the head dim), max_rows, stages (0: the register path, which also
 *     keeps the tensor-core kernel out), min_keys, and mma_min_rows (0: never),
 *     mma_wg_per_cu, mma_wk, mma_stages, mma_min_keys for the tensor-core
 *     kernel. A per-call tuning whose values do not run as given (they do not
 *     fit, or the kernel they belong to does not run) is refused.
 * Score variants (desc.window_left/right, alibi_slopes, softcap): decode.cl
 *   only (-DWINDOW/-DSOFTCAP/-DALIBI), so they keep the tensor-core kernel out;
 *   a left window caps the keys the split count is planned for at
 *   window_left + q_len + one tile.
 * Workspace (splits > 1): B * q_len * Hq * splits * (head_dim + 1) floats:
 *   desc.workspace, else the context's cached scratch (ctx->decode_scratch,
 *   allocated on first need, replaced by a larger one when a call needs more,
 *   released with the context), so that a call allocates nothing once warm. On
 *   an out-of-order queue each call on the scratch waits for the previous one's
 *   last command (kept in the context); an in-order queue orders them itself.
 */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "decode/decode.h"
#include "nvidia/nvidia.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FCL_DEC_THREADS 128
#define FCL_DEC_LOCAL_CAP (48 * 1024)
#define FCL_DEC_KEYS_PER_SPLIT 256
#define FCL_DEC_MAX_ROWS 8
#define FCL_DEC_KPT 2
#define FCL_DEC_WG_PER_CU 4
/* The cp.async path: 3 stages, 2 work-groups per compute unit. On the H100
 * (q_len 1, 32:8 heads, d = 128, batch 1, 32K keys, back-to-back calls) that is
 * 71% of copy bandwidth, against 66-67% at 4 per CU (3 or 4 stages alike) and
 * 63% for the register path; 2 stages 65%, 1 key per work-item 54-65%. */
#define FCL_DEC_STAGES 3
#define FCL_DEC_WG_PER_CU_ASYNC 2
/* The tensor-core kernel (cl/nvidia/decode_mma.cl). Measured on the H100 (32:8 heads,
 * d = 128, 32K and 128K keys, batch 1 and 8, back-to-back calls): it beats the
 * cp.async kernel at every row count, by 1-6% at 4 rows (one token) and by
 * 1.5x, 2.6x, 5.9x and 6x at 8, 16, 36 and 64 rows (2, 4, 9 and 16 tokens).
 * Planned with one warp per m-tile (16-key tiles) and 4 work-groups per CU;
 * 2 stages at d = 128 up to 32 rows (3 were 1-2% slower at 4 and 16 rows),
 * 3 at d = 64 (17% faster than 2) and at 64 rows (10% faster). At 33-48 rows
 * (3 m-tiles) two warps per m-tile, 2 stages and 2 per CU were 4% faster. */
#define FCL_DEC_MMA_MIN_ROWS 1
/* Its split floor: 64 keys (4 tiles) per split. flashcl-tune --decode on the
 * H100 found the best split counts at 43-171 keys per split for batch 1-4 and
 * 1K-16K keys; with the portable kernel's floor of 256, batch 1 at 8K keys
 * stopped at 32 splits, about 8% slower than 48-66 in three runs. Below 8K
 * keys a call takes ~20 us, near the launch cost, and the runs disagree. */
#define FCL_DEC_MMA_KEYS_PER_SPLIT 64

void flashcl_decode_desc_init(flashcl_decode_desc *desc) {
  if (!desc) return;
  memset(desc, 0, sizeof *desc);
  desc->window_left = -1;
  desc->window_right = -1;
}

flashcl_status fcl_check_kv_cache(flashcl_context *ctx, const flashcl_decode_desc *desc, const flashcl_tensor *kc,
                                  const flashcl_tensor *vc, int batch, fcl_kv_layout *out) {
  flashcl_status st;
  if (!desc) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
  if ((st = fcl_check_tensor(ctx, kc, "k_cache", 1)) || (st = fcl_check_tensor(ctx, vc, "v_cache", 1))) return st;
  if (kc->dtype != vc->dtype)
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "k_cache and v_cache dtypes differ (%s, %s)",
                    flashcl_dtype_name(kc->dtype), flashcl_dtype_name(vc->dtype));
  for (int i = 0; i < 4; i++)
    if (kc->shape[i] != vc->shape[i])
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "k_cache and v_cache must have the same shape");
  memset(out, 0, sizeof *out);
  out->heads_kv = (int)kc->shape[2];
  out->head_dim = (int)kc->shape[3];
  if (desc->block_table) {
    if (desc->page_size <= 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "paged cache: desc.page_size must be >= 1, got %d",
                      desc->page_size);
    if (desc->max_pages <= 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "paged cache: desc.max_pages must be >= 1, got %d",
                      desc->max_pages);
    if (kc->shape[1] != desc->page_size)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                      "paged cache: k_cache.shape[1] (%lld) must equal desc.page_size (%d); the cache tensors are "
                      "(num_pages, page_size, heads_kv, head_dim)",
                      (long long)kc->shape[1], desc->page_size);
    if ((int64_t)desc->max_pages * desc->page_size > INT_MAX)
      return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "max_pages * page_size exceeds the int32 range");
    size_t have = 0;
    if ((st = fcl_buffer_size(ctx, desc->block_table, "desc.block_table", &have)) != FLASHCL_SUCCESS) return st;
    size_t need = (size_t)batch * (size_t)desc->max_pages * sizeof(cl_int);
    if (have < need)
      return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                      "desc.block_table holds %zu bytes but batch %d x max_pages %d int32 need %zu", have, batch,
                      desc->max_pages, need);
    out->paged = 1;
    out->page_size = desc->page_size;
    out->max_pages = desc->max_pages;
    out->num_pages = (int)kc->shape[0];
    out->capacity = desc->max_pages * desc->page_size;
  } else {
    if (desc->page_size != 0 || desc->max_pages != 0)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                      "desc.page_size/max_pages (%d, %d) are set but desc.block_table is NULL", desc->page_size,
                      desc->max_pages);
    if (kc->shape[0] != batch)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                      "contiguous cache: k_cache batch (%lld) must equal the batch (%d)", (long long)kc->shape[0],
                      batch);
    out->capacity = (int)kc->shape[1];
    out->num_pages = batch;
  }
  return FLASHCL_SUCCESS;
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

typedef struct fcl_decode_plan {
  int batch, q_len, heads_q, heads_kv, head_dim, group;
  float scale;
  fcl_kv_layout kv;
  int rows, row_blocks, kpt, threads, tile, prefetch, vec_aligned, merge_threads, splits;
  int stages; /* cp.async stages (NVIDIA), 0: the register path */
  /* 1: cl/nvidia/decode_mma.cl (tensor cores, NVIDIA) with mma_wr x mma_wk warps */
  int mma, mma_wr, mma_wk, mma_stages;
  int window; /* 1: window_left or window_right >= 0 */
  int wg_per_cu; /* work-groups per compute unit the split count aims at */
  fcl_tuned tu;  /* the decode tuning, with the values that run */
  size_t local_bytes;
  size_t work_floats; /* 0 when unsplit */
} fcl_decode_plan;

/* cl/decode/decode.cl's Sh and Sc. */
static size_t fcl_dec_local_bytes(int d, int rows, int threads, int kpt, int stages) {
  const size_t tpk = (size_t)d / 8, kg = (size_t)threads / tpk, sr = kg * (size_t)kpt * (size_t)rows;
  const size_t part = 2 * tpk * (sr + 1), obuf = kg * (size_t)rows * (size_t)d;
  /* Stage slots: K and V of a tile (kg * kpt rows of d 16-bit elements), after
   * the partial dots rounded up to 16 bytes. */
  const size_t sh = stages ? (part + 3) / 4 * 4 + (size_t)stages * kg * (size_t)kpt * (size_t)d : part;
  return 4 * (sh > obuf ? sh : obuf) + 4 * 2 * sr;
}

/* cl/nvidia/decode_mma.cl's K | V stages, or the merge buffer reusing them, and Ml. */
static size_t fcl_dec_mma_local_bytes(int d, int wr, int wk, int stages) {
  const size_t kv = (size_t)stages * 2 * 16 * (size_t)wk * (size_t)d * 2, ob = (size_t)wr * 16 * (size_t)d * 4;
  return (kv > ob ? kv : ob) + 2 * (size_t)wk * (size_t)wr * 16 * 4;
}

/* 16-byte vector loads of 8 elements are aligned for every key row. */
static int fcl_dec_vec_aligned(const flashcl_tensor *t) {
  const size_t es = flashcl_dtype_size(t->dtype);
  if (t->offset % 16) return 0;
  for (int i = 0; i < 3; i++)
    if (((size_t)t->stride[i] * es) % 16) return 0;
  return 1;
}

/* The keys the splits are planned for: desc.max_seqlen_k, else the capacity;
 * with a left window at most window_left + q_len plus the tile the kernel
 * rounds the start down to. */
static long fcl_decode_lmax(const flashcl_decode_desc *desc, const fcl_decode_plan *p, int tile) {
  long lmax = desc->max_seqlen_k > 0 && desc->max_seqlen_k < p->kv.capacity ? desc->max_seqlen_k : p->kv.capacity;
  if (desc->window_left >= 0 && (long)desc->window_left + p->q_len + tile < lmax)
    lmax = (long)desc->window_left + p->q_len + tile;
  return lmax;
}

/* Whether the NVIDIA kernels may run: desc.kernel, else $FLASHCL_KERNEL under
 * AUTO; NVIDIA_MMA on a device without them fails. */
static flashcl_status fcl_decode_nvidia(flashcl_context *ctx, const flashcl_decode_desc *desc, int *nvidia) {
  flashcl_kernel_family fam = desc->kernel;
  if (fam == FLASHCL_KERNEL_AUTO) fam = ctx->env_kernel;
  *nvidia = 0;
  if (fam == FLASHCL_KERNEL_PORTABLE) return FLASHCL_SUCCESS;
  if (!fcl_mma_available(ctx)) {
    if (fam == FLASHCL_KERNEL_NVIDIA_MMA)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "the NVIDIA cp.async decode path is not available: %s",
                      ctx->mma_reason);
    return FLASHCL_SUCCESS;
  }
  *nvidia = 1;
  return FLASHCL_SUCCESS;
}

/* The tensor-core kernel where it applies (rows of a KV head's group, NVIDIA,
 * cp.async staging chosen, no score variants, d 64 or 128, aligned q rows),
 * with the decode tuning's mma_* values over the rule of the top of this file. */
static void fcl_decode_plan_mma(const flashcl_context *ctx, const flashcl_tensor *q, int variants, size_t cap,
                                fcl_decode_plan *p) {
  const int d = p->head_dim, need_rows = p->group * p->q_len;
  const int wr = need_rows >= 64 ? 4 : (need_rows + 15) / 16;
  const fcl_tuned *tu = &p->tu;
  /* Three m-tiles: two warps per m-tile (the 32-key tile's halves), 2 per CU. */
  const int min_rows = fcl_tuned_get(tu, FCL_DEC_P_MMA_MIN_ROWS, FCL_DEC_MMA_MIN_ROWS);
  const int wk = fcl_tuned_get(tu, FCL_DEC_P_MMA_WK, wr == 3 ? 2 : 1);
  int st2 = fcl_tuned_get(tu, FCL_DEC_P_MMA_STAGES, d == 64 || wr == 4 ? 3 : 2);
  while (st2 > 2 && fcl_dec_mma_local_bytes(d, wr, wk, st2) > cap) st2--;
  /* Only q and the caches decide (not o, which the workspace query does not
   * see), so that the query and the call plan the same split count. The
   * kernel keeps raw scores and their row max, which needs a positive scale. */
  if (min_rows > 0 && need_rows >= min_rows && p->scale > 0.0f && !variants && (d == 64 || d == 128) &&
      fcl_rows_aligned16(q) && fcl_dec_mma_local_bytes(d, wr, wk, st2) <= cap &&
      (size_t)(32 * wr * wk) <= ctx->info.max_work_group_size) {
    p->mma = 1;
    p->mma_wr = wr;
    p->mma_wk = wk;
    p->mma_stages = st2;
    p->row_blocks = (need_rows + 16 * wr - 1) / (16 * wr);
    p->wg_per_cu = fcl_tuned_get(tu, FCL_DEC_P_MMA_WG_PER_CU, wr == 3 ? 2 : 4);
  }
}

/* Rows per work-group, keys per work-item, work-group size, stages and the
 * kernel (see the top of this file), from the decode tuning over the rule. */
static flashcl_status fcl_decode_plan_kernel(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                             const flashcl_tensor *q, const flashcl_tensor *kc,
                                             const flashcl_tensor *vc, fcl_decode_plan *p) {
  const fcl_tuned *tu = &p->tu;
  const int d = p->head_dim, need_rows = p->group * p->q_len;
  const size_t max_wg = ctx->info.max_work_group_size;
  const int tpk = d / 8, cfg_threads = fcl_tuned_get(tu, FCL_DEC_P_THREADS, FCL_DEC_THREADS);
  int kg = cfg_threads / tpk > 0 ? cfg_threads / tpk : 1;
  while ((size_t)(tpk * kg) > max_wg && kg > 1) kg /= 2;
  const int threads = tpk * kg;
  if ((size_t)threads > max_wg || (size_t)(d / 4) > max_wg)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "the device's work-groups (%zu work-items) are too small",
                    max_wg);
  /* Merge: 128 work-items (a power of two >= head_dim / 4 that the device allows). */
  int mt = 128;
  while ((size_t)mt > max_wg && mt / 2 >= d / 4) mt /= 2;
  p->merge_threads = mt;
  int rows = 1;
  while (rows < need_rows && rows < fcl_tuned_get(tu, FCL_DEC_P_MAX_ROWS, FCL_DEC_MAX_ROWS)) rows *= 2;
  const size_t cap = ctx->info.local_mem_size < FCL_DEC_LOCAL_CAP ? ctx->info.local_mem_size : FCL_DEC_LOCAL_CAP;
  int kpt = fcl_tuned_get(tu, FCL_DEC_P_KPT, FCL_DEC_KPT), nvidia = 0, stages = 0;
  p->vec_aligned = fcl_dec_vec_aligned(kc) && fcl_dec_vec_aligned(vc);
  flashcl_status st = fcl_decode_nvidia(ctx, desc, &nvidia);
  if (st != FLASHCL_SUCCESS) return st;
  /* cp.async copies 16-byte pieces of 8 16-bit elements; fp32 caches and
   * unaligned rows keep the register path. */
  if (nvidia && q->dtype != FLASHCL_F32 && p->vec_aligned) stages = fcl_tuned_get(tu, FCL_DEC_P_STAGES, FCL_DEC_STAGES);
  if (stages == 1) stages = 0; /* one stage is no pipeline: cl/decode/decode.cl refuses it (a call's 1 is refused) */
  if (stages) {
    /* The cp.async kernel gives up stages (down to 2), then keys per work-item;
     * if even that does not fit, the register path starts over from kpt. */
    int k2 = kpt;
    while (fcl_dec_local_bytes(d, rows, threads, k2, stages) > cap && (stages > 2 || k2 > 1)) {
      if (stages > 2) stages--;
      else k2 /= 2;
    }
    if (fcl_dec_local_bytes(d, rows, threads, k2, stages) <= cap) kpt = k2;
    else stages = 0;
  }
  while (fcl_dec_local_bytes(d, rows, threads, kpt, stages) > cap && (kpt > 1 || rows > 1)) {
    if (kpt > 1) kpt /= 2;
    else rows /= 2;
  }
  if (fcl_dec_local_bytes(d, rows, threads, kpt, stages) > cap)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "decode at head_dim %d does not fit %zu bytes of local memory", d,
                    ctx->info.local_mem_size);
  p->rows = rows;
  p->row_blocks = (need_rows + rows - 1) / rows;
  p->kpt = kpt;
  p->threads = threads;
  p->tile = kg * kpt;
  p->prefetch = fcl_tuned_get(tu, FCL_DEC_P_PREFETCH, 1);
  p->stages = stages;
  p->local_bytes = fcl_dec_local_bytes(d, rows, threads, kpt, stages);
  p->wg_per_cu = fcl_tuned_get(tu, FCL_DEC_P_WG_PER_CU, stages ? FCL_DEC_WG_PER_CU_ASYNC : FCL_DEC_WG_PER_CU);
  p->mma = 0;
  if (stages) fcl_decode_plan_mma(ctx, q, p->window || desc->alibi_slopes || desc->softcap > 0.0f, cap, p);
  return FLASHCL_SUCCESS;
}

/* The split count (desc.num_splits, else one wave: the largest count whose
 * grid fits wg_per_cu work-groups per compute unit, since a second, partial
 * wave of whole chunks would cost as much as the first; at least min_keys
 * keys per split), and the values that ran, recorded in p->tu. */
static void fcl_decode_plan_splits(const flashcl_context *ctx, const flashcl_decode_desc *desc, fcl_decode_plan *p) {
  const int min_keys = p->mma ? fcl_tuned_get(&p->tu, FCL_DEC_P_MMA_MIN_KEYS, FCL_DEC_MMA_KEYS_PER_SPLIT)
                              : fcl_tuned_get(&p->tu, FCL_DEC_P_MIN_KEYS, FCL_DEC_KEYS_PER_SPLIT);
  int splits = desc->num_splits;
  if (splits == 0) {
    const int64_t base = (int64_t)p->batch * p->heads_kv * p->row_blocks;
    const int64_t cus = ctx->info.compute_units > 0 ? ctx->info.compute_units : 1;
    const int64_t lmax = fcl_decode_lmax(desc, p, p->tile);
    int64_t s = p->wg_per_cu * cus / base;
    if (s < 1) s = 1;
    const int64_t by_len = (lmax + min_keys - 1) / min_keys;
    if (s > by_len) s = by_len;
    if (s > FLASHCL_DECODE_MAX_SPLITS) s = FLASHCL_DECODE_MAX_SPLITS;
    splits = s < 1 ? 1 : (int)s;
  }
  p->splits = splits;
  fcl_tuned *tu = &p->tu;
  const int ran[FCL_DEC_P_COUNT] = {
      p->kpt, p->prefetch, p->mma ? fcl_tuned_get(tu, FCL_DEC_P_WG_PER_CU, FCL_DEC_WG_PER_CU_ASYNC) : p->wg_per_cu,
      fcl_tuned_get(tu, FCL_DEC_P_THREADS, FCL_DEC_THREADS), fcl_tuned_get(tu, FCL_DEC_P_MAX_ROWS, FCL_DEC_MAX_ROWS),
      p->stages, p->mma ? 0 : fcl_tuned_get(tu, FCL_DEC_P_MIN_KEYS, FCL_DEC_KEYS_PER_SPLIT),
      fcl_tuned_get(tu, FCL_DEC_P_MMA_MIN_ROWS, FCL_DEC_MMA_MIN_ROWS), p->mma ? p->wg_per_cu : 0,
      p->mma ? p->mma_wk : 0, p->mma ? p->mma_stages : 0,
      p->mma ? fcl_tuned_get(tu, FCL_DEC_P_MMA_MIN_KEYS, FCL_DEC_MMA_KEYS_PER_SPLIT) : 0};
  /* 0: the kernel that runs does not read it (a call that sets it is refused,
   * and flashcl-tune does not time it twice). */
  for (int i = 0; i < FCL_DEC_P_COUNT; i++) fcl_tuned_ran(tu, i, ran[i]);
}

static flashcl_status fcl_decode_check(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                       const flashcl_tensor *q, const flashcl_tensor *kc, const flashcl_tensor *vc,
                                       const flashcl_tensor *o, const flashcl_tensor *lse, fcl_decode_plan *p) {
  flashcl_status st;
  if (!desc) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
  if ((st = fcl_check_tensor(ctx, q, "q", 1))) return st;
  if (o && (st = fcl_check_tensor(ctx, o, "o", 1))) return st;
  if (lse && (st = fcl_check_tensor(ctx, lse, "lse", 0))) return st;
  const int batch = (int)q->shape[0];
  if ((st = fcl_check_kv_cache(ctx, desc, kc, vc, batch, &p->kv))) return st;
  if (kc->dtype != q->dtype || (o && o->dtype != q->dtype))
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "q, the caches and o must share one dtype (q %s, cache %s%s%s)",
                    flashcl_dtype_name(q->dtype), flashcl_dtype_name(kc->dtype), o ? ", o " : "",
                    o ? flashcl_dtype_name(o->dtype) : "");
  if (lse && lse->dtype != FLASHCL_F32)
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "lse must be f32, got %s", flashcl_dtype_name(lse->dtype));
  if (!isfinite(desc->scale)) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.scale must be finite");
  if (desc->num_splits < 0 || desc->num_splits > FLASHCL_DECODE_MAX_SPLITS)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.num_splits must be in [0, %d], got %d",
                    FLASHCL_DECODE_MAX_SPLITS, desc->num_splits);
  if (desc->max_seqlen_k < 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.max_seqlen_k must be >= 0, got %d",
                    desc->max_seqlen_k);
  const int64_t d = q->shape[3];
  if (kc->shape[3] != d)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "head_dim differs: q %lld, cache %lld", (long long)d,
                    (long long)kc->shape[3]);
  if (d % 8 != 0 || d < 8 || d > 256)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "head_dim %lld is not supported: it must be a multiple of 8 in [8, 256]", (long long)d);
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
  if (o && (o->shape[0] != q->shape[0] || o->shape[1] != q_len || o->shape[2] != hq || o->shape[3] != d))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "o must have q's shape");
  if (lse && (lse->shape[0] != q->shape[0] || lse->shape[1] != q_len || lse->shape[2] != hq || lse->shape[3] != 1))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "lse must have logical shape (batch, q_len, heads_q, 1)");
  if ((st = fcl_check_output_distinct(ctx, o, "o")) || (st = fcl_check_output_distinct(ctx, lse, "lse"))) return st;
  if (fcl_views_conflict(o, q, 0) || fcl_views_conflict(o, kc, 0) || fcl_views_conflict(o, vc, 0) ||
      fcl_views_conflict(lse, q, 0) || fcl_views_conflict(lse, kc, 0) || fcl_views_conflict(lse, vc, 0) ||
      fcl_views_conflict(lse, o, 0))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "o or lse overlaps q, the caches or each other");
  if (desc->workspace && desc->workspace_offset % sizeof(float))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.workspace_offset must be a multiple of 4");
  if ((st = fcl_check_variants(ctx, desc->window_left, desc->window_right, desc->softcap, desc->alibi_slopes, hq)))
    return st;
  if (desc->tree_mask) {
    size_t have = 0;
    const size_t need = (size_t)batch * (size_t)q_len * sizeof(cl_uint); /* q_len <= 16: no overflow */
    if ((st = fcl_buffer_size(ctx, desc->tree_mask, "desc.tree_mask", &have)) != FLASHCL_SUCCESS) return st;
    if (have < need)
      return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                      "desc.tree_mask holds %zu bytes; batch %d x q_len %lld uint32 words (%zu bytes) are needed",
                      have, batch, (long long)q_len, need);
  }

  p->batch = batch;
  p->q_len = (int)q_len;
  p->heads_q = (int)hq;
  p->heads_kv = (int)hkv;
  p->head_dim = (int)d;
  p->group = (int)(hq / hkv);
  p->scale = desc->scale != 0.0f ? desc->scale : (float)(1.0 / sqrt((double)d));
  p->window = desc->window_left >= 0 || desc->window_right >= 0;
  if (desc->kernel < FLASHCL_KERNEL_AUTO || desc->kernel > FLASHCL_KERNEL_NVIDIA_MMA)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.kernel (%d) is not a flashcl_kernel_family",
                    (int)desc->kernel);
  flashcl_tuning_family want;
  if ((st = fcl_tuning_call_family(ctx, desc->tuning, FLASHCL_PASS_FORWARD, 1, &want))) return st;
  const fcl_tune_key key = {p->head_dim, q->dtype, 0, -1, fcl_decode_lmax(desc, p, 0)};
  fcl_tuning_resolve(ctx, FLASHCL_TUNE_DECODE, desc->tuning, &key, &p->tu);
  if ((st = fcl_decode_plan_kernel(ctx, desc, q, kc, vc, p))) return st;
  fcl_decode_plan_splits(ctx, desc, p);
  p->work_floats = 0;
  if (p->splits > 1) {
    size_t rows_total, f, f_bytes;
    if (!fcl_mul_size((size_t)batch * (size_t)q_len, (size_t)hq, &rows_total) ||
        !fcl_mul_size(rows_total, (size_t)p->splits, &f) || !fcl_mul_size(f, (size_t)d + 1, &f) ||
        !fcl_mul_size(f, sizeof(float), &f_bytes))
      return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "decode workspace size overflows size_t");
    p->work_floats = f;
  }
  return fcl_tuned_honoured(ctx, &p->tu);
}

flashcl_status flashcl_attention_decode_workspace_size(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                                       const flashcl_tensor *q, const flashcl_tensor *k_cache,
                                                       const flashcl_tensor *v_cache, size_t *bytes,
                                                       int *num_splits) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  if (!bytes) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  fcl_decode_plan p;
  flashcl_status st = fcl_decode_check(ctx, desc, q, k_cache, v_cache, NULL, NULL, &p);
  if (st != FLASHCL_SUCCESS) return st;
  *bytes = p.work_floats * sizeof(float);
  if (num_splits) *num_splits = p.splits;
  return FLASHCL_SUCCESS;
}

static void fcl_arg_lse_or_null(fcl_args *a, const flashcl_tensor *lse) {
  if (lse) {
    fcl_arg_mem(a, lse->buffer);
    fcl_arg_long(a, (int64_t)(lse->offset / sizeof(float)));
    fcl_arg_long(a, lse->stride[0]);
    fcl_arg_long(a, lse->stride[1]);
    fcl_arg_long(a, lse->stride[2]);
  } else {
    fcl_arg_mem(a, NULL);
    for (int i = 0; i < 4; i++) fcl_arg_long(a, 0);
  }
  fcl_arg_int(a, lse != NULL);
}

/* 1 if the context's queue is in-order (asked once, cached in the scratch state). */
static int fcl_decode_queue_in_order(flashcl_context *ctx) {
  struct fcl_decode_scratch *sc = &ctx->decode_scratch;
  if (!sc->queue_ooo) {
    cl_command_queue_properties qp = 0;
    cl_int e = clGetCommandQueueInfo(ctx->queue, CL_QUEUE_PROPERTIES, sizeof qp, &qp, NULL);
    /* Unknown counts as out-of-order (the safe side). */
    sc->queue_ooo = e == CL_SUCCESS && !(qp & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) ? 1 : 2;
  }
  return sc->queue_ooo == 1;
}

/* The context's cached scratch (desc.workspace NULL), grown to at least `need`
 * bytes (rounded up to 64 KiB). A replaced buffer is released at once: OpenCL
 * frees it once the commands already enqueued on it finish. */
static flashcl_status fcl_decode_scratch(flashcl_context *ctx, size_t need, cl_mem *out) {
  struct fcl_decode_scratch *sc = &ctx->decode_scratch;
  if (!sc->mem || sc->bytes < need) {
    const size_t gran = 64 * 1024;
    size_t bytes = need;
    if (need <= SIZE_MAX - (gran - 1)) bytes = (need + gran - 1) / gran * gran;
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS || !m) {
      /* Retry at the exact size before giving up. */
      if (bytes != need) m = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, need, NULL, &err);
      if (err != CL_SUCCESS || !m) return fcl_cl_fail(ctx, err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES,
                                                       "clCreateBuffer(decode workspace)");
      bytes = need;
    }
    if (sc->mem) clReleaseMemObject(sc->mem);
    /* Nothing enqueued so far uses the new buffer. */
    if (sc->last) clReleaseEvent(sc->last);
    sc->last = NULL;
    sc->mem = m;
    sc->bytes = bytes;
  }
  *out = sc->mem;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_attention_decode(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                        const flashcl_tensor *q, const flashcl_tensor *k_cache,
                                        const flashcl_tensor *v_cache, cl_mem seqlens_k, const flashcl_tensor *o,
                                        const flashcl_tensor *lse, cl_uint num_events_in_wait_list,
                                        const cl_event *event_wait_list, cl_event *out_event) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  if (!o) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "o is NULL");
  if (num_events_in_wait_list && !event_wait_list)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "num_events_in_wait_list is %u but event_wait_list is NULL",
                    num_events_in_wait_list);
  fcl_decode_plan p;
  flashcl_status st = fcl_decode_check(ctx, desc, q, k_cache, v_cache, o, lse, &p);
  if (st != FLASHCL_SUCCESS) return st;
  if ((st = fcl_check_seqlens(ctx, seqlens_k, "seqlens_k", p.batch))) return st;
  const int split = p.splits > 1;
  const size_t need = p.work_floats * sizeof(float);
  cl_mem work = NULL;
  if (split && desc->workspace) {
    size_t have = 0;
    if ((st = fcl_buffer_size(ctx, desc->workspace, "desc.workspace", &have)) != FLASHCL_SUCCESS) return st;
    if (desc->workspace_offset > have || have - desc->workspace_offset < need)
      return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                      "desc.workspace holds %zu bytes; offset %zu + %zu bytes of split partials are needed", have,
                      desc->workspace_offset, need);
    work = desc->workspace;
  }
  {
    /* The buffers the kernels read must not share bytes with o or lse; the split
     * partials are written, so their range must not touch any tensor or buffer
     * of the call. */
    const size_t b4 = (size_t)p.batch * sizeof(cl_int);
    fcl_aux aux[5];
    int n = 0;
    aux[n++] = (fcl_aux){seqlens_k, 0, b4, "seqlens_k"};
    if (p.kv.paged) aux[n++] = (fcl_aux){desc->block_table, 0, b4 * (size_t)p.kv.max_pages, "desc.block_table"};
    if (desc->tree_mask) aux[n++] = (fcl_aux){desc->tree_mask, 0, b4 * (size_t)p.q_len, "desc.tree_mask"};
    if (desc->alibi_slopes)
      aux[n++] = (fcl_aux){desc->alibi_slopes, 0, (size_t)p.heads_q * sizeof(float), "desc.alibi_slopes"};
    const flashcl_tensor *outs[2] = {o, lse};
    static const char *const out_names[2] = {"o", "lse"};
    if ((st = fcl_check_aux_buffers(ctx, aux, n, outs, out_names, 2))) return st;
    if (work) {
      const fcl_aux w = {work, desc->workspace_offset, need, "desc.workspace"};
      const flashcl_tensor *all[5] = {q, k_cache, v_cache, o, lse};
      static const char *const all_names[5] = {"q", "k_cache", "v_cache", "o", "lse"};
      if ((st = fcl_check_aux_buffers(ctx, &w, 1, all, all_names, 5))) return st;
      for (int i = 0; i < n; i++)
        if (aux[i].mem == work && aux[i].offset < desc->workspace_offset + need &&
            desc->workspace_offset < aux[i].offset + aux[i].bytes)
          return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.workspace overlaps %s", aux[i].name);
    }
  }
  /* 1: the partials go to the context's cached scratch. */
  const int cached = split && !work;
  const int in_order = fcl_decode_queue_in_order(ctx);

  const int page_shift = p.kv.paged ? fcl_page_shift(p.kv.page_size) : -1;
  char opts[512];
  const char *extra = ctx->build_options;
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DROWS=%d -DNTHREADS=%d -DKPT=%d -DPREFETCH=%d "
           "-DVEC_ALIGNED=%d -DSPLIT=%d -DPAGED=%d -DPAGE_SHIFT=%d -DTREE_MASK=%d -DMERGE_THREADS=%d "
           "-DMERGE_MAX_SPLITS=%d -DASYNC_STAGES=%d -DUSE_PTX=%d -DWINDOW=%d -DSOFTCAP=%d -DALIBI=%d%s%s",
           (int)q->dtype, p.head_dim, p.rows, p.threads, p.kpt, p.prefetch, p.vec_aligned, split, p.kv.paged,
           page_shift, desc->tree_mask != NULL, p.merge_threads, FLASHCL_DECODE_MAX_SPLITS, p.stages,
           p.stages > 0, p.window, desc->softcap > 0.0f, desc->alibi_slopes != NULL, extra ? " " : "",
           extra ? extra : "");
  /* The cp.async helpers live in mma_ptx.cl, compiled first into the same program. */
  const char *file = p.stages ? "mma_ptx.cl+dtype.cl+decode.cl" : "dtype.cl+decode.cl";
  cl_kernel kern, merge = NULL;
  int threads = p.threads;
  if (p.mma) {
    char mopts[384];
    threads = 32 * p.mma_wr * p.mma_wk;
    snprintf(mopts, sizeof mopts,
             "-cl-std=CL1.2 -DUSE_PTX=1 -DDTYPE=%d -DHEAD_DIM=%d -DWR=%d -DWK=%d -DKV_STAGES=%d -DSPLIT=%d "
             "-DPAGED=%d -DPAGE_SHIFT=%d -DTREE_MASK=%d%s%s",
             (int)q->dtype, p.head_dim, p.mma_wr, p.mma_wk, p.mma_stages, split, p.kv.paged, page_shift,
             desc->tree_mask != NULL, extra ? " " : "", extra ? extra : "");
    if ((st = fcl_get_kernel(ctx, "mma_ptx.cl+decode_mma.cl", mopts, "decode_mma", &kern))) return st;
    if (ctx->verbose >= 2) fcl_print_build_log(ctx, kern, "decode_mma", mopts);
    size_t mwg = 0;
    if (clGetKernelWorkGroupInfo(kern, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof mwg, &mwg, NULL) ==
            CL_SUCCESS &&
        mwg < (size_t)threads) {
      /* Its registers do not allow that many warps (a tuning override): the
       * cp.async kernel, planned for the same split count, takes the call. */
      fcl_log(ctx, "decode_mma: %d work-items planned, %zu allowed; running decode_attn", threads, mwg);
      p.mma = 0;
      p.row_blocks = (p.group * p.q_len + p.rows - 1) / p.rows;
      threads = p.threads;
    }
  }
  if (!p.mma && (st = fcl_get_kernel(ctx, file, opts, "decode_attn", &kern))) return st;
  if (split && (st = fcl_get_kernel(ctx, file, opts, "decode_merge", &merge))) return st;
  size_t kwg = 0;
  /* (decode_mma was checked above.) */
  if (!p.mma &&
      clGetKernelWorkGroupInfo(kern, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) ==
          CL_SUCCESS &&
      kwg < (size_t)threads)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "%s needs %d work-items but the compiled kernel allows %zu",
                    p.mma ? "decode_mma" : "decode_attn", threads, kwg);

  if (cached && (st = fcl_decode_scratch(ctx, need, &work))) return st;
  const int64_t wo_off =
      split ? (int64_t)((cached ? 0 : desc->workspace_offset) / sizeof(float)) : 0;
  const int64_t wl_off = wo_off + (int64_t)(p.work_floats / ((size_t)p.head_dim + 1) * (size_t)p.head_dim);

  const float log2e = 1.4426950408889634f;
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, q);
  fcl_arg_tensor(&a, k_cache);
  fcl_arg_tensor(&a, v_cache);
  fcl_arg_tensor(&a, o);
  fcl_arg_lse_or_null(&a, lse);
  fcl_arg_mem(&a, seqlens_k);
  fcl_arg_mem(&a, desc->tree_mask);
  fcl_arg_mem(&a, p.kv.paged ? desc->block_table : NULL);
  fcl_arg_int(&a, p.kv.max_pages);
  fcl_arg_int(&a, p.kv.page_size);
  fcl_arg_int(&a, p.kv.num_pages);
  fcl_arg_int(&a, p.kv.capacity);
  fcl_arg_int(&a, p.q_len);
  fcl_arg_int(&a, p.group);
  fcl_arg_int(&a, p.heads_q);
  fcl_arg_int(&a, p.row_blocks);
  fcl_arg_int(&a, p.splits);
  fcl_arg_float(&a, p.scale * log2e);
  fcl_arg_mem(&a, work);
  fcl_arg_long(&a, wo_off);
  fcl_arg_long(&a, wl_off);
  if (!p.mma) { /* decode_attn's score variants (decode_mma never runs with them) */
    fcl_arg_int(&a, desc->window_left);
    fcl_arg_int(&a, desc->window_right);
    fcl_arg_mem(&a, desc->alibi_slopes);
    fcl_arg_float(&a, desc->softcap > 0.0f ? 0.6931471805599453f / desc->softcap : 0.0f);
    fcl_arg_float(&a, desc->softcap * log2e);
  }
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(decode)");

  /* On an out-of-order queue a call on the cached scratch waits for the previous
   * one (its merge still reads the partials); an in-order queue orders them. */
  struct fcl_decode_scratch *sc = &ctx->decode_scratch;
  const int chain = cached && !in_order;
  const cl_event *wait = num_events_in_wait_list ? event_wait_list : NULL;
  cl_uint nwait = num_events_in_wait_list;
  cl_event wait_buf[16], *wait_heap = NULL;
  if (chain && sc->last) {
    cl_event *w = wait_buf;
    if (nwait + 1 > sizeof wait_buf / sizeof wait_buf[0]) {
      wait_heap = malloc(sizeof(cl_event) * ((size_t)nwait + 1));
      if (!wait_heap) return fcl_fail(ctx, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "out of host memory");
      w = wait_heap;
    }
    for (cl_uint i = 0; i < nwait; i++) w[i] = event_wait_list[i];
    w[nwait++] = sc->last;
    wait = w;
  }

  size_t global[3] = {(size_t)threads * p.splits, (size_t)p.heads_kv * p.row_blocks, (size_t)p.batch};
  size_t local[3] = {(size_t)threads, 1, 1};
  /* Events only where something waits on them: with profiling on, an event costs
   * the NVIDIA driver ~8 us of host time per enqueue (a third of a short call). */
  cl_event ev = NULL, done = NULL;
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, local, nwait, wait,
                                      split ? (in_order ? NULL : &ev) : out_event ? &done : NULL);
  free(wait_heap);
  const char *failed = "clEnqueueNDRangeKernel(decode)";
  if (err == CL_SUCCESS && split) {
    /* The merge's arguments are set once the attention kernel is on its way
     * (a single call's latency includes the host time before that enqueue). */
    fcl_args m = {merge, 0, CL_SUCCESS};
    fcl_arg_mem(&m, work);
    fcl_arg_long(&m, wo_off);
    fcl_arg_long(&m, wl_off);
    fcl_arg_int(&m, p.splits);
    fcl_arg_int(&m, p.q_len);
    fcl_arg_int(&m, p.heads_q);
    fcl_arg_tensor(&m, o);
    fcl_arg_lse_or_null(&m, lse);
    if ((err = m.err) != CL_SUCCESS) {
      failed = "clSetKernelArg(decode_merge)";
    } else {
      /* Out-of-order queues (flashcl_context_create_from_cl) order the merge by event. */
      size_t mg[3] = {(size_t)p.merge_threads, (size_t)p.q_len * p.heads_q, (size_t)p.batch};
      size_t ml[3] = {(size_t)p.merge_threads, 1, 1};
      err = clEnqueueNDRangeKernel(ctx->queue, merge, 3, NULL, mg, ml, ev ? 1 : 0, ev ? &ev : NULL,
                                   (out_event || chain) ? &done : NULL);
    }
    /* If the merge cannot be enqueued the partials are lost, but o and lse are untouched. */
  }
  if (chain && (done || ev)) {
    /* The scratch's last user: the merge, or the attention kernel if the merge
     * could not be enqueued. */
    if (sc->last) clReleaseEvent(sc->last);
    sc->last = done ? done : ev;
    clRetainEvent(sc->last);
  }
  if (out_event && err == CL_SUCCESS) *out_event = done;
  else if (done) clReleaseEvent(done);
  if (ev) clReleaseEvent(ev);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, failed);
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_decode_config(flashcl_context *ctx, const flashcl_decode_desc *desc, const flashcl_tensor *q,
                                     const flashcl_tensor *k_cache, const flashcl_tensor *v_cache,
                                     flashcl_config *config) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  if (!config) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "config is NULL");
  fcl_decode_plan p;
  flashcl_status st = fcl_decode_check(ctx, desc, q, k_cache, v_cache, NULL, NULL, &p);
  if (st != FLASHCL_SUCCESS) return st;
  flashcl_config c;
  memset(&c, 0, sizeof c);
  fcl_tuned_report(&p.tu, &c);
  snprintf(c.kernel, sizeof c.kernel, "%s", p.mma ? "decode_mma" : p.stages ? "decode_attn (cp.async)" : "decode_attn");
  c.block_r = p.mma ? 16 * p.mma_wr : p.rows;
  c.block_c = p.mma ? 16 * p.mma_wk : p.tile;
  c.threads = p.mma ? 32 * p.mma_wr * p.mma_wk : p.threads;
  c.local_bytes = p.mma ? fcl_dec_mma_local_bytes(p.head_dim, p.mma_wr, p.mma_wk, p.mma_stages) : p.local_bytes;
  *config = c;
  return FLASHCL_SUCCESS;
}
