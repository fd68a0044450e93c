// The attention operation graphs: see cudnn_attention_graphs.h.
#include "cudnn_attention_graphs.h"

#if VIT_CUDNN_HEADERS

#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace vit::cuda::cudnn {

namespace {

// A (B, H, N, D) bf16 view: element strides with row stride `ld` (3C for q, k, v and their
// gradients, C for out and dO); `transposed`: the same memory as (B, H, D, N).
Desc view_tensor(Uid uid, int64_t B, int64_t H, int64_t N, int64_t D, int64_t ld,
                 bool transposed = false) {
  Dims dims = {B, H, N, D}, strides = {N * ld, D, ld, 1};
  if (transposed) {
    std::swap(dims[2], dims[3]);
    std::swap(strides[2], strides[3]);
  }
  return tensor(uid, CUDNN_DATA_BFLOAT16, dims, strides);
}

// The softmax statistics (B, H, N, 1) fp32: our lse.
Desc stats_tensor(int64_t B, int64_t H, int64_t N) {
  return tensor(kStats, CUDNN_DATA_FLOAT, {B, H, N, 1}, {H * N, N, 1, 1});
}

// An fp32 scalar passed by value: the score scale 1 / sqrt(D), or the composite graph's 1.
Desc scalar_tensor(Uid uid) {
  return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, Role::kByValue);
}

// Builds a graph node by node, as cudnn-frontend lowers its nodes: every op's descriptor and
// the tensors it names are kept (a deque, so references to them stay valid).
class GraphBuilder {
 public:
  const Desc& add(Desc t) {
    tensors_.push_back(std::move(t));
    return tensors_.back();
  }
  // An intermediate the engine keeps to itself; fp32 unless said otherwise.
  const Desc& intermediate(const Dims& dims, const Dims& strides,
                           cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return add(tensor(next_virtual_++, type, dims, strides, Role::kVirtual));
  }
  // y = x (op) b, or y = op(x) where b is null; fp32 arithmetic, alphas 1 (as the frontend's).
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc& y) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    pw.finalize("pointwise descriptor");
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op descriptor");
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b, "pointwise b");
    const float one = 1.0f;
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
    op.finalize("pointwise operation");
    keep(std::move(pw), std::move(op));
  }
  // A new fp32 intermediate (dims, strides) = x (op) b, or op(x) where b is null.
  const Desc& pointwise_to(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b,
                           const Dims& dims, const Dims& strides) {
    const Desc& y = intermediate(dims, strides);
    pointwise(mode, x, b, y);
    return y;
  }
  // y = the sum of x over the dims where y has 1.
  void sum(const Desc& x, const Desc& y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    const cudnnReduceTensorOp_t add = CUDNN_REDUCE_TENSOR_ADD;
    red.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "reduction precision");
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &add,
            "reduction operator");
    if (api().version >= 91100) {  // the frontend sets it (false) from 9.11
      const bool deterministic = false;
      red.set(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic,
              "reduction determinism");
    }
    red.finalize("reduction descriptor");
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red, "reduction op descriptor");
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    op.finalize("reduction operation");
    keep(std::move(red), std::move(op));
  }
  // c = a b over the last two dims, fp32 accumulation.
  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "matmul precision");
    mm.finalize("matmul descriptor");
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "matmul op descriptor");
    op.finalize("matmul operation");
    keep(std::move(mm), std::move(op));
  }
  // y: x's elements under y's dims and strides (here: a transposed view).
  void reshape(const Desc& x, const Desc& y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
    op.finalize("reshape operation");
    ops_.push_back(std::move(op));
  }
  Operations finish() {
    Operations o{std::move(ops_), {}};
    for (Desc& t : tensors_) o.tensors.push_back(std::move(t));
    for (Desc& d : descriptors_) o.tensors.push_back(std::move(d));
    return o;
  }

 private:
  void keep(Desc descriptor, Desc op) {
    descriptors_.push_back(std::move(descriptor));
    ops_.push_back(std::move(op));
  }
  std::deque<Desc> tensors_;
  std::vector<Desc> descriptors_, ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// One operation of `type` over its tensors: each set as its attribute, then finalized; `what`
// names the operation in a failure (with the attribute's number where setting one failed).
Operations single_operation(cudnnBackendDescriptorType_t type, const char* what,
                            std::vector<std::pair<cudnnBackendAttributeName_t, Desc>> tensors) {
  Desc op(type);
  for (const auto& [attribute, t] : tensors) {
    const std::string at = std::string(what) + " attribute " + std::to_string(int(attribute));
    op.set_desc(attribute, t, at.c_str());
  }
  op.finalize(what);
  Operations r;
  r.ops.push_back(std::move(op));
  for (auto& [attribute, t] : tensors) r.tensors.push_back(std::move(t));
  return r;
}

}  // namespace

Operations forward_operation(int64_t B, int64_t N, int64_t H, int64_t D) {
  const int64_t C = H * D;
  std::vector<std::pair<cudnnBackendAttributeName_t, Desc>> t;
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, view_tensor(kQ, B, H, N, D, 3 * C));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, view_tensor(kK, B, H, N, D, 3 * C));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, view_tensor(kV, B, H, N, D, 3 * C));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, view_tensor(kO, B, H, N, D, C));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, stats_tensor(B, H, N));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scalar_tensor(kScale));
  return single_operation(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, "sdpa forward operation",
                          std::move(t));
}

