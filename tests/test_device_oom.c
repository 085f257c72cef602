/*
 * Device out of memory: with the device's memory filled by the test, every
 * call that needs device memory must fail with FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY
 * (or succeed, where the driver still found room), write nothing on failure,
 * and leave the context working once memory is free again.
 *
 * Covered: the naive forward and backward (their N x N workspaces), the flash
 * backward in both dQ modes (atomic dQ needs an fp32 accumulator) and decode
 * with split-KV on a context that has no decode scratch yet (the context
 * allocates it on first need). Then calls that create no buffer but whose
 * launches may still need device memory: the flash forward (portable and AUTO
 * kernels), flashcl_kv_cache_append into a paged cache, a split decode reading
 * that cache and flashcl_merge_states.
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
  desc.backward.deterministic = 0;
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
  d->desc.split.num_splits = 16; /* split-KV: the context's scratch, allocated on first need */
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
  d->desc.split.num_splits = 1;
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

/* One call of the cases below: run() poisons the call's outputs and makes it;
 * check() fails the test unless the outputs hold the reference result. */
typedef struct oom_case {
  const char *what;
  flashcl_status (*run)(void *arg);
  void (*check)(void *arg);
  void *arg;
  fct_tensor *out[2];
  flashcl_status on_full; /* the status on the full device */
} oom_case;

/* Stricter than oom_or_success: a full device is no reason for a host
 * allocation to fail, so FLASHCL_ERROR_HOST_OUT_OF_MEMORY would misreport it. */
static void case_on_full_device(oom_case *c) {
  fct_env *env = fct_env_get();
  c->on_full = c->run(c->arg);
  print_message("    %s on a full device: %s (%s)\n", c->what, flashcl_status_string(c->on_full),
                flashcl_context_last_error(env->ctx));
  FCT_CHECK(c->on_full == FLASHCL_SUCCESS || c->on_full == FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY,
            "%s on a full device: %s", c->what, flashcl_status_string(c->on_full));
  if (c->on_full == FLASHCL_SUCCESS)
    c->check(c->arg);
  else
    FCT_CHECK(fct_tensors_written(c->out, 2) == 0, "a failed %s wrote its outputs", c->what);
}

/* A call that ran out of memory must work on the same context once the memory
 * is free; one that succeeded was checked already. */
static void case_after_release(oom_case *c) {
  if (c->on_full == FLASHCL_SUCCESS) return;
  FCT_CHECK_STATUS(c->run(c->arg), FLASHCL_SUCCESS, "%s after the device was freed", c->what);
  c->check(c->arg);
}

/* Relative L2 distance of t's (B, N, H, D) view from a contiguous reference of
 * that shape. An element left as the poison (NaN) makes it NaN, and NaN fails
 * every `<=` check. */
static double rel_l2(const fct_tensor *t, const double *ref) {
  const int64_t *s = t->t.shape;
  double e2 = 0, r2 = 0;
  size_t i = 0;
  for (int64_t b = 0; b < s[0]; b++)
    for (int64_t n = 0; n < s[1]; n++)
      for (int64_t h = 0; h < s[2]; h++)
        for (int64_t x = 0; x < s[3]; x++, i++) {
          const double g = fct_tensor_get(t, b, n, h, x);
          e2 += (g - ref[i]) * (g - ref[i]), r2 += ref[i] * ref[i];
        }
  return sqrt(e2 / r2);
}

static void check_o_lse(fct_tensor *o, fct_tensor *lse, const double *ref_o, const double *ref_lse,
                        const char *what) {
  fct_tensor_download(o), fct_tensor_download(lse);
  const double eo = rel_l2(o, ref_o), el = rel_l2(lse, ref_lse);
  FCT_CHECK(eo <= fct_tolerance(o->t.dtype) && el <= fct_lse_tolerance(o->t.dtype),
            "%s against the reference: O rel-L2 %.3e, LSE rel-L2 %.3e", what, eo, el);
}

/* The flash forward of the problem in one kernel family. */
typedef struct fwd_bufs {
  fct_problem *p;
  flashcl_kernel_family kernel;
  fct_tensor o, lse;
} fwd_bufs;

