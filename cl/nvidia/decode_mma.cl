/*
 * decode_mma.cl: split-KV decode (cl/decode/decode.cl's decode_attn, same arguments,
 * same partials) on NVIDIA tensor cores, for many rows per KV head: several new
 * tokens times the GQA group (speculative verification). decode.cl gives each
 * row 8 fp32 FMAs per key element and work-item, so its time grows with the
 * rows; here Q K^T and P V are mma.sync products and a tile costs about the
 * same for 1 or 16 rows of an m-tile.
 *
 * The PTX helpers (cp_async16, LDSM_*, MMA, shfl_xor, fast_exp2, pack2, SWZ)
 * come from mma_ptx.cl, compiled first in the same program
 * ("mma_ptx.cl+decode_mma.cl"); with USE_PTX = 0 the kernel has an empty body
 * (the file builds anywhere; the host never launches it there).
 *
 * Work-group (split, kv head * row block, sequence), WR x WK warps. Rows as in
 * decode.cl: r = gi * q_len + t for query head hk * G + gi and token t; a row
 * block is 16 * WR rows, warp (wr, wk) owns the 16-row m-tile wr and the 16 keys
 * [16 wk, 16 wk + 16) of every tile of BLOCK_C = 16 * WK keys. K and V tiles
 * stream through local memory with cp.async, KV_STAGES deep (swizzled rows of
 * 16-byte chunks: chunk c of row r at c ^ (r & 7)). Q stays in registers as A
 * fragments, loaded straight from global memory. Each warp keeps its own
 * online softmax (raw scores; p = exp2(s * scale_log2 - m * scale_log2)) over
 * its keys; at the end the WK warps of an m-tile are merged through local
 * memory, and warp wk = 0 writes the rows: SPLIT = 0 o and lse (natural log),
 * SPLIT = 1 the partial (o normalised, fp32) and its log2-domain LSE at
 * decode.cl's workspace layout, which decode.cl's decode_merge reads; with
 * MERGE_LAST = 1 the kernel's own work-groups merge them in this launch
 * (split_merge.cl's tree, decode.cl's counters; the host joins
 * split_merge.cl before this file).
 *
 * Masks (decode.cl's rules): query t of a sequence of L keys sees key j iff
 * j <= L - q_len + t, or with TREE_MASK every j < L - q_len and new token
 * u = j - (L - q_len) iff bit u of tree_mask[b * q_len + t]; keys past the
 * split's range are zero-filled and masked. Rows past G * q_len are computed
 * on zero Q and never written. A row that sees no key in its range gets o = 0
 * and LSE = -inf.
 *
 * Quantized caches (K_DTYPE / V_DTYPE a kv_quant.cl format; the host always
 * joins kv_quant.cl and kvq_ptx.cl's conversions,
 * "mma_ptx.cl+kv_quant.cl+kvq_ptx.cl+score_variant.cl+decode_mma.cl"): a
 * quantized side's rows (HEAD_DIM bytes, HEAD_DIM / 2 for int4) reach local
 * memory through cp.async as they are (with their TOKEN or BLOCK32 scales,
 * 4-byte cp.async), and once a tile is in, the work-group writes its codes
 * out as 16-bit elements (exactly: int8, int4, e4m3 and e5m2 codes are all
 * fp16 and bf16 values) in a tile of the plain side's layout, from which the
 * tensor cores read as from a 16-bit cache. K's scales stay out of the
 * tile and multiply each key's score in fp32 (BLOCK32: one product per
 * 32-element block, each times its block's scale). V's TOKEN and BLOCK32
 * scales go into the tile (code * scale, in fp32 rounded once to DTYPE);
 * with a HEAD or TENSOR scale V keeps its codes and O is multiplied at the
 * end. This costs a barrier per tile
 * and the conversion, and halves (int8, fp8) or quarters (int4) the bytes
 * that cross the memory bus: that pays where decode is bound
 * by bandwidth (many sequences); with one sequence the chain of tiles each
 * work-group walks bounds it more than their bytes (BENCHMARKS.md, "Quantized
 * KV cache on the tensor-core decode").
 *
 * Requirements (host, src/decode/decode.c): fp16/bf16; HEAD_DIM 64 or 128; q and the
 * caches with 16-byte aligned rows (offsets and strides multiples of 16 bytes);
 * o and lse any layout.
 *
 * Parameters (-D): USE_PTX, DTYPE (1 = fp16, 2 = bf16), HEAD_DIM, WR (m-tiles,
 * i.e. 16-row groups, per work-group), WK (key slices per tile), KV_STAGES (>= 2),
 * SPLIT, MERGE_LAST, PAGED, PAGE_SHIFT (as decode.cl), TREE_MASK, SINKS (1: the attention
 * sinks of desc.score.sinks; no other score variant runs here),
 * K_DTYPE, V_DTYPE, K_SCALE, V_SCALE (as decode.cl; defaults: plain caches);
 * kvq_ptx.cl's CVT_E4M3 for the fp8 conversions.
 *
 * requires: kv_quant.cl
 */
