/*
 * API surface: status strings, dtypes, tensor helpers, context creation (device
 * selection through FLASHCL_DEVICE, wrapping caller objects), device info, block
 * plans and workspace sizes.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------- statuses -- */

static void test_status_strings(void **state) {
  static const int codes[] = {
#define X(name, value, text) value,
      FLASHCL_STATUS_LIST(X)
#undef X
  };
  static const char *names[] = {
#define X(name, value, text) #name,
      FLASHCL_STATUS_LIST(X)
#undef X
  };
  const size_t n = sizeof codes / sizeof codes[0];
  size_t i, j;
  (void)state;
  FCT_CHECK(n == 17, "FLASHCL_STATUS_LIST has %zu entries, the tests know 17", n);
  for (i = 0; i < n; i++) {
    const char *s = flashcl_status_string(codes[i]);
    FCT_CHECK(s != NULL && s[0] != '\0', "flashcl_status_string(%d) [%s] is NULL or empty", codes[i], names[i]);
    if (codes[i] != 0)
      FCT_CHECK(codes[i] <= -4000 && codes[i] >= -4999, "%s = %d is outside flashcl's range [-4999, -4000]",
                names[i], codes[i]);
    for (j = 0; j < i; j++) {
      FCT_CHECK(codes[i] != codes[j], "%s and %s share the value %d", names[i], names[j], codes[i]);
      FCT_CHECK(strcmp(s, flashcl_status_string(codes[j])) != 0, "%s and %s share the string \"%s\"", names[i],
                names[j], s);
    }
  }
  /* OpenCL codes pass through with their CL_* name. */
  FCT_CHECK(strstr(flashcl_status_string(-5), "CL_OUT_OF_RESOURCES") != NULL, "status_string(-5) = \"%s\"",
            flashcl_status_string(-5));
  FCT_CHECK(strstr(flashcl_status_string(-30), "CL_INVALID_VALUE") != NULL, "status_string(-30) = \"%s\"",
            flashcl_status_string(-30));
  /* Unknown values never give NULL. */
  {
    const int odd[] = {1, 12345, -999, -1000, -2999, -3500, -4000, -4017, -4999, -5000, (int)0x80000000};
    for (i = 0; i < sizeof odd / sizeof odd[0]; i++) {
      const char *s = flashcl_status_string(odd[i]);
      FCT_CHECK(s != NULL && s[0] != '\0', "flashcl_status_string(%d) is NULL or empty", odd[i]);
    }
  }
}

static void test_dtypes(void **state) {
  (void)state;
  FCT_CHECK(flashcl_dtype_size(FLASHCL_F32) == 4, "f32 size %zu", flashcl_dtype_size(FLASHCL_F32));
  FCT_CHECK(flashcl_dtype_size(FLASHCL_F16) == 2, "f16 size %zu", flashcl_dtype_size(FLASHCL_F16));
  FCT_CHECK(flashcl_dtype_size(FLASHCL_BF16) == 2, "bf16 size %zu", flashcl_dtype_size(FLASHCL_BF16));
  FCT_CHECK(flashcl_dtype_size((flashcl_dtype)7) == 0, "unknown dtype size %zu",
            flashcl_dtype_size((flashcl_dtype)7));
  FCT_CHECK(flashcl_dtype_name(FLASHCL_F32) && flashcl_dtype_name(FLASHCL_F16) && flashcl_dtype_name(FLASHCL_BF16) &&
                flashcl_dtype_name((flashcl_dtype)7),
            "flashcl_dtype_name returned NULL");
  FCT_CHECK(strcmp(flashcl_dtype_name(FLASHCL_F32), flashcl_dtype_name(FLASHCL_F16)) != 0 &&
                strcmp(flashcl_dtype_name(FLASHCL_F16), flashcl_dtype_name(FLASHCL_BF16)) != 0 &&
                strcmp(flashcl_dtype_name(FLASHCL_F32), flashcl_dtype_name(FLASHCL_BF16)) != 0,
            "dtype names not distinct: %s %s %s", flashcl_dtype_name(FLASHCL_F32), flashcl_dtype_name(FLASHCL_F16),
            flashcl_dtype_name(FLASHCL_BF16));
}

static void test_version(void **state) {
  (void)state;
  FCT_CHECK(FLASHCL_VERSION_NUMBER ==
                FLASHCL_VERSION_MAJOR * 10000 + FLASHCL_VERSION_MINOR * 100 + FLASHCL_VERSION_PATCH,
            "version number %d", FLASHCL_VERSION_NUMBER);
  {
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d.%d", FLASHCL_VERSION_MAJOR, FLASHCL_VERSION_MINOR, FLASHCL_VERSION_PATCH);
    FCT_CHECK(strcmp(buf, FLASHCL_VERSION_STRING) == 0, "version string %s vs %s", FLASHCL_VERSION_STRING, buf);
  }
  /* The library built from this tree reports the header's version. */
  FCT_CHECK(flashcl_version_number() == FLASHCL_VERSION_NUMBER, "flashcl_version_number() %u, header %d",
            flashcl_version_number(), FLASHCL_VERSION_NUMBER);
  FCT_CHECK(strcmp(flashcl_version_string(), FLASHCL_VERSION_STRING) == 0, "flashcl_version_string() %s, header %s",
            flashcl_version_string(), FLASHCL_VERSION_STRING);
}

/* --------------------------------------------------------------- tensors -- */

static void test_tensor_init(void **state) {
  flashcl_tensor t;
  cl_mem fake = (cl_mem)(uintptr_t)0x1234; /* never dereferenced by the init functions' contract */
  (void)state;
  FCT_CHECK_STATUS(flashcl_tensor_init_bnhd(&t, fake, 64, FLASHCL_F16, 2, 3, 5, 8), FLASHCL_SUCCESS, "init_bnhd");
  FCT_CHECK(t.buffer == fake && t.offset == 64 && t.dtype == FLASHCL_F16, "bnhd: buffer/offset/dtype not kept");
  FCT_CHECK(t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 5 && t.shape[3] == 8, "bnhd shape (%lld,%lld,%lld,%lld)",
            (long long)t.shape[0], (long long)t.shape[1], (long long)t.shape[2], (long long)t.shape[3]);
  FCT_CHECK(t.stride[0] == 120 && t.stride[1] == 40 && t.stride[2] == 8 && t.stride[3] == 1,
            "bnhd strides (%lld,%lld,%lld,%lld), want (120,40,8,1)", (long long)t.stride[0], (long long)t.stride[1],
            (long long)t.stride[2], (long long)t.stride[3]);

  FCT_CHECK_STATUS(flashcl_tensor_init_bhnd(&t, fake, 0, FLASHCL_BF16, 2, 3, 5, 8), FLASHCL_SUCCESS, "init_bhnd");
  FCT_CHECK(t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 5 && t.shape[3] == 8, "bhnd shape (%lld,%lld,%lld,%lld)",
            (long long)t.shape[0], (long long)t.shape[1], (long long)t.shape[2], (long long)t.shape[3]);
  FCT_CHECK(t.stride[0] == 120 && t.stride[1] == 8 && t.stride[2] == 24 && t.stride[3] == 1,
            "bhnd strides (%lld,%lld,%lld,%lld), want (120,8,24,1)", (long long)t.stride[0], (long long)t.stride[1],
            (long long)t.stride[2], (long long)t.stride[3]);

  FCT_CHECK_STATUS(flashcl_tensor_init_lse(&t, fake, 16, 2, 3, 5), FLASHCL_SUCCESS, "init_lse");
  FCT_CHECK(t.dtype == FLASHCL_F32 && t.offset == 16, "lse dtype %d offset %zu", (int)t.dtype, t.offset);
  FCT_CHECK(t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 5 && t.shape[3] == 1, "lse shape (%lld,%lld,%lld,%lld)",
            (long long)t.shape[0], (long long)t.shape[1], (long long)t.shape[2], (long long)t.shape[3]);
  FCT_CHECK(t.stride[0] == 15 && t.stride[1] == 1 && t.stride[2] == 3, "lse strides (%lld,%lld,%lld), want (15,1,3)",
            (long long)t.stride[0], (long long)t.stride[1], (long long)t.stride[2]);

  FCT_CHECK_STATUS(flashcl_tensor_init_bnhd(NULL, fake, 0, FLASHCL_F32, 1, 1, 1, 8), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "init_bnhd(NULL)");
  FCT_CHECK_STATUS(flashcl_tensor_init_bhnd(NULL, fake, 0, FLASHCL_F32, 1, 1, 1, 8), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "init_bhnd(NULL)");
  FCT_CHECK_STATUS(flashcl_tensor_init_lse(NULL, fake, 0, 1, 1, 1), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "init_lse(NULL)");
}

