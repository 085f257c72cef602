/*
 * naive.cl: the helper kernels of the naive baseline (Algorithm 0 of the paper).
 *
 * The baseline materialises S = scale * Q K^T and P = softmax(S) in device
 * memory as fp32 and multiplies with CLBlast; these kernels move data between
 * the caller's strided tensors and the dense fp32 layout the GEMMs use:
 *   dense[s][h][n][x], s < sequences, h < heads, n < padded length, x < the
 * tensor's head dim (HEAD_DIM for q and k, HEAD_DIM_V for v, o and dO: the
 * pack and unpack kernels take it as their global size 0), with rows past a
 * sequence's length set to zero. Query heads of one GQA group
 * are adjacent (h = kv_head * group + g), so Q of a group is one tall matrix.
 *
 * Parameters (-D):
 *   DTYPE      0 = fp32, 1 = fp16, 2 = bf16 (storage type of the caller's tensors)
 *   HEAD_DIM   head dimension of q and k
 *   HEAD_DIM_V head dimension of v, o and dO (default HEAD_DIM): naive_ds's
 *              D = rowsum(dO * O) runs over it
 *   CAUSAL     1: key j is visible to query i iff j <= i + (Nk - Nq)
 *   VARLEN     1: sequence bounds come from cu_seqlens
 *   WG         work-group size of naive_softmax (power of two)
 *   DROPOUT    1: apply the dropout mask of philox.cl (compiled first in the
 *              same program)
 *   WINDOW     1: key j is visible to query i iff
 *              i + diag - window_left <= j <= i + diag + window_right (diag = Nk - Nq;
 *              both >= 0, causal folded into window_right; build with CAUSAL=0)
 *   ALIBI      1: score -= alibi[h] * |j - (i + diag)| (after the softcap)
 *   SOFTCAP    1: score = softcap * tanh(score / softcap) on the scaled score
 *              (before ALiBi and the masks); naive_ds then multiplies dS by
 *              1 - tanh^2, reading the scaled scores from `raw`
 *   MASK       1: block mask, 2: bit mask (mask.cl, compiled first in the same
 *              program); naive_softmax hides key j of query i when its bit is 0
 *   SINKS      1: naive_softmax adds the row's sink (score_variant.cl) to its max and sum
 *   PAGED_KV   1: paged K/V source (see flash_fwd.cl): naive_pack_paged gathers K/V
 *              (naive_pack_paged_q from a quantized pool, with kv_quant.cl joined in front)
 *              from the page pools, and naive_softmax takes a trailing kv_lens
 *              argument (sequence s has clamp(kv_lens[s], 0, padded_k) keys)
 *
 * requires: dtype.cl seq_bounds.cl score_variant.cl
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V HEAD_DIM
#endif
#ifndef WG
#define WG 64
#endif
#ifndef DROPOUT
#define DROPOUT 0
#endif
#if PAGED_KV
#define NAIVE_PAGED_PARAMS , __global const int *kv_lens
#else
#define NAIVE_PAGED_PARAMS
#endif

/* Global size (the tensor's head dim, padded, sequences * heads). */
__kernel void naive_pack(__global const store_t *src, long off, long sb, long sn, long sh,
                         __global float *dst, int heads, int padded, __global const int *cu, int total) {
  const int x = get_global_id(0), n = get_global_id(1), sh_id = get_global_id(2);
  const int s = sh_id / heads, h = sh_id - s * heads;
  const int2 r = fcl_seq_rows(cu, s, padded, total);
  float val = 0.0f;
  if (n < r.y) {
    long bs = VARLEN ? 0 : s;
    val = LOAD(src, off + bs * sb + (long)(r.x + n) * sn + (long)h * sh + x);
  }
  dst[((long)sh_id * padded + n) * get_global_size(0) + x] = val;
}

