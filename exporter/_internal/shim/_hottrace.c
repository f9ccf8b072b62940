/* The httpx `trace` extension of a sync SDK call in C (sdk_call.py's `SdkCall.__call__` with
 * httpx_trace.py's `stamp`), without a Python frame per connection event.
 *
 * httpcore calls a request's trace extension around each step (about nine times a call, half
 * of them steps no phase needs). A `Tracer` looks the event's name up in httpx_trace.EVENTS
 * and stamps the call's timeline (CLOCK_MONOTONIC, the clock behind `time.perf_counter_ns()`
 * on Linux: sdk_call.py builds a Tracer only where they are the same) as `stamp` does. What
 * is not a plain stamp stays in Python: the response headers go to `on_headers(t, now, info)`
 * (the provider's processing time, the region), a new connection to `on_connected(t, info)`
 * (the address it reached), the response's close to the call's `_closed()`. Nothing
 * here raises into httpcore: a failure is the call's `count_drop()`, as in `__call__`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* httpx_trace.py's step codes. */
enum { DISPATCH, CONNECTED, SEND_START, SENT, HEADERS, CLOSED };

static PyObject *str_dispatched, *str_connected, *str_sent, *str_headers, *str_streaming,
    *str_finished, *str_closed, *str_count_drop;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *call;       /* the SdkCall */
    PyObject *timeline;   /* its CallTimeline */
    PyObject *events;     /* httpx_trace.EVENTS: event name -> step code */
    PyObject *on_headers; /* httpx_trace.note_headers(t, now, info) */
    PyObject *on_connected; /* httpx_trace.note_connected(t, info) */
} Tracer;