#ifndef SINKS
#define SINKS 0
#endif
#ifndef USE_PTX
#define USE_PTX 0
#endif
#ifndef DTYPE
#define DTYPE 1
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef WR
#define WR 1
#endif
#ifndef WK
#define WK 1
#endif
#ifndef KV_STAGES
#define KV_STAGES 2
#endif
#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef PAGED
#define PAGED 0
#endif
#ifndef PAGE_SHIFT
#define PAGE_SHIFT -1
#endif
#ifndef TREE_MASK
#define TREE_MASK 0
#endif
/* K_DTYPE, V_DTYPE, K_SCALE, V_SCALE: defaults in kv_quant.cl. */
#ifndef KV_QUANT_CL
#error "decode_mma.cl needs kv_quant.cl compiled first in the same program"
#endif
#if SPLIT && MERGE_LAST && !defined(SPLIT_MERGE_CL)
#error "decode_mma.cl with MERGE_LAST needs split_merge.cl compiled first in the same program"
#endif
#ifndef MERGE_LAST
#define MERGE_LAST 0
#endif
#if K_DTYPE != DTYPE
#define K_Q 1
#else
#define K_Q 0
#endif
#if V_DTYPE != DTYPE
#define V_Q 1
#else
#define V_Q 0
#endif
#if (K_Q && (K_DTYPE < KVQ_I8 || K_DTYPE > KVQ_I4)) || (V_Q && (V_DTYPE < KVQ_I8 || V_DTYPE > KVQ_I4))
#error "K_DTYPE / V_DTYPE: DTYPE or a kv_quant.cl format"
#endif
/* int4 sides: rows of HEAD_DIM / 2 bytes. */
#if K_Q && K_DTYPE == KVQ_I4
#define K_I4 1
#else
#define K_I4 0
#endif
#if V_Q && V_DTYPE == KVQ_I4
#define V_I4 1
#else
#define V_I4 0
#endif
#if USE_PTX && (K_Q || V_Q) && !defined(KVQ_PTX_CL)
#error "decode_mma.cl with a quantized cache needs kvq_ptx.cl compiled first in the same program"
#endif
#if K_Q && K_SCALE == KVQ_SCALE_BLOCK32
#define K_BLK 1
#else
#define K_BLK 0
#endif
#if V_Q && V_SCALE == KVQ_SCALE_BLOCK32
#define V_BLK 1
#else
#define V_BLK 0
#endif

#define NTHREADS (32 * WR * WK)
#define BLOCK_C (16 * WK)
#define CH (HEAD_DIM / 8)    /* 16-byte chunks per row */
#define SWZ_ROW CH           /* HEAD_DIM is a multiple of 64: no padding */
#define KT (HEAD_DIM / 16)   /* k-steps of Q K^T */
#define DT (HEAD_DIM / 8)    /* 8-column n-tiles of O */
#define TILE_BYTES (BLOCK_C * CH * 16) /* a tile of 16-bit rows */
/* A stage is K | V as copied: 16-bit rows (swizzled), or a quantized side's
 * HEAD_DIM-byte rows (HEAD_DIM / 2 for int4), dense. The dequantized tiles
 * follow the stages. */
#define K_TILE_BYTES (K_I4 ? TILE_BYTES / 4 : K_Q ? TILE_BYTES / 2 : TILE_BYTES)
#define V_TILE_BYTES (V_I4 ? TILE_BYTES / 4 : V_Q ? TILE_BYTES / 2 : TILE_BYTES)
/* TOKEN and BLOCK32 scales come with their tile: BLOCK_C * NSC floats per
 * side after the V rows. */
#define K_SC_OFF (K_TILE_BYTES + V_TILE_BYTES)
#define V_SC_OFF (K_SC_OFF + K_NSC * BLOCK_C * 4)
#define STAGE_BYTES (V_SC_OFF + V_NSC * BLOCK_C * 4)
#define CONV_OFF (KV_STAGES * STAGE_BYTES)
#define CONV_BYTES ((K_Q + V_Q) * TILE_BYTES)
#define OBUF_FLOATS (WR * 16 * HEAD_DIM)
#define SMEM_BODY ((CONV_OFF + CONV_BYTES) / 16 > OBUF_FLOATS / 4 ? (CONV_OFF + CONV_BYTES) / 16 : OBUF_FLOATS / 4)
#if SPLIT && MERGE_LAST
/* The one-launch merge reuses smem (split_merge.cl). */
#define SM_CHUNKS ((SM_LOCAL_FLOATS(WR * 16) + 3) / 4)
#define SMEM_CHUNKS (SMEM_BODY > SM_CHUNKS ? SMEM_BODY : SM_CHUNKS)
#else
#define SMEM_CHUNKS SMEM_BODY
#endif

