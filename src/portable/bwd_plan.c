/* The portable backward's plan: the tiles and work-item grids of bwd_dkdv
 * and bwd_dq (cl/portable/flash_bwd.cl), chosen from the local memory and
 * the bwd tuning (the files in tuning/, src/core/tuning_space.c). The launch is in
 * backward.c. */
#include "core/internal.h"
#include "core/tuning.h"
#include "portable/portable.h"

#include <string.h>

/* K, V, Q and dO tiles (rows padded by 4 floats), bwd_dkdv's two Bc x Br score
 * tiles (bwd_dq has one), each row `pad` floats longer, LSE and D per query
 * row, and the 16-float gaps before V and dO of BWD_SHFL. */
size_t fcl_bwd_local_bytes(int br, int bc, int d, int pad) {
  const size_t dkdv = 2u * (size_t)bc * (size_t)(br + pad), dq = (size_t)br * (size_t)(bc + pad);
  return 4u * ((size_t)(2 * bc + 2 * br) * (size_t)(d + 4) + (dkdv > dq ? dkdv : dq) + 2u * (size_t)br + 32u);
}

/* The block width W of a warp-tiled mapping (cl/portable/flash_bwd.cl, A_WQ and the
 * others) for a rows x cols grid: 32 consecutive work-items cover (32 / W) rows
 * by W columns. 8 columns by 4 rows first: of the shapes that divide these
 * grids it leaves the fewest distinct rows of both operands per warp load. 0
 * when no shape divides the grid or the grid leaves work-items idle. */
static int fcl_bwd_warp_width(int rows, int cols, int threads) {
  static const int widths[] = {8, 4, 16, 2};
  if (threads % 32 || rows * cols != threads) return 0;
  for (int i = 0; i < 4; i++)
    if (cols % widths[i] == 0 && rows % (32 / widths[i]) == 0) return widths[i];
  return 0;
}

/* Splits an m x n grid of values over `threads` work-items exactly: tm * tn values
 * each, as square as possible (fewest local loads per multiply-add). */
static int fcl_split_exact(int m, int n, int threads, int *tm, int *tn) {
  int best = 0;
  for (int a = 1; a <= m; a++) {
    if (m % a) continue;
    for (int c = 1; c <= n; c++) {
      if (n % c || (m / a) * (n / c) != threads) continue;
      if (!best || a + c < *tm + *tn) {
        *tm = a;
        *tn = c;
        best = 1;
      }
    }
  }
  return best;
}

/* Splits rows x head_dim outputs (columns in float4 granules) over at most
 * `threads` work-items, using as many as possible, then the fewest local loads:
 * per four rows of the sum, td values of Q / dO (or K) and tm four-wide reads
 * of the score tile, so the smallest tm + td. */
static int fcl_split_cols(int rows, int d, int threads, int *tm, int *td) {
  int best_used = 0;
  for (int a = 1; a <= rows; a++) {
    if (rows % a) continue;
    for (int c = 4; c <= d; c += 4) {
      if (d % c) continue;
      int used = (rows / a) * (d / c);
      if (used > threads) continue;
      if (used > best_used || (used == best_used && a + c < *tm + *td)) {
        best_used = used;
        *tm = a;
        *td = c;
      }
    }
  }
  return best_used > 0;
}

