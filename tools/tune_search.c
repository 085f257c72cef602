/*
 * Coordinate descent over a family's declared candidates. Each candidate is
 * the incumbent with one parameter changed; it must pass the library's own
 * check (flashcl_attention_config refuses values that cannot run as given),
 * produce the base configuration's output within rounding (outputs poisoned
 * first), and then beat the incumbent in a paired comparison: both are timed
 * alternately (ABBA order), so clock and thermal drift land on both sides.
 * A configuration the library would run identically to one already timed is
 * not timed again. Switches are visited before tiles (ts_order). Where a
 * pass changes nothing and budget is left, pairs of switches change together
 * (ts_pair_pass): two switches can each lose alone and win together (the
 * backward's warp-tiled mapping and its unrolled loops, say), a local optimum
 * that single changes never leave.
 */
#include "tune_search.h"
#include "tune_rule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TS_MAX_SEEN 512
#define TS_MAX_ROUNDS 64

double tune_tolerance(flashcl_dtype dtype) {
  return dtype == FLASHCL_F32 ? 5e-5 : dtype == FLASHCL_F16 ? 4e-3 : 2e-2;
}

typedef struct ts_side {
  double t[TS_MAX_ROUNDS];
  int n;
  double median, noise;
} ts_side;

static void ts_summarise(ts_side *s) {
  double v[TS_MAX_ROUNDS];
  memcpy(v, s->t, sizeof(double) * (size_t)s->n);
  s->median = tools_median(v, s->n); /* sorts v */
  const double q1 = v[s->n / 4], q3 = v[(3 * s->n) / 4 < s->n ? (3 * s->n) / 4 : s->n - 1];
  s->noise = s->median > 0 ? (q3 - q1) / s->median : 0.0;
}

/* Times side a (context ca, tuning a) and side b alternately for `rounds`
 * rounds after o->warmup untimed runs of each; *b_wins counts the rounds in
 * which b was faster. The sides may be two contexts on one queue, so that
 * each runs with its own tuning sources. */
static int ts_compare2(flashcl_context *ca, const flashcl_tuning *a, flashcl_context *cb, const flashcl_tuning *b,
                       tune_problem *p, const tune_search_opts *o, int rounds, ts_side *sa, ts_side *sb,
                       int *b_wins) {
  double ms = 0.0;
  int st = 0;
  if (rounds > TS_MAX_ROUNDS) rounds = TS_MAX_ROUNDS;
  for (int i = 0; i < o->warmup && !st; ++i) {
    st = tune_problem_time(ca, p, a, &ms);
    if (!st) st = tune_problem_time(cb, p, b, &ms);
  }
  sa->n = sb->n = 0;
  *b_wins = 0;
  for (int r = 0; r < rounds && !st; ++r) {
    /* ABBA: odd rounds run b first, so drift lands on both sides. */
    ts_side *f = r % 2 ? sb : sa, *s = r % 2 ? sa : sb;
    st = r % 2 ? tune_problem_time(cb, p, b, &f->t[f->n]) : tune_problem_time(ca, p, a, &f->t[f->n]);
    if (!st) st = r % 2 ? tune_problem_time(ca, p, a, &s->t[s->n]) : tune_problem_time(cb, p, b, &s->t[s->n]);
    if (st) break;
    f->n++, s->n++;
    *b_wins += sb->t[r] < sa->t[r];
  }
  if (st) return st;
  ts_summarise(sa);
  ts_summarise(sb);
  return 0;
}

static int ts_compare(flashcl_context *ctx, tune_problem *p, const flashcl_tuning *a, const flashcl_tuning *b,
                      const tune_search_opts *o, int rounds, ts_side *sa, ts_side *sb, int *b_wins) {
  return ts_compare2(ctx, a, ctx, b, p, o, rounds, sa, sb, b_wins);
}

int tune_compare(flashcl_context *ca, const flashcl_tuning *ta, flashcl_context *cb, const flashcl_tuning *tb,
                 tune_problem *p, const tune_search_opts *o, int rounds, tune_comparison *out) {
  ts_side *sides = (ts_side *)calloc(2, sizeof *sides);
  if (!sides) return FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
  memset(out, 0, sizeof *out);
  const int st = ts_compare2(ca, ta, cb, tb, p, o, rounds, &sides[0], &sides[1], &out->b_wins);
  if (!st) {
    out->a_ms = sides[0].median, out->a_noise = sides[0].noise;
    out->b_ms = sides[1].median, out->b_noise = sides[1].noise;
    out->rounds = sides[0].n;
  }
  free(sides);
  return st;
}

