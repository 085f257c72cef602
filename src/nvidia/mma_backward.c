/* The NVIDIA tensor-core backward kernels (cl/nvidia/flash_bwd_mma.cl): tile choice,
 * build and arguments. src/portable/backward.c owns the scratch, the preprocess and
 * dQ-store kernels and the enqueue order, which both backward families share;
 * this file only swaps in bwd_dkdv_mma and bwd_dq_mma for the portable dK/dV and
 * dQ kernels when fcl_mma_select() picked the tensor-core path (same device
 * probe, same coverage rules as the forward, plus 16-byte aligned dO/dQ/dK/dV).
 *
 * Tiles (H100, fp16, N = 8192; see BENCHMARKS.md "Tensor-core backward"). Where
 * the device runs work-groups with more local memory than it reports (probe in
 * src/nvidia/mma_forward.c), bwd_dkdv_mma takes 8 warps x 16 keys, 64-query Q/dO tiles
 * in two buffers (the next tile's cp.async under the current tile's math) and,
 * at d = 128, V in local memory rather than registers (ptxas is at 255
 * registers either way; this frees 32 for scheduling): 13.5 ms deterministic and
 * 11.7 ms atomic at d = 128, against 15.2 ms for the 48 KiB layout (4 warps,
 * 32-query tiles, one buffer). The atomic dQ adds pairs with
 * red.global.add.v2.f32 on sm_90 (8.7% faster than scalar red). Otherwise the
 * 48 KiB layout. bwd_dq_mma keeps Q and dO in registers and double-buffers K/V
 * tiles: where the larger layout fits, 8 warps x 16 queries with 64-key tiles
 * at d = 128 (1.4-5.2% faster for the whole deterministic backward than 32-key
 * tiles) and 4 warps x 32 queries with 32-key tiles at d = 64 (64-key tiles
 * were 1-3% slower there).
 *
 * The mma_bwd tuning (src/core/tuning_space.c) overrides any of these fields and
 * dq_splits; a tuned configuration the kernel's rules or the local memory
 * refuse is refused for a per-call tuning and replaced by the rule (logged)
 * for a database entry.
 */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"

#include <stdio.h>
#include <stdlib.h>

/* Local bytes of bwd_dkdv_mma (K tile, QBUF Q/dO pairs, LSE/D, atomic dS^T)
 * and of bwd_dq_mma (two K/V stages, or the Q/dO staging). */
static size_t fcl_mma_bwd_local(const fcl_mma_bwd_config *c, int head_dim, int atomic) {
  const size_t d = (size_t)(head_dim + 63) / 64 * 64; /* local rows padded for the swizzle */
  const size_t kv = (size_t)c->nwarps * 16, br = (size_t)c->block_r, rq = (size_t)c->nwarps * 16 * c->m_tiles;
  const size_t dkdv = (1 + (size_t)c->v_in_smem) * kv * d * 2 + (size_t)c->qbuf * (2 * br * d * 2 + 2 * br * 4) + (atomic ? kv * br * 2 : 0);
  const size_t dq_rows = 4 * (size_t)c->block_c > 2 * rq ? 4 * (size_t)c->block_c : 2 * rq;
  const size_t dq = dq_rows * d * 2;
  return dkdv > dq ? dkdv : dq;
}

/* cl/nvidia/flash_bwd_mma.cl's #error rule, so that a tuning it would refuse is
 * refused here (UNSUPPORTED) rather than failing to build: a Q tile at least
 * half the key block, and in atomic mode warps that split the queries in
 * 32-row halves and the head dim in an even number of 8-column n-tiles each. */
static int fcl_mma_bwd_valid(const fcl_mma_bwd_config *c, int d, int atomic) {
  if (c->block_r % 32 || 2 * c->block_r < c->nwarps * 16 || c->block_c % 16 || c->qbuf < 1 || c->qbuf > 2) return 0;
  if (!atomic) return 1;
  const int wq = c->block_r / 32;
  if (wq < 1 || c->nwarps % wq) return 0;
  const int wd = c->nwarps / wq, nt = d / 8 / wd;
  return (d / 8) % wd == 0 && nt % 2 == 0 && nt >= 2;
}

