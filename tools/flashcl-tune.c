/*
 * flashcl-tune: searches the declared tuning spaces on a device and writes the
 * tuning file the library loads at run time (README "Tuning").
 *
 * For each representative problem (pass, head dim, dtype, causal, dQ mode,
 * sequence length) it tunes the kernel family the library runs there, starting
 * from what the built-in database and the default rules give (tune_search.c),
 * and writes one entry per problem. Finished problems go to a journal next to
 * the output, so an interrupted run resumes where it stopped.
 *
 * flashcl-tune --decode-splits keeps the older sweep of the decode's split
 * count (tune_decode.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "common.h"
#include "json.h"
#include "tune_against.h"
#include "tune_decode.h"
#include "tune_file.h"

typedef struct tune_opts {
  const char *device, *output, *params, *start, *against;
  int pass[3], all, any_pass, fresh, csv, json, verbose, list, dry_run, quiet, gpu;
  tools_list d, dtype, causal, atomic, n, dec_n, families;
  int have_d, have_dtype, have_causal, have_atomic, have_n, have_dec_n, have_families;
  long budget_s, reps, warmup, passes, batch_tokens, hidden, dec_batch, dec_calls;
  flashcl_kernel_family kernel;
} tune_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: flashcl-tune [options]          search the tuning spaces, write a tuning file\n"
          "       flashcl-tune --list             print the declared spaces\n"
          "       flashcl-tune --decode-splits    the older sweep of the decode split count (--decode-splits --help)\n"
          "\n"
          "Without a pass flag every pass is tuned (--all). For each problem the family the library\n"
          "runs there is searched from the configuration the built-in database and the default\n"
          "rules give: every candidate's output is checked against that configuration's (outputs\n"
          "poisoned first) and a wrong one is never chosen; candidates are timed interleaved with\n"
          "the incumbent, and the result against the starting point in a longer final comparison.\n"
          "\n"
          "  --all                 forward, backward and decode (the default)\n"
          "  --forward, --backward, --decode   only these passes\n"
          "  --family LIST         only problems that run these families (fwd,bwd,mma_fwd,mma_bwd,\n"
          "                        wgmma_fwd,decode)\n"
          "  --params LIST         only these parameters (e.g. br,bc)\n"
          "  --d LIST              head dims (default 64,128)\n"
          "  --dtype LIST          f32,f16,bf16 (default f16,f32 on GPUs; f32,f16 for the forward and\n"
          "                        f32 for the backward and decode elsewhere). On GPUs the 16-bit\n"
          "                        forward is also tuned in the mma_fwd family where AUTO runs\n"
          "                        wgmma_fwd (mma.sync still runs dropout, masks, paged K/V)\n"
          "  --causal LIST         0,1 (default 0,1 for the forward, 0 for the backward)\n"
          "  --atomic LIST         backward dQ: 0 deterministic, 1 atomic (default 0,1 on GPUs, 0)\n"
          "  --n LIST              sequence lengths; each but the largest becomes an nmax bucket\n"
          "                        (default 4096 on GPUs, 512 otherwise)\n"
          "  --decode-n LIST       decode KV lengths (default 32768 on GPUs, 2048 otherwise)\n"
          "  --kernel auto|portable|nvidia_mma   the desc.algorithm.kernel the problems run with (default auto)\n"
          "  --budget SECONDS      search time for the whole run (default 480 on GPUs, 1500 otherwise);\n"
          "                        each problem gets an equal share of what is left\n"
          "  --reps R              paired rounds per comparison (default 5 on GPUs, 3 otherwise;\n"
          "                        the final comparison runs 2R+1)\n"
          "  --warmup W            untimed runs of each side per comparison (default 1)\n"
          "  --passes P            coordinate-descent passes at most (default 2)\n"
          "  --output FILE         the tuning file (default <cache dir>/tuning/<device>.tune, which\n"
          "                        the library loads by itself); the journal is FILE.journal\n"
          "  --start FILE          a tuning file searched before the built-in database: the search\n"
          "                        starts from its entries (an entry with no parameters, e.g.\n"
          "                        \"fwd :\", starts that family from the default rules)\n"
          "  --against FILE        write nothing: for every problem, compare what the library runs\n"
          "                        with its own sources (A) and with FILE searched first (B), in\n"
          "                        2R+1 alternating rounds in this process; B's outputs are checked\n"
          "                        against A's. Exit status 1 if any differ or a problem fails\n"
          "  --fresh               ignore an existing journal (default: resume from it)\n"
          "  --dry-run             search and report, write nothing\n"
          "  --csv                 one CSV row per problem on stdout, no progress line\n"
          "  --json                one JSON object on stdout instead, no progress line: \"device\",\n"
          "                        \"problems\" (the CSV columns and a \"status\") and \"summary\"\n"
          "  --quiet               no progress line\n"
          "  --device SPEC         \"<platform>:<device>\" or a name substring\n"
          "  --verbose             every candidate, and library diagnostics, on stderr\n");
}

static int parse_family_list(const char *s, void *dest) {
  tools_list *l = (tools_list *)dest;
  char word[32];
  l->count = 0;
  while (*s) {
    const size_t len = strcspn(s, ",");
    flashcl_tuning_family f;
    if (len >= sizeof word || l->count == TOOLS_MAX_LIST) return -1;
    memcpy(word, s, len), word[len] = '\0';
    if (flashcl_tuning_family_parse(word, &f)) return -1;
    l->v[l->count++] = f;
    s += len + (s[len] == ',');
  }
  return l->count ? 0 : -1;
}

static args_status parse_args(int argc, char **argv, tune_opts *o) {
  const args_opt table[] = {
      {.name = "--all", .kind = ARG_FLAG, .dest = &o->all, .seen = &o->any_pass},
      {.name = "--forward", .kind = ARG_FLAG, .dest = &o->pass[TUNE_FORWARD], .seen = &o->any_pass},
      {.name = "--backward", .kind = ARG_FLAG, .dest = &o->pass[TUNE_BACKWARD], .seen = &o->any_pass},
      {.name = "--decode", .kind = ARG_FLAG, .dest = &o->pass[TUNE_DECODE], .seen = &o->any_pass},
      {.name = "--d", .kind = ARG_INT_LIST, .dest = &o->d, .seen = &o->have_d},
      {.name = "--dtype", .kind = ARG_DTYPE_LIST, .dest = &o->dtype, .seen = &o->have_dtype},
      {.name = "--causal", .kind = ARG_CAUSAL_LIST, .dest = &o->causal, .seen = &o->have_causal},
      {.name = "--atomic", .kind = ARG_CAUSAL_LIST, .dest = &o->atomic, .seen = &o->have_atomic},
      {.name = "--n", .kind = ARG_INT_LIST, .dest = &o->n, .seen = &o->have_n},
      {.name = "--decode-n", .kind = ARG_INT_LIST, .dest = &o->dec_n, .seen = &o->have_dec_n},
      {.name = "--family", .kind = ARG_CUSTOM, .dest = &o->families, .seen = &o->have_families,
       .parse = parse_family_list},
      {.name = "--params", .kind = ARG_STRING, .dest = &o->params},
      {.name = "--device", .kind = ARG_STRING, .dest = &o->device},
      {.name = "--output", .kind = ARG_STRING, .dest = &o->output},
      {.name = "--start", .kind = ARG_STRING, .dest = &o->start},
      {.name = "--against", .kind = ARG_STRING, .dest = &o->against},
      {.name = "--kernel", .kind = ARG_KERNEL, .dest = &o->kernel},
      {.name = "--budget", .kind = ARG_LONG, .dest = &o->budget_s, .lo = 1, .hi = LONG_MAX},
      {.name = "--reps", .kind = ARG_LONG, .dest = &o->reps, .lo = 1, .hi = 30},
      {.name = "--warmup", .kind = ARG_LONG, .dest = &o->warmup, .lo = 0, .hi = 100},
      {.name = "--passes", .kind = ARG_LONG, .dest = &o->passes, .lo = 1, .hi = 10},
      {.name = "--fresh", .kind = ARG_FLAG, .dest = &o->fresh},
      {.name = "--dry-run", .kind = ARG_FLAG, .dest = &o->dry_run},
      {.name = "--csv", .kind = ARG_FLAG, .dest = &o->csv},
      {.name = "--json", .kind = ARG_FLAG, .dest = &o->json},
      {.name = "--quiet", .kind = ARG_FLAG, .dest = &o->quiet},
      {.name = "--list", .kind = ARG_FLAG, .dest = &o->list},
      {.name = "--verbose", .alias = "-v", .kind = ARG_FLAG, .dest = &o->verbose},
      {.name = "--help", .alias = "-h", .kind = ARG_HELP},
  };
  memset(o, 0, sizeof *o);
  o->warmup = 1, o->passes = 2, o->kernel = FLASHCL_KERNEL_AUTO;
  const args_status st = args_parse(argc, argv, "flashcl-tune", table, ARGS_COUNT(table));
  if (st == ARGS_OK && o->csv && o->json) {
    fprintf(stderr, "flashcl-tune: --csv and --json are mutually exclusive\n");
    return ARGS_BAD_VALUE;
  }
  /* Pass flags add up; --all, or none of them, means every pass. */
  if (o->all || !o->any_pass) o->pass[0] = o->pass[1] = o->pass[2] = 1;
  return st;
}

