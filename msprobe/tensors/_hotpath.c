/* The per-call path of the dump in C: describing a call's values into pending tensor slots, filling
 * the slots' leaves with statistics at flush time, and resolving journal records. Each function
 * does what the Python code it stands for does (msprobe/tensors/hotpath.py names them), for the
 * common cases only; everything else is handed back to that Python code, so both give the same
 * records.
 *
 * Python API (configured once by msprobe.tensors.hotpath through setup()):
 *   TensorSlot(tensor, data_name, dtype, shape, type_name)   the pending slot type (records.py)
 *   describe(value, snapshot, slots, fallback) -> record structure
 *       exact None/bool/int/float/str, Tensor, exact list/tuple/dict, MindSpore dtype objects (after
 *       setup_calls()) here; anything else is fallback(value, depth, slots, snapshot). A Tensor becomes a TensorSlot appended to `slots`, its tensor
 *       snapshot(t) when it is a Parameter, no file name.
 *   fill(slots, md5=False) -> None
 *       leaves of CPU tensors read in place (native dtype, at least one element, no file name;
 *       a non-contiguous one is copied in C order first, as the Python flush does), and of C-contiguous host snapshots (numpy arrays) of such tensors, through the
 *       statistics kernel, with the "md5" field (CRC-32 of the same bytes) when md5 is true; other
 *       slots keep leaf None for the Python flush. Each distinct memory (address, elements, kind)
 *       is read once, however many tensor objects show it. Call only when every queued operation
 *       has finished (flush.materialize checks it).
 *   fill_parameters(slots, md5=False) -> int
 *       fill()'s leaves, computed now, for the slots whose tensor is a Parameter itself (not a
 *       snapshot) in host memory: initialised, contiguous, native dtype, at least one dimension and
 *       one element, no file name; each filled slot drops its Parameter (tensor None). Call only
 *       when the Parameter's data are final (CPU, synchronous launch): the optimizer changes it in
 *       place later. Returns how many slots were filled; the others are left as they were.
 *   resolve(record) -> (record with slots replaced by their leaves, holds a non-finite float)
 *   encode_lines(records, encode) -> (journal text (bytearray), resolved records, any non-finite float)
 *   stack_key(skip, limit) -> (id(code), f_lasti, ...) of the calling frames (stacks.py)
 *   grad_node(value), grad_targets(args)   backward.py's _node_of and _targets (after setup_calls())
 *   slots_nbytes(slots) -> sum of slot.nbytes()
 *
 * Plain CPython C API: nothing to build it but a C compiler.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64

/* ------------------------------------------------------------------ configuration (setup) */
static PyObject *TensorType;     /* mindspore.Tensor */
static PyObject *ParameterType;  /* mindspore.Parameter */
static PyObject *DtypeNames;     /* dict: MindSpore dtype -> dump.json name */
static PyObject *Kinds;          /* dict: dump.json name -> (kernel kind, itemsize) */
static PyObject *ScanFunc;       /* msprobe.tensors._stats_kernel.scan */
static PyObject *CrcFunc;        /* crc32 of a buffer (zlib-ng, or zlib): what stats.crc32_hex calls */
static PyObject *ArrayType;      /* numpy.ndarray */
static PyObject *ContigFunc;     /* TensorPy.is_contiguous (what Tensor.is_contiguous calls) */
static PyObject *PtrFunc;        /* TensorPy._data_ptr (what Tensor.data_ptr calls) */
static PyObject *StrideFunc;     /* TensorPy.stride (what Tensor.stride calls), in elements */
static PyObject *EncodeFunc;     /* orjson.dumps */
static PyObject *EncodeOption;   /* orjson.OPT_APPEND_NEWLINE */
static PyObject *EncodeKwnames;  /* ("option",) */
static PyObject *FreeCpusFunc;   /* msprobe.tensors.scan.free_cpus: threads for a large tensor */
static Py_ssize_t Split = 1 << 21;
static double Tiny;              /* smallest normal float64 */

static PyObject *S_md5, *S_type, *S_value, *S_dtype, *S_shape, *S_Max, *S_Min, *S_Mean, *S_Norm;
static PyObject *S_tensor_type, *S_int, *S_float, *S_str, *S_bool, *S_leaf;
static PyObject *S_a_dtype, *S_a_shape, *S_a_init, *S_empty_tuple;
static PyObject *S_has_init;
/* set by setup_calls() (NULL until then: those paths are not taken) */
static PyObject *DtypeBase;      /* mindspore.common.dtype.Type: dtype objects described in C */
static PyObject *FloatDtypes;    /* frozenset of the floating-point dtypes that take gradients */
static PyObject *S_ms_dtype, *S_grad_node, *S_requires_grad, *S_output_index, *S_unique_id, *S_class;
static PyObject *S_input_metadata, *S_next_functions, *S_is_leaf, *S_name, *S_Contiguous;

/* ------------------------------------------------------------------ TensorSlot */
typedef struct {
    PyObject_HEAD
    PyObject *tensor, *data_name, *dtype, *shape, *type_name, *leaf;
} Slot;

static PyTypeObject SlotType;

static int slot_traverse(Slot *s, visitproc visit, void *arg) {
    Py_VISIT(s->tensor); Py_VISIT(s->data_name); Py_VISIT(s->dtype); Py_VISIT(s->shape);
    Py_VISIT(s->type_name); Py_VISIT(s->leaf);
    return 0;
}

static int slot_clear(Slot *s) {
    Py_CLEAR(s->tensor); Py_CLEAR(s->data_name); Py_CLEAR(s->dtype); Py_CLEAR(s->shape);
    Py_CLEAR(s->type_name); Py_CLEAR(s->leaf);
    return 0;
}

static void slot_dealloc(Slot *s) {
    PyObject_GC_UnTrack(s);
    slot_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* a new slot; steals nothing */
static Slot *slot_make(PyObject *tensor, PyObject *data_name, PyObject *dtype, PyObject *shape,
                       PyObject *type_name) {
    Slot *s = PyObject_GC_New(Slot, &SlotType);
    if (s == NULL) return NULL;
    Py_INCREF(tensor); s->tensor = tensor;
    Py_INCREF(data_name); s->data_name = data_name;
    Py_INCREF(dtype); s->dtype = dtype;
    Py_INCREF(shape); s->shape = shape;
    Py_INCREF(type_name); s->type_name = type_name;
    Py_INCREF(Py_None); s->leaf = Py_None;
    PyObject_GC_Track(s);
    return s;
}

static PyObject *slot_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"tensor", "data_name", "dtype", "shape", "type_name", NULL};
    PyObject *tensor, *data_name, *dtype, *shape, *type_name;
    (void)type;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:TensorSlot", keywords, &tensor, &data_name, &dtype,
                                     &shape, &type_name))
        return NULL;
    return (PyObject *)slot_make(tensor, data_name, dtype, shape, type_name);
}

