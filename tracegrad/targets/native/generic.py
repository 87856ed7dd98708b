"""Generic sizes: one C build serves every size of a varying dimension
(docs/native.md, "Generic sizes").

The native code generator writes sizes as C literals (loop bounds, strides,
buffer lengths, byte counts, ``1/n`` of a mean).  A function called with a
new batch size would therefore cost a C build per size.  Instead, the C
text of each size is compared with the texts of the sizes before it:

* the **skeleton** of a text is its code with every numeric literal cut
  out (comments do not count).  Two texts with the same skeleton differ
  only in numbers: the same graph, the same fusion, the same decisions
  (stack or heap, threads, row loops, unrolled loops) at both sizes;
* once a skeleton has been seen with two sets of numbers (or at once with
  ``dynamic=True``, against a probe at other sizes), the numbers that
  differ become **holes**: ``tg_d[k]`` (an integer: a size, a stride, a
  byte count) or ``tg_f[k]`` (a floating-point constant derived from sizes,
  such as the ``1/n`` of a mean), read from two arrays the Python driver
  hands to the module at each call (``tg_enter``); the numbers that agree
  stay literals, so what stays constant stays specialised;
* a later text **matches** a template when its skeleton is the same and
  every number that is not a hole equals the template's.  Then filling the
  holes with that text's numbers gives exactly that text: the generic
  module runs the same C statements as a module built for that size would,
  with its numbers read from memory instead of written in.  Anything else
  (another skeleton, another number where the template has a literal) is
  no match, and the size gets a build of its own: a wrong number is never
  the price of a saved build.

The generic text is C the compiler builds as any other (an array whose
length is a hole is a variable-length array; a ``static const`` table with
a hole loses its ``static``); a module that uses it passes its numbers
through ``tg_enter``/``tg_leave`` (a recursive mutex per shared object
serialises calls with different numbers; OpenMP threads read them as
globals).  This module only reads and writes text: which template a
process keeps, and the build, are the pipeline's and the loader's.
"""
from __future__ import annotations

import hashlib
import re

# what is not plain code: comments, strings, character constants, numbers
# (a number starts where no identifier or number goes on: b3 and tg_k0 are names)
# (the lookahead first: a position that cannot start one fails at once, 3x faster)
_TOKEN = re.compile(r"""
  (?=[/"'0-9.])(?:
    (?P<comment>//[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<char>'(?:[^'\\\n]|\\.)*')
  | (?<![A-Za-z_0-9.])(?P<num>(?:0[xX][0-9a-fA-F]*(?:\.[0-9a-fA-F]*)?(?:[pP][+-]?[0-9]+)?
             |(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[uUlLfF]*))
""", re.X | re.S)

_OMP_LOOP = ("#pragma omp parallel", "#pragma omp for")
_INT = re.compile(r"([0-9]+)(LL|ll|ULL|ull|)\Z")
_FLOAT = re.compile(r"((?:[0-9]+\.[0-9]*|[0-9]+(?=[eE]))(?:[eE][+-]?[0-9]+)?)(f?)\Z")
_COMMENT_NUM = re.compile(r"(?<![A-Za-z_0-9.])[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?")

# numbers that follow these are holes of every template, even where the
# texts it is made from agree: a kernel's most useful threads change with its
# size in steps (codegen.thread_count), so two sizes often agree and a third not
_ALWAYS = ("TG_THREADS(",)

# the end of the helpers at the top of a C text (native_kernels.c.j2)
_HELPERS_END = "\n// @tg-helpers-end"

# where tg_enter and tg_leave join the extension's methods (native_kernels.c.j2)
_METHODS = "static PyMethodDef tg_methods[] = {\n"


