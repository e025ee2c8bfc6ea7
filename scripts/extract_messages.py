#!/usr/bin/env python3
"""Extract the user-facing error and warning texts of an engine (or a library around it) from its sources.

A maintenance script, not part of the product (nothing in ``oomguard`` imports it; stdlib only). It feeds the
reviewed message tables ``oomguard/engines/vllm/messages.json``, ``oomguard/engines/llamacpp/messages.json`` and
``oomguard/diagnose/layer_messages.json``: a person reads its candidates, picks the texts users hit, and writes a
row per message with a class and a stage. ``--verify`` then proves that every needle of a table is verbatim in the
sources and says in which versions.

What it reads
  * Python (``*.py``, parsed with ``ast``): ``raise X(...)``, exception objects built anywhere (``X(...)`` where
    X ends in Error/Exception/Warning), ``assert cond, "..."``, ``warnings.warn(...)``, logger calls
    (``logger.error/warning/exception/critical/fatal`` and ``*_once``; ``--levels`` picks the levels),
    ``create_error_response(...)``, ``message=``/``msg=``/``detail=`` keyword arguments and defaults, strings
    assigned to ``msg``/``message``/``err``/``error``/``reason``... variables, and the names of exception classes
    (tracebacks print them: ``huggingface_hub.errors.GatedRepoError``). A message may be a literal, an implicit
    concatenation, an f-string, a ``"..." % args`` / ``"...".format(...)`` expression, a ``+`` chain, or a local
    variable assigned such a value earlier in the same function.
  * C and C++ (``*.c *.cc *.cpp *.cu *.cuh *.h *.hpp``, regexes): ``LLAMA_LOG_*``, ``GGML_LOG_*``, ``LOG_ERR/WRN``,
    ``SRV_*``/``SLT_*``, ``GGML_ABORT``/``ggml_abort``, ``fprintf(stderr, ...)``, ``throw std::*(...)``,
    ``send_error(...)``/``format_error_response(...)``, NCCL's ``WARN(...)``/``INFO(...)``, PyTorch's
    ``TORCH_CHECK*``/``TORCH_WARN*``/``C10_THROW_ERROR``/``c10::str(...)``, ``ss << "..."`` streams, string
    returns (``return "..."`` in error-string tables), assignments to err/msg/reason/detail variables, and
    ``*_error`` type-name literals. ``string_format(...)``/``format(...)`` wrappers are unwrapped, ``"%" PRId64``
    becomes a placeholder, and ``"%s: "`` + ``__func__`` becomes the enclosing function's name, as the log line
    shows it (a message inside a ``#define`` is credited to the macro).
  * Binaries (``--binary``): printable strings of a shared library (e.g. CUDA's ``libcudart.so``, whose
    ``cudaGetErrorString`` table is what PyTorch prints after "CUDA error: "), keeping those that read like
    messages.

Placeholders (``%s``, ``%.2f``, ``{x}``, ``{}``, f-string fields, non-literal ``+`` operands) become ``*`` in
``text``; ``literals`` lists the fixed pieces between them, stripped (a needle must sit inside one of them).

Usage
  python scripts/extract_messages.py [options] SOURCE [SOURCE ...] [-o candidates.jsonl]
  python scripts/extract_messages.py --verify TABLE.json CANDIDATES.jsonl [...] [--write-sources]

  SOURCE is ``NAME@VERSION=PATH`` (PATH a directory or a single file). Repeat a NAME with several versions and
  identical texts are merged, listing every version that has them; repeat NAME@VERSION with several PATHs to read
  parts of a tree. Files are named from the last ``/NAME/`` of their path on ("vllm/config/model.py").

  The tables in the package were made from these runs (the inputs are not in the repository):

  # vLLM wheels 0.6.6 ... 0.33.0 (python sources), unpacked as $WHEELS/v<version>/vllm; info kept too
  python scripts/extract_messages.py -o candidates/vllm.jsonl --levels info,warning,error,exception,critical,fatal \
      $(for d in $WHEELS/v*; do v=${d##*/v}; echo "vllm@$v=$d/vllm"; done)

  # llama.cpp vendored in the llama-cpp-python sdist
  #   pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d $SRC; tar xzf ... -C $SRC
  L=$SRC/llama_cpp_python-0.3.36/vendor/llama.cpp; V=llama.cpp@0.3.36
  python scripts/extract_messages.py -o candidates/llamacpp.jsonl \
      --exclude 'tests/*' --exclude 'webui/*' --exclude 'bench/*' \
      $V=$L/src $V=$L/common $V=$L/tools/server $V=$L/tools/mtmd $V=$L/ggml/src/ggml-cuda $V=$L/ggml/src/gguf.cpp \
      $V=$L/ggml/src/ggml-alloc.c $V=$L/ggml/include/ggml.h $V=$L/ggml/src/ggml-backend.cpp $V=$L/ggml/src/ggml.c

  # the layers: wheels from `pip download --no-deps --only-binary :all: <pkg>==<version>` unpacked with
  # `python -m zipfile -e` (transformers and ray: only the files that speak to users about loading and
  # scheduling); PyTorch and NCCL from verbatim excerpts of pytorch/pytorch and NVIDIA/nccl sources (the
  # allocator's OOM text, NCCLUtils, ProcessGroupNCCL's watchdog, torch/cuda/__init__.py, nccl src/init.cc and
  # src/misc/shmutils.cc) kept under excerpts/<name>/<path as in the repository>; the CUDA runtime's texts
  # from the nvidia-cuda-runtime-cu12 wheel's libcudart.so
  S=$SRC; T=$S/transformers-4.46.3/transformers; R=$S/ray-2.60.0/ray
  python scripts/extract_messages.py -o candidates/layers.jsonl \
      --exclude 'resources/*' --exclude '_generated/*' --exclude 'types/*' \
      transformers@4.46.3=$T/utils/hub.py transformers@4.46.3=$T/models/auto ... (same for 5.24.0) \
      huggingface_hub@0.26.5=$S/huggingface_hub-0.26.5/huggingface_hub huggingface_hub@2.4.0=... \
      openai@1.55.0=$S/openai-1.55.0/openai openai@3.57.0=... httpx@0.28.1=$S/httpx-0.28.1/httpx \
      ray@2.60.0=$R/exceptions.py ray@2.60.0=$R/util/placement_group.py ... \
      torch@main=$S/excerpts/torch torch@1.x=$S/excerpts/torch-1.x/torch nccl@2.x=$S/excerpts/nccl \
      --binary cudart@12.9=$S/nvidia_cuda_runtime_cu12-12.9.79/nvidia/cuda_runtime/lib/libcudart.so.12

  # prove a reviewed table against the candidates (exit status 1 when a needle is not verbatim in any text),
  # and refresh each row's `source` from them
  python scripts/extract_messages.py --verify oomguard/engines/vllm/messages.json candidates/vllm.jsonl --write-sources

Options
  -o FILE            write JSON Lines there instead of stdout
  --exclude GLOB     skip files whose path relative to the SOURCE root matches (repeatable)
  --levels L,L,...   logger levels kept (default: warning,error,exception,critical,fatal)
  --binary SOURCE    a shared library to take printable strings from (repeatable)
  --min-chars N      drop texts whose literal part is shorter than N characters (default 8)
  --verify TABLE CANDIDATES...   check a table's needles; prints one line per row with the versions it is found in
  --write-sources    with --verify: rewrite each row's `source` as "<file>:<function> (<versions>)" from the
                     candidates; a row whose `source` already names a file keeps that file if the needle is there.
                     Versions run over the versions read: "0.8.5-0.33.0" means every wheel read in between;
                     with three versions or fewer they are listed.

Output: one JSON object per distinct (package, text) with keys ``package``, ``text``, ``literals``, ``kinds``
(``raise:ValueError``, ``log:warning``, ``assert``, ``warn``, ``class``, ``assign:message``, ``c:LLAMA_LOG_ERROR``,
``c:throw runtime_error``, ``binary`` ...), ``sites`` (``file:function``, the first 8), ``versions`` (sorted) and
``n_versions``.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import re
import sys
from collections import defaultdict
from typing import Iterable, Iterator

WILD = "*"
PY_LEVELS_DEFAULT = ("warning", "error", "exception", "critical", "fatal")
C_EXT = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp")

# ----------------------------------------------------------------------------------------------- placeholders

_PCT = re.compile(r"%%|%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t|q)?"
                  r"[diouxXeEfFgGcrsaAp]|%\.\*s|%\"\s*PRI\w+\s*\"")
_BRACE = re.compile(r"\{\{|\}\}|\{[^{}]*\}")


def pct_to_wild(text: str) -> str:
    return _PCT.sub(lambda m: "%" if m.group(0) == "%%" else WILD, text)


def brace_to_wild(text: str) -> str:
    return _BRACE.sub(lambda m: {"{{": "{", "}}": "}"}.get(m.group(0), WILD), text)


def squash(text: str) -> str:
    """Merge runs of wildcards, keep the text otherwise verbatim."""
    return re.sub(r"(?:\*\s*){2,}", lambda m: WILD + (" " if m.group(0).endswith(" ") else ""), text)


def literals_of(text: str) -> list[str]:
    return [p for p in (s.strip() for s in text.split(WILD)) if p]


def version_key(v: str) -> tuple:
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"[.\-+]", v))


# ----------------------------------------------------------------------------------------------- Python sources

class _PyMessages(ast.NodeVisitor):
    LOG_NAMES = re.compile(r"^(?:logger|logging|log|_logger|LOGGER|self\.logger|self\._logger|init_logger\(.*\))$")

    def __init__(self, levels: Iterable[str]) -> None:
        self.levels = set(levels)
        self.found: list[tuple[str, str, str]] = []  # (text, kind, function)
        self.stack: list[str] = []
        self.assigns: list[dict[str, list[ast.AST]]] = [{}]
        self._seen_calls: set[int] = set()

    # -- helpers
    def func(self) -> str:
        return ".".join(self.stack) or "<module>"

    def text(self, node: ast.AST | None, depth: int = 0) -> str | None:
        """The message an expression builds, placeholders as WILD; None when it holds no literal text."""
        if node is None or depth > 6:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    parts.append(v.value)
                else:
                    parts.append(WILD)
            out = "".join(parts)
            return out if out.replace(WILD, "").strip() else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            left = self.text(node.left, depth + 1)
            return pct_to_wild(left) if left is not None else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.text(node.left, depth + 1), self.text(node.right, depth + 1)
            if left is None and right is None:
                return None
            return (left if left is not None else WILD) + (right if right is not None else WILD)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "format":
                base = self.text(f.value, depth + 1)
                return brace_to_wild(base) if base is not None else None
            if isinstance(f, ast.Attribute) and f.attr == "join" and node.args:
                return None
            if isinstance(f, ast.Name) and f.id in ("str", "repr") and node.args:
                return self.text(node.args[0], depth + 1)
            if isinstance(f, ast.Attribute) and f.attr in ("strip", "rstrip", "lstrip"):
                return self.text(f.value, depth + 1)
            return None
        if isinstance(node, ast.Name):
            for scope in reversed(self.assigns):
                if node.id in scope:
                    texts = [t for t in (self.text(v, depth + 1) for v in scope[node.id]) if t is not None]
                    if texts:
                        # `msg = "a"; msg += "b"` -> "a" "b"; otherwise the last assignment
                        return "".join(texts)
            return None
        if isinstance(node, ast.IfExp):
            return self.text(node.body, depth + 1) or self.text(node.orelse, depth + 1)
        if isinstance(node, ast.Tuple) and node.elts:
            return self.text(node.elts[0], depth + 1)
        return None

    def add(self, node: ast.AST | None, kind: str, pct: bool = False) -> None:
        text = self.text(node)
        if text is None:
            return
        if pct:
            text = pct_to_wild(text)
        self.found.append((text, kind, self.func()))

    # -- scopes
    def _scope(self, node: ast.AST) -> None:
        self.stack.append(getattr(node, "name", "?"))
        self.assigns.append({})
        self.generic_visit(node)
        self.assigns.pop()
        self.stack.pop()

    visit_AsyncFunctionDef = _scope

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        # `def __init__(self, message: str = "Connection error.")`: a default message is a message
        args = node.args.args + node.args.kwonlyargs
        defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + list(node.args.defaults) + \
            list(node.args.kw_defaults)
        for arg, default in zip(args, defaults):
            if default is not None and arg.arg in ("message", "msg", "detail"):
                self.stack.append(node.name)
                self.add(default, "default:message")
                self.stack.pop()
        self._scope(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        # exception classes: tracebacks print their names ("huggingface_hub.errors.GatedRepoError: ...")
        if re.search(r"(?:Error|Exception|Warning)$", node.name) or any(
                re.search(r"(?:Error|Exception)$", _call_name(b)) for b in node.bases):
            self.found.append((node.name, "class", ".".join(self.stack + [node.name])))
        self._scope(node)

    _MSG_VAR = re.compile(r"^_?(?:\w*_)?(?:msg|message|err|error|detail|reason|warning|hint)(?:_\w*)?$", re.I)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.assigns[-1][target.id] = [node.value]
                if self._MSG_VAR.match(target.id):
                    # `message = f"... Cannot access gated repo for url {url}."` then `raise _format(Err, message)`
                    self.add(node.value, "assign:message")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name) and node.value is not None:
            self.assigns[-1][node.target.id] = [node.value]
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name) and isinstance(node.op, ast.Add):
            self.assigns[-1].setdefault(node.target.id, []).append(node.value)
        self.generic_visit(node)

    # -- message sites
    def visit_Assert(self, node: ast.Assert) -> None:
        if node.msg is not None:
            self.add(node.msg, "assert")
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc
        if isinstance(exc, ast.Call):
            name = _call_name(exc.func)
            arg = exc.args[0] if exc.args else next((k.value for k in exc.keywords if k.arg in ("message", "msg")), None)
            if self.text(arg) is None:   # raise _format(GatedRepoError, message, response): the first text argument
                arg = next((a for a in exc.args[1:] if self.text(a) is not None), arg)
            self.add(arg, f"raise:{name.rsplit('.', 1)[-1]}")
            self._seen_calls.add(id(exc))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node.func)
        last = name.rsplit(".", 1)[-1]
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        for kw in node.keywords:
            if kw.arg in ("message", "msg", "detail") and id(node) not in self._seen_calls:
                self.add(kw.value, f"kwarg:{last}")
        if id(node) not in self._seen_calls:
            if last in ("warn",) and owner in ("warnings", ""):
                self.add(node.args[0] if node.args else None, "warn")
            elif re.search(r"(?:Error|Exception|Warning)$", last) and last[:1].isupper() and node.args:
                self.add(node.args[0], f"error:{last}")
            elif last in ("create_error_response", "create_streaming_error_response", "ErrorResponse",
                          "ErrorInfo", "_raise_error", "HTTPException"):
                arg = node.args[0] if node.args else next(
                    (k.value for k in node.keywords if k.arg in ("message", "detail", "msg")), None)
                self.add(arg, f"error:{last}")
            else:
                level = re.sub(r"_once$", "", last)
                if level in self.levels and (self.LOG_NAMES.match(owner) or owner.endswith("logger")):
                    self.add(node.args[0] if node.args else None, f"log:{level}", pct=True)
        self.generic_visit(node)


def _call_name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{_call_name(func.value)}.{func.attr}"
    if isinstance(func, ast.Call):
        return _call_name(func.func) + "()"
    return "?"


def python_messages(path: str, levels: Iterable[str]) -> list[tuple[str, str, str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (SyntaxError, ValueError):
        return []
    visitor = _PyMessages(levels)
    visitor.visit(tree)
    return visitor.found


# ----------------------------------------------------------------------------------------------- C / C++ sources

C_SITES = re.compile(
    r"\b(?P<name>LLAMA_LOG_(?:ERROR|WARN|INFO)|GGML_LOG_(?:ERROR|WARN|INFO)|LOG_(?:ERR|WRN|INF)|"
    r"SRV_(?:ERR|WRN|INF)|SLT_(?:ERR|WRN|INF)|GGML_ABORT|ggml_abort|throw\s+(?:std::)?\w+(?:::\w+)*|"
    r"fprintf\s*\(\s*stderr\s*,|send_error|format_error_response|WARN|INFO|"
    r"TORCH_CHECK\w*|TORCH_WARN\w*|TORCH_INTERNAL_ASSERT\w*|C10_THROW_ERROR|C10_CUDA_CHECK\w*|AT_ERROR|"
    r"LOG\s*\(\s*(?:ERROR|WARNING|INFO)\s*\)\s*<<)\s*(?P<open>\(|<<)?")
C_RETURN = re.compile(r"\breturn\s+(?=\")")
C_ASSIGN = re.compile(r"\b(?:\w*err\w*|\w*msg\w*|\w*message\w*|reason|what|interpret|detail)\s*(?:\+?=)\s*(?=[\"\w:(])",
                      re.I)
C_STREAM = re.compile(r"\b(?:ss|oss|\w*stream|\w*msg|\w*err)\s*<<\s*(?=\")")
C_TYPE_STR = re.compile(r"\"([a-z][a-z_]*_error)\"")
# a definition's head line: a return type (or a qualified name at column 0), the name, "(", and no ";" after it
C_FUNC_DEF = re.compile(r"^(?:[ ]{0,4})(?!(?:return|else|if|for|while|switch|case|do|throw|new|delete|using|typedef)\b)"
                        r"(?:(?:[\w:<>,*&~]+[ \t]+[*&]*)+(?P<name>(?:\w+::)*(?:~?\w+|operator\s*\S+?))|"
                        r"(?P<qname>\w+(?:<[^>\n]*>)?::~?\w+))[ \t]*\((?![^\n]*;[ \t]*$)", re.M)
_C_STR = re.compile(r'(?:u8|L|u|U)?"((?:[^"\\\n]|\\.)*)"')


def _c_unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}.get(m.group(1), ""), s)


def _after_quoted(src: str, i: int, n: int) -> int:
    """The index just past the quoted text that opens at `i` (escapes respected; `n` bounds the search)."""
    j = i + 1
    while j < n and src[j] != src[i]:
        j += 2 if src[j] == "\\" else 1
    return j + 1


def _strip_comments(src: str) -> str:
    """Blank out comments (keeping offsets and newlines) so that quoted text in them is not read."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c == '"' or c == "'":
            j = _after_quoted(src, i, n)
            out.append(src[i:j])
            i = j
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _balanced(src: str, start: int, limit: int = 4000) -> str:
    """Text from just after an opening parenthesis at `start - 1` up to its match (strings respected)."""
    depth, i, n = 1, start, min(len(src), start + limit)
    while i < n:
        c = src[i]
        if c == '"' or c == "'":
            i = _after_quoted(src, i, n)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return src[start:i]
        elif c == ";" and depth <= 1:
            return src[start:i]
        i += 1
    return src[start:n]