static PyObject *slot_nbytes(Slot *s, PyObject *unused) {
    (void)unused;
    long long n = 1;
    PyObject *it = PyObject_GetIter(s->shape);
    if (it == NULL) return NULL;
    PyObject *d;
    while ((d = PyIter_Next(it)) != NULL) {
        long long v = PyLong_AsLongLong(d);
        Py_DECREF(d);
        if (v == -1 && PyErr_Occurred()) { Py_DECREF(it); return NULL; }
        n *= v;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(n * 4);
}

static PyMethodDef slot_methods[] = {
    {"nbytes", (PyCFunction)slot_nbytes, METH_NOARGS,
     "nbytes() -> int: elements of `shape` times 4 (what the flush thresholds count)."},
    {NULL, NULL, 0, NULL},
};

/* T_OBJECT: a cleared member reads as None */
static PyMemberDef slot_members[] = {
    {"tensor", T_OBJECT, offsetof(Slot, tensor), 0, "the tensor (or its snapshot), a numpy array, or None"},
    {"data_name", T_OBJECT, offsetof(Slot, data_name), 0, ".npy file name, or None"},
    {"dtype", T_OBJECT, offsetof(Slot, dtype), 0, "dump.json dtype string"},
    {"shape", T_OBJECT, offsetof(Slot, shape), 0, "list of ints"},
    {"type_name", T_OBJECT, offsetof(Slot, type_name), 0, "'mindspore.Tensor' or 'numpy.ndarray'"},
    {"leaf", T_OBJECT, offsetof(Slot, leaf), 0, "the finished dump.json leaf (dict), or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe.tensors._hotpath.TensorSlot",
    .tp_basicsize = sizeof(Slot),
    .tp_dealloc = (destructor)slot_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "TensorSlot(tensor, data_name, dtype, shape, type_name): a tensor waiting for its statistics.",
    .tp_traverse = (traverseproc)slot_traverse,
    .tp_clear = (inquiry)slot_clear,
    .tp_methods = slot_methods,
    .tp_members = slot_members,
    .tp_new = slot_new,
};

/* ------------------------------------------------------------------ describe */
static PyObject *TensorKinds;    /* dict: type -> isinstance(value of that type, mindspore.Tensor) */
#define MAX_KEPT_TYPES 4096      /* types kept at most (each is kept alive): classes made at run time */
static PyObject *ObjectClass;    /* object.__class__ (the descriptor) */

/* isinstance(v, Tensor). mindspore.Tensor is an ABC whose __subclasshook__ looks at the type's MRO, so
 * the answer is a function of the type as long as the type does not redefine __class__ (which
 * ABCMeta.__instancecheck__ also consults): kept per such type, saving the ABC machinery (~0.6 us). */
static int is_tensor(PyObject *v) {
    PyTypeObject *tp = Py_TYPE(v);
    if ((PyObject *)tp == TensorType) return 1;
    PyObject *hit = PyDict_GetItemWithError(TensorKinds, (PyObject *)tp);
    if (hit != NULL) return hit == Py_True;
    if (PyErr_Occurred()) return -1;
    int r = PyObject_IsInstance(v, TensorType);
    if (r < 0) return -1;
    if (PyDict_GET_SIZE(TensorKinds) < MAX_KEPT_TYPES && _PyType_Lookup(tp, S_class) == ObjectClass &&
        PyDict_SetItem(TensorKinds, (PyObject *)tp, r ? Py_True : Py_False) < 0)
        return -1;
    return r;
}

static int is_instance(PyObject *v, PyObject *cls) {
    if ((PyObject *)Py_TYPE(v) == cls) return 1;
    if (cls == TensorType) return is_tensor(v);
    return PyObject_IsInstance(v, cls);
}

static PyObject *scalar_leaf(PyObject *name, PyObject *v) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    if (PyDict_SetItem(d, S_type, name) < 0 || PyDict_SetItem(d, S_value, v) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *tensor_slot(PyObject *t, PyObject *snapshot, PyObject *slots) {
    int exact = (PyObject *)Py_TYPE(t) == TensorType;
    PyObject *held;
    if (!exact) {
        int p = is_instance(t, ParameterType);
        if (p < 0) return NULL;
        held = p ? PyObject_CallOneArg(snapshot, t) : (Py_INCREF(t), t);
        if (held == NULL) return NULL;
    } else {
        Py_INCREF(t);
        held = t;
    }
    PyObject *dtype = PyObject_GetAttr(t, exact ? S_a_dtype : S_dtype);
    if (dtype == NULL) { Py_DECREF(held); return NULL; }
    PyObject *name = PyDict_GetItemWithError(DtypeNames, dtype);  /* borrowed */
    if (name != NULL) Py_INCREF(name);
    else if (!PyErr_Occurred()) name = PyObject_Str(dtype);
    Py_DECREF(dtype);
    if (name == NULL) { Py_DECREF(held); return NULL; }
    PyObject *shape = PyObject_GetAttr(t, exact ? S_a_shape : S_shape), *list = NULL;
    if (shape != NULL) { list = PySequence_List(shape); Py_DECREF(shape); }
    if (list == NULL) { Py_DECREF(held); Py_DECREF(name); return NULL; }
    Slot *s = slot_make(held, Py_None, name, list, S_tensor_type);
    Py_DECREF(held); Py_DECREF(name); Py_DECREF(list);
    if (s == NULL) return NULL;
    if (PyList_Append(slots, (PyObject *)s) < 0) { Py_DECREF(s); return NULL; }
    return (PyObject *)s;
}

static PyObject *describe_value(PyObject *v, int depth, PyObject *snapshot, PyObject *slots, PyObject *fallback);

static PyObject *describe_items(PyObject *seq, int depth, PyObject *snapshot, PyObject *slots,
                                PyObject *fallback) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = describe_value(items[i], depth + 1, snapshot, slots, fallback);
        if (d == NULL) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, d);
    }
    return out;
}

static PyObject *describe_value(PyObject *v, int depth, PyObject *snapshot, PyObject *slots, PyObject *fallback) {
    PyTypeObject *tp = Py_TYPE(v);
    if (v == Py_None) Py_RETURN_NONE;
    /* exact builtins first: no Tensor is one of them */
    if (tp == &PyBool_Type) return scalar_leaf(S_bool, v);
    if (tp == &PyLong_Type) return scalar_leaf(S_int, v);
    if (tp == &PyFloat_Type) return scalar_leaf(S_float, v);
    if (tp == &PyUnicode_Type) return scalar_leaf(S_str, v);
    if (tp == &PyList_Type || tp == &PyTuple_Type || tp == &PyDict_Type) {
        if (depth >= MAX_DEPTH) Py_RETURN_NONE;
        if (tp != &PyDict_Type) {
            PyObject *d;
            if (Py_EnterRecursiveCall(" in msprobe describe")) return NULL;
            /* a list may change while described (fallback code, other threads): walk a copy */
            PyObject *seq = tp == &PyList_Type ? PyList_AsTuple(v) : (Py_INCREF(v), v);
            d = seq ? describe_items(seq, depth, snapshot, slots, fallback) : NULL;
            Py_XDECREF(seq);
            Py_LeaveRecursiveCall();
            return d;
        }
        PyObject *out = PyDict_New(), *key, *item;
        Py_ssize_t pos = 0;
        if (out == NULL) return NULL;
        if (Py_EnterRecursiveCall(" in msprobe describe")) { Py_DECREF(out); return NULL; }
        while (PyDict_Next(v, &pos, &key, &item)) {
            Py_INCREF(key); Py_INCREF(item);
            PyObject *k = PyUnicode_CheckExact(key) ? (Py_INCREF(key), key) : PyObject_Str(key);
            PyObject *d = k ? describe_value(item, depth + 1, snapshot, slots, fallback) : NULL;
            int bad = d == NULL || PyDict_SetItem(out, k, d) < 0;
            Py_XDECREF(k); Py_XDECREF(d); Py_DECREF(key); Py_DECREF(item);
            if (bad) { Py_LeaveRecursiveCall(); Py_DECREF(out); return NULL; }
        }
        Py_LeaveRecursiveCall();
        return out;
    }
    int t = is_instance(v, TensorType);
    if (t < 0) return NULL;
    if (t) return tensor_slot(v, snapshot, slots);
    if (DtypeBase != NULL) {  /* a MindSpore dtype (Cast's argument): {"type": "mindspore.dtype", "value": str} */
        int is_dtype = is_instance(v, DtypeBase);
        if (is_dtype < 0) return NULL;
        if (is_dtype) {
            PyObject *text = PyObject_Str(v), *leaf;
            if (text == NULL) return NULL;
            leaf = scalar_leaf(S_ms_dtype, text);
            Py_DECREF(text);
            return leaf;
        }
    }
    PyObject *d = PyLong_FromLong(depth), *r = NULL;
    if (d != NULL) {
        r = PyObject_CallFunctionObjArgs(fallback, v, d, slots, snapshot, NULL);
        Py_DECREF(d);
    }
    return r;
}

static PyObject *describe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "describe(value, snapshot, slots: list, fallback)");
        return NULL;
    }
    if (TensorType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "msprobe.tensors._hotpath.setup() was not called");
        return NULL;
    }
    return describe_value(args[0], 0, args[1], args[2], args[3]);
}