static void test_desc_and_options_init(void **state) {
  flashcl_attention_desc d;
  flashcl_context_options o;
  (void)state;
  memset(&d, 0x5a, sizeof d);
  flashcl_attention_desc_init(&d);
  FCT_CHECK(d.score.scale == 0.0f && d.mask.causal == 0 && d.shape.heads_q == 0 && d.shape.heads_kv == 0 && d.varlen.cu_seqlens_q == NULL &&
                d.varlen.cu_seqlens_k == NULL && d.varlen.num_seqs == 0 && d.varlen.max_seqlen_q == 0 && d.varlen.max_seqlen_k == 0 &&
                d.algorithm.algo == FLASHCL_ALGO_AUTO && d.algorithm.kernel == FLASHCL_KERNEL_AUTO && d.algorithm.block_r == 0 && d.algorithm.block_c == 0 &&
                d.backward.deterministic == 1 && d.dropout.p == 0.0f,
            "flashcl_attention_desc_init left non-default fields (scale %g causal %d algo %d block %d/%d "
            "deterministic %d dropout.p %g)",
            (double)d.score.scale, d.mask.causal, (int)d.algorithm.algo, d.algorithm.block_r, d.algorithm.block_c, d.backward.deterministic, (double)d.dropout.p);
  memset(&o, 0x5a, sizeof o);
  flashcl_context_options_init(&o);
  FCT_CHECK(o.device == NULL && o.profiling == 0 && o.verbose == 0 && o.kernel_dir == NULL,
            "flashcl_context_options_init left non-default fields");
}

/* Every group of the descriptors starts at its documented default
 * (flashcl.h), whatever the memory held before. */
static void test_desc_defaults(void **state) {
  (void)state;
  flashcl_attention_desc d;
  memset(&d, 0x5a, sizeof d);
  flashcl_attention_desc_init(&d);
  FCT_CHECK(d.shape.heads_q == 0 && d.shape.heads_kv == 0 && d.shape.head_dim_v == 0, "shape defaults");
  FCT_CHECK(d.score.scale == 0.0f && d.score.softcap == 0.0f && !d.score.alibi_slopes && !d.score.sinks &&
                d.score.window_left == -1 && d.score.window_right == -1,
            "score defaults: window %d %d", d.score.window_left, d.score.window_right);
  FCT_CHECK(!d.mask.causal && d.mask.kind == FLASHCL_MASK_NONE && !d.mask.bits && !d.mask.per_head, "mask defaults");
  FCT_CHECK(!d.varlen.cu_seqlens_q && !d.varlen.cu_seqlens_k && d.varlen.num_seqs == 0, "varlen defaults");
  FCT_CHECK(!d.paged.cache.block_table && !d.paged.seqlens && d.paged.cache.page_size == 0 &&
                d.paged.cache.k_scale_kind == FLASHCL_KV_SCALE_TOKEN &&
                d.paged.cache.v_scale_kind == FLASHCL_KV_SCALE_TOKEN,
            "paged defaults");
  FCT_CHECK(d.dropout.p == 0.0f && d.dropout.seed == 0 && d.dropout.offset == 0, "dropout defaults");
  FCT_CHECK(d.backward.deterministic && !d.backward.dsinks, "backward defaults");
  FCT_CHECK(d.algorithm.algo == FLASHCL_ALGO_AUTO && d.algorithm.kernel == FLASHCL_KERNEL_AUTO &&
                d.algorithm.block_r == 0 && d.algorithm.block_c == 0 && !d.algorithm.tuning,
            "algorithm defaults");
  flashcl_decode_desc dd;
  memset(&dd, 0x5a, sizeof dd);
  flashcl_decode_desc_init(&dd);
  FCT_CHECK(dd.heads_q == 0 && dd.heads_kv == 0 && !dd.tree_mask && dd.kernel == FLASHCL_KERNEL_AUTO && !dd.tuning,
            "decode top-level defaults");
  FCT_CHECK(!dd.cache.block_table && dd.cache.page_size == 0 && dd.cache.max_pages == 0 && !dd.cache.k_scale &&
                dd.cache.k_scale_kind == FLASHCL_KV_SCALE_TOKEN && dd.cache.v_scale_kind == FLASHCL_KV_SCALE_TOKEN,
            "decode cache defaults");
  FCT_CHECK(dd.score.window_left == -1 && dd.score.window_right == -1 && dd.score.scale == 0.0f, "decode score");
  FCT_CHECK(dd.split.num_splits == 0 && dd.split.max_seqlen_k == 0 && !dd.split.workspace &&
                dd.split.workspace_offset == 0,
            "decode split defaults");
  flashcl_kv_append_desc ad;
  memset(&ad, 0x5a, sizeof ad);
  flashcl_kv_append_desc_init(&ad);
  FCT_CHECK(ad.struct_size == sizeof ad && !ad.cache.block_table && ad.cache.page_size == 0 &&
                ad.cache.k_scale_kind == FLASHCL_KV_SCALE_TOKEN,
            "append defaults");
}

/* Descriptor sizes (src/core/abi.c): *_init() records the caller's sizeof; a
 * struct from a newer header (struct_size larger than the library's) is
 * refused with UNSUPPORTED and writes nothing; one smaller than the first
 * sized layout is INVALID_ARGUMENT; 0 (zeroed by hand) is this header's size. */
static void test_struct_size(void **state) {
  fct_env *env = fct_env_get();
  const size_t n = 64, bytes = n * 64 * 4;
  cl_mem buf = fct_create_buffer(bytes, NULL), obuf = fct_create_buffer(bytes, NULL);
  flashcl_tensor q, o;
  flashcl_attention_desc desc;
  size_t ws = 777;
  (void)state;
  flashcl_tensor_init_bnhd(&q, buf, 0, FLASHCL_F32, 1, (int64_t)n, 1, 64);
  flashcl_tensor_init_bnhd(&o, obuf, 0, FLASHCL_F32, 1, (int64_t)n, 1, 64);
  flashcl_attention_desc_init(&desc);
  FCT_CHECK(desc.struct_size == sizeof desc, "desc.struct_size %zu, sizeof %zu", desc.struct_size, sizeof desc);
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, &q, &q, &q, FLASHCL_PASS_FORWARD, &ws),
                   FLASHCL_SUCCESS, "workspace_size with an initialised desc");

  /* A caller built against a newer header: the library fills what it knows. */
  unsigned char big[sizeof(flashcl_attention_desc) + 64];
  memset(big, 0x5a, sizeof big);
  FCT_CHECK_STATUS(flashcl_attention_desc_init_size((flashcl_attention_desc *)(void *)big, sizeof big),
                   FLASHCL_SUCCESS, "desc_init_size(larger struct)");
  flashcl_attention_desc newer;
  memcpy(&newer, big, sizeof newer);
  FCT_CHECK(newer.struct_size == sizeof big && newer.backward.deterministic == 1 && newer.score.window_left == -1 &&
                big[sizeof big - 1] == 0,
            "desc_init_size(larger): struct_size %zu deterministic %d window_left %d last byte %d",
            newer.struct_size, newer.backward.deterministic, newer.score.window_left, big[sizeof big - 1]);
  ws = 777;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &newer, &q, &q, &q, FLASHCL_PASS_FORWARD, &ws),
                   FLASHCL_ERROR_UNSUPPORTED, "workspace_size with a newer header's desc");
  FCT_CHECK(ws == 777, "a refused call wrote *bytes = %zu", ws);
  FCT_CHECK(strstr(flashcl_context_last_error(env->ctx), "newer flashcl.h") != NULL, "message: %s",
            flashcl_context_last_error(env->ctx));
  FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &newer, &q, &q, &q, &o, NULL, 0, NULL, NULL),
                   FLASHCL_ERROR_UNSUPPORTED, "forward with a newer header's desc");

  flashcl_attention_desc tiny = desc;
  tiny.struct_size = 8;
  FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &tiny, &q, &q, &q, &o, NULL, 0, NULL, NULL),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "forward with struct_size 8");
  FCT_CHECK_STATUS(flashcl_attention_desc_init_size(&desc, 2), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "desc_init_size(size 2)");
  FCT_CHECK_STATUS(flashcl_attention_desc_init_size(NULL, sizeof desc), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "desc_init_size(NULL)");
  flashcl_attention_desc_init(NULL); /* a no-op */

  /* Zeroed by hand, then the defaults that are not 0 set: taken as this header's. */
  flashcl_attention_desc hand;
  memset(&hand, 0, sizeof hand);
  hand.score.window_left = hand.score.window_right = -1;
  hand.backward.deterministic = 1;
  ws = 0;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &hand, &q, &q, &q, FLASHCL_PASS_FORWARD, &ws),
                   FLASHCL_SUCCESS, "workspace_size with struct_size 0");

  /* The same for the decode descriptor and the context options. */
  flashcl_decode_desc dd;
  flashcl_decode_desc_init(&dd);
  FCT_CHECK(dd.struct_size == sizeof dd && dd.score.window_left == -1, "decode desc init: struct_size %zu window %d",
            dd.struct_size, dd.score.window_left);
  flashcl_kv_append_desc ad;
  flashcl_kv_append_desc_init(&ad);
  FCT_CHECK(ad.struct_size == sizeof ad && ad.cache.k_scale_kind == FLASHCL_KV_SCALE_TOKEN,
            "append desc init: struct_size %zu", ad.struct_size);
  ad.struct_size = sizeof ad + 16;
  FCT_CHECK_STATUS(flashcl_kv_cache_append(env->ctx, &ad, &q, &q, &q, &q, buf, 0, NULL, NULL),
                   FLASHCL_ERROR_UNSUPPORTED, "kv_cache_append with a newer header's append desc");
  ad.struct_size = 4;
  FCT_CHECK_STATUS(flashcl_kv_cache_append(env->ctx, &ad, &q, &q, &q, &q, buf, 0, NULL, NULL),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "kv_cache_append with struct_size 4");
  dd.struct_size = sizeof dd + 16;
  int splits = -7;
  ws = 777;
  FCT_CHECK_STATUS(flashcl_attention_decode_workspace_size(env->ctx, &dd, &q, &q, &q, &ws, &splits),
                   FLASHCL_ERROR_UNSUPPORTED, "decode_workspace_size with a newer header's decode desc");
  FCT_CHECK(ws == 777 && splits == -7, "a refused decode_workspace_size wrote %zu / %d", ws, splits);
  flashcl_context_options opt;
  flashcl_context_options_init(&opt);
  FCT_CHECK(opt.struct_size == sizeof opt, "options struct_size %zu", opt.struct_size);
  opt.struct_size = sizeof opt + 16;
  flashcl_context *ctx2 = (flashcl_context *)&opt;
  FCT_CHECK_STATUS(flashcl_context_create(&opt, &ctx2), FLASHCL_ERROR_UNSUPPORTED,
                   "context_create with a newer header's options");
  FCT_CHECK(ctx2 == NULL, "a refused context_create left *out = %p", (void *)ctx2);
  clReleaseMemObject(buf);
  clReleaseMemObject(obuf);
}

