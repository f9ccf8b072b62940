/* The per-chunk loop of a streamed SDK call as a C iterator (tokens.py's `sync_tokens`, after
 * the first answer token, without a Python frame per event).
 *
 * A `Stamper` is what the SDK's `Stream` iterates in place of its own generator: it takes each
 * event from that generator, stamps it (CLOCK_MONOTONIC, the clock behind
 * `time.perf_counter_ns()` on Linux), and returns the very same object. Until the first answer
 * token every event goes to the Python `cold` callback (tokens.py classifies it in full); from
 * then on the wire format's plain text delta is recognised here with dict reads of the SDK's
 * pydantic objects (their instance `__dict__`, as tokens.py's loop reads them), its stamp
 * appended to the call's list, and any other event handed to the Python `other` callback.
 * The call's end goes to Python too: `finish(last)` at the stream's end, `fail(exc)` when the
 * SDK's generator raises (the exception then propagates unchanged), `abandon()` when the
 * iterator is collected before its end. Nothing here raises into the caller: a failed callback
 * or read sends the rest of the stream through unmeasured.
 *
 * The stamps must come from the clock the rest of the call uses: tokens.py builds a Stamper
 * only where `time.get_clock_info("perf_counter")` is CLOCK_MONOTONIC.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* Wire formats: sdk_call.HOT_GENERIC, HOT_CHAT, HOT_RESPONSES, HOT_ANTHROPIC (the module
   serves them; a test holds them equal). */
enum { HOT_GENERIC, HOT_CHAT, HOT_RESPONSES, HOT_ANTHROPIC };
/* The cold callback's answers: tokens.STAY_COLD, GO_HOT, GO_PASS (served, tested likewise). */
enum { STAY_COLD, GO_HOT, GO_PASS };
/* Where the iterator is. */
enum { COLD, HOT, PASS, DONE };

static PyObject *str_choices, *str_finish_reason, *str_delta, *str_content, *str_type,
    *str_text, *str_text_delta;

typedef struct {
    PyObject_HEAD
    PyObject *inner;     /* the SDK's own event iterator */
    PyObject *times;     /* the call's token stamps (a list) */
    PyObject *cold;      /* cold(event, now, first) -> STAY_COLD | GO_HOT | GO_PASS */
    PyObject *other;     /* other(event, now) -> bool (False: an internal failure) */
    PyObject *learn;     /* learn(event) -> the text event's class, or None */
    PyObject *finish;    /* finish(last) */
    PyObject *fail;      /* fail(exception) */
    PyObject *abandon;   /* abandon() */
    PyObject *last;      /* the last event returned, or NULL */
    PyObject *event_cls; /* the text event's class (Responses, Anthropic), or NULL */
    PyObject *weakrefs;
    int hot;
    int state;
    int started;
    int running;
} Stamper;

