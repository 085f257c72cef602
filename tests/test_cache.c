/*
 * The on-disk program cache (src/core/binary_cache.c): entries written by a first
 * context are loaded by the next one, in this process and in fresh ones;
 * truncated, corrupt, stale or foreign entries are rejected, rebuilt and
 * rewritten; two processes filling one cache at once both succeed and leave
 * whole entries only; no_binary_cache = 1 touches nothing; the directory is
 * kept under its size limit, least recently used entries first; and the
 * statistics getter refuses NULL arguments.
 *
 * Every context here names its own fresh cache directory (mkdtemp), removed at
 * the end of its test. Fresh processes are this executable again, started
 * through fork + exec in its child mode:
 *   test_cache --child <dir> <expect> [<ready fd> <go fd>]
 * which runs the forward on a context over <dir>, prints its statistics and
 * exits 0 when the result is right and the statistics match <expect>.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The problem: small enough to run in milliseconds, large enough for several
 * tiles of the portable forward. */
enum { B = 1, N = 64, H = 2, D = 32 };
#define ELEMS ((size_t)B * N * H * D)
#define ROWS ((size_t)B * N * H)

static const char *g_self; /* this executable, for the fresh processes */

/* ------------------------------------------------------------ forward -- */

static double rel_l2(const float *got, const double *want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = (double)got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

static cl_mem upload(cl_context cc, const void *host, size_t bytes, char *err, size_t cap) {
  cl_int e = CL_SUCCESS;
  cl_mem m = clCreateBuffer(cc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, (void *)host, &e);
  if (e != CL_SUCCESS) snprintf(err, cap, "clCreateBuffer: %d", (int)e);
  return e == CL_SUCCESS ? m : NULL;
}

/* Runs a (1, 64, 2, 32) fp32 forward with fresh random inputs and NaN-poisoned
 * outputs on ctx and compares O and LSE with the double reference. 0 when
 * right; else -1 with the reason in err. No cmocka calls: the child mode
 * runs it too. */
static int check_forward(flashcl_context *ctx, const char *tag, char *err, size_t cap) {
  static float q[ELEMS], k[ELEMS], v[ELEMS], o[ELEMS], lse[ROWS];
  static double ref_o[ELEMS], ref_lse[ROWS];
  fct_rng rng;
  fct_rng_init(&rng, tag);
  for (size_t i = 0; i < ELEMS; i++) {
    q[i] = (float)fct_rng_normal(&rng);
    k[i] = (float)fct_rng_normal(&rng);
    v[i] = (float)fct_rng_normal(&rng);
    o[i] = NAN;
  }
  for (size_t i = 0; i < ROWS; i++) lse[i] = NAN;
  const ref_attention_params rp = {0.0, 0, NULL, NULL, 0};
  ref_tensor rq = {q, ref_load_f32, 0, {B, N, H, D}, {N * H * D, H * D, D, 1}};
  ref_tensor rk = rq, rv = rq;
  rk.data = k;
  rv.data = v;
  const ref_out ro = ref_out_bnhd(ref_o, B, N, H, D);
  const ref_out rl = {ref_lse, {B, N, H, 1}, {N * H, H, 1, 1}};
  if (ref_attention_forward(&rp, &rq, &rk, &rv, &ro, &rl) != 0) return snprintf(err, cap, "reference failed"), -1;

  cl_context cc = flashcl_context_cl_context(ctx);
  cl_mem m[5] = {upload(cc, q, sizeof q, err, cap), upload(cc, k, sizeof k, err, cap), upload(cc, v, sizeof v, err, cap),
                 upload(cc, o, sizeof o, err, cap), upload(cc, lse, sizeof lse, err, cap)};
  int rc = -1;
  if (m[0] && m[1] && m[2] && m[3] && m[4]) {
    flashcl_tensor t[4], tl;
    for (int i = 0; i < 4; i++) flashcl_tensor_init_bnhd(&t[i], m[i], 0, FLASHCL_F32, B, N, H, D);
    flashcl_tensor_init_lse(&tl, m[4], 0, B, N, H);
    flashcl_attention_desc desc;
    flashcl_attention_desc_init(&desc);
    const flashcl_status st = flashcl_attention_forward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], &tl, 0, NULL, NULL);
    cl_command_queue cq = flashcl_context_cl_queue(ctx);
    const cl_int e1 = clEnqueueReadBuffer(cq, m[3], CL_TRUE, 0, sizeof o, o, 0, NULL, NULL);
    const cl_int e2 = clEnqueueReadBuffer(cq, m[4], CL_TRUE, 0, sizeof lse, lse, 0, NULL, NULL);
    /* LSE is laid out (B, H, N) on the device, (B, N, H) in the reference. */
    static float lse_bnh[ROWS];
    for (size_t h = 0; h < H; h++)
      for (size_t n = 0; n < N; n++) lse_bnh[n * H + h] = lse[h * N + n];
    const double eo = rel_l2(o, ref_o, ELEMS), el = rel_l2(lse_bnh, ref_lse, ROWS);
    if (st != FLASHCL_SUCCESS)
      snprintf(err, cap, "forward: %s: %s", flashcl_status_string(st), flashcl_context_last_error(ctx));
    else if (e1 != CL_SUCCESS || e2 != CL_SUCCESS)
      snprintf(err, cap, "read back: %d %d", (int)e1, (int)e2);
    else if (!(eo <= 1e-5) || !(el <= 1e-5))
      snprintf(err, cap, "rel-L2 error O %g, LSE %g (limit 1e-5)", eo, el);
    else
      rc = 0;
  }
  for (int i = 0; i < 5; i++)
    if (m[i]) clReleaseMemObject(m[i]);
  return rc;
}

