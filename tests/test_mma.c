/*
 * NVIDIA tensor-core forward (FLASHCL_KERNEL_NVIDIA_MMA, cl/flash_fwd_mma.cl).
 *
 * On a device without the path (PoCL, other vendors, NVIDIA below compute
 * capability 8.0) an explicit request must fail with FLASHCL_ERROR_UNSUPPORTED
 * and a reason, while AUTO keeps working; the accuracy tests then skip. On a
 * device with it, fp16/bf16 outputs and LSE are compared with a double-precision
 * reference over causal, GQA, varlen, ragged N, strided and offset layouts, and
 * the problems it does not cover (d = 96, unaligned rows) fall back cleanly.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "flashcl.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct {
  const char *name;
  int B, Nq, Nk, Hq, Hkv, d, causal;
  int layout; /* 0 bnhd, 1 bhnd, 2 bnhd with padded seq stride */
  int off;    /* extra element offset */
  int varlen, dtype;
  float scale;
} tcase;

static uint16_t f2h(float f) {
  uint32_t x; memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000; int e = (int)((x >> 23) & 0xff) - 127 + 15; uint32_t m = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return sign | 0x7c00 | (m ? 0x200 : 0);
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    m |= 0x800000;
    int sh = 14 - e;
    uint32_t h = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return sign | h;
  }
  uint32_t h = (e << 10) | (m >> 13); uint32_t rem = m & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return sign | h;
}
static float h2f(uint16_t h) {
  uint32_t s = (h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
  if (e == 0) { if (!m) x = s; else { int k = -1; do { m <<= 1; k++; } while (!(m & 0x400)); x = s | ((uint32_t)(127 - 15 - k) << 23) | ((m & 0x3ff) << 13); } }
  else if (e == 31) x = s | 0x7f800000 | (m << 13);
  else x = s | ((e + 112) << 23) | (m << 13);
  float f; memcpy(&f, &x, 4); return f;
}
static uint16_t f2b(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
static float b2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

static flashcl_context *ctx;
static cl_context cc;
static cl_command_queue cq;


/* reference on logical arrays [B][N][H][d] */
static void ref(const float *q, const float *k, const float *v, double *o, double *lse, int Nq, int Nk, int Hq, int Hkv,
                int d, int causal, double scale, int qrow0, int krow0, int totq, int totk, int bq) {
  int G = Hq / Hkv; double *s = malloc(sizeof(double) * (Nk + 1));
  for (int h = 0; h < Hq; h++) for (int i = 0; i < Nq; i++) {
    double m = -INFINITY;
    const float *qi = q + (((size_t)bq * totq + qrow0 + i) * Hq + h) * d;
    for (int j = 0; j < Nk; j++) {
      if (causal && j > i + Nk - Nq) { s[j] = -INFINITY; continue; }
      const float *kj = k + (((size_t)bq * totk + krow0 + j) * Hkv + h / G) * d;
      double a = 0; for (int x = 0; x < d; x++) a += (double)qi[x] * kj[x];
      s[j] = a * scale; if (s[j] > m) m = s[j];
    }
    double l = 0; for (int j = 0; j < Nk; j++) { s[j] = s[j] == -INFINITY ? 0 : exp(s[j] - m); l += s[j]; }
    double *oi = o + (((size_t)bq * totq + qrow0 + i) * Hq + h) * d;
    for (int x = 0; x < d; x++) { double a = 0; for (int j = 0; j < Nk; j++) a += s[j] * v[(((size_t)bq * totk + krow0 + j) * Hkv + h / G) * d + x]; oi[x] = l > 0 ? a / l : 0; }
    lse[((size_t)bq * Hq + h) * totq + qrow0 + i] = l > 0 ? m + log(l) : -INFINITY;
  }
  free(s);
}

/* place logical [B][N][H][d] into a device buffer with the layout; returns tensor */
static cl_mem upload(const float *x, int B, int N, int H, int d, int layout, int off, int dtype, flashcl_tensor *t) {
  int64_t st[4];
  if (layout == 1) { st[3] = 1; st[1] = d; st[2] = (int64_t)N * d; st[0] = (int64_t)H * N * d; }
  else { st[3] = 1; st[2] = d; st[1] = (int64_t)H * d + (layout == 2 ? 8 : 0); st[0] = st[1] * N; }
  size_t n = off + (size_t)st[0] * B;
  uint16_t *h = calloc(n, 2);
  for (int b = 0; b < B; b++) for (int i = 0; i < N; i++) for (int hh = 0; hh < H; hh++) for (int c = 0; c < d; c++) {
    float f = x[(((size_t)b * N + i) * H + hh) * d + c];
    h[off + b * st[0] + i * st[1] + hh * st[2] + c] = dtype == 2 ? f2b(f) : f2h(f);
  }
  cl_int e; cl_mem m = clCreateBuffer(cc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * 2, h, &e);
  free(h);
  t->buffer = m; t->offset = (size_t)off * 2; t->dtype = dtype; t->shape[0] = B; t->shape[1] = N; t->shape[2] = H; t->shape[3] = d;
  memcpy(t->stride, st, sizeof st);
  return m;
}
static void download(const flashcl_tensor *t, float *x) {
  int B = t->shape[0], N = t->shape[1], H = t->shape[2], d = t->shape[3];
  size_t n = t->offset / 2 + (size_t)t->stride[0] * B;
  uint16_t *h = malloc(n * 2);
  clEnqueueReadBuffer(cq, t->buffer, CL_TRUE, 0, n * 2, h, 0, NULL, NULL);
  for (int b = 0; b < B; b++) for (int i = 0; i < N; i++) for (int hh = 0; hh < H; hh++) for (int c = 0; c < d; c++) {
    uint16_t u = h[t->offset / 2 + b * t->stride[0] + i * t->stride[1] + hh * t->stride[2] + c];
    x[(((size_t)b * N + i) * H + hh) * d + c] = t->dtype == 2 ? b2f(u) : h2f(u);
  }
  free(h);
}


static uint32_t rng_state = 12345u;
static float rnd(void) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return (float)((rng_state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static int mma_available;

static int setup(void **state) {
  (void)state;
  flashcl_context_options op;
  flashcl_context_options_init(&op);
  op.verbose = getenv("FLASHCL_TEST_VERBOSE") != NULL;
  if (flashcl_context_create(&op, &ctx) != FLASHCL_SUCCESS) return -1;
  cc = flashcl_context_cl_context(ctx);
  cq = flashcl_context_cl_queue(ctx);
  return 0;
}
static int teardown(void **state) {
  (void)state;
  flashcl_context_destroy(ctx);
  return 0;
}

/* Runs one case with desc.kernel = kernel; returns the flashcl status, and the
 * relative L2 error of O and max |LSE error| against the reference. */
static int run_case(const tcase *tc, flashcl_kernel_family kernel, double *rel, double *lerr, int *bad) {
  int B = tc->B, Nq = tc->Nq, Nk = tc->Nk, Hq = tc->Hq, Hkv = tc->Hkv, d = tc->d;
  int nseq = B, lq[4], lk[4], cq_[5] = {0}, ck_[5] = {0};
  int TB = B, TNq = Nq, TNk = Nk;
  if (tc->varlen) {
    int LQ[4] = {Nq, 1, Nq / 2 + 3, 17}, LK[4] = {Nk, Nk / 3 + 1, 5, Nk};
    nseq = 4;
    for (int s = 0; s < nseq; s++) {
      lq[s] = LQ[s];
      lk[s] = LK[s];
      cq_[s + 1] = cq_[s] + lq[s];
      ck_[s + 1] = ck_[s] + lk[s];
    }
    TB = 1;
    TNq = cq_[nseq];
    TNk = ck_[nseq];
  }
  size_t nq = (size_t)TB * TNq * Hq * d, nk = (size_t)TB * TNk * Hkv * d, nl = (size_t)TB * TNq * Hq;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *o = malloc(nq * 4), *lse = malloc(nl * 4);
  double *ro = calloc(nq, 8), *rl = calloc(nl, 8);
  assert_non_null(q); assert_non_null(k); assert_non_null(v); assert_non_null(o); assert_non_null(lse);
  assert_non_null(ro); assert_non_null(rl);
  float (*cv)(uint16_t) = tc->dtype == 2 ? b2f : h2f;
  uint16_t (*cf)(float) = tc->dtype == 2 ? f2b : f2h;
  for (size_t i = 0; i < nq; i++) q[i] = cv(cf(2 * rnd()));
  for (size_t i = 0; i < nk; i++) {
    k[i] = cv(cf(2 * rnd()));
    v[i] = cv(cf(rnd()));
  }
  flashcl_tensor tq, tk, tv, to, tl;
  cl_mem mq = upload(q, TB, TNq, Hq, d, tc->layout, tc->off, tc->dtype, &tq);
  cl_mem mk = upload(k, TB, TNk, Hkv, d, tc->layout, tc->off, tc->dtype, &tk);
  cl_mem mv = upload(v, TB, TNk, Hkv, d, tc->layout, tc->off, tc->dtype, &tv);
  cl_mem mo = upload(q, TB, TNq, Hq, d, tc->layout, tc->off, tc->dtype, &to);
  cl_int e;
  cl_mem ml = clCreateBuffer(cc, CL_MEM_READ_WRITE, nl * 4, NULL, &e);
  flashcl_tensor_init_lse(&tl, ml, 0, TB, TNq, Hq);
  flashcl_attention_desc desc;
  flashcl_attention_desc_init(&desc);
  desc.causal = tc->causal;
  desc.scale = tc->scale;
  desc.kernel = kernel;
  cl_mem mcq = NULL, mck = NULL;
  if (tc->varlen) {
    mcq = clCreateBuffer(cc, CL_MEM_COPY_HOST_PTR, sizeof(int) * (nseq + 1), cq_, &e);
    mck = clCreateBuffer(cc, CL_MEM_COPY_HOST_PTR, sizeof(int) * (nseq + 1), ck_, &e);
    desc.cu_seqlens_q = mcq;
    desc.cu_seqlens_k = mck;
    desc.num_seqs = nseq;
    for (int s = 0; s < nseq; s++) {
      if (lq[s] > desc.max_seqlen_q) desc.max_seqlen_q = lq[s];
      if (lk[s] > desc.max_seqlen_k) desc.max_seqlen_k = lk[s];
    }
  }
  double scale = tc->scale ? tc->scale : 1 / sqrt(d);
  if (tc->varlen)
    for (int s = 0; s < nseq; s++)
      ref(q, k, v, ro, rl, lq[s], lk[s], Hq, Hkv, d, tc->causal, scale, cq_[s], ck_[s], TNq, TNk, 0);
  else
    for (int b = 0; b < B; b++) ref(q, k, v, ro, rl, Nq, Nk, Hq, Hkv, d, tc->causal, scale, 0, 0, Nq, Nk, b);
  int st = flashcl_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, &tl, 0, NULL, NULL);
  if (st == FLASHCL_SUCCESS) {
    clFinish(cq);
    download(&to, o);
    clEnqueueReadBuffer(cq, ml, CL_TRUE, 0, nl * 4, lse, 0, NULL, NULL);
    double num = 0, den = 0;
    *lerr = 0;
    *bad = 0;
    for (size_t i = 0; i < nq; i++) {
      double dd = o[i] - ro[i];
      num += dd * dd;
      den += ro[i] * ro[i];
      if (isnan(o[i])) (*bad)++;
    }
    for (size_t i = 0; i < nl; i++) {
      if (isinf(rl[i])) {
        if (!(isinf(lse[i]) && lse[i] < 0)) (*bad)++;
        continue;
      }
      double dd = fabs(lse[i] - rl[i]);
      if (!(dd <= *lerr)) *lerr = dd;
    }
    *rel = sqrt(num / (den + 1e-300));
  }
  clReleaseMemObject(mq);
  clReleaseMemObject(mk);
  clReleaseMemObject(mv);
  clReleaseMemObject(mo);
  clReleaseMemObject(ml);
  if (mcq) clReleaseMemObject(mcq);
  if (mck) clReleaseMemObject(mck);
  free(q); free(k); free(v); free(o); free(lse); free(ro); free(rl);
  return st;
}

static const tcase small_case = {"d64 N64", 1, 64, 64, 2, 2, 64, 0, 0, 0, 0, 1, 0};

/* Explicit request: works where the path exists, else UNSUPPORTED with a reason; AUTO always works. */
static void test_selection(void **state) {
  (void)state;
  double rel = 0, lerr = 0;
  int bad = 0;
  int st = run_case(&small_case, FLASHCL_KERNEL_NVIDIA_MMA, &rel, &lerr, &bad);
  if (st == FLASHCL_SUCCESS) {
    mma_available = 1;
  } else {
    assert_int_equal(st, FLASHCL_ERROR_UNSUPPORTED);
    const char *msg = flashcl_context_last_error(ctx);
    if (!strstr(msg, "tensor-core")) fail_msg("last error does not give the reason: \"%s\"", msg);
    mma_available = 0;
  }
  assert_int_equal(run_case(&small_case, FLASHCL_KERNEL_AUTO, &rel, &lerr, &bad), FLASHCL_SUCCESS);
  assert_true(rel < 3e-3 && lerr < 1e-2 && bad == 0);
  assert_int_equal(run_case(&small_case, FLASHCL_KERNEL_PORTABLE, &rel, &lerr, &bad), FLASHCL_SUCCESS);
  assert_true(rel < 3e-3 && lerr < 1e-2 && bad == 0);
}

static void test_accuracy(void **state) {
  (void)state;
  if (!mma_available) {
    skip();
    return;
  }
  static const tcase cs[] = {
      {"d64 N128 fp16", 2, 128, 128, 4, 4, 64, 0, 0, 0, 0, 1, 0},
      {"d128 N256 fp16", 1, 256, 256, 2, 2, 128, 0, 0, 0, 0, 1, 0},
      {"d64 N200/333 causal gqa", 2, 200, 333, 4, 2, 64, 1, 0, 0, 0, 1, 0},
      {"d128 N333/200 causal mqa", 2, 333, 200, 4, 1, 128, 1, 0, 0, 0, 1, 0},
      {"d128 N77 causal", 1, 77, 77, 2, 2, 128, 1, 0, 0, 0, 1, 0},
      {"d64 N1/517", 2, 1, 517, 2, 2, 64, 0, 0, 0, 0, 1, 0},
      {"d64 N517/1 causal", 1, 517, 1, 2, 2, 64, 1, 0, 0, 0, 1, 0},
      {"d128 bhnd offset 8", 2, 190, 190, 3, 3, 128, 1, 1, 8, 0, 1, 0},
      {"d64 padded stride", 2, 100, 300, 2, 2, 64, 0, 2, 0, 0, 1, 0},
      {"d64 offset 4 (portable fallback)", 1, 64, 64, 2, 2, 64, 0, 0, 4, 0, 1, 0},
      {"d64 varlen causal", 1, 150, 210, 4, 2, 64, 1, 0, 0, 1, 1, 0},
      {"d128 varlen", 1, 150, 210, 2, 2, 128, 0, 0, 0, 1, 1, 0},
      {"d128 scale 0.3", 1, 300, 300, 2, 2, 128, 0, 0, 0, 0, 1, 0.3f},
      {"d64 bf16 causal", 2, 200, 200, 2, 2, 64, 1, 0, 0, 0, 2, 0},
      {"d128 bf16", 1, 300, 257, 2, 1, 128, 0, 0, 0, 0, 2, 0},
      {"d96 (portable fallback)", 1, 100, 100, 2, 2, 96, 0, 0, 0, 0, 1, 0},
      {"d128 N1024 causal", 1, 1024, 1024, 2, 2, 128, 1, 0, 0, 0, 1, 0},
  };
  int fails = 0;
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    double rel = 0, lerr = 0;
    int bad = 0;
    int st = run_case(&cs[i], FLASHCL_KERNEL_NVIDIA_MMA, &rel, &lerr, &bad);
    double tol = cs[i].dtype == 2 ? 2e-2 : 3e-3;
    int ok = st == FLASHCL_SUCCESS && rel < tol && lerr < 1e-2 && !bad;
    if (!ok) {
      fails++;
      print_error("%s: status %s, relL2(O) %.3g, max |LSE err| %.3g, bad %d %s\n", cs[i].name,
                  flashcl_status_string(st), rel, lerr, bad, st ? flashcl_context_last_error(ctx) : "");
    }
  }
  assert_int_equal(fails, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_selection),
      cmocka_unit_test(test_accuracy),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
