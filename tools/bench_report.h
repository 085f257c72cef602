/*
 * flashcl-bench's reporting beyond the table rows: the progress line of long
 * rows (stderr, on a terminal only), the estimate printed before a row that
 * looks huge, the run's counts and summary line, and the frame of the --json
 * document ({"tool", "mode", "device", "rows": [...], "summary"}).
 */
#ifndef FLASHCL_TOOLS_BENCH_REPORT_H
#define FLASHCL_TOOLS_BENCH_REPORT_H

#include "json.h"

typedef struct bench_report {
  int csv, json, quiet, tty; /* tty: progress lines on stderr */
  double t0;                 /* tools_now_ms() at the start */
  int row_index, rows_total; /* the row being run, 1-based, of rows_total */
  char label[192];           /* "N=4096 d=64 f16 causal=1 flash fwd" */
  double row_t0, last_shown; /* when the row started, and its last progress line */
  int shown;                 /* a progress line is on the terminal */
  int ok, failed, oom;       /* rows so far */
  double best_speedup;       /* flash/naive, NaN while none */
  char best_label[192];
  int json_rows;             /* rows written to the JSON document */
  int host_timer;            /* some time came from the host clock */
} bench_report;

extern bench_report g_report;

void report_init(int csv, int json, int quiet);
/* Text mode: not --csv, not --json. */
int report_text(void);

/* Starts row g_report.row_index + 1 with a printf-style label. */
void report_row_start(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* After run `i` of `n` of the current row's phase ("warmup", "rep"): a
 * progress line once the row has taken over a second (terminal only). */
void report_rep(const char *phase, long i, long n);
/* Removes the progress line, if one is shown. */
void report_clear(void);
/* Skips k rows of the numbering (configs that were not run). */
void report_skip(int k);
/* Counts a finished row: ran, out of memory, else failed. */
void report_count(int ran, int oom);
/* A flash/naive speedup, kept when it is the best so far. */
void report_speedup(double speedup, const char *label);
/* Before a row estimated to take est_s seconds: one line on stderr when that
 * is over a minute (on a terminal, unless --quiet, as the progress lines). */
void report_estimate(double est_s);

/* --json: the document's start, up to "rows":[ ; the separator and the start
 * of the next row's object; and the summary and closing brace. */
void report_json_begin(const char *mode, flashcl_context *ctx);
void report_json_row(tools_json *j);
void report_json_end(int exit_status);
/* Text mode: the summary line at the end of the table. */
void report_summary_text(void);

#endif
