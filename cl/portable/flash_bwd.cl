/*
 * flash_bwd.cl: FlashAttention backward pass, portable OpenCL C 1.2.
 *
 * P is never stored: each kernel recomputes it from Q, K and the forward's LSE,
 * P_ij = exp2(scale_log2 * q_i.k_j - lse_i * log2(e)), with the forward's masks
 * applied as -inf before the exp2 (a masked entry must be exactly 0: with
 * garbage there, 0 * inf would give NaN). Rows whose LSE is -inf saw no key and
 * contribute nothing.
 *
 *   bwd_preprocess  D_i = rowsum(dO_i * O_i)                        (O(N d));
 *                   with ATOMIC_DQ it also zeroes the fp32 dQ accumulator
 *                   (all `splits` copies of it)
 *   bwd_dkdv        a work-group owns BLOCK_C keys: K and V stay in local
 *                   memory and dK, dV in registers while Q/dO tiles of BLOCK_R
 *                   rows stream through (see the kernel's comment). With GQA it
 *                   loops over every query head of its group, so dK and dV come
 *                   out summed without atomics. ATOMIC_DQ = 1 also accumulates
 *                   dQ into an fp32 buffer, with compare-and-swap or (NV_RED)
 *                   red.global.add.v4.f32.
 *   bwd_dq          a work-group owns BLOCK_R queries, K/V tiles stream through
 *                   (the deterministic dQ).
 *   bwd_dq_store    converts the fp32 atomic dQ accumulator to the output dtype,
 *                   adding its `splits` copies first (more than one only for
 *                   the deterministic tensor-core dQ, cl/nvidia/flash_bwd_mma.cl).
 *
 * Tensors are strided views (batch, seq, head, dim) with unit dim stride;
 * offsets and strides are in elements. Math is fp32. D and the dQ accumulator
 * are dense fp32 scratch indexed [seq_id][head][row] (x HEAD_DIM), rows padded to
 * the (max) sequence length.
 *
 * V, O and dO (so dV too) may have their own head dim, HEAD_DIM_V. The local
 * tiles then all have rows of DM = max(HEAD_DIM, HEAD_DIM_V) floats, the
 * columns past a tensor's own head dim staged as 0: the products and grids
 * below run over DM, the zero columns add nothing to S, dP or dQ and give
 * columns of dK / dV that are never stored.
 *
 * Parameters (-D):
 *   DTYPE      0 = fp32, 1 = fp16, 2 = bf16 (storage only)
 *   HEAD_DIM   head dimension of q and k (and dq, dk)
 *   HEAD_DIM_V head dimension of v, o and dout (and dv); default HEAD_DIM
 *   BLOCK_R, BLOCK_C   query rows / key rows per tile (multiples of 8)
 *   NTHREADS   work-items per work-group
 *   A_TM, A_TN     bwd_dkdv scores per work-item (keys x queries):
 *                  (BLOCK_C / A_TM) * (BLOCK_R / A_TN) == NTHREADS
 *   B_TM, B_TD     bwd_dkdv dK/dV per work-item (keys x columns, B_TD a multiple of 4):
 *                  (BLOCK_C / B_TM) * (DM / B_TD) <= NTHREADS
 *   QA_TM, QA_TN   bwd_dq scores per work-item (queries x keys):
 *                  (BLOCK_R / QA_TM) * (BLOCK_C / QA_TN) == NTHREADS
 *   QB_TM, QB_TD   bwd_dq dQ per work-item (queries x columns, QB_TD a multiple of 4):
 *                  (BLOCK_R / QB_TM) * (DM / QB_TD) <= NTHREADS
 *   CAUSAL     1: key j is visible to query i iff j <= i + (Nk - Nq)
 *   VARLEN     1: sequence bounds come from cu_seqlens_q/k
 *   ATOMIC_DQ  1: bwd_dkdv also accumulates dQ (needs the dq_acc buffer); the
 *              host also sets it when the tensor-core dK/dV kernel fills split
 *              accumulators (then only bwd_preprocess and bwd_dq_store run here)
 *   DQ_VEC     1: dq's byte offset is a multiple of 16 and its row strides of 8
 *              elements, so each work-item's 8 elements start 16-byte aligned
 *              and bwd_dq_store writes them as 16-byte vectors (one for fp16 and
 *              bf16, two for fp32)
 *   DROPOUT    1: regenerate the forward's dropout mask (philox.cl must be
 *              compiled first in the same program); with dropout,
 *              dV = (P*Z/(1-p))^T dO and dS = P * (dP*Z/(1-p) - D)
 *   WINDOW     1: key j is visible to query i iff
 *              i + diag - window_left <= j <= i + diag + window_right (diag = Nk - Nq;
 *              both >= 0, causal folded into window_right; build with CAUSAL=0);
 *              query / key tiles wholly outside are skipped
 *   ALIBI      1: score -= alibi[h] * |j - (i + diag)| (after the softcap)
 *   SOFTCAP    1: score = c * tanh(scale * q.k / c) (softcap_in = scale / c,
 *              softcap_log2 = c * log2(e)), and dS is multiplied by 1 - tanh^2
 *   MASK       1: block mask, 2: bit mask (flashcl_mask_kind), the forward's layout
 *              and addressing (see flash_fwd.cl; mask.cl must be compiled first in
 *              the same program): a 0 bit hides key j from query i,
 *              so P_ij = 0 there (before dS). Both kernels take the extra arguments
 *              mask, mask_bs, mask_hs, mask_words, mask_bq, mask_bk (only when
 *              MASK != 0); (query tile x key tile) pairs whose bits are all 0 are
 *              skipped, pairs whose bits are all 1 skip the per-score test.
 *   BWD_AHEAD  1: read the next Q/dO (bwd_dkdv) or K/V (bwd_dq) tile into
 *              registers while the current one is computed (ignored with MASK)
 *   VEC_ALIGNED 1: every element offset and stride of q, k, v and dout is a
 *              multiple of 4, so four elements are read as one aligned vector
 *   SCORE_PAD  floats (0 or a multiple of 4) added to each row of the score
 *              tiles, so that the rows a warp reads at once fall in different
 *              banks (needed by the warp-tiled mappings below)
 *   A_WQ, B_WX, QA_WK, QB_WX   0: work-item t of a phase grid of CT columns
 *              takes cell (t / CT, t % CT). n > 0: each 32 consecutive work-items
 *              cover a (32 / n) x n block of the grid instead (n queries of
 *              phase A, n column granules of phase B, n keys in bwd_dq's phase
 *              A, n column granules of its phase B), and these blocks tile the
 *              grid row by row; the host sets them only where n divides the
 *              grid's columns, 32 / n its rows, and every work-item is used.
 *              On a GPU a warp's loads then touch n rows of one operand and
 *              32 / n of the other instead of 1-2 and 16-32, which cuts the
 *              local-memory transactions per multiply-add.
 *   NV_RED     1: the atomic dQ adds go through red.global.add.v4.f32 (warp_ptx.cl)
 *              (NVIDIA, sm_90 and later; the host sets it from device queries)
 *   BWD_SPLIT  1: the work-items work in two halves of NTHREADS / 2. In
 *              bwd_dkdv's phase A the first half computes S^T and the second
 *              dP^T (A_TM x A_TN of one product each), in its phase B the first
 *              half adds to dV and the second to dK (B_TM x B_TD of one each);
 *              in bwd_dq's phase A the halves compute S and dP (QA_TM x QA_TN).
 *              Those grids then cover NTHREADS / 2 work-items, and NTHREADS
 *              must be even.
 *              Each work-item then reads one operand pair per product instead
 *              of two, over a tile twice as large: fewer local-memory reads per
 *              multiply-add, for one more barrier per tile.
 *   BWD_SHFL   1 (with BWD_SPLIT; NVIDIA: warp_ptx.cl's shfl.sync): bwd_dkdv's
 *              phase A halves are the two halves of each warp instead of the
 *              two halves of the work-group: lane l computes S^T and lane
 *              l ^ 16 dP^T of the same entries, they swap half of them through
 *              shuffles and each turns its half (A_TN / 2 of its queries; A_TN
 *              must be even) into P and dS. Both halves
 *              then share that step, and dP never goes through local memory
 *              (one barrier less per tile). Phase B keeps the work-group
 *              halves.
 *   BWD_NBAR   1 (with BWD_SPLIT, without BWD_SHFL and SOFTCAP; NVIDIA:
 *              warp_ptx.cl's bar.sync with a thread count): bwd_dkdv's S half turns S into
 *              P alone, writing the dropped P to Ps and the undropped P to dSs;
 *              after the work-group barrier the dP half, which still holds dP in
 *              registers, turns that into dS in place (dS = P (dP - D), or with
 *              dropout Pd dP - P D) and waits only for its own half (named
 *              barrier 1) before adding to dK, while the S half goes straight on
 *              to dV. The element-wise step is then split between the halves,
 *              and dP never goes through local memory. A work-group barrier
 *              after dK / dV orders dS for the atomic dQ sum.
 *   BWD_UNROLL 1: fully unroll the head-dim loop of the score products and the
 *              key loop of the atomic dQ, so that the local-memory reads of
 *              later steps are issued while earlier ones compute (left rolled,
 *              each step waits for its own reads)
 *
 * requires: dtype.cl seq_bounds.cl score_variant.cl
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V HEAD_DIM
#endif
#define DM (HEAD_DIM > HEAD_DIM_V ? HEAD_DIM : HEAD_DIM_V) /* the local tiles' head dim */
#ifndef BLOCK_R
#define BLOCK_R 16
#endif
#ifndef BLOCK_C
#define BLOCK_C 16
#endif
#ifndef NTHREADS
#define NTHREADS 64
#endif
#ifndef A_TM
#define A_TM 2
#endif
#ifndef A_TN
#define A_TN 2
#endif
#ifndef B_TM
#define B_TM 1
#endif
#ifndef B_TD
#define B_TD 4
#endif
#ifndef QA_TM
#define QA_TM 2
#endif
#ifndef QA_TN
#define QA_TN 2
#endif
#ifndef QB_TM
#define QB_TM 1
#endif
#ifndef QB_TD
#define QB_TD 4
#endif
#ifndef ATOMIC_DQ
#define ATOMIC_DQ 0
#endif
#ifndef DROPOUT
#define DROPOUT 0
#endif
#ifndef DQ_VEC
#define DQ_VEC 0
#endif
#ifndef BWD_AHEAD
#define BWD_AHEAD 0
#endif
#ifndef VEC_ALIGNED
#define VEC_ALIGNED 0
#endif
#ifndef SCORE_PAD
#define SCORE_PAD 0
#endif
#ifndef A_WQ
#define A_WQ 0
#endif
#ifndef B_WX
#define B_WX 0
#endif
#ifndef QA_WK
#define QA_WK 0
#endif
#ifndef QB_WX
#define QB_WX 0
#endif
#ifndef NV_RED
#define NV_RED 0
#endif
#ifndef BWD_SPLIT
#define BWD_SPLIT 0
#endif
#ifndef BWD_UNROLL
#define BWD_UNROLL 0
#endif
#ifndef BWD_SHFL
#define BWD_SHFL 0
#endif
#if BWD_SHFL && (!BWD_SPLIT || NTHREADS % 32 || A_TN % 2)
#error "BWD_SHFL needs BWD_SPLIT, whole warps and an even A_TN"
#endif
#ifndef BWD_NBAR
#define BWD_NBAR 0
#endif
#if BWD_NBAR && (!BWD_SPLIT || BWD_SHFL || SOFTCAP || (NTHREADS / 2) % 32)
#error "BWD_NBAR needs BWD_SPLIT on whole warps, without BWD_SHFL and SOFTCAP"
#endif
#if BWD_UNROLL
#define UNROLL_FULL _Pragma("unroll")
#else
#define UNROLL_FULL
#endif
#if BWD_SPLIT && NTHREADS % 2
#error "BWD_SPLIT needs an even NTHREADS"
#endif
/* The work-items of one split product (all of them without BWD_SPLIT). */
#if BWD_SPLIT
#define GRID_N (NTHREADS / 2)
#else
#define GRID_N NTHREADS
#endif

