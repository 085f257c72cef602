/* The Hopper tensor-core dK/dV kernels (cl/nvidia/flash_bwd_wgmma.cl up to
 * d = 128, cl/nvidia/flash_bwd_wgmma_wide.cl past it): coverage, build and
 * launch shape. It is a faster kernel inside the mma_bwd family, as
 * the wgmma forward is inside NVIDIA_MMA: fcl_mma_backward_kernels
 * (src/nvidia/mma_backward.c) swaps it in for bwd_dkdv_mma where
 * fcl_wgmma_bwd_wanted says so, with the same arguments, and bwd_dq_wgmma for
 * bwd_dq_mma in the deterministic mode without split accumulators.
 *
 * Coverage: the wgmma forward's device test (compute capability 9.0, its probe
 * passed), fp16/bf16, head_dim a multiple of 8 up to 256 (equal for q/k and v;
 * the kernels pad it to a multiple of 64 in local memory, never in the
 * caller's; past 128 the dK/dV kernel is flash_bwd_wgmma_wide.cl, with the
 * atomic dQ (or split accumulators where the tuning asks) or none, the
 * deterministic dQ then from bwd_dq_wgmma built with DQ_ONLY), and the tiles
 * within the local memory the device takes; attention masks test
 * every bit (no all-zero tile is skipped, as bwd_dkdv_mma does). The mma_bwd
 * tuning's `wgmma` (rule: 1) turns it off. A build failure is logged and
 * turns these kernels off for the context; the call is then chosen again
 * (src/attention/backward.c). */
#include "core/internal.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"

#include <stdio.h>
#include <string.h>

/* The width of the tiles in local memory (the kernels' DPAD). */
static size_t fcl_wgmma_dpad(int head_dim) { return head_dim <= 64 ? 64 : ((size_t)head_dim + 63) / 64 * 64; }
/* Queries per streamed tile: the pair whose accumulators fit 255 registers. */
static int fcl_wgmma_bwd_block_r(int head_dim) { return fcl_wgmma_dpad(head_dim) == 64 ? 128 : 64; }
/* Keys per work-group: 64 per warpgroup up to d = 128, 64 shared past it. */
static int fcl_wgmma_bwd_keys(int head_dim) { return head_dim > 128 ? 64 : 128; }

/* bwd_dq_wgmma's local memory: Q and dO (64 nwg rows), two K | V stages. */
static size_t fcl_wgmma_dq_local(int head_dim, int nwg, int block_c) {
  const size_t d = fcl_wgmma_dpad(head_dim);
  return 2 * (size_t)nwg * 64 * d * 2 + 4 * (size_t)block_c * d * 2 + 1008;
}

/* The kernels' local memory: K and V (128 keys), two Q | dO tile pairs, the
 * dS^T tile in atomic mode, the staged dQ rows with bulk, LSE and D of two
 * tiles, 1008 bytes of alignment; without atomics the larger of that and
 * bwd_dq_wgmma's with dq_nwg x dq_block_c tiles. */
static size_t fcl_wgmma_bwd_local(int head_dim, int atomic, int bulk, int dq_nwg, int dq_block_c) {
  const size_t d = fcl_wgmma_dpad(head_dim), br = (size_t)fcl_wgmma_bwd_block_r(head_dim);
  /* Past d = 128: K, V, two Q | dO pairs of 64 rows, dS^T, the handed-over P^T, LSE and D. */
  const size_t dkdv = head_dim > 128 ? 6 * 64 * d * 2 + 64 * 64 * 2 + 32 * 128 * 4 + 4 * 64 * 4 + 1008
                                     : 2 * 128 * d * 2 + 4 * br * d * 2 + (atomic ? 128 * br * 2 : 0) +
                                           (bulk ? br * (d * 4 + 32) : 0) + 4 * br * 4 + 1008;
  const size_t dq = fcl_wgmma_dq_local(head_dim, dq_nwg, dq_block_c);
  return atomic || dkdv > dq ? dkdv : dq;
}

/* Whether the atomic dQ (one accumulator; not the deterministic splits) is
 * staged for bulk reductions: the mma_bwd tuning's bulk_dq, else where the
 * staging fits the largest local memory the device takes (fcl_local_limit:
 * 227 KiB on an H100). */
int fcl_wgmma_bwd_bulk(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int atomic, int splits) {
  (void)splits; /* the atomic mode's single accumulator (callers pass 0 or 1) */
  if (!atomic || p->head_dim > 128) return 0; /* the wide kernel adds with red.global */
  if (tu && !fcl_tuned_get(tu, FCL_MMAB_BULK_DQ, 1)) return 0;
  return fcl_wgmma_bwd_local(p->head_dim, 1, 1, 0, 0) <= fcl_local_limit(ctx);
}

