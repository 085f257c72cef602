/*
 * flashcl-bench: timings of the flash and naive attention algorithms (forward,
 * and with --bwd the backward pass) over a sweep of sequence lengths, head dims,
 * dtypes and causal masks.
 *
 * Each run is bracketed by two markers on the context's (profiling) queue; the
 * time is END(after) - END(before), i.e. the device time of everything the call
 * enqueued. The reported figure is the median over --reps runs after --warmup
 * untimed runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "bench_first_call.h"
#include "bench_report.h"
#include "common.h"

#define MAX_ALGOS 4

typedef struct bench_opts {
  const char *device;
  tools_list n, d, dtype, causal, algo;
  int have_n, have_d, have_dtype, have_causal;
  long batch_tokens, hidden, gqa;
  long reps, warmup;
  int have_batch_tokens, have_hidden, have_reps, have_warmup;
  double budget_s, dropout;
  int csv, json, quiet, check, bhnd, verbose, bwd, deterministic;
  flashcl_kernel_family kernel;
  int decode, have_decode_batch; /* --decode, --decode-batch */
  long page_size, calls; /* --page-size, --calls */
  long q_len;            /* --q-len */
  int tree;              /* --tree */
  tools_list decode_batch;
  const char *block_sparse; /* --block-sparse DENSITY_LIST */
  long window;              /* --window: window_left, -1 = none */
  double softcap;           /* --softcap */
  int alibi;                /* --alibi */
  int sinks;                /* --sinks */
  tools_list kv_dtype;      /* --kv-dtype: the decode caches' storage (-1: --dtype's) */
  int have_kv_dtype;
  int kv_scale;             /* --kv-scale: the quantized caches' flashcl_kv_scale */
  int have_kv_scale;
  long head_dim_v;          /* --head-dim-v: v and o's head dim (0: --d's) */
} bench_opts;

/* Buffers and tensors of one (N, d, dtype) config. */
typedef struct config_bufs {
  /* q k v o lse d_o dq dk dv, ALiBi slopes, --page-size: block table, key counts, sinks, dsinks,
   * --page-size --kv-dtype: K codes, V codes, their scales */
  cl_mem mem[17];
  flashcl_tensor q, k, v, o, lse, d_o, dq, dk, dv;
  flashcl_tensor kp, vp; /* --page-size: k and v as page pools */
  long pages_per_seq;
  size_t q_count, kv_count; /* elements of q (dq) and of k (dk) */
  size_t o_count, v_count;  /* elements of o (d_o) and of v (dv): --head-dim-v's head dim */
  size_t fwd_io, bwd_io; /* bytes the pass reads/writes besides its workspace */
} config_bufs;

typedef struct row {
  int algo;
  flashcl_pass pass;
  int status; /* 0 ok, else flashcl/OpenCL status */
  int oom;    /* status means out of memory (or skipped as too large) */
  int ran, reps;
  double median_ms, min_ms;
  size_t workspace;
  flashcl_block_plan plan;
  int have_plan;
  int family; /* flash rows: the flashcl_kernel_family that ran (0 when unknown) */
  flashcl_config cfg; /* flash rows: what ran and where its tuning came from */
  int have_cfg;
  float *out[3]; /* outputs as float for the flash/naive comparison: o, or dq, dk, dv */
  size_t out_count[3];
  int nout;
} row;

static const char usage_text[] =
    "usage: flashcl-bench [options]\n"
    "\n"
    "Times flashcl_attention_forward (and with --bwd flashcl_attention_backward),\n"
    "flash and naive, on one device.\n"
    "Per config: batch = max(1, batch_tokens / N), heads = max(1, hidden / d).\n"
    "\n"
    "  --device SPEC        \"<platform>:<device>\" or a name substring (default:\n"
    "                       $FLASHCL_DEVICE, else first GPU, else first device)\n"
    "  --n LIST             sequence lengths, e.g. 128,256,1k,16k\n"
    "                       (default GPU: 128..16384, other devices: 128..4096)\n"
    "  --d LIST             head dims (default 64,128 on GPU, 64 otherwise)\n"
    "  --dtype LIST         f32,f16,bf16 (default f16,f32)\n"
    "  --causal 0|1|both    (default both)\n"
    "  --algo LIST          flash,naive (default both)\n"
    "  --batch-tokens T     batch * N (default 16384 on GPU, 2048 otherwise)\n"
    "  --hidden H           heads * d (default 2048 on GPU, 256 otherwise)\n"
    "  --gqa G              query heads per key/value head (default 1)\n"
    "  --layout bnhd|bhnd   tensor layout (default bnhd)\n"
    "  --kernel auto|portable|nvidia_mma  flash kernel family (default auto; with\n"
    "                       --decode, nvidia_mma is the cp.async decode path)\n"
    "  --decode             time flashcl_attention_decode instead (q_len from --q-len, 32 query\n"
    "                       heads, 32/gqa kv heads (default 8), d from --d (default\n"
    "                       128), dtype from --dtype (default f16), KV lengths from\n"
    "                       --n (default GPU 1k..128k, other devices 256,1k,4k));\n"
    "                       reports GB/s = K+V bytes read / median time\n"
    "  --decode-batch LIST  batches for --decode (default GPU 1,8,64, else 1,8)\n"
    "  --first-call         time from main() to the first forward result instead: context,\n"
    "                       device inputs, first call (builds or cache loads), second call\n"
    "                       (takes --n, --d, --dtype, --causal, --batch, --heads; default\n"
    "                       d=128 f16 N=4096; --driver-first times a bare OpenCL context\n"
    "                       first, apart from flashcl's)\n"
    "  --calls C            --decode: time C back-to-back calls between two markers and\n"
    "                       report the time per call (default 1: one call, so the\n"
    "                       host's enqueue time is inside the timed span); host_us\n"
    "                       is the host time of one flashcl_attention_decode call\n"

    "  --q-len T            --decode: new tokens per sequence (default 1, at most 16)\n"
    "  --kv-dtype LIST      --decode: the caches' storage, same (--dtype's; the default), i8,\n"
    "                       f8e4m3, f8e5m2, i4x2 (quantized; fp32 scales as --kv-scale says);\n"
    "                       the dtype column then reads e.g. f16/i8, and GB/s counts codes\n"
    "                       and scales. With --page-size and no --decode, one format for\n"
    "                       the paged forward's K and V pools (random codes, scales 1/64)\n"
    "  --head-dim-v DV      v and o's head dim (desc.shape.head_dim_v), q and k keeping --d's;\n"
    "                       the d column then reads e.g. 192/128, and TFLOP/s counts\n"
    "                       2 d + 2 DV per visible pair forward, 6 d + 4 DV backward;\n"
    "                       with --decode (one --d) v_cache and o, e.g. --d 576\n"
    "                       --head-dim-v 512 (MLA), GB/s counting K's d and V's DV\n"
    "  --kv-scale KIND      --kv-dtype's scales: token (one per token and kv head; the\n"
    "                       default), head (one per kv head), tensor (one) or block32\n"
    "                       (one per 32 elements of a token's row, as ggml's q8_0)\n"
    "  --tree               --decode: desc.tree_mask with a binary draft tree over the\n"
    "                       q_len tokens (token t sees t and its ancestors, parent\n"
    "                       (t - 1) / 2) instead of the causal rule\n"
    "  --page-size P        --decode with a paged cache of P-token pages (default 0:\n"
    "                       contiguous); without --decode, the forward reads K and V\n"
    "                       as page pools of P-token pages through an identity block\n"
    "                       table (desc.paged.cache.block_table: chunked prefill over a paged\n"
    "                       cache; BNHD, forward only, N a multiple of P)\n"
    "  --block-sparse LIST  time the flash forward with a FLASHCL_MASK_BLOCK mask at\n"
    "                       each density in LIST (e.g. 1,0.5,0.25,0.125): N from --n\n"
    "                       (default GPU 16k, else 2k), first --d (64) and --dtype\n"
    "                       (GPU f16, else f32), non-causal, 128 x 128 mask blocks\n"
    "                       (64 x 64 off GPU); time vs density (with --bwd, the\n"
    "                       backward's too)\n"
    "  --bwd                also time the backward pass (after one untimed forward\n"
    "                       that writes o and lse)\n"
    "  --deterministic 0|1  backward dQ mode (default 1, see flashcl.h)\n"
    "  --dropout P          dropout probability for both passes (default 0)\n"
    "  --window L           sliding window: each query sees the L keys before its\n"
    "                       diagonal and, unless causal, every key after it\n"
    "                       (desc.score.window_left = L); TFLOP/s then counts the\n"
    "                       visible (query, key) pairs exactly; --decode: GB/s\n"
    "                       counts the K/V rows of the window only\n"
    "  --softcap C          logit soft-capping C * tanh(s / C) (desc.score.softcap)\n"
    "  --alibi              ALiBi with the geometric slopes 2^(-8 (h + 1) / heads)\n"
    "  --sinks              attention sinks (desc.score.sinks, logit 1 per head); with --bwd also\n"
    "                       their gradient (desc.backward.dsinks)\n"
    "  --reps R             timed runs, median reported (default 10 on GPU, 3 otherwise)\n"
    "  --warmup W           untimed runs first (default 2 on GPU, 1 otherwise)\n"
    "  --budget S           cap on timed seconds per row: fewer reps (at least 1)\n"
    "                       when a run is slow (default 10)\n"
    "  --no-check           skip the flash-vs-naive output comparison (relL2 column)\n"
    "  --csv                machine-readable CSV on stdout (a header line, then one\n"
    "                       line per row)\n"
    "  --json               machine-readable JSON on stdout instead: one object with\n"
    "                       \"device\" (platform, device, driver, date, flashcl\n"
    "                       version), \"rows\" (the CSV columns; null where a value is\n"
    "                       missing, \"status\" on every row) and \"summary\"\n"
    "  --quiet, -q          no progress lines on stderr (they only show when stderr\n"
    "                       is a terminal: a row that runs over a second updates one\n"
    "                       line with its run count and elapsed time) and no\n"
    "                       estimate before a row expected to take over a minute\n"
    "  --verbose            library diagnostics on stderr\n"
    "\n"
    "TFLOP/s counts 4*N*N*d (forward) or 10*N*N*d (backward, FlashAttention's\n"
    "convention) per head and batch, half of that when causal.\n"
    "Br x Bc shows the portable kernel's tiles, or \"mma\" when the NVIDIA\n"
    "tensor-core kernels ran (flashcl_attention_kernel_family).\n"
    "speedup (on flash rows) = naive median / flash median.\n"
    "relL2 (on flash rows) = ||x_flash - x_naive|| / ||x_naive|| for x = o, or the\n"
    "largest of the three for x = dq, dk, dv.\n"
    "A row that runs out of device memory prints OOM; other errors print the\n"
    "status and the library's message on stderr and make the exit status 1.\n"
    "The table starts with a legend of its columns and ends with a summary line\n"
    "(rows ok, failed, OOM, total time, best flash/naive speedup). The table, CSV\n"
    "and JSON go to stdout; messages, progress and build logs to stderr.\n";

static void usage(FILE *f) { fputs(usage_text, f); }

/* (query, key) pairs the FLOP count covers: N^2, half of it when causal
 * (FlashAttention's convention), and with a window exactly the visible ones. */
static double visible_pairs(long n, int causal, long window) {
  if (window < 0) return (double)n * (double)n * (causal ? 0.5 : 1.0);
  double pairs = 0.0;
  for (long i = 0; i < n; ++i) {
    const long lo = i - window > 0 ? i - window : 0, hi = causal ? i : n - 1;
    pairs += (double)(hi - lo + 1);
  }
  return pairs;
}

/* strtod over the whole string; like the options always did, "" reads as 0. */
static int parse_double(const char *s, double *v) {
  char *end = NULL;
  *v = strtod(s, &end);
  return !end || *end ? -1 : 0;
}

static int parse_dropout(const char *s, void *dest) {
  double *v = (double *)dest;
  return parse_double(s, v) || !(*v >= 0.0 && *v < 1.0) ? -1 : 0;
}

static int parse_positive_double(const char *s, void *dest) {
  double *v = (double *)dest;
  return parse_double(s, v) || !(*v > 0.0) ? -1 : 0;
}