/* The first candidate that fits the local memory the device takes (see
 * ctx->mma_local_bytes) and, in atomic mode, splits the head dim evenly; 0 when
 * none does. Head dims up to 64 take the d = 64 lists, the others up to 128 the
 * d = 128 lists; the third atomic entry at d = 128 is for d = 96. Where no atomic
 * entry divides the head dim (d = 48, 80, 112) the deterministic kernels run
 * instead (src/portable/backward.c): a 2-warp atomic tile measured 1.75x slower than them
 * at d = 80. vec_red needs sm_90. */
static int fcl_mma_bwd_pick(const flashcl_context *ctx, const fcl_problem *p, int atomic, const fcl_tuned *tu,
                            fcl_mma_bwd_config *out) {
  static const fcl_mma_bwd_config d128_det[] = {{8, 64, 1, 64, 2, 0, 1}, {4, 32, 1, 32, 1, 0, 0}, {0}};
  static const fcl_mma_bwd_config d128_atomic[] = {
      {8, 64, 1, 32, 2, 1, 1}, {4, 32, 1, 32, 1, 1, 0}, {4, 64, 1, 32, 1, 1, 0}, {0}};
  static const fcl_mma_bwd_config d64_det[] = {{4, 64, 2, 32, 2, 0, 0}, {4, 64, 2, 32, 1, 0, 0}, {0}};
  static const fcl_mma_bwd_config d64_atomic[] = {
      {8, 64, 2, 32, 2, 1, 0}, {4, 64, 2, 32, 1, 1, 0}, {0}};
  const fcl_mma_bwd_config *cand =
      p->head_dim > 64 ? (atomic ? d128_atomic : d128_det) : (atomic ? d64_atomic : d64_det);
  int found = 0;
  for (int i = 0; cand[i].nwarps && !found; i++)
    if (fcl_mma_bwd_local(&cand[i], p->head_dim, atomic) <= ctx->mma_local_bytes &&
        fcl_mma_bwd_valid(&cand[i], p->head_dim, atomic)) {
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
    if (!fcl_mma_bwd_valid(&e, p->head_dim, atomic) ||
        fcl_mma_bwd_local(&e, p->head_dim, atomic) > ctx->mma_local_bytes)
      return -1;
    c = e;
  }
  *out = c;
  return 1;
}

int fcl_mma_bwd_covered(const flashcl_context *ctx, const fcl_problem *p, int atomic) {
  fcl_mma_bwd_config c;
  return p->head_dim % 16 == 0 && p->head_dim <= 128 && fcl_mma_bwd_pick(ctx, p, atomic, NULL, &c) > 0;
}

/* The configuration a call runs: the tuned one where the kernel and the local
 * memory take it, else the rule's (a database entry; logged), else (a
 * per-call tuning) FLASHCL_ERROR_UNSUPPORTED. */
static flashcl_status fcl_mma_bwd_config_of(flashcl_context *ctx, const fcl_problem *p, int atomic,
                                            const fcl_tuned *tu, fcl_mma_bwd_config *c) {
  const int got = fcl_mma_bwd_pick(ctx, p, atomic, tu, c);
  if (got > 0) return FLASHCL_SUCCESS;
  if (got < 0 && tu->source == FLASHCL_TUNING_SOURCE_CALL)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "mma_bwd tuning refused: the kernel's dQ tile rule or %zu bytes "
                    "of local memory do not take it at head_dim %d", ctx->mma_local_bytes, p->head_dim);
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
 *
 * The splits also cost memory traffic: every key block adds a whole N x d fp32
 * dQ into its split, and with every head in flight at once those adds miss L2
 * (the atomic mode's work-groups of one head run together and share its
 * accumulator in L2). On the H100 (BENCHMARKS.md, "Deterministic dQ in split
 * accumulators") the splits were 2-18% slower than the separate kernel at
 * d = 128 and at N = 2K; at d = 64 they were 6-12% faster with a causal mask
 * from N = 8K, and within -3..+6% without one. So they run by default only at
 * head dims up to 64, under a causal mask or a window, with at least 64 key
 * blocks. The mma_bwd tuning's dq_splits = n forces n splits (0: the separate
 * kernel). */
