/*
 * The tuning API: the declared spaces, tuning values, tuning files (loaded,
 * matched by specificity, refused whole when malformed or for another device
 * or version), per-call tunings (honoured or refused with nothing written),
 * and the configuration queries that say what runs and where it came from.
 *
 * Files are written to fresh temporary paths; a second flashcl context shares
 * the group's cl_context (flashcl_context_create_from_cl), so the group's
 * tensors and reference results serve both.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* -------------------------------------------------------------- helpers -- */

static void write_text(const char *path, const char *text, size_t len) {
  FILE *f = fopen(path, "wb");
  FCT_CHECK(f != NULL, "cannot create %s", path);
  FCT_CHECK(fwrite(text, 1, len, f) == len && fclose(f) == 0, "cannot write %s", path);
}

/* A temporary file path (the file exists, empty). */
static void temp_path(char *path, size_t cap) {
  snprintf(path, cap, "/tmp/flashcl-tuning-XXXXXX");
  const int fd = mkstemp(path);
  FCT_CHECK(fd >= 0, "mkstemp failed");
  close(fd);
}

/* This device's header (flashcl_context_tuning_header) then `body`. */
static void device_file(char *text, size_t cap, const char *body) {
  FCT_CHECK_STATUS(flashcl_context_tuning_header(fct_env_get()->ctx, text, cap), FLASHCL_SUCCESS, "tuning header");
  FCT_CHECK(strlen(text) + strlen(body) < cap, "file text too long");
  strcat(text, body);
}

/* A context on the group's OpenCL objects with these options. */
static flashcl_context *open_ctx(const char *tuning_file, const char *cache_dir, int no_user_tuning) {
  fct_env *env = fct_env_get();
  flashcl_context_options opt;
  flashcl_context *ctx = NULL;
  flashcl_context_options_init(&opt);
  opt.tuning_file = tuning_file ? tuning_file : "";
  opt.cache_dir = cache_dir;
  opt.no_user_tuning = no_user_tuning;
  FCT_CHECK_STATUS(flashcl_context_create_from_cl(env->cl_ctx, env->device, env->queue, &opt, &ctx), FLASHCL_SUCCESS,
                   "context_create_from_cl");
  return ctx;
}

/* The forward configuration ctx reports for a (1, n, 2, d) problem. */
static flashcl_status fwd_config(flashcl_context *ctx, int d, flashcl_dtype dtype, int n,
                                 const flashcl_tuning *tuning, flashcl_config *cfg) {
  flashcl_attention_desc desc;
  flashcl_tensor q;
  flashcl_attention_desc_init(&desc);
  desc.algorithm.tuning = tuning;
  /* The portable forward (fwd) even where tensor cores would run: the files of
   * these tests hold fwd entries. */
  desc.algorithm.kernel = FLASHCL_KERNEL_PORTABLE;
  cl_mem buf = fct_create_buffer((size_t)n * 2 * d * flashcl_dtype_size(dtype), NULL);
  flashcl_tensor_init_bnhd(&q, buf, 0, dtype, 1, n, 2, d);
  /* o = q is refused (outputs must not overlap inputs): use a second view. */
  cl_mem obuf = fct_create_buffer((size_t)n * 2 * d * flashcl_dtype_size(dtype), NULL);
  flashcl_tensor o;
  flashcl_tensor_init_bnhd(&o, obuf, 0, dtype, 1, n, 2, d);
  memset(cfg, 0, sizeof *cfg);
  const flashcl_status st = flashcl_attention_config(ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, cfg);
  clReleaseMemObject(buf);
  clReleaseMemObject(obuf);
  return st;
}

/* A causal f32 forward (d = 64, 2 heads) on ctx instead of the group's
 * context, checked against the double reference. */
