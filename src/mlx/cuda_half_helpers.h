// Device code our CUDA kernels share (compiled by cuda_jit ahead of each kernel's own header):
// reading, rounding and storing the half types as float.
#pragma once

namespace mlex {

inline constexpr const char* kCudaHalfHelpers = R"(
__device__ __forceinline__ float mlex_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float mlex_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float mlex_float(float v) { return v; }
// v rounded to the activation type and back (the rounding of an op whose output is T).
__device__ __forceinline__ float mlex_round(float v, const __nv_bfloat16*) { return __bfloat162float(__float2bfloat16(v)); }
__device__ __forceinline__ float mlex_round(float v, const __half*) { return __half2float(__float2half(v)); }
__device__ __forceinline__ void mlex_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void mlex_store(__half* p, float v) { *p = __float2half(v); }
__device__ __forceinline__ void mlex_store(float* p, float v) { *p = v; }
)";

}  // namespace mlex
