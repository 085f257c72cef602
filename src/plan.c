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
 *   with padded rows, fcl_fwd_tuning_get below, d and Bc are each 4 more),
 * and while it exceeds M (or no work-item mapping fits the tile) Bc steps down to
 * the next multiple of 16 (then 8), then Br once Bc is 8: the Q tile is reused across every K/V tile, so its rows
 * are worth more than K/V rows (measured: 64x48 beats 48x64 at d = 64).
 * With M = 48 KiB this gives 64x48 at d = 64 and 48x32 at d = 128.
 *
 * Probed budget. Where the device runs work-groups with more local memory than
 * it reports (fcl_local_budget, src/probe.c: NVIDIA, 160 KiB) and the rule above
 * left Br below d / 2 (so every K/V tile is read from memory more than twice as
 * often as at the paper's Br = d), M was what held Br down: the budget restores
 * Br = d (clamped to 128, rounded) with Bc = Br / 2, Bc stepping down to 32 until
 * the tiles fit the budget and map, then Br stepping down by 16 (while above M's
 * Br) where no such tile fits; otherwise the plan above stands. Measured on the
 * H100 (f16, N = 4096, BENCHMARKS.md): d = 128 went from 48x32 (21.7 ms) to
 * 128x64 (18.1 ms; 128x48 and 96x64 were within 1.5% of it), while tiles wider
 * than Br / 2 were slower (48x64 20.0, 32x64 23.7 ms). Past d = 128 the step-down
 * gives 112x48 to 64x32 where M gave 32x32 to 16x16: 1.13x (d = 192) to 2.08x
 * (d = 144) faster, 1.16x at d = 256. Where M already gives Br >= d / 2 the
 * larger tiles did not pay: d = 96 (64x32) was 12% slower as 96x48, d = 80
 * (64x32) 4% faster as 80x32, and at d = 64 every larger tile was slower than
 * 64x48.
 *
 * Explicit block_r / block_c (multiples of 8) are used as given, checked against
 * the budget; only the unspecified one shrinks, and FLASHCL_ERROR_UNSUPPORTED is
 * returned if they cannot fit or cannot be mapped to work-items.
 *
 * Work-item mapping (see cl/flash_fwd.cl): T work-items compute S = Q K^T as an
 * S_RT x S_CT grid of S_TM x S_TN micro-tiles and O += P V as an O_RT x O_CT
 * grid (O_RT * O_CT <= T) of O_TM x O_TD micro-tiles (O_TD a multiple of 4).
 * T is tried in the order of FCL_PREFERRED_THREADS, then any T <= FCL_MAX_THREADS;
 * for the first T that admits a mapping, the micro-tiles (at most FCL_MAX_S and
 * FCL_MAX_O values per work-item) minimizing fcl_shape_cost (multiply-adds plus
 * local loads, per warp) are taken. The environment variable
 * FLASHCL_FWD_SHAPE="T,S_TM,S_TN,O_TM,O_TD" forces a mapping (tuning aid;
 * ignored when it does not fit the tile).
 *
 * CPU rule (device not a GPU, e.g. PoCL; FLASHCL_FWD_MAP=gpu|cpu overrides the
 * choice). The kernel is built with -DCPU_MAP=1: one work-item per work-group
 * owns Br rows, with K^T and V tiles staged in local memory (see flash_fwd.cl).
 * The GPU mapping ran ~2x slower than the naive path there: PoCL loops over the
 * 128 work-items between barriers, keeps everything live across a barrier in
 * per-work-item context memory, and cannot vectorize across work-items code
 * that already uses float4.
 *   Bc = floor(min(M, C) / (FCL_TILES * d * s)),   C = FCL_CPU_TILE_BYTES = 32 KiB,
 * rounded as above: the K^T and V tiles of one step (2 * Bc * d * 4 bytes) fit
 * the L1 data cache (32-48 KiB on current x86 cores), which the tile loops
 * sweep Br/4 times; M (2 MiB on PoCL) is no constraint. Br = FCL_CPU_ROWS = 64:
 * staging a K/V tile (a transpose, Bc * d scalar stores) costs as much as ~4
 * rows of work, so more rows amortize it, while Q, O (Br * d each) and S
 * (Br * Bc) stay in the 1-2 MiB L2. Measured on a 2-core Xeon (AVX-512) under
 * PoCL 3.1, N = 1024, fp32: Br = 64 beat 16 by ~1.3-1.5x; Bc in 32..128 was
 * within noise. local_bytes = 2 * Bc * d * 4 and threads = 1. This gives 64x64
 * at d = 64, 64x32 at d = 128 and 64x16 at d = 256. Explicit block sizes are used
 * as given.
 */
#include "internal.h"

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

/* Device tuning of the GPU variant, from flashcl-bench on an H100 (N = 4096,
 * non-causal; BENCHMARKS.md "Portable forward on NVIDIA: a tuning table
 * (twelfth session)"). Other devices keep the defaults (no tie preference, no
 * unrolling, prefetch on, swizzled rows), which were not measured against these.
 *   d = 128: 8 x 4 S micro-tiles instead of 4 x 8 (the cost model ties them),
 *     the head-dimension loop of S unrolled and the key loop of P V unrolled 4
 *     times: 16.6 against 18.2 ms (f16) before padding, and 15.1 against 15.5 ms
 *     for the P V unrolling after it. Unrolling S was slower at d = 32, 64, 80
 *     and 192, and unrolling P V 16 times took twice as long.
 *   d = 80 and d >= 128: rows padded instead of swizzled (PAD_ROWS): 12% faster
 *     at d = 80, 7% at 128, 3% at 160, 2% at 256 (fp32), 1% slower at 192; 18%
 *     slower at d = 64, and at d = 96 the padding pushes the tile out of 48 KiB.
 *   d = 256, fp16 / bf16: no register prefetch of K / V (22.5 against 28.9 ms);
 *     with fp32 the prefetch stays (21.3 against 23.1 ms without).
 *   Every d: -cl-denorms-are-zero. It lets exp2 compile to the bare MUFU.EX2
 *     (the denormal range fix-up costs three instructions per exponential):
 *     13.79 against 14.04 ms at d = 128, 16.75 against 16.97 at d = 64, 1% at
 *     d = 80 and 256, even at d = 96 (thirteenth session). P and O lose only
 *     values below 2^-126 of the row's maximum, far under fp32's resolution of
 *     the row sum; inputs that are themselves fp32 denormals read as 0.
 *   Every d: K and V in tiles of their own, refilled together once per tile
 *   (SEP_KV = 2, two barriers per tile instead of four), where the second tile
 *   fits: 13.84 -> 13.48 ms at d = 128, 16.80 -> 16.49 at 64, 20.59 -> 20.15
 *   at 256, 18.39 -> 18.33 at 96 (sixteenth session; SEP_KV = 1, one register
 *   stage and three barriers, 13.61 at 128 and slower at 96 and 256).
 *   d = 96, 128, 192 and 256: the row maxima through warp shuffles and P before
 *   the barrier (FWD_SHFL, where flash.c finds the inline PTX available and a
 *   row's work-items inside one warp): 18.26 -> 17.51 ms at d = 96, 13.42 ->
 *   13.26 at 128 (7.55 -> 7.42 causal), 17.53 -> 16.94 at 192, 20.11 -> 19.93
 *   at 256; slower at d = 64 (16.42 -> 17.07), 80 (19.22 -> 19.48) and 160
 *   (17.48 -> 17.73), the same at 32 (seventeenth session).
 * FLASHCL_FWD_TUNING="tall,unroll_d,prefetch,pad,unroll_o[,ftz[,sep_kv[,shfl]]]" replaces the
 * table on any device (a tuning aid; the tests use it to run these variants on
 * PoCL). */
static void fcl_fwd_tuning_get(const flashcl_context *ctx, int d, flashcl_dtype dtype, fcl_fwd_tuning *t) {
  t->tall = 0;
  t->unroll_d = 0;
  t->prefetch = 1;
  t->pad = 0;
  t->unroll_o = 0;
  t->ftz = 0;
  t->sep_kv = 0;
  t->shfl = 0;
  const char *env = getenv("FLASHCL_FWD_TUNING");
  if (env) {
    fcl_fwd_tuning e = {0};
    const int n = sscanf(env, "%d,%d,%d,%d,%d,%d,%d,%d", &e.tall, &e.unroll_d, &e.prefetch, &e.pad, &e.unroll_o,
                         &e.ftz, &e.sep_kv, &e.shfl);
    if (n >= 5) {
      t->tall = e.tall != 0;
      t->unroll_d = e.unroll_d != 0;
      t->prefetch = e.prefetch != 0;
      t->pad = e.pad != 0;
      t->unroll_o = e.unroll_o > 0 && e.unroll_o <= 64 ? e.unroll_o : 0;
      t->ftz = e.ftz != 0;
      t->sep_kv = e.sep_kv == 1 || e.sep_kv == 2 ? e.sep_kv : 0;
      t->shfl = e.shfl != 0;
      return;
    }
  }
  if (!fcl_platform_is_nvidia(ctx)) return;
  if (d == 128) {
    t->tall = t->unroll_d = 1;
    t->unroll_o = 4;
  }
  t->pad = d == 80 || d >= 128;
  if (d == 256 && dtype != FLASHCL_F32) t->prefetch = 0;
  t->ftz = 1;
  t->sep_kv = 2;
  t->shfl = d == 96 || d == 128 || d == 192 || d == 256;
}

static int fcl_shape_valid(int br, int bc, int d, const fcl_fwd_shape *s) {
  if (s->threads <= 0 || s->s_tm <= 0 || s->s_tn <= 0 || s->o_tm <= 0 || s->o_td <= 0) return 0;
  if (br % s->s_tm || bc % s->s_tn || br % s->o_tm || s->o_td % 4 || d % s->o_td) return 0;
  return (br / s->s_tm) * (bc / s->s_tn) == s->threads && (br / s->o_tm) * (d / s->o_td) <= s->threads;
}

/* Issue cost of one tile, in warp instructions (32-wide), counting a float4
 * local load as FCL_LOAD_COST multiply-adds. */
#define FCL_LOAD_COST 2
static long fcl_shape_cost(int br, int bc, int d, const fcl_fwd_shape *s) {
  const long s_warps = (s->threads + 31) / 32;
  const long o_warps = ((br / s->o_tm) * (d / s->o_td) + 31) / 32;
  const long s_work = (long)s->s_tm * s->s_tn * d + FCL_LOAD_COST * (long)(d / 4) * (s->s_tm + s->s_tn);
  const long o_work = (long)s->o_tm * s->o_td * bc + FCL_LOAD_COST * ((long)(bc / 4) * s->o_tm + (long)bc * (s->o_td / 4));
  return s_warps * s_work + o_warps * o_work;
}

static int fcl_fwd_shape_pick_t(int br, int bc, int d, size_t max_wg, int want, int tall, fcl_fwd_shape *out);

/* Lower cost wins; on a tie more work-items, then (with `tall`) the taller S
 * micro-tile, then the S micro-tile with the smaller perimeter. */
static int fcl_shape_better(const fcl_fwd_shape *c, long cost, const fcl_fwd_shape *best, long best_cost, int tall) {
  if (cost != best_cost) return cost < best_cost;
  if (c->threads != best->threads) return c->threads > best->threads;
  if (tall && c->s_tm != best->s_tm) return c->s_tm > best->s_tm;
  return c->s_tm + c->s_tn < best->s_tm + best->s_tn;
}

/* The mapping for a tile; returns 0 if none. */
static int fcl_fwd_shape_pick(int br, int bc, int d, size_t max_wg, int tall, fcl_fwd_shape *out) {
  const char *env = getenv("FLASHCL_FWD_SHAPE");
  if (env) {
    fcl_fwd_shape s;
    if (sscanf(env, "%d,%d,%d,%d,%d", &s.threads, &s.s_tm, &s.s_tn, &s.o_tm, &s.o_td) == 5 &&
        (size_t)s.threads <= max_wg && fcl_shape_valid(br, bc, d, &s)) {
      *out = s;
      return 1;
    }
  }
  int found = 0;
  for (size_t pi = 0; pi <= sizeof FCL_PREFERRED_THREADS / sizeof FCL_PREFERRED_THREADS[0] && !found; pi++)
    found = fcl_fwd_shape_pick_t(br, bc, d, max_wg,
                                 pi < sizeof FCL_PREFERRED_THREADS / sizeof FCL_PREFERRED_THREADS[0]
                                     ? FCL_PREFERRED_THREADS[pi]
                                     : 0,
                                 tall, out);
  return found;
}

/* The cheapest mapping with exactly `want` work-items (any count if want == 0). */
static int fcl_fwd_shape_pick_t(int br, int bc, int d, size_t max_wg, int want, int tall, fcl_fwd_shape *out) {
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
          if (!fcl_shape_valid(br, bc, d, &c)) continue;
          /* Work-items idle in the O phase only when nothing else fits. */
          const long cost = fcl_shape_cost(br, bc, d, &c) * ((br / oa) * (d / ob) == t ? 1 : 4);
          if (!found || fcl_shape_better(&c, cost, out, best_cost, tall)) {
            *out = c;
            best_cost = cost;
            found = 1;
          }
        }
    }
  return found;
}

