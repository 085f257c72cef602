/*
 * flashcl-tune: times the flash forward pass for every feasible (block_r,
 * block_c) tile pair and compares the best with the default rule's choice.
 * With --decode it sweeps the decode's split count instead (tune_decode.c).
 *
 * Feasibility is whatever flashcl_attention_block_plan accepts on the device.
 * Every candidate's output is compared with the default plan's output, and a
 * candidate whose result differs (beyond rounding) is reported and never
 * chosen as best.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "tune_decode.h"

typedef struct tune_opts {
  const char *device;
  tools_list n, d, dtype, causal, br, bc;
  int have_n, have_br, have_bc, have_reps, have_batch_tokens, have_hidden, have_step;
  long batch_tokens, hidden, reps, warmup, min_block, max_block, step;
  int csv, all, verbose;
  flashcl_kernel_family kernel;
} tune_opts;

typedef struct cand {
  int br, bc;
  flashcl_block_plan plan;
  int status; /* 0 ok */
  double median_ms;
  double rel;
} cand;

static void usage(FILE *f) {
  fprintf(f,
          "usage: flashcl-tune [options]\n"
          "       flashcl-tune --decode [options]   (split counts of the decode; --decode --help)\n"
          "\n"
          "Tries every (block_r, block_c) pair that flashcl_attention_block_plan accepts,\n"
          "times the flash forward pass with it and prints the best pair per config next\n"
          "to the default rule's choice (block_r = block_c = 0) and best/default time ratio.\n"
          "Per config: batch = max(1, batch_tokens / N), heads = max(1, hidden / d).\n"
          "\n"
          "  --device SPEC       \"<platform>:<device>\" or a name substring\n"
          "  --d LIST            head dims (default 64,128)\n"
          "  --dtype LIST        f32,f16,bf16 (default f16,f32)\n"
          "  --n LIST            sequence lengths (default 4096 on GPU, 1024 otherwise)\n"
          "  --causal 0|1|both   (default 0)\n"
          "  --batch-tokens T    batch * N (default 16384 on GPU, = N otherwise)\n"
          "  --hidden H          heads * d (default 2048 on GPU, 256 otherwise)\n"
          "  --min-block B       smallest candidate block (default 8)\n"
          "  --max-block B       largest candidate block (default 128)\n"
          "  --step S            candidates are the multiples of S in [min, max]\n"
          "                      (default 8 on GPU, 32 otherwise: each pair is a kernel\n"
          "                      build, which PoCL takes about a second for)\n"
          "  --br LIST, --bc LIST  explicit candidate lists instead of the range\n"
          "  --kernel auto|portable|nvidia_mma  flash kernel family (default auto)\n"
          "  --reps R            timed runs per candidate, median used (default 5 on GPU,\n"
          "                      3 otherwise)\n"
          "  --warmup W          untimed runs per candidate (default 1)\n"
          "  --all               also print every candidate\n"
          "  --csv               CSV on stdout: one summary row per config, or with --all\n"
          "                      one row per candidate\n"
          "  --verbose           library diagnostics on stderr\n");
}

