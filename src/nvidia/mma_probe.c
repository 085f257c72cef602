/* Whether the device runs the tensor-core kernels' inline PTX: decided once
 * per context, on the first call that could use it (mma_forward.c says how). */
#include "core/internal.h"
#include "nvidia/nvidia.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV
#define CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000
#define CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV 0x4001
#endif

static const char *const fcl_mma_probe_options = "-cl-std=CL1.2 -DUSE_PTX=1 -DPROBE_ONLY=1";

static int fcl_mma_disable(flashcl_context *ctx, const char *fmt, const char *arg) {
  snprintf(ctx->mma_reason, sizeof ctx->mma_reason, fmt, arg ? arg : "");
  ctx->mma_state = -1;
  fcl_log(ctx, "NVIDIA tensor-core forward disabled: %s", ctx->mma_reason);
  return 0;
}

/* A probe that could not run for want of memory says nothing about the
 * device: the state stays undecided, so that the next call probes again
 * rather than losing the tensor cores for the context's lifetime. */
static int fcl_mma_defer(flashcl_context *ctx, const char *what) {
  ctx->probe_defers++;
  snprintf(ctx->mma_reason, sizeof ctx->mma_reason,
           "the probe kernel could not run (%s); it runs again on the next call", what);
  fcl_log(ctx, "NVIDIA tensor-core kernels not used for this call: %s", ctx->mma_reason);
  return 0;
}

unsigned short fcl_small_int_half(int x) {
  /* Exact fp16 bits of a small integer |x| <= 64. */
  if (x == 0) return 0;
  unsigned short sign = x < 0 ? 0x8000 : 0;
  unsigned a = (unsigned)(x < 0 ? -x : x);
  int e = 0;
  while ((a >> e) > 1) e++;
  unsigned mant = (a << (10 - e)) & 0x3ff;
  return (unsigned short)(sign | ((unsigned)(e + 15) << 10) | mant);
}

/* Runs mma_probe; returns 1 if it is exact, else 0 with ctx->mma_reason set. */
static int fcl_mma_run_probe(flashcl_context *ctx) {
  cl_kernel kern;
  flashcl_status st = fcl_get_kernel(ctx, "mma_ptx.cl+seq_bounds.cl+flash_fwd_mma.cl", fcl_mma_probe_options, "mma_probe", &kern);
  if (fcl_status_is_oom(st)) {
    fcl_clear_error(ctx);
    return fcl_mma_defer(ctx, flashcl_status_string(st));
  }
  if (st != FLASHCL_SUCCESS) {
    /* Keep the start of the build log: it says which instruction was refused. */
    char msg[400];
    snprintf(msg, sizeof msg, "%.399s", ctx->errmsg);
    fcl_clear_error(ctx);
    return fcl_mma_disable(ctx, "the probe kernel does not build: %s", msg);
  }
  int ai[256], bi[128];
  unsigned short ah[256], bh[128];
  for (int i = 0; i < 256; i++) ah[i] = fcl_small_int_half(ai[i] = (i * 7) % 9 - 4);
  for (int i = 0; i < 128; i++) bh[i] = fcl_small_int_half(bi[i] = (i * 5) % 7 - 3);
  float d[144];
  cl_int err = CL_SUCCESS, e2 = CL_SUCCESS, e3 = CL_SUCCESS;
  cl_mem ba = clCreateBuffer(ctx->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof ah, ah, &err);
  cl_mem bb = clCreateBuffer(ctx->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof bh, bh, &e2);
  cl_mem bd = clCreateBuffer(ctx->context, CL_MEM_WRITE_ONLY, sizeof d, NULL, &e3);
  if (err == CL_SUCCESS) err = e2;
  if (err == CL_SUCCESS) err = e3;
  if (err == CL_SUCCESS) err = clSetKernelArg(kern, 0, sizeof ba, &ba);
  if (err == CL_SUCCESS) err = clSetKernelArg(kern, 1, sizeof bb, &bb);
  if (err == CL_SUCCESS) err = clSetKernelArg(kern, 2, sizeof bd, &bd);
  if (err == CL_SUCCESS) err = fcl_probe_run(ctx, kern, 32, bd, sizeof d, d);
  if (ba) clReleaseMemObject(ba);
  if (bb) clReleaseMemObject(bb);
  if (bd) clReleaseMemObject(bd);
  /* Out of memory defers; a fault (CL_OUT_OF_RESOURCES) is what the probe is there to see. */
  if (fcl_cl_is_alloc_failure(err)) return fcl_mma_defer(ctx, fcl_cl_error_name(err));
  if (err != CL_SUCCESS) return fcl_mma_disable(ctx, "the probe kernel failed to run (%s)", fcl_cl_error_name(err));
  for (int m = 0; m < 16; m++) {
    int rs = 0;
    for (int n = 0; n < 8; n++) {
      int acc = 0;
      for (int x = 0; x < 16; x++) acc += ai[m * 16 + x] * bi[x * 8 + n];
      rs += acc;
      if (d[m * 8 + n] != (float)acc) return fcl_mma_disable(ctx, "the probe kernel computed a wrong product%s", "");
    }
    if (d[128 + m] != (float)rs) return fcl_mma_disable(ctx, "the probe kernel's shuffle reduction is wrong%s", "");
  }
  return 1;
}

