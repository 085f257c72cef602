/* The naive baseline: S = scale * Q K^T and O = P V as CLBlast SGEMMs, with a
 * softmax kernel between them. It materialises the N x N score matrix on
 * purpose: it is the reference point for flashcl's speed and memory figures.
 *
 * Inputs are first copied to dense fp32 (also how fp16/bf16 run on devices
 * without cl_khr_fp16, such as NVIDIA's OpenCL), and the caller's o and lse are
 * written by the last kernel only, so a failure anywhere earlier leaves them
 * untouched. */
#include "internal.h"
#include "kernel_args.h"

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

static flashcl_status fcl_blas_fail(flashcl_context *ctx, CLBlastStatusCode code, const char *what) {
  if (code > -1000) return fcl_cl_fail(ctx, (cl_int)code, what);
  return fcl_fail(ctx, FLASHCL_ERROR_BLAS, "%s failed: CLBlast status %d", what, (int)code);
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

  const int wg = ctx->info.max_work_group_size >= 64 ? 64 : 1;
  char opts[256];
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DCAUSAL=%d -DVARLEN=%d -DWG=%d",
           (int)p->dtype, p->head_dim, p->causal, p->varlen, wg);
  cl_kernel k_pack, k_soft, k_unpack;
  if ((st = fcl_get_kernel(ctx, "naive.cl", opts, "naive_pack", &k_pack)) ||
      (st = fcl_get_kernel(ctx, "naive.cl", opts, "naive_softmax", &k_soft)) ||
      (st = fcl_get_kernel(ctx, "naive.cl", opts, "naive_unpack", &k_unpack)))
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
  if ((st = fcl_pack(ctx, k_pack, q, buf[0], p->heads_q, p->seqlen_q, p->batch, cu_q, tq, nwait, wait, d)) ||
      (st = fcl_pack(ctx, k_pack, k, buf[1], p->heads_kv, p->seqlen_k, p->batch, cu_k, tk, nwait, wait, d)) ||
      (st = fcl_pack(ctx, k_pack, v, buf[2], p->heads_kv, p->seqlen_k, p->batch, cu_k, tk, nwait, wait, d)))
    goto done;
  if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);

  const size_t g = (size_t)(p->heads_q / p->heads_kv), lq = (size_t)p->seqlen_q, lk = (size_t)p->seqlen_k;
  const size_t groups = (size_t)p->batch * (size_t)p->heads_kv;
  cl_command_queue queue = ctx->queue;
  CLBlastStatusCode bs = CLBlastSgemmStridedBatched(
      CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, g * lq, lk, (size_t)d, p->scale, buf[0], 0,
      (size_t)d, g * lq * d, buf[1], 0, (size_t)d, lk * d, 0.0f, buf[3], 0, lk, g * lq * lk, groups, &queue, NULL);
  if (bs != CLBlastSuccess) {
    st = fcl_blas_fail(ctx, bs, "CLBlastSgemmStridedBatched (S = QK^T)");
    goto done;
  }
  if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);

  fcl_args a = {k_soft, 0, CL_SUCCESS};
  fcl_arg_mem(&a, buf[3]);
  fcl_arg_mem(&a, buf[4]);
  fcl_arg_int(&a, p->heads_q);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_mem(&a, cu_q);
  fcl_arg_mem(&a, cu_k);
  fcl_arg_int(&a, tq);
  fcl_arg_int(&a, tk);
  if (a.err != CL_SUCCESS) {
    st = fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_softmax)");
    goto done;
  }
  if ((st = fcl_enqueue(ctx, k_soft, z.lse * (size_t)wg, 1, 1, (size_t)wg, 0, NULL, NULL, "enqueue naive_softmax")))
    goto done;
  if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);

  bs = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, g * lq, (size_t)d,
                                  lk, 1.0f, buf[3], 0, lk, g * lq * lk, buf[2], 0, (size_t)d, lk * d, 0.0f, buf[0],
                                  0, (size_t)d, g * lq * d, groups, &queue, NULL);
  if (bs != CLBlastSuccess) {
    st = fcl_blas_fail(ctx, bs, "CLBlastSgemmStridedBatched (O = PV)");
    goto done;
  }
  if (ooo) clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);

  a = (fcl_args){k_unpack, 0, CL_SUCCESS};
  fcl_arg_mem(&a, buf[0]);
  fcl_arg_mem(&a, buf[4]);
  fcl_arg_tensor(&a, o);
  if (lse) {
    fcl_arg_mem(&a, lse->buffer);
    fcl_arg_long(&a, (int64_t)(lse->offset / sizeof(float)));
    fcl_arg_long(&a, lse->stride[0]);
    fcl_arg_long(&a, lse->stride[1]);
    fcl_arg_long(&a, lse->stride[2]);
  } else {
    fcl_arg_mem(&a, NULL);
    for (int i = 0; i < 4; i++) fcl_arg_long(&a, 0);
  }
  fcl_arg_int(&a, lse != NULL);
  fcl_arg_int(&a, p->heads_q);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_mem(&a, cu_q);
  fcl_arg_int(&a, tq);
  if (a.err != CL_SUCCESS) {
    st = fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_unpack)");
    goto done;
  }
  st = fcl_enqueue(ctx, k_unpack, (size_t)d, lq, (size_t)p->batch * p->heads_q, 0, 0, NULL, out_event,
                   "enqueue naive_unpack");

done:
  /* Released objects live until the commands using them finish. */
  for (int i = 0; i < 5; i++)
    if (buf[i]) clReleaseMemObject(buf[i]);
  return st;
}