/* --deterministic takes exactly "0" or "1". */
static int parse_bit(const char *s, void *dest) {
  if (strcmp(s, "0") && strcmp(s, "1")) return -1;
  *(int *)dest = s[0] == '1';
  return 0;
}

static int parse_layout(const char *s, void *dest) { return tools_parse_layout(s, (int *)dest); }

/* --kv-scale: token, head, tensor or block32 (the flashcl_kv_scale order). */
static const char *const kv_scale_names[] = {"token", "head", "tensor", "block32"};
static int parse_kv_scale(const char *text, void *dest) {
  for (int i = 0; i < 4; ++i)
    if (!strcmp(text, kv_scale_names[i])) {
      *(int *)dest = i;
      return 0;
    }
  return -1;
}

/* --kv-dtype: "same" (the --dtype), i8, f8e4m3, f8e5m2, i4x2. */
static int parse_kv_dtype_list(const char *text, void *dest) {
  tools_list *out = (tools_list *)dest;
  char buf[256];
  out->count = 0;
  if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf) return -1;
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    long v = -2;
    if (!strcmp(tok, "same")) v = -1;
    else
      for (int dt = FLASHCL_I8; dt <= FLASHCL_I4X2; ++dt)
        if (!strcmp(tok, flashcl_dtype_name((flashcl_dtype)dt))) v = dt;
    if (v == -2 || out->count >= TOOLS_MAX_LIST) return -1;
    out->v[out->count++] = v;
  }
  return out->count ? 0 : -1;
}

static args_status parse_table(int argc, char **argv, bench_opts *o) {
  const args_opt table[] = {
      {.name = "--device", .kind = ARG_STRING, .dest = &o->device},
      {.name = "--n", .kind = ARG_INT_LIST, .dest = &o->n, .seen = &o->have_n},
      {.name = "--d", .kind = ARG_INT_LIST, .dest = &o->d, .seen = &o->have_d},
      {.name = "--dtype", .kind = ARG_DTYPE_LIST, .dest = &o->dtype, .seen = &o->have_dtype},
      {.name = "--causal", .kind = ARG_CAUSAL_LIST, .dest = &o->causal, .seen = &o->have_causal},
      {.name = "--algo", .kind = ARG_ALGO_LIST, .dest = &o->algo, .hi = MAX_ALGOS},
      {.name = "--batch-tokens", .kind = ARG_LONG, .dest = &o->batch_tokens, .seen = &o->have_batch_tokens, .lo = 1,
       .hi = LONG_MAX},
      {.name = "--hidden", .kind = ARG_LONG, .dest = &o->hidden, .seen = &o->have_hidden, .lo = 1, .hi = LONG_MAX},
      {.name = "--gqa", .kind = ARG_LONG, .dest = &o->gqa, .lo = 1, .hi = LONG_MAX},
      {.name = "--layout", .kind = ARG_CUSTOM, .dest = &o->bhnd, .parse = parse_layout},
      {.name = "--kernel", .kind = ARG_KERNEL, .dest = &o->kernel},
      {.name = "--deterministic", .kind = ARG_CUSTOM, .dest = &o->deterministic, .parse = parse_bit},
      {.name = "--dropout", .kind = ARG_CUSTOM, .dest = &o->dropout, .parse = parse_dropout},
      {.name = "--window", .kind = ARG_LONG, .dest = &o->window, .lo = 0, .hi = LONG_MAX},
      {.name = "--softcap", .kind = ARG_CUSTOM, .dest = &o->softcap, .parse = parse_positive_double},
      {.name = "--alibi", .kind = ARG_FLAG, .dest = &o->alibi},
      {.name = "--sinks", .kind = ARG_FLAG, .dest = &o->sinks},
      {.name = "--kv-dtype", .kind = ARG_CUSTOM, .dest = &o->kv_dtype, .seen = &o->have_kv_dtype,
       .parse = parse_kv_dtype_list},
      {.name = "--kv-scale", .kind = ARG_CUSTOM, .dest = &o->kv_scale, .seen = &o->have_kv_scale,
       .parse = parse_kv_scale},
      {.name = "--head-dim-v", .kind = ARG_LONG, .dest = &o->head_dim_v, .lo = 1, .hi = 4096},
      {.name = "--reps", .kind = ARG_LONG, .dest = &o->reps, .seen = &o->have_reps, .lo = 1, .hi = LONG_MAX},
      {.name = "--warmup", .kind = ARG_LONG, .dest = &o->warmup, .seen = &o->have_warmup, .lo = 0, .hi = LONG_MAX},
      {.name = "--budget", .kind = ARG_CUSTOM, .dest = &o->budget_s, .parse = parse_positive_double},
      {.name = "--decode-batch", .kind = ARG_INT_LIST, .dest = &o->decode_batch, .seen = &o->have_decode_batch},
      {.name = "--page-size", .kind = ARG_LONG, .dest = &o->page_size, .lo = 0, .hi = LONG_MAX},
      {.name = "--calls", .kind = ARG_LONG, .dest = &o->calls, .lo = 1, .hi = 1000},
      {.name = "--q-len", .kind = ARG_LONG, .dest = &o->q_len, .lo = 1, .hi = FLASHCL_DECODE_MAX_Q_LEN},
      {.name = "--tree", .kind = ARG_FLAG, .dest = &o->tree},
      {.name = "--block-sparse", .kind = ARG_STRING, .dest = &o->block_sparse},
      {.name = "--decode", .kind = ARG_FLAG, .dest = &o->decode},
      {.name = "--bwd", .kind = ARG_FLAG, .dest = &o->bwd},
      {.name = "--no-check", .kind = ARG_CLEAR, .dest = &o->check},
      {.name = "--csv", .kind = ARG_FLAG, .dest = &o->csv},
      {.name = "--json", .kind = ARG_FLAG, .dest = &o->json},
      {.name = "--quiet", .alias = "-q", .kind = ARG_FLAG, .dest = &o->quiet},
      {.name = "--verbose", .alias = "-v", .kind = ARG_FLAG, .dest = &o->verbose},
      {.name = "--help", .alias = "-h", .kind = ARG_HELP},
  };
  return args_parse(argc, argv, "flashcl-bench", table, ARGS_COUNT(table));
}

static args_status parse_args(int argc, char **argv, bench_opts *o) {
  memset(o, 0, sizeof *o);
  o->calls = 1;
  o->q_len = 1;
  o->gqa = 1;
  o->budget_s = 10.0;
  o->check = 1;
  o->deterministic = 1;
  o->kernel = FLASHCL_KERNEL_AUTO;
  o->window = -1;
  tools_parse_algo_list("flash,naive", &o->algo);
  const args_status st = parse_table(argc, argv, o);
  if (st == ARGS_OK && o->page_size && !o->decode && (o->bwd || o->bhnd || o->block_sparse)) {
    fprintf(stderr, "flashcl-bench: --page-size without --decode times the paged forward: it does not combine "
                    "with --bwd, --layout bhnd or --block-sparse\n");
    return ARGS_BAD_VALUE;
  }
  if (st == ARGS_OK && o->have_kv_dtype && !o->decode && (!o->page_size || o->kv_dtype.count != 1)) {
    fprintf(stderr, "flashcl-bench: --kv-dtype needs --decode, or --page-size with one format (the paged "
                    "forward's pools)\n");
    return ARGS_BAD_VALUE;
  }
  if (st == ARGS_OK && o->head_dim_v && o->decode && o->have_d && o->d.count > 1) {
    fprintf(stderr, "flashcl-bench: --head-dim-v with --decode takes one --d\n");
    return ARGS_BAD_VALUE;
  }
  if (st == ARGS_OK && o->have_kv_scale && !o->have_kv_dtype) {
    fprintf(stderr, "flashcl-bench: --kv-scale needs --kv-dtype (it sets the quantized caches' scales)\n");
    return ARGS_BAD_VALUE;
  }
  if (st == ARGS_OK && o->csv && o->json) {
    fprintf(stderr, "flashcl-bench: --csv and --json are mutually exclusive\n");
    return ARGS_BAD_VALUE;
  }
  return st;
}

/* Defaults depend on the device: a full sweep on GPUs, a short one elsewhere
 * (PoCL on a 2-core CPU finishes it in a few minutes: ~2 idle, ~5 under load). */
static void apply_defaults(bench_opts *o, int is_gpu) {
  if (!o->have_n) tools_parse_int_list(is_gpu ? "128,256,512,1024,2048,4096,8192,16384" : "128,256,512,1024,2048,4096",
                                       &o->n);
  if (!o->have_d) tools_parse_int_list(is_gpu ? "64,128" : "64", &o->d);
  if (!o->have_dtype) tools_parse_dtype_list("f16,f32", &o->dtype);
  if (!o->have_causal) tools_parse_causal_list("both", &o->causal);
  if (!o->have_batch_tokens) o->batch_tokens = is_gpu ? 16384 : 2048;
  if (!o->have_hidden) o->hidden = is_gpu ? 2048 : 256;
  if (!o->have_reps) o->reps = is_gpu ? 10 : 3;
  if (!o->have_warmup) o->warmup = is_gpu ? 2 : 1;
}

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* Releases the buffers; the sizes stay (OOM rows still report them). */
static void release_bufs(config_bufs *b) {
  int i;
  for (i = 0; i < 17; ++i) {
    if (b->mem[i]) clReleaseMemObject(b->mem[i]);
    b->mem[i] = NULL;
  }
}

/* The optional buffers of a config: ALiBi slopes, sinks (and dsinks), the
 * paged source's block table and key counts. CL_SUCCESS or an OpenCL error. */
static cl_int alloc_extras(cl_context clctx, const bench_opts *o, long batch, long n, long heads, void *scratch,
                           config_bufs *b) {
  cl_int err = CL_SUCCESS;
  if (o->alibi) {
    float *slopes = (float *)scratch; /* scratch holds at least q_count >= heads floats */
    for (long h = 0; h < heads; ++h) slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)heads);
    b->mem[9] = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)heads * sizeof(float), slopes,
                               &err);
    if (!b->mem[9] || err) return err != CL_SUCCESS ? err : CL_MEM_OBJECT_ALLOCATION_FAILURE;
  }
  if (o->sinks) { /* logit 1: a share of each row comparable to a key's */
    float *sk = (float *)scratch;
    for (long h = 0; h < heads; ++h) sk[h] = 1.0f;
    b->mem[12] = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)heads * sizeof(float), sk, &err);
    if (b->mem[12] && o->bwd) b->mem[13] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, (size_t)heads * sizeof(float), NULL, &err);
    if (!b->mem[12] || (o->bwd && !b->mem[13]) || err) return err != CL_SUCCESS ? err : CL_MEM_OBJECT_ALLOCATION_FAILURE;
  }
  if (o->page_size) { /* the block table of the page pools over the K/V memory */
    const long P = o->page_size, per = n / P;
    cl_int *host = (cl_int *)scratch; /* scratch holds q_count >= batch * per ints */
    b->pages_per_seq = per;
    for (long i = 0; i < batch * per; ++i) host[i] = (cl_int)i;
    b->mem[10] = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(cl_int) * batch * per, host,
                                &err);
    for (long i = 0; i < batch; ++i) host[i] = (cl_int)n;
    if (b->mem[10]) b->mem[11] = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(cl_int) * batch,
                                                host, &err);
    if (!b->mem[11] || err) return err != CL_SUCCESS ? err : CL_MEM_OBJECT_ALLOCATION_FAILURE;
  }
  return CL_SUCCESS;
}

/* The paged forward's pool format under --kv-dtype (no --decode), else -1. */
static int fwd_pool_format(const bench_opts *o) {
  return !o->decode && o->page_size && o->have_kv_dtype ? (int)o->kv_dtype.v[0] : -1;
}

/* --page-size --kv-dtype: K and V pools of random codes (no NaN or inf: |E| kept
 * small) and one scale buffer for both, of --kv-scale's layout (all 1/64).
 * CL_SUCCESS or an OpenCL error. */
