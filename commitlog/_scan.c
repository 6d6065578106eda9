/* Native record walk for commitlog.scan: the same checks, codes and stop positions as
 * commitlog.scan._scan_python (tests compare the two on random and corrupted input).
 * CRC32C uses the SSE4.2 instruction when the CPU has it, a table otherwise. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#include <wmmintrin.h>
#include <smmintrin.h>
#define HAVE_X86 1
#endif

enum { END_OF_DATA = 0, END_OF_SEGMENT = 1, BAD_MAGIC = 2, SIZE_OUT_OF_BOUNDS = 3,
       FIELDS_DO_NOT_ADD_UP = 4, BODY_CRC_MISMATCH = 5, PHYSICAL_OFFSET_MISMATCH = 6,
       BAD_BLANK = 7, TRUNCATED = 8, RECORD_CRC_MISMATCH = 9 };

#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define BLANK_MAGIC 0xCBD43194u

static uint32_t crc_table[256];
static int have_sse42 = 0;
static int have_pclmul = 0;  /* carry-less multiply and SSE4.1: crc32_ieee folds 64 bytes a step */

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32c_table(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* Three streams at once (Mark Adler's crc32c.c, zlib licence, the method): the crc32 instruction
 * takes 3 cycles and issues one a cycle, so one chain over a buffer runs at a third of the
 * instruction's rate. Blocks of 3 x CRC_SHORT bytes (3 x CRC_LONG for long buffers) are walked as
 * three chains in one loop and joined by "shift a CRC over n zero bytes" (a 32x32 GF(2) matrix,
 * applied by four table lookups): CRC(A B) = shift(CRC(A), |B|) ^ CRC0(B). A 1 KiB record's CRC
 * costs about half of what one chain costs; the tests compare it with the crc32c package. */
#define CRC_LONG 8192
#define CRC_SHORT 256
static uint32_t crc_long_shift[4][256], crc_short_shift[4][256];

static uint32_t gf2_matrix_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) { if (vec & 1) sum ^= *mat; vec >>= 1; mat++; }
    return sum;
}

static void gf2_matrix_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_matrix_times(mat, mat[n]);
}

/* The operator that appends len zero bytes to a CRC (len a power of two). */
static void crc32c_zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32], row = 1;
    odd[0] = 0x82F63B78u;  /* one zero bit */
    for (int n = 1; n < 32; n++) { odd[n] = row; row <<= 1; }
    gf2_matrix_square(even, odd);  /* two zero bits */
    gf2_matrix_square(odd, even);  /* four */
    do {  /* one zero byte in even, two in odd, ... until len is used up */
        gf2_matrix_square(even, odd);
        len >>= 1;
        if (len == 0) return;
        gf2_matrix_square(odd, even);
        len >>= 1;
    } while (len);
    for (int n = 0; n < 32; n++) even[n] = odd[n];
}

static void crc32c_zeros(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32];
    crc32c_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_matrix_times(op, n);
        zeros[1][n] = gf2_matrix_times(op, n << 8);
        zeros[2][n] = gf2_matrix_times(op, n << 16);
        zeros[3][n] = gf2_matrix_times(op, n << 24);
    }
}

static inline uint32_t crc32c_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xFF] ^ zeros[1][(crc >> 8) & 0xFF] ^ zeros[2][(crc >> 16) & 0xFF] ^ zeros[3][crc >> 24];
}

#ifdef HAVE_X86
__attribute__((target("sse4.2")))
static uint64_t crc32c_three(uint64_t c0, const uint8_t **next, size_t *n, size_t block, uint32_t zeros[4][256]) {
    const uint8_t *p = *next;
    while (*n >= 3 * block) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *end = p + block;
        do {
            uint64_t v0, v1, v2;
            memcpy(&v0, p, 8); memcpy(&v1, p + block, 8); memcpy(&v2, p + 2 * block, 8);
            c0 = _mm_crc32_u64(c0, v0); c1 = _mm_crc32_u64(c1, v1); c2 = _mm_crc32_u64(c2, v2);
            p += 8;
        } while (p < end);
        c0 = crc32c_shift(zeros, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = crc32c_shift(zeros, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * block;
        *n -= 3 * block;
    }
    *next = p;
    return c0;
}

__attribute__((target("sse4.2")))
static uint32_t crc32c_hw(const uint8_t *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    c = crc32c_three(c, &p, &n, CRC_LONG, crc_long_shift);
    c = crc32c_three(c, &p, &n, CRC_SHORT, crc_short_shift);
    while (n >= 8) { uint64_t v; memcpy(&v, p, 8); c = _mm_crc32_u64(c, v); p += 8; n -= 8; }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}
#endif

static uint32_t crc32c(const uint8_t *p, size_t n) {
#ifdef HAVE_X86
    if (have_sse42) return crc32c_hw(p, n);
#endif
    return crc32c_table(p, n);
}

static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline int64_t be64(const uint8_t *p) {
    return (int64_t)(((uint64_t)be32(p) << 32) | be32(p + 4));
}
static inline int16_t be16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }

/* The record CRC tail (commitlog/record.py): "__CRC32#" 0x01, ten ASCII digits least significant
 * first, 0x02, the last 20 bytes of the properties. */
#define TAIL_SIZE 20
#define TAIL_PREFIX "__CRC32#\x01"
#define TAIL_PREFIX_SIZE 9
#define TAIL_DIGITS 10
#define TAIL_NONE (-2)
#define TAIL_DAMAGED (-1)

/* record_crc_state: the CRC the tail of the record ending at `end` holds; TAIL_NONE without a tail;
 * TAIL_DAMAGED when its name is there and the rest is not in shape, or its name is one byte off and
 * the rest is. Twin: record.stored_record_crc. */
static int64_t record_crc_state(const uint8_t *end, int properties_size) {
    if (properties_size < TAIL_SIZE) return TAIL_NONE;
    const uint8_t *t = end - TAIL_SIZE;
    int prefix_off = 0, rest_off = t[TAIL_SIZE - 1] != 0x02;
    for (int i = 0; i < TAIL_PREFIX_SIZE; i++) prefix_off += t[i] != (uint8_t)TAIL_PREFIX[i];
    int64_t value = 0;
    for (int i = TAIL_PREFIX_SIZE + TAIL_DIGITS - 1; i >= TAIL_PREFIX_SIZE; i--) {
        if (t[i] < '0' || t[i] > '9') rest_off++;
        else value = value * 10 + (t[i] - '0');
    }
    if (prefix_off == 0 && rest_off == 0) return value;
    /* the name intact: the record was sealed (no producer may send that name), so any digit or
       separator wrong is damage; the name one byte off with the rest in shape: damage too */
    if (prefix_off == 0 || (prefix_off == 1 && rest_off == 0)) return TAIL_DAMAGED;
    return TAIL_NONE;
}

/* Write the tail of the record at p (size bytes): the masked CRC32C of its bytes before the tail. */
static void seal_record(uint8_t *p, Py_ssize_t size) {
    uint32_t crc = crc32c(p, (size_t)(size - TAIL_SIZE)) & 0x7FFFFFFFu;
    uint8_t *t = p + size - TAIL_SIZE;
    memcpy(t, TAIL_PREFIX, TAIL_PREFIX_SIZE);
    for (int i = 0; i < TAIL_DIGITS; i++) { t[TAIL_PREFIX_SIZE + i] = (uint8_t)('0' + crc % 10); crc /= 10; }
    t[TAIL_SIZE - 1] = 0x02;
}

static int walk(const uint8_t *buf, Py_ssize_t start, Py_ssize_t end, int64_t file_from,
                int check_crc, Py_ssize_t *position_out, long long *count_out, Py_ssize_t *last_out) {
    Py_ssize_t pos = start, last = -1;
    long long count = 0;
    int code;
    for (;;) {
        Py_ssize_t left = end - pos;
        if (left < 8) {
            code = END_OF_DATA;
            for (Py_ssize_t i = pos; i < end; i++) if (buf[i]) { code = TRUNCATED; break; }
            break;
        }
        int32_t size = (int32_t)be32(buf + pos);
        uint32_t magic = be32(buf + pos + 4);
        if (magic != MAGIC_V1 && magic != MAGIC_V2) {
            if (magic == BLANK_MAGIC) code = (size == left) ? END_OF_SEGMENT : BAD_BLANK;
            else if (size == 0 && magic == 0) code = END_OF_DATA;
            else code = BAD_MAGIC;
            break;
        }
        if (size < 91 || size > left) { code = SIZE_OUT_OF_BOUNDS; break; }
        int32_t sysflag = (int32_t)be32(buf + pos + 36);
        Py_ssize_t header = 48 + ((sysflag & 0x10) ? 20 : 8) + 8 + ((sysflag & 0x20) ? 20 : 8) + 12;
        if (header + 4 + 3 > size) { code = FIELDS_DO_NOT_ADD_UP; break; }
        Py_ssize_t body_length_at = pos + header;
        int32_t body_size = (int32_t)be32(buf + body_length_at);
        Py_ssize_t record_end = pos + size;
        Py_ssize_t topic_length_at = body_length_at + 4 + (Py_ssize_t)body_size;
        if (body_size < 0 || topic_length_at + 3 > record_end) { code = FIELDS_DO_NOT_ADD_UP; break; }
        Py_ssize_t properties_length_at;
        int topic_size;
        if (magic == MAGIC_V1) {
            topic_size = buf[topic_length_at];
            if (topic_size > 127) { code = FIELDS_DO_NOT_ADD_UP; break; }
            properties_length_at = topic_length_at + 1 + topic_size;
        } else {
            topic_size = be16(buf + topic_length_at);
            properties_length_at = topic_length_at + 2 + topic_size;
        }
        if (topic_size < 0 || properties_length_at + 2 > record_end) { code = FIELDS_DO_NOT_ADD_UP; break; }
        int properties_size = be16(buf + properties_length_at);
        if (properties_size < 0 || properties_length_at + 2 + properties_size != record_end) {
            code = FIELDS_DO_NOT_ADD_UP; break;
        }
        if (be64(buf + pos + 28) != file_from + (int64_t)pos) { code = PHYSICAL_OFFSET_MISMATCH; break; }
        if (check_crc) {
            /* With a tail, one CRC over the record checks it all but the tail (the body among it);
             * the body's own CRC is computed only to name what failed. */
            int64_t stored = record_crc_state(buf + record_end, properties_size);
            if (stored == TAIL_NONE || stored == TAIL_DAMAGED
                || stored != (int64_t)(crc32c(buf + pos, (size_t)(size - TAIL_SIZE)) & 0x7FFFFFFFu)) {
                uint32_t crc = crc32c(buf + body_length_at + 4, (size_t)body_size) & 0x7FFFFFFFu;
                if (crc != be32(buf + pos + 8)) { code = BODY_CRC_MISMATCH; break; }
                if (stored != TAIL_NONE) { code = RECORD_CRC_MISMATCH; break; }
            }
        }
        last = pos;
        pos = record_end;
        count++;
    }
    *position_out = pos;
    *count_out = count;
    *last_out = last;
    return code;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    long long file_from;
    int check_crc;
    if (!PyArg_ParseTuple(args, "y*nnLp", &view, &start, &end, &file_from, &check_crc)) return NULL;
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "scan range %zd..%zd outside a buffer of %zd bytes", start, end, view.len);
        return NULL;
    }
    Py_ssize_t position, last;
    long long count;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = walk((const uint8_t *)view.buf, start, end, (int64_t)file_from, check_crc, &position, &count, &last);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("nLin", position, count, code, last);
}

/* check_spans(buffer, spans, start, file_from, level) -> (index, code, position): the read path's
 * check (commitlog/read_check.py; twin: _check_spans_python). Each item of the sequence spans from
 * index start is a tuple (offset, size, ...) naming one whole record at buffer[offset - file_from:],
 * walked as scan walks (the same checks and codes) at level 1, its CRCs checked too at level 2
 * (the body CRC, and the record CRC of a record with the tail: walk's check); level 0 only finds the first span that does not lie in buffer (the check turned off). Stops at the first span that does not lie in
 * buffer (code -1, position its start), or whose walk does not pass exactly one record ending at
 * its end: the walk's code and position (the span's start) when its record fails, END_OF_DATA and
 * the record's end when the record passes but is shorter than its span (positions in buffer). index is that span's; len(spans) with END_OF_DATA when all passed. */
static PyObject *check_spans(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *spans;
    Py_ssize_t start;
    long long file_from;
    int level, copy = 0;
    if (!PyArg_ParseTuple(args, "y*OnLi|p", &view, &spans, &start, &file_from, &level, &copy)) return NULL;
    PyObject *fast = PySequence_Fast(spans, "spans must be a sequence of (offset, size, ...) tuples");
    if (fast == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *copies = copy ? PyList_New(0) : NULL;
    if (copy && copies == NULL) {
        Py_DECREF(fast);
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *buf = (const uint8_t *)view.buf;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), i = start < 0 ? 0 : start > n ? n : start, stop = 0;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    int code = END_OF_DATA;
    for (; i < n; i++) {
        PyObject *item = items[i];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 2) {
            PyErr_SetString(PyExc_TypeError, "spans must be a sequence of (offset, size, ...) tuples");
            goto fail;
        }
        long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 0));
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1));
        if (PyErr_Occurred()) goto fail;
        long long pos = offset - file_from;
        if (pos < 0 || size < 0 || pos > (long long)view.len || size > (long long)view.len - pos) {
            code = -1;
            stop = (Py_ssize_t)(pos < 0 ? 0 : pos);
            break;
        }
        if (level > 0) {
            Py_ssize_t position, last;
            long long count;
            int c = walk(buf, (Py_ssize_t)pos, (Py_ssize_t)(pos + size), (int64_t)file_from, level >= 2, &position, &count, &last);
            if (c != END_OF_DATA || position != (Py_ssize_t)(pos + size) || count != 1) {
                /* a first record that passed but ends before the span does: END_OF_DATA at its end */
                code = count >= 1 ? END_OF_DATA : c;
                stop = count >= 1 ? (Py_ssize_t)pos + (Py_ssize_t)be32(buf + pos) : position;
                break;
            }
        }
        if (copy) {  /* the record's bytes copied while the walk has them in the cache */
            PyObject *record = PyBytes_FromStringAndSize((const char *)buf + pos, (Py_ssize_t)size);
            if (record == NULL || PyList_Append(copies, record) < 0) {
                Py_XDECREF(record);
                goto fail;
            }
            Py_DECREF(record);
        }
    }
    Py_DECREF(fast);
    PyBuffer_Release(&view);
    if (copy) return Py_BuildValue("ninN", i, code, stop, copies);
    return Py_BuildValue("nin", i, code, stop);
