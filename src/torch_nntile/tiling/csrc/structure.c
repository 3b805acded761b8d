/* The structure key of a compile (tiling/reuse.py, Structure), built in C.

   Every compile of a training step computes this key before it can take an earlier
   compile's tasks: per op its definition, its attributes, the numbers of the values it
   reads and, per output, shape, dtype, planned tiling and whether anything outside the
   compile holds it. In Python that loop cost 1-2 us a value: 3.4 ms a step of a small
   GPT-2 (an optimizer step alone has 450 outputs). Here the loop runs with no bytecode;
   what needs Python (the key of an attribute that is not plain data, the plan of an
   axis group not planned yet) is called back.

   Values are numbered by address in a table of our own, not in a dict: a dict would
   hold references to the values, and the key reads their reference counts.

   Python's limited API only (setup.py defines Py_LIMITED_API): the wheel is then one
   for every CPython from 3.11 on. Its checked item calls cost nothing measurable here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* -- an open-addressing table: pointer -> integer ---------------------------------- */

typedef struct {
    const void **keys;
    Py_ssize_t *vals;
    size_t mask;
    size_t used;
} table;

static int table_init(table *t, size_t expected)
{
    size_t n = 16;
    while (n < 2 * expected + 16)
        n <<= 1;
    t->keys = calloc(n, sizeof(*t->keys));
    t->vals = malloc(n * sizeof(*t->vals));
    t->mask = n - 1;
    t->used = 0;
    if (t->keys == NULL || t->vals == NULL) {
        free(t->keys);
        free(t->vals);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void table_free(table *t)
{
    free(t->keys);
    free(t->vals);
}

static size_t slot_of(const table *t, const void *key)
{
    size_t h = ((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull;
    size_t i = (h >> 17) & t->mask;
    while (t->keys[i] != NULL && t->keys[i] != key)
        i = (i + 1) & t->mask;
    return i;
}

/* The value at key, or def. */
static Py_ssize_t table_get(const table *t, const void *key, Py_ssize_t def)
{
    size_t i = slot_of(t, key);
    return t->keys[i] == NULL ? def : t->vals[i];
}

static int table_grow(table *t)
{
    table bigger;
    if (table_init(&bigger, t->mask + 1) < 0)
        return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->keys[i] != NULL) {
            size_t j = slot_of(&bigger, t->keys[i]);
            bigger.keys[j] = t->keys[i];
            bigger.vals[j] = t->vals[i];
        }
    }
    bigger.used = t->used;
    table_free(t);
    *t = bigger;
    return 0;
}

static int table_set(table *t, const void *key, Py_ssize_t val)
{
    if (2 * (t->used + 1) > t->mask + 1 && table_grow(t) < 0)
        return -1;
    size_t i = slot_of(t, key);
    if (t->keys[i] == NULL) {
        t->keys[i] = key;
        t->used++;
    }
    t->vals[i] = val;
    return 0;
}

/* -- the key ------------------------------------------------------------------------ */

/* Attribute names, interned once (PyInit__structure). */
static PyObject *s_inputs, *s_outputs, *s_opdef, *s_attrs, *s_shape, *s_dtype, *s_axes, *s_parent, *s_binds_kernel,
    *s_binds_data, *s_value, *s_handles, *s_tiling;

/* The planned tiling of a value with these axes, where ``known`` (root axis group ->
   tile sizes) has every group's: a new reference; NULL with no error set where a group
   is not planned yet (plan_tiling in Python then works it out), NULL with one on error. */
static PyObject *known_tiling(PyObject *axes, PyObject *known)
{
    Py_ssize_t nd = PyTuple_Size(axes);
    PyObject *out = PyTuple_New(nd);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t d = 0; d < nd; d++) {
        PyObject *g = PyTuple_GetItem(axes, d);
        Py_INCREF(g);
        for (;;) {  /* the root of the union-find (AxisGroup.root, without its path halving) */
            PyObject *parent = PyObject_GetAttr(g, s_parent);
            if (parent == NULL) {
                Py_DECREF(g);
                Py_DECREF(out);
                return NULL;
            }
            if (parent == Py_None) {
                Py_DECREF(parent);
                break;
            }
            Py_DECREF(g);
            g = parent;
        }
        PyObject *t = PyDict_GetItemWithError(known, g);  /* borrowed */
        Py_DECREF(g);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        Py_INCREF(t);
        PyTuple_SetItem(out, d, t);
    }
    return out;
}

/* reuse._attr_key(x) (see there) for the plain data of most attributes: ints, strings,
   None, bools and tuples of those; anything else is the Python function's (``slow``). */
static PyObject *attr_key(PyObject *x, PyObject *slow)
{
    if (PyLong_CheckExact(x) || PyUnicode_CheckExact(x) || x == Py_None) {
        Py_INCREF(x);
        return x;
    }
    if (PyBool_Check(x))
        return PyTuple_Pack(2, (PyObject *)&PyBool_Type, x);
    if (!PyTuple_CheckExact(x))
        return PyObject_CallFunctionObjArgs(slow, x, NULL);
    Py_ssize_t n = PyTuple_Size(x);
    PyObject *out = NULL;  /* made at the first item whose key is not the item itself */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *y = PyTuple_GetItem(x, i);
        PyObject *k = attr_key(y, slow);
        if (k == NULL) {
            Py_XDECREF(out);
            return NULL;
        }
        if (out == NULL && k != y) {
            if ((out = PyTuple_New(n)) == NULL) {
                Py_DECREF(k);
                return NULL;
            }
            for (Py_ssize_t j = 0; j < i; j++) {
                PyObject *same = PyTuple_GetItem(x, j);
                Py_INCREF(same);
                PyTuple_SetItem(out, j, same);
            }
        }
        if (out != NULL)
            PyTuple_SetItem(out, i, k);
        else
            Py_DECREF(k);
    }
    if (out == NULL) {
        Py_INCREF(x);
        return x;
    }
    return out;
}

