/* Block sizes and work-item mapping for the portable flash forward kernel.
 *
 * Block-size rule. The paper sizes tiles from the on-chip memory M a work-group
 * may use (here CL_DEVICE_LOCAL_MEM_SIZE) as Bc = ceil(M / (4 d)) elements,
 * Br = min(Bc, d): the 4 counts the four d-wide tiles Q_i, K_j, V_j, O_i it keeps
 * on chip. flash_fwd.cl keeps O_i in registers and loads V_j into the buffer K_j
 * used once S = Q_i K_j^T is done, so only two d-wide tiles are staged:
 *   Bc = floor(M / (FCL_TILES * d * s)),  FCL_TILES = 2,  Br = min(Bc, d),
 * with s = 4 bytes because tiles are staged in local memory as fp32 whatever the
 * storage dtype (so the inner loops never convert). Both are rounded down to a
 * multiple of 16 (of 8 below 16: the granularity of the work-item mappings,
 * whose micro-tiles come out as powers of two for multiples of 16) and clamped
 * to [8, FCL_MAX_TILE]. The footprint also holds the probability tile, the
 * reduction scratch and one rescale factor per row,
 *   local_bytes = 4 * (Br*d + Bc*d + Br*Bc + Br*S_CT + Br)   (Br*S_CT rounded up to 4;
 *   with padded rows, fcl_fwd_tuning_from below, d and Bc are each 4 more),
 * and while it exceeds M (or no work-item mapping fits the tile) Bc steps down to
 * the next multiple of 16 (then 8), then Br once Bc is 8: the Q tile is reused across every K/V tile, so its rows
 * are worth more than K/V rows (measured: 64x48 beats 48x64 at d = 64).
 * With M = 48 KiB this gives 64x48 at d = 64 and 48x32 at d = 128.
 *
 * Probed budget. Where the device runs work-groups with more local memory than
 * it reports (fcl_local_budget, src/core/probe.c: NVIDIA, 160 KiB) and the rule above
 * left Br below d / 2 (so every K/V tile is read from memory more than twice as
 * often as at the paper's Br = d), M was what held Br down: the budget restores
 * Br = d (clamped to 128, rounded) with Bc = Br / 2, Bc stepping down to 32 until
 * the tiles fit the budget and map, then Br stepping down by 16 (while above M's
 * Br) where no such tile fits; otherwise the plan above stands. On the H100
 * (BENCHMARKS.md, "Portable kernels with the probed local memory") the tall
 * tiles were faster at d = 128 (128x64, with 128x48 and 96x64 close behind)
 * and at every d past it (112x48 to 64x32 where M gave 32x32 to 16x16), while
 * tiles wider than Br / 2 were slower. Where M already gives Br >= d / 2 the
 * larger tiles did not pay: slower at d = 64 and 96, a small gain at d = 80.
 *
 * Explicit block_r / block_c (multiples of 8) are used as given, checked against
 * the budget; only the unspecified one shrinks, and FLASHCL_ERROR_UNSUPPORTED is
 * returned if they cannot fit or cannot be mapped to work-items.
 *
 * Work-item mapping (see cl/portable/flash_fwd.cl): T work-items compute S = Q K^T as an
 * S_RT x S_CT grid of S_TM x S_TN micro-tiles and O += P V as an O_RT x O_CT
 * grid (O_RT * O_CT <= T) of O_TM x O_TD micro-tiles (O_TD a multiple of 4).
 * T is tried in the order of FCL_PREFERRED_THREADS, then any T <= FCL_MAX_THREADS;
 * for the first T that admits a mapping, the micro-tiles (at most FCL_MAX_S and
 * FCL_MAX_O values per work-item) minimizing fcl_shape_cost (multiply-adds plus
 * local loads, per warp) are taken. The fwd tuning's threads, s_tm, s_tn, o_tm
 * and o_td, where set, restrict the search (a tuning no mapping satisfies is
 * refused).
 *
 * CPU rule (device not a GPU, e.g. PoCL; the fwd tuning's map overrides the
 * choice). The kernel is cl/portable/flash_fwd_cpu.cl: one work-item per work-group
 * owns Br rows, with K^T and V tiles staged in local memory (see flash_fwd_cpu.cl).
 * The GPU mapping is slow there: PoCL loops over the
 * 128 work-items between barriers, keeps everything live across a barrier in
 * per-work-item context memory, and cannot vectorize across work-items code
 * that already uses float4 (it ran slower than the naive path; BENCHMARKS.md).
 *   Bc = floor(min(M, C) / (FCL_TILES * d * s)),   C = FCL_CPU_TILE_BYTES = 32 KiB,
 * rounded as above: the K^T and V tiles of one step (2 * Bc * d * 4 bytes) fit
 * the L1 data cache (32-48 KiB on current x86 cores), which the tile loops
 * sweep Br/4 times; M (2 MiB on PoCL) is no constraint. Br = FCL_CPU_ROWS = 64:
 * staging a K/V tile (a transpose, Bc * d scalar stores) costs as much as ~4
 * rows of work, so more rows amortize it, while Q, O (Br * d each) and S
 * (Br * Bc) stay in the 1-2 MiB L2. On a 2-core AVX-512 Xeon under PoCL,
 * Br = 64 clearly beat 16 and Bc in 32..128 made no measurable difference
 * (BENCHMARKS.md). local_bytes = 2 * Bc * d * 4 and threads = 1. This gives 64x64
 * at d = 64, 64x32 at d = 128 and 64x16 at d = 256. Explicit block sizes are used
 * as given.
 *
 * A v head dim apart from q's (desc.shape.head_dim_v): the GPU rule's d is the larger
 * of the two, the row length of every Q/K/V tile (flash_fwd.cl's DM), the S
 * grid's work counts q/k's head dim and the O += P V grid spans v's; the CPU
 * rule's 2 * d (its K^T and V tiles, its Q and O rows) is d_qk + d_v.
 */