/* ------------------------------------------------------------------ fill (flush) */
static PyObject *stats_tuple(PyObject *kind_code, PyObject *scanned, Py_ssize_t n) {
    /* scanned: (max, min, sum, sum_sq, nan, posinf, neginf, zero) from the kernel. Returns
     * (Max, Min, Mean, Norm), or None (with no error) when the Python rules must decide
     * (finite data whose float64 sums overflowed or underflowed: rescaled in NumPy). */
    PyObject *mx = PyTuple_GET_ITEM(scanned, 0), *mn = PyTuple_GET_ITEM(scanned, 1);
    PyObject *total = PyTuple_GET_ITEM(scanned, 2);
    double squares = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(scanned, 3));
    const char *code = PyUnicode_AsUTF8(kind_code);
    if (code == NULL) return NULL;
    if (code[0] == 'b') {
        PyObject *a = PyObject_IsTrue(mx) ? Py_True : Py_False, *b = PyObject_IsTrue(mn) ? Py_True : Py_False;
        return PyTuple_Pack(4, a, b, Py_None, Py_None);
    }
    if (code[0] == 'i' || code[0] == 'u') {
        PyObject *size = PyLong_FromSsize_t(n), *mean = NULL, *norm = NULL, *out = NULL;
        if (size) mean = PyNumber_TrueDivide(total, size);
        if (mean) norm = PyFloat_FromDouble(sqrt(squares));
        if (norm) out = PyTuple_Pack(4, mx, mn, mean, norm);
        Py_XDECREF(size); Py_XDECREF(mean); Py_XDECREF(norm);
        return out;
    }
    long long nan = PyLong_AsLongLong(PyTuple_GET_ITEM(scanned, 4));
    long long pinf = PyLong_AsLongLong(PyTuple_GET_ITEM(scanned, 5));
    long long ninf = PyLong_AsLongLong(PyTuple_GET_ITEM(scanned, 6));
    double fmx = PyFloat_AS_DOUBLE(mx), fmn = PyFloat_AS_DOUBLE(mn), sum = PyFloat_AS_DOUBLE(total);
    if (nan) {
        PyObject *q = PyFloat_FromDouble(NAN), *out = q ? PyTuple_Pack(4, q, q, q, q) : NULL;
        Py_XDECREF(q);
        return out;
    }
    double mean, norm;
    if (pinf || ninf) {
        mean = pinf && ninf ? NAN : pinf ? INFINITY : -INFINITY;
        norm = INFINITY;
    } else if ((squares < Tiny || !(isfinite(sum) && isfinite(squares))) && (fmx != 0.0 || fmn != 0.0)) {
        Py_RETURN_NONE;
    } else {
        mean = sum / (double)n;
        norm = sqrt(squares);
    }
    PyObject *a = PyFloat_FromDouble(mean), *b = PyFloat_FromDouble(norm), *out = NULL;
    if (a && b) out = PyTuple_Pack(4, mx, mn, a, b);
    Py_XDECREF(a); Py_XDECREF(b);
    return out;
}

/* A non-contiguous tensor's elements (`count` of `itemsize` bytes from the address in *data, strides
 * from TensorPy.stride) copied in C order into new memory (*owned, *data: what numpy's
 * ascontiguousarray of the strided view gives, the Python flush's array, so the sums are the same
 * bits). Returns 2, or 0 when the Python flush must read it (no memory, a negative stride, more
 * than MAX_DEPTH dimensions), -1 on an error. */
static int gather(PyObject *t, PyObject *shape, Py_ssize_t itemsize, Py_ssize_t count, void **data,
                  void **owned) {
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape), dims[MAX_DEPTH], steps[MAX_DEPTH], index[MAX_DEPTH];
    if (ndim > MAX_DEPTH) return 0;
    PyObject *strides = PyObject_CallOneArg(StrideFunc, t), *seq;
    if (strides == NULL) return -1;
    seq = PySequence_Fast(strides, "stride() is no sequence");
    Py_DECREF(strides);
    if (seq == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(seq) != ndim) { Py_DECREF(seq); return 0; }
    for (Py_ssize_t i = 0; i < ndim; i++) {
        dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        steps[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (steps[i] < 0) { Py_DECREF(seq); return PyErr_Occurred() ? -1 : 0; }
        steps[i] *= itemsize;
        index[i] = 0;
    }
    Py_DECREF(seq);
    char *out = PyMem_RawMalloc((size_t)(count * itemsize)), *dst = out;
    if (out == NULL) { PyErr_NoMemory(); return -1; }
    const char *src = (const char *)*data;
    Py_ssize_t inner = dims[ndim - 1], step = steps[ndim - 1];
    for (Py_ssize_t k = 0; k < count; k += inner) {  /* rows of the last index, in C order */
        const char *p = src;
        /* a constant size per loop: each memcpy becomes one load and one store */
        if (itemsize == 4)
            for (Py_ssize_t j = 0; j < inner; j++, p += step) memcpy(dst + 4 * j, p, 4);
        else if (itemsize == 2)
            for (Py_ssize_t j = 0; j < inner; j++, p += step) memcpy(dst + 2 * j, p, 2);
        else if (itemsize == 8)
            for (Py_ssize_t j = 0; j < inner; j++, p += step) memcpy(dst + 8 * j, p, 8);
        else
            for (Py_ssize_t j = 0; j < inner; j++, p += step) memcpy(dst + itemsize * j, p, (size_t)itemsize);
        dst += inner * itemsize;
        for (Py_ssize_t i = ndim - 2; i >= 0; i--) {
            if (++index[i] < dims[i]) { src += steps[i]; break; }
            src -= steps[i] * (dims[i] - 1);
            index[i] = 0;
        }
    }
    *owned = *data = out;
    return 2;
}

/* The memory fill() reads for one slot: the contiguous bytes of a plain CPU tensor (read in place
 * through TensorPy._data_ptr; a non-contiguous one copied by gather()) or of a C-contiguous host
 * array (a Parameter's host snapshot, made by the runtime), `n` elements of kind `kind_code`
 * (borrowed). Returns 1 when found in place, 2 when copied into *owned (the caller frees it with
 * PyMem_RawFree), 0 when the slot is the Python flush's, -1 on an error (the caller clears it and
 * leaves the slot to Python). */
static int slot_memory(Slot *s, void **data, Py_ssize_t *n, PyObject **kind_code, void **owned) {
    PyObject *t = s->tensor;
    if (t == NULL || s->data_name != Py_None || !PyUnicode_Check(s->dtype)) return 0;
    int tensor = (PyObject *)Py_TYPE(t) == TensorType;
    if (!tensor && (PyObject *)Py_TYPE(t) != ArrayType) return 0;
    PyObject *kind = PyDict_GetItemWithError(Kinds, s->dtype);  /* borrowed */
    if (kind == NULL) return PyErr_Occurred() ? -1 : 0;
    *kind_code = PyTuple_GET_ITEM(kind, 0);
    Py_ssize_t itemsize = PyLong_AsSsize_t(PyTuple_GET_ITEM(kind, 1));
    if (!tensor) {
        /* the host snapshot of a Parameter: the runtime made it from the tensor's memory with the
         * numpy dtype of the slot's dtype; anything else (another layout or item type) is Python's */
        Py_buffer view;
        if (PyObject_GetBuffer(t, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
        const char *fmt = view.format ? view.format : "B";
        if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
        const char *code = PyUnicode_AsUTF8(*kind_code);
        if (code == NULL) { PyBuffer_Release(&view); return -1; }
        const char *allowed = code[0] == 'f' ? "efd" : code[0] == 'i' ? "bhilq" : code[0] == 'u' ? "BHILQ" : "?";
        int ok = view.ndim >= 1 && view.itemsize == itemsize && fmt[0] != '\0' && fmt[1] == '\0' &&
                 strchr(allowed, fmt[0]) != NULL && view.len > 0;
        *data = view.buf;  /* the array (held by the slot) keeps its memory */
        *n = view.len / itemsize;
        PyBuffer_Release(&view);
        return ok;
    }
    PyObject *init = PyObject_GetAttr(t, S_a_init);
    if (init == NULL) return -1;
    int lazy = init != Py_None;
    Py_DECREF(init);
    if (lazy) return 0;
    PyObject *shape = PyObject_GetAttr(t, S_a_shape);
    if (shape == NULL) return -1;
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) == 0) { Py_DECREF(shape); return 0; }
    Py_ssize_t count = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (d < 0) { Py_DECREF(shape); return PyErr_Occurred() ? -1 : 0; }
        count *= d;
    }
    if (count == 0) { Py_DECREF(shape); return 0; }
    PyObject *contig = PyObject_CallOneArg(ContigFunc, t);
    if (contig == NULL) { Py_DECREF(shape); return -1; }
    int ok = PyObject_IsTrue(contig);
    Py_DECREF(contig);
    if (ok < 0) { Py_DECREF(shape); return -1; }
    PyObject *ptr = PyObject_CallOneArg(PtrFunc, t);
    if (ptr == NULL) { Py_DECREF(shape); return -1; }
    *data = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    if (*data == NULL) { Py_DECREF(shape); return PyErr_Occurred() ? -1 : 0; }
    *n = count;
    int found = ok ? 1 : gather(t, shape, itemsize, count, data, owned);
    Py_DECREF(shape);
    return found;
}

