/*
 * Soak (docs/reliability.md, "Soak"): FLASHCL_SOAK_STEPS (default 2000; the
 * long entry 10^5) steps of flashcl_kv_cache_append + flashcl_attention_decode
 * on one context, over a paged cache whose sequences grow one token per step
 * and start again from 0 when full (overwriting their pages). The split count
 * alternates between 2 and 4, so that the context's decode scratch is reused
 * and would show any growth.
 *
 * Checks, from the end of a warm-up to the end of the run:
 *   - host RSS (/proc/self/statm, where there is one) grows by at most 1 MiB;
 *   - CL_CONTEXT_REFERENCE_COUNT does not change: every buffer, queue and
 *     program retains the cl_context, so a device buffer the library leaks
 *     shows up there (PoCL's events do not: a leaked event can only show in
 *     the RSS);
 *   - the context's program statistics do not change (nothing is rebuilt);
 *   - at 8 checkpoints, decode's output matches a CPU reference computed from
 *     a host mirror of the cache (wrap-around included).
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__unix__)
#include <unistd.h>
#endif

#define D 32
enum { B = 2, HQ = 4, HKV = 2, PAGE = 16, MAXP = 4, NPAGES = 8, CAP = PAGE * MAXP, NV = 5 };
#define ROW (HKV * D)
#define NCACHE (NPAGES * PAGE * ROW)
static const int32_t TABLE[B * MAXP] = {0, 1, 2, 3, 7, 6, 5, 4};

/* Host RSS in bytes, or -1 where /proc/self/statm is missing. */
static long long rss_bytes(void) {
#if defined(__unix__)
  FILE *f = fopen("/proc/self/statm", "r");
  long long size = 0, resident = -1;
  if (!f) return -1;
  if (fscanf(f, "%lld %lld", &size, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * (long long)sysconf(_SC_PAGESIZE);
#else
  return -1;
#endif
}

static cl_uint context_refs(cl_context c) {
  cl_uint n = 0;
  clGetContextInfo(c, CL_CONTEXT_REFERENCE_COUNT, sizeof n, &n, NULL);
  return n;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cl_mem buffer(cl_context c, size_t bytes, const void *init) {
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(c, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes, (void *)init, &err);
  assert_int_equal(err, CL_SUCCESS);
  return m;
}

/* The decode of one new token per sequence, in double, from the mirror. */
static void reference(const float *q, const float *kc, const float *vc, const int32_t *lens, double *o) {
  const double scale = 1.0 / sqrt((double)D);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HQ; h++) {
      const int kh = h / (HQ / HKV), L = lens[b];
      double m = -INFINITY, l = 0, acc[D] = {0};
      for (int j = 0; j < L; j++) {
        const size_t row = ((size_t)TABLE[b * MAXP + j / PAGE] * PAGE + (size_t)(j % PAGE)) * ROW + (size_t)kh * D;
        double s = 0;
        for (int x = 0; x < D; x++) s += (double)q[(b * HQ + h) * D + x] * kc[row + x];
        s *= scale;
        const double mn = s > m ? s : m, a = exp(m - mn), p = exp(s - mn);
        l = l * a + p;
        for (int x = 0; x < D; x++) acc[x] = acc[x] * a + p * vc[row + x];
        m = mn;
      }
      for (int x = 0; x < D; x++) o[(b * HQ + h) * D + x] = L ? acc[x] / l : 0.0;
    }
}

static void test_soak(void **state) {
  (void)state;
  const char *e = getenv("FLASHCL_SOAK_STEPS");
  const long steps = e && *e && atol(e) > 0 ? atol(e) : 2000;
  const long warm = steps / 10 < 1 ? 1 : steps / 10 < 200 ? steps / 10 : 200;
  fct_env *env = fct_env_get();
  flashcl_context *ctx = env->ctx;
  cl_context c = env->cl_ctx;
  cl_command_queue queue = env->queue;

  fct_rng rng;
  fct_rng_init(&rng, "soak");
  static float q[B * HQ * D], knew[NV][B * ROW], vnew[NV][B * ROW], kc[NCACHE], vc[NCACHE], o[B * HQ * D];
  for (int i = 0; i < B * HQ * D; i++) q[i] = (float)fct_rng_normal(&rng);
  for (int v = 0; v < NV; v++)
    for (int i = 0; i < B * ROW; i++) {
      knew[v][i] = (float)fct_rng_normal(&rng);
      vnew[v][i] = (float)fct_rng_normal(&rng);
    }
  memset(kc, 0, sizeof kc);
  memset(vc, 0, sizeof vc);

  cl_mem mq = buffer(c, sizeof q, q), mo = buffer(c, sizeof o, NULL), mkc = buffer(c, sizeof kc, kc),
         mvc = buffer(c, sizeof vc, vc), mtable = buffer(c, sizeof TABLE, TABLE),
         mpos = buffer(c, B * sizeof(int32_t), NULL), mlens = buffer(c, B * sizeof(int32_t), NULL);
  cl_mem mk[NV], mv[NV];
  flashcl_tensor tq, to, tkc, tvc, tk[NV], tv[NV];
  assert_int_equal(flashcl_tensor_init_bnhd(&tq, mq, 0, FLASHCL_F32, B, 1, HQ, D), FLASHCL_SUCCESS);
  assert_int_equal(flashcl_tensor_init_bnhd(&to, mo, 0, FLASHCL_F32, B, 1, HQ, D), FLASHCL_SUCCESS);
  assert_int_equal(flashcl_tensor_init_bnhd(&tkc, mkc, 0, FLASHCL_F32, NPAGES, PAGE, HKV, D), FLASHCL_SUCCESS);
  assert_int_equal(flashcl_tensor_init_bnhd(&tvc, mvc, 0, FLASHCL_F32, NPAGES, PAGE, HKV, D), FLASHCL_SUCCESS);
  for (int v = 0; v < NV; v++) {
    mk[v] = buffer(c, sizeof knew[v], knew[v]);
    mv[v] = buffer(c, sizeof vnew[v], vnew[v]);
    assert_int_equal(flashcl_tensor_init_bnhd(&tk[v], mk[v], 0, FLASHCL_F32, B, 1, HKV, D), FLASHCL_SUCCESS);
    assert_int_equal(flashcl_tensor_init_bnhd(&tv[v], mv[v], 0, FLASHCL_F32, B, 1, HKV, D), FLASHCL_SUCCESS);
  }
  flashcl_decode_desc desc;
  flashcl_decode_desc_init(&desc);
  desc.cache.page_size = PAGE;
  desc.cache.block_table = mtable;
  desc.cache.max_pages = MAXP;

  /* Sequence 1 starts part-full (of zeros), so the two wrap at other steps. */
  int32_t lens[B] = {0, 40}, pos[B];
  long long rss0 = -1;
  cl_uint refs0 = 0;
  flashcl_context_stats stats0;
  memset(&stats0, 0, sizeof stats0);
  double t0 = now_s(), worst = 0;
  long wraps = 0, checks = 0;
  const long check_every = steps / 8 > 0 ? steps / 8 : 1;
  for (long s = 0; s < steps; s++) {
    for (int b = 0; b < B; b++) {
      if (lens[b] >= CAP) {
        lens[b] = 0;
        wraps++;
      }
      pos[b] = lens[b];
      lens[b]++;
    }
    /* Blocking writes: the queue is in order, so each step also waits for the
     * previous step's kernels (the queue never grows). */
    cl_int err = clEnqueueWriteBuffer(queue, mpos, CL_TRUE, 0, sizeof pos, pos, 0, NULL, NULL);
    err |= clEnqueueWriteBuffer(queue, mlens, CL_TRUE, 0, sizeof lens, lens, 0, NULL, NULL);
    assert_int_equal(err, CL_SUCCESS);
    const int v = (int)(s % NV);
    desc.split.num_splits = s % 2 ? 2 : 4;
    flashcl_status st = flashcl_kv_cache_append(ctx, FCT_APPEND_DESC(&desc), &tk[v], &tv[v], &tkc, &tvc, mpos, 0, NULL, NULL);
    if (st == FLASHCL_SUCCESS)
      st = flashcl_attention_decode(ctx, &desc, &tq, &tkc, &tvc, mlens, &to, NULL, 0, NULL, NULL);
    if (st != FLASHCL_SUCCESS) fail_msg("step %ld: %s: %s", s, flashcl_status_string(st), flashcl_context_last_error(ctx));
    for (int b = 0; b < B; b++) {
      const size_t row = ((size_t)TABLE[b * MAXP + pos[b] / PAGE] * PAGE + (size_t)(pos[b] % PAGE)) * ROW;
      memcpy(kc + row, knew[v] + b * ROW, ROW * sizeof(float));
      memcpy(vc + row, vnew[v] + b * ROW, ROW * sizeof(float));
    }
    if ((s + 1) % check_every == 0 || s + 1 == steps) {
      assert_int_equal(clEnqueueReadBuffer(queue, mo, CL_TRUE, 0, sizeof o, o, 0, NULL, NULL), CL_SUCCESS);
      static double want[B * HQ * D];
      reference(q, kc, vc, lens, want);
      for (int i = 0; i < B * HQ * D; i++) {
        const double d = fabs(o[i] - want[i]) / (1.0 + fabs(want[i]));
        if (!(d <= worst) && !isnan(worst)) worst = d; /* NaN sticks */
      }
      checks++;
    }
    if (s + 1 == warm) {
      assert_int_equal(clFinish(queue), CL_SUCCESS);
      rss0 = rss_bytes();
      refs0 = context_refs(c);
      assert_int_equal(flashcl_context_stats_get(ctx, &stats0), FLASHCL_SUCCESS);
      t0 = now_s();
    }
  }
  assert_int_equal(clFinish(queue), CL_SUCCESS);
  const double secs = now_s() - t0;
  const long long rss1 = rss_bytes();
  const cl_uint refs1 = context_refs(c);
  flashcl_context_stats stats1;
  assert_int_equal(flashcl_context_stats_get(ctx, &stats1), FLASHCL_SUCCESS);
  print_message("[ SOAK     ] %ld steps (append + decode), %ld wraps, %ld checks (worst rel. error %.3g); "
                "%.1f s after a %ld-step warm-up (%.2f ms/step)\n",
                steps, wraps, checks, worst, secs, warm, 1e3 * secs / (double)(steps - warm));
  print_message("[ SOAK     ] host RSS %lld -> %lld bytes (%+lld); cl_context references %u -> %u; "
                "programs built %u -> %u\n",
                rss0, rss1, rss1 - rss0, refs0, refs1, stats0.programs_built, stats1.programs_built);

  for (int v = 0; v < NV; v++) {
    clReleaseMemObject(mk[v]);
    clReleaseMemObject(mv[v]);
  }
  cl_mem all[] = {mq, mo, mkc, mvc, mtable, mpos, mlens};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) clReleaseMemObject(all[i]);

  assert_true(worst < 1e-4);
  assert_int_equal(refs1, refs0);
  assert_int_equal(stats1.programs_built, stats0.programs_built);
  assert_int_equal(stats1.programs_from_cache, stats0.programs_from_cache);
  /* Under AddressSanitizer freed blocks wait in its quarantine (up to 256 MiB)
   * and the RSS grows with what the steps allocate and free; LeakSanitizer
   * checks the leaks there, at exit. */
  if (rss0 >= 0 && rss1 >= 0 && !fct_address_sanitized()) assert_true(rss1 - rss0 <= 1024 * 1024);
  if (fct_address_sanitized()) print_message("[ SOAK     ] RSS not checked: AddressSanitizer's quarantine holds freed memory\n");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_soak)};
  return fct_run_group("soak", tests, sizeof tests / sizeof tests[0], 1);
}
