/* The plan of flashcl_attention_decode (cl/decode/decode.cl,
 * cl/decode/decode_cpu.cl and cl/nvidia/decode_mma.cl): kernel, rows, tiles,
 * stages and split count.
 *
 * Devices that are not GPUs run decode_cpu.cl's kernel (one work-item per
 * work-group; fcl_decode_plan_cpu), unless the call asks for the one-launch
 * merge or the NVIDIA kernels; the split count below applies to it too.
 *
 * Plan (per call, from the shapes only; GPUs):
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
 *   merge: decode_merge, 128 work-items per (sequence, token, query head) row,
 *     the splits spread over them; with the tuning's merge = 1, on the
 *     context's scratch and where the fence reaches every work-group, the
 *     attention kernel's own work-groups in the same launch
 *     (cl/decode/split_merge.cl);
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
 *     kernel, merge, and map, cpu_block_c, cpu_rows for the CPU kernel. A
 *     per-call tuning whose values do not run as given (they do not fit, or
 *     the kernel they belong to does not run) is refused.
 * Quantized caches (an I8 / F8 side, flashcl.h "Quantized KV cache"): the
 *   tensor-core kernel where it applies (as above, with fp16/bf16 tokens and
 *   16-byte aligned cache rows; any scale layout), which copies the codes through cp.async and
 *   dequantizes each tile in local memory; else the register path of
 *   decode.cl, which dequantizes on load. decode.cl's cp.async stages copy
 *   16-bit rows only, so a quantized call never takes them.
 * Score variants (desc.score.window_left/right, alibi_slopes, softcap): decode.cl
 *   only (-DWINDOW/-DSOFTCAP/-DALIBI), so they keep the tensor-core kernel out;
 *   a left window caps the keys the split count is planned for at
 *   window_left + q_len + one tile.
 * Workspace (splits > 1): B * q_len * Hq * splits * (head_dim_v + 1) floats:
 *   desc.split.workspace, else the context's cached scratch (ctx->decode_scratch,
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
/* The CPU kernel's rule (fcl_decode_plan_cpu). */
#define FCL_DEC_CPU_BLOCK_C 64
#define FCL_DEC_CPU_ROWS 64
#define FCL_DEC_CPU_TILE_BYTES (64 * 1024)
#define FCL_DEC_CPU_PRIVATE (256 * 1024)
#define FCL_DEC_LOCAL_CAP (48 * 1024)
#define FCL_DEC_KEYS_PER_SPLIT 256
#define FCL_DEC_MAX_ROWS 8
#define FCL_DEC_KPT 2
#define FCL_DEC_WG_PER_CU 4
/* The cp.async path: 3 stages, 2 work-groups per compute unit: on the H100
 * (one token, 32:8 heads, d = 128, batch 1, 32K keys) the largest share of copy
 * bandwidth, above 4 per CU (3 or 4 stages alike), 2 stages, 1 key per
 * work-item and the register path (BENCHMARKS.md). */
#define FCL_DEC_STAGES 3
#define FCL_DEC_WG_PER_CU_ASYNC 2
/* The tensor-core kernel (cl/nvidia/decode_mma.cl). On the H100 (32:8 heads,
 * d = 128, 32K and 128K keys, batch 1 and 8) it beats the cp.async kernel at
 * every row count: narrowly at 4 rows (one token), by a wide and growing margin
 * from 8 rows (2 tokens) on (BENCHMARKS.md). Planned with one warp per m-tile
 * (16-key tiles) and 4 work-groups per CU; 2 stages at d = 128 up to 32 rows
 * (3 were slightly slower), 3 at d = 64 and at 64 rows (faster than 2 there).
 * At 33-48 rows (3 m-tiles) two warps per m-tile, 2 stages and 2 per CU were
 * faster. */
#define FCL_DEC_MMA_MIN_ROWS 1
/* With a quantized cache (int8, fp8) the kernel dequantizes every tile in
 * local memory, and a work-group's tiles run one after another: more
 * work-groups per CU keep more tiles in flight. On the H100, 8 instead of 4
 * was faster for every format and scale layout at 32K keys (batch 1 and 8)
 * and at 4K keys, batch 8; at 4K keys, batch 1 (a few microseconds) it ranged
 * from faster to 22% slower (BENCHMARKS.md, "Quantized KV cache on the
 * tensor-core decode"). */
