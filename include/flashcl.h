/*
 * flashcl — exact attention (FlashAttention) for any OpenCL device.
 *
 * Conventions
 *   - Every function returns a flashcl_status: 0 on success, negative on failure.
 *     flashcl's own codes live in [-4999, -4000]. A failed OpenCL or CLBlast call
 *     inside the library becomes FLASHCL_ERROR_OPENCL / _BLAS (or one of the
 *     out-of-memory codes), with the OpenCL or CLBlast code named in the context's
 *     message; flashcl_status_string also names raw OpenCL codes in (-1000, 0)
 *     and CLBlast codes in [-2999, -1024].
 *   - Handles are opaque, come in create/destroy pairs, and destroy(NULL) is a no-op.
 *   - Operations take a descriptor filled with defaults by its *_init() function.
 *   - Nothing is printed unless the context was created with verbose != 0.
 *   - A failed call enqueues nothing and writes nothing to its outputs; a readable
 *     message is kept in the context (flashcl_context_last_error).
 *   - Threads: a context may be shared. Every call that uses a context holds
 *     the context's mutex from its first check to its last enqueue (kernel
 *     cache, kernel arguments, decode scratch, side queue, tuning, stats,
 *     message), so calls on one context run one at a time on the host and
 *     enqueue on its queue in the order they took the mutex; for host-side
 *     parallelism use one context per thread (contexts share no state).
 *     flashcl_context_destroy must not overlap another call on the context.
 *     flashcl_context_last_error(ctx) gives the calling thread the message of
 *     its own last call on ctx, whatever other threads did since.
 */
#ifndef FLASHCL_H
#define FLASHCL_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifdef __APPLE__
#include <OpenCL/cl.h>
#else
#include <CL/cl.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHCL_VERSION_MAJOR 0
#define FLASHCL_VERSION_MINOR 2
#define FLASHCL_VERSION_PATCH 0
#define FLASHCL_VERSION_NUMBER \
  (FLASHCL_VERSION_MAJOR * 10000 + FLASHCL_VERSION_MINOR * 100 + FLASHCL_VERSION_PATCH)
#define FLASHCL_VERSION_STRING "0.2.0"

/* Windows DLLs: CMake defines FLASHCL_BUILDING_DLL while it builds a shared
 * flashcl and passes FLASHCL_DLL to the programs that link it (its package
 * and flashcl.pc do), so that they import the functions. */
#if defined(_WIN32) && defined(FLASHCL_BUILDING_DLL)
#define FLASHCL_API __declspec(dllexport)
#elif defined(_WIN32) && defined(FLASHCL_DLL)
#define FLASHCL_API __declspec(dllimport)
#elif defined(__GNUC__)
#define FLASHCL_API __attribute__((visibility("default")))
#else
#define FLASHCL_API
#endif

/* The version of the library a program runs against, which can differ from
 * the header it was built with (FLASHCL_VERSION_*) when libflashcl is shared. */
FLASHCL_API unsigned flashcl_version_number(void); /* FLASHCL_VERSION_NUMBER of the library */
FLASHCL_API const char *flashcl_version_string(void); /* "major.minor.patch" */

/* ---------------------------------------------------------------- status -- */

/* X(name, value, description). The one table behind flashcl_status and
 * flashcl_status_string(). */
#define FLASHCL_STATUS_LIST(X)                                                        \
  X(FLASHCL_SUCCESS, 0, "success")                                                    \
  X(FLASHCL_ERROR_INVALID_ARGUMENT, -4001, "invalid argument (NULL pointer or bad value)") \
  X(FLASHCL_ERROR_INVALID_SHAPE, -4002, "invalid or inconsistent tensor shape")      \
  X(FLASHCL_ERROR_INVALID_STRIDE, -4003, "invalid tensor stride")                    \
  X(FLASHCL_ERROR_BUFFER_TOO_SMALL, -4004, "tensor reads or writes past its cl_mem") \
  X(FLASHCL_ERROR_DTYPE_MISMATCH, -4005, "tensor dtypes do not match")              \
  X(FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM, -4006, "unsupported head dimension")        \
  X(FLASHCL_ERROR_UNSUPPORTED, -4007, "operation not supported on this device or configuration") \
  X(FLASHCL_ERROR_OVERFLOW, -4008, "size arithmetic overflows")                     \
  X(FLASHCL_ERROR_HOST_OUT_OF_MEMORY, -4009, "host memory allocation failed")       \
  X(FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY, -4010, "device memory allocation failed")   \
  X(FLASHCL_ERROR_DEVICE_NOT_FOUND, -4011, "no matching OpenCL device")             \
  X(FLASHCL_ERROR_BUILD_FAILED, -4012, "OpenCL program build failed (see last error for the log)") \
  X(FLASHCL_ERROR_BLAS, -4013, "CLBlast call failed")                              \
  X(FLASHCL_ERROR_OPENCL, -4014, "OpenCL call failed")                             \
  X(FLASHCL_ERROR_KERNEL_SOURCE, -4015, "kernel source not found")                 \
  X(FLASHCL_ERROR_INTERNAL, -4016, "internal error")

typedef enum flashcl_status {
#define FLASHCL_X_ENUM(name, value, text) name = value,
  FLASHCL_STATUS_LIST(FLASHCL_X_ENUM)
#undef FLASHCL_X_ENUM
  FLASHCL_STATUS_FORCE_INT = 0x7fffffff
} flashcl_status;

/* Static text for a status. OpenCL codes (e.g. -5) give their CL_* name.
 * Never returns NULL. */
FLASHCL_API const char *flashcl_status_string(int status);

/* ----------------------------------------------------------------- types -- */

typedef enum flashcl_dtype {
  FLASHCL_F32 = 0,
  FLASHCL_F16 = 1,  /* IEEE binary16, storage only: math is fp32 */
  FLASHCL_BF16 = 2, /* bfloat16, storage only: math is fp32 */
  /* Quantized KV-cache formats (one byte per element; I4X2 below packs two), legal only as the
   * k_cache / v_cache dtype of flashcl_attention_decode and
   * flashcl_kv_cache_append (see "Quantized KV cache" at flashcl_decode_desc),
   * and as k / v of a forward with a paged source (flashcl_paged_desc).
   * Every other tensor of every call refuses them with
   * FLASHCL_ERROR_DTYPE_MISMATCH. */
  FLASHCL_I8 = 3,     /* int8, two's complement, codes -127..127 written */
  FLASHCL_F8E4M3 = 4, /* fp8 E4M3 (OCP "FN"): bias 7, no inf, NaN S.1111.111, max 448 */
  FLASHCL_F8E5M2 = 5, /* fp8 E5M2: bias 15, IEEE-like inf and NaN, max 57344 */
  /* int4 codes -8..7 (two's complement; -7..7 written), two per byte: one
   * element of the tensor is one byte holding two consecutive codes, the
   * even one in the low nibble. A cache of it has shape[3] = head_dim / 2 and
   * counts its strides and offset in those bytes. */
  FLASHCL_I4X2 = 6
} flashcl_dtype;

/* Size in bytes of one element, 0 for an unknown dtype. */
FLASHCL_API size_t flashcl_dtype_size(flashcl_dtype dtype);
FLASHCL_API const char *flashcl_dtype_name(flashcl_dtype dtype);

/* Scale layouts of a quantized KV cache (see "Quantized KV cache" at
 * flashcl_decode_desc). TOKEN is 0 so that a descriptor zeroed by hand gets
 * the kind that the descriptors' *_init() functions set. */
typedef enum flashcl_kv_scale {
  FLASHCL_KV_SCALE_TOKEN = 0,
  FLASHCL_KV_SCALE_HEAD = 1,
  FLASHCL_KV_SCALE_TENSOR = 2,
  FLASHCL_KV_SCALE_BLOCK32 = 3
} flashcl_kv_scale;

typedef enum flashcl_algo {
  FLASHCL_ALGO_AUTO = 0,  /* flash, unless a device or option rules it out */
  FLASHCL_ALGO_FLASH = 1, /* tiled, fused, O(N) extra memory */
  FLASHCL_ALGO_NAIVE = 2  /* CLBlast GEMMs + softmax, O(N^2) extra memory */
} flashcl_algo;