/* A tuning file for open_ctx (NULL: $FLASHCL_TUNING, which main points at an
 * override with "context : binary_cache=1", since a device's built-in tuning
 * may turn the cache off, as PoCL's does). */
static const char *g_tuning_file = NULL;
/* flashcl_context_options.cache_max_bytes for open_ctx (0: the default). */
static uint64_t g_cache_max = 0;

static flashcl_status open_ctx(const char *dir, int no_binary_cache, flashcl_context **ctx) {
  flashcl_context_options opt;
  flashcl_context_options_init(&opt);
  opt.tuning_file = g_tuning_file;
  const char *verbose = getenv("FLASHCL_TEST_VERBOSE");
  opt.verbose = verbose && *verbose ? atoi(verbose) : 0;
  opt.cache_dir = dir;
  opt.no_binary_cache = no_binary_cache;
  opt.no_user_tuning = 1;
  opt.cache_max_bytes = g_cache_max;
  *ctx = NULL;
  return flashcl_context_create(&opt, ctx);
}

/* A context over dir runs the forward (checked); returns its statistics. */
static flashcl_context_stats run_in_process(const char *dir, int no_binary_cache, const char *what) {
  flashcl_context *ctx = NULL;
  flashcl_context_stats s;
  char err[1024] = "";
  FCT_CHECK_STATUS(open_ctx(dir, no_binary_cache, &ctx), FLASHCL_SUCCESS, "%s: context_create", what);
  const int rc = check_forward(ctx, what, err, sizeof err);
  memset(&s, 0xA5, sizeof s);
  const flashcl_status st = flashcl_context_stats_get(ctx, &s);
  flashcl_context_destroy(ctx);
  FCT_CHECK(rc == 0, "%s: %s", what, err);
  FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "%s: stats_get", what);
  print_message("[ STATS    ] %-28s built %u, from cache %u, rejected %u, written %u\n", what, s.programs_built,
                s.programs_from_cache, s.cache_rejected, s.cache_written);
  return s;
}

/* ---------------------------------------------------------- the child -- */

/* Waits for the parent's go (a byte on go_fd) after telling it, through
 * ready_fd, that the context exists: both children then build together. */
static int child_barrier(int ready_fd, int go_fd) {
  char c = 'r';
  if (write(ready_fd, &c, 1) != 1) return -1;
  return read(go_fd, &c, 1) == 1 ? 0 : -1;
}

/* expect: "warm" (built, written, nothing loaded), "hot" (nothing built,
 * loaded), "rejected" (a bad entry rejected, rebuilt, rewritten), "any". */
