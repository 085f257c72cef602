/*
 * decode.cl: attention of a few new query tokens per sequence against a paged or
 * contiguous KV cache, split over the keys (FlashDecoding). Math is fp32; scores
 * live in the log2 domain (log2(e) folded into the scale, which is applied to Q
 * once when it is loaded), so every exponential is exp2.
 *
 * decode_attn: work-group (split, kv head * row block, sequence). Its rows are the
 *   G * q_len (query head of the kv head's GQA group, query token) pairs, row
 *   r = gi * q_len + t for query head hk * G + gi and token t, ROWS of them per row
 *   block; every row of the block uses each K/V element the work-group reads, so
 *   the query heads of a group share each load.
 *   Split s of num_splits covers keys [s * chunk, min((s + 1) * chunk, L)) with
 *   chunk = ceil(L / num_splits) rounded up to TILE, L the sequence's KV length.
 *   Query t sees key j iff j <= L - q_len + t (bottom-right causal); with
 *   TREE_MASK = 1 it sees every key j < L - q_len and new token u = j - (L - q_len)
 *   iff bit u of tree_mask[b * q_len + t] is set. A row that sees no key in its
 *   range gets o = 0 and lse = -inf (with SINKS: its sink).
 *   SPLIT = 0: writes o (normalised) and lse (natural log) directly.
 *   SPLIT = 1: writes the partial (o normalised, fp32) and its log2-domain LSE to
 *     the workspace: row id = (b * q_len + t) * heads_q + hq,
 *     work[wo_off + (id * num_splits + s) * HEAD_DIM_V + x], work[wl_off + id * num_splits + s].
 *   MERGE_LAST = 1 (with SPLIT; the host joins split_merge.cl in front): the
 *     one-launch form, in which the kernel's own work-groups merge the
 *     partials into o and lse (split_merge.cl's two-level tree; counters:
 *     ceil(S / G) + 1 per row block, in the order of get_group_id(1) within
 *     sequence b; zero before a launch, zero after).
 * decode_merge: work-group (MERGE_THREADS work-items) per row id: merges the
 *   num_splits (<= MERGE_MAX_SPLITS) partials (the associative merge of merge.cl)
 *   into o and lse (the two-kernel form).
 *
 * Mapping (NTHREADS = TPK * KG work-items, TPK = HEAD_DIM / 8): work-item
 *   (kg = tid / TPK, x = tid % TPK) owns elements [8x, 8x + 8) of every row: Q of
 *   its ROWS rows (pre-scaled) and its O accumulators stay in registers. K and V
 *   go straight from global memory to registers, never through local memory: a
 *   tile is TILE = KG * KPT keys, key u * KG + kg of the tile read by the TPK
 *   work-items of key group kg (one key row = TPK consecutive 16-byte loads, so a
 *   warp reads whole contiguous rows). Per tile:
 *     0. V of the tile is loaded (its registers are used in step 3);
 *     1. partial dots q_r . k over the work-item's 8 elements -> local Sh; then
 *        (PREFETCH >= 1) the next tile's K is loaded into registers, so it is in
 *        flight during the rest of the tile (PREFETCH = 2: V too; 0: K is loaded
 *        at the end of the tile);
 *     2. barrier; the TILE * ROWS scores are summed over the TPK partials, masked,
 *        into local Sc (both buffers are double-buffered: 2 barriers per tile);
 *     3. barrier; each work-item runs the online softmax (running max m, sum l,
 *        rescale of its O accumulators) over its own KPT keys.
 *   At the end the KG key groups' (m, l, O) are merged through local memory.
 * ASYNC_STAGES = S >= 2 (NVIDIA only: inline PTX cp.async, fp16/bf16 with
 *   VEC_ALIGNED): K and V tiles are copied global -> local memory by cp.async,
 *   S - 1 tiles ahead of the one in use, into S stage slots after the partial-dot
 *   buffers; steps 0 and 1 then read the work-item's keys from its slot. Every
 *   work-item reads back only the 16-byte pieces it copied itself, so the
 *   stages need no barrier of their own (cp.async.wait_group makes a work-item's
 *   own copies visible to it). This keeps (S - 1) * TILE * 512 bytes (d = 128)
 *   per work-group in flight through the whole tile, where the register path
 *   holds at most the next tile's K; PREFETCH is ignored.
 * Local memory: Sh max(2 * TPK * (TILE * ROWS + 1), KG * ROWS * HEAD_DIM) floats,
 *   Sc 2 * TILE * ROWS floats.
 *
 * Paged (PAGED = 1): key j of sequence b is slot j % page_size of page
 *   block_table[b * max_pages + j / page_size], clamped to [0, num_pages); the
 *   cache tensors are (num_pages, page_size, Hkv, d). Contiguous: page b, slot j.
 *   Where the page size is a multiple of TILE the block table is read once per
 *   tile, a tile ahead; otherwise once per key row.
 * L = clamp(seqlens[b], 0, capacity).
 *
 * Quantized caches (K_DTYPE / V_DTYPE one of kv_quant.cl's formats, each side on
 *   its own): the work-item's 8 codes of a key row are loaded as a uchar8 (8
 *   bytes, any alignment; KVQ_I4: a uchar4 at half the offset, as the cache
 *   counts bytes) and dequantized on the conversion to fp32, times the
 *   row's scale: K_SCALE / V_SCALE KVQ_SCALE_TENSOR or _HEAD read it once per
 *   work-group, _TOKEN with the row (index (page * rows_per_page + slot) *
 *   heads_kv + hk, rows_per_page = page_size, or capacity when contiguous),
 *   _BLOCK32 likewise, the scale of the 32-element block that holds the
 *   work-item's 8 elements,
 *   so the scale travels through the same prefetch as its codes. Register
 *   path only (the cp.async stages copy 16-bit rows).
 *
 * Score variants (the forward's rules, flashcl.h; query t sits at position
 *   i = L - q_len + t): WINDOW = 1 hides key j where j < i - window_left
 *   (window_left >= 0) or j > i + window_right (window_right >= 0), and the
 *   split range starts at the first key any row can see (rounded down to a
 *   tile), so the splits share the window rather than the whole cache;
 *   SOFTCAP = 1: s = c * tanh(s / c) (softcap_in = ln 2 / c on the log2-domain
 *   score, softcap_log2 = c * log2(e)); ALIBI = 1: s -= alibi[hq] * |j - i|,
 *   after the softcap. SINKS = 1: each row's softmax takes one more entry of
 *   logit sinks[hq] and no value, counted by key group 0 of split 0.
 *
 * Separate V head dim (HEAD_DIM_V < HEAD_DIM, MLA-like): v_cache and o rows hold
 *   HEAD_DIM_V elements; the work-items x < TPV = HEAD_DIM_V / 8 of a key row load
 *   its 8 V elements, the others none, and o, the split partials and the merge
 *   run over HEAD_DIM_V (register path only).
 *
 * Parameters (-D): DTYPE (0 = fp32, 1 = fp16, 2 = bf16; storage only), HEAD_DIM
 *   (multiple of 8), HEAD_DIM_V (multiple of 8, <= HEAD_DIM; default HEAD_DIM), ROWS, NTHREADS (a multiple of HEAD_DIM / 8), KPT (keys per
 *   work-item per tile), PREFETCH, VEC_ALIGNED (1: the caches' offsets and strides
 *   are multiples of 8 elements, so 16-byte vector loads are aligned), SPLIT, PAGED,
 *   PAGE_SHIFT (log2 of the page size when it is a power of two, which the kernel
 *   argument page_size must then equal; -1: any page size), TREE_MASK (1: the
 *   tree_mask argument replaces the causal rule among the new tokens), MERGE_THREADS (a
 *   power of two >= HEAD_DIM_V / 4), MERGE_MAX_SPLITS, ASYNC_STAGES (0: the register
 *   path; >= 2 needs USE_PTX = 1, i.e. the program
 *   "mma_ptx.cl+dtype.cl+kv_quant.cl+score_variant.cl+decode.cl"), WINDOW, SOFTCAP,
 *   ALIBI, SINKS (0 or 1: the score variants above), K_DTYPE, V_DTYPE (the caches'
 *   storage: DTYPE, or KVQ_I8 / KVQ_E4M3 / KVQ_E5M2 / KVQ_I4), K_SCALE, V_SCALE (their
 *   KVQ_SCALE_* layouts; ignored for a plain cache), MERGE_LAST (split_merge.cl).
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
#ifndef NTHREADS
#define NTHREADS 128
#endif
#ifndef KPT
#define KPT 4
#endif
#ifndef PREFETCH
#define PREFETCH 1
#endif
#ifndef VEC_ALIGNED
#define VEC_ALIGNED 0
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
#ifndef MERGE_THREADS
#define MERGE_THREADS 128
#endif
#ifndef MERGE_MAX_SPLITS
#define MERGE_MAX_SPLITS 256
#endif
#ifndef MERGE_LAST
#define MERGE_LAST 0
#endif
#ifndef ASYNC_STAGES
#define ASYNC_STAGES 0
#endif
#ifndef USE_PTX
#define USE_PTX 0
#endif
/* K_DTYPE, V_DTYPE, K_SCALE, V_SCALE: defaults in kv_quant.cl. */
/* 0 / 1 literals (a logical && on constants in code draws compiler warnings):
 * *_QUANT a quantized side, *_ROWSCALE its scale comes with each row (TOKEN;
 * BLOCK32, where a work-item's 8 elements sit in one 32-element block),
 * *_UNISCALE once per work-group (TENSOR, HEAD). */
