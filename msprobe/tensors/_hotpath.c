/* The per-call path of the dump in C: describing a call's values into pending tensor slots, filling
 * the slots' leaves with statistics at flush time, and resolving journal records. Each function
 * does what the Python code it stands for does (msprobe/tensors/hotpath.py names them), for the
 * common cases only; everything else is handed back to that Python code, so both give the same
 * records.
 *
 * Python API (configured once by msprobe.tensors.hotpath through setup()):
 *   TensorSlot(tensor, data_name, dtype, shape, type_name)   the pending slot type (records.py)
 *   describe(value, snapshot, slots, fallback, prefix=None) -> record structure
 *       exact None/bool/int/float/str, Tensor, exact list/tuple/dict, MindSpore dtype objects (after
 *       setup_calls()) here; anything else is fallback(value, depth, slots, snapshot[, prefix]). A Tensor becomes a TensorSlot appended to `slots`, its tensor
 *       snapshot(t) when it is a Parameter; no file name without `prefix` (str: the item name of
 *       `value`), else "<item name>.npy", the item name of a list/tuple item "<prefix>.<index>", of a
 *       dict value "<prefix>.<str(key)>", a name over 255 UTF-8 bytes shortened by
 *       msprobe.format.naming.shorten_file_name (naming.data_file_name's rule).
 *   fill(slots, md5=False) -> None
 *       leaves of CPU tensors read in place (native dtype, at least one element, no file name;
 *       a non-contiguous one is read through its strides by the kernel's scan_strided, which gives
 *       the statistics of its C-order copy bit for bit, or, for md5, copied in C order first, as the
 *       Python flush does), and of C-contiguous host snapshots (numpy arrays) of such tensors, through the
 *       statistics kernel, with the "md5" field (CRC-32 of the same bytes) when md5 is true; other
 *       slots keep leaf None for the Python flush. Each distinct memory (address, elements, kind,
 *       and the strides of a non-contiguous one) is read once, however many tensor objects show it. Call only when every queued operation
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
static PyObject *StridedFunc;    /* msprobe.tensors._stats_kernel.scan_strided, or NULL (setup's scan_strided) */
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
static PyObject *S_sequence_nr;

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

/* What describing and the gradient checks ask of a MindSpore dtype object, kept per object: its dump.json
 * name (DtypeNames[dtype]) and whether it is in FloatDtypes. Hashing a dtype calls its Python-level
 * __hash__ (~0.6 us, once per described tensor and per gradient check); the objects are immutable
 * singletons, so the answers are functions of the object, looked up here by identity. Only instances
 * of MindSpore's dtype class (DtypeBase) are kept, at most DTYPES_KEPT of them (each is kept alive). */
#define DTYPES_KEPT 32
typedef struct { PyObject *dtype, *name; int is_float; } DtypeInfo;  /* name: borrowed from DtypeNames, or NULL */
static DtypeInfo DtypesKept[DTYPES_KEPT];
static int DtypesCount;

static void forget_dtypes(void) {  /* setup() or setup_calls() changed DtypeNames or FloatDtypes */
    for (int i = 0; i < DtypesCount; i++) Py_CLEAR(DtypesKept[i].dtype);
    DtypesCount = 0;
}

/* the kept answers for `dtype`, or NULL (no exception set) when it is not kept: the caller asks the dict
 * and the set itself, which then raise what they raise */
static DtypeInfo *dtype_info(PyObject *dtype) {
    for (int i = 0; i < DtypesCount; i++)
        if (DtypesKept[i].dtype == dtype) return &DtypesKept[i];
    if (DtypesCount == DTYPES_KEPT || DtypeBase == NULL || FloatDtypes == NULL || DtypeNames == NULL ||
        !PyType_Check(DtypeBase) || !PyObject_TypeCheck(dtype, (PyTypeObject *)DtypeBase))
        return NULL;
    PyObject *name = PyDict_GetItemWithError(DtypeNames, dtype);  /* borrowed */
    int is_float = name == NULL && PyErr_Occurred() ? -1 : PySet_Contains(FloatDtypes, dtype);
    if (is_float < 0) { PyErr_Clear(); return NULL; }
    DtypeInfo *info = &DtypesKept[DtypesCount++];
    Py_INCREF(dtype);
    info->dtype = dtype;
    info->name = name;
    info->is_float = is_float;
    return info;
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

/* The .npy file name of the value whose item name is `prefix` (describe()'s naming): prefix + ".npy",
 * or, past MAX_FILE_NAME bytes, what ShortenFunc (msprobe.format.naming.shorten_file_name) makes of it.
 * A new reference, NULL on an error. */
#define MAX_FILE_NAME 255
static PyObject *ShortenFunc;
static PyObject *file_name(PyObject *prefix) {
    PyObject *name = PyUnicode_FromFormat("%U.npy", prefix);
    if (name == NULL) return NULL;
    Py_ssize_t size;
    if (PyUnicode_AsUTF8AndSize(name, &size) == NULL) { Py_DECREF(name); return NULL; }
    if (size <= MAX_FILE_NAME) return name;
    if (ShortenFunc == NULL) {
        PyObject *naming = PyImport_ImportModule("msprobe.format.naming");
        if (naming != NULL) ShortenFunc = PyObject_GetAttrString(naming, "shorten_file_name");
        Py_XDECREF(naming);
        if (ShortenFunc == NULL) { Py_DECREF(name); return NULL; }
    }
    Py_SETREF(name, PyObject_CallOneArg(ShortenFunc, name));
    return name;
}

/* `prefix`: the item name of the tensor (its .npy file is named after it), or NULL: no file */
static PyObject *tensor_slot(PyObject *t, PyObject *snapshot, PyObject *slots, PyObject *prefix) {
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
    DtypeInfo *info = dtype_info(dtype);
    PyObject *name = info != NULL ? info->name : PyDict_GetItemWithError(DtypeNames, dtype);  /* borrowed */
    if (name != NULL) Py_INCREF(name);
    else if (!PyErr_Occurred()) name = PyObject_Str(dtype);
    Py_DECREF(dtype);
    if (name == NULL) { Py_DECREF(held); return NULL; }
    PyObject *shape = PyObject_GetAttr(t, exact ? S_a_shape : S_shape), *list = NULL;
    if (shape != NULL) { list = PySequence_List(shape); Py_DECREF(shape); }
    if (list == NULL) { Py_DECREF(held); Py_DECREF(name); return NULL; }
    PyObject *data_name = prefix == NULL ? (Py_INCREF(Py_None), Py_None) : file_name(prefix);
    Slot *s = data_name == NULL ? NULL : slot_make(held, data_name, name, list, S_tensor_type);
    Py_DECREF(held); Py_DECREF(name); Py_DECREF(list); Py_XDECREF(data_name);
    if (s == NULL) return NULL;
    if (PyList_Append(slots, (PyObject *)s) < 0) { Py_DECREF(s); return NULL; }
    return (PyObject *)s;
}

static PyObject *describe_value(PyObject *v, int depth, PyObject *snapshot, PyObject *slots, PyObject *fallback,
                               PyObject *prefix);

/* the item name of `key` inside `prefix` ("prefix.key"), or NULL without an exception when `prefix` is
 * NULL (no file names); NULL with an exception on an error */
static PyObject *child_name(PyObject *prefix, PyObject *key) {
    return prefix == NULL ? NULL : PyUnicode_FromFormat("%U.%U", prefix, key);
}

static PyObject *describe_items(PyObject *seq, int depth, PyObject *snapshot, PyObject *slots,
                                PyObject *fallback, PyObject *prefix) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = prefix == NULL ? NULL : PyUnicode_FromFormat("%U.%zd", prefix, i);
        PyObject *d = prefix != NULL && name == NULL ? NULL
                      : describe_value(items[i], depth + 1, snapshot, slots, fallback, name);
        Py_XDECREF(name);
        if (d == NULL) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, d);
    }
    return out;
}

/* `prefix`: the item name of `v` when its tensors get .npy files (named after their item names), or
 * NULL; with a prefix, what is not described here goes to fallback(v, depth, slots, snapshot, prefix) */
static PyObject *describe_value(PyObject *v, int depth, PyObject *snapshot, PyObject *slots, PyObject *fallback,
                               PyObject *prefix) {
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
            d = seq ? describe_items(seq, depth, snapshot, slots, fallback, prefix) : NULL;
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
            PyObject *name = k ? child_name(prefix, k) : NULL;
            PyObject *d = k && (prefix == NULL || name != NULL)
                          ? describe_value(item, depth + 1, snapshot, slots, fallback, name) : NULL;
            int bad = d == NULL || PyDict_SetItem(out, k, d) < 0;
            Py_XDECREF(k); Py_XDECREF(name); Py_XDECREF(d); Py_DECREF(key); Py_DECREF(item);
            if (bad) { Py_LeaveRecursiveCall(); Py_DECREF(out); return NULL; }
        }
        Py_LeaveRecursiveCall();
        return out;
    }
    int t = is_instance(v, TensorType);
    if (t < 0) return NULL;
    if (t) return tensor_slot(v, snapshot, slots, prefix);
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
        r = PyObject_CallFunctionObjArgs(fallback, v, d, slots, snapshot, prefix, NULL);
        Py_DECREF(d);
    }
    return r;
}

static PyObject *describe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if ((nargs != 4 && nargs != 5) || !PyList_Check(args[2]) || (nargs == 5 && !PyUnicode_Check(args[4]) && args[4] != Py_None)) {
        PyErr_SetString(PyExc_TypeError, "describe(value, snapshot, slots: list, fallback, prefix: str | None = None)");
        return NULL;
    }
    if (TensorType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "msprobe.tensors._hotpath.setup() was not called");
        return NULL;
    }
    return describe_value(args[0], 0, args[1], args[2], args[3], nargs == 5 && args[4] != Py_None ? args[4] : NULL);
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

/* The layout of a non-contiguous tensor `t` of shape `shape`: (shape, strides in bytes) in *layout
 * (a new tuple), and its extent (bytes from the first element to the end of the last) in *extent.
 * Returns 3, or 0 when the Python flush must read it (a negative stride, more than MAX_DEPTH
 * dimensions, an unexpected stride()), -1 on an error. */
static int view_layout(PyObject *t, PyObject *shape, Py_ssize_t itemsize, PyObject **layout, Py_ssize_t *extent) {
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (ndim > MAX_DEPTH) return 0;
    PyObject *strides = PyObject_CallOneArg(StrideFunc, t), *seq;
    if (strides == NULL) return -1;
    seq = PySequence_Fast(strides, "stride() is no sequence");
    Py_DECREF(strides);
    if (seq == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(seq) != ndim) { Py_DECREF(seq); return 0; }
    PyObject *bytes = PyTuple_New(ndim);
    if (bytes == NULL) { Py_DECREF(seq); return -1; }
    *extent = itemsize;
    for (Py_ssize_t i = 0; i < ndim; i++) {
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        Py_ssize_t step = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        PyObject *b = step < 0 ? NULL : PyLong_FromSsize_t(step * itemsize);
        if (b == NULL) {
            Py_DECREF(seq); Py_DECREF(bytes);
            return PyErr_Occurred() ? -1 : 0;
        }
        PyTuple_SET_ITEM(bytes, i, b);
        *extent += (d - 1) * step * itemsize;
    }
    Py_DECREF(seq);
    *layout = PyTuple_Pack(2, shape, bytes);
    Py_DECREF(bytes);
    return *layout == NULL ? -1 : 3;
}

/* A non-contiguous tensor's elements (`count` of `itemsize` bytes from `data`, layout from
 * view_layout()) copied in C order into new memory (*owned: what numpy's ascontiguousarray of the
 * strided view gives, the Python flush's array, so the sums are the same bits; the caller frees it
 * with PyMem_RawFree). Returns 0, -1 on an error. */
