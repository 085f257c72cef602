/* The attention sinks' gradient (desc.backward.dsinks) beside any family's backward:
 * checked with the call, its kernel (cl/common/sink_grad.cl) set up before the
 * backward is enqueued and enqueued after it, so that out_event covers both. */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "attention/attention.h"

#include <stdio.h>

/* desc.backward.dsinks: with desc.score.sinks, >= heads_q floats, and no byte shared with the
 * call's tensors or auxiliary buffers (its one write must not race a read). */
flashcl_status fcl_sinks_grad_check(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                                    const flashcl_tensor *const *views, const char *const *names, int nviews) {
  if (!desc->backward.dsinks) return FLASHCL_SUCCESS;
  if (!desc->score.sinks)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.backward.dsinks is set but desc.score.sinks is NULL");
  flashcl_status st = fcl_check_head_floats(ctx, desc->backward.dsinks, p->heads_q, "desc.backward.dsinks");
  if (st != FLASHCL_SUCCESS) return st;
  const size_t bytes = (size_t)p->heads_q * sizeof(float);
  for (int i = 0; i < nviews; i++)
    if (fcl_range_conflict(views[i], desc->backward.dsinks, 0, bytes))
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.backward.dsinks overlaps %s", names[i]);
  fcl_aux aux[FCL_MAX_AUX];
  const int n = fcl_problem_aux(p, desc, aux);
  for (int i = 0; i < n; i++)
    if (aux[i].mem == desc->backward.dsinks && aux[i].offset < bytes)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.backward.dsinks overlaps %s", aux[i].name);
  return FLASHCL_SUCCESS;
}

/* Work-groups per head of sink_grad_part: about 4 rows each, at most
 * FCL_SINK_GRAD_MAX_PARTS. A work-group reads its rows one after another, so
 * it is latency that bounds it: short chains in many work-groups keep enough
 * loads in flight (H100, BENCHMARKS.md "Attention sinks": 32 rows per group
 * cost the d = 128 backward 4%). */
#define FCL_SINK_GRAD_MAX_PARTS 4096
static int fcl_sink_parts(const fcl_problem *p) {
  const long pairs = (long)p->batch * p->seqlen_q, per = 4L;
  const long parts = (pairs + per - 1) / per;
  return parts < 1 ? 1 : parts > FCL_SINK_GRAD_MAX_PARTS ? FCL_SINK_GRAD_MAX_PARTS : (int)parts;
}

flashcl_status fcl_sinks_grad_prepare(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                                      const flashcl_tensor *o, const flashcl_tensor *lse, const flashcl_tensor *d_o,
                                      fcl_sinks_grad *g) {
  char opts[256];
  const char *extra = ctx->build_options;
  /* rowsum(dO * O) runs over o's head dim, v's (desc.shape.head_dim_v). */
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DVARLEN=%d -DWG=%d%s%s", (int)p->dtype,
           p->head_dim_v, p->varlen, FCL_SINK_GRAD_WG, extra ? " " : "", extra ? extra : "");
  const char *src = "dtype.cl+seq_bounds.cl+sink_grad.cl";
  g->parts = fcl_sink_parts(p);
  flashcl_status st;
  if ((st = fcl_get_kernel(ctx, src, opts, "sink_grad_part", &g->part)) ||
      (st = fcl_get_kernel(ctx, src, opts, "sink_grad_sum", &g->sum)))
    return st;
  cl_int err = CL_SUCCESS;
  g->scratch = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, (size_t)g->parts * (size_t)p->heads_q * sizeof(float),
                              NULL, &err);
  if (err != CL_SUCCESS || !g->scratch) {
    g->scratch = NULL;
    return fcl_cl_fail(ctx, err != CL_SUCCESS ? err : CL_MEM_OBJECT_ALLOCATION_FAILURE,
                       "allocating the sinks' gradient scratch");
  }
  fcl_args a = {g->part, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, o);
  fcl_arg_tensor(&a, d_o);
  fcl_arg_lse(&a, lse);
  fcl_arg_mem(&a, desc->score.sinks);
  fcl_arg_mem(&a, g->scratch);
  fcl_arg_int(&a, p->batch);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_mem(&a, p->varlen ? desc->varlen.cu_seqlens_q : NULL);
  fcl_arg_int(&a, (int)o->shape[1]);
  fcl_args b = {g->sum, 0, CL_SUCCESS};
  fcl_arg_mem(&b, g->scratch);
  fcl_arg_int(&b, g->parts);
  fcl_arg_mem(&b, desc->backward.dsinks);
  if (a.err != CL_SUCCESS || b.err != CL_SUCCESS) {
    clReleaseMemObject(g->scratch);
    g->scratch = NULL;
    return fcl_cl_fail(ctx, a.err != CL_SUCCESS ? a.err : b.err, "clSetKernelArg(sink_grad)");
  }
  return FLASHCL_SUCCESS;
}

/* One enqueue, with one more try once the gradients are enqueued (src/core/retry.c). */
static cl_int fcl_sink_enqueue(flashcl_context *ctx, cl_kernel k, const size_t *global, cl_event after,
                               cl_event *ev, const char *what) {
  const size_t local[2] = {FCL_SINK_GRAD_WG, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, k, 2, NULL, global, local, after ? 1 : 0, after ? &after : NULL, ev);
  if (err != CL_SUCCESS && fcl_retry_after_flush(ctx, NULL, err, what))
    err = clEnqueueNDRangeKernel(ctx->queue, k, 2, NULL, global, local, after ? 1 : 0, after ? &after : NULL, ev);
  return err;
}

flashcl_status fcl_sinks_grad_enqueue(flashcl_context *ctx, fcl_sinks_grad *g, const fcl_problem *p, cl_event after,
                                      cl_event *out_event) {
  const size_t gpart[2] = {(size_t)FCL_SINK_GRAD_WG * (size_t)g->parts, (size_t)p->heads_q};
  const size_t gsum[2] = {FCL_SINK_GRAD_WG, (size_t)p->heads_q};
  cl_event parted = NULL;
  cl_int err = fcl_sink_enqueue(ctx, g->part, gpart, after, &parted, "enqueue sink_grad_part");
  if (err == CL_SUCCESS) err = fcl_sink_enqueue(ctx, g->sum, gsum, parted, out_event, "enqueue sink_grad_sum");
  if (parted) clReleaseEvent(parted);
  fcl_sinks_grad_release(g); /* the enqueued kernels hold the scratch until they end */
  return err == CL_SUCCESS ? FLASHCL_SUCCESS : fcl_cl_fail(ctx, err, "enqueue sink_grad");
}

void fcl_sinks_grad_release(fcl_sinks_grad *g) {
  if (g->scratch) clReleaseMemObject(g->scratch);
  g->scratch = NULL;
}