static void check_forward_on(flashcl_context *ctx, int nq, int nk) {
  fct_env *env = fct_env_get();
  flashcl_context *group = env->ctx;
  const fct_case c = {FLASHCL_F32, 1, nq, nk, 2, 2, 64, 1, 0.0f, FCT_BNHD};
  const fct_run run = {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
  env->ctx = ctx;
  fct_check_case(&c, &run);
  env->ctx = group;
}

static int cfg_value(const flashcl_config *cfg, const char *name) {
  int v = -12345;
  FCT_CHECK_STATUS(flashcl_tuning_get(&cfg->tuning, name, &v), FLASHCL_SUCCESS, "config has no %s", name);
  return v;
}

/* ---------------------------------------------------------------- space -- */

static void test_space(void **state) {
  (void)state;
  for (int f = 0; f < FLASHCL_TUNE_FAMILY_COUNT; f++) {
    const flashcl_tuning_family fam = (flashcl_tuning_family)f;
    flashcl_tuning_family back;
    FCT_CHECK_STATUS(flashcl_tuning_family_parse(flashcl_tuning_family_name(fam), &back), FLASHCL_SUCCESS,
                     "family name %s", flashcl_tuning_family_name(fam));
    FCT_CHECK(back == fam, "family %d parses back as %d", f, (int)back);
    int n = 0;
    flashcl_tuning_param_info info;
    while (flashcl_tuning_space(fam, n, &info) == FLASHCL_SUCCESS) {
      FCT_CHECK(info.name && *info.name && info.description && *info.description, "%s param %d unnamed",
                flashcl_tuning_family_name(fam), n);
      FCT_CHECK(info.min <= info.max && info.step >= 1, "%s.%s: range %d..%d step %d",
                flashcl_tuning_family_name(fam), info.name, info.min, info.max, info.step);
      for (int c = 0; c < info.num_candidates; c++) {
        const int v = info.candidates[c];
        FCT_CHECK(v >= info.min && v <= info.max && (v - info.min) % info.step == 0,
                  "%s.%s: candidate %d is not legal", flashcl_tuning_family_name(fam), info.name, v);
      }
      for (int m = 0; m < n; m++) {
        flashcl_tuning_param_info other;
        flashcl_tuning_space(fam, m, &other);
        FCT_CHECK(strcmp(other.name, info.name) != 0, "%s declares %s twice", flashcl_tuning_family_name(fam),
                  info.name);
      }
      n++;
    }
    FCT_CHECK(n > 0 && n <= FLASHCL_TUNING_MAX_PARAMS, "%s declares %d parameters", flashcl_tuning_family_name(fam),
              n);
  }
  flashcl_tuning_param_info info;
  FCT_CHECK_STATUS(flashcl_tuning_space((flashcl_tuning_family)99, 0, &info), FLASHCL_ERROR_INVALID_ARGUMENT,
                   "space of an unknown family");
  FCT_CHECK_STATUS(flashcl_tuning_space(FLASHCL_TUNE_FWD, -1, &info), FLASHCL_ERROR_INVALID_ARGUMENT, "index -1");
  FCT_CHECK_STATUS(flashcl_tuning_space(FLASHCL_TUNE_FWD, 0, NULL), FLASHCL_ERROR_INVALID_ARGUMENT, "NULL info");
  flashcl_tuning_family fam;
  FCT_CHECK_STATUS(flashcl_tuning_family_parse("nosuch", &fam), FLASHCL_ERROR_INVALID_ARGUMENT, "unknown family name");
  FCT_CHECK(strcmp(flashcl_tuning_family_name(FLASHCL_TUNE_NONE), "none") == 0, "name of TUNE_NONE");
}

/* --------------------------------------------------------------- values -- */

static void test_values(void **state) {
  fct_env *env = fct_env_get();
  flashcl_tuning t, u;
  char text[512];
  int v = 0;
  (void)state;
  flashcl_tuning_init(&t, FLASHCL_TUNE_FWD);
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "br", 64), FLASHCL_SUCCESS, "set br");
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "bc", 32), FLASHCL_SUCCESS, "set bc");
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "br", 48), FLASHCL_SUCCESS, "replace br");
  FCT_CHECK(t.count == 2, "two parameters set, count %d", t.count);
  FCT_CHECK_STATUS(flashcl_tuning_get(&t, "br", &v), FLASHCL_SUCCESS, "get br");
  FCT_CHECK(v == 48, "br reads %d", v);
  FCT_CHECK_STATUS(flashcl_tuning_get(&t, "tall", &v), FLASHCL_ERROR_INVALID_ARGUMENT, "get of an unset parameter");
  /* Refusals leave the tuning as it was, and say why. */
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "nosuch", 1), FLASHCL_ERROR_INVALID_ARGUMENT, "unknown name");
  FCT_CHECK(strstr(flashcl_context_last_error(env->ctx), "nosuch") != NULL, "message names the parameter: %s",
            flashcl_context_last_error(env->ctx));
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "br", 12), FLASHCL_ERROR_INVALID_ARGUMENT, "br off its step");
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "br", 4096), FLASHCL_ERROR_INVALID_ARGUMENT, "br too large");
  FCT_CHECK_STATUS(flashcl_tuning_set(NULL, &t, "tall", 2), FLASHCL_ERROR_INVALID_ARGUMENT, "tall = 2 (no ctx)");
  FCT_CHECK(t.count == 2, "refused sets changed the count to %d", t.count);
  /* format -> parse round trip. */
  FCT_CHECK_STATUS(flashcl_tuning_format(&t, text, sizeof text), FLASHCL_SUCCESS, "format");
  FCT_CHECK(strcmp(text, "fwd br=48 bc=32") == 0, "format gave \"%s\"", text);
  FCT_CHECK_STATUS(flashcl_tuning_parse(env->ctx, text, &u), FLASHCL_SUCCESS, "parse \"%s\"", text);
  FCT_CHECK(u.family == FLASHCL_TUNE_FWD && u.count == 2 && flashcl_tuning_get(&u, "bc", &v) == 0 && v == 32,
            "parse round trip");
  FCT_CHECK_STATUS(flashcl_tuning_format(&t, text, 6), FLASHCL_ERROR_BUFFER_TOO_SMALL, "format into 6 bytes");
  /* Parsing is all or nothing. */
  u = t;
  static const char *const bad[] = {"fwd br=48 bc=33", "fwd br=48 nosuch=1", "fwd br", "fwd br=x", "nosuch br=8",
                                    "", "fwd br=99999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    FCT_CHECK_STATUS(flashcl_tuning_parse(env->ctx, bad[i], &u), FLASHCL_ERROR_INVALID_ARGUMENT, "parse \"%s\"",
                     bad[i]);
    FCT_CHECK(memcmp(&u, &t, sizeof u) == 0, "a refused parse of \"%s\" changed the tuning", bad[i]);
  }
  FCT_CHECK_STATUS(flashcl_tuning_parse(env->ctx, "decode: kpt=4 stages=0", &u), FLASHCL_SUCCESS, "decode parse");
  FCT_CHECK(u.family == FLASHCL_TUNE_DECODE && u.count == 2, "decode parse: family %d count %d", (int)u.family,
            u.count);
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, NULL, "br", 8), FLASHCL_ERROR_INVALID_ARGUMENT, "set on NULL");
  FCT_CHECK_STATUS(flashcl_tuning_parse(env->ctx, NULL, &u), FLASHCL_ERROR_INVALID_ARGUMENT, "parse NULL");
}

