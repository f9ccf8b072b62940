/* A finished call's arithmetic and appends in C: timeline.py's `derive` and the common case of
 * the recorder's per-value loop (recorder.py), without a Python frame or bytecode per value.
 *
 * Both are exact copies of the Python code beside them, which stays the definition and the
 * fallback (a build without a compiler runs it, and so does anything this file does not take):
 * - `derive(t)` takes a timeline whose stamps and token counts are plain ints within +-2^62;
 *   for any other timeline (a float, a bool, a huge int, a subclass) it calls the Python
 *   `derive` it was bound to, so odd input gets the very answer, or exception, it got before.
 * - `append(keys, known, derived, slice_id, dirty, keep, pending_max)` appends every present
 *   value whose series is known, whose value is a valid int and whose window slice is open, as
 *   the Python loop's inline common case does, and returns the positions it left (None: none)
 *   for the Python loop to take (a new series, a new slice, a bad value: its counted drops).
 * - `bucket_groups(ordered, mask, shift, half_magnitude, half_count)` groups a sorted batch by
 *   HDR bucket as `Layout.bucketize` does (the (indices, ends) of its Batch), in one pass; None
 *   for a batch with a value that is not a plain int in [0, 2^62).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NS_PER_US 1000LL

static PyObject *derived_type;   /* timeline.Derived */
static PyObject *python_derive;  /* timeline.derive_in_python */
static PyObject *phase_names;    /* names.PHASES: retry, queue ... prefill, reasoning, decode */

static PyObject *str_start, *str_dispatched, *str_connected, *str_sent, *str_headers,
    *str_first_token, *str_first_answer_token, *str_end, *str_token_times,
    *str_reasoning_events, *str_input_tokens, *str_output_tokens, *str_cached_input_tokens,
    *str_max_tokens, *str_server_queue, *str_server_prefill, *str_attempt_start, *str_pending,
    *str_pending_slice, *str_fold;

