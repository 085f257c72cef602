/*
 * mask_mma.cl: attention-mask tile classes for the tensor-core kernels
 * (flash_fwd_mma.cl, and bwd_dq_mma in flash_bwd_mma.cl), which stream key
 * tiles of BLOCK_C keys past a block of query rows, one warp per 16 * M rows.
 * The host compiles it after mma_ptx.cl and mask.cl and before the kernel file
 * ("mma_ptx.cl+mask.cl+mask_mma.cl+flash_fwd_mma.cl") whenever MASK is set.
 *
 * Parameters (-D), the kernel's own:
 *   USE_PTX   1: the helpers (they need warp_ballot from mma_ptx.cl); 0: empty
 *   MASK      0: empty file; 1: block mask; 2: bit mask (see mask.cl)
 *   BLOCK_C   keys per tile
 */
#ifndef MASK_MMA_CL
#define MASK_MMA_CL

#ifndef USE_PTX
#define USE_PTX 0
#endif
#ifndef MASK
#define MASK 0
#endif
#ifndef BLOCK_C
#define BLOCK_C 64
#endif

#if USE_PTX && MASK
#if !defined(MASK_CL) || !defined(MMA_TYPE)
#error "mask_mma.cl needs mma_ptx.cl and mask.cl compiled first in the same program"
#endif

/* Mask classes of key tiles, 32 at a time: lane l scans tile win + l, and
 * ballots give, per window, the tiles with some bit set for the work-group's
 * rows (any_wg: uniform across the work-group, so such tiles are neither loaded
 * nor computed) and for this warp's rows (any_w; all_w: every bit set, so no
 * per-score test). Reading the mask once per 32 tiles, in parallel, rather than
 * with a few dependent loads per tile, is what keeps its cost small: per-tile
 * scans made a dense block mask far slower (BENCHMARKS.md, "Block masks"). */
typedef struct mask_geom {
  __global const uint *m; /* this (sequence, head)'s bit matrix */
  int words;              /* per mask row */
  int r0, r1;             /* mask rows of the work-group's queries */
  int w0, w1;             /* mask rows of this warp's queries (w1 < w0: none) */
  int kend, nk;           /* keys the work-group needs; keys in the sequence */
  int bk;                 /* keys per mask column (block masks) */
} mask_geom;
typedef struct mask_win {
  int win; /* first tile of the window (-32: none yet) */
  uint any_wg, any_w, all_w;
} mask_win;

/* The geometry of a work-group of query rows [q0, q0 + rows) whose warp owns
 * [wrow0, wrow0 + wrows), keys up to kend; mask rows count blocks of bq queries
 * (block masks) or queries (bit masks). An empty window to start with. */
inline void mask_init(mask_geom *g, mask_win *w, __global const uint *m, int words, int bq, int bk, int q0, int rows,
                      int wrow0, int wrows, int nq, int kend, int nk) {
  if (MASK != 1) bq = bk = 1;
  g->m = m;
  g->words = words;
  g->r0 = q0 / bq;
  g->r1 = (min(q0 + rows, nq) - 1) / bq;
  /* A warp whose rows all lie past nq has no mask rows. */
  g->w0 = wrow0 < nq ? wrow0 / bq : 1;
  g->w1 = wrow0 < nq ? (min(wrow0 + wrows, nq) - 1) / bq : 0;
  g->kend = kend;
  g->nk = nk;
  g->bk = bk;
  w->win = -32;
  w->any_wg = w->any_w = w->all_w = 0u;
}

inline void mask_window(mask_win *w, const mask_geom *g, int t, int lane) {
  const int kl = (t + lane) * BLOCK_C;
  int cg = 0, cw = 0;
  if (kl < g->kend) {
    const int c0 = kl / g->bk, c1 = (min(kl + BLOCK_C, g->kend) - 1) / g->bk, c1w = (min(kl + BLOCK_C, g->nk) - 1) / g->bk;
    cg = mask_scan(g->m, g->words, g->r0, g->r1, c0, c1);
    if (g->w1 >= g->w0) cw = mask_scan(g->m, g->words, g->w0, g->w1, c0, c1w);
  }
  w->win = t;
  w->any_wg = warp_ballot(cg & 1);
  w->any_w = warp_ballot(cw & 1);
  w->all_w = warp_ballot(cw & 2);
}
/* The first key tile at or after key k0 (a multiple of BLOCK_C) with a mask bit
 * set for the work-group's rows, or kend. Warp-uniform. */
inline int mask_next_tile(mask_win *w, const mask_geom *g, int k0, int lane) {
  int t = k0 / BLOCK_C;
  while (t * BLOCK_C < g->kend) {
    if (t < w->win || t - w->win >= 32) mask_window(w, g, t, lane);
    const uint bits = w->any_wg >> (t - w->win);
    if (bits) return min((t + 31 - (int)clz(bits & (0u - bits))) * BLOCK_C, g->kend);
    t = w->win + 32;
  }
  return g->kend;
}
/* This warp's class (1: some bits set, 3: all) of the tile at k0, which
 * mask_next_tile returned last (so it is in the window). */
inline int mask_warp_class(const mask_win *w, int k0) {
  const int i = k0 / BLOCK_C - w->win;
  return (int)((w->any_w >> i) & 1u) | (int)(((w->all_w >> i) & 1u) << 1);
}

#endif /* USE_PTX && MASK */

#endif /* MASK_MMA_CL */
