/* Public attention entry points: validate, pick the algorithm, dispatch. */
#include "core/internal.h"
#include "core/tuning.h"
#include "attention/attention.h"
#include "naive/naive.h"
#include "portable/portable.h"

#include <stdlib.h>
#include <string.h>

/* The smallest flashcl_attention_desc taken: 0.2's, the first layout with
 * struct_size. Fields added later go at the end, and this stays. */
#define FCL_ATTENTION_DESC_FIRST sizeof(flashcl_attention_desc)

static void fcl_attention_desc_defaults(flashcl_attention_desc *desc) {
  memset(desc, 0, sizeof *desc);
  desc->struct_size = sizeof *desc;
  desc->algorithm.algo = FLASHCL_ALGO_AUTO;
  desc->algorithm.kernel = FLASHCL_KERNEL_AUTO;
  desc->backward.deterministic = true;
  fcl_score_desc_defaults(&desc->score);
  fcl_kv_layout_defaults(&desc->paged.cache);
}

flashcl_status flashcl_attention_desc_init_size(flashcl_attention_desc *desc, size_t size) {
  flashcl_attention_desc d;
  fcl_attention_desc_defaults(&d);
  return fcl_struct_init(desc, size, &d, sizeof d);
}

flashcl_status fcl_attention_desc_import(flashcl_context *ctx, const flashcl_attention_desc **desc,
                                         flashcl_attention_desc *full) {
  if (!*desc) return FLASHCL_SUCCESS;
  fcl_attention_desc_defaults(full);
  flashcl_status st = fcl_struct_import(ctx, *desc, FCL_ATTENTION_DESC_FIRST, full, sizeof *full,
                                        "flashcl_attention_desc");
  if (st == FLASHCL_SUCCESS) *desc = full;
  return st;
}

flashcl_algo fcl_resolve_algo(const flashcl_context *ctx, const flashcl_attention_desc *desc) {
  (void)ctx;
  return desc->algorithm.algo == FLASHCL_ALGO_AUTO ? FLASHCL_ALGO_FLASH : desc->algorithm.algo;
}

flashcl_status fcl_check_forward_outputs(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                         const fcl_problem *p, const flashcl_tensor *q, const flashcl_tensor *k,
                                         const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse) {
  /* Work-groups write o and lse while others still read q, k, v and the
   * descriptor's buffers. */
  flashcl_status st;
  if ((st = fcl_check_output_distinct(ctx, o, "o")) || (st = fcl_check_output_distinct(ctx, lse, "lse"))) return st;
  if (fcl_views_conflict(o, q, 0) || fcl_views_conflict(o, k, 0) || fcl_views_conflict(o, v, 0) ||
      fcl_views_conflict(lse, q, 0) || fcl_views_conflict(lse, k, 0) || fcl_views_conflict(lse, v, 0) ||
      fcl_views_conflict(lse, o, 0))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "o or lse overlaps q, k, v or each other");
  fcl_aux aux[FCL_MAX_AUX];
  const flashcl_tensor *outs[2] = {o, lse};
  static const char *const names[2] = {"o", "lse"};
  return fcl_check_aux_buffers(ctx, aux, fcl_problem_aux(p, desc, aux), outs, names, 2);
}

/* desc.algorithm.tuning names a family this pass can run, whichever algorithm runs (the
 * naive path and the queries that plan no kernel included). */
flashcl_status fcl_check_call_tuning(flashcl_context *ctx, const flashcl_attention_desc *desc, flashcl_pass pass) {
  flashcl_tuning_family want;
  return fcl_tuning_call_family(ctx, desc->algorithm.tuning, pass, 0, &want);
}

static flashcl_status fcl_attention_forward_locked(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                   const flashcl_tensor *q, const flashcl_tensor *k,
                                                   const flashcl_tensor *v, const flashcl_tensor *o,
                                                   const flashcl_tensor *lse, cl_uint num_events_in_wait_list,
                                                   const cl_event *event_wait_list, cl_event *out_event) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_attention_desc desc_full;
  flashcl_status imp = fcl_attention_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (!o) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "o is NULL");
  if (num_events_in_wait_list && !event_wait_list)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "num_events_in_wait_list is %u but event_wait_list is NULL",
                    num_events_in_wait_list);
  fcl_problem p;
  flashcl_status st = fcl_check_problem(ctx, desc, q, k, v, o, lse, &p);
  if (st != FLASHCL_SUCCESS || (st = fcl_check_forward_outputs(ctx, desc, &p, q, k, v, o, lse)) != FLASHCL_SUCCESS ||
      (st = fcl_check_call_tuning(ctx, desc, FLASHCL_PASS_FORWARD)) != FLASHCL_SUCCESS)
    return st;
  if (fcl_resolve_algo(ctx, desc) == FLASHCL_ALGO_NAIVE)
    return fcl_naive_forward(ctx, &p, desc, q, k, v, o, lse, num_events_in_wait_list, event_wait_list, out_event);
  fcl_tuned tu;
  if ((st = fcl_choose(ctx, desc, &p, q, k, v, o, NULL, FLASHCL_PASS_FORWARD, &tu)) != FLASHCL_SUCCESS) return st;
  return fcl_forward_dispatch(ctx, &p, desc, &tu, q, k, v, o, lse, num_events_in_wait_list, event_wait_list,
                              out_event);
}

flashcl_status flashcl_attention_forward(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                         const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                         const flashcl_tensor *o, const flashcl_tensor *lse,
                                         cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                         cl_event *out_event) {
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_attention_forward_locked(ctx, desc, q, k, v, o, lse, num_events_in_wait_list,
                                                     event_wait_list, out_event));
}

