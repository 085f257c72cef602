/* Context lifetime and device selection. */
#include "core/internal.h"
#include "core/tuning.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The smallest flashcl_context_options taken: 0.2's, the first layout with
 * struct_size (src/core/abi.c). Fields added later go at the end. */
#define FCL_OPTIONS_FIRST sizeof(flashcl_context_options)

flashcl_status flashcl_context_options_init_size(flashcl_context_options *options, size_t size) {
  flashcl_context_options d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  return fcl_struct_init(options, size, &d, sizeof d);
}

/* A caller's options as this library's struct; *options then points at full. */
static flashcl_status fcl_options_import(const flashcl_context_options **options, flashcl_context_options *full) {
  if (!*options) return FLASHCL_SUCCESS;
  memset(full, 0, sizeof *full);
  flashcl_status st = fcl_struct_import(NULL, *options, FCL_OPTIONS_FIRST, full, sizeof *full,
                                        "flashcl_context_options");
  if (st == FLASHCL_SUCCESS) *options = full;
  return st;
}

char *fcl_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static int fcl_contains_nocase(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  if (n == 0) return 1;
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
    if (i == n) return 1;
  }
  return 0;
}

static flashcl_status fcl_query_info(flashcl_context *ctx) {
  flashcl_device_info *in = &ctx->info;
  memset(in, 0, sizeof *in);
  clGetPlatformInfo(ctx->platform, CL_PLATFORM_NAME, sizeof in->platform_name - 1, in->platform_name, NULL);
  clGetDeviceInfo(ctx->device, CL_DEVICE_NAME, sizeof in->device_name - 1, in->device_name, NULL);
  clGetDeviceInfo(ctx->device, CL_DEVICE_VERSION, sizeof in->device_version - 1, in->device_version, NULL);
  cl_device_type type = 0;
  cl_ulong local = 0;
  cl_int err = clGetDeviceInfo(ctx->device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
  err |= clGetDeviceInfo(ctx->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
  err |= clGetDeviceInfo(ctx->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof in->max_work_group_size,
                         &in->max_work_group_size, NULL);
  err |= clGetDeviceInfo(ctx->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof in->compute_units, &in->compute_units,
                         NULL);
  err |= clGetDeviceInfo(ctx->device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof in->global_mem_size, &in->global_mem_size,
                         NULL);
  err |= clGetDeviceInfo(ctx->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof in->max_mem_alloc_size,
                         &in->max_mem_alloc_size, NULL);
  if (err != CL_SUCCESS) return fcl_fail(ctx, FLASHCL_ERROR_OPENCL, "clGetDeviceInfo failed");
  in->is_gpu = (type & CL_DEVICE_TYPE_GPU) != 0;
  in->local_mem_size = (size_t)local;
  ctx->local_mem_actual = (size_t)local;
  size_t ext_size = 0;
  if (clGetDeviceInfo(ctx->device, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_size) == CL_SUCCESS && ext_size) {
    char *ext = malloc(ext_size + 1);
    if (ext && clGetDeviceInfo(ctx->device, CL_DEVICE_EXTENSIONS, ext_size, ext, NULL) == CL_SUCCESS) {
      ext[ext_size] = '\0';
      in->has_fp16 = strstr(ext, "cl_khr_fp16") != NULL;
    }
    free(ext);
  }
  return FLASHCL_SUCCESS;
}

/* Loads the tuning sources and applies the context-wide "context" family:
 * local_mem plans as if the device reported less local memory (a testing aid
 * that lets PoCL run the plans of small-memory GPUs), local_probe overrides
 * the probe rule of src/core/probe.c, binary_cache = 0 turns the program cache off
 * (options.no_binary_cache turns it off whatever the tuning says). */
static void fcl_apply_device_tuning(flashcl_context *ctx, const flashcl_context_options *options) {
  fcl_tuning_load(ctx, options);
  const fcl_tune_key key = {0, FLASHCL_F32, 0, -1, 0};
  fcl_tuned t;
  fcl_tuning_resolve(ctx, FLASHCL_TUNE_CONTEXT, NULL, &key, &t);
  ctx->local_probe = fcl_tuned_get(&t, FCL_DEV_LOCAL_PROBE, -1);
  if (!fcl_tuned_get(&t, FCL_DEV_BINARY_CACHE, 1)) ctx->binary_cache = 0;
  if (fcl_tuned_has(&t, FCL_DEV_LOCAL_MEM)) {
    const size_t n = (size_t)t.val[FCL_DEV_LOCAL_MEM];
    if (n < ctx->local_mem_actual) ctx->info.local_mem_size = n;
    else
      fcl_log(ctx, "context.local_mem = %zu ignored (%s): it must be below the reported %zu", n, t.origin,
              ctx->local_mem_actual);
  }
}

/* Finds the device named by spec ("p:d" or a name substring), or the default:
 * the first GPU, else the first device of any type. */
static flashcl_status fcl_pick_device(flashcl_context *ctx, const char *spec, cl_platform_id *out_p,
                                      cl_device_id *out_d) {
  cl_uint np = 0;
  cl_int err = clGetPlatformIDs(0, NULL, &np);
  if (err != CL_SUCCESS || np == 0)
    return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_NOT_FOUND,
                    "no OpenCL platform found (clGetPlatformIDs: %s); is an ICD such as pocl-opencl-icd installed?",
                    fcl_cl_error_name(err));
  cl_platform_id plats[32];
  if (np > 32) np = 32;
  clGetPlatformIDs(np, plats, NULL);

  int want_p = -1, want_d = -1;
  if (spec && *spec) {
    char tail = 0;
    if (sscanf(spec, "%d:%d%c", &want_p, &want_d, &tail) != 2) want_p = want_d = -1;
  }
  int by_index = want_p >= 0;
  cl_platform_id any_p = NULL;
  cl_device_id any_d = NULL;
  for (cl_uint p = 0; p < np; p++) {
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0) continue;
    cl_device_id devs[64];
    if (nd > 64) nd = 64;
    clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs, NULL);
    /* The vendor too: PoCL's platform is "Portable Computing Language", its
     * vendor "The pocl project", and users type "pocl". */
    char pname[256] = {0}, pvendor[256] = {0};
    clGetPlatformInfo(plats[p], CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
    clGetPlatformInfo(plats[p], CL_PLATFORM_VENDOR, sizeof pvendor - 1, pvendor, NULL);
    for (cl_uint d = 0; d < nd; d++) {
      if (by_index) {
        if ((int)p == want_p && (int)d == want_d) {
          *out_p = plats[p];
          *out_d = devs[d];
          return FLASHCL_SUCCESS;
        }
        continue;
      }
      if (spec && *spec) {
        char dname[256] = {0}, both[800];
        clGetDeviceInfo(devs[d], CL_DEVICE_NAME, sizeof dname - 1, dname, NULL);
        snprintf(both, sizeof both, "%s %s (%s)", pname, dname, pvendor);
        if (fcl_contains_nocase(both, spec)) {
          *out_p = plats[p];
          *out_d = devs[d];
          return FLASHCL_SUCCESS;
        }
        continue;
      }
      cl_device_type type = 0;
      clGetDeviceInfo(devs[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
      if (type & CL_DEVICE_TYPE_GPU) {
        *out_p = plats[p];
        *out_d = devs[d];
        return FLASHCL_SUCCESS;
      }
      if (!any_d) {
        any_p = plats[p];
        any_d = devs[d];
      }
    }
  }
  if (spec && *spec)
    return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_NOT_FOUND,
                    "no OpenCL device matches \"%s\" (use \"<platform>:<device>\" indices or a name substring; "
                    "flashcl-info lists the devices)",
                    spec);
  if (!any_d) return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_NOT_FOUND, "no OpenCL device found");
  *out_p = any_p;
  *out_d = any_d;
  return FLASHCL_SUCCESS;
}

