/*
 * NVIDIA tensor-core forward (FLASHCL_KERNEL_NVIDIA_MMA, cl/nvidia/flash_fwd_mma.cl).
 *
 * On a device without the path (PoCL, other vendors, NVIDIA below compute
 * capability 8.0) an explicit request must fail with FLASHCL_ERROR_UNSUPPORTED
 * and a reason, while AUTO keeps working; the accuracy tests then skip. On an
 * NVIDIA device of compute capability >= 8.0 the path being unavailable fails. On a
 * device with it, fp16/bf16 outputs and LSE are compared with a double-precision
 * reference over head dims 8 to 256, causal, GQA, varlen, ragged N, strided and
 * offset layouts (odd multiples of 8 included, padded in local memory), and
 * the problems it does not cover (unaligned rows) fall back cleanly.
 *
 * Inputs are fresh every run (FLASHCL_TEST_SEED, printed). O and LSE buffers are
 * NaN-filled before each call, and every O element outside the tensor (offset,
 * row padding) must still be NaN afterwards. Tolerances are the suite's
 * (common.h): relative L2 of O 2e-3 (fp16) / 1e-2 (bf16), of LSE 1e-4.
 * Large-score cases (scale 1, keys growing along the sequence) make the
 * kernel's running max grow by more than its lazy-rescale threshold at many
 * tiles, and by less at others.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "common.h"
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
  float ramp; /* key j is scaled by 1 + ramp * j / Nk: scores grow along the keys */
} tcase;

static uint16_t to_bits(int dtype, float f) { return dtype == 2 ? fct_f32_to_bf16(f) : fct_f32_to_f16(f); }
static float from_bits(int dtype, uint16_t u) { return dtype == 2 ? fct_bf16_to_f32(u) : fct_f16_to_f32(u); }
static uint16_t nan_bits(int dtype) { return dtype == 2 ? 0x7fc0 : 0x7e00; }

static flashcl_context *ctx;
static flashcl_kernel_family last_family; /* the family run_case's call ran (kernel_family) */
static char last_kernel[64];              /* and its kernel (flashcl_attention_config) */
static int hopper_fwd; /* the small case ran flash_fwd_wgmma: so must the padded head dims */
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

/* Places logical [B][N][H][d] into a device buffer with the layout; with x =
 * NULL every element of the buffer (padding included) is NaN. */
static cl_mem upload(const float *x, int B, int N, int H, int d, int layout, int off, int dtype, flashcl_tensor *t) {
  int64_t st[4];
  if (layout == 1) { st[3] = 1; st[1] = d; st[2] = (int64_t)N * d; st[0] = (int64_t)H * N * d; }
  else { st[3] = 1; st[2] = d; st[1] = (int64_t)H * d + (layout == 2 ? 8 : 0); st[0] = st[1] * N; }
  size_t n = off + (size_t)st[0] * B;
  uint16_t *h = malloc(n * 2);
  assert_non_null(h);
  for (size_t i = 0; i < n; i++) h[i] = x ? 0 : nan_bits(dtype);
  if (x)
    for (int b = 0; b < B; b++) for (int i = 0; i < N; i++) for (int hh = 0; hh < H; hh++) for (int c = 0; c < d; c++)
      h[off + b * st[0] + i * st[1] + hh * st[2] + c] = to_bits(dtype, x[(((size_t)b * N + i) * H + hh) * d + c]);
  cl_int e; cl_mem m = clCreateBuffer(cc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * 2, h, &e);
  free(h);
  assert_true(m && e == CL_SUCCESS);
  t->buffer = m; t->offset = (size_t)off * 2; t->dtype = dtype; t->shape[0] = B; t->shape[1] = N; t->shape[2] = H; t->shape[3] = d;
  memcpy(t->stride, st, sizeof st);
  return m;
}
/* Reads the tensor back into logical [B][N][H][d]; returns how many buffer
 * elements outside the tensor are no longer NaN (the kernel wrote there). */
static size_t download(const flashcl_tensor *t, float *x) {
  int B = t->shape[0], N = t->shape[1], H = t->shape[2], d = t->shape[3];
  size_t n = t->offset / 2 + (size_t)t->stride[0] * B, stray = 0;
  uint16_t *h = malloc(n * 2);
  unsigned char *inside = calloc(n, 1);
  assert_non_null(h);
  assert_non_null(inside);
  clEnqueueReadBuffer(cq, t->buffer, CL_TRUE, 0, n * 2, h, 0, NULL, NULL);
  for (int b = 0; b < B; b++) for (int i = 0; i < N; i++) for (int hh = 0; hh < H; hh++) for (int c = 0; c < d; c++) {
    size_t at = t->offset / 2 + b * t->stride[0] + i * t->stride[1] + hh * t->stride[2] + c;
    inside[at] = 1;
    x[(((size_t)b * N + i) * H + hh) * d + c] = from_bits(t->dtype, h[at]);
  }
  for (size_t i = 0; i < n; i++)
    if (!inside[i] && h[i] != nan_bits(t->dtype)) stray++;
  free(h);
  free(inside);
  return stray;
}

