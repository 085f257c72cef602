/* The naive baseline: S = scale * Q K^T and O = P V as CLBlast SGEMMs, with a
 * softmax kernel between them. It materialises the N x N score matrix on
 * purpose: it is the reference point for flashcl's speed and memory figures.
 *
 * Inputs are first copied to dense fp32 (also how fp16/bf16 run on devices
 * without cl_khr_fp16, such as NVIDIA's OpenCL), and the caller's o and lse are
 * written by the last kernel only, so a failure anywhere earlier leaves them
 * untouched. */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "naive/naive.h"

#include <clblast_c.h>
#include <stdio.h>

typedef struct fcl_naive_sizes {
  size_t q, kv, s, lse; /* floats in Q/O, in each of K and V, in S/P, in the LSE scratch */
} fcl_naive_sizes;

static flashcl_status fcl_naive_sizes_of(flashcl_context *ctx, const fcl_problem *p, fcl_naive_sizes *z,
                                         size_t *bytes) {
  size_t rows_q, rows_k, t;
  int ok = fcl_mul_size((size_t)p->batch * (size_t)p->heads_q, (size_t)p->seqlen_q, &rows_q) &&
           fcl_mul_size((size_t)p->batch * (size_t)p->heads_kv, (size_t)p->seqlen_k, &rows_k) &&
           fcl_mul_size(rows_q, (size_t)p->head_dim, &z->q) && fcl_mul_size(rows_k, (size_t)p->head_dim, &z->kv) &&
           fcl_mul_size(rows_q, (size_t)p->seqlen_k, &z->s);
  z->lse = rows_q;
  ok = ok && fcl_add_size(z->q, z->kv, &t) && fcl_add_size(t, z->kv, &t) && fcl_add_size(t, z->s, &t) &&
       fcl_add_size(t, z->lse, &t) && fcl_mul_size(t, sizeof(float), bytes);
  if (!ok) return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "naive workspace size overflows size_t");
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_naive_workspace(flashcl_context *ctx, const fcl_problem *p, size_t *bytes) {
  fcl_naive_sizes z;
  return fcl_naive_sizes_of(ctx, p, &z, bytes);
}

/* CLBlast's batched GEMM kernels index a buffer with 32-bit integers: on an
 * NVIDIA H100 a score matrix of more than 2^31 floats (e.g. 16 heads at
 * N = 16384) made the GEMM fault and left the context unusable. Refuse such calls
 * up front with a clean status instead. */
#define FCL_BLAS_MAX_ELEMENTS ((size_t)1 << 31)

static flashcl_status fcl_blas_limit(flashcl_context *ctx, const fcl_naive_sizes *z) {
  if (z->s <= FCL_BLAS_MAX_ELEMENTS && z->q <= FCL_BLAS_MAX_ELEMENTS && z->kv <= FCL_BLAS_MAX_ELEMENTS)
    return FLASHCL_SUCCESS;
  return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY,
                  "naive attention: the score matrices of this call hold %zu floats, more than the 2^31 that "
                  "CLBlast's GEMM kernels can index; use the flash path or fewer heads per call",
                  z->s);
}

static flashcl_status fcl_blas_fail(flashcl_context *ctx, CLBlastStatusCode code, const char *what) {
  if (code > -1000) return fcl_cl_fail(ctx, (cl_int)code, what);
  return fcl_fail(ctx, FLASHCL_ERROR_BLAS, "%s failed: CLBlast status %d", what, (int)code);
}

/* One strided-batched SGEMM over the (sequence, kv-head) groups, row-major. */
static flashcl_status fcl_gemm(flashcl_context *ctx, const char *what, int ta, int tb, size_t m, size_t n, size_t kk,
                               float alpha, cl_mem a, size_t lda, size_t sa, cl_mem b, size_t ldb, size_t sb, cl_mem c,
                               size_t ldc, size_t sc, size_t batch) {
  cl_command_queue queue = ctx->queue;
  CLBlastStatusCode bs = CLBlastSgemmStridedBatched(
      CLBlastLayoutRowMajor, ta ? CLBlastTransposeYes : CLBlastTransposeNo, tb ? CLBlastTransposeYes : CLBlastTransposeNo,
      m, n, kk, alpha, a, 0, lda, sa, b, 0, ldb, sb, 0.0f, c, 0, ldc, sc, batch, &queue, NULL);
  return bs == CLBlastSuccess ? FLASHCL_SUCCESS : fcl_blas_fail(ctx, bs, what);
}

