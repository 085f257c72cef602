/* Block sizes for the portable flash kernels.
 *
 * The rule follows the paper's IO analysis, where M is the on-chip memory a
 * work-group may use (CL_DEVICE_LOCAL_MEM_SIZE):
 *   Bc = floor(M / (4 * d * s)),  Br = min(Bc, d),
 * with s = 4 bytes because tiles are staged in local memory as fp32 whatever the
 * storage dtype (so the inner loops never convert). Both are rounded down to a
 * multiple of 8 (the work-group granularity of the thread grid below) and
 * clamped to [8, FCL_MAX_TILE]. If the tiles plus the score tile and the
 * reduction scratch still exceed M, the larger of Br and Bc shrinks by 8 until
 * they fit.
 *
 * The work-group is ROW_THREADS x COL_THREADS work-items, 8 or 16 each way: 16
 * where the tile is at least 32 long and divides evenly, so that large tiles get
 * more work-items instead of longer per-item loops.
 */
#include "internal.h"

#define FCL_MAX_TILE 64

static size_t fcl_plan_local_bytes(int d, int br, int bc, int ct) {
  return 4u * ((size_t)br * d + 2u * (size_t)bc * d + (size_t)br * bc + (size_t)br * ct);
}

static void fcl_plan_threads(int d, fcl_plan *p, size_t max_wg) {
  p->ct = (p->bc >= 32 && p->bc % 16 == 0 && d % 16 == 0) ? 16 : 8;
  p->rt = (p->br >= 32 && p->br % 16 == 0) ? 16 : 8;
  while ((size_t)(p->rt * p->ct) > max_wg && (p->rt > 8 || p->ct > 8)) {
    if (p->rt >= p->ct) p->rt = 8;
    else p->ct = 8;
  }
  p->tm = p->br / p->rt;
  p->tn = p->bc / p->ct;
  p->threads = p->rt * p->ct;
  p->local_bytes = fcl_plan_local_bytes(d, p->br, p->bc, p->ct);
}

static int fcl_round8(size_t x) {
  if (x > FCL_MAX_TILE) x = FCL_MAX_TILE;
  x -= x % 8;
  return x < 8 ? 8 : (int)x;
}

flashcl_status fcl_make_plan(flashcl_context *ctx, int d, flashcl_dtype dtype, int block_r, int block_c,
                             fcl_plan *plan) {
  (void)dtype; /* staging is fp32 for every dtype, see above */
  if (d % 8 != 0 || d < 8 || d > 256)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "head_dim %d is not supported: it must be a multiple of 8 in [8, 256]", d);
  if (block_r < 0 || block_c < 0 || block_r % 8 || block_c % 8)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "block sizes must be 0 or multiples of 8 (got %d, %d)",
                    block_r, block_c);
  const size_t M = ctx->info.local_mem_size;
  const size_t s = 4;
  fcl_plan p = {0};
  p.bc = block_c ? block_c : fcl_round8(M / (4u * (size_t)d * s));
  p.br = block_r ? block_r : fcl_round8(p.bc < d ? (size_t)p.bc : (size_t)d);
  fcl_plan_threads(d, &p, ctx->info.max_work_group_size);
  while (p.local_bytes > M) {
    int *shrink = NULL;
    if (!block_r && !block_c) shrink = p.br >= p.bc ? &p.br : &p.bc;
    else if (!block_r) shrink = &p.br;
    else if (!block_c) shrink = &p.bc;
    if (!shrink || *shrink <= 8) break;
    *shrink -= 8;
    fcl_plan_threads(d, &p, ctx->info.max_work_group_size);
  }
  if (p.local_bytes > M)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "Br=%d, Bc=%d at head_dim %d need %zu bytes of local memory; the device has %zu", p.br, p.bc, d,
                    p.local_bytes, M);
  if ((size_t)p.threads > ctx->info.max_work_group_size)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "the device allows only %zu work-items per work-group",
                    ctx->info.max_work_group_size);
  *plan = p;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_attention_block_plan(flashcl_context *ctx, int head_dim, flashcl_dtype dtype, int block_r,
                                            int block_c, flashcl_block_plan *out) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  if (!out) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "plan is NULL");
  if (flashcl_dtype_size(dtype) == 0) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "unknown dtype");
  fcl_plan p;
  flashcl_status st = fcl_make_plan(ctx, head_dim, dtype, block_r, block_c, &p);
  if (st != FLASHCL_SUCCESS) return st;
  out->block_r = p.br;
  out->block_c = p.bc;
  out->threads = p.threads;
  out->local_bytes = p.local_bytes;
  return FLASHCL_SUCCESS;
}
