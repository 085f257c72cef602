/* Helpers shared by the flashcl command-line tools (public API + OpenCL only). */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200112L
#endif
#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(_WIN32)
#include <windows.h>
#endif

/* ------------------------------------------------------------ command line */

static int ieq(const char *a, const char *b) {
  for (; *a && *b; ++a, ++b)
    if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
  return *a == *b;
}

int tools_parse_long(const char *s, long *out) {
  char *end = NULL;
  long v;
  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || end == s) return -1;
  if (*end == 'k' || *end == 'K') {
    v *= 1024;
    ++end;
  } else if (*end == 'm' || *end == 'M') {
    v *= 1024L * 1024L;
    ++end;
  }
  if (*end != '\0') return -1;
  *out = v;
  return 0;
}

/* Splits s on commas and calls parse on each item. */
static int parse_list(const char *s, tools_list *out, int (*parse)(const char *, long *)) {
  char item[64];
  out->count = 0;
  while (*s) {
    size_t n = strcspn(s, ",");
    if (n == 0 || n >= sizeof item || out->count >= TOOLS_MAX_LIST) return -1;
    memcpy(item, s, n);
    item[n] = '\0';
    if (parse(item, &out->v[out->count]) != 0) return -1;
    out->count++;
    s += n;
    if (*s == ',') ++s;
  }
  return out->count > 0 ? 0 : -1;
}

static int parse_positive(const char *s, long *v) { return tools_parse_long(s, v) == 0 && *v > 0 ? 0 : -1; }

int tools_parse_int_list(const char *s, tools_list *out) { return parse_list(s, out, parse_positive); }

static int parse_dtype(const char *s, long *v) {
  if (ieq(s, "f32") || ieq(s, "fp32") || ieq(s, "float") || ieq(s, "float32")) *v = FLASHCL_F32;
  else if (ieq(s, "f16") || ieq(s, "fp16") || ieq(s, "half") || ieq(s, "float16")) *v = FLASHCL_F16;
  else if (ieq(s, "bf16") || ieq(s, "bfloat16")) *v = FLASHCL_BF16;
  else return -1;
  return 0;
}

int tools_parse_dtype_list(const char *s, tools_list *out) { return parse_list(s, out, parse_dtype); }

static int parse_causal(const char *s, long *v) {
  if (strcmp(s, "0") == 0 || ieq(s, "no") || ieq(s, "off")) *v = 0;
  else if (strcmp(s, "1") == 0 || ieq(s, "yes") || ieq(s, "on")) *v = 1;
  else return -1;
  return 0;
}

int tools_parse_causal_list(const char *s, tools_list *out) {
  if (ieq(s, "both") || ieq(s, "all")) {
    out->count = 2;
    out->v[0] = 0;
    out->v[1] = 1;
    return 0;
  }
  return parse_list(s, out, parse_causal);
}

static int parse_algo(const char *s, long *v) {
  if (ieq(s, "flash")) *v = FLASHCL_ALGO_FLASH;
  else if (ieq(s, "naive")) *v = FLASHCL_ALGO_NAIVE;
  else if (ieq(s, "auto")) *v = FLASHCL_ALGO_AUTO;
  else return -1;
  return 0;
}

int tools_parse_algo_list(const char *s, tools_list *out) {
  if (ieq(s, "both") || ieq(s, "all")) {
    out->count = 2;
    out->v[0] = FLASHCL_ALGO_FLASH;
    out->v[1] = FLASHCL_ALGO_NAIVE;
    return 0;
  }
  return parse_list(s, out, parse_algo);
}

int tools_parse_kernel(const char *s, flashcl_kernel_family *out) {
  if (ieq(s, "auto")) *out = FLASHCL_KERNEL_AUTO;
  else if (ieq(s, "portable")) *out = FLASHCL_KERNEL_PORTABLE;
  /* 2 = FLASHCL_KERNEL_NVIDIA_MMA in headers that have it; a library without it
   * rejects the value with FLASHCL_ERROR_INVALID_ARGUMENT. */
  else if (ieq(s, "nvidia_mma") || ieq(s, "mma")) *out = (flashcl_kernel_family)2;
  else return -1;
  return 0;
}