static int print_spaces(void) {
  for (int f = 0; f < FLASHCL_TUNE_FAMILY_COUNT; ++f) {
    flashcl_tuning_param_info p;
    printf("%s\n", flashcl_tuning_family_name((flashcl_tuning_family)f));
    for (int i = 0; flashcl_tuning_space((flashcl_tuning_family)f, i, &p) == FLASHCL_SUCCESS; ++i) {
      printf("  %-14s %d..%d step %d; searched:", p.name, p.min, p.max, p.step);
      for (int c = 0; c < p.num_candidates; ++c) printf(" %d", p.candidates[c]);
      printf("%s\n      %s\n", p.num_candidates ? "" : " (not searched)", p.description);
    }
  }
  return 0;
}

/* The defaults that depend on the device (see usage). */
static void device_defaults(tune_opts *o, int gpu) {
  o->gpu = gpu;
  if (!o->have_d) tools_parse_int_list("64,128", &o->d);
  if (!o->have_causal) tools_parse_causal_list("0,1", &o->causal);
  if (!o->have_atomic) tools_parse_causal_list(gpu ? "0,1" : "0", &o->atomic);
  if (!o->have_n) tools_parse_int_list(gpu ? "4096" : "512", &o->n);
  if (!o->have_dec_n) tools_parse_int_list(gpu ? "32768" : "2048", &o->dec_n);
  if (!o->budget_s) o->budget_s = gpu ? 480 : 1500;
  if (!o->reps) o->reps = gpu ? 5 : 3;
  o->batch_tokens = gpu ? 16384 : 512;
  o->hidden = gpu ? 2048 : 256;
  o->dec_batch = gpu ? 8 : 2;
  o->dec_calls = gpu ? 10 : 1;
}

