/* Shared harness for the flashcl tests. See common.h. */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef _WIN32
#include <unistd.h>
#endif

/* ------------------------------------------------------------------ misc -- */

static double now_seconds(void) {
#if defined(CLOCK_MONOTONIC) && !defined(_WIN32)
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#else
  return (double)clock() / CLOCKS_PER_SEC;
#endif
}

static fct_env g_env;
static int g_env_ready;

void fct_print_error_prefix(const char *file, int line) { print_error("%s:%d: ", file, line); }

const char *fct_last_error(void) {
  return g_env_ready && g_env.ctx ? flashcl_context_last_error(g_env.ctx) : "(no context)";
}

const char *fct_algo_str(flashcl_algo algo) {
  switch (algo) {
    case FLASHCL_ALGO_AUTO: return "auto";
    case FLASHCL_ALGO_FLASH: return "flash";
    case FLASHCL_ALGO_NAIVE: return "naive";
  }
  return "?";
}

const char *fct_layout_str(fct_layout layout) {
  switch (layout) {
    case FCT_BNHD: return "bnhd";
    case FCT_BHND: return "bhnd";
    case FCT_PADDED: return "padded";
  }
  return "?";
}

/* ------------------------------------------------------------ seed / RNG -- */

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fct_seed(void) {
  static int have;
  static uint64_t seed;
  if (!have) {
    const char *env = getenv("FLASHCL_TEST_SEED");
    if (env && *env) {
      seed = (uint64_t)strtoull(env, NULL, 0);
    } else {
      uint64_t x = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
#ifndef _WIN32
      x ^= (uint64_t)getpid() << 20;
#endif
      seed = splitmix64(&x) % 1000000000000ull; /* short enough to retype */
    }
    have = 1;
  }
  return seed;
}

void fct_rng_init(fct_rng *rng, const char *tag) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the tag */
  const unsigned char *p = (const unsigned char *)(tag ? tag : "");
  while (*p) h = (h ^ *p++) * 0x100000001b3ull;
  rng->s = fct_seed() ^ h;
  rng->has_spare = 0;
  rng->spare = 0.0;
  (void)splitmix64(&rng->s);
}

uint64_t fct_rng_u64(fct_rng *rng) { return splitmix64(&rng->s); }

double fct_rng_uniform(fct_rng *rng) { return (double)(fct_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0); }

double fct_rng_normal(fct_rng *rng) {
  double u1, u2, r;
  if (rng->has_spare) {
    rng->has_spare = 0;
    return rng->spare;
  }
  do u1 = fct_rng_uniform(rng);
  while (u1 <= 0.0);
  u2 = fct_rng_uniform(rng);
  r = sqrt(-2.0 * log(u1));
  rng->spare = r * sin(6.283185307179586 * u2);
  rng->has_spare = 1;
  return r * cos(6.283185307179586 * u2);
}

/* ----------------------------------------------------- dtype conversion -- */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t fct_f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  uint32_t r, rem;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN stays NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf; inf */
  if (a < 0x38800000u) {                                    /* below 2^-14: subnormal or zero */
    uint32_t m, half;
    int shift;
    if (a <= 0x33000000u) return sign; /* <= 2^-25 rounds to (even) zero */
    m = (a & 0x7fffffu) | 0x800000u;
    shift = 126 - (int)(a >> 23); /* 14..24 */
    r = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r); /* r == 0x400 is the smallest normal */
  }
  r = (a >> 13) - (112u << 10); /* rebias exponent 127 -> 15 */
  rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}

float fct_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t fct_f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float fct_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

size_t fct_dtype_size(flashcl_dtype dtype) {
  switch (dtype) {
    case FLASHCL_F32: return 4;
    case FLASHCL_F16:
    case FLASHCL_BF16: return 2;
    case FLASHCL_I8:
    case FLASHCL_F8E4M3:
    case FLASHCL_F8E5M2:
    case FLASHCL_I4X2: return 1; /* KV-cache codes: tests/reference_kvq.h reads them */
  }
  return 0;
}

const char *fct_dtype_str(flashcl_dtype dtype) {
  switch (dtype) {
    case FLASHCL_F32: return "f32";
    case FLASHCL_F16: return "f16";
    case FLASHCL_BF16: return "bf16";
    case FLASHCL_I8: return "i8";
    case FLASHCL_F8E4M3: return "f8e4m3";
    case FLASHCL_F8E5M2: return "f8e5m2";
    case FLASHCL_I4X2: return "i4x2";
  }
  return "?";
}

float fct_quantize(flashcl_dtype dtype, float x) {
  switch (dtype) {
    case FLASHCL_F16: return fct_f16_to_f32(fct_f32_to_f16(x));
    case FLASHCL_BF16: return fct_bf16_to_f32(fct_f32_to_bf16(x));
    default: return x;
  }
}

void fct_store(flashcl_dtype dtype, void *base, size_t index, float x) {
  uint16_t h;
  switch (dtype) {
    case FLASHCL_F32: memcpy((unsigned char *)base + 4 * index, &x, 4); return;
    case FLASHCL_F16: h = fct_f32_to_f16(x); break;
    case FLASHCL_BF16: h = fct_f32_to_bf16(x); break;
    default: return;
  }
  memcpy((unsigned char *)base + 2 * index, &h, 2);
}

double fct_load(flashcl_dtype dtype, const void *base, size_t index) {
  float f;
  uint16_t h;
  switch (dtype) {
    case FLASHCL_F32: memcpy(&f, (const unsigned char *)base + 4 * index, 4); return f;
    case FLASHCL_F16: memcpy(&h, (const unsigned char *)base + 2 * index, 2); return fct_f16_to_f32(h);
    case FLASHCL_BF16: memcpy(&h, (const unsigned char *)base + 2 * index, 2); return fct_bf16_to_f32(h);
    default: break; /* a quantized code has no value without its scale (reference_kvq.h) */
  }
  return NAN;
}

