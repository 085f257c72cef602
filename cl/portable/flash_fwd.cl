/*
 * flash_fwd.cl: FlashAttention forward pass, portable OpenCL C 1.2.
 *
 * One work-group computes BLOCK_R query rows of one (sequence, query head). The Q
 * tile stays in local memory while the kernel walks K/V tiles of BLOCK_C rows,
 * keeping a running row max m, row sum l and output accumulator per row (the
 * online softmax of FlashAttention-2). Scores live in the log2 domain, with
 * log2(e) folded into the scale, so every exponential is exp2. Math is fp32.
 * The GPU variant multiplies the Q tile by that scale as it stages it (once per
 * work-group, not once per score), except with SOFTCAP, whose tanh needs the
 * unscaled product.
 *
 * Tensors are strided views (batch, seq, head, dim) with unit dim stride; the
 * *_off arguments and strides are in elements. LSE is written in natural log.
 * Out-of-range keys and causally hidden keys are masked with -inf before the
 * exp; tiles past the causal diagonal are never loaded.
 *
 * Local memory (all fp32, float4 granules, no padding; DM = max(HEAD_DIM,
 * HEAD_DIM_V), the row length of every Q/K/V tile, so that V can take K's
 * place whichever is wider):
 *   Qs  [BLOCK_R][DM]         the Q tile (HEAD_DIM used), row-major (GPU variant:
 *                             times scale_log2)
 *   KVs [BLOCK_C][DM]         the K tile (HEAD_DIM), then the V tile (HEAD_DIM_V)
 *                             of the same keys (SEP_KV: Ks and Vs, one tile each)
 *   Ps  [BLOCK_R][BLOCK_C]    probabilities of the current tile
 *   Red [BLOCK_R][S_CT]       per-work-item partial row maxima / sums
 *   Alpha [BLOCK_R]           per-row rescale factor of the current tile
 * Rows are swizzled: float4 granule g of row r sits at g ^ (r & mask), so the
 * work-items of a warp that read the same granule of different rows hit
 * different banks without padding. With PAD_ROWS = 1 rows are instead padded by
 * one granule (Qs, KVs and Ps each grow by one float4 per row).
 *
 * Each tile is processed in two phases with their own work-item mappings:
 *   S = Q K^T: work-item (ty, tx), ty = tid / S_CT, tx = tid % S_CT, owns the
 *     S_TM x S_TN scores of rows ty + i*S_RT and keys tx + j*S_CT; it walks the
 *     head dimension four at a time with float4 loads of Q and K rows.
 *   O += P V: work-item (ty, tx), ty = tid / O_CT, tx = tid % O_CT, owns rows
 *     ty + i*O_RT and the O_TD/4 float4 column granules tx + g*O_CT; it walks
 *     the keys four at a time (one float4 of P per row, four V rows).
 * The S work-items keep the running max of their rows and partial row sums of
 * their own keys (combined once at the end); the first S work-item of each row
 * passes the row's rescale factor to the O work-items through Alpha.
 *
 * K and V of the next tiles are read from global memory into registers while
 * the current phase computes (V during S = Q K^T, the next K during P V).
 * With one K/V tile that takes four barriers per tile (K in, K read, V in, V
 * read). SEP_KV gives K and V a tile each: with SEP_KV = 2 both are refilled
 * right after S = Q K^T has read K (V for this tile's P V, K for the next
 * S), from registers loaded a tile earlier, and the tile needs two barriers;
 * SEP_KV = 1 keeps one register stage and writes the next K after P V (three
 * barriers).
 *
 * Parameters (-D):
 *   DTYPE        0 = fp32, 1 = fp16, 2 = bf16 (storage only; fp16 through vload_half)
 *   HEAD_DIM     head dimension of q and k (S = Q K^T), multiple of 8
 *   HEAD_DIM_V   head dimension of v and o (O = P V), multiple of 8 (default HEAD_DIM)
 *   BLOCK_R      query rows per work-group (Br), multiple of 8
 *   BLOCK_C      key/value rows per tile (Bc), multiple of 8
 *   NTHREADS     work-items per work-group
 *   S_TM, S_TN   scores per work-item: rows x keys (S_RT = BLOCK_R / S_TM,
 *                S_CT = BLOCK_C / S_TN, S_RT * S_CT = NTHREADS)
 *   O_TM, O_TD   output per work-item: rows x columns, O_TD a multiple of 4
 *                (O_RT = BLOCK_R / O_TM, O_CT = HEAD_DIM_V / O_TD, O_RT * O_CT <= NTHREADS;
 *                work-items past O_RT * O_CT sit out the O phase)
 *   CAUSAL       1: key j is visible to query i iff j <= i + (Nk - Nq)
 *   VARLEN       1: sequence bounds come from cu_seqlens_q/k
 *   VEC_ALIGNED  1: every element offset and stride is a multiple of 4, so global
 *                loads and stores of four elements may be aligned vector accesses
 *   PREFETCH     1: read the next K/V tile into registers while computing
 *   UNROLL_D     1: fully unroll the head-dimension loop of S = Q K^T (GPU mapping)
 *   PAD_ROWS     1: pad the local tiles' rows instead of swizzling them (GPU mapping)
 *   SEP_KV       0, 1 or 2: separate K and V tiles (see above; GPU mapping, always
 *                prefetching, PREFETCH ignored; 0 with MASK, whose next tile is
 *                only known once its bits are read). 2 holds two register stages
 *                (K a tile ahead, V), 1 one.
 *   UNROLL_O     n > 0: unroll the key loop of O += P V n times (GPU mapping; 0: the
 *                compiler's choice)
 *   FWD_SHFL     1 (GPU mapping; NVIDIA: warp_ptx.cl's shuffles): the S_CT work-items
 *                of a row are consecutive lanes of one warp (S_CT a power of two
 *                <= 32, NTHREADS a multiple of 32); they take the row maximum from
 *                each other through shuffles instead of through Red, so P and the
 *                rescale factor are ready before the barrier that lets them be
 *                written, and that barrier no longer waits for the row maxima
 *   DROPOUT      1: drop entries of P for P V (philox.cl must be compiled first in
 *                the same program). The row sum l, hence LSE, uses the un-dropped P;
 *                P V uses P * Z / (1 - p), Z = dropout_keep(seed, offset,
 *                b * heads_q + h, i, j, threshold), i and j counted from the start
 *                of the sequence, exactly as naive.cl and flash_bwd.cl.
 *   WINDOW       1: sliding window: key j is visible to query i iff
 *                i + diag - window_left <= j <= i + diag + window_right (diag = Nk - Nq;
 *                the host passes both bounds >= 0, causal folded into window_right,
 *                and builds with CAUSAL=0); tiles wholly outside are never loaded
 *   ALIBI        1: score -= alibi[h] * |j - (i + diag)| (after the softcap)
 *   SOFTCAP      1: score = c * tanh(scale * q.k / c) with softcap_in = scale / c and
 *                softcap_log2 = c * log2(e) (before ALiBi and the masks)
 *   MASK         1: block mask, 2: bit mask (flashcl_mask_kind): `mask` holds row-major
 *                bit matrices of mask_words uint32 words per row, sequence b and query
 *                head h at word b * mask_bs + h * mask_hs; MASK 1: bit (i / mask_bq,
 *                j / mask_bk), MASK 2: bit (i, j); a 0 bit hides key j from query i
 *                (on top of every other mask). Tiles whose bits are all 0 over the
 *                tile's rows x keys are never loaded; tiles whose bits are all 1 skip
 *                the per-score test. mask.cl (the bit readers) must be compiled first
 *                in the same program.
 *   PAGED_KV     1: k and v are page pools (num_pages, page_size, Hkv, d): sequence b's key
 *                j is slot j % page_size of page block_table[b * max_pages + j / page_size]
 *                (clamped to [0, num_pages)), and its key count is kv_lens[b] clamped to
 *                [0, seqlen_k]; the kernel takes the extra trailing arguments block_table,
 *                page_size, max_pages, num_pages, kv_lens (PAGED_PARAMS), then the
 *                scales of a quantized pool (KVQ_PARAMS, flash_fwd_common.cl). With VARLEN the
 *                queries are packed (cu_q) and cu_k is unused (NULL)
 *
 *
 * This file is the GPU variant; CPUs run flash_fwd_cpu.cl instead.
 *
 * requires: dtype.cl seq_bounds.cl score_variant.cl flash_fwd_common.cl
 */
