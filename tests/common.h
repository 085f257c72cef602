/*
 * Shared harness for the flashcl cmocka tests.
 *
 *  - One flashcl_context per test executable (cmocka group setup/teardown).
 *  - Fresh random inputs every run. The seed comes from FLASHCL_TEST_SEED, else from
 *    time and pid, and is printed; every case derives its own stream from the seed
 *    and the case description, so one case reproduces alone:
 *        FLASHCL_TEST_SEED=<seed> FLASHCL_TEST_FILTER=<test name> ./test_forward
 *  - Host-side fp32 <-> fp16 / bf16 conversion (round to nearest even).
 *  - Outputs are filled with NaN bit patterns of their dtype before every run; the
 *    result is compared by relative L2 error against the double reference in
 *    reference.c, fed with the same quantized inputs the device reads.
 */
#ifndef FLASHCL_TESTS_COMMON_H
#define FLASHCL_TESTS_COMMON_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "flashcl.h"
#include "reference.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ misc -- */

/* Fails the current test with a formatted message (cmocka fail_msg with printf
 * checking). */
#define FCT_FAIL(...)                   \
  do {                                  \
    fct_print_error_prefix(__FILE__, __LINE__); \
    print_error(__VA_ARGS__);           \
    print_error("\n");                  \
    fail();                             \
  } while (0)

/* Asserts cond; on failure prints the formatted context and fails. */
#define FCT_CHECK(cond, ...)                                           \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fct_print_error_prefix(__FILE__, __LINE__);                      \
      print_error("check failed: %s\n  ", #cond);                      \
      print_error(__VA_ARGS__);                                        \
      print_error("\n  (seed %llu)\n", (unsigned long long)fct_seed()); \
      fail();                                                          \
    }                                                                  \
  } while (0)

/* Asserts that a flashcl call returned `expected`, printing both codes' names. */
#define FCT_CHECK_STATUS(got, expected, ...)                                                  \
  do {                                                                                        \
    int fct_got_ = (int)(got), fct_exp_ = (int)(expected);                                    \
    if (fct_got_ != fct_exp_) {                                                               \
      fct_print_error_prefix(__FILE__, __LINE__);                                             \
      print_error("status %d (%s), expected %d (%s)\n  ", fct_got_, flashcl_status_string(fct_got_), \
                  fct_exp_, flashcl_status_string(fct_exp_));                                 \
      print_error(__VA_ARGS__);                                                               \
      print_error("\n  last error: %s\n", fct_last_error());                                   \
      fail();                                                                                 \
    }                                                                                         \
  } while (0)

void fct_print_error_prefix(const char *file, int line);

/* The context's last error message, or "(no context)". */
const char *fct_last_error(void);

/* ------------------------------------------------------------ seed / RNG -- */

/* The run's seed (FLASHCL_TEST_SEED, else time ^ pid), fixed on first use. */
uint64_t fct_seed(void);

typedef struct fct_rng {
  uint64_t s;
  int has_spare;
  double spare;
} fct_rng;

/* A stream derived from the run's seed and `tag` (e.g. a case description). */
void fct_rng_init(fct_rng *rng, const char *tag);
uint64_t fct_rng_u64(fct_rng *rng);
double fct_rng_uniform(fct_rng *rng); /* [0, 1) */
double fct_rng_normal(fct_rng *rng);  /* N(0, 1) */

/* ----------------------------------------------------- dtype conversion -- */

uint16_t fct_f32_to_f16(float f);   /* IEEE binary16, round to nearest even */
float fct_f16_to_f32(uint16_t h);
uint16_t fct_f32_to_bf16(float f);  /* bfloat16, round to nearest even */
float fct_bf16_to_f32(uint16_t h);

