/* The flash forward path: one fused kernel, no scratch memory. On devices that
 * are not GPUs the CPU variant cl/portable/flash_fwd_cpu.cl runs instead (one
 * work-item per work-group; the CPU rule in src/portable/fwd_plan.c).
 *
 * Every choice comes from the fwd tuning (src/core/tuning_space.c declares it; the
 * plan in src/portable/fwd_plan.c applies it). With verbose >= 2 the kernel's build log and
 * resource figures go to stderr at each launch set-up.
 */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"
#include "portable/portable.h"

#include <stdio.h>
#include <stdlib.h>

/* Whether the GPU variant takes the row maxima through warp shuffles
 * (FWD_SHFL in cl/portable/flash_fwd.cl): the tuning asks for it, the mapping keeps
 * a row's S_CT work-items inside one warp, and the device compiles NVIDIA's
 * inline PTX (the tensor-core probe of src/nvidia/mma_probe.c). The tuning cannot turn it
 * on where the PTX or the mapping does not allow it. */
static int fcl_fwd_shfl(flashcl_context *ctx, const fcl_plan *plan) {
  const int s_ct = plan->bc / plan->shape.s_tn;
  return plan->tune.shfl && plan->shape.threads % 32 == 0 && s_ct <= 32 && (s_ct & (s_ct - 1)) == 0 &&
         fcl_mma_available(ctx);
}

/* A file's tiles and mapping are a preference: where they do not fit this
 * device or head dim, the default rule plans instead (the call's own values
 * are never replaced: fcl_tuned_honoured refuses them). */
static flashcl_status fcl_fwd_plan(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, fcl_plan *plan) {
  flashcl_status st = fcl_make_plan(ctx, tu, p->head_dim, p->head_dim_v, plan);
  static const int shape[] = {FCL_FWD_BR, FCL_FWD_BC, FCL_FWD_THREADS, FCL_FWD_S_TM, FCL_FWD_S_TN, FCL_FWD_O_TM,
                              FCL_FWD_O_TD};
  int from_file = 0, from_call = 0;
  for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
    from_file |= tu->set[shape[i]] && !tu->call[shape[i]], from_call |= tu->call[shape[i]];
  if (st != FLASHCL_ERROR_UNSUPPORTED || !from_file || from_call) return st;
  fcl_log(ctx, "fwd: the tiles of %s do not run here (%s); the default rule plans instead", tu->origin,
          ctx->errmsg);
  fcl_tuned rule = *tu;
  for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) rule.set[shape[i]] = 0;
  fcl_clear_error(ctx);
  st = fcl_make_plan(ctx, &rule, p->head_dim, p->head_dim_v, plan);
  if (st == FLASHCL_SUCCESS) *tu = rule;
  return st;
}

/* The plan and what it will run, recorded in tu's `ran` values. */
static flashcl_status fcl_fwd_prepare(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, fcl_plan *plan,
                                      int *cpu, int *shfl) {
  flashcl_status st = fcl_fwd_plan(ctx, p, tu, plan);
  if (st != FLASHCL_SUCCESS) return st;
  *cpu = fcl_fwd_cpu_map(ctx, tu);
  *shfl = !*cpu && fcl_fwd_shfl(ctx, plan);
  const fcl_fwd_tuning *t = &plan->tune;
  const int ran[FCL_FWD_COUNT] = {*cpu,       plan->br,       plan->bc,      plan->threads,
                                  plan->shape.s_tm, plan->shape.s_tn, plan->shape.o_tm, plan->shape.o_td,
                                  t->tall,    t->unroll_d,    t->prefetch,   t->pad,
                                  t->unroll_o, t->ftz,        p->mask_kind ? 0 : t->sep_kv, *shfl};
  for (int i = 0; i < FCL_FWD_COUNT; i++) fcl_tuned_ran(tu, i, *cpu && i >= FCL_FWD_THREADS ? 0 : ran[i]);
  if (*cpu) fcl_tuned_ran(tu, FCL_FWD_THREADS, 1);
  return fcl_tuned_honoured(ctx, tu);
}

