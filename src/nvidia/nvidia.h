/* The NVIDIA paths (inline PTX: mma.sync, cp.async, wgmma). */
#ifndef FLASHCL_NVIDIA_H
#define FLASHCL_NVIDIA_H

#include "core/internal.h"

flashcl_status fcl_mma_fwd_config(flashcl_context *ctx, const fcl_problem *p, struct fcl_tuned *tu,
                                  flashcl_config *c);

flashcl_status fcl_wgmma_fwd_config(flashcl_context *ctx, const fcl_problem *p, struct fcl_tuned *tu,
                                    flashcl_config *c);

/* NVIDIA tensor-core forward (src/nvidia/mma_forward.c). fcl_mma_select sets *use when
 * desc->algorithm.kernel (or FLASHCL_KERNEL under AUTO) resolves to NVIDIA_MMA, the device
 * passed the probe and the problem is covered for `pass` (the backward kernels
 * cover less than the forward); it fails only when NVIDIA_MMA was
 * requested explicitly and the device cannot run it. */
/* 1 if the tensor-core backward has tiles for p in the given dQ mode under the
 * tuning tu (NULL: the rules; src/nvidia/mma_bwd_plan.c). */
int fcl_mma_bwd_covered(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu, int atomic);
/* The mma_bwd rule for atomic_dq: whether a call that permits the atomic dQ
 * takes it (1) or the deterministic kernels (0) (mma_bwd_plan.c). */
int fcl_mma_bwd_atomic_rule(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu);
flashcl_status fcl_mma_select(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                              const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                              const flashcl_tensor *o, flashcl_pass pass, flashcl_kernel_family forced, int *use);
/* The program of a tensor-core kernel file: mma_ptx.cl, then philox.cl with
 * dropout, mask.cl and mask_mma.cl with a mask, mma_scores.cl, score_variant.cl, seq_bounds.cl, then the kernel
 * file. */
void fcl_mma_sources(const fcl_problem *p, const char *kernel_file, char *buf, size_t cap);
flashcl_status fcl_mma_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                               struct fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                               const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                               cl_uint nwait, const cl_event *wait, cl_event *out_event);

/* 1 if the device runs inline PTX (mma.sync, ldmatrix, cp.async): NVIDIA, compute
 * capability >= 8.0, and the probe kernel passed. Probes on the first call. */
int fcl_mma_available(flashcl_context *ctx);

/* Hopper wgmma forward (src/nvidia/wgmma_forward.c), taken by fcl_mma_forward where
 * fcl_wgmma_covered says so: compute capability 9.0, its probe passed, and p
 * within the kernel's coverage. */
int fcl_wgmma_covered(flashcl_context *ctx, const fcl_problem *p);
/* 1 if the wgmma kernels may run on this context (compute capability 9.0 and
 * the probe passed; decided once, on first use). */
int fcl_wgmma_available(flashcl_context *ctx);
/* The sm_90a retargeting every wgmma program is built through. */
extern const fcl_retarget fcl_sm90a_route;
/* Turns the path off after fcl_wgmma_forward returned FLASHCL_ERROR_BUILD_FAILED:
 * keeps the build log as the reason, logs it, clears the context's error. */
void fcl_wgmma_build_failed(flashcl_context *ctx);
/* Exact fp16 bits of a small integer |x| <= 64 (the probes' inputs; src/nvidia/mma_probe.c). */
unsigned short fcl_small_int_half(int x);
flashcl_status fcl_wgmma_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 struct fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                 const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                 cl_uint nwait, const cl_event *wait, cl_event *out_event);

/* The local memory the tensor-core tiles of head dim d may take: up to d = 128
 * the budget of the first probe (ctx->mma_local_bytes, 160 KiB on an H100);
 * past it, where the tiles are largest, the larger limit of the second probe
 * (fcl_local_limit: 227 KiB on an H100), probed on first use
 * (src/nvidia/mma_probe.c). */
size_t fcl_mma_local_cap(flashcl_context *ctx, int head_dim);

/* NVIDIA tensor-core backward kernels (src/nvidia/mma_backward.c). */
typedef struct fcl_mma_bwd_config {
  int nwarps, block_r, m_tiles, block_c, qbuf, vec_red, v_in_smem, kv_parts;
} fcl_mma_bwd_config;
typedef struct fcl_mma_bwd_launch {
  cl_kernel dkdv, dq;
  size_t global_dkdv[3], global_dq[3], local_dkdv[3], local_dq[3];
} fcl_mma_bwd_launch;
/* Sets L's launch shapes: dkdv_items x heads_kv x batch in work-groups of
 * dkdv_wg, dq_items x heads_q x batch in work-groups of dq_wg. */
void fcl_mma_bwd_shape(fcl_mma_bwd_launch *L, const fcl_problem *p, size_t dkdv_items, size_t dkdv_wg,
                       size_t dq_items, size_t dq_wg);
flashcl_status fcl_mma_backward_kernels(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu,
                                        int atomic, int splits, fcl_mma_bwd_launch *launch);
int fcl_mma_bwd_dq_splits(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu);
flashcl_status fcl_mma_bwd_report(flashcl_context *ctx, const fcl_problem *p, int atomic, int splits,
                                  struct fcl_tuned *tu, flashcl_config *cfg);
/* The Hopper dK/dV kernel inside the mma_bwd family (src/nvidia/wgmma_backward.c):
 * whether it covers p (tu: the tuning's `wgmma`, NULL: the rule), its build
 * into L (1; 0 after a logged build failure), and its report. */
int fcl_wgmma_bwd_wanted(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu, int atomic);
int fcl_wgmma_bwd_bulk(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu, int atomic,
                       int splits);
int fcl_wgmma_bwd_build(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu, int atomic, int splits,
                        fcl_mma_bwd_launch *L);
void fcl_wgmma_bwd_ran(flashcl_context *ctx, const fcl_problem *p, struct fcl_tuned *tu, int atomic, int splits);
void fcl_wgmma_dq_tiles(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu, int *nwg,
                        int *block_c);
void fcl_wgmma_bwd_describe(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu, int atomic,
                            int splits, flashcl_config *cfg);
cl_int fcl_mma_backward_args(const fcl_mma_bwd_launch *launch, const fcl_problem *p,
                             const flashcl_attention_desc *desc, const flashcl_tensor *q, const flashcl_tensor *k,
                             const flashcl_tensor *v, const flashcl_tensor *lse, const flashcl_tensor *d_o,
                             const flashcl_tensor *dq, const flashcl_tensor *dk, const flashcl_tensor *dv,
                             cl_mem dsum, cl_mem dq_acc);

#endif
