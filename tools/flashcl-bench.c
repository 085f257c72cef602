/*
 * flashcl-bench: forward-pass timings of the flash and naive algorithms over a
 * sweep of sequence lengths, head dims, dtypes and causal masks.
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

#include "common.h"

typedef struct bench_opts {
  const char *device;
  tools_list n, d, dtype, causal, algo;
  int have_n, have_d, have_dtype, have_causal;
  long batch_tokens, hidden, gqa;
  long reps, warmup;
  int have_batch_tokens, have_hidden, have_reps, have_warmup;
  double budget_s;
  int csv, check, bhnd, verbose;
  flashcl_kernel_family kernel;
} bench_opts;

typedef struct algo_result {
  int algo;
  int status;   /* 0 ok, else flashcl/OpenCL status */
  int oom;      /* status means out of memory (or skipped as too large) */
  int ran;
  int reps;
  double median_ms, min_ms;
  size_t workspace;
  flashcl_block_plan plan;
  int have_plan;
  float *out; /* output as float, for the flash/naive comparison */
} algo_result;

static int g_host_timer = 0;

static void usage(FILE *f) {
  fprintf(f,
          "usage: flashcl-bench [options]\n"
          "\n"
          "Times flashcl_attention_forward (flash and naive) on one device.\n"
          "Per config: batch = max(1, batch_tokens / N), heads = max(1, hidden / d).\n"
          "\n"
          "  --device SPEC        \"<platform>:<device>\" or a name substring (default:\n"
          "                       $FLASHCL_DEVICE, else first GPU, else first device)\n"
          "  --n LIST             sequence lengths, e.g. 128,256,1k,16k\n"
          "                       (default GPU: 128..16384, other devices: 128..2048)\n"
          "  --d LIST             head dims (default 64,128 on GPU, 64 otherwise)\n"
          "  --dtype LIST         f32,f16,bf16 (default f16,f32)\n"
          "  --causal 0|1|both    (default both on GPU, 0 otherwise)\n"
          "  --algo LIST          flash,naive (default both)\n"
          "  --batch-tokens T     batch * N (default 16384 on GPU, 2048 otherwise)\n"
          "  --hidden H           heads * d (default 2048 on GPU, 256 otherwise)\n"
          "  --gqa G              query heads per key/value head (default 1)\n"
          "  --layout bnhd|bhnd   tensor layout (default bnhd)\n"
          "  --kernel auto|portable  flash kernel family (default auto)\n"
          "  --reps R             timed runs, median reported (default 10 on GPU, 3 otherwise)\n"
          "  --warmup W           untimed runs first (default 2 on GPU, 1 otherwise)\n"
          "  --budget S           cap on timed seconds per row: fewer reps (at least 1)\n"
          "                       when a run is slow (default 10)\n"
          "  --no-check           skip the flash-vs-naive output comparison (relL2 column)\n"
          "  --csv                machine-readable CSV on stdout\n"
          "  --verbose            library diagnostics on stderr\n"
          "\n"
          "TFLOP/s counts 4*N*N*d per head and batch (half of that when causal).\n"
          "speedup (on flash rows) = naive median / flash median.\n"
          "relL2 (on flash rows) = ||o_flash - o_naive|| / ||o_naive||.\n");
}