double fct_load_f16(const void *base, int64_t index) { return fct_load(FLASHCL_F16, base, (size_t)index); }
double fct_load_bf16(const void *base, int64_t index) { return fct_load(FLASHCL_BF16, base, (size_t)index); }

ref_load_fn fct_loader(flashcl_dtype dtype) {
  switch (dtype) {
    case FLASHCL_F16: return fct_load_f16;
    case FLASHCL_BF16: return fct_load_bf16;
    default: return ref_load_f32;
  }
}

/* Quiet NaNs with a recognisable payload. */
#define FCT_POISON_F32 0x7fc0deadu
#define FCT_POISON_F16 0x7e5au
#define FCT_POISON_BF16 0x7fdau

void fct_store_poison(flashcl_dtype dtype, void *base, size_t index) {
  uint32_t p32 = FCT_POISON_F32;
  uint16_t p16 = dtype == FLASHCL_BF16 ? FCT_POISON_BF16 : FCT_POISON_F16;
  if (fct_dtype_size(dtype) == 1) { /* the quantized cache formats: 0xff, a NaN in both fp8 formats */
    ((unsigned char *)base)[index] = 0xff;
    return;
  }
  if (dtype == FLASHCL_F32)
    memcpy((unsigned char *)base + 4 * index, &p32, 4);
  else
    memcpy((unsigned char *)base + 2 * index, &p16, 2);
}

int fct_is_poison(flashcl_dtype dtype, const void *base, size_t index) {
  uint32_t p32;
  uint16_t p16;
  if (fct_dtype_size(dtype) == 1) return ((const unsigned char *)base)[index] == 0xff;
  if (dtype == FLASHCL_F32) {
    memcpy(&p32, (const unsigned char *)base + 4 * index, 4);
    return p32 == FCT_POISON_F32;
  }
  memcpy(&p16, (const unsigned char *)base + 2 * index, 2);
  return p16 == (dtype == FLASHCL_BF16 ? FCT_POISON_BF16 : FCT_POISON_F16);
}

double fct_tolerance(flashcl_dtype dtype) {
  switch (dtype) {
    case FLASHCL_F16: return 2e-3;
    case FLASHCL_BF16: return 1e-2;
    default: return 1e-5;
  }
}

double fct_lse_tolerance(flashcl_dtype dtype) { return dtype == FLASHCL_F32 ? 1e-5 : 1e-4; }

/* ------------------------------------------------------------ the group -- */

const flashcl_tuning *fct_gpu_map_tuning(void) {
  static flashcl_tuning t;
  flashcl_tuning_init(&t, FLASHCL_TUNE_FWD);
  if (flashcl_tuning_set(NULL, &t, "map", 0) != FLASHCL_SUCCESS) fail_msg("fwd map=0 is not a legal tuning");
  return &t;
}

fct_env *fct_env_get(void) {
  if (!g_env_ready) fail_msg("no flashcl context: the test group was run without device setup");
  return &g_env;
}

int fct_group_setup(void **state) {
  flashcl_context_options opt;
  const char *verbose = getenv("FLASHCL_TEST_VERBOSE");
  flashcl_status st;
  memset(&g_env, 0, sizeof g_env);
  flashcl_context_options_init(&opt);
  opt.verbose = verbose && *verbose ? atoi(verbose) : 0;
  /* Only $FLASHCL_TUNING (the CTest variants' override files) and the built-in
   * database: a user's own tuning files must not change what the suite runs. */
  opt.no_user_tuning = 1;
  st = flashcl_context_create(&opt, &g_env.ctx);
  if (st != FLASHCL_SUCCESS || !g_env.ctx) {
    print_error("flashcl_context_create failed: %d (%s)\n", (int)st, flashcl_status_string(st));
    return -1;
  }
  g_env.cl_ctx = flashcl_context_cl_context(g_env.ctx);
  g_env.device = flashcl_context_cl_device(g_env.ctx);
  g_env.queue = flashcl_context_cl_queue(g_env.ctx);
  if (!g_env.cl_ctx || !g_env.device || !g_env.queue) {
    print_error("flashcl context returned NULL OpenCL objects\n");
    flashcl_context_destroy(g_env.ctx);
    return -1;
  }
  st = flashcl_context_device_info(g_env.ctx, &g_env.info);
  if (st == FLASHCL_SUCCESS)
    print_message("[ DEVICE   ] %s / %s (%s), local mem %zu bytes\n", g_env.info.platform_name,
                  g_env.info.device_name, g_env.info.device_version, g_env.info.local_mem_size);
  else
    print_message("[ DEVICE   ] flashcl_context_device_info failed: %s\n", flashcl_status_string(st));
  g_env_ready = 1;
  *state = NULL; /* tests get their own prestate */
  return 0;
}

int fct_group_teardown(void **state) {
  (void)state;
  if (g_env_ready) flashcl_context_destroy(g_env.ctx);
  memset(&g_env, 0, sizeof g_env);
  g_env_ready = 0;
  return 0;
}

int fct_skipped;

/* cmocka's filter syntax: '*' any run of characters, '?' one character. */
static int fct_glob(const char *pat, const char *s) {
  if (!*pat) return !*s;
  if (*pat == '*') return fct_glob(pat + 1, s) || (*s && fct_glob(pat, s + 1));
  return *s && (*pat == '?' || *pat == *s) && fct_glob(pat + 1, s + 1);
}

int fct_exit_status(const struct CMUnitTest *tests, size_t count, int failed) {
  if (failed) return failed;
  const char *filter = getenv("FLASHCL_TEST_FILTER");
  int ran = 0;
  for (size_t i = 0; i < count; i++) ran += !(filter && *filter) || fct_glob(filter, tests[i].name);
  if (ran > 0 && fct_skipped >= ran) {
    print_message("[ SKIPPED  ] all %d test(s) skipped on this device\n", ran);
    return FCT_SKIP_STATUS;
  }
  return 0;
}

