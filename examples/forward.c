/*
 * examples/forward.c: one causal attention forward pass, checked on the CPU.
 *
 * This is the README's usage example (the part between the README markers is
 * copied there verbatim; the test example_readme_sync keeps the two equal).
 * It runs O = softmax(Q K^T / sqrt(D) + causal mask) V on the default OpenCL
 * device ($FLASHCL_DEVICE, else the first GPU, else any device) and compares
 * O and the log-sum-exp with a double-precision CPU computation of the same
 * formula. It prints one line and exits non-zero if anything fails.
 *
 * Build against an installed flashcl:
 *   cc forward.c $(pkg-config --cflags --libs --static flashcl) -lm   (drop --static for a shared build)
 * or with CMake: find_package(flashcl CONFIG REQUIRED) and flashcl::flashcl
 * (examples/consumer/CMakeLists.txt).
 */
/* README begin */
#include <flashcl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Every flashcl call returns a status; on failure the context keeps a readable
 * message (with ctx == NULL, the thread's last one, e.g. why no device opened). */
#define CHECK(call)                                                                    \
  do {                                                                                 \
    flashcl_status s_ = (call);                                                        \
    if (s_ != FLASHCL_SUCCESS) {                                                       \
      fprintf(stderr, "forward: %s failed: %s: %s\n", #call, flashcl_status_string(s_), \
              flashcl_context_last_error(ctx));                                        \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)
/* OpenCL calls return cl_int; flashcl_status_string names those codes too. */
#define CHECK_CL(err)                                                                      \
  do {                                                                                     \
    if ((err) != CL_SUCCESS) {                                                             \
      fprintf(stderr, "forward: OpenCL error %s at line %d\n", flashcl_status_string(err), \
              __LINE__);                                                                   \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

static double check_on_cpu(const float *q, const float *k, const float *v, const float *o,
                           const float *lse, int B, int N, int H, int D, double *lse_err);

int main(void) {
  const int B = 2, N = 100, H = 4, D = 64; /* batch, sequence, heads, head dim */
  const size_t count = (size_t)B * N * H * D, bytes = count * sizeof(float);
  const size_t lse_bytes = (size_t)B * H * N * sizeof(float);
  flashcl_context *ctx = NULL;
  CHECK(flashcl_context_create(NULL, &ctx)); /* NULL: default options */

  /* Random inputs in [-1, 1); BNHD layout: element (b, n, h, x) at ((b*N + n)*H + h)*D + x. */
  float *host = malloc(3 * bytes + bytes + lse_bytes);
  if (!host) return 1;
  float *hq = host, *hk = host + count, *hv = host + 2 * count, *ho = host + 3 * count;
  float *hlse = host + 4 * count;
  srand(1);
  for (size_t i = 0; i < 3 * count; ++i) host[i] = 2.0f * rand() / RAND_MAX - 1.0f;

  /* Buffers are plain cl_mem objects of the context's OpenCL context. */
  cl_context cl = flashcl_context_cl_context(ctx);
  cl_command_queue queue = flashcl_context_cl_queue(ctx);
  cl_int err;
  cl_mem q = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, hq, &err);
  CHECK_CL(err);
  cl_mem k = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, hk, &err);
  CHECK_CL(err);
  cl_mem v = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, hv, &err);
  CHECK_CL(err);
  cl_mem o = clCreateBuffer(cl, CL_MEM_WRITE_ONLY, bytes, NULL, &err);
  CHECK_CL(err);
  cl_mem lse = clCreateBuffer(cl, CL_MEM_WRITE_ONLY, lse_bytes, NULL, &err);
  CHECK_CL(err);

  /* Tensors are views of the buffers: BNHD = (batch, seq, heads, head_dim), contiguous.
   * The LSE is fp32 (batch, heads, seq), as FlashAttention's. */
  flashcl_tensor tq, tk, tv, to, tl;
  CHECK(flashcl_tensor_init_bnhd(&tq, q, 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_bnhd(&tk, k, 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_bnhd(&tv, v, 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_bnhd(&to, o, 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_lse(&tl, lse, 0, B, N, H));

  flashcl_attention_desc desc;
  flashcl_attention_desc_init(&desc); /* scale 1/sqrt(D), no mask, algo AUTO (flash) */
  desc.mask.causal = true;

  /* Asynchronous: the call enqueues the work and returns an event. */
  cl_event done;
  CHECK(flashcl_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, &tl, 0, NULL, &done));
  CHECK_CL(clEnqueueReadBuffer(queue, o, CL_TRUE, 0, bytes, ho, 1, &done, NULL));
  CHECK_CL(clEnqueueReadBuffer(queue, lse, CL_TRUE, 0, lse_bytes, hlse, 0, NULL, NULL));

  double lse_err;
  double o_err = check_on_cpu(hq, hk, hv, ho, hlse, B, N, H, D, &lse_err);
  int ok = o_err < 1e-4 && lse_err < 1e-4;
  printf("forward: B=%d N=%d H=%d D=%d causal: max |O - ref| = %.2e, max |LSE - ref| = %.2e: %s\n", B, N,
         H, D, o_err, lse_err, ok ? "OK" : "FAILED");

  clReleaseEvent(done);
  clReleaseMemObject(q), clReleaseMemObject(k), clReleaseMemObject(v);
  clReleaseMemObject(o), clReleaseMemObject(lse);
  free(host);
  flashcl_context_destroy(ctx);
  return ok ? 0 : 1;
}
/* README end */

/* The same attention in double precision, one (batch, head, query) row at a
 * time: s_j = q . k_j / sqrt(D) for the keys j <= i the causal mask lets
 * through, LSE = log sum_j exp(s_j), O = sum_j exp(s_j - LSE) v_j. Returns the
 * largest |O - reference| and stores the largest |LSE - reference|. */
/* max(worst, e) that keeps a NaN (fmax would drop it, hiding a NaN output). */
static double worse(double worst, double e) { return (e > worst || e != e) ? e : worst; }

static double check_on_cpu(const float *q, const float *k, const float *v, const float *o,
                           const float *lse, int B, int N, int H, int D, double *lse_err) {
  double o_err = 0, l_err = 0, *s = malloc((size_t)N * sizeof *s);
  *lse_err = INFINITY;
  if (!s) return INFINITY;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < N; ++i) {
        const float *qi = q + (((size_t)b * N + i) * H + h) * D;
        double m = -INFINITY, sum = 0;
        for (int j = 0; j <= i; ++j) { /* causal: key j visible iff j <= i */
          const float *kj = k + (((size_t)b * N + j) * H + h) * D;
          double dot = 0;
          for (int x = 0; x < D; ++x) dot += (double)qi[x] * kj[x];
          s[j] = dot / sqrt((double)D);
          if (s[j] > m) m = s[j];
        }
        for (int j = 0; j <= i; ++j) sum += exp(s[j] - m);
        double ref_lse = m + log(sum);
        l_err = worse(l_err, fabs(ref_lse - lse[((size_t)b * H + h) * N + i]));
        for (int x = 0; x < D; ++x) {
          double acc = 0;
          for (int j = 0; j <= i; ++j) acc += exp(s[j] - ref_lse) * v[(((size_t)b * N + j) * H + h) * D + x];
          o_err = worse(o_err, fabs(acc - o[(((size_t)b * N + i) * H + h) * D + x]));
        }
      }
  free(s);
  *lse_err = l_err;
  return o_err;
}
