/*
 * flash_bwd_wgmma.cl: the FlashAttention-2 backward's dK/dV kernel (and its
 * atomic dQ) on Hopper tensor cores (sm_90a wgmma), through inline PTX.
 *
 * Why a second tensor-core backward: bwd_dkdv_mma (flash_bwd_mma.cl) feeds
 * mma.sync from registers that ldmatrix fills, so every 16x8x16 product costs
 * local-memory traffic and issue slots; wgmma multiplies a warpgroup's 64 rows
 * by a whole tile read from local memory through a descriptor. It reaches the
 * compiler as the wgmma forward does (wgmma_ptx.cl's banner).
 *
 * Work: one work-group of 2 warpgroups (256 work-items) owns KV_BLOCK = 128
 * keys of one (sequence, KV head); warpgroup w owns keys [64 w, 64 w + 64) and
 * keeps their dK and dV in fp32 accumulators. K and V stay in local memory;
 * tiles of BLOCK_R queries (Q, dO, their LSE and D) of every query head of the
 * GQA group stream through two buffers: the next tile's cp.async, and its LSE
 * and D loads into registers, run under the current tile's products. Per
 * tile, in each warpgroup:
 *   S^T = K_w Q^T, dP^T = V_w dO^T     (wgmma m64 n BLOCK_R, both from local memory)
 *   P^T = exp2(...), dS^T = P^T * (dP^T - D)          (registers)
 *   dV += P^T dO, dK += dS^T Q        (A from registers, dO / Q read N-major)
 * and with ATOMIC_DQ, dS^T goes to local memory ([key][query]) and
 * dQ += scale * dS K is one more product (both operands read MN-major) whose
 * result is added to the fp32 accumulator with red.global.add: the warpgroups
 * split the head dim (d = 128, BLOCK_R = 64) or the queries (d = 64,
 * BLOCK_R = 128). With DQ_SPLITS as well, work-group x of `splits` walks key
 * blocks x, x + splits, ... into its own accumulator: one writer per element in
 * program order, so the sums are bit-reproducible (flash_bwd_mma.cl has the
 * same rule). Without ATOMIC_DQ the dQ comes from bwd_dq_wgmma below (one
 * writer per element: the deterministic mode).
 *
 * The accumulator of a m64nN product gives lane (g = lane / 4, t = lane % 4) of
 * warp i of a warpgroup rows 16 i + g and 16 i + g + 8, columns 8 n + 2 t, +1 in
 * d[4 n .. 4 n + 3], the mma.sync layout; so P^T and dS^T repack to A
 * fragments as in bwd_dkdv_mma and the forward's P.
 *
 * P, the score variants, dropout and the rules for rows without keys follow
 * flash_bwd_mma.cl exactly (its banner). With an attention mask (MASK, mask.cl
 * joined in front) every score's bit is tested; unlike flash_bwd_mma.cl no tile
 * whose bits are all 0 is skipped.
 * Arguments: bwd_dkdv_mma's, in the same order.
 *
 * Parameters (-D):
 *   USE_PTX    1: compile the kernel; 0: an empty body, never launched
 *   DTYPE      1 = fp16, 2 = bf16
 *   HEAD_DIM   a multiple of 8 up to 128. The tiles are DPAD = 64 (with
 *              BLOCK_R 128) or 128 (with BLOCK_R 64) columns wide, the pairs
 *              whose accumulators fit 255 registers; S^T and dP^T stop at the
 *              head dim rounded up to 16
 *   BLOCK_R    queries per streamed tile
 *   CAUSAL, VARLEN, WINDOW, ALIBI, SOFTCAP, DROPOUT, MASK   as in flash_bwd_mma.cl
 *   ATOMIC_DQ, DQ_SPLITS, VEC_RED                     as in flash_bwd_mma.cl
 *   DQ_NWG     bwd_dq_wgmma: warpgroups (64 queries each)
 *   DQ_BLOCK_C bwd_dq_wgmma: keys per K/V tile (32, 64 or 128)
 *   DQ_ONLY    1: only bwd_dq_wgmma, which also takes head dims past 128 (up
 *              to 256; their dK/dV kernel is flash_bwd_wgmma_wide.cl)
 *   BULK_DQ    1 (atomic dQ without splits): each step's dQ tile goes to local
 *              memory, and after the next step's barrier one bulk reduction per
 *              row (cp.reduce.async.bulk .add.f32, sm_90) adds it to the
 *              accumulator, whose rows are dense: one instruction per row
 *              instead of a red.global per pair of elements in every work-item
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
#define HEAD_DIM 128
#endif
#ifndef BLOCK_R
#define BLOCK_R 64
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
#ifndef BULK_DQ
#define BULK_DQ 0
#endif
#ifndef DQ_NWG
#define DQ_NWG 2
#endif
#ifndef DQ_BLOCK_C
#define DQ_BLOCK_C 64
#endif
#ifndef DQ_ONLY
#define DQ_ONLY 0
#endif

/* The width of the tiles in local memory: they carry zero columns from
 * HEAD_DIM to DPAD. */