fail:
    Py_XDECREF(copies);
    Py_DECREF(fast);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    uint32_t c = crc32c((const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* walk_starts(buffer, start, stop, segment_end, out) -> (count, position, code): the columnar
 * decoder's walk (commitlog.columnar.walk, whose codes it returns; -1: reached stop). Follows
 * size words from start, writing each record start into out (an int64 array) until stop, the
 * end of written data, a blank record, a bad magic, a size word out of bounds, or a full out. */
static PyObject *walk_starts(PyObject *self, PyObject *args) {
    Py_buffer view, out;
    Py_ssize_t start, stop, segment_end;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &view, &start, &stop, &segment_end, &out)) return NULL;
    if (start < 0 || segment_end > view.len || start > segment_end) {
        PyBuffer_Release(&view);
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "walk range %zd..%zd outside a buffer of %zd bytes", start, segment_end, view.len);
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)view.buf;
    int64_t *o = (int64_t *)out.buf;
    Py_ssize_t capacity = out.len / 8, count = 0, pos = start;
    int code = -1;
    Py_BEGIN_ALLOW_THREADS
    while (pos < stop && count < capacity) {
        Py_ssize_t left = segment_end - pos;
        if (left < 8) {
            code = END_OF_DATA;
            for (Py_ssize_t i = pos; i < segment_end; i++) if (p[i]) { code = TRUNCATED; break; }
            break;
        }
        int32_t size = (int32_t)be32(p + pos);
        uint32_t magic = be32(p + pos + 4);
        if (magic != MAGIC_V1 && magic != MAGIC_V2) {
            if (magic == BLANK_MAGIC) code = size == left ? END_OF_SEGMENT : BAD_BLANK;
            else if (size == 0 && magic == 0) code = END_OF_DATA;
            else code = BAD_MAGIC;
            break;
        }
        if (size < 91 || size > left) { code = SIZE_OUT_OF_BOUNDS; break; }
        o[count++] = pos;
        pos += size;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyBuffer_Release(&out);
    return Py_BuildValue("nni", count, pos, code);
}

/* crc_ranges(buffer, starts, lengths, out): out[i] = crc32c(buffer[starts[i]:starts[i]+lengths[i]])
 * & 0x7FFFFFFF, for native-endian int64 starts and lengths and an int64 out (numpy arrays); the
 * body checks of the columnar decoder in one call, GIL released. */
static PyObject *crc_ranges(PyObject *self, PyObject *args) {
    Py_buffer view, starts, lengths, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &view, &starts, &lengths, &out)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = starts.len / 8;
    if (lengths.len != starts.len || out.len != starts.len) {
        PyErr_SetString(PyExc_ValueError, "starts, lengths and out must be int64 arrays of one length");
        goto done;
    }
    const int64_t *s = (const int64_t *)starts.buf, *l = (const int64_t *)lengths.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || l[i] < 0 || s[i] + l[i] > view.len) {
            PyErr_Format(PyExc_ValueError, "range %zd (%lld, %lld) outside a buffer of %zd bytes", i,
                         (long long)s[i], (long long)l[i], view.len);
            goto done;
        }
    }
    int64_t *o = (int64_t *)out.buf;
    const uint8_t *base = (const uint8_t *)view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) o[i] = (int64_t)(crc32c(base + s[i], (size_t)l[i]) & 0x7FFFFFFFu);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&view);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&out);
    return result;
}

static inline void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static inline void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }
static inline void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }

/* What the records of a batch or a pass share besides queue, flag, offsets and born timestamp. */
struct record_shape {
    const uint8_t *topic; Py_ssize_t topic_size;
    const uint8_t *born_ip; Py_ssize_t born_ip_size; int born_port;
    const uint8_t *store_ip; Py_ssize_t store_ip_size; int store_port;
    int sysflag; long long store_timestamp; int record_crc;
};

/* A record's bytes besides body and properties: the fields, the hosts (4 or 16-byte addresses and
 * a port), the topic and its length (two bytes past 127: V2), the properties' length. */
static inline Py_ssize_t fixed_record_size(Py_ssize_t topic_size, Py_ssize_t born_ip_size, Py_ssize_t store_ip_size) {
    return 48 + born_ip_size + 4 + 8 + store_ip_size + 4 + 12 + 4 + (topic_size > 127 ? 2 : 1) + topic_size + 2;
}

/* The size of a record of `fixed` bytes besides body and properties (the fixed size of its topic
 * and hosts): with the record CRC its properties get the tail, and a 0x02 before it when they do
 * not end with one. */
static inline Py_ssize_t record_size_of(Py_ssize_t fixed, Py_ssize_t body_size, const Py_buffer *prop, int record_crc) {
    Py_ssize_t tail = record_crc ? TAIL_SIZE + (prop->len > 0 && ((const uint8_t *)prop->buf)[prop->len - 1] != 0x02) : 0;
    return fixed + body_size + prop->len + tail;
}

/* Encode one record at p (its whole size is writable); returns its size. Sealed with the record CRC
 * tail when the shape says so, once every other field is in place. */
static Py_ssize_t encode_record(uint8_t *p, Py_ssize_t fixed, const struct record_shape *shape, const Py_buffer *body,
                                const Py_buffer *prop, int queue_id, int flag, long long queue_offset,
                                long long physical_offset, long long born_ts) {
    int v2 = shape->topic_size > 127;
    Py_ssize_t size = record_size_of(fixed, body->len, prop, shape->record_crc);
    Py_ssize_t tail = size - fixed - body->len - prop->len;
    put32(p, (uint32_t)size);
    put32(p + 4, v2 ? MAGIC_V2 : MAGIC_V1);
    put32(p + 8, crc32c((const uint8_t *)body->buf, (size_t)body->len) & 0x7FFFFFFFu);
    put32(p + 12, (uint32_t)queue_id);
    put32(p + 16, (uint32_t)flag);
    put64(p + 20, (uint64_t)queue_offset);
    put64(p + 28, (uint64_t)physical_offset);
    put32(p + 36, (uint32_t)shape->sysflag);
    put64(p + 40, (uint64_t)born_ts);
    uint8_t *q = p + 48;
    memcpy(q, shape->born_ip, shape->born_ip_size); q += shape->born_ip_size; put32(q, (uint32_t)shape->born_port); q += 4;
    put64(q, (uint64_t)shape->store_timestamp); q += 8;
    memcpy(q, shape->store_ip, shape->store_ip_size); q += shape->store_ip_size; put32(q, (uint32_t)shape->store_port); q += 4;
    put32(q, 0); q += 4;           /* RECONSUMETIMES */
    put64(q, 0); q += 8;           /* PREPARED_TX_OFFSET */
    put32(q, (uint32_t)body->len); q += 4;
    memcpy(q, body->buf, body->len); q += body->len;
    if (v2) { put16(q, (uint16_t)shape->topic_size); q += 2; } else { *q++ = (uint8_t)shape->topic_size; }
    memcpy(q, shape->topic, shape->topic_size); q += shape->topic_size;
    put16(q, (uint16_t)(prop->len + tail)); q += 2;
    memcpy(q, prop->buf, prop->len); q += prop->len;
    if (shape->record_crc) {
        if (tail > TAIL_SIZE) *q++ = 0x02;
        seal_record(p, size);
    }
    return size;
}

/* write_batch(target, position, physical_base, queue_offset_first, store_timestamp, topic, queue_id,
 *             flag, sysflag, born_timestamp, born_ip, born_port, store_ip, store_port, bodies, properties
 *             [, record_crc])
 * Encodes len(bodies) records at target[position:]; properties is one bytes object shared by all
 * records or a sequence with one per body. With record_crc each record's properties get the CRC tail
 * (and a 0x02 before it when they do not end with one), sealed as soon as the record is written.
 * Returns the bytes written. The caller has checked that they fit; this checks again and writes
 * nothing if not. */
static PyObject *write_batch(PyObject *self, PyObject *args) {
    Py_buffer target, topic, born_ip, store_ip;
    Py_ssize_t position;
    long long physical_base, queue_offset_first, store_ts, born_ts;
    int queue_id, flag, sysflag, born_port, store_port;
    PyObject *bodies, *properties;
    int record_crc = 0;
    if (!PyArg_ParseTuple(args, "w*nLLLy*iiiLy*iy*iOO|p", &target, &position, &physical_base, &queue_offset_first,
                          &store_ts, &topic, &queue_id, &flag, &sysflag, &born_ts, &born_ip, &born_port,
                          &store_ip, &store_port, &bodies, &properties, &record_crc))
        return NULL;
    PyObject *result = NULL;
    PyObject *body_seq = NULL, *prop_seq = NULL;
    Py_buffer *body_views = NULL, *prop_views = NULL;
    Py_ssize_t count = 0, prop_count = 0, done_bodies = 0, done_props = 0;
    int shared_props = PyBytes_Check(properties);
    if ((born_ip.len != 4 && born_ip.len != 16) || (store_ip.len != 4 && store_ip.len != 16)) {
        PyErr_SetString(PyExc_ValueError, "host addresses are 4 or 16 bytes");
        goto done;
    }
    if (topic.len > 32767) { PyErr_SetString(PyExc_ValueError, "topic too long"); goto done; }
    body_seq = PySequence_Fast(bodies, "bodies must be a sequence");
    if (!body_seq) goto done;
    count = PySequence_Fast_GET_SIZE(body_seq);
    body_views = PyMem_Calloc(count ? count : 1, sizeof(Py_buffer));
    if (!body_views) { PyErr_NoMemory(); goto done; }
    for (; done_bodies < count; done_bodies++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(body_seq, done_bodies), &body_views[done_bodies], PyBUF_SIMPLE) < 0)
            goto done;
    if (shared_props) {
        prop_count = 1;
    } else {
        prop_seq = PySequence_Fast(properties, "properties must be bytes or a sequence");
        if (!prop_seq) goto done;
        prop_count = PySequence_Fast_GET_SIZE(prop_seq);
        if (prop_count != count) { PyErr_SetString(PyExc_ValueError, "one properties entry per body"); goto done; }
    }
    prop_views = PyMem_Calloc(prop_count ? prop_count : 1, sizeof(Py_buffer));
    if (!prop_views) { PyErr_NoMemory(); goto done; }
    for (; done_props < prop_count; done_props++) {
        PyObject *item = shared_props ? properties : PySequence_Fast_GET_ITEM(prop_seq, done_props);
        if (PyObject_GetBuffer(item, &prop_views[done_props], PyBUF_SIMPLE) < 0) goto done;
        Py_buffer *prop = &prop_views[done_props];
        Py_ssize_t tail = record_crc ? TAIL_SIZE + (prop->len > 0 && ((const uint8_t *)prop->buf)[prop->len - 1] != 0x02) : 0;
        if (prop->len + tail > 32767) { done_props++; PyErr_SetString(PyExc_ValueError, "properties too long"); goto done; }
    }
    Py_ssize_t fixed = fixed_record_size(topic.len, born_ip.len, store_ip.len);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) total += record_size_of(fixed, body_views[i].len, &prop_views[shared_props ? 0 : i], record_crc);
    if (position < 0 || position + total > target.len) {
        PyErr_Format(PyExc_ValueError, "batch of %zd bytes does not fit at %zd in %zd", total, position, target.len);
        goto done;
    }
    uint8_t *out = (uint8_t *)target.buf + position;
    Py_ssize_t written = 0;
    int transactional = (sysflag & 0xC) == 0x4 || (sysflag & 0xC) == 0xC;
    struct record_shape shape = {(const uint8_t *)topic.buf, topic.len, (const uint8_t *)born_ip.buf, born_ip.len, born_port,
                                 (const uint8_t *)store_ip.buf, store_ip.len, store_port, sysflag, store_ts, record_crc};
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer *body = &body_views[i], *prop = &prop_views[shared_props ? 0 : i];
        written += encode_record(out + written, fixed, &shape, body, prop, queue_id, flag,
                                 transactional ? 0 : queue_offset_first + i, physical_base + position + written, born_ts);
    }
    result = PyLong_FromSsize_t(written);
done:
    for (Py_ssize_t i = 0; i < done_bodies; i++) PyBuffer_Release(&body_views[i]);
    for (Py_ssize_t i = 0; i < done_props; i++) PyBuffer_Release(&prop_views[i]);
    PyMem_Free(body_views);
    PyMem_Free(prop_views);
    Py_XDECREF(body_seq);
    Py_XDECREF(prop_seq);
    PyBuffer_Release(&target);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&born_ip);
    PyBuffer_Release(&store_ip);
    return result;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* The (mapping, start, end) arguments of populate and sync_range: a writable buffer and a range
 * clamped to it. Returns 0 with the buffer held (release it), -1 with an exception set. */
static int mapping_range(PyObject *args, Py_buffer *view, Py_ssize_t *start, Py_ssize_t *end) {
    if (!PyArg_ParseTuple(args, "w*nn", view, start, end)) return -1;
    if (*start < 0) *start = 0;
    if (*end > view->len) *end = view->len;
    return 0;
}

/* populate(mapping, start, end): fault in the pages of mapping[start:end] for writing, with the GIL
 * released, so that appends later copy into resident pages. MADV_POPULATE_WRITE does not change
 * bytes; the fallback adds 0 atomically to one byte per page, which is safe beside a writer. */