/* ---------------------------------------------------------------- files -- */

/* A file for this device: loaded, its entries reported as the configuration,
 * the most specific entry winning; a forward under it is exact. */
static void test_file_loaded(void **state) {
  char path[64], text[4096];
  flashcl_config cfg;
  (void)state;
  temp_path(path, sizeof path);
  device_file(text, sizeof text,
              "# a comment\n"
              "fwd : bc=16\n"
              "fwd d=64 : bc=24   # trailing comment\n"
              "fwd d=64 dtype=f32 : br=32 bc=32\n"
              "fwd d=64 dtype=f32 nmax=128 : br=16 bc=40\n");
  write_text(path, text, strlen(text));
  flashcl_context *ctx = open_ctx(path, NULL, 1);
  const char *log = flashcl_context_tuning_log(ctx);
  FCT_CHECK(strstr(log, path) && strstr(log, "loaded"), "tuning log does not say %s was loaded:\n%s", path, log);
  static const struct {
    int d;
    flashcl_dtype dt;
    int n, bc;
  } want[] = {{64, FLASHCL_F32, 256, 32}, {64, FLASHCL_F32, 64, 40}, {64, FLASHCL_F16, 256, 24}, {32, FLASHCL_F32, 256, 16}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    FCT_CHECK_STATUS(fwd_config(ctx, want[i].d, want[i].dt, want[i].n, NULL, &cfg), FLASHCL_SUCCESS, "config %zu", i);
    FCT_CHECK(cfg.family == FLASHCL_TUNE_FWD && cfg.source == FLASHCL_TUNING_SOURCE_FILE &&
                  strcmp(cfg.origin, path) == 0,
              "d=%d n=%d: family %s, source %s, origin %s", want[i].d, want[i].n,
              flashcl_tuning_family_name(cfg.family), flashcl_tuning_source_name(cfg.source), cfg.origin);
    FCT_CHECK(cfg.block_c == want[i].bc && cfg_value(&cfg, "bc") == want[i].bc,
              "d=%d %s n=%d: block_c %d (tuning bc %d), want the entry's %d", want[i].d,
              flashcl_dtype_name(want[i].dt), want[i].n, cfg.block_c, cfg_value(&cfg, "bc"), want[i].bc);
  }
  /* A forward under the file: exact against the reference. */
  check_forward_on(ctx, 200, 300);
  flashcl_context_destroy(ctx);
  /* The same file through the cache directory: source "user cache file";
   * with no_user_tuning the directory is not read. */
  char dir[64], sub[96], cached[160];
  snprintf(dir, sizeof dir, "/tmp/flashcl-cache-XXXXXX");
  FCT_CHECK(mkdtemp(dir) != NULL, "mkdtemp failed");
  snprintf(sub, sizeof sub, "%s/tuning", dir);
  FCT_CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
  snprintf(cached, sizeof cached, "%s/dev.tune", sub);
  write_text(cached, text, strlen(text));
  ctx = open_ctx(NULL, dir, 0);
  FCT_CHECK_STATUS(fwd_config(ctx, 64, FLASHCL_F32, 256, NULL, &cfg), FLASHCL_SUCCESS, "config from the cache dir");
  FCT_CHECK(cfg.source == FLASHCL_TUNING_SOURCE_CACHE && strcmp(cfg.origin, cached) == 0 && cfg.block_c == 32,
            "cache dir: source %s origin %s block_c %d", flashcl_tuning_source_name(cfg.source), cfg.origin,
            cfg.block_c);
  FCT_CHECK(strcmp(flashcl_context_cache_dir(ctx), dir) == 0, "cache dir reads %s", flashcl_context_cache_dir(ctx));
  flashcl_context_destroy(ctx);
  ctx = open_ctx(NULL, dir, 1);
  FCT_CHECK_STATUS(fwd_config(ctx, 64, FLASHCL_F32, 256, NULL, &cfg), FLASHCL_SUCCESS, "config, no_user_tuning");
  FCT_CHECK(cfg.source != FLASHCL_TUNING_SOURCE_CACHE, "no_user_tuning still read %s", cfg.origin);
  flashcl_context_destroy(ctx);
  remove(cached);
  rmdir(sub);
  rmdir(dir);
  remove(path);
}

