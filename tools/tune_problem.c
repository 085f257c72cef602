/*
 * flashcl-tune's problems: buffers for one forward, backward or decode shape,
 * and the calls that run them with a candidate tuning. Inputs are random (never
 * zeros), outputs are filled with NaN before every checked run, so a candidate
 * that skips writing part of its output cannot pass for a correct one.
 */
#include "tune_problem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void tune_shape_name(const tune_shape *s, char *buf, size_t cap) {
  static const char *const pass[] = {"forward", "backward", "decode"};
  char kern[64];
  snprintf(kern, sizeof kern, "%s%s%s",
           s->kernel == FLASHCL_KERNEL_PORTABLE ? " kernel=portable"
           : s->kernel == FLASHCL_KERNEL_NVIDIA_MMA ? " kernel=nvidia_mma" : "",
           s->force != FLASHCL_TUNE_NONE ? " family=" : "",
           s->force != FLASHCL_TUNE_NONE ? flashcl_tuning_family_name(s->force) : "");
  if (s->pass == TUNE_DECODE)
    snprintf(buf, cap, "decode d=%d %s n=%ld batch=%ld heads=%ld/%ld q_len=%ld%s", s->d, flashcl_dtype_name(s->dtype),
             s->n, s->batch, s->heads, s->heads_kv, s->q_len, kern);
  else
    snprintf(buf, cap, "%s d=%d %s causal=%d%s n=%ld batch=%ld heads=%ld%s", pass[s->pass], s->d,
             flashcl_dtype_name(s->dtype), s->causal, s->pass == TUNE_BACKWARD ? (s->atomic ? " atomic" : " det") : "",
             s->n, s->batch, s->heads, kern);
}

/* A random (seed) or uninitialised (seed 0) buffer of count elements, kept in
 * p->bufs for release. */
static cl_mem tp_buffer(flashcl_context *ctx, tune_problem *p, size_t count, uint64_t seed, cl_int *err) {
  cl_context cl = flashcl_context_cl_context(ctx);
  cl_mem m = seed ? tools_random_buffer(cl, flashcl_context_cl_queue(ctx), p->s.dtype, count, seed, p->raw, err)
                  : clCreateBuffer(cl, CL_MEM_READ_WRITE, count * flashcl_dtype_size(p->s.dtype), NULL, err);
  if (m) p->bufs[p->nbufs++] = m;
  return m;
}

/* The tuning a call runs with: t, else the forced family's empty one, else
 * none (the context's sources). */
static const flashcl_tuning *tp_tuning(const tune_problem *p, const flashcl_tuning *t) {
  return t ? t : p->s.force != FLASHCL_TUNE_NONE ? &p->forced : NULL;
}

static void tp_desc(const tune_problem *p, const flashcl_tuning *t, flashcl_attention_desc *d) {
  t = tp_tuning(p, t);
  flashcl_attention_desc_init(d);
  d->mask.causal = p->s.causal;
  d->algorithm.algo = FLASHCL_ALGO_FLASH;
  d->algorithm.kernel = p->s.kernel;
  d->backward.deterministic = !p->s.atomic;
  d->algorithm.tuning = t;
}

static void tp_decode_desc(const tune_problem *p, const flashcl_tuning *t, flashcl_decode_desc *d) {
  t = tp_tuning(p, t);
  flashcl_decode_desc_init(d);
  d->kernel = p->s.kernel;
  d->tuning = t;
}

