// ATen ops called from C++ on the StarPU workers, without the GIL.
//
// An op with no tiled kernel runs as a task that calls PyTorch's CPU kernel on its
// tiles (backend/untiled.py, ops/batched.py): a convolution per batch tile, a pooling,
// any op with a Meta kernel. Called from Python, each such task first takes the GIL for
// its glue, and waits for it while the host records the next ops in Python. Here the
// call is prepared once per op, arguments and tile shapes (tnt_aten_prepare, from
// Python's encoding of the arguments: backend/aten_calls.py); a task then only wraps
// its buffers in tensors, calls the op through the dispatcher and copies the results
// into its output tiles (tnt_aten_run, which the shim calls for its rows.h kind
// TNT_ROWS_ATEN). An exception the op raises fails the task: its Python type and
// message stay with the worker's thread until Python builds the error from them
// (tnt_aten_last_error).
//
// Prepared calls are never freed: tasks in flight point at them, and there is one per
// op, arguments and tile shapes of a program.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/stack.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

// kinds of argument tokens (backend/aten_calls.py mirrors them)
enum Token { NONE = 0, INT, FLOAT, BOOL, STR, INTS, FLOATS, BOOLS, SLOT, SLOTS, OPT_SLOTS, SCALAR_TENSOR, DEVICE_CPU };
// Python types of an op's exception (backend/aten_calls.py mirrors them)
enum ErrorType { E_RUNTIME = 0, E_INDEX, E_VALUE, E_TYPE, E_NOT_IMPLEMENTED, E_LINALG, E_MEMORY };

struct Arg {
    int kind = NONE;
    c10::IValue value;      // the argument, for every kind but the slots
    std::vector<int> bufs;  // the buffers of SLOT (one), SLOTS and OPT_SLOTS (-1: None)
};

// how an argument the op writes reaches its output buffer (nfresh + k for the k-th)
enum Written { TILE = 0, CLONE, SCRATCH };

struct Write {
    int kind = TILE;
    int value = 0;  // CLONE: the input buffer copied first (the op reads it); SCRATCH: the dtype
};

struct Call {
    c10::OperatorHandle op;
    std::vector<Arg> args;
    std::vector<Write> written;
    std::vector<std::vector<int64_t>> shapes;  // per buffer
    std::vector<c10::ScalarType> dtypes;
    std::vector<int> fresh;  // result leaf copied into output buffer k, for k < fresh.size()
    explicit Call(c10::OperatorHandle h) : op(std::move(h)) {}
};

std::mutex calls_lock;
std::vector<std::unique_ptr<Call>>& calls() {
    static auto* all = new std::vector<std::unique_ptr<Call>>();  // never destroyed: tasks may run at exit
    return *all;
}

thread_local int last_type = E_RUNTIME;
thread_local std::string last_message;
thread_local bool worker_ready = false;

bool ints_of(PyObject* seq, std::vector<int64_t>& out) {
    if (!PyTuple_Check(seq))
        return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq); i++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred())
            return false;
        out.push_back(v);
    }
    return true;
}

bool arg_of(PyObject* tok, int nbuf, Arg& a) {
    if (!PyTuple_Check(tok) || PyTuple_GET_SIZE(tok) < 1)
        return false;
    a.kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(tok, 0));
    PyObject* v = PyTuple_GET_SIZE(tok) > 1 ? PyTuple_GET_ITEM(tok, 1) : nullptr;
    std::vector<int64_t> ints;
    switch (a.kind) {
    case NONE: a.value = c10::IValue(); return true;
    case DEVICE_CPU: a.value = c10::IValue(c10::Device(c10::kCPU)); return true;
    case INT: {
        long long x = PyLong_AsLongLong(v);
        a.value = c10::IValue((int64_t)x);
        return !(x == -1 && PyErr_Occurred());
    }
    case FLOAT: a.value = c10::IValue(PyFloat_AsDouble(v)); return !PyErr_Occurred();
    case BOOL: a.value = c10::IValue(v == Py_True); return true;
    case STR: {
        const char* s = PyUnicode_AsUTF8(v);
        if (s == nullptr)
            return false;
        a.value = c10::IValue(std::string(s));
        return true;
    }
    case INTS:
        if (!ints_of(v, ints))
            return false;
        a.value = c10::IValue(c10::List<int64_t>(ints));
        return true;
    case FLOATS: {
        c10::List<double> l;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++)
            l.push_back(PyFloat_AsDouble(PyTuple_GET_ITEM(v, i)));
        a.value = c10::IValue(l);
        return !PyErr_Occurred();
    }
    case BOOLS: {
        c10::List<bool> l;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++)
            l.push_back(PyTuple_GET_ITEM(v, i) == Py_True);
        a.value = c10::IValue(l);
        return true;
    }
    case SLOT: case SLOTS: case OPT_SLOTS: {
        if (a.kind == SLOT) {
            long long b = PyLong_AsLongLong(v);
            if (b < 0 || b >= nbuf)
                return false;
            a.bufs.push_back((int)b);
            return true;
        }
        if (!ints_of(v, ints))
            return false;
        for (int64_t b : ints) {
            if (b < (a.kind == OPT_SLOTS ? -1 : 0) || b >= nbuf)
                return false;
            a.bufs.push_back((int)b);
        }
        return true;
    }
    case SCALAR_TENSOR: {  // (kind, value, dtype): a 0-dim CPU tensor among the arguments
        if (PyTuple_GET_SIZE(tok) != 3)
            return false;
        auto dt = (c10::ScalarType)PyLong_AsLong(PyTuple_GET_ITEM(tok, 2));
        c10::Scalar x;
        if (PyBool_Check(v))
            x = c10::Scalar(v == Py_True);
        else if (PyLong_Check(v))
            x = c10::Scalar((int64_t)PyLong_AsLongLong(v));
        else
            x = c10::Scalar(PyFloat_AsDouble(v));
        if (PyErr_Occurred())
            return false;
        a.value = c10::IValue(at::scalar_tensor(x, at::TensorOptions().dtype(dt)));
        return true;
    }
    default:
        return false;
    }
}