#if K_DTYPE != DTYPE
#define K_QUANT 1
#else
#define K_QUANT 0
#endif
#if V_DTYPE != DTYPE
#define V_QUANT 1
#else
#define V_QUANT 0
#endif
#if K_QUANT && KVQ_ROW_KIND(K_SCALE)
#define K_ROWSCALE 1
#else
#define K_ROWSCALE 0
#endif
#if V_QUANT && KVQ_ROW_KIND(V_SCALE)
#define V_ROWSCALE 1
#else
#define V_ROWSCALE 0
#endif
#define K_UNISCALE (K_QUANT - K_ROWSCALE)
#define V_UNISCALE (V_QUANT - V_ROWSCALE)

#define DV4 (HEAD_DIM_V / 4)    /* 4-element granules of an o row */
#define TPK (HEAD_DIM / 8)      /* work-items per key row, 8 elements each */
#define TPV (HEAD_DIM_V / 8)    /* of them holding 8 elements of V too */
#define KG (NTHREADS / TPK)     /* key groups */
#define TILE (KG * KPT)         /* keys per tile */
#define SR (TILE * ROWS)        /* scores per tile */
#define PSTR (SR + 1)           /* padded row of the partial-dot buffer */
#define PART_FLOATS (2 * TPK * PSTR)
#define OBUF_FLOATS (KG * ROWS * HEAD_DIM)
#if ASYNC_STAGES
/* Stage slots start 16-byte aligned after the partial dots; a slot is K then V
 * of one tile, TILE rows of HEAD_DIM 16-bit elements each. */