static flashcl_status fcl_enqueue(flashcl_context *ctx, cl_kernel kern, size_t g0, size_t g1, size_t g2,
                                  size_t l0, cl_uint nwait, const cl_event *wait, cl_event *ev, const char *what) {
  size_t global[3] = {g0, g1, g2};
  size_t local[3] = {l0, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, l0 ? local : NULL, nwait,
                                      nwait ? wait : NULL, ev);
  return err == CL_SUCCESS ? FLASHCL_SUCCESS : fcl_cl_fail(ctx, err, what);
}

static flashcl_status fcl_pack(flashcl_context *ctx, cl_kernel kern, const flashcl_tensor *t, cl_mem dst,
                               int heads, int padded, int batch, cl_mem cu, int total, cl_uint nwait,
                               const cl_event *wait, int dim) {
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, t);
  fcl_arg_mem(&a, dst);
  fcl_arg_int(&a, heads);
  fcl_arg_int(&a, padded);
  fcl_arg_mem(&a, cu);
  fcl_arg_int(&a, total);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_pack)");
  return fcl_enqueue(ctx, kern, (size_t)dim, (size_t)padded, (size_t)batch * heads, 0, nwait, wait, NULL,
                     "enqueue naive_pack");
}

/* naive_pack_paged: K or V of every sequence gathered from the page pool t. */
static flashcl_status fcl_pack_paged(flashcl_context *ctx, cl_kernel kern, const flashcl_tensor *t, cl_mem dst,
                                     const fcl_problem *p, cl_uint nwait, const cl_event *wait) {
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, t);
  fcl_arg_mem(&a, dst);
  fcl_arg_int(&a, p->heads_kv);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_mem(&a, p->kv_block_table);
  fcl_arg_int(&a, p->kv_page_size);
  fcl_arg_int(&a, p->kv_max_pages);
  fcl_arg_int(&a, p->kv_num_pages);
  fcl_arg_mem(&a, p->kv_seqlens);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_pack_paged)");
  return fcl_enqueue(ctx, kern, (size_t)p->head_dim, (size_t)p->seqlen_k, (size_t)p->batch * p->heads_kv, 0, nwait,
                     wait, NULL, "enqueue naive_pack_paged");
}

static flashcl_status fcl_softmax(flashcl_context *ctx, cl_kernel kern, cl_mem scores, cl_mem lse_ws,
                                  const fcl_problem *p, cl_mem cu_q, cl_mem cu_k, int tq, int tk, int wg, size_t rows) {
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_mem(&a, scores);
  fcl_arg_mem(&a, lse_ws);
  fcl_arg_int(&a, p->heads_q);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_mem(&a, cu_q);
  fcl_arg_mem(&a, cu_k);
  fcl_arg_int(&a, tq);
  fcl_arg_int(&a, tk);
  fcl_arg_int(&a, p->window_left);
  fcl_arg_int(&a, p->window_right);
  fcl_arg_mem(&a, p->alibi);
  fcl_arg_float(&a, p->softcap);
  fcl_arg_mask(&a, p);
  if (p->paged_kv) fcl_arg_mem(&a, p->kv_seqlens); /* only built with -DPAGED_KV=1 */
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_softmax)");
  return fcl_enqueue(ctx, kern, rows * (size_t)wg, 1, 1, (size_t)wg, 0, NULL, NULL, "enqueue naive_softmax");
}

/* Writes rows of a dense fp32 [seq][head][row][d] buffer into a caller's tensor
 * (and the LSE scratch into lse when given). */
static flashcl_status fcl_unpack(flashcl_context *ctx, cl_kernel kern, cl_mem src, cl_mem lse_ws,
                                 const flashcl_tensor *t, const flashcl_tensor *lse, int heads, int padded, int batch,
                                 cl_mem cu, int total, int d, cl_event *ev) {
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_mem(&a, src);
  fcl_arg_mem(&a, lse_ws);
  fcl_arg_tensor(&a, t);
  fcl_arg_lse(&a, lse);
  fcl_arg_int(&a, lse != NULL);
  fcl_arg_int(&a, heads);
  fcl_arg_int(&a, padded);
  fcl_arg_mem(&a, cu);
  fcl_arg_int(&a, total);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_unpack)");
  return fcl_enqueue(ctx, kern, (size_t)d, (size_t)padded, (size_t)batch * heads, 0, 0, NULL, ev,
                     "enqueue naive_unpack");
}