#define LOG2E 1.4426950408889634f

/* Four consecutive elements, one at a time (no alignment assumed). */
#define STORE_EACH4(p, i, v)                                                       \
  {                                                                                \
    const float4 v4_ = (v);                                                        \
    STORE(p, (i), v4_.x);                                                          \
    STORE(p, (i) + 1, v4_.y);                                                      \
    STORE(p, (i) + 2, v4_.z);                                                      \
    STORE(p, (i) + 3, v4_.w);                                                      \
  }

/* A strided tensor argument list: buffer, element offset, batch/seq/head strides. */
#define TENSOR(name) __global store_t *name, long name##_off, long name##_sb, long name##_sn, long name##_sh
#define CTENSOR(name) __global const store_t *name, long name##_off, long name##_sb, long name##_sn, long name##_sh
/* Element offset of row `row` of head `h` in sequence-batch index `bb`. */
#define ROWPTR(name, bb, row, h) (name##_off + (long)(bb) * name##_sb + (long)(row) * name##_sn + (long)(h) * name##_sh)

/* The first compare-and-swap guesses 0.0f (the accumulator's start) instead
 * of reading *p: OpenCL 1.2 has no atomic load, and a plain read beside other
 * work-items' swaps is a data race in its memory model (Oclgrind reported
 * each one). A wrong guess only costs one more swap, with the value it returns. */
inline void atomic_add_float(volatile __global float *p, float val) {
  union {
    uint u;
    float f;
  } seen, next;
  seen.u = 0u;
  do {
    next.f = seen.f + val;
    uint prev = atomic_cmpxchg((volatile __global uint *)p, seen.u, next.u);
    if (prev == seen.u) break;
    seen.u = prev;
  } while (1);
}

/* Adds four floats to a 16-byte aligned fp32 accumulator; zeros are skipped
 * (causally masked parts of a tile contribute nothing). NV_RED: one
 * red.global.add.v4.f32 (sm_90; like every global float atomic add on NVIDIA
 * it flushes denormal results to zero), which skips zeros only where a mask
 * can zero a whole sum (without one, the test costs more than it saves);
 * otherwise a compare-and-swap loop per float, as OpenCL 1.2 has no float
 * atomic add. */
#if CAUSAL || WINDOW || MASK
#define RED_SKIP_ZERO 1
#else
#define RED_SKIP_ZERO 0
#endif
#if (NV_RED || BWD_SHFL || BWD_NBAR) && !(defined(WARP_PTX_CL) && WARP_PTX)
#error "NV_RED, BWD_SHFL and BWD_NBAR need warp_ptx.cl (NVIDIA) compiled first in the same program"
#endif
#if NV_RED
#define ATOMIC_ADD4(ptr_, val_)                                    \
  {                                                          \
    const float4 a_ = (val_);                                   \
    if (!RED_SKIP_ZERO || any(a_ != (float4)(0.0f))) nv_red_add4((ptr_), a_); \
  }
#else
#define ATOMIC_ADD4(ptr_, val_)                                    \
  {                                                          \
    const float4 a_ = (val_);                                   \
    __global float *p_ = (ptr_);                                \
    if (a_.x != 0.0f) atomic_add_float(p_, a_.x);            \
    if (a_.y != 0.0f) atomic_add_float(p_ + 1, a_.y);        \
    if (a_.z != 0.0f) atomic_add_float(p_ + 2, a_.z);        \
    if (a_.w != 0.0f) atomic_add_float(p_ + 3, a_.w);        \
  }
#endif

#if MASK
#ifndef MASK_CL
#error "MASK needs mask.cl compiled first in the same program"
#endif
#define MASK_PARAMS \
  , __global const uint *mask, long mask_bs, long mask_hs, int mask_words, int mask_bq, int mask_bk
#else
#define MASK_PARAMS
#endif

/* Global (ceil(padded_q / PRE_ROWS) * 64, heads_q, seqs), local (64, 1, 1). Each
 * row's D is computed by PRE_TPR = HEAD_DIM_V / 8 work-items of 8 elements each (a
 * row's loads are one contiguous run: coalesced on GPUs), reduced through local
 * memory. With ATOMIC_DQ the same work-items zero the row of the fp32 dQ
 * accumulator (HEAD_DIM floats), so that no separate fill is needed. Rows past
 * the sequence get D = 0 (and a zero accumulator row). */
