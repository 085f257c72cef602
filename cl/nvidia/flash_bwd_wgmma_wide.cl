/*
 * flash_bwd_wgmma_wide.cl: the Hopper (sm_90a wgmma) dK/dV kernel for head
 * dims past 128, with the atomic dQ accumulated in fp32 or without dQ (the
 * deterministic mode: bwd_dq_wgmma of flash_bwd_wgmma.cl, DQ_ONLY).
 *
 * Why a kernel of its own: bwd_dkdv_wgmma (flash_bwd_wgmma.cl) keeps dK and dV
 * of its keys in the registers of one warpgroup, d floats per work-item, which
 * past d = 128 no longer fit beside the score tiles. Here the two warpgroups
 * of a work-group share 64 keys and split the work by role (FlashAttention-3's
 * split of the head dim's accumulators, without its producer warps):
 *   warpgroup 0: S^T = K Q^T, P^T, dV += P^T dO       (dV in its registers)
 *   warpgroup 1: dP^T = V dO^T, dS^T, dK += dS^T Q    (dK in its registers)
 * so each keeps one 64 x d accumulator (d / 2 floats per work-item). dS^T
 * needs P^T: warpgroup 0 hands it over through local memory in accumulator
 * order (each work-item of warpgroup 1 holds dP^T at the same positions), as
 * fp32, with softcap's derivative folded in. With ATOMIC_DQ, dQ = dS K, 64
 * columns at a time, the column blocks shared between the warpgroups, is added
 * to the fp32 accumulator with red.global (or, with DQ_SPLITS, into split
 * accumulators in program order: flash_bwd_mma.cl's rule). K and V stay in local memory;
 * Q / dO tiles of 64 queries of every query head of the GQA group stream
 * through two buffers (cp.async of the next tile under the current one's
 * products).
 *
 * Local memory layout and descriptors: wgmma_ptx.cl's 128-byte swizzle; the
 * tiles are DPAD (192 or 256) columns wide, zero past HEAD_DIM, and the
 * products stop at the head dim rounded up to 16. P, the score variants,
 * dropout, masks and the rules for rows without keys follow flash_bwd_wgmma.cl
 * (no all-zero mask tile is skipped).
 * Arguments: bwd_dkdv_mma's, in the same order.
 *
 * Parameters (-D):
 *   USE_PTX    1: compile the kernel; 0: an empty body, never launched
 *   DTYPE      1 = fp16, 2 = bf16
 *   HEAD_DIM   a multiple of 8 from 136 to 256
 *   CAUSAL, VARLEN, WINDOW, ALIBI, SOFTCAP, DROPOUT, MASK   as in flash_bwd_mma.cl
 *   ATOMIC_DQ  1: dQ accumulated here (atomically, or DQ_SPLITS); 0: not at
 *              all (the deterministic bwd_dq_wgmma of flash_bwd_wgmma.cl
 *              computes it)
 *   DQ_SPLITS, VEC_RED                               as in flash_bwd_mma.cl
 *
 * With USE_PTX=1 the host joins mma_ptx.cl, mma_scores.cl, score_variant.cl,
 * seq_bounds.cl, wgmma_ptx.cl and wgmma_bwd_common.cl in front (philox.cl
 * with dropout, mask.cl and mask_mma.cl with a mask).
 */
#ifndef USE_PTX
#define USE_PTX 0
#endif
#ifndef DTYPE
#define DTYPE 1
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 256
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef VARLEN
#define VARLEN 0
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#ifndef ALIBI
#define ALIBI 0
#endif
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
#ifndef DROPOUT
#define DROPOUT 0
#endif
#ifndef MASK
#define MASK 0
#endif
#ifndef ATOMIC_DQ
#define ATOMIC_DQ 1
#endif
#ifndef DQ_SPLITS
#define DQ_SPLITS 0
#endif
#ifndef VEC_RED
#define VEC_RED 0
#endif

#if HEAD_DIM % 8 || HEAD_DIM <= 128 || HEAD_DIM > 256 || (DQ_SPLITS && !ATOMIC_DQ)
#error "unsupported flash_bwd_wgmma_wide parameters"
#endif

