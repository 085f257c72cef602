/* The NVIDIA tensor-core backward kernels (cl/nvidia/flash_bwd_mma.cl): build and
 * arguments (the tile choice is mma_bwd_plan.c). src/portable/backward.c owns the scratch, the preprocess and
 * dQ-store kernels and the enqueue order, which both backward families share;
 * this file only swaps in bwd_dkdv_mma and bwd_dq_mma for the portable dK/dV and
 * dQ kernels when fcl_mma_select() picked the tensor-core path (same device
 * probe, same coverage rules as the forward, plus 16-byte aligned dO/dQ/dK/dV).
 *
 * Tiles (the H100's measured best; BENCHMARKS.md "Tensor-core backward"). Where
 * the device runs work-groups with more local memory than it reports (probe in
 * src/core/probe.c), bwd_dkdv_mma takes 8 warps x 16 keys (half the Q/dO
 * loads and atomics per key of 4 warps), 64-query Q/dO tiles
 * in two buffers (the next tile's cp.async under the current tile's math) and,
 * at d = 128, V in local memory rather than registers (ptxas is at 255
 * registers either way; this frees 32 for scheduling), together faster than the
 * 48 KiB layout (4 warps, 32-query tiles, one buffer) in both dQ modes. The
 * atomic dQ adds pairs with red.global.add.v2.f32 on sm_90 (half the atomic
 * instructions of scalar red, and faster). Otherwise the
 * 48 KiB layout. bwd_dq_mma keeps Q and dO in registers and double-buffers K/V
 * tiles: where the larger layout fits, 8 warps x 16 queries with 64-key tiles
 * at d = 128 (the whole deterministic backward faster than with 32-key tiles)
 * and 4 warps x 32 queries with 32-key tiles at d = 64 (64-key tiles were
 * slower there).
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
#include "nvidia/plan.h"

#include <stdio.h>
#include <stdlib.h>

flashcl_status fcl_mma_backward_kernels(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int atomic,
                                        int splits, fcl_mma_bwd_launch *L) {
  L->dq = L->dkdv = NULL;
  if (fcl_wgmma_bwd_wanted(ctx, p, tu, atomic || splits > 0)) {
    if (fcl_wgmma_bwd_build(ctx, p, tu, atomic, splits, L)) return FLASHCL_SUCCESS; /* kernels and launch shapes set */
    /* The call was planned for the Hopper kernels (their split count, their
     * head dims): the caller chooses it again with them off. */
    return fcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "the Hopper backward kernels do not build (off for this context)");
  }
  fcl_mma_bwd_config c;
  flashcl_status st = fcl_mma_bwd_config_of(ctx, p, atomic || splits > 0, tu, &c);
  if (st != FLASHCL_SUCCESS) return st;
  const char *extra = ctx->build_options;
  char opts[640], variants[128];
  fcl_variant_options(p, variants, sizeof variants);
  const int causal = p->causal && !p->window; /* a window carries causal as window_right = 0 */
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DUSE_PTX=1 -DDTYPE=%d -DHEAD_DIM=%d -DNWARPS=%d -DBLOCK_R=%d -DM_TILES=%d -DBLOCK_C=%d "
           "-DCAUSAL=%d -DVARLEN=%d -DATOMIC_DQ=%d -DDQ_SPLITS=%d -DQBUF=%d -DVEC_RED=%d -DV_IN_SMEM=%d "
           "-DKV_PARTS=%d -DDROPOUT=%d%s%s%s",
           (int)p->dtype, p->head_dim, c.nwarps, c.block_r, c.m_tiles, c.block_c, causal, p->varlen,
           atomic || splits > 0, splits > 0, c.qbuf, c.vec_red, c.v_in_smem, c.kv_parts, p->dropout, variants,
           extra ? " " : "", extra ? extra : "");
  char src[160];
  fcl_mma_sources(p, "flash_bwd_mma.cl", src, sizeof src);
  if ((st = fcl_get_kernel(ctx, src, opts, "bwd_dkdv_mma", &L->dkdv)) ||
      (!atomic && !splits && (st = fcl_get_kernel(ctx, src, opts, "bwd_dq_mma", &L->dq))))
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
  const size_t kv = (size_t)(c.nwarps / c.kv_parts) * 16, kblocks = ((size_t)p->seqlen_k + kv - 1) / kv;
  const size_t rq = (size_t)c.nwarps * 16 * c.m_tiles, qblocks = ((size_t)p->seqlen_q + rq - 1) / rq;
  fcl_mma_bwd_shape(L, p, (splits > 0 ? (size_t)splits : kblocks) * threads, (size_t)threads, qblocks * threads,
                    (size_t)threads);
  return FLASHCL_SUCCESS;
}

void fcl_mma_bwd_shape(fcl_mma_bwd_launch *L, const fcl_problem *p, size_t dkdv_items, size_t dkdv_wg,
                       size_t dq_items, size_t dq_wg) {
  const size_t g[2][3] = {{dkdv_items, (size_t)p->heads_kv, (size_t)p->batch},
                          {dq_items, (size_t)p->heads_q, (size_t)p->batch}};
  for (int i = 0; i < 3; i++) {
    L->global_dkdv[i] = g[0][i];
    L->global_dq[i] = g[1][i];
    L->local_dkdv[i] = i ? 1 : dkdv_wg;
    L->local_dq[i] = i ? 1 : dq_wg;
  }
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
  fcl_arg_mem(a, p->varlen ? desc->varlen.cu_seqlens_q : NULL);
  fcl_arg_mem(a, p->varlen ? desc->varlen.cu_seqlens_k : NULL);
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
