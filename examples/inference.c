/*
 * examples/inference.c: a minimal LLM-style inference loop over a paged KV cache.
 *
 * Two sequences share a system prompt (the "prefix", PREFIX tokens, stored once)
 * and each has its own tokens (the "suffix"), kept in a paged KV cache: a pool of
 * pages of PAGE tokens, and a block table that maps each sequence's page
 * number to a page of the pool (vLLM / FlashInfer style). Every step is cascade
 * attention:
 *
 *   1. append the step's new K/V to the cache    flashcl_kv_cache_append
 *   2. attend to the sequence's own tokens:
 *        prompt chunks (chunked prefill)          flashcl_attention_forward with
 *                                                 desc.paged.cache.block_table (causal)
 *        generated tokens, one per step           flashcl_attention_decode
 *   3. attend to the shared prefix                flashcl_attention_forward, the
 *                                                 prefix K/V seen by both sequences
 *                                                 through a batch stride of 0
 *   4. merge the two partial results              flashcl_merge_states
 *
 * Each partial attention returns its log-sum-exp, which is what makes the merge
 * exact: the merged O and LSE equal attention over prefix + own tokens. Every
 * step's merged O and LSE are compared with a double-precision CPU computation
 * of that full attention. It prints one line and exits non-zero if anything fails.
 */
#include <flashcl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    flashcl_status s_ = (call);                                                          \
    if (s_ != FLASHCL_SUCCESS) {                                                         \
      fprintf(stderr, "inference: %s failed: %s: %s\n", #call, flashcl_status_string(s_), \
              flashcl_context_last_error(ctx));                                          \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)
