/* Tuning files and the context's tuning sources.
 *
 * A tuning file is text, one statement per line ('#' starts a comment):
 *   flashcl-tuning 1                     format version (optional, first)
 *   vendor <platform vendor>             header: which devices the file is for;
 *   device <device name>                 each value may hold '*' wildcards, and
 *   driver <driver version>              a missing line matches anything
 *   flashcl <library version>
 *   <family> [d=N] [dtype=f32|f16|bf16] [causal=0|1] [atomic=0|1] [nmax=N] : name=value ...
 * An entry applies to problems that match every key it gives; of the entries
 * of one file that match, the most specific wins (d before dtype before
 * atomic before causal before nmax, the smallest nmax among equals), then the
 * first. The whole file is parsed before any of it is used: an error anywhere
 * skips the file, with the line in the context's tuning log, so a file never
 * half-applies.
 *
 * Sources, first match wins: options.tuning_file / $FLASHCL_TUNING, then
 * <cache_dir>/tuning/\*.tune, the installed share/flashcl/tuning/\*.tune, and the
 * built-in database (tuning/\*.tune of the source tree, embedded at build time).
 * Within a directory the files are taken in name order. */
#include "core/tuning.h"
#include "core/embedded.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FLASHCL_TUNING_INSTALL_DIR
#define FLASHCL_TUNING_INSTALL_DIR ""
#endif


typedef struct fcl_tune_entry {
  int d, dtype, causal, atomic; /* -1: any */
  long nmax;                    /* 0: any */
  flashcl_tuning t;
} fcl_tune_entry;

typedef struct fcl_tune_table {
  flashcl_tuning_source source;
  char origin[256];
  fcl_tune_entry *e;
  int n;
  struct fcl_tune_table *next;
} fcl_tune_table;

struct fcl_tuning_db {
  fcl_tune_table *first, *last;
};

/* The device key files are matched against. */
typedef struct fcl_device_key {
  char vendor[256], device[256], driver[256];
} fcl_device_key;

static void fcl_tlog(flashcl_context *ctx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void fcl_tlog(flashcl_context *ctx, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fcl_log(ctx, "tuning: %s", line);
  const size_t old = ctx->tuning_log ? strlen(ctx->tuning_log) : 0, add = strlen(line);
  char *grown = realloc(ctx->tuning_log, old + add + 2);
  if (!grown) return;
  memcpy(grown + old, line, add);
  grown[old + add] = '\n';
  grown[old + add + 1] = '\0';
  ctx->tuning_log = grown;
}

/* Shell-style match of s against a pattern whose '*' matches any run. */
static int fcl_glob(const char *pat, const char *s) {
  if (!*pat) return !*s;
  if (*pat == '*') {
    for (const char *t = s;; t++) {
      if (fcl_glob(pat + 1, t)) return 1;
      if (!*t) return 0;
    }
  }
  return *s == *pat && fcl_glob(pat + 1, s + 1);
}

static char *fcl_trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = '\0';
  return s;
}

/* One "key=value" of an entry's selector into e; 0 if malformed. */
static int fcl_parse_selector(const char *word, fcl_tune_entry *e) {
  char key[16];
  const char *eq = strchr(word, '=');
  if (!eq || eq == word || (size_t)(eq - word) >= sizeof key) return 0;
  memcpy(key, word, (size_t)(eq - word));
  key[eq - word] = '\0';
  const char *v = eq + 1;
  if (!strcmp(v, "*")) return !strcmp(key, "d") || !strcmp(key, "dtype") || !strcmp(key, "causal") || !strcmp(key, "atomic");
  if (!strcmp(key, "dtype")) {
    static const char *const names[3] = {"f32", "f16", "bf16"};
    for (int i = 0; i < 3; i++)
      if (!strcmp(v, names[i])) return (e->dtype = i), 1;
    return 0;
  }
  char *end = NULL;
  const long n = strtol(v, &end, 10);
  if (end == v || *end || n < 0 || n > 1L << 30) return 0;
  if (!strcmp(key, "d") && n > 0) return (e->d = (int)n), 1;
  if ((!strcmp(key, "causal") || !strcmp(key, "atomic")) && n <= 1) return (*(key[0] == 'c' ? &e->causal : &e->atomic) = (int)n), 1;
  if (!strcmp(key, "nmax") && n > 0) return (e->nmax = n), 1;
  return 0;
}

