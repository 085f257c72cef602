/* Keeping <cache_dir>/programs bounded.
 *
 * Every driver update, flashcl version, kernel edit or new build option makes
 * new keys, and the entries of the old ones are never read again: without a
 * bound the directory only grows. After each write the directory is summed;
 * past the context's limit (flashcl_context_options.cache_max_bytes) the
 * least recently used entries are removed, oldest first, until it fits. A
 * load refreshes its entry's time, so "least recently used" is the file's
 * modification time. Temporary files older than an hour are the leftovers of
 * a process that died mid-write and go too.
 *
 * Like the rest of the cache this never fails the caller: a file that cannot
 * be read or removed is skipped. Other processes may trim the same directory
 * at the same time; removing an entry that another process has open, or has
 * already removed, is harmless on POSIX systems.
 */
#define _POSIX_C_SOURCE 200809L
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef _WIN32
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* A writer that has not renamed its temporary file for this long is gone. */
#define FCL_CACHE_TMP_AGE_S 3600

typedef struct fcl_cache_file {
  struct timespec mtime;
  uint64_t bytes;
  char name[40];
} fcl_cache_file;

typedef struct fcl_cache_listing {
  fcl_cache_file *files;
  size_t count, cap;
  uint64_t total;
  unsigned stale_tmp_removed;
} fcl_cache_listing;

/* Only names the cache itself writes are ever removed: "<32 hex>.bin" entries,
 * and their temporaries "<32 hex>.bin.tmp.<pid>.<n>". */
static int fcl_entry_prefix(const char *s) {
  return strspn(s, "0123456789abcdef") == 32 && strncmp(s + 32, ".bin", 4) == 0;
}

static int fcl_cache_file_cmp(const void *a, const void *b) {
  const struct timespec *x = &((const fcl_cache_file *)a)->mtime, *y = &((const fcl_cache_file *)b)->mtime;
  if (x->tv_sec != y->tv_sec) return x->tv_sec < y->tv_sec ? -1 : 1;
  return (x->tv_nsec > y->tv_nsec) - (x->tv_nsec < y->tv_nsec);
}

/* Adds one directory entry to the listing (entries), or removes it (a stale
 * temporary). 0, or -1 when out of host memory. */
static int fcl_cache_list_one(fcl_cache_listing *l, const char *dir, const char *name, time_t now) {
  if (!fcl_entry_prefix(name)) return 0;
  char path[4200];
  struct stat sb;
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path || stat(path, &sb) != 0 ||
      !S_ISREG(sb.st_mode))
    return 0;
  if (name[36] != '\0') {
    if (strncmp(name + 36, ".tmp.", 5) == 0 && now - sb.st_mtime > FCL_CACHE_TMP_AGE_S && unlink(path) == 0)
      l->stale_tmp_removed++;
    return 0;
  }
  if (l->count == l->cap) {
    const size_t cap = l->cap ? 2 * l->cap : 64;
    fcl_cache_file *f = realloc(l->files, cap * sizeof *f);
    if (!f) return -1;
    l->files = f;
    l->cap = cap;
  }
  fcl_cache_file *f = &l->files[l->count++];
  f->mtime = sb.st_mtim;
  f->bytes = (uint64_t)sb.st_size;
  memcpy(f->name, name, 37);
  l->total += f->bytes;
  return 0;
}

static int fcl_cache_list(fcl_cache_listing *l, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  const time_t now = time(NULL);
  int rc = 0;
  for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) rc = fcl_cache_list_one(l, dir, e->d_name, now);
  closedir(d);
  return rc;
}

void fcl_cache_trim(flashcl_context *ctx, const char *dir, const char *keep) {
  fcl_cache_listing l = {NULL, 0, 0, 0, 0};
  if (fcl_cache_list(&l, dir) != 0) {
    free(l.files);
    return;
  }
  unsigned removed = 0;
  uint64_t freed = 0;
  if (l.total > ctx->cache_max_bytes) {
    qsort(l.files, l.count, sizeof *l.files, fcl_cache_file_cmp);
    char path[4200];
    for (size_t i = 0; i < l.count && l.total - freed > ctx->cache_max_bytes; i++) {
      if (keep && strcmp(l.files[i].name, keep) == 0) continue; /* the entry just written */
      snprintf(path, sizeof path, "%s/%s", dir, l.files[i].name);
      if (unlink(path) != 0) continue;
      removed++;
      freed += l.files[i].bytes;
    }
  }
  if (removed || l.stale_tmp_removed)
    fcl_log(ctx, "program cache %s: %llu bytes in %zu entries, limit %llu: removed %u least recently used (%llu "
                 "bytes) and %u stale temporary files",
            dir, (unsigned long long)l.total, l.count, (unsigned long long)ctx->cache_max_bytes, removed,
            (unsigned long long)freed, l.stale_tmp_removed);
  free(l.files);
}

void fcl_cache_touch(const char *path) { (void)utimensat(AT_FDCWD, path, NULL, 0); }

#else /* _WIN32: the disk cache is off (fcl_cache_enabled) */

void fcl_cache_trim(flashcl_context *ctx, const char *dir, const char *keep) {
  (void)ctx;
  (void)dir;
  (void)keep;
}

void fcl_cache_touch(const char *path) { (void)path; }

#endif
