/* gpuwarden.ops.triage._lines: triage's per-line work for a whole block of kernel-log lines in one call.
 *
 * parse_block() splits a block at its newlines, cuts each line at max_line bytes, decodes it and parses the
 * prefixes most storm lines have (dmesg "[mono]", a ctime stamp the parser has seen before, a bare "kernel:",
 * no prefix at all) into the parser's LogLine objects. Every other line (non-ASCII or control characters, a
 * `dmesg -H` stamp, syslog/ISO/remote/grep prefixes, a ctime stamp not seen yet) goes to the Python parser, in
 * order: a line is parsed here only where ops/triage/logline.py's regexes provably give the same answer, so
 * the results are the same whichever path runs (tests/integration/ops/triage/test_triage_lineparse.py compares them).
 *
 * Plain C on CPython's limited API (3.11): one build serves every CPython >= 3.11 (an .abi3.so).
 */

#define PY_SSIZE_T_CLEAN
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000 /* setup.py says so too */
#endif
#include <Python.h>

#include <string.h>

/* LogLine's fields, in its dataclass order (ops/triage/logline.py). */
enum { F_NUMBER, F_RAW, F_MESSAGE, F_STAMP, F_MONO, F_WALL, F_LEVEL, F_PROGRAM, F_CONTINUATION, F_PREFIXED, NFIELDS };
static const char *const FIELD_NAMES[NFIELDS] = {
    "number", "raw", "message", "stamp", "mono", "wall", "level", "program", "continuation", "prefixed",
};
static PyObject *field_names[NFIELDS];
static PyObject *str_kernel; /* the bare "kernel:" prefix's program */

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_upper(char c) { return c >= 'A' && c <= 'Z'; }
static int is_lower(char c) { return c >= 'a' && c <= 'z'; }
static int is_alpha(char c) { return is_upper(c) || is_lower(c); }
/* Only lines of printable ASCII and tabs are parsed here, so a tab and a space are all Python's \s can meet. */
static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* Whether the line is printable ASCII (tabs allowed): where Python's str regexes (\s, \d, \w, isalnum) and
 * these byte tests agree, and rstrip("\r\n") has nothing to strip. */
static int plain_ascii(const char *p, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if ((c < 0x20 && c != '\t') || c > 0x7e)
            return 0;
    }
    return 1;
}

/* logline._MONO at p[i:]: `\[\s*(\d+\.\d+)\]\s?`. The end of the match, or -1; the digits in [*ds, *de). */
static Py_ssize_t match_mono(const char *p, Py_ssize_t n, Py_ssize_t i, Py_ssize_t *ds, Py_ssize_t *de)
{
    if (i >= n || p[i] != '[')
        return -1;
    i++;
    while (i < n && is_blank(p[i]))
        i++;
    Py_ssize_t s = i;
    while (i < n && is_digit(p[i]))
        i++;
    if (i == s || i >= n || p[i] != '.')
        return -1;
    i++;
    Py_ssize_t frac = i;
    while (i < n && is_digit(p[i]))
        i++;
    if (i == frac || i >= n || p[i] != ']')
        return -1;
    *ds = s;
    *de = i;
    i++;
    if (i < n && is_blank(p[i]))
        i++;
    return i;
}

/* logline._CTIME at the start of the line: "[Tue Mar  5 10:00:00 2024]" and one optional blank. End or -1. */
static Py_ssize_t match_ctime(const char *p, Py_ssize_t n)
{
    static const char days[] = "MonTueWedThuFriSatSun";
    if (n < 5 || p[0] != '[' || p[4] != ' ')
        return -1;
    int day = 0;
    for (int d = 0; d < 7 && !day; d++)
        day = memcmp(p + 1, days + 3 * d, 3) == 0;
    if (!day)
        return -1;
    Py_ssize_t i = 5;
    if (i + 3 > n || !is_upper(p[i]) || !is_lower(p[i + 1]) || !is_lower(p[i + 2]))
        return -1;
    i += 3;
    if (i >= n || p[i] != ' ')
        return -1;
    while (i < n && p[i] == ' ')
        i++;
    Py_ssize_t s = i;
    while (i < n && is_digit(p[i]))
        i++;
    if (i - s < 1 || i - s > 2 || i >= n || p[i] != ' ')
        return -1;
    i++;
    static const char hms[] = "dd:dd:dd ";
    for (int k = 0; hms[k]; k++, i++) {
        if (i >= n || (hms[k] == 'd' ? !is_digit(p[i]) : p[i] != hms[k]))
            return -1;
    }
    for (int k = 0; k < 4; k++, i++) {
        if (i >= n || !is_digit(p[i]))
            return -1;
    }
    if (i >= n || p[i] != ']')
        return -1;
    i++;
    if (i < n && is_blank(p[i]))
        i++;
    return i;
}

