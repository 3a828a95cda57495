/* Compiled graph probes: the kernels of the GRAPH_MODE observers and gradient probes as
 * ``mindspore.ops.Custom(func_type="aot")`` functions, and the Python module that takes what they
 * copied (msprobe/capture/cells/graph_probes.py, "Compiled probes").
 *
 * MindSpore loads this file (dlopen) and calls the two kernels on its executor threads, inside a
 * running graph, with the signature of its aot custom operators:
 *
 *     int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
 *           void *stream, void *extra)
 *
 * (inputs, then outputs; CPU memory). Python imports the same file as an extension module, so both
 * see one copy of the state below. A kernel takes no Python lock and calls no Python code: it copies
 * the tensors wanted into memory of its own and appends a report to its capture's queue, under a
 * mutex; ``take`` hands the reports to Python, each copy as a ``Buffer`` (buffer protocol, freed
 * with the last reference to it).
 *
 * The first input of every kernel is a constant int32 ``code``: the capture's number in the high
 * bits (``code >> CODE_BITS``), the probed Cell's (or optimizer chunk's) number in the low ones.
 *
 * observe(code, kind, x0, ..., x{n-1}) -> token (int32[1], set to 0):
 *     kind >= 0: a whole call, ``kind`` inputs then the outputs; ENTER (-1): a call's inputs; EXIT
 *     (-2): its outputs; GRADIENTS (-3): the gradients an optimizer receives. Reported while the
 *     capture's ``forward`` flag is on; inputs copied when ``inputs`` is wanted, outputs when
 *     ``outputs`` is, gradients always (a group not wanted is reported as None).
 * gradient(code, d0, ..., d{n-1}) -> (d0, ..., d{n-1}):
 *     copies each input to its output (the same bytes), and, while the capture's ``gradients`` flag
 *     is on, reports them as kind OUTPUT_GRADS (-4), copied when ``gradients`` is wanted.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CODE_BITS 20
#define ENTER (-1)
#define EXIT (-2)
#define GRADIENTS (-3)
#define OUTPUT_GRADS (-4)
#define DTYPE_CHARS 16

typedef struct {
    void *data;
    size_t nbytes;
    char dtype[DTYPE_CHARS];
    int ndim;
    int64_t *shape;
} Array;

typedef struct {
    int32_t kind, code;
    int groups;     /* 1, or 2 for a whole call */
    int count[2];   /* arrays of each group, -1: not wanted (None) */
    Array *arrays;  /* count[0] + count[1] (the ones wanted) */
} Report;

typedef struct {
    int forward, gradients;            /* what is reported now */
    int inputs, outputs, grads;        /* what is copied */
    Report *reports;
    size_t n, capacity;
    unsigned long lost;                /* reports dropped: no memory */
} Capture;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Capture *captures = NULL;  /* by number; never moved while a kernel holds the lock */
static size_t n_captures = 0;

