/*
 * decode.cl: attention of a few new query tokens per sequence against a paged or
 * contiguous KV cache, split over the keys (FlashDecoding). Math is fp32; scores
 * live in the log2 domain (log2(e) folded into the scale, which is applied to Q
 * once when it is staged), so every exponential is exp2.
 *
 * decode_attn: work-group (split, kv head * row block, sequence). Its rows are the
 *   G * q_len (query head of the kv head's GQA group, query token) pairs, row
 *   r = gi * q_len + t for query head hk * G + gi and token t, ROWS of them per row
 *   block. The K and V tiles (BLOCK_C keys) are staged in local memory once and
 *   used by every row, so the query heads of a group share each tile load.
 *   Split s of num_splits covers keys [s * chunk, min((s + 1) * chunk, L)) with
 *   chunk = ceil(L / num_splits) rounded up to BLOCK_C, L the sequence's KV length.
 *   Query t sees key j iff j <= L - q_len + t (bottom-right causal). A row that
 *   sees no key in its range gets o = 0 and lse = -inf.
 *   SPLIT = 0: writes o (normalised) and lse (natural log) directly.
 *   SPLIT = 1: writes the partial (o normalised, fp32) and its log2-domain LSE to
 *     the workspace: row id = (b * q_len + t) * heads_q + hq,
 *     work[wo_off + (id * num_splits + s) * HEAD_DIM + x], work[wl_off + id * num_splits + s].
 * decode_merge: work-group (HEAD_DIM/4 work-items) per row id: merges the
 *   num_splits partials (the associative merge of merge.cl) into o and lse.
 *
 * Mappings (NTHREADS work-items):
 *   S = Q K^T: work-item (sr = tid / SL, lane = tid % SL), sr < ROWS, owns the
 *     S_TN = BLOCK_C / SL scores of row sr and keys lane + j * SL; it keeps the
 *     row's running max and a partial row sum of its own keys (combined at the end).
 *   O += P V: float4 granule e = tid + i * NTHREADS of the ROWS x HEAD_DIM/4
 *     output, row e / (HEAD_DIM/4).
 * Local memory: Qs [ROWS][D4] float4, KVs [BLOCK_C][D4 + 1] float4 (padded rows:
 *   the S phase reads different keys' rows at one column), Ps [ROWS][BLOCK_C],
 *   Red [ROWS][SL], Alpha [ROWS], Page/Slot [BLOCK_C] (the tile's key addresses).
 *
 * Paged (PAGED = 1): key j of sequence b is slot j % page_size of page
 *   block_table[b * max_pages + j / page_size], clamped to [0, num_pages); the
 *   cache tensors are (num_pages, page_size, Hkv, d). Contiguous: page b, slot j.
 * L = clamp(seqlens[b], 0, capacity).
 *
 * Parameters (-D): DTYPE (0 = fp32, 1 = fp16, 2 = bf16; storage only), HEAD_DIM (multiple of 4), ROWS, BLOCK_C,
 *   NTHREADS, SL (ROWS * SL <= NTHREADS, BLOCK_C % SL == 0), SPLIT, PAGED.
 */
/* Storage-type helpers (the same in every kernel file, so each file compiles on
 * its own): store_t, raw_t, LOAD4 and STORE4 on element index i. */
#ifndef DTYPE_IO_CL
#define DTYPE_IO_CL

#ifndef DTYPE
#define DTYPE 0
#endif

#if DTYPE == 0
typedef float store_t;
typedef uint raw_t;
#define LOAD4(p, i) vload4(0, (p) + (i))
#define STORE4(p, i, x) vstore4((x), 0, (p) + (i))
#elif DTYPE == 1
typedef half store_t;
typedef ushort raw_t;
#define LOAD4(p, i) vload_half4(0, (p) + (i))
#define STORE4(p, i, x) vstore_half4_rte((x), 0, (p) + (i))
#else
typedef ushort store_t;
typedef ushort raw_t;
inline ushort fcl_bf16_from_float(float x) {
  uint u = as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}
#define LOAD4(p, i) as_float4(convert_uint4(vload4(0, (p) + (i))) << 16)
inline ushort4 fcl_bf16x4_from_float4(float4 f) {
  return (ushort4)(fcl_bf16_from_float(f.x), fcl_bf16_from_float(f.y), fcl_bf16_from_float(f.z),
                   fcl_bf16_from_float(f.w));
}
#define STORE4(p, i, x) vstore4(fcl_bf16x4_from_float4(x), 0, (p) + (i))
#endif

