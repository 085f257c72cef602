/*
 * flash_fwd_mma.cl: FlashAttention-2 forward on NVIDIA tensor cores through
 * inline PTX (mma.sync m16n8k16, ldmatrix, cp.async, shfl.sync).
 *
 * The PTX helpers (cp_async16, LDSM_*, MMA, ...) come from mma_ptx.cl and the
 * masking and score-variant rules from score_variant.cl (with mma_scores.cl's
 * tanh), which the host compiles
 * first in the same program (src/nvidia/mma_forward.c, fcl_mma_sources: with philox.cl,
 * mask.cl and mask_mma.cl in between where dropout or a mask needs them; the
 * probe kernels need only mma_ptx.cl). Everything that is PTX sits
 * behind `#if USE_PTX`; the host sets USE_PTX=1 only
 * on NVIDIA devices of compute capability >= 8.0 whose compiler passed the
 * probe kernel below. With USE_PTX=0 the file is plain OpenCL C 1.2 and its
 * kernels have empty bodies (the file still builds on any device; the host never
 * launches them there).
 *
 * Layout of the work: one work-group of NWARPS warps computes BLOCK_R =
 * NWARPS * 16 * M_TILES query rows of one (sequence, query head); each warp owns
 * 16 * M_TILES consecutive rows. The Q tile is staged once through local memory
 * and kept in registers as mma A fragments. K and V tiles of BLOCK_C keys stream
 * through local memory with cp.async in the FlashAttention-2 order: the V tile
 * of step j arrives while S = Q K^T is computed, the K tile of step j + 1 while
 * O += P V is computed. S stays in the mma accumulator fragments, where the
 * online softmax (row max and sum reduced over the four lanes of a quad with
 * shfl.sync, exp2 via ex2.approx) turns it into P, which is repacked in
 * registers as the A operand of P V. O accumulates in fp32.
 *
 * Local memory rows are 16-byte chunks, swizzled: chunk c of row r sits at
 * c ^ (r & 7), so that ldmatrix (8 rows, same logical chunk) is conflict-free.
 *
 * Scores stay raw in the accumulator; with scale_log2 = scale * log2(e) > 0 the
 * row max of raw scores is the max of scaled ones, and p = exp2(s * scale_log2 -
 * m * scale_log2) is one fma + ex2. LSE is written in natural log. Keys past the
 * end of the sequence and causally hidden keys are masked with -inf; tiles past
 * the causal diagonal are neither loaded (work-group) nor computed (warp).
 *
 * Score variants (the portable forward's, same rules): with SOFTCAP or ALIBI the
 * scores are turned into log2 units right after Q K^T (the softcap's tanh and
 * ALiBi's distance term are not a positive scaling, so the raw-max shortcut does
 * not apply) and the softmax runs with a unit scale. A sliding window, like
 * causal, narrows the key range of the work-group (loads) and of each warp
 * (mma). With an attention mask, key tiles whose bits are all 0 for the
 * work-group's rows are not loaded, those all 0 for a warp's rows not computed,
 * and those all 1 skip the per-score test.
 *
 * Requirements (checked by the host, src/nvidia/mma_forward.c): fp16 or bf16 data,
 * head_dim stride 1, element offsets and (batch, seq, head) strides multiples of
 * 8 elements (16-byte aligned rows for cp.async), scale > 0.
 *
 * Parameters (-D):
 *   USE_PTX      1: compile the tensor-core kernels; 0: empty bodies, never launched
 *   PROBE_ONLY   1: only the mma_probe kernel
 *   DTYPE        1 = fp16, 2 = bf16 (the mma input type; accumulation is fp32)
 *   HEAD_DIM     head dimension, a multiple of 8 up to 256 (D16 below)
 *   BLOCK_C      keys per tile, multiple of 16
 *   NWARPS       warps per work-group
 *   M_TILES      16-row mma tiles per warp
 *   Q_IN_SMEM    1: Q stays in its own local buffer and its fragments are
 *                re-read with ldmatrix at every k-step (fewer registers, more
 *                local memory); 0: Q fragments live in registers
 *   KV_STAGES    1: one K and one V buffer, loaded in the FlashAttention-2 order
 *                above (two barriers per key tile); 2: two K | V stages, the next
 *                tile's K and V requested as soon as the current tile is in (one
 *                barrier per tile; twice the K/V local memory)
 *   CAUSAL       1: key j is visible to query i iff j <= i + (Nk - Nq)
 *   VARLEN       1: sequence bounds come from cu_seqlens_q/k
 *   WINDOW       1: key j is visible to query i iff i + diag - window_left <= j <=
 *                i + diag + window_right (diag = Nk - Nq; causal folded into
 *                window_right by the host: build with CAUSAL=0)
 *   ALIBI        1: score -= alibi[h] * |j - (i + diag)| (after the softcap)
 *   SOFTCAP      1: score = c * tanh(scale * q.k / c) (softcap_in = scale / c,
 *                softcap_log2 = c * log2(e))
 *   DROPOUT      1: P V uses P * Z / (1 - p) with the forward's dropout mask Z
 *                (philox.cl compiled first in the same program; l sums the
 *                undropped P, as in flash_fwd.cl)
 *   MASK         1: block mask, 2: bit mask (flashcl_mask_kind; mask.cl and
 *                mask_mma.cl compiled first in the same program): a 0 bit hides
 *                key j from query i
 *   PAGED_KV     1: k and v are page pools (num_pages, page_size, Hkv, d), as in
 *                flash_fwd.cl: sequence b's key j is slot j % page_size of page
 *                block_table[b * max_pages + j / page_size] (clamped to
 *                [0, num_pages)), its key count kv_lens[b] clamped to [0, seqlen_k];
 *                trailing arguments block_table, page_size, max_pages, num_pages,
 *                kv_lens. Each K/V row's cp.async address goes through the block
 *                table. With VARLEN only the queries are packed (cu_k unused)
 *   PAGED_EARLY  1 (the default with PAGED_KV and KV_STAGES = 2): the next tile's
 *                block-table entries are read right after the barrier, into
 *                registers, and its cp.async requests go out after S = Q K^T, so
 *                the table read's latency hides behind the mma (faster than
 *                reading the table in front of each request, 0; BENCHMARKS.md)
 *   K_DTYPE, V_DTYPE, K_SCALE, V_SCALE  a quantized page pool (kv_quant.cl's
 *                formats and scale layouts, joined in front by the host; a
 *                plain side keeps DTYPE): PAGED_KV only, see "Quantized pools"
 *   PAGE_SHIFT   log2 of the page size when it is a power of two (the page_size
 *                argument must then equal it): a shift instead of a division
 *                per row; -1: any page size
 *   RESCALE_THRESHOLD  float, log2 units: the running max (and with it O and l)
 *                is only moved when a row's max grows by more than this; 0.0f
 *                moves it on every growth. Bounds p by 2^RESCALE_THRESHOLD.
 *
 * Quantized pools (K_DTYPE or V_DTYPE an int8 / fp8 / int4 format of kv_quant.cl):
 * such a side's codes cannot take cp.async, since they must become 16-bit
 * elements on their way to local memory. Each work-item reads its chunks'
 * eight codes (8 bytes, or 4 of int4; with TOKEN or BLOCK32 scales, their scale) into registers
 * with plain loads as soon as the tile may be requested, and writes them to
 * the chunk's place in the swizzled tile just before the barrier that
 * publishes the tile (with KV_STAGES = 2: after the current tile's math, whose
 * time hides the loads' latency), through kvq_ptx.cl's conversions. The
 * tensor cores then read the tile as from a 16-bit pool. With a HEAD or
 * TENSOR scale the tile holds the codes themselves (exact in fp16 and bf16)
 * and the scale multiplies the scores (K) or O (V) in fp32; with TOKEN or
 * BLOCK32 scales it holds code * scale, in fp32 rounded once to DTYPE (in bf16
 * that rounding, 2^-9, shows in the LSE). Rows past the keys and padding
 * chunks read as zeros.
 *
 * With USE_PTX=1 the host joins seq_bounds.cl in front too (the kernel, which
 * uses it, exists only then; mma_ptx.cl, mma_scores.cl and score_variant.cl likewise).
 */
