# Sliding window, ALiBi and softcap tests (forward and backward, flash and naive).
# Included from tests/CMakeLists.txt.
add_library(flashcl_test_masks STATIC ${CMAKE_CURRENT_LIST_DIR}/reference_masks.c ${CMAKE_CURRENT_LIST_DIR}/reference_bwd.c
                                      ${CMAKE_CURRENT_LIST_DIR}/philox_ref.c)
target_link_libraries(flashcl_test_masks PUBLIC flashcl_test_common)
if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(flashcl_test_masks PRIVATE -Wall -Wextra)
endif()
flashcl_add_test(test_masks TIMEOUT 600)
# The GPU forward with separate K and V tiles (NVIDIA's SEP_KV = 2) under the
# window, ALiBi, softcap and mask variants (a mask turns SEP_KV off).
flashcl_add_test_variant(test_masks_sep_kv test_masks "FLASHCL_TUNING=${CMAKE_CURRENT_LIST_DIR}/tuning/gpu_map_sep_kv.tune" TIMEOUT 600)
target_link_libraries(test_masks PRIVATE flashcl_test_masks)