flashcl_status fcl_fwd_config(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, flashcl_config *c) {
  fcl_plan plan;
  int cpu, shfl;
  flashcl_status st = fcl_fwd_prepare(ctx, p, tu, &plan, &cpu, &shfl);
  if (st != FLASHCL_SUCCESS) return st;
  fcl_tuned_report(tu, c);
  snprintf(c->kernel, sizeof c->kernel, "flash_fwd");
  c->block_r = plan.br;
  c->block_c = plan.bc;
  c->threads = plan.threads;
  c->local_bytes = plan.local_bytes;
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_flash_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                 const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                 cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  fcl_plan plan;
  int cpu, shfl;
  flashcl_status st = fcl_fwd_prepare(ctx, p, tu, &plan, &cpu, &shfl);
  if (st != FLASHCL_SUCCESS) return st;
  const int aligned = fcl_vec_aligned(q) && fcl_vec_aligned(k) && fcl_vec_aligned(v) && fcl_vec_aligned(o);
  const char *extra = ctx->build_options;
  char opts[800], variants[160];
  fcl_variant_options(p, variants, sizeof variants);
  fcl_kvq_options(p, variants, sizeof variants);
  const int causal = p->causal && !p->window; /* a window carries causal as window_right = 0 */
  if (cpu) { /* the CPU rule of fwd_plan.c: one work-item per work-group */
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_R=%d -DBLOCK_C=%d -DNTHREADS=1 "
             "-DCAUSAL=%d -DVARLEN=%d -DVEC_ALIGNED=%d -DDROPOUT=%d%s%s%s",
             (int)p->dtype, p->head_dim, plan.br, plan.bc, causal, p->varlen, aligned, p->dropout, variants,
             extra ? " " : "", extra ? extra : "");
  } else {
    /* fcl_make_plan refuses tiles it cannot map, so the shape is set. */
    const fcl_fwd_shape sh = plan.shape;
    const fcl_fwd_tuning tune = plan.tune;
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_R=%d -DBLOCK_C=%d -DNTHREADS=%d -DS_TM=%d -DS_TN=%d "
             "-DO_TM=%d -DO_TD=%d -DUNROLL_D=%d -DUNROLL_O=%d -DPREFETCH=%d -DPAD_ROWS=%d -DSEP_KV=%d -DFWD_SHFL=%d "
             "-DCAUSAL=%d -DVARLEN=%d -DVEC_ALIGNED=%d -DDROPOUT=%d%s%s%s%s%s",
             (int)p->dtype, p->head_dim, plan.br, plan.bc, sh.threads, sh.s_tm, sh.s_tn, sh.o_tm, sh.o_td,
             tune.unroll_d, tune.unroll_o, tune.prefetch, tune.pad, p->mask_kind ? 0 : tune.sep_kv, shfl, causal,
             p->varlen, aligned, p->dropout, tune.ftz ? " -cl-denorms-are-zero" : "", shfl ? " -DWARP_PTX=1" : "",
             variants, extra ? " " : "", extra ? extra : "");
  }
  cl_kernel kern;
  /* Dropout, masks and the NVIDIA shuffles bring their helper files into the
   * program; CPUs run their own variant of the kernel. */
  char src[192];
  snprintf(src, sizeof src, "%s%s%sdtype.cl+%sseq_bounds.cl+score_variant.cl+flash_fwd_common.cl+%s",
           !cpu && shfl ? "warp_ptx.cl+" : "", p->dropout ? "philox.cl+" : "", p->mask_kind ? "mask.cl+" : "",
           p->k_quant || p->v_quant ? "kv_quant.cl+" : "", cpu ? "flash_fwd_cpu.cl" : "flash_fwd.cl");
  st = fcl_get_kernel(ctx, src, opts, "flash_fwd", &kern);
  if (st != FLASHCL_SUCCESS) return st;
  if (ctx->verbose >= 2) fcl_print_build_log(ctx, kern, "flash_fwd", opts);
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
  fcl_arg_mem(&a, p->sinks);
  fcl_arg_paged(&a, p);
  if (p->paged_kv) { /* flash_fwd_common.cl's KVQ_PARAMS: NULL for a plain side */
    fcl_arg_mem(&a, p->k_scale);
    fcl_arg_mem(&a, p->v_scale);
  }
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(flash_fwd)");

  size_t qblocks = ((size_t)p->seqlen_q + plan.br - 1) / plan.br;
  size_t global[3] = {qblocks * plan.threads, (size_t)p->heads_q, (size_t)p->batch};
  size_t local[3] = {(size_t)plan.threads, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, local, nwait, nwait ? wait : NULL, out_event);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clEnqueueNDRangeKernel(flash_fwd)");
  return FLASHCL_SUCCESS;
}