/* Python's floor division by a positive divisor. */
static inline long long
floordiv(long long a, long long b)
{
    long long q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* Stamps and token counts this file takes: any two differ by less than 2^63, so no
 * subtraction below overflows. Anything outside goes to the Python code. */
#define LIMIT (1LL << 62)

/* An int within +-LIMIT as a C integer: 0; None: 1; anything else: -1. */
static inline int
as_int(PyObject *value, long long *out)
{
    int overflow;
    if (value == Py_None)
        return 1;
    if (!PyLong_CheckExact(value))
        return -1;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    return (overflow || *out >= LIMIT || *out <= -LIMIT) ? -1 : 0;
}

/* (b - a) // 1000 as an int, or None when a stamp is missing or b < a (timeline._span). */
static PyObject *
span_us(int a_absent, long long a, int b_absent, long long b)
{
    if (a_absent || b_absent || b < a)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(floordiv(b - a, NS_PER_US));
}

/* phases[name] = value (a new reference, consumed); -1 on an error. */
static int
set_phase(PyObject *phases, Py_ssize_t which, PyObject *value)
{
    int rc;
    if (value == NULL)
        return -1;
    rc = PyDict_SetItem(phases, PyTuple_GET_ITEM(phase_names, which), value);
    Py_DECREF(value);
    return rc;
}

/* The timeline's fields this file reads, in this order; the first six are the stamps the
 * consecutive phases lie between (from ATTEMPT_START instead of START where it is set). */
enum { START, DISPATCHED, CONNECTED, SENT, HEADERS, FIRST_TOKEN, FIRST_ANSWER, END,
       REASONING_EVENTS, OUTPUT_TOKENS, MAX_TOKENS, SERVER_QUEUE, SERVER_PREFILL, ATTEMPT_START,
       INPUT_TOKENS, CACHED_INPUT_TOKENS, TOKEN_TIMES, N_FIELDS };

/* Where names.PHASES has each phase: retry, then the stamped ones (queue .. prefill). */
enum { PHASE_RETRY, PHASE_QUEUE, PHASE_REASONING = PHASE_QUEUE + 5, PHASE_DECODE, N_PHASES };

/* Derived's length; phases and gaps are its items 10 and 11. */
#define N_DERIVED 15

static PyObject *
derive(PyObject *module, PyObject *t)
{
    PyObject **field_names[N_FIELDS] = {
        &str_start, &str_dispatched, &str_connected, &str_sent, &str_headers, &str_first_token,
        &str_first_answer_token, &str_end, &str_reasoning_events, &str_output_tokens,
        &str_max_tokens, &str_server_queue, &str_server_prefill, &str_attempt_start,
        &str_input_tokens, &str_cached_input_tokens, &str_token_times};
    PyObject *field[N_FIELDS] = {NULL}, *items[N_DERIVED] = {NULL}, *times, *d, *value;
    long long v[INPUT_TOKENS] = {0}, last = 0, output, head, ttft, queue, prefill, outside, a;
    int absent[INPUT_TOKENS], a_absent, i;
    Py_ssize_t events, k;

    if (derived_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_hotrecord.bind was not called");
        return NULL;
    }
    for (i = 0; i < N_FIELDS; i++)
        if ((field[i] = PyObject_GetAttr(t, *field_names[i])) == NULL)
            goto error;
    for (i = 0; i < INPUT_TOKENS; i++) /* the integers read as such; the rest passed through */
        if ((absent[i] = as_int(field[i], &v[i])) < 0)
            goto python;
    if (absent[REASONING_EVENTS]) /* None: Python's truth test takes it */
        goto python;
    if (!PyList_CheckExact(field[TOKEN_TIMES]))
        goto python;
    /* a snapshot: code the allocations below may run (a finaliser) cannot change its length */
    if ((times = PyList_AsTuple(field[TOKEN_TIMES])) == NULL)
        goto error;
    Py_SETREF(field[TOKEN_TIMES], times);
    events = PyTuple_GET_SIZE(times);
    for (k = 0; k < events; k++)
        if (as_int(PyTuple_GET_ITEM(times, k), &last) != 0)
            goto python;

    /* the inter-token gaps (gaps_us) and the longest (stall: the first of equal maxima) */
    PyObject *stall = Py_None;
    long long longest = 0;
    if ((items[11] = PyList_New(events > 1 ? events - 1 : 0)) == NULL)
        goto error;
    for (k = 1; k < events; k++) {
        long long gap = floordiv(PyLong_AsLongLong(PyTuple_GET_ITEM(times, k)) -
                                 PyLong_AsLongLong(PyTuple_GET_ITEM(times, k - 1)), NS_PER_US);
        if ((value = PyLong_FromLongLong(gap)) == NULL)
            goto error;
        PyList_SET_ITEM(items[11], k - 1, value);
        if (stall == Py_None || gap > longest)
            stall = value, longest = gap;
    }
    /* retry (a retried call's start to its final attempt's), the phases between consecutive
     * stamps from the attempt's start, then reasoning and decode (timeline.phases) */
    if ((items[10] = PyDict_New()) == NULL)
        goto error;
    a_absent = absent[START], a = v[START];
    if (!absent[ATTEMPT_START]) {
        if (!absent[START] && v[ATTEMPT_START] >= v[START] &&
            set_phase(items[10], PHASE_RETRY,
                      PyLong_FromLongLong(floordiv(v[ATTEMPT_START] - v[START], NS_PER_US))))
            goto error;
        a_absent = 0, a = v[ATTEMPT_START];
    }
    for (i = START; i < FIRST_TOKEN; i++) {
        if (!a_absent && !absent[i + 1] && v[i + 1] >= a &&
            set_phase(items[10], PHASE_QUEUE + i,
                      PyLong_FromLongLong(floordiv(v[i + 1] - a, NS_PER_US))))
            goto error;
        a_absent = absent[i + 1], a = v[i + 1];
    }
    if (!absent[FIRST_ANSWER]) {
        if (v[REASONING_EVENTS] && !absent[FIRST_TOKEN] && v[FIRST_ANSWER] >= v[FIRST_TOKEN] &&
            set_phase(items[10], PHASE_REASONING, span_us(0, v[FIRST_TOKEN], 0, v[FIRST_ANSWER])))
            goto error;
        if (events && last >= v[FIRST_ANSWER] &&
            set_phase(items[10], PHASE_DECODE,
                      PyLong_FromLongLong(floordiv(last - v[FIRST_ANSWER], NS_PER_US))))
            goto error;
    }
    items[0] = span_us(absent[START], v[START], absent[FIRST_TOKEN], v[FIRST_TOKEN]);
    /* the server's queue and prefill, and what of a streamed call's ttft is outside them */
    queue = absent[SERVER_QUEUE] ? 0 : floordiv(v[SERVER_QUEUE], NS_PER_US);
    prefill = absent[SERVER_PREFILL] ? 0 : floordiv(v[SERVER_PREFILL], NS_PER_US);
    items[12] = absent[SERVER_QUEUE] ? Py_NewRef(Py_None) : PyLong_FromLongLong(queue);
    items[13] = absent[SERVER_PREFILL] ? Py_NewRef(Py_None) : PyLong_FromLongLong(prefill);
    if (events && items[0] != NULL && items[0] != Py_None && !absent[SERVER_PREFILL]) {
        ttft = floordiv(v[FIRST_TOKEN] - v[START], NS_PER_US);
        outside = ttft - queue - prefill;
        items[14] = PyLong_FromLongLong(outside > 0 ? outside : 0);
    } else
        items[14] = Py_NewRef(Py_None);
    items[1] = span_us(absent[START], v[START], absent[FIRST_ANSWER], v[FIRST_ANSWER]);
    /* tpot: output = t.output_tokens if t.output_tokens else events */
    output = (!absent[OUTPUT_TOKENS] && v[OUTPUT_TOKENS]) ? v[OUTPUT_TOKENS] : events;
    if (!absent[FIRST_TOKEN] && events && output >= 2 && last > v[FIRST_TOKEN])
        items[2] = PyLong_FromLongLong(
            floordiv(floordiv(last - v[FIRST_TOKEN], NS_PER_US), output - 1));
    else
        items[2] = Py_NewRef(Py_None);
    items[3] = Py_NewRef(stall);
    items[4] = span_us(absent[START], v[START], absent[END], v[END]);
    items[5] = Py_NewRef(field[INPUT_TOKENS]);
    items[6] = Py_NewRef(field[OUTPUT_TOKENS]);
    items[7] = Py_NewRef(field[CACHED_INPUT_TOKENS]);
    items[8] = Py_NewRef(field[MAX_TOKENS]);
    if (!absent[MAX_TOKENS] && !absent[OUTPUT_TOKENS]) {
        head = v[MAX_TOKENS] - v[OUTPUT_TOKENS];
        items[9] = PyLong_FromLongLong(head > 0 ? head : 0);
    } else
        items[9] = Py_NewRef(Py_None);
    for (i = 0; i < N_DERIVED; i++)
        if (items[i] == NULL)
            goto error;
    d = ((PyTypeObject *)derived_type)->tp_alloc((PyTypeObject *)derived_type, N_DERIVED);
    if (d == NULL)
        goto error;
    for (i = 0; i < N_DERIVED; i++)
        PyTuple_SET_ITEM(d, i, items[i]);
    for (i = 0; i < N_FIELDS; i++)
        Py_DECREF(field[i]);
    return d;

python:
    for (i = 0; i < N_FIELDS; i++)
        Py_XDECREF(field[i]);
    return PyObject_CallOneArg(python_derive, t);

error:
    for (i = 0; i < N_DERIVED; i++)
        Py_XDECREF(items[i]);
    for (i = 0; i < N_FIELDS; i++)
        Py_XDECREF(field[i]);
    return NULL;
}

/* 1: `value` goes to `series` here; 0: the Python loop takes it; -1: an error. */
static int
append_one(PyObject *series, PyObject *value, long long slice_id, PyObject *dirty,
           PyObject *keep, Py_ssize_t pending_max)
{
    int overflow;
    long long open_slice, v;
    PyObject *pending_slice, *pending;

    if (!PyLong_CheckExact(value))
        return 0;
    v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow < 0 || (!overflow && v < 0))
        return 0;
    pending_slice = PyObject_GetAttr(series, str_pending_slice);
    if (pending_slice == NULL)
        return -1;
    open_slice = PyLong_AsLongLongAndOverflow(pending_slice, &overflow);
    Py_DECREF(pending_slice);
    if (overflow || (open_slice == -1 && PyErr_Occurred()) || slice_id > open_slice) {
        PyErr_Clear();
        return 0;
    }
    if (PySet_Add(dirty, series) < 0)
        return -1;
    pending = PyObject_GetAttr(series, str_pending);
    if (pending == NULL)
        return -1;
    if (PyList_Append(pending, value) < 0) {
        Py_DECREF(pending);
        return -1;
    }
    if (PyList_GET_SIZE(pending) >= pending_max) {
        PyObject *folded = PyObject_CallMethodOneArg(series, str_fold, keep);
        if (folded == NULL) {
            Py_DECREF(pending);
            return -1;
        }
        Py_DECREF(folded);
    }
    Py_DECREF(pending);
    return 1;
}