static cl_int alloc_quant_pools(cl_context clctx, const bench_opts *o, long heads_kv, long d, long dv,
                                config_bufs *b) {
  cl_int err = CL_SUCCESS;
  const size_t rows = b->kv_count / (size_t)d / (size_t)heads_kv, wide = (size_t)(d > dv ? d : dv);
  const size_t ns = o->kv_scale == FLASHCL_KV_SCALE_TENSOR ? 1 : o->kv_scale == FLASHCL_KV_SCALE_HEAD ? (size_t)heads_kv
                    : o->kv_scale == FLASHCL_KV_SCALE_TOKEN ? rows * (size_t)heads_kv
                                                            : rows * (size_t)heads_kv * (wide / 32 ? wide / 32 : 1);
  const size_t nc = b->kv_count > b->v_count ? b->kv_count : b->v_count;
  unsigned char *codes = malloc(nc);
  float *scale = malloc(ns * sizeof *scale);
  if (!codes || !scale) err = CL_OUT_OF_HOST_MEMORY;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; !err && i < nc; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    codes[i] = (unsigned char)((x & 0x3f) | ((x >> 8) & 0x80));
  }
  for (size_t i = 0; !err && i < ns; ++i) scale[i] = 1.0f / 64.0f;
  if (!err) b->mem[14] = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, b->kv_count, codes, &err);
  if (b->mem[14]) b->mem[15] = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, b->v_count, codes, &err);
  if (b->mem[15]) b->mem[16] = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, ns * sizeof *scale,
                                              scale, &err);
  free(codes);
  free(scale);
  return !b->mem[16] && !err ? CL_MEM_OBJECT_ALLOCATION_FAILURE : err;
}

/* Allocates the config's buffers (random q, k, v and, for --bwd, d_o). Returns
 * 0 or a status; OOM statuses are recognised by tools_is_oom. */
static int alloc_bufs(flashcl_context *ctx, const bench_opts *o, const flashcl_device_info *info, long batch, long n,
                      long heads, long heads_kv, long d, long dv, flashcl_dtype dtype, uint64_t seed, void *scratch,
                      config_bufs *b) {
  cl_context clctx = flashcl_context_cl_context(ctx);
  cl_command_queue queue = flashcl_context_cl_queue(ctx);
  const size_t esize = flashcl_dtype_size(dtype);
  const size_t lse_bytes = (size_t)batch * (size_t)heads * (size_t)n * sizeof(float);
  flashcl_status (*init)(flashcl_tensor *, cl_mem, size_t, flashcl_dtype, int64_t, int64_t, int64_t, int64_t) =
      o->bhnd ? flashcl_tensor_init_bhnd : flashcl_tensor_init_bnhd;
  cl_int err = CL_SUCCESS;
  int st = 0;

  memset(b, 0, sizeof *b);
  b->q_count = (size_t)batch * (size_t)n * (size_t)heads * (size_t)d;
  b->kv_count = (size_t)batch * (size_t)n * (size_t)heads_kv * (size_t)d;
  b->o_count = (size_t)batch * (size_t)n * (size_t)heads * (size_t)dv;
  b->v_count = (size_t)batch * (size_t)n * (size_t)heads_kv * (size_t)dv;
  const int pool_fmt = fwd_pool_format(o);
  /* Quantized pools: one byte per K/V element, half for i4x2 (their scales are not counted). */
  const size_t pack = pool_fmt == FLASHCL_I4X2 ? 2 : 1;
  b->fwd_io = (b->q_count + b->o_count) * esize + (b->kv_count + b->v_count) * (pool_fmt >= 0 ? 1 : esize) / pack;
  b->bwd_io = (2 * (b->q_count + b->kv_count + b->v_count + b->o_count)) * esize + lse_bytes;
  if ((cl_ulong)(o->bwd ? b->bwd_io : b->fwd_io) > info->global_mem_size ||
      (cl_ulong)((b->q_count > b->o_count ? b->q_count : b->o_count) * esize) > info->max_mem_alloc_size)
    return FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY;

  b->mem[0] = tools_random_buffer(clctx, queue, dtype, b->q_count, seed + 1, scratch, &err);
  if (b->mem[0]) b->mem[1] = tools_random_buffer(clctx, queue, dtype, b->kv_count, seed + 2, scratch, &err);
  if (b->mem[1]) b->mem[2] = tools_random_buffer(clctx, queue, dtype, b->v_count, seed + 3, scratch, &err);
  if (b->mem[2]) b->mem[3] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, b->o_count * esize, NULL, &err);
  if (!b->mem[3] || err) goto fail;
  if (o->bwd) {
    b->mem[4] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, lse_bytes, NULL, &err);
    if (b->mem[4]) b->mem[5] = tools_random_buffer(clctx, queue, dtype, b->o_count, seed + 4, scratch, &err);
    if (b->mem[5]) b->mem[6] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, b->q_count * esize, NULL, &err);
    if (b->mem[6]) b->mem[7] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, b->kv_count * esize, NULL, &err);
    if (b->mem[7]) b->mem[8] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, b->v_count * esize, NULL, &err);
    if (!b->mem[8] || err) goto fail;
  }
  if ((err = alloc_extras(clctx, o, batch, n, heads, scratch, b)) != CL_SUCCESS) goto fail;
  if (pool_fmt >= 0 && (err = alloc_quant_pools(clctx, o, heads_kv, d, dv, b)) != CL_SUCCESS) goto fail;
  if (o->page_size) { /* k and v as page pools: sequence b owns pages [b * n / P, (b + 1) * n / P) */
    const flashcl_dtype pdt = pool_fmt >= 0 ? (flashcl_dtype)pool_fmt : dtype;
    st = flashcl_tensor_init_bnhd(&b->kp, b->mem[pool_fmt >= 0 ? 14 : 1], 0, pdt, batch * b->pages_per_seq,
                                  o->page_size, heads_kv, d / (long)pack);
    if (!st) st = flashcl_tensor_init_bnhd(&b->vp, b->mem[pool_fmt >= 0 ? 15 : 2], 0, pdt, batch * b->pages_per_seq,
                                           o->page_size, heads_kv, dv / (long)pack);
  }
  if (!st) st = init(&b->q, b->mem[0], 0, dtype, batch, n, heads, d);
  if (!st) st = init(&b->k, b->mem[1], 0, dtype, batch, n, heads_kv, d);
  if (!st) st = init(&b->v, b->mem[2], 0, dtype, batch, n, heads_kv, dv);
  if (!st) st = init(&b->o, b->mem[3], 0, dtype, batch, n, heads, dv);
  if (!st && o->bwd) {
    st = flashcl_tensor_init_lse(&b->lse, b->mem[4], 0, batch, n, heads);
    if (!st) st = init(&b->d_o, b->mem[5], 0, dtype, batch, n, heads, dv);
    if (!st) st = init(&b->dq, b->mem[6], 0, dtype, batch, n, heads, d);
    if (!st) st = init(&b->dk, b->mem[7], 0, dtype, batch, n, heads_kv, d);
    if (!st) st = init(&b->dv, b->mem[8], 0, dtype, batch, n, heads_kv, dv);
  }
  if (st) {
    tools_print_error(stderr, ctx, "flashcl_tensor_init", st);
    release_bufs(b);
    return st;
  }
  return 0;
fail:
  release_bufs(b);
  return err != CL_SUCCESS ? err : CL_MEM_OBJECT_ALLOCATION_FAILURE;
}

static int read_output(cl_command_queue queue, const flashcl_tensor *t, size_t count, void *scratch, row *r) {
  float *dst = (float *)malloc(count * sizeof(float));
  if (!dst) return -1;
  if (tools_read_as_float(queue, t->buffer, t->dtype, count, scratch, dst) != CL_SUCCESS) {
    free(dst);
    return -1;
  }
  r->out[r->nout] = dst;
  r->out_count[r->nout] = count;
  r->nout++;
  return 0;
}

/* The row's call: desc (which points at b's slopes and block table) and the
 * tensors it reads and writes. */
static void row_call(const bench_opts *o, const config_bufs *b, int causal, const row *r, flashcl_attention_desc *desc,
                     tools_attention_args *args) {
  flashcl_attention_desc_init(desc);
  desc->mask.causal = causal;
  desc->algorithm.algo = (flashcl_algo)r->algo;
  desc->algorithm.kernel = o->kernel;
  desc->backward.deterministic = o->deterministic;
  desc->dropout.p = (float)o->dropout;
  desc->dropout.seed = 0x5eedu;
  desc->dropout.offset = 0;
  if (o->window >= 0) desc->score.window_left = (int)o->window;
  desc->score.softcap = (float)o->softcap;
  desc->score.alibi_slopes = b->mem[9];
  desc->score.sinks = b->mem[12];
  if (r->pass == FLASHCL_PASS_BACKWARD) desc->backward.dsinks = b->mem[13];
  if (o->gqa > 1) {
    desc->shape.heads_q = (int)b->q.shape[FLASHCL_DIM_HEAD];
    desc->shape.heads_kv = (int)b->k.shape[FLASHCL_DIM_HEAD];
  }
  if (o->head_dim_v) desc->shape.head_dim_v = (int)o->head_dim_v;
  memset(args, 0, sizeof *args);
  args->desc = desc;
  args->q = &b->q;
  args->k = &b->k;
  args->v = &b->v;
  args->o = &b->o;
  if (o->page_size) {
    desc->paged.cache.block_table = b->mem[10];
    desc->paged.cache.page_size = (int)o->page_size;
    desc->paged.cache.max_pages = (int)b->pages_per_seq;
    desc->paged.seqlens = b->mem[11];
    desc->paged.cache.k_scale = desc->paged.cache.v_scale = b->mem[16]; /* NULL, and not read, for plain pools */
    desc->paged.cache.k_scale_kind = desc->paged.cache.v_scale_kind = (flashcl_kv_scale)o->kv_scale;
    args->k = &b->kp;
    args->v = &b->vp;
  }
  if (r->pass == FLASHCL_PASS_BACKWARD) {
    args->lse = &b->lse;
    args->d_o = &b->d_o;
    args->dq = &b->dq;
    args->dk = &b->dk;
    args->dv = &b->dv;
  }
}

/* What the row will run (workspace, tiles, kernel family, tuning) before it runs. */
static int describe_row(flashcl_context *ctx, const tools_attention_args *a, row *r) {
  int st = flashcl_attention_workspace_size(ctx, a->desc, a->q, a->k, a->v, r->pass, &r->workspace);
  if (st != FLASHCL_SUCCESS) return st;
  if (r->algo == FLASHCL_ALGO_FLASH && r->pass == FLASHCL_PASS_FORWARD &&
      flashcl_attention_block_plan(ctx, (int)a->q->shape[FLASHCL_DIM_HEADDIM], a->q->dtype, 0, 0, &r->plan) ==
          FLASHCL_SUCCESS)
    r->have_plan = 1;
  if (r->algo == FLASHCL_ALGO_FLASH) {
    flashcl_kernel_family fam;
    if (flashcl_attention_kernel_family(ctx, a->desc, a->q, a->k, a->v, a->o, r->pass, &fam) == FLASHCL_SUCCESS)
      r->family = (int)fam;
    r->have_cfg = flashcl_attention_config(ctx, a->desc, a->q, a->k, a->v, a->o, r->pass, &r->cfg) == FLASHCL_SUCCESS;
  }
  return FLASHCL_SUCCESS;
}

/* The backward reads o and lse from this algorithm's own forward. 0, or the
 * status after recording it in r. */
static int forward_for_backward(flashcl_context *ctx, const flashcl_attention_desc *desc, config_bufs *b, row *r) {
  int st = flashcl_attention_forward(ctx, desc, &b->q, &b->k, &b->v, &b->o, &b->lse, 0, NULL, NULL);
  if (st == FLASHCL_SUCCESS) st = clFinish(flashcl_context_cl_queue(ctx));
  if (st == FLASHCL_SUCCESS) return 0;
  r->status = st;
  r->oom = tools_is_oom(st);
  if (!r->oom) {
    char what[128];
    snprintf(what, sizeof what, "  %s flashcl_attention_forward (o and lse for the backward)",
             tools_algo_name(r->algo));
    tools_print_error(stderr, ctx, what, st);
  }
  return st;
}

