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
 * Launcher is one kernel's launches as a callable object the wrapper calls with no Python
 * frame in between; SizedLauncher is the same for a kernel with symbolic sizes, looking
 * up what its owner decided for the call's exact sizes (grid, binary, block) in a dict.
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

/* -- Launcher and SizedLauncher: a kernel's launches as a callable object -------------- */

/* What both launcher objects hold besides their launch: the current stream's source
 * (get_stream(device)), Triton's launch hooks (hooks: (holder, enter_name, exit_name)) and
 * the fallback they call for Triton's path. */
typedef struct {
    PyObject *get_stream, *device, *holder, *enter, *exit, *fallback;
} Context;

static PyObject *calls_name = NULL;

/* Fill `c` from the constructor's arguments; 0, or -1 with a TypeError saying `usage`. */
static int context_init(Context *c, PyObject *get_stream, PyObject *device, PyObject *hooks,
                        PyObject *fallback, const char *usage) {
    if (!PyTuple_Check(hooks) || PyTuple_GET_SIZE(hooks) != 3 || !PyCallable_Check(get_stream) ||
        !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    c->get_stream = Py_NewRef(get_stream);
    c->device = Py_NewRef(device);
    c->holder = Py_NewRef(PyTuple_GET_ITEM(hooks, 0));
    c->enter = Py_NewRef(PyTuple_GET_ITEM(hooks, 1));
    c->exit = Py_NewRef(PyTuple_GET_ITEM(hooks, 2));
    c->fallback = Py_NewRef(fallback);
    return 0;
}

static int context_traverse(Context *c, visitproc visit, void *arg) {
    Py_VISIT(c->get_stream);
    Py_VISIT(c->device);
    Py_VISIT(c->holder);
    Py_VISIT(c->enter);
    Py_VISIT(c->exit);
    Py_VISIT(c->fallback);
    return 0;
}

static void context_clear(Context *c) {
    Py_CLEAR(c->get_stream);
    Py_CLEAR(c->device);
    Py_CLEAR(c->holder);
    Py_CLEAR(c->enter);
    Py_CLEAR(c->exit);
    Py_CLEAR(c->fallback);
}

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

static int hooked(const Context *c) {
    return hook_set(c->holder, c->enter) || hook_set(c->holder, c->exit);
}

/* One launch on the context's current stream (the tensors, then `sizes` if not NULL).
 * Returns 1 when launched, 0 when the fallback must run instead (a tensor at an aligned
 * position is not; or the launch failed, a RuntimeError such as no driver or no current
 * context, and with `lenient` also the argument errors Python's direct launch turns into
 * Triton's path: TypeError, OverflowError, IndexError), -1 with an exception. */
static int launch_current(const Context *c, unsigned long long function,
                          const unsigned long long grid[3], unsigned long long threads,
                          unsigned long long shared, Py_ssize_t hidden, PyObject *const *tensors,
                          Py_ssize_t n, PyObject *aligned, PyObject *sizes, int lenient) {
    PyObject *stream = PyObject_CallOneArg(c->get_stream, c->device);
    if (stream == NULL) return -1;
    unsigned long long s;
    int bad = as_u64(stream, &s);
    Py_DECREF(stream);
    if (bad < 0) return -1;
    int r = launch_tensors(function, grid, threads, shared, (void *)(uintptr_t)s, hidden, tensors,
                           n, aligned, sizes);
    if (r < 0 && (PyErr_ExceptionMatches(PyExc_RuntimeError) ||
                  (lenient && (PyErr_ExceptionMatches(PyExc_TypeError) ||
                               PyErr_ExceptionMatches(PyExc_OverflowError) ||
                               PyErr_ExceptionMatches(PyExc_IndexError))))) {
        /* the fallback's path reports it and stops using this launch */
        PyErr_Clear();
        r = 0;
    }
    return r;
}

/* The end of a call: None when launched (r == 1), the fallback's result (r == 0). */
static PyObject *finish(const Context *c, int r, PyObject *const *args, Py_ssize_t n) {
    if (r < 0) return NULL;
    if (r == 0) return PyObject_Vectorcall(c->fallback, args, n, NULL);
    Py_RETURN_NONE;
}

static int no_keywords(PyObject *kwnames) {
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "a kernel launch takes positional arguments only");
        return -1;
    }
    return 0;
}

