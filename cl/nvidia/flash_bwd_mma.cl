/*
 * flash_bwd_mma.cl: FlashAttention-2 backward on NVIDIA tensor cores through
 * inline PTX (mma.sync m16n8k16, ldmatrix, cp.async, red.global.add.f32).
 *
 * The PTX helpers come from mma_ptx.cl and the masking and score-variant
 * rules from score_variant.cl (with mma_scores.cl's tanh), compiled first in
 * the same program ("mma_ptx.cl+mma_scores.cl+score_variant.cl+seq_bounds.cl+
 * flash_bwd_mma.cl", with philox.cl, mask.cl and mask_mma.cl in between where
 * dropout or a mask needs them). Everything that is
 * PTX sits behind
 * `#if USE_PTX`, which the host sets only where the tensor-core path passed its
 * probe (src/nvidia/mma_forward.c); with USE_PTX=0 the kernels have empty bodies and the
 * host never launches them. D = rowsum(dO * O) and the conversion of the atomic
 * dQ accumulator come from the portable flash_bwd.cl (bwd_preprocess,
 * bwd_dq_store): they are memory-bound and need no tensor cores.
 *
 * P is recomputed from the forward's natural-log LSE: with raw scores s and
 * scale_log2 = scale * log2(e), P = exp2(s * scale_log2 - lse * log2(e)). A row
 * whose LSE is -inf saw no key; it gets +inf in the log2 domain, so its P is
 * exactly 0 (as are rows past the end of the sequence), never NaN. Causally
 * hidden keys and keys past the end get P = 0 explicitly.
 *
 *   bwd_dkdv_mma  one work-group owns KV_BLOCK = NWARPS * 16 keys of one
 *                 (sequence, KV head); each warp owns 16 of them. K stays in
 *                 local memory, V in registers (A fragments; in local memory
 *                 with V_IN_SMEM), dK and dV in fp32 accumulators, while Q/dO
 *                 tiles of BLOCK_R queries (QBUF buffers) of every query head
 *                 of the GQA group stream through:
 *                   S^T = K Q^T, dP^T = V dO^T             (keys x queries)
 *                   P^T = exp2(...), dS^T = P^T * (dP^T - D)
 *                   dV += P^T dO, dK += dS^T Q             (P^T, dS^T repacked
 *                                                            as A fragments)
 *                 With ATOMIC_DQ = 1, dS^T also goes to local memory and the
 *                 work-group adds scale * dS K to the fp32 dQ accumulator with
 *                 red.global.add.f32 (.v2 with VEC_RED); the accumulator is
 *                 zeroed by bwd_preprocess.
 *                 With DQ_SPLITS = 1 as well, this is the deterministic dQ
 *                 without a second kernel: work-group x of a grid of `splits`
 *                 along dimension 0 walks key blocks x, x + splits, ... in
 *                 order, adding into split x's own accumulator. Each accumulator
 *                 element then has one writer (the warps split the dQ tile,
 *                 and the same work-item owns the same elements in every key
 *                 block) whose adds land in program order, so the sums are
 *                 bit-reproducible; bwd_dq_store adds the splits in a fixed
 *                 order. FlashAttention-2's deterministic backward does the same.
 *   bwd_dq_mma    the deterministic dQ: one work-group owns NWARPS * 16 * M_TILES
 *                 queries; Q and dO stay in registers, K/V tiles of BLOCK_C keys
 *                 are double-buffered through cp.async:
 *                   S = Q K^T, dP = dO V^T, dS = P * (dP - D), dQ += dS K.
 *
 * Tensors are strided (batch, seq, head, dim) views with unit dim stride;
 * offsets and strides are in elements. D and the dQ accumulator are dense fp32
 * scratch indexed [seq_id][head][row] (x HEAD_DIM), rows padded to seqlen_q, as
 * in flash_bwd.cl. Requirements (checked by the host): fp16 or bf16, head_dim a
 * multiple of 16 up to 256 (bwd_dq_mma: up to 128), element offsets and (batch, seq, head) strides multiples of 8 (16-byte
 * rows for cp.async), scale > 0.
 *
 * Dropout (DROPOUT = 1, philox.cl compiled first) regenerates the forward's
 * mask Z: dV = (P Z / (1 - p))^T dO, dS = P (dP Z / (1 - p) - D).
 *
 * Score variants and masks follow the portable backward (flash_bwd.cl): with
 * SOFTCAP or ALIBI the score goes to log2 units before the exp2 (softcap:
 * c * tanh(scale * s / c), and dS is multiplied by 1 - tanh^2; ALiBi: minus
 * slope * |j - (i + diag)|); a window narrows the query tiles of bwd_dkdv_mma
 * and the key tiles of bwd_dq_mma as causal does; with a mask, bwd_dkdv_mma
 * neither loads nor computes query tiles whose bits are all 0 for its keys, and
 * bwd_dq_mma skips key tiles as the forward does (mask_mma.cl).
 *
 * Parameters (-D):
 *   USE_PTX    1: compile the tensor-core kernels; 0: empty bodies, never launched
 *   DTYPE      1 = fp16, 2 = bf16
 *   HEAD_DIM   a multiple of 8 up to 256 (D16 below); past 128 only bwd_dkdv_mma has a
 *              body (its dQ comes from ATOMIC_DQ, with DQ_SPLITS where it must
 *              be deterministic): bwd_dq_mma keeps Q, dO and dQ in registers
 *   NWARPS     warps per work-group (both kernels)
 *   KV_PARTS   bwd_dkdv_mma: warps per 16-key slice (1 or 2). With 2, each
 *              warp of a pair computes S^T and dP^T for half of the tile's
 *              queries, both halves of P^T and dS^T meet in local memory, and
 *              each warp accumulates half of dK's and dV's columns over all the
 *              queries: past d = 128 one warp's accumulators alone would take
 *              every register. KV_BLOCK = NWARPS / KV_PARTS * 16 keys.
 *   BLOCK_R    bwd_dkdv_mma: queries per streamed tile (multiple of 32, and
 *              2 * BLOCK_R >= KV_BLOCK: V is staged through the Q/dO buffers)
 *   M_TILES    bwd_dq_mma: 16-row tiles per warp
 *   BLOCK_C    bwd_dq_mma: keys per streamed tile (multiple of 16)
 *   CAUSAL     1: key j is visible to query i iff j <= i + (Nk - Nq)
 *   VARLEN     1: sequence bounds come from cu_seqlens_q/k
 *   ATOMIC_DQ  1: bwd_dkdv_mma also accumulates dQ (needs the dq_acc buffer)
 *   QBUF       bwd_dkdv_mma: 1 or 2 Q/dO tile buffers; with 2 the next tile's
 *              cp.async runs under the current tile's math (needs the local
 *              memory of two tiles: the host uses it where its probe showed
 *              that the device takes more than 48 KiB per work-group)
 *   DQ_SPLITS  1 (with ATOMIC_DQ): bwd_dkdv_mma loops over key blocks with the
 *              stride get_num_groups(0), and dq_acc holds get_num_groups(0)
 *              accumulators of [batch][heads_q][seqlen_q][HEAD_DIM] floats
 *   VEC_RED    1: the atomic dQ adds two floats per red.global.add.v2.f32
 *              (sm_90, PTX ISA 8.1)
 *   V_IN_SMEM  bwd_dkdv_mma: 1 keeps V in its own local tile and re-reads its
 *              fragments (32 registers fewer at d = 128, one more ldmatrix per
 *              k-step); 0 keeps them in registers
 *   WINDOW, ALIBI, SOFTCAP, MASK   as in flash_fwd_mma.cl (MASK needs mask.cl
 *              and mask_mma.cl compiled first in the same program)
 *
 * The host joins seq_bounds.cl in front with the other tensor-core kernels, but
 * these kernels keep their own SEQ_BOUNDS below: through fcl_seq_bounds the
 * dK/dV kernel ran slower on the H100 (BENCHMARKS.md, 2026-11-26), which a
 * shared helper must not cost.
 */
