/* The NVIDIA tensor-core forward path (cl/nvidia/flash_fwd_mma.cl): selection
 * and launch (the probe is nvidia/mma_probe.c, the plan mma_fwd_plan.c).
 *
 * Selection. desc->algorithm.kernel = NVIDIA_MMA asks for it; AUTO takes it when the
 * device can run it, unless FLASHCL_KERNEL=portable. "Can run it" is decided
 * once per context, on the first forward call that could use it (not at
 * context creation, so contexts that never run a forward pay nothing):
 *   1. the platform is NVIDIA and the device has cl_nv_device_attribute_query
 *      with compute capability >= 8.0 (mma.sync m16n8k16, ldmatrix, cp.async);
 *   2. cl/nvidia/flash_fwd_mma.cl builds with USE_PTX=1 PROBE_ONLY=1 and its mma_probe
 *      kernel (cp.async, ldmatrix, ldmatrix.trans, mma.sync, shfl.sync) returns
 *      the exact product of two small integer matrices.
 * A failure disables the path for the context; the reason goes to fcl_log (and,
 * when NVIDIA_MMA was requested explicitly, to flashcl_context_last_error with
 * FLASHCL_ERROR_UNSUPPORTED). Under AUTO the call then runs the portable kernel.
 *
 * Coverage: fp16 and bf16, head_dim a multiple of 8 up to 256 (odd multiples
 * of 8 padded to 16 in local memory), scale > 0, and every tensor's
 * element offset and (batch, seq, head) strides a multiple of 8 elements (16-byte
 * rows for cp.async); causal, GQA, varlen, dropout, the sliding window, ALiBi,
 * softcap, attention masks and (forward only) a paged K/V source compose, its
 * pools fp16/bf16 or quantized (int8 / fp8 codes with their scales, turned
 * into 16-bit values on their way to local memory). Other
 * problems run the portable kernels; a v head dim apart from q's
 * (desc.shape.head_dim_v) is refused when the tensor cores are asked for by name.
 *
 * FLASHCL_KERNEL ("portable" or "nvidia_mma") overrides desc.algorithm.kernel = AUTO; a
 * desc.algorithm.tuning of a family decides the family itself. The tiles are the mma_fwd
 * tuning's (src/core/tuning_space.c), checked against the kernel's rules and the
 * local memory.
 */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"
#include "nvidia/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

flashcl_status fcl_mma_select(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                              const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                              const flashcl_tensor *o, flashcl_pass pass, flashcl_kernel_family forced, int *use) {
  *use = 0;
  flashcl_kernel_family fam = desc->algorithm.kernel;
  if (forced != FLASHCL_KERNEL_AUTO) {
    /* desc.algorithm.tuning names a family: it decides, and must agree with desc.algorithm.kernel. */
    if (fam != FLASHCL_KERNEL_AUTO && fam != forced)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "desc.algorithm.tuning is for the %s kernels but desc.algorithm.kernel asks for the %s ones",
                      forced == FLASHCL_KERNEL_PORTABLE ? "portable" : "tensor-core",
                      fam == FLASHCL_KERNEL_PORTABLE ? "portable" : "tensor-core");
    fam = forced;
  } else if (fam == FLASHCL_KERNEL_AUTO) {
    fam = ctx->env_kernel;
  }
  if (fam == FLASHCL_KERNEL_PORTABLE) return FLASHCL_SUCCESS;
  /* The tensor-core kernels take one head dim for q, k and v: a call that asks
   * for them by name is refused rather than run elsewhere (flashcl.h,
   * head_dim_v), and AUTO runs the portable kernels without the probe. */
  if (p->head_dim_v != p->head_dim) {
    if (desc->algorithm.kernel == FLASHCL_KERNEL_NVIDIA_MMA || forced == FLASHCL_KERNEL_NVIDIA_MMA)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                      "the tensor-core kernels do not take head_dim_v %d != head_dim %d: use the portable kernels "
                      "(desc.algorithm.kernel = FLASHCL_KERNEL_AUTO or PORTABLE)",
                      p->head_dim_v, p->head_dim);
    fcl_log(ctx, "tensor-core kernels do not cover head_dim_v %d != head_dim %d: running the portable kernels",
            p->head_dim_v, p->head_dim);
    return FLASHCL_SUCCESS;
  }
  const int explicit_mma = fam == FLASHCL_KERNEL_NVIDIA_MMA;
  if (!fcl_mma_available(ctx)) {
    if (explicit_mma) return fcl_mma_refusal(ctx, "the NVIDIA tensor-core kernels");
    return FLASHCL_SUCCESS;
  }
  const char *why = NULL;
  if (p->dtype != FLASHCL_F16 && p->dtype != FLASHCL_BF16)
    why = "dtype is not f16/bf16";
  else if (p->head_dim % 8 || p->head_dim > 256)
    why = "head_dim is not a multiple of 8 up to 256";
  else if (pass == FLASHCL_PASS_BACKWARD && !fcl_mma_bwd_covered(ctx, p, NULL, 0))
    why = p->head_dim > 128 ? "no backward tiles or dQ split accumulators fit the device's memory"
                            : "no backward tiles fit the local memory";
  else if (!(p->scale > 0.0f))
    why = "scale is not positive";
  else if (p->paged_kv && pass == FLASHCL_PASS_BACKWARD)
    why = "paged K/V source";
  else if (!fcl_rows_aligned16(q) || !fcl_rows_aligned16(k) || !fcl_rows_aligned16(v) || !fcl_rows_aligned16(o))
    why = "rows are not 16-byte aligned (offsets/strides not multiples of 8 elements)";
  else if (pass == FLASHCL_PASS_FORWARD && !fcl_mma_fwd_fits(ctx, p))
    why = "its tiles need more local memory than the device allows";
  if (why && forced != FLASHCL_KERNEL_AUTO)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "desc.algorithm.tuning asks for the tensor-core %s, which does not cover "
                    "this problem (%s)", pass == FLASHCL_PASS_BACKWARD ? "backward" : "forward", why);
  if (why) {
    fcl_log(ctx, "tensor-core %s does not cover this problem (%s): running the portable kernels",
            pass == FLASHCL_PASS_BACKWARD ? "backward" : "forward", why);
    return FLASHCL_SUCCESS;
  }
  *use = 1;
  return FLASHCL_SUCCESS;
}