#endif

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef ROWS
#define ROWS 8
#endif
#ifndef BLOCK_C
#define BLOCK_C 64
#endif
#ifndef NTHREADS
#define NTHREADS 128
#endif
#ifndef SL
#define SL 16
#endif
#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef PAGED
#define PAGED 0
#endif

#define D4 (HEAD_DIM / 4)
#define KV_LD (D4 + 1)
#define S_TN (BLOCK_C / SL)
#define O_ELEMS (ROWS * D4)
#define O_PER ((O_ELEMS + NTHREADS - 1) / NTHREADS)

#if ROWS * SL > NTHREADS || BLOCK_C % SL || HEAD_DIM % 4
#error "inconsistent decode_attn mapping"
#endif

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void decode_attn(
    __global const store_t *q, long q_off, long q_sb, long q_sn, long q_sh,
    __global const store_t *k, long k_off, long k_sb, long k_sn, long k_sh,
    __global const store_t *v, long v_off, long v_sb, long v_sn, long v_sh,
    __global store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse,
    __global const int *seqlens, __global const int *block_table, int max_pages, int page_size, int num_pages,
    int capacity, int q_len, int group, int heads_q, int row_blocks, int num_splits, float scale_log2,
    __global float *work, long wo_off, long wl_off) {
  __local float4 Qs[ROWS * D4];
  __local float4 KVs[BLOCK_C * KV_LD];
  __local float Ps[ROWS * BLOCK_C];
  __local float Red[ROWS * SL];
  __local float Alpha[ROWS];
  __local int Page[BLOCK_C], Slot[BLOCK_C];

  const int tid = get_local_id(0);
  const int split = get_group_id(0);
  const int hk = get_group_id(1) / row_blocks;
  const int rb = get_group_id(1) - hk * row_blocks;
  const int b = get_group_id(2);
  const int nrows = group * q_len;
  const int row0 = rb * ROWS;

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

  for (int e = tid; e < ROWS * D4; e += NTHREADS) {
    const int r = e / D4, g = e - (e / D4) * D4, rg = row0 + r;
    float4 x = (float4)(0.0f);
    if (rg < nrows) {
      const int gi = rg / q_len, t = rg - (rg / q_len) * q_len;
      x = LOAD4(q, q_off + b * q_sb + t * q_sn + (long)(hk * group + gi) * q_sh + 4 * g) * scale_log2;
    }
    Qs[e] = x;
  }

  const int sr = tid / SL, lane = tid - (tid / SL) * SL;
  const int s_active = sr < ROWS;
  int lim = -1; /* last key row sr sees */
  if (s_active && row0 + sr < nrows) lim = L - q_len + (row0 + sr) % q_len;
  float m_s = -INFINITY, l_s = 0.0f;
  float4 acc[O_PER];
  for (int i = 0; i < O_PER; i++) acc[i] = (float4)(0.0f);

  for (int k0 = kstart; k0 < kend; k0 += BLOCK_C) {
    barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile is fully consumed */
    if (tid < BLOCK_C) {
      const int j = k0 + tid;
      int pg = -1, sl = 0;
      if (j < kend) {
#if PAGED
        pg = clamp(block_table[(long)b * max_pages + j / page_size], 0, num_pages - 1);
        sl = j - (j / page_size) * page_size;
#else
        pg = b;
        sl = j;
#endif
      }
      Page[tid] = pg;
      Slot[tid] = sl;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = tid; e < BLOCK_C * D4; e += NTHREADS) {
      const int c = e / D4, g = e - (e / D4) * D4, pg = Page[c];
      KVs[c * KV_LD + g] =
          pg >= 0 ? LOAD4(k, k_off + pg * k_sb + Slot[c] * k_sn + hk * k_sh + 4 * g) : (float4)(0.0f);
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* K ready */

    float s[S_TN];
    if (s_active) {
      float pm = -INFINITY;
      for (int jj = 0; jj < S_TN; jj++) {
        const int c = lane + jj * SL;
        float a = 0.0f;
        for (int g = 0; g < D4; g++) a += dot(Qs[sr * D4 + g], KVs[c * KV_LD + g]);
        if (k0 + c >= kend || k0 + c > lim) a = -INFINITY;
        s[jj] = a;
        pm = fmax(pm, a);
      }
      Red[sr * SL + lane] = pm;
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* partial maxima ready, K consumed */
    if (s_active) {
      float mx = m_s;
      for (int t = 0; t < SL; t++) mx = fmax(mx, Red[sr * SL + t]);
      /* No visible key so far: pivot 0 keeps exp2(-inf - pivot) = 0, not NaN. */
      const float pivot = mx == -INFINITY ? 0.0f : mx;
      const float alpha = exp2(m_s - pivot);
      m_s = mx;
      float psum = 0.0f;
      for (int jj = 0; jj < S_TN; jj++) {
        const float p = exp2(s[jj] - pivot);
        Ps[sr * BLOCK_C + lane + jj * SL] = p;
        psum += p;
      }
      l_s = l_s * alpha + psum;
      if (lane == 0) Alpha[sr] = alpha;
    }
    for (int e = tid; e < BLOCK_C * D4; e += NTHREADS) {
      const int c = e / D4, g = e - (e / D4) * D4, pg = Page[c];
      KVs[c * KV_LD + g] =
          pg >= 0 ? LOAD4(v, v_off + pg * v_sb + Slot[c] * v_sn + hk * v_sh + 4 * g) : (float4)(0.0f);
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* P, V and the rescale factors ready */
    for (int i = 0; i < O_PER; i++) {
      const int e = tid + i * NTHREADS;
      if (O_ELEMS % NTHREADS == 0 || e < O_ELEMS) {
        const int r = e / D4, g = e - (e / D4) * D4;
        float4 a = acc[i] * Alpha[r];
        for (int c = 0; c < BLOCK_C; c++) a = mad((float4)(Ps[r * BLOCK_C + c]), KVs[c * KV_LD + g], a);
        acc[i] = a;
      }
    }
  }

  /* Combine the S work-items' partial row sums; Alpha takes the row max. */
  barrier(CLK_LOCAL_MEM_FENCE);
  if (s_active) {
    Red[sr * SL + lane] = l_s;
    if (lane == 0) Alpha[sr] = m_s;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = 0; i < O_PER; i++) {
    const int e = tid + i * NTHREADS;
    if (e >= O_ELEMS) break;
    const int r = e / D4, g = e - (e / D4) * D4, rg = row0 + r;
    if (rg >= nrows) continue;
    float l = 0.0f;
    for (int t = 0; t < SL; t++) l += Red[r * SL + t];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int gi = rg / q_len, t = rg - (rg / q_len) * q_len, hq = hk * group + gi;
#if SPLIT
    const long id = ((long)b * q_len + t) * heads_q + hq;
    vstore4(acc[i] * inv, 0, work + wo_off + (id * num_splits + split) * HEAD_DIM + 4 * g);
    if (g == 0) work[wl_off + id * num_splits + split] = l > 0.0f ? Alpha[r] + log2(l) : -INFINITY;
#else
    STORE4(o, o_off + b * o_sb + t * o_sn + (long)hq * o_sh + 4 * g, acc[i] * inv);
    if (has_lse && g == 0)
      lse[l_off + b * l_sb + t * l_sn + (long)hq * l_sh] = l > 0.0f ? (Alpha[r] + log2(l)) * M_LN2_F : -INFINITY;
#endif
  }
}

/* Global (D4, q_len * heads_q, batch), local (D4, 1, 1). */
__kernel __attribute__((reqd_work_group_size(D4, 1, 1))) void decode_merge(
    __global const float *work, long wo_off, long wl_off, int num_splits, int q_len, int heads_q,
    __global store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse) {
  const int g = get_local_id(0);
  const int th = get_group_id(1), b = get_group_id(2);
  const int t = th / heads_q, hq = th - (th / heads_q) * heads_q;
  const long id = (long)b * q_len * heads_q + th;
  __global const float *wl = work + wl_off + id * num_splits;
  float m = -INFINITY;
  for (int s = 0; s < num_splits; s++) m = fmax(m, wl[s]);
  float sum = 0.0f;
  float4 acc = (float4)(0.0f);
  if (m != -INFINITY) {
    for (int s = 0; s < num_splits; s++) {
      const float ls = wl[s];
      if (ls == -INFINITY) continue;
      const float w = exp2(ls - m);
      sum += w;
      acc = mad((float4)(w), vload4(0, work + wo_off + (id * num_splits + s) * HEAD_DIM + 4 * g), acc);
    }
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  STORE4(o, o_off + b * o_sb + t * o_sn + (long)hq * o_sh + 4 * g, acc * inv);
  if (has_lse && g == 0)
    lse[l_off + b * l_sb + t * l_sn + (long)hq * l_sh] = sum > 0.0f ? (m + log2(sum)) * M_LN2_F : -INFINITY;
}