#if HEAD_DIM % 64 || KV_STAGES < 2 || WR < 1 || WK < 1
#error "inconsistent decode_mma parameters"
#endif

/* A side's elements as stored (EPC of them in a 16-byte chunk), and its
 * chunks per row. */
#if K_Q
typedef uchar kel_t;
#define K_EPC 16
#else
typedef ushort kel_t;
#define K_EPC 8
#endif
#if V_Q
typedef uchar vel_t;
#define V_EPC 16
#else
typedef ushort vel_t;
#define V_EPC 8
#endif
#define K_CH (HEAD_DIM / (K_I4 ? 32 : K_EPC))
#define V_CH (HEAD_DIM / (V_I4 ? 32 : V_EPC))
#if K_Q && K_SCALE == 0
#define K_ROWSCALE 1
#else
#define K_ROWSCALE 0
#endif
#if V_Q && V_SCALE == 0
#define V_ROWSCALE 1
#else
#define V_ROWSCALE 0
#endif
/* Scales a stage carries per key row: TOKEN 1, BLOCK32 HEAD_DIM / 32. */
#define K_NSC (K_ROWSCALE ? 1 : K_BLK ? HEAD_DIM / 32 : 0)
#define V_NSC (V_ROWSCALE ? 1 : V_BLK ? HEAD_DIM / 32 : 0)

#if (K_NSC || V_NSC) && USE_PTX
inline void cp_async4(uint saddr, __global const float *src, uint bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(saddr), "l"(src), "r"(bytes));
}
#endif

#if USE_PTX
#if PAGED && PAGE_SHIFT >= 0 && (1 << PAGE_SHIFT) % BLOCK_C == 0
/* Tiles start at multiples of BLOCK_C, so with a page size that is a multiple of
 * it a tile never crosses a page: one block-table read per tile, made a tile
 * ahead of the copies that need it (as in decode.cl), instead of one in front
 * of every chunk's copy. */
#define TILE_PAGE(KB) \
  ((KB) < kend ? clamp(block_table[(long)b * max_pages + ((KB) >> PAGE_SHIFT)], 0, num_pages - 1) : 0)
#define ROW_OFF(j, SB, SN) ((long)tpg * (SB) + (long)((j) & ((1 << PAGE_SHIFT) - 1)) * (SN))
#elif PAGED
#define TILE_PAGE(KB) 0
#if PAGE_SHIFT >= 0
#define PAGE_OF(j) ((j) >> PAGE_SHIFT)
#else
#define PAGE_OF(j) ((j) / page_size)
#endif
/* Element offset of key row j (page and slot) within a cache of strides (SB, SN). */
#define ROW_OFF(j, SB, SN)                                                                  \
  ((long)clamp(block_table[(long)b * max_pages + PAGE_OF(j)], 0, num_pages - 1) * (SB) + \
   (long)((j) - PAGE_OF(j) * page_size) * (SN))
#else
#define TILE_PAGE(KB) 0
#define ROW_OFF(j, SB, SN) ((long)b * (SB) + (long)(j) * (SN))
#endif
/* The cache row of key j that a TOKEN scale is indexed by (kv_quant.cl):
 * page * page_size + slot, or b * capacity + j when contiguous. */
#if PAGED
#define SCALE_ROW(j)                                                                           \
  ((long)clamp(block_table[(long)b * max_pages + (j) / page_size], 0, num_pages - 1) * page_size + \
   (j) % page_size)
