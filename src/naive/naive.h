/* The naive baseline (cl/naive/naive.cl and CLBlast GEMMs): S = QK^T,
 * softmax, O = PV, and its backward. */
#ifndef FLASHCL_NAIVE_H
#define FLASHCL_NAIVE_H

#include "core/internal.h"

flashcl_status fcl_naive_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                 const flashcl_tensor *o, const flashcl_tensor *lse, cl_uint nwait,
                                 const cl_event *wait, cl_event *out_event);
flashcl_status fcl_naive_workspace(flashcl_context *ctx, const fcl_problem *p, size_t *bytes);
flashcl_status fcl_naive_backward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                  const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                  const flashcl_tensor *o, const flashcl_tensor *lse, const flashcl_tensor *d_o,
                                  const flashcl_tensor *dq, const flashcl_tensor *dk, const flashcl_tensor *dv,
                                  cl_uint nwait, const cl_event *wait, cl_event *out_event);
flashcl_status fcl_naive_backward_workspace(flashcl_context *ctx, const fcl_problem *p, size_t *bytes);

#endif
