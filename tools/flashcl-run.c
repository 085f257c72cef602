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

int main(int argc, char **argv) {
  const char *dir = NULL, *device = NULL, *val;
  long B = 0, NQ = 0, NK = 0, HQ = 0, HKV = 0, D = 0, causal = 0, det = 1;
  int bwd = 0, i;
  flashcl_dtype dtype = FLASHCL_F16;
  flashcl_kernel_family kernel = FLASHCL_KERNEL_AUTO;
  flashcl_algo algo = FLASHCL_ALGO_FLASH;
  for (i = 1; i < argc; i++) {
    int r;
#define LONGOPT(name, var)                                                             \
  if ((r = tools_opt_value(argc, argv, &i, name, &val)) != 0) {                        \
    if (r < 0 || tools_parse_long(val, &var)) goto bad;                                \
    continue;                                                                          \
  }
    LONGOPT("--batch", B)
    LONGOPT("--nq", NQ)
    LONGOPT("--nk", NK)
    LONGOPT("--hq", HQ)
    LONGOPT("--hkv", HKV)
    LONGOPT("--d", D)
    LONGOPT("--causal", causal)
    LONGOPT("--deterministic", det)
#undef LONGOPT
    if ((r = tools_opt_value(argc, argv, &i, "--dir", &val)) != 0) {
      if (r < 0) goto bad;
      dir = val;
    } else if ((r = tools_opt_value(argc, argv, &i, "--device", &val)) != 0) {
      if (r < 0) goto bad;
      device = val;
    } else if ((r = tools_opt_value(argc, argv, &i, "--dtype", &val)) != 0) {
      tools_list l;
      if (r < 0 || tools_parse_dtype_list(val, &l) || l.count != 1) goto bad;
      dtype = (flashcl_dtype)l.v[0];
    } else if ((r = tools_opt_value(argc, argv, &i, "--kernel", &val)) != 0) {
      if (r < 0 || tools_parse_kernel(val, &kernel)) goto bad;
    } else if ((r = tools_opt_value(argc, argv, &i, "--algo", &val)) != 0) {
      tools_list l;
      if (r < 0 || tools_parse_algo_list(val, &l) || l.count != 1) goto bad;
      algo = (flashcl_algo)l.v[0];
    } else if (tools_opt_flag(argv, i, "--bwd")) {
      bwd = 1;
    } else if (tools_opt_flag(argv, i, "--help") || tools_opt_flag(argv, i, "-h")) {
      usage(stdout);
      return 0;
    } else {
      goto bad;
    }
  }
  if (!dir || B < 1 || NQ < 1 || NK < 1 || HQ < 1 || HKV < 1 || D < 1) goto bad;

  flashcl_context_options opts;
  flashcl_context_options_init(&opts);
  opts.device = device;
  flashcl_context *ctx = NULL;
  int st = flashcl_context_create(&opts, &ctx);
  if (st != FLASHCL_SUCCESS) {
    tools_print_error(stderr, ctx, "flashcl_context_create", st);
    flashcl_context_destroy(ctx);
    return 1;
  }
  cl_context clctx = flashcl_context_cl_context(ctx);
  cl_command_queue queue = flashcl_context_cl_queue(ctx);
  const size_t es = flashcl_dtype_size(dtype);
  const size_t nq = (size_t)B * NQ * HQ * D, nk = (size_t)B * NK * HKV * D, nl = (size_t)B * NQ * HQ;
  const char *in_names[4] = {"q.bin", "k.bin", "v.bin", "do.bin"};
  const char *out_names[5] = {"o.bin", "lse.bin", "dq.bin", "dk.bin", "dv.bin"};
  const size_t in_bytes[4] = {nq * es, nk * es, nk * es, nq * es};
  const size_t out_bytes[5] = {nq * es, nl * 4, nq * es, nk * es, nk * es};
  cl_mem mem[9] = {0};
  void *host = malloc(nq * es > nk * es ? (nq * es > nl * 4 ? nq * es : nl * 4) : (nk * es > nl * 4 ? nk * es : nl * 4));
  int rc = 1;
  cl_int err = CL_SUCCESS;
  if (!host) goto out;
  for (int t = 0; t < (bwd ? 4 : 3); t++) {
    if (read_file(dir, in_names[t], host, in_bytes[t])) goto out;
    mem[t] = clCreateBuffer(clctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, in_bytes[t], host, &err);
    if (err != CL_SUCCESS) goto cl_fail;
  }
  for (int t = 0; t < (bwd ? 5 : 2); t++) {
    mem[4 + t] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, out_bytes[t], NULL, &err);
    if (err != CL_SUCCESS) goto cl_fail;
  }
  flashcl_tensor q, k, v, d_o, o, lse, dq, dk, dv;
  if ((st = flashcl_tensor_init_bnhd(&q, mem[0], 0, dtype, B, NQ, HQ, D)) ||
      (st = flashcl_tensor_init_bnhd(&k, mem[1], 0, dtype, B, NK, HKV, D)) ||
      (st = flashcl_tensor_init_bnhd(&v, mem[2], 0, dtype, B, NK, HKV, D)) ||
      (st = flashcl_tensor_init_bnhd(&o, mem[4], 0, dtype, B, NQ, HQ, D)) ||
      (st = flashcl_tensor_init_lse(&lse, mem[5], 0, B, NQ, HQ)))
    goto fl_fail;
  if (bwd && ((st = flashcl_tensor_init_bnhd(&d_o, mem[3], 0, dtype, B, NQ, HQ, D)) ||
              (st = flashcl_tensor_init_bnhd(&dq, mem[6], 0, dtype, B, NQ, HQ, D)) ||
              (st = flashcl_tensor_init_bnhd(&dk, mem[7], 0, dtype, B, NK, HKV, D)) ||
              (st = flashcl_tensor_init_bnhd(&dv, mem[8], 0, dtype, B, NK, HKV, D))))
    goto fl_fail;
  flashcl_attention_desc desc;
  flashcl_attention_desc_init(&desc);
  desc.causal = (int)causal;
  desc.kernel = kernel;
  desc.algo = algo;
  desc.deterministic = (int)det;
  if ((st = flashcl_attention_forward(ctx, &desc, &q, &k, &v, &o, &lse, 0, NULL, NULL))) goto fl_fail;
  if (bwd && (st = flashcl_attention_backward(ctx, &desc, &q, &k, &v, &o, &lse, &d_o, &dq, &dk, &dv, 0, NULL, NULL)))
    goto fl_fail;
  for (int t = 0; t < (bwd ? 5 : 2); t++) {
    err = clEnqueueReadBuffer(queue, mem[4 + t], CL_TRUE, 0, out_bytes[t], host, 0, NULL, NULL);
    if (err != CL_SUCCESS) goto cl_fail;
    if (write_file(dir, out_names[t], host, out_bytes[t])) goto out;
  }
  rc = 0;
  goto out;
fl_fail:
  tools_print_error(stderr, ctx, "flashcl-run", st);
  goto out;
cl_fail:
  fprintf(stderr, "flashcl-run: OpenCL error %d\n", (int)err);
out:
  for (int t = 0; t < 9; t++)
    if (mem[t]) clReleaseMemObject(mem[t]);
  free(host);
  flashcl_context_destroy(ctx);
  return rc;
bad:
  usage(stderr);
  return 2;
}
