/*
 * The tuning file and the resume journal of flashcl-tune. The journal is
 * appended one whole line per finished problem and flushed, so a run killed at
 * any moment leaves every finished problem readable; a torn last line (no
 * newline) is ignored. The tuning file is written to a temporary name and
 * renamed, so a reader never sees half a file.
 */
#define _POSIX_C_SOURCE 200809L
#include "tune_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tune_entry_line(const tune_shape *s, const tune_result *r, long nmax, char *buf, size_t cap) {
  char params[TUNE_LINE_CAP], sel[128];
  int used;
  flashcl_tuning t = r->best;
  t.family = r->family;
  if (flashcl_tuning_format(&t, params, sizeof params)) return -1;
  const char *rest = strchr(params, ' '); /* the format starts with the family */
  if (s->pass == TUNE_DECODE)
    used = snprintf(sel, sizeof sel, "d=%d dtype=%s", s->d, flashcl_dtype_name(s->dtype));
  else if (s->pass == TUNE_BACKWARD)
    used = snprintf(sel, sizeof sel, "d=%d dtype=%s causal=%d atomic=%d", s->d, flashcl_dtype_name(s->dtype),
                    s->causal, s->atomic);
  else
    used = snprintf(sel, sizeof sel, "d=%d dtype=%s causal=%d", s->d, flashcl_dtype_name(s->dtype), s->causal);
  if (nmax > 0) used += snprintf(sel + used, sizeof sel - (size_t)used, " nmax=%ld", nmax);
  used = snprintf(buf, cap, "%s %s :%s", flashcl_tuning_family_name(r->family), sel, rest ? rest : "");
  return used < 0 || (size_t)used >= cap ? -1 : 0;
}

/* mkdir -p of path's directory. */
static int tune_mkdirs(const char *path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return 0;
  *slash = '\0';
  for (char *p = dir + 1; *p; ++p)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(dir, 0755) && errno != EEXIST) return errno;
      *p = '/';
    }
  return mkdir(dir, 0755) && errno != EEXIST ? errno : 0;
}

static const char tune_journal_magic[] = "# flashcl-tune journal 1\n";

int tune_journal_start(const char *path, const char *header) {
  const int err = tune_mkdirs(path);
  if (err) return err;
  FILE *f = fopen(path, "w");
  if (!f) return errno ? errno : EIO;
  fputs(tune_journal_magic, f);
  fputs(header, f);
  fputs("#end-header\n", f);
  return fclose(f) ? EIO : 0;
}

int tune_journal_append(const char *path, const tune_done *d) {
  FILE *f = fopen(path, "a");
  if (!f) return errno ? errno : EIO;
  fprintf(f, "done\t%s\t%s\t%s\n", d->problem, d->entry, d->comment);
  return fclose(f) ? EIO : 0;
}

/* "done\t<problem>\t<entry>\t<comment>" into d; 0 if malformed. */
static int tune_journal_line(char *line, tune_done *d) {
  char *f[4], *save = NULL;
  int n = 0;
  for (char *w = strtok_r(line, "\t", &save); w && n < 4; w = strtok_r(NULL, "\t", &save)) f[n++] = w;
  if (n != 4 || strcmp(f[0], "done")) return 0;
  snprintf(d->problem, sizeof d->problem, "%s", f[1]);
  snprintf(d->entry, sizeof d->entry, "%s", f[2]);
  snprintf(d->comment, sizeof d->comment, "%s", f[3]);
  return 1;
}

int tune_journal_load(const char *path, const char *header, tune_done **done, int *ndone, const char **why) {
  FILE *f = fopen(path, "r");
  char line[4 * TUNE_LINE_CAP];
  size_t hlen = 0, hcap = strlen(header) + 1;
  char *head = (char *)malloc(hcap + sizeof line);
  int read = 0, in_header = 1;
  if (!f || !head) {
    free(head);
    if (f) fclose(f);
    return 0;
  }
  head[0] = '\0';
  if (!fgets(line, sizeof line, f) || strcmp(line, tune_journal_magic)) {
    *why = "not a flashcl-tune journal";
    read = -1;
  }
  while (read >= 0 && fgets(line, sizeof line, f)) {
    const size_t len = strlen(line);
    if (in_header) {
      if (!strcmp(line, "#end-header\n")) {
        in_header = 0;
        if (strcmp(head, header)) *why = "it was written for another device or flashcl version", read = -1;
      } else if (hlen + len < hcap + sizeof line) {
        memcpy(head + hlen, line, len + 1), hlen += len;
      }
      continue;
    }
    if (!len || line[len - 1] != '\n') break; /* torn last line: the run was killed while writing it */
    line[len - 1] = '\0';
    tune_done d;
    if (!tune_journal_line(line, &d)) continue;
    tune_done *grown = (tune_done *)realloc(*done, sizeof(tune_done) * (size_t)(*ndone + 1));
    if (!grown) break;
    *done = grown;
    (*done)[(*ndone)++] = d;
    ++read;
  }
  if (read >= 0 && in_header) *why = "its header is incomplete", read = -1;
  free(head);
  fclose(f);
  return read;
}

int tune_file_write(const char *path, const char *header, const char *preamble, const tune_done *done, int ndone,
                    char *why, size_t why_cap) {
  char tmp[4200];
  int err = tune_mkdirs(path);
  if (err) {
    snprintf(why, why_cap, "cannot create the directory of %s: %s", path, strerror(err));
    return err;
  }
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) {
    err = errno;
    snprintf(why, why_cap, "cannot write %s: %s", tmp, strerror(err));
    return err;
  }
  fputs(header, f);
  fputs(preamble, f);
  for (int i = 0; i < ndone; ++i) fprintf(f, "# %s\n%s\n", done[i].comment, done[i].entry);
  err = ferror(f) ? EIO : 0;
  if (fclose(f) && !err) err = EIO;
  if (!err && rename(tmp, path)) err = errno;
  if (err) {
    remove(tmp);
    snprintf(why, why_cap, "cannot write %s: %s", path, strerror(err));
  }
  return err;
}
