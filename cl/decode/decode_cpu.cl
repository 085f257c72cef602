/*
 * decode_cpu.cl: decode_attn (decode.cl) for CPU devices: the same arguments,
 * split ranges, visibility rules, score variants, sinks and outputs (o and
 * lse, or with SPLIT the partials that decode.cl's decode_merge reads), but
 * one work-item per work-group.
 *
 * Why: decode.cl spreads each key row over HEAD_DIM / 8 work-items and sums
 * their partial dots through local memory, two barriers per tile. PoCL runs
 * a work-group as loops over its work-items between barriers, with every
 * value that lives across a barrier in memory, so that mapping runs at about
 * 2% of a CPU's arithmetic rate (BENCHMARKS.md, "the portable decode on the
 * CPU device"). Here the one work-item owns its ROWS rows (query head of the
 * GQA group x new token, decode.cl's row numbering) and walks the split's
 * keys in tiles of BLOCK_C: K and V rows are staged in fp32 after the load's
 * conversion (a quantized side's codes times their scales: kv_quant.cl's
 * kvq_load4, so every format and scale layout of decode.cl is read), S is
 * a float8 dot product per (row, key), and O += P V runs in float8 over the
 * head dim in register blocks of rows, as in flash_fwd_cpu.cl. K is not
 * transposed as flash_fwd_cpu.cl does: with a decode's few rows per key the
 * transposing stores cost more than the dot products' sums (d = 128, 4 rows,
 * batch 8 on PoCL: 24% less time; BENCHMARKS.md).
 *
 * Not here: MERGE_LAST (the one-launch merge; the host never asks for it
 * with this kernel) and decode.cl's cp.async stages (NVIDIA).
 *
 * Parameters (-D): DTYPE, HEAD_DIM, HEAD_DIM_V, SPLIT, PAGED, TREE_MASK,
 * WINDOW, SOFTCAP, ALIBI, SINKS, K_DTYPE, V_DTYPE, K_SCALE and V_SCALE as
 * in decode.cl (rows are read element-aligned, so no VEC_ALIGNED); ROWS (a
 * multiple of 4) rows per work-group; BLOCK_C (a multiple of 8) keys per
 * tile.
 *
 * requires: dtype.cl kv_quant.cl score_variant.cl decode_keys.cl
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V HEAD_DIM
#endif
#ifndef ROWS
#define ROWS 4
#endif
#ifndef BLOCK_C
#define BLOCK_C 32
#endif
#ifndef PAGED
#define PAGED 0
#endif
/* SPLIT and TREE_MASK: defaults in decode_keys.cl. */
/* K_DTYPE, V_DTYPE, K_SCALE, V_SCALE: defaults in kv_quant.cl, which the
 * host joins in front for every cache format. */
#ifndef KV_QUANT_CL
#error "decode_cpu.cl needs kv_quant.cl compiled first in the same program"
#endif

#define VW 8 /* float8: one AVX register; the head dims and BLOCK_C are multiples of 8 */
#define CV (BLOCK_C / VW)
#define DVV (HEAD_DIM_V / VW)
#define RB 4 /* rows per register block */
#define DB (DVV % 4 == 0 ? 4 : DVV % 2 == 0 ? 2 : 1)
#if HEAD_DIM % 8 || HEAD_DIM_V % 8 || HEAD_DIM_V > HEAD_DIM || ROWS % RB || ROWS < RB || BLOCK_C % VW || BLOCK_C < VW
#error "inconsistent decode_attn_cpu tile"
#endif

#define DC_KQ (K_DTYPE != DTYPE)
#define DC_VQ (V_DTYPE != DTYPE)
#if DC_KQ
typedef uchar dc_kstore_t;
#else
typedef store_t dc_kstore_t;
#endif
#if DC_VQ
typedef uchar dc_vstore_t;
#else
typedef store_t dc_vstore_t;
#endif

/* Elements e .. e + 3 of a cache row that starts at element (or, quantized,
 * byte-counted code) offset base, as fp32; row is the row's index among the
 * cache's scale rows (page * rows_per_page + slot). */
#if DC_KQ
#define DC_KLOAD4(base, row, e) kvq_load4(k, (base) + (e), k_scale, K_DTYPE, K_SCALE, (row), heads_kv, hk, HEAD_DIM, (e))
#else
#define DC_KLOAD4(base, row, e) LOAD4(k, (base) + (e))
#endif
#if DC_VQ
#define DC_VLOAD4(base, row, e) \
  kvq_load4(v, (base) + (e), v_scale, V_DTYPE, V_SCALE, (row), heads_kv, hk, HEAD_DIM_V, (e))