int fcl_mma_bwd_dq_splits(const flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu) {
  fcl_mma_bwd_config c;
  if (!fcl_mma_bwd_covered(ctx, p, 1) || fcl_mma_bwd_pick(ctx, p, 1, NULL, &c) <= 0) return 0;
  const long kblocks = ((long)p->seqlen_k + 16 * c.nwarps - 1) / (16 * c.nwarps);
  const long units = (long)p->batch * p->heads_kv, cus = ctx->info.compute_units > 0 ? ctx->info.compute_units : 1;
  /* Bytes of D and of one accumulator (never more than the scratch the atomic
   * mode allocates, whose size arithmetic src/portable/backward.c checks). src/portable/backward.c
   * refuses scratch past one allocation, so the splits stay under it. */
  const double rows = (double)p->batch * p->heads_q * p->seqlen_q, one = rows * p->head_dim * sizeof(float);
  const double cap_all = (double)ctx->info.global_mem_size / 8,
               cap_one = (double)ctx->info.max_mem_alloc_size - rows * sizeof(float);
  if (tu && fcl_tuned_has(tu, FCL_MMAB_DQ_SPLITS)) {
    const long n = tu->val[FCL_MMAB_DQ_SPLITS];
    if (n * one <= cap_one) return (int)n;
    fcl_log(ctx, "mma_bwd.dq_splits = %ld ignored: its accumulators do not fit one allocation", n);
  }
  if (p->head_dim > 64 || kblocks < 64 || !(p->causal || p->window)) return 0;
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
  if (!best) return 0;
  const long wgs = units * best, slots = (wgs + cus - 1) / cus * cus;
  return 4 * wgs >= 3 * slots ? best : 0;
}

flashcl_status fcl_mma_bwd_report(flashcl_context *ctx, const fcl_problem *p, int atomic, int splits, fcl_tuned *tu,
                                  flashcl_config *cfg) {
  fcl_mma_bwd_config c;
  flashcl_status st = fcl_mma_bwd_config_of(ctx, p, atomic || splits > 0, tu, &c);
  if (st != FLASHCL_SUCCESS) return st;
  const int ran[FCL_MMAB_COUNT] = {c.nwarps, c.block_r, c.m_tiles, c.block_c, c.qbuf, c.vec_red, c.v_in_smem,
                                   atomic ? 0 : splits};
  for (int i = 0; i < FCL_MMAB_COUNT; i++) fcl_tuned_ran(tu, i, ran[i]);
  if ((st = fcl_tuned_honoured(ctx, tu)) != FLASHCL_SUCCESS) return st;
  fcl_tuned_report(tu, cfg);
  snprintf(cfg->kernel, sizeof cfg->kernel, "bwd_dkdv_mma");
  cfg->block_r = c.block_r;
  cfg->block_c = c.nwarps * 16;
  cfg->threads = c.nwarps * 32;
  cfg->local_bytes = fcl_mma_bwd_local(&c, p->head_dim, atomic || splits > 0);
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_mma_backward_kernels(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int atomic,
                                        int splits, fcl_mma_bwd_launch *L) {
  fcl_mma_bwd_config c;
  flashcl_status st = fcl_mma_bwd_config_of(ctx, p, atomic || splits > 0, tu, &c);
  if (st != FLASHCL_SUCCESS) return st;
  const char *extra = ctx->build_options;
  char opts[640], variants[64];
  fcl_variant_options(p, variants, sizeof variants);
  const int causal = p->causal && !p->window; /* a window carries causal as window_right = 0 */
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DUSE_PTX=1 -DDTYPE=%d -DHEAD_DIM=%d -DNWARPS=%d -DBLOCK_R=%d -DM_TILES=%d -DBLOCK_C=%d "
           "-DCAUSAL=%d -DVARLEN=%d -DATOMIC_DQ=%d -DDQ_SPLITS=%d -DQBUF=%d -DVEC_RED=%d -DV_IN_SMEM=%d "
           "-DDROPOUT=%d%s%s%s",
           (int)p->dtype, p->head_dim, c.nwarps, c.block_r, c.m_tiles, c.block_c, causal, p->varlen,
           atomic || splits > 0, splits > 0, c.qbuf, c.vec_red, c.v_in_smem, p->dropout, variants,
           extra ? " " : "", extra ? extra : "");
  char src[96];
  fcl_mma_sources(p, "flash_bwd_mma.cl", src, sizeof src);
  L->dq = NULL;
  if ((st = fcl_get_kernel(ctx, src, opts, "bwd_dkdv_mma", &L->dkdv)) ||
      (!splits && (st = fcl_get_kernel(ctx, src, opts, "bwd_dq_mma", &L->dq))))
    return st;
  if (ctx->verbose >= 2) {
    fcl_print_build_log(ctx, L->dkdv, "bwd_dkdv_mma", opts);
    if (L->dq) fcl_print_build_log(ctx, L->dq, "bwd_dq_mma", opts);
  }
  const int threads = c.nwarps * 32;
  for (int i = 0; i < 2; i++) {
    size_t kwg = 0;
    if ((i ? L->dq : L->dkdv) &&
        clGetKernelWorkGroupInfo(i ? L->dq : L->dkdv, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg,
                                 NULL) == CL_SUCCESS &&
        kwg < (size_t)threads)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "%s needs %d work-items but the compiled kernel allows %zu",
                      i ? "bwd_dq_mma" : "bwd_dkdv_mma", threads, kwg);
  }
  const size_t kblocks = ((size_t)p->seqlen_k + 16 * c.nwarps - 1) / (16 * c.nwarps);
  const size_t rq = (size_t)c.nwarps * 16 * c.m_tiles, qblocks = ((size_t)p->seqlen_q + rq - 1) / rq;
  L->local[0] = (size_t)threads;
  L->local[1] = L->local[2] = 1;
  L->global_dkdv[0] = (splits > 0 ? (size_t)splits : kblocks) * threads;
  L->global_dkdv[1] = (size_t)p->heads_kv;
  L->global_dkdv[2] = (size_t)p->batch;
  L->global_dq[0] = qblocks * threads;
  L->global_dq[1] = (size_t)p->heads_q;
  L->global_dq[2] = (size_t)p->batch;
  return FLASHCL_SUCCESS;
}

