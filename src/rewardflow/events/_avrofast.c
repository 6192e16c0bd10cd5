/* rewardflow.events._avrofast: the stream worker's Avro decoder in C (optional; see avro_fast.py).
 *
 * The consumer works without it (fastavro decodes every record). One type:
 *
 * Decoder(program).decode(data, offset, max_items) -> object | None
 *     ``program`` is the nested tuple avro_fast.program builds from a
 *     fastavro-parsed schema; it is compiled once into a C tree here.
 *     ``decode`` reads the Avro binary of one value of that schema from
 *     ``data[offset:]`` (any object with the buffer protocol, normally bytes)
 *     and returns the same Python objects as
 *     ``fastavro.schemaless_reader(..., return_record_name=True)`` (records as
 *     dicts in field order, ints and longs as int, named branches of a union
 *     as ``(fullname, value)``).
 *
 * Contract of ``decode``: it returns a value only for well-formed input that
 * it consumed up to exactly the end of ``data``. For anything else -
 * truncation, a varint longer than 10 bytes or beyond 64 bits, a boolean byte
 * other than 0/1, a union or enum index out of range, invalid (strict) UTF-8,
 * a negative length or block count, a block count above the bytes left or
 * above the ``max_items`` budget (array and map items of the whole call),
 * trailing bytes - it returns None and sets no exception: the caller then
 * runs fastavro, so every error stays fastavro's. Only MemoryError
 * propagates. Every read is bounds-checked; the recursion depth is the
 * program's (at most MAX_DEPTH). No Python code runs during a decode (no
 * callbacks; the input buffer is held exported, so a bytearray cannot be
 * resized under it). A Decoder is immutable after __init__, so one instance
 * can be used from several threads (each call holds the GIL throughout).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* Op codes of the program (avro_fast.py). */
enum {
    OP_NULL = 0,
    OP_BOOLEAN = 1,
    OP_LONG = 2,   /* Avro int and long: zigzag varint, decoded as 64-bit (as fastavro does) */
    OP_FLOAT = 3,
    OP_DOUBLE = 4,
    OP_STRING = 5,
    OP_BYTES = 6,
    OP_ENUM = 7,   /* names: the symbols */
    OP_RECORD = 8, /* names: the field names; sub: the fields' nodes */
    OP_UNION = 9,  /* names: per branch the tag (str: the value is (tag, value)) or NULL; sub: the branches */
    OP_ARRAY = 10, /* sub[0]: the items */
    OP_MAP = 11,   /* sub[0]: the values */
    OP_LAST = 11
};

#define MAX_DEPTH 32      /* deeper programs are refused (avro_fast.MAX_DEPTH) */
#define MAX_WIDTH 100000  /* the most fields, symbols or branches of one node */

typedef struct Node {
    int code;
    Py_ssize_t n;       /* OP_RECORD: fields; OP_ENUM: symbols; OP_UNION: branches; OP_ARRAY/OP_MAP: 1 */
    PyObject **names;   /* n strong references (OP_UNION: NULL for an untagged branch), or NULL */
    struct Node *sub;   /* n child nodes (OP_RECORD, OP_UNION, OP_ARRAY, OP_MAP), or NULL */
} Node;

static void node_clear(Node *nd) {
    if (nd->names != NULL) {
        for (Py_ssize_t i = 0; i < nd->n; i++) {
            Py_XDECREF(nd->names[i]);
        }
        PyMem_Free(nd->names);
        nd->names = NULL;
    }
    if (nd->sub != NULL) {
        Py_ssize_t m = (nd->code == OP_ARRAY || nd->code == OP_MAP) ? 1 : nd->n;
        for (Py_ssize_t i = 0; i < m; i++) {
            node_clear(&nd->sub[i]);
        }
        PyMem_Free(nd->sub);
        nd->sub = NULL;
    }
    nd->n = 0;
}

/* ------------------------------------------------------------ compiling */

