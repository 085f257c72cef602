/* The NVIDIA paths of a library built with FLASHCL_WITH_NVIDIA=OFF: the
 * interface of nvidia/nvidia.h, with the tensor-core path reported as
 * unavailable, so the callers take the portable kernels as on any device
 * without it. A call that asks for the tensor cores by name fails with
 * FLASHCL_ERROR_UNSUPPORTED and says why. */
#include "core/internal.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"

#include <stdio.h>

static const char fcl_not_built[] = "this build of flashcl has no NVIDIA paths (FLASHCL_WITH_NVIDIA=OFF)";

int fcl_mma_available(flashcl_context *ctx) {
  if (!ctx->mma_state) {
    snprintf(ctx->mma_reason, sizeof ctx->mma_reason, "%s", fcl_not_built);
    ctx->mma_state = -1;
  }
  return 0;
}

static flashcl_status fcl_unavailable(flashcl_context *ctx) {
  return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "the NVIDIA tensor-core kernels are not available: %s",
                  fcl_not_built);
}

flashcl_status fcl_mma_select(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                              const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                              const flashcl_tensor *o, flashcl_pass pass, flashcl_kernel_family forced, int *use) {
  *use = 0;
  flashcl_kernel_family fam = forced != FLASHCL_KERNEL_AUTO ? forced : desc->algorithm.kernel;
  if (fam == FLASHCL_KERNEL_AUTO) fam = ctx->env_kernel;
  return fam == FLASHCL_KERNEL_NVIDIA_MMA ? fcl_unavailable(ctx) : FLASHCL_SUCCESS;
}

int fcl_mma_bwd_covered(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu, int atomic) {
  return 0;
}
int fcl_wgmma_covered(flashcl_context *ctx, const fcl_problem *p) { return 0; }
void fcl_wgmma_build_failed(flashcl_context *ctx) {}
int fcl_mma_bwd_dq_splits(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu) { return 0; }

flashcl_status fcl_mma_fwd_config(flashcl_context *ctx, const fcl_problem *p, struct fcl_tuned *tu,
                                  flashcl_config *c) {
  return fcl_unavailable(ctx);
}

flashcl_status fcl_wgmma_fwd_config(flashcl_context *ctx, const fcl_problem *p, struct fcl_tuned *tu,
                                    flashcl_config *c) {
  return fcl_unavailable(ctx);
}

flashcl_status fcl_mma_bwd_report(flashcl_context *ctx, const fcl_problem *p, int atomic, int splits,
                                  struct fcl_tuned *tu, flashcl_config *cfg) {
  return fcl_unavailable(ctx);
}

flashcl_status fcl_mma_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                               struct fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                               const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                               cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  return fcl_unavailable(ctx);
}

flashcl_status fcl_wgmma_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 struct fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                 const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                 cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  return fcl_unavailable(ctx);
}

flashcl_status fcl_mma_backward_kernels(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu,
                                        int atomic, int splits, fcl_mma_bwd_launch *launch) {
  return fcl_unavailable(ctx);
}

cl_int fcl_mma_backward_args(const fcl_mma_bwd_launch *launch, const fcl_problem *p,
                             const flashcl_attention_desc *desc, const flashcl_tensor *q, const flashcl_tensor *k,
                             const flashcl_tensor *v, const flashcl_tensor *lse, const flashcl_tensor *d_o,
                             const flashcl_tensor *dq, const flashcl_tensor *dk, const flashcl_tensor *dv,
                             cl_mem dsum, cl_mem dq_acc) {
  return CL_INVALID_OPERATION;
}
