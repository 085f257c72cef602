/*
 * Self-tests of the harness that need no device: fp16/bf16 conversion, the RNG and
 * the double-precision attention reference (checked against closed forms and an
 * independent dense implementation).
 */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------- fp16 -- */

static float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void expect_f16(float in, uint16_t want) {
  uint16_t got = fct_f32_to_f16(in);
  FCT_CHECK(got == want, "fct_f32_to_f16(%.10g [0x%08x]) = 0x%04x, want 0x%04x", (double)in,
            (unsigned)f32_to_bits(in), (unsigned)got, (unsigned)want);
}

static void expect_bf16(float in, uint16_t want) {
  uint16_t got = fct_f32_to_bf16(in);
  FCT_CHECK(got == want, "fct_f32_to_bf16(%.10g [0x%08x]) = 0x%04x, want 0x%04x", (double)in,
            (unsigned)f32_to_bits(in), (unsigned)got, (unsigned)want);
}

static void test_f16_known_values(void **state) {
  (void)state;
  expect_f16(0.0f, 0x0000);
  expect_f16(-0.0f, 0x8000);
  expect_f16(1.0f, 0x3c00);
  expect_f16(-2.0f, 0xc000);
  expect_f16(0.5f, 0x3800);
  expect_f16(65504.0f, 0x7bff);                     /* largest finite */
  expect_f16(65519.99f, 0x7bff);                    /* below the tie to inf */
  expect_f16(65520.0f, 0x7c00);                     /* tie rounds to even = inf */
  expect_f16(1e9f, 0x7c00);
  expect_f16(-INFINITY, 0xfc00);
  expect_f16(INFINITY, 0x7c00);
  expect_f16(1.0f + 0x1p-11f, 0x3c00);              /* tie, even stays */
  expect_f16(1.0f + 3 * 0x1p-11f, 0x3c02);          /* tie, odd rounds up */
  expect_f16(1.0f + 0x1p-11f + 0x1p-20f, 0x3c01);   /* just above the tie */
  expect_f16(0x1p-14f, 0x0400);                     /* smallest normal */
  expect_f16(0x1p-14f - 0x1p-25f, 0x0400);          /* tie between 0x3ff and 0x400 */
  expect_f16(0x1p-24f, 0x0001);                     /* smallest subnormal */
  expect_f16(0x1p-25f, 0x0000);                     /* tie to even zero */
  expect_f16(0x1.8p-25f, 0x0001);
  expect_f16(3 * 0x1p-25f, 0x0002);                 /* 1.5 ulp: tie to even 2 */
  expect_f16(5 * 0x1p-25f, 0x0002);                 /* 2.5 ulp: tie to even 2 */
  expect_f16(-0x1p-26f, 0x8000);
  FCT_CHECK(isnan(fct_f16_to_f32(fct_f32_to_f16(NAN))), "NaN must stay NaN through fp16");
  FCT_CHECK(fct_f16_to_f32(0x0001) == 0x1p-24f, "0x0001 -> %g", (double)fct_f16_to_f32(0x0001));
  FCT_CHECK(fct_f16_to_f32(0x7bff) == 65504.0f, "0x7bff -> %g", (double)fct_f16_to_f32(0x7bff));
  FCT_CHECK(fct_f16_to_f32(0xbc00) == -1.0f, "0xbc00 -> %g", (double)fct_f16_to_f32(0xbc00));
}

static void test_f16_roundtrip_all(void **state) {
  uint32_t h;
  (void)state;
  for (h = 0; h < 65536; h++) {
    float f = fct_f16_to_f32((uint16_t)h);
    int is_nan = ((h & 0x7c00) == 0x7c00) && (h & 0x3ff);
    if (is_nan) {
      FCT_CHECK(isnan(f), "fp16 0x%04x is NaN, converted to %g", (unsigned)h, (double)f);
      FCT_CHECK(isnan(fct_f16_to_f32(fct_f32_to_f16(f))), "fp16 NaN 0x%04x lost its NaN-ness", (unsigned)h);
    } else {
      FCT_CHECK(fct_f32_to_f16(f) == h, "fp16 0x%04x -> %.10g -> 0x%04x", (unsigned)h, (double)f,
                (unsigned)fct_f32_to_f16(f));
    }
  }
}

/* For random floats, the result must be a nearest representable value, ties to
 * even: checked against the neighbours in double arithmetic (and against the
 * compiler's _Float16 conversion where available). */