/* Which flash kernel family runs (docs/kernels.md has each one's devices and
 * coverage). AUTO takes the fastest family this device supports for the
 * problem; PORTABLE is plain OpenCL C 1.2 and works everywhere; NVIDIA_MMA is
 * the tensor-core path of NVIDIA GPUs, and problems it does not cover run the
 * portable kernels. flashcl_attention_kernel_family() says which family a
 * call runs. Requesting NVIDIA_MMA on a device without it fails with
 * FLASHCL_ERROR_UNSUPPORTED. The FLASHCL_KERNEL environment variable
 * ("portable" or "nvidia_mma") overrides AUTO. */
typedef enum flashcl_kernel_family {
  FLASHCL_KERNEL_AUTO = 0,
  FLASHCL_KERNEL_PORTABLE = 1,
  FLASHCL_KERNEL_NVIDIA_MMA = 2
} flashcl_kernel_family;

/* Index names for flashcl_tensor.shape / .stride. */
enum { FLASHCL_DIM_BATCH = 0, FLASHCL_DIM_SEQ = 1, FLASHCL_DIM_HEAD = 2, FLASHCL_DIM_HEADDIM = 3 };

/*
 * A 4-D view of a cl_mem. Logical shape is (batch, seqlen, heads, head_dim) and
 * element strides follow the same order, so the element (b, n, h, x) lives at
 *   offset + (b*stride[0] + n*stride[1] + h*stride[2] + x*stride[3]) * dtype_size
 * bytes. BNHD (FlashAttention's layout) is the contiguous default; BHND is the
 * same shape with other strides. Strides must be >= 0 and the head_dim stride
 * must be 1 for q/k/v/o. The buffer (and every other cl_mem an operation takes)
 * must be a buffer object of the flashcl context's cl_context, else the call
 * fails with FLASHCL_ERROR_INVALID_ARGUMENT before enqueuing anything. The
 * init helpers below return FLASHCL_ERROR_OVERFLOW, writing nothing, when the
 * contiguous strides would pass INT64_MAX.
 */
typedef struct flashcl_tensor {
  cl_mem buffer;
  size_t offset; /* bytes */
  flashcl_dtype dtype;
  int64_t shape[4];
  int64_t stride[4];
} flashcl_tensor;

/* Contiguous (batch, seqlen, heads, head_dim) */
FLASHCL_API flashcl_status flashcl_tensor_init_bnhd(flashcl_tensor *t, cl_mem buffer, size_t offset,
                                                    flashcl_dtype dtype, int64_t batch, int64_t seqlen,
                                                    int64_t heads, int64_t head_dim);
/* Contiguous (batch, heads, seqlen, head_dim), described with the same logical shape. */
FLASHCL_API flashcl_status flashcl_tensor_init_bhnd(flashcl_tensor *t, cl_mem buffer, size_t offset,
                                                    flashcl_dtype dtype, int64_t batch, int64_t seqlen,
                                                    int64_t heads, int64_t head_dim);
/* Log-sum-exp output: fp32, contiguous (batch, heads, seqlen) like FlashAttention,
 * described as logical shape (batch, seqlen, heads, 1). */
FLASHCL_API flashcl_status flashcl_tensor_init_lse(flashcl_tensor *t, cl_mem buffer, size_t offset,
                                                   int64_t batch, int64_t seqlen, int64_t heads);

/* --------------------------------------------------------------- context -- */

typedef struct flashcl_context flashcl_context;

typedef struct flashcl_context_options {
  /* The size of this struct in the header the caller was compiled with, set
   * by flashcl_context_options_init(): a library built with a newer header, whose struct has
   * more fields at the end, reads only these bytes and gives the rest their
   * defaults. 0 (a struct zeroed by hand) means this header's size. Never set
   * it otherwise. */
  size_t struct_size;
  /* Device choice: NULL uses $FLASHCL_DEVICE, and if that is unset the first GPU,
   * else the first device of any type. Syntax: "<platform>:<device>" indices
   * (e.g. "0:1"), or a case-insensitive substring of "<platform name> <device name>
   * (<platform vendor>)", e.g. "nvidia", "pocl". */
  const char *device;
  /* Create the queue with CL_QUEUE_PROFILING_ENABLE (benchmarks need it). */
  int profiling;
  /* Print diagnostics (device choice, build logs, block sizes) to stderr. */
  int verbose;
  /* Read kernels from this directory instead of the embedded copies (for kernel
   * development). NULL uses $FLASHCL_KERNEL_DIR, and if unset the embedded sources. */
  const char *kernel_dir;
  /* A tuning file (README "Tuning") searched before every other source. NULL
   * uses $FLASHCL_TUNING; "" names none. */
  const char *tuning_file;
  /* The per-user cache directory: tuning files in <cache_dir>/tuning, compiled
   * programs in <cache_dir>/programs. NULL uses $FLASHCL_CACHE_DIR, else
   * $XDG_CACHE_HOME/flashcl, else $HOME/.cache/flashcl. */
  const char *cache_dir;
  /* 1: never read or write compiled programs in the cache directory. */
  int no_binary_cache;
  /* 1: only the tuning_file and the built-in database are searched (no cache
   * directory, no installed share/flashcl/tuning): reproducible tests. */
  int no_user_tuning;
  /* Appended to every kernel's build options (diagnostics, e.g. -cl-nv-verbose). */
  const char *build_options;
  /* The most <cache_dir>/programs may hold, in bytes: after each write the least
   * recently used entries are removed until it fits (entries of older drivers,
   * versions and kernels are never read again). 0: FLASHCL_CACHE_MAX_BYTES_DEFAULT. */
  uint64_t cache_max_bytes;
} flashcl_context_options;

/* The default limit of the program cache (256 MiB: several hundred programs). */
#define FLASHCL_CACHE_MAX_BYTES_DEFAULT ((uint64_t)256 << 20)

/* The library fills the first `size` bytes (sizeof the caller's struct) with
 * the defaults and sets struct_size; flashcl_context_options_init() passes the size. */
FLASHCL_API flashcl_status flashcl_context_options_init_size(flashcl_context_options *options, size_t size);
static inline void flashcl_context_options_init(flashcl_context_options *options) {
  (void)flashcl_context_options_init_size(options, sizeof *options);
}

/* options may be NULL (defaults). */
FLASHCL_API flashcl_status flashcl_context_create(const flashcl_context_options *options,
                                                  flashcl_context **out);
/* Wraps the caller's objects (each is clRetain'ed and released on destroy).
 * queue must belong to context and device. options may be NULL; its device and
 * profiling fields are ignored. */
FLASHCL_API flashcl_status flashcl_context_create_from_cl(cl_context context, cl_device_id device,
                                                          cl_command_queue queue,
                                                          const flashcl_context_options *options,
                                                          flashcl_context **out);
FLASHCL_API void flashcl_context_destroy(flashcl_context *ctx);

/* What the context did with its program cache, since it was created. */
typedef struct flashcl_context_stats {
  unsigned programs_built;      /* compiled from source (clBuildProgram on source) */
  unsigned programs_from_cache; /* loaded from <cache_dir>/programs as binaries */
  unsigned cache_rejected;      /* cache entries found truncated, corrupt or stale: rebuilt */
  unsigned cache_written;       /* entries written to the cache */
} flashcl_context_stats;

FLASHCL_API flashcl_status flashcl_context_stats_get(const flashcl_context *ctx, flashcl_context_stats *stats);

/* The last error message for this context ("" if none); includes kernel build
 * logs. Per thread: the message of the calling thread's last call on ctx,
 * valid until that thread's next call on ctx (other threads' calls leave it
 * alone). A thread whose last call went to another context (or that made
 * none) gets a copy of the message of ctx's latest call, from whichever
 * thread, valid until its next call on a context. With ctx NULL: the calling
 * thread's last message from a call that had no context to keep it in, such
 * as a failed flashcl_context_create (why no device matched, which OpenCL
 * call failed); valid until the thread's next such call. */
FLASHCL_API const char *flashcl_context_last_error(const flashcl_context *ctx);

/* The context's OpenCL objects (not retained for the caller). */
FLASHCL_API cl_context flashcl_context_cl_context(const flashcl_context *ctx);
FLASHCL_API cl_device_id flashcl_context_cl_device(const flashcl_context *ctx);
FLASHCL_API cl_command_queue flashcl_context_cl_queue(const flashcl_context *ctx);

