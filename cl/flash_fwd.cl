/*
 * flash_fwd.cl: FlashAttention forward pass, portable OpenCL C 1.2.
 *
 * One work-group computes BLOCK_R query rows of one (sequence, query head). The Q
 * tile stays in local memory while the kernel walks K/V tiles of BLOCK_C rows,
 * keeping a running row max m, row sum l and output accumulator per row (the
 * online softmax of FlashAttention-2). Scores live in the log2 domain, with
 * log2(e) folded into the scale, so every exponential is exp2. Math is fp32.
 *
 * Tensors are strided views (batch, seq, head, dim) with unit dim stride; the
 * *_off arguments and strides are in elements. LSE is written in natural log.
 * Out-of-range keys and causally hidden keys are masked with -inf before the
 * exp; tiles past the causal diagonal are never loaded.
 *
 * Work-group: ROW_THREADS x COL_THREADS work-items (local id = ty * COL_THREADS + tx).
 * Each work-item owns a TM x TN block of the score tile and TM rows x TD columns
 * of the output, where TM = BLOCK_R / ROW_THREADS, TN = BLOCK_C / COL_THREADS and
 * TD = HEAD_DIM / COL_THREADS. Groups of four consecutive elements are
 * interleaved across work-items so neighbouring work-items touch neighbouring
 * local-memory words (no bank conflicts).
 *
 * Parameters (-D):
 *   DTYPE        0 = fp32, 1 = fp16, 2 = bf16 (storage only; fp16 through vload_half)
 *   HEAD_DIM     head dimension, multiple of COL_THREADS
 *   BLOCK_R      query rows per work-group (Br), multiple of ROW_THREADS
 *   BLOCK_C      key/value rows per tile (Bc), multiple of COL_THREADS
 *   ROW_THREADS, COL_THREADS   work-group shape
 *   CAUSAL       1: key j is visible to query i iff j <= i + (Nk - Nq)
 *   VARLEN       1: sequence bounds come from cu_seqlens_q/k
 */
#ifndef DTYPE
#define DTYPE 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef BLOCK_R
#define BLOCK_R 32
#endif
#ifndef BLOCK_C
#define BLOCK_C 32
#endif
#ifndef ROW_THREADS
#define ROW_THREADS 8
#endif
#ifndef COL_THREADS
#define COL_THREADS 8
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef VARLEN
#define VARLEN 0
#endif

#define TM (BLOCK_R / ROW_THREADS)
#define TN (BLOCK_C / COL_THREADS)
#define TD (HEAD_DIM / COL_THREADS)
#define NTHREADS (ROW_THREADS * COL_THREADS)

#if DTYPE == 0
typedef float store_t;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, x) ((p)[i] = (x))
#elif DTYPE == 1
typedef half store_t;
#define LOAD(p, i) vload_half((i), (p))
#define STORE(p, i, x) vstore_half_rte((x), (i), (p))
#else
typedef ushort store_t;
#define LOAD(p, i) as_float(((uint)(p)[i]) << 16)
#define STORE(p, i, x) ((p)[i] = bf16_from_float(x))
/* Round to nearest even; NaN stays a quiet NaN. */
inline ushort bf16_from_float(float x) {
  uint u = as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}
#endif

/* Index of a work-item's n-th element among `count` interleaved owners. */
#define SPREAD(owner, n, nthreads, per) \
  (((per) % 4 == 0) ? ((((n) >> 2) * (nthreads) + (owner)) * 4 + ((n) & 3)) : ((n) * (nthreads) + (owner)))
