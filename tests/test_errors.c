/*
 * Error paths of flashcl_attention_forward. Every case asserts the returned status
 * and that the (NaN-poisoned) output buffers are bit-for-bit unchanged afterwards,
 * i.e. a failed call enqueues nothing and writes nothing. Cases whose status the
 * header leaves open accept a short list of codes and say so.
 */
#include "common.h"

#include <limits.h>
#include <stdlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { FX_B = 1, FX_N = 16, FX_H = 2, FX_D = 64 };

/* A valid problem: f32, (1, 16, 2, 64), BNHD, with o and lse. */
typedef struct fixture {
  fct_tensor q, k, v, o, lse;
  flashcl_attention_desc desc;
} fixture;

static fixture g_fx;

static void fixture_make(fixture *f) {
  fct_rng rng;
  fct_rng_init(&rng, "errors-fixture");
  fct_tensor_create(&f->q, FLASHCL_F32, FCT_BNHD, FX_B, FX_N, FX_H, FX_D, 0);
  fct_tensor_create(&f->k, FLASHCL_F32, FCT_BNHD, FX_B, FX_N, FX_H, FX_D, 0);
  fct_tensor_create(&f->v, FLASHCL_F32, FCT_BNHD, FX_B, FX_N, FX_H, FX_D, 0);
  fct_tensor_create(&f->o, FLASHCL_F32, FCT_BNHD, FX_B, FX_N, FX_H, FX_D, 0);
  fct_tensor_create_lse(&f->lse, FCT_BNHD, FX_B, FX_N, FX_H, 0);
  fct_tensor_fill_random(&f->q, &rng);
  fct_tensor_fill_random(&f->k, &rng);
  fct_tensor_fill_random(&f->v, &rng);
  flashcl_attention_desc_init(&f->desc);
}

static void fixture_release(fixture *f) {
  fct_tensor_release(&f->q);
  fct_tensor_release(&f->k);
  fct_tensor_release(&f->v);
  fct_tensor_release(&f->o);
  fct_tensor_release(&f->lse);
}

static int group_setup(void **state) {
  if (fct_group_setup(state) != 0) return -1;
  fixture_make(&g_fx);
  return 0;
}

static int group_teardown(void **state) {
  fixture_release(&g_fx);
  return fct_group_teardown(state);
}

static void check_untouched(fct_tensor *t, const char *name, const char *what) {
  size_t changed;
  fct_tensor_download(t);
  changed = fct_tensor_count_unpoisoned(t);
  FCT_CHECK(changed == 0, "%s: the failed call changed %zu element(s) of %s's buffer", what, changed, name);
}

/* Calls forward with the given arguments and checks: status is one of `ok`
 * (n_ok codes), the fixture's o/lse buffers and `extra` (if any) are unchanged,
 * and the context has a last-error message. */
static void expect_codes(flashcl_context *ctx, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                         const flashcl_tensor *k, const flashcl_tensor *v, const flashcl_tensor *o,
                         const flashcl_tensor *lse, fct_tensor *extra, cl_uint nwait, const cl_event *wait,
                         const int *ok, int n_ok, const char *what) {
  cl_event ev = NULL;
  flashcl_status st;
  int i, match = 0;
  fct_tensor_poison(&g_fx.o);
  fct_tensor_poison(&g_fx.lse);
  if (extra) fct_tensor_poison(extra);
  st = flashcl_attention_forward(ctx, desc, q, k, v, o, lse, nwait, wait, &ev);
  for (i = 0; i < n_ok; i++) match |= (int)st == ok[i];
  if (!match) {
    char want[256] = "";
    for (i = 0; i < n_ok; i++) {
      size_t len = strlen(want);
      snprintf(want + len, sizeof want - len, "%s%s", i ? " or " : "", flashcl_status_string(ok[i]));
    }
    FCT_FAIL("%s: status %d (%s), want %s; last error: %s", what, (int)st, flashcl_status_string(st), want,
             ctx ? flashcl_context_last_error(ctx) : "(ctx NULL)");
  }
  if (st == FLASHCL_SUCCESS && ev) clReleaseEvent(ev);
  fct_finish();
  check_untouched(&g_fx.o, "o", what);
  check_untouched(&g_fx.lse, "lse", what);
  if (extra) check_untouched(extra, "the extra output", what);
  if (ctx)
    FCT_CHECK(flashcl_context_last_error(ctx) != NULL && flashcl_context_last_error(ctx)[0] != '\0',
              "%s: no flashcl_context_last_error message after the failure", what);
}

