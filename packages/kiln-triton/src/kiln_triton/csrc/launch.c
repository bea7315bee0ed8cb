/* kiln_triton._launch: one CUDA launch of a compiled Triton kernel whose parameters are all
 * pointers, with no Python between the wrapper's call and cuLaunchKernel.
 *
 * Triton's own launcher is a Python function (scratch allocation, hooks, argument
 * annotations) around a C launch, 5-10 us per kernel; a graph of 50 small kernels spends
 * more on that than on the kernels. kiln's kernels take only tensors (every size is baked
 * into the code), so a launch is: each tensor's data_ptr(), NULL for the pointers Triton
 * appends (global and profile scratch, used only when their size is non-zero, which the
 * caller checks), and cuLaunchKernel. A kernel with symbolic sizes takes them as ints
 * after its tensors (`launch`'s optional last argument): each is written as a 64-bit slot,
 * which a 32-bit parameter reads as its low half (little-endian hosts; Triton compiles
 * another binary, with 64-bit parameters, for values that do not fit 32 bits).
 *
 * libcuda is opened on first use, so the module imports (and is tested) on machines
 * without a GPU.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stddef.h>
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

/* Read the tensors' pointers into `slots` (then `hidden` NULLs) and launch. Returns 1 when
 * launched, 0 when a tensor at one of the `aligned` positions (those the kernel was
 * compiled to assume 16-byte aligned) is not (nothing launched), -1 with an exception. */
static int launch_tensors(unsigned long long function, const unsigned long long grid[3],
                          unsigned long long threads, unsigned long long shared, void *stream,
                          Py_ssize_t hidden, PyObject *const *tensors, Py_ssize_t n,
                          PyObject *aligned, PyObject *sizes) {
    Py_ssize_t nsizes = sizes != NULL ? PyTuple_GET_SIZE(sizes) : 0;
    if (n + nsizes + hidden > MAX_PARAMS) {
        PyErr_SetString(PyExc_ValueError, "launch(): too many kernel parameters");
        return -1;
    }
    uint64_t slots[MAX_PARAMS];
    void *params[MAX_PARAMS];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ptr = PyObject_CallMethodNoArgs(tensors[i], data_ptr_name);
        if (ptr == NULL) return -1;
        unsigned long long p;
        int bad = as_u64(ptr, &p);
        Py_DECREF(ptr);
        if (bad < 0) return -1;
        slots[i] = (uint64_t)p;
        params[i] = &slots[i];
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(aligned); k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(aligned, k));
        if (i == -1 && PyErr_Occurred()) return -1;
        if (i < 0 || i >= n) {
            PyErr_SetString(PyExc_IndexError, "launch(): aligned position out of range");
            return -1;
        }
        if (slots[i] & 15) return 0; /* Triton's path specializes for it */
    }
    for (Py_ssize_t k = 0; k < nsizes; k++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, k));
        if (v == -1 && PyErr_Occurred()) return -1;
        slots[n + k] = (uint64_t)v;
        params[n + k] = &slots[n + k];
    }
    if (load_driver() < 0) return -1;
    for (Py_ssize_t i = n + nsizes; i < n + nsizes + hidden; i++) {
        slots[i] = 0;
        params[i] = &slots[i];
    }
    int err = cu_launch_kernel((void *)(uintptr_t)function, (unsigned)grid[0], (unsigned)grid[1],
                               (unsigned)grid[2], (unsigned)threads, 1, 1, (unsigned)shared,
                               stream, params, NULL);
    if (err != 0) {
        const char *text = NULL;
        if (cu_get_error_string != NULL) cu_get_error_string(err, &text);
        PyErr_Format(PyExc_RuntimeError, "kiln_triton: cuLaunchKernel failed: CUDA error %d (%s)",
                     err, text != NULL ? text : "unknown");
        return -1;
    }
    return 1;
}

/* launch(function, grid_x, grid_y, grid_z, threads, shared_bytes, stream, hidden, tensors,
 *        aligned[, sizes]) -> bool: False, with nothing launched, when a tensor at one of
 * the positions in `aligned` is not 16-byte aligned; `sizes`: ints after the tensors */
static PyObject *launch(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 10 && argc != 11) {
        PyErr_SetString(PyExc_TypeError, "launch() takes 10 or 11 arguments");
        return NULL;
    }
    PyObject *sizes = argc == 11 ? argv[10] : NULL;
    if (sizes != NULL && !PyTuple_Check(sizes)) {
        PyErr_SetString(PyExc_TypeError, "launch(): sizes is a tuple of ints");
        return NULL;
    }
    unsigned long long v[8];
    for (int i = 0; i < 8; i++) {
        if (as_u64(argv[i], &v[i]) < 0) return NULL;
    }
    if (!PyTuple_Check(argv[8]) || !PyTuple_Check(argv[9])) {
        PyErr_SetString(PyExc_TypeError, "launch(): tensors and aligned positions are tuples");
        return NULL;
    }
    int r = launch_tensors(v[0], &v[1], v[4], v[5], (void *)(uintptr_t)v[6], (Py_ssize_t)v[7],
                           &PyTuple_GET_ITEM(argv[8], 0), PyTuple_GET_SIZE(argv[8]), argv[9],
                           sizes);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

/* -- Launcher: one kernel's launches as a callable object ------------------------------ */

/* Launcher(function, grid, threads, shared_bytes, hidden, aligned, get_stream, device,
 *          hooks, fallback): calling it with the kernel's tensors launches the kernel, or,
 * while a Triton launch hook is installed (hooks: (holder, enter_name, exit_name)), when
 * an aligned-position tensor is not aligned, or when the launch fails, returns
 * fallback(*tensors). */
