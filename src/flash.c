/* The flash forward path: one fused kernel, no scratch memory. */
#include "internal.h"
#include "kernel_args.h"

#include <stdio.h>

flashcl_status fcl_flash_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                 const flashcl_tensor *o, const flashcl_tensor *lse, cl_uint nwait,
                                 const cl_event *wait, cl_event *out_event) {
  fcl_plan plan;
  flashcl_status st = fcl_make_plan(ctx, p->head_dim, p->dtype, desc->block_r, desc->block_c, &plan);
  if (st != FLASHCL_SUCCESS) return st;
  char opts[512];
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_R=%d -DBLOCK_C=%d -DROW_THREADS=%d -DCOL_THREADS=%d "
           "-DCAUSAL=%d -DVARLEN=%d",
           (int)p->dtype, p->head_dim, plan.br, plan.bc, plan.rt, plan.ct, p->causal, p->varlen);
  cl_kernel kern;
  st = fcl_get_kernel(ctx, "flash_fwd.cl", opts, "flash_fwd", &kern);
  if (st != FLASHCL_SUCCESS) return st;
  size_t kwg = 0;
  if (clGetKernelWorkGroupInfo(kern, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) ==
          CL_SUCCESS &&
      kwg < (size_t)plan.threads)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "flash_fwd with Br=%d, Bc=%d, d=%d needs %d work-items but the compiled kernel allows %zu; "
                    "try smaller block_r/block_c",
                    plan.br, plan.bc, p->head_dim, plan.threads, kwg);

  const float log2e = 1.4426950408889634f;
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, q);
  fcl_arg_tensor(&a, k);
  fcl_arg_tensor(&a, v);
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
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_int(&a, p->heads_q / p->heads_kv);
  fcl_arg_float(&a, p->scale * log2e);
  fcl_arg_mem(&a, p->varlen ? desc->cu_seqlens_q : NULL);
  fcl_arg_mem(&a, p->varlen ? desc->cu_seqlens_k : NULL);
  fcl_arg_int(&a, (int)q->shape[1]);
  fcl_arg_int(&a, (int)k->shape[1]);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(flash_fwd)");

  size_t qblocks = ((size_t)p->seqlen_q + plan.br - 1) / plan.br;
  size_t global[3] = {qblocks * plan.threads, (size_t)p->heads_q, (size_t)p->batch};
  size_t local[3] = {(size_t)plan.threads, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, local, nwait, nwait ? wait : NULL, out_event);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clEnqueueNDRangeKernel(flash_fwd)");
  return FLASHCL_SUCCESS;
}