#define EXPECT(status, desc, q, k, v, o, lse, what)                                              \
  do {                                                                                           \
    const int ok_[1] = {(int)(status)};                                                          \
    expect_codes(fct_env_get()->ctx, desc, q, k, v, o, lse, NULL, 0, NULL, ok_, 1, what);        \
  } while (0)

/* Shorthands for the fixture's tensors. */
#define FQ (&g_fx.q.t)
#define FK (&g_fx.k.t)
#define FV (&g_fx.v.t)
#define FO (&g_fx.o.t)
#define FL (&g_fx.lse.t)
#define FD (&g_fx.desc)

/* The fixture itself must work, or every error test below proves nothing. */
static void test_fixture_is_valid(void **state) {
  cl_event ev = NULL;
  flashcl_status st;
  size_t written;
  (void)state;
  fct_tensor_poison(&g_fx.o);
  fct_tensor_poison(&g_fx.lse);
  st = flashcl_attention_forward(fct_env_get()->ctx, FD, FQ, FK, FV, FO, FL, 0, NULL, &ev);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "the error-test fixture (f32 1x16x2x64) must be valid");
  if (ev) clReleaseEvent(ev);
  fct_finish();
  fct_tensor_download(&g_fx.o);
  written = fct_tensor_count_unpoisoned(&g_fx.o);
  FCT_CHECK(written == (size_t)(FX_B * FX_N * FX_H * FX_D), "valid fixture call wrote %zu of %d elements of o",
            written, FX_B * FX_N * FX_H * FX_D);
}

static void test_null_arguments(void **state) {
  flashcl_tensor t;
  flashcl_attention_desc d;
  (void)state;
  {
    const int ok[1] = {FLASHCL_ERROR_INVALID_ARGUMENT};
    expect_codes(NULL, FD, FQ, FK, FV, FO, FL, NULL, 0, NULL, ok, 1, "ctx = NULL");
  }
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, NULL, FQ, FK, FV, FO, FL, "desc = NULL");
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, NULL, FK, FV, FO, FL, "q = NULL");
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, FQ, NULL, FV, FO, FL, "k = NULL");
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, FQ, FK, NULL, FO, FL, "v = NULL");
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, FQ, FK, FV, NULL, FL, "o = NULL");
  t = *FQ;
  t.buffer = NULL;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, &t, FK, FV, FO, FL, "q.buffer = NULL");
  t = *FV;
  t.buffer = NULL;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, FQ, FK, &t, FO, FL, "v.buffer = NULL");
  t = *FO;
  t.buffer = NULL;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, FQ, FK, FV, &t, FL, "o.buffer = NULL");
  t = *FL;
  t.buffer = NULL;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, FQ, FK, FV, FO, &t, "lse.buffer = NULL");
  d = *FD;
  d.varlen.cu_seqlens_q = g_fx.q.t.buffer; /* any cl_mem; cu_seqlens_k missing */
  d.varlen.num_seqs = 1, d.varlen.max_seqlen_q = d.varlen.max_seqlen_k = FX_N;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, &d, FQ, FK, FV, FO, FL, "varlen with cu_seqlens_k = NULL");
  {
    /* A wait list count without a list: flashcl_attention_forward refuses it with
     * INVALID_ARGUMENT before any OpenCL call (src/attention/attention.c). */
    const int ok[1] = {FLASHCL_ERROR_INVALID_ARGUMENT};
    expect_codes(fct_env_get()->ctx, FD, FQ, FK, FV, FO, FL, NULL, 2, NULL, ok, 1,
                 "num_events_in_wait_list = 2 with event_wait_list = NULL");
  }
}

