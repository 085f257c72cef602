/*
 * Fuzzer driver for flashcl's public entry points that take tensors or
 * descriptors. Every case is generated from (seed, case index) alone, so one
 * case replays on its own:
 *
 *   FLASHCL_FUZZ_SEED=<seed> FLASHCL_FUZZ_FIRST=<index> FLASHCL_FUZZ_CASES=1 ./test_fuzz
 *
 * Environment: FLASHCL_FUZZ_SEED (default: time ^ pid, printed), FLASHCL_FUZZ_CASES
 * (default 10000), FLASHCL_FUZZ_FIRST (first case index, default 0),
 * FLASHCL_FUZZ_BATCH (cases per child process, default 2500),
 * FLASHCL_FUZZ_TIMEOUT (seconds one case may take before its child is killed,
 * default 120), FLASHCL_FUZZ_NOFORK=1 (run in this process: for debuggers),
 * FLASHCL_FUZZ_VERBOSE=1 (print every case).
 *
 * A case builds a valid problem for one entry point (small shapes from a short
 * list, so the few kernel configurations are built once per child and then come
 * from the program cache), then, most of the time, breaks it with one to three
 * hostile mutations (shapes, strides, offsets, dtypes, head dims, NULLs, buffers
 * one byte short, descriptor fields, struct_size, garbage device-side lengths,
 * overlapping outputs, wait lists). Oracle:
 *   - a negative status leaves every buffer of the case byte-identical (all of
 *     them, inputs and outputs, start with random bytes; host-side outputs too);
 *   - a mutation the header documents as invalid must give a negative status;
 *   - a success writes only the bytes of the output views (the rest of each
 *     output buffer, before and after the view, is a guard);
 *   - an unmutated case must succeed, and its outputs match the double
 *     reference (rel. L2: fp32 1e-5, fp16 2e-3, bf16 1e-2; no NaN).
 * Batches run in child processes (fork); a child that crashes or hangs (alarm)
 * is reported with the seed and case index, and the run goes on after it.
 */
#include "common.h"
#include "reference_bwd.h"
#include "reference_kvq.h"
#include "reference_masks.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ rng -- */

