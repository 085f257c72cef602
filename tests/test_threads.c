/*
 * Threads (docs/reliability.md, "Threads").
 *
 *   own_contexts:   FCT_THREADS threads, each with its own context, run the
 *                   forward, the deterministic backward and a split decode
 *                   FLASHCL_THREADS_ITERS times each on tiny shapes.
 *   shared_context: the same number of threads share ONE context and mix
 *                   forward, backward, decode, kv_cache_append, config
 *                   queries, workspace sizes, the stats and a call that fails
 *                   on purpose (its message must be the thread's own, read
 *                   while the other threads keep calling).
 *
 * Every result must be bit-identical to a single-thread run of the same
 * inputs in a context of its own, and no call may fail (but the one meant
 * to). Worker threads never call cmocka (its assertions longjmp): they count
 * failures, and the main thread checks the counts.
 *
 * FLASHCL_THREADS_ITERS (default 50) sets the iterations per thread; the long
 * variant (test_threads_long) runs 1000. Build with -fsanitize=thread for the
 * ThreadSanitizer run (docs/reliability.md; tests/tsan.supp).
 */
#include "common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FCT_THREADS 8
#define D 32
/* Forward / backward: (1, 24, 2, 32) f32, causal. */
enum { FB = 1, FN = 24, FH = 2 };
/* Decode: 2 sequences, 4 query heads over 2 kv heads, a pool of 4 pages of 16
 * tokens, 2 pages per sequence, 2 splits (the context's scratch). */
enum { DB = 2, DHQ = 4, DHKV = 2, PAGE = 16, MAXP = 2, NPAGES = 4, SPLITS = 2 };
#define NQKV (FB * FN * FH * D)
#define NLSE (FB * FN * FH)
#define NDQ (DB * DHQ * D)
#define NCACHE (NPAGES * PAGE * DHKV * D)
#define NNEW (DB * DHKV * D)

static const int32_t DEC_LENS[DB] = {27, 13};   /* including the new token */
static const int32_t APPEND_AT[DB] = {26, 12}; /* the append writes the last token */
static const int32_t DEC_TABLE[DB * MAXP] = {2, 0, 3, 1};

typedef struct host_in {
  float q[NQKV], k[NQKV], v[NQKV], d_o[NQKV];
  float dec_q[NDQ], kc[NCACHE], vc[NCACHE], k_new[NNEW], v_new[NNEW];
} host_in;

typedef struct results {
  float o[NQKV], lse[NLSE], dq[NQKV], dk[NQKV], dv[NQKV];
  float dec_o[NDQ], dec_lse[DB * DHQ];
  float kc[NCACHE], vc[NCACHE]; /* after the append */
  size_t bwd_ws, dec_ws;
  int dec_splits;
  flashcl_config fwd_cfg, dec_cfg;
} results;

static host_in IN;
static results REF;

/* One thread's buffers in a context (all of them its own). */
typedef struct session {
  flashcl_context *ctx;
  cl_command_queue queue;
  cl_mem mem[17];
  flashcl_tensor q, k, v, d_o, o, lse, dq, dk, dv;
  flashcl_tensor dec_q, kc, vc, dec_o, dec_lse, k_new, v_new;
  cl_mem table, lens, append_at;
  flashcl_attention_desc fdesc;
  flashcl_decode_desc ddesc;
} session;

static cl_mem make_buffer(cl_context c, size_t bytes, const void *init) {
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(c, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes, (void *)init, &err);
  return err == CL_SUCCESS ? m : NULL;
}