static int child_main(int argc, char **argv) {
  const char *dir = argv[2], *expect = argv[3];
  flashcl_context *ctx = NULL;
  char err[1024] = "";
  if (open_ctx(dir, 0, &ctx) != FLASHCL_SUCCESS) return fprintf(stdout, "child: no context\n"), 3;
  if (argc >= 6 && child_barrier(atoi(argv[4]), atoi(argv[5])) != 0) return fprintf(stdout, "child: barrier\n"), 3;
  const int rc = check_forward(ctx, "fresh process", err, sizeof err);
  flashcl_context_stats s;
  flashcl_context_stats_get(ctx, &s);
  flashcl_context_destroy(ctx);
  printf("child %ld: built %u, from cache %u, rejected %u, written %u\n", (long)getpid(), s.programs_built,
         s.programs_from_cache, s.cache_rejected, s.cache_written);
  if (rc != 0) return printf("child: %s\n", err), 1;
  int ok = 1;
  if (strcmp(expect, "warm") == 0)
    ok = s.programs_built >= 1 && s.cache_written >= 1 && s.programs_from_cache == 0 && s.cache_rejected == 0;
  else if (strcmp(expect, "hot") == 0)
    ok = s.programs_built == 0 && s.programs_from_cache >= 1 && s.cache_rejected == 0 && s.cache_written == 0;
  else if (strcmp(expect, "rejected") == 0)
    ok = s.cache_rejected >= 1 && s.programs_built >= 1 && s.cache_written >= 1;
  if (!ok) printf("child: statistics do not match \"%s\"\n", expect);
  return ok ? 0 : 2;
}