#define PRE_TPR (HEAD_DIM_V / 8)
#define PRE_ROWS (64 / PRE_TPR)
__kernel __attribute__((reqd_work_group_size(64, 1, 1))) void bwd_preprocess(
    CTENSOR(o), CTENSOR(dout), __global float *dsum, __global float *dq_acc, int padded_q, int heads_q,
    __global const int *cu_q, int total_q, int splits) {
  __local float red[64];
  const int tid = get_local_id(0), r = tid / PRE_TPR, x = tid - r * PRE_TPR;
  const int i = get_group_id(0) * PRE_ROWS + r, h = get_global_id(1), b = get_global_id(2);
  const int2 sq = fcl_seq_rows(cu_q, b, padded_q, total_q);
  const long bb = VARLEN ? 0 : b;
  float acc = 0.0f;
  if (r < PRE_ROWS && i < sq.y) {
    const long po = ROWPTR(o, bb, sq.x + i, h) + 8 * x, pd = ROWPTR(dout, bb, sq.x + i, h) + 8 * x;
    const float4 a = LOAD4(o, po) * LOAD4(dout, pd), c = LOAD4(o, po + 4) * LOAD4(dout, pd + 4);
    acc = (a.x + a.y) + (a.z + a.w) + (c.x + c.y) + (c.z + c.w);
  }
#if ATOMIC_DQ
  if (r < PRE_ROWS && i < padded_q) {
    /* The accumulator's rows are HEAD_DIM floats, a multiple of 8: the pointer is
     * 32-byte aligned, so this is one vector store, not eight. */
    const long split = (long)get_global_size(2) * heads_q * padded_q * HEAD_DIM;
    for (int sp = 0; sp < splits; sp++)
      for (int c = x; c < HEAD_DIM / 8; c += PRE_TPR) /* one pass unless HEAD_DIM > HEAD_DIM_V */
        *(__global float8 *)(dq_acc + sp * split + (((long)b * heads_q + h) * padded_q + i) * HEAD_DIM + 8 * c) =
            (float8)(0.0f);
  }
#endif
  red[tid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = 1; w < PRE_TPR; w <<= 1) {
    /* PRE_TPR is a power of two only for some head dims: add the partner when it
     * exists, so any HEAD_DIM_V / 8 works. */
    const float mine = red[tid];
    const float other = (r < PRE_ROWS && x % (2 * w) == 0 && x + w < PRE_TPR) ? red[tid + w] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    red[tid] = mine + other;
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (r < PRE_ROWS && x == 0 && i < padded_q) dsum[((long)b * heads_q + h) * padded_q + i] = red[tid];
}

/* Shared by both kernels: local tiles are fp32 rows padded to LDA floats, so the
 * float4 granule g of consecutive rows falls in consecutive bank groups. */
#define LDA (DM + 4)
#define LDA4 (LDA / 4)
#define D4 (DM / 4) /* granules of a local tile's row */
/* Granules of a row of each tensor the tiles stage (by its argument name):
 * those past it are staged as 0. */
#define GR_q (HEAD_DIM / 4)
#define GR_k (HEAD_DIM / 4)
#define GR_v (HEAD_DIM_V / 4)
#define GR_dout (HEAD_DIM_V / 4)
#define TILE_COL_IN(src, g) (GR_##src == D4 || (g) < GR_##src)
/* Score tiles are read four entries at a time along their rows: bwd_dkdv keeps
 * P and dS transposed, [key][query], and its dK/dV loop reads four queries of
 * a key at once; bwd_dq keeps dS as [query][key] and reads four keys of a
 * query at once. With the default mappings those reads are broadcasts (a
 * warp's work-items share one or two rows) and rows are not padded: padding
 * grew the tiles past half the budget at d = 80 (64x32), which then planned
 * smaller tiles. The warp-tiled mappings read several rows at once and pad
 * them (SCORE_PAD). */
#define BRP (BLOCK_R + SCORE_PAD)
#define BCP (BLOCK_C + SCORE_PAD)

/* Work-item t -> (row, column) of a phase grid with CT columns: row-major, or
 * in blocks of 32 work-items spanning W columns (A_WQ and the others, above). */
#define GRID_ROW(t, W, CT) ((W) ? ((t) / 32) / ((CT) / ((W) ? (W) : 1)) * (32 / ((W) ? (W) : 1)) + ((t) % 32) / ((W) ? (W) : 1) : (t) / (CT))
#define GRID_COL(t, W, CT) ((W) ? ((t) / 32) % ((CT) / ((W) ? (W) : 1)) * (W) + ((t) % 32) % ((W) ? (W) : 1) : (t) % (CT))

/* Staged tile registers: fp16 and bf16 stay packed, four values in one 64-bit
 * word, until they are written to local memory, which halves the registers a
 * fetched tile holds and reads four elements with one load. */
#if DTYPE == 0
typedef float4 stage_t;
#if VEC_ALIGNED
#define STAGE_GLOAD(p) (*(__global const float4 *)(p))
#else
#define STAGE_GLOAD(p) vload4(0, (p))
#endif
#define STAGE_CVT(x) (x)
#define STAGE_ZERO ((float4)(0.0f))
#else
typedef uint2 stage_t;
#if VEC_ALIGNED
#define STAGE_GLOAD(p) (*(__global const uint2 *)(p))
#else
#define STAGE_GLOAD(p) as_uint2(vload4(0, (__global const ushort *)(p)))
#endif
#define STAGE_ZERO ((uint2)(0u))
#if DTYPE == 1
#define STAGE_CVT(x) fcl_half4_bits_to_float4(x)
#else
#define STAGE_CVT(x) fcl_bf16x4_to_float4(as_ushort4(x))
#endif
#endif

/* Copies rows [row0, row0 + nrows) of a strided tensor into a padded local
 * tile, zero-filling rows at or past `rows` (never garbage: 0 * NaN is NaN), in
 * two halves: TILE_FETCH reads the work-item's granules into registers, all
 * reads first, and TILE_PUT writes them to local memory. The streamed tiles are
 * fetched before the barrier that frees their local copy (or, with BWD_AHEAD,
 * a whole tile earlier, so that the reads arrive while the current tile is
 * computed); otherwise (and always with a mask) the kernels fetch the tile they
 * are about to use. */
#define TILE_REGS(nrows) (((nrows) * D4 + NTHREADS - 1) / NTHREADS)
#if NTHREADS % D4 == 0
/* Each pass moves the work-item down by NTHREADS / D4 rows: one row address,
 * stepped by a constant stride, instead of a 64-bit multiply per granule. */
#define TILE_FETCH(regs, src, bb, seq0, row0, rows, head, nrows)                   \
  {                                                                                \
    const int r0_ = tid / D4, g0_ = tid - r0_ * D4;                                \
    const int col_in_ = TILE_COL_IN(src, g0_);                                     \
    __global const store_t *p_ = src + ROWPTR(src, bb, (seq0) + (row0) + r0_, head) + 4 * g0_; \
    for (int u_ = 0; u_ < TILE_REGS(nrows); u_++) {                                \
      const int r_ = r0_ + u_ * (NTHREADS / D4);                                   \
      stage_t v_ = STAGE_ZERO;                                                     \
      if (col_in_ && r_ < (nrows) && (row0) + r_ < (rows)) v_ = STAGE_GLOAD(p_);   \
      regs[u_] = v_;                                                               \
      p_ += (long)(NTHREADS / D4) * src##_sn;                                      \
    }                                                                              \
  }
#else
#define TILE_FETCH(regs, src, bb, seq0, row0, rows, head, nrows)                   \
  for (int u_ = 0; u_ < TILE_REGS(nrows); u_++) {                                  \
    const int e_ = tid + u_ * NTHREADS;                                            \
    const int r_ = e_ / D4, g_ = e_ - r_ * D4;                                     \
    stage_t v_ = STAGE_ZERO;                                                       \
    if (e_ < (nrows) * D4 && (row0) + r_ < (rows) && TILE_COL_IN(src, g_))         \
      v_ = STAGE_GLOAD(src + ROWPTR(src, bb, (seq0) + (row0) + r_, head) + 4 * g_); \
    regs[u_] = v_;                                                                 \
  }
#endif
#define TILE_PUT(dst, regs, nrows)                                                 \
  for (int u_ = 0; u_ < TILE_REGS(nrows); u_++) {                                  \
    const int e_ = tid + u_ * NTHREADS;                                            \
    const int r_ = e_ / D4, g_ = e_ - r_ * D4;                                     \
    if (e_ < (nrows) * D4) ((__local float4 *)(dst))[r_ * LDA4 + g_] = STAGE_CVT(regs[u_]); \
  }
/* Per-row values (LSE, D) per work-item when BLOCK_R rows are spread over
 * the work-group. */
#define ROW_REGS ((BLOCK_R + NTHREADS - 1) / NTHREADS)
/* Both halves at once, for the tiles that stay resident. */
#define LOAD_TILE(dst, src, bb, seq0, row0, rows, head, nrows)                     \
  {                                                                                \
    stage_t t_[TILE_REGS(nrows)];                                                  \
    TILE_FETCH(t_, src, bb, seq0, row0, rows, head, nrows)                         \
    TILE_PUT(dst, t_, nrows)                                                       \
  }
#if MASK /* the next visible tile is only known after its mask bits are read */
#undef BWD_AHEAD
#define BWD_AHEAD 0
#endif

inline float dot4(float4 a, float4 b, float acc) {
  return mad(a.x, b.x, mad(a.y, b.y, mad(a.z, b.z, mad(a.w, b.w, acc))));
}

/* One half's score product (BWD_SPLIT, both kernels): s[i][j] = row ra + RA*i
 * of the tile xa . row rb + RB*j of the tile xb, over the head dimension,
 * reading a float4 of each row per step. */
#define SPLIT_PRODUCT(s, TM, TN, xa, ra, RA, xb, rb, RB)                          \
  for (int i = 0; i < (TM); i++)                                                   \
    for (int j = 0; j < (TN); j++) s[i][j] = 0.0f;                                 \
  UNROLL_FULL                                                                      \
  for (int x = 0; x < D4; x++) {                                                   \
    float4 a_[TM];                                                                 \
    for (int i = 0; i < (TM); i++) a_[i] = (xa)[((ra) + (RA) * i) * LDA4 + x];     \
    for (int j = 0; j < (TN); j++) {                                               \
      const float4 b_ = (xb)[((rb) + (RB) * j) * LDA4 + x];                        \
      for (int i = 0; i < (TM); i++) s[i][j] = dot4(a_[i], b_, s[i][j]);           \
    }                                                                              \
  }

/* One entry of the score tile in bwd_dkdv: key c, query r of the tile, S and
 * dP given. Stores the (dropped) P and dS = P * (dP - D) ([key][query]);
 * masked entries get P = dS = 0. */
#define PDS_DS(p_, dpv_, r_) ((p_) * ((dpv_) - Ds[r_]) * sv_logit_grad(t_))
#if MASK
#define PDS_MASK(jk_, iq_) \
  if (visible_ && !(mcls & 2)) visible_ = mask_ok(mrow, mask_words, mask_bq, mask_bk, iq_, jk_);
#else
#define PDS_MASK(jk_, iq_)
#endif
#if DROPOUT
#define PDS_DROP(jk_, iq_)                                                           \
  if (dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)(iq_), (uint)(jk_), threshold)) { \
    pd_ *= keep_scale;                                                               \
    dpv_ *= keep_scale;                                                              \
  } else {                                                                           \
    pd_ = 0.0f;                                                                      \
    dpv_ = 0.0f;                                                                     \
  }