size_t fct_dtype_size(flashcl_dtype dtype); /* the harness's own table */
const char *fct_dtype_str(flashcl_dtype dtype);
/* Rounds x to the dtype and back (fp32 for FLASHCL_F32). */
float fct_quantize(flashcl_dtype dtype, float x);
/* Stores / loads element `index` of a raw buffer of this dtype. */
void fct_store(flashcl_dtype dtype, void *base, size_t index, float x);
double fct_load(flashcl_dtype dtype, const void *base, size_t index);
double fct_load_f16(const void *base, int64_t index);
double fct_load_bf16(const void *base, int64_t index);
ref_load_fn fct_loader(flashcl_dtype dtype);
/* Writes the dtype's NaN poison bit pattern into element `index`. */
void fct_store_poison(flashcl_dtype dtype, void *base, size_t index);
int fct_is_poison(flashcl_dtype dtype, const void *base, size_t index);

/* Relative-L2 tolerances for O: fp32 1e-5, fp16 2e-3, bf16 1e-2. */
double fct_tolerance(flashcl_dtype dtype);
/* Relative-L2 tolerance for LSE (fp32 math for every dtype): 1e-5, 1e-4 for 16-bit. */
double fct_lse_tolerance(flashcl_dtype dtype);

/* ------------------------------------------------------------ the group -- */

typedef struct fct_env {
  flashcl_context *ctx;
  cl_context cl_ctx;
  cl_device_id device;
  cl_command_queue queue;
  flashcl_device_info info;
} fct_env;

/* The group's environment (valid between group setup and teardown). */
fct_env *fct_env_get(void);
/* A per-call tuning that runs the portable forward's GPU work-item mapping
 * (fwd map=0), so that a CPU-only CI (PoCL) runs that variant too. */
const flashcl_tuning *fct_gpu_map_tuning(void);
int fct_group_setup(void **state);
int fct_group_teardown(void **state);

/* Runs tests as one cmocka group. need_device: create the shared context in group
 * setup. Honors FLASHCL_TEST_FILTER (a cmocka test-name pattern, '*' and '?'). */
int fct_run_group(const char *name, const struct CMUnitTest *tests, size_t count, int need_device);

/* A test that cannot run on this device: counted, so that a program whose
 * every test skipped exits with FCT_SKIP_STATUS, which CTest reports as
 * skipped (SKIP_RETURN_CODE) rather than passed. */
extern int fct_skipped;
#define FCT_SKIP()     \
  do {                 \
    fct_skipped++;     \
    skip();            \
  } while (0)
#define FCT_SKIP_STATUS 77
/* The exit status of a test program that ran `count` tests (filtered by
 * FLASHCL_TEST_FILTER) of which `failed` failed. */
int fct_exit_status(const struct CMUnitTest *tests, size_t count, int failed);

/* 1 when `device` must run flashcl's NVIDIA tensor-core kernels: its platform's
 * name contains "NVIDIA", it has cl_nv_device_attribute_query and its compute
 * capability (CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, 0x4000) is >= 8.0. Fills
 * `what` (may be NULL) with a description of the device ("not NVIDIA", "compute
 * capability 7.5", ...). */
int fct_device_requires_mma(cl_device_id device, char *what, size_t what_cap);
/* For a test that found the tensor-core path unavailable (`reason`: the
 * library's message) on `device`: fails the test on a device that must have it
 * (fct_device_requires_mma), else prints why the case is skipped and returns;
 * the caller then calls skip(). */
void fct_mma_unavailable(cl_device_id device, const char *name, const char *reason);

/* 1 when the test was built with AddressSanitizer (its quarantine keeps freed
 * memory, so resident-memory checks do not apply). */
static inline int fct_address_sanitized(void) {
#if defined(__SANITIZE_ADDRESS__)
  return 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return 1;
#else
  return 0;
#endif
#else
  return 0;
#endif
}

/* For a case run with desc->algorithm.kernel = FLASHCL_KERNEL_NVIDIA_MMA: 0 when the
 * device has no tensor-core path (the caller skips the case with skip(); a
 * message says so; on an NVIDIA device of compute capability >= 8.0 the test
 * fails instead, see fct_mma_unavailable), 1 when it has, after checking that
 * `pass` really runs the tensor-core kernels for these arguments (o taken as
 * q's layout): a silent fallback to the portable kernels fails the test. */
int fct_mma_ready(const char *name, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                  const flashcl_tensor *k, const flashcl_tensor *v, flashcl_pass pass);