/* --warmup untimed runs, then up to --reps timed ones within --budget. */
static int time_row_runs(flashcl_context *ctx, const bench_opts *o, const tools_attention_args *args, row *r) {
  double times[1000], ms = 0.0, spent = 0.0;
  const long reps = o->reps < 1000 ? o->reps : 1000;
  long i;
  int st, host_timer = 0;
  for (i = 0; i < o->warmup; ++i) {
    st = tools_timed_call(ctx, r->pass, args, &ms, &host_timer);
    if (st != FLASHCL_SUCCESS) return st;
    report_rep("warmup", i + 1, o->warmup);
  }
  for (i = 0; i < reps;) {
    st = tools_timed_call(ctx, r->pass, args, &ms, &host_timer);
    if (st != FLASHCL_SUCCESS) return st;
    if (host_timer) g_report.host_timer = 1;
    times[i++] = ms;
    report_rep("rep", i, reps);
    spent += ms;
    if ((spent + ms) * 1e-3 > o->budget_s) break; /* the next run would exceed the budget */
  }
  r->reps = (int)i;
  r->min_ms = tools_min(times, r->reps);
  r->median_ms = tools_median(times, r->reps);
  r->ran = 1;
  return FLASHCL_SUCCESS;
}

/* time_row_runs, its progress line removed afterwards. */
static int time_row(flashcl_context *ctx, const bench_opts *o, const tools_attention_args *args, row *r) {
  const int st = time_row_runs(ctx, o, args, r);
  report_clear();
  return st;
}

/* The outputs as floats, for the flash-vs-naive comparison. */
static void read_outputs(cl_command_queue queue, const config_bufs *b, void *scratch, row *r) {
  int bad = 0;
  if (r->pass == FLASHCL_PASS_BACKWARD) {
    bad |= read_output(queue, &b->dq, b->q_count, scratch, r);
    bad |= read_output(queue, &b->dk, b->kv_count, scratch, r);
    bad |= read_output(queue, &b->dv, b->v_count, scratch, r);
  } else {
    bad |= read_output(queue, &b->o, b->o_count, scratch, r);
  }
  if (bad) fprintf(stderr, "  (could not read the outputs back for the comparison)\n");
}

/* Times one (pass, algo) row on allocated buffers; fills r. */
static void run_row(flashcl_context *ctx, const bench_opts *o, config_bufs *b, int causal, cl_ulong global_mem,
                    void *scratch, row *r) {
  flashcl_attention_desc desc;
  tools_attention_args args;
  int st;

  row_call(o, b, causal, r, &desc, &args);
  st = describe_row(ctx, &args, r);
  if (st == FLASHCL_SUCCESS) {
    const size_t io = r->pass == FLASHCL_PASS_BACKWARD ? b->bwd_io : b->fwd_io;
    if ((cl_ulong)io + r->workspace > global_mem) { /* cannot fit: do not even try */
      r->status = FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY;
      r->oom = 1;
      return;
    }
    if (r->pass == FLASHCL_PASS_BACKWARD && forward_for_backward(ctx, &desc, b, r)) return;
    st = time_row(ctx, o, &args, r);
  }
  if (st == FLASHCL_SUCCESS) {
    if (o->check) read_outputs(flashcl_context_cl_queue(ctx), b, scratch, r);
    return;
  }
  r->status = st;
  r->oom = tools_is_oom(st);
  if (!r->oom) {
    char what[96];
    snprintf(what, sizeof what, "  %s %s", tools_algo_name(r->algo),
             r->pass == FLASHCL_PASS_BACKWARD ? "flashcl_attention_backward" : "flashcl_attention_forward");
    tools_print_error(stderr, ctx, what, st);
  }
}

static void free_row(row *r) {
  int i;
  for (i = 0; i < r->nout; ++i) free(r->out[i]);
  r->nout = 0;
}

/* ---- --decode: flashcl_attention_decode (FlashDecoding) ----
 * q_len from --q-len (default 1; --tree: a binary draft tree over them), Hq = 32
 * query heads, Hkv = 32 / gqa (8 by default) kv heads, all sequences at KV length
 * L; contiguous cache, or paged with --page-size (identity block table). Effective bandwidth = K and V bytes read
 * (2 * B * L * Hkv * d * dtype size) / median time. Cache contents are a constant
 * fill (timing does not depend on the values). */

/* One decode config: its sizes, and the K/V bytes its GB/s counts. */
typedef struct decode_shape {
  flashcl_dtype dt, kvt; /* q's dtype, the caches' (dt, or a quantized one) */
  int quant;
  long row_scales; /* scales read with each cache row: 1 (TOKEN), d / 32 (BLOCK32), 0 */
  char dtname[32];
  char dname[24]; /* "d", or "d/dv" with --head-dim-v */
  long d, dv, b, n, T, hq, hkv;
  long P, pages_per, rows; /* page size (0: contiguous), pages per sequence, cache tokens */
  size_t es, kv_elems, kv_elems_v, kv_read; /* kv_elems*: the caches' tensor elements */
  long pack;                                  /* cache values per tensor element: 2 for i4x2 */
  uint64_t seed;
} decode_shape;

/* Device buffers of one decode config; desc owns its slopes, tree mask and block table. */
typedef struct decode_bufs {
  cl_mem mem[6]; /* q, k cache, v cache, out, lse, key counts */
  cl_mem scale;  /* --kv-dtype: the K and V scales, one buffer for both (read-only) */
  flashcl_tensor q, kc, vc, out, lse;
  flashcl_decode_desc desc;
  void *scratch;
} decode_bufs;

static decode_shape make_decode_shape(const bench_opts *o, flashcl_dtype dt, long kvt, long d, long b, long n,
                                      long hq, long hkv, int li) {
  decode_shape s;
  s.dt = dt, s.d = d, s.b = b, s.n = n, s.T = o->q_len, s.hq = hq, s.hkv = hkv;
  s.dv = o->head_dim_v ? o->head_dim_v : d;
  if (s.dv != d) snprintf(s.dname, sizeof s.dname, "%ld/%ld", d, s.dv);
  else snprintf(s.dname, sizeof s.dname, "%ld", d);
  s.quant = kvt >= 0 && kvt != dt;
  s.kvt = s.quant ? (flashcl_dtype)kvt : dt;
  /* e.g. f16/i8, f16/i8:head (a scale per kv head), f16/f8e4m3:tensor, f16/i8:block32. */
  const int named = s.quant && o->kv_scale != FLASHCL_KV_SCALE_TOKEN;
  snprintf(s.dtname, sizeof s.dtname, "%s%s%s%s%s", flashcl_dtype_name(dt), s.quant ? "/" : "",
           s.quant ? flashcl_dtype_name(s.kvt) : "", named ? ":" : "", named ? kv_scale_names[o->kv_scale] : "");
  s.es = flashcl_dtype_size(s.kvt);
  s.pack = s.kvt == FLASHCL_I4X2 ? 2 : 1;
  s.P = o->page_size;
  s.pages_per = s.P ? (n + s.P - 1) / s.P : 0;
  s.rows = s.P ? b * s.pages_per * s.P : b * n;
  /* With a left window a call reads only the window's keys (and the new tokens). */
  const long n_read = o->window >= 0 && o->window + s.T < n ? o->window + s.T : n;
  s.kv_elems = (size_t)s.rows * hkv * d / s.pack;
  s.kv_elems_v = (size_t)s.rows * hkv * s.dv / s.pack;
  /* Scales read with each row: TOKEN's one, BLOCK32's d / 32 (K) and dv / 32 (V). */
  const int tok = s.quant && o->kv_scale == FLASHCL_KV_SCALE_TOKEN, blk = s.quant && o->kv_scale == FLASHCL_KV_SCALE_BLOCK32;
  s.row_scales = tok ? 1 : blk ? d / 32 : 0;
  const long v_scales = tok ? 1 : blk ? s.dv / 32 : 0;
  s.kv_read = (size_t)b * n_read * hkv * ((d + s.dv) * s.es / s.pack + (s.row_scales + v_scales) * sizeof(float));
  s.seed = 7 + (uint64_t)li;
  return s;
}

/* Token t of a binary draft tree sees itself and its ancestors (parent (t - 1) / 2). */
static cl_mem tree_mask_buffer(cl_context clctx, long b, long T, cl_int *err) {
  cl_uint *w = malloc(sizeof(cl_uint) * (size_t)(b * T));
  cl_mem m;
  for (long i = 0; w && i < b * T; ++i) {
    long a = i % T;
    w[i] = 0;
    for (;;) {
      w[i] |= 1u << a;
      if (a == 0) break;
      a = (a - 1) / 2;
    }
  }
  m = w ? clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(cl_uint) * (size_t)(b * T), w, err)
        : NULL;
  free(w);
  return m;
}

/* count ints: each `value`, or 0, 1, 2, ... when identity (a block table). */
static cl_mem int_buffer(cl_context clctx, cl_mem_flags flags, long count, long value, int identity, cl_int *err) {
  cl_int *host = malloc(sizeof(cl_int) * (size_t)count);
  cl_mem m;
  for (long i = 0; host && i < count; ++i) host[i] = (cl_int)(identity ? i : value);
  m = host ? clCreateBuffer(clctx, flags | CL_MEM_COPY_HOST_PTR, sizeof(cl_int) * count, host, err) : NULL;
  free(host);
  return m;
}

/* count fp32 scales of 1/64 (read-only: K and V may share it). */
static cl_mem scale_buffer(cl_context clctx, size_t count, cl_int *err) {
  float *host = malloc(sizeof(float) * count);
  cl_mem m;
  for (size_t i = 0; host && i < count; ++i) host[i] = 1.0f / 64;
  m = host ? clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(float) * count, host, err) : NULL;
  free(host);
  return m;
}

/* Creates the buffers and the desc's; 0 or the status that stopped it. */
static int decode_alloc(flashcl_context *ctx, const bench_opts *o, const decode_shape *s, decode_bufs *u) {
  cl_context clctx = flashcl_context_cl_context(ctx);
  const size_t q_elems = (size_t)s->b * s->T * s->hq * s->d;
  cl_int err = CL_SUCCESS;
  u->scratch = malloc(q_elems * 4);
  u->mem[0] = u->scratch ? tools_random_buffer(clctx, flashcl_context_cl_queue(ctx), s->dt, q_elems, s->seed,
                                               u->scratch, &err)
                         : NULL;
  if (u->mem[0]) u->mem[1] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, s->kv_elems * s->es, NULL, &err);
  if (u->mem[1]) u->mem[2] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, s->kv_elems_v * s->es, NULL, &err);
  if (u->mem[2])
    u->mem[3] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, q_elems / s->d * s->dv * flashcl_dtype_size(s->dt), NULL, &err);
  if (u->mem[3] && s->quant)
    u->scale = scale_buffer(clctx, (size_t)s->rows * s->hkv * (size_t)(s->row_scales > 1 ? s->row_scales : 1), &err);
  if (u->mem[3]) u->mem[4] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, (size_t)s->b * s->T * s->hq * 4, NULL, &err);
  flashcl_decode_desc_init(&u->desc);
  u->desc.kernel = o->kernel;
  if (s->quant) {
    u->desc.cache.k_scale = u->desc.cache.v_scale = u->scale;
    u->desc.cache.k_scale_kind = u->desc.cache.v_scale_kind = (flashcl_kv_scale)o->kv_scale;
  }
  if (o->window >= 0) u->desc.score.window_left = (int)o->window;
  u->desc.score.softcap = (float)o->softcap;
  if (o->sinks && u->scratch) {
    float *sk = (float *)u->scratch; /* holds b * T * hq * d >= hq floats */
    for (long h = 0; h < s->hq; ++h) sk[h] = 1.0f;
    u->desc.score.sinks = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(float) * s->hq, sk, &err);
  }
  if (o->alibi && u->scratch) {
    float *slopes = (float *)u->scratch; /* holds b * T * hq * d >= hq floats */
    for (long h = 0; h < s->hq; ++h) slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)s->hq);
    u->desc.score.alibi_slopes = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(float) * s->hq,
                                          slopes, &err);
  }
  if (o->tree && u->mem[4]) u->desc.tree_mask = tree_mask_buffer(clctx, s->b, s->T, &err);
  if (u->mem[4]) u->mem[5] = int_buffer(clctx, CL_MEM_READ_WRITE, s->b, s->n, 0, &err);
  if (s->P && u->mem[5] && err == CL_SUCCESS) {
    u->desc.cache.block_table = int_buffer(clctx, CL_MEM_READ_ONLY, s->b * s->pages_per, 0, 1, &err);
    u->desc.cache.page_size = (int)s->P;
    u->desc.cache.max_pages = (int)s->pages_per;
  }
  if (!u->mem[5] || err != CL_SUCCESS || (s->quant && !u->scale) || (s->P && !u->desc.cache.block_table) || (o->tree && !u->desc.tree_mask) ||
      (o->alibi && !u->desc.score.alibi_slopes) || (o->sinks && !u->desc.score.sinks))
    return err ? err : FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
  return 0;
}