/* reuse._op_attrs(op): what of an op's attributes goes in the key; the cases other
   than plain data are the Python function's (``slow_op``). */
static PyObject *op_attrs(PyObject *op, PyObject *opdef, PyObject *slow_op, PyObject *slow)
{
    PyObject *attrs = PyObject_GetAttr(op, s_attrs);
    if (attrs == NULL)
        return NULL;
    PyObject *bk = PyObject_GetAttr(opdef, s_binds_kernel);
    PyObject *bd = bk ? PyObject_GetAttr(opdef, s_binds_data) : NULL;
    PyObject *out = NULL;
    if (bd != NULL) {
        int kernel = PyObject_IsTrue(bk), data = PyObject_IsTrue(bd);
        if (kernel < 0 || data < 0)
            out = NULL;
        else if (kernel && PyTuple_CheckExact(attrs) && PyTuple_Size(attrs) == 2) {
            out = PyTuple_GetItem(attrs, 1);  /* (kernel, name): the name */
            Py_INCREF(out);
        } else if (kernel || data)
            out = PyObject_CallFunctionObjArgs(slow_op, op, NULL);
        else
            out = attr_key(attrs, slow);
    }
    Py_XDECREF(bk);
    Py_XDECREF(bd);
    Py_DECREF(attrs);
    return out;
}

/* The tiling of a value: known_tiling, else plan(node). */
static PyObject *tiling_of(PyObject *node, PyObject *axes, PyObject *known, PyObject *plan_fn)
{
    PyObject *t = PyTuple_Check(axes) ? known_tiling(axes, known) : NULL;
    if (t == NULL && !PyErr_Occurred())
        t = PyObject_CallFunctionObjArgs(plan_fn, node, NULL);
    return t;
}

/* A tuple attribute of obj (a new reference), or NULL with TypeError. */
static PyObject *tuple_attr(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v != NULL && !PyTuple_Check(v)) {
        PyErr_Format(PyExc_TypeError, "structure: %U is not a tuple", name);
        Py_CLEAR(v);
    }
    return v;
}

/* Number input n, a value from before the compile planned as ``tiling``: append it to
   ``nodes``, its tile array to ``values``, and its part (shape, dtype, tiling, the
   array's tiling, the slot of each tile: ``slot_of`` numbers tile handles) to
   ``parts``; its number is minus how many such values there are. A value with no
   tiles yet raises ``unlowered``. Returns 0, or -1 with an error set. */
