/* Kernel sources and the per-context program cache.
 *
 * Programs are built on first use and cached by (file, build options); the
 * context is bound to one device, so the key needs no device. Programs built for
 * retargeted (fcl_get_kernel_retargeted, the sm_90a route) are cached under their own keys. Kernel objects are
 * cached with their program because clCreateKernel is not free on every driver.
 * Below this per-context cache sits the on-disk one (src/core/binary_cache.c), which
 * outlives the context and the process. */
#include "core/internal.h"
#include "core/embedded.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const struct fcl_embedded *fcl_embedded_find(const char *file) {
  for (const struct fcl_embedded *s = flashcl_embedded_sources; s->name; s++)
    if (strcmp(s->name, file) == 0) return s;
  return NULL;
}

/* Reads kernel_dir's copy of file: at its path under cl/ when this build
 * embeds it (cl/<folder>/<file>), else directly under kernel_dir. */
static flashcl_status fcl_kernel_file(flashcl_context *ctx, const char *file, const char **text, size_t *size,
                                      char **owned) {
  const struct fcl_embedded *e = fcl_embedded_find(file);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", ctx->kernel_dir, e ? e->path : file);
  FILE *f = fopen(path, "rb");
  if (!f) return fcl_fail(ctx, FLASHCL_ERROR_KERNEL_SOURCE, "cannot open kernel source %s (FLASHCL_KERNEL_DIR)", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    fclose(f);
    return fcl_fail(ctx, FLASHCL_ERROR_KERNEL_SOURCE, "cannot read kernel source %s", path);
  }
  fclose(f);
  buf[n] = '\0';
  *owned = buf;
  *text = buf;
  *size = (size_t)n;
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_kernel_source(flashcl_context *ctx, const char *file, const char **text, size_t *size,
                                 char **owned) {
  *owned = NULL;
  if (ctx->kernel_dir) return fcl_kernel_file(ctx, file, text, size, owned);
  const struct fcl_embedded *e = fcl_embedded_find(file);
  if (!e) return fcl_fail(ctx, FLASHCL_ERROR_KERNEL_SOURCE, "kernel source %s is not embedded in this build", file);
  *text = e->text;
  *size = e->size;
  return FLASHCL_SUCCESS;
}

/* The program's build log for the context's device (malloc'ed), or NULL. */
static char *fcl_build_log(flashcl_context *ctx, cl_program prog) {
  size_t log_size = 0;
  clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &log_size);
  char *log = malloc(log_size + 1);
  if (log) {
    log[0] = '\0';
    clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, log_size, log, NULL);
    log[log_size] = '\0';
  }
  return log;
}

/* Prints a kernel's build log and resource figures to stderr: the
 * FLASHCL_*_BUILD_LOG tuning aids, never on by default. */
void fcl_print_build_log(flashcl_context *ctx, cl_kernel kern, const char *name, const char *opts) {
  cl_program prog;
  if (clGetKernelInfo(kern, CL_KERNEL_PROGRAM, sizeof prog, &prog, NULL) != CL_SUCCESS) return;
  char *log = fcl_build_log(ctx, prog);
  cl_ulong lmem = 0, pmem = 0;
  size_t wg = 0;
  clGetKernelWorkGroupInfo(kern, ctx->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL);
  clGetKernelWorkGroupInfo(kern, ctx->device, CL_KERNEL_PRIVATE_MEM_SIZE, sizeof pmem, &pmem, NULL);
  clGetKernelWorkGroupInfo(kern, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
  fprintf(stderr, "%s [%s]: local %llu B, private %llu B, max wg %zu\n%s\n", name, opts, (unsigned long long)lmem,
          (unsigned long long)pmem, wg, log ? log : "");
  free(log);
}

/* The text of every source part of a program. `files` names one source, or
 * several joined by '+' that are compiled as one program in that order (e.g.
 * "philox.cl+flash_bwd.cl"). */
enum { FCL_MAX_PARTS = 8 };
typedef struct fcl_sources {
  cl_uint parts;
  const char *text[FCL_MAX_PARTS];
  size_t size[FCL_MAX_PARTS];
  char *owned[FCL_MAX_PARTS];
} fcl_sources;

static void fcl_sources_free(fcl_sources *src) {
  for (cl_uint i = 0; i < FCL_MAX_PARTS; i++) free(src->owned[i]);
}

static flashcl_status fcl_sources_load(flashcl_context *ctx, const char *files, fcl_sources *src) {
  memset(src, 0, sizeof *src);
  flashcl_status st = FLASHCL_SUCCESS;
  for (const char *f = files; *f && st == FLASHCL_SUCCESS;) {
    const char *plus = strchr(f, '+');
    size_t len = plus ? (size_t)(plus - f) : strlen(f);
    char name[256];
    if (src->parts == FCL_MAX_PARTS || len == 0 || len >= sizeof name) {
      st = fcl_fail(ctx, FLASHCL_ERROR_INTERNAL, "bad kernel source list \"%s\"", files);
      break;
    }
    memcpy(name, f, len);
    name[len] = '\0';
    const cl_uint i = src->parts;
    st = fcl_kernel_source(ctx, name, &src->text[i], &src->size[i], &src->owned[i]);
    if (st == FLASHCL_SUCCESS) src->parts++;
    f += len + (plus ? 1 : 0);
  }
  if (st != FLASHCL_SUCCESS) fcl_sources_free(src);
  return st;
}

static flashcl_status fcl_build(flashcl_context *ctx, const char *files, const fcl_sources *src, const char *options,
                                cl_program *out) {
  cl_int err = CL_SUCCESS;
  cl_program prog = clCreateProgramWithSource(ctx->context, src->parts, (const char **)src->text, src->size, &err);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clCreateProgramWithSource");
  fcl_log(ctx, "building %s with \"%s\"", files, options);
  err = clBuildProgram(prog, 1, &ctx->device, options, NULL, NULL);
  if (err != CL_SUCCESS && fcl_cl_is_shortage(err)) {
    /* Out of memory is not a fault of the source: callers that fall back on a
     * build failure (or turn a kernel family off) must not do it for this. */
    clReleaseProgram(prog);
    return fcl_cl_fail(ctx, err, "clBuildProgram");
  }
  if (err != CL_SUCCESS) {
    char *log = fcl_build_log(ctx, prog);
    fcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "building %s with options \"%s\" failed (%s):\n%s", files, options,
             fcl_cl_error_name(err), log ? log : "(no log)");
    free(log);
    clReleaseProgram(prog);
    return FLASHCL_ERROR_BUILD_FAILED;
  }
  ctx->stats.programs_built++;
  *out = prog;
  return FLASHCL_SUCCESS;
}

