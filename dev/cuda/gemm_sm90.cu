// Launches the wgmma GEMM (gemm_sm90_kernels.cuh): the operands' TMA tensor maps, encoded by the
// driver's cuTensorMapEncodeTiled (reached through the runtime, so nothing links libcuda), and
// the kernel's shared-memory limit, raised once per epilogue.
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>

#include "gemm_sm90.h"
#include "gemm_sm90_kernels.cuh"

namespace vit::cuda::sm90 {
namespace {

using gemm_sm90::Epilogue;
using Encode = PFN_cuTensorMapEncodeTiled_v12000;

Encode tensor_map_encoder() {
  static const Encode fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return Encode(nullptr);
    return reinterpret_cast<Encode>(f);
  }();
  return fn;
}

// A row-major (rows, cols; ld) bf16 matrix as boxes of kBK columns x box_rows rows, 128-byte
// swizzled (the layout smem_desc_k_sw128 describes); reads past its edges give zeros.
bool encode(TensorMap* map, const __nv_bfloat16* base, Index rows, Index cols, Index ld,
            int box_rows) {
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld) * sizeof(__nv_bfloat16)};
  const cuuint32_t box[2] = {cuuint32_t(gemm_sm90::kBK), cuuint32_t(box_rows)};
  const cuuint32_t steps[2] = {1, 1};
  return tensor_map_encoder()(
             map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(base), dims,
             strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

constexpr Index kIntMax = 0x7fffffff;  // the kernel's sizes and work units are ints

// Tiles of `tile` over n: the grid's extent, the K slices, the column sums' row blocks.
Index tiles(Index n, Index tile) {
  return (n + tile - 1) / tile;
}

// The device's facts, read once: whether it is a Hopper (compute capability 9.0), its SMs.
struct DeviceFacts {
  bool hopper = false;
  int multiprocessors = 0;
};
const DeviceFacts& device_facts() {
  static const DeviceFacts facts = [] {
    DeviceFacts f;
    int device = 0, major = 0, minor = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return f;
    f.hopper = major == 9 && minor == 0;
    f.multiprocessors = sms;
    return f;
  }();
  return facts;
}

// dbias (N) += the sum of the blocks' column sums, part (tiles, N), in row order.
__global__ void add_column_sums_kernel(float* dbias, const float* part, int tiles, int N) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= N) return;
  float total = 0.0f;
  for (int t = 0; t < tiles; ++t) total += part[int64_t(t) * N + c];
  dbias[c] += total;
}

// The kernel's blocks resident on the device at once (its shared-memory limit raised first),
// read once per instantiation: 0 if either fails.
template <Epilogue kEpi, bool kTransA, bool kTransB>
int resident_blocks() {
  static const int blocks = [] {
    const auto kernel = gemm_sm90::gemm_kernel<kEpi, kTransA, kTransB>;
    int per_sm = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             gemm_sm90::kSharedBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, gemm_sm90::kThreads,
                                                      gemm_sm90::kSharedBytes) != cudaSuccess)
      return 0;
    return per_sm * device_facts().multiprocessors;
  }();
  return blocks;
}

// The persistent grid: one block per resident slot, fewer when the units are fewer (a block per
// unit measured slower). False (nothing enqueued) when no block fits.
template <Epilogue kEpi, bool kTransA, bool kTransB>
bool launch_kernel(const TensorMap& map_a, const TensorMap& map_b, const gemm_sm90::Params& p,
                   cudaStream_t stream) {
  const int slots = resident_blocks<kEpi, kTransA, kTransB>();
  if (slots <= 0) return false;
  const int units = gemm_sm90::unit_count(p);
  const unsigned blocks = unsigned(std::min(slots, units));
  gemm_sm90::gemm_kernel<kEpi, kTransA, kTransB>
      <<<blocks, gemm_sm90::kThreads, gemm_sm90::kSharedBytes, stream>>>(map_a, map_b, p);
  return true;
}

