/*
 * flashcl-tune --decode-splits: times flashcl_attention_decode with a range of split
 * counts (desc.num_splits) per shape and compares the best with the library's
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
          "Times flashcl_attention_decode for each split count (desc.num_splits) and\n"
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

static int dec_parse(int argc, char **argv, dec_opts *o) {
  const char *val = NULL;
  int i, r;
  memset(o, 0, sizeof *o);
  o->q_len = 1;
  o->gqa = 4;
  o->heads = 32;
  o->warmup = 1;
  o->kernel = FLASHCL_KERNEL_AUTO;
  tools_parse_int_list("128", &o->d);
  tools_parse_dtype_list("f16", &o->dtype);
  for (i = 1; i < argc; ++i) {
    val = NULL;
#define OPT(name) ((r = tools_opt_value(argc, argv, &i, name, &val)) != 0 && (r > 0 || (exit(1), 0)))
    if (tools_opt_flag(argv, i, "--decode-splits")) {
      continue;
    } else if (OPT("--device")) {
      o->device = val;
    } else if (OPT("--n")) {
      if (tools_parse_int_list(val, &o->n)) goto bad;
      o->have_n = 1;
    } else if (OPT("--decode-batch")) {
      if (tools_parse_int_list(val, &o->batch)) goto bad;
      o->have_batch = 1;
    } else if (OPT("--q-len")) {
      if (tools_parse_long(val, &o->q_len) || o->q_len < 1 || o->q_len > FLASHCL_DECODE_MAX_Q_LEN) goto bad;
    } else if (OPT("--heads")) {
      if (tools_parse_long(val, &o->heads) || o->heads < 1) goto bad;
    } else if (OPT("--gqa")) {
      if (tools_parse_long(val, &o->gqa) || o->gqa < 1) goto bad;
    } else if (OPT("--d")) {
      if (tools_parse_int_list(val, &o->d)) goto bad;
    } else if (OPT("--dtype")) {
      if (tools_parse_dtype_list(val, &o->dtype)) goto bad;
    } else if (OPT("--splits")) {
      if (tools_parse_int_list(val, &o->splits)) goto bad;
      o->have_splits = 1;
    } else if (OPT("--kernel")) {
      if (tools_parse_kernel(val, &o->kernel)) goto bad;
    } else if (OPT("--calls")) {
      if (tools_parse_long(val, &o->calls) || o->calls < 1 || o->calls > 1000) goto bad;
    } else if (OPT("--reps")) {
      if (tools_parse_long(val, &o->reps) || o->reps < 1 || o->reps > 500) goto bad;
      o->have_reps = 1;
    } else if (OPT("--warmup")) {
      if (tools_parse_long(val, &o->warmup) || o->warmup < 0) goto bad;
    } else if (tools_opt_flag(argv, i, "--csv")) {
      o->csv = 1;
    } else if (tools_opt_flag(argv, i, "--verbose") || tools_opt_flag(argv, i, "-v")) {
      o->verbose = 1;
    } else if (tools_opt_flag(argv, i, "--help") || tools_opt_flag(argv, i, "-h")) {
      dec_usage(stdout);
      exit(0);
    } else {
      fprintf(stderr, "flashcl-tune --decode-splits: unknown argument '%s'\n\n", argv[i]);
      dec_usage(stderr);
      return -1;
    }
#undef OPT
  }
  if (o->heads % o->gqa) {
    fprintf(stderr, "flashcl-tune --decode-splits: --heads %ld is not a multiple of --gqa %ld\n", o->heads, o->gqa);
    return -1;
  }
  return 0;
bad:
  fprintf(stderr, "flashcl-tune --decode-splits: bad value '%s' for %s\n", val ? val : "", argv[i - (val == argv[i] ? 1 : 0)]);
  return -1;
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
  desc.num_splits = splits;
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

int tune_decode_main(int argc, char **argv) {
  dec_opts o;
  flashcl_context_options options;
  flashcl_context *ctx = NULL;
  flashcl_device_info info;
  char devdesc[512];
  int st, errors = 0, ni, bi, di, ti, si;
  cl_context clctx;
  cl_command_queue queue;

  if (dec_parse(argc, argv, &o) != 0) return 1;
  if (tools_open_context("flashcl-tune", o.device, o.verbose, &options, &ctx, &info)) return 2;
  if (!o.have_n) tools_parse_int_list(info.is_gpu ? "32768" : "2048", &o.n);
  if (!o.have_batch) tools_parse_int_list(info.is_gpu ? "1,8" : "1", &o.batch);
  if (!o.have_reps) o.reps = info.is_gpu ? 10 : 3;
  if (!o.calls) o.calls = info.is_gpu ? 20 : 1;
  clctx = flashcl_context_cl_context(ctx);
  queue = flashcl_context_cl_queue(ctx);
  tools_describe_device(ctx, devdesc, sizeof devdesc);
  const long hq = o.heads, hkv = o.heads / o.gqa, T = o.q_len;
  if (o.csv)
    printf("device,n,batch,d,dtype,heads,heads_kv,q_len,auto_splits,auto_ms,auto_gbps,best_splits,best_ms,best_gbps,"
           "best_over_auto,candidates,failed\n");
  else
    printf("flashcl-tune --decode %s on %s\n%ld query / %ld kv heads, q_len %ld, contiguous cache; median of %ld "
           "timings of %ld back-to-back calls per candidate\n(2 x %ld for the automatic choice, before and after "
           "the candidates)\n\n",
           FLASHCL_VERSION_STRING, devdesc, hq, hkv, T, o.reps, o.calls, o.reps);
  fflush(stdout);

  for (di = 0; di < o.d.count; ++di)
    for (ti = 0; ti < o.dtype.count; ++ti)
      for (bi = 0; bi < o.batch.count; ++bi)
        for (ni = 0; ni < o.n.count; ++ni) {
          const long d = o.d.v[di], B = o.batch.v[bi], n = o.n.v[ni];
          const flashcl_dtype dt = (flashcl_dtype)o.dtype.v[ti];
          const size_t es = flashcl_dtype_size(dt);
          const size_t qn = (size_t)B * T * hq * d, kvn = (size_t)B * n * hkv * d;
          const double kv_bytes = 2.0 * (double)kvn * (double)es;
          const double tol = dt == FLASHCL_F32 ? 1e-4 : 2e-2;
          dec_prob p;
          cl_mem bq = NULL, bk = NULL, bv = NULL, bo = NULL;
          cl_int err = CL_SUCCESS;
          void *raw = malloc((kvn > qn ? kvn : qn) * (es > 4 ? es : 4));
          float *ref = malloc(qn * sizeof(float)), *got = malloc(qn * sizeof(float));
          double auto_times[1000], times[500];
          int auto_nt = 0, auto_splits = 0, best = -1, tried = 0, failed = 0;
          double best_ms = INFINITY, auto_ms = NAN;
          tools_list cands;
          memset(&p, 0, sizeof p);
          if (!raw || !ref || !got) {
            fprintf(stderr, "flashcl-tune --decode-splits: host allocation failed (N=%ld batch %ld)\n", n, B);
            ++errors;
            goto next;
          }
          bq = tools_random_buffer(clctx, queue, dt, qn, 101 + (uint64_t)ni, raw, &err);
          if (bq) bk = tools_random_buffer(clctx, queue, dt, kvn, 202 + (uint64_t)ni, raw, &err);
          if (bk) bv = tools_random_buffer(clctx, queue, dt, kvn, 303 + (uint64_t)ni, raw, &err);
          if (bv) bo = clCreateBuffer(clctx, CL_MEM_READ_WRITE, qn * es, NULL, &err);
          if (bo) {
            cl_int *lens = malloc(sizeof(cl_int) * (size_t)B);
            long b;
            for (b = 0; lens && b < B; ++b) lens[b] = (cl_int)n;
            p.lens = lens ? clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(cl_int) * (size_t)B,
                                           lens, &err)
                          : NULL;
            free(lens);
          }
          if (!p.lens || err) {
            fprintf(stderr, "flashcl-tune --decode-splits: cannot allocate N=%ld batch %ld d=%ld %s: %s (%d)\n", n, B, d,
                    flashcl_dtype_name(dt), flashcl_status_string(err), err);
            ++errors;
            goto next;
          }
          flashcl_tensor_init_bnhd(&p.q, bq, 0, dt, B, T, hq, d);
          flashcl_tensor_init_bnhd(&p.kc, bk, 0, dt, B, n, hkv, d);
          flashcl_tensor_init_bnhd(&p.vc, bv, 0, dt, B, n, hkv, d);
          flashcl_tensor_init_bnhd(&p.o, bo, 0, dt, B, T, hq, d);
          p.out_count = qn;

          st = time_splits(ctx, &o, &p, 0, raw, ref, auto_times, &auto_nt, &auto_splits);
          if (st) {
            char what[160];
            snprintf(what, sizeof what, "N=%ld batch %ld d=%ld %s: automatic split count", n, B, d,
                     flashcl_dtype_name(dt));
            tools_print_error(stderr, ctx, what, st);
            ++errors;
            goto next;
          }
          if (o.have_splits) {
            cands = o.splits;
          } else {
            long s;
            cands.count = 0;
            for (s = 1; s <= FLASHCL_DECODE_MAX_SPLITS && (s == 1 || s * 16 <= n) && cands.count < TOOLS_MAX_LIST;
                 s *= 2)
              cands.v[cands.count++] = s;
          }
          for (si = 0; si < cands.count; ++si) {
            const int s = (int)cands.v[si];
            int nt = 0;
            double rel;
            if (s < 1 || s > FLASHCL_DECODE_MAX_SPLITS) continue;
            ++tried;
            st = time_splits(ctx, &o, &p, s, raw, got, times, &nt, NULL);
            if (st) {
              char what[160];
              snprintf(what, sizeof what, "N=%ld batch %ld d=%ld %s: %d splits", n, B, d, flashcl_dtype_name(dt), s);
              tools_print_error(stderr, ctx, what, st);
              ++failed;
              continue;
            }
            rel = tools_rel_l2(got, ref, qn);
            if (!(rel <= tol)) {
              fprintf(stderr,
                      "flashcl-tune --decode-splits: N=%ld batch %ld d=%ld %s: %d splits give another result (rel L2 "
                      "%.3e > %.0e); not a candidate\n",
                      n, B, d, flashcl_dtype_name(dt), s, rel, tol);
              ++failed;
              continue;
            }
            const double med = tools_median(times, nt);
            if (med < best_ms) best_ms = med, best = s;
          }
          errors += failed;
          /* The automatic choice again after the candidates, so that drift favours neither side. */
          st = time_splits(ctx, &o, &p, 0, raw, NULL, auto_times, &auto_nt, NULL);
          if (st) {
            tools_print_error(stderr, ctx, "automatic split count (second timing)", st);
            ++errors;
          }
          auto_ms = tools_median(auto_times, auto_nt);
          if (o.csv) {
            printf("\"%s\",%ld,%ld,%ld,%s,%ld,%ld,%ld,%d,%.6f,%.3f,", info.device_name, n, B, d,
                   flashcl_dtype_name(dt), hq, hkv, T, auto_splits, auto_ms, kv_bytes / (auto_ms * 1e-3) / 1e9);
            if (best > 0)
              printf("%d,%.6f,%.3f,%.4f,", best, best_ms, kv_bytes / (best_ms * 1e-3) / 1e9, best_ms / auto_ms);
            else
              printf(",,,,");
            printf("%d,%d\n", tried, failed);
          } else {
            printf("N=%ld batch %ld d=%ld %s: auto %d splits %.4f ms (%.2f GB/s)", n, B, d, flashcl_dtype_name(dt),
                   auto_splits, auto_ms, kv_bytes / (auto_ms * 1e-3) / 1e9);
            if (best > 0)
              printf(" | best %d splits %.4f ms (%.2f GB/s) | best/auto %.3f (%d tried, %d failed)\n", best, best_ms,
                     kv_bytes / (best_ms * 1e-3) / 1e9, best_ms / auto_ms, tried, failed);
            else
              printf(" | no working candidate (%d tried, %d failed)\n", tried, failed);
          }
          fflush(stdout);
        next:
          free(raw);
          free(ref);
          free(got);
          if (bq) clReleaseMemObject(bq);
          if (bk) clReleaseMemObject(bk);
          if (bv) clReleaseMemObject(bv);
          if (bo) clReleaseMemObject(bo);
          if (p.lens) clReleaseMemObject(p.lens);
        }

  flashcl_context_destroy(ctx);
  if (errors) {
    fprintf(stderr, "flashcl-tune --decode-splits: %d failure(s), see above\n", errors);
    return 1;
  }
  return 0;
}