class Text:
    """A C text cut into code, numbers and comments."""

    __slots__ = ("pieces", "nums", "starts", "comments", "skeleton", "holeable", "always")

    def __init__(self, source):
        pieces = []         # ("c", text) code | ("n", index) number | ("m", index) comment
        nums, starts, comments, holeable = [], [], [], []
        always = set()      # numbers that are holes even where two sizes agree
        skel = []
        # the helpers before the mark are one piece of code (no size is
        # written there): cut no numbers out of them (0.4 ms of W3's 1.2)
        at = source.find(_HELPERS_END) + 1
        if at > 0:
            pieces.append(("c", source[:at]))
            skel.append(source[:at])
        for m in _TOKEN.finditer(source, at):
            if m.start() > at:
                code = source[at:m.start()]
                pieces.append(("c", code))
                skel.append(code)
            at = m.end()
            kind, text = m.lastgroup, m.group()
            if kind == "comment":
                pieces.append(("m", len(comments)))
                comments.append(text)
                skel.append("\0m")
            elif kind == "num":
                # a number on a preprocessor line (#define, #pragma GCC unroll)
                # stays a literal, but for an OpenMP loop's clauses
                # (num_threads, schedule's chunk: expressions evaluated at run time)
                line = source[source.rfind("\n", 0, m.start()) + 1:m.start()].lstrip()
                pieces.append(("n", len(nums)))
                nums.append(text)
                starts.append(m.start())
                holeable.append((not line.startswith("#") or line.startswith(_OMP_LOOP)) and
                                (_INT.match(text) or _FLOAT.match(text)) is not None)
                if source.endswith(_ALWAYS, 0, m.start()) and holeable[-1]:
                    always.add(len(nums) - 1)
                skel.append("\0n")
            else:
                pieces.append(("c", text))
                skel.append(text)
        if at < len(source):
            pieces.append(("c", source[at:]))
            skel.append(source[at:])
        self.pieces = pieces
        self.nums = nums
        self.starts = starts    # where each number begins in the source
        self.comments = comments
        self.holeable = holeable
        self.always = always
        self.skeleton = hashlib.sha256("".join(skel).encode()).hexdigest()