#ifndef USE_PTX
#define USE_PTX 0
#endif
#ifndef DTYPE
#define DTYPE 1
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#ifndef BLOCK_R
#define BLOCK_R 64
#endif
#ifndef KV_PARTS
#define KV_PARTS 1
#endif
#ifndef M_TILES
#define M_TILES 1
#endif
#ifndef BLOCK_C
#define BLOCK_C 64
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef VARLEN
#define VARLEN 0
#endif
#ifndef ATOMIC_DQ
#define ATOMIC_DQ 0
#endif
#ifndef QBUF
#define QBUF 1
#endif
#ifndef VEC_RED
#define VEC_RED 0
#endif
#ifndef DQ_SPLITS
#define DQ_SPLITS 0
#endif
#ifndef V_IN_SMEM
#define V_IN_SMEM 0
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
#ifndef MASK
#define MASK 0
#endif
#ifndef DROPOUT
#define DROPOUT 0
#endif
#if DROPOUT && !defined(PHILOX_CL)
#error "DROPOUT needs philox.cl compiled first in the same program"
#endif
#if USE_PTX && !defined(SCORE_VARIANT_CL)
#error "flash_bwd_mma.cl needs mma_scores.cl and score_variant.cl compiled first in the same program"
#endif
#if MASK && USE_PTX && !defined(MASK_MMA_CL)
#error "MASK needs mask.cl and mask_mma.cl compiled first in the same program"
#endif

#define NTHREADS (NWARPS * 32)
/* A head dim that is an odd multiple of 8 runs at D16 (the next multiple of
 * 16, mma's k-step): its rows carry one zero-filled chunk in local memory, and
 * the columns of dK, dV and dQ past HEAD_DIM are not stored. */
#define D16 ((HEAD_DIM + 15) / 16 * 16)
#define CH (D16 / 8)       /* 16-byte chunks per row in local memory */
#define CH_REAL (HEAD_DIM / 8) /* of them read from memory */
#if CH == CH_REAL
#define CHUNK_OK(c) 1
#else
#define CHUNK_OK(c) ((c) < CH_REAL)
#endif
/* Chunks per local row: a multiple of 8, so that the swizzle c ^ (r & 7) stays in
 * the row (head dims that are not multiples of 64 leave the rest of the row unused). */
#define SWZ_ROW ((CH + 7) / 8 * 8)
#define KT (D16 / 16)      /* k-steps over head_dim */
#define DT (D16 / 8)       /* 8-column n-tiles over head_dim */
#define KV_BLOCK (NWARPS / KV_PARTS * 16)
#define DPAIRS (D16 / 16)                             /* 16-column pairs of n-tiles */
#define PART_PAIRS ((DPAIRS + KV_PARTS - 1) / KV_PARTS) /* pairs of dK / dV per warp */
#define QN (BLOCK_R / 8)  /* 8-query n-tiles of S^T */
#define QW (QN / KV_PARTS)  /* of them computed by one warp */
#define DS_CH (BLOCK_R / 8)
#define DQ_WQ (BLOCK_R / 32)           /* warps along the queries of the atomic dQ tile */
#define DQ_WD (NWARPS / DQ_WQ)         /* warps along head_dim */
#define DQ_NP ((DPAIRS + DQ_WD - 1) / DQ_WD) /* 16-column pairs per warp (the last warps may get fewer) */
#define DQ_NT (2 * DQ_NP)              /* 8-column n-tiles per warp */
#define RQ (NWARPS * 16 * M_TILES)     /* bwd_dq_mma: queries per work-group */
#define NT (BLOCK_C / 8)               /* bwd_dq_mma: 8-key n-tiles of S */

#if HEAD_DIM % 8 || HEAD_DIM > 256 || BLOCK_R % 32 || 2 * BLOCK_R < KV_BLOCK || BLOCK_C % 16 || QBUF < 1 || \
    QBUF > 2 || (ATOMIC_DQ && (NWARPS % DQ_WQ || DQ_WD > DPAIRS)) || (DQ_SPLITS && !ATOMIC_DQ) ||             \
    (KV_PARTS != 1 && KV_PARTS != 2) || NWARPS % KV_PARTS
#error "unsupported flash_bwd_mma parameters"
#endif

#define LOG2E 1.4426950408889634f

#if USE_PTX

#ifndef MMA_TYPE
#error "flash_bwd_mma.cl with USE_PTX=1 needs mma_ptx.cl compiled first in the same program"
#endif

