/*
 * Helpers shared by flashcl-info, flashcl-bench and flashcl-tune.
 * Only the public flashcl API and plain OpenCL calls are used here.
 */
#ifndef FLASHCL_TOOLS_COMMON_H
#define FLASHCL_TOOLS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "flashcl.h"

#define TOOLS_MAX_LIST 64

typedef struct tools_list {
  int count;
  long v[TOOLS_MAX_LIST];
} tools_list;

/* ---- command line values (the option walk itself is in args.h) ---- */

/* "128,256,1k,16K" -> list (k/K multiplies by 1024). 0 on success. */
int tools_parse_int_list(const char *s, tools_list *out);
int tools_parse_long(const char *s, long *out);
/* "f32,f16,bf16" (also float/half/fp32/fp16) -> list of flashcl_dtype. */
int tools_parse_dtype_list(const char *s, tools_list *out);
/* "0", "1", "both", "0,1" -> list of 0/1. */
int tools_parse_causal_list(const char *s, tools_list *out);
/* "flash,naive" (also "both", "all") -> list of flashcl_algo. */
int tools_parse_algo_list(const char *s, tools_list *out);
/* "auto", "portable" or "nvidia_mma" */
int tools_parse_kernel(const char *s, flashcl_kernel_family *out);
/* "bnhd" or "bhnd" -> 0 / 1 */
int tools_parse_layout(const char *s, int *bhnd);
const char *tools_algo_name(int algo);

/* ---- numbers ---- */

uint16_t tools_f32_to_f16(float f);
float tools_f16_to_f32(uint16_t h);
uint16_t tools_f32_to_bf16(float f);
float tools_bf16_to_f32(uint16_t h);

/* count values uniform in [-1, 1) in dtype's storage format. */
void tools_fill_random(void *dst, flashcl_dtype dtype, size_t count, uint64_t seed);
void tools_to_float(const void *src, flashcl_dtype dtype, size_t count, float *dst);

double tools_median(double *values, int n); /* sorts values */
double tools_min(const double *values, int n);
/* ||a - b|| / ||b|| in double precision; NaN if either contains NaN/Inf. */
double tools_rel_l2(const float *a, const float *b, size_t n);

double tools_now_ms(void);

/* ---- OpenCL helpers ---- */

const char *tools_device_type_string(cl_device_type type);
/* Returns a created buffer of `bytes` filled with random values of dtype, or
 * NULL with *err set. host_scratch must hold bytes. */
cl_mem tools_random_buffer(cl_context context, cl_command_queue queue, flashcl_dtype dtype, size_t count,
                           uint64_t seed, void *host_scratch, cl_int *err);
/* Reads count elements of dtype from buffer into dst as floats. raw_scratch
 * must hold count * dtype_size bytes. */
cl_int tools_read_as_float(cl_command_queue queue, cl_mem buffer, flashcl_dtype dtype, size_t count,
                           void *raw_scratch, float *dst);

/* A status that means "out of memory" (flashcl's own or OpenCL's). */
int tools_is_oom(int status);
/* A flashcl argument-validation status: the call was rejected up front and the
 * context is intact. Other failures (OpenCL runtime errors such as NVIDIA's
 * -9999 after an illegal memory access) can leave the context unusable. */
int tools_is_validation_error(int status);

/* Arguments of one attention call; lse may be NULL for the forward pass. */
typedef struct tools_attention_args {
  const flashcl_attention_desc *desc;
  const flashcl_tensor *q, *k, *v, *o, *lse;
  const flashcl_tensor *d_o, *dq, *dk, *dv; /* backward only */
} tools_attention_args;

/* Runs one forward or backward call bracketed by two markers on the context's
 * queue and waits for it. *ms is END(marker after) - END(marker before) from
 * OpenCL profiling when the queue has it, else host wall-clock time. Returns
 * the flashcl/OpenCL status. */
int tools_timed_call(flashcl_context *ctx, flashcl_pass pass, const tools_attention_args *a, double *ms,
                     int *used_host_timer);
int tools_timed_forward(flashcl_context *ctx, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                        const flashcl_tensor *k, const flashcl_tensor *v, const flashcl_tensor *o, double *ms,
                        int *used_host_timer);

/* Runs `calls` decode calls back-to-back between two markers and waits; *ms is
 * the time per call (OpenCL profiling when the queue has it, else host time,
 * and then *used_host_timer = 1), *host_us the host time of one call. With
 * calls = 1 the host's enqueue time lies inside the span. */
int tools_timed_decode(flashcl_context *ctx, const flashcl_decode_desc *desc, const flashcl_tensor *q,
                       const flashcl_tensor *kc, const flashcl_tensor *vc, cl_mem lens, const flashcl_tensor *out,
                       const flashcl_tensor *lse, long calls, double *ms, double *host_us, int *used_host_timer);

/* Creates a context with profiling on the device spec (NULL: the default
 * device) and reads its info; `options` is filled for later re-creation. On
 * failure prints "<tool>: ..." to stderr and returns 2 (the tools' exit status
 * for "no device"), else 0. */
int tools_open_context(const char *tool, const char *device, int verbose, flashcl_context_options *options,
                       flashcl_context **ctx, flashcl_device_info *info);

/* Prints "<status text> (<code>): <last error>" to f. */
void tools_print_error(FILE *f, flashcl_context *ctx, const char *what, int status);

/* Device of a context, described for headers: "Name (Platform), GPU, 80 CUs". */
void tools_describe_device(flashcl_context *ctx, char *buf, size_t size);

#endif