static int gather(PyObject *layout, Py_ssize_t itemsize, Py_ssize_t count, const void *data, void **owned) {
    PyObject *shape = PyTuple_GET_ITEM(layout, 0), *bytes = PyTuple_GET_ITEM(layout, 1);
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape), dims[MAX_DEPTH], steps[MAX_DEPTH], index[MAX_DEPTH];
    for (Py_ssize_t i = 0; i < ndim; i++) {
        dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        steps[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(bytes, i));
        index[i] = 0;
    }
    char *out = PyMem_RawMalloc((size_t)(count * itemsize)), *dst = out;
    if (out == NULL) { PyErr_NoMemory(); return -1; }
    const char *src = (const char *)data;
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
    *owned = out;
    return 0;
}

/* The memory fill() reads for one slot: the contiguous bytes of a plain CPU tensor (read in place
 * through TensorPy._data_ptr) or of a C-contiguous host array (a Parameter's host snapshot, made by
 * the runtime), `n` elements of kind `kind_code` (borrowed), or the strided memory of a
 * non-contiguous tensor (*layout, *extent: view_layout()). Returns 1 when found contiguous, 3 when
 * strided (the caller owns *layout), 0 when the slot is the Python flush's, -1 on an error (the
 * caller clears it and leaves the slot to Python). */
static int slot_memory(Slot *s, void **data, Py_ssize_t *n, PyObject **kind_code, PyObject **layout,
                       Py_ssize_t *extent) {
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
    int found = ok ? 1 : view_layout(t, shape, itemsize, layout, extent);
    Py_DECREF(shape);
    return found;
}

/* The kernel's thread count for `n` elements: from SPLIT elements on, the kernel may split the work
 * over the CPUs free now (the result does not depend on how many threads ran), as
 * msprobe.tensors.scan.scan decides. A new reference, NULL on an error. */
static PyObject *threads_for(Py_ssize_t n) {
    return n >= Split ? PyObject_CallNoArgs(FreeCpusFunc) : PyLong_FromLong(1);
}

/* Statistics of the `n` elements of kind `kind_code` of a non-contiguous tensor at `data` (layout
 * and extent from view_layout()), read through its strides: (Max, Min, Mean, Norm), or None when
 * the Python flush must decide; NULL on an error. */
static PyObject *strided_stats(void *data, Py_ssize_t n, PyObject *kind_code, PyObject *layout, Py_ssize_t extent) {
    PyObject *view = PyMemoryView_FromMemory((char *)data, extent, PyBUF_READ);
    if (view == NULL) return NULL;
    PyObject *threads = threads_for(n);
    if (threads == NULL) { Py_DECREF(view); return NULL; }
    PyObject *scanned = PyObject_CallFunctionObjArgs(StridedFunc, view, kind_code, PyTuple_GET_ITEM(layout, 0),
                                                     PyTuple_GET_ITEM(layout, 1), threads, NULL);
    Py_DECREF(threads);
    Py_DECREF(view);
    if (scanned == NULL) return NULL;
    PyObject *out = stats_tuple(kind_code, scanned, n);
    Py_DECREF(scanned);
    return out;
}

/* Statistics of `n` elements of kind `kind_code` at `data`: (Max, Min, Mean, Norm[, md5]), or None
 * when the Python flush must decide; NULL on an error. */
static PyObject *memory_stats(void *data, Py_ssize_t n, PyObject *kind_code, int md5) {
    const char *code = PyUnicode_AsUTF8(kind_code);  /* "f4", "i8", "b1", ...: kind, item size */
    if (code == NULL) return NULL;
    Py_ssize_t itemsize = code[1] - '0';
    PyObject *view = PyMemoryView_FromMemory((char *)data, n * itemsize, PyBUF_READ);
    if (view == NULL) return NULL;
    PyObject *threads = threads_for(n);
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
    void *data = NULL;
    Py_ssize_t n = 0, extent = 0;
    PyObject *kind_code = NULL, *where = NULL, *layout = NULL;
    int found = slot_memory(s, &data, &n, &kind_code, &layout, &extent);
    if (found > 0) {
        where = layout == NULL ? Py_BuildValue("(NnO)", PyLong_FromVoidPtr(data), n, kind_code)
                               : Py_BuildValue("(NnOO)", PyLong_FromVoidPtr(data), n, kind_code, layout);
        if (where == NULL) { Py_XDECREF(layout); Py_DECREF(key); return NULL; }
        st = PyDict_GetItemWithError(by_memory, where);
        if (st != NULL) Py_INCREF(st);
        else if (PyErr_Occurred()) { Py_DECREF(where); Py_XDECREF(layout); Py_DECREF(key); return NULL; }
        else if (layout != NULL && StridedFunc != NULL && !md5) {
            st = strided_stats(data, n, kind_code, layout, extent);
        } else if (layout != NULL) {  /* md5 hashes the C-order bytes: a copy */
            void *owned = NULL;
            const char *code = PyUnicode_AsUTF8(kind_code);  /* "f4", "i8", ...: kind, item size */
            if (code != NULL && gather(layout, code[1] - '0', n, data, &owned) == 0) {
                st = memory_stats(owned, n, kind_code, md5);
                PyMem_RawFree(owned);
            }
        } else {
            st = memory_stats(data, n, kind_code, md5);
        }
        if (st == NULL) PyErr_Clear();  /* whatever failed, the Python flush reads it again and decides */
    } else if (found < 0) {
        PyErr_Clear();
    }
    Py_XDECREF(layout);
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
/* the frame's last instruction, as the Python key holds it (f_lasti, in bytes) */
static long frame_lasti(PyFrameObject *frame) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(frame);
#else
    return frame->f_lasti * (PY_VERSION_HEX >= 0x030A0000 ? 2 : 1);
#endif
}

static PyObject *frames_key(PyFrameObject *frame, Py_ssize_t limit) {
    Py_XINCREF(frame);
    PyObject *key = PyList_New(0);
    if (key == NULL) { Py_XDECREF(frame); return NULL; }
    for (Py_ssize_t depth = 0; frame != NULL && depth < limit; depth++) {
        PyObject *codeobj = (PyObject *)PyFrame_GetCode(frame);
        PyObject *code = PyLong_FromVoidPtr(codeobj);  /* id(code): what the Python key holds */
        Py_DECREF(codeobj);
        if (code == NULL) { Py_DECREF(frame); Py_DECREF(key); return NULL; }
        PyObject *lasti = PyLong_FromLong(frame_lasti(frame));
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

/* The pairs frames_key holds as ints, (code address, last instruction) of at most `limit` frames from
 * `frame` outwards, as the bytes of one array: no int object per frame (the compiled recorder finds a
 * stack it has seen by these bytes, Recorder.stack_raw). */
static PyObject *frames_raw(PyFrameObject *frame, Py_ssize_t limit) {
    uintptr_t local[512], *pairs = local;
    if (limit > 256 && (pairs = PyMem_Malloc(2 * (size_t)limit * sizeof(uintptr_t))) == NULL) return PyErr_NoMemory();
    Py_ssize_t n = 0;
    Py_XINCREF(frame);
    for (; frame != NULL && n < limit; n++) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        pairs[2 * n] = (uintptr_t)code;
        Py_DECREF(code);
        pairs[2 * n + 1] = (uintptr_t)frame_lasti(frame);
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    PyObject *raw = PyBytes_FromStringAndSize((const char *)pairs, 2 * n * (Py_ssize_t)sizeof(uintptr_t));
    if (pairs != local) PyMem_Free(pairs);
    return raw;
}

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
    PyObject *key = frames_key(frame, limit);
    Py_XDECREF(frame);
    return key;
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
    DtypeInfo *info = dtype == NULL ? NULL : dtype_info(dtype);
    int keep = dtype == NULL ? -1 : info != NULL ? info->is_float : PySet_Contains(FloatDtypes, dtype);
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

/* backward.consumer_edges(nodes, targets, mark, max_walk): walking back from `nodes` through the nodes made
 * after `mark` (sequence number), the edges into nodes whose unique id is in the set `targets`:
 * {(target id, output index): [(node, edge index)]}; None when more than `max_walk` nodes are walked. The
 * same attributes read in the same order as the Python function. */
static PyObject *consumer_edges(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "consumer_edges(nodes, targets, mark, max_walk)");
        return NULL;
    }
    PyObject *targets = args[1], *mark = args[2];
    Py_ssize_t max_walk = PyLong_AsSsize_t(args[3]);
    if (max_walk == -1 && PyErr_Occurred()) return NULL;
    if (!PyAnySet_Check(targets)) {
        PyErr_SetString(PyExc_TypeError, "consumer_edges(): targets is a set of node ids");
        return NULL;
    }
    PyObject *nodes = PySequence_Fast(args[0], "consumer_edges(): nodes is a sequence");
    if (nodes == NULL) return NULL;
    PyObject *stack = PyList_New(0), *seen = PySet_New(NULL), *found = PyDict_New(), *out = NULL;
    if (stack == NULL || seen == NULL || found == NULL) goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(nodes); i++) {
        PyObject *node = PySequence_Fast_GET_ITEM(nodes, i);
        PyObject *uid = PyObject_CallMethodNoArgs(node, S_unique_id);
        if (uid == NULL) goto done;
        int known = PySet_Contains(seen, uid);
        if (known == 0) known = PySet_Contains(targets, uid);
        int bad = known < 0 || (known == 0 && (PySet_Add(seen, uid) < 0 || PyList_Append(stack, node) < 0));
        Py_DECREF(uid);
        if (bad) goto done;
    }
    while (PyList_GET_SIZE(stack) > 0) {
        Py_ssize_t last = PyList_GET_SIZE(stack) - 1;
        PyObject *node = PyList_GET_ITEM(stack, last);
        Py_INCREF(node);
        if (PyList_SetSlice(stack, last, last + 1, NULL) < 0) { Py_DECREF(node); goto done; }
        PyObject *next = PyObject_GetAttr(node, S_next_functions), *edges = NULL;
        if (next != NULL) edges = PySequence_Fast(next, "next_functions is no sequence");
        Py_XDECREF(next);
        int bad = edges == NULL;
        for (Py_ssize_t j = 0; !bad && j < PySequence_Fast_GET_SIZE(edges); j++) {
            PyObject *pair = PySequence_Fast(PySequence_Fast_GET_ITEM(edges, j), "an edge is no pair");
            if (pair == NULL || PySequence_Fast_GET_SIZE(pair) != 2) {
                if (pair != NULL) {
                    Py_DECREF(pair);
                    PyErr_SetString(PyExc_ValueError, "an edge of next_functions is no (node, output index) pair");
                }
                bad = 1;
                break;
            }
            PyObject *edge = PySequence_Fast_GET_ITEM(pair, 0), *uid = NULL;
            if (edge == Py_None) { Py_DECREF(pair); continue; }
            uid = PyObject_CallMethodNoArgs(edge, S_unique_id);
            int target = uid == NULL ? -1 : PySet_Contains(targets, uid);
            if (target > 0) {
                PyObject *key = PyTuple_Pack(2, uid, PySequence_Fast_GET_ITEM(pair, 1)), *list = NULL, *index = NULL,
                         *item = NULL;
                if (key != NULL) {
                    list = PyDict_GetItemWithError(found, key);  /* borrowed */
                    if (list == NULL && !PyErr_Occurred() && (list = PyList_New(0)) != NULL) {
                        if (PyDict_SetItem(found, key, list) < 0) list = NULL;
                        Py_XDECREF(list);  /* the dict holds it (or it is gone on an error) */
                    }
                }
                if (list != NULL) index = PyLong_FromSsize_t(j);
                if (index != NULL) item = PyTuple_Pack(2, node, index);
                bad = item == NULL || PyList_Append(list, item) < 0;
                Py_XDECREF(key); Py_XDECREF(index); Py_XDECREF(item);
            } else if (target == 0) {
                int walk = PySet_Contains(seen, uid) == 0 ? 1 : -2;  /* -2: seen (or an error, checked below) */
                if (walk == -2 && PyErr_Occurred()) walk = -1;
                if (walk == 1) {
                    PyObject *seq = PyObject_CallMethodNoArgs(edge, S_sequence_nr);
                    walk = seq == NULL ? -1 : PyObject_RichCompareBool(seq, mark, Py_GT);
                    Py_XDECREF(seq);
                }
                if (walk == 1) {
                    PyObject *flag = PyObject_CallMethodNoArgs(edge, S_is_leaf);
                    int leaf = flag == NULL ? -1 : PyObject_IsTrue(flag);
                    Py_XDECREF(flag);
                    walk = leaf < 0 ? -1 : !leaf;
                }
                if (walk == 1) {
                    bad = PySet_Add(seen, uid) < 0;
                    if (!bad && PySet_GET_SIZE(seen) > max_walk) {
                        Py_DECREF(uid); Py_DECREF(pair); Py_DECREF(edges); Py_DECREF(node);
                        out = Py_None; Py_INCREF(out);
                        goto done;
                    }
                    bad = bad || PyList_Append(stack, edge) < 0;
                } else if (walk == -1) {
                    bad = 1;
                }
            } else {
                bad = 1;
            }
            Py_XDECREF(uid);
            Py_DECREF(pair);
        }
        Py_XDECREF(edges);
        Py_DECREF(node);
        if (bad) goto done;
    }
    out = found;
    found = NULL;
