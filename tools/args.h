/*
 * The tools' command-line parser: each tool declares its options in a table
 * and args_parse walks argv against it. Options take their value as the next
 * argument ("--n 128") or after '=' ("--n=128"); flags take none.
 */
#ifndef FLASHCL_TOOLS_ARGS_H
#define FLASHCL_TOOLS_ARGS_H

#include <limits.h>
#include <stdio.h>

#include "common.h"

typedef enum args_kind {
  ARG_FLAG,        /* int *dest = 1; dest may be NULL: accepted and ignored */
  ARG_CLEAR,       /* int *dest = 0 */
  ARG_HELP,        /* stops the walk: args_parse returns ARGS_HELP */
  ARG_STRING,      /* const char **dest = the value */
  ARG_LONG,        /* long *dest, tools_parse_long (k/M suffixes), in [lo, hi] */
  ARG_INT_LIST,    /* tools_list *dest, tools_parse_int_list; at most hi items when hi > 0 */
  ARG_DTYPE_LIST,  /* tools_list *dest, tools_parse_dtype_list; hi as above */
  ARG_CAUSAL_LIST, /* tools_list *dest, tools_parse_causal_list; hi as above */
  ARG_ALGO_LIST,   /* tools_list *dest, tools_parse_algo_list; hi as above */
  ARG_DTYPE,       /* flashcl_dtype *dest: a dtype list of exactly one */
  ARG_CAUSAL,      /* int *dest: a causal list of exactly one (0 or 1) */
  ARG_ALGO,        /* flashcl_algo *dest: an algo list of exactly one */
  ARG_KERNEL,      /* flashcl_kernel_family *dest, tools_parse_kernel */
  ARG_CUSTOM       /* parse(value, dest) returns 0 when the value is good */
} args_kind;

typedef struct args_opt {
  const char *name;  /* "--n" */
  const char *alias; /* another spelling that must match exactly ("-v"), or NULL */
  args_kind kind;
  void *dest;
  int *seen; /* optional: set to 1 once the option was given with a good value */
  long lo, hi;
  int (*parse)(const char *value, void *dest);
} args_opt;

/* What args_parse found. Each problem was reported on stderr as one line
 * "<prog>: ..." naming the argument, before returning. */
typedef enum args_status {
  ARGS_OK = 0,
  ARGS_HELP = 1,      /* --help (or its alias): the tool prints its usage */
  ARGS_UNKNOWN = -1,  /* an argument no entry matches */
  ARGS_NO_VALUE = -2, /* an option that takes a value came last */
  ARGS_BAD_VALUE = -3 /* a value its kind (or range) refuses */
} args_status;

#define ARGS_COUNT(table) ((int)(sizeof(table) / sizeof((table)[0])))

/* Walks argv[1..argc-1] in order against table[0..count-1] and stops at the
 * first problem or at a help entry; a later option overrides an earlier one. */
args_status args_parse(int argc, char **argv, const char *prog, const args_opt *table, int count);

#endif