/* One work-group per score row: masked softmax in place, natural-log LSE out.
 * Rows past the sequence and rows that see no key become all-zero with
 * LSE = -inf (a real row with SINKS: LSE = its sink). */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void naive_softmax(
    __global float *scores, __global float *lse_ws, int heads, int padded_q, int padded_k,
    __global const int *cu_q, __global const int *cu_k, int total_q, int total_k, int window_left,
    int window_right, __global const float *alibi, float softcap, __global const float *sinks,
    __global const uint *mask, long mask_bs, long mask_hs, int mask_words, int mask_bq,
    int mask_bk NAIVE_PAGED_PARAMS) {
  __local float red[WG];
  const long row = get_group_id(0);
  const int lid = get_local_id(0);
  const int i = (int)(row % padded_q);
  const int s = (int)(row / ((long)padded_q * heads));
  fcl_seq sb = fcl_seq_bounds(cu_q, cu_k, s, padded_q, padded_k, total_q, total_k);
#if PAGED_KV
  sb = fcl_seq_paged_keys(sb, kv_lens, s, padded_k);
#endif
  const int nq = sb.nq, nk = sb.nk, diag = sb.diag;
  /* The row's keys [first, visible) (sv_visible as a range); rows past nq have none. */
  const int2 keys = sv_key_range(i, 1, diag, nk, window_left, window_right, 1);
  const int visible = i < nq ? max(keys.y, 0) : 0, first = keys.x;
  __global float *p = scores + row * padded_k;
#if MASK
  const int mh = (int)((row / padded_q) % heads);
  __global const uint *mseq = mask + s * mask_bs + mh * mask_hs;
#define VIS(j) (j >= first && mask_ok(mseq, mask_words, mask_bq, mask_bk, i, (j)))
#else
#define VIS(j) (j >= first)
#endif

#if ALIBI || SOFTCAP
  {
    /* The scores are scaled already (natural units): sv_logit's scale is 1. */
    const float slope = ALIBI ? alibi[(row / padded_q) % heads] : 0.0f;
    const float cap_in = SOFTCAP ? 1.0f / softcap : 0.0f;
    /* Each work-item rewrites only entries it reads again below (same j = lid + t * WG). */
    for (int j = lid; j < visible; j += WG) {
      if (j < first) continue;
      float th;
      p[j] = sv_logit(p[j], 1.0f, cap_in, softcap, slope, abs(j - (i + diag)), &th);
    }
  }
#endif

  float m = -INFINITY;
  for (int j = lid; j < visible; j += WG)
    if (VIS(j)) m = fmax(m, p[j]);
  red[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = WG / 2; w > 0; w >>= 1) {
    if (lid < w) red[lid] = fmax(red[lid], red[lid + w]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  /* The row's sink (a real row only) joins the max and, below, the sum. */
  const float2 sink = sv_row_start(sinks, (int)((row / padded_q) % heads), 1.0f, i < nq);
  if (i < nq) m = fmax(m, sink.x);

  float l = 0.0f;
  for (int j = lid; j < visible; j += WG)
    if (VIS(j)) l += exp(p[j] - m);
  red[lid] = l;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = WG / 2; w > 0; w >>= 1) {
    if (lid < w) red[lid] += red[lid + w];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  l = red[0];
  if (sink.y > 0.0f) l += exp(sink.x - m);

  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int j = lid; j < padded_k; j += WG) p[j] = (j < visible && VIS(j)) ? exp(p[j] - m) * inv : 0.0f;
  if (lid == 0) lse_ws[row] = l > 0.0f ? m + log(l) : -INFINITY;
}

/* Global size (the tensor's head dim, padded_q, sequences * heads). Writes only real rows. */
__kernel void naive_unpack(__global const float *src, __global const float *lse_ws,
                           __global store_t *dst, long off, long sb, long sn, long sh,
                           __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse,
                           int heads, int padded, __global const int *cu, int total) {
  const int x = get_global_id(0), n = get_global_id(1), sh_id = get_global_id(2);
  const int s = sh_id / heads, h = sh_id - s * heads;
  const int2 r = fcl_seq_rows(cu, s, padded, total);
  if (n >= r.y) return;
  const long bs = VARLEN ? 0 : s;
  const long row = (long)sh_id * padded + n;
  STORE(dst, off + bs * sb + (long)(r.x + n) * sn + (long)h * sh + x, src[row * get_global_size(0) + x]);
  if (has_lse && x == 0) lse[l_off + bs * l_sb + (long)(r.x + n) * l_sn + (long)h * l_sh] = lse_ws[row];
}

/* Backward: dS = scale * P * (dP - D) in place over dP, one work-group per row,
 * with D = rowsum(dO * O) from the dense fp32 copies. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void naive_ds(
    __global const float *probs, __global float *dprobs, __global const float *o, __global const float *dout,
    int padded_q, int padded_k, float scale, ulong seed, ulong offset, uint threshold, float keep_scale,
    __global const float *raw, float softcap) {
  __local float red[WG];
  const long row = get_group_id(0);
  const int lid = get_local_id(0);
  float acc = 0.0f;
  for (int x = lid; x < HEAD_DIM_V; x += WG) acc = mad(o[row * HEAD_DIM_V + x], dout[row * HEAD_DIM_V + x], acc);
  red[lid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = WG / 2; w > 0; w >>= 1) {
    if (lid < w) red[lid] += red[lid + w];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float dsum = red[0];
  for (int j = lid; j < padded_k; j += WG) {
    const long e = row * padded_k + j;
    float dp = dprobs[e];
#if DROPOUT
    dp = dropout_keep(seed, offset, (ulong)(row / padded_q), (uint)(row % padded_q), (uint)j, threshold)
             ? dp * keep_scale : 0.0f;
#endif
    const float t = SOFTCAP ? SV_TANH(raw[e] / softcap) : 0.0f; /* sv_logit's t */
    dprobs[e] = scale * probs[e] * (dp - dsum) * sv_logit_grad(t);
  }
}