/* The shared front of the query functions: a valid pass and problem (o may be
 * NULL), and no paged K/V source in the backward. */
flashcl_status fcl_query_problem(flashcl_context *ctx, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                                 const flashcl_tensor *k, const flashcl_tensor *v, const flashcl_tensor *o,
                                 flashcl_pass pass, fcl_problem *p) {
  if (pass != FLASHCL_PASS_FORWARD && pass != FLASHCL_PASS_BACKWARD)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "pass %d is not a flashcl_pass", (int)pass);
  flashcl_status st = fcl_check_problem(ctx, desc, q, k, v, o, NULL, p);
  if (st != FLASHCL_SUCCESS || (o && pass == FLASHCL_PASS_FORWARD &&
                                 (st = fcl_check_forward_outputs(ctx, desc, p, q, k, v, o, NULL)) != FLASHCL_SUCCESS))
    return st;
  if (pass == FLASHCL_PASS_BACKWARD && p->paged_kv)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "the backward pass does not support a paged K/V source");
  return fcl_check_call_tuning(ctx, desc, pass);
}

static flashcl_status fcl_attention_workspace_size_locked(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                          const flashcl_tensor *q, const flashcl_tensor *k,
                                                          const flashcl_tensor *v, flashcl_pass pass, size_t *bytes) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_attention_desc desc_full;
  flashcl_status imp = fcl_attention_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (!bytes) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  fcl_problem p;
  flashcl_status st = fcl_query_problem(ctx, desc, q, k, v, NULL, pass, &p);
  if (st != FLASHCL_SUCCESS) return st;
  if (fcl_resolve_algo(ctx, desc) == FLASHCL_ALGO_NAIVE)
    return pass == FLASHCL_PASS_BACKWARD ? fcl_naive_backward_workspace(ctx, &p, bytes)
                                         : fcl_naive_workspace(ctx, &p, bytes);
  /* The family choice refuses what the call refuses (desc.algorithm.kernel = NVIDIA_MMA
   * without tensor cores, block sizes the family cannot take). */
  fcl_tuned tu;
  if ((st = fcl_choose(ctx, desc, &p, q, k, v, q, NULL, pass, &tu)) != FLASHCL_SUCCESS) return st;
  if (pass == FLASHCL_PASS_FORWARD) {
    *bytes = 0; /* the fused kernels keep everything on chip */
    return FLASHCL_SUCCESS;
  }
  /* The tensor-core choice also depends on o, dO and the gradients being
   * 16-byte aligned, which this query does not see; where the tensor cores may
   * run, the figure is the larger of the two families', the most the call
   * allocates. */
  size_t portable_bytes = 0, mma_bytes = 0;
  if ((st = fcl_flash_backward_workspace(ctx, &p, !desc->backward.deterministic, NULL, &portable_bytes)) != FLASHCL_SUCCESS ||
      (tu.family == FLASHCL_TUNE_MMA_BWD &&
       (st = fcl_flash_backward_workspace(ctx, &p, !desc->backward.deterministic, &tu, &mma_bytes)) != FLASHCL_SUCCESS))
    return st;
  *bytes = portable_bytes > mma_bytes ? portable_bytes : mma_bytes;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_attention_workspace_size(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                const flashcl_tensor *q, const flashcl_tensor *k,
                                                const flashcl_tensor *v, flashcl_pass pass, size_t *bytes) {
  fcl_enter(ctx);
  const int d0 = ctx ? ctx->probe_defers : 0;
  size_t b = 0;
  flashcl_status st = fcl_attention_workspace_size_locked(ctx, desc, q, k, v, pass, bytes ? &b : NULL);
  if ((st = fcl_query_settled(ctx, d0, st)) == FLASHCL_SUCCESS) *bytes = b;
  return fcl_leave(ctx, st);
}

static flashcl_status fcl_attention_kernel_family_locked(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                         const flashcl_tensor *q, const flashcl_tensor *k,
                                                         const flashcl_tensor *v, const flashcl_tensor *o,
                                                         flashcl_pass pass, flashcl_kernel_family *family) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_attention_desc desc_full;
  flashcl_status imp = fcl_attention_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (!family) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "family is NULL");
  if (!o) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "o is NULL");
  fcl_problem p;
  flashcl_status st = fcl_query_problem(ctx, desc, q, k, v, o, pass, &p);
  if (st != FLASHCL_SUCCESS) return st;
  if (fcl_resolve_algo(ctx, desc) == FLASHCL_ALGO_NAIVE) {
    *family = FLASHCL_KERNEL_AUTO;
    return FLASHCL_SUCCESS;
  }
  fcl_tuned tu;
  if ((st = fcl_choose(ctx, desc, &p, q, k, v, o, NULL, pass, &tu)) != FLASHCL_SUCCESS) return st;
  *family = tu.family == FLASHCL_TUNE_FWD || tu.family == FLASHCL_TUNE_BWD ? FLASHCL_KERNEL_PORTABLE
                                                                          : FLASHCL_KERNEL_NVIDIA_MMA;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_attention_kernel_family(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                               const flashcl_tensor *q, const flashcl_tensor *k,
                                               const flashcl_tensor *v, const flashcl_tensor *o, flashcl_pass pass,
                                               flashcl_kernel_family *family) {
  fcl_enter(ctx);
  const int d0 = ctx ? ctx->probe_defers : 0;
  flashcl_kernel_family f = FLASHCL_KERNEL_AUTO;
  flashcl_status st = fcl_attention_kernel_family_locked(ctx, desc, q, k, v, o, pass, family ? &f : NULL);
  if ((st = fcl_query_settled(ctx, d0, st)) == FLASHCL_SUCCESS) *family = f;
  return fcl_leave(ctx, st);
}