#include "core/internal.h"
#include "core/tuning.h"
#include "portable/portable.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FCL_MAX_TILE 128
#define FCL_TILES 2
#define FCL_MAX_S 32 /* S_TM * S_TN */
#define FCL_MAX_O 64 /* O_TM * O_TD */
#define FCL_MAX_THREADS 256
/* Tried in this order; measured on an H100, 4 warps per work-group did best
 * for every tile shape, and 3 or 6 warps did clearly worse. */
static const int FCL_PREFERRED_THREADS[] = {128, 64, 256, 32};
/* CPU rule (not a GPU): see the top of this file. */
#ifndef FCL_CPU_TILE_BYTES
#define FCL_CPU_TILE_BYTES (32 * 1024)
#endif
#ifndef FCL_CPU_ROWS
#define FCL_CPU_ROWS 64
#endif
/* The CPU kernel keeps Q, O and S of its rows in private arrays (the work-item's
 * stack): 4 * (2 * Br * d + Br * Bc) bytes. A large explicit block_r overflowed
 * PoCL's work-item stack (Br = 4096 at d = 256: 8 MiB), so it is bounded. */
#ifndef FCL_CPU_PRIVATE_CAP
#define FCL_CPU_PRIVATE_CAP (1024 * 1024)
#endif

/* The GPU variant's choices: the fwd tuning's values (src/core/tuning_space.c
 * declares them), else the default rule: no tie preference, no unrolling,
 * register prefetch on, swizzled rows, one K/V tile, no shuffles. The
 * choices measured on the H100 are its built-in tuning file
 * (tuning/nvidia-h100.tune), with their measurements. */
static void fcl_fwd_tuning_from(const fcl_tuned *tu, fcl_fwd_tuning *t) {
  t->tall = fcl_tuned_get(tu, FCL_FWD_TALL, 0);
  t->unroll_d = fcl_tuned_get(tu, FCL_FWD_UNROLL_D, 0);
  t->prefetch = fcl_tuned_get(tu, FCL_FWD_PREFETCH, 1);
  t->pad = fcl_tuned_get(tu, FCL_FWD_PAD, 0);
  t->unroll_o = fcl_tuned_get(tu, FCL_FWD_UNROLL_O, 0);
  t->ftz = fcl_tuned_get(tu, FCL_FWD_FTZ, 0);
  t->sep_kv = fcl_tuned_get(tu, FCL_FWD_SEP_KV, 0);
  t->shfl = fcl_tuned_get(tu, FCL_FWD_SHFL, 0);
}

