/* The declared tuning spaces: every parameter of every kernel family, with its
 * legal range and the candidates flashcl-tune searches, in one table per
 * family. The runtime, the tuning-file parser, per-call tunings and the tuner
 * all read these tables, so a parameter exists exactly when it is declared
 * here (README "Tuning" lists them). A parameter a configuration does not set
 * keeps its family's default rule (the code that reads it says which). */
#include "core/tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FCL_CAND(...) (const int[]){__VA_ARGS__}, (int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int))
#define FCL_NOCAND NULL, 0
#define FCL_BOOL 0, 1, 1, FCL_CAND(0, 1)

static const fcl_param_decl fcl_fwd_decls[FCL_FWD_COUNT] = {
    {"map", "1: the CPU mapping (one work-item owns Br rows); 0: the GPU mapping. Rule: 1 on non-GPU devices", 0, 1,
     1, FCL_NOCAND},
    {"br", "query rows per work-group (Br). Rule: the local-memory rule (README \"Block sizes\")", 8, 256, 8,
     FCL_CAND(16, 32, 48, 64, 96, 128)},
    {"bc", "key rows per tile (Bc). Rule: the local-memory rule", 8, 256, 8, FCL_CAND(16, 32, 48, 64, 96, 128)},
    {"threads", "GPU mapping: work-items per work-group. Rule: the cheapest mapping of 128, 256, 64, then any", 1,
     1024, 1, FCL_CAND(64, 128, 256)},
    {"s_tm", "GPU mapping: rows of each work-item's S micro-tile. Rule: the cost model", 1, 8, 1, FCL_NOCAND},
    {"s_tn", "GPU mapping: columns of each work-item's S micro-tile. Rule: the cost model", 1, 16, 1, FCL_NOCAND},
    {"o_tm", "GPU mapping: rows of each work-item's O micro-tile. Rule: the cost model", 1, 8, 1, FCL_NOCAND},
    {"o_td", "GPU mapping: head-dim columns of each work-item's O micro-tile. Rule: the cost model", 4, 64, 4,
     FCL_NOCAND},
    {"tall", "cost ties in the mapping search go to taller S micro-tiles. Rule: 0", FCL_BOOL},
    {"unroll_d", "unroll the head-dim loop of S (-DUNROLL_D). Rule: 0", FCL_BOOL},
    {"prefetch", "register prefetch of the next K/V values (-DPREFETCH). Rule: 1", FCL_BOOL},
    {"pad", "pad local rows by 4 floats instead of swizzling (-DPAD_ROWS). Rule: 0", FCL_BOOL},
    {"unroll_o", "unroll factor of the key loop of P V (-DUNROLL_O; 0: none). Rule: 0", 0, 64, 1,
     FCL_CAND(0, 2, 4, 8)},
    {"ftz", "build with -cl-denorms-are-zero. Rule: 0", FCL_BOOL},
    {"sep_kv", "separate K and V tiles: 0 shared, 1 one register stage, 2 both refilled at once. Rule: 0", 0, 2, 1,
     FCL_CAND(0, 1, 2)},
    {"shfl", "row maxima through warp shuffles (inline PTX; only where the tensor-core probe passed). Rule: 0",
     FCL_BOOL},
};

static const fcl_param_decl fcl_bwd_decls[FCL_BWD_COUNT] = {
    {"bc", "bwd_dkdv: key rows per work-group (Bc). Rule: the local-memory rule (src/portable/bwd_plan.c)", 8, 128, 8,
     FCL_CAND(16, 32, 48, 64)},
    {"br", "bwd_dkdv: query rows per tile (Br). Rule: the local-memory rule", 8, 128, 8, FCL_CAND(16, 32, 48, 64)},
    {"threads", "bwd_dkdv: work-items per work-group. Rule: from the tile and the device", 1, 1024, 1,
     FCL_CAND(64, 128, 256)},
    {"dq_bc", "bwd_dq: key rows per tile. Rule: bc", 8, 128, 8, FCL_CAND(16, 32, 48, 64)},
    {"dq_br", "bwd_dq: query rows per work-group. Rule: br", 8, 128, 8, FCL_CAND(16, 32, 48, 64)},
    {"dq_threads", "bwd_dq: work-items per work-group. Rule: threads", 1, 1024, 1, FCL_CAND(64, 128, 256)},
    {"warp", "warp-tiled mappings with padded score rows. Rule: 0", FCL_BOOL},
    {"split", "work-group halves, one product each (-DBWD_SPLIT). Rule: 0", FCL_BOOL},
    {"unroll", "inner loops unrolled fully (-DBWD_UNROLL). Rule: 0", FCL_BOOL},
    {"ftz", "build with -cl-denorms-are-zero. Rule: 0", FCL_BOOL},
    {"ahead", "read the next tile into registers ahead of use (-DBWD_AHEAD). Rule: 0", FCL_BOOL},
    {"red", "atomic dQ through red.global.add.v4.f32 (inline PTX, sm_90). Rule: 1 where available", FCL_BOOL},
    {"shfl", "phase A halves as warp halves swapping S and dP by shfl.sync (inline PTX). Rule: 0", FCL_BOOL},
    {"nbar", "the dP half makes dS behind a named barrier (inline PTX). Rule: 0", FCL_BOOL},
    {"concurrent", "deterministic dQ on a second queue beside dK/dV. Rule: 1 on GPUs", FCL_BOOL},
};

