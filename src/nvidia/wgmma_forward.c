/* The Hopper tensor-core forward (cl/nvidia/flash_fwd_wgmma.cl): availability, probe,
 * tiles and launch.
 *
 * It is a faster kernel inside the NVIDIA_MMA family, not a family of its own:
 * fcl_forward_dispatch (src/attention/choose.c) hands a problem over when fcl_wgmma_covered says yes, and
 * runs flash_fwd_mma.cl otherwise. Availability is decided once per context, on
 * the first forward that could use it:
 *   1. the tensor-core path is available (fcl_mma_available) and the compute
 *      capability is exactly 9.0 (wgmma exists only in the sm_90a target);
 *   2. the probe kernel builds through the sm_90a retargeting (src/core/program.c)
 *      and computes two exact products of small integers, one with both
 *      operands in local memory, one with A in registers and B read N-major.
 * A failure is logged (fcl_log) with its reason, and the mma.sync forward runs.
 * So does a later forward variant that fails to build: fcl_forward_dispatch then
 * turns the path off for the context (fcl_wgmma_build_failed) and runs mma.sync.
 *
 * Coverage: what flash_fwd_mma covers, less dropout, attention masks and paged
 * K/V, with head_dim a multiple of 8 up to 256 (tiles padded to 64 columns in
 * local memory).
 *
 * The wgmma_fwd tuning (src/core/tuning_space.c) sets use (0: mma.sync runs
 * instead), nwg and block_c; a per-call tuning whose tiles do not fit is
 * refused, a database entry's is ignored (logged) for the rule's.
 */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"
#include "nvidia/plan.h"
#include "nvidia/ptx_sm90a.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const fcl_wgmma_probe_options = "-cl-std=CL1.2 -DUSE_PTX=1 -DPROBE_ONLY=1";

/* The wgmma instructions exist only for sm_90a, which NVIDIA's OpenCL compiler
 * does not target: its PTX for sm_90 is rewritten (src/nvidia/ptx_sm90a.c). */
const fcl_retarget fcl_sm90a_route = {"sm90a", FCL_PTX_SM90A_REVISION, fcl_ptx_to_sm90a};

static int fcl_wgmma_disable(flashcl_context *ctx, const char *why) {
  snprintf(ctx->wgmma_reason, sizeof ctx->wgmma_reason, "%s", why);
  ctx->wgmma_state = -1;
  fcl_log(ctx, "Hopper wgmma forward disabled: %s", ctx->wgmma_reason);
  return 0;
}

/* As fcl_mma_defer: a probe that could not run for want of memory leaves the
 * state undecided for the next call. */
static int fcl_wgmma_defer(flashcl_context *ctx, const char *what) {
  ctx->probe_defers++;
  snprintf(ctx->wgmma_reason, sizeof ctx->wgmma_reason, "the probe could not run (%s); it runs again on the next call",
           what);
  fcl_log(ctx, "Hopper wgmma forward not used for this call: %s", ctx->wgmma_reason);
  return 0;
}

static int fcl_wgmma_run_probe(flashcl_context *ctx) {
  cl_kernel kern;
  flashcl_status st = fcl_get_kernel_retargeted(ctx, "mma_ptx.cl+wgmma_ptx.cl+seq_bounds.cl+flash_fwd_wgmma.cl", fcl_wgmma_probe_options,
                                           "wgmma_probe", &fcl_sm90a_route, &kern);
  if (fcl_status_is_oom(st)) {
    fcl_clear_error(ctx);
    return fcl_wgmma_defer(ctx, flashcl_status_string(st));
  }
  if (st != FLASHCL_SUCCESS) {
    char msg[400];
    snprintf(msg, sizeof msg, "the probe kernel does not build: %.360s", ctx->errmsg);
    fcl_clear_error(ctx);
    return fcl_wgmma_disable(ctx, msg);
  }
  enum { N = 64 };
  /* a, b: small integers, exact in fp16; d: the kernel's two products. */
  int *ai = malloc(2 * N * N * sizeof *ai);
  unsigned short *ah = malloc(2 * N * N * sizeof *ah);
  float *d = malloc(2 * N * N * sizeof *d);
  if (!ai || !ah || !d) {
    free(ai);
    free(ah);
    free(d);
    return fcl_wgmma_defer(ctx, "out of host memory");
  }
  int *bi = ai + N * N;
  for (int i = 0; i < N * N; i++) {
    ah[i] = fcl_small_int_half(ai[i] = (i * 7 + i / N) % 9 - 4);
    ah[N * N + i] = fcl_small_int_half(bi[i] = (i * 5 + i / N) % 7 - 3);
  }
  const size_t half_bytes = N * N * sizeof *ah;
  cl_int err = CL_SUCCESS, e2 = CL_SUCCESS, e3 = CL_SUCCESS;
  cl_mem ba = clCreateBuffer(ctx->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, half_bytes, ah, &err);
  cl_mem bb = clCreateBuffer(ctx->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, half_bytes, ah + N * N, &e2);
  cl_mem bd = clCreateBuffer(ctx->context, CL_MEM_WRITE_ONLY, 2 * N * N * sizeof *d, NULL, &e3);
  if (err == CL_SUCCESS) err = e2;
  if (err == CL_SUCCESS) err = e3;
  if (err == CL_SUCCESS) err = clSetKernelArg(kern, 0, sizeof ba, &ba);
  if (err == CL_SUCCESS) err = clSetKernelArg(kern, 1, sizeof bb, &bb);
  if (err == CL_SUCCESS) err = clSetKernelArg(kern, 2, sizeof bd, &bd);
  if (err == CL_SUCCESS) err = fcl_probe_run(ctx, kern, 128, bd, 2 * N * N * sizeof *d, d);
  if (ba) clReleaseMemObject(ba);
  if (bb) clReleaseMemObject(bb);
  if (bd) clReleaseMemObject(bd);
  const char *wrong = NULL;
  for (int m = 0; m < N && err == CL_SUCCESS && !wrong; m++)
    for (int n = 0; n < N && !wrong; n++) {
      int abt = 0, ab = 0;
      for (int x = 0; x < N; x++) {
        abt += ai[m * N + x] * bi[n * N + x];
        ab += ai[m * N + x] * bi[x * N + n];
      }
      if (d[m * N + n] != (float)abt) wrong = "the probe's A B^T (local-memory operands) is wrong";
      else if (d[N * N + m * N + n] != (float)ab) wrong = "the probe's A B (A in registers, B N-major) is wrong";
    }
  free(ai);
  free(ah);
  free(d);
  /* As the mma.sync probe: out of memory defers, a fault (CL_OUT_OF_RESOURCES) does not. */
  if (fcl_cl_is_alloc_failure(err)) return fcl_wgmma_defer(ctx, fcl_cl_error_name(err));
  if (err != CL_SUCCESS) {
    char msg[128];
    snprintf(msg, sizeof msg, "the probe kernel failed to run (%s)", fcl_cl_error_name(err));
    return fcl_wgmma_disable(ctx, msg);
  }
  if (wrong) return fcl_wgmma_disable(ctx, wrong);
  return 1;
}