/* Starts this executable in child mode; extra fds stay open across exec. */
static pid_t spawn_child(const char *dir, const char *expect, int ready_fd, int go_fd, int stderr_fd) {
  char rfd[16], gfd[16];
  snprintf(rfd, sizeof rfd, "%d", ready_fd);
  snprintf(gfd, sizeof gfd, "%d", go_fd);
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  FCT_CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    if (stderr_fd >= 0) dup2(stderr_fd, 2);
    if (ready_fd >= 0)
      execl(g_self, g_self, "--child", dir, expect, rfd, gfd, (char *)NULL);
    else
      execl(g_self, g_self, "--child", dir, expect, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static void wait_child(pid_t pid, const char *what) {
  int status = 0;
  pid_t got;
  do got = waitpid(pid, &status, 0);
  while (got < 0 && errno == EINTR);
  FCT_CHECK(got == pid, "%s: waitpid: %s", what, strerror(errno));
  FCT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the child %s %d (see its output above)", what,
            WIFEXITED(status) ? "exited with" : "was killed by signal",
            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

static void run_child(const char *dir, const char *expect, const char *what) {
  wait_child(spawn_child(dir, expect, -1, -1, -1), what);
}

/* ---------------------------------------------------------- the files -- */

typedef struct cache_dir {
  char root[64];
  char programs[96];
} cache_dir;

static void dir_create(cache_dir *d) {
  snprintf(d->root, sizeof d->root, "/tmp/flashcl-bincache-XXXXXX");
  FCT_CHECK(mkdtemp(d->root) != NULL, "mkdtemp: %s", strerror(errno));
  snprintf(d->programs, sizeof d->programs, "%s/programs", d->root);
}

/* The names in programs/ (up to cap), counting those that hold ".tmp". */
static int list_entries(const cache_dir *d, char names[][256], int cap, int *tmp_files) {
  int n = 0;
  *tmp_files = 0;
  DIR *dp = opendir(d->programs);
  if (!dp) return 0;
  struct dirent *e;
  while ((e = readdir(dp)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (strstr(e->d_name, ".tmp")) (*tmp_files)++;
    if (n < cap) snprintf(names[n], 256, "%s", e->d_name);
    n++;
  }
  closedir(dp);
  return n;
}

static void dir_remove(cache_dir *d) {
  char names[64][256], path[512];
  int tmp;
  const int n = list_entries(d, names, 64, &tmp);
  for (int i = 0; i < n && i < 64; i++) {
    snprintf(path, sizeof path, "%s/%.255s", d->programs, names[i]);
    unlink(path);
  }
  rmdir(d->programs);
  FCT_CHECK(rmdir(d->root) == 0, "cannot remove %s: %s", d->root, strerror(errno));
}

static long file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static unsigned char *read_file(const char *path, long *len) {
  *len = file_size(path);
  FCT_CHECK(*len >= 0, "stat %s", path);
  unsigned char *buf = malloc((size_t)*len + 1);
  FILE *f = fopen(path, "rb");
  FCT_CHECK(buf && f && fread(buf, 1, (size_t)*len, f) == (size_t)*len, "cannot read %s", path);
  fclose(f);
  return buf;
}

static void write_file(const char *path, const unsigned char *data, long len) {
  FILE *f = fopen(path, "wb");
  FCT_CHECK(f && fwrite(data, 1, (size_t)len, f) == (size_t)len && fclose(f) == 0, "cannot write %s", path);
}

/* ---- the entry checksum, as src/core/binary_cache.c documents it: forging a
 * well-formed entry is the only way to reach the driver with a bad binary. */

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void hash_bytes(uint64_t *a, uint64_t *b, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    *a = (*a ^ p[i]) * 0x100000001b3ull;
    *b = (*b + p[i] + 0x51ull) * 0x9e3779b97f4a7c15ull;
    *b ^= *b >> 29;
  }
}

static uint64_t avalanche(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  return x ^ (x >> 32);
}

static uint64_t entry_checksum(const unsigned char *key16, const unsigned char *data, size_t n) {
  const uint64_t seed = 0x636b73756dull;
  uint64_t a = 0xcbf29ce484222325ull ^ seed, b = 0x6a09e667f3bcc909ull + seed;
  unsigned char len[8];
  put_u64(len, 16);
  hash_bytes(&a, &b, len, 8);
  hash_bytes(&a, &b, key16, 16);
  put_u64(len, (uint64_t)n);
  hash_bytes(&a, &b, len, 8);
  hash_bytes(&a, &b, data, n);
  const uint64_t x = avalanche(a ^ ((b << 23) | (b >> 41)));
  return x ^ avalanche(b + x);
}

enum { HEADER = 48 };

typedef enum corruption {
  TRUNCATE_HALF,   /* the file cut to half its length */
  FLIP_PAYLOAD,    /* one payload byte changed */
  ZERO_LENGTH,     /* an empty file */
  GARBAGE,         /* random bytes, no header */
  FLIP_KEY,        /* the header names another key (a stale entry) */
  FLIP_VERSION,    /* another format version */
  EXTRA_BYTES,     /* bytes past the payload */
  FORGED_BINARY,   /* a well-formed entry whose binary the driver must refuse */
  CORRUPTION_COUNT
} corruption;

static const char *corruption_name(corruption c) {
  static const char *names[] = {"truncated to half", "payload byte flipped", "zero length", "garbage",
                                "key flipped",       "version changed",      "extra bytes", "forged binary"};
  return names[c];
}

static void corrupt_entry(const char *path, corruption c, fct_rng *rng) {
  long len;
  unsigned char *buf = read_file(path, &len);
  FCT_CHECK(len > HEADER + 16, "%s is only %ld bytes", path, len);
  unsigned char *junk = malloc(4096);
  for (int i = 0; i < 4096; i++) junk[i] = (unsigned char)fct_rng_u64(rng);
  switch (c) {
  case TRUNCATE_HALF: write_file(path, buf, len / 2); break;
  case FLIP_PAYLOAD: buf[HEADER + (len - HEADER) / 2] ^= 0x40; write_file(path, buf, len); break;
  case ZERO_LENGTH: write_file(path, buf, 0); break;
  case GARBAGE: write_file(path, junk, 4096); break;
  case FLIP_KEY: buf[20] ^= 1; write_file(path, buf, len); break;
  case FLIP_VERSION: buf[8] ^= 2; write_file(path, buf, len); break;
  case EXTRA_BYTES: {
    FILE *f = fopen(path, "ab");
    FCT_CHECK(f && fwrite(junk, 1, 7, f) == 7 && fclose(f) == 0, "cannot append to %s", path);
    break;
  }
  case FORGED_BINARY: {
    /* Keep the header's key, replace the payload by junk with its right
     * length and checksum: every file check passes, the driver must not. */
    buf = realloc(buf, HEADER + 4096);
    FCT_CHECK(buf != NULL, "out of memory");
    memcpy(buf + HEADER, junk, 4096);
    put_u64(buf + 32, 4096);
    put_u64(buf + 40, entry_checksum(buf + 16, buf + HEADER, 4096));
    write_file(path, buf, HEADER + 4096);
    break;
  }
  default: break;
  }
  free(junk);
  free(buf);
}

/* Applies c to every entry; returns how many there were. */
static int corrupt_all(const cache_dir *d, corruption c, fct_rng *rng) {
  char names[64][256], path[512];
  int tmp;
  const int n = list_entries(d, names, 64, &tmp);
  for (int i = 0; i < n && i < 64; i++) {
    snprintf(path, sizeof path, "%s/%.255s", d->programs, names[i]);
    corrupt_entry(path, c, rng);
  }
  return n;
}

/* -------------------------------------------------------------- tests -- */

/* 1. A second context on the same directory loads what the first wrote. */
static void test_write_then_load(void **state) {
  cache_dir d;
  (void)state;
  dir_create(&d);
  flashcl_context_stats a = run_in_process(d.root, 0, "first context");
  FCT_CHECK(a.programs_built >= 1 && a.cache_written >= 1 && a.programs_from_cache == 0 && a.cache_rejected == 0,
            "first context: built %u, written %u, from cache %u, rejected %u", a.programs_built, a.cache_written,
            a.programs_from_cache, a.cache_rejected);
  char names[64][256];
  int tmp;
  const int n = list_entries(&d, names, 64, &tmp);
  FCT_CHECK(n == (int)a.cache_written && tmp == 0, "%d files (%d temporary) after %u writes", n, tmp,
            a.cache_written);
  for (int i = 0; i < n && i < 64; i++)
    FCT_CHECK(strlen(names[i]) == 36 && strcmp(names[i] + 32, ".bin") == 0 &&
                  strspn(names[i], "0123456789abcdef") == 32,
              "entry name %s is not <32 hex>.bin", names[i]);
  struct stat sb;
  FCT_CHECK(stat(d.programs, &sb) == 0 && (sb.st_mode & 0777) == 0700, "programs/ has mode %o, want 700",
            (unsigned)(sb.st_mode & 0777));
  flashcl_context_stats b = run_in_process(d.root, 0, "second context");
  FCT_CHECK(b.programs_built == 0 && b.programs_from_cache >= 1 && b.cache_rejected == 0 && b.cache_written == 0,
            "second context: built %u, from cache %u, rejected %u, written %u", b.programs_built,
            b.programs_from_cache, b.cache_rejected, b.cache_written);
  dir_remove(&d);
}

/* 2. Fresh processes: one fills the cache, the next builds nothing. */
static void test_fresh_process(void **state) {
  cache_dir d;
  (void)state;
  dir_create(&d);
  run_child(d.root, "warm", "the warming process");
  run_child(d.root, "hot", "the second process");
  dir_remove(&d);
}

/* 3. Each kind of bad entry is rejected, rebuilt and rewritten; the rewritten
 * entry then loads. A process that meets bad entries prints nothing. */
static void test_corrupt_entries(void **state) {
  cache_dir d;
  fct_rng rng;
  (void)state;
  fct_rng_init(&rng, "corrupt entries");
  dir_create(&d);
  run_in_process(d.root, 0, "warm");
  for (int c = 0; c < CORRUPTION_COUNT; c++) {
    char what[64];
    snprintf(what, sizeof what, "%s", corruption_name((corruption)c));
    FCT_CHECK(corrupt_all(&d, (corruption)c, &rng) >= 1, "%s: no entry to corrupt", what);
    flashcl_context_stats s = run_in_process(d.root, 0, what);
    FCT_CHECK(s.cache_rejected >= 1 && s.programs_built >= 1 && s.cache_written >= 1 && s.programs_from_cache == 0,
              "%s: rejected %u, built %u, written %u, from cache %u", what, s.cache_rejected, s.programs_built,
              s.cache_written, s.programs_from_cache);
    s = run_in_process(d.root, 0, "after the rewrite");
    FCT_CHECK(s.programs_built == 0 && s.programs_from_cache >= 1 && s.cache_rejected == 0,
              "%s, rewritten: built %u, from cache %u, rejected %u", what, s.programs_built, s.programs_from_cache,
              s.cache_rejected);
  }
  /* Silence: a non-verbose process that rejects and rewrites prints nothing. */
  corrupt_all(&d, TRUNCATE_HALF, &rng);
  char errpath[] = "/tmp/flashcl-bincache-stderr-XXXXXX";
  const int fd = mkstemp(errpath);
  FCT_CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
  const char *verbose = getenv("FLASHCL_TEST_VERBOSE");
  wait_child(spawn_child(d.root, "rejected", -1, -1, fd), "a process over truncated entries");
  close(fd);
  const long printed = file_size(errpath);
  unlink(errpath);
  if (!(verbose && *verbose))
    FCT_CHECK(printed == 0, "a non-verbose context printed %ld bytes to stderr", printed);
  dir_remove(&d);
}

/* 4. Two processes fill one empty cache at the same moment. */
static void test_concurrent_writers(void **state) {
  cache_dir d;
  int ready[2], go[2];
  (void)state;
  dir_create(&d);
  FCT_CHECK(pipe(ready) == 0 && pipe(go) == 0, "pipe: %s", strerror(errno));
  pid_t pids[2];
  for (int i = 0; i < 2; i++) pids[i] = spawn_child(d.root, "any", ready[1], go[0], -1);
  char c[2];
  int got = 0;
  while (got < 2) {
    const ssize_t r = read(ready[0], c, (size_t)(2 - got));
    if (r <= 0) break;
    got += (int)r;
  }
  const ssize_t w = write(go[1], "gg", 2); /* both start their builds now */
  close(ready[0]);
  close(ready[1]);
  close(go[0]);
  close(go[1]);
  wait_child(pids[0], "concurrent writer 1");
  wait_child(pids[1], "concurrent writer 2");
  FCT_CHECK(got == 2 && w == 2, "the barrier broke: %d ready, %zd released", got, w);
  flashcl_context_stats s = run_in_process(d.root, 0, "after the writers");
  FCT_CHECK(s.programs_built == 0 && s.programs_from_cache >= 1 && s.cache_rejected == 0,
            "after two writers: built %u, from cache %u, rejected %u", s.programs_built, s.programs_from_cache,
            s.cache_rejected);
  char names[64][256];
  int tmp;
  list_entries(&d, names, 64, &tmp);
  FCT_CHECK(tmp == 0, "%d temporary files left in %s", tmp, d.programs);
  dir_remove(&d);
}

/* 5. no_binary_cache = 1: nothing read, nothing written. */
static void test_no_binary_cache(void **state) {
  cache_dir d;
  (void)state;
  dir_create(&d);
  flashcl_context_stats s = run_in_process(d.root, 1, "no_binary_cache, empty dir");
  FCT_CHECK(s.programs_built >= 1 && s.cache_written == 0 && s.programs_from_cache == 0 && s.cache_rejected == 0,
            "no_binary_cache: built %u, written %u, from cache %u, rejected %u", s.programs_built, s.cache_written,
            s.programs_from_cache, s.cache_rejected);
  struct stat sb;
  FCT_CHECK(stat(d.programs, &sb) != 0, "no_binary_cache created %s", d.programs);
  /* A warm cache is not read either. */
  run_in_process(d.root, 0, "warm");
  s = run_in_process(d.root, 1, "no_binary_cache, warm dir");
  FCT_CHECK(s.programs_built >= 1 && s.programs_from_cache == 0 && s.cache_written == 0,
            "no_binary_cache on a warm dir: built %u, from cache %u, written %u", s.programs_built,
            s.programs_from_cache, s.cache_written);
  dir_remove(&d);
}

/* 5b. The tuning parameter context.binary_cache = 0 turns the cache off like
 * no_binary_cache; a file that sets it to 1 turns it back on. */
static void test_tuning_switch(void **state) {
  cache_dir d;
  char off[64];
  (void)state;
  dir_create(&d);
  snprintf(off, sizeof off, "/tmp/flashcl-cache-off-XXXXXX");
  const int fd = mkstemp(off);
  FCT_CHECK(fd >= 0 && write(fd, "context : binary_cache=0\n", 25) == 25 && close(fd) == 0, "cannot write %s", off);
  g_tuning_file = off;
  flashcl_context_stats s = run_in_process(d.root, 0, "binary_cache=0, empty dir");
  g_tuning_file = NULL;
  struct stat sb;
  FCT_CHECK(s.programs_built >= 1 && s.cache_written == 0 && s.programs_from_cache == 0 && stat(d.programs, &sb) != 0,
            "binary_cache=0: built %u, written %u, from cache %u", s.programs_built, s.cache_written,
            s.programs_from_cache);
  s = run_in_process(d.root, 0, "binary_cache=1, empty dir");
  FCT_CHECK(s.cache_written >= 1, "binary_cache=1: written %u", s.cache_written);
  remove(off);
  dir_remove(&d);
}

/* ------------------------------------------------------------ trimming -- */

enum { FAKE = 5, FAKE_BYTES = 64 << 10 };

/* A file of `bytes` random bytes whose modification time is `age` seconds ago. */
static void plant_file(const cache_dir *d, const char *name, long bytes, long age, fct_rng *rng) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", d->programs, name);
  unsigned char *buf = malloc((size_t)bytes);
  FCT_CHECK(buf != NULL, "out of memory");
  for (long i = 0; i < bytes; i++) buf[i] = (unsigned char)fct_rng_u64(rng);
  write_file(path, buf, bytes);
  free(buf);
  struct timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= age;
  t[1] = t[0];
  FCT_CHECK(utimensat(AT_FDCWD, path, t, 0) == 0, "utimensat %s: %s", path, strerror(errno));
}

static int present(const cache_dir *d, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", d->programs, name);
  return access(path, F_OK) == 0;
}

/* The bytes of the entries ("<32 hex>.bin") in programs/. */
static long entry_bytes(const cache_dir *d) {
  char names[64][256], path[512];
  int tmp;
  long total = 0;
  const int n = list_entries(d, names, 64, &tmp);
  for (int i = 0; i < n && i < 64; i++) {
    if (strlen(names[i]) != 36) continue;
    snprintf(path, sizeof path, "%s/%s", d->programs, names[i]);
    total += file_size(path);
  }
  return total;
}

/* 7. Past cache_max_bytes the least recently used entries go, oldest first,
 * never the new ones; stale temporary files go, fresh ones and files that are
 * not the cache's stay; a load marks its entry used. */
static void test_trim(void **state) {
  cache_dir d, probe;
  fct_rng rng;
  (void)state;
  fct_rng_init(&rng, "trim");
  dir_create(&probe);
  run_in_process(probe.root, 0, "size of the entries");
  const long written = entry_bytes(&probe);
  dir_remove(&probe);
  FCT_CHECK(written > 0, "no entry written");

  dir_create(&d);
  FCT_CHECK(mkdir(d.programs, 0700) == 0, "mkdir %s: %s", d.programs, strerror(errno));
  /* Ages: fake 1 was used most recently, then 4, 3, 2, 0. */
  static const long age[FAKE] = {5000, 10, 4000, 3000, 2000};
  char fake[FAKE][40];
  for (int i = 0; i < FAKE; i++) {
    snprintf(fake[i], sizeof fake[i], "%032x.bin", 0xf00d0 + i);
    plant_file(&d, fake[i], FAKE_BYTES, age[i], &rng);
  }
  const char *stale = "00000000000000000000000000000abc.bin.tmp.1.0";
  const char *fresh = "00000000000000000000000000000abd.bin.tmp.2.0";
  plant_file(&d, stale, 100, 7200, &rng);
  plant_file(&d, fresh, 100, 0, &rng);
  plant_file(&d, "notes.txt", 3 * FAKE_BYTES, 9000, &rng);

  /* Room for what the run writes and two of the five planted entries. */
  g_cache_max = (uint64_t)written + 2 * FAKE_BYTES + FAKE_BYTES / 2;
  flashcl_context_stats s = run_in_process(d.root, 0, "a bounded cache");
  FCT_CHECK(s.cache_written >= 1, "nothing written");
  static const int kept[FAKE] = {0, 1, 0, 0, 1};
  for (int i = 0; i < FAKE; i++)
    FCT_CHECK(present(&d, fake[i]) == kept[i], "planted entry %d (%ld s old) %s", i, age[i],
              kept[i] ? "was removed, though more recent than three others" : "was kept");
  FCT_CHECK(!present(&d, stale), "a temporary file two hours old was kept");
  FCT_CHECK(present(&d, fresh), "a fresh temporary file (a writer at work) was removed");
  FCT_CHECK(present(&d, "notes.txt"), "a file that is not the cache's was removed");
  const long total = entry_bytes(&d);
  FCT_CHECK(total <= (long)g_cache_max && total >= written + 2 * FAKE_BYTES,
            "entries hold %ld bytes, limit %llu (written %ld)", total, (unsigned long long)g_cache_max, written);

  /* A load refreshes the entry's time: make the real entries old, load them. */
  char names[64][256], path[512];
  int tmp;
  const int n = list_entries(&d, names, 64, &tmp);
  for (int i = 0; i < n && i < 64; i++) {
    if (strlen(names[i]) != 36 || strncmp(names[i], "000000000000000000000000000f00d", 31) == 0) continue;
    snprintf(path, sizeof path, "%s/%s", d.programs, names[i]);
    const struct timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
    FCT_CHECK(utimensat(AT_FDCWD, path, old, 0) == 0, "utimensat: %s", strerror(errno));
  }
  const time_t before = time(NULL);
  s = run_in_process(d.root, 0, "loads from the bounded cache");
  FCT_CHECK(s.programs_from_cache >= 1 && s.programs_built == 0, "from cache %u, built %u", s.programs_from_cache,
            s.programs_built);
  int refreshed = 0;
  for (int i = 0; i < n && i < 64; i++) {
    if (strlen(names[i]) != 36 || strncmp(names[i], "000000000000000000000000000f00d", 31) == 0) continue;
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", d.programs, names[i]);
    FCT_CHECK(stat(path, &sb) == 0, "entry %s is gone", names[i]);
    FCT_CHECK(sb.st_mtime >= before, "entry %s was loaded but its time was not refreshed", names[i]);
    refreshed++;
  }
  FCT_CHECK(refreshed == (int)s.programs_from_cache, "%d entries, %u loads", refreshed, s.programs_from_cache);
  g_cache_max = 0;
  snprintf(path, sizeof path, "%s/notes.txt", d.programs);
  unlink(path);
  dir_remove(&d);
}

/* 6. The getter's arguments. */
static void test_stats_arguments(void **state) {
  flashcl_context *ctx = NULL;
  flashcl_context_stats s;
  (void)state;
  FCT_CHECK_STATUS(flashcl_context_stats_get(NULL, &s), FLASHCL_ERROR_INVALID_ARGUMENT, "stats_get(NULL, &s)");
  FCT_CHECK_STATUS(open_ctx(NULL, 1, &ctx), FLASHCL_SUCCESS, "context_create");
  const flashcl_status st = flashcl_context_stats_get(ctx, NULL);
  memset(&s, 0xA5, sizeof s);
  const flashcl_status st2 = flashcl_context_stats_get(ctx, &s);
  flashcl_context_destroy(ctx);
  FCT_CHECK_STATUS(st, FLASHCL_ERROR_INVALID_ARGUMENT, "stats_get(ctx, NULL)");
  FCT_CHECK_STATUS(st2, FLASHCL_SUCCESS, "stats_get(ctx, &s)");
  FCT_CHECK(s.programs_built == 0 && s.programs_from_cache == 0 && s.cache_rejected == 0 && s.cache_written == 0,
            "a fresh context's statistics are not zero: %u %u %u %u", s.programs_built, s.programs_from_cache,
            s.cache_rejected, s.cache_written);
}

int main(int argc, char **argv) {
  if (argc >= 4 && strcmp(argv[1], "--child") == 0) return child_main(argc, argv);
  g_self = access("/proc/self/exe", X_OK) == 0 ? "/proc/self/exe" : argv[0];
  /* The children draw the same seed, so a failure reproduces whole. */
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)fct_seed());
  setenv("FLASHCL_TEST_SEED", seed, 1);
  char on[64];
  snprintf(on, sizeof on, "/tmp/flashcl-cache-on-XXXXXX");
  const int fd = mkstemp(on);
  if (fd < 0 || write(fd, "context : binary_cache=1\n", 25) != 25 || close(fd) != 0) return 1;
  setenv("FLASHCL_TUNING", on, 1); /* children inherit it */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stats_arguments), cmocka_unit_test(test_write_then_load),
      cmocka_unit_test(test_fresh_process),   cmocka_unit_test(test_corrupt_entries),
      cmocka_unit_test(test_concurrent_writers), cmocka_unit_test(test_no_binary_cache),
      cmocka_unit_test(test_tuning_switch),   cmocka_unit_test(test_trim),
  };
  const int rc = fct_run_group("binary cache", tests, sizeof tests / sizeof tests[0], 0);
  remove(on);
  return rc;
}