/* names[i] = items[i] (str, or None when allow_none: stored as NULL); 0 or -1 (exception set). */
static int compile_names(Node *nd, PyObject *items, int allow_none) {
    if (!PyTuple_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "program: names must be a tuple");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (n < 1 || n > MAX_WIDTH) {
        PyErr_SetString(PyExc_ValueError, "program: a node needs 1 to 100000 names");
        return -1;
    }
    nd->names = PyMem_Calloc((size_t)n, sizeof(PyObject *));
    if (nd->names == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    nd->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyTuple_GET_ITEM(items, i);
        if (s == Py_None && allow_none) {
            continue;
        }
        if (!PyUnicode_CheckExact(s)) {
            PyErr_SetString(PyExc_TypeError, "program: names must be str");
            return -1;
        }
        Py_INCREF(s);
        PyUnicode_InternInPlace(&s); /* (the same hash, and dict lookups by identity) */
        nd->names[i] = s;
    }
    return 0;
}

static int compile_node(Node *nd, PyObject *op, int depth);

/* nd->sub = the m nodes of the tuple subs (m == nd->n unless given); 0 or -1. */
static int compile_subs(Node *nd, PyObject *subs, Py_ssize_t m, int depth) {
    if (!PyTuple_Check(subs) || PyTuple_GET_SIZE(subs) != m) {
        PyErr_SetString(PyExc_ValueError, "program: wrong number of child ops");
        return -1;
    }
    nd->sub = PyMem_Calloc((size_t)m, sizeof(Node));
    if (nd->sub == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        if (compile_node(&nd->sub[i], PyTuple_GET_ITEM(subs, i), depth + 1) < 0) {
            return -1;
        }
    }
    return 0;
}

/* op = (code, names, subs). 0, or -1 with an exception (the caller clears nd). */
static int compile_node(Node *nd, PyObject *op, int depth) {
    nd->code = -1;
    if (depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "program: nested deeper than 32");
        return -1;
    }
    if (!PyTuple_Check(op) || PyTuple_GET_SIZE(op) != 3) {
        PyErr_SetString(PyExc_TypeError, "program: an op is a tuple (code, names, subs)");
        return -1;
    }
    long code = PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
    if (code == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (code < 0 || code > OP_LAST) {
        PyErr_Format(PyExc_ValueError, "program: unknown op code %ld", code);
        return -1;
    }
    nd->code = (int)code;
    PyObject *names = PyTuple_GET_ITEM(op, 1), *subs = PyTuple_GET_ITEM(op, 2);
    switch (nd->code) {
    case OP_ENUM:
        return compile_names(nd, names, 0);
    case OP_RECORD:
        if (compile_names(nd, names, 0) < 0) {
            return -1;
        }
        return compile_subs(nd, subs, nd->n, depth);
    case OP_UNION:
        if (compile_names(nd, names, 1) < 0) {
            return -1;
        }
        return compile_subs(nd, subs, nd->n, depth);
    case OP_ARRAY:
    case OP_MAP:
        nd->n = 1;
        return compile_subs(nd, subs, 1, depth);
    default:
        return 0;
    }
}

/* -------------------------------------------------------------- reading */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    Py_ssize_t budget; /* array and map items left for this call */
} Reader;

/* A zigzag varint of at most 10 bytes that fits 64 bits. 0, or -1: malformed. */
static inline int read_long(Reader *r, int64_t *out) {
    const unsigned char *p = r->p;
    if (p < r->end && !(*p & 0x80)) { /* one byte: the common case */
        uint64_t n = *p;
        r->p = p + 1;
        *out = (int64_t)((n >> 1) ^ (0 - (n & 1)));
        return 0;
    }
    uint64_t n = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= r->end) {
            return -1;
        }
        unsigned int b = *p++;
        if (i == 9 && b > 1) { /* bits beyond 64 (or an 11th byte) */
            return -1;
        }
        n |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            r->p = p;
            *out = (int64_t)((n >> 1) ^ (0 - (n & 1)));
            return 0;
        }
    }
    return -1;
}

/* A length (string, bytes): >= 0 and within the bytes left. 0, or -1: malformed. */
static inline int read_length(Reader *r, Py_ssize_t *out) {
    int64_t n;
    if (read_long(r, &n) < 0 || n < 0 || n > (int64_t)(r->end - r->p)) {
        return -1;
    }
    *out = (Py_ssize_t)n;
    return 0;
}

/* A block count of an array or map: 0 ends it; else positive, within the bytes left and the item budget. */
static inline int read_block(Reader *r, Py_ssize_t *out) {
    int64_t n;
    if (read_long(r, &n) < 0 || n < 0 || n > (int64_t)(r->end - r->p) || n > (int64_t)r->budget) {
        return -1;
    }
    r->budget -= (Py_ssize_t)n;
    *out = (Py_ssize_t)n;
    return 0;
}