#define STG_OFF ((PART_FLOATS + 3) / 4 * 4)
#define SLOT_BYTES (2 * TILE * HEAD_DIM * 2)
#define STG_END (STG_OFF + ASYNC_STAGES * SLOT_BYTES / 4)
#else
#define STG_END PART_FLOATS
#endif
#define SH_BODY (STG_END > OBUF_FLOATS ? STG_END : OBUF_FLOATS)
#if SPLIT && MERGE_LAST
#ifndef SPLIT_MERGE_CL
#error "decode.cl with MERGE_LAST needs split_merge.cl compiled first in the same program"
#endif
/* The one-launch merge reuses Sh (split_merge.cl). */
#define SH_FLOATS (SH_BODY > SM_LOCAL_FLOATS(ROWS) ? SH_BODY : SM_LOCAL_FLOATS(ROWS))
#else
#define SH_FLOATS SH_BODY
#endif

#if HEAD_DIM % 8 || HEAD_DIM_V % 8 || HEAD_DIM_V > HEAD_DIM || (ASYNC_STAGES && HEAD_DIM_V != HEAD_DIM) || \
    NTHREADS % TPK || KPT < 1 || ROWS < 1 || MERGE_THREADS < DV4 ||                                      \
    (MERGE_THREADS & (MERGE_THREADS - 1))
#error "inconsistent decode_attn mapping"
#endif
#if ASYNC_STAGES && (ASYNC_STAGES < 2 || !USE_PTX || DTYPE == 0 || !VEC_ALIGNED || K_QUANT || V_QUANT)
#error "ASYNC_STAGES needs >= 2 stages, USE_PTX = 1, a 16-bit DTYPE, VEC_ALIGNED = 1 and plain caches"
#endif
#if (K_QUANT && (K_DTYPE < KVQ_I8 || K_DTYPE > KVQ_I4)) || (V_QUANT && (V_DTYPE < KVQ_I8 || V_DTYPE > KVQ_I4))
#error "K_DTYPE / V_DTYPE: DTYPE or a kv_quant.cl format"
#endif
#if (HEAD_DIM % 32 && K_QUANT && K_SCALE == KVQ_SCALE_BLOCK32) || (HEAD_DIM_V % 32 && V_QUANT && V_SCALE == KVQ_SCALE_BLOCK32)
#error "BLOCK32 scales need a head dim that is a multiple of 32"
#endif

/* 8 consecutive cache elements, raw (loaded) and converted to fp32. */
#if DTYPE == 0
typedef float8 raw8_t;
#define RAW_LOAD8(p, i) vload8(0, (p) + (i))
#define RAW_CVT8(x) (x)
#define RAW_ZERO8 ((float8)(0.0f))
#else
typedef ushort8 raw8_t;
#if VEC_ALIGNED
#define RAW_LOAD8(p, i) (*(__global const ushort8 *)((__global const ushort *)(p) + (i)))
#else
#define RAW_LOAD8(p, i) vload8(0, (__global const ushort *)(p) + (i))
#endif
#define RAW_ZERO8 ((ushort8)(0))
#if DTYPE == 1
inline float8 raw_cvt8(ushort8 x) {
  ushort8 t = x;
  return vload_half8(0, (const __private half *)&t);
}
#else
inline float8 raw_cvt8(ushort8 x) { return as_float8(convert_uint8(x) << 16); }
#endif
#define RAW_CVT8(x) raw_cvt8(x)
#endif