int fct_run_group(const char *name, const struct CMUnitTest *tests, size_t count, int need_device) {
  const char *filter = getenv("FLASHCL_TEST_FILTER");
  int failed;
  if (filter && *filter) cmocka_set_test_filter(filter);
  print_message("[ SEED     ] FLASHCL_TEST_SEED=%llu\n", (unsigned long long)fct_seed());
  failed = _cmocka_run_group_tests(name, tests, count, need_device ? fct_group_setup : NULL,
                                   need_device ? fct_group_teardown : NULL);
  if (failed)
    print_message("[ SEED     ] %d failure(s); reproduce with FLASHCL_TEST_SEED=%llu\n", failed,
                  (unsigned long long)fct_seed());
  return fct_exit_status(tests, count, failed);
}

#ifndef CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV
#define CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000
#endif

/* The device's string info `param`, or "" (malloc'ed; the caller frees it). */
static char *device_string(cl_device_id device, cl_device_info param) {
  size_t n = 0;
  char *s = NULL;
  if (clGetDeviceInfo(device, param, 0, NULL, &n) == CL_SUCCESS && n) s = (char *)malloc(n + 1);
  if (s && clGetDeviceInfo(device, param, n, s, NULL) == CL_SUCCESS)
    s[n] = '\0';
  else if (s)
    s[0] = '\0';
  if (!s) s = (char *)calloc(1, 1);
  FCT_CHECK(s != NULL, "malloc failed");
  return s;
}

int fct_device_requires_mma(cl_device_id device, char *what, size_t what_cap) {
  cl_platform_id platform = NULL;
  char pname[256] = "";
  char *ext;
  cl_uint major = 0;
  int has_attr, nvidia;
  char dummy[8];
  if (!what) what = dummy, what_cap = sizeof dummy;
  what[0] = '\0';
  if (clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL) != CL_SUCCESS ||
      clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL) != CL_SUCCESS)
    pname[0] = '\0';
  pname[sizeof pname - 1] = '\0';
  nvidia = strstr(pname, "NVIDIA") != NULL;
  if (!nvidia) {
    snprintf(what, what_cap, "platform \"%s\" is not NVIDIA's", pname);
    return 0;
  }
  ext = device_string(device, CL_DEVICE_EXTENSIONS);
  has_attr = strstr(ext, "cl_nv_device_attribute_query") != NULL;
  free(ext);
  if (!has_attr) {
    snprintf(what, what_cap, "NVIDIA device without cl_nv_device_attribute_query");
    return 0;
  }
  if (clGetDeviceInfo(device, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major, NULL) != CL_SUCCESS) {
    snprintf(what, what_cap, "NVIDIA device whose compute capability query failed");
    return 0;
  }
  snprintf(what, what_cap, "NVIDIA device of compute capability %u.x", (unsigned)major);
  return major >= 8;
}

void fct_mma_unavailable(cl_device_id device, const char *name, const char *reason) {
  char what[320];
  if (fct_device_requires_mma(device, what, sizeof what))
    FCT_FAIL("%s: the tensor-core path is unavailable on an %s, which must run it: %s", name, what,
             reason ? reason : "(no reason)");
  print_message("  %-28s no tensor-core path (%s): %s\n", name, what, reason ? reason : "(no reason)");
}

int fct_mma_ready(const char *name, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                  const flashcl_tensor *k, const flashcl_tensor *v, flashcl_pass pass) {
  flashcl_context *ctx = fct_env_get()->ctx;
  flashcl_kernel_family fam = FLASHCL_KERNEL_AUTO;
  /* The query checks o as the forward does (its own memory): q's view in a
   * buffer of its own stands in for it. */
  size_t qbytes = 0;
  FCT_CHECK(clGetMemObjectInfo(q->buffer, CL_MEM_SIZE, sizeof qbytes, &qbytes, NULL) == CL_SUCCESS,
            "%s: CL_MEM_SIZE of q", name);
  flashcl_tensor o = *q;
  o.buffer = fct_create_buffer(qbytes, NULL);
  const flashcl_status st = flashcl_attention_kernel_family(ctx, desc, q, k, v, &o, pass, &fam);
  clReleaseMemObject(o.buffer);
  if (st == FLASHCL_ERROR_UNSUPPORTED && strstr(flashcl_context_last_error(ctx), "not available")) {
    fct_mma_unavailable(fct_env_get()->device, name, flashcl_context_last_error(ctx));
    return 0;
  }
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: flashcl_attention_kernel_family", name);
  FCT_CHECK(fam == FLASHCL_KERNEL_NVIDIA_MMA, "%s: the tensor-core %s does not cover this case (family %d)", name,
            pass == FLASHCL_PASS_BACKWARD ? "backward" : "forward", (int)fam);
  return 1;
}

/* ------------------------------------------------------- device tensors -- */

cl_mem fct_create_buffer(size_t bytes, const void *init) {
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(fct_env_get()->cl_ctx, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0),
                            bytes ? bytes : 1, (void *)init, &err);
  FCT_CHECK(m && err == CL_SUCCESS, "clCreateBuffer(%zu bytes) failed: %d", bytes, (int)err);
  return m;
}

void fct_finish(void) {
  cl_int err = clFinish(fct_env_get()->queue);
  FCT_CHECK(err == CL_SUCCESS, "clFinish failed: %d (%s)", (int)err, flashcl_status_string(err));
}

static void tensor_alloc(fct_tensor *t, size_t bytes) {
  t->bytes = bytes;
  t->host = (unsigned char *)malloc(bytes ? bytes : 1);
  FCT_CHECK(t->host != NULL, "host malloc(%zu) failed", bytes);
  t->t.buffer = fct_create_buffer(bytes, NULL);
}

static void set_view(fct_tensor *t, flashcl_dtype dtype, size_t offset, const int64_t shape[4],
                     const int64_t stride[4]) {
  int i;
  t->t.dtype = dtype;
  t->t.offset = offset;
  for (i = 0; i < 4; i++) t->t.shape[i] = shape[i], t->t.stride[i] = stride[i];
}