#define FCL_DEC_MMA_WG_PER_CU_QUANT 8
/* Its split floor: 64 keys (4 tiles) per split. flashcl-tune --decode on the
 * H100 found the best split counts at 43-171 keys per split for batch 1-4 and
 * 1K-16K keys; the portable kernel's floor of 256 held batch 1 at 8K keys to
 * 32 splits, slower than 48-66 (BENCHMARKS.md). Below 8K keys a call costs
 * about a launch, and the runs disagree. */
#define FCL_DEC_MMA_KEYS_PER_SPLIT 64
/* Split partials: merged by decode_merge, a second kernel (0), rather than in
 * the attention kernel's own launch (1, cl/decode/split_merge.cl). On the
 * H100 the one-launch form was 2-12% slower from 4K keys on, and at 1K keys
 * 6-9% faster in one call and 15% slower in another (BENCHMARKS.md); it
 * also leans on fence
 * behaviour OpenCL 1.2 does not promise: a tuning file turns it on where
 * flashcl-tune measured it faster. */
#define FCL_DEC_MERGE_LAST 0


/* cl/decode/split_merge.cl's SM_LOCAL_FLOATS: the local floats of the
 * one-launch merge for row blocks of `rows` rows, which reuses the kernel's
 * local memory. */
size_t fcl_dec_merge_floats(int rows) { return (size_t)rows * 16 + 1; }

/* split_merge.cl's counters per row block for S splits: ceil(S / G) groups,
 * G = ceil(sqrt(S)), and the block's. */
int fcl_dec_merge_counters(int splits) {
  int g = 1;
  while (g * g < splits) g++;
  return (splits + g - 1) / g + 1;
}

/* cl/decode/decode.cl's Sh and Sc; merge_floats: at least that many in Sh
 * (MERGE_LAST), else 0. */
static size_t fcl_dec_local_bytes(int d, int rows, int threads, int kpt, int stages, size_t merge_floats) {
  const size_t tpk = (size_t)d / 8, kg = (size_t)threads / tpk, sr = kg * (size_t)kpt * (size_t)rows;
  const size_t part = 2 * tpk * (sr + 1), obuf = kg * (size_t)rows * (size_t)d;
  /* Stage slots: K and V of a tile (kg * kpt rows of d 16-bit elements), after
   * the partial dots rounded up to 16 bytes. */
  size_t sh = stages ? (part + 3) / 4 * 4 + (size_t)stages * kg * (size_t)kpt * (size_t)d : part;
  if (sh < obuf) sh = obuf;
  if (sh < merge_floats) sh = merge_floats;
  return 4 * sh + 4 * 2 * sr;
}

/* Scales per key row a quantized side's stage carries (decode_mma.cl's NSC):
 * TOKEN 1, BLOCK32 d / 32, HEAD and TENSOR none. */
static size_t fcl_dec_row_scales(int quant, int kind, int d) {
  if (!quant) return 0;
  return kind == FLASHCL_KV_SCALE_TOKEN ? 1 : kind == FLASHCL_KV_SCALE_BLOCK32 ? (size_t)d / 32 : 0;
}

/* Half-bytes per element of one cache side as stored: 4 (16-bit), 2 (a
 * one-byte format), 1 (int4). */
static size_t fcl_dec_side_halves(int quant, flashcl_dtype dtype) {
  return !quant ? 4 : dtype == FLASHCL_I4X2 ? 1 : 2;
}

/* cl/nvidia/decode_mma.cl's K | V stages (a quantized side's rows one byte
 * per element, half a byte for int4, and its row scales) and dequantized
 * tiles, or the merge buffer reusing them, and Ml. */
size_t fcl_dec_mma_local_bytes(int d, int wr, int wk, int stages, const fcl_kv_info *kv, size_t merge_floats) {
  const int kq = kv->k_quant, vq = kv->v_quant;
  const size_t keys = 16 * (size_t)wk, row = keys * (size_t)d; /* one side's tile: keys, elements */
  const size_t nsc = fcl_dec_row_scales(kq, kv->k_scale_kind, d) + fcl_dec_row_scales(vq, kv->v_scale_kind, d);
  const size_t halves = fcl_dec_side_halves(kq, kv->k_dtype) + fcl_dec_side_halves(vq, kv->v_dtype);
  const size_t stage = row * halves / 2 + keys * 4 * nsc;
  const size_t kvb = (size_t)stages * stage + (size_t)(kq + vq) * row * 2;
  const size_t ob = (size_t)wr * 16 * (size_t)d * 4, mb = (merge_floats + 3) / 4 * 16;
  size_t smem = kvb > ob ? kvb : ob;
  if (smem < mb) smem = mb;
  return smem + 2 * (size_t)wk * (size_t)wr * 16 * 4;
}