#else
#define DC_VLOAD4(base, row, e) LOAD4(v, (base) + (e))
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void decode_attn_cpu(
    __global const store_t *q, long q_off, long q_sb, long q_sn, long q_sh,
    __global const dc_kstore_t *k, long k_off, long k_sb, long k_sn, long k_sh,
    __global const dc_vstore_t *v, long v_off, long v_sb, long v_sn, long v_sh,
    __global store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse,
    __global const int *seqlens, __global const uint *tree_mask, __global const int *block_table, int max_pages,
    int page_size, int num_pages,
    int capacity, int q_len, int group, int heads_q, int row_blocks, int num_splits, float scale_log2,
    __global float *work, long wo_off, long wl_off, int window_left, int window_right,
    __global const float *alibi, float softcap_in, float softcap_log2, __global const float *sinks,
    __global const float *k_scale, __global const float *v_scale, __global uint *counters) {
  __local float Ks[HEAD_DIM * BLOCK_C];   /* K tile: Ks[j][x] */
  __local float Vs[BLOCK_C * HEAD_DIM_V]; /* V tile: Vs[j][x] */
  float Qp[ROWS * HEAD_DIM];              /* pre-scaled Q rows */
  float Sp[ROWS * BLOCK_C];               /* scores, then probabilities */
  float Op[ROWS * HEAD_DIM_V];            /* output accumulators */
  float m_r[ROWS], l_r[ROWS];
  (void)counters;

  const int split = get_group_id(0);
  const int hk = get_group_id(1) / row_blocks;
  const int rb = get_group_id(1) - hk * row_blocks;
  const int b = get_group_id(2);
  const int nrows = group * q_len;
  const int row0 = rb * ROWS;
  const int L = clamp(seqlens[b], 0, capacity);
  const int heads_kv = heads_q / group, srows = PAGED ? page_size : capacity;
  (void)heads_kv;
  (void)srows;

  const int2 keys = dec_split_keys(L, q_len, window_left, split, num_splits, BLOCK_C);
  const int kstart = keys.x, kend = keys.y;

  for (int r = 0; r < ROWS; r++) {
    const int rg = row0 + r;
    const int gi = rg / q_len, t = rg - gi * q_len;
    const long qi = q_off + b * q_sb + t * q_sn + (long)(hk * group + gi) * q_sh;
    for (int e = 0; e < HEAD_DIM; e += 4)
      vstore4(rg < nrows ? LOAD4(q, qi + e) * scale_log2 : (float4)(0.0f), 0, Qp + r * HEAD_DIM + e);
    for (int x = 0; x < HEAD_DIM_V; x += VW) vstore8((float8)(0.0f), 0, Op + r * HEAD_DIM_V + x);
    /* The sink joins each row once, in split 0 (decode.cl). */
    const float2 row_start = rg < nrows && split == 0 ? sv_row_start(sinks, hk * group + gi, M_LOG2E_F, 1)
                                                      : (float2)(-INFINITY, 0.0f);
    m_r[r] = row_start.x;
    l_r[r] = row_start.y;
  }

  for (int k0 = kstart; k0 < kend; k0 += BLOCK_C) {
    /* Stage K (transposed) and V; keys past kend read as 0. */
    for (int j = 0; j < BLOCK_C; j++) {
      const int key = k0 + j;
      if (key < kend) {
#if PAGED
        const int pi = key / page_size;
        const int pg = clamp(block_table[(long)b * max_pages + pi], 0, num_pages - 1), sl = key - pi * page_size;
#else
        const int pg = b, sl = key;
#endif
        const long srow = (long)pg * srows + sl;
        const long kb = k_off + pg * k_sb + sl * k_sn + hk * k_sh, vb = v_off + pg * v_sb + sl * v_sn + hk * v_sh;
        for (int e = 0; e < HEAD_DIM; e += 4) vstore4(DC_KLOAD4(kb, srow, e), 0, Ks + j * HEAD_DIM + e);
        for (int e = 0; e < HEAD_DIM_V; e += 4) vstore4(DC_VLOAD4(vb, srow, e), 0, Vs + j * HEAD_DIM_V + e);
      } else {
        for (int e = 0; e < HEAD_DIM; e += 4) vstore4((float4)(0.0f), 0, Ks + j * HEAD_DIM + e);
        for (int e = 0; e < HEAD_DIM_V; e += 4) vstore4((float4)(0.0f), 0, Vs + j * HEAD_DIM_V + e);
      }
    }

    /* S = Q K^T as dot products of rows, RB rows at a time. */
    for (int r0 = 0; r0 < ROWS; r0 += RB) {
      if (row0 + r0 >= nrows) break;
      for (int j = 0; j < BLOCK_C; j++) {
        float8 a[RB];
        #pragma unroll
        for (int i = 0; i < RB; i++) a[i] = (float8)(0.0f);
        for (int x = 0; x < HEAD_DIM; x += VW) {
          const float8 kv = vload8(0, Ks + j * HEAD_DIM + x);
          #pragma unroll
          for (int i = 0; i < RB; i++) a[i] = fma(vload8(0, Qp + (r0 + i) * HEAD_DIM + x), kv, a[i]);
        }
        #pragma unroll
        for (int i = 0; i < RB; i++) {
          const float4 h4 = a[i].lo + a[i].hi;
          Sp[(r0 + i) * BLOCK_C + j] = (h4.x + h4.y) + (h4.z + h4.w);
        }
      }
    }

    /* Visibility, score variants and the online softmax, row by row. */
    for (int r = 0; r < ROWS; r++) {
      const int rg = row0 + r;
      if (rg >= nrows) continue; /* never written; its S and O stay unread */
      const int gi = rg / q_len, t = rg - gi * q_len, pos = L - q_len + t;
      const float slope_log2 = ALIBI ? alibi[hk * group + gi] * M_LOG2E_F : 0.0f;
      float *srow = Sp + r * BLOCK_C;
      for (int j = 0; j < BLOCK_C; j++) {
        const int key = k0 + j;
        const int vis =
            key < kend && dec_key_visible(key, t, L, q_len, b, tree_mask, window_left, window_right);
        float th;
        const float s = sv_logit(srow[j], 1.0f, softcap_in, softcap_log2, slope_log2, abs(key - pos), &th);
        srow[j] = vis ? s : -INFINITY;
      }
      float8 mv = vload8(0, srow);
      for (int c = 1; c < CV; c++) mv = fmax(mv, vload8(c, srow));
      const float4 m4 = fmax(mv.lo, mv.hi);
      const float mx = fmax(m_r[r], fmax(fmax(m4.x, m4.y), fmax(m4.z, m4.w)));
      /* No visible key so far: pivot 0 keeps exp2(-inf - pivot) = 0, not NaN. */
      const float pivot = mx == -INFINITY ? 0.0f : mx;
      const float alpha = exp2(m_r[r] - pivot);
      m_r[r] = mx;
      float8 sv = (float8)(0.0f);
      for (int c = 0; c < CV; c++) {
        const float8 pv = exp2(vload8(c, srow) - (float8)(pivot));
        sv += pv;
        vstore8(pv, c, srow);
      }
      const float4 s4 = sv.lo + sv.hi;
      l_r[r] = l_r[r] * alpha + ((s4.x + s4.y) + (s4.z + s4.w));
      if (alpha != 1.0f)
        for (int c = 0; c < DVV; c++) vstore8(vload8(c, Op + r * HEAD_DIM_V) * alpha, c, Op + r * HEAD_DIM_V);
    }

    /* O += P V, RB rows x DB * VW columns at a time. */
    const int jn = min(BLOCK_C, kend - k0);
    for (int r0 = 0; r0 < ROWS; r0 += RB) {
      if (row0 + r0 >= nrows) break;
      for (int d0 = 0; d0 < DVV; d0 += DB) {
        float8 a[RB][DB];
        #pragma unroll
        for (int i = 0; i < RB; i++)
          #pragma unroll
          for (int c = 0; c < DB; c++) a[i][c] = vload8(d0 + c, Op + (r0 + i) * HEAD_DIM_V);
        for (int j = 0; j < jn; j++) {
          float8 vv[DB];
          #pragma unroll
          for (int c = 0; c < DB; c++) vv[c] = vload8(d0 + c, Vs + j * HEAD_DIM_V);
          #pragma unroll
          for (int i = 0; i < RB; i++) {
            const float8 pv = (float8)(Sp[(r0 + i) * BLOCK_C + j]);
            #pragma unroll
            for (int c = 0; c < DB; c++) a[i][c] = fma(pv, vv[c], a[i][c]);
          }
        }
        #pragma unroll
        for (int i = 0; i < RB; i++)
          #pragma unroll
          for (int c = 0; c < DB; c++) vstore8(a[i][c], d0 + c, Op + (r0 + i) * HEAD_DIM_V);
      }
    }
  }

  for (int r = 0; r < ROWS && row0 + r < nrows; r++) {
    const int rg = row0 + r, gi = rg / q_len, t = rg - gi * q_len, hq = hk * group + gi;
    const float ls = l_r[r], mx = m_r[r];
    const float inv = ls > 0.0f ? 1.0f / ls : 0.0f;
#if SPLIT
    const long id = ((long)b * q_len + t) * heads_q + hq;
    __global float *wo = work + wo_off + (id * num_splits + split) * HEAD_DIM_V;
    for (int e = 0; e < HEAD_DIM_V; e += 4) vstore4(vload4(0, Op + r * HEAD_DIM_V + e) * inv, 0, wo + e);
    work[wl_off + id * num_splits + split] = ls > 0.0f ? mx + log2(ls) : -INFINITY;
#else
    const long oi = o_off + b * o_sb + t * o_sn + (long)hq * o_sh;
    for (int e = 0; e < HEAD_DIM_V; e += 4) STORE4(o, oi + e, vload4(0, Op + r * HEAD_DIM_V + e) * inv);
    if (has_lse) lse[l_off + b * l_sb + t * l_sn + (long)hq * l_sh] = ls > 0.0f ? (mx + log2(ls)) * M_LN2_F : -INFINITY;
#endif
  }
}
