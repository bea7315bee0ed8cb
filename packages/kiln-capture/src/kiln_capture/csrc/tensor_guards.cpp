// kiln_capture._tensor_guards: every tensor guard of one cache entry in one native call.
//
// A cache entry's guard function hands the tensors it read, in order, to
// TensorGuards.check; each is compared with the metadata recorded at capture time:
// Python type, dtype, device, sizes, strides, requires_grad and dispatch key set. This
// replaces a Python function call and five attribute reads per tensor (about a
// microsecond each) with a few loads from the TensorImpl. Built against libtorch, so it
// is optional: without it the guard function checks tensors in Python.

#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

namespace py = pybind11;

namespace {

struct Spec {
  PyTypeObject* type;
  at::ScalarType dtype;
  c10::Device device;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  bool requires_grad;
  c10::DispatchKeySet keys;
};

class TensorGuards {
 public:
  TensorGuards() = default;

  // Record the metadata of one example tensor (no reference to it is kept).
  void add(const py::handle& obj) {
    if (!THPVariable_Check(obj.ptr())) throw py::type_error("TensorGuards.add takes a tensor");
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    specs_.push_back(Spec{Py_TYPE(obj.ptr()), t.scalar_type(), t.device(), t.sizes().vec(),
                          t.strides().vec(), t.requires_grad(), t.key_set()});
  }

  // True when every tensor matches its spec; `tensors` is the guard function's *args.
  bool check(const py::args& tensors) const {
    if (tensors.size() != specs_.size()) return false;
    for (size_t i = 0; i < specs_.size(); i++) {
      PyObject* obj = PyTuple_GET_ITEM(tensors.ptr(), i);
      const Spec& s = specs_[i];
      if (Py_TYPE(obj) != s.type || !THPVariable_Check(obj)) return false;
      const at::Tensor& t = THPVariable_Unpack(obj);
      if (t.scalar_type() != s.dtype || t.device() != s.device ||
          t.requires_grad() != s.requires_grad || t.key_set() != s.keys ||
          t.sizes() != c10::IntArrayRef(s.sizes) || t.strides() != c10::IntArrayRef(s.strides)) {
        return false;
      }
    }
    return true;
  }

  // Index of the first tensor that does not match (for the recompiles log), or -1.
  int first_mismatch(const py::args& tensors) const {
    for (size_t i = 0; i < specs_.size() && i < tensors.size(); i++) {
      py::tuple one = py::make_tuple(tensors[i]);
      TensorGuards single(*this, i);
      if (!single.check(py::args(one))) return static_cast<int>(i);
    }
    return tensors.size() == specs_.size() ? -1 : static_cast<int>(tensors.size());
  }

  size_t size() const { return specs_.size(); }

 private:
  TensorGuards(const TensorGuards& all, size_t i) : specs_{all.specs_[i]} {}
  std::vector<Spec> specs_;
};

}  // namespace

PYBIND11_MODULE(_tensor_guards, m) {
  m.doc() = "kiln-capture's native tensor guards (one call per cache entry).";
#ifdef KILN_BUILT_FOR_TORCH
  m.attr("built_for_torch") = KILN_BUILT_FOR_TORCH;
#else
  m.attr("built_for_torch") = "";
#endif
  py::class_<TensorGuards>(m, "TensorGuards")
      .def(py::init<>())
      .def("add", &TensorGuards::add, py::arg("example"),
           "Record the metadata of an example tensor seen at capture (in check's order).")
      .def("check", &TensorGuards::check, "check(*tensors) -> bool")
      .def("first_mismatch", &TensorGuards::first_mismatch,
           "first_mismatch(*tensors) -> index of the first tensor that fails, or -1")
      .def("__len__", &TensorGuards::size);
}