static void test_invalid_shapes(void **state) {
  flashcl_tensor q, k, v, o, l;
  flashcl_attention_desc d;
  int dim;
  static const char *names[4] = {"batch", "seqlen", "heads", "head_dim"};
  char what[128];
  (void)state;
  for (dim = 0; dim < 4; dim++) {
    q = *FQ;
    q.shape[dim] = 0;
    snprintf(what, sizeof what, "q.shape[%d] (%s) = 0", dim, names[dim]);
    EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, &q, FK, FV, FO, FL, what);
    q.shape[dim] = -1;
    snprintf(what, sizeof what, "q.shape[%d] (%s) = -1", dim, names[dim]);
    EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, &q, FK, FV, FO, FL, what);
    k = *FK, v = *FV;
    k.shape[dim] = v.shape[dim] = 0;
    snprintf(what, sizeof what, "k/v.shape[%d] (%s) = 0", dim, names[dim]);
    EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, FQ, &k, &v, FO, FL, what);
    o = *FO;
    o.shape[dim] = -5;
    snprintf(what, sizeof what, "o.shape[%d] (%s) = -5", dim, names[dim]);
    EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, FQ, FK, FV, &o, FL, what);
  }
  /* Inconsistent shapes (all within their buffers). */
  o = *FO;
  o.shape[1] = FX_N - 1;
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, FQ, FK, FV, &o, FL, "o seqlen != q seqlen");
  o = *FO;
  o.shape[2] = 1;
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, FQ, FK, FV, &o, FL, "o heads != q heads");
  k = *FK;
  k.shape[1] = FX_N - 1;
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, FQ, &k, FV, FO, FL, "k seqlen != v seqlen");
  k = *FK, v = *FV;
  k.shape[3] = v.shape[3] = 32;
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, FQ, &k, &v, FO, FL, "k/v head_dim 32 != q head_dim 64");
  q = *FQ, o = *FO, l = *FL;
  q.shape[0] = o.shape[0] = l.shape[0] = 2;
  q.stride[0] = o.stride[0] = l.stride[0] = 0; /* stays inside the buffer */
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, &q, FK, FV, &o, &l, "q batch 2 != k batch 1");
  l = *FL;
  l.shape[1] = FX_N - 1;
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, FQ, FK, FV, FO, &l, "lse seqlen != q seqlen");
  l = *FL;
  l.shape[2] = 1;
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, FQ, FK, FV, FO, &l, "lse heads != q heads");
  d = *FD;
  d.shape.heads_q = 4;
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, &d, FQ, FK, FV, FO, FL, "desc.shape.heads_q = 4 but q has 2 heads");
  d = *FD;
  d.shape.heads_kv = 1;
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, &d, FQ, FK, FV, FO, FL, "desc.shape.heads_kv = 1 but k has 2 heads");

  /* heads_q not a multiple of heads_kv: q/o with 3 heads (of 64, inside the
   * buffers), k/v with 2. */
  q = *FQ, o = *FO, l = *FL;
  q.shape[2] = o.shape[2] = l.shape[2] = 3;
  q.shape[1] = o.shape[1] = l.shape[1] = 8; /* 8 rows x 3 heads x 64 fit in 16 x 2 x 64 */
  q.stride[1] = o.stride[1] = 3 * FX_D;
  l.stride[2] = 8;
  k = *FK, v = *FV;
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, &q, &k, &v, &o, &l, "heads_q 3 not a multiple of heads_kv 2");
  q.shape[2] = o.shape[2] = l.shape[2] = 1; /* 1 query head, 2 kv heads */
  EXPECT(FLASHCL_ERROR_INVALID_SHAPE, FD, &q, &k, &v, &o, &l, "heads_q 1 < heads_kv 2");

  /* Varlen needs batch-1 (packed) tensors. */
  {
    cl_mem cu = fct_create_buffer(2 * sizeof(int32_t), (const int32_t[2]){0, FX_N / 2});
    q = *FQ, o = *FO, l = *FL, k = *FK, v = *FV;
    q.shape[0] = o.shape[0] = l.shape[0] = k.shape[0] = v.shape[0] = 2;
    q.shape[1] = o.shape[1] = l.shape[1] = k.shape[1] = v.shape[1] = FX_N / 2;
    q.stride[0] = o.stride[0] = k.stride[0] = v.stride[0] = (FX_N / 2) * FX_H * FX_D;
    l.stride[0] = FX_N / 2, l.stride[2] = FX_N;
    d = *FD;
    d.varlen.cu_seqlens_q = d.varlen.cu_seqlens_k = cu;
    d.varlen.num_seqs = 1, d.varlen.max_seqlen_q = d.varlen.max_seqlen_k = FX_N / 2;
    EXPECT(FLASHCL_ERROR_INVALID_SHAPE, &d, &q, &k, &v, &o, &l, "varlen with batch-2 tensors");
    {
      /* num_seqs = 0 with cu_seqlens set: INVALID_SHAPE (fcl_check_problem: varlen
       * needs num_seqs, max_seqlen_q and max_seqlen_k >= 1). */
      d.varlen.num_seqs = 0;
      EXPECT(FLASHCL_ERROR_INVALID_SHAPE, &d, FQ, FK, FV, FO, FL, "varlen with num_seqs = 0");
    }
    clReleaseMemObject(cu);
  }
}