done:
    Py_DECREF(nodes);
    Py_XDECREF(stack); Py_XDECREF(seen); Py_XDECREF(found);
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
    forget_dtypes();
    Py_RETURN_NONE;
}


/* ------------------------------------------------------------------ replay (journal) */
static PyObject *S_e, *S_stack, *S_p, *S_i, *S_n, *S_k, *S_v, *S_c, *S_s, *S_f, *S_apply;
static PyObject *S_data, *S_construct, *S_frames_attr, *S_stack_names;

/* dict.setdefault(key, new empty dict or list) of a mapping; borrowed, NULL with an error set */
static PyObject *set_default(PyObject *dict, PyObject *key, int list) {
    PyObject *got = PyDict_GetItemWithError(dict, key);
    if (got != NULL || PyErr_Occurred()) return got;
    PyObject *fresh = list ? PyList_New(0) : PyDict_New();
    if (fresh == NULL) return NULL;
    int bad = PyDict_SetItem(dict, key, fresh);
    Py_DECREF(fresh);
    return bad ? NULL : fresh;
}

/* Replay.on_item: item `i` of the `n`-item list data[e][k] (a shorter or missing list replaced by one
   padded with None); 1 applied, 0 a case left to Replay.apply, -1 error */
static int replay_item(PyObject *rec, PyObject *e, PyObject *data) {
    PyObject *k = PyDict_GetItemWithError(rec, S_k), *i = k ? PyDict_GetItemWithError(rec, S_i) : NULL;
    PyObject *n = i ? PyDict_GetItemWithError(rec, S_n) : NULL, *v = n ? PyDict_GetItemWithError(rec, S_v) : NULL;
    if (v == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyLong_CheckExact(i) || !PyLong_CheckExact(n)) return 0;
    Py_ssize_t index = PyLong_AsSsize_t(i), size = PyLong_AsSsize_t(n);
    if ((index == -1 || size == -1) && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    PyObject *body = PyDict_GetItemWithError(data, e);
    if (body == NULL && PyErr_Occurred()) return -1;
    if (body != NULL && !PyDict_CheckExact(body)) return 0;
    PyObject *seq = body ? PyDict_GetItemWithError(body, k) : NULL;
    if (seq == NULL && PyErr_Occurred()) return -1;
    if (seq == Py_None) seq = NULL;
    if (seq != NULL && !PyList_CheckExact(seq)) return 0;
    Py_ssize_t have = seq ? PyList_GET_SIZE(seq) : 0, length = have < size ? size : have;
    if (index < 0 || index >= length) return 0;  /* negative or out of range: Python's indexing decides */
    if (body == NULL && (body = set_default(data, e, 0)) == NULL) return -1;
    if (have < size) {  /* a new list, as (seq or []) + [None] * (size - len(seq or [])) makes */
        PyObject *grown = PyList_New(size);
        if (grown == NULL) return -1;
        for (Py_ssize_t j = 0; j < size; j++) {
            PyObject *item = j < have ? PyList_GET_ITEM(seq, j) : Py_None;
            Py_INCREF(item);
            PyList_SET_ITEM(grown, j, item);
        }
        int bad = PyDict_SetItem(body, k, grown);
        Py_DECREF(grown);
        if (bad) return -1;
        seq = grown;  /* held by body */
    }
    Py_INCREF(v);
    return PyList_SetItem(seq, index, v) < 0 ? -1 : 1;
}

/* 1: applied, 0: not one of the common cases (the caller asks Replay.apply), -1: error */
static int replay_line(PyObject *rec, PyObject *data, PyObject *construct, PyObject *frames, PyObject *names) {
    PyObject *e, *a, *b;
    if (!PyDict_CheckExact(rec)) return 0;
    if ((e = PyDict_GetItemWithError(rec, S_e)) != NULL) {
        if ((a = PyDict_GetItemWithError(rec, S_stack)) != NULL) {  /* stack_ref */
            b = PyDict_GetItemWithError(rec, S_v);
            if (b == NULL && PyErr_Occurred()) return -1;
            if (b == Py_None) b = NULL;
            if (b != NULL && !PyDict_CheckExact(b)) return 0;
            PyObject *got = PyDict_GetItemWithError(data, e);
            if (got == NULL && PyErr_Occurred()) return -1;
            if (got != NULL && !PyDict_CheckExact(got)) return 0;
            PyObject *list = PyDict_GetItemWithError(names, a);
            if (list == NULL && PyErr_Occurred()) return -1;
            if (list != NULL && !PyList_CheckExact(list)) return 0;
            if (got == NULL && (got = set_default(data, e, 0)) == NULL) return -1;
            if (list == NULL && (list = set_default(names, a, 1)) == NULL) return -1;
            if (PyList_Append(list, e) < 0) return -1;
            return b == NULL ? 1 : (PyDict_Update(got, b) < 0 ? -1 : 1);
        }
        if (PyErr_Occurred()) return -1;
        if (PyDict_Contains(rec, S_p)) return 0;
        if (PyDict_Contains(rec, S_i) || PyDict_Contains(rec, S_n)) return replay_item(rec, e, data);
        a = PyDict_GetItemWithError(rec, S_k);
        b = a != NULL ? PyDict_GetItemWithError(rec, S_v) : NULL;
        if (b == NULL) return PyErr_Occurred() ? -1 : 0;  /* a whole entry, or a malformed line */
        PyObject *got = PyDict_GetItemWithError(data, e);  /* set_key */
        if (got == NULL && PyErr_Occurred()) return -1;
        if (got != NULL && !PyDict_CheckExact(got)) return 0;
        if (got == NULL && (got = set_default(data, e, 0)) == NULL) return -1;
        return PyDict_SetItem(got, a, b) < 0 ? -1 : 1;
    }
    if (PyErr_Occurred()) return -1;
    if ((a = PyDict_GetItemWithError(rec, S_c)) != NULL) {  /* construct_edge */
        b = PyDict_GetItemWithError(rec, S_p);
        if (b == NULL) return PyErr_Occurred() ? -1 : 0;
        return PyDict_SetItem(construct, a, b) < 0 ? -1 : 1;
    }
    if (PyErr_Occurred()) return -1;
    if ((a = PyDict_GetItemWithError(rec, S_s)) != NULL) {  /* stack_frames */
        b = PyDict_GetItemWithError(rec, S_f);
        if (b == NULL) return PyErr_Occurred() ? -1 : 0;
        return PyDict_SetItem(frames, a, b) < 0 ? -1 : 1;
    }
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *replay_lines(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "replay_lines(state, lines)");
        return NULL;
    }
    PyObject *state = args[0], *parts[4] = {NULL, NULL, NULL, NULL}, *attrs[4] = {S_data, S_construct,
                                                                                   S_frames_attr, S_stack_names};
    PyObject *seq = NULL, *result = NULL;
    for (int j = 0; j < 4; j++) {
        if ((parts[j] = PyObject_GetAttr(state, attrs[j])) == NULL) goto done;
        if (!PyDict_Check(parts[j])) {
            PyErr_SetString(PyExc_TypeError, "replay_lines() needs a Replay state (dicts data, construct, ...)");
            goto done;
        }
    }
    if ((seq = PySequence_Fast(args[1], "replay_lines() needs a sequence of lines")) == NULL) goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i);
        int got = replay_line(rec, parts[0], parts[1], parts[2], parts[3]);
        if (got < 0) goto done;
        if (got == 0) {  /* the other kinds (header, items, paths, whole entries): Replay.apply */
            PyObject *r = PyObject_CallMethodOneArg(state, S_apply, rec);
            if (r == NULL) goto done;
            Py_DECREF(r);
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(seq);
    for (int j = 0; j < 4; j++) Py_XDECREF(parts[j]);
    return result;
}

/* ------------------------------------------------------------------ setup */
static PyObject *setup(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"tensor", "parameter", "dtype_names", "kinds", "scan", "split", "is_contiguous",
                               "data_ptr", "dumps", "line_option", "crc32", "ndarray", "stride", "free_cpus",
                               "scan_strided", NULL};
    PyObject *tensor, *parameter, *names, *kinds, *scan, *contig, *ptr, *dumps, *option, *crc, *ndarray, *stride,
        *free_cpus, *strided = NULL;
    Py_ssize_t split;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!OnOOOOOOOO|O:setup", keywords, &tensor, &parameter,
                                     &PyDict_Type, &names, &PyDict_Type, &kinds, &scan, &split, &contig, &ptr,
                                     &dumps, &option, &crc, &ndarray, &stride, &free_cpus, &strided))
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
    forget_dtypes();
    Py_INCREF(kinds); Py_XSETREF(Kinds, kinds);
    Py_INCREF(scan); Py_XSETREF(ScanFunc, scan);
    if (strided == Py_None) strided = NULL;
    Py_XINCREF(strided); Py_XSETREF(StridedFunc, strided);
    Py_INCREF(crc); Py_XSETREF(CrcFunc, crc);
    Py_INCREF(ndarray); Py_XSETREF(ArrayType, ndarray);
    Py_INCREF(stride); Py_XSETREF(StrideFunc, stride);
    Py_INCREF(free_cpus); Py_XSETREF(FreeCpusFunc, free_cpus);
    Split = split;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ one recorded call (capture/calls.py) */
/* Who hooks a call's gradients: a BackwardProbe (observe_plain), or the compiled recorder for a call it
 * records (no probe object: the runtime and the backward entry directly, the probe's token read as
 * BackwardProbe.__init__ reads it). */
typedef struct {
    PyObject *probe;  /* the BackwardProbe, or NULL */
    PyObject *rt, *entry;  /* the runtime and the backward entry when probe is NULL */
    int want_input, want_output;
} Observer;

/* defined with the backward hooks below */
static int observe_tensor(Observer *o, PyObject *args, PyObject *out);

/* Recorder(recorder, runtime, hotpath_module, parts: dict): CallRecorder.fast_call in C, for a call whose
 * inputs and Tensor output are described here. Called as recorder(api, original, args, kwargs,
 * inplace=False) like the Python method; CallWrapper calls it without building a call. What is not the
 * common case is handed to the Python parts (the general path `slow`, the Python common case `python`
 * when the inputs cannot be described in C, `finish` for any output but one exact Tensor), so both give
 * the same journal lines in the same order. */