#if HEAD_DIM <= 64
#define DPAD 64
#elif HEAD_DIM <= 128
#define DPAD 128
#else
#define DPAD ((HEAD_DIM + 63) / 64 * 64)
#endif
#if HEAD_DIM % 8 || HEAD_DIM > 256 || (HEAD_DIM > 128 && !DQ_ONLY) || \
    (!DQ_ONLY && !((DPAD == 64 && BLOCK_R == 128) || (DPAD == 128 && BLOCK_R == 64))) || \
    (DQ_SPLITS && !ATOMIC_DQ) || \
    (BULK_DQ && (!ATOMIC_DQ || DQ_SPLITS)) || DQ_NWG < 1 || DQ_NWG > 3 || \
    (DQ_BLOCK_C != 32 && DQ_BLOCK_C != 64 && DQ_BLOCK_C != 128)
#error "unsupported flash_bwd_wgmma parameters"
#endif

#define LOG2E 1.4426950408889634f
#define NTHREADS 256
#define KV_BLOCK 128
/* Columns of the products whose n is the head dim (dV, dK, and dQ in
 * bwd_dq_wgmma): the head dim rounded up to 16 past 64 (a partial region,
 * wgmma_ptx.cl); past 128 (bwd_dq_wgmma only) 128 and then WG_DLAST. */
#if DPAD == 64
#define NP DPAD
#elif HEAD_DIM <= 128
#define NP WG_DLAST
#else
#define NP ((HEAD_DIM + 15) / 16 * 16)
#endif
#define CH (DPAD / 8)      /* 16-byte chunks per local row */
#define CH_REAL (HEAD_DIM / 8) /* of them read from memory; the rest are zero */
#define KT ((HEAD_DIM + 15) / 16) /* k-steps over the head dim: the zero columns past them are not read */
#define QN (BLOCK_R / 8)   /* 8-query n-tiles of S^T */
#define DT (NP / 8)        /* 8-column n-tiles of dK, dV (those past HEAD_DIM are not stored) */
#define DQ_MSPLIT (BLOCK_R == 128) /* the warpgroups split dQ's queries (else its columns) */
#define REGION(rows) ((rows) * 128)
#define TILE_BYTES(rows) ((DPAD / 64) * REGION(rows))
/* Byte offset of chunk c of row r in a swizzled tile of `rows` rows (wgmma_ptx.cl). */
#define TOFF(rows, r, c) (((c) >> 3) * REGION(rows) + (r) * 128 + ((((c) & 7) ^ ((r) & 7)) << 4))
#define K_BYTES TILE_BYTES(KV_BLOCK)
#define QT_BYTES TILE_BYTES(BLOCK_R)
#define SM_K 0
#define SM_V K_BYTES
#define SM_QD (2 * K_BYTES)                   /* 2 x (Q tile, dO tile) */
#define SM_DS (SM_QD + 4 * QT_BYTES)          /* dS^T: [key][query], BLOCK_R / 64 regions */
#define SM_DQ (SM_DS + (ATOMIC_DQ ? KV_BLOCK * BLOCK_R * 2 : 0))
/* The dQ staging rows (BULK_DQ): fp32, 32 bytes of padding per row so that the
 * float2 stores of lanes g = 0..3 (rows apart) fall in distinct banks. */
#define DQ_PITCH (DPAD * 4 + 32)
#define SMEM_BYTES (SM_DQ + (BULK_DQ ? BLOCK_R * DQ_PITCH : 0))

#if USE_PTX

#if !defined(MMA_TYPE) || !defined(WGMMA_PTX_CL)
#error "flash_bwd_wgmma.cl with USE_PTX=1 needs mma_ptx.cl and wgmma_ptx.cl compiled first in the same program"
#endif
#if !defined(SCORE_VARIANT_CL) || !defined(SEQ_BOUNDS_CL)
#error "flash_bwd_wgmma.cl needs mma_scores.cl, score_variant.cl and seq_bounds.cl compiled first in the same program"
#endif
#if DROPOUT && !defined(PHILOX_CL)
#error "DROPOUT needs philox.cl compiled first in the same program"
#endif
#if MASK && !defined(MASK_CL)
#error "MASK needs mask.cl compiled first in the same program"
#endif
#ifndef WGMMA_BWD_COMMON_CL
#error "flash_bwd_wgmma.cl needs wgmma_bwd_common.cl (MASK_ROW, LOAD_LD, STORE_LD) compiled first in the same program"
#endif