/* A file's tiles that do not run on this device are a preference: the
 * default rule plans instead, and the forward is exact. The same values in a
 * call are refused. */
static void test_file_tiles_fall_back(void **state) {
  char path[64], text[4096];
  flashcl_config cfg;
  (void)state;
  temp_path(path, sizeof path);
  /* 7 work-items map no GPU tile; the entry keeps its other values. */
  device_file(text, sizeof text, "fwd d=64 : map=0 threads=7 br=32 bc=32 prefetch=0\n");
  write_text(path, text, strlen(text));
  flashcl_context *ctx = open_ctx(path, NULL, 1);
  FCT_CHECK_STATUS(fwd_config(ctx, 64, FLASHCL_F32, 256, NULL, &cfg), FLASHCL_SUCCESS, "config, file tiles unmappable");
  FCT_CHECK(cfg.source == FLASHCL_TUNING_SOURCE_FILE && cfg.threads != 7 && cfg_value(&cfg, "map") == 0 &&
                cfg_value(&cfg, "prefetch") == 0,
            "fallback: source %s, %d work-items, map %d, prefetch %d", flashcl_tuning_source_name(cfg.source),
            cfg.threads, cfg_value(&cfg, "map"), cfg_value(&cfg, "prefetch"));
  int v = 0;
  FCT_CHECK(flashcl_tuning_get(&cfg.set, "threads", &v) != FLASHCL_SUCCESS, "the dropped threads=7 is still reported as set");
  check_forward_on(ctx, 130, 190);
  flashcl_tuning t;
  FCT_CHECK_STATUS(flashcl_tuning_parse(NULL, "fwd map=0 threads=7 br=32 bc=32", &t), FLASHCL_SUCCESS, "parse");
  FCT_CHECK_STATUS(fwd_config(ctx, 64, FLASHCL_F32, 256, &t, &cfg), FLASHCL_ERROR_UNSUPPORTED, "the same in a call");
  flashcl_context_destroy(ctx);
  remove(path);
}

/* Files that must be skipped whole: the context still works, the log says
 * why, and nothing of the file is used (not even a valid first entry). */
