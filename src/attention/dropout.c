/* Dropout: the threshold rule and flashcl_dropout_mask, which materialises the
 * mask that forward and backward regenerate (see cl/common/philox.cl for the layout). */
#include "core/internal.h"
#include "attention/attention.h"

#include <math.h>

cl_uint fcl_dropout_threshold(float p) {
  if (!(p > 0.0f)) return 0;
  double t = floor((double)p * 4294967296.0);
  return t >= 4294967295.0 ? 0xffffffffu : (cl_uint)t;
}

static flashcl_status fcl_dropout_mask_locked(flashcl_context *ctx, const flashcl_attention_desc *desc, int batch,
                                              int heads_q, int seqlen_q, int seqlen_k, cl_mem mask,
                                              cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                              cl_event *out_event) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_attention_desc desc_full;
  flashcl_status imp = fcl_attention_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (!desc || !mask) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc and mask must be non-NULL");
  if (batch <= 0 || heads_q <= 0 || seqlen_q <= 0 || seqlen_k <= 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "batch, heads_q, seqlen_q and seqlen_k must be >= 1");
  if (!(desc->dropout.p >= 0.0f && desc->dropout.p < 1.0f))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.dropout.p must be in [0, 1)");
  if (num_events_in_wait_list && !event_wait_list)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "event_wait_list is NULL");
  size_t n, have = 0;
  if (!fcl_mul_size((size_t)batch * (size_t)heads_q, (size_t)seqlen_q, &n) || !fcl_mul_size(n, (size_t)seqlen_k, &n))
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "mask size overflows size_t");
  flashcl_status st = fcl_buffer_size(ctx, mask, "mask", &have);
  if (st != FLASHCL_SUCCESS) return st;
  if (have < n)
    return fcl_fail(ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL, "mask needs %zu bytes, its cl_mem holds %zu", n, have);
  cl_kernel kern;
  st = fcl_get_kernel(ctx, "philox.cl", "-cl-std=CL1.2", "dropout_mask", &kern);
  if (st != FLASHCL_SUCCESS) return st;
  cl_ulong seed = desc->dropout.seed, offset = desc->dropout.offset;
  cl_uint threshold = fcl_dropout_threshold(desc->dropout.p);
  cl_int err = clSetKernelArg(kern, 0, sizeof mask, &mask);
  err |= clSetKernelArg(kern, 1, sizeof seed, &seed);
  err |= clSetKernelArg(kern, 2, sizeof offset, &offset);
  err |= clSetKernelArg(kern, 3, sizeof threshold, &threshold);
  err |= clSetKernelArg(kern, 4, sizeof seqlen_q, &seqlen_q);
  err |= clSetKernelArg(kern, 5, sizeof seqlen_k, &seqlen_k);
  if (err != CL_SUCCESS) return fcl_fail(ctx, FLASHCL_ERROR_OPENCL, "clSetKernelArg(dropout_mask) failed");
  size_t global[3] = {(size_t)seqlen_k, (size_t)seqlen_q, (size_t)batch * heads_q};
  err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, NULL, num_events_in_wait_list,
                               num_events_in_wait_list ? event_wait_list : NULL, out_event);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "enqueue dropout_mask");
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_dropout_mask(flashcl_context *ctx, const flashcl_attention_desc *desc, int batch, int heads_q,
                                    int seqlen_q, int seqlen_k, cl_mem mask, cl_uint num_events_in_wait_list,
                                    const cl_event *event_wait_list, cl_event *out_event) {
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_dropout_mask_locked(ctx, desc, batch, heads_q, seqlen_q, seqlen_k, mask,
                                                num_events_in_wait_list, event_wait_list, out_event));
}