/* --------------------------------------------------------------- context -- */

static void test_destroy_null(void **state) {
  (void)state;
  flashcl_context_destroy(NULL); /* must not crash */
  FCT_CHECK_STATUS(flashcl_context_create(NULL, NULL), FLASHCL_ERROR_INVALID_ARGUMENT, "create(NULL, NULL)");
}

static void expect_device_not_found(const char *env_value, const char *option_value) {
  flashcl_context_options opt;
  flashcl_context *ctx = (flashcl_context *)(uintptr_t)0x1; /* must be overwritten with NULL */
  flashcl_status st;
  flashcl_context_options_init(&opt);
  opt.device = option_value;
  if (env_value) setenv("FLASHCL_DEVICE", env_value, 1);
  st = flashcl_context_create(&opt, &ctx);
  FCT_CHECK(st == FLASHCL_ERROR_DEVICE_NOT_FOUND,
            "flashcl_context_create with FLASHCL_DEVICE=\"%s\" options.device=\"%s\": status %d (%s), want "
            "FLASHCL_ERROR_DEVICE_NOT_FOUND",
            env_value ? env_value : "(unchanged)", option_value ? option_value : "(NULL)", (int)st,
            flashcl_status_string(st));
  FCT_CHECK(ctx == NULL, "flashcl_context_create failed but left *out = %p (want NULL)", (void *)ctx);
  /* The failed creation's message stays readable without a context. */
  const char *why = flashcl_context_last_error(NULL);
  const char *spec = option_value ? option_value : env_value;
  FCT_CHECK(spec && strstr(why, spec) != NULL, "last_error(NULL) after the failed create does not name \"%s\": \"%s\"",
            spec ? spec : "", why);
}

/* Puts an environment variable back: value, or unset when value is NULL. */
static void set_or_unset(const char *name, const char *value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

/* FLASHCL_DEVICE is saved before and restored after test_bad_device, even when it
 * fails part-way, so later tests see the caller's setting. */
static char *g_saved_device;
static int g_had_device;

static int save_device_env(void **state) {
  const char *v = getenv("FLASHCL_DEVICE");
  (void)state;
  g_had_device = v != NULL;
  g_saved_device = v ? strdup(v) : NULL;
  return 0;
}

static int restore_device_env(void **state) {
  (void)state;
  set_or_unset("FLASHCL_DEVICE", g_had_device ? g_saved_device : NULL);
  free(g_saved_device);
  g_saved_device = NULL;
  return 0;
}

static void test_bad_device(void **state) {
  (void)state;
  expect_device_not_found("99:99", NULL);
  expect_device_not_found("no-such-device-xyz", NULL);
  expect_device_not_found("0:99", NULL);
  expect_device_not_found(NULL, "99:99");            /* options.device, env still bad */
  expect_device_not_found(NULL, "no-such-device-xyz");
  {
    /* options.device wins over a bad $FLASHCL_DEVICE. */
    flashcl_context_options opt;
    flashcl_context *ctx = NULL;
    flashcl_status st;
    setenv("FLASHCL_DEVICE", "no-such-device-xyz", 1);
    flashcl_context_options_init(&opt);
    opt.device = "0:0";
    st = flashcl_context_create(&opt, &ctx);
    FCT_CHECK(st == FLASHCL_SUCCESS && ctx != NULL,
              "options.device=\"0:0\" with FLASHCL_DEVICE=no-such-device-xyz: status %d (%s), ctx %p", (int)st,
              flashcl_status_string(st), (void *)ctx);
    FCT_CHECK(strcmp(flashcl_context_last_error(ctx), "") == 0, "fresh context has last error \"%s\"",
              flashcl_context_last_error(ctx));
    flashcl_context_destroy(ctx);
  }
}

/* $FLASHCL_KERNEL other than auto, portable or nvidia_mma is refused, not
 * ignored; the valid spellings open a context. */
static void test_bad_kernel_env(void **state) {
  (void)state;
  const char *old = getenv("FLASHCL_KERNEL");
  char saved[64] = "";
  if (old) snprintf(saved, sizeof saved, "%s", old);
  static const char *const good[] = {"auto", "portable", ""};
  flashcl_context *ctx = NULL;
  setenv("FLASHCL_KERNEL", "bogus", 1);
  const flashcl_status bad = flashcl_context_create(NULL, &ctx);
  FCT_CHECK(bad == FLASHCL_ERROR_INVALID_ARGUMENT && ctx == NULL, "FLASHCL_KERNEL=bogus: %s, ctx %p",
            flashcl_status_string(bad), (void *)ctx);
  FCT_CHECK(strstr(flashcl_context_last_error(NULL), "bogus") != NULL, "last_error(NULL) after FLASHCL_KERNEL=bogus: %s",
            flashcl_context_last_error(NULL));
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    setenv("FLASHCL_KERNEL", good[i], 1);
    const flashcl_status st = flashcl_context_create(NULL, &ctx);
    FCT_CHECK(st == FLASHCL_SUCCESS, "FLASHCL_KERNEL=\"%s\": %s", good[i], flashcl_status_string(st));
    FCT_CHECK(flashcl_context_last_error(NULL)[0] == '\0', "a successful create left last_error(NULL) = %s",
              flashcl_context_last_error(NULL));
    flashcl_context_destroy(ctx);
    ctx = NULL;
  }
  if (old) setenv("FLASHCL_KERNEL", saved, 1);
  else unsetenv("FLASHCL_KERNEL");
}

/* A device named by a substring of its platform's vendor (PoCL's platform
 * name does not hold "pocl", its vendor does): the same device opens. */
