/*
 * flashcl-bench's machine-readable output, end to end on tiny shapes: --json
 * is one valid JSON document (checked by the small validator below) for the
 * sweep, --decode and --block-sparse; --csv is a header and lines with as many
 * fields; the text table has its legend and summary line; with stderr not a
 * terminal no progress line is written; --csv with --json is refused.
 *
 * The tool runs as a child process (FLASHCL_BENCH_EXE) with stdout and stderr
 * in files of a private directory.
 */
#include "common.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef FLASHCL_BENCH_EXE
#error "FLASHCL_BENCH_EXE must name the flashcl-bench executable"
#endif

static char tmpdir[64];

/* ---- a minimal JSON syntax checker (RFC 8259 grammar, no semantics) ---- */

typedef struct json_in {
  const char *p;
  int depth;
} json_in;

static int json_value(json_in *in);

static void json_ws(json_in *in) {
  while (*in->p == ' ' || *in->p == '\t' || *in->p == '\n' || *in->p == '\r') in->p++;
}

static int json_literal(json_in *in, const char *word) {
  const size_t n = strlen(word);
  if (strncmp(in->p, word, n)) return -1;
  in->p += n;
  return 0;
}

static int json_string(json_in *in) {
  if (*in->p++ != '"') return -1;
  for (;;) {
    const unsigned char c = (unsigned char)*in->p++;
    if (c == '"') return 0;
    if (c < 0x20) return -1; /* also the end of the text */
    if (c != '\\') continue;
    const char e = *in->p++;
    if (e == 'u') {
      for (int i = 0; i < 4; ++i)
        if (!isxdigit((unsigned char)*in->p++)) return -1;
    } else if (!strchr("\"\\/bfnrt", e) || !e) {
      return -1;
    }
  }
}

static int json_digits(json_in *in) {
  if (!isdigit((unsigned char)*in->p)) return -1;
  while (isdigit((unsigned char)*in->p)) in->p++;
  return 0;
}

static int json_number(json_in *in) {
  if (*in->p == '-') in->p++;
  if (*in->p == '0') in->p++;
  else if (json_digits(in)) return -1;
  if (*in->p == '.') {
    in->p++;
    if (json_digits(in)) return -1;
  }
  if (*in->p == 'e' || *in->p == 'E') {
    in->p++;
    if (*in->p == '+' || *in->p == '-') in->p++;
    if (json_digits(in)) return -1;
  }
  return 0;
}

/* An object (close '}', members "key": value) or an array (close ']'). */
static int json_container(json_in *in, char close) {
  if (++in->depth > 64) return -1;
  in->p++;
  json_ws(in);
  if (*in->p == close) {
    in->p++;
    in->depth--;
    return 0;
  }
  for (;;) {
    json_ws(in);
    if (close == '}') {
      if (json_string(in)) return -1;
      json_ws(in);
      if (*in->p++ != ':') return -1;
    }
    if (json_value(in)) return -1;
    json_ws(in);
    const char c = *in->p++;
    if (c == close) break;
    if (c != ',') return -1;
  }
  in->depth--;
  return 0;
}

static int json_value(json_in *in) {
  json_ws(in);
  switch (*in->p) {
    case '{': return json_container(in, '}');
    case '[': return json_container(in, ']');
    case '"': return json_string(in);
    case 't': return json_literal(in, "true");
    case 'f': return json_literal(in, "false");
    case 'n': return json_literal(in, "null");
    default: return json_number(in);
  }
}

/* 0 when text is exactly one JSON value (whitespace around it allowed). */
static int json_valid(const char *text, const char **where) {
  json_in in = {text, 0};
  int bad = json_value(&in);
  if (!bad) { /* a failed parse may have stepped past the terminator: read no further */
    json_ws(&in);
    if (*in.p) bad = -1;
  }
  *where = in.p;
  return bad;
}

/* ---- running the tool ---- */

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf = (char *)calloc(1, 1 << 20);
  FCT_CHECK(buf != NULL, "out of memory");
  if (f) {
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
  }
  return buf;
}

/* Runs exe with args (NULL-terminated); its stdout and stderr come back
 * malloc'ed. Returns the exit status. */
static int run_exe(const char *exe, const char *const *args, char **out, char **err) {
  const char *argv[40];
  char out_path[128], err_path[128];
  int n = 0, status = 0;
  argv[n++] = exe;
  for (int i = 0; args[i] && n < 39; ++i) argv[n++] = args[i];
  argv[n] = NULL;
  snprintf(out_path, sizeof out_path, "%s/stdout", tmpdir);
  snprintf(err_path, sizeof err_path, "%s/stderr", tmpdir);
  fflush(NULL);
  const pid_t pid = fork();
  FCT_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    if (!freopen(out_path, "w", stdout) || !freopen(err_path, "w", stderr)) _exit(126);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  FCT_CHECK(waitpid(pid, &status, 0) == pid, "waitpid failed");
  *out = slurp(out_path);
  *err = slurp(err_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static int run_bench(const char *const *args, char **out, char **err) {
  return run_exe(FLASHCL_BENCH_EXE, args, out, err);
}

static int count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) ++n;
  return n;
}

