# Backward pass and dropout tests. Included from tests/CMakeLists.txt.
#   test_backward       default suite (label default): gradients against the double
#                       reference, dropout mask, error paths, workspace, FD check
#   test_backward_long  the same source with FCT_BWD_LONG: the sweep (label long)
#   test_backward_ahead test_backward with the bwd tuning ahead=1 on the forced-plan cases
#   test_backward_warp  test_backward with the bwd tuning warp=1 on the forced-plan cases
#   test_backward_split test_backward with NVIDIA's build choices forced on (halves,
#                       unrolled loops, denormals flushed) on the forced-plan cases
#   test_backward_mma   with FCT_BWD_MMA: the NVIDIA tensor-core backward (label default;
#                       skips where the device has no tensor-core path)
add_library(flashcl_test_bwd STATIC ${CMAKE_CURRENT_LIST_DIR}/reference_bwd.c ${CMAKE_CURRENT_LIST_DIR}/philox_ref.c)
target_link_libraries(flashcl_test_bwd PUBLIC flashcl_test_common)
if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(flashcl_test_bwd PRIVATE -Wall -Wextra)
endif()
foreach(name test_backward test_backward_long test_backward_mma)
  add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/test_backward.c)
  target_link_libraries(${name} PRIVATE flashcl_test_bwd)
  if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-missing-field-initializers)
  endif()
  add_test(NAME ${name} COMMAND ${name})
endforeach()
target_compile_definitions(test_backward_long PRIVATE FCT_BWD_LONG=1)
# The tensor-core backward's own table (skips cleanly where the path is missing).
target_compile_definitions(test_backward_mma PRIVATE FCT_BWD_LONG=1 FCT_BWD_MMA=1)
set_tests_properties(test_backward PROPERTIES TIMEOUT 900 LABELS default)
set_tests_properties(test_backward_long PROPERTIES TIMEOUT 7200 LABELS long)
set_tests_properties(test_backward_mma PROPERTIES TIMEOUT 600 LABELS default)
# The portable kernels' read-ahead of the next tile (-DBWD_AHEAD; on in the
# H100's tuning file only for d = 256), forced on over the forced-plan cases: GQA,
# causal, dropout and both dQ modes at d = 64, 128 and 192.
flashcl_add_test_variant(test_backward_ahead test_backward
  "FLASHCL_TEST_TUNING=bwd ahead=1;FLASHCL_TEST_FILTER=*plan*" TIMEOUT 900)
# The warp-tiled mappings with padded score rows (bwd warp=1) on the
# same cases, whatever the device's default.
flashcl_add_test_variant(test_backward_warp test_backward
  "FLASHCL_TEST_TUNING=bwd warp=1;FLASHCL_TEST_FILTER=*plan*" TIMEOUT 900)
# The H100's build choices for the portable kernels (tuning/nvidia-h100.tune): bwd_dkdv in
# two halves of one product each, unrolled loops and -cl-denorms-are-zero, with
# the warp-tiled mappings, forced on over the same cases (PoCL takes none of
# them by default).
flashcl_add_test_variant(test_backward_split test_backward
  "FLASHCL_TEST_TUNING=bwd split=1 unroll=1 ftz=1 warp=1;FLASHCL_TEST_FILTER=*plan*" TIMEOUT 900)
# desc.shape.head_dim_v (v and o with their own head dim): forward and backward,
# flash and naive, against the double reference; error paths and queries.
add_executable(test_head_dim_v ${CMAKE_CURRENT_LIST_DIR}/test_head_dim_v.c)
target_link_libraries(test_head_dim_v PRIVATE flashcl_test_masks)
if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(test_head_dim_v PRIVATE -Wall -Wextra -Wno-missing-field-initializers)
endif()
add_test(NAME test_head_dim_v COMMAND test_head_dim_v)
set_tests_properties(test_head_dim_v PROPERTIES TIMEOUT 900 LABELS default SKIP_RETURN_CODE 77)
