# Block-sparse and bitmask attention tests (desc.mask_kind: FLASHCL_MASK_BLOCK /
# FLASHCL_MASK_BITS), forward, flash and naive, and the host layout helpers.
# Included from tests/CMakeLists.txt.
flashcl_add_test(test_sparse TIMEOUT 600)