/* Creates s's buffers in ctx; 0 on failure. */
static int session_open(session *s, flashcl_context *ctx) {
  memset(s, 0, sizeof *s);
  s->ctx = ctx;
  s->queue = flashcl_context_cl_queue(ctx);
  cl_context c = flashcl_context_cl_context(ctx);
  int n = 0;
#define BUF(var, bytes, init) (s->mem[n++] = var = make_buffer(c, bytes, init))
  cl_mem q, k, v, d_o, o, lse, dq, dk, dv, dec_q, kc, vc, dec_o, dec_lse, k_new, v_new;
  BUF(q, sizeof IN.q, IN.q);
  BUF(k, sizeof IN.k, IN.k);
  BUF(v, sizeof IN.v, IN.v);
  BUF(d_o, sizeof IN.d_o, IN.d_o);
  BUF(o, sizeof REF.o, NULL);
  BUF(lse, sizeof REF.lse, NULL);
  BUF(dq, sizeof REF.dq, NULL);
  BUF(dk, sizeof REF.dk, NULL);
  BUF(dv, sizeof REF.dv, NULL);
  BUF(dec_q, sizeof IN.dec_q, IN.dec_q);
  BUF(kc, sizeof IN.kc, IN.kc);
  BUF(vc, sizeof IN.vc, IN.vc);
  BUF(dec_o, sizeof REF.dec_o, NULL);
  BUF(dec_lse, sizeof REF.dec_lse, NULL);
  BUF(k_new, sizeof IN.k_new, IN.k_new);
  BUF(v_new, sizeof IN.v_new, IN.v_new);
  BUF(s->table, sizeof DEC_TABLE, DEC_TABLE);
  /* s->lens / s->append_at are not in mem[] (17 slots): released below. */
  s->lens = make_buffer(c, sizeof DEC_LENS, DEC_LENS);
  s->append_at = make_buffer(c, sizeof APPEND_AT, APPEND_AT);
#undef BUF
  for (int i = 0; i < n; i++)
    if (!s->mem[i]) return 0;
  if (!s->lens || !s->append_at) return 0;
  int ok = 1;
  ok &= flashcl_tensor_init_bnhd(&s->q, q, 0, FLASHCL_F32, FB, FN, FH, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->k, k, 0, FLASHCL_F32, FB, FN, FH, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->v, v, 0, FLASHCL_F32, FB, FN, FH, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->d_o, d_o, 0, FLASHCL_F32, FB, FN, FH, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->o, o, 0, FLASHCL_F32, FB, FN, FH, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_lse(&s->lse, lse, 0, FB, FN, FH) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->dq, dq, 0, FLASHCL_F32, FB, FN, FH, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->dk, dk, 0, FLASHCL_F32, FB, FN, FH, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->dv, dv, 0, FLASHCL_F32, FB, FN, FH, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->dec_q, dec_q, 0, FLASHCL_F32, DB, 1, DHQ, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->kc, kc, 0, FLASHCL_F32, NPAGES, PAGE, DHKV, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->vc, vc, 0, FLASHCL_F32, NPAGES, PAGE, DHKV, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->dec_o, dec_o, 0, FLASHCL_F32, DB, 1, DHQ, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_lse(&s->dec_lse, dec_lse, 0, DB, 1, DHQ) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->k_new, k_new, 0, FLASHCL_F32, DB, 1, DHKV, D) == FLASHCL_SUCCESS;
  ok &= flashcl_tensor_init_bnhd(&s->v_new, v_new, 0, FLASHCL_F32, DB, 1, DHKV, D) == FLASHCL_SUCCESS;
  flashcl_attention_desc_init(&s->fdesc);
  s->fdesc.mask.causal = 1;
  s->fdesc.backward.deterministic = 1;
  flashcl_decode_desc_init(&s->ddesc);
  s->ddesc.cache.page_size = PAGE;
  s->ddesc.cache.block_table = s->table;
  s->ddesc.cache.max_pages = MAXP;
  s->ddesc.split.num_splits = SPLITS;
  return ok;
}

static void session_close(session *s) {
  for (int i = 0; i < (int)(sizeof s->mem / sizeof s->mem[0]); i++)
    if (s->mem[i]) clReleaseMemObject(s->mem[i]);
  if (s->lens) clReleaseMemObject(s->lens);
  if (s->append_at) clReleaseMemObject(s->append_at);
  memset(s, 0, sizeof *s);
}