#ifndef NTHREADS
#define NTHREADS 64
#endif
#ifndef S_TM
#define S_TM 4
#endif
#ifndef S_TN
#define S_TN 4
#endif
#ifndef O_TM
#define O_TM 4
#endif
#ifndef O_TD
#define O_TD 16
#endif
#ifndef PREFETCH
#define PREFETCH 1
#endif
#ifndef UNROLL_D
#define UNROLL_D 0
#endif
#ifndef PAD_ROWS
#define PAD_ROWS 0
#endif
#ifndef UNROLL_O
#define UNROLL_O 0
#endif
#ifndef SEP_KV
#define SEP_KV 0
#endif
#ifndef FWD_SHFL
#define FWD_SHFL 0
#endif
#if MASK /* the next visible tile is only known after its mask bits are read */
#undef SEP_KV
#define SEP_KV 0
#endif

/* _Pragma needs a string: this expands a -D parameter into the pragma first. */
#define FCL_PRAGMA_STR(x) _Pragma(#x)
#define FCL_PRAGMA(x) FCL_PRAGMA_STR(x)
#define S_RT (BLOCK_R / S_TM)
#define S_CT (BLOCK_C / S_TN)
#define O_RT (BLOCK_R / O_TM)
#define O_CT (HEAD_DIM_V / O_TD)
#define O_TG (O_TD / 4)
#define D4 (HEAD_DIM / 4)    /* granules of a Q or K row */
#define DV4 (HEAD_DIM_V / 4) /* granules of a V or O row */
#define DM4 (D4 > DV4 ? D4 : DV4) /* the tiles' row length */
#define C4 (BLOCK_C / 4)