static void test_file_rejected(void **state) {
  char header[2048], text[4096], path[64];
  (void)state;
  FCT_CHECK_STATUS(flashcl_context_tuning_header(fct_env_get()->ctx, header, sizeof header), FLASHCL_SUCCESS,
                   "header");
  static const struct {
    const char *what, *body;
    int with_header;
  } cases[] = {
      {"garbage", "\x7f\x45\x4c\x46\x02\x01\x01 binary junk \xff\xfe\n", 1},
      {"unknown family", "fwd d=64 : bc=40\nnosuch : a=1\n", 1},
      {"unknown parameter", "fwd d=64 : bc=40\nfwd : nosuch=1\n", 1},
      {"illegal value", "fwd d=64 : bc=40\nfwd d=32 : br=12\n", 1},
      {"truncated", "fwd d=64 : bc=40\nfwd d=64 dtype=f3", 1},
      {"truncated value", "fwd d=64 : bc=40\nfwd d=32 : bc=", 1},
      {"no colon", "fwd d=64 : bc=40\nfwd d=32 bc=16\n", 1},
      {"bad selector", "fwd d=64 : bc=40\nfwd q=3 : bc=16\n", 1},
      {"header after entry", "fwd d=64 : bc=40\nvendor x\n", 1},
      {"format version", "flashcl-tuning 2\nfwd d=64 : bc=40\n", 0},
      {"another device", "device NoSuchDevice-xyz\nfwd d=64 : bc=40\n", 0},
      {"another vendor", "vendor NoSuchVendor-xyz\nfwd d=64 : bc=40\n", 0},
      {"another version", "flashcl 9.9.9\nfwd d=64 : bc=40\n", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(text, sizeof text, "%s%s", cases[i].with_header ? header : "", cases[i].body);
    temp_path(path, sizeof path);
    write_text(path, text, strlen(text));
    flashcl_context *ctx = open_ctx(path, NULL, 1);
    flashcl_config cfg;
    FCT_CHECK_STATUS(fwd_config(ctx, 64, FLASHCL_F32, 256, NULL, &cfg), FLASHCL_SUCCESS, "%s: config", cases[i].what);
    const char *log = flashcl_context_tuning_log(ctx);
    FCT_CHECK(strstr(log, "skipped") != NULL, "%s: the log does not say the file was skipped:\n%s", cases[i].what,
              log);
    FCT_CHECK(cfg.source != FLASHCL_TUNING_SOURCE_FILE && cfg.block_c != 40,
              "%s: the file half-applied (source %s, block_c %d)", cases[i].what,
              flashcl_tuning_source_name(cfg.source), cfg.block_c);
    print_message("    ok  %s: %s", cases[i].what, strstr(log, path) ? strstr(log, path) : log);
    flashcl_context_destroy(ctx);
    remove(path);
  }
  /* A NUL byte in the middle, a missing file and a directory. */
  temp_path(path, sizeof path);
  snprintf(text, sizeof text, "%sfwd d=64 : bc=40\n", header);
  text[strlen(header) + 3] = '\0';
  write_text(path, text, strlen(header) + 18);
  static const char *const paths[3] = {NULL, "/nonexistent/flashcl.tune", "/tmp"};
  for (int i = 0; i < 3; i++) {
    const char *p = paths[i] ? paths[i] : path;
    flashcl_context *ctx = open_ctx(p, NULL, 1);
    flashcl_config cfg;
    FCT_CHECK_STATUS(fwd_config(ctx, 64, FLASHCL_F32, 256, NULL, &cfg), FLASHCL_SUCCESS, "config (%s)", p);
    FCT_CHECK(cfg.source != FLASHCL_TUNING_SOURCE_FILE && strstr(flashcl_context_tuning_log(ctx), "skipped"),
              "%s: not skipped:\n%s", p, flashcl_context_tuning_log(ctx));
    flashcl_context_destroy(ctx);
  }
  remove(path);
}

/* ------------------------------------------------------------- per call -- */

/* A per-call tuning is honoured (reported as source "call", exact results) or
 * refused with FLASHCL_ERROR_UNSUPPORTED, a message, and nothing written. */
static void test_call_tuning(void **state) {
  fct_env *env = fct_env_get();
  flashcl_tuning t;
  flashcl_config cfg;
  (void)state;
  flashcl_tuning_init(&t, FLASHCL_TUNE_FWD);
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "br", 32), FLASHCL_SUCCESS, "br");
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "bc", 16), FLASHCL_SUCCESS, "bc");
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "map", 0), FLASHCL_SUCCESS, "map");
  FCT_CHECK_STATUS(fwd_config(env->ctx, 64, FLASHCL_F32, 256, &t, &cfg), FLASHCL_SUCCESS, "config with a call tuning");
  FCT_CHECK(cfg.source == FLASHCL_TUNING_SOURCE_CALL && cfg.block_r == 32 && cfg.block_c == 16 &&
                cfg_value(&cfg, "map") == 0 && cfg.threads > 1 && strcmp(cfg.kernel, "flash_fwd") == 0,
            "call tuning: source %s, %dx%d, %d work-items, kernel %s", flashcl_tuning_source_name(cfg.source),
            cfg.block_r, cfg.block_c, cfg.threads, cfg.kernel);
  {
    const fct_case c = {FLASHCL_F32, 2, 150, 170, 4, 2, 64, 1, 0.0f, FCT_BHND};
    const fct_run run = {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO, &t};
    fct_check_case(&c, &run);
  }
  /* desc.algorithm.block_r/block_c are the br/bc of the portable families. */
  {
    flashcl_attention_desc desc;
    cl_mem b1 = fct_create_buffer(64 * 2 * 64 * 4, NULL), b2 = fct_create_buffer(64 * 2 * 64 * 4, NULL);
    flashcl_tensor q, o;
    flashcl_tensor_init_bnhd(&q, b1, 0, FLASHCL_F32, 1, 64, 2, 64);
    flashcl_tensor_init_bnhd(&o, b2, 0, FLASHCL_F32, 1, 64, 2, 64);
    flashcl_attention_desc_init(&desc);
    desc.algorithm.block_r = 24;
    desc.algorithm.block_c = 8;
    FCT_CHECK_STATUS(flashcl_attention_config(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, &cfg),
                     FLASHCL_SUCCESS, "config with block sizes");
    FCT_CHECK(cfg.block_r == 24 && cfg.block_c == 8 && cfg.source == FLASHCL_TUNING_SOURCE_CALL &&
                  strstr(cfg.origin, "block_r"),
              "block sizes: %dx%d source %s origin %s", cfg.block_r, cfg.block_c,
              flashcl_tuning_source_name(cfg.source), cfg.origin);
    FCT_CHECK_STATUS(flashcl_attention_config(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_BACKWARD, &cfg),
                     FLASHCL_SUCCESS, "backward config with block sizes");
    FCT_CHECK(cfg.family == FLASHCL_TUNE_BWD && cfg.block_r == 24 && cfg.block_c == 8,
              "backward block sizes: family %s %dx%d", flashcl_tuning_family_name(cfg.family), cfg.block_r,
              cfg.block_c);
    desc.algorithm.algo = FLASHCL_ALGO_NAIVE;
    FCT_CHECK_STATUS(flashcl_attention_config(env->ctx, &desc, &q, &q, &q, &o, FLASHCL_PASS_FORWARD, &cfg),
                     FLASHCL_SUCCESS, "config of the naive path");
    FCT_CHECK(cfg.family == FLASHCL_TUNE_NONE, "naive path: family %s", flashcl_tuning_family_name(cfg.family));
    clReleaseMemObject(b1);
    clReleaseMemObject(b2);
  }
  /* Refusals: the wrong family for the pass, an illegal value smuggled past
   * flashcl_tuning_set, and values that cannot run here. */
  flashcl_tuning wrong_pass, smuggled, shfl, decode;
  flashcl_tuning_init(&wrong_pass, FLASHCL_TUNE_BWD);
  flashcl_tuning_init(&smuggled, FLASHCL_TUNE_FWD);
  smuggled.count = 1;
  snprintf(smuggled.params[0].name, sizeof smuggled.params[0].name, "br");
  smuggled.params[0].value = 12;
  flashcl_tuning_init(&decode, FLASHCL_TUNE_DECODE);
  flashcl_tuning_init(&shfl, FLASHCL_TUNE_FWD);
  flashcl_tuning_set(env->ctx, &shfl, "map", 0);
  flashcl_tuning_set(env->ctx, &shfl, "shfl", 1); /* NVIDIA inline PTX: runs only where the probe passed */
  const flashcl_tuning *refused[4] = {&wrong_pass, &smuggled, &decode, &shfl};
  static const char *const why[4] = {"bwd tuning on the forward", "br = 12", "decode tuning on the forward",
                                     "shfl = 1"};
  char devinfo[256];
  const int nvidia = fct_device_requires_mma(env->device, devinfo, sizeof devinfo);
  for (int i = 0; i < 4; i++) {
    if (i == 3 && nvidia) continue; /* shfl runs there */
    fct_problem p;
    const fct_case c = {FLASHCL_F32, 1, 64, 64, 2, 2, 64, 0, 0.0f, FCT_BNHD};
    const fct_run run = {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO, refused[i]};
    flashcl_attention_desc desc;
    fct_tensor o;
    fct_problem_create(&p, &c);
    fct_problem_desc(&p, &run, &desc);
    fct_tensor_create(&o, FLASHCL_F32, FCT_BNHD, 1, 64, 2, 64, 4);
    fct_tensor_poison(&o);
    FCT_CHECK_STATUS(fwd_config(env->ctx, 64, FLASHCL_F32, 64, refused[i], &cfg), FLASHCL_ERROR_UNSUPPORTED,
                     "config with %s", why[i]);
    const flashcl_status st = flashcl_attention_forward(env->ctx, &desc, &p.q.t, &p.k.t, &p.v.t, &o.t, NULL, 0, NULL,
                                                        NULL);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_UNSUPPORTED, "forward with %s", why[i]);
    FCT_CHECK(*flashcl_context_last_error(env->ctx), "%s: no message", why[i]);
    fct_tensor *outs[1] = {&o};
    FCT_CHECK(fct_tensors_written(outs, 1) == 0, "%s: the refused forward wrote its output", why[i]);
    print_message("    ok  refused %s: %s\n", why[i], flashcl_context_last_error(env->ctx));
    fct_tensor_release(&o);
    fct_problem_release(&p);
  }
}

