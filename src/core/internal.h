/* Internal declarations shared by the runtime's translation units. */
#ifndef FLASHCL_INTERNAL_H
#define FLASHCL_INTERNAL_H

#include "flashcl.h"
#include "core/lock.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#define FLASHCL_ERRMSG_CAP 65536

typedef struct flashcl_program_entry {
  char *key;          /* "<file>|<options>" */
  cl_program program;
  struct flashcl_kernel_entry *kernels;
  struct flashcl_program_entry *next;
} flashcl_program_entry;

typedef struct flashcl_kernel_entry {
  char *name;
  cl_kernel kernel;
  struct flashcl_kernel_entry *next;
} flashcl_kernel_entry;

struct flashcl_context {
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;
  cl_command_queue queue;
  flashcl_device_info info;
  int verbose;
  char *kernel_dir;
  flashcl_program_entry *programs;
  /* NVIDIA tensor-core path (src/nvidia/mma_probe.c): 0 = not probed yet, 1 = usable,
   * -1 = unavailable for the reason in mma_reason. Probed on first use. */
  int mma_state;
  char mma_reason[512];
  /* Probes (mma.sync, wgmma) deferred for want of memory so far: a query
   * during which one was deferred answers for a path the next call may not
   * take (fcl_query_settled). */
  int probe_defers;
  /* Local memory per work-group the tensor-core kernels may use: the local
   * budget (fcl_local_budget), copied when the path is probed. */
  size_t mma_local_bytes;
  /* Local memory per work-group that tiles are planned against: 0 until the
   * first fcl_local_budget call (src/core/probe.c). local_mem_actual: what the device
   * reports (info.local_mem_size is less under the context tuning's local_mem). */
  size_t local_budget;
  size_t local_mem_actual;
  /* The most local memory a work-group may use, for additions that never
   * shape the tiles (fcl_local_limit): 0 until first asked. */
  size_t local_limit;
  /* The context tuning's local_probe: -1 the rule (NVIDIA GPUs), 0 never, 1 try. */
  int local_probe;
  int mma_cc; /* compute capability * 10 (e.g. 90), once probed */
  /* Hopper wgmma forward (src/nvidia/wgmma_forward.c): same states as mma_state. */
  int wgmma_state;
  char wgmma_reason[512];
  /* 1 once the Hopper backward failed to build: off for this context, and
   * the failing call is chosen again (src/nvidia/wgmma_backward.c). */
  int wgmma_bwd_failed;
  /* flashcl_attention_decode's split partials when desc.split.workspace is NULL
   * (src/decode/decode.c): grow-only, released by flashcl_context_destroy. last: the
   * last command of the latest call that used it, kept only on an out-of-order
   * queue (the next call waits for it); queue_ooo: 0 unknown, 1 in-order, 2
   * out-of-order. counters: the one-launch merge's arrival counters
   * (cl/decode/split_merge.cl), zero-filled when made, left zero by every call. */
  struct fcl_decode_scratch {
    cl_mem mem;
    size_t bytes;
    cl_mem counters;
    size_t counter_count;
    cl_event last;
    int queue_ooo;
  } decode_scratch;
  /* A second queue on the same device, created on first use, so that two
   * independent kernels of one call (the deterministic backward's dK/dV and dQ)
   * can run at the same time: each one's last partial wave then overlaps the
   * other's work. side_queue_state: 0 not tried, 1 usable, -1 unavailable. */
  cl_command_queue side_queue;
  int side_queue_state;
  /* Options (src/core/context.c): the resolved cache directory (NULL when none can
   * be named), whether compiled programs are cached there (src/core/binary_cache.c),
   * and the extra build options (NULL: none). */
  char *cache_dir;
  int binary_cache;
  /* The most <cache_dir>/programs may hold (src/core/cache_trim.c). */
  uint64_t cache_max_bytes;
  /* $FLASHCL_KERNEL, read once at creation: what AUTO means for this context. */
  flashcl_kernel_family env_kernel;
  char *build_options;
  flashcl_context_stats stats;
  /* Numbers this context's temporary cache files (src/core/binary_cache.c). */
  unsigned cache_seq;
  /* The tuning sources (src/core/tuning_db.c), first match wins, and what loading
   * them did (flashcl_context_tuning_log). */
  struct fcl_tuning_db *tuning;
  char *tuning_log;
  /* Held for the whole of every public call that uses the context (fcl_enter /
   * fcl_leave), so that threads may share it: the program and kernel cache
   * (clSetKernelArg through the enqueue), the decode scratch, the side queue,
   * the probes' state, stats and errmsg. serial: unique in the process, names
   * the context in the threads' copies of errmsg (src/core/status.c). */
  fcl_mutex lock;
  int64_t serial;
  char errmsg[FLASHCL_ERRMSG_CAP];
};