/* Work-item tid's cp.async share of rows [row0, row0 + rows) of a strided source
 * into the swizzled tile at local address buf: elements e = tid, tid + NTHREADS,
 * ... are chunk e % CH of tile row e / CH (where CH divides NTHREADS, the fixed
 * chunk tid % CH of rows tid / CH + i * NTHREADS / CH); p points at source row 0,
 * rows are sn elements apart. Rows at or past n are zero-filled (P is 0 there,
 * but 0 * garbage could be NaN); their source address is clamped to row 0. */
inline void cp_rows(uint buf, __global const ushort *p, long sn, int row0, int rows, int n, int tid) {
#if NTHREADS % CH == 0
  const int lc = tid % CH;
  for (int r = tid / CH; r < rows; r += NTHREADS / CH) {
    const int ok = row0 + r < n && CHUNK_OK(lc);
    cp_async16(buf + SWZ(r, lc), p + (long)(ok ? row0 + r : 0) * sn + (CHUNK_OK(lc) ? lc : 0) * 8, ok ? 16u : 0u);
  }
#else
  for (int e = tid; e < rows * CH; e += NTHREADS) {
    const int r = e / CH, c = e - (e / CH) * CH;
    const int ok = row0 + r < n && CHUNK_OK(c);
    cp_async16(buf + SWZ(r, c), p + (long)(ok ? row0 + r : 0) * sn + (CHUNK_OK(c) ? c : 0) * 8, ok ? 16u : 0u);
  }
#endif
}
/* The same for the dS^T tile ([key][query], DS_CH chunks per row): with 4 chunks
 * a row is 64 bytes, so rows r and r + 2 share banks unless the chunk index is
 * xor-ed with r / 2. */
#if DS_CH >= 8
#define DSWZ(r, c) ((uint)(((r) * DS_CH + ((c) ^ ((r) & 7))) * 16))
#else
#define DSWZ(r, c) ((uint)(((r) * DS_CH + ((c) ^ (((r) >> 1) & 3))) * 16))
#endif

#define CTENSOR(n) __global const ushort *n, long n##_off, long n##_sb, long n##_sn, long n##_sh
/* The score-variant and mask arguments both kernels take last (unused ones are 0 / NULL). */
#define VARIANT_PARAMS                                                                                       \
  , int window_left, int window_right, __global const float *alibi, float softcap_in, float softcap_log2,    \
      __global const uint *mask, long mask_bs, long mask_hs, int mask_words, int mask_bq, int mask_bk,      \
      ulong seed, ulong offset, uint threshold, float keep_scale

#define TENSOR(n) __global ushort *n, long n##_off, long n##_sb, long n##_sn, long n##_sh

/* Sequence window of work-group batch index b: (first row, rows) of q and k. */
#define SEQ_BOUNDS()                                                           \
  int nq = seqlen_q, nk = seqlen_k;                                            \
  long bq = b, row_q = 0, row_k = 0;                                           \
  if (VARLEN) {                                                                \
    int qs = clamp(cu_q[b], 0, total_q), qe = clamp(cu_q[b + 1], 0, total_q);  \
    int ks = clamp(cu_k[b], 0, total_k), ke = clamp(cu_k[b + 1], 0, total_k);  \
    nq = min(max(qe - qs, 0), seqlen_q);                                       \
    nk = min(max(ke - ks, 0), seqlen_k);                                       \
    row_q = qs;                                                                \
    row_k = ks;                                                                \
    bq = 0;                                                                    \
  }

#if MASK
/* bwd_dkdv_mma's steps run over (query head h0 + s / qsteps, query tile
 * qstart + (s % qsteps) * BLOCK_R). The mask class (mask.cl: 1 some bits set,
 * 3 all) of step s's queries x keys [k0, klast]. */
