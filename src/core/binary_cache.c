/* The on-disk cache of compiled programs: <cache_dir>/programs/<key>.bin,
 * kept under a size limit by src/core/cache_trim.c.
 *
 * Building a kernel from source costs from a fraction of a second to tens of
 * seconds per program, on every context creation; the cache keeps the device's
 * binary (CL_PROGRAM_BINARIES) so that later contexts, in this process or
 * another, only load it. It is an optimisation and nothing more: a missing,
 * unreadable, truncated, corrupt or stale entry, or one the driver refuses, is
 * rebuilt from source and rewritten; a write that fails is dropped. Neither
 * ever fails the caller, and neither prints unless the context is verbose.
 *
 * The key hashes everything that decides the binary: the platform, device and
 * driver, flashcl's version, the full text of every source part (so an edited
 * kernel or another FLASHCL_KERNEL_DIR misses), the build options, and the
 * route (the sm_90a retargeting). Entries are written to a private temporary
 * name and renamed into place, so that readers, and writers in other processes,
 * only ever see whole entries.
 *
 * Entry format, all integers little-endian:
 *   0  "FLCLBIN1"          magic
 *   8  u32 format version  FCL_CACHE_FORMAT
 *  12  u32 header bytes    FCL_CACHE_HEADER (48)
 *  16  u64 key[0], u64 key[1]
 *  32  u64 payload bytes   the length of the rest of the file
 *  40  u64 payload hash    fcl_cache_checksum of the key and the payload
 *  48  payload             the program binary, as CL_PROGRAM_BINARIES gave it
 */
#define _POSIX_C_SOURCE 200809L
#include "core/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef _WIN32
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#endif

#define FCL_CACHE_MAGIC "FLCLBIN1"
#define FCL_CACHE_FORMAT 1u
#define FCL_CACHE_HEADER 48u
/* Past this an entry is taken for garbage rather than allocated: no program
 * binary of these kernels comes near it. */
#define FCL_CACHE_MAX_PAYLOAD ((uint64_t)1 << 30)

/* ------------------------------------------------------------- hashing -- */

/* Two lanes that share no constants or structure: FNV-1a, and a
 * multiply-add with a shift feedback. A collision must happen in both at once,
 * and the final mix spreads every input bit over all 128 output bits. */
typedef struct fcl_hasher {
  uint64_t a, b;
} fcl_hasher;

static void fcl_hash_init(fcl_hasher *h, uint64_t seed) {
  h->a = 0xcbf29ce484222325ull ^ seed;
  h->b = 0x6a09e667f3bcc909ull + seed;
}

static void fcl_hash_bytes(fcl_hasher *h, const void *data, size_t n) {
  const unsigned char *p = data;
  uint64_t a = h->a, b = h->b;
  for (size_t i = 0; i < n; i++) {
    a = (a ^ p[i]) * 0x100000001b3ull;
    b = (b + p[i] + 0x51ull) * 0x9e3779b97f4a7c15ull;
    b ^= b >> 29;
  }
  h->a = a;
  h->b = b;
}

static void fcl_put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t fcl_get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* A field is its length, then its bytes: otherwise ("ab", "c") and ("a", "bc")
 * would hash alike. */
static void fcl_hash_field(fcl_hasher *h, const void *data, size_t n) {
  unsigned char len[8];
  fcl_put_u64(len, (uint64_t)n);
  fcl_hash_bytes(h, len, sizeof len);
  fcl_hash_bytes(h, data, n);
}

static void fcl_hash_str(fcl_hasher *h, const char *s) { fcl_hash_field(h, s ? s : "", s ? strlen(s) : 0); }

