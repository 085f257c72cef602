/*
 * flash_fwd_wgmma.cl: FlashAttention forward on Hopper tensor cores (sm_90a
 * wgmma), through inline PTX.
 *
 * Why a second tensor-core forward: mma.sync (flash_fwd_mma.cl) feeds each warp's
 * tensor core from registers that ldmatrix fills, so every 16x8x16 product costs
 * local-memory traffic and issue slots, which cap it well below the tensor
 * cores' peak on the H100 (BENCHMARKS.md).
 * wgmma lets a warpgroup (4 warps, 128 work-items) multiply 64 rows by a whole
 * tile read straight from local memory through a descriptor, asynchronously.
 *
 * How it reaches the compiler. NVIDIA's OpenCL compiler emits PTX for
 * `.target sm_90`, where wgmma does not exist. Every wgmma-family instruction
 * below is therefore written as a PTX comment that starts with SM90A
 * ("//@sm90a@ "); the operands are still bound and substituted by the compiler.
 * The host (src/core/program.c, fcl_get_kernel_sm90a) builds the source, takes the
 * PTX back from clGetProgramInfo, deletes the markers and retargets the module to
 * `sm_90a` (src/nvidia/ptx_sm90a.c), and builds that PTX as a program binary. A device or driver that
 * refuses any step keeps the mma.sync forward (src/nvidia/wgmma_forward.c).
 *
 * Work: a work-group of NWG warpgroups computes BLOCK_R = 64 * NWG query rows of
 * one (sequence, query head); warpgroup w owns rows [64 w, 64 w + 64), and within
 * it warp i owns 16 rows, exactly the mma.sync accumulator layout (lane g = lane / 4,
 * t = lane % 4 holds columns 8 n + 2 t, +1 of rows g and g + 8 in d[4 n .. 4 n + 3]).
 * Per tile of BLOCK_C keys: S = Q K^T (wgmma m64nBLOCK_Ck16, both operands in local
 * memory), the online softmax on the S registers (flash_fwd_mma.cl's lazy
 * rescaling), P packed to 16 bits in registers, then O += P V (wgmma with A from
 * registers, V read N-major). K and V go through STAGES buffers of local memory
 * with cp.async: the next tile's loads are issued as soon as the current one is
 * in. Within a warpgroup the three steps run in turn; the tensor cores stay busy
 * with the other warpgroups' products meanwhile, which is why three warpgroups
 * beat two. With two buffers all warpgroups meet at a barrier every tile, so
 * their softmaxes line up; with three, mbarriers let them drift apart (the
 * H100's forward at d = 128 14% faster). Issuing S of the next tile with P V
 * and running the softmax meanwhile (FA3's intra-warpgroup overlap) was slower
 * on the H100, with either buffering (BENCHMARKS.md).
 *
 * Local memory layout (the wgmma "128-byte swizzle" canonical layout): a tile of
 * R rows x DPAD columns (the head dim rounded up to 64) is DPAD / 64 regions
 * of R x 64 elements; region
 * rows are 128 bytes, and 16-byte chunk c of row r sits at chunk c ^ (r & 7).
 * Regions start on 1024-byte boundaries (the swizzle pattern repeats every 8
 * rows), which the kernel makes sure of by aligning its base itself.
 * Descriptors: K-major operands (Q, K): leading offset unused, stride 1024 bytes
 * (8 rows); k-step ks starts at region ks / 4, byte 32 * (ks % 4). V (N-major):
 * leading offset = one region (the next 64 columns), stride 1024 bytes (8 keys).
 *
 * Coverage (checked by the host): fp16/bf16, HEAD_DIM a multiple of 8 up to 256, head_dim stride
 * 1, rows 16-byte aligned, scale > 0; causal, varlen, GQA, the sliding window,
 * ALiBi and softcap. Dropout, attention masks and paged K/V run flash_fwd_mma.cl.
 * Arguments: flash_fwd_mma's up to softcap_log2 (its mask, dropout and paged
 * ones are not taken); the same LSE (natural log) and the same rule for rows
 * that see no key (O = 0, LSE = -inf).
 *
 * Parameters (-D):
 *   USE_PTX      1: compile the kernels; 0: empty bodies (the file stays valid
 *                OpenCL C on any device; the host never launches them there)
 *   PROBE_ONLY   1: only the wgmma_probe kernel
 *   DTYPE        1 = fp16, 2 = bf16
 *   HEAD_DIM     a multiple of 8 up to 256 (past 128, O = P V is two products
 *                of at most 128 columns each: one wgmma's n stops at 256, and
 *                its operand list at 128 registers would double the asm's)
 *   BLOCK_C      keys per tile: 64, 96, 112 or 128
 *   NWG          warpgroups per work-group
 *   CAUSAL, VARLEN, WINDOW, ALIBI, SOFTCAP   as in flash_fwd_mma.cl
 *   RESCALE_THRESHOLD  as in flash_fwd_mma.cl
 *   STAGES       K/V buffers: 2 (one work-group barrier per tile) or 3-4 (mbarriers:
 *                a warpgroup waits only for its tile's copies, and a buffer is
 *                refilled once every warpgroup has left the tile it held, so
 *                the warpgroups drift apart instead of meeting at every tile)
 *
 * With USE_PTX=1 the host joins seq_bounds.cl in front too (the kernel's body,
 * which uses it, exists only then; mma_ptx.cl, mma_scores.cl and score_variant.cl likewise).
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
#define HEAD_DIM 128
#endif
#ifndef BLOCK_C
#define BLOCK_C 96
#endif
#ifndef NWG
#define NWG 3
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
#ifndef RESCALE_THRESHOLD
#define RESCALE_THRESHOLD 8.0f
#endif
#ifndef STAGES
#define STAGES 2
#endif
#define LOG2E 1.4426950408889634f

#if HEAD_DIM % 8 || HEAD_DIM > 256 || (BLOCK_C != 64 && BLOCK_C != 96 && BLOCK_C != 112 && BLOCK_C != 128) || \
    STAGES < 2 || STAGES > 4
#error "unsupported flash_fwd_wgmma parameters"
#endif

/* Head dims that are not a multiple of 64 run on tiles of DPAD columns (the
 * next multiple of 64: the swizzled regions are 64 wide), of which D16 (the
 * head dim rounded up to 16, the k-step) are written: Q, K and V carry a
 * zero-filled column chunk where the head dim is an odd multiple of 8. Q K^T
 * and P V stop at D16 (P V may read part of V's last region, wgmma_ptx.cl);
 * the first HEAD_DIM columns of O are stored. */
