/* The flash forward path: one fused kernel, no scratch memory. On devices that
 * are not GPUs the kernel is built with -DCPU_MAP=1 (one work-item per
 * work-group, see cl/flash_fwd.cl and the CPU rule in src/plan.c).
 *
 * Environment (tuning and diagnostics only):
 *   FLASHCL_BUILD_OPTIONS   appended to the kernel's build options (e.g. -cl-nv-verbose)
 *   FLASHCL_FWD_BUILD_LOG   if set, the build log and the kernel's resource figures
 *                           are printed to stderr after each launch set-up
 *   FLASHCL_FWD_SHAPE       forces the work-item mapping, see src/plan.c
 *   FLASHCL_FWD_TUNING      forces the GPU variant's tuning choices, see src/plan.c
 *   FLASHCL_FWD_SHFL        0|1: the row maxima through warp shuffles or not, see below
 *   FLASHCL_FWD_MAP         gpu|cpu: forces the GPU or the CPU variant of the kernel
 *                           (default: cpu iff the device is not a GPU), see src/plan.c
 */
#include "internal.h"
#include "kernel_args.h"

#include <stdio.h>
#include <stdlib.h>

int fcl_fwd_cpu_map(const flashcl_context *ctx); /* plan.c */

/* Whether the GPU variant takes the row maxima through warp shuffles
 * (FWD_SHFL in cl/flash_fwd.cl): the tuning table asks for it, the mapping keeps
 * a row's S_CT work-items inside one warp, and the device compiles NVIDIA's
 * inline PTX (the tensor-core probe of flash_mma.c). FLASHCL_FWD_SHFL=0|1
 * overrides the table (tuning); 1 cannot turn it on where the PTX or the
 * mapping does not allow it. */
static int fcl_fwd_shfl(flashcl_context *ctx, const fcl_plan *plan) {
  const int s_ct = plan->bc / plan->shape.s_tn;
  return fcl_env_bool("FLASHCL_FWD_SHFL", plan->tune.shfl) && plan->shape.threads % 32 == 0 && s_ct <= 32 &&
         (s_ct & (s_ct - 1)) == 0 && fcl_mma_available(ctx);
}

flashcl_status fcl_flash_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                 const flashcl_tensor *o, const flashcl_tensor *lse, cl_uint nwait,
                                 const cl_event *wait, cl_event *out_event) {
  fcl_plan plan;
  flashcl_status st = fcl_make_plan(ctx, p->head_dim, p->dtype, desc->block_r, desc->block_c, &plan);
  if (st != FLASHCL_SUCCESS) return st;
  const int aligned = fcl_vec_aligned(q) && fcl_vec_aligned(k) && fcl_vec_aligned(v) && fcl_vec_aligned(o);
  const char *extra = getenv("FLASHCL_BUILD_OPTIONS");
  char opts[768], variants[64];
  fcl_variant_options(p, variants, sizeof variants);
  const int causal = p->causal && !p->window; /* a window carries causal as window_right = 0 */
  if (fcl_fwd_cpu_map(ctx)) { /* the CPU rule of plan.c: one work-item per work-group */
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -DCPU_MAP=1 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_R=%d -DBLOCK_C=%d -DNTHREADS=1 "
             "-DCAUSAL=%d -DVARLEN=%d -DVEC_ALIGNED=%d -DDROPOUT=%d%s%s%s",
             (int)p->dtype, p->head_dim, plan.br, plan.bc, causal, p->varlen, aligned, p->dropout, variants,
             extra ? " " : "", extra ? extra : "");
  } else {
    /* fcl_make_plan refuses tiles it cannot map, so the shape is set. */
    const fcl_fwd_shape sh = plan.shape;
    const fcl_fwd_tuning tune = plan.tune;
    const int shfl = fcl_fwd_shfl(ctx, &plan);
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_R=%d -DBLOCK_C=%d -DNTHREADS=%d -DS_TM=%d -DS_TN=%d "
             "-DO_TM=%d -DO_TD=%d -DUNROLL_D=%d -DUNROLL_O=%d -DPREFETCH=%d -DPAD_ROWS=%d -DSEP_KV=%d -DFWD_SHFL=%d "
             "-DCAUSAL=%d -DVARLEN=%d -DVEC_ALIGNED=%d -DDROPOUT=%d%s%s%s%s",
             (int)p->dtype, p->head_dim, plan.br, plan.bc, sh.threads, sh.s_tm, sh.s_tn, sh.o_tm, sh.o_td,
             tune.unroll_d, tune.unroll_o, tune.prefetch, tune.pad, p->mask_kind ? 0 : tune.sep_kv, shfl, causal,
             p->varlen, aligned, p->dropout, tune.ftz ? " -cl-denorms-are-zero" : "", variants, extra ? " " : "",
             extra ? extra : "");
  }
  cl_kernel kern;
  /* Dropout and masks bring their helper files into the program. */
  static const char *const srcs[4] = {"flash_fwd.cl", "philox.cl+flash_fwd.cl", "mask.cl+flash_fwd.cl",
                                      "philox.cl+mask.cl+flash_fwd.cl"};
  st = fcl_get_kernel(ctx, srcs[(p->dropout ? 1 : 0) + (p->mask_kind ? 2 : 0)], opts, "flash_fwd", &kern);
  if (st != FLASHCL_SUCCESS) return st;
  if (getenv("FLASHCL_FWD_BUILD_LOG")) fcl_print_build_log(ctx, kern, "flash_fwd", opts);
  size_t kwg = 0;
  if (clGetKernelWorkGroupInfo(kern, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) ==
          CL_SUCCESS &&
      kwg < (size_t)plan.threads)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "flash_fwd with Br=%d, Bc=%d, d=%d needs %d work-items but the compiled kernel allows %zu; "
                    "try smaller block_r/block_c",
                    plan.br, plan.bc, p->head_dim, plan.threads, kwg);

  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_forward(&a, p, desc, q, k, v, o, lse);
  fcl_arg_int(&a, p->heads_q);
  fcl_arg_dropout(&a, p); /* zeros when there is no dropout; the kernel then ignores them */
  fcl_arg_variants(&a, p); /* likewise for the window, ALiBi and softcap */
  fcl_arg_mask(&a, p);     /* and the attention mask */
  fcl_arg_paged(&a, p);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(flash_fwd)");

  size_t qblocks = ((size_t)p->seqlen_q + plan.br - 1) / plan.br;
  size_t global[3] = {qblocks * plan.threads, (size_t)p->heads_q, (size_t)p->batch};
  size_t local[3] = {(size_t)plan.threads, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, local, nwait, nwait ? wait : NULL, out_event);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clEnqueueNDRangeKernel(flash_fwd)");
  return FLASHCL_SUCCESS;
}
