/* rewardflow.client._speedups: the producer's hot path in C (optional; see speedups.py).
 *
 * The SDK works without it (pure-Python writers and emit path). Types:
 *
 * AvroWriter(program, fallback).encode(fields) -> bytes
 *     ``program`` is the op tree speedups.avro_program builds from an Avro
 *     record schema; ``fields`` an event model's ``__dict__``. One pass over
 *     the dict in its own order (key positions learned once), values written
 *     into a buffer, no Python object per field.
 * JsonWriter(nested_types, fallback).encode(fields) -> bytes
 *     The bytes of ``orjson.dumps(fields, default=<model -> __dict__>)``.
 * EmitCore(by_type, writers, open, lock, separator, limit)
 *     The common case of EventProducer.emit in one call (see below).
 * Lock(), Batch(...)
 *     threading.Lock's interface with a flag the core reads; SessionBatch in C.
 * add_models(types)
 *     Model types whose instances are read through their instance dict.
 *
 * Contract of the writers: a value the fast path does not handle *exactly*
 * like the pure writer (a type that is not exactly str/int/float/bool/None or
 * a registered model, an int beyond 64 bits, a missing key, an unknown enum
 * symbol, text that is not UTF-8 encodable, a float whose text would need an
 * exponent, ...) makes ``encode`` return ``fallback(fields)`` instead: the
 * result, or the exception, is then exactly the pure writer's. The fast
 * path runs no Python code (no attribute lookup, no __eq__/__hash__ of a
 * non-str), so the dict it reads cannot change under it. It never writes
 * bytes that differ from the pure writer's (tests/client/test_speedups.py).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- buffer */

typedef struct {
    char *p;
    Py_ssize_t len;
    Py_ssize_t cap;
    char stack[2048];
} Buf;

static void buf_init(Buf *b) {
    b->p = b->stack;
    b->len = 0;
    b->cap = (Py_ssize_t)sizeof(b->stack);
}

static void buf_free(Buf *b) {
    if (b->p != b->stack) {
        PyMem_Free(b->p);
    }
}