void fct_tensor_create_custom(fct_tensor *t, flashcl_dtype dtype, size_t bytes, size_t offset,
                              const int64_t shape[4], const int64_t stride[4]) {
  memset(t, 0, sizeof *t);
  set_view(t, dtype, offset, shape, stride);
  tensor_alloc(t, bytes);
  fct_tensor_poison(t);
}

static size_t view_span_elems(const fct_tensor *t) {
  /* Elements from the buffer start to one past the last element of the view. */
  size_t last = t->t.offset / fct_dtype_size(t->t.dtype);
  int i;
  for (i = 0; i < 4; i++) last += (size_t)((t->t.shape[i] - 1) * t->t.stride[i]);
  return last + 1;
}

void fct_tensor_create(fct_tensor *t, flashcl_dtype dtype, fct_layout layout, int64_t B, int64_t N, int64_t H,
                       int64_t D, int salt) {
  fct_tensor_create_guarded(t, dtype, layout, B, N, H, D, salt, 0);
}

void fct_tensor_create_guarded(fct_tensor *t, flashcl_dtype dtype, fct_layout layout, int64_t B, int64_t N,
                               int64_t H, int64_t D, int salt, size_t guard) {
  const size_t es = fct_dtype_size(dtype);
  flashcl_status st;
  memset(t, 0, sizeof *t);
  if (layout == FCT_PADDED) {
    /* Odd paddings everywhere: head stride D + 5 + salt, seq stride H*hs + 3, batch
     * stride N*ss + 7, offset 11 + salt elements, 13 trailing elements. */
    int64_t shape[4], stride[4];
    size_t offset_elems = (size_t)(11 + salt);
    shape[0] = B, shape[1] = N, shape[2] = H, shape[3] = D;
    stride[3] = 1;
    stride[2] = D + 5 + salt;
    stride[1] = H * stride[2] + 3;
    stride[0] = N * stride[1] + 7;
    set_view(t, dtype, offset_elems * es, shape, stride);
    tensor_alloc(t, (view_span_elems(t) + 13 + guard) * es);
    fct_tensor_poison(t);
    return;
  }
  tensor_alloc(t, ((size_t)(B * N * H * D) + guard) * es);
  if (layout == FCT_BHND)
    st = flashcl_tensor_init_bhnd(&t->t, t->t.buffer, 0, dtype, B, N, H, D);
  else
    st = flashcl_tensor_init_bnhd(&t->t, t->t.buffer, 0, dtype, B, N, H, D);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "flashcl_tensor_init_%s(B=%lld N=%lld H=%lld D=%lld)",
                   fct_layout_str(layout), (long long)B, (long long)N, (long long)H, (long long)D);
  {
    /* The init functions must produce the documented strides. */
    int64_t want[4];
    want[3] = 1;
    if (layout == FCT_BHND)
      want[1] = D, want[2] = N * D, want[0] = H * N * D;
    else
      want[2] = D, want[1] = H * D, want[0] = N * H * D;
    FCT_CHECK(t->t.shape[0] == B && t->t.shape[1] == N && t->t.shape[2] == H && t->t.shape[3] == D &&
                  t->t.stride[0] == want[0] && t->t.stride[1] == want[1] && t->t.stride[2] == want[2] &&
                  t->t.stride[3] == want[3] && t->t.dtype == dtype && t->t.offset == 0,
              "flashcl_tensor_init_%s(B=%lld N=%lld H=%lld D=%lld) gave shape (%lld,%lld,%lld,%lld) strides "
              "(%lld,%lld,%lld,%lld), want strides (%lld,%lld,%lld,%lld)",
              fct_layout_str(layout), (long long)B, (long long)N, (long long)H, (long long)D,
              (long long)t->t.shape[0], (long long)t->t.shape[1], (long long)t->t.shape[2],
              (long long)t->t.shape[3], (long long)t->t.stride[0], (long long)t->t.stride[1],
              (long long)t->t.stride[2], (long long)t->t.stride[3], (long long)want[0], (long long)want[1],
              (long long)want[2], (long long)want[3]);
  }
  fct_tensor_poison(t);
}

void fct_tensor_create_lse(fct_tensor *t, fct_layout layout, int64_t B, int64_t N, int64_t H, int salt) {
  fct_tensor_create_lse_guarded(t, layout, B, N, H, salt, 0);
}

void fct_tensor_create_lse_guarded(fct_tensor *t, fct_layout layout, int64_t B, int64_t N, int64_t H, int salt,
                                   size_t guard) {
  flashcl_status st;
  memset(t, 0, sizeof *t);
  if (layout == FCT_PADDED) {
    int64_t shape[4], stride[4];
    size_t offset_elems = (size_t)(9 + salt);
    shape[0] = B, shape[1] = N, shape[2] = H, shape[3] = 1;
    stride[3] = 1, stride[1] = 1, stride[2] = N + 3, stride[0] = H * stride[2] + 5;
    set_view(t, FLASHCL_F32, offset_elems * 4, shape, stride);
    tensor_alloc(t, (view_span_elems(t) + 6 + guard) * 4);
    fct_tensor_poison(t);
    return;
  }
  tensor_alloc(t, ((size_t)(B * N * H) + guard) * 4);
  st = flashcl_tensor_init_lse(&t->t, t->t.buffer, 0, B, N, H);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "flashcl_tensor_init_lse(B=%lld N=%lld H=%lld)", (long long)B,
                   (long long)N, (long long)H);
  FCT_CHECK(t->t.dtype == FLASHCL_F32 && t->t.shape[0] == B && t->t.shape[1] == N && t->t.shape[2] == H &&
                t->t.shape[3] == 1 && t->t.stride[0] == H * N && t->t.stride[1] == 1 && t->t.stride[2] == N,
            "flashcl_tensor_init_lse(B=%lld N=%lld H=%lld) gave dtype %d shape (%lld,%lld,%lld,%lld) strides "
            "(%lld,%lld,%lld,%lld), want fp32 (B,N,H,1) with strides (H*N,1,N,*)",
            (long long)B, (long long)N, (long long)H, (int)t->t.dtype, (long long)t->t.shape[0],
            (long long)t->t.shape[1], (long long)t->t.shape[2], (long long)t->t.shape[3],
            (long long)t->t.stride[0], (long long)t->t.stride[1], (long long)t->t.stride[2],
            (long long)t->t.stride[3]);
  fct_tensor_poison(t);
}