/* An entry line "<family> [selectors] : params" into e; 0 with *why set if malformed. */
static int fcl_parse_entry(flashcl_context *ctx, char *line, fcl_tune_entry *e, const char **why) {
  char *colon = strchr(line, ':');
  if (!colon) return (*why = "an entry needs ':' between its selector and its parameters"), 0;
  *colon = '\0';
  memset(e, 0, sizeof *e);
  e->d = e->dtype = e->causal = e->atomic = -1;
  char *save = NULL, *word = strtok_r(line, " \t", &save);
  flashcl_tuning_family f;
  if (!word || flashcl_tuning_family_parse(word, &f) != FLASHCL_SUCCESS) return (*why = "unknown family"), 0;
  while ((word = strtok_r(NULL, " \t", &save)) != NULL)
    if (!fcl_parse_selector(word, e)) return (*why = "bad selector (d=N, dtype=f32|f16|bf16, causal=0|1, atomic=0|1, nmax=N)"), 0;
  char text[1024];
  snprintf(text, sizeof text, "%s %s", flashcl_tuning_family_name(f), colon + 1);
  /* The parser's message goes to the context's error; the caller logs it. */
  if (fcl_tuning_parse_locked(ctx, text, &e->t) != FLASHCL_SUCCESS) return (*why = ctx->errmsg), 0;
  return 1;
}

/* Header line "key value"; returns 1 if it is one (matched or not in *ok). */
static int fcl_parse_header(char *line, const fcl_device_key *dev, int *ok, char *reason, size_t cap) {
  static const char *const keys[4] = {"vendor", "device", "driver", "flashcl"};
  for (int i = 0; i < 4; i++) {
    const size_t n = strlen(keys[i]);
    if (strncmp(line, keys[i], n) || (line[n] != ' ' && line[n] != '\t')) continue;
    const char *want = fcl_trim(line + n);
    const char *have = i == 0 ? dev->vendor : i == 1 ? dev->device : i == 2 ? dev->driver : FLASHCL_VERSION_STRING;
    if (*ok && !fcl_glob(want, have)) {
      *ok = 0;
      snprintf(reason, cap, "it is for %s \"%s\", this is \"%s\"", keys[i], want, have);
    }
    return 1;
  }
  return 0;
}

/* Parses text into a table; NULL (with the reason logged) if the file does not
 * parse or is for another device. */
static fcl_tune_table *fcl_table_parse(flashcl_context *ctx, const char *text, const fcl_device_key *dev,
                                       flashcl_tuning_source source, const char *origin) {
  char *copy = fcl_strdup(text);
  fcl_tune_table *t = calloc(1, sizeof *t);
  if (!copy || !t) {
    free(copy);
    free(t);
    fcl_tlog(ctx, "%s: skipped: out of host memory", origin);
    return NULL;
  }
  t->source = source;
  snprintf(t->origin, sizeof t->origin, "%s", origin);
  int ok = 1, lineno = 0, entries_seen = 0, cap = 0;
  char reason[512] = "", *save = NULL;
  for (char *raw = strtok_r(copy, "\n", &save); raw && ok; raw = strtok_r(NULL, "\n", &save)) {
    lineno++; /* blank lines vanish in strtok_r: line numbers count non-empty lines */
    char *hash = strchr(raw, '#');
    if (hash) *hash = '\0';
    char *line = fcl_trim(raw);
    if (!*line) continue;
    if (!strncmp(line, "flashcl-tuning", 14)) {
      if (strcmp(fcl_trim(line + 14), "1") || entries_seen)
        ok = 0, snprintf(reason, sizeof reason, "line %d: unsupported format \"%s\" (want \"flashcl-tuning 1\" first)", lineno, line);
      continue;
    }
    int hok = 1;
    if (fcl_parse_header(line, dev, &hok, reason, sizeof reason)) {
      if (entries_seen) ok = 0, snprintf(reason, sizeof reason, "line %d: header line after an entry", lineno);
      else if (!hok) ok = 0;
      continue;
    }
    entries_seen = 1;
    if (t->n == cap) {
      cap = cap ? 2 * cap : 16;
      fcl_tune_entry *g = realloc(t->e, (size_t)cap * sizeof *g);
      if (!g) {
        ok = 0;
        snprintf(reason, sizeof reason, "out of host memory");
        break;
      }
      t->e = g;
    }
    const char *why = NULL;
    if (fcl_parse_entry(ctx, line, &t->e[t->n], &why)) t->n++;
    else ok = 0, snprintf(reason, sizeof reason, "line %d: %.400s", lineno, why);
  }
  free(copy);
  fcl_clear_error(ctx);
  if (!ok) {
    fcl_tlog(ctx, "%s: skipped: %s", origin, reason);
    free(t->e);
    free(t);
    return NULL;
  }
  fcl_tlog(ctx, "%s: loaded (%s, %d entries)", origin, flashcl_tuning_source_name(source), t->n);
  return t;
}