/* Small constants in the caches: timing does not depend on the values. */
static int decode_fill(cl_command_queue queue, const decode_shape *s, const decode_bufs *u) {
  /* 16-bit data is filled with a 4-byte pattern of two elements: NVIDIA's
   * driver never finished a 2-byte-pattern fill of a 4 GiB buffer (the batch
   * 64, 32K-token caches), while a 4-byte one is quick. kv_elems is even (d is a
   * multiple of 8). */
  const cl_ushort h = s->kvt == FLASHCL_F16 ? 0x2000 : 0x3c00;
  const cl_uint pat16 = (cl_uint)h | ((cl_uint)h << 16);
  const cl_float pat32 = 0.01f;
  const cl_uint pat8 = 0x10101010u; /* quantized: code 0x10 in every byte */
  const void *pat = s->quant ? (const void *)&pat8 : s->es == 2 ? (const void *)&pat16 : (const void *)&pat32;
  cl_int err = clEnqueueFillBuffer(queue, u->mem[1], pat, 4, 0, s->kv_elems * s->es, 0, NULL, NULL);
  if (!err) err = clEnqueueFillBuffer(queue, u->mem[2], pat, 4, 0, s->kv_elems_v * s->es, 0, NULL, NULL);
  return err;
}

/* The caches are page pools of P-token pages when paged. */
static int decode_tensors(const decode_shape *s, decode_bufs *u) {
  const long seqs = s->P ? s->b * s->pages_per : s->b, len = s->P ? s->P : s->n;
  int st = flashcl_tensor_init_bnhd(&u->q, u->mem[0], 0, s->dt, s->b, s->T, s->hq, s->d);
  if (!st) st = flashcl_tensor_init_bnhd(&u->kc, u->mem[1], 0, s->kvt, seqs, len, s->hkv, s->d / s->pack);
  if (!st) st = flashcl_tensor_init_bnhd(&u->vc, u->mem[2], 0, s->kvt, seqs, len, s->hkv, s->dv / s->pack);
  if (!st) st = flashcl_tensor_init_bnhd(&u->out, u->mem[3], 0, s->dt, s->b, s->T, s->hq, s->dv);
  if (!st) st = flashcl_tensor_init_lse(&u->lse, u->mem[4], 0, s->b, s->T, s->hq);
  return st;
}

static void decode_release(decode_bufs *u) {
  for (int r = 0; r < 6; ++r)
    if (u->mem[r]) clReleaseMemObject(u->mem[r]);
  if (u->desc.cache.block_table) clReleaseMemObject(u->desc.cache.block_table);
  if (u->desc.tree_mask) clReleaseMemObject(u->desc.tree_mask);
  if (u->desc.score.alibi_slopes) clReleaseMemObject(u->desc.score.alibi_slopes);
  if (u->desc.score.sinks) clReleaseMemObject(u->desc.score.sinks);
  if (u->scale) clReleaseMemObject(u->scale);
  free(u->scratch);
}

/* A decode row as a JSON object: the CSV columns, null where a value is missing
 * (times NULL: the row did not run). */
static void print_decode_json(const bench_opts *o, const flashcl_device_info *info, const decode_shape *s, int splits,
                              const double *times, const double *hosts, int nrep, const char *status) {
  double tcopy[1000], hcopy[1000];
  const double med = times ? (memcpy(tcopy, times, sizeof(double) * nrep), tools_median(tcopy, nrep)) : NAN;
  const double hmed = hosts ? (memcpy(hcopy, hosts, sizeof(double) * nrep), tools_median(hcopy, nrep)) : NAN;
  tools_json j;
  report_json_row(&j);
  tools_json_str(&j, "device", info->device_name);
  tools_json_int(&j, "n", s->n);
  tools_json_int(&j, "batch", s->b);
  tools_json_int(&j, "d", s->d);
  tools_json_int(&j, "head_dim_v", s->dv);
  tools_json_str(&j, "dtype", s->dtname);
  tools_json_int(&j, "heads", s->hq);
  tools_json_int(&j, "heads_kv", s->hkv);
  tools_json_int(&j, "page_size", s->P);
  tools_json_int(&j, "q_len", s->T);
  tools_json_int(&j, "tree", o->tree);
  tools_json_num(&j, "splits", times ? splits : NAN);
  tools_json_num(&j, "reps", times ? nrep : NAN);
  tools_json_num(&j, "median_ms", med);
  tools_json_num(&j, "min_ms", times ? tools_min(times, nrep) : NAN);
  tools_json_int(&j, "kv_bytes", (long long)s->kv_read);
  tools_json_num(&j, "gbps", times ? (double)s->kv_read / (med * 1e-3) / 1e9 : NAN);
  tools_json_num(&j, "calls", times ? o->calls : NAN);
  tools_json_num(&j, "host_us", hmed);
  tools_json_str(&j, "status", status);
  tools_json_close(&j);
}

/* A row without timings: OOM (not tried) or an error. */
static void print_decode_unrun(const bench_opts *o, const flashcl_device_info *info, const decode_shape *s,
                               const char *csv_status, const char *text_status) {
  if (o->json) print_decode_json(o, info, s, 0, NULL, NULL, 0, csv_status);
  else if (o->csv)
    printf("\"%s\",%ld,%ld,%s,%s,%ld,%ld,%ld,%ld,%d,,,,,%zu,,\"%s\"\n", info->device_name, s->n, s->b, s->dname,
           s->dtname, s->hq, s->hkv, s->P, s->T, o->tree, s->kv_read, csv_status);
  else
    printf("%7ld %5ld %4s %5s %6s %4s %11s %10.1f %9s\n", s->n, s->b, s->dname, s->dtname, "-", "-",
           text_status, mib(s->kv_read), "-");
}

static void print_decode_row(const bench_opts *o, const flashcl_device_info *info, const decode_shape *s, int splits,
                             double *times, double *hosts, int nrep) {
  const double med = tools_median(times, nrep), mn = tools_min(times, nrep);
  const double gbps = (double)s->kv_read / (med * 1e-3) / 1e9;
  const double hmed = tools_median(hosts, nrep);
  if (o->json) print_decode_json(o, info, s, splits, times, hosts, nrep, "ok");
  else if (o->csv)
    printf("\"%s\",%ld,%ld,%s,%s,%ld,%ld,%ld,%ld,%d,%d,%d,%.6f,%.6f,%zu,%.3f,%ld,%.2f,\"ok\"\n", info->device_name,
           s->n, s->b, s->dname, s->dtname, s->hq, s->hkv, s->P, s->T, o->tree, splits, nrep, med, mn,
           s->kv_read, gbps, o->calls, hmed);
  else
    printf("%7ld %5ld %4s %5s %6d %4d %11.4f %10.1f %9.1f %8.1f\n", s->n, s->b, s->dname, s->dtname,
           splits, nrep, med, mib(s->kv_read), gbps, hmed);
}

/* Times one decode config and prints its row; 1 when it failed. */
static int decode_config(flashcl_context *ctx, const bench_opts *o, const flashcl_device_info *info,
                         const decode_shape *s, long reps, long warmup) {
  decode_bufs u;
  double times[1000], hosts[1000], ms = 0, hus = 0;
  int st, splits = 0, r, nrep = 0;
  report_row_start("decode N=%ld batch=%ld d=%s %s", s->n, s->b, s->dname, s->dtname);
  if (s->kv_elems * s->es > info->max_mem_alloc_size || (s->kv_elems + s->kv_elems_v) * s->es > info->global_mem_size) {
    report_count(0, 1);
    print_decode_unrun(o, info, s, "OOM", "OOM");
    return 0;
  }
  memset(&u, 0, sizeof u);
  st = decode_alloc(ctx, o, s, &u);
  if (!st) st = decode_fill(flashcl_context_cl_queue(ctx), s, &u);
  if (!st) st = decode_tensors(s, &u);
  if (!st) {
    size_t ws = 0;
    u.desc.split.max_seqlen_k = (int)s->n;
    st = flashcl_attention_decode_workspace_size(ctx, &u.desc, &u.q, &u.kc, &u.vc, &ws, &splits);
  }
  for (r = 0; !st && r < warmup; ++r) {
    st = tools_timed_decode(ctx, &u.desc, &u.q, &u.kc, &u.vc, u.mem[5], &u.out, &u.lse, o->calls, &ms, &hus,
                            &g_report.host_timer);
    report_rep("warmup", r + 1, warmup);
  }
  for (r = 0; !st && r < reps && r < 1000; ++r) {
    st = tools_timed_decode(ctx, &u.desc, &u.q, &u.kc, &u.vc, u.mem[5], &u.out, &u.lse, o->calls, &ms, &hus,
                            &g_report.host_timer);
    if (!st) hosts[nrep] = hus, times[nrep++] = ms;
    report_rep("rep", r + 1, reps < 1000 ? reps : 1000);
  }
  report_clear();
  report_count(!st && nrep > 0, tools_is_oom(st));
  if (st || nrep == 0) {
    tools_print_error(stderr, ctx, "  flashcl_attention_decode", st);
    print_decode_unrun(o, info, s, flashcl_status_string(st), "error");
  } else {
    print_decode_row(o, info, s, splits, times, hosts, nrep);
  }
  fflush(stdout);
  decode_release(&u);
  return st || nrep == 0;
}

static void print_decode_header(flashcl_context *ctx, const bench_opts *o, long hq, long hkv, long warmup,
                                long reps) {
  char devdesc[512];
  if (o->json) return; /* main wrote the document's start */
  if (o->csv) {
    printf("device,n,batch,d,dtype,heads,heads_kv,page_size,q_len,tree,splits,reps,median_ms,min_ms,kv_bytes,gbps,"
           "calls,host_us,status\n");
    return;
  }
  tools_describe_device(ctx, devdesc, sizeof devdesc);
  printf("flashcl-bench --decode %s on %s\nq_len %ld%s, %ld query / %ld kv heads, %s cache, warmup %ld, median of %ld"
         " runs of %ld back-to-back call(s) (time per call)\n",
         FLASHCL_VERSION_STRING, devdesc, o->q_len, o->tree ? " (binary tree mask)" : "", hq, hkv,
         o->page_size ? "paged" : "contiguous", warmup, reps, o->calls);
  if (o->window >= 0) printf("window_left %ld (GB/s counts the window's K/V rows)\n", o->window);
  if (o->softcap > 0) printf("softcap %g\n", o->softcap);
  if (o->alibi) printf("ALiBi\n");
  if (o->sinks) printf("attention sinks\n");
  printf("\ncolumns: N KV length (tokens); batch sequences; d head dim; splits the KV splits of the call;\n"
         "  reps timed runs; median_ms median time per call in milliseconds; KV_MiB K+V bytes read per call\n"
         "  (MiB = 2^20 bytes); GB/s those bytes / median time (10^9 bytes/s); host_us host time of one call (us)\n\n");
  printf("%7s %5s %4s %5s %6s %4s %11s %10s %9s %8s\n", "N", "batch", "d", "dtype", "splits", "reps", "median_ms",
         "KV_MiB", "GB/s", "host_us");
}

static int run_decode_bench(flashcl_context *ctx, bench_opts *o, const flashcl_device_info *info) {
  const long hq = 32, hkv = o->gqa > 1 ? 32 / o->gqa : 8;
  const long reps = o->have_reps ? o->reps : (info->is_gpu ? 20 : 3), warmup = o->have_warmup ? o->warmup : 2;
  tools_list lens_list, batches, ds, dts;
  int failures = 0;
  if (hkv < 1 || hq % hkv) {
    fprintf(stderr, "flashcl-bench --decode: --gqa must divide 32\n");
    return 1;
  }
  if (o->have_n) lens_list = o->n;
  else tools_parse_int_list(info->is_gpu ? "1k,2k,4k,8k,16k,32k,64k,128k" : "256,1k,4k", &lens_list);
  if (o->have_decode_batch) batches = o->decode_batch;
  else tools_parse_int_list(info->is_gpu ? "1,8,64" : "1,8", &batches);
  if (o->have_d) ds = o->d;
  else tools_parse_int_list("128", &ds);
  if (o->have_dtype) dts = o->dtype;
  else tools_parse_dtype_list("f16", &dts);
  print_decode_header(ctx, o, hq, hkv, warmup, reps);
  g_report.rows_total = dts.count * ds.count * batches.count * lens_list.count;
  const tools_list same = {1, {-1}}, *kvs = o->have_kv_dtype ? &o->kv_dtype : &same;
  g_report.rows_total *= kvs->count;
  for (int ti = 0; ti < dts.count; ++ti)
    for (int ki = 0; ki < kvs->count; ++ki)
      for (int di = 0; di < ds.count; ++di)
        for (int bi = 0; bi < batches.count; ++bi)
          for (int li = 0; li < lens_list.count; ++li) {
            const decode_shape s = make_decode_shape(o, (flashcl_dtype)dts.v[ti], kvs->v[ki], ds.v[di],
                                                     batches.v[bi], lens_list.v[li], hq, hkv, li);
            failures += decode_config(ctx, o, info, &s, reps, warmup);
          }
  if (report_text() && g_report.host_timer) printf("\nnote: no usable profiling timestamps; times are host wall-clock.\n");
  return failures ? 1 : 0;
}