#define ROW_OF(ty, i) SPREAD(ty, i, ROW_THREADS, TM)
#define SCOL_OF(tx, j) SPREAD(tx, j, COL_THREADS, TN)
#define OCOL_OF(tx, c) SPREAD(tx, c, COL_THREADS, TD)

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1))) void flash_fwd(
    __global const store_t *q, long q_off, long q_sb, long q_sn, long q_sh,
    __global const store_t *k, long k_off, long k_sb, long k_sn, long k_sh,
    __global const store_t *v, long v_off, long v_sb, long v_sn, long v_sh,
    __global store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *lse, long l_off, long l_sb, long l_sn, long l_sh, int has_lse,
    int seqlen_q, int seqlen_k, int group, float scale_log2,
    __global const int *cu_q, __global const int *cu_k, int total_q, int total_k) {
  __local float Qs[HEAD_DIM * BLOCK_R]; /* [x][r]: transposed for the QK^T inner loop */
  __local float Ks[HEAD_DIM * BLOCK_C]; /* [x][c] */
  __local float Vs[BLOCK_C * HEAD_DIM]; /* [c][x] */
  __local float Ps[BLOCK_C * BLOCK_R];  /* [c][r] */
  __local float Red[BLOCK_R * COL_THREADS];

  const int tid = get_local_id(0);
  const int tx = tid % COL_THREADS;
  const int ty = tid / COL_THREADS;
  const int q0 = get_group_id(0) * BLOCK_R;
  const int h = get_group_id(1);
  const int b = get_group_id(2);
  const int hk = h / group;

  int nq = seqlen_q, nk = seqlen_k;
  long bq = b, row_q = 0, row_k = 0;
#if VARLEN
  {
    /* Clamp so that corrupt cu_seqlens can never reach outside the tensors. */
    int qs = clamp(cu_q[b], 0, total_q), qe = clamp(cu_q[b + 1], 0, total_q);
    int ks = clamp(cu_k[b], 0, total_k), ke = clamp(cu_k[b + 1], 0, total_k);
    nq = min(max(qe - qs, 0), seqlen_q);
    nk = min(max(ke - ks, 0), seqlen_k);
    row_q = qs;
    row_k = ks;
    bq = 0;
  }
#endif
  if (q0 >= nq) return; /* whole work-group leaves together */

  const long qbase = q_off + bq * q_sb + row_q * q_sn + (long)h * q_sh;
  const long kbase = k_off + bq * k_sb + row_k * k_sn + (long)hk * k_sh;
  const long vbase = v_off + bq * v_sb + row_k * v_sn + (long)hk * v_sh;
  const int diag = nk - nq;

  for (int e = tid; e < BLOCK_R * HEAD_DIM; e += NTHREADS) {
    int r = e / HEAD_DIM, x = e - r * HEAD_DIM;
    Qs[x * BLOCK_R + r] = (q0 + r < nq) ? LOAD(q, qbase + (long)(q0 + r) * q_sn + x) : 0.0f;
  }

  float acc[TM][TD];
  float m_i[TM], l_i[TM];
  for (int i = 0; i < TM; i++) {
    m_i[i] = -INFINITY;
    l_i[i] = 0.0f;
    for (int c = 0; c < TD; c++) acc[i][c] = 0.0f;
  }

  int kend = nk;
#if CAUSAL
  kend = min(nk, q0 + BLOCK_R + diag); /* last visible key of the tile's last row, + 1 */
#endif
  for (int k0 = 0; k0 < kend; k0 += BLOCK_C) {
    barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile is fully consumed */
    for (int e = tid; e < BLOCK_C * HEAD_DIM; e += NTHREADS) {
      int c = e / HEAD_DIM, x = e - c * HEAD_DIM;
      int in = k0 + c < nk;
      /* Zero padding, never garbage: P is 0 there, but 0 * NaN would be NaN. */
      Ks[x * BLOCK_C + c] = in ? LOAD(k, kbase + (long)(k0 + c) * k_sn + x) : 0.0f;
      Vs[c * HEAD_DIM + x] = in ? LOAD(v, vbase + (long)(k0 + c) * v_sn + x) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    float s[TM][TN];
    for (int i = 0; i < TM; i++)
      for (int j = 0; j < TN; j++) s[i][j] = 0.0f;
    for (int x = 0; x < HEAD_DIM; x++) {
      float qa[TM], kb[TN];
      for (int i = 0; i < TM; i++) qa[i] = Qs[x * BLOCK_R + ROW_OF(ty, i)];
      for (int j = 0; j < TN; j++) kb[j] = Ks[x * BLOCK_C + SCOL_OF(tx, j)];
      for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++) s[i][j] = mad(qa[i], kb[j], s[i][j]);
    }

    const int need_mask = (k0 + BLOCK_C > nk) || (CAUSAL && k0 + BLOCK_C - 1 > q0 + diag);
    for (int i = 0; i < TM; i++) {
      float pm = -INFINITY;
      for (int j = 0; j < TN; j++) {
        float sv = s[i][j] * scale_log2;
        if (need_mask) {
          int col = k0 + SCOL_OF(tx, j);
          int row = q0 + ROW_OF(ty, i);
          if (col >= nk || (CAUSAL && col > row + diag)) sv = -INFINITY;
        }
        s[i][j] = sv;
        pm = fmax(pm, sv);
      }
      Red[ROW_OF(ty, i) * COL_THREADS + tx] = pm;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int i = 0; i < TM; i++) {
      const int r = ROW_OF(ty, i);
      float mx = m_i[i];
      for (int t = 0; t < COL_THREADS; t++) mx = fmax(mx, Red[r * COL_THREADS + t]);
      /* A row with no visible key so far keeps m = -inf; use 0 as the pivot so
       * that exp2(-inf - pivot) = 0 instead of exp2(-inf + inf) = NaN. */
      const float pivot = (mx == -INFINITY) ? 0.0f : mx;
      const float alpha = exp2(m_i[i] - pivot);
      m_i[i] = mx;
      float psum = 0.0f;
      for (int j = 0; j < TN; j++) {
        float p = exp2(s[i][j] - pivot);
        psum += p;
        Ps[SCOL_OF(tx, j) * BLOCK_R + r] = p;
      }
      l_i[i] = l_i[i] * alpha + psum;
      for (int c = 0; c < TD; c++) acc[i][c] *= alpha;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    const int jmax = min(BLOCK_C, kend - k0);
    for (int j = 0; j < jmax; j++) {
      float pa[TM], vb[TD];
      for (int i = 0; i < TM; i++) pa[i] = Ps[j * BLOCK_R + ROW_OF(ty, i)];
      for (int c = 0; c < TD; c++) vb[c] = Vs[j * HEAD_DIM + OCOL_OF(tx, c)];
      for (int i = 0; i < TM; i++)
        for (int c = 0; c < TD; c++) acc[i][c] = mad(pa[i], vb[c], acc[i][c]);
    }
  }

  /* Each work-item summed only its own columns of P: combine the partial sums. */
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = 0; i < TM; i++) Red[ROW_OF(ty, i) * COL_THREADS + tx] = l_i[i];
  barrier(CLK_LOCAL_MEM_FENCE);

  const long obase = o_off + bq * o_sb + row_q * o_sn + (long)h * o_sh;
  for (int i = 0; i < TM; i++) {
    const int r = ROW_OF(ty, i);
    if (q0 + r >= nq) continue;
    float l = 0.0f;
    for (int t = 0; t < COL_THREADS; t++) l += Red[r * COL_THREADS + t];
    /* A row that sees no key: O = 0 and LSE = -inf, never NaN. */
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const long orow = obase + (long)(q0 + r) * o_sn;
    for (int c = 0; c < TD; c++) STORE(o, orow + OCOL_OF(tx, c), acc[i][c] * inv);
    if (has_lse && tx == 0) {
      float val = l > 0.0f ? (m_i[i] + log2(l)) * M_LN2_F : -INFINITY;
      lse[l_off + bq * l_sb + (row_q + q0 + r) * l_sn + (long)h * l_sh] = val;
    }
  }
}