#if DROPOUT
/* Global (padded_k, padded_q, sequences * heads_q): dst = P * Z / (1 - p).
 * dst may be src (each work-item touches one element). */
__kernel void naive_dropout(__global const float *src, __global float *dst, int padded_q, int padded_k, ulong seed,
                            ulong offset, uint threshold, float keep_scale) {
  const int j = get_global_id(0), i = get_global_id(1), bh = get_global_id(2);
  const long e = ((long)bh * padded_q + i) * padded_k + j;
  dst[e] = dropout_keep(seed, offset, (ulong)bh, (uint)i, (uint)j, threshold) ? src[e] * keep_scale : 0.0f;
}
#endif

#if PAGED_KV
/* Global size (the tensor's head dim, padded, sequences * heads): naive_pack from page pools
 * (num_pages, page_size, heads, d): row n of sequence s is slot n % page_size of
 * page block_table[s * max_pages + n / page_size] (clamped to [0, num_pages)); rows
 * at or past clamp(kv_lens[s], 0, padded) are zero. */
__kernel void naive_pack_paged(__global const store_t *src, long off, long sb, long sn, long sh,
                               __global float *dst, int heads, int padded, __global const int *block_table,
                               int page_size, int max_pages, int num_pages, __global const int *kv_lens) {
  const int x = get_global_id(0), n = get_global_id(1), sh_id = get_global_id(2);
  const int s = sh_id / heads, h = sh_id - s * heads;
  float val = 0.0f;
  if (n < clamp(kv_lens[s], 0, padded)) {
    const int pi = n / page_size;
    const int pg = clamp(block_table[(long)s * max_pages + pi], 0, num_pages - 1);
    val = LOAD(src, off + (long)pg * sb + (long)(n - pi * page_size) * sn + (long)h * sh + x);
  }
  dst[((long)sh_id * padded + n) * get_global_size(0) + x] = val;
}

#ifdef KV_QUANT_CL
/* naive_pack_paged from a pool in a quantized cache format (kv_quant.cl, joined
 * in front for such a call): element x of a row is code * its scale in fp32,
 * the scale of layout `kind` for cache row page * page_size + slot. Global
 * (d, ...): d is the row's elements, twice the pool's bytes for int4. */
__kernel void naive_pack_paged_q(__global const uchar *src, long off, long sb, long sn, long sh,
                                 __global float *dst, int heads, int padded, __global const int *block_table,
                                 int page_size, int max_pages, int num_pages, __global const int *kv_lens,
                                 __global const float *scale, int fmt, int kind) {
  const int x = get_global_id(0), n = get_global_id(1), sh_id = get_global_id(2);
  const int s = sh_id / heads, h = sh_id - s * heads;
  float val = 0.0f;
  if (n < clamp(kv_lens[s], 0, padded)) {
    const int pi = n / page_size, slot = n - pi * page_size;
    const int pg = clamp(block_table[(long)s * max_pages + pi], 0, num_pages - 1);
    /* int4 (two codes a byte): element x is byte x / 2's low or high nibble. */
    const int i4 = fmt == KVQ_I4;
    const uchar byte = src[off + (long)pg * sb + (long)slot * sn + (long)h * sh + (i4 ? x / 2 : x)];
    const uchar code = i4 ? (uchar)((x & 1) ? byte >> 4 : byte & 15) : byte;
    const long row = (long)pg * page_size + slot;
    val = kvq_decode8((uchar8)(code), fmt).s0 *
          scale[kvq_scale_index(kind, row, heads, h, (int)get_global_size(0), x)];
  }
  dst[((long)sh_id * padded + n) * get_global_size(0) + x] = val;
}
#endif
#endif