typedef struct {
    PyObject_HEAD
    unsigned long long function, grid[3], threads, shared;
    Py_ssize_t hidden;
    PyObject *aligned, *get_stream, *device, *holder, *enter, *exit, *fallback;
    vectorcallfunc vectorcall;
} Launcher;

static PyObject *calls_name = NULL;

/* Whether a Triton launch hook is installed now: the hook attribute is set and not an
 * empty HookChain (a chain with no `calls` attribute counts as set). */
static int hook_set(PyObject *holder, PyObject *name) {
    PyObject *hook = PyObject_GetAttr(holder, name);
    if (hook == NULL) {
        PyErr_Clear();
        return 0;
    }
    int set = 0;
    if (hook != Py_None) {
        PyObject *calls = PyObject_GetAttr(hook, calls_name);
        if (calls == NULL) {
            PyErr_Clear();
            set = 1;
        } else {
            set = PyObject_IsTrue(calls);
            Py_DECREF(calls);
            if (set < 0) {
                PyErr_Clear();
                set = 1;
            }
        }
    }
    Py_DECREF(hook);
    return set;
}

static PyObject *launcher_call(PyObject *obj, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Launcher *self = (Launcher *)obj;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "a kernel launch takes tensors only");
        return NULL;
    }
    if (hook_set(self->holder, self->enter) || hook_set(self->holder, self->exit))
        return PyObject_Vectorcall(self->fallback, args, n, NULL);
    PyObject *stream = PyObject_CallOneArg(self->get_stream, self->device);
    if (stream == NULL) return NULL;
    unsigned long long s;
    int bad = as_u64(stream, &s);
    Py_DECREF(stream);
    if (bad < 0) return NULL;
    int r = launch_tensors(self->function, self->grid, self->threads, self->shared,
                           (void *)(uintptr_t)s, self->hidden, args, n, self->aligned, NULL);
    if (r < 0 && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        /* the launch failed (no driver, no current context on this thread...): the
         * fallback's path reports it and stops using this launcher */
        PyErr_Clear();
        r = 0;
    }
    if (r < 0) return NULL;
    if (r == 0) return PyObject_Vectorcall(self->fallback, args, n, NULL);
    Py_RETURN_NONE;
}

static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *function, *grid, *threads, *shared, *hidden, *aligned, *get_stream, *device,
        *hooks, *fallback;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Launcher() takes positional arguments only");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "Launcher", 10, 10, &function, &grid, &threads, &shared,
                           &hidden, &aligned, &get_stream, &device, &hooks, &fallback))
        return NULL;
    if (!PyTuple_Check(grid) || PyTuple_GET_SIZE(grid) != 3 || !PyTuple_Check(aligned) ||
        !PyTuple_Check(hooks) || PyTuple_GET_SIZE(hooks) != 3 || !PyCallable_Check(get_stream) ||
        !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError,
                        "Launcher(function, grid: 3-tuple, threads, shared, hidden, aligned: "
                        "tuple, get_stream, device, hooks: (holder, enter, exit), fallback)");
        return NULL;
    }
    Launcher *self = (Launcher *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if (as_u64(function, &self->function) < 0 || as_u64(threads, &self->threads) < 0 ||
        as_u64(shared, &self->shared) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    for (int i = 0; i < 3; i++) {
        if (as_u64(PyTuple_GET_ITEM(grid, i), &self->grid[i]) < 0) {
            Py_DECREF(self);
            return NULL;
        }
    }
    self->hidden = PyLong_AsSsize_t(hidden);
    if (self->hidden == -1 && PyErr_Occurred()) {
        Py_DECREF(self);
        return NULL;
    }
    self->aligned = Py_NewRef(aligned);
    self->get_stream = Py_NewRef(get_stream);
    self->device = Py_NewRef(device);
    self->holder = Py_NewRef(PyTuple_GET_ITEM(hooks, 0));
    self->enter = Py_NewRef(PyTuple_GET_ITEM(hooks, 1));
    self->exit = Py_NewRef(PyTuple_GET_ITEM(hooks, 2));
    self->fallback = Py_NewRef(fallback);
    self->vectorcall = launcher_call;
    return (PyObject *)self;
}

static int launcher_traverse(Launcher *self, visitproc visit, void *arg) {
    Py_VISIT(self->aligned);
    Py_VISIT(self->get_stream);
    Py_VISIT(self->device);
    Py_VISIT(self->holder);
    Py_VISIT(self->enter);
    Py_VISIT(self->exit);
    Py_VISIT(self->fallback);
    return 0;
}

static int launcher_clear(Launcher *self) {
    Py_CLEAR(self->aligned);
    Py_CLEAR(self->get_stream);
    Py_CLEAR(self->device);
    Py_CLEAR(self->holder);
    Py_CLEAR(self->enter);
    Py_CLEAR(self->exit);
    Py_CLEAR(self->fallback);
    return 0;
}

static void launcher_dealloc(Launcher *self) {
    PyObject_GC_UnTrack(self);
    launcher_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln_triton._launch.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_dealloc = (destructor)launcher_dealloc,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "One kernel's launches: call it with the kernel's tensors.",
    .tp_traverse = (traverseproc)launcher_traverse,
    .tp_clear = (inquiry)launcher_clear,
    .tp_new = launcher_new,
};

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
    calls_name = PyUnicode_InternFromString("calls");
    if (data_ptr_name == NULL || calls_name == NULL) return NULL;
    if (PyType_Ready(&LauncherType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Launcher", (PyObject *)&LauncherType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
