/*
 * flash_bwd.cl: FlashAttention backward pass, portable OpenCL C 1.2.
 *
 * P is never stored: each kernel recomputes it from Q, K and the forward's LSE,
 * P_ij = exp2(scale_log2 * q_i.k_j - lse_i * log2(e)), with the forward's masks
 * applied as -inf before the exp2 (a masked entry must be exactly 0: with
 * garbage there, 0 * inf would give NaN). Rows whose LSE is -inf saw no key and
 * contribute nothing.
 *
 *   bwd_preprocess  D_i = rowsum(dO_i * O_i)                        (O(N d))
 *   bwd_dkdv        one work-item per key row; its k, v, dk, dv stay in
 *                   registers while Q/dO tiles stream through local memory.
 *                   With GQA it loops over every query head of its group, so dk
 *                   and dv come out summed without atomics. ATOMIC_DQ = 1 also
 *                   accumulates dQ into an fp32 buffer with compare-and-swap.
 *   bwd_dq          one work-item per query row, K/V tiles in local memory
 *                   (the deterministic dQ).
 *   bwd_dq_store    converts the fp32 atomic dQ accumulator to the output dtype.
 *
 * Tensors are strided views (batch, seq, head, dim) with unit dim stride;
 * offsets and strides are in elements. Math is fp32. D and the dQ accumulator
 * are dense fp32 scratch indexed [seq_id][head][row] (x HEAD_DIM), rows padded to
 * the (max) sequence length.
 *
 * Parameters (-D):
 *   DTYPE      0 = fp32, 1 = fp16, 2 = bf16 (storage only)
 *   HEAD_DIM   head dimension
 *   BLOCK      rows per tile and work-items per work-group
 *   CAUSAL     1: key j is visible to query i iff j <= i + (Nk - Nq)
 *   VARLEN     1: sequence bounds come from cu_seqlens_q/k
 *   ATOMIC_DQ  1: bwd_dkdv also accumulates dQ (needs the dq_acc buffer)
 *   DROPOUT    1: regenerate the forward's dropout mask (philox.cl must be
 *              compiled first in the same program); with dropout,
 *              dV = (P*Z/(1-p))^T dO and dS = P * (dP*Z/(1-p) - D)
 */
#ifndef DTYPE
#define DTYPE 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef BLOCK
#define BLOCK 32
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
#ifndef DROPOUT
#define DROPOUT 0
#endif

#define LOG2E 1.4426950408889634f

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
inline ushort bf16_from_float(float x) {
  uint u = as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}
#endif

/* A strided tensor argument list: buffer, element offset, batch/seq/head strides. */
#define TENSOR(name) __global store_t *name, long name##_off, long name##_sb, long name##_sn, long name##_sh
#define CTENSOR(name) __global const store_t *name, long name##_off, long name##_sb, long name##_sn, long name##_sh
/* Element offset of row `row` of head `h` in sequence-batch index `bb`. */
#define ROWPTR(name, bb, row, h) (name##_off + (long)(bb) * name##_sb + (long)(row) * name##_sn + (long)(h) * name##_sh)

/* Bounds of sequence b: x = first row in the tensor, y = length. */
inline int2 seq_bounds(__global const int *cu, int b, int padded, int total) {
#if VARLEN
  int a = clamp(cu[b], 0, total), e = clamp(cu[b + 1], 0, total);
  return (int2)(a, min(max(e - a, 0), padded));
#else
  return (int2)(0, padded);
#endif
}

inline void atomic_add_float(volatile __global float *p, float val) {
  union {
    uint u;
    float f;
  } seen, next;
  seen.f = *p;
  do {
    next.f = seen.f + val;
    uint prev = atomic_cmpxchg((volatile __global uint *)p, seen.u, next.u);
    if (prev == seen.u) break;
    seen.u = prev;
  } while (1);
}