/* 0 on success, -1 (MemoryError set) */
static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (extra < 0 || extra > PY_SSIZE_T_MAX - b->len) { /* (audit fix: b->len + extra must not overflow) */
        PyErr_NoMemory();
        return -1;
    }
    if (b->len + extra <= b->cap) {
        return 0;
    }
    Py_ssize_t cap = b->cap;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *p;
    if (b->p == b->stack) {
        p = PyMem_Malloc((size_t)cap);
        if (p != NULL) {
            memcpy(p, b->stack, (size_t)b->len);
        }
    } else {
        p = PyMem_Realloc(b->p, (size_t)cap);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->p + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

static inline int buf_byte(Buf *b, char c) {
    if (b->len >= b->cap && buf_reserve(b, 1) < 0) {
        return -1;
    }
    b->p[b->len++] = c;
    return 0;
}

/* The UTF-8 of an exact str: ASCII strings without a copy; others into *tmp (a new bytes object). */
static const char *utf8_of(PyObject *s, Py_ssize_t *n, PyObject **tmp) {
    *tmp = NULL;
    if (PyUnicode_IS_ASCII(s)) {
        *n = PyUnicode_GET_LENGTH(s);
        return (const char *)PyUnicode_DATA(s);
    }
    *tmp = PyUnicode_AsUTF8String(s); /* raises UnicodeEncodeError for lone surrogates */
    if (*tmp == NULL) {
        return NULL;
    }
    *n = PyBytes_GET_SIZE(*tmp);
    return PyBytes_AS_STRING(*tmp);
}

static PyObject *str_dict; /* interned "__dict__" */
static PyObject *str_event_type, *str_session_id; /* interned field names the emit core reads */
static PyObject *plain_models; /* tuple of types whose instances' ``__dict__`` is their plain instance dict */

/* ``value.__dict__`` (new reference) of an instance of a registered model type (add_models), read
 * straight from the instance; NULL without an exception for any other object: the caller falls back
 * to the pure writer. So the compiled writers never run Python code (no property, no __getattr__):
 * the dict being encoded cannot change under them, and the borrowed values they hold stay valid. */
static PyObject *instance_dict(PyObject *value) {
    if (plain_models != NULL) {
        Py_ssize_t n = PyTuple_GET_SIZE(plain_models);
        for (Py_ssize_t i = 0; i < n; i++) {
            if ((PyObject *)Py_TYPE(value) == PyTuple_GET_ITEM(plain_models, i)) {
                /* (audit fix) PyObject_GenericGetDict creates the dict when the instance has none yet
                 * (3.11: an instance whose attributes still live inline, or one made by __new__ alone).
                 * Allocating a dict can start a garbage collection on 3.11, and a collection runs
                 * finalisers and weakref callbacks: Python code that may drop the GIL and change the
                 * dicts whose values the writers hold borrowed (use after free). No collection here. */
                int was_enabled = PyGC_Disable();
                PyObject *d = PyObject_GenericGetDict(value, NULL);
                if (was_enabled) {
                    PyGC_Enable();
                }
                return d;
            }
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ avro */

enum {
    OP_CONST = 0,    /* write data (bytes); reads nothing */
    OP_STRING = 1,
    OP_BYTES = 2,
    OP_LONG = 3,     /* Avro int and long: zigzag varint */
    OP_BOOLEAN = 4,
    OP_DOUBLE = 5,
    OP_FLOAT = 6,
    OP_ENUM = 7,     /* data: dict symbol -> bytes */
    OP_RECORD = 8,   /* sub: the fields, read from the value's __dict__ */
    OP_OPTIONAL = 9, /* sub[0]: the non-null branch; null_index: the null branch's index */
    OP_NULL = 10,    /* writes nothing */
    OP_INT = 11,     /* Avro int: a zigzag varint of a value within 32 bits */
    OP_LAST = 11
};

typedef struct Op {
    int code;
    int null_index;
    PyObject *key;  /* the field name (str), or NULL: the value handed in */
    PyObject *data; /* OP_CONST: bytes; OP_ENUM: dict */
    struct Op *sub;
    Py_ssize_t nsub;
    /* OP_RECORD: the order the record's __dict__ keys were last seen in (learned, see record_values) */
    PyObject **seen_keys; /* strong references */
    int *seen_slot;       /* index into sub, or -1: not a field of the schema */
    Py_ssize_t nseen;     /* capacity of both arrays */
} Op;

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif

#define MAX_FIELDS 128 /* records with more fields are not compiled (speedups.avro_program refuses them) */

/* Results of the encode functions. */
#define ENC_OK 0
#define ENC_FALLBACK 1 /* the pure writer must do it (any exception cleared by the caller) */
#define ENC_ERROR (-1) /* MemoryError: propagate */

static void ops_clear(Op *ops, Py_ssize_t n) {
    if (ops == NULL) {
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_CLEAR(ops[i].key);
        Py_CLEAR(ops[i].data);
        ops_clear(ops[i].sub, ops[i].nsub);
        PyMem_Free(ops[i].sub);
        ops[i].sub = NULL;
        ops[i].nsub = 0; /* (audit fix: a cleared op was left with nsub > 0 and sub == NULL) */
        if (ops[i].seen_keys != NULL) {
            for (Py_ssize_t j = 0; j < ops[i].nseen; j++) {
                Py_CLEAR(ops[i].seen_keys[j]);
            }
        }
        PyMem_Free(ops[i].seen_keys);
        PyMem_Free(ops[i].seen_slot);
        ops[i].seen_keys = NULL;
        ops[i].seen_slot = NULL;
        ops[i].nseen = 0;
    }
}

/* Fill *op from the tuple (code, key, data, subops, null_index); -1 with an exception set. */
static int op_parse(Op *op, PyObject *t, int depth) {
    memset(op, 0, sizeof(*op));
    if (depth > 32) {
        PyErr_SetString(PyExc_ValueError, "program nested too deeply");
        return -1;
    }
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
        PyErr_SetString(PyExc_TypeError, "an op is a 5-tuple (code, key, data, subops, null_index)");
        return -1;
    }
    long code = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
    if (code == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (code < 0 || code > OP_LAST) {
        PyErr_Format(PyExc_ValueError, "unknown op code %ld", code);
        return -1;
    }
    op->code = (int)code;
    long null_index = PyLong_AsLong(PyTuple_GET_ITEM(t, 4));
    if (null_index == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (op->code == OP_OPTIONAL && null_index != 0 && null_index != 1) { /* (audit fix: shifted below) */
        PyErr_SetString(PyExc_ValueError, "an optional op's null_index is 0 or 1");
        return -1;
    }
    op->null_index = (int)null_index;
    PyObject *key = PyTuple_GET_ITEM(t, 1);
    if (key != Py_None) {
        if (!PyUnicode_CheckExact(key)) {
            PyErr_SetString(PyExc_TypeError, "an op's key is a str or None");
            return -1;
        }
        Py_INCREF(key);
        PyUnicode_InternInPlace(&key);
        op->key = key;
    }
    PyObject *data = PyTuple_GET_ITEM(t, 2);
    if (op->code == OP_CONST && !PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "a constant op's data is bytes");
        return -1;
    }
    if (op->code == OP_ENUM && !PyDict_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "an enum op's data is a dict of symbol -> bytes");
        return -1;
    }
    if (op->code == OP_ENUM) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(data, &pos, &k, &v)) {
            /* (audit fix: exact str symbols, so looking a value up never runs a key's __eq__) */
            if (!PyBytes_CheckExact(v) || !PyUnicode_CheckExact(k)) {
                PyErr_SetString(PyExc_TypeError, "an enum op's data is a dict of symbol -> bytes");
                return -1;
            }
        }
    }
    if (data != Py_None) {
        Py_INCREF(data);
        op->data = data;
    }
    PyObject *subs = PyTuple_GET_ITEM(t, 3);
    if (!PyTuple_Check(subs)) {
        PyErr_SetString(PyExc_TypeError, "an op's subops are a tuple");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(subs);
    if ((op->code == OP_OPTIONAL && n != 1) || (op->code != OP_OPTIONAL && op->code != OP_RECORD && n != 0)) {
        PyErr_SetString(PyExc_ValueError, "wrong number of subops");
        return -1;
    }
    if (n) {
        op->sub = PyMem_Calloc((size_t)n, sizeof(Op));
        if (op->sub == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        op->nsub = n;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (op_parse(&op->sub[i], PyTuple_GET_ITEM(subs, i), depth + 1) < 0) {
                return -1;
            }
        }
    }
    if (op->code == OP_RECORD) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (op->sub[i].code != OP_CONST && op->sub[i].key == NULL) {
                PyErr_SetString(PyExc_ValueError, "a record's field ops need a key");
                return -1;
            }
        }
        if (n > MAX_FIELDS) {
            PyErr_Format(PyExc_ValueError, "a record of more than %d fields is not compiled", MAX_FIELDS);
            return -1;
        }
        {
            Py_ssize_t cap = 2 * n + 8;
            op->seen_keys = PyMem_Calloc((size_t)cap, sizeof(PyObject *));
            op->seen_slot = PyMem_Calloc((size_t)cap, sizeof(int));
            if (op->seen_keys == NULL || op->seen_slot == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            op->nseen = cap;
        }
    }
    return 0;
}

static inline int put_varint(Buf *b, unsigned long long z) {
    if (buf_reserve(b, 10) < 0) {
        return ENC_ERROR;
    }
    char *p = b->p + b->len;
    while (z > 0x7F) {
        *p++ = (char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *p++ = (char)z;
    b->len = p - b->p;
    return ENC_OK;
}

static inline unsigned long long zigzag(long long n) {
    return ((unsigned long long)n << 1) ^ (unsigned long long)(n >> 63);
}

static int avro_fields(Buf *b, Op *op, PyObject *fields, PyObject **capture);

/* Encode ``value`` as ``op`` (for fields, the caller has fetched the value). */
static int avro_value(Buf *b, Op *op, PyObject *value) {
    switch (op->code) {
    case OP_STRING: {
        if (!PyUnicode_CheckExact(value)) {
            return ENC_FALLBACK;
        }
        Py_ssize_t n;
        PyObject *tmp;
        const char *s = utf8_of(value, &n, &tmp);
        if (s == NULL) {
            return ENC_FALLBACK;
        }
        int rc = put_varint(b, zigzag((long long)n));
        if (rc == ENC_OK && buf_put(b, s, n) < 0) {
            rc = ENC_ERROR;
        }
        Py_XDECREF(tmp);
        return rc;
    }
    case OP_BYTES: {
        if (!PyBytes_CheckExact(value)) {
            return ENC_FALLBACK;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(value);
        if (put_varint(b, zigzag((long long)n)) != ENC_OK || buf_put(b, PyBytes_AS_STRING(value), n) < 0) {
            return ENC_ERROR;
        }
        return ENC_OK;
    }
    case OP_LONG: {
        if (!PyLong_CheckExact(value)) {
            return ENC_FALLBACK;
        }
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            return ENC_FALLBACK;
        }
        return put_varint(b, zigzag(v));
    }
    case OP_INT: {
        if (!PyLong_CheckExact(value)) {
            return ENC_FALLBACK;
        }
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
            PyErr_Clear();
            return ENC_FALLBACK; /* out of range: the pure writer raises ValueError */
        }
        return put_varint(b, zigzag(v));
    }
    case OP_BOOLEAN:
        if (value == Py_True) {
            return buf_byte(b, 1) < 0 ? ENC_ERROR : ENC_OK;
        }
        if (value == Py_False) {
            return buf_byte(b, 0) < 0 ? ENC_ERROR : ENC_OK;
        }
        return ENC_FALLBACK;
    case OP_DOUBLE: {
        if (!PyFloat_CheckExact(value)) {
            return ENC_FALLBACK;
        }
        if (buf_reserve(b, 8) < 0) {
            return ENC_ERROR;
        }
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(value), b->p + b->len, 1) < 0) {
            return ENC_FALLBACK;
        }
        b->len += 8;
        return ENC_OK;
    }
    case OP_FLOAT: {
        if (!PyFloat_CheckExact(value)) {
            return ENC_FALLBACK;
        }
        if (buf_reserve(b, 4) < 0) {
            return ENC_ERROR;
        }
        if (PyFloat_Pack4(PyFloat_AS_DOUBLE(value), b->p + b->len, 1) < 0) {
            return ENC_FALLBACK; /* OverflowError: the pure writer raises it */
        }
        b->len += 4;
        return ENC_OK;
    }
    case OP_ENUM: {
        if (!PyUnicode_CheckExact(value)) {
            return ENC_FALLBACK;
        }
        PyObject *code = PyDict_GetItemWithError(op->data, value); /* borrowed */
        if (code == NULL) {
            return ENC_FALLBACK;
        }
        return buf_put(b, PyBytes_AS_STRING(code), PyBytes_GET_SIZE(code)) < 0 ? ENC_ERROR : ENC_OK;
    }
    case OP_RECORD: {
        PyObject *d = instance_dict(value);
        if (d == NULL) {
            return ENC_FALLBACK;
        }
        int rc = PyDict_CheckExact(d) ? avro_fields(b, op, d, NULL) : ENC_FALLBACK;
        Py_DECREF(d);
        return rc;
    }
    case OP_OPTIONAL:
        if (value == Py_None) {
            return buf_byte(b, (char)(op->null_index << 1)) < 0 ? ENC_ERROR : ENC_OK;
        }
        if (buf_byte(b, (char)((1 - op->null_index) << 1)) < 0) {
            return ENC_ERROR;
        }
        return avro_value(b, &op->sub[0], value);
    case OP_NULL:
        return ENC_OK;
    case OP_CONST:
        return buf_put(b, PyBytes_AS_STRING(op->data), PyBytes_GET_SIZE(op->data)) < 0 ? ENC_ERROR : ENC_OK;
    default:
        return ENC_FALLBACK;
    }
}