#define CHECK_CL(err)                                                                        \
  do {                                                                                       \
    if ((err) != CL_SUCCESS) {                                                               \
      fprintf(stderr, "inference: OpenCL error %s at line %d\n", flashcl_status_string(err), \
              __LINE__);                                                                     \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

enum {
  B = 2,         /* sequences in the batch */
  HQ = 4,        /* query heads */
  HKV = 2,       /* key/value heads (GQA: query head h reads kv head h / (HQ / HKV)) */
  D = 64,        /* head dim */
  PREFIX = 24,   /* shared prefix tokens */
  PROMPT = 40,   /* each sequence's own prompt tokens, prefilled in chunks */
  CHUNK = 16,    /* prefill chunk: 16 + 16 + 8 */
  GENERATE = 3,  /* decode steps of one token */
  TOKENS = PROMPT + GENERATE,
  PAGE = 16,     /* tokens per page */
  MAX_PAGES = 4, /* pages per sequence: capacity 64 tokens */
  POOL = B * MAX_PAGES
};

/* The sequences' pages, scattered over the pool on purpose. */
static const int block_table[B][MAX_PAGES] = {{5, 2, 7, 0}, {3, 6, 1, 4}};

/* Host copies of everything the device sees, for the CPU check:
 * prefix K/V [PREFIX][HKV][D], each sequence's q [TOKENS][HQ][D] and K/V [TOKENS][HKV][D]. */
static float prefix_k[PREFIX][HKV][D], prefix_v[PREFIX][HKV][D];
static float seq_q[B][TOKENS][HQ][D], seq_k[B][TOKENS][HKV][D], seq_v[B][TOKENS][HKV][D];

/* Uniform in [-1, 1) from a fixed-seed xorshift, the same on every platform. */
static float uniform(void) {
  static uint32_t state = 88172645u;
  state ^= state << 13, state ^= state >> 17, state ^= state << 5;
  return (float)(state >> 8) / 8388608.0f - 1.0f;
}

/* max(worst, e) that keeps a NaN. */
static double worse(double worst, double e) { return (e > worst || e != e) ? e : worst; }

/* Attention of sequence b's token `pos`, head h, over the prefix and the
 * sequence's tokens 0..pos (causal), in double. Returns the LSE, writes O. */
static double reference_row(int b, int pos, int h, double *o) {
  const int g = h / (HQ / HKV);
  double s[PREFIX + TOKENS], m = -INFINITY, sum = 0;
  const int n = PREFIX + pos + 1;
  for (int j = 0; j < n; ++j) {
    const float *k = j < PREFIX ? prefix_k[j][g] : seq_k[b][j - PREFIX][g];
    double dot = 0;
    for (int x = 0; x < D; ++x) dot += (double)seq_q[b][pos][h][x] * k[x];
    s[j] = dot / sqrt((double)D);
    m = fmax(m, s[j]);
  }
  for (int j = 0; j < n; ++j) sum += exp(s[j] - m);
  const double lse = m + log(sum);
  for (int x = 0; x < D; ++x) o[x] = 0;
  for (int j = 0; j < n; ++j) {
    const float *v = j < PREFIX ? prefix_v[j][g] : seq_v[b][j - PREFIX][g];
    for (int x = 0; x < D; ++x) o[x] += exp(s[j] - lse) * v[x];
  }
  return lse;
}

/* Device state. Step buffers hold up to CHUNK tokens per sequence. */
typedef struct state {
  flashcl_context *ctx;
  cl_command_queue queue;
  cl_mem k_pool, v_pool;     /* [POOL][PAGE][HKV][D] */
  cl_mem table;              /* int32 [B][MAX_PAGES] */
  cl_mem lens;               /* int32 [B]: tokens in each sequence's cache */
  cl_mem prefix_k, prefix_v; /* [PREFIX][HKV][D] */
  cl_mem q, k_new, v_new;    /* [B][T][HQ or HKV][D] for a step of T tokens */
  cl_mem o_own, o_prefix, o; /* [B][T][HQ][D]: the two partials and the merge */
  cl_mem lse_own, lse_prefix, lse; /* fp32 [B][HQ][T] */
  int len[B];                /* host copy of lens */
  double max_o_err, max_lse_err;
} state;

/* One step: tokens [pos, pos + T) of every sequence. decode = 1 runs the
 * sequence's own part with flashcl_attention_decode (T = 1), else with the
 * paged forward (a prefill chunk). */
static int step(state *st, int pos, int T, int decode) {
  flashcl_context *ctx = st->ctx;
  const size_t q_bytes = (size_t)B * T * HQ * D * sizeof(float), kv_bytes = (size_t)B * T * HKV * D * sizeof(float);
  static float hq[B * CHUNK * HQ * D], hk[B * CHUNK * HKV * D], hv[B * CHUNK * HKV * D];
  static float ho[B * CHUNK * HQ * D], hlse[B * HQ * CHUNK];

  /* Upload the step's queries and new keys/values, (B, T, H, D) each. */
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int x = 0; x < HQ * D; ++x) {
        hq[((size_t)b * T + t) * HQ * D + x] = (&seq_q[b][pos + t][0][0])[x];
        if (x < HKV * D) {
          hk[((size_t)b * T + t) * HKV * D + x] = (&seq_k[b][pos + t][0][0])[x];
          hv[((size_t)b * T + t) * HKV * D + x] = (&seq_v[b][pos + t][0][0])[x];
        }
      }
  CHECK_CL(clEnqueueWriteBuffer(st->queue, st->q, CL_TRUE, 0, q_bytes, hq, 0, NULL, NULL));
  CHECK_CL(clEnqueueWriteBuffer(st->queue, st->k_new, CL_TRUE, 0, kv_bytes, hk, 0, NULL, NULL));
  CHECK_CL(clEnqueueWriteBuffer(st->queue, st->v_new, CL_TRUE, 0, kv_bytes, hv, 0, NULL, NULL));

  /* The paged cache, as decode and append see it: the pools are (POOL, PAGE, HKV, D). */
  flashcl_decode_desc dd;
  flashcl_decode_desc_init(&dd);
  dd.cache.page_size = PAGE;
  dd.cache.block_table = st->table;
  dd.cache.max_pages = MAX_PAGES;
  /* The append writes into the same cache layout. */
  flashcl_kv_append_desc ad;
  flashcl_kv_append_desc_init(&ad);
  ad.cache = dd.cache;
  flashcl_tensor k_pool, v_pool, q, k_new, v_new, o_own, o_prefix, o, lse_own, lse_prefix, lse;
  CHECK(flashcl_tensor_init_bnhd(&k_pool, st->k_pool, 0, FLASHCL_F32, POOL, PAGE, HKV, D));
  CHECK(flashcl_tensor_init_bnhd(&v_pool, st->v_pool, 0, FLASHCL_F32, POOL, PAGE, HKV, D));
  CHECK(flashcl_tensor_init_bnhd(&q, st->q, 0, FLASHCL_F32, B, T, HQ, D));
  CHECK(flashcl_tensor_init_bnhd(&k_new, st->k_new, 0, FLASHCL_F32, B, T, HKV, D));
  CHECK(flashcl_tensor_init_bnhd(&v_new, st->v_new, 0, FLASHCL_F32, B, T, HKV, D));
  CHECK(flashcl_tensor_init_bnhd(&o_own, st->o_own, 0, FLASHCL_F32, B, T, HQ, D));
  CHECK(flashcl_tensor_init_bnhd(&o_prefix, st->o_prefix, 0, FLASHCL_F32, B, T, HQ, D));
  CHECK(flashcl_tensor_init_bnhd(&o, st->o, 0, FLASHCL_F32, B, T, HQ, D));
  CHECK(flashcl_tensor_init_lse(&lse_own, st->lse_own, 0, B, T, HQ));
  CHECK(flashcl_tensor_init_lse(&lse_prefix, st->lse_prefix, 0, B, T, HQ));
  CHECK(flashcl_tensor_init_lse(&lse, st->lse, 0, B, T, HQ));

  /* 1. Append at positions lens[b] .. lens[b] + T - 1, then count the new
   * tokens in: the append reads lens but leaves it alone. The queue is in
   * order, so the blocking write runs after the append has read the old lengths. */
  CHECK(flashcl_kv_cache_append(ctx, &ad, &k_new, &v_new, &k_pool, &v_pool, st->lens, 0, NULL, NULL));
  for (int b = 0; b < B; ++b) st->len[b] += T;
  CHECK_CL(clEnqueueWriteBuffer(st->queue, st->lens, CL_TRUE, 0, sizeof st->len, st->len, 0, NULL, NULL));

  /* 2. The sequence's own tokens. q holds the LAST T positions of each
   * sequence (lens includes them), so the causal mask is bottom-right aligned:
   * new token t sees cached tokens 0 .. lens - T + t. */
  if (decode) {
    CHECK(flashcl_attention_decode(ctx, &dd, &q, &k_pool, &v_pool, st->lens, &o_own, &lse_own, 0, NULL, NULL));
  } else {
    flashcl_attention_desc desc;
    flashcl_attention_desc_init(&desc);
    desc.mask.causal = true;
    desc.paged.cache.block_table = st->table;
    desc.paged.cache.page_size = PAGE;
    desc.paged.cache.max_pages = MAX_PAGES;
    desc.paged.seqlens = st->lens;
    CHECK(flashcl_attention_forward(ctx, &desc, &q, &k_pool, &v_pool, &o_own, &lse_own, 0, NULL, NULL));
  }

  /* 3. The shared prefix: one copy of its K/V, (1, PREFIX, HKV, D), viewed as a
   * batch of B with batch stride 0. Every token sees all of it: not causal. */
  flashcl_tensor k_prefix, v_prefix;
  CHECK(flashcl_tensor_init_bnhd(&k_prefix, st->prefix_k, 0, FLASHCL_F32, B, PREFIX, HKV, D));
  CHECK(flashcl_tensor_init_bnhd(&v_prefix, st->prefix_v, 0, FLASHCL_F32, B, PREFIX, HKV, D));
  k_prefix.stride[FLASHCL_DIM_BATCH] = v_prefix.stride[FLASHCL_DIM_BATCH] = 0;
  flashcl_attention_desc pdesc;
  flashcl_attention_desc_init(&pdesc);
  CHECK(flashcl_attention_forward(ctx, &pdesc, &q, &k_prefix, &v_prefix, &o_prefix, &lse_prefix, 0, NULL, NULL));

  /* 4. Merge: O and LSE of attention over prefix + own tokens. */
  CHECK(flashcl_merge_states(ctx, &o_prefix, &lse_prefix, &o_own, &lse_own, &o, &lse, 0, NULL, NULL));
  CHECK_CL(clEnqueueReadBuffer(st->queue, st->o, CL_TRUE, 0, q_bytes, ho, 0, NULL, NULL));
  CHECK_CL(clEnqueueReadBuffer(st->queue, st->lse, CL_TRUE, 0, (size_t)B * HQ * T * sizeof(float), hlse, 0,
                               NULL, NULL));

  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < HQ; ++h) {
        double ref_o[D], ref_lse = reference_row(b, pos + t, h, ref_o);
        st->max_lse_err = worse(st->max_lse_err, fabs(ref_lse - hlse[((size_t)b * HQ + h) * T + t]));
        for (int x = 0; x < D; ++x)
          st->max_o_err = worse(st->max_o_err, fabs(ref_o[x] - ho[(((size_t)b * T + t) * HQ + h) * D + x]));
      }
  return 0;
}