void fcl_mma_sources(const fcl_problem *p, const char *kernel_file, char *buf, size_t cap) {
  snprintf(buf, cap, "mma_ptx.cl+%s%s%smma_scores.cl+score_variant.cl+seq_bounds.cl+%s",
           p->dropout ? "philox.cl+" : "", p->mask_kind ? "mask.cl+mask_mma.cl+" : "",
           p->k_quant || p->v_quant ? "kv_quant.cl+kvq_ptx.cl+" : "", kernel_file);
}

flashcl_status fcl_mma_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                               fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                               const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                               cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  fcl_mma_config c;
  flashcl_status st = fcl_mma_config_of(ctx, p, tu, &c);
  if (st != FLASHCL_SUCCESS) return st;
  const int threads = c.nwarps * 32, block_r = c.nwarps * 16 * c.m_tiles;
  const char *extra = ctx->build_options;
  char opts[720], variants[192];
  fcl_variant_options(p, variants, sizeof variants);
  fcl_kvq_options(p, variants, sizeof variants);
  if ((p->k_quant || p->v_quant) && ctx->mma_cc >= 89) /* kvq_ptx.cl's fp8 conversion */
    snprintf(variants + strlen(variants), sizeof variants - strlen(variants), " -DCVT_E4M3=1");
  const int causal = p->causal && !p->window; /* a window carries causal as window_right = 0 */
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DUSE_PTX=1 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_C=%d -DNWARPS=%d -DM_TILES=%d -DQ_IN_SMEM=%d "
           "-DKV_STAGES=%d -DCAUSAL=%d -DVARLEN=%d -DDROPOUT=%d -DPAGE_SHIFT=%d%s%s%s",
           (int)p->dtype, p->head_dim, c.block_c, c.nwarps, c.m_tiles, c.q_in_smem, c.kv_stages, causal, p->varlen,
           p->dropout, p->paged_kv ? fcl_page_shift(p->kv_page_size) : -1, variants, extra ? " " : "", extra ? extra : "");
  cl_kernel kern;
  char src[192];
  fcl_mma_sources(p, "flash_fwd_mma.cl", src, sizeof src);
  st = fcl_get_kernel(ctx, src, opts, "flash_fwd_mma", &kern);
  if (st != FLASHCL_SUCCESS) return st;
  if (ctx->verbose >= 2) fcl_print_build_log(ctx, kern, "flash_fwd_mma", opts);
  size_t kwg = 0;
  if (clGetKernelWorkGroupInfo(kern, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) ==
          CL_SUCCESS &&
      kwg < (size_t)threads)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "flash_fwd_mma needs %d work-items but the compiled kernel allows %zu", threads, kwg);

  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_forward(&a, p, desc, q, k, v, o, lse);
  fcl_arg_variants(&a, p);
  fcl_arg_mask(&a, p);
  fcl_arg_dropout(&a, p);
  fcl_arg_mem(&a, p->sinks);
  fcl_arg_paged(&a, p);
  if (p->k_quant || p->v_quant) { /* MMA_KVQ_PARAMS: NULL for a plain side */
    fcl_arg_mem(&a, p->k_scale);
    fcl_arg_mem(&a, p->v_scale);
  }
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(flash_fwd_mma)");

  size_t qblocks = ((size_t)p->seqlen_q + block_r - 1) / block_r;
  size_t global[3] = {qblocks * threads, (size_t)p->heads_q, (size_t)p->batch};
  size_t local[3] = {(size_t)threads, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, local, nwait, nwait ? wait : NULL, out_event);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clEnqueueNDRangeKernel(flash_fwd_mma)");
  return FLASHCL_SUCCESS;
}