/* A cache's rows as loaded (k*_t) and their element type: the plain raw8_t, or
 * 8 codes of a quantized format. *_CVT8 gives fp32 before the scale. *_STEP8:
 * how far the index moves per 8 elements of a row (4 bytes for int4). */
#if K_QUANT && K_DTYPE == KVQ_I4
typedef uchar kstore_t;
typedef uchar4 kraw8_t;
#define K_LOAD8(p, i) vload4(0, (p) + (i))
#define K_ZERO8 ((uchar4)(0))
#define K_CVT8(x) kvq_i4x8_to_float8(x)
#elif K_QUANT
typedef uchar kstore_t;
typedef uchar8 kraw8_t;
#define K_LOAD8(p, i) vload8(0, (p) + (i))
#define K_ZERO8 ((uchar8)(0))
#define K_CVT8(x) kvq_decode8((x), K_DTYPE)
#else
typedef store_t kstore_t;
typedef raw8_t kraw8_t;
#define K_LOAD8(p, i) RAW_LOAD8(p, i)
#define K_ZERO8 RAW_ZERO8
#define K_CVT8(x) RAW_CVT8(x)
#endif
#if V_QUANT && V_DTYPE == KVQ_I4
typedef uchar vstore_t;
typedef uchar4 vraw8_t;
#define V_LOAD8(p, i) vload4(0, (p) + (i))
#define V_ZERO8 ((uchar4)(0))
#define V_CVT8(x) kvq_i4x8_to_float8(x)
#elif V_QUANT
typedef uchar vstore_t;
typedef uchar8 vraw8_t;
#define V_LOAD8(p, i) vload8(0, (p) + (i))
#define V_ZERO8 ((uchar8)(0))
#define V_CVT8(x) kvq_decode8((x), V_DTYPE)
#else
typedef store_t vstore_t;
typedef raw8_t vraw8_t;
#define V_LOAD8(p, i) RAW_LOAD8(p, i)
#define V_ZERO8 RAW_ZERO8
#define V_CVT8(x) RAW_CVT8(x)
#endif

#define K_STEP8 KVQ_BYTES8(K_DTYPE) /* a plain side's DTYPE (0-2) gives 8 */
#define V_STEP8 KVQ_BYTES8(V_DTYPE)

inline float dot8(float8 a, float8 b) { return dot(a.lo, b.lo) + dot(a.hi, b.hi); }

/* Reads this work-item's KPT keys (u * KG + kg of the tile at KB) of K and V;
 * keys at or past kend read as 0. TPG is the tile's page (TILE_PAGE) where a tile
 * never crosses a page, unused otherwise. */
#if PAGED && PAGE_SHIFT >= 0 && (1 << PAGE_SHIFT) % TILE == 0
/* Tiles start at multiples of TILE, so with a page size that is a multiple of
 * TILE a tile never crosses a page: one block-table read per tile, made a tile
 * ahead of the loads that need it, so that the read's latency is not paid in
 * front of every K and V load. */
#define TILE_PAGE(KB) \
  ((KB) < kend ? clamp(block_table[(long)b * max_pages + ((KB) >> PAGE_SHIFT)], 0, num_pages - 1) : 0)
#define KEY_ROW(j, PG, SLOT, TPG) \
  PG = (TPG);                     \
  SLOT = (j) & ((1 << PAGE_SHIFT) - 1)
#elif PAGED
#define TILE_PAGE(KB) 0
/* A power-of-two page size comes in as PAGE_SHIFT, so that finding a key's page
 * is a shift rather than an integer division per key row and tile. */
#if PAGE_SHIFT >= 0
#define PAGE_OF(j) ((j) >> PAGE_SHIFT)
#define SLOT_OF(j) ((j) & ((1 << PAGE_SHIFT) - 1))
#else
#define PAGE_OF(j) ((j) / page_size)
#define SLOT_OF(j) ((j) - ((j) / page_size) * page_size)
#endif
#define KEY_ROW(j, PG, SLOT, TPG)                                                  \
  PG = clamp(block_table[(long)b * max_pages + PAGE_OF(j)], 0, num_pages - 1); \
  SLOT = SLOT_OF(j)
#else
#define TILE_PAGE(KB) 0
#define KEY_ROW(j, PG, SLOT, TPG) \
  PG = b;                         \
  SLOT = (j)
#endif
/* SC[u] receives the row's scale where ROWSCALE (TOKEN scales), from SCL; 0
 * past kend, where a stale or unset scale could be inf and turn the zero
 * codes into NaN. */