static void test_device_by_vendor(void **state) {
  (void)state;
  fct_env *env = fct_env_get();
  cl_platform_id plat;
  char vendor[256] = {0}, spec[12] = {0};
  FCT_CHECK(clGetDeviceInfo(env->device, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL) == CL_SUCCESS &&
                clGetPlatformInfo(plat, CL_PLATFORM_VENDOR, sizeof vendor - 1, vendor, NULL) == CL_SUCCESS,
            "platform vendor");
  /* The vendor's last word, e.g. "project" or "Corporation"; with "pocl" too on PoCL. */
  const char *w = strrchr(vendor, ' ');
  snprintf(spec, sizeof spec, "%s", w ? w + 1 : vendor);
  flashcl_context_options opt;
  flashcl_context *ctx = NULL;
  flashcl_context_options_init(&opt);
  opt.device = strstr(vendor, "pocl") ? "pocl" : spec;
  const flashcl_status st = flashcl_context_create(&opt, &ctx);
  FCT_CHECK(st == FLASHCL_SUCCESS, "device \"%s\" (vendor \"%s\"): %s", opt.device, vendor, flashcl_status_string(st));
  cl_platform_id got;
  clGetDeviceInfo(flashcl_context_cl_device(ctx), CL_DEVICE_PLATFORM, sizeof got, &got, NULL);
  flashcl_context_destroy(ctx);
  FCT_CHECK(got == plat, "device \"%s\" opened another platform", opt.device);
}

/* A context made from the caller's own OpenCL objects: accessors return them, the
 * context works, and destroying it leaves the caller's objects alive. */
static void test_create_from_cl(void **state) {
  fct_env *env = fct_env_get();
  cl_int err;
  cl_context clctx;
  cl_command_queue queue;
  flashcl_context *ctx = (flashcl_context *)(uintptr_t)0x1;
  cl_uint refs = 0;
  flashcl_status st;
  (void)state;
  clctx = clCreateContext(NULL, 1, &env->device, NULL, NULL, &err);
  FCT_CHECK(err == CL_SUCCESS, "clCreateContext: %d", (int)err);
  queue = clCreateCommandQueue(clctx, env->device, 0, &err);
  FCT_CHECK(err == CL_SUCCESS, "clCreateCommandQueue: %d", (int)err);

  FCT_CHECK_STATUS(flashcl_context_create_from_cl(NULL, env->device, queue, NULL, &ctx),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "create_from_cl(NULL context)");
  FCT_CHECK(ctx == NULL, "create_from_cl failed but *out = %p", (void *)ctx);

  st = flashcl_context_create_from_cl(clctx, env->device, queue, NULL, &ctx);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "create_from_cl");
  FCT_CHECK(flashcl_context_cl_context(ctx) == clctx && flashcl_context_cl_device(ctx) == env->device &&
                flashcl_context_cl_queue(ctx) == queue,
            "create_from_cl accessors don't return the wrapped objects");
  {
    /* A tiny forward on the wrapped queue: one key, so O must equal V. */
    const int D = 32;
    float q[32], k[32], v[32], o[32];
    cl_mem bq, bk, bv, bo;
    flashcl_tensor tq, tk, tv, to;
    flashcl_attention_desc desc;
    int x;
    for (x = 0; x < D; x++) q[x] = 0.1f * x, k[x] = 0.05f * (D - x), v[x] = 1.0f + x, o[x] = NAN;
    bq = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof q, q, &err);
    bk = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof k, k, &err);
    bv = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof v, v, &err);
    bo = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof o, o, &err);
    FCT_CHECK(err == CL_SUCCESS, "clCreateBuffer: %d", (int)err);
    flashcl_tensor_init_bnhd(&tq, bq, 0, FLASHCL_F32, 1, 1, 1, D);
    flashcl_tensor_init_bnhd(&tk, bk, 0, FLASHCL_F32, 1, 1, 1, D);
    flashcl_tensor_init_bnhd(&tv, bv, 0, FLASHCL_F32, 1, 1, 1, D);
    flashcl_tensor_init_bnhd(&to, bo, 0, FLASHCL_F32, 1, 1, 1, D);
    flashcl_attention_desc_init(&desc);
    st = flashcl_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL, 0, NULL, NULL);
    FCT_CHECK(st == FLASHCL_SUCCESS, "forward on a wrapped context: %d (%s): %s", (int)st, flashcl_status_string(st),
              flashcl_context_last_error(ctx));
    err = clEnqueueReadBuffer(queue, bo, CL_TRUE, 0, sizeof o, o, 0, NULL, NULL);
    FCT_CHECK(err == CL_SUCCESS, "read: %d", (int)err);
    for (x = 0; x < D; x++) FCT_CHECK(fabsf(o[x] - v[x]) <= 1e-6f * fabsf(v[x]), "one key: o[%d]=%g, want v=%g", x, (double)o[x], (double)v[x]);
    clReleaseMemObject(bq), clReleaseMemObject(bk), clReleaseMemObject(bv), clReleaseMemObject(bo);
  }
  flashcl_context_destroy(ctx);

  /* Our references must still be alive and exactly one. The driver may hold
   * short-lived references of its own while finished commands are retired
   * (PoCL does, asynchronously), so drain the queue and give it a moment. */
  clFinish(queue);
  for (int tries = 0; tries < 100; tries++) {
    err = clGetCommandQueueInfo(queue, CL_QUEUE_REFERENCE_COUNT, sizeof refs, &refs, NULL);
    if (err != CL_SUCCESS || refs == 1) break;
    struct timespec nap = {0, 10 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
  FCT_CHECK(err == CL_SUCCESS && refs == 1, "after destroy the caller's queue has refcount %u (err %d), want 1",
            (unsigned)refs, (int)err);
  err = clGetContextInfo(clctx, CL_CONTEXT_REFERENCE_COUNT, sizeof refs, &refs, NULL);
  /* The queue holds an implicit context reference on some platforms; require >= 1. */
  FCT_CHECK(err == CL_SUCCESS && refs >= 1, "after destroy the caller's context has refcount %u (err %d)",
            (unsigned)refs, (int)err);
  clReleaseCommandQueue(queue);
  clReleaseContext(clctx);
}

static void test_device_info(void **state) {
  fct_env *env = fct_env_get();
  flashcl_device_info info;
  (void)state;
  memset(&info, 0, sizeof info);
  FCT_CHECK_STATUS(flashcl_context_device_info(env->ctx, &info), FLASHCL_SUCCESS, "device_info");
  FCT_CHECK(info.device_name[0] != '\0' && info.platform_name[0] != '\0' && info.device_version[0] != '\0',
            "device info has empty names: platform \"%s\" device \"%s\" version \"%s\"", info.platform_name,
            info.device_name, info.device_version);
  FCT_CHECK(memchr(info.device_name, 0, sizeof info.device_name) != NULL, "device_name not NUL-terminated");
  FCT_CHECK(info.local_mem_size > 0 && info.max_work_group_size > 0 && info.compute_units > 0 &&
                info.global_mem_size > 0 && info.max_mem_alloc_size > 0,
            "device info has zero sizes: local %zu wg %zu cu %u global %llu alloc %llu", info.local_mem_size,
            info.max_work_group_size, (unsigned)info.compute_units, (unsigned long long)info.global_mem_size,
            (unsigned long long)info.max_mem_alloc_size);
  FCT_CHECK_STATUS(flashcl_context_device_info(NULL, &info), FLASHCL_ERROR_INVALID_ARGUMENT, "device_info(NULL ctx)");
  FCT_CHECK_STATUS(flashcl_context_device_info(env->ctx, NULL), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "device_info(NULL info)");
}


/* --------------------------------------------------- context options -- */

/* Runs a one-key forward (O must equal V) on ctx and returns its status; on
 * failure checks that o was not written. */
static flashcl_status one_key_forward(flashcl_context *ctx, const char *what) {
  enum { D = 32 };
  float q[D], k[D], v[D], o[D];
  cl_context clctx = flashcl_context_cl_context(ctx);
  cl_command_queue queue = flashcl_context_cl_queue(ctx);
  cl_mem bq, bk, bv, bo;
  cl_int err;
  flashcl_tensor tq, tk, tv, to;
  flashcl_attention_desc desc;
  flashcl_status st;
  int x;
  for (x = 0; x < D; x++) q[x] = 0.1f * x, k[x] = 0.05f * (D - x), v[x] = 1.0f + x, o[x] = NAN;
  bq = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof q, q, &err);
  bk = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof k, k, &err);
  bv = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof v, v, &err);
  bo = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof o, o, &err);
  FCT_CHECK(err == CL_SUCCESS, "%s: clCreateBuffer: %d", what, (int)err);
  flashcl_tensor_init_bnhd(&tq, bq, 0, FLASHCL_F32, 1, 1, 1, D);
  flashcl_tensor_init_bnhd(&tk, bk, 0, FLASHCL_F32, 1, 1, 1, D);
  flashcl_tensor_init_bnhd(&tv, bv, 0, FLASHCL_F32, 1, 1, 1, D);
  flashcl_tensor_init_bnhd(&to, bo, 0, FLASHCL_F32, 1, 1, 1, D);
  flashcl_attention_desc_init(&desc);
  st = flashcl_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL, 0, NULL, NULL);
  err = clEnqueueReadBuffer(queue, bo, CL_TRUE, 0, sizeof o, o, 0, NULL, NULL);
  FCT_CHECK(err == CL_SUCCESS, "%s: read: %d", what, (int)err);
  for (x = 0; x < D; x++) {
    if (st == FLASHCL_SUCCESS)
      FCT_CHECK(fabsf(o[x] - v[x]) <= 1e-6f * fabsf(v[x]), "%s: one key: o[%d]=%g, want v=%g", what, x,
                (double)o[x], (double)v[x]);
    else
      FCT_CHECK(isnan(o[x]), "%s: the forward failed (%s) but wrote o[%d] = %g", what, flashcl_status_string(st), x,
                (double)o[x]);
  }
  clReleaseMemObject(bq), clReleaseMemObject(bk), clReleaseMemObject(bv), clReleaseMemObject(bo);
  return st;
}