static flashcl_status fwd_run(void *arg) {
  fwd_bufs *f = arg;
  fct_env *env = fct_env_get();
  const fct_run run = {FLASHCL_ALGO_FLASH, 0, 0, f->kernel, NULL};
  flashcl_attention_desc desc;
  fct_tensor_poison(&f->o), fct_tensor_poison(&f->lse);
  fct_problem_desc(f->p, &run, &desc);
  const flashcl_status st = flashcl_attention_forward(env->ctx, &desc, &f->p->q.t, &f->p->k.t, &f->p->v.t, &f->o.t,
                                                      &f->lse.t, 0, NULL, NULL);
  clFinish(env->queue);
  return st;
}

static void fwd_check(void *arg) {
  fwd_bufs *f = arg;
  check_o_lse(&f->o, &f->lse, f->p->ref_o, f->p->ref_lse, "flash forward");
}

/* The AUTO case is there for the tensor-core kernels. Their probes ran first on
 * a full device above (the flash backward); a probe that failed there turns
 * them off for the context's lifetime, and AUTO would then test the portable
 * kernels a second time. */
static void auto_runs_tensor_cores(fwd_bufs *f) {
  fct_env *env = fct_env_get();
  const fct_run run = {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
  flashcl_attention_desc desc;
  flashcl_kernel_family fam = FLASHCL_KERNEL_AUTO;
  char dev[128] = "";
  fct_problem_desc(f->p, &run, &desc);
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &f->p->q.t, &f->p->k.t, &f->p->v.t, &f->o.t,
                                                   FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_SUCCESS, "the kernel family of the AUTO forward");
  const int must = fct_device_requires_mma(env->device, dev, sizeof dev);
  print_message("    flash forward, kernel AUTO: %s kernels (device: %s)\n",
                fam == FLASHCL_KERNEL_NVIDIA_MMA ? "tensor-core" : "portable", dev);
  FCT_CHECK(!must || fam == FLASHCL_KERNEL_NVIDIA_MMA,
            "AUTO resolves to the portable kernels on a device with tensor cores (did an earlier call on the "
            "full device fail the tensor-core probe?)");
}

enum { PAGE = 16 }; /* slots per page of the paged cache */

/* A paged cache that flashcl_kv_cache_append fills with the problem's whole K
 * and V (B = 1), pages in reverse order so that slot order differs from pool
 * order, plus pages 0 and 1 that nothing may write; then a decode of the
 * problem's last query row over it, whose reference is that row's. */
typedef struct paged_bufs {
  fct_problem *p;
  fct_tensor kp, vp, o, lse;
  flashcl_tensor q;
  cl_mem table, zero, lens;
  int num_pages;
  flashcl_decode_desc desc;
} paged_bufs;

static void paged_create(paged_bufs *c, fct_problem *p) {
  const fct_case *pc = &p->c;
  const int max_pages = (int)((p->Nk + PAGE - 1) / PAGE);
  const int32_t zero = 0, len = (int32_t)p->Nk;
  int32_t *table = malloc(sizeof *table * (size_t)max_pages);
  FCT_CHECK(table != NULL && p->B == 1, "out of host memory, or a batch of %lld", (long long)p->B);
  c->p = p;
  c->num_pages = max_pages + 2;
  for (int i = 0; i < max_pages; i++) table[i] = c->num_pages - 1 - i;
  c->table = fct_create_buffer(sizeof *table * (size_t)max_pages, table);
  free(table);
  c->zero = fct_create_buffer(sizeof zero, &zero);
  c->lens = fct_create_buffer(sizeof len, &len);
  fct_tensor_create(&c->kp, pc->dtype, FCT_BNHD, c->num_pages, PAGE, pc->heads_kv, pc->head_dim, 931);
  fct_tensor_create(&c->vp, pc->dtype, FCT_BNHD, c->num_pages, PAGE, pc->heads_kv, pc->head_dim, 932);
  fct_tensor_create(&c->o, pc->dtype, FCT_BNHD, 1, 1, pc->heads_q, pc->head_dim, 933);
  fct_tensor_create_lse(&c->lse, FCT_BNHD, 1, 1, pc->heads_q, 934);
  c->q = p->q.t;
  c->q.offset += (size_t)((p->Nq - 1) * p->q.t.stride[1]) * flashcl_dtype_size(c->q.dtype);
  c->q.shape[1] = 1;
  flashcl_decode_desc_init(&c->desc);
  c->desc.cache.page_size = PAGE;
  c->desc.cache.block_table = c->table;
  c->desc.cache.max_pages = max_pages;
  c->desc.split.num_splits = 4; /* the split and merge kernels, on the scratch the split decode above left */
}

