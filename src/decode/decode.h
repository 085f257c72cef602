/* Decode, KV cache and merge: the cache validation shared by
 * flashcl_attention_decode and flashcl_kv_cache_append. */
#ifndef FLASHCL_DECODE_H
#define FLASHCL_DECODE_H

#include "core/internal.h"
#include "core/tuning.h"

/* ---- decode, KV cache and merge (src/decode/decode.c, src/decode/kv_cache.c, src/decode/merge.c) ---- */

/* A validated KV cache (see flashcl_decode_desc). Contiguous: num_pages = batch,
 * page b holds sequence b. */
/* Head dims decode and the append take: MLA's 576 for q and K, 512 for V
 * (the portable kernel maps 8 elements to a work-item whatever the head dim). */
#define FCL_DECODE_MAX_HEAD_DIM 576
#define FCL_DECODE_MAX_HEAD_DIM_V 512

/* V's head dim against K's (K's checked already): at most K's (INVALID_SHAPE),
 * a multiple of 8 up to FCL_DECODE_MAX_HEAD_DIM_V (UNSUPPORTED_HEAD_DIM). */
flashcl_status fcl_check_kv_head_dims(flashcl_context *ctx, int d, int dv);

typedef struct fcl_kv_info {
  int paged;
  int heads_kv, head_dim;
  int head_dim_v; /* v_cache's head dim (head_dim unless MLA-like) */
  int page_size, max_pages, num_pages;
  int capacity; /* tokens per sequence */
  /* Quantized sides (flashcl.h, "Quantized KV cache"): 1 where that cache is
   * I8 / F8E4M3 / F8E5M2 / I4X2, its dtype, its flashcl_kv_scale (0 for a
   * plain side) and the bytes of its scale buffer the layout spans (0 for a
   * plain side). */
  int k_quant, v_quant;
  flashcl_dtype k_dtype, v_dtype;
  int k_scale_kind, v_scale_kind;
  size_t k_scale_bytes, v_scale_bytes;
} fcl_kv_info;

flashcl_status fcl_check_kv_cache(flashcl_context *ctx, const flashcl_kv_layout *cache, const flashcl_tensor *kc,
                                  const flashcl_tensor *vc, int batch, fcl_kv_info *out);
/* The plain dtype both caches share where neither is quantized, else the
 * plain one's, else -1 (both quantized): what q (decode) or k_new (append)
 * must be. */
int fcl_kv_plain_dtype(const flashcl_tensor *kc, const flashcl_tensor *vc);
/* The build options naming the caches' formats and scale layouts
 * (-DK_DTYPE -DV_DTYPE -DK_SCALE -DV_SCALE) for tokens of plain dtype `dtype`. */
void fcl_kv_quant_options(const fcl_kv_info *kv, const flashcl_tensor *kc, const flashcl_tensor *vc,
                          flashcl_dtype dtype, char *buf, size_t cap);
/* An int32 buffer of at least batch entries. */
flashcl_status fcl_check_seqlens(flashcl_context *ctx, cl_mem seqlens, const char *name, int batch);

/* A caller's descriptor as this library's struct (see
 * fcl_attention_desc_import): every public function taking a
 * flashcl_decode_desc calls it first. */
flashcl_status fcl_decode_desc_import(flashcl_context *ctx, const flashcl_decode_desc **desc,
                                      flashcl_decode_desc *full);
flashcl_status fcl_kv_append_desc_import(flashcl_context *ctx, const flashcl_kv_append_desc **desc,
                                         flashcl_kv_append_desc *full);

typedef struct fcl_decode_plan {
  int batch, q_len, heads_q, heads_kv, head_dim, group;
  int head_dim_v; /* v_cache's and o's (<= head_dim) */
  float scale;
  fcl_kv_info kv;
  int rows, row_blocks, kpt, threads, tile, prefetch, vec_aligned, merge_threads, splits;
  int stages; /* cp.async stages (NVIDIA), 0: the register path */
  /* 1: cl/nvidia/decode_mma.cl (tensor cores, NVIDIA) with mma_wr x mma_wk warps */
  int mma, mma_wr, mma_wk, mma_stages;
  int merge_last; /* 1: the attention kernel's work-groups merge the splits (split_merge.cl; no decode_merge) */
  int map;        /* 1: cl/decode/decode_cpu.cl (one work-item per work-group, tile keys per tile) */
  int window; /* 1: window_left or window_right >= 0 */
  int wg_per_cu; /* work-groups per compute unit the split count aims at */
  fcl_tuned tu;  /* the decode tuning, with the values that run */
  size_t local_bytes;
  size_t work_floats; /* 0 when unsplit */
} fcl_decode_plan;

/* Local bytes of cl/nvidia/decode_mma.cl's K | V stages and merge buffer, at
 * least merge_floats (fcl_dec_merge_floats under MERGE_LAST, else 0) (decode_plan.c). */
size_t fcl_dec_mma_local_bytes(int d, int wr, int wk, int stages, const fcl_kv_info *kv, size_t merge_floats);
/* cl/decode/split_merge.cl's SM_LOCAL_FLOATS for row blocks of `rows` rows,
 * and its counters per row block for `splits` splits (decode_plan.c). */
size_t fcl_dec_merge_floats(int rows);
int fcl_dec_merge_counters(int splits);
/* Checks a decode call's arguments and fills p's shapes (decode_check.c). */
flashcl_status fcl_decode_validate(flashcl_context *ctx, const flashcl_decode_desc *desc, const flashcl_tensor *q,
                                   const flashcl_tensor *kc, const flashcl_tensor *vc, const flashcl_tensor *o,
                                   const flashcl_tensor *lse, fcl_decode_plan *p);
/* Plans a validated call: tuning, kernel, tiles, splits, workspace (decode_plan.c). */
flashcl_status fcl_decode_plan_call(flashcl_context *ctx, const flashcl_decode_desc *desc, const flashcl_tensor *q,
                                    const flashcl_tensor *kc, const flashcl_tensor *vc, fcl_decode_plan *p);

#endif
