# Inference tests: decode (split-KV, paged/contiguous caches, GQA), KV-cache
# append and the state merge. Included from tests/CMakeLists.txt.
flashcl_add_test(test_decode TIMEOUT 600)   # decode, append, merge: default coverage
flashcl_add_test(test_decode_quant TIMEOUT 300)  # quantized (i8 / fp8) KV caches: append, decode, formats
target_sources(test_decode_quant PRIVATE ${CMAKE_CURRENT_LIST_DIR}/reference_kvq.c)
flashcl_add_test(test_decode_merge TIMEOUT 300)  # the one-launch split merge against decode_merge
