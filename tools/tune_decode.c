/*
 * flashcl-tune --decode-splits: times flashcl_attention_decode with a range of split
 * counts (desc.split.num_splits) per shape and compares the best with the library's
 * own choice (num_splits = 0, from the compute units, batch x kv heads and the
 * KV length). The split count is the decode's one public tuning knob: the
 * right value depends on the device's occupancy and launch costs, which the
 * library only estimates.
 *
 * Every candidate's output is compared with the automatic choice's; one that
 * differs beyond rounding is reported and never chosen as best.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "common.h"
#include "tune_decode.h"

typedef struct dec_opts {
  const char *device;
  tools_list n, batch, d, dtype, splits;
  int have_n, have_batch, have_splits, have_reps, csv, verbose;
  long q_len, gqa, heads, calls, reps, warmup;
  flashcl_kernel_family kernel;
} dec_opts;

static void dec_usage(FILE *f) {
  fprintf(f,
          "usage: flashcl-tune --decode-splits [options]\n"
          "\n"
          "Times flashcl_attention_decode for each split count (desc.split.num_splits) and\n"
          "prints the best next to the library's automatic choice (num_splits = 0).\n"
          "Contiguous cache, every sequence at the full KV length.\n"
          "\n"
          "  --device SPEC       \"<platform>:<device>\" or a name substring\n"
          "  --n LIST            KV lengths (default 32768 on GPU, 2048 otherwise)\n"
          "  --decode-batch LIST sequences per call (default 1,8 on GPU, 1 otherwise)\n"
          "  --q-len T           new tokens per sequence, 1..%d (default 1)\n"
          "  --heads H           query heads (default 32)\n"
          "  --gqa G             query heads per kv head (default 4)\n"
          "  --d LIST            head dims (default 128)\n"
          "  --dtype LIST        f32,f16,bf16 (default f16)\n"
          "  --splits LIST       candidates (default 1, 2, 4, ... up to %d, at most one\n"
          "                      per 16 keys)\n"
          "  --kernel auto|portable|nvidia_mma  decode kernel family (default auto)\n"
          "  --calls C           back-to-back calls per timing (default 20 on GPU, 1 otherwise)\n"
          "  --reps R            timings per candidate, median used (default 10 on GPU, 3 otherwise)\n"
          "  --warmup W          untimed timings per candidate (default 1)\n"
          "  --csv               one CSV row per config on stdout\n"
          "  --verbose           library diagnostics on stderr\n",
          FLASHCL_DECODE_MAX_Q_LEN, FLASHCL_DECODE_MAX_SPLITS);
}

static args_status dec_parse(int argc, char **argv, dec_opts *o) {
  const args_opt table[] = {
      {.name = "--decode-splits", .kind = ARG_FLAG}, /* what brought us here */
      {.name = "--device", .kind = ARG_STRING, .dest = &o->device},
      {.name = "--n", .kind = ARG_INT_LIST, .dest = &o->n, .seen = &o->have_n},
      {.name = "--decode-batch", .kind = ARG_INT_LIST, .dest = &o->batch, .seen = &o->have_batch},
      {.name = "--q-len", .kind = ARG_LONG, .dest = &o->q_len, .lo = 1, .hi = FLASHCL_DECODE_MAX_Q_LEN},
      {.name = "--heads", .kind = ARG_LONG, .dest = &o->heads, .lo = 1, .hi = LONG_MAX},
      {.name = "--gqa", .kind = ARG_LONG, .dest = &o->gqa, .lo = 1, .hi = LONG_MAX},
      {.name = "--d", .kind = ARG_INT_LIST, .dest = &o->d},
      {.name = "--dtype", .kind = ARG_DTYPE_LIST, .dest = &o->dtype},
      {.name = "--splits", .kind = ARG_INT_LIST, .dest = &o->splits, .seen = &o->have_splits},
      {.name = "--kernel", .kind = ARG_KERNEL, .dest = &o->kernel},
      {.name = "--calls", .kind = ARG_LONG, .dest = &o->calls, .lo = 1, .hi = 1000},
      {.name = "--reps", .kind = ARG_LONG, .dest = &o->reps, .seen = &o->have_reps, .lo = 1, .hi = 500},
      {.name = "--warmup", .kind = ARG_LONG, .dest = &o->warmup, .lo = 0, .hi = LONG_MAX},
      {.name = "--csv", .kind = ARG_FLAG, .dest = &o->csv},
      {.name = "--verbose", .alias = "-v", .kind = ARG_FLAG, .dest = &o->verbose},
      {.name = "--help", .alias = "-h", .kind = ARG_HELP},
  };
  memset(o, 0, sizeof *o);
  o->q_len = 1;
  o->gqa = 4;
  o->heads = 32;
  o->warmup = 1;
  o->kernel = FLASHCL_KERNEL_AUTO;
  tools_parse_int_list("128", &o->d);
  tools_parse_dtype_list("f16", &o->dtype);
  const args_status st = args_parse(argc, argv, "flashcl-tune --decode-splits", table, ARGS_COUNT(table));
  if (st == ARGS_OK && o->heads % o->gqa) {
    fprintf(stderr, "flashcl-tune --decode-splits: --heads %ld is not a multiple of --gqa %ld\n", o->heads, o->gqa);
    return ARGS_BAD_VALUE;
  }
  return st;
}