static PyObject *populate(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    if (mapping_range(args, &view, &start, &end) < 0) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    start = (start + page - 1) / page * page;
    int rc = 0;
    if (end > start) {
        uint8_t *base = (uint8_t *)view.buf;
        Py_BEGIN_ALLOW_THREADS
        if (((uintptr_t)base % page) != 0 || madvise(base + start, (size_t)(end - start), MADV_POPULATE_WRITE) != 0) {
            rc = 1;
            for (Py_ssize_t p = start; p < end; p += page) __atomic_fetch_add(base + p, 0, __ATOMIC_RELAXED);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(rc == 0);
}


/* sync_range(mapping, start, end): msync(MS_SYNC) of the pages holding mapping[start:end], with the
 * GIL released. On Linux this is vfs_fsync_range(datasync) over that range of the file: the range's
 * dirty pages and the metadata needed to read them back (extent conversion of preallocated
 * blocks), and nothing else: pages faulted in ahead of the writer (populate) are not written.
 * Raises OSError on failure. */
static PyObject *sync_range(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    if (mapping_range(args, &view, &start, &end) < 0) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    int rc = 0, saved = 0;
    if (end > start) {
        uint8_t *base = (uint8_t *)view.buf;
        uintptr_t first = ((uintptr_t)(base + start)) / page * page;
        size_t length = (size_t)((uintptr_t)(base + end) - first);
        Py_BEGIN_ALLOW_THREADS
        rc = msync((void *)first, length, MS_SYNC);
        saved = errno;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    if (rc != 0) {
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}


/* Java String.hashCode over the UTF-16 code units of a UTF-8 string. Returns 0 and sets *ok = 0
 * for invalid UTF-8 (the caller falls back to Python, which decodes with replacement). */
static int32_t java_hash_utf8(const uint8_t *p, Py_ssize_t n, int *ok) {
    uint32_t h = 0;
    *ok = 1;
    for (Py_ssize_t i = 0; i < n;) {
        uint32_t c = p[i];
        int extra;
        if (c < 0x80) { extra = 0; }
        else if ((c & 0xE0) == 0xC0 && c >= 0xC2) { c &= 0x1F; extra = 1; }
        else if ((c & 0xF0) == 0xE0) { c &= 0x0F; extra = 2; }
        else if ((c & 0xF8) == 0xF0 && c <= 0xF4) { c &= 0x07; extra = 3; }
        else { *ok = 0; return 0; }
        if (extra && i + extra >= n) { *ok = 0; return 0; }
        for (int k = 1; k <= extra; k++) {
            if ((p[i + k] & 0xC0) != 0x80) { *ok = 0; return 0; }
            c = (c << 6) | (p[i + k] & 0x3F);
        }
        if ((extra == 2 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) || (extra == 3 && (c < 0x10000 || c > 0x10FFFF))) {
            *ok = 0; return 0;
        }
        i += extra + 1;
        if (c >= 0x10000) {
            c -= 0x10000;
            h = 31 * h + (0xD800 + (c >> 10));
            h = 31 * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31 * h + c;
        }
    }
    return (int32_t)h;
}

typedef struct {
    const uint8_t *topic;
    Py_ssize_t topic_size;
    int32_t queue_id;
    int64_t first_queue_offset, next_queue_offset, first_offset, last_end, max_store_ts;
    uint8_t *units;
    Py_ssize_t count, capacity;
} Run;

/* dispatch_units(buffer, start, limit, physical_base, records_max)
 *   -> (position, stop, records, [(topic, queue_id, first_queue_offset, count, units, first_offset, last_end,
 *                                   max_store_ts), ...])
 * Parses the fields a consume queue needs and groups them into runs per queue with consecutive queue
 * offsets, each with its 20-byte units packed. Transaction prepare/rollback records are passed
 * over. entry_header (optional, 0): 48 walks DLedger entries instead (commitlog/dledger/entry_codec.py):
 * each a header of that size, whose size field bounds the one record after it (an entry of just a
 * header, a no-op, has none); records then counts entries, a blank (magic -1) stops with 1, and an
 * entry not whole or whose body is not exactly one record stops with 2 at the entry. stop: 0 limit/records_max or an incomplete record at position (a slave's log may end in the
 * middle of a record between two frames), 1 blank, 2 malformed at position, 3 a TAGS value that is not
 * valid UTF-8 at position (the caller handles that record in Python and calls again after it). */
static PyObject *dispatch_units(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, limit, records_max, entry_header = 0;
    long long base;
    if (!PyArg_ParseTuple(args, "y*nnLn|n", &view, &start, &limit, &base, &records_max, &entry_header)) return NULL;
    if (limit > view.len) limit = view.len;
    const uint8_t *buf = (const uint8_t *)view.buf;
    Run *runs = NULL;
    Py_ssize_t run_count = 0, run_capacity = 0, records = 0;
    Py_ssize_t walk = start, pos = start; /* walk: the record (entry) being read */
    int stop = 0;
    PyObject *result = NULL;
    while (walk < limit && records < records_max) {
        Py_ssize_t record_limit = limit, next = -1;
        pos = walk;
        if (entry_header) { /* DLedger entries: [magic 1][size] ... header, then one record (or none: a no-op) */
            if (limit - walk < 8) { stop = 2; break; }
            int32_t entry_magic = (int32_t)be32(buf + walk), entry_size = (int32_t)be32(buf + walk + 4);
            if (entry_magic == -1) { stop = 1; break; }
            if (entry_magic != 1 || entry_size < entry_header || entry_size > limit - walk) { stop = 2; break; }
            if (entry_size == entry_header) { walk += entry_size; records++; continue; }
            pos = walk + entry_header;
            record_limit = next = walk + entry_size;
        }
        Py_ssize_t left = record_limit - pos;
        if (left < 8) { if (entry_header) stop = 2; break; } /* the rest of this record has not arrived (a slave between frames) */
        if (be32(buf + pos + 4) == BLANK_MAGIC) { stop = entry_header ? 2 : 1; break; }
        int32_t size = (int32_t)be32(buf + pos);
        uint32_t magic = be32(buf + pos + 4);
        if ((magic != MAGIC_V1 && magic != MAGIC_V2) || size < 91) { stop = 2; break; }
        if (size > left) { if (entry_header) stop = 2; break; } /* incomplete: wait for more bytes, as ReputMessageService does */
        if (entry_header && size != left) { stop = 2; break; } /* an entry's body is one record */
        int32_t queue_id = (int32_t)be32(buf + pos + 12);
        int64_t queue_offset = be64(buf + pos + 20);
        int64_t physical = be64(buf + pos + 28);
        int32_t sysflag = (int32_t)be32(buf + pos + 36);
        Py_ssize_t born = (sysflag & 0x10) ? 20 : 8, store = (sysflag & 0x20) ? 20 : 8;
        int64_t store_ts = be64(buf + pos + 48 + born);
        Py_ssize_t body_length_at = pos + 48 + born + 8 + store + 12;
        Py_ssize_t end = pos + size;
        if (body_length_at + 7 > end || physical != base + pos) { stop = 2; break; }
        int32_t body_size = (int32_t)be32(buf + body_length_at);
        Py_ssize_t cursor = body_length_at + 4 + (Py_ssize_t)body_size;
        if (body_size < 0 || cursor + 3 > end) { stop = 2; break; }
        Py_ssize_t topic_size;
        if (magic == MAGIC_V1) { topic_size = buf[cursor]; cursor += 1; }
        else { topic_size = be16(buf + cursor); cursor += 2; }
        if (topic_size < 0 || cursor + topic_size + 2 > end) { stop = 2; break; }
        const uint8_t *topic = buf + cursor;
        cursor += topic_size;
        int properties_size = be16(buf + cursor);
        cursor += 2;
        if (properties_size < 0 || cursor + properties_size != end) { stop = 2; break; }
        int transaction = sysflag & 0xC;
        if (transaction == 0x4 || transaction == 0xC) { walk = entry_header ? next : end; records++; continue; }
        const uint8_t *props = buf + cursor;
        Py_ssize_t found = -1;
        for (Py_ssize_t i = 0; i + 5 <= properties_size; i++)
            if ((i == 0 || props[i - 1] == 2) && memcmp(props + i, "TAGS\x01", 5) == 0 && i + 5 < properties_size &&
                props[i + 5] != 2)
                found = i + 5;
        int32_t tags_code = 0;
        if (found >= 0) {
            Py_ssize_t value_end = found;
            while (value_end < properties_size && props[value_end] != 2) value_end++;
            int ok;
            tags_code = java_hash_utf8(props + found, value_end - found, &ok);
            if (!ok) { stop = 3; break; }
        }
        Run *run = NULL;
        for (Py_ssize_t r = run_count - 1; r >= 0; r--) {
            if (runs[r].queue_id == queue_id && runs[r].topic_size == topic_size &&
                memcmp(runs[r].topic, topic, topic_size) == 0) {
                if (runs[r].next_queue_offset == queue_offset) run = &runs[r];
                break; /* the newest run of this queue only: a gap starts a new run */
            }
        }
        if (!run) {
            if (run_count == run_capacity) {
                Py_ssize_t capacity = run_capacity ? run_capacity * 2 : 16;
                Run *grown = PyMem_Realloc(runs, capacity * sizeof(Run));
                if (!grown) { PyErr_NoMemory(); goto fail; }
                runs = grown;
                run_capacity = capacity;
            }
            run = &runs[run_count++];
            run->topic = topic; run->topic_size = topic_size; run->queue_id = queue_id;
            run->first_queue_offset = run->next_queue_offset = queue_offset;
            run->first_offset = base + pos; run->max_store_ts = store_ts;
            run->units = NULL; run->count = 0; run->capacity = 0;
        }
        if (run->count == run->capacity) {
            Py_ssize_t capacity = run->capacity ? run->capacity * 2 : 64;
            uint8_t *grown = PyMem_Realloc(run->units, capacity * 20);
            if (!grown) { PyErr_NoMemory(); goto fail; }
            run->units = grown;
            run->capacity = capacity;
        }
        uint8_t *unit = run->units + run->count * 20;
        put64(unit, (uint64_t)(base + pos));
        put32(unit + 8, (uint32_t)size);
        put64(unit + 12, (uint64_t)(int64_t)tags_code);
        run->count++;
        run->next_queue_offset++;
        run->last_end = base + end;
        if (store_ts > run->max_store_ts) run->max_store_ts = store_ts;
        records++;
        walk = entry_header ? next : end;
    }
    /* walk: after the last record (entry) read, or at the one a stop names */
    {
        PyObject *list = PyList_New(run_count);
        if (!list) goto fail;
        for (Py_ssize_t r = 0; r < run_count; r++) {
            Run *run = &runs[r];
            PyObject *item = Py_BuildValue("(y#iLny#LLL)", (const char *)run->topic, run->topic_size, run->queue_id,
                                           (long long)run->first_queue_offset, run->count, (const char *)run->units,
                                           run->count * 20, (long long)run->first_offset, (long long)run->last_end,
                                           (long long)run->max_store_ts);
            if (!item) { Py_DECREF(list); goto fail; }
            PyList_SET_ITEM(list, r, item);
        }
        result = Py_BuildValue("ninN", walk, stop, records, list);
    }
fail:
    for (Py_ssize_t r = 0; r < run_count; r++) PyMem_Free(runs[r].units);
    PyMem_Free(runs);
    PyBuffer_Release(&view);
    return result;
}


/* split_messages(payload, position, count) -> (properties, bodies, end): the n x (blob16
 * properties, blob32 body) run of a SEND request (docs/PROTOCOL.md), as two lists of bytes.
 * Raises ValueError("truncated-field") when a length field does not fit and
 * ValueError("truncated-value") when a value runs past the end; the Python decoder maps both to
 * the messages its own loop raises. */
static PyObject *split_messages(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t position, count;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &position, &count)) return NULL;
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t end = view.len;
    PyObject *properties = PyList_New(count), *bodies = PyList_New(count), *result = NULL;
    const char *problem = NULL;
    if (properties == NULL || bodies == NULL) goto done;
    if (position < 0) { problem = "truncated-field"; goto done; }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (position + 2 > end) { problem = "truncated-field"; goto done; }
        Py_ssize_t size = ((Py_ssize_t)p[position] << 8) | p[position + 1];
        position += 2;
        if (position + size > end) { problem = "truncated-value"; goto done; }
        PyObject *item = PyBytes_FromStringAndSize((const char *)p + position, size);
        if (item == NULL) goto done;
        PyList_SET_ITEM(properties, i, item);
        position += size;
        if (position + 4 > end) { problem = "truncated-field"; goto done; }
        size = ((Py_ssize_t)p[position] << 24) | ((Py_ssize_t)p[position + 1] << 16) | ((Py_ssize_t)p[position + 2] << 8) | p[position + 3];
        position += 4;
        if (size > end - position) { problem = "truncated-value"; goto done; }
        item = PyBytes_FromStringAndSize((const char *)p + position, size);
        if (item == NULL) goto done;
        PyList_SET_ITEM(bodies, i, item);
        position += size;
    }
    result = Py_BuildValue("(OOn)", properties, bodies, position);
done:
    if (problem != NULL) PyErr_SetString(PyExc_ValueError, problem);
    Py_XDECREF(properties);
    Py_XDECREF(bodies);
    PyBuffer_Release(&view);
    return result;
}

/* record_sizes(bodies, properties, fixed) -> (sizes, total, body_total, properties_size_max): a
 * batch's record sizes (fixed + len(body) + len(properties), properties one bytes for all or one per
 * body), their total, the bodies' total and the largest properties size, in one loop (commitlog/record.py
 * ``record_sizes_python`` is its twin; three ``map`` loops over the batch cost ~100 ns a message). */
static PyObject *record_sizes(PyObject *self, PyObject *args) {
    PyObject *bodies, *properties, *body_seq = NULL, *prop_seq = NULL, *sizes = NULL, *result = NULL;
    Py_ssize_t fixed;
    int record_crc = 0;
    if (!PyArg_ParseTuple(args, "OOn|p", &bodies, &properties, &fixed, &record_crc)) return NULL;
    int shared = PyBytes_Check(properties);
    body_seq = PySequence_Fast(bodies, "bodies must be a sequence");
    if (!body_seq) goto done;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(body_seq), shared_size = 0, properties_max = 0, body_total = 0, total = 0;
    if (shared) {
        properties_max = shared_size = PyBytes_GET_SIZE(properties);
        if (record_crc) {
            properties_max = shared_size += TAIL_SIZE + (shared_size > 0 && (uint8_t)PyBytes_AS_STRING(properties)[shared_size - 1] != 0x02);
        }
    } else {
        prop_seq = PySequence_Fast(properties, "properties must be bytes or a sequence");
        if (!prop_seq) goto done;
        if (PySequence_Fast_GET_SIZE(prop_seq) != count) { PyErr_SetString(PyExc_ValueError, "one properties entry per body"); goto done; }
    }
    sizes = PyList_New(count);
    if (!sizes) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t body_size = PyObject_Length(PySequence_Fast_GET_ITEM(body_seq, i));
        if (body_size < 0) goto done;
        Py_ssize_t property_size = shared_size;
        if (!shared) {
            PyObject *entry = PySequence_Fast_GET_ITEM(prop_seq, i);
            if (record_crc) {
                Py_buffer prop;
                if (PyObject_GetBuffer(entry, &prop, PyBUF_SIMPLE) < 0) goto done;
                property_size = prop.len + TAIL_SIZE + (prop.len > 0 && ((const uint8_t *)prop.buf)[prop.len - 1] != 0x02);
                PyBuffer_Release(&prop);
            } else {
                property_size = PyObject_Length(entry);
                if (property_size < 0) goto done;
            }
            if (property_size > properties_max) properties_max = property_size;
        }
        body_total += body_size;
        total += fixed + body_size + property_size;
        PyObject *size = PyLong_FromSsize_t(fixed + body_size + property_size);
        if (!size) goto done;
        PyList_SET_ITEM(sizes, i, size);
    }
    result = Py_BuildValue("(Onnn)", sizes, total, body_total, properties_max);
done:
    Py_XDECREF(sizes);
    Py_XDECREF(body_seq);
    Py_XDECREF(prop_seq);
    return result;
}