static int number_outside(PyObject *n, PyObject *tiling, PyObject *nodes, PyObject *values, PyObject *slot_of,
                          PyObject *parts, PyObject *unlowered, Py_ssize_t *number)
{
    PyObject *arr = PyObject_GetAttr(n, s_value);
    if (arr == NULL)
        return -1;
    if (arr == Py_None) {
        Py_DECREF(arr);
        PyErr_SetString(unlowered, "unlowered input");
        return -1;
    }
    PyObject *handles = NULL, *seq = NULL, *tiles = NULL, *shape = NULL, *dtype = NULL, *arr_tiling = NULL;
    PyObject *part = NULL;
    int rc = -1;
    if (PyList_Append(nodes, n) < 0 || PyList_Append(values, arr) < 0)
        goto out;
    handles = PyObject_GetAttr(arr, s_handles);
    seq = handles ? PySequence_Fast(handles, "structure: handles is not a sequence") : NULL;
    if (seq == NULL)
        goto out;
    int is_list = PyList_Check(seq); /* PySequence_Fast gives a list or a tuple */
    Py_ssize_t nh = is_list ? PyList_Size(seq) : PyTuple_Size(seq);
    if ((tiles = PyTuple_New(nh)) == NULL)
        goto out;
    for (Py_ssize_t k = 0; k < nh; k++) {
        PyObject *h = is_list ? PyList_GetItem(seq, k) : PyTuple_GetItem(seq, k);
        PyObject *slot = PyDict_GetItemWithError(slot_of, h);  /* borrowed */
        if (slot == NULL) {
            if (PyErr_Occurred())
                goto out;
            PyObject *fresh = PyLong_FromSsize_t(PyDict_Size(slot_of));
            if (fresh == NULL || PyDict_SetItem(slot_of, h, fresh) < 0) {
                Py_XDECREF(fresh);
                goto out;
            }
            Py_DECREF(fresh);
            slot = fresh;  /* the dict holds it */
        }
        Py_INCREF(slot);
        PyTuple_SetItem(tiles, k, slot);
    }
    shape = PyObject_GetAttr(n, s_shape);
    dtype = shape ? PyObject_GetAttr(n, s_dtype) : NULL;
    arr_tiling = dtype ? PyObject_GetAttr(arr, s_tiling) : NULL;
    part = arr_tiling ? PyTuple_Pack(5, shape, dtype, tiling, arr_tiling, tiles) : NULL;
    if (part == NULL || PyList_Append(parts, part) < 0)
        goto out;
    *number = -PyList_Size(values);
    rc = 0;
out:
    Py_DECREF(arr);
    Py_XDECREF(handles);
    Py_XDECREF(seq);
    Py_XDECREF(tiles);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(arr_tiling);
    Py_XDECREF(part);
    return rc;
}

/* parts(ops, parts, op_attrs, attr_key, plan, known, (nodes, values, slot_of, unlowered)):
   append each op's part to list ``parts``: (opdef, op_attrs(op), input numbers,
   outputs), an output being (shape, dtype, tiling, held only by this compile's
   readers). An input no earlier op made is numbered by number_outside (which appends
   a part of its own first). A tiling is
   looked up per root axis group in ``known`` or else is plan(node), once per axes
   tuple (the values hold their axes while this runs). */
