/*
 * examples/training.c: one attention training step (forward, then backward).
 *
 *   forward:   O = softmax(S) V,  S = scale Q K^T with a causal mask, and the
 *              log-sum-exp LSE of each row of S (the backward needs it)
 *   backward:  given dO = dLoss/dO, the gradients dQ, dK and dV
 *
 * Loss here is a made-up L = sum(O * G) for a random G, so dO = G. The result
 * is checked against a double-precision CPU computation of the same gradients:
 *   P  = softmax(S)              dV = P^T dO
 *   dP = dO V^T                  dS = P * (dP - rowsum(dO * O))
 *   dQ = scale dS K              dK = scale dS^T Q
 * It prints one line and exits non-zero if anything fails.
 */
#include <flashcl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                     \
  do {                                                                                  \
    flashcl_status s_ = (call);                                                         \
    if (s_ != FLASHCL_SUCCESS) {                                                        \
      fprintf(stderr, "training: %s failed: %s: %s\n", #call, flashcl_status_string(s_), \
              flashcl_context_last_error(ctx));                                         \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)
#define CHECK_CL(err)                                                                       \
  do {                                                                                      \
    if ((err) != CL_SUCCESS) {                                                              \
      fprintf(stderr, "training: OpenCL error %s at line %d\n", flashcl_status_string(err), \
              __LINE__);                                                                    \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

enum { B = 1, N = 48, H = 2, D = 32 }; /* batch, sequence, heads, head dim: tiny */
#define COUNT ((size_t)B * N * H * D)
/* BNHD: element (b, n, h, x) of a (B, N, H, D) tensor. */
#define AT(t, b, n, h, x) (t)[(((size_t)(b) * N + (n)) * H + (h)) * D + (x)]

/* Uniform in [-1, 1) from a fixed-seed xorshift, the same on every platform. */
static float uniform(void) {
  static uint32_t state = 2463534242u;
  state ^= state << 13, state ^= state >> 17, state ^= state << 5;
  return (float)(state >> 8) / 8388608.0f - 1.0f;
}

/* max(worst, e) that keeps a NaN. */
static double worse(double worst, double e) { return (e > worst || e != e) ? e : worst; }

/* Largest |got - want| relative to the largest |want|. */
static double rel_err(const float *got, const double *want, size_t n) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < n; ++i) scale = fmax(scale, fabs(want[i]));
  for (size_t i = 0; i < n; ++i) err = worse(err, fabs(got[i] - want[i]));
  return err / scale;
}

/* The gradients in double precision, one (batch, head) at a time. */
static void reference_backward(const float *q, const float *k, const float *v, const float *d_o,
                               double *dq, double *dk, double *dv) {
  static double p[N][N], ds[N][N];
  const double scale = 1.0 / sqrt((double)D);
  memset(dq, 0, COUNT * sizeof *dq);
  memset(dk, 0, COUNT * sizeof *dk);
  memset(dv, 0, COUNT * sizeof *dv);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < N; ++i) { /* P row i: softmax over the keys j <= i */
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < N; ++j) {
          double s = 0;
          for (int x = 0; x < D; ++x) s += (double)AT(q, b, i, h, x) * AT(k, b, j, h, x);
          p[i][j] = j <= i ? s * scale : -INFINITY;
          m = fmax(m, p[i][j]);
        }
        for (int j = 0; j < N; ++j) sum += (p[i][j] = exp(p[i][j] - m));
        for (int j = 0; j < N; ++j) p[i][j] /= sum;
      }
      for (int i = 0; i < N; ++i) {
        /* rowsum(dO * O) = sum_j P_ij (dO_i . v_j), with O recomputed in double. */
        double dpv[N], delta = 0;
        for (int j = 0; j < N; ++j) {
          dpv[j] = 0;
          for (int x = 0; x < D; ++x) dpv[j] += (double)AT(d_o, b, i, h, x) * AT(v, b, j, h, x);
          delta += p[i][j] * dpv[j];
        }
        for (int j = 0; j < N; ++j) ds[i][j] = p[i][j] * (dpv[j] - delta);
      }
      for (int i = 0; i < N; ++i)
        for (int j = 0; j < N; ++j)
          for (int x = 0; x < D; ++x) {
            AT(dv, b, j, h, x) += p[i][j] * AT(d_o, b, i, h, x);
            AT(dq, b, i, h, x) += scale * ds[i][j] * AT(k, b, j, h, x);
            AT(dk, b, j, h, x) += scale * ds[i][j] * AT(q, b, i, h, x);
          }
    }
}

