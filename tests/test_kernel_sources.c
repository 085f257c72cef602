/* House rule: every .cl file is valid OpenCL C on its own, with a banner comment
 * and defaults for its -D parameters. A kernel file may need shared files (such
 * as cl/common/dtype.cl) joined in front of it, as the host joins them; it then
 * names them, in order, on one banner line " * requires: dtype.cl seq_bounds.cl".
 * This builds each file of cl/ with no options on the test device, with its
 * requirements in front, so a kernel that starts to depend on another file (or
 * on a -D the host always passes) fails here rather than for a user who sets
 * FLASHCL_KERNEL_DIR. It also builds each file without each of its requirements,
 * which must fail: a declaration that is not needed would join dead text into
 * every program. A shared file requires nothing itself, so it builds alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl.h"

#ifndef FLASHCL_CL_DIR
#error "FLASHCL_CL_DIR must name the kernel source directory"
#endif

static flashcl_context *ctx;

static int setup(void **state) {
  (void)state;
  return flashcl_context_create(NULL, &ctx) == FLASHCL_SUCCESS ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  flashcl_context_destroy(ctx);
  return 0;
}

static char *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
    buf[n] = '\0';
    *size = (size_t)n;
  } else {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  return buf;
}

enum { MAX_REQUIRES = 4 };

/* The path of the file called name in dir or one of its sub-folders, or 0. */
static int find_file(const char *dirpath, const char *name, int depth, char *out, size_t cap) {
  DIR *dir = opendir(dirpath);
  if (!dir) return 0;
  int found = 0;
  for (struct dirent *e; !found && (e = readdir(dir)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dirpath, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0) continue;
    if (S_ISDIR(sb.st_mode)) {
      if (depth < 2) found = find_file(path, name, depth + 1, out, cap);
    } else if (strcmp(e->d_name, name) == 0) {
      snprintf(out, cap, "%s", path);
      found = 1;
    }
  }
  closedir(dir);
  return found;
}

/* The names on the banner's "requires:" line (none without one); returns their
 * count. Fails the test on a second such line or more than MAX_REQUIRES names. */
static int banner_requires(const char *text, const char *name, char req[MAX_REQUIRES][256]) {
  const char *end = strstr(text, "*/");
  if (!end) fail_msg("%s: the banner comment is not closed", name);
  int n = 0, lines = 0;
  for (const char *line = text; line && line < end; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    const char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p != '*') continue;
    p++;
    while (*p == ' ') p++;
    if (strncmp(p, "requires:", 9) != 0) continue;
    if (++lines > 1) fail_msg("%s: more than one requires line", name);
    p += 9;
    for (;;) {
      while (*p == ' ') p++;
      size_t len = strcspn(p, " \r\n");
      if (len == 0) break;
      if (n == MAX_REQUIRES || len >= sizeof req[0]) fail_msg("%s: too many or too long requires", name);
      memcpy(req[n], p, len);
      req[n][len] = '\0';
      n++;
      p += len;
    }
    if (n == 0) fail_msg("%s: an empty requires line", name);
  }
  return n;
}

/* Builds the texts as one program, in order, as the host joins them.
 * Returns the build status; log receives the build log. */
static cl_int build_joined(char *const *texts, int n, char *log, size_t cap) {
  const char *src[MAX_REQUIRES + 1];
  size_t size[MAX_REQUIRES + 1];
  for (int i = 0; i < n; i++) {
    src[i] = texts[i];
    size[i] = strlen(texts[i]);
  }
  cl_int err;
  cl_program prog = clCreateProgramWithSource(flashcl_context_cl_context(ctx), (cl_uint)n, src, size, &err);
  assert_int_equal(err, CL_SUCCESS);
  cl_device_id dev = flashcl_context_cl_device(ctx);
  err = clBuildProgram(prog, 1, &dev, "-cl-std=CL1.2", NULL, NULL);
  log[0] = '\0';
  if (err != CL_SUCCESS) clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, cap - 1, log, NULL);
  log[cap - 1] = '\0';
  clReleaseProgram(prog);
  return err;
}

/* Builds one .cl file with its requirements in front, then without each of them. */
static void builds_with_requires(const char *path, const char *name) {
  size_t size = 0;
  char *text = read_file(path, &size);
  assert_non_null(text);
  if (strncmp(text, "/*", 2) != 0) fail_msg("%s does not start with a banner comment", name);
  char req[MAX_REQUIRES][256];
  const int n = banner_requires(text, name, req);
  char *texts[MAX_REQUIRES + 1];
  for (int i = 0; i < n; i++) {
    char rpath[4096];
    if (!find_file(FLASHCL_CL_DIR, req[i], 0, rpath, sizeof rpath))
      fail_msg("%s requires %s, which is not in cl/", name, req[i]);
    texts[i] = read_file(rpath, &size);
    assert_non_null(texts[i]);
    char inner[MAX_REQUIRES][256];
    if (banner_requires(texts[i], req[i], inner) != 0)
      fail_msg("%s requires %s, which requires files itself", name, req[i]);
  }
  texts[n] = text;
  static char log[16384];
  if (build_joined(texts, n + 1, log, sizeof log) != CL_SUCCESS)
    fail_msg("%s does not build with its requirements in front:\n%s", name, log);
  for (int skip = 0; skip < n; skip++) {
    char *part[MAX_REQUIRES + 1];
    int m = 0;
    for (int i = 0; i <= n; i++)
      if (i != skip) part[m++] = texts[i];
    if (build_joined(part, m, log, sizeof log) == CL_SUCCESS)
      fail_msg("%s builds without %s: drop it from its requires line", name, req[skip]);
  }
  for (int i = 0; i <= n; i++) free(texts[i]);
}

/* Every .cl file of dir and of its sub-folders (cl/<module>/); returns the count. */
static int build_dir(const char *dirpath, int depth) {
  DIR *dir = opendir(dirpath);
  assert_non_null(dir);
  int files = 0;
  for (struct dirent *e; (e = readdir(dir)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dirpath, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0) continue;
    if (S_ISDIR(sb.st_mode)) {
      if (depth < 2) files += build_dir(path, depth + 1);
      continue;
    }
    size_t len = strlen(e->d_name);
    if (len < 4 || strcmp(e->d_name + len - 3, ".cl") != 0) continue;
    builds_with_requires(path, e->d_name);
    files++;
  }
  closedir(dir);
  return files;
}

static void each_file_builds_with_its_requires(void **state) {
  (void)state;
  /* 18 files since cl/common/dtype.cl and seq_bounds.cl: a lost folder must not pass. */
  assert_true(build_dir(FLASHCL_CL_DIR, 0) >= 18);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(each_file_builds_with_its_requires)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
