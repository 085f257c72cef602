/* The tile configurations of the NVIDIA kernels, shared inside src/nvidia/
 * between each family's plan (*_plan.c: tile traits, the default rule, the
 * tuning) and its launch. */
#ifndef FLASHCL_NVIDIA_PLAN_H
#define FLASHCL_NVIDIA_PLAN_H

#include "core/internal.h"

typedef struct fcl_mma_config {
  int nwarps, m_tiles, block_c, q_in_smem, kv_stages;
} fcl_mma_config;
/* The mma_fwd configuration a call runs: the tuned one where it fits the
 * kernel's rules and the local memory; else, for a database entry, the rule
 * (logged), and for a per-call tuning FLASHCL_ERROR_UNSUPPORTED
 * (src/nvidia/mma_fwd_plan.c). */
flashcl_status fcl_mma_config_of(flashcl_context *ctx, const fcl_problem *p, struct fcl_tuned *tu, fcl_mma_config *out);

typedef struct fcl_wgmma_config {
  int nwg, block_c, stages;
} fcl_wgmma_config;
/* The mma_bwd configuration a call runs (src/nvidia/mma_bwd_plan.c). */
flashcl_status fcl_mma_bwd_config_of(flashcl_context *ctx, const fcl_problem *p, int atomic,
                                     const struct fcl_tuned *tu, fcl_mma_bwd_config *c);

/* 1 if the default rule's mma_fwd tiles fit the local memory. */
int fcl_mma_fwd_fits(const flashcl_context *ctx, const fcl_problem *p);

/* 1 and *out if some wgmma tile fits the local memory (tu: the tuning's
 * values first; NULL: the rule). src/nvidia/wgmma_fwd_plan.c. */
int fcl_wgmma_pick(flashcl_context *ctx, const fcl_problem *p, const struct fcl_tuned *tu,
                   fcl_wgmma_config *out);
/* The wgmma_fwd configuration a call runs (as fcl_mma_config_of). */
flashcl_status fcl_wgmma_config_of(flashcl_context *ctx, const fcl_problem *p, struct fcl_tuned *tu,
                                   fcl_wgmma_config *c);

#endif