static int parse_args(int argc, char **argv, bench_opts *o) {
  const char *val = NULL;
  int i, r;
  memset(o, 0, sizeof *o);
  o->gqa = 1;
  o->budget_s = 10.0;
  o->check = 1;
  o->kernel = FLASHCL_KERNEL_AUTO;
  tools_parse_algo_list("flash,naive", &o->algo);
  for (i = 1; i < argc; ++i) {
    val = NULL;
#define OPT(name) ((r = tools_opt_value(argc, argv, &i, name, &val)) != 0 && (r > 0 || (exit(1), 0)))
    if (OPT("--device")) {
      o->device = val;
    } else if (OPT("--n")) {
      if (tools_parse_int_list(val, &o->n)) goto bad;
      o->have_n = 1;
    } else if (OPT("--d")) {
      if (tools_parse_int_list(val, &o->d)) goto bad;
      o->have_d = 1;
    } else if (OPT("--dtype")) {
      if (tools_parse_dtype_list(val, &o->dtype)) goto bad;
      o->have_dtype = 1;
    } else if (OPT("--causal")) {
      if (tools_parse_causal_list(val, &o->causal)) goto bad;
      o->have_causal = 1;
    } else if (OPT("--algo")) {
      if (tools_parse_algo_list(val, &o->algo)) goto bad;
    } else if (OPT("--batch-tokens")) {
      if (tools_parse_long(val, &o->batch_tokens) || o->batch_tokens < 1) goto bad;
      o->have_batch_tokens = 1;
    } else if (OPT("--hidden")) {
      if (tools_parse_long(val, &o->hidden) || o->hidden < 1) goto bad;
      o->have_hidden = 1;
    } else if (OPT("--gqa")) {
      if (tools_parse_long(val, &o->gqa) || o->gqa < 1) goto bad;
    } else if (OPT("--layout")) {
      if (tools_parse_layout(val, &o->bhnd)) goto bad;
    } else if (OPT("--kernel")) {
      if (tools_parse_kernel(val, &o->kernel)) goto bad;
    } else if (OPT("--reps")) {
      if (tools_parse_long(val, &o->reps) || o->reps < 1) goto bad;
      o->have_reps = 1;
    } else if (OPT("--warmup")) {
      if (tools_parse_long(val, &o->warmup) || o->warmup < 0) goto bad;
      o->have_warmup = 1;
    } else if (OPT("--budget")) {
      char *end = NULL;
      o->budget_s = strtod(val, &end);
      if (!end || *end || !(o->budget_s > 0)) goto bad;
    } else if (tools_opt_flag(argv, i, "--no-check")) {
      o->check = 0;
    } else if (tools_opt_flag(argv, i, "--csv")) {
      o->csv = 1;
    } else if (tools_opt_flag(argv, i, "--verbose") || tools_opt_flag(argv, i, "-v")) {
      o->verbose = 1;
    } else if (tools_opt_flag(argv, i, "--help") || tools_opt_flag(argv, i, "-h")) {
      usage(stdout);
      exit(0);
    } else {
      fprintf(stderr, "flashcl-bench: unknown argument '%s'\n\n", argv[i]);
      usage(stderr);
      return -1;
    }
#undef OPT
  }
  return 0;
bad:
  fprintf(stderr, "flashcl-bench: bad value '%s' for %s\n", val ? val : "", argv[i - (val == argv[i] ? 1 : 0)]);
  return -1;
}

/* Defaults depend on the device: a full sweep on GPUs, a short one elsewhere
 * (PoCL on a 2-core CPU finishes it in a few minutes). */
static void apply_defaults(bench_opts *o, int is_gpu) {
  if (!o->have_n) {
    static const long gpu_n[] = {128, 256, 512, 1024, 2048, 4096, 8192, 16384};
    static const long cpu_n[] = {128, 256, 512, 1024, 2048};
    const long *src = is_gpu ? gpu_n : cpu_n;
    int count = is_gpu ? (int)(sizeof gpu_n / sizeof gpu_n[0]) : (int)(sizeof cpu_n / sizeof cpu_n[0]);
    int i;
    o->n.count = count;
    for (i = 0; i < count; ++i) o->n.v[i] = src[i];
  }
  if (!o->have_d) tools_parse_int_list(is_gpu ? "64,128" : "64", &o->d);
  if (!o->have_dtype) tools_parse_dtype_list("f16,f32", &o->dtype);
  if (!o->have_causal) tools_parse_causal_list(is_gpu ? "both" : "0", &o->causal);
  if (!o->have_batch_tokens) o->batch_tokens = is_gpu ? 16384 : 2048;
  if (!o->have_hidden) o->hidden = is_gpu ? 2048 : 256;
  if (!o->have_reps) o->reps = is_gpu ? 10 : 3;
  if (!o->have_warmup) o->warmup = is_gpu ? 2 : 1;
}