// kv_transposed: the form the composite backward takes (cudnn-frontend transposes them for
// it); whether the SDPA backward operation wants that or K and V as they are (as its forward
// does) is the device's to say, so cudnn_attention.cu tries both.
Operations backward_operation(int64_t B, int64_t N, int64_t H, int64_t D, bool kv_transposed) {
  const int64_t C = H * D;
  std::vector<std::pair<cudnnBackendAttributeName_t, Desc>> t;
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC, view_tensor(kQ, B, H, N, D, 3 * C));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC,
                 view_tensor(kK, B, H, N, D, 3 * C, kv_transposed));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC,
                 view_tensor(kV, B, H, N, D, 3 * C, kv_transposed));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC, view_tensor(kO, B, H, N, D, C));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC, view_tensor(kdO, B, H, N, D, C));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC, stats_tensor(B, H, N));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC, scalar_tensor(kScale));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC, view_tensor(kdQ, B, H, N, D, 3 * C));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC, view_tensor(kdK, B, H, N, D, 3 * C));
  t.emplace_back(CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC, view_tensor(kdV, B, H, N, D, 3 * C));
  return single_operation(CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR, "sdpa backward operation",
                          std::move(t));
}

// With P = exp(scale Q K^T - stats) (the forward's probabilities, recomputed) and
// softmax_sum = rowsum(dO * O):
//   dV = P^T dO,  dS = P * (dO V^T - softmax_sum) * scale,  dK = dS^T Q,  dQ = dS K.
// The node order, types and strides are cudnn-frontend's for this case (no mask, dropout, bias
// or grouped heads); the intermediates are fp32 but for the two bf16 transposed views that feed
// the dV and dK products. dQ goes straight to its bf16 output (no fp32 dQ accumulator): that is
// the graph cuDNN plans with a dP workspace.
Operations composite_backward(int64_t B, int64_t N, int64_t H, int64_t D) {
  const int64_t C = H * D;
  GraphBuilder g;
  const Desc &q = g.add(view_tensor(kQ, B, H, N, D, 3 * C)),
             &k_t = g.add(view_tensor(kK, B, H, N, D, 3 * C, true)),
             &v_t = g.add(view_tensor(kV, B, H, N, D, 3 * C, true)),
             &o = g.add(view_tensor(kO, B, H, N, D, C)),
             &d_o = g.add(view_tensor(kdO, B, H, N, D, C)),
             &dq = g.add(view_tensor(kdQ, B, H, N, D, 3 * C)),
             &dk = g.add(view_tensor(kdK, B, H, N, D, 3 * C)),
             &dv = g.add(view_tensor(kdV, B, H, N, D, 3 * C)),
             &stats = g.add(stats_tensor(B, H, N)), &scale = g.add(scalar_tensor(kScale)),
             &one = g.add(scalar_tensor(kOne));
  const Dims rows = {B, H, N, 1}, row_strides = {H * N, N, 1, 1};
  const Dims scores = {B, H, N, N}, score_strides = {H * N * N, N * N, N, 1},
             transposed_strides = {H * N * N, N * N, 1, N};

  // softmax_sum = rowsum(dO * O) * 1 (B, H, N, 1)
  const Desc& d_o_o =
      g.pointwise_to(CUDNN_POINTWISE_MUL, d_o, &o, {B, H, N, D}, {H * N * D, N * D, H * D, 1});
  const Desc& row_sum = g.intermediate(rows, row_strides);
  g.sum(d_o_o, row_sum);
  const Desc& softmax_sum =
      g.add(tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, rows, row_strides, Role::kMemory));
  g.pointwise(CUDNN_POINTWISE_MUL, row_sum, &one, softmax_sum);

  // P = exp(Q K^T * scale - stats) (B, H, N, N); dV = P^T dO
  const Desc& s = g.intermediate(scores, score_strides);
  g.matmul(q, k_t, s);
  const Desc& s_scaled = g.pointwise_to(CUDNN_POINTWISE_MUL, s, &scale, scores, score_strides);
  const Desc& s_centred =
      g.pointwise_to(CUDNN_POINTWISE_SUB, s_scaled, &stats, scores, score_strides);
  const Desc& p = g.pointwise_to(CUDNN_POINTWISE_EXP, s_centred, nullptr, scores, score_strides);
  const Desc& p_t = g.intermediate(scores, transposed_strides, CUDNN_DATA_BFLOAT16);
  g.reshape(p, p_t);
  g.matmul(p_t, d_o, dv);

  // dS = (dO V^T - softmax_sum) * P * scale; dK = dS^T Q
  const Desc& dp = g.intermediate(scores, score_strides);
  g.matmul(d_o, v_t, dp);
  const Desc& dp_centred =
      g.pointwise_to(CUDNN_POINTWISE_SUB, dp, &softmax_sum, scores, score_strides);
  const Desc& ds_unscaled =
      g.pointwise_to(CUDNN_POINTWISE_MUL, dp_centred, &p, scores, score_strides);
  const Desc& ds = g.pointwise_to(CUDNN_POINTWISE_MUL, ds_unscaled, &scale, scores, score_strides);
  const Desc& ds_t = g.intermediate(scores, transposed_strides, CUDNN_DATA_BFLOAT16);
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, dk);

  // dQ = dS K, K read back from K^T's memory as (B, H, N, D)
  const Desc& k = g.intermediate({B, H, N, D}, {N * 3 * C, D, 3 * C, 1}, CUDNN_DATA_BFLOAT16);
  g.reshape(k_t, k);
  g.matmul(ds, k, dq);
  return g.finish();
}

}  // namespace vit::cuda::cudnn

#endif  // VIT_CUDNN_HEADERS