/* The bwd tuning's bc, br and threads force the tile pair and work-item count
 * (32x8, 24x16, 24x8, 48x32, 48x48, 64x48, 32x64, 64x16, 48x40, 40x32, 32x48,
 * 56x32 and 48x24 were tried that way; 48x32 and 56x32 are the H100's d = 128
 * choices in tuning/nvidia-h100.tune). Tiles: the first
 * of 64x64, 64x32, 32x32, 32x16, 16x16, 16x8, 8x8 (Bc x Br) whose four d-wide
 * fp32 tiles (K, V, Q, dO) and two score tiles fit in the local memory M: the
 * backward keeps twice the forward's tiles on chip, so it gets smaller ones from
 * the same M. 64 work-items where the score tile has at least 64 entries, else
 * one per entry: on the H100 64 beat 128 at d = 64 and 128, and 32 was slower
 * than either (BENCHMARKS.md, "Portable backward: work-items per work-group").
 *
 * Where the device runs work-groups with more local memory than it reports
 * (src/core/probe.c), the tiles are planned against half of that budget (so that two
 * work-groups share a compute unit) or M, whichever is larger, except that 32x32
 * is taken whenever the whole budget holds it: smaller tiles give each work-item
 * too little reuse. Score tiles of 1024 entries or more get 128 work-items, or
 * 256 where 128 would each hold more than 40 of the Bc x d values of dK (and of
 * dV; 32 at d = 128 and 40 at d = 80 ran best at 128, 48 at d = 192 and 64 at
 * d = 256 at 256). On the H100 (160 KiB budget) this gives 64x32 at 128
 * work-items at d = 64 and 80, 32x32 at 128 at d = 128 and 32x32 at 256 at
 * d = 192 and 256: each faster than the 48 KiB plan and than the other tiles
 * and work-item counts swept, except 48x32 at d = 128, which needs more than
 * half the budget (BENCHMARKS.md, "Portable kernels with the probed local
 * memory"). That sweep ran before the kernels read P and dS transposed, four
 * at a time. With those kernels d = 64 still runs best at 64x32 with 128
 * work-items, while at d = 128 NVIDIA's tuning file gives dK/dV and dQ
 * separate plans (48x32 and 32x64 at 128; tuning/nvidia-h100.tune). */
/* The rule above, or only the (want_bc, want_br) pair when want_bc != 0 (with
 * want_threads work-items when > 0). */
static int fcl_bwd_plan_pick(flashcl_context *ctx, int d, int want_bc, int want_br, int want_threads, int warp,
                             int split, fcl_bwd_plan *p) {
  static const int cand[][2] = {{64, 64}, {64, 32}, {32, 32}, {32, 16}, {16, 16}, {16, 8}, {8, 8},
                                {32, 8}, {24, 16}, {24, 8}, {48, 32}, {48, 48}, {64, 48}, {32, 64}, {64, 16},
                                {48, 40}, {40, 32}, {32, 48}, {56, 32}, {48, 24}};
  const int n_auto = 7; /* the candidates the automatic choice takes from */
  const size_t M = ctx->info.local_mem_size, budget = fcl_local_budget(ctx);
  const int probed = budget > M;
  const size_t fit = want_bc || !probed ? budget : budget / 2 > M ? budget / 2 : M;
  for (size_t i = 0; i < (want_bc ? 1 : (size_t)n_auto); i++) {
    /* A tuning's pair is taken as given (the list above is what flashcl-tune tried). */
    p->bc = want_bc ? want_bc : cand[i][0];
    p->br = want_bc ? want_br : cand[i][1];
    /* The warp-tiled mappings pad the score rows; where that does not fit, this
     * tile pair runs the row-major ones. */
#define FCL_BWD_FITS(bytes) ((bytes) <= fit || (probed && p->bc == 32 && p->br == 32 && (bytes) <= budget))
    p->pad = warp && FCL_BWD_FITS(fcl_bwd_local_bytes(p->br, p->bc, d, 4)) ? 4 : 0;
    if (!FCL_BWD_FITS(fcl_bwd_local_bytes(p->br, p->bc, d, p->pad))) continue;
#undef FCL_BWD_FITS
    p->threads = p->br * p->bc >= 64 ? 64 : p->br * p->bc;
    if (probed && p->br * p->bc >= 1024) {
      const int want = p->bc * d > 40 * 128 ? 256 : 128;
      if (ctx->info.max_work_group_size >= (size_t)want) p->threads = want;
    }
    /* CPUs (PoCL runs a work-group as loops over its work-items, with every value
     * that lives across a barrier in memory): 16 work-items with larger
     * register tiles were clearly faster than 128 (BENCHMARKS.md, PoCL). */
    if (!ctx->info.is_gpu && p->threads > 16) p->threads = 16;
    if (want_threads > 0 && want_threads <= p->br * p->bc) p->threads = want_threads;
    if ((size_t)p->threads > ctx->info.max_work_group_size) continue;
    /* With the halves, the phase A grids and bwd_dkdv's phase B grid cover
     * threads / 2 work-items, and must use all of them (phase B's would
     * otherwise leave a half's tail idle). */
    p->split = split && p->threads % 2 == 0 && fcl_split_exact(p->bc, p->br, p->threads / 2, &p->a_tm, &p->a_tn) &&
               fcl_split_cols(p->bc, d, p->threads / 2, &p->b_tm, &p->b_td) &&
               (p->bc / p->b_tm) * (d / p->b_td) == p->threads / 2 &&
               fcl_split_exact(p->br, p->bc, p->threads / 2, &p->qa_tm, &p->qa_tn);
    const int grid_n = p->split ? p->threads / 2 : p->threads;
    if ((p->split || (fcl_split_exact(p->bc, p->br, p->threads, &p->a_tm, &p->a_tn) &&
                      fcl_split_cols(p->bc, d, p->threads, &p->b_tm, &p->b_td) &&
                      fcl_split_exact(p->br, p->bc, p->threads, &p->qa_tm, &p->qa_tn))) &&
        fcl_split_cols(p->br, d, p->threads, &p->qb_tm, &p->qb_td)) {
      p->a_wq = p->b_wx = p->qa_wk = p->qb_wx = 0;
      if (p->pad) {
        p->a_wq = fcl_bwd_warp_width(p->bc / p->a_tm, p->br / p->a_tn, grid_n);
        p->b_wx = fcl_bwd_warp_width(p->bc / p->b_tm, d / p->b_td, grid_n);
        p->qa_wk = fcl_bwd_warp_width(p->br / p->qa_tm, p->bc / p->qa_tn, grid_n);
        p->qb_wx = fcl_bwd_warp_width(p->br / p->qb_tm, d / p->qb_td, p->threads);
      }
      return 1;
    }
  }
  return 0;
}

