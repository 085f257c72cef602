/*
 * flashcl-info: library version, OpenCL platforms/devices, the default device,
 * and the tile plan flashcl would use on the chosen device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "common.h"

#define MAX_PLATFORMS 16
#define MAX_DEVICES 64

static void usage(FILE *f) {
  fprintf(f,
          "usage: flashcl-info [--device SPEC] [--check] [--verbose]\n"
          "\n"
          "Lists every OpenCL platform/device, marks the one flashcl picks by default,\n"
          "and prints device details, the block plan (Br, Bc, threads, local bytes)\n"
          "for head dims 32..256 and each dtype on the chosen device, what AUTO runs for\n"
          "the forward, backward and decode at d = 64 and 128 (tuning family, kernel, tiles\n"
          "and where the configuration came from), the tuning sources loaded or skipped,\n"
          "and the program cache.\n"
          "\n"
          "  --device SPEC  \"<platform>:<device>\" indices or a name substring\n"
          "                 (default: $FLASHCL_DEVICE, else first GPU, else first device)\n"
          "  --check        only check that an OpenCL device exists and flashcl can open it;\n"
          "                 exit status 0 if so, 2 if not\n"
          "  --verbose      create the context with verbose diagnostics\n");
}

/* What AUTO runs for a few representative problems (flashcl_attention_config
 * and flashcl_decode_config on small aligned views): the tuning family, the
 * kernel, the tiles, and where the configuration came from. */
static void print_config_row(const char *what, int st, flashcl_context *ctx, const flashcl_config *c) {
  char set[512] = "";
  if (st) {
    printf("  %-22s %s: %s\n", what, flashcl_status_string(st), flashcl_context_last_error(ctx));
    return;
  }
  if (c->set.count && flashcl_tuning_format(&c->set, set, sizeof set)) snprintf(set, sizeof set, "(long)");
  printf("  %-22s %-9s %-18s %4dx%-4d %4d  %s%s%s\n", what, flashcl_tuning_family_name(c->family), c->kernel,
         c->block_r, c->block_c, c->threads, c->origin, *set ? ": " : "", *set ? strchr(set, ' ') ? strchr(set, ' ') + 1 : "" : "");
}

static void print_configs(flashcl_context *ctx) {
  static const flashcl_dtype dts[3] = {FLASHCL_F32, FLASHCL_F16, FLASHCL_BF16};
  static const int ds[2] = {64, 128};
  cl_mem buf[4] = {NULL, NULL, NULL, NULL};
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < 4 && err == CL_SUCCESS; ++i)
    buf[i] = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE, 4096 * 128 * 4, NULL, &err);
  printf("\nWhat AUTO runs (flashcl_attention_config / flashcl_decode_config; N = 4096, one head)\n");
  printf("  %-22s %-9s %-18s %9s %4s  %s\n", "problem", "family", "kernel", "Br x Bc", "wi", "tuning source: set");
  for (int i = 0; i < 3 && err == CL_SUCCESS; ++i)
    for (int j = 0; j < 2; ++j)
      for (int pass = 0; pass < 3; ++pass) {
        flashcl_tensor t[4];
        flashcl_config cfg;
        char what[64];
        int st;
        for (int b = 0; b < 4; ++b)
          flashcl_tensor_init_bnhd(&t[b], buf[b], 0, dts[i], 1, pass == 2 && (b == 0 || b == 3) ? 1 : 4096, 1, ds[j]);
        if (pass < 2) {
          flashcl_attention_desc desc;
          flashcl_attention_desc_init(&desc);
          st = flashcl_attention_config(ctx, &desc, &t[0], &t[1], &t[2], &t[3],
                                        pass ? FLASHCL_PASS_BACKWARD : FLASHCL_PASS_FORWARD, &cfg);
        } else {
          flashcl_decode_desc desc;
          flashcl_decode_desc_init(&desc);
          st = flashcl_decode_config(ctx, &desc, &t[0], &t[1], &t[2], &cfg);
        }
        snprintf(what, sizeof what, "%s d=%d %s", pass == 0 ? "forward" : pass == 1 ? "backward" : "decode", ds[j],
                 flashcl_dtype_name(dts[i]));
        print_config_row(what, st, ctx, &cfg);
      }
  if (err != CL_SUCCESS) printf("  (no buffers: %s, %d)\n", flashcl_status_string(err), (int)err);
  for (int i = 0; i < 4; ++i)
    if (buf[i]) clReleaseMemObject(buf[i]);
}