inline int dkdv_step_class(__global const uint *mseq, long mask_hs, int W, int bq, int bk, int h0, int qsteps,
                           int qstart, int nq, int k0, int klast, int s) {
  const int q0 = qstart + (s % qsteps) * BLOCK_R;
  return mask_tile(mseq + (h0 + s / qsteps) * mask_hs, W, bq, bk, q0, min(q0 + BLOCK_R, nq) - 1, k0, klast);
}
/* The first step at or after s whose tile has a mask bit set, or steps (uniform). */
inline int dkdv_next_step(__global const uint *mseq, long mask_hs, int W, int bq, int bk, int h0, int qsteps,
                          int qstart, int nq, int k0, int klast, int s, int steps) {
  while (s < steps && !(dkdv_step_class(mseq, mask_hs, W, bq, bk, h0, qsteps, qstart, nq, k0, klast, s) & 1)) s++;
  return s;
}
#endif

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void bwd_dkdv_mma(
    CTENSOR(q), CTENSOR(k), CTENSOR(v), CTENSOR(dout), TENSOR(dk), TENSOR(dv),
    __global const float *lse, long l_off, long l_sb, long l_sn, long l_sh,
    __global const float *dsum, __global float *dq_acc, int seqlen_q, int seqlen_k, int heads_q, int group,
    float scale, float scale_log2, __global const int *cu_q, __global const int *cu_k, int total_q, int total_k
    VARIANT_PARAMS) {
  /* K tile | QBUF x (Q tile | dO tile) | (dS^T tile); V is staged through the
   * first Q | dO pair. */
#define SM_K 0
#define SM_V (KV_BLOCK * SWZ_ROW * 16) /* V's own tile (V_IN_SMEM) */
#define SM_QD ((1 + V_IN_SMEM) * KV_BLOCK * SWZ_ROW * 16)
#define QD_BYTES (2 * BLOCK_R * SWZ_ROW * 16) /* one Q | dO pair */
#define SM_DS (SM_QD + QBUF * QD_BYTES)
#define DS_TILE (ATOMIC_DQ || KV_PARTS > 1) /* dS^T in local memory */
#define SM_PT (SM_DS + (DS_TILE ? KV_BLOCK * BLOCK_R * 2 : 0)) /* P^T (KV_PARTS > 1) */
#define SM_BYTES (SM_PT + (KV_PARTS > 1 ? KV_BLOCK * BLOCK_R * 2 : 0))
  __local uint4 smem[SM_BYTES / 16];
  __local float l2s_all[QBUF * BLOCK_R], dss_all[QBUF * BLOCK_R];
  const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int kw = warp / KV_PARTS, part = warp % KV_PARTS; /* 16-key slice, dK/dV column part */
  const int hk = get_group_id(1), b = get_group_id(2);
  SEQ_BOUNDS()
  const int diag = nk - nq;
  const uint sb = SADDR(smem);
  const uint kbuf = sb + SM_K;
#if DQ_SPLITS
  /* Key blocks split, split + splits, ... in order, each adding into this
   * split's own accumulator (see DQ_SPLITS above). */
  __global float *const dq_split =
      dq_acc + (long)get_group_id(0) * get_num_groups(2) * heads_q * seqlen_q * HEAD_DIM;
  for (int kblk = get_group_id(0);; kblk += get_num_groups(0)) {
  const int k0 = kblk * KV_BLOCK;
  if (k0 >= nk) break; /* whole work-group leaves together */
  barrier(CLK_LOCAL_MEM_FENCE); /* the previous block's K, Q/dO and dS^T reads are done */
#else
  __global float *const dq_split = dq_acc;
  const int k0 = get_group_id(0) * KV_BLOCK;
  if (k0 >= nk) return; /* whole work-group leaves together */
#endif
  uint qbuf = sb + SM_QD, dobuf = qbuf + QD_BYTES / 2;

  /* ---- K -> local (stays); V -> local -> registers ---- */
  {
    __global const ushort *kp = k + k_off + bq * k_sb + row_k * k_sn + (long)hk * k_sh;
    __global const ushort *vp = v + v_off + bq * v_sb + row_k * v_sn + (long)hk * v_sh;
    cp_rows(kbuf, kp, k_sn, k0, KV_BLOCK, nk, tid);
    cp_rows(V_IN_SMEM ? sb + SM_V : qbuf, vp, v_sn, k0, KV_BLOCK, nk, tid);
    cp_commit();
    cp_wait_all();
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const int arow = kw * 16 + (lane & 7) + ((lane >> 3) & 1) * 8; /* A-fragment row of this lane */
#if V_IN_SMEM
  const uint vbuf = sb + SM_V;
#else
  uint vf[KT][4];
  #pragma unroll
  for (int ks = 0; ks < KT; ks++) LDSM_X4(vf[ks][0], vf[ks][1], vf[ks][2], vf[ks][3], qbuf + SWZ(arow, 2 * ks + (lane >> 4)));
  barrier(CLK_LOCAL_MEM_FENCE); /* the staged V is dead: Q/dO may overwrite it */
#endif

  /* This warp's n-tiles of dK and dV: pairs part * PART_PAIRS + i. */
  float dka[2 * PART_PAIRS][4], dva[2 * PART_PAIRS][4];
  #pragma unroll
  for (int dt = 0; dt < 2 * PART_PAIRS; dt++)
    #pragma unroll
    for (int e = 0; e < 4; e++) dka[dt][e] = dva[dt][e] = 0.0f;

  /* Query tiles: every query head of the group, and under a causal mask or a
   * window only the rows that see at least one of these keys. */
  const int kmax = k0 + KV_BLOCK - 1; /* last key of the block */
  const int2 qrange = sv_query_range(k0, KV_BLOCK, diag, nq, nk, window_left, window_right, BLOCK_R);
  const int qstart = qrange.x, qend = qrange.y;
  const int qsteps = qend > qstart ? (qend - qstart + BLOCK_R - 1) / BLOCK_R : 0;
  const int steps = qsteps * group;
#if MASK
  __global const uint *mseq = mask + b * mask_bs;
#define STEP_CLASS(s)                                                                                        \
  dkdv_step_class(mseq, mask_hs, mask_words, mask_bq, mask_bk, hk * group, qsteps, qstart, nq, k0,          \
                  min(kmax, nk - 1), (s))
#define NEXT_STEP(s0)                                                                                        \
  dkdv_next_step(mseq, mask_hs, mask_words, mask_bq, mask_bk, hk * group, qsteps, qstart, nq, k0,           \
                 min(kmax, nk - 1), (s0), steps)
#else
#define NEXT_STEP(s0) (s0)
#endif

/* Issues the cp.async of the Q/dO tile of step s into buffer pair `slot` and
 * stages its LSE (log2 domain) and D in local memory. */
#define LOAD_STEP(s, slot)                                                                                  \
  {                                                                                                         \
    const int h_ = hk * group + (s) / qsteps, q0_ = qstart + ((s) % qsteps) * BLOCK_R;                      \
    const uint qb_ = sb + SM_QD + (slot) * QD_BYTES, db_ = qb_ + QD_BYTES / 2;                              \
    __local float *l2w_ = l2s_all + (slot) * BLOCK_R, *dsw_ = dss_all + (slot) * BLOCK_R;                   \
    __global const ushort *qp_ = q + q_off + bq * q_sb + row_q * q_sn + (long)h_ * q_sh;           \
    __global const ushort *dp_ = dout + dout_off + bq * dout_sb + row_q * dout_sn + (long)h_ * dout_sh; \
    cp_rows(qb_, qp_, q_sn, q0_, BLOCK_R, nq, tid);                                                      \
    cp_rows(db_, dp_, dout_sn, q0_, BLOCK_R, nq, tid);                                                   \
    cp_commit();                                                                                            \
    for (int r = tid; r < BLOCK_R; r += NTHREADS) {                                                         \
      float l2 = INFINITY, dd = 0.0f;                                                                       \
      if (q0_ + r < nq) {                                                                                   \
        const float l = lse[l_off + bq * l_sb + (row_q + q0_ + r) * l_sn + (long)h_ * l_sh];                \
        l2 = l == -INFINITY ? INFINITY : l * LOG2E;                                                         \
        dd = dsum[((long)b * heads_q + h_) * seqlen_q + q0_ + r];                                           \
      }                                                                                                     \
      l2w_[r] = l2;                                                                                         \
      dsw_[r] = dd;                                                                                         \
    }                                                                                                       \
  }

  /* Steps run in order, skipping (with a mask) those whose bits are all 0; the
   * buffer pair alternates per step run, not per step index. */
  int s = NEXT_STEP(0), slot = 0;
  if (s < steps) LOAD_STEP(s, 0)
  while (s < steps) {
    const int h = hk * group + s / qsteps, q0 = qstart + (s % qsteps) * BLOCK_R;
    const int sn = NEXT_STEP(s + 1);
    qbuf = sb + SM_QD + slot * QD_BYTES;
    dobuf = qbuf + QD_BYTES / 2;
    __local const float *l2s = l2s_all + slot * BLOCK_R, *dss = dss_all + slot * BLOCK_R;
    cp_wait_all();
    barrier(CLK_LOCAL_MEM_FENCE); /* Q, dO, LSE and D of this step are in; with QBUF = 2
                                     every warp is done with the other buffer pair */
#if QBUF == 2
    if (sn < steps) LOAD_STEP(sn, slot ^ 1)
#endif

    /* This warp's queries of the tile: qh0 .. qh0 + 8 * QW. */
    const int qh0 = part * (BLOCK_R / KV_PARTS);
    float st[QW][4], dpt[QW][4];
    #pragma unroll
    for (int nt = 0; nt < QW; nt++)
      #pragma unroll
      for (int e = 0; e < 4; e++) st[nt][e] = dpt[nt][e] = 0.0f;
    #pragma unroll
    for (int ks = 0; ks < KT; ks++) {
      uint ka[4];
      LDSM_X4(ka[0], ka[1], ka[2], ka[3], kbuf + SWZ(arow, 2 * ks + (lane >> 4)));
#if V_IN_SMEM
      uint va[4];
      LDSM_X4(va[0], va[1], va[2], va[3], vbuf + SWZ(arow, 2 * ks + (lane >> 4)));
#define VFRAG va
#else
#define VFRAG vf[ks]
#endif
      #pragma unroll
      for (int np = 0; np < QW / 2; np++) {
        const int r = qh0 + np * 16 + (lane & 7) + (lane >> 4) * 8, c = 2 * ks + ((lane >> 3) & 1);
        uint b0, b1, b2, b3;
        LDSM_X4(b0, b1, b2, b3, qbuf + SWZ(r, c));
        MMA(st[2 * np], ka, b0, b1);
        MMA(st[2 * np + 1], ka, b2, b3);
        LDSM_X4(b0, b1, b2, b3, dobuf + SWZ(r, c));
        MMA(dpt[2 * np], VFRAG, b0, b1);
        MMA(dpt[2 * np + 1], VFRAG, b2, b3);
      }
    }

    /* P^T and dS^T in place; the accumulator element e of n-tile nt is key
     * k0 + warp*16 + g + 8*(e >> 1), query q0 + nt*8 + 2t + (e & 1). */
#if MASK
    __global const uint *mrow = mseq + h * mask_hs;
    const int mcls = STEP_CLASS(s);
#else
    __global const uint *mrow = mask;
    const int mcls = 3;
#endif
    const int need_mask =
        sv_tile_partial(q0, BLOCK_R, k0, KV_BLOCK, diag, nk, window_left, window_right) | !(mcls & 2);
    const float slope_log2 = ALIBI ? alibi[h] * LOG2E : 0.0f;
    const int key0 = k0 + kw * 16 + g;
    #pragma unroll
    for (int nt = 0; nt < QW; nt++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = qh0 + nt * 8 + 2 * t + (e & 1);
        const int key = key0 + (e >> 1) * 8;
#if SCORE_LOG2
        float th;
        float p = fast_exp2(sv_logit(st[nt][e], scale_log2, softcap_in, softcap_log2, slope_log2,
                                       abs(key - (q0 + col + diag)), &th) - l2s[col]);
#else
        float p = fast_exp2(fma(st[nt][e], scale_log2, -l2s[col]));
#endif
        if (need_mask && !sv_pair_visible(q0 + col, key, nq, nk, diag, window_left, window_right, mrow, mcls, mask_words,
                                       mask_bq, mask_bk))
          p = 0.0f;
#if DROPOUT
        float dpv = 0.0f;
        st[nt][e] = 0.0f;
        if (dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)(q0 + col), (uint)key, threshold)) {
          st[nt][e] = p * keep_scale;
          dpv = dpt[nt][e] * keep_scale;
        }
#else
        st[nt][e] = p;
        const float dpv = dpt[nt][e];
#endif
#if SOFTCAP
        dpt[nt][e] = p * (dpv - dss[col]) * sv_logit_grad(th);
#else
        dpt[nt][e] = p * (dpv - dss[col]);
#endif
      }

    /* dV += P^T dO and dK += dS^T Q: k runs over this tile's queries, 16 at a
     * time (A = P^T and dS^T fragments of queries 16 j ..). */
#define DKDV_MMA(j, pa, sa)                                                    \
  {                                                                            \
    const int r_ = (j) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;              \
    _Pragma("unroll") for (int dp = 0; dp < PART_PAIRS; dp++) {                \
      const int gp = part * PART_PAIRS + dp; /* column pair of the head dim */ \
      if (DPAIRS % KV_PARTS && gp >= DPAIRS) break;                            \
      uint b0, b1, b2, b3;                                                     \
      LDSM_X4_T(b0, b1, b2, b3, dobuf + SWZ(r_, 2 * gp + (lane >> 4)));        \
      MMA(dva[2 * dp], pa, b0, b1);                                            \
      MMA(dva[2 * dp + 1], pa, b2, b3);                                        \
      LDSM_X4_T(b0, b1, b2, b3, qbuf + SWZ(r_, 2 * gp + (lane >> 4)));         \
      MMA(dka[2 * dp], sa, b0, b1);                                            \
      MMA(dka[2 * dp + 1], sa, b2, b3);                                        \
    }                                                                          \
  }
    #pragma unroll
    for (int j = 0; j < QW / 2; j++) {
      uint pa[4], sa[4];
      pa[0] = pack2(st[2 * j][0], st[2 * j][1]);
      pa[1] = pack2(st[2 * j][2], st[2 * j][3]);
      pa[2] = pack2(st[2 * j + 1][0], st[2 * j + 1][1]);
      pa[3] = pack2(st[2 * j + 1][2], st[2 * j + 1][3]);
      sa[0] = pack2(dpt[2 * j][0], dpt[2 * j][1]);
      sa[1] = pack2(dpt[2 * j][2], dpt[2 * j][3]);
      sa[2] = pack2(dpt[2 * j + 1][0], dpt[2 * j + 1][1]);
      sa[3] = pack2(dpt[2 * j + 1][2], dpt[2 * j + 1][3]);
#if DS_TILE
      {
        /* [key][query] tiles: this lane's keys g and g + 8, query chunks c and c + 1. */
        __local uint *dsw = (__local uint *)((__local uchar *)smem + SM_DS);
        const int kr = kw * 16 + g, c = qh0 / 8 + 2 * j;
        dsw[(DSWZ(kr, c) + 4 * t) / 4] = sa[0];
        dsw[(DSWZ(kr + 8, c) + 4 * t) / 4] = sa[1];
        dsw[(DSWZ(kr, c + 1) + 4 * t) / 4] = sa[2];
        dsw[(DSWZ(kr + 8, c + 1) + 4 * t) / 4] = sa[3];
#if KV_PARTS > 1
        __local uint *ptw = (__local uint *)((__local uchar *)smem + SM_PT);
        ptw[(DSWZ(kr, c) + 4 * t) / 4] = pa[0];
        ptw[(DSWZ(kr + 8, c) + 4 * t) / 4] = pa[1];
        ptw[(DSWZ(kr, c + 1) + 4 * t) / 4] = pa[2];
        ptw[(DSWZ(kr + 8, c + 1) + 4 * t) / 4] = pa[3];
#endif
      }
#endif
#if KV_PARTS == 1
      DKDV_MMA(j, pa, sa)
#endif
    }
#if KV_PARTS > 1
    barrier(CLK_LOCAL_MEM_FENCE); /* both halves of P^T and dS^T are written */
    #pragma unroll
    for (int j = 0; j < QN / 2; j++) {
      uint pa[4], sa[4];
      LDSM_X4(pa[0], pa[1], pa[2], pa[3], sb + SM_PT + DSWZ(arow, 2 * j + (lane >> 4)));
      LDSM_X4(sa[0], sa[1], sa[2], sa[3], sb + SM_DS + DSWZ(arow, 2 * j + (lane >> 4)));
      DKDV_MMA(j, pa, sa)
    }
#endif
#undef DKDV_MMA

#if QBUF == 1
    barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done with Q, dO, LSE, D (and dS^T is written) */
    if (sn < steps) LOAD_STEP(sn, 0)
#elif ATOMIC_DQ && KV_PARTS == 1
    barrier(CLK_LOCAL_MEM_FENCE); /* dS^T is written */
#endif

#if ATOMIC_DQ
    /* dQ[q0 .. q0 + BLOCK_R) += scale * dS K: warp (wq, wd) takes 32 queries x
     * DQ_NT * 8 columns; A = dS from the [key][query] tile with ldmatrix.trans,
     * B = K with ldmatrix.trans. */
    {
      const int wq = warp / DQ_WD, wd = warp % DQ_WD;
      const uint dsbuf = sb + SM_DS;
      float acc[2][DQ_NT][4];
      #pragma unroll
      for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int nt = 0; nt < DQ_NT; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
      #pragma unroll
      for (int kk = 0; kk < KV_BLOCK / 16; kk++) {
        uint a[2][4];
        #pragma unroll
        for (int mt = 0; mt < 2; mt++)
          LDSM_X4_T(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                    dsbuf + DSWZ(kk * 16 + (lane & 7) + (lane >> 4) * 8, wq * 4 + mt * 2 + ((lane >> 3) & 1)));
        #pragma unroll
        for (int np = 0; np < DQ_NP; np++) {
#if DPAIRS % DQ_WD
          if (wd * DQ_NP + np >= DPAIRS) break;
#endif
          uint b0, b1, b2, b3;
          LDSM_X4_T(b0, b1, b2, b3,
                    kbuf + SWZ(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, wd * DQ_NT + 2 * np + (lane >> 4)));
          #pragma unroll
          for (int mt = 0; mt < 2; mt++) {
            MMA(acc[mt][2 * np], a[mt], b0, b1);
            MMA(acc[mt][2 * np + 1], a[mt], b2, b3);
          }
        }
      }
      __global float *qacc = dq_split + ((long)b * heads_q + h) * seqlen_q * HEAD_DIM;
      #pragma unroll
      for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          const int row = q0 + wq * 32 + mt * 16 + g + hh * 8;
          if (row >= nq) continue;
          __global float *dst = qacc + (long)row * HEAD_DIM + wd * DQ_NT * 8 + 2 * t;
          #pragma unroll
          for (int nt = 0; nt < DQ_NT; nt++) {
#if DPAIRS % DQ_WD
            if (wd * DQ_NP + nt / 2 >= DPAIRS) break;
#endif
#if HEAD_DIM % 16
            if (wd * DQ_NT * 8 + nt * 8 >= HEAD_DIM) break; /* the zero chunk */
#endif
#if VEC_RED
            asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst + nt * 8),
                         "f"(acc[mt][nt][2 * hh] * scale), "f"(acc[mt][nt][2 * hh + 1] * scale) : "memory");
#else
            red_add_f32(dst + nt * 8, acc[mt][nt][2 * hh] * scale);
            red_add_f32(dst + nt * 8 + 1, acc[mt][nt][2 * hh + 1] * scale);
#endif
          }
        }
    }