/* bwd_dq_wgmma's warpgroups and key tile: the mma_bwd tuning's, else the rule's
 * 3 x 64 (faster than 2 x 64 at d = 64 and 128 on the H100: BENCHMARKS.md,
 * "Twenty-fourth session"), else 2 x 64: the first that the registers (128
 * keys only with up to 2 warpgroups) and the local memory the device takes
 * allow. */
void fcl_wgmma_dq_tiles(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int *nwg, int *block_c) {
  const int tn = tu ? fcl_tuned_get(tu, FCL_MMAB_DQ_NWG, 3) : 3, tb = tu ? fcl_tuned_get(tu, FCL_MMAB_DQ_BLOCK_C, 64) : 64;
  const int wide = p->head_dim > 128; /* dQ's d / 2 registers leave room for 2 warpgroups of 64-key tiles */
  const int cand[5][2] = {{tn, tb}, {3, 64}, {2, 64}, {2, 32}, {1, 64}};
  for (int i = 0; i < 5; i++) {
    const int n = cand[i][0], bc = cand[i][1];
    *nwg = n;
    *block_c = bc;
    if (n >= 1 && n <= (wide ? 2 : 3) && (bc == 32 || bc == 64 || (bc == 128 && n <= 2 && !wide)) &&
        fcl_wgmma_dq_local(p->head_dim, n, bc) <= fcl_local_limit(ctx))
      return;
    if (i == 0 && tu && (fcl_tuned_has(tu, FCL_MMAB_DQ_NWG) || fcl_tuned_has(tu, FCL_MMAB_DQ_BLOCK_C)))
      fcl_log(ctx, "mma_bwd dq_nwg = %d, dq_block_c = %d from %s do not fit bwd_dq_wgmma: the rule runs", n, bc,
              tu->origin);
  }
}

int fcl_wgmma_bwd_wanted(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int atomic) {
  if (p->head_dim % 8 || p->head_dim > 256) return 0;
  if (p->head_dim_v != p->head_dim || p->paged_kv) return 0;
  if (p->dtype != FLASHCL_F16 && p->dtype != FLASHCL_BF16) return 0;
  if (tu && !fcl_tuned_get(tu, FCL_MMAB_WGMMA, 1)) return 0;
  /* The smallest dQ tiles (2 x 64, past d = 128 2 x 32) must fit; fcl_wgmma_dq_tiles picks within the limit. */
  if (ctx->wgmma_bwd_failed ||
      fcl_wgmma_bwd_local(p->head_dim, atomic, 0, 2, p->head_dim > 128 ? 32 : 64) > fcl_mma_local_cap(ctx, p->head_dim))
    return 0;
  return fcl_wgmma_available(ctx);
}

/* Sets L's kernels to bwd_dkdv_wgmma (and bwd_dq_wgmma for the deterministic
 * dQ without splits) with their launch shapes and returns 1; on a build
 * failure logs it, clears the error, turns the kernels off for the context and
 * returns 0. */