#else
#define SCALE_ROW(j) ((long)b * capacity + (j))
#endif
#endif /* USE_PTX */

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void decode_mma(
    __global const ushort *q, long q_off, long q_sb, long q_sn, long q_sh,
    __global const kel_t *k, long k_off, long k_sb, long k_sn, long k_sh,
    __global const vel_t *v, long v_off, long v_sb, long v_sn, long v_sh,
    __global ushort *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse,
    __global const int *seqlens, __global const uint *tree_mask, __global const int *block_table, int max_pages,
    int page_size, int num_pages, int capacity, int q_len, int group, int heads_q, int row_blocks, int num_splits,
    float scale_log2, __global float *work, long wo_off, long wl_off, __global const float *sinks,
    __global const float *k_scale, __global const float *v_scale, __global uint *counters) {
#if USE_PTX
#if SINKS && !defined(SCORE_VARIANT_CL)
#error "decode_mma.cl with SINKS needs score_variant.cl compiled first in the same program"
#endif
  __local uint4 smem[SMEM_CHUNKS];
  __local float Ml[2][WK][WR * 16]; /* per key slice: row max and sum, for the final merge */
  const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
  const int wr = warp / WK, wk = warp - (warp / WK) * WK;
  const int g = lane >> 2, t4 = lane & 3;
  const int split = get_group_id(0);
  const int hk = get_group_id(1) / row_blocks;
  const int rb = get_group_id(1) - hk * row_blocks;
  const int b = get_group_id(2);
  const int nrows = group * q_len;
  const int row0 = rb * (WR * 16) + wr * 16; /* first row of this warp's m-tile */

  const int L = clamp(seqlens[b], 0, capacity);
  int kstart = 0, kend = L;
#if SPLIT
  {
    int chunk = (L + num_splits - 1) / num_splits;
    chunk = (chunk + BLOCK_C - 1) / BLOCK_C * BLOCK_C;
    kstart = min(split * chunk, L);
    kend = min(kstart + chunk, L);
  }
#endif
  const int newk = L - q_len; /* the first new token's key */

  /* Q A-fragments straight from global memory: a[0] row g, a[1] row g + 8,
   * a[2] and a[3] the same rows 8 columns on; two elements per 32-bit word. */
  uint qf[KT][4];
  int trow[2]; /* token of rows g and g + 8, -1 past the rows */
  for (int hh = 0; hh < 2; hh++) {
    const int rg = row0 + g + 8 * hh;
    trow[hh] = rg < nrows ? rg % q_len : -1;
    __global const uint *qr = (__global const uint *)q;
    long qi = 0;
    if (rg < nrows) {
      const int gi = rg / q_len, tt = rg - (rg / q_len) * q_len;
      qi = (q_off + b * q_sb + tt * q_sn + (long)(hk * group + gi) * q_sh) / 2 + t4;
    }
    #pragma unroll
    for (int ks = 0; ks < KT; ks++) {
      qf[ks][hh] = rg < nrows ? qr[qi + ks * 8] : 0u;
      qf[ks][hh + 2] = rg < nrows ? qr[qi + ks * 8 + 4] : 0u;
    }
  }

  float oacc[DT][4];
  #pragma unroll
  for (int dt = 0; dt < DT; dt++) oacc[dt][0] = oacc[dt][1] = oacc[dt][2] = oacc[dt][3] = 0.0f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.0f, 0.0f};

  const uint sbase = SADDR(smem);
  __local uchar *smb = (__local uchar *)smem;
  (void)smb;
  /* Scales: a tensor's or head's once here, a row's with its tile. */
  const int heads_kv = heads_q / group;
  (void)heads_kv;
#if K_Q && !K_ROWSCALE && !K_BLK
  const float k_uni = k_scale[kvq_scale_index(K_SCALE, 0, heads_kv, hk, HEAD_DIM, 0)];
#else
  const float k_uni = 1.0f;
#endif
#if V_Q && !V_ROWSCALE && !V_BLK
  const float v_uni = v_scale[kvq_scale_index(V_SCALE, 0, heads_kv, hk, HEAD_DIM, 0)];
#else
  const float v_uni = 1.0f;
#endif
  (void)k_uni;
  (void)v_uni;
  const long kb0 = k_off + (long)hk * k_sh, vb0 = v_off + (long)hk * v_sh;
/* One side's rows of the tile at KB (on page tpg where tiles never cross
 * pages) into local byte address DST: every work-item copies chunks tid, tid +
 * NTHREADS, ... of NCH 16-byte chunks (EPC elements) per row, swizzled (SWZD, a
 * 16-bit side) or dense (a quantized side); rows past kend are zero-filled (a
 * source size of 0 reads nothing; the address stays in bounds). */
#define COPY_ROWS(PTR, B0, SB, SN, NCH, EPC, DST, SWZD, KB)                                            \
  for (int i = tid; i < BLOCK_C * (NCH); i += NTHREADS) {                                              \
    const int r = i / (NCH), c = i - (i / (NCH)) * (NCH), j = (KB) + r;                                \
    const int ok = j < kend;                                                                           \
    const long ro = ok ? ROW_OFF(j, SB, SN) : 0;                                                       \
    cp_async16((DST) + ((SWZD) ? SWZ(r, c) : (uint)(i * 16)),                                          \
               (__global const ushort *)((PTR) + (B0) + ro + c * (EPC)), ok ? 16u : 0u);              \
  }
#if K_Q || V_Q
#define COPY_KV(SB, KB)                                                         \
  COPY_ROWS(k, kb0, k_sb, k_sn, K_CH, K_EPC, SB, !K_Q, KB)                      \
  COPY_ROWS(v, vb0, v_sb, v_sn, V_CH, V_EPC, (SB) + K_TILE_BYTES, !V_Q, KB)     \
  COPY_K_SCALES((SB) + K_SC_OFF, KB)                                            \
  COPY_V_SCALES((SB) + V_SC_OFF, KB)