/* record_offsets(sizes, start) -> tuple: where each record of a batch starts, the first at
 * ``start`` (``tuple(itertools.accumulate(sizes[:-1], initial=start))``, its twin in
 * commitlog/commit_log.py, with no list between). */
static PyObject *record_offsets(PyObject *self, PyObject *args) {
    PyObject *sizes, *seq, *result = NULL;
    long long start;
    if (!PyArg_ParseTuple(args, "OL", &sizes, &start)) return NULL;
    seq = PySequence_Fast(sizes, "sizes must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    result = PyTuple_New(count);
    if (!result) goto done;
    long long offset = start;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyLong_FromLongLong(offset);
        if (!item) { Py_CLEAR(result); goto done; }
        PyTuple_SET_ITEM(result, i, item);
        long long size = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (size == -1 && PyErr_Occurred()) { Py_CLEAR(result); goto done; }
        offset += size;
    }
done:
    Py_DECREF(seq);
    return result;
}

/* pack_offset_pairs(offsets, queue_offsets) -> bytes: the n (offset, queue offset) pairs of a SEND
 * response, each as two big-endian int64 (hasvc/protocol/client.py ``pack_offset_pairs_python``,
 * its twin: interleaving two lists and ``struct.pack`` of 2n arguments was ~120 ns a message). */
static PyObject *pack_offset_pairs(PyObject *self, PyObject *args) {
    PyObject *offsets, *queue_offsets, *first = NULL, *second = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "OO", &offsets, &queue_offsets)) return NULL;
    first = PySequence_Fast(offsets, "offsets must be a sequence");
    if (!first) goto done;
    second = PySequence_Fast(queue_offsets, "queue offsets must be a sequence");
    if (!second) goto done;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(first);
    if (PySequence_Fast_GET_SIZE(second) != count) {
        PyErr_SetString(PyExc_ValueError, "offsets and queue offsets differ in length");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, 16 * count);
    if (!result) goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        long long offset = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(first, i));
        if (offset == -1 && PyErr_Occurred()) { Py_CLEAR(result); goto done; }
        long long queue_offset = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(second, i));
        if (queue_offset == -1 && PyErr_Occurred()) { Py_CLEAR(result); goto done; }
        put64(p + 16 * i, (uint64_t)offset);
        put64(p + 16 * i + 8, (uint64_t)queue_offset);
    }
done:
    Py_XDECREF(first);
    Py_XDECREF(second);
    return result;
}

/* --- frames: a read's client frames split, and a pass's SEND answers encoded, one call each --- */

/* split_frames(buffer, frame_size_max, kinds, count_max, frame_type) -> (frames, consumed, error, plain):
 * the whole frames at the front of ``buffer`` (``u32 length | u8 kind | u32 request id | payload``),
 * at most ``count_max``, each a ``frame_type`` (a tuple subclass: hasvc.protocol.client.Frame) of
 * kind, request id and its payload as ``buffer[start:end]`` (a view when ``buffer`` is a
 * memoryview: nothing copied); ``consumed`` the bytes they took. It stops before the first frame
 * not whole in ``buffer`` or not allowed: ``error`` is None, or the one-line refusal of the frame
 * it stopped at (its length outside 5..frame_size_max as soon as the length is in, its kind not
 * allowed by ``kinds`` as soon as the kind is). ``kinds`` is 256 bytes, one per kind: 0 refused,
 * 1 allowed, 2 allowed and plain: it also stops after the first frame of a kind not plain (the
 * caller answers it before it takes more: its answer may leave no room), and ``plain`` says
 * whether every frame returned is plain.
 * hasvc/protocol/client_frames.py ``split_frames_python`` is its twin (the same results). */
static PyObject *split_frames(PyObject *self, PyObject *args) {
    PyObject *buffer, *frame_type_object, *frames = NULL, *result = NULL, *error = Py_None;
    Py_ssize_t frame_size_max, count_max;
    Py_buffer view, kinds;
    if (!PyArg_ParseTuple(args, "Ony*nO", &buffer, &frame_size_max, &kinds, &count_max, &frame_type_object)) return NULL;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&kinds);
        return NULL;
    }
    Py_INCREF(error);
    if (kinds.len != 256) {
        PyErr_SetString(PyExc_ValueError, "kinds must be 256 bytes");
        goto done;
    }
    if (!PyType_Check(frame_type_object) || !PyType_IsSubtype((PyTypeObject *)frame_type_object, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "frame_type must be a tuple subclass");
        goto done;
    }
    PyTypeObject *frame_type = (PyTypeObject *)frame_type_object;
    const uint8_t *p = (const uint8_t *)view.buf, *allowed = (const uint8_t *)kinds.buf;
    Py_ssize_t size = view.len, position = 0;
    int plain = 1;
    frames = PyList_New(0);
    if (frames == NULL) goto done;
    while (PyList_GET_SIZE(frames) < count_max) {
        Py_ssize_t left = size - position;
        if (left < 4) break;
        Py_ssize_t length = (Py_ssize_t)be32(p + position);
        if (length < 5 || length > frame_size_max) {
            Py_SETREF(error, PyUnicode_FromFormat("frame of %zd bytes, outside 5..%zd", length, frame_size_max));
            if (error == NULL) goto done;
            break;
        }
        if (left < 5) break;
        uint8_t kind = p[position + 4];
        if (!allowed[kind]) {
            Py_SETREF(error, PyUnicode_FromFormat("unknown frame kind %d", (int)kind));
            if (error == NULL) goto done;
            break;
        }
        if (left < 4 + length) break;
        PyObject *payload = PySequence_GetSlice(buffer, position + 9, position + 4 + length);
        if (payload == NULL) goto done;
        PyObject *kind_number = PyLong_FromLong(kind), *request_id = PyLong_FromUnsignedLong(be32(p + position + 5));
        PyObject *frame = frame_type->tp_alloc(frame_type, 3);
        if (kind_number == NULL || request_id == NULL || frame == NULL) {
            Py_DECREF(payload);
            Py_XDECREF(kind_number);
            Py_XDECREF(request_id);
            Py_XDECREF(frame);
            goto done;
        }
        PyTuple_SET_ITEM(frame, 0, kind_number);
        PyTuple_SET_ITEM(frame, 1, request_id);
        PyTuple_SET_ITEM(frame, 2, payload);
        int appended = PyList_Append(frames, frame);
        Py_DECREF(frame);
        if (appended < 0) goto done;
        position += 4 + length;
        if (allowed[kind] != 2) {
            plain = 0;
            break;
        }
    }
    result = Py_BuildValue("(OnOO)", frames, position, error, plain ? Py_True : Py_False);
done:
    Py_XDECREF(frames);
    Py_XDECREF(error);
    PyBuffer_Release(&view);
    PyBuffer_Release(&kinds);
    return result;
}

/* encode_answers(items, answers, prefix) -> [(owner, data, count), ...]: the answers of a pass
 * (``answers[i]`` bytes, or None for a request answered elsewhere) as response frames, joined per
 * owner: ``items[i]`` is ``(owner, frame, ...)`` with ``frame`` ``(kind, request id, ...)``; each
 * answer is ``u32 length | u8 kind | 0x80 | u32 request id | prefix | answer``, in the order of
 * ``items``; owners in the order first seen. hasvc/protocol/client_frames.py
 * ``encode_answers_python`` is its twin (the same bytes). */
static PyObject *encode_answers(PyObject *self, PyObject *args) {
    PyObject *items, *answers, *owners = NULL, *index = NULL, *result = NULL;
    Py_buffer prefix;
    Py_ssize_t *group_of = NULL, *sizes = NULL, *counts = NULL, *cursors = NULL;
    if (!PyArg_ParseTuple(args, "O!O!y*", &PyList_Type, &items, &PyList_Type, &answers, &prefix)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (PyList_GET_SIZE(answers) != n) {
        PyErr_SetString(PyExc_ValueError, "items and answers differ in length");
        goto done;
    }
    group_of = PyMem_Malloc(sizeof(Py_ssize_t) * (n + 1));
    sizes = PyMem_Calloc(n + 1, sizeof(Py_ssize_t));
    counts = PyMem_Calloc(n + 1, sizeof(Py_ssize_t));
    owners = PyList_New(0);
    index = PyDict_New();
    if (group_of == NULL || sizes == NULL || counts == NULL || owners == NULL || index == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    PyObject *last_owner = NULL;
    Py_ssize_t last_group = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *answer = PyList_GET_ITEM(answers, i), *item = PyList_GET_ITEM(items, i);
        group_of[i] = -1;
        if (answer == Py_None) continue;
        if (!PyBytes_Check(answer)) {
            PyErr_SetString(PyExc_TypeError, "an answer must be bytes or None");
            goto done;
        }
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 2 || !PyTuple_Check(PyTuple_GET_ITEM(item, 1))
            || PyTuple_GET_SIZE(PyTuple_GET_ITEM(item, 1)) < 2) {
            PyErr_SetString(PyExc_TypeError, "an item must be (owner, (kind, request id, ...), ...)");
            goto done;
        }
        PyObject *owner = PyTuple_GET_ITEM(item, 0);
        if (owner != last_owner) {
            PyObject *found = PyDict_GetItemWithError(index, owner);
            if (found == NULL) {
                if (PyErr_Occurred()) goto done;
                PyObject *number = PyLong_FromSsize_t(PyList_GET_SIZE(owners));
                if (number == NULL) goto done;
                int stored = PyDict_SetItem(index, owner, number);
                Py_DECREF(number);
                if (stored < 0 || PyList_Append(owners, owner) < 0) goto done;
                last_group = PyList_GET_SIZE(owners) - 1;
            } else {
                last_group = PyLong_AsSsize_t(found);
            }
            last_owner = owner;
        }
        Py_ssize_t frame_size = 9 + prefix.len + PyBytes_GET_SIZE(answer);
        if (frame_size - 4 > 0xFFFFFFFFLL) {
            PyErr_SetString(PyExc_ValueError, "an answer over 4 GiB");
            goto done;
        }
        group_of[i] = last_group;
        sizes[last_group] += frame_size;
        counts[last_group] += 1;
    }
    Py_ssize_t groups = PyList_GET_SIZE(owners);
    cursors = PyMem_Calloc(groups + 1, sizeof(Py_ssize_t));
    result = PyList_New(groups);
    if (cursors == NULL || result == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        Py_CLEAR(result);
        goto done;
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        PyObject *data = PyBytes_FromStringAndSize(NULL, sizes[g]);
        PyObject *entry = data == NULL ? NULL : Py_BuildValue("(OOn)", PyList_GET_ITEM(owners, g), data, counts[g]);
        Py_XDECREF(data);
        if (entry == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, g, entry);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t g = group_of[i];
        if (g < 0) continue;
        PyObject *answer = PyList_GET_ITEM(answers, i);
        PyObject *frame = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 1);
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(frame, 0));
        unsigned long long request_id = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(frame, 1));
        if (PyErr_Occurred() || kind < 0 || kind > 0xFF || request_id > 0xFFFFFFFFULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a frame's kind or request id out of range");
            Py_CLEAR(result);
            goto done;
        }
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(PyList_GET_ITEM(result, g), 1)) + cursors[g];
        Py_ssize_t answer_size = PyBytes_GET_SIZE(answer);
        put32(out, (uint32_t)(5 + prefix.len + answer_size));
        out[4] = (uint8_t)(kind | 0x80);
        put32(out + 5, (uint32_t)request_id);
        memcpy(out + 9, prefix.buf, prefix.len);
        memcpy(out + 9 + prefix.len, PyBytes_AS_STRING(answer), answer_size);
        cursors[g] += 9 + prefix.len + answer_size;
    }
done:
    PyMem_Free(group_of);
    PyMem_Free(sizes);
    PyMem_Free(counts);
    PyMem_Free(cursors);
    Py_XDECREF(owners);
    Py_XDECREF(index);
    PyBuffer_Release(&prefix);
    return result;
}

/* --- frames: end --- */

/* CRC32 (zlib's, java.util.zip.CRC32: reflected 0xEDB88320), slicing by 8: a DLedger entry's bodyCrc. */
static uint32_t crc32_tables[8][256];

static void crc32_tables_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc32_tables[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc32_tables[t][i] = (crc32_tables[t - 1][i] >> 8) ^ crc32_tables[0][crc32_tables[t - 1][i] & 0xFF];
}