#ifndef USE_PTX
#define USE_PTX 0
#endif
#ifndef PROBE_ONLY
#define PROBE_ONLY 0
#endif
#ifndef DTYPE
#define DTYPE 1
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef BLOCK_C
#define BLOCK_C 64
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#ifndef M_TILES
#define M_TILES 1
#endif
#ifndef Q_IN_SMEM
#define Q_IN_SMEM 0
#endif
#ifndef KV_STAGES
#define KV_STAGES 1
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
#ifndef MASK
#define MASK 0
#endif
#ifndef DROPOUT
#define DROPOUT 0
#endif
#if DROPOUT && !defined(PHILOX_CL)
#error "DROPOUT needs philox.cl compiled first in the same program"
#endif
#ifndef PAGED_KV
#define PAGED_KV 0
#endif
#ifndef PAGE_SHIFT
#define PAGE_SHIFT -1
#endif
#ifndef K_DTYPE
#define K_DTYPE DTYPE
#endif
#ifndef V_DTYPE
#define V_DTYPE DTYPE
#endif
#ifndef K_SCALE
#define K_SCALE 0
#endif
#ifndef V_SCALE
#define V_SCALE 0
#endif
#define K_Q (K_DTYPE != DTYPE)
#define V_Q (V_DTYPE != DTYPE)
#define KVQ (K_Q || V_Q)
#if KVQ && (!PAGED_KV || !defined(KV_QUANT_CL))
#error "a quantized K/V pool needs PAGED_KV=1 and kv_quant.cl compiled first in the same program"
#endif
#if KVQ && USE_PTX && !defined(KVQ_PTX_CL)
#error "a quantized K/V pool needs kvq_ptx.cl compiled first in the same program"
#endif
/* A side with one scale for its kv head (HEAD, TENSOR) keeps its codes, which
 * int8 and fp8 share exactly with fp16 and bf16; the scale then multiplies
 * K's scores or O in fp32. */