static const fcl_param_decl fcl_mma_fwd_decls[FCL_MMAF_COUNT] = {
    {"nwarps", "warps per work-group. Rule: 4 (8 past d = 128)", 1, 16, 1, FCL_CAND(4, 8)},
    {"m_tiles", "16-row m-tiles per warp. Rule: 2 (1 past d = 128)", 1, 4, 1, FCL_CAND(1, 2)},
    {"block_c", "keys per tile. Rule: 64 (d <= 64), 48 (64 < d < 128), 32", 16, 128, 16, FCL_CAND(32, 48, 64)},
    {"q_in_smem", "Q re-read from local memory rather than kept in registers. Rule: 1 at 64 < d <= 128", FCL_BOOL},
    {"kv_stages", "K | V stages in local memory. Rule: 2 where they fit, else 1", 1, 3, 1, FCL_CAND(1, 2)},
};

static const fcl_param_decl fcl_mma_bwd_decls[FCL_MMAB_COUNT] = {
    {"nwarps", "bwd_dkdv_mma warps (16 keys each). Rule: the first fitting entry of the built-in lists", 1, 16, 1,
     FCL_CAND(4, 8)},
    {"block_r", "bwd_dkdv_mma query rows per tile", 32, 256, 32, FCL_CAND(32, 64)},
    {"m_tiles", "bwd_dq_mma 16-row m-tiles per warp", 1, 4, 1, FCL_CAND(1, 2)},
    {"block_c", "bwd_dq_mma keys per tile", 16, 128, 16, FCL_CAND(32, 64)},
    {"qbuf", "Q/dO buffers of bwd_dkdv_mma (2: the next tile's copy under the math)", 1, 2, 1, FCL_CAND(1, 2)},
    {"vec_red", "atomic dQ adds in pairs (red.global.add.v2.f32, sm_90)", FCL_BOOL},
    {"v_in_smem", "V in local memory rather than registers", FCL_BOOL},
    {"dq_splits", "deterministic dQ: split accumulators of bwd_dkdv_mma (0: the separate dQ kernel). Rule: "
                  "src/nvidia/mma_bwd_plan.c",
     0, 256, 1, FCL_CAND(0, 2, 4, 8)},
    {"kv_parts", "bwd_dkdv_mma warps per 16-key slice, each accumulating its share of dK's and dV's columns. "
                 "Rule: 1 up to d = 128, 2 past it",
     1, 2, 1, FCL_CAND(1, 2)},
    {"wgmma", "1: the Hopper dK/dV kernel (bwd_dkdv_wgmma) where it covers the problem; 0: bwd_dkdv_mma. Rule: 1",
     FCL_BOOL},
    {"bulk_dq", "bwd_dkdv_wgmma's atomic dQ: 1 one bulk reduction per staged row (local memory past the first "
                "probe's budget), 0 red.global per element pair. Rule: 1 where it fits",
     FCL_BOOL},
    {"dq_nwg", "bwd_dq_wgmma warpgroups (64 queries each; at most 2 past d = 128). Rule: 3 where it fits, else 2",
     1, 3, 1, FCL_CAND(1, 2, 3)},
    {"dq_block_c", "bwd_dq_wgmma keys per K/V tile: 32, 64 or 128 (128 with at most 2 warpgroups, at most 64 past "
                   "d = 128). Rule: 64, past d = 192 32 (2 x 64 do not fit)",
     32, 128, 32, FCL_CAND(32, 64, 128)},
    {"atomic_dq", "a call with backward.deterministic = false: 1 accumulates dQ with atomics; 0 runs the "
                  "deterministic dQ kernels (the same bits every run). Rule: 1 at d <= 64, at 104 <= d <= 128 "
                  "and off Hopper, else 0 (src/nvidia/mma_bwd_plan.c)",
     FCL_BOOL},
};

