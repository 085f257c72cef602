/* The tensor-core backward's plan (cl/nvidia/flash_bwd_mma.cl): warps, rows,
 * Q/dO buffers and the dQ splits, from the default rule and the mma_bwd
 * tuning; the validity rule mirrors the kernel's #error checks. */
#include "core/internal.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"
#include "nvidia/plan.h"

#include <stdio.h>

/* Local bytes of bwd_dkdv_mma (K tile, QBUF Q/dO pairs, LSE/D, dS^T for the
 * atomic dQ or the query halves, P^T for the query halves)
 * and of bwd_dq_mma (two K/V stages, or the Q/dO staging). */
static size_t fcl_mma_bwd_local(const fcl_mma_bwd_config *c, int head_dim, int atomic) {
  const size_t d = (size_t)(head_dim + 63) / 64 * 64; /* local rows padded for the swizzle */
  const size_t kv = (size_t)(c->nwarps / c->kv_parts) * 16, br = (size_t)c->block_r, rq = (size_t)c->nwarps * 16 * c->m_tiles;
  const size_t dkdv = (1 + (size_t)c->v_in_smem) * kv * d * 2 + (size_t)c->qbuf * (2 * br * d * 2 + 2 * br * 4) +
                      (atomic || c->kv_parts > 1 ? kv * br * 2 : 0) + (c->kv_parts > 1 ? kv * br * 2 : 0);
  const size_t dq_rows = 4 * (size_t)c->block_c > 2 * rq ? 4 * (size_t)c->block_c : 2 * rq;
  const size_t dq = dq_rows * d * 2;
  return dkdv > dq ? dkdv : dq;
}

/* cl/nvidia/flash_bwd_mma.cl's #error rule, so that a tuning it would refuse is
 * refused here (UNSUPPORTED) rather than failing to build: warps in whole
 * key slices, a Q tile at least half the key block, and in atomic mode warps
 * that split the queries in 32-row halves and the head dim in 16-column pairs
 * (the last warps may get fewer). Past d = 128 the dQ comes from the atomic
 * tile (bwd_dq_mma has no body there), so a deterministic call needs it too. */
static int fcl_mma_bwd_valid(const fcl_mma_bwd_config *c, int d, int atomic) {
  if (c->kv_parts < 1 || c->kv_parts > 2 || c->nwarps % c->kv_parts) return 0;
  if (d > 128 && c->kv_parts < 2) return 0; /* 2 d accumulator registers alone: spills all through */
  if (c->block_r % 32 || 2 * c->block_r < c->nwarps / c->kv_parts * 16 || c->block_c % 16 || c->qbuf < 1 ||
      c->qbuf > 2)
    return 0;
  if (!atomic && d <= 128) return 1;
  const int wq = c->block_r / 32;
  return wq >= 1 && c->nwarps % wq == 0 && c->nwarps / wq <= d / 16;
}

/* Up to d = 128 the built-in atomic tiles run only where they split the head dim
 * evenly in pairs of n-tiles: where none does (d = 48, 80, 112) the
 * deterministic kernels run instead (src/portable/backward.c), since a 2-warp
 * atomic tile was slower than them at d = 80 (BENCHMARKS.md). */
static int fcl_mma_bwd_even(const fcl_mma_bwd_config *c, int d) {
  const int wd = c->nwarps / (c->block_r / 32), nt = d / 8 / wd;
  return d > 128 || ((d / 8) % wd == 0 && nt % 2 == 0 && nt >= 2);
}

/* The first candidate that fits the local memory the device takes (see
 * fcl_mma_local_cap) and, in atomic mode up to d = 128, splits the head dim
 * evenly; 0 when none does. Head dims up to 64 take the d = 64 lists, the others
 * up to 128 the d = 128 lists (the third atomic entry there is for d = 96), the
 * larger ones the wide list: 2 warps per 16-key slice, since one warp's dK and
 * dV accumulators alone would take 2 * d of its registers, with V in local
 * memory; there both dQ modes use the atomic tile (the deterministic one with
 * split accumulators). vec_red needs sm_90. */