#ifdef HAVE_X86
/* CRC32 (zlib's polynomial, bit-reflected) of n bytes, n >= 64 and a multiple of 16, from the raw
 * state c (not inverted on the way in or out): folding with PCLMULQDQ, "Fast CRC Computation for
 * Generic Polynomials Using PCLMULQDQ Instruction" (Intel, 2009), with the constants of its
 * reflected CRC32 -- the same code as Chromium zlib's crc32_sse42_simd_ and Linux's crc32-pclmul.
 * ~10x the slicing-by-8 table below: the CRC of each 1 KiB entry was 3-5 % of a DLedger member's
 * main thread (the leader's write_entries, the followers' check_entries). */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc32_fold(const uint8_t *p, size_t n, uint32_t c) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;
    x1 = _mm_loadu_si128((const __m128i *)(p + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)c));
    x0 = k1k2;
    p += 64; n -= 64;
    while (n >= 64) {  /* four lanes folded 64 bytes forward */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00); x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00); x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11); x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11); x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64; n -= 64;
    }
    x0 = k3k4;  /* the four lanes folded into one */
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00); x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00); x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00); x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (n >= 16) {  /* the rest, 16 bytes a step */
        x2 = _mm_loadu_si128((const __m128i *)p);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00); x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        p += 16; n -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);  /* 128 bits to 64 */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x0 = poly;  /* Barrett reduction to 32 bits */
    x2 = _mm_and_si128(x1, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static uint32_t crc32_ieee(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
#ifdef HAVE_X86
    if (have_pclmul && n >= 64) {
        size_t folded = n & ~(size_t)15;
        c = crc32_fold(p, folded, c);
        p += folded;
        n -= folded;
    }
#endif
    while (n && ((uintptr_t)p & 7)) { c = crc32_tables[0][(c ^ *p++) & 0xFF] ^ (c >> 8); n--; }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4); memcpy(&hi, p + 4, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo); hi = __builtin_bswap32(hi);
#endif
        lo ^= c;
        c = crc32_tables[7][lo & 0xFF] ^ crc32_tables[6][(lo >> 8) & 0xFF] ^ crc32_tables[5][(lo >> 16) & 0xFF] ^
            crc32_tables[4][lo >> 24] ^ crc32_tables[3][hi & 0xFF] ^ crc32_tables[2][(hi >> 8) & 0xFF] ^
            crc32_tables[1][(hi >> 16) & 0xFF] ^ crc32_tables[0][hi >> 24];
        p += 8; n -= 8;
    }
    while (n--) c = crc32_tables[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static PyObject *py_crc32(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    uint32_t c = crc32_ieee((const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* check_entries(run, count, first_index, prev_term, last_term, first_pos, pos_limit) -> (code, number):
 * one walk over a run of DLedger entries as stored (commitlog/dledger/entry_run.py: the checks, in
 * the order and with the codes of check_run_python, its twin), with the GIL released. */
enum { RUN_OK = 0, RUN_TRUNCATED = 1, RUN_BAD_MAGIC = 2, RUN_BAD_SIZE = 3, RUN_BAD_INDEX = 4, RUN_BAD_TERM = 5,
       RUN_BAD_POS = 6, RUN_PAST_LIMIT = 7, RUN_BAD_CRC = 8, RUN_TRAILING = 9, RUN_BAD_RESERVED = 10 };
#define DLEDGER_BODY_OFFSET 48
#define DLEDGER_ENTRY_SIZE_MAX (48 + 4 * 1024 * 1024 + 64 * 1024)

static PyObject *check_entries(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count;
    long long first_index, prev_term, last_term, first_pos, pos_limit;
    if (!PyArg_ParseTuple(args, "y*nLLLLL", &view, &count, &first_index, &prev_term, &last_term, &first_pos,
                          &pos_limit)) return NULL;
    const uint8_t *buf = (const uint8_t *)view.buf;
    Py_ssize_t total = view.len, position = 0, k = 0;
    int code = RUN_OK;
    Py_BEGIN_ALLOW_THREADS
    int64_t floor = prev_term > 0 ? prev_term : 0;
    for (k = 0; k < count; k++) {
        if (total - position < DLEDGER_BODY_OFFSET) { code = RUN_TRUNCATED; break; }
        const uint8_t *p = buf + position;
        int32_t magic = (int32_t)be32(p), size = (int32_t)be32(p + 4);
        int64_t index = be64(p + 8), term = be64(p + 16), pos = be64(p + 24);
        int32_t crc = (int32_t)be32(p + 40), body_size = (int32_t)be32(p + 44);
        if (magic != 1) { code = RUN_BAD_MAGIC; break; }
        if (size < DLEDGER_BODY_OFFSET || size > DLEDGER_ENTRY_SIZE_MAX || (int64_t)body_size + DLEDGER_BODY_OFFSET != size) {
            code = RUN_BAD_SIZE; break;
        }
        if (size > total - position) { code = RUN_TRUNCATED; break; }
        if ((uint64_t)index != (uint64_t)first_index + (uint64_t)k) { code = RUN_BAD_INDEX; break; }
        if (term < floor || (k == count - 1 && term != last_term)) { code = RUN_BAD_TERM; break; }
        if ((uint64_t)pos != (uint64_t)first_pos + (uint64_t)position) { code = RUN_BAD_POS; break; }
        if (pos + size > pos_limit) { code = RUN_PAST_LIMIT; break; }
        if (be32(p + 32) != 0 || be32(p + 36) != 0) { code = RUN_BAD_RESERVED; break; }
        if (crc != 0 && (int32_t)crc32_ieee(p + DLEDGER_BODY_OFFSET, (size_t)body_size) != crc) { code = RUN_BAD_CRC; break; }
        floor = term;
        position += size;
    }
    if (code == RUN_OK && position != total) code = RUN_TRAILING;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("in", code, k);
}

/* index_units(run, count) -> bytes: the 32-byte index unit (magic, pos, size, index, term) of each of
 * the count entries of a run check_entries accepted (twin: entry_run.index_units_python). */
static PyObject *index_units(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n", &view, &count)) return NULL;
    if (count < 0) { PyBuffer_Release(&view); PyErr_SetString(PyExc_ValueError, "negative count"); return NULL; }
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * 32);
    if (out == NULL) { PyBuffer_Release(&view); return NULL; }
    uint8_t *units = (uint8_t *)PyBytes_AS_STRING(out);
    const uint8_t *buf = (const uint8_t *)view.buf;
    Py_ssize_t position = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (view.len - position < DLEDGER_BODY_OFFSET) {
            Py_DECREF(out); PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "run shorter than its count (not checked?)");
            return NULL;
        }
        const uint8_t *p = buf + position;
        uint8_t *u = units + k * 32;
        memcpy(u, p, 4);           /* magic */
        memcpy(u + 4, p + 24, 8);  /* pos */
        memcpy(u + 12, p + 4, 4);  /* size */
        memcpy(u + 16, p + 8, 16); /* index, term */
        int32_t size = (int32_t)be32(p + 4);
        if (size < DLEDGER_BODY_OFFSET) {
            Py_DECREF(out); PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "entry size below 48 (not checked?)");
            return NULL;
        }
        position += size;
    }
    PyBuffer_Release(&view);
    return out;
}

/* A DLedger entry's 48-byte header at p for a body of body_len bytes at p + 48 (written already: its CRC32 is
 * taken here): magic 1, size, index, term, pos, channel 0, chainCrc 0, bodyCrc, bodySize. */
static void put_entry_header(uint8_t *p, long long index, long long term, long long pos, Py_ssize_t body_len) {
    put32(p, 1); put32(p + 4, (uint32_t)(DLEDGER_BODY_OFFSET + body_len)); put64(p + 8, (uint64_t)index);
    put64(p + 16, (uint64_t)term); put64(p + 24, (uint64_t)pos); put32(p + 32, 0); put32(p + 36, 0);
    put32(p + 40, crc32_ieee(p + DLEDGER_BODY_OFFSET, (size_t)body_len)); put32(p + 44, (uint32_t)body_len);
}

/* write_entries(mapping, position, limit, file_from, entries, start) -> (end, position, units): write
 * entries[start:end] (objects with index, term and body) into mapping from position as DLedger entries,
 * each while it ends at or below limit: the 48-byte header (magic 1, size, index, term, pos = file_from +
 * its position, channel 0, chainCrc 0, bodyCrc = CRC32 of the body, bodySize) and the body, and their
 * 32-byte index units. The caller checked the entries (indexes, terms, sizes: _check_appendable) and
 * made room for the first (pre_append); the Python twin is DLedgerMmapFileStore._append_run. */
static PyObject *str_index, *str_term, *str_body;

static PyObject *write_entries(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t position, limit, start;
    long long file_from;
    PyObject *entries;
    if (!PyArg_ParseTuple(args, "w*nnLOn", &view, &position, &limit, &file_from, &entries, &start)) return NULL;
    if (limit > view.len) limit = view.len;
    PyObject *seq = PySequence_Fast(entries, "entries must be a sequence");
    if (seq == NULL) { PyBuffer_Release(&view); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), k = start;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *units = PyBytes_FromStringAndSize(NULL, (n > start ? n - start : 0) * 32);
    if (units == NULL) goto fail;
    uint8_t *out = (uint8_t *)view.buf, *unit = (uint8_t *)PyBytes_AS_STRING(units);
    for (; k < n; k++) {
        PyObject *index_object = PyObject_GetAttr(items[k], str_index);
        PyObject *term_object = index_object ? PyObject_GetAttr(items[k], str_term) : NULL;
        PyObject *body_object = term_object ? PyObject_GetAttr(items[k], str_body) : NULL;
        long long index = index_object ? PyLong_AsLongLong(index_object) : -1;
        long long term = term_object ? PyLong_AsLongLong(term_object) : -1;
        Py_XDECREF(index_object);
        Py_XDECREF(term_object);
        if (body_object == NULL || PyErr_Occurred()) { Py_XDECREF(body_object); goto fail; }
        Py_buffer body;
        if (PyObject_GetBuffer(body_object, &body, PyBUF_SIMPLE) < 0) { Py_DECREF(body_object); goto fail; }
        Py_ssize_t size = DLEDGER_BODY_OFFSET + body.len;
        if (size > limit - position) { PyBuffer_Release(&body); Py_DECREF(body_object); break; }
        uint8_t *p = out + position;
        int64_t pos = file_from + position;
        memcpy(p + DLEDGER_BODY_OFFSET, body.buf, (size_t)body.len);
        put_entry_header(p, index, term, pos, body.len);
        put32(unit, 1); put64(unit + 4, (uint64_t)pos); put32(unit + 12, (uint32_t)size);
        put64(unit + 16, (uint64_t)index); put64(unit + 24, (uint64_t)term);
        unit += 32;
        position += size;
        PyBuffer_Release(&body);
        Py_DECREF(body_object);
    }
    if (_PyBytes_Resize(&units, (k - start) * 32) < 0) goto fail;
    Py_DECREF(seq);
    PyBuffer_Release(&view);
    return Py_BuildValue("nnN", k, position, units);
fail:
    Py_XDECREF(units);
    Py_DECREF(seq);
    PyBuffer_Release(&view);
    return NULL;
}

/* cut_records(buffer, sizes, offsets, field) -> list of bytes: buffer holds records end to end,
 * sizes[i] bytes each from its start; record i's 8-byte big-endian field at byte `field` of it is set
 * to offsets[i] (a DLedger leader's PHYSICALOFFSET: its entry's pos + 48) and the record returned as
 * a bytes object of its own. ValueError, nothing returned, when a size cannot hold the field or the
 * records pass the buffer's end. The Python twin is message_store._cut_records_python. */
static PyObject *cut_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *sizes, *offsets;
    Py_ssize_t field;
    if (!PyArg_ParseTuple(args, "w*OOn", &view, &sizes, &offsets, &field)) return NULL;
    PyObject *out = NULL, *size_seq = NULL, *offset_seq = NULL;
    size_seq = PySequence_Fast(sizes, "sizes must be a sequence");
    if (size_seq == NULL) goto done;
    offset_seq = PySequence_Fast(offsets, "offsets must be a sequence");
    if (offset_seq == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(size_seq);
    if (PySequence_Fast_GET_SIZE(offset_seq) != n) {
        PyErr_SetString(PyExc_ValueError, "one offset per size");
        goto done;
    }
    if (field < 0) { PyErr_SetString(PyExc_ValueError, "negative field position"); goto done; }
    out = PyList_New(n);
    if (out == NULL) goto done;
    uint8_t *buf = (uint8_t *)view.buf;
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(size_seq, i));
        long long offset = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(offset_seq, i));
        if (PyErr_Occurred()) { Py_CLEAR(out); goto done; }
        if (size < field + 8 || size > view.len - start) {
            PyErr_Format(PyExc_ValueError, "record %zd of %zd bytes at %zd: no field at %zd or past the buffer's %zd",
                         i, size, start, field, view.len);
            Py_CLEAR(out);
            goto done;
        }
        put64(buf + start + field, (uint64_t)offset);
        PyObject *record = PyBytes_FromStringAndSize((const char *)buf + start, size);
        if (record == NULL) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, i, record);
        start += size;
    }
done:
    Py_XDECREF(size_seq);
    Py_XDECREF(offset_seq);
    PyBuffer_Release(&view);
    return out;
}

/* -- a pass of SENDs (commitlog/pass_encode.py: the twins and the theory) ------------------------ */

static PyObject *str_topic, *str_queue_id, *str_flag, *str_born_timestamp, *str_bodies, *str_properties;
static PyObject *str_producer_id, *str_first_sequence;

/* SEND_IDEMPOTENT (the client protocol's frame kind 7): its payload is a string producer id and an
 * i64 first sequence before a SEND's, and each of its messages is stored with its properties
 * tagged with the producer id and its sequence, last, as hasvc.broker.put_service tag_properties
 * tags them (pass_encode.tag_properties: the twin; the names are hasvc.state.dedupe's). */
#define KIND_SEND_IDEMPOTENT 7
#define PRODUCER_ID_SIZE_MAX 64    /* hasvc.protocol.client's (pass_encode.PRODUCER_ID_SIZE_MAX) */
#define TAG_ID "HASVC_PRODUCER_ID\x01"
#define TAG_ID_SIZE 18
#define TAG_SEQ "\x02HASVC_PRODUCER_SEQ\x01"
#define TAG_SEQ_SIZE 20