/* Work-item tid's (of nthreads) cp.async share of rows [row0, row0 + rows) of a strided source
 * into the swizzled tile at buf; rows at or past n, and the columns from
 * HEAD_DIM to DPAD, are zero-filled (P is 0 there, but 0 * garbage could be
 * NaN), their source clamped to row 0 and chunk 0. */
inline void wg_load_rows(uint buf, __global const ushort *p, long sn, int row0, int rows, int n, int tid, int nthreads) {
  for (int e = tid; e < rows * CH; e += nthreads) {
    const int r = e / CH, c = e % CH;
    const int ok = row0 + r < n && c < CH_REAL;
    cp_async16(buf + TOFF(rows, r, c), p + (long)(ok ? row0 + r : 0) * sn + (c < CH_REAL ? c : 0) * 8, ok ? 16u : 0u);
  }
}

#if BULK_DQ
/* dst[0 .. bytes) += the floats at local address src, asynchronously. */
inline void bulk_add_f32(__global float *dst, uint src, uint bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst), "r"(src),
               "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
/* Until this work-item's bulk reductions have read their local source. */
inline void bulk_wait_read(void) { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
#endif

#define WCTENSOR(n) __global const ushort *n, long n##_off, long n##_sb, long n##_sn, long n##_sh
#define WTENSOR(n) __global ushort *n, long n##_off, long n##_sb, long n##_sn, long n##_sh

#if !DQ_ONLY
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
  const int tid = get_local_id(0), lane = tid & 31, wg = tid >> 7, wiw = (tid >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;
  const int hk = get_group_id(1), b = get_group_id(2);
  const fcl_seq seq = fcl_seq_bounds(cu_q, cu_k, b, seqlen_q, seqlen_k, total_q, total_k);
  const int nq = seq.nq, nk = seq.nk, diag = seq.diag;
  const long bq = seq.bb, row_q = seq.q_row, row_k = seq.k_row;
  const uint sb = (SADDR(smem) + 1023u) & ~1023u;
  const uint kbuf = sb + SM_K, vbuf = sb + SM_V;
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
  (void)dq_split;
  wg_load_rows(kbuf, k + k_off + bq * k_sb + row_k * k_sn + (long)hk * k_sh, k_sn, k0, KV_BLOCK, nk, tid, NTHREADS);
  wg_load_rows(vbuf, v + v_off + bq * v_sb + row_k * v_sn + (long)hk * v_sh, v_sn, k0, KV_BLOCK, nk, tid, NTHREADS);
  cp_commit();

  float dka[DT * 4], dva[DT * 4];
  #pragma unroll
  for (int i = 0; i < DT * 4; i++) dka[i] = dva[i] = 0.0f;

  /* Query tiles: every query head of the group, and under a causal mask or a
   * window only the rows that see at least one of these keys. */
  const int2 qrange = sv_query_range(k0, KV_BLOCK, diag, nq, nk, window_left, window_right, BLOCK_R);
  const int qstart = qrange.x, qend = qrange.y;
  const int qsteps = qend > qstart ? (qend - qstart + BLOCK_R - 1) / BLOCK_R : 0;
  const int steps = qsteps * group;
#define QSLOT(slot) (sb + SM_QD + (slot) * 2 * QT_BYTES)
/* Issues the cp.async of step s's Q and dO tiles into buffer pair `slot`. */
#define LOAD_TILES(s, slot)                                                                                 \
  {                                                                                                         \
    const int h_ = hk * group + (s) / qsteps, q0_ = qstart + ((s) % qsteps) * BLOCK_R;                      \
    wg_load_rows(QSLOT(slot), q + q_off + bq * q_sb + row_q * q_sn + (long)h_ * q_sh, q_sn, q0_, BLOCK_R, nq, tid, NTHREADS); \
    wg_load_rows(QSLOT(slot) + QT_BYTES, dout + dout_off + bq * dout_sb + row_q * dout_sn + (long)h_ * dout_sh, \
                 dout_sn, q0_, BLOCK_R, nq, tid, NTHREADS);                                                         \
    cp_commit();                                                                                            \
  }
  float pl = INFINITY, pd = 0.0f; /* a step's LSE and D, one step ahead (LOAD_LD, wgmma_bwd_common.cl) */

#if BULK_DQ
  /* The staged dQ tile of the previous step (query head, first row; -1: none),
   * added by FLUSH_DQ after a barrier: work-item r issues row r. */
  int pend_h = -1, pend_q0 = 0;
#define FLUSH_DQ()                                                                                          \
  if (pend_h >= 0) {                                                                                        \
    if (tid < min(BLOCK_R, nq - pend_q0))                                                                   \
      bulk_add_f32(dq_acc + (((long)b * heads_q + pend_h) * seqlen_q + pend_q0 + tid) * HEAD_DIM,           \
                   sb + SM_DQ + tid * DQ_PITCH, HEAD_DIM * 4);                                              \
    pend_h = -1;                                                                                            \
  }
#endif
  if (steps > 0) {
    LOAD_TILES(0, 0)
    LOAD_LD(0)
    STORE_LD(0)
  }
  const uint ka = kbuf + wg * 64 * 128, va = vbuf + wg * 64 * 128; /* this warpgroup's 64 keys */
  const int key0 = k0 + wg * 64 + wiw * 16 + g;                     /* this lane's first key */
  for (int s = 0, slot = 0; s < steps; s++, slot ^= 1) {
    const int h = hk * group + s / qsteps, q0 = qstart + (s % qsteps) * BLOCK_R;
    const uint qb = QSLOT(slot), db = qb + QT_BYTES;
    __local const float *l2s = l2s_all + slot * BLOCK_R, *dss = dss_all + slot * BLOCK_R;
    cp_wait_all();
    proxy_fence();
    barrier(CLK_LOCAL_MEM_FENCE); /* this step's tiles are in; every product of the last step is done */
    if (s + 1 < steps) {
      LOAD_TILES(s + 1, slot ^ 1)
      LOAD_LD(s + 1)
    }
#if BULK_DQ
    FLUSH_DQ()
#endif

    float st[QN * 4], dpt[QN * 4];
    wg_fence();
    #pragma unroll
    for (int ks = 0; ks < KT; ks++)
      WG_SS(BLOCK_R)(st, wg_desc(ka + (ks >> 2) * REGION(KV_BLOCK) + (ks & 3) * 32, 16, 1024),
                     wg_desc(qb + (ks >> 2) * REGION(BLOCK_R) + (ks & 3) * 32, 16, 1024), ks);
    wg_commit();
    #pragma unroll
    for (int ks = 0; ks < KT; ks++)
      WG_SS(BLOCK_R)(dpt, wg_desc(va + (ks >> 2) * REGION(KV_BLOCK) + (ks & 3) * 32, 16, 1024),
                     wg_desc(db + (ks >> 2) * REGION(BLOCK_R) + (ks & 3) * 32, 16, 1024), ks);
    wg_commit();
    wg_wait1(); /* S^T is in; dP^T may still run while P^T is computed */
    REG_FENCE(st, QN * 4);

    /* P^T and dS^T in place: element e of n-tile nt is key key0 + 8 (e >> 1),
     * query q0 + 8 nt + 2 t + (e & 1). */
    const int need_mask = MASK || sv_tile_partial(q0, BLOCK_R, k0, KV_BLOCK, diag, nk, window_left, window_right);
    __global const uint *mrow = MASK_ROW(h);
    const float slope_log2 = ALIBI ? alibi[h] * LOG2E : 0.0f;
#if SOFTCAP || DROPOUT /* dS^T needs each score's tanh or keep bit: one pass after both products */
    wg_wait0();
    REG_FENCE(dpt, QN * 4);
#endif
    #pragma unroll
    for (int nt = 0; nt < QN; nt++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = nt * 8 + 2 * t + (e & 1);
        const int key = key0 + (e >> 1) * 8;
        const int i = 4 * nt + e;
#if SCORE_LOG2
        float th;
        float p = fast_exp2(sv_logit(st[i], scale_log2, softcap_in, softcap_log2, slope_log2,
                                     abs(key - (q0 + col + diag)), &th) - l2s[col]);
#else
        float p = fast_exp2(fma(st[i], scale_log2, -l2s[col]));
#endif
        if (need_mask && !sv_pair_visible(q0 + col, key, nq, nk, diag, window_left, window_right, mrow, MASK_CLASS,
                                          mask_words, mask_bq, mask_bk))
          p = 0.0f;
#if DROPOUT
        float dpv = 0.0f;
        st[i] = 0.0f;
        if (dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)(q0 + col), (uint)key, threshold)) {
          st[i] = p * keep_scale;
          dpv = dpt[i] * keep_scale;
        }
#else
        st[i] = p;
#if SOFTCAP
        const float dpv = dpt[i];
#endif
#endif
#if SOFTCAP
        dpt[i] = p * (dpv - dss[col]) * sv_logit_grad(th);
#elif DROPOUT
        dpt[i] = p * (dpv - dss[col]);
#endif
      }
#if !SOFTCAP && !DROPOUT
    wg_wait0();
    REG_FENCE(dpt, QN * 4);
    #pragma unroll
    for (int nt = 0; nt < QN; nt++)
      #pragma unroll
      for (int e = 0; e < 4; e++) dpt[4 * nt + e] = st[4 * nt + e] * (dpt[4 * nt + e] - dss[nt * 8 + 2 * t + (e & 1)]);
#endif

    /* A fragments of k-step j (queries 16 j ..): n-tiles 2 j and 2 j + 1. */
    uint pa[QN / 2][4], sa[QN / 2][4];
    #pragma unroll
    for (int j = 0; j < QN / 2; j++)
      #pragma unroll
      for (int x = 0; x < 4; x++) {
        pa[j][x] = pack2(st[8 * j + 2 * x], st[8 * j + 2 * x + 1]);
        sa[j][x] = pack2(dpt[8 * j + 2 * x], dpt[8 * j + 2 * x + 1]);
      }
#if ATOMIC_DQ
    {
      /* dS^T to local memory: this lane's keys kr, kr + 8, query chunks 2 j, 2 j + 1. */
      __local uchar *ds8 = (__local uchar *)smem + (sb - SADDR(smem)) + SM_DS;
      const int kr = wg * 64 + wiw * 16 + g;
      #pragma unroll
      for (int j = 0; j < QN / 2; j++) {
        *(__local uint *)(ds8 + TOFF(KV_BLOCK, kr, 2 * j) + 4 * t) = sa[j][0];
        *(__local uint *)(ds8 + TOFF(KV_BLOCK, kr + 8, 2 * j) + 4 * t) = sa[j][1];
        *(__local uint *)(ds8 + TOFF(KV_BLOCK, kr, 2 * j + 1) + 4 * t) = sa[j][2];
        *(__local uint *)(ds8 + TOFF(KV_BLOCK, kr + 8, 2 * j + 1) + 4 * t) = sa[j][3];
      }
    }
#endif
    wg_fence();
    #pragma unroll
    for (int j = 0; j < QN / 2; j++) WG_RS(NP)(dva, pa[j], wg_desc(db + j * 2048, REGION(BLOCK_R), 1024));
    #pragma unroll
    for (int j = 0; j < QN / 2; j++) WG_RS(NP)(dka, sa[j], wg_desc(qb + j * 2048, REGION(BLOCK_R), 1024));
#if ATOMIC_DQ
    /* dQ (64 x 64 per warpgroup) = dS K over the block's 128 keys: it needs the
     * other warpgroup's dS^T, whose barrier waits under dV's and dK's products. */
    wg_commit();
    proxy_fence(); /* generic-proxy stores, read by wgmma through the async proxy */
#if BULK_DQ
    bulk_wait_read(); /* after the barrier the dQ staging may be rewritten */
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    float dq[32];
    wg_fence();
    {
      const uint dsa = sb + SM_DS + (DQ_MSPLIT ? wg : 0) * REGION(KV_BLOCK);
      const uint kb = kbuf + (DQ_MSPLIT ? 0 : wg) * REGION(KV_BLOCK);
      #pragma unroll
      for (int kk = 0; kk < KV_BLOCK / 16; kk++)
        WGMMA_SST_N64(dq, wg_desc(dsa + kk * 2048, REGION(KV_BLOCK), 1024), wg_desc(kb + kk * 2048, REGION(KV_BLOCK), 1024),
                      kk);
    }
#endif
    wg_commit();
    wg_wait0();
    REG_FENCE(dva, DT * 4);
    REG_FENCE(dka, DT * 4);
    if (s + 1 < steps) STORE_LD(slot ^ 1)
#if ATOMIC_DQ
    REG_FENCE(dq, 32);
#if BULK_DQ
    {
      /* Staged; the next barrier (the next step's, or the one after the loop)
       * orders these stores before FLUSH_DQ's bulk reads. */
      __local uchar *st8 = (__local uchar *)smem + (sb - SADDR(smem)) + SM_DQ;
      const int r0 = (DQ_MSPLIT ? wg * 64 : 0) + wiw * 16 + g, c0 = (DQ_MSPLIT ? 0 : wg * 64) + 2 * t;
      #pragma unroll
      for (int hh = 0; hh < 2; hh++)
        #pragma unroll
        for (int nt = 0; nt < 8; nt++)
          *(__local float2 *)(st8 + (r0 + hh * 8) * DQ_PITCH + (c0 + nt * 8) * 4) =
              (float2)(dq[4 * nt + 2 * hh] * scale, dq[4 * nt + 2 * hh + 1] * scale);
      pend_h = h;
      pend_q0 = q0;
    }
#else
    {
      __global float *qacc = dq_split + ((long)b * heads_q + h) * seqlen_q * HEAD_DIM;
      const int r0 = q0 + (DQ_MSPLIT ? wg * 64 : 0) + wiw * 16 + g, c0 = (DQ_MSPLIT ? 0 : wg * 64) + 2 * t;
      #pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int row = r0 + hh * 8;
        if (row >= nq) continue;
        __global float *dst = qacc + (long)row * HEAD_DIM + c0;
        #pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#if HEAD_DIM < DPAD
          if (c0 - 2 * t + nt * 8 >= HEAD_DIM) break; /* padded columns */
#endif
          wg_red2(dst + nt * 8, dq[4 * nt + 2 * hh] * scale, dq[4 * nt + 2 * hh + 1] * scale);
        }
      }
    }