/* stderr is a file here: no progress line ("\r", "row 1/") may be in it. */
static void check_no_progress(const char *err) {
  FCT_CHECK(!strchr(err, '\r') && !strstr(err, "row 1/") && !strstr(err, "elapsed"),
            "progress output with stderr redirected:\n%s", err);
}

#define SHAPE "--n", "64", "--d", "16", "--dtype", "f32", "--causal", "0", "--reps", "1", "--warmup", "0"

/* A run that must succeed with an "ok" row holding each of the strings in want (NULL-terminated). */
static void check_csv_row(const char *const *args, const char *const *want, const char *what) {
  char *out = NULL, *err = NULL;
  int ok = run_bench(args, &out, &err) == 0 && out && strstr(out, "\"ok\"");
  for (int i = 0; ok && want[i]; i++) ok = strstr(out, want[i]) != NULL;
  FCT_CHECK(ok, "%s:\n%s\n%s", what, out ? out : "", err ? err : "");
  free(out);
  free(err);
}

static void check_json_run(const char *const *args, const char *mode, int rows) {
  char *out = NULL, *err = NULL;
  const char *where = NULL;
  const int rc = run_bench(args, &out, &err);
  FCT_CHECK(rc == 0, "flashcl-bench exited with %d:\n%s\n%s", rc, out, err);
  FCT_CHECK(json_valid(out, &where) == 0, "invalid JSON at offset %d:\n%s", (int)(where - out), out);
  char want[64];
  snprintf(want, sizeof want, "\"mode\":\"%s\"", mode);
  FCT_CHECK(strstr(out, want) && strstr(out, "\"device\":{\"platform\":") && strstr(out, "\"flashcl_version\":"),
            "no mode or device object:\n%s", out);
  FCT_CHECK(count(out, "\"status\":\"ok\"") == rows, "want %d ok rows:\n%s", rows, out);
  FCT_CHECK(strstr(out, "\"summary\":{") != NULL, "no summary:\n%s", out);
  check_no_progress(err);
  free(out);
  free(err);
}

static void test_json(void **state) {
  (void)state;
  const char *sweep[] = {SHAPE, "--json", NULL};
  check_json_run(sweep, "sweep", 2);
  /* naive rows have no speedup: null, not an empty field */
  const char *naive[] = {SHAPE, "--algo", "naive", "--json", NULL};
  check_json_run(naive, "sweep", 1);
  const char *decode[] = {"--decode", "--n", "256", "--d", "64", "--dtype", "f32", "--decode-batch", "1", "--reps",
                          "1", "--warmup", "0", "--json", NULL};
  check_json_run(decode, "decode", 1);
  const char *quant[] = {"--decode", "--n", "256", "--d", "64", "--dtype", "f32", "--decode-batch", "1", "--reps",
                         "1", "--warmup", "0", "--kv-dtype", "i8,f8e4m3", "--json", NULL};
  check_json_run(quant, "decode", 2);
  /* --kv-scale head: one scale per kv head, named in the dtype column */
  const char *qhead[] = {"--decode", "--n", "256", "--d", "64", "--dtype", "f32", "--decode-batch", "1", "--reps",
                         "1", "--warmup", "0", "--kv-dtype", "i8", "--kv-scale", "head", "--csv", NULL};
  const char *const qhead_want[] = {",f32/i8:head,", NULL};
  check_csv_row(qhead, qhead_want, "--kv-scale head");
  /* --kv-scale block32: d / 32 scales per row, counted in kv_bytes (2 x 256 x 8 x (64 + 2 x 4)) */
  const char *qblk[] = {"--decode", "--n", "256", "--d", "64", "--dtype", "f32", "--decode-batch", "1", "--reps",
                        "1", "--warmup", "0", "--kv-dtype", "i8", "--kv-scale", "block32", "--csv", NULL};
  const char *const qblk_want[] = {",f32/i8:block32,", ",294912,", NULL};
  check_csv_row(qblk, qblk_want, "--kv-scale block32");
  /* The paged forward over e4m3 pools, flash and naive (checked against each other), labelled */
  const char *pq[] = {"--n", "64", "--d", "32", "--dtype", "f32", "--causal", "1", "--reps", "1", "--warmup", "0",
                      "--page-size", "16", "--kv-dtype", "f8e4m3", "--kv-scale", "block32", "--csv", NULL};
  const char *const pq_want[] = {",f32/f8e4m3:block32,", ",flash,", ",naive,", NULL};
  check_csv_row(pq, pq_want, "--page-size --kv-dtype");
  const char *sparse[] = {"--block-sparse", "1,0.5", "--n", "128", "--d", "16", "--dtype", "f32", "--reps", "1",
                          "--batch-tokens", "128", "--hidden", "32", "--json", NULL};
  check_json_run(sparse, "block-sparse", 2);
}

