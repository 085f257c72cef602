/* flashcl-bench's progress lines, counts, summary and JSON frame (see bench_report.h). */
#include "bench_report.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

bench_report g_report;

void report_init(int csv, int json, int quiet) {
  memset(&g_report, 0, sizeof g_report);
  g_report.csv = csv;
  g_report.json = json;
  g_report.quiet = quiet;
  g_report.tty = !quiet && isatty(2);
  g_report.t0 = tools_now_ms();
  g_report.best_speedup = NAN;
}

int report_text(void) { return !g_report.csv && !g_report.json; }

void report_row_start(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_report.label, sizeof g_report.label, fmt, ap);
  va_end(ap);
  g_report.row_index++;
  g_report.row_t0 = tools_now_ms();
  g_report.last_shown = 0.0;
}

void report_rep(const char *phase, long i, long n) {
  const double now = tools_now_ms(), elapsed = (now - g_report.row_t0) / 1e3;
  if (!g_report.tty || elapsed < 1.0) return;
  if (i < n && g_report.shown && now - g_report.last_shown < 250.0) return; /* at most 4 lines a second */
  fprintf(stderr, "\r\033[Krow %d/%d: %s: %s %ld/%ld, %.1f s elapsed", g_report.row_index, g_report.rows_total,
          g_report.label, phase, i, n, elapsed);
  fflush(stderr);
  g_report.shown = 1;
  g_report.last_shown = now;
}

void report_clear(void) {
  if (!g_report.shown) return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
  g_report.shown = 0;
}

void report_skip(int k) { g_report.row_index += k; }

void report_count(int ran, int oom) {
  if (ran) g_report.ok++;
  else if (oom) g_report.oom++;
  else g_report.failed++;
}

void report_speedup(double speedup, const char *label) {
  if (isnan(speedup) || (!isnan(g_report.best_speedup) && speedup <= g_report.best_speedup)) return;
  g_report.best_speedup = speedup;
  snprintf(g_report.best_label, sizeof g_report.best_label, "%s", label);
}

void report_estimate(double est_s) {
  if (!g_report.tty || !(est_s > 60.0)) return;
  report_clear();
  fprintf(stderr, "flashcl-bench: row %d/%d (%s) may take about %.0f min (estimated from the earlier rows)\n",
          g_report.row_index, g_report.rows_total, g_report.label, est_s / 60.0);
  fflush(stderr);
}

void report_json_begin(const char *mode, flashcl_context *ctx) {
  tools_json j;
  tools_json_open(&j, stdout);
  tools_json_str(&j, "tool", "flashcl-bench");
  tools_json_str(&j, "mode", mode);
  tools_json_device(&j, "device", ctx);
  fputs(",\"rows\":[", stdout);
  fflush(stdout);
}

void report_json_row(tools_json *j) {
  fputs(g_report.json_rows++ ? ",\n" : "\n", stdout);
  tools_json_open(j, stdout);
}

void report_json_end(int exit_status) {
  tools_json j;
  fputs("\n],\"summary\":", stdout);
  tools_json_open(&j, stdout);
  tools_json_int(&j, "rows", g_report.ok + g_report.failed + g_report.oom);
  tools_json_int(&j, "ok", g_report.ok);
  tools_json_int(&j, "failed", g_report.failed);
  tools_json_int(&j, "oom", g_report.oom);
  tools_json_num(&j, "total_s", (tools_now_ms() - g_report.t0) / 1e3);
  tools_json_num(&j, "best_speedup", g_report.best_speedup);
  tools_json_str(&j, "best_speedup_row", isnan(g_report.best_speedup) ? NULL : g_report.best_label);
  tools_json_bool(&j, "host_timer", g_report.host_timer);
  tools_json_int(&j, "exit_status", exit_status);
  tools_json_close(&j);
  fputs("}\n", stdout);
  fflush(stdout);
}

void report_summary_text(void) {
  const double total = (tools_now_ms() - g_report.t0) / 1e3;
  printf("\nsummary: %d row(s): %d ok, %d failed, %d OOM; %.1f s in all", g_report.ok + g_report.failed + g_report.oom,
         g_report.ok, g_report.failed, g_report.oom, total);
  if (!isnan(g_report.best_speedup))
    printf("; best flash/naive speedup %.2fx (%s)", g_report.best_speedup, g_report.best_label);
  printf("\n");
  fflush(stdout);
}
