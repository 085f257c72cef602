/* The tools' JSON writer (see json.h). */
#include "json.h"

#include <math.h>
#include <string.h>
#include <time.h>

void tools_json_string(FILE *f, const char *s) {
  if (!s) {
    fputs("null", f);
    return;
  }
  fputc('"', f);
  for (const unsigned char *c = (const unsigned char *)s; *c; ++c) {
    switch (*c) {
      case '"': fputs("\\\"", f); break;
      case '\\': fputs("\\\\", f); break;
      case '\n': fputs("\\n", f); break;
      case '\r': fputs("\\r", f); break;
      case '\t': fputs("\\t", f); break;
      case '\b': fputs("\\b", f); break;
      case '\f': fputs("\\f", f); break;
      default:
        if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
  }
  fputc('"', f);
}

void tools_json_number(FILE *f, double v) {
  if (!isfinite(v)) fputs("null", f);
  else if (v == floor(v) && fabs(v) < 1e15) fprintf(f, "%.0f", v);
  else fprintf(f, "%.9g", v);
}

void tools_json_open(tools_json *j, FILE *f) {
  j->f = f;
  j->members = 0;
  fputc('{', f);
}

void tools_json_close(tools_json *j) { fputc('}', j->f); }

void tools_json_key(tools_json *j, const char *key) {
  if (j->members++) fputc(',', j->f);
  tools_json_string(j->f, key);
  fputc(':', j->f);
}

void tools_json_str(tools_json *j, const char *key, const char *value) {
  tools_json_key(j, key);
  tools_json_string(j->f, value);
}

void tools_json_num(tools_json *j, const char *key, double value) {
  tools_json_key(j, key);
  tools_json_number(j->f, value);
}

void tools_json_int(tools_json *j, const char *key, long long value) {
  tools_json_key(j, key);
  fprintf(j->f, "%lld", value);
}

void tools_json_bool(tools_json *j, const char *key, int value) {
  tools_json_key(j, key);
  fputs(value ? "true" : "false", j->f);
}

void tools_json_null(tools_json *j, const char *key) {
  tools_json_key(j, key);
  fputs("null", j->f);
}

void tools_json_device(tools_json *j, const char *key, flashcl_context *ctx) {
  flashcl_device_info info;
  char driver[256] = "", date[32] = "";
  const int have = ctx && flashcl_context_device_info(ctx, &info) == FLASHCL_SUCCESS;
  const time_t now = time(NULL);
  tools_json dev;
  if (ctx && clGetDeviceInfo(flashcl_context_cl_device(ctx), CL_DRIVER_VERSION, sizeof driver - 1, driver, NULL) !=
                 CL_SUCCESS)
    driver[0] = '\0';
  driver[sizeof driver - 1] = '\0';
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  tools_json_key(j, key);
  tools_json_open(&dev, j->f);
  tools_json_str(&dev, "platform", have ? info.platform_name : NULL);
  tools_json_str(&dev, "device", have ? info.device_name : NULL);
  tools_json_str(&dev, "device_version", have ? info.device_version : NULL);
  tools_json_str(&dev, "driver", driver[0] ? driver : NULL);
  tools_json_bool(&dev, "is_gpu", have && info.is_gpu);
  tools_json_int(&dev, "compute_units", have ? (long long)info.compute_units : 0);
  tools_json_int(&dev, "global_mem_bytes", have ? (long long)info.global_mem_size : 0);
  tools_json_str(&dev, "date", date);
  tools_json_str(&dev, "flashcl_version", flashcl_version_string());
  tools_json_close(&dev);
}
