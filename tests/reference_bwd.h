/*
 * Double-precision CPU reference for the attention backward pass (and the
 * forward with dropout), built on the forward reference in reference.h.
 *
 * With P = softmax(scale * Q K^T + mask) per (sequence, query head), Z the Philox
 * keep-mask (philox_ref.h) and f = Z / (1 - p) (f = 1 without dropout):
 *   O   = (P * f) V                     LSE = log sum exp(scale * q.k) (no dropout in it)
 *   dV  = (P * f)^T dO                  dP  = (dO V^T) * f
 *   D_i = sum_x dO_ix O_ix              dS  = P * (dP - D)
 *   dQ  = scale * dS K                  dK  = scale * dS^T Q
 * dK and dV of a kv head are summed over the query heads of its GQA group; a
 * query row that sees no key has dQ = 0 and contributes nothing.
 *
 * The dropout stream of query head h in segment s (the batch index, or the
 * sequence index for varlen) is s * Hq + h; rows and columns are counted from the
 * start of the segment.
 */
#ifndef FLASHCL_TESTS_REFERENCE_BWD_H
#define FLASHCL_TESTS_REFERENCE_BWD_H

#include <stdint.h>

#include "reference.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ref_dropout {
  float p; /* desc.dropout.p exactly as the device sees it; 0 = no dropout */
  uint64_t seed, offset;
} ref_dropout;

/* The multiplier f for entry (i, j) of stream `stream`: 1 without dropout, else
 * 0 (dropped) or 1 / (1 - p) (kept). dr may be NULL (no dropout). */
double ref_dropout_factor(const ref_dropout *dr, int64_t stream, int64_t i, int64_t j);

/* Forward with dropout: O (q's shape) and LSE ((Bq, Nq, Hq, 1), may be NULL).
 * dr NULL or dr->p == 0 gives ref_attention_forward's result. 0, or -1 on bad input. */
int ref_attention_forward_dropout(const ref_attention_params *p, const ref_dropout *dr, const ref_tensor *q,
                                  const ref_tensor *k, const ref_tensor *v, const ref_out *o, const ref_out *lse);

/* Backward: dq has q's shape, dk k's and dv v's (all fully overwritten); v, o
 * and d_o may have a head dim of their own (d_v != d_qk), d_o and o q's shape
 * otherwise.
 * o is the forward output used for D = rowsum(dO * O): pass the exact tensor the
 * device's backward reads, or NULL to recompute O in double. 0, or -1 on bad input. */
int ref_attention_backward(const ref_attention_params *p, const ref_dropout *dr, const ref_tensor *q,
                           const ref_tensor *k, const ref_tensor *v, const ref_tensor *o, const ref_tensor *d_o,
                           const ref_out *dq, const ref_out *dk, const ref_out *dv);

/* ref_attention_backward that also returns, when mag_dq / mag_dk / mag_dv are
 * non-NULL (shapes of dq / dk / dv), the root-sum-square over the terms of each
 * gradient element of their absolute size, with dP and D replaced by the sums of
 * absolute products (sum_x |dO_ix V_jx| and sum_x |dO_ix O_ix|):
 *   mag_dq_ix = scale * sqrt(sum_j (P_ij (f_ij A_ij + B_i) |K_jx|)^2)
 *   mag_dk_jx = scale * sqrt(sum_i (P_ij (f_ij A_ij + B_i) |Q_ix|)^2)
 *   mag_dv_jx = sqrt(sum_i (P_ij f_ij |dO_ix|)^2)
 * u * mag is the size of the rounding noise that a computation with unit roundoff
 * u leaves in the element; it matters where the gradient is ~0 by cancellation
 * (a row that sees a single key has dS = P (dP - D) = 0 exactly, so dq and dk are
 * pure rounding noise). */
int ref_attention_backward_mag(const ref_attention_params *p, const ref_dropout *dr, const ref_tensor *q,
                               const ref_tensor *k, const ref_tensor *v, const ref_tensor *o, const ref_tensor *d_o,
                               const ref_out *dq, const ref_out *dk, const ref_out *dv, const ref_out *mag_dq,
                               const ref_out *mag_dk, const ref_out *mag_dv);

#ifdef __cplusplus
}
#endif
#endif
