/* The tensor-core forward's plan (cl/nvidia/flash_fwd_mma.cl): warps, query
 * rows per warp, key tile, Q in registers or local memory and the K | V
 * stages, from the default rule and the mma_fwd tuning. */
#include "core/internal.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"
#include "nvidia/plan.h"

#include <stdio.h>

/* Local bytes of flash_fwd_mma: its SMEM_ROWS rows of SWZ_ROW 16-byte chunks (the
 * row rounded up to 64 elements, for the swizzle). */
static size_t fcl_mma_fwd_local(const fcl_mma_config *c, int d) {
  const size_t br = (size_t)c->nwarps * 16 * c->m_tiles, kv = 2 * (size_t)c->kv_stages * c->block_c;
  const size_t rows = c->q_in_smem ? br + kv : (kv > br ? kv : br);
  return rows * (size_t)((d + 63) / 64 * 64) * 2;
}

/* The default rule, then the mma_fwd tuning's values where set (tu may be NULL). */
static fcl_mma_config fcl_mma_pick(const flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu) {
  /* The H100's measured best (BENCHMARKS.md): d = 64 runs best with Br = 128 (4
   * warps x 32 rows, Q in registers) and Bc = 64; d = 128 with Br = 128, Bc = 32
   * and Q re-read from local memory (Q in registers with 32 rows per warp spills,
   * and 16 rows per warp doubles the ldmatrix traffic per mma). */
  fcl_mma_config c = {4, 2, 64, 0, 2};
  if (p->head_dim > 64) {
    c.block_c = 32;
    c.q_in_smem = 1;
  }
  /* Other head dims, measured at d = 32, 96 and 256 (BENCHMARKS.md): up to 64
   * the d = 64 configuration is best; between 64 and 128, 48-key tiles (at
   * d = 96 faster than 32 or 64); past 128 the O accumulators of 32 rows per
   * warp (d registers per lane) do not fit, and 8 warps of 16 rows (Br = 128)
   * beat 4 (Br = 64) at d = 256, faster still with Q in registers (16 rows
   * leave room for its fragments). */
  if (p->head_dim > 64 && p->head_dim < 128) c.block_c = 48;
  if (p->head_dim > 128) {
    c.nwarps = 8;
    c.m_tiles = 1;
    c.q_in_smem = 0;
  }
  /* Two K | V stages where the local memory allows (d = 64: 32 KiB; d = 128:
   * 64 KiB, so only past the probe): the next tile's cp.async then runs under
   * the current tile's math; faster at d = 64 and 128, most with a causal
   * mask at d = 64 (BENCHMARKS.md). */
  if (fcl_mma_fwd_local(&c, p->head_dim) > ctx->mma_local_bytes) c.kv_stages = 1;
  if (fcl_mma_fwd_local(&c, p->head_dim) > ctx->mma_local_bytes && c.nwarps == 8) c.nwarps = 4;
  if (!tu) return c;
  c.nwarps = fcl_tuned_get(tu, FCL_MMAF_NWARPS, c.nwarps);
  c.m_tiles = fcl_tuned_get(tu, FCL_MMAF_M_TILES, c.m_tiles);
  c.block_c = fcl_tuned_get(tu, FCL_MMAF_BLOCK_C, c.block_c);
  c.q_in_smem = fcl_tuned_get(tu, FCL_MMAF_Q_IN_SMEM, c.q_in_smem);
  c.kv_stages = fcl_tuned_get(tu, FCL_MMAF_KV_STAGES, c.kv_stages);
  return c;
}

/* The mma_fwd configuration a call runs: the tuned one where it fits the
 * kernel's rules and the local memory; else, for a database entry, the rule
 * (logged), and for a per-call tuning FLASHCL_ERROR_UNSUPPORTED. */
flashcl_status fcl_mma_config_of(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, fcl_mma_config *out) {
  fcl_mma_config c = fcl_mma_pick(ctx, p, tu);
  const char *why = NULL;
  if (c.kv_stages > 2) why = "kv_stages above 2";
  else if (c.nwarps * 16 * c.m_tiles > 256) why = "more than 256 query rows per work-group";
  else if (fcl_mma_fwd_local(&c, p->head_dim) > ctx->mma_local_bytes) why = "its tiles do not fit the local memory";
  if (why && tu->source == FLASHCL_TUNING_SOURCE_CALL)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "mma_fwd tuning refused: %s", why);
  if (why) {
    fcl_log(ctx, "mma_fwd tuning from %s ignored (%s): the default rule runs", tu->origin, why);
    c = fcl_mma_pick(ctx, p, NULL);
  }
  const int ran[FCL_MMAF_COUNT] = {c.nwarps, c.m_tiles, c.block_c, c.q_in_smem, c.kv_stages};
  for (int i = 0; i < FCL_MMAF_COUNT; i++) fcl_tuned_ran(tu, i, ran[i]);
  *out = c;
  return fcl_tuned_honoured(ctx, tu);
}

flashcl_status fcl_mma_fwd_config(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, flashcl_config *cfg) {
  fcl_mma_config c;
  flashcl_status st = fcl_mma_config_of(ctx, p, tu, &c);
  if (st != FLASHCL_SUCCESS) return st;
  fcl_tuned_report(tu, cfg);
  snprintf(cfg->kernel, sizeof cfg->kernel, "flash_fwd_mma");
  cfg->block_r = c.nwarps * 16 * c.m_tiles;
  cfg->block_c = c.block_c;
  cfg->threads = c.nwarps * 32;
  cfg->local_bytes = fcl_mma_fwd_local(&c, p->head_dim);
  return FLASHCL_SUCCESS;
}

int fcl_mma_fwd_fits(const flashcl_context *ctx, const fcl_problem *p) {
  const fcl_mma_config c = fcl_mma_pick(ctx, p, NULL);
  return fcl_mma_fwd_local(&c, p->head_dim) <= ctx->mma_local_bytes;
}