/* dst = P * Z / (1 - p) over the dense [seq][head][row][col] score layout. */
static flashcl_status fcl_dropout_apply(flashcl_context *ctx, const char *src, const char *opts, cl_mem from, cl_mem to,
                                       const fcl_problem *p) {
  cl_kernel kern;
  flashcl_status st = fcl_get_kernel(ctx, src, opts, "naive_dropout", &kern);
  if (st != FLASHCL_SUCCESS) return st;
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_mem(&a, from);
  fcl_arg_mem(&a, to);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_dropout(&a, p);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_dropout)");
  return fcl_enqueue(ctx, kern, (size_t)p->seqlen_k, (size_t)p->seqlen_q, (size_t)p->batch * p->heads_q, 0, 0, NULL,
                     NULL, "enqueue naive_dropout");
}

flashcl_status fcl_naive_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                 const flashcl_tensor *o, const flashcl_tensor *lse, cl_uint nwait,
                                 const cl_event *wait, cl_event *out_event) {
  fcl_naive_sizes z;
  size_t total_bytes;
  flashcl_status st = fcl_naive_sizes_of(ctx, p, &z, &total_bytes);
  if (st != FLASHCL_SUCCESS) return st;
  const size_t largest = z.s > z.q ? z.s : z.q;
  if (largest * sizeof(float) > ctx->info.max_mem_alloc_size || total_bytes > ctx->info.global_mem_size)
    return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY,
                    "naive attention needs %zu bytes of scratch (an N x N score matrix of %zu bytes); the device "
                    "allows %llu bytes per buffer and has %llu in all",
                    total_bytes, z.s * sizeof(float), (unsigned long long)ctx->info.max_mem_alloc_size,
                    (unsigned long long)ctx->info.global_mem_size);

  if ((st = fcl_blas_limit(ctx, &z))) return st;
  const int wg = ctx->info.max_work_group_size >= 64 ? 64 : 1;
  char opts[256], variants[64];
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DCAUSAL=%d -DVARLEN=%d -DWG=%d -DDROPOUT=%d%s",
           (int)p->dtype, p->head_dim, p->causal && !p->window, p->varlen, wg, p->dropout,
           fcl_variant_options(p, variants, sizeof variants));
  const char *src = p->dropout ? "philox.cl+dtype.cl+seq_bounds.cl+naive.cl" : "dtype.cl+seq_bounds.cl+naive.cl";
  cl_kernel k_pack, k_soft, k_unpack, k_paged = NULL;
  if ((st = fcl_get_kernel(ctx, src, opts, "naive_pack", &k_pack)) ||
      (st = fcl_get_kernel(ctx, src, opts, "naive_softmax", &k_soft)) ||
      (st = fcl_get_kernel(ctx, src, opts, "naive_unpack", &k_unpack)) ||
      (p->paged_kv && (st = fcl_get_kernel(ctx, src, opts, "naive_pack_paged", &k_paged))))
    return st;

  cl_mem buf[5] = {NULL, NULL, NULL, NULL, NULL}; /* Q (reused for O), K, V, S, LSE */
  const size_t counts[5] = {z.q, z.kv, z.kv, z.s, z.lse};
  for (int i = 0; i < 5; i++) {
    cl_int err;
    buf[i] = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, counts[i] * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) {
      st = fcl_cl_fail(ctx, err, "allocating the naive workspace");
      goto done;
    }
  }
  cl_command_queue_properties qprops = 0;
  clGetCommandQueueInfo(ctx->queue, CL_QUEUE_PROPERTIES, sizeof qprops, &qprops, NULL);
  /* CLBlast takes no wait list, so an out-of-order queue needs explicit barriers. */
  const int ooo = (qprops & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;

  const cl_mem cu_q = p->varlen ? desc->cu_seqlens_q : NULL, cu_k = p->varlen ? desc->cu_seqlens_k : NULL;
  const int tq = (int)q->shape[1], tk = (int)k->shape[1], d = p->head_dim;
  if ((st = fcl_pack(ctx, k_pack, q, buf[0], p->heads_q, p->seqlen_q, p->batch, cu_q, tq, nwait, wait, d)))
    goto done;
  if (p->paged_kv) {
    if ((st = fcl_pack_paged(ctx, k_paged, k, buf[1], p, nwait, wait)) ||
        (st = fcl_pack_paged(ctx, k_paged, v, buf[2], p, nwait, wait)))
      goto done;
  } else if ((st = fcl_pack(ctx, k_pack, k, buf[1], p->heads_kv, p->seqlen_k, p->batch, cu_k, tk, nwait, wait, d)) ||
             (st = fcl_pack(ctx, k_pack, v, buf[2], p->heads_kv, p->seqlen_k, p->batch, cu_k, tk, nwait, wait, d)))
    goto done;
  if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);

  const size_t g = (size_t)(p->heads_q / p->heads_kv), lq = (size_t)p->seqlen_q, lk = (size_t)p->seqlen_k;
  const size_t groups = (size_t)p->batch * (size_t)p->heads_kv;
  if ((st = fcl_gemm(ctx, "S = QK^T", 0, 1, g * lq, lk, (size_t)d, p->scale, buf[0], (size_t)d, g * lq * d, buf[1],
                     (size_t)d, lk * d, buf[3], lk, g * lq * lk, groups)))
    goto done;
  if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);

  if ((st = fcl_softmax(ctx, k_soft, buf[3], buf[4], p, cu_q, cu_k, tq, tk, wg, z.lse))) goto done;
  if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);
  if (p->dropout) {
    if ((st = fcl_dropout_apply(ctx, src, opts, buf[3], buf[3], p))) goto done;
    if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);
  }

  if ((st = fcl_gemm(ctx, "O = PV", 0, 0, g * lq, (size_t)d, lk, 1.0f, buf[3], lk, g * lq * lk, buf[2], (size_t)d,
                     lk * d, buf[0], (size_t)d, g * lq * d, groups)))
    goto done;
  if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);

  st = fcl_unpack(ctx, k_unpack, buf[0], buf[4], o, lse, p->heads_q, p->seqlen_q, p->batch, cu_q, tq, d, out_event);

