/*
 * flashcl-tune --against FILE: what a tuning file would change, problem by
 * problem, before it replaces the entries the library uses now. Both sides run
 * in one process on one queue (two flashcl contexts over the same OpenCL
 * objects), timed in alternating rounds, so that a generated file can be
 * compared with hand-written entries without the spread between processes.
 */
#ifndef FLASHCL_TUNE_AGAINST_H
#define FLASHCL_TUNE_AGAINST_H

#include "tune_search.h"

typedef struct tune_against_opts {
  const char *file;    /* side B's tuning file */
  int csv, json, quiet;
  const char *devdesc; /* for the CSV and JSON rows */
  tune_search_opts search; /* reps (the comparison runs 2 reps + 1 rounds), warmup */
  /* Only problems whose side-A family passes (NULL: every one). */
  int (*wanted)(const void *user, flashcl_tuning_family family);
  const void *user;
} tune_against_opts;

/* Opens side B over ctx's OpenCL objects with `options` and o->file first,
 * compares every shape, prints a row per problem and a summary. Returns the
 * process exit status: 0, 1 when a problem failed or B's output differed,
 * 2 when the file does not load. */
int tune_against_run(flashcl_context *ctx, const flashcl_context_options *options, const tune_shape *shapes,
                     int nshapes, const tune_against_opts *o);

#endif