static const char *const FACILITIES[] = {
    "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "authpriv", "ftp",
    "local0", "local1", "local2", "local3", "local4", "local5", "local6", "local7", NULL,
};
static const char *const LEVELS[] = {
    "emerg", "alert", "crit", "err", "warn", "warning", "notice", "info", "debug", NULL,
};

/* Whether logline._REMOTE could match: it needs ": <facility>: <level>: [" somewhere. (A word of both lists
 * may end where a longer one would too; every ending is tried, so the test only ever says yes too often.) */
static int maybe_remote(const char *p, Py_ssize_t n)
{
    for (Py_ssize_t q = 2; q + 1 < n; q++) {
        if (p[q] != '[' || p[q - 1] != ' ' || p[q - 2] != ':')
            continue;
        for (int l = 0; LEVELS[l]; l++) {
            Py_ssize_t kl = (Py_ssize_t)strlen(LEVELS[l]);
            Py_ssize_t e = q - 2 - kl; /* where the level starts */
            if (e < 2 || memcmp(p + e, LEVELS[l], (size_t)kl) != 0 || p[e - 1] != ' ' || p[e - 2] != ':')
                continue;
            for (int f = 0; FACILITIES[f]; f++) {
                Py_ssize_t kf = (Py_ssize_t)strlen(FACILITIES[f]);
                Py_ssize_t g = e - 2 - kf;
                if (g >= 2 && memcmp(p + g, FACILITIES[f], (size_t)kf) == 0 && p[g - 1] == ' ' && p[g - 2] == ':')
                    return 1;
            }
        }
    }
    return 0;
}

/* Whether logline._FACILITY could match at the start: a facility word, blanks, ':'. */
static int maybe_facility(const char *p, Py_ssize_t n)
{
    for (int f = 0; FACILITIES[f]; f++) {
        Py_ssize_t k = (Py_ssize_t)strlen(FACILITIES[f]);
        if (k > n || memcmp(p, FACILITIES[f], (size_t)k) != 0)
            continue;
        while (k < n && is_blank(p[k]))
            k++;
        if (k < n && p[k] == ':')
            return 1;
    }
    return 0;
}

/* What the Python parser would make of a line, where this file knows it. */
struct parsed {
    Py_ssize_t message;        /* where the message starts */
    Py_ssize_t ds, de;         /* the [mono] stamp's digits, when de > ds */
    PyObject *stamp, *wall;    /* a known ctime stamp's (from the parser's cache; owned), or NULL */
    PyObject *program;         /* borrowed, or NULL */
    char sbuf[24];             /* a syslog stamp ("Jan  2 03:04:05" as "Jan 2 03:04:05"), sbuf[:slen] */
    Py_ssize_t slen;
    Py_ssize_t ps, pe;         /* a syslog program's span, when pe > ps */
    int continuation, prefixed;
};

/* Characters of a syslog program name: logline._SYSLOG's [\w./@-]. */
static int is_prog(char c) { return is_alpha(c) || is_digit(c) || (c && strchr("_./@-", c) != NULL); }

/* After a program name at p[i:]: an optional "[pid]", then ':'; the index past the ':', or -1. (The regex's
 * lazy name can only end where the run of name characters does: '[' and ':' are not name characters.) */
static Py_ssize_t after_prog(const char *p, Py_ssize_t n, Py_ssize_t i)
{
    if (i < n && p[i] == '[') {
        Py_ssize_t j = i + 1;
        while (j < n && is_digit(p[j]))
            j++;
        if (j == i + 1 || j >= n || p[j] != ']')
            return -1;
        i = j + 1;
    }
    return i < n && p[i] == ':' ? i + 1 : -1;
}