#define MAX_SHAPES 512

/* The problems to tune, in the order they run. */
static int make_shapes(const tune_opts *o, tune_shape *out) {
  int n = 0;
  tools_list fdt, bdt, ddt;
  tools_parse_dtype_list(o->gpu ? "f16,f32" : "f32,f16", &fdt);
  tools_parse_dtype_list(o->gpu ? "f16,f32" : "f32", &bdt);
  tools_parse_dtype_list(o->gpu ? "f16,f32" : "f32", &ddt);
  if (o->have_dtype) fdt = bdt = ddt = o->dtype;
  for (int pass = 0; pass < 3; ++pass) {
    if (!o->pass[pass]) continue;
    const tools_list *dts = pass == TUNE_FORWARD ? &fdt : pass == TUNE_BACKWARD ? &bdt : &ddt;
    const tools_list *ns = pass == TUNE_DECODE ? &o->dec_n : &o->n;
    tools_list one = {1, {0}}, bcausal = o->causal;
    if (pass == TUNE_BACKWARD && !o->have_causal) bcausal.count = 1, bcausal.v[0] = 0;
    const tools_list *cs = pass == TUNE_DECODE ? &one : pass == TUNE_BACKWARD ? &bcausal : &o->causal;
    const tools_list *as = pass == TUNE_BACKWARD ? &o->atomic : &one;
    for (int di = 0; di < o->d.count; ++di)
      for (int ti = 0; ti < dts->count; ++ti)
        for (int ci = 0; ci < cs->count; ++ci)
          for (int ai = 0; ai < as->count; ++ai)
            for (int ni = 0; ni < ns->count && n < MAX_SHAPES; ++ni) {
              tune_shape *s = &out[n++];
              memset(s, 0, sizeof *s);
              s->pass = (tune_pass)pass, s->d = (int)o->d.v[di], s->dtype = (flashcl_dtype)dts->v[ti];
              s->causal = (int)cs->v[ci], s->atomic = (int)as->v[ai], s->n = ns->v[ni], s->kernel = o->kernel;
              s->heads = o->hidden / s->d > 0 ? o->hidden / s->d : 1;
              s->batch = pass == TUNE_DECODE ? o->dec_batch : (o->batch_tokens / s->n > 0 ? o->batch_tokens / s->n : 1);
              s->heads_kv = pass == TUNE_DECODE && s->heads % 4 == 0 ? s->heads / 4 : s->heads;
              s->q_len = 1, s->calls = o->dec_calls, s->force = FLASHCL_TUNE_NONE;
              /* On GPUs the 16-bit forward also in the mma.sync family, which runs
               * what the Hopper kernel does not cover (skipped where it cannot run). */
              if (pass == TUNE_FORWARD && o->gpu && s->dtype != FLASHCL_F32 && n < MAX_SHAPES)
                out[n] = *s, out[n++].force = FLASHCL_TUNE_MMA_FWD;
            }
  }
  return n;
}