static void print_tuning_and_cache(flashcl_context *ctx) {
  flashcl_context_stats stats;
  printf("\nTuning sources (flashcl_context_tuning_log)\n");
  const char *log = flashcl_context_tuning_log(ctx);
  for (const char *l = log; *l;) {
    const size_t len = strcspn(l, "\n");
    printf("  %.*s\n", (int)len, l);
    l += len + (l[len] == '\n');
  }
  const char *dir = flashcl_context_cache_dir(ctx);
  printf("\nCache directory      %s\n", *dir ? dir : "(none: set FLASHCL_CACHE_DIR)");
  if (flashcl_context_stats_get(ctx, &stats) == FLASHCL_SUCCESS)
    printf("Programs this run    %u built from source, %u loaded from the cache (%u cache entries rejected, %u "
           "written)\n", stats.programs_built, stats.programs_from_cache, stats.cache_rejected, stats.cache_written);
}

typedef struct info_opts {
  const char *device;
  int check, verbose;
} info_opts;

static args_status parse_args(int argc, char **argv, info_opts *o) {
  const args_opt table[] = {
      {.name = "--device", .kind = ARG_STRING, .dest = &o->device},
      {.name = "--check", .kind = ARG_FLAG, .dest = &o->check},
      {.name = "--verbose", .alias = "-v", .kind = ARG_FLAG, .dest = &o->verbose},
      {.name = "--help", .alias = "-h", .kind = ARG_HELP},
  };
  memset(o, 0, sizeof *o);
  return args_parse(argc, argv, "flashcl-info", table, ARGS_COUNT(table));
}

/* One line per OpenCL device ('*' on the one flashcl chose), or with --check
 * only the chosen one's; returns how many devices there are. */
static cl_uint list_devices(const cl_platform_id *platforms, cl_uint nplat, cl_device_id chosen, int check) {
  cl_uint total_devices = 0;
  for (cl_uint p = 0; p < nplat; ++p) {
    char pname[256] = "", dname[256] = "", dver[128] = "";
    cl_device_id devices[MAX_DEVICES];
    cl_uint ndev = 0;
    clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof pname, pname, NULL);
    if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, MAX_DEVICES, devices, &ndev) != CL_SUCCESS) ndev = 0;
    if (!check && ndev == 0) printf("      %u:-  (%s: no devices)\n", (unsigned)p, pname);
    for (cl_uint d = 0; d < ndev; ++d) {
      cl_device_type type = 0;
      clGetDeviceInfo(devices[d], CL_DEVICE_NAME, sizeof dname, dname, NULL);
      clGetDeviceInfo(devices[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
      clGetDeviceInfo(devices[d], CL_DEVICE_VERSION, sizeof dver, dver, NULL);
      ++total_devices;
      if (!check)
        printf("  %c %u:%u  %-4s %s  [%s]  (%s)\n", devices[d] == chosen ? '*' : ' ', (unsigned)p,
               (unsigned)d, tools_device_type_string(type), dname, pname, dver);
      else if (devices[d] == chosen)
        printf("flashcl %s: OpenCL device %u:%u %s (%s, %s)\n", FLASHCL_VERSION_STRING, (unsigned)p,
               (unsigned)d, dname, pname, tools_device_type_string(type));
    }
  }
  return total_devices;
}

/* 0, or the exit status when the device info cannot be read. */
static int print_chosen_device(flashcl_context *ctx) {
  flashcl_device_info info;
  size_t usable = 0;
  int status = flashcl_context_device_info(ctx, &info);
  if (status != FLASHCL_SUCCESS) {
    tools_print_error(stderr, ctx, "flashcl_context_device_info", status);
    return 1;
  }
  printf("\nChosen device\n");
  printf("  platform            %s\n", info.platform_name);
  printf("  device              %s\n", info.device_name);
  printf("  version             %s\n", info.device_version);
  printf("  type                %s\n", info.is_gpu ? "GPU" : "not a GPU");
  printf("  compute units       %u\n", (unsigned)info.compute_units);
  printf("  local memory (M)    %zu bytes (%.1f KiB)\n", info.local_mem_size, info.local_mem_size / 1024.0);
  status = flashcl_context_local_memory(ctx, &usable);
  if (status == FLASHCL_SUCCESS)
    printf("  local memory usable %zu bytes (%.1f KiB)%s\n", usable, usable / 1024.0,
           usable > info.local_mem_size ? ", above M: tiles are planned against it" : "");
  else
    printf("  local memory usable %s (%d)\n", flashcl_status_string(status), status);
  printf("  max work-group size %zu\n", info.max_work_group_size);
  printf("  global memory       %.1f MiB\n", (double)info.global_mem_size / (1024.0 * 1024.0));
  printf("  max allocation      %.1f MiB\n", (double)info.max_mem_alloc_size / (1024.0 * 1024.0));
  printf("  cl_khr_fp16         %s\n", info.has_fp16 ? "yes" : "no");
  return 0;
}

