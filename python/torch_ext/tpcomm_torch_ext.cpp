// SPDX-License-Identifier: Apache-2.0
// The eager path of tpcomm's PyTorch ops, compiled: `torch.ops.tpcomm_c.*` call the C API
// directly from the dispatcher, without Python in between (`tpcomm.torch` uses them when this
// module is installed). The C API's functions come from the library that `tpcomm` loaded, as
// addresses given to `init`, so the process holds one libtpcomm; this module links no tpcomm
// library. Group arguments are C group handles (`tpcomm_group` as an integer), which the C API
// checks against its live handles.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <cstdint>
#include <string>

#include "tpcomm/tpcomm.h"

namespace {

struct Api {
  decltype(&tpcomm_all_reduce) all_reduce = nullptr;
  decltype(&tpcomm_all_gather) all_gather = nullptr;
  decltype(&tpcomm_reduce_scatter) reduce_scatter = nullptr;
  decltype(&tpcomm_last_error) last_error = nullptr;
};
Api api;

template <class F>
F as_function(std::int64_t address) {
  TORCH_CHECK(address != 0, "tpcomm_c: init was given a null function");
  return reinterpret_cast<F>(static_cast<std::uintptr_t>(address));
}

void init(std::int64_t all_reduce, std::int64_t all_gather, std::int64_t reduce_scatter,
          std::int64_t last_error) {
  api.all_reduce = as_function<decltype(api.all_reduce)>(all_reduce);
  api.all_gather = as_function<decltype(api.all_gather)>(all_gather);
  api.reduce_scatter = as_function<decltype(api.reduce_scatter)>(reduce_scatter);
  api.last_error = as_function<decltype(api.last_error)>(last_error);
}

int dtype_of(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return TPCOMM_F32;
    case at::kHalf:
      return TPCOMM_F16;
    case at::kBFloat16:
      return TPCOMM_BF16;
    case at::kDouble:
      return TPCOMM_F64;
    case at::kChar:
      return TPCOMM_I8;
    case at::kByte:
      return TPCOMM_U8;
    case at::kInt:
      return TPCOMM_I32;
    case at::kLong:
      return TPCOMM_I64;
    case at::kFloat8_e4m3fn:
      return TPCOMM_F8E4M3;
    case at::kFloat8_e5m2:
      return TPCOMM_F8E5M2;
    default:
      TORCH_CHECK(false, "tpcomm_c::", op, ": dtype ", t.scalar_type(),
                  " is not one tpcomm supports");
  }
}

/// The C API's view of `t`, checked as `tpcomm.torch` checks it.
tpcomm_tensor view(const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK(t.is_cuda(), "tpcomm_c::", op, ": ", name, " is on ", t.device(),
              "; tpcomm takes CUDA tensors");
  TORCH_CHECK(t.is_contiguous(), "tpcomm_c::", op, ": ", name, " is not contiguous");
  TORCH_CHECK(t.dim() <= TPCOMM_MAX_DIMS, "tpcomm_c::", op, ": ", name, " has ", t.dim(),
              " dimensions; at most ", TPCOMM_MAX_DIMS);
  tpcomm_tensor c{};
  c.data = t.data_ptr();
  c.dtype = dtype_of(t, op);
  c.ndim = static_cast<std::int32_t>(t.dim());
  c.device = t.device().index();
  for (std::int64_t i = 0; i < t.dim(); ++i) c.shape[i] = t.size(i);
  return c;
}

tpcomm_group group_of(std::int64_t group) {
  TORCH_CHECK(api.all_reduce != nullptr, "tpcomm_c: not initialised (import tpcomm.torch)");
  return reinterpret_cast<tpcomm_group>(static_cast<std::uintptr_t>(group));
}

void* stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void check(tpcomm_status s, const char* op) {
  TORCH_CHECK(s == TPCOMM_OK, "tpcomm_c::", op, ": ", api.last_error(), " [status ",
              static_cast<int>(s), "]");
}

int reduce_op_of(c10::string_view op) {
  if (op == "sum") return TPCOMM_SUM;
  if (op == "prod") return TPCOMM_PROD;
  if (op == "max") return TPCOMM_MAX;
  if (op == "min") return TPCOMM_MIN;
  if (op == "avg") return TPCOMM_AVG;
  TORCH_CHECK(false, "tpcomm_c: op '", std::string(op), "' is not sum, prod, max, min or avg");
}

