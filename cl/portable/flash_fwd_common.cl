/*
 * flash_fwd_common.cl: what the portable forward's two variants share, joined
 * in front of flash_fwd.cl (GPUs) or flash_fwd_cpu.cl (CPUs): the parameters
 * both read, four-element row access (GLOAD4 / GSTORE4), the paged K/V row
 * offsets, the quantized paged source's loads (KLOAD4 / VLOAD4) and the
 * attention-mask tile walk.
 *
 * Parameters (-D), as flash_fwd.cl's banner describes them: HEAD_DIM, HEAD_DIM_V, BLOCK_R,
 * BLOCK_C, VEC_ALIGNED, DROPOUT, MASK; DTYPE, VARLEN and PAGED_KV come with
 * dtype.cl and seq_bounds.cl, and CAUSAL, WINDOW, ALIBI, SOFTCAP and SINKS with
 * score_variant.cl, which the kernels join in front of this file. K_DTYPE,
 * V_DTYPE, K_SCALE and V_SCALE (a paged source stored in a quantized cache
 * format) come with kv_quant.cl, joined in front when they are set.
 */
#ifndef FLASH_FWD_COMMON_CL
#define FLASH_FWD_COMMON_CL

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V HEAD_DIM
#endif
#ifndef BLOCK_R
#define BLOCK_R 32
#endif
#ifndef BLOCK_C
#define BLOCK_C 32
#endif
#ifndef VEC_ALIGNED
#define VEC_ALIGNED 0
#endif
#ifndef DROPOUT
#define DROPOUT 0
#endif
#ifndef MASK
#define MASK 0
#endif

/* Four elements of a row: with VEC_ALIGNED the row granules are 4-element
 * aligned, so they are read and written as one aligned vector; otherwise as
 * dtype.cl's element-aligned LOAD4 / STORE4. */
#if !VEC_ALIGNED
#define GLOAD4(p, i) LOAD4(p, i)
#define GSTORE4(p, i, x) STORE4(p, i, x)
#elif DTYPE == 0
#define GLOAD4(p, i) (*(__global const float4 *)((p) + (i)))
#define GSTORE4(p, i, x) (*(__global float4 *)((p) + (i)) = (x))
#elif DTYPE == 1
#define GLOAD4(p, i) vloada_half4(0, (p) + (i))
#define GSTORE4(p, i, x) vstorea_half4_rte((x), 0, (p) + (i))
#else
#define GLOAD4(p, i) fcl_bf16x4_to_float4(*(__global const ushort4 *)((p) + (i)))
#define GSTORE4(p, i, x) (*(__global ushort4 *)((p) + (i)) = fcl_bf16x4_from_float4(x))
#endif

#if PAGED_KV
#define PAGED_PARAMS                                                                                 \
  , __global const int *block_table, int page_size, int max_pages, int num_pages, __global const int *kv_lens
/* Element offset of key j's row in a page pool (bt: this sequence's block-table row). */
inline long paged_row(__global const int *bt, int j, int page_size, int num_pages, long sb, long sn) {
  const int pi = j / page_size;
  return (long)clamp(bt[pi], 0, num_pages - 1) * sb + (long)(j - pi * page_size) * sn;
}
#define KV_OFF(j, sb, sn) paged_row(bt, (j), page_size, num_pages, (sb), (sn))
/* The scales of a quantized pool (NULL for a plain one), and the cache row
 * (page * page_size + slot) of key j that TOKEN and BLOCK32 scales index. */
#define KVQ_PARAMS , __global const float *k_scale, __global const float *v_scale
inline long paged_cache_row(__global const int *bt, int j, int page_size, int num_pages) {
  const int pi = j / page_size;
  return (long)clamp(bt[pi], 0, num_pages - 1) * page_size + (j - pi * page_size);
}
#else
#define PAGED_PARAMS
#define KVQ_PARAMS
#define KV_OFF(j, sb, sn) ((long)(j) * (sn))
#endif

/* K and V of a paged source may each be a quantized cache (kv_quant.cl): its
 * codes are read as bytes and turned into fp32 with their scales as they are
 * loaded, so the rest of the kernel sees fp32 as for any dtype. KLOAD4(p, i,
 * j, e) is four values from element i of the pool: elements e .. e + 3 of key
 * j's row (kv head hk). */