def _split_top(text: str, separators: tuple[str, ...], quotes: str = "\"'") -> list[str]:
    """`text` cut at the separators that stand outside brackets and string literals."""
    out, depth, cur, i = [], 0, [], 0
    while i < len(text):
        c = text[i]
        if c in quotes:
            j = i + 1
            while j < len(text) and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        sep = next((x for x in separators if text.startswith(x, i)), None) if depth == 0 else None
        if sep:
            out.append("".join(cur))
            cur = []
            i += len(sep)
            continue
        cur.append(c)
        i += 1
    out.append("".join(cur))
    return out


def _split_args(args: str) -> list[str]:
    return [a.strip() for a in _split_top(args, (",",))]


_WRAPPERS = re.compile(r"^(?:std::)?(?:string_format|format|fmt::format|c10::str|str|string|std::string|"
                       r"absl::StrFormat|llama_format_tensor_shape|_|tr)\s*\(", re.S)


def _c_expr_text(expr: str, depth: int = 0) -> str | None:
    """The text an argument expression prints: literals kept, everything else a wildcard."""
    expr = re.sub(r'"\s*PRI[a-zA-Z0-9]+\s*"', "d", expr.strip())   # "%" PRId64 " tokens" -> "%d tokens"
    expr = re.sub(r'"\s*PRI[a-zA-Z0-9]+\b', 'd"', expr)
    if depth > 4 or '"' not in expr:
        return None
    m = _WRAPPERS.match(expr)
    if m:
        inner = _balanced(expr, m.end())
        rest = expr[m.end() + len(inner) + 1:].strip()
        args = _split_args(inner)
        if m.group(0).startswith(("c10::str", "str(")):   # c10::str(a, b, c) concatenates all its arguments
            args = [" + ".join(a for a in args if a)]
        head = next((t for t in (_c_expr_text(a, depth + 1) for a in args) if t is not None), None)
        if head is not None and args and '"' in args[0] and "%" in head:
            head = pct_to_wild(head)
        if m.group(0).startswith(("fmt::", "format")) and head is not None:
            head = brace_to_wild(head)
        joiner = next((op for op in ("+", "<<") if rest.startswith(op)), None)
        if joiner:
            tail = _c_expr_text(rest[len(joiner):], depth + 1)
            return (head or WILD) + (tail if tail is not None else WILD)
        return head
    # split on top-level + and << ; adjacent literals concatenate
    pieces = _split_top(expr, ("<<", "+"), quotes='"')
    out = []
    for piece in pieces:
        piece = piece.strip()
        lits = _C_STR.findall(piece)
        residue = _C_STR.sub("", piece).strip()
        if lits and (not residue or re.fullmatch(r"[\s()]*|(?:std::)?string\s*\(\s*\)|[\s\w]*(?:PRI\w+)[\s\w]*",
                                                 residue)):
            out.append(_c_unescape("".join(lits)))
        elif lits and (_WRAPPERS.match(piece) or piece.startswith("(")):
            sub = _c_expr_text(piece.strip("()") if piece.startswith("(") else piece, depth + 1)
            out.append(sub if sub is not None else WILD)
        else:
            out.append(WILD)
    text = "".join(out)
    return text if text.replace(WILD, "").strip() else None


