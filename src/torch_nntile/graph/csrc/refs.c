/* Reference counts of graph values (graph/nodes.py: outside_refs, prune_dead), in C.

   Whether anything can still read a value is told by its reference count: its op's
   outputs tuple holds it once, and every other reference is a tensor, a view, a saved
   tensor of autograd or another op's inputs. Every compile asks this of every output
   (pruning dead ops, fusion, the values' last uses), about 600 outputs a small GPT-2
   step. Python's sys.getrefcount counts its own loop's references too, against a
   measured baseline; here every reference taken is to the tuple, not to its items, so
   an output held by its op alone has a count of exactly 1. Python's limited API only
   (setup.py defines Py_LIMITED_API): one wheel serves every CPython from 3.11 on. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *s_inputs, *s_outputs, *s_op, *empty;

/* op.outputs, which must be a tuple (a new reference), or NULL with an error set. */
static PyObject *outputs_of(PyObject *op)
{
    PyObject *outs = PyObject_GetAttr(op, s_outputs);
    if (outs != NULL && !PyTuple_Check(outs)) {
        PyErr_Format(PyExc_TypeError, "op outputs must be a tuple, not %R", (PyObject *)Py_TYPE(outs));
        Py_CLEAR(outs);
    }
    return outs;
}

static PyObject *outside_refs(PyObject *self, PyObject *op)
{
    (void)self;
    PyObject *outs = outputs_of(op);
    if (outs == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_Size(outs);
    PyObject *res = PyList_New(n);
    for (Py_ssize_t i = 0; res != NULL && i < n; i++) {
        PyObject *v = PyLong_FromSsize_t(Py_REFCNT(PyTuple_GetItem(outs, i)) - 1);
        if (v == NULL)
            Py_CLEAR(res);
        else
            PyList_SetItem(res, i, v);
    }
    Py_DECREF(outs);
    return res;
}

/* prune_dead(ops) -> (kept, pruned): see graph/nodes.py. Later ops go first: a dead
   op's inputs tuple is dropped with it, which can leave an earlier op dead too. */
static PyObject *prune_dead(PyObject *self, PyObject *ops)
{
    (void)self;
    if (!PyList_Check(ops)) {
        PyErr_SetString(PyExc_TypeError, "prune_dead takes a list of ops");
        return NULL;
    }
    PyObject *kept = PyList_New(0);
    Py_ssize_t pruned = 0;
    for (Py_ssize_t i = PyList_Size(ops) - 1; kept != NULL && i >= 0; i--) {
        PyObject *op = PyList_GetItem(ops, i);
        Py_INCREF(op);
        PyObject *outs = outputs_of(op);
        int ok = outs != NULL, dead = ok;
        for (Py_ssize_t j = 0; dead && j < PyTuple_Size(outs); j++)
            dead = Py_REFCNT(PyTuple_GetItem(outs, j)) <= 1;
        if (dead) {
            for (Py_ssize_t j = 0; ok && j < PyTuple_Size(outs); j++)
                ok = PyObject_SetAttr(PyTuple_GetItem(outs, j), s_op, Py_None) == 0;  /* no node <-> op cycle */
            ok = ok && PyObject_SetAttr(op, s_inputs, empty) == 0 && PyObject_SetAttr(op, s_outputs, empty) == 0;
            pruned++;
        } else if (ok) {
            ok = PyList_Append(kept, op) == 0;
        }
        Py_XDECREF(outs);
        Py_DECREF(op);
        if (!ok)
            Py_CLEAR(kept);
    }
    if (kept == NULL)
        return NULL;
    if (PyList_Reverse(kept) < 0) {
        Py_DECREF(kept);
        return NULL;
    }
    return Py_BuildValue("(Nn)", kept, pruned);
}

static PyMethodDef methods[] = {
    {"outside_refs", outside_refs, METH_O, "Per output of op: the references to it beyond its op's own."},
    {"prune_dead", prune_dead, METH_O, "(the ops some of whose outputs can still be read, how many were dropped)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_refs", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__refs(void)
{
    if ((s_inputs = PyUnicode_InternFromString("inputs")) == NULL ||
        (s_outputs = PyUnicode_InternFromString("outputs")) == NULL ||
        (s_op = PyUnicode_InternFromString("op")) == NULL || (empty = PyTuple_New(0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