/* logline._SYSLOG on a line of printable ASCII that starts with a letter. Every part of the pattern can match
 * in one way only (each greedy run is followed by a character it cannot take), so this walks it left to right.
 * The end of the match, or -1; the stamp ("mon day hms") into out->sbuf, the program's span. */
static Py_ssize_t match_syslog(const char *p, Py_ssize_t n, struct parsed *out)
{
    Py_ssize_t i = 0, mon, ds, de, hms;
    while (i < n && is_alpha(p[i]))
        i++;
    if (i < 3 || i > 5)
        return -1;
    if (i < n && p[i] == '.')
        i++;
    mon = i;
    Py_ssize_t s = i;
    while (i < n && is_blank(p[i]))
        i++;
    if (i == s)
        return -1;
    ds = i;
    while (i < n && is_digit(p[i]))
        i++;
    de = i;
    if (de - ds < 1 || de - ds > 2)
        return -1;
    s = i;
    while (i < n && is_blank(p[i]))
        i++;
    if (i == s || i + 8 > n)
        return -1;
    hms = i;
    if (!(is_digit(p[i]) && is_digit(p[i + 1]) && p[i + 2] == ':' && is_digit(p[i + 3]) && is_digit(p[i + 4])
          && p[i + 5] == ':' && is_digit(p[i + 6]) && is_digit(p[i + 7])))
        return -1;
    i += 8;
    if (i + 1 < n && p[i] == '.' && is_digit(p[i + 1])) { /* (?:\.\d+)? */
        i++;
        while (i < n && is_digit(p[i]))
            i++;
    }
    s = i;
    while (i < n && is_blank(p[i]))
        i++;
    if (i == s)
        return -1;
    Py_ssize_t end = -1, ps = i, pe = i;
    /* "prog[pid]: " */
    while (pe < n && is_prog(p[pe]))
        pe++;
    if (pe > ps) {
        end = after_prog(p, n, pe);
        if (end >= 0 && !(end < n && is_blank(p[end])))
            end = -1;
        else if (end >= 0)
            end++;
    }
    if (end < 0) { /* "host prog[pid]:" and one optional blank */
        Py_ssize_t h = i;
        while (h < n && !is_blank(p[h]))
            h++;
        if (h == i)
            return -1;
        s = h;
        while (h < n && is_blank(p[h]))
            h++;
        if (h == s)
            return -1;
        ps = pe = h;
        while (pe < n && is_prog(p[pe]))
            pe++;
        if (pe == ps || (end = after_prog(p, n, pe)) < 0)
            return -1;
        if (end < n && is_blank(p[end]))
            end++;
    }
    Py_ssize_t len = 0;
    memcpy(out->sbuf, p, (size_t)mon);
    len = mon;
    out->sbuf[len++] = ' ';
    memcpy(out->sbuf + len, p + ds, (size_t)(de - ds));
    len += de - ds;
    out->sbuf[len++] = ' ';
    memcpy(out->sbuf + len, p + hms, 8);
    out->slen = len + 8;
    out->ps = ps;
    out->pe = pe;
    return end;
}

/* Whether logline._SYSLOG could match: 3-5 letters, '.'?, blanks, 1-2 digits, blanks, dd:dd:dd. */
static int maybe_syslog(const char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && is_alpha(p[i]))
        i++;
    if (i < 3 || i > 5)
        return 0;
    if (i < n && p[i] == '.')
        i++;
    Py_ssize_t s = i;
    while (i < n && is_blank(p[i]))
        i++;
    if (i == s)
        return 0;
    s = i;
    while (i < n && is_digit(p[i]))
        i++;
    if (i - s < 1 || i - s > 2)
        return 0;
    s = i;
    while (i < n && is_blank(p[i]))
        i++;
    if (i == s || i + 8 > n)
        return 0;
    return is_digit(p[i]) && is_digit(p[i + 1]) && p[i + 2] == ':' && is_digit(p[i + 3]) && is_digit(p[i + 4])
        && p[i + 5] == ':' && is_digit(p[i + 6]) && is_digit(p[i + 7]);
}

