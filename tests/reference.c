/* Double-precision CPU reference for attention. See reference.h. */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double ref_load_f64(const void *base, int64_t index) { return ((const double *)base)[index]; }

double ref_load_f32(const void *base, int64_t index) { return (double)((const float *)base)[index]; }

double ref_get(const ref_tensor *t, int64_t b, int64_t n, int64_t h, int64_t x) {
  int64_t idx = t->offset + b * t->stride[0] + n * t->stride[1] + h * t->stride[2] + x * t->stride[3];
  return t->load ? t->load(t->data, idx) : ((const double *)t->data)[idx];
}

double *ref_at(const ref_out *t, int64_t b, int64_t n, int64_t h, int64_t x) {
  return t->data + (b * t->stride[0] + n * t->stride[1] + h * t->stride[2] + x * t->stride[3]);
}

ref_tensor ref_tensor_bnhd(const double *data, int64_t B, int64_t N, int64_t H, int64_t D) {
  ref_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.load = NULL;
  t.offset = 0;
  t.shape[0] = B, t.shape[1] = N, t.shape[2] = H, t.shape[3] = D;
  t.stride[3] = 1, t.stride[2] = D, t.stride[1] = H * D, t.stride[0] = N * H * D;
  return t;
}

ref_out ref_out_bnhd(double *data, int64_t B, int64_t N, int64_t H, int64_t D) {
  ref_out t;
  t.data = data;
  t.shape[0] = B, t.shape[1] = N, t.shape[2] = H, t.shape[3] = D;
  t.stride[3] = 1, t.stride[2] = D, t.stride[1] = H * D, t.stride[0] = N * H * D;
  return t;
}

int ref_attention_check(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k,
                        const ref_tensor *v) {
  int i;
  if (!p || !q || !k || !v) return -1;
  for (i = 0; i < 4; i++) {
    /* v may have its own head dim (MLA-style d_v != d_qk); o then has v's. */
    if (q->shape[i] < 0 || k->shape[i] < 0 || (i != REF_D && v->shape[i] != k->shape[i])) return -1;
    if (q->stride[i] < 0 || k->stride[i] < 0 || v->stride[i] < 0) return -1;
  }
  if (q->shape[REF_D] != k->shape[REF_D] || q->shape[REF_D] <= 0 || v->shape[REF_D] <= 0) return -1;
  if (q->shape[REF_H] <= 0 || k->shape[REF_H] <= 0 || q->shape[REF_H] % k->shape[REF_H] != 0) return -1;
  if (p->cu_seqlens_q || p->cu_seqlens_k) {
    int s;
    if (!p->cu_seqlens_q || !p->cu_seqlens_k || p->num_seqs < 1) return -1;
    if (q->shape[REF_B] != 1 || k->shape[REF_B] != 1) return -1;
    if (p->cu_seqlens_q[0] != 0 || p->cu_seqlens_k[0] != 0) return -1;
    for (s = 0; s < p->num_seqs; s++)
      if (p->cu_seqlens_q[s + 1] < p->cu_seqlens_q[s] || p->cu_seqlens_k[s + 1] < p->cu_seqlens_k[s]) return -1;
    if (p->cu_seqlens_q[p->num_seqs] != q->shape[REF_N] || p->cu_seqlens_k[p->num_seqs] != k->shape[REF_N])
      return -1;
  } else if (q->shape[REF_B] != k->shape[REF_B]) {
    return -1;
  }
  return 0;
}

int64_t ref_attention_num_segments(const ref_attention_params *p, const ref_tensor *q) {
  return p->cu_seqlens_q ? (int64_t)p->num_seqs : q->shape[REF_B];
}

ref_segment ref_attention_segment(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k,
                                  int64_t s) {
  ref_segment seg;
  if (p->cu_seqlens_q) {
    seg.q_batch = 0;
    seg.q_row0 = p->cu_seqlens_q[s];
    seg.nq = (int64_t)p->cu_seqlens_q[s + 1] - p->cu_seqlens_q[s];
    seg.k_batch = 0;
    seg.k_row0 = p->cu_seqlens_k[s];
    seg.nk = (int64_t)p->cu_seqlens_k[s + 1] - p->cu_seqlens_k[s];
  } else {
    seg.q_batch = s;
    seg.q_row0 = 0;
    seg.nq = q->shape[REF_N];
    seg.k_batch = s;
    seg.k_row0 = 0;
    seg.nk = k->shape[REF_N];
  }
  return seg;
}