class Template:
    """A generic C text: the reference text's numbers at ``holes`` are read
    at run time (``tg_d``/``tg_f``), every other number is a literal.
    ``slot_keys``: for each hole, a key; holes of one key share a slot (else
    holes whose numbers agree in ``ref`` and ``others`` do)."""

    def __init__(self, ref, holes, others=(), slot_keys=None):
        self.ref = ref
        self.holes = tuple(sorted(holes))
        # positions whose numbers were the same in every text the template
        # was made from (one size written in several places) share a slot:
        # tg_d[0] is then "the batch size" wherever it appears; a text fills
        # a shared slot only where its numbers there agree too
        self.kinds = {}     # number index -> ("d" | "f", slot, C spelling)
        slots = {}
        nd = nf = 0
        for i in self.holes:
            t = ref.nums[i]
            m = _INT.match(t)
            kind = "d" if m else "f"
            suffix = m.group(2).lower() if m else _FLOAT.match(t).group(2)
            key = (kind, suffix, t, tuple(o.nums[i] for o in others)) \
                if i not in ref.always else i     # a slot of its own
            if slot_keys is not None:   # the caller knows which numbers are one
                key = (kind, suffix, slot_keys[i])
            slot = slots.get(key)
            if slot is None:
                slot = slots[key] = nd if kind == "d" else nf
                if kind == "d":
                    nd += 1
                else:
                    nf += 1
            if kind == "d":
                self.kinds[i] = ("d", slot, f"((unsigned long long)tg_d[{slot}])"
                                 if suffix == "ull" else f"tg_d[{slot}]")
            else:
                self.kinds[i] = ("f", slot, f"((float)tg_f[{slot}])" if suffix else
                                 f"tg_f[{slot}]")
        self.nd, self.nf = nd, nf
        self.comment_marks = _comment_marks([ref] + list(others))
        self.source = self._render()

    def values(self, text):
        """(ints, floats) that fill the holes to give ``text``, or None when
        ``text`` does not match (another skeleton, another number where
        this template has a literal, or two numbers where it reads one slot)."""
        ref = self.ref
        if text.skeleton != ref.skeleton or len(text.nums) != len(ref.nums):
            return None
        holes = self.kinds
        for i, (a, b) in enumerate(zip(ref.nums, text.nums)):
            if i not in holes and a != b:
                return None
        ints, floats = [None] * self.nd, [None] * self.nf
        for i in self.holes:
            kind, slot, _ = holes[i]
            t = text.nums[i]
            if kind == "d":
                m, r = _INT.match(t), _INT.match(ref.nums[i])
                if m is None or m.group(2).lower() != r.group(2).lower():
                    return None
                v = int(m.group(1))
                if v >= 1 << 63:
                    return None
                out = ints
            else:
                m, r = _FLOAT.match(t), _FLOAT.match(ref.nums[i])
                if m is None or m.group(2) != r.group(2):
                    return None
                v = float(m.group(1))
                out = floats
            if out[slot] is None:
                out[slot] = v
            elif out[slot] != v:
                return None
        return ints, floats

    def _render(self):
        ref = self.ref
        out = []
        for kind, x in ref.pieces:
            if kind == "c":
                out.append(x)
            elif kind == "n":
                out.append(self.kinds[x][2] if x in self.kinds else ref.nums[x])
            else:
                out.append(self.comment_marks.get(x, ref.comments[x]))
        text = "".join(out)
        # a table of constants with a hole is initialised at each call; a
        # hole in a struct (a large graph's frames of buffers) or outside a
        # function cannot be: such a text is not used (``ok``)
        lines = []
        depth, in_struct = 0, False
        self.ok = True
        for ln in text.split("\n"):
            code = ln.split("//", 1)[0]
            hole = "tg_d[" in code or "tg_f[" in code
            if hole and ln.lstrip().startswith("static const "):
                ln = ln.replace("static const ", "const ", 1)
            if code.startswith("struct ") and code.rstrip().endswith("{"):
                in_struct = True
            if hole and (in_struct or depth == 0):
                self.ok = False
            depth += code.count("{") - code.count("}")
            if in_struct and depth == 0:
                in_struct = False
            lines.append(ln)
        text = "\n".join(lines)
        return _with_entry(text, self.nd, self.nf)


def _comment_marks(texts):
    """Comments whose numbers differ between the texts, with each number
    that differs written ``?`` (a comment describes every size the
    generic text serves)."""
    marks = {}
    ref = texts[0]
    for j, c in enumerate(ref.comments):
        others = [t.comments[j] for t in texts[1:] if j < len(t.comments)]
        if all(o == c for o in others):
            continue
        nums = [_COMMENT_NUM.findall(x) for x in [c] + others]
        if all(len(n) == len(nums[0]) for n in nums):
            differs = [any(n[k] != nums[0][k] for n in nums) for k in range(len(nums[0]))]
        else:
            differs = [True] * len(nums[0])
        it = iter(differs)
        marks[j] = _COMMENT_NUM.sub(lambda m: "?" if next(it) else m.group(), c)
    return marks


def holes_between(texts):
    """The number positions that differ between texts of one skeleton, or
    None when one of them cannot be a hole (a hexadecimal float, a number
    in a preprocessor line, an integer in one text and a float in another)."""
    ref = texts[0]
    holes = set(ref.always)
    for t in texts[1:]:
        for i, (a, b) in enumerate(zip(ref.nums, t.nums)):
            if a == b:
                continue
            if not (ref.holeable[i] and t.holeable[i]):
                return None
            if (_INT.match(a) is None) != (_INT.match(b) is None):
                return None
            holes.add(i)
    return holes


