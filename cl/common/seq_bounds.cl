/*
 * seq_bounds.cl: where sequence b of a batch lies in the caller's tensors, for
 * the kernels that take a padded batch or a packed (varlen) one. The host joins
 * it in front of each kernel file that declares "requires: seq_bounds.cl", so
 * that every kernel clamps corrupt cu_seqlens / kv_lens the same way and can
 * never reach outside the tensors.
 *
 * Padded batch (VARLEN = 0): sequence b is batch entry b, rows [0, padded).
 * Packed (VARLEN = 1): sequence b is rows [cu[b], cu[b + 1]) of batch entry 0,
 * both clamped to [0, total], and at most padded rows long.
 * Paged K/V (PAGED_KV = 1): the key rows come from a block table, and the key
 * count from kv_lens[b] clamped to [0, padded_k]; cu_k is not read (it may be
 * NULL). That count is read by fcl_seq_paged_keys, apart from fcl_seq_bounds,
 * so that a work-group that has no queries leaves before it reads it.
 *
 * Parameters (-D): VARLEN, PAGED_KV (0 or 1).
 */
#ifndef SEQ_BOUNDS_CL
#define SEQ_BOUNDS_CL

#ifndef VARLEN
#define VARLEN 0
#endif
#ifndef PAGED_KV
#define PAGED_KV 0
#endif

/* Rows of sequence b: x = first row in the tensor, y = length. */
inline int2 fcl_seq_rows(__global const int *cu, int b, int padded, int total) {
#if VARLEN
  int a = clamp(cu[b], 0, total), e = clamp(cu[b + 1], 0, total);
  return (int2)(a, min(max(e - a, 0), padded));
#else
  return (int2)(0, padded);
#endif
}

typedef struct {
  long bb;   /* batch index to multiply the batch strides by (0 when packed) */
  int q_row; /* first query row of the sequence in q, o and lse */
  int k_row; /* first key row in k and v (0 for paged K/V) */
  int nq, nk;
  int diag; /* nk - nq: query i and key i + diag are aligned (bottom-right) */
} fcl_seq;

inline fcl_seq fcl_seq_bounds(__global const int *cu_q, __global const int *cu_k, int b, int padded_q, int padded_k,
                              int total_q, int total_k) {
  fcl_seq s;
  const int2 q = fcl_seq_rows(cu_q, b, padded_q, total_q);
#if PAGED_KV
  const int2 k = (int2)(0, padded_k); /* until fcl_seq_paged_keys */
#else
  const int2 k = fcl_seq_rows(cu_k, b, padded_k, total_k);
#endif
  s.bb = VARLEN ? 0 : b;
  s.q_row = q.x;
  s.nq = q.y;
  s.k_row = k.x;
  s.nk = k.y;
  s.diag = k.y - q.y;
  return s;
}

/* The key count of a paged sequence; returns s with nk and diag set. */
inline fcl_seq fcl_seq_paged_keys(fcl_seq s, __global const int *kv_lens, int b, int padded_k) {
  s.nk = clamp(kv_lens[b], 0, padded_k);
  s.diag = s.nk - s.nq;
  return s;
}

#endif