/* Both types' deallocation: their tp_clear, then the memory. */
static void launcher_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    Py_TYPE(self)->tp_clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* Launcher(function, grid, threads, shared_bytes, hidden, aligned, get_stream, device,
 *          hooks, fallback): calling it with the kernel's tensors launches the kernel, or,
 * while a Triton launch hook is installed, when an aligned-position tensor is not aligned,
 * or when the launch fails, returns fallback(*tensors). */
typedef struct {
    PyObject_HEAD
    unsigned long long function, grid[3], threads, shared;
    Py_ssize_t hidden;
    PyObject *aligned;
    Context ctx;
    vectorcallfunc vectorcall;
} Launcher;

static PyObject *launcher_call(PyObject *obj, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Launcher *self = (Launcher *)obj;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (no_keywords(kwnames) < 0) return NULL;
    if (hooked(&self->ctx)) return finish(&self->ctx, 0, args, n);
    int r = launch_current(&self->ctx, self->function, self->grid, self->threads, self->shared,
                           self->hidden, args, n, self->aligned, NULL, 0);
    return finish(&self->ctx, r, args, n);
}

static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *function, *grid, *threads, *shared, *hidden, *aligned, *get_stream, *device,
        *hooks, *fallback;
    const char *usage = "Launcher(function, grid: 3-tuple, threads, shared, hidden, aligned: "
                        "tuple, get_stream, device, hooks: (holder, enter, exit), fallback)";
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "Launcher", 10, 10, &function, &grid, &threads, &shared,
                           &hidden, &aligned, &get_stream, &device, &hooks, &fallback))
        return NULL;
    if (!PyTuple_Check(grid) || PyTuple_GET_SIZE(grid) != 3 || !PyTuple_Check(aligned)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Launcher *self = (Launcher *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    int bad = as_u64(function, &self->function) < 0 || as_u64(threads, &self->threads) < 0 ||
              as_u64(shared, &self->shared) < 0;
    for (int i = 0; i < 3 && !bad; i++) bad = as_u64(PyTuple_GET_ITEM(grid, i), &self->grid[i]) < 0;
    if (!bad) {
        self->hidden = PyLong_AsSsize_t(hidden);
        bad = self->hidden == -1 && PyErr_Occurred();
    }
    if (bad || context_init(&self->ctx, get_stream, device, hooks, fallback, usage) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->aligned = Py_NewRef(aligned);
    self->vectorcall = launcher_call;
    return (PyObject *)self;
}

static int launcher_traverse(Launcher *self, visitproc visit, void *arg) {
    Py_VISIT(self->aligned);
    return context_traverse(&self->ctx, visit, arg);
}

static int launcher_clear(Launcher *self) {
    Py_CLEAR(self->aligned);
    context_clear(&self->ctx);
    return 0;
}

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln_triton._launch.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_dealloc = launcher_dealloc,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "One kernel's launches: call it with the kernel's tensors.",
    .tp_traverse = (traverseproc)launcher_traverse,
    .tp_clear = (inquiry)launcher_clear,
    .tp_new = launcher_new,
};

/* SizedLauncher(nsizes, table, get_stream, device, hooks, fallback): called with the
 * kernel's tensors and then its `nsizes` sizes (ints). `table` maps the tuple of sizes to
 * what its owner decided for them: None (nothing to launch at these sizes) or
 * (function, grid_x, grid_y, grid_z, threads, shared_bytes, hidden, aligned). Sizes not in
 * it, a launch hook, an aligned-position tensor that is not, or a launch that fails:
 * returns fallback(*args), which decides and fills the table. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t nsizes;
    PyObject *table;
    Context ctx;
    vectorcallfunc vectorcall;
} SizedLauncher;

/* `entry`'s launch (the layout above); 1 launched, 0 fall back, -1 error */
static int launch_entry(SizedLauncher *self, PyObject *entry, PyObject *const *args,
                        Py_ssize_t ntensors, PyObject *sizes) {
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 8 ||
        !PyTuple_Check(PyTuple_GET_ITEM(entry, 7))) {
        PyErr_SetString(PyExc_TypeError,
                        "SizedLauncher: a table entry is None or (function, grid_x, grid_y, "
                        "grid_z, threads, shared, hidden, aligned: tuple)");
        return -1;
    }
    unsigned long long v[6];
    for (int i = 0; i < 6; i++) {
        if (as_u64(PyTuple_GET_ITEM(entry, i), &v[i]) < 0) return -1;
    }
    Py_ssize_t hidden = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 6));
    if (hidden == -1 && PyErr_Occurred()) return -1;
    return launch_current(&self->ctx, v[0], &v[1], v[4], v[5], hidden, args, ntensors,
                          PyTuple_GET_ITEM(entry, 7), sizes, 1);
}