static uint64_t fcl_avalanche(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

/* Invertible in (a, b), so the two lanes' 128 bits all survive. */
static void fcl_hash_final(const fcl_hasher *h, uint64_t out[2]) {
  out[0] = fcl_avalanche(h->a ^ ((h->b << 23) | (h->b >> 41)));
  out[1] = fcl_avalanche(h->b + out[0]);
}

/* The payload's checksum, bound to the key: a payload grafted from another
 * entry, header and all, must not pass as this key's program. */
static uint64_t fcl_cache_checksum(const fcl_cache_key *key, const unsigned char *data, size_t n) {
  fcl_hasher h;
  uint64_t out[2];
  unsigned char kb[16];
  fcl_put_u64(kb, key->h[0]);
  fcl_put_u64(kb + 8, key->h[1]);
  fcl_hash_init(&h, 0x636b73756dull);
  fcl_hash_field(&h, kb, sizeof kb);
  fcl_hash_field(&h, data, n);
  fcl_hash_final(&h, out);
  return out[0] ^ out[1];
}

/* A platform or device string, whole (flashcl_device_info truncates). */
static void fcl_hash_cl_string(fcl_hasher *h, flashcl_context *ctx, int platform, cl_uint param) {
  size_t n = 0;
  cl_int err = platform ? clGetPlatformInfo(ctx->platform, param, 0, NULL, &n)
                        : clGetDeviceInfo(ctx->device, param, 0, NULL, &n);
  char *s = err == CL_SUCCESS && n ? malloc(n + 1) : NULL;
  if (s) {
    err = platform ? clGetPlatformInfo(ctx->platform, param, n, s, NULL)
                   : clGetDeviceInfo(ctx->device, param, n, s, NULL);
    s[err == CL_SUCCESS ? n : 0] = '\0';
  }
  fcl_hash_str(h, s ? s : "?");
  free(s);
}

void fcl_cache_key_make(flashcl_context *ctx, const char *const *text, const size_t *size, unsigned parts,
                        const char *options, const char *route, fcl_cache_key *key) {
  fcl_hasher h;
  fcl_hash_init(&h, 0);
  fcl_hash_str(&h, "flashcl program cache " FLASHCL_VERSION_STRING);
  fcl_hash_cl_string(&h, ctx, 1, CL_PLATFORM_NAME);
  fcl_hash_cl_string(&h, ctx, 1, CL_PLATFORM_VERSION);
  fcl_hash_cl_string(&h, ctx, 0, CL_DEVICE_NAME);
  fcl_hash_cl_string(&h, ctx, 0, CL_DRIVER_VERSION);
  fcl_hash_cl_string(&h, ctx, 0, CL_DEVICE_VERSION);
  char count[16];
  snprintf(count, sizeof count, "%u", parts);
  fcl_hash_str(&h, count);
  for (unsigned i = 0; i < parts; i++) fcl_hash_field(&h, text[i], size[i]);
  fcl_hash_str(&h, options);
  fcl_hash_str(&h, route);
  fcl_hash_final(&h, key->h);
}

int fcl_cache_enabled(const flashcl_context *ctx) {
#ifdef _WIN32
  return 0; /* no POSIX rename/mkdir semantics relied on below */
#else
  return ctx->binary_cache && ctx->cache_dir && ctx->cache_dir[0];
#endif
}

#ifndef _WIN32

/* ------------------------------------------------------------- reading -- */

/* The entry's path; 0 when it does not fit, so that a cut name can never
 * point somewhere else. */
static int fcl_cache_path(const flashcl_context *ctx, const fcl_cache_key *key, char *buf, size_t cap) {
  const int n = snprintf(buf, cap, "%s/programs/%016llx%016llx.bin", ctx->cache_dir, (unsigned long long)key->h[0],
                         (unsigned long long)key->h[1]);
  return n > 0 && (size_t)n < cap;
}

/* Checks a header against the key; the reason it fails, or NULL. */
static const char *fcl_cache_check_header(const unsigned char *hd, const fcl_cache_key *key, uint64_t file_bytes) {
  if (memcmp(hd, FCL_CACHE_MAGIC, 8) != 0) return "bad magic";
  const uint64_t word = fcl_get_u64(hd + 8);
  if ((uint32_t)word != FCL_CACHE_FORMAT || (uint32_t)(word >> 32) != FCL_CACHE_HEADER) return "other format version";
  if (fcl_get_u64(hd + 16) != key->h[0] || fcl_get_u64(hd + 24) != key->h[1]) return "key mismatch";
  const uint64_t len = fcl_get_u64(hd + 32);
  if (len == 0 || len > FCL_CACHE_MAX_PAYLOAD) return "bad payload length";
  if (file_bytes < FCL_CACHE_HEADER || len != file_bytes - FCL_CACHE_HEADER) return "payload length does not match the file size";
  return NULL;
}

/* The verified payload of an entry (malloc'ed), or NULL: with *why NULL when
 * there is no entry (a plain miss), else the reason it is rejected. */
static unsigned char *fcl_cache_read(const char *path, const fcl_cache_key *key, size_t *len, const char **why) {
  *why = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (errno != ENOENT) *why = "cannot open";
    return NULL;
  }
  unsigned char hd[FCL_CACHE_HEADER];
  unsigned char *payload = NULL;
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) *why = "not a regular file";
  else if (fread(hd, 1, sizeof hd, f) != sizeof hd) *why = "shorter than its header";
  else *why = fcl_cache_check_header(hd, key, (uint64_t)sb.st_size);
  if (!*why) {
    *len = (size_t)fcl_get_u64(hd + 32);
    /* One byte more, zeroed: NVIDIA's binaries are PTX text, and a driver
     * that reads them as a C string must stop inside our buffer. */
    payload = malloc(*len + 1);
    if (payload) payload[*len] = 0;
    if (!payload) *why = "out of host memory";
    else if (fread(payload, 1, *len, f) != *len) *why = "truncated payload";
    else if (fcl_cache_checksum(key, payload, *len) != fcl_get_u64(hd + 40)) *why = "payload checksum mismatch";
  }
  fclose(f);
  if (*why) {
    free(payload);
    return NULL;
  }
  return payload;
}

