/* Double-precision CPU reference for the attention backward pass. See reference_bwd.h. */
#include "reference_bwd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "philox_ref.h"

double ref_dropout_factor(const ref_dropout *dr, int64_t stream, int64_t i, int64_t j) {
  if (!dr || !(dr->p > 0.0f)) return 1.0;
  if (!philox_ref_keep(dr->seed, dr->offset, (uint64_t)stream, (uint32_t)i, (uint32_t)j, philox_ref_threshold(dr->p)))
    return 0.0;
  return 1.0 / (1.0 - (double)dr->p);
}

static int64_t max_keys(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k) {
  int64_t s, m = 1, n = ref_attention_num_segments(p, q);
  for (s = 0; s < n; s++) {
    ref_segment seg = ref_attention_segment(p, q, k, s);
    if (seg.nk > m) m = seg.nk;
  }
  return m;
}

/* O_i (v's head dim of values) of row i of head hq in segment seg/segment index s, given its probs. */
static void out_row(const ref_dropout *dr, const ref_tensor *q, const ref_tensor *k, const ref_tensor *v,
                    const ref_segment *seg, int64_t s, int64_t hq, int64_t i, int64_t visible, const double *probs,
                    double *o_row) {
  const int64_t d = v->shape[REF_D], hk = ref_attention_kv_head(q, k, hq);
  const int64_t stream = s * q->shape[REF_H] + hq;
  int64_t j, x;
  for (x = 0; x < d; x++) o_row[x] = 0.0;
  for (j = 0; j < visible; j++) {
    const double w = probs[j] * ref_dropout_factor(dr, stream, i, j);
    if (w == 0.0) continue;
    for (x = 0; x < d; x++) o_row[x] += w * ref_get(v, seg->k_batch, seg->k_row0 + j, hk, x);
  }
}

int ref_attention_forward_dropout(const ref_attention_params *p, const ref_dropout *dr, const ref_tensor *q,
                                  const ref_tensor *k, const ref_tensor *v, const ref_out *o, const ref_out *lse) {
  const int64_t d = v->shape[REF_D], Hq = q->shape[REF_H]; /* O has v's head dim */
  int64_t nseg, s;
  double *probs, *o_row;
  if (ref_attention_check(p, q, k, v) != 0 || !o) return -1;
  nseg = ref_attention_num_segments(p, q);
  probs = (double *)malloc((size_t)max_keys(p, q, k) * sizeof(double));
  o_row = (double *)malloc((size_t)d * sizeof(double));
  if (!probs || !o_row) {
    free(probs);
    free(o_row);
    return -1;
  }
  for (s = 0; s < nseg; s++) {
    const ref_segment seg = ref_attention_segment(p, q, k, s);
    int64_t hq, i, x;
    for (hq = 0; hq < Hq; hq++)
      for (i = 0; i < seg.nq; i++) {
        const double l = ref_attention_probs(p, q, k, &seg, hq, i, probs, NULL);
        out_row(dr, q, k, v, &seg, s, hq, i, ref_attention_visible_keys(p, &seg, i), probs, o_row);
        for (x = 0; x < d; x++) *ref_at(o, seg.q_batch, seg.q_row0 + i, hq, x) = o_row[x];
        if (lse) *ref_at(lse, seg.q_batch, seg.q_row0 + i, hq, 0) = l;
      }
  }
  free(probs);
  free(o_row);
  return 0;
}

int ref_attention_backward(const ref_attention_params *p, const ref_dropout *dr, const ref_tensor *q,
                           const ref_tensor *k, const ref_tensor *v, const ref_tensor *o, const ref_tensor *d_o,
                           const ref_out *dq, const ref_out *dk, const ref_out *dv) {
  return ref_attention_backward_mag(p, dr, q, k, v, o, d_o, dq, dk, dv, NULL, NULL, NULL);
}

