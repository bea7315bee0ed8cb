// kiln_capture._C: the native half of kiln-capture.
//
// It will hold the PEP 523 frame evaluation hook (the capture issue). For now it
// reports the interpreter it was built against, so that an extension built for
// one CPython is never loaded into another without a clear error.

#include <pybind11/pybind11.h>

#include <Python.h>

namespace py = pybind11;

namespace {

py::tuple built_for_python() {
  return py::make_tuple(PY_MAJOR_VERSION, PY_MINOR_VERSION);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Native part of kiln-capture (frame evaluation hook).";
  m.def("built_for_python", &built_for_python,
        "The (major, minor) CPython version this extension was compiled for.");
}