/* Fields of one CSV line: commas outside double quotes, plus one. */
static int csv_fields(const char *line, size_t len) {
  int fields = 1, quoted = 0;
  for (size_t i = 0; i < len; ++i) {
    if (line[i] == '"') quoted = !quoted;
    else if (line[i] == ',' && !quoted) ++fields;
  }
  return quoted ? -1 : fields;
}

static void test_csv(void **state) {
  (void)state;
  const char *args[] = {SHAPE, "--csv", NULL};
  char *out = NULL, *err = NULL;
  const int rc = run_bench(args, &out, &err);
  FCT_CHECK(rc == 0, "flashcl-bench exited with %d:\n%s\n%s", rc, out, err);
  FCT_CHECK(!strncmp(out, "device,pass,n,d,", 16), "the header is not first:\n%s", out);
  int lines = 0, want = -1;
  for (const char *l = out; *l;) {
    const size_t len = strcspn(l, "\n");
    const int f = csv_fields(l, len);
    if (want < 0) want = f;
    FCT_CHECK(f == want && f > 1, "line %d has %d fields, the header %d:\n%s", lines + 1, f, want, out);
    ++lines;
    l += len + (l[len] == '\n');
  }
  FCT_CHECK(lines == 3, "want a header and 2 rows:\n%s", out);
  check_no_progress(err);
  free(out);
  free(err);
}

static void test_text(void **state) {
  (void)state;
  const char *args[] = {SHAPE, NULL};
  char *out = NULL, *err = NULL;
  const int rc = run_bench(args, &out, &err);
  FCT_CHECK(rc == 0, "flashcl-bench exited with %d:\n%s\n%s", rc, out, err);
  FCT_CHECK(count(out, "columns:") == 1, "no legend (once):\n%s", out);
  FCT_CHECK(strstr(out, "summary: 2 row(s): 2 ok, 0 failed, 0 OOM") != NULL, "no summary line:\n%s", out);
  FCT_CHECK(strstr(out, "best flash/naive speedup") != NULL, "no speedup in the summary:\n%s", out);
  check_no_progress(err);
  free(out);
  free(err);
}

static void test_bad_arguments(void **state) {
  (void)state;
  const char *args[] = {SHAPE, "--csv", "--json", NULL};
  char *out = NULL, *err = NULL;
  FCT_CHECK(run_bench(args, &out, &err) == 1, "--csv --json accepted");
  FCT_CHECK(strstr(err, "mutually exclusive") != NULL, "no reason given:\n%s", err);
  FCT_CHECK(*out == '\0', "stdout not empty:\n%s", out);
  free(out);
  free(err);
  const char *kv[] = {SHAPE, "--kv-dtype", "i8", NULL};
  FCT_CHECK(run_bench(kv, &out, &err) == 1 && strstr(err, "needs --decode"), "--kv-dtype without --decode:\n%s", err);
  free(out);
  free(err);
  const char *kv2[] = {SHAPE, "--page-size", "16", "--kv-dtype", "i8,f8e4m3", NULL};
  FCT_CHECK(run_bench(kv2, &out, &err) == 1 && strstr(err, "one format"), "two pool formats accepted:\n%s", err);
  free(out);
  free(err);
  const char *kvbad[] = {"--decode", "--kv-dtype", "int4", NULL};
  FCT_CHECK(run_bench(kvbad, &out, &err) == 1, "--kv-dtype int4 accepted:\n%s", err);
  free(out);
  free(err);
  const char *scale[] = {"--decode", "--kv-scale", "head", NULL};
  FCT_CHECK(run_bench(scale, &out, &err) == 1 && strstr(err, "needs --kv-dtype"), "--kv-scale alone:\n%s", err);
  free(out);
  free(err);
  const char *dvdec[] = {"--decode", "--d", "64,128", "--head-dim-v", "32", NULL};
  FCT_CHECK(run_bench(dvdec, &out, &err) == 1 && strstr(err, "--head-dim-v"),
            "--head-dim-v with --decode and two head dims:\n%s", err);
  free(out);
  free(err);
  /* --decode --head-dim-v: V and o with 32 columns, K with 64; kv_bytes counts
   * both rows: 256 keys x 8 kv heads x (64 + 32) x 4 bytes. */
  const char *dvok[] = {"--decode", "--n", "256", "--d", "64", "--head-dim-v", "32", "--dtype", "f32",
                        "--decode-batch", "1", "--reps", "1", "--warmup", "0", "--csv", NULL};
  const char *const dvok_want[] = {",64/32,f32,", ",786432,", NULL};
  check_csv_row(dvok, dvok_want, "--decode --head-dim-v 32");
}

