/* The flash backward path.
 *
 * Flash backward runs three kernels: D = rowsum(dO * O) (which also zeroes the
 * atomic-mode dQ accumulator), then dK/dV with K/V
 * resident, then dQ with Q resident (deterministic mode) or, in atomic mode, dQ
 * accumulated in fp32 by the dK/dV kernel and converted at the end. Scratch is
 * O(N): D, plus the fp32 dQ accumulator in atomic mode (or its splits, a
 * device-dependent number of copies, in the tensor-core deterministic mode).
 *
 * On NVIDIA devices that passed the tensor-core probe (src/nvidia/mma_forward.c), the
 * dK/dV and dQ kernels are the mma.sync ones of cl/nvidia/flash_bwd_mma.cl
 * (src/nvidia/mma_backward.c) whenever the problem is covered; D, the scratch and the
 * atomic-mode dQ conversion stay the same.
 *
 * In deterministic mode the dK/dV and dQ kernels are independent (neither
 * reads the other's output; both read D): on GPUs dQ goes to a second queue
 * of the context so that they overlap, and a barrier on the caller's queue
 * joins them. On the tensor-core path, where the device can be filled that way,
 * deterministic mode instead has the dK/dV kernel accumulate dQ into split
 * accumulators with one writer per element (DQ_SPLITS in cl/nvidia/flash_bwd_mma.cl),
 * converted like the atomic one: the same bits on every run, at the atomic
 * mode's arithmetic plus `splits` accumulators rather than a second pass over
 * K and V.
 *
 * Every choice of the portable kernels is a parameter of the bwd tuning
 * (src/core/tuning_space.c), read by the functions below with the default rule each
 * one states; the choices measured on the H100 are its built-in tuning file
 * (tuning/nvidia-h100.tune). With verbose >= 2 the portable kernels' build log
 * and resource figures go to stderr at each launch set-up (with the build
 * option -cl-nv-verbose on NVIDIA: registers). */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"
#include "portable/portable.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fcl_bwd_sizes {
  size_t dsum;   /* floats of D */
  size_t dq_acc; /* floats of the fp32 dQ accumulators (0 with the separate dQ kernel) */
} fcl_bwd_sizes;

/* How dQ is made. atomic: desc->deterministic == 0, and on return whether the
 * atomic dQ runs; *splits: the accumulator copies the dK/dV kernel fills (1 in
 * atomic mode; in deterministic mode on the tensor-core path, the split count
 * of src/nvidia/mma_backward.c; 0 when the separate dQ kernel runs). */
static void fcl_bwd_mode(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int use_mma, int *atomic,
                         int *splits) {
  /* deterministic = 0 permits the atomic dQ; where the tensor-core atomic dQ tile
   * does not divide the head dim, the tensor-core deterministic kernels run (faster
   * than the portable ones, and bit-reproducible). */
  if (use_mma && *atomic && !fcl_mma_bwd_covered(ctx, p, 1)) {
    fcl_log(ctx, "tensor-core atomic dQ has no tile for head_dim %d: running the deterministic dQ kernel",
            p->head_dim);
    *atomic = 0;
  }
  *splits = *atomic ? 1 : use_mma ? fcl_mma_bwd_dq_splits(ctx, p, tu) : 0;
}

static flashcl_status fcl_bwd_sizes_of(flashcl_context *ctx, const fcl_problem *p, int splits, fcl_bwd_sizes *z,
                                       size_t *bytes) {
  size_t t;
  int ok = fcl_mul_size((size_t)p->batch * (size_t)p->heads_q, (size_t)p->seqlen_q, &z->dsum);
  z->dq_acc = 0;
  if (splits) ok = ok && fcl_mul_size(z->dsum, (size_t)p->head_dim, &t) && fcl_mul_size(t, (size_t)splits, &z->dq_acc);
  ok = ok && fcl_add_size(z->dsum, z->dq_acc, &t) && fcl_mul_size(t, sizeof(float), bytes);
  if (!ok) return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "backward workspace size overflows size_t");
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_flash_backward_workspace(flashcl_context *ctx, const fcl_problem *p, int atomic,
                                            const fcl_tuned *tu, size_t *bytes) {
  fcl_bwd_sizes z;
  int splits;
  fcl_bwd_mode(ctx, p, tu, tu && tu->family == FLASHCL_TUNE_MMA_BWD, &atomic, &splits);
  return fcl_bwd_sizes_of(ctx, p, splits, &z, bytes);
}