#define K_UNI (K_Q && (K_SCALE == KVQ_SCALE_HEAD || K_SCALE == KVQ_SCALE_TENSOR))
#define V_UNI (V_Q && (V_SCALE == KVQ_SCALE_HEAD || V_SCALE == KVQ_SCALE_TENSOR))
#ifndef PAGED_EARLY
#define PAGED_EARLY PAGED_KV
#endif
#if PAGED_EARLY && !(PAGED_KV && KV_STAGES == 2 && !KVQ)
#undef PAGED_EARLY
#define PAGED_EARLY 0
#endif
#ifndef RESCALE_THRESHOLD
#define RESCALE_THRESHOLD 8.0f
#endif
#if USE_PTX && !PROBE_ONLY && !defined(SCORE_VARIANT_CL)
#error "flash_fwd_mma.cl needs mma_scores.cl and score_variant.cl compiled first in the same program"
#endif
#if USE_PTX && !PROBE_ONLY && !defined(SEQ_BOUNDS_CL)
#error "flash_fwd_mma.cl needs seq_bounds.cl compiled first in the same program"
#endif
#if MASK && USE_PTX && !defined(MASK_MMA_CL)
#error "MASK needs mask.cl and mask_mma.cl compiled first in the same program"
#endif
#define LOG2E 1.4426950408889634f

#define NTHREADS (NWARPS * 32)
#define WARP_ROWS (16 * M_TILES)
#define BLOCK_R (NWARPS * WARP_ROWS)
/* A head dim that is an odd multiple of 8 runs at D16 (the next multiple of 16,
 * mma's k-step): its rows carry one zero-filled chunk in local memory, and
 * O's columns past HEAD_DIM are not stored. */
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
#define KT (D16 / 16)      /* k-steps of Q K^T */
#define NT (BLOCK_C / 8)   /* 8-key n-tiles of S */
#define DT (D16 / 8)       /* 8-column n-tiles of O */
#if Q_IN_SMEM
#define Q_ROWS BLOCK_R /* Q keeps rows [0, BLOCK_R), K/V follow */
#define SMEM_ROWS (BLOCK_R + 2 * KV_STAGES * BLOCK_C)
#else
#define Q_ROWS 0 /* Q is staged through the K/V rows */
#define SMEM_ROWS (2 * KV_STAGES * BLOCK_C > BLOCK_R ? 2 * KV_STAGES * BLOCK_C : BLOCK_R)
#endif

/* The cp.async chunks of a tile (Q: BLOCK_R rows, K/V: BLOCK_C rows) are spread over
 * the work-items: element e = tid + i * NTHREADS is chunk e % CH of row e / CH.
 * Where CH divides NTHREADS (head dims 16, 32, 64, 128, 256) that is the fixed
 * column chunk lc of rows lr + i * LSTEP, and the thread's global pointers carry
 * the column and the first row. */
#define LREG (NTHREADS % CH == 0)
#define TILE_PER(rows) (((rows) * CH + NTHREADS - 1) / NTHREADS)
#define TILE_IN(rows, r) (((rows) * CH) % NTHREADS == 0 || (r) < (rows))
#define LPER TILE_PER(BLOCK_C)
#if LREG
#define LSTEP (NTHREADS / CH)
#define TILE_ROW(i) (lr + (i) * LSTEP)
#define TILE_COL(i) lc
#define COL0 ((CHUNK_OK(lc) ? lc : 0) * 8) /* in the thread's pointers (the zero chunk: column 0) */
#define COLX(i) 0
#else
#define LSTEP 0
#define TILE_ROW(i) ((tid + (i) * NTHREADS) / CH)
#define TILE_COL(i) ((tid + (i) * NTHREADS) % CH)
#define COL0 0
#define COLX(i) ((CHUNK_OK(TILE_COL(i)) ? TILE_COL(i) : 0) * 8)
#endif

#if HEAD_DIM % 8 || HEAD_DIM > 256 || BLOCK_C % 16
#error "unsupported flash_fwd_mma parameters"
#endif

#if USE_PTX

#ifndef MMA_TYPE
#error "flash_fwd_mma.cl with USE_PTX=1 needs mma_ptx.cl compiled first in the same program"
#endif

/* Compile-and-run probe: one warp, D = A B through cp.async, ldmatrix(.trans)
 * and mma, plus a quad shuffle reduction. a: 16x16 row-major, b: 16x8
 * row-major (k, n), both fp16 (or bf16); d: 128 floats of D (row-major), then
 * 16 row sums. */
__kernel __attribute__((reqd_work_group_size(32, 1, 1))) void mma_probe(__global const ushort *a,
                                                                       __global const ushort *b,
                                                                       __global float *d) {
  __local uint4 sm[48];
  const int lane = get_local_id(0), g = lane >> 2, t = lane & 3;
  const uint base = SADDR(sm);
  cp_async16(base + lane * 16, a + lane * 8, 16);
  if (lane < 16) cp_async16(base + (32 + lane) * 16, b + lane * 8, 16);
  cp_commit();
  cp_wait_all();
  barrier(CLK_LOCAL_MEM_FENCE);
  uint af[4], b0, b1;
  LDSM_X4(af[0], af[1], af[2], af[3], base + ((lane & 15) * 2 + (lane >> 4)) * 16);
  LDSM_X2_T(b0, b1, base + (32 + (lane & 15)) * 16);
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  MMA(c, af, b0, b1);
  d[g * 8 + 2 * t] = c[0];
  d[g * 8 + 2 * t + 1] = c[1];
  d[(g + 8) * 8 + 2 * t] = c[2];
  d[(g + 8) * 8 + 2 * t + 1] = c[3];
  float r0 = c[0] + c[1], r1 = c[2] + c[3];
  r0 += shfl_xor(r0, 1);
  r0 += shfl_xor(r0, 2);
  r1 += shfl_xor(r1, 1);
  r1 += shfl_xor(r1, 2);
  if (t == 0) {
    d[128 + g] = r0;
    d[136 + g] = r1;
  }
}