static void test_f16_nearest_random(void **state) {
  fct_rng rng;
  int i;
  (void)state;
  fct_rng_init(&rng, "f16_nearest");
  for (i = 0; i < 400000; i++) {
    /* Random bit patterns over the fp16 range, both signs. */
    uint32_t bits = (uint32_t)fct_rng_u64(&rng);
    uint32_t exp = 100 + (uint32_t)(fct_rng_u64(&rng) % 45); /* 2^-27 .. 2^17 */
    float f = bits_to_f32((bits & 0x807fffffu) | (exp << 23));
    uint16_t h = fct_f32_to_f16(f);
    double df = f, got = fct_f16_to_f32(h);
    if (fabs(df) >= 65520.0) {
      FCT_CHECK((h & 0x7fff) == 0x7c00, "%.10g should round to inf, got 0x%04x", df, (unsigned)h);
      continue;
    }
    {
      /* neighbours of h in magnitude */
      uint16_t mag = h & 0x7fff, sign = h & 0x8000;
      double up = mag < 0x7bff ? fct_f16_to_f32((uint16_t)(sign | (mag + 1))) : got;
      double dn = mag > 0 ? fct_f16_to_f32((uint16_t)(sign | (mag - 1))) : got;
      double e = fabs(df - got);
      FCT_CHECK(e <= fabs(df - up) && e <= fabs(df - dn), "fp16(%.10g) = 0x%04x (%.10g) is not nearest", df,
                (unsigned)h, got);
      if (e == fabs(df - up) && up != got)
        FCT_CHECK((mag & 1) == 0, "fp16(%.10g) tie not to even: 0x%04x", df, (unsigned)h);
      if (e == fabs(df - dn) && dn != got)
        FCT_CHECK((mag & 1) == 0, "fp16(%.10g) tie not to even: 0x%04x", df, (unsigned)h);
    }
#if defined(__FLT16_MAX__) && !defined(__cplusplus)
    {
      _Float16 hw = (_Float16)f;
      uint16_t hb;
      memcpy(&hb, &hw, 2);
      FCT_CHECK(hb == h, "fp16(%.10g): harness 0x%04x, compiler _Float16 0x%04x", df, (unsigned)h, (unsigned)hb);
    }
#endif
  }
}

static void test_bf16_conversion(void **state) {
  uint32_t h;
  fct_rng rng;
  int i;
  (void)state;
  expect_bf16(0.0f, 0x0000);
  expect_bf16(-0.0f, 0x8000);
  expect_bf16(1.0f, 0x3f80);
  expect_bf16(-2.0f, 0xc000);
  expect_bf16(1.0f + 0x1p-8f, 0x3f80);            /* tie, even stays */
  expect_bf16(1.0f + 3 * 0x1p-8f, 0x3f82);        /* tie, odd rounds up */
  expect_bf16(1.0f + 0x1p-8f + 0x1p-20f, 0x3f81); /* above the tie */
  expect_bf16(INFINITY, 0x7f80);
  expect_bf16(-INFINITY, 0xff80);
  expect_bf16(bits_to_f32(0x7f7fffffu), 0x7f80); /* FLT_MAX rounds to inf */
  expect_bf16(bits_to_f32(0x00000001u), 0x0000); /* denormal rounds to zero */
  expect_bf16(bits_to_f32(0x00008000u), 0x0000); /* tie, even */
  expect_bf16(bits_to_f32(0x00018000u), 0x0002); /* tie, odd rounds up */
  FCT_CHECK(isnan(fct_bf16_to_f32(fct_f32_to_bf16(NAN))), "NaN must stay NaN through bf16");
  FCT_CHECK(isnan(fct_bf16_to_f32(fct_f32_to_bf16(bits_to_f32(0x7f800001u)))),
            "a NaN with a low payload must not become inf");
  for (h = 0; h < 65536; h++) {
    float f = fct_bf16_to_f32((uint16_t)h);
    if (isnan(f)) continue;
    FCT_CHECK(fct_f32_to_bf16(f) == h, "bf16 0x%04x -> %.10g -> 0x%04x", (unsigned)h, (double)f,
              (unsigned)fct_f32_to_bf16(f));
  }
  fct_rng_init(&rng, "bf16_nearest");
  for (i = 0; i < 400000; i++) {
    float f = bits_to_f32((uint32_t)fct_rng_u64(&rng) & 0xbfffffffu); /* finite, |f| < 2 ^ 1 .. */
    uint16_t b = fct_f32_to_bf16(f);
    double df = f, got = fct_bf16_to_f32(b);
    double up = fct_bf16_to_f32((uint16_t)(b + 1)), dn = fct_bf16_to_f32((uint16_t)(b - 1));
    double e = fabs(df - got);
    if ((b & 0x7fff) == 0 || (b & 0x7f80) == 0x7f80) continue;
    FCT_CHECK(e <= fabs(df - up) && e <= fabs(df - dn), "bf16(%.10g) = 0x%04x (%.10g) is not nearest", df,
              (unsigned)b, got);
    if (e == fabs(df - up) || e == fabs(df - dn))
      FCT_CHECK((b & 1) == 0, "bf16(%.10g) tie not to even: 0x%04x", df, (unsigned)b);
  }
}