typedef struct flashcl_device_info {
  char platform_name[128];
  char device_name[128];
  char device_version[128];
  int is_gpu;
  size_t local_mem_size;     /* M, bytes */
  size_t max_work_group_size;
  cl_uint compute_units;
  cl_ulong global_mem_size;
  cl_ulong max_mem_alloc_size;
  int has_fp16;              /* cl_khr_fp16 */
} flashcl_device_info;

FLASHCL_API flashcl_status flashcl_context_device_info(const flashcl_context *ctx, flashcl_device_info *info);

/* Local memory per work-group, in bytes, that the flash kernels plan their tiles
 * against (never less than local_mem_size, M): M, except on devices whose
 * driver runs work-groups with more than it reports, where the first call
 * that plans tiles probes for more (docs/kernels.md). The tuning entry
 * "context : local_probe=0" skips the probe. The automatic block plans and the
 * explicit block sizes are checked against it (see README, "Block sizes"); a
 * plan's local_bytes counts any extra tile a probe allowed. */
FLASHCL_API flashcl_status flashcl_context_local_memory(flashcl_context *ctx, size_t *bytes);

/* ------------------------------------------------------------- attention -- */

/*
 * Mask layouts. With Lq, Lk the per-sequence lengths (seqlen_q / seqlen_k of the
 * tensors, or max_seqlen_q / max_seqlen_k for varlen, where sequence s of the
 * packed batch takes the place of batch entry s and its query i / key j count
 * from the start of the sequence), H = heads_q if mask.per_head else 1:
 *   FLASHCL_MASK_BLOCK: rows R = ceil(Lq / mask.block_q), columns
 *     C = ceil(Lk / mask.block_k); block (r, c) covers queries
 *     [r * mask.block_q, (r + 1) * mask.block_q) and keys
 *     [c * mask.block_k, (c + 1) * mask.block_k).
 *   FLASHCL_MASK_BITS: R = Lq, C = Lk, one bit per (query, key) (tree masks of
 *     speculative decoding, arbitrary sparsity).
 * Both are row-major bit matrices of W = ceil(C / 32) uint32 words per row:
 *   bit (c % 32) of word [((b * H + h) * R + r) * W + c / 32]
 * (b: batch entry or varlen sequence, h: query head or 0). The buffer needs at
 * least batch * H * R * W * 4 bytes (FLASHCL_ERROR_BUFFER_TOO_SMALL otherwise).
 * Bits past column C - 1 are ignored; a sequence shorter than Lq / Lk uses the
 * leading rows / columns of its matrix.
 */
typedef enum flashcl_mask_kind {
  FLASHCL_MASK_NONE = 0,
  FLASHCL_MASK_BLOCK = 1,
  FLASHCL_MASK_BITS = 2
} flashcl_mask_kind;

/*
 * The descriptor of a forward or backward call is split by concern: each group
 * below is its own struct, a member of flashcl_attention_desc (desc.mask.causal,
 * desc.score.softcap, ...). flashcl_attention_desc_init() gives every field its
 * default; fill only the groups a call needs.
 */

/* Head counts and V's head dim. */
typedef struct flashcl_shape_desc {
  /* 0 takes them from the q and k tensors; if set they must match the tensors.
   * heads_q must be a multiple of heads_kv (GQA/MQA): query head h reads
   * key/value head h / (heads_q / heads_kv). */
  int heads_q;
  int heads_kv;
  /* Head dim of v and o (and of d_o and dv in the backward) when it differs from
   * q and k's (MLA-style models, e.g. DeepSeek's prefill with d_qk = 192 and
   * d_v = 128). 0 (the default) means v and o have q's head dim, and any other
   * v/o head dim is FLASHCL_ERROR_INVALID_SHAPE. When > 0, v.shape[3] and
   * o.shape[3] (d_o and dv too) must equal it, q and k keep head_dim_qk =
   * q.shape[3], both multiples of 8, head_dim_qk in [8, 576] and head_dim_v in
   * [8, 512]. Q K^T reduces over head_dim_qk, P V over head_dim_v; the default
   * scale stays 1/sqrt(head_dim_qk). Which kernel families run it:
   * docs/api.md, "Separate head dim for V" (a family that does not is refused
   * when asked for by name, and AUTO skips it). */
  int head_dim_v;
} flashcl_shape_desc;

/* Variable-length (packed) batches. When cu_seqlens_q is non-NULL, q/o have
 * shape (1, total_q, heads, d) and k/v shape (1, total_k, heads_kv, d); sequence
 * s owns rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) of q and the matching range of
 * cu_seqlens_k in k/v. Both are int32 buffers of num_seqs + 1 non-decreasing
 * entries starting at 0; max_seqlen_* bound the per-sequence lengths. The LSE
 * tensor then has shape (1, total_q, heads_q, 1). max_seqlen_k also bounds a
 * paged source's key counts (flashcl_paged_desc). */
typedef struct flashcl_varlen_desc {
  cl_mem cu_seqlens_q;
  cl_mem cu_seqlens_k;
  int num_seqs;
  int max_seqlen_q;
  int max_seqlen_k;
} flashcl_varlen_desc;

/* How a KV cache is stored: flashcl_attention_decode, flashcl_kv_cache_append and
 * a forward's paged source read the same layout (see "The KV cache" at
 * flashcl_decode_desc for the page tables, "Quantized KV cache" for the scales).
 * The default (all 0 / NULL) is a contiguous, plain cache. */
typedef struct flashcl_kv_layout {
  /* Paged cache: page_size >= 1 and block_table with max_pages >= 1 int32
   * entries per sequence. All three 0 / NULL for a contiguous cache (decode
   * and the append refuse page_size or max_pages without a table; a
   * forward reads none of the layout without one). */
  int page_size;
  cl_mem block_table;
  int max_pages;
  /* Scales of a quantized k / v cache: fp32 buffers in the layout of
   * k_scale_kind / v_scale_kind (default FLASHCL_KV_SCALE_TOKEN, which the
   * append fills). Ignored for a plain cache. */
  cl_mem k_scale;
  cl_mem v_scale;
  flashcl_kv_scale k_scale_kind;
  flashcl_kv_scale v_scale_kind;
} flashcl_kv_layout;

/* A paged K/V source (chunked prefill over a paged KV cache). cache.block_table
 * NULL (the default) is off. When set, k and v are the page pools of the decode
 * cache: (num_pages, page_size, Hkv, d) tensors with page_size = cache.page_size
 * (which must equal k.shape[1]), and cache.block_table is an int32 buffer
 * [B][cache.max_pages] (B = q's batch): sequence b's key j lives in slot
 * j % page_size of page block_table[b * max_pages + j / page_size] (page indices
 * clamped to [0, num_pages) on the device). seqlens is an int32 buffer [B] of
 * key counts L_b, including the Nq new tokens, which must already be in the
 * cache (append them with flashcl_kv_cache_append first): q (B, Nq, Hq, d) holds
 * the LAST Nq positions of each sequence, so diag = L_b - Nq per sequence
 * (bottom-right causal alignment, as everywhere). varlen.max_seqlen_k (0:
 * max_pages * page_size) bounds L_b; device lengths are clamped to [0, that
 * bound]. A query row that sees no key (L_b < Nq - i) gets O = 0 and
 * LSE = -inf. Dropout, the window, ALiBi, softcap and masks compose as usual
 * (indices count from the start of the sequence; mask columns: Lk = the
 * bound). Varlen chunks: with varlen.cu_seqlens_q set (and cu_seqlens_k NULL:
 * the key counts are seqlens), q and o are packed (1, total_q, Hq, d) as for
 * varlen, sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s+1]),
 * which are the last Nq_s positions of its L_s keys (diag = L_s - Nq_s), and
 * B = num_seqs. A quantized source: k and v may each be stored as FLASHCL_I8,
 * FLASHCL_F8E4M3, FLASHCL_F8E5M2 or FLASHCL_I4X2 instead of q's dtype, with
 * the decode cache's codes and scales (cache.k_scale / v_scale and their
 * kinds; TOKEN and BLOCK32 rows are page * page_size + slot); a quantized side
 * needs its scale buffer (FLASHCL_ERROR_INVALID_ARGUMENT, or BUFFER_TOO_SMALL
 * when smaller than its layout), and a quantized k or v without a paged
 * source is FLASHCL_ERROR_DTYPE_MISMATCH. Forward only, on the flash kernels
 * and the naive path; the backward with a paged source returns
 * FLASHCL_ERROR_UNSUPPORTED. */
