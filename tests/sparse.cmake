# Block-sparse and bitmask attention tests (desc.mask.kind: FLASHCL_MASK_BLOCK /
# FLASHCL_MASK_BITS), forward and backward, flash and naive, and the host layout
# helpers. Included from tests/CMakeLists.txt (after backward.cmake, whose
# flashcl_test_bwd library gives the dropout reference).
flashcl_add_test(test_sparse TIMEOUT 600)
target_link_libraries(test_sparse PRIVATE flashcl_test_bwd)
