/*
 * flashcl-bench --first-call: how long a process takes from main() to its
 * first forward result, split into context creation, device inputs and the
 * first call (which builds or loads its programs and runs the device probes),
 * next to a second call. Run it twice to see a cold and a warm start: the
 * program cache (<cache dir>/programs) and the driver's own cache make the
 * difference. Inputs are filled on the device, so no host data is timed.
 */
#include "bench_first_call.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"

typedef struct fc_opts {
  const char *device;
  long n, d, batch, heads;
  int causal, driver_first;
  flashcl_dtype dtype;
} fc_opts;

static int fc_parse(int argc, char **argv, fc_opts *o) {
  const args_opt table[] = {
      {.name = "--first-call", .kind = ARG_FLAG}, /* what brought us here */
      {.name = "--driver-first", .kind = ARG_FLAG, .dest = &o->driver_first},
      {.name = "--device", .kind = ARG_STRING, .dest = &o->device},
      {.name = "--n", .kind = ARG_LONG, .dest = &o->n, .lo = 1, .hi = LONG_MAX},
      {.name = "--d", .kind = ARG_LONG, .dest = &o->d, .lo = 8, .hi = LONG_MAX},
      {.name = "--batch", .kind = ARG_LONG, .dest = &o->batch, .lo = 1, .hi = LONG_MAX},
      {.name = "--heads", .kind = ARG_LONG, .dest = &o->heads, .lo = 1, .hi = LONG_MAX},
      {.name = "--causal", .kind = ARG_CAUSAL, .dest = &o->causal},
      {.name = "--dtype", .kind = ARG_DTYPE, .dest = &o->dtype},
  };
  o->device = NULL, o->n = 4096, o->d = 128, o->batch = 0, o->heads = 0, o->causal = 0, o->dtype = FLASHCL_F16;
  o->driver_first = 0;
  const args_status st = args_parse(argc, argv, "flashcl-bench --first-call", table, ARGS_COUNT(table));
  if (st == ARGS_UNKNOWN)
    fprintf(stderr, "flashcl-bench --first-call takes --device, --n, --d, --batch, --heads, --causal, --dtype\n");
  return st == ARGS_OK ? 0 : -1;
}

/* q, k, v filled with a non-zero pattern and o, on the device. */
static int fc_inputs(flashcl_context *ctx, const fc_opts *o, cl_mem b[4], flashcl_tensor t[4]) {
  const size_t es = flashcl_dtype_size(o->dtype), bytes = (size_t)o->batch * o->n * o->heads * o->d * es;
  const unsigned char pat[4] = {0x55, 0x35, 0x55, 0x35}; /* about 0.33 in f16, small values in f32/bf16 */
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < 4 && !err; ++i) {
    b[i] = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (!err && i < 3) err = clEnqueueFillBuffer(flashcl_context_cl_queue(ctx), b[i], pat, es, 0, bytes, 0, NULL, NULL);
    if (!err) flashcl_tensor_init_bnhd(&t[i], b[i], 0, o->dtype, o->batch, o->n, o->heads, o->d);
  }
  return err ? err : clFinish(flashcl_context_cl_queue(ctx));
}

static int fc_forward(flashcl_context *ctx, const fc_opts *o, const flashcl_tensor t[4]) {
  flashcl_attention_desc desc;
  flashcl_attention_desc_init(&desc);
  desc.mask.causal = o->causal;
  const int st = flashcl_attention_forward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], NULL, 0, NULL, NULL);
  return st ? st : clFinish(flashcl_context_cl_queue(ctx));
}

/* --driver-first: a bare OpenCL context on every platform's first device,
 * kept alive, so that the driver's own start-up (ICD loading, the CUDA context
 * on NVIDIA) is timed apart from flashcl_context_create. */
static double fc_driver_start(cl_context *keep) {
  const double t = tools_now_ms();
  cl_platform_id pf[8];
  cl_uint np = 0;
  *keep = NULL;
  if (clGetPlatformIDs(8, pf, &np) != CL_SUCCESS) return tools_now_ms() - t;
  for (cl_uint i = 0; i < np && !*keep; ++i) {
    cl_device_id dev;
    cl_int err;
    if (clGetDeviceIDs(pf[i], CL_DEVICE_TYPE_GPU, 1, &dev, NULL) != CL_SUCCESS &&
        clGetDeviceIDs(pf[i], CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS)
      continue;
    *keep = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  }
  return tools_now_ms() - t;
}

int bench_first_call_main(int argc, char **argv) {
  const double t0 = tools_now_ms();
  fc_opts o;
  flashcl_context *ctx = NULL;
  flashcl_context_options opts;
  flashcl_context_stats stats;
  flashcl_device_info info;
  cl_mem b[4] = {NULL, NULL, NULL, NULL};
  flashcl_tensor t[4];
  if (fc_parse(argc, argv, &o)) return 1;
  cl_context bare = NULL;
  const double driver_ms = o.driver_first ? fc_driver_start(&bare) : 0.0;
  flashcl_context_options_init(&opts);
  opts.device = o.device;
  int st = flashcl_context_create(&opts, &ctx);
  const double t1 = tools_now_ms();
  if (!st) st = flashcl_context_device_info(ctx, &info);
  if (!o.batch) o.batch = info.is_gpu ? (16384 / o.n > 0 ? 16384 / o.n : 1) : 1;
  if (!o.heads) o.heads = (info.is_gpu ? 2048 : 128) / o.d > 0 ? (info.is_gpu ? 2048 : 128) / o.d : 1;
  if (!st) st = fc_inputs(ctx, &o, b, t);
  const double t2 = tools_now_ms();
  if (!st) st = fc_forward(ctx, &o, t);
  const double t3 = tools_now_ms();
  if (!st) st = fc_forward(ctx, &o, t);
  const double t4 = tools_now_ms();
  if (st) {
    tools_print_error(stderr, ctx, "flashcl-bench --first-call", st);
  } else {
    flashcl_context_stats_get(ctx, &stats);
    printf("flashcl-bench --first-call: d=%ld %s causal=%d N=%ld batch=%ld heads=%ld on %s (cache: %s)\n", o.d,
           flashcl_dtype_name(o.dtype), o.causal, o.n, o.batch, o.heads, info.device_name,
           *flashcl_context_cache_dir(ctx) ? flashcl_context_cache_dir(ctx) : "none");
    if (o.driver_first)
      printf("  driver start %9.1f ms (a bare OpenCL context first; flashcl's context comes after it)\n", driver_ms);
    printf("  context      %9.1f ms\n  inputs       %9.1f ms (on the device)\n  first call   %9.1f ms (program "
           "builds or cache loads, probes, the forward)\n  second call  %9.1f ms\n  to first result %6.1f ms from "
           "main()\n  programs: %u built from source, %u loaded from the cache, %u cache entries rejected\n",
           t1 - t0, t2 - t1, t3 - t2, t4 - t3, t3 - t0, stats.programs_built, stats.programs_from_cache,
           stats.cache_rejected);
  }
  for (int i = 0; i < 4; ++i)
    if (b[i]) clReleaseMemObject(b[i]);
  flashcl_context_destroy(ctx);
  if (bare) clReleaseContext(bare);
  return st ? 1 : 0;
}