static size_t fcl_plan_local_bytes(int d, int br, int bc, int s_ct, int pad) {
  const size_t pd = (size_t)d + 4 * pad, pc = (size_t)bc + 4 * pad; /* PAD_ROWS: one float4 per row */
  return 4u * ((size_t)br * pd + (size_t)bc * pd + (size_t)br * pc + (((size_t)br * s_ct + 3) & ~(size_t)3) + br);
}

/* Fills the mapping fields; returns 0 when no mapping fits (local_bytes is then
 * computed with one key column per work-item, a lower bound). */
static int fcl_plan_threads(int d, fcl_plan *p, size_t max_wg, const fcl_fwd_tuning *tune) {
  fcl_fwd_shape s;
  if (!fcl_fwd_shape_pick(p->br, p->bc, d, max_wg, tune->tall, &s)) {
    p->threads = 0;
    p->local_bytes = fcl_plan_local_bytes(d, p->br, p->bc, 1, tune->pad);
    return 0;
  }
  p->tm = s.s_tm;
  p->tn = s.s_tn;
  p->rt = p->br / s.s_tm;
  p->ct = p->bc / s.s_tn;
  p->threads = s.threads;
  p->shape = s;
  p->tune = *tune;
  p->local_bytes = fcl_plan_local_bytes(d, p->br, p->bc, p->ct, tune->pad);
  return 1;
}

