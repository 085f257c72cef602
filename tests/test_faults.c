/* Fault injection (docs/reliability.md, "Fault injection"): for every entry
 * point, every call of clCreateBuffer, clCreateProgramWith{Source,Binary},
 * clBuildProgram, clCreateKernel, clSetKernelArg, clEnqueueNDRangeKernel and
 * of the library's malloc/calloc/realloc that the call reaches is made to fail
 * in turn (tests/fault_shim.c). Each time the call must either fail with a
 * negative status, leaving its outputs and out_event untouched, or absorb the
 * failure and produce the right output; no OpenCL object or allocation may
 * leak; and the next call on the same context must succeed with the output of
 * a first, fault-free run.
 *
 * Cold sweep: a fresh context (flashcl_context_create_from_cl on one shared
 * cl_context) per injection, so that program loads and kernel creation are
 * reached; after the retry the context is destroyed and every object made
 * during its calls must be released and every allocation freed. Warm sweep:
 * one context per entry point that has run the call once (programs cached),
 * every object count and allocation count must be back to its value before
 * the call. Context creation itself: flashcl_context_create with each of its
 * clCreateContext/clCreateCommandQueue/malloc/calloc failed in turn.
 *
 * The cold sweep runs twice: with the device's tuning (on PoCL the on-disk
 * program cache is off, so programs are built from source) and with
 * tests/tuning/binary_cache.tune, where they are loaded from the disk cache.
 * FLASHCL_FAULTS_VERBOSE=1 prints every injection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fault_shim.h"
#include "flashcl.h"

static flashcl_context *g_base; /* owns the shared cl_context and queue */
static cl_context g_cl;
static cl_device_id g_dev;
static cl_command_queue g_q;
static int g_verbose;
static long g_injections;

#define EVENT_SENTINEL ((cl_event)(uintptr_t)0x5e5e5e5eu)
#define SENTINEL_BYTE 0xA5

/* ---- buffers (made and read outside armed windows, so never counted) ---- */
static cl_mem buf_new(size_t bytes) {
  cl_int err;
  cl_mem m = clCreateBuffer(g_cl, CL_MEM_READ_WRITE, bytes, NULL, &err);
  assert_int_equal(err, CL_SUCCESS);
  return m;
}

static void buf_write(cl_mem m, const void *host, size_t bytes) {
  assert_int_equal(clEnqueueWriteBuffer(g_q, m, CL_TRUE, 0, bytes, host, 0, NULL, NULL), CL_SUCCESS);
}