static void test_buffer_too_small(void **state) {
  const size_t full = (size_t)(FX_B * FX_N * FX_H * FX_D) * 4;
  fct_tensor small;
  flashcl_tensor t, l;
  int64_t shape[4] = {FX_B, FX_N, FX_H, FX_D}, stride[4] = {FX_N * FX_H * FX_D, FX_H * FX_D, FX_D, 1};
  int64_t lshape[4] = {FX_B, FX_N, FX_H, 1}, lstride[4] = {FX_H * FX_N, 1, FX_N, 1};
  (void)state;

  /* o in a buffer one element short. */
  fct_tensor_create_custom(&small, FLASHCL_F32, full - 4, 0, shape, stride);
  {
    const int ok[1] = {FLASHCL_ERROR_BUFFER_TOO_SMALL};
    expect_codes(fct_env_get()->ctx, FD, FQ, FK, FV, &small.t, FL, &small, 0, NULL, ok, 1,
                 "o buffer one element short");
    /* q in a buffer one element short (the extra buffer is then an input; it must
     * not be written either). */
    expect_codes(fct_env_get()->ctx, FD, &small.t, FK, FV, FO, FL, &small, 0, NULL, ok, 1,
                 "q buffer one element short");
  }
  fct_tensor_release(&small);

  /* Offsets pushing the view past the end. */
  t = *FK;
  t.offset = 4;
  EXPECT(FLASHCL_ERROR_BUFFER_TOO_SMALL, FD, FQ, &t, FV, FO, FL, "k offset 4 bytes in an exact-size buffer");
  t = *FO;
  t.offset = full;
  EXPECT(FLASHCL_ERROR_BUFFER_TOO_SMALL, FD, FQ, FK, FV, &t, FL, "o offset = buffer size");
  t = *FV;
  t.stride[1] += 1; /* padded rows no longer fit */
  t.stride[0] = FX_N * t.stride[1];
  EXPECT(FLASHCL_ERROR_BUFFER_TOO_SMALL, FD, FQ, FK, &t, FO, FL, "v strides reach past the buffer");

  /* LSE too small. */
  fct_tensor_create_custom(&small, FLASHCL_F32, (size_t)(FX_B * FX_N * FX_H) * 4 - 4, 0, lshape, lstride);
  {
    const int ok[1] = {FLASHCL_ERROR_BUFFER_TOO_SMALL};
    expect_codes(fct_env_get()->ctx, FD, FQ, FK, FV, FO, &small.t, &small, 0, NULL, ok, 1,
                 "lse buffer one element short");
  }
  fct_tensor_release(&small);
  l = *FL;
  l.offset = 8;
  EXPECT(FLASHCL_ERROR_BUFFER_TOO_SMALL, FD, FQ, FK, FV, FO, &l, "lse offset 8 bytes in an exact-size buffer");

  /* Varlen cu_seqlens buffer shorter than num_seqs + 1 entries. */
  {
    const int32_t cu_host[2] = {0, FX_N};
    cl_mem cu = fct_create_buffer(sizeof cu_host, cu_host);
    flashcl_attention_desc d = *FD;
    d.varlen.cu_seqlens_q = d.varlen.cu_seqlens_k = cu;
    d.varlen.num_seqs = 4;
    d.varlen.max_seqlen_q = d.varlen.max_seqlen_k = FX_N;
    EXPECT(FLASHCL_ERROR_BUFFER_TOO_SMALL, &d, FQ, FK, FV, FO, FL,
           "cu_seqlens buffers of 2 entries with num_seqs = 4");
    clReleaseMemObject(cu);
  }
}

static void test_unsupported_head_dim(void **state) {
  const int dims[] = {12, 584, 4, 260, 100, 1000};
  size_t i;
  char what[64];
  (void)state;
  for (i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    /* FX_N x FX_H x 64 elements are available: use seqlen 1, 1 head and a head_dim
     * that fits (1000 needs 1000 of the 2048 elements). */
    flashcl_tensor q = *FQ, k = *FK, v = *FV, o = *FO, l = *FL;
    int64_t d = dims[i];
    flashcl_tensor *ts[4];
    int j;
    ts[0] = &q, ts[1] = &k, ts[2] = &v, ts[3] = &o;
    for (j = 0; j < 4; j++) {
      ts[j]->shape[1] = 1, ts[j]->shape[2] = 1, ts[j]->shape[3] = d;
      ts[j]->stride[2] = d, ts[j]->stride[1] = d, ts[j]->stride[0] = d;
    }
    l.shape[1] = 1, l.shape[2] = 1;
    snprintf(what, sizeof what, "head_dim %d", dims[i]);
    EXPECT(FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM, FD, &q, &k, &v, &o, &l, what);
  }
}