/* The bwd tuning the portable kernels read: tu where the portable family runs,
 * else (the tensor-core backward keeps the portable preprocess and dQ store)
 * the default rules. */
const fcl_tuned *fcl_bwd_knobs(const fcl_tuned *tu, fcl_tuned *rules) {
  if (tu && tu->family == FLASHCL_TUNE_BWD) return tu;
  memset(rules, 0, sizeof *rules);
  rules->family = FLASHCL_TUNE_BWD;
  return rules;
}

/* The plan of bwd_dkdv (for_dq = 0) or of bwd_dq (for_dq = 1): the two kernels
 * are built separately when their plans differ. The tuning's bc, br and
 * threads force bwd_dkdv's tiles, and bwd_dq's unless its dq_bc, dq_br and
 * dq_threads do. warp (the warp-tiled mappings with padded score rows) and
 * split (work-group halves, one product each) shape the plan; both default to
 * 0, and the H100's file turns them on. A forced plan that does not fit or
 * map returns 0 (the caller refuses a per-call tuning and falls back to the
 * rule for a database entry). */
int fcl_bwd_make_plan(flashcl_context *ctx, const fcl_tuned *tu, int d, int for_dq, fcl_bwd_plan *p) {
  const int warp = fcl_tuned_get(tu, FCL_BWD_WARP, 0), split = fcl_tuned_get(tu, FCL_BWD_SPLIT, 0);
  int want_bc = fcl_tuned_get(tu, FCL_BWD_BC, 0), want_br = fcl_tuned_get(tu, FCL_BWD_BR, 0);
  int want_threads = fcl_tuned_get(tu, FCL_BWD_THREADS, 0);
  if (for_dq) {
    want_bc = fcl_tuned_get(tu, FCL_BWD_DQ_BC, want_bc);
    want_br = fcl_tuned_get(tu, FCL_BWD_DQ_BR, want_br);
    want_threads = fcl_tuned_get(tu, FCL_BWD_DQ_THREADS, want_threads);
  }
  if (want_bc || want_br) {
    /* One of the pair given: the other from the rule's choice for this d. */
    fcl_bwd_plan r;
    if ((!want_bc || !want_br) && fcl_bwd_plan_pick(ctx, d, 0, 0, 0, warp, split, &r)) {
      if (!want_bc) want_bc = r.bc;
      if (!want_br) want_br = r.br;
    }
    return want_bc && want_br && fcl_bwd_plan_pick(ctx, d, want_bc, want_br, want_threads, warp, split, p);
  }
  return fcl_bwd_plan_pick(ctx, d, 0, 0, want_threads, warp, split, p);
}