#define LOG2E 1.4426950408889634f
#define NTHREADS 256
#define KV_BLOCK 64
#define BLOCK_R 64
#define D16 ((HEAD_DIM + 15) / 16 * 16)
#define DPAD ((HEAD_DIM + 63) / 64 * 64)
#define CH (DPAD / 8)          /* 16-byte chunks per local row */
#define CH_REAL (HEAD_DIM / 8) /* of them read from memory; the rest are zero */
#define KT (D16 / 16)          /* k-steps over the head dim */
#define DT (D16 / 8)           /* 8-column n-tiles of dK, dV (those past HEAD_DIM are not stored) */
#define DQ_REGIONS (DPAD / 64) /* 64-column blocks of dQ */
/* Columns of the dV / dK product past the first 128, a literal (wgmma_ptx.cl). */
#define NREST WG_DLAST
#define REGION(rows) ((rows) * 128)
#define TILE_BYTES (DPAD / 64 * REGION(64)) /* every tile here has 64 rows */
/* Byte offset of chunk c of row r in a swizzled tile of 64 rows (wgmma_ptx.cl). */
#define TOFF(r, c) (((c) >> 3) * REGION(64) + (r) * 128 + ((((c) & 7) ^ ((r) & 7)) << 4))
#define SM_K 0
#define SM_V TILE_BYTES
#define SM_QD (2 * TILE_BYTES)          /* 2 x (Q tile, dO tile) */
#define SM_DS (SM_QD + 4 * TILE_BYTES)  /* dS^T: [key][query], one region */
#define SM_PX (SM_DS + REGION(64))      /* P^T handed over: 32 floats x 128 work-items */
#define SMEM_BYTES (SM_PX + 32 * 128 * 4)

#if USE_PTX

#if !defined(MMA_TYPE) || !defined(WGMMA_PTX_CL)
#error "flash_bwd_wgmma_wide.cl with USE_PTX=1 needs mma_ptx.cl and wgmma_ptx.cl compiled first in the same program"
#endif
#if !defined(SCORE_VARIANT_CL) || !defined(SEQ_BOUNDS_CL)
#error "flash_bwd_wgmma_wide.cl needs mma_scores.cl, score_variant.cl and seq_bounds.cl compiled first in the same program"
#endif
#if DROPOUT && !defined(PHILOX_CL)
#error "DROPOUT needs philox.cl compiled first in the same program"
#endif
#if MASK && !defined(MASK_CL)
#error "MASK needs mask.cl compiled first in the same program"
#endif
#ifndef WGMMA_BWD_COMMON_CL
#error "flash_bwd_wgmma_wide.cl needs wgmma_bwd_common.cl (MASK_ROW, LOAD_LD, STORE_LD) compiled first in the same program"
#endif

/* cp.async of 64 rows from row0 of a strided source into the swizzled tile at
 * buf; rows at or past n and the columns past HEAD_DIM are zero-filled. */
inline void wide_load_rows(uint buf, __global const ushort *p, long sn, int row0, int n, int tid) {
  for (int e = tid; e < 64 * CH; e += NTHREADS) {
    const int r = e / CH, c = e % CH;
    const int ok = row0 + r < n && c < CH_REAL;
    cp_async16(buf + TOFF(r, c), p + (long)(ok ? row0 + r : 0) * sn + (c < CH_REAL ? c : 0) * 8, ok ? 16u : 0u);
  }
}