int fcl_wgmma_bwd_build(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int atomic, int splits,
                        fcl_mma_bwd_launch *L) {
  const int vec_red = tu ? fcl_tuned_get(tu, FCL_MMAB_VEC_RED, 1) != 0 : 1; /* sm_90 has red.v2 */
  const int bulk = fcl_wgmma_bwd_bulk(ctx, p, tu, atomic, splits);
  int dq_nwg, dq_bc;
  fcl_wgmma_dq_tiles(ctx, p, tu, &dq_nwg, &dq_bc);
  const char *extra = ctx->build_options;
  char opts[640], variants[128], src[192], tiles[160], dq_src[192], dq_opts[680];
  fcl_variant_options(p, variants, sizeof variants);
  const int causal = p->causal && !p->window; /* a window carries causal as window_right = 0 */
  const int wide = p->head_dim > 128; /* dK/dV from flash_bwd_wgmma_wide.cl, bwd_dq_wgmma alone (DQ_ONLY) */
  snprintf(tiles, sizeof tiles, " -DATOMIC_DQ=%d -DDQ_NWG=%d -DDQ_BLOCK_C=%d", atomic || splits > 0, dq_nwg, dq_bc);
  if (!wide)
    snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " -DBLOCK_R=%d -DBULK_DQ=%d",
             fcl_wgmma_bwd_block_r(p->head_dim), bulk);
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DUSE_PTX=1 -DDTYPE=%d -DHEAD_DIM=%d -DCAUSAL=%d -DVARLEN=%d -DDQ_SPLITS=%d -DVEC_RED=%d "
           "-DDROPOUT=%d%s%s%s%s",
           (int)p->dtype, p->head_dim, causal, p->varlen, splits > 0, vec_red, p->dropout, tiles, variants,
           extra ? " " : "", extra ? extra : "");
  fcl_mma_sources(p, wide ? "wgmma_ptx.cl+wgmma_bwd_common.cl+flash_bwd_wgmma_wide.cl"
                          : "wgmma_ptx.cl+wgmma_bwd_common.cl+flash_bwd_wgmma.cl", src, sizeof src);
  fcl_mma_sources(p, "wgmma_ptx.cl+wgmma_bwd_common.cl+flash_bwd_wgmma.cl", dq_src, sizeof dq_src);
  snprintf(dq_opts, sizeof dq_opts, "%s%s", opts, wide ? " -DDQ_ONLY=1" : "");
  cl_kernel dkdv, dq = NULL;
  const int want_dq = !atomic && !splits;
  if (fcl_get_kernel_retargeted(ctx, src, opts, "bwd_dkdv_wgmma", &fcl_sm90a_route, &dkdv) != FLASHCL_SUCCESS ||
      (want_dq &&
       fcl_get_kernel_retargeted(ctx, dq_src, dq_opts, "bwd_dq_wgmma", &fcl_sm90a_route, &dq) != FLASHCL_SUCCESS)) {
    fcl_log(ctx, "the wgmma backward does not build (turned off for this context): %.400s", ctx->errmsg);
    fcl_clear_error(ctx);
    ctx->wgmma_bwd_failed = 1;
    return 0;
  }
  if (ctx->verbose >= 2) {
    fcl_print_build_log(ctx, dkdv, "bwd_dkdv_wgmma", opts);
    if (dq) fcl_print_build_log(ctx, dq, "bwd_dq_wgmma", dq_opts);
  }
  const size_t keys = (size_t)fcl_wgmma_bwd_keys(p->head_dim), rq = (size_t)dq_nwg * 64,
               kblocks = ((size_t)p->seqlen_k + keys - 1) / keys, qblocks = ((size_t)p->seqlen_q + rq - 1) / rq;
  L->dkdv = dkdv;
  L->dq = dq;
  fcl_mma_bwd_shape(L, p, (splits > 0 ? (size_t)splits : kblocks) * 256, 256, qblocks * rq * 2, rq * 2);
  return 1;
}

/* What the wgmma kernels ran, for fcl_tuned_honoured: the mma.sync-only
 * parameters did not run (-1), so a call that sets them is refused. */
void fcl_wgmma_bwd_ran(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, int atomic, int splits) {
  const int bulk = fcl_wgmma_bwd_bulk(ctx, p, tu, atomic, splits), dq_kernel = !atomic && !splits;
  int dq_nwg, dq_bc;
  fcl_wgmma_dq_tiles(ctx, p, tu, &dq_nwg, &dq_bc);
  for (int i = 0; i < FCL_MMAB_COUNT; i++) fcl_tuned_ran(tu, i, -1);
  fcl_tuned_ran(tu, FCL_MMAB_WGMMA, 1);
  fcl_tuned_ran(tu, FCL_MMAB_DQ_SPLITS, atomic ? 0 : splits);
  fcl_tuned_ran(tu, FCL_MMAB_BULK_DQ, bulk);
  fcl_tuned_ran(tu, FCL_MMAB_ATOMIC_DQ, atomic);
  if ((atomic || splits) && !bulk) fcl_tuned_ran(tu, FCL_MMAB_VEC_RED, fcl_tuned_get(tu, FCL_MMAB_VEC_RED, 1) != 0);
  if (dq_kernel) {
    fcl_tuned_ran(tu, FCL_MMAB_DQ_NWG, dq_nwg);
    fcl_tuned_ran(tu, FCL_MMAB_DQ_BLOCK_C, dq_bc);
  }
}

void fcl_wgmma_bwd_describe(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int atomic, int splits,
                            flashcl_config *cfg) {
  int dq_nwg, dq_bc;
  fcl_wgmma_dq_tiles(ctx, p, tu, &dq_nwg, &dq_bc);
  snprintf(cfg->kernel, sizeof cfg->kernel, "bwd_dkdv_wgmma");
  cfg->block_r = fcl_wgmma_bwd_block_r(p->head_dim);
  cfg->block_c = fcl_wgmma_bwd_keys(p->head_dim);
  cfg->threads = 256;
  cfg->local_bytes = fcl_wgmma_bwd_local(p->head_dim, atomic || splits > 0, fcl_wgmma_bwd_bulk(ctx, p, tu, atomic, splits),
                                         dq_nwg, dq_bc);
}