static void test_dtype_mismatch(void **state) {
  flashcl_tensor q, k, v, o, l;
  (void)state;
  k = *FK;
  k.dtype = FLASHCL_F16;
  EXPECT(FLASHCL_ERROR_DTYPE_MISMATCH, FD, FQ, &k, FV, FO, FL, "q f32, k f16");
  v = *FV;
  v.dtype = FLASHCL_BF16;
  EXPECT(FLASHCL_ERROR_DTYPE_MISMATCH, FD, FQ, FK, &v, FO, FL, "q f32, v bf16");
  o = *FO;
  o.dtype = FLASHCL_F16;
  EXPECT(FLASHCL_ERROR_DTYPE_MISMATCH, FD, FQ, FK, FV, &o, FL, "q f32, o f16");
  q = *FQ, k = *FK, v = *FV, o = *FO;
  q.dtype = k.dtype = v.dtype = FLASHCL_F16;
  o.dtype = FLASHCL_BF16;
  EXPECT(FLASHCL_ERROR_DTYPE_MISMATCH, FD, &q, &k, &v, &o, FL, "q/k/v f16, o bf16");
  o.dtype = FLASHCL_F32;
  EXPECT(FLASHCL_ERROR_DTYPE_MISMATCH, FD, &q, &k, &v, &o, FL, "q/k/v f16, o f32");
  l = *FL;
  l.dtype = FLASHCL_F16;
  EXPECT(FLASHCL_ERROR_DTYPE_MISMATCH, FD, FQ, FK, FV, FO, &l, "lse f16 (must be f32)");
  {
    /* Unknown dtype everywhere: INVALID_ARGUMENT (fcl_check_tensor rejects q's
     * dtype before any dtype comparison). */
    q = *FQ, k = *FK, v = *FV, o = *FO;
    q.dtype = k.dtype = v.dtype = o.dtype = (flashcl_dtype)9;
    EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, &q, &k, &v, &o, FL, "dtype 9 (unknown)");
  }
}

static void test_invalid_stride(void **state) {
  flashcl_tensor q, k, o;
  fct_tensor wide;
  int64_t shape[4] = {FX_B, FX_N, FX_H, FX_D}, stride[4] = {FX_N * FX_H * FX_D * 2, FX_H * FX_D * 2, FX_D * 2, 2};
  (void)state;
  /* head_dim stride 2 in a buffer big enough for it. */
  fct_tensor_create_custom(&wide, FLASHCL_F32, (size_t)(FX_B * FX_N * FX_H * FX_D) * 2 * 4, 0, shape, stride);
  {
    const int ok[1] = {FLASHCL_ERROR_INVALID_STRIDE};
    expect_codes(fct_env_get()->ctx, FD, &wide.t, FK, FV, FO, FL, &wide, 0, NULL, ok, 1, "q head_dim stride 2");
    expect_codes(fct_env_get()->ctx, FD, FQ, FK, FV, &wide.t, FL, &wide, 0, NULL, ok, 1, "o head_dim stride 2");
  }
  fct_tensor_release(&wide);
  k = *FK;
  k.stride[3] = 0;
  EXPECT(FLASHCL_ERROR_INVALID_STRIDE, FD, FQ, &k, FV, FO, FL, "k head_dim stride 0");
  o = *FO;
  o.stride[3] = -1;
  EXPECT(FLASHCL_ERROR_INVALID_STRIDE, FD, FQ, FK, FV, &o, FL, "o head_dim stride -1");
  q = *FQ;
  q.stride[1] = -(int64_t)FX_H * FX_D;
  q.offset = (size_t)(FX_N - 1) * FX_H * FX_D * 4; /* would stay in bounds if negative strides were legal */
  EXPECT(FLASHCL_ERROR_INVALID_STRIDE, FD, &q, FK, FV, FO, FL, "q seqlen stride negative");
  k = *FK;
  k.stride[2] = -1;
  EXPECT(FLASHCL_ERROR_INVALID_STRIDE, FD, FQ, &k, FV, FO, FL, "k heads stride -1");
}