int main(void) {
  for (int j = 0; j < PREFIX; ++j)
    for (int g = 0; g < HKV; ++g)
      for (int x = 0; x < D; ++x) prefix_k[j][g][x] = uniform(), prefix_v[j][g][x] = uniform();
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < TOKENS; ++j) {
      for (int x = 0; x < HQ * D; ++x) (&seq_q[b][j][0][0])[x] = uniform();
      for (int x = 0; x < HKV * D; ++x) (&seq_k[b][j][0][0])[x] = uniform(), (&seq_v[b][j][0][0])[x] = uniform();
    }

  state s = {0};
  flashcl_context *ctx = NULL;
  CHECK(flashcl_context_create(NULL, &ctx));
  s.ctx = ctx;
  s.queue = flashcl_context_cl_queue(ctx);
  cl_context cl = flashcl_context_cl_context(ctx);
  const size_t pool_bytes = (size_t)POOL * PAGE * HKV * D * sizeof(float);
  const size_t step_q = (size_t)B * CHUNK * HQ * D * sizeof(float), step_kv = (size_t)B * CHUNK * HKV * D * sizeof(float);
  const size_t step_lse = (size_t)B * HQ * CHUNK * sizeof(float);
  cl_int err;
#define BUFFER(field, flags, size, host)                            \
  do {                                                              \
    s.field = clCreateBuffer(cl, flags, size, (void *)(host), &err); \
    CHECK_CL(err);                                                  \
  } while (0)
  BUFFER(k_pool, CL_MEM_READ_WRITE, pool_bytes, NULL);
  BUFFER(v_pool, CL_MEM_READ_WRITE, pool_bytes, NULL);
  BUFFER(table, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof block_table, block_table);
  BUFFER(lens, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof s.len, s.len); /* all 0: empty caches */
  BUFFER(prefix_k, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof prefix_k, prefix_k);
  BUFFER(prefix_v, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof prefix_v, prefix_v);
  BUFFER(q, CL_MEM_READ_ONLY, step_q, NULL);
  BUFFER(k_new, CL_MEM_READ_ONLY, step_kv, NULL);
  BUFFER(v_new, CL_MEM_READ_ONLY, step_kv, NULL);
  BUFFER(o_own, CL_MEM_READ_WRITE, step_q, NULL);
  BUFFER(o_prefix, CL_MEM_READ_WRITE, step_q, NULL);
  BUFFER(o, CL_MEM_READ_WRITE, step_q, NULL);
  BUFFER(lse_own, CL_MEM_READ_WRITE, step_lse, NULL);
  BUFFER(lse_prefix, CL_MEM_READ_WRITE, step_lse, NULL);
  BUFFER(lse, CL_MEM_READ_WRITE, step_lse, NULL);
