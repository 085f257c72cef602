/* Host reference of the quantized KV-cache formats (reference_kvq.h). */
#include "reference_kvq.h"

#include <math.h>
#include <stdlib.h>

static int kvq_mbits(flashcl_dtype fmt) { return fmt == FLASHCL_F8E4M3 ? 3 : 2; }
static int kvq_bias(flashcl_dtype fmt) { return fmt == FLASHCL_F8E4M3 ? 7 : 15; }

float kvq_ref_decode(flashcl_dtype fmt, uint8_t code) {
  if (fmt == FLASHCL_I8) return (float)(int8_t)code;
  if (fmt == FLASHCL_I4X2) return (float)((code & 0x0f) >= 8 ? (int)(code & 0x0f) - 16 : (int)(code & 0x0f));
  const int mb = kvq_mbits(fmt), bias = kvq_bias(fmt), emax = (1 << (7 - mb)) - 1;
  const int e = (code & 0x7f) >> mb, m = code & ((1 << mb) - 1);
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (fmt == FLASHCL_F8E4M3 && e == emax && m == (1 << mb) - 1) return NAN;
  if (fmt == FLASHCL_F8E5M2 && e == emax) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * ldexpf((float)m, 1 - bias - mb);
  return sign * ldexpf((float)((1 << mb) + m), e - bias - mb);
}

float kvq_ref_qmax(flashcl_dtype fmt) {
  return fmt == FLASHCL_I8 ? 127.0f : fmt == FLASHCL_I4X2 ? 7.0f : fmt == FLASHCL_F8E4M3 ? 448.0f : 57344.0f;
}

/* The largest finite magnitude code: 0x7e (E4M3), 0x7b (E5M2). */
static int kvq_max_code(flashcl_dtype fmt) { return fmt == FLASHCL_F8E4M3 ? 0x7e : 0x7b; }

uint8_t kvq_ref_encode(flashcl_dtype fmt, float x, float s) {
  if (s == 0.0f) return 0;
  const float y = x / s;
  if (fmt == FLASHCL_I8 || fmt == FLASHCL_I4X2) {
    if (isnan(y)) return 0;
    const float lim = fmt == FLASHCL_I8 ? 127.0f : 7.0f;
    float r = nearbyintf(y); /* the default rounding mode: to nearest, ties to even */
    r = r > lim ? lim : r < -lim ? -lim : r;
    return fmt == FLASHCL_I8 ? (uint8_t)(int8_t)r : (uint8_t)((int)r & 0x0f);
  }
  const uint8_t sign = signbit(y) ? 0x80 : 0;
  if (isnan(y)) return (uint8_t)(sign | (fmt == FLASHCL_F8E4M3 ? 0x7f : 0x7e));
  const double a = fabs((double)y);
  /* Saturation (inf included); it also keeps the search below away from
   * magnitudes where every distance rounds to the same double. */
  if (a >= (double)kvq_ref_decode(fmt, (uint8_t)kvq_max_code(fmt))) return (uint8_t)(sign | kvq_max_code(fmt));
  /* The magnitudes grow with the code: the nearest one, the even code on a tie. */
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= kvq_max_code(fmt); c++) {
    const double d = fabs(a - (double)kvq_ref_decode(fmt, (uint8_t)c));
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return (uint8_t)(sign | best);
}

float kvq_ref_token_scale(flashcl_dtype fmt, const float *x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++)
    if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
  return amax / kvq_ref_qmax(fmt);
}

int kvq_ref_code_distance(flashcl_dtype fmt, uint8_t a, uint8_t b) {
  if (fmt == FLASHCL_I8 || fmt == FLASHCL_I4X2) return abs((int)kvq_ref_decode(fmt, a) - (int)kvq_ref_decode(fmt, b));
  /* Sign-magnitude to a line: +0 and -0 are one step apart, harmlessly. */
  const int la = (a & 0x80) ? -(int)(a & 0x7f) - 1 : (int)a, lb = (b & 0x80) ? -(int)(b & 0x7f) - 1 : (int)b;
  return abs(la - lb);
}

size_t kvq_ref_row_bytes(flashcl_dtype fmt, size_t n) { return fmt == FLASHCL_I4X2 ? n / 2 : n; }

uint8_t kvq_ref_get(flashcl_dtype fmt, const uint8_t *row, size_t x) {
  if (fmt != FLASHCL_I4X2) return row[x];
  return (uint8_t)(x % 2 ? row[x / 2] >> 4 : row[x / 2] & 0x0f);
}

void kvq_ref_put(flashcl_dtype fmt, uint8_t *row, size_t x, uint8_t code) {
  if (fmt != FLASHCL_I4X2) {
    row[x] = code;
    return;
  }
  const unsigned keep = x % 2 ? 0x0fu : 0xf0u, put = x % 2 ? (unsigned)(code & 0x0f) << 4 : (unsigned)(code & 0x0f);
  row[x / 2] = (uint8_t)((row[x / 2] & keep) | put);
}
