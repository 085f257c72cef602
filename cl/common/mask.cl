/*
 * mask.cl: reading flashcl's attention masks (flashcl_mask_kind) in the
 * portable flash kernels. The host compiles it first in the same program
 * ("mask.cl+flash_fwd.cl", after philox.cl when there is dropout) whenever
 * MASK is set, so the forward and the backward read the masks with one copy of
 * this code.
 *
 * Layout: a row-major bit matrix of W 32-bit words per row; bit c of a row is
 * bit c % 32 of word c / 32. MASK 1 (block mask): bit (i / bq, j / bk) covers
 * query i and key j; MASK 2 (bit mask): bit (i, j). A 0 bit hides the key.
 *
 * Parameters (-D):
 *   MASK   0: empty file; 1: block mask; 2: bit mask
 */
#ifndef MASK_CL
#define MASK_CL

#ifndef MASK
#define MASK 0
#endif

#if MASK
/* Rows [r0, r1] x columns [c0, c1] of a bit matrix of W words per row:
 * bit 0 set iff any bit is set there, bit 1 iff all are. */
inline int mask_scan(__global const uint *m, int W, int r0, int r1, int c0, int c1) {
  uint any = 0u;
  int all = 1;
  const int w0 = c0 >> 5, w1 = c1 >> 5;
  for (int r = r0; r <= r1; r++) {
    __global const uint *row = m + (long)r * W;
    for (int w = w0; w <= w1; w++) {
      uint sel = 0xffffffffu;
      if (w == w0) sel &= 0xffffffffu << (c0 & 31);
      if (w == w1) sel &= 0xffffffffu >> (31 - (c1 & 31));
      const uint x = row[w] & sel;
      any |= x;
      all = all && x == sel;
    }
  }
  return (any != 0u) | (all << 1);
}
/* The mask bits of queries [qa, qb] x keys [ka, kb] (see mask_scan). Every
 * work-item reads the same words, so the result is uniform across the work-group. */
inline int mask_tile(__global const uint *m, int W, int bq, int bk, int qa, int qb, int ka, int kb) {
#if MASK == 1
  return mask_scan(m, W, qa / bq, qb / bq, ka / bk, kb / bk);
#else
  return mask_scan(m, W, qa, qb, ka, kb);
#endif
}
inline int mask_ok(__global const uint *m, int W, int bq, int bk, int i, int j) {
#if MASK == 1
  i /= bq;
  j /= bk;
#endif
  return (m[(long)i * W + (j >> 5)] >> (j & 31)) & 1u;
}
#endif /* MASK */

#endif /* MASK_CL */
