# NVIDIA tensor-core forward: accuracy on devices that have it, clean skip elsewhere.
flashcl_add_test(test_mma TIMEOUT 300)
# On a Hopper GPU the d = 64 and 128 cases above run the wgmma forward
# (cl/nvidia/flash_fwd_wgmma.cl); this runs them again on the mma.sync forward. Elsewhere
# both skip, or run the same kernel twice.
flashcl_add_test_variant(test_mma_sync test_mma "FLASHCL_TUNING=${CMAKE_CURRENT_LIST_DIR}/tuning/no_wgmma.tune" TIMEOUT 300)