/* 1: parsed into *out; 0: the Python parser must do it; -1: error. */
static int parse_plain(const char *p, Py_ssize_t n, PyObject *ctime, struct parsed *out)
{
    memset(out, 0, sizeof(*out));
    char c0 = n ? p[0] : '\0';
    Py_ssize_t rest = 0;
    if (c0 == '[') {
        if (n > 1 && (p[1] == ' ' || is_digit(p[1]))) {
            Py_ssize_t end = match_mono(p, n, 0, &out->ds, &out->de);
            if (end >= 0) {
                out->message = end;
                out->prefixed = 1;
                return 1;
            }
        }
        int stamped = n > 1 && strchr("MTWFSAJNDO+", p[1]) != NULL;
        for (Py_ssize_t i = 1; !stamped && i < n && i < 14; i++) { /* rest[1:14].lstrip().startswith("+") */
            if (p[i] == '+')
                stamped = 1;
            else if (!is_blank(p[i]))
                break;
        }
        if (stamped) {
            /* a ctime stamp, whose time the parser has worked out before; anything else (dmesg -H moves the
             * parser's clock, a new second needs its local time) is the parser's */
            Py_ssize_t end = match_ctime(p, n);
            if (end < 0)
                return 0;
            PyObject *head = PyUnicode_FromStringAndSize(p, end);
            if (head == NULL)
                return -1;
            PyObject *known = PyDict_GetItemWithError(ctime, head);
            Py_DECREF(head);
            if (known == NULL)
                return PyErr_Occurred() ? -1 : 0;
            if (!PyTuple_Check(known) || PyTuple_Size(known) != 2)
                return 0;
            /* owned until the line is made: a finalizer run by an allocation on the way could empty the cache */
            out->stamp = Py_NewRef(PyTuple_GetItem(known, 0));
            out->wall = Py_NewRef(PyTuple_GetItem(known, 1));
            out->prefixed = 1;
            rest = end;
        }
    } else if (c0 == 'k' && n >= 7 && memcmp(p, "kernel:", 7) == 0) {
        if (maybe_remote(p, n))
            return 0;
        rest = 7 + (n > 7 && is_blank(p[7]));
        out->program = str_kernel;
        out->prefixed = 1;
    } else if (is_alpha(c0)) {
        /* a remote relay or a dmesg -x facility first are the parser's; then a syslog prefix or none (the ISO
         * and time-only stamps start with a digit) */
        if (maybe_remote(p, n) || maybe_facility(p, n))
            return 0;
        Py_ssize_t end = match_syslog(p, n, out);
        if (end >= 0) {
            out->prefixed = 1;
            rest = end;
        }
    } else if (is_digit(c0)) {
        if (maybe_remote(p, n) || maybe_facility(p, n) || maybe_syslog(p, n))
            return 0;
        if ((n > 4 && p[4] == '-') || (n > 2 && p[2] == ':')) /* ISO and time-only stamps */
            return 0;
    } else if (c0 && strchr("/_.:-", c0) != NULL) {
        return 0; /* a grep -r file prefix, or a remote syslog host */
    }
    Py_ssize_t end = match_mono(p, n, rest, &out->ds, &out->de);
    if (end >= 0) {
        out->prefixed = 1;
        rest = end;
    }
    out->message = rest;
    out->continuation = !out->prefixed && (c0 == ' ' || c0 == '\t');
    return 1;
}

/* How LogLine objects are made: the class's allocator, and each field's slot descriptor's setter. For a slots
 * class with no __setattr__ of its own, setting through the member descriptor is what setattr() does, without
 * looking the name up every time. Learnt once per class; a class that is not so gets plain setattr(). */
static struct {
    PyObject *type;
    allocfunc alloc;
    PyObject *descr[NFIELDS];
    descrsetfunc set[NFIELDS];
} maker;

static void forget_maker(void)
{
    Py_CLEAR(maker.type);
    for (int f = 0; f < NFIELDS; f++) {
        Py_CLEAR(maker.descr[f]);
        maker.set[f] = NULL;
    }
    maker.alloc = NULL;
}

static int is_member_descriptor(PyObject *descr)
{
    PyObject *name = PyType_GetName(Py_TYPE(descr));
    if (name == NULL) {
        PyErr_Clear();
        return 0;
    }
    int yes = PyUnicode_CompareWithASCIIString(name, "member_descriptor") == 0;
    Py_DECREF(name);
    return yes;
}