#else
#define PDS_DROP(jk_, iq_)
#endif
/* The part both forms share: P (p_), the dropped P (pd_) and the dropped dP
 * (dpv_) of key c, query r. */
#define PDS_P(c_, r_, sv_, dp_)                                                      \
  const int c__ = (c_), r__ = (r_), jk_ = k0 + c__, iq_ = i0 + r__;                  \
  const float lrow_ = Ls[r__];                                                       \
  int visible_ = iq_ < nq && lrow_ != -INFINITY && sv_visible(iq_, jk_, nk, diag, window_left, window_right); \
  PDS_MASK(jk_, iq_)                                                                 \
  float t_;                                                                          \
  const float sc_ =                                                                  \
      sv_logit((sv_), scale_log2, softcap_in, softcap_log2, slope_log2, abs(jk_ - (iq_ + diag)), &t_); \
  const float p_ = visible_ ? exp2(sc_ - lrow_) : 0.0f;                             \
  float pd_ = p_, dpv_ = (dp_);                                                      \
  PDS_DROP(jk_, iq_)
#define PDS_ENTRY(c_, r_, sv_, dp_)                                                  \
  {                                                                                  \
    PDS_P(c_, r_, sv_, dp_)                                                          \
    Ps[c__ * BRP + r__] = pd_;                                                       \
    dSs[c__ * BRP + r__] = PDS_DS(p_, dpv_, r__);                                    \
  }
/* BWD_NBAR's share in the S half: the dropped P to Ps, the undropped P to dSs
 * (the dP half turns it into dS). */
#define PDS_ENTRY_P(c_, r_, sv_)                                                     \
  {                                                                                  \
    PDS_P(c_, r_, sv_, 0.0f)                                                         \
    (void)dpv_;                                                                      \
    Ps[c__ * BRP + r__] = pd_;                                                       \
    dSs[c__ * BRP + r__] = p_;                                                       \
  }

/*
 * dK/dV (and, with ATOMIC_DQ, dQ). One work-group owns BLOCK_C keys of one
 * (sequence, kv head); K and V stay in local memory and dK, dV in registers
 * while Q/dO tiles of BLOCK_R rows stream through. Per tile:
 *   A: S^T = K Q^T and dP^T = V dO^T, work-item grid (BLOCK_C / A_TM) x
 *      (BLOCK_R / A_TN), then P and dS = P * (dP - D) into local memory;
 *   B: dV += P^T dO and dK += dS^T Q, grid (BLOCK_C / B_TM) x (DM / B_TD).
 * Global (kblocks * NTHREADS, heads_kv, seqs), local NTHREADS.
 */