/* ------------------------------------------------------- device tensors -- */

typedef enum fct_layout {
  FCT_BNHD = 0,   /* flashcl_tensor_init_bnhd */
  FCT_BHND = 1,   /* flashcl_tensor_init_bhnd */
  FCT_PADDED = 2  /* inside a bigger buffer: non-zero offset, padded strides */
} fct_layout;
const char *fct_layout_str(fct_layout layout);

/* A flashcl_tensor over its own cl_mem plus a host mirror of the whole buffer. */
typedef struct fct_tensor {
  flashcl_tensor t;
  size_t bytes;        /* size of the cl_mem */
  unsigned char *host; /* mirror of the whole cl_mem */
} fct_tensor;

/* (B, N, H, D) q/k/v/o-style tensor of the given layout. `salt` varies the padding
 * of FCT_PADDED so q, k, v and o don't share one geometry. */
void fct_tensor_create(fct_tensor *t, flashcl_dtype dtype, fct_layout layout, int64_t B, int64_t N, int64_t H,
                       int64_t D, int salt);
/* fp32 LSE tensor (B, N, H, 1): flashcl_tensor_init_lse, or padded for FCT_PADDED. */
void fct_tensor_create_lse(fct_tensor *t, fct_layout layout, int64_t B, int64_t N, int64_t H, int salt);
/* The same with `guard` extra poisoned elements after the view (outputs). */
void fct_tensor_create_guarded(fct_tensor *t, flashcl_dtype dtype, fct_layout layout, int64_t B, int64_t N,
                               int64_t H, int64_t D, int salt, size_t guard);
void fct_tensor_create_lse_guarded(fct_tensor *t, fct_layout layout, int64_t B, int64_t N, int64_t H, int salt,
                                   size_t guard);
/* Guard elements after every output view in fct_problem_run. */
#define FCT_OUTPUT_GUARD 16384
/* Any view: buffer of `bytes` bytes. */
void fct_tensor_create_custom(fct_tensor *t, flashcl_dtype dtype, size_t bytes, size_t offset,
                              const int64_t shape[4], const int64_t stride[4]);
void fct_tensor_release(fct_tensor *t);

/* Poisons the whole buffer, then stores N(0,1) values (rounded to the dtype, never
 * zero) at every element of the view, and uploads the buffer. Bytes outside the
 * view stay NaN, so a read outside the view shows up as NaN in the output. */
void fct_tensor_fill_random(fct_tensor *t, fct_rng *rng);
/* Fills the whole buffer with the dtype's NaN pattern and uploads it (blocking). */
void fct_tensor_poison(fct_tensor *t);
/* Blocking read of the whole buffer into host. */
void fct_tensor_download(fct_tensor *t);
/* Number of elements of the whole buffer whose bits differ from the poison. */
size_t fct_tensor_count_unpoisoned(const fct_tensor *t);
/* Downloads each of the n tensors and returns how many of their elements are
 * no longer the poison: 0 when a failed call left every output untouched. */
size_t fct_tensors_written(fct_tensor *const *ts, int n);
/* Element offset (in elements, relative to the buffer start) of (b, n, h, x). */
size_t fct_tensor_index(const fct_tensor *t, int64_t b, int64_t n, int64_t h, int64_t x);
double fct_tensor_get(const fct_tensor *t, int64_t b, int64_t n, int64_t h, int64_t x);
/* A reference view of the host mirror. */
ref_tensor fct_tensor_ref(const fct_tensor *t);

/* The flashcl_kv_append_desc of a decode descriptor's cache: the init's
 * defaults, then the cache. FCT_APPEND_DESC points at a compound literal,
 * valid to the end of the enclosing block. */
static inline flashcl_kv_append_desc fct_append_desc(const flashcl_decode_desc *dd) {
  flashcl_kv_append_desc ad;
  flashcl_kv_append_desc_init(&ad);
  ad.cache = dd->cache;
  return ad;
}
#define FCT_APPEND_DESC(dd) (&(flashcl_kv_append_desc[1]){fct_append_desc(dd)}[0])