/* Statistics of `n` elements of kind `kind_code` at `data`: (Max, Min, Mean, Norm[, md5]), or None
 * when the Python flush must decide; NULL on an error. */
static PyObject *memory_stats(void *data, Py_ssize_t n, PyObject *kind_code, int md5) {
    const char *code = PyUnicode_AsUTF8(kind_code);  /* "f4", "i8", "b1", ...: kind, item size */
    if (code == NULL) return NULL;
    Py_ssize_t itemsize = code[1] - '0';
    PyObject *view = PyMemoryView_FromMemory((char *)data, n * itemsize, PyBUF_READ);
    if (view == NULL) return NULL;
    /* from SPLIT elements on, the kernel may split the work over the CPUs free now (the result does
     * not depend on how many threads ran), as msprobe.tensors.scan.scan decides */
    PyObject *threads = n >= Split ? PyObject_CallNoArgs(FreeCpusFunc) : PyLong_FromLong(1);
    if (threads == NULL) { Py_DECREF(view); return NULL; }
    PyObject *scanned = PyObject_CallFunctionObjArgs(ScanFunc, view, kind_code, threads, NULL);
    Py_DECREF(threads);
    if (scanned == NULL) { Py_DECREF(view); return NULL; }
    PyObject *out = stats_tuple(kind_code, scanned, n);
    Py_DECREF(scanned);
    if (out != NULL && out != Py_None && md5) {
        /* the same bytes the Python flush hashes (stats.crc32_hex of the host array) */
        PyObject *crc = PyObject_CallOneArg(CrcFunc, view), *text = NULL, *full = NULL;
        if (crc != NULL) {
            unsigned long value = PyLong_AsUnsignedLongMask(crc);
            if (!(value == (unsigned long)-1 && PyErr_Occurred())) {
                char hex[16];
                snprintf(hex, sizeof hex, "%08lx", value & 0xFFFFFFFFUL);
                text = PyUnicode_FromString(hex);
            }
        }
        if (text != NULL)
            full = PyTuple_Pack(5, PyTuple_GET_ITEM(out, 0), PyTuple_GET_ITEM(out, 1), PyTuple_GET_ITEM(out, 2),
                                PyTuple_GET_ITEM(out, 3), text);
        Py_XDECREF(crc); Py_XDECREF(text);
        Py_DECREF(out);
        out = full;
    }
    Py_DECREF(view);
    return out;
}

static int make_leaf(Slot *s, PyObject *st) {
    PyObject *leaf = PyDict_New();
    if (leaf == NULL) return -1;
    if (PyDict_SetItem(leaf, S_type, s->type_name) < 0 || PyDict_SetItem(leaf, S_dtype, s->dtype) < 0 ||
        PyDict_SetItem(leaf, S_shape, s->shape) < 0 || PyDict_SetItem(leaf, S_Max, PyTuple_GET_ITEM(st, 0)) < 0 ||
        PyDict_SetItem(leaf, S_Min, PyTuple_GET_ITEM(st, 1)) < 0 ||
        PyDict_SetItem(leaf, S_Mean, PyTuple_GET_ITEM(st, 2)) < 0 ||
        PyDict_SetItem(leaf, S_Norm, PyTuple_GET_ITEM(st, 3)) < 0 ||
        (PyTuple_GET_SIZE(st) > 4 && PyDict_SetItem(leaf, S_md5, PyTuple_GET_ITEM(st, 4)) < 0)) {
        Py_DECREF(leaf);
        return -1;
    }
    Py_XSETREF(s->leaf, leaf);
    return 0;
}

/* statistics of one slot through the two caches of a fill() call: `by_object` (id of the tensor)
 * and `by_memory` ((address, elements, kind): another tensor object over the same bytes, e.g. the
 * gradient a call sends to its input and the one the producer of that input receives) */
static PyObject *cached_stats(Slot *s, PyObject *by_object, PyObject *by_memory, int md5) {
    PyObject *key = PyLong_FromVoidPtr(s->tensor);
    if (key == NULL) return NULL;
    PyObject *st = PyDict_GetItemWithError(by_object, key);
    if (st != NULL || PyErr_Occurred()) {
        Py_XINCREF(st);
        Py_DECREF(key);
        return st;
    }
    void *data = NULL, *owned = NULL;
    Py_ssize_t n = 0;
    PyObject *kind_code = NULL, *where = NULL;
    int found = slot_memory(s, &data, &n, &kind_code, &owned);
    if (found == 2) {  /* a copy: nothing else reads this memory */
        st = memory_stats(data, n, kind_code, md5);
        PyMem_RawFree(owned);
        if (st == NULL) PyErr_Clear();
    } else if (found > 0) {
        where = Py_BuildValue("(NnO)", PyLong_FromVoidPtr(data), n, kind_code);
        if (where == NULL) { Py_DECREF(key); return NULL; }
        st = PyDict_GetItemWithError(by_memory, where);
        if (st != NULL) Py_INCREF(st);
        else if (PyErr_Occurred()) { Py_DECREF(where); Py_DECREF(key); return NULL; }
        else {
            st = memory_stats(data, n, kind_code, md5);
            if (st == NULL) PyErr_Clear();  /* whatever failed, the Python flush reads it again and decides */
        }
    } else if (found < 0) {
        PyErr_Clear();
    }
    if (st == NULL) { Py_INCREF(Py_None); st = Py_None; }
    int bad = PyDict_SetItem(by_object, key, st) < 0 ||
              (where != NULL && st != Py_None && PyDict_SetItem(by_memory, where, st) < 0);
    Py_DECREF(key);
    Py_XDECREF(where);
    if (bad) { Py_DECREF(st); return NULL; }
    return st;
}

/* The arguments (slots, md5=False) of fill() and fill_parameters(): a new tuple of the slots (a
 * copy: the kernel releases the GIL) and *md5, or NULL with an exception set (TypeError for a bad
 * argument count, RuntimeError before setup()). */
static PyObject *slots_argument(PyObject *const *args, Py_ssize_t nargs, const char *usage, int *md5) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (ScanFunc == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "msprobe.tensors._hotpath.setup() was not called");
        return NULL;
    }
    *md5 = nargs > 1 ? PyObject_IsTrue(args[1]) : 0;
    if (*md5 < 0) return NULL;
    return PySequence_Tuple(args[0]);
}

static PyObject *fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int md5 = 0;
    PyObject *seq = slots_argument(args, nargs, "fill(slots, md5=False)", &md5);
    if (seq == NULL) return NULL;
    PyObject *by_object = PyDict_New(), *by_memory = PyDict_New();
    if (by_object == NULL || by_memory == NULL) goto error;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (Py_TYPE(item) != &SlotType) continue;
        Slot *s = (Slot *)item;
        if (s->leaf != NULL && s->leaf != Py_None) continue;
        if (s->tensor == NULL || s->tensor == Py_None) continue;
        /* a slot with a file name is the Python flush's (it writes the .npy), even when the same
         * tensor was read here for another slot */
        if (s->data_name != NULL && s->data_name != Py_None) continue;
        PyObject *st = cached_stats(s, by_object, by_memory, md5);
        if (st == NULL) goto error;
        int bad = st != Py_None && make_leaf(s, st) < 0;
        Py_DECREF(st);
        if (bad) goto error;
    }
    Py_DECREF(by_object);
    Py_DECREF(by_memory);
    Py_DECREF(seq);
    Py_RETURN_NONE;
error:
    Py_XDECREF(by_object);
    Py_XDECREF(by_memory);
    Py_DECREF(seq);
    return NULL;
}

/* The in-place memory of a slot holding a Parameter: its contiguous bytes when it is initialised, of
 * a kernel kind and has at least one dimension and one element (as slot_memory() reads a plain
 * tensor), `n` elements of kind `kind_code` (borrowed). 1 when found, 0 when the slot is left as it
 * is, -1 on an error (the caller clears it and leaves the slot). */
