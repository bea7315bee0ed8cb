// Attribute guards of one object in one call (see guards.py, "native attribute guards").
//
// check_attrs(obj, keys, reads, modes, expected) reads each value as the Python guard
// does, by read kind: 'a' the attribute ``obj.<key>`` (descriptors, instance dict, class,
// then __getattr__), 'k' the item ``obj[<key>]``, 'c' the closure cell
// ``obj.__closure__[<key>].cell_contents``; and compares it with the value recorded at
// capture, by mode:
//   'e'  same literal: identical, or same type and equal (tuples element by element,
//        each element's type too, so 1, 1.0 and True stay distinct)
//   'f'  falsy (an empty hook dict)
//   't'  its type is expected[i]
//   'i'  identical to expected[i]
// A value that cannot be read fails the check (as a raising Python guard does).
#include <Python.h>

namespace {

int same_literal(PyObject* v, PyObject* e) {
  if (v == e) return 1;
  if (Py_TYPE(v) != Py_TYPE(e)) return 0;
  if (PyTuple_CheckExact(e)) {
    Py_ssize_t n = PyTuple_GET_SIZE(e);
    if (PyTuple_GET_SIZE(v) != n) return 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
      int r = same_literal(PyTuple_GET_ITEM(v, i), PyTuple_GET_ITEM(e, i));
      if (r != 1) return r;
    }
    return 1;
  }
  return PyObject_RichCompareBool(v, e, Py_EQ);
}

PyObject* getattribute_name = nullptr;  // interned "__getattribute__"

// Whether reading obj's attributes may skip the type's __getattr__ hook on a hit: its
// __getattribute__ is object's, so the hook itself would run the generic lookup first
// (CPython's slot_tp_getattr_hook); a miss still goes through PyObject_GetAttr.
bool generic_first(PyObject* obj) {
  PyTypeObject* tp = Py_TYPE(obj);
  if (tp->tp_getattro == PyObject_GenericGetAttr) return true;
  PyObject* ga = _PyType_Lookup(tp, getattribute_name);
  return ga != nullptr && Py_IS_TYPE(ga, &PyWrapperDescr_Type) &&
         reinterpret_cast<PyWrapperDescrObject*>(ga)->d_wrapped ==
             reinterpret_cast<void*>(PyObject_GenericGetAttr);
}

PyObject* read_attr(PyObject* obj, PyObject* name, bool generic) {
  if (generic) {
    PyObject* v = PyObject_GenericGetAttr(obj, name);
    if (v != nullptr || !PyErr_ExceptionMatches(PyExc_AttributeError)) return v;
    PyErr_Clear();
  }
  return PyObject_GetAttr(obj, name);
}

PyObject* read_cell(PyObject* fn, PyObject* index) {
  PyObject* closure = PyFunction_Check(fn) ? PyFunction_GetClosure(fn) : nullptr;
  if (closure == nullptr || !PyTuple_Check(closure)) return nullptr;
  Py_ssize_t i = PyLong_AsSsize_t(index);
  if (i < 0 || i >= PyTuple_GET_SIZE(closure)) return nullptr;
  PyObject* cell = PyTuple_GET_ITEM(closure, i);
  PyObject* v = PyCell_Check(cell) ? PyCell_GET(cell) : nullptr;
  Py_XINCREF(v);
  return v;  // nullptr: no closure or an empty cell, where Python raises
}

PyObject* read(PyObject* obj, char kind, PyObject* key, bool generic) {
  switch (kind) {
    case 'a': return read_attr(obj, key, generic);
    case 'k': return PyObject_GetItem(obj, key);
    case 'c': return read_cell(obj, key);
    default: return nullptr;
  }
}

PyObject* check_attrs(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyTuple_CheckExact(args[1]) || !PyBytes_CheckExact(args[2]) ||
      !PyBytes_CheckExact(args[3]) || !PyTuple_CheckExact(args[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "check_attrs(obj, keys: tuple, reads: bytes, modes: bytes, expected: tuple)");
    return nullptr;
  }
  PyObject* obj = args[0];
  PyObject* keys = args[1];
  const char* reads = PyBytes_AS_STRING(args[2]);
  const char* modes = PyBytes_AS_STRING(args[3]);
  PyObject* expected = args[4];
  Py_ssize_t n = PyTuple_GET_SIZE(keys);
  if (PyBytes_GET_SIZE(args[2]) != n || PyBytes_GET_SIZE(args[3]) != n ||
      PyTuple_GET_SIZE(expected) != n) {
    PyErr_SetString(PyExc_ValueError, "check_attrs: arguments differ in length");
    return nullptr;
  }
  bool generic = generic_first(obj);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v = read(obj, reads[i], PyTuple_GET_ITEM(keys, i), generic);
    if (v == nullptr) {  // a read that raises (or cannot be made) fails the check
      PyErr_Clear();
      Py_RETURN_FALSE;
    }
    PyObject* e = PyTuple_GET_ITEM(expected, i);
    int ok;
    switch (modes[i]) {
      case 'e': ok = same_literal(v, e); break;
      case 'f': ok = PyObject_IsTrue(v); ok = ok < 0 ? -1 : !ok; break;
      case 't': ok = reinterpret_cast<PyObject*>(Py_TYPE(v)) == e; break;
      case 'i': ok = v == e; break;
      default: ok = -1; PyErr_SetString(PyExc_ValueError, "check_attrs: unknown mode");
    }
    Py_DECREF(v);
    if (ok < 0) {
      PyErr_Clear();
      Py_RETURN_FALSE;
    }
    if (!ok) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

PyMethodDef methods[] = {
    {"check_attrs", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(check_attrs)),
     METH_FASTCALL,
     "check_attrs(obj, keys, reads, modes, expected) -> bool: the guards reading one object."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int kiln_add_attr_guards(PyObject* module) {
  getattribute_name = PyUnicode_InternFromString("__getattribute__");
  if (getattribute_name == nullptr) return -1;
  return PyModule_AddFunctions(module, methods);
}