/* 16-byte vector loads of 8 elements are aligned for every key row. */
static int fcl_dec_vec_aligned(const flashcl_tensor *t) {
  const size_t es = flashcl_dtype_size(t->dtype);
  if (t->offset % 16) return 0;
  for (int i = 0; i < 3; i++)
    if (((size_t)t->stride[i] * es) % 16) return 0;
  return 1;
}

/* The keys the splits are planned for: desc.split.max_seqlen_k, else the capacity;
 * with a left window at most window_left + q_len plus the tile the kernel
 * rounds the start down to. */
static long fcl_decode_lmax(const flashcl_decode_desc *desc, const fcl_decode_plan *p, int tile) {
  long lmax = desc->split.max_seqlen_k > 0 && desc->split.max_seqlen_k < p->kv.capacity ? desc->split.max_seqlen_k : p->kv.capacity;
  if (desc->score.window_left >= 0 && (long)desc->score.window_left + p->q_len + tile < lmax)
    lmax = (long)desc->score.window_left + p->q_len + tile;
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
    if (fam == FLASHCL_KERNEL_NVIDIA_MMA) return fcl_mma_refusal(ctx, "the NVIDIA cp.async decode kernels");
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
  const int kq = p->kv.k_quant, vq = p->kv.v_quant;
  const int d = p->head_dim, need_rows = p->group * p->q_len;
  const int wr = need_rows >= 64 ? 4 : (need_rows + 15) / 16;
  const fcl_tuned *tu = &p->tu;
  /* Three m-tiles: two warps per m-tile (the 32-key tile's halves), 2 per CU. */
  const int min_rows = fcl_tuned_get(tu, FCL_DEC_P_MMA_MIN_ROWS, FCL_DEC_MMA_MIN_ROWS);
  const int wk = fcl_tuned_get(tu, FCL_DEC_P_MMA_WK, wr == 3 ? 2 : 1);
  int st2 = fcl_tuned_get(tu, FCL_DEC_P_MMA_STAGES, d == 64 || wr == 4 ? 3 : 2);
  const size_t mf = fcl_tuned_get(tu, FCL_DEC_P_MERGE, FCL_DEC_MERGE_LAST) ? fcl_dec_merge_floats(16 * wr) : 0;
  while (st2 > 2 && fcl_dec_mma_local_bytes(d, wr, wk, st2, &p->kv, mf) > cap) st2--;
  /* Only q and the caches decide (not o, which the workspace query does not
   * see), so that the query and the call plan the same split count. The
   * kernel keeps raw scores and their row max, which needs a positive scale. */
  if (min_rows > 0 && need_rows >= min_rows && p->scale > 0.0f && !variants && p->head_dim_v == d &&
      (d == 64 || d == 128) &&
      fcl_rows_aligned16(q) && fcl_dec_mma_local_bytes(d, wr, wk, st2, &p->kv, mf) <= cap &&
      (size_t)(32 * wr * wk) <= ctx->info.max_work_group_size) {
    p->mma = 1;
    p->mma_wr = wr;
    p->mma_wk = wk;
    p->mma_stages = st2;
    p->row_blocks = (need_rows + 16 * wr - 1) / (16 * wr);
    /* A quantized cache's tiles are half the bytes and cost a dequantization
     * each: more work-groups per CU, so that more of them are in flight. */
    p->wg_per_cu =
        fcl_tuned_get(tu, FCL_DEC_P_MMA_WG_PER_CU, wr == 3 ? 2 : kq || vq ? FCL_DEC_MMA_WG_PER_CU_QUANT : 4);
  }
}

/* The CPU kernel (cl/decode/decode_cpu.cl): one work-item per work-group owns
 * up to cpu_rows rows (a multiple of 4; fewer where its Q, S and O rows would
 * pass FCL_DEC_CPU_PRIVATE bytes) and walks the keys in tiles of cpu_block_c
 * (halved until the K and V tiles fit min(local memory,
 * FCL_DEC_CPU_TILE_BYTES)). */