/* NULL without an exception: malformed input. NULL with one: MemoryError (or a decode error, cleared here). */
static PyObject *read_string(Reader *r) {
    Py_ssize_t n;
    if (read_length(r, &n) < 0) {
        return NULL;
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->p, n, NULL); /* strict, like bytes.decode() */
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_MemoryError)) {
            PyErr_Clear(); /* UnicodeDecodeError: fastavro raises it; the caller falls back */
        }
        return NULL;
    }
    r->p += n;
    return s;
}

/* The value of node nd: a new reference; NULL without an exception = malformed, with one = propagate. */
static PyObject *read_node(const Node *nd, Reader *r) {
    int64_t v;
    switch (nd->code) {
    case OP_NULL:
        Py_RETURN_NONE;
    case OP_BOOLEAN:
        if (r->p >= r->end || *r->p > 1) {
            return NULL;
        }
        if (*r->p++) {
            Py_RETURN_TRUE;
        }
        Py_RETURN_FALSE;
    case OP_LONG:
        if (read_long(r, &v) < 0) {
            return NULL;
        }
        return PyLong_FromLongLong((long long)v);
    case OP_FLOAT: {
        if (r->end - r->p < 4) {
            return NULL;
        }
        uint32_t u = (uint32_t)r->p[0] | ((uint32_t)r->p[1] << 8) | ((uint32_t)r->p[2] << 16) | ((uint32_t)r->p[3] << 24);
        float f;
        memcpy(&f, &u, sizeof(f));
        r->p += 4;
        return PyFloat_FromDouble((double)f);
    }
    case OP_DOUBLE: {
        if (r->end - r->p < 8) {
            return NULL;
        }
        uint64_t u = 0;
        for (int i = 7; i >= 0; i--) {
            u = (u << 8) | r->p[i];
        }
        double d;
        memcpy(&d, &u, sizeof(d));
        r->p += 8;
        return PyFloat_FromDouble(d);
    }
    case OP_STRING:
        return read_string(r);
    case OP_BYTES: {
        Py_ssize_t n;
        if (read_length(r, &n) < 0) {
            return NULL;
        }
        PyObject *b = PyBytes_FromStringAndSize((const char *)r->p, n);
        if (b != NULL) {
            r->p += n;
        }
        return b;
    }
    case OP_ENUM:
        if (read_long(r, &v) < 0 || v < 0 || v >= (int64_t)nd->n) {
            return NULL;
        }
        Py_INCREF(nd->names[v]);
        return nd->names[v];
    case OP_RECORD: {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
        PyObject *d = _PyDict_NewPresized(nd->n);
#else
        PyObject *d = PyDict_New();
#endif
        if (d == NULL) {
            return NULL;
        }
        for (Py_ssize_t i = 0; i < nd->n; i++) {
            PyObject *x = read_node(&nd->sub[i], r);
            if (x == NULL) {
                Py_DECREF(d);
                return NULL;
            }
            int rc = PyDict_SetItem(d, nd->names[i], x);
            Py_DECREF(x);
            if (rc < 0) {
                Py_DECREF(d);
                return NULL;
            }
        }
        return d;
    }
    case OP_UNION: {
        if (read_long(r, &v) < 0 || v < 0 || v >= (int64_t)nd->n) {
            return NULL;
        }
        PyObject *x = read_node(&nd->sub[v], r);
        PyObject *tag = nd->names[v];
        if (x == NULL || tag == NULL) {
            return x;
        }
        PyObject *t = PyTuple_New(2);
        if (t == NULL) {
            Py_DECREF(x);
            return NULL;
        }
        Py_INCREF(tag);
        PyTuple_SET_ITEM(t, 0, tag);
        PyTuple_SET_ITEM(t, 1, x);
        return t;
    }
    case OP_ARRAY: {
        PyObject *list = PyList_New(0);
        if (list == NULL) {
            return NULL;
        }
        Py_ssize_t count;
        for (;;) {
            if (read_block(r, &count) < 0) {
                Py_DECREF(list);
                return NULL;
            }
            if (count == 0) {
                return list;
            }
            for (Py_ssize_t i = 0; i < count; i++) {
                PyObject *x = read_node(&nd->sub[0], r);
                if (x == NULL) {
                    Py_DECREF(list);
                    return NULL;
                }
                int rc = PyList_Append(list, x);
                Py_DECREF(x);
                if (rc < 0) {
                    Py_DECREF(list);
                    return NULL;
                }
            }
        }
    }
    case OP_MAP: {
        PyObject *d = PyDict_New();
        if (d == NULL) {
            return NULL;
        }
        Py_ssize_t count;
        for (;;) {
            if (read_block(r, &count) < 0) {
                Py_DECREF(d);
                return NULL;
            }
            if (count == 0) {
                return d;
            }
            for (Py_ssize_t i = 0; i < count; i++) {
                PyObject *k = read_string(r);
                if (k == NULL) {
                    Py_DECREF(d);
                    return NULL;
                }
                PyObject *x = read_node(&nd->sub[0], r);
                if (x == NULL) {
                    Py_DECREF(k);
                    Py_DECREF(d);
                    return NULL;
                }
                int rc = PyDict_SetItem(d, k, x); /* (a repeated key: the last value, in the first key's place, as fastavro) */
                Py_DECREF(k);
                Py_DECREF(x);
                if (rc < 0) {
                    Py_DECREF(d);
                    return NULL;
                }
            }
        }
    }
    default:
        return NULL; /* (not reached: compile_node checks the codes) */
    }
}

