/*
 * philox.cl: the dropout mask, from a counter-based generator (Philox4x32-10,
 * Salmon et al., SC'11). Nothing is stored: forward, backward and the naive path
 * all regenerate the same bits from (seed, offset, sequence, head, row, column).
 *
 * Counter layout, for query head h of sequence b (heads_q query heads), query row
 * i and key column j, both counted from the start of their sequence:
 *   key     = (lo32(seed), hi32(seed))
 *   counter = (j / 4, i, lo32(t), hi32(t)),   t = b * heads_q + h + offset  (64-bit)
 * Philox returns four 32-bit words; entry (i, j) uses word j % 4 and is kept iff
 * word >= threshold, threshold = floor(p * 2^32), so it is kept with probability 1 - p.
 *
 * This file is prepended to the programs that use dropout; it is also valid
 * OpenCL C on its own (kernel dropout_mask materialises the mask for tests).
 */
#ifndef PHILOX_CL
#define PHILOX_CL

inline uint4 philox4x32_10(uint4 ctr, uint2 key) {
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      key.x += 0x9E3779B9u;
      key.y += 0xBB67AE85u;
    }
    const uint lo0 = 0xD2511F53u * ctr.x, hi0 = mul_hi(0xD2511F53u, ctr.x);
    const uint lo1 = 0xCD9E8D57u * ctr.z, hi1 = mul_hi(0xCD9E8D57u, ctr.z);
    ctr = (uint4)(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
  }
  return ctr;
}

/* 1 if entry (row, col) of stream `stream` (= b * heads_q + h) is kept. */
inline int dropout_keep(ulong seed, ulong offset, ulong stream, uint row, uint col, uint threshold) {
  const ulong t = stream + offset;
  const uint4 w = philox4x32_10((uint4)(col >> 2, row, (uint)t, (uint)(t >> 32)), (uint2)((uint)seed, (uint)(seed >> 32)));
  const uint c = col & 3u;
  const uint word = c == 0 ? w.x : c == 1 ? w.y : c == 2 ? w.z : w.w;
  return word >= threshold;
}

/* The keep bits of entries (row, col) and (row, col + 1) for an even col, from
 * one Philox call (they share a counter): bit 0 for col, bit 1 for col + 1. */
inline int dropout_keep2(ulong seed, ulong offset, ulong stream, uint row, uint col, uint threshold) {
  const ulong t = stream + offset;
  const uint4 w = philox4x32_10((uint4)(col >> 2, row, (uint)t, (uint)(t >> 32)), (uint2)((uint)seed, (uint)(seed >> 32)));
  const uint2 pair = (col & 2u) ? w.zw : w.xy;
  return (pair.x >= threshold ? 1 : 0) | (pair.y >= threshold ? 2 : 0);
}

/* Global (seqlen_k, seqlen_q, batch * heads_q): mask[bh][i][j] = keep ? 1 : 0. */
__kernel void dropout_mask(__global uchar *mask, ulong seed, ulong offset, uint threshold, int seqlen_q,
                           int seqlen_k) {
  const int j = get_global_id(0), i = get_global_id(1), bh = get_global_id(2);
  mask[((long)bh * seqlen_q + i) * seqlen_k + j] = (uchar)dropout_keep(seed, offset, (ulong)bh, (uint)i, (uint)j, threshold);
}
#endif