static flashcl_status fcl_decode_plan_cpu(flashcl_context *ctx, fcl_decode_plan *p) {
  const fcl_tuned *tu = &p->tu;
  const int d = p->head_dim, dv = p->head_dim_v, need_rows = p->group * p->q_len;
  const size_t M = ctx->info.local_mem_size, budget = M < FCL_DEC_CPU_TILE_BYTES ? M : FCL_DEC_CPU_TILE_BYTES;
  /* A tuned tile that the local memory does not take gives way to the rule
   * (a call's own is then refused: fcl_tuned_honoured). */
  const int tuned_bc = fcl_tuned_get(tu, FCL_DEC_P_CPU_BLOCK_C, 0);
  int bc = FCL_DEC_CPU_BLOCK_C;
  while (bc > 8 && (size_t)(d + dv) * (size_t)bc * 4 > budget) bc /= 2;
  if (tuned_bc && (size_t)(d + dv) * (size_t)tuned_bc * 4 <= M) bc = tuned_bc;
  const size_t local = (size_t)(d + dv) * (size_t)bc * 4;
  if (local > M)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "decode's CPU kernel: %d-key tiles at head dims %d / %d need %zu bytes of local memory; the "
                    "device has %zu",
                    bc, d, dv, local, M);
  int rows = (need_rows + 3) / 4 * 4;
  const int cap = fcl_tuned_get(tu, FCL_DEC_P_CPU_ROWS, FCL_DEC_CPU_ROWS);
  if (rows > cap) rows = cap;
  while (rows > 4 && (size_t)rows * (size_t)(d + dv + bc) * 4 > FCL_DEC_CPU_PRIVATE) rows -= 4;
  p->map = 1;
  p->rows = rows;
  p->row_blocks = (need_rows + rows - 1) / rows;
  p->tile = bc;
  p->threads = 1;
  p->kpt = p->prefetch = p->stages = p->mma = p->vec_aligned = 0;
  p->local_bytes = local;
  p->wg_per_cu = fcl_tuned_get(tu, FCL_DEC_P_WG_PER_CU, FCL_DEC_WG_PER_CU);
  return FLASHCL_SUCCESS;
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
  /* Merge: 128 work-items, or the power of two >= head_dim_v / 4 past d = 512
   * (fewer where the device allows fewer and that still covers it). */
  int mt = 128;
  while (mt < p->head_dim_v / 4) mt *= 2;
  while ((size_t)mt > max_wg && mt / 2 >= p->head_dim_v / 4) mt /= 2;
  if ((size_t)mt > max_wg)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "the device's work-groups (%zu work-items) are too small",
                    max_wg);
  p->merge_threads = mt;
  int nvidia = 0, stages = 0;
  flashcl_status st = fcl_decode_nvidia(ctx, desc, &nvidia);
  if (st != FLASHCL_SUCCESS) return st;
  /* A CPU runs decode.cl's mapping slowly (decode_cpu.cl's banner); the
   * one-launch merge exists for that mapping only, and a call that asks for
   * the NVIDIA kernels does not get the CPU one. */
  const flashcl_kernel_family fam = desc->kernel == FLASHCL_KERNEL_AUTO ? ctx->env_kernel : desc->kernel;
  if (fam != FLASHCL_KERNEL_NVIDIA_MMA &&
      fcl_tuned_get(tu, FCL_DEC_P_MAP, !ctx->info.is_gpu && !fcl_tuned_get(tu, FCL_DEC_P_MERGE, FCL_DEC_MERGE_LAST)))
    return fcl_decode_plan_cpu(ctx, p);
  p->map = 0;
  int rows = 1;
  while (rows < need_rows && rows < fcl_tuned_get(tu, FCL_DEC_P_MAX_ROWS, FCL_DEC_MAX_ROWS)) rows *= 2;
  const size_t cap = ctx->info.local_mem_size < FCL_DEC_LOCAL_CAP ? ctx->info.local_mem_size : FCL_DEC_LOCAL_CAP;
  /* The split count comes later: the fit leaves room for the one-launch merge
   * whenever the tuning asks for it. */
  const size_t mf = fcl_tuned_get(tu, FCL_DEC_P_MERGE, FCL_DEC_MERGE_LAST) ? fcl_dec_merge_floats(rows) : 0;
  int kpt = fcl_tuned_get(tu, FCL_DEC_P_KPT, FCL_DEC_KPT);
  /* A quantized side loads 8 bytes with vload8, which needs no alignment. */
  const int quant = p->kv.k_quant || p->kv.v_quant;
  p->vec_aligned = (p->kv.k_quant || fcl_dec_vec_aligned(kc)) && (p->kv.v_quant || fcl_dec_vec_aligned(vc));
  /* cp.async copies 16-byte pieces of 8 16-bit elements; fp32 caches, unaligned
   * rows and quantized caches (whose rows the register path dequantizes) keep
   * the register path, and with it the tensor-core kernel out: under
   * NVIDIA_MMA too, as for its other uncovered problems. So do a V head dim
   * of its own and head dims past 256 (measured on the register path only). */
  if (nvidia && q->dtype != FLASHCL_F32 && p->vec_aligned && !quant && p->head_dim_v == d && d <= 256)
    stages = fcl_tuned_get(tu, FCL_DEC_P_STAGES, FCL_DEC_STAGES);
  if (stages == 1) stages = 0; /* one stage is no pipeline: cl/decode/decode.cl refuses it (a call's 1 is refused) */
  if (stages) {
    /* The cp.async kernel gives up stages (down to 2), then keys per work-item;
     * if even that does not fit, the register path starts over from kpt. */
    int k2 = kpt;
    while (fcl_dec_local_bytes(d, rows, threads, k2, stages, mf) > cap && (stages > 2 || k2 > 1)) {
      if (stages > 2) stages--;
      else k2 /= 2;
    }
    if (fcl_dec_local_bytes(d, rows, threads, k2, stages, mf) <= cap) kpt = k2;
    else stages = 0;
  }
  while (fcl_dec_local_bytes(d, rows, threads, kpt, stages, mf) > cap && (kpt > 1 || rows > 1)) {
    if (kpt > 1) kpt /= 2;
    else rows /= 2;
  }
  if (fcl_dec_local_bytes(d, rows, threads, kpt, stages, mf) > cap)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "decode at head_dim %d does not fit %zu bytes of local memory", d,
                    ctx->info.local_mem_size);
  p->rows = rows;
  p->row_blocks = (need_rows + rows - 1) / rows;
  p->kpt = kpt;
  p->threads = threads;
  p->tile = kg * kpt;
  p->prefetch = fcl_tuned_get(tu, FCL_DEC_P_PREFETCH, 1);
  p->stages = stages;
  p->local_bytes = fcl_dec_local_bytes(d, rows, threads, kpt, stages, mf);
  p->wg_per_cu = fcl_tuned_get(tu, FCL_DEC_P_WG_PER_CU, stages ? FCL_DEC_WG_PER_CU_ASYNC : FCL_DEC_WG_PER_CU);
  p->mma = 0;
  /* A quantized cache keeps decode.cl's register path, but the tensor-core
   * kernel copies its rows as they are and dequantizes them in local memory:
   * it may run where a plain cache would take the cp.async stages (a tuning's
   * stages = 0 keeps it out here too), with 16-byte aligned rows on both sides. */
  const int quant_mma = quant && nvidia && q->dtype != FLASHCL_F32 && fcl_dec_vec_aligned(kc) &&
                        fcl_dec_vec_aligned(vc) && fcl_tuned_get(tu, FCL_DEC_P_STAGES, FCL_DEC_STAGES) >= 2;
  if (stages || quant_mma)
    fcl_decode_plan_mma(ctx, q, p->window || desc->score.alibi_slopes || desc->score.softcap > 0.0f, cap, p);
  return FLASHCL_SUCCESS;
}

