/*
 * flashcl-run: runs one attention problem on tensors read from raw files and
 * writes the results, so that other frameworks can check flashcl's outputs
 * (tools/sdpa_check.py compares them with PyTorch on the same machine).
 *
 * Files are headerless little-endian arrays in BNHD order (batch, seq, head,
 * dim), contiguous: q, d_o (B, Nq, Hq, d) and k, v (B, Nk, Hkv, d) in --dtype;
 * written: o (like q, --dtype), lse fp32 natural log in (B, Hq, Nq) order
 * (flashcl_tensor_init_lse, as FlashAttention), and with
 * --bwd dq, dk, dv (like q, k, v). Uses only the public API.
 */
#include "args.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: flashcl-run --dir DIR --batch B --nq NQ --nk NK --hq HQ --hkv HKV --d D\n"
          "                   [--dtype f16|bf16|f32] [--causal 0|1] [--bwd] [--deterministic 0|1]\n"
          "                   [--kernel auto|portable|nvidia_mma] [--algo flash|naive] [--device SPEC]\n\n"
          "Reads DIR/q.bin, DIR/k.bin, DIR/v.bin (and DIR/do.bin with --bwd), raw BNHD arrays in\n"
          "--dtype; runs flashcl_attention_forward (and flashcl_attention_backward); writes\n"
          "DIR/o.bin, DIR/lse.bin (fp32, natural log, (B, Hq, Nq) order) and DIR/dq.bin,\n"
          "DIR/dk.bin, DIR/dv.bin.\n");
}

static int read_file(const char *dir, const char *name, void *buf, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "flashcl-run: cannot open %s\n", path);
    return 1;
  }
  size_t got = fread(buf, 1, bytes, f);
  int extra = fgetc(f) != EOF;
  fclose(f);
  if (got != bytes || extra) {
    fprintf(stderr, "flashcl-run: %s must hold exactly %zu bytes\n", path, bytes);
    return 1;
  }
  return 0;
}

static int write_file(const char *dir, const char *name, const void *buf, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, bytes, f) != bytes) {
    fprintf(stderr, "flashcl-run: cannot write %s\n", path);
    if (f) fclose(f);
    return 1;
  }
  return fclose(f) != 0;
}

typedef struct run_opts {
  const char *dir, *device;
  long B, NQ, NK, HQ, HKV, D, causal, det;
  int bwd;
  flashcl_dtype dtype;
  flashcl_kernel_family kernel;
  flashcl_algo algo;
} run_opts;

/* The sizes are checked after parsing (they are required), so any long is taken here. */
#define RUN_LONG(opt, field) {.name = opt, .kind = ARG_LONG, .dest = &o->field, .lo = LONG_MIN, .hi = LONG_MAX}

static args_status parse_args(int argc, char **argv, run_opts *o) {
  const args_opt table[] = {
      RUN_LONG("--batch", B),
      RUN_LONG("--nq", NQ),
      RUN_LONG("--nk", NK),
      RUN_LONG("--hq", HQ),
      RUN_LONG("--hkv", HKV),
      RUN_LONG("--d", D),
      RUN_LONG("--causal", causal),
      RUN_LONG("--deterministic", det),
      {.name = "--dir", .kind = ARG_STRING, .dest = &o->dir},
      {.name = "--device", .kind = ARG_STRING, .dest = &o->device},
      {.name = "--dtype", .kind = ARG_DTYPE, .dest = &o->dtype},
      {.name = "--kernel", .kind = ARG_KERNEL, .dest = &o->kernel},
      {.name = "--algo", .kind = ARG_ALGO, .dest = &o->algo},
      {.name = "--bwd", .kind = ARG_FLAG, .dest = &o->bwd},
      {.name = "--help", .alias = "-h", .kind = ARG_HELP},
  };
  memset(o, 0, sizeof *o);
  o->det = 1;
  o->dtype = FLASHCL_F16;
  o->kernel = FLASHCL_KERNEL_AUTO;
  o->algo = FLASHCL_ALGO_FLASH;
  return args_parse(argc, argv, "flashcl-run", table, ARGS_COUNT(table));
}

#undef RUN_LONG

/* Device buffers: q k v d_o (inputs), then o lse dq dk dv (outputs). */
typedef struct run_bufs {
  cl_mem mem[9];
  flashcl_tensor q, k, v, d_o, o, lse, dq, dk, dv;
  size_t in_bytes[4], out_bytes[5];
  void *host; /* holds the largest file */
} run_bufs;

static const char *const in_names[4] = {"q.bin", "k.bin", "v.bin", "do.bin"};
static const char *const out_names[5] = {"o.bin", "lse.bin", "dq.bin", "dk.bin", "dv.bin"};

static int alloc_host(const run_opts *o, run_bufs *b) {
  const size_t es = flashcl_dtype_size(o->dtype);
  const size_t nq = (size_t)o->B * o->NQ * o->HQ * o->D, nk = (size_t)o->B * o->NK * o->HKV * o->D;
  const size_t nl = (size_t)o->B * o->NQ * o->HQ;
  const size_t in_bytes[4] = {nq * es, nk * es, nk * es, nq * es};
  const size_t out_bytes[5] = {nq * es, nl * 4, nq * es, nk * es, nk * es};
  memcpy(b->in_bytes, in_bytes, sizeof in_bytes);
  memcpy(b->out_bytes, out_bytes, sizeof out_bytes);
  b->host = malloc(nq * es > nk * es ? (nq * es > nl * 4 ? nq * es : nl * 4) : (nk * es > nl * 4 ? nk * es : nl * 4));
  return b->host ? 0 : 1;
}

