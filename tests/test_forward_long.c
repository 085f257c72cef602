/*
 * The long forward sweep (CTest label "long", excluded by `ctest -LE long`):
 * every head dim x dtype x mask, over the sequence lengths 1, 7, 127, 129, 1000 and
 * Nq != Nk both ways, each with the flash and naive algorithms checked against the
 * reference and against each other; plus GQA, varlen, layouts and explicit block
 * sizes for every head dim and dtype.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int DIMS[] = {32, 64, 96, 128, 256};
static const flashcl_dtype DTYPES[] = {FLASHCL_F32, FLASHCL_F16, FLASHCL_BF16};
static const int NS[][2] = {{1, 1}, {7, 7}, {127, 127}, {129, 129}, {1000, 1000}, {7, 129}, {129, 7}};
static const int VL_Q[] = {1, 300, 77};
static const int VL_K_SAME[] = {1, 300, 77};
static const int VL_K_DIFF[] = {5, 120, 300};

typedef struct sweep {
  int head_dim;
  flashcl_dtype dtype;
  int causal;
} sweep;

static fct_case base_case(const sweep *s) {
  fct_case c;
  memset(&c, 0, sizeof c);
  c.dtype = s->dtype;
  c.head_dim = s->head_dim;
  c.causal = s->causal;
  c.batch = 2;
  c.heads_q = c.heads_kv = 2;
  return c;
}

/* All sequence lengths, flash and naive. */
static void test_lengths(void **state) {
  const sweep *s = (const sweep *)*state;
  size_t i;
  for (i = 0; i < sizeof NS / sizeof NS[0]; i++) {
    fct_case c = base_case(s);
    c.seqlen_q = NS[i][0];
    c.seqlen_k = NS[i][1];
    if (c.seqlen_q >= 1000 || c.seqlen_k >= 1000) c.batch = 1;
    fct_check_flash_vs_naive(&c);
  }
}

/* GQA 8:2 and 8:1, varlen (equal and different q/k lengths), BHND, padded. */
static void test_features(void **state) {
  const sweep *s = (const sweep *)*state;
  fct_run flash;
  fct_case c;
  memset(&flash, 0, sizeof flash);
  flash.algo = FLASHCL_ALGO_FLASH;

  c = base_case(s);
  c.seqlen_q = 65, c.seqlen_k = 80, c.heads_q = 8, c.heads_kv = 2;
  fct_check_flash_vs_naive(&c);
  c.seqlen_q = 80, c.seqlen_k = 65, c.heads_kv = 1;
  fct_check_flash_vs_naive(&c);

  c = base_case(s);
  c.num_seqs = 3, c.seqlens_q = VL_Q, c.seqlens_k = VL_K_SAME;
  fct_check_flash_vs_naive(&c);
  c.seqlens_k = VL_K_DIFF, c.heads_q = 4;
  fct_check_flash_vs_naive(&c);

  c = base_case(s);
  c.seqlen_q = 77, c.seqlen_k = 90, c.layout = FCT_BHND, c.heads_q = 4;
  fct_check_case(&c, &flash);
  c.seqlen_q = 90, c.seqlen_k = 77, c.layout = FCT_PADDED;
  fct_check_case(&c, &flash);
}

/* Explicit tile sizes that the device can hold. They are the portable
 * kernels' tiles, so the call names that family: elsewhere (the tensor-core
 * kernels) desc.algorithm.block_r/block_c are refused. */
static void test_blocks(void **state) {
  const sweep *s = (const sweep *)*state;
  static const int blocks[][2] = {{8, 8}, {16, 32}, {32, 16}, {8, 64}, {64, 8}, {32, 32}};
  size_t i;
  int ran = 0;
  for (i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
    flashcl_block_plan plan;
    flashcl_status st =
        flashcl_attention_block_plan(fct_env_get()->ctx, s->head_dim, s->dtype, blocks[i][0], blocks[i][1], &plan);
    fct_case c = base_case(s);
    fct_run run;
    if (st == FLASHCL_ERROR_UNSUPPORTED) {
      print_message("    skip block_r=%d block_c=%d at d=%d: %s\n", blocks[i][0], blocks[i][1], s->head_dim,
                    fct_last_error());
      continue;
    }
    FCT_CHECK_STATUS(st, FLASHCL_SUCCESS, "block_plan(d=%d, %s, %d, %d)", s->head_dim, fct_dtype_str(s->dtype),
                     blocks[i][0], blocks[i][1]);
    FCT_CHECK(plan.block_r == blocks[i][0] && plan.block_c == blocks[i][1], "explicit %dx%d planned as %dx%d",
              blocks[i][0], blocks[i][1], plan.block_r, plan.block_c);
    memset(&run, 0, sizeof run);
    run.algo = FLASHCL_ALGO_FLASH, run.block_r = blocks[i][0], run.block_c = blocks[i][1];
    run.kernel = FLASHCL_KERNEL_PORTABLE;
    c.seqlen_q = 129, c.seqlen_k = 100;
    fct_check_case(&c, &run);
    ran++;
  }
  FCT_CHECK(ran >= 1, "no explicit block size was runnable at d=%d", s->head_dim);
}

int main(void) {
  const size_t nd = sizeof DIMS / sizeof DIMS[0], nt = sizeof DTYPES / sizeof DTYPES[0];
  const size_t nsweep = nd * nt * 2;
  sweep *sweeps = (sweep *)calloc(nsweep, sizeof *sweeps);
  struct CMUnitTest *tests = (struct CMUnitTest *)calloc(nsweep * 3, sizeof *tests);
  char **names = (char **)calloc(nsweep * 3, sizeof *names);
  size_t i, j, c, n = 0, ns = 0;
  int failed;
  if (!sweeps || !tests || !names) return 1;
  for (i = 0; i < nd; i++)
    for (j = 0; j < nt; j++)
      for (c = 0; c < 2; c++) {
        sweep *s = &sweeps[ns++];
        static const char *kinds[3] = {"lengths", "features", "blocks"};
        CMUnitTestFunction fns[3];
        int k;
        fns[0] = test_lengths, fns[1] = test_features, fns[2] = test_blocks;
        s->head_dim = DIMS[i], s->dtype = DTYPES[j], s->causal = (int)c;
        for (k = 0; k < 3; k++) {
          names[n] = (char *)malloc(64);
          if (!names[n]) return 1;
          snprintf(names[n], 64, "%s_%s_d%d%s", kinds[k], fct_dtype_str(s->dtype), s->head_dim, c ? "_causal" : "");
          tests[n].name = names[n];
          tests[n].test_func = fns[k];
          tests[n].initial_state = s;
          n++;
        }
      }
  failed = fct_run_group("forward_long", tests, n, 1);
  for (i = 0; i < n; i++) free(names[i]);
  free(names);
  free(tests);
  free(sweeps);
  return failed;
}