/* ---- --block-sparse: runtime against block density (Algorithm 5) ----
 * Mask blocks of mb x mb (a multiple of every portable tile); with nb blocks per
 * row and k = max(1, round(density * nb)), row i keeps blocks
 * (i + t * (nb / k)) mod nb, t < k: the diagonal (local) block plus k - 1
 * evenly strided ones, so every row holds exactly k blocks (density k / nb) and
 * the work-groups stay balanced. Times the median of --reps forwards by event
 * profiling; "x dense" is time / time at the first density. */
/* What every density of a --block-sparse run shares. */
typedef struct sparse_setup {
  long d, reps, tokens, hidden;
  flashcl_dtype dtype;
  int mb, npass;
  double dens[TOOLS_MAX_LIST];
  int nd;
} sparse_setup;

/* The --block-sparse list; 1 (reported) when a density is outside (0, 1]. */
static int parse_densities(const char *list, sparse_setup *s) {
  s->nd = 0;
  for (const char *p = list; *p && s->nd < TOOLS_MAX_LIST;) {
    char *end = NULL;
    double x = strtod(p, &end);
    if (end == p || !(x > 0.0 && x <= 1.0)) {
      fprintf(stderr, "flashcl-bench: --block-sparse densities must be in (0, 1]\n");
      return 1;
    }
    s->dens[s->nd++] = x;
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}

/* The options, else the defaults of the usage text (which depend on the device). */
static void sparse_defaults(bench_opts *o, const flashcl_device_info *info, sparse_setup *s) {
  if (!o->have_n) tools_parse_int_list(info->is_gpu ? "16384" : "2048", &o->n);
  s->d = o->have_d ? o->d.v[0] : 64;
  s->dtype = o->have_dtype ? (flashcl_dtype)o->dtype.v[0] : info->is_gpu ? FLASHCL_F16 : FLASHCL_F32;
  s->reps = o->have_reps ? (o->reps > 0 ? o->reps : 1) : info->is_gpu ? 10 : 3;
  s->tokens = o->have_batch_tokens ? o->batch_tokens : info->is_gpu ? 16384 : 2048;
  s->hidden = o->have_hidden ? o->hidden : info->is_gpu ? 2048 : 256;
  s->mb = info->is_gpu ? 128 : 64;
  s->npass = o->bwd ? 2 : 1;
}

static void print_sparse_header(const bench_opts *o, const sparse_setup *s) {
  if (o->json) return; /* main wrote the document's start */
  if (!o->csv) {
    printf("flashcl-bench --block-sparse: mask blocks %d x %d, %s, d = %ld, non-causal, median of %ld%s\n\n"
           "columns: N sequence length; batch, heads per call; density kept mask blocks / all;\n"
           "  blocks/row kept blocks per row of blocks; pass fwd or bwd; median_ms median time per call in\n"
           "  milliseconds; x dense time / time at the first density; x/density that ratio / density (1 = the\n"
           "  time falls in proportion to the work)\n\n"
           "%6s %5s %5s %8s %9s %4s %10s %9s %11s\n",
           s->mb, s->mb, flashcl_dtype_name(s->dtype), s->d, s->reps,
           o->bwd ? (o->deterministic ? ", deterministic backward" : ", atomic-dQ backward") : "", "N", "batch",
           "heads", "density", "blocks/row", "pass", "median_ms", "x dense", "x/density");
  } else {
    printf("n,d,dtype,batch,heads,density,blocks_per_row,pass,median_ms,ratio_dense\n");
  }
}

/* q k v o, and for --bwd lse dO dQ dK dV; CL_SUCCESS or the error (mem then
 * holds what was created). */
static cl_int sparse_alloc(flashcl_context *ctx, const bench_opts *o, const sparse_setup *s, size_t count,
                           cl_mem mem[9]) {
  cl_context clctx = flashcl_context_cl_context(ctx);
  const size_t bytes = count * flashcl_dtype_size(s->dtype);
  void *scratch = malloc(count * 4);
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < (o->bwd ? 9 : 4) && err == CL_SUCCESS; i++) {
    if (i < 3 || i == 5)
      mem[i] = tools_random_buffer(clctx, flashcl_context_cl_queue(ctx), s->dtype, count, 11 + i, scratch, &err);
    else mem[i] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, i == 4 ? count / s->d * sizeof(float) : bytes, NULL, &err);
    if (!mem[i] && err == CL_SUCCESS) err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
  }
  free(scratch);
  return err;
}

/* Row i keeps kk of the nb blocks, (i + t * (nb / kk)) mod nb; every batch the same. */
static void sparse_mask_bits(uint32_t *bits, int nb, int kk, size_t words, long batch) {
  const int wpr = (nb + 31) / 32;
  memset(bits, 0, words * batch * sizeof *bits);
  for (int i = 0; i < nb; i++)
    for (int t = 0; t < kk; t++) {
      const int j = (i + t * (nb / kk)) % nb;
      bits[(size_t)i * wpr + j / 32] |= 1u << (j % 32);
    }
  for (long b = 1; b < batch; b++) memcpy(bits + b * words, bits, words * sizeof *bits);
}

/* Median of --reps timed calls after one untimed one: the first run builds
 * the programs; the forward runs write the o and lse the backward reads. */
static int time_sparse_pass(flashcl_context *ctx, const tools_attention_args *args, flashcl_pass pass, long reps,
                            double *median) {
  double times[1000];
  int got = 0, host_timer = 0, st = FLASHCL_SUCCESS;
  const long runs = reps + 1 < 1000 ? reps + 1 : 1000;
  for (long r = 0; st == FLASHCL_SUCCESS && r < runs; r++) {
    double ms = 0.0;
    st = tools_timed_call(ctx, pass, args, &ms, &host_timer);
    if (st == FLASHCL_SUCCESS && r > 0) times[got++] = ms;
    if (r == 0) report_rep("warmup", 1, 1);
    else report_rep("rep", r, runs - 1);
  }
  report_clear();
  if (host_timer) g_report.host_timer = 1;
  if (st != FLASHCL_SUCCESS || got == 0) {
    tools_print_error(stderr, ctx, pass == FLASHCL_PASS_BACKWARD ? "flashcl_attention_backward (block-sparse)"
                                                                  : "flashcl_attention_forward (block-sparse)", st);
    return st != FLASHCL_SUCCESS ? st : -1;
  }
  *median = tools_median(times, got);
  return FLASHCL_SUCCESS;
}

/* One N of a --block-sparse run: its shape and what the first density took. */
typedef struct sparse_n {
  long n, batch, heads;
  int nb; /* mask blocks per row */
  double dense_ms[2];
} sparse_n;

/* One --block-sparse row; med is NaN when the pass failed with `status`. */
static void print_sparse_row(const bench_opts *o, const sparse_setup *s, const sparse_n *sn, int kk, int pi,
                             double med, const char *status) {
  const double real = (double)kk / sn->nb, ratio = med / sn->dense_ms[pi];
  if (o->json) {
    tools_json j;
    report_json_row(&j);
    tools_json_int(&j, "n", sn->n);
    tools_json_int(&j, "d", s->d);
    tools_json_str(&j, "dtype", flashcl_dtype_name(s->dtype));
    tools_json_int(&j, "batch", sn->batch);
    tools_json_int(&j, "heads", sn->heads);
    tools_json_num(&j, "density", real);
    tools_json_int(&j, "blocks_per_row", kk);
    tools_json_str(&j, "pass", pi ? "bwd" : "fwd");
    tools_json_num(&j, "median_ms", med);
    tools_json_num(&j, "ratio_dense", ratio);
    tools_json_str(&j, "status", status);
    tools_json_close(&j);
  } else if (isnan(med)) {
    return; /* CSV and text: the error is on stderr */
  } else if (o->csv) {
    printf("%ld,%ld,%s,%ld,%ld,%.4f,%d,%s,%.4f,%.4f\n", sn->n, s->d, flashcl_dtype_name(s->dtype), sn->batch,
           sn->heads, real, kk, pi ? "bwd" : "fwd", med, ratio);
  } else {
    printf("%6ld %5ld %5ld %8.4f %9d %4s %10.3f %9.3f %11.3f\n", sn->n, sn->batch, sn->heads, real, kk,
           pi ? "bwd" : "fwd", med, ratio, ratio / real);
  }
  fflush(stdout);
}

/* Times each pass at kk of nb blocks per row (density index di); returns the failures. */
static int time_density(flashcl_context *ctx, const bench_opts *o, const sparse_setup *s, sparse_n *sn,
                        tools_attention_args *args, const uint32_t *bits, size_t words, int kk, int di) {
  cl_int err = CL_SUCCESS;
  cl_mem mm = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                             words * sn->batch * sizeof *bits, (void *)bits, &err);
  flashcl_attention_desc desc;
  int failures = 0, st = mm ? FLASHCL_SUCCESS : err;
  if (!mm) fprintf(stderr, "flashcl-bench: N = %ld: the block mask buffer: OpenCL error %d\n", sn->n, (int)err);
  flashcl_attention_desc_init(&desc);
  desc.algorithm.kernel = o->kernel;
  desc.mask.kind = FLASHCL_MASK_BLOCK;
  desc.mask.bits = mm;
  desc.mask.block_q = desc.mask.block_k = s->mb;
  desc.backward.deterministic = o->deterministic;
  args->desc = &desc;
  for (int pi = 0; pi < s->npass; pi++) {
    double med = NAN;
    report_row_start("block-sparse N=%ld density %.4f %s", sn->n, (double)kk / sn->nb, pi ? "bwd" : "fwd");
    if (st == FLASHCL_SUCCESS)
      st = time_sparse_pass(ctx, args, pi ? FLASHCL_PASS_BACKWARD : FLASHCL_PASS_FORWARD, s->reps, &med);
    /* else the mask buffer, or the forward before this backward, failed */
    report_count(st == FLASHCL_SUCCESS, tools_is_oom(st));
    failures += st != FLASHCL_SUCCESS;
    if (di == 0 && st == FLASHCL_SUCCESS) sn->dense_ms[pi] = med;
    print_sparse_row(o, s, sn, kk, pi, st == FLASHCL_SUCCESS ? med : NAN,
                     st == FLASHCL_SUCCESS ? "ok" : tools_is_oom(st) ? "OOM" : st == -1 ? "no runs" : flashcl_status_string(st));
  }
  args->desc = NULL; /* desc dies with this call */
  if (mm) clReleaseMemObject(mm);
  return failures;
}

/* Blocks per row kept at a density: max(1, round(density * nb)), at most nb. */
static int density_blocks(double density, int nb) {
  const int kk = (int)(density * nb + 0.5);
  return kk < 1 ? 1 : kk > nb ? nb : kk;
}