done:
  /* Released objects live until the commands using them finish. */
  for (int i = 0; i < 5; i++)
    if (buf[i]) clReleaseMemObject(buf[i]);
  return st;
}

flashcl_status fcl_naive_backward_workspace(flashcl_context *ctx, const fcl_problem *p, size_t *bytes) {
  fcl_naive_sizes z;
  size_t fwd, t;
  flashcl_status st = fcl_naive_sizes_of(ctx, p, &z, &fwd);
  if (st != FLASHCL_SUCCESS) return st;
  /* Forward's Q/K/V/S/LSE, plus O, dO, dV and dP, and with softcap a copy of the
   * scaled scores (for the tanh derivative). */
  if (!fcl_add_size(fwd, (2 * z.q + z.kv) * sizeof(float), &t) ||
      !fcl_mul_size(z.s, (p->softcap > 0.0f ? 2 : 1) * sizeof(float), bytes) || !fcl_add_size(t, *bytes, bytes))
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "naive backward workspace size overflows size_t");
  return FLASHCL_SUCCESS;
}

/* Standard attention backward (Algorithm 3): P is rebuilt with GEMM + softmax,
 * then dV = P^T dO, dP = dO V^T, dS = P * (dP - D), dQ = dS K, dK = dS^T Q, with
 * the N x N matrices P and dP in device memory. GQA groups are tall matrices, so
 * the GEMMs over a group already sum dK and dV over its query heads. */
