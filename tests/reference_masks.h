/*
 * Double-precision reference for the score variants of flashcl_attention_desc:
 * sliding window, ALiBi and logit soft-capping, composed with causal, GQA, varlen
 * and dropout (forward and backward).
 *
 * Per segment (batch entry or varlen sequence) with Nq queries, Nk keys and
 * diag = Nk - Nq, query row i, key j and query head h:
 *   s_ij = scale * q_i . k_j
 *   softcap c > 0:  t_ij = tanh(s_ij / c),  s_ij = c * t_ij
 *   ALiBi:          s_ij -= slope[h] * |j - (i + diag)|
 *   visible iff (!causal || j <= i + diag)
 *            && (window_left  < 0 || j >= i + diag - window_left)
 *            && (window_right < 0 || j <= i + diag + window_right)
 *   P = softmax over the visible keys (a row with none: P = 0, O = 0, LSE = -inf);
 *   a sink (logit sink[h], no value) joins the softmax: LSE = log(exp(sink) +
 *   sum exp(s)), a row with no key gets O = 0 and LSE = sink;
 *   dsink[h] = -sum_i exp(sink[h] - LSE_i) D_i
 *   O = (P * f) V,  LSE = log sum_visible exp(s)   (f: dropout factor, reference_bwd.h)
 * Backward: dV = (P f)^T dO, dP = (dO V^T) f, D_i = dO_i . O_i,
 *   dS = P (dP - D) (1 - t^2 with softcap, else 1), dQ = scale dS K, dK = scale dS^T Q.
 */
#ifndef FLASHCL_TESTS_REFERENCE_MASKS_H
#define FLASHCL_TESTS_REFERENCE_MASKS_H

#include "reference.h"
#include "reference_bwd.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ref_masks {
  int window_left, window_right; /* -1: unbounded */
  const float *alibi;            /* one slope per query head, NULL: off */
  double softcap;                /* 0: off */
  const float *sinks;            /* one logit per query head, NULL: off */
  double *dsinks;                /* backward: d/dsinks per query head (NULL: not wanted) */
  double *dsinks_rss2;           /* with dsinks: the sum of its terms' squares per head (NULL: not wanted) */
} ref_masks;

/* The error of a device dsinks (hq values) against the reference: the L2 norm
 * of the differences over that of max(|dsinks|, sqrt(dsinks_rss2)) per head.
 * dsinks is a sum over every row of terms of either sign (-P_sink * D_i), so
 * where they cancel, the sum is far smaller than its terms, and an fp32 device
 * sum is off by its rounding of the terms, not of the sum: measured against the
 * root sum of squares of the terms, that rounding stays near fp32's epsilon,
 * while a term missing or counted twice still shows at the 1 / sqrt(rows)
 * level. Without rss2 (NULL) it is the plain relative L2 error. */
double ref_dsinks_error(const float *got, const double *ref, const double *rss2, int hq);

/* O (q's shape with v's head dim) and LSE ((Bq, Nq, Hq, 1), may be NULL). m and dr may be NULL.
 * 0, or -1 on bad input. */
int ref_masks_forward(const ref_attention_params *p, const ref_masks *m, const ref_dropout *dr,
                      const ref_tensor *q, const ref_tensor *k, const ref_tensor *v, const ref_out *o,
                      const ref_out *lse);

/* dq (q's shape), dk (k's shape) and dv (v's shape), fully overwritten. o: the forward output
 * used for D (NULL recomputes it in double). 0, or -1 on bad input. */
int ref_masks_backward(const ref_attention_params *p, const ref_masks *m, const ref_dropout *dr,
                       const ref_tensor *q, const ref_tensor *k, const ref_tensor *v, const ref_tensor *o,
                       const ref_tensor *d_o, const ref_out *dq, const ref_out *dk, const ref_out *dv);

#ifdef __cplusplus
}
#endif
#endif