/* Tiles and work-item grids of the backward kernels (see cl/portable/flash_bwd.cl). */
typedef struct fcl_bwd_plan {
  int br, bc, threads;
  int a_tm, a_tn, b_tm, b_td;     /* bwd_dkdv */
  int qa_tm, qa_tn, qb_tm, qb_td; /* bwd_dq */
  int pad;                        /* SCORE_PAD */
  int a_wq, b_wx, qa_wk, qb_wx;   /* warp-tiled mappings, 0 = row-major */
  int split;                      /* halves (BWD_SPLIT): A_*, B_* and QA_* cover threads / 2 */
} fcl_bwd_plan;

/* K, V, Q and dO tiles (rows padded by 4 floats), bwd_dkdv's two Bc x Br score
 * tiles (bwd_dq has one), each row `pad` floats longer, LSE and D per query
 * row, and the 16-float gaps before V and dO of BWD_SHFL. */
static size_t fcl_bwd_local_bytes(int br, int bc, int d, int pad) {
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
 * one per entry: on the H100 (N = 4096, f16) 64 beat 128 by 14% at d = 128 (16x16
 * tiles: 112.0 against 130.7 ms) and 5% at d = 64 (32x32: 81.9 against 86.1 ms),
 * and 32 was slower than either.
 *
 * Where the device runs work-groups with more local memory than it reports
 * (src/core/probe.c), the tiles are planned against half of that budget (so that two
 * work-groups share a compute unit) or M, whichever is larger, except that 32x32
 * is taken whenever the whole budget holds it: smaller tiles give each work-item
 * too little reuse. Score tiles of 1024 entries or more get 128 work-items, or
 * 256 where 128 would each hold more than 40 of the Bc x d values of dK (and of
 * dV; 32 at d = 128 and 40 at d = 80 ran best at 128, 48 at d = 192 and 64 at
 * d = 256 at 256). On the H100 (160 KiB budget, f16, N = 4096) this gives:
 *   d = 64:  64x32, 128 work-items: 75.3 ms (the 48 KiB plan, 32x32 at 64: 80.8;
 *            64x64 80.2; 64x32 at 64 work-items 95.3); d = 80: 64x32, 128: 84.5
 *            (the 48 KiB plan: 103.4);
 *   d = 128: 32x32, 128: 89.7 (16x16 at 64: 112-113; 32x32 at 64 / 256: 98.7 /
 *            93.1; 64x32 94.8; 48x32, which needs more than half, 85.6);
 *   d = 192: 32x32, 256: 86.9 (half the budget alone gave 32x16 at 64: 171.9;
 *            32x32 at 128: 92.1);
 *   d = 256: 32x32, 256: 115.3 (16x16 at 64: 148.4, at 128: 142.6; 32x16 at
 *            128: 121.8).
 * These figures predate the thirteenth session's kernel changes (P and dS
 * transposed, read four at a time). With them, on NVIDIA platforms d = 128
 * took 48x32 at 256 work-items; since the fourteenth session dK/dV and dQ get
 * separate plans there (48x32 and 32x64 at 128; the measurements are at the exception in the
 * code); d = 64 keeps 64x32 at 128 (65.8 ms; 64x32 at 256 77.4, 32x32 at 128
 * 75.5; 59.6 once the tiles were read in two halves, c29e15b). */
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
     * register tiles were 1.3-1.4x faster than 128 (N = 1024-2048, d = 64). */
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
static const fcl_tuned *fcl_bwd_knobs(const fcl_tuned *tu, fcl_tuned *rules) {
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
static int fcl_bwd_make_plan(flashcl_context *ctx, const fcl_tuned *tu, int d, int for_dq, fcl_bwd_plan *p) {
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

/* The arguments bwd_dkdv and bwd_dq share after their tensors and scratch. */
static void fcl_bwd_shared_args(fcl_args *a, const fcl_problem *p, int group, cl_mem cu_q, cl_mem cu_k, int tq,
                                int tk) {
  fcl_arg_int(a, p->seqlen_q);
  fcl_arg_int(a, p->seqlen_k);
  fcl_arg_int(a, p->heads_q);
  fcl_arg_int(a, group);
  fcl_arg_float(a, p->scale);
  fcl_arg_mem(a, cu_q);
  fcl_arg_mem(a, cu_k);
  fcl_arg_int(a, tq);
  fcl_arg_int(a, tk);
  fcl_arg_dropout(a, p);
  fcl_arg_variants(a, p);
  if (p->mask_kind) fcl_arg_mask(a, p); /* only built with -DMASK */
}

/* The portable kernels' build switches for one plan, from the bwd tuning.
 * Rules where the tuning says nothing: ahead, unroll and ftz 0; red (four
 * floats per red.global.add.v4.f32, inline PTX) where the device is sm_90 or
 * newer and passed the tensor-core probe; shfl (phase A halves as warp halves
 * swapping S and dP through shfl.sync) and nbar (the dP half makes dS behind a
 * named barrier) 0, and never where the PTX, the plan or the problem does not
 * allow them: shfl needs the halves on whole warps and an even A_TN; nbar the
 * work-group halves on whole warps, no warp halves, no softcap (whose dS
 * factor only the S half knows) and no dropout (measured slower with it:
 * 45.4 -> 49.3 ms at d = 128 on the H100). */
typedef struct fcl_bwd_switches {
  int ahead, red, unroll, ftz, shfl, nbar;
} fcl_bwd_switches;

static fcl_bwd_switches fcl_bwd_switches_of(flashcl_context *ctx, const fcl_tuned *tu, const fcl_problem *p,
                                            const fcl_bwd_plan *bp, int acc_dq) {
  fcl_bwd_switches w;
  const int ptx = bp->split && fcl_tuned_get(tu, FCL_BWD_SHFL, 0) + fcl_tuned_get(tu, FCL_BWD_NBAR, 0) > 0 &&
                  fcl_mma_available(ctx);
  w.ahead = fcl_tuned_get(tu, FCL_BWD_AHEAD, 0);
  w.unroll = fcl_tuned_get(tu, FCL_BWD_UNROLL, 0);
  w.ftz = fcl_tuned_get(tu, FCL_BWD_FTZ, 0);
  w.red = acc_dq && fcl_tuned_get(tu, FCL_BWD_RED, 1) && fcl_mma_available(ctx) && ctx->mma_cc >= 90;
  w.shfl = ptx && fcl_tuned_get(tu, FCL_BWD_SHFL, 0) && bp->threads % 32 == 0 && bp->a_tn % 2 == 0;
  w.nbar = ptx && !w.shfl && fcl_tuned_get(tu, FCL_BWD_NBAR, 0) && (bp->threads / 2) % 32 == 0 &&
           !(p->softcap > 0.0f) && !p->dropout;
  return w;
}

/* The build options of the portable backward kernels for one plan. */
static void fcl_bwd_options(flashcl_context *ctx, const fcl_tuned *tu, const fcl_problem *p, const fcl_bwd_plan *bp,
                            int acc_dq, int dq_vec, int vec_aligned, char *opts, size_t size) {
  char variants[64];
  fcl_variant_options(p, variants, sizeof variants);
  const char *extra = ctx->build_options;
  const fcl_bwd_switches w = fcl_bwd_switches_of(ctx, tu, p, bp, acc_dq);
  snprintf(opts, size,
           "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_R=%d -DBLOCK_C=%d -DNTHREADS=%d -DA_TM=%d -DA_TN=%d "
           "-DB_TM=%d -DB_TD=%d -DQA_TM=%d -DQA_TN=%d -DQB_TM=%d -DQB_TD=%d -DCAUSAL=%d -DVARLEN=%d -DATOMIC_DQ=%d "
           "-DDQ_VEC=%d -DDROPOUT=%d -DBWD_AHEAD=%d -DVEC_ALIGNED=%d -DSCORE_PAD=%d -DA_WQ=%d -DB_WX=%d -DQA_WK=%d "
           "-DQB_WX=%d -DNV_RED=%d -DBWD_SPLIT=%d -DBWD_SHFL=%d -DBWD_NBAR=%d -DBWD_UNROLL=%d%s%s%s%s",
           (int)p->dtype, p->head_dim, bp->br, bp->bc, bp->threads, bp->a_tm, bp->a_tn, bp->b_tm, bp->b_td,
           bp->qa_tm, bp->qa_tn, bp->qb_tm, bp->qb_td, p->causal && !p->window, p->varlen, acc_dq, dq_vec,
           p->dropout, w.ahead, vec_aligned, bp->pad, bp->a_wq, bp->b_wx, bp->qa_wk, bp->qb_wx, w.red, bp->split,
           w.shfl, w.nbar, w.unroll, w.ftz ? " -cl-denorms-are-zero" : "", variants, extra ? " " : "",
           extra ? extra : "");
}

/* Everything a backward call runs, decided before anything is enqueued. */
typedef struct fcl_bwd_run {
  int use_mma, atomic, splits, acc_dq, concurrent;
  fcl_bwd_plan bp, bq; /* bwd_dkdv's and bwd_dq's (bq only where bwd_dq runs) */
  const fcl_tuned *knobs;
  fcl_tuned rules;
} fcl_bwd_run;

/* Records the portable family's values as they will run. The knobs of the
 * kernel a dQ mode does not run (dq_*, concurrent with the atomic dQ; red with
 * the separate dQ kernel) are recorded as configured. */
static void fcl_bwd_record(flashcl_context *ctx, const fcl_problem *p, fcl_bwd_run *r, fcl_tuned *tu) {
  const fcl_bwd_switches w = fcl_bwd_switches_of(ctx, r->knobs, p, &r->bp, r->acc_dq);
  const int a = r->acc_dq;
  const int ran[FCL_BWD_COUNT] = {r->bp.bc, r->bp.br, r->bp.threads,
                                  a ? fcl_tuned_get(tu, FCL_BWD_DQ_BC, r->bp.bc) : r->bq.bc,
                                  a ? fcl_tuned_get(tu, FCL_BWD_DQ_BR, r->bp.br) : r->bq.br,
                                  a ? fcl_tuned_get(tu, FCL_BWD_DQ_THREADS, r->bp.threads) : r->bq.threads,
                                  r->bp.pad > 0, r->bp.split, w.unroll, w.ftz, w.ahead,
                                  a ? w.red : fcl_tuned_get(tu, FCL_BWD_RED, w.red), w.shfl, w.nbar, r->concurrent};
  for (int i = 0; i < FCL_BWD_COUNT; i++) fcl_tuned_ran(tu, i, ran[i]);
}

static flashcl_status fcl_bwd_prepare(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                      fcl_tuned *tu, fcl_bwd_run *r) {
  r->use_mma = tu->family == FLASHCL_TUNE_MMA_BWD;
  r->atomic = !desc->deterministic;
  fcl_bwd_mode(ctx, p, tu, r->use_mma, &r->atomic, &r->splits);
  r->acc_dq = r->splits > 0;
  r->knobs = fcl_bwd_knobs(tu, &r->rules);
  memset(&r->bq, 0, sizeof r->bq);
  int ok = fcl_bwd_make_plan(ctx, r->knobs, p->head_dim, 0, &r->bp) &&
           (r->acc_dq || r->use_mma ? (r->bq = r->bp, 1) : fcl_bwd_make_plan(ctx, r->knobs, p->head_dim, 1, &r->bq));
  if (!ok && r->knobs == tu && tu->source != FLASHCL_TUNING_SOURCE_DEFAULT) {
    if (tu->source == FLASHCL_TUNING_SOURCE_CALL)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "bwd tuning refused: its tiles for head_dim %d do not fit %zu "
                      "bytes of local memory or map to the work-items", p->head_dim, fcl_local_budget(ctx));
    fcl_log(ctx, "bwd tuning from %s ignored (its tiles do not fit or map): the default rule runs", tu->origin);
    memset(tu->set, 0, sizeof tu->set);
    memset(tu->call, 0, sizeof tu->call);
    tu->source = FLASHCL_TUNING_SOURCE_DEFAULT;
    ok = fcl_bwd_make_plan(ctx, r->knobs, p->head_dim, 0, &r->bp) &&
         (r->acc_dq || r->use_mma ? (r->bq = r->bp, 1) : fcl_bwd_make_plan(ctx, r->knobs, p->head_dim, 1, &r->bq));
  }
  if (!ok)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "backward tiles for head_dim %d do not fit in %zu bytes of local memory",
                    p->head_dim, fcl_local_budget(ctx));
  /* On a GPU each kernel ends in a partly filled wave that the other can fill;
   * on a CPU device both would only compete for the same cores. */
  r->concurrent = fcl_tuned_get(r->knobs, FCL_BWD_CONCURRENT, ctx->info.is_gpu);
  if (r->use_mma) {
    flashcl_config unused;
    return fcl_mma_bwd_report(ctx, p, r->atomic, r->splits, tu, &unused);
  }
  fcl_bwd_record(ctx, p, r, tu);
  return fcl_tuned_honoured(ctx, tu);
}