def _enclosing_function(src: str, pos: int, defs: list[tuple[int, str]]) -> str:
    name = "<file>"
    lo, hi = 0, len(defs)
    while lo < hi:
        mid = (lo + hi) // 2
        if defs[mid][0] <= pos:
            lo = mid + 1
        else:
            hi = mid
    if lo:
        name = defs[lo - 1][1]
    return name


def c_messages(path: str) -> list[tuple[str, str, str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            raw = fh.read()
    except OSError:
        return []
    src = _strip_comments(raw)
    defs = []
    for m in C_FUNC_DEF.finditer(src):
        name = (m.group("name") or m.group("qname")).rsplit("::", 1)[-1]
        if name not in ("if", "for", "while", "switch", "return", "sizeof", "defined") and not name.isupper():
            defs.append((m.start(), name))
    found: list[tuple[str, str, str]] = []

    def emit(text: str | None, kind: str, pos: int, func_arg: bool = False, printf: bool = True) -> None:
        if text is None:
            return
        fn = _enclosing_function(src, pos, defs)
        # inside a macro: name the macro (`#define GGML_ASSERT(x) ... ggml_abort(...)`)
        start = src.rfind("\n", 0, pos) + 1
        while start > 1 and src[start - 2] == "\\":
            start = src.rfind("\n", 0, start - 1) + 1
        macro = re.match(r"\s*#\s*define\s+(\w+)", src[start:pos])
        if macro:
            fn = macro.group(1)
        if printf:
            if func_arg and text.startswith("%s:"):
                text = fn.lstrip("~") + text[2:]
            text = pct_to_wild(text)
        found.append((text.rstrip("\n"), kind, fn))

    for m in C_SITES.finditer(src):
        name = re.sub(r"\s+", " ", m.group("name"))
        if m.group("open") is None and not name.startswith("fprintf") and not name.startswith("throw"):
            continue
        if name.startswith("LOG (") or name.startswith("LOG("):
            args = [src[m.end():m.end() + 600].split(";")[0]]
            emit(_c_expr_text(args[0]), "c:LOG", m.start(), printf=False)
            continue
        if name.startswith("throw"):
            rest = src[m.end() - (1 if m.group("open") else 0):]
            if not rest.startswith("("):
                continue
            inner = _balanced(src, m.end() if m.group("open") else m.end() + 1)
            emit(_c_expr_text(inner), "c:throw " + name.split()[-1].replace("std::", ""), m.start(), printf=False)
            continue
        inner = _balanced(src, m.end())
        args = _split_args(inner)
        kind = "c:" + name.split("(")[0].strip()
        if name.startswith(("TORCH_CHECK", "TORCH_INTERNAL_ASSERT")):
            # TORCH_CHECK(cond, "a", x, "b"): the message is the arguments after the condition, concatenated
            rest = [a for a in args[2 if name.endswith("_WITH") else 1:] if a]
            if any('"' in a for a in rest):
                emit(_c_expr_text(" + ".join(rest)), kind, m.start(), printf=False)
            continue
        if name in ("send_error", "format_error_response"):
            for a in args:
                t = _c_expr_text(a)
                if t is not None:
                    emit(t, kind, m.start(), printf=False)
                    break
            continue
        if name == "C10_THROW_ERROR":
            args = args[1:]
        first = next((i for i, a in enumerate(args) if '"' in a), None)
        if first is None:
            continue
        text = _c_expr_text(args[first])
        func_arg = len(args) > first + 1 and args[first + 1].strip() == "__func__"
        printf = not name.startswith(("TORCH_", "C10_", "AT_ERROR"))
        if not printf:
            text = _c_expr_text(" + ".join(a for a in args[first:] if a)) if text is not None else None
        emit(text, kind, m.start(), func_arg=func_arg, printf=printf)

    for m in C_STREAM.finditer(src):
        expr = src[m.end():m.end() + 1000].split(";")[0]
        emit(_c_expr_text(expr), "c:stream", m.start(), printf=False)
    for m in C_RETURN.finditer(src):
        expr = src[m.end():m.end() + 1000].split(";")[0]
        emit(_c_expr_text(expr), "c:return", m.start(), printf=False)
    for m in C_ASSIGN.finditer(src):
        expr = src[m.end():m.end() + 1000].split(";")[0]
        if '"' in expr:
            emit(_c_expr_text(expr), "c:assign", m.start(), printf="%" in expr and "format" in expr)
    for m in C_TYPE_STR.finditer(src):
        emit(m.group(1), "c:error_type", m.start(), printf=False)
    return found


# ----------------------------------------------------------------------------------------------- binaries

def binary_messages(path: str, min_chars: int) -> list[tuple[str, str, str]]:
    with open(path, "rb") as fh:
        data = fh.read()
    out = []
    for m in re.finditer(rb"[\x20-\x7e]{%d,}" % max(min_chars, 8), data):
        s = m.group(0).decode("ascii")
        # message-like: words with spaces, mostly letters, no path/format soup
        if " " not in s.strip() or not re.search(r"[a-z]{3,} [a-z]{2,}", s):
            continue
        if sum(ch.isalpha() or ch in " '-()/," for ch in s) < 0.85 * len(s):
            continue
        out.append((pct_to_wild(s), "binary", "<strings>"))
    return out


# ----------------------------------------------------------------------------------------------- driver

def parse_source(spec: str) -> tuple[str, str, str]:
    m = re.fullmatch(r"([^@=]+)@([^=]+)=(.+)", spec)
    if not m:
        raise SystemExit(f"bad SOURCE {spec!r}: expected NAME@VERSION=PATH")
    return m.group(1), m.group(2), m.group(3)


def shown_path(path: str, package: str, root: str, rel: str) -> str:
    """The file as the package names it: from the last `/<package>/` of its path on ("vllm/config/model.py")."""
    p = os.path.abspath(path).replace(os.sep, "/")
    i = p.rfind(f"/{package}/")
    if i >= 0:
        return p[i + 1:]
    base = os.path.basename(os.path.abspath(root).rstrip("/")) if os.path.isdir(root) else ""
    return f"{base}/{rel}" if base else rel


def walk(root: str, excludes: list[str]) -> Iterator[tuple[str, str]]:
    if os.path.isfile(root):
        yield root, os.path.basename(root)
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".git"))
        for fn in sorted(filenames):
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, root)
            if any(fnmatch.fnmatch(rel, pat) for pat in excludes):
                continue
            yield path, rel