/* One timing setup: the tensors of a config and where its output lands. */
typedef struct dec_prob {
  flashcl_tensor q, kc, vc, o;
  cl_mem lens;
  size_t out_count;
} dec_prob;

/* Median time per call of `splits` (0: automatic) over o->reps timings; the
 * output (if host_out) and the split count the library planned (if planned). */
static int time_splits(flashcl_context *ctx, const dec_opts *o, const dec_prob *p, int splits, void *raw,
                       float *host_out, double *times, int *ntimes, int *planned) {
  flashcl_decode_desc desc;
  double ms = 0.0, hus = 0.0;
  int st, host_timer = 0;
  long i;
  flashcl_decode_desc_init(&desc);
  desc.split.num_splits = splits;
  desc.kernel = o->kernel;
  if (planned) {
    size_t ws = 0;
    st = flashcl_attention_decode_workspace_size(ctx, &desc, &p->q, &p->kc, &p->vc, &ws, planned);
    if (st) return st;
  }
  for (i = 0; i < o->warmup + o->reps; ++i) {
    st = tools_timed_decode(ctx, &desc, &p->q, &p->kc, &p->vc, p->lens, &p->o, NULL, o->calls, &ms, &hus,
                            &host_timer);
    if (st) return st;
    if (i >= o->warmup) times[(*ntimes)++] = ms;
  }
  if (!host_out) return FLASHCL_SUCCESS;
  return tools_read_as_float(flashcl_context_cl_queue(ctx), p->o.buffer, p->o.dtype, p->out_count, raw, host_out);
}

/* The defaults that depend on the device (see dec_usage). */
static void dec_defaults(dec_opts *o, int is_gpu) {
  if (!o->have_n) tools_parse_int_list(is_gpu ? "32768" : "2048", &o->n);
  if (!o->have_batch) tools_parse_int_list(is_gpu ? "1,8" : "1", &o->batch);
  if (!o->have_reps) o->reps = is_gpu ? 10 : 3;
  if (!o->calls) o->calls = is_gpu ? 20 : 1;
}

/* One config (d, dtype, batch, KV length) with its buffers and host copies. */
typedef struct dec_config {
  long d, B, n;
  flashcl_dtype dt;
  int ni; /* index of n in --n: varies the inputs' seeds */
  size_t qn;
  dec_prob p;
  cl_mem bq, bk, bv, bo;
  void *raw;
  float *ref, *got; /* the automatic choice's output, a candidate's */
} dec_config;

/* What one config's sweep found. */
typedef struct dec_result {
  int auto_splits, best, tried, failed;
  double auto_ms, best_ms;
} dec_result;

static cl_mem lens_buffer(cl_context clctx, long B, long n, cl_int *err) {
  cl_int *lens = malloc(sizeof(cl_int) * (size_t)B);
  cl_mem m;
  long b;
  for (b = 0; lens && b < B; ++b) lens[b] = (cl_int)n;
  m = lens ? clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(cl_int) * (size_t)B, lens, err)
           : NULL;
  free(lens);
  return m;
}