static const fcl_param_decl fcl_wgmma_decls[FCL_WG_COUNT] = {
    {"use", "1: the wgmma kernel where it covers the problem; 0: mma.sync. Rule: 1", FCL_BOOL},
    {"nwg", "warpgroups (64 query rows each). Rule: 3 (2 past d = 128)", 1, 4, 1, FCL_CAND(2, 3)},
    {"block_c", "keys per tile: 64, 96, 112 or 128. Rule: the widest that fits the local memory and the registers",
     64, 128, 16,
     FCL_CAND(64, 96, 112, 128)},
    {"stages", "K/V buffers: 2 (a work-group barrier per tile) or 3-4 (mbarriers; warpgroups drift apart). "
               "Rule: 3 with 3 warpgroups, else 2",
     2, 4, 1, FCL_CAND(2, 3, 4)},
};

static const fcl_param_decl fcl_decode_decls[FCL_DEC_P_COUNT] = {
    {"kpt", "keys per work-item per tile (portable and cp.async kernels). Rule: 2, halved to fit", 1, 8, 1,
     FCL_CAND(1, 2, 4)},
    {"prefetch", "prefetch the next K values into registers. Rule: 1", FCL_BOOL},
    {"wg_per_cu", "work-groups per compute unit the split count aims at. Rule: 4 (2 on cp.async)", 1, 16, 1,
     FCL_CAND(1, 2, 4, 8)},
    {"threads", "work-items per work-group before the fit to the head dim. Rule: 128", 32, 256, 32,
     FCL_CAND(64, 128, 256)},
    {"max_rows", "query rows per work-group at most. Rule: 8", 1, 8, 1, FCL_CAND(2, 4, 8)},
    {"stages", "cp.async stages (NVIDIA, 16-bit caches); 0: the register path. Rule: 3", 0, 4, 1, FCL_CAND(0, 2, 3)},
    {"min_keys", "keys per split at least (portable and cp.async kernels). Rule: 256", 16, 8192, 16,
     FCL_CAND(64, 128, 256, 512)},
    {"mma_min_rows", "query rows from which the tensor-core decode runs (0: never). Rule: 1", 0, 64, 1,
     FCL_CAND(0, 1)},
    {"mma_wg_per_cu",
     "tensor-core decode: work-groups per compute unit. Rule: 4 (2 at 33-48 rows, 8 with a quantized cache)", 1, 16,
     1, FCL_CAND(2, 4, 8)},
    {"mma_wk", "tensor-core decode: warps per m-tile (key slices). Rule: 1 (2 at 33-48 rows)", 1, 4, 1,
     FCL_CAND(1, 2, 4)},
    {"mma_stages", "tensor-core decode: K | V stages. Rule: 2 (3 at d = 64 or 64 rows)", 2, 4, 1, FCL_CAND(2, 3)},
    {"mma_min_keys", "tensor-core decode: keys per split at least. Rule: 64", 16, 8192, 16,
     FCL_CAND(32, 64, 128, 256)},
    {"merge", "split partials merged by 0: a second kernel (decode_merge); 1: the attention kernel's own "
              "work-groups, in the same launch (calls on the context's scratch). Rule: 0",
     FCL_BOOL},
    {"map", "1: the CPU kernel (cl/decode/decode_cpu.cl: one work-item owns a row block); 0: the GPU "
            "mapping. Rule: 1 on non-GPU devices unless merge = 1 (which only the GPU mapping runs)",
     FCL_BOOL},
    {"cpu_block_c", "CPU kernel (map = 1): keys per tile. Rule: 64, halved while the K and V tiles pass "
                    "min(local memory, 64 KiB)",
     8, 256, 8, FCL_CAND(16, 32, 64, 128)},
    {"cpu_rows", "CPU kernel (map = 1): rows per work-group at most, a multiple of 4. Rule: 64, fewer where its "
                 "Q, S and O rows would pass 256 KiB of private memory",
     4, 64, 4, FCL_CAND(8, 16, 32, 64)},
};