static int read_back(session *s, cl_mem m, void *host, size_t bytes) {
  return clEnqueueReadBuffer(s->queue, m, CL_TRUE, 0, bytes, host, 0, NULL, NULL) == CL_SUCCESS;
}

/* The operations; each returns a flashcl status or, for a failed read-back,
 * FLASHCL_ERROR_OPENCL, and writes its results into r. */
static flashcl_status op_forward(session *s, results *r) {
  flashcl_status st = flashcl_attention_forward(s->ctx, &s->fdesc, &s->q, &s->k, &s->v, &s->o, &s->lse, 0, NULL, NULL);
  if (st) return st;
  return read_back(s, s->o.buffer, r->o, sizeof r->o) && read_back(s, s->lse.buffer, r->lse, sizeof r->lse)
             ? FLASHCL_SUCCESS
             : FLASHCL_ERROR_OPENCL;
}

static flashcl_status op_backward(session *s, results *r) {
  flashcl_status st = flashcl_attention_backward(s->ctx, &s->fdesc, &s->q, &s->k, &s->v, &s->o, &s->lse, &s->d_o,
                                                 &s->dq, &s->dk, &s->dv, 0, NULL, NULL);
  if (st) return st;
  return read_back(s, s->dq.buffer, r->dq, sizeof r->dq) && read_back(s, s->dk.buffer, r->dk, sizeof r->dk) &&
                 read_back(s, s->dv.buffer, r->dv, sizeof r->dv)
             ? FLASHCL_SUCCESS
             : FLASHCL_ERROR_OPENCL;
}

/* The append rewrites each sequence's last token with the same k_new/v_new,
 * so that repeated appends leave the cache (and the decode) unchanged. */
static flashcl_status op_append_decode(session *s, results *r) {
  flashcl_status st = flashcl_kv_cache_append(s->ctx, FCT_APPEND_DESC(&s->ddesc), &s->k_new, &s->v_new, &s->kc, &s->vc, s->append_at,
                                              0, NULL, NULL);
  if (st) return st;
  st = flashcl_attention_decode(s->ctx, &s->ddesc, &s->dec_q, &s->kc, &s->vc, s->lens, &s->dec_o, &s->dec_lse, 0,
                                NULL, NULL);
  if (st) return st;
  return read_back(s, s->dec_o.buffer, r->dec_o, sizeof r->dec_o) &&
                 read_back(s, s->dec_lse.buffer, r->dec_lse, sizeof r->dec_lse) &&
                 read_back(s, s->kc.buffer, r->kc, sizeof r->kc) && read_back(s, s->vc.buffer, r->vc, sizeof r->vc)
             ? FLASHCL_SUCCESS
             : FLASHCL_ERROR_OPENCL;
}

static flashcl_status op_queries(session *s, results *r) {
  flashcl_status st;
  if ((st = flashcl_attention_workspace_size(s->ctx, &s->fdesc, &s->q, &s->k, &s->v, FLASHCL_PASS_BACKWARD,
                                             &r->bwd_ws)) ||
      (st = flashcl_attention_decode_workspace_size(s->ctx, &s->ddesc, &s->dec_q, &s->kc, &s->vc, &r->dec_ws,
                                                    &r->dec_splits)) ||
      (st = flashcl_attention_config(s->ctx, &s->fdesc, &s->q, &s->k, &s->v, &s->o, FLASHCL_PASS_FORWARD,
                                     &r->fwd_cfg)) ||
      (st = flashcl_decode_config(s->ctx, &s->ddesc, &s->dec_q, &s->kc, &s->vc, &r->dec_cfg)))
    return st;
  flashcl_context_stats stats;
  size_t local = 0;
  flashcl_tuning t;
  if ((st = flashcl_context_stats_get(s->ctx, &stats)) || (st = flashcl_context_local_memory(s->ctx, &local)) ||
      (st = flashcl_tuning_parse(s->ctx, "fwd br=16 bc=16", &t)))
    return st;
  return FLASHCL_SUCCESS;
}