int error_type(const std::exception& e) {
    if (dynamic_cast<const c10::IndexError*>(&e))
        return E_INDEX;
    if (dynamic_cast<const c10::ValueError*>(&e))
        return E_VALUE;
    if (dynamic_cast<const c10::TypeError*>(&e))
        return E_TYPE;
    if (dynamic_cast<const c10::NotImplementedError*>(&e))
        return E_NOT_IMPLEMENTED;
    if (dynamic_cast<const c10::LinAlgError*>(&e))
        return E_LINALG;
    if (dynamic_cast<const c10::OutOfMemoryError*>(&e))
        return E_MEMORY;
    return E_RUNTIME;
}

at::Tensor tile(void* ptr, const std::vector<int64_t>& shape, c10::ScalarType dt) {
    auto opts = at::TensorOptions().dtype(dt);
    if (ptr == nullptr)  // a tile of no elements
        return at::empty(shape, opts);
    return at::from_blob(ptr, shape, opts);
}

}  // namespace

extern "C" {

// The prepared call of spec = (name, overload, shapes, dtypes, fresh, written, args):
// shapes and dtypes (c10::ScalarType) of the task's buffers, outputs first; fresh, the
// positions among the op's results (flattened, a list counting each of its tensors) of
// the ones copied into output buffers 0, 1, ...; written, per argument the op writes,
// (kind, value) as Write (its output buffer follows the fresh ones); args, one token per
// argument of the schema, in order. As run_untiled (backend/untiled.py): a CLONE input
// is read from a copy the op then writes, a SCRATCH argument is an empty tensor the op
// resizes; either is copied into the output buffer after the call. 0 (and no Python
// error set) where the op or an argument is not one it takes.
uintptr_t tnt_aten_prepare(PyObject* spec) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 7)
        return 0;
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
    const char* overload = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 1));
    if (name == nullptr || overload == nullptr) {
        PyErr_Clear();
        return 0;
    }
    auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
    if (!handle)
        return 0;
    auto call = std::make_unique<Call>(*handle);
    PyObject *shapes = PyTuple_GET_ITEM(spec, 2), *dtypes = PyTuple_GET_ITEM(spec, 3);
    PyObject *fresh = PyTuple_GET_ITEM(spec, 4), *written = PyTuple_GET_ITEM(spec, 5);
    PyObject* args = PyTuple_GET_ITEM(spec, 6);
    bool ok = PyTuple_Check(shapes) && PyTuple_Check(dtypes) && PyTuple_Check(fresh) && PyTuple_Check(args)
              && PyTuple_Check(written)
              && PyTuple_GET_SIZE(shapes) == PyTuple_GET_SIZE(dtypes)
              && PyTuple_GET_SIZE(fresh) <= PyTuple_GET_SIZE(shapes);
    int nbuf = ok ? (int)PyTuple_GET_SIZE(shapes) : 0;
    for (int b = 0; ok && b < nbuf; b++) {
        std::vector<int64_t> s;
        ok = ints_of(PyTuple_GET_ITEM(shapes, b), s);
        call->shapes.push_back(s);
        call->dtypes.push_back((c10::ScalarType)PyLong_AsLong(PyTuple_GET_ITEM(dtypes, b)));
    }
    std::vector<int64_t> at;
    ok = ok && ints_of(fresh, at);
    for (int64_t k : at)
        call->fresh.push_back((int)k);
    ok = ok && (int)(call->fresh.size() + PyTuple_GET_SIZE(written)) <= nbuf;
    for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(written); k++) {
        std::vector<int64_t> w;
        ok = ints_of(PyTuple_GET_ITEM(written, k), w) && w.size() == 2 && w[0] >= TILE && w[0] <= SCRATCH
             && (w[0] != CLONE || (w[1] >= 0 && w[1] < nbuf));
        if (ok)
            call->written.push_back(Write{(int)w[0], (int)w[1]});
    }
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(args); i++) {
        Arg a;
        ok = arg_of(PyTuple_GET_ITEM(args, i), nbuf, a);
        call->args.push_back(std::move(a));
    }
    ok = ok && call->args.size() == call->op.schema().arguments().size();
    if (!ok || PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    std::lock_guard<std::mutex> g(calls_lock);
    calls().push_back(std::move(call));
    return (uintptr_t)calls().back().get();
}