/* The cache directory: the option, else $FLASHCL_CACHE_DIR, else
 * $XDG_CACHE_HOME/flashcl, else $HOME/.cache/flashcl (malloc'ed; NULL when none
 * of them is set or memory is short: the caches are then off). */
static char *fcl_cache_dir_resolve(const char *opt) {
  const char *env = getenv("FLASHCL_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  const char *base = opt && *opt ? opt : env && *env ? env : NULL;
  if (base) return fcl_strdup(base);
  const char *root = xdg && *xdg ? xdg : home && *home ? home : NULL;
  if (!root) return NULL;
  const char *tail = xdg && *xdg ? "/flashcl" : "/.cache/flashcl";
  char *d = malloc(strlen(root) + strlen(tail) + 1);
  if (d) {
    strcpy(d, root);
    strcat(d, tail);
  }
  return d;
}

/* $FLASHCL_KERNEL: unset, "" or "auto", "portable", "nvidia_mma" (or "mma");
 * anything else is refused rather than silently ignored. */
static int fcl_env_kernel(const flashcl_context_options *options, flashcl_kernel_family *out) {
  const char *env = getenv("FLASHCL_KERNEL");
  *out = FLASHCL_KERNEL_AUTO;
  if (!env || !*env || !strcmp(env, "auto")) return 1;
  if (!strcmp(env, "portable")) return (*out = FLASHCL_KERNEL_PORTABLE), 1;
  if (!strcmp(env, "nvidia_mma") || !strcmp(env, "mma")) return (*out = FLASHCL_KERNEL_NVIDIA_MMA), 1;
  if (options && options->verbose)
    fprintf(stderr, "flashcl: FLASHCL_KERNEL=\"%s\" is not auto, portable or nvidia_mma\n", env);
  return 0;
}

/* A creation that fails after the context was allocated: its message stays
 * readable through flashcl_context_last_error(NULL). */
static flashcl_status fcl_create_failed(flashcl_context *ctx, flashcl_status st) {
  fcl_keep_create_error(ctx);
  flashcl_context_destroy(ctx);
  return st;
}

/* The last context serial handed out (struct flashcl_context.serial). */
static volatile int64_t fcl_context_serials;

static flashcl_status fcl_alloc_context(const flashcl_context_options *options, flashcl_context **out) {
  flashcl_kernel_family env_kernel;
  if (!fcl_env_kernel(options, &env_kernel))
    return fcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "FLASHCL_KERNEL=\"%s\" is not auto, portable or nvidia_mma",
                    getenv("FLASHCL_KERNEL"));
  flashcl_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return fcl_fail(NULL, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "out of host memory");
  if (fcl_mutex_init(&ctx->lock) != 0) {
    free(ctx);
    return fcl_fail(NULL, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "could not create the context's mutex");
  }
  ctx->serial = fcl_atomic_inc(&fcl_context_serials);
  ctx->env_kernel = env_kernel;
  const char *dir = options && options->kernel_dir ? options->kernel_dir : getenv("FLASHCL_KERNEL_DIR");
  if (dir && *dir) {
    ctx->kernel_dir = fcl_strdup(dir);
    if (!ctx->kernel_dir) {
      fcl_mutex_destroy(&ctx->lock);
      free(ctx);
      return fcl_fail(NULL, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "out of host memory");
    }
  }
  ctx->verbose = options ? options->verbose : 0;
  ctx->binary_cache = !(options && options->no_binary_cache);
  ctx->cache_max_bytes = options && options->cache_max_bytes ? options->cache_max_bytes : FLASHCL_CACHE_MAX_BYTES_DEFAULT;
  const char *bo = options ? options->build_options : NULL;
  char *cache = fcl_cache_dir_resolve(options ? options->cache_dir : NULL);
  ctx->cache_dir = cache;
  if ((bo && *bo && !(ctx->build_options = fcl_strdup(bo))))
    return fcl_create_failed(ctx, fcl_fail(ctx, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "out of host memory"));
  *out = ctx;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_context_create(const flashcl_context_options *options, flashcl_context **out) {
  fcl_clear_error(NULL);
  if (!out) return fcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "out is NULL");
  *out = NULL;
  flashcl_context_options options_full;
  flashcl_status imp = fcl_options_import(&options, &options_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  flashcl_context *ctx = NULL;
  flashcl_status st = fcl_alloc_context(options, &ctx);
  if (st != FLASHCL_SUCCESS) return st;
  const char *spec = options && options->device ? options->device : getenv("FLASHCL_DEVICE");
  st = fcl_pick_device(ctx, spec, &ctx->platform, &ctx->device);
  if (st != FLASHCL_SUCCESS) return fcl_create_failed(ctx, st); /* fcl_fail printed it (verbose) */
  cl_int err;
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)ctx->platform, 0};
  ctx->context = clCreateContext(props, 1, &ctx->device, NULL, NULL, &err);
  if (err == CL_SUCCESS) {
    cl_command_queue_properties qp = options && options->profiling ? CL_QUEUE_PROFILING_ENABLE : 0;
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    /* clCreateCommandQueue is the 1.2 entry point; NVIDIA's driver still exports it. */
    ctx->queue = clCreateCommandQueue(ctx->context, ctx->device, qp, &err);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
  }
  if (err != CL_SUCCESS) return fcl_create_failed(ctx, fcl_cl_fail(ctx, err, "creating the OpenCL context/queue"));
  st = fcl_query_info(ctx);
  if (st != FLASHCL_SUCCESS) return fcl_create_failed(ctx, st);
  fcl_apply_device_tuning(ctx, options);
  fcl_log(ctx, "device: %s / %s (local memory %zu bytes)", ctx->info.platform_name, ctx->info.device_name,
          ctx->info.local_mem_size);
  *out = ctx;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_context_create_from_cl(cl_context context, cl_device_id device, cl_command_queue queue,
                                              const flashcl_context_options *options, flashcl_context **out) {
  fcl_clear_error(NULL);
  if (!out) return fcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "out is NULL");
  *out = NULL;
  if (!context || !device || !queue)
    return fcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "context, device and queue must be non-NULL");
  flashcl_context_options options_full;
  flashcl_status imp = fcl_options_import(&options, &options_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  cl_context qctx = NULL;
  cl_device_id qdev = NULL;
  if (clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL) != CL_SUCCESS ||
      clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL) != CL_SUCCESS || qctx != context ||
      qdev != device)
    return fcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "queue does not belong to context and device");
  flashcl_context *ctx = NULL;
  flashcl_status st = fcl_alloc_context(options, &ctx);
  if (st != FLASHCL_SUCCESS) return st;
  clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof ctx->platform, &ctx->platform, NULL);
  clRetainContext(context);
  clRetainCommandQueue(queue);
  clRetainDevice(device); /* released on destroy; a no-op for root devices */
  ctx->context = context;
  ctx->device = device;
  ctx->queue = queue;
  st = fcl_query_info(ctx);
  if (st != FLASHCL_SUCCESS) return fcl_create_failed(ctx, st);
  fcl_apply_device_tuning(ctx, options);
  *out = ctx;
  return FLASHCL_SUCCESS;
}