/* Two configurations the library runs identically. */
int tune_same_config(const flashcl_config *x, const flashcl_config *y) {
  if (strcmp(x->kernel, y->kernel) || x->tuning.count != y->tuning.count) return 0;
  for (int i = 0; i < x->tuning.count; ++i)
    if (x->tuning.params[i].value != y->tuning.params[i].value) return 0;
  return x->block_r == y->block_r && x->block_c == y->block_c && x->threads == y->threads;
}

static int ts_selected(const char *list, const char *name) {
  if (!list) return 1;
  const size_t n = strlen(name);
  for (const char *s = list; *s;) {
    const size_t len = strcspn(s, ",");
    if (len == n && !strncmp(s, name, n)) return 1;
    s += len + (s[len] == ',');
  }
  return 0;
}

/* The values a candidate pass tries: the declared candidates of every
 * selected parameter. */
static int ts_pass_size(flashcl_tuning_family f, const char *params) {
  flashcl_tuning_param_info info;
  int total = 0;
  for (int i = 0; flashcl_tuning_space(f, i, &info) == FLASHCL_SUCCESS; ++i)
    if (ts_selected(params, info.name)) total += info.num_candidates;
  return total;
}

typedef struct ts_state {
  flashcl_context *ctx;
  tune_problem *p;
  const tune_search_opts *o;
  tune_result *r;
  float *ref, *got;
  flashcl_config seen[TS_MAX_SEEN];
  int nseen, done, total;
} ts_state;

static void ts_log(const ts_state *s, const flashcl_tuning *t, const char *what) {
  char buf[512];
  if (!s->o->log) return;
  if (flashcl_tuning_format(t, buf, sizeof buf)) snprintf(buf, sizeof buf, "(too long to show)");
  fprintf(s->o->log, "  %-60s %s\n", buf, what);
  fflush(s->o->log);
}

/* Tries one candidate against the incumbent; 1 when it replaced it, 0 when
 * not, a negative status when the context is no longer usable. */
static int ts_try(ts_state *s, flashcl_tuning *inc, const flashcl_tuning *cand) {
  flashcl_config cfg;
  char what[256];
  tune_result *r = s->r;
  int st = tune_problem_config(s->ctx, s->p, cand, &cfg);
  if (st) {
    r->infeasible++;
    ts_log(s, cand, "cannot run here");
    return 0;
  }
  for (int i = 0; i < s->nseen; ++i)
    if (tune_same_config(&cfg, &s->seen[i])) {
      r->duplicate++;
      return 0;
    }
  if (s->nseen < TS_MAX_SEEN) s->seen[s->nseen++] = cfg;
  r->tried++;
  st = tune_problem_check_run(s->ctx, s->p, cand, s->got);
  if (st == FLASHCL_ERROR_BUILD_FAILED || st == FLASHCL_ERROR_UNSUPPORTED) {
    r->tried--, r->infeasible++;
    ts_log(s, cand, st == FLASHCL_ERROR_BUILD_FAILED ? "does not build" : "cannot run here");
    return 0;
  }
  if (st) {
    r->wrong++;
    snprintf(what, sizeof what, "failed: %s (%d)", flashcl_status_string(st), st);
    ts_log(s, cand, what);
    return tools_is_validation_error(st) ? 0 : -1;
  }
  const double rel = tools_rel_l2(s->got, s->ref, s->p->out_count);
  if (!(rel <= tune_tolerance(s->p->s.dtype))) {
    r->wrong++;
    snprintf(what, sizeof what, "WRONG: rel-L2 %.2e to the base's output; never chosen", rel);
    ts_log(s, cand, what);
    return 0;
  }
  if (rel > r->max_rel) r->max_rel = rel;
  ts_side a, b;
  int wins = 0;
  st = ts_compare(s->ctx, s->p, inc, cand, s->o, s->o->reps, &a, &b, &wins);
  if (st) return tools_is_validation_error(st) ? 0 : -1;
  /* Faster beyond the noise and in most rounds: one lucky round is not enough. */
  const int better = tune_faster(a.median, a.noise, b.median, b.noise, wins, a.n);
  snprintf(what, sizeof what, "%.4f ms against %.4f (%d/%d rounds faster)%s", b.median, a.median, wins, a.n,
           better ? "  <- kept" : "");
  ts_log(s, cand, what);
  if (better) *inc = *cand, r->improved++;
  return better;
}

