/*
 * score_variant.cl: flashcl's score variants, written once for every kernel
 * family (portable forward and backward, tensor-core forward and backward,
 * decode, naive): which keys a query sees (sequence end, causal, sliding
 * window, attention masks) and how a raw product q.k becomes the logit
 * (scale, logit softcap, ALiBi). The host joins it in front of each kernel
 * file that declares "requires: score_variant.cl", after mask.cl when MASK is
 * set. A new variant is a parameter here, its use in the kernels' score loops,
 * its descriptor field, its validation and its reference.
 *
 * Conventions. Query i of a sequence of nq queries and nk keys sits on the
 * diagonal key i + diag, diag = nk - nq (queries are the last nq positions).
 * The flash kernels take window bounds >= 0, with causal folded into
 * window_right (WINDOW and CAUSAL are never both set); decode passes -1 for
 * "no bound" (sv_in_window). Units are the caller's: the flash kernels pass
 * log2-domain constants (scale * log2(e), ...), naive passes natural ones.
 *
 * Parameters (-D):
 *   CAUSAL   1: key j is visible to query i iff j <= i + diag
 *   WINDOW   1: i + diag - window_left <= j <= i + diag + window_right
 *   ALIBI    1: logit -= slope * |j - (i + diag)|
 *   SOFTCAP  1: logit = cap_out * tanh(q.k * cap_in) (before ALiBi), with
 *            cap_in = scale / c and cap_out = c (times log2(e) in log2 units)
 *   MASK     0 none; 1 block mask; 2 bit mask (mask.cl must come first)
 *   SINKS    1: each row's softmax starts with a sink of logit sinks[h] that
 *            carries no value (sv_row_start)
 *   SV_TANH  the tanh of the softcap (default tanh; the tensor-core kernels
 *            define a faster one first, mma_scores.cl)
 */
#ifndef SCORE_VARIANT_CL
#define SCORE_VARIANT_CL

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
#ifndef SINKS
#define SINKS 0
#endif
#ifndef SV_TANH
#define SV_TANH(x) tanh(x)
#endif
#if WINDOW && CAUSAL
#error "WINDOW folds causal into window_right: build with CAUSAL=0"
#endif
#if MASK && !defined(MASK_CL)
#error "score_variant.cl with MASK needs mask.cl compiled first in the same program"
#endif
/* The logit is more than the scaled product: kernels that fold the scale into
 * Q or into the exponential cannot, and take the logit in log2 units. */
#define SCORE_LOG2 (SOFTCAP || ALIBI)

/* The logit of a raw product s whose key is `dist` = |j - (i + diag)| from the
 * query's diagonal; *t gets the softcap's tanh (dS needs 1 - t^2), else 0. */
inline float sv_logit(float s, float scale, float cap_in, float cap_out, float slope, int dist, float *t) {
#if SOFTCAP
  *t = SV_TANH(s * cap_in);
  float x = cap_out * *t;
#else
  *t = 0.0f;
  float x = s * scale;
#endif
#if ALIBI
  x -= slope * (float)dist;
#endif
  return x;
}

/* A row's softmax state (max, sum) before its first key: with SINKS the
 * sink's logit (times `units`: log2(e) for kernels that work in log2 units)
 * and its weight 1, counted by the one work-item of the row that has `own`
 * set (the others start at the same max: the work-items of a row that share
 * one pivot); else empty (-inf, 0). Partial states that are merged later with
 * their own maxima (decode's key groups and splits) start empty instead,
 * except the one that owns the sink. */
inline float2 sv_row_start(__global const float *sinks, int h, float units, int own) {
#if SINKS
  return (float2)(sinks[h] * units, own ? 1.0f : 0.0f);
#else
  return (float2)(-INFINITY, 0.0f);
#endif
}

/* A finished row's state (pivot m and sum l, log2 units; m = -inf: no key)
 * with a sink of logit `sink` (log2 units) added: the new pivot M, the sum
 * against it, and the factor exp2(m - M) that takes the row's O accumulator to
 * it, so that O = acc * scale / sum and LSE = M + log2(sum). Kernels whose P is
 * fp16 join the sink at the end rather than start from it (sv_row_start): a
 * sink well above the scores as the pivot would push every P under fp16's
 * normal range. */