static const fcl_param_decl fcl_device_decls[FCL_DEV_COUNT] = {
    {"local_mem", "plan tiles as if the device reported this many bytes of local memory (testing aid; at least "
                  "1024 and below the device's figure). Rule: the device's figure",
     1024, 1 << 30, 1, FCL_NOCAND},
    {"local_probe", "probe for more local memory than the device reports (NVIDIA). Rule: 1", FCL_BOOL},
    {"binary_cache", "keep compiled programs in <cache dir>/programs (0: leave it to the driver's own cache, where "
                     "fetching a binary costs more than it saves). Rule: 1",
     0, 1, 1, FCL_NOCAND},
};

static const char *const fcl_family_names[FLASHCL_TUNE_FAMILY_COUNT] = {"fwd",       "bwd",    "mma_fwd", "mma_bwd",
                                                                       "wgmma_fwd", "decode", "context"};

const fcl_param_decl *fcl_tuning_decls(flashcl_tuning_family family, int *count) {
  static const struct {
    const fcl_param_decl *d;
    int n;
  } t[FLASHCL_TUNE_FAMILY_COUNT] = {{fcl_fwd_decls, FCL_FWD_COUNT},     {fcl_bwd_decls, FCL_BWD_COUNT},
                                    {fcl_mma_fwd_decls, FCL_MMAF_COUNT}, {fcl_mma_bwd_decls, FCL_MMAB_COUNT},
                                    {fcl_wgmma_decls, FCL_WG_COUNT},     {fcl_decode_decls, FCL_DEC_P_COUNT},
                                    {fcl_device_decls, FCL_DEV_COUNT}};
  if ((int)family < 0 || (int)family >= FLASHCL_TUNE_FAMILY_COUNT) return NULL;
  *count = t[family].n;
  return t[family].d;
}

int fcl_tuning_index(flashcl_tuning_family family, const char *name) {
  int n = 0;
  const fcl_param_decl *d = fcl_tuning_decls(family, &n);
  for (int i = 0; d && name && i < n; i++)
    if (!strcmp(d[i].name, name)) return i;
  return -1;
}

int fcl_tuning_legal(const fcl_param_decl *d, int value) {
  return value >= d->min && value <= d->max && (value - d->min) % d->step == 0;
}

const char *flashcl_tuning_family_name(flashcl_tuning_family family) {
  if (family == FLASHCL_TUNE_NONE) return "none";
  if ((int)family < 0 || (int)family >= FLASHCL_TUNE_FAMILY_COUNT) return "?";
  return fcl_family_names[family];
}

flashcl_status flashcl_tuning_family_parse(const char *name, flashcl_tuning_family *family) {
  if (!name || !family) return FLASHCL_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < FLASHCL_TUNE_FAMILY_COUNT; i++)
    if (!strcmp(name, fcl_family_names[i])) {
      *family = (flashcl_tuning_family)i;
      return FLASHCL_SUCCESS;
    }
  return FLASHCL_ERROR_INVALID_ARGUMENT;
}

const char *flashcl_tuning_source_name(flashcl_tuning_source source) {
  static const char *const names[] = {"default rules", "built-in database", "installed file", "user cache file",
                                      "tuning file",   "call"};
  if ((int)source < 0 || (int)source > FLASHCL_TUNING_SOURCE_CALL) return "?";
  return names[source];
}

flashcl_status flashcl_tuning_space(flashcl_tuning_family family, int index, flashcl_tuning_param_info *info) {
  int n = 0;
  const fcl_param_decl *d = fcl_tuning_decls(family, &n);
  if (!d || !info || index < 0 || index >= n) return FLASHCL_ERROR_INVALID_ARGUMENT;
  info->name = d[index].name;
  info->description = d[index].description;
  info->min = d[index].min;
  info->max = d[index].max;
  info->step = d[index].step;
  info->candidates = d[index].cand;
  info->num_candidates = d[index].ncand;
  return FLASHCL_SUCCESS;
}

void flashcl_tuning_init(flashcl_tuning *tuning, flashcl_tuning_family family) {
  if (!tuning) return;
  memset(tuning, 0, sizeof *tuning);
  tuning->family = family;
}

