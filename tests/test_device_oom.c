/*
 * Device out of memory: with the device's memory filled by the test, every
 * call that needs device memory must fail with FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY
 * (or succeed, where the driver still found room), write nothing on failure,
 * and leave the context working once memory is free again.
 *
 * Covered: the naive forward and backward (their N x N workspaces), the flash
 * backward in both dQ modes (atomic dQ needs an fp32 accumulator) and decode
 * with split-KV on a context that has no decode scratch yet (the context
 * allocates it on first need).
 *
 * It fills a GPU's whole memory, so it runs only with FLASHCL_TEST_OOM=1 and
 * on a GPU (CTest label long); elsewhere it reports itself skipped. On a CPU
 * device "device memory" is the host's, which the test must not exhaust.
 */
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FILL_MAX 16384 /* buffers of the filler */

typedef struct filler {
  cl_mem mem[FILL_MAX];
  int n;
  size_t bytes;
} filler;

/* One buffer of `bytes`, committed by a fill (drivers allocate on first use). */
static int fill_one(filler *f, size_t bytes) {
  fct_env *env = fct_env_get();
  cl_int err;
  if (f->n == FILL_MAX) return 0;
  cl_mem m = clCreateBuffer(env->cl_ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
  if (err != CL_SUCCESS) return 0;
  const cl_uint zero = 0;
  err = clEnqueueFillBuffer(env->queue, m, &zero, sizeof zero, 0, bytes, 0, NULL, NULL);
  if (err == CL_SUCCESS) err = clFinish(env->queue);
  if (err != CL_SUCCESS) {
    clReleaseMemObject(m);
    return 0;
  }
  f->mem[f->n++] = m;
  f->bytes += bytes;
  return 1;
}

/* Fills the device in shrinking chunks down to 4 KiB: the decode scratch of
 * this test is ~70 KB, and a driver may place buffers that small in memory
 * that 1 MiB ones no longer find. */
static void fill_device(filler *f) {
  fct_env *env = fct_env_get();
  size_t chunk = env->info.max_mem_alloc_size < ((size_t)1 << 30) ? env->info.max_mem_alloc_size : (size_t)1 << 30;
  memset(f, 0, sizeof *f);
  for (; chunk >= ((size_t)1 << 12); chunk /= 4)
    while (f->bytes < 2 * env->info.global_mem_size && fill_one(f, chunk)) {
    }
  print_message("    filled %.2f GiB in %d buffers (device: %.2f GiB)\n", f->bytes / 1073741824.0, f->n,
                env->info.global_mem_size / 1073741824.0);
}

static void release_filler(filler *f) {
  for (int i = 0; i < f->n; i++) clReleaseMemObject(f->mem[i]);
  f->n = 0;
  f->bytes = 0;
}

/* A status a call may return with the device full. */
static int oom_or_success(flashcl_status st) {
  return st == FLASHCL_SUCCESS || st == FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY || st == FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
}

/* The outputs and gradients of p's forward and backward. */
typedef struct outs {
  fct_tensor o, lse, d_o, dq, dk, dv;
} outs;

static void outs_create(outs *t, const fct_problem *p, int salt) {
  const fct_case *c = &p->c;
  fct_tensor_create(&t->o, c->dtype, FCT_BNHD, p->B, p->Nq, c->heads_q, c->head_dim, salt);
  fct_tensor_create_lse(&t->lse, FCT_BNHD, p->B, p->Nq, c->heads_q, salt + 1);
  fct_tensor_create(&t->d_o, c->dtype, FCT_BNHD, p->B, p->Nq, c->heads_q, c->head_dim, salt + 2);
  fct_tensor_create(&t->dq, c->dtype, FCT_BNHD, p->B, p->Nq, c->heads_q, c->head_dim, salt + 3);
  fct_tensor_create(&t->dk, c->dtype, FCT_BNHD, p->B, p->Nk, c->heads_kv, c->head_dim, salt + 4);
  fct_tensor_create(&t->dv, c->dtype, FCT_BNHD, p->B, p->Nk, c->heads_kv, c->head_dim, salt + 5);
}

static void outs_release(outs *t) {
  fct_tensor_release(&t->o), fct_tensor_release(&t->lse), fct_tensor_release(&t->d_o);
  fct_tensor_release(&t->dq), fct_tensor_release(&t->dk), fct_tensor_release(&t->dv);
}

/* One backward on a full device: out of memory and dQ untouched, or success. */
static void flash_backward_on_full_device(fct_problem *p, outs *t, const flashcl_attention_desc *desc,
                                          const char *what) {
  fct_env *env = fct_env_get();
  fct_tensor_poison(&t->dq);
  const flashcl_status st =
      flashcl_attention_backward(env->ctx, desc, &p->q.t, &p->k.t, &p->v.t, &t->o.t, &t->lse.t, &t->d_o.t, &t->dq.t,
                                 &t->dk.t, &t->dv.t, 0, NULL, NULL);
  clFinish(env->queue);
  print_message("    %s on a full device: %s (%s)\n", what, flashcl_status_string(st),
                flashcl_context_last_error(env->ctx));
  FCT_CHECK(oom_or_success(st), "%s on a full device: %s", what, flashcl_status_string(st));
  fct_tensor_download(&t->dq);
  if (st != FLASHCL_SUCCESS) FCT_CHECK(fct_tensor_count_unpoisoned(&t->dq) == 0, "a failed %s wrote dq", what);
}

/* The naive forward (an N x N workspace) and the flash backward in both dQ
 * modes on a full device: out of memory and nothing written, or success. */
static void calls_on_full_device(fct_problem *p) {
  fct_env *env = fct_env_get();
  outs t;
  flashcl_attention_desc desc;
  fct_run run = {FLASHCL_ALGO_NAIVE, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
  outs_create(&t, p, 901);
  filler f;
  fill_device(&f);
  fct_tensor_poison(&t.o);
  fct_tensor_poison(&t.lse);
  fct_problem_desc(p, &run, &desc);
  flashcl_status st =
      flashcl_attention_forward(env->ctx, &desc, &p->q.t, &p->k.t, &p->v.t, &t.o.t, &t.lse.t, 0, NULL, NULL);
  clFinish(env->queue);
  print_message("    naive forward on a full device: %s (%s)\n", flashcl_status_string(st),
                flashcl_context_last_error(env->ctx));
  FCT_CHECK(oom_or_success(st), "naive forward on a full device: %s", flashcl_status_string(st));
  fct_tensor_download(&t.o);
  if (st != FLASHCL_SUCCESS)
    FCT_CHECK(fct_tensor_count_unpoisoned(&t.o) == 0, "a failed naive forward wrote o");
  run.algo = FLASHCL_ALGO_FLASH;
  fct_problem_desc(p, &run, &desc);
  flash_backward_on_full_device(p, &t, &desc, "flash backward");
  /* Atomic dQ needs an fp32 accumulator of dQ's size, where the deterministic
   * tensor-core backward needs none. */
  desc.deterministic = 0;
  flash_backward_on_full_device(p, &t, &desc, "flash backward, atomic dQ,");
  release_filler(&f);
  outs_release(&t);
}

/* Decode's buffers: q (B, 1, Hq, d), a contiguous cache (B, L, Hkv, d), o. */
typedef struct dec_bufs {
  fct_tensor q, kc, vc, o;
  cl_mem lens;
  flashcl_decode_desc desc;
} dec_bufs;

static void dec_create(dec_bufs *d, const fct_case *c) {
  fct_rng rng;
  fct_rng_init(&rng, "device_oom_decode");
  const int B = 2, L = 4096;
  const cl_int lens[2] = {L, L - 77};
  fct_tensor_create(&d->q, c->dtype, FCT_BNHD, B, 1, c->heads_q, c->head_dim, 911);
  fct_tensor_create(&d->kc, c->dtype, FCT_BNHD, B, L, c->heads_kv, c->head_dim, 912);
  fct_tensor_create(&d->vc, c->dtype, FCT_BNHD, B, L, c->heads_kv, c->head_dim, 913);
  fct_tensor_create(&d->o, c->dtype, FCT_BNHD, B, 1, c->heads_q, c->head_dim, 914);
  fct_tensor_fill_random(&d->q, &rng);
  fct_tensor_fill_random(&d->kc, &rng);
  fct_tensor_fill_random(&d->vc, &rng);
  d->lens = fct_create_buffer(sizeof lens, lens);
  flashcl_decode_desc_init(&d->desc);
  d->desc.num_splits = 16; /* split-KV: the context's scratch, allocated on first need */
}

static flashcl_status dec_run(dec_bufs *d) {
  fct_env *env = fct_env_get();
  fct_tensor_poison(&d->o);
  const flashcl_status st = flashcl_attention_decode(env->ctx, &d->desc, &d->q.t, &d->kc.t, &d->vc.t, d->lens,
                                                     &d->o.t, NULL, 0, NULL, NULL);
  clFinish(env->queue);
  fct_tensor_download(&d->o);
  return st;
}

static void dec_release(dec_bufs *d) {
  fct_tensor_release(&d->q), fct_tensor_release(&d->kc), fct_tensor_release(&d->vc), fct_tensor_release(&d->o);
  clReleaseMemObject(d->lens);
}

/* After the device is free again: the split decode against the unsplit one
 * (no scratch), element by element within the dtype's tolerance. */
static void dec_check_after(dec_bufs *d) {
  FCT_CHECK_STATUS(dec_run(d), FLASHCL_SUCCESS, "split decode after the device was freed");
  const size_t n = d->o.bytes / flashcl_dtype_size(d->o.t.dtype);
  double *split = malloc(n * sizeof *split), num = 0, den = 0;
  FCT_CHECK(split != NULL, "out of host memory");
  for (size_t i = 0; i < n; i++) split[i] = fct_load(d->o.t.dtype, d->o.host, i);
  d->desc.num_splits = 1;
  FCT_CHECK_STATUS(dec_run(d), FLASHCL_SUCCESS, "unsplit decode after the device was freed");
  for (size_t i = 0; i < n; i++) {
    const double u = fct_load(d->o.t.dtype, d->o.host, i);
    FCT_CHECK(split[i] == split[i] && u == u, "NaN in a decode output (element %zu)", i);
    num += (split[i] - u) * (split[i] - u), den += u * u;
  }
  free(split);
  FCT_CHECK(den > 0 && sqrt(num / den) <= fct_tolerance(d->o.t.dtype), "split against unsplit decode: rel-L2 %.3e",
            sqrt(num / den));
}

/* Decode and the naive backward on a full device: out of memory and nothing
 * written, or success. */
static void more_calls_on_full_device(fct_problem *p, dec_bufs *dec) {
  fct_env *env = fct_env_get();
  outs t;
  flashcl_attention_desc desc;
  fct_run run = {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
  outs_create(&t, p, 921);
  fct_problem_desc(p, &run, &desc);
  FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &desc, &p->q.t, &p->k.t, &p->v.t, &t.o.t, &t.lse.t, 0, NULL,
                                             NULL),
                   FLASHCL_SUCCESS, "the forward that feeds the naive backward");
  clFinish(env->queue);
  filler f;
  fill_device(&f);
  flashcl_status st = dec_run(dec);
  print_message("    split decode on a full device (no scratch yet): %s (%s)\n", flashcl_status_string(st),
                flashcl_context_last_error(env->ctx));
  FCT_CHECK(oom_or_success(st), "decode on a full device: %s", flashcl_status_string(st));
  if (st != FLASHCL_SUCCESS) FCT_CHECK(fct_tensor_count_unpoisoned(&dec->o) == 0, "a failed decode wrote o");
  run.algo = FLASHCL_ALGO_NAIVE;
  fct_problem_desc(p, &run, &desc);
  fct_tensor_poison(&t.dq), fct_tensor_poison(&t.dk), fct_tensor_poison(&t.dv);
  st = flashcl_attention_backward(env->ctx, &desc, &p->q.t, &p->k.t, &p->v.t, &t.o.t, &t.lse.t, &t.d_o.t, &t.dq.t,
                                  &t.dk.t, &t.dv.t, 0, NULL, NULL);
  clFinish(env->queue);
  print_message("    naive backward on a full device: %s (%s)\n", flashcl_status_string(st),
                flashcl_context_last_error(env->ctx));
  FCT_CHECK(oom_or_success(st), "naive backward on a full device: %s", flashcl_status_string(st));
  fct_tensor *grads[3] = {&t.dq, &t.dk, &t.dv};
  if (st != FLASHCL_SUCCESS) FCT_CHECK(fct_tensors_written(grads, 3) == 0, "a failed naive backward wrote a gradient");
  release_filler(&f);
  outs_release(&t);
}

static void full_device(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  const char *on = getenv("FLASHCL_TEST_OOM");
  if (!on || strcmp(on, "1") != 0 || !env->info.is_gpu) {
    print_message("    needs FLASHCL_TEST_OOM=1 and a GPU: it fills the device's memory\n");
    FCT_SKIP();
  }
  const fct_case c = {FLASHCL_F16, 2, 2048, 2048, 8, 8, 64, 1, 0.0f, FCT_BNHD, 0, 0, 0, NULL, NULL};
  fct_problem p;
  dec_bufs dec;
  fct_problem_create(&p, &c);
  dec_create(&dec, &c);
  calls_on_full_device(&p);
  more_calls_on_full_device(&p, &dec);
  dec_check_after(&dec);
  dec_release(&dec);
  /* The context works again once memory is free: both algorithms, checked. */
  fct_run flash = {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
  fct_run naive = {FLASHCL_ALGO_NAIVE, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
  fct_result r;
  fct_problem_run(&p, &flash, &r);
  fct_result_release(&r);
  fct_problem_run(&p, &naive, &r);
  fct_result_release(&r);
  fct_problem_release(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(full_device)};
  return fct_run_group("device_oom", tests, sizeof tests / sizeof tests[0], 1);
}