__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void bwd_dkdv(
    CTENSOR(q), CTENSOR(k), CTENSOR(v), CTENSOR(dout), TENSOR(dk), TENSOR(dv),
    __global const float *lse, long lse_off, long lse_sb, long lse_sn, long lse_sh,
    __global const float *dsum, __global float *dq_acc, int padded_q, int padded_k, int heads_q, int group,
    float scale, __global const int *cu_q, __global const int *cu_k, int total_q, int total_k, ulong seed,
    ulong offset, uint threshold, float keep_scale, int window_left, int window_right, __global const float *alibi,
    float softcap_in, float softcap_log2 MASK_PARAMS) {
#if BWD_SHFL
  /* V starts 64 bytes (half a row of banks) further than right after K, and dO
   * after Q: a warp then reads the same rows of both at once, and with the
   * tiles' sizes multiples of 128 bytes those rows would share banks. */
  __local float KVs[2 * BLOCK_C * LDA + 16] __attribute__((aligned(16)));
  __local float QOs[2 * BLOCK_R * LDA + 16] __attribute__((aligned(16)));
  __local float *const Ks = KVs, *const Vs = KVs + BLOCK_C * LDA + 16;
  __local float *const Qs = QOs, *const dOs = QOs + BLOCK_R * LDA + 16;
#else
  __local float Ks[BLOCK_C * LDA] __attribute__((aligned(16)));
  __local float Vs[BLOCK_C * LDA] __attribute__((aligned(16)));
  __local float Qs[BLOCK_R * LDA] __attribute__((aligned(16)));
  __local float dOs[BLOCK_R * LDA] __attribute__((aligned(16)));
#endif
  __local float Ps[BLOCK_C * BRP] __attribute__((aligned(16)));  /* dropped P, [key][query] */
  __local float dSs[BLOCK_C * BRP] __attribute__((aligned(16))); /* dS, [key][query] */
  __local float Ls[BLOCK_R];        /* LSE in log2 units */
  __local float Ds[BLOCK_R];

  const int tid = get_local_id(0);
  const int k0 = get_group_id(0) * BLOCK_C;
  const int hk = get_group_id(1), b = get_group_id(2);
  const fcl_seq sb = fcl_seq_bounds(cu_q, cu_k, b, padded_q, padded_k, total_q, total_k);
  const int nq = sb.nq, nk = sb.nk;
  if (k0 >= nk) return;
  const long bb = sb.bb;
  const int diag = sb.diag;
  const float scale_log2 = scale * LOG2E;

  LOAD_TILE(Ks, k, bb, sb.k_row, k0, nk, hk, BLOCK_C)
  LOAD_TILE(Vs, v, bb, sb.k_row, k0, nk, hk, BLOCK_C)

#if BWD_SPLIT
  /* role 0: S^T in phase A, dV in phase B; role 1: dP^T, then dK. */
  const int role = tid >= GRID_N, rt = tid - role * GRID_N;
#else
  const int rt = tid;
#endif
  /* Phase A's halves: with BWD_SHFL the two halves of each warp (arole, art). */
#if BWD_SHFL
  const int arole = (tid >> 4) & 1, art = (tid & 15) | ((tid >> 5) << 4);
#elif BWD_SPLIT
  const int arole = role, art = rt;
#else
  const int art = rt;
#endif
  /* Phase A mapping: keys c = ac + A_RT*i, queries r = ar + A_CT*j. */
#define A_CT (BLOCK_R / A_TN)
#define A_RT (BLOCK_C / A_TM)
#if A_WQ && (32 % A_WQ || A_CT % A_WQ || A_RT % (32 / A_WQ) || GRID_N % 32)
#error "A_WQ must divide 32 and A_CT, and 32 / A_WQ must divide A_RT"
#endif
  const int ac = GRID_ROW(art, A_WQ, A_CT), ar = GRID_COL(art, A_WQ, A_CT);
  /* Phase B mapping: keys c = bc + B_RT*i, column granules g = bx + B_CT*u. */
#define B_CT (DM / B_TD)
#define B_RT (BLOCK_C / B_TM)
#if B_WX && (32 % B_WX || B_CT % B_WX || B_RT % (32 / B_WX) || B_RT * B_CT != GRID_N)
#error "B_WX must divide 32 and B_CT, 32 / B_WX must divide B_RT, and the grid must use every work-item"
#endif
  const int bc = GRID_ROW(rt, B_WX, B_CT), bx = GRID_COL(rt, B_WX, B_CT);
  const int b_active = rt < B_RT * B_CT;

#if ATOMIC_DQ
  /* The atomic dQ grid: bwd_dq's dQ grid (QB_*) over this tile's rows, but
   * each work-item takes QB_TM consecutive rows (QB_TM * dqr + i), so that it
   * reads a key's dS for them four at a time. */
#define DQA_CT (DM / QB_TD)
#define DQA_RT (BLOCK_R / QB_TM)
  const int dqr = GRID_ROW(tid, QB_WX, DQA_CT), dqx = GRID_COL(tid, QB_WX, DQA_CT);
#endif

#if BWD_SPLIT
  float4 acc[B_TM][B_TD / 4]; /* dV (role 0) or dK (role 1) */
  for (int i = 0; i < B_TM; i++)
    for (int u = 0; u < B_TD / 4; u++) acc[i][u] = (float4)(0.0f);
#else
  float4 dk_acc[B_TM][B_TD / 4], dv_acc[B_TM][B_TD / 4];
  for (int i = 0; i < B_TM; i++)
    for (int u = 0; u < B_TD / 4; u++) dk_acc[i][u] = dv_acc[i][u] = (float4)(0.0f);
#endif

  /* Only the query tiles that see one of these keys. */
  const int2 qrange = sv_query_range(k0, BLOCK_C, diag, nq, nk, window_left, window_right, BLOCK_R);
  const int istart = qrange.x, iend = qrange.y;
  /* One flat loop over (query head of the group, query tile), so that the next
   * pair's Q and dO can be fetched ahead across the head boundary. */
  stage_t qreg[TILE_REGS(BLOCK_R)], oreg[TILE_REGS(BLOCK_R)];
#if BWD_AHEAD
  if (istart < iend) {
    TILE_FETCH(qreg, q, bb, sb.q_row, istart, nq, hk * group, BLOCK_R)
    TILE_FETCH(oreg, dout, bb, sb.q_row, istart, nq, hk * group, BLOCK_R)
  }
#endif
  for (int g = 0, i0 = istart; g < group && istart < iend;) {
    const int h = hk * group + g;
    int i0n = i0 + BLOCK_R, gn = g; /* the pair after this one */
    if (i0n >= iend) {
      i0n = istart;
      gn++;
    }
    {
      const float slope_log2 = ALIBI ? alibi[h] * LOG2E : 0.0f;
#if MASK
      __global const uint *mrow = mask + b * mask_bs + h * mask_hs;
      /* 1: some bits set, 3: all set; a tile with none is skipped (uniform). */
      const int mcls = mask_tile(mrow, mask_words, mask_bq, mask_bk, i0, min(i0 + BLOCK_R, nq) - 1, k0,
                                 min(k0 + BLOCK_C, nk) - 1);
      if (!(mcls & 1)) {
        g = gn;
        i0 = i0n;
        continue;
      }
#endif
      /* The tile's global reads are issued before the barrier (they only fill
       * registers), so that they are in flight while the work-group drains. */
#if !BWD_AHEAD
      TILE_FETCH(qreg, q, bb, sb.q_row, i0, nq, h, BLOCK_R)
      TILE_FETCH(oreg, dout, bb, sb.q_row, i0, nq, h, BLOCK_R)
#endif
      float lreg[ROW_REGS], dreg[ROW_REGS];
      for (int u = 0; u < ROW_REGS; u++) {
        const int r = tid + u * NTHREADS, in = r < BLOCK_R && i0 + r < nq;
        lreg[u] = in ? lse[lse_off + bb * lse_sb + (long)(sb.q_row + i0 + r) * lse_sn + (long)h * lse_sh] : -INFINITY;
        dreg[u] = in ? dsum[((long)b * heads_q + h) * padded_q + i0 + r] : 0.0f;
      }
      barrier(CLK_LOCAL_MEM_FENCE); /* previous tile consumed */
      TILE_PUT(Qs, qreg, BLOCK_R)
      TILE_PUT(dOs, oreg, BLOCK_R)
#if BWD_AHEAD
      if (gn < group) { /* arrives while this pair is computed */
        TILE_FETCH(qreg, q, bb, sb.q_row, i0n, nq, hk * group + gn, BLOCK_R)
        TILE_FETCH(oreg, dout, bb, sb.q_row, i0n, nq, hk * group + gn, BLOCK_R)
      }
#endif
      for (int u = 0; u < ROW_REGS; u++) {
        const int r = tid + u * NTHREADS;
        if (r < BLOCK_R) {
          Ls[r] = lreg[u] * LOG2E;
          Ds[r] = dreg[u];
        }
      }
      barrier(CLK_LOCAL_MEM_FENCE);

      {
#if BWD_SPLIT
        /* One product per half: K Q^T or V dO^T. Without BWD_SHFL the second
         * half leaves dP^T in dSs for the first, which holds S, to turn into P
         * and dS. */
        float s[A_TM][A_TN];
        __local const float4 *xa = (__local const float4 *)(arole ? Vs : Ks);
        __local const float4 *xb = (__local const float4 *)(arole ? dOs : Qs);
        SPLIT_PRODUCT(s, A_TM, A_TN, xa, ac, A_RT, xb, ar, A_CT)
#if BWD_SHFL
        /* Each lane and its partner (lane ^ 16) hold S and dP of the same
         * entries; each takes half of the queries: the S lane the first A_TN / 2
         * (it receives their dP), the dP lane the rest (it receives their S).
         * Splitting by query keeps every address a per-lane base plus a
         * constant. */
        const int ar2 = ar + arole * (A_TN / 2) * A_CT;
        float theirs[A_TM][A_TN / 2]; /* all shuffles first: their latencies overlap */
        UNROLL_FULL
        for (int i = 0; i < A_TM; i++)
          for (int jj = 0; jj < A_TN / 2; jj++) theirs[i][jj] = nv_shfl_xor16(arole ? s[i][jj] : s[i][jj + A_TN / 2]);
        UNROLL_FULL
        for (int i = 0; i < A_TM; i++)
          for (int jj = 0; jj < A_TN / 2; jj++) {
            const float mine = arole ? s[i][jj + A_TN / 2] : s[i][jj];
            PDS_ENTRY(ac + A_RT * i, ar2 + A_CT * jj, arole ? theirs[i][jj] : mine, arole ? mine : theirs[i][jj])
          }
      }
#else
#if BWD_NBAR
        if (!arole)
          for (int i = 0; i < A_TM; i++)
            for (int jj = 0; jj < A_TN; jj++) PDS_ENTRY_P(ac + A_RT * i, ar + A_CT * jj, s[i][jj])
        barrier(CLK_LOCAL_MEM_FENCE);
        if (arole) {
          /* The same entries as the S half's: each read and rewritten by this
           * work-item only. */
          for (int i = 0; i < A_TM; i++)
            for (int jj = 0; jj < A_TN; jj++) {
              const int c = ac + A_RT * i, r = ar + A_CT * jj;
              const float p = dSs[c * BRP + r];
#if DROPOUT
              dSs[c * BRP + r] = Ps[c * BRP + r] * s[i][jj] - p * Ds[r];
#else
              dSs[c * BRP + r] = p * (s[i][jj] - Ds[r]);
#endif
            }
          /* Only this half reads dS next (dK); the S half goes on to dV. */
          nv_bar_sync1(GRID_N);
        }
#else
        if (arole)
          for (int i = 0; i < A_TM; i++)
            for (int j = 0; j < A_TN; j++) dSs[(ac + A_RT * i) * BRP + ar + A_CT * j] = s[i][j];
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!arole)
          for (int i = 0; i < A_TM; i++)
            for (int jj = 0; jj < A_TN; jj++) {
              const int c = ac + A_RT * i, r = ar + A_CT * jj;
              PDS_ENTRY(c, r, s[i][jj], dSs[c * BRP + r]) /* dSs: read and rewritten by this work-item only */
            }
#endif
      }
#endif
#else
        float s[A_TM][A_TN], dp[A_TM][A_TN];
        for (int i = 0; i < A_TM; i++)
          for (int j = 0; j < A_TN; j++) s[i][j] = dp[i][j] = 0.0f;
        UNROLL_FULL
        for (int x = 0; x < D4; x++) {
          float4 kq[A_TM], vq[A_TM];
          for (int i = 0; i < A_TM; i++) {
            kq[i] = ((__local float4 *)Ks)[(ac + A_RT * i) * LDA4 + x];
            vq[i] = ((__local float4 *)Vs)[(ac + A_RT * i) * LDA4 + x];
          }
          for (int j = 0; j < A_TN; j++) {
            const float4 qq = ((__local float4 *)Qs)[(ar + A_CT * j) * LDA4 + x];
            const float4 oq = ((__local float4 *)dOs)[(ar + A_CT * j) * LDA4 + x];
            for (int i = 0; i < A_TM; i++) {
              s[i][j] = dot4(kq[i], qq, s[i][j]);
              dp[i][j] = dot4(vq[i], oq, dp[i][j]);
            }
          }
        }
        for (int i = 0; i < A_TM; i++)
          for (int jj = 0; jj < A_TN; jj++) PDS_ENTRY(ac + A_RT * i, ar + A_CT * jj, s[i][jj], dp[i][jj])
      }