#define SAME(field) (memcmp(a->field, b->field, sizeof a->field) == 0)
static int same_forward(const results *a, const results *b) { return SAME(o) && SAME(lse); }
static int same_backward(const results *a, const results *b) { return SAME(dq) && SAME(dk) && SAME(dv); }
static int same_decode(const results *a, const results *b) {
  return SAME(dec_o) && SAME(dec_lse) && SAME(kc) && SAME(vc);
}
static int same_queries(const results *a, const results *b) {
  return a->bwd_ws == b->bwd_ws && a->dec_ws == b->dec_ws && a->dec_splits == b->dec_splits &&
         memcmp(&a->fwd_cfg, &b->fwd_cfg, sizeof a->fwd_cfg) == 0 &&
         memcmp(&a->dec_cfg, &b->dec_cfg, sizeof a->dec_cfg) == 0;
}
#undef SAME

static int iterations(void) {
  const char *e = getenv("FLASHCL_THREADS_ITERS");
  int n = e && *e ? atoi(e) : 50;
  return n > 0 ? n : 1;
}

static flashcl_context *new_context(void) {
  flashcl_context_options opt;
  flashcl_context_options_init(&opt);
  opt.no_user_tuning = 1;
  opt.verbose = getenv("FLASHCL_TEST_VERBOSE") ? 1 : 0;
  flashcl_context *ctx = NULL;
  if (flashcl_context_create(&opt, &ctx) != FLASHCL_SUCCESS) {
    fprintf(stderr, "flashcl_context_create: %s\n", flashcl_context_last_error(NULL));
    return NULL;
  }
  return ctx;
}

/* A worker's tally: calls made, calls that failed (with the first message),
 * results that differ from REF, messages that were not the thread's own. */
typedef struct worker {
  pthread_t id;
  int index, iters;
  flashcl_context *shared; /* NULL: the worker creates its own context */
  long calls, failed, mismatched, wrong_message;
  char first_error[512];
} worker;

static void note_failure(worker *w, const char *what, flashcl_status st, flashcl_context *ctx) {
  if (w->failed++ == 0)
    snprintf(w->first_error, sizeof w->first_error, "%s: %s: %s", what, flashcl_status_string(st),
             ctx ? flashcl_context_last_error(ctx) : "");
}

static void *worker_own(void *arg) {
  worker *w = (worker *)arg;
  flashcl_context *ctx = new_context();
  session s;
  if (!ctx || !session_open(&s, ctx)) {
    note_failure(w, "setting up the context and buffers", FLASHCL_ERROR_INTERNAL, NULL);
    if (ctx) {
      session_close(&s);
      flashcl_context_destroy(ctx);
    }
    return NULL;
  }
  results *r = (results *)calloc(1, sizeof *r);
  for (int it = 0; r && it < w->iters; it++) {
    flashcl_status st;
    w->calls += 3;
    if ((st = op_forward(&s, r))) note_failure(w, "forward", st, ctx);
    else if (!same_forward(r, &REF)) w->mismatched++;
    if ((st = op_backward(&s, r))) note_failure(w, "backward", st, ctx);
    else if (!same_backward(r, &REF)) w->mismatched++;
    if ((st = op_append_decode(&s, r))) note_failure(w, "append + decode", st, ctx);
    else if (!same_decode(r, &REF)) w->mismatched++;
  }
  if (!r) note_failure(w, "calloc", FLASHCL_ERROR_HOST_OUT_OF_MEMORY, NULL);
  free(r);
  session_close(&s);
  flashcl_context_destroy(ctx);
  return NULL;
}

