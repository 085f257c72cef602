/*
 * Host copy of the quantized KV-cache formats (flashcl.h, "Quantized KV
 * cache"; the device's is cl/common/kv_quant.cl), written independently of the
 * device code: decoding from the closed forms (ldexp), encoding by searching
 * the format's values for the nearest one. The tests quantize what a backend
 * would write into a cache, check the bytes the append wrote, and dequantize
 * the bytes read back from a cache for the double reference.
 */
#ifndef FLASHCL_TESTS_REFERENCE_KVQ_H
#define FLASHCL_TESTS_REFERENCE_KVQ_H

#include <stddef.h>
#include <stdint.h>

#include "flashcl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The code's value before the scale (NaN and inf as the format says). A
 * FLASHCL_I4X2 code is one nibble (0..15, two's complement) in a uint8_t. */
float kvq_ref_decode(flashcl_dtype fmt, uint8_t code);
/* The code of x under scale s: y = x / s (fp32), nearest even (I8: clamped to
 * [-127, 127], I4X2 to [-7, 7], NaN 0; fp8: saturating, NaN to the format's
 * NaN); s == 0: 0. */
uint8_t kvq_ref_encode(flashcl_dtype fmt, float x, float s);
/* 127, 7 (I4X2), 448, 57344: a TOKEN scale is absmax / qmax (fp32). */
float kvq_ref_qmax(flashcl_dtype fmt);
/* The TOKEN scale of n values (fmax semantics: NaN ignored). */
float kvq_ref_token_scale(flashcl_dtype fmt, const float *x, int n);
/* Distance between two codes of fmt in steps of the format (I8: |a - b|; fp8:
 * along the sign-magnitude order), so that "off by one code" is testable. */
int kvq_ref_code_distance(flashcl_dtype fmt, uint8_t a, uint8_t b);
/* Bytes of n codes; the code of element x of a row starting at row, and its
 * store (I4X2: two per byte, the even element in the low nibble). */
size_t kvq_ref_row_bytes(flashcl_dtype fmt, size_t n);
uint8_t kvq_ref_get(flashcl_dtype fmt, const uint8_t *row, size_t x);
void kvq_ref_put(flashcl_dtype fmt, uint8_t *row, size_t x, uint8_t code);

#ifdef __cplusplus
}
#endif
#endif