/* Wraps clCreateBuffer on the group context, failing the test on error. */
cl_mem fct_create_buffer(size_t bytes, const void *init);
void fct_finish(void);

/* ------------------------------------------------------ attention cases -- */

typedef struct fct_case {
  flashcl_dtype dtype;
  int batch; /* ignored for varlen */
  int seqlen_q, seqlen_k; /* ignored for varlen */
  int heads_q, heads_kv, head_dim;
  int causal;
  float scale; /* 0: default 1/sqrt(d) */
  fct_layout layout;
  int no_lse;  /* 1: pass lse = NULL */
  int kv_batch_stride0; /* k/v broadcast over the batch (batch stride 0) */
  /* varlen when num_seqs > 0: per-sequence lengths */
  int num_seqs;
  const int *seqlens_q;
  const int *seqlens_k;
} fct_case;

/* Inputs on the device plus the reference result for one case. */
typedef struct fct_problem {
  fct_case c;
  char desc[512];
  int64_t B, Nq, Nk; /* tensor batch / seq extents (1, total_q, total_k for varlen) */
  fct_tensor q, k, v;
  cl_mem cu_q, cu_k;
  int32_t *cu_q_host, *cu_k_host;
  int max_q, max_k;
  double *ref_o;   /* (B, Nq, Hq, d) contiguous */
  double *ref_lse; /* (B, Nq, Hq) contiguous */
  double ref_seconds;
} fct_problem;

typedef struct fct_run {
  flashcl_algo algo;
  int block_r, block_c;
  flashcl_kernel_family kernel;
  const flashcl_tuning *tuning; /* desc.algorithm.tuning (NULL: the context's sources) */
} fct_run;

typedef struct fct_result {
  fct_tensor o, lse;
  int has_lse;
  double err_o, err_lse; /* relative L2 against the reference */
  double max_row_err;
  size_t empty_rows;
  double seconds; /* forward call to completion, including any program build */
} fct_result;

/* Builds inputs (fresh random values), uploads them and computes the reference. */
void fct_problem_create(fct_problem *p, const fct_case *c);
void fct_problem_release(fct_problem *p);
/* The descriptor for a problem and run (causal, scale, varlen, algo, blocks). */
void fct_problem_desc(const fct_problem *p, const fct_run *run, flashcl_attention_desc *desc);
/* Poisons fresh o/lse, runs the forward, waits, downloads and checks everything
 * (status, no NaN, no write outside the views, O == 0 / LSE == -inf for rows with
 * no keys, per-row and global relative L2 for O and LSE). Fails the test on error. */
void fct_problem_run(fct_problem *p, const fct_run *run, fct_result *r);
void fct_result_release(fct_result *r);
/* Relative L2 difference of two results' O (and LSE when both have it). */
double fct_result_diff_o(const fct_problem *p, const fct_result *a, const fct_result *b);
double fct_result_diff_lse(const fct_problem *p, const fct_result *a, const fct_result *b);

/* create + run + release. */
void fct_check_case(const fct_case *c, const fct_run *run);
/* Runs the case with the flash and naive algorithms (each checked against the
 * reference) and checks the two against each other. */
void fct_check_flash_vs_naive(const fct_case *c);

const char *fct_algo_str(flashcl_algo algo);

/* ----------------------------------------------------- table-driven tests -- */

typedef enum fct_mode {
  FCT_CHECK_RUN = 0,     /* fct_check_case(c, run) */
  FCT_FLASH_VS_NAIVE = 1 /* fct_check_flash_vs_naive(c) */
} fct_mode;

typedef struct fct_table_entry {
  const char *name; /* the cmocka test name */
  fct_mode mode;
  fct_case c;
  fct_run run;
} fct_table_entry;

/* Runs every table entry as its own cmocka test (named entry.name), followed by
 * `extra`, in one group sharing one context. */
int fct_run_table(const char *group, const fct_table_entry *table, size_t n_table, const struct CMUnitTest *extra,
                  size_t n_extra);

#ifdef __cplusplus
}
#endif
#endif