static void paged_release(paged_bufs *c) {
  fct_tensor_release(&c->kp), fct_tensor_release(&c->vp), fct_tensor_release(&c->o), fct_tensor_release(&c->lse);
  clReleaseMemObject(c->table), clReleaseMemObject(c->zero), clReleaseMemObject(c->lens);
}

static flashcl_status append_run(void *arg) {
  paged_bufs *c = arg;
  fct_env *env = fct_env_get();
  fct_tensor_poison(&c->kp), fct_tensor_poison(&c->vp);
  const flashcl_status st = flashcl_kv_cache_append(env->ctx, FCT_APPEND_DESC(&c->desc), &c->p->k.t, &c->p->v.t, &c->kp.t, &c->vp.t,
                                                    c->zero, 0, NULL, NULL);
  clFinish(env->queue);
  return st;
}

/* A plain cache of the tokens' dtype is a copy, so every slot must equal its
 * token exactly, and nothing else may change (the spare pages included). */
static void append_check(void *arg) {
  paged_bufs *c = arg;
  const fct_problem *p = c->p;
  const int64_t H = p->c.heads_kv, D = p->c.head_dim;
  const size_t n = (size_t)(p->Nk * H * D);
  size_t wrong = 0;
  fct_tensor_download(&c->kp), fct_tensor_download(&c->vp);
  for (int64_t j = 0; j < p->Nk; j++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t x = 0; x < D; x++) {
        const int64_t page = c->num_pages - 1 - j / PAGE, slot = j % PAGE;
        wrong += fct_tensor_get(&c->kp, page, slot, h, x) != fct_tensor_get(&p->k, 0, j, h, x);
        wrong += fct_tensor_get(&c->vp, page, slot, h, x) != fct_tensor_get(&p->v, 0, j, h, x);
      }
  const size_t kw = fct_tensor_count_unpoisoned(&c->kp), vw = fct_tensor_count_unpoisoned(&c->vp);
  FCT_CHECK(wrong == 0 && kw == n && vw == n, "kv append: %zu slot values wrong; %zu and %zu elements of the K and V "
            "pools written, want %zu each", wrong, kw, vw, n);
}

static flashcl_status decode_run(void *arg) {
  paged_bufs *c = arg;
  fct_env *env = fct_env_get();
  fct_tensor_poison(&c->o), fct_tensor_poison(&c->lse);
  const flashcl_status st = flashcl_attention_decode(env->ctx, &c->desc, &c->q, &c->kp.t, &c->vp.t, c->lens,
                                                     &c->o.t, &c->lse.t, 0, NULL, NULL);
  clFinish(env->queue);
  return st;
}

static void decode_check(void *arg) {
  paged_bufs *c = arg;
  const fct_problem *p = c->p;
  const size_t row = (size_t)((p->Nq - 1) * p->c.heads_q);
  check_o_lse(&c->o, &c->lse, p->ref_o + row * (size_t)p->c.head_dim, p->ref_lse + row, "paged decode");
}

/* Forwards over the first and the second half of the keys, made before the
 * device is filled; their merge must equal the problem's reference. */
typedef struct merge_bufs {
  fct_problem *p;
  fct_tensor oa, la, ob, lb, o, lse;
} merge_bufs;