static PyObject *
append(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *keys, *known, *d, *dirty, *keep, *phases, *left = NULL;
    long long slice_id;
    Py_ssize_t n, at, pending_max;

    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "append(keys, known, derived, slice_id, dirty, keep, "
                                         "pending_max) takes 7 arguments");
        return NULL;
    }
    keys = args[0], known = args[1], d = args[2], dirty = args[4], keep = args[5];
    if (!PyTuple_Check(keys) || !PyList_CheckExact(known) || !PyTuple_Check(d) ||
        PyTuple_GET_SIZE(d) < 11 || !PySet_Check(dirty) ||
        PyList_GET_SIZE(known) != PyTuple_GET_SIZE(keys)) {
        PyErr_SetString(PyExc_TypeError, "append: unexpected argument types");
        return NULL;
    }
    slice_id = PyLong_AsLongLong(args[3]);
    if (slice_id == -1 && PyErr_Occurred())
        return NULL;
    pending_max = PyLong_AsSsize_t(args[6]);
    if (pending_max == -1 && PyErr_Occurred())
        return NULL;
    phases = PyTuple_GET_ITEM(d, 10);
    if (!PyDict_CheckExact(phases)) {
        PyErr_SetString(PyExc_TypeError, "append: the phases are not a dict");
        return NULL;
    }
    n = PyTuple_GET_SIZE(keys);
    for (at = 0; at < n; at++) {
        PyObject *key = PyTuple_GET_ITEM(keys, at), *value, *series;
        int done;
        if (PyLong_CheckExact(key)) { /* a field of Derived */
            Py_ssize_t field = PyLong_AsSsize_t(key);
            if (field < 0 || field >= PyTuple_GET_SIZE(d)) {
                PyErr_SetString(PyExc_IndexError, "append: a field out of range");
                goto error;
            }
            value = PyTuple_GET_ITEM(d, field);
        } else { /* a phase */
            value = PyDict_GetItemWithError(phases, key);
            if (value == NULL) {
                if (PyErr_Occurred())
                    goto error;
                continue;
            }
        }
        if (value == Py_None)
            continue;
        series = PyList_GET_ITEM(known, at);
        done = series == Py_None ? 0
                                 : append_one(series, value, slice_id, dirty, keep, pending_max);
        if (done < 0)
            goto error;
        if (done)
            continue;
        if (left == NULL && (left = PyList_New(0)) == NULL)
            goto error;
        {
            PyObject *position = PyLong_FromSsize_t(at);
            if (position == NULL || PyList_Append(left, position) < 0) {
                Py_XDECREF(position);
                goto error;
            }
            Py_DECREF(position);
        }
    }
    if (left == NULL)
        Py_RETURN_NONE;
    return left;