typedef struct frng {
  uint64_t s;
} frng;

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static uint64_t r64(frng *r) { return mix64(r->s += 0x9e3779b97f4a7c15ULL); }
static int rbelow(frng *r, int n) { return n <= 1 ? 0 : (int)(r64(r) % (uint64_t)n); }
static int rrange(frng *r, int lo, int hi) { return lo + rbelow(r, hi - lo + 1); }
static double runif(frng *r) { return (double)(r64(r) >> 11) * (1.0 / 9007199254740992.0); }
static int rchance(frng *r, double p) { return runif(r) < p; }
static double rnormal(frng *r) {
  double u = runif(r), v = runif(r);
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ------------------------------------------------------------- the case -- */

#define MAXBUF 40

typedef struct fz_buf {
  cl_mem mem;
  size_t bytes;
  unsigned char *init; /* what was uploaded */
  unsigned char *cur;  /* read back after the call */
  unsigned char *mayw; /* 1: an output byte a successful call may write */
  char name[24];
} fz_buf;

/* Host-side output (a struct or array the call fills), checked like a buffer. */
typedef struct fz_host {
  void *p;
  size_t bytes;
  unsigned char *init;
  int may_write;
  char name[24];
} fz_host;

typedef struct fz_case {
  uint64_t index;
  frng r;
  int must_fail;   /* a documented-invalid mutation was applied */
  int mutated;     /* any mutation was applied */
  int garbage_dev; /* device-side lengths / tables are garbage */
  char log[2048];
  int nbuf;
  fz_buf buf[MAXBUF];
  int nhost;
  fz_host host[8];
  int failed;
  const char *entry;
  /* Fields already mutated ("|q.stride1|desc4|..."): each is mutated at most
   * once, so a later mutation never undoes an earlier invalid one. */
  char claimed[512];
  /* Buffers one byte short, applied after every other mutation (upload_all),
   * from the view's final span. */
  int npend;
  struct fz_tensor *pend[4];
  const struct flashcl_tensor **pend_ptr[4];
  const char *pend_name[4];
  /* Invalid only where a flash kernel runs (desc.algorithm.algo not NAIVE at call time):
   * desc.algorithm.kernel = NVIDIA_MMA on this device, block sizes the plan cannot fit. */
  int bad_kernel, bad_blocks;
  /* desc.varlen.max_seqlen_k was mutated: judged on the final descriptor, since a
   * paged source takes any value >= 0 (clamped to the pools) and varlen
   * without one needs 1..Nk. */
  int seqk_mut;
} fz_case;

/* How many fields of tensor `name` are claimed. */
static int claimed_prefix(const fz_case *c, const char *name) {
  char pre[40];
  const char *p = c->claimed;
  int n = 0;
  snprintf(pre, sizeof pre, "|%s.", name);
  while ((p = strstr(p, pre)) != NULL) n++, p++;
  return n;
}

/* Claims the field named by fmt for this case: 1 the first time, 0 after. */
static int claim(fz_case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int claim(fz_case *c, const char *fmt, ...) {
  char key[64], bar[68];
  va_list ap;
  size_t n = strlen(c->claimed);
  va_start(ap, fmt);
  vsnprintf(key, sizeof key, fmt, ap);
  va_end(ap);
  snprintf(bar, sizeof bar, "|%s|", key);
  if (strstr(c->claimed, bar)) return 0;
  if (n + strlen(bar) < sizeof c->claimed) snprintf(c->claimed + n, sizeof c->claimed - n, "%s", bar + (n ? 1 : 0));
  return 1;
}

static flashcl_context *g_ctx;
/* The device runs the tensor-core kernels: desc.algorithm.kernel = NVIDIA_MMA is then a
 * valid request (it falls back to the portable kernels where they don't cover
 * a problem), and refused elsewhere. */
static int g_has_mma;
static cl_context g_cl;
static cl_command_queue g_queue;
static cl_context g_foreign; /* a second cl_context: its buffers are not the flashcl context's */
static cl_mem g_foreign_buf;
static uint64_t g_seed;
static int g_verbose;

/* Counters of this process, sent to the parent at exit. */
typedef struct fz_stats {
  long cases, rejected, succeeded, checked, findings;
  long per_entry_ok[24], per_entry_n[24];
  double per_entry_s[24]; /* wall seconds, setup and checks included */
} fz_stats;
static double now(void);
static fz_stats g_stats;

static void clog_(fz_case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void clog_(fz_case *c, const char *fmt, ...) {
  size_t n = strlen(c->log);
  va_list ap;
  if (n + 2 >= sizeof c->log) return;
  va_start(ap, fmt);
  vsnprintf(c->log + n, sizeof c->log - n, fmt, ap);
  va_end(ap);
  n = strlen(c->log);
  if (n + 2 < sizeof c->log) strcat(c->log, "; ");
}

static void finding(fz_case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void finding(fz_case *c, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "[ FINDING ] seed %llu case %llu (%s): ", (unsigned long long)g_seed,
          (unsigned long long)c->index, c->entry);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n    case: %s\n    last error: %s\n    replay: FLASHCL_FUZZ_SEED=%llu FLASHCL_FUZZ_FIRST=%llu "
                  "FLASHCL_FUZZ_CASES=1\n",
          c->log, g_ctx ? flashcl_context_last_error(g_ctx) : "", (unsigned long long)g_seed,
          (unsigned long long)c->index);
  c->failed = 1;
}

static void die(const char *what, int err) {
  fprintf(stderr, "test_fuzz: %s failed (%d)\n", what, err);
  exit(3);
}

/* A device buffer of `bytes` random bytes (bytes == 0: NULL mem). */
static fz_buf *buf_new(fz_case *c, size_t bytes, const char *name) {
  fz_buf *b;
  cl_int err;
  size_t i;
  if (c->nbuf >= MAXBUF) die("buffer table", c->nbuf);
  b = &c->buf[c->nbuf++];
  memset(b, 0, sizeof *b);
  snprintf(b->name, sizeof b->name, "%s", name);
  b->bytes = bytes;
  b->init = malloc(bytes + 1);
  b->cur = malloc(bytes + 1);
  b->mayw = calloc(bytes + 1, 1);
  if (!b->init || !b->cur || !b->mayw) die("malloc", 0);
  for (i = 0; i + 8 <= bytes; i += 8) {
    uint64_t x = r64(&c->r);
    memcpy(b->init + i, &x, 8);
  }
  for (; i < bytes; i++) b->init[i] = (unsigned char)r64(&c->r);
  if (bytes) {
    b->mem = clCreateBuffer(g_cl, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) die("clCreateBuffer", err);
  }
  return b;
}

static void buf_upload(fz_buf *b) {
  cl_int err;
  if (!b->bytes) return;
  err = clEnqueueWriteBuffer(g_queue, b->mem, CL_TRUE, 0, b->bytes, b->init, 0, NULL, NULL);
  if (err != CL_SUCCESS) die("clEnqueueWriteBuffer", err);
}

static fz_buf *buf_of(fz_case *c, cl_mem m) {
  int i;
  for (i = 0; i < c->nbuf; i++)
    if (m && c->buf[i].mem == m) return &c->buf[i];
  return NULL;
}

static void host_watch(fz_case *c, void *p, size_t bytes, const char *name) {
  fz_host *h = &c->host[c->nhost++];
  size_t i;
  h->p = p;
  h->bytes = bytes;
  h->init = malloc(bytes);
  for (i = 0; i < bytes; i++) ((unsigned char *)p)[i] = (unsigned char)r64(&c->r);
  memcpy(h->init, p, bytes);
  h->may_write = 1;
  snprintf(h->name, sizeof h->name, "%s", name);
}

static void case_release(fz_case *c) {
  int i;
  for (i = 0; i < c->nbuf; i++) {
    if (c->buf[i].mem) clReleaseMemObject(c->buf[i].mem);
    free(c->buf[i].init);
    free(c->buf[i].cur);
    free(c->buf[i].mayw);
  }
  for (i = 0; i < c->nhost; i++) free(c->host[i].init);
  c->nbuf = c->nhost = 0;
}

/* ------------------------------------------------------------- tensors -- */

typedef struct fz_tensor {
  flashcl_tensor t;
  fz_buf *b;
  int is_output;
} fz_tensor;

static size_t dsize(flashcl_dtype dt) { return fct_dtype_size(dt); }

/* Byte extent of a valid view: offset + (max element index + 1) * es. */
static size_t view_end(const flashcl_tensor *t) {
  size_t es = dsize(t->dtype), m = 0;
  int i;
  for (i = 0; i < 4; i++) m += (size_t)(t->shape[i] - 1) * (size_t)t->stride[i];
  return t->offset + (m + 1) * es;
}

static size_t tidx(const flashcl_tensor *t, int64_t b, int64_t n, int64_t h, int64_t x) {
  return t->offset / dsize(t->dtype) + (size_t)(b * t->stride[0] + n * t->stride[1] + h * t->stride[2] +
                                                x * t->stride[3]);
}

static float rand_val(frng *r) {
  double v;
  do v = rnormal(r);
  while (fabs(v) < 1e-3);
  return (float)v;
}

/* A valid (B, N, H, D) view in a buffer of its own with random bytes around it:
 * BNHD, BHND or padded strides, with a random element offset and a random tail.
 * Inputs get random N(0, 1) values (never 0) at every element of the view. */
static void tensor_make(fz_case *c, fz_tensor *ft, flashcl_dtype dt, int64_t B, int64_t N, int64_t H, int64_t D,
                        int is_output, const char *name) {
  const size_t es = dsize(dt);
  const int layout = rbelow(&c->r, 3);
  int64_t s[4];
  int64_t b, n, h, x;
  size_t off = (size_t)rbelow(&c->r, 3) * (size_t)rrange(&c->r, 1, 24) * es, tail = (size_t)rbelow(&c->r, 40) * es;
  if (layout == 0) {
    s[3] = 1, s[2] = D, s[1] = H * D, s[0] = N * H * D;
  } else if (layout == 1) {
    s[3] = 1, s[1] = D, s[2] = N * D, s[0] = H * N * D;
  } else {
    s[3] = 1, s[2] = D + rrange(&c->r, 0, 3) * 8, s[1] = H * s[2] + rrange(&c->r, 0, 5),
    s[0] = N * s[1] + rrange(&c->r, 0, 7);
  }
  memset(ft, 0, sizeof *ft);
  ft->t.dtype = dt;
  ft->t.offset = off;
  ft->t.shape[0] = B, ft->t.shape[1] = N, ft->t.shape[2] = H, ft->t.shape[3] = D;
  memcpy(ft->t.stride, s, sizeof s);
  ft->b = buf_new(c, view_end(&ft->t) + tail, name);
  ft->t.buffer = ft->b->mem;
  ft->is_output = is_output;
  if (!is_output)
    for (b = 0; b < B; b++)
      for (n = 0; n < N; n++)
        for (h = 0; h < H; h++)
          for (x = 0; x < D; x++) fct_store(dt, ft->b->init, tidx(&ft->t, b, n, h, x), rand_val(&c->r));
}

/* fp32 (B, N, H, 1) LSE view: flashcl_tensor_init_lse's layout, or padded. */
static void lse_make(fz_case *c, fz_tensor *ft, int64_t B, int64_t N, int64_t H, int is_output, const char *name) {
  size_t off = (size_t)rbelow(&c->r, 2) * (size_t)rrange(&c->r, 1, 16) * 4, tail = (size_t)rbelow(&c->r, 16) * 4;
  memset(ft, 0, sizeof *ft);
  ft->t.dtype = FLASHCL_F32;
  ft->t.offset = off;
  ft->t.shape[0] = B, ft->t.shape[1] = N, ft->t.shape[2] = H, ft->t.shape[3] = 1;
  if (rchance(&c->r, 0.7)) {
    ft->t.stride[3] = 1, ft->t.stride[1] = 1, ft->t.stride[2] = N, ft->t.stride[0] = H * N;
  } else {
    ft->t.stride[3] = 1, ft->t.stride[2] = 1, ft->t.stride[1] = H + rbelow(&c->r, 3), ft->t.stride[0] = N * (H + 3);
  }
  ft->b = buf_new(c, view_end(&ft->t) + tail, name);
  ft->t.buffer = ft->b->mem;
  ft->is_output = is_output;
  if (!is_output) {
    int64_t b, n, h;
    for (b = 0; b < B; b++)
      for (n = 0; n < N; n++)
        for (h = 0; h < H; h++) fct_store(FLASHCL_F32, ft->b->init, tidx(&ft->t, b, n, h, 0), rand_val(&c->r));
  }
}

/* Marks the bytes of every element of a view as writable on success. */
static void mark_view(fz_case *c, const flashcl_tensor *t) {
  fz_buf *b = buf_of(c, t->buffer);
  const size_t es = dsize(t->dtype);
  int64_t i0, i1, i2, i3;
  if (!b || !es) return;
  if ((double)t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3] > 4e6) return;
  for (i0 = 0; i0 < t->shape[0]; i0++)
    for (i1 = 0; i1 < t->shape[1]; i1++)
      for (i2 = 0; i2 < t->shape[2]; i2++)
        for (i3 = 0; i3 < t->shape[3]; i3++) {
          size_t e = tidx(t, i0, i1, i2, i3) * es;
          if (e + es <= b->bytes) memset(b->mayw + e, 1, es);
        }
}

static double tget(const fz_buf *b, const flashcl_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return fct_load(t->dtype, b->cur, tidx(t, i0, i1, i2, i3));
}

static ref_tensor tref(const fz_tensor *ft) {
  ref_tensor r;
  memset(&r, 0, sizeof r);
  r.data = ft->b->init;
  r.load = fct_loader(ft->t.dtype);
  r.offset = (int64_t)(ft->t.offset / dsize(ft->t.dtype));
  memcpy(r.shape, ft->t.shape, sizeof r.shape);
  memcpy(r.stride, ft->t.stride, sizeof r.stride);
  return r;
}

/* ------------------------------------------------------------ hostility -- */

static const int64_t HOSTILE_DIM[] = {0, -1, -7, INT64_MIN, INT64_MAX, (int64_t)1 << 31, ((int64_t)1 << 31) - 1,
                                      (int64_t)1 << 40, (int64_t)1 << 62, 1000000};
static const int64_t HOSTILE_STRIDE[] = {-1, -8, INT64_MIN, INT64_MAX, (int64_t)1 << 62, (int64_t)1 << 33, 0, 1, 2, 3};
static const int HOSTILE_INT[] = {0, -1, -2, INT_MIN, INT_MAX, 1 << 30, 3, 7, 1000, 17};

static int64_t pick64(frng *r, const int64_t *a, int n) { return a[rbelow(r, n)]; }
#define PICK(r, a) pick64((r), (a), (int)(sizeof(a) / sizeof((a)[0])))
static int pick_int(frng *r) { return HOSTILE_INT[rbelow(r, (int)(sizeof HOSTILE_INT / sizeof HOSTILE_INT[0]))]; }

static float hostile_float(frng *r) {
  static const float v[] = {NAN, INFINITY, -INFINITY, -1.0f, -0.0f, 1e-45f, 1e30f, 1.0f, 0.5f, FLT_MAX};
  return v[rbelow(r, 10)];
}

/* Breaks one field of a tensor the call reads or writes. `nullable`: the pointer
 * itself may be NULL (lse). Sets c->must_fail for documented-invalid values. */
static void mutate_tensor(fz_case *c, fz_tensor *ft, const flashcl_tensor **ptr, const char *name, int nullable) {
  flashcl_tensor *t = &ft->t;
  static const char *const field[10] = {"shape", "stride", "offset", "dtype", "buffer",
                                        "buffer", "ptr", "buffer", "shape", "stride"};
  const int dim = rbelow(&c->r, 4), kind = rbelow(&c->r, 10);
  int64_t v;
  c->mutated = 1;
  if (!claim(c, "%s.%s%d", name, field[kind], kind == 8 ? 3 : kind == 9 ? 1 : kind < 2 ? dim : 0)) return;
  if (kind == 6 && nullable && claimed_prefix(c, name) > 1) return; /* NULL would undo its mutated fields */
  switch (kind) {
    case 0: /* hostile dimension */
      v = PICK(&c->r, HOSTILE_DIM);
      clog_(c, "%s.shape[%d] = %lld", name, dim, (long long)v);
      t->shape[dim] = v;
      if (v < 1 || v > INT32_MAX || v >= 1000000) c->must_fail = 1; /* invalid, or past its buffer */
      break;
    case 1: /* hostile stride */
      v = PICK(&c->r, HOSTILE_STRIDE);
      clog_(c, "%s.stride[%d] = %lld", name, dim, (long long)v);
      t->stride[dim] = v;
      if (v < 0) c->must_fail = 1;
      if (dim == 3 && v != 1 && t->shape[3] > 1) c->must_fail = 1; /* head_dim stride must be 1 */
      if (v >= ((int64_t)1 << 33) && t->shape[dim] > 1) c->must_fail = 1;  /* past the buffer */
      if (ft->is_output && v == 0 && t->shape[dim] > 1) c->must_fail = 1; /* names an element twice */
      break;
    case 2: /* hostile offset */
    {
      const size_t es = dsize(t->dtype) ? dsize(t->dtype) : 1;
      static const size_t offs[] = {SIZE_MAX, SIZE_MAX - 1, (size_t)1 << 62, 1, 2, 3};
      size_t o = offs[rbelow(&c->r, 6)];
      if (rchance(&c->r, 0.3)) o = ft->b ? ft->b->bytes : 4096;
      clog_(c, "%s.offset = %zu", name, o);
      if (o < 4 && o % es == 0) {
        t->offset += o; /* an aligned nudge: may still fit */
      } else {
        t->offset = o;
        c->must_fail = 1; /* misaligned, or past the buffer */
      }
      break;
    }
    case 3: /* dtype */
    {
      static const int dts[] = {-1, 7, 8, INT_MAX, INT_MIN, 0, 1, 2}; /* 3-6: the KV-cache formats */
      int d = dts[rbelow(&c->r, 8)];
      clog_(c, "%s.dtype = %d", name, d);
      if (d == (int)t->dtype) break;
      t->dtype = (flashcl_dtype)d;
      c->must_fail = 1; /* unknown, or mismatching the others */
      break;
    }
    case 4:
      clog_(c, "%s.buffer = NULL", name);
      t->buffer = NULL;
      c->must_fail = 1;
      break;
    case 5: /* a buffer one byte too small for the final view: upload_all */
      if (c->npend < 4) {
        c->pend[c->npend] = ft, c->pend_ptr[c->npend] = ptr, c->pend_name[c->npend] = name;
        c->npend++;
      }
      break;
    case 6:
      clog_(c, "%s = NULL", name);
      *ptr = NULL;
      if (!nullable) c->must_fail = 1;
      break;
    case 7: /* a buffer of another cl_context */
      clog_(c, "%s.buffer of a foreign context", name);
      if (!g_foreign_buf) break;
      t->buffer = g_foreign_buf;
      c->must_fail = 1;
      break;
    case 8: /* head dim: odd, 0, 1000, not a multiple of 8 */
    {
      static const int64_t hd[] = {1, 7, 12, 0, 1000, 264, 255, 4};
      v = hd[rbelow(&c->r, 8)];
      clog_(c, "%s.head_dim = %lld", name, (long long)v);
      if (v != t->shape[3]) c->must_fail = 1;
      t->shape[3] = v;
      break;
    }
    default: /* an overlapping stride: rows that share elements */
      clog_(c, "%s.stride[1] = %lld (overlapping rows)", name, (long long)(t->shape[3] / 2));
      t->stride[1] = t->shape[3] / 2;
      if (ft->is_output && t->shape[1] > 1) c->must_fail = 1;
      break;
  }
}

/* Replaces the buffer of a pending "one byte short" tensor by one a byte
 * smaller than its view's span after all the other mutations (offset + the sum
 * over dims of (shape - 1) * stride + 1 elements). */
static void apply_short(fz_case *c, fz_tensor *ft, const flashcl_tensor *const *ptr, const char *name) {
  flashcl_tensor *t = &ft->t;
  size_t need;
  int i, sane = *ptr && ft->b && t->buffer == ft->b->mem && dsize(t->dtype) != 0 && t->offset < (1u << 20);
  for (i = 0; i < 4; i++)
    sane = sane && t->shape[i] >= 1 && t->shape[i] < 4096 && t->stride[i] >= 0 && t->stride[i] < (1 << 20);
  if (!sane || (need = view_end(t)) > ft->b->bytes) {
    clog_(c, "%s.buffer one byte short: skipped (view not sane)", name);
    return;
  }
  fz_buf *nb = buf_new(c, need - 1, "short");
  if (!ft->is_output) memcpy(nb->init, ft->b->init, need - 1);
  clog_(c, "%s.buffer one byte short (%zu)", name, need - 1);
  t->buffer = nb->mem;
  ft->b = nb;
  c->must_fail = 1;
}

/* After the mutations: the pending short buffers, then every buffer's bytes. */
static void upload_all(fz_case *c) {
  int i;
  for (i = 0; i < c->npend; i++) apply_short(c, c->pend[i], c->pend_ptr[i], c->pend_name[i]);
  c->npend = 0;
  for (i = 0; i < c->nbuf; i++) buf_upload(&c->buf[i]);
}

/* ----------------------------------------------------------- oracle -- */

static void wait_event(cl_event *ev) {
  if (*ev) {
    clWaitForEvents(1, ev);
    clReleaseEvent(*ev);
    *ev = NULL;
  }
}

/* Reads every buffer back and checks the bytes: all unchanged after a failure;
 * only output-view bytes changed after a success. */
static void check_bytes(fz_case *c, int st) {
  int i;
  cl_int err = clFinish(g_queue);
  if (err != CL_SUCCESS) {
    finding(c, "clFinish after the call failed (%d)", err);
    return;
  }
  for (i = 0; i < c->nbuf; i++) {
    fz_buf *b = &c->buf[i];
    size_t k, bad = 0, first = 0;
    if (!b->bytes) continue;
    err = clEnqueueReadBuffer(g_queue, b->mem, CL_TRUE, 0, b->bytes, b->cur, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
      finding(c, "reading %s back failed (%d)", b->name, err);
      continue;
    }
    for (k = 0; k < b->bytes; k++)
      if (b->cur[k] != b->init[k] && (st != 0 || !b->mayw[k])) {
        if (!bad++) first = k;
      }
    if (bad) {
      if (st != 0)
        finding(c, "failed call (status %d %s) changed %zu byte(s) of %s (first at byte %zu of %zu)", st,
                flashcl_status_string(st), bad, b->name, first, b->bytes);
      else
        finding(c, "successful call changed %zu byte(s) of %s outside the output views (first at byte %zu of %zu)",
                bad, b->name, first, b->bytes);
    }
  }
  for (i = 0; i < c->nhost; i++) {
    fz_host *h = &c->host[i];
    if ((st != 0 || !h->may_write) && memcmp(h->p, h->init, h->bytes) != 0)
      finding(c, "%s call changed host output %s", st ? "failed" : "successful", h->name);
  }
}

/* Common status handling: returns 1 when the caller should check results. */
static int judge(fz_case *c, int st, int want_check) {
  g_stats.cases++;
  if (st > 0 || (st < 0 && st != FLASHCL_ERROR_INVALID_ARGUMENT && st != FLASHCL_ERROR_INVALID_SHAPE &&
                 st != FLASHCL_ERROR_INVALID_STRIDE && st != FLASHCL_ERROR_BUFFER_TOO_SMALL &&
                 st != FLASHCL_ERROR_DTYPE_MISMATCH && st != FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM &&
                 st != FLASHCL_ERROR_UNSUPPORTED && st != FLASHCL_ERROR_OVERFLOW))
    finding(c, "unexpected status %d (%s)", st, flashcl_status_string(st));
  if (st != 0) {
    g_stats.rejected++;
    if (!c->mutated) finding(c, "an unmutated valid case failed with %d (%s)", st, flashcl_status_string(st));
    return 0;
  }
  g_stats.succeeded++;
  if (c->must_fail) finding(c, "a documented-invalid argument was accepted");
  return want_check && !c->mutated && !c->garbage_dev;
}

/* Relative L2 accumulator. */
typedef struct l2 {
  double num, den;
  long nan;
} l2;
static void l2_add(l2 *a, double got, double want) {
  if (isnan(got) || (isinf(got) && got != want)) {
    a->nan++;
    return;
  }
  if (isinf(want)) return;
  a->num += (got - want) * (got - want);
  a->den += want * want;
}
static double l2_rel(const l2 *a) { return a->nan ? INFINITY : (a->den > 0 ? sqrt(a->num / a->den) : sqrt(a->num)); }

static void l2_check(fz_case *c, const l2 *a, double tol, const char *what) {
  double e = l2_rel(a);
  g_stats.checked++;
  if (!(e <= tol)) finding(c, "%s: relative L2 error %.3e > %.1e (%ld NaN/inf mismatches)", what, e, tol, a->nan);
}

/* ------------------------------------------------------------ attention -- */

enum { E_FWD, E_BWD, E_WS, E_KF, E_CFG, E_DROPMASK, E_DEC, E_DEC_WS, E_DEC_CFG, E_APPEND, E_MERGE, E_TINIT,
       E_MASKWORDS, E_BLOCKFILL, E_PLAN, E_COUNT };
static const char *const ENTRY_NAMES[E_COUNT] = {
    "flashcl_attention_forward",       "flashcl_attention_backward",   "flashcl_attention_workspace_size",
    "flashcl_attention_kernel_family", "flashcl_attention_config",     "flashcl_dropout_mask",
    "flashcl_attention_decode",        "flashcl_attention_decode_workspace_size", "flashcl_decode_config",
    "flashcl_kv_cache_append",         "flashcl_merge_states",         "flashcl_tensor_init_*",
    "flashcl_mask_words",              "flashcl_block_mask_fill",      "flashcl_attention_block_plan"};

typedef struct attn {
  flashcl_dtype dt;
  int B, Nq, Nk, Hq, Hkv, D, varlen, num_seqs;
  int32_t cuq[5], cuk[5];
  float alibi[8], sinks[8];
  flashcl_attention_desc desc;
  fz_tensor q, k, v, o, lse, d_o, dq, dk, dv;
  fz_buf *cu_q, *cu_k, *alibi_b, *sinks_b;
} attn;

static const flashcl_dtype DTYPES[3] = {FLASHCL_F32, FLASHCL_F16, FLASHCL_BF16};
static double tol_of(flashcl_dtype dt) { return dt == FLASHCL_F32 ? 1e-5 : dt == FLASHCL_F16 ? 2e-3 : 1e-2; }

/* A valid attention problem (small shapes, d = 32). bwd: no window / ALiBi /
 * softcap (the reference with a rounding allowance covers causal, GQA, varlen
 * and dropout), o and lse become inputs written by a forward call. */
static void attn_make(fz_case *c, attn *a, int bwd) {
  flashcl_attention_desc *d = &a->desc;
  int s;
  memset(a, 0, sizeof *a);
  a->dt = DTYPES[rbelow(&c->r, 3)];
  a->D = 32;
  a->Hkv = rrange(&c->r, 1, 2);
  a->Hq = a->Hkv * rrange(&c->r, 1, 2);
  flashcl_attention_desc_init(d);
  d->mask.causal = rchance(&c->r, 0.5);
  if (rchance(&c->r, 0.2)) {
    int tq = 0, tk = 0, mq = 1, mk = 1;
    a->varlen = 1;
    a->num_seqs = rrange(&c->r, 1, 3);
    a->cuq[0] = a->cuk[0] = 0;
    for (s = 0; s < a->num_seqs; s++) {
      int lq = rrange(&c->r, 0, 8), lk = rrange(&c->r, 0, 8);
      if (s == a->num_seqs - 1 && tq + lq == 0) lq = 1;
      if (s == a->num_seqs - 1 && tk + lk == 0) lk = 1;
      tq += lq, tk += lk;
      mq = lq > mq ? lq : mq, mk = lk > mk ? lk : mk;
      a->cuq[s + 1] = tq, a->cuk[s + 1] = tk;
    }
    a->B = 1, a->Nq = tq, a->Nk = tk;
    d->varlen.num_seqs = a->num_seqs, d->varlen.max_seqlen_q = mq, d->varlen.max_seqlen_k = mk;
    a->cu_q = buf_new(c, (size_t)(a->num_seqs + 1) * 4, "cu_seqlens_q");
    a->cu_k = buf_new(c, (size_t)(a->num_seqs + 1) * 4, "cu_seqlens_k");
    memcpy(a->cu_q->init, a->cuq, (size_t)(a->num_seqs + 1) * 4);
    memcpy(a->cu_k->init, a->cuk, (size_t)(a->num_seqs + 1) * 4);
    d->varlen.cu_seqlens_q = a->cu_q->mem, d->varlen.cu_seqlens_k = a->cu_k->mem;
  } else {
    a->B = rrange(&c->r, 1, 2), a->Nq = rrange(&c->r, 1, 17), a->Nk = rrange(&c->r, 1, 17);
  }
  if (rchance(&c->r, 0.5)) d->score.scale = (float)(0.05 + 0.3 * runif(&c->r));
  if (!bwd && rchance(&c->r, 0.2)) d->score.window_left = rrange(&c->r, -1, 6), d->score.window_right = rrange(&c->r, -1, 6);
  if (!bwd && rchance(&c->r, 0.15)) d->score.softcap = (float)(5.0 + 30.0 * runif(&c->r));
  if (!bwd && rchance(&c->r, 0.15)) {
    a->alibi_b = buf_new(c, (size_t)a->Hq * 4 + (size_t)rbelow(&c->r, 3) * 4, "alibi_slopes");
    for (s = 0; s < a->Hq; s++) {
      a->alibi[s] = (float)(0.5 * runif(&c->r));
      memcpy(a->alibi_b->init + 4 * s, &a->alibi[s], 4);
    }
    d->score.alibi_slopes = a->alibi_b->mem;
  }
  if (!bwd && rchance(&c->r, 0.12)) { /* attention sinks, within the scores' range */
    a->sinks_b = buf_new(c, (size_t)a->Hq * 4 + (size_t)rbelow(&c->r, 3) * 4, "sinks");
    for (s = 0; s < a->Hq; s++) {
      a->sinks[s] = (float)(3.0 * runif(&c->r) - 1.0);
      memcpy(a->sinks_b->init + 4 * s, &a->sinks[s], 4);
    }
    d->score.sinks = a->sinks_b->mem;
  }
  if (rchance(&c->r, 0.15)) {
    d->dropout.p = 0.2f;
    d->dropout.seed = r64(&c->r);
    d->dropout.offset = (uint64_t)rbelow(&c->r, 1000);
  }
  tensor_make(c, &a->q, a->dt, a->B, a->Nq, a->Hq, a->D, 0, "q");
  tensor_make(c, &a->k, a->dt, a->B, a->Nk, a->Hkv, a->D, 0, "k");
  tensor_make(c, &a->v, a->dt, a->B, a->Nk, a->Hkv, a->D, 0, "v");
  tensor_make(c, &a->o, a->dt, a->B, a->Nq, a->Hq, a->D, !bwd, "o");
  lse_make(c, &a->lse, a->B, a->Nq, a->Hq, !bwd, "lse");
  if (bwd) {
    tensor_make(c, &a->d_o, a->dt, a->B, a->Nq, a->Hq, a->D, 0, "dO");
    tensor_make(c, &a->dq, a->dt, a->B, a->Nq, a->Hq, a->D, 1, "dq");
    tensor_make(c, &a->dk, a->dt, a->B, a->Nk, a->Hkv, a->D, 1, "dk");
    tensor_make(c, &a->dv, a->dt, a->B, a->Nk, a->Hkv, a->D, 1, "dv");
  }
}

static void attn_params(const attn *a, ref_attention_params *p, ref_masks *m, ref_dropout *dr) {
  memset(p, 0, sizeof *p);
  memset(m, 0, sizeof *m);
  memset(dr, 0, sizeof *dr);
  p->scale = a->desc.score.scale;
  p->causal = a->desc.mask.causal;
  if (a->varlen) p->cu_seqlens_q = a->cuq, p->cu_seqlens_k = a->cuk, p->num_seqs = a->num_seqs;
  m->window_left = a->desc.score.window_left, m->window_right = a->desc.score.window_right;
  m->alibi = a->desc.score.alibi_slopes ? a->alibi : NULL;
  m->sinks = a->desc.score.sinks ? a->sinks : NULL;
  m->softcap = a->desc.score.softcap;
  dr->p = a->desc.dropout.p, dr->seed = a->desc.dropout.seed, dr->offset = a->desc.dropout.offset;
}

static void check_o_lse(fz_case *c, const fz_tensor *o, const fz_tensor *lse, const double *ro, const double *rl,
                        int B, int N, int H, int D, flashcl_dtype dt, const char *what) {
  l2 eo = {0, 0, 0}, el = {0, 0, 0};
  int b, n, h, x;
  char w[64];
  for (b = 0; b < B; b++)
    for (n = 0; n < N; n++)
      for (h = 0; h < H; h++) {
        for (x = 0; x < D; x++) l2_add(&eo, tget(o->b, &o->t, b, n, h, x), ro[(((size_t)b * N + n) * H + h) * D + x]);
        if (lse && rl) l2_add(&el, tget(lse->b, &lse->t, b, n, h, 0), rl[((size_t)b * N + n) * H + h]);
      }
  snprintf(w, sizeof w, "%s O", what);
  l2_check(c, &eo, tol_of(dt), w);
  if (lse && rl) {
    snprintf(w, sizeof w, "%s LSE", what);
    l2_check(c, &el, dt == FLASHCL_F32 ? 1e-5 : 1e-4, w);
  }
}

static void attn_check_forward(fz_case *c, attn *a, int has_lse) {
  ref_attention_params p;
  ref_masks m;
  ref_dropout dr;
  const size_t no = (size_t)a->B * a->Nq * a->Hq;
  double *ro = malloc(no * a->D * sizeof(double)), *rl = malloc(no * sizeof(double));
  ref_tensor q = tref(&a->q), k = tref(&a->k), v = tref(&a->v);
  ref_out oo = ref_out_bnhd(ro, a->B, a->Nq, a->Hq, a->D), ol = ref_out_bnhd(rl, a->B, a->Nq, a->Hq, 1);
  attn_params(a, &p, &m, &dr);
  if (ref_masks_forward(&p, &m, &dr, &q, &k, &v, &oo, &ol) != 0)
    finding(c, "the reference refused the case (harness bug)");
  else
    check_o_lse(c, &a->o, has_lse ? &a->lse : NULL, ro, rl, a->B, a->Nq, a->Hq, a->D, a->dt, "forward");
  free(ro);
  free(rl);
}

/* Gradient check with test_backward's rounding allowance:
 * ||got - ref|| <= tol ||ref|| + 4 u32 ||mag||. */
static void grad_check(fz_case *c, const fz_tensor *t, const double *ref, const double *mag, const char *name) {
  const int64_t B = t->t.shape[0], N = t->t.shape[1], H = t->t.shape[2], D = t->t.shape[3];
  double e2 = 0, r2 = 0, m2 = 0;
  long nan = 0;
  int64_t i, b, n, h, x;
  for (b = 0; b < B; b++)
    for (n = 0; n < N; n++)
      for (h = 0; h < H; h++)
        for (x = 0; x < D; x++) {
          const double g = tget(t->b, &t->t, b, n, h, x);
          i = ((b * N + n) * H + h) * D + x;
          if (!isfinite(g)) nan++;
          else e2 += (g - ref[i]) * (g - ref[i]);
          r2 += ref[i] * ref[i], m2 += mag[i] * mag[i];
        }
  g_stats.checked++;
  if (nan || !(sqrt(e2) <= tol_of(t->t.dtype) * sqrt(r2) + 4.0 * 5.9604644775390625e-8 * sqrt(m2)))
    finding(c, "backward %s: relative L2 error %.3e > %.1e (%ld non-finite)", name, r2 > 0 ? sqrt(e2 / r2) : sqrt(e2),
            tol_of(t->t.dtype), nan);
}

static void attn_check_backward(fz_case *c, attn *a) {
  ref_attention_params p;
  ref_masks m;
  ref_dropout dr;
  const size_t nq = (size_t)a->B * a->Nq * a->Hq * a->D, nk = (size_t)a->B * a->Nk * a->Hkv * a->D;
  double *g[3], *mg[3];
  ref_tensor q = tref(&a->q), k = tref(&a->k), v = tref(&a->v), o = tref(&a->o), d_o = tref(&a->d_o);
  ref_out oq, ok, ov, mq, mk, mv;
  int i;
  g[0] = calloc(nq, sizeof(double)), mg[0] = calloc(nq, sizeof(double));
  for (i = 1; i < 3; i++) g[i] = calloc(nk, sizeof(double)), mg[i] = calloc(nk, sizeof(double));
  oq = ref_out_bnhd(g[0], a->B, a->Nq, a->Hq, a->D), mq = ref_out_bnhd(mg[0], a->B, a->Nq, a->Hq, a->D);
  ok = ref_out_bnhd(g[1], a->B, a->Nk, a->Hkv, a->D), mk = ref_out_bnhd(mg[1], a->B, a->Nk, a->Hkv, a->D);
  ov = ref_out_bnhd(g[2], a->B, a->Nk, a->Hkv, a->D), mv = ref_out_bnhd(mg[2], a->B, a->Nk, a->Hkv, a->D);
  attn_params(a, &p, &m, &dr);
  if (ref_attention_backward_mag(&p, &dr, &q, &k, &v, &o, &d_o, &oq, &ok, &ov, &mq, &mk, &mv) != 0) {
    finding(c, "the backward reference refused the case (harness bug)");
  } else {
    grad_check(c, &a->dq, g[0], mg[0], "dq");
    grad_check(c, &a->dk, g[1], mg[1], "dk");
    grad_check(c, &a->dv, g[2], mg[2], "dv");
  }
  for (i = 0; i < 3; i++) free(g[i]), free(mg[i]);
}

static flashcl_tuning g_decode_tuning;
static flashcl_tuning g_merge1_tuning; /* decode merge=1: the one-launch split merge */

/* Breaks one field of an attention descriptor. */
static void mutate_adesc(fz_case *c, attn *a, int bwd) {
  flashcl_attention_desc *d = &a->desc;
  float f;
  int v;
  const int kind = rbelow(&c->r, 19);
  c->mutated = 1;
  if (!claim(c, "desc%d", kind == 5 ? 4 : kind)) return;
  switch (kind) {
    case 0: {
      static const size_t sz[] = {1, 4, 7, sizeof(flashcl_attention_desc) + 1, sizeof(flashcl_attention_desc) + 8,
                                  SIZE_MAX, 0, (size_t)1 << 40};
      size_t z = sz[rbelow(&c->r, 8)];
      clog_(c, "desc.struct_size = %zu", z);
      d->struct_size = z;
      if (z != 0) c->must_fail = 1; /* 0 is this header's size */
      break;
    }
    case 1:
      f = hostile_float(&c->r);
      clog_(c, "desc.score.scale = %g", (double)f);
      d->score.scale = f;
      break;
    case 2:
      v = pick_int(&c->r);
      clog_(c, "desc.shape.heads_q = %d", v);
      d->shape.heads_q = v;
      if (v != 0 && v != a->Hq) c->must_fail = 1;
      break;
    case 3:
      v = pick_int(&c->r);
      clog_(c, "desc.shape.heads_kv = %d", v);
      d->shape.heads_kv = v;
      if (v != 0 && v != a->Hkv) c->must_fail = 1;
      break;
    case 4:
    case 5: {
      const int left = rbelow(&c->r, 2);
      v = pick_int(&c->r);
      clog_(c, "desc.score.window_%s = %d", left ? "left" : "right", v);
      if (left) d->score.window_left = v;
      else d->score.window_right = v;
      if (v < -1) c->must_fail = 1;
      break;
    }
    case 6:
      f = hostile_float(&c->r);
      clog_(c, "desc.score.softcap = %g", (double)f);
      d->score.softcap = f;
      if (!(f == 0.0f || (isfinite(f) && f > 0.0f))) c->must_fail = 1;
      break;
    case 7:
      f = hostile_float(&c->r);
      clog_(c, "desc.dropout.p = %g", (double)f);
      d->dropout.p = f;
      if (!(f >= 0.0f && f < 1.0f)) c->must_fail = 1;
      break;
    case 8: /* ALiBi slopes: short buffer, or NaN / inf / negative slopes */
    {
      fz_buf *b;
      if (rchance(&c->r, 0.5)) {
        b = buf_new(c, (size_t)a->Hq * 4 - 1, "alibi_short");
        clog_(c, "desc.score.alibi_slopes %d bytes", a->Hq * 4 - 1);
        c->must_fail = 1;
      } else {
        int h;
        b = buf_new(c, (size_t)a->Hq * 4, "alibi_hostile");
        for (h = 0; h < a->Hq; h++) {
          f = hostile_float(&c->r);
          memcpy(b->init + 4 * h, &f, 4);
        }
        clog_(c, "desc.score.alibi_slopes hostile values");
        c->garbage_dev = 1;
      }
      d->score.alibi_slopes = b->mem;
      break;
    }
    case 9: {
      static const int al[] = {-1, 3, 99, INT_MIN, FLASHCL_ALGO_NAIVE, FLASHCL_ALGO_FLASH};
      v = al[rbelow(&c->r, 6)];
      clog_(c, "desc.algorithm.algo = %d", v);
      d->algorithm.algo = (flashcl_algo)v;
      if (v < 0 || v > 2) c->must_fail = 1;
      break;
    }
    case 10: {
      static const int kf[] = {-1, 3, 42, FLASHCL_KERNEL_NVIDIA_MMA, FLASHCL_KERNEL_PORTABLE};
      v = kf[rbelow(&c->r, 5)];
      clog_(c, "desc.algorithm.kernel = %d", v);
      d->algorithm.kernel = (flashcl_kernel_family)v;
      if (v < 0 || v > 2) c->must_fail = 1;
      c->bad_kernel = v == 2 && !g_has_mma; /* refused where the device has no tensor-core path */
      break;
    }
    case 11: {
      static const int bl[] = {7, -8, 12, INT_MAX, 1 << 20, INT_MIN, 1, 8, 16};
      v = bl[rbelow(&c->r, 9)];
      if (rbelow(&c->r, 2)) d->algorithm.block_r = v;
      else d->algorithm.block_c = v;
      clog_(c, "desc.algorithm.block_%s = %d", d->algorithm.block_r == v ? "r" : "c", v);
      if (v < 0 || v % 8) c->must_fail = 1;
      if (v >= (1 << 20)) c->bad_blocks = 1; /* no tile plan fits */
      break;
    }
    case 12: /* varlen fields */
      if (a->varlen && rchance(&c->r, 0.6)) {
        int k, w = rbelow(&c->r, 2);
        fz_buf *b = w ? a->cu_k : a->cu_q;
        for (k = 0; k < a->num_seqs + 1; k++) {
          int32_t g = (int32_t)r64(&c->r);
          if (rchance(&c->r, 0.3)) g = (int32_t)rrange(&c->r, -3, 40);
          memcpy(b->init + 4 * k, &g, 4);
        }
        clog_(c, "garbage %s", b->name);
        c->garbage_dev = 1;
      } else {
        v = pick_int(&c->r);
        switch (rbelow(&c->r, 3)) {
          case 0:
            clog_(c, "desc.varlen.num_seqs = %d", v);
            if (a->varlen && (v < 1 || v > d->varlen.num_seqs)) c->must_fail = 1;
            d->varlen.num_seqs = v;
            break;
          case 1:
            clog_(c, "desc.varlen.max_seqlen_q = %d", v);
            if (a->varlen && (v < 1 || v > a->Nq)) c->must_fail = 1;
            d->varlen.max_seqlen_q = v;
            break;
          default:
            clog_(c, "desc.varlen.max_seqlen_k = %d", v);
            c->seqk_mut = 1; /* judged at the call (run_attention) */
            d->varlen.max_seqlen_k = v;
            break;
        }
      }
      break;
    case 13: /* explicit masks */
    {
      static const int mk[] = {-1, 3, FLASHCL_MASK_BLOCK, FLASHCL_MASK_BITS};
      v = mk[rbelow(&c->r, 4)];
      d->mask.kind = (flashcl_mask_kind)v;
      d->mask.block_q = rbelow(&c->r, 4) ? rrange(&c->r, 1, 16) : pick_int(&c->r);
      d->mask.block_k = rbelow(&c->r, 4) ? rrange(&c->r, 1, 16) : pick_int(&c->r);
      d->mask.per_head = rbelow(&c->r, 2);
      clog_(c, "desc.mask.kind = %d (blocks %d x %d, per_head %d)", v, d->mask.block_q, d->mask.block_k,
            d->mask.per_head);
      if (v < 0 || v > 2) {
        c->must_fail = 1;
      } else if (rchance(&c->r, 0.2)) {
        clog_(c, "desc.mask.bits = NULL");
        c->must_fail = 1;
      } else {
        /* garbage bits, exactly the documented size, or one byte short */
        int Lq = a->varlen ? d->varlen.max_seqlen_q : a->Nq, Lk = a->varlen ? d->varlen.max_seqlen_k : a->Nk;
        int64_t R, C, W, words;
        int short_ = rchance(&c->r, 0.3);
        if (v == FLASHCL_MASK_BLOCK && (d->mask.block_q < 1 || d->mask.block_k < 1)) {
          c->must_fail = 1;
          d->mask.bits = a->q.b->mem;
          break;
        }
        R = v == FLASHCL_MASK_BLOCK ? ((int64_t)Lq + d->mask.block_q - 1) / d->mask.block_q : Lq;
        C = v == FLASHCL_MASK_BLOCK ? ((int64_t)Lk + d->mask.block_k - 1) / d->mask.block_k : Lk;
        W = (C + 31) / 32;
        words = (int64_t)(a->varlen ? a->num_seqs : a->B) * (d->mask.per_head ? a->Hq : 1) * R * W;
        if (words < 1 || words > (1 << 24)) { /* lengths already made invalid (max_seqlen_q <= 0) */
          d->mask.bits = a->q.b->mem;
          c->garbage_dev = 1;
          break;
        }
        d->mask.bits = buf_new(c, (size_t)words * 4 - (short_ ? 1 : 0), "mask")->mem;
        if (short_) c->must_fail = 1;
        clog_(c, "mask %lld words%s", (long long)words, short_ ? " less one byte" : "");
        c->garbage_dev = 1; /* random bits: valid, but no reference here */
      }
      break;
    }
    case 14: /* paged K/V source with garbage tables and lengths */
    {
      int mp = rbelow(&c->r, 5) ? rrange(&c->r, 1, 3) : pick_int(&c->r);
      int B = a->varlen ? a->num_seqs : a->B, k;
      fz_buf *tb, *ls;
      d->paged.cache.page_size = rbelow(&c->r, 5) ? a->Nk : pick_int(&c->r);
      d->paged.cache.max_pages = mp;
      clog_(c, "paged source page_size %d max_pages %d", d->paged.cache.page_size, mp);
      if (mp < 1 || mp > 64 || d->paged.cache.page_size != a->Nk || bwd) c->must_fail = 1;
      if (mp < 1 || mp > 64) mp = 1;
      tb = buf_new(c, (size_t)B * mp * 4, "kv_block_table");
      ls = buf_new(c, (size_t)B * 4, "kv_seqlens");
      for (k = 0; k < B * mp; k++)
        if (rchance(&c->r, 0.5)) {
          int32_t g = rrange(&c->r, -2, a->B + 2);
          memcpy(tb->init + 4 * k, &g, 4);
        }
      for (k = 0; k < B; k++)
        if (rchance(&c->r, 0.5)) {
          int32_t g = rrange(&c->r, -5, 60);
          memcpy(ls->init + 4 * k, &g, 4);
        }
      d->paged.cache.block_table = tb->mem;
      d->paged.seqlens = ls->mem;
      if (a->varlen) d->varlen.cu_seqlens_k = NULL;
      if (rchance(&c->r, 0.15)) {
        clog_(c, "kv_seqlens NULL");
        d->paged.seqlens = NULL;
        c->must_fail = 1;
      }
      c->garbage_dev = 1;
      break;
    }
    case 15:
      clog_(c, "desc.algorithm.tuning of the decode family");
      d->algorithm.tuning = &g_decode_tuning;
      c->must_fail = 1;
      break;
    case 16: /* sinks: a short buffer, hostile values, or (backward) dsinks without sinks or over q */
    {
      fz_buf *b;
      const int w = rbelow(&c->r, bwd ? 4 : 2);
      if (w == 0) {
        b = buf_new(c, (size_t)a->Hq * 4 - 1, "sinks_short");
        clog_(c, "desc.score.sinks %d bytes", a->Hq * 4 - 1);
        d->score.sinks = b->mem;
        c->must_fail = 1;
      } else if (w == 1) {
        int h;
        b = buf_new(c, (size_t)a->Hq * 4, "sinks_hostile");
        for (h = 0; h < a->Hq; h++) {
          f = hostile_float(&c->r);
          memcpy(b->init + 4 * h, &f, 4);
        }
        clog_(c, "desc.score.sinks hostile values");
        d->score.sinks = b->mem;
        c->garbage_dev = 1;
      } else { /* only the backward call reads dsinks (the queries and the forward ignore it) */
        b = buf_new(c, (size_t)a->Hq * 4, "dsinks");
        d->backward.dsinks = b->mem;
        if (w == 2) {
          clog_(c, "desc.backward.dsinks without desc.score.sinks");
          d->score.sinks = NULL;
        } else {
          clog_(c, "desc.backward.dsinks = desc.score.sinks");
          d->score.sinks = b->mem;
        }
        if (c->entry && strcmp(c->entry, "flashcl_attention_backward") == 0) c->must_fail = 1;
        else c->garbage_dev = 1;
      }
      break;
    }
    case 17: { /* head_dim_v: 0 and v's head dim are the valid values */
      static const int hv[] = {-1, INT_MIN, 7, 16, 64, 1000, 0, 32};
      v = hv[rbelow(&c->r, 8)];
      clog_(c, "desc.shape.head_dim_v = %d", v);
      d->shape.head_dim_v = v;
      if (v != 0 && v != a->D) c->must_fail = 1;
      break;
    }
    default:
      v = pick_int(&c->r);
      clog_(c, "desc.backward.deterministic = %d, causal = %d", v != 0, v & 1);
      d->backward.deterministic = v != 0;
      d->mask.causal = v & 1;
      c->garbage_dev = 1; /* causal changed: no reference */
      break;
  }
}

/* Mutation of the call itself: NULL context / descriptor, wait lists. */
typedef struct callmut {
  flashcl_context *ctx;
  int null_desc;
  cl_uint nwait;
  const cl_event *wait;
  cl_event ev, *out_ev;
} callmut;

static cl_event g_user_event; /* a completed user event for wait lists */

static void callmut_init(fz_case *c, callmut *m) {
  memset(m, 0, sizeof *m);
  m->ctx = g_ctx;
  if (rchance(&c->r, 0.5)) m->out_ev = &m->ev;
  if (rchance(&c->r, 0.05) && g_user_event) m->nwait = 1, m->wait = &g_user_event;
}

static void callmut_mutate(fz_case *c, callmut *m, int has_wait) {
  int w = rbelow(&c->r, has_wait ? 4 : 2);
  c->mutated = 1;
  if (has_wait == 2 && w == 1) w = 2; /* no descriptor: flashcl_merge_states */
  if (!claim(c, "call%d", w >= 2 ? 2 : w)) return; /* one wait-list mutation */
  switch (w) {
    case 0:
      clog_(c, "ctx = NULL");
      m->ctx = NULL;
      c->must_fail = 1;
      break;
    case 1:
      clog_(c, "desc = NULL");
      m->null_desc = 1;
      c->must_fail = 1;
      break;
    case 2:
      clog_(c, "num_events_in_wait_list = 3, event_wait_list = NULL");
      m->nwait = 3, m->wait = NULL;
      c->must_fail = 1;
      break;
    default:
      clog_(c, "num_events_in_wait_list = 0 with a list");
      m->nwait = 0, m->wait = &g_user_event;
      break;
  }
}

/* Makes output `out` alias input `in` (same buffer and offset). */
static void alias(fz_case *c, fz_tensor *out, const fz_tensor *in, const char *on, const char *inn) {
  /* neither view's buffer or offset may move afterwards (nor before) */
  if (!claim(c, "%s.buffer0", on) || !claim(c, "%s.offset0", on) || !claim(c, "%s.buffer0", inn) ||
      !claim(c, "%s.offset0", inn))
    return;
  clog_(c, "%s aliases %s", on, inn);
  out->t.buffer = in->t.buffer;
  out->t.offset = in->t.offset;
  out->b = in->b;
  c->mutated = 1;
  c->must_fail = 1;
}

static void run_attention(fz_case *c, int entry) {
  attn a;
  callmut m;
  const int bwd = entry == E_BWD;
  const flashcl_tensor *q, *k, *v, *o, *lse, *d_o, *dq, *dk, *dv;
  flashcl_pass pass = (entry == E_BWD || ((entry == E_WS || entry == E_CFG || entry == E_KF) && rbelow(&c->r, 2)))
                          ? FLASHCL_PASS_BACKWARD
                          : FLASHCL_PASS_FORWARD;
  size_t ws_bytes = 0;
  flashcl_kernel_family fam = FLASHCL_KERNEL_AUTO;
  flashcl_config cfg;
  void *hostout = NULL;
  int st, nmut, i, has_lse = bwd || rchance(&c->r, 0.8), null_out = 0;

  attn_make(c, &a, bwd);
  if (pass == FLASHCL_PASS_BACKWARD) a.o.is_output = 0; /* the backward's input: overlapping rows are fine */
  for (i = 0; i < c->nbuf; i++) buf_upload(&c->buf[i]);
  if (bwd) { /* o and lse from a forward call: inputs of the backward */
    st = flashcl_attention_forward(g_ctx, &a.desc, &a.q.t, &a.k.t, &a.v.t, &a.o.t, &a.lse.t, 0, NULL, NULL);
    if (st != 0) {
      finding(c, "the valid forward that feeds the backward failed: %d (%s)", st, flashcl_status_string(st));
      return;
    }
    clFinish(g_queue);
    clEnqueueReadBuffer(g_queue, a.o.b->mem, CL_TRUE, 0, a.o.b->bytes, a.o.b->init, 0, NULL, NULL);
    clEnqueueReadBuffer(g_queue, a.lse.b->mem, CL_TRUE, 0, a.lse.b->bytes, a.lse.b->init, 0, NULL, NULL);
  }
  q = &a.q.t, k = &a.k.t, v = &a.v.t, o = &a.o.t, lse = has_lse ? &a.lse.t : NULL;
  d_o = &a.d_o.t, dq = &a.dq.t, dk = &a.dk.t, dv = &a.dv.t;
  callmut_init(c, &m);
  nmut = rchance(&c->r, 0.12) ? 0 : rrange(&c->r, 1, 3);
  for (i = 0; i < nmut; i++) {
    int what = rbelow(&c->r, 10);
    c->mutated = 1;
    if (what < 4) {
      fz_tensor *ts[9] = {&a.q, &a.k, &a.v, &a.o, &a.lse, &a.d_o, &a.dq, &a.dk, &a.dv};
      const flashcl_tensor **ps[9] = {&q, &k, &v, &o, &lse, &d_o, &dq, &dk, &dv};
      static const char *const nm[9] = {"q", "k", "v", "o", "lse", "dO", "dq", "dk", "dv"};
      /* only the tensors this entry point takes */
      int t = rbelow(&c->r, bwd ? 9 : entry == E_FWD ? 5 : entry == E_WS ? 3 : 4);
      if (t == 4 && !lse) t = 3; /* lse is not passed */
      /* lse is nullable in the forward, required in the backward */
      mutate_tensor(c, ts[t], ps[t], nm[t], t == 4 && !bwd);
    } else if (what < 8) {
      mutate_adesc(c, &a, bwd || pass == FLASHCL_PASS_BACKWARD);
    } else if (what == 8) {
      callmut_mutate(c, &m, entry == E_FWD || entry == E_BWD);
    } else if (entry == E_FWD) {
      if (rbelow(&c->r, 2)) alias(c, &a.o, rbelow(&c->r, 2) ? &a.q : &a.v, "o", "q or v");
      else if (lse) alias(c, &a.lse, &a.k, "lse", "k");
    } else if (entry == E_BWD) {
      int w = rbelow(&c->r, 3);
      alias(c, w == 0 ? &a.dq : w == 1 ? &a.dk : &a.dv, w == 0 ? &a.d_o : &a.k, "a gradient", "an input");
    } else {
      clog_(c, "output pointer NULL");
      null_out = 1;
      c->mutated = 1;
      c->must_fail = 1;
    }
  }
  /* desc.algorithm.kernel = NVIDIA_MMA fails where a flash kernel would run, and block
   * sizes no plan fits where one is planned (not by kernel_family or
   * workspace_size, which plan no tiles) */
  if (a.desc.algorithm.algo != FLASHCL_ALGO_NAIVE && (c->bad_kernel || (c->bad_blocks && entry != E_KF && entry != E_WS)))
    c->must_fail = 1;
  if (c->seqk_mut && (a.desc.paged.cache.block_table ? a.desc.varlen.max_seqlen_k < 0
                                            : a.varlen && (a.desc.varlen.max_seqlen_k < 1 || a.desc.varlen.max_seqlen_k > a.Nk)))
    c->must_fail = 1;
  upload_all(c);
  switch (entry) {
    case E_FWD:
      st = flashcl_attention_forward(m.ctx, m.null_desc ? NULL : &a.desc, q, k, v, o, lse, m.nwait, m.wait, m.out_ev);
      break;
    case E_BWD:
      st = flashcl_attention_backward(m.ctx, m.null_desc ? NULL : &a.desc, q, k, v, o, lse, d_o, dq, dk, dv, m.nwait,
                                      m.wait, m.out_ev);
      break;
    case E_WS:
      host_watch(c, &ws_bytes, sizeof ws_bytes, "bytes");
      hostout = &ws_bytes;
      st = flashcl_attention_workspace_size(m.ctx, m.null_desc ? NULL : &a.desc, q, k, v, pass,
                                            null_out ? NULL : &ws_bytes);
      break;
    case E_KF:
      host_watch(c, &fam, sizeof fam, "family");
      hostout = &fam;
      st = flashcl_attention_kernel_family(m.ctx, m.null_desc ? NULL : &a.desc, q, k, v, o, pass,
                                           null_out ? NULL : &fam);
      break;
    default:
      host_watch(c, &cfg, sizeof cfg, "config");
      hostout = &cfg;
      st = flashcl_attention_config(m.ctx, m.null_desc ? NULL : &a.desc, q, k, v, o, pass, null_out ? NULL : &cfg);
      break;
  }
  if (st == 0 && m.out_ev) wait_event(m.out_ev);
  if (st != 0 && m.out_ev && *m.out_ev) {
    finding(c, "failed call returned an event");
    wait_event(m.out_ev);
  }
  if (st == 0) {
    if (entry == E_FWD) {
      mark_view(c, o);
      if (lse) mark_view(c, lse);
    } else if (entry == E_BWD) {
      mark_view(c, dq), mark_view(c, dk), mark_view(c, dv);
    }
  }
  check_bytes(c, st);
  (void)hostout;
  if (judge(c, st, 1)) {
    if (entry == E_FWD) attn_check_forward(c, &a, has_lse);
    else if (entry == E_BWD) attn_check_backward(c, &a);
  }
  if (st == 0 && entry == E_KF && fam != FLASHCL_KERNEL_AUTO && fam != FLASHCL_KERNEL_PORTABLE &&
      !(g_has_mma && fam == FLASHCL_KERNEL_NVIDIA_MMA))
    finding(c, "kernel family %d on a device without tensor cores", (int)fam);
  /* The attention families: none (naive), fwd and bwd everywhere, the tensor-core ones
   * (mma_fwd, mma_bwd, wgmma_fwd) only where the device has them. */
  if (st == 0 && entry == E_CFG &&
      !(cfg.family == FLASHCL_TUNE_NONE || cfg.family == FLASHCL_TUNE_FWD || cfg.family == FLASHCL_TUNE_BWD ||
        (g_has_mma && (cfg.family == FLASHCL_TUNE_MMA_FWD || cfg.family == FLASHCL_TUNE_MMA_BWD ||
                       cfg.family == FLASHCL_TUNE_WGMMA_FWD))))
    finding(c, "config family %d", (int)cfg.family);
  if (st == 0 && entry == E_WS && ws_bytes > ((size_t)1 << 40)) finding(c, "workspace %zu bytes", ws_bytes);
}

/* --------------------------------------------------------------- decode -- */

typedef struct dec {
  flashcl_dtype dt;
  int B, T, Hq, Hkv, D, paged, ps, mp, num_pages, cap;
  int DV; /* v_cache / v_new / o head dim: D, or below it (MLA-like) */
  int32_t L[4], table[16];
  float alibi[8], sinks[8];
  flashcl_decode_desc desc;
  fz_tensor q, kc, vc, o, lse, kn, vn;
  fz_buf *seq, *tb, *ws;
  size_t ws_need; /* decode_workspace_size of the valid case */
  int call;       /* 1: flashcl_attention_decode (the workspace matters) */
  int ws_mut;     /* the caller's workspace made bad: 1 one byte short, 2 over q */
  flashcl_dtype fmt[2]; /* the K and V caches' storage: dt, or a quantized format */
  fz_buf *scale[2];     /* their fp32 scales (quantized sides) */
} dec;

static int is_kv_quant(flashcl_dtype t) {
  return t == FLASHCL_I8 || t == FLASHCL_F8E4M3 || t == FLASHCL_F8E5M2 || t == FLASHCL_I4X2;
}

/* A random code of fmt that is finite (no NaN or inf: the reference's values
 * must be numbers). */
static uint8_t finite_code(frng *r, flashcl_dtype fmt) {
  for (;;) {
    const uint8_t c = (uint8_t)rbelow(r, 256);
    if (isfinite(kvq_ref_decode(fmt, c))) return c;
  }
}

/* Makes side k (0: K, 1: V) of a decode cache quantized with probability p:
 * random finite codes and positive scales of a random kind, so that the
 * values stay within a few units. */
static void dec_quantize(fz_case *c, dec *d, int k, double p) {
  static const flashcl_dtype fmts[4] = {FLASHCL_I8, FLASHCL_F8E4M3, FLASHCL_F8E5M2, FLASHCL_I4X2};
  fz_tensor *t = k ? &d->vc : &d->kc;
  flashcl_decode_desc *ds = &d->desc;
  d->fmt[k] = d->dt;
  if (!rchance(&c->r, p)) return;
  const flashcl_dtype fmt = fmts[rbelow(&c->r, 4)];
  flashcl_kv_scale kind = (flashcl_kv_scale)rbelow(&c->r, 4);
  const int hd = k ? d->DV : d->D; /* this side's head dim */
  if (kind == FLASHCL_KV_SCALE_BLOCK32 && hd % 32) kind = FLASHCL_KV_SCALE_TOKEN; /* BLOCK32 needs d % 32 == 0 */
  const size_t rows = (size_t)(t->t.shape[0] * t->t.shape[1]);
  const size_t n = kind == FLASHCL_KV_SCALE_TOKEN     ? rows * (size_t)d->Hkv
                   : kind == FLASHCL_KV_SCALE_BLOCK32 ? rows * (size_t)d->Hkv * (size_t)(hd / 32)
                   : kind == FLASHCL_KV_SCALE_HEAD    ? (size_t)d->Hkv
                                                      : 1;
  int64_t b, j, h, x;
  /* int4: a row is hd / 2 bytes of two codes each (every nibble is finite) */
  tensor_make(c, t, fmt, t->t.shape[0], t->t.shape[1], d->Hkv, (int)kvq_ref_row_bytes(fmt, (size_t)hd), 0,
              k ? "v_cache_q" : "k_cache_q");
  for (b = 0; b < t->t.shape[0]; b++)
    for (j = 0; j < t->t.shape[1]; j++)
      for (h = 0; h < d->Hkv; h++)
        for (x = 0; x < t->t.shape[3]; x++) t->b->init[tidx(&t->t, b, j, h, x)] = finite_code(&c->r, fmt);
  d->scale[k] = buf_new(c, n * 4, k ? "v_scale" : "k_scale");
  for (size_t i = 0; i < n; i++) {
    const float f = (float)((0.5 + runif(&c->r)) * 2.0 / kvq_ref_qmax(fmt));
    memcpy(d->scale[k]->init + 4 * i, &f, 4);
  }
  d->fmt[k] = fmt;
  if (k) ds->cache.v_scale = d->scale[k]->mem, ds->cache.v_scale_kind = kind;
  else ds->cache.k_scale = d->scale[k]->mem, ds->cache.k_scale_kind = kind;
}

/* The value the decode reads at (bb, nn, h, x) of side k. */
static double dec_value(const dec *d, int k, int64_t bb, int64_t nn, int64_t h, int64_t x) {
  const fz_tensor *t = k ? &d->vc : &d->kc;
  if (!is_kv_quant(d->fmt[k])) return fct_load(d->dt, t->b->init, tidx(&t->t, bb, nn, h, x));
  const flashcl_kv_scale kind = k ? d->desc.cache.v_scale_kind : d->desc.cache.k_scale_kind;
  const size_t row = (size_t)(bb * t->t.shape[1] + nn) * (size_t)d->Hkv + (size_t)h;
  const size_t si = kind == FLASHCL_KV_SCALE_TOKEN     ? row
                    : kind == FLASHCL_KV_SCALE_BLOCK32 ? row * (size_t)((k ? d->DV : d->D) / 32) + (size_t)x / 32
                    : kind == FLASHCL_KV_SCALE_HEAD    ? (size_t)h
                                                       : 0;
  float sc;
  memcpy(&sc, d->scale[k]->init + 4 * si, 4);
  const uint8_t code = kvq_ref_get(d->fmt[k], t->b->init + tidx(&t->t, bb, nn, h, 0), (size_t)x);
  return (double)(kvq_ref_decode(d->fmt[k], code) * sc);
}

static void dec_make(fz_case *c, dec *d, int append) {
  flashcl_decode_desc *ds = &d->desc;
  int b, i;
  memset(d, 0, sizeof *d);
  flashcl_decode_desc_init(ds);
  d->dt = DTYPES[rbelow(&c->r, 3)];
  d->D = 32;
  d->DV = rchance(&c->r, 0.3) ? 8 * rrange(&c->r, 1, 3) : d->D;
  d->Hkv = rrange(&c->r, 1, 2);
  d->Hq = d->Hkv * (1 << rbelow(&c->r, 3));
  d->B = rrange(&c->r, 1, 3);
  d->T = rrange(&c->r, 1, 4);
  d->paged = rbelow(&c->r, 2);
  if (d->paged) {
    d->ps = rbelow(&c->r, 2) ? 4 : 8;
    d->mp = rrange(&c->r, 1, 3);
    d->num_pages = d->B * d->mp + rbelow(&c->r, 2);
    d->cap = d->ps * d->mp;
    for (i = 0; i < d->num_pages; i++) d->table[i] = i; /* a random permutation: distinct pages */
    for (i = d->num_pages - 1; i > 0; i--) {
      int j = rbelow(&c->r, i + 1), t = d->table[i];
      d->table[i] = d->table[j], d->table[j] = t;
    }
    d->tb = buf_new(c, (size_t)d->B * d->mp * 4, "block_table");
    memcpy(d->tb->init, d->table, (size_t)d->B * d->mp * 4);
    ds->cache.page_size = d->ps, ds->cache.max_pages = d->mp, ds->cache.block_table = d->tb->mem;
    tensor_make(c, &d->kc, d->dt, d->num_pages, d->ps, d->Hkv, d->D, append, "k_cache");
    tensor_make(c, &d->vc, d->dt, d->num_pages, d->ps, d->Hkv, d->DV, append, "v_cache");
  } else {
    d->cap = rrange(&c->r, 1, 24);
    tensor_make(c, &d->kc, d->dt, d->B, d->cap, d->Hkv, d->D, append, "k_cache");
    tensor_make(c, &d->vc, d->dt, d->B, d->cap, d->Hkv, d->DV, append, "v_cache");
  }
  if (append) { /* the append writes only its tokens: caches start with values */
    fz_tensor *cs[2] = {&d->kc, &d->vc};
    int64_t x, n, h, k;
    for (k = 0; k < 2; k++)
      for (b = 0; b < cs[k]->t.shape[0]; b++)
        for (n = 0; n < cs[k]->t.shape[1]; n++)
          for (h = 0; h < d->Hkv; h++)
            for (x = 0; x < cs[k]->t.shape[3]; x++)
              fct_store(d->dt, cs[k]->b->init, tidx(&cs[k]->t, b, n, h, x), rand_val(&c->r));
  }
  d->seq = buf_new(c, (size_t)d->B * 4, append ? "seqlens" : "seqlens_k");
  for (b = 0; b < d->B; b++) {
    d->L[b] = append ? rrange(&c->r, 0, d->cap > d->T ? d->cap - d->T : 0) : rrange(&c->r, 0, d->cap);
    memcpy(d->seq->init + 4 * b, &d->L[b], 4);
  }
  if (append) {
    tensor_make(c, &d->kn, d->dt, d->B, d->T, d->Hkv, d->D, 0, "k_new");
    tensor_make(c, &d->vn, d->dt, d->B, d->T, d->Hkv, d->DV, 0, "v_new");
    return;
  }
  tensor_make(c, &d->q, d->dt, d->B, d->T, d->Hq, d->D, 0, "q");
  tensor_make(c, &d->o, d->dt, d->B, d->T, d->Hq, d->DV, 1, "o");
  lse_make(c, &d->lse, d->B, d->T, d->Hq, 1, "lse");
  ds->split.num_splits = rbelow(&c->r, 4);
  if (rchance(&c->r, 0.3)) ds->split.max_seqlen_k = rrange(&c->r, 1, d->cap);
  if (rchance(&c->r, 0.5)) ds->score.scale = (float)(0.05 + 0.3 * runif(&c->r));
  if (rchance(&c->r, 0.2)) ds->score.window_left = rrange(&c->r, -1, 6), ds->score.window_right = rrange(&c->r, -1, 3);
  if (rchance(&c->r, 0.15)) ds->score.softcap = (float)(5.0 + 30.0 * runif(&c->r));
  if (rchance(&c->r, 0.15)) {
    fz_buf *ab = buf_new(c, (size_t)d->Hq * 4, "alibi_slopes");
    for (i = 0; i < d->Hq; i++) {
      d->alibi[i] = (float)(0.5 * runif(&c->r));
      memcpy(ab->init + 4 * i, &d->alibi[i], 4);
    }
    ds->score.alibi_slopes = ab->mem;
  }
  if (rchance(&c->r, 0.12)) {
    fz_buf *sb = buf_new(c, (size_t)d->Hq * 4, "sinks");
    for (i = 0; i < d->Hq; i++) {
      d->sinks[i] = (float)(3.0 * runif(&c->r) - 1.0);
      memcpy(sb->init + 4 * i, &d->sinks[i], 4);
    }
    ds->score.sinks = sb->mem;
  }
  /* One side at most: a plain side pins q's dtype, which decode_config and
   * decode_workspace_size (no o) would otherwise not check. Both sides
   * quantized is test_decode_quant's. */
  dec_quantize(c, d, 0, 0.15);
  dec_quantize(c, d, 1, d->fmt[0] == d->dt ? 0.15 : 0.0);
}

/* Index of the cache row holding token j of sequence b. */
static void dec_slot(const dec *d, int b, int j, int64_t *bb, int64_t *nn) {
  if (d->paged) *bb = d->table[b * d->mp + j / d->ps], *nn = j % d->ps;
  else *bb = b, *nn = j;
}

static void dec_check(fz_case *c, dec *d, int has_lse) {
  const size_t no = (size_t)d->B * d->T * d->Hq;
  double *ro = calloc(no * d->DV, sizeof(double)), *rl = malloc(no * sizeof(double));
  int b, j, h, x;
  for (b = 0; b < d->B; b++) {
    const int L = d->L[b];
    ref_attention_params p;
    ref_masks m;
    ref_tensor q = tref(&d->q), k, v;
    ref_out oo, ol;
    double *kd, *vd;
    if (L == 0) { /* no key: O = 0, and LSE = the sink, else -inf */
      for (j = 0; j < d->T * d->Hq; j++)
        rl[(size_t)b * d->T * d->Hq + j] = d->desc.score.sinks ? (double)d->sinks[j % d->Hq] : -INFINITY;
      continue;
    }
    kd = malloc((size_t)L * d->Hkv * d->D * sizeof(double));
    vd = malloc((size_t)L * d->Hkv * d->DV * sizeof(double));
    for (j = 0; j < L; j++) {
      int64_t bb, nn;
      dec_slot(d, b, j, &bb, &nn);
      for (h = 0; h < d->Hkv; h++) {
        for (x = 0; x < d->D; x++) kd[((size_t)j * d->Hkv + h) * d->D + x] = dec_value(d, 0, bb, nn, h, x);
        for (x = 0; x < d->DV; x++) vd[((size_t)j * d->Hkv + h) * d->DV + x] = dec_value(d, 1, bb, nn, h, x);
      }
    }
    k = ref_tensor_bnhd(kd, 1, L, d->Hkv, d->D);
    v = ref_tensor_bnhd(vd, 1, L, d->Hkv, d->DV);
    q.shape[0] = 1;
    q.offset += b * q.stride[0];
    oo = ref_out_bnhd(ro + (size_t)b * d->T * d->Hq * d->DV, 1, d->T, d->Hq, d->DV);
    ol = ref_out_bnhd(rl + (size_t)b * d->T * d->Hq, 1, d->T, d->Hq, 1);
    memset(&p, 0, sizeof p);
    memset(&m, 0, sizeof m);
    p.scale = d->desc.score.scale;
    p.causal = 1;
    m.window_left = d->desc.score.window_left, m.window_right = d->desc.score.window_right;
    m.alibi = d->desc.score.alibi_slopes ? d->alibi : NULL;
    m.sinks = d->desc.score.sinks ? d->sinks : NULL;
    m.softcap = d->desc.score.softcap;
    if (ref_masks_forward(&p, &m, NULL, &q, &k, &v, &oo, &ol) != 0) finding(c, "decode reference refused (harness bug)");
    free(kd);
    free(vd);
  }
  check_o_lse(c, &d->o, has_lse ? &d->lse : NULL, ro, rl, d->B, d->T, d->Hq, d->DV, d->dt, "decode");
  free(ro);
  free(rl);
}

/* After a successful append with valid lengths and table: every new token is in
 * its slot, bit for bit (the rest is checked by check_bytes). */
static void append_check(fz_case *c, dec *d) {
  long bad = 0;
  int b, t, h, x, k;
  for (k = 0; k < 2; k++) {
    fz_tensor *cache = k ? &d->vc : &d->kc, *src = k ? &d->vn : &d->kn;
    const size_t es = dsize(d->dt);
    for (b = 0; b < d->B; b++)
      for (t = 0; t < d->T; t++) {
        const int pos = d->L[b] + t;
        int64_t bb, nn;
        if (pos < 0 || pos >= d->cap) continue;
        dec_slot(d, b, pos, &bb, &nn);
        for (h = 0; h < d->Hkv; h++)
          for (x = 0; x < cache->t.shape[3]; x++)
            bad += memcmp(cache->b->cur + tidx(&cache->t, bb, nn, h, x) * es,
                          src->b->init + tidx(&src->t, b, t, h, x) * es, es) != 0;
      }
  }
  g_stats.checked++;
  if (bad) finding(c, "kv_cache_append: %ld element(s) not copied into their slots", bad);
}

/* A quantized cache's scales made bad (14: NULL, 15: one float short, 16: an
 * invalid kind); a plain side ignores its scale fields. */
static void mutate_kv_scale(fz_case *c, dec *d, int kind) {
  flashcl_decode_desc *ds = &d->desc;
  const int k = rbelow(&c->r, 2);
  cl_mem *buf = k ? &ds->cache.v_scale : &ds->cache.k_scale;
  flashcl_kv_scale *sk = k ? &ds->cache.v_scale_kind : &ds->cache.k_scale_kind;
  const int quant = is_kv_quant(d->fmt[k]);
  if (kind == 14) {
    clog_(c, "desc.cache.%s_scale = NULL", k ? "v" : "k");
    *buf = NULL;
  } else if (kind == 15) {
    const size_t bytes = d->scale[k] ? d->scale[k]->bytes : 8;
    fz_buf *b = buf_new(c, bytes - (bytes > 4 && rbelow(&c->r, 2) ? 4 : 1), "scale_short");
    clog_(c, "desc.cache.%s_scale %zu bytes short", k ? "v" : "k", bytes - b->bytes);
    *buf = b->mem;
    *sk = d->scale[k] ? *sk : FLASHCL_KV_SCALE_TENSOR;
  } else {
    static const int bad[] = {4, -1, 99, INT_MAX};
    const int v = bad[rbelow(&c->r, 4)];
    clog_(c, "desc.cache.%s_scale_kind = %d", k ? "v" : "k", v);
    *sk = (flashcl_kv_scale)v;
  }
  if (quant) c->must_fail = 1;
}

/* The append's descriptor: the decode descriptor's cache, and its
 * struct_size mutation carried over (the decode struct's own size stands for
 * "as *_init set it", one more for "a newer header's"). */
static size_t append_struct_size(size_t decode_size) {
  if (decode_size == sizeof(flashcl_decode_desc)) return sizeof(flashcl_kv_append_desc);
  if (decode_size == sizeof(flashcl_decode_desc) + 1) return sizeof(flashcl_kv_append_desc) + 1;
  return decode_size;
}

static flashcl_kv_append_desc append_desc_of(const flashcl_decode_desc *ds) {
  flashcl_kv_append_desc ad = fct_append_desc(ds);
  ad.struct_size = append_struct_size(ds->struct_size);
  return ad;
}

static void mutate_ddesc(fz_case *c, dec *d, int append) {
  flashcl_decode_desc *ds = &d->desc;
  int v;
  float f;
  /* The append's descriptor holds the cache layout only: its struct size,
   * page table and scales (kinds 0-4, 14-16). */
  const int draw = rbelow(&c->r, append ? 8 : 17);
  const int kind = append && draw >= 5 ? draw + 9 : draw;
  c->mutated = 1;
  if (!claim(c, "ddesc%d", kind)) return;
  if (kind >= 14) {
    mutate_kv_scale(c, d, kind);
    return;
  }
  switch (kind) {
    case 0: {
      static const size_t sz[] = {1, 7, sizeof(flashcl_decode_desc) + 1, SIZE_MAX, 0};
      size_t z = sz[rbelow(&c->r, 5)];
      clog_(c, "desc.struct_size = %zu", append ? append_struct_size(z) : z);
      ds->struct_size = z;
      if (z) c->must_fail = 1;
      break;
    }
    case 1:
      v = pick_int(&c->r);
      clog_(c, "desc.cache.page_size = %d", v);
      if (v != ds->cache.page_size) c->must_fail = 1;
      if (!d->paged && v == 0 && !strstr(c->log, "page_size = ")) {} /* 0: contiguous, valid */
      ds->cache.page_size = v;
      break;
    case 2:
      v = pick_int(&c->r);
      clog_(c, "desc.cache.max_pages = %d", v);
      if (d->paged && (v < 1 || v > d->mp)) c->must_fail = 1;     /* invalid, or the table is short */
      if (!d->paged && v != 0) c->garbage_dev = 1;                /* may be refused or ignored */
      ds->cache.max_pages = v;
      break;
    case 3:
      clog_(c, "desc.cache.block_table = %s", d->paged ? "NULL" : "a buffer");
      if (d->paged) {
        ds->cache.block_table = NULL;
        c->must_fail = 1;
      } else {
        ds->cache.block_table = d->seq->mem;
        c->must_fail = 1; /* page_size 0 with a table */
      }
      break;
    case 4: /* garbage lengths or table: clamped on the device */
    {
      fz_buf *b = (d->paged && rbelow(&c->r, 2)) ? d->tb : d->seq;
      size_t k;
      for (k = 0; k + 4 <= b->bytes; k += 4) {
        int32_t g = rbelow(&c->r, 3) ? (int32_t)r64(&c->r) : rrange(&c->r, -4, 40);
        if (rchance(&c->r, 0.1)) g = rbelow(&c->r, 2) ? INT32_MAX : INT32_MIN;
        memcpy(b->init + k, &g, 4);
      }
      clog_(c, "garbage %s", b->name);
      c->garbage_dev = 1;
      break;
    }
    case 5:
      v = pick_int(&c->r);
      clog_(c, "desc.heads_q = %d", v);
      ds->heads_q = v;
      if (v != 0 && v != d->Hq) c->must_fail = 1;
      break;
    case 6: {
      static const int ns[] = {-1, 257, INT_MAX, INT_MIN, 256, 1};
      v = ns[rbelow(&c->r, 6)];
      clog_(c, "desc.split.num_splits = %d", v);
      ds->split.num_splits = v;
      if (v < 0 || v > FLASHCL_DECODE_MAX_SPLITS) c->must_fail = 1;
      break;
    }
    case 7:
      v = pick_int(&c->r);
      clog_(c, "desc.split.max_seqlen_k = %d", v);
      ds->split.max_seqlen_k = v;
      if (v < 0) c->must_fail = 1;
      break;
    case 8: {
      const int left = rbelow(&c->r, 2);
      v = pick_int(&c->r);
      clog_(c, "desc.score.window_%s = %d", left ? "left" : "right", v);
      if (left) ds->score.window_left = v;
      else ds->score.window_right = v;
      if (v < -1) c->must_fail = 1;
      break;
    }
    case 9:
      f = hostile_float(&c->r);
      clog_(c, "desc.%s = %g", rbelow(&c->r, 2) ? "softcap" : "scale", (double)f);
      if (strstr(c->log, "softcap = ")) {
        ds->score.softcap = f;
        if (!(f == 0.0f || (isfinite(f) && f > 0.0f))) c->must_fail = 1;
      } else {
        ds->score.scale = f;
      }
      break;
    case 10: {
      fz_buf *b = buf_new(c, (size_t)d->Hq * 4 - 1, "alibi_short");
      clog_(c, "desc.score.alibi_slopes one byte short");
      ds->score.alibi_slopes = b->mem;
      c->must_fail = 1;
      break;
    }
    case 11: {
      const int short_ = rbelow(&c->r, 2);
      fz_buf *b = buf_new(c, (size_t)d->B * d->T * 4 - (short_ ? 1 : 0), "tree_mask");
      clog_(c, "desc.tree_mask %s", short_ ? "one byte short" : "garbage");
      ds->tree_mask = b->mem;
      if (short_) c->must_fail = 1;
      c->garbage_dev = 1;
      break;
    }
    case 12: {
      static const int kf[] = {-1, 3, FLASHCL_KERNEL_NVIDIA_MMA, FLASHCL_KERNEL_PORTABLE};
      v = kf[rbelow(&c->r, 4)];
      clog_(c, "desc.kernel = %d", v);
      ds->kernel = (flashcl_kernel_family)v;
      if (v < 0 || v > 2 || (v == 2 && !g_has_mma)) c->must_fail = 1;
      break;
    }
    default: /* 13: the caller's workspace: one byte short, or over q */
    {
      const size_t need = d->ws_need;
      if (need == 0 || !d->call) {
        clog_(c, "workspace: none needed, or not read by this entry point");
        break;
      }
      if (rbelow(&c->r, 2)) {
        fz_buf *b = buf_new(c, need + 63, "workspace");
        ds->split.workspace = b->mem;
        ds->split.workspace_offset = 64;
        clog_(c, "workspace one byte short (%zu of %zu)", need - 1, need);
        d->ws_mut = 1;
      } else {
        ds->split.workspace = d->q.t.buffer;
        ds->split.workspace_offset = d->q.t.offset;
        clog_(c, "workspace over q");
        d->ws_mut = 2;
      }
      break; /* whether the call must fail depends on the final descriptor (ws_judge) */
    }
  }
}

/* A bad caller's workspace fails the call only if the final descriptor still
 * splits (num_splits = 1, or fewer keys, may need less or none: the library
 * then never reads it): judged on what decode_workspace_size says of it. */
static void ws_judge(fz_case *c, const dec *d, const flashcl_tensor *q, const flashcl_tensor *kc,
                     const flashcl_tensor *vc) {
  size_t need = 0;
  int nsplit = 0;
  if (!d->ws_mut) return;
  if (flashcl_attention_decode_workspace_size(g_ctx, &d->desc, q, kc, vc, &need, &nsplit) != 0) {
    c->must_fail = 1; /* invalid anyway */
    return;
  }
  if (d->ws_mut == 1 ? need > d->ws_need - 1 : need > 0) c->must_fail = 1;
  else clog_(c, "(the final descriptor needs %zu workspace bytes: the bad workspace is never read)", need);
}

static void run_decode(fz_case *c, int entry) {
  dec d;
  callmut m;
  const flashcl_tensor *q, *kc, *vc, *o, *lse;
  size_t ws = 0;
  int nsplit = 0, st, i, nmut, has_lse = rchance(&c->r, 0.8), null_out = 0;
  cl_mem seq;
  flashcl_config cfg;
  dec_make(c, &d, 0);
  q = &d.q.t, kc = &d.kc.t, vc = &d.vc.t, o = &d.o.t, lse = has_lse ? &d.lse.t : NULL;
  seq = d.seq->mem;
  d.call = entry == E_DEC;
  for (i = 0; i < c->nbuf; i++) buf_upload(&c->buf[i]);
  if (flashcl_attention_decode_workspace_size(g_ctx, &d.desc, q, kc, vc, &d.ws_need, &nsplit) != 0)
    finding(c, "decode_workspace_size failed on a valid case");
  callmut_init(c, &m);
  if (entry == E_DEC && rchance(&c->r, 0.3)) { /* the caller's workspace */
    if (flashcl_attention_decode_workspace_size(g_ctx, &d.desc, q, kc, vc, &ws, &nsplit) != 0)
      finding(c, "decode_workspace_size failed on a valid case");
    else if (ws) {
      fz_buf *b = buf_new(c, ws + 32, "workspace");
      memset(b->mayw, 1, b->bytes); /* scratch: anything may be written */
      d.desc.split.workspace = b->mem;
      d.desc.split.workspace_offset = 32;
    }
  }
  /* The one-launch merge where the plan splits on the context's scratch and
   * the device runs it (the config query says so before any mutation). */
  if (entry == E_DEC && !d.desc.split.workspace && nsplit > 1 && rchance(&c->r, 0.3)) {
    d.desc.tuning = &g_merge1_tuning;
    if (flashcl_decode_config(g_ctx, &d.desc, q, kc, vc, &cfg) != 0) d.desc.tuning = NULL;
    else clog_(c, "desc.tuning merge=1");
  }
  nmut = rchance(&c->r, 0.12) ? 0 : rrange(&c->r, 1, 3);
  for (i = 0; i < nmut; i++) {
    int what = rbelow(&c->r, 10);
    c->mutated = 1;
    if (what < 4) {
      fz_tensor *ts[5] = {&d.q, &d.kc, &d.vc, &d.o, &d.lse};
      const flashcl_tensor **ps[5] = {&q, &kc, &vc, &o, &lse};
      static const char *const nm[5] = {"q", "k_cache", "v_cache", "o", "lse"};
      int t = rbelow(&c->r, entry == E_DEC ? 5 : 3);
      if (t == 4 && !lse) t = 3; /* lse is not passed */
      mutate_tensor(c, ts[t], ps[t], nm[t], t == 4);
    } else if (what < 8) {
      mutate_ddesc(c, &d, 0);
    } else if (what == 8) {
      callmut_mutate(c, &m, entry == E_DEC);
    } else if (entry == E_DEC) {
      switch (rbelow(&c->r, 4)) {
        case 0:
          clog_(c, "seqlens_k = NULL");
          seq = NULL;
          c->must_fail = 1;
          break;
        case 1:
          seq = buf_new(c, (size_t)d.B * 4 - 1, "seqlens_short")->mem;
          clog_(c, "seqlens_k one byte short");
          c->must_fail = 1;
          break;
        case 2:
          alias(c, &d.o, &d.q, "o", "q");
          break;
        default:
          clog_(c, "q_len = 17");
          d.q.t.shape[1] = 17;
          d.o.t.shape[1] = 17;
          c->must_fail = 1;
          c->mutated = 1;
          break;
      }
    } else {
      clog_(c, "output pointer NULL");
      null_out = 1;
      c->mutated = 1;
      c->must_fail = 1; /* bytes / config (num_splits is the nullable one) */
    }
  }
  ws_judge(c, &d, q, kc, vc);
  upload_all(c);
  if (entry == E_DEC) {
    st = flashcl_attention_decode(m.ctx, m.null_desc ? NULL : &d.desc, q, kc, vc, seq, o, lse, m.nwait, m.wait,
                                  m.out_ev);
  } else if (entry == E_DEC_WS) {
    host_watch(c, &ws, sizeof ws, "bytes");
    host_watch(c, &nsplit, sizeof nsplit, "num_splits");
    st = flashcl_attention_decode_workspace_size(m.ctx, m.null_desc ? NULL : &d.desc, q, kc, vc,
                                                 null_out ? NULL : &ws, &nsplit);
  } else {
    host_watch(c, &cfg, sizeof cfg, "config");
    st = flashcl_decode_config(m.ctx, m.null_desc ? NULL : &d.desc, q, kc, vc, null_out ? NULL : &cfg);
  }
  if (st == 0 && m.out_ev) wait_event(m.out_ev);
  if (st != 0 && m.out_ev && *m.out_ev) {
    finding(c, "failed call returned an event");
    wait_event(m.out_ev);
  }
  if (st == 0 && entry == E_DEC) {
    mark_view(c, o);
    if (lse) mark_view(c, lse);
  }
  check_bytes(c, st);
  if (judge(c, st, entry == E_DEC)) dec_check(c, &d, has_lse);
  if (st == 0 && entry == E_DEC_WS && (nsplit < 0 || nsplit > FLASHCL_DECODE_MAX_SPLITS || ws > ((size_t)1 << 40)))
    finding(c, "decode workspace %zu bytes, %d splits", ws, nsplit);
  if (st == 0 && entry == E_DEC_CFG && cfg.family != FLASHCL_TUNE_DECODE) finding(c, "decode config family %d", cfg.family);
}

static void run_append(fz_case *c) {
  dec d;
  callmut m;
  const flashcl_tensor *kn, *vn, *kc, *vc;
  cl_mem seq;
  int st, i, nmut;
  dec_make(c, &d, 1);
  kn = &d.kn.t, vn = &d.vn.t, kc = &d.kc.t, vc = &d.vc.t;
  seq = d.seq->mem;
  d.kc.is_output = d.vc.is_output = 1;
  callmut_init(c, &m);
  nmut = rchance(&c->r, 0.12) ? 0 : rrange(&c->r, 1, 3);
  for (i = 0; i < nmut; i++) {
    int what = rbelow(&c->r, 10);
    c->mutated = 1;
    if (what < 5) {
      fz_tensor *ts[4] = {&d.kn, &d.vn, &d.kc, &d.vc};
      const flashcl_tensor **ps[4] = {&kn, &vn, &kc, &vc};
      static const char *const nm[4] = {"k_new", "v_new", "k_cache", "v_cache"};
      int t = rbelow(&c->r, 4);
      mutate_tensor(c, ts[t], ps[t], nm[t], 0);
    } else if (what < 8) {
      mutate_ddesc(c, &d, 1);
    } else if (what == 8) {
      callmut_mutate(c, &m, 1);
    } else {
      switch (rbelow(&c->r, 3)) {
        case 0:
          clog_(c, "seqlens = NULL");
          seq = NULL;
          c->must_fail = 1;
          break;
        case 1:
          alias(c, &d.vc, &d.kc, "v_cache", "k_cache");
          break;
        default:
          alias(c, &d.kc, &d.kn, "k_cache", "k_new");
          break;
      }
    }
  }
  upload_all(c);
  const flashcl_kv_append_desc ad = append_desc_of(&d.desc);
  st = flashcl_kv_cache_append(m.ctx, m.null_desc ? NULL : &ad, kn, vn, kc, vc, seq, m.nwait, m.wait, m.out_ev);
  if (st == 0 && m.out_ev) wait_event(m.out_ev);
  if (st != 0 && m.out_ev && *m.out_ev) {
    finding(c, "failed call returned an event");
    wait_event(m.out_ev);
  }
  if (st == 0) mark_view(c, kc), mark_view(c, vc);
  check_bytes(c, st);
  if (judge(c, st, 1)) append_check(c, &d);
}

/* ---------------------------------------------------------------- merge -- */

static void run_merge(fz_case *c) {
  const flashcl_dtype dt = DTYPES[rbelow(&c->r, 3)];
  const int B = rrange(&c->r, 1, 2), N = rrange(&c->r, 1, 5), H = rrange(&c->r, 1, 3), D = 8 * rrange(&c->r, 1, 4);
  fz_tensor oa, ob, o, la, lb, l;
  const flashcl_tensor *poa = &oa.t, *pob = &ob.t, *po = &o.t, *pla = &la.t, *plb = &lb.t, *pl;
  callmut m;
  int st, i, nmut, inplace = rbelow(&c->r, 4);
  tensor_make(c, &oa, dt, B, N, H, D, 0, "o_a");
  tensor_make(c, &ob, dt, B, N, H, D, 0, "o_b");
  lse_make(c, &la, B, N, H, 0, "lse_a");
  lse_make(c, &lb, B, N, H, 0, "lse_b");
  { /* LSE in [-3, 3], sometimes -inf */
    int64_t b, n, h;
    fz_tensor *ls[2] = {&la, &lb};
    for (i = 0; i < 2; i++)
      for (b = 0; b < B; b++)
        for (n = 0; n < N; n++)
          for (h = 0; h < H; h++)
            fct_store(FLASHCL_F32, ls[i]->b->init, tidx(&ls[i]->t, b, n, h, 0),
                      rchance(&c->r, 0.1) ? -INFINITY : (float)(6.0 * runif(&c->r) - 3.0));
  }
  if (inplace == 1) o = oa, l = la, o.is_output = l.is_output = 1;  /* in place into a */
  else {
    tensor_make(c, &o, dt, B, N, H, D, 1, "o");
    lse_make(c, &l, B, N, H, 1, "lse");
  }
  po = &o.t;
  pl = rchance(&c->r, 0.8) ? &l.t : NULL;
  callmut_init(c, &m);
  nmut = rchance(&c->r, 0.15) ? 0 : rrange(&c->r, 1, 3);
  for (i = 0; i < nmut; i++) {
    int what = rbelow(&c->r, 8);
    c->mutated = 1;
    if (what < 5) {
      fz_tensor *ts[6] = {&oa, &la, &ob, &lb, &o, &l};
      const flashcl_tensor **ps[6] = {&poa, &pla, &pob, &plb, &po, &pl};
      static const char *const nm[6] = {"o_a", "lse_a", "o_b", "lse_b", "o", "lse"};
      int t = rbelow(&c->r, 6);
      if (inplace == 1 && (t == 0 || t == 1)) t += 4; /* keep the aliases exact */
      if (t == 5 && !pl) t = 4;                        /* lse is not passed */
      mutate_tensor(c, ts[t], ps[t], nm[t], t == 5);
    } else if (what == 5) {
      callmut_mutate(c, &m, 2);
    } else if (inplace != 1) {
      /* o over o_b at another offset: a partial overlap. Neither view's buffer
       * or offset may move afterwards: o_b.offset + one element could then be
       * o_b itself, the in-place merge (seed 20261126, case 658935). */
      if (!claim(c, "o.buffer0") || !claim(c, "o.offset0") || !claim(c, "o_b.buffer0") || !claim(c, "o_b.offset0"))
        continue;
      clog_(c, "o overlaps o_b (offset + one element)");
      o.t.buffer = ob.t.buffer;
      o.t.offset = ob.t.offset + dsize(dt);
      o.b = ob.b;
      c->mutated = c->must_fail = 1;
    }
  }
  upload_all(c);
  st = flashcl_merge_states(m.ctx, poa, pla, pob, plb, po, pl, m.nwait, m.wait, m.out_ev);
  if (st == 0 && m.out_ev) wait_event(m.out_ev);
  if (st != 0 && m.out_ev && *m.out_ev) {
    finding(c, "failed call returned an event");
    wait_event(m.out_ev);
  }
  if (st == 0) {
    mark_view(c, po);
    if (pl) mark_view(c, pl);
  }
  check_bytes(c, st);
  if (judge(c, st, 1)) {
    l2 eo = {0, 0, 0}, el = {0, 0, 0};
    int64_t b, n, h, x;
    long finite = 0;
    for (b = 0; b < B; b++)
      for (n = 0; n < N; n++)
        for (h = 0; h < H; h++) {
          const double a_ = fct_load(FLASHCL_F32, la.b->init, tidx(&la.t, b, n, h, 0)),
                       b_ = fct_load(FLASHCL_F32, lb.b->init, tidx(&lb.t, b, n, h, 0));
          const double mx = a_ > b_ ? a_ : b_;
          const double wa = isinf(a_) ? 0 : exp(a_ - mx), wb = isinf(b_) ? 0 : exp(b_ - mx);
          for (x = 0; x < D; x++) {
            const double va = fct_load(dt, oa.b->init, tidx(&oa.t, b, n, h, x)),
                         vb = fct_load(dt, ob.b->init, tidx(&ob.t, b, n, h, x));
            l2_add(&eo, tget(o.b, &o.t, b, n, h, x), wa + wb > 0 ? (wa * va + wb * vb) / (wa + wb) : 0.0);
          }
          if (pl) l2_add(&el, tget(l.b, &l.t, b, n, h, 0), wa + wb > 0 ? mx + log(wa + wb) : -INFINITY);
          finite += wa + wb > 0;
        }
    l2_check(c, &eo, tol_of(dt), "merge O");
    /* An LSE's error is absolute in kind (it scales the weights by exp(error)),
     * so it is measured against max(|LSE|, 1): a merged LSE near 0 (lse_a = lse_b
     * = -ln 2) would otherwise fail on fp32's rounding of log and exp alone
     * (seed 20261126, case 174296: 2.2e-5). */
    if (el.den < (double)finite) el.den = (double)finite;
    if (pl) l2_check(c, &el, 1e-5, "merge LSE");
  }
}

/* --------------------------------------------------------- dropout mask -- */

static void run_dropout_mask(fz_case *c) {
  flashcl_attention_desc desc;
  callmut m;
  int B = rrange(&c->r, 1, 2), H = rrange(&c->r, 1, 3), Nq = rrange(&c->r, 1, 20), Nk = rrange(&c->r, 1, 40);
  int st, i, nmut;
  size_t need;
  fz_buf *mb;
  cl_mem mem;
  flashcl_attention_desc_init(&desc);
  desc.dropout.p = rbelow(&c->r, 4) ? (float)(0.05 + 0.9 * runif(&c->r)) : 0.0f;
  desc.dropout.seed = r64(&c->r);
  desc.dropout.offset = r64(&c->r) >> rbelow(&c->r, 64);
  need = (size_t)B * H * Nq * Nk;
  mb = buf_new(c, need + (size_t)rbelow(&c->r, 64), "mask");
  mem = mb->mem;
  callmut_init(c, &m);
  nmut = rchance(&c->r, 0.15) ? 0 : rrange(&c->r, 1, 3);
  for (i = 0; i < nmut; i++) {
    int v = pick_int(&c->r), kind = rbelow(&c->r, 9);
    c->mutated = 1;
    if (kind < 8 && !claim(c, "dm%d", kind == 5 ? 4 : kind)) continue; /* each argument once */
    switch (kind) {
      case 0: clog_(c, "batch = %d", v); B = v; break;
      case 1: clog_(c, "heads_q = %d", v); H = v; break;
      case 2: clog_(c, "seqlen_q = %d", v); Nq = v; break;
      case 3: clog_(c, "seqlen_k = %d", v); Nk = v; break;
      case 4:
        clog_(c, "mask = NULL");
        mem = NULL;
        c->must_fail = 1;
        break;
      case 5:
        mb = buf_new(c, need - 1 + (need == 1), "mask_short");
        mem = mb->mem;
        clog_(c, "mask one byte short"); /* of the unmutated sizes: judged below */
        break;
      case 6: {
        float f = hostile_float(&c->r);
        clog_(c, "dropout_p = %g", (double)f);
        desc.dropout.p = f;
        if (!(f >= 0.0f && f < 1.0f)) c->must_fail = 1;
        break;
      }
      case 7: {
        static const size_t sz[] = {1, 7, sizeof(flashcl_attention_desc) + 1, SIZE_MAX};
        desc.struct_size = sz[rbelow(&c->r, 4)];
        clog_(c, "desc.struct_size = %zu", desc.struct_size);
        c->must_fail = 1;
        break;
      }
      default:
        callmut_mutate(c, &m, 1);
        break;
    }
  }
  {
    /* dimensions below 1, or a mask past the buffer */
    double total = (double)B * H * Nq * Nk;
    fz_buf *cur = buf_of(c, mem);
    if (B < 1 || H < 1 || Nq < 1 || Nk < 1 || !cur || total > (double)cur->bytes) c->must_fail = 1;
  }
  upload_all(c);
  st = flashcl_dropout_mask(m.ctx, m.null_desc ? NULL : &desc, B, H, Nq, Nk, mem, m.nwait, m.wait, m.out_ev);
  if (st == 0 && m.out_ev) wait_event(m.out_ev);
  if (st != 0 && m.out_ev && *m.out_ev) {
    finding(c, "failed call returned an event");
    wait_event(m.out_ev);
  }
  if (st == 0) {
    fz_buf *cur = buf_of(c, mem);
    const double total = (double)B * H * Nq * Nk;
    if (cur && total <= (double)cur->bytes) memset(cur->mayw, 1, (size_t)total);
  }
  check_bytes(c, st);
  if (judge(c, st, 1)) {
    ref_dropout dr;
    long bad = 0;
    int b, h, q, k;
    dr.p = desc.dropout.p, dr.seed = desc.dropout.seed, dr.offset = desc.dropout.offset;
    for (b = 0; b < B; b++)
      for (h = 0; h < H; h++)
        for (q = 0; q < Nq; q++)
          for (k = 0; k < Nk; k++) {
            const unsigned char want = ref_dropout_factor(&dr, (int64_t)b * H + h, q, k) != 0.0;
            bad += mb->cur[(((size_t)b * H + h) * Nq + q) * Nk + k] != want;
          }
    g_stats.checked++;
    if (bad) finding(c, "dropout mask: %ld of %d entries differ from the reference", bad, B * H * Nq * Nk);
  }
}

/* ------------------------------------------------------------ host only -- */

static int64_t hostile_or_small(frng *r) {
  if (rbelow(r, 3)) return rrange(r, 1, 64);
  return PICK(r, HOSTILE_DIM);
}

/* a * b * ... of positive dims past INT64_MAX? */
static int mul_over(int64_t a, int64_t b, int64_t *out) {
  __int128 p = (__int128)a * b;
  if (p > INT64_MAX) return 1;
  *out = (int64_t)p;
  return 0;
}

static void run_tensor_init(fz_case *c) {
  flashcl_tensor t;
  const int which = rbelow(&c->r, 3);
  int64_t B = hostile_or_small(&c->r), N = hostile_or_small(&c->r), H = hostile_or_small(&c->r),
          D = which == 2 ? 1 : hostile_or_small(&c->r);
  const size_t off = rbelow(&c->r, 2) ? (size_t)rbelow(&c->r, 4096) : (size_t)r64(&c->r);
  const int dt = rbelow(&c->r, 4) ? rbelow(&c->r, 3) : pick_int(&c->r);
  const int null_t = rchance(&c->r, 0.05);
  cl_mem buf = rbelow(&c->r, 2) ? NULL : g_foreign_buf; /* never dereferenced */
  int st, positive = B >= 1 && N >= 1 && H >= 1 && D >= 1, over = 0;
  int64_t s[4] = {0, 0, 0, 1};
  host_watch(c, &t, sizeof t, "tensor");
  c->mutated = 1;
  clog_(c, "init_%s(B %lld, N %lld, H %lld, D %lld, offset %zu, dtype %d%s)",
        which == 0 ? "bnhd" : which == 1 ? "bhnd" : "lse", (long long)B, (long long)N, (long long)H, (long long)D, off,
        dt, null_t ? ", t NULL" : "");
  if (which == 0) st = flashcl_tensor_init_bnhd(null_t ? NULL : &t, buf, off, (flashcl_dtype)dt, B, N, H, D);
  else if (which == 1) st = flashcl_tensor_init_bhnd(null_t ? NULL : &t, buf, off, (flashcl_dtype)dt, B, N, H, D);
  else st = flashcl_tensor_init_lse(null_t ? NULL : &t, buf, off, B, N, H);
  /* the expected strides, memory order outermost first */
  s[3] = 1;
  if (positive) {
    int64_t inner[3];
    const int64_t *dims = which == 0 ? (const int64_t[]){D, H, N} : (const int64_t[]){D, N, H};
    over = 0;
    inner[0] = dims[0];
    over = over || mul_over(inner[0], dims[1], &inner[1]);
    over = over || mul_over(inner[1], dims[2], &inner[2]);
    if (!over) {
      if (which == 0) s[2] = inner[0], s[1] = inner[1], s[0] = inner[2];
      else s[1] = inner[0], s[2] = inner[1], s[0] = inner[2];
    }
  }
  g_stats.cases++;
  if (st != 0) {
    g_stats.rejected++;
    if (memcmp(&t, c->host[0].init, sizeof t) != 0) finding(c, "failed tensor init wrote the tensor");
    if (!null_t && positive && !over) finding(c, "tensor init refused valid dims: %d", st);
    if (!null_t && over && st != FLASHCL_ERROR_OVERFLOW) finding(c, "overflow gave %d, not OVERFLOW", st);
  } else {
    g_stats.succeeded++;
    if (null_t) finding(c, "tensor init accepted t = NULL");
    else if (positive && over) finding(c, "tensor init accepted overflowing strides");
    else if (t.shape[0] != B || t.shape[1] != N || t.shape[2] != H || t.shape[3] != D || t.offset != off ||
             t.buffer != buf || (which < 2 && (int)t.dtype != dt) || (which == 2 && t.dtype != FLASHCL_F32))
      finding(c, "tensor init stored other fields");
    else if (positive && memcmp(t.stride, s, sizeof s) != 0)
      finding(c, "tensor init strides (%lld %lld %lld %lld), expected (%lld %lld %lld %lld)", (long long)t.stride[0],
              (long long)t.stride[1], (long long)t.stride[2], (long long)t.stride[3], (long long)s[0],
              (long long)s[1], (long long)s[2], (long long)s[3]);
  }
}

static void run_mask_words(fz_case *c) {
  const int nr = rbelow(&c->r, 2) ? rrange(&c->r, 1, 5000) : pick_int(&c->r);
  const int nc = rbelow(&c->r, 2) ? rrange(&c->r, 1, 5000) : pick_int(&c->r);
  const int null_out = rchance(&c->r, 0.05);
  size_t w;
  int st;
  host_watch(c, &w, sizeof w, "words");
  c->mutated = 1;
  clog_(c, "mask_words(%d, %d%s)", nr, nc, null_out ? ", NULL" : "");
  st = flashcl_mask_words(nr, nc, null_out ? NULL : &w);
  g_stats.cases++;
  if (st != 0) {
    g_stats.rejected++;
    if (memcmp(&w, c->host[0].init, sizeof w)) finding(c, "failed mask_words wrote *words");
    if (!null_out && nr >= 1 && nc >= 1) finding(c, "mask_words refused valid sizes: %d", st);
  } else {
    g_stats.succeeded++;
    if (null_out || nr < 1 || nc < 1) finding(c, "mask_words accepted invalid arguments");
    else if (w != (size_t)nr * (((size_t)nc + 31) / 32)) finding(c, "mask_words = %zu", w);
  }
}

static int block_visible(int layout, int i, int j, int param) {
  const int d = i > j ? i - j : j - i;
  if (layout == FLASHCL_BLOCK_LOCAL) return d < param;
  if (layout == FLASHCL_BLOCK_STRIDED) return d < param || j % param == param - 1;
  if (i == j) return 1;
  {
    const unsigned x = (unsigned)(i ^ j);
    int k;
    if (x & (x - 1)) return 0;
    for (k = 0; (1u << k) != x; k++) {
    }
    return param == 0 || k < param;
  }
}

static void run_block_fill(fz_case *c) {
  const int layout = rbelow(&c->r, 5) ? rbelow(&c->r, 3) : pick_int(&c->r);
  const int nbq = rbelow(&c->r, 5) ? rrange(&c->r, 1, 70) : pick_int(&c->r);
  const int nbk = rbelow(&c->r, 5) ? rrange(&c->r, 1, 70) : pick_int(&c->r);
  const int param = rbelow(&c->r, 4) ? rrange(&c->r, 0, 9) : pick_int(&c->r);
  const int valid_dims = nbq >= 1 && nbk >= 1 && nbq <= 70 && nbk <= 70;
  const size_t need = valid_dims ? (size_t)nbq * (((size_t)nbk + 31) / 32) : 16;
  const int cap_kind = rbelow(&c->r, 4); /* 0: one short, else enough */
  const size_t cap = cap_kind == 0 ? need - 1 : need + (size_t)rbelow(&c->r, 4);
  const int null_w = rchance(&c->r, 0.05);
  uint32_t *words = malloc((cap + 8) * sizeof(uint32_t));
  int st, ok_param, i, j;
  host_watch(c, words, (cap + 8) * sizeof(uint32_t), "words");
  c->mutated = 1;
  clog_(c, "block_mask_fill(layout %d, %d x %d, param %d, capacity %zu of %zu%s)", layout, nbq, nbk, param, cap, need,
        null_w ? ", NULL" : "");
  st = flashcl_block_mask_fill((flashcl_block_layout)layout, nbq, nbk, param, null_w ? NULL : words, cap);
  ok_param = (layout == 0 || layout == 1) ? param >= 1 : layout == 2 ? param >= 0 : 0;
  g_stats.cases++;
  if (st != 0) {
    g_stats.rejected++;
    if (memcmp(words, c->host[0].init, c->host[0].bytes)) finding(c, "failed block_mask_fill wrote words");
    if (!null_w && valid_dims && ok_param && cap >= need) finding(c, "block_mask_fill refused valid arguments: %d", st);
  } else {
    g_stats.succeeded++;
    if (null_w || !valid_dims || !ok_param || cap < need) {
      if (!(nbq >= 1 && nbk >= 1 && ok_param && !null_w && cap >= (size_t)nbq * (((size_t)nbk + 31) / 32)))
        finding(c, "block_mask_fill accepted invalid arguments");
    } else {
      const size_t W = ((size_t)nbk + 31) / 32;
      long bad = 0;
      for (i = 0; i < nbq; i++)
        for (j = 0; j < (int)(W * 32); j++) {
          const int want = j < nbk && block_visible(layout, i, j, param);
          bad += (int)((words[(size_t)i * W + j / 32] >> (j % 32)) & 1u) != want;
        }
      if (memcmp(words + need, (unsigned char *)c->host[0].init + need * 4, (cap + 8 - need) * 4))
        finding(c, "block_mask_fill wrote past its %zu words", need);
      if (bad) finding(c, "block_mask_fill: %ld bits differ from the documented layout", bad);
    }
  }
  free(words);
  c->nhost = 0, free(c->host[0].init);
}

static void run_block_plan(fz_case *c) {
  static const int hd[] = {8, 32, 64, 128, 256, 0, -8, 7, 12, 264, 1000, INT_MAX, INT_MIN};
  static const int bl[] = {0, 0, 0, 8, 16, 32, 64, 7, -8, 12, 1 << 20, INT_MAX, INT_MIN};
  const int d = hd[rbelow(&c->r, 13)], br = bl[rbelow(&c->r, 13)], bc = bl[rbelow(&c->r, 13)];
  const int dt = rbelow(&c->r, 5) ? rbelow(&c->r, 3) : pick_int(&c->r);
  const int null_p = rchance(&c->r, 0.05), null_ctx = rchance(&c->r, 0.03);
  flashcl_block_plan plan;
  int st;
  host_watch(c, &plan, sizeof plan, "plan");
  c->mutated = 1;
  clog_(c, "block_plan(d %d, dtype %d, br %d, bc %d%s%s)", d, dt, br, bc, null_p ? ", plan NULL" : "",
        null_ctx ? ", ctx NULL" : "");
  if (null_p || null_ctx || d < 8 || d > 576 || d % 8 || dt < 0 || dt > 2 || br < 0 || bc < 0 || br % 8 || bc % 8 ||
      br >= (1 << 20) || bc >= (1 << 20))
    c->must_fail = 1;
  st = flashcl_attention_block_plan(null_ctx ? NULL : g_ctx, d, (flashcl_dtype)dt, br, bc, null_p ? NULL : &plan);
  c->host[0].may_write = 1;
  check_bytes(c, st);
  judge(c, st, 0);
  if (st == 0 && (plan.block_r < 1 || plan.block_c < 1 || plan.threads < 1 || (br && plan.block_r != br) ||
                  (bc && plan.block_c != bc)))
    finding(c, "block plan %d x %d, %d threads for br %d bc %d", plan.block_r, plan.block_c, plan.threads, br, bc);
}

/* ----------------------------------------------------------------- main -- */

static const int WEIGHTS[E_COUNT] = {20, 5, 8, 6, 6, 5, 8, 7, 6, 8, 8, 4, 3, 3, 2};

static void run_case(uint64_t index) {
  fz_case c;
  int entry, total = 0, pick, i;
  const double t0 = now();
  memset(&c, 0, sizeof c);
  c.index = index;
  c.r.s = mix64(g_seed ^ mix64(index + 0x5851f42d4c957f2dULL));
  for (i = 0; i < E_COUNT; i++) total += WEIGHTS[i];
  pick = rbelow(&c.r, total);
  for (entry = 0; pick >= WEIGHTS[entry]; entry++) pick -= WEIGHTS[entry];
  c.entry = ENTRY_NAMES[entry];
  switch (entry) {
    case E_FWD:
    case E_BWD:
    case E_WS:
    case E_KF:
    case E_CFG: run_attention(&c, entry); break;
    case E_DROPMASK: run_dropout_mask(&c); break;
    case E_DEC:
    case E_DEC_WS:
    case E_DEC_CFG: run_decode(&c, entry); break;
    case E_APPEND: run_append(&c); break;
    case E_MERGE: run_merge(&c); break;
    case E_TINIT: run_tensor_init(&c); break;
    case E_MASKWORDS: run_mask_words(&c); break;
    case E_BLOCKFILL: run_block_fill(&c); break;
    default: run_block_plan(&c); break;
  }
  g_stats.per_entry_n[entry]++;
  g_stats.per_entry_s[entry] += now() - t0;
  if (!c.failed) g_stats.per_entry_ok[entry]++;
  else g_stats.findings++;
  if (g_verbose) fprintf(stderr, "case %llu %s: %s%s\n", (unsigned long long)index, c.entry, c.log, c.failed ? " FAILED" : "");
  case_release(&c);
}

/* Whether the context's device takes desc.kernel = NVIDIA_MMA: asked on an
 * f16 problem the tensor-core kernels cover (16-byte aligned rows, d = 32). */
static int device_has_mma(void) {
  cl_int err;
  cl_mem buf = clCreateBuffer(g_cl, CL_MEM_READ_WRITE, 16 * 32 * 2, NULL, &err);
  if (!buf) return 0;
  cl_mem obuf = clCreateBuffer(g_cl, CL_MEM_READ_WRITE, 16 * 32 * 2, NULL, &err);
  if (!obuf) {
    clReleaseMemObject(buf);
    return 0;
  }
  flashcl_tensor t, o;
  flashcl_attention_desc d;
  flashcl_kernel_family fam = FLASHCL_KERNEL_AUTO;
  flashcl_tensor_init_bnhd(&t, buf, 0, FLASHCL_F16, 1, 16, 1, 32);
  flashcl_tensor_init_bnhd(&o, obuf, 0, FLASHCL_F16, 1, 16, 1, 32);
  flashcl_attention_desc_init(&d);
  d.algorithm.kernel = FLASHCL_KERNEL_NVIDIA_MMA;
  const flashcl_status st = flashcl_attention_kernel_family(g_ctx, &d, &t, &t, &t, &o, FLASHCL_PASS_FORWARD, &fam);
  clReleaseMemObject(buf);
  clReleaseMemObject(obuf);
  return st == FLASHCL_SUCCESS;
}

static void child_setup(void) {
  flashcl_context_options opt;
  cl_device_id dev;
  cl_int err;
  flashcl_status st;
  flashcl_context_options_init(&opt);
  st = flashcl_context_create(&opt, &g_ctx);
  if (st != 0) die("flashcl_context_create", st);
  g_cl = flashcl_context_cl_context(g_ctx);
  g_queue = flashcl_context_cl_queue(g_ctx);
  dev = flashcl_context_cl_device(g_ctx);
  g_foreign = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (g_foreign) g_foreign_buf = clCreateBuffer(g_foreign, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
  g_user_event = clCreateUserEvent(g_cl, &err);
  if (g_user_event) clSetUserEventStatus(g_user_event, CL_COMPLETE);
  flashcl_tuning_init(&g_decode_tuning, FLASHCL_TUNE_DECODE);
  flashcl_tuning_init(&g_merge1_tuning, FLASHCL_TUNE_DECODE);
  if (flashcl_tuning_set(NULL, &g_merge1_tuning, "merge", 1) != 0) die("flashcl_tuning_set(merge)", 1);
  g_has_mma = device_has_mma();
}

static void child_teardown(void) {
  if (g_user_event) clReleaseEvent(g_user_event);
  if (g_foreign_buf) clReleaseMemObject(g_foreign_buf);
  if (g_foreign) clReleaseContext(g_foreign);
  flashcl_context_destroy(g_ctx);
  g_ctx = NULL;
}

static uint64_t env_u64(const char *name, uint64_t def) {
  const char *v = getenv(name);
  return v && *v ? strtoull(v, NULL, 0) : def;
}

static void write_all(int fd, const void *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return;
    p = (const char *)p + w, n -= (size_t)w;
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
  const uint64_t cases = env_u64("FLASHCL_FUZZ_CASES", 10000), first = env_u64("FLASHCL_FUZZ_FIRST", 0);
  const uint64_t batch = env_u64("FLASHCL_FUZZ_BATCH", 2500), timeout = env_u64("FLASHCL_FUZZ_TIMEOUT", 120);
  const int nofork = (int)env_u64("FLASHCL_FUZZ_NOFORK", 0);
  const uint64_t end = first + cases;
  fz_stats total;
  uint64_t next = first;
  long crashes = 0, children = 0;
  double t0 = now();
  int e;
  g_seed = env_u64("FLASHCL_FUZZ_SEED", (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
  g_verbose = (int)env_u64("FLASHCL_FUZZ_VERBOSE", 0);
  printf("[ SEED ] FLASHCL_FUZZ_SEED=%llu FLASHCL_FUZZ_FIRST=%llu FLASHCL_FUZZ_CASES=%llu (batch %llu, timeout %llu s)\n",
         (unsigned long long)g_seed, (unsigned long long)first, (unsigned long long)cases,
         (unsigned long long)batch, (unsigned long long)timeout);
  fflush(stdout);
  memset(&total, 0, sizeof total);
  if (nofork) {
    uint64_t i;
    child_setup();
    for (i = first; i < end; i++) run_case(i);
    child_teardown();
    total = g_stats;
  }
  while (!nofork && next < end) {
    const uint64_t stop = next + batch < end ? next + batch : end;
    int fds[2], status;
    uint64_t last = next;
    pid_t pid;
    char tag;
    if (pipe(fds) != 0) die("pipe", errno);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) die("fork", errno);
    if (pid == 0) {
      uint64_t i;
      close(fds[0]);
      child_setup();
      for (i = next; i < stop; i++) {
        tag = 'C';
        write_all(fds[1], &tag, 1);
        write_all(fds[1], &i, sizeof i);
        alarm((unsigned)timeout);
        run_case(i);
      }
      alarm(0);
      child_teardown();
      tag = 'S';
      write_all(fds[1], &tag, 1);
      write_all(fds[1], &g_stats, sizeof g_stats);
      close(fds[1]);
      fflush(stdout);
      fflush(stderr);
      _exit(g_stats.findings ? 1 : 0);
    }
    children++;
    close(fds[1]);
    for (;;) {
      ssize_t n = read(fds[0], &tag, 1);
      if (n <= 0) break;
      if (tag == 'C') {
        if (read(fds[0], &last, sizeof last) != sizeof last) break;
      } else if (tag == 'S') {
        fz_stats s;
        size_t got = 0;
        while (got < sizeof s) {
          n = read(fds[0], (char *)&s + got, sizeof s - got);
          if (n <= 0) break;
          got += (size_t)n;
        }
        if (got == sizeof s) {
          total.cases += s.cases, total.rejected += s.rejected, total.succeeded += s.succeeded;
          total.checked += s.checked, total.findings += s.findings;
          for (e = 0; e < E_COUNT; e++)
            total.per_entry_n[e] += s.per_entry_n[e], total.per_entry_ok[e] += s.per_entry_ok[e],
                total.per_entry_s[e] += s.per_entry_s[e];
        }
      }
    }
    close(fds[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      crashes++;
      fprintf(stderr, "[ %s ] seed %llu case %llu: child killed by signal %d (%s)\n    replay: FLASHCL_FUZZ_SEED=%llu "
                      "FLASHCL_FUZZ_FIRST=%llu FLASHCL_FUZZ_CASES=1 FLASHCL_FUZZ_NOFORK=1\n",
              sig == SIGALRM ? "HANG" : "CRASH", (unsigned long long)g_seed, (unsigned long long)last, sig,
              strsignal(sig), (unsigned long long)g_seed, (unsigned long long)last);
      next = last + 1; /* the rest of the batch runs in a new child */
    } else {
      if (WEXITSTATUS(status) > 1) {
        fprintf(stderr, "[ ERROR ] child exited with %d (setup failed?)\n", WEXITSTATUS(status));
        crashes++;
      }
      next = stop;
    }
  }
  {
    const double secs = now() - t0;
    printf("[ FUZZ ] %ld cases in %.1f s (%ld child processes): %ld rejected, %ld succeeded, %ld checked against a "
           "reference; %ld finding(s), %ld crash(es)/hang(s)\n",
           total.cases, secs, children, total.rejected, total.succeeded, total.checked, total.findings, crashes);
    for (e = 0; e < E_COUNT; e++)
      printf("    %-42s %6ld cases, %6ld clean, %7.1f s\n", ENTRY_NAMES[e], total.per_entry_n[e], total.per_entry_ok[e],
             total.per_entry_s[e]);
  }
  return total.findings || crashes ? 1 : 0;
}