int main(void) {
  const size_t bytes = COUNT * sizeof(float), lse_bytes = (size_t)B * H * N * sizeof(float);
  static float hq[COUNT], hk[COUNT], hv[COUNT], hdo[COUNT], hdq[COUNT], hdk[COUNT], hdv[COUNT];
  static double rdq[COUNT], rdk[COUNT], rdv[COUNT];
  for (size_t i = 0; i < COUNT; ++i) hq[i] = uniform(), hk[i] = uniform(), hv[i] = uniform(), hdo[i] = uniform();

  flashcl_context *ctx = NULL;
  CHECK(flashcl_context_create(NULL, &ctx));
  cl_context cl = flashcl_context_cl_context(ctx);
  cl_command_queue queue = flashcl_context_cl_queue(ctx);

  /* Inputs, the forward's outputs (O and LSE), dO and the three gradients. */
  cl_int err;
  cl_mem buf[9];
  const float *init[9] = {hq, hk, hv, NULL, NULL, hdo, NULL, NULL, NULL};
  for (int i = 0; i < 9; ++i) {
    buf[i] = clCreateBuffer(cl, init[i] ? CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR : CL_MEM_READ_WRITE,
                            i == 4 ? lse_bytes : bytes, (void *)init[i], &err);
    CHECK_CL(err);
  }
  flashcl_tensor tq, tk, tv, to, tl, tdo, tdq, tdk, tdv;
  CHECK(flashcl_tensor_init_bnhd(&tq, buf[0], 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_bnhd(&tk, buf[1], 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_bnhd(&tv, buf[2], 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_bnhd(&to, buf[3], 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_lse(&tl, buf[4], 0, B, N, H));
  CHECK(flashcl_tensor_init_bnhd(&tdo, buf[5], 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_bnhd(&tdq, buf[6], 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_bnhd(&tdk, buf[7], 0, FLASHCL_F32, B, N, H, D));
  CHECK(flashcl_tensor_init_bnhd(&tdv, buf[8], 0, FLASHCL_F32, B, N, H, D));

  /* The backward takes the forward's descriptor. backward.deterministic = true (the
   * default) makes dQ bit-reproducible; false would accumulate it with atomics. */
  flashcl_attention_desc desc;
  flashcl_attention_desc_init(&desc);
  desc.mask.causal = true;

  /* Both calls go on the context's in-order queue; the event chain below makes
   * the order explicit, as it would need to be on an out-of-order queue. */
  cl_event fwd_done, bwd_done;
  CHECK(flashcl_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, &tl, 0, NULL, &fwd_done));
  CHECK(flashcl_attention_backward(ctx, &desc, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv, 1, &fwd_done,
                                   &bwd_done));
  CHECK_CL(clEnqueueReadBuffer(queue, buf[6], CL_TRUE, 0, bytes, hdq, 1, &bwd_done, NULL));
  CHECK_CL(clEnqueueReadBuffer(queue, buf[7], CL_TRUE, 0, bytes, hdk, 0, NULL, NULL));
  CHECK_CL(clEnqueueReadBuffer(queue, buf[8], CL_TRUE, 0, bytes, hdv, 0, NULL, NULL));

  reference_backward(hq, hk, hv, hdo, rdq, rdk, rdv);
  const double tol = 1e-4; /* fp32 math on the device */
  double eq = rel_err(hdq, rdq, COUNT), ek = rel_err(hdk, rdk, COUNT), ev = rel_err(hdv, rdv, COUNT);
  int ok = eq < tol && ek < tol && ev < tol;
  printf("training: B=%d N=%d H=%d D=%d causal: relative error dQ %.2e, dK %.2e, dV %.2e (tolerance %.0e): %s\n",
         B, N, H, D, eq, ek, ev, tol, ok ? "OK" : "FAILED");

  clReleaseEvent(fwd_done), clReleaseEvent(bwd_done);
  for (int i = 0; i < 9; ++i) clReleaseMemObject(buf[i]);
  flashcl_context_destroy(ctx);
  return ok ? 0 : 1;
}
