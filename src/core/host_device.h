// VIT_HOST_DEVICE: plain data helpers in core/ that the CPU ops and the CUDA kernels share
// (one definition, so both backends compute the same thing).
#pragma once

#if defined(__CUDACC__)
#define VIT_HOST_DEVICE __host__ __device__
#else
#define VIT_HOST_DEVICE
#endif