/* Global (padded_q, heads_q, seqs). */
__kernel void bwd_preprocess(CTENSOR(o), CTENSOR(dout), __global float *dsum, int padded_q, int heads_q,
                             __global const int *cu_q, int total_q) {
  const int i = get_global_id(0), h = get_global_id(1), b = get_global_id(2);
  const int2 sq = seq_bounds(cu_q, b, padded_q, total_q);
  const long bb = VARLEN ? 0 : b;
  float acc = 0.0f;
  if (i < sq.y) {
    const long po = ROWPTR(o, bb, sq.x + i, h), pd = ROWPTR(dout, bb, sq.x + i, h);
    for (int x = 0; x < HEAD_DIM; x++) acc = mad(LOAD(o, po + x), LOAD(dout, pd + x), acc);
  }
  dsum[((long)b * heads_q + h) * padded_q + i] = acc;
}

/* Global (kblocks * BLOCK, heads_kv, seqs), local BLOCK. */
__kernel __attribute__((reqd_work_group_size(BLOCK, 1, 1))) void bwd_dkdv(
    CTENSOR(q), CTENSOR(k), CTENSOR(v), CTENSOR(dout), TENSOR(dk), TENSOR(dv),
    __global const float *lse, long lse_off, long lse_sb, long lse_sn, long lse_sh,
    __global const float *dsum, __global float *dq_acc, int padded_q, int padded_k, int heads_q, int group,
    float scale, __global const int *cu_q, __global const int *cu_k, int total_q, int total_k, ulong seed,
    ulong offset, uint threshold, float keep_scale) {
  __local float Qs[BLOCK * HEAD_DIM];
  __local float dOs[BLOCK * HEAD_DIM];
  __local float Ls[BLOCK]; /* lse in log2 units */
  __local float Ds[BLOCK];
#if ATOMIC_DQ
  __local float Kt[BLOCK * HEAD_DIM];
  __local float dSs[BLOCK * BLOCK]; /* [query][key] */
#endif
  const int t = get_local_id(0);
  const int k0 = get_group_id(0) * BLOCK;
  const int hk = get_group_id(1), b = get_group_id(2);
  const int2 sq = seq_bounds(cu_q, b, padded_q, total_q), sk = seq_bounds(cu_k, b, padded_k, total_k);
  const int nq = sq.y, nk = sk.y;
  if (k0 >= nk) return;
  const long bb = VARLEN ? 0 : b;
  const int j = k0 + t;
  const int jvalid = j < nk;
  const int diag = nk - nq;
  const float scale_log2 = scale * LOG2E;

  float kr[HEAD_DIM], vr[HEAD_DIM], dk_acc[HEAD_DIM], dv_acc[HEAD_DIM];
  {
    const long pk = ROWPTR(k, bb, sk.x + min(j, nk - 1), hk), pv = ROWPTR(v, bb, sk.x + min(j, nk - 1), hk);
    for (int x = 0; x < HEAD_DIM; x++) {
      kr[x] = jvalid ? LOAD(k, pk + x) : 0.0f;
      vr[x] = jvalid ? LOAD(v, pv + x) : 0.0f;
      dk_acc[x] = 0.0f;
      dv_acc[x] = 0.0f;
    }
  }
#if ATOMIC_DQ
  for (int x = 0; x < HEAD_DIM; x++) Kt[t * HEAD_DIM + x] = kr[x];
#endif
  /* Query i sees key j iff i >= j - diag: earlier query tiles are skipped. */
  int istart = 0;
#if CAUSAL
  istart = max(0, k0 - diag);
  istart -= istart % BLOCK;
#endif
  for (int g = 0; g < group; g++) {
    const int h = hk * group + g;
    for (int i0 = istart; i0 < nq; i0 += BLOCK) {
      barrier(CLK_LOCAL_MEM_FENCE);
      for (int e = t; e < BLOCK * HEAD_DIM; e += BLOCK) {
        int r = e / HEAD_DIM, x = e - r * HEAD_DIM;
        int in = i0 + r < nq;
        Qs[e] = in ? LOAD(q, ROWPTR(q, bb, sq.x + i0 + r, h) + x) : 0.0f;
        dOs[e] = in ? LOAD(dout, ROWPTR(dout, bb, sq.x + i0 + r, h) + x) : 0.0f;
      }
      {
        int in = i0 + t < nq;
        float l = in ? lse[lse_off + bb * lse_sb + (long)(sq.x + i0 + t) * lse_sn + (long)h * lse_sh] : -INFINITY;
        Ls[t] = l * LOG2E;
        Ds[t] = in ? dsum[((long)b * heads_q + h) * padded_q + i0 + t] : 0.0f;
      }
      barrier(CLK_LOCAL_MEM_FENCE);
      const int rows = min(BLOCK, nq - i0);
      for (int r = 0; r < rows; r++) {
        const int i = i0 + r;
        float s = 0.0f, dp = 0.0f;
        for (int x = 0; x < HEAD_DIM; x++) {
          s = mad(Qs[r * HEAD_DIM + x], kr[x], s);
          dp = mad(dOs[r * HEAD_DIM + x], vr[x], dp);
        }
        const float lrow = Ls[r];
        int visible = jvalid && lrow != -INFINITY;
#if CAUSAL
        visible = visible && j <= i + diag;
#endif
        const float p = visible ? exp2(s * scale_log2 - lrow) : 0.0f;
        float pd = p;
#if DROPOUT
        if (!dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)i, (uint)j, threshold)) {
          pd = 0.0f;
          dp = 0.0f;
        } else {
          pd *= keep_scale;
          dp *= keep_scale;
        }
#endif
        const float ds = p * (dp - Ds[r]);
        for (int x = 0; x < HEAD_DIM; x++) {
          dv_acc[x] = mad(pd, dOs[r * HEAD_DIM + x], dv_acc[x]);
          dk_acc[x] = mad(ds, Qs[r * HEAD_DIM + x], dk_acc[x]);
        }
#if ATOMIC_DQ
        dSs[r * BLOCK + t] = ds;
#endif
      }
#if ATOMIC_DQ
      barrier(CLK_LOCAL_MEM_FENCE);
      /* dQ_tile += scale * dS K, reduced over this work-group's keys first so each
       * element takes one atomic per work-group. */
      const int kcount = min(BLOCK, nk - k0);
      for (int e = t; e < rows * HEAD_DIM; e += BLOCK) {
        int r = e / HEAD_DIM, x = e - r * HEAD_DIM;
        float acc = 0.0f;
        for (int c = 0; c < kcount; c++) acc = mad(dSs[r * BLOCK + c], Kt[c * HEAD_DIM + x], acc);
        if (acc != 0.0f)
          atomic_add_float(dq_acc + (((long)b * heads_q + h) * padded_q + i0 + r) * HEAD_DIM + x, acc * scale);
      }
#endif
    }
  }
  if (jvalid) {
    const long pk = ROWPTR(dk, bb, sk.x + j, hk), pv = ROWPTR(dv, bb, sk.x + j, hk);
    for (int x = 0; x < HEAD_DIM; x++) {
      STORE(dk, pk + x, dk_acc[x] * scale);
      STORE(dv, pv + x, dv_acc[x]);
    }
  }
}

