/*
 * Decode's two ways of merging split partials: the one-launch form (the
 * attention kernel's own work-groups merge them, split_merge.cl's two-level
 * tree; tuning merge = 1, on the context's scratch) against the two-kernel
 * form (decode_merge, merge = 0).
 *
 * Each case draws fresh random q and caches (contiguous, unused slots NaN),
 * poisons o and lse before every call and checks both forms against a
 * double-precision reference (fp32 1e-5, fp16 2e-3, bf16 1e-2 relative L2 on
 * O; fct_lse_tolerance on the LSE), then against each other. The one-launch
 * form runs three times in a row, and the cases run one after another on one
 * context: its arrival counters must come back to zero after every launch, or
 * a later launch merges too early or never. Cases include empty splits,
 * sequences of no keys, several row blocks, a V head dim of its own, 200
 * splits (groups of 15) and more counters than their first allocation holds.
 */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mcase {
  const char *name;
  flashcl_dtype dtype;
  int batch, q_len, heads_q, heads_kv, d, dv, cap;
  const int *lens;
  int splits; /* desc.split.num_splits (0: the plan's) */
} mcase;

typedef struct mprob {
  const mcase *c;
  fct_tensor q, k, v, o, lse;
  cl_mem seqlens;
  double *ref_o, *ref_lse;
} mprob;

/* The reference: sequence b's q_len tokens against its first L keys, causal
 * from the bottom right (token t sees keys j <= L - q_len + t), through the
 * shared double reference, one sequence at a time. */
static void reference(mprob *p) {
  const mcase *c = p->c;
  const ref_attention_params rp = {.scale = 0.0, .causal = 1};
  const size_t rows = (size_t)c->q_len * c->heads_q;
  for (int b = 0; b < c->batch; b++) {
    ref_tensor q = fct_tensor_ref(&p->q), k = fct_tensor_ref(&p->k), v = fct_tensor_ref(&p->v);
    q.offset += b * q.stride[0];
    k.offset += b * k.stride[0];
    v.offset += b * v.stride[0];
    q.shape[0] = k.shape[0] = v.shape[0] = 1;
    k.shape[1] = v.shape[1] = c->lens[b];
    const ref_out o = ref_out_bnhd(p->ref_o + b * rows * c->dv, 1, c->q_len, c->heads_q, c->dv);
    const ref_out l = ref_out_bnhd(p->ref_lse + b * rows, 1, c->q_len, c->heads_q, 1);
    FCT_CHECK(ref_attention_forward(&rp, &q, &k, &v, &o, &l) == 0, "%s: reference for sequence %d", c->name, b);
  }
}

static void prob_create(mprob *p, const mcase *c) {
  fct_rng rng;
  char tag[128];
  snprintf(tag, sizeof tag, "decode_merge/%s", c->name);
  fct_rng_init(&rng, tag);
  memset(p, 0, sizeof *p);
  p->c = c;
  fct_tensor_create(&p->q, c->dtype, FCT_BNHD, c->batch, c->q_len, c->heads_q, c->d, 1);
  fct_tensor_create(&p->k, c->dtype, FCT_BNHD, c->batch, c->cap, c->heads_kv, c->d, 2);
  fct_tensor_create(&p->v, c->dtype, FCT_BNHD, c->batch, c->cap, c->heads_kv, c->dv, 3);
  fct_tensor_create(&p->o, c->dtype, FCT_BNHD, c->batch, c->q_len, c->heads_q, c->dv, 4);
  fct_tensor_create_lse(&p->lse, FCT_BNHD, c->batch, c->q_len, c->heads_q, 5);
  fct_tensor_fill_random(&p->q, &rng);
  fct_tensor_fill_random(&p->k, &rng);
  fct_tensor_fill_random(&p->v, &rng);
  /* Slots past each sequence's length are NaN: a read of one poisons O. */
  for (int b = 0; b < c->batch; b++)
    for (int j = c->lens[b]; j < c->cap; j++)
      for (int h = 0; h < c->heads_kv; h++) {
        for (int x = 0; x < c->d; x++) fct_store_poison(c->dtype, p->k.host, fct_tensor_index(&p->k, b, j, h, x));
        for (int x = 0; x < c->dv; x++) fct_store_poison(c->dtype, p->v.host, fct_tensor_index(&p->v, b, j, h, x));
      }
  FCT_CHECK(clEnqueueWriteBuffer(fct_env_get()->queue, p->k.t.buffer, CL_TRUE, 0, p->k.bytes, p->k.host, 0, NULL,
                                 NULL) == CL_SUCCESS &&
                clEnqueueWriteBuffer(fct_env_get()->queue, p->v.t.buffer, CL_TRUE, 0, p->v.bytes, p->v.host, 0, NULL,
                                     NULL) == CL_SUCCESS,
            "%s: cache upload", c->name);
  int32_t lens[64];
  for (int b = 0; b < c->batch; b++) lens[b] = c->lens[b];
  p->seqlens = fct_create_buffer(sizeof(int32_t) * (size_t)c->batch, lens);
  const size_t rows = (size_t)c->batch * c->q_len * c->heads_q;
  p->ref_o = malloc(sizeof(double) * rows * (size_t)c->dv);
  p->ref_lse = malloc(sizeof(double) * rows);
  reference(p);
}