static int parse_args(int argc, char **argv, tune_opts *o) {
  const char *val = NULL;
  int i, r;
  memset(o, 0, sizeof *o);
  o->warmup = 1;
  o->min_block = 8;
  o->max_block = 128;
  o->kernel = FLASHCL_KERNEL_AUTO;
  tools_parse_int_list("64,128", &o->d);
  tools_parse_dtype_list("f16,f32", &o->dtype);
  tools_parse_causal_list("0", &o->causal);
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
    } else if (OPT("--dtype")) {
      if (tools_parse_dtype_list(val, &o->dtype)) goto bad;
    } else if (OPT("--causal")) {
      if (tools_parse_causal_list(val, &o->causal)) goto bad;
    } else if (OPT("--br")) {
      if (tools_parse_int_list(val, &o->br)) goto bad;
      o->have_br = 1;
    } else if (OPT("--bc")) {
      if (tools_parse_int_list(val, &o->bc)) goto bad;
      o->have_bc = 1;
    } else if (OPT("--batch-tokens")) {
      if (tools_parse_long(val, &o->batch_tokens) || o->batch_tokens < 1) goto bad;
      o->have_batch_tokens = 1;
    } else if (OPT("--hidden")) {
      if (tools_parse_long(val, &o->hidden) || o->hidden < 1) goto bad;
      o->have_hidden = 1;
    } else if (OPT("--min-block")) {
      if (tools_parse_long(val, &o->min_block) || o->min_block < 1) goto bad;
    } else if (OPT("--max-block")) {
      if (tools_parse_long(val, &o->max_block) || o->max_block < 1) goto bad;
    } else if (OPT("--step")) {
      if (tools_parse_long(val, &o->step) || o->step < 1) goto bad;
      o->have_step = 1;
    } else if (OPT("--kernel")) {
      if (tools_parse_kernel(val, &o->kernel)) goto bad;
    } else if (OPT("--reps")) {
      if (tools_parse_long(val, &o->reps) || o->reps < 1 || o->reps > 1000) goto bad;
      o->have_reps = 1;
    } else if (OPT("--warmup")) {
      if (tools_parse_long(val, &o->warmup) || o->warmup < 0) goto bad;
    } else if (tools_opt_flag(argv, i, "--all")) {
      o->all = 1;
    } else if (tools_opt_flag(argv, i, "--csv")) {
      o->csv = 1;
    } else if (tools_opt_flag(argv, i, "--verbose") || tools_opt_flag(argv, i, "-v")) {
      o->verbose = 1;
    } else if (tools_opt_flag(argv, i, "--help") || tools_opt_flag(argv, i, "-h")) {
      usage(stdout);
      exit(0);
    } else {
      fprintf(stderr, "flashcl-tune: unknown argument '%s'\n\n", argv[i]);
      usage(stderr);
      return -1;
    }
#undef OPT
  }
  return 0;
bad:
  fprintf(stderr, "flashcl-tune: bad value '%s' for %s\n", val ? val : "", argv[i - (val == argv[i] ? 1 : 0)]);
  return -1;
}

/* The multiples of step in [lo, hi]. */
static void fill_range(tools_list *l, long lo, long hi, long step) {
  long b = ((lo + step - 1) / step) * step;
  l->count = 0;
  for (; b <= hi && l->count < TOOLS_MAX_LIST; b += step) l->v[l->count++] = b;
}

/* Times one tile choice: appends o->reps times to times[*ntimes...]; returns
 * the status. host_out (if not NULL) receives the output. */
static int time_blocks(flashcl_context *ctx, const tune_opts *o, int causal, int br, int bc,
                       const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                       const flashcl_tensor *out, size_t count, void *raw, float *host_out, double *times,
                       int *ntimes) {
  flashcl_attention_desc desc;
  double ms = 0.0;
  int st, host_timer = 0;
  long i;
  flashcl_attention_desc_init(&desc);
  desc.causal = causal;
  desc.algo = FLASHCL_ALGO_FLASH;
  desc.kernel = o->kernel;
  desc.block_r = br;
  desc.block_c = bc;
  for (i = 0; i < o->warmup; ++i) {
    st = tools_timed_forward(ctx, &desc, q, k, v, out, &ms, &host_timer);
    if (st) return st;
  }
  for (i = 0; i < o->reps; ++i) {
    st = tools_timed_forward(ctx, &desc, q, k, v, out, &ms, &host_timer);
    if (st) return st;
    times[(*ntimes)++] = ms;
  }
  if (!host_out) return FLASHCL_SUCCESS;
  return tools_read_as_float(flashcl_context_cl_queue(ctx), out->buffer, out->dtype, count, raw, host_out);
}

/* Median of o->reps timed runs of one tile choice. */
static int time_median(flashcl_context *ctx, const tune_opts *o, int causal, int br, int bc,
                       const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                       const flashcl_tensor *out, size_t count, void *raw, float *host_out, double *median) {
  double times[1000];
  int nt = 0;
  int st = time_blocks(ctx, o, causal, br, bc, q, k, v, out, count, raw, host_out, times, &nt);
  if (!st) *median = tools_median(times, nt);
  return st;
}