typedef struct flashcl_paged_desc {
  flashcl_kv_layout cache;
  cl_mem seqlens; /* int32 [B] */
} flashcl_paged_desc;

/* Which (query, key) pairs are visible, besides the window of
 * flashcl_score_desc. With diag = Nk - Nq (per sequence for varlen):
 *   causal: key j hidden from query i iff j > i + diag (aligned to the
 *     bottom-right corner, as FlashAttention-2: query i of a sequence with Nq
 *     queries and Nk keys sees key j iff j <= i + (Nk - Nq)).
 *   kind != FLASHCL_MASK_NONE: an explicit mask (block-sparse or one bit per
 *     pair), see README "Block-sparse and bitmask attention" and
 *     flashcl_mask_kind for the layouts of `bits`. A 0 bit hides its pair or
 *     block.
 * Everything composes by intersection (a key is visible iff every rule lets it
 * through, the window and varlen lengths included); ALiBi / softcap apply to
 * the visible scores. A query row that sees no key gets O = 0 and LSE = -inf
 * (no NaN), dq = 0, and unseen keys get dK = dV = 0. The flash kernels skip
 * K/V tiles whose mask bits are all 0, forward and backward, so their runtime
 * falls with the mask's density. */
typedef struct flashcl_mask_desc {
  bool causal;
  flashcl_mask_kind kind; /* FLASHCL_MASK_NONE (default) ignores the fields below */
  cl_mem bits;            /* uint32 words, the layout of kind, from byte 0 */
  int block_q;            /* FLASHCL_MASK_BLOCK: queries per mask block (>= 1) */
  int block_k;            /* FLASHCL_MASK_BLOCK: keys per mask block (>= 1) */
  bool per_head;          /* false: one mask per sequence, shared by all query
                             heads; true: one per (sequence, query head) */
} flashcl_mask_desc;

/* Score variants (FlashAttention-2's), shared by flashcl_attention_desc and
 * flashcl_decode_desc (README "Masks and score variants"). With diag = Nk - Nq
 * (per sequence for varlen), query i and key j:
 *   s = scale * q_i . k_j
 *   softcap > 0:        s = softcap * tanh(s / softcap)
 *   alibi_slopes:       s = s - slope[h] * |j - (i + diag)|   (h: the query head)
 *   window_left >= 0:   key j hidden iff j < i + diag - window_left
 *   window_right >= 0:  key j hidden iff j > i + diag + window_right
 *   (the mask's causal rule is window_right = 0; they compose by intersection)
 * in this order, then softmax; LSE is log sum_j exp(s) of the final scores.
 * They run on every kernel family and the naive path, forward and backward
 * (decode: see flashcl_decode_desc). */
typedef struct flashcl_score_desc {
  /* Softmax scale applied to QK^T. 0 means 1/sqrt(head_dim) (q's head dim). */
  float scale;
  /* 0 (off) or a finite value > 0. */
  float softcap;
  /* NULL (off) or an fp32 buffer of at least heads_q floats. */
  cl_mem alibi_slopes;
  /* Attention sinks (gpt-oss): NULL (off) or an fp32 buffer of at least heads_q
   * logits, sink[h] in the units of the scaled scores. Each row of query head h
   * takes one more softmax entry of logit sink[h] that carries no value: it
   * enters the row's max and sum, so O = sum_j P_j V_j with
   * P_j = exp(s_j - LSE) and LSE = log(exp(sink[h]) + sum_j exp(s_j)). A row
   * that sees no key gets O = 0 and LSE = sink[h]. The backward takes the
   * forward's LSE (which includes the sinks); its gradient is
   * flashcl_backward_desc.dsinks. */
  cl_mem sinks;
  /* -1 (the default of *_desc_init) is unbounded; values < -1 are invalid. */
  int window_left;
  int window_right;
} flashcl_score_desc;

/* Dropout probability p in [0, 1) applied to P; kept entries are scaled by
 * 1/(1 - p). The mask is regenerated from (seed, offset), never stored; see
 * README "Dropout" for the counter layout. */
typedef struct flashcl_dropout_desc {
  float p;
  uint64_t seed;
  uint64_t offset;
} flashcl_dropout_desc;

/* Which algorithm and kernels run, and with which tuning. */
typedef struct flashcl_algorithm_desc {
  flashcl_algo algo;
  flashcl_kernel_family kernel;
  /* Tile sizes for the portable flash kernels: query rows (Br) and key rows (Bc)
   * per tile, forward and backward; 0 takes them from the tuning sources or the
   * local-memory rule (README "Block sizes"). Non-zero values must be multiples
   * of 8, and they are shorthand for the fwd/bwd parameters br and bc: a call
   * that runs another family fails with FLASHCL_ERROR_UNSUPPORTED rather than
   * ignore them (use `tuning` there). */
  int block_r;
  int block_c;
  /* Per-call tuning (see "Tuning" below). NULL (the default) takes the
   * configuration from the context's tuning sources. Otherwise its family must be
   * one this call can run (its parameters replace the database's for this call);
   * a family the call cannot run, or parameters that do not fit this device or
   * problem, fail with FLASHCL_ERROR_UNSUPPORTED and a message. */
  const struct flashcl_tuning *tuning;
} flashcl_algorithm_desc;

/* What only the backward reads. */
typedef struct flashcl_backward_desc {
  /* true (the default) makes dQ bit-reproducible: it is computed in its own
   * kernel or in split accumulators added in a fixed order (docs/api.md,
   * "Backward: dQ modes"). false accumulates
   * dQ with fp32 atomics inside the dK/dV kernel (fewer FLOPs, order-dependent
   * rounding); it permits atomics rather than demanding them (docs/kernels.md
   * lists the head dims that stay deterministic). */
  bool deterministic;
  /* NULL, or an fp32 buffer of >= heads_q floats that gets dL/dsink[h] =
   * -sum over the rows of head h of exp(sink[h] - LSE) * rowsum(dO * O); it
   * must not overlap any other buffer of the call. */
  cl_mem dsinks;
} flashcl_backward_desc;

/* The groups are fixed once released: a later release adds fields (or new
 * groups) at the end of flashcl_attention_desc only, so struct_size keeps
 * older programs working (see struct_size). */
typedef struct flashcl_attention_desc {
  /* The size of this struct in the header the caller was compiled with, set
   * by flashcl_attention_desc_init(): a library built with a newer header, whose struct has
   * more fields at the end, reads only these bytes and gives the rest their
   * defaults. 0 (a struct zeroed by hand) means this header's size. Never set
   * it otherwise. */
  size_t struct_size;
  flashcl_shape_desc shape;
  flashcl_score_desc score;
  flashcl_mask_desc mask;
  flashcl_varlen_desc varlen;
  flashcl_paged_desc paged;
  flashcl_dropout_desc dropout;
  flashcl_backward_desc backward;
  flashcl_algorithm_desc algorithm;
} flashcl_attention_desc;


/* Host-side block layouts for FLASHCL_MASK_BLOCK (pure C, no device), over an
 * nbq x nbk block matrix with block (i, j) (i: query block, j: key block):
 *   LOCAL (param w >= 1):     visible iff |i - j| < w  (a band of 2w - 1 diagonals)
 *   STRIDED (param s >= 1):   visible iff |i - j| < s or j % s == s - 1 (the local
 *                             band plus every s-th "summary" column, as the fixed
 *                             pattern of Sparse Transformers)
 *   BUTTERFLY (param L >= 0): visible iff i == j or i XOR j == 2^k for some k
 *                             (with L > 0, only k < L): the flat block butterfly
 *                             of the block-sparse FlashAttention experiments,
 *                             1 + log2(n) blocks per row for n = 2^m blocks
 * Compose with causal through desc.mask.causal (intersection). */
typedef enum flashcl_block_layout {
  FLASHCL_BLOCK_LOCAL = 0,
  FLASHCL_BLOCK_STRIDED = 1,
  FLASHCL_BLOCK_BUTTERFLY = 2
} flashcl_block_layout;

/* Words (uint32) of one nrows x ncols bit matrix: nrows * ceil(ncols / 32).
 * FLASHCL_ERROR_INVALID_ARGUMENT for sizes < 1 or a NULL out,
 * FLASHCL_ERROR_OVERFLOW if it does not fit size_t. */
FLASHCL_API flashcl_status flashcl_mask_words(int nrows, int ncols, size_t *words);