static void prob_release(mprob *p) {
  fct_tensor_release(&p->q);
  fct_tensor_release(&p->k);
  fct_tensor_release(&p->v);
  fct_tensor_release(&p->o);
  fct_tensor_release(&p->lse);
  clReleaseMemObject(p->seqlens);
  free(p->ref_o);
  free(p->ref_lse);
}

static void prob_desc(const mprob *p, flashcl_decode_desc *desc, flashcl_tuning *tu, int merge) {
  flashcl_decode_desc_init(desc);
  desc->heads_q = p->c->heads_q;
  desc->heads_kv = p->c->heads_kv;
  desc->split.num_splits = p->c->splits;
  flashcl_tuning_init(tu, FLASHCL_TUNE_DECODE);
  if (merge >= 0) {
    FCT_CHECK_STATUS(flashcl_tuning_set(NULL, tu, "merge", merge), FLASHCL_SUCCESS, "tuning merge=%d", merge);
    desc->tuning = tu;
  }
}

/* One call with o and lse poisoned; their values in out_o / out_lse. */
static void run_once(mprob *p, int merge, const char *label, double *out_o, double *out_lse) {
  const mcase *c = p->c;
  fct_env *env = fct_env_get();
  flashcl_decode_desc desc;
  flashcl_tuning tu;
  prob_desc(p, &desc, &tu, merge);
  flashcl_config cfg;
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &p->q.t, &p->k.t, &p->v.t, &cfg), FLASHCL_SUCCESS,
                   "%s %s: config", c->name, label);
  int ran = -1;
  FCT_CHECK(flashcl_tuning_get(&cfg.tuning, "merge", &ran) == FLASHCL_SUCCESS && ran == merge,
            "%s %s: the configuration reports merge = %d", c->name, label, ran);
  fct_tensor_poison(&p->o);
  fct_tensor_poison(&p->lse);
  FCT_CHECK_STATUS(flashcl_attention_decode(env->ctx, &desc, &p->q.t, &p->k.t, &p->v.t, p->seqlens, &p->o.t,
                                            &p->lse.t, 0, NULL, NULL),
                   FLASHCL_SUCCESS, "%s %s: decode (%s)", c->name, label, flashcl_context_last_error(env->ctx));
  fct_finish();
  fct_tensor_download(&p->o);
  fct_tensor_download(&p->lse);
  double num = 0.0, den = 0.0, lnum = 0.0, lden = 0.0;
  size_t bad = 0, i = 0;
  for (int b = 0; b < c->batch; b++)
    for (int t = 0; t < c->q_len; t++)
      for (int h = 0; h < c->heads_q; h++, i++) {
        const double rl = p->ref_lse[i], gl = fct_tensor_get(&p->lse, b, t, h, 0);
        out_lse[i] = gl;
        if (isinf(rl)) bad += !(isinf(gl) && gl < 0);
        else if (!isfinite(gl)) bad++;
        else {
          lnum += (gl - rl) * (gl - rl);
          lden += rl * rl;
        }
        for (int x = 0; x < c->dv; x++) {
          const double g = fct_tensor_get(&p->o, b, t, h, x), r = p->ref_o[i * c->dv + x];
          out_o[i * c->dv + x] = g;
          if (!isfinite(g) || (isinf(rl) && g != 0.0)) bad++;
          num += (g - r) * (g - r);
          den += r * r;
        }
      }
  const double eo = sqrt(num / (den > 0 ? den : 1)), el = sqrt(lnum / (lden > 0 ? lden : 1));
  print_message("[ MERGE    ] %-22s %-13s %s %d:%d d=%d/%d splits=%d: relL2 O %.2e LSE %.2e\n", c->name, label,
                fct_dtype_str(c->dtype), c->heads_q, c->heads_kv, c->d, c->dv, c->splits, eo, el);
  FCT_CHECK(bad == 0, "%s %s: %zu non-finite values, or rows without keys not O = 0, LSE = -inf", c->name, label, bad);
  FCT_CHECK(eo <= fct_tolerance(c->dtype), "%s %s: O relL2 %.3e", c->name, label, eo);
  FCT_CHECK(el <= fct_lse_tolerance(c->dtype), "%s %s: LSE relL2 %.3e", c->name, label, el);
  FCT_CHECK(fct_tensor_count_unpoisoned(&p->o) == i * (size_t)c->dv && fct_tensor_count_unpoisoned(&p->lse) == i,
            "%s %s: writes outside o / lse", c->name, label);
}

