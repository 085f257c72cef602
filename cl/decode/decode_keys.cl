/*
 * decode_keys.cl: which keys a decode work-group walks and which of them a
 * row sees, shared by decode.cl's kernel (GPUs) and decode_cpu.cl's (CPUs)
 * so that both splits and masks stay one rule, which decode.cl's banner
 * states.
 *
 * Parameters (-D): SPLIT, TREE_MASK and WINDOW as in decode.cl. The host
 * joins it after score_variant.cl, whose sv_in_window it calls with
 * WINDOW = 1 (the kernels' requires lines name both).
 */
#ifndef DECODE_KEYS_CL
#define DECODE_KEYS_CL

#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef TREE_MASK
#define TREE_MASK 0
#endif
#ifndef WINDOW
#define WINDOW 0
#endif

/* Keys [x, y) of split `split` of num_splits, for a sequence of L keys whose
 * last q_len are the new tokens: chunks of ceil(range / num_splits) rounded
 * up to `tile`; with a left window the range starts at the first key any row
 * sees, rounded down to a tile (so that a paged tile stays in one page). */
inline int2 dec_split_keys(int L, int q_len, int window_left, int split, int num_splits, int tile) {
  int kbase = 0;
#if WINDOW
  if (window_left >= 0) kbase = max(L - q_len - window_left, 0) / tile * tile;
#endif
  (void)window_left;
  int kstart = kbase, kend = L;
#if SPLIT
  int chunk = (L - kbase + num_splits - 1) / num_splits;
  chunk = (chunk + tile - 1) / tile * tile;
  kstart = min(kbase + split * chunk, L);
  kend = min(kstart + chunk, L);
#endif
  (void)split;
  (void)num_splits;
  return (int2)(kstart, kend);
}

/* Whether new token t of sequence b (position L - q_len + t) sees key j < L:
 * bottom-right causal, or with TREE_MASK every key before the new tokens and
 * new token u = j - (L - q_len) where bit u of tree_mask[b * q_len + t] is
 * set; with WINDOW also only the keys of its window. */
inline int dec_key_visible(int j, int t, int L, int q_len, int b, __global const uint *tree_mask, int window_left,
                           int window_right) {
#if TREE_MASK
  const int u = j - (L - q_len);
  int vis = u < 0 || ((tree_mask[b * q_len + t] >> u) & 1u);
#else
  int vis = j <= L - q_len + t;
#endif
  (void)b;
  (void)tree_mask;
#if WINDOW
  vis = vis && sv_in_window(j, L - q_len + t, window_left, window_right);
#endif
  (void)window_left;
  (void)window_right;
  return vis;
}

#endif