/* Whether the one-launch merge's fence reaches every work-group: NVIDIA's
 * mem_fence does not (membar.cta), so there it needs the inline PTX that the
 * tensor-core probe proved; elsewhere mem_fence is taken to (see
 * cl/decode/split_merge.cl). */
static int fcl_decode_device_fence(flashcl_context *ctx) {
  return !fcl_platform_is_nvidia(ctx) || fcl_mma_available(ctx);
}

/* The split count (desc.split.num_splits, else one wave: the largest count whose
 * grid fits wg_per_cu work-groups per compute unit, since a second, partial
 * wave of whole chunks would cost as much as the first; at least min_keys
 * keys per split), and the values that ran, recorded in p->tu. */
static void fcl_decode_plan_splits(flashcl_context *ctx, const flashcl_decode_desc *desc, fcl_decode_plan *p) {
  const int min_keys = p->mma ? fcl_tuned_get(&p->tu, FCL_DEC_P_MMA_MIN_KEYS, FCL_DEC_MMA_KEYS_PER_SPLIT)
                              : fcl_tuned_get(&p->tu, FCL_DEC_P_MIN_KEYS, FCL_DEC_KEYS_PER_SPLIT);
  int splits = desc->split.num_splits;
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
  /* The one-launch merge counts arrivals in the context's counters, which
   * only calls on the context's scratch are ordered against. */
  p->merge_last = splits > 1 && !desc->split.workspace && !p->map &&
                  fcl_tuned_get(tu, FCL_DEC_P_MERGE, FCL_DEC_MERGE_LAST) && fcl_decode_device_fence(ctx);
  if (!p->mma && !p->map)
    p->local_bytes = fcl_dec_local_bytes(p->head_dim, p->rows, p->threads, p->kpt, p->stages,
                                         p->merge_last ? fcl_dec_merge_floats(p->rows) : 0);
  const int gpu = !p->map; /* decode.cl's or decode_mma's parameters */
  const int ran[FCL_DEC_P_COUNT] = {
      p->kpt, p->prefetch, p->mma ? fcl_tuned_get(tu, FCL_DEC_P_WG_PER_CU, FCL_DEC_WG_PER_CU_ASYNC) : p->wg_per_cu,
      gpu ? fcl_tuned_get(tu, FCL_DEC_P_THREADS, FCL_DEC_THREADS) : 0,
      gpu ? fcl_tuned_get(tu, FCL_DEC_P_MAX_ROWS, FCL_DEC_MAX_ROWS) : 0,
      p->stages, p->mma ? 0 : fcl_tuned_get(tu, FCL_DEC_P_MIN_KEYS, FCL_DEC_KEYS_PER_SPLIT),
      gpu ? fcl_tuned_get(tu, FCL_DEC_P_MMA_MIN_ROWS, FCL_DEC_MMA_MIN_ROWS) : 0, p->mma ? p->wg_per_cu : 0,
      p->mma ? p->mma_wk : 0, p->mma ? p->mma_stages : 0,
      p->mma ? fcl_tuned_get(tu, FCL_DEC_P_MMA_MIN_KEYS, FCL_DEC_MMA_KEYS_PER_SPLIT) : 0, p->merge_last,
      p->map, p->map ? p->tile : 0, p->map ? fcl_tuned_get(tu, FCL_DEC_P_CPU_ROWS, FCL_DEC_CPU_ROWS) : 0};
  /* 0: the kernel that runs does not read it (a call that sets it is refused,
   * and flashcl-tune does not time it twice). */
  for (int i = 0; i < FCL_DEC_P_COUNT; i++) fcl_tuned_ran(tu, i, ran[i]);
}

