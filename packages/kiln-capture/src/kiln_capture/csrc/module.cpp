// kiln_capture._C: the native half of kiln-capture, the PEP 523 frame hook.
//
// Design note: "the trampoline"
// ------------------------------
// The C side is kept as small as possible. While a thread has the hook enabled, every
// new Python frame (except generators) is offered to one Python callback as
// (code, function, arguments). The callback either answers `run_default` (the frame
// then runs normally, with the hook still on for the frames it calls) or returns the
// value the frame must produce, computed by kiln's generated code. In the second case
// the frame still has to be popped and cleared by CPython itself, and for that we do
// not copy CPython's private frame-clearing code: we swap the frame's code object for
// a "trampoline" built by the Python side from the original code (same locals layout,
// bytecode `RESUME 0; RETURN_VALUE`), push the result on the frame's value stack and
// let _PyEval_EvalFrameDefault run it. It returns the value and clears the frame the
// ordinary way. When the callback raises, the frame is evaluated with throwflag set,
// which unwinds it (the trampoline has no exception table) and adds it to the
// traceback. The only private layout this touches is _PyInterpreterFrame's f_code,
// prev_instr, stacktop and localsplus, read through CPython's internal header.
//
// The hook is installed interpreter-wide only while at least one thread has it
// enabled, so running with the hook off costs nothing. It is disabled for the calling
// thread while the callback runs (no recursion into capture), and uninstalled while it
// runs when no other thread has it on: CPython 3.11+ takes slower, unspecialized paths
// for Python-to-Python calls while any frame evaluator is installed, and the generated
// code that the callback runs on a cache hit (the compiled graph's whole host side) would
// pay for that on every call of every function it makes (measured: ~8% of a small
// model's call on CPU; benchmarks/host_overhead.py).

#include <pybind11/pybind11.h>

#include <Python.h>

#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

namespace py = pybind11;