void fct_tensor_release(fct_tensor *t) {
  if (t->t.buffer) clReleaseMemObject(t->t.buffer);
  free(t->host);
  memset(t, 0, sizeof *t);
}

static void tensor_upload(fct_tensor *t) {
  cl_int err = clEnqueueWriteBuffer(fct_env_get()->queue, t->t.buffer, CL_TRUE, 0, t->bytes, t->host, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueWriteBuffer(%zu bytes) failed: %d", t->bytes, (int)err);
}

size_t fct_tensor_index(const fct_tensor *t, int64_t b, int64_t n, int64_t h, int64_t x) {
  return t->t.offset / fct_dtype_size(t->t.dtype) +
         (size_t)(b * t->t.stride[0] + n * t->t.stride[1] + h * t->t.stride[2] + x * t->t.stride[3]);
}

double fct_tensor_get(const fct_tensor *t, int64_t b, int64_t n, int64_t h, int64_t x) {
  return fct_load(t->t.dtype, t->host, fct_tensor_index(t, b, n, h, x));
}

void fct_tensor_poison(fct_tensor *t) {
  size_t i, n = t->bytes / fct_dtype_size(t->t.dtype);
  for (i = 0; i < n; i++) fct_store_poison(t->t.dtype, t->host, i);
  tensor_upload(t);
}

void fct_tensor_fill_random(fct_tensor *t, fct_rng *rng) {
  size_t i, n = t->bytes / fct_dtype_size(t->t.dtype);
  int64_t b, s, h, x;
  for (i = 0; i < n; i++) fct_store_poison(t->t.dtype, t->host, i);
  for (b = 0; b < t->t.shape[0]; b++)
    for (s = 0; s < t->t.shape[1]; s++)
      for (h = 0; h < t->t.shape[2]; h++)
        for (x = 0; x < t->t.shape[3]; x++) {
          float v;
          do v = fct_quantize(t->t.dtype, (float)fct_rng_normal(rng));
          while (fabsf(v) < 1e-3f); /* never zero */
          fct_store(t->t.dtype, t->host, fct_tensor_index(t, b, s, h, x), v);
        }
  tensor_upload(t);
}

void fct_tensor_download(fct_tensor *t) {
  cl_int err = clEnqueueReadBuffer(fct_env_get()->queue, t->t.buffer, CL_TRUE, 0, t->bytes, t->host, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "clEnqueueReadBuffer(%zu bytes) failed: %d", t->bytes, (int)err);
}

size_t fct_tensor_count_unpoisoned(const fct_tensor *t) {
  size_t i, n = t->bytes / fct_dtype_size(t->t.dtype), c = 0;
  for (i = 0; i < n; i++) c += !fct_is_poison(t->t.dtype, t->host, i);
  return c;
}

size_t fct_tensors_written(fct_tensor *const *ts, int n) {
  size_t c = 0;
  for (int i = 0; i < n; i++) {
    fct_tensor_download(ts[i]);
    c += fct_tensor_count_unpoisoned(ts[i]);
  }
  return c;
}

ref_tensor fct_tensor_ref(const fct_tensor *t) {
  ref_tensor r;
  int i;
  r.data = t->host;
  r.load = fct_loader(t->t.dtype);
  r.offset = (int64_t)(t->t.offset / fct_dtype_size(t->t.dtype));
  for (i = 0; i < 4; i++) r.shape[i] = t->t.shape[i], r.stride[i] = t->t.stride[i];
  return r;
}

/* ------------------------------------------------------ attention cases -- */

static void append(char *buf, size_t cap, const char *fmt, ...) {
  size_t len = strlen(buf);
  va_list ap;
  if (len >= cap) return;
  va_start(ap, fmt);
  vsnprintf(buf + len, cap - len, fmt, ap);
  va_end(ap);
}

void fct_problem_create(fct_problem *p, const fct_case *c) {
  const int64_t Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim;
  fct_rng rng;
  ref_attention_params rp;
  ref_tensor rq, rk, rv;
  ref_out ro, rl;
  int s;

  memset(p, 0, sizeof *p);
  p->c = *c;
  if (c->num_seqs > 0) {
    p->cu_q_host = (int32_t *)calloc((size_t)c->num_seqs + 1, sizeof(int32_t));
    p->cu_k_host = (int32_t *)calloc((size_t)c->num_seqs + 1, sizeof(int32_t));
    FCT_CHECK(p->cu_q_host && p->cu_k_host, "calloc failed");
    for (s = 0; s < c->num_seqs; s++) {
      p->cu_q_host[s + 1] = p->cu_q_host[s] + c->seqlens_q[s];
      p->cu_k_host[s + 1] = p->cu_k_host[s] + c->seqlens_k[s];
      if (c->seqlens_q[s] > p->max_q) p->max_q = c->seqlens_q[s];
      if (c->seqlens_k[s] > p->max_k) p->max_k = c->seqlens_k[s];
    }
    p->B = 1;
    p->Nq = p->cu_q_host[c->num_seqs];
    p->Nk = p->cu_k_host[c->num_seqs];
  } else {
    p->B = c->batch;
    p->Nq = c->seqlen_q;
    p->Nk = c->seqlen_k;
  }

  snprintf(p->desc, sizeof p->desc, "%s B=%lld Nq=%lld Nk=%lld Hq=%d Hkv=%d d=%d causal=%d", fct_dtype_str(c->dtype),
           (long long)p->B, (long long)p->Nq, (long long)p->Nk, c->heads_q, c->heads_kv, c->head_dim, c->causal);
  if (c->scale != 0.0f) append(p->desc, sizeof p->desc, " scale=%g", (double)c->scale);
  append(p->desc, sizeof p->desc, " layout=%s", fct_layout_str(c->layout));
  if (c->no_lse) append(p->desc, sizeof p->desc, " lse=NULL");
  if (c->kv_batch_stride0) append(p->desc, sizeof p->desc, " kv_batch_stride=0");
  if (c->num_seqs > 0) {
    append(p->desc, sizeof p->desc, " varlen q={");
    for (s = 0; s < c->num_seqs; s++) append(p->desc, sizeof p->desc, "%s%d", s ? "," : "", c->seqlens_q[s]);
    append(p->desc, sizeof p->desc, "} k={");
    for (s = 0; s < c->num_seqs; s++) append(p->desc, sizeof p->desc, "%s%d", s ? "," : "", c->seqlens_k[s]);
    append(p->desc, sizeof p->desc, "}");
  }

  fct_rng_init(&rng, p->desc);
  fct_tensor_create(&p->q, c->dtype, c->layout, p->B, p->Nq, Hq, D, 0);
  if (c->kv_batch_stride0) {
    fct_tensor_create(&p->k, c->dtype, c->layout, 1, p->Nk, Hkv, D, 1);
    fct_tensor_create(&p->v, c->dtype, c->layout, 1, p->Nk, Hkv, D, 2);
    p->k.t.shape[0] = p->v.t.shape[0] = p->B;
    p->k.t.stride[0] = p->v.t.stride[0] = 0;
  } else {
    fct_tensor_create(&p->k, c->dtype, c->layout, p->B, p->Nk, Hkv, D, 1);
    fct_tensor_create(&p->v, c->dtype, c->layout, p->B, p->Nk, Hkv, D, 2);
  }
  fct_tensor_fill_random(&p->q, &rng);
  fct_tensor_fill_random(&p->k, &rng);
  fct_tensor_fill_random(&p->v, &rng);
  if (c->num_seqs > 0) {
    p->cu_q = fct_create_buffer(((size_t)c->num_seqs + 1) * sizeof(int32_t), p->cu_q_host);
    p->cu_k = fct_create_buffer(((size_t)c->num_seqs + 1) * sizeof(int32_t), p->cu_k_host);
  }

  p->ref_o = (double *)malloc((size_t)(p->B * p->Nq * Hq * D + 1) * sizeof(double));
  p->ref_lse = (double *)malloc((size_t)(p->B * p->Nq * Hq + 1) * sizeof(double));
  FCT_CHECK(p->ref_o && p->ref_lse, "malloc failed");
  memset(&rp, 0, sizeof rp);
  rp.scale = c->scale;
  rp.causal = c->causal;
  rp.cu_seqlens_q = p->cu_q_host;
  rp.cu_seqlens_k = p->cu_k_host;
  rp.num_seqs = c->num_seqs;
  rq = fct_tensor_ref(&p->q);
  rk = fct_tensor_ref(&p->k);
  rv = fct_tensor_ref(&p->v);
  ro = ref_out_bnhd(p->ref_o, p->B, p->Nq, Hq, D);
  rl = ref_out_bnhd(p->ref_lse, p->B, p->Nq, Hq, 1);
  p->ref_seconds = now_seconds();
  FCT_CHECK(ref_attention_forward(&rp, &rq, &rk, &rv, &ro, &rl) == 0, "reference rejected the case: %s", p->desc);
  p->ref_seconds = now_seconds() - p->ref_seconds;
}

void fct_problem_release(fct_problem *p) {
  fct_tensor_release(&p->q);
  fct_tensor_release(&p->k);
  fct_tensor_release(&p->v);
  if (p->cu_q) clReleaseMemObject(p->cu_q);
  if (p->cu_k) clReleaseMemObject(p->cu_k);
  free(p->cu_q_host);
  free(p->cu_k_host);
  free(p->ref_o);
  free(p->ref_lse);
  memset(p, 0, sizeof *p);
}

void fct_problem_desc(const fct_problem *p, const fct_run *run, flashcl_attention_desc *desc) {
  flashcl_attention_desc_init(desc);
  desc->score.scale = p->c.scale;
  desc->mask.causal = p->c.causal;
  if (p->c.num_seqs > 0) {
    desc->varlen.cu_seqlens_q = p->cu_q;
    desc->varlen.cu_seqlens_k = p->cu_k;
    desc->varlen.num_seqs = p->c.num_seqs;
    desc->varlen.max_seqlen_q = p->max_q;
    desc->varlen.max_seqlen_k = p->max_k;
  }
  if (run) {
    desc->algorithm.algo = run->algo;
    desc->algorithm.kernel = run->kernel;
    desc->algorithm.block_r = run->block_r;
    desc->algorithm.block_c = run->block_c;
    desc->algorithm.tuning = run->tuning;
  }
}

static void run_str(const fct_run *run, char *buf, size_t cap) {
  snprintf(buf, cap, "algo=%s", fct_algo_str(run ? run->algo : FLASHCL_ALGO_AUTO));
  if (run && (run->block_r || run->block_c)) append(buf, cap, " block_r=%d block_c=%d", run->block_r, run->block_c);
  if (run && run->kernel != FLASHCL_KERNEL_AUTO) append(buf, cap, " kernel=%d", (int)run->kernel);
  if (run && run->tuning) {
    char t[256];
    if (flashcl_tuning_format(run->tuning, t, sizeof t) == FLASHCL_SUCCESS) append(buf, cap, " tuning \"%s\"", t);
  }
}

void fct_problem_run(fct_problem *p, const fct_run *run, fct_result *r) {
  const fct_case *c = &p->c;
  const int64_t Hq = c->heads_q, D = c->head_dim;
  const double tol = fct_tolerance(c->dtype), lse_tol = fct_lse_tolerance(c->dtype);
  const double row_tol = 10.0 * tol;
  flashcl_attention_desc desc;
  flashcl_status st;
  cl_event ev = NULL;
  cl_int err, ev_status = -1;
  char rs[128];
  double e2 = 0, r2 = 0, le2 = 0, lr2 = 0;
  int64_t b, n, h, x;
  size_t written, nan_count = 0;
  char first_bad[512] = "";

  run_str(run, rs, sizeof rs);
  memset(r, 0, sizeof *r);
  r->has_lse = !c->no_lse;
  /* Outputs get a NaN guard after the view: a kernel writing past the end shows up
   * as changed guard elements (checked below) instead of corrupting host memory
   * (CPU devices share the process's heap). */
  fct_tensor_create_guarded(&r->o, c->dtype, c->layout, p->B, p->Nq, Hq, D, 3, FCT_OUTPUT_GUARD);
  if (r->has_lse) fct_tensor_create_lse_guarded(&r->lse, c->layout, p->B, p->Nq, Hq, 4, FCT_OUTPUT_GUARD);
  fct_problem_desc(p, run, &desc);

  r->seconds = now_seconds();
  st = flashcl_attention_forward(fct_env_get()->ctx, &desc, &p->q.t, &p->k.t, &p->v.t, &r->o.t,
                                 r->has_lse ? &r->lse.t : NULL, 0, NULL, &ev);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "flashcl_attention_forward: %s %s", p->desc, rs);
  FCT_CHECK(ev != NULL, "flashcl_attention_forward succeeded but returned no event: %s %s", p->desc, rs);
  err = clWaitForEvents(1, &ev);
  FCT_CHECK(err == CL_SUCCESS, "clWaitForEvents on the out_event failed: %d: %s %s", (int)err, p->desc, rs);
  err = clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof ev_status, &ev_status, NULL);
  FCT_CHECK(err == CL_SUCCESS && ev_status == CL_COMPLETE, "out_event status %d (err %d): %s %s", (int)ev_status,
            (int)err, p->desc, rs);
  clReleaseEvent(ev);
  fct_finish();
  r->seconds = now_seconds() - r->seconds;
  fct_tensor_download(&r->o);
  if (r->has_lse) fct_tensor_download(&r->lse);

  for (b = 0; b < p->B; b++)
    for (n = 0; n < p->Nq; n++)
      for (h = 0; h < Hq; h++) {
        const double *ref = p->ref_o + ((b * p->Nq + n) * Hq + h) * D;
        const double ref_l = p->ref_lse[(b * p->Nq + n) * Hq + h];
        double row_e2 = 0, row_r2 = 0, got_l = 0;
        int row_nan = 0;
        for (x = 0; x < D; x++) {
          double got = fct_tensor_get(&r->o, b, n, h, x);
          if (isnan(got)) row_nan = 1;
          row_e2 += (got - ref[x]) * (got - ref[x]);
          row_r2 += ref[x] * ref[x];
        }
        if (r->has_lse) {
          got_l = fct_tensor_get(&r->lse, b, n, h, 0);
          if (isnan(got_l)) row_nan = 1;
        }
        if (row_nan) {
          nan_count++;
          if (!first_bad[0])
            snprintf(first_bad, sizeof first_bad,
                     "NaN in row (b=%lld, n=%lld, h=%lld): o[0]=%g lse=%g (ref o[0]=%g lse=%g)", (long long)b,
                     (long long)n, (long long)h, fct_tensor_get(&r->o, b, n, h, 0), got_l, ref[0], ref_l);
          continue;
        }
        if (isinf(ref_l)) { /* the row sees no key: O must be exactly 0, LSE -inf */
          r->empty_rows++;
          if (row_e2 != 0.0 && !first_bad[0])
            snprintf(first_bad, sizeof first_bad,
                     "row (b=%lld, n=%lld, h=%lld) sees no key but O != 0 (o[0]=%g, |o|^2=%g)", (long long)b,
                     (long long)n, (long long)h, fct_tensor_get(&r->o, b, n, h, 0), row_e2);
          if (r->has_lse && !(isinf(got_l) && got_l < 0) && !first_bad[0])
            snprintf(first_bad, sizeof first_bad, "row (b=%lld, n=%lld, h=%lld) sees no key but LSE = %.9g, want -inf",
                     (long long)b, (long long)n, (long long)h, got_l);
          continue;
        }
        e2 += row_e2;
        r2 += row_r2;
        if (row_r2 > 0 && sqrt(row_e2 / row_r2) > r->max_row_err) r->max_row_err = sqrt(row_e2 / row_r2);
        if (row_r2 > 0 && sqrt(row_e2 / row_r2) > row_tol && !first_bad[0])
          snprintf(first_bad, sizeof first_bad,
                   "row (b=%lld, n=%lld, h=%lld): relative L2 error %.3e > %.1e; o[0..1]=(%.7g, %.7g) ref=(%.7g, %.7g)",
                   (long long)b, (long long)n, (long long)h, sqrt(row_e2 / row_r2), row_tol,
                   fct_tensor_get(&r->o, b, n, h, 0), D > 1 ? fct_tensor_get(&r->o, b, n, h, 1) : 0.0, ref[0],
                   D > 1 ? ref[1] : 0.0);
        if (r->has_lse) {
          if (!isfinite(got_l) && !first_bad[0])
            snprintf(first_bad, sizeof first_bad, "row (b=%lld, n=%lld, h=%lld): LSE = %g, ref %.9g", (long long)b,
                     (long long)n, (long long)h, got_l, ref_l);
          if (isfinite(got_l)) {
            le2 += (got_l - ref_l) * (got_l - ref_l);
            lr2 += ref_l * ref_l;
          }
        }
      }

  r->err_o = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
  r->err_lse = lr2 > 0 ? sqrt(le2 / lr2) : sqrt(le2);

  written = fct_tensor_count_unpoisoned(&r->o);
  FCT_CHECK(nan_count == 0 && !first_bad[0], "%s %s: %zu row(s) with NaN; %s (%zu elements of o's buffer changed, the view has %lld)",
            p->desc, rs, nan_count, first_bad, written, (long long)(p->B * p->Nq * Hq * D));
  FCT_CHECK(r->err_o <= tol, "%s %s: O relative L2 error %.3e > tolerance %.1e", p->desc, rs, r->err_o, tol);
  FCT_CHECK(!r->has_lse || r->err_lse <= lse_tol, "%s %s: LSE relative L2 error %.3e > tolerance %.1e", p->desc, rs,
            r->err_lse, lse_tol);

  /* Nothing outside the views may be written: every element is non-NaN (checked
   * above), so the count of non-poison elements must equal the view's size. */
  written = fct_tensor_count_unpoisoned(&r->o);
  FCT_CHECK(written == (size_t)(p->B * p->Nq * Hq * D), "%s %s: %zu elements of o's buffer changed, view has %lld",
            p->desc, rs, written, (long long)(p->B * p->Nq * Hq * D));
  if (r->has_lse) {
    written = fct_tensor_count_unpoisoned(&r->lse);
    FCT_CHECK(written == (size_t)(p->B * p->Nq * Hq), "%s %s: %zu elements of lse's buffer changed, view has %lld",
              p->desc, rs, written, (long long)(p->B * p->Nq * Hq));
  }
  print_message("    ok  %s %s: err_o=%.2e err_lse=%.2e max_row=%.2e empty_rows=%zu (device %.2fs, ref %.2fs)\n",
                p->desc, rs, r->err_o, r->err_lse, r->max_row_err, r->empty_rows, r->seconds, p->ref_seconds);
}