def usable(source):
    """Can this C text be made generic?  Not a file built as several
    translation units (each would hold its own copy of the numbers), and
    only with the extension entry (the numbers are handed over by it)."""
    return "// @tg-prelude-end" not in source and _METHODS in source


_PRELUDE = """\
// Generic sizes (docs/native.md, "Generic sizes"): this text serves every
// size whose own C text differs from it only where it reads tg_d[k] (sizes,
// strides, byte counts: {nd}) and tg_f[k] (constants derived from sizes, such
// as the 1/n of a mean: {nf}).  The Python driver hands both to tg_enter at
// each call; a recursive mutex keeps calls with other numbers out until
// tg_leave.  Numbers marked ? in comments vary with the sizes.
#include <pthread.h>
#include <string.h>
static long long tg_d[{nd1}];
static double tg_f[{nf1}];
"""

_ENTRY = """\
// tg_enter(sizes, constants): take this module's numbers lock (waiting
// without the GIL) and set tg_d and tg_f from two bytes objects (int64 and
// float64 values); it returns the numbers it replaced when the same thread
// was already inside (a generated function called from a callback), else
// None.  tg_leave(previous) puts them back and releases the lock.
static pthread_mutex_t tg_gen_mutex;
static pthread_once_t tg_gen_once = PTHREAD_ONCE_INIT;
static int tg_gen_depth = 0;

static void tg_gen_init_mutex(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&tg_gen_mutex, &a);
    pthread_mutexattr_destroy(&a);
    tg_gen_depth = 0;
}

static void tg_gen_init(void)
{
    tg_gen_init_mutex();
    // a forked child starts with the lock free (its holder did not survive the fork)
    pthread_atfork(NULL, NULL, tg_gen_init_mutex);
}

static PyObject* py_tg_enter(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
    PyObject* prev;
    (void)self;
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) ||
            PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)({nd} * sizeof(long long)) ||
            PyBytes_GET_SIZE(args[1]) != (Py_ssize_t)({nf} * sizeof(double))) {
        PyErr_SetString(PyExc_TypeError, "tg_enter takes the bytes of {nd} int64 and {nf} float64 values");
        return NULL;
    }
    pthread_once(&tg_gen_once, tg_gen_init);
    if (pthread_mutex_trylock(&tg_gen_mutex) != 0) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&tg_gen_mutex);
        Py_END_ALLOW_THREADS
    }
    if (tg_gen_depth > 0) {
        prev = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(sizeof(tg_d) + sizeof(tg_f)));
        if (!prev) {
            pthread_mutex_unlock(&tg_gen_mutex);
            return NULL;
        }
        memcpy(PyBytes_AS_STRING(prev), tg_d, sizeof(tg_d));
        memcpy(PyBytes_AS_STRING(prev) + sizeof(tg_d), tg_f, sizeof(tg_f));
    } else {
        prev = Py_None;
        Py_INCREF(prev);
    }
    tg_gen_depth++;
    memcpy(tg_d, PyBytes_AS_STRING(args[0]), {nd} * sizeof(long long));
    memcpy(tg_f, PyBytes_AS_STRING(args[1]), {nf} * sizeof(double));
    return prev;
}

static PyObject* py_tg_leave(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 1 || (args[0] != Py_None && (!PyBytes_Check(args[0]) ||
            PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)(sizeof(tg_d) + sizeof(tg_f))))) {
        PyErr_SetString(PyExc_TypeError, "tg_leave takes what tg_enter returned");
        return NULL;
    }
    if (args[0] != Py_None) {
        memcpy(tg_d, PyBytes_AS_STRING(args[0]), sizeof(tg_d));
        memcpy(tg_f, PyBytes_AS_STRING(args[0]) + sizeof(tg_d), sizeof(tg_f));
    }
    tg_gen_depth--;
    pthread_mutex_unlock(&tg_gen_mutex);
    Py_RETURN_NONE;
}

"""

