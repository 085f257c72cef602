/* The NVIDIA tensor-core forward path (cl/nvidia/flash_fwd_mma.cl): selection, probe
 * and launch.
 *
 * Selection. desc->kernel = NVIDIA_MMA asks for it; AUTO takes it when the
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
 * Coverage: fp16 and bf16, head_dim a multiple of 16 up to 256 (the backward: up
 * to 128), scale > 0, and every tensor's
 * element offset and (batch, seq, head) strides a multiple of 8 elements (16-byte
 * rows for cp.async); causal, GQA, varlen, dropout, the sliding window, ALiBi,
 * softcap, attention masks and (forward only) a paged K/V source compose. Other
 * problems run the portable kernels.
 *
 * FLASHCL_KERNEL ("portable" or "nvidia_mma") overrides desc.kernel = AUTO; a
 * desc.tuning of a family decides the family itself. The tiles are the mma_fwd
 * tuning's (src/core/tuning_space.c), checked against the kernel's rules and the
 * local memory.
 */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"

#include <math.h>
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
  flashcl_status st = fcl_get_kernel(ctx, "mma_ptx.cl+flash_fwd_mma.cl", fcl_mma_probe_options, "mma_probe", &kern);
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

typedef struct fcl_mma_config {
  int nwarps, m_tiles, block_c, q_in_smem, kv_stages;
} fcl_mma_config;

/* Local bytes of flash_fwd_mma: its SMEM_ROWS rows of SWZ_ROW 16-byte chunks (the
 * row rounded up to 64 elements, for the swizzle). */
static size_t fcl_mma_fwd_local(const fcl_mma_config *c, int d) {
  const size_t br = (size_t)c->nwarps * 16 * c->m_tiles, kv = 2 * (size_t)c->kv_stages * c->block_c;
  const size_t rows = c->q_in_smem ? br + kv : (kv > br ? kv : br);
  return rows * (size_t)((d + 63) / 64 * 64) * 2;
}

/* The default rule, then the mma_fwd tuning's values where set (tu may be NULL). */
static fcl_mma_config fcl_mma_pick(const flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu) {
  /* Measured on the H100 (fp16, N = 2K/8K): d = 64 runs best with Br = 128 (4
   * warps x 32 rows, Q in registers) and Bc = 64; d = 128 with Br = 128, Bc = 32
   * and Q re-read from local memory (Q in registers with 32 rows per warp spills,
   * and 16 rows per warp doubles the ldmatrix traffic per mma). */
  fcl_mma_config c = {4, 2, 64, 0, 2};
  if (p->head_dim > 64) {
    c.block_c = 32;
    c.q_in_smem = 1;
  }
  /* Other head dims, measured at d = 32, 96 and 256 (N = 8K; BENCHMARKS.md):
   * up to 64 the d = 64 configuration is best; between 64 and 128, 48-key tiles
   * (d = 96: 6% faster than 32, 7-14% faster than 64); past 128 the O
   * accumulators of 32 rows per warp (d registers per lane) do not fit, and 8
   * warps of 16 rows (Br = 128) beat 4 (Br = 64) by 7-9% at d = 256, with Q in
   * registers by another 4-10% (16 rows leave room for its fragments). */
  if (p->head_dim > 64 && p->head_dim < 128) c.block_c = 48;
  if (p->head_dim > 128) {
    c.nwarps = 8;
    c.m_tiles = 1;
    c.q_in_smem = 0;
  }
  /* Two K | V stages where the local memory allows (d = 64: 32 KiB; d = 128:
   * 64 KiB, so only past the probe): measured 3.6% (d = 64) and 2.5% (d = 128)
   * faster at N = 8K, 12% for causal d = 64. */
  if (fcl_mma_fwd_local(&c, p->head_dim) > ctx->mma_local_bytes) c.kv_stages = 1;
  if (fcl_mma_fwd_local(&c, p->head_dim) > ctx->mma_local_bytes && c.nwarps == 8) c.nwarps = 4;
  if (!tu) return c;
  c.nwarps = fcl_tuned_get(tu, FCL_MMAF_NWARPS, c.nwarps);
  c.m_tiles = fcl_tuned_get(tu, FCL_MMAF_M_TILES, c.m_tiles);
  c.block_c = fcl_tuned_get(tu, FCL_MMAF_BLOCK_C, c.block_c);
  c.q_in_smem = fcl_tuned_get(tu, FCL_MMAF_Q_IN_SMEM, c.q_in_smem);
  c.kv_stages = fcl_tuned_get(tu, FCL_MMAF_KV_STAGES, c.kv_stages);
  return c;
}

/* The mma_fwd configuration a call runs: the tuned one where it fits the
 * kernel's rules and the local memory; else, for a database entry, the rule
 * (logged), and for a per-call tuning FLASHCL_ERROR_UNSUPPORTED. */
static flashcl_status fcl_mma_config_of(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu,
                                        fcl_mma_config *out) {
  fcl_mma_config c = fcl_mma_pick(ctx, p, tu);
  const char *why = NULL;
  if (c.kv_stages > 2) why = "kv_stages above 2";
  else if (c.nwarps * 16 * c.m_tiles > 256) why = "more than 256 query rows per work-group";
  else if (fcl_mma_fwd_local(&c, p->head_dim) > ctx->mma_local_bytes) why = "its tiles do not fit the local memory";
  if (why && tu->source == FLASHCL_TUNING_SOURCE_CALL)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "mma_fwd tuning refused: %s", why);
  if (why) {
    fcl_log(ctx, "mma_fwd tuning from %s ignored (%s): the default rule runs", tu->origin, why);
    c = fcl_mma_pick(ctx, p, NULL);
  }
  const int ran[FCL_MMAF_COUNT] = {c.nwarps, c.m_tiles, c.block_c, c.q_in_smem, c.kv_stages};
  for (int i = 0; i < FCL_MMAF_COUNT; i++) fcl_tuned_ran(tu, i, ran[i]);
  *out = c;
  return fcl_tuned_honoured(ctx, tu);
}