static int parameter_memory(Slot *s, void **data, Py_ssize_t *n, PyObject **kind_code) {
    PyObject *t = s->tensor;
    if (t == NULL || s->data_name != Py_None || !PyUnicode_Check(s->dtype) || !PyList_Check(s->shape)) return 0;
    int p = is_instance(t, ParameterType);
    if (p <= 0) return p;
    PyObject *kind = PyDict_GetItemWithError(Kinds, s->dtype);  /* borrowed */
    if (kind == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t ndim = PyList_GET_SIZE(s->shape), count = 1;
    if (ndim == 0) return 0;
    for (Py_ssize_t i = 0; i < ndim; i++) {
        Py_ssize_t d = PyLong_AsSsize_t(PyList_GET_ITEM(s->shape, i));
        if (d < 0) return PyErr_Occurred() ? -1 : 0;
        count *= d;
    }
    if (count == 0) return 0;
    PyObject *init = PyObject_GetAttr(t, S_a_init);
    if (init == NULL) return -1;
    int lazy = init != Py_None;
    Py_DECREF(init);
    if (lazy) return 0;
    PyObject *has_init = PyObject_GetAttr(t, S_has_init);
    if (has_init == NULL) return -1;
    lazy = PyObject_IsTrue(has_init);
    Py_DECREF(has_init);
    if (lazy != 0) return lazy < 0 ? -1 : 0;
    PyObject *contig = PyObject_CallOneArg(ContigFunc, t);
    if (contig == NULL) return -1;
    int ok = PyObject_IsTrue(contig);
    Py_DECREF(contig);
    if (ok <= 0) return ok;
    PyObject *ptr = PyObject_CallOneArg(PtrFunc, t);
    if (ptr == NULL) return -1;
    *data = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    if (*data == NULL) return PyErr_Occurred() ? -1 : 0;
    *kind_code = PyTuple_GET_ITEM(kind, 0);
    *n = count;
    return 1;
}

static PyObject *fill_parameters(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int md5 = 0;
    PyObject *seq = slots_argument(args, nargs, "fill_parameters(slots, md5=False)", &md5);
    if (seq == NULL) return NULL;
    Py_ssize_t filled = 0, n = PyTuple_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        if (Py_TYPE(item) != &SlotType) continue;
        Slot *s = (Slot *)item;
        if (s->leaf != NULL && s->leaf != Py_None) continue;
        void *data = NULL;
        Py_ssize_t count = 0;
        PyObject *kind_code = NULL;
        int found = parameter_memory(s, &data, &count, &kind_code);
        if (found < 0) PyErr_Clear();
        if (found <= 0) continue;
        PyObject *st = memory_stats(data, count, kind_code, md5);
        if (st == NULL) { PyErr_Clear(); continue; }  /* the caller snapshots the Parameter instead */
        int bad = st != Py_None && make_leaf(s, st) < 0;
        if (!bad && st != Py_None) {
            Py_INCREF(Py_None);
            Py_SETREF(s->tensor, Py_None);  /* read: the Parameter is not held until the flush */
            filled++;
        }
        Py_DECREF(st);
        if (bad) { Py_DECREF(seq); return NULL; }
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(filled);
}

/* ------------------------------------------------------------------ resolve (journal) */
static int leaf_non_finite(PyObject *leaf) {
    if (!PyDict_Check(leaf)) return 0;
    PyObject *keys[4] = {S_Max, S_Min, S_Mean, S_Norm};
    for (int i = 0; i < 4; i++) {
        PyObject *v = PyDict_GetItemWithError(leaf, keys[i]);
        if (v == NULL) { if (PyErr_Occurred()) return -1; continue; }
        if (PyFloat_Check(v) && !isfinite(PyFloat_AS_DOUBLE(v))) return 1;
    }
    return 0;
}

/* getattr(v, name, None) without raising AttributeError: 1 found, 0 not found, -1 error */
static int lookup_attr(PyObject *v, PyObject *name, PyObject **out) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(v, name, out);
#else
    return _PyObject_LookupAttr(v, name, out);
#endif
}

static PyObject *resolve_value(PyObject *v, int *flag) {
    PyTypeObject *tp = Py_TYPE(v);
    if (tp == &PyUnicode_Type || tp == &PyLong_Type || tp == &PyBool_Type || v == Py_None) {
        Py_INCREF(v);
        return v;
    }
    if (tp == &PyFloat_Type) {
        if (!isfinite(PyFloat_AS_DOUBLE(v))) *flag = 1;
        Py_INCREF(v);
        return v;
    }
    if (tp == &PyDict_Type) {
        PyObject *out = PyDict_New(), *key, *item;
        Py_ssize_t pos = 0;
        if (out == NULL) return NULL;
        if (Py_EnterRecursiveCall(" in msprobe resolve")) { Py_DECREF(out); return NULL; }
        while (PyDict_Next(v, &pos, &key, &item)) {
            PyObject *r = resolve_value(item, flag);
            if (r == NULL || PyDict_SetItem(out, key, r) < 0) {
                Py_XDECREF(r);
                Py_LeaveRecursiveCall();
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(r);
        }
        Py_LeaveRecursiveCall();
        return out;
    }
    if (tp == &PyList_Type) {
        Py_ssize_t n = PyList_GET_SIZE(v);
        PyObject *out = PyList_New(n);
        if (out == NULL) return NULL;
        if (Py_EnterRecursiveCall(" in msprobe resolve")) { Py_DECREF(out); return NULL; }
        for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(v); i++) {
            PyObject *r = resolve_value(PyList_GET_ITEM(v, i), flag);
            if (r == NULL) { Py_LeaveRecursiveCall(); Py_DECREF(out); return NULL; }
            PyList_SET_ITEM(out, i, r);
        }
        Py_LeaveRecursiveCall();
        return out;
    }
    PyObject *leaf;
    if (tp == &SlotType) {
        leaf = ((Slot *)v)->leaf ? ((Slot *)v)->leaf : Py_None;
        Py_INCREF(leaf);
    } else if (lookup_attr(v, S_leaf, &leaf) < 0) {
        return NULL;
    } else if (leaf == NULL) {
        leaf = Py_None;
        Py_INCREF(leaf);
    }
    if (leaf == Py_None) {
        Py_DECREF(leaf);
        Py_INCREF(v);
        return v;
    }
    if (!*flag) {
        int nf = leaf_non_finite(leaf);
        if (nf < 0) { Py_DECREF(leaf); return NULL; }
        if (nf) *flag = 1;
    }
    return leaf;
}

static PyObject *resolve_record(PyObject *record, int *flag);

static PyObject *resolve(PyObject *self, PyObject *record) {
    (void)self;
    if (!PyDict_Check(record)) {
        PyErr_SetString(PyExc_TypeError, "resolve() needs a dict");
        return NULL;
    }
    int flag = 0;
    PyObject *out = resolve_record(record, &flag);
    if (out == NULL) return NULL;
    return Py_BuildValue("(NO)", out, flag ? Py_True : Py_False);
}

static PyObject *resolve_record(PyObject *record, int *flag) {
    PyObject *out = PyDict_New(), *key, *item;
    Py_ssize_t pos = 0;
    if (out == NULL) return NULL;
    while (PyDict_Next(record, &pos, &key, &item)) {
        PyObject *r = resolve_value(item, flag);
        if (r == NULL || PyDict_SetItem(out, key, r) < 0) { Py_XDECREF(r); Py_DECREF(out); return NULL; }
        Py_DECREF(r);
    }
    return out;
}