/* Writes the layout into words[0 .. flashcl_mask_words(nbq, nbk)) (every word,
 * padding bits 0), in the row layout above (one head, one sequence: replicate it
 * for more). FLASHCL_ERROR_INVALID_ARGUMENT for an unknown layout, nbq or nbk < 1,
 * a bad param or NULL words; FLASHCL_ERROR_BUFFER_TOO_SMALL when capacity (in
 * words) is short. Nothing is written on failure. */
FLASHCL_API flashcl_status flashcl_block_mask_fill(flashcl_block_layout layout, int nbq, int nbk, int param,
                                                   uint32_t *words, size_t capacity);

/* The library fills the first `size` bytes (sizeof the caller's struct) with
 * the defaults and sets struct_size; flashcl_attention_desc_init() passes the size. */
FLASHCL_API flashcl_status flashcl_attention_desc_init_size(flashcl_attention_desc *desc, size_t size);
static inline void flashcl_attention_desc_init(flashcl_attention_desc *desc) {
  (void)flashcl_attention_desc_init_size(desc, sizeof *desc);
}

/*
 * O = softmax(scale * Q K^T + mask) V, per batch and query head.
 *   q: (B, Nq, Hq, d)   k, v: (B, Nk, Hkv, d)   o: (B, Nq, Hq, d)
 *   (with desc.shape.head_dim_v = dv > 0: v (B, Nk, Hkv, dv) and o (B, Nq, Hq, dv))
 *   q, k, v and o share one dtype; head_dim is a multiple of 8 in [8, 576]
 *   (v and o's at most 512; past 256 the portable kernels and the naive path
 *   run, as MLA's 576 / 512 needs).
 *   lse (nullable): fp32, (B, Nq, Hq, 1) logical shape, gets the natural-log
 *   log-sum-exp of each scaled score row: lse = log(sum_j exp(scale * q.k_j)).
 *   o and lse must not share elements with q, k, v or each other
 *   (FLASHCL_ERROR_INVALID_ARGUMENT; interleaved views of one buffer, such as q
 *   and o as the halves of a packed [B][N][2][H][d] buffer, are fine), and must
 *   not name one element twice (a zero or too small stride:
 *   FLASHCL_ERROR_INVALID_STRIDE). The same rules hold for the outputs of the
 *   backward, decode, merge and flashcl_kv_cache_append (its caches). Outputs
 *   must also share no byte with the buffers the descriptor names (cu_seqlens,
 *   alibi_slopes, mask, block tables and lengths), and decode's workspace range
 *   none with any tensor or buffer of the call (INVALID_ARGUMENT). Other ranges
 *   of the same cl_mem are fine, so one arena buffer can hold them all.
 * The call is asynchronous: it waits on wait_list and, if out_event is non-NULL,
 * returns an event that completes when o and lse are written.
 */
FLASHCL_API flashcl_status flashcl_attention_forward(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                     const flashcl_tensor *q, const flashcl_tensor *k,
                                                     const flashcl_tensor *v, const flashcl_tensor *o,
                                                     const flashcl_tensor *lse, cl_uint num_events_in_wait_list,
                                                     const cl_event *event_wait_list, cl_event *out_event);

/*
 * Gradients of flashcl_attention_forward with the same desc (scale, causal, GQA,
 * varlen, dropout). o and lse are the forward's outputs (lse is required).
 * dq has q's shape, dk has k's shape and dv v's (d_o has o's: with
 * desc.shape.head_dim_v set, d_o, o, v and dv have head dim head_dim_v); all share
 * q's dtype. With GQA, dk and
 * dv are summed over the query heads that share a key/value head. Query rows
 * that see no key get dq = 0 and contribute nothing to dk/dv.
 * dq, dk and dv must not share elements with q, k, v, o, lse, d_o or each other
 * (interleaved views of one buffer, such as a packed dQKV, are fine): the
 * kernels that write them run while others still read the inputs, and in
 * deterministic mode on GPUs dQ and dK/dV are computed at the same time.
 */
FLASHCL_API flashcl_status flashcl_attention_backward(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                      const flashcl_tensor *q, const flashcl_tensor *k,
                                                      const flashcl_tensor *v, const flashcl_tensor *o,
                                                      const flashcl_tensor *lse, const flashcl_tensor *d_o,
                                                      const flashcl_tensor *dq, const flashcl_tensor *dk,
                                                      const flashcl_tensor *dv, cl_uint num_events_in_wait_list,
                                                      const cl_event *event_wait_list, cl_event *out_event);

/*
 * Debug/test entry point: writes the dropout keep-mask that desc->dropout's p,
 * seed and offset select, one byte per entry (1 = kept, 0 = dropped), at
 * mask[((b * heads_q + h) * seqlen_q + i) * seqlen_k + j]. Forward and backward
 * apply exactly this mask (before any causal or length masking). mask needs
 * batch * heads_q * seqlen_q * seqlen_k bytes.
 */
FLASHCL_API flashcl_status flashcl_dropout_mask(flashcl_context *ctx, const flashcl_attention_desc *desc, int batch,
                                                int heads_q, int seqlen_q, int seqlen_k, cl_mem mask,
                                                cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                cl_event *out_event);

typedef enum flashcl_pass { FLASHCL_PASS_FORWARD = 0, FLASHCL_PASS_BACKWARD = 1 } flashcl_pass;

/* Scratch device memory (bytes) the call would allocate for the algorithm that
 * desc->algorithm.algo resolves to, beyond q/k/v/o/lse. Runs the same validation as the
 * operation. For pass BACKWARD on a device with the tensor-core kernels, the
 * kernel family also depends on the alignment of o, dO and the gradients, which
 * this call does not see: it reports the larger of the two families' figures. */
FLASHCL_API flashcl_status flashcl_attention_workspace_size(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                            const flashcl_tensor *q, const flashcl_tensor *k,
                                                            const flashcl_tensor *v, flashcl_pass pass,
                                                            size_t *bytes);

/* The flash kernel family the operation would run for these arguments on ctx:
 * FLASHCL_KERNEL_PORTABLE or FLASHCL_KERNEL_NVIDIA_MMA (AUTO, desc->algorithm.kernel and
 * $FLASHCL_KERNEL resolved; a problem the tensor-core kernels do not cover
 * resolves to PORTABLE, with the reason in the verbose log), or
 * FLASHCL_KERNEL_AUTO when desc->algorithm.algo resolves to NAIVE (no flash kernel runs).
 * Runs the forward's validation; the first call may build the tensor-core probe.
 * For pass BACKWARD the tensor-core kernels also need dO, dQ, dK and dV rows
 * that are 16-byte aligned, which this call does not see. Fails like the
 * operation when NVIDIA_MMA is requested on a device without it. */
FLASHCL_API flashcl_status flashcl_attention_kernel_family(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                           const flashcl_tensor *q, const flashcl_tensor *k,
                                                           const flashcl_tensor *v, const flashcl_tensor *o,
                                                           flashcl_pass pass, flashcl_kernel_family *family);

/* The portable forward's tile plan for this head_dim and dtype on ctx's device
 * (with the tuning sources applied). It does not say which family a call runs:
 * flashcl_attention_config() reports what really runs, for every family. */
typedef struct flashcl_block_plan {
  int block_r;      /* Br: query rows per work-group */
  int block_c;      /* Bc: key/value rows per tile */
  int threads;      /* work-group size */
  size_t local_bytes; /* local memory per work-group */
} flashcl_block_plan;

FLASHCL_API flashcl_status flashcl_attention_block_plan(flashcl_context *ctx, int head_dim, flashcl_dtype dtype,
                                                        int block_r, int block_c, flashcl_block_plan *plan);

/* ----------------------------------------------- inference: decode, merge -- */

