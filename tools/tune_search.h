/*
 * flashcl-tune's search of one problem: coordinate descent over the declared
 * candidates of the family the call runs, starting from the configuration the
 * context's sources give it (the built-in database, else the default rules).
 */
#ifndef FLASHCL_TUNE_SEARCH_H
#define FLASHCL_TUNE_SEARCH_H

#include "tune_problem.h"

typedef struct tune_search_opts {
  int reps;           /* paired rounds per comparison (each side timed once a round) */
  int warmup;         /* untimed runs of each side before a comparison */
  int passes;         /* coordinate-descent passes at most */
  double deadline_ms; /* tools_now_ms() after which no new candidate starts; 0: none */
  const char *params; /* comma-separated parameter names to search; NULL: every one with candidates */
  FILE *log;          /* a line per candidate (NULL: none) */
  void (*progress)(void *user, int done, int total);
  void *user;
} tune_search_opts;

typedef struct tune_result {
  flashcl_tuning_family family;
  flashcl_tuning base;    /* what the sources set (count 0: the default rules) */
  char base_origin[256];
  flashcl_tuning best;    /* the configuration chosen: base unless a candidate was faster */
  char best_kernel[64];
  double base_ms, best_ms;       /* medians of the final comparison, interleaved */
  double base_noise, best_noise; /* their interquartile range over the median */
  int best_wins, rounds;         /* rounds of the final comparison the chosen one was faster in */
  int tried, infeasible, wrong, duplicate, improved;
  double max_rel;                /* largest rel-L2 to the base among correct candidates */
  int timed_out;                 /* the deadline cut the search short */
  int changed;                   /* best differs from base */
} tune_result;

/* A paired comparison's medians (ms), their noise (interquartile range over
 * the median), and the rounds in which side b was faster. */
typedef struct tune_comparison {
  double a_ms, b_ms, a_noise, b_noise;
  int b_wins, rounds;
} tune_comparison;

/* Times p with (ca, ta) and (cb, tb) alternately, `rounds` rounds after
 * o->warmup untimed runs of each (a NULL tuning: that context's sources). */
int tune_compare(flashcl_context *ca, const flashcl_tuning *ta, flashcl_context *cb, const flashcl_tuning *tb,
                 tune_problem *p, const tune_search_opts *o, int rounds, tune_comparison *out);

/* Two configurations the library runs identically (kernel, every parameter, tiles). */
int tune_same_config(const flashcl_config *x, const flashcl_config *y);

/* rel-L2 a candidate may differ from the base by, per output dtype. */
double tune_tolerance(flashcl_dtype dtype);

/* Searches p's family; the status of the base run (a failed candidate is
 * counted, never fatal, unless it leaves the context unusable). */
int tune_search(flashcl_context *ctx, tune_problem *p, const tune_search_opts *o, tune_result *r);

#endif