/* The decode's configuration and its per-call tuning. */
/* A tensor-core backward tuning its kernel's #error rule refuses (a Q tile
 * under half the key block) is refused up front, never a build failure: on
 * NVIDIA by the check, elsewhere because the family does not run. */
static void test_mma_bwd_refused(void **state) {
  flashcl_attention_desc desc;
  flashcl_tensor t[4];
  flashcl_config cfg;
  flashcl_tuning tu;
  (void)state;
  cl_mem b[4];
  for (int i = 0; i < 4; i++) {
    b[i] = fct_create_buffer((size_t)256 * 2 * 128 * 2, NULL);
    flashcl_tensor_init_bnhd(&t[i], b[i], 0, FLASHCL_F16, 1, 256, 2, 128);
  }
  flashcl_tuning_init(&tu, FLASHCL_TUNE_MMA_BWD);
  FCT_CHECK_STATUS(flashcl_tuning_set(NULL, &tu, "nwarps", 8), FLASHCL_SUCCESS, "nwarps");
  FCT_CHECK_STATUS(flashcl_tuning_set(NULL, &tu, "block_r", 32), FLASHCL_SUCCESS, "block_r");
  flashcl_attention_desc_init(&desc);
  desc.algorithm.tuning = &tu;
  for (int det = 0; det <= 1; det++) {
    desc.backward.deterministic = det;
    const flashcl_status st =
        flashcl_attention_config(fct_env_get()->ctx, &desc, &t[0], &t[1], &t[2], &t[3], FLASHCL_PASS_BACKWARD, &cfg);
    FCT_CHECK_STATUS(st, FLASHCL_ERROR_UNSUPPORTED, "mma_bwd nwarps=8 block_r=32, deterministic=%d", det);
  }
  for (int i = 0; i < 4; i++) clReleaseMemObject(b[i]);
}