typedef struct {
    PyObject_HEAD
    PyObject *rt, *hotpath, *slow, *python, *finish, *tool_error, *probe_type, *grad_enabled, *backward_of,
        *fallback, *forks, *stacks, *stack_ids, *rendered, *stack_miss, *lock_acquire, *lock_release;
    /* frames_raw bytes -> stack id of the stacks this recorder has seen: the ids of stacks._ids, whose key
     * holds the same frames (their code objects are kept alive by the StackTable, so no address in these
     * bytes is reused) */
    PyObject *stack_raw;
    int extra_info, track_parents, backward, max_walk;
    PyObject *bwd_in, *bwd_out;
    int want_input, want_output;  /* bwd_in, bwd_out as truth values */
    Py_ssize_t observed;  /* calls whose gradients were hooked here, without a BackwardProbe object */
    char observe_here;  /* 1: observe_tensor first (the default); 0: every call through a BackwardProbe's observe */
    PyObject *unchanged;  /* the runtime's _unchanged: a Parameter described as it is (read at once) */
    int md5;
    vectorcallfunc vectorcall;
} Recorder;

static PyObject *S_parameters_now;
static PyObject *S_recomputing, *S_failed, *S_tls, *S_depth, *S_counters, *S_snapshot, *S_asked, *S_input_args,
    *S_input_kwargs, *S_output, *S_writer, *S_pending, *S_emitted, *S_added, *S_flush, *S_user_error, *S_raise_user_error, *S_cell_stack, *S_running, *S_fork,
    *S_ext, *S_forward, *S_backward, *S_wait_kw, *S_ms_prefix;

static PyTypeObject RecorderType;

/* the object fields of a Recorder, for the garbage collector's traverse and clear */
#define RECORDER_OBJECTS(X) X(rt) X(hotpath) X(slow) X(python) X(finish) X(tool_error) X(probe_type) \
    X(grad_enabled) X(backward_of) X(fallback) X(forks) X(stacks) X(stack_ids) X(rendered) X(stack_miss) X(stack_raw) \
    X(lock_acquire) X(lock_release) X(bwd_in) X(bwd_out) X(unchanged)

static int recorder_traverse(Recorder *r, visitproc visit, void *arg) {
#define VISIT_FIELD(name) Py_VISIT(r->name);
    RECORDER_OBJECTS(VISIT_FIELD)
#undef VISIT_FIELD
    return 0;
}

static int recorder_clear(Recorder *r) {
#define CLEAR_FIELD(name) Py_CLEAR(r->name);
    RECORDER_OBJECTS(CLEAR_FIELD)
#undef CLEAR_FIELD
    return 0;
}

static void recorder_dealloc(Recorder *r) {
    PyObject_GC_UnTrack(r);
    recorder_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *part(PyObject *parts, const char *name) {
    PyObject *v = PyDict_GetItemString(parts, name);  /* borrowed */
    if (v == NULL) PyErr_Format(PyExc_KeyError, "Recorder: part %s missing", name);
    else Py_INCREF(v);
    return v;
}

static PyObject *recorder_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"runtime", "hotpath", "parts", NULL};
    PyObject *rt, *mod, *parts;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!:Recorder", keywords, &rt, &mod, &PyDict_Type, &parts))
        return NULL;
    Recorder *r = PyObject_GC_New(Recorder, type);
    if (r == NULL) return NULL;
    memset(&r->rt, 0, offsetof(Recorder, vectorcall) - offsetof(Recorder, rt));
    r->vectorcall = recorder_vectorcall;
    r->observe_here = 1;
    Py_INCREF(rt); r->rt = rt;
    Py_INCREF(mod); r->hotpath = mod;
    PyObject_GC_Track(r);
    PyObject *lock = NULL, *flags = NULL;
    if ((r->slow = part(parts, "slow")) == NULL || (r->python = part(parts, "python")) == NULL ||
        (r->finish = part(parts, "finish")) == NULL || (r->tool_error = part(parts, "tool_error")) == NULL ||
        (r->probe_type = part(parts, "probe")) == NULL || (r->grad_enabled = part(parts, "grad_enabled")) == NULL ||
        (r->backward_of = part(parts, "backward_of")) == NULL || (r->fallback = part(parts, "fallback")) == NULL ||
        (r->forks = part(parts, "forks")) == NULL || (r->stacks = part(parts, "stacks")) == NULL ||
        (r->bwd_in = part(parts, "bwd_in")) == NULL || (r->bwd_out = part(parts, "bwd_out")) == NULL ||
        (r->unchanged = part(parts, "unchanged")) == NULL ||
        (lock = part(parts, "lock")) == NULL || (flags = part(parts, "max_walk")) == NULL)
        goto fail;
    r->max_walk = (int)PyLong_AsLong(flags);
    Py_CLEAR(flags);
    if (r->max_walk < 0 && PyErr_Occurred()) goto fail;
    if ((r->lock_acquire = PyObject_GetAttrString(lock, "acquire")) == NULL ||
        (r->lock_release = PyObject_GetAttrString(lock, "release")) == NULL ||
        (r->stack_ids = PyObject_GetAttrString(r->stacks, "_ids")) == NULL ||
        (r->rendered = PyObject_GetAttrString(r->stacks, "rendered")) == NULL ||
        (r->stack_miss = PyObject_GetAttrString(r->stacks, "of_caller")) == NULL ||
        (r->stack_raw = PyDict_New()) == NULL)
        goto fail;
    Py_CLEAR(lock);
    if (!PyDict_Check(r->stack_ids) || !PyList_Check(r->rendered)) {
        PyErr_SetString(PyExc_TypeError, "Recorder: stacks._ids must be a dict, stacks.rendered a list");
        goto fail;
    }
    const char *names[] = {"extra_info", "track_parents", "backward", "md5", "bwd_in", "bwd_out"};
    int *dest[] = {&r->extra_info, &r->track_parents, &r->backward, &r->md5, &r->want_input, &r->want_output};
    for (int i = 0; i < 6; i++) {
        PyObject *v = part(parts, names[i]);
        if (v == NULL) goto fail;
        *dest[i] = PyObject_IsTrue(v);
        Py_DECREF(v);
        if (*dest[i] < 0) goto fail;
    }
    return (PyObject *)r;
fail:
    Py_XDECREF(lock); Py_XDECREF(flags);
    Py_DECREF(r);
    return NULL;
}

/* ---- small pieces of the Runtime, read as its Python code reads them */
static int truth_attr(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* getattr(rt._tls, "depth", 0), or -1 on an error */
static Py_ssize_t tls_depth(PyObject *rt) {
    PyObject *tls = PyObject_GetAttr(rt, S_tls);
    if (tls == NULL) return -1;
    PyObject *d = PyObject_GetAttr(tls, S_depth);
    Py_DECREF(tls);
    if (d == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t n = PyLong_AsSsize_t(d);
    Py_DECREF(d);
    return n;
}

static int set_depth(PyObject *rt, Py_ssize_t depth) {
    PyObject *tls = PyObject_GetAttr(rt, S_tls);
    if (tls == NULL) return -1;
    PyObject *d = PyLong_FromSsize_t(depth);
    int r = d == NULL ? -1 : PyObject_SetAttr(tls, S_depth, d);
    Py_XDECREF(d);
    Py_DECREF(tls);
    return r;
}

/* Runtime.capturing(): running, depth 0 on this thread, the process that made the runtime */
static int capturing(PyObject *rt, PyObject *forks) {
    int running = truth_attr(rt, S_running);
    if (running <= 0) return running;
    Py_ssize_t depth = tls_depth(rt);
    if (depth != 0) return depth < 0 ? -1 : 0;
    PyObject *fork = PyObject_GetAttr(rt, S_fork);
    if (fork == NULL) return -1;
    PyObject *now = PyList_Check(forks) && PyList_GET_SIZE(forks) > 0 ? PyList_GET_ITEM(forks, 0) : NULL;
    int same = now == NULL ? 0 : PyObject_RichCompareBool(now, fork, Py_EQ);
    Py_DECREF(fork);
    return same;
}

/* Runtime.leave() after a call that returned `out` (stolen; NULL: an exception propagates, which goes on
 * unchanged, as Python's `finally: rt.leave()` does while it is handled). */
static PyObject *leave(PyObject *rt, PyObject *out) {
    PyObject *type, *value, *tb;
    if (out == NULL) PyErr_Fetch(&type, &value, &tb);
    Py_ssize_t depth = tls_depth(rt);
    int bad = depth < 0 || set_depth(rt, depth - 1) < 0;
    if (out == NULL) {
        if (bad) PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (bad) { Py_DECREF(out); return NULL; }
    if (depth - 1 == 0) {
        PyObject *pending = PyObject_GetAttr(rt, S_user_error);
        if (pending == NULL) { Py_DECREF(out); return NULL; }
        int waiting = pending != Py_None;
        Py_DECREF(pending);
        if (waiting) {
            PyObject *r = PyObject_CallMethodNoArgs(rt, S_raise_user_error);
            if (r == NULL) { Py_DECREF(out); return NULL; }
            Py_DECREF(r);
        }
    }
    return out;
}

static int add_asked(PyObject *rt, long n) {
    PyObject *v = PyObject_GetAttr(rt, S_asked);
    if (v == NULL) return -1;
    PyObject *k = PyLong_FromLong(n), *sum = k ? PyNumber_Add(v, k) : NULL;
    Py_DECREF(v); Py_XDECREF(k);
    int r = sum == NULL ? -1 : PyObject_SetAttr(rt, S_asked, sum);
    Py_XDECREF(sum);
    return r;
}

/* counters[api] (0 when absent), advanced; -1 on an error. No other thread runs in between (the GIL is
 * held and no Python code runs), which is what Runtime.begin_call's lock gives the Python code. */
static Py_ssize_t next_count(PyObject *rt, PyObject *api) {
    PyObject *counters = PyObject_GetAttr(rt, S_counters);
    if (counters == NULL) return -1;
    if (!PyDict_Check(counters)) {
        Py_DECREF(counters);
        PyErr_SetString(PyExc_TypeError, "Runtime.counters is not a dict");
        return -1;
    }
    PyObject *v = PyDict_GetItemWithError(counters, api);
    Py_ssize_t n = 0;
    if (v != NULL) n = PyLong_AsSsize_t(v);
    if ((v == NULL && PyErr_Occurred()) || (n == -1 && PyErr_Occurred())) { Py_DECREF(counters); return -1; }
    PyObject *next = PyLong_FromSsize_t(n + 1);
    int bad = next == NULL || PyDict_SetItem(counters, api, next) < 0;
    Py_XDECREF(next);
    Py_DECREF(counters);
    return bad ? -1 : n;
}

/* a tool failure (an Exception, not a BaseException such as KeyboardInterrupt) reported as the Python code
 * does (CallRecorder._tool_error); 0 when reported, -1 when the error must propagate */
static int report(Recorder *r, PyObject *api, PyObject *value) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL && exc != NULL) PyException_SetTraceback(exc, tb);
    PyObject *res = exc == NULL ? NULL : PyObject_CallFunctionObjArgs(r->tool_error, api, exc, value, NULL);
    Py_XDECREF(type); Py_XDECREF(exc); Py_XDECREF(tb);
    if (res == NULL) return -1;
    Py_DECREF(res);
    return 0;
}

static int append_pair(PyObject *pending, PyObject *writer, PyObject *line) {
    if (line == NULL) return -1;
    PyObject *pair = PyTuple_Pack(2, writer, line);
    Py_DECREF(line);
    if (pair == NULL) return -1;
    int bad = PyList_Append(pending, pair);
    Py_DECREF(pair);
    return bad;
}

static PyObject *dict2(PyObject *k1, PyObject *v1, PyObject *k2, PyObject *v2) {
    PyObject *d = PyDict_New();
    if (d != NULL && (PyDict_SetItem(d, k1, v1) < 0 || PyDict_SetItem(d, k2, v2) < 0)) Py_CLEAR(d);
    return d;
}

/* (id(code), f_lasti, ...) from `frame` outwards, at most `limit` frames (stacks.stack_key) */
static PyObject *frames_key(PyFrameObject *frame, Py_ssize_t limit);
static PyObject *frames_raw(PyFrameObject *frame, Py_ssize_t limit);

/* Runtime.end_call for a Tensor output described into `body`: the stack-use line with the body (the
 * stack's frames line before it on its first use in the step) or one key line per body item, then the
 * construct edges, added to the batch under the runtime's lock; the batch flushed when due. */
static int queue_call(Recorder *r, PyObject *fwd, PyObject *body, PyObject *slots, PyObject *edges) {
    PyObject *rt = r->rt, *key = NULL, *raw = NULL;
    if (r->extra_info) {
        raw = frames_raw(PyEval_GetFrame(), r->max_walk);
        if (raw == NULL) return -1;
    }
    PyObject *writer = PyObject_GetAttr(rt, S_writer), *pending = NULL, *emitted = NULL, *sid = NULL;
    if (writer == NULL) { Py_XDECREF(raw); return -1; }
    PyObject *held = PyObject_CallNoArgs(r->lock_acquire);
    if (held == NULL) { Py_DECREF(writer); Py_XDECREF(raw); return -1; }
    Py_DECREF(held);
    int bad = 1, full = 0;
    if ((pending = PyObject_GetAttr(rt, S_pending)) == NULL || !PyList_Check(pending)) goto unlock;
    if (r->extra_info) {
        sid = PyDict_GetItemWithError(r->stack_raw, raw);
        if (sid != NULL) Py_INCREF(sid);
        else if (PyErr_Occurred()) goto unlock;
        else {  /* a stack this recorder has not seen: its id by the StackTable's key (StackTable.of_caller) */
            if ((key = frames_key(PyEval_GetFrame(), r->max_walk)) == NULL) goto unlock;
            sid = PyDict_GetItemWithError(r->stack_ids, key);
            if (sid != NULL) Py_INCREF(sid);
            else if (PyErr_Occurred() || (sid = PyObject_CallOneArg(r->stack_miss, key)) == NULL) goto unlock;
            if (PyDict_SetItem(r->stack_raw, raw, sid) < 0) goto unlock;
        }
        if ((emitted = PyObject_GetAttr(rt, S_emitted)) == NULL || !PySet_Check(emitted)) goto unlock;
        int seen = PySet_Contains(emitted, sid);
        if (seen < 0) goto unlock;
        if (!seen) {
            Py_ssize_t i = PyLong_AsSsize_t(sid);
            if (i == -1 && PyErr_Occurred()) goto unlock;
            if (i < 0 || i >= PyList_GET_SIZE(r->rendered)) {
                PyErr_SetString(PyExc_IndexError, "stack id without rendered frames");
                goto unlock;
            }
            if (PySet_Add(emitted, sid) < 0 ||
                append_pair(pending, writer, dict2(S_s, sid, S_f, PyList_GET_ITEM(r->rendered, i))) < 0)
                goto unlock;
        }
        PyObject *line = dict2(S_e, fwd, S_stack, sid);
        if (line != NULL && PyDict_SetItem(line, S_v, body) < 0) Py_CLEAR(line);
        if (append_pair(pending, writer, line) < 0) goto unlock;
    } else {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(body, &pos, &k, &v)) {
            PyObject *line = dict2(S_e, fwd, S_k, k);
            if (line != NULL && PyDict_SetItem(line, S_v, v) < 0) Py_CLEAR(line);
            if (append_pair(pending, writer, line) < 0) goto unlock;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(edges); i++) {
        PyObject *edge = PyTuple_GET_ITEM(edges, i);
        if (append_pair(pending, writer, dict2(S_c, PyTuple_GET_ITEM(edge, 0), S_p, PyTuple_GET_ITEM(edge, 1))) < 0)
            goto unlock;
    }
    PyObject *due = PyObject_CallMethodOneArg(rt, S_added, slots);
    if (due == NULL) goto unlock;
    full = PyObject_IsTrue(due);
    Py_DECREF(due);
    bad = full < 0;
unlock:
    {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *released = PyObject_CallNoArgs(r->lock_release);
        if (released == NULL) { bad = 1; Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb); }
        else { Py_DECREF(released); PyErr_Restore(type, value, tb); }
    }
    if (bad && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "Runtime._pending is not a list or _emitted_stacks not a set");
    Py_XDECREF(key); Py_XDECREF(raw); Py_XDECREF(writer); Py_XDECREF(pending); Py_XDECREF(emitted); Py_XDECREF(sid);
    if (bad) return -1;
    if (full) {
        PyObject *kw = PyDict_New(), *res = NULL, *flush = NULL;
        if (kw != NULL && PyDict_SetItem(kw, S_wait_kw, Py_False) == 0 && (flush = PyObject_GetAttr(rt, S_flush)) != NULL)
            res = PyObject_Call(flush, S_empty_tuple, kw);
        Py_XDECREF(kw); Py_XDECREF(flush);
        if (res == NULL) return -1;
        Py_DECREF(res);
    }
    return 0;
}