/* dv: the head dim of V and O, which the O += P V grid spans. */
static int fcl_shape_valid(int br, int bc, int dv, const fcl_fwd_shape *s) {
  if (s->threads <= 0 || s->s_tm <= 0 || s->s_tn <= 0 || s->o_tm <= 0 || s->o_td <= 0) return 0;
  if (br % s->s_tm || bc % s->s_tn || br % s->o_tm || s->o_td % 4 || dv % s->o_td) return 0;
  return (br / s->s_tm) * (bc / s->s_tn) == s->threads && (br / s->o_tm) * (dv / s->o_td) <= s->threads;
}

/* Issue cost of one tile, in warp instructions (32-wide), counting a float4
 * local load as FCL_LOAD_COST multiply-adds. */
#define FCL_LOAD_COST 2
static long fcl_shape_cost(int br, int bc, int d, int dv, const fcl_fwd_shape *s) {
  const long s_warps = (s->threads + 31) / 32;
  const long o_warps = ((br / s->o_tm) * (dv / s->o_td) + 31) / 32;
  const long s_work = (long)s->s_tm * s->s_tn * d + FCL_LOAD_COST * (long)(d / 4) * (s->s_tm + s->s_tn);
  const long o_work = (long)s->o_tm * s->o_td * bc + FCL_LOAD_COST * ((long)(bc / 4) * s->o_tm + (long)bc * (s->o_td / 4));
  return s_warps * s_work + o_warps * o_work;
}

static int fcl_fwd_shape_pick_t(int br, int bc, int d, int dv, size_t max_wg, int want,
                                const fcl_fwd_tuning *tune, fcl_fwd_shape *out);

/* Lower cost wins; on a tie more work-items, then (with `tall`) the taller S
 * micro-tile, then the S micro-tile with the smaller perimeter. */
static int fcl_shape_better(const fcl_fwd_shape *c, long cost, const fcl_fwd_shape *best, long best_cost, int tall) {
  if (cost != best_cost) return cost < best_cost;
  if (c->threads != best->threads) return c->threads > best->threads;
  if (tall && c->s_tm != best->s_tm) return c->s_tm > best->s_tm;
  return c->s_tm + c->s_tn < best->s_tm + best->s_tn;
}

/* The mapping for a tile; returns 0 if none. The tuning's mapping fields that
 * are set (tune->want) restrict the search. */
static int fcl_fwd_shape_pick(int br, int bc, int d, int dv, size_t max_wg, const fcl_fwd_tuning *tune,
                              fcl_fwd_shape *out) {
  if (tune->want.threads) return fcl_fwd_shape_pick_t(br, bc, d, dv, max_wg, tune->want.threads, tune, out);
  int found = 0;
  for (size_t pi = 0; pi <= sizeof FCL_PREFERRED_THREADS / sizeof FCL_PREFERRED_THREADS[0] && !found; pi++)
    found = fcl_fwd_shape_pick_t(br, bc, d, dv, max_wg,
                                 pi < sizeof FCL_PREFERRED_THREADS / sizeof FCL_PREFERRED_THREADS[0]
                                     ? FCL_PREFERRED_THREADS[pi]
                                     : 0,
                                 tune, out);
  return found;
}

/* 1 if c agrees with every mapping field the tuning sets. */
static int fcl_shape_wanted(const fcl_fwd_shape *w, const fcl_fwd_shape *c) {
  return (!w->s_tm || w->s_tm == c->s_tm) && (!w->s_tn || w->s_tn == c->s_tn) && (!w->o_tm || w->o_tm == c->o_tm) &&
         (!w->o_td || w->o_td == c->o_td);
}