static int fcl_mma_bwd_pick(flashcl_context *ctx, const fcl_problem *p, int atomic, const fcl_tuned *tu,
                            fcl_mma_bwd_config *out) {
  static const fcl_mma_bwd_config d128_det[] = {{8, 64, 1, 64, 2, 0, 1, 1}, {4, 32, 1, 32, 1, 0, 0, 1}, {0}};
  static const fcl_mma_bwd_config d128_atomic[] = {
      {8, 64, 1, 32, 2, 1, 1, 1}, {4, 32, 1, 32, 1, 1, 0, 1}, {4, 64, 1, 32, 1, 1, 0, 1}, {0}};
  static const fcl_mma_bwd_config d64_det[] = {{4, 64, 2, 32, 2, 0, 0, 1}, {4, 64, 2, 32, 1, 0, 0, 1}, {0}};
  static const fcl_mma_bwd_config d64_atomic[] = {
      {8, 64, 2, 32, 2, 1, 0, 1}, {4, 64, 2, 32, 1, 1, 0, 1}, {0}};
  static const fcl_mma_bwd_config wide[] = {
      {8, 64, 1, 32, 2, 1, 1, 2}, {8, 64, 1, 32, 1, 1, 1, 2}, {8, 32, 1, 32, 1, 1, 1, 2}, {0}};
  /* The kernel runs an odd multiple of 8 at the next multiple of 16 (D16). */
  const int d = (p->head_dim + 15) / 16 * 16, wants_atomic = atomic || d > 128;
  if (p->head_dim % 8 || d > 256) return 0; /* the kernel's #error rule */
  const fcl_mma_bwd_config *cand =
      d > 128 ? wide : d > 64 ? (atomic ? d128_atomic : d128_det) : (atomic ? d64_atomic : d64_det);
  int found = 0;
  for (int i = 0; cand[i].nwarps && !found; i++)
    if (fcl_mma_bwd_local(&cand[i], d, wants_atomic) <= fcl_mma_local_cap(ctx, d) &&
        fcl_mma_bwd_valid(&cand[i], d, atomic) && (!atomic || fcl_mma_bwd_even(&cand[i], d))) {
      *out = cand[i];
      found = 1;
    }
  if (!found) return 0;
  fcl_mma_bwd_config c = *out;
  if (ctx->mma_cc < 90) c.vec_red = 0;
  if (tu) {
    fcl_mma_bwd_config e = c;
    e.nwarps = fcl_tuned_get(tu, FCL_MMAB_NWARPS, c.nwarps);
    e.block_r = fcl_tuned_get(tu, FCL_MMAB_BLOCK_R, c.block_r);
    e.m_tiles = fcl_tuned_get(tu, FCL_MMAB_M_TILES, c.m_tiles);
    e.block_c = fcl_tuned_get(tu, FCL_MMAB_BLOCK_C, c.block_c);
    e.qbuf = fcl_tuned_get(tu, FCL_MMAB_QBUF, c.qbuf);
    e.vec_red = fcl_tuned_get(tu, FCL_MMAB_VEC_RED, c.vec_red) && ctx->mma_cc >= 90;
    e.v_in_smem = fcl_tuned_get(tu, FCL_MMAB_V_IN_SMEM, c.v_in_smem);
    e.kv_parts = fcl_tuned_get(tu, FCL_MMAB_KV_PARTS, c.kv_parts);
    if (!fcl_mma_bwd_valid(&e, d, atomic) || fcl_mma_bwd_local(&e, d, wants_atomic) > fcl_mma_local_cap(ctx, d))
      return -1;
    c = e;
  }
  *out = c;
  return 1;
}

/* On the Hopper backward the atomic dQ is the faster mode at d <= 64 and from
 * d = 104 to 128: on the H100 (f16, N = 8192; BENCHMARKS.md, "Thirtieth" and
 * "Thirty-first session") the deterministic kernels took 1.04-1.10x its time
 * at 104-120, but 0.91-0.98x at 72-96 and 0.81-0.93x past 128 (the wide
 * kernel). mma.sync keeps the atomic dQ (not measured against). */
int fcl_mma_bwd_atomic_rule(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu) {
  return p->head_dim <= 64 || (p->head_dim >= 104 && p->head_dim <= 128) || !fcl_wgmma_bwd_wanted(ctx, p, tu, 1);
}