/* Arguments shared by both kernels after their tensors: LSE view, D, ... */
static void fcl_mma_bwd_tail(fcl_args *a, const fcl_problem *p, const flashcl_attention_desc *desc, int tq, int tk) {
  const float log2e = 1.4426950408889634f;
  fcl_arg_int(a, p->seqlen_q);
  fcl_arg_int(a, p->seqlen_k);
  fcl_arg_int(a, p->heads_q);
  fcl_arg_int(a, p->heads_q / p->heads_kv);
  fcl_arg_float(a, p->scale);
  fcl_arg_float(a, p->scale * log2e);
  fcl_arg_mem(a, p->varlen ? desc->cu_seqlens_q : NULL);
  fcl_arg_mem(a, p->varlen ? desc->cu_seqlens_k : NULL);
  fcl_arg_int(a, tq);
  fcl_arg_int(a, tk);
  fcl_arg_variants(a, p);
  fcl_arg_mask(a, p);
  fcl_arg_dropout(a, p);
}

cl_int fcl_mma_backward_args(const fcl_mma_bwd_launch *L, const fcl_problem *p, const flashcl_attention_desc *desc,
                             const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                             const flashcl_tensor *lse, const flashcl_tensor *d_o, const flashcl_tensor *dq,
                             const flashcl_tensor *dk, const flashcl_tensor *dv, cl_mem dsum, cl_mem dq_acc) {
  const int tq = (int)q->shape[1], tk = (int)k->shape[1];
  fcl_args a = {L->dkdv, 0, CL_SUCCESS};
  fcl_arg_bwd_dkdv_head(&a, q, k, v, d_o, dk, dv, lse, dsum, dq_acc);
  fcl_mma_bwd_tail(&a, p, desc, tq, tk);
  if (a.err != CL_SUCCESS) return a.err;
  if (!L->dq) return CL_SUCCESS; /* dQ comes from the dK/dV kernel's accumulator */
  a = (fcl_args){L->dq, 0, CL_SUCCESS};
  fcl_arg_bwd_dq_head(&a, q, k, v, d_o, dq, lse, dsum);
  fcl_mma_bwd_tail(&a, p, desc, tq, tk);
  return a.err;
}