/* The index in op->sub of the field named ``key`` (an exact str), or -1 when the schema has no such field. */
static int field_slot(const Op *op, PyObject *key) {
    for (Py_ssize_t j = 0; j < op->nsub; j++) {
        if (op->sub[j].key == key) {
            return (int)j;
        }
    }
    for (Py_ssize_t j = 0; j < op->nsub; j++) {
        if (op->sub[j].key != NULL && PyUnicode_Compare(op->sub[j].key, key) == 0) {
            return (int)j;
        }
    }
    return -1;
}

/* Fill vals[j] with the value of every keyed field op->sub[j] from the dict ``fields``.
 *
 * One pass over the dict in its own order (no hashing, sequential memory):
 * the dicts of one model type keep their keys in the same order, so the
 * position of each key is learned once and then only checked by identity.
 * Keys that are no field of the schema are skipped, as the pure writer
 * ignores them; a missing field or a key that is not an exact str is a
 * fallback (the pure writer's KeyError, or its own dict semantics). */
static int record_values(Op *op, PyObject *fields, PyObject **vals) {
    /* The dict's entries are read in order below: start loading all their cache lines now
     * (a prefetch past the end of the table is harmless). */
    const char *table = (const char *)((PyDictObject *)fields)->ma_keys;
    for (int line = 0; line < 8; line++) {
        PREFETCH(table + 64 * line);
    }
    Py_ssize_t needed = 0;
    for (Py_ssize_t j = 0; j < op->nsub; j++) {
        vals[j] = NULL;
        needed += op->sub[j].code != OP_CONST;
    }
    Py_ssize_t pos = 0, i = 0, found = 0;
    PyObject *k, *v;
    while (PyDict_Next(fields, &pos, &k, &v)) {
        int slot;
        if (i < op->nseen && op->seen_keys[i] == k) {
            slot = op->seen_slot[i];
        } else {
            if (!PyUnicode_CheckExact(k)) {
                return ENC_FALLBACK;
            }
            slot = field_slot(op, k);
            if (i < op->nseen) {
                Py_INCREF(k);
                Py_XSETREF(op->seen_keys[i], k);
                op->seen_slot[i] = slot;
            }
        }
        if (slot >= 0) { /* (a constant's value is only kept for the caller, see avro_fields) */
            found += vals[slot] == NULL && op->sub[slot].code != OP_CONST;
            vals[slot] = v;
            PREFETCH(v); /* the values are read right after this pass: start loading them all now */
            PREFETCH((const char *)v + 64);
        }
        i++;
    }
    return found == needed ? ENC_OK : ENC_FALLBACK;
}

/* Encode the record ``fields`` (a dict) as ``op``. ``capture`` (top level only, may be NULL):
 * capture[0], capture[1] receive the values (borrowed, NULL if absent) of the fields
 * ``event_type`` and ``session_id``, read in the same pass. */
static int avro_fields(Buf *b, Op *op, PyObject *fields, PyObject **capture) {
    PyObject *vals[MAX_FIELDS];
    int by_order = op->seen_keys != NULL;
    if (by_order) {
        int rc = record_values(op, fields, vals);
        if (rc != ENC_OK) {
            return rc;
        }
    }
    for (Py_ssize_t i = 0; i < op->nsub; i++) {
        Op *field = &op->sub[i];
        int rc;
        if (capture != NULL && field->key != NULL) {
            if (field->key == str_event_type || field->key == str_session_id) {
                PyObject *value = by_order ? vals[i] : PyDict_GetItemWithError(fields, field->key);
                capture[field->key == str_session_id] = value;
                if (value == NULL && PyErr_Occurred()) {
                    return ENC_FALLBACK;
                }
            }
        }
        if (field->code == OP_CONST) {
            rc = buf_put(b, PyBytes_AS_STRING(field->data), PyBytes_GET_SIZE(field->data)) < 0 ? ENC_ERROR : ENC_OK;
        } else {
            PyObject *value = by_order ? vals[i] : PyDict_GetItemWithError(fields, field->key); /* borrowed */
            if (value == NULL) {
                return ENC_FALLBACK;
            }
            rc = avro_value(b, field, value);
        }
        if (rc != ENC_OK) {
            return rc;
        }
    }
    return ENC_OK;
}

typedef struct {
    PyObject_HEAD
    Op root; /* an OP_RECORD op without key */
    PyObject *fallback;
    PyObject *program;
} AvroWriter;

static PyObject *fallback_call(PyObject *fallback, PyObject *fields) {
    PyErr_Clear();
    Py_INCREF(fallback); /* (audit fix: the writer's reference may go while the call runs) */
    PyObject *out = PyObject_CallOneArg(fallback, fields);
    Py_DECREF(fallback);
    return out;
}