/* Past d = 128 a deterministic call needs the split accumulators to fit too. */
int fcl_mma_bwd_covered(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int atomic) {
  if (fcl_wgmma_bwd_wanted(ctx, p, tu, atomic)) return 1; /* Hopper: every multiple of 8 up to 256 */
  fcl_mma_bwd_config c;
  if (p->head_dim % 8 || p->head_dim > 256 || fcl_mma_bwd_pick(ctx, p, atomic, NULL, &c) <= 0) return 0;
  return atomic || p->head_dim <= 128 || fcl_mma_bwd_dq_splits(ctx, p, tu) > 0;
}

/* The configuration a call runs: the tuned one where the kernel and the local
 * memory take it, else the rule's (a database entry; logged), else (a
 * per-call tuning) FLASHCL_ERROR_UNSUPPORTED. */
flashcl_status fcl_mma_bwd_config_of(flashcl_context *ctx, const fcl_problem *p, int atomic,
                                            const fcl_tuned *tu, fcl_mma_bwd_config *c) {
  const int got = fcl_mma_bwd_pick(ctx, p, atomic, tu, c);
  if (got > 0) return FLASHCL_SUCCESS;
  if (got < 0 && tu->source == FLASHCL_TUNING_SOURCE_CALL)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "mma_bwd tuning refused: the kernel's dQ tile rule or %zu bytes "
                    "of local memory do not take it at head_dim %d", fcl_mma_local_cap(ctx, p->head_dim), p->head_dim);
  if (got < 0) {
    fcl_log(ctx, "mma_bwd tuning from %s ignored (the kernel does not take it): the default rule runs", tu->origin);
    if (fcl_mma_bwd_pick(ctx, p, atomic, NULL, c) > 0) return FLASHCL_SUCCESS;
  }
  return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "no tensor-core backward tiles for head_dim %d", p->head_dim);
}

/* The split count of the deterministic dQ that bwd_dkdv_mma accumulates itself
 * (DQ_SPLITS, cl/nvidia/flash_bwd_mma.cl), or 0 for the separate bwd_dq_mma kernel.
 *
 * Each of the batch * heads_kv * splits work-groups walks ceil(kblocks / splits)
 * key blocks in turn, and the tile configurations hold one work-group per
 * compute unit (255 registers x 256 work-items), so the time goes as
 * waves(batch * heads_kv * splits) * ceil(kblocks / splits): the split count
 * minimising that, the smallest on a tie, up to 16. The separate dQ kernel costs
 * three more matrix products per tile (S and dP recomputed) but fills the
 * device with independent work-groups, so it stays where the splits would
 * leave more than a quarter of the compute units idle (few heads, a small
 * batch), and where the splits' accumulators (four bytes per dQ element each)
 * would take more than an eighth of the device memory or one allocation.
 * Past d = 128 there is no separate dQ kernel for bwd_dkdv_mma: the splits
 * always run there (0 when no split count fits the memory, and the portable
 * kernels run); the Hopper kernels have one (bwd_dq_wgmma) at every head dim.
 *
 * The splits also cost memory traffic: every key block adds a whole N x d fp32
 * dQ into its split, and with every head in flight at once those adds miss L2
 * (the atomic mode's work-groups of one head run together and share its
 * accumulator in L2). On the H100 (BENCHMARKS.md, "Deterministic dQ in split
 * accumulators") the splits were slower than the separate kernel at d = 128
 * and at N = 2K; at d = 64 they were faster with a causal mask from N = 8K,
 * and about even without one. So they run by default only at
 * head dims up to 64, under a causal mask or a window, with at least 64 key
 * blocks, and not where the Hopper kernels run (bwd_dq_wgmma was faster than
 * the splits there: BENCHMARKS.md, "Twenty-fourth session"). The mma_bwd tuning's dq_splits = n forces n splits (0: the separate
 * kernel). */