def extract(sources: list[str], binaries: list[str], excludes: list[str], levels: Iterable[str],
            min_chars: int) -> list[dict]:
    merged: dict[tuple[str, str], dict] = {}
    for spec, is_binary in [(s, False) for s in sources] + [(b, True) for b in binaries]:
        package, version, root = parse_source(spec)
        items: list[tuple[str, tuple[str, str, str]]] = []
        if is_binary:
            items = [(os.path.basename(root), f) for f in binary_messages(root, min_chars)]
        else:
            for path, rel in walk(root, excludes):
                rel_shown = shown_path(path, package, root, rel)
                if path.endswith(".py"):
                    items += [(rel_shown, f) for f in python_messages(path, levels)]
                elif path.endswith(C_EXT):
                    items += [(rel_shown, f) for f in c_messages(path)]
        for rel, (text, kind, func) in items:
            text = squash(text.strip())
            lits = literals_of(text)
            if sum(len(x) for x in lits) < min_chars:
                continue
            key = (package, text)
            rec = merged.setdefault(key, {"package": package, "text": text, "literals": lits, "kinds": set(),
                                          "sites": set(), "versions": set()})
            rec["kinds"].add(kind)
            rec["sites"].add(f"{rel}:{func}")
            rec["versions"].add(version)
    out = []
    for rec in merged.values():
        versions = sorted(rec["versions"], key=version_key)
        out.append({"package": rec["package"], "text": rec["text"], "literals": rec["literals"],
                    "kinds": sorted(rec["kinds"]), "sites": sorted(rec["sites"])[:8], "versions": versions,
                    "n_versions": len(versions)})
    out.sort(key=lambda r: (r["package"], r["sites"][0] if r["sites"] else "", r["text"]))
    return out