/* the call's Cell parent (runtime.cell_stack[-1], or None): new reference */
static PyObject *parent_of(PyObject *rt) {
    PyObject *stack = PyObject_GetAttr(rt, S_cell_stack);
    if (stack == NULL) return NULL;
    PyObject *parent = PyList_Check(stack) && PyList_GET_SIZE(stack) ? PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1)
                                                                      : Py_None;
    Py_INCREF(parent);
    Py_DECREF(stack);
    return parent;
}

/* an exact None, bool, int, float or str: described in C, never a work handle (async_handles._NO_HANDLE) */
static int plain_scalar(PyObject *v) {
    PyTypeObject *tp = Py_TYPE(v);
    return v == Py_None || tp == &PyBool_Type || tp == &PyLong_Type || tp == &PyFloat_Type || tp == &PyUnicode_Type;
}

/* How CallRecorder._finish records `out` when it holds no work handle (async_handles._find_handle) and
 * is its own output list or one item of it (semantics.as_output_list): PLAIN_TENSOR for a Tensor (also a
 * Parameter), PLAIN_SEQUENCE for an exact list or tuple of exact Tensors and plain scalars (*tensors: how
 * many Tensors), PLAIN_SCALAR for a plain scalar, 0 for anything else; -1 on an error. */
enum { PLAIN_TENSOR = 1, PLAIN_SEQUENCE = 2, PLAIN_SCALAR = 3 };

static int plain_output(PyObject *out, Py_ssize_t *tensors) {
    PyTypeObject *tp = Py_TYPE(out);
    *tensors = 0;
    if (tp == &PyTuple_Type || tp == &PyList_Type) {
        PyObject *seq = PySequence_Fast(out, "output");
        if (seq == NULL) return -1;
        int all = 1;
        for (Py_ssize_t i = 0; all && i < PySequence_Fast_GET_SIZE(seq); i++) {
            PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
            if (Py_TYPE(item) == (PyTypeObject *)TensorType) ++*tensors;
            else all = plain_scalar(item);
        }
        Py_DECREF(seq);
        return all ? PLAIN_SEQUENCE : 0;
    }
    if (plain_scalar(out)) return PLAIN_SCALAR;
    if (tp == &PyDict_Type) return 0;
    int t = is_tensor(out);
    if (t > 0) *tensors = 1;
    return t > 0 ? PLAIN_TENSOR : t;
}

/* BackwardProbe(runtime, entry, bwd_in, bwd_out): the Python probe of a call the compiled code does not observe */
static PyObject *make_probe(Recorder *r, PyObject *entry) {
    return PyObject_CallFunctionObjArgs(r->probe_type, r->rt, entry, r->bwd_in, r->bwd_out, NULL);
}

/* CallRecorder._finish's `probe.observe(args, out)` for a call whose output `out` holds a Tensor: in C when
 * observe_tensor takes it (a Tensor output; `tensor`), else by a BackwardProbe made now
 * (BackwardProbe.observe_general: what observe does once observe_plain has declined; observe itself when
 * observe_here is off). 0, or -1 on an error. */
static int observe_call(Recorder *r, PyObject *entry, PyObject *args, PyObject *out, int tensor) {
    if (tensor && r->observe_here) {
        Observer o = {NULL, r->rt, entry, r->want_input, r->want_output};
        int done = observe_tensor(&o, args, out);
        if (done > 0) r->observed++;
        if (done != 0) return done < 0 ? -1 : 0;
    }
    PyObject *probe = make_probe(r, entry);
    if (probe == NULL) return -1;
    PyObject *res = PyObject_CallMethod(probe, r->observe_here ? "observe_general" : "observe", "OO", args, out);
    Py_DECREF(probe);
    if (res == NULL) return -1;
    Py_DECREF(res);
    return 0;
}

/* The Parameters among slots[start:] (described with the runtime's _unchanged) when the runtime reads
 * Parameters at once (Runtime._parameters_now, as Runtime._describe_parameters does for a Cell's):
 * their statistics taken now from their memory (fill_parameters: the numbers the flush takes from a
 * host copy of the same bytes), or, when they cannot be read that way, the slot given snapshot(Parameter)
 * as Runtime.snapshot would have. 0, or -1 on an error. */
static int settle_parameters(PyObject *slots, Py_ssize_t start, PyObject *snapshot, int md5) {
    for (Py_ssize_t i = start; i < PyList_GET_SIZE(slots); i++) {
        PyObject *item = PyList_GET_ITEM(slots, i);
        if (Py_TYPE(item) != &SlotType) continue;
        Slot *s = (Slot *)item;
        if ((s->leaf != NULL && s->leaf != Py_None) || s->tensor == NULL) continue;
        int p = is_instance(s->tensor, ParameterType);
        if (p < 0) return -1;
        if (!p) continue;
        void *data = NULL;
        Py_ssize_t count = 0;
        PyObject *kind_code = NULL, *st = NULL;
        int found = parameter_memory(s, &data, &count, &kind_code);
        if (found < 0) PyErr_Clear();
        if (found > 0 && (st = memory_stats(data, count, kind_code, md5)) == NULL) PyErr_Clear();
        if (st != NULL && st != Py_None) {
            int bad = make_leaf(s, st);
            Py_DECREF(st);
            if (bad < 0) return -1;
            Py_INCREF(Py_None);
            Py_SETREF(s->tensor, Py_None);  /* read: the Parameter is not held until the flush */
            continue;
        }
        Py_XDECREF(st);
        PyObject *held = PyObject_CallOneArg(snapshot, s->tensor);
        if (held == NULL) return -1;
        Py_SETREF(s->tensor, held);
    }
    return 0;
}