at::Tensor all_reduce(const at::Tensor& x, std::int64_t group, c10::string_view op) {
  const tpcomm_group g = group_of(group);
  const int o = reduce_op_of(op);
  at::Tensor out = at::empty_like(x);
  const tpcomm_tensor in = view(x, "x", "all_reduce");
  const tpcomm_tensor o_view = view(out, "out", "all_reduce");
  check(api.all_reduce(g, &in, &o_view, o, stream_of(x)), "all_reduce");
  return out;
}

at::Tensor& all_reduce_(at::Tensor& x, std::int64_t group, c10::string_view op) {
  const tpcomm_group g = group_of(group);
  const int o = reduce_op_of(op);
  const tpcomm_tensor v = view(x, "x", "all_reduce_");
  check(api.all_reduce(g, &v, &v, o, stream_of(x)), "all_reduce_");
  return x;
}

std::vector<std::int64_t> gathered_shape(const at::Tensor& x, std::int64_t world) {
  if (x.dim() == 0) return {world};
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[0] *= world;
  return shape;
}

at::Tensor all_gather(const at::Tensor& x, std::int64_t group, std::int64_t world) {
  const tpcomm_group g = group_of(group);
  at::Tensor out = x.new_empty(gathered_shape(x, world));
  const tpcomm_tensor in = view(x, "x", "all_gather");
  const tpcomm_tensor o = view(out, "out", "all_gather");
  check(api.all_gather(g, &in, &o, stream_of(x)), "all_gather");
  return out;
}

std::vector<std::int64_t> scattered_shape(const at::Tensor& x, std::int64_t world) {
  TORCH_CHECK(x.dim() > 0 && world > 0 && x.size(0) % world == 0,
              "tpcomm_c::reduce_scatter: x's first dimension (", x.sizes(),
              ") is not a multiple of the world size ", world);
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[0] /= world;
  return shape;
}

at::Tensor reduce_scatter(const at::Tensor& x, std::int64_t group, std::int64_t world,
                          c10::string_view op) {
  const tpcomm_group g = group_of(group);
  const int o = reduce_op_of(op);
  at::Tensor out = x.new_empty(scattered_shape(x, world));
  const tpcomm_tensor in = view(x, "x", "reduce_scatter");
  const tpcomm_tensor ov = view(out, "out", "reduce_scatter");
  check(api.reduce_scatter(g, &in, &ov, o, stream_of(x)), "reduce_scatter");
  return out;
}

// Shapes only, for torch.compile's tracing (fake tensors) and the meta device.
at::Tensor all_reduce_meta(const at::Tensor& x, std::int64_t, c10::string_view) {
  return at::empty_like(x);
}
at::Tensor& all_reduce__meta(at::Tensor& x, std::int64_t, c10::string_view) { return x; }
at::Tensor all_gather_meta(const at::Tensor& x, std::int64_t, std::int64_t world) {
  return x.new_empty(gathered_shape(x, world));
}
at::Tensor reduce_scatter_meta(const at::Tensor& x, std::int64_t, std::int64_t world,
                               c10::string_view) {
  return x.new_empty(scattered_shape(x, world));
}

}  // namespace

TORCH_LIBRARY(tpcomm_c, m) {
  m.def("all_reduce(Tensor x, int group, str op) -> Tensor");
  m.def("all_reduce_(Tensor(a!) x, int group, str op) -> Tensor(a!)");
  m.def("all_gather(Tensor x, int group, int world) -> Tensor");
  m.def("reduce_scatter(Tensor x, int group, int world, str op) -> Tensor");
}

TORCH_LIBRARY_IMPL(tpcomm_c, CUDA, m) {
  m.impl("all_reduce", &all_reduce);
  m.impl("all_reduce_", &all_reduce_);
  m.impl("all_gather", &all_gather);
  m.impl("reduce_scatter", &reduce_scatter);
}

// The CPU entries only say what is wrong (a CPU tensor), as the CUDA ones check it.
TORCH_LIBRARY_IMPL(tpcomm_c, CPU, m) {
  m.impl("all_reduce", &all_reduce);
  m.impl("all_reduce_", &all_reduce_);
  m.impl("all_gather", &all_gather);
  m.impl("reduce_scatter", &reduce_scatter);
}

TORCH_LIBRARY_IMPL(tpcomm_c, Meta, m) {
  m.impl("all_reduce", &all_reduce_meta);
  m.impl("all_reduce_", &all_reduce__meta);
  m.impl("all_gather", &all_gather_meta);
  m.impl("reduce_scatter", &reduce_scatter_meta);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("init", &init, "Takes the addresses of the C API's functions (from tpcomm.torch).");
}