static void *worker_shared(void *arg) {
  worker *w = (worker *)arg;
  flashcl_context *ctx = w->shared;
  session s;
  if (!session_open(&s, ctx)) {
    note_failure(w, "creating the buffers", FLASHCL_ERROR_INTERNAL, NULL);
    session_close(&s);
    return NULL;
  }
  results *r = (results *)calloc(1, sizeof *r);
  for (int it = 0; r && it < w->iters; it++) {
    flashcl_status st;
    w->calls++;
    switch ((it + w->index) % 5) {
    case 0:
      if ((st = op_forward(&s, r))) note_failure(w, "forward", st, ctx);
      else if (!same_forward(r, &REF)) w->mismatched++;
      break;
    case 1:
      if ((st = op_append_decode(&s, r))) note_failure(w, "append + decode", st, ctx);
      else if (!same_decode(r, &REF)) w->mismatched++;
      break;
    case 2:
      if ((st = op_queries(&s, r))) note_failure(w, "queries", st, ctx);
      else if (!same_queries(r, &REF)) w->mismatched++;
      break;
    case 3:
      /* The forward first: the backward reads o and lse. */
      if ((st = op_forward(&s, r)) || (st = op_backward(&s, r))) note_failure(w, "forward + backward", st, ctx);
      else if (!same_forward(r, &REF) || !same_backward(r, &REF)) w->mismatched++;
      break;
    default: {
      /* A call that fails: the message read back is this thread's, whatever
       * the others did on the context meanwhile. */
      char want[64];
      snprintf(want, sizeof want, "tuning of thread %d", w->index);
      flashcl_tuning t;
      flashcl_tuning_init(&t, FLASHCL_TUNE_FWD);
      st = flashcl_tuning_set(ctx, &t, want, 1);
      const char *msg = flashcl_context_last_error(ctx);
      if (st != FLASHCL_ERROR_INVALID_ARGUMENT) note_failure(w, "flashcl_tuning_set (meant to fail)", st, ctx);
      else if (!strstr(msg, want)) w->wrong_message++;
      break;
    }
    }
  }
  if (!r) note_failure(w, "calloc", FLASHCL_ERROR_HOST_OUT_OF_MEMORY, NULL);
  free(r);
  session_close(&s);
  return NULL;
}

/* The single-thread run: REF, in a context of its own. */
static int group_setup(void **state) {
  (void)state;
  fct_rng rng;
  fct_rng_init(&rng, "threads");
  float *all[] = {IN.q, IN.k, IN.v, IN.d_o, IN.dec_q, IN.kc, IN.vc, IN.k_new, IN.v_new};
  const size_t counts[] = {NQKV, NQKV, NQKV, NQKV, NDQ, NCACHE, NCACHE, NNEW, NNEW};
  for (int i = 0; i < 9; i++)
    for (size_t j = 0; j < counts[i]; j++) all[i][j] = (float)fct_rng_normal(&rng);
  flashcl_context *ctx = new_context();
  if (!ctx) return -1;
  session s;
  int ok = session_open(&s, ctx);
  flashcl_status st = FLASHCL_ERROR_INTERNAL;
  if (ok && !(st = op_forward(&s, &REF)) && !(st = op_backward(&s, &REF)) && !(st = op_append_decode(&s, &REF)))
    st = op_queries(&s, &REF);
  if (st) fprintf(stderr, "single-thread run: %s: %s\n", flashcl_status_string(st), flashcl_context_last_error(ctx));
  /* The runs must be repeatable in one context before threads come in. */
  results *again = (results *)calloc(1, sizeof *again);
  if (!st && again && !(st = op_forward(&s, again)) && !(st = op_backward(&s, again)) &&
      !(st = op_append_decode(&s, again)) && !(st = op_queries(&s, again)) &&
      !(same_forward(again, &REF) && same_backward(again, &REF) && same_decode(again, &REF) &&
        same_queries(again, &REF))) {
    fprintf(stderr, "a second single-thread run differs from the first\n");
    st = FLASHCL_ERROR_INTERNAL;
  }
  free(again);
  session_close(&s);
  flashcl_context_destroy(ctx);
  return st == FLASHCL_SUCCESS ? 0 : -1;
}

