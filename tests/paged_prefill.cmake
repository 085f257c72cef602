# Paged K/V source for the forward pass (desc.kv_block_table): chunked prefill over
# a paged KV cache, flash and naive, GPU map, append + prefill, errors.
# Included from tests/CMakeLists.txt.
flashcl_add_test(test_paged_prefill TIMEOUT 600)