#else
/* Plain caches: K and V chunks in one loop (the rows' offsets computed once). */
#define COPY_KV(SB, KB)                                                                         \
  for (int i = tid; i < BLOCK_C * CH; i += NTHREADS) {                                          \
    const int r = i / CH, c = i - (i / CH) * CH, j = (KB) + r;                                  \
    const int ok = j < kend;                                                                    \
    const long ko = ok ? ROW_OFF(j, k_sb, k_sn) : 0, vo = ok ? ROW_OFF(j, v_sb, v_sn) : 0;     \
    cp_async16((SB) + SWZ(r, c), k + kb0 + ko + c * 8, ok ? 16u : 0u);                          \
    cp_async16((SB) + TILE_BYTES + SWZ(r, c), v + vb0 + vo + c * 8, ok ? 16u : 0u);             \
  }
#endif
/* The tile at KB (on page tpg where tiles never cross pages) into stage ST:
 * K then V (then TOKEN scales); always one commit group per call. */
#define LOAD_TILE(KB, ST, TPG)                                                                         \
  {                                                                                                    \
    const uint sb_ = sbase + (uint)((ST) * STAGE_BYTES);                                               \
    const int tpg = (TPG);                                                                             \
    (void)tpg;                                                                                         \
    if ((KB) < kend) {                                                                                 \
      COPY_KV(sb_, KB)                                                                                 \
    }                                                                                                  \
    cp_commit();                                                                                       \
  }
/* A side's TOKEN or BLOCK32 scales for the tile's rows, NSC per row (0 past
 * kend: zero-filled). */
#define COPY_SCALES(SCL, DST, KB, NSC, KIND, AND_V)                                                    \
  for (int i = tid; i < BLOCK_C * (NSC); i += NTHREADS) {                                              \
    const int r = i / (NSC), x = i - r * (NSC), j = (KB) + r, ok = j < kend;                           \
    const long si = ok ? kvq_scale_index(KIND, SCALE_ROW(j), heads_kv, hk, HEAD_DIM, x * 32) : 0;      \
    cp_async4((DST) + (uint)(i * 4), (SCL) + si, ok ? 4u : 0u);                                        \
    if (AND_V) cp_async4((DST) + (uint)(V_SC_OFF - K_SC_OFF + i * 4), v_scale + si, ok ? 4u : 0u);     \
  }
#if K_NSC && V_NSC == K_NSC && V_SCALE == K_SCALE
/* K's and V's scales of one layout share each row's index: one loop copies
 * both (TOKEN: 3-9% of the batch-8 decode's time on the H100). */
#define COPY_K_SCALES(DST, KB) COPY_SCALES(k_scale, DST, KB, K_NSC, K_SCALE, 1)
#define COPY_V_SCALES(DST, KB)
#else
#if K_NSC
#define COPY_K_SCALES(DST, KB) COPY_SCALES(k_scale, DST, KB, K_NSC, K_SCALE, 0)
#else
#define COPY_K_SCALES(DST, KB)
#endif
#if V_NSC
#define COPY_V_SCALES(DST, KB) COPY_SCALES(v_scale, DST, KB, V_NSC, V_SCALE, 0)
#else
#define COPY_V_SCALES(DST, KB)
#endif
#endif
/* A quantized side's tile at local byte offset RAW (dense rows of HEAD_DIM
 * codes, 8 or 4 bytes per 8 codes) into the 16-bit tile at CONV (the plain
 * side's swizzled layout), 8 codes per work-item and step: the codes
 * themselves (SCO < 0; K, whose scales multiply the scores, and a V under one
 * scale), or code * scale with the row's NSC scales at local byte offset SCO
 * (V's TOKEN: one; BLOCK32: chunk c is in block c / 4), in fp32 rounded once.
 * (V's scales cannot move to P in fp16: p * scale, for fp8's small scales,
 * falls below fp16's normal range.) Every step's codes and scale are loaded
 * before the first store: the compiler cannot tell the stores from the
 * loads' addresses, and interleaved, each step's loads would wait for the
 * previous step's store (a serial chain of local-memory latencies per tile). */