/* The cheapest mapping with exactly `want` work-items (any count if want == 0). */
static int fcl_fwd_shape_pick_t(int br, int bc, int d, int dv, size_t max_wg, int want,
                                const fcl_fwd_tuning *tune, fcl_fwd_shape *out) {
  int found = 0;
  long best_cost = 0;
  for (int sa = 1; sa <= 8; sa++) /* S_TM */
    for (int sb = 1; sb <= FCL_MAX_S / sa; sb++) { /* S_TN */
      if (br % sa || bc % sb) continue;
      const int t = (br / sa) * (bc / sb);
      if ((size_t)t > max_wg || t > FCL_MAX_THREADS || (want && t != want)) continue;
      for (int oa = 1; oa <= 8; oa++) /* O_TM */
        for (int ob = 4; ob <= FCL_MAX_O / oa; ob += 4) { /* O_TD */
          fcl_fwd_shape c = {t, sa, sb, oa, ob};
          if (!fcl_shape_valid(br, bc, dv, &c) || !fcl_shape_wanted(&tune->want, &c)) continue;
          /* Work-items idle in the O phase only when nothing else fits. */
          const long cost = fcl_shape_cost(br, bc, d, dv, &c) * ((br / oa) * (dv / ob) == t ? 1 : 4);
          if (!found || fcl_shape_better(&c, cost, out, best_cost, tune->tall)) {
            *out = c;
            best_cost = cost;
            found = 1;
          }
        }
    }
  return found;
}

/* d: the Q/K/V tiles' row length, the larger head dim (flash_fwd.cl's DM). */
static size_t fcl_plan_local_bytes(int d, int br, int bc, int s_ct, int pad) {
  const size_t pd = (size_t)d + 4 * pad, pc = (size_t)bc + 4 * pad; /* PAD_ROWS: one float4 per row */
  return 4u * ((size_t)br * pd + (size_t)bc * pd + (size_t)br * pc + (((size_t)br * s_ct + 3) & ~(size_t)3) + br);
}

/* Fills the mapping fields; returns 0 when no mapping fits (local_bytes is then
 * computed with one key column per work-item, a lower bound). */
static int fcl_plan_threads(int d, int dv, fcl_plan *p, size_t max_wg, const fcl_fwd_tuning *tune) {
  fcl_fwd_shape s;
  const int dm = d > dv ? d : dv;
  if (!fcl_fwd_shape_pick(p->br, p->bc, d, dv, max_wg, tune, &s)) {
    p->threads = 0;
    p->local_bytes = fcl_plan_local_bytes(dm, p->br, p->bc, 1, tune->pad);
    return 0;
  }
  p->tm = s.s_tm;
  p->tn = s.s_tn;
  p->rt = p->br / s.s_tm;
  p->ct = p->bc / s.s_tn;
  p->threads = s.threads;
  p->shape = s;
  p->tune = *tune;
  p->local_bytes = fcl_plan_local_bytes(dm, p->br, p->bc, p->ct, tune->pad);
  return 1;
}

/* Rounded down to a multiple of 16 (of 8 below 16), within [8, FCL_MAX_TILE]. */
static int fcl_round_tile(size_t x) {
  if (x > FCL_MAX_TILE) x = FCL_MAX_TILE;
  x -= x % (x >= 16 ? 16 : 8);
  return x < 8 ? 8 : (int)x;
}

/* Also used by forward.c: 1 when the CPU rule and kernel variant apply, i.e. the
 * device is not a GPU, unless the tuning's map forces one (it lets PoCL run the
 * GPU mapping in the tests). */
int fcl_fwd_cpu_map(const flashcl_context *ctx, const fcl_tuned *tu) {
  return fcl_tuned_get(tu, FCL_FWD_MAP, !ctx->info.is_gpu);
}