/* Random q, k, v, and o, lens on the device; 0, or 1 after reporting why not. */
static int dec_alloc(flashcl_context *ctx, const dec_opts *o, dec_config *c) {
  cl_context clctx = flashcl_context_cl_context(ctx);
  cl_command_queue queue = flashcl_context_cl_queue(ctx);
  const long hq = o->heads, hkv = o->heads / o->gqa, T = o->q_len;
  const size_t es = flashcl_dtype_size(c->dt);
  const size_t qn = (size_t)c->B * T * hq * c->d, kvn = (size_t)c->B * c->n * hkv * c->d;
  cl_int err = CL_SUCCESS;
  c->raw = malloc((kvn > qn ? kvn : qn) * (es > 4 ? es : 4));
  c->ref = malloc(qn * sizeof(float));
  c->got = malloc(qn * sizeof(float));
  if (!c->raw || !c->ref || !c->got) {
    fprintf(stderr, "flashcl-tune --decode-splits: host allocation failed (N=%ld batch %ld)\n", c->n, c->B);
    return 1;
  }
  c->bq = tools_random_buffer(clctx, queue, c->dt, qn, 101 + (uint64_t)c->ni, c->raw, &err);
  if (c->bq) c->bk = tools_random_buffer(clctx, queue, c->dt, kvn, 202 + (uint64_t)c->ni, c->raw, &err);
  if (c->bk) c->bv = tools_random_buffer(clctx, queue, c->dt, kvn, 303 + (uint64_t)c->ni, c->raw, &err);
  if (c->bv) c->bo = clCreateBuffer(clctx, CL_MEM_READ_WRITE, qn * es, NULL, &err);
  if (c->bo) c->p.lens = lens_buffer(clctx, c->B, c->n, &err);
  if (!c->p.lens || err) {
    fprintf(stderr, "flashcl-tune --decode-splits: cannot allocate N=%ld batch %ld d=%ld %s: %s (%d)\n", c->n, c->B,
            c->d, flashcl_dtype_name(c->dt), flashcl_status_string(err), err);
    return 1;
  }
  flashcl_tensor_init_bnhd(&c->p.q, c->bq, 0, c->dt, c->B, T, hq, c->d);
  flashcl_tensor_init_bnhd(&c->p.kc, c->bk, 0, c->dt, c->B, c->n, hkv, c->d);
  flashcl_tensor_init_bnhd(&c->p.vc, c->bv, 0, c->dt, c->B, c->n, hkv, c->d);
  flashcl_tensor_init_bnhd(&c->p.o, c->bo, 0, c->dt, c->B, T, hq, c->d);
  c->p.out_count = c->qn = qn;
  return 0;
}

static void dec_release(dec_config *c) {
  free(c->raw);
  free(c->ref);
  free(c->got);
  if (c->bq) clReleaseMemObject(c->bq);
  if (c->bk) clReleaseMemObject(c->bk);
  if (c->bv) clReleaseMemObject(c->bv);
  if (c->bo) clReleaseMemObject(c->bo);
  if (c->p.lens) clReleaseMemObject(c->p.lens);
}

/* --splits, else 1, 2, 4, ... while each split keeps at least 16 keys. */
static void candidate_splits(const dec_opts *o, long n, tools_list *cands) {
  long s;
  if (o->have_splits) {
    *cands = o->splits;
    return;
  }
  cands->count = 0;
  for (s = 1; s <= FLASHCL_DECODE_MAX_SPLITS && (s == 1 || s * 16 <= n) && cands->count < TOOLS_MAX_LIST; s *= 2)
    cands->v[cands->count++] = s;
}

/* Times every candidate against the automatic choice's output in c->ref; a
 * failing or differing candidate counts in r->failed and is never best. */
static void time_candidates(flashcl_context *ctx, const dec_opts *o, dec_config *c, dec_result *r) {
  const double tol = c->dt == FLASHCL_F32 ? 1e-4 : 2e-2;
  double times[500];
  tools_list cands;
  candidate_splits(o, c->n, &cands);
  for (int si = 0; si < cands.count; ++si) {
    const int s = (int)cands.v[si];
    int nt = 0;
    if (s < 1 || s > FLASHCL_DECODE_MAX_SPLITS) continue;
    ++r->tried;
    const int st = time_splits(ctx, o, &c->p, s, c->raw, c->got, times, &nt, NULL);
    if (st) {
      char what[160];
      snprintf(what, sizeof what, "N=%ld batch %ld d=%ld %s: %d splits", c->n, c->B, c->d, flashcl_dtype_name(c->dt),
               s);
      tools_print_error(stderr, ctx, what, st);
      ++r->failed;
      continue;
    }
    const double rel = tools_rel_l2(c->got, c->ref, c->qn);
    if (!(rel <= tol)) {
      fprintf(stderr,
              "flashcl-tune --decode-splits: N=%ld batch %ld d=%ld %s: %d splits give another result (rel L2 "
              "%.3e > %.0e); not a candidate\n",
              c->n, c->B, c->d, flashcl_dtype_name(c->dt), s, rel, tol);
      ++r->failed;
      continue;
    }
    const double med = tools_median(times, nt);
    if (med < r->best_ms) r->best_ms = med, r->best = s;
  }
}