static void test_poison_and_loaders(void **state) {
  unsigned char buf[16];
  flashcl_dtype dts[3] = {FLASHCL_F32, FLASHCL_F16, FLASHCL_BF16};
  int i;
  (void)state;
  for (i = 0; i < 3; i++) {
    fct_store_poison(dts[i], buf, 1);
    FCT_CHECK(fct_is_poison(dts[i], buf, 1), "poison of %s not recognised", fct_dtype_str(dts[i]));
    FCT_CHECK(isnan(fct_load(dts[i], buf, 1)), "poison of %s is not NaN", fct_dtype_str(dts[i]));
    fct_store(dts[i], buf, 2, 1.5f);
    FCT_CHECK(fct_load(dts[i], buf, 2) == 1.5, "store/load %s", fct_dtype_str(dts[i]));
    FCT_CHECK(fct_loader(dts[i])(buf, 2) == 1.5, "loader %s", fct_dtype_str(dts[i]));
    FCT_CHECK(!fct_is_poison(dts[i], buf, 2), "1.5 taken for poison (%s)", fct_dtype_str(dts[i]));
  }
  FCT_CHECK(fct_quantize(FLASHCL_F16, 0.1f) != 0.1f && fabs(fct_quantize(FLASHCL_F16, 0.1f) - 0.1) < 1e-4,
            "fp16 quantize(0.1) = %.10g", (double)fct_quantize(FLASHCL_F16, 0.1f));
  FCT_CHECK(fct_quantize(FLASHCL_BF16, 0.1f) != 0.1f && fabs(fct_quantize(FLASHCL_BF16, 0.1f) - 0.1) < 1e-3,
            "bf16 quantize(0.1) = %.10g", (double)fct_quantize(FLASHCL_BF16, 0.1f));
}

static void test_rng(void **state) {
  fct_rng a, b, c;
  double sum = 0, sum2 = 0;
  int i, n = 200000;
  (void)state;
  fct_rng_init(&a, "x");
  fct_rng_init(&b, "x");
  fct_rng_init(&c, "y");
  FCT_CHECK(fct_rng_u64(&a) == fct_rng_u64(&b), "same tag must give the same stream");
  FCT_CHECK(fct_rng_u64(&a) != fct_rng_u64(&c), "different tags should give different streams");
  for (i = 0; i < n; i++) {
    double x = fct_rng_normal(&a);
    sum += x;
    sum2 += x * x;
  }
  FCT_CHECK(fabs(sum / n) < 0.02 && fabs(sum2 / n - 1.0) < 0.02, "normal: mean %g, var %g", sum / n, sum2 / n);
}

/* ---------------------------------------------------------- reference -- */

static double *random_doubles(fct_rng *rng, size_t n) {
  double *p = (double *)malloc(n * sizeof(double));
  size_t i;
  FCT_CHECK(p != NULL, "malloc");
  for (i = 0; i < n; i++) p[i] = fct_rng_normal(rng);
  return p;
}

static ref_attention_params params(int causal, double scale) {
  ref_attention_params p;
  memset(&p, 0, sizeof p);
  p.causal = causal;
  p.scale = scale;
  return p;
}