/*
 * Merges two partial attention results over disjoint key sets into the result
 * over their union (the associative merge of FlashDecoding / cascade attention):
 *   m = max(lse_a, lse_b),  w_a = exp(lse_a - m),  w_b = exp(lse_b - m)
 *   o = (w_a * o_a + w_b * o_b) / (w_a + w_b),   lse = m + log(w_a + w_b)
 * per row (batch, seq, head). A side whose LSE is -inf contributes nothing, so the
 * result is the other side (bit-exact for the LSE); when both are -inf the row
 * gets o = 0 and lse = -inf, never NaN. LSE values must not be +inf or NaN.
 *   o_a, o_b, o: (B, N, H, d), one dtype, head_dim a multiple of 8 in [8, 512]
 *   (o's head dims, MLA's 512 included)
 *   lse_a, lse_b, lse: fp32 (B, N, H, 1) (flashcl_tensor_init_lse or any strides)
 *   lse may be NULL (only o is written).
 * Aliasing: o may be exactly the view o_a or o_b (same buffer, offset and strides),
 * and lse exactly lse_a or lse_b, for an in-place merge. Any other overlap between
 * an output and an input or between the two outputs is rejected with
 * FLASHCL_ERROR_INVALID_ARGUMENT.
 */
FLASHCL_API flashcl_status flashcl_merge_states(flashcl_context *ctx, const flashcl_tensor *o_a,
                                                const flashcl_tensor *lse_a, const flashcl_tensor *o_b,
                                                const flashcl_tensor *lse_b, const flashcl_tensor *o,
                                                const flashcl_tensor *lse, cl_uint num_events_in_wait_list,
                                                const cl_event *event_wait_list, cl_event *out_event);

/* Largest q_len (query tokens per sequence) flashcl_attention_decode accepts. */
#define FLASHCL_DECODE_MAX_Q_LEN 16
/* Largest explicit num_splits. */
#define FLASHCL_DECODE_MAX_SPLITS 256

/*
 * The KV cache of flashcl_attention_decode and flashcl_kv_cache_append, whose
 * descriptors hold its layout as `cache` (a flashcl_kv_layout).
 *
 * Contiguous (cache.block_table == NULL): k_cache and v_cache are (B, max_len, Hkv, d)
 *   tensors (any strides, unit head_dim stride; v_cache's d may be smaller, see
 *   flashcl_attention_decode); sequence b's token j is row j of batch entry b.
 * Paged (cache.block_table != NULL): k_cache and v_cache are pools of pages described as
 *   (num_pages, page_size, Hkv, d) tensors: "batch" indexes the page and "seqlen"
 *   the slot in the page (the contiguous default is [num_pages][page_size][Hkv][d],
 *   i.e. flashcl_tensor_init_bnhd(t, buf, 0, dtype, num_pages, page_size, Hkv, d)).
 *   block_table is an int32 buffer [B][max_pages]: sequence b's token j lives in
 *   slot j % page_size of page block_table[b * max_pages + j / page_size].
 *   page_size must equal k_cache.shape[1]. On the device, page indices are clamped
 *   to [0, num_pages) when reading (a corrupt table reads a wrong page, never
 *   outside the pool); the append skips tokens whose page index is out of range.
 * Capacity of a sequence: max_len (contiguous) or max_pages * page_size (paged).
 *
 * Quantized KV cache. k_cache and v_cache may each, independently, be stored as
 * FLASHCL_I8, FLASHCL_F8E4M3 or FLASHCL_F8E5M2 (one byte per element, same (pages or
 * batch, slots, Hkv, d) views and element strides as a plain cache) or
 * FLASHCL_I4X2 (4-bit codes, two per byte: a (pages or batch, slots, Hkv, d / 2)
 * view of bytes, its offset and strides in bytes) instead of
 * q's dtype. Element value = (float)code * scale, in fp32, where code is:
 *   I8:     the byte as a two's-complement integer (-128..127; the append
 *           writes -127..127).
 *   I4X2:   element 2i of a row is the low nibble of the row's byte i, 2i + 1
 *           the high nibble, each a two's-complement integer (-8..7; the
 *           append writes -7..7). With BLOCK32 scales this is ggml's q4_0
 *           with its scales apart (and its nibbles in element order).
 *   F8E4M3: bits S EEEE MMM, bias 7: E = 0: (-1)^S * M/8 * 2^-6 (subnormal);
 *           else (-1)^S * (1 + M/8) * 2^(E-7); E = 15, M = 7 is NaN; no inf
 *           (largest finite 448, code 0x7e).
 *   F8E5M2: bits S EEEEE MM, bias 15 (the top byte of an IEEE binary16):
 *           E = 0: M/4 * 2^-14; E = 31: inf (M = 0), NaN (M != 0); else
 *           (1 + M/4) * 2^(E-15) (largest finite 57344, code 0x7b).
 * The scales are fp32 buffers (desc.cache.k_scale for k_cache, desc.cache.v_scale for
 * v_cache, read from byte 0) whose layout is chosen by k_scale_kind /
 * v_scale_kind:
 *   FLASHCL_KV_SCALE_TENSOR: 1 float for the whole cache.
 *   FLASHCL_KV_SCALE_HEAD:   Hkv floats, scale[h] for kv head h.
 *   FLASHCL_KV_SCALE_TOKEN:  one float per cache row (slot, kv head), dense
 *     whatever the cache's strides: contiguous (B, max_len, Hkv) with
 *     scale[(b * max_len + j) * Hkv + h]; paged (num_pages, page_size, Hkv) with
 *     scale[(page * page_size + slot) * Hkv + h].
 *   FLASHCL_KV_SCALE_BLOCK32: one float per 32 consecutive elements of each
 *     cache row, as ggml's q8_0 has (head_dim a multiple of 32): element e of
 *     row r (r numbered as for TOKEN) has scale[(r * Hkv + h) * (d / 32) + e / 32].
 * A quantized cache without its scale buffer, or with a buffer smaller than
 * its layout, fails with FLASHCL_ERROR_INVALID_ARGUMENT /
 * FLASHCL_ERROR_BUFFER_TOO_SMALL and writes nothing. Plain caches ignore the
 * scale fields. flashcl_kv_cache_append quantizes on write (k_new / v_new in
 * q's plain dtype, f32/f16/bf16): with TOKEN scales it first writes each new
 * row's scale = absmax / qmax, absmax = max |x| over the row's d values in
 * fp32 and qmax = 127 (I8), 7 (I4X2), 448 (E4M3), 57344 (E5M2) (BLOCK32: each block's
 * scale from the absmax of its 32 values); with TENSOR or HEAD
 * scales it reads the caller's scale. Each value is then coded from
 * y = x / scale (fp32): I8 rounds y to nearest, ties to even, and clamps to
 * [-127, 127] (NaN gives 0), I4X2 likewise to [-7, 7]; fp8 rounds y to the
 * nearest representable value, ties to even, saturating at the largest finite value (inf too), NaN gives
 * the format's NaN (0x7f / 0x7e with the sign). A scale of 0 (a row of zeros
 * under TOKEN) stores code 0 (+0) for every element of the row. A scale
 * buffer the append writes must share no byte with any other buffer of the
 * call (the other side's scales included), one it reads none with the caches,
 * and the decode's none with o, lse or the workspace
 * (FLASHCL_ERROR_INVALID_ARGUMENT). Which decode
 * kernels take quantized caches, and how they dequantize: docs/inference.md,
 * "Quantized KV cache (int8, fp8, int4)".
 */
/* The cache's layout (page table, scales) is a flashcl_kv_layout, declared
 * with flashcl_attention_desc, whose paged source takes it too. */

/* How decode splits each sequence's keys (FlashDecoding). */
typedef struct flashcl_decode_split {
  /* Number of chunks each sequence's keys are split into, each chunk
   * processed by its own work-groups and merged by a second kernel. 0 chooses from
   * the device's compute units, batch x heads_kv and max_seqlen_k; 1 disables the
   * split (one kernel, no workspace). At most FLASHCL_DECODE_MAX_SPLITS. */
  int num_splits;
  /* Host-side upper bound of seqlens_k used to choose num_splits (device lengths
   * are not read back). 0 means the cache capacity. Lengths above it are still
   * handled correctly, with chunks that are larger than planned. */
  int max_seqlen_k;
  /* Scratch for the split partials. NULL: the context keeps one scratch buffer
   * for all its decode calls, allocated on first need, replaced by a larger one
   * when a call needs more (never shrunk) and released by flashcl_context_destroy;
   * on an out-of-order queue each such call waits for the previous one's kernels
   * (an in-order queue orders them already). Otherwise at least
   * flashcl_attention_decode_workspace_size() bytes from workspace_offset, and it
   * must not be used by anything else until the call's event completes; a
   * caller's workspace bypasses the context's scratch (no allocation, no added
   * wait). */
  cl_mem workspace;
  size_t workspace_offset;
} flashcl_decode_split;

