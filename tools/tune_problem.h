/*
 * One problem flashcl-tune times: a forward, backward or decode call of one
 * shape, its device buffers, and the calls that run it with a given tuning.
 * Only the public flashcl API is used.
 */
#ifndef FLASHCL_TUNE_PROBLEM_H
#define FLASHCL_TUNE_PROBLEM_H

#include "common.h"

typedef enum tune_pass { TUNE_FORWARD = 0, TUNE_BACKWARD = 1, TUNE_DECODE = 2 } tune_pass;

/* What the tuner keys an entry on, and the sizes it times it at. */
typedef struct tune_shape {
  tune_pass pass;
  int d;
  flashcl_dtype dtype;
  int causal;    /* forward, backward */
  int atomic;    /* backward: 1 = atomic dQ (desc.backward.deterministic = false) */
  long n;        /* keys (and queries) per sequence; decode: KV length */
  long batch, heads, heads_kv;
  long q_len;    /* decode: new tokens per sequence */
  long calls;    /* decode: back-to-back calls per timing */
  flashcl_kernel_family kernel;
  /* A family other than the one AUTO runs here (its default rules are the
   * start; FLASHCL_TUNE_NONE: AUTO's). The tensor-core mma.sync forward is
   * tuned this way where AUTO runs the Hopper one, because it still runs the
   * problems the Hopper kernel does not cover (dropout, masks, paged K/V). */
  flashcl_tuning_family force;
} tune_shape;

#define TUNE_MAX_OUTPUTS 3

typedef struct tune_problem {
  tune_shape s;
  flashcl_tensor q, k, v, o, lse, d_o, dq, dk, dv;
  cl_mem bufs[10];
  int nbufs;
  cl_mem aux;                           /* decode: int32 KV lengths; backward: the LSE */
  const flashcl_tensor *outs[TUNE_MAX_OUTPUTS];
  int nouts;
  size_t out_count;                     /* elements over all outputs */
  void *raw;                            /* host scratch for reads */
  double flops;                         /* forward/backward: FLOPs of one call; decode: KV bytes */
  flashcl_tuning forced;                /* s.force's empty tuning */
} tune_problem;

/* "fwd d=64 f16 causal=0 n=4096" and the like; also the journal key. */
void tune_shape_name(const tune_shape *s, char *buf, size_t cap);

/* Allocates random inputs (and, for the backward, a forward's o and lse).
 * Returns a flashcl/OpenCL status; the problem is empty on failure. */
int tune_problem_create(flashcl_context *ctx, const tune_shape *s, tune_problem *p);
void tune_problem_destroy(tune_problem *p);

/* What the call would run with this tuning (NULL: the context's sources). */
int tune_problem_config(flashcl_context *ctx, tune_problem *p, const flashcl_tuning *t, flashcl_config *cfg);
/* Fills the outputs with NaN, runs once and reads every output into host
 * (out_count floats). */
int tune_problem_check_run(flashcl_context *ctx, tune_problem *p, const flashcl_tuning *t, float *host);
/* One timed run (ms per call; decode: per call of s.calls back-to-back). */
int tune_problem_time(flashcl_context *ctx, tune_problem *p, const flashcl_tuning *t, double *ms);

#endif
