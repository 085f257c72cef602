/* The Hopper forward's plan (cl/nvidia/flash_fwd_wgmma.cl): warpgroups and
 * key tile, from the default rule and the wgmma_fwd tuning. */
#include "core/internal.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"
#include "nvidia/plan.h"

#include <stdio.h>

/* Local bytes of flash_fwd_wgmma: Q, two K | V stages, and up to 1008 bytes
 * that the kernel skips to align its tiles to 1024 bytes. */
static size_t fcl_wgmma_local(const fcl_wgmma_config *c, int d) {
  const size_t dpad = ((size_t)d + 63) / 64 * 64; /* the swizzled regions are 64 columns wide */
  return ((size_t)c->nwg * 64 + 4 * (size_t)c->block_c) * dpad * 2 + 1008;
}

static int fcl_wgmma_bc_ok(int bc) { return bc == 64 || bc == 96 || bc == 112 || bc == 128; }

/* 1 and *out if some tile fits the budget. Three warpgroups (192 query rows)
 * and the widest key tile that fits: 128 at d = 64 (89 KiB), 96 at d = 128
 * (145 KiB of the 160 KiB the H100's probe grants). Three warpgroups beat two
 * on the H100 at d = 64 and 128 (BENCHMARKS.md): with one barrier per tile for
 * all of them, more warpgroups are what keeps the tensor cores busy while some
 * run their softmax; two leave them idle part of each tile. Past d = 128 two:
 * O alone takes d / 2 registers of each work-item, and three warpgroups leave
 * 170 (112 at d = 192 and 64 at d = 256 fit the second probe's 227 KiB). */
int fcl_wgmma_pick(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, fcl_wgmma_config *out) {
  static const int bcs[4] = {128, 112, 96, 64};
  const int nwg = p->head_dim > 128 ? 2 : 3;
  const size_t cap = fcl_mma_local_cap(ctx, p->head_dim);
  fcl_wgmma_config c = {tu ? fcl_tuned_get(tu, FCL_WG_NWG, nwg) : nwg, 0};
  if (tu && fcl_tuned_has(tu, FCL_WG_BLOCK_C)) {
    c.block_c = tu->val[FCL_WG_BLOCK_C];
    if (!fcl_wgmma_bc_ok(c.block_c) || fcl_wgmma_local(&c, p->head_dim) > cap) return 0;
    *out = c;
    return 1;
  }
  for (int i = 0; i < 4; i++) {
    c.block_c = bcs[i];
    if (fcl_wgmma_local(&c, p->head_dim) <= cap) {
      *out = c;
      return 1;
    }
  }
  return 0;
}

/* The tuned tiles where they fit, else (a database entry) the rule's, else
 * (a per-call tuning) FLASHCL_ERROR_UNSUPPORTED. Records what runs in tu. */
flashcl_status fcl_wgmma_config_of(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, fcl_wgmma_config *c) {
  if (!fcl_wgmma_pick(ctx, p, tu, c)) {
    if (tu->source == FLASHCL_TUNING_SOURCE_CALL)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "wgmma_fwd tuning refused: its tiles do not fit %zu bytes "
                      "of local memory (block_c must be 64, 96, 112 or 128)", fcl_mma_local_cap(ctx, p->head_dim));
    fcl_log(ctx, "wgmma_fwd tuning from %s ignored (its tiles do not fit): the default rule runs", tu->origin);
    if (!fcl_wgmma_pick(ctx, p, NULL, c)) return fcl_fail(ctx, FLASHCL_ERROR_INTERNAL, "flash_fwd_wgmma: no tile fits");
  }
  fcl_tuned_ran(tu, FCL_WG_USE, 1);
  fcl_tuned_ran(tu, FCL_WG_NWG, c->nwg);
  fcl_tuned_ran(tu, FCL_WG_BLOCK_C, c->block_c);
  return fcl_tuned_honoured(ctx, tu);
}

flashcl_status fcl_wgmma_fwd_config(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, flashcl_config *cfg) {
  fcl_wgmma_config c = {0, 0};
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