#ifndef K_DTYPE
#define K_DTYPE DTYPE
#endif
#ifndef V_DTYPE
#define V_DTYPE DTYPE
#endif
#define K_QUANT (K_DTYPE != DTYPE)
#define V_QUANT (V_DTYPE != DTYPE)
#if (K_QUANT || V_QUANT) && (!PAGED_KV || !defined(KV_QUANT_CL))
#error "a quantized K/V source needs PAGED_KV=1 and kv_quant.cl compiled first in the same program"
#endif
/* One quantized side: its scale buffer, format, scale layout and row length. */
#define KVQ_LOAD4(p, i, j, e, scale, fmt, kind, d) \
  kvq_load4((p), (i), scale, fmt, kind, paged_cache_row(bt, (j), page_size, num_pages), heads_q / group, hk, d, (e))
#if K_QUANT
#define k_store_t uchar
#define KLOAD4(p, i, j, e) KVQ_LOAD4(p, i, j, e, k_scale, K_DTYPE, K_SCALE, HEAD_DIM)
#else
#define k_store_t store_t
#define KLOAD4(p, i, j, e) GLOAD4(p, i)
#endif
#if V_QUANT
#define v_store_t uchar
#define VLOAD4(p, i, j, e) KVQ_LOAD4(p, i, j, e, v_scale, V_DTYPE, V_SCALE, HEAD_DIM_V)
#else
#define v_store_t store_t
#define VLOAD4(p, i, j, e) GLOAD4(p, i)
#endif

#if MASK
#ifndef MASK_CL
#error "MASK needs mask.cl compiled first in the same program"
#endif
/* The first tile start k0' = k0 + t * BLOCK_C < kend with a visible bit, or a
 * value >= kend. Uniform across the work-group (every work-item reads the same words). */
inline int mask_next(__global const uint *m, int W, int bq, int bk, int qa, int qb, int k0, int kend, int nk) {
  while (k0 < kend && !(mask_tile(m, W, bq, bk, qa, qb, k0, min(k0 + BLOCK_C, nk) - 1) & 1)) k0 += BLOCK_C;
  return k0;
}
/* In the kernels: mrow is this (sequence, head)'s matrix, q0 / nq / nk as there. */
#define MASK_LASTQ (min(q0 + BLOCK_R, nq) - 1)
#define MASK_NEXT(k) mask_next(mrow, mask_words, mask_bq, mask_bk, q0, MASK_LASTQ, (k), kend, nk)
#define MASK_TILE(k) mask_tile(mrow, mask_words, mask_bq, mask_bk, q0, MASK_LASTQ, (k), min((k) + BLOCK_C, nk) - 1)
#define MASK_OK(i, j) mask_ok(mrow, mask_words, mask_bq, mask_bk, (i), (j))
#define KNEXT knext
#else
#define KNEXT (k0 + BLOCK_C)
#endif

/* The work-group's sequence, in both variants' kernels (their arguments by
 * name): returns when the sequence has no query row at q0; declares bq,
 * row_q, qbase, kbase, vbase (and bt for a paged source), nq, nk and diag. A
 * paged source's key count is read only by work-groups that stay. */
#if PAGED_KV
#define FWD_PAGED_BASES()                                                       \
  __global const int *bt = block_table + (long)b * max_pages;                 \
  sb = fcl_seq_paged_keys(sb, kv_lens, b, seqlen_k);                          \
  const long kbase = k_off + (long)hk * k_sh; /* rows come from KV_OFF */     \
  const long vbase = v_off + (long)hk * v_sh;
#else
#define FWD_PAGED_BASES()                                                       \
  const long kbase = k_off + bq * k_sb + (long)sb.k_row * k_sn + (long)hk * k_sh; \
  const long vbase = v_off + bq * v_sb + (long)sb.k_row * v_sn + (long)hk * v_sh;
#endif
#define FWD_SEQUENCE()                                                                    \
  fcl_seq sb = fcl_seq_bounds(cu_q, cu_k, b, seqlen_q, seqlen_k, total_q, total_k);   \
  if (q0 >= sb.nq) return;                                                            \
  const long bq = sb.bb, row_q = sb.q_row;                                            \
  const long qbase = q_off + bq * q_sb + row_q * q_sn + (long)h * q_sh;               \
  FWD_PAGED_BASES()                                                                   \
  const int nq = sb.nq, nk = sb.nk, diag = sb.diag;

#endif