/* 1 if the context's device runs the tensor-core path (probing on first call). */
int fcl_mma_available(flashcl_context *ctx) {
  if (ctx->mma_state) return ctx->mma_state > 0;
  if (!fcl_platform_is_nvidia(ctx))
    return fcl_mma_disable(ctx, "the platform (%s) is not NVIDIA's", ctx->info.platform_name);
  size_t n = 0;
  int has_attr = 0;
  if (clGetDeviceInfo(ctx->device, CL_DEVICE_EXTENSIONS, 0, NULL, &n) == CL_SUCCESS && n) {
    char *ext = malloc(n + 1);
    if (ext && clGetDeviceInfo(ctx->device, CL_DEVICE_EXTENSIONS, n, ext, NULL) == CL_SUCCESS) {
      ext[n] = '\0';
      has_attr = strstr(ext, "cl_nv_device_attribute_query") != NULL;
    }
    free(ext);
  }
  if (!has_attr) return fcl_mma_disable(ctx, "the device lacks cl_nv_device_attribute_query%s", "");
  cl_uint major = 0, minor = 0;
  if (clGetDeviceInfo(ctx->device, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major, NULL) != CL_SUCCESS)
    return fcl_mma_disable(ctx, "the compute capability query failed%s", "");
  clGetDeviceInfo(ctx->device, CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV, sizeof minor, &minor, NULL);
  if (major < 8) {
    char cc[32];
    snprintf(cc, sizeof cc, "%u.%u", major, minor);
    return fcl_mma_disable(ctx, "compute capability %s < 8.0", cc);
  }
  if (ctx->info.local_mem_size < 48 * 1024)
    return fcl_mma_disable(ctx, "the device has less than 48 KiB of local memory%s", "");
  if (!fcl_mma_run_probe(ctx)) return 0;
  ctx->mma_state = 1;
  ctx->mma_cc = (int)(major * 10 + minor);
  ctx->mma_local_bytes = fcl_local_budget(ctx);
  fcl_log(ctx, "NVIDIA tensor-core kernels available (compute capability %u.%u, %zu bytes of local memory per work-group)",
          major, minor, ctx->mma_local_bytes);
  return 1;
}

size_t fcl_mma_local_cap(flashcl_context *ctx, int head_dim) {
  if (head_dim <= 128) return ctx->mma_local_bytes;
  const size_t wide = fcl_local_limit(ctx);
  return wide > ctx->mma_local_bytes ? wide : ctx->mma_local_bytes;
}