/* nmax of a shape's entry: its n, unless it is the largest of its list. */
static long shape_nmax(const tune_opts *o, const tune_shape *s) {
  const tools_list *ns = s->pass == TUNE_DECODE ? &o->dec_n : &o->n;
  for (int i = 0; i < ns->count; ++i)
    if (ns->v[i] > s->n) return s->n;
  return 0;
}

typedef struct run_state {
  const tune_opts *o;
  flashcl_context *ctx;
  flashcl_context_options options;
  char devdesc[512], date[32];
  double t0, budget_end;
  int index, total, finished, tty;
  double finished_ms;
  int json_rows; /* --json: problems written */
} run_state;

/* --json: the separator and the start of the next problem's object. */
static void json_problem(run_state *rs, tools_json *j, const char *problem, const char *status) {
  fputs(rs->json_rows++ ? ",\n" : "\n", stdout);
  tools_json_open(j, stdout);
  tools_json_str(j, "device", rs->devdesc);
  tools_json_str(j, "problem", problem);
  tools_json_str(j, "status", status);
}

/* --json: one tuned problem, the CSV's columns. */
static void report_json(run_state *rs, const tune_result *r, const tune_done *d) {
  tools_json j;
  json_problem(rs, &j, d->problem, "ok");
  tools_json_str(&j, "family", flashcl_tuning_family_name(r->family));
  tools_json_str(&j, "kernel", r->best_kernel);
  tools_json_bool(&j, "changed", r->changed);
  tools_json_num(&j, "start_ms", r->base_ms);
  tools_json_num(&j, "tuned_ms", r->best_ms);
  tools_json_num(&j, "tuned_over_start", r->best_ms / r->base_ms);
  tools_json_num(&j, "start_noise", r->base_noise);
  tools_json_num(&j, "tuned_noise", r->best_noise);
  tools_json_int(&j, "rounds_faster", r->best_wins);
  tools_json_int(&j, "rounds", r->rounds);
  tools_json_int(&j, "timed", r->tried);
  tools_json_int(&j, "wrong", r->wrong);
  tools_json_int(&j, "cannot_run", r->infeasible);
  tools_json_int(&j, "duplicates", r->duplicate);
  tools_json_num(&j, "max_rel_l2", r->max_rel);
  tools_json_bool(&j, "budget_cut", r->timed_out);
  tools_json_str(&j, "entry", d->entry);
  tools_json_close(&j);
  fflush(stdout);
}

static void fmt_dur(double s, char *buf, size_t cap) {
  if (s < 0) s = 0;
  if (s < 60) snprintf(buf, cap, "%.0fs", s);
  else snprintf(buf, cap, "%ldm%02lds", (long)s / 60, (long)s % 60);
}