#endif
#if !BWD_NBAR
      barrier(CLK_LOCAL_MEM_FENCE);
#endif

      /* Rows past nq hold P = dS = 0 and zero Q / dO rows: they add nothing, and
       * a fixed trip count lets the compiler unroll. */
#if BWD_SPLIT
      if (b_active) {
        __local const float4 *sv = (__local const float4 *)(role ? dSs : Ps);
        __local const float4 *xv = (__local const float4 *)(role ? Qs : dOs);
        for (int r4 = 0; r4 < BLOCK_R / 4; r4++) {
          float4 pv[B_TM];
          for (int i = 0; i < B_TM; i++) pv[i] = sv[(bc + B_RT * i) * (BRP / 4) + r4];
          for (int rr = 0; rr < 4; rr++) {
            const int r = 4 * r4 + rr;
            float4 oq[B_TD / 4];
            for (int u = 0; u < B_TD / 4; u++) oq[u] = xv[r * LDA4 + bx + B_CT * u];
            for (int i = 0; i < B_TM; i++) {
              const float pe = rr == 0 ? pv[i].x : rr == 1 ? pv[i].y : rr == 2 ? pv[i].z : pv[i].w;
              for (int u = 0; u < B_TD / 4; u++) acc[i][u] = mad((float4)(pe), oq[u], acc[i][u]);
            }
          }
        }
      }
#else
      if (b_active) {
        for (int r4 = 0; r4 < BLOCK_R / 4; r4++) {
          float4 pv[B_TM], dsv[B_TM];
          for (int i = 0; i < B_TM; i++) {
            pv[i] = ((__local float4 *)Ps)[(bc + B_RT * i) * (BRP / 4) + r4];
            dsv[i] = ((__local float4 *)dSs)[(bc + B_RT * i) * (BRP / 4) + r4];
          }
          for (int rr = 0; rr < 4; rr++) {
            const int r = 4 * r4 + rr;
            float4 oq[B_TD / 4], qq[B_TD / 4];
            for (int u = 0; u < B_TD / 4; u++) {
              oq[u] = ((__local float4 *)dOs)[r * LDA4 + bx + B_CT * u];
              qq[u] = ((__local float4 *)Qs)[r * LDA4 + bx + B_CT * u];
            }
            for (int i = 0; i < B_TM; i++) {
              const float pe = rr == 0 ? pv[i].x : rr == 1 ? pv[i].y : rr == 2 ? pv[i].z : pv[i].w;
              const float de = rr == 0 ? dsv[i].x : rr == 1 ? dsv[i].y : rr == 2 ? dsv[i].z : dsv[i].w;
              for (int u = 0; u < B_TD / 4; u++) {
                dv_acc[i][u] = mad((float4)(pe), oq[u], dv_acc[i][u]);
                dk_acc[i][u] = mad((float4)(de), qq[u], dk_acc[i][u]);
              }
            }
          }
        }
      }
#endif
#if ATOMIC_DQ
#if BWD_NBAR
      barrier(CLK_LOCAL_MEM_FENCE); /* every dS written */
#endif
      /* dQ_tile += scale * dS K over this work-group's keys, then one atomic add
       * per element and work-group. The work-items take bwd_dq's dQ grid (QB_*):
       * QB_TM rows by QB_TD columns each. Keys past nk have dS = 0 and zero K
       * rows, so the trip count is fixed. */
      if (tid < DQA_RT * DQA_CT) {
        float4 acc[QB_TM][QB_TD / 4];
        for (int i = 0; i < QB_TM; i++)
          for (int u = 0; u < QB_TD / 4; u++) acc[i][u] = (float4)(0.0f);
        UNROLL_FULL
        for (int c = 0; c < BLOCK_C; c++) {
          float4 kq[QB_TD / 4];
          for (int u = 0; u < QB_TD / 4; u++) kq[u] = ((__local float4 *)Ks)[c * LDA4 + dqx + DQA_CT * u];
#if QB_TM % 4 == 0
          for (int i4 = 0; i4 < QB_TM / 4; i4++) {
            const float4 d4 = ((__local float4 *)dSs)[c * (BRP / 4) + (QB_TM / 4) * dqr + i4];
            for (int u = 0; u < QB_TD / 4; u++) {
              acc[4 * i4][u] = mad((float4)(d4.x), kq[u], acc[4 * i4][u]);
              acc[4 * i4 + 1][u] = mad((float4)(d4.y), kq[u], acc[4 * i4 + 1][u]);
              acc[4 * i4 + 2][u] = mad((float4)(d4.z), kq[u], acc[4 * i4 + 2][u]);
              acc[4 * i4 + 3][u] = mad((float4)(d4.w), kq[u], acc[4 * i4 + 3][u]);
            }
          }
#else
          for (int i = 0; i < QB_TM; i++) {
            const float de = dSs[c * BRP + QB_TM * dqr + i];
            for (int u = 0; u < QB_TD / 4; u++) acc[i][u] = mad((float4)(de), kq[u], acc[i][u]);
          }
#endif
        }
        for (int i = 0; i < QB_TM; i++) {
          const int r = QB_TM * dqr + i;
          if (i0 + r >= nq) continue;
          __global float *dst = dq_acc + (((long)b * heads_q + h) * padded_q + i0 + r) * HEAD_DIM + 4 * dqx;
          for (int u = 0; u < QB_TD / 4; u++)
            if (DM == HEAD_DIM || 4 * (dqx + DQA_CT * u) < HEAD_DIM) ATOMIC_ADD4(dst + 4 * DQA_CT * u, acc[i][u] * scale);
        }
      }
