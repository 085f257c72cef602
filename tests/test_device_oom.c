/*
 * Device out of memory: with the device's memory filled by the test, every
 * call that needs device memory must fail with FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY
 * (or succeed, where the driver still found room), write nothing on failure,
 * and leave the context working once memory is free again.
 *
 * It fills a GPU's whole memory, so it runs only with FLASHCL_TEST_OOM=1 and
 * on a GPU (CTest label long); elsewhere it reports itself skipped. On a CPU
 * device "device memory" is the host's, which the test must not exhaust.
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>

#define FILL_MAX 4096 /* buffers of the filler */

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

/* Fills the device in shrinking chunks down to 1 MiB. */
static void fill_device(filler *f) {
  fct_env *env = fct_env_get();
  size_t chunk = env->info.max_mem_alloc_size < ((size_t)1 << 30) ? env->info.max_mem_alloc_size : (size_t)1 << 30;
  memset(f, 0, sizeof *f);
  for (; chunk >= ((size_t)1 << 20); chunk /= 4)
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

/* The naive forward (an N x N workspace) and the flash backward (its scratch)
 * on a full device: out of memory and nothing written, or success. */
static void calls_on_full_device(fct_problem *p) {
  fct_env *env = fct_env_get();
  const fct_case *c = &p->c;
  fct_tensor o, lse, d_o, dq, dk, dv;
  flashcl_attention_desc desc;
  fct_run run = {FLASHCL_ALGO_NAIVE, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
  fct_tensor_create(&o, c->dtype, FCT_BNHD, p->B, p->Nq, c->heads_q, c->head_dim, 901);
  fct_tensor_create_lse(&lse, FCT_BNHD, p->B, p->Nq, c->heads_q, 902);
  fct_tensor_create(&d_o, c->dtype, FCT_BNHD, p->B, p->Nq, c->heads_q, c->head_dim, 903);
  fct_tensor_create(&dq, c->dtype, FCT_BNHD, p->B, p->Nq, c->heads_q, c->head_dim, 904);
  fct_tensor_create(&dk, c->dtype, FCT_BNHD, p->B, p->Nk, c->heads_kv, c->head_dim, 905);
  fct_tensor_create(&dv, c->dtype, FCT_BNHD, p->B, p->Nk, c->heads_kv, c->head_dim, 906);
  filler f;
  fill_device(&f);
  fct_tensor_poison(&o);
  fct_tensor_poison(&lse);
  fct_problem_desc(p, &run, &desc);
  flashcl_status st = flashcl_attention_forward(env->ctx, &desc, &p->q.t, &p->k.t, &p->v.t, &o.t, &lse.t, 0, NULL, NULL);
  clFinish(env->queue);
  print_message("    naive forward on a full device: %s (%s)\n", flashcl_status_string(st),
                flashcl_context_last_error(env->ctx));
  FCT_CHECK(oom_or_success(st), "naive forward on a full device: %s", flashcl_status_string(st));
  fct_tensor_download(&o);
  if (st != FLASHCL_SUCCESS)
    FCT_CHECK(fct_tensor_count_unpoisoned(&o) == 0, "a failed naive forward wrote o");
  run.algo = FLASHCL_ALGO_FLASH;
  fct_problem_desc(p, &run, &desc);
  fct_tensor_poison(&dq);
  st = flashcl_attention_backward(env->ctx, &desc, &p->q.t, &p->k.t, &p->v.t, &o.t, &lse.t, &d_o.t, &dq.t, &dk.t,
                                  &dv.t, 0, NULL, NULL);
  clFinish(env->queue);
  print_message("    flash backward on a full device: %s (%s)\n", flashcl_status_string(st),
                flashcl_context_last_error(env->ctx));
  FCT_CHECK(oom_or_success(st), "flash backward on a full device: %s", flashcl_status_string(st));
  fct_tensor_download(&dq);
  if (st != FLASHCL_SUCCESS)
    FCT_CHECK(fct_tensor_count_unpoisoned(&dq) == 0, "a failed flash backward wrote dq");
  release_filler(&f);
  fct_tensor_release(&o), fct_tensor_release(&lse), fct_tensor_release(&d_o);
  fct_tensor_release(&dq), fct_tensor_release(&dk), fct_tensor_release(&dv);
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
  fct_problem_create(&p, &c);
  calls_on_full_device(&p);
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
