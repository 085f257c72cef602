/*
 * A small JSON writer for the tools' --json output: one object or array at a
 * time, with the commas between members kept by a counter. Strings are
 * escaped (quotes, backslashes, control characters); numbers that are not
 * finite, and NULL strings, are written as null.
 */
#ifndef FLASHCL_TOOLS_JSON_H
#define FLASHCL_TOOLS_JSON_H

#include <stdio.h>

#include "flashcl.h"

typedef struct tools_json {
  FILE *f;
  int members; /* written so far in the innermost open object or array */
} tools_json;

/* A quoted, escaped JSON string; NULL writes null. */
void tools_json_string(FILE *f, const char *s);
/* A number (%.9g); NaN and infinities write null. */
void tools_json_number(FILE *f, double v);

/* "{" and "}" around the members that follow. */
void tools_json_open(tools_json *j, FILE *f);
void tools_json_close(tools_json *j);
/* ,"key": before a member's value (the comma unless it is the first). */
void tools_json_key(tools_json *j, const char *key);
void tools_json_str(tools_json *j, const char *key, const char *value);
void tools_json_num(tools_json *j, const char *key, double value);
void tools_json_int(tools_json *j, const char *key, long long value);
void tools_json_bool(tools_json *j, const char *key, int value);
void tools_json_null(tools_json *j, const char *key);

/* "key": {"platform", "device", "device_version", "driver", "date" (UTC, ISO
 * 8601), "flashcl_version"} for the context's device. */
void tools_json_device(tools_json *j, const char *key, flashcl_context *ctx);

#endif