#endif
    }
    g = gn;
    i0 = i0n;
  }
#if BWD_SPLIT
  if (b_active) {
    __global store_t *dst = role ? dk : dv;
    const float mul = role ? scale : 1.0f;
    const int cols = role ? HEAD_DIM : HEAD_DIM_V;
    for (int i = 0; i < B_TM; i++) {
      const int c = bc + B_RT * i;
      if (k0 + c >= nk) continue;
      const long pr = role ? ROWPTR(dk, bb, sb.k_row + k0 + c, hk) : ROWPTR(dv, bb, sb.k_row + k0 + c, hk);
      for (int u = 0; u < B_TD / 4; u++) {
        const int x = 4 * (bx + B_CT * u);
        const float4 a = acc[i][u] * mul;
        if (x < cols) STORE_EACH4(dst, pr + x, a);
      }
    }
  }
#else
  if (b_active) {
    for (int i = 0; i < B_TM; i++) {
      const int c = bc + B_RT * i;
      if (k0 + c >= nk) continue;
      const long pk = ROWPTR(dk, bb, sb.k_row + k0 + c, hk), pv = ROWPTR(dv, bb, sb.k_row + k0 + c, hk);
      for (int u = 0; u < B_TD / 4; u++) {
        const int x = 4 * (bx + B_CT * u);
        const float4 a = dk_acc[i][u] * scale, w = dv_acc[i][u];
        if (DM == HEAD_DIM || x < HEAD_DIM) STORE_EACH4(dk, pk + x, a);
        if (DM == HEAD_DIM_V || x < HEAD_DIM_V) STORE_EACH4(dv, pv + x, w);
      }
    }
  }
#endif
}

/*
 * Deterministic dQ. One work-group owns BLOCK_R query rows; Q and dO stay in
 * local memory and dQ in registers while K/V tiles of BLOCK_C keys stream by:
 *   A: S = Q K^T and dP = dO V^T, grid (BLOCK_R / QA_TM) x (BLOCK_C / QA_TN),
 *      then dS into local memory;
 *   B: dQ += dS K, grid (BLOCK_R / QB_TM) x (DM / QB_TD).
 * Global (qblocks * NTHREADS, heads_q, seqs), local NTHREADS.
 */