#undef BUFFER

  /* Chunked prefill of the prompts (16 + 16 + 8 tokens), then generation. In a
   * real model the generated tokens' q/k/v come from the previous step's output;
   * here they are random, which is all attention needs. */
  int steps = 0;
  for (int pos = 0; pos < PROMPT; pos += CHUNK, ++steps)
    if (step(&s, pos, PROMPT - pos < CHUNK ? PROMPT - pos : CHUNK, 0)) return 1;
  for (int pos = PROMPT; pos < TOKENS; ++pos, ++steps)
    if (step(&s, pos, 1, 1)) return 1;

  const double tol = 1e-4;
  int ok = s.max_o_err < tol && s.max_lse_err < tol;
  printf("inference: %d sequences, prefix %d + prompt %d + %d generated tokens, %d steps: "
         "max |O - ref| = %.2e, max |LSE - ref| = %.2e: %s\n",
         B, PREFIX, PROMPT, GENERATE, steps, s.max_o_err, s.max_lse_err, ok ? "OK" : "FAILED");

  cl_mem *all[] = {&s.k_pool, &s.v_pool, &s.table, &s.lens, &s.prefix_k, &s.prefix_v, &s.q, &s.k_new,
                   &s.v_new, &s.o_own, &s.o_prefix, &s.o, &s.lse_own, &s.lse_prefix, &s.lse};
  for (size_t i = 0; i < sizeof all / sizeof *all; ++i) clReleaseMemObject(*all[i]);
  flashcl_context_destroy(ctx);
  return ok ? 0 : 1;
}