#define D16 ((HEAD_DIM + 15) / 16 * 16)
#define DPAD ((HEAD_DIM + 63) / 64 * 64)
/* Columns of the last P V product (the only one up to 128, the one for O's
 * columns from 128 past it), a literal (wgmma_ptx.cl). */
#define PV_LAST WG_DLAST

#define NTHREADS (NWG * 128)
#define BLOCK_R (NWG * 64)
#define CH (D16 / 8)       /* 16-byte chunks per row written: Q K^T reads them */
#define CH_REAL (HEAD_DIM / 8) /* of them read from memory; one more is zero-filled */
#if CH == CH_REAL
#define CHUNK_OK(c) 1
#else
#define CHUNK_OK(c) ((c) < CH_REAL)
#endif
#define KT (D16 / 16)      /* k-steps of Q K^T */
#define NT (BLOCK_C / 8)   /* 8-key n-tiles of S */
#define DT (D16 / 8)       /* 8-column n-tiles of O (past HEAD_DIM: not stored) */
#define REGION(rows) ((rows) * 128)
#define TILE_BYTES(rows) ((DPAD / 64) * REGION(rows))
/* Byte offset of chunk c of row r in a tile of `rows` rows. */
#define TOFF(rows, r, c) (((c) >> 3) * REGION(rows) + (r) * 128 + ((((c) & 7) ^ ((r) & 7)) << 4))
#define Q_BYTES TILE_BYTES(BLOCK_R)
#define KV_BYTES TILE_BYTES(BLOCK_C)
#define SMEM_BYTES (Q_BYTES + 2 * STAGES * KV_BYTES)

#if USE_PTX

#ifndef MMA_TYPE
#error "flash_fwd_wgmma.cl with USE_PTX=1 needs mma_ptx.cl compiled first in the same program"
#endif
#if !PROBE_ONLY && !defined(SCORE_VARIANT_CL)
#error "flash_fwd_wgmma.cl needs mma_scores.cl and score_variant.cl compiled first in the same program"
#endif
#if !PROBE_ONLY && !defined(SEQ_BOUNDS_CL)
#error "flash_fwd_wgmma.cl needs seq_bounds.cl compiled first in the same program"
#endif