/* Every density at one sequence length n; returns the failures. */
static int sparse_at_n(flashcl_context *ctx, const bench_opts *o, const sparse_setup *s, long n) {
  sparse_n sn = {n, s->tokens / n > 0 ? s->tokens / n : 1, s->hidden / s->d > 0 ? s->hidden / s->d : 1,
                 (int)((n + s->mb - 1) / s->mb), {0.0, 0.0}};
  const size_t count = (size_t)sn.batch * n * sn.heads * s->d;
  cl_mem mem[9] = {NULL};
  flashcl_tensor t[9];
  size_t words = 0;
  int failures = 0;
  const cl_int err = sparse_alloc(ctx, o, s, count, mem);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "flashcl-bench: N = %ld: allocation failed (%d)\n", n, (int)err);
    failures++;
    for (int di = 0; di < s->nd; di++)
      for (int pi = 0; pi < s->npass; pi++) {
        report_row_start("block-sparse N=%ld", n);
        report_count(0, tools_is_oom(err));
        print_sparse_row(o, s, &sn, density_blocks(s->dens[di], sn.nb), pi, NAN,
                         tools_is_oom(err) ? "OOM" : "allocation failed");
      }
  } else {
    for (int i = 0; i < (o->bwd ? 9 : 4); i++)
      if (i == 4) flashcl_tensor_init_lse(&t[i], mem[i], 0, sn.batch, n, sn.heads);
      else flashcl_tensor_init_bnhd(&t[i], mem[i], 0, s->dtype, sn.batch, n, sn.heads, s->d);
    tools_attention_args args = {NULL, &t[0], &t[1], &t[2], &t[3], o->bwd ? &t[4] : NULL,
                                 o->bwd ? &t[5] : NULL, o->bwd ? &t[6] : NULL, o->bwd ? &t[7] : NULL,
                                 o->bwd ? &t[8] : NULL};
    flashcl_mask_words(sn.nb, sn.nb, &words);
    uint32_t *bits = malloc(words * sn.batch * sizeof *bits);
    for (int di = 0; di < s->nd; di++) {
      const int kk = density_blocks(s->dens[di], sn.nb);
      sparse_mask_bits(bits, sn.nb, kk, words, sn.batch);
      failures += time_density(ctx, o, s, &sn, &args, bits, words, kk, di);
    }
    free(bits);
  }
  for (int i = 0; i < 9; i++)
    if (mem[i]) clReleaseMemObject(mem[i]);
  return failures;
}

static int run_block_sparse_bench(flashcl_context *ctx, bench_opts *o, const flashcl_device_info *info) {
  sparse_setup s;
  int failures = 0;
  if (parse_densities(o->block_sparse, &s)) return 1;
  sparse_defaults(o, info, &s);
  print_sparse_header(o, &s);
  g_report.rows_total = o->n.count * s.nd * s.npass;
  for (int ni = 0; ni < o->n.count; ni++) failures += sparse_at_n(ctx, o, &s, o->n.v[ni]);
  return failures ? 1 : 0;
}

/* What the table's columns mean (text mode, once, before the table). */
static const char sweep_legend[] =
    "columns: N sequence length; d head dim; batch, heads per call; pass fwd or bwd; algo flash or naive;\n"
    "  Br x Bc the flash tiles (\"mma\": NVIDIA tensor cores); reps timed runs; median_ms median time\n"
    "  per call in milliseconds; TFLOP/s 10^12 FLOP per second; io_MiB inputs + outputs, ws_MiB\n"
    "  workspace, total_MiB both (MiB = 2^20 bytes); speedup naive median / flash median (flash rows);\n"
    "  relL2 relative L2 difference flash vs naive; tuning: kernel family and where its settings came from\n";

static void print_bench_header(const bench_opts *o, const char *devdesc) {
  if (o->json) return; /* main wrote the document's start */
  if (o->csv) {
    printf("device,pass,n,d,dtype,causal,layout,batch,heads,heads_kv,algo,block_r,block_c,reps,median_ms,min_ms,"
           "tflops,io_bytes,workspace_bytes,total_bytes,speedup,rel_l2,status,family,kernel,tuning_source\n");
  } else {
    printf("flashcl-bench %s on %s\n", FLASHCL_VERSION_STRING, devdesc);
    printf("batch = max(1, %ld / N), heads = max(1, %ld / d)%s, layout %s, warmup %ld, median of up to %ld runs",
           o->batch_tokens, o->hidden, o->gqa > 1 ? " (GQA)" : "", o->bhnd ? "BHND" : "BNHD", o->warmup, o->reps);
    if (o->dropout > 0) printf(", dropout %g", o->dropout);
    if (o->window >= 0) printf(", window %ld", o->window);
    if (o->softcap > 0) printf(", softcap %g", o->softcap);
    if (o->alibi) printf(", ALiBi");
    if (o->sinks) printf(", sinks");
    if (o->page_size) printf(", K/V in pages of %ld (identity block table)", o->page_size);
    if (o->bwd) printf(", %s backward", o->deterministic ? "deterministic" : "atomic-dQ");
    printf("\n\n%s\n%6s %4s %5s %6s %5s %5s %4s %-5s %7s %4s %11s %9s %9s %8s %9s %8s %9s %s\n", sweep_legend, "N",
           "d", "dtype", "causal", "batch", "heads", "pass", "algo", "Br x Bc", "reps", "median_ms", "TFLOP/s", "io_MiB",
           "ws_MiB", "total_MiB", "speedup", "relL2", "tuning (family, source)");
  }
  fflush(stdout);
}

/* One (N, d, dtype, causal) config of the sweep. */
typedef struct bench_config {
  long n, d, dv, batch, heads, heads_kv; /* dv: v and o's head dim */
  flashcl_dtype dtype;
  int causal;
  uint64_t seed;
} bench_config;

/* The columns of one printed row that come from more than the row itself. */
typedef struct row_stats {
  flashcl_pass pass;
  size_t io;
  double tflops, speedup, rel;
  int have_rel;
} row_stats;

/* Flash rows only: naive median / flash median, and the largest relL2 of
 * their outputs (NaN as soon as one is NaN). */
static void compare_with_naive(const row *r, const row *nv, row_stats *rs) {
  rs->speedup = NAN;
  rs->rel = NAN;
  rs->have_rel = 0;
  if (!nv || !nv->ran || !r->ran) return;
  rs->speedup = nv->median_ms / r->median_ms;
  if (r->nout == 0 || r->nout != nv->nout) return;
  rs->have_rel = 1;
  rs->rel = 0.0;
  for (int j = 0; j < r->nout; ++j) {
    const double e = tools_rel_l2(r->out[j], nv->out[j], r->out_count[j]);
    if (isnan(e) || e > rs->rel) rs->rel = e;
    if (isnan(e)) break;
  }
}

/* The d column: q and k's head dim, "/v's" where --head-dim-v differs. */
static const char *d_label(const bench_config *c, char *buf, size_t cap) {
  if (c->dv == c->d) snprintf(buf, cap, "%ld", c->d);
  else snprintf(buf, cap, "%ld/%ld", c->d, c->dv);
  return buf;
}

/* The dtype column: q's dtype, and "/the pools' format[:scale kind]" for the
 * paged forward under --kv-dtype (decode's rows label themselves). */
static const char *dt_label(const bench_opts *o, const bench_config *c, char *buf, size_t cap) {
  const int fmt = fwd_pool_format(o), named = fmt >= 0 && o->kv_scale != FLASHCL_KV_SCALE_TOKEN;
  snprintf(buf, cap, "%s%s%s%s%s", flashcl_dtype_name(c->dtype), fmt >= 0 ? "/" : "",
           fmt >= 0 ? flashcl_dtype_name((flashcl_dtype)fmt) : "", named ? ":" : "", named ? kv_scale_names[o->kv_scale] : "");
  return buf;
}

static void print_row_csv(const bench_opts *o, const flashcl_device_info *info, const bench_config *c, const row *r,
                          const row_stats *rs) {
  const char *stxt = r->ran ? "ok" : r->oom ? "OOM" : flashcl_status_string(r->status);
  char dl[32], tl[48];
  printf("\"%s\",%s,%ld,%s,%s,%d,%s,%ld,%ld,%ld,%s,%d,%d,%d,", info->device_name,
         rs->pass == FLASHCL_PASS_BACKWARD ? "bwd" : "fwd", c->n, d_label(c, dl, sizeof dl), dt_label(o, c, tl, sizeof tl),
         c->causal, o->bhnd ? "bhnd" : "bnhd", c->batch, c->heads, c->heads_kv, tools_algo_name(r->algo),
         r->have_cfg ? r->cfg.block_r : r->have_plan ? r->plan.block_r : 0,
         r->have_cfg ? r->cfg.block_c : r->have_plan ? r->plan.block_c : 0, r->reps);
  if (r->ran) printf("%.6f,%.6f,%.6f,", r->median_ms, r->min_ms, rs->tflops);
  else printf(",,,");
  printf("%zu,%zu,%zu,", rs->io, r->workspace, rs->io + r->workspace);
  if (!isnan(rs->speedup)) printf("%.4f", rs->speedup);
  printf(",");
  if (rs->have_rel) printf("%.3e", rs->rel);
  printf(",\"%s\",%s,%s,\"%s\"\n", stxt, r->have_cfg ? flashcl_tuning_family_name(r->cfg.family) : "",
         r->have_cfg ? r->cfg.kernel : "", r->have_cfg ? r->cfg.origin : "");
}

/* The CSV columns as one JSON object; null where the CSV leaves a field empty. */
static void print_row_json(const bench_opts *o, const flashcl_device_info *info, const bench_config *c, const row *r,
                           const row_stats *rs) {
  const int br = r->have_cfg ? r->cfg.block_r : r->have_plan ? r->plan.block_r : 0;
  const int bc = r->have_cfg ? r->cfg.block_c : r->have_plan ? r->plan.block_c : 0;
  tools_json j;
  report_json_row(&j);
  tools_json_str(&j, "device", info->device_name);
  tools_json_str(&j, "pass", rs->pass == FLASHCL_PASS_BACKWARD ? "bwd" : "fwd");
  tools_json_int(&j, "n", c->n);
  tools_json_int(&j, "d", c->d);
  if (c->dv != c->d) tools_json_int(&j, "d_v", c->dv);
  char tl[48];
  tools_json_str(&j, "dtype", dt_label(o, c, tl, sizeof tl));
  tools_json_int(&j, "causal", c->causal);
  tools_json_str(&j, "layout", o->bhnd ? "bhnd" : "bnhd");
  tools_json_int(&j, "batch", c->batch);
  tools_json_int(&j, "heads", c->heads);
  tools_json_int(&j, "heads_kv", c->heads_kv);
  tools_json_str(&j, "algo", tools_algo_name(r->algo));
  tools_json_num(&j, "block_r", br ? br : NAN);
  tools_json_num(&j, "block_c", bc ? bc : NAN);
  tools_json_int(&j, "reps", r->reps);
  tools_json_num(&j, "median_ms", r->ran ? r->median_ms : NAN);
  tools_json_num(&j, "min_ms", r->ran ? r->min_ms : NAN);
  tools_json_num(&j, "tflops", r->ran ? rs->tflops : NAN);
  tools_json_int(&j, "io_bytes", (long long)rs->io);
  tools_json_int(&j, "workspace_bytes", (long long)r->workspace);
  tools_json_int(&j, "total_bytes", (long long)(rs->io + r->workspace));
  tools_json_num(&j, "speedup", rs->speedup);
  tools_json_num(&j, "rel_l2", rs->have_rel ? rs->rel : NAN);
  tools_json_str(&j, "status", r->ran ? "ok" : r->oom ? "OOM" : flashcl_status_string(r->status));
  tools_json_int(&j, "status_code", r->status);
  tools_json_str(&j, "family", r->have_cfg ? flashcl_tuning_family_name(r->cfg.family) : NULL);
  tools_json_str(&j, "kernel", r->have_cfg ? r->cfg.kernel : NULL);
  tools_json_str(&j, "tuning_source", r->have_cfg ? r->cfg.origin : NULL);
  tools_json_close(&j);
}

