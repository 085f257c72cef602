/* flashcl_merge_states: the associative merge of two partial attention results
 * (cl/decode/merge.cl). */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "decode/decode.h"

#include <stdio.h>

static int fcl_same_shape4(const flashcl_tensor *a, const flashcl_tensor *b) {
  return a->shape[0] == b->shape[0] && a->shape[1] == b->shape[1] && a->shape[2] == b->shape[2] &&
         a->shape[3] == b->shape[3];
}

static flashcl_status fcl_merge_states_locked(flashcl_context *ctx, const flashcl_tensor *o_a,
                                              const flashcl_tensor *lse_a, const flashcl_tensor *o_b,
                                              const flashcl_tensor *lse_b, const flashcl_tensor *o,
                                              const flashcl_tensor *lse, cl_uint num_events_in_wait_list,
                                              const cl_event *event_wait_list, cl_event *out_event) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  if (num_events_in_wait_list && !event_wait_list)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "num_events_in_wait_list is %u but event_wait_list is NULL",
                    num_events_in_wait_list);
  flashcl_status st;
  if ((st = fcl_check_tensor(ctx, o_a, "o_a", 1)) || (st = fcl_check_tensor(ctx, lse_a, "lse_a", 0)) ||
      (st = fcl_check_tensor(ctx, o_b, "o_b", 1)) || (st = fcl_check_tensor(ctx, lse_b, "lse_b", 0)) ||
      (st = fcl_check_tensor(ctx, o, "o", 1)))
    return st;
  if (lse && (st = fcl_check_tensor(ctx, lse, "lse", 0))) return st;
  if (o_b->dtype != o_a->dtype || o->dtype != o_a->dtype)
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "o_a, o_b and o must share one dtype (%s, %s, %s)",
                    flashcl_dtype_name(o_a->dtype), flashcl_dtype_name(o_b->dtype), flashcl_dtype_name(o->dtype));
  if (lse_a->dtype != FLASHCL_F32 || lse_b->dtype != FLASHCL_F32 || (lse && lse->dtype != FLASHCL_F32))
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "lse_a, lse_b and lse must be f32");
  if (!fcl_same_shape4(o_b, o_a) || !fcl_same_shape4(o, o_a))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "o_a, o_b and o must have one shape");
  const int64_t d = o_a->shape[3];
  if (d % 8 != 0 || d < 8 || d > FCL_DECODE_MAX_HEAD_DIM_V)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "head_dim %lld is not supported: it must be a multiple of 8 in [8, %d] (o's head dims)",
                    (long long)d, FCL_DECODE_MAX_HEAD_DIM_V);
  const flashcl_tensor *ls[3] = {lse_a, lse_b, lse};
  static const char *lnames[3] = {"lse_a", "lse_b", "lse"};
  for (int i = 0; i < 3; i++)
    if (ls[i] && (ls[i]->shape[0] != o_a->shape[0] || ls[i]->shape[1] != o_a->shape[1] ||
                  ls[i]->shape[2] != o_a->shape[2] || ls[i]->shape[3] != 1))
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "%s must have logical shape (batch, seqlen, heads, 1)",
                      lnames[i]);
  if ((st = fcl_check_output_distinct(ctx, o, "o")) || (st = fcl_check_output_distinct(ctx, lse, "lse"))) return st;
  if (fcl_views_conflict(o, o_a, 1) || fcl_views_conflict(o, o_b, 1) || fcl_views_conflict(o, lse_a, 0) ||
      fcl_views_conflict(o, lse_b, 0) || fcl_views_conflict(lse, lse_a, 1) || fcl_views_conflict(lse, lse_b, 1) ||
      fcl_views_conflict(lse, o_a, 0) || fcl_views_conflict(lse, o_b, 0) || fcl_views_conflict(lse, o, 0))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                    "merge outputs overlap an input or each other; only o == o_a/o_b and lse == lse_a/lse_b "
                    "(identical views) are allowed");
  const int64_t batch = o_a->shape[0], n = o_a->shape[1], heads = o_a->shape[2];
  if ((uint64_t)batch * (uint64_t)heads > 0x7fffffffu)
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "batch * heads exceeds the int32 range");
  if (ctx->info.max_work_group_size < (size_t)(d / 4))
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "merge needs work-groups of %lld work-items", (long long)(d / 4));

  char opts[128];
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d", (int)o_a->dtype, (int)d);
  cl_kernel kern;
  st = fcl_get_kernel(ctx, "dtype.cl+merge.cl", opts, "merge_states", &kern);
  if (st != FLASHCL_SUCCESS) return st;
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, o_a);
  fcl_arg_lse(&a, lse_a);
  fcl_arg_tensor(&a, o_b);
  fcl_arg_lse(&a, lse_b);
  fcl_arg_tensor(&a, o);
  if (lse) {
    fcl_arg_lse(&a, lse);
  } else {
    fcl_arg_mem(&a, NULL);
    for (int i = 0; i < 4; i++) fcl_arg_long(&a, 0);
  }
  fcl_arg_int(&a, lse != NULL);
  fcl_arg_int(&a, (int)heads);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(merge_states)");
  size_t global[3] = {(size_t)d / 4, (size_t)n, (size_t)(batch * heads)};
  size_t local[3] = {(size_t)d / 4, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, local, num_events_in_wait_list,
                                      num_events_in_wait_list ? event_wait_list : NULL, out_event);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clEnqueueNDRangeKernel(merge_states)");
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_merge_states(flashcl_context *ctx, const flashcl_tensor *o_a, const flashcl_tensor *lse_a,
                                    const flashcl_tensor *o_b, const flashcl_tensor *lse_b, const flashcl_tensor *o,
                                    const flashcl_tensor *lse, cl_uint num_events_in_wait_list,
                                    const cl_event *event_wait_list, cl_event *out_event) {
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_merge_states_locked(ctx, o_a, lse_a, o_b, lse_b, o, lse, num_events_in_wait_list,
                                                event_wait_list, out_event));
}