#ifndef WGMMA_PTX_CL
#error "flash_fwd_wgmma.cl with USE_PTX=1 needs wgmma_ptx.cl compiled first in the same program"
#endif

#if SCORE_LOG2
/* Softcap and ALiBi turn the raw score x of (row, col) into log2 units (score_variant.cl). */
#define SCORE_VARIANT(x, row, col)                                                                 \
  {                                                                                               \
    float th_;                                                                                    \
    (x) = sv_logit((x), scale_log2, softcap_in, softcap_log2, slope_log2, abs((col) - ((row) + diag)), &th_); \
  }
#else
#define SCORE_VARIANT(x, row, col)
#endif


/* Compile-and-run probe: one warpgroup, D (64x64) = A (64x64) B^T (B: 64x64,
 * both row-major fp16/bf16 holding small integers) through the same layout,
 * descriptors and instructions as the kernel; then E (64x64) = A B with A from
 * registers and B read N-major. d: D then E, row-major floats. */
__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void wgmma_probe(__global const ushort *a,
                                                                         __global const ushort *b,
                                                                         __global float *d) {
  __local uint4 raw[2 * 64 * 8 + 64];
  const int tid = get_local_id(0), lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
  const uint base = SADDR(raw), sa = (base + 1023u) & ~1023u, sb = sa + REGION(64);
  for (int i = tid; i < 64 * 8; i += 128) {
    const int r = i / 8, c = i % 8;
    cp_async16(sa + (r * 128 + ((c ^ (r & 7)) << 4)), a + r * 64 + c * 8, 16);
    cp_async16(sb + (r * 128 + ((c ^ (r & 7)) << 4)), b + r * 64 + c * 8, 16);
  }
  cp_commit();
  cp_wait_all();
  proxy_fence();
  barrier(CLK_LOCAL_MEM_FENCE);
  float acc[32];
  wg_fence();
  #pragma unroll
  for (int ks = 0; ks < 4; ks++) WGMMA_SS_N64(acc, wg_desc(sa + 32 * ks, 16, 1024), wg_desc(sb + 32 * ks, 16, 1024), ks);
  wg_commit();
  wg_wait0();
  const int r0 = 16 * w + g;
  for (int n = 0; n < 8; n++) {
    d[r0 * 64 + 8 * n + 2 * t] = acc[4 * n];
    d[r0 * 64 + 8 * n + 2 * t + 1] = acc[4 * n + 1];
    d[(r0 + 8) * 64 + 8 * n + 2 * t] = acc[4 * n + 2];
    d[(r0 + 8) * 64 + 8 * n + 2 * t + 1] = acc[4 * n + 3];
  }
  /* E = A B: A fragments from global memory, B (k rows, n columns) N-major at sb. */
  float e[32];
  for (int i = 0; i < 32; i++) e[i] = 0.0f;
  __global const uint *a32 = (__global const uint *)a;
  wg_fence();
  #pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    uint af[4];
    af[0] = a32[(r0 * 64 + kk * 16 + 2 * t) / 2];
    af[1] = a32[((r0 + 8) * 64 + kk * 16 + 2 * t) / 2];
    af[2] = a32[(r0 * 64 + kk * 16 + 8 + 2 * t) / 2];
    af[3] = a32[((r0 + 8) * 64 + kk * 16 + 8 + 2 * t) / 2];
    WGMMA_RS_N64(e, af, wg_desc(sb + 2048 * kk, REGION(64), 1024));
  }
  wg_commit();
  wg_wait0();
  for (int n = 0; n < 8; n++) {
    d[4096 + r0 * 64 + 8 * n + 2 * t] = e[4 * n];
    d[4096 + r0 * 64 + 8 * n + 2 * t + 1] = e[4 * n + 1];
    d[4096 + (r0 + 8) * 64 + 8 * n + 2 * t] = e[4 * n + 2];
    d[4096 + (r0 + 8) * 64 + 8 * n + 2 * t + 1] = e[4 * n + 3];
  }
}

