/* Score-variant reference: see reference_masks.h. */
#include "reference_masks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Probabilities (masked: 0), the softcap's tanh per key, and the LSE of row i. */
static double row_probs(const ref_attention_params *p, const ref_masks *m, const ref_tensor *q,
                        const ref_tensor *k, const ref_segment *seg, int64_t hq, int64_t i, double *probs,
                        double *tanhs) {
  const int64_t d = q->shape[REF_D], hk = ref_attention_kv_head(q, k, hq);
  const int64_t diag = seg->nk - seg->nq;
  const double scale = ref_attention_scale(p, q);
  double mx = -INFINITY, sum = 0.0, lse;
  int64_t j, x;
  for (j = 0; j < seg->nk; j++) {
    int vis = 1;
    double s = 0.0;
    if (p->causal && j > i + diag) vis = 0;
    if (m && m->window_left >= 0 && j < i + diag - m->window_left) vis = 0;
    if (m && m->window_right >= 0 && j > i + diag + m->window_right) vis = 0;
    tanhs[j] = 0.0;
    if (!vis) {
      probs[j] = -INFINITY;
      continue;
    }
    for (x = 0; x < d; x++)
      s += ref_get(q, seg->q_batch, seg->q_row0 + i, hq, x) * ref_get(k, seg->k_batch, seg->k_row0 + j, hk, x);
    s *= scale;
    if (m && m->softcap > 0.0) {
      tanhs[j] = tanh(s / m->softcap);
      s = m->softcap * tanhs[j];
    }
    if (m && m->alibi) s -= (double)m->alibi[hq] * fabs((double)(j - (i + diag)));
    probs[j] = s;
    if (s > mx) mx = s;
  }
  /* A sink is one more entry of the softmax, with no value. */
  const double sink = (m && m->sinks) ? (double)m->sinks[hq] : -INFINITY;
  if (sink > mx) mx = sink;
  if (mx == -INFINITY) {
    for (j = 0; j < seg->nk; j++) probs[j] = 0.0;
    return -INFINITY;
  }
  for (j = 0; j < seg->nk; j++) sum += probs[j] == -INFINITY ? 0.0 : exp(probs[j] - mx);
  if (sink != -INFINITY) sum += exp(sink - mx);
  lse = mx + log(sum);
  for (j = 0; j < seg->nk; j++) probs[j] = probs[j] == -INFINITY ? 0.0 : exp(probs[j] - lse);
  return lse;
}

static int64_t max_nk(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k) {
  int64_t n = ref_attention_num_segments(p, q), s, mx = 1;
  for (s = 0; s < n; s++) {
    ref_segment seg = ref_attention_segment(p, q, k, s);
    if (seg.nk > mx) mx = seg.nk;
  }
  return mx;
}

int ref_masks_forward(const ref_attention_params *p, const ref_masks *m, const ref_dropout *dr,
                      const ref_tensor *q, const ref_tensor *k, const ref_tensor *v, const ref_out *o,
                      const ref_out *lse) {
  if (ref_attention_check(p, q, k, v) != 0 || !o) return -1;
  /* O has v's head dim (d_v may differ from q/k's, MLA-style). */
  const int64_t dv = v->shape[REF_D], hqn = q->shape[REF_H], nseg = ref_attention_num_segments(p, q);
  const int64_t mk = max_nk(p, q, k);
  double *probs = (double *)malloc((size_t)mk * sizeof(double)), *tanhs = (double *)malloc((size_t)mk * sizeof(double));
  if (!probs || !tanhs) {
    free(probs);
    free(tanhs);
    return -1;
  }
  for (int64_t s = 0; s < nseg; s++) {
    ref_segment seg = ref_attention_segment(p, q, k, s);
    for (int64_t hq = 0; hq < hqn; hq++) {
      const int64_t hk = ref_attention_kv_head(q, k, hq);
      for (int64_t i = 0; i < seg.nq; i++) {
        double l = row_probs(p, m, q, k, &seg, hq, i, probs, tanhs);
        for (int64_t x = 0; x < dv; x++) {
          double acc = 0.0;
          for (int64_t j = 0; j < seg.nk; j++)
            if (probs[j] != 0.0)
              acc += probs[j] * ref_dropout_factor(dr, s * hqn + hq, i, j) *
                     ref_get(v, seg.k_batch, seg.k_row0 + j, hk, x);
          *ref_at(o, seg.q_batch, seg.q_row0 + i, hq, x) = acc;
        }
        if (lse) *ref_at(lse, seg.q_batch, seg.q_row0 + i, hq, 0) = l;
      }
    }
  }
  free(probs);
  free(tanhs);
  return 0;
}