flashcl_status fcl_naive_backward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                  const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                  const flashcl_tensor *o, const flashcl_tensor *lse, const flashcl_tensor *d_o,
                                  const flashcl_tensor *dq, const flashcl_tensor *dk, const flashcl_tensor *dv,
                                  cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  (void)lse; /* P is rebuilt by the softmax kernel, which recomputes the row statistics */
  fcl_naive_sizes z;
  size_t total_bytes;
  flashcl_status st = fcl_naive_sizes_of(ctx, p, &z, &total_bytes);
  if (st != FLASHCL_SUCCESS) return st;
  if ((st = fcl_naive_backward_workspace(ctx, p, &total_bytes))) return st;
  const size_t largest = z.s > z.q ? z.s : z.q;
  if (largest * sizeof(float) > ctx->info.max_mem_alloc_size || total_bytes > ctx->info.global_mem_size)
    return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY,
                    "naive attention backward needs %zu bytes of scratch (two N x N matrices of %zu bytes each); "
                    "the device allows %llu bytes per buffer and has %llu in all",
                    total_bytes, z.s * sizeof(float), (unsigned long long)ctx->info.max_mem_alloc_size,
                    (unsigned long long)ctx->info.global_mem_size);

  if ((st = fcl_blas_limit(ctx, &z))) return st;
  const int wg = ctx->info.max_work_group_size >= 64 ? 64 : 1;
  char opts[256], variants[64];
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DCAUSAL=%d -DVARLEN=%d -DWG=%d -DDROPOUT=%d%s",
           (int)p->dtype, p->head_dim, p->causal && !p->window, p->varlen, wg, p->dropout,
           fcl_variant_options(p, variants, sizeof variants));
  const char *src = p->dropout ? "philox.cl+dtype.cl+seq_bounds.cl+naive.cl" : "dtype.cl+seq_bounds.cl+naive.cl";
  cl_kernel k_pack, k_soft, k_unpack, k_ds;
  if ((st = fcl_get_kernel(ctx, src, opts, "naive_pack", &k_pack)) ||
      (st = fcl_get_kernel(ctx, src, opts, "naive_softmax", &k_soft)) ||
      (st = fcl_get_kernel(ctx, src, opts, "naive_unpack", &k_unpack)) ||
      (st = fcl_get_kernel(ctx, src, opts, "naive_ds", &k_ds)))
    return st;

  enum { Q, K, V, DO, O, P, DP, DV, LSE, RAW, NBUF };
  cl_mem buf[NBUF] = {0};
  const size_t counts[NBUF] = {z.q, z.kv, z.kv, z.q, z.q, z.s, z.s, z.kv, z.lse, z.s};
  const int softcap = p->softcap > 0.0f;
  for (int i = 0; i < NBUF; i++) {
    cl_int err;
    if (i == RAW && !softcap) continue;
    buf[i] = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, counts[i] * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) {
      st = fcl_cl_fail(ctx, err, "allocating the naive backward workspace");
      goto done;
    }
  }
  cl_command_queue_properties qprops = 0;
  clGetCommandQueueInfo(ctx->queue, CL_QUEUE_PROPERTIES, sizeof qprops, &qprops, NULL);
  const int ooo = (qprops & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
#define FCL_ORDER() \
  if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL)

  const cl_mem cu_q = p->varlen ? desc->cu_seqlens_q : NULL, cu_k = p->varlen ? desc->cu_seqlens_k : NULL;
  const int tq = (int)q->shape[1], tk = (int)k->shape[1], d = p->head_dim;
  if ((st = fcl_pack(ctx, k_pack, q, buf[Q], p->heads_q, p->seqlen_q, p->batch, cu_q, tq, nwait, wait, d)) ||
      (st = fcl_pack(ctx, k_pack, k, buf[K], p->heads_kv, p->seqlen_k, p->batch, cu_k, tk, nwait, wait, d)) ||
      (st = fcl_pack(ctx, k_pack, v, buf[V], p->heads_kv, p->seqlen_k, p->batch, cu_k, tk, nwait, wait, d)) ||
      (st = fcl_pack(ctx, k_pack, d_o, buf[DO], p->heads_q, p->seqlen_q, p->batch, cu_q, tq, nwait, wait, d)) ||
      (st = fcl_pack(ctx, k_pack, o, buf[O], p->heads_q, p->seqlen_q, p->batch, cu_q, tq, nwait, wait, d)))
    goto done;
  FCL_ORDER();
  const size_t g = (size_t)(p->heads_q / p->heads_kv), lq = (size_t)p->seqlen_q, lk = (size_t)p->seqlen_k;
  const size_t groups = (size_t)p->batch * (size_t)p->heads_kv, gq = g * lq;
  if ((st = fcl_gemm(ctx, "S = QK^T", 0, 1, gq, lk, (size_t)d, p->scale, buf[Q], (size_t)d, gq * d, buf[K],
                     (size_t)d, lk * d, buf[P], lk, gq * lk, groups)))
    goto done;
  FCL_ORDER();
  if (softcap) { /* keep the scaled scores: dS needs tanh of them */
    cl_int err = clEnqueueCopyBuffer(ctx->queue, buf[P], buf[RAW], 0, 0, z.s * sizeof(float), 0, NULL, NULL);
    if (err != CL_SUCCESS) {
      st = fcl_cl_fail(ctx, err, "clEnqueueCopyBuffer(scores)");
      goto done;
    }
    FCL_ORDER();
  }
  if ((st = fcl_softmax(ctx, k_soft, buf[P], buf[LSE], p, cu_q, cu_k, tq, tk, wg, z.lse))) goto done;
  FCL_ORDER();
  /* With dropout, dV takes the dropped P, staged in dP's buffer before dP is computed. */
  if (p->dropout) {
    if ((st = fcl_dropout_apply(ctx, src, opts, buf[P], buf[DP], p))) goto done;
    FCL_ORDER();
  }
  if ((st = fcl_gemm(ctx, "dV = P^T dO", 1, 0, lk, (size_t)d, gq, 1.0f, buf[p->dropout ? DP : P], lk, gq * lk, buf[DO], (size_t)d,
                     gq * d, buf[DV], (size_t)d, lk * d, groups)))
    goto done;
  /* With dropout dV read dP's buffer, which dP = dO V^T now overwrites. */
  if (p->dropout) FCL_ORDER();
  if ((st = fcl_gemm(ctx, "dP = dO V^T", 0, 1, gq, lk, (size_t)d, 1.0f, buf[DO], (size_t)d, gq * d, buf[V],
                     (size_t)d, lk * d, buf[DP], lk, gq * lk, groups)))
    goto done;
  FCL_ORDER();
  fcl_args a = {k_ds, 0, CL_SUCCESS};
  fcl_arg_mem(&a, buf[P]);
  fcl_arg_mem(&a, buf[DP]);
  fcl_arg_mem(&a, buf[O]);
  fcl_arg_mem(&a, buf[DO]);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_float(&a, p->scale);
  fcl_arg_dropout(&a, p);
  fcl_arg_mem(&a, buf[RAW]);
  fcl_arg_float(&a, p->softcap);
  if (a.err != CL_SUCCESS) {
    st = fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_ds)");
    goto done;
  }
  if ((st = fcl_enqueue(ctx, k_ds, z.lse * (size_t)wg, 1, 1, (size_t)wg, 0, NULL, NULL, "enqueue naive_ds"))) goto done;
  FCL_ORDER();
  /* O's copy becomes dQ and V's copy becomes dK: neither is read again. */
  if ((st = fcl_gemm(ctx, "dQ = dS K", 0, 0, gq, (size_t)d, lk, 1.0f, buf[DP], lk, gq * lk, buf[K], (size_t)d, lk * d,
                     buf[O], (size_t)d, gq * d, groups)) ||
      (st = fcl_gemm(ctx, "dK = dS^T Q", 1, 0, lk, (size_t)d, gq, 1.0f, buf[DP], lk, gq * lk, buf[Q], (size_t)d,
                     gq * d, buf[V], (size_t)d, lk * d, groups)))
    goto done;
  FCL_ORDER();
  if ((st = fcl_unpack(ctx, k_unpack, buf[O], buf[LSE], dq, NULL, p->heads_q, p->seqlen_q, p->batch, cu_q, tq, d,
                       NULL)) ||
      (st = fcl_unpack(ctx, k_unpack, buf[V], buf[LSE], dk, NULL, p->heads_kv, p->seqlen_k, p->batch, cu_k, tk, d,
                       NULL)) ||
      (st = fcl_unpack(ctx, k_unpack, buf[DV], buf[LSE], dv, NULL, p->heads_kv, p->seqlen_k, p->batch, cu_k, tk, d,
                       NULL)))
    goto done;
  if (out_event) {
    cl_int err = clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, out_event);
    if (err != CL_SUCCESS) st = fcl_cl_fail(ctx, err, "clEnqueueBarrierWithWaitList");
  }
#undef FCL_ORDER
done:
  for (int i = 0; i < NBUF; i++)
    if (buf[i]) clReleaseMemObject(buf[i]);
  return st;
}