/* Rounded down to a multiple of 16 (of 8 below 16), within [8, FCL_MAX_TILE]. */
static int fcl_round_tile(size_t x) {
  if (x > FCL_MAX_TILE) x = FCL_MAX_TILE;
  x -= x % (x >= 16 ? 16 : 8);
  return x < 8 ? 8 : (int)x;
}

/* Also used by flash.c: 1 when the CPU rule and kernel variant apply, i.e. the
 * device is not a GPU, unless FLASHCL_FWD_MAP=gpu|cpu forces one (a testing aid:
 * it lets PoCL run the GPU mapping). */
int fcl_fwd_cpu_map(const flashcl_context *ctx) {
  const char *env = getenv("FLASHCL_FWD_MAP");
  if (env && !strcmp(env, "gpu")) return 0;
  if (env && !strcmp(env, "cpu")) return 1;
  return !ctx->info.is_gpu;
}

/* The CPU rule (see the top of this file). */
static flashcl_status fcl_make_plan_cpu(flashcl_context *ctx, int d, int block_r, int block_c, fcl_plan *plan) {
  const size_t M = ctx->info.local_mem_size, s = 4;
  const size_t budget = M < FCL_CPU_TILE_BYTES ? M : FCL_CPU_TILE_BYTES;
  fcl_plan p = {0};
  p.bc = block_c ? block_c : fcl_round_tile(budget / (FCL_TILES * (size_t)d * s));
  p.br = block_r ? block_r : FCL_CPU_ROWS;
  p.rt = p.ct = p.tm = p.tn = 1;
  p.threads = 1;
  p.local_bytes = FCL_TILES * (size_t)p.bc * d * s;
  if (p.local_bytes > M)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "Bc=%d at head_dim %d needs %zu bytes of local memory; the device has %zu", p.bc, d,
                    p.local_bytes, M);
  const size_t priv = s * ((size_t)2 * p.br * d + (size_t)p.br * p.bc);
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
static int fcl_plan_wide(int d, size_t budget, size_t max_wg, const fcl_fwd_tuning *tune, fcl_plan *p) {
  /* A mapping needs br * bc <= FCL_MAX_S * T and br * d <= FCL_MAX_O * T: tiles
   * past that are skipped before the (costly) search of fcl_plan_threads. */
  const long tmax = (long)(max_wg < FCL_MAX_THREADS ? max_wg : FCL_MAX_THREADS);
  fcl_plan w = {0};
  for (w.br = fcl_round_tile((size_t)d); w.br > p->br && w.br >= 16; w.br = fcl_round_tile((size_t)w.br - 1))
    for (w.bc = fcl_round_tile((size_t)w.br / 2); w.bc >= 32; w.bc = fcl_round_tile((size_t)w.bc - 1)) {
      if ((long)w.br * w.bc > FCL_MAX_S * tmax || (long)w.br * d > FCL_MAX_O * tmax ||
          fcl_plan_local_bytes(d, w.br, w.bc, 1, tune->pad) > budget)
        continue;
      if (fcl_plan_threads(d, &w, max_wg, tune) && w.local_bytes <= budget) {
        *p = w;
        return 1;
      }
    }
  return 0;
}