static int long_attr(PyObject *object, PyObject *name, long long *value) {
    PyObject *attr = PyObject_GetAttr(object, name);
    if (!attr) return -1;
    *value = PyLong_AsLongLong(attr);
    Py_DECREF(attr);
    return (*value == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* One request of a pass: a request object (topic, queue_id, flag, born_timestamp, bodies and
 * properties one per body) or a SEND's payload (the client protocol's, as hasvc.protocol.client
 * decode_send reads it: topic, >iiqI queue id, flag, born timestamp and n, then n x (blob16
 * properties, blob32 body), nothing after). Its messages as spans: body j at 2j, properties at
 * 2j + 1. Released by pass_request_release. */
struct pass_request {
    PyObject *bodies, *properties;  /* PySequence_Fast, a request object's */
    Py_buffer *views;
    Py_ssize_t held;
    Py_buffer payload;
    int has_payload;
    Py_ssize_t count;
    const uint8_t **data;
    Py_ssize_t *size;
    const uint8_t *topic;           /* a payload's topic bytes */
    Py_ssize_t topic_size;
    long long queue_id, flag, born_ts;  /* a payload's head */
    int idempotent;                 /* a SEND_IDEMPOTENT: its messages tagged */
    const uint8_t *producer;        /* its producer id's UTF-8 bytes (a payload's, or producer_object's) */
    Py_ssize_t producer_size;
    long long first_sequence;
    PyObject *producer_object;      /* a request object's producer_id, held */
};

#define PASS_MALFORMED 2    /* a payload decode_send refuses */
#define PASS_MISSHAPEN 1    /* no body, or not one properties entry per body */

static void pass_request_release(struct pass_request *r) {
    for (Py_ssize_t i = 0; i < r->held; i++) PyBuffer_Release(&r->views[i]);
    if (r->has_payload) PyBuffer_Release(&r->payload);
    PyMem_Free(r->views);
    PyMem_Free(r->data);
    PyMem_Free(r->size);
    Py_XDECREF(r->bodies);
    Py_XDECREF(r->properties);
    Py_XDECREF(r->producer_object);
    memset(r, 0, sizeof(*r));
}

static int pass_request_spans(struct pass_request *r) {
    r->data = PyMem_Calloc(2 * r->count, sizeof(*r->data));
    r->size = PyMem_Calloc(2 * r->count, sizeof(*r->size));
    if (!r->data || !r->size) { PyErr_NoMemory(); return -1; }
    return 0;
}

/* A payload's fields and spans: 0, or PASS_MALFORMED (the buffer still held: release it). */
static int pass_payload_parse(struct pass_request *r, Py_ssize_t messages_max) {
    const uint8_t *p = (const uint8_t *)r->payload.buf;
    Py_ssize_t end = r->payload.len, position = 0;
    if (r->idempotent) {  /* the producer id (its UTF-8 is checked by plan_pass) and first sequence, then a SEND's payload */
        if (end < 2) return PASS_MALFORMED;
        Py_ssize_t size = ((Py_ssize_t)p[0] << 8) | p[1];
        if (2 + size + 8 > end) return PASS_MALFORMED;
        r->producer = p + 2;
        r->producer_size = size;
        r->first_sequence = be64(p + 2 + size);
        if (size == 0 || size > PRODUCER_ID_SIZE_MAX || memchr(p + 2, 0x01, size) || memchr(p + 2, 0x02, size)
            || r->first_sequence < 0)
            return PASS_MALFORMED;
        p += 2 + size + 8;
        end -= 2 + size + 8;
    }
    if (end < 2) return PASS_MALFORMED;
    r->topic_size = ((Py_ssize_t)p[0] << 8) | p[1];
    r->topic = p + 2;
    position = 2 + r->topic_size;
    if (position + 20 > end) return PASS_MALFORMED;
    r->queue_id = (int32_t)be32(p + position);
    r->flag = (int32_t)be32(p + position + 4);
    r->born_ts = be64(p + position + 8);
    uint32_t count = be32(p + position + 16);
    position += 20;
    if (count == 0 || (Py_ssize_t)count > messages_max) return PASS_MALFORMED;
    r->count = count;
    if (pass_request_spans(r) < 0) return -1;
    for (Py_ssize_t j = 0; j < r->count; j++) {
        if (position + 2 > end) return PASS_MALFORMED;
        Py_ssize_t size = ((Py_ssize_t)p[position] << 8) | p[position + 1];
        position += 2;
        if (position + size > end) return PASS_MALFORMED;
        r->data[2 * j + 1] = p + position;
        r->size[2 * j + 1] = size;
        position += size;
        if (position + 4 > end) return PASS_MALFORMED;
        size = (Py_ssize_t)be32(p + position);
        position += 4;
        if (size > end - position) return PASS_MALFORMED;
        r->data[2 * j] = p + position;
        r->size[2 * j] = size;
        position += size;
    }
    return position == end ? 0 : PASS_MALFORMED;
}

/* 0 with the request's spans held, PASS_MISSHAPEN or PASS_MALFORMED (nothing held), -1 with an
 * exception set. */
static int pass_request_get(PyObject *item, struct pass_request *r, Py_ssize_t messages_max, int idempotent) {
    memset(r, 0, sizeof(*r));
    if (PyObject_CheckBuffer(item)) {
        if (PyObject_GetBuffer(item, &r->payload, PyBUF_SIMPLE) < 0) return -1;
        r->has_payload = 1;
        r->idempotent = idempotent;
        int parsed = pass_payload_parse(r, messages_max);
        if (parsed != 0) pass_request_release(r);
        return parsed;
    }
    PyObject *bodies = PyObject_GetAttr(item, str_bodies);
    if (!bodies) return -1;
    r->bodies = PySequence_Fast(bodies, "a request's bodies must be a sequence");
    Py_DECREF(bodies);
    if (!r->bodies) return -1;
    PyObject *properties = PyObject_GetAttr(item, str_properties);
    if (!properties) { pass_request_release(r); return -1; }
    r->properties = PySequence_Fast(properties, "a request's properties must be a sequence");
    Py_DECREF(properties);
    if (!r->properties) { pass_request_release(r); return -1; }
    r->count = PySequence_Fast_GET_SIZE(r->bodies);
    if (r->count == 0 || PySequence_Fast_GET_SIZE(r->properties) != r->count) { pass_request_release(r); return PASS_MISSHAPEN; }
    r->views = PyMem_Calloc(2 * r->count, sizeof(Py_buffer));
    if (!r->views || pass_request_spans(r) < 0) { pass_request_release(r); if (!PyErr_Occurred()) PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < 2 * r->count; i++) {
        PyObject *entry = PySequence_Fast_GET_ITEM(i % 2 ? r->properties : r->bodies, i / 2);
        if (PyObject_GetBuffer(entry, &r->views[i], PyBUF_SIMPLE) < 0) { pass_request_release(r); return -1; }
        r->held++;
        r->data[i] = (const uint8_t *)r->views[i].buf;
        r->size[i] = r->views[i].len;
    }
    if (idempotent) {  /* a request object's producer id and first sequence, as they are (the decoder checked them) */
        r->idempotent = 1;
        r->producer_object = PyObject_GetAttr(item, str_producer_id);
        if (!r->producer_object) { pass_request_release(r); return -1; }
        if (!PyUnicode_Check(r->producer_object)) {
            pass_request_release(r);
            PyErr_SetString(PyExc_TypeError, "a SEND_IDEMPOTENT's producer_id must be a str");
            return -1;
        }
        r->producer = (const uint8_t *)PyUnicode_AsUTF8AndSize(r->producer_object, &r->producer_size);
        if (!r->producer || long_attr(item, str_first_sequence, &r->first_sequence) < 0) { pass_request_release(r); return -1; }
    }
    return 0;
}

/* A growing buffer for one message's tagged properties. */
struct scratch {
    uint8_t *data;
    Py_ssize_t capacity, len;
};

/* Message j's properties (n bytes at p) with request r's producer tag added, in s: as
 * tag_properties adds it (a 0x02 first when they are not empty and do not end with one; the
 * sequence in decimal, first_sequence + j). 0, or -1 with MemoryError. */
static int pass_tagged(struct scratch *s, const uint8_t *p, Py_ssize_t n, const struct pass_request *r, Py_ssize_t j) {
    Py_ssize_t need = n + 1 + TAG_ID_SIZE + r->producer_size + TAG_SEQ_SIZE + 21;
    if (need > s->capacity) {
        uint8_t *grown = PyMem_Realloc(s->data, need + 256);
        if (!grown) { PyErr_NoMemory(); return -1; }
        s->data = grown;
        s->capacity = need + 256;
    }
    uint8_t *q = s->data;
    memcpy(q, p, n); q += n;
    if (n > 0 && p[n - 1] != 0x02) *q++ = 0x02;
    memcpy(q, TAG_ID, TAG_ID_SIZE); q += TAG_ID_SIZE;
    memcpy(q, r->producer, r->producer_size); q += r->producer_size;
    memcpy(q, TAG_SEQ, TAG_SEQ_SIZE); q += TAG_SEQ_SIZE;
    /* first_sequence is 0..2**63-1 and j below 2**31: their sum fits unsigned 64 bits (and may pass 2**63-1, as in Python) */
    q += sprintf((char *)q, "%llu", (unsigned long long)r->first_sequence + (unsigned long long)j);
    *q++ = 0x02;
    s->len = q - s->data;
    return 0;
}

static inline Py_ssize_t properties_stored_size(const uint8_t *p, Py_ssize_t n, int record_crc) {
    return n + (record_crc ? TAIL_SIZE + (n > 0 && p[n - 1] != 0x02) : 0);
}

static int has_tail_prefix(const uint8_t *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i + TAIL_PREFIX_SIZE <= n; i++)
        if (p[i] == '_' && memcmp(p + i, TAIL_PREFIX, TAIL_PREFIX_SIZE) == 0) return 1;
    return 0;
}

static int append_index(PyObject *list, Py_ssize_t i) {
    PyObject *at = PyLong_FromSsize_t(i);
    int failed = !at || PyList_Append(list, at) < 0;
    Py_XDECREF(at);
    return failed ? -1 : 0;
}

/* n integers as a new list (or tuple: as_tuple); NULL with an exception set. */
static PyObject *longs_as_sequence(const long long *values, Py_ssize_t n, int as_tuple) {
    PyObject *sequence = as_tuple ? PyTuple_New(n) : PyList_New(n);
    if (!sequence) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *value = PyLong_FromLongLong(values[k]);
        if (!value) { Py_DECREF(sequence); return NULL; }
        if (as_tuple) PyTuple_SET_ITEM(sequence, k, value);
        else PyList_SET_ITEM(sequence, k, value);
    }
    return sequence;
}

/* A request's queue key (topic str, queue id), new; NULL with *malformed set for a payload whose
 * topic is not UTF-8, NULL with an exception set on error. */
static PyObject *pass_key(PyObject *item, const struct pass_request *r, int *malformed) {
    PyObject *topic, *queue_id;
    if (r->has_payload) {
        topic = PyUnicode_DecodeUTF8((const char *)r->topic, r->topic_size, NULL);
        if (!topic) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL;
            PyErr_Clear();
            *malformed = 1;
            return NULL;
        }
        queue_id = PyLong_FromLongLong(r->queue_id);
    } else {
        topic = PyObject_GetAttr(item, str_topic);
        if (!topic) return NULL;
        if (!PyUnicode_CheckExact(topic)) { Py_DECREF(topic); PyErr_SetString(PyExc_TypeError, "a request's topic must be a str"); return NULL; }
        queue_id = PyObject_GetAttr(item, str_queue_id);
    }
    if (!queue_id) { Py_DECREF(topic); return NULL; }
    PyObject *key = PyTuple_Pack(2, topic, queue_id);
    Py_DECREF(topic);
    Py_DECREF(queue_id);
    return key;
}

/* A SEND_IDEMPOTENT's producer id (a str, new), first sequence and messages: a payload's from r
 * (*malformed set when its producer id is not UTF-8), a request object's from its attributes
 * (r may be released: a misshapen one). 0, or -1 with an exception set (*producer may be set). */
static int pass_producer(PyObject *item, const struct pass_request *r, PyObject **producer, long long *first, long long *messages,
                         int *malformed) {
    if (r->has_payload) {
        *producer = PyUnicode_DecodeUTF8((const char *)r->producer, r->producer_size, NULL);
        if (!*producer) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
            PyErr_Clear();
            *malformed = 1;
            return 0;
        }
        *first = r->first_sequence;
        *messages = r->count;
        return 0;
    }
    *producer = PyObject_GetAttr(item, str_producer_id);
    if (!*producer || long_attr(item, str_first_sequence, first) < 0) return -1;
    PyObject *bodies = PyObject_GetAttr(item, str_bodies);
    if (!bodies) return -1;
    *messages = PyObject_Length(bodies);
    Py_DECREF(bodies);
    return *messages < 0 ? -1 : 0;
}

/* Appends v (new; NULL: an error already set) to list: 0, or -1 with an exception set. */
static int append_new(PyObject *list, PyObject *v) {
    int failed = !v || PyList_Append(list, v) < 0;
    Py_XDECREF(v);
    return failed ? -1 : 0;
}

/* plan_pass(requests, body_size_max, record_crc, messages_max[, kinds])
 *   -> (keys, key_of, refused, counts, variable, malformed, idempotent): twin of pass_encode.plan_pass_python.
 * kinds: None, or one byte a request, its frame kind (KIND_SEND_IDEMPOTENT: its head read, its
 * messages tagged). idempotent: (numbers, producer ids, first sequences, messages, sizes), one
 * each a SEND_IDEMPOTENT not malformed, in the order read (sizes: what it adds to its key's
 * variable, 0 when refused). */