/* The piece of ``fields``; capture as in avro_fields (NULL: not wanted). */
static PyObject *avro_encode(AvroWriter *self, PyObject *fields, PyObject **capture) {
    if (self->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "AvroWriter not initialised");
        return NULL;
    }
    if (!PyDict_CheckExact(fields)) {
        return fallback_call(self->fallback, fields);
    }
    Buf b;
    buf_init(&b);
    int rc = avro_fields(&b, &self->root, fields, capture);
    PyObject *out = NULL;
    if (rc == ENC_OK) {
        out = PyBytes_FromStringAndSize(b.p, b.len);
    } else if (rc == ENC_FALLBACK) {
        if (capture != NULL) {
            capture[0] = capture[1] = NULL;
        }
        out = fallback_call(self->fallback, fields);
    }
    buf_free(&b);
    return out;
}

static PyObject *AvroWriter_encode(AvroWriter *self, PyObject *fields) {
    return avro_encode(self, fields, NULL);
}

static int AvroWriter_init(AvroWriter *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"program", "fallback", NULL};
    PyObject *program, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:AvroWriter", kwlist, &program, &fallback)) {
        return -1;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return -1;
    }
    /* (audit fix) Parse into a local op and replace the old one only on success: a failed
     * re-initialisation used to leave root with nsub > 0 and sub == NULL (a segfault on the next encode). */
    Op root;
    if (op_parse(&root, program, 0) < 0) {
        ops_clear(&root, 1);
        return -1;
    }
    if (root.code != OP_RECORD || root.key != NULL) {
        ops_clear(&root, 1);
        PyErr_SetString(PyExc_ValueError, "the program is a record op without key");
        return -1;
    }
    ops_clear(&self->root, 1);
    self->root = root;
    Py_INCREF(fallback);
    Py_XSETREF(self->fallback, fallback);
    Py_INCREF(program);
    Py_XSETREF(self->program, program);
    return 0;
}

static int AvroWriter_traverse(AvroWriter *self, visitproc visit, void *arg) {
    Py_VISIT(self->fallback);
    Py_VISIT(self->program);
    return 0;
}

static int AvroWriter_clear(AvroWriter *self) {
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->program);
    return 0;
}

static void AvroWriter_dealloc(AvroWriter *self) {
    PyObject_GC_UnTrack(self);
    AvroWriter_clear(self);
    ops_clear(&self->root, 1);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef AvroWriter_methods[] = {
    {"encode", (PyCFunction)AvroWriter_encode, METH_O, "encode(fields) -> bytes: the Avro binary of the record whose __dict__ is fields."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef AvroWriter_members[] = {
    {"program", T_OBJECT, offsetof(AvroWriter, program), READONLY, "the op tree"},
    {"fallback", T_OBJECT, offsetof(AvroWriter, fallback), READONLY, "the pure writer"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AvroWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rewardflow.client._speedups.AvroWriter",
    .tp_basicsize = sizeof(AvroWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "AvroWriter(program, fallback): compiled Avro writer of one record schema.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)AvroWriter_init,
    .tp_dealloc = (destructor)AvroWriter_dealloc,
    .tp_traverse = (traverseproc)AvroWriter_traverse,
    .tp_clear = (inquiry)AvroWriter_clear,
    .tp_methods = AvroWriter_methods,
    .tp_members = AvroWriter_members,
};

/* ------------------------------------------------------------------ json */

static const char HEX[] = "0123456789abcdef";

/* An integer in decimal. */
static int put_decimal(Buf *b, int negative, unsigned long long u) {
    char tmp[24];
    char *end = tmp + sizeof(tmp), *p = end;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (negative) {
        *--p = '-';
    }
    return buf_put(b, p, end - p) < 0 ? ENC_ERROR : ENC_OK;
}

/* ``repr(x)`` for a finite x that is an exact multiple of 10**-6 at double precision
 * (scores, rounded ratios): ENC_FALLBACK for any other value.
 *
 * If r = x * 10**6 rounded is below 10**13 and r / 10**6 == x, the decimal
 * r / 10**6 (trailing zeros dropped, at least one fractional digit) reads back
 * as x, and no other decimal with as few digits does: decimals with that many
 * digits lie at least 10**-6 apart while the doubles near x are less than
 * 2**-29 apart. That is the shortest round-trip string, which repr() and
 * orjson both write (repr switches to exponent notation only below 1e-4 or
 * from 1e16 on; 1e-4 <= |x| < 1e7 here, or x == 0). */
static int put_short_float(Buf *b, double x) {
    const double scale = 1e6;
    double ax = fabs(x);
    if (!(ax == 0.0 || (ax >= 1e-4 && ax < 1e7))) {
        return ENC_FALLBACK;
    }
    double r = nearbyint(ax * scale);
    if (r / scale != ax) {
        return ENC_FALLBACK;
    }
    unsigned long long n = (unsigned long long)r;
    unsigned long long whole = n / 1000000ULL, frac = n % 1000000ULL;
    char tmp[40];
    char *p = tmp;
    if (signbit(x)) {
        *p++ = '-';
    }
    char digits[24];
    char *e = digits + sizeof(digits), *d = e;
    do {
        *--d = (char)('0' + whole % 10);
        whole /= 10;
    } while (whole);
    memcpy(p, d, (size_t)(e - d));
    p += e - d;
    *p++ = '.';
    if (frac == 0) {
        *p++ = '0';
    } else {
        char f[6];
        for (int i = 5; i >= 0; i--) {
            f[i] = (char)('0' + frac % 10);
            frac /= 10;
        }
        int len = 6;
        while (f[len - 1] == '0') {
            len--;
        }
        memcpy(p, f, (size_t)len);
        p += len;
    }
    return buf_put(b, tmp, p - tmp) < 0 ? ENC_ERROR : ENC_OK;
}

/* 1 for the bytes orjson escapes: '"', '\\' and the control characters below 0x20. */
static unsigned char NEEDS_ESCAPE[256];


/* 1 if one of the 8 bytes of w is below 0x20, '"' or '\\' (SWAR: no branch per byte). */
static inline int word_needs_escape(uint64_t w) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t quote = w ^ (ones * '"'), slash = w ^ (ones * '\\');
    uint64_t zero_q = (quote - ones) & ~quote & highs;
    uint64_t zero_s = (slash - ones) & ~slash & highs;
    uint64_t below = (w - ones * 0x20) & ~w & highs; /* a byte < 0x20 (bytes >= 0x80 never flag here) */
    return (zero_q | zero_s | below) != 0;
}

/* orjson's escaping: '"', '\\', and the control characters below 0x20; everything else as UTF-8. */
static int json_str(Buf *b, PyObject *s) {
    Py_ssize_t n;
    PyObject *tmp;
    const char *p = utf8_of(s, &n, &tmp);
    if (p == NULL) {
        return ENC_FALLBACK;
    }
    int rc = ENC_ERROR;
    if (buf_reserve(b, n * 6 + 2) < 0) { /* worst case: every byte \u00XX */
        goto done;
    }
    char *o = b->p + b->len;
    *o++ = '"';
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) { /* the clean prefix, 8 bytes at a time */
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (word_needs_escape(w)) {
            break;
        }
        memcpy(o, &w, 8);
        o += 8;
    }
    for (; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!NEEDS_ESCAPE[c]) {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\b': *o++ = 'b'; break;
        case '\t': *o++ = 't'; break;
        case '\n': *o++ = 'n'; break;
        case '\f': *o++ = 'f'; break;
        case '\r': *o++ = 'r'; break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = HEX[c >> 4];
            *o++ = HEX[c & 15];
        }
    }
    *o++ = '"';
    b->len = o - b->p;
    rc = ENC_OK;
done:
    Py_XDECREF(tmp);
    return rc;
}

typedef struct {
    PyObject_HEAD
    PyObject *nested; /* tuple of model types written as their __dict__ */
    PyObject *fallback;
} JsonWriter;

static int json_object(Buf *b, JsonWriter *w, PyObject *d, int depth, PyObject **capture);

static int json_value(Buf *b, JsonWriter *w, PyObject *v, int depth) {
    if (v == Py_None) {
        return buf_put(b, "null", 4) < 0 ? ENC_ERROR : ENC_OK;
    }
    if (v == Py_True) {
        return buf_put(b, "true", 4) < 0 ? ENC_ERROR : ENC_OK;
    }
    if (v == Py_False) {
        return buf_put(b, "false", 5) < 0 ? ENC_ERROR : ENC_OK;
    }
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type) {
        return json_str(b, v);
    }
    if (t == &PyLong_Type) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred()) {
            return ENC_FALLBACK;
        }
        if (overflow == 0) {
            return put_decimal(b, x < 0, x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x);
        }
        if (overflow > 0) { /* orjson writes up to 2**64 - 1 */
            unsigned long long u = PyLong_AsUnsignedLongLong(v);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                return ENC_FALLBACK;
            }
            return put_decimal(b, 0, u);
        }
        return ENC_FALLBACK;
    }
    if (t == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(v);
        if (!isfinite(x)) {
            return ENC_FALLBACK; /* orjson writes null */
        }
        int rc = put_short_float(b, x);
        if (rc != ENC_FALLBACK) {
            return rc;
        }
        char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (text == NULL) {
            return ENC_ERROR;
        }
        rc = ENC_OK;
        if (strchr(text, 'e') != NULL) {
            rc = ENC_FALLBACK; /* orjson's exponent notation differs from repr's */
        } else if (buf_put(b, text, (Py_ssize_t)strlen(text)) < 0) {
            rc = ENC_ERROR;
        }
        PyMem_Free(text);
        return rc;
    }
    if (t == &PyDict_Type) {
        return json_object(b, w, v, depth + 1, NULL);
    }
    Py_ssize_t n = PyTuple_GET_SIZE(w->nested);
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((PyObject *)t == PyTuple_GET_ITEM(w->nested, i)) {
            PyObject *d = instance_dict(v);
            if (d == NULL) {
                return ENC_FALLBACK;
            }
            int rc = PyDict_CheckExact(d) ? json_object(b, w, d, depth + 1, NULL) : ENC_FALLBACK;
            Py_DECREF(d);
            return rc;
        }
    }
    return ENC_FALLBACK;
}