#if !PROBE_ONLY
__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void flash_fwd_wgmma(
    __global const ushort *q, long q_off, long q_sb, long q_sn, long q_sh,
    __global const ushort *k, long k_off, long k_sb, long k_sn, long k_sh,
    __global const ushort *v, long v_off, long v_sb, long v_sn, long v_sh,
    __global ushort *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse,
    int seqlen_q, int seqlen_k, int group, float scale_log2,
    __global const int *cu_q, __global const int *cu_k, int total_q, int total_k,
    int window_left, int window_right, __global const float *alibi, float softcap_in, float softcap_log2,
    __global const float *sinks) {
  /* 1008 bytes of slack: the base is 16-byte aligned, the tiles need 1024. */
  __local uint4 smem[SMEM_BYTES / 16 + 63];
  const int tid = get_local_id(0), lane = tid & 31, wg = tid >> 7, wiw = (tid >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;
  /* Highest query blocks first: under a causal mask they carry the most work. */
  const int q0 = (get_num_groups(0) - 1 - get_group_id(0)) * BLOCK_R;
  const int h = get_group_id(1);
  const int b = get_group_id(2);
  const int hk = h / group;

  const fcl_seq seq = fcl_seq_bounds(cu_q, cu_k, b, seqlen_q, seqlen_k, total_q, total_k);
  const int nq = seq.nq, nk = seq.nk;
  const long bq = seq.bb, row_q = seq.q_row, row_k = seq.k_row;
  if (q0 >= nq) return; /* whole work-group leaves together */

  const long qbase = q_off + bq * q_sb + row_q * q_sn + (long)h * q_sh;
  const long kbase = k_off + bq * k_sb + row_k * k_sn + (long)hk * k_sh;
  const long vbase = v_off + bq * v_sb + row_k * v_sn + (long)hk * v_sh;
  const int diag = seq.diag;
  const uint sq = (SADDR(smem) + 1023u) & ~1023u;
  const uint skv = sq + Q_BYTES; /* two K buffers, then two V buffers */

  /* ---- Q tile ---- rows past nq are zero-filled (their source clamped to row 0). */
  for (int e = tid; e < BLOCK_R * CH; e += NTHREADS) {
    const int r = e / CH, c = e % CH;
    const int ok = q0 + r < nq && CHUNK_OK(c);
    cp_async16(sq + TOFF(BLOCK_R, r, c), q + qbase + (long)(ok ? q0 + r : 0) * q_sn + (CHUNK_OK(c) ? c : 0) * 8,
               ok ? 16u : 0u);
  }
  cp_commit();

  float oacc[DT * 4];
  #pragma unroll
  for (int i = 0; i < DT * 4; i++) oacc[i] = 0.0f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.0f, 0.0f};

  const int grow0 = q0 + wg * 64;       /* first query row of this warpgroup */
  const int wrow0 = grow0 + wiw * 16;   /* ... and of this warp */
  const int2 wg_keys = sv_key_range(q0, BLOCK_R, diag, nk, window_left, window_right, BLOCK_C);
  const int2 g_keys = sv_key_range(grow0, 64, diag, nk, window_left, window_right, 1);
  const int kbeg = wg_keys.x, kend = wg_keys.y, gbeg = g_keys.x, gend = g_keys.y;
  const float sl2 = SCORE_LOG2 ? 1.0f : scale_log2; /* with SCORE_LOG2 the scores are already scaled */
  const float slope_log2 = ALIBI ? alibi[h] * LOG2E : 0.0f;
  __global const uint *mrow = 0;

/* Rows past nk are zero-filled (P is 0 there, but 0 * garbage could be NaN),
 * and so is the chunk past an odd multiple of 8 columns. */
#define LOAD_KV(buf, ptr, sn, k0)                                                             \
  for (int e = tid; e < BLOCK_C * CH; e += NTHREADS) {                                      \
    const int r = e / CH, c = e % CH;                                                       \
    const int ok = (k0) + r < nk && CHUNK_OK(c);                                            \
    cp_async16((buf) + TOFF(BLOCK_C, r, c), (ptr) + (long)(ok ? (k0) + r : 0) * (sn) + (CHUNK_OK(c) ? c : 0) * 8, \
               ok ? 16u : 0u);                                                                \
  }

  /* Tile t covers keys [kbeg + t BLOCK_C, + BLOCK_C). K goes through kbuf(t % STAGES),
   * V through vbuf(t % STAGES); see the loop for why both rings are safe. */
#define KBUF(t) (skv + ((t) % STAGES) * KV_BYTES)
#define VBUF(t) (skv + (STAGES + (t) % STAGES) * KV_BYTES)
#define TILE_K0(t) (kbeg + (t) * BLOCK_C)
  const int ntiles = kend > kbeg ? (kend - kbeg + BLOCK_C - 1) / BLOCK_C : 0;
#if STAGES >= 3
  /* full[s]: the copies of stage s's tile landed (one arrive per work-item);
   * empty[s]: every work-item is done with it. Tile t is stage t % STAGES's
   * (t / STAGES)-th fill, so its phases have parity (t / STAGES) & 1. */
  __local ulong mbar[2 * STAGES];
  const uint mfull = SADDR(mbar), mempty = mfull + 8 * STAGES;
  if (tid == 0) {
    for (int i = 0; i < 2 * STAGES; i++) mb_init(mfull + 8 * i, NTHREADS);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
/* Tile t's copies, once every work-item has left the tile its stage held. */
#define LOAD_TILE(t)                                                                            \
  {                                                                                             \
    if ((t) >= STAGES) mb_wait(mempty + 8 * ((t) % STAGES), ((t) / STAGES - 1) & 1);           \
    LOAD_KV(KBUF(t), k + kbase, k_sn, TILE_K0(t))                                               \
    LOAD_KV(VBUF(t), v + vbase, v_sn, TILE_K0(t))                                               \
    mb_cp_arrive(mfull + 8 * ((t) % STAGES));                                                   \
  }
/* The copies, seen through the mbarrier, before wgmma reads them. */
#define WAIT_TILE(t)                                                                            \
  {                                                                                             \
    mb_wait(mfull + 8 * ((t) % STAGES), ((t) / STAGES) & 1);                                    \
    proxy_fence();                                                                              \
  }
#define LEAVE_TILE(t) mb_arrive(mempty + 8 * ((t) % STAGES))
  if (ntiles > 0) LOAD_TILE(0) /* its arrive covers Q's copies too */
#else
  if (ntiles > 0) {
    LOAD_KV(KBUF(0), k + kbase, k_sn, TILE_K0(0))
    LOAD_KV(VBUF(0), v + vbase, v_sn, TILE_K0(0))
  }
#endif
  cp_commit();

  /* Whether this warpgroup has rows and sees any key of tile t (uniform over
   * the warpgroup, as wgmma needs): the last query block's warpgroups past nq
   * skip the work. */
#if WINDOW
#define ACTIVE(t) (grow0 < nq && TILE_K0(t) < gend && TILE_K0(t) + BLOCK_C > gbeg)
#else
#define ACTIVE(t) (grow0 < nq && TILE_K0(t) < gend)
#endif
  const uint qa = sq + wg * 64 * 128; /* this warpgroup's 64 Q rows */
/* S = Q K^T of tile t, issued and committed (not waited for). k-step ks reads
 * region ks / 4 at byte 32 (ks % 4) of both operands. */
#define ISSUE_S(t)                                                                              \
  {                                                                                             \
    wg_fence();                                                                                 \
    _Pragma("unroll") for (int ks = 0; ks < KT; ks++)                                           \
        WG_SS(BLOCK_C)(s, wg_desc(qa + (ks >> 2) * REGION(BLOCK_R) + (ks & 3) * 32, 16, 1024),   \
                       wg_desc(KBUF(t) + (ks >> 2) * REGION(BLOCK_C) + (ks & 3) * 32, 16, 1024), ks); \
    wg_commit();                                                                                \
  }

  float s[NT * 4];
  uint pf[NT / 2][4];
  float alpha[2] = {1.0f, 1.0f};
  int rescale = 0;

/* The online softmax of tile t on the S registers: row max, lazy rescale factor
 * alpha (FINISH_P applies it to O), p = exp2(...) in place, row sums into l. */
#define SOFTMAX(t)                                                                              \
  {                                                                                             \
    const int tk0 = TILE_K0(t);                                                                 \
    const int need_mask = sv_tile_partial(wrow0, 16, tk0, BLOCK_C, diag, nk, window_left, window_right); \
    if (SCORE_LOG2 || need_mask) {                                                              \
      _Pragma("unroll") for (int nt = 0; nt < NT; nt++)                                         \
      _Pragma("unroll") for (int e = 0; e < 4; e++) {                                           \
        const int col = tk0 + nt * 8 + 2 * t_ + (e & 1);                                        \
        const int row = wrow0 + g + (e >> 1) * 8;                                               \
        SCORE_VARIANT(s[4 * nt + e], row, col);                                                 \
        if (need_mask && !sv_pair_visible(row, col, nq, nk, diag, window_left, window_right, mrow, 3, 0, 1, 1)) \
          s[4 * nt + e] = -INFINITY;                                                            \
      }                                                                                         \
    }                                                                                           \
    float mx[2];                                                                                \
    int grow = 0;                                                                               \
    _Pragma("unroll") for (int hh = 0; hh < 2; hh++) {                                          \
      float x = m_r[hh];                                                                        \
      _Pragma("unroll") for (int nt = 0; nt < NT; nt++) x = fmax(x, fmax(s[4 * nt + 2 * hh], s[4 * nt + 2 * hh + 1])); \
      x = fmax(x, shfl_xor(x, 1));                                                              \
      x = fmax(x, shfl_xor(x, 2));                                                              \
      mx[hh] = x;                                                                               \
      grow |= (x - m_r[hh]) * sl2 > RESCALE_THRESHOLD; /* see flash_fwd_mma.cl */               \
    }                                                                                           \
    rescale = warp_any(grow);                                                                   \
    if (rescale) {                                                                              \
      _Pragma("unroll") for (int hh = 0; hh < 2; hh++) {                                        \
        const float mnew = (mx[hh] - m_r[hh]) * sl2 > RESCALE_THRESHOLD ? mx[hh] : m_r[hh];     \
        alpha[hh] = mnew == m_r[hh] ? 1.0f : fast_exp2((m_r[hh] - mnew) * sl2);                 \
        m_r[hh] = mnew;                                                                         \
        l_r[hh] *= alpha[hh];                                                                   \
      }                                                                                         \
    }                                                                                           \
    _Pragma("unroll") for (int hh = 0; hh < 2; hh++) {                                          \
      const float ms = m_r[hh] == -INFINITY ? 0.0f : m_r[hh] * sl2;                             \
      float ls = 0.0f;                                                                          \
      _Pragma("unroll") for (int nt = 0; nt < NT; nt++) {                                       \
        s[4 * nt + 2 * hh] = fast_exp2(fma(s[4 * nt + 2 * hh], sl2, -ms));                      \
        s[4 * nt + 2 * hh + 1] = fast_exp2(fma(s[4 * nt + 2 * hh + 1], sl2, -ms));              \
        ls += s[4 * nt + 2 * hh] + s[4 * nt + 2 * hh + 1];                                      \
      }                                                                                         \
      l_r[hh] += ls;                                                                            \
    }                                                                                           \
  }
/* O *= alpha where the softmax moved a pivot; P packed to the A fragments of
 * P V (n-tiles 2j, 2j+1 of S are keys 16j..16j+15). */
#define FINISH_P()                                                                              \
  {                                                                                             \
    if (rescale) {                                                                              \
      _Pragma("unroll") for (int dt = 0; dt < DT; dt++) {                                       \
        oacc[4 * dt] *= alpha[0];                                                               \
        oacc[4 * dt + 1] *= alpha[0];                                                           \
        oacc[4 * dt + 2] *= alpha[1];                                                           \
        oacc[4 * dt + 3] *= alpha[1];                                                           \
      }                                                                                         \
    }                                                                                           \
    _Pragma("unroll") for (int nt = 0; nt < NT; nt++) {                                         \
      pf[nt >> 1][(nt & 1) * 2] = pack2(s[4 * nt], s[4 * nt + 1]);                              \
      pf[nt >> 1][(nt & 1) * 2 + 1] = pack2(s[4 * nt + 2], s[4 * nt + 3]);                      \
    }                                                                                           \
  }

/* O += P V of tile t, issued and committed. */
#if HEAD_DIM <= 128
#define ISSUE_PV(t)                                                                             \
  {                                                                                             \
    wg_fence();                                                                                 \
    _Pragma("unroll") for (int jj = 0; jj < NT / 2; jj++)                                      \
        WG_RS(PV_LAST)(oacc, pf[jj], wg_desc(VBUF(t) + jj * 2048, REGION(BLOCK_C), 1024));      \
    wg_commit();                                                                                \
  }
#else
/* Columns 0-127 (V's regions 0 and 1), then the rest (regions 2 ..). */
#define ISSUE_PV(t)                                                                             \
  {                                                                                             \
    wg_fence();                                                                                 \
    _Pragma("unroll") for (int jj = 0; jj < NT / 2; jj++) {                                     \
      WG_RS(128)(oacc, pf[jj], wg_desc(VBUF(t) + jj * 2048, REGION(BLOCK_C), 1024));            \
      WG_RS(PV_LAST)(oacc + 64, pf[jj], wg_desc(VBUF(t) + 2 * REGION(BLOCK_C) + jj * 2048, REGION(BLOCK_C), 1024)); \
    }                                                                                           \
    wg_commit();                                                                                \
  }
#endif

  const int t_ = t; /* the lane's quad index, under a name the macros can use */
  /* Iteration j: S, softmax and P V of tile j in turn, while tile j + 1 loads
   * (with 2 stages into the buffers that tile j - 1, waited for in iteration
   * j - 1, used). */
  for (int j = 0; j < ntiles; j++) {
#if STAGES >= 3
    if (j + 1 < ntiles) LOAD_TILE(j + 1)
    WAIT_TILE(j)
#else
    cp_wait_all();
    proxy_fence();
    barrier(CLK_LOCAL_MEM_FENCE); /* K and V of tile j are in */
    if (j + 1 < ntiles) {
      LOAD_KV(KBUF(j + 1), k + kbase, k_sn, TILE_K0(j + 1))
      LOAD_KV(VBUF(j + 1), v + vbase, v_sn, TILE_K0(j + 1))
    }
    cp_commit();
#endif
    if (ACTIVE(j)) {
      ISSUE_S(j)
      wg_wait0();
      REG_FENCE(s, NT * 4);
      SOFTMAX(j)
      FINISH_P()
      /* ptxas moves some of FINISH_P's packing below ISSUE_PV's fence and
       * injects its own warpgroup.arrive before those P V products (info
       * C7519). Fencing oacc and pf here instead removes the notes but ran
       * slower (BENCHMARKS.md), so the compiler's placement stays. */
      ISSUE_PV(j)
      wg_wait0();
      REG_FENCE(oacc, DT * 4);
    }
#if STAGES >= 3
    LEAVE_TILE(j);
#endif
  }
  cp_wait_all(); /* a work-group with no visible key still has its Q copy in flight */

  const long obase = o_off + bq * o_sb + row_q * o_sn + (long)h * o_sh;
  #pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    float l = l_r[hh];
    l += shfl_xor(l, 1);
    l += shfl_xor(l, 2);
    const int row = wrow0 + g + hh * 8;
    if (row >= nq) continue;
    /* A row that sees no key: O = 0 and LSE = -inf (the sink's, with one), never NaN. */
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float lse2 = l > 0.0f ? m_r[hh] * sl2 + log2(l) : -INFINITY;
#if SINKS
    { /* the sink joins at the end (sv_sink_join) */
      const float3 j = sv_sink_join(sinks[h] * LOG2E, l > 0.0f ? m_r[hh] * sl2 : -INFINITY, l);
      inv = j.y > 0.0f ? j.z / j.y : 0.0f;
      lse2 = j.y > 0.0f ? j.x + log2(j.y) : -INFINITY;
    }
#endif
    __global uint *orow = (__global uint *)(o + obase + (long)row * o_sn + 2 * t);
    #pragma unroll
    for (int dt = 0; dt < CH_REAL; dt++) orow[dt * 4] = pack2(oacc[4 * dt + 2 * hh] * inv, oacc[4 * dt + 2 * hh + 1] * inv);
    if (has_lse && t == 0) lse[l_off + bq * l_sb + (row_q + row) * l_sn + (long)h * l_sh] = lse2 * M_LN2_F;
  }
}
#endif /* !PROBE_ONLY */

#else /* !USE_PTX: empty bodies, so that the file is valid OpenCL C everywhere */

__kernel void wgmma_probe(__global const ushort *a, __global const ushort *b, __global float *d) {
  (void)a;
  (void)b;
  (void)d;
}

#endif /* USE_PTX */