int tools_parse_layout(const char *s, int *bhnd) {
  if (ieq(s, "bnhd")) *bhnd = 0;
  else if (ieq(s, "bhnd")) *bhnd = 1;
  else return -1;
  return 0;
}

const char *tools_algo_name(int algo) {
  switch (algo) {
    case FLASHCL_ALGO_FLASH: return "flash";
    case FLASHCL_ALGO_NAIVE: return "naive";
    case FLASHCL_ALGO_AUTO: return "auto";
    default: return "?";
  }
}

/* ----------------------------------------------------------------- numbers */

uint16_t tools_f32_to_f16(float f) {
  uint32_t x, sign, exp, mant;
  int e;
  memcpy(&x, &f, sizeof x);
  sign = (x >> 16) & 0x8000u;
  exp = (x >> 23) & 0xffu;
  mant = x & 0x7fffffu;
  if (exp == 0xffu) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
  e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* subnormal half (or zero) */
    uint32_t m, h, rem, halfway;
    int shift;
    if (e < -10) return (uint16_t)sign;
    m = mant | 0x800000u;
    shift = 14 - e;
    h = m >> shift;
    rem = m & ((1u << shift) - 1u);
    halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
  }
  {
    uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h; /* may carry into the exponent: fine */
    return (uint16_t)h;
  }
}

float tools_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
  uint32_t mant = (uint32_t)h & 0x3ffu;
  uint32_t x;
  float f;
  if (exp == 0) {
    f = ldexpf((float)mant, -24);
    return sign ? -f : f;
  }
  if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
  else x = sign | ((exp + 112u) << 23) | (mant << 13);
  memcpy(&f, &x, sizeof f);
  return f;
}

