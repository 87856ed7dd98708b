"""New sizes without the pipeline: a function's generated module as a
formula of its sizes, with guards (docs/native.md, "Sizes as parameters").

From a function's second size on, its native C has the generic structure
(``generic.py``).  A plan goes further: the transform, the passes and the
code generator run once on the trace with every size of 2 or more a
symbol (``ops.symbolic``).  That run records every decision a size steered
(a guard: ``rows >= 8192`` was true) and where each size went into the C
and the Python driver (a formula over the trace's sizes).  Its texts,
evaluated at the trace's own sizes, must equal the texts of an ordinary run
at those sizes (else no plan).  Then every number that came from a size is
read at run time: ``tg_d[k]``/``tg_f[k]`` in the C (one build), ``_D[k]`` in
the driver (one Python module, compiled once).

A later call whose trace has the same structure (``Trace.structure_sizes``:
the same ops, attributes, dtypes, constants and source lines, sizes cut out)
and whose sizes pass every guard takes the plan's module with that call's
numbers: what the pipeline would have generated for those sizes, without
running it (no transform, no passes, no code generation, no compiler).  A
guard that fails, or a number whose text would not be the same kind of
literal, sends the call down the ordinary path.
"""
from __future__ import annotations

import hashlib
import io
import logging
import math
import re
import tokenize

from tracegrad.ops import symbolic
from tracegrad.runtime import cache
from tracegrad.targets import cstyle
from tracegrad.targets.native import codegen as native, generic

log = logging.getLogger("tracegrad.native")

# the pipeline runs once more, symbolically, for a plan: not for very large graphs
MAX_NODES = 4000

_MARK = re.compile(re.escape(symbolic.MARK) + r"(\d+)" + re.escape(symbolic.MARK_END))
_C_PLACEHOLDER = "@TG-C-SOURCE@"
_INT_TEXT = re.compile(r"[0-9]+\Z")
_SUFFIX = re.compile(r"[uUlLfF]*\Z")
_PY_NAME = re.compile(r"_TG(\d+)_")