static void fmt_ms(char *buf, size_t size, const algo_result *r) {
  if (r->oom) snprintf(buf, size, "OOM");
  else if (r->status) snprintf(buf, size, "error %d", r->status);
  else snprintf(buf, size, "%.3f", r->median_ms);
}

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* Runs one algorithm on allocated tensors; fills r. */
static void run_algo(flashcl_context *ctx, const bench_opts *o, const flashcl_tensor *q, const flashcl_tensor *k,
                     const flashcl_tensor *v, const flashcl_tensor *out, int causal, size_t io_bytes,
                     cl_ulong global_mem, size_t q_count, void *raw_scratch, algo_result *r) {
  flashcl_attention_desc desc;
  double times[1024];
  double ms = 0.0;
  long reps = o->reps, i;
  int st, host_timer = 0;

  flashcl_attention_desc_init(&desc);
  desc.causal = causal;
  desc.algo = (flashcl_algo)r->algo;
  desc.kernel = o->kernel;
  if (o->gqa > 1) {
    desc.heads_q = (int)q->shape[FLASHCL_DIM_HEAD];
    desc.heads_kv = (int)k->shape[FLASHCL_DIM_HEAD];
  }

  st = flashcl_attention_workspace_size(ctx, &desc, q, k, v, FLASHCL_PASS_FORWARD, &r->workspace);
  if (st != FLASHCL_SUCCESS) {
    r->status = st;
    r->oom = tools_is_oom(st);
    if (!r->oom) tools_print_error(stderr, ctx, "  flashcl_attention_workspace_size", st);
    return;
  }
  if (r->algo == FLASHCL_ALGO_FLASH &&
      flashcl_attention_block_plan(ctx, (int)q->shape[FLASHCL_DIM_HEADDIM], q->dtype, 0, 0, &r->plan) ==
          FLASHCL_SUCCESS)
    r->have_plan = 1;
  if ((cl_ulong)io_bytes + r->workspace > global_mem) { /* would not fit: do not even try */
    r->status = FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY;
    r->oom = 1;
    return;
  }

  for (i = 0; i < o->warmup; ++i) {
    st = tools_timed_forward(ctx, &desc, q, k, v, out, &ms, &host_timer);
    if (st != FLASHCL_SUCCESS) goto failed;
  }
  if (reps > (long)(sizeof times / sizeof times[0])) reps = (long)(sizeof times / sizeof times[0]);
  for (i = 0; i < reps; ++i) {
    st = tools_timed_forward(ctx, &desc, q, k, v, out, &ms, &host_timer);
    if (st != FLASHCL_SUCCESS) goto failed;
    if (host_timer) g_host_timer = 1;
    times[i] = ms;
    /* Respect the time budget: stop early when the next run would exceed it. */
    {
      double spent = 0.0;
      long j;
      for (j = 0; j <= i; ++j) spent += times[j];
      if (i + 1 < reps && (spent + ms) * 1e-3 > o->budget_s) {
        ++i;
        break;
      }
    }
  }
  r->reps = (int)i;
  r->min_ms = tools_min(times, r->reps);
  r->median_ms = tools_median(times, r->reps);
  r->ran = 1;

  if (o->check) {
    r->out = (float *)malloc(q_count * sizeof(float));
    if (r->out && tools_read_as_float(flashcl_context_cl_queue(ctx), out->buffer, out->dtype, q_count,
                                      raw_scratch, r->out) != CL_SUCCESS) {
      free(r->out);
      r->out = NULL;
    }
  }
  return;
failed:
  r->status = st;
  r->oom = tools_is_oom(st);
  if (!r->oom) tools_print_error(stderr, ctx, "  flashcl_attention_forward", st);
}

