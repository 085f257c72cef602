# Inference tests: decode (split-KV, paged/contiguous caches, GQA), KV-cache
# append and the state merge. Included from tests/CMakeLists.txt.
flashcl_add_test(test_decode TIMEOUT 600)   # decode, append, merge: default coverage
