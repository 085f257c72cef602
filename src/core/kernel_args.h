/* Setting kernel arguments in order, stopping at the first failure. */
#ifndef FLASHCL_KERNEL_ARGS_H
#define FLASHCL_KERNEL_ARGS_H

#include "core/internal.h"

typedef struct fcl_args {
  cl_kernel kernel;
  cl_uint index;
  cl_int err;
} fcl_args;

static inline void fcl_arg(fcl_args *a, size_t size, const void *value) {
  if (a->err == CL_SUCCESS) a->err = clSetKernelArg(a->kernel, a->index, size, value);
  a->index++;
}
static inline void fcl_arg_mem(fcl_args *a, cl_mem m) { fcl_arg(a, sizeof m, &m); }
static inline void fcl_arg_int(fcl_args *a, int v) { fcl_arg(a, sizeof v, &v); }
static inline void fcl_arg_long(fcl_args *a, int64_t v) {
  cl_long x = (cl_long)v;
  fcl_arg(a, sizeof x, &x);
}
static inline void fcl_arg_float(fcl_args *a, float v) { fcl_arg(a, sizeof v, &v); }

/* Buffer, element offset and (batch, seq, head) strides of a tensor. */
static inline void fcl_arg_tensor(fcl_args *a, const flashcl_tensor *t) {
  fcl_arg_mem(a, t->buffer);
  fcl_arg_long(a, (int64_t)(t->offset / flashcl_dtype_size(t->dtype)));
  fcl_arg_long(a, t->stride[0]);
  fcl_arg_long(a, t->stride[1]);
  fcl_arg_long(a, t->stride[2]);
}

/* An fp32 (batch, seq, head) view such as LSE: buffer, element offset, strides;
 * NULL gives a NULL buffer and zeros (kernels take a has_lse flag). */
static inline void fcl_arg_lse(fcl_args *a, const flashcl_tensor *lse) {
  fcl_arg_mem(a, lse ? lse->buffer : NULL);
  fcl_arg_long(a, lse ? (int64_t)(lse->offset / sizeof(float)) : 0);
  for (int i = 0; i < 3; i++) fcl_arg_long(a, lse ? lse->stride[i] : 0);
}

/* The argument prefix every forward kernel shares (flash_fwd, flash_fwd_mma):
 * q, k, v, o, lse, has_lse, seqlen_q, seqlen_k, group, scale_log2, cu_seqlens_q/k,
 * total_q, total_k. */
static inline void fcl_arg_forward(fcl_args *a, const fcl_problem *p, const flashcl_attention_desc *desc,
                                   const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                   const flashcl_tensor *o, const flashcl_tensor *lse) {
  const float log2e = 1.4426950408889634f;
  fcl_arg_tensor(a, q);
  fcl_arg_tensor(a, k);
  fcl_arg_tensor(a, v);
  fcl_arg_tensor(a, o);
  fcl_arg_lse(a, lse);
  fcl_arg_int(a, lse != NULL);
  fcl_arg_int(a, p->seqlen_q);
  fcl_arg_int(a, p->seqlen_k);
  fcl_arg_int(a, p->heads_q / p->heads_kv);
  fcl_arg_float(a, p->scale * log2e);
  fcl_arg_mem(a, p->varlen ? desc->varlen.cu_seqlens_q : NULL);
  fcl_arg_mem(a, p->varlen ? desc->varlen.cu_seqlens_k : NULL);
  fcl_arg_int(a, (int)q->shape[1]);
  fcl_arg_int(a, (int)k->shape[1]);
}

/* The trailing paged-source arguments of the forward kernels built with
 * -DPAGED_KV=1 (flash_fwd, flash_fwd_mma); nothing otherwise. */
static inline void fcl_arg_paged(fcl_args *a, const fcl_problem *p) {
  if (!p->paged_kv) return;
  fcl_arg_mem(a, p->kv_block_table);
  fcl_arg_int(a, p->kv_page_size);
  fcl_arg_int(a, p->kv_max_pages);
  fcl_arg_int(a, p->kv_num_pages);
  fcl_arg_mem(a, p->kv_seqlens);
}