static const int LENS_A[3] = {1000, 0, 37};
static const int LENS_B[2] = {517, 2};
static const int LENS_C[1] = {300};
static const int LENS_D[2] = {3, 65};
static const int LENS_E[40] = {50, 1, 49, 7, 50, 33, 0, 50, 12, 48, 50, 50, 2, 50, 45, 50, 50, 19, 50, 50,
                               50, 3, 50, 50, 28, 50, 50, 50, 9, 50, 50, 40, 50, 50, 50, 16, 50, 50, 50, 50};

static const mcase CASES[] = {
    /* 16 splits over 1000, 0 and 37 keys: empty splits and an empty sequence. */
    {"f32_gqa4_empty", FLASHCL_F32, 3, 1, 8, 2, 64, 64, 1000, LENS_A, 16},
    /* 18 rows per KV head: several row blocks. */
    {"f16_q3_rowblocks", FLASHCL_F16, 2, 3, 12, 2, 128, 128, 520, LENS_B, 7},
    {"bf16_dv64_auto", FLASHCL_BF16, 1, 1, 4, 1, 128, 64, 300, LENS_C, 0},
    /* More splits than keys. */
    {"f32_200_splits", FLASHCL_F32, 2, 2, 2, 2, 32, 32, 65, LENS_D, 200},
    /* 40 x 32 row blocks: past the first 1024 counters. */
    {"f32_counters_grow", FLASHCL_F32, 40, 1, 64, 32, 32, 32, 50, LENS_E, 4},
};

/* 0 on a device where the one-launch form must not run: NVIDIA without the
 * inline PTX of its fence (no tensor-core path). Elsewhere it must run. */
static int one_launch_runs_here(void) {
  fct_env *env = fct_env_get();
  char platform[256] = "";
  cl_platform_id pid = NULL;
  clGetDeviceInfo(env->device, CL_DEVICE_PLATFORM, sizeof pid, &pid, NULL);
  if (pid) clGetPlatformInfo(pid, CL_PLATFORM_NAME, sizeof platform, platform, NULL);
  if (!strstr(platform, "NVIDIA") || fct_device_requires_mma(env->device, NULL, 0)) return 1;
  print_message("[ MERGE    ] NVIDIA without the tensor-core path: the one-launch form is refused here\n");
  return 0;
}