/* Fields are added at the end only (see flashcl_attention_desc). */
typedef struct flashcl_decode_desc {
  /* The size of this struct in the header the caller was compiled with, set
   * by flashcl_decode_desc_init(): a library built with a newer header, whose struct has
   * more fields at the end, reads only these bytes and gives the rest their
   * defaults. 0 (a struct zeroed by hand) means this header's size. Never set
   * it otherwise. */
  size_t struct_size;
  /* 0 takes them from q and k_cache; if set they must match. heads_q must be a
   * multiple of heads_kv: query head h reads kv head h / (heads_q / heads_kv). */
  int heads_q;
  int heads_kv;
  /* The cache's page table and scales (see above). */
  flashcl_kv_layout cache;
  /* Score variants, with flashcl_attention_desc's meaning and checks: query t of
   * sequence b sits at position i = L_b - q_len + t, key j is hidden iff
   * j < i - window_left (window_left >= 0) or j > i + window_right
   * (window_right >= 0), on top of the causal rule or the tree; s = softcap *
   * tanh(s / softcap) when softcap > 0, then s -= alibi_slopes[h] * |j - i|;
   * sinks as in the forward. A left window also narrows the keys the splits
   * cover to the window. Which decode kernels run which variant:
   * docs/inference.md (AUTO skips a kernel that does not). */
  flashcl_score_desc score;
  /* Speculative-decoding tree over the q_len new tokens (optional): a buffer of
   * B * q_len uint32 words. Word b * q_len + t is query t's view of its sequence's
   * new tokens: bit u set means query t sees new token u (key L_b - q_len + u).
   * Every query sees all keys before the new tokens. NULL keeps the causal rule
   * (bit u set for u <= t). Set bit t for a token to see itself; a query that
   * sees no key gets O = 0 and LSE = -inf. Bits at or above q_len are ignored. */
  cl_mem tree_mask;
  flashcl_decode_split split;
  /* Kernel family, as for the forward (docs/inference.md, "Decode kernels"): AUTO (the
   * default) takes the device's fastest decode kernel that covers the call.
   * PORTABLE forces the portable kernel; a vendor family fails with
   * FLASHCL_ERROR_UNSUPPORTED where the device lacks it, and runs the portable
   * kernel on problems it does not cover. */
  flashcl_kernel_family kernel;
  /* Per-call tuning of family FLASHCL_TUNE_DECODE (see "Tuning"), or NULL. */
  const struct flashcl_tuning *tuning;
} flashcl_decode_desc;

/* The library fills the first `size` bytes (sizeof the caller's struct) with
 * the defaults and sets struct_size; flashcl_decode_desc_init() passes the size. */
FLASHCL_API flashcl_status flashcl_decode_desc_init_size(flashcl_decode_desc *desc, size_t size);
static inline void flashcl_decode_desc_init(flashcl_decode_desc *desc) {
  (void)flashcl_decode_desc_init_size(desc, sizeof *desc);
}

/*
 * Attention of a few new query tokens per sequence against a (paged or contiguous)
 * KV cache, split over the keys (FlashDecoding).
 *   q: (B, q_len, Hq, d), 1 <= q_len <= FLASHCL_DECODE_MAX_Q_LEN; o: q's shape,
 *     with v_cache's head dim
 *   d: a multiple of 8 in [8, 576] (MLA's decode: 576; past 256 the portable
 *     kernel runs), else FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM
 *   k_cache, v_cache: see flashcl_decode_desc; v_cache (and o) may have a head
 *     dim dv of their own (MLA-like: a multiple of 8 in [8, min(d, 512)]; dv > d
 *     is FLASHCL_ERROR_INVALID_SHAPE, others FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM;
 *     o must take dv (INVALID_SHAPE); the portable kernel runs such calls,
 *     and flashcl_kv_cache_append takes v_new with dv); q, o and the caches share a dtype,
 *     except that each cache may instead be quantized (I8, F8E4M3, F8E5M2 with
 *     desc.cache.k_scale / v_scale: "Quantized KV cache" above)
 *   seqlens_k: int32 buffer [B], sequence b's KV length L_b, including the q_len
 *     new tokens, which must already be the cache's last q_len entries (append
 *     them first). Query t (0-based) of sequence b sees keys j <= L_b - q_len + t
 *     (causal, bottom-right aligned; desc.tree_mask replaces that rule among
 *     the new tokens). L_b is clamped on the device to [0, capacity];
 *     a query that sees no key (causal: L_b < q_len - t) gets O = 0 and
 *     LSE = -inf.
 *   lse (nullable): fp32 (B, q_len, Hq, 1), natural-log LSE of each row.
 * One work-group handles every query head of a kv head's GQA group for all q_len
 * queries, so each K/V tile is read from global memory once per group.
 * q_len > FLASHCL_DECODE_MAX_Q_LEN gives FLASHCL_ERROR_INVALID_SHAPE; o and lse
 * must not overlap q, the caches or each other (FLASHCL_ERROR_INVALID_ARGUMENT).
 */
FLASHCL_API flashcl_status flashcl_attention_decode(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                                    const flashcl_tensor *q, const flashcl_tensor *k_cache,
                                                    const flashcl_tensor *v_cache, cl_mem seqlens_k,
                                                    const flashcl_tensor *o, const flashcl_tensor *lse,
                                                    cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                    cl_event *out_event);

/* Scratch bytes flashcl_attention_decode needs for these arguments (0 when it
 * runs unsplit); the same validation as the call (o, lse and seqlens_k are not
 * needed). *num_splits (nullable) receives the number of splits it would use. */
FLASHCL_API flashcl_status flashcl_attention_decode_workspace_size(flashcl_context *ctx,
                                                                   const flashcl_decode_desc *desc,
                                                                   const flashcl_tensor *q,
                                                                   const flashcl_tensor *k_cache,
                                                                   const flashcl_tensor *v_cache, size_t *bytes,
                                                                   int *num_splits);

/* What flashcl_kv_cache_append needs to know of the cache: its layout, the
 * same flashcl_kv_layout the decode descriptor holds (copy desc.cache over).
 * Fields are added at the end only (see flashcl_attention_desc). */
typedef struct flashcl_kv_append_desc {
  /* As flashcl_attention_desc.struct_size, set by flashcl_kv_append_desc_init(). */
  size_t struct_size;
  flashcl_kv_layout cache;
} flashcl_kv_append_desc;

FLASHCL_API flashcl_status flashcl_kv_append_desc_init_size(flashcl_kv_append_desc *desc, size_t size);
static inline void flashcl_kv_append_desc_init(flashcl_kv_append_desc *desc) {
  (void)flashcl_kv_append_desc_init_size(desc, sizeof *desc);
}

/*
 * Writes new tokens into the cache: k_new[b, t] and v_new[b, t], (B, T, Hkv, d) of
 * one plain dtype (f32, f16 or bf16) that is the dtype of each plain cache
 * (a quantized cache takes any of the three and quantizes on write, see
 * "Quantized KV cache" above), go to positions seqlens[b] + t of sequence b
 * (t < T), with the cache layout desc->cache (page table; for quantized
 * caches the scales).
 * seqlens is an int32 buffer [B] of lengths BEFORE the append; it is not modified
 * (add T yourself, e.g. before calling flashcl_attention_decode). Positions outside
 * [0, capacity) and, for a paged cache, tokens whose page index is outside
 * [0, num_pages) are skipped. The head dims are those decode takes (k's a
 * multiple of 8 in [8, 576], v's one in [8, min(k's, 512)]): v's above k's is
 * FLASHCL_ERROR_INVALID_SHAPE, the others FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM.
 */
FLASHCL_API flashcl_status flashcl_kv_cache_append(flashcl_context *ctx, const flashcl_kv_append_desc *desc,
                                                   const flashcl_tensor *k_new, const flashcl_tensor *v_new,
                                                   const flashcl_tensor *k_cache, const flashcl_tensor *v_cache,
                                                   cl_mem seqlens, cl_uint num_events_in_wait_list,
                                                   const cl_event *event_wait_list, cl_event *out_event);