static void test_decode_config(void **state) {
  fct_env *env = fct_env_get();
  flashcl_decode_desc desc;
  flashcl_tensor q, kc;
  flashcl_config cfg;
  flashcl_tuning t;
  (void)state;
  cl_mem qb = fct_create_buffer(1 * 8 * 128 * 4, NULL), cb = fct_create_buffer(1 * 512 * 2 * 128 * 4, NULL);
  flashcl_tensor_init_bnhd(&q, qb, 0, FLASHCL_F32, 1, 1, 8, 128);
  flashcl_tensor_init_bnhd(&kc, cb, 0, FLASHCL_F32, 1, 512, 2, 128);
  flashcl_decode_desc_init(&desc);
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &q, &kc, &kc, &cfg), FLASHCL_SUCCESS, "decode config");
  FCT_CHECK(cfg.family == FLASHCL_TUNE_DECODE && cfg.tuning.count > 0 && cfg.threads > 0,
            "decode config: family %s, %d parameters", flashcl_tuning_family_name(cfg.family), cfg.tuning.count);
  /* The GPU mapping's parameters (decode.cl), on any device with map = 0. */
  flashcl_tuning_init(&t, FLASHCL_TUNE_DECODE);
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "map", 0), FLASHCL_SUCCESS, "map");
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "kpt", 1), FLASHCL_SUCCESS, "kpt");
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "max_rows", 2), FLASHCL_SUCCESS, "max_rows");
  desc.tuning = &t;
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &q, &kc, &kc, &cfg), FLASHCL_SUCCESS, "tuned decode config");
  FCT_CHECK(cfg.source == FLASHCL_TUNING_SOURCE_CALL && cfg_value(&cfg, "kpt") == 1 && cfg_value(&cfg, "max_rows") == 2 &&
                cfg.block_r == 2,
            "tuned decode: source %s kpt %d max_rows %d rows %d", flashcl_tuning_source_name(cfg.source),
            cfg_value(&cfg, "kpt"), cfg_value(&cfg, "max_rows"), cfg.block_r);
  /* fp32 caches never run the tensor-core decode: its split floor is refused,
   * the portable kernel's runs as given. */
  flashcl_tuning_init(&t, FLASHCL_TUNE_DECODE);
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "mma_min_keys", 64), FLASHCL_SUCCESS, "mma_min_keys");
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &q, &kc, &kc, &cfg), FLASHCL_ERROR_UNSUPPORTED,
                   "f32 decode with mma_min_keys");
  flashcl_tuning_init(&t, FLASHCL_TUNE_DECODE);
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "min_keys", 128), FLASHCL_SUCCESS, "min_keys");
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &q, &kc, &kc, &cfg), FLASHCL_SUCCESS,
                   "f32 decode with min_keys");
  FCT_CHECK(cfg_value(&cfg, "min_keys") == 128 && cfg_value(&cfg, "mma_min_keys") == 0,
            "f32 decode: min_keys %d, mma_min_keys %d (0: not read)", cfg_value(&cfg, "min_keys"),
            cfg_value(&cfg, "mma_min_keys"));
  /* The CPU kernel (map = 1, on any device): its tile and rows are reported
   * as they run (8 query heads over 2 kv heads, one token: 4 rows), and the
   * GPU mapping's keys per work-item, which it does not read, are refused. */
  flashcl_tuning_init(&t, FLASHCL_TUNE_DECODE);
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "map", 1), FLASHCL_SUCCESS, "map 1");
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "cpu_block_c", 32), FLASHCL_SUCCESS, "cpu_block_c");
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "cpu_rows", 8), FLASHCL_SUCCESS, "cpu_rows");
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &q, &kc, &kc, &cfg), FLASHCL_SUCCESS, "CPU decode config");
  FCT_CHECK(strcmp(cfg.kernel, "decode_attn_cpu") == 0 && cfg.block_c == 32 && cfg.block_r == 4 && cfg.threads == 1 &&
                cfg_value(&cfg, "map") == 1 && cfg_value(&cfg, "kpt") == 0,
            "CPU decode: kernel %s, %d keys x %d rows, %d work-items, map %d, kpt %d", cfg.kernel, cfg.block_c,
            cfg.block_r, cfg.threads, cfg_value(&cfg, "map"), cfg_value(&cfg, "kpt"));
  FCT_CHECK_STATUS(flashcl_tuning_set(env->ctx, &t, "kpt", 1), FLASHCL_SUCCESS, "kpt with map 1");
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &q, &kc, &kc, &cfg), FLASHCL_ERROR_UNSUPPORTED,
                   "CPU decode with kpt");
  flashcl_tuning_init(&t, FLASHCL_TUNE_FWD);
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &q, &kc, &kc, &cfg), FLASHCL_ERROR_UNSUPPORTED,
                   "decode with a fwd tuning");
  clReleaseMemObject(qb);
  clReleaseMemObject(cb);
}