#endif /* BULK_DQ */
#endif
  }
  cp_wait_all(); /* a block without query tiles still has its K/V copies in flight */
#if BULK_DQ
  proxy_fence();
  barrier(CLK_LOCAL_MEM_FENCE); /* the last step's dQ tile is staged */
  FLUSH_DQ()
  bulk_wait_read(); /* the source must outlive the reads */
#undef FLUSH_DQ
#endif

  /* dK = scale * dS^T Q; rows past the end of the sequence are not stored. */
  const long dkb = dk_off + bq * dk_sb + row_k * dk_sn + (long)hk * dk_sh;
  const long dvb = dv_off + bq * dv_sb + row_k * dv_sn + (long)hk * dv_sh;
  #pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int key = key0 + hh * 8;
    if (key >= nk) continue;
    __global uint *kr = (__global uint *)(dk + dkb + (long)key * dk_sn + 2 * t);
    __global uint *vr = (__global uint *)(dv + dvb + (long)key * dv_sn + 2 * t);
    #pragma unroll
    for (int dt = 0; dt < DT; dt++) {
#if HEAD_DIM < NP
      if (dt * 8 >= HEAD_DIM) break; /* padded columns */
#endif
      kr[dt * 4] = pack2(dka[4 * dt + 2 * hh] * scale, dka[4 * dt + 2 * hh + 1] * scale);
      vr[dt * 4] = pack2(dva[4 * dt + 2 * hh], dva[4 * dt + 2 * hh + 1]);
    }
  }