#define LOAD_ROWS(R, SC, LD, Z, ROWSCALE, KIND, D, XOK, SCL, PTR, OFF, SB, SN, SH, KB, TPG, STEP) \
  for (int u = 0; u < KPT; u++) {                                                              \
    const int j = (KB) + u * KG + kg;                                                          \
    R[u] = Z;                                                                                  \
    if (ROWSCALE) SC[u] = 0.0f;                                                                \
    if (j < kend && (XOK)) {                                                                   \
      int pg_, sl_;                                                                            \
      KEY_ROW(j, pg_, sl_, TPG);                                                               \
      R[u] = LD(PTR, OFF + pg_ * SB + sl_ * SN + hk * SH + (STEP) * x);                        \
      if (ROWSCALE) SC[u] = SCL[kvq_scale_index(KIND, (long)pg_ * srows + sl_, heads_kv, hk, D, 8 * x)]; \
    }                                                                                          \
  }
#define LOAD_K(R, SC, KB, TPG) \
  LOAD_ROWS(R, SC, K_LOAD8, K_ZERO8, K_ROWSCALE, K_SCALE, HEAD_DIM, 1, k_scale, k, k_off, k_sb, k_sn, k_sh, KB, TPG, \
            K_STEP8)
#define LOAD_V(R, SC, KB, TPG) \
  LOAD_ROWS(R, SC, V_LOAD8, V_ZERO8, V_ROWSCALE, V_SCALE, HEAD_DIM_V, x < TPV, v_scale, v, v_off, v_sb, v_sn, v_sh, \
            KB, TPG, V_STEP8)

#if ASYNC_STAGES
/* Copies this work-item's KPT key rows of the tile at KB into the slot at byte
 * address SA (K) and SA + SLOT_BYTES / 2 (V); keys at or past kend are
 * zero-filled (a source size of 0 reads nothing; the address stays in bounds). */
#define ISSUE_ROWS(PTR, OFF, SB, SN, SH, KB, TPG, SA)                                                        \
  for (int u = 0; u < KPT; u++) {                                                                           \
    const int j = (KB) + u * KG + kg;                                                                       \
    int pg_ = 0, sl_ = 0;                                                                                   \
    uint nb_ = 0;                                                                                           \
    if (j < kend) {                                                                                         \
      KEY_ROW(j, pg_, sl_, TPG);                                                                            \
      nb_ = 16;                                                                                             \
    }                                                                                                       \
    cp_async16((SA) + (uint)(((u * KG + kg) * HEAD_DIM + 8 * x) * 2),                                       \
               (__global const ushort *)(PTR) + (OFF) + pg_ * (SB) + sl_ * (SN) + hk * (SH) + 8 * x, nb_); \
  }
#define ISSUE_TILE(KB, TPG, SA)                                                  \
  if ((KB) < kend) {                                                             \
    ISSUE_ROWS(k, k_off, k_sb, k_sn, k_sh, KB, TPG, SA)                          \
    ISSUE_ROWS(v, v_off, v_sb, v_sn, v_sh, KB, TPG, (SA) + SLOT_BYTES / 2)      \
  }                                                                              \
  cp_commit()
/* Key u of this work-item from the slot at local float offset SO (K) or
 * SO + SLOT_BYTES / 8 (V). */