/* Creates a program from a loaded binary and builds it; NULL with the reason
 * when the driver refuses it (another driver's format, a corrupt binary that
 * passed the checksum because it was written corrupt). */
static cl_program fcl_cache_program(flashcl_context *ctx, const unsigned char *bin, size_t len, const char *options,
                                    char *reason, size_t cap) {
  cl_int err = CL_SUCCESS, bin_status = CL_SUCCESS;
  cl_program prog = clCreateProgramWithBinary(ctx->context, 1, &ctx->device, &len, &bin, &bin_status, &err);
  if (err != CL_SUCCESS || bin_status != CL_SUCCESS) {
    snprintf(reason, cap, "clCreateProgramWithBinary: %s", fcl_cl_error_name(err != CL_SUCCESS ? err : bin_status));
    if (prog) clReleaseProgram(prog);
    return NULL;
  }
  err = clBuildProgram(prog, 1, &ctx->device, options, NULL, NULL);
  cl_uint nkernels = 0;
  if (err == CL_SUCCESS) {
    size_t n = 0;
    err = clGetProgramInfo(prog, CL_PROGRAM_NUM_KERNELS, sizeof n, &n, NULL);
    nkernels = (cl_uint)n;
  }
  if (err != CL_SUCCESS || nkernels == 0) {
    snprintf(reason, cap, "building the binary: %s", err != CL_SUCCESS ? fcl_cl_error_name(err) : "no kernels");
    clReleaseProgram(prog);
    return NULL;
  }
  return prog;
}

cl_program fcl_cache_load(flashcl_context *ctx, const fcl_cache_key *key, const char *files, const char *options) {
  char path[4096];
  if (!fcl_cache_enabled(ctx) || !fcl_cache_path(ctx, key, path, sizeof path)) return NULL;
  size_t len = 0;
  const char *why = NULL;
  char reason[96];
  unsigned char *bin = fcl_cache_read(path, key, &len, &why);
  cl_program prog = bin ? fcl_cache_program(ctx, bin, len, options, reason, sizeof reason) : NULL;
  if (bin && !prog) why = reason;
  free(bin);
  if (prog) {
    fcl_cache_touch(path);
    ctx->stats.programs_from_cache++;
    fcl_log(ctx, "loaded %s from %s", files, path);
  } else if (why) {
    ctx->stats.cache_rejected++;
    fcl_log(ctx, "cache entry %s for %s rejected (%s): building from source", path, files, why);
  }
  return prog;
}

/* ------------------------------------------------------------- writing -- */

/* mkdir -p: the directories it creates are private to the user (0700), as
 * befits a cache under $HOME; existing ones are left as they are. */
static int fcl_mkdirs(const char *dir) {
  char *p = fcl_strdup(dir);
  if (!p) return -1;
  int ok = 1;
  for (char *s = p + 1; ok; s++) {
    if (*s != '/' && *s != '\0') continue;
    const char c = *s;
    *s = '\0';
    /* An existing directory may still answer EACCES or EROFS, not EEXIST. */
    struct stat sb;
    if (mkdir(p, 0700) != 0 && errno != EEXIST && (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))) ok = 0;
    *s = c;
    if (c == '\0') break;
  }
  struct stat sb;
  if (ok && (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))) ok = 0;
  free(p);
  return ok ? 0 : -1;
}

/* The program's binary for the context's device (malloc'ed), or NULL. The
 * program may span more devices than the context's (a caller's cl_context):
 * only that device's binary is asked for. */