static int learn_maker(PyObject *type)
{
    if (maker.type == type)
        return 0;
    forget_maker();
    PyObject *dict = PyObject_GetAttrString(type, "__dict__");
    if (dict == NULL)
        return -1;
    int own_setattr = PyMapping_HasKeyString(dict, "__setattr__");
    for (int f = 0; f < NFIELDS && !own_setattr; f++) {
        PyObject *descr = PyObject_GetItem(dict, field_names[f]);
        if (descr == NULL) {
            PyErr_Clear();
            continue;
        }
        descrsetfunc set = (descrsetfunc)PyType_GetSlot(Py_TYPE(descr), Py_tp_descr_set);
        if (set != NULL && is_member_descriptor(descr)) {
            maker.descr[f] = descr;
            maker.set[f] = set;
        } else {
            Py_DECREF(descr);
        }
    }
    Py_DECREF(dict);
    maker.alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_alloc);
    if (maker.alloc == NULL)
        PyErr_Clear();
    maker.type = Py_NewRef(type);
    return 0;
}

/* float() of a [mono] stamp's digits ("12.345678"). Clinger's fast path where it holds (at most 15 digits, so
 * the integer is exact; at most 22 after the point, so the power of ten is exact): one IEEE division of two
 * exact doubles is correctly rounded, as float() is. Otherwise float() itself. */
static PyObject *mono_float(const char *p, Py_ssize_t ds, Py_ssize_t de, PyObject *text)
{
    static const double pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    unsigned long long m = 0;
    int digits = 0, frac = -1;
    for (Py_ssize_t i = ds; i < de; i++) {
        if (p[i] == '.') {
            frac = 0;
            continue;
        }
        m = m * 10 + (unsigned long long)(p[i] - '0');
        digits++;
        if (frac >= 0)
            frac++;
        if (digits > 15)
            return PyFloat_FromString(text);
    }
    if (frac < 0 || frac > 22)
        return PyFloat_FromString(text);
    return PyFloat_FromDouble((double)m / pow10[frac]);
}

/* A LogLine from a parsed plain line; its fields set as its __init__ would set them. */
static PyObject *make_line(PyObject *type, long number, const char *p, Py_ssize_t n, const struct parsed *r)
{
    PyObject *v[NFIELDS] = {0};
    PyObject *line = NULL;
    v[F_NUMBER] = PyLong_FromLong(number);
    v[F_RAW] = PyUnicode_FromStringAndSize(p, n);
    if (v[F_NUMBER] == NULL || v[F_RAW] == NULL)
        goto done;
    if (r->message == 0) {
        v[F_MESSAGE] = Py_NewRef(v[F_RAW]);
    } else {
        v[F_MESSAGE] = PyUnicode_Substring(v[F_RAW], r->message, n);
    }
    if (r->stamp != NULL) {
        v[F_STAMP] = Py_NewRef(r->stamp);
    } else if (r->slen > 0) {
        v[F_STAMP] = PyUnicode_FromStringAndSize(r->sbuf, r->slen);
    } else if (r->de > r->ds) {
        v[F_STAMP] = PyUnicode_FromStringAndSize(p + r->ds, r->de - r->ds);
    } else {
        v[F_STAMP] = Py_NewRef(Py_None);
    }
    if (v[F_MESSAGE] == NULL || v[F_STAMP] == NULL)
        goto done;
    if (r->de > r->ds) {
        /* the stamp is these digits unless a ctime or syslog stamp came first */
        PyObject *digits = r->stamp == NULL && r->slen == 0 ? Py_NewRef(v[F_STAMP])
                                                            : PyUnicode_FromStringAndSize(p + r->ds, r->de - r->ds);
        if (digits == NULL)
            goto done;
        v[F_MONO] = mono_float(p, r->ds, r->de, digits);
        Py_DECREF(digits);
        if (v[F_MONO] == NULL)
            goto done;
    } else {
        v[F_MONO] = Py_NewRef(Py_None);
    }
    v[F_WALL] = Py_NewRef(r->wall ? r->wall : Py_None);
    v[F_LEVEL] = Py_NewRef(Py_None);
    if (r->pe > r->ps && !(r->pe - r->ps == 6 && memcmp(p + r->ps, "kernel", 6) == 0))
        v[F_PROGRAM] = PyUnicode_FromStringAndSize(p + r->ps, r->pe - r->ps);
    else
        v[F_PROGRAM] = Py_NewRef(r->pe > r->ps ? str_kernel : r->program ? r->program : Py_None);
    if (v[F_PROGRAM] == NULL)
        goto done;
    v[F_CONTINUATION] = PyBool_FromLong(r->continuation);
    v[F_PREFIXED] = PyBool_FromLong(r->prefixed);
    line = maker.alloc ? maker.alloc((PyTypeObject *)type, 0) : PyType_GenericAlloc((PyTypeObject *)type, 0);
    if (line == NULL)
        goto done;
    /* Its fields are strings, numbers, booleans and None: it can be in no reference cycle, so the cycle
     * collector need not walk it (as it stops walking such tuples). A block's lines live together until fed:
     * tracked, each collection on the way would walk them all again. */
    PyObject_GC_UnTrack(line);
    for (int f = 0; f < NFIELDS; f++) {
        if ((maker.set[f] ? maker.set[f](maker.descr[f], line, v[f]) : PyObject_SetAttr(line, field_names[f], v[f])) < 0) {
            Py_CLEAR(line);
            break;
        }
    }
done:
    for (int f = 0; f < NFIELDS; f++)
        Py_XDECREF(v[f]);
    return line;
}