double ref_attention_scale(const ref_attention_params *p, const ref_tensor *q) {
  return p->scale != 0.0 ? p->scale : 1.0 / sqrt((double)q->shape[REF_D]);
}

int64_t ref_attention_kv_head(const ref_tensor *q, const ref_tensor *k, int64_t hq) {
  return hq / (q->shape[REF_H] / k->shape[REF_H]);
}

int64_t ref_attention_visible_keys(const ref_attention_params *p, const ref_segment *seg, int64_t i) {
  int64_t last;
  if (!p->causal) return seg->nk;
  last = i + (seg->nk - seg->nq); /* highest visible key index */
  if (last < 0) return 0;
  return last + 1 < seg->nk ? last + 1 : seg->nk;
}

double ref_attention_probs(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k,
                           const ref_segment *seg, int64_t hq, int64_t i, double *probs, double *scores) {
  const int64_t d = q->shape[REF_D];
  const int64_t hk = ref_attention_kv_head(q, k, hq);
  const int64_t visible = ref_attention_visible_keys(p, seg, i);
  const double scale = ref_attention_scale(p, q);
  double m = -INFINITY, sum = 0.0, lse;
  double qrow_small[512], *qrow = qrow_small;
  int64_t j, x;

  for (j = 0; j < seg->nk; j++) probs[j] = 0.0;
  if (scores)
    for (j = 0; j < seg->nk; j++) scores[j] = -INFINITY;
  if (visible == 0) return -INFINITY;

  if (d > 512) {
    qrow = (double *)malloc((size_t)d * sizeof(double));
    if (!qrow) return NAN;
  }
  for (x = 0; x < d; x++) qrow[x] = ref_get(q, seg->q_batch, seg->q_row0 + i, hq, x);
  for (j = 0; j < visible; j++) {
    double s = 0.0;
    for (x = 0; x < d; x++) s += qrow[x] * ref_get(k, seg->k_batch, seg->k_row0 + j, hk, x);
    s *= scale;
    probs[j] = s; /* scores for now */
    if (scores) scores[j] = s;
    if (s > m) m = s;
  }
  if (qrow != qrow_small) free(qrow);
  for (j = 0; j < visible; j++) sum += exp(probs[j] - m);
  lse = m + log(sum);
  for (j = 0; j < visible; j++) probs[j] = exp(probs[j] - lse);
  return lse;
}

int ref_attention_forward(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k,
                          const ref_tensor *v, const ref_out *o, const ref_out *lse) {
  const int64_t d = v->shape[REF_D]; /* O's columns: v's head dim */
  const int64_t hq_count = q->shape[REF_H];
  int64_t nseg, s, max_nk = 1;
  double *probs;

  if (ref_attention_check(p, q, k, v) != 0 || !o) return -1;
  nseg = ref_attention_num_segments(p, q);
  for (s = 0; s < nseg; s++) {
    ref_segment seg = ref_attention_segment(p, q, k, s);
    if (seg.nk > max_nk) max_nk = seg.nk;
  }
  probs = (double *)malloc((size_t)max_nk * sizeof(double));
  if (!probs) return -1;

  for (s = 0; s < nseg; s++) {
    ref_segment seg = ref_attention_segment(p, q, k, s);
    int64_t hq, i, j, x;
    for (hq = 0; hq < hq_count; hq++) {
      const int64_t hk = ref_attention_kv_head(q, k, hq);
      for (i = 0; i < seg.nq; i++) {
        const int64_t visible = ref_attention_visible_keys(p, &seg, i);
        double l = ref_attention_probs(p, q, k, &seg, hq, i, probs, NULL);
        for (x = 0; x < d; x++) {
          double acc = 0.0;
          for (j = 0; j < visible; j++) acc += probs[j] * ref_get(v, seg.k_batch, seg.k_row0 + j, hk, x);
          *ref_at(o, seg.q_batch, seg.q_row0 + i, hq, x) = acc;
        }
        if (lse) *ref_at(lse, seg.q_batch, seg.q_row0 + i, hq, 0) = l;
      }
    }
  }
  free(probs);
  return 0;
}