template <Epilogue kEpi, bool kTransB>
bool launch(const GemmOperands& g, cudaStream_t stream) {
  TensorMap map_a, map_b;
  // B (N, K) as boxes of kBN rows; B (K, N) as boxes of 64 K-rows x 64 columns (two a stage)
  const bool b_ok = kTransB ? encode(&map_b, g.b, g.K, g.N, g.ldb, gemm_sm90::kBK)
                            : encode(&map_b, g.b, g.N, g.K, g.ldb, gemm_sm90::kBN);
  if (!b_ok || !encode(&map_a, g.a, g.M, g.K, g.lda, gemm_sm90::kBM)) return false;
  float* colsum = g.dbias ? g.workspace : nullptr;
  const gemm_sm90::Params p{g.out, g.pre,    g.aux,    g.bias,   colsum,    nullptr,
                            0,     int(g.M), int(g.N), int(g.K), int(g.ldc)};
  if (!launch_kernel<kEpi, false, kTransB>(map_a, map_b, p, stream)) return false;
  if (colsum) {
    constexpr int kThreads = 256;
    add_column_sums_kernel<<<unsigned(tiles(g.N, kThreads)), kThreads, 0, stream>>>(
        g.dbias, colsum, gemm_sm90::row_blocks(p), int(g.N));
  }
  return true;
}

template <Epilogue kEpi>
bool launch_epilogue(const GemmOperands& g, cudaStream_t stream) {
  return g.trans_b ? launch<kEpi, true>(g, stream) : launch<kEpi, false>(g, stream);
}

// dweight (Nout, K; ldw) += the splits' partial sums part (splits, Nout, K), in split order.
__global__ void add_partials_kernel(float* dweight, Index ldw, const float* part, int splits,
                                    Index Nout, Index K) {
  const Index n = Nout * K;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += Index(gridDim.x) * blockDim.x) {
    float total = 0.0f;
    for (int z = 0; z < splits; ++z) total += part[z * n + i];
    dweight[(i / K) * ldw + i % K] += total;
  }
}

// The weight gradient's K slices (64 tokens each) per split: enough splits for two blocks on
// every SM, each at least 4 slices long, none empty.
int wgrad_slices_per_split(const WgradOperands& w) {
  const Index all = tiles(w.R, gemm_sm90::kBK);
  const Index blocks = tiles(w.Nout, gemm_sm90::kBM) * tiles(w.K, gemm_sm90::kBN);
  Index splits = tiles(2 * device_facts().multiprocessors, blocks);
  splits = std::max<Index>(1, std::min(splits, all / 4));
  return int(tiles(all, splits));
}

// One box by TMA into shared memory, then its bytes out as they lie there: (box_rows, 128 bytes)
// out, one block of 128 threads.
__global__ void probe_tma_box_kernel(const __grid_constant__ TensorMap map, unsigned char* out,
                                     int box_rows, int c0, int c1) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* box = gemm_sm90::swizzle_atom_aligned(raw);
  auto* bar = reinterpret_cast<uint64_t*>(box + box_rows * 128);
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(bar, uint32_t(box_rows) * 128);
    tma_load_2d(box, &map, bar, c0, c1);
  }
  mbar_wait(bar, 0);
  for (int i = int(threadIdx.x); i < box_rows * 128; i += int(blockDim.x)) out[i] = box[i];
}

}  // namespace

bool probe_tma_box(unsigned char* out, const __nv_bfloat16* src, Index rows, Index cols, Index ld,
                   int box_rows, int c0, int c1, cudaStream_t stream) {
  TensorMap map;
  if (!gemm_available() || !encode(&map, src, rows, cols, ld, box_rows)) return false;
  const int bytes = box_rows * 128 + 8 + 1024;
  if (cudaFuncSetAttribute(probe_tma_box_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           bytes) != cudaSuccess)
    return false;
  probe_tma_box_kernel<<<1, 128, bytes, stream>>>(map, out, box_rows, c0, c1);
  return true;
}

bool gemm_available() {
  return device_facts().hopper && tensor_map_encoder() != nullptr;
}