static PyObject *encode_lines(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "encode_lines(records, encode)");
        return NULL;
    }
    if (EncodeFunc == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "msprobe.tensors._hotpath.setup() was not called");
        return NULL;
    }
    PyObject *seq = PySequence_Tuple(args[0]);  /* a copy: encoders may run Python code */
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    /* each line is copied out at once: orjson's bytes over-allocate, a batch of them is ~10x its text */
    PyObject *resolved = PyList_New(n), *text = PyByteArray_FromStringAndSize(NULL, 0);
    int any = 0, ok = 0;
    if (resolved == NULL || text == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *record = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyDict_Check(record)) {
            PyErr_SetString(PyExc_TypeError, "encode_lines() needs a sequence of dicts");
            goto done;
        }
        int flag = 0;
        PyObject *rec = resolve_record(record, &flag);
        if (rec == NULL) goto done;
        PyList_SET_ITEM(resolved, i, rec);
        PyObject *line = NULL;
        if (!flag) {
            PyObject *call_args[2] = {rec, EncodeOption};
            line = PyObject_Vectorcall(EncodeFunc, call_args, 1, EncodeKwnames);
            if (line == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_TypeError)) goto done;
                PyErr_Clear();  /* e.g. an int beyond 64 bits: the Python encoder decides */
            }
        }
        if (line == NULL) {
            PyObject *nf = flag ? Py_True : Py_False;
            PyObject *kw = Py_BuildValue("{sO}", "line", Py_True);
            if (kw == NULL) goto done;
            PyObject *call_args[2] = {rec, nf};
            line = PyObject_VectorcallDict(args[1], call_args, 2, kw);
            Py_DECREF(kw);
            if (line == NULL) goto done;
        }
        if (!PyBytes_Check(line)) {
            Py_DECREF(line);
            PyErr_SetString(PyExc_TypeError, "a journal line encoder returned no bytes");
            goto done;
        }
        Py_ssize_t old = PyByteArray_GET_SIZE(text), size = PyBytes_GET_SIZE(line);
        if (PyByteArray_Resize(text, old + size) < 0) { Py_DECREF(line); goto done; }
        memcpy(PyByteArray_AS_STRING(text) + old, PyBytes_AS_STRING(line), (size_t)size);
        Py_DECREF(line);
        any |= flag;
    }
    ok = 1;
done:
    Py_DECREF(seq);
    if (!ok) {
        Py_XDECREF(text);
        Py_XDECREF(resolved);
        return NULL;
    }
    return Py_BuildValue("(NNO)", text, resolved, any ? Py_True : Py_False);
}

/* ------------------------------------------------------------------ stack key */
static PyObject *stack_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "stack_key(skip, limit)");
        return NULL;
    }
    Py_ssize_t skip = PyLong_AsSsize_t(args[0]), limit = PyLong_AsSsize_t(args[1]);
    if ((skip == -1 || limit == -1) && PyErr_Occurred()) return NULL;
    PyFrameObject *frame = PyEval_GetFrame();  /* borrowed: the caller's frame */
    Py_XINCREF(frame);
    for (Py_ssize_t i = 0; i < skip && frame != NULL; i++) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    PyObject *key = PyList_New(0);
    if (key == NULL) { Py_XDECREF(frame); return NULL; }
    for (Py_ssize_t depth = 0; frame != NULL && depth < limit; depth++) {
        PyObject *codeobj = (PyObject *)PyFrame_GetCode(frame);
        PyObject *code = PyLong_FromVoidPtr(codeobj);  /* id(code): what the Python key holds */
        Py_DECREF(codeobj);
        if (code == NULL) { Py_DECREF(frame); Py_DECREF(key); return NULL; }
#if PY_VERSION_HEX >= 0x030B0000
        PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(frame));
#else
        PyObject *lasti = PyLong_FromLong(frame->f_lasti * (PY_VERSION_HEX >= 0x030A0000 ? 2 : 1));
#endif
        int bad = lasti == NULL || PyList_Append(key, code) < 0 || PyList_Append(key, lasti) < 0;
        Py_DECREF(code);
        Py_XDECREF(lasti);
        if (bad) { Py_DECREF(frame); Py_DECREF(key); return NULL; }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    PyObject *out = PyList_AsTuple(key);
    Py_DECREF(key);
    return out;
}

/* ------------------------------------------------------------------ gradient nodes (backward.py) */
/* The autograd node of `t` when it is a floating-point Tensor taking part in the gradient, else None
 * (new reference; NULL on an error): backward._node_of, reading the same attributes in the same order. */
static PyObject *node_of(PyObject *t) {
    int ok = is_instance(t, TensorType);
    if (ok <= 0) { if (ok < 0) return NULL; Py_RETURN_NONE; }
    PyObject *node = PyObject_GetAttr(t, S_grad_node);
    if (node == NULL || node == Py_None) return node;
    /* Tensor.dtype is the property returning self._dtype: read the attribute behind it directly (one
     * Python frame less) on an exact Tensor, as tensor_slot does; subclasses may define their own */
    PyObject *dtype = PyObject_GetAttr(t, (PyObject *)Py_TYPE(t) == TensorType ? S_a_dtype : S_dtype);
    int keep = dtype == NULL ? -1 : PySet_Contains(FloatDtypes, dtype);
    Py_XDECREF(dtype);
    if (keep > 0) {
        PyObject *flag = PyObject_GetAttr(t, S_requires_grad);
        keep = flag == NULL ? -1 : PyObject_IsTrue(flag);
        Py_XDECREF(flag);
    }
    if (keep > 0) return node;
    Py_DECREF(node);
    if (keep < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *grad_node(PyObject *self, PyObject *t) {
    (void)self;
    if (FloatDtypes == NULL || TensorKinds == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "msprobe.tensors._hotpath.setup() and setup_calls() were not called");
        return NULL;
    }
    return node_of(t);
}

/* appends (i, k, t, node, (node._unique_id(), t._output_index)) to `found` when `t` takes a gradient */
static int add_target(PyObject *found, Py_ssize_t i, PyObject *k, PyObject *t) {
    PyObject *node = node_of(t);
    if (node == NULL) return -1;
    if (node == Py_None) { Py_DECREF(node); return 0; }
    PyObject *uid = PyObject_CallMethodNoArgs(node, S_unique_id), *index = NULL, *key = NULL, *pos = NULL,
             *entry = NULL;
    if (uid != NULL) index = PyObject_GetAttr(t, S_output_index);
    if (index != NULL) key = PyTuple_Pack(2, uid, index);
    if (key != NULL) pos = PyLong_FromSsize_t(i);
    if (pos != NULL) entry = PyTuple_Pack(5, pos, k, t, node, key);
    int status = entry == NULL ? -1 : PyList_Append(found, entry);
    Py_XDECREF(uid); Py_XDECREF(index); Py_XDECREF(key); Py_XDECREF(pos); Py_XDECREF(entry);
    Py_DECREF(node);
    return status;
}

/* backward._targets: [(position, element or None, tensor, node, (node id, output index))] */
static PyObject *grad_targets(PyObject *self, PyObject *args) {
    (void)self;
    if (FloatDtypes == NULL || TensorKinds == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "msprobe.tensors._hotpath.setup() and setup_calls() were not called");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args, "grad_targets(args): a sequence"), *found = NULL;
    if (seq == NULL) return NULL;
    found = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; found != NULL && i < n; i++) {
        PyObject *a = PySequence_Fast_GET_ITEM(seq, i);
        int t = is_instance(a, TensorType), bad = t < 0;
        if (t > 0) bad = add_target(found, i, Py_None, a) < 0;
        else if (t == 0 && (PyList_Check(a) || PyTuple_Check(a))) {
            PyObject *it = PyObject_GetIter(a), *item;  /* enumerate(a), as the Python code walks it */
            Py_ssize_t k = 0;
            bad = it == NULL;
            while (!bad && (item = PyIter_Next(it)) != NULL) {
                PyObject *index = PyLong_FromSsize_t(k++);
                bad = index == NULL || add_target(found, i, index, item) < 0;
                Py_XDECREF(index);
                Py_DECREF(item);
            }
            bad = bad || PyErr_Occurred() != NULL;
            Py_XDECREF(it);
        }
        if (bad) Py_CLEAR(found);
    }
    Py_DECREF(seq);
    return found;
}

/* backward._edge_key: the (node id, output index) an edge leads to; an automatic "Contiguous" (a view passed
 * to a kernel) counts as leading to the view's producer. New reference, NULL on an error. */