def verify(table_path: str, candidate_paths: list[str], write: bool = False) -> int:
    """Every needle must be verbatim inside one literal piece of some candidate text; print where and when.

    With `write`, each row's `source` becomes "<file>:<function> (<versions>)" from the candidates (a row whose
    `source` already names a file keeps that file when the needle is found there)."""
    cands = []
    all_versions: dict[str, set[str]] = defaultdict(set)
    for path in candidate_paths:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                rec["_lits"] = [x.lower() for x in rec["literals"]]
                rec["_lits"] += [" ".join(x.split()) for x in rec["_lits"]]
                cands.append(rec)
                all_versions[rec["package"]].update(rec["versions"])
    with open(table_path, encoding="utf-8") as fh:
        table = json.load(fh)
    bad = 0
    for row in table["messages"]:
        needle = row["needle"]
        hits = [c for c in cands if any(needle in lit for lit in c["_lits"])]
        if not hits:
            bad += 1
            print(f"MISSING {row['id']}: {needle!r}")
            continue
        # the site: the file the row already names if the needle is there, else the site seen in most versions
        hinted = (row.get("source") or "").split(":", 1)[0].strip()
        by_site: dict[str, set[str]] = defaultdict(set)
        for c in hits:
            for site in c["sites"]:
                by_site[site].update(c["versions"])
        sites = sorted(by_site, key=lambda st: (not (hinted and st.startswith(hinted)), -len(by_site[st]), len(st)))
        site = sites[0]
        by_pkg: dict[str, set[str]] = defaultdict(set)
        for c in hits:
            by_pkg[c["package"]].update(c["versions"])
        spans = []
        for pkg, vs in sorted(by_pkg.items()):
            known = sorted(all_versions[pkg], key=version_key)
            spans.append((pkg, _ranges(known, [v for v in known if v in vs])))
        pkg_of_site = next(c["package"] for c in hits if site in c["sites"])
        versions = next(span for pkg, span in spans if pkg == pkg_of_site)
        more = f" +{len(sites) - 1} more" if len(sites) > 1 else ""
        print(f"ok      {row['id']}: {'; '.join(f'{p} {v}' for p, v in spans)}  [{site}{more}]")
        if write:
            row["source"] = f"{site} ({versions})"
    n = len(table["messages"])
    print(f"{n - bad}/{n} needles verbatim in the sources", file=sys.stderr)
    if write:
        with open(table_path, "w", encoding="utf-8") as fh:
            json.dump(table, fh, indent=1, ensure_ascii=False)
            fh.write("\n")
    return 1 if bad else 0


def _ranges(known: list[str], have: list[str]) -> str:
    """Versions as runs over the versions read: "0.8.5-0.33.0" (every version read in between), "a, b" for few."""
    if len(known) <= 3:
        return ", ".join(have)
    runs, cur = [], []
    hv = set(have)
    for v in known:
        if v in hv:
            cur.append(v)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", help="NAME@VERSION=PATH")
    ap.add_argument("-o", "--output")
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--levels", default=",".join(PY_LEVELS_DEFAULT))
    ap.add_argument("--binary", action="append", default=[])
    ap.add_argument("--min-chars", type=int, default=8)
    ap.add_argument("--verify", metavar="TABLE")
    ap.add_argument("--write-sources", action="store_true")
    args = ap.parse_args(argv)
    if args.verify:
        return verify(args.verify, args.sources, write=args.write_sources)
    if not args.sources and not args.binary:
        ap.error("give at least one SOURCE")
    records = extract(args.sources, args.binary, args.exclude, args.levels.split(","), args.min_chars)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        for rec in records:
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    finally:
        if args.output:
            out.close()
    print(f"{len(records)} candidate messages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
