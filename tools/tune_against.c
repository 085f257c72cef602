/*
 * flashcl-tune --against FILE (see tune_against.h). Side A is the context the
 * tuner opened (the built-in database and the default rules, or --start's
 * file first); side B is a second flashcl context over the same OpenCL
 * context and queue with FILE searched first. Each problem is created once,
 * so both sides read the same inputs, and B's outputs are checked against A's
 * before anything is timed.
 */
#include "tune_against.h"
#include "tune_rule.h"

#include "json.h"

#include <stdlib.h>
#include <string.h>

typedef struct ta_row {
  char problem[256];
  flashcl_config a, b;
  int same, wrong;
  double rel;
  tune_comparison c;
} ta_row;

typedef struct ta_summary {
  int rows, same, faster, slower, within, failed, wrong;
  double worst; /* the largest B/A time among the timed problems */
} ta_summary;

static int ta_open(flashcl_context *ctx, const flashcl_context_options *options, const char *file,
                   flashcl_context **cb) {
  flashcl_context_options opts = *options;
  char needle[4200];
  opts.tuning_file = file;
  int st = flashcl_context_create_from_cl(flashcl_context_cl_context(ctx), flashcl_context_cl_device(ctx),
                                          flashcl_context_cl_queue(ctx), &opts, cb);
  if (st) {
    fprintf(stderr, "flashcl-tune: --against: cannot open a second context: %s (%d) %s\n", flashcl_status_string(st),
            st, flashcl_context_last_error(NULL));
    return 2;
  }
  snprintf(needle, sizeof needle, "%s: loaded (", file);
  if (!strstr(flashcl_context_tuning_log(*cb), needle)) {
    fprintf(stderr, "flashcl-tune: --against: %s was not loaded:\n%s", file, flashcl_context_tuning_log(*cb));
    flashcl_context_destroy(*cb);
    *cb = NULL;
    return 2;
  }
  return 0;
}

/* Both sides' outputs within the tuner's tolerance of each other. */
static int ta_check(flashcl_context *ca, flashcl_context *cb, tune_problem *p, ta_row *row) {
  float *ref = (float *)malloc(p->out_count * sizeof(float));
  float *got = (float *)malloc(p->out_count * sizeof(float));
  int st = ref && got ? tune_problem_check_run(ca, p, NULL, ref) : FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
  if (!st) st = tune_problem_check_run(cb, p, NULL, got);
  if (!st) {
    row->rel = tools_rel_l2(got, ref, p->out_count);
    row->wrong = !(row->rel <= tune_tolerance(p->s.dtype)) || !(tools_rel_l2(ref, ref, p->out_count) == 0.0);
  }
  free(ref);
  free(got);
  return st;
}

/* One problem: 0, 1 when it is skipped (not wanted, or a forced family that
 * cannot run it), or a status. */
static int ta_problem(flashcl_context *ca, flashcl_context *cb, const tune_shape *s, const tune_against_opts *o,
                      ta_row *row) {
  tune_problem p;
  memset(row, 0, sizeof *row);
  tune_shape_name(s, row->problem, sizeof row->problem);
  int st = tune_problem_create(ca, s, &p);
  if (!st) st = tune_problem_config(ca, &p, NULL, &row->a);
  if (!st) st = tune_problem_config(cb, &p, NULL, &row->b);
  if ((st == FLASHCL_ERROR_UNSUPPORTED && s->force != FLASHCL_TUNE_NONE) ||
      (!st && o->wanted && !o->wanted(o->user, row->a.family))) {
    tune_problem_destroy(&p);
    return 1;
  }
  if (!st) st = ta_check(ca, cb, &p, row);
  row->same = !st && tune_same_config(&row->a, &row->b);
  if (!st && !row->same && !row->wrong)
    st = tune_compare(ca, NULL, cb, NULL, &p, &o->search, 2 * o->search.reps + 1, &row->c);
  tune_problem_destroy(&p);
  return st;
}

static void ta_set_text(const flashcl_config *c, char *buf, size_t cap) {
  if (flashcl_tuning_format(&c->set, buf, cap)) snprintf(buf, cap, "(too long to show)");
}

static void ta_print_json(const tune_against_opts *o, const ta_row *r, int first) {
  char sa[512], sb[512];
  tools_json j;
  ta_set_text(&r->a, sa, sizeof sa), ta_set_text(&r->b, sb, sizeof sb);
  fputs(first ? "\n" : ",\n", stdout);
  tools_json_open(&j, stdout);
  tools_json_str(&j, "device", o->devdesc);
  tools_json_str(&j, "problem", r->problem);
  tools_json_str(&j, "kernel_a", r->a.kernel);
  tools_json_str(&j, "origin_a", r->a.origin);
  tools_json_str(&j, "set_a", sa);
  tools_json_str(&j, "kernel_b", r->b.kernel);
  tools_json_str(&j, "origin_b", r->b.origin);
  tools_json_str(&j, "set_b", sb);
  tools_json_bool(&j, "same", r->same);
  tools_json_bool(&j, "outputs_differ", r->wrong);
  tools_json_num(&j, "rel_l2", r->rel);
  if (r->c.rounds) {
    tools_json_num(&j, "a_ms", r->c.a_ms);
    tools_json_num(&j, "b_ms", r->c.b_ms);
    tools_json_num(&j, "b_over_a", r->c.b_ms / r->c.a_ms);
    tools_json_num(&j, "a_noise", r->c.a_noise);
    tools_json_num(&j, "b_noise", r->c.b_noise);
    tools_json_int(&j, "b_faster_rounds", r->c.b_wins);
    tools_json_int(&j, "rounds", r->c.rounds);
  }
  tools_json_close(&j);
}