PyDoc_STRVAR(parse_block_doc,
"parse_block(block, first, max_line, parse, ctime, logline) -> (lines, cut)\n\n"
"Every line of block (bytes; what follows its last newline is ignored), numbered from first, cut at max_line\n"
"bytes and decoded as UTF-8 with replacement, as a LogLine (the logline class given). Lines of known prefixes\n"
"are parsed here, the others by parse(number, text) in order; ctime is the parser's cache of ctime stamps.\n"
"cut: how many lines were longer than max_line.");

static PyObject *parse_block(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *block, *parse, *ctime, *type;
    long first;
    Py_ssize_t max_line;
    if (!PyArg_ParseTuple(args, "SlnOO!O:parse_block", &block, &first, &max_line, &parse, &PyDict_Type, &ctime,
                          &type))
        return NULL;
    if (!PyType_Check(type) || !PyCallable_Check(parse) || max_line < 0) {
        PyErr_SetString(PyExc_TypeError, "parse_block: parse must be callable, logline a class, max_line >= 0");
        return NULL;
    }
    if (learn_maker(type) < 0)
        return NULL;
    char *buf;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(block, &buf, &size) < 0)
        return NULL;
    PyObject *lines = PyList_New(0);
    if (lines == NULL)
        return NULL;
    Py_INCREF(block); /* buf stays valid whatever parse() does */
    long number = first, cut = 0;
    Py_ssize_t start = 0;
    while (start < size) {
        const char *nl = memchr(buf + start, '\n', (size_t)(size - start));
        if (nl == NULL)
            break;
        const char *p = buf + start;
        Py_ssize_t n = nl - p;
        start += n + 1;
        if (n > max_line) {
            n = max_line;
            cut++;
        }
        PyObject *line = NULL;
        struct parsed r;
        int known = plain_ascii(p, n) ? parse_plain(p, n, ctime, &r) : 0;
        if (known > 0) {
            line = make_line(type, number, p, n, &r);
            Py_XDECREF(r.stamp);
            Py_XDECREF(r.wall);
        } else if (known == 0) {
            PyObject *text = PyUnicode_DecodeUTF8(p, n, "replace");
            PyObject *num = PyLong_FromLong(number);
            if (text != NULL && num != NULL)
                line = PyObject_CallFunctionObjArgs(parse, num, text, NULL);
            Py_XDECREF(text);
            Py_XDECREF(num);
        }
        if (line == NULL || PyList_Append(lines, line) < 0) {
            Py_XDECREF(line);
            Py_DECREF(lines);
            Py_DECREF(block);
            return NULL;
        }
        Py_DECREF(line);
        number++;
    }
    Py_DECREF(block);
    return Py_BuildValue("(Nl)", lines, cut);
}

static PyMethodDef methods[] = {
    {"parse_block", parse_block, METH_VARARGS, parse_block_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lines",
    "Triage's per-line work in C: a block of kernel-log lines split, decoded and parsed in one call.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lines(void)
{
    for (int f = 0; f < NFIELDS; f++) {
        if (field_names[f] == NULL && (field_names[f] = PyUnicode_InternFromString(FIELD_NAMES[f])) == NULL)
            return NULL;
    }
    if (str_kernel == NULL && (str_kernel = PyUnicode_InternFromString("kernel")) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