/* An independent dense implementation: full score matrix, mask, softmax. */
static void dense_attention(const double *q, const double *k, const double *v, int B, int Nq, int Nk, int Hq,
                            int Hkv, int D, int causal, double scale, double *o, double *lse) {
  int b, h, i, j, x;
  double *s = (double *)malloc((size_t)Nk * sizeof(double));
  FCT_CHECK(s != NULL, "malloc");
  for (b = 0; b < B; b++)
    for (h = 0; h < Hq; h++) {
      int hk = h / (Hq / Hkv);
      for (i = 0; i < Nq; i++) {
        double m = -INFINITY, z = 0;
        for (j = 0; j < Nk; j++) {
          double acc = 0;
          for (x = 0; x < D; x++)
            acc += q[(((size_t)b * Nq + i) * Hq + h) * D + x] * k[(((size_t)b * Nk + j) * Hkv + hk) * D + x];
          s[j] = (causal && j > i + Nk - Nq) ? -INFINITY : acc * scale;
          if (s[j] > m) m = s[j];
        }
        for (j = 0; j < Nk; j++) z += m == -INFINITY ? 0.0 : exp(s[j] - m);
        for (x = 0; x < D; x++) {
          double acc = 0;
          for (j = 0; j < Nk; j++)
            if (z > 0) acc += exp(s[j] - m) / z * v[(((size_t)b * Nk + j) * Hkv + hk) * D + x];
          o[(((size_t)b * Nq + i) * Hq + h) * D + x] = acc;
        }
        lse[((size_t)b * Nq + i) * Hq + h] = z > 0 ? m + log(z) : -INFINITY;
      }
    }
  free(s);
}

static void check_against_dense(int B, int Nq, int Nk, int Hq, int Hkv, int D, int causal, double scale) {
  char tag[128];
  fct_rng rng;
  double *q, *k, *v, *o, *l, *o2, *l2;
  ref_tensor rq, rk, rv;
  ref_out ro, rl;
  ref_attention_params p = params(causal, scale);
  size_t i, no = (size_t)B * Nq * Hq * D, nl = (size_t)B * Nq * Hq;
  snprintf(tag, sizeof tag, "dense B=%d Nq=%d Nk=%d Hq=%d Hkv=%d D=%d causal=%d scale=%g", B, Nq, Nk, Hq, Hkv, D,
           causal, scale);
  fct_rng_init(&rng, tag);
  q = random_doubles(&rng, (size_t)B * Nq * Hq * D);
  k = random_doubles(&rng, (size_t)B * Nk * Hkv * D);
  v = random_doubles(&rng, (size_t)B * Nk * Hkv * D);
  o = (double *)malloc(no * sizeof(double));
  o2 = (double *)malloc(no * sizeof(double));
  l = (double *)malloc(nl * sizeof(double));
  l2 = (double *)malloc(nl * sizeof(double));
  FCT_CHECK(o && o2 && l && l2, "malloc");
  rq = ref_tensor_bnhd(q, B, Nq, Hq, D);
  rk = ref_tensor_bnhd(k, B, Nk, Hkv, D);
  rv = ref_tensor_bnhd(v, B, Nk, Hkv, D);
  ro = ref_out_bnhd(o, B, Nq, Hq, D);
  rl = ref_out_bnhd(l, B, Nq, Hq, 1);
  FCT_CHECK(ref_attention_forward(&p, &rq, &rk, &rv, &ro, &rl) == 0, "reference rejected %s", tag);
  dense_attention(q, k, v, B, Nq, Nk, Hq, Hkv, D, causal, scale != 0 ? scale : 1.0 / sqrt((double)D), o2, l2);
  for (i = 0; i < no; i++) FCT_CHECK(fabs(o[i] - o2[i]) <= 1e-12 * (1 + fabs(o2[i])), "%s: o[%zu] %.17g vs dense %.17g", tag, i, o[i], o2[i]);
  for (i = 0; i < nl; i++)
    FCT_CHECK((isinf(l[i]) && l[i] == l2[i]) || fabs(l[i] - l2[i]) <= 1e-12 * (1 + fabs(l2[i])),
              "%s: lse[%zu] %.17g vs dense %.17g", tag, i, l[i], l2[i]);
  free(q), free(k), free(v), free(o), free(o2), free(l), free(l2);
}

static void test_reference_vs_dense(void **state) {
  (void)state;
  check_against_dense(2, 5, 5, 2, 2, 8, 0, 0);
  check_against_dense(2, 5, 5, 2, 2, 8, 1, 0);
  check_against_dense(1, 3, 9, 4, 2, 16, 1, 0);   /* Nq < Nk, GQA */
  check_against_dense(1, 9, 3, 4, 1, 16, 1, 0.3); /* Nq > Nk: empty rows, MQA */
  check_against_dense(3, 1, 1, 1, 1, 8, 1, 0);
  check_against_dense(1, 7, 13, 3, 3, 24, 0, 1.7);
}