static PyObject *edge_key(PyObject *edge_node, PyObject *out_index, PyObject *keys) {
    PyObject *uid = PyObject_CallMethodNoArgs(edge_node, S_unique_id);
    if (uid == NULL) return NULL;
    PyObject *key = PyTuple_Pack(2, uid, out_index);
    Py_DECREF(uid);
    if (key == NULL) return NULL;
    int known = PyDict_Contains(keys, key);
    if (known != 0) {
        if (known < 0) Py_CLEAR(key);
        return key;
    }
    PyObject *name = PyObject_CallMethodNoArgs(edge_node, S_name);
    int contiguous = name == NULL ? -1 : PyObject_RichCompareBool(name, S_Contiguous, Py_EQ);
    Py_XDECREF(name);
    if (contiguous <= 0) {
        if (contiguous < 0) Py_CLEAR(key);
        return key;
    }
    PyObject *inner = PyObject_GetAttr(edge_node, S_next_functions), *seq = NULL;
    if (inner != NULL) seq = PySequence_Fast(inner, "next_functions is no sequence");
    Py_XDECREF(inner);
    if (seq == NULL) { Py_DECREF(key); return NULL; }
    if (PySequence_Fast_GET_SIZE(seq) == 1) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, 0), *first = PySequence_GetItem(pair, 0), *second = NULL;
        if (first != NULL && first != Py_None) {
            PyObject *inner_uid = PyObject_CallMethodNoArgs(first, S_unique_id);
            second = inner_uid == NULL ? NULL : PySequence_GetItem(pair, 1);
            PyObject *inner_key = second == NULL ? NULL : PyTuple_Pack(2, inner_uid, second);
            Py_XDECREF(inner_uid);
            Py_SETREF(key, inner_key);
        }
        if (first == NULL) Py_CLEAR(key);
        Py_XDECREF(first);
        Py_XDECREF(second);
    }
    Py_DECREF(seq);
    return key;
}

/* backward._single_mapping(nodes, targets): [(edge index, (position, element))], or None when the call is
 * not one autograd node making every output from its arguments (the rules of the Python function). */
static PyObject *single_mapping(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "single_mapping(nodes, targets)");
        return NULL;
    }
    PyObject *nodes = PySequence_Fast(args[0], "single_mapping(nodes, targets): nodes is a sequence");
    if (nodes == NULL) return NULL;
    PyObject *targets = PySequence_Fast(args[1], "single_mapping(nodes, targets): targets is a sequence");
    if (targets == NULL) { Py_DECREF(nodes); return NULL; }
    PyObject *uid = NULL, *meta = NULL, *slots = NULL, *used = NULL, *edges = NULL, *mapping = NULL, *out = NULL;
    Py_ssize_t n_nodes = PySequence_Fast_GET_SIZE(nodes);
    if (n_nodes == 0) {
        PyErr_SetString(PyExc_IndexError, "single_mapping(): no nodes");
        goto done;
    }
    PyObject *node = PySequence_Fast_GET_ITEM(nodes, 0);
    if ((uid = PyObject_CallMethodNoArgs(node, S_unique_id)) == NULL) goto done;
    for (Py_ssize_t i = 1; i < n_nodes; i++) {
        PyObject *other = PyObject_CallMethodNoArgs(PySequence_Fast_GET_ITEM(nodes, i), S_unique_id);
        int differs = other == NULL ? -1 : PyObject_RichCompareBool(other, uid, Py_NE);
        Py_XDECREF(other);
        if (differs < 0) goto done;
        if (differs) { out = Py_None; Py_INCREF(out); goto done; }
    }
    if ((meta = PyObject_GetAttr(node, S_input_metadata)) == NULL) goto done;
    Py_ssize_t n_meta = PyObject_Length(meta);
    if (n_meta < 0) goto done;
    if (n_meta != n_nodes) { out = Py_None; Py_INCREF(out); goto done; }
    if ((slots = PyDict_New()) == NULL || (used = PyDict_New()) == NULL) goto done;
    for (Py_ssize_t t = 0; t < PySequence_Fast_GET_SIZE(targets); t++) {
        PyObject *target = PySequence_Fast_GET_ITEM(targets, t);
        if (!PyTuple_Check(target) || PyTuple_GET_SIZE(target) != 5) {
            PyErr_SetString(PyExc_ValueError, "single_mapping(): a target is no (position, element, tensor, node, key)");
            goto done;
        }
        PyObject *key = PyTuple_GET_ITEM(target, 4), *head = PySequence_GetItem(key, 0);
        int same = head == NULL ? -1 : PyObject_RichCompareBool(head, uid, Py_EQ);
        Py_XDECREF(head);
        if (same < 0) goto done;
        if (same) { out = Py_None; Py_INCREF(out); goto done; }
        PyObject *list = PyDict_GetItemWithError(slots, key);  /* borrowed */
        if (list == NULL) {
            if (PyErr_Occurred() || (list = PyList_New(0)) == NULL) goto done;
            int bad = PyDict_SetItem(slots, key, list) < 0;
            Py_DECREF(list);
            if (bad) goto done;
        }
        PyObject *slot = PyTuple_Pack(2, PyTuple_GET_ITEM(target, 0), PyTuple_GET_ITEM(target, 1));
        int bad = slot == NULL || PyList_Append(list, slot) < 0;
        Py_XDECREF(slot);
        if (bad) goto done;
    }
    PyObject *next = PyObject_GetAttr(node, S_next_functions);
    if (next == NULL) goto done;
    edges = PySequence_Fast(next, "next_functions is no sequence");
    Py_DECREF(next);
    if (edges == NULL || (mapping = PyList_New(0)) == NULL) goto done;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(edges); j++) {
        PyObject *pair = PySequence_Fast(PySequence_Fast_GET_ITEM(edges, j), "an edge is no pair");
        if (pair == NULL) goto done;
        if (PySequence_Fast_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_ValueError, "an edge of next_functions is no (node, output index) pair");
            goto done;
        }
        PyObject *edge_node = PySequence_Fast_GET_ITEM(pair, 0), *key = NULL;
        if (edge_node == Py_None) { Py_DECREF(pair); continue; }
        key = edge_key(edge_node, PySequence_Fast_GET_ITEM(pair, 1), slots);
        if (key == NULL) { Py_DECREF(pair); goto done; }
        PyObject *candidates = PyDict_GetItemWithError(slots, key);  /* borrowed */
        if (candidates == NULL) {
            int leaf = -1;
            if (!PyErr_Occurred()) {
                PyObject *flag = PyObject_CallMethodNoArgs(edge_node, S_is_leaf);
                leaf = flag == NULL ? -1 : PyObject_IsTrue(flag);
                Py_XDECREF(flag);
            }
            Py_DECREF(key);
            Py_DECREF(pair);
            if (leaf < 0) goto done;
            if (leaf) continue;
            out = Py_None; Py_INCREF(out);
            goto done;
        }
        Py_ssize_t count = 0;
        PyObject *seen = PyDict_GetItemWithError(used, key);  /* borrowed */
        if (seen != NULL) count = PyLong_AsSsize_t(seen);
        int bad = PyErr_Occurred() != NULL;
        if (!bad && count < PyList_GET_SIZE(candidates)) {
            PyObject *next_count = PyLong_FromSsize_t(count + 1), *index = PyLong_FromSsize_t(j), *item = NULL;
            if (next_count != NULL && index != NULL)
                item = PyTuple_Pack(2, index, PyList_GET_ITEM(candidates, count));
            bad = item == NULL || PyDict_SetItem(used, key, next_count) < 0 || PyList_Append(mapping, item) < 0;
            Py_XDECREF(next_count); Py_XDECREF(index); Py_XDECREF(item);
        }
        Py_DECREF(key);
        Py_DECREF(pair);
        if (bad) goto done;
    }
    out = mapping;
    mapping = NULL;
done:
    Py_DECREF(nodes); Py_DECREF(targets);
    Py_XDECREF(uid); Py_XDECREF(meta); Py_XDECREF(slots); Py_XDECREF(used); Py_XDECREF(edges); Py_XDECREF(mapping);
    return out;
}

/* sum of slot.nbytes() over a list of slots (Runtime._added_to_batch) */
static PyObject *slots_nbytes(PyObject *self, PyObject *slots) {
    (void)self;
    PyObject *seq = PySequence_Fast(slots, "slots_nbytes(slots): a sequence");
    if (seq == NULL) return NULL;
    PyObject *total = PyLong_FromLong(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; total != NULL && i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *size = Py_TYPE(item) == &SlotType ? slot_nbytes((Slot *)item, NULL)
                                                      : PyObject_CallMethod(item, "nbytes", NULL);
        PyObject *sum = size == NULL ? NULL : PyNumber_Add(total, size);
        Py_XDECREF(size);
        Py_SETREF(total, sum);
    }
    Py_DECREF(seq);
    return total;
}

