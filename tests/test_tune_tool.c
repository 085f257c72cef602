/*
 * flashcl-tune end to end: it tunes a small space on the test device and writes
 * a tuning file; a new context loads that file, reports the tuned
 * configuration with the file as its source, and runs it correctly. A run
 * killed part-way resumes from its journal; a journal for another device is
 * not trusted; bad arguments are refused. --against compares a file's entries
 * with the library's own, and --start starts the search from a file.
 *
 * The tool runs as a child process (FLASHCL_TUNE_EXE) with its own cache
 * directory, so nothing here touches the user's.
 */
#include "common.h"
#include "../tools/tune_rule.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef FLASHCL_TUNE_EXE
#error "FLASHCL_TUNE_EXE must name the flashcl-tune executable"
#endif

static char tmpdir[64];

/* Starts flashcl-tune with args (NULL-terminated), stdout and stderr to
 * log_path; returns the child's pid. */
static pid_t start_tool(const char *const *args, const char *log_path) {
  const char *argv[32];
  int n = 0;
  argv[n++] = FLASHCL_TUNE_EXE;
  for (int i = 0; args[i] && n < 31; ++i) argv[n++] = args[i];
  argv[n] = NULL;
  fflush(NULL);
  const pid_t pid = fork();
  FCT_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    FILE *log = freopen(log_path, "w", stdout);
    if (!log || dup2(fileno(stdout), 2) < 0) _exit(126);
    setenv("FLASHCL_CACHE_DIR", tmpdir, 0); /* the suite names its own; else a private one */
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static int wait_tool(pid_t pid) {
  int status = 0;
  FCT_CHECK(waitpid(pid, &status, 0) == pid, "waitpid failed");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* The whole of a small text file (malloc'ed), "" when missing. */
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

static int run_tool(const char *const *args, char **log) {
  char log_path[128];
  snprintf(log_path, sizeof log_path, "%s/tool.log", tmpdir);
  const int rc = wait_tool(start_tool(args, log_path));
  *log = slurp(log_path);
  return rc;
}

static int count_lines(const char *text, const char *prefix) {
  int n = 0;
  const size_t len = strlen(prefix);
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    n += strncmp(l, prefix, len) == 0;
  return n;
}

/* The tuning of the file's entry that starts with `selector` (up to ':'). */
static void entry_tuning(const char *text, const char *selector, flashcl_tuning *t) {
  const char *l = strstr(text, selector);
  FCT_CHECK(l != NULL, "no entry \"%s\" in:\n%s", selector, text);
  char line[512], spec[560];
  const size_t len = strcspn(l, "\n");
  FCT_CHECK(len < sizeof line, "entry too long");
  memcpy(line, l, len), line[len] = '\0';
  const char *colon = strchr(line, ':');
  FCT_CHECK(colon != NULL, "entry without ':': %s", line);
  snprintf(spec, sizeof spec, "fwd %s", colon + 1);
  FCT_CHECK_STATUS(flashcl_tuning_parse(NULL, spec, t), FLASHCL_SUCCESS, "parse %s", spec);
}

static const char *const tune_args[] = {"--forward", "--d", "32", "--dtype", "f32", "--n", "96", "--params",
                                        "br,bc",     "--reps", "2", "--passes", "1", "--quiet"};
#define NARGS (sizeof tune_args / sizeof tune_args[0])

/* tune_args, then extra (NULL-terminated), into out. */
static void make_args(const char **out, const char *const *extra) {
  size_t n = 0;
  for (size_t i = 0; i < NARGS; ++i) out[n++] = tune_args[i];
  for (size_t i = 0; extra[i]; ++i) out[n++] = extra[i];
  out[n] = NULL;
}

static void test_tune_and_load(void **state) {
  (void)state;
  char out[128], *log = NULL;
  const char *args[32];
  snprintf(out, sizeof out, "%s/small.tune", tmpdir);
  const char *extra[] = {"--causal", "0,1", "--budget", "300", "--output", out, NULL};
  make_args(args, extra);
  const int rc = run_tool(args, &log);
  FCT_CHECK(rc == 0, "flashcl-tune exited with %d:\n%s", rc, log);
  FCT_CHECK(strstr(log, "a new context loads it") != NULL, "the tool did not verify its file:\n%s", log);
  free(log);
  char *text = slurp(out);
  FCT_CHECK(count_lines(text, "fwd d=32 dtype=f32 causal=") == 2, "want two entries:\n%s", text);
  FCT_CHECK(count_lines(text, "vendor ") == 1 && count_lines(text, "device ") == 1, "no device header:\n%s", text);

  fct_env *env = fct_env_get();
  flashcl_context_options opt;
  flashcl_context *ctx = NULL;
  flashcl_context_options_init(&opt);
  opt.tuning_file = out;
  opt.no_user_tuning = 1;
  FCT_CHECK_STATUS(flashcl_context_create_from_cl(env->cl_ctx, env->device, env->queue, &opt, &ctx), FLASHCL_SUCCESS,
                   "context on the tuned file");
  FCT_CHECK(strstr(flashcl_context_tuning_log(ctx), "loaded (tuning file, 2 entries)") != NULL,
            "tuning log:\n%s", flashcl_context_tuning_log(ctx));
  for (int causal = 0; causal <= 1; ++causal) {
    char sel[64];
    flashcl_tuning want;
    snprintf(sel, sizeof sel, "fwd d=32 dtype=f32 causal=%d :", causal);
    entry_tuning(text, sel, &want);
    fct_tensor q, o; /* o apart: outputs may not overlap inputs */
    flashcl_attention_desc desc;
    flashcl_config cfg;
    fct_tensor_create(&q, FLASHCL_F32, FCT_BNHD, 1, 96, 2, 32, 1);
    fct_tensor_create(&o, FLASHCL_F32, FCT_BNHD, 1, 96, 2, 32, 2);
    flashcl_attention_desc_init(&desc);
    desc.mask.causal = causal;
    const flashcl_status st = flashcl_attention_config(ctx, &desc, &q.t, &q.t, &q.t, &o.t, FLASHCL_PASS_FORWARD, &cfg);
    fct_tensor_release(&q);
    fct_tensor_release(&o);
    FCT_CHECK(st == FLASHCL_SUCCESS, "config causal=%d: %s: %s", causal, flashcl_status_string(st),
              flashcl_context_last_error(ctx));
    FCT_CHECK(cfg.source == FLASHCL_TUNING_SOURCE_FILE && strcmp(cfg.origin, out) == 0,
              "causal=%d: source %s (%s), want the tuned file", causal, flashcl_tuning_source_name(cfg.source),
              cfg.origin);
    FCT_CHECK(cfg.set.count == want.count, "causal=%d: %d parameters set, the entry has %d", causal, cfg.set.count,
              want.count);
    for (int i = 0; i < want.count; ++i) {
      int v = -1;
      FCT_CHECK(flashcl_tuning_get(&cfg.tuning, want.params[i].name, &v) == FLASHCL_SUCCESS &&
                    v == want.params[i].value,
                "causal=%d: %s runs as %d, the file says %d", causal, want.params[i].name, v, want.params[i].value);
    }
    /* The tuned configuration, run: exact against the double reference. */
    const fct_case c = {FLASHCL_F32, 2, 96, 96, 2, 2, 32, causal, 0.0f, FCT_BNHD};
    const fct_run run = {FLASHCL_ALGO_FLASH, 0, 0, FLASHCL_KERNEL_AUTO, NULL};
    flashcl_context *group = env->ctx;
    env->ctx = ctx;
    fct_check_case(&c, &run);
    env->ctx = group;
  }
  flashcl_context_destroy(ctx);
  free(text);
  remove(out);
}

/* Waits until the journal holds a finished problem; 0 on timeout. */
static int wait_for_journal(const char *journal, pid_t pid, double seconds) {
  for (double waited = 0; waited < seconds; waited += 0.02) {
    char *j = slurp(journal);
    const int done = count_lines(j, "done\t");
    free(j);
    if (done >= 1) return 1;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return 0;
    const struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

static void test_resume(void **state) {
  (void)state;
  char out[128], journal[160], log_path[128], *log = NULL;
  const char *args[32];
  snprintf(out, sizeof out, "%s/resume.tune", tmpdir);
  snprintf(journal, sizeof journal, "%s.journal", out);
  snprintf(log_path, sizeof log_path, "%s/killed.log", tmpdir);
  const char *extra[] = {"--causal", "0,1", "--budget", "300", "--output", out, NULL};
  make_args(args, extra);
  const pid_t pid = start_tool(args, log_path);
  const int got = wait_for_journal(journal, pid, 240.0);
  kill(pid, SIGKILL);
  const int rc = wait_tool(pid);
  FCT_CHECK(got, "the journal never recorded a finished problem (exit %d):\n%s", rc, slurp(log_path));
  char *j = slurp(journal);
  FCT_CHECK(rc == 128 + SIGKILL && count_lines(j, "done\t") == 1, "killed run: exit %d, journal:\n%s", rc, j);
  free(j);
  FCT_CHECK(access(out, F_OK) != 0, "a killed run left a tuning file");

  const int rc2 = run_tool(args, &log);
  FCT_CHECK(rc2 == 0 && strstr(log, "resuming: 1 problem(s) already tuned"), "resumed run: exit %d:\n%s", rc2, log);
  FCT_CHECK(count_lines(log, "[1/2]") == 0 && count_lines(log, "[2/2]") == 1, "the resumed run redid work:\n%s", log);
  free(log);
  char *text = slurp(out);
  FCT_CHECK(count_lines(text, "fwd d=32 dtype=f32 causal=") == 2, "resumed file:\n%s", text);
  free(text);
  FCT_CHECK(access(journal, F_OK) != 0, "the journal was left behind");

  /* A journal from another device is not trusted. */
  FILE *f = fopen(journal, "w");
  FCT_CHECK(f != NULL, "cannot write %s", journal);
  fputs("# flashcl-tune journal 1\nflashcl-tuning 1\nvendor Nobody\ndevice Other\n#end-header\n"
        "done\tforward d=32 f32 causal=0 n=96 batch=5 heads=8\tfwd d=32 dtype=f32 causal=0 : br=8\tx\n", f);
  fclose(f);
  const char *extra1[] = {"--causal", "0", "--budget", "120", "--output", out, NULL};
  make_args(args, extra1);
  const int rc3 = run_tool(args, &log);
  FCT_CHECK(rc3 == 0 && strstr(log, "not resuming") && strstr(log, "another device"), "exit %d:\n%s", rc3, log);
  free(log);
  text = slurp(out);
  FCT_CHECK(!strstr(text, "br=8\n") && count_lines(text, "fwd d=32 dtype=f32 causal=0 :") == 1, "file:\n%s", text);
  free(text);
  remove(out);
}

/* The tuner's "faster" rule: the margin follows the noise between 0.3% and
 * 1%, and most rounds must agree. */
static void test_faster_rule(void **state) {
  (void)state;
  /* Quiet sides (0.1%): a 0.5% step in 11 of 11 rounds is kept, a 0.2% one is not. */
  FCT_CHECK(tune_faster(100.0, 0.001, 99.5, 0.001, 11, 11), "0.5%% at 0.1%% noise");
  FCT_CHECK(!tune_faster(100.0, 0.001, 99.8, 0.001, 11, 11), "0.2%% is under the 0.3%% floor");
  /* Noise 0.4% on one side: the margin is 0.8%. */
  FCT_CHECK(!tune_faster(100.0, 0.004, 99.3, 0.001, 11, 11), "0.7%% at 0.4%% noise");
  FCT_CHECK(tune_faster(100.0, 0.001, 99.1, 0.004, 11, 11), "0.9%% at 0.4%% noise");
  /* Noisy sides: never more than 1% is asked. */
  FCT_CHECK(tune_faster(100.0, 0.05, 98.9, 0.05, 4, 4), "1.1%% at 5%% noise");
  FCT_CHECK(!tune_faster(100.0, 0.05, 99.2, 0.05, 4, 4), "0.8%% at 5%% noise");
  /* Rounds: 3 of 4 at least. */
  FCT_CHECK(tune_faster(100.0, 0.001, 98.0, 0.001, 9, 12), "9 of 12 rounds");
  FCT_CHECK(!tune_faster(100.0, 0.001, 98.0, 0.001, 8, 12), "8 of 12 rounds");
  /* Slower is never faster. */
  FCT_CHECK(!tune_faster(100.0, 0.0, 101.0, 0.0, 11, 11), "slower median");
}

static void test_bad_arguments(void **state) {
  (void)state;
  char *log = NULL;
  const char *const budget[] = {"--budget", "0", NULL};
  const char *const family[] = {"--family", "nonsense", NULL};
  const char *const list[] = {"--list", NULL};
  int rc = run_tool(budget, &log);
  FCT_CHECK(rc == 1 && strstr(log, "bad value"), "--budget 0: exit %d:\n%s", rc, log);
  free(log);
  rc = run_tool(family, &log);
  FCT_CHECK(rc == 1 && strstr(log, "bad value"), "--family nonsense: exit %d:\n%s", rc, log);
  free(log);
  rc = run_tool(list, &log);
  FCT_CHECK(rc == 0 && strstr(log, "fwd\n") && strstr(log, "decode\n") && strstr(log, "searched: 16 32 48"),
            "--list: exit %d:\n%s", rc, log);
  free(log);
}

/* --against: the file's entry is compared with the library's own choice in one
 * process, a problem the file does not cover is reported as the same
 * configuration, and a file that does not load is refused. --start: the search
 * starts from its file. */
static void test_against_and_start(void **state) {
  (void)state;
  char file[128], bad[128], *log = NULL;
  snprintf(file, sizeof file, "%s/against.tune", tmpdir);
  snprintf(bad, sizeof bad, "%s/bad.tune", tmpdir);
  FILE *f = fopen(file, "w");
  FCT_CHECK(f != NULL, "cannot write %s", file);
  fputs("fwd d=32 dtype=f32 causal=0 : br=16 bc=16\n", f);
  fclose(f);
  f = fopen(bad, "w");
  FCT_CHECK(f != NULL, "cannot write %s", bad);
  fputs("fwd d=32 : no_such_parameter=3\n", f);
  fclose(f);

  const char *const against[] = {"--against", file, "--forward", "--d", "32", "--dtype", "f32", "--n", "96",
                                 "--causal", "0,1", "--reps", "1", "--csv", NULL};
  int rc = run_tool(against, &log);
  FCT_CHECK(rc == 0, "--against: exit %d:\n%s", rc, log);
  FCT_CHECK(count_lines(log, "device,problem,kernel_a,") == 1 && count_lines(log, "\"") == 2, "rows:\n%s", log);
  const char *row0 = strstr(log, "causal=0 n=96"), *row1 = strstr(log, "causal=1 n=96");
  FCT_CHECK(row0 && row1, "no row per problem:\n%s", log);
  char origin[200];
  snprintf(origin, sizeof origin, "\"%s\",\"fwd br=16 bc=16\",0,0,", file);
  FCT_CHECK(strstr(row0, origin) != NULL && strstr(row0, origin) < strchr(row0, '\n'), "causal=0 row:\n%s", log);
  double a_ms = 0, b_ms = 0;
  const char *nums = strstr(row0, origin) + strlen(origin);
  FCT_CHECK(sscanf(strchr(nums, ',') + 1, "%lf,%lf", &a_ms, &b_ms) == 2 && a_ms > 0 && b_ms > 0,
            "causal=0 row has no times:\n%s", log);
  FCT_CHECK(strstr(row1, ",1,0,") != NULL && strstr(row1, ",1,0,") < strchr(row1, '\n'),
            "causal=1 is not covered by the file: want the same configuration:\n%s", log);
  free(log);

  const char *const against_bad[] = {"--against", bad, "--forward", "--d", "32", "--dtype", "f32", "--n", "96",
                                     "--causal", "0", NULL};
  rc = run_tool(against_bad, &log);
  FCT_CHECK(rc == 2 && strstr(log, "was not loaded") && strstr(log, "no_such_parameter"), "bad file: exit %d:\n%s",
            rc, log);
  free(log);
  const char *const start_bad[] = {"--start", bad, "--forward", "--d", "32", "--dtype", "f32", "--n", "96", NULL};
  rc = run_tool(start_bad, &log);
  FCT_CHECK(rc == 2 && strstr(log, "was not loaded"), "--start with a bad file: exit %d:\n%s", rc, log);
  free(log);

  char from[200];
  const char *const start[] = {"--start", file, "--forward", "--d", "32", "--dtype", "f32", "--n", "96", "--causal",
                               "0", "--params", "br", "--reps", "1", "--passes", "1", "--dry-run", "--verbose",
                               NULL};
  rc = run_tool(start, &log);
  snprintf(from, sizeof from, "from %s", file);
  FCT_CHECK(rc == 0 && strstr(log, from), "--start: exit %d, want the search to start %s:\n%s", rc, from, log);
  free(log);
  remove(file);
  remove(bad);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/flashcl-tune-test-XXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_faster_rule),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_tune_and_load),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_against_and_start),
  };
  const int rc = fct_run_group("tune_tool", tests, sizeof tests / sizeof tests[0], 1);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return rc;
}
