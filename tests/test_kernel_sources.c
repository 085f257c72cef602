/* House rule: every .cl file is valid OpenCL C on its own, with a banner comment
 * and defaults for its -D parameters. This builds each file of cl/ alone, with no
 * options, on the test device, so a kernel that starts to depend on another file
 * (or on a -D the host always passes) fails here rather than for a user who sets
 * FLASHCL_KERNEL_DIR. */
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

/* Builds one .cl file on its own; fails the test with its build log. */
static void builds_alone(const char *path, const char *name) {
  size_t size = 0;
  char *text = read_file(path, &size);
  assert_non_null(text);
  if (strncmp(text, "/*", 2) != 0) fail_msg("%s does not start with a banner comment", name);
  const char *src = text;
  cl_int err;
  cl_program prog = clCreateProgramWithSource(flashcl_context_cl_context(ctx), 1, &src, &size, &err);
  assert_int_equal(err, CL_SUCCESS);
  cl_device_id dev = flashcl_context_cl_device(ctx);
  err = clBuildProgram(prog, 1, &dev, "-cl-std=CL1.2", NULL, NULL);
  if (err != CL_SUCCESS) {
    char log[8192] = {0};
    clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
    fail_msg("%s does not build on its own (%d):\n%s", name, (int)err, log);
  }
  clReleaseProgram(prog);
  free(text);
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
    builds_alone(path, e->d_name);
    files++;
  }
  closedir(dir);
  return files;
}

static void each_file_builds_alone(void **state) {
  (void)state;
  /* 16 files when this test was written: a lost folder must not pass. */
  assert_true(build_dir(FLASHCL_CL_DIR, 0) >= 16);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(each_file_builds_alone)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