/* --head-dim-v: v and o get their own head dim, flash and naive agree on
 * them (the relL2 column), and a head dim the library refuses is a failed row
 * with its status, not a crash. */
static void test_head_dim_v(void **state) {
  (void)state;
  const char *args[] = {"--n", "64", "--d", "32", "--head-dim-v", "16", "--dtype", "f32", "--causal", "1", "--reps",
                        "1", "--warmup", "0", "--batch-tokens", "64", "--hidden", "64", "--bwd", "--json", NULL};
  check_json_run(args, "sweep", 4);
  char *out = NULL, *err = NULL;
  const char *csv[] = {"--n", "64", "--d", "32", "--head-dim-v", "16", "--dtype", "f32", "--causal", "0", "--reps",
                       "1", "--warmup", "0", "--batch-tokens", "64", "--hidden", "64", "--csv", NULL};
  FCT_CHECK(run_bench(csv, &out, &err) == 0, "--head-dim-v --csv:\n%s\n%s", out, err);
  FCT_CHECK(strstr(out, ",64,32/16,f32,") != NULL, "no 32/16 in the d column:\n%s", out);
  const char *rel = strstr(out, "\"ok\""), *flash = strstr(out, ",flash,");
  FCT_CHECK(rel && flash, "no ok flash row:\n%s", out);
  free(out);
  free(err);
  const char *bad[] = {"--n", "64", "--d", "32", "--head-dim-v", "20", "--dtype", "f32", "--causal", "0", "--reps",
                       "1", "--warmup", "0", "--batch-tokens", "64", "--hidden", "64", "--csv", NULL};
  FCT_CHECK(run_bench(bad, &out, &err) == 1, "--head-dim-v 20 (not a multiple of 8) did not fail:\n%s\n%s", out, err);
  FCT_CHECK(count(out, "UNSUPPORTED_HEAD_DIM") == 2, "no status in the failed rows:\n%s", out);
  free(out);
  free(err);
}

/* flashcl-tune --json: a dry run of one small problem is one valid document. */
static void test_tune_json(void **state) {
  (void)state;
#ifdef FLASHCL_TUNE_EXE
  const char *args[] = {"--forward", "--d", "32", "--dtype", "f32", "--n", "96", "--causal", "0", "--params", "br,bc",
                        "--reps", "2", "--passes", "1", "--budget", "120", "--dry-run", "--json", NULL};
  char *out = NULL, *err = NULL;
  const char *where = NULL;
  const int rc = run_exe(FLASHCL_TUNE_EXE, args, &out, &err);
  FCT_CHECK(rc == 0, "flashcl-tune exited with %d:\n%s\n%s", rc, out, err);
  FCT_CHECK(json_valid(out, &where) == 0, "invalid JSON at offset %d:\n%s", (int)(where - out), out);
  FCT_CHECK(count(out, "\"status\":\"ok\"") == 1 && strstr(out, "\"entry\":\"fwd d=32"), "no tuned problem:\n%s",
            out);
  free(out);
  free(err);
  const char *both[] = {"--csv", "--json", NULL};
  FCT_CHECK(run_exe(FLASHCL_TUNE_EXE, both, &out, &err) == 1, "flashcl-tune --csv --json accepted");
  free(out);
  free(err);
#endif
}

/* The validator itself, on good and bad text. */
static void test_validator(void **state) {
  (void)state;
  const char *good[] = {"{}", "[]", " {\"a\":[1,-2.5e+3,true,false,null,\"x\\u00e9\\n\"]} ", "0", "\"\""};
  const char *bad[] = {"", "{", "{\"a\":}", "[1,]", "{\"a\" 1}", "01", "1.", "\"\t\"", "[1] [2]", "nul", "{a:1}"};
  const char *where = NULL;
  for (size_t i = 0; i < sizeof good / sizeof good[0]; ++i)
    FCT_CHECK(json_valid(good[i], &where) == 0, "rejected: %s", good[i]);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
    FCT_CHECK(json_valid(bad[i], &where) != 0, "accepted: %s", bad[i]);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/flashcl-bench-test-XXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_validator), cmocka_unit_test(test_bad_arguments), cmocka_unit_test(test_head_dim_v),
      cmocka_unit_test(test_json),
      cmocka_unit_test(test_csv),       cmocka_unit_test(test_text),          cmocka_unit_test(test_tune_json),
  };
  const int rc = fct_run_group("bench_tool", tests, sizeof tests / sizeof tests[0], 1);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return rc;
}