static void test_reference_closed_forms(void **state) {
  /* One key: O = v, LSE = scale * q.k. Identical keys: O = mean(v), LSE = s + log Nk. */
  double q[8], k[5 * 8], v[5 * 8], o[8], l, want_s = 0, mean[8];
  ref_tensor rq, rk, rv;
  ref_out ro, rl;
  ref_attention_params p = params(0, 0.5);
  int x, j;
  (void)state;
  for (x = 0; x < 8; x++) q[x] = 0.1 * (x + 1);
  for (j = 0; j < 5; j++)
    for (x = 0; x < 8; x++) k[j * 8 + x] = 0.3 - 0.05 * x, v[j * 8 + x] = j * 10.0 + x;
  for (x = 0; x < 8; x++) want_s += 0.5 * q[x] * k[x];
  rq = ref_tensor_bnhd(q, 1, 1, 1, 8);
  rk = ref_tensor_bnhd(k, 1, 1, 1, 8);
  rv = ref_tensor_bnhd(v, 1, 1, 1, 8);
  ro = ref_out_bnhd(o, 1, 1, 1, 8);
  rl = ref_out_bnhd(&l, 1, 1, 1, 1);
  FCT_CHECK(ref_attention_forward(&p, &rq, &rk, &rv, &ro, &rl) == 0, "single key rejected");
  for (x = 0; x < 8; x++) FCT_CHECK(o[x] == v[x], "single key: o[%d]=%g, want v=%g", x, o[x], v[x]);
  FCT_CHECK(fabs(l - want_s) < 1e-15, "single key: lse %.17g, want %.17g", l, want_s);

  rk.shape[1] = rv.shape[1] = 5;
  FCT_CHECK(ref_attention_forward(&p, &rq, &rk, &rv, &ro, &rl) == 0, "identical keys rejected");
  for (x = 0; x < 8; x++) {
    mean[x] = 0;
    for (j = 0; j < 5; j++) mean[x] += v[j * 8 + x] / 5.0;
    FCT_CHECK(fabs(o[x] - mean[x]) < 1e-12, "identical keys: o[%d]=%.17g, want %.17g", x, o[x], mean[x]);
  }
  FCT_CHECK(fabs(l - (want_s + log(5.0))) < 1e-14, "identical keys: lse %.17g, want %.17g", l, want_s + log(5.0));
}

static void test_reference_causal_alignment(void **state) {
  ref_attention_params p = params(1, 0);
  ref_segment seg;
  int64_t i;
  (void)state;
  /* Nq=3, Nk=5: row i sees keys 0..i+2. */
  seg.q_batch = seg.k_batch = seg.q_row0 = seg.k_row0 = 0;
  seg.nq = 3, seg.nk = 5;
  for (i = 0; i < 3; i++)
    FCT_CHECK(ref_attention_visible_keys(&p, &seg, i) == i + 3, "Nq=3 Nk=5 row %lld sees %lld keys, want %lld",
              (long long)i, (long long)ref_attention_visible_keys(&p, &seg, i), (long long)(i + 3));
  /* Nq=5, Nk=2: rows 0..2 see nothing, row 3 sees 1, row 4 sees 2. */
  seg.nq = 5, seg.nk = 2;
  for (i = 0; i < 5; i++) {
    int64_t want = i < 3 ? 0 : i - 2;
    FCT_CHECK(ref_attention_visible_keys(&p, &seg, i) == want, "Nq=5 Nk=2 row %lld sees %lld keys, want %lld",
              (long long)i, (long long)ref_attention_visible_keys(&p, &seg, i), (long long)want);
  }
  /* Square: row i sees i+1 keys. Non-causal: all. */
  seg.nq = seg.nk = 4;
  for (i = 0; i < 4; i++) FCT_CHECK(ref_attention_visible_keys(&p, &seg, i) == i + 1, "square row %lld", (long long)i);
  p.causal = 0;
  seg.nq = 5, seg.nk = 2;
  for (i = 0; i < 5; i++) FCT_CHECK(ref_attention_visible_keys(&p, &seg, i) == 2, "non-causal row %lld", (long long)i);
}

