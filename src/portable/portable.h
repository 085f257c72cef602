/* The portable flash kernels' host side (cl/portable/): the forward's plan
 * and launch, the backward's plans and its launch (which also drives the
 * tensor-core dK/dV kernels through nvidia/nvidia.h). */
#ifndef FLASHCL_PORTABLE_H
#define FLASHCL_PORTABLE_H

#include "core/internal.h"

/* Block plan for the portable flash kernels (src/portable/fwd_plan.c). */
/* Work-item mapping of the portable forward's GPU variant (src/portable/fwd_plan.c). */
typedef struct fcl_fwd_shape {
  int threads, s_tm, s_tn, o_tm, o_td;
} fcl_fwd_shape;

/* Device-specific choices for the portable forward's GPU variant, measured per
 * device and head dim (src/portable/fwd_plan.c, fcl_fwd_tuning_from). */
typedef struct fcl_fwd_tuning {
  int tall;     /* cost ties in the mapping search go to taller S micro-tiles */
  int unroll_d; /* -DUNROLL_D */
  int prefetch; /* -DPREFETCH */
  int pad;      /* -DPAD_ROWS (local_bytes counts the padding) */
  int unroll_o; /* -DUNROLL_O */
  int ftz;      /* -cl-denorms-are-zero */
  int sep_kv;   /* -DSEP_KV: 0, or 1 / 2 (local_bytes then counts a second K/V tile) */
  int shfl;     /* -DFWD_SHFL where the device takes the inline PTX and the mapping allows it (forward.c) */
  fcl_fwd_shape want; /* the mapping fields the tuning sets (0: free) */
} fcl_fwd_tuning;

typedef struct fcl_plan {
  int br, bc;     /* tile rows of Q and of K/V */
  int rt, ct;     /* thread grid: rows x columns */
  int tm, tn;     /* per-thread micro-tile of S */
  int threads;
  size_t local_bytes;
  fcl_fwd_shape shape;  /* GPU variant: the work-item mapping */
  fcl_fwd_tuning tune;  /* GPU variant: the device's tuning choices */
} fcl_plan;

/* The portable forward's plan under a resolved fwd tuning (br / bc included),
 * for q/k head dim head_dim and v/o head dim head_dim_v. */
flashcl_status fcl_make_plan(flashcl_context *ctx, const struct fcl_tuned *tu, int head_dim, int head_dim_v,
                             fcl_plan *plan);
/* 1 when the portable forward runs its CPU variant (src/portable/fwd_plan.c). */
int fcl_fwd_cpu_map(const flashcl_context *ctx, const struct fcl_tuned *tu);

/* Each family's configuration as it will run, for flashcl_attention_config. */
flashcl_status fcl_fwd_config(flashcl_context *ctx, const fcl_problem *p, struct fcl_tuned *tu, flashcl_config *c);

flashcl_status fcl_bwd_config(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                              struct fcl_tuned *tu, flashcl_config *c);

flashcl_status fcl_flash_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 struct fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                 const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                 cl_uint nwait, const cl_event *wait, cl_event *out_event);

flashcl_status fcl_flash_backward_workspace(flashcl_context *ctx, const fcl_problem *p, int atomic,
                                            const struct fcl_tuned *tu, size_t *bytes);

/* The flash backward: D = rowsum(dO * O), then the dK/dV and dQ kernels of the
 * family fcl_choose resolved in tu (portable, or the tensor-core kernels). */
flashcl_status fcl_flash_backward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                  struct fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                  const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                  const flashcl_tensor *d_o, const flashcl_tensor *dq, const flashcl_tensor *dk,
                                  const flashcl_tensor *dv, cl_uint nwait, const cl_event *wait, cl_event *out_event);

/* Tiles and work-item grids of the backward kernels (see cl/portable/flash_bwd.cl). */
typedef struct fcl_bwd_plan {
  int br, bc, threads;
  int a_tm, a_tn, b_tm, b_td;     /* bwd_dkdv */
  int qa_tm, qa_tn, qb_tm, qb_td; /* bwd_dq */
  int pad;                        /* SCORE_PAD */
  int a_wq, b_wx, qa_wk, qb_wx;   /* warp-tiled mappings, 0 = row-major */
  int split;                      /* halves (BWD_SPLIT): A_*, B_* and QA_* cover threads / 2 */
} fcl_bwd_plan;
/* Local memory of a backward plan's tiles (bytes). */
size_t fcl_bwd_local_bytes(int br, int bc, int d, int pad);
/* The bwd tuning the portable kernels read: tu where the portable family runs,
 * else the default rules (in rules). */
const struct fcl_tuned *fcl_bwd_knobs(const struct fcl_tuned *tu, struct fcl_tuned *rules);
/* The plan of bwd_dkdv (for_dq = 0) or bwd_dq (for_dq = 1); 0 when a forced
 * plan does not fit or map (src/portable/bwd_plan.c). */
int fcl_bwd_make_plan(flashcl_context *ctx, const struct fcl_tuned *tu, int d, int for_dq, fcl_bwd_plan *p);

#endif