flashcl_status fcl_bwd_config(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                              fcl_tuned *tu, flashcl_config *c) {
  fcl_bwd_run r;
  flashcl_status st = fcl_bwd_prepare(ctx, p, desc, tu, &r);
  if (st != FLASHCL_SUCCESS) return st;
  if (r.use_mma) return fcl_mma_bwd_report(ctx, p, r.atomic, r.splits, tu, c);
  fcl_tuned_report(tu, c);
  snprintf(c->kernel, sizeof c->kernel, "bwd_dkdv");
  c->block_r = r.bp.br;
  c->block_c = r.bp.bc;
  c->threads = r.bp.threads;
  c->local_bytes = fcl_bwd_local_bytes(r.bp.br, r.bp.bc, p->head_dim, r.bp.pad);
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_flash_backward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                  fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                  const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                  const flashcl_tensor *d_o, const flashcl_tensor *dq, const flashcl_tensor *dk,
                                  const flashcl_tensor *dv, cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  fcl_bwd_run r;
  flashcl_status st = fcl_bwd_prepare(ctx, p, desc, tu, &r);
  if (st != FLASHCL_SUCCESS) return st;
  (void)o;
  const int use_mma = r.use_mma, atomic = r.atomic, splits = r.splits;
  /* Whether dQ comes out of the fp32 accumulator(s) that bwd_dq_store converts. */
  const int acc_dq = r.acc_dq;
  const fcl_bwd_plan bp = r.bp, bq = r.bq;
  fcl_bwd_sizes z;
  size_t bytes;
  st = fcl_bwd_sizes_of(ctx, p, splits, &z, &bytes);
  if (st != FLASHCL_SUCCESS) return st;
  if (bytes > ctx->info.max_mem_alloc_size)
    return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY, "backward scratch of %zu bytes exceeds the device's %llu-byte buffer limit",
                    bytes, (unsigned long long)ctx->info.max_mem_alloc_size);

  char opts[1024], opts_dq[1024];
  const int vec = fcl_vec_aligned(q) && fcl_vec_aligned(k) && fcl_vec_aligned(v) && fcl_vec_aligned(d_o);
  fcl_bwd_options(ctx, r.knobs, p, &bp, acc_dq, acc_dq && fcl_rows_aligned16(dq), vec, opts, sizeof opts);
  fcl_bwd_options(ctx, r.knobs, p, &bq, acc_dq, acc_dq && fcl_rows_aligned16(dq), vec, opts_dq, sizeof opts_dq);
  /* Dropout and masks bring their helper files into the program. */
  static const char *const srcs[4] = {
      "dtype.cl+seq_bounds.cl+flash_bwd.cl", "philox.cl+dtype.cl+seq_bounds.cl+flash_bwd.cl",
      "mask.cl+dtype.cl+seq_bounds.cl+flash_bwd.cl", "philox.cl+mask.cl+dtype.cl+seq_bounds.cl+flash_bwd.cl"};
  const char *src = srcs[(p->dropout ? 1 : 0) + (p->mask_kind ? 2 : 0)];
  /* The preprocess and the atomic-mode dQ store are shared by both families. */
  cl_kernel k_pre, k_dkdv = NULL, k_dq = NULL;
  fcl_mma_bwd_launch mma;
  if ((st = fcl_get_kernel(ctx, src, opts, "bwd_preprocess", &k_pre)) ||
      (acc_dq && (st = fcl_get_kernel(ctx, src, opts, "bwd_dq_store", &k_dq))))
    return st;
  if (use_mma) {
    if ((st = fcl_mma_backward_kernels(ctx, p, tu, atomic, atomic ? 0 : splits, &mma))) return st;
    k_dkdv = mma.dkdv;
    if (!acc_dq) k_dq = mma.dq;
  } else if ((st = fcl_get_kernel(ctx, src, opts, "bwd_dkdv", &k_dkdv)) ||
             (!acc_dq && (st = fcl_get_kernel(ctx, src, opts_dq, "bwd_dq", &k_dq)))) {
    return st;
  }
  if (!use_mma && ctx->verbose >= 2) {
    fcl_print_build_log(ctx, k_dkdv, "bwd_dkdv", opts);
    if (!acc_dq) fcl_print_build_log(ctx, k_dq, "bwd_dq", opts_dq);
  }
  /* Every portable kernel must take its planned work-group before anything is
   * enqueued, so that a refusal never leaves dK/dV written and dQ not. */
  {
    const cl_kernel ks[3] = {k_pre, use_mma ? NULL : k_dkdv, use_mma && !acc_dq ? NULL : k_dq};
    static const char *kn[3] = {"bwd_preprocess", "bwd_dkdv", "bwd_dq"};
    const size_t want[3] = {64, (size_t)bp.threads, acc_dq ? 0 : (size_t)bq.threads};
    for (int i = 0; i < 3; i++) {
      size_t kwg = 0;
      if (ks[i] && want[i] &&
          clGetKernelWorkGroupInfo(ks[i], ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) ==
              CL_SUCCESS &&
          kwg < want[i])
        return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                        "%s needs %zu work-items per work-group but the compiled kernel allows %zu", kn[i], want[i],
                        kwg);
    }
  }

  cl_int err;
  cl_mem dsum = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, z.dsum * sizeof(float), NULL, &err);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "allocating the backward scratch (D)");
  cl_mem acc = NULL;
  if (acc_dq) {
    acc = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, z.dq_acc * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) {
      clReleaseMemObject(dsum);
      return fcl_cl_fail(ctx, err, "allocating the backward scratch (dQ accumulator)");
    }
  }
  const cl_mem cu_q = p->varlen ? desc->cu_seqlens_q : NULL, cu_k = p->varlen ? desc->cu_seqlens_k : NULL;
  const int tq = (int)q->shape[1], tk = (int)k->shape[1], group = p->heads_q / p->heads_kv;
  cl_event pre_done = NULL; /* D is ready (and the dQ accumulators zeroed) */
  size_t local[3] = {(size_t)bp.threads, 1, 1};

  fcl_args a = {k_pre, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, o);
  fcl_arg_tensor(&a, d_o);
  fcl_arg_mem(&a, dsum);
  fcl_arg_mem(&a, acc); /* zeroed by the preprocess (every split) */
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->heads_q);
  fcl_arg_mem(&a, cu_q);
  fcl_arg_int(&a, tq);
  fcl_arg_int(&a, splits);
  if (a.err != CL_SUCCESS) {
    st = fcl_cl_fail(ctx, a.err, "clSetKernelArg(bwd_preprocess)");
    goto done;
  }
  /* cl/portable/flash_bwd.cl bwd_preprocess: 64 work-items, HEAD_DIM / 8 per row. */
  const size_t pre_rows = (size_t)(64 / (p->head_dim / 8));
  size_t g_pre[3] = {((size_t)p->seqlen_q + pre_rows - 1) / pre_rows * 64, (size_t)p->heads_q, (size_t)p->batch};
  size_t l_pre[3] = {64, 1, 1};
  err = clEnqueueNDRangeKernel(ctx->queue, k_pre, 3, NULL, g_pre, l_pre, nwait, nwait ? wait : NULL, &pre_done);
  if (err != CL_SUCCESS) {
    st = fcl_cl_fail(ctx, err, "enqueue bwd_preprocess");
    goto done;
  }

  a = (fcl_args){k_dkdv, 0, CL_SUCCESS};
  if (use_mma) {
    a.err = fcl_mma_backward_args(&mma, p, desc, q, k, v, lse, d_o, dq, dk, dv, dsum, acc);
  } else {
    fcl_arg_bwd_dkdv_head(&a, q, k, v, d_o, dk, dv, lse, dsum, acc);
    fcl_bwd_shared_args(&a, p, group, cu_q, cu_k, tq, tk);
  }
  if (a.err != CL_SUCCESS) {
    st = fcl_cl_fail(ctx, a.err, "clSetKernelArg(bwd_dkdv)");
    goto done;
  }
  size_t kblocks = ((size_t)p->seqlen_k + bp.bc - 1) / bp.bc;
  size_t g_kv[3] = {kblocks * bp.threads, (size_t)p->heads_kv, (size_t)p->batch};
  cl_event dkdv_done = NULL;
  cl_command_queue side = !acc_dq && r.concurrent ? fcl_side_queue(ctx) : NULL;
  err = clEnqueueNDRangeKernel(ctx->queue, k_dkdv, 3, NULL, use_mma ? mma.global_dkdv : g_kv,
                               use_mma ? mma.local : local, 1, &pre_done,
                               acc_dq || side ? &dkdv_done : NULL);
  if (err != CL_SUCCESS) {
    st = fcl_cl_fail(ctx, err, "enqueue bwd_dkdv");
    goto done;
  }

  a = (fcl_args){k_dq, 0, CL_SUCCESS};
  if (acc_dq) {
    fcl_arg_mem(&a, acc);
    fcl_arg_tensor(&a, dq);
    fcl_arg_int(&a, p->seqlen_q);
    fcl_arg_int(&a, p->heads_q);
    fcl_arg_mem(&a, cu_q);
    fcl_arg_int(&a, tq);
    fcl_arg_int(&a, splits);
  } else if (!use_mma) { /* bwd_dq_mma got its arguments with bwd_dkdv_mma's */
    fcl_arg_bwd_dq_head(&a, q, k, v, d_o, dq, lse, dsum);
    fcl_bwd_shared_args(&a, p, group, cu_q, cu_k, tq, tk);
  }
  if (a.err != CL_SUCCESS) {
    if (dkdv_done) clReleaseEvent(dkdv_done);
    st = fcl_cl_fail(ctx, a.err, "clSetKernelArg(dQ)");
    goto done;
  }
  if (acc_dq) {
    size_t g[3] = {(size_t)p->head_dim / 8, (size_t)p->seqlen_q, (size_t)p->batch * p->heads_q};
    /* The last command must cover dK/dV too: on an out-of-order queue waiting on
     * the dK/dV event is what orders it. */
    err = clEnqueueNDRangeKernel(ctx->queue, k_dq, 3, NULL, g, NULL, 1, &dkdv_done, out_event);
    clReleaseEvent(dkdv_done);
  } else {
    size_t qblocks = ((size_t)p->seqlen_q + bq.br - 1) / bq.br;
    size_t g[3] = {qblocks * bq.threads, (size_t)p->heads_q, (size_t)p->batch};
    size_t local_dq[3] = {(size_t)bq.threads, 1, 1};
    cl_event parts[2] = {NULL, dkdv_done};
    /* With a side queue, dQ runs beside dK/dV: the flushes make the events
     * visible across the queues (OpenCL requires it), and the barrier joins dQ
     * back into the caller's queue, so that its later commands and out_event
     * come after all three gradients. */
    if (side && (err = clFlush(ctx->queue)) != CL_SUCCESS) side = NULL;
    err = clEnqueueNDRangeKernel(side ? side : ctx->queue, k_dq, 3, NULL, use_mma ? mma.global_dq : g,
                                 use_mma ? mma.local : local_dq, 1, &pre_done, &parts[0]);
    const int dq_on_side = side && err == CL_SUCCESS;
    if (dq_on_side) err = clFlush(side);
    if (err == CL_SUCCESS && (side || out_event)) {
      /* Join dQ with dK/dV (enqueued earlier) for the caller's event. */
      err = side ? clEnqueueBarrierWithWaitList(ctx->queue, 2, parts, out_event)
                 : clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, out_event);
    }
    /* dQ was enqueued but could not be joined into the caller's queue: finish it
     * here, so that it never writes dq after the caller's next commands. */
    if (err != CL_SUCCESS && dq_on_side) clFinish(side);
    if (parts[0]) clReleaseEvent(parts[0]);
    if (dkdv_done) clReleaseEvent(dkdv_done);
  }
  if (err != CL_SUCCESS) st = fcl_cl_fail(ctx, err, "enqueue dQ");

done:
  if (pre_done) clReleaseEvent(pre_done);
  if (acc) clReleaseMemObject(acc);
  clReleaseMemObject(dsum);
  return st;
}