_METHOD_LINES = """\
    {"tg_enter", (PyCFunction)(void (*)(void))py_tg_enter, METH_FASTCALL, NULL},
    {"tg_leave", (PyCFunction)(void (*)(void))py_tg_leave, METH_FASTCALL, NULL},
"""


def _with_entry(text, nd, nf):
    """The generic text with its numbers' declarations at the top and
    tg_enter/tg_leave in the extension's entry."""
    fmt = dict(nd=nd, nf=nf, nd1=max(nd, 1), nf1=max(nf, 1))
    text = text.replace(_METHODS, _ENTRY.replace("{nd}", str(nd)).replace("{nf}", str(nf))
                        + _METHODS + _METHOD_LINES, 1)
    return _PRELUDE.format(**fmt) + text


class Registry:
    """The C texts a process has generated, by skeleton: the texts seen
    (at most ``SEEN`` per skeleton) and the generic templates made from
    them (at most ``TEMPLATES`` per skeleton), for at most ``SKELETONS``
    skeletons (the oldest forgotten first)."""

    SEEN, TEMPLATES, SKELETONS = 2, 3, 256

    def __init__(self):
        self.seen = {}
        self.templates = {}
        self.refused = set()    # skeletons whose generic text did not build
        self.made = 0       # templates made (each one C build)
        self.reused = 0     # texts served by a template made before

    def clear(self):
        self.seen.clear()
        self.templates.clear()
        self.refused.clear()

    def refuse(self, source):
        """A generic text that did not build: its skeleton stays specialised
        in this process.  True when ``source`` was one of ours."""
        for skel, tps in self.templates.items():
            for tp in tps:
                if tp.source == source:
                    tps.remove(tp)
                    self.refused.add(skel)
                    return True
        return False

    def resolve(self, source, probes=None):
        """(C text, hole values): a template's text and the values that give
        ``source`` (a template made before, or made now from ``source`` and
        an earlier text of its skeleton, or one of the texts ``probes()``
        gives: the same functions at other sizes, asked for only where no
        earlier text serves), or (``source``, None) where the C stays
        specialised."""
        if not usable(source):
            return source, None
        t = Text(source)
        if t.skeleton in self.refused:
            return source, None
        tps = self.templates.get(t.skeleton, [])
        for tp in reversed(tps):
            v = tp.values(t)
            if v is not None:
                self.reused += 1
                return tp.source, v
        # a template that does not match is widened against its own text
        earlier = [tp.ref for tp in tps] + list(self.seen.get(t.skeleton, ()))
        made = self._make(t, tps, earlier)
        if made is None and probes is not None:
            made = self._make(t, tps, [Text(p) for p in reversed(probes()) if usable(p)])
        if made is not None:
            return made
        if len(self.seen) >= self.SKELETONS and t.skeleton not in self.seen:
            oldest = next(iter(self.seen))
            del self.seen[oldest]
            self.templates.pop(oldest, None)
        seen = self.seen.setdefault(t.skeleton, [])
        t.pieces = None     # a text seen is compared by its numbers and comments only
        seen.append(t)
        del seen[:-self.SEEN]
        return source, None

    def _make(self, t, tps, earlier):
        """(template text, values) of a template made from ``t`` and the
        latest of ``earlier`` with its skeleton and other numbers, or None."""
        for e in reversed(earlier):
            if e.skeleton != t.skeleton or e.nums == t.nums:
                continue
            holes = holes_between([t, e])
            if holes is None:
                continue
            # widening: a dimension that varied before stays generic
            for tp in tps:
                more = holes_between([t, tp.ref])
                if more is not None:
                    holes |= more | set(tp.holes)
            tp = Template(t, holes, [e])
            v = tp.values(t)
            if v is None or not tp.ok:
                continue
            tps = self.templates.setdefault(t.skeleton, tps)
            tps.append(tp)
            del tps[:-self.TEMPLATES]
            self.made += 1
            return tp.source, v
        return None
