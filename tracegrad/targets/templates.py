"""The templates' folder and the one Jinja2 environment every target
renders with.

Light on purpose: the cache (its key holds the templates' hash) and the
native builder read the folder on a cache hit, before networkx or Jinja2
load.  ``safe_text`` is the filter every template prints user-derived text
through.
"""
from __future__ import annotations

import os

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tracegrad/
TEMPLATE_DIRS = [
    os.path.join(_PACKAGE, "codegen_templates"),
    # running from a source checkout: the top-level folder
    os.path.join(os.path.dirname(_PACKAGE), "codegen_templates"),
]


def template_dir():
    for d in TEMPLATE_DIRS:
        if os.path.isdir(d):
            return d
    raise FileNotFoundError("tracegrad's codegen_templates folder is missing from the installation")


_env = None


def environment():
    """The Jinja2 environment of every target's templates."""
    global _env
    if _env is None:
        import jinja2
        # auto_reload off: the templates ship with the package and do not
        # change while a process runs, so a loaded one is never read again
        # (a process whose user can no longer read the package keeps working)
        _env = jinja2.Environment(loader=jinja2.FileSystemLoader(template_dir()),
                                  trim_blocks=True, lstrip_blocks=True, auto_reload=False,
                                  keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
        # the templates pass every user-derived string (names, docstrings,
        # quoted source lines) through this filter: see safe_text
        _env.filters["safe_text"] = safe_text
    return _env


# Short escapes safe_text writes; every other unsafe character becomes \xNN,
# \uNNNN or \UNNNNNNNN.
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def safe_text(text):
    r"""User text (a name, a path, a quoted source line) as text that cannot
    leave the ``#`` comment, the triple-quoted docstring or the CUDA ``//``
    comment it is printed in: the one function for every user-derived string
    that reaches generated source other than as an identifier or a repr().

    The result is the body of a valid Python string literal, escaped as
    ``repr`` escapes: backslashes doubled; line breaks of every kind (all
    that ``str.splitlines`` splits on), NUL, tabs and every other
    non-printable character (bidi controls included) as ``\n``, ``\xNN``,
    ``\uNNNN``; a quote that would extend a run of quotes (so no triple
    quote survives), or that stands at either end, as ``\"``/``\'``, so no
    concatenation of such pieces with quote-free text closes a docstring.
    It never ends with a backslash (a C ``//`` comment would continue onto
    the next line).  Ordinary names and source lines come through unchanged.
    """
    s = str(text)
    if s.isprintable() and "\\" not in s and '"' not in s and "'" not in s:
        return s   # the common case: nothing to escape (a generator prints hundreds)
    out = []
    last = len(s) - 1
    for i, c in enumerate(s):
        if c in _ESCAPES:
            out.append("\\x5c" if c == "\\" and i == last else _ESCAPES[c])
        elif c in "\"'":
            out.append("\\" + c if i in (0, last) or s[i - 1] == c else c)
        elif c.isprintable():
            out.append(c)
        else:
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x100 else
                       f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)