static void test_profiling_option(void **state) {
  flashcl_context_options opt;
  flashcl_context *ctx = NULL;
  cl_command_queue_properties props = 0;
  cl_int err;
  (void)state;
  flashcl_context_options_init(&opt);
  opt.profiling = 1;
  FCT_CHECK_STATUS(flashcl_context_create(&opt, &ctx), FLASHCL_SUCCESS, "create with profiling = 1");
  err = clGetCommandQueueInfo(flashcl_context_cl_queue(ctx), CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
  FCT_CHECK(err == CL_SUCCESS && (props & CL_QUEUE_PROFILING_ENABLE),
            "profiling = 1 but the queue properties are 0x%llx (err %d)", (unsigned long long)props, (int)err);
  flashcl_context_destroy(ctx);
}

/* options.kernel_dir: a missing directory gives FLASHCL_ERROR_KERNEL_SOURCE (at
 * create or at the first forward, which then writes nothing); the source tree's
 * cl/ directory works. */
static void test_kernel_dir_option(void **state) {
  flashcl_context_options opt;
  flashcl_context *ctx = NULL;
  flashcl_status st;
  (void)state;
  flashcl_context_options_init(&opt);
  opt.kernel_dir = "/nonexistent/flashcl-kernels-xyz";
  st = flashcl_context_create(&opt, &ctx);
  if (st == FLASHCL_SUCCESS) {
    st = one_key_forward(ctx, "kernel_dir = /nonexistent");
    FCT_CHECK(st == FLASHCL_ERROR_KERNEL_SOURCE, "forward with kernel_dir = /nonexistent: %d (%s), want %s; last: %s",
              (int)st, flashcl_status_string(st), flashcl_status_string(FLASHCL_ERROR_KERNEL_SOURCE),
              flashcl_context_last_error(ctx));
    FCT_CHECK(flashcl_context_last_error(ctx)[0] != '\0', "no last error for a missing kernel source");
    flashcl_context_destroy(ctx);
  } else {
    FCT_CHECK(st == FLASHCL_ERROR_KERNEL_SOURCE && ctx == NULL,
              "create with kernel_dir = /nonexistent: %d (%s), ctx %p; want KERNEL_SOURCE at create or at the forward",
              (int)st, flashcl_status_string(st), (void *)ctx);
  }
#ifdef FLASHCL_TEST_KERNEL_DIR
  opt.kernel_dir = FLASHCL_TEST_KERNEL_DIR;
  ctx = NULL;
  FCT_CHECK_STATUS(flashcl_context_create(&opt, &ctx), FLASHCL_SUCCESS, "create with kernel_dir = %s", opt.kernel_dir);
  st = one_key_forward(ctx, "kernel_dir = source tree");
  FCT_CHECK(st == FLASHCL_SUCCESS, "forward with kernel_dir = %s: %d (%s): %s", opt.kernel_dir, (int)st,
            flashcl_status_string(st), flashcl_context_last_error(ctx));
  flashcl_context_destroy(ctx);
#endif
}

/* ------------------------------------------------------------ block plan -- */

/* What a plan's local_bytes may reach: the budget, and past a probed budget
 * (above M) the forward's second K/V tile, up to an H100 block's 227 KiB
 * (flashcl.h). */
static size_t plan_local_limit(size_t usable, size_t m) { return usable > m ? (size_t)227 * 1024 : usable; }

static void test_block_plan(void **state) {
  fct_env *env = fct_env_get();
  const int dims[] = {8, 32, 64, 96, 128, 256};
  const flashcl_dtype dts[] = {FLASHCL_F32, FLASHCL_F16, FLASHCL_BF16};
  size_t i, j, usable = 0;
  flashcl_block_plan plan;
  (void)state;
  FCT_CHECK_STATUS(flashcl_context_local_memory(env->ctx, &usable), FLASHCL_SUCCESS, "local_memory");
  const size_t limit = plan_local_limit(usable, env->info.local_mem_size);
  for (i = 0; i < sizeof dims / sizeof dims[0]; i++)
    for (j = 0; j < 3; j++) {
      memset(&plan, 0, sizeof plan);
      FCT_CHECK_STATUS(flashcl_attention_block_plan(env->ctx, dims[i], dts[j], 0, 0, &plan), FLASHCL_SUCCESS,
                       "block_plan(d=%d, %s, auto)", dims[i], fct_dtype_str(dts[j]));
      FCT_CHECK(plan.block_r > 0 && plan.block_r % 8 == 0 && plan.block_c > 0 && plan.block_c % 8 == 0 &&
                    plan.threads > 0 && (size_t)plan.threads <= env->info.max_work_group_size &&
                    plan.local_bytes > 0 && plan.local_bytes <= limit,
                "block_plan(d=%d, %s): Br=%d Bc=%d threads=%d local=%zu (device: wg %zu, usable local %zu, limit %zu)",
                dims[i], fct_dtype_str(dts[j]), plan.block_r, plan.block_c, plan.threads, plan.local_bytes,
                env->info.max_work_group_size, usable, limit);
    }
  FCT_CHECK_STATUS(flashcl_attention_block_plan(env->ctx, 64, FLASHCL_F32, 16, 32, &plan), FLASHCL_SUCCESS,
                   "block_plan(64, f32, 16, 32)");
  FCT_CHECK(plan.block_r == 16 && plan.block_c == 32, "explicit 16/32 gave Br=%d Bc=%d", plan.block_r, plan.block_c);
  FCT_CHECK_STATUS(flashcl_attention_block_plan(env->ctx, 64, FLASHCL_F16, 8, 8, &plan), FLASHCL_SUCCESS,
                   "block_plan(64, f16, 8, 8)");
  FCT_CHECK(plan.block_r == 8 && plan.block_c == 8, "explicit 8/8 gave Br=%d Bc=%d", plan.block_r, plan.block_c);
  /* Error calls: the exact status, and *plan (a 0xA5 sentinel) left unchanged. */
  {
    flashcl_block_plan sentinel;
    memset(&sentinel, 0xA5, sizeof sentinel);
#define EXPECT_PLAN_ERROR(call, status, what)                                                        \
  do {                                                                                               \
    memcpy(&plan, &sentinel, sizeof plan);                                                           \
    FCT_CHECK_STATUS((call), (status), "%s", what);                                                  \
    FCT_CHECK(memcmp(&plan, &sentinel, sizeof plan) == 0, "%s failed but wrote *plan (Br=%d Bc=%d)", \
              what, plan.block_r, plan.block_c);                                                     \
  } while (0)
    EXPECT_PLAN_ERROR(flashcl_attention_block_plan(env->ctx, 12, FLASHCL_F32, 0, 0, &plan),
                      FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM, "block_plan(d=12)");
    EXPECT_PLAN_ERROR(flashcl_attention_block_plan(env->ctx, 584, FLASHCL_F32, 0, 0, &plan),
                      FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM, "block_plan(d=584)");
    EXPECT_PLAN_ERROR(flashcl_attention_block_plan(env->ctx, 64, FLASHCL_F32, 12, 0, &plan),
                      FLASHCL_ERROR_INVALID_ARGUMENT, "block_plan(block_r=12)");
    /* A tile far past any device's memory for it (on CPU devices: 8 MiB of
     * private arrays per work-item, which once crashed PoCL's work-item stack). */
    EXPECT_PLAN_ERROR(flashcl_attention_block_plan(env->ctx, 256, FLASHCL_F32, 4096, 0, &plan),
                      FLASHCL_ERROR_UNSUPPORTED, "block_plan(block_r=4096, d=256)");
    EXPECT_PLAN_ERROR(flashcl_attention_block_plan(env->ctx, 64, FLASHCL_F32, 0, 0, NULL),
                      FLASHCL_ERROR_INVALID_ARGUMENT, "block_plan(plan=NULL)");
    EXPECT_PLAN_ERROR(flashcl_attention_block_plan(NULL, 64, FLASHCL_F32, 0, 0, &plan), FLASHCL_ERROR_INVALID_ARGUMENT,
                      "block_plan(ctx=NULL)");
#undef EXPECT_PLAN_ERROR
  }
}

/* ---------------------------------------------------------- local memory -- */

/* A new context whose tuning file holds `text` (written to a temporary file that
 * is gone again when this returns), without the user's tuning files. */
static flashcl_status ctx_with_tuning(const char *text, flashcl_context **out) {
  char path[] = "/tmp/flashcl-test-XXXXXX";
  const int fd = mkstemp(path);
  FCT_CHECK(fd >= 0, "mkstemp failed");
  FILE *f = fdopen(fd, "w");
  FCT_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "writing %s failed", path);
  flashcl_context_options opt;
  flashcl_context_options_init(&opt);
  opt.tuning_file = path;
  opt.no_user_tuning = 1;
  const flashcl_status st = flashcl_context_create(&opt, out);
  remove(path);
  return st;
}