/* Outputs that other work-items read, or that name one element twice. */
static void test_output_overlap(void **state) {
  fct_tensor qo, packed;
  flashcl_tensor o, lse;
  fct_rng rng;
  (void)state;
  fct_rng_init(&rng, "errors-overlap");
  /* o with batch and seqlen strides 0: every row would land on the same one. */
  o = *FO;
  o.stride[0] = o.stride[1] = 0;
  EXPECT(FLASHCL_ERROR_INVALID_STRIDE, FD, FQ, FK, FV, &o, FL, "o with zero batch/seqlen strides");
  /* head stride smaller than the head: two heads share elements. */
  o = *FO;
  o.stride[2] = FX_D / 2;
  EXPECT(FLASHCL_ERROR_INVALID_STRIDE, FD, FQ, FK, FV, &o, FL, "o heads overlapping each other");
  /* o is the very buffer and view of q. */
  fct_tensor_create(&qo, FLASHCL_F32, FCT_BNHD, FX_B, FX_N, FX_H, FX_D, 0);
  fct_tensor_fill_random(&qo, &rng);
  {
    const int ok[1] = {FLASHCL_ERROR_INVALID_ARGUMENT};
    expect_codes(fct_env_get()->ctx, FD, &qo.t, FK, FV, &qo.t, FL, &qo, 0, NULL, ok, 1, "o == q");
  }
  fct_tensor_release(&qo);
  /* lse inside o's buffer. */
  lse = *FL;
  lse.buffer = FO->buffer;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, FQ, FK, FV, FO, &lse, "lse inside o");
  /* Interleaved views of one buffer are fine: q and o as the two halves of a
   * packed [B][N][2][H][D] buffer give exactly the o of separate buffers. */
  {
    const int64_t shape[4] = {FX_B, FX_N, FX_H, FX_D};
    const int64_t stride[4] = {FX_N * 2 * FX_H * FX_D, 2 * FX_H * FX_D, FX_D, 1};
    const size_t bytes = (size_t)FX_B * FX_N * 2 * FX_H * FX_D * 4;
    flashcl_tensor po;
    flashcl_status st;
    size_t bad = 0;
    fct_tensor_create_custom(&packed, FLASHCL_F32, bytes, 0, shape, stride);
    fct_tensor_fill_random(&packed, &rng); /* q's half random, o's half NaN */
    fct_tensor_poison(&g_fx.o);
    st = flashcl_attention_forward(fct_env_get()->ctx, FD, &packed.t, FK, FV, FO, NULL, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "forward from the packed q into a separate o");
    po = packed.t;
    po.offset = (size_t)FX_H * FX_D * 4;
    st = flashcl_attention_forward(fct_env_get()->ctx, FD, &packed.t, FK, FV, &po, NULL, 0, NULL, NULL);
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "forward into the other half of q's packed buffer");
    fct_finish();
    fct_tensor_download(&g_fx.o);
    fct_tensor_download(&packed);
    for (int b = 0; b < FX_B; b++)
      for (int n = 0; n < FX_N; n++)
        for (int h = 0; h < FX_H; h++)
          for (int x = 0; x < FX_D; x++) {
            const float *pf = (const float *)packed.host;
            const size_t i = po.offset / 4 + (size_t)b * stride[0] + (size_t)n * stride[1] + (size_t)h * stride[2] + x;
            const double want = fct_tensor_get(&g_fx.o, b, n, h, x);
            if (!(pf[i] == want) || !isfinite(want)) bad++;
          }
    FCT_CHECK(bad == 0, "packed o: %zu elements differ from the separate o (or are not finite)", bad);
    fct_tensor_release(&packed);
  }
}

/* cl_mem objects that are not buffers of the context's cl_context, and buffers
 * the descriptor names that share bytes with an output. */