flashcl_status fcl_mma_fwd_config(flashcl_context *ctx, const fcl_problem *p, fcl_tuned *tu, flashcl_config *cfg) {
  fcl_mma_config c;
  flashcl_status st = fcl_mma_config_of(ctx, p, tu, &c);
  if (st != FLASHCL_SUCCESS) return st;
  fcl_tuned_report(tu, cfg);
  snprintf(cfg->kernel, sizeof cfg->kernel, "flash_fwd_mma");
  cfg->block_r = c.nwarps * 16 * c.m_tiles;
  cfg->block_c = c.block_c;
  cfg->threads = c.nwarps * 32;
  cfg->local_bytes = fcl_mma_fwd_local(&c, p->head_dim);
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_mma_select(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                              const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                              const flashcl_tensor *o, flashcl_pass pass, flashcl_kernel_family forced, int *use) {
  *use = 0;
  flashcl_kernel_family fam = desc->kernel;
  if (forced != FLASHCL_KERNEL_AUTO) {
    /* desc.tuning names a family: it decides, and must agree with desc.kernel. */
    if (fam != FLASHCL_KERNEL_AUTO && fam != forced)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "desc.tuning is for the %s kernels but desc.kernel asks for the %s ones",
                      forced == FLASHCL_KERNEL_PORTABLE ? "portable" : "tensor-core",
                      fam == FLASHCL_KERNEL_PORTABLE ? "portable" : "tensor-core");
    fam = forced;
  } else if (fam == FLASHCL_KERNEL_AUTO) {
    fam = ctx->env_kernel;
  }
  if (fam == FLASHCL_KERNEL_PORTABLE) return FLASHCL_SUCCESS;
  const int explicit_mma = fam == FLASHCL_KERNEL_NVIDIA_MMA;
  if (!fcl_mma_available(ctx)) {
    if (explicit_mma)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "the NVIDIA tensor-core kernels are not available: %s",
                      ctx->mma_reason);
    return FLASHCL_SUCCESS;
  }
  const char *why = NULL;
  if (p->dtype != FLASHCL_F16 && p->dtype != FLASHCL_BF16)
    why = "dtype is not f16/bf16";
  else if (p->head_dim % 16 || p->head_dim > (pass == FLASHCL_PASS_BACKWARD ? 128 : 256))
    why = pass == FLASHCL_PASS_BACKWARD ? "head_dim is not a multiple of 16 up to 128"
                                        : "head_dim is not a multiple of 16 up to 256";
  else if (pass == FLASHCL_PASS_BACKWARD && !fcl_mma_bwd_covered(ctx, p, 0))
    why = "no backward tiles fit the local memory";
  else if (!(p->scale > 0.0f))
    why = "scale is not positive";
  else if (p->paged_kv && pass == FLASHCL_PASS_BACKWARD)
    why = "paged K/V source";
  else if (!fcl_rows_aligned16(q) || !fcl_rows_aligned16(k) || !fcl_rows_aligned16(v) || !fcl_rows_aligned16(o))
    why = "rows are not 16-byte aligned (offsets/strides not multiples of 8 elements)";
  else if (pass == FLASHCL_PASS_FORWARD) {
    const fcl_mma_config c = fcl_mma_pick(ctx, p, NULL);
    if (fcl_mma_fwd_local(&c, p->head_dim) > ctx->mma_local_bytes) why = "its tiles need more local memory than the device allows";
  }
  if (why && forced != FLASHCL_KERNEL_AUTO)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "desc.tuning asks for the tensor-core %s, which does not cover "
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
  snprintf(buf, cap, "mma_ptx.cl+%s%smma_scores.cl+%s", p->dropout ? "philox.cl+" : "",
           p->mask_kind ? "mask.cl+mask_mma.cl+" : "", kernel_file);
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
  char opts[640], variants[64];
  fcl_variant_options(p, variants, sizeof variants);
  const int causal = p->causal && !p->window; /* a window carries causal as window_right = 0 */
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DUSE_PTX=1 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_C=%d -DNWARPS=%d -DM_TILES=%d -DQ_IN_SMEM=%d "
           "-DKV_STAGES=%d -DCAUSAL=%d -DVARLEN=%d -DDROPOUT=%d -DPAGE_SHIFT=%d%s%s%s",
           (int)p->dtype, p->head_dim, c.block_c, c.nwarps, c.m_tiles, c.q_in_smem, c.kv_stages, causal, p->varlen,
           p->dropout, p->paged_kv ? fcl_page_shift(p->kv_page_size) : -1, variants, extra ? " " : "", extra ? extra : "");
  cl_kernel kern;
  char src[96];
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
  fcl_arg_paged(&a, p);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(flash_fwd_mma)");

  size_t qblocks = ((size_t)p->seqlen_q + block_r - 1) / block_r;
  size_t global[3] = {qblocks * threads, (size_t)p->heads_q, (size_t)p->batch};
  size_t local[3] = {(size_t)threads, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, local, nwait, nwait ? wait : NULL, out_event);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clEnqueueNDRangeKernel(flash_fwd_mma)");
  return FLASHCL_SUCCESS;
}
