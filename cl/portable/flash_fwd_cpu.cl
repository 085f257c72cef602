/*
 * flash_fwd_cpu.cl: the portable forward for CPU devices (flash_fwd.cl is the
 * GPU variant; both compute the same function, see its banner).
 *
 * PoCL runs a work-group as loops over its work-items
 * between barriers and keeps every private value that lives across a barrier in
 * per-work-item context memory, and its implicit vectorizer does not widen code
 * that already uses vector types; the mapping above therefore runs as scalar
 * float4 code with most of its state in memory. Here one work-item owns all
 * BLOCK_R rows (no barriers), K is staged transposed so that S = Q K^T is a sum
 * of rank-1 updates along the keys and O += P V one along the head dimension,
 * both in explicit float8 vectors over 4-row register blocks.
 *
 * Parameters (-D): those of flash_fwd_common.cl (HEAD_DIM and HEAD_DIM_V
 * multiples of 8, BLOCK_R a multiple of 4 and BLOCK_C of 8, here). One work-item per
 * work-group: flash_fwd.cl's NTHREADS / S_* / O_* mapping does not apply.
 *
 * requires: dtype.cl seq_bounds.cl score_variant.cl flash_fwd_common.cl
 */

#define VW 8 /* float8: one AVX register, and the head dims and BLOCK_C are multiples of 8 */
#define CV (BLOCK_C / VW)
#define DV (HEAD_DIM_V / VW) /* O and V columns */
#define RB 4 /* rows per register block; BLOCK_R is a multiple of 8 */
#define CB (CV % 4 == 0 ? 4 : CV % 2 == 0 ? 2 : 1) /* key vectors per register block of S */
#define DB (DV % 4 == 0 ? 4 : DV % 2 == 0 ? 2 : 1) /* head-dim vectors per register block of O */
#if BLOCK_R % RB || BLOCK_C % VW || HEAD_DIM % VW || HEAD_DIM_V % VW
#error "inconsistent flash_fwd CPU tile"
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void flash_fwd(
    __global const store_t *q, long q_off, long q_sb, long q_sn, long q_sh,
    __global const k_store_t *k, long k_off, long k_sb, long k_sn, long k_sh,
    __global const v_store_t *v, long v_off, long v_sb, long v_sn, long v_sh,
    __global store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse,
    int seqlen_q, int seqlen_k, int group, float scale_log2,
    __global const int *cu_q, __global const int *cu_k, int total_q, int total_k, int heads_q, ulong seed,
    ulong offset, uint threshold, float keep_scale, int window_left, int window_right,
    __global const float *alibi, float softcap_in, float softcap_log2, __global const uint *mask, long mask_bs,
    long mask_hs, int mask_words, int mask_bq, int mask_bk, __global const float *sinks PAGED_PARAMS KVQ_PARAMS) {
  __local float Kt[HEAD_DIM * BLOCK_C]; /* K tile, transposed: Kt[x][j] */
  __local float Vs[BLOCK_C * HEAD_DIM_V]; /* V tile: Vs[j][x] */
  float Qp[BLOCK_R * HEAD_DIM];         /* Q rows, fp32 */
  float Sp[BLOCK_R * BLOCK_C];          /* scores, then probabilities of the tile */
  float Op[BLOCK_R * HEAD_DIM_V];       /* output accumulators */
  float m_r[BLOCK_R], l_r[BLOCK_R];

  const int q0 = get_group_id(0) * BLOCK_R;
  const int h = get_group_id(1);
  const int b = get_group_id(2);
  const int hk = h / group;

  FWD_SEQUENCE() /* leaves when the sequence has no query in this work-group */

  for (int r = 0; r < BLOCK_R; r++) {
    for (int g = 0; g < HEAD_DIM / 4; g++)
      vstore4((q0 + r < nq) ? GLOAD4(q, qbase + (long)(q0 + r) * q_sn + 4 * g) : (float4)(0.0f), g,
              Qp + r * HEAD_DIM);
    for (int x = 0; x < HEAD_DIM_V; x += VW) vstore8((float8)(0.0f), 0, Op + r * HEAD_DIM_V + x);
    const float2 row0 = sv_row_start(sinks, h, M_LOG2E_F, 1);
    m_r[r] = row0.x;
    l_r[r] = row0.y;
  }

  /* Rows past nq see nothing: the last real row bounds the window's right edge. */
  const int2 keys = sv_key_range(q0, min(BLOCK_R, nq - q0), diag, nk, window_left, window_right, BLOCK_C);
  const int kstart = keys.x, kend = keys.y;
  const float slope_log2 = ALIBI ? alibi[h] * M_LOG2E_F : 0.0f;
#if MASK
  __global const uint *mrow = mask + b * mask_bs + h * mask_hs;
  for (int k0 = MASK_NEXT(kstart), knext; k0 < kend; k0 = knext) {
    const int mcls = MASK_TILE(k0); /* 1: some bits set, 3: all set */
    knext = MASK_NEXT(k0 + BLOCK_C);
#else
  for (int k0 = kstart; k0 < kend; k0 += BLOCK_C) {
#endif
    /* Stage K (transposed) and V; keys past nk read as 0. */
    for (int j = 0; j < BLOCK_C; j++) {
      const int in = k0 + j < nk;
      for (int g = 0; g < HEAD_DIM / 4; g++) {
        const float4 kv = in ? KLOAD4(k, kbase + KV_OFF(k0 + j, k_sb, k_sn) + 4 * g, k0 + j, 4 * g) : (float4)(0.0f);
        Kt[(4 * g + 0) * BLOCK_C + j] = kv.x;
        Kt[(4 * g + 1) * BLOCK_C + j] = kv.y;
        Kt[(4 * g + 2) * BLOCK_C + j] = kv.z;
        Kt[(4 * g + 3) * BLOCK_C + j] = kv.w;
      }
      for (int g = 0; g < HEAD_DIM_V / 4; g++)
        vstore4(in ? VLOAD4(v, vbase + KV_OFF(k0 + j, v_sb, v_sn) + 4 * g, k0 + j, 4 * g) : (float4)(0.0f), g, Vs + j * HEAD_DIM_V);
    }

    /* S = Q K^T, RB rows x CB*VW keys at a time. */
    for (int r0 = 0; r0 < BLOCK_R; r0 += RB)
      for (int c0 = 0; c0 < CV; c0 += CB) {
        float8 a[RB][CB];
        #pragma unroll
        for (int i = 0; i < RB; i++)
          for (int c = 0; c < CB; c++) a[i][c] = (float8)(0.0f);
        for (int x = 0; x < HEAD_DIM; x++) {
          float8 kv[CB];
          #pragma unroll
          for (int c = 0; c < CB; c++) kv[c] = vload8(c0 + c, Kt + x * BLOCK_C);
          #pragma unroll
          for (int i = 0; i < RB; i++) {
            const float8 qv = (float8)(Qp[(r0 + i) * HEAD_DIM + x]);
            #pragma unroll
            for (int c = 0; c < CB; c++) a[i][c] = fma(qv, kv[c], a[i][c]);
          }
        }
        #pragma unroll
        for (int i = 0; i < RB; i++)
          for (int c = 0; c < CB; c++)
            vstore8(SCORE_LOG2 ? a[i][c] : a[i][c] * scale_log2, c0 + c, Sp + (r0 + i) * BLOCK_C);
      }

    /* Online softmax, row by row. */
    const int need_mask = sv_tile_partial(q0, BLOCK_R, k0, BLOCK_C, diag, nk, window_left, window_right);
    for (int r = 0; r < BLOCK_R; r++) {
      float *srow = Sp + r * BLOCK_C;
#if SCORE_LOG2
      for (int j = 0; j < BLOCK_C; j++) {
        float th;
        const int dist = abs(k0 + j - (q0 + r + diag));
        srow[j] = sv_logit(srow[j], scale_log2, softcap_in, softcap_log2, slope_log2, dist, &th);
      }
#endif
      /* sv_visible as key ranges per row, which vectorize on a CPU. */
      if (need_mask) {
#if CAUSAL
        const int lim = min(nk, q0 + r + diag + 1) - k0; /* visible keys of this row in the tile */
#elif WINDOW
        const int lim = min(nk, q0 + r + diag + window_right + 1) - k0;
        const int first = min(q0 + r + diag - window_left - k0, BLOCK_C); /* keys before it are hidden */
        for (int j = 0; j < first; j++) srow[j] = -INFINITY;
#else
        const int lim = nk - k0;
#endif
        for (int j = max(lim, 0); j < BLOCK_C; j++) srow[j] = -INFINITY;
      }
#if MASK
      if (!(mcls & 2))
        for (int j = 0; j < BLOCK_C; j++)
          if (q0 + r >= nq || k0 + j >= nk || !MASK_OK(q0 + r, k0 + j)) srow[j] = -INFINITY;
#endif
      float8 mv = vload8(0, srow);
      for (int c = 1; c < CV; c++) mv = fmax(mv, vload8(c, srow));
      const float4 m4 = fmax(mv.lo, mv.hi);
      const float mx = fmax(m_r[r], fmax(fmax(m4.x, m4.y), fmax(m4.z, m4.w)));
      const float pivot = (mx == -INFINITY) ? 0.0f : mx;
      const float alpha = exp2(m_r[r] - pivot);
      m_r[r] = mx;
      float8 sv = (float8)(0.0f);
      for (int c = 0; c < CV; c++) {
        const float8 pv = exp2(vload8(c, srow) - (float8)(pivot));
        sv += pv;
#if DROPOUT
        /* One Philox call gives the words of four consecutive keys (k0 is a multiple of 8). */
        const ulong t = (ulong)b * heads_q + h + offset;
        const uint2 key = (uint2)((uint)seed, (uint)(seed >> 32));
        const uint4 w0 = philox4x32_10((uint4)((uint)(k0 + c * VW) >> 2, (uint)(q0 + r), (uint)t, (uint)(t >> 32)), key);
        const uint4 w1 = philox4x32_10((uint4)(((uint)(k0 + c * VW) >> 2) + 1, (uint)(q0 + r), (uint)t, (uint)(t >> 32)), key);
        const int8 keep = (int8)(w0.x >= threshold, w0.y >= threshold, w0.z >= threshold, w0.w >= threshold,
                                 w1.x >= threshold, w1.y >= threshold, w1.z >= threshold, w1.w >= threshold);
        vstore8(select((float8)(0.0f), pv * keep_scale, keep != 0), c, srow);
#else
        vstore8(pv, c, srow);
#endif
      }
      const float4 s4 = sv.lo + sv.hi;
      l_r[r] = l_r[r] * alpha + ((s4.x + s4.y) + (s4.z + s4.w));
      if (alpha != 1.0f)
        for (int c = 0; c < DV; c++) vstore8(vload8(c, Op + r * HEAD_DIM_V) * alpha, c, Op + r * HEAD_DIM_V);
    }

    /* O += P V, RB rows x DB*VW columns at a time. */
    const int jn = min(BLOCK_C, kend - k0);
    for (int r0 = 0; r0 < BLOCK_R; r0 += RB)
      for (int d0 = 0; d0 < DV; d0 += DB) {
        float8 a[RB][DB];
        #pragma unroll
        for (int i = 0; i < RB; i++)
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
          for (int c = 0; c < DB; c++) vstore8(a[i][c], d0 + c, Op + (r0 + i) * HEAD_DIM_V);
      }
  }

  const long obase = o_off + bq * o_sb + row_q * o_sn + (long)h * o_sh;
  for (int r = 0; r < BLOCK_R && q0 + r < nq; r++) {
    const float l = l_r[r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const long orow = obase + (long)(q0 + r) * o_sn;
    for (int g = 0; g < HEAD_DIM_V / 4; g++) GSTORE4(o, orow + 4 * g, vload4(g, Op + r * HEAD_DIM_V) * inv);
    if (has_lse)
      lse[l_off + bq * l_sb + (row_q + q0 + r) * l_sn + (long)h * l_sh] =
          l > 0.0f ? (m_r[r] + log2(l)) * M_LN2_F : -INFINITY;
  }
}
