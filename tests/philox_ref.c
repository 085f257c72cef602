/* Philox4x32-10 and the dropout keep-mask. See philox_ref.h. */
#include "philox_ref.h"

#include <math.h>

static void mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
  const uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

void philox_ref_4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  int r;
  for (r = 0; r < 10; r++) {
    uint32_t hi0, lo0, hi1, lo1;
    if (r > 0) { /* key schedule: bump before rounds 2..10 */
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    mulhilo32(0xD2511F53u, c0, &hi0, &lo0);
    mulhilo32(0xCD9E8D57u, c2, &hi1, &lo1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

uint32_t philox_ref_threshold(float p) {
  double t;
  if (!(p > 0.0f)) return 0;
  t = floor((double)p * 4294967296.0);
  return t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
}

int philox_ref_keep(uint64_t seed, uint64_t offset, uint64_t stream, uint32_t row, uint32_t col, uint32_t threshold) {
  const uint64_t t = stream + offset;
  uint32_t ctr[4], key[2], w[4];
  ctr[0] = col >> 2;
  ctr[1] = row;
  ctr[2] = (uint32_t)t;
  ctr[3] = (uint32_t)(t >> 32);
  key[0] = (uint32_t)seed;
  key[1] = (uint32_t)(seed >> 32);
  philox_ref_4x32_10(ctr, key, w);
  return w[col & 3u] >= threshold;
}

void philox_ref_mask(uint64_t seed, uint64_t offset, float p, int batch, int heads_q, int seqlen_q, int seqlen_k,
                     unsigned char *mask) {
  const uint32_t threshold = philox_ref_threshold(p);
  int64_t bh, i, j;
  for (bh = 0; bh < (int64_t)batch * heads_q; bh++)
    for (i = 0; i < seqlen_q; i++)
      for (j = 0; j < seqlen_k; j += 4) {
        /* One Philox call serves four columns. */
        uint32_t ctr[4], key[2], w[4];
        const uint64_t t = (uint64_t)bh + offset;
        int c;
        ctr[0] = (uint32_t)(j >> 2);
        ctr[1] = (uint32_t)i;
        ctr[2] = (uint32_t)t;
        ctr[3] = (uint32_t)(t >> 32);
        key[0] = (uint32_t)seed;
        key[1] = (uint32_t)(seed >> 32);
        philox_ref_4x32_10(ctr, key, w);
        for (c = 0; c < 4 && j + c < seqlen_k; c++)
          mask[(bh * seqlen_q + i) * seqlen_k + j + c] = (unsigned char)(w[c] >= threshold);
      }
}
