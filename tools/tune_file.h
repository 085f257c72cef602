/*
 * flashcl-tune's output: the tuning file the library loads (README "Tuning"),
 * and the journal that lets an interrupted run resume where it stopped.
 */
#ifndef FLASHCL_TUNE_FILE_H
#define FLASHCL_TUNE_FILE_H

#include "tune_search.h"

#define TUNE_LINE_CAP 1024

/* One finished problem: its name (tune_shape_name), the entry line it gives
 * the tuning file, and a comment line with its measurements. */
typedef struct tune_done {
  char problem[256];
  char entry[TUNE_LINE_CAP];
  char comment[TUNE_LINE_CAP];
} tune_done;

/* The entry line for a result: "<family> d=.. dtype=.. [causal=..] [atomic=..]
 * [nmax=..] : name=value ...". nmax 0 leaves the shape bucket open. */
int tune_entry_line(const tune_shape *s, const tune_result *r, long nmax, char *buf, size_t cap);

/* Reads the journal at path if its header equals `header`: the finished
 * problems, appended to *done (realloc'ed). Returns how many were read, 0 for
 * a missing journal, -1 (with *why) for one of another device or run. */
int tune_journal_load(const char *path, const char *header, tune_done **done, int *ndone, const char **why);
/* Starts a journal with header (truncating), or appends one finished problem. */
int tune_journal_start(const char *path, const char *header);
int tune_journal_append(const char *path, const tune_done *d);

/* Writes the tuning file atomically (a temporary file renamed over path):
 * header, the preamble (comment lines), then each problem's comment and entry.
 * Creates missing parent directories. 0 on success, else errno-like, with a
 * message in why. */
int tune_file_write(const char *path, const char *header, const char *preamble, const tune_done *done, int ndone,
                    char *why, size_t why_cap);

#endif