/* Reads the input files into new device buffers and creates the outputs'; 0 or 1 (reported). */
static int load_inputs(flashcl_context *ctx, const run_opts *o, run_bufs *b) {
  cl_context clctx = flashcl_context_cl_context(ctx);
  cl_int err = CL_SUCCESS;
  for (int t = 0; t < (o->bwd ? 4 : 3); t++) {
    if (read_file(o->dir, in_names[t], b->host, b->in_bytes[t])) return 1;
    b->mem[t] = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, b->in_bytes[t], b->host, &err);
    if (err != CL_SUCCESS) break;
  }
  for (int t = 0; err == CL_SUCCESS && t < (o->bwd ? 5 : 2); t++)
    b->mem[4 + t] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, b->out_bytes[t], NULL, &err);
  if (err == CL_SUCCESS) return 0;
  fprintf(stderr, "flashcl-run: OpenCL error %d\n", (int)err);
  return 1;
}

static int init_tensors(const run_opts *o, run_bufs *b) {
  const flashcl_dtype dt = o->dtype;
  int st;
  if ((st = flashcl_tensor_init_bnhd(&b->q, b->mem[0], 0, dt, o->B, o->NQ, o->HQ, o->D)) ||
      (st = flashcl_tensor_init_bnhd(&b->k, b->mem[1], 0, dt, o->B, o->NK, o->HKV, o->D)) ||
      (st = flashcl_tensor_init_bnhd(&b->v, b->mem[2], 0, dt, o->B, o->NK, o->HKV, o->D)) ||
      (st = flashcl_tensor_init_bnhd(&b->o, b->mem[4], 0, dt, o->B, o->NQ, o->HQ, o->D)) ||
      (st = flashcl_tensor_init_lse(&b->lse, b->mem[5], 0, o->B, o->NQ, o->HQ)))
    return st;
  if (o->bwd && ((st = flashcl_tensor_init_bnhd(&b->d_o, b->mem[3], 0, dt, o->B, o->NQ, o->HQ, o->D)) ||
                 (st = flashcl_tensor_init_bnhd(&b->dq, b->mem[6], 0, dt, o->B, o->NQ, o->HQ, o->D)) ||
                 (st = flashcl_tensor_init_bnhd(&b->dk, b->mem[7], 0, dt, o->B, o->NK, o->HKV, o->D)) ||
                 (st = flashcl_tensor_init_bnhd(&b->dv, b->mem[8], 0, dt, o->B, o->NK, o->HKV, o->D))))
    return st;
  return FLASHCL_SUCCESS;
}

static int run_attention(flashcl_context *ctx, const run_opts *o, const run_bufs *b) {
  flashcl_attention_desc desc;
  int st;
  flashcl_attention_desc_init(&desc);
  desc.mask.causal = (int)o->causal;
  desc.algorithm.kernel = o->kernel;
  desc.algorithm.algo = o->algo;
  desc.backward.deterministic = (int)o->det;
  st = flashcl_attention_forward(ctx, &desc, &b->q, &b->k, &b->v, &b->o, &b->lse, 0, NULL, NULL);
  if (!st && o->bwd)
    st = flashcl_attention_backward(ctx, &desc, &b->q, &b->k, &b->v, &b->o, &b->lse, &b->d_o, &b->dq, &b->dk,
                                    &b->dv, 0, NULL, NULL);
  return st;
}

/* Reads the outputs back into their files; 0 or 1 (reported). */
static int save_outputs(flashcl_context *ctx, const run_opts *o, run_bufs *b) {
  for (int t = 0; t < (o->bwd ? 5 : 2); t++) {
    const cl_int err = clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), b->mem[4 + t], CL_TRUE, 0,
                                           b->out_bytes[t], b->host, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
      fprintf(stderr, "flashcl-run: OpenCL error %d\n", (int)err);
      return 1;
    }
    if (write_file(o->dir, out_names[t], b->host, b->out_bytes[t])) return 1;
  }
  return 0;
}

/* The exit status of one problem on ctx. */
static int run_problem(flashcl_context *ctx, const run_opts *o) {
  run_bufs b;
  int rc;
  memset(&b, 0, sizeof b);
  rc = alloc_host(o, &b);
  if (!rc) rc = load_inputs(ctx, o, &b);
  if (!rc) {
    int st = init_tensors(o, &b);
    if (!st) st = run_attention(ctx, o, &b);
    if (st) tools_print_error(stderr, ctx, "flashcl-run", st);
    rc = st ? 1 : save_outputs(ctx, o, &b);
  }
  for (int t = 0; t < 9; t++)
    if (b.mem[t]) clReleaseMemObject(b.mem[t]);
  free(b.host);
  return rc;
}

int main(int argc, char **argv) {
  run_opts o;
  flashcl_context_options opts;
  flashcl_context *ctx = NULL;
  const args_status parsed = parse_args(argc, argv, &o);
  if (parsed == ARGS_HELP) {
    usage(stdout);
    return 0;
  }
  if (parsed != ARGS_OK || !o.dir || o.B < 1 || o.NQ < 1 || o.NK < 1 || o.HQ < 1 || o.HKV < 1 || o.D < 1) {
    usage(stderr);
    return 2;
  }
  flashcl_context_options_init(&opts);
  opts.device = o.device;
  int st = flashcl_context_create(&opts, &ctx);
  if (st != FLASHCL_SUCCESS) {
    tools_print_error(stderr, ctx, "flashcl_context_create", st);
    flashcl_context_destroy(ctx);
    return 1;
  }
  st = run_problem(ctx, &o);
  flashcl_context_destroy(ctx);
  return st;
}