int fcl_mma_bwd_dq_splits(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu) {
  fcl_mma_bwd_config c;
  const int hopper = fcl_wgmma_bwd_wanted(ctx, p, tu, 1); /* bwd_dkdv_wgmma: 128-key blocks (64 past d = 128) */
  if (!hopper && (!fcl_mma_bwd_covered(ctx, p, NULL, 1) || fcl_mma_bwd_pick(ctx, p, 1, NULL, &c) <= 0)) return 0;
  const int wide = p->head_dim > 128;
  const long kv = hopper ? (wide ? 64 : 128) : 16L * (c.nwarps / c.kv_parts), kblocks = ((long)p->seqlen_k + kv - 1) / kv;
  const long units = (long)p->batch * p->heads_kv, cus = ctx->info.compute_units > 0 ? ctx->info.compute_units : 1;
  /* Bytes of D and of one accumulator (never more than the scratch the atomic
   * mode allocates, whose size arithmetic src/portable/backward.c checks). src/portable/backward.c
   * refuses scratch past one allocation, so the splits stay under it. */
  const double rows = (double)p->batch * p->heads_q * p->seqlen_q, one = rows * p->head_dim * sizeof(float);
  const double cap_all = (double)ctx->info.global_mem_size / 8,
               cap_one = (double)ctx->info.max_mem_alloc_size - rows * sizeof(float);
  if (tu && fcl_tuned_has(tu, FCL_MMAB_DQ_SPLITS)) {
    const long n = tu->val[FCL_MMAB_DQ_SPLITS];
    if (n * one <= cap_one && (n > 0 || !wide || hopper)) return (int)n;
    fcl_log(ctx, "mma_bwd.dq_splits = %ld ignored: %s", n,
            n > 0 ? "its accumulators do not fit one allocation" : "past d = 128 the dQ needs split accumulators");
  }
  if (hopper || (!wide && (p->head_dim > 64 || kblocks < 64 || !(p->causal || p->window)))) return 0;
  int best = 0;
  long best_cost = 0;
  for (long s = 1; s <= 16 && s <= kblocks; s++) {
    if (s * one > cap_all || s * one > cap_one) break;
    const long cost = (units * s + cus - 1) / cus * ((kblocks + s - 1) / s);
    if (!best || cost < best_cost) {
      best = (int)s;
      best_cost = cost;
    }
  }
  if (!best || wide) return best;
  const long wgs = units * best, slots = (wgs + cus - 1) / cus * cus;
  return 4 * wgs >= 3 * slots ? best : 0;
}

flashcl_status fcl_mma_bwd_report(flashcl_context *ctx, const fcl_problem *p, int atomic, int splits, fcl_tuned *tu,
                                  flashcl_config *cfg) {
  flashcl_status st;
  if (fcl_wgmma_bwd_wanted(ctx, p, tu, atomic || splits > 0)) {
    fcl_wgmma_bwd_ran(ctx, p, tu, atomic, splits);
    if ((st = fcl_tuned_honoured(ctx, tu)) != FLASHCL_SUCCESS) return st;
    fcl_tuned_report(tu, cfg);
    fcl_wgmma_bwd_describe(ctx, p, tu, atomic, atomic ? 0 : splits, cfg);
    return FLASHCL_SUCCESS;
  }
  fcl_mma_bwd_config c;
  if ((st = fcl_mma_bwd_config_of(ctx, p, atomic || splits > 0, tu, &c)) != FLASHCL_SUCCESS) return st;
  const int ran[FCL_MMAB_COUNT] = {c.nwarps, c.block_r, c.m_tiles, c.block_c, c.qbuf, c.vec_red, c.v_in_smem,
                                   atomic ? 0 : splits, c.kv_parts, 0, -1, -1, -1, atomic};
  for (int i = 0; i < FCL_MMAB_COUNT; i++) fcl_tuned_ran(tu, i, ran[i]);
  if ((st = fcl_tuned_honoured(ctx, tu)) != FLASHCL_SUCCESS) return st;
  fcl_tuned_report(tu, cfg);
  snprintf(cfg->kernel, sizeof cfg->kernel, "bwd_dkdv_mma");
  cfg->block_r = c.block_r;
  cfg->block_c = c.nwarps / c.kv_parts * 16;
  cfg->threads = c.nwarps * 32;
  cfg->local_bytes = fcl_mma_bwd_local(&c, p->head_dim, atomic || splits > 0);
  return FLASHCL_SUCCESS;
}