#define O_NT (O_RT * O_CT)
#if S_RT * S_CT != NTHREADS || O_NT > NTHREADS || BLOCK_R % S_TM || BLOCK_C % S_TN || \
    BLOCK_R % O_TM || HEAD_DIM_V % O_TD || O_TD % 4 || HEAD_DIM % 8 || HEAD_DIM_V % 8 || BLOCK_C % 8
#error "inconsistent flash_fwd work-item mapping"
#endif
#if FWD_SHFL && (NTHREADS % 32 || S_CT > 32 || (S_CT & (S_CT - 1)))
#error "FWD_SHFL needs whole warps and S_CT a power of two <= 32"
#endif
#if FWD_SHFL && !(defined(WARP_PTX_CL) && WARP_PTX)
#error "FWD_SHFL needs warp_ptx.cl (NVIDIA) compiled first in the same program"
#endif

/* Swizzle masks: the largest power of two <= 8 dividing the granules per row, - 1. */
#define LOWBIT(x) ((x) & -(x))
#define SWM_D ((LOWBIT(DM4) < 8 ? LOWBIT(DM4) : 8) - 1)
#define SWM_C ((LOWBIT(C4) < 8 ? LOWBIT(C4) : 8) - 1)
#if PAD_ROWS
/* Rows padded by one granule: DM4 and C4 are even, so the row stride is odd in
 * granules and any 8 consecutive rows start in 8 different bank groups, while a
 * work-item's addresses stay linear in the granule (immediate offsets, no XOR
 * in the inner loops). */
#define QKV_LD (DM4 + 1)
#define P_LD (C4 + 1)
#define QKV_AT(row, g) ((row) * QKV_LD + (g))
#define P_AT(row, g) ((row) * P_LD + (g))
#else
#define QKV_LD DM4
#define P_LD C4
#define QKV_AT(row, g) ((row) * DM4 + ((g) ^ ((row) & SWM_D)))
#define P_AT(row, g) ((row) * C4 + ((g) ^ ((row) & SWM_C)))
#endif