static void buf_read(cl_mem m, void *host, size_t bytes) {
  assert_int_equal(clEnqueueReadBuffer(g_q, m, CL_TRUE, 0, bytes, host, 0, NULL, NULL), CL_SUCCESS);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (float)((g_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static cl_mem buf_random(size_t floats) {
  float *h = malloc(floats * sizeof *h);
  for (size_t i = 0; i < floats; i++) h[i] = rnd();
  cl_mem m = buf_new(floats * sizeof *h);
  buf_write(m, h, floats * sizeof *h);
  free(h);
  return m;
}

static cl_mem buf_ints(const int *v, size_t n) {
  cl_mem m = buf_new(n * sizeof *v);
  buf_write(m, v, n * sizeof *v);
  return m;
}

/* ---- entry points ---- */
typedef struct out_buf {
  cl_mem mem;
  size_t bytes;
  int floats;         /* compare as fp32 with a tolerance, else bytewise */
  unsigned char *ref; /* the first fault-free run's output */
} out_buf;

typedef struct entry {
  const char *name;
  flashcl_status (*call)(flashcl_context *ctx, cl_event *ev);
  out_buf out[3];
  int nout;
  /* Filled by the sweeps, for the report. */
  long cold[FAULT_FN_COUNT], cache[FAULT_FN_COUNT], warm[FAULT_FN_COUNT];
  long failed, absorbed;
} entry;

enum { B = 1, N = 32, H = 2, D = 32 };
static flashcl_tensor t_q, t_k, t_v, t_o, t_lse, t_do, t_dq, t_dk, t_dv, t_fo, t_flse;
static flashcl_attention_desc d_flash, d_naive, d_drop;
/* decode: B 2, q_len 1, Hq 4, Hkv 2, cache 64, 4 splits */
static flashcl_tensor t_dec_q, t_dec_kc, t_dec_vc, t_dec_o, t_dec_lse;
static cl_mem m_dec_seqlens;
static flashcl_decode_desc dd_dec;
static flashcl_kv_append_desc dd_app;
/* kv append: B 2, T 3 into caches of 64 */
static flashcl_tensor t_app_k, t_app_v, t_app_kc, t_app_vc;
static cl_mem m_app_seqlens;
/* merge */
static flashcl_tensor t_ma, t_la, t_mb, t_lb, t_mo, t_mlse;
static cl_mem m_mask;

static flashcl_status call_forward_flash(flashcl_context *ctx, cl_event *ev) {
  return flashcl_attention_forward(ctx, &d_flash, &t_q, &t_k, &t_v, &t_o, &t_lse, 0, NULL, ev);
}
static flashcl_status call_forward_naive(flashcl_context *ctx, cl_event *ev) {
  return flashcl_attention_forward(ctx, &d_naive, &t_q, &t_k, &t_v, &t_o, &t_lse, 0, NULL, ev);
}
static flashcl_status call_backward(flashcl_context *ctx, cl_event *ev) {
  return flashcl_attention_backward(ctx, &d_flash, &t_q, &t_k, &t_v, &t_fo, &t_flse, &t_do, &t_dq, &t_dk, &t_dv, 0,
                                    NULL, ev);
}
static flashcl_status call_backward_naive(flashcl_context *ctx, cl_event *ev) {
  return flashcl_attention_backward(ctx, &d_naive, &t_q, &t_k, &t_v, &t_fo, &t_flse, &t_do, &t_dq, &t_dk, &t_dv, 0,
                                    NULL, ev);
}
static flashcl_status call_decode(flashcl_context *ctx, cl_event *ev) {
  return flashcl_attention_decode(ctx, &dd_dec, &t_dec_q, &t_dec_kc, &t_dec_vc, m_dec_seqlens, &t_dec_o, &t_dec_lse,
                                  0, NULL, ev);
}
static flashcl_status call_append(flashcl_context *ctx, cl_event *ev) {
  return flashcl_kv_cache_append(ctx, &dd_app, &t_app_k, &t_app_v, &t_app_kc, &t_app_vc, m_app_seqlens, 0, NULL, ev);
}
static flashcl_status call_merge(flashcl_context *ctx, cl_event *ev) {
  return flashcl_merge_states(ctx, &t_ma, &t_la, &t_mb, &t_lb, &t_mo, &t_mlse, 0, NULL, ev);
}
static flashcl_status call_dropout(flashcl_context *ctx, cl_event *ev) {
  return flashcl_dropout_mask(ctx, &d_drop, B, H, N, N, m_mask, 0, NULL, ev);
}

#define OUT(t, nfloats) {NULL, (size_t)(nfloats) * sizeof(float), 1, NULL} /* mem: setup_problems */
static entry g_entries[] = {
    {"forward_flash", call_forward_flash, {OUT(t_o, B * N * H * D), OUT(t_lse, B * N * H)}, 2},
    {"forward_naive", call_forward_naive, {OUT(t_o, B * N * H * D), OUT(t_lse, B * N * H)}, 2},
    {"backward_flash", call_backward, {OUT(t_dq, B * N * H * D), OUT(t_dk, B * N * H * D), OUT(t_dv, B * N * H * D)}, 3},
    {"backward_naive", call_backward_naive,
     {OUT(t_dq, B * N * H * D), OUT(t_dk, B * N * H * D), OUT(t_dv, B * N * H * D)}, 3},
    {"decode_split4", call_decode, {OUT(t_dec_o, 2 * 1 * 4 * D), OUT(t_dec_lse, 2 * 1 * 4)}, 2},
    {"kv_cache_append", call_append, {OUT(t_app_kc, 2 * 64 * 2 * D), OUT(t_app_vc, 2 * 64 * 2 * D)}, 2},
    {"merge_states", call_merge, {OUT(t_mo, B * 8 * H * D), OUT(t_mlse, B * 8 * H)}, 2},
    {"dropout_mask", call_dropout, {{NULL, B * H * N * N, 0, NULL}}, 1},
};
enum { N_ENTRIES = sizeof g_entries / sizeof g_entries[0] };

static void setup_problems(void) {
  /* attention */
  const size_t qkv = (size_t)B * N * H * D;
  flashcl_tensor_init_bnhd(&t_q, buf_random(qkv), 0, FLASHCL_F32, B, N, H, D);
  flashcl_tensor_init_bnhd(&t_k, buf_random(qkv), 0, FLASHCL_F32, B, N, H, D);
  flashcl_tensor_init_bnhd(&t_v, buf_random(qkv), 0, FLASHCL_F32, B, N, H, D);
  flashcl_tensor_init_bnhd(&t_do, buf_random(qkv), 0, FLASHCL_F32, B, N, H, D);
  flashcl_tensor_init_bnhd(&t_o, buf_new(qkv * 4), 0, FLASHCL_F32, B, N, H, D);
  flashcl_tensor_init_lse(&t_lse, buf_new((size_t)B * N * H * 4), 0, B, N, H);
  flashcl_tensor_init_bnhd(&t_fo, buf_new(qkv * 4), 0, FLASHCL_F32, B, N, H, D);
  flashcl_tensor_init_lse(&t_flse, buf_new((size_t)B * N * H * 4), 0, B, N, H);
  flashcl_tensor_init_bnhd(&t_dq, buf_new(qkv * 4), 0, FLASHCL_F32, B, N, H, D);
  flashcl_tensor_init_bnhd(&t_dk, buf_new(qkv * 4), 0, FLASHCL_F32, B, N, H, D);
  flashcl_tensor_init_bnhd(&t_dv, buf_new(qkv * 4), 0, FLASHCL_F32, B, N, H, D);
  flashcl_attention_desc_init(&d_flash);
  d_flash.mask.causal = 1;
  d_flash.algorithm.algo = FLASHCL_ALGO_FLASH;
  d_naive = d_flash;
  d_naive.algorithm.algo = FLASHCL_ALGO_NAIVE;
  d_drop = d_flash;
  d_drop.dropout.p = 0.25f;
  d_drop.dropout.seed = 7;
  /* The backward's o and lse: a fault-free forward on the base context. */
  assert_int_equal(flashcl_attention_forward(g_base, &d_flash, &t_q, &t_k, &t_v, &t_fo, &t_flse, 0, NULL, NULL), 0);
  /* decode */
  flashcl_tensor_init_bnhd(&t_dec_q, buf_random(2 * 1 * 4 * D), 0, FLASHCL_F32, 2, 1, 4, D);
  flashcl_tensor_init_bnhd(&t_dec_kc, buf_random(2 * 64 * 2 * D), 0, FLASHCL_F32, 2, 64, 2, D);
  flashcl_tensor_init_bnhd(&t_dec_vc, buf_random(2 * 64 * 2 * D), 0, FLASHCL_F32, 2, 64, 2, D);
  flashcl_tensor_init_bnhd(&t_dec_o, buf_new(2 * 1 * 4 * D * 4), 0, FLASHCL_F32, 2, 1, 4, D);
  flashcl_tensor_init_lse(&t_dec_lse, buf_new(2 * 1 * 4 * 4), 0, 2, 1, 4);
  const int dec_len[2] = {40, 64};
  m_dec_seqlens = buf_ints(dec_len, 2);
  flashcl_decode_desc_init(&dd_dec);
  dd_dec.split.num_splits = 4;
  flashcl_kv_append_desc_init(&dd_app);
  /* kv append */
  flashcl_tensor_init_bnhd(&t_app_k, buf_random(2 * 3 * 2 * D), 0, FLASHCL_F32, 2, 3, 2, D);
  flashcl_tensor_init_bnhd(&t_app_v, buf_random(2 * 3 * 2 * D), 0, FLASHCL_F32, 2, 3, 2, D);
  flashcl_tensor_init_bnhd(&t_app_kc, buf_new(2 * 64 * 2 * D * 4), 0, FLASHCL_F32, 2, 64, 2, D);
  flashcl_tensor_init_bnhd(&t_app_vc, buf_new(2 * 64 * 2 * D * 4), 0, FLASHCL_F32, 2, 64, 2, D);
  const int app_len[2] = {5, 10};
  m_app_seqlens = buf_ints(app_len, 2);
  /* merge */
  flashcl_tensor_init_bnhd(&t_ma, buf_random(B * 8 * H * D), 0, FLASHCL_F32, B, 8, H, D);
  flashcl_tensor_init_bnhd(&t_mb, buf_random(B * 8 * H * D), 0, FLASHCL_F32, B, 8, H, D);
  flashcl_tensor_init_lse(&t_la, buf_random(B * 8 * H), 0, B, 8, H);
  flashcl_tensor_init_lse(&t_lb, buf_random(B * 8 * H), 0, B, 8, H);
  flashcl_tensor_init_bnhd(&t_mo, buf_new(B * 8 * H * D * 4), 0, FLASHCL_F32, B, 8, H, D);
  flashcl_tensor_init_lse(&t_mlse, buf_new(B * 8 * H * 4), 0, B, 8, H);
  m_mask = buf_new((size_t)B * H * N * N);
  /* The outputs' buffers, now that they exist. */
  const flashcl_tensor *outs[N_ENTRIES][3] = {{&t_o, &t_lse},         {&t_o, &t_lse},
                                              {&t_dq, &t_dk, &t_dv},  {&t_dq, &t_dk, &t_dv},
                                              {&t_dec_o, &t_dec_lse}, {&t_app_kc, &t_app_vc},
                                              {&t_mo, &t_mlse},       {NULL}};
  for (int e = 0; e < N_ENTRIES; e++)
    for (int i = 0; i < g_entries[e].nout; i++) g_entries[e].out[i].mem = outs[e][i] ? outs[e][i]->buffer : m_mask;
}

/* ---- one call and its checks ---- */
static void outputs_fill(const entry *e) {
  for (int i = 0; i < e->nout; i++) {
    unsigned char pat = SENTINEL_BYTE;
    assert_int_equal(clEnqueueFillBuffer(g_q, e->out[i].mem, &pat, 1, 0, e->out[i].bytes, 0, NULL, NULL), CL_SUCCESS);
  }
  assert_int_equal(clFinish(g_q), CL_SUCCESS);
}

/* 1 if every output is still all sentinel bytes. */
static int outputs_untouched(const entry *e) {
  for (int i = 0; i < e->nout; i++) {
    unsigned char *h = malloc(e->out[i].bytes);
    buf_read(e->out[i].mem, h, e->out[i].bytes);
    size_t bad = 0;
    for (size_t j = 0; j < e->out[i].bytes; j++) bad += h[j] != SENTINEL_BYTE;
    free(h);
    if (bad) {
      if (g_verbose) fprintf(stderr, "  %s: output %d has %zu of %zu bytes written\n", e->name, i, bad, e->out[i].bytes);
      return 0;
    }
  }
  return 1;
}

/* Records the outputs as the reference (first fault-free run), or compares them with it. */
static int outputs_match(entry *e, int record) {
  int ok = 1;
  for (int i = 0; i < e->nout; i++) {
    out_buf *o = &e->out[i];
    unsigned char *h = malloc(o->bytes);
    buf_read(o->mem, h, o->bytes);
    if (record) {
      free(o->ref);
      o->ref = h;
      continue;
    }
    size_t bad = 0;
    if (o->floats) {
      const float *a = (const float *)h, *r = (const float *)o->ref;
      for (size_t j = 0; j < o->bytes / 4; j++)
        if (!(fabsf(a[j] - r[j]) <= 1e-4f + 1e-4f * fabsf(r[j])) && !(isinf(r[j]) && a[j] == r[j])) bad++;
    } else {
      bad = memcmp(h, o->ref, o->bytes) != 0;
    }
    free(h);
    if (bad) {
      fprintf(stderr, "  %s: output %d differs from the first run (%zu elements)\n", e->name, i, bad);
      ok = 0;
    }
  }
  return ok;
}

typedef struct live {
  long obj[FK_COUNT];
  long allocs;
} live;

static void live_get(live *l) {
  for (int k = 0; k < FK_COUNT; k++) l->obj[k] = fault_live(k);
  l->allocs = fault_live_allocs();
}

static int live_same(const live *a, const live *b, const char *what) {
  int ok = 1;
  for (int k = 0; k < FK_COUNT; k++)
    if (a->obj[k] != b->obj[k]) {
      fprintf(stderr, "  %s: %ld live %s, expected %ld\n", what, b->obj[k], fault_kind_name(k), a->obj[k]);
      ok = 0;
    }
  if (a->allocs != b->allocs) {
    fprintf(stderr, "  %s: %ld live allocations, expected %ld\n", what, b->allocs, a->allocs);
    ok = 0;
  }
  return ok;
}

/* The entry's call with fn's nth call failed (nth 0: none); counts left in the shim. */
static flashcl_status run_call(entry *e, flashcl_context *ctx, int fn, long nth, cl_event *ev) {
  outputs_fill(e);
  *ev = EVENT_SENTINEL;
  fault_arm(fn, nth);
  flashcl_status st = e->call(ctx, ev);
  fault_disarm();
  assert_int_equal(clFinish(g_q), CL_SUCCESS);
  return st;
}

/* A fault-free call that must succeed and match the reference. */
static void run_ok(entry *e, flashcl_context *ctx, int record, const char *when) {
  cl_event ev;
  flashcl_status st = run_call(e, ctx, -1, 0, &ev);
  if (st != FLASHCL_SUCCESS)
    fprintf(stderr, "  %s (%s): status %d: %s\n", e->name, when, st, flashcl_context_last_error(ctx));
  assert_int_equal(st, FLASHCL_SUCCESS);
  assert_true(ev != EVENT_SENTINEL && ev != NULL);
  clReleaseEvent(ev);
  if (!outputs_match(e, record)) fail_msg("%s: wrong output (%s)", e->name, when);
}

/* binary_cache: 1 turns the on-disk program cache on through an override
 * tuning file (PoCL's built-in tuning turns it off). */
static flashcl_context *ctx_new(int binary_cache) {
  flashcl_context_options o;
  flashcl_context_options_init(&o);
  if (binary_cache) o.tuning_file = FLASHCL_FAULTS_TUNING;
  flashcl_context *ctx = NULL;
  assert_int_equal(flashcl_context_create_from_cl(g_cl, g_dev, g_q, &o, &ctx), FLASHCL_SUCCESS);
  return ctx;
}

/* Fails fn's nth call of e on ctx and checks the call, then the retry. */
static void inject(entry *e, flashcl_context *ctx, int fn, long nth, const char *sweep) {
  live before, after;
  live_get(&before);
  cl_event ev;
  flashcl_status st = run_call(e, ctx, fn, nth, &ev);
  g_injections++;
  if (!fault_fired()) fail_msg("%s %s: %s call %ld was not reached", sweep, e->name, fault_fn_name(fn), nth);
  if (g_verbose)
    fprintf(stderr, "  %s %s: %s #%ld -> %d %s\n", sweep, e->name, fault_fn_name(fn), nth, st,
            st ? flashcl_context_last_error(ctx) : "");
  if (st < 0) {
    e->failed++;
    if (ev != EVENT_SENTINEL) fail_msg("%s %s: %s #%ld: failed call wrote out_event", sweep, e->name, fault_fn_name(fn), nth);
    if (!outputs_untouched(e))
      fail_msg("%s %s: %s #%ld: failed call (%s) wrote its outputs", sweep, e->name, fault_fn_name(fn), nth,
               flashcl_context_last_error(ctx));
  } else {
    e->absorbed++;
    if (st != FLASHCL_SUCCESS) fail_msg("%s %s: %s #%ld: status %d", sweep, e->name, fault_fn_name(fn), nth, st);
    if (ev == EVENT_SENTINEL || !ev) fail_msg("%s %s: no out_event", sweep, e->name);
    clReleaseEvent(ev);
    if (!outputs_match(e, 0)) fail_msg("%s %s: %s #%ld absorbed, wrong output", sweep, e->name, fault_fn_name(fn), nth);
  }
  if (!strcmp(sweep, "warm")) {
    live_get(&after);
    char what[256];
    snprintf(what, sizeof what, "warm %s after %s #%ld", e->name, fault_fn_name(fn), nth);
    if (!live_same(&before, &after, what)) fail_msg("%s: leak", what);
  }
  run_ok(e, ctx, 0, "retry after a fault");
}

static const int sweep_all[] = {FAULT_CREATE_BUFFER, FAULT_CREATE_PROGRAM_SOURCE, FAULT_CREATE_PROGRAM_BINARY,
                                FAULT_BUILD_PROGRAM, FAULT_CREATE_KERNEL, FAULT_SET_KERNEL_ARG,
                                FAULT_ENQUEUE_KERNEL, FAULT_MALLOC, FAULT_CALLOC, FAULT_REALLOC};

static void cold_sweep(entry *e, int binary_cache, const int *fns, int nfns) {
  const char *sweep = binary_cache ? "cold-cache" : "cold";
  live l0, l1;
  live_get(&l0);
  flashcl_context *ctx;
  if (binary_cache) { /* fills the disk cache, so that every later context loads from it */
    ctx = ctx_new(binary_cache);
    run_ok(e, ctx, 0, "cache warm-up");
    flashcl_context_destroy(ctx);
  }
  /* The counting run. */
  ctx = ctx_new(binary_cache);
  run_ok(e, ctx, 0, "cold count");
  long counts[FAULT_FN_COUNT];
  for (int f = 0; f < FAULT_FN_COUNT; f++) counts[f] = fault_count(f);
  for (int f = 0; f < FAULT_FN_COUNT; f++) (binary_cache ? e->cache : e->cold)[f] = counts[f];
  flashcl_context_destroy(ctx);
  live_get(&l1);
  if (!live_same(&l0, &l1, "cold count run")) fail_msg("%s: leak in a fault-free run", e->name);
  for (int i = 0; i < nfns; i++) {
    const int fn = fns[i];
    for (long n = 1; n <= counts[fn]; n++) {
      ctx = ctx_new(binary_cache);
      inject(e, ctx, fn, n, sweep);
      flashcl_context_destroy(ctx);
      live_get(&l1);
      char what[256];
      snprintf(what, sizeof what, "%s %s after %s #%ld and destroy", sweep, e->name, fault_fn_name(fn), n);
      if (!live_same(&l0, &l1, what)) fail_msg("%s: leak", what);
    }
  }
}

static void warm_sweep(entry *e) {
  live l0, l1;
  live_get(&l0);
  flashcl_context *ctx = ctx_new(0);
  run_ok(e, ctx, 0, "warm-up");
  run_ok(e, ctx, 0, "warm count");
  for (int f = 0; f < FAULT_FN_COUNT; f++) e->warm[f] = fault_count(f);
  for (size_t i = 0; i < sizeof sweep_all / sizeof sweep_all[0]; i++) {
    const int fn = sweep_all[i];
    for (long n = 1; n <= e->warm[fn]; n++) inject(e, ctx, fn, n, "warm");
  }
  flashcl_context_destroy(ctx);
  live_get(&l1);
  if (!live_same(&l0, &l1, "warm context destroyed")) fail_msg("%s: leak", e->name);
}

static void report(const entry *e, double secs) {
  char line[1024];
  int at = snprintf(line, sizeof line, "%-16s", e->name);
  for (size_t i = 0; i < sizeof sweep_all / sizeof sweep_all[0]; i++) {
    const int f = sweep_all[i];
    if (e->cold[f] || e->cache[f] || e->warm[f])
      at += snprintf(line + at, sizeof line - (size_t)at, " %s %ld/%ld/%ld", fault_fn_name(f), e->cold[f],
                     e->cache[f], e->warm[f]);
  }
  printf("%s | failed %ld absorbed %ld | %.1f s\n", line, e->failed, e->absorbed, secs);
  fflush(stdout);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_entry(void **state) {
  entry *e = *state;
  double t0 = now();
  /* The reference: a fault-free run on a context of its own; a second
   * context then finds the disk cache warm, as every later one does. */
  flashcl_context *ctx = ctx_new(0);
  run_ok(e, ctx, 1, "reference");
  flashcl_context_destroy(ctx);
  warm_sweep(e);
  cold_sweep(e, 0, sweep_all, (int)(sizeof sweep_all / sizeof sweep_all[0]));
  cold_sweep(e, 1, sweep_all, (int)(sizeof sweep_all / sizeof sweep_all[0]));
  report(e, now() - t0);
}

/* flashcl_context_create with each creation call failed in turn. */
static void test_context_create(void **state) {
  (void)state;
  double t0 = now();
  static const int fns[] = {FAULT_CREATE_CONTEXT, FAULT_CREATE_QUEUE, FAULT_MALLOC, FAULT_CALLOC, FAULT_REALLOC};
  live l0, l1;
  live_get(&l0);
  flashcl_context *ctx = (flashcl_context *)(uintptr_t)1;
  fault_arm(-1, 0);
  flashcl_status st = flashcl_context_create(NULL, &ctx);
  fault_disarm();
  assert_int_equal(st, FLASHCL_SUCCESS);
  long counts[FAULT_FN_COUNT];
  for (int f = 0; f < FAULT_FN_COUNT; f++) counts[f] = fault_count(f);
  flashcl_context_destroy(ctx);
  long failed = 0, absorbed = 0;
  char line[512];
  int at = snprintf(line, sizeof line, "%-16s", "context_create");
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    const int fn = fns[i];
    if (counts[fn]) at += snprintf(line + at, sizeof line - (size_t)at, " %s %ld", fault_fn_name(fn), counts[fn]);
    for (long n = 1; n <= counts[fn]; n++) {
      ctx = (flashcl_context *)(uintptr_t)1;
      fault_arm(fn, n);
      st = flashcl_context_create(NULL, &ctx);
      fault_disarm();
      g_injections++;
      if (!fault_fired()) fail_msg("context_create: %s #%ld not reached", fault_fn_name(fn), n);
      if (g_verbose)
        fprintf(stderr, "  context_create: %s #%ld -> %d %s\n", fault_fn_name(fn), n, st,
                st ? flashcl_context_last_error(NULL) : "");
      if (st < 0) {
        failed++;
        if (ctx != NULL) fail_msg("context_create: %s #%ld failed but *out is not NULL", fault_fn_name(fn), n);
        if (!*flashcl_context_last_error(NULL)) fail_msg("context_create: %s #%ld: no message", fault_fn_name(fn), n);
      } else {
        absorbed++;
        assert_non_null(ctx);
        flashcl_context_destroy(ctx);
      }
      live_get(&l1);
      char what[128];
      snprintf(what, sizeof what, "context_create after %s #%ld", fault_fn_name(fn), n);
      if (!live_same(&l0, &l1, what)) fail_msg("%s: leak", what);
      /* The next creation succeeds. */
      ctx = NULL;
      fault_arm(-1, 0);
      st = flashcl_context_create(NULL, &ctx);
      fault_disarm();
      assert_int_equal(st, FLASHCL_SUCCESS);
      flashcl_context_destroy(ctx);
      live_get(&l1);
      if (!live_same(&l0, &l1, "context_create retry")) fail_msg("context_create retry: leak");
    }
  }
  printf("%s | failed %ld absorbed %ld | %.1f s\n", line, failed, absorbed, now() - t0);
  fflush(stdout);
}

int main(void) {
  const char *vb = getenv("FLASHCL_FAULTS_VERBOSE");
  g_verbose = vb && atoi(vb) > 0;
  if (flashcl_context_create(NULL, &g_base) != FLASHCL_SUCCESS) {
    printf("no OpenCL device: %s\n", flashcl_context_last_error(NULL));
    return 77;
  }
  g_cl = flashcl_context_cl_context(g_base);
  g_dev = flashcl_context_cl_device(g_base);
  g_q = flashcl_context_cl_queue(g_base);
  setup_problems();
  double t0 = now();
  printf("entry point      function calls reached cold/cold-cache/warm | injections that failed / were absorbed\n");
  struct CMUnitTest tests[N_ENTRIES + 1];
  tests[0] = (struct CMUnitTest)cmocka_unit_test(test_context_create);
  for (int i = 0; i < N_ENTRIES; i++) {
    tests[i + 1] = (struct CMUnitTest){g_entries[i].name, test_entry, NULL, NULL, &g_entries[i]};
  }
  const char *filter = getenv("FLASHCL_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  int failed = cmocka_run_group_tests_name("faults", tests, NULL, NULL);
  printf("%ld injections in %.1f s\n", g_injections, now() - t0);
  flashcl_context_destroy(g_base);
  return failed ? 1 : 0;
}