/* The progress line: on a terminal only, rewritten in place on stderr. */
static void progress(void *user, int done, int total) {
  const run_state *rs = (const run_state *)user;
  if (!rs->tty) return;
  const double now = tools_now_ms(), elapsed = (now - rs->t0) / 1e3;
  const int left = rs->total - rs->index + 1;
  double eta = rs->finished ? rs->finished_ms / 1e3 / rs->finished * left : (rs->budget_end - now) / 1e3;
  if (eta > (rs->budget_end - now) / 1e3 + 60.0 * left) eta = (rs->budget_end - now) / 1e3 + 60.0 * left;
  char e[32], r[32];
  fmt_dur(elapsed, e, sizeof e), fmt_dur(eta, r, sizeof r);
  fprintf(stderr, "\r\033[K[%d/%d] candidate %d/%d | elapsed %s | ETA %s", rs->index, rs->total, done, total, e, r);
  fflush(stderr);
}

static void clear_progress(const run_state *rs) {
  if (rs->tty) fprintf(stderr, "\r\033[K");
}

static int start_loaded(flashcl_context *ctx, const char *path) {
  char needle[4200];
  snprintf(needle, sizeof needle, "%s: loaded (", path);
  return strstr(flashcl_context_tuning_log(ctx), needle) != NULL;
}

/* The search starts from the built-in database and the default rules (after
 * --start's file, when given), never from an earlier run's file in the cache
 * directory, so that re-tuning does not build on itself. */
static int open_ctx(const tune_opts *o, flashcl_context_options *opts, flashcl_context **ctx,
                    flashcl_device_info *info) {
  flashcl_context_options_init(opts);
  opts->device = o->device;
  opts->profiling = 1;
  opts->verbose = o->verbose;
  opts->tuning_file = o->start ? o->start : "";
  opts->no_user_tuning = 1;
  int st = flashcl_context_create(opts, ctx);
  if (!st) st = flashcl_context_device_info(*ctx, info);
  if (!st && o->start && !start_loaded(*ctx, o->start)) {
    fprintf(stderr, "flashcl-tune: --start: %s was not loaded:\n%s", o->start, flashcl_context_tuning_log(*ctx));
    flashcl_context_destroy(*ctx);
    *ctx = NULL;
    return FLASHCL_ERROR_INVALID_ARGUMENT;
  }
  if (st) {
    fprintf(stderr, "flashcl-tune: cannot open %s: %s (%d)\n", o->device ? o->device : "the default device",
            flashcl_status_string(st), st);
    flashcl_context_destroy(*ctx);
    *ctx = NULL;
  }
  return st;
}

