/*
 * Philox4x32-10 (Salmon et al., SC'11) and flashcl's dropout keep-mask, in plain
 * C99, bit-exact with cl/common/philox.cl. The tests use it to regenerate the mask the
 * device applies, so the CPU reference can apply the same dropout.
 *
 * Counter layout (cl/common/philox.cl), for query head h of sequence b (heads_q query
 * heads; b is the batch index, or the sequence index for varlen), query row i and
 * key column j, both counted from the start of their sequence:
 *   key     = (lo32(seed), hi32(seed))
 *   counter = (j >> 2, i, lo32(t), hi32(t)),   t = b * heads_q + h + offset (64-bit, wraps)
 * Entry (i, j) uses word j & 3 of the output and is kept iff word >= floor(p * 2^32).
 */
#ifndef FLASHCL_TESTS_PHILOX_REF_H
#define FLASHCL_TESTS_PHILOX_REF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out = Philox4x32-10(ctr, key), Random123's word order. out may alias ctr. */
void philox_ref_4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* floor(p * 2^32) for p in [0, 1), computed exactly as src/attention/dropout.c does from the
 * float the descriptor holds: 0 for p <= 0 (or NaN), saturating at 0xffffffff. */
uint32_t philox_ref_threshold(float p);

/* 1 if entry (row, col) of stream (= b * heads_q + h) is kept. */
int philox_ref_keep(uint64_t seed, uint64_t offset, uint64_t stream, uint32_t row, uint32_t col, uint32_t threshold);

/* The keep-mask of flashcl_dropout_mask: mask[((b * heads_q + h) * seqlen_q + i) * seqlen_k + j]. */
void philox_ref_mask(uint64_t seed, uint64_t offset, float p, int batch, int heads_q, int seqlen_q, int seqlen_k,
                     unsigned char *mask);

#ifdef __cplusplus
}
#endif
#endif