static void test_header_and_log(void **state) {
  fct_env *env = fct_env_get();
  char buf[2048], tiny[8];
  (void)state;
  FCT_CHECK_STATUS(flashcl_context_tuning_header(env->ctx, buf, sizeof buf), FLASHCL_SUCCESS, "header");
  FCT_CHECK(strncmp(buf, "flashcl-tuning 1\nvendor ", 24) == 0 && strstr(buf, env->info.device_name) &&
                strstr(buf, "\nflashcl " FLASHCL_VERSION_STRING "\n"),
            "header:\n%s", buf);
  FCT_CHECK_STATUS(flashcl_context_tuning_header(env->ctx, tiny, sizeof tiny), FLASHCL_ERROR_BUFFER_TOO_SMALL,
                   "header into 8 bytes");
  FCT_CHECK_STATUS(flashcl_context_tuning_header(NULL, buf, sizeof buf), FLASHCL_ERROR_INVALID_ARGUMENT, "NULL ctx");
  FCT_CHECK(strstr(flashcl_context_tuning_log(env->ctx), "device key") != NULL, "log:\n%s",
            flashcl_context_tuning_log(env->ctx));
  FCT_CHECK(strcmp(flashcl_context_tuning_log(NULL), "") == 0, "log of NULL");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_space),         cmocka_unit_test(test_values),
      cmocka_unit_test(test_header_and_log), cmocka_unit_test(test_file_loaded),
      cmocka_unit_test(test_file_rejected), cmocka_unit_test(test_call_tuning),
      cmocka_unit_test(test_decode_config),  cmocka_unit_test(test_mma_bwd_refused),
      cmocka_unit_test(test_file_tiles_fall_back),
  };
  return fct_run_group("tuning", tests, sizeof tests / sizeof tests[0], 1);
}