static int json_object(Buf *b, JsonWriter *w, PyObject *d, int depth, PyObject **capture) {
    if (depth > 16) {
        return ENC_FALLBACK;
    }
    if (buf_byte(b, '{') < 0) {
        return ENC_ERROR;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    int first = 1;
    /* Start loading the entries and the values before writing them (see record_values). */
    const char *table = (const char *)((PyDictObject *)d)->ma_keys;
    for (int line = 0; line < 8; line++) {
        PREFETCH(table + 64 * line);
    }
    while (PyDict_Next(d, &pos, &k, &v)) {
        PREFETCH(v);
        PREFETCH((const char *)v + 64);
    }
    pos = 0;
    while (PyDict_Next(d, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k)) {
            return ENC_FALLBACK;
        }
        if (capture != NULL && (k == str_event_type || k == str_session_id)) {
            capture[k == str_session_id] = v;
        }
        if (!first && buf_byte(b, ',') < 0) {
            return ENC_ERROR;
        }
        first = 0;
        int rc = json_str(b, k);
        if (rc != ENC_OK) {
            return rc;
        }
        if (buf_byte(b, ':') < 0) {
            return ENC_ERROR;
        }
        rc = json_value(b, w, v, depth);
        if (rc != ENC_OK) {
            return rc;
        }
    }
    return buf_byte(b, '}') < 0 ? ENC_ERROR : ENC_OK;
}

/* The piece of ``fields``; capture[0], capture[1]: ``event_type`` and ``session_id`` when their keys are
 * the interned names (else the caller looks them up). */
static PyObject *json_encode(JsonWriter *self, PyObject *fields, PyObject **capture) {
    if (self->fallback == NULL || self->nested == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "JsonWriter not initialised");
        return NULL;
    }
    if (!PyDict_CheckExact(fields)) {
        return fallback_call(self->fallback, fields);
    }
    Buf b;
    buf_init(&b);
    int rc = json_object(&b, self, fields, 0, capture);
    PyObject *out = NULL;
    if (rc == ENC_OK) {
        out = PyBytes_FromStringAndSize(b.p, b.len);
    } else if (rc == ENC_FALLBACK) {
        if (capture != NULL) {
            capture[0] = capture[1] = NULL;
        }
        out = fallback_call(self->fallback, fields);
    }
    buf_free(&b);
    return out;
}

static PyObject *JsonWriter_encode(JsonWriter *self, PyObject *fields) {
    return json_encode(self, fields, NULL);
}

static int JsonWriter_init(JsonWriter *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"nested_types", "fallback", NULL};
    PyObject *nested, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O:JsonWriter", kwlist, &PyTuple_Type, &nested, &fallback)) {
        return -1;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return -1;
    }
    Py_INCREF(nested);
    Py_XSETREF(self->nested, nested);
    Py_INCREF(fallback);
    Py_XSETREF(self->fallback, fallback);
    return 0;
}

static int JsonWriter_traverse(JsonWriter *self, visitproc visit, void *arg) {
    Py_VISIT(self->nested);
    Py_VISIT(self->fallback);
    return 0;
}

static int JsonWriter_clear(JsonWriter *self) {
    Py_CLEAR(self->nested);
    Py_CLEAR(self->fallback);
    return 0;
}