// Runs a prepared call on the task's buffers: 0, or 1 where the op raised.
int tnt_aten_run(const void* prepared, void* const* bufs, int nbuf) {
    const Call& c = *(const Call*)prepared;
    try {
        if (!worker_ready) {  // ops run on the calling worker only, as torch.set_num_threads(1) there
            at::set_num_threads(1);
            worker_ready = true;
        }
        c10::InferenceMode guard;
        std::vector<at::Tensor> tiles;
        tiles.reserve(nbuf);
        for (int b = 0; b < nbuf; b++)
            tiles.push_back(tile(bufs[b], c.shapes[b], c.dtypes[b]));
        std::vector<at::Tensor> given(tiles);  // what the op is given for each buffer
        size_t nfresh = c.fresh.size();
        for (size_t k = 0; k < c.written.size(); k++) {
            const Write& w = c.written[k];
            if (w.kind == CLONE)
                given[w.value] = tiles[w.value].clone();
            else if (w.kind == SCRATCH)
                given[nfresh + k] = at::empty({0}, at::TensorOptions().dtype((c10::ScalarType)w.value));
        }
        torch::jit::Stack stack;
        stack.reserve(c.args.size());
        for (const Arg& a : c.args) {
            if (a.kind == SLOT) {
                stack.emplace_back(given[a.bufs[0]]);
            } else if (a.kind == SLOTS) {
                c10::List<at::Tensor> l;
                for (int b : a.bufs)
                    l.push_back(given[b]);
                stack.emplace_back(l);
            } else if (a.kind == OPT_SLOTS) {
                c10::List<std::optional<at::Tensor>> l;
                for (int b : a.bufs)
                    l.push_back(b < 0 ? std::optional<at::Tensor>() : std::optional<at::Tensor>(given[b]));
                stack.emplace_back(l);
            } else {
                stack.push_back(a.value);
            }
        }
        c.op.callBoxed(stack);
        std::vector<c10::IValue> leaves;  // the results flattened as Python's tree_flatten does
        for (auto& r : stack) {
            if (r.isTensorList()) {
                for (const at::Tensor& t : r.toTensorList())
                    leaves.emplace_back(t);
            } else {
                leaves.push_back(r);
            }
        }
        for (size_t k = 0; k < c.fresh.size(); k++) {
            const c10::IValue& r = leaves.at(c.fresh[k]);
            TORCH_CHECK(r.isTensor() && r.toTensor().defined(), "torch_nntile: ", c.op.schema().name(),
                        " gave no tensor where its Meta kernel did");
            const at::Tensor& t = r.toTensor();
            if (t.data_ptr() != tiles[k].data_ptr() || t.strides() != tiles[k].strides())
                tiles[k].copy_(t);
        }
        for (size_t k = 0; k < c.written.size(); k++) {
            const Write& w = c.written[k];
            if (w.kind != TILE)
                tiles[nfresh + k].copy_(given[w.kind == CLONE ? w.value : (int)(nfresh + k)]);
        }
        return 0;
    } catch (const c10::Error& e) {
        last_type = error_type(e);
        last_message = e.what_without_backtrace();
    } catch (const std::exception& e) {
        last_type = error_type(e);
        last_message = e.what();
    }
    return 1;
}

// The Python type (ErrorType) of the last exception a call raised on this thread; its
// message copied to buf (n bytes at most, with the terminating zero).
int tnt_aten_last_error(char* buf, size_t n) {
    if (n) {
        size_t len = last_message.size() < n - 1 ? last_message.size() : n - 1;
        std::memcpy(buf, last_message.data(), len);
        buf[len] = 0;
    }
    return last_type;
}

}  // extern "C"