static void fcl_db_add(flashcl_context *ctx, fcl_tune_table *t) {
  if (!t) return;
  if (!ctx->tuning && !(ctx->tuning = calloc(1, sizeof *ctx->tuning))) {
    free(t->e);
    free(t);
    return;
  }
  if (ctx->tuning->last) ctx->tuning->last->next = t;
  else ctx->tuning->first = t;
  ctx->tuning->last = t;
}

/* Reads a whole file (at most 4 MiB) into a malloc'ed string; NULL if unreadable. */
static char *fcl_read_text(const char *path, const char **why) {
  FILE *f = fopen(path, "rb");
  if (!f) return (*why = "cannot be opened"), NULL;
  char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n <= (4L << 20) && fseek(f, 0, SEEK_SET) == 0 &&
      (buf = malloc((size_t)n + 1)) != NULL && fread(buf, 1, (size_t)n, f) == (size_t)n) {
    buf[n] = '\0';
  } else {
    free(buf);
    buf = NULL;
    *why = n > (4L << 20) ? "is larger than 4 MiB" : "cannot be read";
  }
  fclose(f);
  if (buf && strlen(buf) != (size_t)n) {
    free(buf);
    return (*why = "holds a NUL byte (not a text file)"), NULL;
  }
  return buf;
}

static void fcl_load_file(flashcl_context *ctx, const char *path, const fcl_device_key *dev, flashcl_tuning_source src) {
  const char *why = NULL;
  char *text = fcl_read_text(path, &why);
  if (!text) {
    fcl_tlog(ctx, "%s: skipped: it %s", path, why);
    return;
  }
  fcl_db_add(ctx, fcl_table_parse(ctx, text, dev, src, path));
  free(text);
}

static int fcl_name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every *.tune file of dir, in name order. */
static void fcl_load_dir(flashcl_context *ctx, const char *dir, const fcl_device_key *dev, flashcl_tuning_source src) {
  DIR *d = opendir(dir);
  if (!d) {
    fcl_tlog(ctx, "%s: no such directory", dir);
    return;
  }
  char *names[256];
  int n = 0;
  struct dirent *ent;
  while ((ent = readdir(d)) != NULL && n < 256) {
    const size_t len = strlen(ent->d_name);
    if (len > 5 && !strcmp(ent->d_name + len - 5, ".tune") && (names[n] = fcl_strdup(ent->d_name))) n++;
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0], fcl_name_cmp);
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    fcl_load_file(ctx, path, dev, src);
    free(names[i]);
  }
}

static void fcl_device_key_get(const flashcl_context *ctx, fcl_device_key *k) {
  memset(k, 0, sizeof *k);
  clGetPlatformInfo(ctx->platform, CL_PLATFORM_VENDOR, sizeof k->vendor - 1, k->vendor, NULL);
  snprintf(k->device, sizeof k->device, "%s", ctx->info.device_name);
  clGetDeviceInfo(ctx->device, CL_DRIVER_VERSION, sizeof k->driver - 1, k->driver, NULL);
  fcl_trim(k->vendor);
  fcl_trim(k->device);
  fcl_trim(k->driver);
}

