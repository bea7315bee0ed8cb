/* kiln_triton._launch: one CUDA launch of a compiled Triton kernel whose parameters are all
 * pointers, with no Python between the wrapper's call and cuLaunchKernel.
 *
 * Triton's own launcher is a Python function (scratch allocation, hooks, argument
 * annotations) around a C launch, 5-10 us per kernel; a graph of 50 small kernels spends
 * more on that than on the kernels. kiln's kernels take only tensors (every size is baked
 * into the code), so a launch is: each tensor's data_ptr(), NULL for the pointers Triton
 * appends (global and profile scratch, used only when their size is non-zero, which the
 * caller checks), and cuLaunchKernel.
 *
 * libcuda is opened on first use, so the module imports (and is tested) on machines
 * without a GPU.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>

#define MAX_PARAMS 256

typedef int (*cu_launch_kernel_t)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                  unsigned by, unsigned bz, unsigned shared, void *stream,
                                  void **params, void **extra);
typedef int (*cu_get_error_string_t)(int error, const char **text);

static cu_launch_kernel_t cu_launch_kernel = NULL;
static cu_get_error_string_t cu_get_error_string = NULL;
static PyObject *data_ptr_name = NULL;

static int load_driver(void) {
    if (cu_launch_kernel != NULL) return 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_RuntimeError, "kiln_triton: cannot open libcuda.so.1 (%s)", dlerror());
        return -1;
    }
    cu_launch_kernel = (cu_launch_kernel_t)dlsym(lib, "cuLaunchKernel");
    cu_get_error_string = (cu_get_error_string_t)dlsym(lib, "cuGetErrorString");
    if (cu_launch_kernel == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kiln_triton: libcuda has no cuLaunchKernel");
        return -1;
    }
    return 0;
}

static int as_u64(PyObject *o, unsigned long long *out) {
    *out = PyLong_AsUnsignedLongLong(o);
    return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* launch(function, grid_x, grid_y, grid_z, threads, shared_bytes, stream, hidden, tensors,
 *        aligned) -> bool: False, with nothing launched, when a tensor at one of the
 * positions in `aligned` (those the kernel was compiled to assume 16-byte aligned) is not */
static PyObject *launch(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 10) {
        PyErr_SetString(PyExc_TypeError, "launch() takes 10 arguments");
        return NULL;
    }
    unsigned long long v[8];
    for (int i = 0; i < 8; i++) {
        if (as_u64(argv[i], &v[i]) < 0) return NULL;
    }
    PyObject *tensors = argv[8];
    if (!PyTuple_Check(tensors)) {
        PyErr_SetString(PyExc_TypeError, "launch(): the kernel's tensors must be a tuple");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(tensors);
    unsigned long long hidden = v[7];
    if (n + (Py_ssize_t)hidden > MAX_PARAMS) {
        PyErr_SetString(PyExc_ValueError, "launch(): too many kernel parameters");
        return NULL;
    }
    uint64_t slots[MAX_PARAMS];
    void *params[MAX_PARAMS];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ptr = PyObject_CallMethodNoArgs(PyTuple_GET_ITEM(tensors, i), data_ptr_name);
        if (ptr == NULL) return NULL;
        unsigned long long p;
        int bad = as_u64(ptr, &p);
        Py_DECREF(ptr);
        if (bad < 0) return NULL;
        slots[i] = (uint64_t)p;
        params[i] = &slots[i];
    }
    PyObject *aligned = argv[9];
    if (!PyTuple_Check(aligned)) {
        PyErr_SetString(PyExc_TypeError, "launch(): the aligned positions must be a tuple");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(aligned); k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(aligned, k));
        if (i == -1 && PyErr_Occurred()) return NULL;
        if (i < 0 || i >= n) {
            PyErr_SetString(PyExc_IndexError, "launch(): aligned position out of range");
            return NULL;
        }
        if (slots[i] & 15) Py_RETURN_FALSE; /* Triton's path specializes for it */
    }
    if (load_driver() < 0) return NULL;
    for (Py_ssize_t i = n; i < n + (Py_ssize_t)hidden; i++) {
        slots[i] = 0;
        params[i] = &slots[i];
    }
    int err = cu_launch_kernel((void *)(uintptr_t)v[0], (unsigned)v[1], (unsigned)v[2],
                               (unsigned)v[3], (unsigned)v[4], 1, 1, (unsigned)v[5],
                               (void *)(uintptr_t)v[6], params, NULL);
    if (err != 0) {
        const char *text = NULL;
        if (cu_get_error_string != NULL) cu_get_error_string(err, &text);
        PyErr_Format(PyExc_RuntimeError, "kiln_triton: cuLaunchKernel failed: CUDA error %d (%s)",
                     err, text != NULL ? text : "unknown");
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, grid_x, grid_y, grid_z, threads, shared_bytes, stream, hidden, tensors, "
     "aligned) -> False when a tensor at an `aligned` position is not 16-byte aligned"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch",
                                    "cuLaunchKernel for kernels taking only tensors", -1, methods};

PyMODINIT_FUNC PyInit__launch(void) {
    data_ptr_name = PyUnicode_InternFromString("data_ptr");
    if (data_ptr_name == NULL) return NULL;
    return PyModule_Create(&module);
}