int fcl_wgmma_available(flashcl_context *ctx) {
  if (ctx->wgmma_state) return ctx->wgmma_state > 0;
  if (!fcl_mma_available(ctx)) /* an undecided tensor-core path (its probe deferred) decides nothing here */
    return ctx->mma_state < 0 ? fcl_wgmma_disable(ctx, "the tensor-core path is unavailable") : 0;
  if (ctx->mma_cc != 90) return fcl_wgmma_disable(ctx, "the compute capability is not 9.0 (wgmma is sm_90a only)");
  if (!fcl_wgmma_run_probe(ctx)) return 0;
  ctx->wgmma_state = 1;
  fcl_log(ctx, "Hopper wgmma forward available");
  return 1;
}

int fcl_wgmma_covered(flashcl_context *ctx, const fcl_problem *p) {
  if (p->head_dim % 8 || p->head_dim > 256) return 0;
  if (p->dropout || p->mask_kind || p->paged_kv) return 0;
  if (!fcl_wgmma_available(ctx)) return 0;
  fcl_wgmma_config c;
  if (fcl_wgmma_pick(ctx, p, NULL, &c)) return 1;
  fcl_log(ctx, "wgmma forward: no tile fits %zu bytes of local memory at d = %d: running mma.sync",
          fcl_mma_local_cap(ctx, p->head_dim), p->head_dim);
  return 0;
}

void fcl_wgmma_build_failed(flashcl_context *ctx) {
  char msg[sizeof ctx->wgmma_reason];
  snprintf(msg, sizeof msg, "a forward kernel does not build: %.440s", ctx->errmsg);
  fcl_clear_error(ctx);
  fcl_wgmma_disable(ctx, msg);
}

flashcl_status fcl_wgmma_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                 const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                 cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  fcl_wgmma_config c = {0, 0, 2};
  flashcl_status st = fcl_wgmma_config_of(ctx, p, tu, &c);
  if (st != FLASHCL_SUCCESS) return st;
  const int threads = c.nwg * 128, block_r = c.nwg * 64;
  const char *extra = ctx->build_options;
  char opts[640], variants[128];
  fcl_variant_options(p, variants, sizeof variants);
  const int causal = p->causal && !p->window; /* a window carries causal as window_right = 0 */
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DUSE_PTX=1 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_C=%d -DNWG=%d -DSTAGES=%d "
           "-DCAUSAL=%d -DVARLEN=%d%s%s%s",
           (int)p->dtype, p->head_dim, c.block_c, c.nwg, c.stages, causal, p->varlen, variants,
           extra ? " " : "",
           extra ? extra : "");
  cl_kernel kern;
  char src[192];
  fcl_mma_sources(p, "wgmma_ptx.cl+flash_fwd_wgmma.cl", src, sizeof src);
  st = fcl_get_kernel_retargeted(ctx, src, opts, "flash_fwd_wgmma", &fcl_sm90a_route, &kern);
  if (st != FLASHCL_SUCCESS) return st;
  if (ctx->verbose >= 2) fcl_print_build_log(ctx, kern, "flash_fwd_wgmma", opts);
  /* No CL_KERNEL_WORK_GROUP_SIZE check here (flash_fwd_mma has one): for this
   * program, built from PTX, NVIDIA's driver reports 256 while the kernel's
   * reqd_work_group_size of 384 launches and runs correctly (H100). */

  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_forward(&a, p, desc, q, k, v, o, lse);
  fcl_arg_variants(&a, p);
  fcl_arg_mem(&a, p->sinks);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(flash_fwd_wgmma)");

  size_t qblocks = ((size_t)p->seqlen_q + block_r - 1) / block_r;
  size_t global[3] = {qblocks * threads, (size_t)p->heads_q, (size_t)p->batch};
  size_t local[3] = {(size_t)threads, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, local, nwait, nwait ? wait : NULL, out_event);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clEnqueueNDRangeKernel(flash_fwd_wgmma)");
  return FLASHCL_SUCCESS;
}