/* A public entry point that uses ctx runs its body between these
 * (src/core/status.c): fcl_enter takes ctx's lock, fcl_leave copies ctx's
 * message for the calling thread (flashcl_context_last_error), releases the
 * lock and returns st. Both do nothing for ctx NULL. The body must not call
 * another such entry point on ctx (the lock is not recursive):
 *   fcl_enter(ctx);
 *   return fcl_leave(ctx, fcl_xxx_locked(ctx, ...)); */
void fcl_enter(const flashcl_context *ctx);
/* For the queries (workspace sizes, kernel family, configuration): st, or
 * FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY when a tensor-core probe was deferred
 * since the query started (defers0): its answer, planned without the tensor
 * cores, would not hold once the probe runs. The caller writes its outputs
 * only on success. */
flashcl_status fcl_query_settled(flashcl_context *ctx, int defers0, flashcl_status st);
flashcl_status fcl_leave(const flashcl_context *ctx, flashcl_status st);

char *fcl_strdup(const char *s);

/* Descriptor sizes (src/core/abi.c). fcl_struct_init fills the first size bytes
 * of a caller's struct from defaults (the library's full_size-byte default
 * struct) and sets its struct_size. fcl_struct_import copies a caller's struct
 * into full, which holds the defaults, after checking its struct_size against
 * first_size (the smallest layout with struct_size, taken for 0) and
 * full_size. */
flashcl_status fcl_struct_init(void *user, size_t size, const void *defaults, size_t full_size);
flashcl_status fcl_struct_import(flashcl_context *ctx, const void *user, size_t first_size, void *full,
                                 size_t full_size, const char *type);
/* Defaults of the descriptor groups more than one descriptor holds. */
void fcl_score_desc_defaults(flashcl_score_desc *score);
void fcl_kv_layout_defaults(flashcl_kv_layout *cache);

/* src/core/tuning_db.c: loads the context's tuning sources (after the device is known)
 * and frees them. Loading never fails the context: what it skipped and why
 * goes to ctx->tuning_log. */
flashcl_status fcl_tuning_load(flashcl_context *ctx, const flashcl_context_options *options);
void fcl_tuning_free(flashcl_context *ctx);

/* Records a message for flashcl_context_last_error and returns status, so that
 * error paths read `return fcl_fail(ctx, STATUS, "...", ...)`. ctx may be NULL. */