/* ---------------------------------------------------------------- tuning -- */
/*
 * Every kernel family's choices (tiles, work-item mappings, unrolling, stages,
 * split counts) are parameters of a declared tuning space: each parameter has a
 * name, a legal range and the candidates flashcl-tune searches. A configuration
 * is a list of name=value pairs of one family; a parameter it leaves out keeps
 * the family's default rule. Sources, first match wins (README "Tuning"):
 *   1. the call's desc.algorithm.tuning (decode: desc.tuning);
 *   2. options.tuning_file, else $FLASHCL_TUNING;
 *   3. <cache_dir>/tuning/\*.tune (written by flashcl-tune);
 *   4. the installed share/flashcl/tuning/\*.tune;
 *   5. the built-in database (tuning/\*.tune of the source tree, embedded);
 *   6. the default rules.
 * A file is used only when its header matches the device (platform vendor,
 * device name, driver version) and flashcl's version; a header line may say
 * "*" for any, and a file with no header lines (an override file) matches every
 * device. A file for another device or version, or one that does not parse, is
 * skipped whole, with the reason in flashcl_context_tuning_log().
 */
typedef enum flashcl_tuning_family {
  FLASHCL_TUNE_NONE = -1,     /* no flash kernel runs (the naive path) */
  FLASHCL_TUNE_FWD = 0,       /* "fwd": the portable forward (cl/portable/flash_fwd.cl) */
  FLASHCL_TUNE_BWD = 1,       /* "bwd": the portable backward (cl/portable/flash_bwd.cl) */
  FLASHCL_TUNE_MMA_FWD = 2,   /* "mma_fwd": tensor-core forward */
  FLASHCL_TUNE_MMA_BWD = 3,   /* "mma_bwd": tensor-core backward */
  FLASHCL_TUNE_WGMMA_FWD = 4, /* "wgmma_fwd": the Hopper forward (docs/kernels.md) */
  FLASHCL_TUNE_DECODE = 5,    /* "decode": decode and its split merge */
  FLASHCL_TUNE_CONTEXT = 6,   /* "context": context-wide (local memory, probes) */
  FLASHCL_TUNE_FAMILY_COUNT = 7
} flashcl_tuning_family;

typedef enum flashcl_tuning_source {
  FLASHCL_TUNING_SOURCE_DEFAULT = 0,   /* the default rules */
  FLASHCL_TUNING_SOURCE_BUILTIN = 1,   /* the built-in database */
  FLASHCL_TUNING_SOURCE_INSTALLED = 2, /* share/flashcl/tuning */
  FLASHCL_TUNING_SOURCE_CACHE = 3,     /* <cache_dir>/tuning */
  FLASHCL_TUNING_SOURCE_FILE = 4,      /* options.tuning_file / $FLASHCL_TUNING */
  FLASHCL_TUNING_SOURCE_CALL = 5       /* the call's tuning */
} flashcl_tuning_source;

#define FLASHCL_TUNING_MAX_PARAMS 24
#define FLASHCL_TUNING_NAME_CAP 24

typedef struct flashcl_tuning_param {
  char name[FLASHCL_TUNING_NAME_CAP];
  int value;
} flashcl_tuning_param;

/* One configuration of one family. Fill it with flashcl_tuning_init and
 * flashcl_tuning_set (or flashcl_tuning_parse), which check every name and value
 * against the declared space. */
typedef struct flashcl_tuning {
  flashcl_tuning_family family;
  int count;
  flashcl_tuning_param params[FLASHCL_TUNING_MAX_PARAMS];
} flashcl_tuning;

FLASHCL_API void flashcl_tuning_init(flashcl_tuning *tuning, flashcl_tuning_family family);
/* Sets (or replaces) one parameter. FLASHCL_ERROR_INVALID_ARGUMENT, with the
 * reason in ctx's message (ctx may be NULL), for a name the family does not
 * declare or a value outside its legal range; nothing is changed then. */
FLASHCL_API flashcl_status flashcl_tuning_set(flashcl_context *ctx, flashcl_tuning *tuning, const char *name,
                                              int value);
/* The value of a parameter the configuration sets: FLASHCL_ERROR_INVALID_ARGUMENT
 * when it does not set it. */
FLASHCL_API flashcl_status flashcl_tuning_get(const flashcl_tuning *tuning, const char *name, int *value);
/* Parses "family name=value name=value ..." (the text after a tuning file's
 * ":" with the family in front, e.g. "fwd br=64 bc=32"). All or nothing. */
FLASHCL_API flashcl_status flashcl_tuning_parse(flashcl_context *ctx, const char *text, flashcl_tuning *tuning);
/* Writes the configuration as flashcl_tuning_parse reads it. BUFFER_TOO_SMALL
 * (nothing written) when it does not fit cap bytes with its NUL. */
FLASHCL_API flashcl_status flashcl_tuning_format(const flashcl_tuning *tuning, char *buf, size_t cap);

/* "fwd", "bwd", ... ("none" for FLASHCL_TUNE_NONE, "?" when unknown). */
FLASHCL_API const char *flashcl_tuning_family_name(flashcl_tuning_family family);
FLASHCL_API flashcl_status flashcl_tuning_family_parse(const char *name, flashcl_tuning_family *family);
FLASHCL_API const char *flashcl_tuning_source_name(flashcl_tuning_source source);

/* One parameter of a family's declared space. Legal values: min <= v <= max
 * with (v - min) % step == 0. candidates: the values flashcl-tune searches
 * (a subset of the legal ones). */
typedef struct flashcl_tuning_param_info {
  const char *name;
  const char *description;
  int min, max, step;
  const int *candidates;
  int num_candidates;
} flashcl_tuning_param_info;

/* Parameter `index` (0, 1, ...) of the family's space; FLASHCL_ERROR_INVALID_ARGUMENT
 * past the last one (or for an unknown family). */
FLASHCL_API flashcl_status flashcl_tuning_space(flashcl_tuning_family family, int index,
                                                flashcl_tuning_param_info *info);

/* What a call will run, and where its configuration came from. */
typedef struct flashcl_config {
  flashcl_tuning_family family; /* FLASHCL_TUNE_NONE on the naive path */
  flashcl_tuning_source source; /* where the parameters that were set came from */
  char origin[256];             /* the file (or "built-in: <file>", "default rules", "call") */
  char kernel[64];              /* the main kernel's name */
  /* Every parameter of the family as it will run (the default rule's values
   * where no source set them), so two configurations that resolve to the same
   * kernel compare equal. */
  flashcl_tuning tuning;
  /* Only the parameters the source set (the call's tuning, or the matching entry of a
   * tuning file or the built-in database); count 0 under the default rules.
   * Passed as the call's tuning it reproduces this configuration, and flashcl-tune
   * starts its search from it. */
  flashcl_tuning set;
  int block_r, block_c; /* query rows per work-group, keys per tile (decode: rows, tile) */
  int threads;          /* work-items per work-group */
  size_t local_bytes;   /* local memory per work-group */
} flashcl_config;

/* The configuration flashcl_attention_forward (pass FORWARD) or _backward
 * (pass BACKWARD) would run with these arguments: the same validation and
 * family choice as the call (desc.algorithm.tuning included: a tuning the call would
 * refuse is refused here). For the backward, dO and the gradients are taken to
 * be laid out like q/k (their alignment can move the choice to the portable
 * kernels). The first call may build and run the device probes. */
FLASHCL_API flashcl_status flashcl_attention_config(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                    const flashcl_tensor *q, const flashcl_tensor *k,
                                                    const flashcl_tensor *v, const flashcl_tensor *o,
                                                    flashcl_pass pass, flashcl_config *config);
/* The same for flashcl_attention_decode (family FLASHCL_TUNE_DECODE; o and
 * seqlens are not needed). */
FLASHCL_API flashcl_status flashcl_decode_config(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                                 const flashcl_tensor *q, const flashcl_tensor *k_cache,
                                                 const flashcl_tensor *v_cache, flashcl_config *config);

/* The context's cache directory (options.cache_dir resolved as documented
 * there), "" when none could be named. flashcl-tune writes to its tuning/. */
FLASHCL_API const char *flashcl_context_cache_dir(const flashcl_context *ctx);

/* What the context's tuning lookup did when it was created: the device key, each
 * source tried, loaded or skipped and why (one line each). Never NULL. */
FLASHCL_API const char *flashcl_context_tuning_log(const flashcl_context *ctx);
/* The header lines a tuning file for this context's device starts with
 * (flashcl-tune writes them). BUFFER_TOO_SMALL when cap is short. */
FLASHCL_API flashcl_status flashcl_context_tuning_header(const flashcl_context *ctx, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* FLASHCL_H */