int main(int argc, char **argv) {
  bench_opts o;
  flashcl_context_options options;
  flashcl_context *ctx = NULL;
  flashcl_device_info info;
  cl_context clctx;
  cl_command_queue queue;
  char devdesc[512];
  int st, ni, di, ti, ci, ai, failures = 0;

  if (parse_args(argc, argv, &o) != 0) return 1;

  flashcl_context_options_init(&options);
  options.device = o.device;
  options.profiling = 1;
  options.verbose = o.verbose;
  st = flashcl_context_create(&options, &ctx);
  if (st != FLASHCL_SUCCESS) {
    fprintf(stderr, "flashcl-bench: cannot create a context on %s: %s (%d)\n", o.device ? o.device : "the default device",
            flashcl_status_string(st), st);
    return 2;
  }
  st = flashcl_context_device_info(ctx, &info);
  if (st != FLASHCL_SUCCESS) {
    tools_print_error(stderr, ctx, "flashcl_context_device_info", st);
    flashcl_context_destroy(ctx);
    return 2;
  }
  apply_defaults(&o, info.is_gpu);
  clctx = flashcl_context_cl_context(ctx);
  queue = flashcl_context_cl_queue(ctx);
  tools_describe_device(ctx, devdesc, sizeof devdesc);

  if (o.csv) {
    printf("device,n,d,dtype,causal,layout,batch,heads,heads_kv,algo,block_r,block_c,reps,median_ms,min_ms,"
           "tflops,io_bytes,workspace_bytes,total_bytes,speedup,rel_l2,status\n");
  } else {
    printf("flashcl-bench %s on %s\n", FLASHCL_VERSION_STRING, devdesc);
    printf("batch = max(1, %ld / N), heads = max(1, %ld / d)%s, layout %s, warmup %ld, median of up to %ld runs\n",
           o.batch_tokens, o.hidden, o.gqa > 1 ? " (GQA)" : "", o.bhnd ? "BHND" : "BNHD", o.warmup, o.reps);
    printf("\n%6s %4s %5s %6s %5s %5s %-5s %7s %4s %11s %9s %9s %8s %9s %8s %9s\n", "N", "d", "dtype", "causal",
           "batch", "heads", "algo", "Br x Bc", "reps", "median_ms", "TFLOP/s", "io_MiB", "ws_MiB", "total_MiB",
           "speedup", "relL2");
  }
  fflush(stdout);

  for (di = 0; di < o.d.count; ++di)
    for (ti = 0; ti < o.dtype.count; ++ti)
      for (ci = 0; ci < o.causal.count; ++ci)
        for (ni = 0; ni < o.n.count; ++ni) {
          const long n = o.n.v[ni], d = o.d.v[di];
          const flashcl_dtype dtype = (flashcl_dtype)o.dtype.v[ti];
          const int causal = (int)o.causal.v[ci];
          const long batch = o.batch_tokens / n > 0 ? o.batch_tokens / n : 1;
          const long heads = o.hidden / d > 0 ? o.hidden / d : 1;
          const long heads_kv = heads / o.gqa;
          const size_t esize = flashcl_dtype_size(dtype);
          const size_t q_count = (size_t)batch * (size_t)n * (size_t)heads * (size_t)d;
          const size_t kv_count = (size_t)batch * (size_t)n * (size_t)heads_kv * (size_t)d;
          const size_t io_bytes = (2 * q_count + 2 * kv_count) * esize;
          const double flops = 4.0 * (double)n * (double)n * (double)d * (double)batch * (double)heads *
                               (causal ? 0.5 : 1.0);
          cl_mem bq = NULL, bk = NULL, bv = NULL, bo = NULL;
          flashcl_tensor tq, tk, tv, to;
          algo_result res[8];
          void *scratch = NULL;
          cl_int err = CL_SUCCESS;
          int alloc_status = 0;
          int nalgo = o.algo.count < 8 ? o.algo.count : 8;
          int flash_i = -1, naive_i = -1;

          memset(res, 0, sizeof res);
          for (ai = 0; ai < nalgo; ++ai) {
            res[ai].algo = (int)o.algo.v[ai];
            if (res[ai].algo == FLASHCL_ALGO_FLASH && flash_i < 0) flash_i = ai;
            if (res[ai].algo == FLASHCL_ALGO_NAIVE && naive_i < 0) naive_i = ai;
          }
          if (heads_kv < 1 || heads % o.gqa != 0) {
            fprintf(stderr, "skipping N=%ld d=%ld: heads %ld not divisible by --gqa %ld\n", n, d, heads, o.gqa);
            continue;
          }

          /* inputs */
          if ((cl_ulong)io_bytes > info.global_mem_size || (cl_ulong)(q_count * esize) > info.max_mem_alloc_size) {
            alloc_status = FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY;
          } else {
            scratch = malloc(q_count * (esize > sizeof(float) ? esize : sizeof(float)));
            if (!scratch) alloc_status = FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
          }
          if (!alloc_status) {
            uint64_t seed = 1000u * (uint64_t)(ni + 1) + 100u * (uint64_t)di + 10u * (uint64_t)ti;
            bq = tools_random_buffer(clctx, queue, dtype, q_count, seed + 1, scratch, &err);
            if (bq) bk = tools_random_buffer(clctx, queue, dtype, kv_count, seed + 2, scratch, &err);
            if (bk) bv = tools_random_buffer(clctx, queue, dtype, kv_count, seed + 3, scratch, &err);
            if (bv) bo = clCreateBuffer(clctx, CL_MEM_READ_WRITE, q_count * esize, NULL, &err);
            if (!bo || err != CL_SUCCESS) alloc_status = err != CL_SUCCESS ? err : CL_MEM_OBJECT_ALLOCATION_FAILURE;
          }
          if (!alloc_status) {
            if (o.bhnd) {
              st = flashcl_tensor_init_bhnd(&tq, bq, 0, dtype, batch, n, heads, d);
              if (!st) st = flashcl_tensor_init_bhnd(&tk, bk, 0, dtype, batch, n, heads_kv, d);
              if (!st) st = flashcl_tensor_init_bhnd(&tv, bv, 0, dtype, batch, n, heads_kv, d);
              if (!st) st = flashcl_tensor_init_bhnd(&to, bo, 0, dtype, batch, n, heads, d);
            } else {
              st = flashcl_tensor_init_bnhd(&tq, bq, 0, dtype, batch, n, heads, d);
              if (!st) st = flashcl_tensor_init_bnhd(&tk, bk, 0, dtype, batch, n, heads_kv, d);
              if (!st) st = flashcl_tensor_init_bnhd(&tv, bv, 0, dtype, batch, n, heads_kv, d);
              if (!st) st = flashcl_tensor_init_bnhd(&to, bo, 0, dtype, batch, n, heads, d);
            }
            if (st) {
              tools_print_error(stderr, ctx, "flashcl_tensor_init", st);
              alloc_status = st;
            }
          }

          for (ai = 0; ai < nalgo; ++ai) {
            if (alloc_status) {
              res[ai].status = alloc_status;
              res[ai].oom = tools_is_oom(alloc_status);
              continue;
            }
            run_algo(ctx, &o, &tq, &tk, &tv, &to, causal, io_bytes, info.global_mem_size, q_count, scratch, &res[ai]);
          }

          for (ai = 0; ai < nalgo; ++ai) {
            const algo_result *r = &res[ai];
            double tflops = r->ran ? flops / (r->median_ms * 1e-3) / 1e12 : NAN;
            double speedup = NAN, rel = NAN;
            int have_rel = 0;
            char ms[32], blocks[32], spd[32], rl[32], reps[16], tf[32];
            if (!r->ran && !r->oom) ++failures;
            if (ai == flash_i && naive_i >= 0 && res[naive_i].ran && r->ran) {
              speedup = res[naive_i].median_ms / r->median_ms;
              if (r->out && res[naive_i].out) {
                rel = tools_rel_l2(r->out, res[naive_i].out, q_count);
                have_rel = 1;
              }
            }
            if (r->have_plan) snprintf(blocks, sizeof blocks, "%dx%d", r->plan.block_r, r->plan.block_c);
            else snprintf(blocks, sizeof blocks, "-");
            if (o.csv) {
              const char *stxt = r->ran ? "ok" : r->oom ? "OOM" : flashcl_status_string(r->status);
              printf("\"%s\",%ld,%ld,%s,%d,%s,%ld,%ld,%ld,%s,%d,%d,%d,", info.device_name, n, d,
                     flashcl_dtype_name(dtype), causal, o.bhnd ? "bhnd" : "bnhd", batch, heads, heads_kv,
                     tools_algo_name(r->algo), r->have_plan ? r->plan.block_r : 0,
                     r->have_plan ? r->plan.block_c : 0, r->reps);
              if (r->ran) printf("%.6f,%.6f,%.6f,", r->median_ms, r->min_ms, tflops);
              else printf(",,,");
              printf("%zu,%zu,%zu,", io_bytes, r->workspace, io_bytes + r->workspace);
              if (!isnan(speedup)) printf("%.4f", speedup);
              printf(",");
              if (have_rel) printf("%.3e", rel);
              printf(",\"%s\"\n", stxt);
            } else {
              fmt_ms(ms, sizeof ms, r);
              snprintf(reps, sizeof reps, r->ran ? "%d" : "-", r->reps);
              if (r->ran) snprintf(tf, sizeof tf, "%.4f", tflops);
              else snprintf(tf, sizeof tf, "-");
              if (!isnan(speedup)) snprintf(spd, sizeof spd, "%.2fx", speedup);
              else snprintf(spd, sizeof spd, "-");
              if (have_rel) snprintf(rl, sizeof rl, "%.2e", rel);
              else snprintf(rl, sizeof rl, "-");
              printf("%6ld %4ld %5s %6d %5ld %5ld %-5s %7s %4s %11s %9s %9.1f %8.1f %9.1f %8s %9s\n", n, d,
                     flashcl_dtype_name(dtype), causal, batch, heads, tools_algo_name(r->algo), blocks, reps, ms,
                     tf, mib(io_bytes), mib(r->workspace), mib(io_bytes + r->workspace), spd, rl);
            }
          }
          fflush(stdout);

          for (ai = 0; ai < nalgo; ++ai) free(res[ai].out);
          free(scratch);
          if (bq) clReleaseMemObject(bq);
          if (bk) clReleaseMemObject(bk);
          if (bv) clReleaseMemObject(bv);
          if (bo) clReleaseMemObject(bo);
        }

  if (!o.csv && g_host_timer)
    printf("\nnote: the queue gave no usable profiling timestamps; times are host wall-clock.\n");
  flashcl_context_destroy(ctx);
  if (failures) {
    fprintf(stderr, "flashcl-bench: %d row(s) failed with an error other than out-of-memory (see above)\n",
            failures);
    return 1;
  }
  return 0;
}