/* The argument prefix the dK/dV kernels share (bwd_dkdv, bwd_dkdv_mma): q, k, v,
 * dO, dK, dV, the LSE view, D and the fp32 dQ accumulator (NULL when unused). */
static inline void fcl_arg_bwd_dkdv_head(fcl_args *a, const flashcl_tensor *q, const flashcl_tensor *k,
                                         const flashcl_tensor *v, const flashcl_tensor *d_o,
                                         const flashcl_tensor *dk, const flashcl_tensor *dv,
                                         const flashcl_tensor *lse, cl_mem dsum, cl_mem dq_acc) {
  fcl_arg_tensor(a, q);
  fcl_arg_tensor(a, k);
  fcl_arg_tensor(a, v);
  fcl_arg_tensor(a, d_o);
  fcl_arg_tensor(a, dk);
  fcl_arg_tensor(a, dv);
  fcl_arg_lse(a, lse);
  fcl_arg_mem(a, dsum);
  fcl_arg_mem(a, dq_acc);
}

/* The argument prefix the deterministic dQ kernels share (bwd_dq, bwd_dq_mma):
 * q, k, v, dO, dQ, the LSE view and D. */
static inline void fcl_arg_bwd_dq_head(fcl_args *a, const flashcl_tensor *q, const flashcl_tensor *k,
                                       const flashcl_tensor *v, const flashcl_tensor *d_o, const flashcl_tensor *dq,
                                       const flashcl_tensor *lse, cl_mem dsum) {
  fcl_arg_tensor(a, q);
  fcl_arg_tensor(a, k);
  fcl_arg_tensor(a, v);
  fcl_arg_tensor(a, d_o);
  fcl_arg_tensor(a, dq);
  fcl_arg_lse(a, lse);
  fcl_arg_mem(a, dsum);
}

static inline void fcl_arg_dropout(fcl_args *a, const fcl_problem *p) {
  cl_ulong seed = p->seed, offset = p->offset;
  cl_uint threshold = p->threshold;
  fcl_arg(a, sizeof seed, &seed);
  fcl_arg(a, sizeof offset, &offset);
  fcl_arg(a, sizeof threshold, &threshold);
  fcl_arg_float(a, p->keep_scale);
}

/* The score-variant arguments of flash_fwd and flash_bwd: window_left,
 * window_right (effective, see fcl_problem), alibi slopes (NULL when off), and
 * for softcap c: scale / c (applied to q.k) and c * log2(e) (the scores are in
 * the log2 domain); zeros when off. */
static inline void fcl_arg_variants(fcl_args *a, const fcl_problem *p) {
  const float log2e = 1.4426950408889634f;
  fcl_arg_int(a, p->window_left);
  fcl_arg_int(a, p->window_right);
  fcl_arg_mem(a, p->alibi);
  fcl_arg_float(a, p->softcap > 0.0f ? p->scale / p->softcap : 0.0f);
  fcl_arg_float(a, p->softcap > 0.0f ? p->softcap * log2e : 0.0f);
}

/* The attention-mask arguments of flash_fwd, naive_softmax, and (only when a
 * mask is set: they take them under -DMASK only) bwd_dkdv / bwd_dq: mask words
 * (NULL when off), word strides between sequences and between query heads, words
 * per row, and the block size (1 x 1 for FLASHCL_MASK_BITS). */
static inline void fcl_arg_mask(fcl_args *a, const fcl_problem *p) {
  fcl_arg_mem(a, p->mask_kind ? p->mask : NULL);
  fcl_arg_long(a, p->mask_bstride);
  fcl_arg_long(a, p->mask_hstride);
  fcl_arg_int(a, p->mask_words);
  fcl_arg_int(a, p->mask_bq);
  fcl_arg_int(a, p->mask_bk);
}

#endif