/* The CPU rule (see the top of this file). */
static flashcl_status fcl_make_plan_cpu(flashcl_context *ctx, int d, int dv, int block_r, int block_c,
                                        fcl_plan *plan) {
  const size_t M = ctx->info.local_mem_size, s = 4;
  const size_t budget = M < FCL_CPU_TILE_BYTES ? M : FCL_CPU_TILE_BYTES;
  fcl_plan p = {0};
  /* The K^T tile has d columns and the V tile dv: FCL_TILES * d when they agree. */
  const size_t kv = (size_t)d + (size_t)dv;
  p.bc = block_c ? block_c : fcl_round_tile(budget / (kv * s));
  p.br = block_r ? block_r : FCL_CPU_ROWS;
  p.rt = p.ct = p.tm = p.tn = 1;
  p.threads = 1;
  p.local_bytes = (size_t)p.bc * kv * s;
  if (p.local_bytes > M)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "Bc=%d at head_dim %d needs %zu bytes of local memory; the device has %zu", p.bc, d,
                    p.local_bytes, M);
  const size_t priv = s * ((size_t)p.br * kv + (size_t)p.br * p.bc); /* Q, O and S */
  if (priv > FCL_CPU_PRIVATE_CAP)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "Br=%d, Bc=%d at head_dim %d need %zu bytes of private memory per work-item on this (CPU) device; "
                    "at most %d are allowed: ask for smaller tiles",
                    p.br, p.bc, d, priv, FCL_CPU_PRIVATE_CAP);
  *plan = p;
  return FLASHCL_SUCCESS;
}

/* The probed-budget rule (see the top of this file): where M held Br below d / 2
 * and the device runs work-groups with more local memory, Br = min(d, 128) and
 * Bc = Br / 2, Bc stepping down (not below 32) until the tiles fit the budget
 * and map, then Br stepping down (while above M's Br) the same way. *p is
 * replaced only by such a plan (then 1 is returned). */
static int fcl_plan_wide(int d, int dv, size_t budget, size_t max_wg, const fcl_fwd_tuning *tune, fcl_plan *p) {
  /* A mapping needs br * bc <= FCL_MAX_S * T and br * d <= FCL_MAX_O * T: tiles
   * past that are skipped before the (costly) search of fcl_plan_threads. */
  const long tmax = (long)(max_wg < FCL_MAX_THREADS ? max_wg : FCL_MAX_THREADS);
  fcl_plan w = {0};
  const int dm = d > dv ? d : dv;
  for (w.br = fcl_round_tile((size_t)dm); w.br > p->br && w.br >= 16; w.br = fcl_round_tile((size_t)w.br - 1))
    for (w.bc = fcl_round_tile((size_t)w.br / 2); w.bc >= 32; w.bc = fcl_round_tile((size_t)w.bc - 1)) {
      if ((long)w.br * w.bc > FCL_MAX_S * tmax || (long)w.br * dv > FCL_MAX_O * tmax ||
          fcl_plan_local_bytes(dm, w.br, w.bc, 1, tune->pad) > budget)
        continue;
      if (fcl_plan_threads(d, dv, &w, max_wg, tune) && w.local_bytes <= budget) {
        *p = w;
        return 1;
      }
    }
  return 0;
}

