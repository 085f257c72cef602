/*
 * Double-precision CPU reference for flashcl's attention.
 *
 * Everything here is plain C99 with no OpenCL: tensors are read through a strided
 * accessor (ref_tensor), so the reference consumes exactly the bytes the device
 * reads (fp16/bf16 loaders live in common.c) and any layout, offset or stride the
 * library accepts.
 *
 * The computation is split so a backward reference can reuse it:
 *   - ref_attention_num_segments / ref_attention_segment enumerate the independent
 *     attention problems (one per batch entry, or one per varlen sequence);
 *   - ref_attention_probs computes one query row's softmax probabilities P[i, :]
 *     (masked keys get 0) and returns its LSE;
 *   - ref_attention_forward builds O = P V and LSE from those.
 * A later ref_attention_backward(params, q, k, v, do, dq, dk, dv) only needs
 * ref_attention_probs plus dP = dO V^T, D_i = sum_x dO_ix O_ix and
 * dS = P * (dP - D) (see the note at the end of this header).
 */
#ifndef FLASHCL_TESTS_REFERENCE_H
#define FLASHCL_TESTS_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Index names (same order as flashcl_tensor). */
enum { REF_B = 0, REF_N = 1, REF_H = 2, REF_D = 3 };

/* Loads element `index` (in elements, relative to base) as a double. */
typedef double (*ref_load_fn)(const void *base, int64_t index);

double ref_load_f64(const void *base, int64_t index);
double ref_load_f32(const void *base, int64_t index);

/* A read-only 4-D strided view: element (b, n, h, x) is
 *   load(data, offset + b*stride[0] + n*stride[1] + h*stride[2] + x*stride[3]). */
typedef struct ref_tensor {
  const void *data;
  ref_load_fn load; /* NULL means data is const double[] */
  int64_t offset;   /* elements */
  int64_t shape[4];
  int64_t stride[4]; /* elements; any value >= 0 (0 broadcasts) */
} ref_tensor;

/* A writable 4-D strided double view (outputs: O, LSE, later dQ/dK/dV). */
typedef struct ref_out {
  double *data;
  int64_t shape[4];
  int64_t stride[4];
} ref_out;

double ref_get(const ref_tensor *t, int64_t b, int64_t n, int64_t h, int64_t x);
double *ref_at(const ref_out *t, int64_t b, int64_t n, int64_t h, int64_t x);

/* Views over contiguous double arrays. */
ref_tensor ref_tensor_bnhd(const double *data, int64_t B, int64_t N, int64_t H, int64_t D);
ref_out ref_out_bnhd(double *data, int64_t B, int64_t N, int64_t H, int64_t D);

typedef struct ref_attention_params {
  double scale; /* 0 means 1/sqrt(head_dim) */
  int causal;   /* bottom-right aligned: row i sees key j iff j <= i + (Nk - Nq) */
  /* Varlen: when cu_seqlens_q != NULL, q/o are (1, total_q, Hq, d), k/v are
   * (1, total_k, Hkv, d) and sequence s owns rows [cu_q[s], cu_q[s+1]) of q and
   * [cu_k[s], cu_k[s+1]) of k/v. Both arrays have num_seqs + 1 entries. */
  const int32_t *cu_seqlens_q;
  const int32_t *cu_seqlens_k;
  int num_seqs;
} ref_attention_params;

/* One independent attention problem: rows [q_row0, q_row0 + nq) of batch q_batch
 * attend to rows [k_row0, k_row0 + nk) of batch k_batch. */
typedef struct ref_segment {
  int64_t q_batch, q_row0, nq;
  int64_t k_batch, k_row0, nk;
} ref_segment;

/* Checks shapes (q/k/v agree, but for v's head dim, which may differ from q
 * and k's; Hq % Hkv == 0, varlen consistency). 0 if usable, -1 otherwise.
 * Every function below calls it. */
int ref_attention_check(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k,
                        const ref_tensor *v);

int64_t ref_attention_num_segments(const ref_attention_params *p, const ref_tensor *q);
ref_segment ref_attention_segment(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k,
                                  int64_t s);

/* The effective softmax scale (p->scale, or 1/sqrt(d) when 0). */
double ref_attention_scale(const ref_attention_params *p, const ref_tensor *q);

/* The kv head that query head hq reads (GQA): hq / (Hq / Hkv). */
int64_t ref_attention_kv_head(const ref_tensor *q, const ref_tensor *k, int64_t hq);

/* Number of keys (a prefix of the segment's keys) that row i of segment seg sees. */
int64_t ref_attention_visible_keys(const ref_attention_params *p, const ref_segment *seg, int64_t i);

/* Softmax probabilities of query row i (0-based within seg) and query head hq:
 * probs[j] for j in [0, seg->nk), 0 for masked keys. Returns the natural-log LSE of
 * the scaled scores, or -INFINITY when the row sees no key (then all probs are 0).
 * scores, if non-NULL, receives the scaled scores (masked keys: -INFINITY). */
double ref_attention_probs(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k,
                           const ref_segment *seg, int64_t hq, int64_t i, double *probs, double *scores);

/* O (shape of q, with v's head dim) and LSE (logical shape (Bq, Nq, Hq, 1); may be NULL). A row that
 * sees no key gets O = 0 and LSE = -INFINITY. Returns 0, or -1 on bad input. */
int ref_attention_forward(const ref_attention_params *p, const ref_tensor *q, const ref_tensor *k,
                          const ref_tensor *v, const ref_out *o, const ref_out *lse);

/*
 * Backward (to be added): with P from ref_attention_probs and dO,
 *   dV_j += sum_i P_ij dO_i;  dP_ij = dO_i . V_j;  D_i = dO_i . O_i;
 *   dS_ij = P_ij (dP_ij - D_i);  dQ_i = scale * sum_j dS_ij K_j;  dK_j += scale * sum_i dS_ij Q_i
 * with GQA summing dK/dV over the query heads that share a kv head.
 */

#ifdef __cplusplus
}
#endif
#endif