int ref_masks_backward(const ref_attention_params *p, const ref_masks *m, const ref_dropout *dr,
                       const ref_tensor *q, const ref_tensor *k, const ref_tensor *v, const ref_tensor *o,
                       const ref_tensor *d_o, const ref_out *dq, const ref_out *dk, const ref_out *dv) {
  if (ref_attention_check(p, q, k, v) != 0 || !d_o || !dq || !dk || !dv) return -1;
  /* dq, dk over q/k's head dim d; o, d_o and dv over v's, dvd. */
  const int64_t d = q->shape[REF_D], dvd = v->shape[REF_D], hqn = q->shape[REF_H], hkn = k->shape[REF_H];
  const int64_t nseg = ref_attention_num_segments(p, q), mk = max_nk(p, q, k);
  const double scale = ref_attention_scale(p, q);
  double *probs = (double *)malloc((size_t)mk * sizeof(double)), *tanhs = (double *)malloc((size_t)mk * sizeof(double));
  double *orow = (double *)malloc((size_t)dvd * sizeof(double));
  if (!probs || !tanhs || !orow) {
    free(probs);
    free(tanhs);
    free(orow);
    return -1;
  }
  /* Zero the outputs over their logical shapes. */
  for (int64_t b = 0; b < q->shape[REF_B]; b++)
    for (int64_t n = 0; n < q->shape[REF_N]; n++)
      for (int64_t h = 0; h < hqn; h++)
        for (int64_t x = 0; x < d; x++) *ref_at(dq, b, n, h, x) = 0.0;
  for (int64_t b = 0; b < k->shape[REF_B]; b++)
    for (int64_t n = 0; n < k->shape[REF_N]; n++)
      for (int64_t h = 0; h < hkn; h++)
        for (int64_t x = 0; x < (d > dvd ? d : dvd); x++) {
          if (x < d) *ref_at(dk, b, n, h, x) = 0.0;
          if (x < dvd) *ref_at(dv, b, n, h, x) = 0.0;
        }
  if (m && m->dsinks)
    for (int64_t h = 0; h < hqn; h++) m->dsinks[h] = 0.0;
  if (m && m->dsinks && m->dsinks_rss2)
    for (int64_t h = 0; h < hqn; h++) m->dsinks_rss2[h] = 0.0;

  for (int64_t s = 0; s < nseg; s++) {
    ref_segment seg = ref_attention_segment(p, q, k, s);
    for (int64_t hq = 0; hq < hqn; hq++) {
      const int64_t hk = ref_attention_kv_head(q, k, hq);
      for (int64_t i = 0; i < seg.nq; i++) {
        const int64_t qi = seg.q_row0 + i;
        double l = row_probs(p, m, q, k, &seg, hq, i, probs, tanhs), dsum = 0.0;
        if (l == -INFINITY) continue;
        for (int64_t x = 0; x < dvd; x++) {
          if (o) {
            orow[x] = ref_get(o, seg.q_batch, qi, hq, x);
          } else {
            double acc = 0.0;
            for (int64_t j = 0; j < seg.nk; j++)
              acc += probs[j] * ref_dropout_factor(dr, s * hqn + hq, i, j) *
                     ref_get(v, seg.k_batch, seg.k_row0 + j, hk, x);
            orow[x] = acc;
          }
          dsum += orow[x] * ref_get(d_o, seg.q_batch, qi, hq, x);
        }
        if (m && m->sinks && m->dsinks) {
          const double term = exp((double)m->sinks[hq] - l) * dsum;
          m->dsinks[hq] -= term;
          if (m->dsinks_rss2) m->dsinks_rss2[hq] += term * term;
        }
        for (int64_t j = 0; j < seg.nk; j++) {
          if (probs[j] == 0.0) continue;
          const int64_t kj = seg.k_row0 + j;
          const double f = ref_dropout_factor(dr, s * hqn + hq, i, j);
          double dp = 0.0;
          for (int64_t x = 0; x < dvd; x++)
            dp += ref_get(d_o, seg.q_batch, qi, hq, x) * ref_get(v, seg.k_batch, kj, hk, x);
          double ds = probs[j] * (dp * f - dsum);
          if (m && m->softcap > 0.0) ds *= 1.0 - tanhs[j] * tanhs[j];
          for (int64_t x = 0; x < dvd; x++)
            *ref_at(dv, seg.k_batch, kj, hk, x) += probs[j] * f * ref_get(d_o, seg.q_batch, qi, hq, x);
          for (int64_t x = 0; x < d; x++) {
            *ref_at(dq, seg.q_batch, qi, hq, x) += scale * ds * ref_get(k, seg.k_batch, kj, hk, x);
            *ref_at(dk, seg.k_batch, kj, hk, x) += scale * ds * ref_get(q, seg.q_batch, qi, hq, x);
          }
        }
      }
    }
  }
  free(probs);
  free(tanhs);
  free(orow);
  return 0;
}

double ref_dsinks_error(const float *got, const double *ref, const double *rss2, int hq) {
  double e2 = 0.0, r2 = 0.0;
  for (int h = 0; h < hq; h++) {
    const double d = (double)got[h] - ref[h], scale2 = ref[h] * ref[h];
    e2 += d * d;
    r2 += rss2 && rss2[h] > scale2 ? rss2[h] : scale2;
  }
  return r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}