static PyObject *sized_call(PyObject *obj, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    SizedLauncher *self = (SizedLauncher *)obj;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (no_keywords(kwnames) < 0) return NULL;
    if (n < self->nsizes) return finish(&self->ctx, 0, args, n);
    PyObject *sizes = PyTuple_New(self->nsizes);
    if (sizes == NULL) return NULL;
    for (Py_ssize_t k = 0; k < self->nsizes; k++)
        PyTuple_SET_ITEM(sizes, k, Py_NewRef(args[n - self->nsizes + k]));
    PyObject *entry = PyDict_GetItemWithError(self->table, sizes); /* borrowed */
    int r = 0;
    if (entry == NULL) {
        if (PyErr_Occurred()) PyErr_Clear(); /* an unhashable size: the fallback decides */
    } else if (entry == Py_None) {
        r = 1; /* nothing to launch at these sizes */
    } else if (!hooked(&self->ctx)) {
        Py_INCREF(entry); /* get_stream may run Python code that changes the table */
        r = launch_entry(self, entry, args, n - self->nsizes, sizes);
        Py_DECREF(entry);
    }
    Py_DECREF(sizes);
    return finish(&self->ctx, r, args, n);
}

static PyObject *sized_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *nsizes, *table, *get_stream, *device, *hooks, *fallback;
    const char *usage = "SizedLauncher(nsizes, table: dict, get_stream, device, "
                        "hooks: (holder, enter, exit), fallback)";
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "SizedLauncher", 6, 6, &nsizes, &table, &get_stream, &device,
                           &hooks, &fallback))
        return NULL;
    if (!PyDict_CheckExact(table)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(nsizes);
    if (count == -1 && PyErr_Occurred()) return NULL;
    if (count < 1 || count > MAX_PARAMS) {
        PyErr_SetString(PyExc_ValueError, "SizedLauncher(): nsizes is between 1 and 256");
        return NULL;
    }
    SizedLauncher *self = (SizedLauncher *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if (context_init(&self->ctx, get_stream, device, hooks, fallback, usage) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->nsizes = count;
    self->table = Py_NewRef(table);
    self->vectorcall = sized_call;
    return (PyObject *)self;
}

static int sized_traverse(SizedLauncher *self, visitproc visit, void *arg) {
    Py_VISIT(self->table);
    return context_traverse(&self->ctx, visit, arg);
}

static int sized_clear(SizedLauncher *self) {
    Py_CLEAR(self->table);
    context_clear(&self->ctx);
    return 0;
}

static PyTypeObject SizedLauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln_triton._launch.SizedLauncher",
    .tp_basicsize = sizeof(SizedLauncher),
    .tp_dealloc = launcher_dealloc,
    .tp_vectorcall_offset = offsetof(SizedLauncher, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A kernel with symbolic sizes' launches: call it with its tensors, then sizes.",
    .tp_traverse = (traverseproc)sized_traverse,
    .tp_clear = (inquiry)sized_clear,
    .tp_new = sized_new,
};

/* ErrorReader(host, device_rows, nbytes, rows, get_stream, device): the host side of
 * kiln_inductor.index_check.DeviceIndexErrors on a GPU, with no torch call per graph call.
 * `host` and `device_rows` are addresses: page-locked host memory and the device tensor of
 * the error rows (`rows` rows of two int64: check number, bad index), `nbytes` long.
 * start() queues cuMemcpyDtoHAsync of the rows on the current stream and records an event
 * after it (False, with nothing queued, while the stream is being captured into a CUDA
 * graph); finish() waits for that event and says whether any row's check number is not 0
 * (None when start() queued nothing). torch's copy_ into pinned memory and a
 * torch.cuda.Event cost ~40 us of host time per call; these are two driver calls each. */
typedef int (*cu_memcpy_dtoh_async_t)(void *dst, unsigned long long src, size_t n, void *stream);
typedef int (*cu_event_create_t)(void **event, unsigned flags);
typedef int (*cu_event_record_t)(void *event, void *stream);
typedef int (*cu_event_synchronize_t)(void *event);
typedef int (*cu_event_destroy_t)(void *event);
typedef int (*cu_stream_is_capturing_t)(void *stream, int *status);

static cu_memcpy_dtoh_async_t cu_memcpy_dtoh_async = NULL;
static cu_event_create_t cu_event_create = NULL;
static cu_event_record_t cu_event_record = NULL;
static cu_event_synchronize_t cu_event_synchronize = NULL;
static cu_event_destroy_t cu_event_destroy = NULL;
static cu_stream_is_capturing_t cu_stream_is_capturing = NULL;

static int load_copy_driver(void) {
    if (cu_event_synchronize != NULL) return 0;
    if (load_driver() < 0) return -1;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_RuntimeError, "kiln_triton: cannot open libcuda.so.1 (%s)", dlerror());
        return -1;
    }
    cu_memcpy_dtoh_async = (cu_memcpy_dtoh_async_t)dlsym(lib, "cuMemcpyDtoHAsync_v2");
    cu_event_create = (cu_event_create_t)dlsym(lib, "cuEventCreate");
    cu_event_record = (cu_event_record_t)dlsym(lib, "cuEventRecord");
    cu_event_destroy = (cu_event_destroy_t)dlsym(lib, "cuEventDestroy_v2");
    cu_stream_is_capturing = (cu_stream_is_capturing_t)dlsym(lib, "cuStreamIsCapturing");
    cu_event_synchronize = (cu_event_synchronize_t)dlsym(lib, "cuEventSynchronize");
    if (cu_memcpy_dtoh_async == NULL || cu_event_create == NULL || cu_event_record == NULL ||
        cu_event_destroy == NULL || cu_stream_is_capturing == NULL ||
        cu_event_synchronize == NULL) {
        cu_event_synchronize = NULL;
        PyErr_SetString(PyExc_RuntimeError,
                        "kiln_triton: libcuda lacks cuMemcpyDtoHAsync_v2/cuEvent*/cuStreamIsCapturing");
        return -1;
    }
    return 0;
}

