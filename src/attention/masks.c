/* The host-side helpers of the attention masks (pure C, no device): the size
 * of a bit matrix and the block layouts of flashcl_block_mask_fill. */
#include "core/internal.h"

#include <string.h>

flashcl_status flashcl_mask_words(int nrows, int ncols, size_t *words) {
  if (!words || nrows < 1 || ncols < 1) return FLASHCL_ERROR_INVALID_ARGUMENT;
  if (!fcl_mul_size((size_t)nrows, ((size_t)ncols + 31) / 32, words)) return FLASHCL_ERROR_OVERFLOW;
  return FLASHCL_SUCCESS;
}

static int fcl_block_visible(flashcl_block_layout layout, int i, int j, int param) {
  const int dist = i > j ? i - j : j - i;
  switch (layout) {
  case FLASHCL_BLOCK_LOCAL: return dist < param;
  case FLASHCL_BLOCK_STRIDED: return dist < param || j % param == param - 1;
  case FLASHCL_BLOCK_BUTTERFLY: {
    const unsigned x = (unsigned)i ^ (unsigned)j;
    if (x == 0) return 1;
    if (x & (x - 1)) return 0; /* not a power of two */
    return param == 0 || param >= 31 || x < (1u << param); /* k < param holds for every k <= 30 */
  }
  }
  return 0;
}

flashcl_status flashcl_block_mask_fill(flashcl_block_layout layout, int nbq, int nbk, int param, uint32_t *words,
                                       size_t capacity) {
  size_t need;
  if (!words || nbq < 1 || nbk < 1) return FLASHCL_ERROR_INVALID_ARGUMENT;
  if (layout != FLASHCL_BLOCK_LOCAL && layout != FLASHCL_BLOCK_STRIDED && layout != FLASHCL_BLOCK_BUTTERFLY)
    return FLASHCL_ERROR_INVALID_ARGUMENT;
  if (layout == FLASHCL_BLOCK_BUTTERFLY ? param < 0 : param < 1) return FLASHCL_ERROR_INVALID_ARGUMENT;
  flashcl_status st = flashcl_mask_words(nbq, nbk, &need);
  if (st != FLASHCL_SUCCESS) return st;
  if (capacity < need) return FLASHCL_ERROR_BUFFER_TOO_SMALL;
  const size_t w = ((size_t)nbk + 31) / 32;
  memset(words, 0, need * sizeof *words);
  for (int i = 0; i < nbq; i++)
    for (int j = 0; j < nbk; j++)
      if (fcl_block_visible(layout, i, j, param)) words[(size_t)i * w + (size_t)j / 32] |= 1u << (j % 32);
  return FLASHCL_SUCCESS;
}
