/* The public backward entry point: validation of the gradients on top of the
 * forward's checks, then the naive or the flash backward. */
#include "core/internal.h"
#include "core/tuning.h"
#include "attention/attention.h"
#include "naive/naive.h"
#include "portable/portable.h"

static flashcl_status fcl_check_like(flashcl_context *ctx, const flashcl_tensor *t, const char *name,
                                     const flashcl_tensor *like) {
  flashcl_status st = fcl_check_tensor(ctx, t, name, 1);
  if (st != FLASHCL_SUCCESS) return st;
  if (t->dtype != like->dtype)
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH, "%s must have dtype %s", name, flashcl_dtype_name(like->dtype));
  for (int i = 0; i < 4; i++)
    if (t->shape[i] != like->shape[i])
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "%s.shape[%d] is %lld, expected %lld", name, i,
                      (long long)t->shape[i], (long long)like->shape[i]);
  return FLASHCL_SUCCESS;
}

typedef struct fcl_bwd_call {
  const flashcl_tensor *q, *k, *v, *o, *lse, *d_o, *dq, *dk, *dv;
} fcl_bwd_call;

/* The naive or the flash backward of a validated call, then the sinks'
 * gradient (desc.backward.dsinks) after it. */
static flashcl_status fcl_backward_run(flashcl_context *ctx, const flashcl_attention_desc *desc, fcl_problem *p,
                                       const fcl_bwd_call *c, cl_uint nwait, const cl_event *wait,
                                       cl_event *out_event) {
  fcl_sinks_grad sg = {NULL, NULL, NULL, 0};
  flashcl_status st;
  if (desc->backward.dsinks && (st = fcl_sinks_grad_prepare(ctx, desc, p, c->o, c->lse, c->d_o, &sg))) return st;
  cl_event done = NULL;
  cl_event *ev = desc->backward.dsinks ? &done : out_event;
  if (fcl_resolve_algo(ctx, desc) == FLASHCL_ALGO_NAIVE) {
    st = fcl_naive_backward(ctx, p, desc, c->q, c->k, c->v, c->o, c->lse, c->d_o, c->dq, c->dk, c->dv, nwait, wait,
                            ev);
  } else {
    fcl_tuned tu;
    const flashcl_tensor *grads[4] = {c->d_o, c->dq, c->dk, c->dv};
    /* A Hopper backward kernel that fails to build turns itself off before
     * anything is enqueued (src/nvidia/wgmma_backward.c); the call is then
     * chosen again, so that it runs on the kernels left (head dims only those
     * kernels covered go to the portable ones). */
    for (int again = 0; again < 2; again++) {
      const int hopper_on = !ctx->wgmma_bwd_failed;
      st = fcl_choose(ctx, desc, p, c->q, c->k, c->v, c->o, grads, FLASHCL_PASS_BACKWARD, &tu);
      if (st == FLASHCL_SUCCESS)
        st = fcl_flash_backward(ctx, p, desc, &tu, c->q, c->k, c->v, c->o, c->lse, c->d_o, c->dq, c->dk, c->dv, nwait,
                                wait, ev);
      if (st == FLASHCL_SUCCESS || !hopper_on || !ctx->wgmma_bwd_failed) break;
      fcl_clear_error(ctx);
    }
  }
  if (desc->backward.dsinks) {
    if (st == FLASHCL_SUCCESS) st = fcl_sinks_grad_enqueue(ctx, &sg, p, done, out_event);
    fcl_sinks_grad_release(&sg);
  }
  if (done) clReleaseEvent(done);
  return st;
}

static flashcl_status fcl_attention_backward_locked(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                    const flashcl_tensor *q, const flashcl_tensor *k,
                                                    const flashcl_tensor *v, const flashcl_tensor *o,
                                                    const flashcl_tensor *lse, const flashcl_tensor *d_o,
                                                    const flashcl_tensor *dq, const flashcl_tensor *dk,
                                                    const flashcl_tensor *dv, cl_uint num_events_in_wait_list,
                                                    const cl_event *event_wait_list, cl_event *out_event) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_attention_desc desc_full;
  flashcl_status imp = fcl_attention_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (!o || !lse || !d_o || !dq || !dk || !dv)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "o, lse, d_o, dq, dk and dv must all be non-NULL");
  if (num_events_in_wait_list && !event_wait_list)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "num_events_in_wait_list is %u but event_wait_list is NULL",
                    num_events_in_wait_list);
  fcl_problem p;
  flashcl_status st = fcl_check_problem(ctx, desc, q, k, v, o, lse, &p);
  if (st != FLASHCL_SUCCESS) return st;
  if (p.paged_kv)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "the backward pass does not support a paged K/V source (desc.paged.cache.block_table is forward-only)");
  /* d_o and dv have o's and v's head dim, which desc.shape.head_dim_v may set apart
   * from q's and k's. */
  if ((st = fcl_check_like(ctx, d_o, "d_o", o)) || (st = fcl_check_like(ctx, dq, "dq", q)) ||
      (st = fcl_check_like(ctx, dk, "dk", k)) || (st = fcl_check_like(ctx, dv, "dv", v)))
    return st;
  if ((st = fcl_check_output_distinct(ctx, dq, "dq")) || (st = fcl_check_output_distinct(ctx, dk, "dk")) ||
      (st = fcl_check_output_distinct(ctx, dv, "dv")))
    return st;
  {
    const flashcl_tensor *outs[3] = {dq, dk, dv}, *ins[6] = {q, k, v, o, lse, d_o};
    static const char *on[3] = {"dq", "dk", "dv"}, *in_names[6] = {"q", "k", "v", "o", "lse", "d_o"};
    for (int i = 0; i < 3; i++) {
      for (int j = 0; j < 6; j++)
        if (fcl_views_conflict(outs[i], ins[j], 0))
          return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s overlaps %s: gradients need their own memory",
                          on[i], in_names[j]);
      for (int j = i + 1; j < 3; j++)
        if (fcl_views_conflict(outs[i], outs[j], 0))
          return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s overlaps %s", on[i], on[j]);
    }
    fcl_aux aux[FCL_MAX_AUX];
    if ((st = fcl_check_aux_buffers(ctx, aux, fcl_problem_aux(&p, desc, aux), outs, on, 3))) return st;
    const flashcl_tensor *views[9] = {q, k, v, o, lse, d_o, dq, dk, dv};
    static const char *const vn[9] = {"q", "k", "v", "o", "lse", "d_o", "dq", "dk", "dv"};
    if ((st = fcl_sinks_grad_check(ctx, desc, &p, views, vn, 9))) return st;
  }
  if ((st = fcl_check_call_tuning(ctx, desc, FLASHCL_PASS_BACKWARD))) return st;
  const fcl_bwd_call call = {q, k, v, o, lse, d_o, dq, dk, dv};
  return fcl_backward_run(ctx, desc, &p, &call, num_events_in_wait_list, event_wait_list, out_event);
}

flashcl_status flashcl_attention_backward(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                          const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                          const flashcl_tensor *o, const flashcl_tensor *lse, const flashcl_tensor *d_o,
                                          const flashcl_tensor *dq, const flashcl_tensor *dk, const flashcl_tensor *dv,
                                          cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                          cl_event *out_event) {
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_attention_backward_locked(ctx, desc, q, k, v, o, lse, d_o, dq, dk, dv,
                                                      num_events_in_wait_list, event_wait_list, out_event));
}