static void merge_create(merge_bufs *m, fct_problem *p) {
  fct_env *env = fct_env_get();
  const fct_case *c = &p->c;
  const fct_run run = {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
  fct_tensor *o[3] = {&m->oa, &m->ob, &m->o}, *l[3] = {&m->la, &m->lb, &m->lse};
  const int64_t half = p->Nk / 2;
  flashcl_attention_desc desc;
  m->p = p;
  fct_problem_desc(p, &run, &desc);
  for (int s = 0; s < 3; s++) {
    fct_tensor_create(o[s], c->dtype, FCT_BNHD, p->B, p->Nq, c->heads_q, c->head_dim, 941 + 2 * s);
    fct_tensor_create_lse(l[s], FCT_BNHD, p->B, p->Nq, c->heads_q, 942 + 2 * s);
  }
  for (int s = 0; s < 2; s++) {
    flashcl_tensor k = p->k.t, v = p->v.t;
    k.shape[1] = v.shape[1] = s ? p->Nk - half : half;
    k.offset += (size_t)(s * half * k.stride[1]) * flashcl_dtype_size(k.dtype);
    v.offset += (size_t)(s * half * v.stride[1]) * flashcl_dtype_size(v.dtype);
    FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &desc, &p->q.t, &k, &v, &o[s]->t, &l[s]->t, 0, NULL, NULL),
                     FLASHCL_SUCCESS, "the forward over key half %d", s);
  }
  clFinish(env->queue);
}

static void merge_release(merge_bufs *m) {
  fct_tensor_release(&m->oa), fct_tensor_release(&m->la), fct_tensor_release(&m->ob);
  fct_tensor_release(&m->lb), fct_tensor_release(&m->o), fct_tensor_release(&m->lse);
}

static flashcl_status merge_run(void *arg) {
  merge_bufs *m = arg;
  fct_env *env = fct_env_get();
  fct_tensor_poison(&m->o), fct_tensor_poison(&m->lse);
  const flashcl_status st =
      flashcl_merge_states(env->ctx, &m->oa.t, &m->la.t, &m->ob.t, &m->lb.t, &m->o.t, &m->lse.t, 0, NULL, NULL);
  clFinish(env->queue);
  return st;
}

static void merge_check(void *arg) {
  merge_bufs *m = arg;
  check_o_lse(&m->o, &m->lse, m->p->ref_o, m->p->ref_lse, "merge_states");
}

/* The forwards, the append and the merge on one full device. The decode gets
 * a device filled again, so that it reads what the append wrote even where the
 * append ran out of memory and was redone after the release. */
/* flashcl_dropout_mask of the problem's shape (p = 0.3): the bytes of a run
 * before the device was filled are the reference (the mask depends on seed
 * and offset only). Its output tensor is the mask buffer viewed as fp32, so
 * that the poison check sees any write. */
typedef struct mask_bufs {
  fct_problem *p;
  fct_tensor out;
  unsigned char *want;
  size_t bytes;
} mask_bufs;

static flashcl_status mask_run(void *arg) {
  mask_bufs *m = arg;
  fct_env *env = fct_env_get();
  flashcl_attention_desc desc;
  flashcl_attention_desc_init(&desc);
  desc.dropout.p = 0.3f, desc.dropout.seed = 0x5eedu, desc.dropout.offset = 7;
  fct_tensor_poison(&m->out);
  const fct_case *c = &m->p->c;
  const flashcl_status st = flashcl_dropout_mask(env->ctx, &desc, m->p->B, c->heads_q, m->p->Nq, m->p->Nk,
                                                 m->out.t.buffer, 0, NULL, NULL);
  clFinish(env->queue);
  return st;
}

static void mask_check(void *arg) {
  mask_bufs *m = arg;
  fct_tensor_download(&m->out);
  FCT_CHECK(memcmp(m->out.host, m->want, m->bytes) == 0, "dropout mask differs from the one made before the fill");
}

static void mask_create(mask_bufs *m, fct_problem *p) {
  m->p = p;
  m->bytes = (size_t)p->B * (size_t)p->c.heads_q * (size_t)p->Nq * (size_t)p->Nk;
  fct_tensor_create(&m->out, FLASHCL_F32, FCT_BNHD, 1, 1, 1, (int64_t)(m->bytes / 4), 961);
  FCT_CHECK_STATUS(mask_run(m), FLASHCL_SUCCESS, "dropout mask before the fill");
  fct_tensor_download(&m->out);
  m->want = malloc(m->bytes);
  memcpy(m->want, m->out.host, m->bytes);
}

/* A second flashcl context made on the full device (over the test's OpenCL
 * objects, so that it sees the problem's buffers) must either be refused with
 * a status or work: its first forward on the full device is checked like the
 * others. */