static void test_reference_gqa_mapping(void **state) {
  /* Hq=4, Hkv=2, one key: head h's output is v of kv head h/2. */
  double q[4 * 8], k[2 * 8], v[2 * 8], o[4 * 8], l[4];
  ref_tensor rq, rk, rv;
  ref_out ro, rl;
  ref_attention_params p = params(0, 0);
  int h, x;
  (void)state;
  for (x = 0; x < 4 * 8; x++) q[x] = 0.01 * x;
  for (x = 0; x < 2 * 8; x++) k[x] = 0.02 * x, v[x] = 100.0 * (x / 8) + x % 8;
  rq = ref_tensor_bnhd(q, 1, 1, 4, 8);
  rk = ref_tensor_bnhd(k, 1, 1, 2, 8);
  rv = ref_tensor_bnhd(v, 1, 1, 2, 8);
  ro = ref_out_bnhd(o, 1, 1, 4, 8);
  rl = ref_out_bnhd(l, 1, 1, 4, 1);
  FCT_CHECK(ref_attention_forward(&p, &rq, &rk, &rv, &ro, &rl) == 0, "GQA rejected");
  for (h = 0; h < 4; h++)
    for (x = 0; x < 8; x++)
      FCT_CHECK(o[h * 8 + x] == v[(h / 2) * 8 + x], "GQA: head %d x %d got %g, want kv head %d's %g", h, x,
                o[h * 8 + x], h / 2, v[(h / 2) * 8 + x]);
  rq.shape[2] = 3; /* 3 % 2 != 0 */
  FCT_CHECK(ref_attention_forward(&p, &rq, &rk, &rv, &ro, &rl) != 0, "Hq=3 Hkv=2 must be rejected");
}

/* The same logical tensors in BNHD, BHND and a padded strided layout (through the
 * fp16 loader) must give identical results. */
static void test_reference_strides(void **state) {
  enum { B = 2, N = 6, H = 2, D = 8 };
  double dense[3][B * N * H * D];
  uint16_t half[3][4096];
  double o1[B * N * H * D], o2[B * N * H * D], l1[B * N * H], l2[B * N * H];
  ref_tensor t1[3], t2[3];
  ref_out ro, rl;
  ref_attention_params p = params(1, 0);
  fct_rng rng;
  int a, b, n, h, x;
  size_t i;
  (void)state;
  fct_rng_init(&rng, "strides");
  for (a = 0; a < 3; a++) {
    for (i = 0; i < 4096; i++) half[a][i] = 0x7e00; /* NaN everywhere else */
    t2[a].data = half[a];
    t2[a].load = fct_load_f16;
    t2[a].offset = 7;
    t2[a].shape[0] = B, t2[a].shape[1] = N, t2[a].shape[2] = H, t2[a].shape[3] = D;
    t2[a].stride[3] = 1, t2[a].stride[1] = D + 3, t2[a].stride[2] = N * (D + 3) + 1,
    t2[a].stride[0] = H * t2[a].stride[2] + 5;
    for (b = 0; b < B; b++)
      for (n = 0; n < N; n++)
        for (h = 0; h < H; h++)
          for (x = 0; x < D; x++) {
            uint16_t hv = fct_f32_to_f16((float)fct_rng_normal(&rng));
            dense[a][((b * N + n) * H + h) * D + x] = fct_f16_to_f32(hv);
            half[a][t2[a].offset + b * t2[a].stride[0] + n * t2[a].stride[1] + h * t2[a].stride[2] + x] = hv;
          }
    t1[a] = ref_tensor_bnhd(dense[a], B, N, H, D);
  }
  ro = ref_out_bnhd(o1, B, N, H, D);
  rl = ref_out_bnhd(l1, B, N, H, 1);
  FCT_CHECK(ref_attention_forward(&p, &t1[0], &t1[1], &t1[2], &ro, &rl) == 0, "dense rejected");
  ro = ref_out_bnhd(o2, B, N, H, D);
  rl = ref_out_bnhd(l2, B, N, H, 1);
  FCT_CHECK(ref_attention_forward(&p, &t2[0], &t2[1], &t2[2], &ro, &rl) == 0, "strided rejected");
  for (i = 0; i < (size_t)(B * N * H * D); i++) FCT_CHECK(o1[i] == o2[i], "strided o[%zu]: %g vs %g", i, o1[i], o2[i]);
  for (i = 0; i < (size_t)(B * N * H); i++) FCT_CHECK(l1[i] == l2[i], "strided lse[%zu]: %g vs %g", i, l1[i], l2[i]);
}