/* CallRecorder.fast_call(api, original, args, kwargs) */
static PyObject *record_call(Recorder *r, PyObject *api, PyObject *original, PyObject *args, PyObject *kwargs) {
    PyObject *rt = r->rt;
    PyObject *ext = PyObject_GetAttr(r->hotpath, S_ext);  /* tests switch the extension off at run time */
    if (ext == NULL) return NULL;
    Py_DECREF(ext);
    int odd = ext == Py_None;
    if (!odd) {
        int rec = truth_attr(rt, S_recomputing), failed = rec ? rec : truth_attr(rt, S_failed);
        if (rec < 0 || failed < 0) return NULL;
        if (rec || failed)  /* recomputed forward, or the dump is off: the general path decides */
            return PyObject_CallFunctionObjArgs(r->slow, api, original, args, kwargs, NULL);
    }
    if (odd || !PyTuple_Check(args) || !PyDict_Check(kwargs))
        return PyObject_CallFunctionObjArgs(r->python, api, original, args, kwargs, NULL);
    Py_ssize_t depth = tls_depth(rt);
    if (depth < 0 || set_depth(rt, depth + 1) < 0) return NULL;
    /* inputs: described first (under the tool's depth, as in Python); when that fails the Python common
     * case runs the whole call, numbering it and deciding about the failure */
    PyObject *slots = PyList_New(0), *snapshot = PyObject_GetAttr(rt, S_snapshot), *a = NULL, *k = NULL;
    int now = snapshot == NULL ? -1 : truth_attr(rt, S_parameters_now);
    /* what describing hands a Parameter: itself, read below, when the runtime reads Parameters at once */
    PyObject *keep = now > 0 ? r->unchanged : snapshot;
    if (slots != NULL && now >= 0) {
        a = PyTuple_GET_SIZE(args) ? describe_value(args, 0, keep, slots, r->fallback, NULL) : PyList_New(0);
        if (a != NULL) k = PyDict_GET_SIZE(kwargs) ? describe_value(kwargs, 0, keep, slots, r->fallback, NULL) : PyDict_New();
        if (k != NULL && now > 0 && settle_parameters(slots, 0, snapshot, r->md5) < 0) Py_CLEAR(k);
    }
    if (k == NULL) {
        Py_XDECREF(slots); Py_XDECREF(snapshot); Py_XDECREF(a);
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return leave(rt, NULL);
        PyErr_Clear();
        PyObject *none = leave(rt, (Py_INCREF(Py_None), Py_None));
        if (none == NULL) return NULL;
        Py_DECREF(none);
        return PyObject_CallFunctionObjArgs(r->python, api, original, args, kwargs, NULL);
    }
    /* bwd: the backward entry while the gradient is on; its gradients are observed after the call */
    PyObject *body = NULL, *fwd = NULL, *bwd = NULL, *edges = NULL, *argskw = NULL, *out;
    Py_ssize_t n = next_count(rt, api);
    if (n < 0) goto tool_failed;
    if (add_asked(rt, 2) < 0 || (body = dict2(S_input_args, a, S_input_kwargs, k)) == NULL) goto tool_failed;
    if ((fwd = PyUnicode_FromFormat("%U.%zd.%U", api, n, S_forward)) == NULL) goto tool_failed;
    PyObject *parent = NULL;
    if (r->track_parents && (parent = parent_of(rt)) == NULL) goto tool_failed;
    PyObject *bwd_edge = NULL;
    if (r->backward) {
        PyObject *g = PyObject_CallNoArgs(r->grad_enabled);
        int on = g == NULL ? -1 : PyObject_IsTrue(g);
        Py_XDECREF(g);
        if (on < 0) { Py_XDECREF(parent); goto tool_failed; }
        if (on) {
            bwd = PyUnicode_FromFormat("%U.%zd.%U", api, n, S_backward);
            if (bwd != NULL && r->track_parents) {
                PyObject *up = PyObject_CallOneArg(r->backward_of, parent);
                bwd_edge = up == NULL ? NULL : PyTuple_Pack(2, bwd, up);
                Py_XDECREF(up);
                if (bwd_edge == NULL) Py_CLEAR(bwd);
            }
            if (bwd == NULL) { Py_XDECREF(parent); goto tool_failed; }
        }
    }
    if (r->track_parents) {
        PyObject *fwd_edge = PyTuple_Pack(2, fwd, parent);
        edges = fwd_edge == NULL ? NULL : bwd_edge != NULL ? PyTuple_Pack(2, fwd_edge, bwd_edge) : PyTuple_Pack(1, fwd_edge);
        Py_XDECREF(fwd_edge);
    } else {
        edges = S_empty_tuple;
        Py_INCREF(edges);
    }
    Py_XDECREF(parent); Py_XDECREF(bwd_edge);
    if (edges == NULL) goto tool_failed;
    goto call;
tool_failed:  /* the tool's failure before the call: reported, the call is not recorded */
    Py_CLEAR(body); Py_CLEAR(fwd); Py_CLEAR(bwd); Py_CLEAR(edges);
    argskw = PyTuple_Pack(2, args, kwargs);
    if (argskw == NULL || report(r, api, argskw) < 0) {
        Py_XDECREF(argskw); Py_DECREF(slots); Py_DECREF(snapshot); Py_DECREF(a); Py_DECREF(k);
        return leave(rt, NULL);
    }
    Py_CLEAR(argskw);
call:
    out = PyObject_Call(original, args, PyDict_GET_SIZE(kwargs) ? kwargs : NULL);
    if (out == NULL) {
        if (fwd != NULL) {  /* the inputs are recorded (by the Python tail), the user's exception goes on */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
            PyObject *res = PyObject_CallFunctionObjArgs(r->finish, api, fwd, body, slots, edges, args, kwargs,
                                                         Py_None, Py_None, value != NULL ? value : Py_None, NULL);
            if (res == NULL) PyErr_Clear();
            Py_XDECREF(res);
            PyErr_Restore(type, value, tb);
        }
    } else if (fwd != NULL) {
        int done = 0;
        Py_ssize_t tensors = 0;
        int plain = plain_output(out, &tensors);
        if (plain < 0) PyErr_Clear();  /* the Python tail decides */
        if (plain > 0) {  /* described and queued here */
            Py_ssize_t before = PyList_GET_SIZE(slots);
            PyObject *list = NULL;
            if (plain != PLAIN_SEQUENCE) {  /* a Tensor or a scalar: the list of it */
                PyObject *d = describe_value(out, 1, keep, slots, r->fallback, NULL);
                if (d != NULL && (list = PyList_New(1)) != NULL) PyList_SET_ITEM(list, 0, d);
                else Py_XDECREF(d);
            } else {  /* a list or tuple is its own output list */
                list = describe_value(out, 0, keep, slots, r->fallback, NULL);
            }
            if (list != NULL && now > 0 && settle_parameters(slots, before, snapshot, r->md5) < 0) Py_CLEAR(list);
            if (list == NULL) {  /* the Python tail describes it again and decides about the failure */
                PyErr_Clear();
                if (PyList_SetSlice(slots, before, PyList_GET_SIZE(slots), NULL) < 0) PyErr_Clear();
            } else {
                int stored = add_asked(rt, 1) == 0 && PyDict_SetItem(body, S_output, list) == 0;
                Py_DECREF(list);
                int failed = stored ? truth_attr(rt, S_failed) : -1;
                if (failed == 0 && queue_call(r, fwd, body, slots, edges) < 0) failed = -1;
                /* an output without a Tensor takes no gradient: BackwardProbe.observe would hook nothing */
                if (failed >= 0 && bwd != NULL && tensors && observe_call(r, bwd, args, out, plain == PLAIN_TENSOR) < 0)
                    failed = -1;
                if (failed < 0 && report(r, api, out) < 0) { Py_CLEAR(out); }
                done = 1;
            }
        }
        if (!done) {  /* the Python tail records the output and observes the call with a probe made now */
            PyObject *probe = bwd != NULL ? make_probe(r, bwd) : Py_NewRef(Py_None), *res = NULL;
            if (probe != NULL || report(r, api, out) == 0)
                res = PyObject_CallFunctionObjArgs(r->finish, api, fwd, body, slots, edges, args, kwargs, out,
                                                   probe != NULL ? probe : Py_None, Py_None, NULL);
            if (res == NULL) Py_CLEAR(out);
            Py_XDECREF(res);
            Py_XDECREF(probe);
        }
    }
    Py_XDECREF(body); Py_XDECREF(fwd); Py_XDECREF(bwd); Py_XDECREF(edges);
    Py_DECREF(slots); Py_DECREF(snapshot); Py_DECREF(a); Py_DECREF(k);
    return leave(rt, out);
}

static PyObject *recorder_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 4 || nargs > 5 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "Recorder(api, original, args, kwargs, inplace=False)");
        return NULL;
    }
    return record_call((Recorder *)self, args[0], args[1], args[2], args[3]);
}

static PyMemberDef recorder_members[] = {
    {"observed", T_PYSSIZET, offsetof(Recorder, observed), READONLY,
     "calls whose gradients this recorder hooked itself (no BackwardProbe object made)"},
    {"observe_here", T_BOOL, offsetof(Recorder, observe_here), 0,
     "True (default): the common case of a call's gradients hooked here; False: every call observed by a\n"
     "BackwardProbe made for it (BackwardProbe.observe: the same hooks; for tests and measurements)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe.tensors._hotpath.Recorder",
    .tp_members = recorder_members,
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Recorder(runtime, hotpath, parts): CallRecorder.fast_call in C (see the source).",
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_new = recorder_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Recorder, vectorcall),
};

/* ------------------------------------------------------------------ the API wrapper (capture/api.py) */
/* CallWrapper(runtime, forks, record, original, api, inplace, home): make_wrapper's function in C. Not
 * recording (Runtime.capturing() false), or called by MindSpore's own code through an alias (`home`: the
 * globals of the module it is installed in), it calls the original with the same arguments; else
 * record(api, original, args, kwargs, inplace), a Recorder called directly. Binds like a function
 * (a Tensor method), keeps a __dict__ (functools.update_wrapper). */
typedef struct {
    PyObject_HEAD
    PyObject *rt, *forks, *record, *original, *api, *inplace, *home, *dict;
    vectorcallfunc vectorcall;
} CallWrapper;

static int wrapper_traverse(CallWrapper *w, visitproc visit, void *arg) {
    Py_VISIT(w->rt); Py_VISIT(w->forks); Py_VISIT(w->record); Py_VISIT(w->original); Py_VISIT(w->api);
    Py_VISIT(w->inplace); Py_VISIT(w->home); Py_VISIT(w->dict);
    return 0;
}

static int wrapper_clear(CallWrapper *w) {
    Py_CLEAR(w->rt); Py_CLEAR(w->forks); Py_CLEAR(w->record); Py_CLEAR(w->original); Py_CLEAR(w->api);
    Py_CLEAR(w->inplace); Py_CLEAR(w->home); Py_CLEAR(w->dict);
    return 0;
}

static void wrapper_dealloc(CallWrapper *w) {
    PyObject_GC_UnTrack(w);
    wrapper_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *wrapper_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *wrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"runtime", "forks", "record", "original", "api", "inplace", "home", NULL};
    PyObject *rt, *forks, *record, *original, *api, *inplace, *home;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OOUOO:CallWrapper", keywords, &rt, &PyList_Type, &forks,
                                     &record, &original, &api, &inplace, &home))
        return NULL;
    CallWrapper *w = PyObject_GC_New(CallWrapper, type);
    if (w == NULL) return NULL;
    PyObject *fields[] = {rt, forks, record, original, api, inplace, home == Py_None ? NULL : home};
    PyObject **dest[] = {&w->rt, &w->forks, &w->record, &w->original, &w->api, &w->inplace, &w->home};
    for (int i = 0; i < 7; i++) { Py_XINCREF(fields[i]); *dest[i] = fields[i]; }
    w->dict = NULL;
    w->vectorcall = wrapper_vectorcall;
    PyObject_GC_Track(w);
    return (PyObject *)w;
}

/* the caller is MindSpore's own code: a module of the mindspore package (api._mindspore_internal) */
static int mindspore_internal(void) {
    PyFrameObject *frame = PyEval_GetFrame();
    if (frame == NULL) return 0;
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *globals = PyFrame_GetGlobals(frame);
#else
    PyObject *globals = frame->f_globals;
    Py_XINCREF(globals);
#endif
    if (globals == NULL) return 0;
    PyObject *name = PyDict_Check(globals) ? PyDict_GetItemString(globals, "__name__") : NULL;
    int inside = 0;
    if (name != NULL && PyUnicode_Check(name)) {
        Py_ssize_t len = PyUnicode_GET_LENGTH(name);
        inside = PyUnicode_CompareWithASCIIString(name, "mindspore") == 0 ||
                 (len >= 10 && PyUnicode_Tailmatch(name, S_ms_prefix, 0, 10, -1) == 1);
    }
    Py_DECREF(globals);
    return inside;
}