static PyObject *plan_pass(PyObject *self, PyObject *args) {
    PyObject *requests, *kinds = Py_None;
    long long body_size_max;
    int record_crc;
    Py_ssize_t messages_max;
    if (!PyArg_ParseTuple(args, "OLpn|O", &requests, &body_size_max, &record_crc, &messages_max, &kinds)) return NULL;
    PyObject *seq = PySequence_Fast(requests, "requests must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), key_count = 0, capacity = 0;
    long long *counts = NULL, *variable = NULL;
    PyObject *result = NULL, *counts_list = NULL, *variable_list = NULL, *producer = NULL;
    PyObject *keys = PyList_New(0), *index_of = PyDict_New(), *key_of = PyList_New(n), *refused = PyList_New(0);
    PyObject *malformed_list = PyList_New(0);
    PyObject *numbers = PyList_New(0), *producers = PyList_New(0), *firsts = PyList_New(0), *messages_list = PyList_New(0);
    PyObject *sizes = PyList_New(0);
    Py_buffer kinds_view = {0};
    struct scratch tagged = {0};
    if (!keys || !index_of || !key_of || !refused || !malformed_list || !numbers || !producers || !firsts || !messages_list || !sizes)
        goto done;
    if (kinds != Py_None) {
        if (PyObject_GetBuffer(kinds, &kinds_view, PyBUF_SIMPLE) < 0) goto done;
        if (kinds_view.len != n) { PyErr_SetString(PyExc_ValueError, "kinds: one a request"); goto done; }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        struct pass_request r;
        int idempotent = kinds_view.obj && ((const uint8_t *)kinds_view.buf)[i] == KIND_SEND_IDEMPOTENT;
        long long first = 0, messages = 0;
        int got = pass_request_get(item, &r, messages_max, idempotent);
        if (got < 0) goto done;
        int malformed = got == PASS_MALFORMED;
        if (idempotent && !malformed && pass_producer(item, &r, &producer, &first, &messages, &malformed) < 0) {
            pass_request_release(&r);
            goto done;
        }
        PyObject *key = malformed ? NULL : pass_key(item, &r, &malformed);
        if (!key) {
            pass_request_release(&r);
            Py_CLEAR(producer);
            if (!malformed) goto done;
            PyList_SET_ITEM(key_of, i, PyLong_FromLong(-1));
            if (!PyList_GET_ITEM(key_of, i) || append_index(malformed_list, i) < 0) goto done;
            continue;
        }
        PyObject *found = PyDict_GetItemWithError(index_of, key);  /* borrowed */
        Py_ssize_t index;
        if (found) {
            index = PyLong_AsSsize_t(found);
        } else {
            if (PyErr_Occurred()) { Py_DECREF(key); pass_request_release(&r); goto done; }
            index = key_count;
            if (key_count == capacity) {
                capacity = capacity ? 2 * capacity : 8;
                long long *grown = PyMem_Realloc(counts, capacity * sizeof(long long));
                if (grown) counts = grown;
                long long *grown_variable = grown ? PyMem_Realloc(variable, capacity * sizeof(long long)) : NULL;
                if (grown_variable) variable = grown_variable;
                if (!grown || !grown_variable) { Py_DECREF(key); pass_request_release(&r); PyErr_NoMemory(); goto done; }
            }
            counts[index] = variable[index] = 0;
            PyObject *number = PyLong_FromSsize_t(index);
            int failed = !number || PyDict_SetItem(index_of, key, number) < 0 || PyList_Append(keys, key) < 0;
            Py_XDECREF(number);
            if (failed) { Py_DECREF(key); pass_request_release(&r); goto done; }
            key_count++;
        }
        Py_DECREF(key);
        PyObject *number = PyLong_FromSsize_t(index);
        if (!number) { pass_request_release(&r); goto done; }
        PyList_SET_ITEM(key_of, i, number);
        int bad = got == PASS_MISSHAPEN;
        long long body_total = 0, properties_total = 0;
        for (Py_ssize_t j = 0; !bad && j < r.count; j++) {
            const uint8_t *prop = r.data[2 * j + 1];
            Py_ssize_t prop_len = r.size[2 * j + 1];
            if (r.idempotent) {
                if (pass_tagged(&tagged, prop, prop_len, &r, j) < 0) { pass_request_release(&r); goto done; }
                prop = tagged.data;
                prop_len = tagged.len;
            }
            Py_ssize_t prop_size = properties_stored_size(prop, prop_len, record_crc);
            body_total += r.size[2 * j];
            properties_total += prop_size;
            bad = has_tail_prefix(prop, prop_len) || prop_size > 32767;
        }
        if (!bad) bad = body_total > body_size_max;
        if (bad) {
            if (append_index(refused, i) < 0) { pass_request_release(&r); goto done; }
        } else {
            counts[index] += r.count;
            variable[index] += body_total + properties_total;
        }
        pass_request_release(&r);
        if (idempotent) {
            int failed = append_index(numbers, i) < 0 || PyList_Append(producers, producer) < 0
                         || append_new(firsts, PyLong_FromLongLong(first)) < 0
                         || append_new(messages_list, PyLong_FromLongLong(messages)) < 0
                         || append_new(sizes, PyLong_FromLongLong(bad ? 0 : body_total + properties_total)) < 0;
            Py_CLEAR(producer);
            if (failed) goto done;
        }
    }
    counts_list = longs_as_sequence(counts, key_count, 0);
    variable_list = counts_list ? longs_as_sequence(variable, key_count, 0) : NULL;
    if (!counts_list || !variable_list) goto done;
    PyObject *idempotent_arrays = PyTuple_Pack(5, numbers, producers, firsts, messages_list, sizes);
    if (!idempotent_arrays) goto done;
    result = PyTuple_Pack(7, keys, key_of, refused, counts_list, variable_list, malformed_list, idempotent_arrays);
    Py_DECREF(idempotent_arrays);
done:
    if (kinds_view.obj) PyBuffer_Release(&kinds_view);
    PyMem_Free(tagged.data);
    Py_XDECREF(producer);
    Py_XDECREF(numbers);
    Py_XDECREF(producers);
    Py_XDECREF(firsts);
    Py_XDECREF(messages_list);
    Py_XDECREF(sizes);
    PyMem_Free(counts);
    PyMem_Free(variable);
    Py_XDECREF(counts_list);
    Py_XDECREF(variable_list);
    Py_XDECREF(keys);
    Py_XDECREF(index_of);
    Py_XDECREF(key_of);
    Py_XDECREF(refused);
    Py_XDECREF(malformed_list);
    Py_DECREF(seq);
    return result;
}

/* What the two native pass writers share (write_pass, the classic one, and write_entry_pass, the
 * DLedger one): the requests with their key indexes, exclusion flags and topics; the queue offset
 * next per key; one answer a request; the records' shape but for their topic. Opened by
 * pass_walk_open, each kept request read by pass_walk_request, closed by pass_walk_close. */
struct pass_walk {
    PyObject *seq, *key_seq, *topic_seq, *first_seq, *answers;  /* answers: a list, one a request */
    const uint8_t *excluded;
    long long *next_queue;  /* per key */
    Py_ssize_t count, key_count, messages_max;
    struct record_shape shape;
    Py_buffer kinds;        /* one byte a request (frame kinds); obj NULL: every request a plain SEND */
    struct scratch tagged;  /* a SEND_IDEMPOTENT's message's tagged properties */
};

/* One kept request's head, as pass_walk_request reads it. */
struct pass_head {
    Py_ssize_t index, fixed;  /* its key; its records' size besides body and properties */
    long long queue_id, flag, born_ts;
    uint8_t *answer;          /* its answer's bytes: queue id and count written, 16 a message to come */
};

static void pass_walk_close(struct pass_walk *w) {
    if (w->kinds.obj) PyBuffer_Release(&w->kinds);
    PyMem_Free(w->tagged.data);
    PyMem_Free(w->next_queue);
    Py_XDECREF(w->answers);
    Py_XDECREF(w->seq);
    Py_XDECREF(w->key_seq);
    Py_XDECREF(w->topic_seq);
    Py_XDECREF(w->first_seq);
    memset(w, 0, sizeof(*w));
}

/* 0, or -1 with an exception set (close the walk either way). Every topic is checked here, once. */
static int pass_walk_open(struct pass_walk *w, PyObject *requests, PyObject *key_of, const Py_buffer *excluded, PyObject *topics,
                          PyObject *first_queue_offsets, Py_ssize_t messages_max, const struct record_shape *shape, PyObject *kinds) {
    memset(w, 0, sizeof(*w));
    w->shape = *shape;
    w->messages_max = messages_max;
    w->excluded = (const uint8_t *)excluded->buf;
    if ((shape->born_ip_size != 4 && shape->born_ip_size != 16) || (shape->store_ip_size != 4 && shape->store_ip_size != 16)) {
        PyErr_SetString(PyExc_ValueError, "host addresses are 4 or 16 bytes");
        return -1;
    }
    if ((shape->sysflag & 0xC) == 0x4 || (shape->sysflag & 0xC) == 0xC) { PyErr_SetString(PyExc_ValueError, "a transactional sysflag"); return -1; }
    w->seq = PySequence_Fast(requests, "requests must be a sequence");
    w->key_seq = w->seq ? PySequence_Fast(key_of, "key_of must be a sequence") : NULL;
    w->topic_seq = w->key_seq ? PySequence_Fast(topics, "topics must be a sequence") : NULL;
    w->first_seq = w->topic_seq ? PySequence_Fast(first_queue_offsets, "first_queue_offsets must be a sequence") : NULL;
    if (!w->first_seq) return -1;
    w->count = PySequence_Fast_GET_SIZE(w->seq);
    w->key_count = PySequence_Fast_GET_SIZE(w->topic_seq);
    if (PySequence_Fast_GET_SIZE(w->key_seq) != w->count || excluded->len != w->count || PySequence_Fast_GET_SIZE(w->first_seq) != w->key_count) {
        PyErr_SetString(PyExc_ValueError, "key_of and excluded: one per request; first_queue_offsets: one per topic");
        return -1;
    }
    if (kinds != Py_None) {
        if (PyObject_GetBuffer(kinds, &w->kinds, PyBUF_SIMPLE) < 0) { w->kinds.obj = NULL; return -1; }
        if (w->kinds.len != w->count) { PyErr_SetString(PyExc_ValueError, "kinds: one a request"); return -1; }
    }
    w->next_queue = PyMem_Calloc(w->key_count ? w->key_count : 1, sizeof(long long));
    if (!w->next_queue) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < w->key_count; k++) {
        w->next_queue[k] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(w->first_seq, k));
        if (w->next_queue[k] == -1 && PyErr_Occurred()) return -1;
        PyObject *topic = PySequence_Fast_GET_ITEM(w->topic_seq, k);
        if (!PyBytes_Check(topic)) { PyErr_SetString(PyExc_TypeError, "topics must be bytes"); return -1; }
        if (PyBytes_GET_SIZE(topic) > 32767) { PyErr_SetString(PyExc_ValueError, "topic too long"); return -1; }
    }
    w->answers = PyList_New(w->count);
    return w->answers ? 0 : -1;
}

/* Request i of the walk: 0 when excluded (its answer None); 1 with *r held, *head read, the walk's
 * shape carrying its topic and its answer in place; -1 with an exception set, nothing held. */
static int pass_walk_request(struct pass_walk *w, Py_ssize_t i, struct pass_request *r, struct pass_head *head) {
    if (w->excluded[i]) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(w->answers, i, Py_None);
        return 0;
    }
    PyObject *item = PySequence_Fast_GET_ITEM(w->seq, i);
    Py_ssize_t index = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(w->key_seq, i));
    if (index == -1 && PyErr_Occurred()) return -1;
    if (index < 0 || index >= w->key_count) { PyErr_SetString(PyExc_ValueError, "key index out of range"); return -1; }
    PyObject *topic = PySequence_Fast_GET_ITEM(w->topic_seq, index);
    w->shape.topic = (const uint8_t *)PyBytes_AS_STRING(topic);
    w->shape.topic_size = PyBytes_GET_SIZE(topic);
    head->index = index;
    head->fixed = fixed_record_size(w->shape.topic_size, w->shape.born_ip_size, w->shape.store_ip_size);
    int got = pass_request_get(item, r, w->messages_max, w->kinds.obj && ((const uint8_t *)w->kinds.buf)[i] == KIND_SEND_IDEMPOTENT);
    if (got < 0) return -1;
    if (got != 0) { PyErr_SetString(PyExc_ValueError, "a request kept is misshapen or malformed"); return -1; }
    head->queue_id = r->queue_id, head->flag = r->flag, head->born_ts = r->born_ts;
    if (!r->has_payload && (long_attr(item, str_queue_id, &head->queue_id) < 0 || long_attr(item, str_flag, &head->flag) < 0
                            || long_attr(item, str_born_timestamp, &head->born_ts) < 0)) {
        pass_request_release(r);
        return -1;
    }
    PyObject *answer = PyBytes_FromStringAndSize(NULL, 8 + 16 * r->count);
    if (!answer) { pass_request_release(r); return -1; }
    PyList_SET_ITEM(w->answers, i, answer);
    head->answer = (uint8_t *)PyBytes_AS_STRING(answer);
    put32(head->answer, (uint32_t)head->queue_id);
    put32(head->answer + 4, (uint32_t)r->count);
    return 1;
}

/* Message j of a kept request as body and properties views (a SEND_IDEMPOTENT's properties
 * tagged, in the walk's scratch until the next call); its record's size, or -1 with ValueError
 * when its properties, as stored, pass 32767 bytes (MemoryError: no room to tag them). */
static inline Py_ssize_t pass_message(struct pass_walk *w, const struct pass_request *r, const struct pass_head *head, Py_ssize_t j,
                               Py_buffer *body, Py_buffer *prop) {
    memset(body, 0, sizeof(*body));
    memset(prop, 0, sizeof(*prop));
    body->buf = (void *)r->data[2 * j];
    body->len = r->size[2 * j];
    prop->buf = (void *)r->data[2 * j + 1];
    prop->len = r->size[2 * j + 1];
    if (r->idempotent) {
        if (pass_tagged(&w->tagged, r->data[2 * j + 1], r->size[2 * j + 1], r, j) < 0) return -1;
        prop->buf = w->tagged.data;
        prop->len = w->tagged.len;
    }
    if (properties_stored_size((const uint8_t *)prop->buf, prop->len, w->shape.record_crc) > 32767) {
        PyErr_SetString(PyExc_ValueError, "properties too long");
        return -1;
    }
    return record_size_of(head->fixed, body->len, prop, w->shape.record_crc);
}

/* Message j's offsets in its request's answer: >qq after the >ii head. */
static inline void pass_answer_put(const struct pass_head *head, Py_ssize_t j, long long offset, long long queue_offset) {
    put64(head->answer + 8 + 16 * j, (uint64_t)offset);
    put64(head->answer + 16 + 16 * j, (uint64_t)queue_offset);
}

/* write_pass(buffer, position, physical_base, store_timestamp, store_ip, store_port, born_ip, born_port,
 *            sysflag, record_crc, requests, key_of, excluded, topics, first_queue_offsets, messages_max[, kinds])
 *   -> (written, offsets, queue_offsets, answers): twin of pass_encode.write_pass_python (kinds as
 * plan_pass's: a SEND_IDEMPOTENT's messages written tagged). A request
 * kept that is misshapen or malformed, or a record that would not fit the buffer, raises ValueError
 * (the caller planned the pass: a bug). */
static PyObject *write_pass(PyObject *self, PyObject *args) {
    Py_buffer target, store_ip, born_ip, excluded;
    Py_ssize_t position, messages_max;
    long long physical_base, store_ts;
    int store_port, born_port, sysflag, record_crc;
    PyObject *requests, *key_of, *topics, *first_queue_offsets, *kinds = Py_None;
    if (!PyArg_ParseTuple(args, "w*nLLy*iy*iipOOy*OOn|O", &target, &position, &physical_base, &store_ts, &store_ip, &store_port,
                          &born_ip, &born_port, &sysflag, &record_crc, &requests, &key_of, &excluded, &topics,
                          &first_queue_offsets, &messages_max, &kinds))
        return NULL;
    struct pass_walk w;
    PyObject *result = NULL, *offsets = NULL, *queue_offsets = NULL;
    long long *record_offsets_v = NULL, *record_queue_v = NULL;
    Py_ssize_t records = 0, records_capacity = 0, written = 0;
    struct record_shape shape = {NULL, 0, (const uint8_t *)born_ip.buf, born_ip.len, born_port, (const uint8_t *)store_ip.buf,
                                 store_ip.len, store_port, sysflag, store_ts, record_crc};
    if (pass_walk_open(&w, requests, key_of, &excluded, topics, first_queue_offsets, messages_max, &shape, kinds) < 0) goto done;
    uint8_t *out = (uint8_t *)target.buf;
    if (position < 0 || position > target.len) { PyErr_SetString(PyExc_ValueError, "position outside the buffer"); goto done; }
    for (Py_ssize_t i = 0; i < w.count; i++) {
        struct pass_request r;
        struct pass_head head;
        int got = pass_walk_request(&w, i, &r, &head);
        if (got < 0) goto done;
        if (got == 0) continue;
        if (records + r.count > records_capacity) {
            records_capacity = 2 * (records + r.count) + 16;
            long long *grown = PyMem_Realloc(record_offsets_v, records_capacity * sizeof(long long));
            if (grown) record_offsets_v = grown;
            long long *grown_queue = grown ? PyMem_Realloc(record_queue_v, records_capacity * sizeof(long long)) : NULL;
            if (grown_queue) record_queue_v = grown_queue;
            if (!grown || !grown_queue) { pass_request_release(&r); PyErr_NoMemory(); goto done; }
        }
        for (Py_ssize_t j = 0; j < r.count; j++) {
            Py_buffer body, prop;
            Py_ssize_t size = pass_message(&w, &r, &head, j, &body, &prop);
            if (size < 0) { pass_request_release(&r); goto done; }
            if (size > target.len - position - written) {
                pass_request_release(&r);
                PyErr_Format(PyExc_ValueError, "record of %zd bytes does not fit at %zd in %zd", size, position + written, target.len);
                goto done;
            }
            long long offset = physical_base + position + written, queue_offset = w.next_queue[head.index]++;
            encode_record(out + position + written, head.fixed, &w.shape, &body, &prop, (int)head.queue_id, (int)head.flag,
                          queue_offset, offset, head.born_ts);
            written += size;
            record_offsets_v[records] = offset;
            record_queue_v[records++] = queue_offset;
            pass_answer_put(&head, j, offset, queue_offset);
        }
        pass_request_release(&r);
    }
    offsets = longs_as_sequence(record_offsets_v, records, 1);
    queue_offsets = offsets ? longs_as_sequence(record_queue_v, records, 1) : NULL;
    if (!offsets || !queue_offsets) goto done;
    result = Py_BuildValue("(nOOO)", written, offsets, queue_offsets, w.answers);
done:
    pass_walk_close(&w);
    PyMem_Free(record_offsets_v);
    PyMem_Free(record_queue_v);
    Py_XDECREF(offsets);
    Py_XDECREF(queue_offsets);
    PyBuffer_Release(&target);
    PyBuffer_Release(&store_ip);
    PyBuffer_Release(&born_ip);
    PyBuffer_Release(&excluded);
    return result;
}