static void JsonWriter_dealloc(JsonWriter *self) {
    PyObject_GC_UnTrack(self);
    JsonWriter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef JsonWriter_methods[] = {
    {"encode", (PyCFunction)JsonWriter_encode, METH_O, "encode(fields) -> bytes: what orjson.dumps writes for fields."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef JsonWriter_members[] = {
    {"fallback", T_OBJECT, offsetof(JsonWriter, fallback), READONLY, "the pure writer"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject JsonWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rewardflow.client._speedups.JsonWriter",
    .tp_basicsize = sizeof(JsonWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "JsonWriter(nested_types, fallback): compiled JSON writer of event dicts (orjson's bytes).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)JsonWriter_init,
    .tp_dealloc = (destructor)JsonWriter_dealloc,
    .tp_traverse = (traverseproc)JsonWriter_traverse,
    .tp_clear = (inquiry)JsonWriter_clear,
    .tp_methods = JsonWriter_methods,
    .tp_members = JsonWriter_members,
};

/* ------------------------------------------------------------ lock, batch */

/* Lock(): a non-reentrant lock like threading.Lock (acquire(blocking=True), release(),
 * locked(), context manager) whose non-blocking acquire the emit core makes
 * without a Python call. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    char locked;
} Lock;

static int Lock_init(Lock *self, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return -1;
    }
    if (self->lock == NULL) {
        self->lock = PyThread_allocate_lock();
        if (self->lock == NULL) {
            PyErr_SetString(PyExc_MemoryError, "cannot allocate lock");
            return -1;
        }
    }
    return 0;
}

static inline int lock_try(Lock *self) {
    if (PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        self->locked = 1;
        return 1;
    }
    return 0;
}

static PyObject *lock_acquire_blocking(Lock *self, int blocking) {
    if (self->lock == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Lock not initialised");
        return NULL;
    }
    if (lock_try(self)) {
        Py_RETURN_TRUE;
    }
    if (!blocking) {
        Py_RETURN_FALSE;
    }
    for (;;) {
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(self->lock, -1, 1);
        Py_END_ALLOW_THREADS
        if (r == PY_LOCK_ACQUIRED) {
            self->locked = 1;
            Py_RETURN_TRUE;
        }
        if (r == PY_LOCK_INTR && Py_MakePendingCalls() < 0) { /* e.g. KeyboardInterrupt */
            return NULL;
        }
    }
}

static PyObject *Lock_acquire(Lock *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"blocking", NULL};
    int blocking = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p:acquire", kwlist, &blocking)) {
        return NULL;
    }
    return lock_acquire_blocking(self, blocking);
}

static PyObject *Lock_enter(Lock *self, PyObject *unused) {
    return lock_acquire_blocking(self, 1);
}

static inline void lock_release(Lock *self) {
    self->locked = 0;
    PyThread_release_lock(self->lock);
}