static PyObject *wrapper_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    CallWrapper *w = (CallWrapper *)self;
    int on = capturing(w->rt, w->forks);
    if (on < 0) return NULL;
    if (!on || (w->home != NULL && mindspore_internal()))
        return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *tuple = PyTuple_New(nargs), *kwargs = PyDict_New(), *out = NULL;
    if (tuple == NULL || kwargs == NULL) goto done;
    for (Py_ssize_t i = 0; i < nargs; i++) { Py_INCREF(args[i]); PyTuple_SET_ITEM(tuple, i, args[i]); }
    if (kwnames != NULL)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) goto done;
    if (Py_TYPE(w->record) == &RecorderType)
        out = record_call((Recorder *)w->record, w->api, w->original, tuple, kwargs);
    else
        out = PyObject_CallFunctionObjArgs(w->record, w->api, w->original, tuple, kwargs, w->inplace, NULL);
done:
    Py_XDECREF(tuple); Py_XDECREF(kwargs);
    return out;
}

static PyObject *wrapper_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}

static PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CallWrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe.tensors._hotpath.CallWrapper",
    .tp_basicsize = sizeof(CallWrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "CallWrapper(runtime, forks, record, original, api, inplace, home): make_wrapper's function in C.",
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_new = wrapper_new,
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = wrapper_get,
    .tp_dictoffset = offsetof(CallWrapper, dict),
    .tp_getset = wrapper_getset,
    .tp_vectorcall_offset = offsetof(CallWrapper, vectorcall),
};

/* ------------------------------------------------------------------ backward hooks (capture/backward.py) */
/* The common case of BackwardProbe.observe: a call whose Tensor output is made by one autograd node from
 * positional Tensor arguments (the plain hook of BackwardProbe._hook_single), or that returns its one
 * gradient-taking argument itself (BackwardProbe._hook_alias_at). The hook registered is a GradHook, which
 * builds the items the Python closures build, in the same order, and hands them to Runtime.record_items. */
static PyObject *S_input_side, *S_output_side, *S_want_input, *S_want_output, *S_runtime, *S_entry, *S_token,
    *S_size, *S_record_items, *S_tensor_hooks, *S_register_hook, *S_step_token;

typedef struct {
    PyObject_HEAD
    PyObject *record_items, *entry, *token, *n_out, *size, *position;  /* position: an alias's argument, or NULL */
    int want_input;
    Py_ssize_t n_plain;
    Py_ssize_t *plain;  /* n_plain pairs (edge index, argument position) */
    PyObject **positions;  /* the argument positions of `plain` as ints */
    vectorcallfunc vectorcall;
} GradHook;

static PyTypeObject GradHookType;

static int hook_traverse(GradHook *h, visitproc visit, void *arg) {
    Py_VISIT(h->record_items); Py_VISIT(h->entry); Py_VISIT(h->token);
    return 0;
}

static int hook_clear(GradHook *h) {
    Py_CLEAR(h->record_items); Py_CLEAR(h->entry); Py_CLEAR(h->token);
    return 0;
}

static void hook_dealloc(GradHook *h) {
    PyObject_GC_UnTrack(h);
    hook_clear(h);
    Py_CLEAR(h->n_out); Py_CLEAR(h->size); Py_CLEAR(h->position);
    for (Py_ssize_t i = 0; h->positions != NULL && i < h->n_plain; i++) Py_XDECREF(h->positions[i]);
    PyMem_Free(h->positions);
    PyMem_Free(h->plain);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

/* appends (side, index, size, grad) to items */
static int add_item(PyObject *items, PyObject *side, PyObject *index, PyObject *size, PyObject *grad) {
    PyObject *item = PyTuple_Pack(4, side, index, size, grad);
    if (item == NULL) return -1;
    int bad = PyList_Append(items, item);
    Py_DECREF(item);
    return bad;
}

static PyObject *hook_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    GradHook *h = (GradHook *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || nargs != (h->position != NULL ? 1 : 2)) {
        PyErr_SetString(PyExc_TypeError, h->position != NULL ? "hook(grad)" : "hook(grad_inputs, grad_outputs)");
        return NULL;
    }
    PyObject *items = PyList_New(0);
    if (items == NULL) return NULL;
    int bad = 0;
    if (h->position != NULL) {  /* _hook_alias_at: backward input 0, and output `position` when there is one */
        PyObject *zero = PyLong_FromLong(0), *one = PyLong_FromLong(1);
        bad = zero == NULL || one == NULL || add_item(items, S_input_side, zero, one, args[0]) < 0 ||
              (args[0] != Py_None && add_item(items, S_output_side, h->position, h->size, args[0]) < 0);
        Py_XDECREF(zero); Py_XDECREF(one);
    } else {  /* _hook_single's plain hook */
        if (h->want_input) {
            PyObject *outs = PySequence_Fast(args[1], "grad_outputs is no sequence");
            bad = outs == NULL;
            for (Py_ssize_t i = 0; !bad && i < PySequence_Fast_GET_SIZE(outs); i++) {
                PyObject *grad = PySequence_Fast_GET_ITEM(outs, i);
                if (grad == Py_None) continue;
                PyObject *index = PyLong_FromSsize_t(i);
                bad = index == NULL || add_item(items, S_input_side, index, h->n_out, grad) < 0;
                Py_XDECREF(index);
            }
            Py_XDECREF(outs);
        }
        for (Py_ssize_t p = 0; !bad && p < h->n_plain; p++) {
            PyObject *grad = PySequence_GetItem(args[0], h->plain[2 * p]);
            bad = grad == NULL || (grad != Py_None && add_item(items, S_output_side, h->positions[p], h->size, grad) < 0);
            Py_XDECREF(grad);
        }
    }
    PyObject *res = NULL;
    if (!bad && (h->position != NULL || PyList_GET_SIZE(items))) {
        PyObject *call[3] = {h->entry, items, h->token};
        res = PyObject_Vectorcall(h->record_items, call, 3, NULL);
        bad = res == NULL;
        Py_XDECREF(res);
    }
    Py_DECREF(items);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

static PyTypeObject GradHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe.tensors._hotpath.GradHook",
    .tp_basicsize = sizeof(GradHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A gradient hook registered by observe_plain (see the source).",
    .tp_traverse = (traverseproc)hook_traverse,
    .tp_clear = (inquiry)hook_clear,
    .tp_dealloc = (destructor)hook_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(GradHook, vectorcall),
};

/* the observer's runtime: new reference */
static PyObject *observer_runtime(Observer *o) {
    return o->probe != NULL ? PyObject_GetAttr(o->probe, S_runtime) : Py_NewRef(o->rt);
}

/* a GradHook of the observer (its runtime's record_items, entry, token) for a call of `n_args` arguments */
static GradHook *hook_new(Observer *o, Py_ssize_t n_args, int want_input) {
    PyObject *rt = observer_runtime(o);
    if (rt == NULL) return NULL;
    GradHook *h = PyObject_GC_New(GradHook, &GradHookType);
    if (h == NULL) { Py_DECREF(rt); return NULL; }
    memset(&h->record_items, 0, sizeof(GradHook) - offsetof(GradHook, record_items));
    h->vectorcall = hook_vectorcall;
    h->want_input = want_input;
    h->record_items = PyObject_GetAttr(rt, S_record_items);
    if (h->record_items != NULL)
        h->entry = o->probe != NULL ? PyObject_GetAttr(o->probe, S_entry) : Py_NewRef(o->entry);
    if (h->entry != NULL) h->token = PyObject_GetAttr(o->probe != NULL ? o->probe : rt, o->probe != NULL ? S_token : S_step_token);
    Py_DECREF(rt);
    if (h->token != NULL) h->size = PyLong_FromSsize_t(n_args);
    if (h->size != NULL) h->n_out = PyLong_FromLong(1);
    PyObject_GC_Track(h);
    if (h->n_out == NULL) { Py_DECREF(h); return NULL; }
    return h;
}

/* the argument `out` is among `args` (identity), as backward._is_argument */
static int among(PyObject *out, PyObject *args) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++)
        if (PyTuple_GET_ITEM(args, i) == out) return 1;
    return 0;
}

/* probe.size = len(args), when there is a probe */
static int set_size(Observer *o, PyObject *args) {
    if (o->probe == NULL) return 0;
    PyObject *n = PyLong_FromSsize_t(PyTuple_GET_SIZE(args));
    int bad = n == NULL || PyObject_SetAttr(o->probe, S_size, n) < 0;
    Py_XDECREF(n);
    return bad ? -1 : 0;
}

/* BackwardProbe._hook_alias_at(out, position): the tensor hook, its handle kept in runtime.tensor_hooks */
static int hook_alias(Observer *o, PyObject *args, PyObject *out, PyObject *position) {
    if (set_size(o, args) < 0) return -1;
    GradHook *h = hook_new(o, PyTuple_GET_SIZE(args), 1);
    if (h == NULL) return -1;
    Py_INCREF(position);
    h->position = position;
    PyObject *handle = PyObject_CallMethodOneArg(out, S_register_hook, (PyObject *)h);
    Py_DECREF(h);
    if (handle == NULL) return -1;
    PyObject *rt = observer_runtime(o), *hooks = rt ? PyObject_GetAttr(rt, S_tensor_hooks) : NULL;
    int bad = hooks == NULL || !PyList_Check(hooks) || PyList_Append(hooks, handle) < 0;
    if (bad && hooks != NULL && !PyList_Check(hooks) && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "Runtime.tensor_hooks is not a list");
    Py_XDECREF(rt); Py_XDECREF(hooks); Py_DECREF(handle);
    return bad ? -1 : 0;
}

/* BackwardProbe.observe for the Tensor `out` of a call of positional arguments `args` when it ends in no
 * hook, the alias hook or _hook_single's plain hook: 1 (done), 0 with nothing done for any other call
 * (the Python code then observes it), -1 on an error. The same attributes are read in the same order. */
static int observe_tensor(Observer *o, PyObject *args, PyObject *out) {
    int want_input = o->want_input, want_output = o->want_output;
    PyObject *targets = NULL, *node = NULL, *nodes = NULL, *mapping = NULL;
    int result = -1;
    Py_ssize_t n_args = PyTuple_GET_SIZE(args);
    if (want_input && want_output && among(out, args)) {
        if ((targets = grad_targets(NULL, args)) == NULL) return -1;
        Py_ssize_t n = PyList_GET_SIZE(targets), hit = 0;
        if (n == 1) {
            PyObject *only = PyList_GET_ITEM(targets, 0);
            if (PyTuple_GET_ITEM(only, 2) == out && PyTuple_GET_ITEM(only, 1) == Py_None) {
                int bad = hook_alias(o, args, out, PyTuple_GET_ITEM(only, 0));
                Py_DECREF(targets);
                return bad ? -1 : 1;
            }
        }
        for (Py_ssize_t i = 0; !hit && i < n; i++) hit = PyTuple_GET_ITEM(PyList_GET_ITEM(targets, i), 2) == out;
        if (!hit) { Py_DECREF(targets); return 1; }
    }
    if ((node = node_of(out)) == NULL) goto done;
    if (node == Py_None) { result = 1; goto done; }
    if (targets == NULL && (targets = grad_targets(NULL, args)) == NULL) goto done;
    if ((nodes = PyList_New(1)) == NULL) goto done;
    PyList_SET_ITEM(nodes, 0, Py_NewRef(node));
    PyObject *sm_args[2] = {nodes, targets};
    if ((mapping = single_mapping(NULL, sm_args, 2)) == NULL) goto done;
    if (mapping == Py_None) { result = 0; goto done; }
    Py_ssize_t n_map = 0;
    if (want_output) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(targets); i++)
            if (PyTuple_GET_ITEM(PyList_GET_ITEM(targets, i), 1) != Py_None) {  /* a list argument: Python */
                result = 0;
                goto done;
            }
        n_map = PyList_GET_SIZE(mapping);
    }
    if (set_size(o, args) < 0) goto done;
    if (!want_input && n_map == 0) { result = 1; goto done; }
    GradHook *h = hook_new(o, n_args, want_input);
    if (h == NULL) goto done;
    if (n_map) {
        h->plain = PyMem_Calloc(2 * n_map, sizeof(Py_ssize_t));
        h->positions = PyMem_Calloc(n_map, sizeof(PyObject *));
        if (h->plain == NULL || h->positions == NULL) { PyErr_NoMemory(); Py_DECREF(h); goto done; }
        h->n_plain = n_map;
        for (Py_ssize_t p = 0; p < n_map; p++) {  /* mapping items: (edge index, (position, element)) */
            PyObject *pair = PyList_GET_ITEM(mapping, p), *slot = PyTuple_GET_ITEM(pair, 1);
            h->plain[2 * p] = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
            h->positions[p] = Py_NewRef(PyTuple_GET_ITEM(slot, 0));
        }
        if (PyErr_Occurred()) { Py_DECREF(h); goto done; }
    }
    PyObject *handle = PyObject_CallMethodOneArg(node, S_register_hook, (PyObject *)h);
    Py_DECREF(h);
    if (handle == NULL) goto done;
    Py_DECREF(handle);
    result = 1;