/* Global (qblocks * BLOCK, heads_q, seqs), local BLOCK. */
__kernel __attribute__((reqd_work_group_size(BLOCK, 1, 1))) void bwd_dq(
    CTENSOR(q), CTENSOR(k), CTENSOR(v), CTENSOR(dout), TENSOR(dq),
    __global const float *lse, long lse_off, long lse_sb, long lse_sn, long lse_sh,
    __global const float *dsum, int padded_q, int padded_k, int heads_q, int group, float scale,
    __global const int *cu_q, __global const int *cu_k, int total_q, int total_k, ulong seed, ulong offset,
    uint threshold, float keep_scale) {
  __local float Ks[BLOCK * HEAD_DIM];
  __local float Vs[BLOCK * HEAD_DIM];
  const int t = get_local_id(0);
  const int i0 = get_group_id(0) * BLOCK;
  const int h = get_group_id(1), b = get_group_id(2);
  const int hk = h / group;
  const int2 sq = seq_bounds(cu_q, b, padded_q, total_q), sk = seq_bounds(cu_k, b, padded_k, total_k);
  const int nq = sq.y, nk = sk.y;
  if (i0 >= nq) return;
  const long bb = VARLEN ? 0 : b;
  const int i = i0 + t;
  const int ivalid = i < nq;
  const int diag = nk - nq;
  const float scale_log2 = scale * LOG2E;

  float qr[HEAD_DIM], dor[HEAD_DIM], dq_acc[HEAD_DIM];
  const long pq = ROWPTR(q, bb, sq.x + min(i, nq - 1), h), pd = ROWPTR(dout, bb, sq.x + min(i, nq - 1), h);
  for (int x = 0; x < HEAD_DIM; x++) {
    qr[x] = ivalid ? LOAD(q, pq + x) : 0.0f;
    dor[x] = ivalid ? LOAD(dout, pd + x) : 0.0f;
    dq_acc[x] = 0.0f;
  }
  const float lrow = ivalid ? lse[lse_off + bb * lse_sb + (long)(sq.x + i) * lse_sn + (long)h * lse_sh] * LOG2E
                            : -INFINITY;
  const float drow = ivalid ? dsum[((long)b * heads_q + h) * padded_q + i] : 0.0f;

  int kend = nk;
#if CAUSAL
  kend = min(nk, i0 + BLOCK + diag);
#endif
  for (int k0 = 0; k0 < kend; k0 += BLOCK) {
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = t; e < BLOCK * HEAD_DIM; e += BLOCK) {
      int c = e / HEAD_DIM, x = e - c * HEAD_DIM;
      int in = k0 + c < nk;
      Ks[e] = in ? LOAD(k, ROWPTR(k, bb, sk.x + k0 + c, hk) + x) : 0.0f;
      Vs[e] = in ? LOAD(v, ROWPTR(v, bb, sk.x + k0 + c, hk) + x) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int cols = min(BLOCK, kend - k0);
    for (int c = 0; c < cols; c++) {
      const int j = k0 + c;
      float s = 0.0f, dp = 0.0f;
      for (int x = 0; x < HEAD_DIM; x++) {
        s = mad(qr[x], Ks[c * HEAD_DIM + x], s);
        dp = mad(dor[x], Vs[c * HEAD_DIM + x], dp);
      }
      int visible = ivalid && lrow != -INFINITY && j < nk;
#if CAUSAL
      visible = visible && j <= i + diag;
#endif
      const float p = visible ? exp2(s * scale_log2 - lrow) : 0.0f;
#if DROPOUT
      dp = dropout_keep(seed, offset, (ulong)b * heads_q + h, (uint)i, (uint)j, threshold) ? dp * keep_scale : 0.0f;
#endif
      const float ds = p * (dp - drow);
      for (int x = 0; x < HEAD_DIM; x++) dq_acc[x] = mad(ds, Ks[c * HEAD_DIM + x], dq_acc[x]);
    }
  }
  if (ivalid) {
    const long po = ROWPTR(dq, bb, sq.x + i, h);
    for (int x = 0; x < HEAD_DIM; x++) STORE(dq, po + x, dq_acc[x] * scale);
  }
}

/* Global (HEAD_DIM, padded_q, seqs * heads_q). */
__kernel void bwd_dq_store(__global const float *dq_acc, TENSOR(dq), int padded_q, int heads_q,
                           __global const int *cu_q, int total_q) {
  const int x = get_global_id(0), i = get_global_id(1), bh = get_global_id(2);
  const int b = bh / heads_q, h = bh - b * heads_q;
  const int2 sq = seq_bounds(cu_q, b, padded_q, total_q);
  if (i >= sq.y) return;
  const long bb = VARLEN ? 0 : b;
  STORE(dq, ROWPTR(dq, bb, sq.x + i, h) + x, dq_acc[((long)bh * padded_q + i) * HEAD_DIM + x]);
}