static PyObject *parts(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *ops, *out_parts, *attrs_fn, *key_fn, *plan_fn, *known, *nodes, *values, *slot_of, *unlowered;
    if (!PyArg_ParseTuple(args, "O!O!OOOO!(O!O!O!O)", &PyList_Type, &ops, &PyList_Type, &out_parts, &attrs_fn,
                          &key_fn, &plan_fn, &PyDict_Type, &known, &PyList_Type, &nodes, &PyList_Type, &values,
                          &PyDict_Type, &slot_of, &unlowered))
        return NULL;
    Py_ssize_t nops = PyList_Size(ops);
    table readers, number, tilings;
    int ok_r = table_init(&readers, (size_t)nops * 2) == 0;
    int ok_n = ok_r && table_init(&number, (size_t)nops * 2) == 0;
    int ok_t = ok_n && table_init(&tilings, (size_t)nops) == 0;
    PyObject *plans = PyList_New(0); /* the tilings planned, by the number the table gives their axes */
    PyObject *result = NULL;
    if (!ok_t || plans == NULL)
        goto done;
    /* readers: how many inputs of this compile's ops each value is */
    for (Py_ssize_t i = 0; i < nops; i++) {
        PyObject *ins = tuple_attr(PyList_GetItem(ops, i), s_inputs);
        if (ins == NULL)
            goto done;
        for (Py_ssize_t j = 0; j < PyTuple_Size(ins); j++) {
            const void *n = PyTuple_GetItem(ins, j);
            if (table_set(&readers, n, table_get(&readers, n, 0) + 1) < 0) {
                Py_DECREF(ins);
                goto done;
            }
        }
        Py_DECREF(ins);
    }
    Py_ssize_t count = 0; /* values numbered so far (outputs and values from before) */
    for (Py_ssize_t i = 0; i < nops; i++) {
        PyObject *op = PyList_GetItem(ops, i);
        PyObject *ins = NULL, *outs = NULL, *in_nums = NULL, *out_parts_t = NULL, *opdef = NULL, *akey = NULL;
        int fail = 1;
        ins = tuple_attr(op, s_inputs);
        outs = ins ? tuple_attr(op, s_outputs) : NULL;
        if (outs == NULL)
            goto op_done;
        Py_ssize_t nin = PyTuple_Size(ins), nout = PyTuple_Size(outs);
        in_nums = PyTuple_New(nin);
        out_parts_t = PyTuple_New(nout);
        if (in_nums == NULL || out_parts_t == NULL)
            goto op_done;
        for (Py_ssize_t j = 0; j < nin; j++) {
            PyObject *n = PyTuple_GetItem(ins, j);
            Py_ssize_t r = table_get(&number, n, PY_SSIZE_T_MIN);
            if (r == PY_SSIZE_T_MIN) {
                PyObject *axes = PyObject_GetAttr(n, s_axes);
                PyObject *tiling = axes ? tiling_of(n, axes, known, plan_fn) : NULL;
                Py_XDECREF(axes);
                int bad = tiling == NULL
                          || number_outside(n, tiling, nodes, values, slot_of, out_parts, unlowered, &r) < 0;
                Py_XDECREF(tiling);
                if (bad)
                    goto op_done;
                if (table_set(&number, n, r) < 0)
                    goto op_done;
                count++;
            }
            PyObject *num = PyLong_FromSsize_t(r);
            if (num == NULL)
                goto op_done;
            PyTuple_SetItem(in_nums, j, num);
        }
        /* reference counts first (the calls below make temporaries): beyond the one of
           the op's outputs tuple, the holders outside the op */
        for (Py_ssize_t j = 0; j < nout; j++) {
            PyObject *out = PyTuple_GetItem(outs, j);
            Py_ssize_t held = Py_REFCNT(out) - 1;
            PyObject *flag = held == table_get(&readers, out, 0) ? Py_True : Py_False;
            Py_INCREF(flag);
            PyTuple_SetItem(out_parts_t, j, flag); /* replaced by the output's part below */
        }
        for (Py_ssize_t j = 0; j < nout; j++) {
            PyObject *out = PyTuple_GetItem(outs, j);
            if (table_set(&number, out, count++) < 0)
                goto op_done;
            PyObject *shape = PyObject_GetAttr(out, s_shape);
            PyObject *dtype = shape ? PyObject_GetAttr(out, s_dtype) : NULL;
            PyObject *axes = dtype ? PyObject_GetAttr(out, s_axes) : NULL;
            PyObject *tiling = NULL;
            if (axes != NULL) {
                Py_ssize_t k = table_get(&tilings, axes, -1);
                if (k >= 0) {
                    tiling = PyList_GetItem(plans, k);
                    Py_INCREF(tiling);
                } else if ((tiling = tiling_of(out, axes, known, plan_fn)) != NULL
                           && (PyList_Append(plans, tiling) < 0
                               || table_set(&tilings, axes, PyList_Size(plans) - 1) < 0)) {
                    Py_CLEAR(tiling);
                }
            }
            PyObject *flag = PyTuple_GetItem(out_parts_t, j);
            PyObject *part = tiling ? PyTuple_Pack(4, shape, dtype, tiling, flag) : NULL;
            Py_XDECREF(shape);
            Py_XDECREF(dtype);
            Py_XDECREF(axes);
            Py_XDECREF(tiling);
            if (part == NULL)
                goto op_done;
            PyTuple_SetItem(out_parts_t, j, part); /* drops the flag */
        }
        opdef = PyObject_GetAttr(op, s_opdef);
        akey = opdef ? op_attrs(op, opdef, attrs_fn, key_fn) : NULL;
        if (akey == NULL)
            goto op_done;
        PyObject *part = PyTuple_Pack(4, opdef, akey, in_nums, out_parts_t);
        if (part == NULL || PyList_Append(out_parts, part) < 0) {
            Py_XDECREF(part);
            goto op_done;
        }
        Py_DECREF(part);
        fail = 0;
    op_done:
        Py_XDECREF(ins);
        Py_XDECREF(outs);
        Py_XDECREF(in_nums);
        Py_XDECREF(out_parts_t);
        Py_XDECREF(opdef);
        Py_XDECREF(akey);
        if (fail)
            goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    if (ok_t)
        table_free(&tilings);
    if (ok_n)
        table_free(&number);
    if (ok_r)
        table_free(&readers);
    Py_XDECREF(plans);
    return result;
}

static PyMethodDef methods[] = {
    {"parts", parts, METH_VARARGS, "Append the structure key parts of a compile's ops (see structure.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_structure", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__structure(void)
{
    struct { PyObject **at; const char *name; } names[] = {
        {&s_inputs, "inputs"}, {&s_outputs, "outputs"}, {&s_opdef, "opdef"}, {&s_attrs, "attrs"},
        {&s_shape, "shape"}, {&s_dtype, "dtype"}, {&s_axes, "axes"}, {&s_parent, "parent"},
        {&s_binds_kernel, "binds_kernel"}, {&s_binds_data, "binds_data"}, {&s_value, "value"},
        {&s_handles, "handles"}, {&s_tiling, "tiling"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].at = PyUnicode_InternFromString(names[i].name)) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