#if DQ_SPLITS
  }
#endif
#undef LOAD_TILES
#undef QSLOT
}
#endif /* !DQ_ONLY */

/* ---- bwd_dq_wgmma: the deterministic dQ ----
 * One work-group of DQ_NWG warpgroups owns 64 DQ_NWG queries of one (sequence,
 * query head); Q and dO stay in local memory, K/V tiles of DQ_BLOCK_C keys go
 * through two cp.async stages. Per tile, in each warpgroup (64 queries):
 *   S = Q K^T, dP = dO V^T          (both operands from local memory)
 *   dS = P * (dP - D)               (registers, repacked as A fragments)
 *   dQ += dS K                      (K read N-major), dQ in fp32 registers
 * Each dQ element has one writer, so the result is bit-reproducible. */
#define DQ_ROWS (DQ_NWG * 64)
#define DQ_THREADS (DQ_NWG * 128)
#define DQ_NT (DQ_BLOCK_C / 8)
#define DQ_Q_BYTES TILE_BYTES(DQ_ROWS)
#define DQ_KV_BYTES TILE_BYTES(DQ_BLOCK_C)

__kernel __attribute__((reqd_work_group_size(DQ_THREADS, 1, 1))) void bwd_dq_wgmma(
    WCTENSOR(q), WCTENSOR(k), WCTENSOR(v), WCTENSOR(dout), WTENSOR(dq),
    __global const float *lse, long l_off, long l_sb, long l_sn, long l_sh,
    __global const float *dsum, int seqlen_q, int seqlen_k, int heads_q, int group, float scale, float scale_log2,
    __global const int *cu_q, __global const int *cu_k, int total_q, int total_k,
    int window_left, int window_right, __global const float *alibi, float softcap_in, float softcap_log2,
    __global const uint *mask, long mask_bs, long mask_hs, int mask_words, int mask_bq, int mask_bk,
    ulong seed, ulong offset, uint threshold, float keep_scale) {
  __local uint4 smem[(2 * DQ_Q_BYTES + 4 * DQ_KV_BYTES) / 16 + 63];
  const int tid = get_local_id(0), lane = tid & 31, wg = tid >> 7, wiw = (tid >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;
  const int q0 = (get_num_groups(0) - 1 - get_group_id(0)) * DQ_ROWS; /* heaviest causal blocks first */
  const int h = get_group_id(1), b = get_group_id(2);
  const int hk = h / group;
  const fcl_seq seq = fcl_seq_bounds(cu_q, cu_k, b, seqlen_q, seqlen_k, total_q, total_k);
  const int nq = seq.nq, nk = seq.nk, diag = seq.diag;
  const long bq = seq.bb, row_q = seq.q_row, row_k = seq.k_row;
  if (q0 >= nq) return; /* whole work-group leaves together */
  const uint sq = (SADDR(smem) + 1023u) & ~1023u, sdo = sq + DQ_Q_BYTES, skv = sdo + DQ_Q_BYTES;
  wg_load_rows(sq, q + q_off + bq * q_sb + row_q * q_sn + (long)h * q_sh, q_sn, q0, DQ_ROWS, nq, tid, DQ_THREADS);
  wg_load_rows(sdo, dout + dout_off + bq * dout_sb + row_q * dout_sn + (long)h * dout_sh, dout_sn, q0, DQ_ROWS, nq,
               tid, DQ_THREADS);
  cp_commit();

  const int grow0 = q0 + wg * 64, wrow0 = grow0 + wiw * 16;
  /* LSE (log2 domain; +inf for a row without keys or past nq, so P = 0) and D of rows g, g + 8. */
  float l2r[2], ddr[2];
  #pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = wrow0 + g + hh * 8;
    l2r[hh] = INFINITY;
    ddr[hh] = 0.0f;
    if (row < nq) {
      const float l = lse[l_off + bq * l_sb + (row_q + row) * l_sn + (long)h * l_sh];
      l2r[hh] = l == -INFINITY ? INFINITY : l * LOG2E;
      ddr[hh] = dsum[((long)b * heads_q + h) * seqlen_q + row];
    }
  }
  float acc[DT * 4];
  #pragma unroll
  for (int i = 0; i < DT * 4; i++) acc[i] = 0.0f;

  const int2 wg_keys = sv_key_range(q0, DQ_ROWS, diag, nk, window_left, window_right, DQ_BLOCK_C);
  const int2 g_keys = sv_key_range(grow0, 64, diag, nk, window_left, window_right, 1);
  const int kbeg = wg_keys.x, kend = wg_keys.y, gbeg = g_keys.x, gend = g_keys.y;
  const float slope_log2 = ALIBI ? alibi[h] * LOG2E : 0.0f;
  __global const ushort *kp = k + k_off + bq * k_sb + row_k * k_sn + (long)hk * k_sh;
  __global const ushort *vp = v + v_off + bq * v_sb + row_k * v_sn + (long)hk * v_sh;
#define DKBUF(j) (skv + ((j) & 1) * DQ_KV_BYTES)
#define DVBUF(j) (skv + (2 + ((j) & 1)) * DQ_KV_BYTES)
#define DTILE_K0(j) (kbeg + (j) * DQ_BLOCK_C)
#define DLOAD_KV(j)                                                                          \
  {                                                                                          \
    wg_load_rows(DKBUF(j), kp, k_sn, DTILE_K0(j), DQ_BLOCK_C, nk, tid, DQ_THREADS);          \
    wg_load_rows(DVBUF(j), vp, v_sn, DTILE_K0(j), DQ_BLOCK_C, nk, tid, DQ_THREADS);          \
    cp_commit();                                                                             \
  }
  const int ntiles = kend > kbeg ? (kend - kbeg + DQ_BLOCK_C - 1) / DQ_BLOCK_C : 0;
  if (ntiles > 0) DLOAD_KV(0)
  const uint qa = sq + wg * 64 * 128, da = sdo + wg * 64 * 128; /* this warpgroup's 64 rows */
  for (int j = 0; j < ntiles; j++) {
    const int k0 = DTILE_K0(j);
    cp_wait_all();
    proxy_fence();
    barrier(CLK_LOCAL_MEM_FENCE); /* tile j is in; every product of tile j - 1 is done */
    if (j + 1 < ntiles) DLOAD_KV(j + 1)
    /* Uniform over the warpgroup: the last block's warpgroups past nq, and tiles
     * these 64 rows see no key of, skip the products. */
    int active = grow0 < nq && k0 < gend;
#if WINDOW
    active = active && k0 + DQ_BLOCK_C > gbeg;
#endif
    (void)gbeg;
    if (!active) continue;
    float st[DQ_NT * 4], dpt[DQ_NT * 4];
    wg_fence();
    #pragma unroll
    for (int ks = 0; ks < KT; ks++)
      WG_SS(DQ_BLOCK_C)(st, wg_desc(qa + (ks >> 2) * REGION(DQ_ROWS) + (ks & 3) * 32, 16, 1024),
                        wg_desc(DKBUF(j) + (ks >> 2) * REGION(DQ_BLOCK_C) + (ks & 3) * 32, 16, 1024), ks);
    wg_commit();
    #pragma unroll
    for (int ks = 0; ks < KT; ks++)
      WG_SS(DQ_BLOCK_C)(dpt, wg_desc(da + (ks >> 2) * REGION(DQ_ROWS) + (ks & 3) * 32, 16, 1024),
                        wg_desc(DVBUF(j) + (ks >> 2) * REGION(DQ_BLOCK_C) + (ks & 3) * 32, 16, 1024), ks);
    wg_commit();
    wg_wait1(); /* S is in; dP may still run while P is computed */
    REG_FENCE(st, DQ_NT * 4);
    /* Element e of n-tile nt: row wrow0 + g + 8 (e >> 1), key k0 + 8 nt + 2 t + (e & 1). */
    const int need_mask = MASK || sv_tile_partial(wrow0, 16, k0, DQ_BLOCK_C, diag, nk, window_left, window_right);
    __global const uint *mrow = MASK_ROW(h);
#if SOFTCAP || DROPOUT
    wg_wait0();
    REG_FENCE(dpt, DQ_NT * 4);
#endif
    #pragma unroll
    for (int nt = 0; nt < DQ_NT; nt++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int hh = e >> 1, i = 4 * nt + e;
        const int col = k0 + nt * 8 + 2 * t + (e & 1), row = wrow0 + g + hh * 8;
#if SCORE_LOG2
        float th;
        float p = fast_exp2(sv_logit(st[i], scale_log2, softcap_in, softcap_log2, slope_log2, abs(col - (row + diag)),
                                     &th) - l2r[hh]);
#else
        float p = fast_exp2(fma(st[i], scale_log2, -l2r[hh]));
#endif
        if (need_mask &&
            !sv_pair_visible(row, col, nq, nk, diag, window_left, window_right, mrow, MASK_CLASS, mask_words, mask_bq,
                             mask_bk))
          p = 0.0f;
#if DROPOUT
        const float dpv =
            dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)row, (uint)col, threshold) ? dpt[i] * keep_scale : 0.0f;
#elif SOFTCAP
        const float dpv = dpt[i];
#endif
#if SOFTCAP
        dpt[i] = p * (dpv - ddr[hh]) * sv_logit_grad(th);
#elif DROPOUT
        dpt[i] = p * (dpv - ddr[hh]);
#else
        st[i] = p;
#endif
      }