flashcl_status fcl_make_plan(flashcl_context *ctx, const fcl_tuned *tu, int d, int dv, fcl_plan *plan) {
  const int block_r = fcl_tuned_get(tu, FCL_FWD_BR, 0), block_c = fcl_tuned_get(tu, FCL_FWD_BC, 0);
  const int dm = d > dv ? d : dv; /* the tiles' row length */
  if (d % 8 != 0 || d < 8 || d > 576 || dv % 8 != 0 || dv < 8 || dv > 512)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "head_dim %d is not supported: q/k take multiples of 8 in [8, 576], v/o in [8, 512]",
                    d % 8 != 0 || d < 8 || d > 576 ? d : dv);
  if (block_r < 0 || block_c < 0 || block_r % 8 || block_c % 8)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "block sizes must be 0 or multiples of 8 (got %d, %d)",
                    block_r, block_c);
  const size_t M = ctx->info.local_mem_size;
  const size_t max_wg = ctx->info.max_work_group_size;
  const size_t s = 4;
  if (fcl_fwd_cpu_map(ctx, tu)) return fcl_make_plan_cpu(ctx, d, dv, block_r, block_c, plan);
  /* Explicit tiles may use all the local memory a work-group can have; the
   * automatic rule starts from the reported M (see the top of this file). */
  const size_t budget = fcl_local_budget(ctx);
  fcl_fwd_tuning tune; /* staging is fp32 for every dtype (see above) */
  fcl_fwd_tuning_from(tu, &tune);
  tune.want = (fcl_fwd_shape){fcl_tuned_get(tu, FCL_FWD_THREADS, 0), fcl_tuned_get(tu, FCL_FWD_S_TM, 0),
                              fcl_tuned_get(tu, FCL_FWD_S_TN, 0), fcl_tuned_get(tu, FCL_FWD_O_TM, 0),
                              fcl_tuned_get(tu, FCL_FWD_O_TD, 0)};
  size_t fit = block_r || block_c ? budget : M;
  fcl_plan p = {0};
  p.bc = block_c ? block_c : fcl_round_tile(M / (FCL_TILES * (size_t)dm * s));
  p.br = block_r ? block_r : fcl_round_tile(p.bc < dm ? (size_t)p.bc : (size_t)dm);
  int mapped = fcl_plan_threads(d, dv, &p, max_wg, &tune);
  while (p.local_bytes > fit || !mapped) {
    int *shrink = NULL;
    if (!block_r && !block_c) shrink = p.bc > 8 ? &p.bc : &p.br;
    else if (!block_r) shrink = &p.br;
    else if (!block_c) shrink = &p.bc;
    if (!shrink || *shrink <= 8) break;
    *shrink = fcl_round_tile((size_t)*shrink - 1);
    mapped = fcl_plan_threads(d, dv, &p, max_wg, &tune);
  }
  if (!block_r && !block_c && budget > M && mapped && p.local_bytes <= M && 2 * p.br < dm &&
      fcl_plan_wide(d, dv, budget, max_wg, &tune, &p))
    fit = budget;
  if (p.local_bytes > fit)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "Br=%d, Bc=%d at head_dim %d need %zu bytes of local memory; the device has %zu", p.br, p.bc, dm,
                    p.local_bytes, fit);
  if (!mapped)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "Br=%d, Bc=%d at head_dim %d cannot be mapped to at most %zu work-items per work-group", p.br,
                    p.bc, d, max_wg);
  /* The second K/V tile never shapes the tiles (so the tuned plans stay as
   * measured): where it does not fit what a work-group may use, the kernel
   * shares one. */
  const size_t kv_bytes = 4u * (size_t)p.bc * ((size_t)dm + 4 * (size_t)p.tune.pad);
  if (p.tune.sep_kv && p.local_bytes + kv_bytes <= fcl_local_limit(ctx)) p.local_bytes += kv_bytes;
  else p.tune.sep_kv = 0;
  *plan = p;
  return FLASHCL_SUCCESS;
}

static flashcl_status fcl_attention_block_plan_locked(flashcl_context *ctx, int head_dim, flashcl_dtype dtype,
                                                      int block_r, int block_c, flashcl_block_plan *out) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  if (!out) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "plan is NULL");
  if (flashcl_dtype_size(dtype) == 0) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "unknown dtype");
  if (fcl_dtype_is_kv_quant(dtype))
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH,
                    "dtype %s is a quantized KV-cache format; the forward's tiles are planned for f32, f16 or bf16",
                    flashcl_dtype_name(dtype));
  fcl_plan p;
  fcl_tuned tu;
  const fcl_tune_key key = {head_dim, dtype, 0, -1, 0};
  fcl_tuning_resolve(ctx, FLASHCL_TUNE_FWD, NULL, &key, &tu);
  flashcl_status st = fcl_tuned_blocks(ctx, &tu, block_r, block_c);
  if (st != FLASHCL_SUCCESS || (st = fcl_make_plan(ctx, &tu, head_dim, head_dim, &p)) != FLASHCL_SUCCESS) return st;
  out->block_r = p.br;
  out->block_c = p.bc;
  out->threads = p.threads;
  out->local_bytes = p.local_bytes;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_attention_block_plan(flashcl_context *ctx, int head_dim, flashcl_dtype dtype, int block_r,
                                            int block_c, flashcl_block_plan *out) {
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_attention_block_plan_locked(ctx, head_dim, dtype, block_r, block_c, out));
}