#define DQ_STEPS ((BLOCK_C * CH + NTHREADS - 1) / NTHREADS)
#define DQ_OK(i) (DQ_STEPS * NTHREADS == BLOCK_C * CH || (i) < BLOCK_C * CH)
#define DEQUANT_TILE(RAW, CONV, FMT, SCO, NSC)                                                         \
  {                                                                                                    \
    uint2 w_[DQ_STEPS];                                                                                \
    float sc_[DQ_STEPS];                                                                               \
    _Pragma("unroll") for (int it = 0; it < DQ_STEPS; it++) {                                          \
      const int i = tid + it * NTHREADS, r = i / CH, c = i - (i / CH) * CH;                            \
      w_[it] = (uint2)(0u);                                                                            \
      sc_[it] = 0.0f;                                                                                  \
      if (DQ_OK(i)) {                                                                                  \
        if ((FMT) == KVQ_I4) w_[it].x = *(__local const uint *)(smb + (RAW) + i * 4);                  \
        else w_[it] = *(__local const uint2 *)(smb + (RAW) + i * 8);                                   \
        if ((SCO) >= 0)                                                                                \
          sc_[it] = *(__local const float *)(smb + (SCO) + ((NSC) == 1 ? r : r * (NSC) + (c >> 2)) * 4); \
      }                                                                                                \
    }                                                                                                  \
    _Pragma("unroll") for (int it = 0; it < DQ_STEPS; it++) {                                          \
      const int i = tid + it * NTHREADS, r = i / CH, c = i - (i / CH) * CH;                            \
      if (!DQ_OK(i)) break;                                                                            \
      const uint2 w = (FMT) == KVQ_I4 ? dmq_i4_bytes(w_[it].x) : w_[it];                               \
      uint4 h;                                                                                         \
      if ((SCO) < 0) {                                                                                 \
        h = dmq_codes8(w, FMT);                                                                        \
      } else {                                                                                         \
        const float8 f = dmq_decode8(w, FMT) * sc_[it];                                                \
        h = (uint4)(pack2(f.s0, f.s1), pack2(f.s2, f.s3), pack2(f.s4, f.s5), pack2(f.s6, f.s7));       \
      }                                                                                                \
      *(__local uint4 *)(smb + (CONV) + SWZ(r, c)) = h;                                                \
    }                                                                                                  \
  }

  for (int s = 0; s < KV_STAGES - 1; s++) LOAD_TILE(kstart + s * BLOCK_C, s, TILE_PAGE(kstart + s * BLOCK_C))
  int pga = TILE_PAGE(kstart + (KV_STAGES - 1) * BLOCK_C); /* page of the next tile to copy */
  int stage = 0;
  for (int k0 = kstart; k0 < kend; k0 += BLOCK_C) {
    CP_WAIT(KV_STAGES - 2);
    /* This tile is in for every work-item, and everyone is done with the stage
     * the next copy overwrites (the one read in the previous step). */
    barrier(CLK_LOCAL_MEM_FENCE);
    {
      const int ns = stage == 0 ? KV_STAGES - 1 : stage - 1, kb_ = k0 + (KV_STAGES - 1) * BLOCK_C, tp = pga;
      pga = TILE_PAGE(kb_ + BLOCK_C);
      LOAD_TILE(kb_, ns, tp)
    }
    const int so = stage * STAGE_BYTES; /* this stage's local byte offset */
    uint kb = sbase + (uint)so, vb = kb + K_TILE_BYTES;
#if K_Q || V_Q
    {
      /* Every work-item is past the loop head's barrier, so the dequantized
       * tiles of the previous step have been read. */
#if K_Q
      DEQUANT_TILE(so, CONV_OFF, K_DTYPE, -1, 0)
      kb = sbase + CONV_OFF;
#endif
#if V_Q
      DEQUANT_TILE(so + K_TILE_BYTES, CONV_OFF + K_Q * TILE_BYTES, V_DTYPE, V_NSC ? so + V_SC_OFF : -1, V_NSC)
      vb = sbase + CONV_OFF + K_Q * TILE_BYTES;
#endif
      barrier(CLK_LOCAL_MEM_FENCE);
    }
#endif
    stage = stage == KV_STAGES - 1 ? 0 : stage + 1;
    const int j0 = k0 + wk * 16; /* this warp's first key */
    if (j0 >= kend) continue;    /* no barrier until the loop head */

    /* K's scale i of this work-item's key of n-tile nt, accumulator e (keys
     * 2 t4, 2 t4 + 1), in the stage's row scales (K_NSC per key). */
#define K_KEY_SCALE(nt, e, i) \
  (*(__local const float *)(smb + so + K_SC_OFF + ((wk * 16 + (nt) * 8 + 2 * t4 + ((e) & 1)) * K_NSC + (i)) * 4))
    float s[2][4];
    #pragma unroll
    for (int nt = 0; nt < 2; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#if K_BLK
    /* K held codes with a scale per 32 elements: a product per block (two
     * k-steps), each times its key's block scale, in fp32. */
    float sb[KT / 2][2][4];
    #pragma unroll
    for (int i = 0; i < KT / 2; i++)
      #pragma unroll
      for (int nt = 0; nt < 2; nt++) sb[i][nt][0] = sb[i][nt][1] = sb[i][nt][2] = sb[i][nt][3] = 0.0f;
#define S_ACC(ks) sb[(ks) >> 1]
#else
#define S_ACC(ks) s
#endif
    #pragma unroll
    for (int ks = 0; ks < KT; ks++) {
      uint b0, b1, b2, b3;
      const int r = wk * 16 + (lane & 7) + (lane >> 4) * 8;
      LDSM_X4(b0, b1, b2, b3, kb + SWZ(r, 2 * ks + ((lane >> 3) & 1)));
      MMA(S_ACC(ks)[0], qf[ks], b0, b1);
      MMA(S_ACC(ks)[1], qf[ks], b2, b3);
    }
#undef S_ACC
#if K_Q
    /* K held codes: each key's score (each block's, BLOCK32) times its scale. */
    #pragma unroll
    for (int nt = 0; nt < 2; nt++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
#if K_BLK
        #pragma unroll
        for (int i = 0; i < KT / 2; i++) s[nt][e] = fma(sb[i][nt][e], K_KEY_SCALE(nt, e, i), s[nt][e]);
#elif K_ROWSCALE
        s[nt][e] *= K_KEY_SCALE(nt, e, 0);
#else
        s[nt][e] *= k_uni;
#endif
      }
#endif
    /* Masks only where the slice reaches the new tokens or the range's end. */
    if (j0 + 16 > kend || j0 + 16 > newk) {
      #pragma unroll
      for (int nt = 0; nt < 2; nt++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          const int j = j0 + nt * 8 + 2 * t4 + (e & 1), tt = trow[e >> 1];
#if TREE_MASK
          const int u = j - newk;
          const int vis = j < kend && (u < 0 || (tt >= 0 && ((tree_mask[b * q_len + tt] >> u) & 1u)));
#else
          const int vis = j < kend && j <= newk + max(tt, 0);
#endif
          if (!vis) s[nt][e] = -INFINITY;
        }
    }
    uint pf[4];
    #pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float x = fmax(fmax(s[0][2 * hh], s[0][2 * hh + 1]), fmax(s[1][2 * hh], s[1][2 * hh + 1]));
      x = fmax(x, shfl_xor(x, 1));
      x = fmax(x, shfl_xor(x, 2));
      const float mnew = fmax(m_r[hh], x);
      /* A row that still sees no key keeps m = -inf: alpha 1, p 0, never NaN. */
      const float alpha = mnew == m_r[hh] ? 1.0f : fast_exp2((m_r[hh] - mnew) * scale_log2);
      const float ms = mnew == -INFINITY ? 0.0f : mnew * scale_log2;
      m_r[hh] = mnew;
      const float p0 = fast_exp2(fma(s[0][2 * hh], scale_log2, -ms));
      const float p1 = fast_exp2(fma(s[0][2 * hh + 1], scale_log2, -ms));
      const float p2 = fast_exp2(fma(s[1][2 * hh], scale_log2, -ms));
      const float p3 = fast_exp2(fma(s[1][2 * hh + 1], scale_log2, -ms));
      l_r[hh] = l_r[hh] * alpha + (p0 + p1 + p2 + p3);
      #pragma unroll
      for (int dt = 0; dt < DT; dt++) {
        oacc[dt][2 * hh] *= alpha;
        oacc[dt][2 * hh + 1] *= alpha;
      }
      /* The S accumulators of n-tiles 0 and 1 are the A fragment of the 16 keys. */
      pf[hh] = pack2(p0, p1);
      pf[hh + 2] = pack2(p2, p3);
    }
    #pragma unroll
    for (int dp = 0; dp < DT / 2; dp++) {
      uint b0, b1, b2, b3;
      const int r = wk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      LDSM_X4_T(b0, b1, b2, b3, vb + SWZ(r, 2 * dp + (lane >> 4)));
      MMA(oacc[2 * dp], pf, b0, b1);
      MMA(oacc[2 * dp + 1], pf, b2, b3);
    }
#undef K_KEY_SCALE
  }
  CP_WAIT(0);

  /* Row sums over the quad; then the WK key slices of each m-tile merge through
   * local memory (the stages are free now). */
  #pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    l_r[hh] += shfl_xor(l_r[hh], 1);
    l_r[hh] += shfl_xor(l_r[hh], 2);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  __local float *ob = (__local float *)smem + wr * 16 * HEAD_DIM;
  if (t4 == 0)
    for (int hh = 0; hh < 2; hh++) Ml[0][wk][wr * 16 + g + 8 * hh] = m_r[hh];
  barrier(CLK_LOCAL_MEM_FENCE);
  float w[2];
  #pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    float mx = -INFINITY;
    for (int i = 0; i < WK; i++) mx = fmax(mx, Ml[0][i][wr * 16 + g + 8 * hh]);
    w[hh] = m_r[hh] == -INFINITY ? 0.0f : fast_exp2((m_r[hh] - mx) * scale_log2);
    m_r[hh] = mx;
    l_r[hh] *= w[hh];
  }
  if (t4 == 0)
    for (int hh = 0; hh < 2; hh++) Ml[1][wk][wr * 16 + g + 8 * hh] = l_r[hh];
  /* Slices add their weighted O into ob one after another (slice 0 first stores). */
  for (int i = 0; i < WK; i++) {
    if (wk == i)
      #pragma unroll
      for (int dt = 0; dt < DT; dt++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          __local float *p = ob + (g + 8 * (e >> 1)) * HEAD_DIM + dt * 8 + 2 * t4 + (e & 1);
          const float x = oacc[dt][e] * w[e >> 1];
          *p = i == 0 ? x : *p + x;
        }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  #pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int r = g + 8 * hh, rg = row0 + r;
    if (wk != 0 || rg >= nrows) continue; /* slice 0 writes; every warp stays for MERGE_LAST */
    float ls = 0.0f;
    for (int i = 0; i < WK; i++) ls += Ml[1][i][wr * 16 + r];
    const int gi = rg / q_len, tt = rg - (rg / q_len) * q_len, hq = hk * group + gi;
    /* A V of codes under one scale: O times that scale (1 otherwise). */
    float inv = ls > 0.0f ? v_uni / ls : 0.0f;
    float mx = m_r[hh] == -INFINITY ? 0.0f : m_r[hh] * scale_log2;
#if SINKS
    /* The sink joins split 0's (or the only) partial state, at the end (fp16 P). */
    if (split == 0) {
      const float3 j = sv_sink_join(sinks[hq] * M_LOG2E_F, ls > 0.0f ? mx : -INFINITY, ls);
      ls = j.y;
      inv = ls > 0.0f ? j.z * v_uni / ls : 0.0f;
      mx = j.x;
    }
#endif
#if SPLIT
    const long id = ((long)b * q_len + tt) * heads_q + hq;
    __global float *wo = work + wo_off + (id * num_splits + split) * HEAD_DIM;
    for (int c = 2 * t4; c < HEAD_DIM; c += 8)
      vstore2((float2)(ob[r * HEAD_DIM + c], ob[r * HEAD_DIM + c + 1]) * inv, 0, wo + c);
    if (t4 == 0) work[wl_off + id * num_splits + split] = ls > 0.0f ? mx + log2(ls) : -INFINITY;
#else
    /* Pairs of 16-bit stores: o may sit at any element offset (the host plans
     * before it sees o, in flashcl_attention_decode_workspace_size). */
    __global ushort *orow = o + o_off + b * o_sb + tt * o_sn + (long)hq * o_sh;
    for (int c = 2 * t4; c < HEAD_DIM; c += 8)
      vstore2(as_ushort2(pack2(ob[r * HEAD_DIM + c] * inv, ob[r * HEAD_DIM + c + 1] * inv)), 0, orow + c);
    if (has_lse && t4 == 0)
      lse[l_off + b * l_sb + tt * l_sn + (long)hq * l_sh] = ls > 0.0f ? (mx + log2(ls)) * M_LN2_F : -INFINITY;
#endif
  }