static int tp_create_attention(flashcl_context *ctx, tune_problem *p) {
  const tune_shape *s = &p->s;
  const size_t count = (size_t)s->batch * s->n * s->heads * s->d;
  cl_int err = CL_SUCCESS;
  cl_mem b[9] = {0};
  for (int i = 0; i < (s->pass == TUNE_BACKWARD ? 8 : 4) && !err; ++i)
    b[i] = tp_buffer(ctx, p, count, i < 3 || i == 4 ? 1000 + 17 * (uint64_t)i + (uint64_t)s->d : 0, &err);
  if (err) return err;
  flashcl_tensor_init_bnhd(&p->q, b[0], 0, s->dtype, s->batch, s->n, s->heads, s->d);
  flashcl_tensor_init_bnhd(&p->k, b[1], 0, s->dtype, s->batch, s->n, s->heads, s->d);
  flashcl_tensor_init_bnhd(&p->v, b[2], 0, s->dtype, s->batch, s->n, s->heads, s->d);
  flashcl_tensor_init_bnhd(&p->o, b[3], 0, s->dtype, s->batch, s->n, s->heads, s->d);
  p->flops = 4.0 * (double)s->n * s->n * s->d * s->batch * s->heads * (s->causal ? 0.5 : 1.0);
  if (s->pass == TUNE_FORWARD) {
    p->outs[p->nouts++] = &p->o;
    return FLASHCL_SUCCESS;
  }
  flashcl_tensor_init_bnhd(&p->d_o, b[4], 0, s->dtype, s->batch, s->n, s->heads, s->d);
  flashcl_tensor_init_bnhd(&p->dq, b[5], 0, s->dtype, s->batch, s->n, s->heads, s->d);
  flashcl_tensor_init_bnhd(&p->dk, b[6], 0, s->dtype, s->batch, s->n, s->heads, s->d);
  flashcl_tensor_init_bnhd(&p->dv, b[7], 0, s->dtype, s->batch, s->n, s->heads, s->d);
  p->aux = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE,
                           (size_t)s->batch * s->heads * s->n * sizeof(float), NULL, &err);
  if (err) return err;
  flashcl_tensor_init_lse(&p->lse, p->aux, 0, s->batch, s->n, s->heads);
  p->outs[p->nouts++] = &p->dq;
  p->outs[p->nouts++] = &p->dk;
  p->outs[p->nouts++] = &p->dv;
  p->flops *= 2.5; /* the backward's five products against the forward's two */
  /* The forward the gradients belong to, with the context's own choice. */
  flashcl_attention_desc fd;
  tp_desc(p, NULL, &fd);
  fd.algorithm.tuning = NULL; /* the forward AUTO runs, whatever family the backward is tuned in */
  int st = flashcl_attention_forward(ctx, &fd, &p->q, &p->k, &p->v, &p->o, &p->lse, 0, NULL, NULL);
  return st ? st : clFinish(flashcl_context_cl_queue(ctx));
}

static int tp_create_decode(flashcl_context *ctx, tune_problem *p) {
  const tune_shape *s = &p->s;
  const size_t qn = (size_t)s->batch * s->q_len * s->heads * s->d, kvn = (size_t)s->batch * s->n * s->heads_kv * s->d;
  cl_int err = CL_SUCCESS;
  cl_mem bq = tp_buffer(ctx, p, qn, 7001, &err);
  cl_mem bk = err ? NULL : tp_buffer(ctx, p, kvn, 7002, &err);
  cl_mem bv = err ? NULL : tp_buffer(ctx, p, kvn, 7003, &err);
  cl_mem bo = err ? NULL : tp_buffer(ctx, p, qn, 0, &err);
  if (err) return err;
  flashcl_tensor_init_bnhd(&p->q, bq, 0, s->dtype, s->batch, s->q_len, s->heads, s->d);
  flashcl_tensor_init_bnhd(&p->k, bk, 0, s->dtype, s->batch, s->n, s->heads_kv, s->d);
  flashcl_tensor_init_bnhd(&p->v, bv, 0, s->dtype, s->batch, s->n, s->heads_kv, s->d);
  flashcl_tensor_init_bnhd(&p->o, bo, 0, s->dtype, s->batch, s->q_len, s->heads, s->d);
  int *lens = (int *)malloc((size_t)s->batch * sizeof(int));
  if (!lens) return FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
  for (long b = 0; b < s->batch; ++b) lens[b] = (int)s->n;
  p->aux = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                           (size_t)s->batch * sizeof(int), lens, &err);
  free(lens);
  p->outs[p->nouts++] = &p->o;
  p->flops = 2.0 * (double)kvn * flashcl_dtype_size(s->dtype);
  return err;
}