/* The PTX text of a built program (NVIDIA's "binary"), NUL-terminated; NULL if
 * the program has no single textual binary. */
static char *fcl_program_ptx(cl_program prog) {
  size_t size = 0;
  if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS || size == 0) return NULL;
  unsigned char *bin = malloc(size + 1);
  if (!bin) return NULL;
  if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) != CL_SUCCESS) {
    free(bin);
    return NULL;
  }
  bin[size] = '\0';
  return (char *)bin;
}

/* The options of a retargeted program's second build, where the driver
 * assembles the rewritten binary: options.build_options (e.g. -cl-nv-verbose)
 * reach this step too. */
static const char *fcl_binary_options(const flashcl_context *ctx) {
  return ctx->build_options ? ctx->build_options : "";
}

/* fcl_build, then the source program's binary (PTX on NVIDIA) rewritten by
 * rt and built again as a binary. */
static flashcl_status fcl_build_retargeted(flashcl_context *ctx, const char *files, const fcl_sources *src,
                                           const char *options, const fcl_retarget *rt, cl_program *out) {
  cl_program src_prog = NULL;
  flashcl_status st = fcl_build(ctx, files, src, options, &src_prog);
  if (st != FLASHCL_SUCCESS) return st;
  char *ptx = fcl_program_ptx(src_prog);
  clReleaseProgram(src_prog);
  if (!ptx) return fcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "building %s for %s: no binary to retarget", files, rt->name);
  const char *why = NULL;
  char *out_bin = rt->rewrite(ptx, &why);
  free(ptx);
  if (!out_bin) return fcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "building %s for %s: %s", files, rt->name, why);
  size_t len = strlen(out_bin) + 1;
  cl_int err = CL_SUCCESS, bin_status = CL_SUCCESS;
  cl_program prog = clCreateProgramWithBinary(ctx->context, 1, &ctx->device, &len,
                                              (const unsigned char **)&out_bin, &bin_status, &err);
  free(out_bin);
  /* Every other failure here is a build failure: the caller falls back on it. */
  if (err != CL_SUCCESS && fcl_cl_is_shortage(err))
    return fcl_cl_fail(ctx, err, "clCreateProgramWithBinary");
  if (err != CL_SUCCESS)
    return fcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "building %s for %s: clCreateProgramWithBinary failed (%s)",
                    files, rt->name, fcl_cl_error_name(err));
  fcl_log(ctx, "building %s for %s", files, rt->name);
  /* The driver assembles the rewritten binary (PTX on NVIDIA) here. */
  err = clBuildProgram(prog, 1, &ctx->device, fcl_binary_options(ctx), NULL, NULL);
  if (err != CL_SUCCESS && fcl_cl_is_shortage(err)) {
    clReleaseProgram(prog);
    return fcl_cl_fail(ctx, err, "clBuildProgram (retargeted)");
  }
  if (err != CL_SUCCESS) {
    char *log = fcl_build_log(ctx, prog);
    fcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "assembling %s for %s failed (%s):\n%s", files,
             rt->name, fcl_cl_error_name(err), log ? log : "(no log)");
    free(log);
    clReleaseProgram(prog);
    return FLASHCL_ERROR_BUILD_FAILED;
  }
  *out = prog;
  return FLASHCL_SUCCESS;
}