static inline long long
stamp(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* 1 if t.name is None, 0 if not, -1 on an error. */
static int
is_unset(PyObject *t, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(t, name);
    if (value == NULL)
        return -1;
    Py_DECREF(value);
    return value == Py_None;
}

/* The step: 0 done, -1 an error (set). */
static int
step(Tracer *tr, long code, PyObject *info)
{
    PyObject *t = tr->timeline, *now;
    int unset, rc = 0;

    if (code == CLOSED) { /* `if self.streaming and not self._finished: self._closed()` */
        PyObject *streaming = PyObject_GetAttr(tr->call, str_streaming), *finished, *r;
        int go;
        if (streaming == NULL)
            return -1;
        go = PyObject_IsTrue(streaming);
        Py_DECREF(streaming);
        if (go <= 0)
            return go;
        if ((finished = PyObject_GetAttr(tr->call, str_finished)) == NULL)
            return -1;
        go = PyObject_Not(finished);
        Py_DECREF(finished);
        if (go <= 0)
            return go;
        r = PyObject_CallMethodNoArgs(tr->call, str_closed);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    if ((now = PyLong_FromLongLong(stamp())) == NULL)
        return -1;
    switch (code) {
    case HEADERS:
        rc = PyObject_SetAttr(t, str_headers, now);
        if (rc == 0 && info != Py_None) {
            PyObject *args[3] = {t, now, info};
            PyObject *r = PyObject_Vectorcall(tr->on_headers, args, 3, NULL);
            Py_XDECREF(r);
            rc = r == NULL ? -1 : 0;
        }
        break;
    case SENT:
        rc = PyObject_SetAttr(t, str_sent, now);
        break;
    case SEND_START: /* a reused connection: no connect step, connected = dispatched */
        if ((unset = is_unset(t, str_dispatched)) != 0)
            rc = unset < 0 ? -1 : PyObject_SetAttr(t, str_dispatched, now);
        if (rc == 0 && (unset = is_unset(t, str_connected)) != 0) {
            PyObject *dispatched = unset < 0 ? NULL : PyObject_GetAttr(t, str_dispatched);
            rc = dispatched == NULL ? -1 : PyObject_SetAttr(t, str_connected, dispatched);
            Py_XDECREF(dispatched);
        }
        break;
    case DISPATCH:
        if ((unset = is_unset(t, str_dispatched)) != 0)
            rc = unset < 0 ? -1 : PyObject_SetAttr(t, str_dispatched, now);
        break;
    case CONNECTED:
        rc = PyObject_SetAttr(t, str_connected, now);
        if (rc == 0 && info != Py_None) {
            PyObject *args[2] = {t, info};
            PyObject *r = PyObject_Vectorcall(tr->on_connected, args, 2, NULL);
            Py_XDECREF(r);
            rc = r == NULL ? -1 : 0;
        }
        break;
    }
    Py_DECREF(now);
    return rc;
}

static PyObject *
Tracer_call(Tracer *tr, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *code;
    long value;

    if (nargs < 1 || kwnames != NULL)
        Py_RETURN_NONE; /* not httpcore's call: nothing to stamp */
    code = PyDict_GetItemWithError(tr->events, args[0]);
    if (code == NULL) { /* about half of the events stamp nothing */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    value = PyLong_AsLong(code);
    if ((value == -1 && PyErr_Occurred()) || step(tr, value, nargs > 1 ? args[1] : Py_None)) {
        PyObject *r;
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL; /* a KeyboardInterrupt or SystemExit goes on, as from __call__ */
        PyErr_Clear();
        r = PyObject_CallMethodNoArgs(tr->call, str_count_drop);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    Py_RETURN_NONE;
}

static PyObject *
Tracer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *call, *timeline, *events, *on_headers, *on_connected;
    Tracer *tr;
    if (!PyArg_ParseTuple(args, "OOO!OO:Tracer", &call, &timeline, &PyDict_Type, &events,
                          &on_headers, &on_connected))
        return NULL;
    if ((tr = (Tracer *)type->tp_alloc(type, 0)) == NULL)
        return NULL;
    tr->call = Py_NewRef(call);
    tr->timeline = Py_NewRef(timeline);
    tr->events = Py_NewRef(events);
    tr->on_headers = Py_NewRef(on_headers);
    tr->on_connected = Py_NewRef(on_connected);
    tr->vectorcall = (vectorcallfunc)Tracer_call;
    return (PyObject *)tr;
}

static int
Tracer_traverse(Tracer *tr, visitproc visit, void *arg)
{
    Py_VISIT(tr->call);
    Py_VISIT(tr->timeline);
    Py_VISIT(tr->events);
    Py_VISIT(tr->on_headers);
    Py_VISIT(tr->on_connected);
    return 0;
}

static int
Tracer_clear(Tracer *tr)
{
    Py_CLEAR(tr->call);
    Py_CLEAR(tr->timeline);
    Py_CLEAR(tr->events);
    Py_CLEAR(tr->on_headers);
    Py_CLEAR(tr->on_connected);
    return 0;
}

static void
Tracer_dealloc(Tracer *tr)
{
    PyObject_GC_UnTrack(tr);
    Tracer_clear(tr);
    Py_TYPE(tr)->tp_free((PyObject *)tr);
}

static PyMemberDef Tracer_members[] = {
    {"call", T_OBJECT, offsetof(Tracer, call), READONLY, "the SdkCall this traces"},
    {NULL}};

static PyTypeObject TracerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exporter._internal.shim._hottrace.Tracer",
    .tp_doc = "Tracer(call, timeline, events, on_headers, on_connected): the httpx trace "
              "extension of a sync SDK call (sdk_call.py).",
    .tp_basicsize = sizeof(Tracer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Tracer_new,
    .tp_dealloc = (destructor)Tracer_dealloc,
    .tp_traverse = (traverseproc)Tracer_traverse,
    .tp_clear = (inquiry)Tracer_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Tracer, vectorcall),
    .tp_members = Tracer_members,
};

static struct PyModuleDef hottrace_module = {
    PyModuleDef_HEAD_INIT, "_hottrace",
    "The httpx trace extension of a sync SDK call in C (sdk_call.py falls back to Python).", -1,
    NULL};

PyMODINIT_FUNC
PyInit__hottrace(void)
{
    PyObject *m;
    if (PyType_Ready(&TracerType) < 0)
        return NULL;
#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(str_dispatched, "dispatched");
    INTERN(str_connected, "connected");
    INTERN(str_sent, "sent");
    INTERN(str_headers, "headers");
    INTERN(str_streaming, "streaming");
    INTERN(str_finished, "_finished");
    INTERN(str_closed, "_closed");
    INTERN(str_count_drop, "count_drop");
#undef INTERN
    if ((m = PyModule_Create(&hottrace_module)) == NULL)
        return NULL;
    Py_INCREF(&TracerType);
    if (PyModule_AddObject(m, "Tracer", (PyObject *)&TracerType) < 0) {
        Py_DECREF(&TracerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