#define WCTENSOR(n) __global const ushort *n, long n##_off, long n##_sb, long n##_sn, long n##_sh
#define WTENSOR(n) __global ushort *n, long n##_off, long n##_sb, long n##_sn, long n##_sh

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void bwd_dkdv_wgmma(
    WCTENSOR(q), WCTENSOR(k), WCTENSOR(v), WCTENSOR(dout), WTENSOR(dk), WTENSOR(dv),
    __global const float *lse, long l_off, long l_sb, long l_sn, long l_sh,
    __global const float *dsum, __global float *dq_acc, int seqlen_q, int seqlen_k, int heads_q, int group,
    float scale, float scale_log2, __global const int *cu_q, __global const int *cu_k, int total_q, int total_k,
    int window_left, int window_right, __global const float *alibi, float softcap_in, float softcap_log2,
    __global const uint *mask, long mask_bs, long mask_hs, int mask_words, int mask_bq, int mask_bk,
    ulong seed, ulong offset, uint threshold, float keep_scale) {
  /* 1008 bytes of slack: the base is 16-byte aligned, the tiles need 1024. */
  __local uint4 smem[SMEM_BYTES / 16 + 63];
  __local float l2s_all[2 * BLOCK_R], dss_all[2 * BLOCK_R];
  const int tid = get_local_id(0), lane = tid & 31, wg = tid >> 7, wtid = tid & 127, wiw = (tid >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;
  const int hk = get_group_id(1), b = get_group_id(2);
  const fcl_seq seq = fcl_seq_bounds(cu_q, cu_k, b, seqlen_q, seqlen_k, total_q, total_k);
  const int nq = seq.nq, nk = seq.nk, diag = seq.diag;
  const long bq = seq.bb, row_q = seq.q_row, row_k = seq.k_row;
  const uint sb = (SADDR(smem) + 1023u) & ~1023u;
  const uint kbuf = sb + SM_K, vbuf = sb + SM_V;
  __local uchar *const s8 = (__local uchar *)smem + (sb - SADDR(smem));
  __local float *const px = (__local float *)(s8 + SM_PX) + wtid; /* this work-item's P^T slots, 128 apart */
#if !ATOMIC_DQ
  (void)dq_acc;
#endif
#if DQ_SPLITS
  __global float *const dq_split =
      dq_acc + (long)get_group_id(0) * get_num_groups(2) * heads_q * seqlen_q * HEAD_DIM;
  for (int kblk = get_group_id(0);; kblk += get_num_groups(0)) {
  const int k0 = kblk * KV_BLOCK;
  if (k0 >= nk) break; /* whole work-group leaves together */
  barrier(CLK_LOCAL_MEM_FENCE); /* the previous block's products are done with K, V and the tiles */
#else
  __global float *const dq_split = dq_acc;
  const int k0 = get_group_id(0) * KV_BLOCK;
  if (k0 >= nk) return; /* whole work-group leaves together */
#endif
  wide_load_rows(kbuf, k + k_off + bq * k_sb + row_k * k_sn + (long)hk * k_sh, k_sn, k0, nk, tid);
  wide_load_rows(vbuf, v + v_off + bq * v_sb + row_k * v_sn + (long)hk * v_sh, v_sn, k0, nk, tid);
  cp_commit();

  /* dV (warpgroup 0) or dK (warpgroup 1) of the 64 keys. */
  float acc[DT * 4];
  #pragma unroll
  for (int i = 0; i < DT * 4; i++) acc[i] = 0.0f;

  const int2 qrange = sv_query_range(k0, KV_BLOCK, diag, nq, nk, window_left, window_right, BLOCK_R);
  const int qstart = qrange.x, qend = qrange.y;
  const int qsteps = qend > qstart ? (qend - qstart + BLOCK_R - 1) / BLOCK_R : 0;
  const int steps = qsteps * group;
#define QSLOT(slot) (sb + SM_QD + (slot) * 2 * TILE_BYTES)
#define LOAD_TILES(s, slot)                                                                                 \
  {                                                                                                         \
    const int h_ = hk * group + (s) / qsteps, q0_ = qstart + ((s) % qsteps) * BLOCK_R;                      \
    wide_load_rows(QSLOT(slot), q + q_off + bq * q_sb + row_q * q_sn + (long)h_ * q_sh, q_sn, q0_, nq, tid); \
    wide_load_rows(QSLOT(slot) + TILE_BYTES, dout + dout_off + bq * dout_sb + row_q * dout_sn + (long)h_ * dout_sh, \
                   dout_sn, q0_, nq, tid);                                                                  \
    cp_commit();                                                                                            \
  }
  float pl = INFINITY, pd = 0.0f; /* a step's LSE and D, one step ahead (LOAD_LD, wgmma_bwd_common.cl) */
  if (steps > 0) {
    LOAD_TILES(0, 0)
    LOAD_LD(0)
    STORE_LD(0)
  }
  const int key0 = k0 + wiw * 16 + g; /* this lane's first key (both warpgroups hold the same keys) */
  const int kr = wiw * 16 + g;        /* ... as a row of the tile */
  for (int s = 0, slot = 0; s < steps; s++, slot ^= 1) {
    const int h = hk * group + s / qsteps, q0 = qstart + (s % qsteps) * BLOCK_R;
    const uint qb = QSLOT(slot), db = qb + TILE_BYTES;
    __local const float *l2s = l2s_all + slot * BLOCK_R, *dss = dss_all + slot * BLOCK_R;
    cp_wait_all();
    proxy_fence();
    barrier(CLK_LOCAL_MEM_FENCE); /* this step's tiles are in; every product of the last step is done */
    if (s + 1 < steps) {
      LOAD_TILES(s + 1, slot ^ 1)
      LOAD_LD(s + 1)
    }

    /* S^T = K Q^T (warpgroup 0) or dP^T = V dO^T (warpgroup 1): element e of
     * n-tile nt is key key0 + 8 (e >> 1), query q0 + 8 nt + 2 t + (e & 1). */
    float sd[32];
    const uint ta = wg ? vbuf : kbuf, tb = wg ? db : qb;
    wg_fence();
    #pragma unroll
    for (int ks = 0; ks < KT; ks++)
      WGMMA_SS_N64(sd, wg_desc(ta + (ks >> 2) * REGION(64) + (ks & 3) * 32, 16, 1024),
                   wg_desc(tb + (ks >> 2) * REGION(64) + (ks & 3) * 32, 16, 1024), ks);
    wg_commit();
    wg_wait0();
    REG_FENCE(sd, 32);

    const int need_mask = MASK || sv_tile_partial(q0, BLOCK_R, k0, KV_BLOCK, diag, nk, window_left, window_right);
    __global const uint *mrow = MASK_ROW(h);
    const float slope_log2 = ALIBI ? alibi[h] * LOG2E : 0.0f;
    if (wg == 0) {
      /* P^T in place (with dropout: kept entries scaled, others 0), and P^T
       * (softcap: times its derivative) handed to warpgroup 1. */
      #pragma unroll
      for (int nt = 0; nt < 8; nt++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          const int col = nt * 8 + 2 * t + (e & 1), key = key0 + (e >> 1) * 8, i = 4 * nt + e;
#if SCORE_LOG2
          float th;
          float p = fast_exp2(sv_logit(sd[i], scale_log2, softcap_in, softcap_log2, slope_log2,
                                       abs(key - (q0 + col + diag)), &th) - l2s[col]);
#else
          float p = fast_exp2(fma(sd[i], scale_log2, -l2s[col]));
#endif
          if (need_mask && !sv_pair_visible(q0 + col, key, nq, nk, diag, window_left, window_right, mrow, MASK_CLASS,
                                            mask_words, mask_bq, mask_bk))
            p = 0.0f;
#if SOFTCAP
          px[i * 128] = p * sv_logit_grad(th);
#else
          px[i * 128] = p;
#endif
#if DROPOUT
          sd[i] = dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)(q0 + col), (uint)key, threshold)
                      ? p * keep_scale : 0.0f;
#else
          sd[i] = p;
#endif
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* P^T handed over */
    if (wg == 1) {
      /* dS^T = P^T (dP^T - D) (dropout: dP of dropped entries is 0, kept ones scaled). */
      #pragma unroll
      for (int nt = 0; nt < 8; nt++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          const int col = nt * 8 + 2 * t + (e & 1), i = 4 * nt + e;
#if DROPOUT
          const int key = key0 + (e >> 1) * 8;
          const float dpv = dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)(q0 + col), (uint)key, threshold)
                                ? sd[i] * keep_scale : 0.0f;
#else
          const float dpv = sd[i];
#endif
          sd[i] = px[i * 128] * (dpv - dss[col]);
        }
    }
    /* A fragments of k-step j (queries 16 j ..): n-tiles 2 j and 2 j + 1. */
    uint fa[4][4];
    #pragma unroll
    for (int j = 0; j < 4; j++)
      #pragma unroll
      for (int x = 0; x < 4; x++) fa[j][x] = pack2(sd[8 * j + 2 * x], sd[8 * j + 2 * x + 1]);
#if ATOMIC_DQ
    if (wg == 1) {
      /* dS^T to local memory for dQ: keys kr, kr + 8, query chunks 2 j, 2 j + 1. */
      #pragma unroll
      for (int j = 0; j < 4; j++) {
        *(__local uint *)(s8 + SM_DS + TOFF(kr, 2 * j) + 4 * t) = fa[j][0];
        *(__local uint *)(s8 + SM_DS + TOFF(kr + 8, 2 * j) + 4 * t) = fa[j][1];
        *(__local uint *)(s8 + SM_DS + TOFF(kr, 2 * j + 1) + 4 * t) = fa[j][2];
        *(__local uint *)(s8 + SM_DS + TOFF(kr + 8, 2 * j + 1) + 4 * t) = fa[j][3];
      }
      proxy_fence(); /* generic-proxy stores, read by wgmma through the async proxy */
    }
#endif
    /* dV += P^T dO (warpgroup 0) or dK += dS^T Q (warpgroup 1), B read N-major. */
    const uint bt = wg ? qb : db;
    wg_fence();
    #pragma unroll
    for (int j = 0; j < 4; j++) {
      WG_RS(128)(acc, fa[j], wg_desc(bt + j * 2048, REGION(64), 1024));
      WG_RS(NREST)(acc + 64, fa[j], wg_desc(bt + 2 * REGION(64) + j * 2048, REGION(64), 1024));
    }
    wg_commit();
#if ATOMIC_DQ
    barrier(CLK_LOCAL_MEM_FENCE); /* dS^T is in local memory */

    /* dQ (64 queries x 64 columns per block) = dS K over the 64 keys; the
     * warpgroups take the column blocks in turn. */
    __global float *qacc = dq_split + ((long)b * heads_q + h) * seqlen_q * HEAD_DIM;
    for (int rg = wg; rg < DQ_REGIONS; rg += 2) {
      float dq[32];
      wg_fence();
      #pragma unroll
      for (int kk = 0; kk < KV_BLOCK / 16; kk++)
        WGMMA_SST_N64(dq, wg_desc(sb + SM_DS + kk * 2048, REGION(64), 1024),
                      wg_desc(kbuf + rg * REGION(64) + kk * 2048, REGION(64), 1024), kk);
      wg_commit();
      wg_wait0();
      REG_FENCE(dq, 32);
      const int r0 = q0 + wiw * 16 + g, c0 = rg * 64 + 2 * t;
      #pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int row = r0 + hh * 8;
        if (row >= nq) continue;
        __global float *dst = qacc + (long)row * HEAD_DIM + c0;
        #pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#if HEAD_DIM % 64
          if (c0 - 2 * t + nt * 8 >= HEAD_DIM) break; /* padded columns */
#endif
          wg_red2(dst + nt * 8, dq[4 * nt + 2 * hh] * scale, dq[4 * nt + 2 * hh + 1] * scale);
        }
      }
    }