static void test_foreign_and_aux_buffers(void **state) {
  fct_env *env = fct_env_get();
  flashcl_tensor q;
  flashcl_attention_desc desc;
  cl_int err;
  (void)state;
  /* A buffer of another cl_context on the same device. */
  cl_context other = clCreateContext(NULL, 1, &env->device, NULL, NULL, &err);
  FCT_CHECK(err == CL_SUCCESS, "clCreateContext: %d", (int)err);
  cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, FQ->shape[1] * FQ->stride[1] * 4, NULL, &err);
  FCT_CHECK(err == CL_SUCCESS, "clCreateBuffer in the other context: %d", (int)err);
  q = *FQ;
  q.buffer = foreign;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, &q, FK, FV, FO, FL, "q from another cl_context");
  FCT_CHECK(strstr(flashcl_context_last_error(env->ctx), "another cl_context") != NULL,
            "the message should name the other context: %s", flashcl_context_last_error(env->ctx));
  clReleaseMemObject(foreign);
  clReleaseContext(other);
  /* An image where a buffer belongs, where the device has images. */
  {
    cl_bool images = CL_FALSE;
    clGetDeviceInfo(env->device, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL);
    if (images) {
      const cl_image_format fmt = {CL_RGBA, CL_FLOAT};
      cl_image_desc idesc;
      memset(&idesc, 0, sizeof idesc);
      idesc.image_type = CL_MEM_OBJECT_IMAGE2D;
      idesc.image_width = 64;
      idesc.image_height = 64;
      cl_mem img = clCreateImage(env->cl_ctx, CL_MEM_READ_WRITE, &fmt, &idesc, NULL, &err);
      if (err == CL_SUCCESS) {
        q = *FQ;
        q.buffer = img;
        EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, FD, &q, FK, FV, FO, FL, "q as an image");
        clReleaseMemObject(img);
      } else {
        print_message("    (no image: clCreateImage gave %d)\n", (int)err);
      }
    }
  }
  /* ALiBi slopes read from the start of o's buffer, which the call writes. */
  desc = *FD;
  desc.score.alibi_slopes = FO->buffer;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, &desc, FQ, FK, FV, FO, FL, "alibi_slopes inside o");
  /* The kernel-family query runs the forward's output rules too. */
  {
    flashcl_kernel_family fam = (flashcl_kernel_family)77;
    flashcl_status st = flashcl_attention_kernel_family(env->ctx, FD, FQ, FK, FV, FQ, FLASHCL_PASS_FORWARD, &fam);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_ARGUMENT, "kernel_family with o == q");
    FCT_CHECK(fam == (flashcl_kernel_family)77, "kernel_family wrote its output on failure");
  }
}

static void test_overflow(void **state) {
  flashcl_tensor q, k, v, o, l;
  flashcl_tensor *ts[4];
  int j;
  (void)state;
  /* Every dimension fits in int32 but the element count (2^66) overflows 64 bits. */
  q = *FQ, k = *FK, v = *FV, o = *FO, l = *FL;
  ts[0] = &q, ts[1] = &k, ts[2] = &v, ts[3] = &o;
  for (j = 0; j < 4; j++) {
    ts[j]->shape[0] = ts[j]->shape[1] = ts[j]->shape[2] = (int64_t)1 << 20;
    ts[j]->shape[3] = 64;
    ts[j]->stride[3] = 1, ts[j]->stride[2] = 64, ts[j]->stride[1] = (int64_t)64 << 20,
    ts[j]->stride[0] = (int64_t)64 << 40;
  }
  l.shape[0] = l.shape[1] = l.shape[2] = (int64_t)1 << 20;
  l.stride[1] = 1, l.stride[2] = (int64_t)1 << 20, l.stride[0] = (int64_t)1 << 40;
  EXPECT(FLASHCL_ERROR_OVERFLOW, FD, &q, &k, &v, &o, &l, "B = N = H = 2^20, d = 64 (2^66 elements)");

  /* A huge stride on one tensor. */
  q = *FQ;
  q.shape[0] = 8;
  q.stride[0] = INT64_MAX / 4;
  o = *FO, l = *FL;
  o.shape[0] = l.shape[0] = 8;
  o.stride[0] = l.stride[0] = 0;
  k = *FK, v = *FV;
  k.shape[0] = v.shape[0] = 8;
  k.stride[0] = v.stride[0] = 0;
  EXPECT(FLASHCL_ERROR_OVERFLOW, FD, &q, &k, &v, &o, &l, "q batch stride INT64_MAX/4 with batch 8");

  /* An offset near SIZE_MAX (a multiple of 8). */
  o = *FO;
  o.offset = (size_t)-1 - 7;
  EXPECT(FLASHCL_ERROR_OVERFLOW, FD, FQ, FK, FV, &o, FL, "o offset SIZE_MAX - 7");

  /* seqlen 2^40: fits size_t, but no kernel indexes that far: OVERFLOW
   * (fcl_check_tensor: a dimension past the int32 range). */
  {
    q = *FQ, k = *FK, v = *FV, o = *FO, l = *FL;
    q.shape[1] = k.shape[1] = v.shape[1] = o.shape[1] = l.shape[1] = (int64_t)1 << 40;
    q.stride[1] = k.stride[1] = v.stride[1] = o.stride[1] = l.stride[1] = 0; /* all rows alias row 0 */
    EXPECT(FLASHCL_ERROR_OVERFLOW, FD, &q, &k, &v, &o, &l, "seqlen 2^40 (stride 0)");
  }

  /* The tensor helpers: strides past INT64_MAX are OVERFLOW, and *t is left as
   * it was (the products are checked before anything is written). */
  {
    flashcl_tensor t0, t1;
    memset(&t0, 0xab, sizeof t0);
    t1 = t0;
    FCT_CHECK_STATUS(flashcl_tensor_init_bnhd(&t1, FQ->buffer, 0, FLASHCL_F32, 2, INT64_MAX / 2, 4, 64),
                     FLASHCL_ERROR_OVERFLOW, "init_bnhd with seqlen INT64_MAX / 2");
    FCT_CHECK(memcmp(&t0, &t1, sizeof t0) == 0, "init_bnhd wrote the tensor on failure");
    FCT_CHECK_STATUS(flashcl_tensor_init_bhnd(&t1, FQ->buffer, 0, FLASHCL_F32, 2, 4, INT64_MAX / 2, 64),
                     FLASHCL_ERROR_OVERFLOW, "init_bhnd with heads INT64_MAX / 2");
    FCT_CHECK(memcmp(&t0, &t1, sizeof t0) == 0, "init_bhnd wrote the tensor on failure");
    FCT_CHECK_STATUS(flashcl_tensor_init_lse(&t1, FQ->buffer, 0, 2, INT64_MAX / 2, 4), FLASHCL_ERROR_OVERFLOW,
                     "init_lse with seqlen INT64_MAX / 2");
    FCT_CHECK(memcmp(&t0, &t1, sizeof t0) == 0, "init_lse wrote the tensor on failure");
  }
}

