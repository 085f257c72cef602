# Inference tests: decode (split-KV, paged/contiguous caches, GQA), KV-cache
# append and the state merge. Included from tests/CMakeLists.txt.
flashcl_add_test(test_decode TIMEOUT 600)   # decode, append, merge: default coverage
flashcl_add_test(test_decode_quant TIMEOUT 300)  # quantized (i8 / fp8) KV caches: append, decode, formats
target_sources(test_decode_quant PRIVATE ${CMAKE_CURRENT_LIST_DIR}/reference_kvq.c)
flashcl_add_test(test_decode_merge TIMEOUT 300)  # the one-launch split merge against decode_merge
# CPU devices run decode_cpu.cl's kernel; these keep decode.cl's mapping
# tested on them (PoCL in CI), through the override file named by $FLASHCL_TUNING.
flashcl_add_test_variant(test_decode_gpu_map test_decode "FLASHCL_TUNING=${CMAKE_CURRENT_LIST_DIR}/tuning/decode_gpu_map.tune" TIMEOUT 600)
flashcl_add_test_variant(test_decode_quant_gpu_map test_decode_quant "FLASHCL_TUNING=${CMAKE_CURRENT_LIST_DIR}/tuning/decode_gpu_map.tune" TIMEOUT 300)