/* A program for (files, options): loaded from the disk cache when it holds a
 * valid entry, else built from source and written there. The sources are read
 * first even on a hit, because the cache key hashes their text. */
static flashcl_status fcl_program_obtain(flashcl_context *ctx, const char *files, const char *options,
                                         const fcl_retarget *rt, cl_program *out) {
  fcl_sources src;
  flashcl_status st = fcl_sources_load(ctx, files, &src);
  if (st != FLASHCL_SUCCESS) return st;
  const int cached = fcl_cache_enabled(ctx);
  fcl_cache_key key;
  if (cached) {
    /* A retargeted binary also depends on the rewrite and on the options of
     * its second build. */
    char route[4096] = "";
    if (rt)
      snprintf(route, sizeof route, "%s rewrite %d binary options %s", rt->name, rt->revision,
               fcl_binary_options(ctx));
    fcl_cache_key_make(ctx, src.text, src.size, src.parts, options, route, &key);
    *out = fcl_cache_load(ctx, &key, files, rt ? fcl_binary_options(ctx) : options);
    if (*out) {
      fcl_sources_free(&src);
      return FLASHCL_SUCCESS;
    }
  }
  st = rt ? fcl_build_retargeted(ctx, files, &src, options, rt, out) : fcl_build(ctx, files, &src, options, out);
  fcl_sources_free(&src);
  if (st == FLASHCL_SUCCESS && cached) fcl_cache_store(ctx, &key, *out, files);
  return st;
}

static flashcl_status fcl_get_kernel_impl(flashcl_context *ctx, const char *file, const char *options,
                                          const char *kernel_name, const fcl_retarget *rt, cl_kernel *out) {
  const char *route = rt ? rt->name : "";
  size_t keylen = strlen(route) + strlen(file) + strlen(options) + 8;
  char *key = malloc(keylen);
  if (!key) return fcl_fail(ctx, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "out of host memory");
  snprintf(key, keylen, "%s%s%s|%s", route, rt ? ":" : "", file, options);
  flashcl_program_entry *pe = ctx->programs;
  while (pe && strcmp(pe->key, key) != 0) pe = pe->next;
  if (!pe) {
    cl_program prog = NULL;
    flashcl_status st = fcl_program_obtain(ctx, file, options, rt, &prog);
    if (st != FLASHCL_SUCCESS) {
      free(key);
      return st;
    }
    pe = calloc(1, sizeof *pe);
    if (!pe) {
      clReleaseProgram(prog);
      free(key);
      return fcl_fail(ctx, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "out of host memory");
    }
    pe->key = key;
    pe->program = prog;
    pe->next = ctx->programs;
    ctx->programs = pe;
  } else {
    free(key);
  }
  flashcl_kernel_entry *ke = pe->kernels;
  while (ke && strcmp(ke->name, kernel_name) != 0) ke = ke->next;
  if (!ke) {
    cl_int err;
    cl_kernel k = clCreateKernel(pe->program, kernel_name, &err);
    if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clCreateKernel");
    ke = calloc(1, sizeof *ke);
    char *name = malloc(strlen(kernel_name) + 1);
    if (!ke || !name) {
      free(ke);
      free(name);
      clReleaseKernel(k);
      return fcl_fail(ctx, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "out of host memory");
    }
    strcpy(name, kernel_name);
    ke->name = name;
    ke->kernel = k;
    ke->next = pe->kernels;
    pe->kernels = ke;
  }
  *out = ke->kernel;
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_get_kernel(flashcl_context *ctx, const char *file, const char *options, const char *kernel_name,
                              cl_kernel *out) {
  return fcl_get_kernel_impl(ctx, file, options, kernel_name, NULL, out);
}

flashcl_status fcl_get_kernel_retargeted(flashcl_context *ctx, const char *file, const char *options,
                                         const char *kernel_name, const fcl_retarget *rt, cl_kernel *out) {
  return fcl_get_kernel_impl(ctx, file, options, kernel_name, rt, out);
}

void fcl_release_programs(flashcl_context *ctx) {
  flashcl_program_entry *pe = ctx->programs;
  while (pe) {
    flashcl_kernel_entry *ke = pe->kernels;
    while (ke) {
      flashcl_kernel_entry *kn = ke->next;
      clReleaseKernel(ke->kernel);
      free(ke->name);
      free(ke);
      ke = kn;
    }
    flashcl_program_entry *pn = pe->next;
    clReleaseProgram(pe->program);
    free(pe->key);
    free(pe);
    pe = pn;
  }
  ctx->programs = NULL;
}