done:
    Py_XDECREF(targets); Py_XDECREF(node); Py_XDECREF(nodes); Py_XDECREF(mapping);
    return result;
}

/* observe_plain(probe, args, out) -> bool: BackwardProbe.observe for a Tensor output when it ends in no
 * hook, the alias hook or _hook_single's plain hook (True, done); False with nothing done for any other
 * call (the Python code then observes it). The same attributes are read in the same order. */
static PyObject *observe_plain(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyTuple_Check(a[1])) {
        PyErr_SetString(PyExc_TypeError, "observe_plain(probe, args: tuple, out)");
        return NULL;
    }
    if (FloatDtypes == NULL || TensorKinds == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "msprobe.tensors._hotpath.setup() and setup_calls() were not called");
        return NULL;
    }
    int t = is_tensor(a[2]);
    if (t <= 0) return t < 0 ? NULL : Py_NewRef(Py_False);
    Observer o = {a[0], NULL, NULL, 0, 0};
    o.want_input = truth_attr(a[0], S_want_input);
    o.want_output = o.want_input < 0 ? -1 : truth_attr(a[0], S_want_output);
    if (o.want_output < 0) return NULL;
    int done = observe_tensor(&o, a[1], a[2]);
    return done < 0 ? NULL : Py_NewRef(done ? Py_True : Py_False);
}

/* item_lines(entry, items, snapshot, slots, fallback, named=False) -> [journal.item_line(entry, key,
 * index, size, describe(value))] for the (key, index, size, value) tuples of `items`
 * (Runtime.record_items); `named`: the tensors of each value get .npy files named after the item
 * name "entry.key.index" (describe()'s prefix) */
static PyObject *item_lines(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    (void)self;
    if ((nargs != 5 && nargs != 6) || !PyList_Check(a[1]) || !PyList_Check(a[3])) {
        PyErr_SetString(PyExc_TypeError, "item_lines(entry, items: list, snapshot, slots: list, fallback, named=False)");
        return NULL;
    }
    int named = nargs == 6 ? PyObject_IsTrue(a[5]) : 0;
    if (named < 0) return NULL;
    if (named && !PyUnicode_Check(a[0])) {
        PyErr_SetString(PyExc_TypeError, "item_lines: a named entry must be a str");
        return NULL;
    }
    PyObject *items = a[1], *lines = PyList_New(0);
    for (Py_ssize_t i = 0; lines != NULL && i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_TypeError, "item_lines: items are (key, index, size, value) tuples");
            Py_CLEAR(lines);
            break;
        }
        PyObject *prefix = NULL, *v = NULL, *line = NULL;
        PyObject *key = PyTuple_GET_ITEM(item, 0), *index = PyTuple_GET_ITEM(item, 1);
        int bare = named ? PyObject_Not(key) : 0;  /* an empty key names no category (naming.data_file_name) */
        if (bare < 0 || (named && (prefix = bare ? PyUnicode_FromFormat("%U.%S", a[0], index)
                                                 : PyUnicode_FromFormat("%U.%S.%S", a[0], key, index)) == NULL)) {
            Py_CLEAR(lines);
            break;
        }
        v = describe_value(PyTuple_GET_ITEM(item, 3), 0, a[2], a[3], a[4], prefix);
        Py_XDECREF(prefix);
        if (v != NULL && (line = dict2(S_e, a[0], S_k, PyTuple_GET_ITEM(item, 0))) != NULL &&
            (PyDict_SetItem(line, S_i, PyTuple_GET_ITEM(item, 1)) < 0 || PyDict_SetItem(line, S_n, PyTuple_GET_ITEM(item, 2)) < 0 ||
             PyDict_SetItem(line, S_v, v) < 0))
            Py_CLEAR(line);
        Py_XDECREF(v);
        if (line == NULL || PyList_Append(lines, line) < 0) Py_CLEAR(lines);
        Py_XDECREF(line);
    }
    return lines;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(tensor, parameter, dtype_names, kinds, scan, split, is_contiguous, data_ptr, dumps,\n"
     "line_option, crc32, ndarray, stride, free_cpus, scan_strided=None): the MindSpore types, dtype names (dtype -> dump.json name), kernel kinds (dump.json\n"
     "name -> (kind, itemsize)), the kernel's scan, the element count from which fill() lets the\n"
     "kernel use free_cpus() threads, TensorPy's is_contiguous and _data_ptr, orjson.dumps and its\n"
     "newline option, the CRC-32 function of stats.crc32_hex, numpy.ndarray, TensorPy.stride, free_cpus and\n"
     "the kernel's scan_strided (None: non-contiguous tensors are copied, then scanned)."},
    {"encode_lines", (PyCFunction)(void (*)(void))encode_lines, METH_FASTCALL,
     "encode_lines(records, encode) -> (bytes, resolved records, any non-finite): resolve() each\n"
     "record and encode it as one journal line with orjson; a record that holds a non-finite float or\n"
     "that orjson refuses is encoded by encode(record, non_finite, line=True) instead."},
    {"stack_key", (PyCFunction)(void (*)(void))stack_key, METH_FASTCALL,
     "stack_key(skip, limit) -> tuple (id(code), f_lasti, ...) of the calling frames,\n"
     "innermost first, after skipping `skip` frames above the caller's, at most `limit` frames."},
    {"describe", (PyCFunction)(void (*)(void))describe, METH_FASTCALL,
     "describe(value, snapshot, slots, fallback, prefix=None) -> record structure (see the module docstring)."},
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
    {"consumer_edges", (PyCFunction)(void (*)(void))consumer_edges, METH_FASTCALL,
     "consumer_edges(nodes, targets: set, mark: int, max_walk: int) -> {(node id, output index): [(node, edge\n"
     "index)]} or None: the edges from the nodes made after mark into the target nodes (msprobe.capture.\n"
     "backward.consumer_edges, the same attributes read in the same order)."},
    {"slots_nbytes", (PyCFunction)slots_nbytes, METH_O,
     "slots_nbytes(slots) -> int: the sum of slot.nbytes() over a sequence of slots."},
    {"resolve", (PyCFunction)resolve, METH_O,
     "resolve(record: dict) -> (dict, bool): slots replaced by their leaves, and whether a float in it\n"
     "(an argument or a statistic) is NaN or infinite."},
    {"replay_lines", (PyCFunction)(void (*)(void))replay_lines, METH_FASTCALL,
     "replay_lines(state, lines) -> None: msprobe.format.journal.Replay.apply(line) for each line, the\n"
     "stack-use, key, item, construct-edge and stack-frames lines applied in C to the state's data,\n"
     "construct, _frames and _stack_names (the other kinds by state.apply)."},
    {"observe_plain", (PyCFunction)(void (*)(void))observe_plain, METH_FASTCALL,
     "observe_plain(probe, args: tuple, out) -> bool: msprobe.capture.backward.BackwardProbe.observe for a\n"
     "Tensor output made by one autograd node from positional Tensor arguments, or an argument returned\n"
     "itself, with the same hooks (GradHook, handing Runtime.record_items the same items); False, nothing\n"
     "done, for any other call."},
    {"item_lines", (PyCFunction)(void (*)(void))item_lines, METH_FASTCALL,
     "item_lines(entry, items, snapshot, slots, fallback, named=False) -> [journal item line]:\n"
     "journal.item_line(entry, key, index, size, describe(value, snapshot, slots, fallback[, prefix])) for each\n"
     "(key, index, size, value); named: prefix \"entry.key.index\" (its tensors' .npy file names)."},
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
    INTERN(S_name, "name"); INTERN(S_Contiguous, "Contiguous"); INTERN(S_sequence_nr, "_sequence_nr");
    INTERN(S_e, "e"); INTERN(S_stack, "stack"); INTERN(S_p, "p"); INTERN(S_i, "i"); INTERN(S_n, "n");
    INTERN(S_k, "k"); INTERN(S_v, "v"); INTERN(S_c, "c"); INTERN(S_s, "s"); INTERN(S_f, "f"); INTERN(S_apply, "apply");
    INTERN(S_data, "data"); INTERN(S_construct, "construct"); INTERN(S_frames_attr, "_frames");
    INTERN(S_stack_names, "_stack_names");
    INTERN(S_recomputing, "recomputing"); INTERN(S_failed, "failed"); INTERN(S_tls, "_tls"); INTERN(S_depth, "depth");
    INTERN(S_counters, "counters"); INTERN(S_snapshot, "snapshot"); INTERN(S_asked, "_asked"); INTERN(S_input_args, "input_args");
    INTERN(S_input_kwargs, "input_kwargs"); INTERN(S_output, "output"); INTERN(S_writer, "writer"); INTERN(S_pending, "_pending");
    INTERN(S_emitted, "_emitted_stacks"); INTERN(S_added, "_added_to_batch"); INTERN(S_flush, "flush"); INTERN(S_user_error, "_user_error");
    INTERN(S_raise_user_error, "raise_user_error"); INTERN(S_cell_stack, "cell_stack"); INTERN(S_running, "running"); INTERN(S_fork, "_fork");
    INTERN(S_ext, "ext"); INTERN(S_forward, "forward"); INTERN(S_backward, "backward"); INTERN(S_wait_kw, "wait");
    INTERN(S_ms_prefix, "mindspore.");
    INTERN(S_input_side, "input"); INTERN(S_output_side, "output"); INTERN(S_want_input, "want_input");
    INTERN(S_want_output, "want_output"); INTERN(S_runtime, "runtime"); INTERN(S_entry, "entry"); INTERN(S_token, "token");
    INTERN(S_size, "size"); INTERN(S_record_items, "record_items"); INTERN(S_tensor_hooks, "tensor_hooks");
    INTERN(S_register_hook, "register_hook"); INTERN(S_step_token, "step_token"); INTERN(S_parameters_now, "_parameters_now");
    if ((ObjectClass = _PyType_Lookup(&PyBaseObject_Type, S_class)) == NULL) return NULL;
    Py_INCREF(ObjectClass);
    if ((S_empty_tuple = PyTuple_New(0)) == NULL) return NULL;
    Tiny = 2.2250738585072014e-308;
    if (PyType_Ready(&SlotType) < 0 || PyType_Ready(&RecorderType) < 0 || PyType_Ready(&CallWrapperType) < 0 ||
        PyType_Ready(&GradHookType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RecorderType);
    Py_INCREF(&CallWrapperType);
    if (PyModule_AddObject(m, "Recorder", (PyObject *)&RecorderType) < 0 ||
        PyModule_AddObject(m, "CallWrapper", (PyObject *)&CallWrapperType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SlotType);
    if (PyModule_AddObject(m, "TensorSlot", (PyObject *)&SlotType) < 0) {
        Py_DECREF(&SlotType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
