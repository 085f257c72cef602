/* Device probes: running one small kernel privately, and the local-memory budget.
 *
 * Local-memory budget. Tiles are planned against the local memory a work-group
 * may really use. That is CL_DEVICE_LOCAL_MEM_SIZE everywhere except on NVIDIA
 * GPUs, whose driver reports 48 KiB (CUDA's static limit) but runs work-groups
 * with far more (an H100 SM has 227 KiB for one block). There, on the first call
 * that plans tiles, cl/common/local_probe.cl is built with FCL_LOCAL_PROBE bytes of
 * __local and run; if it builds, runs and reads back the right values, the budget
 * is FCL_LOCAL_PROBE. A failure of any kind only keeps the reported size: the
 * reason goes to fcl_log, never to the caller. Other platforms are not probed: a
 * driver that honours its report would only spend a failed build on it.
 * The context tuning's local_probe = 0 skips the probe (comparisons, or a driver
 * that misbehaves). Under its local_mem (a testing aid: M as if the device reported less)
 * the budget still starts from what the device reports, so the rules for a
 * budget above M can be exercised on any device, PoCL included. */
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest tensor-core configuration needs 145 KiB (backward dK/dV at
 * d = 128: 8 warps, K and V tiles, two Q/dO buffers and the atomic dS tile; at
 * 255 registers one such work-group runs per H100 SM). */
#define FCL_LOCAL_PROBE (160 * 1024)
/* Larger sizes tried after FCL_LOCAL_PROBE succeeded, largest first (an H100
 * block may have 227 KiB, less 256 bytes for the probe's own few: its build
 * at exactly 227 KiB fails by 4 bytes; an A100 block 163 KiB). Tiles are not planned against
 * them, so that the tuned plans stay as measured; they only bound additions
 * such as the forward's second K/V tile (fcl_local_limit). */
static const int FCL_LOCAL_PROBE_MORE[] = {227 * 1024 - 256, 192 * 1024};

cl_int fcl_probe_run(flashcl_context *ctx, cl_kernel kern, size_t gsz, cl_mem out, size_t bytes, void *host) {
  cl_int err = CL_SUCCESS;
  cl_command_queue q = clCreateCommandQueue(ctx->context, ctx->device, 0, &err);
  if (err != CL_SUCCESS || !q) return err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES;
  err = clEnqueueNDRangeKernel(q, kern, 1, NULL, &gsz, &gsz, 0, NULL, NULL);
  if (err == CL_SUCCESS) err = clEnqueueReadBuffer(q, out, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
  clReleaseCommandQueue(q);
  return err;
}

/* 1 if local_probe with `bytes` bytes of __local builds, runs and computes the
 * right values. */
static int fcl_run_local_probe(flashcl_context *ctx, int bytes) {
  char opts[96];
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DLOCAL_PROBE_BYTES=%d", bytes);
  cl_kernel kern;
  if (fcl_get_kernel(ctx, "local_probe.cl", opts, "local_probe", &kern) != FLASHCL_SUCCESS) {
    fcl_log(ctx, "local-memory probe does not build: %s", ctx->errmsg);
    fcl_clear_error(ctx);
    return 0;
  }
  cl_uint out[128];
  cl_int err = CL_SUCCESS;
  cl_mem bo = clCreateBuffer(ctx->context, CL_MEM_WRITE_ONLY, sizeof out, NULL, &err);
  if (err == CL_SUCCESS) err = clSetKernelArg(kern, 0, sizeof bo, &bo);
  if (err == CL_SUCCESS) err = fcl_probe_run(ctx, kern, 128, bo, sizeof out, out);
  if (bo) clReleaseMemObject(bo);
  if (err != CL_SUCCESS) {
    fcl_log(ctx, "local-memory probe failed to run (%s)", fcl_cl_error_name(err));
    return 0;
  }
  const cl_uint n = (cl_uint)bytes / 4;
  for (cl_uint tid = 0; tid < 128; tid++) {
    cl_uint x = 0;
    for (cl_uint i = tid; i < n; i += 128) {
      const cl_uint j = (cl_uint)(((unsigned long long)i * 7919u) % n);
      x ^= (cl_uint)(j * 2654435761u ^ 0x5bd1e995u) + i;
    }
    if (out[tid] != x) {
      fcl_log(ctx, "local-memory probe read back wrong values");
      return 0;
    }
  }
  return 1;
}

size_t fcl_local_budget(flashcl_context *ctx) {
  if (ctx->local_budget) return ctx->local_budget;
  size_t budget = ctx->local_mem_actual;
  /* The context tuning's local_probe (0 or 1) overrides the rule: NVIDIA GPUs. */
  const int allowed = ctx->local_probe >= 0 ? ctx->local_probe : ctx->info.is_gpu && fcl_platform_is_nvidia(ctx);
  if (allowed && budget < FCL_LOCAL_PROBE &&
      fcl_run_local_probe(ctx, FCL_LOCAL_PROBE)) {
    budget = FCL_LOCAL_PROBE;
    fcl_log(ctx, "local memory: the device runs work-groups with %zu bytes (it reports %zu)", budget,
            ctx->local_mem_actual);
  }
  ctx->local_budget = budget;
  return budget;
}

/* The budget, or where the budget itself was probed, the first of
 * FCL_LOCAL_PROBE_MORE a work-group runs with (probed on first use). */
size_t fcl_local_limit(flashcl_context *ctx) {
  if (ctx->local_limit) return ctx->local_limit;
  size_t limit = fcl_local_budget(ctx);
  if (limit == FCL_LOCAL_PROBE && limit > ctx->local_mem_actual) {
    for (size_t i = 0; i < sizeof FCL_LOCAL_PROBE_MORE / sizeof FCL_LOCAL_PROBE_MORE[0]; i++)
      if (fcl_run_local_probe(ctx, FCL_LOCAL_PROBE_MORE[i])) {
        limit = (size_t)FCL_LOCAL_PROBE_MORE[i];
        fcl_log(ctx, "local memory: work-groups run with up to %zu bytes", limit);
        break;
      }
  }
  ctx->local_limit = limit;
  return limit;
}

flashcl_status fcl_mma_refusal(flashcl_context *ctx, const char *what) {
  if (ctx->mma_state == 0)
    return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY, "%s are not usable now: %s", what, ctx->mma_reason);
  return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "%s are not available: %s", what, ctx->mma_reason);
}