inline float3 sv_sink_join(float sink, float m, float l) {
  const float M = fmax(m, sink);
  if (M == -INFINITY) return (float3)(-INFINITY, 0.0f, 0.0f);
  const float scale = m == -INFINITY ? 0.0f : exp2(m - M);
  return (float3)(M, l * scale + exp2(sink - M), scale);
}

/* d(logit) / d(scaled product) given sv_logit's t: the softcap's 1 - t^2, else 1. */
inline float sv_logit_grad(float t) {
#if SOFTCAP
  return 1.0f - t * t;
#else
  return 1.0f;
#endif
}

/* Whether query i sees key j: inside the sequence, the causal rule and the
 * window (not the mask: sv_pair_visible). */
inline int sv_visible(int i, int j, int nk, int diag, int window_left, int window_right) {
  int vis = j < nk;
#if CAUSAL
  vis = vis && j <= i + diag;
#elif WINDOW
  vis = vis && j <= i + diag + window_right && j >= i + diag - window_left;
#endif
  return vis;
}

/* Decode's window: key j against a query at position pos; a negative bound is no bound. */
inline int sv_in_window(int j, int pos, int window_left, int window_right) {
  return (window_left < 0 || j >= pos - window_left) && (window_right < 0 || j <= pos + window_right);
}

/* Keys [x, y) that query rows [r0, r0 + rows) need, x rounded down to a
 * multiple of align: all keys, or fewer under causal or a window. Tiles
 * outside are never loaded. */
inline int2 sv_key_range(int r0, int rows, int diag, int nk, int window_left, int window_right, int align) {
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

/* The backward's transpose of sv_key_range: query rows [x, y) that see at
 * least one of keys [k0, k0 + cols), x rounded down to a multiple of align. */
inline int2 sv_query_range(int k0, int cols, int diag, int nq, int nk, int window_left, int window_right, int align) {
  int2 r = (int2)(0, nq);
#if CAUSAL
  r.x = max(0, k0 - diag);
  r.x -= r.x % align;
#elif WINDOW
  r.x = max(0, k0 - diag - window_right);
  r.x -= r.x % align;
  r.y = min(nq, max(0, min(k0 + cols, nk) - 1 - diag + window_left + 1));
#endif
  return r;
}

/* 1 unless every pair of rows [r0, r0 + rows) x keys [k0, k0 + cols) is inside
 * the sequence, the causal rule and the window: then no per-score test is needed. */
inline int sv_tile_partial(int r0, int rows, int k0, int cols, int diag, int nk, int window_left, int window_right) {
  int partial = k0 + cols > nk;
#if CAUSAL
  partial = partial || k0 + cols - 1 > r0 + diag;
#elif WINDOW
  partial = partial || k0 + cols - 1 > r0 + diag + window_right || k0 < r0 + rows - 1 + diag - window_left;
#endif
  return partial;
}

#if MASK
/* sv_visible and the mask: mrow is the mask of the pair's (sequence, query
 * head), mcls its tile's class from mask_tile (bit 1: every bit set). Rows
 * past nq have no mask bits. */
inline int sv_pair_visible(int i, int j, int nq, int nk, int diag, int window_left, int window_right,
                           __global const uint *mrow, int mcls, int mask_words, int mask_bq, int mask_bk) {
  int vis = sv_visible(i, j, nk, diag, window_left, window_right) && i < nq;
  if (vis && !(mcls & 2)) vis = mask_ok(mrow, mask_words, mask_bq, mask_bk, i, j);
  return vis;
}
#else
inline int sv_pair_visible(int i, int j, int nq, int nk, int diag, int window_left, int window_right,
                           __global const uint *mrow, int mcls, int mask_words, int mask_bq, int mask_bk) {
  return sv_visible(i, j, nk, diag, window_left, window_right);
}
#endif

#endif /* SCORE_VARIANT_CL */
