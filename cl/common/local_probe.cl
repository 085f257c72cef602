/*
 * local_probe.cl: does the device run a work-group with LOCAL_PROBE_BYTES of
 * __local memory, and does that memory hold what is written to it?
 *
 * NVIDIA's OpenCL driver reports 48 KiB of local memory per work-group (the
 * static limit of CUDA) but builds and runs work-groups with more: an H100 SM
 * has up to 227 KiB of shared memory for one block. The host (src/core/probe.c) runs
 * this kernel once per context on such devices and, if out[] matches, plans
 * tiles against LOCAL_PROBE_BYTES instead of CL_DEVICE_LOCAL_MEM_SIZE.
 *
 * One work-group of 128 work-items fills the buffer with a hash of the index,
 * then each work-item xors a strided sample of it into out[local id]; the host
 * repeats the computation.
 *
 * Parameters (-D):
 *   LOCAL_PROBE_BYTES   bytes of __local to allocate (a multiple of 4; the default
 *                       fits OpenCL's 32 KiB minimum, so the file builds anywhere)
 */
#ifndef LOCAL_PROBE_BYTES
#define LOCAL_PROBE_BYTES 16384
#endif

__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void local_probe(__global uint *out) {
  __local uint buf[LOCAL_PROBE_BYTES / 4];
  const uint n = LOCAL_PROBE_BYTES / 4, tid = get_local_id(0);
  for (uint i = tid; i < n; i += 128) buf[i] = i * 2654435761u ^ 0x5bd1e995u;
  barrier(CLK_LOCAL_MEM_FENCE);
  uint x = 0;
  for (uint i = tid; i < n; i += 128) x ^= buf[(i * 7919u) % n] + i;
  out[tid] = x;
}