/* The order a pass visits the family's parameters in: switches (two or three
 * candidates: a kernel variant, a code path) before tiles and work-item
 * counts, in declaration order within each group. The best tile depends on
 * the variant (a warp-tiled mapping moves it), and a budget cut should fall
 * on the long tile lists, not on the few switches that change the most. */
static int ts_order(flashcl_tuning_family f, int *order, int cap) {
  flashcl_tuning_param_info info;
  int n = 0;
  for (int group = 0; group < 2; ++group)
    for (int i = 0; flashcl_tuning_space(f, i, &info) == FLASHCL_SUCCESS && n < cap; ++i)
      if ((info.num_candidates <= 3) == (group == 0)) order[n++] = i;
  return n;
}

/* One pass over the selected parameters; the number of changes kept. */
static int ts_pass(ts_state *s, flashcl_tuning *inc) {
  flashcl_tuning_param_info info;
  int order[64], kept = 0;
  const int n = ts_order(s->r->family, order, 64);
  for (int k = 0; k < n; ++k) {
    if (flashcl_tuning_space(s->r->family, order[k], &info) != FLASHCL_SUCCESS) continue;
    if (!ts_selected(s->o->params, info.name)) continue;
    for (int c = 0; c < info.num_candidates; ++c, ++s->done) {
      if (s->o->progress) s->o->progress(s->o->user, s->done, s->total);
      if (s->o->deadline_ms > 0 && tools_now_ms() > s->o->deadline_ms) {
        s->r->timed_out = 1;
        return kept;
      }
      int cur = 0;
      flashcl_tuning cand = *inc;
      if (flashcl_tuning_get(inc, info.name, &cur) == FLASHCL_SUCCESS && cur == info.candidates[c]) continue;
      if (flashcl_tuning_set(NULL, &cand, info.name, info.candidates[c])) continue;
      const int t = ts_try(s, inc, &cand);
      if (t < 0) return -1;
      kept += t;
    }
  }
  return kept;
}

/* The switches of the selected parameters (two or three candidates), in
 * declaration order; their count. */
static int ts_switches(const ts_state *s, int *out, int cap) {
  flashcl_tuning_param_info info;
  int n = 0;
  for (int i = 0; flashcl_tuning_space(s->r->family, i, &info) == FLASHCL_SUCCESS && n < cap; ++i)
    if (info.num_candidates <= 3 && ts_selected(s->o->params, info.name)) out[n++] = i;
  return n;
}

/* The candidates of one pair pass at most: every value of switch a with every
 * value of switch b (the pass skips those that keep either switch's value). */
static int ts_pair_count(const ts_state *s) {
  flashcl_tuning_param_info ia, ib;
  int sw[64], total = 0;
  const int n = ts_switches(s, sw, 64);
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      if (flashcl_tuning_space(s->r->family, sw[a], &ia) == FLASHCL_SUCCESS &&
          flashcl_tuning_space(s->r->family, sw[b], &ib) == FLASHCL_SUCCESS)
        total += ia.num_candidates * ib.num_candidates;
  return total;
}

/* One pass over pairs of switches, each value of one with each value of the
 * other, the incumbent's values excepted; 1 when a pair was kept (the search
 * then runs single changes again), 0 when none, -1 on a dead context. */
static int ts_pair_pass(ts_state *s, flashcl_tuning *inc) {
  flashcl_tuning_param_info ia, ib;
  int sw[64];
  const int n = ts_switches(s, sw, 64);
  s->total += ts_pair_count(s);
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      flashcl_tuning_space(s->r->family, sw[a], &ia);
      flashcl_tuning_space(s->r->family, sw[b], &ib);
      for (int x = 0; x < ia.num_candidates; ++x)
        for (int y = 0; y < ib.num_candidates; ++y, ++s->done) {
          if (s->o->progress) s->o->progress(s->o->user, s->done, s->total);
          if (s->o->deadline_ms > 0 && tools_now_ms() > s->o->deadline_ms) {
            s->r->timed_out = 1;
            return 0;
          }
          int cur = 0;
          if (flashcl_tuning_get(inc, ia.name, &cur) == FLASHCL_SUCCESS && cur == ia.candidates[x]) continue;
          if (flashcl_tuning_get(inc, ib.name, &cur) == FLASHCL_SUCCESS && cur == ib.candidates[y]) continue;
          flashcl_tuning cand = *inc;
          if (flashcl_tuning_set(NULL, &cand, ia.name, ia.candidates[x]) ||
              flashcl_tuning_set(NULL, &cand, ib.name, ib.candidates[y]))
            continue;
          const int t = ts_try(s, inc, &cand);
          if (t) return t < 0 ? -1 : 1;
        }
    }
  return 0;
}