Index gemm_workspace_floats(const GemmOperands& g) {
  return g.dbias ? tiles(g.M, gemm_sm90::kBM) * g.N : 0;
}

bool gemm_fits(const GemmOperands& g) {
  const bool sizes = g.M > 0 && g.N > 0 && g.K > 0 && g.M <= kIntMax && g.N <= kIntMax &&
                     g.K <= kIntMax && g.ldc <= kIntMax &&
                     tiles(g.M, gemm_sm90::kBM) * tiles(g.N, gemm_sm90::kBN) <= kIntMax;
  const bool strides = g.lda % 8 == 0 && g.ldb % 8 == 0 && g.lda >= g.K &&
                       g.ldb >= (g.trans_b ? g.N : g.K) && g.ldc % 2 == 0 && g.ldc >= g.N;
  const bool pointers = aligned(g.a, 16) && aligned(g.b, 16) && g.out && aligned(g.out, 4) &&
                        aligned(g.pre, 4) && aligned(g.aux, 4) && !(g.pre && g.aux) &&
                        (!g.dbias || (g.aux && g.workspace));
  return sizes && strides && pointers;
}

Index wgrad_splits(const WgradOperands& w) {
  return tiles(tiles(w.R, gemm_sm90::kBK), wgrad_slices_per_split(w));
}

Index wgrad_workspace_floats(const WgradOperands& w) {
  return wgrad_splits(w) * w.Nout * w.K;
}

bool wgrad_fits(const WgradOperands& w) {
  const bool sizes =
      w.R > 0 && w.Nout > 0 && w.K > 0 && w.R <= kIntMax && w.Nout <= kIntMax && w.K <= kIntMax &&
      w.K % 2 == 0 &&
      tiles(w.Nout, gemm_sm90::kBM) * tiles(w.K, gemm_sm90::kBN) * tiles(w.R, gemm_sm90::kBK) <=
          kIntMax;
  const bool strides = w.ld_dout % 8 == 0 && w.ld_dout >= w.Nout && w.ld_inp % 8 == 0 &&
                       w.ld_inp >= w.K && w.ldw >= w.K;
  return sizes && strides && aligned(w.dout, 16) && aligned(w.inp, 16) && w.dweight && w.workspace;
}

bool wgrad(const WgradOperands& w, cudaStream_t stream) {
  if (!gemm_available() || !wgrad_fits(w)) return false;
  // C (Nout, K) = dout^T inp: A = dout (R, Nout) and B = inp (R, K), both read MN-major
  TensorMap map_a, map_b;
  if (!encode(&map_a, w.dout, w.R, w.Nout, w.ld_dout, gemm_sm90::kBK) ||
      !encode(&map_b, w.inp, w.R, w.K, w.ld_inp, gemm_sm90::kBK))
    return false;
  const int per = wgrad_slices_per_split(w), splits = int(wgrad_splits(w));
  const gemm_sm90::Params p{nullptr, nullptr,     nullptr,  nullptr,  nullptr, w.workspace,
                            per,     int(w.Nout), int(w.K), int(w.R), int(w.K)};
  if (!launch_kernel<Epilogue::kPartial, true, true>(map_a, map_b, p, stream)) return false;
  const Index n = w.Nout * w.K;
  const unsigned blocks = unsigned(std::min<Index>(tiles(n, 256), 4096));
  add_partials_kernel<<<blocks, 256, 0, stream>>>(w.dweight, w.ldw, w.workspace, splits, w.Nout,
                                                  w.K);
  return true;
}

bool gemm(const GemmOperands& g, cudaStream_t stream) {
  if (!gemm_available() || !gemm_fits(g)) return false;
  if (g.pre) return launch_epilogue<Epilogue::kBiasGelu>(g, stream);
  if (g.aux) return launch_epilogue<Epilogue::kGeluGrad>(g, stream);
  return launch_epilogue<Epilogue::kBias>(g, stream);
}

}  // namespace vit::cuda::sm90