flashcl_status fcl_make_plan(flashcl_context *ctx, int d, flashcl_dtype dtype, int block_r, int block_c,
                             fcl_plan *plan) {
  if (d % 8 != 0 || d < 8 || d > 256)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "head_dim %d is not supported: it must be a multiple of 8 in [8, 256]", d);
  if (block_r < 0 || block_c < 0 || block_r % 8 || block_c % 8)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "block sizes must be 0 or multiples of 8 (got %d, %d)",
                    block_r, block_c);
  const size_t M = ctx->info.local_mem_size;
  const size_t max_wg = ctx->info.max_work_group_size;
  const size_t s = 4;
  if (fcl_fwd_cpu_map(ctx)) return fcl_make_plan_cpu(ctx, d, block_r, block_c, plan);
  /* Explicit tiles may use all the local memory a work-group can have; the
   * automatic rule starts from the reported M (see the top of this file). */
  const size_t budget = fcl_local_budget(ctx);
  fcl_fwd_tuning tune; /* staging is fp32 for every dtype (see above); dtype only picks variants */
  fcl_fwd_tuning_get(ctx, d, dtype, &tune);
  size_t fit = block_r || block_c ? budget : M;
  fcl_plan p = {0};
  p.bc = block_c ? block_c : fcl_round_tile(M / (FCL_TILES * (size_t)d * s));
  p.br = block_r ? block_r : fcl_round_tile(p.bc < d ? (size_t)p.bc : (size_t)d);
  int mapped = fcl_plan_threads(d, &p, max_wg, &tune);
  while (p.local_bytes > fit || !mapped) {
    int *shrink = NULL;
    if (!block_r && !block_c) shrink = p.bc > 8 ? &p.bc : &p.br;
    else if (!block_r) shrink = &p.br;
    else if (!block_c) shrink = &p.bc;
    if (!shrink || *shrink <= 8) break;
    *shrink = fcl_round_tile((size_t)*shrink - 1);
    mapped = fcl_plan_threads(d, &p, max_wg, &tune);
  }
  if (!block_r && !block_c && budget > M && mapped && p.local_bytes <= M && 2 * p.br < d &&
      fcl_plan_wide(d, budget, max_wg, &tune, &p))
    fit = budget;
  if (p.local_bytes > fit)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "Br=%d, Bc=%d at head_dim %d need %zu bytes of local memory; the device has %zu", p.br, p.bc, d,
                    p.local_bytes, fit);
  if (!mapped)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "Br=%d, Bc=%d at head_dim %d cannot be mapped to at most %zu work-items per work-group", p.br,
                    p.bc, d, max_wg);
  /* The second K/V tile never shapes the tiles (so the tuned plans stay as
   * measured): where it does not fit what a work-group may use, the kernel
   * shares one. */
  const size_t kv_bytes = 4u * (size_t)p.bc * ((size_t)d + 4 * (size_t)p.tune.pad);
  if (p.tune.sep_kv && p.local_bytes + kv_bytes <= fcl_local_limit(ctx)) p.local_bytes += kv_bytes;
  else p.tune.sep_kv = 0;
  *plan = p;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_attention_block_plan(flashcl_context *ctx, int head_dim, flashcl_dtype dtype, int block_r,
                                            int block_c, flashcl_block_plan *out) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
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