/* <cache dir>/tuning/<device name with anything but [A-Za-z0-9.-] as '_'>.tune */
static int default_output(flashcl_context *ctx, const flashcl_device_info *info, char *buf, size_t cap) {
  const char *dir = flashcl_context_cache_dir(ctx);
  char name[160];
  size_t i = 0;
  if (!*dir) return -1;
  for (const char *c = info->device_name; *c && i + 1 < sizeof name; ++c)
    name[i++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
                        *c == '-' ? *c : '_';
  name[i] = '\0';
  return snprintf(buf, cap, "%s/tuning/%s.tune", dir, name) >= (int)cap ? -1 : 0;
}

static int family_wanted(const tune_opts *o, flashcl_tuning_family f) {
  if (!o->have_families) return 1;
  for (int i = 0; i < o->families.count; ++i)
    if (o->families.v[i] == f) return 1;
  return 0;
}

static int family_wanted_cb(const void *user, flashcl_tuning_family f) {
  return family_wanted((const tune_opts *)user, f);
}

/* --against FILE: compare, write nothing. */
static int run_against(run_state *rs, const tune_shape *shapes, int nshapes) {
  const tune_opts *o = rs->o;
  tune_against_opts ao;
  memset(&ao, 0, sizeof ao);
  ao.file = o->against, ao.csv = o->csv, ao.json = o->json, ao.quiet = o->quiet, ao.devdesc = rs->devdesc;
  ao.search.reps = (int)o->reps, ao.search.warmup = (int)o->warmup;
  ao.wanted = family_wanted_cb, ao.user = o;
  return tune_against_run(rs->ctx, &rs->options, shapes, nshapes, &ao);
}

static void report(run_state *rs, const tune_result *r, const tune_done *d) {
  const double ratio = r->best_ms / r->base_ms;
  if (rs->o->json) {
    report_json(rs, r, d);
    return;
  }
  if (rs->o->csv) {
    printf("\"%s\",\"%s\",%s,%s,%d,%.6f,%.6f,%.4f,%.4f,%.4f,%d,%d,%d,%d,%d,%d,%.3e,%d,\"%s\"\n", rs->devdesc,
           d->problem, flashcl_tuning_family_name(r->family), r->best_kernel, r->changed, r->base_ms, r->best_ms, ratio,
           r->base_noise,
           r->best_noise, r->best_wins, r->rounds, r->tried, r->wrong, r->infeasible, r->duplicate, r->max_rel,
           r->timed_out, d->entry);
  } else {
    printf("[%d/%d] %s\n  %s: %.4f -> %.4f ms (tuned/start %.3f%s; noise %.1f%% / %.1f%%; faster in %d/%d rounds); "
           "%d timed, %d wrong, %d cannot run%s\n  %s\n",
           rs->index, rs->total, d->problem, flashcl_tuning_family_name(r->family), r->base_ms, r->best_ms, ratio,
           r->changed ? "" : ", unchanged: the same configuration timed twice",
           100 * r->base_noise, 100 * r->best_noise, r->best_wins, r->rounds, r->tried, r->wrong, r->infeasible,
           r->timed_out ? "; budget share spent" : "", d->entry);
  }
  fflush(stdout);
}

/* Tunes one problem into d: 0, 1 when its family is not wanted, or a status. */
static int run_problem(run_state *rs, const tune_shape *s, double deadline, tune_done *d) {
  tune_problem p;
  tune_result r;
  flashcl_config cfg;
  tune_search_opts so = {(int)rs->o->reps, (int)rs->o->warmup, (int)rs->o->passes, deadline, rs->o->params,
                         rs->o->verbose ? stderr : NULL, progress, rs};
  tune_shape_name(s, d->problem, sizeof d->problem);
  int st = tune_problem_create(rs->ctx, s, &p);
  if (!st) st = tune_problem_config(rs->ctx, &p, NULL, &cfg);
  if (st == FLASHCL_ERROR_UNSUPPORTED && s->force != FLASHCL_TUNE_NONE) {
    if (rs->o->verbose) fprintf(stderr, "%s: skipped: %s\n", d->problem, flashcl_context_last_error(rs->ctx));
    tune_problem_destroy(&p);
    return 1;
  }
  if (!st && !family_wanted(rs->o, cfg.family)) {
    tune_problem_destroy(&p);
    return 1;
  }
  if (!st && rs->o->verbose) fprintf(stderr, "%s: %s from %s\n", d->problem, cfg.kernel, cfg.origin);
  if (!st) st = tune_search(rs->ctx, &p, &so, &r);
  tune_problem_destroy(&p);
  clear_progress(rs);
  if (st) {
    char what[300];
    snprintf(what, sizeof what, "[%d/%d] %s", rs->index, rs->total, d->problem);
    tools_print_error(stderr, rs->ctx, what, st);
    if (rs->o->json) {
      tools_json j;
      json_problem(rs, &j, d->problem, flashcl_status_string(st));
      tools_json_int(&j, "status_code", st);
      tools_json_close(&j);
    }
    return st;
  }
  if (tune_entry_line(s, &r, shape_nmax(rs->o, s), d->entry, sizeof d->entry)) return FLASHCL_ERROR_INTERNAL;
  snprintf(d->comment, sizeof d->comment,
           "%s: %s %.4f ms from %s, %s %.4f ms (%.3fx the time; noise %.1f%%/%.1f%%); %d timed, %d wrong (%s)",
           d->problem, r.best_kernel, r.base_ms, r.base_origin, r.changed ? "tuned" : "unchanged, again", r.best_ms,
           r.best_ms / r.base_ms, 100 * r.base_noise,
           100 * r.best_noise, r.tried, r.wrong, rs->date);
  report(rs, &r, d);
  return 0;
}

/* A device error can leave the OpenCL context unusable: go on with a new one. */
static int reopen(run_state *rs) {
  flashcl_context_destroy(rs->ctx);
  rs->ctx = NULL;
  int st = flashcl_context_create(&rs->options, &rs->ctx);
  if (st) fprintf(stderr, "flashcl-tune: cannot recreate the context (%s): stopping\n", flashcl_status_string(st));
  return st;
}

/* A fresh context must load what was written, or the file is no use. */
static int verify_file(const run_state *rs, const char *path, int entries) {
  flashcl_context_options opts = rs->options;
  flashcl_context *ctx = NULL;
  char needle[4200];
  opts.tuning_file = path;
  opts.profiling = 0;
  if (flashcl_context_create(&opts, &ctx)) return -1;
  snprintf(needle, sizeof needle, "%s: loaded (tuning file, %d entries)", path, entries);
  const int ok = strstr(flashcl_context_tuning_log(ctx), needle) != NULL;
  if (!ok) fprintf(stderr, "flashcl-tune: %s does not load:\n%s", path, flashcl_context_tuning_log(ctx));
  flashcl_context_destroy(ctx);
  return ok ? 0 : -1;
}

static int already_done(const tune_done *done, int ndone, const char *name) {
  for (int i = 0; i < ndone; ++i)
    if (!strcmp(done[i].problem, name)) return 1;
  return 0;
}

/* Runs every problem not in the journal; appends each to done and the journal. */
static int run_all(run_state *rs, const tune_shape *shapes, int nshapes, const char *journal, tune_done **done,
                   int *ndone) {
  int failures = 0, todo = 0;
  char name[256];
  for (int i = 0; i < nshapes; ++i) tune_shape_name(&shapes[i], name, sizeof name), todo += !already_done(*done, *ndone, name);
  rs->total = nshapes;
  for (int i = 0; i < nshapes; ++i) {
    tune_done d;
    tune_shape_name(&shapes[i], name, sizeof name);
    rs->index = i + 1;
    if (already_done(*done, *ndone, name)) continue;
    const double now = tools_now_ms(), t = now;
    const double deadline = now + (rs->budget_end - now) / (todo > 0 ? todo : 1);
    --todo;
    memset(&d, 0, sizeof d);
    const int st = run_problem(rs, &shapes[i], deadline, &d);
    if (st == 1) continue;
    if (st) {
      ++failures;
      if (!tools_is_validation_error(st) && reopen(rs)) return failures;
      continue;
    }
    rs->finished++, rs->finished_ms += tools_now_ms() - t;
    tune_done *grown = (tune_done *)realloc(*done, sizeof(tune_done) * (size_t)(*ndone + 1));
    if (!grown) return failures + 1;
    *done = grown;
    (*done)[(*ndone)++] = d;
    if (journal && tune_journal_append(journal, &d))
      fprintf(stderr, "flashcl-tune: cannot append to %s: resuming will redo this problem\n", journal);
  }
  return failures;
}

static int finish(run_state *rs, const char *out, const char *journal, const char *header, tune_done *done,
                  int ndone, int argc, char **argv) {
  char preamble[4096], why[512];
  size_t used = (size_t)snprintf(preamble, sizeof preamble,
                                 "# Written by flashcl-tune %s on %s, %s.\n# Command:", FLASHCL_VERSION_STRING,
                                 rs->devdesc, rs->date);
  for (int i = 0; i < argc && used < sizeof preamble - 64; ++i)
    used += (size_t)snprintf(preamble + used, sizeof preamble - used, " %s", argv[i]);
  snprintf(preamble + used, sizeof preamble - used, "\n# Each entry: what the problem ran before and after.\n\n");
  if (tune_file_write(out, header, preamble, done, ndone, why, sizeof why)) {
    fprintf(stderr, "flashcl-tune: %s\n", why);
    return 1;
  }
  remove(journal);
  if (verify_file(rs, out, ndone)) return 1;
  if (!rs->o->csv && !rs->o->json) printf("wrote %s (%d entries); a new context loads it\n", out, ndone);
  return 0;
}

/* --json: the summary and the document's end. */
static void json_end(const run_state *rs, int tuned, int failures, const char *out, int rc) {
  tools_json j;
  fputs("\n],\"summary\":", stdout);
  tools_json_open(&j, stdout);
  tools_json_int(&j, "problems", rs->total);
  tools_json_int(&j, "tuned", tuned);
  tools_json_int(&j, "failed", failures);
  tools_json_num(&j, "total_s", (tools_now_ms() - rs->t0) / 1e3);
  tools_json_str(&j, "output", out);
  tools_json_int(&j, "exit_status", rc);
  tools_json_close(&j);
  fputs("}\n", stdout);
  fflush(stdout);
}

int main(int argc, char **argv) {
  tune_opts o;
  run_state rs;
  flashcl_device_info info;
  static tune_shape shapes[MAX_SHAPES];
  char header[2048], out[4096], journal[4200];
  tune_done *done = NULL;
  int ndone = 0;
  for (int i = 1; i < argc; ++i)
    if (!strcmp(argv[i], "--decode-splits")) return tune_decode_main(argc, argv);
  const args_status parsed = parse_args(argc, argv, &o);
  if (parsed == ARGS_HELP) {
    usage(stdout);
    return 0;
  }
  if (parsed == ARGS_UNKNOWN) {
    fputc('\n', stderr);
    usage(stderr);
  }
  if (parsed != ARGS_OK) return 1;
  if (o.list) return print_spaces();
  memset(&rs, 0, sizeof rs);
  rs.o = &o;
  if (open_ctx(&o, &rs.options, &rs.ctx, &info)) return 2;
  device_defaults(&o, info.is_gpu);
  const int nshapes = make_shapes(&o, shapes);
  tools_describe_device(rs.ctx, rs.devdesc, sizeof rs.devdesc);
  if (o.against) {
    const int rc = run_against(&rs, shapes, nshapes);
    flashcl_context_destroy(rs.ctx);
    return rc;
  }
  const time_t now = time(NULL);
  strftime(rs.date, sizeof rs.date, "%Y-%m-%d", gmtime(&now));
  if (flashcl_context_tuning_header(rs.ctx, header, sizeof header) ||
      (o.output ? snprintf(out, sizeof out, "%s", o.output) >= (int)sizeof out : default_output(rs.ctx, &info, out, sizeof out))) {
    fprintf(stderr, "flashcl-tune: no cache directory could be named: pass --output FILE\n");
    flashcl_context_destroy(rs.ctx);
    return 1;
  }
  snprintf(journal, sizeof journal, "%s.journal", out);
  if (!o.dry_run && !o.fresh) {
    const char *why = NULL;
    const int got = tune_journal_load(journal, header, &done, &ndone, &why);
    if (got < 0) fprintf(stderr, "flashcl-tune: not resuming from %s: %s\n", journal, why);
    else if (got > 0 && !o.csv && !o.json) printf("resuming: %d problem(s) already tuned in %s\n", got, journal);
  }
  if (!o.dry_run && !ndone && tune_journal_start(journal, header))
    fprintf(stderr, "flashcl-tune: cannot write the journal %s: an interrupted run will start over\n", journal);
  rs.tty = !o.csv && !o.json && !o.quiet && isatty(2);
  rs.t0 = tools_now_ms();
  rs.budget_end = rs.t0 + 1e3 * (double)o.budget_s;
  if (o.json) {
    tools_json j;
    tools_json_open(&j, stdout);
    tools_json_str(&j, "tool", "flashcl-tune");
    tools_json_device(&j, "device", rs.ctx);
    fputs(",\"problems\":[", stdout);
  } else if (o.csv)
    printf("device,problem,family,kernel,changed,start_ms,tuned_ms,tuned_over_start,start_noise,tuned_noise,rounds_faster,"
           "rounds,timed,wrong,cannot_run,duplicates,max_rel_l2,budget_cut,entry\n");
  else
    printf("flashcl-tune %s on %s: %d problems, budget %lds%s\n", FLASHCL_VERSION_STRING, rs.devdesc, nshapes,
           o.budget_s, o.dry_run ? " (dry run)" : "");
  fflush(stdout);
  const int failures = run_all(&rs, shapes, nshapes, o.dry_run ? NULL : journal, &done, &ndone);
  int rc = failures ? 1 : 0;
  if (!o.dry_run && rs.ctx && ndone) rc |= finish(&rs, out, journal, header, done, ndone, argc, argv);
  if (o.json) json_end(&rs, ndone, failures, o.dry_run ? NULL : out, rc);
  else if (!o.csv) {
    char e[32];
    fmt_dur((tools_now_ms() - rs.t0) / 1e3, e, sizeof e);
    printf("%d problem(s) tuned in %s%s\n", ndone, e, failures ? ", with failures (see above)" : "");
  }
  free(done);
  flashcl_context_destroy(rs.ctx);
  return rc;
}
