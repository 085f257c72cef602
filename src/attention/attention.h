/* The attention calls' front: validation of a call into an fcl_problem, the
 * choice of algorithm and kernel family, and the forward's dispatch. */
#ifndef FLASHCL_ATTENTION_H
#define FLASHCL_ATTENTION_H

#include "core/internal.h"

flashcl_status fcl_check_problem(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                 const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                 const flashcl_tensor *o, const flashcl_tensor *lse, fcl_problem *p);

flashcl_algo fcl_resolve_algo(const flashcl_context *ctx, const flashcl_attention_desc *desc);

/* The family choice of a flash call and its configuration (src/attention/choose.c);
 * grads (dO, dQ, dK, dV; NULL for the forward) must be 16-byte aligned for the
 * tensor-core backward. */
flashcl_status fcl_choose(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                          const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                          const flashcl_tensor *o, const flashcl_tensor *const *grads, flashcl_pass pass,
                          struct fcl_tuned *tu);
/* Runs the forward family fcl_choose picked. */
flashcl_status fcl_forward_dispatch(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                    struct fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                    const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                    cl_uint nwait, const cl_event *wait, cl_event *out_event);
/* The shared front of the query functions (src/attention/attention.c). */
flashcl_status fcl_query_problem(flashcl_context *ctx, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                                 const flashcl_tensor *k, const flashcl_tensor *v, const flashcl_tensor *o,
                                 flashcl_pass pass, fcl_problem *p);
/* desc.algorithm.tuning (if any) is of a family `pass` runs, on every path (naive too):
 * FLASHCL_ERROR_UNSUPPORTED otherwise (src/attention/attention.c). */
flashcl_status fcl_check_call_tuning(flashcl_context *ctx, const flashcl_attention_desc *desc, flashcl_pass pass);

/* The attention sinks' gradient (src/attention/sinks.c): desc.backward.dsinks checked
 * against the call's views and aux buffers; its kernel built with its
 * arguments set; then enqueued after `after` (may be NULL). */
#define FCL_SINK_GRAD_WG 64
typedef struct fcl_sinks_grad {
  cl_kernel part, sum;
  cl_mem scratch; /* parts x heads_q partial sums */
  int parts;
} fcl_sinks_grad;
flashcl_status fcl_sinks_grad_check(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                                    const flashcl_tensor *const *views, const char *const *names, int nviews);
flashcl_status fcl_sinks_grad_prepare(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                                      const flashcl_tensor *o, const flashcl_tensor *lse, const flashcl_tensor *d_o,
                                      fcl_sinks_grad *g);
/* Enqueues both steps and releases the scratch (also on failure). */
flashcl_status fcl_sinks_grad_enqueue(flashcl_context *ctx, fcl_sinks_grad *g, const fcl_problem *p, cl_event after,
                                      cl_event *out_event);
void fcl_sinks_grad_release(fcl_sinks_grad *g);

/* The aux ranges of a validated forward/backward problem (at most FCL_MAX_AUX). */
int fcl_problem_aux(const fcl_problem *p, const flashcl_attention_desc *desc, fcl_aux *aux);
/* The forward's output rules: o and lse (lse may be NULL) name each element once
 * and share no byte with q, k, v, each other or the descriptor's buffers. */
flashcl_status fcl_check_forward_outputs(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                         const fcl_problem *p, const flashcl_tensor *q, const flashcl_tensor *k,
                                         const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse);

/* A caller's descriptor, whatever header it was built with, as this library's
 * struct: *desc then points at full (a NULL *desc is left for the checks that
 * report it). Every public function taking a flashcl_attention_desc calls it
 * first, and reads nothing from the caller's struct afterwards. */
flashcl_status fcl_attention_desc_import(flashcl_context *ctx, const flashcl_attention_desc **desc,
                                         flashcl_attention_desc *full);

#endif