uint16_t tools_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float tools_bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void tools_fill_random(void *dst, flashcl_dtype dtype, size_t count, uint64_t seed) {
  uint64_t state = seed * 0x2545f4914f6cdd1dull + 1;
  size_t i;
  for (i = 0; i < count; ++i) {
    float f = (float)(splitmix64(&state) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    switch (dtype) {
      case FLASHCL_F16: ((uint16_t *)dst)[i] = tools_f32_to_f16(f); break;
      case FLASHCL_BF16: ((uint16_t *)dst)[i] = tools_f32_to_bf16(f); break;
      default: ((float *)dst)[i] = f; break;
    }
  }
}

void tools_to_float(const void *src, flashcl_dtype dtype, size_t count, float *dst) {
  size_t i;
  switch (dtype) {
    case FLASHCL_F16:
      for (i = 0; i < count; ++i) dst[i] = tools_f16_to_f32(((const uint16_t *)src)[i]);
      break;
    case FLASHCL_BF16:
      for (i = 0; i < count; ++i) dst[i] = tools_bf16_to_f32(((const uint16_t *)src)[i]);
      break;
    default:
      if ((const void *)dst != src) memmove(dst, src, count * sizeof(float));
      break;
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double tools_median(double *values, int n) {
  if (n <= 0) return NAN;
  qsort(values, (size_t)n, sizeof *values, cmp_double);
  return (n & 1) ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double tools_min(const double *values, int n) {
  double m = INFINITY;
  int i;
  for (i = 0; i < n; ++i)
    if (values[i] < m) m = values[i];
  return m;
}

double tools_rel_l2(const float *a, const float *b, size_t n) {
  double num = 0.0, den = 0.0;
  size_t i;
  for (i = 0; i < n; ++i) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  if (!isfinite(num) || !isfinite(den)) return NAN;
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return sqrt(num / den);
}

double tools_now_ms(void) {
#if defined(_WIN32)
  LARGE_INTEGER f, c;
  QueryPerformanceFrequency(&f);
  QueryPerformanceCounter(&c);
  return 1e3 * (double)c.QuadPart / (double)f.QuadPart;
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
#endif
}

/* ------------------------------------------------------------------ OpenCL */

const char *tools_device_type_string(cl_device_type type) {
  if (type & CL_DEVICE_TYPE_GPU) return "GPU";
  if (type & CL_DEVICE_TYPE_CPU) return "CPU";
  if (type & CL_DEVICE_TYPE_ACCELERATOR) return "ACCELERATOR";
#ifdef CL_DEVICE_TYPE_CUSTOM
  if (type & CL_DEVICE_TYPE_CUSTOM) return "CUSTOM";
#endif
  return "OTHER";
}

cl_mem tools_random_buffer(cl_context context, cl_command_queue queue, flashcl_dtype dtype, size_t count,
                           uint64_t seed, void *host_scratch, cl_int *err) {
  size_t bytes = count * flashcl_dtype_size(dtype);
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, NULL, err);
  if (!m || *err != CL_SUCCESS) {
    if (m) clReleaseMemObject(m);
    if (*err == CL_SUCCESS) *err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
    return NULL;
  }
  tools_fill_random(host_scratch, dtype, count, seed);
  *err = clEnqueueWriteBuffer(queue, m, CL_TRUE, 0, bytes, host_scratch, 0, NULL, NULL);
  if (*err != CL_SUCCESS) {
    clReleaseMemObject(m);
    return NULL;
  }
  return m;
}

cl_int tools_read_as_float(cl_command_queue queue, cl_mem buffer, flashcl_dtype dtype, size_t count,
                           void *raw_scratch, float *dst) {
  size_t bytes = count * flashcl_dtype_size(dtype);
  void *raw = dtype == FLASHCL_F32 ? (void *)dst : raw_scratch;
  cl_int err = clEnqueueReadBuffer(queue, buffer, CL_TRUE, 0, bytes, raw, 0, NULL, NULL);
  if (err != CL_SUCCESS) return err;
  tools_to_float(raw, dtype, count, dst);
  return CL_SUCCESS;
}

int tools_is_oom(int status) {
  return status == FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY || status == FLASHCL_ERROR_HOST_OUT_OF_MEMORY ||
         status == CL_MEM_OBJECT_ALLOCATION_FAILURE || status == CL_OUT_OF_HOST_MEMORY ||
         status == CL_INVALID_BUFFER_SIZE;
}

int tools_is_validation_error(int status) {
  return (status <= FLASHCL_ERROR_INVALID_ARGUMENT && status >= FLASHCL_ERROR_UNSUPPORTED) ||
         status == FLASHCL_ERROR_OVERFLOW || status == FLASHCL_ERROR_DEVICE_NOT_FOUND;
}

int tools_timed_forward(flashcl_context *ctx, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                        const flashcl_tensor *k, const flashcl_tensor *v, const flashcl_tensor *o, double *ms,
                        int *used_host_timer) {
  tools_attention_args a;
  memset(&a, 0, sizeof a);
  a.desc = desc;
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  return tools_timed_call(ctx, FLASHCL_PASS_FORWARD, &a, ms, used_host_timer);
}

int tools_timed_call(flashcl_context *ctx, flashcl_pass pass, const tools_attention_args *a, double *ms,
                     int *used_host_timer) {
  cl_command_queue queue = flashcl_context_cl_queue(ctx);
  cl_command_queue_properties props = 0;
  cl_event before = NULL, after = NULL;
  cl_ulong t0 = 0, t1 = 0;
  double h0, h1;
  int status;
  cl_int err;

  clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
  err = clFinish(queue);
  if (err != CL_SUCCESS) return err;
  h0 = tools_now_ms();
  err = clEnqueueMarkerWithWaitList(queue, 0, NULL, &before);
  if (err != CL_SUCCESS) return err;
  if (pass == FLASHCL_PASS_BACKWARD)
    status = flashcl_attention_backward(ctx, a->desc, a->q, a->k, a->v, a->o, a->lse, a->d_o, a->dq, a->dk, a->dv,
                                        0, NULL, NULL);
  else
    status = flashcl_attention_forward(ctx, a->desc, a->q, a->k, a->v, a->o, a->lse, 0, NULL, NULL);
  if (status != FLASHCL_SUCCESS) {
    clFinish(queue);
    clReleaseEvent(before);
    return status;
  }
  err = clEnqueueMarkerWithWaitList(queue, 0, NULL, &after);
  if (err == CL_SUCCESS) err = clWaitForEvents(1, &after);
  h1 = tools_now_ms();
  if (err != CL_SUCCESS) {
    clFinish(queue);
    clReleaseEvent(before);
    if (after) clReleaseEvent(after);
    return err;
  }
  *ms = h1 - h0;
  *used_host_timer = 1;
  if ((props & CL_QUEUE_PROFILING_ENABLE) &&
      clGetEventProfilingInfo(before, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL) == CL_SUCCESS &&
      clGetEventProfilingInfo(after, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL) == CL_SUCCESS && t1 > t0) {
    *ms = (double)(t1 - t0) * 1e-6;
    *used_host_timer = 0;
  }
  clReleaseEvent(before);
  clReleaseEvent(after);
  return FLASHCL_SUCCESS;
}

void tools_print_error(FILE *f, flashcl_context *ctx, const char *what, int status) {
  const char *msg = ctx ? flashcl_context_last_error(ctx) : "";
  fprintf(f, "%s: %s (%d)%s%s\n", what, flashcl_status_string(status), status, msg && *msg ? ": " : "",
          msg ? msg : "");
}

void tools_describe_device(flashcl_context *ctx, char *buf, size_t size) {
  flashcl_device_info info;
  if (flashcl_context_device_info(ctx, &info) != FLASHCL_SUCCESS) {
    snprintf(buf, size, "(device info unavailable)");
    return;
  }
  snprintf(buf, size, "%s (%s), %s, %u CUs, %zu KiB local memory", info.device_name, info.platform_name,
           info.is_gpu ? "GPU" : "non-GPU", (unsigned)info.compute_units, info.local_mem_size / 1024);
}

int tools_timed_decode(flashcl_context *ctx, const flashcl_decode_desc *desc, const flashcl_tensor *q,
                       const flashcl_tensor *kc, const flashcl_tensor *vc, cl_mem lens, const flashcl_tensor *out,
                       const flashcl_tensor *lse, long calls, double *ms, double *host_us, int *used_host_timer) {
  cl_command_queue queue = flashcl_context_cl_queue(ctx);
  cl_event before = NULL, after = NULL;
  cl_ulong t0 = 0, t1 = 0;
  double h0, he;
  int st = FLASHCL_SUCCESS;
  long c;
  cl_int err = clFinish(queue);
  if (err != CL_SUCCESS) return err;
  h0 = tools_now_ms();
  err = clEnqueueMarkerWithWaitList(queue, 0, NULL, &before);
  if (err != CL_SUCCESS) return err;
  he = tools_now_ms();
  for (c = 0; c < calls && st == FLASHCL_SUCCESS; ++c)
    st = flashcl_attention_decode(ctx, desc, q, kc, vc, lens, out, lse, 0, NULL, NULL);
  *host_us = (tools_now_ms() - he) * 1e3 / (double)calls;
  if (st == FLASHCL_SUCCESS) st = clEnqueueMarkerWithWaitList(queue, 0, NULL, &after);
  if (st == FLASHCL_SUCCESS) st = clWaitForEvents(1, &after);
  *ms = (tools_now_ms() - h0) / (double)calls;
  if (st == FLASHCL_SUCCESS &&
      clGetEventProfilingInfo(before, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL) == CL_SUCCESS &&
      clGetEventProfilingInfo(after, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL) == CL_SUCCESS && t1 > t0)
    *ms = (double)(t1 - t0) * 1e-6 / (double)calls;
  else if (st == FLASHCL_SUCCESS)
    *used_host_timer = 1;
  clReleaseEvent(before);
  if (after) clReleaseEvent(after);
  if (st != FLASHCL_SUCCESS) clFinish(queue);
  return st;
}

int tools_open_context(const char *tool, const char *device, int verbose, flashcl_context_options *options,
                       flashcl_context **ctx, flashcl_device_info *info) {
  int st;
  flashcl_context_options_init(options);
  options->device = device;
  options->profiling = 1;
  options->verbose = verbose;
  *ctx = NULL;
  st = flashcl_context_create(options, ctx);
  if (st != FLASHCL_SUCCESS) {
    fprintf(stderr, "%s: cannot create a context on %s: %s (%d)\n", tool, device ? device : "the default device",
            flashcl_status_string(st), st);
    return 2;
  }
  st = flashcl_context_device_info(*ctx, info);
  if (st != FLASHCL_SUCCESS) {
    tools_print_error(stderr, *ctx, "flashcl_context_device_info", st);
    flashcl_context_destroy(*ctx);
    *ctx = NULL;
    return 2;
  }
  return 0;
}