#define SLOT_ROW(SO, u) (*(__local const ushort8 *)((__local const ushort *)(Sh + (SO)) + ((u) * KG + kg) * HEAD_DIM + 8 * x))
#endif

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void decode_attn(
    __global const store_t *q, long q_off, long q_sb, long q_sn, long q_sh,
    __global const kstore_t *k, long k_off, long k_sb, long k_sn, long k_sh,
    __global const vstore_t *v, long v_off, long v_sb, long v_sn, long v_sh,
    __global store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse,
    __global const int *seqlens, __global const uint *tree_mask, __global const int *block_table, int max_pages,
    int page_size, int num_pages,
    int capacity, int q_len, int group, int heads_q, int row_blocks, int num_splits, float scale_log2,
    __global float *work, long wo_off, long wl_off, int window_left, int window_right,
    __global const float *alibi, float softcap_in, float softcap_log2, __global const float *sinks,
    __global const float *k_scale, __global const float *v_scale, __global uint *counters) {
  /* partial dots [2][TPK][PSTR] (then the stage slots); at the end O partials [KG][ROWS][HEAD_DIM] */
  __local float Sh[SH_FLOATS] __attribute__((aligned(16)));
  __local float Sc[2 * SR];    /* scores [2][TILE][ROWS]; at the end row max / sum [KG][ROWS] each */

  const int tid = get_local_id(0);
  const int x = tid % TPK, kg = tid / TPK;
  const int split = get_group_id(0);
  const int hk = get_group_id(1) / row_blocks;
  const int rb = get_group_id(1) - hk * row_blocks;
  const int b = get_group_id(2);
  const int nrows = group * q_len;
  const int row0 = rb * ROWS;

  const int L = clamp(seqlens[b], 0, capacity);
  /* Scales: a tensor's or head's once here, a row's with its codes (LOAD_ROWS). */
  const int heads_kv = heads_q / group, srows = PAGED ? page_size : capacity;
  const float k_uni = K_UNISCALE ? k_scale[kvq_scale_index(K_SCALE, 0, heads_kv, hk, HEAD_DIM, 0)] : 1.0f;
  const float v_uni = V_UNISCALE ? v_scale[kvq_scale_index(V_SCALE, 0, heads_kv, hk, HEAD_DIM_V, 0)] : 1.0f;
  float ksc[KPT], vsc[KPT];
  for (int u = 0; u < KPT; u++) ksc[u] = vsc[u] = 1.0f;
  const int2 keys = dec_split_keys(L, q_len, window_left, split, num_splits, TILE);
  const int kstart = keys.x, kend = keys.y;

  float8 qr[ROWS], acc[ROWS];
  float m[ROWS], l[ROWS];
  for (int r = 0; r < ROWS; r++) {
    const int rg = row0 + r;
    float8 t8 = (float8)(0.0f);
    if (rg < nrows) {
      const int gi = rg / q_len, t = rg - (rg / q_len) * q_len;
      const long qi = q_off + b * q_sb + t * q_sn + (long)(hk * group + gi) * q_sh + 8 * x;
      /* Element by element, not (float8)(lo, hi): at -cl-opt-disable that
       * concatenation is a shufflevector with undef mask elements, on which
       * Oclgrind 21.10's --uninitialized crashes (docs/reliability.md). */
      const float4 lo = LOAD4(q, qi), hi = LOAD4(q, qi + 4);
      t8 = (float8)(lo.s0, lo.s1, lo.s2, lo.s3, hi.s0, hi.s1, hi.s2, hi.s3) * scale_log2;
    }
    qr[r] = t8;
    acc[r] = (float8)(0.0f);
    /* The sink is counted once per row, by key group 0 of split 0. The other
     * groups and splits start empty: a sink's max as their pivot would make the
     * sums of far keys (ALiBi) denormal, and 1 / sum infinite. */
    const float2 row_start = rg < nrows && kg == 0 && split == 0
                                 ? sv_row_start(sinks, hk * group + rg / q_len, M_LOG2E_F, 1)
                                 : (float2)(-INFINITY, 0.0f);
    m[r] = row_start.x;
    l[r] = row_start.y;
  }

#if ASYNC_STAGES
  const uint stg = SADDR(Sh + STG_OFF);
  for (int s = 0; s < ASYNC_STAGES - 1; s++) {
    const int kb = kstart + s * TILE;
    const int tp = TILE_PAGE(kb);
    ISSUE_TILE(kb, tp, stg + (uint)(s * SLOT_BYTES));
  }
  /* Page of the next tile to copy, read a tile ahead of its use. */
  int pga = TILE_PAGE(kstart + (ASYNC_STAGES - 1) * TILE);
  int slot = 0;
#else
  /* Pages of the current and the next tile (0 unless a tile never crosses a page). */
  int pg = TILE_PAGE(kstart);
  kraw8_t kr[KPT];
  LOAD_K(kr, ksc, kstart, pg)
  int pgn = TILE_PAGE(kstart + TILE);
#if PREFETCH >= 2
  vraw8_t vr[KPT];
  LOAD_V(vr, vsc, kstart, pg)
#endif
#endif
  int buf = 0;
  for (int k0 = kstart; k0 < kend; k0 += TILE) {
#if ASYNC_STAGES
    /* This tile's copies are done once at most S - 2 newer groups are pending;
     * then the slot the previous tile used takes the tile S - 1 ahead. */
    CP_WAIT(ASYNC_STAGES - 2);
    {
      const int kb = k0 + (ASYNC_STAGES - 1) * TILE, tp = pga;
      pga = TILE_PAGE(kb + TILE);
      const int ns = slot == 0 ? ASYNC_STAGES - 1 : slot - 1;
      ISSUE_TILE(kb, tp, stg + (uint)(ns * SLOT_BYTES));
    }
    const int so = STG_OFF + slot * (SLOT_BYTES / 4);
    raw8_t kr[KPT];
    for (int u = 0; u < KPT; u++) kr[u] = SLOT_ROW(so, u);
#else
    const int pgnn = TILE_PAGE(k0 + 2 * TILE);
#if PREFETCH < 2
    vraw8_t vr[KPT];
    LOAD_V(vr, vsc, k0, pg)
#endif
#endif
    /* Partial dots of this work-item's 8 elements. */
    __local float *P = Sh + buf * (TPK * PSTR) + x * PSTR;
    for (int u = 0; u < KPT; u++) {
      float8 kf = K_CVT8(kr[u]);
      if (K_QUANT) kf *= K_ROWSCALE ? ksc[u] : k_uni;
      for (int r = 0; r < ROWS; r++) P[(u * KG + kg) * ROWS + r] = dot8(qr[r], kf);
    }
#if !ASYNC_STAGES && PREFETCH >= 1
    LOAD_K(kr, ksc, k0 + TILE, pgn)
#endif
#if !ASYNC_STAGES && PREFETCH >= 2
    vraw8_t vn[KPT];
    float vsn[KPT];
    LOAD_V(vn, vsn, k0 + TILE, pgn)
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    /* Sum the partials of each (key, row); mask. */
    __local float *S = Sc + buf * SR;
    for (int e = tid; e < SR; e += NTHREADS) {
      __local const float *pp = Sh + buf * (TPK * PSTR) + e;
      float s = 0.0f;
      for (int xx = 0; xx < TPK; xx++) s += pp[xx * PSTR];
      const int c = e / ROWS, r = e - (e / ROWS) * ROWS, j = k0 + c, rg = row0 + r;
      const int vis =
          j < kend && rg < nrows && dec_key_visible(j, rg % q_len, L, q_len, b, tree_mask, window_left, window_right);
      const int pos = L - q_len + rg % q_len; /* the query's position */
      /* Hidden pairs include rows past nrows, whose head has no slope. */
      const float slope_log2 = ALIBI && vis ? alibi[hk * group + rg / q_len] * M_LOG2E_F : 0.0f;
      float th;
      s = sv_logit(s, 1.0f, softcap_in, softcap_log2, slope_log2, abs(j - pos), &th);
      S[e] = vis ? s : -INFINITY;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    /* Online softmax over this work-item's keys (the TPK work-items of a key group
     * keep identical m and l). */
    float pivot[ROWS];
    for (int r = 0; r < ROWS; r++) {
      float mx = m[r];
      for (int u = 0; u < KPT; u++) mx = fmax(mx, S[(u * KG + kg) * ROWS + r]);
      /* No visible key so far: pivot 0 keeps exp2(-inf - pivot) = 0, not NaN. */
      pivot[r] = mx == -INFINITY ? 0.0f : mx;
      const float alpha = exp2(m[r] - pivot[r]);
      m[r] = mx;
      l[r] *= alpha;
      acc[r] *= alpha;
    }
#if ASYNC_STAGES
    raw8_t vr[KPT];
    for (int u = 0; u < KPT; u++) vr[u] = SLOT_ROW(so + SLOT_BYTES / 8, u);
#endif
    for (int u = 0; u < KPT; u++) {
      float8 vf = V_CVT8(vr[u]);
      if (V_QUANT) vf *= V_ROWSCALE ? vsc[u] : v_uni;
      for (int r = 0; r < ROWS; r++) {
        const float p = exp2(S[(u * KG + kg) * ROWS + r] - pivot[r]);
        l[r] += p;
        acc[r] = mad((float8)(p), vf, acc[r]);
      }
    }
#if ASYNC_STAGES
    slot = slot == ASYNC_STAGES - 1 ? 0 : slot + 1;
#else
#if PREFETCH >= 2
    for (int u = 0; u < KPT; u++) {
      vr[u] = vn[u];
      if (V_ROWSCALE) vsc[u] = vsn[u];
    }
#endif
#if PREFETCH == 0
    LOAD_K(kr, ksc, k0 + TILE, pgn)
#endif
    pg = pgn;
    pgn = pgnn;
#endif
    buf ^= 1;
  }

#if ASYNC_STAGES
  /* The slots are reused below; copies of tiles past the range are empty groups. */
  CP_WAIT(0);
#endif
  /* Merge the KG key groups: rescale to the common max, sum through local memory. */
  barrier(CLK_LOCAL_MEM_FENCE);
  if (x == 0)
    for (int r = 0; r < ROWS; r++) Sc[kg * ROWS + r] = m[r];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int r = 0; r < ROWS; r++) {
    float mx = -INFINITY;
    for (int g = 0; g < KG; g++) mx = fmax(mx, Sc[g * ROWS + r]);
    const float w = mx == -INFINITY ? 0.0f : exp2(m[r] - mx);
    vstore8(acc[r] * w, 0, Sh + (kg * ROWS + r) * HEAD_DIM + 8 * x);
    if (x == 0) Sc[KG * ROWS + kg * ROWS + r] = l[r] * w;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int e = tid; e < ROWS * TPV; e += NTHREADS) {
    const int r = e / TPV, xx = e - (e / TPV) * TPV, rg = row0 + r;
    if (rg >= nrows) continue;
    float mx = -INFINITY, ls = 0.0f;
    float8 a = (float8)(0.0f);
    for (int g = 0; g < KG; g++) {
      mx = fmax(mx, Sc[g * ROWS + r]);
      ls += Sc[KG * ROWS + g * ROWS + r];
      a += vload8(0, Sh + (g * ROWS + r) * HEAD_DIM + 8 * xx);
    }
    const float inv = ls > 0.0f ? 1.0f / ls : 0.0f;
    a *= inv;
    const int gi = rg / q_len, t = rg - (rg / q_len) * q_len, hq = hk * group + gi;
#if SPLIT
    const long id = ((long)b * q_len + t) * heads_q + hq;
    vstore8(a, 0, work + wo_off + (id * num_splits + split) * HEAD_DIM_V + 8 * xx);
    if (xx == 0) work[wl_off + id * num_splits + split] = ls > 0.0f ? mx + log2(ls) : -INFINITY;
#else
    const long oi = o_off + b * o_sb + t * o_sn + (long)hq * o_sh + 8 * xx;
    STORE4(o, oi, a.lo);
    STORE4(o, oi + 4, a.hi);
    if (has_lse && xx == 0)
      lse[l_off + b * l_sb + t * l_sn + (long)hq * l_sh] = ls > 0.0f ? (mx + log2(ls)) * M_LN2_F : -INFINITY;
#endif
  }
#if SPLIT && MERGE_LAST
  {
    const int nr = min(ROWS, nrows - row0);
    int G, ng;
    if (sm_tail(counters, (long)b * get_num_groups(1) + get_group_id(1), num_splits, split, work, wo_off, wl_off, DV4,
                b, q_len, heads_q, hk, group, row0, nr, Sh, &G, &ng))
      for (int e = tid; e < nr * DV4; e += NTHREADS) {
        int t, hq;
        float l;
        const float4 a = sm_final(e, DV4, work, wo_off, num_splits, b, q_len, heads_q, hk, group, row0, Sh, G, ng,
                                  &t, &hq, &l);
        STORE4(o, o_off + b * o_sb + t * o_sn + (long)hq * o_sh + 4 * (e % DV4), a);
        if (has_lse && e % DV4 == 0) lse[l_off + b * l_sb + t * l_sn + (long)hq * l_sh] = l;
      }
  }
#endif
}

