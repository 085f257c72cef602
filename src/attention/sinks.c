/* The attention sinks' gradient (desc.dsinks) beside any family's backward:
 * checked with the call, its kernel (cl/common/sink_grad.cl) set up before the
 * backward is enqueued and enqueued after it, so that out_event covers both. */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "attention/attention.h"

#include <stdio.h>

/* desc.dsinks: with desc.sinks, >= heads_q floats, and no byte shared with the
 * call's tensors or auxiliary buffers (its one write must not race a read). */
flashcl_status fcl_sinks_grad_check(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                                    const flashcl_tensor *const *views, const char *const *names, int nviews) {
  if (!desc->dsinks) return FLASHCL_SUCCESS;
  if (!desc->sinks)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.dsinks is set but desc.sinks is NULL");
  flashcl_status st = fcl_check_head_floats(ctx, desc->dsinks, p->heads_q, "desc.dsinks");
  if (st != FLASHCL_SUCCESS) return st;
  const size_t bytes = (size_t)p->heads_q * sizeof(float);
  for (int i = 0; i < nviews; i++)
    if (fcl_range_conflict(views[i], desc->dsinks, 0, bytes))
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.dsinks overlaps %s", names[i]);
  fcl_aux aux[FCL_MAX_AUX];
  const int n = fcl_problem_aux(p, desc, aux);
  for (int i = 0; i < n; i++)
    if (aux[i].mem == desc->dsinks && aux[i].offset < bytes)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.dsinks overlaps %s", aux[i].name);
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_sinks_grad_prepare(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                                      const flashcl_tensor *o, const flashcl_tensor *lse, const flashcl_tensor *d_o,
                                      cl_kernel *kern) {
  char opts[256];
  const char *extra = ctx->build_options;
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DVARLEN=%d -DWG=%d%s%s", (int)p->dtype,
           p->head_dim, p->varlen, FCL_SINK_GRAD_WG, extra ? " " : "", extra ? extra : "");
  flashcl_status st = fcl_get_kernel(ctx, "dtype.cl+seq_bounds.cl+sink_grad.cl", opts, "sink_grad", kern);
  if (st != FLASHCL_SUCCESS) return st;
  fcl_args a = {*kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, o);
  fcl_arg_tensor(&a, d_o);
  fcl_arg_lse(&a, lse);
  fcl_arg_mem(&a, desc->sinks);
  fcl_arg_mem(&a, desc->dsinks);
  fcl_arg_int(&a, p->batch);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_mem(&a, p->varlen ? desc->cu_seqlens_q : NULL);
  fcl_arg_int(&a, (int)o->shape[1]);
  return a.err == CL_SUCCESS ? FLASHCL_SUCCESS : fcl_cl_fail(ctx, a.err, "clSetKernelArg(sink_grad)");
}

flashcl_status fcl_sinks_grad_enqueue(flashcl_context *ctx, cl_kernel kern, const fcl_problem *p, cl_event after,
                                      cl_event *out_event) {
  const size_t global[3] = {(size_t)FCL_SINK_GRAD_WG * (size_t)p->heads_q, 1, 1};
  const size_t local[3] = {FCL_SINK_GRAD_WG, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 1, NULL, global, local, after ? 1 : 0,
                                      after ? &after : NULL, out_event);
  /* The gradients are enqueued already: one more try (src/core/retry.c). */
  if (err != CL_SUCCESS && fcl_retry_after_finish(ctx, NULL, err, "enqueue sink_grad"))
    err = clEnqueueNDRangeKernel(ctx->queue, kern, 1, NULL, global, local, after ? 1 : 0, after ? &after : NULL,
                                 out_event);
  return err == CL_SUCCESS ? FLASHCL_SUCCESS : fcl_cl_fail(ctx, err, "enqueue sink_grad");
}