static void print_environment(void) {
  const char *env;
  printf("\nEnvironment\n");
  env = getenv("FLASHCL_DEVICE");
  printf("  FLASHCL_DEVICE      %s\n", env && *env ? env : "(unset)");
  env = getenv("FLASHCL_KERNEL_DIR");
  printf("  FLASHCL_KERNEL_DIR  %s\n", env && *env ? env : "(unset: embedded kernels)");
  env = getenv("FLASHCL_KERNEL");
  printf("  FLASHCL_KERNEL      %s\n", env && *env ? env : "(unset: auto)");
  env = getenv("FLASHCL_TUNING");
  printf("  FLASHCL_TUNING      %s\n", env && *env ? env : "(unset)");
  env = getenv("FLASHCL_CACHE_DIR");
  printf("  FLASHCL_CACHE_DIR   %s\n", env && *env ? env : "(unset: $XDG_CACHE_HOME/flashcl, else ~/.cache/flashcl)");
}

static void print_block_plans(flashcl_context *ctx) {
  static const int head_dims[] = {32, 64, 80, 96, 128, 256};
  static const flashcl_dtype dtypes[] = {FLASHCL_F32, FLASHCL_F16, FLASHCL_BF16};
  printf("\nDefault block plan (flashcl_attention_block_plan with block_r = block_c = 0)\n");
  printf("  %-5s %4s %5s %5s %8s %12s\n", "dtype", "d", "Br", "Bc", "threads", "local bytes");
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; ++i) {
    for (size_t j = 0; j < sizeof head_dims / sizeof head_dims[0]; ++j) {
      flashcl_block_plan plan;
      memset(&plan, 0, sizeof plan);
      const int status = flashcl_attention_block_plan(ctx, head_dims[j], dtypes[i], 0, 0, &plan);
      if (status == FLASHCL_SUCCESS)
        printf("  %-5s %4d %5d %5d %8d %12zu\n", flashcl_dtype_name(dtypes[i]), head_dims[j], plan.block_r,
               plan.block_c, plan.threads, plan.local_bytes);
      else
        printf("  %-5s %4d  %s (%d)\n", flashcl_dtype_name(dtypes[i]), head_dims[j],
               flashcl_status_string(status), status);
    }
  }
}

int main(int argc, char **argv) {
  info_opts o;
  cl_platform_id platforms[MAX_PLATFORMS];
  cl_uint nplat = 0;
  flashcl_context_options options;
  flashcl_context *ctx = NULL;
  cl_device_id chosen = NULL;
  const char *env;

  const args_status parsed = parse_args(argc, argv, &o);
  if (parsed == ARGS_HELP) usage(stdout);
  if (parsed == ARGS_UNKNOWN) usage(stderr);
  if (parsed != ARGS_OK) return parsed == ARGS_HELP ? 0 : 1;

  const cl_int err = clGetPlatformIDs(MAX_PLATFORMS, platforms, &nplat);
  if (err != CL_SUCCESS || nplat == 0) {
    fprintf(stderr,
            "flashcl-info: no OpenCL platform found (%s, %d).\n"
            "Install an OpenCL driver (ICD), e.g. pocl-opencl-icd for CPUs; see /etc/OpenCL/vendors/.\n",
            flashcl_status_string(err), (int)err);
    return 2;
  }

  flashcl_context_options_init(&options);
  options.device = o.device;
  options.verbose = o.verbose;
  const int status = flashcl_context_create(&options, &ctx);
  if (status == FLASHCL_SUCCESS) chosen = flashcl_context_cl_device(ctx);

  if (!o.check) {
    printf("flashcl %s\n\n", FLASHCL_VERSION_STRING);
    printf("OpenCL devices (* = %s):\n",
           o.device ? "selected by --device"
                    : ((env = getenv("FLASHCL_DEVICE")) && *env ? "selected by $FLASHCL_DEVICE" : "default"));
  }
  if (list_devices(platforms, nplat, chosen, o.check) == 0) {
    fprintf(stderr, "flashcl-info: OpenCL platforms exist but none has a device.\n");
    flashcl_context_destroy(ctx);
    return 2;
  }
  if (status != FLASHCL_SUCCESS) {
    fprintf(stderr, "flashcl-info: flashcl_context_create(%s) failed: %s (%d)\n", o.device ? o.device : "default",
            flashcl_status_string(status), status);
    return 2;
  }
  if (!o.check && print_chosen_device(ctx)) {
    flashcl_context_destroy(ctx);
    return 1;
  }
  if (!o.check) {
    print_environment();
    print_block_plans(ctx);
    print_configs(ctx);
    print_tuning_and_cache(ctx);
  }
  flashcl_context_destroy(ctx);
  return 0;
}