static void test_bad_desc_values(void **state) {
  flashcl_attention_desc d;
  const int bad_blocks[][2] = {{12, 0}, {0, 20}, {-8, 0}, {0, -16}, {4, 4}};
  size_t i;
  char what[96];
  (void)state;
  for (i = 0; i < sizeof bad_blocks / sizeof bad_blocks[0]; i++) {
    d = *FD;
    d.algorithm.block_r = bad_blocks[i][0], d.algorithm.block_c = bad_blocks[i][1];
    snprintf(what, sizeof what, "block_r = %d, block_c = %d", d.algorithm.block_r, d.algorithm.block_c);
    EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, &d, FQ, FK, FV, FO, FL, what);
  }
  d = *FD;
  d.algorithm.algo = (flashcl_algo)7;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, &d, FQ, FK, FV, FO, FL, "algo = 7");
  d = *FD;
  d.algorithm.kernel = (flashcl_kernel_family)9;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, &d, FQ, FK, FV, FO, FL, "kernel = 9");
  d = *FD;
  d.score.scale = NAN;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, &d, FQ, FK, FV, FO, FL, "scale = NaN");
  d.score.scale = INFINITY;
  EXPECT(FLASHCL_ERROR_INVALID_ARGUMENT, &d, FQ, FK, FV, FO, FL, "scale = inf");
}

/* After all those failures the context still works and gives right answers. */
static void test_context_usable_after_errors(void **state) {
  fct_case c;
  fct_run run;
  (void)state;
  memset(&c, 0, sizeof c);
  memset(&run, 0, sizeof run);
  c.dtype = FLASHCL_F32, c.batch = FX_B, c.seqlen_q = c.seqlen_k = FX_N, c.heads_q = c.heads_kv = FX_H,
  c.head_dim = FX_D;
  fct_check_case(&c, &run);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixture_is_valid),
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_invalid_shapes),
      cmocka_unit_test(test_buffer_too_small),
      cmocka_unit_test(test_unsupported_head_dim),
      cmocka_unit_test(test_dtype_mismatch),
      cmocka_unit_test(test_invalid_stride),
      cmocka_unit_test(test_output_overlap),
      cmocka_unit_test(test_foreign_and_aux_buffers),
      cmocka_unit_test(test_overflow),
      cmocka_unit_test(test_bad_desc_values),
      cmocka_unit_test(test_context_usable_after_errors),
  };
  const char *filter = getenv("FLASHCL_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  print_message("[ SEED     ] FLASHCL_TEST_SEED=%llu\n", (unsigned long long)fct_seed());
  return _cmocka_run_group_tests("errors", tests, sizeof tests / sizeof tests[0], group_setup, group_teardown);
}