#if SPLIT && MERGE_LAST
  { /* every warp takes part: the block is the work-group's WR m-tiles */
    const int brow0 = rb * (WR * 16), nr = min(WR * 16, nrows - brow0);
    __local float *sm_loc = (__local float *)smem;
    int G, ng;
    if (sm_tail(counters, (long)b * get_num_groups(1) + get_group_id(1), num_splits, split, work, wo_off, wl_off,
                HEAD_DIM / 4, b, q_len, heads_q, hk, group, brow0, nr, sm_loc, &G, &ng))
      for (int e = tid; e < nr * (HEAD_DIM / 4); e += NTHREADS) {
        int tt, hq;
        float l;
        const float4 a = sm_final(e, HEAD_DIM / 4, work, wo_off, num_splits, b, q_len, heads_q, hk, group, brow0,
                                  sm_loc, G, ng, &tt, &hq, &l);
        vstore4((ushort4)(as_ushort2(pack2(a.x, a.y)), as_ushort2(pack2(a.z, a.w))), 0,
                o + o_off + b * o_sb + tt * o_sn + (long)hq * o_sh + 4 * (e % (HEAD_DIM / 4)));
        if (has_lse && e % (HEAD_DIM / 4) == 0) lse[l_off + b * l_sb + tt * l_sn + (long)hq * l_sh] = l;
      }
  }
#endif
#undef LOAD_TILE
#undef COPY_ROWS
#undef COPY_KV
#undef DEQUANT_TILE
#undef COPY_SCALES
#undef COPY_K_SCALES
#undef COPY_V_SCALES
#endif /* USE_PTX */
}