int main(int argc, char **argv) {
  tune_opts o;
  flashcl_context_options options;
  flashcl_context *ctx = NULL;
  flashcl_device_info info;
  char devdesc[512];
  int st, di, ti, ci, ni, errors = 0;
  cl_context clctx;
  cl_command_queue queue;

  for (int i = 1; i < argc; ++i)
    if (!strcmp(argv[i], "--decode")) return tune_decode_main(argc, argv);
  if (parse_args(argc, argv, &o) != 0) return 1;
  if (tools_open_context("flashcl-tune", o.device, o.verbose, &options, &ctx, &info)) return 2;
  if (!o.have_n) tools_parse_int_list(info.is_gpu ? "4096" : "1024", &o.n);
  if (!o.have_reps) o.reps = info.is_gpu ? 5 : 3;
  if (!o.have_hidden) o.hidden = info.is_gpu ? 2048 : 256;
  if (!o.have_step) o.step = info.is_gpu ? 8 : 32;
  if (!o.have_br) fill_range(&o.br, o.min_block, o.max_block, o.step);
  if (!o.have_bc) fill_range(&o.bc, o.min_block, o.max_block, o.step);
  clctx = flashcl_context_cl_context(ctx);
  queue = flashcl_context_cl_queue(ctx);
  tools_describe_device(ctx, devdesc, sizeof devdesc);

  if (o.csv) {
    if (o.all)
      printf("device,d,dtype,causal,n,batch,heads,block_r,block_c,threads,local_bytes,median_ms,tflops,"
             "rel_l2_vs_default,is_default,status\n");
    else
      printf("device,d,dtype,causal,n,batch,heads,default_block_r,default_block_c,default_ms,best_block_r,"
             "best_block_c,best_ms,best_over_default,feasible,failed\n");
  } else {
    printf("flashcl-tune %s on %s\n", FLASHCL_VERSION_STRING, devdesc);
    printf("median of %ld runs after %ld warmup per candidate (2 x %ld for the default plan, before\n"
           "and after the candidates); %d x %d candidate pairs\n\n", o.reps, o.warmup,
           o.reps, o.br.count, o.bc.count);
  }
  fflush(stdout);

  for (di = 0; di < o.d.count; ++di)
    for (ti = 0; ti < o.dtype.count; ++ti)
      for (ci = 0; ci < o.causal.count; ++ci)
        for (ni = 0; ni < o.n.count; ++ni) {
          const long d = o.d.v[di], n = o.n.v[ni];
          const flashcl_dtype dtype = (flashcl_dtype)o.dtype.v[ti];
          const int causal = (int)o.causal.v[ci];
          const long bt = o.have_batch_tokens ? o.batch_tokens : (info.is_gpu ? 16384 : n);
          const long batch = bt / n > 0 ? bt / n : 1;
          const long heads = o.hidden / d > 0 ? o.hidden / d : 1;
          const size_t esize = flashcl_dtype_size(dtype);
          const size_t count = (size_t)batch * (size_t)n * (size_t)heads * (size_t)d;
          const double flops = 4.0 * (double)n * (double)n * (double)d * (double)batch * (double)heads *
                               (causal ? 0.5 : 1.0);
          const double tol = dtype == FLASHCL_F32 ? 1e-4 : 2e-2;
          cl_mem bq = NULL, bk = NULL, bv = NULL, bo = NULL;
          flashcl_tensor tq, tk, tv, to;
          cl_int err = CL_SUCCESS;
          void *raw = malloc(count * (esize > 4 ? esize : 4));
          float *ref = (float *)malloc(count * sizeof(float));
          float *got = (float *)malloc(count * sizeof(float));
          flashcl_block_plan def_plan;
          double def_ms = NAN, def_times[2000];
          int def_nt = 0;
          cand *cands = (cand *)calloc((size_t)o.br.count * (size_t)o.bc.count, sizeof(cand));
          int ncand = 0, feasible = 0, failed = 0, best = -1, bi, ci2, fault = 0;

          if (!raw || !ref || !got || !cands) {
            fprintf(stderr, "flashcl-tune: host allocation failed (N=%ld d=%ld)\n", n, d);
            ++errors;
            goto next;
          }
          bq = tools_random_buffer(clctx, queue, dtype, count, 11 + (uint64_t)ni, raw, &err);
          if (bq) bk = tools_random_buffer(clctx, queue, dtype, count, 22 + (uint64_t)ni, raw, &err);
          if (bk) bv = tools_random_buffer(clctx, queue, dtype, count, 33 + (uint64_t)ni, raw, &err);
          if (bv) bo = clCreateBuffer(clctx, CL_MEM_READ_WRITE, count * esize, NULL, &err);
          if (!bo || err) {
            fprintf(stderr, "flashcl-tune: cannot allocate inputs for N=%ld d=%ld %s: %s (%d)\n", n, d,
                    flashcl_dtype_name(dtype), flashcl_status_string(err), err);
            ++errors;
            goto next;
          }
          flashcl_tensor_init_bnhd(&tq, bq, 0, dtype, batch, n, heads, d);
          flashcl_tensor_init_bnhd(&tk, bk, 0, dtype, batch, n, heads, d);
          flashcl_tensor_init_bnhd(&tv, bv, 0, dtype, batch, n, heads, d);
          flashcl_tensor_init_bnhd(&to, bo, 0, dtype, batch, n, heads, d);

          memset(&def_plan, 0, sizeof def_plan);
          st = flashcl_attention_block_plan(ctx, (int)d, dtype, 0, 0, &def_plan);
          def_nt = 0;
          if (!st) st = time_blocks(ctx, &o, causal, 0, 0, &tq, &tk, &tv, &to, count, raw, ref, def_times, &def_nt);
          if (st) {
            char what[128];
            snprintf(what, sizeof what, "d=%ld %s causal=%d N=%ld: default plan", d, flashcl_dtype_name(dtype),
                     causal, n);
            tools_print_error(stderr, ctx, what, st);
            ++errors;
            fault = !tools_is_validation_error(st);
            goto next;
          }

          for (bi = 0; bi < o.br.count && !fault; ++bi)
            for (ci2 = 0; ci2 < o.bc.count && !fault; ++ci2) {
              cand *c = &cands[ncand];
              c->br = (int)o.br.v[bi];
              c->bc = (int)o.bc.v[ci2];
              c->rel = NAN;
              c->median_ms = NAN;
              if (flashcl_attention_block_plan(ctx, (int)d, dtype, c->br, c->bc, &c->plan) != FLASHCL_SUCCESS)
                continue; /* infeasible on this device: not a candidate */
              ++ncand;
              ++feasible;
              c->status = time_median(ctx, &o, causal, c->br, c->bc, &tq, &tk, &tv, &to, count, raw, got,
                                      &c->median_ms);
              if (c->status) {
                char what[160];
                snprintf(what, sizeof what, "d=%ld %s causal=%d N=%ld Br=%d Bc=%d", d, flashcl_dtype_name(dtype),
                         causal, n, c->br, c->bc);
                tools_print_error(stderr, ctx, what, c->status);
                ++failed;
                if (!tools_is_validation_error(c->status)) {
                  fprintf(stderr, "flashcl-tune: device error: skipping the rest of this config\n");
                  fault = 1;
                }
                continue;
              }
              c->rel = tools_rel_l2(got, ref, count);
              if (!(c->rel <= tol)) {
                fprintf(stderr,
                        "flashcl-tune: d=%ld %s causal=%d N=%ld Br=%d Bc=%d: output differs from the default "
                        "plan's (rel L2 %.3e > %.0e); not a candidate\n",
                        d, flashcl_dtype_name(dtype), causal, n, c->br, c->bc, c->rel, tol);
                ++failed;
                continue;
              }
              if (best < 0 || c->median_ms < cands[best].median_ms) best = ncand - 1;
            }
          if (failed) errors += failed;
          /* The default plan is timed again after the candidates, and its figure is
           * the median of both sets, so slow drift (clocks, caches, other load)
           * does not favour either side. */
          st = fault ? FLASHCL_SUCCESS
                     : time_blocks(ctx, &o, causal, 0, 0, &tq, &tk, &tv, &to, count, raw, NULL, def_times, &def_nt);
          if (st) {
            tools_print_error(stderr, ctx, "default plan (second timing)", st);
            ++errors;
          }
          def_ms = tools_median(def_times, def_nt);

          if (o.all) {
            int i;
            for (i = 0; i < ncand; ++i) {
              const cand *c = &cands[i];
              int is_def = c->br == def_plan.block_r && c->bc == def_plan.block_c;
              const char *s = c->status ? flashcl_status_string(c->status) : !(c->rel <= tol) ? "mismatch" : "ok";
              if (o.csv)
                printf("\"%s\",%ld,%s,%d,%ld,%ld,%ld,%d,%d,%d,%zu,%.6f,%.6f,%.3e,%d,\"%s\"\n", info.device_name, d,
                       flashcl_dtype_name(dtype), causal, n, batch, heads, c->br, c->bc, c->plan.threads,
                       c->plan.local_bytes, c->median_ms, flops / (c->median_ms * 1e-3) / 1e12, c->rel, is_def,
                       s);
              else
                printf("  d=%-3ld %-4s causal=%d N=%-6ld Br=%-3d Bc=%-3d threads=%-4d local=%-7zu %10.3f ms "
                       "%8.4f TFLOP/s relL2=%.1e %s%s\n",
                       d, flashcl_dtype_name(dtype), causal, n, c->br, c->bc, c->plan.threads, c->plan.local_bytes,
                       c->median_ms, flops / (c->median_ms * 1e-3) / 1e12, c->rel, s, is_def ? " (default)" : "");
            }
          }
          if (!o.csv) {
            printf("d=%ld %s causal=%d N=%ld (batch %ld, heads %ld): default %dx%d %.3f ms", d,
                   flashcl_dtype_name(dtype), causal, n, batch, heads, def_plan.block_r, def_plan.block_c, def_ms);
            if (best >= 0)
              printf(" | best %dx%d %.3f ms | best/default %.3f (%d feasible, %d failed)\n", cands[best].br,
                     cands[best].bc, cands[best].median_ms, cands[best].median_ms / def_ms, feasible, failed);
            else
              printf(" | no working candidate (%d feasible, %d failed)\n", feasible, failed);
          } else if (!o.all) {
            printf("\"%s\",%ld,%s,%d,%ld,%ld,%ld,%d,%d,%.6f,", info.device_name, d, flashcl_dtype_name(dtype), causal,
                   n, batch, heads, def_plan.block_r, def_plan.block_c, def_ms);
            if (best >= 0)
              printf("%d,%d,%.6f,%.4f,", cands[best].br, cands[best].bc, cands[best].median_ms,
                     cands[best].median_ms / def_ms);
            else
              printf(",,,,");
            printf("%d,%d\n", feasible, failed);
          }
          fflush(stdout);
        next:
          free(raw);
          free(ref);
          free(got);
          free(cands);
          if (bq) clReleaseMemObject(bq);
          if (bk) clReleaseMemObject(bk);
          if (bv) clReleaseMemObject(bv);
          if (bo) clReleaseMemObject(bo);
          if (fault) {
            /* A device-side failure can poison the OpenCL context: go on with a fresh one. */
            fprintf(stderr, "flashcl-tune: recreating the context after a device error\n");
            flashcl_context_destroy(ctx);
            ctx = NULL;
            st = flashcl_context_create(&options, &ctx);
            if (st != FLASHCL_SUCCESS) {
              fprintf(stderr,
                      "flashcl-tune: cannot recreate the context (%s, %d): the driver keeps failing after the device\n"
                      "error (NVIDIA's does, for the whole process); the remaining configurations were not run\n",
                      flashcl_status_string(st), st);
              return 2;
            }
            clctx = flashcl_context_cl_context(ctx);
            queue = flashcl_context_cl_queue(ctx);
          }
        }

  flashcl_context_destroy(ctx);
  if (errors) {
    fprintf(stderr, "flashcl-tune: %d failure(s), see above\n", errors);
    return 1;
  }
  return 0;
}