static size_t element_size(const char *dtype)
{
    static const struct { const char *name; size_t size; } sizes[] = {
        {"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"float64", 8}, {"float", 4},
        {"int32", 4}, {"int64", 8}, {"int16", 2}, {"int8", 1}, {"int", 4},
        {"uint8", 1}, {"uint16", 2}, {"uint32", 4}, {"uint64", 8}, {"uint", 4},
        {"bool", 1}, {"complex64", 8}, {"complex128", 16},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (strcmp(dtype, sizes[i].name) == 0)
            return sizes[i].size;
    return 0;
}

static void free_arrays(Array *arrays, int n)
{
    for (int i = 0; i < n; i++) {
        free(arrays[i].data);
        free(arrays[i].shape);
    }
    free(arrays);
}

/* Copy tensor ``i`` of the kernel's parameters into ``a``; 0 on success. */
static int copy_tensor(Array *a, int i, void **params, int *ndims, int64_t **shapes, const char **dtypes)
{
    size_t n = element_size(dtypes[i]);
    if (n == 0 || strlen(dtypes[i]) >= DTYPE_CHARS)
        return -1;
    a->ndim = ndims[i];
    a->shape = malloc(sizeof(int64_t) * (a->ndim > 0 ? a->ndim : 1));
    if (a->shape == NULL)
        return -1;
    for (int d = 0; d < a->ndim; d++) {
        a->shape[d] = shapes[i][d];
        n *= (size_t)shapes[i][d];
    }
    a->nbytes = n;
    a->data = malloc(n > 0 ? n : 1);
    if (a->data == NULL)
        return -1;
    if (n > 0)
        memcpy(a->data, params[i], n);
    strcpy(a->dtype, dtypes[i]);
    return 0;
}

/* Report tensors ``first`` .. of the parameters in groups of ``sizes`` (``wanted[g]``: copied). */
static void report(int32_t code, int32_t kind, int groups, const int *sizes, const int *wanted, int first,
                   void **params, int *ndims, int64_t **shapes, const char **dtypes)
{
    uint32_t number = (uint32_t)code >> CODE_BITS;
    Report r = {kind, (int32_t)((uint32_t)code & ((1u << CODE_BITS) - 1)), groups, {-1, -1}, NULL};
    int total = 0;
    for (int g = 0; g < groups; g++)
        if (wanted[g]) {
            r.count[g] = sizes[g];
            total += sizes[g];
        }
    r.arrays = calloc(total > 0 ? total : 1, sizeof(Array));
    int ok = r.arrays != NULL;
    for (int g = 0, j = 0, i = first; ok && g < groups; i += sizes[g], g++)
        for (int k = 0; ok && wanted[g] && k < sizes[g]; k++, j++)
            ok = copy_tensor(&r.arrays[j], i + k, params, ndims, shapes, dtypes) == 0;
    pthread_mutex_lock(&lock);
    Capture *c = number < n_captures ? &captures[number] : NULL;
    int keep = c != NULL && (kind == OUTPUT_GRADS ? c->gradients : c->forward);
    if (keep && ok && c->n == c->capacity) {
        size_t capacity = c->capacity ? 2 * c->capacity : 64;
        Report *grown = realloc(c->reports, capacity * sizeof(Report));
        if (grown == NULL) {
            ok = 0;
        } else {
            c->reports = grown;
            c->capacity = capacity;
        }
    }
    if (keep && ok)
        c->reports[c->n++] = r;
    else if (keep)
        c->lost++;
    pthread_mutex_unlock(&lock);
    if (!(keep && ok) && r.arrays != NULL)
        free_arrays(r.arrays, total);
}

/* The capture a code names, or NULL (call with the lock held: ``captures`` may move). */
static Capture *capture_of(int32_t code)
{
    uint32_t number = (uint32_t)code >> CODE_BITS;
    return number < n_captures ? &captures[number] : NULL;
}

__attribute__((visibility("default")))
int msprobe_observe(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra)
{
    (void)stream;
    (void)extra;
    int32_t code = *(int32_t *)params[0], kind = *(int32_t *)params[1];
    *(int32_t *)params[nparam - 1] = 0;
    int n = nparam - 3;  /* code, kind, token */
    pthread_mutex_lock(&lock);
    Capture *c = capture_of(code);
    int on = c != NULL && c->forward;
    int inputs = on && c->inputs, outputs = on && c->outputs;
    pthread_mutex_unlock(&lock);
    if (!on)
        return 0;
    if (kind >= 0 && kind <= n) {
        int sizes[2] = {kind, n - kind}, wanted[2] = {inputs, outputs};
        report(code, kind, 2, sizes, wanted, 2, params, ndims, shapes, dtypes);
    } else {
        int sizes[1] = {n};
        int wanted[1] = {kind == GRADIENTS || (kind == ENTER ? inputs : outputs)};
        report(code, kind, 1, sizes, wanted, 2, params, ndims, shapes, dtypes);
    }
    return 0;
}

__attribute__((visibility("default")))
int msprobe_gradient(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra)
{
    (void)stream;
    (void)extra;
    int n = (nparam - 1) / 2;  /* code, n gradients, n outputs */
    for (int i = 0; i < n; i++) {
        size_t size = element_size(dtypes[1 + i]);
        for (int d = 0; d < ndims[1 + i]; d++)
            size *= (size_t)shapes[1 + i][d];
        if (size > 0)
            memcpy(params[1 + n + i], params[1 + i], size);
        else if (element_size(dtypes[1 + i]) == 0)
            return 1;  /* a dtype this file does not know: MindSpore raises (never met: see graph_probes) */
    }
    int32_t code = *(int32_t *)params[0];
    pthread_mutex_lock(&lock);
    Capture *c = capture_of(code);
    int on = c != NULL && c->gradients;
    int wanted[1] = {on && c->grads};
    pthread_mutex_unlock(&lock);
    if (on) {
        int sizes[1] = {n};
        report(code, OUTPUT_GRADS, 1, sizes, wanted, 1, params, ndims, shapes, dtypes);
    }
    return 0;
}

/* ------------------------------------------------------------------ Buffer */
typedef struct {
    PyObject_HEAD
    void *data;
    Py_ssize_t nbytes;
} Buffer;

static int buffer_get(PyObject *self, Py_buffer *view, int flags)
{
    Buffer *b = (Buffer *)self;
    return PyBuffer_FillInfo(view, self, b->data, b->nbytes, 0, flags);
}

static void buffer_dealloc(PyObject *self)
{
    free(((Buffer *)self)->data);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs buffer_procs = {buffer_get, NULL};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe.capture.cells._graph_probe.Buffer",
    .tp_basicsize = sizeof(Buffer),
    .tp_dealloc = buffer_dealloc,
    .tp_as_buffer = &buffer_procs,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "memory a graph probe copied a tensor into (writable, freed with the object)",
};

/* (Buffer, dtype, shape) of an array; its memory passes to the Buffer. */
static PyObject *array_item(Array *a)
{
    PyObject *shape = PyTuple_New(a->ndim);
    if (shape == NULL)
        return NULL;
    for (int d = 0; d < a->ndim; d++) {
        PyObject *v = PyLong_FromLongLong(a->shape[d]);
        if (v == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, d, v);
    }
    Buffer *b = PyObject_New(Buffer, &BufferType);
    if (b == NULL) {
        Py_DECREF(shape);
        return NULL;
    }
    b->data = a->data;
    b->nbytes = (Py_ssize_t)a->nbytes;
    a->data = NULL;
    PyObject *item = Py_BuildValue("(NsN)", (PyObject *)b, a->dtype, shape);
    return item;
}

/* The Python tuple of a report: (kind, code, group, ...), a group a list of array items or None. */
static PyObject *report_item(Report *r)
{
    PyObject *item = PyTuple_New(2 + r->groups);
    if (item == NULL)
        return NULL;
    PyTuple_SET_ITEM(item, 0, PyLong_FromLong(r->kind));
    PyTuple_SET_ITEM(item, 1, PyLong_FromLong(r->code));
    int j = 0;
    for (int g = 0; g < r->groups; g++) {
        PyObject *group;
        if (r->count[g] < 0) {
            Py_INCREF(Py_None);
            group = Py_None;
        } else {
            group = PyList_New(r->count[g]);
            for (int k = 0; group != NULL && k < r->count[g]; k++, j++) {
                PyObject *a = array_item(&r->arrays[j]);
                if (a == NULL)
                    Py_CLEAR(group);
                else
                    PyList_SET_ITEM(group, k, a);
            }
        }
        if (group == NULL) {
            Py_DECREF(item);
            return NULL;
        }
        PyTuple_SET_ITEM(item, 2 + g, group);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(item);
        return NULL;
    }
    return item;
}

static int report_size(Report *r)
{
    return (r->count[0] > 0 ? r->count[0] : 0) + (r->count[1] > 0 ? r->count[1] : 0);
}

static PyObject *py_new_capture(PyObject *self, PyObject *args)
{
    int inputs, outputs, grads;
    if (!PyArg_ParseTuple(args, "ppp", &inputs, &outputs, &grads))
        return NULL;
    pthread_mutex_lock(&lock);
    if (n_captures >= (1u << (31 - CODE_BITS))) {
        pthread_mutex_unlock(&lock);
        PyErr_SetString(PyExc_OverflowError, "too many graph probe captures in this process");
        return NULL;
    }
    Capture *grown = realloc(captures, (n_captures + 1) * sizeof(Capture));
    if (grown == NULL) {
        pthread_mutex_unlock(&lock);
        return PyErr_NoMemory();
    }
    captures = grown;
    size_t number = n_captures++;
    memset(&captures[number], 0, sizeof(Capture));
    captures[number].inputs = inputs;
    captures[number].outputs = outputs;
    captures[number].grads = grads;
    pthread_mutex_unlock(&lock);
    return PyLong_FromSize_t(number);
}

static Capture *checked(Py_ssize_t number)
{
    if (number < 0 || (size_t)number >= n_captures) {
        PyErr_SetString(PyExc_ValueError, "no such graph probe capture");
        return NULL;
    }
    return &captures[number];
}

static PyObject *py_set_flags(PyObject *self, PyObject *args)
{
    Py_ssize_t number;
    int forward, gradients;
    if (!PyArg_ParseTuple(args, "npp", &number, &forward, &gradients))
        return NULL;
    pthread_mutex_lock(&lock);
    Capture *c = checked(number);
    if (c != NULL) {
        c->forward = forward;
        c->gradients = gradients;
    }
    pthread_mutex_unlock(&lock);
    if (c == NULL)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_take(PyObject *self, PyObject *arg)
{
    Py_ssize_t number = PyLong_AsSsize_t(arg);
    if (number == -1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&lock);
    Capture *c = checked(number);
    Report *reports = NULL;
    size_t n = 0;
    unsigned long lost = 0;
    if (c != NULL) {
        reports = c->reports;
        n = c->n;
        lost = c->lost;
        c->reports = NULL;
        c->n = c->capacity = 0;
        c->lost = 0;
    }
    pthread_mutex_unlock(&lock);
    if (c == NULL)
        return NULL;
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        PyObject *item = list != NULL ? report_item(&reports[i]) : NULL;
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
        free_arrays(reports[i].arrays, report_size(&reports[i]));  /* data taken by Buffers is NULL */
    }
    free(reports);
    if (list == NULL)
        return NULL;
    return Py_BuildValue("(Nk)", list, lost);
}

static PyMethodDef methods[] = {
    {"new_capture", py_new_capture, METH_VARARGS,
     "new_capture(inputs, outputs, gradients) -> number: a capture copying forward inputs, outputs, "
     "gradients as wanted; its flags start off"},
    {"set_flags", py_set_flags, METH_VARARGS,
     "set_flags(number, forward, gradients): what the capture's probes report from now on"},
    {"take", py_take, METH_O,
     "take(number) -> (reports, lost): the capture's reports so far, in the order the probes made them, "
     "each (kind, code, group, ...) with a group None or [(Buffer, dtype name, shape), ...]; lost: reports "
     "dropped for want of memory"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_graph_probe",
    "Compiled GRAPH_MODE probes (mindspore.ops.Custom aot kernels) and the reports they make.", -1, methods,
};

PyMODINIT_FUNC PyInit__graph_probe(void)
{
    if (PyType_Ready(&BufferType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "CODE_BITS", CODE_BITS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