error:
    Py_XDECREF(left);
    return NULL;
}

/* list.append(C integer); -1 on an error. */
static inline int
append_int(PyObject *list, long long value)
{
    PyObject *item = PyLong_FromLongLong(value);
    int rc;
    if (item == NULL)
        return -1;
    rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

static PyObject *
bucket_groups(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *ordered, *indices = NULL, *ends = NULL;
    long long mask, shift, half_magnitude, half_count, last = -1, value, index, b;
    Py_ssize_t n, k;
    int overflow;

    if (nargs != 5 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bucket_groups(ordered: list, mask, shift, "
                                         "half_magnitude, half_count)");
        return NULL;
    }
    ordered = args[0];
    mask = PyLong_AsLongLong(args[1]);
    shift = PyLong_AsLongLong(args[2]);
    half_magnitude = PyLong_AsLongLong(args[3]);
    half_count = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (mask <= 0 || mask >= LIMIT || shift < 0 || shift > 62 || half_magnitude < 0 ||
        half_magnitude > 30)
        Py_RETURN_NONE;
    n = PyList_GET_SIZE(ordered);
    if ((indices = PyList_New(0)) == NULL || (ends = PyList_New(0)) == NULL)
        goto error;
    for (k = 0; k < n; k++) {
        PyObject *item = PyList_GET_ITEM(ordered, k);
        if (!PyLong_CheckExact(item))
            goto python;
        value = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || value < 0 || value >= LIMIT)
            goto python;
        /* Layout.index: b = (value | mask).bit_length() - shift */
        b = 64 - __builtin_clzll((unsigned long long)(value | mask)) - shift;
        if (b < 0)
            goto python;
        index = ((b + 1) << half_magnitude) + (value >> b) - half_count;
        if (index == last) {
            PyObject *end = PyLong_FromSsize_t(k + 1);
            if (end == NULL || PyList_SetItem(ends, PyList_GET_SIZE(ends) - 1, end) < 0)
                goto error; /* (PyList_SetItem takes `end` even when it fails) */
        } else {
            if (append_int(indices, index) < 0 || append_int(ends, k + 1) < 0)
                goto error;
            last = index;
        }
    }
    return Py_BuildValue("(NN)", indices, ends);

python:
    Py_DECREF(indices);
    Py_DECREF(ends);
    Py_RETURN_NONE;

error:
    Py_XDECREF(indices);
    Py_XDECREF(ends);
    return NULL;
}

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *cls, *fallback_derive, *phases, *fields;
    Py_ssize_t n_fields;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyType_Type, &cls, &fallback_derive, &PyTuple_Type,
                          &phases))
        return NULL;
    if ((fields = PyObject_GetAttrString(cls, "_fields")) == NULL)
        return NULL;
    n_fields = PyObject_Length(fields);
    Py_DECREF(fields);
    if (!PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type) ||
        PyTuple_GET_SIZE(phases) != N_PHASES || n_fields != N_DERIVED) {
        PyErr_SetString(PyExc_ValueError, "bind(Derived, derive_in_python, PHASES): a tuple "
                                          "type of the fields derive builds, eight phases");
        return NULL;
    }
    Py_XSETREF(derived_type, Py_NewRef(cls));
    Py_XSETREF(python_derive, Py_NewRef(fallback_derive));
    Py_XSETREF(phase_names, Py_NewRef(phases));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"derive", (PyCFunction)derive, METH_O,
     "derive(t) -> Derived: timeline.derive in C (other input: the bound Python derive)."},
    {"append", (PyCFunction)(void (*)(void))append, METH_FASTCALL,
     "append(keys, known, derived, slice_id, dirty, keep, pending_max) -> positions left, "
     "or None: the "
     "recorder's per-value common case."},
    {"bucket_groups", (PyCFunction)(void (*)(void))bucket_groups, METH_FASTCALL,
     "bucket_groups(ordered, mask, shift, half_magnitude, half_count) -> (indices, ends) of "
     "Layout.bucketize, or None."},
    {"bind", bind, METH_VARARGS,
     "bind(Derived, derive_in_python, PHASES): what derive builds on."},
    {NULL}};