/* -------------------------------------------------------------- Decoder */

typedef struct {
    PyObject_HEAD
    Node root;
    int ready;
    PyObject *program;
} Decoder;

static int Decoder_init(Decoder *self, PyObject *args, PyObject *kwds) {
    PyObject *program;
    static char *kwlist[] = {"program", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Decoder", kwlist, &program)) {
        return -1;
    }
    if (self->ready || self->program != NULL) {
        PyErr_SetString(PyExc_TypeError, "Decoder is already initialised");
        return -1;
    }
    if (compile_node(&self->root, program, 1) < 0) {
        node_clear(&self->root);
        return -1;
    }
    Py_INCREF(program);
    self->program = program;
    self->ready = 1;
    return 0;
}

static void Decoder_dealloc(Decoder *self) {
    node_clear(&self->root);
    Py_CLEAR(self->program);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Decoder_decode(Decoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode(data, offset, max_items) takes 3 arguments");
        return NULL;
    }
    if (!self->ready) {
        PyErr_SetString(PyExc_ValueError, "Decoder is not initialised");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t max_items = PyLong_AsSsize_t(args[2]);
    if (max_items == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (offset < 0 || offset > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "decode: offset outside the data");
        return NULL;
    }
    Reader r;
    r.p = (const unsigned char *)view.buf + offset;
    r.end = (const unsigned char *)view.buf + view.len;
    r.budget = max_items < 0 ? 0 : max_items;
    PyObject *obj = read_node(&self->root, &r);
    int exact = obj != NULL && r.p == r.end;
    PyBuffer_Release(&view);
    if (obj == NULL) {
        if (PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_MemoryError)) {
                return NULL;
            }
            PyErr_Clear(); /* (defensive: read_node sets no other exception) */
        }
        Py_RETURN_NONE;
    }
    if (!exact) { /* trailing bytes */
        Py_DECREF(obj);
        Py_RETURN_NONE;
    }
    return obj;
}

static PyMethodDef Decoder_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))Decoder_decode, METH_FASTCALL,
     "decode(data, offset, max_items) -> object | None: the value read from data[offset:], or None unless "
     "data[offset:] is exactly one well-formed value (at most max_items array and map items in all)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Decoder_members[] = {
    {"program", T_OBJECT, offsetof(Decoder, program), READONLY, "the program it was compiled from"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rewardflow.events._avrofast.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decoder(program): compiled Avro decoder of one schema (see avro_fast.program).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_methods = Decoder_methods,
    .tp_members = Decoder_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rewardflow.events._avrofast",
    .m_doc = "Compiled Avro decoder (optional; fastavro is the fallback, see rewardflow.events.avro_fast).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__avrofast(void) {
    if (PyType_Ready(&DecoderType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0 || PyModule_AddIntConstant(m, "VERSION", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