static void test_one_launch_vs_two(void **state) {
  (void)state;
  if (!one_launch_runs_here()) {
    FCT_SKIP();
    return;
  }
  for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
    const mcase *c = &CASES[k];
    mprob p;
    prob_create(&p, c);
    const size_t rows = (size_t)c->batch * c->q_len * c->heads_q;
    double *o1 = malloc(sizeof(double) * rows * c->dv), *l1 = malloc(sizeof(double) * rows);
    double *o2 = malloc(sizeof(double) * rows * c->dv), *l2 = malloc(sizeof(double) * rows);
    char label[32];
    for (int rep = 0; rep < 3; rep++) {
      snprintf(label, sizeof label, "one launch #%d", rep + 1);
      run_once(&p, 1, label, o1, l1);
    }
    run_once(&p, 0, "two kernels", o2, l2);
    /* The forms share the partials and differ only in the merge's sum order. */
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < rows * (size_t)c->dv; i++) {
      num += (o1[i] - o2[i]) * (o1[i] - o2[i]);
      den += o2[i] * o2[i];
    }
    size_t lse_off = 0;
    for (size_t i = 0; i < rows; i++)
      lse_off += !(l1[i] == l2[i] || fabs(l1[i] - l2[i]) <= 1e-5 * (1.0 + fabs(l2[i])));
    /* fp16 / bf16 outputs: a last-bit difference in fp32 can round either way. */
    const double bound = c->dtype == FLASHCL_F32 ? 1e-6 : fct_tolerance(c->dtype) / 10;
    FCT_CHECK(sqrt(num / (den > 0 ? den : 1)) <= bound && lse_off == 0,
              "%s: the forms disagree: O relL2 %.3e, %zu LSEs apart", c->name, sqrt(num / (den > 0 ? den : 1)),
              lse_off);
    free(o1);
    free(l1);
    free(o2);
    free(l2);
    prob_release(&p);
  }
}

/* A caller's workspace is not ordered against other calls the way the
 * context's scratch is: merge = 1 is refused there (nothing written), and the
 * default runs the two-kernel form. Unsplit, merge = 1 is refused too. */
static void test_one_launch_refusals(void **state) {
  (void)state;
  if (!one_launch_runs_here()) {
    FCT_SKIP();
    return;
  }
  fct_env *env = fct_env_get();
  mprob p;
  prob_create(&p, &CASES[0]);
  flashcl_decode_desc desc;
  flashcl_tuning tu;
  size_t ws = 0;
  int splits = 0;
  prob_desc(&p, &desc, &tu, -1);
  FCT_CHECK_STATUS(flashcl_attention_decode_workspace_size(env->ctx, &desc, &p.q.t, &p.k.t, &p.v.t, &ws, &splits),
                   FLASHCL_SUCCESS, "workspace size");
  cl_mem wbuf = fct_create_buffer(ws, NULL);
  prob_desc(&p, &desc, &tu, 1);
  desc.split.workspace = wbuf;
  fct_tensor_poison(&p.o);
  fct_tensor_poison(&p.lse);
  FCT_CHECK_STATUS(flashcl_attention_decode(env->ctx, &desc, &p.q.t, &p.k.t, &p.v.t, p.seqlens, &p.o.t, &p.lse.t, 0,
                                            NULL, NULL),
                   FLASHCL_ERROR_UNSUPPORTED, "merge=1 with desc.split.workspace");
  FCT_CHECK(strstr(flashcl_context_last_error(env->ctx), "merge") != NULL, "the reason names merge: \"%s\"",
            flashcl_context_last_error(env->ctx));
  fct_finish();
  fct_tensor *outs[2] = {&p.o, &p.lse};
  FCT_CHECK(fct_tensors_written(outs, 2) == 0, "a refused call wrote its outputs");
  prob_desc(&p, &desc, &tu, -1);
  desc.split.workspace = wbuf;
  flashcl_config cfg;
  int ran = -1;
  FCT_CHECK_STATUS(flashcl_decode_config(env->ctx, &desc, &p.q.t, &p.k.t, &p.v.t, &cfg), FLASHCL_SUCCESS, "config");
  FCT_CHECK(flashcl_tuning_get(&cfg.tuning, "merge", &ran) == FLASHCL_SUCCESS && ran == 0,
            "a caller's workspace runs merge = %d", ran);
  prob_desc(&p, &desc, &tu, 1);
  desc.split.num_splits = 1;
  FCT_CHECK_STATUS(flashcl_attention_decode(env->ctx, &desc, &p.q.t, &p.k.t, &p.v.t, p.seqlens, &p.o.t, &p.lse.t, 0,
                                            NULL, NULL),
                   FLASHCL_ERROR_UNSUPPORTED, "merge=1 unsplit");
  fct_finish();
  FCT_CHECK(fct_tensors_written(outs, 2) == 0, "a refused call wrote its outputs");
  clReleaseMemObject(wbuf);
  prob_release(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_launch_vs_two),
      cmocka_unit_test(test_one_launch_refusals),
  };
  return fct_run_group("decode_merge", tests, sizeof tests / sizeof tests[0], 1);
}
