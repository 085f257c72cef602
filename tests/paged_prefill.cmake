# Paged K/V source for the forward pass (desc.paged.cache.block_table): chunked prefill over
# a paged KV cache, flash and naive, GPU map, append + prefill, errors.
# Included from tests/CMakeLists.txt.
flashcl_add_test(test_paged_prefill TIMEOUT 600)
flashcl_add_test_variant(test_paged_prefill_sep_kv test_paged_prefill
  "FLASHCL_TUNING=${CMAKE_CURRENT_LIST_DIR}/tuning/gpu_map_sep_kv.tune" TIMEOUT 600)
# The quantized paged source's reference dequantizes through the host copy of the formats.
target_sources(test_paged_prefill PRIVATE ${CMAKE_CURRENT_LIST_DIR}/reference_kvq.c)
# Its window and softcap cases take the masked reference (masks.cmake, included before).
target_link_libraries(test_paged_prefill PRIVATE flashcl_test_masks)