static PyObject *setup_calls(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"dtype_type", "float_dtypes", NULL};
    PyObject *dtype_type, *floats;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!:setup_calls", keywords, &dtype_type, &PyFrozenSet_Type,
                                     &floats))
        return NULL;
    Py_INCREF(dtype_type); Py_XSETREF(DtypeBase, dtype_type);
    Py_INCREF(floats); Py_XSETREF(FloatDtypes, floats);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ setup */
static PyObject *setup(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"tensor", "parameter", "dtype_names", "kinds", "scan", "split", "is_contiguous",
                               "data_ptr", "dumps", "line_option", "crc32", "ndarray", "stride", "free_cpus", NULL};
    PyObject *tensor, *parameter, *names, *kinds, *scan, *contig, *ptr, *dumps, *option, *crc, *ndarray, *stride,
        *free_cpus;
    Py_ssize_t split;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!OnOOOOOOOO:setup", keywords, &tensor, &parameter,
                                     &PyDict_Type, &names, &PyDict_Type, &kinds, &scan, &split, &contig, &ptr,
                                     &dumps, &option, &crc, &ndarray, &stride, &free_cpus))
        return NULL;
    /* interned: orjson recognises its keyword arguments by the identity of their names */
    PyObject *name = PyUnicode_InternFromString("option"), *kwnames = name ? PyTuple_Pack(1, name) : NULL;
    Py_XDECREF(name);
    if (kwnames == NULL) return NULL;
    Py_XSETREF(EncodeKwnames, kwnames);
    Py_INCREF(option); Py_XSETREF(EncodeOption, option);
    Py_INCREF(contig); Py_XSETREF(ContigFunc, contig);
    Py_INCREF(ptr); Py_XSETREF(PtrFunc, ptr);
    Py_INCREF(dumps); Py_XSETREF(EncodeFunc, dumps);
    Py_INCREF(tensor); Py_XSETREF(TensorType, tensor);
    PyObject *kinds_by_type = PyDict_New();
    if (kinds_by_type == NULL) return NULL;
    Py_XSETREF(TensorKinds, kinds_by_type);
    Py_INCREF(parameter); Py_XSETREF(ParameterType, parameter);
    Py_INCREF(names); Py_XSETREF(DtypeNames, names);
    Py_INCREF(kinds); Py_XSETREF(Kinds, kinds);
    Py_INCREF(scan); Py_XSETREF(ScanFunc, scan);
    Py_INCREF(crc); Py_XSETREF(CrcFunc, crc);
    Py_INCREF(ndarray); Py_XSETREF(ArrayType, ndarray);
    Py_INCREF(stride); Py_XSETREF(StrideFunc, stride);
    Py_INCREF(free_cpus); Py_XSETREF(FreeCpusFunc, free_cpus);
    Split = split;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(tensor, parameter, dtype_names, kinds, scan, split, is_contiguous, data_ptr, dumps,\n"
     "line_option, crc32, ndarray, stride, free_cpus): the MindSpore types, dtype names (dtype -> dump.json name), kernel kinds (dump.json\n"
     "name -> (kind, itemsize)), the kernel's scan, the element count from which fill() lets the\n"
     "kernel use free_cpus() threads, TensorPy's is_contiguous and _data_ptr, orjson.dumps and its\n"
     "newline option, the CRC-32 function of stats.crc32_hex, numpy.ndarray and TensorPy.stride."},
    {"encode_lines", (PyCFunction)(void (*)(void))encode_lines, METH_FASTCALL,
     "encode_lines(records, encode) -> (bytes, resolved records, any non-finite): resolve() each\n"
     "record and encode it as one journal line with orjson; a record that holds a non-finite float or\n"
     "that orjson refuses is encoded by encode(record, non_finite, line=True) instead."},
    {"stack_key", (PyCFunction)(void (*)(void))stack_key, METH_FASTCALL,
     "stack_key(skip, limit) -> tuple (id(code), f_lasti, ...) of the calling frames,\n"
     "innermost first, after skipping `skip` frames above the caller's, at most `limit` frames."},
    {"describe", (PyCFunction)(void (*)(void))describe, METH_FASTCALL,
     "describe(value, snapshot, slots, fallback) -> record structure (see the module docstring)."},
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL,
     "fill(slots, md5=False) -> None: leaves of plain CPU tensors (module docstring)."},
    {"fill_parameters", (PyCFunction)(void (*)(void))fill_parameters, METH_FASTCALL,
     "fill_parameters(slots, md5=False) -> int: leaves of the slots holding a Parameter read in place\n"
     "now (module docstring); returns how many were filled."},
    {"setup_calls", (PyCFunction)(void (*)(void))setup_calls, METH_VARARGS | METH_KEYWORDS,
     "setup_calls(dtype_type, float_dtypes): MindSpore's dtype base class (dtype objects are described\n"
     "in C) and the frozenset of floating-point dtypes whose tensors take gradients (grad_node)."},
    {"grad_node", (PyCFunction)grad_node, METH_O,
     "grad_node(value) -> BackwardNode or None: the autograd node of a floating-point Tensor that takes\n"
     "part in the gradient (msprobe.capture.backward._node_of)."},
    {"grad_targets", (PyCFunction)grad_targets, METH_O,
     "grad_targets(args) -> [(position, element or None, tensor, node, (node id, output index))]: the\n"
     "positional arguments, and tensors directly in list/tuple arguments, that take part in the gradient\n"
     "(msprobe.capture.backward._targets)."},
    {"single_mapping", (PyCFunction)(void (*)(void))single_mapping, METH_FASTCALL,
     "single_mapping(nodes, targets) -> [(edge index, (position, element))] or None: which edge of the one\n"
     "autograd node that made every output of a call leads to which argument (msprobe.capture.backward.\n"
     "_single_mapping, the same attributes read in the same order)."},
    {"slots_nbytes", (PyCFunction)slots_nbytes, METH_O,
     "slots_nbytes(slots) -> int: the sum of slot.nbytes() over a sequence of slots."},
    {"resolve", (PyCFunction)resolve, METH_O,
     "resolve(record: dict) -> (dict, bool): slots replaced by their leaves, and whether a float in it\n"
     "(an argument or a statistic) is NaN or infinite."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hotpath", "The dump's per-call path in C (see msprobe.tensors.hotpath).", -1,
    methods, NULL, NULL, NULL, NULL,
};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__hotpath(void) {
    INTERN(S_md5, "md5"); INTERN(S_type, "type"); INTERN(S_value, "value"); INTERN(S_dtype, "dtype"); INTERN(S_shape, "shape");
    INTERN(S_Max, "Max"); INTERN(S_Min, "Min"); INTERN(S_Mean, "Mean"); INTERN(S_Norm, "Norm");
    INTERN(S_tensor_type, "mindspore.Tensor"); INTERN(S_int, "int"); INTERN(S_float, "float");
    INTERN(S_str, "str"); INTERN(S_bool, "bool"); INTERN(S_leaf, "leaf");
    INTERN(S_a_dtype, "_dtype"); INTERN(S_a_shape, "_shape"); INTERN(S_a_init, "init"); INTERN(S_has_init, "has_init");
    INTERN(S_ms_dtype, "mindspore.dtype"); INTERN(S_grad_node, "_grad_node"); INTERN(S_requires_grad, "_requires_grad");
    INTERN(S_output_index, "_output_index"); INTERN(S_unique_id, "_unique_id"); INTERN(S_class, "__class__");
    INTERN(S_input_metadata, "_input_metadata"); INTERN(S_next_functions, "next_functions"); INTERN(S_is_leaf, "is_leaf");
    INTERN(S_name, "name"); INTERN(S_Contiguous, "Contiguous");
    if ((ObjectClass = _PyType_Lookup(&PyBaseObject_Type, S_class)) == NULL) return NULL;
    Py_INCREF(ObjectClass);
    if ((S_empty_tuple = PyTuple_New(0)) == NULL) return NULL;
    Tiny = 2.2250738585072014e-308;
    if (PyType_Ready(&SlotType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&SlotType);
    if (PyModule_AddObject(m, "TensorSlot", (PyObject *)&SlotType) < 0) {
        Py_DECREF(&SlotType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