static flashcl_status fcl_tuning_set_locked(flashcl_context *ctx, flashcl_tuning *t, const char *name, int value) {
  if (!t || !name) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "tuning and name must be non-NULL");
  int n = 0;
  const fcl_param_decl *d = fcl_tuning_decls(t->family, &n);
  if (!d) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "unknown tuning family %d", (int)t->family);
  const int i = fcl_tuning_index(t->family, name);
  if (i < 0)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "the %s family has no parameter \"%s\" (flashcl-tune "
                    "--list shows the spaces)", flashcl_tuning_family_name(t->family), name);
  if (!fcl_tuning_legal(&d[i], value))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s.%s = %d is outside its legal values (%d..%d, step %d)",
                    flashcl_tuning_family_name(t->family), name, value, d[i].min, d[i].max, d[i].step);
  for (int k = 0; k < t->count; k++)
    if (!strcmp(t->params[k].name, name)) {
      t->params[k].value = value;
      return FLASHCL_SUCCESS;
    }
  if (t->count < 0 || t->count >= FLASHCL_TUNING_MAX_PARAMS)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "tuning holds %d parameters already", t->count);
  snprintf(t->params[t->count].name, sizeof t->params[t->count].name, "%s", name);
  t->params[t->count].value = value;
  t->count++;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_tuning_set(flashcl_context *ctx, flashcl_tuning *t, const char *name, int value) {
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_tuning_set_locked(ctx, t, name, value));
}

flashcl_status flashcl_tuning_get(const flashcl_tuning *t, const char *name, int *value) {
  if (!t || !name || !value || t->count < 0 || t->count > FLASHCL_TUNING_MAX_PARAMS)
    return FLASHCL_ERROR_INVALID_ARGUMENT;
  for (int k = 0; k < t->count; k++)
    if (!strncmp(t->params[k].name, name, sizeof t->params[k].name)) {
      *value = t->params[k].value;
      return FLASHCL_SUCCESS;
    }
  return FLASHCL_ERROR_INVALID_ARGUMENT;
}

/* Parses "name=value" words from s into t (all or nothing: t is a copy). */
static flashcl_status fcl_tuning_parse_params(flashcl_context *ctx, const char *s, flashcl_tuning *t) {
  flashcl_tuning w = *t;
  while (*s) {
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) break;
    char name[FLASHCL_TUNING_NAME_CAP];
    size_t len = strcspn(s, "= \t");
    if (s[len] != '=' || len == 0 || len >= sizeof name)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "expected name=value at \"%.40s\"", s);
    memcpy(name, s, len);
    name[len] = '\0';
    char *end = NULL;
    const long v = strtol(s + len + 1, &end, 10);
    if (end == s + len + 1 || (*end && *end != ' ' && *end != '\t') || v < -2147483647L || v > 2147483647L)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s: the value is not an integer", name);
    flashcl_status st = fcl_tuning_set_locked(ctx, &w, name, (int)v);
    if (st != FLASHCL_SUCCESS) return st;
    s = end;
  }
  *t = w;
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_tuning_parse_locked(flashcl_context *ctx, const char *text, flashcl_tuning *tuning) {
  if (!text || !tuning) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "text and tuning must be non-NULL");
  while (*text == ' ' || *text == '\t') text++;
  char fam[16];
  const size_t len = strcspn(text, " \t:");
  if (len == 0 || len >= sizeof fam)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "a tuning starts with its family (fwd, bwd, ...)");
  memcpy(fam, text, len);
  fam[len] = '\0';
  flashcl_tuning t;
  flashcl_tuning_family f;
  if (flashcl_tuning_family_parse(fam, &f) != FLASHCL_SUCCESS)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "unknown tuning family \"%s\"", fam);
  flashcl_tuning_init(&t, f);
  const char *rest = text + len;
  while (*rest == ' ' || *rest == '\t' || *rest == ':') rest++;
  flashcl_status st = fcl_tuning_parse_params(ctx, rest, &t);
  if (st == FLASHCL_SUCCESS) *tuning = t;
  return st;
}

flashcl_status flashcl_tuning_parse(flashcl_context *ctx, const char *text, flashcl_tuning *tuning) {
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_tuning_parse_locked(ctx, text, tuning));
}

flashcl_status flashcl_tuning_format(const flashcl_tuning *t, char *buf, size_t cap) {
  if (!t || !buf || t->count < 0 || t->count > FLASHCL_TUNING_MAX_PARAMS) return FLASHCL_ERROR_INVALID_ARGUMENT;
  size_t used = (size_t)snprintf(buf, cap, "%s", flashcl_tuning_family_name(t->family));
  for (int k = 0; k < t->count && used < cap; k++)
    used += (size_t)snprintf(buf + used, cap - used, " %.*s=%d", FLASHCL_TUNING_NAME_CAP, t->params[k].name,
                             t->params[k].value);
  if (used >= cap) {
    if (cap) buf[0] = '\0';
    return FLASHCL_ERROR_BUFFER_TOO_SMALL;
  }
  return FLASHCL_SUCCESS;
}