static void ta_print(const tune_against_opts *o, const ta_row *r, int index, int total) {
  char sa[512], sb[512];
  ta_set_text(&r->a, sa, sizeof sa), ta_set_text(&r->b, sb, sizeof sb);
  if (o->csv) {
    printf("\"%s\",\"%s\",%s,\"%s\",\"%s\",%s,\"%s\",\"%s\",%d,%d,%.3e", o->devdesc, r->problem, r->a.kernel,
           r->a.origin, sa, r->b.kernel, r->b.origin, sb, r->same, r->wrong, r->rel);
    if (r->c.rounds)
      printf(",%.6f,%.6f,%.4f,%.4f,%.4f,%d,%d\n", r->c.a_ms, r->c.b_ms, r->c.b_ms / r->c.a_ms, r->c.a_noise,
             r->c.b_noise, r->c.b_wins, r->c.rounds);
    else
      printf(",,,,,,,\n");
    return;
  }
  printf("[%d/%d] %s\n  A %s (%s): %s\n  B %s (%s): %s\n", index, total, r->problem, r->a.kernel, r->a.origin, sa,
         r->b.kernel, r->b.origin, sb);
  if (r->wrong) printf("  B's outputs DIFFER from A's: rel-L2 %.2e\n", r->rel);
  else if (r->same) printf("  the same configuration: not timed\n");
  else
    printf("  A %.4f ms, B %.4f ms: B/A time %.3f (noise %.1f%% / %.1f%%; B faster in %d/%d rounds); rel-L2 %.1e\n",
           r->c.a_ms, r->c.b_ms, r->c.b_ms / r->c.a_ms, 100 * r->c.a_noise, 100 * r->c.b_noise, r->c.b_wins,
           r->c.rounds, r->rel);
}

/* The search's rule (tune_faster) both ways. */
static void ta_count(ta_summary *m, const ta_row *r) {
  m->rows++;
  if (r->wrong) {
    m->wrong++;
    return;
  }
  if (r->same) {
    m->same++;
    return;
  }
  const double ratio = r->c.b_ms / r->c.a_ms;
  if (ratio > m->worst) m->worst = ratio;
  const tune_comparison *c = &r->c;
  if (tune_faster(c->a_ms, c->a_noise, c->b_ms, c->b_noise, c->b_wins, c->rounds)) m->faster++;
  else if (tune_faster(c->b_ms, c->b_noise, c->a_ms, c->a_noise, c->rounds - c->b_wins, c->rounds)) m->slower++;
  else m->within++;
}

static void ta_summary_print(const tune_against_opts *o, const ta_summary *m) {
  if (o->json) {
    tools_json j;
    fputs("\n],\"summary\":", stdout);
    tools_json_open(&j, stdout);
    tools_json_int(&j, "problems", m->rows);
    tools_json_int(&j, "same", m->same);
    tools_json_int(&j, "b_faster", m->faster);
    tools_json_int(&j, "b_slower", m->slower);
    tools_json_int(&j, "within_noise", m->within);
    tools_json_int(&j, "outputs_differ", m->wrong);
    tools_json_int(&j, "failed", m->failed);
    tools_json_num(&j, "worst_b_over_a", m->worst);
    tools_json_close(&j);
    fputs("}\n", stdout);
  } else if (!o->csv)
    printf("%d problem(s): %d the same configuration, %d faster with B, %d slower with B, %d within the noise, "
           "%d with different outputs, %d failed; worst B/A time %.3f\n",
           m->rows, m->same, m->faster, m->slower, m->within, m->wrong, m->failed, m->worst);
}

static void ta_header(const tune_against_opts *o, flashcl_context *ctx, int nshapes) {
  if (o->json) {
    tools_json j;
    tools_json_open(&j, stdout);
    tools_json_str(&j, "tool", "flashcl-tune --against");
    tools_json_device(&j, "device", ctx);
    tools_json_str(&j, "file", o->file);
    fputs(",\"problems\":[", stdout);
  } else if (o->csv)
    printf("device,problem,kernel_a,origin_a,set_a,kernel_b,origin_b,set_b,same,outputs_differ,rel_l2,a_ms,b_ms,"
           "b_over_a,a_noise,b_noise,b_faster_rounds,rounds\n");
  else
    printf("flashcl-tune --against %s on %s: %d problems; A: the library's sources, B: the file first\n", o->file,
           o->devdesc, nshapes);
  fflush(stdout);
}

int tune_against_run(flashcl_context *ctx, const flashcl_context_options *options, const tune_shape *shapes,
                     int nshapes, const tune_against_opts *o) {
  flashcl_context *cb = NULL;
  ta_summary m;
  memset(&m, 0, sizeof m);
  if (ta_open(ctx, options, o->file, &cb)) return 2;
  ta_header(o, ctx, nshapes);
  for (int i = 0; i < nshapes; ++i) {
    ta_row row;
    const int st = ta_problem(ctx, cb, &shapes[i], o, &row);
    if (st == 1) continue;
    if (st) {
      char what[300];
      snprintf(what, sizeof what, "[%d/%d] %s", i + 1, nshapes, row.problem);
      tools_print_error(stderr, ctx, what, st);
      m.failed++;
      if (!tools_is_validation_error(st)) break; /* the shared queue may be unusable */
      continue;
    }
    if (o->json) ta_print_json(o, &row, m.rows == 0);
    else ta_print(o, &row, i + 1, nshapes);
    fflush(stdout);
    ta_count(&m, &row);
  }
  ta_summary_print(o, &m);
  flashcl_context_destroy(cb);
  return m.failed || m.wrong ? 1 : 0;
}