int ref_attention_backward_mag(const ref_attention_params *p, const ref_dropout *dr, const ref_tensor *q,
                               const ref_tensor *k, const ref_tensor *v, const ref_tensor *o, const ref_tensor *d_o,
                               const ref_out *dq, const ref_out *dk, const ref_out *dv, const ref_out *mag_dq,
                               const ref_out *mag_dk, const ref_out *mag_dv) {
  /* d: q and k's head dim (dq, dk); dv_d: v, o and dO's (dv). */
  const int64_t d = q->shape[REF_D], dv_d = v->shape[REF_D], Hq = q->shape[REF_H], Hkv = k->shape[REF_H];
  const int want_mag = mag_dq && mag_dk && mag_dv;
  int64_t nseg, s, b, n, h, x, mk;
  double *probs, *o_row, *do_row, *q_row, *dq_row, *kseg = NULL, *vseg = NULL, *dkseg = NULL, *dvseg = NULL;
  double *mq_row = NULL, *mkseg = NULL, *mvseg = NULL;
  double scale;
  int rc = -1;

  if (ref_attention_check(p, q, k, v) != 0 || !d_o || !dq || !dk || !dv) return -1;
  for (x = 0; x < 4; x++) {
    const int64_t want = x == REF_D ? dv_d : q->shape[x];
    if (d_o->shape[x] != want || (o && o->shape[x] != want)) return -1;
  }
  scale = ref_attention_scale(p, q);
  nseg = ref_attention_num_segments(p, q);
  mk = max_keys(p, q, k);

  /* Every output element is written: zero everything first (rows of no segment,
   * e.g. past the last varlen sequence, stay 0). */
  for (b = 0; b < q->shape[REF_B]; b++)
    for (n = 0; n < q->shape[REF_N]; n++)
      for (h = 0; h < Hq; h++)
        for (x = 0; x < d; x++) {
          *ref_at(dq, b, n, h, x) = 0.0;
          if (want_mag) *ref_at(mag_dq, b, n, h, x) = 0.0;
        }
  for (b = 0; b < k->shape[REF_B]; b++)
    for (n = 0; n < k->shape[REF_N]; n++)
      for (h = 0; h < Hkv; h++)
        for (x = 0; x < d || x < dv_d; x++) {
          if (x < d) *ref_at(dk, b, n, h, x) = 0.0;
          if (x < dv_d) *ref_at(dv, b, n, h, x) = 0.0;
          if (want_mag && x < d) *ref_at(mag_dk, b, n, h, x) = 0.0;
          if (want_mag && x < dv_d) *ref_at(mag_dv, b, n, h, x) = 0.0;
        }

  probs = (double *)malloc((size_t)mk * sizeof(double));
  o_row = (double *)malloc((size_t)dv_d * sizeof(double));
  do_row = (double *)malloc((size_t)dv_d * sizeof(double));
  q_row = (double *)malloc((size_t)d * sizeof(double));
  dq_row = (double *)malloc((size_t)d * sizeof(double));
  kseg = (double *)malloc((size_t)(mk * d) * sizeof(double));
  vseg = (double *)malloc((size_t)(mk * dv_d) * sizeof(double));
  dkseg = (double *)malloc((size_t)(mk * d) * sizeof(double));
  dvseg = (double *)malloc((size_t)(mk * dv_d) * sizeof(double));
  mq_row = (double *)malloc((size_t)d * sizeof(double));
  mkseg = (double *)malloc((size_t)(mk * d) * sizeof(double));
  mvseg = (double *)malloc((size_t)(mk * dv_d) * sizeof(double));
  if (!probs || !o_row || !do_row || !q_row || !dq_row || !kseg || !vseg || !dkseg || !dvseg || !mq_row || !mkseg ||
      !mvseg)
    goto done;

  for (s = 0; s < nseg; s++) {
    const ref_segment seg = ref_attention_segment(p, q, k, s);
    int64_t hk, g, group = Hq / Hkv, i, j;
    for (hk = 0; hk < Hkv; hk++) {
      /* K/V rows of this kv head, and dK/dV summed over the group's query heads. */
      for (j = 0; j < seg.nk; j++) {
        for (x = 0; x < d; x++) {
          kseg[j * d + x] = ref_get(k, seg.k_batch, seg.k_row0 + j, hk, x);
          dkseg[j * d + x] = mkseg[j * d + x] = 0.0;
        }
        for (x = 0; x < dv_d; x++) {
          vseg[j * dv_d + x] = ref_get(v, seg.k_batch, seg.k_row0 + j, hk, x);
          dvseg[j * dv_d + x] = mvseg[j * dv_d + x] = 0.0;
        }
      }
      for (g = 0; g < group; g++) {
        const int64_t hq = hk * group + g, stream = s * Hq + hq;
        for (i = 0; i < seg.nq; i++) {
          const int64_t visible = ref_attention_visible_keys(p, &seg, i);
          double D = 0.0, Dabs = 0.0;
          (void)ref_attention_probs(p, q, k, &seg, hq, i, probs, NULL);
          for (x = 0; x < d; x++) {
            q_row[x] = ref_get(q, seg.q_batch, seg.q_row0 + i, hq, x);
            dq_row[x] = mq_row[x] = 0.0;
          }
          for (x = 0; x < dv_d; x++) do_row[x] = ref_get(d_o, seg.q_batch, seg.q_row0 + i, hq, x);
          if (o) {
            for (x = 0; x < dv_d; x++) o_row[x] = ref_get(o, seg.q_batch, seg.q_row0 + i, hq, x);
          } else {
            out_row(dr, q, k, v, &seg, s, hq, i, visible, probs, o_row);
          }
          for (x = 0; x < dv_d; x++) D += do_row[x] * o_row[x], Dabs += fabs(do_row[x] * o_row[x]);
          for (j = 0; j < visible; j++) {
            const double f = ref_dropout_factor(dr, stream, i, j);
            const double pij = probs[j];
            double dp = 0.0, dpabs = 0.0, ds, dsabs;
            for (x = 0; x < dv_d; x++)
              dp += do_row[x] * vseg[j * dv_d + x], dpabs += fabs(do_row[x] * vseg[j * dv_d + x]);
            dp *= f;
            ds = pij * (dp - D);
            dsabs = pij * (f * dpabs + Dabs);
            for (x = 0; x < dv_d; x++) dvseg[j * dv_d + x] += pij * f * do_row[x];
            for (x = 0; x < d; x++) {
              dkseg[j * d + x] += ds * q_row[x];
              dq_row[x] += ds * kseg[j * d + x];
            }
            if (want_mag) {
              for (x = 0; x < dv_d; x++) {
                const double tv = pij * f * do_row[x];
                mvseg[j * dv_d + x] += tv * tv;
              }
              for (x = 0; x < d; x++) {
                const double tk = dsabs * q_row[x], tq = dsabs * kseg[j * d + x];
                mkseg[j * d + x] += tk * tk;
                mq_row[x] += tq * tq;
              }
            }
          }
          for (x = 0; x < d; x++) *ref_at(dq, seg.q_batch, seg.q_row0 + i, hq, x) = scale * dq_row[x];
          if (want_mag)
            for (x = 0; x < d; x++) *ref_at(mag_dq, seg.q_batch, seg.q_row0 + i, hq, x) = scale * sqrt(mq_row[x]);
        }
      }
      for (j = 0; j < seg.nk; j++) {
        for (x = 0; x < d; x++) {
          *ref_at(dk, seg.k_batch, seg.k_row0 + j, hk, x) += scale * dkseg[j * d + x];
          if (want_mag) *ref_at(mag_dk, seg.k_batch, seg.k_row0 + j, hk, x) = scale * sqrt(mkseg[j * d + x]);
        }
        for (x = 0; x < dv_d; x++) {
          *ref_at(dv, seg.k_batch, seg.k_row0 + j, hk, x) += dvseg[j * dv_d + x];
          if (want_mag) *ref_at(mag_dv, seg.k_batch, seg.k_row0 + j, hk, x) = sqrt(mvseg[j * dv_d + x]);
        }
      }
    }
  }
  rc = 0;
done:
  free(probs);
  free(o_row);
  free(do_row);
  free(q_row);
  free(dq_row);
  free(kseg);
  free(vseg);
  free(dkseg);
  free(dvseg);
  free(mq_row);
  free(mkseg);
  free(mvseg);
  return rc;
}