#endif /* ATOMIC_DQ */
    wg_wait0();
    REG_FENCE(acc, DT * 4);
    if (s + 1 < steps) STORE_LD(slot ^ 1)
  }
  cp_wait_all(); /* a block without query tiles still has its K/V copies in flight */

  /* dV (warpgroup 0), dK = scale * dS^T Q (warpgroup 1); rows past the end of
   * the sequence are not stored. */
  __global ushort *out = wg ? dk : dv;
  const long ob = wg ? dk_off + bq * dk_sb + row_k * dk_sn + (long)hk * dk_sh
                     : dv_off + bq * dv_sb + row_k * dv_sn + (long)hk * dv_sh;
  const long osn = wg ? dk_sn : dv_sn;
  const float os = wg ? scale : 1.0f;
  #pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int key = key0 + hh * 8;
    if (key >= nk) continue;
    __global uint *orow = (__global uint *)(out + ob + (long)key * osn + 2 * t);
    #pragma unroll
    for (int dt = 0; dt < DT; dt++) {
#if HEAD_DIM % 16
      if (dt * 8 >= HEAD_DIM) break; /* the zero column chunk */
#endif
      orow[dt * 4] = pack2(acc[4 * dt + 2 * hh] * os, acc[4 * dt + 2 * hh + 1] * os);
    }
  }
#if DQ_SPLITS
  }
#endif
#undef LOAD_TILES
#undef QSLOT
}

#else /* !USE_PTX: an empty body, so that the file is valid OpenCL C everywhere */

__kernel void bwd_dkdv_wgmma(__global float *unused) { (void)unused; }

#endif /* USE_PTX */
