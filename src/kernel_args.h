/* Setting kernel arguments in order, stopping at the first failure. */
#ifndef FLASHCL_KERNEL_ARGS_H
#define FLASHCL_KERNEL_ARGS_H

#include "internal.h"

typedef struct fcl_args {
  cl_kernel kernel;
  cl_uint index;
  cl_int err;
} fcl_args;

static inline void fcl_arg(fcl_args *a, size_t size, const void *value) {
  if (a->err == CL_SUCCESS) a->err = clSetKernelArg(a->kernel, a->index, size, value);
  a->index++;
}
static inline void fcl_arg_mem(fcl_args *a, cl_mem m) { fcl_arg(a, sizeof m, &m); }
static inline void fcl_arg_int(fcl_args *a, int v) { fcl_arg(a, sizeof v, &v); }
static inline void fcl_arg_long(fcl_args *a, int64_t v) {
  cl_long x = (cl_long)v;
  fcl_arg(a, sizeof x, &x);
}
static inline void fcl_arg_float(fcl_args *a, float v) { fcl_arg(a, sizeof v, &v); }

/* Buffer, element offset and (batch, seq, head) strides of a tensor. */
static inline void fcl_arg_tensor(fcl_args *a, const flashcl_tensor *t) {
  fcl_arg_mem(a, t->buffer);
  fcl_arg_long(a, (int64_t)(t->offset / flashcl_dtype_size(t->dtype)));
  fcl_arg_long(a, t->stride[0]);
  fcl_arg_long(a, t->stride[1]);
  fcl_arg_long(a, t->stride[2]);
}

static inline void fcl_arg_dropout(fcl_args *a, const fcl_problem *p) {
  cl_ulong seed = p->seed, offset = p->offset;
  cl_uint threshold = p->threshold;
  fcl_arg(a, sizeof seed, &seed);
  fcl_arg(a, sizeof offset, &offset);
  fcl_arg(a, sizeof threshold, &threshold);
  fcl_arg_float(a, p->keep_scale);
}

#endif