/* The tuning, the kernel plan, the split count and the workspace of a
 * validated call. */
flashcl_status fcl_decode_plan_call(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                           const flashcl_tensor *q, const flashcl_tensor *kc,
                                           const flashcl_tensor *vc, fcl_decode_plan *p) {
  flashcl_status st;
  flashcl_tuning_family want;
  if ((st = fcl_tuning_call_family(ctx, desc->tuning, FLASHCL_PASS_FORWARD, 1, &want))) return st;
  const fcl_tune_key key = {p->head_dim, q->dtype, 0, -1, fcl_decode_lmax(desc, p, 0)};
  fcl_tuning_resolve(ctx, FLASHCL_TUNE_DECODE, desc->tuning, &key, &p->tu);
  if ((st = fcl_decode_plan_kernel(ctx, desc, q, kc, vc, p))) return st;
  fcl_decode_plan_splits(ctx, desc, p);
  p->work_floats = 0;
  if (p->splits > 1) {
    size_t rows_total, f, f_bytes;
    if (!fcl_mul_size((size_t)p->batch * (size_t)p->q_len, (size_t)p->heads_q, &rows_total) ||
        !fcl_mul_size(rows_total, (size_t)p->splits, &f) || !fcl_mul_size(f, (size_t)p->head_dim_v + 1, &f) ||
        !fcl_mul_size(f, sizeof(float), &f_bytes))
      return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "decode workspace size overflows size_t");
    p->work_floats = f;
  }
  return fcl_tuned_honoured(ctx, &p->tu);
}