flashcl_status flashcl_context_tuning_header(const flashcl_context *ctx, char *buf, size_t cap) {
  if (!ctx || !buf) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_device_key k;
  fcl_device_key_get(ctx, &k);
  const int n = snprintf(buf, cap, "flashcl-tuning 1\nvendor %s\ndevice %s\ndriver %s\nflashcl %s\n", k.vendor,
                         k.device, k.driver, FLASHCL_VERSION_STRING);
  if (n < 0 || (size_t)n >= cap) {
    if (cap) buf[0] = '\0';
    return FLASHCL_ERROR_BUFFER_TOO_SMALL;
  }
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_tuning_load(flashcl_context *ctx, const flashcl_context_options *options) {
  fcl_device_key dev;
  fcl_device_key_get(ctx, &dev);
  fcl_tlog(ctx, "device key: vendor \"%s\", device \"%s\", driver \"%s\", flashcl %s", dev.vendor, dev.device,
           dev.driver, FLASHCL_VERSION_STRING);
  const char *file = options && options->tuning_file ? options->tuning_file : getenv("FLASHCL_TUNING");
  if (file && *file) fcl_load_file(ctx, file, &dev, FLASHCL_TUNING_SOURCE_FILE);
  if (!(options && options->no_user_tuning)) {
    if (ctx->cache_dir) {
      char dir[4096];
      snprintf(dir, sizeof dir, "%s/tuning", ctx->cache_dir);
      fcl_load_dir(ctx, dir, &dev, FLASHCL_TUNING_SOURCE_CACHE);
    }
    if (*FLASHCL_TUNING_INSTALL_DIR) fcl_load_dir(ctx, FLASHCL_TUNING_INSTALL_DIR, &dev, FLASHCL_TUNING_SOURCE_INSTALLED);
  }
  for (const struct fcl_embedded *s = flashcl_embedded_tuning; s->name; s++) {
    char origin[256];
    snprintf(origin, sizeof origin, "built-in: tuning/%s", s->name);
    fcl_db_add(ctx, fcl_table_parse(ctx, s->text, &dev, FLASHCL_TUNING_SOURCE_BUILTIN, origin));
  }
  return FLASHCL_SUCCESS;
}

void fcl_tuning_free(flashcl_context *ctx) {
  if (ctx->tuning) {
    fcl_tune_table *t = ctx->tuning->first;
    while (t) {
      fcl_tune_table *next = t->next;
      free(t->e);
      free(t);
      t = next;
    }
    free(ctx->tuning);
    ctx->tuning = NULL;
  }
  free(ctx->tuning_log);
  ctx->tuning_log = NULL;
}

const char *flashcl_context_cache_dir(const flashcl_context *ctx) {
  return ctx && ctx->cache_dir ? ctx->cache_dir : "";
}

const char *flashcl_context_tuning_log(const flashcl_context *ctx) {
  return ctx && ctx->tuning_log ? ctx->tuning_log : "";
}

/* How specifically e matches key: -1 if it does not. */
static long long fcl_entry_score(const fcl_tune_entry *e, flashcl_tuning_family f, const fcl_tune_key *key) {
  if (e->t.family != f) return -1;
  if ((e->d >= 0 && e->d != key->head_dim) || (e->dtype >= 0 && e->dtype != (int)key->dtype) ||
      (e->causal >= 0 && e->causal != key->causal) || (e->atomic >= 0 && e->atomic != key->atomic) ||
      (e->nmax > 0 && key->n > e->nmax))
    return -1;
  /* Weights over (1 << 31) so that the smallest nmax breaks ties among equals. */
  const long long spec = (e->d >= 0) * 16 + (e->dtype >= 0) * 8 + (e->atomic >= 0) * 4 + (e->causal >= 0) * 2 + (e->nmax > 0);
  return spec * (1LL << 31) + (e->nmax > 0 ? (1LL << 30) - e->nmax : 0);
}

static void fcl_tuned_take(fcl_tuned *out, const flashcl_tuning *t, flashcl_tuning_source src, const char *origin) {
  out->source = src;
  snprintf(out->origin, sizeof out->origin, "%s", origin);
  for (int k = 0; k < t->count; k++) {
    const int i = fcl_tuning_index(t->family, t->params[k].name);
    if (i >= 0) {
      out->set[i] = 1;
      out->val[i] = t->params[k].value;
      out->call[i] = src == FLASHCL_TUNING_SOURCE_CALL;
    }
  }
}

void fcl_tuning_resolve(const flashcl_context *ctx, flashcl_tuning_family family, const flashcl_tuning *call,
                        const fcl_tune_key *key, fcl_tuned *out) {
  memset(out, 0, sizeof *out);
  out->family = family;
  out->source = FLASHCL_TUNING_SOURCE_DEFAULT;
  snprintf(out->origin, sizeof out->origin, "default rules");
  if (call) {
    fcl_tuned_take(out, call, FLASHCL_TUNING_SOURCE_CALL, "call");
    return;
  }
  for (const fcl_tune_table *t = ctx->tuning ? ctx->tuning->first : NULL; t; t = t->next) {
    const fcl_tune_entry *best = NULL;
    long long best_score = -1;
    for (int i = 0; i < t->n; i++) {
      const long long s = fcl_entry_score(&t->e[i], family, key);
      if (s > best_score) best_score = s, best = &t->e[i];
    }
    if (best) {
      fcl_tuned_take(out, &best->t, t->source, t->origin);
      return;
    }
  }
}