/* The usable local memory: at least the reported M, more only where the probe
 * ran (NVIDIA), and exactly M with the context tuning's local_probe=0. Explicit tiles between
 * the two must then be accepted (and the automatic ones stay within it, see
 * test_block_plan). */
static void test_local_memory(void **state) {
  fct_env *env = fct_env_get();
  size_t usable = 0, plain = 0;
  flashcl_block_plan plan;
  flashcl_context *ctx = NULL;
  flashcl_status st;
  (void)state;
  FCT_CHECK_STATUS(flashcl_context_local_memory(NULL, &usable), FLASHCL_ERROR_INVALID_ARGUMENT, "local_memory(NULL ctx)");
  FCT_CHECK_STATUS(flashcl_context_local_memory(env->ctx, NULL), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "local_memory(NULL bytes)");
  FCT_CHECK_STATUS(flashcl_context_local_memory(env->ctx, &usable), FLASHCL_SUCCESS, "local_memory");
  const size_t limit = plan_local_limit(usable, env->info.local_mem_size);
  FCT_CHECK(usable >= env->info.local_mem_size, "usable local memory %zu < reported %zu", usable,
            env->info.local_mem_size);
  /* An override file's context.local_mem (a testing aid) may lower M below the
   * device's figure. */
  const int lowered = getenv("FLASHCL_TUNING") != NULL;
  if (!lowered && (!strstr(env->info.platform_name, "NVIDIA") || !env->info.is_gpu))
    FCT_CHECK(usable == env->info.local_mem_size, "usable local memory %zu != reported %zu off NVIDIA GPUs", usable,
              env->info.local_mem_size);
  /* 128 x 64 fp32 tiles at d = 128 need about 130 KiB on a GPU. */
  memset(&plan, 0, sizeof plan);
  st = flashcl_attention_block_plan(env->ctx, 128, FLASHCL_F32, 128, 64, &plan);
  if (usable > env->info.local_mem_size) {
    FCT_CHECK(st == FLASHCL_SUCCESS, "explicit 128 x 64 at d = 128 refused with %zu usable bytes: %s", usable,
              flashcl_context_last_error(env->ctx));
    FCT_CHECK(plan.local_bytes > env->info.local_mem_size && plan.local_bytes <= limit,
              "explicit 128 x 64 at d = 128: %zu local bytes (reported %zu, usable %zu, limit %zu)", plan.local_bytes,
              env->info.local_mem_size, usable, limit);
  } else if (st == FLASHCL_SUCCESS) {
    FCT_CHECK(plan.local_bytes <= limit, "explicit 128 x 64 at d = 128: %zu local bytes, limit %zu", plan.local_bytes,
              limit);
  } else {
    FCT_CHECK(st == FLASHCL_ERROR_UNSUPPORTED, "explicit 128 x 64 at d = 128: %d (%s)", (int)st,
              flashcl_status_string(st));
  }
  {
    st = ctx_with_tuning("context : local_probe=0\n", &ctx);
    if (st == FLASHCL_SUCCESS) st = flashcl_context_local_memory(ctx, &plain);
    FCT_CHECK(st == FLASHCL_SUCCESS, "context with local_probe=0: %s", flashcl_status_string(st));
    FCT_CHECK(lowered || plain == env->info.local_mem_size, "local_probe=0 gave %zu usable bytes, reported %zu",
              plain, env->info.local_mem_size);
    flashcl_context_destroy(ctx);
  }
}

/* The context tuning's local_mem lowers M below what the device reports while the budget
 * stays at the device's own figure, so the rules for a budget above M run on any
 * device (PoCL included; on NVIDIA the probe gives the same picture). With
 * M = 48 KiB and the GPU work-item mapping, d = 128 gets the budget's 128 x 64
 * (M alone: 48 x 32) and d = 256 64 x 32 (M: 16 x 16), while d = 64 and 96,
 * where M already gives Br >= d / 2, keep M's 64 x 48 and 64 x 32. */
static void test_local_memory_override(void **state) {
  static const int dims[] = {128, 64, 96, 256};
  flashcl_context *ctx = NULL;
  flashcl_device_info info;
  flashcl_block_plan plans[4];
  flashcl_status st, pst[4];
  size_t usable = 0;
  int i;
  (void)state;
  memset(&info, 0, sizeof info);
  memset(plans, 0, sizeof plans);
  st = ctx_with_tuning("context : local_mem=49152\nfwd : map=0\n", &ctx);
  if (st == FLASHCL_SUCCESS) {
    flashcl_context_device_info(ctx, &info);
    st = flashcl_context_local_memory(ctx, &usable);
    for (i = 0; i < 4; i++)
      pst[i] = flashcl_attention_block_plan(ctx, dims[i], i ? FLASHCL_F16 : FLASHCL_F32, 0, 0, &plans[i]);
  }
  FCT_CHECK(st == FLASHCL_SUCCESS, "context with local_mem=49152: %s", flashcl_status_string(st));
  flashcl_context_destroy(ctx);
  FCT_CHECK(info.local_mem_size <= 49152, "local_mem=49152 left M at %zu", info.local_mem_size);
  if (usable <= info.local_mem_size || info.max_work_group_size < 256) {
    print_message("    no local memory beyond M = %zu (usable %zu) or fewer than 256 work-items\n",
                  info.local_mem_size, usable);
    FCT_SKIP();
  }
  for (i = 0; i < 4; i++)
    FCT_CHECK(pst[i] == FLASHCL_SUCCESS, "plan(d=%d): %s", dims[i], flashcl_status_string(pst[i]));
  FCT_CHECK(plans[0].block_r == 128 && plans[0].block_c == 64 && plans[0].local_bytes > info.local_mem_size &&
                plans[0].local_bytes <= plan_local_limit(usable, info.local_mem_size),
            "d = 128 with M = %zu, budget %zu: Br=%d Bc=%d, %zu bytes; want 128 x 64 past M", info.local_mem_size,
            usable, plans[0].block_r, plans[0].block_c, plans[0].local_bytes);
  FCT_CHECK(plans[1].block_r == 64 && plans[1].block_c == 48, "d = 64: Br=%d Bc=%d, want M's 64 x 48",
            plans[1].block_r, plans[1].block_c);
  FCT_CHECK(plans[2].block_r == 64 && plans[2].block_c == 32, "d = 96: Br=%d Bc=%d, want M's 64 x 32",
            plans[2].block_r, plans[2].block_c);
  /* d = 256: no 128-row tile fits or maps, so Br steps down to 64 (M: 16 x 16). */
  FCT_CHECK(plans[3].block_r == 64 && plans[3].block_c == 32 && plans[3].local_bytes > info.local_mem_size,
            "d = 256: Br=%d Bc=%d, %zu bytes; want 64 x 32 past M", plans[3].block_r, plans[3].block_c,
            plans[3].local_bytes);
}