#if !SOFTCAP && !DROPOUT
    wg_wait0();
    REG_FENCE(dpt, DQ_NT * 4);
    #pragma unroll
    for (int i = 0; i < DQ_NT * 4; i++) dpt[i] = st[i] * (dpt[i] - ddr[(i >> 1) & 1]);
#endif
    /* dS as the A fragments of dQ += dS K (k = keys: n-tiles 2 jj, 2 jj + 1). */
    uint sa[DQ_NT / 2][4];
    #pragma unroll
    for (int nt = 0; nt < DQ_NT; nt++) {
      sa[nt >> 1][(nt & 1) * 2] = pack2(dpt[4 * nt], dpt[4 * nt + 1]);
      sa[nt >> 1][(nt & 1) * 2 + 1] = pack2(dpt[4 * nt + 2], dpt[4 * nt + 3]);
    }
    wg_fence();
    #pragma unroll
    for (int jj = 0; jj < DQ_NT / 2; jj++) {
#if HEAD_DIM > 128 /* columns 0-127 (K's regions 0 and 1), then the rest */
      WG_RS(128)(acc, sa[jj], wg_desc(DKBUF(j) + jj * 2048, REGION(DQ_BLOCK_C), 1024));
      WG_RS(WG_DLAST)(acc + 64, sa[jj], wg_desc(DKBUF(j) + 2 * REGION(DQ_BLOCK_C) + jj * 2048, REGION(DQ_BLOCK_C), 1024));
#else
      WG_RS(NP)(acc, sa[jj], wg_desc(DKBUF(j) + jj * 2048, REGION(DQ_BLOCK_C), 1024));
#endif
    }
    wg_commit();
    wg_wait0();
    REG_FENCE(acc, DT * 4);
  }
  cp_wait_all(); /* a block without visible keys still has its Q/dO copies in flight */

  const long dqb = dq_off + bq * dq_sb + row_q * dq_sn + (long)h * dq_sh;
  #pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = wrow0 + g + hh * 8;
    if (row >= nq) continue;
    __global uint *dr = (__global uint *)(dq + dqb + (long)row * dq_sn + 2 * t);
    #pragma unroll
    for (int dt = 0; dt < DT; dt++) {
#if HEAD_DIM < NP
      if (dt * 8 >= HEAD_DIM) break; /* padded columns */
#endif
      dr[dt * 4] = pack2(acc[4 * dt + 2 * hh] * scale, acc[4 * dt + 2 * hh + 1] * scale);
    }
  }
#undef DLOAD_KV
}

#else /* !USE_PTX: empty bodies, so that the file is valid OpenCL C everywhere */

#if !DQ_ONLY
__kernel void bwd_dkdv_wgmma(__global float *unused) { (void)unused; }
#endif
__kernel void bwd_dq_wgmma(__global float *unused) { (void)unused; }

#endif /* USE_PTX */
