/* The tools' table-driven command-line parser (see args.h). */
#include "args.h"

#include <string.h>

static int takes_value(args_kind kind) { return kind != ARG_FLAG && kind != ARG_CLEAR && kind != ARG_HELP; }

/* The table entry that argument a names, and its value when a is "--name=value". */
static const args_opt *find(const args_opt *table, int count, const char *a, const char **inline_value) {
  *inline_value = NULL;
  for (int k = 0; k < count; ++k) {
    const args_opt *opt = &table[k];
    const size_t len = strlen(opt->name);
    if (!strcmp(a, opt->name) || (opt->alias && !strcmp(a, opt->alias))) return opt;
    /* Flags never take "=value": "--csv=1" is an unknown argument, as it always was. */
    if (takes_value(opt->kind) && !strncmp(a, opt->name, len) && a[len] == '=') {
      *inline_value = a + len + 1;
      return opt;
    }
  }
  return NULL;
}

static int parse_list(args_kind kind, const char *value, tools_list *list) {
  switch (kind) {
    case ARG_INT_LIST: return tools_parse_int_list(value, list);
    case ARG_DTYPE_LIST:
    case ARG_DTYPE: return tools_parse_dtype_list(value, list);
    case ARG_CAUSAL_LIST:
    case ARG_CAUSAL: return tools_parse_causal_list(value, list);
    case ARG_ALGO_LIST:
    case ARG_ALGO: return tools_parse_algo_list(value, list);
    default: return -1;
  }
}

/* The single-value kinds parse a list and take its one item. */
static int store_one(const args_opt *opt, const char *value) {
  tools_list l;
  if (parse_list(opt->kind, value, &l) || l.count != 1) return -1;
  if (opt->kind == ARG_DTYPE) *(flashcl_dtype *)opt->dest = (flashcl_dtype)l.v[0];
  else if (opt->kind == ARG_ALGO) *(flashcl_algo *)opt->dest = (flashcl_algo)l.v[0];
  else *(int *)opt->dest = (int)l.v[0];
  return 0;
}

/* Stores value into opt's destination: 0, or -1 when the value is refused. */
static int store(const args_opt *opt, const char *value) {
  switch (opt->kind) {
    case ARG_STRING: *(const char **)opt->dest = value; return 0;
    case ARG_LONG: {
      long v;
      if (tools_parse_long(value, &v) || v < opt->lo || v > opt->hi) return -1;
      *(long *)opt->dest = v;
      return 0;
    }
    case ARG_KERNEL: return tools_parse_kernel(value, (flashcl_kernel_family *)opt->dest) ? -1 : 0;
    case ARG_CUSTOM: return opt->parse(value, opt->dest) ? -1 : 0;
    case ARG_DTYPE:
    case ARG_CAUSAL:
    case ARG_ALGO: return store_one(opt, value);
    case ARG_INT_LIST:
    case ARG_DTYPE_LIST:
    case ARG_CAUSAL_LIST:
    case ARG_ALGO_LIST: {
      tools_list *list = (tools_list *)opt->dest;
      return parse_list(opt->kind, value, list) || (opt->hi > 0 && list->count > opt->hi) ? -1 : 0;
    }
    default: return -1; /* flags and help take no value */
  }
}

args_status args_parse(int argc, char **argv, const char *prog, const args_opt *table, int count) {
  for (int i = 1; i < argc; ++i) {
    const char *value = NULL;
    const args_opt *opt = find(table, count, argv[i], &value);
    if (!opt) {
      fprintf(stderr, "%s: unknown argument '%s'\n", prog, argv[i]);
      return ARGS_UNKNOWN;
    }
    if (opt->kind == ARG_HELP) return ARGS_HELP;
    if (opt->kind == ARG_FLAG || opt->kind == ARG_CLEAR) {
      if (opt->dest) *(int *)opt->dest = opt->kind == ARG_FLAG;
    } else {
      if (!value && i + 1 >= argc) {
        fprintf(stderr, "%s: option %s needs a value\n", prog, opt->name);
        return ARGS_NO_VALUE;
      }
      if (!value) value = argv[++i];
      if (store(opt, value)) {
        fprintf(stderr, "%s: bad value '%s' for %s\n", prog, value, opt->name);
        return ARGS_BAD_VALUE;
      }
    }
    if (opt->seen) *opt->seen = 1;
  }
  return ARGS_OK;
}
