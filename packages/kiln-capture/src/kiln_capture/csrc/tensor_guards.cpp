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

#include <optional>
#include <tuple>
#include <vector>

#include <pybind11/stl.h>

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

// The shape guard of inputs with symbolic sizes (shape_guards.py) in one native call:
// each tensor's dtype, device, requires_grad and number of dimensions; its sizes bound
// to symbol slots (the first source of a symbol binds it, later ones compare) or equal to
// a constant; its strides dense like the example's (each the product of the sizes of the
// dimensions inside it; size-1 dimensions ignored); int inputs bound like sizes; each
// slot in its range. Returns the slots' values, or None when a check fails; guards on
// relations between symbols stay in Python, over the returned values.
struct SymDim {
  int64_t value;  // the constant size (slot < 0)
  int slot;
  bool bind;  // the first source of the slot's symbol
};

struct SymSpec {
  at::ScalarType dtype;
  c10::Device device;
  bool requires_grad;
  std::vector<SymDim> sizes;
  std::vector<std::vector<int>> strides;  // per dim: the dims whose sizes multiply to it
  std::vector<bool> stride_checked;       // false for size-1 dims
};

class ShapeBinder {
 public:
  explicit ShapeBinder(int slots) : lo_(slots, 0), hi_(slots, -1) {}

  void add_tensor(const py::handle& example, const std::vector<std::tuple<int64_t, int, bool>>& sizes,
                  const std::vector<std::optional<std::vector<int>>>& strides) {
    if (!THPVariable_Check(example.ptr())) throw py::type_error("ShapeBinder takes a tensor");
    const at::Tensor& t = THPVariable_Unpack(example.ptr());
    SymSpec spec{t.scalar_type(), t.device(), t.requires_grad(), {}, {}, {}};
    for (const auto& [value, slot, bind] : sizes) spec.sizes.push_back(SymDim{value, slot, bind});
    for (const auto& st : strides) {
      spec.stride_checked.push_back(st.has_value());
      spec.strides.push_back(st.value_or(std::vector<int>{}));
    }
    order_.push_back(specs_.size());
    specs_.push_back(std::move(spec));
  }

  void add_int(int slot, bool bind) {
    order_.push_back(-1 - static_cast<int64_t>(ints_.size()));
    ints_.push_back(SymDim{0, slot, bind});
  }

  void set_range(int slot, int64_t lo, int64_t hi) {
    lo_.at(slot) = lo;
    hi_.at(slot) = hi;
  }

  // The slots' values, or None when a check fails.
  py::object bind(const py::args& args) const {
    Slots v(lo_.size(), 0);
    if (!run(args, v)) return py::none();
    py::tuple out(v.size());
    for (size_t k = 0; k < v.size(); k++) out[k] = py::int_(v[k]);
    return std::move(out);
  }

  // Whether every check holds (no Python objects made: the form cache hits call when no
  // guard is left for Python).
  bool check(const py::args& args) const {
    Slots v(lo_.size(), 0);
    return run(args, v);
  }

 private:
  using Slots = c10::SmallVector<int64_t, 16>;

  bool run(const py::args& args, Slots& v) const {
    if (args.size() != order_.size()) return false;
    for (size_t i = 0; i < order_.size(); i++) {
      PyObject* obj = PyTuple_GET_ITEM(args.ptr(), i);
      if (order_[i] < 0) {
        const SymDim& d = ints_[-1 - order_[i]];
        if (!PyLong_CheckExact(obj)) return false;
        int overflow = 0;
        int64_t x = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow || !take(d, x, v)) return false;
        continue;
      }
      const SymSpec& s = specs_[order_[i]];
      if (!THPVariable_Check(obj)) return false;
      const at::Tensor& t = THPVariable_Unpack(obj);
      if (t.scalar_type() != s.dtype || t.device() != s.device ||
          t.requires_grad() != s.requires_grad || t.dim() != static_cast<int64_t>(s.sizes.size()))
        return false;
      c10::IntArrayRef sizes = t.sizes(), strides = t.strides();
      for (size_t d = 0; d < s.sizes.size(); d++)
        if (!take(s.sizes[d], sizes[d], v)) return false;
      for (size_t d = 0; d < s.strides.size(); d++) {
        if (!s.stride_checked[d]) continue;
        int64_t want = 1;
        for (int e : s.strides[d]) want *= sizes[e];
        if (strides[d] != want) return false;
      }
    }
    for (size_t k = 0; k < v.size(); k++)
      if (v[k] < lo_[k] || (hi_[k] >= 0 && v[k] > hi_[k])) return false;
    return true;
  }

  static bool take(const SymDim& d, int64_t x, Slots& v) {
    if (d.slot < 0) return x == d.value;
    if (d.bind) {
      v[d.slot] = x;
      return true;
    }
    return v[d.slot] == x;
  }

  std::vector<SymSpec> specs_;
  std::vector<SymDim> ints_;
  std::vector<int64_t> order_;  // >= 0: a tensor spec; < 0: int spec -1 - k
  std::vector<int64_t> lo_, hi_;
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
  py::class_<ShapeBinder>(m, "ShapeBinder")
      .def(py::init<int>(), py::arg("slots"))
      .def("add_tensor", &ShapeBinder::add_tensor, py::arg("example"), py::arg("sizes"),
           py::arg("strides"),
           "sizes: (value, slot, bind) per dim (slot -1: the constant value); strides: per "
           "dim the dims whose sizes multiply to it, or None (not checked)")
      .def("add_int", &ShapeBinder::add_int, py::arg("slot"), py::arg("bind"))
      .def("set_range", &ShapeBinder::set_range, py::arg("slot"), py::arg("lo"), py::arg("hi"),
           "hi < 0: no upper bound")
      .def("bind", &ShapeBinder::bind, "bind(*inputs) -> the slots' values, or None")
      .def("check", &ShapeBinder::check, "check(*inputs) -> whether every check holds");
}