static int cuda_check(int err, const char *what) {
    if (err == 0) return 0;
    const char *text = NULL;
    if (cu_get_error_string != NULL) cu_get_error_string(err, &text);
    PyErr_Format(PyExc_RuntimeError, "kiln_triton: %s failed: CUDA error %d (%s)", what, err,
                 text != NULL ? text : "unknown");
    return -1;
}

typedef struct {
    PyObject_HEAD
    unsigned long long host, rows_ptr, nbytes;
    Py_ssize_t rows;
    PyObject *get_stream, *device;
    void *event;
    int started;
} ErrorReader;

static PyObject *reader_start(ErrorReader *self, PyObject *unused) {
    (void)unused;
    if (load_copy_driver() < 0) return NULL;
    PyObject *stream = PyObject_CallOneArg(self->get_stream, self->device);
    if (stream == NULL) return NULL;
    unsigned long long s;
    int bad = as_u64(stream, &s);
    Py_DECREF(stream);
    if (bad < 0) return NULL;
    int status = 0;
    if (cuda_check(cu_stream_is_capturing((void *)(uintptr_t)s, &status), "cuStreamIsCapturing"))
        return NULL;
    self->started = 0;
    if (status != 0) Py_RETURN_FALSE; /* being captured: the runner checks after replays */
    if (self->event == NULL &&
        cuda_check(cu_event_create(&self->event, 2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate"))
        return NULL;
    if (cuda_check(cu_memcpy_dtoh_async((void *)(uintptr_t)self->host, self->rows_ptr,
                                        (size_t)self->nbytes, (void *)(uintptr_t)s),
                   "cuMemcpyDtoHAsync") ||
        cuda_check(cu_event_record(self->event, (void *)(uintptr_t)s), "cuEventRecord"))
        return NULL;
    self->started = 1;
    Py_RETURN_TRUE;
}

static PyObject *reader_finish(ErrorReader *self, PyObject *unused) {
    (void)unused;
    if (!self->started) Py_RETURN_NONE;
    self->started = 0;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = cu_event_synchronize(self->event);
    Py_END_ALLOW_THREADS
    if (cuda_check(err, "cuEventSynchronize")) return NULL;
    const int64_t *rows = (const int64_t *)(uintptr_t)self->host;
    for (Py_ssize_t k = 0; k < self->rows; k++) {
        if (rows[2 * k] != 0) Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *host, *rows_ptr, *nbytes, *rows, *get_stream, *device;
    const char *usage = "ErrorReader(host, device_rows, nbytes, rows, get_stream, device)";
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "ErrorReader", 6, 6, &host, &rows_ptr, &nbytes, &rows,
                           &get_stream, &device))
        return NULL;
    if (!PyCallable_Check(get_stream)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    ErrorReader *self = (ErrorReader *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    int bad = as_u64(host, &self->host) < 0 || as_u64(rows_ptr, &self->rows_ptr) < 0 ||
              as_u64(nbytes, &self->nbytes) < 0;
    if (!bad) {
        self->rows = PyLong_AsSsize_t(rows);
        bad = self->rows == -1 && PyErr_Occurred();
    }
    if (!bad && (self->rows < 0 || (unsigned long long)self->rows * 16 > self->nbytes ||
                 self->host == 0 || self->rows_ptr == 0)) {
        PyErr_SetString(PyExc_ValueError,
                        "ErrorReader(): rows * 16 bytes must fit nbytes; addresses not 0");
        bad = 1;
    }
    if (bad) {
        Py_DECREF(self);
        return NULL;
    }
    self->get_stream = Py_NewRef(get_stream);
    self->device = Py_NewRef(device);
    return (PyObject *)self;
}

static int reader_traverse(ErrorReader *self, visitproc visit, void *arg) {
    Py_VISIT(self->get_stream);
    Py_VISIT(self->device);
    return 0;
}

static int reader_clear(ErrorReader *self) {
    Py_CLEAR(self->get_stream);
    Py_CLEAR(self->device);
    return 0;
}

static void reader_dealloc(ErrorReader *self) {
    PyObject_GC_UnTrack(self);
    if (self->event != NULL && cu_event_destroy != NULL) cu_event_destroy(self->event);
    reader_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef reader_methods[] = {
    {"start", (PyCFunction)reader_start, METH_NOARGS,
     "queue the rows' copy to the host and an event; False while the stream is captured"},
    {"finish", (PyCFunction)reader_finish, METH_NOARGS,
     "wait for start()'s copy: True when a check failed, None when nothing was queued"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ErrorReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln_triton._launch.ErrorReader",
    .tp_basicsize = sizeof(ErrorReader),
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The host read of a graph's index-check error rows: start(), then finish().",
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_methods = reader_methods,
    .tp_new = reader_new,
};

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, grid_x, grid_y, grid_z, threads, shared_bytes, stream, hidden, tensors, "
     "aligned) -> False when a tensor at an `aligned` position is not 16-byte aligned"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_launch", "cuLaunchKernel for Triton kernels taking tensors and sizes",
    -1, methods};

PyMODINIT_FUNC PyInit__launch(void) {
    data_ptr_name = PyUnicode_InternFromString("data_ptr");
    calls_name = PyUnicode_InternFromString("calls");
    if (data_ptr_name == NULL || calls_name == NULL) return NULL;
    if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&SizedLauncherType) < 0 ||
        PyType_Ready(&ErrorReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Launcher", (PyObject *)&LauncherType) < 0 ||
        PyModule_AddObjectRef(m, "SizedLauncher", (PyObject *)&SizedLauncherType) < 0 ||
        PyModule_AddObjectRef(m, "ErrorReader", (PyObject *)&ErrorReaderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