#endif
    s = sn;
    if (QBUF == 2) slot ^= 1;
  }

  /* dK = scale * dS^T Q; rows past the end of the sequence are not stored. */
  const long dkb = dk_off + bq * dk_sb + row_k * dk_sn + (long)hk * dk_sh;
  const long dvb = dv_off + bq * dv_sb + row_k * dv_sn + (long)hk * dv_sh;
  #pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int key = k0 + kw * 16 + g + hh * 8;
    if (key >= nk) continue;
    const int c0 = part * PART_PAIRS * 16; /* first column of this warp's part */
    __global uint *kr = (__global uint *)(dk + dkb + (long)key * dk_sn + c0 + 2 * t);
    __global uint *vr = (__global uint *)(dv + dvb + (long)key * dv_sn + c0 + 2 * t);
    #pragma unroll
    for (int dt = 0; dt < 2 * PART_PAIRS; dt++) {
#if DPAIRS % KV_PARTS || HEAD_DIM % 16
      if (c0 + dt * 8 >= HEAD_DIM) break;
#endif
      kr[dt * 4] = pack2(dka[dt][2 * hh] * scale, dka[dt][2 * hh + 1] * scale);
      vr[dt * 4] = pack2(dva[dt][2 * hh], dva[dt][2 * hh + 1]);
    }
  }