int tune_problem_create(flashcl_context *ctx, const tune_shape *s, tune_problem *p) {
  memset(p, 0, sizeof *p);
  p->s = *s;
  flashcl_tuning_init(&p->forced, s->force);
  const size_t big = s->pass == TUNE_DECODE ? (size_t)s->batch * s->n * s->heads_kv * s->d
                                            : (size_t)s->batch * s->n * s->heads * s->d;
  p->raw = malloc(big * 4);
  if (!p->raw) return FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
  int st = s->pass == TUNE_DECODE ? tp_create_decode(ctx, p) : tp_create_attention(ctx, p);
  for (int i = 0; i < p->nouts; ++i)
    p->out_count += (size_t)(p->outs[i]->shape[0] * p->outs[i]->shape[1] * p->outs[i]->shape[2] * p->outs[i]->shape[3]);
  if (st) tune_problem_destroy(p);
  return st;
}

void tune_problem_destroy(tune_problem *p) {
  for (int i = 0; i < p->nbufs; ++i) clReleaseMemObject(p->bufs[i]);
  if (p->aux) clReleaseMemObject(p->aux);
  free(p->raw);
  memset(p, 0, sizeof *p);
}

int tune_problem_config(flashcl_context *ctx, tune_problem *p, const flashcl_tuning *t, flashcl_config *cfg) {
  if (p->s.pass == TUNE_DECODE) {
    flashcl_decode_desc dd;
    tp_decode_desc(p, t, &dd);
    return flashcl_decode_config(ctx, &dd, &p->q, &p->k, &p->v, cfg);
  }
  flashcl_attention_desc d;
  tp_desc(p, t, &d);
  return flashcl_attention_config(ctx, &d, &p->q, &p->k, &p->v, &p->o,
                                  p->s.pass == TUNE_BACKWARD ? FLASHCL_PASS_BACKWARD : FLASHCL_PASS_FORWARD, cfg);
}

int tune_problem_time(flashcl_context *ctx, tune_problem *p, const flashcl_tuning *t, double *ms) {
  int host_timer = 0;
  if (p->s.pass == TUNE_DECODE) {
    flashcl_decode_desc dd;
    double host_us = 0.0;
    tp_decode_desc(p, t, &dd);
    return tools_timed_decode(ctx, &dd, &p->q, &p->k, &p->v, p->aux, &p->o, NULL, p->s.calls, ms, &host_us,
                              &host_timer);
  }
  flashcl_attention_desc d;
  tp_desc(p, t, &d);
  tools_attention_args a = {&d, &p->q, &p->k, &p->v, &p->o, &p->lse, &p->d_o, &p->dq, &p->dk, &p->dv};
  if (p->s.pass == TUNE_FORWARD) a.lse = NULL;
  return tools_timed_call(ctx, p->s.pass == TUNE_BACKWARD ? FLASHCL_PASS_BACKWARD : FLASHCL_PASS_FORWARD, &a, ms,
                          &host_timer);
}

/* Fills a tensor's buffer with the NaN of its dtype. */
static int tp_poison(cl_command_queue queue, const flashcl_tensor *t) {
  const uint32_t f32 = 0x7fc00000u;
  const uint16_t f16 = 0x7e00u, bf16 = 0x7fc0u;
  const void *pat = t->dtype == FLASHCL_F32 ? (const void *)&f32 : t->dtype == FLASHCL_F16 ? (const void *)&f16
                                                                                            : (const void *)&bf16;
  const size_t es = flashcl_dtype_size(t->dtype);
  size_t bytes = 0;
  clGetMemObjectInfo(t->buffer, CL_MEM_SIZE, sizeof bytes, &bytes, NULL);
  return clEnqueueFillBuffer(queue, t->buffer, pat, es, 0, bytes / es * es, 0, NULL, NULL);
}

int tune_problem_check_run(flashcl_context *ctx, tune_problem *p, const flashcl_tuning *t, float *host) {
  cl_command_queue queue = flashcl_context_cl_queue(ctx);
  double ms = 0.0;
  int st = 0;
  for (int i = 0; i < p->nouts && !st; ++i) st = tp_poison(queue, p->outs[i]);
  if (!st) st = tune_problem_time(ctx, p, t, &ms);
  size_t at = 0;
  for (int i = 0; i < p->nouts && !st; ++i) {
    const flashcl_tensor *o = p->outs[i];
    const size_t n = (size_t)(o->shape[0] * o->shape[1] * o->shape[2] * o->shape[3]);
    st = tools_read_as_float(queue, o->buffer, o->dtype, n, p->raw, host + at);
    at += n;
  }
  return st;
}
