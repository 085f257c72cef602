/* The Hopper forward's plan (cl/nvidia/flash_fwd_wgmma.cl): warpgroups and
 * key tile, from the default rule and the wgmma_fwd tuning. */
#include "core/internal.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"
#include "nvidia/plan.h"

#include <stdio.h>

/* Local bytes of flash_fwd_wgmma: Q, the K | V stages, up to 1008 bytes that
 * the kernel skips to align its tiles to 1024 bytes, and past 2 stages two
 * mbarriers per stage. */
static size_t fcl_wgmma_local(const fcl_wgmma_config *c, int d) {
  const size_t dpad = ((size_t)d + 63) / 64 * 64; /* the swizzled regions are 64 columns wide */
  const size_t mbarriers = c->stages > 2 ? 16 * (size_t)c->stages : 0;
  return ((size_t)c->nwg * 64 + 2 * (size_t)c->stages * c->block_c) * dpad * 2 + 1008 + mbarriers;
}

static int fcl_wgmma_bc_ok(int bc) { return bc == 64 || bc == 96 || bc == 112 || bc == 128; }

/* Registers per work-item of S (fp32), P (packed) and O (fp32) for a key tile
 * of bc keys: ptxas keeps them, plus about 32 of addresses and row state,
 * within what NWG warpgroups leave (65536 / (128 NWG), at most 255). On the
 * H100 at d = 128 the 112-key tile (148 of 168) ran 8% slower than the 96-key
 * one (136), at d = 96 the 112-key tile (132) was the fastest (BENCHMARKS.md). */
static int fcl_wgmma_regs_ok(int nwg, int bc, int d) {
  const int avail = nwg * 128 * 255 > 65536 ? 65536 / (nwg * 128) : 255;
  return bc / 2 + bc / 4 + (d + 15) / 16 * 8 <= avail - 32;
}

/* The widest key tile that fits the local memory and the registers, else
 * (warpgroups the registers cannot hold at all, e.g. a tuned nwg = 3 past
 * d = 128) the widest that fits the local memory, or 0. */
static int fcl_wgmma_widest(const fcl_wgmma_config *c, int d, size_t cap) {
  static const int bcs[4] = {128, 112, 96, 64};
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < 4; i++) {
      fcl_wgmma_config e = *c;
      e.block_c = bcs[i];
      if (fcl_wgmma_local(&e, d) <= cap && (pass || fcl_wgmma_regs_ok(e.nwg, e.block_c, d))) return e.block_c;
    }
  return 0;
}

/* The local memory a configuration of `stages` may take: a third stage is
 * worth the widest the device runs. */
static size_t fcl_wgmma_cap(flashcl_context *ctx, int d, int stages) {
  return stages > 2 ? fcl_local_limit(ctx) : fcl_mma_local_cap(ctx, d);
}

/* 1 and *out if some tile fits the budget. Three warpgroups (192 query rows):
 * on the H100 at d = 64 and 128 they beat two (BENCHMARKS.md), keeping the
 * tensor cores busy while some run their softmax. Past d = 128 two: O alone
 * takes d / 2 registers of each work-item, and three warpgroups leave 170.
 * Three K/V stages with three warpgroups (up to d = 128), in the widest local
 * memory the device runs, where they keep the key tile of two stages: on the
 * H100 the forward at d = 96 and 128 is 10-16% faster than with two, at
 * d = 64 the same; past d = 128 a third stage leaves room for 64-key tiles
 * only, 10-13% slower than two stages of 112. */
int fcl_wgmma_pick(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, fcl_wgmma_config *out) {
  const int d = p->head_dim, nwg = d > 128 ? 2 : 3;
  fcl_wgmma_config c = {tu ? fcl_tuned_get(tu, FCL_WG_NWG, nwg) : nwg, 0, 2};
  const int tuned_stages = tu && fcl_tuned_has(tu, FCL_WG_STAGES);
  c.stages = tuned_stages ? tu->val[FCL_WG_STAGES] : c.nwg == 3 ? 3 : 2;
  if (c.stages < 2 || c.stages > 4) return 0;
  const size_t cap = fcl_wgmma_cap(ctx, d, c.stages);
  if (tu && fcl_tuned_has(tu, FCL_WG_BLOCK_C)) {
    c.block_c = tu->val[FCL_WG_BLOCK_C];
    if (!fcl_wgmma_bc_ok(c.block_c) || fcl_wgmma_local(&c, d) > cap) return 0;
    *out = c;
    return 1;
  }
  c.block_c = fcl_wgmma_widest(&c, d, cap);
  if (!tuned_stages && c.stages == 3) { /* the rule's third stage, unless it narrows the key tile */
    fcl_wgmma_config two = c;
    two.stages = 2;
    two.block_c = fcl_wgmma_widest(&two, d, fcl_wgmma_cap(ctx, d, 2));
    if (two.block_c > c.block_c) c = two;
  }
  if (!c.block_c) return 0;
  *out = c;
  return 1;
}

/* The tuned tiles where they fit, else (a database entry) the rule's, else
 * (a per-call tuning) FLASHCL_ERROR_UNSUPPORTED. Records what runs in tu. */
flashcl_status fcl_wgmma_config_of(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, fcl_wgmma_config *c) {
  if (!fcl_wgmma_pick(ctx, p, tu, c)) {
    if (tu->source == FLASHCL_TUNING_SOURCE_CALL)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "wgmma_fwd tuning refused: its tiles do not fit the local "
                      "memory (%zu bytes with 2 stages, %zu with 3 or 4; block_c must be 64, 96, 112 or 128, "
                      "stages 2 to 4)",
                      fcl_wgmma_cap(ctx, p->head_dim, 2), fcl_wgmma_cap(ctx, p->head_dim, 3));
    fcl_log(ctx, "wgmma_fwd tuning from %s ignored (its tiles do not fit): the default rule runs", tu->origin);
    if (!fcl_wgmma_pick(ctx, p, NULL, c)) return fcl_fail(ctx, FLASHCL_ERROR_INTERNAL, "flash_fwd_wgmma: no tile fits");
  }
  fcl_tuned_ran(tu, FCL_WG_USE, 1);
  fcl_tuned_ran(tu, FCL_WG_NWG, c->nwg);
  fcl_tuned_ran(tu, FCL_WG_BLOCK_C, c->block_c);
  fcl_tuned_ran(tu, FCL_WG_STAGES, c->stages);
  return fcl_tuned_honoured(ctx, tu);
}

flashcl_status fcl_wgmma_fwd_config(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, flashcl_config *cfg) {
  fcl_wgmma_config c = {0, 0, 2};
  flashcl_status st = fcl_wgmma_config_of(ctx, p, tu, &c);
  if (st != FLASHCL_SUCCESS) return st;
  fcl_tuned_report(tu, cfg);
  snprintf(cfg->kernel, sizeof cfg->kernel, "flash_fwd_wgmma");
  cfg->block_r = c.nwg * 64;
  cfg->block_c = c.block_c;
  cfg->threads = c.nwg * 128;
  cfg->local_bytes = fcl_wgmma_local(&c, p->head_dim);
  return FLASHCL_SUCCESS;
}