namespace {

thread_local int tls_enabled = 0;
int enabled_threads = 0;
PyObject* g_callback = nullptr;     // callable(code, func, args) -> result | g_run_default
PyObject* g_run_default = nullptr;  // sentinel
PyObject* g_trampolines = nullptr;  // dict: code -> trampoline code
PyObject* g_skip = nullptr;         // set of code objects never offered to the callback

constexpr int kUnsupportedFlags = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR;

PyObject* frame_function(_PyInterpreterFrame* frame) {
#if PY_VERSION_HEX >= 0x030C0000
  return frame->f_funcobj;
#else
  return reinterpret_cast<PyObject*>(frame->f_func);
#endif
}

// Number of argument slots filled before the frame starts (positional, keyword-only,
// *args, **kwargs).
int argument_slots(PyCodeObject* code) {
  int n = code->co_argcount + code->co_kwonlyargcount;
  if (code->co_flags & CO_VARARGS) n++;
  if (code->co_flags & CO_VARKEYWORDS) n++;
  return n;
}

PyObject* eval_trampoline(PyThreadState* tstate, _PyInterpreterFrame* frame,
                          PyObject* result) {
  PyCodeObject* code = frame->f_code;
  PyObject* tramp = PyDict_GetItem(g_trampolines, reinterpret_cast<PyObject*>(code));
  if (tramp == nullptr) {
    Py_XDECREF(result);
    if (result != nullptr) {
      PyErr_SetString(PyExc_RuntimeError, "kiln_capture: no trampoline for a handled frame");
    }
    // Without a trampoline the frame can only be unwound with its own code; its
    // exception table never covers the frame's start.
    return _PyEval_EvalFrameDefault(tstate, frame, 1);
  }
  Py_INCREF(tramp);
  frame->f_code = reinterpret_cast<PyCodeObject*>(tramp);
  Py_DECREF(code);
  frame->prev_instr = _PyCode_CODE(reinterpret_cast<PyCodeObject*>(tramp)) - 1;
  if (result == nullptr) {
    return _PyEval_EvalFrameDefault(tstate, frame, 1);
  }
  frame->localsplus[frame->stacktop] = result;  // steals the reference
  frame->stacktop += 1;
  return _PyEval_EvalFrameDefault(tstate, frame, 0);
}

bool set_enabled(bool on);

PyObject* hook(PyThreadState* tstate, _PyInterpreterFrame* frame, int throwflag) {
  PyCodeObject* code = frame->f_code;
  if (!tls_enabled || throwflag || g_callback == nullptr ||
      (code->co_flags & kUnsupportedFlags) || code->co_stacksize < 1 ||
      PySet_Contains(g_skip, reinterpret_cast<PyObject*>(code)) == 1) {
    return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
  }
  int n = argument_slots(code);
  PyObject* args = PyTuple_New(n);
  if (args == nullptr) return _PyEval_EvalFrameDefault(tstate, frame, 1);
  for (int i = 0; i < n; i++) {
    PyObject* v = frame->localsplus[i];
    if (v == nullptr) v = Py_None;
    Py_INCREF(v);
    PyTuple_SET_ITEM(args, i, v);
  }
  PyObject* func = frame_function(frame);
  set_enabled(false);
  PyObject* result = PyObject_CallFunctionObjArgs(
      g_callback, reinterpret_cast<PyObject*>(code), func ? func : Py_None, args, nullptr);
  set_enabled(true);
  Py_DECREF(args);
  if (result == g_run_default) {
    Py_DECREF(result);
    return _PyEval_EvalFrameDefault(tstate, frame, 0);
  }
  return eval_trampoline(tstate, frame, result);
}

// The evaluator that was installed before ours (the default one, or another PEP 523
// user such as torch.compile's); put back when no thread needs the hook any more.
_PyFrameEvalFunction g_previous = nullptr;

void install(bool on) {
  PyInterpreterState* interp = PyThreadState_Get()->interp;
  if (on) {
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (current != hook) {
      g_previous = current;
      _PyInterpreterState_SetEvalFrameFunc(interp, hook);
    }
  } else {
    _PyInterpreterState_SetEvalFrameFunc(interp, g_previous ? g_previous : _PyEval_EvalFrameDefault);
  }
}

// Enable or disable the hook for the calling thread; returns the previous state.
bool set_enabled(bool on) {
  bool prev = tls_enabled != 0;
  if (on == prev) return prev;
  tls_enabled = on ? 1 : 0;
  enabled_threads += on ? 1 : -1;
  if (on && enabled_threads == 1) install(true);
  if (!on && enabled_threads == 0) install(false);
  return prev;
}

void set_callback(py::object callback, py::object run_default, py::dict trampolines,
                  py::set skip) {
  Py_XDECREF(g_callback);
  Py_XDECREF(g_run_default);
  Py_XDECREF(g_trampolines);
  Py_XDECREF(g_skip);
  g_callback = callback.release().ptr();
  g_run_default = run_default.release().ptr();
  g_trampolines = trampolines.release().ptr();
  g_skip = skip.release().ptr();
}

py::tuple built_for_python() {
  return py::make_tuple(PY_MAJOR_VERSION, PY_MINOR_VERSION);
}

}  // namespace

int kiln_add_attr_guards(PyObject* module);  // attr_guards.cpp

PYBIND11_MODULE(_C, m) {
  if (kiln_add_attr_guards(m.ptr()) < 0) throw py::error_already_set();
  m.doc() = "Native part of kiln-capture: the PEP 523 frame evaluation hook.";
  m.def("built_for_python", &built_for_python,
        "The (major, minor) CPython version this extension was compiled for.");
  m.def("set_enabled", &set_enabled, py::arg("on"),
        "Enable/disable the frame hook for the calling thread; returns the previous state.");
  m.def("is_enabled", []() { return tls_enabled != 0; });
  m.def("set_callback", &set_callback, py::arg("callback"), py::arg("run_default"),
        py::arg("trampolines"), py::arg("skip"),
        "Install the Python side: callback(code, func, args), its 'run normally' sentinel, "
        "the code -> trampoline dict and the set of codes never offered.");
}