/* -------------------------------------------------------- workspace size -- */

static size_t workspace(flashcl_algo algo, int64_t n, flashcl_dtype dtype) {
  fct_env *env = fct_env_get();
  const int64_t H = 1, D = 64;
  const size_t bytes = (size_t)(n * H * D) * fct_dtype_size(dtype);
  cl_mem buf = fct_create_buffer(bytes, NULL);
  flashcl_tensor q;
  flashcl_attention_desc desc;
  size_t ws = (size_t)-1;
  flashcl_status st;
  flashcl_tensor_init_bnhd(&q, buf, 0, dtype, 1, n, H, D);
  flashcl_attention_desc_init(&desc);
  desc.algorithm.algo = algo;
  st = flashcl_attention_workspace_size(env->ctx, &desc, &q, &q, &q, FLASHCL_PASS_FORWARD, &ws);
  clReleaseMemObject(buf);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "workspace_size(algo=%s, N=%lld, d=64, %s)", fct_algo_str(algo),
                   (long long)n, fct_dtype_str(dtype));
  FCT_CHECK(ws != (size_t)-1, "workspace_size succeeded without writing *bytes");
  return ws;
}

static void test_workspace_size(void **state) {
  size_t n512 = workspace(FLASHCL_ALGO_NAIVE, 512, FLASHCL_F32);
  size_t n1k = workspace(FLASHCL_ALGO_NAIVE, 1024, FLASHCL_F32);
  size_t n2k = workspace(FLASHCL_ALGO_NAIVE, 2048, FLASHCL_F32);
  size_t n8k = workspace(FLASHCL_ALGO_NAIVE, 8192, FLASHCL_F32);
  size_t f1k = workspace(FLASHCL_ALGO_FLASH, 1024, FLASHCL_F32);
  size_t f8k = workspace(FLASHCL_ALGO_FLASH, 8192, FLASHCL_F32);
  size_t f16k = workspace(FLASHCL_ALGO_FLASH, 16384, FLASHCL_F32);
  size_t a8k = workspace(FLASHCL_ALGO_AUTO, 8192, FLASHCL_F32);
  (void)state;
  print_message("    workspace naive N=512..8192: %zu %zu %zu %zu; flash N=1k,8k,16k: %zu %zu %zu; auto 8k: %zu\n", n512,
                n1k, n2k, n8k, f1k, f8k, f16k, a8k);
  /* Naive holds the N x N score matrix: at least N^2 fp32 values, growing ~4x per doubling. */
  FCT_CHECK(n1k >= (size_t)1024 * 1024 * 4, "naive workspace at N=1024 is %zu bytes, less than the N^2 fp32 scores",
            n1k);
  FCT_CHECK(n1k >= 3 * n512 && n2k >= 3 * n1k && n1k <= 5 * n512 && n2k <= 5 * n1k,
            "naive workspace does not grow as N^2: N=512 %zu, 1024 %zu, 2048 %zu", n512, n1k, n2k);
  /* Flash is O(N): at N=8192 at most 1/20 of naive, and no more than ~2x per doubling. */
  FCT_CHECK(f8k <= n8k / 20, "flash workspace at N=8192 (%zu) > naive/20 (%zu)", f8k, n8k / 20);
  FCT_CHECK(f16k <= 2 * f8k + 65536 && f8k <= 8 * f1k + 65536, "flash workspace not O(N): N=1k %zu, 8k %zu, 16k %zu",
            f1k, f8k, f16k);
  FCT_CHECK(a8k == f8k, "AUTO should resolve to flash here: auto %zu, flash %zu", a8k, f8k);
  /* 16-bit inputs don't need more than fp32. */
  {
    size_t h8k = workspace(FLASHCL_ALGO_NAIVE, 8192, FLASHCL_F16);
    FCT_CHECK(h8k <= n8k, "naive f16 workspace %zu > f32 %zu", h8k, n8k);
  }
}

static void test_workspace_size_errors(void **state) {
  fct_env *env = fct_env_get();
  cl_mem buf = fct_create_buffer(64 * 64 * 4, NULL);
  flashcl_tensor q, bad;
  flashcl_attention_desc desc;
  size_t ws = 777;
  (void)state;
  flashcl_tensor_init_bnhd(&q, buf, 0, FLASHCL_F32, 1, 64, 1, 64);
  flashcl_attention_desc_init(&desc);
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(NULL, &desc, &q, &q, &q, FLASHCL_PASS_FORWARD, &ws),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "workspace_size(ctx=NULL)");
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, &q, &q, &q, FLASHCL_PASS_FORWARD, NULL),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "workspace_size(bytes=NULL)");
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, NULL, &q, &q, FLASHCL_PASS_FORWARD, &ws),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "workspace_size(q=NULL)");
  bad = q;
  bad.shape[3] = 12;
  bad.stride[2] = 12, bad.stride[1] = 12, bad.stride[0] = 64 * 12;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, &bad, &bad, &bad, FLASHCL_PASS_FORWARD, &ws),
                   FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM, "workspace_size(d=12)");
  bad = q;
  bad.shape[1] = 65;
  FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, &bad, &bad, &bad, FLASHCL_PASS_FORWARD, &ws),
                   FLASHCL_ERROR_BUFFER_TOO_SMALL, "workspace_size(N=65 in a buffer for 64)");
  FCT_CHECK(ws == 777, "failed workspace_size calls wrote *bytes = %zu", ws);
  FCT_CHECK(flashcl_context_last_error(env->ctx)[0] != '\0', "no last error after a failed workspace_size");
  clReleaseMemObject(buf);
}

/* Which kernel family a call would run: errors leave *family alone; NAIVE is
 * AUTO; PORTABLE is PORTABLE; NVIDIA_MMA is honored where the device has it
 * (else UNSUPPORTED), and problems it does not cover (rows that are not 16-byte
 * aligned) resolve to PORTABLE. */
static void test_kernel_family(void **state) {
  fct_env *env = fct_env_get();
  cl_mem buf = fct_create_buffer(64 * 2 * 64 * 2 + 64, NULL), obuf = fct_create_buffer(64 * 2 * 64 * 2, NULL);
  flashcl_tensor q, o, bad, shifted;
  flashcl_attention_desc desc;
  flashcl_kernel_family fam = (flashcl_kernel_family)99;
  (void)state;
  flashcl_tensor_init_bnhd(&q, buf, 0, FLASHCL_F16, 1, 64, 2, 64);
  flashcl_tensor_init_bnhd(&o, obuf, 0, FLASHCL_F16, 1, 64, 2, 64); /* the query checks o like the forward */
  flashcl_attention_desc_init(&desc);
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(NULL, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "kernel_family(ctx=NULL)");
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, NULL),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "kernel_family(family=NULL)");
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, NULL, FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "kernel_family(o=NULL)");
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, &q, (flashcl_pass)7, &fam),
                   FLASHCL_ERROR_INVALID_ARGUMENT, "kernel_family(pass=7)");
  bad = q;
  bad.shape[1] = 65;
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &bad, &bad, &bad, &bad, FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_ERROR_BUFFER_TOO_SMALL, "kernel_family(N=65 in a buffer for 64)");
  FCT_CHECK(fam == (flashcl_kernel_family)99, "failed kernel_family calls wrote *family = %d", (int)fam);

  desc.algorithm.algo = FLASHCL_ALGO_NAIVE;
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_SUCCESS, "kernel_family(naive)");
  FCT_CHECK(fam == FLASHCL_KERNEL_AUTO, "naive: family %d, expected AUTO", (int)fam);
  desc.algorithm.algo = FLASHCL_ALGO_AUTO;
  desc.algorithm.kernel = FLASHCL_KERNEL_PORTABLE;
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_BACKWARD, &fam),
                   FLASHCL_SUCCESS, "kernel_family(portable)");
  FCT_CHECK(fam == FLASHCL_KERNEL_PORTABLE, "portable: family %d", (int)fam);

  desc.algorithm.kernel = FLASHCL_KERNEL_NVIDIA_MMA;
  fam = (flashcl_kernel_family)99;
  const flashcl_status st = flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, &fam);
  if (st == FLASHCL_ERROR_UNSUPPORTED) {
    FCT_CHECK(fam == (flashcl_kernel_family)99, "UNSUPPORTED wrote *family = %d", (int)fam);
    FCT_CHECK(strstr(flashcl_context_last_error(env->ctx), "tensor-core") != NULL, "no reason given: \"%s\"",
              flashcl_context_last_error(env->ctx));
    /* Refusing is right except on an NVIDIA device of compute capability >= 8.0. */
    fct_mma_unavailable(env->device, "kernel_family(nvidia_mma)", flashcl_context_last_error(env->ctx));
  } else {
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "kernel_family(nvidia_mma)");
    FCT_CHECK(fam == FLASHCL_KERNEL_NVIDIA_MMA, "nvidia_mma on a device that has it: family %d", (int)fam);
    flashcl_tensor_init_bnhd(&shifted, buf, 8, FLASHCL_F16, 1, 64, 2, 64); /* 4-element offset */
    FCT_CHECK_STATUS(
        flashcl_attention_kernel_family(env->ctx, &desc, &shifted, &q, &q, &o, FLASHCL_PASS_FORWARD, &fam),
        FLASHCL_SUCCESS, "kernel_family(nvidia_mma, unaligned q)");
    FCT_CHECK(fam == FLASHCL_KERNEL_PORTABLE, "unaligned rows are not covered by the tensor-core kernels: family %d",
              (int)fam);
  }
  desc.algorithm.kernel = FLASHCL_KERNEL_AUTO;
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_SUCCESS, "kernel_family(auto)");
  if (!getenv("FLASHCL_KERNEL")) /* which overrides AUTO */
    FCT_CHECK(fam == (st == FLASHCL_SUCCESS ? FLASHCL_KERNEL_NVIDIA_MMA : FLASHCL_KERNEL_PORTABLE),
              "auto: family %d", (int)fam);
  clReleaseMemObject(buf);
  clReleaseMemObject(obuf);
}