#if !PROBE_ONLY
#if MASK
#define NEXT_TILE(k0) mask_next_tile(&mw, &mg, (k0), lane)
#else
#define NEXT_TILE(k0) (k0)
#endif

#if PAGED_KV
#define MMA_PAGED_PARAMS                                                                             \
  , __global const int *block_table, int page_size, int max_pages, int num_pages, __global const int *kv_lens
#if PAGE_SHIFT >= 0
#define PAGE_OF(j) ((j) >> PAGE_SHIFT)
#else
#define PAGE_OF(j) ((j) / page_size)
#endif
#else
#define MMA_PAGED_PARAMS
#endif
#if KVQ
#define MMA_KVQ_PARAMS , __global const float *k_scale, __global const float *v_scale
#else
#define MMA_KVQ_PARAMS
#endif

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void flash_fwd_mma(
    __global const ushort *q, long q_off, long q_sb, long q_sn, long q_sh,
    __global const ushort *k, long k_off, long k_sb, long k_sn, long k_sh,
    __global const ushort *v, long v_off, long v_sb, long v_sn, long v_sh,
    __global ushort *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse,
    int seqlen_q, int seqlen_k, int group, float scale_log2,
    __global const int *cu_q, __global const int *cu_k, int total_q, int total_k,
    int window_left, int window_right, __global const float *alibi, float softcap_in, float softcap_log2,
    __global const uint *mask, long mask_bs, long mask_hs, int mask_words, int mask_bq, int mask_bk,
    ulong seed, ulong offset, uint threshold, float keep_scale, __global const float *sinks MMA_PAGED_PARAMS MMA_KVQ_PARAMS) {
  __local uint4 smem[SMEM_ROWS * SWZ_ROW];
  const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  /* Highest query blocks first: under a causal mask they carry the most work. */
  const int q0 = (get_num_groups(0) - 1 - get_group_id(0)) * BLOCK_R;
  const int h = get_group_id(1);
  const int b = get_group_id(2);
  const int hk = h / group;

  /* A paged source takes its key count from kv_lens, read only by work-groups
   * that have queries (below). */
  fcl_seq seq = fcl_seq_bounds(cu_q, cu_k, b, seqlen_q, seqlen_k, total_q, total_k);
  const long bq = seq.bb, row_q = seq.q_row, row_k = seq.k_row;
  if (q0 >= seq.nq) return; /* whole work-group leaves together */

  const long qbase = q_off + bq * q_sb + row_q * q_sn + (long)h * q_sh;
#if PAGED_KV
  __global const int *bt = block_table + (long)b * max_pages;
  seq = fcl_seq_paged_keys(seq, kv_lens, b, seqlen_k);
  const long kbase = k_off + (long)hk * k_sh; /* rows come from the block table (TILE_PAGES) */
  const long vbase = v_off + (long)hk * v_sh;
#else
  const long kbase = k_off + bq * k_sb + row_k * k_sn + (long)hk * k_sh;
  const long vbase = v_off + bq * v_sb + row_k * v_sn + (long)hk * v_sh;
#endif
  const int nq = seq.nq, nk = seq.nk, diag = seq.diag;
  const uint sbase = SADDR(smem);
  const uint kbuf = sbase + Q_ROWS * SWZ_ROW * 16, vbuf = kbuf + BLOCK_C * SWZ_ROW * 16;
  const int lc = tid % CH, lr = tid / CH; /* used where LREG */

  /* ---- Q tile -> local -> registers ---- */
  for (int i = 0; i < TILE_PER(BLOCK_R); i++) {
    const int r = TILE_ROW(i), c = TILE_COL(i);
    if (TILE_IN(BLOCK_R, r)) {
      const int ok = q0 + r < nq && CHUNK_OK(c);
      cp_async16(sbase + SWZ(r, c), q + qbase + (long)(ok ? q0 + r : 0) * q_sn + (CHUNK_OK(c) ? c : 0) * 8,
                 ok ? 16u : 0u);
    }
  }
  cp_commit();
#if !Q_IN_SMEM
  cp_wait_all();
  barrier(CLK_LOCAL_MEM_FENCE);
  uint qf[M_TILES][KT][4];
  #pragma unroll
  for (int mt = 0; mt < M_TILES; mt++)
    #pragma unroll
    for (int ks = 0; ks < KT; ks++) {
      const int r = warp * WARP_ROWS + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      LDSM_X4(qf[mt][ks][0], qf[mt][ks][1], qf[mt][ks][2], qf[mt][ks][3], sbase + SWZ(r, 2 * ks + (lane >> 4)));
    }
  barrier(CLK_LOCAL_MEM_FENCE); /* Q's local copy is dead: K/V may overwrite it */
#endif

  float oacc[M_TILES][DT][4];
  float m_r[M_TILES][2], l_r[M_TILES][2];
  #pragma unroll
  for (int mt = 0; mt < M_TILES; mt++) {
    #pragma unroll
    for (int dt = 0; dt < DT; dt++) oacc[mt][dt][0] = oacc[mt][dt][1] = oacc[mt][dt][2] = oacc[mt][dt][3] = 0.0f;
    m_r[mt][0] = m_r[mt][1] = -INFINITY;
    l_r[mt][0] = l_r[mt][1] = 0.0f;
  }

  const int wrow0 = q0 + warp * WARP_ROWS; /* first query row of this warp */
  /* Keys [kbeg, kend) are needed by the work-group, [wbeg, wend) by this warp. */
  const int2 wg_keys = sv_key_range(q0, BLOCK_R, diag, nk, window_left, window_right, BLOCK_C);
  const int2 w_keys = sv_key_range(wrow0, WARP_ROWS, diag, nk, window_left, window_right, 1);
  const int kbeg = wg_keys.x, kend = wg_keys.y, wbeg = w_keys.x, wend = w_keys.y;
  const float sl2 = SCORE_LOG2 ? 1.0f : scale_log2; /* with SCORE_LOG2 the scores are already scaled */
  const float slope_log2 = ALIBI ? alibi[h] * LOG2E : 0.0f;
#if MASK
  __global const uint *mrow = mask + b * mask_bs + h * mask_hs;
  mask_geom mg;
  mask_win mw;
  mask_init(&mg, &mw, mrow, mask_words, mask_bq, mask_bk, q0, BLOCK_R, wrow0, WARP_ROWS, nq, kend, nk);
#else
  __global const uint *mrow = mask;
  const int wcls = 3;
#endif

  /* Per-thread global pointers of the K/V chunks: column COL0 of key 0 (kp0) and,
   * where LREG, of the thread's first row (kp). */
  __global const ushort *kp0 = k + kbase + COL0, *kp = kp0 + (LREG ? (long)lr * k_sn : 0);
  __global const ushort *vp0 = v + vbase + COL0, *vp = vp0 + (LREG ? (long)lr * v_sn : 0);
  const long kstep = (long)LSTEP * k_sn, vstep = (long)LSTEP * v_sn;

/* Rows past nk are zero-filled (P is 0 there, but 0 * garbage could be NaN); their
 * source address is clamped to key 0, which exists whenever a tile is loaded. */
#if PAGED_KV
/* pg[i] = the page of this thread's row TILE_ROW(i) of the tile at k0 (0 past nk). */
#define TILE_PAGES(pg, k0)                                                                    \
  for (int i = 0; i < LPER; i++) {                                                          \
    const int j = (k0) + TILE_ROW(i);                                                       \
    (pg)[i] = TILE_IN(BLOCK_C, TILE_ROW(i)) && j < nk ? clamp(bt[PAGE_OF(j)], 0, num_pages - 1) : 0; \
  }
/* The tile's rows from the pages pg (TILE_PAGES). */
#define LOAD_TILE_PAGES(buf, ptr0, sb, sn, k0, pg)                                            \
  {                                                                                         \
    for (int i = 0; i < LPER; i++) {                                                        \
      const int r = TILE_ROW(i), j = (k0) + r;                                              \
      const int ok = TILE_IN(BLOCK_C, r) && j < nk && CHUNK_OK(TILE_COL(i));                \
      const long off_ = (long)(pg)[i] * (sb) + (long)(j - PAGE_OF(j) * page_size) * (sn) + COLX(i); \
      if (TILE_IN(BLOCK_C, r)) cp_async16((buf) + SWZ(r, TILE_COL(i)), ok ? (ptr0) + off_ : (ptr0), ok ? 16u : 0u); \
    }                                                                                       \
    cp_commit();                                                                            \
  }
#define LOAD_TILE(buf, ptr, ptr0, sb, sn, step, k0) \
  {                                                 \
    int pg_[LPER];                                  \
    TILE_PAGES(pg_, k0)                             \
    LOAD_TILE_PAGES(buf, ptr0, sb, sn, k0, pg_)     \
  }
#if KVQ
/* A quantized side (see "Quantized pools"): QFETCH reads the codes (cq, 8 per
 * chunk: 8 bytes, or one word of int4 in cq.x) and, unless the side has one
 * scale (uni), their scales (cs) of the tile at k0 into registers; QPUT
 * writes them out in DTYPE: the codes, or code * scale. */
  __local uchar *smb = (__local uchar *)smem;
  const int heads_kv = get_num_groups(1) / group;
#define QFETCH(cq, cs, codes, sb, sn, scl, fmt, kind, uni, k0)                                        \
  for (int i = 0; i < LPER; i++) {                                                                   \
    const int r = TILE_ROW(i), c = TILE_COL(i), j = (k0) + r;                                        \
    const int ok = TILE_IN(BLOCK_C, r) && j < nk && CHUNK_OK(c);                                     \
    const int pi = ok ? PAGE_OF(j) : 0, pg = ok ? clamp(bt[pi], 0, num_pages - 1) : 0;                \
    const long slot = ok ? j - pi * page_size : 0;                                                   \
    __global const uchar *p_ = (codes) + (long)pg * (sb) + slot * (sn);                             \
    (cq)[i] = !ok                  ? (uint2)(0u)                                                      \
              : (fmt) == KVQ_I4 ? (uint2)(*(__global const uint *)(p_ + c * 4), 0u)                  \
                                 : *(__global const uint2 *)(p_ + c * 8);                             \
    if (!(uni))                                                                                      \
      (cs)[i] = ok ? (scl)[kvq_scale_index(kind, (long)pg * page_size + slot, heads_kv, hk, HEAD_DIM, c * 8)] : 0.0f; \
  }
#define QPUT(buf, cq, cs, fmt, uni)                                                                   \
  for (int i = 0; i < LPER; i++) {                                                                   \
    const int r = TILE_ROW(i), c = TILE_COL(i);                                                      \
    if (TILE_IN(BLOCK_C, r)) {                                                                       \
      uint4 h_;                                                                                      \
      const uint2 w_ = (fmt) == KVQ_I4 ? dmq_i4_bytes((cq)[i].x) : (cq)[i];                          \
      if (uni) {                                                                                     \
        h_ = dmq_codes8(w_, fmt);                                                                    \
      } else {                                                                                       \
        const float8 f = dmq_decode8(w_, fmt) * (cs)[i];                                             \
        h_ = (uint4)(pack2(f.s0, f.s1), pack2(f.s2, f.s3), pack2(f.s4, f.s5), pack2(f.s6, f.s7));    \
      }                                                                                              \
      *(__local uint4 *)(smb + ((buf) - sbase) + SWZ(r, c)) = h_;                                    \
    }                                                                                                \
  }
#endif
#if K_Q
  uint2 kcq[LPER];
  float kcs[LPER];
  __global const uchar *kq8 = (__global const uchar *)k + kbase;
  const float k_uni = K_UNI ? k_scale[kvq_scale_index(K_SCALE, 0, heads_kv, hk, HEAD_DIM, 0)] : 1.0f;
#define LOAD_K(buf, k0) QFETCH(kcq, kcs, kq8, k_sb, k_sn, k_scale, K_DTYPE, K_SCALE, K_UNI, k0)
#define PUT_K(buf) QPUT(buf, kcq, kcs, K_DTYPE, K_UNI)
#endif
#if V_Q
  uint2 vcq[LPER];
  float vcs[LPER];
  __global const uchar *vq8 = (__global const uchar *)v + vbase;
  const float v_uni = V_UNI ? v_scale[kvq_scale_index(V_SCALE, 0, heads_kv, hk, HEAD_DIM, 0)] : 1.0f;
#define LOAD_V(buf, k0) QFETCH(vcq, vcs, vq8, v_sb, v_sn, v_scale, V_DTYPE, V_SCALE, V_UNI, k0)
#define PUT_V(buf) QPUT(buf, vcq, vcs, V_DTYPE, V_UNI)
#endif
#else
#define LOAD_TILE(buf, ptr, ptr0, sb, sn, step, k0)                                           \
  {                                                                                         \
    __global const ushort *p_ = (ptr) + (long)(k0) * (sn);                                  \
    for (int i = 0; i < LPER; i++) {                                                        \
      const int r = TILE_ROW(i);                                                            \
      const int ok = TILE_IN(BLOCK_C, r) && (k0) + r < nk && CHUNK_OK(TILE_COL(i));         \
      const long off_ = LREG ? i * (step) : (long)r * (sn) + COLX(i);                       \
      if (TILE_IN(BLOCK_C, r)) cp_async16((buf) + SWZ(r, TILE_COL(i)), ok ? p_ + off_ : (ptr0), ok ? 16u : 0u); \
    }                                                                                       \
    cp_commit();                                                                            \
  }
#endif
/* A plain side: cp.async, nothing to write out. */
#ifndef LOAD_K
#define LOAD_K(buf, k0) LOAD_TILE(buf, kp, kp0, k_sb, k_sn, kstep, k0)
#define PUT_K(buf)
#endif
#ifndef LOAD_V
#define LOAD_V(buf, k0) LOAD_TILE(buf, vp, vp0, v_sb, v_sn, vstep, k0)
#define PUT_V(buf)
#endif

  int k0 = NEXT_TILE(kbeg);
#if KV_STAGES == 2
#define STAGE_BYTES (2 * BLOCK_C * SWZ_ROW * 16) /* K | V of one stage */
  if (k0 < kend) {
    LOAD_K(kbuf, k0)
    LOAD_V(vbuf, k0)
    PUT_K(kbuf)
    PUT_V(vbuf)
  }
  int stage = 0;
#else
  if (k0 < kend) {
    LOAD_K(kbuf, k0)
    PUT_K(kbuf)
  }
#endif

  while (k0 < kend) {
#if MASK
    const int wcls = mask_warp_class(&mw, k0); /* before NEXT_TILE may move the window */
#endif
    const int kn = NEXT_TILE(k0 + BLOCK_C); /* the next tile to load */
    cp_wait_all();
#if KV_STAGES == 2
    barrier(CLK_LOCAL_MEM_FENCE); /* K and V of this tile are in; every warp is done with the other stage */
    const uint kb = kbuf + stage * STAGE_BYTES, vb = kb + BLOCK_C * SWZ_ROW * 16;
    const uint nbuf = kbuf + (stage ^ 1) * STAGE_BYTES;
#if PAGED_EARLY
    /* The next tile's pages: plain loads whose latency the S = Q K^T below hides;
     * its cp.async requests follow the scores. */
    int pgn[LPER];
    TILE_PAGES(pgn, kn)
#else
    if (kn < kend) {
      LOAD_K(nbuf, kn)
      LOAD_V(nbuf + BLOCK_C * SWZ_ROW * 16, kn)
    }
#endif
    stage ^= 1;
#else
    barrier(CLK_LOCAL_MEM_FENCE); /* K ready; every warp is done with the previous V */
    const uint kb = kbuf, vb = vbuf;
    LOAD_V(vbuf, k0)
#endif

    int active = k0 < wend;
#if WINDOW
    active = active && k0 + BLOCK_C > wbeg;
#endif
#if MASK
    active = active && (wcls & 1);
#endif
    uint pf[M_TILES][NT / 2][4];
    if (active) {
      float s[M_TILES][NT][4];
      #pragma unroll
      for (int mt = 0; mt < M_TILES; mt++)
        #pragma unroll
        for (int nt = 0; nt < NT; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
      #pragma unroll
      for (int ks = 0; ks < KT; ks++) {
#if Q_IN_SMEM
        uint qa[M_TILES][4];
        #pragma unroll
        for (int mt = 0; mt < M_TILES; mt++) {
          const int r = warp * WARP_ROWS + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          LDSM_X4(qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], sbase + SWZ(r, 2 * ks + (lane >> 4)));
        }
#define QFRAG(mt, ks) qa[mt]
#else
#define QFRAG(mt, ks) qf[mt][ks]
#endif
        #pragma unroll
        for (int np = 0; np < NT / 2; np++) {
          uint b0, b1, b2, b3;
          const int r = np * 16 + (lane & 7) + (lane >> 4) * 8;
          LDSM_X4(b0, b1, b2, b3, kb + SWZ(r, 2 * ks + ((lane >> 3) & 1)));
          #pragma unroll
          for (int mt = 0; mt < M_TILES; mt++) {
            MMA(s[mt][2 * np], QFRAG(mt, ks), b0, b1);
            MMA(s[mt][2 * np + 1], QFRAG(mt, ks), b2, b3);
          }
        }
      }

#if K_UNI
      /* K held its codes: the scores times its one scale. */
      #pragma unroll
      for (int mt = 0; mt < M_TILES; mt++)
        #pragma unroll
        for (int nt = 0; nt < NT; nt++)
          #pragma unroll
          for (int e = 0; e < 4; e++) s[mt][nt][e] *= k_uni;
#endif
      const int need_mask =
          sv_tile_partial(wrow0, WARP_ROWS, k0, BLOCK_C, diag, nk, window_left, window_right) | !(wcls & 2);
      if (SCORE_LOG2 || need_mask) {
        #pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
          #pragma unroll
          for (int nt = 0; nt < NT; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
              const int col = k0 + nt * 8 + 2 * t + (e & 1);
              const int row = wrow0 + mt * 16 + g + (e >> 1) * 8;
#if SCORE_LOG2
              float th;
              s[mt][nt][e] = sv_logit(s[mt][nt][e], scale_log2, softcap_in, softcap_log2, slope_log2,
                                        abs(col - (row + diag)), &th);
#endif
              if (need_mask && !sv_pair_visible(row, col, nq, nk, diag, window_left, window_right, mrow, wcls,
                                             mask_words, mask_bq, mask_bk))
                s[mt][nt][e] = -INFINITY;
            }
      }

      /* Row maxima of this tile (raw scores), reduced over the quad. */
      float mx[M_TILES][2];
      int grow = 0;
      #pragma unroll
      for (int mt = 0; mt < M_TILES; mt++)
        #pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          float x = m_r[mt][hh];
          #pragma unroll
          for (int nt = 0; nt < NT; nt++) x = fmax(x, fmax(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
          x = fmax(x, shfl_xor(x, 1));
          x = fmax(x, shfl_xor(x, 2));
          mx[mt][hh] = x;
          /* -inf - -inf is NaN and compares false: a row that still sees no key
           * keeps m = -inf. A first visible key gives +inf > threshold. */
          grow |= (x - m_r[mt][hh]) * sl2 > RESCALE_THRESHOLD;
        }
      /* Lazy rescaling: a row's pivot m only moves when its max grew by more
       * than RESCALE_THRESHOLD (log2 units), so p <= 2^RESCALE_THRESHOLD (256:
       * exact in fp16/bf16 up to their usual relative rounding). The result is
       * the same, since l and O share the pivot, and after a row's first
       * visible tile its max seldom grows by 8, so nearly every tile skips the
       * O *= alpha pass (BENCHMARKS.md, "Lazy rescaling"). The vote keeps
       * the skip warp-uniform. */
      if (warp_any(grow)) {
        #pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
          #pragma unroll
          for (int hh = 0; hh < 2; hh++) {
            const float mnew = (mx[mt][hh] - m_r[mt][hh]) * sl2 > RESCALE_THRESHOLD ? mx[mt][hh] : m_r[mt][hh];
            /* A row with no visible key so far keeps m = -inf: alpha is 0 or 1, never NaN. */
            const float alpha = mnew == m_r[mt][hh] ? 1.0f : fast_exp2((m_r[mt][hh] - mnew) * sl2);
            m_r[mt][hh] = mnew;
            l_r[mt][hh] *= alpha;
            #pragma unroll
            for (int dt = 0; dt < DT; dt++) {
              oacc[mt][dt][2 * hh] *= alpha;
              oacc[mt][dt][2 * hh + 1] *= alpha;
            }
          }
      }
      #pragma unroll
      for (int mt = 0; mt < M_TILES; mt++)
        #pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          /* Pivot 0 for a row with m = -inf keeps exp2 at 0, not NaN. */
          const float ms = m_r[mt][hh] == -INFINITY ? 0.0f : m_r[mt][hh] * sl2;
          float ls = 0.0f;
          #pragma unroll
          for (int nt = 0; nt < NT; nt++) {
            const float p0 = fast_exp2(fma(s[mt][nt][2 * hh], sl2, -ms));
            const float p1 = fast_exp2(fma(s[mt][nt][2 * hh + 1], sl2, -ms));
            ls += p0 + p1;
#if DROPOUT
            const int keep = dropout_keep2(seed, offset, (ulong)b * get_num_groups(1) + h,
                                           (uint)(wrow0 + mt * 16 + g + hh * 8), (uint)(k0 + nt * 8 + 2 * t), threshold);
            s[mt][nt][2 * hh] = (keep & 1) ? p0 * keep_scale : 0.0f;
            s[mt][nt][2 * hh + 1] = (keep & 2) ? p1 * keep_scale : 0.0f;
#else
            s[mt][nt][2 * hh] = p0;
            s[mt][nt][2 * hh + 1] = p1;
#endif
          }
          l_r[mt][hh] += ls;
        }
      /* The S accumulators of n-tiles 2j, 2j+1 are the A fragment of keys 16j..16j+15. */
      #pragma unroll
      for (int mt = 0; mt < M_TILES; mt++)
        #pragma unroll
        for (int j = 0; j < NT / 2; j++) {
          pf[mt][j][0] = pack2(s[mt][2 * j][0], s[mt][2 * j][1]);
          pf[mt][j][1] = pack2(s[mt][2 * j][2], s[mt][2 * j][3]);
          pf[mt][j][2] = pack2(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
          pf[mt][j][3] = pack2(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
        }
    }

#if KV_STAGES == 1
    PUT_V(vbuf)
    cp_wait_all();
    barrier(CLK_LOCAL_MEM_FENCE); /* V ready; every warp is done with K */
    if (kn < kend) LOAD_K(kbuf, kn)
#elif PAGED_EARLY
    if (kn < kend) {
      LOAD_TILE_PAGES(nbuf, kp0, k_sb, k_sn, kn, pgn)
      LOAD_TILE_PAGES(nbuf + BLOCK_C * SWZ_ROW * 16, vp0, v_sb, v_sn, kn, pgn)
    }
#endif

    if (active) {
      #pragma unroll
      for (int j = 0; j < NT / 2; j++)
        #pragma unroll
        for (int dp = 0; dp < DT / 2; dp++) {
          uint b0, b1, b2, b3;
          const int r = j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          LDSM_X4_T(b0, b1, b2, b3, vb + SWZ(r, 2 * dp + (lane >> 4)));
          #pragma unroll
          for (int mt = 0; mt < M_TILES; mt++) {
            MMA(oacc[mt][2 * dp], pf[mt][j], b0, b1);
            MMA(oacc[mt][2 * dp + 1], pf[mt][j], b2, b3);
          }
        }
    }
#if KVQ /* the next tile's quantized sides, before the barrier that publishes it */
    if (kn < kend) {
#if KV_STAGES == 2
      PUT_K(nbuf)
      PUT_V(nbuf + BLOCK_C * SWZ_ROW * 16)
#else
      PUT_K(kbuf)
#endif
    }
#endif
    k0 = kn;
  }

  const long obase = o_off + bq * o_sb + row_q * o_sn + (long)h * o_sh;
  #pragma unroll
  for (int mt = 0; mt < M_TILES; mt++)
    #pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float l = l_r[mt][hh];
      l += shfl_xor(l, 1);
      l += shfl_xor(l, 2);
      const int row = wrow0 + mt * 16 + g + hh * 8;
      if (row >= nq) continue;
      /* A row that sees no key: O = 0 and LSE = -inf (the sink's, with one), never NaN. */
      float inv = l > 0.0f ? 1.0f / l : 0.0f;
      float lse2 = l > 0.0f ? m_r[mt][hh] * sl2 + log2(l) : -INFINITY;
#if SINKS
      { /* the sink joins at the end (sv_sink_join) */
        const float3 j = sv_sink_join(sinks[h] * LOG2E, l > 0.0f ? m_r[mt][hh] * sl2 : -INFINITY, l);
        inv = j.y > 0.0f ? j.z / j.y : 0.0f;
        lse2 = j.y > 0.0f ? j.x + log2(j.y) : -INFINITY;
      }
#endif
#if V_UNI
      inv *= v_uni; /* V held its codes */
#endif
      __global uint *orow = (__global uint *)(o + obase + (long)row * o_sn + 2 * t);
      #pragma unroll
      for (int dt = 0; dt < CH_REAL; dt++)
        orow[dt * 4] = pack2(oacc[mt][dt][2 * hh] * inv, oacc[mt][dt][2 * hh + 1] * inv);
      if (has_lse && t == 0) lse[l_off + bq * l_sb + (row_q + row) * l_sn + (long)h * l_sh] = lse2 * M_LN2_F;
    }
}
#endif /* !PROBE_ONLY */

#else /* !USE_PTX: empty bodies, so that the file is valid OpenCL C everywhere */

__kernel void mma_probe(__global const ushort *a, __global const ushort *b, __global float *d) {
  (void)a;
  (void)b;
  (void)d;
}

#endif /* USE_PTX */