static void print_result(const dec_opts *o, const flashcl_device_info *info, const dec_config *c,
                         const dec_result *r) {
  const long hq = o->heads, hkv = o->heads / o->gqa;
  const double kv_bytes = 2.0 * (double)((size_t)c->B * c->n * hkv * c->d) * (double)flashcl_dtype_size(c->dt);
  const double auto_gbps = kv_bytes / (r->auto_ms * 1e-3) / 1e9, best_gbps = kv_bytes / (r->best_ms * 1e-3) / 1e9;
  if (o->csv) {
    printf("\"%s\",%ld,%ld,%ld,%s,%ld,%ld,%ld,%d,%.6f,%.3f,", info->device_name, c->n, c->B, c->d,
           flashcl_dtype_name(c->dt), hq, hkv, o->q_len, r->auto_splits, r->auto_ms, auto_gbps);
    if (r->best > 0) printf("%d,%.6f,%.3f,%.4f,", r->best, r->best_ms, best_gbps, r->best_ms / r->auto_ms);
    else printf(",,,,");
    printf("%d,%d\n", r->tried, r->failed);
  } else {
    printf("N=%ld batch %ld d=%ld %s: auto %d splits %.4f ms (%.2f GB/s)", c->n, c->B, c->d,
           flashcl_dtype_name(c->dt), r->auto_splits, r->auto_ms, auto_gbps);
    if (r->best > 0)
      printf(" | best %d splits %.4f ms (%.2f GB/s) | best/auto %.3f (%d tried, %d failed)\n", r->best, r->best_ms,
             best_gbps, r->best_ms / r->auto_ms, r->tried, r->failed);
    else
      printf(" | no working candidate (%d tried, %d failed)\n", r->tried, r->failed);
  }
  fflush(stdout);
}

/* Sweeps one config (its buffers already in c); returns its failures. */
static int sweep_config(flashcl_context *ctx, const dec_opts *o, const flashcl_device_info *info, dec_config *c) {
  double auto_times[1000];
  int auto_nt = 0, errors;
  dec_result r = {0, -1, 0, 0, NAN, INFINITY};
  int st = time_splits(ctx, o, &c->p, 0, c->raw, c->ref, auto_times, &auto_nt, &r.auto_splits);
  if (st) {
    char what[160];
    snprintf(what, sizeof what, "N=%ld batch %ld d=%ld %s: automatic split count", c->n, c->B, c->d,
             flashcl_dtype_name(c->dt));
    tools_print_error(stderr, ctx, what, st);
    return 1;
  }
  time_candidates(ctx, o, c, &r);
  errors = r.failed;
  /* The automatic choice again after the candidates, so that drift favours neither side. */
  st = time_splits(ctx, o, &c->p, 0, c->raw, NULL, auto_times, &auto_nt, NULL);
  if (st) {
    tools_print_error(stderr, ctx, "automatic split count (second timing)", st);
    ++errors;
  }
  r.auto_ms = tools_median(auto_times, auto_nt);
  print_result(o, info, c, &r);
  return errors;
}

int tune_decode_main(int argc, char **argv) {
  dec_opts o;
  flashcl_context_options options;
  flashcl_context *ctx = NULL;
  flashcl_device_info info;
  char devdesc[512];
  int errors = 0;

  const args_status parsed = dec_parse(argc, argv, &o);
  if (parsed == ARGS_HELP) {
    dec_usage(stdout);
    return 0;
  }
  if (parsed == ARGS_UNKNOWN) {
    fputc('\n', stderr);
    dec_usage(stderr);
  }
  if (parsed != ARGS_OK) return 1;
  if (tools_open_context("flashcl-tune", o.device, o.verbose, &options, &ctx, &info)) return 2;
  dec_defaults(&o, info.is_gpu);
  tools_describe_device(ctx, devdesc, sizeof devdesc);
  if (o.csv)
    printf("device,n,batch,d,dtype,heads,heads_kv,q_len,auto_splits,auto_ms,auto_gbps,best_splits,best_ms,best_gbps,"
           "best_over_auto,candidates,failed\n");
  else
    printf("flashcl-tune --decode %s on %s\n%ld query / %ld kv heads, q_len %ld, contiguous cache; median of %ld "
           "timings of %ld back-to-back calls per candidate\n(2 x %ld for the automatic choice, before and after "
           "the candidates)\n\n",
           FLASHCL_VERSION_STRING, devdesc, o.heads, o.heads / o.gqa, o.q_len, o.reps, o.calls, o.reps);
  fflush(stdout);

  for (int di = 0; di < o.d.count; ++di)
    for (int ti = 0; ti < o.dtype.count; ++ti)
      for (int bi = 0; bi < o.batch.count; ++bi)
        for (int ni = 0; ni < o.n.count; ++ni) {
          dec_config c;
          memset(&c, 0, sizeof c);
          c.d = o.d.v[di], c.B = o.batch.v[bi], c.n = o.n.v[ni], c.dt = (flashcl_dtype)o.dtype.v[ti], c.ni = ni;
          errors += dec_alloc(ctx, &o, &c) ? 1 : sweep_config(ctx, &o, &info, &c);
          dec_release(&c);
        }

  flashcl_context_destroy(ctx);
  if (errors) {
    fprintf(stderr, "flashcl-tune --decode-splits: %d failure(s), see above\n", errors);
    return 1;
  }
  return 0;
}