/* The query functions run the call's validation (found by test_fuzz): an o
 * whose rows overlap is refused by kernel_family and config for pass FORWARD,
 * as by the forward (for pass BACKWARD o is an input, as in the backward), and
 * a desc.tuning of a family the call cannot run is refused by workspace_size
 * and by the naive path too, as by the flash calls. */
static void test_query_validation(void **state) {
  fct_env *env = fct_env_get();
  cl_mem buf = fct_create_buffer(8 * 32 * 4, NULL), obuf = fct_create_buffer(8 * 32 * 4, NULL);
  flashcl_tensor q, o;
  flashcl_attention_desc desc;
  flashcl_tuning dec;
  flashcl_config cfg;
  flashcl_kernel_family fam;
  size_t ws = 777;
  (void)state;
  flashcl_tensor_init_bnhd(&q, buf, 0, FLASHCL_F32, 1, 8, 1, 32);
  flashcl_tensor_init_bnhd(&o, obuf, 0, FLASHCL_F32, 1, 8, 1, 32);
  o.stride[1] = 16; /* rows n and n + 1 share 16 elements */
  flashcl_attention_desc_init(&desc);
  FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &desc, &q, &q, &q, &o, NULL, 0, NULL, NULL),
                   FLASHCL_ERROR_INVALID_STRIDE, "forward(o with overlapping rows)");
  FCT_CHECK_STATUS(flashcl_attention_config(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, &cfg),
                   FLASHCL_ERROR_INVALID_STRIDE, "config(o with overlapping rows)");
  FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, &fam),
                   FLASHCL_ERROR_INVALID_STRIDE, "kernel_family(o with overlapping rows)");
  FCT_CHECK_STATUS(flashcl_attention_config(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_BACKWARD, &cfg),
                   FLASHCL_SUCCESS, "config(pass BACKWARD, o with overlapping rows: an input there)");
  flashcl_tensor_init_bnhd(&o, obuf, 0, FLASHCL_F32, 1, 8, 1, 32);
  flashcl_tuning_init(&dec, FLASHCL_TUNE_DECODE);
  desc.algorithm.tuning = &dec;
  for (int algo = FLASHCL_ALGO_AUTO; algo <= FLASHCL_ALGO_FLASH; algo++) {
    desc.algorithm.algo = (flashcl_algo)algo;
    for (int pass = FLASHCL_PASS_FORWARD; pass <= FLASHCL_PASS_BACKWARD; pass++) {
      FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, &q, &q, &q, (flashcl_pass)pass, &ws),
                       FLASHCL_ERROR_UNSUPPORTED, "workspace_size(decode tuning, algo %d, pass %d)", algo, pass);
      FCT_CHECK_STATUS(flashcl_attention_config(env->ctx, &desc, &q, &q, &q, &o, (flashcl_pass)pass, &cfg),
                       FLASHCL_ERROR_UNSUPPORTED, "config(decode tuning, algo %d, pass %d)", algo, pass);
      FCT_CHECK_STATUS(flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, &o, (flashcl_pass)pass, &fam),
                       FLASHCL_ERROR_UNSUPPORTED, "kernel_family(decode tuning, algo %d, pass %d)", algo, pass);
    }
    FCT_CHECK_STATUS(flashcl_attention_forward(env->ctx, &desc, &q, &q, &q, &o, NULL, 0, NULL, NULL),
                     FLASHCL_ERROR_UNSUPPORTED, "forward(decode tuning, algo %d)", algo);
    FCT_CHECK(strstr(flashcl_context_last_error(env->ctx), "desc.algorithm.tuning") != NULL, "reason: \"%s\"",
              flashcl_context_last_error(env->ctx));
  }
  /* desc.kernel = NVIDIA_MMA without tensor cores: the workspace query of pass
   * FORWARD runs the call's family choice too. */
  desc.algorithm.tuning = NULL;
  desc.algorithm.algo = FLASHCL_ALGO_AUTO;
  desc.algorithm.kernel = FLASHCL_KERNEL_NVIDIA_MMA;
  if (flashcl_attention_kernel_family(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, &fam) ==
      FLASHCL_ERROR_UNSUPPORTED)
    FCT_CHECK_STATUS(flashcl_attention_workspace_size(env->ctx, &desc, &q, &q, &q, FLASHCL_PASS_FORWARD, &ws),
                     FLASHCL_ERROR_UNSUPPORTED, "workspace_size(NVIDIA_MMA without tensor cores)");
  FCT_CHECK(ws == 777, "failed workspace_size calls wrote *bytes = %zu", ws);
  clFinish(env->queue);
  clReleaseMemObject(buf);
  clReleaseMemObject(obuf);
}

/* ----------------------------------------------------------- last error -- */

static void test_last_error(void **state) {
  fct_env *env = fct_env_get();
  flashcl_attention_desc desc;
  flashcl_block_plan plan;
  flashcl_status st;
  (void)state;
  flashcl_attention_desc_init(&desc);
  st = flashcl_attention_forward(env->ctx, &desc, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL);
  FCT_CHECK(st == FLASHCL_ERROR_INVALID_ARGUMENT, "forward(all NULL) = %d (%s)", (int)st, flashcl_status_string(st));
  FCT_CHECK(flashcl_context_last_error(env->ctx) != NULL && flashcl_context_last_error(env->ctx)[0] != '\0',
            "flashcl_context_last_error is empty after a failed forward");
  st = flashcl_attention_block_plan(env->ctx, 64, FLASHCL_F32, 0, 0, &plan);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "block_plan after a failure");
  FCT_CHECK(flashcl_context_last_error(env->ctx) != NULL, "last error is NULL");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_strings),
      cmocka_unit_test(test_dtypes),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_tensor_init),
      cmocka_unit_test(test_desc_and_options_init),
      cmocka_unit_test(test_struct_size),
      cmocka_unit_test(test_desc_defaults),
      cmocka_unit_test(test_destroy_null),
      cmocka_unit_test_setup_teardown(test_bad_device, save_device_env, restore_device_env),
      cmocka_unit_test_setup_teardown(test_device_by_vendor, save_device_env, restore_device_env),
      cmocka_unit_test(test_bad_kernel_env),
      cmocka_unit_test(test_device_info),
      cmocka_unit_test(test_block_plan),
      cmocka_unit_test(test_local_memory),
      cmocka_unit_test(test_local_memory_override),
      cmocka_unit_test(test_workspace_size),
      cmocka_unit_test(test_workspace_size_errors),
      cmocka_unit_test(test_kernel_family),
      cmocka_unit_test(test_query_validation),
      cmocka_unit_test(test_last_error),
      cmocka_unit_test(test_create_from_cl),
      cmocka_unit_test(test_profiling_option),
      cmocka_unit_test(test_kernel_dir_option),
  };
  return fct_run_group("api", tests, sizeof tests / sizeof tests[0], 1);
}