/* Varlen packing must equal running each sequence as its own batch. */
static void test_reference_varlen(void **state) {
  enum { S = 4, H = 2, HK = 1, D = 8 };
  const int lq[S] = {1, 6, 0, 3}, lk[S] = {2, 4, 3, 0};
  int32_t cq[S + 1] = {0}, ck[S + 1] = {0};
  double q[10 * H * D], k[9 * HK * D], v[9 * HK * D], o[10 * H * D], l[10 * H];
  ref_tensor rq, rk, rv;
  ref_out ro, rl;
  ref_attention_params p = params(1, 0);
  fct_rng rng;
  int s, i, h, x;
  (void)state;
  for (s = 0; s < S; s++) cq[s + 1] = cq[s] + lq[s], ck[s + 1] = ck[s] + lk[s];
  fct_rng_init(&rng, "varlen");
  for (i = 0; i < 10 * H * D; i++) q[i] = fct_rng_normal(&rng);
  for (i = 0; i < 9 * HK * D; i++) k[i] = fct_rng_normal(&rng), v[i] = fct_rng_normal(&rng);
  p.cu_seqlens_q = cq, p.cu_seqlens_k = ck, p.num_seqs = S;
  rq = ref_tensor_bnhd(q, 1, 10, H, D);
  rk = ref_tensor_bnhd(k, 1, 9, HK, D);
  rv = ref_tensor_bnhd(v, 1, 9, HK, D);
  ro = ref_out_bnhd(o, 1, 10, H, D);
  rl = ref_out_bnhd(l, 1, 10, H, 1);
  FCT_CHECK(ref_attention_forward(&p, &rq, &rk, &rv, &ro, &rl) == 0, "varlen rejected");
  for (s = 0; s < S; s++) {
    double o1[6 * H * D], l1[6 * H];
    ref_attention_params p1 = params(1, 0);
    ref_tensor q1 = ref_tensor_bnhd(q + (size_t)cq[s] * H * D, 1, lq[s], H, D);
    ref_tensor k1 = ref_tensor_bnhd(k + (size_t)ck[s] * HK * D, 1, lk[s], HK, D);
    ref_tensor v1 = ref_tensor_bnhd(v + (size_t)ck[s] * HK * D, 1, lk[s], HK, D);
    ref_out ro1 = ref_out_bnhd(o1, 1, lq[s], H, D), rl1 = ref_out_bnhd(l1, 1, lq[s], H, 1);
    FCT_CHECK(ref_attention_forward(&p1, &q1, &k1, &v1, &ro1, &rl1) == 0, "seq %d rejected", s);
    for (i = 0; i < lq[s]; i++)
      for (h = 0; h < H; h++) {
        FCT_CHECK(l[(cq[s] + i) * H + h] == l1[i * H + h] || (isinf(l1[i * H + h]) && isinf(l[(cq[s] + i) * H + h])),
                  "varlen seq %d row %d head %d: lse %g vs %g", s, i, h, l[(cq[s] + i) * H + h], l1[i * H + h]);
        for (x = 0; x < D; x++)
          FCT_CHECK(o[((cq[s] + i) * H + h) * D + x] == o1[(i * H + h) * D + x], "varlen seq %d row %d head %d x %d",
                    s, i, h, x);
      }
    if (lk[s] == 0)
      for (i = 0; i < lq[s]; i++)
        FCT_CHECK(isinf(l[(cq[s] + i) * H]) && o[(cq[s] + i) * H * D] == 0.0, "seq %d with no keys: row %d not empty",
                  s, i);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f16_known_values),
      cmocka_unit_test(test_f16_roundtrip_all),
      cmocka_unit_test(test_f16_nearest_random),
      cmocka_unit_test(test_bf16_conversion),
      cmocka_unit_test(test_poison_and_loaders),
      cmocka_unit_test(test_rng),
      cmocka_unit_test(test_reference_vs_dense),
      cmocka_unit_test(test_reference_closed_forms),
      cmocka_unit_test(test_reference_causal_alignment),
      cmocka_unit_test(test_reference_gqa_mapping),
      cmocka_unit_test(test_reference_strides),
      cmocka_unit_test(test_reference_varlen),
  };
  return fct_run_group("reference", tests, sizeof tests / sizeof tests[0], 0);
}