/* Global (MERGE_THREADS, q_len * heads_q, batch), local (MERGE_THREADS, 1, 1). The
 * splits are spread over the work-items (no serial chain of num_splits dependent
 * steps): the LSE max and the weight sum are tree reductions, then work-item
 * (sg, g) of MSG x DV4 sums splits sg, sg + MSG, ... of granule g. */
#define MSG (MERGE_THREADS / DV4)
__kernel __attribute__((reqd_work_group_size(MERGE_THREADS, 1, 1))) void decode_merge(
    __global const float *work, long wo_off, long wl_off, int num_splits, int q_len, int heads_q,
    __global store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse) {
  __local float W[MERGE_MAX_SPLITS];
  __local float Red[MERGE_THREADS];
  __local float4 Acc[MSG * DV4];
  const int tid = get_local_id(0);
  const int th = get_group_id(1), b = get_group_id(2);
  const int t = th / heads_q, hq = th - (th / heads_q) * heads_q;
  const long id = (long)b * q_len * heads_q + th;
  __global const float *wl = work + wl_off + id * num_splits;
  float m = -INFINITY;
  for (int s = tid; s < num_splits; s += MERGE_THREADS) {
    const float ls = wl[s];
    W[s] = ls;
    m = fmax(m, ls);
  }
  Red[tid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = MERGE_THREADS / 2; h > 0; h >>= 1) {
    if (tid < h) Red[tid] = fmax(Red[tid], Red[tid + h]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = Red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  float sum = 0.0f;
  for (int s = tid; s < num_splits; s += MERGE_THREADS) {
    const float ls = W[s];
    const float w = (m == -INFINITY || ls == -INFINITY) ? 0.0f : exp2(ls - m);
    W[s] = w;
    sum += w;
  }
  Red[tid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = MERGE_THREADS / 2; h > 0; h >>= 1) {
    if (tid < h) Red[tid] += Red[tid + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  sum = Red[0];
  const int sg = tid / DV4, g = tid - (tid / DV4) * DV4;
  if (sg < MSG) {
    float4 acc = (float4)(0.0f);
    /* A split with weight 0 (no visible key) holds o = 0, so it adds nothing. */
    for (int s = sg; s < num_splits; s += MSG)
      acc = mad((float4)(W[s]), vload4(0, work + wo_off + (id * num_splits + s) * HEAD_DIM_V + 4 * g), acc);
    Acc[sg * DV4 + g] = acc;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (tid < DV4) {
    float4 acc = Acc[tid];
    for (int i = 1; i < MSG; i++) acc += Acc[i * DV4 + tid];
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    STORE4(o, o_off + b * o_sb + t * o_sn + (long)hq * o_sh + 4 * tid, acc * inv);
    if (has_lse && tid == 0)
      lse[l_off + b * l_sb + t * l_sn + (long)hq * l_sh] = sum > 0.0f ? (m + log2(sum)) * M_LN2_F : -INFINITY;
  }
}
