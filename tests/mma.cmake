# NVIDIA tensor-core forward: accuracy on devices that have it, clean skip elsewhere.
flashcl_add_test(test_mma TIMEOUT 300)
