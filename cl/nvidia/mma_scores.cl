/*
 * mma_scores.cl: the score variants and visibility rules of the tensor-core
 * kernels (flash_fwd_mma.cl, flash_bwd_mma.cl), the portable kernels' rules:
 * causal, sliding window, ALiBi, logit softcap and attention masks. The host
 * compiles it after mma_ptx.cl (and mask.cl, mask_mma.cl when MASK is set),
 * right before the kernel file.
 *
 * Parameters (-D), the kernel's own (see flash_fwd_mma.cl): USE_PTX, CAUSAL,
 * WINDOW, ALIBI, SOFTCAP, MASK.
 */
#ifndef MMA_SCORES_CL
#define MMA_SCORES_CL

#ifndef USE_PTX
#define USE_PTX 0
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#ifndef ALIBI
#define ALIBI 0
#endif
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
#ifndef MASK
#define MASK 0
#endif
#if WINDOW && CAUSAL
#error "WINDOW folds causal into window_right: build with CAUSAL=0"
#endif
/* Scores go to log2 units before the softmax (scale 1 there) instead of staying raw. */
#define SCORE_LOG2 (SOFTCAP || ALIBI)

#if USE_PTX
#if !defined(MMA_TYPE) || (MASK && !defined(MASK_CL))
#error "mma_scores.cl needs mma_ptx.cl (and mask.cl with MASK) compiled first in the same program"
#endif

#if SCORE_LOG2
/* Raw score s of a pair `dist` = |j - (i + diag)| apart, in log2 units; *t gets
 * the softcap's tanh (for dS). */
inline float score_log2(float s, float scale_log2, float softcap_in, float softcap_log2, float slope_log2, int dist,
                        float *t) {
#if SOFTCAP
  *t = tanh_ex2(s * softcap_in);
  float x = softcap_log2 * *t;
#else
  *t = 0.0f;
  float x = s * scale_log2;
#endif
#if ALIBI
  x -= slope_log2 * (float)dist;
#endif
  return x;
}
#endif

/* Whether query i (< nq or not) sees key j under the kernel's masks; mrow is the
 * mask of the pair's (sequence, query head), mcls its tile class (3: all bits set). */
inline int pair_visible(int i, int j, int nq, int nk, int diag, int window_left, int window_right,
                        __global const uint *mrow, int mcls, int mask_words, int mask_bq, int mask_bk) {
  int vis = j < nk;
#if CAUSAL
  vis = vis && j <= i + diag;
#elif WINDOW
  vis = vis && j <= i + diag + window_right && j >= i + diag - window_left;
#endif
#if MASK
  vis = vis && i < nq; /* rows past nq have no mask bits (their P is 0 anyway) */
  if (vis && !(mcls & 2)) vis = mask_ok(mrow, mask_words, mask_bq, mask_bk, i, j);
#endif
  return vis;
}

/* Keys [x, y) that query rows [r0, r0 + rows) need (diag = Nk - Nq), x rounded
 * down to a multiple of align: all keys, or fewer under causal or a window. */
inline int2 needed_keys(int r0, int rows, int diag, int nk, int window_left, int window_right, int align) {
  int2 r = (int2)(0, nk);
#if CAUSAL
  r.y = min(nk, r0 + rows + diag);
#elif WINDOW
  r.x = max(0, r0 + diag - window_left);
  r.x -= r.x % align;
  r.y = min(nk, max(0, r0 + rows + diag + window_right));
#endif
  return r;
}

/* 1 unless every pair of rows [r0, r0 + rows) x keys [k0, k0 + cols) is inside
 * the sequence, the causal mask and the window (then no per-score test is needed). */
inline int tile_partial(int r0, int rows, int k0, int cols, int diag, int nk, int window_left, int window_right) {
  int partial = k0 + cols > nk;
#if CAUSAL
  partial = partial || k0 + cols - 1 > r0 + diag;
#elif WINDOW
  partial = partial || k0 + cols - 1 > r0 + diag + window_right || k0 < r0 + rows - 1 + diag - window_left;
#endif
  return partial;
}
#endif /* USE_PTX */

#endif /* MMA_SCORES_CL */