void fcl_tuned_report(const fcl_tuned *t, flashcl_config *c) {
  int n = 0;
  const fcl_param_decl *d = fcl_tuning_decls(t->family, &n);
  c->family = t->family;
  c->source = t->source;
  snprintf(c->origin, sizeof c->origin, "%s", t->origin);
  flashcl_tuning_init(&c->tuning, t->family);
  for (int i = 0; d && i < n && i < FLASHCL_TUNING_MAX_PARAMS; i++) {
    snprintf(c->tuning.params[i].name, sizeof c->tuning.params[i].name, "%s", d[i].name);
    c->tuning.params[i].value = t->ran[i];
    c->tuning.count = i + 1;
  }
  flashcl_tuning_init(&c->set, t->family);
  for (int i = 0; d && i < n && c->set.count < FLASHCL_TUNING_MAX_PARAMS; i++)
    if (t->set[i]) {
      snprintf(c->set.params[c->set.count].name, sizeof c->set.params[0].name, "%s", d[i].name);
      c->set.params[c->set.count++].value = t->val[i];
    }
}

flashcl_status fcl_tuning_call_family(flashcl_context *ctx, const flashcl_tuning *call, flashcl_pass pass,
                                      int decode, flashcl_tuning_family *family) {
  *family = FLASHCL_TUNE_NONE;
  if (!call) return FLASHCL_SUCCESS;
  const flashcl_tuning_family f = call->family;
  int ok;
  if (decode) ok = f == FLASHCL_TUNE_DECODE;
  else if (pass == FLASHCL_PASS_FORWARD) ok = f == FLASHCL_TUNE_FWD || f == FLASHCL_TUNE_MMA_FWD || f == FLASHCL_TUNE_WGMMA_FWD;
  else ok = f == FLASHCL_TUNE_BWD || f == FLASHCL_TUNE_MMA_BWD;
  if (!ok || call->count < 0 || call->count > FLASHCL_TUNING_MAX_PARAMS)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "%s is for the %s family, which does not run %s",
                    decode ? "desc.tuning" : "desc.algorithm.tuning", flashcl_tuning_family_name(f),
                    decode ? "decode" : pass == FLASHCL_PASS_FORWARD ? "the forward pass" : "the backward pass");
  for (int k = 0; k < call->count; k++) {
    const int i = fcl_tuning_index(f, call->params[k].name);
    int n = 0;
    const fcl_param_decl *d = fcl_tuning_decls(f, &n);
    if (i < 0 || !fcl_tuning_legal(&d[i], call->params[k].value))
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "%s: %s.%.*s = %d is not a declared legal value",
                      decode ? "desc.tuning" : "desc.algorithm.tuning", flashcl_tuning_family_name(f), FLASHCL_TUNING_NAME_CAP, call->params[k].name,
                      call->params[k].value);
  }
  *family = f;
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_tuned_blocks(flashcl_context *ctx, fcl_tuned *t, int block_r, int block_c) {
  if (!block_r && !block_c) return FLASHCL_SUCCESS;
  if (block_r < 0 || block_c < 0 || block_r % 8 || block_c % 8)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "block sizes must be 0 or multiples of 8 (got %d, %d)",
                    block_r, block_c);
  const int br = t->family == FLASHCL_TUNE_FWD ? FCL_FWD_BR : FCL_BWD_BR;
  const int bc = t->family == FLASHCL_TUNE_FWD ? FCL_FWD_BC : FCL_BWD_BC;
  if (block_r) t->set[br] = t->call[br] = 1, t->val[br] = block_r;
  if (block_c) t->set[bc] = t->call[bc] = 1, t->val[bc] = block_c;
  t->source = FLASHCL_TUNING_SOURCE_CALL;
  snprintf(t->origin + strlen(t->origin), sizeof t->origin - strlen(t->origin), " + desc.algorithm.block_r/block_c");
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_tuned_honoured(flashcl_context *ctx, const fcl_tuned *t) {
  int n = 0;
  const fcl_param_decl *d = fcl_tuning_decls(t->family, &n);
  for (int i = 0; d && i < n; i++)
    if (t->call[i] && t->ran[i] != t->val[i])
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "the call's tuning: %s.%s = %d cannot run here (it would run as %d: "
                      "it does not fit this device or problem, or its kernel does not run)",
                      flashcl_tuning_family_name(t->family), d[i].name, t->val[i], t->ran[i]);
  return FLASHCL_SUCCESS;
}