#if DQ_SPLITS
  }
#endif
#undef LOAD_STEP
}

/* Past d = 128 the Q, dO and dQ registers of this kernel would not fit: the
 * program has no bwd_dq_mma there, so a host that asked for it would get an
 * error, never an unwritten dQ. */
#if HEAD_DIM <= 128
__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void bwd_dq_mma(
    CTENSOR(q), CTENSOR(k), CTENSOR(v), CTENSOR(dout), TENSOR(dq),
    __global const float *lse, long l_off, long l_sb, long l_sn, long l_sh,
    __global const float *dsum, int seqlen_q, int seqlen_k, int heads_q, int group, float scale, float scale_log2,
    __global const int *cu_q, __global const int *cu_k, int total_q, int total_k VARIANT_PARAMS) {
  /* Two K | V stages; Q and dO are staged through them once at the start. */
#define DQ_ROWS (4 * BLOCK_C > 2 * RQ ? 4 * BLOCK_C : 2 * RQ)
  __local uint4 smem[DQ_ROWS * SWZ_ROW];
  const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int q0 = (get_num_groups(0) - 1 - get_group_id(0)) * RQ; /* heaviest causal blocks first */
  const int h = get_group_id(1), b = get_group_id(2);
  const int hk = h / group;
  SEQ_BOUNDS()
  if (q0 >= nq) return;
  const int diag = nk - nq;
  const uint sb = SADDR(smem);
  const int wrow0 = q0 + warp * 16 * M_TILES;

  /* ---- Q and dO -> local -> registers ---- */
  {
    __global const ushort *qp = q + q_off + bq * q_sb + row_q * q_sn + (long)h * q_sh;
    __global const ushort *dp = dout + dout_off + bq * dout_sb + row_q * dout_sn + (long)h * dout_sh;
    cp_rows(sb, qp, q_sn, q0, RQ, nq, tid);
    cp_rows(sb + RQ * SWZ_ROW * 16, dp, dout_sn, q0, RQ, nq, tid); /* = rows RQ.. of the same swizzle */
    cp_commit();
    cp_wait_all();
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  uint qf[M_TILES][KT][4], df[M_TILES][KT][4];
  #pragma unroll
  for (int mt = 0; mt < M_TILES; mt++)
    #pragma unroll
    for (int ks = 0; ks < KT; ks++) {
      const int r = warp * 16 * M_TILES + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      LDSM_X4(qf[mt][ks][0], qf[mt][ks][1], qf[mt][ks][2], qf[mt][ks][3], sb + SWZ(r, 2 * ks + (lane >> 4)));
      LDSM_X4(df[mt][ks][0], df[mt][ks][1], df[mt][ks][2], df[mt][ks][3], sb + SWZ(RQ + r, 2 * ks + (lane >> 4)));
    }
  /* Per-row LSE (log2 domain) and D of this lane's rows g and g + 8. */
  float l2r[M_TILES][2], ddr[M_TILES][2];
  #pragma unroll
  for (int mt = 0; mt < M_TILES; mt++)
    #pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = wrow0 + mt * 16 + g + hh * 8;
      l2r[mt][hh] = INFINITY;
      ddr[mt][hh] = 0.0f;
      if (row < nq) {
        const float l = lse[l_off + bq * l_sb + (row_q + row) * l_sn + (long)h * l_sh];
        l2r[mt][hh] = l == -INFINITY ? INFINITY : l * LOG2E;
        ddr[mt][hh] = dsum[((long)b * heads_q + h) * seqlen_q + row];
      }
    }
  barrier(CLK_LOCAL_MEM_FENCE); /* the staged Q/dO is dead: K/V may overwrite it */

  float acc[M_TILES][DT][4];
  #pragma unroll
  for (int mt = 0; mt < M_TILES; mt++)
    #pragma unroll
    for (int dt = 0; dt < DT; dt++) acc[mt][dt][0] = acc[mt][dt][1] = acc[mt][dt][2] = acc[mt][dt][3] = 0.0f;

  /* Keys [kbeg, kend) are needed by the work-group, [wbeg, wend) by this warp. */
  const int2 wg_keys = sv_key_range(q0, RQ, diag, nk, window_left, window_right, BLOCK_C);
  const int2 w_keys = sv_key_range(wrow0, 16 * M_TILES, diag, nk, window_left, window_right, 1);
  const int kbeg = wg_keys.x, kend = wg_keys.y, wbeg = w_keys.x, wend = w_keys.y;
  const float slope_log2 = ALIBI ? alibi[h] * LOG2E : 0.0f;
#if MASK
  __global const uint *mrow = mask + b * mask_bs + h * mask_hs;
  mask_geom mg;
  mask_win mw;
  mask_init(&mg, &mw, mrow, mask_words, mask_bq, mask_bk, q0, RQ, wrow0, 16 * M_TILES, nq, kend, nk);
#define NEXT_TILE(k) mask_next_tile(&mw, &mg, (k), lane)
#else
  __global const uint *mrow = mask;
#define NEXT_TILE(k) (k)
#endif
  __global const ushort *kp = k + k_off + bq * k_sb + row_k * k_sn + (long)hk * k_sh;
  __global const ushort *vp = v + v_off + bq * v_sb + row_k * v_sn + (long)hk * v_sh;
#define STAGE_K(st) (sb + (uint)((st) * 2 * BLOCK_C * SWZ_ROW * 16))
#define STAGE_V(st) (STAGE_K(st) + BLOCK_C * SWZ_ROW * 16)
#define LOAD_KV(st, kk0)                                  \
  {                                                     \
    cp_rows(STAGE_K(st), kp, k_sn, kk0, BLOCK_C, nk, tid); \
    cp_rows(STAGE_V(st), vp, v_sn, kk0, BLOCK_C, nk, tid); \
    cp_commit();                                        \
  }

  int k0 = NEXT_TILE(kbeg), it = 0;
  if (k0 < kend) LOAD_KV(0, k0)
  for (; k0 < kend; it ^= 1) {
#if MASK
    const int mcls = mask_warp_class(&mw, k0); /* before NEXT_TILE may move the window */
#else
    const int mcls = 3;
#endif
    const int kn = NEXT_TILE(k0 + BLOCK_C);
    cp_wait_all();
    barrier(CLK_LOCAL_MEM_FENCE); /* stage `it` is in; every warp is done with the other stage */
    if (kn < kend) LOAD_KV(it ^ 1, kn)
    /* Tiles this warp's rows see none of are skipped (the loads above are shared). */
    int active = k0 < wend;
#if WINDOW
    active = active && k0 + BLOCK_C > wbeg;
#endif
#if MASK
    active = active && (mcls & 1);
#endif
    if (!active) {
      k0 = kn;
      continue;
    }
    const uint kbuf = STAGE_K(it), vbuf = STAGE_V(it);

    float s[M_TILES][NT][4], dps[M_TILES][NT][4];
    #pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
      #pragma unroll
      for (int nt = 0; nt < NT; nt++)
        #pragma unroll
        for (int e = 0; e < 4; e++) s[mt][nt][e] = dps[mt][nt][e] = 0.0f;
    #pragma unroll
    for (int ks = 0; ks < KT; ks++)
      #pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        const int r = np * 16 + (lane & 7) + (lane >> 4) * 8, c = 2 * ks + ((lane >> 3) & 1);
        uint b0, b1, b2, b3;
        LDSM_X4(b0, b1, b2, b3, kbuf + SWZ(r, c));
        #pragma unroll
        for (int mt = 0; mt < M_TILES; mt++) {
          MMA(s[mt][2 * np], qf[mt][ks], b0, b1);
          MMA(s[mt][2 * np + 1], qf[mt][ks], b2, b3);
        }
        LDSM_X4(b0, b1, b2, b3, vbuf + SWZ(r, c));
        #pragma unroll
        for (int mt = 0; mt < M_TILES; mt++) {
          MMA(dps[mt][2 * np], df[mt][ks], b0, b1);
          MMA(dps[mt][2 * np + 1], df[mt][ks], b2, b3);
        }
      }

    const int need_mask =
        sv_tile_partial(wrow0, 16 * M_TILES, k0, BLOCK_C, diag, nk, window_left, window_right) | !(mcls & 2);
#if DROPOUT
    int keep = 0;
#endif
    #pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
      #pragma unroll
      for (int nt = 0; nt < NT; nt++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          const int hh = e >> 1;
          const int col = k0 + nt * 8 + 2 * t + (e & 1);
          const int row = wrow0 + mt * 16 + g + hh * 8;
#if SCORE_LOG2
          float th;
          float p = fast_exp2(sv_logit(s[mt][nt][e], scale_log2, softcap_in, softcap_log2, slope_log2,
                                         abs(col - (row + diag)), &th) - l2r[mt][hh]);
#else
          float p = fast_exp2(fma(s[mt][nt][e], scale_log2, -l2r[mt][hh]));
#endif
          if (need_mask &&
              !sv_pair_visible(row, col, nq, nk, diag, window_left, window_right, mrow, mcls, mask_words, mask_bq, mask_bk))
            p = 0.0f;
#if DROPOUT
          /* One Philox call covers the lane's two columns (e = 0, 1 and e = 2, 3). */
          if (!(e & 1)) keep = dropout_keep2(seed, offset, (ulong)b * heads_q + h, (uint)row, (uint)col, threshold);
          const float dpv = (keep >> (e & 1)) & 1 ? dps[mt][nt][e] * keep_scale : 0.0f;
#else
          const float dpv = dps[mt][nt][e];
#endif
#if SOFTCAP
          dps[mt][nt][e] = p * (dpv - ddr[mt][hh]) * sv_logit_grad(th);
#else
          dps[mt][nt][e] = p * (dpv - ddr[mt][hh]);
#endif
        }

    /* dQ += dS K: dS repacked as A fragments (k = keys), K with ldmatrix.trans. */
    #pragma unroll
    for (int j = 0; j < NT / 2; j++) {
      uint sa[M_TILES][4];
      #pragma unroll
      for (int mt = 0; mt < M_TILES; mt++) {
        sa[mt][0] = pack2(dps[mt][2 * j][0], dps[mt][2 * j][1]);
        sa[mt][1] = pack2(dps[mt][2 * j][2], dps[mt][2 * j][3]);
        sa[mt][2] = pack2(dps[mt][2 * j + 1][0], dps[mt][2 * j + 1][1]);
        sa[mt][3] = pack2(dps[mt][2 * j + 1][2], dps[mt][2 * j + 1][3]);
      }
      const int r = j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      #pragma unroll
      for (int dp = 0; dp < DT / 2; dp++) {
        uint b0, b1, b2, b3;
        LDSM_X4_T(b0, b1, b2, b3, kbuf + SWZ(r, 2 * dp + (lane >> 4)));
        #pragma unroll
        for (int mt = 0; mt < M_TILES; mt++) {
          MMA(acc[mt][2 * dp], sa[mt], b0, b1);
          MMA(acc[mt][2 * dp + 1], sa[mt], b2, b3);
        }
      }
    }
    k0 = kn;
  }

  const long dqb = dq_off + bq * dq_sb + row_q * dq_sn + (long)h * dq_sh;
  #pragma unroll
  for (int mt = 0; mt < M_TILES; mt++)
    #pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = wrow0 + mt * 16 + g + hh * 8;
      if (row >= nq) continue;
      __global uint *dr = (__global uint *)(dq + dqb + (long)row * dq_sn + 2 * t);
      #pragma unroll
      for (int dt = 0; dt < CH_REAL; dt++) dr[dt * 4] = pack2(acc[mt][dt][2 * hh] * scale, acc[mt][dt][2 * hh + 1] * scale);
    }
#undef LOAD_KV
}
#endif /* HEAD_DIM <= 128 */

#else /* !USE_PTX: empty bodies, so that the file is valid OpenCL C everywhere */

__kernel void bwd_dkdv_mma(__global float *unused) { (void)unused; }
__kernel void bwd_dq_mma(__global float *unused) { (void)unused; }

#endif /* USE_PTX */