static PyObject *Lock_release(Lock *self, PyObject *unused) {
    if (self->lock == NULL || !self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    lock_release(self);
    Py_RETURN_NONE;
}

static PyObject *Lock_exit(Lock *self, PyObject *const *args, Py_ssize_t nargs) {
    return Lock_release(self, NULL);
}

static PyObject *Lock_locked(Lock *self, PyObject *unused) {
    return PyBool_FromLong(self->locked);
}

static void Lock_dealloc(Lock *self) {
    if (self->lock != NULL) {
        if (self->locked) {
            PyThread_release_lock(self->lock);
        }
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True) -> bool"},
    {"release", (PyCFunction)Lock_release, METH_NOARGS, "release()"},
    {"locked", (PyCFunction)Lock_locked, METH_NOARGS, "locked() -> bool"},
    {"__enter__", (PyCFunction)Lock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Lock_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rewardflow.client._speedups.Lock",
    .tp_basicsize = sizeof(Lock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Lock(): like threading.Lock (acquire(blocking=True), release(), locked(), with).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lock_init,
    .tp_dealloc = (destructor)Lock_dealloc,
    .tp_methods = Lock_methods,
};

/* Batch(session_id, key, head, opened, room, left): rewardflow.client.batching.SessionBatch as a C type
 * (same fields, ``pieces`` a new list, ``count`` its length) so the emit core appends without attribute lookups. */
typedef struct {
    PyObject_HEAD
    PyObject *session_id;
    PyObject *key;
    PyObject *head;
    PyObject *pieces;
    double opened;
    Py_ssize_t room;
    Py_ssize_t left;
} Batch;

static int Batch_init(Batch *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"session_id", "key", "head", "opened", "room", "left", NULL};
    PyObject *session_id, *key, *head;
    double opened;
    Py_ssize_t room, left;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOdnn:Batch", kwlist, &session_id, &key, &head, &opened, &room, &left)) {
        return -1;
    }
    PyObject *pieces = PyList_New(0);
    if (pieces == NULL) {
        return -1;
    }
    Py_INCREF(session_id);
    Py_XSETREF(self->session_id, session_id);
    Py_INCREF(key);
    Py_XSETREF(self->key, key);
    Py_INCREF(head);
    Py_XSETREF(self->head, head);
    Py_XSETREF(self->pieces, pieces);
    self->opened = opened;
    self->room = room;
    self->left = left;
    return 0;
}

static PyObject *Batch_count(Batch *self, void *closure) {
    return PyLong_FromSsize_t(self->pieces != NULL && PyList_Check(self->pieces) ? PyList_GET_SIZE(self->pieces) : 0);
}

static int Batch_traverse(Batch *self, visitproc visit, void *arg) {
    Py_VISIT(self->session_id);
    Py_VISIT(self->key);
    Py_VISIT(self->head);
    Py_VISIT(self->pieces);
    return 0;
}

static int Batch_clear(Batch *self) {
    Py_CLEAR(self->session_id);
    Py_CLEAR(self->key);
    Py_CLEAR(self->head);
    Py_CLEAR(self->pieces);
    return 0;
}

static void Batch_dealloc(Batch *self) {
    PyObject_GC_UnTrack(self);
    Batch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Batch_members[] = {
    {"session_id", T_OBJECT_EX, offsetof(Batch, session_id), 0, NULL},
    {"key", T_OBJECT_EX, offsetof(Batch, key), 0, NULL},
    {"head", T_OBJECT_EX, offsetof(Batch, head), 0, NULL},
    {"pieces", T_OBJECT_EX, offsetof(Batch, pieces), 0, NULL},
    {"opened", T_DOUBLE, offsetof(Batch, opened), 0, NULL},
    {"room", T_PYSSIZET, offsetof(Batch, room), 0, NULL},
    {"left", T_PYSSIZET, offsetof(Batch, left), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Batch_getset[] = {
    {"count", (getter)Batch_count, NULL, "len(pieces)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rewardflow.client._speedups.Batch",
    .tp_basicsize = sizeof(Batch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Batch(session_id, key, head, opened, room, left): SessionBatch in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Batch_init,
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_traverse = (traverseproc)Batch_traverse,
    .tp_clear = (inquiry)Batch_clear,
    .tp_members = Batch_members,
    .tp_getset = Batch_getset,
};

/* -------------------------------------------------------------- emit core */

/* The producer's common case of ``emit`` in one call (rewardflow.client.producer):
 * a trusted event model whose session has an open batch with room for it and
 * for more. Everything else is left to the Python path, which holds the same
 * lock for every change of the batches and counts.
 *
 * ``try_emit(event)`` returns
 *   None   - the event was encoded, appended to its session's open Batch
 *            (never filling it) while no other thread held the producer's
 *            Lock, and counted as accepted;
 *   bytes  - its encoded piece: the Python path must take it from here
 *            (no open batch, batch full or to split, pending bound reached,
 *            the pump's due flag, the lock busy);
 *   False  - nothing was done (closed producer, an untrusted type, no
 *            writer, an encoder error, ...): the Python path must do it all
 *            (and raise what it raises).
 * ``emit(event)`` is try_emit followed, unless it returned None, by the Python
 * path ``slow(event, piece_or_False)`` (set_slow): the producer's ``emit``.
 */


typedef struct {
    PyObject_HEAD
    PyObject *by_type; /* dict: event model type (taken as validated) -> its writer */
    PyObject *writers; /* dict event_type -> AvroWriter | JsonWriter | callable(fields) -> bytes */
    PyObject *open;    /* dict session_id -> open batch (room, left, pieces) */
    PyObject *lock;    /* the producer's lock (a Lock: the core appends only while no one else holds it) */
    PyObject *slow;    /* the Python path: slow(event, piece or False) */
    Py_ssize_t sep;
    Py_ssize_t accepted;
    Py_ssize_t limit;
    char closed;
    char due;
} EmitCore;

static PyObject *write_piece(PyObject *writer, PyObject *fields, PyObject **capture) {
    if (Py_TYPE(writer) == &AvroWriterType) {
        return avro_encode((AvroWriter *)writer, fields, capture);
    }
    if (Py_TYPE(writer) == &JsonWriterType) {
        return json_encode((JsonWriter *)writer, fields, capture);
    }
    Py_INCREF(writer); /* (audit fix: held across the Python call) */
    PyObject *out = PyObject_CallOneArg(writer, fields);
    Py_DECREF(writer);
    return out;
}

/* Append under the lock if the open batch takes the piece and stays open: 1 done, 0 not, -1 error. */
static int append_locked(EmitCore *self, PyObject *sid, PyObject *piece) {
    if (self->closed || self->due) {
        return 0;
    }
    /* (audit note) With a key in ``open`` that is not an exact str (a str-subclass session_id from a
     * model_construct'ed event, say), this lookup calls that key's __eq__: Python code. The caller holds
     * the Lock for real, so no other thread can change the batches meanwhile. */
    PyObject *open = self->open;
    Py_INCREF(open); /* (audit fix: that code could re-initialise the core and free the dict mid-lookup) */
    int rc = 0;
    PyObject *found = PyDict_GetItemWithError(open, sid); /* borrowed (open is held) */
    if (found == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if (self->closed || self->due || open != self->open || Py_TYPE(found) != &BatchType) { /* (re-read: the lookup may run code) */
        goto done;
    }
    Batch *batch = (Batch *)found;
    Py_ssize_t size = PyBytes_GET_SIZE(piece) + self->sep;
    if (batch->room < size || batch->left <= 1 || batch->pieces == NULL || !PyList_CheckExact(batch->pieces)) {
        goto done; /* split or full: the Python path closes and sends the batch */
    }
    if (PyList_Append(batch->pieces, piece) < 0) {
        rc = -1;
        goto done;
    }
    batch->room -= size;
    batch->left -= 1;
    self->accepted++;
    rc = 1;
done:
    Py_DECREF(open);
    return rc;
}

static PyObject *EmitCore_try(EmitCore *self, PyObject *event) {
    if (self->closed || self->by_type == NULL || self->lock == NULL) {
        Py_RETURN_FALSE;
    }
    /* The writer of the model's type: the one the Python path picks by event_type, checked below. */
    PyObject *writer = PyDict_GetItemWithError(self->by_type, (PyObject *)Py_TYPE(event)); /* borrowed */
    if (writer == NULL) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    PyObject *fields = instance_dict(event);
    if (fields == NULL || !PyDict_CheckExact(fields)) {
        PyErr_Clear();
        Py_XDECREF(fields);
        Py_RETURN_FALSE;
    }
    PyObject *capture[2] = {NULL, NULL};
    PyObject *piece = write_piece(writer, fields, capture);
    PyObject *etype = capture[0] ? capture[0] : PyDict_GetItemWithError(fields, str_event_type); /* borrowed */
    /* (an exact str: looking it up runs no Python code, so the dict and the borrowed values stay as they are) */
    PyObject *by_name = etype && PyUnicode_CheckExact(etype) ? PyDict_GetItemWithError(self->writers, etype) : NULL;
    if (piece == NULL || !PyBytes_CheckExact(piece) || by_name != writer) {
        /* an encoder error, or a model whose event_type picks another writer: the Python path does it (and raises) */
        PyErr_Clear();
        Py_XDECREF(piece);
        Py_DECREF(fields);
        Py_RETURN_FALSE;
    }
    PyObject *sid = capture[1] ? capture[1] : PyDict_GetItemWithError(fields, str_session_id);
    Py_XINCREF(sid);
    Py_DECREF(fields);
    if (sid == NULL || !PyUnicode_CheckExact(sid) || self->due || self->accepted >= self->limit) {
        PyErr_Clear();
        Py_XDECREF(sid);
        return piece;
    }
    /* (audit fix) Take the lock for real (a non-blocking try: one uncontended atomic operation), with or
     * without the GIL. The former GIL build only read the lock's flag, claiming that append_locked runs
     * no Python code; it does when ``open`` holds a key that is not an exact str (its __eq__), and that
     * code can drop the GIL: another thread could then take the lock and change the batch mid-append. */
    Lock *lock = (Lock *)self->lock;
    if (lock->lock == NULL || lock->locked || !lock_try(lock)) { /* (lock NULL: Lock.__new__ without __init__) */
        Py_DECREF(sid);
        return piece;
    }
    Py_INCREF(lock); /* (held: the code the lookup may run could re-initialise the core) */
    int rc = append_locked(self, sid, piece);
    lock_release(lock);
    Py_DECREF(lock);
    Py_DECREF(sid);
    if (rc < 0) {
        Py_DECREF(piece);
        return NULL;
    }
    if (rc == 1) {
        Py_DECREF(piece);
        Py_RETURN_NONE;
    }
    return piece;
}

/* emit(event): the common case here; everything else (and every exception) from slow(event, piece_or_False). */
static PyObject *EmitCore_emit(EmitCore *self, PyObject *event) {
    PyObject *rest = EmitCore_try(self, event);
    if (rest == NULL || rest == Py_None) {
        return rest;
    }
    if (self->slow == NULL) {
        return rest;
    }
    PyObject *args[2] = {event, rest};
    PyObject *slow = self->slow;
    Py_INCREF(slow); /* (audit fix: slow may replace itself (set_slow) while it runs) */
    PyObject *out = PyObject_Vectorcall(slow, args, 2, NULL);
    Py_DECREF(slow);
    Py_DECREF(rest);
    return out;
}

static PyObject *EmitCore_set_slow(EmitCore *self, PyObject *slow) {
    if (!PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "slow must be callable");
        return NULL;
    }
    Py_INCREF(slow);
    Py_XSETREF(self->slow, slow);
    Py_RETURN_NONE;
}

static int EmitCore_init(EmitCore *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"by_type", "writers", "open", "lock", "separator", "limit", NULL};
    PyObject *by_type, *writers, *open, *lock;
    Py_ssize_t sep, limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!Onn:EmitCore", kwlist, &PyDict_Type, &by_type,
                                     &PyDict_Type, &writers, &PyDict_Type, &open, &lock, &sep, &limit)) {
        return -1;
    }
    if (Py_TYPE(lock) != &LockType) {
        PyErr_SetString(PyExc_TypeError, "lock must be a rewardflow.client._speedups.Lock");
        return -1;
    }
    if (sep < 0 || sep > PY_SSIZE_T_MAX / 4) { /* (audit fix: piece size + sep must not overflow) */
        PyErr_SetString(PyExc_ValueError, "separator must be a byte count >= 0");
        return -1;
    }
    Py_INCREF(by_type);
    Py_XSETREF(self->by_type, by_type);
    Py_INCREF(writers);
    Py_XSETREF(self->writers, writers);
    Py_INCREF(open);
    Py_XSETREF(self->open, open);
    Py_INCREF(lock);
    Py_XSETREF(self->lock, lock);
    self->sep = sep;
    self->limit = limit;
    self->accepted = 0;
    self->closed = 0;
    self->due = 0;
    return 0;
}

static int EmitCore_traverse(EmitCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->by_type);
    Py_VISIT(self->writers);
    Py_VISIT(self->open);
    Py_VISIT(self->lock);
    Py_VISIT(self->slow);
    return 0;
}

static int EmitCore_clear(EmitCore *self) {
    Py_CLEAR(self->by_type);
    Py_CLEAR(self->writers);
    Py_CLEAR(self->open);
    Py_CLEAR(self->lock);
    Py_CLEAR(self->slow);
    return 0;
}

static void EmitCore_dealloc(EmitCore *self) {
    PyObject_GC_UnTrack(self);
    EmitCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef EmitCore_methods[] = {
    {"try_emit", (PyCFunction)EmitCore_try, METH_O,
     "try_emit(event) -> None (appended), bytes (the piece: the Python path continues) or False (the Python path does it all)."},
    {"emit", (PyCFunction)EmitCore_emit, METH_O,
     "emit(event): try_emit, and hand what is left to slow(event, piece_or_False) (see set_slow); returns what slow returns."},
    {"set_slow", (PyCFunction)EmitCore_set_slow, METH_O, "set_slow(fn): the Python path of emit, fn(event, piece_or_False)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef EmitCore_members[] = {
    {"accepted", T_PYSSIZET, offsetof(EmitCore, accepted), 0, "events accepted"},
    {"limit", T_PYSSIZET, offsetof(EmitCore, limit), 0, "emit accepts while accepted < limit"},
    {"closed", T_BOOL, offsetof(EmitCore, closed), 0, "the producer is closed"},
    {"due", T_BOOL, offsetof(EmitCore, due), 0, "batches may be past their delay (set by the pump)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject EmitCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rewardflow.client._speedups.EmitCore",
    .tp_basicsize = sizeof(EmitCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "EmitCore(by_type, writers, open, lock, separator, limit): the producer's common emit case in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)EmitCore_init,
    .tp_dealloc = (destructor)EmitCore_dealloc,
    .tp_traverse = (traverseproc)EmitCore_traverse,
    .tp_clear = (inquiry)EmitCore_clear,
    .tp_methods = EmitCore_methods,
    .tp_members = EmitCore_members,
};

/* ---------------------------------------------------------------- module */

static PyObject *add_models(PyObject *mod, PyObject *types) {
    if (!PyTuple_CheckExact(types)) {
        PyErr_SetString(PyExc_TypeError, "add_models takes a tuple of types");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(types);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(types, i);
        if (!PyType_Check(t) || ((PyTypeObject *)t)->tp_dictoffset == 0) {
            PyErr_SetString(PyExc_TypeError, "add_models takes types whose instances have a __dict__");
            return NULL;
        }
    }
    PyObject *all = plain_models == NULL ? (Py_INCREF(types), types) : PySequence_Concat(plain_models, types);
    if (all == NULL) {
        return NULL;
    }
    Py_XSETREF(plain_models, all);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"add_models", add_models, METH_O,
     "add_models(types): register model types (no custom __dict__, __getattribute__ or properties named "
     "__dict__): nested values of these types are read through their instance dict; the writers hand values "
     "of any other non-primitive type to their fallback. The emit core reads events of these types too."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rewardflow.client._speedups",
    .m_doc = "Compiled per-event Avro and JSON writers (optional; pure-Python fallback in rewardflow.client.speedups).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    for (int c = 0; c < 256; c++) {
        NEEDS_ESCAPE[c] = (unsigned char)(c < 0x20 || c == '"' || c == '\\');
    }
    str_dict = PyUnicode_InternFromString("__dict__");
    if (str_dict == NULL) {
        return NULL;
    }
    str_event_type = PyUnicode_InternFromString("event_type");
    str_session_id = PyUnicode_InternFromString("session_id");
    if (!str_event_type || !str_session_id) {
        return NULL;
    }
    if (PyType_Ready(&AvroWriterType) < 0 || PyType_Ready(&JsonWriterType) < 0 || PyType_Ready(&EmitCoreType) < 0
        || PyType_Ready(&LockType) < 0 || PyType_Ready(&BatchType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&AvroWriterType);
    if (PyModule_AddObject(m, "AvroWriter", (PyObject *)&AvroWriterType) < 0) {
        Py_DECREF(&AvroWriterType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&JsonWriterType);
    if (PyModule_AddObject(m, "JsonWriter", (PyObject *)&JsonWriterType) < 0) {
        Py_DECREF(&JsonWriterType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&EmitCoreType);
    if (PyModule_AddObject(m, "EmitCore", (PyObject *)&EmitCoreType) < 0) {
        Py_DECREF(&EmitCoreType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&LockType);
    if (PyModule_AddObject(m, "Lock", (PyObject *)&LockType) < 0) {
        Py_DECREF(&LockType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&BatchType);
    if (PyModule_AddObject(m, "Batch", (PyObject *)&BatchType) < 0) {
        Py_DECREF(&BatchType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "VERSION", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