static inline long long
stamp(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The value of `key` in `obj`'s instance dict (a borrowed reference), or NULL, with no error
 * set, when it has no dict or no such key. */
static PyObject *
field(PyObject *obj, PyObject *key)
{
#if PY_VERSION_HEX < 0x030D0000
    /* the object's own dict slot, no reference taken (exported by CPython 3.10-3.12) */
    PyObject **dictptr = _PyObject_GetDictPtr(obj);
    PyObject *dict = dictptr != NULL ? *dictptr : NULL;
#else
    PyObject *dict = NULL;
#endif
    PyObject *value;
    if (dict == NULL) {
        /* a managed dict not built yet, or none at all: the generic path builds it */
        dict = PyObject_GenericGetDict(obj, NULL);
        if (dict == NULL) {
            PyErr_Clear();
            return NULL;
        }
        value = PyDict_GetItemWithError(dict, key);
        Py_DECREF(dict); /* the object keeps its dict */
    }
    else {
        value = PyDict_GetItemWithError(dict, key);
    }
    if (value == NULL)
        PyErr_Clear();
    return value;
}

/* 1 if `obj` is true, else 0 (an error counts as false). */
static inline int
truthy(PyObject *obj)
{
    int r;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (PyUnicode_CheckExact(obj))
        return PyUnicode_GET_LENGTH(obj) > 0;
    r = PyObject_IsTrue(obj);
    if (r < 0) {
        PyErr_Clear();
        return 0;
    }
    return r;
}

/* A chat chunk's plain text delta: its first choice has no finish reason and a non-empty
 * `delta.content`. */
static int
chat_text(PyObject *chunk)
{
    PyObject *choices = field(chunk, str_choices), *first, *delta;
    if (choices == NULL || !PyList_CheckExact(choices) || PyList_GET_SIZE(choices) == 0)
        return 0;
    first = PyList_GET_ITEM(choices, 0);
    if (field(first, str_finish_reason) != Py_None)
        return 0;
    delta = field(first, str_delta);
    return delta != NULL && truthy(field(delta, str_content));
}

/* An Anthropic `content_block_delta` event (its class learnt) with a non-empty text delta. */
static int
anthropic_text(PyObject *event)
{
    PyObject *delta = field(event, str_delta), *type;
    int equal;
    if (delta == NULL)
        return 0;
    type = field(delta, str_type);
    if (type == NULL || !PyUnicode_Check(type))
        return 0;
    equal = type == str_text_delta || PyUnicode_Compare(type, str_text_delta) == 0;
    if (PyErr_Occurred())
        PyErr_Clear();
    return equal && truthy(field(delta, str_text));
}

/* Call `fn(args...)`; the result, or NULL. An Exception is cleared (the callbacks catch their
 * own: one that escapes sends the rest of the stream through); a KeyboardInterrupt or
 * SystemExit raised inside the callback stays set, for `Stamper_next` to end the call with and
 * raise, as the Python loop lets it through. */
static PyObject *
call(PyObject *fn, PyObject *const *args, size_t n)
{
    PyObject *r = PyObject_Vectorcall(fn, args, n, NULL);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear();
    return r;
}

/* `call`, every error cleared: the call's end, which has nowhere to raise to. */
static void
call_quietly(PyObject *fn, PyObject *const *args, size_t n)
{
    PyObject *r = PyObject_Vectorcall(fn, args, n, NULL);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
}

/* Hand an event the hot loop does not recognise to `other`; PASS after a failure. */
static void
to_other(Stamper *s, PyObject *event, PyObject *now)
{
    PyObject *args[2] = {event, now};
    PyObject *r = call(s->other, args, 2);
    if (r == NULL || r == Py_False)
        s->state = PASS;
    Py_XDECREF(r);
}

static void
learn_from(Stamper *s, PyObject *event)
{
    PyObject *r;
    if (s->learn == Py_None)
        return;
    r = call(s->learn, &event, 1);
    if (r != NULL && r != Py_None) {
        Py_XSETREF(s->event_cls, r);
        return;
    }
    Py_XDECREF(r);
}

static void
hot_event(Stamper *s, PyObject *event, long long ns)
{
    PyObject *now;
    int text;
    switch (s->hot) {
    case HOT_CHAT:
        text = chat_text(event);
        break;
    case HOT_RESPONSES:
        text = s->event_cls != NULL && (PyObject *)Py_TYPE(event) == s->event_cls &&
               truthy(field(event, str_delta));
        break;
    case HOT_ANTHROPIC:
        text = s->event_cls != NULL && (PyObject *)Py_TYPE(event) == s->event_cls &&
               anthropic_text(event);
        break;
    default:
        text = 0;
    }
    now = PyLong_FromLongLong(ns);
    if (now == NULL) {
        PyErr_Clear();
        s->state = PASS;
        return;
    }
    if (text) {
        if (PyList_Append(s->times, now) < 0) {
            PyErr_Clear();
            s->state = PASS;
        }
    }
    else {
        if (s->event_cls == NULL && s->hot != HOT_CHAT)
            learn_from(s, event);
        if (!PyErr_Occurred())
            to_other(s, event, now);
    }
    Py_DECREF(now);
}

static void
cold_event(Stamper *s, PyObject *event, long long ns)
{
    PyObject *args[3], *r;
    long answer;
    args[0] = event;
    args[1] = PyLong_FromLongLong(ns);
    if (args[1] == NULL) {
        PyErr_Clear();
        s->state = PASS;
        return;
    }
    args[2] = s->last == NULL ? Py_True : Py_False;
    r = call(s->cold, args, 3);
    Py_DECREF(args[1]);
    answer = r != NULL ? PyLong_AsLong(r) : GO_PASS;
    Py_XDECREF(r);
    if (answer == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        answer = GO_PASS;
    }
    if (answer == GO_HOT) {
        s->state = HOT;
        if (s->hot != HOT_CHAT)
            learn_from(s, event);
    }
    else if (answer != STAY_COLD) {
        s->state = PASS;
    }
}

/* The SDK's iterator ended (exhausted, or raising): end the call once, keeping the error. */
static void
ended(Stamper *s)
{
    PyObject *type, *value, *tb;
    s->state = DONE;
    if (PyErr_Occurred()) {
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        call_quietly(s->fail, &value, value != NULL ? 1 : 0);
        PyErr_Restore(type, value, tb);
        return;
    }
    {
        PyObject *last = s->last != NULL ? s->last : Py_None;
        call_quietly(s->finish, &last, 1);
    }
}

static PyObject *
Stamper_next(Stamper *s)
{
    PyObject *event;
    long long ns;
    if (s->state == DONE || s->running)
        return NULL;
    s->started = 1;
    s->running = 1;
    event = PyIter_Next(s->inner);
    if (event == NULL) {
        ended(s);
        s->running = 0;
        return NULL;
    }
    ns = stamp();
    if (s->state == HOT)
        hot_event(s, event, ns);
    else if (s->state == COLD)
        cold_event(s, event, ns);
    if (PyErr_Occurred()) {
        /* a KeyboardInterrupt or SystemExit inside a callback: the call ends with it and the
         * caller gets it (the event is not returned), as from the Python loop */
        Py_DECREF(event);
        ended(s);
        s->running = 0;
        return NULL;
    }
    Py_INCREF(event);
    Py_XSETREF(s->last, event);
    s->running = 0;
    return event;
}

static void
Stamper_finalize(Stamper *s)
{
    PyObject *type, *value, *tb;
    if (!s->started || s->state == DONE)
        return;
    s->state = DONE;
    PyErr_Fetch(&type, &value, &tb);
    call_quietly(s->abandon, NULL, 0);
    PyErr_Restore(type, value, tb);
}

static int
Stamper_traverse(Stamper *s, visitproc visit, void *arg)
{
    Py_VISIT(s->inner);
    Py_VISIT(s->times);
    Py_VISIT(s->cold);
    Py_VISIT(s->other);
    Py_VISIT(s->learn);
    Py_VISIT(s->finish);
    Py_VISIT(s->fail);
    Py_VISIT(s->abandon);
    Py_VISIT(s->last);
    Py_VISIT(s->event_cls);
    return 0;
}

static int
Stamper_clear(Stamper *s)
{
    Py_CLEAR(s->inner);
    Py_CLEAR(s->times);
    Py_CLEAR(s->cold);
    Py_CLEAR(s->other);
    Py_CLEAR(s->learn);
    Py_CLEAR(s->finish);
    Py_CLEAR(s->fail);
    Py_CLEAR(s->abandon);
    Py_CLEAR(s->last);
    Py_CLEAR(s->event_cls);
    return 0;
}

static void
Stamper_dealloc(Stamper *s)
{
    PyObject_GC_UnTrack(s);
    if (PyObject_CallFinalizerFromDealloc((PyObject *)s) < 0)
        return; /* resurrected by the callback */
    if (s->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)s);
    Stamper_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *
Stamper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *inner, *times, *cold, *other, *learn, *finish, *fail, *abandon;
    int hot;
    Stamper *s;
    if (!PyArg_ParseTuple(args, "OO!OOOOOOi:Stamper", &inner, &PyList_Type, &times, &cold,
                          &other, &learn, &finish, &fail, &abandon, &hot))
        return NULL;
    if (!PyIter_Check(inner)) {
        PyErr_SetString(PyExc_TypeError, "Stamper: inner must be an iterator");
        return NULL;
    }
    s = (Stamper *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    s->inner = Py_NewRef(inner);
    s->times = Py_NewRef(times);
    s->cold = Py_NewRef(cold);
    s->other = Py_NewRef(other);
    s->learn = Py_NewRef(learn);
    s->finish = Py_NewRef(finish);
    s->fail = Py_NewRef(fail);
    s->abandon = Py_NewRef(abandon);
    s->hot = hot;
    s->state = COLD;
    return (PyObject *)s;
}

static PyObject *
Stamper_get_running(Stamper *s, void *closure)
{
    return PyBool_FromLong(s->running);
}

static PyGetSetDef Stamper_getset[] = {
    {"gi_running", (getter)Stamper_get_running, NULL,
     "True while an event is being taken (what `SdkCall._closed` asks a generator)", NULL},
    {NULL}};

static PyTypeObject StamperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exporter._internal.shim._hotloop.Stamper",
    .tp_doc = "Stamper(inner, times, cold, other, learn, finish, fail, abandon, hot): the "
              "SDK's events, unchanged, with their token stamps taken (tokens.py).",
    .tp_basicsize = sizeof(Stamper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Stamper_new,
    .tp_dealloc = (destructor)Stamper_dealloc,
    .tp_finalize = (destructor)Stamper_finalize,
    .tp_traverse = (traverseproc)Stamper_traverse,
    .tp_clear = (inquiry)Stamper_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Stamper_next,
    .tp_weaklistoffset = offsetof(Stamper, weakrefs),
    .tp_getset = Stamper_getset,
};

static struct PyModuleDef hotloop_module = {
    PyModuleDef_HEAD_INIT, "_hotloop",
    "The per-chunk loop of a streamed SDK call in C (tokens.py falls back to Python).", -1,
    NULL};

PyMODINIT_FUNC
PyInit__hotloop(void)
{
    PyObject *m;
    if (PyType_Ready(&StamperType) < 0)
        return NULL;
#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(str_choices, "choices");
    INTERN(str_finish_reason, "finish_reason");
    INTERN(str_delta, "delta");
    INTERN(str_content, "content");
    INTERN(str_type, "type");
    INTERN(str_text, "text");
    INTERN(str_text_delta, "text_delta");
#undef INTERN
    m = PyModule_Create(&hotloop_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&StamperType);
    if (PyModule_AddObject(m, "Stamper", (PyObject *)&StamperType) < 0) {
        Py_DECREF(&StamperType);
        Py_DECREF(m);
        return NULL;
    }
    /* The codes shared with Python (sdk_call.HOT_*, tokens.STAY_COLD ...), served so that
       tests/test_stream_hot_loop.py holds them equal to the Python ones. */
    if (PyModule_AddIntConstant(m, "HOT_GENERIC", HOT_GENERIC) < 0
            || PyModule_AddIntConstant(m, "HOT_CHAT", HOT_CHAT) < 0
            || PyModule_AddIntConstant(m, "HOT_RESPONSES", HOT_RESPONSES) < 0
            || PyModule_AddIntConstant(m, "HOT_ANTHROPIC", HOT_ANTHROPIC) < 0
            || PyModule_AddIntConstant(m, "STAY_COLD", STAY_COLD) < 0
            || PyModule_AddIntConstant(m, "GO_HOT", GO_HOT) < 0
            || PyModule_AddIntConstant(m, "GO_PASS", GO_PASS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