/* write_entry_pass(requests, key_of, excluded, topics, first_queue_offsets, store_timestamp, store_ip, store_port,
 *                  born_ip, born_port, sysflag, messages_max, offset, file_size[, kinds[, first_index, term]])
 *   -> (bodies, offsets, queue_ids, queue_offsets, positions, entry_sizes, answers): a DLedger leader's pass of SENDs
 * as the bodies of its proposal's entries, twin of commitlog/entry_pass.py write_entry_pass_python: every request
 * kept (excluded[i] == 0), in the order read, one V1/V2 record a message (no record CRC tail), each placed as
 * entry_placement.plan_positions places an entry of 48 + its size from data offset `offset` in data files of
 * `file_size` bytes, its PHYSICALOFFSET that entry's pos + 48; queue offsets follow on per key from
 * first_queue_offsets; per request its answer's offsets packed as write_pass packs them. A request kept that is
 * misshapen or malformed raises ValueError (the caller planned the pass: a bug).
 * With first_index >= 0 (and the leader's term): the entries framed as stored, end to end in one bytes object -- the
 * run a store appends by one pwrite (entry k of index first_index + k, the 48-byte header as write_entries writes it)
 * -- returned after the seven as an eighth, each body a memoryview of its entry in it; None when an entry would need
 * a blank record before it (a run lies in one data file: the caller plans the pass without the framing). */
static PyObject *write_entry_pass(PyObject *self, PyObject *args) {
    Py_buffer store_ip, born_ip, excluded;
    Py_ssize_t messages_max;
    long long store_ts, offset, file_size;
    int store_port, born_port, sysflag;
    PyObject *requests, *key_of, *topics, *first_queue_offsets, *kinds = Py_None;
    long long first_index = -1, term = -1;
    if (!PyArg_ParseTuple(args, "OOy*OOLy*iy*iinLL|OLL", &requests, &key_of, &excluded, &topics, &first_queue_offsets, &store_ts,
                          &store_ip, &store_port, &born_ip, &born_port, &sysflag, &messages_max, &offset, &file_size, &kinds,
                          &first_index, &term))
        return NULL;
    struct pass_walk w;
    PyObject *result = NULL;
    PyObject *bodies = NULL, *offsets = NULL, *queue_ids = NULL, *queue_offsets = NULL, *positions = NULL, *entry_sizes = NULL;
    int framed = first_index >= 0;
    PyObject *data = NULL, *data_view = NULL;  /* framed: the entries end to end, and a view of them for the bodies */
    Py_ssize_t used = 0, capacity = 0;
    long long frame_end = offset;  /* framed: where the next entry must start (no blank record between) */
    struct record_shape shape = {NULL, 0, (const uint8_t *)born_ip.buf, born_ip.len, born_port, (const uint8_t *)store_ip.buf,
                                 store_ip.len, store_port, sysflag, store_ts, 0};
    if (pass_walk_open(&w, requests, key_of, &excluded, topics, first_queue_offsets, messages_max, &shape, kinds) < 0) goto done;
    if (file_size <= 0 || offset < 0) { PyErr_SetString(PyExc_ValueError, "a data file size above 0 and an offset from 0"); goto done; }
    bodies = PyList_New(0);
    offsets = PyList_New(0);
    queue_ids = PyList_New(0);
    queue_offsets = PyList_New(0);
    positions = PyList_New(0);
    entry_sizes = PyList_New(0);
    if (!bodies || !offsets || !queue_ids || !queue_offsets || !positions || !entry_sizes) goto done;
    if (framed) {
        if (term < 0) { PyErr_SetString(PyExc_ValueError, "framed entries need a term from 0"); goto done; }
        capacity = 64 * 1024;
        data = PyBytes_FromStringAndSize(NULL, capacity);
        if (!data) goto done;
    }
    for (Py_ssize_t i = 0; i < w.count; i++) {
        struct pass_request r;
        struct pass_head head;
        int got = pass_walk_request(&w, i, &r, &head);
        if (got < 0) goto done;
        if (got == 0) continue;
        PyObject *queue_id_object = PyLong_FromLongLong(head.queue_id);
        if (!queue_id_object) { pass_request_release(&r); goto done; }
        for (Py_ssize_t j = 0; j < r.count; j++) {
            Py_buffer body, prop;
            Py_ssize_t size = pass_message(&w, &r, &head, j, &body, &prop);
            if (size < 0) { Py_DECREF(queue_id_object); pass_request_release(&r); goto done; }
            long long entry_size = DLEDGER_BODY_OFFSET + (long long)size;
            long long remaining = file_size - offset % file_size;
            if (entry_size + 8 > remaining) offset += remaining;  /* a blank record fills the rest (MIN_BLANK_SIZE 8) */
            long long pos = offset, queue_offset = w.next_queue[head.index]++;
            offset += entry_size;
            int failed;
            if (framed) {
                if (pos != frame_end) {  /* a blank record before this entry: not one run */
                    Py_DECREF(queue_id_object);
                    pass_request_release(&r);
                    Py_CLEAR(data);
                    result = Py_None;
                    Py_INCREF(result);
                    goto done;
                }
                frame_end = offset;
                if (used + entry_size > capacity) {
                    while (used + entry_size > capacity) capacity *= 2;
                    if (_PyBytes_Resize(&data, capacity) < 0) { Py_DECREF(queue_id_object); pass_request_release(&r); goto done; }
                }
                uint8_t *p = (uint8_t *)PyBytes_AS_STRING(data) + used;
                encode_record(p + DLEDGER_BODY_OFFSET, head.fixed, &w.shape, &body, &prop, (int)head.queue_id, (int)head.flag,
                              queue_offset, pos + DLEDGER_BODY_OFFSET, head.born_ts);
                put_entry_header(p, first_index + PyList_GET_SIZE(offsets), term, pos, size);
                used += entry_size;
                failed = PyList_Append(queue_ids, queue_id_object) < 0;
            } else {
                PyObject *record = PyBytes_FromStringAndSize(NULL, size);
                if (!record) { Py_DECREF(queue_id_object); pass_request_release(&r); goto done; }
                encode_record((uint8_t *)PyBytes_AS_STRING(record), head.fixed, &w.shape, &body, &prop, (int)head.queue_id, (int)head.flag,
                              queue_offset, pos + DLEDGER_BODY_OFFSET, head.born_ts);
                failed = PyList_Append(bodies, record) < 0 || PyList_Append(queue_ids, queue_id_object) < 0;
                Py_DECREF(record);
            }
            PyObject *values[5] = {PyLong_FromLongLong(pos + DLEDGER_BODY_OFFSET), PyLong_FromLongLong(queue_offset),
                                   PyLong_FromLongLong(pos), PyLong_FromLongLong(entry_size), NULL};
            PyObject *lists[5] = {offsets, queue_offsets, positions, entry_sizes, NULL};
            for (int v = 0; v < 4; v++) {
                failed = failed || !values[v] || PyList_Append(lists[v], values[v]) < 0;
                Py_XDECREF(values[v]);
            }
            if (failed) { Py_DECREF(queue_id_object); pass_request_release(&r); goto done; }
            pass_answer_put(&head, j, pos + DLEDGER_BODY_OFFSET, queue_offset);
        }
        Py_DECREF(queue_id_object);
        pass_request_release(&r);
    }
    if (framed) {  /* the bodies: views of the entries, made once the bytes no longer move */
        if (_PyBytes_Resize(&data, used) < 0) goto done;
        data_view = PyMemoryView_FromObject(data);
        if (!data_view) goto done;
        Py_ssize_t start = 0, n = PyList_GET_SIZE(entry_sizes);
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t size = (Py_ssize_t)PyLong_AsSsize_t(PyList_GET_ITEM(entry_sizes, k));
            PyObject *slice = PySequence_GetSlice(data_view, start + DLEDGER_BODY_OFFSET, start + size);
            if (!slice || PyList_Append(bodies, slice) < 0) { Py_XDECREF(slice); goto done; }
            Py_DECREF(slice);
            start += size;
        }
        result = Py_BuildValue("(NNNNOOOO)", PyList_AsTuple(bodies), PyList_AsTuple(offsets), PyList_AsTuple(queue_ids),
                               PyList_AsTuple(queue_offsets), positions, entry_sizes, w.answers, data);
    } else {
        result = Py_BuildValue("(NNNNOOO)", PyList_AsTuple(bodies), PyList_AsTuple(offsets), PyList_AsTuple(queue_ids),
                               PyList_AsTuple(queue_offsets), positions, entry_sizes, w.answers);
    }
done:
    pass_walk_close(&w);
    Py_XDECREF(data);
    Py_XDECREF(data_view);
    Py_XDECREF(bodies);
    Py_XDECREF(offsets);
    Py_XDECREF(queue_ids);
    Py_XDECREF(queue_offsets);
    Py_XDECREF(positions);
    Py_XDECREF(entry_sizes);
    PyBuffer_Release(&store_ip);
    PyBuffer_Release(&born_ip);
    PyBuffer_Release(&excluded);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buffer, start, end, file_from_offset, check_crc) -> (position, count, code, last_record_position)"},
    {"write_batch", write_batch, METH_VARARGS, "encode a batch of records sharing topic, queue and hosts"},
    {"populate", populate, METH_VARARGS, "fault in mapping[start:end] for writing (GIL released)"},
    {"sync_range", sync_range, METH_VARARGS, "msync(MS_SYNC) the pages of mapping[start:end] (GIL released)"},
    {"dispatch_units", dispatch_units, METH_VARARGS, "parse records into per-queue runs of packed units"},
    {"walk_starts", walk_starts, METH_VARARGS, "walk_starts(buffer, start, stop, segment_end, out) -> (count, position, code)"},
    {"check_spans", check_spans, METH_VARARGS,
     "check_spans(buffer, spans, start, file_from, level[, copy]) -> (index, code, position[, copies]): each span one whole record"},
    {"crc_ranges", crc_ranges, METH_VARARGS, "crc_ranges(buffer, starts, lengths, out): masked crc32c per range"},
    {"split_messages", split_messages, METH_VARARGS, "split_messages(payload, position, count) -> (properties, bodies, end)"},
    {"record_sizes", record_sizes, METH_VARARGS, "record_sizes(bodies, properties, fixed[, record_crc]) -> (sizes, total, body_total, properties_size_max)"},
    {"record_offsets", record_offsets, METH_VARARGS, "record_offsets(sizes, start) -> tuple of record starts"},
    {"pack_offset_pairs", pack_offset_pairs, METH_VARARGS, "pack_offset_pairs(offsets, queue_offsets) -> bytes: >qq pairs"},
    /* --- frames --- */
    {"split_frames", split_frames, METH_VARARGS,
     "split_frames(buffer, frame_size_max, kinds, count_max, frame_type) -> (frames, consumed, error, plain)"},
    {"encode_answers", encode_answers, METH_VARARGS, "encode_answers(items, answers, prefix) -> [(owner, data, count), ...]"},
    /* --- frames: end --- */
    {"check_entries", check_entries, METH_VARARGS,
     "check_entries(run, count, first_index, prev_term, last_term, first_pos, pos_limit) -> (code, number)"},
    {"cut_records", cut_records, METH_VARARGS,
     "cut_records(buffer, sizes, offsets, field) -> list of bytes: records cut apart, a field of each set"},
    {"write_entries", write_entries, METH_VARARGS,
     "write_entries(mapping, position, limit, file_from, entries, start) -> (end, position, units)"},
    {"index_units", index_units, METH_VARARGS, "index_units(run, count) -> bytes: 32-byte DLedger index units"},
    {"plan_pass", plan_pass, METH_VARARGS,
     "plan_pass(requests, body_size_max, record_crc, messages_max[, kinds]) -> (keys, key_of, refused, counts, variable, malformed, "
     "idempotent)"},
    {"write_pass", write_pass, METH_VARARGS,
     "write_pass(buffer, position, physical_base, store_timestamp, store_ip, store_port, born_ip, born_port, sysflag, "
     "record_crc, requests, key_of, excluded, topics, first_queue_offsets, messages_max[, kinds]) -> (written, offsets, queue_offsets, answers)"},
    {"write_entry_pass", write_entry_pass, METH_VARARGS,
     "write_entry_pass(requests, key_of, excluded, topics, first_queue_offsets, ...) -> a DLedger leader's pass as entry bodies"},
    {"crc32", py_crc32, METH_VARARGS, "crc32(buffer) -> int (zlib's CRC32, for testing)"},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(buffer) -> int (for testing the native CRC)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "Native record walk", -1, methods};

/* Bumped whenever a function is added or its arguments or results change. */
#define NATIVE_VERSION 13

PyMODINIT_FUNC PyInit__scan(void) {
    crc_table_init();
    crc32c_zeros(crc_long_shift, CRC_LONG);
    crc32c_zeros(crc_short_shift, CRC_SHORT);
    crc32_tables_init();
    str_index = PyUnicode_InternFromString("index");
    str_term = PyUnicode_InternFromString("term");
    str_body = PyUnicode_InternFromString("body");
    str_topic = PyUnicode_InternFromString("topic");
    str_queue_id = PyUnicode_InternFromString("queue_id");
    str_flag = PyUnicode_InternFromString("flag");
    str_born_timestamp = PyUnicode_InternFromString("born_timestamp");
    str_bodies = PyUnicode_InternFromString("bodies");
    str_properties = PyUnicode_InternFromString("properties");
    str_producer_id = PyUnicode_InternFromString("producer_id");
    str_first_sequence = PyUnicode_InternFromString("first_sequence");
    if (!str_index || !str_term || !str_body || !str_topic || !str_queue_id || !str_flag || !str_born_timestamp || !str_bodies
        || !str_properties || !str_producer_id || !str_first_sequence)
        return NULL;
#ifdef HAVE_X86
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
    have_pclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    PyObject *m = PyModule_Create(&module);
    /* commitlog/native.py refuses a build whose VERSION is not its own (a stale build in place). */
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", NATIVE_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