static void check_workers(const worker *w, int n, const char *what) {
  long calls = 0, failed = 0, mismatched = 0, wrong = 0;
  for (int i = 0; i < n; i++) {
    calls += w[i].calls;
    failed += w[i].failed;
    mismatched += w[i].mismatched;
    wrong += w[i].wrong_message;
    if (w[i].failed) print_message("[  ERROR   ] thread %d: %s\n", i, w[i].first_error);
  }
  print_message("[ THREADS  ] %s: %d threads, %ld calls, %ld failed, %ld not bit-identical, %ld wrong messages\n",
                what, n, calls, failed, mismatched, wrong);
  assert_int_equal(failed, 0);
  assert_int_equal(mismatched, 0);
  assert_int_equal(wrong, 0);
}

static void test_own_contexts(void **state) {
  (void)state;
  worker w[FCT_THREADS];
  memset(w, 0, sizeof w);
  for (int i = 0; i < FCT_THREADS; i++) {
    w[i].index = i;
    w[i].iters = iterations();
    assert_int_equal(pthread_create(&w[i].id, NULL, worker_own, &w[i]), 0);
  }
  for (int i = 0; i < FCT_THREADS; i++) pthread_join(w[i].id, NULL);
  check_workers(w, FCT_THREADS, "one context each");
}

static void test_shared_context(void **state) {
  (void)state;
  flashcl_context *ctx = new_context();
  assert_non_null(ctx);
  worker w[FCT_THREADS];
  memset(w, 0, sizeof w);
  for (int i = 0; i < FCT_THREADS; i++) {
    w[i].index = i;
    /* Five operations in turn: at least one round of each per thread. */
    w[i].iters = iterations() < 5 ? 5 : iterations();
    w[i].shared = ctx;
    assert_int_equal(pthread_create(&w[i].id, NULL, worker_shared, &w[i]), 0);
  }
  for (int i = 0; i < FCT_THREADS; i++) pthread_join(w[i].id, NULL);
  flashcl_context_destroy(ctx);
  check_workers(w, FCT_THREADS, "one shared context");
}

/* flashcl_context_last_error from a thread that made no call on the context:
 * a copy of the context's last message. */
static void *read_message(void *arg) {
  flashcl_context *ctx = (flashcl_context *)arg;
  return (void *)strstr(flashcl_context_last_error(ctx), "the fwd family has no parameter \"bogus\"");
}

static void test_message_rule(void **state) {
  (void)state;
  flashcl_context *ctx = new_context();
  assert_non_null(ctx);
  flashcl_tuning t;
  flashcl_tuning_init(&t, FLASHCL_TUNE_FWD);
  assert_int_equal(flashcl_tuning_set(ctx, &t, "bogus", 1), FLASHCL_ERROR_INVALID_ARGUMENT);
  pthread_t id;
  void *found = NULL;
  assert_int_equal(pthread_create(&id, NULL, read_message, ctx), 0);
  pthread_join(id, &found);
  assert_non_null(found);
  /* This thread's own copy is the same message. */
  assert_non_null(strstr(flashcl_context_last_error(ctx), "\"bogus\""));
  /* A successful call clears it. */
  size_t local = 0;
  assert_int_equal(flashcl_context_local_memory(ctx, &local), FLASHCL_SUCCESS);
  assert_string_equal(flashcl_context_last_error(ctx), "");
  flashcl_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_message_rule),
      cmocka_unit_test(test_own_contexts),
      cmocka_unit_test(test_shared_context),
  };
  const char *filter = getenv("FLASHCL_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  print_message("[ THREADS  ] %d threads, %d iterations each\n", FCT_THREADS, iterations());
  return _cmocka_run_group_tests("threads", tests, sizeof tests / sizeof tests[0], group_setup, NULL);
}
