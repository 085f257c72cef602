/* The PTX rewrite behind the Hopper wgmma forward (src/nvidia/ptx_sm90a.c): markers
 * deleted, the target raised to sm_90a, everything else byte for byte, and a
 * refusal with a reason for modules it must not touch. No device needed: the
 * function is compiled into this test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "../src/nvidia/ptx_sm90a.h"

static void rewrites(const char *in, const char *want) {
  const char *why = NULL;
  char *out = fcl_ptx_to_sm90a(in, &why);
  assert_non_null(out);
  assert_string_equal(out, want);
  free(out);
}

static void refuses(const char *in, const char *reason_part) {
  const char *why = NULL;
  assert_null(fcl_ptx_to_sm90a(in, &why));
  assert_non_null(why);
  assert_non_null(strstr(why, reason_part));
}

/* The shape of NVIDIA's OpenCL output: the target directive with a texture
 * mode, inline asm between comment lines, operands already substituted. */
static void nvidia_module(void **state) {
  (void)state;
  rewrites("//\n.version 9.0\n.target sm_90, texmode_independent\n.address_size 64\n"
           "\t// begin inline asm\n\t//@sm90a@ wgmma.fence.sync.aligned;\n\t// end inline asm\n"
           "\t//@sm90a@ { .reg .pred p; setp.ne.b32 p, %r12, 0; wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 "
           "{%f1,%f2}, %rd4, %rd5, p, 1, 1, 0, 0; }\n\tmov.u32 %r1, %r2; // a comment that stays\n",
           "//\n.version 9.0\n.target sm_90a, texmode_independent\n.address_size 64\n"
           "\t// begin inline asm\n\twgmma.fence.sync.aligned;\n\t// end inline asm\n"
           "\t{ .reg .pred p; setp.ne.b32 p, %r12, 0; wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 "
           "{%f1,%f2}, %rd4, %rd5, p, 1, 1, 0, 0; }\n\tmov.u32 %r1, %r2; // a comment that stays\n");
}

static void target_at_line_end(void **state) {
  (void)state;
  rewrites(".target sm_90\n//@sm90a@ wgmma.commit_group.sync.aligned;\n",
           ".target sm_90a\nwgmma.commit_group.sync.aligned;\n");
  rewrites(".target sm_90 \n//@sm90a@ x;//@sm90a@ y;", ".target sm_90a \nx;y;");
}

static void other_targets_refused(void **state) {
  (void)state;
  refuses(".target sm_80, texmode_independent\n//@sm90a@ wgmma.fence.sync.aligned;\n", "does not target sm_90");
  refuses(".target sm_90a\n//@sm90a@ wgmma.fence.sync.aligned;\n", "does not target sm_90");
  refuses(".target sm_900\n//@sm90a@ x;\n", "does not target sm_90");
  refuses("no target at all //@sm90a@ x;", "does not target sm_90");
}

static void markers_required(void **state) {
  (void)state;
  /* A near miss of the marker is not one. */
  refuses(".target sm_90\n// @sm90a@ wgmma.fence.sync.aligned;\n//@sm90a@wgmma\n", "none of the sm_90a");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(nvidia_module),
      cmocka_unit_test(target_at_line_end),
      cmocka_unit_test(other_targets_refused),
      cmocka_unit_test(markers_required),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