void flashcl_context_destroy(flashcl_context *ctx) {
  if (!ctx) return;
  fcl_release_programs(ctx);
  if (ctx->decode_scratch.last) clReleaseEvent(ctx->decode_scratch.last);
  if (ctx->decode_scratch.mem) clReleaseMemObject(ctx->decode_scratch.mem);
  if (ctx->decode_scratch.counters) clReleaseMemObject(ctx->decode_scratch.counters);
  if (ctx->side_queue) clReleaseCommandQueue(ctx->side_queue);
  if (ctx->queue) clReleaseCommandQueue(ctx->queue);
  if (ctx->context) clReleaseContext(ctx->context);
  if (ctx->device) clReleaseDevice(ctx->device); /* a no-op for root devices */
  free(ctx->kernel_dir);
  free(ctx->cache_dir);
  free(ctx->build_options);
  fcl_tuning_free(ctx);
  fcl_mutex_destroy(&ctx->lock);
  free(ctx);
}

cl_command_queue fcl_side_queue(flashcl_context *ctx) {
  if (ctx->side_queue_state == 0) {
    ctx->side_queue_state = -1;
    /* The same properties as the caller's queue, so that profiling and
     * out-of-order behaviour do not change with the queue a kernel lands on. */
    cl_command_queue_properties qp = 0;
    cl_int err = clGetCommandQueueInfo(ctx->queue, CL_QUEUE_PROPERTIES, sizeof qp, &qp, NULL);
    if (err == CL_SUCCESS) ctx->side_queue = clCreateCommandQueue(ctx->context, ctx->device, qp, &err);
    if (err == CL_SUCCESS && ctx->side_queue) {
      ctx->side_queue_state = 1;
    } else {
      ctx->side_queue = NULL;
      fcl_log(ctx, "no second command queue (%s): independent kernels run one after the other",
              fcl_cl_error_name(err));
    }
  }
  return ctx->side_queue;
}

cl_context flashcl_context_cl_context(const flashcl_context *ctx) { return ctx ? ctx->context : NULL; }
cl_device_id flashcl_context_cl_device(const flashcl_context *ctx) { return ctx ? ctx->device : NULL; }
cl_command_queue flashcl_context_cl_queue(const flashcl_context *ctx) { return ctx ? ctx->queue : NULL; }

flashcl_status flashcl_context_device_info(const flashcl_context *ctx, flashcl_device_info *info) {
  if (!ctx || !info) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_enter(ctx);
  *info = ctx->info;
  return fcl_leave(ctx, FLASHCL_SUCCESS);
}

flashcl_status flashcl_context_stats_get(const flashcl_context *ctx, flashcl_context_stats *stats) {
  if (!ctx || !stats) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_enter(ctx);
  *stats = ctx->stats;
  return fcl_leave(ctx, FLASHCL_SUCCESS);
}

static flashcl_status fcl_context_local_memory_locked(flashcl_context *ctx, size_t *bytes) {
  fcl_clear_error(ctx);
  if (!bytes) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  *bytes = fcl_local_budget(ctx);
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_context_local_memory(flashcl_context *ctx, size_t *bytes) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_context_local_memory_locked(ctx, bytes));
}
