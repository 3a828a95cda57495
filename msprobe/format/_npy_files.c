/* Writes a batch of .npy files with the GIL released once for the whole batch.
 *
 * write_files(items) -> None | (index, errno)
 *   items: list of (tmp: bytes, path: bytes, header: bytes, data: C-contiguous buffer).
 *   For each item in order: create tmp (O_EXCL), write header then data, close, rename tmp to path.
 *   Stops at the first failure: removes that item's tmp and returns (index of the item, errno);
 *   the items before it are written, the ones after it are not. None when all are written.
 *
 * Used by msprobe.format.npy.save_npy_batch; the Python fallback there writes the same bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

typedef struct {
    const char *tmp;
    const char *path;
    Py_buffer header;
    Py_buffer data;
} item_t;

static int write_all(int fd, const char *p, Py_ssize_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, (size_t)n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= w;
    }
    return 0;
}

/* 0, or the errno of the failure (tmp removed) */
static int write_one(const item_t *it) {
    int fd = open(it->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return errno ? errno : EIO;
    int err = 0;
    if (write_all(fd, it->header.buf, it->header.len) || write_all(fd, it->data.buf, it->data.len))
        err = errno ? errno : EIO;
    if (close(fd) && !err) err = errno ? errno : EIO;
    if (!err && rename(it->tmp, it->path)) err = errno ? errno : EIO;
    if (err) unlink(it->tmp);
    return err;
}

static PyObject *write_files(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "write_files expects a list of (tmp, path, header, data)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    item_t *items = PyMem_Calloc(n ? (size_t)n : 1, sizeof(item_t));
    if (!items) return PyErr_NoMemory();
    PyObject *keep = PyList_GetSlice(arg, 0, n); /* the tuples stay alive while the GIL is released */
    Py_ssize_t ready = 0;
    PyObject *result = NULL;
    if (!keep) goto done;
    for (; ready < n; ready++) {
        PyObject *t = PyList_GET_ITEM(keep, ready);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4 || !PyBytes_Check(PyTuple_GET_ITEM(t, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(t, 1))) {
            PyErr_SetString(PyExc_TypeError, "each item must be (tmp: bytes, path: bytes, header, data)");
            goto done;
        }
        items[ready].tmp = PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 0));
        items[ready].path = PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 1));
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 2), &items[ready].header, PyBUF_SIMPLE)) goto done;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 3), &items[ready].data, PyBUF_SIMPLE)) {
            PyBuffer_Release(&items[ready].header);
            goto done;
        }
    }
    Py_ssize_t failed = -1;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        err = write_one(&items[i]);
        if (err) {
            failed = i;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (failed < 0) {
        result = Py_NewRef(Py_None);
    } else {
        result = Py_BuildValue("(ni)", failed, err);
    }
done:
    for (Py_ssize_t i = 0; i < ready; i++) {
        PyBuffer_Release(&items[i].header);
        PyBuffer_Release(&items[i].data);
    }
    PyMem_Free(items);
    Py_XDECREF(keep);
    return result;
}

static PyMethodDef methods[] = {
    {"write_files", write_files, METH_O,
     "write_files(items) -> None | (index, errno): write (tmp, path, header, data) items in order, "
     "each to tmp then renamed to path, with the GIL released; stops at the first failure."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_npy_files", NULL, -1, methods};

PyMODINIT_FUNC PyInit__npy_files(void) { return PyModule_Create(&module); }