flashcl_status fcl_fail(flashcl_context *ctx, flashcl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Maps an OpenCL error from `what` to a flashcl status and message. */
flashcl_status fcl_cl_fail(flashcl_context *ctx, cl_int err, const char *what);
/* Clears ctx's message, or with ctx NULL the calling thread's (see
 * flashcl_context_last_error). */
void fcl_clear_error(flashcl_context *ctx);
/* Copies the message of a context that is about to be destroyed because its
 * creation failed into the calling thread's, where the caller can read it. */
void fcl_keep_create_error(const flashcl_context *ctx);
void fcl_log(const flashcl_context *ctx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char *fcl_cl_error_name(cl_int err);
/* src/core/probe.c: runs kern (gsz work-items, one work-group) on a private in-order
 * queue and reads `bytes` of `out` back; and the local memory a work-group may
 * use, probed once per context (CL_DEVICE_LOCAL_MEM_SIZE or more). */
cl_int fcl_probe_run(flashcl_context *ctx, cl_kernel kern, size_t gsz, cl_mem out, size_t bytes, void *host);
size_t fcl_local_budget(flashcl_context *ctx);
size_t fcl_local_limit(flashcl_context *ctx);

/* The device belongs to NVIDIA's OpenCL platform: the measured tuning tables,
 * the local-memory probe and the PTX paths apply only there. */
static inline int fcl_platform_is_nvidia(const flashcl_context *ctx) {
  return strstr(ctx->info.platform_name, "NVIDIA") != NULL;
}

/* Builds (once) and returns a kernel of program `file` compiled with `options`. */
flashcl_status fcl_get_kernel(flashcl_context *ctx, const char *file, const char *options,
                              const char *kernel_name, cl_kernel *out);
/* A rewrite of a compiled program's binary before the driver assembles it
 * again: the sm_90a route of nvidia/wgmma_forward.c (cl/nvidia/flash_fwd_wgmma.cl
 * says why). name and revision are part of the program's cache keys: raise
 * the revision whenever the rewrite's output changes. rewrite returns a
 * malloc'ed binary, or NULL with *why set to a static reason. */
typedef struct fcl_retarget {
  const char *name;
  int revision;
  char *(*rewrite)(const char *binary, const char **why);
} fcl_retarget;
/* fcl_get_kernel for a program built from source, rewritten by rt and built
 * again from the rewritten binary. */
flashcl_status fcl_get_kernel_retargeted(flashcl_context *ctx, const char *file, const char *options,
                                         const char *kernel_name, const fcl_retarget *rt, cl_kernel *out);
void fcl_release_programs(flashcl_context *ctx);

/* The on-disk program cache (src/core/binary_cache.c). fcl_cache_enabled: the
 * context may read and write it (binary_cache on, a cache directory named).
 * The key hashes the device and driver, flashcl's version, every source part,
 * the options and the route ("" for plain builds). fcl_cache_load returns the
 * built program of a valid entry, or NULL (a miss, or a rejected entry: counted
 * and logged); fcl_cache_store writes prog's binary. Neither ever fails. */
typedef struct fcl_cache_key {
  uint64_t h[2];
} fcl_cache_key;
int fcl_cache_enabled(const flashcl_context *ctx);
void fcl_cache_key_make(flashcl_context *ctx, const char *const *text, const size_t *size, unsigned parts,
                        const char *options, const char *route, fcl_cache_key *key);
cl_program fcl_cache_load(flashcl_context *ctx, const fcl_cache_key *key, const char *files, const char *options);
void fcl_cache_store(flashcl_context *ctx, const fcl_cache_key *key, cl_program prog, const char *files);
/* src/core/cache_trim.c: removes the least recently used entries of dir (never
 * the one named keep) until it holds at most ctx->cache_max_bytes, and stale
 * temporary files; fcl_cache_touch marks an entry used. Neither ever fails. */
void fcl_cache_trim(flashcl_context *ctx, const char *dir, const char *keep);
void fcl_cache_touch(const char *path);

/* 1 for the OpenCL codes of a shortage (device or host memory, resources):
 * a failure that says nothing about the device and may pass. */
static inline int fcl_cl_is_shortage(cl_int err) {
  return err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY || err == CL_MEM_OBJECT_ALLOCATION_FAILURE;
}
/* 1 for the codes of an allocation that failed (device or host memory), not
 * CL_OUT_OF_RESOURCES, which NVIDIA's driver also gives for a faulting kernel. */
static inline int fcl_cl_is_alloc_failure(cl_int err) {
  return err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_HOST_MEMORY;
}
static inline int fcl_status_is_oom(flashcl_status st) {
  return st == FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY || st == FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
}
/* src/core/probe.c: the failure of a call that names the NVIDIA path `what`
 * ("the NVIDIA tensor-core kernels") when fcl_mma_available said no:
 * FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY while its probe is deferred (undecided),
 * else FLASHCL_ERROR_UNSUPPORTED, with ctx->mma_reason. */
flashcl_status fcl_mma_refusal(flashcl_context *ctx, const char *what);
/* src/core/retry.c: 1 when err is a shortage of resources, after flushing
 * ctx's queue (and side, if not NULL): the caller then tries the failed set-up
 * or enqueue of a later command of its call once more. 0 for any other error. */
int fcl_retry_after_flush(flashcl_context *ctx, cl_command_queue side, cl_int err, const char *what);

/* The context's side queue (see side_queue), or NULL where it cannot be
 * created; never fails the caller. */
cl_command_queue fcl_side_queue(flashcl_context *ctx);

/* Kernel source text: from ctx->kernel_dir if set, else the embedded copy.
 * *owned is set when the caller must free() the returned text. */
flashcl_status fcl_kernel_source(flashcl_context *ctx, const char *file, const char **text, size_t *size,
                                 char **owned);

struct fcl_tuned; /* core/tuning.h */

/* Validated view of one attention call: every size the kernels need. */
typedef struct fcl_problem {
  flashcl_dtype dtype;
  int batch;        /* sequences: tensor batch, or num_seqs for varlen */
  int seqlen_q;     /* per sequence (max for varlen) */
  int seqlen_k;
  int heads_q;
  int heads_kv;
  int head_dim;     /* of q and k */
  int head_dim_v;   /* of v and o: head_dim unless desc.shape.head_dim_v says otherwise */
  int varlen;
  int causal;
  float scale;
  /* Dropout: kept iff the Philox word >= threshold; kept values scale by keep_scale. */
  int dropout;
  cl_uint threshold;
  float keep_scale;
  uint64_t seed, offset;
  /* Score variants (see flashcl_attention_desc). window: 1 when either side is
   * bounded; window_left/right are then >= 0, clamped to max(seqlen_q, seqlen_k)
   * (unbounded sides too), and window_right is 0 when causal. */
  int window, window_left, window_right;
  cl_mem alibi;  /* NULL = off */
  float softcap; /* 0 = off */
  cl_mem sinks;  /* NULL = off (desc.score.sinks) */
  /* Attention mask (see flashcl_mask_kind): kind 0 = none; words per row, and
   * word strides between sequences and between query heads (0: shared). For
   * FLASHCL_MASK_BITS mask_bq = mask_bk = 1. */
  int mask_kind;
  cl_mem mask;
  int mask_bq, mask_bk, mask_words;
  int64_t mask_bstride, mask_hstride;
  /* Paged K/V source (see flashcl_paged_desc): paged_kv = 1
   * when k/v are page pools; seqlen_k is then the bound on the per-sequence key
   * counts read from kv_seqlens. */
  int paged_kv, kv_page_size, kv_max_pages, kv_num_pages;
  cl_mem kv_block_table, kv_seqlens;
  /* A quantized paged source (desc.paged.cache.k_scale): k_quant /
   * v_quant 1 where that side is I8 / F8E4M3 / F8E5M2, its dtype, scale
   * buffer and flashcl_kv_scale (plain sides: 0, q's dtype, NULL, 0). */
  int k_quant, v_quant, k_scale_kind, v_scale_kind;
  flashcl_dtype k_dtype, v_dtype;
  cl_mem k_scale, v_scale;
  size_t k_scale_bytes, v_scale_bytes; /* what their layouts span */
} fcl_problem;

/* " -DWINDOW=1 -DALIBI=1 -DSOFTCAP=1 -DMASK=k" for the variants p uses ("" for none), and
 * " -DHEAD_DIM_V=dv" where v's head dim differs from q's, so that problems
 * without them build exactly the options they always did. */
const char *fcl_variant_options(const fcl_problem *p, char *buf, size_t cap);

/* Appends " -DK_DTYPE=.. -DV_DTYPE=.. -DK_SCALE=.. -DV_SCALE=.." for a
 * quantized paged source (kv_quant.cl's formats; a plain side keeps q's
 * dtype) to buf; nothing otherwise, so that other programs keep their
 * options. */
void fcl_kvq_options(const fcl_problem *p, char *buf, size_t cap);

/* Appends the dropout kernel arguments (seed, offset, threshold, keep_scale). */
struct fcl_args;
cl_uint fcl_dropout_threshold(float p);


/* 1 if the element offset and (batch, seq, head) strides are all multiples of
 * 4: rows of four elements can then be read and written as aligned vectors. */
int fcl_vec_aligned(const flashcl_tensor *t);
/* 1 if a tensor's rows are 16-byte aligned (cp.async, vector stores): element offset and
 * (batch, seq, head) strides multiples of 8 elements. */
int fcl_rows_aligned16(const flashcl_tensor *t);

/* Checks one tensor: non-NULL buffer, positive shape, strides, fits in its cl_mem. */
flashcl_status fcl_check_tensor(flashcl_context *ctx, const flashcl_tensor *t, const char *name,
                                int need_unit_last_stride);
/* fcl_check_tensor (unit head_dim stride) for a KV cache, which may also be
 * stored in a quantized format (fcl_dtype_is_kv_quant); fcl_check_tensor
 * refuses those with FLASHCL_ERROR_DTYPE_MISMATCH. */
flashcl_status fcl_check_kv_tensor(flashcl_context *ctx, const flashcl_tensor *t, const char *name);
/* 1 for FLASHCL_I8, _F8E4M3, _F8E5M2, _I4X2: the quantized KV-cache formats. */
int fcl_dtype_is_kv_quant(flashcl_dtype dtype);
/* The elements of one row of a KV cache tensor: shape[3], twice that for
 * FLASHCL_I4X2, whose elements are bytes of two codes. */
int64_t fcl_kv_head_dim(const flashcl_tensor *t);
/* The scale buffer of one quantized cache side (name the descriptor path
 * before "_scale", e.g. "desc.cache.k", for the messages; tensor its tensor's name, head dim d, `rows` cache rows of
 * heads_kv heads): kind a flashcl_kv_scale (BLOCK32 needs d % 32 == 0), the
 * buffer present and as large as its layout; *bytes gets that size. Shared by
 * decode, the append and the paged forward. */
flashcl_status fcl_check_kv_scale(flashcl_context *ctx, cl_mem scale, flashcl_kv_scale kind, int d, const char *name,
                                  const char *tensor, uint64_t rows, int heads_kv, size_t *bytes);


/* Prints a kernel's build log and resource figures to stderr (verbose >= 2;
 * src/core/program.c). */
void fcl_print_build_log(flashcl_context *ctx, cl_kernel kern, const char *name, const char *opts);


/* Overflow-checked size arithmetic: return 0 on overflow. */
int fcl_mul_size(size_t a, size_t b, size_t *out);
int fcl_add_size(size_t a, size_t b, size_t *out);

/* log2 of a page size that is a power of two (the usual 16, 32, 64), else -1: the
 * paged kernels take such sizes as -DPAGE_SHIFT, a shift instead of a division
 * per key row. */
static inline int fcl_page_shift(int page_size) {
  for (int s = 0; s < 31; s++)
    if (page_size == 1 << s) return s;
  return -1;
}

/* 1 if validated views out and in may share bytes of one cl_mem: their byte
 * ranges overlap and they are not provably interleaved (src/core/tensor.c);
 * identical views are allowed when allow_same. NULL never conflicts. */
int fcl_views_conflict(const flashcl_tensor *out, const flashcl_tensor *in, int allow_same);
/* FLASHCL_ERROR_INVALID_STRIDE if the output view t (NULL: none) can name one
 * element twice, so that two work-items would write it. */
flashcl_status fcl_check_output_distinct(flashcl_context *ctx, const flashcl_tensor *t, const char *name);
/* The size of a caller's cl_mem, checked to be a buffer of ctx's cl_context. */
flashcl_status fcl_buffer_size(flashcl_context *ctx, cl_mem m, const char *name, size_t *size);
/* A buffer range a call reads (or writes, for a workspace) besides its tensors. */
typedef struct fcl_aux {
  cl_mem mem;
  size_t offset, bytes;
  const char *name;
} fcl_aux;
#define FCL_MAX_AUX 12 /* fcl_problem_aux fills up to 8 today */
/* 1 if bytes [begin, begin + bytes) of m can share a byte with view out. */
int fcl_range_conflict(const flashcl_tensor *out, cl_mem m, size_t begin, size_t bytes);
/* INVALID_ARGUMENT when an aux range shares bytes with one of the outputs. */
flashcl_status fcl_check_aux_buffers(flashcl_context *ctx, const fcl_aux *aux, int naux,
                                     const flashcl_tensor *const *outs, const char *const *out_names, int nouts);
/* The score variants' fields: window bounds >= -1, softcap 0 or finite > 0, ALiBi
 * slopes (NULL or >= hq floats). */
flashcl_status fcl_check_variants(flashcl_context *ctx, int window_left, int window_right, float softcap,
                                  cl_mem alibi_slopes, int64_t hq);
/* An optional fp32 buffer of >= hq floats (the sinks and their gradient). */
flashcl_status fcl_check_head_floats(flashcl_context *ctx, cl_mem buf, int64_t hq, const char *name);

#endif