class _Name:
    """A name written into the driver where a list would be (the plan's ints)."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name

    __repr__ = __str__


class NoPlan(Exception):
    """Why a function gets no plan (said at DEBUG level)."""


class Plan:
    """The module of a function at every size that passes its guards."""

    def __init__(self, values_fn, c_slots, py_slots, code, filename):
        self._values = values_fn     # sizes -> the formulas' values, or None
        self.c_slots = c_slots      # per tg_d / tg_f slot: (index in values, spec, kind)
        self.py_slots = py_slots    # per _D entry: (index in values, spec, kind)
        self.code = code
        self.filename = filename

    def numbers(self, sizes):
        """(ints, floats, driver values) at ``sizes``, or None where a guard
        fails or a number would not be written as the same kind of literal."""
        try:
            vals = self._values(sizes)
        except (ArithmeticError, ValueError):
            return None
        if vals is None:
            return None
        c = [_literal(vals[j], spec, kind) for j, spec, kind in self.c_slots]
        py = [_literal(vals[j], spec, kind) for j, spec, kind in self.py_slots]
        if None in c or None in py:
            return None
        ints = [x for x, (_, _, kind) in zip(c, self.c_slots) if kind == "d"]
        floats = [x for x, (_, _, kind) in zip(c, self.c_slots) if kind == "f"]
        return ints, floats, tuple(py)

    def namespace(self, sizes):
        """The plan's module at ``sizes`` (a dict, as a cache entry's), or None."""
        got = self.numbers(sizes)
        if got is None:
            return None
        ints, floats, py = got
        ns = {"__name__": "tracegrad_generated_plan", "__file__": self.filename,
              "_PLAN_INTS": ints, "_PLAN_FLOATS": floats, "_PLAN_D": py}
        exec(self.code, ns)
        return ns


def _literal(value, spec, kind):
    """The number ``value`` formatted as the generator formatted it (``spec``)
    read back, or None where that text is not a plain literal of ``kind``
    ("d": a non-negative integer below 2**63, "f": a finite float)."""
    if kind == "d":
        if type(value) is not int or value < 0 or value >= 1 << 63:
            return None
        text = _spell(value, spec)
        return int(text) if _INT_TEXT.match(text) else None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    text = _spell(value, spec)
    return float(text) if generic._FLOAT.match(text) else None


def _spell(value, spec):
    """``value`` as the generator wrote it (a marker's format spec; "r": repr)."""
    return repr(value) if spec == "r" else format(value, spec)


def make(trace, graph_of, functions_of, rec, header):
    """A Plan for ``trace`` (its module at the trace's own sizes is what the
    ordinary pipeline generates), or None with a DEBUG line saying why.
    ``graph_of(trace)``: the transform's optimised graph; ``functions_of(g)``:
    the generator's list of (graph, name, argument names, docstring);
    ``header``: source, transform and key for the module's header."""
    try:
        return _make(trace, graph_of, functions_of, rec, header)
    except NoPlan as e:
        log.debug("tracegrad: no size plan for %s: %s", header.get("source"), e)
        return None
    except Exception as e:  # noqa: BLE001 -- a plan is an optimisation: the ordinary path serves
        if type(e).__name__ == "NativeBuildError":
            log.info("tracegrad: the size plan of %s did not build (%s); its sizes take the "
                     "ordinary path", header.get("source"), str(e).splitlines()[0])
        else:
            log.debug("tracegrad: no size plan for %s: %s: %s", header.get("source"),
                      type(e).__name__, e)
        return None


def _texts(trace, graph_of, functions_of, rec, header):
    """(C text, driver text) the pipeline makes of ``trace`` in the generic
    structure, the driver around a placeholder for the C."""
    fns = functions_of(graph_of(trace))
    module, lowered, g_of = native._lower(fns, generic=True)
    csrc = native.c_source(fns, lowered, g_of, rec, generic=True)
    driver = native.render_driver(module, lowered, g_of, _C_PLACEHOLDER,
                                  (_Name("_PLAN_INTS"), _Name("_PLAN_FLOATS")), rec, **header)
    return csrc, driver


def _make(trace, graph_of, functions_of, rec, header):
    if len(trace.nodes) > MAX_NODES:
        raise NoPlan(f"{len(trace.nodes)} nodes (a plan is made for at most {MAX_NODES})")
    if not native.generic_sizes_usable(rec):
        raise NoPlan("the build has no extension entry")
    recording = symbolic.Recording()
    sym_trace = trace.with_sizes(recording.symbol)
    prev = symbolic.ACTIVE.rec
    symbolic.ACTIVE.rec = recording
    try:
        csrc, driver = _texts(sym_trace, graph_of, functions_of, rec, header)
    finally:
        symbolic.ACTIVE.rec = prev
    if recording.special:
        why, hint, where = recording.special[0]
        log.debug("tracegrad: a size (%s) was specialised (%s) at %s", hint, why,
                  "; ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in where[-3:]))
    # the symbolic run must have made what the ordinary run makes
    c_plain, driver_plain = _texts(trace, graph_of, functions_of, rec, header)
    formulas = _Formulas(recording)
    if formulas.at_hint(csrc) != c_plain or formulas.at_hint(driver) != driver_plain:
        raise NoPlan("the symbolic run made other texts than the ordinary run")
    if not generic.usable(c_plain):
        raise NoPlan("the C text cannot be generic (several translation units)")
    template, c_slots = _c_template(csrc, formulas)
    source, py_slots = _driver_source(driver, formulas)
    source = source.replace(cstyle.py_string(_C_PLACEHOLDER), cstyle.py_string(template.source), 1)
    values_fn, index = formulas.function()
    c_slots = [(index[n], spec, kind) for n, spec, kind in c_slots]
    py_slots = [(index[n], spec, kind) for n, spec, kind in py_slots]
    # the module runs (and its C builds) once here, at the trace's own sizes
    hint = [s.hint for s in recording.inputs]
    plan = Plan(values_fn, c_slots, py_slots, None, None)
    got = plan.numbers(hint)
    if got is None:
        raise NoPlan("the plan's numbers do not give back the trace's own")
    ints, floats, py = got
    source = _with_defaults(source, ints, floats, py)
    digest = hashlib.sha256(source.encode()).hexdigest()[:32]
    from tracegrad._version import __version__
    # an ordinary cache entry (bounded and pruned with the others), keyed by its text
    parts = {"backend": "native", "function": header.get("source"), "plan": digest,
             "version": __version__}
    ns = cache.store(cache.key_hash(parts), source, parts)
    plan.code = compile(source, ns["__file__"], "exec")
    plan.filename = ns["__file__"]
    return plan


class _Formulas:
    """The recording's markers and guards as Python code over the sizes."""

    def __init__(self, recording):
        self.rec = recording
        # every SSA name's value at the hint (for the texts at the hint)
        env = {"v": [s.hint for s in recording.inputs], "math": math, "abs": abs}
        for name, src in recording.lines:
            env[name] = eval(src, env)  # noqa: S307 -- our own arithmetic on numbers
        self._env = env
        self.extra_guards = {}      # specialised where a number could not be a hole

    def value(self, name):
        if name.startswith("v["):
            return self._env["v"][int(name[2:-1])]
        return self._env[name]

    def text(self, k):
        """Marker k's text at the hint."""
        name, spec, _ = self.rec.marks[k]
        return _spell(self.value(name), spec)

    def at_hint(self, text):
        return _MARK.sub(lambda m: self.text(int(m.group(1))), text)

    def specialise(self, k):
        name, spec, _ = self.rec.marks[k]
        self.extra_guards[f"({name} == {self.value(name)!r})"] = True
        return self.text(k)

    def function(self):
        """(sizes -> tuple of values or None, index of each SSA name in the
        tuple): the guards checked, the formulas the markers need computed."""
        rec = self.rec
        guards = dict(rec.guards)
        guards.update(self.extra_guards)
        outputs = sorted({name for name, _, _ in rec.marks if not name.startswith("v[")},
                         key=lambda n: int(n[1:]))
        inputs = sorted({name for name, _, _ in rec.marks if name.startswith("v[")})
        names = set(outputs)
        for src in guards:
            names.update(re.findall(r"\bs\d+\b", src))
        lines = []
        for name, src in reversed(rec.lines):      # only the lines something needs
            if name in names:
                names.update(re.findall(r"\bs\d+\b", src))
                lines.append(f"    {name} = {src}")
        lines.reverse()
        body = ["def _plan_values(v):"] + lines
        for src, outcome in guards.items():
            body.append(f"    if {'not ' if outcome else ''}{src}:")
            body.append("        return None")
        order = outputs + inputs
        body.append(f"    return ({''.join(n + ', ' for n in order)})")
        env = {"math": math, "abs": abs}
        exec(compile("\n".join(body), "<tracegrad size plan>", "exec"), env)  # noqa: S102
        return env["_plan_values"], {n: i for i, n in enumerate(order)}


def _c_template(csrc, formulas):
    """(generic.Template of the marked C text, its slots as (SSA name, spec,
    kind) in tg_d then tg_f order)."""
    marks = formulas.rec.marks
    spans = [(m.start(), m.end(), m.lastgroup) for m in generic._TOKEN.finditer(csrc)
             if m.lastgroup in ("comment", "string", "char")]
    out, at, code_at = [], 0, {}
    length, si = 0, 0
    for m in _MARK.finditer(csrc):
        k = int(m.group(1))
        piece = csrc[at:m.start()]
        out.append(piece)
        length += len(piece)
        at = m.end()
        while si < len(spans) and spans[si][1] <= m.start():
            si += 1
        inside = spans[si][2] if si < len(spans) and spans[si][0] <= m.start() else None
        line = csrc[csrc.rfind("\n", 0, m.start()) + 1:m.start()].lstrip()
        if inside == "comment":
            text = "?"
        elif inside is not None or (line.startswith("#") and not line.startswith(generic._OMP_LOOP)):
            text = formulas.specialise(k)        # a string, a preprocessor line: a literal
        else:
            text = formulas.text(k)
            code_at[length] = k
        out.append(text)
        length += len(text)
    out.append(csrc[at:])
    ref = generic.Text("".join(out))
    holes, slots = set(), {}
    found = 0
    for i, start in enumerate(ref.starts):
        k = code_at.get(start)
        if k is None:
            continue
        found += 1
        name, spec, typ = marks[k]
        text = formulas.text(k)
        if not ref.holeable[i] or not ref.nums[i].startswith(text) or \
                not _SUFFIX.match(ref.nums[i], len(text)) or \
                (typ is int) != (generic._INT.match(ref.nums[i]) is not None):
            raise NoPlan(f"a size in the C is part of another token: {ref.nums[i]!r}")
        if formulas.value(name) < 0:
            raise NoPlan("a negative number in the C")
        holes.add(i)
        slots[i] = (name, spec)
    if found != len(code_at):
        raise NoPlan("a size in the C is not a number of its own (part of a name?)")
    tp = generic.Template(ref, holes, slot_keys=slots)
    if not tp.ok:
        raise NoPlan("a size in the C outside a function")
    order = {}
    for i in tp.holes:
        kind, slot, _ = tp.kinds[i]
        order[(kind, slot)] = (slots[i][0], slots[i][1], kind)
    c_slots = [order[("d", j)] for j in range(tp.nd)] + [order[("f", j)] for j in range(tp.nf)]
    return tp, c_slots


def _driver_source(driver, formulas):
    """(the driver with every size in its code read from ``_D``, the _D
    entries as (SSA name, spec, kind))."""
    marks = formulas.rec.marks
    named = _MARK.sub(lambda m: f"_TG{m.group(1)}_", driver)
    decide = {}
    for tok in tokenize.generate_tokens(io.StringIO(named).readline):
        for m in _PY_NAME.finditer(tok.string):
            k = int(m.group(1))
            if tok.type == tokenize.COMMENT:
                decide[k] = "?"
            elif tok.type == tokenize.NAME and tok.string == m.group():
                decide[k] = None         # a number of its own in the code: read from _D
            else:
                decide[k] = formulas.specialise(k)   # in a string or a name: a literal
    slots, index = [], {}

    def put(m):
        k = int(m.group(1))
        how = decide.get(k, "")
        if how is None:
            name, spec, typ = marks[k]
            if formulas.value(name) < 0:
                raise NoPlan("a negative number in the driver")
            key = (name, spec)
            if key not in index:
                index[key] = len(slots)
                slots.append((name, spec, "d" if typ is int else "f"))
            return f"_D[{index[key]}]"
        return how if how else formulas.text(k)
    return _PY_NAME.sub(put, named), slots


def _with_defaults(source, ints, floats, py):
    """The plan's module, runnable as it is (at the trace's own sizes) and
    with other sizes handed in (``_PLAN_INTS``, ``_PLAN_FLOATS``, ``_PLAN_D``)."""
    head = (f"\n# Sizes as parameters (docs/native.md): this module serves every size that\n"
            f"# passes its plan's guards; each size's numbers are handed in as these names.\n"
            f"_PLAN_INTS = globals().get('_PLAN_INTS', {ints!r})\n"
            f"_PLAN_FLOATS = globals().get('_PLAN_FLOATS', {floats!r})\n"
            f"_D = globals().get('_PLAN_D', {tuple(py)!r})\n")
    mark = '\nTARGET = "native"\n'
    return source.replace(mark, mark + head, 1)