void fct_result_release(fct_result *r) {
  fct_tensor_release(&r->o);
  if (r->has_lse) fct_tensor_release(&r->lse);
  memset(r, 0, sizeof *r);
}

double fct_result_diff_o(const fct_problem *p, const fct_result *a, const fct_result *b) {
  const int64_t Hq = p->c.heads_q, D = p->c.head_dim;
  double e2 = 0, r2 = 0;
  int64_t bb, n, h, x;
  for (bb = 0; bb < p->B; bb++)
    for (n = 0; n < p->Nq; n++)
      for (h = 0; h < Hq; h++)
        for (x = 0; x < D; x++) {
          double u = fct_tensor_get(&a->o, bb, n, h, x), v = fct_tensor_get(&b->o, bb, n, h, x);
          e2 += (u - v) * (u - v);
          r2 += v * v;
        }
  return r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}

double fct_result_diff_lse(const fct_problem *p, const fct_result *a, const fct_result *b) {
  const int64_t Hq = p->c.heads_q;
  double e2 = 0, r2 = 0;
  int64_t bb, n, h;
  if (!a->has_lse || !b->has_lse) return 0.0;
  for (bb = 0; bb < p->B; bb++)
    for (n = 0; n < p->Nq; n++)
      for (h = 0; h < Hq; h++) {
        double u = fct_tensor_get(&a->lse, bb, n, h, 0), v = fct_tensor_get(&b->lse, bb, n, h, 0);
        if (isinf(u) && isinf(v) && u == v) continue;
        e2 += (u - v) * (u - v);
        r2 += v * v;
      }
  return r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}