/* Global K/V granules (float4) each work-item stages per tile of GR granules
 * per row (D4 for K, DV4 for V); the registers hold the wider of the two. */
#define KV_VECS(GR) (BLOCK_C * (GR))
#define KV_PER_OF(GR) ((KV_VECS(GR) + NTHREADS - 1) / NTHREADS)
#define KV_PER KV_PER_OF(DM4)
#define KV_IN(e, GR) (KV_VECS(GR) % NTHREADS == 0 || (e) < KV_VECS(GR))

/* Staging registers: fp16 and bf16 stay packed (ushort4) until they are
 * written to local memory, which halves the registers the prefetch costs. */
#if DTYPE == 0 || K_QUANT || V_QUANT /* a quantized pool is fp32 once loaded */
typedef float4 stage_t;
#define STAGE_GLOAD(p, i) GLOAD4(p, i)
#define STAGE_CVT(x) (x)
#define STAGE_ZERO ((float4)(0.0f))
#else
/* Four 16-bit values as one 64-bit word: a predicated load then fills whole
 * registers, where ushort4 lanes had to be merged with byte permutes. */
typedef uint2 stage_t;
#if VEC_ALIGNED
#define STAGE_GLOAD(p, i) (*(__global const uint2 *)((__global const ushort *)(p) + (i)))
#else
#define STAGE_GLOAD(p, i) as_uint2(vload4(0, (__global const ushort *)(p) + (i)))
#endif
#define STAGE_ZERO ((uint2)(0u))
#if DTYPE == 1
#define STAGE_CVT(x) fcl_half4_bits_to_float4(x)
#else
#define STAGE_CVT(x) fcl_bf16x4_to_float4(as_ushort4(x))
#endif
#endif

/* Read this work-item's granules of a K (GR = D4) or V (GR = DV4) tile (rows
 * past nk read as 0: P is 0 there, but 0 * garbage could be NaN). */
#if !PAGED_KV && NTHREADS % D4 == 0 && NTHREADS % DV4 == 0
/* Every pass of the loop moves the work-item down by the same number of rows:
 * one 64-bit row address per tile, stepped by a constant stride, instead of a
 * 64-bit multiply per granule. */
#define STAGE_LOAD(stage, src, base, sb, sn, kstart, GR)                            \
  {                                                                                 \
    const int c0 = tid / (GR);                                                      \
    __global const store_t *sp = (src) + (base) + (long)((kstart) + c0) * (sn) + 4 * (tid - c0 * (GR)); \
    for (int u = 0; u < KV_PER_OF(GR); u++) {                                       \
      stage_t val = STAGE_ZERO;                                                     \
      if (KV_IN(tid + u * NTHREADS, GR) && (kstart) + c0 + u * (NTHREADS / (GR)) < nk) \
        val = STAGE_GLOAD(sp, 0);                                                   \
      stage[u] = val;                                                               \
      sp += (long)(NTHREADS / (GR)) * (sn);                                         \
    }                                                                               \
  }
#else
#define STAGE_LOAD(stage, src, base, sb, sn, kstart, GR)                            \
  for (int u = 0; u < KV_PER_OF(GR); u++) {                                         \
    const int e = tid + u * NTHREADS;                                               \
    const int c = e / (GR), g = e - (e / (GR)) * (GR);                              \
    stage_t val = STAGE_ZERO;                                                       \
    if (KV_IN(e, GR) && (kstart) + c < nk)                                          \
      val = STAGE_KV(src, (base) + KV_OFF((kstart) + c, sb, sn) + 4 * g, (kstart) + c, 4 * g); \
    stage[u] = val;                                                                 \
  }