static struct PyModuleDef hotrecord_module = {
    PyModuleDef_HEAD_INIT, "_hotrecord",
    "A finished call's derive and per-value appends in C (the Python code is the fallback).",
    -1, methods};

PyMODINIT_FUNC
PyInit__hotrecord(void)
{
#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(str_start, "start");
    INTERN(str_dispatched, "dispatched");
    INTERN(str_connected, "connected");
    INTERN(str_sent, "sent");
    INTERN(str_headers, "headers");
    INTERN(str_first_token, "first_token");
    INTERN(str_first_answer_token, "first_answer_token");
    INTERN(str_end, "end");
    INTERN(str_token_times, "token_times");
    INTERN(str_reasoning_events, "reasoning_events");
    INTERN(str_input_tokens, "input_tokens");
    INTERN(str_output_tokens, "output_tokens");
    INTERN(str_cached_input_tokens, "cached_input_tokens");
    INTERN(str_max_tokens, "max_tokens");
    INTERN(str_server_queue, "server_queue");
    INTERN(str_server_prefill, "server_prefill");
    INTERN(str_attempt_start, "attempt_start");
    INTERN(str_pending, "pending");
    INTERN(str_pending_slice, "pending_slice");
    INTERN(str_fold, "fold");
#undef INTERN
    return PyModule_Create(&hotrecord_module);
}