static int mma_available;
static char mma_reason[512] = "test_selection did not run"; /* why it is not available */

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
 * relative L2 errors of O and LSE against the reference. *bad counts NaN in O,
 * LSE that should be -inf and is not (or the reverse), and O buffer elements
 * outside the tensor that were written. */
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
  /* Inputs are rounded to the dtype first, so the reference sees what the device sees. */
  fct_rng rng;
  char tag[160];
  snprintf(tag, sizeof tag, "%s/%d", tc->name, (int)kernel);
  fct_rng_init(&rng, tag);
  const flashcl_dtype dt = tc->dtype == 2 ? FLASHCL_BF16 : FLASHCL_F16;
  for (size_t i = 0; i < nq; i++) q[i] = fct_quantize(dt, (float)(4 * fct_rng_uniform(&rng) - 2));
  for (size_t i = 0; i < nk; i++) {
    const size_t row = i / ((size_t)Hkv * d) % TNk; /* key position (varlen: in the packed batch) */
    const float grow = 1.0f + tc->ramp * (float)row / (float)TNk;
    k[i] = fct_quantize(dt, grow * (float)(4 * fct_rng_uniform(&rng) - 2));
    v[i] = fct_quantize(dt, (float)(2 * fct_rng_uniform(&rng) - 1));
  }
  flashcl_tensor tq, tk, tv, to, tl;
  cl_mem mq = upload(q, TB, TNq, Hq, d, tc->layout, tc->off, tc->dtype, &tq);
  cl_mem mk = upload(k, TB, TNk, Hkv, d, tc->layout, tc->off, tc->dtype, &tk);
  cl_mem mv = upload(v, TB, TNk, Hkv, d, tc->layout, tc->off, tc->dtype, &tv);
  cl_mem mo = upload(NULL, TB, TNq, Hq, d, tc->layout, tc->off, tc->dtype, &to);
  for (size_t i = 0; i < nl; i++) lse[i] = NAN;
  cl_int e;
  cl_mem ml = clCreateBuffer(cc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, nl * 4, lse, &e);
  assert_true(ml && e == CL_SUCCESS);
  flashcl_tensor_init_lse(&tl, ml, 0, TB, TNq, Hq);
  flashcl_attention_desc desc;
  flashcl_attention_desc_init(&desc);
  desc.mask.causal = tc->causal;
  desc.score.scale = tc->scale;
  desc.algorithm.kernel = kernel;
  cl_mem mcq = NULL, mck = NULL;
  if (tc->varlen) {
    mcq = clCreateBuffer(cc, CL_MEM_COPY_HOST_PTR, sizeof(int) * (nseq + 1), cq_, &e);
    mck = clCreateBuffer(cc, CL_MEM_COPY_HOST_PTR, sizeof(int) * (nseq + 1), ck_, &e);
    desc.varlen.cu_seqlens_q = mcq;
    desc.varlen.cu_seqlens_k = mck;
    desc.varlen.num_seqs = nseq;
    for (int s = 0; s < nseq; s++) {
      if (lq[s] > desc.varlen.max_seqlen_q) desc.varlen.max_seqlen_q = lq[s];
      if (lk[s] > desc.varlen.max_seqlen_k) desc.varlen.max_seqlen_k = lk[s];
    }
  }
  double scale = tc->scale ? tc->scale : 1 / sqrt(d);
  if (tc->varlen)
    for (int s = 0; s < nseq; s++)
      ref(q, k, v, ro, rl, lq[s], lk[s], Hq, Hkv, d, tc->causal, scale, cq_[s], ck_[s], TNq, TNk, 0);
  else
    for (int b = 0; b < B; b++) ref(q, k, v, ro, rl, Nq, Nk, Hq, Hkv, d, tc->causal, scale, 0, 0, Nq, Nk, b);
  last_family = FLASHCL_KERNEL_AUTO;
  if (flashcl_attention_kernel_family(ctx, &desc, &tq, &tk, &tv, &to, FLASHCL_PASS_FORWARD, &last_family) !=
      FLASHCL_SUCCESS)
    last_family = FLASHCL_KERNEL_AUTO;
  flashcl_config cfg;
  snprintf(last_kernel, sizeof last_kernel, "%s",
           flashcl_attention_config(ctx, &desc, &tq, &tk, &tv, &to, FLASHCL_PASS_FORWARD, &cfg) == FLASHCL_SUCCESS
               ? cfg.kernel : "(config failed)");
  int st = flashcl_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, &tl, 0, NULL, NULL);
  if (st == FLASHCL_SUCCESS) {
    clFinish(cq);
    *bad = (int)download(&to, o);
    clEnqueueReadBuffer(cq, ml, CL_TRUE, 0, nl * 4, lse, 0, NULL, NULL);
    double num = 0, den = 0, lnum = 0, lden = 0;
    for (size_t i = 0; i < nq; i++) {
      double dd = o[i] - ro[i];
      num += dd * dd;
      den += ro[i] * ro[i];
      if (isnan(o[i])) (*bad)++;
    }
    for (size_t i = 0; i < nl; i++) {
      if (isinf(rl[i]) || isinf(lse[i])) {
        if (!(isinf(lse[i]) && lse[i] < 0 && isinf(rl[i]))) (*bad)++;
        continue;
      }
      if (isnan(lse[i])) (*bad)++;
      double dd = lse[i] - rl[i];
      lnum += dd * dd;
      lden += rl[i] * rl[i];
    }
    *rel = isnan(num) ? INFINITY : sqrt(num / (den + 1e-300));
    *lerr = isnan(lnum) ? INFINITY : sqrt(lnum / (lden + 1e-300));
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

static const tcase small_case = {"d64 N64", 1, 64, 64, 2, 2, 64, 0, 0, 0, 0, 1, 0, 0};

static int case_ok(const tcase *tc, double rel, double lerr, int bad) {
  const flashcl_dtype dt = tc->dtype == 2 ? FLASHCL_BF16 : FLASHCL_F16;
  return rel <= fct_tolerance(dt) && lerr <= fct_lse_tolerance(dt) && bad == 0;
}

/* Explicit request: works where the path exists, else UNSUPPORTED with a reason; AUTO always works. */
static void test_selection(void **state) {
  (void)state;
  double rel = 0, lerr = 0;
  int bad = 0;
  int st = run_case(&small_case, FLASHCL_KERNEL_NVIDIA_MMA, &rel, &lerr, &bad);
  if (st == FLASHCL_SUCCESS) {
    mma_available = 1;
    hopper_fwd = strcmp(last_kernel, "flash_fwd_wgmma") == 0;
  } else {
    assert_int_equal(st, FLASHCL_ERROR_UNSUPPORTED);
    const char *msg = flashcl_context_last_error(ctx);
    if (!strstr(msg, "tensor-core")) fail_msg("last error does not give the reason: \"%s\"", msg);
    mma_available = 0;
    snprintf(mma_reason, sizeof mma_reason, "%s", msg);
    /* Refusing is right except on an NVIDIA device of compute capability >= 8.0. */
    fct_mma_unavailable(flashcl_context_cl_device(ctx), "explicit NVIDIA_MMA forward", msg);
  }
  assert_int_equal(run_case(&small_case, FLASHCL_KERNEL_AUTO, &rel, &lerr, &bad), FLASHCL_SUCCESS);
  assert_true(case_ok(&small_case, rel, lerr, bad));
  assert_int_equal(run_case(&small_case, FLASHCL_KERNEL_PORTABLE, &rel, &lerr, &bad), FLASHCL_SUCCESS);
  assert_true(case_ok(&small_case, rel, lerr, bad));
}

static void test_accuracy(void **state) {
  (void)state;
  if (!mma_available) {
    /* Fails on an NVIDIA device of compute capability >= 8.0, else a skip. */
    fct_mma_unavailable(flashcl_context_cl_device(ctx), "tensor-core accuracy", mma_reason);
    FCT_SKIP();
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
      /* Head dims besides 64 and 128: multiples of 16 up to 256, rows padded in
       * local memory to a multiple of 64 elements where they are not one. */
      {"d96", 1, 100, 100, 2, 2, 96, 0, 0, 0, 0, 1, 0},
      {"d96 varlen causal gqa", 1, 150, 210, 4, 2, 96, 1, 0, 0, 1, 1, 0},
      {"d80 bf16 causal", 2, 130, 170, 2, 2, 80, 1, 0, 0, 0, 2, 0},
      {"d32 causal", 2, 200, 200, 4, 4, 32, 1, 0, 0, 0, 1, 0},
      {"d16 N300/77", 1, 300, 77, 2, 1, 16, 0, 0, 0, 0, 1, 0},
      {"d48 bhnd", 2, 90, 140, 2, 2, 48, 0, 1, 0, 0, 1, 0},
      {"d256", 1, 300, 300, 2, 2, 256, 0, 0, 0, 0, 1, 0},
      {"d256 causal bf16 key ramp", 1, 333, 400, 2, 1, 256, 1, 0, 0, 0, 2, 0.2f, 5.0f},
      {"d192 varlen", 1, 150, 210, 2, 2, 192, 0, 0, 0, 1, 1, 0},
      /* Odd multiples of 8: both forwards pad them in local memory (the Hopper
       * one to 64-column tiles, mma.sync to the next multiple of 16); on Hopper
       * they must run flash_fwd_wgmma (test_mma_sync: flash_fwd_mma). */
      {"d136 (pads)", 1, 200, 200, 2, 2, 136, 0, 0, 0, 0, 1, 0},
      {"d72 (pads)", 1, 130, 170, 2, 2, 72, 0, 0, 0, 0, 1, 0},
      {"d120 bf16 causal gqa (pads)", 2, 150, 150, 4, 2, 120, 1, 0, 0, 0, 2, 0},
      {"d200 varlen causal (pads)", 1, 150, 210, 2, 2, 200, 1, 0, 0, 1, 1, 0},
      {"d40 bhnd (pads)", 2, 90, 140, 2, 2, 40, 0, 1, 0, 0, 1, 0},
      {"d8 N99 mqa (pads)", 1, 99, 99, 2, 1, 8, 0, 0, 0, 0, 1, 0},
      {"d88 N1/300 (pads)", 2, 1, 300, 2, 2, 88, 0, 0, 0, 0, 1, 0},
      {"d248 bf16 causal key ramp (pads)", 1, 200, 300, 2, 1, 248, 1, 0, 0, 0, 2, 0.2f, 5.0f},
      {"d128 N1024 causal", 1, 1024, 1024, 2, 2, 128, 1, 0, 0, 0, 1, 0},
      /* Large and growing scores: the running max moves by more than the lazy
       * rescale threshold at many tiles and by less at others. */
      {"d128 N700 scale 1", 1, 700, 700, 2, 2, 128, 0, 0, 0, 0, 1, 1.0f},
      {"d128 N600 causal key ramp", 1, 600, 600, 2, 1, 128, 1, 0, 0, 0, 1, 0.3f, 4.0f},
      {"d64 N777 key ramp", 2, 257, 777, 2, 2, 64, 0, 0, 0, 0, 1, 0.5f, 6.0f},
      {"d128 bf16 key ramp", 1, 300, 513, 2, 2, 128, 0, 0, 0, 0, 2, 0.2f, 5.0f},
  };
  int fails = 0;
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    double rel = 0, lerr = 0;
    int bad = 0;
    int st = run_case(&cs[i], FLASHCL_KERNEL_NVIDIA_MMA, &rel, &lerr, &bad);
    int ok = st == FLASHCL_SUCCESS && case_ok(&cs[i], rel, lerr, bad);
    if (!ok) {
      fails++;
      print_error("%s: status %s, relL2(O) %.3g, relL2(LSE) %.3g, bad %d %s\n", cs[i].name,
                  flashcl_status_string(st), rel, lerr, bad, st ? flashcl_context_last_error(ctx) : "");
    }
    const int pads = strstr(cs[i].name, "pads") != NULL;
    const int want = strstr(cs[i].name, "fallback") ? FLASHCL_KERNEL_PORTABLE : FLASHCL_KERNEL_NVIDIA_MMA;
    if ((int)last_family != want ||
        (pads && strcmp(last_kernel, hopper_fwd ? "flash_fwd_wgmma" : "flash_fwd_mma"))) {
      fails++;
      print_error("%s: ran kernel family %d (%s), expected %d\n", cs[i].name, (int)last_family, last_kernel, want);
    }
  }
  assert_int_equal(fails, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_selection),
      cmocka_unit_test(test_accuracy),
  };
  print_message("[ SEED     ] FLASHCL_TEST_SEED=%llu\n", (unsigned long long)fct_seed());
  const int failed = cmocka_run_group_tests(tests, setup, teardown);
  if (failed)
    print_message("[ SEED     ] %d failure(s); reproduce with FLASHCL_TEST_SEED=%llu\n", failed,
                  (unsigned long long)fct_seed());
  return fct_exit_status(tests, sizeof tests / sizeof tests[0], failed);
}