#endif
/* Four K (src k) or V (src v) values at element i: key j, elements e .. e + 3. */
#if K_QUANT || V_QUANT
#define STAGE_KV(src, i, j, e) STAGE_KV_##src(i, j, e)
#define STAGE_KV_k(i, j, e) KLOAD4(k, i, j, e)
#define STAGE_KV_v(i, j, e) VLOAD4(v, i, j, e)
#else
#define STAGE_KV(src, i, j, e) STAGE_GLOAD(src, i)
#endif
#define STAGE_STORE(stage, dst, GR)                                                 \
  for (int u = 0; u < KV_PER_OF(GR); u++) {                                         \
    const int e = tid + u * NTHREADS;                                               \
    const int c = e / (GR), g = e - (e / (GR)) * (GR);                              \
    if (KV_IN(e, GR)) (dst)[QKV_AT(c, g)] = STAGE_CVT(stage[u]);                    \
  }

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void flash_fwd(
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
  __local float4 Qs[BLOCK_R * QKV_LD];
#if SEP_KV
  __local float4 Ks[BLOCK_C * QKV_LD];
  __local float4 Vs[BLOCK_C * QKV_LD];
#else
  __local float4 KVs[BLOCK_C * QKV_LD];
#define Ks KVs
#define Vs KVs
#endif
  __local float4 Ps[BLOCK_R * P_LD];
  __local float4 Red4[(BLOCK_R * S_CT + 3) / 4];
  __local float Alpha[BLOCK_R]; /* per-row rescale of this tile; at the end, the row max */
  __local float *Psf = (__local float *)Ps;
  __local float *Red = (__local float *)Red4;

  const int tid = get_local_id(0);
  const int sx = tid % S_CT, sy = tid / S_CT; /* S = Q K^T mapping */
  const int ox = tid % O_CT, oy = tid / O_CT; /* O += P V mapping */
  const int o_active = tid < O_NT; /* always true when O_NT == NTHREADS */
  const int q0 = get_group_id(0) * BLOCK_R;
  const int h = get_group_id(1);
  const int b = get_group_id(2);
  const int hk = h / group;

  FWD_SEQUENCE() /* leaves when the sequence has no query in this work-group */

#if SOFTCAP
  const float qscale = 1.0f; /* the cap needs the unscaled product */
#else
  const float qscale = scale_log2; /* folded into Q once instead of into every score */
#endif
  for (int e = tid; e < BLOCK_R * D4; e += NTHREADS) {
    const int r = e / D4, g = e - (e / D4) * D4;
    Qs[QKV_AT(r, g)] = (q0 + r < nq) ? GLOAD4(q, qbase + (long)(q0 + r) * q_sn + 4 * g) * qscale : (float4)(0.0f);
  }

  float4 acc[O_TM][O_TG];
  for (int i = 0; i < O_TM; i++)
    for (int g = 0; g < O_TG; g++) acc[i][g] = (float4)(0.0f);
  float m_s[S_TM], l_s[S_TM];
  const float2 row0 = sv_row_start(sinks, h, M_LOG2E_F, sx == 0); /* the S_CT work-items' l_s add up */
  for (int i = 0; i < S_TM; i++) {
    m_s[i] = row0.x;
    l_s[i] = row0.y;
  }

  /* Rows past nq see nothing: the last real row bounds the window's right edge. */
  const int2 keys = sv_key_range(q0, min(BLOCK_R, nq - q0), diag, nk, window_left, window_right, BLOCK_C);
  int kstart = keys.x;
  const int kend = keys.y;
  const float slope_log2 = ALIBI ? alibi[h] * M_LOG2E_F : 0.0f;
#if MASK
  __global const uint *mrow = mask + b * mask_bs + h * mask_hs;
  kstart = MASK_NEXT(kstart); /* tiles whose mask bits are all 0 are never loaded */
#endif
  stage_t stage[KV_PER];
#if SEP_KV
  /* K of the first tile in place and V on its way before the loop (see SEP_KV). */
#if SEP_KV == 2
  stage_t vstage[KV_PER];
#endif
  if (kend > kstart) {
    STAGE_LOAD(stage, k, kbase, k_sb, k_sn, kstart, D4)
    STAGE_STORE(stage, Ks, D4)
#if SEP_KV == 2
    STAGE_LOAD(vstage, v, vbase, v_sb, v_sn, kstart, DV4)
    if (kstart + BLOCK_C < kend) STAGE_LOAD(stage, k, kbase, k_sb, k_sn, kstart + BLOCK_C, D4)
#else
    STAGE_LOAD(stage, v, vbase, v_sb, v_sn, kstart, DV4)
#endif
  }
  barrier(CLK_LOCAL_MEM_FENCE);
#elif PREFETCH
  if (kend > kstart) STAGE_LOAD(stage, k, kbase, k_sb, k_sn, kstart, D4)
#endif

#if MASK
  for (int k0 = kstart, knext; k0 < kend; k0 = knext) {
    const int mcls = MASK_TILE(k0); /* 1: some bits set, 3: all set */
    knext = MASK_NEXT(k0 + BLOCK_C);
#else
  for (int k0 = kstart; k0 < kend; k0 += BLOCK_C) {
#endif
#if !SEP_KV
    barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile is fully consumed */
#if !PREFETCH
    STAGE_LOAD(stage, k, kbase, k_sb, k_sn, k0, D4)
#endif
    STAGE_STORE(stage, KVs, D4) /* K */
    barrier(CLK_LOCAL_MEM_FENCE);
#if PREFETCH
    STAGE_LOAD(stage, v, vbase, v_sb, v_sn, k0, DV4) /* V arrives while S is computed */
#endif
#endif

    float s[S_TM][S_TN];
    for (int i = 0; i < S_TM; i++)
      for (int j = 0; j < S_TN; j++) s[i][j] = 0.0f;
#if FWD_SHFL
    float row_max[S_TM], alpha_s[S_TM];
#endif
#if UNROLL_D
#pragma unroll
#endif
    for (int g = 0; g < D4; g++) {
      float4 qa[S_TM], kb[S_TN];
      for (int i = 0; i < S_TM; i++) qa[i] = Qs[QKV_AT(sy + i * S_RT, g)];
      for (int j = 0; j < S_TN; j++) kb[j] = Ks[QKV_AT(sx + j * S_CT, g)];
      for (int i = 0; i < S_TM; i++)
        for (int j = 0; j < S_TN; j++) {
          float t = mad(qa[i].x, kb[j].x, s[i][j]);
          t = mad(qa[i].y, kb[j].y, t);
          t = mad(qa[i].z, kb[j].z, t);
          s[i][j] = mad(qa[i].w, kb[j].w, t);
        }
    }

    const int need_mask = sv_tile_partial(q0, BLOCK_R, k0, BLOCK_C, diag, nk, window_left, window_right);
    for (int i = 0; i < S_TM; i++) {
      const int r = sy + i * S_RT;
      float pm = -INFINITY;
      for (int j = 0; j < S_TN; j++) {
        const int col = k0 + sx + j * S_CT;
        float th; /* Q carries the scale (qscale), except under SOFTCAP: sv_logit's scale is 1 */
        float sv = sv_logit(s[i][j], 1.0f, softcap_in, softcap_log2, slope_log2, abs(col - (q0 + r + diag)), &th);
        if (need_mask && !sv_visible(q0 + r, col, nk, diag, window_left, window_right)) sv = -INFINITY;
#if MASK
        if (!(mcls & 2)) {
          const int row = q0 + r, col = k0 + sx + j * S_CT;
          if (row >= nq || col >= nk || !MASK_OK(row, col)) sv = -INFINITY;
        }
#endif
        s[i][j] = sv;
        pm = fmax(pm, sv);
      }
#if FWD_SHFL
      row_max[i] = pm;
#else
      Red[r * S_CT + sx] = pm;
#endif
    }
#if FWD_SHFL
    /* All shuffles of all rows first, so that their latencies overlap; then P
     * in registers (the same arithmetic, in the same order, as below). */
    for (int m = S_CT / 2; m >= 1; m >>= 1)
      for (int i = 0; i < S_TM; i++) row_max[i] = fmax(row_max[i], nv_shfl_xor(row_max[i], m));
    for (int i = 0; i < S_TM; i++) {
      const float mx = fmax(m_s[i], row_max[i]);
      const float pivot = (mx == -INFINITY) ? 0.0f : mx; /* see below */
      alpha_s[i] = exp2(m_s[i] - pivot);
      m_s[i] = mx;
      float psum = 0.0f;
      for (int j = 0; j < S_TN; j++) {
        s[i][j] = exp2(s[i][j] - pivot);
        psum += s[i][j];
      }
      l_s[i] = l_s[i] * alpha_s[i] + psum;
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* K consumed, the previous P V done */
#else
    barrier(CLK_LOCAL_MEM_FENCE); /* partial maxima ready, K consumed */
#endif
#if SEP_KV == 2
    /* The previous P V has finished with Vs and this S with Ks: both are
     * refilled here, and the barrier below makes them visible. */
    STAGE_STORE(vstage, Vs, DV4) /* V */
    if (k0 + BLOCK_C < kend) {
      STAGE_STORE(stage, Ks, D4) /* next K */
      STAGE_LOAD(vstage, v, vbase, v_sb, v_sn, k0 + BLOCK_C, DV4)
      if (k0 + 2 * BLOCK_C < kend) STAGE_LOAD(stage, k, kbase, k_sb, k_sn, k0 + 2 * BLOCK_C, D4)
    }
#elif SEP_KV
    STAGE_STORE(stage, Vs, DV4) /* V */
    if (k0 + BLOCK_C < kend) STAGE_LOAD(stage, k, kbase, k_sb, k_sn, k0 + BLOCK_C, D4) /* next K arrives during P V */
#elif PREFETCH
    STAGE_STORE(stage, KVs, DV4) /* V */
    if (KNEXT < kend) STAGE_LOAD(stage, k, kbase, k_sb, k_sn, KNEXT, D4) /* next K arrives during P V */
#else
    STAGE_LOAD(stage, v, vbase, v_sb, v_sn, k0, DV4)
    STAGE_STORE(stage, KVs, DV4) /* V */
#endif

    for (int i = 0; i < S_TM; i++) {
      const int r = sy + i * S_RT;
#if FWD_SHFL
      const float alpha = alpha_s[i];
#else
      float mx = m_s[i];
#if S_CT % 4 == 0
      for (int t = 0; t < S_CT / 4; t++) {
        const float4 pm = Red4[r * (S_CT / 4) + t];
        mx = fmax(mx, fmax(fmax(pm.x, pm.y), fmax(pm.z, pm.w)));
      }
#else
      for (int t = 0; t < S_CT; t++) mx = fmax(mx, Red[r * S_CT + t]);
#endif
      /* A row with no visible key so far keeps m = -inf; use 0 as the pivot so
       * that exp2(-inf - pivot) = 0 instead of exp2(-inf + inf) = NaN. */
      const float pivot = (mx == -INFINITY) ? 0.0f : mx;
      const float alpha = exp2(m_s[i] - pivot);
      m_s[i] = mx;
      float psum = 0.0f;
#endif
      for (int j = 0; j < S_TN; j++) {
        const int c = sx + j * S_CT;
#if FWD_SHFL
        const float p = s[i][j];
#else
        const float p = exp2(s[i][j] - pivot);
        psum += p;
#endif
#if PAD_ROWS
        /* Same element as below, in a form the compiler folds into an immediate
         * offset (it does not see that 4 * (c >> 2) + (c & 3) == c). */
        __local float *pdst = Psf + 4 * P_LD * r + c;
#else
        __local float *pdst = Psf + 4 * P_AT(r, c >> 2) + (c & 3);
#endif
#if DROPOUT
        *pdst =
            dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)(q0 + r), (uint)(k0 + c), threshold)
                ? p * keep_scale
                : 0.0f;
#else
        *pdst = p;
#endif
      }
#if !FWD_SHFL
      l_s[i] = l_s[i] * alpha + psum;
#endif
      if (sx == 0) Alpha[r] = alpha;
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* P, V and the rescale factors ready */

    for (int i = 0; i < O_TM && o_active; i++) {
      const float alpha = Alpha[oy + i * O_RT];
      for (int g = 0; g < O_TG; g++) acc[i][g] *= alpha;
    }

#if UNROLL_O
    FCL_PRAGMA(unroll UNROLL_O)
#endif
    for (int j4 = 0; j4 < C4 && o_active; j4++) {
      float4 pa[O_TM];
      for (int i = 0; i < O_TM; i++) pa[i] = Ps[P_AT(oy + i * O_RT, j4)];
#if PAD_ROWS
      /* One pointer per four keys: every V read below is then the pointer plus
       * an immediate offset (indices rebuilt per read cost two integer
       * instructions per load on NVIDIA). */
      __local const float4 *vrow = Vs + 4 * j4 * QKV_LD + ox;
#endif
      for (int jj = 0; jj < 4; jj++) {
        float4 vb[O_TG];
#if PAD_ROWS
        for (int g = 0; g < O_TG; g++) vb[g] = vrow[jj * QKV_LD + g * O_CT];
#else
        for (int g = 0; g < O_TG; g++) vb[g] = Vs[QKV_AT(4 * j4 + jj, ox + g * O_CT)];
#endif
        for (int i = 0; i < O_TM; i++) {
          const float pv = jj == 0 ? pa[i].x : jj == 1 ? pa[i].y : jj == 2 ? pa[i].z : pa[i].w;
          for (int g = 0; g < O_TG; g++) acc[i][g] = mad((float4)(pv), vb[g], acc[i][g]);
        }
      }
    }
#if SEP_KV == 1
    /* This S has finished with Ks long ago: the next K goes in now, and V of
     * the next tile starts on its way. */
    if (k0 + BLOCK_C < kend) {
      STAGE_STORE(stage, Ks, D4)
      STAGE_LOAD(stage, v, vbase, v_sb, v_sn, k0 + BLOCK_C, DV4)
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* next K visible */
#endif
  }

  /* Each S work-item summed only its own keys of P: combine the partial sums. */
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = 0; i < S_TM; i++) {
    Red[(sy + i * S_RT) * S_CT + sx] = l_s[i];
    if (sx == 0) Alpha[sy + i * S_RT] = m_s[i];
  }
  barrier(CLK_LOCAL_MEM_FENCE);

  const long obase = o_off + bq * o_sb + row_q * o_sn + (long)h * o_sh;
  for (int i = 0; i < O_TM; i++) {
    const int r = oy + i * O_RT;
    if (q0 + r >= nq || !o_active) continue;
    float l = 0.0f;
    for (int t = 0; t < S_CT; t++) l += Red[r * S_CT + t];
    /* A row that sees no key: O = 0 and LSE = -inf (with SINKS l >= 1: LSE = the sink), never NaN. */
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const long orow = obase + (long)(q0 + r) * o_sn;
    for (int g = 0; g < O_TG; g++) GSTORE4(o, orow + 4 * (ox + g * O_CT), acc[i][g] * inv);
  }
  /* LSE in a loop of its own: with it inside the loop above, PoCL 3.1 (LLVM 15)
   * dropped that loop's row guard and wrote O's padding rows past seqlen_q. */
  if (has_lse && ox == 0 && o_active) {
    for (int i = 0; i < O_TM; i++) {
      const int r = oy + i * O_RT;
      if (q0 + r >= nq) continue;
      float l = 0.0f;
      for (int t = 0; t < S_CT; t++) l += Red[r * S_CT + t];
      lse[l_off + bq * l_sb + (row_q + q0 + r) * l_sn + (long)h * l_sh] =
          l > 0.0f ? (Alpha[r] + log2(l)) * M_LN2_F : -INFINITY;
    }
  }
}