static void new_context_on_full_device(fct_problem *p, fwd_bufs *f) {
  fct_env *env = fct_env_get();
  flashcl_context *c2 = NULL;
  const flashcl_status st = flashcl_context_create_from_cl(env->cl_ctx, env->device, env->queue, NULL, &c2);
  print_message("    new context on a full device: %s\n", flashcl_status_string(st));
  FCT_CHECK(st == FLASHCL_SUCCESS || st == FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY ||
                st == FLASHCL_ERROR_HOST_OUT_OF_MEMORY,
            "flashcl_context_create_from_cl on a full device: %s", flashcl_status_string(st));
  if (st != FLASHCL_SUCCESS) return;
  const fct_run run = {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
  flashcl_attention_desc desc;
  fct_tensor_poison(&f->o), fct_tensor_poison(&f->lse);
  fct_problem_desc(p, &run, &desc);
  const flashcl_status fs =
      flashcl_attention_forward(c2, &desc, &p->q.t, &p->k.t, &p->v.t, &f->o.t, &f->lse.t, 0, NULL, NULL);
  clFinish(env->queue);
  print_message("    its first forward: %s (%s)\n", flashcl_status_string(fs), flashcl_context_last_error(c2));
  FCT_CHECK(fs == FLASHCL_SUCCESS || fs == FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY, "the new context's forward: %s",
            flashcl_status_string(fs));
  if (fs == FLASHCL_SUCCESS) fwd_check(f);
  else {
    fct_tensor *outs[2] = {&f->o, &f->lse};
    FCT_CHECK(fct_tensors_written(outs, 2) == 0, "a failed forward of the new context wrote its outputs");
  }
  flashcl_context_destroy(c2);
}

static void inference_calls_on_full_device(fct_problem *p) {
  const fct_case *pc = &p->c;
  fwd_bufs fwd[2] = {{p, FLASHCL_KERNEL_PORTABLE}, {p, FLASHCL_KERNEL_AUTO}};
  paged_bufs pg;
  merge_bufs m;
  filler f;
  for (int i = 0; i < 2; i++) {
    fct_tensor_create(&fwd[i].o, pc->dtype, FCT_BNHD, p->B, p->Nq, pc->heads_q, pc->head_dim, 951 + 2 * i);
    fct_tensor_create_lse(&fwd[i].lse, FCT_BNHD, p->B, p->Nq, pc->heads_q, 952 + 2 * i);
  }
  auto_runs_tensor_cores(&fwd[1]);
  paged_create(&pg, p);
  merge_create(&m, p);
  mask_bufs mk;
  mask_create(&mk, p);
  oom_case cases[6] = {
      {"flash forward, portable kernels,", fwd_run, fwd_check, &fwd[0], {&fwd[0].o, &fwd[0].lse}},
      {"flash forward, kernel AUTO,", fwd_run, fwd_check, &fwd[1], {&fwd[1].o, &fwd[1].lse}},
      {"kv append into a paged cache", append_run, append_check, &pg, {&pg.kp, &pg.vp}},
      {"merge_states", merge_run, merge_check, &m, {&m.o, &m.lse}},
      {"dropout mask", mask_run, mask_check, &mk, {&mk.out, &mk.out}},
      {"split decode of the paged cache", decode_run, decode_check, &pg, {&pg.o, &pg.lse}},
  };
  fill_device(&f);
  for (int i = 0; i < 5; i++) case_on_full_device(&cases[i]);
  new_context_on_full_device(p, &fwd[0]);
  release_filler(&f);
  for (int i = 0; i < 5; i++) case_after_release(&cases[i]);
  fill_device(&f);
  case_on_full_device(&cases[5]);
  release_filler(&f);
  case_after_release(&cases[5]);
  fct_tensor_release(&mk.out);
  free(mk.want);
  for (int i = 0; i < 2; i++) fct_tensor_release(&fwd[i].o), fct_tensor_release(&fwd[i].lse);
  paged_release(&pg);
  merge_release(&m);
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
  /* Non-causal, so that every query row sees every key: the reference then
   * also gives the merge of two key halves and a decode of one row. */
  const fct_case small = {FLASHCL_F16, 1, 256, 256, 2, 2, 64, 0, 0.0f, FCT_BNHD, 0, 0, 0, NULL, NULL};
  fct_problem sp;
  fct_problem_create(&sp, &small);
  inference_calls_on_full_device(&sp);
  fct_problem_release(&sp);
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