static unsigned char *fcl_program_binary(const flashcl_context *ctx, cl_program prog, size_t *len) {
  cl_uint ndev = 0;
  if (clGetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof ndev, &ndev, NULL) != CL_SUCCESS || ndev == 0) return NULL;
  cl_device_id *devs = malloc(ndev * sizeof *devs);
  size_t *sizes = malloc(ndev * sizeof *sizes);
  unsigned char **bins = calloc(ndev, sizeof *bins);
  unsigned char *out = NULL;
  cl_uint at = ndev;
  if (devs && sizes && bins && clGetProgramInfo(prog, CL_PROGRAM_DEVICES, ndev * sizeof *devs, devs, NULL) == CL_SUCCESS &&
      clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, ndev * sizeof *sizes, sizes, NULL) == CL_SUCCESS) {
    for (cl_uint i = 0; i < ndev; i++)
      if (devs[i] == ctx->device) at = i;
  }
  if (at < ndev && sizes[at] > 0 && (uint64_t)sizes[at] <= FCL_CACHE_MAX_PAYLOAD) {
    /* NULL entries: "skip this device" (OpenCL 1.2, CL_PROGRAM_BINARIES). */
    bins[at] = malloc(sizes[at]);
    if (bins[at] && clGetProgramInfo(prog, CL_PROGRAM_BINARIES, ndev * sizeof *bins, bins, NULL) == CL_SUCCESS) {
      out = bins[at];
      *len = sizes[at];
    } else {
      free(bins[at]);
    }
  }
  free(devs);
  free(sizes);
  free(bins);
  return out;
}

/* Writes the entry to a new temporary file beside path and renames it onto
 * path. O_EXCL makes the temporary name ours even when two contexts of one
 * process, or a stale file of a dead process with our pid, picked it too.
 * No fsync: a torn entry after a crash fails its checksum and is rebuilt. */
static int fcl_cache_write(flashcl_context *ctx, const char *path, const unsigned char *hd, const unsigned char *bin,
                           size_t len) {
  char tmp[4200];
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 16; tries++) {
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), ctx->cache_seq++);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST) return -1;
  }
  if (fd < 0) return -1;
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    close(fd);
    unlink(tmp);
    return -1;
  }
  int ok = fwrite(hd, 1, FCL_CACHE_HEADER, f) == FCL_CACHE_HEADER && fwrite(bin, 1, len, f) == len;
  ok = fflush(f) == 0 && ok;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

void fcl_cache_store(flashcl_context *ctx, const fcl_cache_key *key, cl_program prog, const char *files) {
  char dir[4096], path[4096];
  if (!fcl_cache_enabled(ctx) || !fcl_cache_path(ctx, key, path, sizeof path)) return;
  snprintf(dir, sizeof dir, "%s/programs", ctx->cache_dir); /* shorter than path */
  size_t len = 0;
  unsigned char *bin = fcl_program_binary(ctx, prog, &len);
  if (!bin) {
    fcl_log(ctx, "%s: the driver gave no program binary to cache", files);
    return;
  }
  unsigned char hd[FCL_CACHE_HEADER];
  memcpy(hd, FCL_CACHE_MAGIC, 8);
  fcl_put_u64(hd + 8, (uint64_t)FCL_CACHE_FORMAT | (uint64_t)FCL_CACHE_HEADER << 32);
  fcl_put_u64(hd + 16, key->h[0]);
  fcl_put_u64(hd + 24, key->h[1]);
  fcl_put_u64(hd + 32, (uint64_t)len);
  fcl_put_u64(hd + 40, fcl_cache_checksum(key, bin, len));
  if (fcl_mkdirs(dir) == 0 && fcl_cache_write(ctx, path, hd, bin, len) == 0) {
    ctx->stats.cache_written++;
    fcl_log(ctx, "cached %s as %s (%zu bytes)", files, path, len);
    fcl_cache_trim(ctx, dir, path + strlen(dir) + 1);
  } else {
    fcl_log(ctx, "could not write the cache entry %s for %s (%s): going on without it", path, files, strerror(errno));
  }
  free(bin);
}

#else /* _WIN32: the disk cache is off (fcl_cache_enabled), these never run */

cl_program fcl_cache_load(flashcl_context *ctx, const fcl_cache_key *key, const char *files, const char *options) {
  return NULL;
}

void fcl_cache_store(flashcl_context *ctx, const fcl_cache_key *key, cl_program prog, const char *files) {}

#endif