void fct_check_case(const fct_case *c, const fct_run *run) {
  fct_problem p;
  fct_result r;
  fct_problem_create(&p, c);
  fct_problem_run(&p, run, &r);
  fct_result_release(&r);
  fct_problem_release(&p);
}

void fct_check_flash_vs_naive(const fct_case *c) {
  fct_problem p;
  fct_result rf, rn;
  fct_run flash, naive;
  double d_o, d_l;
  memset(&flash, 0, sizeof flash);
  memset(&naive, 0, sizeof naive);
  flash.algo = FLASHCL_ALGO_FLASH;
  naive.algo = FLASHCL_ALGO_NAIVE;
  fct_problem_create(&p, c);
  fct_problem_run(&p, &flash, &rf);
  fct_problem_run(&p, &naive, &rn);
  d_o = fct_result_diff_o(&p, &rf, &rn);
  d_l = fct_result_diff_lse(&p, &rf, &rn);
  FCT_CHECK(d_o <= fct_tolerance(c->dtype), "%s: flash vs naive O relative L2 difference %.3e > %.1e", p.desc, d_o,
            fct_tolerance(c->dtype));
  FCT_CHECK(d_l <= fct_lse_tolerance(c->dtype), "%s: flash vs naive LSE relative L2 difference %.3e > %.1e", p.desc,
            d_l, fct_lse_tolerance(c->dtype));
  print_message("    ok  %s: flash vs naive: diff_o=%.2e diff_lse=%.2e\n", p.desc, d_o, d_l);
  fct_result_release(&rf);
  fct_result_release(&rn);
  fct_problem_release(&p);
}

/* ----------------------------------------------------- table-driven tests -- */

static void run_table_entry(void **state) {
  const fct_table_entry *t = (const fct_table_entry *)*state;
  FCT_CHECK(t != NULL, "table test without a case");
  if (t->mode == FCT_FLASH_VS_NAIVE)
    fct_check_flash_vs_naive(&t->c);
  else
    fct_check_case(&t->c, &t->run);
}

int fct_run_table(const char *group, const fct_table_entry *table, size_t n_table, const struct CMUnitTest *extra,
                  size_t n_extra) {
  struct CMUnitTest *tests = (struct CMUnitTest *)calloc(n_table + n_extra + 1, sizeof *tests);
  size_t i;
  int failed;
  if (!tests) return 1;
  for (i = 0; i < n_table; i++) {
    tests[i].name = table[i].name;
    tests[i].test_func = run_table_entry;
    tests[i].initial_state = (void *)&table[i];
  }
  for (i = 0; i < n_extra; i++) tests[n_table + i] = extra[i];
  failed = fct_run_group(group, tests, n_table + n_extra, 1);
  free(tests);
  return failed;
}