__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void bwd_dq(
    CTENSOR(q), CTENSOR(k), CTENSOR(v), CTENSOR(dout), TENSOR(dq),
    __global const float *lse, long lse_off, long lse_sb, long lse_sn, long lse_sh,
    __global const float *dsum, int padded_q, int padded_k, int heads_q, int group, float scale,
    __global const int *cu_q, __global const int *cu_k, int total_q, int total_k, ulong seed, ulong offset,
    uint threshold, float keep_scale, int window_left, int window_right, __global const float *alibi,
    float softcap_in, float softcap_log2 MASK_PARAMS) {
  __local float Ks[BLOCK_C * LDA] __attribute__((aligned(16)));
  __local float Vs[BLOCK_C * LDA] __attribute__((aligned(16)));
  __local float Qs[BLOCK_R * LDA] __attribute__((aligned(16)));
  __local float dOs[BLOCK_R * LDA] __attribute__((aligned(16)));
  __local float dSs[BLOCK_R * BCP] __attribute__((aligned(16))); /* dS, [query][key] */
  __local float Ls[BLOCK_R];
  __local float Ds[BLOCK_R];

  const int tid = get_local_id(0);
  const int i0 = get_group_id(0) * BLOCK_R;
  const int h = get_group_id(1), b = get_group_id(2);
  const int hk = h / group;
  const fcl_seq sb = fcl_seq_bounds(cu_q, cu_k, b, padded_q, padded_k, total_q, total_k);
  const int nq = sb.nq, nk = sb.nk;
  if (i0 >= nq) return;
  const long bb = sb.bb;
  const int diag = sb.diag;
  const float scale_log2 = scale * LOG2E;

  LOAD_TILE(Qs, q, bb, sb.q_row, i0, nq, h, BLOCK_R)
  LOAD_TILE(dOs, dout, bb, sb.q_row, i0, nq, h, BLOCK_R)
  for (int r = tid; r < BLOCK_R; r += NTHREADS) {
    const int in = i0 + r < nq;
    const float l = in ? lse[lse_off + bb * lse_sb + (long)(sb.q_row + i0 + r) * lse_sn + (long)h * lse_sh] : -INFINITY;
    Ls[r] = l * LOG2E;
    Ds[r] = in ? dsum[((long)b * heads_q + h) * padded_q + i0 + r] : 0.0f;
  }

#define QA_CT (BLOCK_C / QA_TN)
#define QA_RT (BLOCK_R / QA_TM)
#if QA_WK && (32 % QA_WK || QA_CT % QA_WK || QA_RT % (32 / QA_WK) || GRID_N % 32)
#error "QA_WK must divide 32 and QA_CT, and 32 / QA_WK must divide QA_RT"
#endif
#if BWD_SPLIT
  /* role 0: S, role 1: dP (phase A only; phase B uses every work-item). */
  const int role = tid >= GRID_N, rt = tid - role * GRID_N;
#else
  const int rt = tid;
#endif
  const int ar = GRID_ROW(rt, QA_WK, QA_CT), ac = GRID_COL(rt, QA_WK, QA_CT);
#define QB_CT (DM / QB_TD)
#define QB_RT (BLOCK_R / QB_TM)
#if QB_WX && (32 % QB_WX || QB_CT % QB_WX || QB_RT % (32 / QB_WX) || QB_RT * QB_CT != NTHREADS)
#error "QB_WX must divide 32 and QB_CT, 32 / QB_WX must divide QB_RT, and the grid must use every work-item"
#endif
  const int br = GRID_ROW(tid, QB_WX, QB_CT), bx = GRID_COL(tid, QB_WX, QB_CT);
  const int b_active = tid < QB_RT * QB_CT;

  float4 dq_acc[QB_TM][QB_TD / 4];
  for (int i = 0; i < QB_TM; i++)
    for (int u = 0; u < QB_TD / 4; u++) dq_acc[i][u] = (float4)(0.0f);

  /* Rows past nq see nothing: the last real row bounds the window's right edge. */
  const int2 keys = sv_key_range(i0, min(BLOCK_R, nq - i0), diag, nk, window_left, window_right, BLOCK_C);
  const int kstart = keys.x, kend = keys.y;
  const float slope_log2 = ALIBI ? alibi[h] * LOG2E : 0.0f;
#if MASK
  __global const uint *mrow = mask + b * mask_bs + h * mask_hs;
#endif
  stage_t kreg[TILE_REGS(BLOCK_C)], vreg[TILE_REGS(BLOCK_C)];
#if BWD_AHEAD
  if (kstart < kend) {
    TILE_FETCH(kreg, k, bb, sb.k_row, kstart, nk, hk, BLOCK_C)
    TILE_FETCH(vreg, v, bb, sb.k_row, kstart, nk, hk, BLOCK_C)
  }
#endif
  for (int k0 = kstart; k0 < kend; k0 += BLOCK_C) {
#if MASK
    /* 1: some bits set, 3: all set; a tile with none is skipped (uniform). */
    const int mcls = mask_tile(mrow, mask_words, mask_bq, mask_bk, i0, min(i0 + BLOCK_R, nq) - 1, k0,
                               min(k0 + BLOCK_C, nk) - 1);
    if (!(mcls & 1)) continue;
#endif
#if !BWD_AHEAD /* before the barrier: registers only (see bwd_dkdv) */
    TILE_FETCH(kreg, k, bb, sb.k_row, k0, nk, hk, BLOCK_C)
    TILE_FETCH(vreg, v, bb, sb.k_row, k0, nk, hk, BLOCK_C)
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    TILE_PUT(Ks, kreg, BLOCK_C)
    TILE_PUT(Vs, vreg, BLOCK_C)
#if BWD_AHEAD
    if (k0 + BLOCK_C < kend) { /* arrives while this tile is computed */
      TILE_FETCH(kreg, k, bb, sb.k_row, k0 + BLOCK_C, nk, hk, BLOCK_C)
      TILE_FETCH(vreg, v, bb, sb.k_row, k0 + BLOCK_C, nk, hk, BLOCK_C)
    }
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    {
#if BWD_SPLIT
      /* One product per half, as in bwd_dkdv: Q K^T or dO V^T. */
      float s[QA_TM][QA_TN];
      __local const float4 *xa = (__local const float4 *)(role ? dOs : Qs);
      __local const float4 *xb = (__local const float4 *)(role ? Vs : Ks);
      SPLIT_PRODUCT(s, QA_TM, QA_TN, xa, ar, QA_RT, xb, ac, QA_CT)
      if (role)
        for (int i = 0; i < QA_TM; i++)
          for (int j = 0; j < QA_TN; j++) dSs[(ar + QA_RT * i) * BCP + ac + QA_CT * j] = s[i][j];
      barrier(CLK_LOCAL_MEM_FENCE);
      if (!role)
#else
      float s[QA_TM][QA_TN], dp[QA_TM][QA_TN];
      for (int i = 0; i < QA_TM; i++)
        for (int j = 0; j < QA_TN; j++) s[i][j] = dp[i][j] = 0.0f;
      UNROLL_FULL
      for (int x = 0; x < D4; x++) {
        float4 qq[QA_TM], oq[QA_TM];
        for (int i = 0; i < QA_TM; i++) {
          qq[i] = ((__local float4 *)Qs)[(ar + QA_RT * i) * LDA4 + x];
          oq[i] = ((__local float4 *)dOs)[(ar + QA_RT * i) * LDA4 + x];
        }
        for (int j = 0; j < QA_TN; j++) {
          const float4 kq = ((__local float4 *)Ks)[(ac + QA_CT * j) * LDA4 + x];
          const float4 vq = ((__local float4 *)Vs)[(ac + QA_CT * j) * LDA4 + x];
          for (int i = 0; i < QA_TM; i++) {
            s[i][j] = dot4(qq[i], kq, s[i][j]);
            dp[i][j] = dot4(oq[i], vq, dp[i][j]);
          }
        }
      }
#endif
      for (int i = 0; i < QA_TM; i++) {
        const int r = ar + QA_RT * i, iq = i0 + r;
        const float lrow = Ls[r];
        for (int jj = 0; jj < QA_TN; jj++) {
          const int c = ac + QA_CT * jj, jk = k0 + c;
          int visible = iq < nq && lrow != -INFINITY && sv_visible(iq, jk, nk, diag, window_left, window_right);
#if MASK
          if (visible && !(mcls & 2)) visible = mask_ok(mrow, mask_words, mask_bq, mask_bk, iq, jk);
#endif
          float t;
          const float sc =
              sv_logit(s[i][jj], scale_log2, softcap_in, softcap_log2, slope_log2, abs(jk - (iq + diag)), &t);
          const float p = visible ? exp2(sc - lrow) : 0.0f;
#if BWD_SPLIT
          float dpv = dSs[r * BCP + c]; /* dP, this entry is this work-item's alone */
#else
          float dpv = dp[i][jj];
#endif
#if DROPOUT
          dpv = dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)iq, (uint)jk, threshold) ? dpv * keep_scale
                                                                                                  : 0.0f;
#endif
          dSs[r * BCP + c] = p * (dpv - Ds[r]) * sv_logit_grad(t);
        }
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    /* Keys past kend hold dS = 0 and zero K rows: a fixed trip count is safe. */
    if (b_active) {
      for (int c4 = 0; c4 < BLOCK_C / 4; c4++) {
        float4 dsv[QB_TM];
        for (int i = 0; i < QB_TM; i++) dsv[i] = ((__local float4 *)dSs)[(br + QB_RT * i) * (BCP / 4) + c4];
        for (int cc = 0; cc < 4; cc++) {
          const int c = 4 * c4 + cc;
          float4 kq[QB_TD / 4];
          for (int u = 0; u < QB_TD / 4; u++) kq[u] = ((__local float4 *)Ks)[c * LDA4 + bx + QB_CT * u];
          for (int i = 0; i < QB_TM; i++) {
            const float de = cc == 0 ? dsv[i].x : cc == 1 ? dsv[i].y : cc == 2 ? dsv[i].z : dsv[i].w;
            for (int u = 0; u < QB_TD / 4; u++) dq_acc[i][u] = mad((float4)(de), kq[u], dq_acc[i][u]);
          }
        }
      }
    }
  }
  if (b_active) {
    for (int i = 0; i < QB_TM; i++) {
      const int r = br + QB_RT * i;
      if (i0 + r >= nq) continue;
      const long po = ROWPTR(dq, bb, sb.q_row + i0 + r, h);
      for (int u = 0; u < QB_TD / 4; u++) {
        const int x = 4 * (bx + QB_CT * u);
        const float4 a = dq_acc[i][u] * scale;
        if (DM == HEAD_DIM || x < HEAD_DIM) STORE_EACH4(dq, po + x, a);
      }
    }
  }
}

/* Global (HEAD_DIM / 8, padded_q, seqs * heads_q): eight elements per
 * work-item. The conversion is memory-bound. One element per work-item, and
 * four with per-element 2-byte stores, stayed far below the copy bandwidth on
 * the H100 (BENCHMARKS.md, "Atomic-mode dQ conversion"): the stores, not the
 * arithmetic, set its speed. Hence 16-byte stores where DQ_VEC allows them. */
__kernel void bwd_dq_store(__global const float *dq_acc, TENSOR(dq), int padded_q, int heads_q,
                           __global const int *cu_q, int total_q, int splits) {
  const int x = 8 * get_global_id(0), i = get_global_id(1), bh = get_global_id(2);
  const int b = bh / heads_q, h = bh - b * heads_q;
  const int2 sq = fcl_seq_rows(cu_q, b, padded_q, total_q);
  if (i >= sq.y) return;
  const long bb = VARLEN ? 0 : b;
  /* The splits (one unless the deterministic tensor-core dQ wrote several) are
   * added in a fixed order, so the result does not depend on timing. */
  const long split = (long)get_global_size(2) * padded_q * HEAD_DIM;
  __global const float *src = dq_acc + ((long)bh * padded_q + i) * HEAD_DIM + x;
  float8 a = vload8(0, src);
  for (int sp = 1; sp < splits; sp++) a += vload8(0, src + sp * split);
  const long di = ROWPTR(dq, bb, sq.x + i, h) + x;
#if DQ_VEC && DTYPE == 0
  /* Two 16-byte stores: the host guarantees 16-byte alignment, not 32. */
  *(__global float4 *)(dq + di) = a.lo;
  *(__global float4 *)(dq + di + 4) = a.hi;
#elif DQ_VEC && DTYPE == 1
  ushort8 t; /* fp16 bits without cl_khr_fp16: convert into private memory */
  vstore_half8_rte(a, 0, (__private half *)&t);
  *(__global ushort8 *)(dq + di) = t;
#elif DQ_VEC
  *(__global ushort8 *)(dq + di) =
      (ushort8)(fcl_bf16x4_from_float4(a.lo), fcl_bf16x4_from_float4(a.hi));
#else
  STORE(dq, di, a.s0);
  STORE(dq, di + 1, a.s1);
  STORE(dq, di + 2, a.s2);
  STORE(dq, di + 3, a.s3);
  STORE(dq, di + 4, a.s4);
  STORE(dq, di + 5, a.s5);
  STORE(dq, di + 6, a.s6);
  STORE(dq, di + 7, a.s7);
#endif
}