static void print_row_text(const bench_opts *o, const bench_config *c, const row *r, const row_stats *rs) {
  char ms[32], blocks[32], spd[32], rl[32], reps[16], tf[32], dl[32], tl[48];
  if (r->have_cfg) snprintf(blocks, sizeof blocks, "%dx%d", r->cfg.block_r, r->cfg.block_c);
  else if (r->family == FLASHCL_KERNEL_NVIDIA_MMA) snprintf(blocks, sizeof blocks, "mma");
  else if (r->have_plan) snprintf(blocks, sizeof blocks, "%dx%d", r->plan.block_r, r->plan.block_c);
  else snprintf(blocks, sizeof blocks, "-");
  if (r->oom) snprintf(ms, sizeof ms, "OOM");
  else if (r->status) snprintf(ms, sizeof ms, "error %d", r->status);
  else snprintf(ms, sizeof ms, "%.3f", r->median_ms);
  if (r->ran) snprintf(reps, sizeof reps, "%d", r->reps);
  else snprintf(reps, sizeof reps, "-");
  if (r->ran) snprintf(tf, sizeof tf, "%.4f", rs->tflops);
  else snprintf(tf, sizeof tf, "-");
  if (!isnan(rs->speedup)) snprintf(spd, sizeof spd, "%.2fx", rs->speedup);
  else snprintf(spd, sizeof spd, "-");
  if (rs->have_rel) snprintf(rl, sizeof rl, "%.2e", rs->rel);
  else snprintf(rl, sizeof rl, "-");
  printf("%6ld %4s %5s %6d %5ld %5ld %4s %-5s %7s %4s %11s %9s %9.1f %8.1f %9.1f %8s %9s  %s%s%s\n", c->n,
         d_label(c, dl, sizeof dl), dt_label(o, c, tl, sizeof tl), c->causal, c->batch, c->heads,
         rs->pass == FLASHCL_PASS_BACKWARD ? "bwd" : "fwd",
         tools_algo_name(r->algo), blocks, reps, ms, tf, mib(rs->io), mib(r->workspace), mib(rs->io + r->workspace),
         spd, rl, r->have_cfg ? flashcl_tuning_family_name(r->cfg.family) : "", r->have_cfg ? " from " : "",
         r->have_cfg ? r->cfg.origin : "");
}

/* Best FLOP per ms seen so far per (algo, pass), for the estimate before a row. */
static double g_rate[8][2];

/* Starts a row's progress label and, from the earlier rows' rate, its estimate. */
static void start_row(const bench_opts *o, const bench_config *c, const row *r, double flops) {
  const int a = r->algo & 7, p = r->pass == FLASHCL_PASS_BACKWARD;
  char dl[32];
  report_row_start("N=%ld d=%s %s causal=%d %s %s", c->n, d_label(c, dl, sizeof dl), flashcl_dtype_name(c->dtype), c->causal,
                   tools_algo_name(r->algo), p ? "bwd" : "fwd");
  if (g_rate[a][p] > 0) {
    const double call_s = flops / g_rate[a][p] / 1e3;
    const double timed = (double)o->reps * call_s < o->budget_s + call_s ? (double)o->reps * call_s
                                                                         : o->budget_s + call_s;
    report_estimate((double)(o->warmup + p) * call_s + timed);
  }
}

/* After a row: its rate for later estimates, and the run's counts. */
static void finish_row(const row *r, double flops) {
  const int a = r->algo & 7, p = r->pass == FLASHCL_PASS_BACKWARD;
  if (r->ran && r->median_ms > 0 && flops / r->median_ms > g_rate[a][p]) g_rate[a][p] = flops / r->median_ms;
}

/* Runs and prints every --algo row of one pass. Counts the rows that failed
 * other than by OOM; returns 1 when one of them may have broken the context. */
static int run_pass(flashcl_context *ctx, const bench_opts *o, const flashcl_device_info *info, const bench_config *c,
                    config_bufs *bufs, int alloc_status, void *scratch, flashcl_pass pass, int *failures) {
  /* Per visible pair: forward Q K^T (2 d) and P V (2 dv); backward also S
   * again (2 d), dP (2 dv), dV (2 dv), dQ and dK (2 d each). */
  const double per_pair = pass == FLASHCL_PASS_BACKWARD ? 6.0 * (double)c->d + 4.0 * (double)c->dv
                                                        : 2.0 * (double)c->d + 2.0 * (double)c->dv;
  const double flops = per_pair * visible_pairs(c->n, c->causal, o->window) * (double)c->batch * (double)c->heads;
  row rows[MAX_ALGOS];
  int flash_i = -1, naive_i = -1, need_reset = 0;
  memset(rows, 0, sizeof rows);
  for (int ai = 0; ai < o->algo.count; ++ai) {
    rows[ai].algo = (int)o->algo.v[ai];
    rows[ai].pass = pass;
    if (rows[ai].algo == FLASHCL_ALGO_FLASH && flash_i < 0) flash_i = ai;
    if (rows[ai].algo == FLASHCL_ALGO_NAIVE && naive_i < 0) naive_i = ai;
    start_row(o, c, &rows[ai], flops);
    if (alloc_status) {
      rows[ai].status = alloc_status;
      rows[ai].oom = tools_is_oom(alloc_status);
    } else {
      run_row(ctx, o, bufs, c->causal, info->global_mem_size, scratch, &rows[ai]);
    }
    finish_row(&rows[ai], flops);
  }
  for (int ai = 0; ai < o->algo.count; ++ai) {
    const row *r = &rows[ai];
    row_stats rs = {pass, pass == FLASHCL_PASS_BACKWARD ? bufs->bwd_io : bufs->fwd_io,
                    r->ran ? flops / (r->median_ms * 1e-3) / 1e12 : NAN, NAN, NAN, 0};
    if (!r->ran && !r->oom) {
      ++*failures;
      if (!tools_is_validation_error(r->status)) need_reset = 1;
    }
    if (ai == flash_i) compare_with_naive(r, naive_i >= 0 ? &rows[naive_i] : NULL, &rs);
    report_count(r->ran, r->oom);
    if (ai == flash_i && !isnan(rs.speedup)) {
      char label[160];
      char dl[32];
      snprintf(label, sizeof label, "N=%ld d=%s %s causal=%d %s", c->n, d_label(c, dl, sizeof dl), flashcl_dtype_name(c->dtype),
               c->causal, pass == FLASHCL_PASS_BACKWARD ? "bwd" : "fwd");
      report_speedup(rs.speedup, label);
    }
    if (o->json) print_row_json(o, info, c, r, &rs);
    else if (o->csv) print_row_csv(o, info, c, r, &rs);
    else print_row_text(o, c, r, &rs);
  }
  fflush(stdout);
  for (int ai = 0; ai < o->algo.count; ++ai) free_row(&rows[ai]);
  return need_reset;
}

/* Allocates one config's buffers and runs its passes; returns 1 when the
 * context should be recreated. */
static int run_config(flashcl_context *ctx, const bench_opts *o, const flashcl_device_info *info,
                      const bench_config *c, int *failures) {
  const size_t esize = flashcl_dtype_size(c->dtype);
  const size_t max_count = (size_t)c->batch * (size_t)c->n * (size_t)c->heads * (size_t)(c->d > c->dv ? c->d : c->dv);
  config_bufs bufs;
  int alloc_status, need_reset = 0;
  memset(&bufs, 0, sizeof bufs);
  void *scratch = malloc(max_count * (esize > sizeof(float) ? esize : sizeof(float)));
  if (!scratch) alloc_status = FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
  else alloc_status = alloc_bufs(ctx, o, info, c->batch, c->n, c->heads, c->heads_kv, c->d, c->dv, c->dtype,
                                 c->seed, scratch, &bufs);
  if (alloc_status && !tools_is_oom(alloc_status))
    fprintf(stderr, "  allocating N=%ld d=%ld %s: %s (%d)\n", c->n, c->d, flashcl_dtype_name(c->dtype),
            flashcl_status_string(alloc_status), alloc_status);
  for (int pi = 0; pi < (o->bwd ? 2 : 1); ++pi)
    need_reset |= run_pass(ctx, o, info, c, &bufs, alloc_status, scratch,
                           pi ? FLASHCL_PASS_BACKWARD : FLASHCL_PASS_FORWARD, failures);
  release_bufs(&bufs);
  free(scratch);
  return need_reset;
}

/* A device-side failure (e.g. an illegal memory access) can poison the
 * OpenCL context: the next config starts on a fresh one. 0, or the exit status. */
static int recreate_context(const flashcl_context_options *options, flashcl_context **ctx) {
  fprintf(stderr, "flashcl-bench: recreating the context after a device error\n");
  flashcl_context_destroy(*ctx);
  *ctx = NULL;
  const int st = flashcl_context_create(options, ctx);
  if (st == FLASHCL_SUCCESS) return 0;
  *ctx = NULL;
  fprintf(stderr,
          "flashcl-bench: cannot recreate the context (%s, %d): the driver keeps failing after the device\n"
          "error (NVIDIA's does, for the whole process); the remaining configurations were not run\n",
          flashcl_status_string(st), st);
  return 2;
}

/* The config of sweep indices (ni, di, ti, ci); 0 when it is skipped (reported). */
static int make_config(const bench_opts *o, int ni, int di, int ti, int ci, bench_config *c) {
  c->n = o->n.v[ni], c->d = o->d.v[di];
  c->dv = o->head_dim_v ? o->head_dim_v : c->d;
  c->dtype = (flashcl_dtype)o->dtype.v[ti];
  c->causal = (int)o->causal.v[ci];
  c->batch = o->batch_tokens / c->n > 0 ? o->batch_tokens / c->n : 1;
  c->heads = o->hidden / c->d > 0 ? o->hidden / c->d : 1;
  c->heads_kv = c->heads / o->gqa;
  c->seed = 1000u * (uint64_t)(ni + 1) + 100u * (uint64_t)di + 10u * (uint64_t)ti;
  if (o->page_size && c->n % o->page_size) {
    fprintf(stderr, "skipping N=%ld: not a multiple of --page-size %ld\n", c->n, o->page_size);
    return 0;
  }
  if (c->heads_kv < 1 || c->heads % o->gqa != 0) {
    fprintf(stderr, "skipping N=%ld d=%ld: %ld heads are not divisible by --gqa %ld\n", c->n, c->d, c->heads,
            o->gqa);
    return 0;
  }
  return 1;
}

/* The forward (and backward) sweep; counts the rows that failed. 0, or 2 when
 * the context could not be recreated. */
static int run_sweep(flashcl_context **ctx, const flashcl_context_options *options, bench_opts *o,
                     const flashcl_device_info *info, int *failures) {
  char devdesc[512];
  apply_defaults(o, info->is_gpu);
  tools_describe_device(*ctx, devdesc, sizeof devdesc);
  print_bench_header(o, devdesc);
  const int rows_per_config = o->algo.count * (o->bwd ? 2 : 1);
  g_report.rows_total = o->d.count * o->dtype.count * o->causal.count * o->n.count * rows_per_config;
  for (int di = 0; di < o->d.count; ++di)
    for (int ti = 0; ti < o->dtype.count; ++ti)
      for (int ci = 0; ci < o->causal.count; ++ci)
        for (int ni = 0; ni < o->n.count; ++ni) {
          bench_config c;
          if (!make_config(o, ni, di, ti, ci, &c)) report_skip(rows_per_config);
          else if (run_config(*ctx, o, info, &c, failures) && recreate_context(options, ctx))
            return 2;
        }
  if (report_text() && g_report.host_timer)
    printf("\nnote: the queue gave no usable profiling timestamps; times are host wall-clock.\n");
  return 0;
}

int main(int argc, char **argv) {
  bench_opts o;
  flashcl_context_options options;
  flashcl_context *ctx = NULL;
  flashcl_device_info info;
  int st, failures = 0;

  for (int i = 1; i < argc; ++i)
    if (!strcmp(argv[i], "--first-call")) return bench_first_call_main(argc, argv);
  const args_status parsed = parse_args(argc, argv, &o);
  if (parsed == ARGS_HELP) {
    usage(stdout);
    return 0;
  }
  if (parsed == ARGS_UNKNOWN) {
    fputc('\n', stderr);
    usage(stderr);
  }
  if (parsed != ARGS_OK) return 1;

  if (tools_open_context("flashcl-bench", o.device, o.verbose, &options, &ctx, &info)) return 2;
  report_init(o.csv, o.json, o.quiet);
  if (o.json) report_json_begin(o.block_sparse ? "block-sparse" : o.decode ? "decode" : "sweep", ctx);
  if (o.block_sparse) st = run_block_sparse_bench(ctx, &o, &info);
  else if (o.decode) st = run_decode_bench(ctx, &o, &info);
  else st = run_sweep(&ctx, &options, &o, &info, &failures); /* 2: no context left */
  if (ctx) flashcl_context_destroy(ctx);
  if (failures) {
    fprintf(stderr, "flashcl-bench: %d row(s) failed with an error other than out-of-memory (see above)\n",
            failures);
    if (!st) st = 1;
  }
  if (o.json) report_json_end(st);
  else if (!o.csv) report_summary_text();
  return st;
}