/* The incumbent the search starts from: the sources' values, less those the
 * library dropped for this problem (a file's values are a preference, which
 * the library may drop where they do not fit; a call's must run as given). */
static void ts_start(ts_state *s, const flashcl_config *base, flashcl_tuning *start) {
  flashcl_config check;
  flashcl_tuning_init(start, base->family);
  for (int i = 0; i < base->set.count; ++i) {
    int ran = 0;
    const flashcl_tuning_param *sp = &base->set.params[i];
    if (flashcl_tuning_get(&base->tuning, sp->name, &ran) == FLASHCL_SUCCESS && ran == sp->value)
      flashcl_tuning_set(NULL, start, sp->name, sp->value);
  }
  if (tune_problem_config(s->ctx, s->p, start, &check)) start->count = 0;
}

/* The final, longer comparison of the chosen configuration with the base;
 * the base stays unless the choice is faster. */
static int ts_final(ts_state *s, flashcl_tuning *inc) {
  tune_result *r = s->r;
  ts_side a, b;
  int wins = 0;
  int st = ts_compare(s->ctx, s->p, NULL, inc, s->o, 2 * s->o->reps + 1, &a, &b, &wins);
  if (st) return st;
  r->base_ms = a.median, r->base_noise = a.noise;
  r->best_ms = b.median, r->best_noise = b.noise;
  r->best_wins = wins, r->rounds = a.n;
  /* The rule every step passed, again over the longer comparison. */
  r->changed = r->improved > 0 && tune_faster(a.median, a.noise, b.median, b.noise, wins, a.n);
  if (!r->changed) {
    *inc = r->base;
    r->best_ms = a.median, r->best_noise = a.noise, r->best_wins = a.n - wins;
  }
  r->best = *inc;
  flashcl_config cfg;
  if (!tune_problem_config(s->ctx, s->p, inc, &cfg)) snprintf(r->best_kernel, sizeof r->best_kernel, "%s", cfg.kernel);
  return 0;
}

int tune_search(flashcl_context *ctx, tune_problem *p, const tune_search_opts *o, tune_result *r) {
  ts_state *s = (ts_state *)calloc(1, sizeof *s);
  flashcl_config base;
  memset(r, 0, sizeof *r);
  if (!s) return FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
  s->ctx = ctx, s->p = p, s->o = o, s->r = r;
  s->ref = (float *)malloc(p->out_count * sizeof(float));
  s->got = (float *)malloc(p->out_count * sizeof(float));
  int st = s->ref && s->got ? tune_problem_config(ctx, p, NULL, &base) : FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
  if (!st) st = tune_problem_check_run(ctx, p, NULL, s->ref);
  if (!st && !(tools_rel_l2(s->ref, s->ref, p->out_count) == 0.0)) st = FLASHCL_ERROR_INTERNAL; /* NaN in the base */
  if (!st) {
    r->family = base.family;
    r->base = base.set;
    r->base.family = base.family;
    snprintf(r->best_kernel, sizeof r->best_kernel, "%s", base.kernel);
    snprintf(r->base_origin, sizeof r->base_origin, "%s", base.origin);
    s->seen[s->nseen++] = base;
    flashcl_tuning inc;
    ts_start(s, &base, &inc);
    s->total = ts_pass_size(r->family, o->params) * (o->passes > 0 ? o->passes : 1);
    /* Single changes until a pass keeps none (or --passes run out); then,
     * with budget left, pairs of switches, and single changes again after a
     * kept pair. */
    const int passes = o->passes > 0 ? o->passes : 1;
    for (int pass = 0; pass < passes && !st && !r->timed_out; ++pass) {
      int kept = ts_pass(s, &inc);
      if (kept == 0 && !r->timed_out) kept = ts_pair_pass(s, &inc);
      if (kept < 0) st = FLASHCL_ERROR_INTERNAL;
      if (kept <= 0) break;
    }
    if (!st) st = ts_final(s, &inc);
  }
  free(s->ref);
  free(s->got);
  free(s);
  return st;
}
