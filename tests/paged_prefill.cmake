# Paged K/V source for the forward pass (desc.kv_block_table): chunked prefill over
# a paged KV cache, flash and naive, GPU map, append + prefill, errors.
# Included from tests/CMakeLists.txt.
flashcl_add_test(test_paged_prefill TIMEOUT 600)
flashcl_add_test_variant(test_paged_prefill_sep_kv test_paged_prefill
  "FLASHCL_FWD_MAP=gpu;FLASHCL_FWD_TUNING=0,0,1,0,0,0,2" TIMEOUT 600)
