"""Which code of a submission the judge's probe child runs, in which order: the plan, built without running anything.

The probe child (`instructor.template.run_probe_plan`) runs the learner's *definitions* (imports, functions,
classes, plain assignments, tables a cell fills in, also under an `if`, a `try`, a `with` or a loop over a table)
from the exercises and from cells they added, with the instructor's own given cells that those definitions need,
and then the judge's probes (`instructor.judge`). Top-level statements that do something (calls, `torch.x = ...`, a training
run) are dropped: they cost time and decide nothing, since every verdict is computed outside the learner's process.
Nothing is refused here by what the code names: what an exercise may not run is refused where it runs (the operators
taken out of the probe child, the record, the sandbox).

A cell the parser cannot take (a syntax error, an expression nested too deep for it) is reported on that cell;
nothing in a submission stops the plan from being built.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import math
import re

from instructor.course import cell_kind, cell_source, nbgrader_meta, same_text
from instructor.dataflow import (
    _DYNAMIC,
    _READS_ONLY,
    MAX_STEPS,
    _aliased,
    _Budget,
    _derivations,
    _root_name,
    _Spent,
    global_uses,
)

# Cell magics that run their cell's code in the notebook's namespace, as if they were not there: what the cell
# defines is defined (`%%time` over a class made it a string passed to a magic, and the exercise went missing).
# `%%prun` too, whatever its options (an honest `%%prun -q` over LayerNorm lost its points: red-team round 37).
TRANSPARENT_CELL_MAGICS = {"time", "capture", "prun"}


# IPython's transformer reads a cell again for each magic it rewrites (quadratic: 499 `%time` lines in a 20 kB cell
# held the grader two minutes); a cell with more is read as one the parser cannot take
MAX_MAGICS = 64
# The lines it rewrites: a magic or shell escape, one assigned (`x = %pwd`, `x = !ls`), an autocall escape (`/f x`,
# `,f a`, `;f a`), help (`x?`): 450 assigned magics, which were not counted, held the batch 2 x 60 s (round 21)
_REWRITTEN = r"^\s*[%!]|^[^#\n'\"]*=\s*[%!]|^\s*[/,;][A-Za-z_]\w*[ \t]|\?\s*$"


@functools.lru_cache(maxsize=1024)
def ipython_to_python(source: str) -> str:
    """Cell source as plain Python (`%magic` and `!shell` lines become `get_ipython()` calls; the body of a cell
    under `%%time` or `%%capture` is the cell's code)."""
    magics = len(re.findall(_REWRITTEN, source, flags=re.MULTILINE))
    if not magics:
        return source
    if magics > MAX_MAGICS:
        raise SyntaxError(f"more than {MAX_MAGICS} magic or shell lines in one cell: not read")
    # IPython drops the lines before the first that holds anything, blank or of spaces, before it looks for a cell
    # magic (a line of spaces over `%%time` made the plan miss it: round 37)
    lines = source.splitlines(keepends=True)
    while lines and not lines[0].strip():
        lines.pop(0)
    first, _, body = "".join(lines).partition("\n")
    magic = re.match(r"%%(\w+)", first.strip())
    if magic and magic.group(1) in TRANSPARENT_CELL_MAGICS:
        return ipython_to_python(body)
    written = re.fullmatch(r"%%writefile(\s+-a|\s+--append)?\s+(\S+)", first.strip())
    if written:  # a helper module the notebook imports later: an assignment, so the probe child writes it too
        mode = "a" if written.group(1) else "w"
        return f"_ = open({written.group(2).strip(chr(34) + chr(39))!r}, {mode!r}, encoding='utf-8').write({body!r})\n"
    from IPython.core.inputtransformer2 import TransformerManager

    # `%run helper.py` defines what the file defines in the notebook's namespace: as an `exec`, which the plan keeps
    source = re.sub(r"^%run\s+(?:-i\s+)?(['\"]?)([\w./-]+\.py)\1[ \t]*$", _run_as_exec, source, flags=re.MULTILINE)
    return TransformerManager().transform_cell(source)


def _run_as_exec(match: re.Match) -> str:
    path = match.group(2)
    return f"exec(compile(open({path!r}, encoding='utf-8').read(), {path!r}, 'exec'), globals())"


def _is_name_target(target: ast.AST) -> bool:
    if isinstance(target, ast.Name):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_is_name_target(t) for t in target.elts)
    return isinstance(target, ast.Starred) and _is_name_target(target.value)  # `A, *REST = ...`


def _sets_own(stmt: ast.stmt, own: frozenset[str]) -> bool:
    """`Cls.attr = value`, `setattr(Cls, "attr", value)` or `f.register(...)` on a class or function the notebook
    defines: how a method is added after its class (`Attention.forward = forward`) or a case to a singledispatch
    function (`f.register(...)`), part of the definition, not an action."""
    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, ast.Attribute) and _root_name(t) in own for t in stmt.targets)
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return False
    if isinstance(call.func, ast.Attribute) and call.func.attr.startswith("register"):
        # `gelu_new.register(torch.Tensor, _on_tensors)`: a singledispatch's case; `op.register_autograd(...)`,
        # `op.register_fake(...)`: a custom operator's (a bare `register_autograd` call was dropped: round 11)
        return _root_name(call.func.value) in own
    return (
        isinstance(call.func, ast.Name)
        and call.func.id == "setattr"
        and len(call.args) == 3
        and isinstance(call.args[0], ast.Name)
        and call.args[0].id in own
    )


def _is_globals(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "globals"


def _is_sys(node: ast.AST, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _binds_through_namespace(stmt: ast.stmt) -> bool:
    """A statement that binds names in the notebook's namespace without a definition's syntax: `globals()[k] = v`,
    `globals().update(...)`, `exec(source)` (which defines what `source` defines), and one that makes a module
    importable: `sys.modules[name] = module`, `sys.path.insert(0, folder)` (an in-memory helper module was dropped
    so, and its import failed: red-team round 11)."""
    if isinstance(stmt, ast.Assign):
        return all(
            isinstance(t, ast.Subscript) and (_is_globals(t.value) or _is_sys(t.value, "modules")) for t in stmt.targets
        )
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return False
    if isinstance(call.func, ast.Name) and call.func.id == "exec":
        return True
    if not isinstance(call.func, ast.Attribute):
        return False
    if call.func.attr in ("update", "setdefault") and _is_sys(call.func.value, "modules"):
        return True
    if call.func.attr in ("append", "insert", "extend") and _is_sys(call.func.value, "path"):
        return True
    return call.func.attr == "update" and _is_globals(call.func.value)


# What a helper module's text may be made with where it is written: a constant, a name, and string methods
_TEXT_CALLS = frozenset({"dedent", "cleandoc", "format", "join", "strip", "lstrip", "rstrip", "replace", "encode"})


def _plain_text(node: ast.AST) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            func = inner.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name not in _TEXT_CALLS and name not in ("str", "repr", "Path", "open"):
                return False
    return True


def _is_open(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"


def _writes_a_file(stmt: ast.stmt) -> bool:
    """A file written whole from text at top level: `Path(p).write_text(text)`, `open(p, "w").write(text)`, or a
    `with open(p, "w") as f:` that only writes text to `f`: a helper module that a later import reads (each was
    dropped as an action, and the honest exercise that imported it scored 0: red-team round 11)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute):
        call, func = stmt.value, stmt.value.func
        writer = func.attr in ("write_text", "write_bytes") or func.attr == "write" and _is_open(func.value)
        return writer and _plain_text(func.value) and all(_plain_text(a) for a in [*call.args, *call.keywords])
    if not isinstance(stmt, ast.With) or not stmt.body:
        return False
    handles = set()
    for item in stmt.items:
        if not (_is_open(item.context_expr) and isinstance(item.optional_vars, ast.Name)):
            return False
        if not _plain_text(item.context_expr):
            return False
        handles.add(item.optional_vars.id)
    for inner in stmt.body:
        call = inner.value if isinstance(inner, ast.Expr) else None
        if not isinstance(call, ast.Call) or not all(_plain_text(a) for a in [*call.args, *call.keywords]):
            return False
        func = call.func
        to_handle = isinstance(func, ast.Attribute) and func.attr in ("write", "writelines")
        to_handle = to_handle and isinstance(func.value, ast.Name) and func.value.id in handles
        printed = isinstance(func, ast.Name) and func.id == "print"
        printed = printed and any(
            k.arg == "file" and isinstance(k.value, ast.Name) and k.value.id in handles for k in call.keywords
        )
        if not (to_handle or printed):
            return False
    return True


def _only_defines_globals(fn: ast.stmt) -> bool:
    """A function that declares names global and binds them only with definitions (`def _define(): global
    LayerNorm; class LayerNorm: ...`): calling it defines them, as a cell would (round 11: the call was dropped)."""
    if not isinstance(fn, ast.FunctionDef) or not any(isinstance(s, ast.Global) for s in fn.body):
        return False
    definitions = (
        ast.Global,
        ast.Import,
        ast.ImportFrom,
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.Pass,
    )
    return all(
        isinstance(s, definitions) or isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in fn.body
    )


def _calls_a_definer(stmt: ast.stmt, definers: set[str]) -> bool:
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id in definers
        and all(isinstance(a, (ast.Constant, ast.Name)) for a in [*call.args, *(k.value for k in call.keywords)])
    )


def _base(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _stores_own(target: ast.AST, own: frozenset[str], data: frozenset[str]) -> bool:
    """An assignment's target that binds a plain name or stores into what the notebook owns: an attribute of a class
    or function it defines (`LayerNorm.forward`), an entry or attribute of a value it bound (`C["base"]`), also in a
    tuple (`A.forward, A.extra_repr = ...`) or beside others (`BASE = C["base"] = 1e4`); each of those was dropped as
    an action while only bare names counted, and honest exercises lost their points (red-team round 18)."""
    if isinstance(target, ast.Name):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_stores_own(t, own, data) for t in target.elts)
    if isinstance(target, ast.Starred):  # `A, *REST = ...`
        return _stores_own(target.value, own, data)
    if isinstance(target, ast.Attribute) and _root_name(target) in own:
        return True
    return isinstance(target, (ast.Attribute, ast.Subscript)) and _base(target) in data


def _walrus_bindings(stmt: ast.stmt) -> list[ast.stmt]:
    """`NAME = value` for each walrus that a dropped statement's own line runs (`print(f"{(C := 2.0):.3f}")`,
    `assert (K := f())`, the test of an `if` that defines nothing): the action goes, the name it binds stays, as the
    assignment `NAME = value` would (a definition reading `C` raised NameError, red-team round 18). Not a walrus
    inside another, a comprehension, a lambda or a nested statement (a body), which bind elsewhere or later, nor one
    that may not run: past the first operand of `and`/`or`, in a branch of `x if c else y`, in a `case` (lifted,
    `print(ok and (k := f()))` would call `f` where the cell never did)."""
    found: list[ast.NamedExpr] = []
    skipped = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.match_case)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.NamedExpr):
            found.append(node)
        elif isinstance(node, ast.BoolOp):
            visit(node.values[0])
        elif isinstance(node, ast.IfExp):
            visit(node.test)
        elif not isinstance(node, skipped) and not (isinstance(node, ast.stmt) and node is not stmt):
            for child in ast.iter_child_nodes(node):
                visit(child)

    visit(stmt)
    return [
        ast.fix_missing_locations(ast.copy_location(ast.Assign([ast.Name(w.target.id, ast.Store())], w.value), w))
        for w in found
    ]


def _is_definition(stmt: ast.stmt, own: frozenset[str] = frozenset(), data: frozenset[str] = frozenset()) -> bool:
    keep = isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass))
    keep |= isinstance(stmt, ast.Assign) and all(_stores_own(t, own, data) for t in stmt.targets)
    keep |= isinstance(stmt, ast.AnnAssign) and _stores_own(stmt.target, own, data)
    keep |= _sets_own(stmt, own) or _binds_through_namespace(stmt)
    # a constant or a bare name as a statement does nothing (`try: _CACHE` / `except NameError: _CACHE = {}`)
    return keep or isinstance(stmt, ast.Expr) and isinstance(stmt.value, (ast.Constant, ast.Name))


_FILLS = frozenset({"append", "extend", "insert", "update", "setdefault", "add"})


def _fills_own_data(stmt: ast.stmt, data: set[str]) -> bool:
    """`C["k"] = v`, `C.k = v`, `C += ...`, `C.append(v)`, where `C` is a name the same body bound to a value of its
    own before: building a table of constants, which a definition may use (they were dropped as actions, and an
    honest gelu_new reading `C["sqrt_2_over_pi"]` lost 04's points)."""

    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, (ast.Subscript, ast.Attribute)) and _base(t) in data for t in stmt.targets)
    if isinstance(stmt, ast.AugAssign):
        return _base(stmt.target) in data
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        return isinstance(func, ast.Attribute) and func.attr in _FILLS and _base(func.value) in data
    return False


_TABLE_VIEWS = frozenset({"items", "keys", "values"})
_OVER = frozenset({"enumerate", "zip", "sorted", "reversed"})


def _over_a_table(node: ast.AST, tables: set[str]) -> bool:
    """A loop's iterable that is a table written in the cell: a literal tuple, list, set or dict, a name the cell bound
    to one, their `.items()`, `.keys()` or `.values()`, and `enumerate`, `zip`, `sorted` or `reversed` of those. Such
    a loop fills a table in or attaches methods, a bounded number of times; a loop over a range, a data loader or
    anything else is an action (a training run in an added cell would run in every phase)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
        return True
    if isinstance(node, ast.Name):
        return node.id in tables
    if not isinstance(node, ast.Call) or node.keywords:
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in _TABLE_VIEWS and not node.args:
        return _over_a_table(func.value, tables)
    if isinstance(func, ast.Name) and func.id in _OVER and node.args:
        return all(_over_a_table(arg, tables) for arg in node.args)
    return False


def _only_fills(body: list[ast.stmt]) -> bool:
    """A kept loop's body binds no name of its own: it fills tables in, sets attributes, defines functions or
    classes, or controls the loop (`h = train(...)` in a loop is an action, however its iterable reads)."""
    for stmt in body:
        if isinstance(stmt, (ast.If, ast.For)):
            if not _only_fills(stmt.body + stmt.orelse):
                return False
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(_is_name_target(t) for t in targets):
                return False
        elif not isinstance(
            stmt,
            (
                ast.Expr,
                ast.AugAssign,
                ast.FunctionDef,
                ast.AsyncFunctionDef,
                ast.ClassDef,
                ast.Pass,
                ast.Break,
                ast.Continue,
            ),
        ):
            return False
    return True


# Builtins a loop that computes a table may call: none runs code of its own or reaches the namespace.
_NOT_PLAIN = frozenset({"exec", "eval", "compile", "__import__", "open", "input", "breakpoint", "globals", "vars"})


MAX_TABLE_STEPS = 100_000  # the most iterations a kept loop that computes a table may have, its inner loops' included


_STEP_BUILTINS = frozenset({"range", "enumerate", "reversed", "sorted", "zip"})


def _steps(node: ast.AST, modules: frozenset[str] = frozenset(), own: frozenset[str] = frozenset()) -> int | None:
    """How many items `node` yields, where that is written in the code itself: `range` of constants (`1 << 10`
    included), a literal table, and `enumerate`, `reversed`, `sorted`, `zip`, `itertools.product` of those. None
    otherwise."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return len(node.elts)
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    func = node.func
    if isinstance(func, ast.Name) and func.id in _STEP_BUILTINS and func.id not in own:
        name = func.id  # the builtin, not a function of the notebook's of that name
    elif isinstance(func, ast.Attribute) and func.attr == "product" and isinstance(func.value, ast.Name):
        name = "product" if func.value.id in modules and func.value.id not in own else None  # `itertools.product`
    else:
        return None
    if name == "range":
        values = [_constant_int(arg) for arg in node.args]
        return len(range(*values)) if values and None not in values and len(values) <= 3 and values[-1] else None
    parts = [_steps(arg, modules, own) for arg in node.args]
    if not parts or None in parts:
        return None
    if name in ("enumerate", "reversed", "sorted") and len(parts) == 1:
        return parts[0]
    if name == "zip":
        return min(parts)
    if name == "product":
        return math.prod(parts)
    return None


def _constant_int(node: ast.AST) -> int | None:
    """An int written with constants and + - * // << only (`3 << 10`), if it stays below 2**40."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant_int(node.operand)
        value = None if inner is None else -inner
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.LShift)):
        left, right = _constant_int(node.left), _constant_int(node.right)
        if left is None or right is None or (isinstance(node.op, ast.LShift) and not 0 <= right < 40):
            return None
        if isinstance(node.op, ast.FloorDiv) and right == 0:
            return None
        ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.FloorDiv: int.__floordiv__}
        value = left << right if isinstance(node.op, ast.LShift) else ops[type(node.op)](left, right)
    else:
        return None
    return value if abs(value) < 2**40 else None


def _computes_a_table(
    loop: ast.For | ast.While, data: set[str], modules: frozenset[str], own: frozenset[str] = frozenset()
) -> bool:
    """A top-level loop that only computes entries of a table the cell wrote: its statements fill such a table in
    (`T[i] = ...`, `T.append(...)`), bind scratch names, branch or loop the same way, and every call in it is a
    builtin's, a module's function (`math.exp`, `torch.tensor`) or a fill of the table. It calls nothing of the
    notebook's and no method of any other object, so it cannot train, step or evaluate a model: it only does what
    the learner's kernel did once (an honest table of constants filled in by a range loop lost its exercise's points
    when every loop over a range was dropped as an action). It walks a range, a literal table, the learner's own data
    (`range(len(ROWS))`, `for row in ROWS`) or `enumerate`, `zip`, `itertools.product` of those, or is a `while` on
    such a condition; where its length is written in the code (`range(256)`) that length, its inner loops' included,
    is at most MAX_TABLE_STEPS, and every kept loop is also stopped there when it runs (`_bounded`)."""
    filled = False

    def plain_call(call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Name):
            return func.id in _BUILTINS and func.id not in _NOT_PLAIN and func.id not in own
        root = _root_name(func)
        if isinstance(func, ast.Attribute) and root in modules:
            return True
        return isinstance(func, ast.Attribute) and func.attr in _FILLS and root in data

    def plain(node: ast.AST) -> bool:
        if any(isinstance(n, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)) for n in ast.walk(node)):
            return False
        return all(plain_call(n) for n in ast.walk(node) if isinstance(n, ast.Call))

    def own_data(node: ast.AST) -> bool:
        """Every name the iterable reads, but the functions it calls, is the learner's own data or a module: not an
        object of elsewhere (a data loader), whose iteration could run anything."""
        called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
        return all(
            n.id in data or n.id in modules for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in called
        )

    steps = [1]  # iterations so far: the outer loop's times every inner one's

    def walks_a_known(loop: ast.For) -> bool:
        """A length written in the code (`range(1, 1025)`, `itertools.product(range(4), (0, 1))`) counts towards
        MAX_TABLE_STEPS: a loop of a million steps that fills memory ran, and killed, in the learner's kernel once;
        it is dropped, not run again in every phase of the judge's child. Any other length is stopped when it runs."""
        if not plain(loop.target):
            return False
        count = _steps(loop.iter, modules, own | data)
        if count is None:
            return plain(loop.iter) and own_data(loop.iter)
        steps[0] *= max(count, 1)
        return steps[0] <= MAX_TABLE_STEPS

    def body_ok(body: list[ast.stmt]) -> bool:
        nonlocal filled
        for stmt in body:
            if isinstance(stmt, (ast.Pass, ast.Break, ast.Continue)):
                continue
            if isinstance(stmt, ast.For) and walks_a_known(stmt) or isinstance(stmt, ast.While) and plain(stmt.test):
                if body_ok(stmt.body + stmt.orelse):
                    continue
                return False
            if isinstance(stmt, ast.If) and plain(stmt.test):
                if body_ok(stmt.body + stmt.orelse):
                    continue
                return False
            if not plain(stmt):
                return False
            if _fills_own_data(stmt, data):
                filled = True
            elif not isinstance(stmt, ast.Expr) and not (
                isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                and all(_is_name_target(t) for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]))
            ):
                return False
        return True

    heads = walks_a_known(loop) if isinstance(loop, ast.For) else plain(loop.test)
    return heads and body_ok(loop.body + loop.orelse) and filled


_STEP_COUNTER = "__table_steps__"


def _bounded(loop: ast.For | ast.While) -> list[ast.stmt]:
    """`loop`, kept by `_computes_a_table`, with a count of its steps, inner loops' included, that raises past
    MAX_TABLE_STEPS where it runs: a `while` or a loop over the learner's data has no length written in the code,
    and the judge's child must not run one forever (nor a million steps that fill memory)."""
    message = (
        f"a loop that fills a table ran past {MAX_TABLE_STEPS:,} steps in the judge's child; it stops there "
        "(a loop that only computes a table is run again when the judge runs your definitions)"
    )
    guard = ast.parse(
        f"{_STEP_COUNTER} += 1\nif {_STEP_COUNTER} > {MAX_TABLE_STEPS}:\n    raise RuntimeError({message!r})\n"
    ).body

    def at(statements: list[ast.stmt], where: ast.stmt) -> list[ast.stmt]:  # on the loop's own line, in tracebacks
        for node in (n for s in statements for n in ast.walk(s)):
            if "lineno" in node._attributes:
                node.lineno, node.end_lineno = where.lineno, where.lineno
                node.col_offset, node.end_col_offset = where.col_offset, where.col_offset
        return statements

    loop = copy.deepcopy(loop)
    for node in [n for n in ast.walk(loop) if isinstance(n, (ast.For, ast.While))]:
        node.body = at(copy.deepcopy(guard), node) + node.body
    return at(ast.parse(f"{_STEP_COUNTER} = 0").body, loop) + [loop]


class _Names:
    """A set of names seen through the enclosing bodies' sets: a body adds its own without copying theirs (copying
    them for every statement made planning quadratic in a cell's assignments: 80,000 `vN = N` lines held the batch
    past the 60 s bound, red-team round 21)."""

    __slots__ = ("names", "outer")

    def __init__(self, outer=frozenset(), names=()):
        self.outer, self.names = outer, set(names)

    def __contains__(self, name) -> bool:
        return name in self.names or name in self.outer

    def __ior__(self, names):
        self.names |= set(names)
        return self

    def __or__(self, other):
        return _Names(self, other)

    __ror__ = __or__


def _definitions_in(
    body: list[ast.stmt],
    dropped: list[ast.stmt],
    own: frozenset[str] = frozenset(),
    data: frozenset[str] = frozenset(),
    tables: frozenset[str] = frozenset(),
    modules: frozenset[str] = frozenset(),
    keep: frozenset[int] = frozenset(),
) -> list[ast.stmt]:
    """The definitions of `body`. An `if`, `try`, `with` or `for` that defines something is kept with only its
    definitions (`try: from x import y` / `except ImportError: y = None`, a constant chosen by an `if`, a table
    filled in or methods attached by a loop over a table the cell wrote, `_over_a_table`): its condition, context or
    iterable runs as an assignment's value would; a `try` whose body holds an action is dropped whole. Everything
    else is an action, dropped into `dropped`. `data`: the names an enclosing body bound to values of its own,
    which this one may fill in; `tables`: those bound to a literal table, which a loop may walk."""
    kept = []
    definers = set()  # functions of this body that only define globals (`_only_defines_globals`)
    data = _Names(data)  # names this body binds to values of its own (`C = {}`), which it may then fill in
    tables = _Names(tables)  # names this body binds to a literal table (`PAIRS = [("a", 1)]`), which a loop may walk
    for stmt in body:
        if id(stmt) in keep:  # what a kept definition reads may depend on it (`_needed_actions`)
            kept.append(stmt)
            continue
        if isinstance(stmt, (ast.Break, ast.Continue)):  # a kept loop's own control flow
            kept.append(stmt)
            continue
        if _writes_a_file(stmt) or _calls_a_definer(stmt, definers):
            kept.append(stmt)
            continue
        if _is_definition(stmt, own, data) or _fills_own_data(stmt, data):
            kept.append(stmt)
            if _only_defines_globals(stmt):
                definers.add(stmt.name)
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                names = {
                    n.id
                    for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                    for n in ast.walk(t)
                    if isinstance(n, ast.Name)
                }
                data |= names
                if isinstance(stmt.value, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                    tables |= names
            continue
        if isinstance(stmt, ast.For) and not _over_a_table(stmt.iter, tables) or isinstance(stmt, ast.While):
            if _computes_a_table(stmt, data, modules, own):
                kept.extend(_bounded(stmt))
                continue
            dropped.append(stmt)  # a loop over anything else (a loader) or that acts is an action: training, say
            kept.extend(_walrus_bindings(stmt))
            continue
        if isinstance(stmt, (ast.If, ast.Try, ast.TryStar, ast.With, ast.For, ast.Match)):
            inner: list[ast.stmt] = []
            node = copy.copy(stmt)
            fields = ["body", "orelse", "finalbody"]
            # what a `with` binds with `as` is the body's own to fill in: its context may publish it on exit
            # (`with building() as ns: ... ns["LayerNorm"] = _LN` was dropped, and the exercise scored 0: round 19)
            bound = {
                n.id
                for item in getattr(stmt, "items", [])
                if item.optional_vars is not None
                for n in ast.walk(item.optional_vars)
                if isinstance(n, ast.Name)
            }
            for field in fields:
                if hasattr(node, field):
                    part = _definitions_in(getattr(stmt, field), inner, own, _Names(data, bound), tables, modules, keep)
                    setattr(node, field, part or ([ast.Pass()] if field == "body" else []))
            if isinstance(stmt, (ast.Try, ast.TryStar)) and len(node.body) != len(stmt.body):
                # an action dropped from a `try` body could have raised and sent the code to a handler: without
                # it the definitions after it would run where they never did (`connect(); X = None` under `try`)
                dropped.append(stmt)
                continue
            if isinstance(stmt, ast.Match):  # a definition chosen by a `case`, as by an `if`
                node.cases = [copy.copy(case) for case in stmt.cases]
                for case in node.cases:
                    case.body = _definitions_in(case.body, inner, own, data, tables, modules, keep) or [ast.Pass()]
            if isinstance(stmt, (ast.Try, ast.TryStar)):
                node.handlers = [copy.copy(h) for h in stmt.handlers]
                for handler in node.handlers:
                    handler.body = _definitions_in(handler.body, inner, own, data, tables, modules, keep) or [
                        ast.Pass()
                    ]
            idle = (ast.Pass,) if isinstance(stmt, ast.If) else (ast.Pass, ast.Break, ast.Continue)
            defines = any(not isinstance(n, idle) for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node)
            if isinstance(stmt, ast.For) and not _only_fills(node.body + node.orelse):
                defines = False  # a loop that binds names of its own acts, whatever it walks
            if defines:
                kept.append(ast.fix_missing_locations(ast.copy_location(node, stmt)))
                dropped.extend(inner)
                continue
        dropped.append(stmt)
        kept.extend(_walrus_bindings(stmt))
    return kept


def definitions_only(
    tree: ast.Module,
    own: frozenset[str] = frozenset(),
    data: frozenset[str] = frozenset(),
    modules: frozenset[str] = frozenset(),
    keep: frozenset[int] = frozenset(),
) -> tuple[ast.Module, list[str]]:
    """`tree` with only imports, function/class definitions, assignments to plain names and attributes set on the
    classes and functions named in `own` (the notebook's: a method added after its class, a `register` call),
    tables filled in (its own, or those named in `data`, which another of the learner's cells binds), also inside an
    `if`, a `try`, a `with` or a loop over a table the cell wrote; and what was dropped."""
    kept, dropped = _planned(tree, own, data, modules, keep)
    notes = [f"line {s.lineno}: `{ast.unparse(s).splitlines()[0][:60]}`" for s in dropped]
    return kept, notes


def _planned(tree: ast.Module, own, data, modules, keep=frozenset()) -> tuple[ast.Module, list[ast.stmt]]:
    """`definitions_only`'s kept code, and the statements it dropped (at top level, or inside a kept `if`, `with`...)."""
    dropped: list[ast.stmt] = []
    kept = _definitions_in(tree.body, dropped, own, data, modules=modules | module_aliases([tree]), keep=keep)
    return ast.Module(body=kept, type_ignores=[]), dropped


def _may_change(stmt: ast.AST, writes: dict, modules: frozenset[str], spaces: set[str]) -> set[str] | None:
    """The names whose values a statement may bind or change: what it assigns or stores into, what any call in it
    is called on or given (`T.register(k, f)`, `operator.setitem(T, k, f)`) and the callable it calls
    (`add = T.setdefault; add(k, f)`), or else the globals a function of the notebook's that it calls writes
    (`writes`); None when it names a namespace (`globals()`, `vars()`, `sys`, `__main__`, `exec`) or a name made
    from one (`spaces`: `publish = _publisher(globals())`): it may bind anything. A module's attributes are not
    counted (`torch.allclose = ...`)."""
    out: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name):
            if node.id in _NAMESPACES or node.id in spaces:
                return None
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                out.add(node.id)
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out |= _aliased(node.value)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _READS_ONLY:
                continue  # `x.mean()`, `T.get(k)`: read, not changed
            if isinstance(func, ast.Attribute):
                out |= _aliased(func.value)
            elif isinstance(func, ast.Name) and func.id in writes:
                if writes[func.id] is None:
                    return None
                out |= writes[func.id]
            elif isinstance(func, ast.Name) and func.id in _BUILTINS:
                if func.id not in _CHANGING_BUILTINS:
                    continue  # `print(x)`, `len(x)`: read, not changed
            elif isinstance(func, ast.Name):
                out.add(func.id)  # a bound method or a callable object (`add = T.setdefault; add(k, f)`)
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                out |= _aliased(arg)
                if isinstance(arg, ast.Name) and arg.id in writes:  # a function given to be called (`map(reg, fs)`)
                    if writes[arg.id] is None:
                        return None
                    out |= writes[arg.id]
    return out - modules


# What names a namespace for `_may_change`: IPython's magics become `get_ipython().run_line_magic(...)` calls, which
# are actions like any other (`%timeit train(model)`), not a namespace
_NAMESPACES = _DYNAMIC - {"get_ipython"}
_CHANGING_BUILTINS = frozenset({"setattr", "delattr", "next", "iter", "map", "filter", "list", "any", "all", "sorted"})


def _global_writes(fn: ast.FunctionDef | ast.AsyncFunctionDef, modules: frozenset[str]) -> set[str] | None:
    """The global names a function of the notebook's may bind or change when called (`def reg(f): T[f.__name__] =
    f`: `T`); None for anything."""
    declared = {name for node in ast.walk(fn) if isinstance(node, ast.Global) for name in node.names}
    args = fn.args
    local = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
    changed: set[str] = set()
    for stmt in fn.body:
        more = _may_change(stmt, {}, modules, set())
        if more is None:
            return None
        changed |= more
        local |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return (changed - local) | declared


def _namespaces(trees: dict, derived: dict[str, set[str]]) -> set[str]:
    """Names bound to something made from a namespace (`publish = _publisher(globals())`, `setter =
    functools.partial(operator.setitem, globals())`), and names made from those (`derived`: a name -> the names
    made from it): calling one may bind anything (each such call was dropped, and its exercise scored 0: red-team
    round 20)."""
    spaces: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            value = (
                getattr(node, "value", None) if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) else None
            )
            if value is not None and any(isinstance(n, ast.Name) and n.id in _NAMESPACES for n in ast.walk(value)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                spaces |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    todo = list(spaces)
    while todo:
        for name in derived.get(todo.pop(), ()):
            if name not in spaces:
                spaces.add(name)
                todo.append(name)
    return spaces


def _needed_actions(
    trees: dict, kept: dict, dropped: dict, needed: set[str], exercises: dict, modules: frozenset[str]
) -> tuple[dict[int, frozenset[int]], str | None]:
    """For each learner cell, the statements `definitions_only` dropped that are to run all the same because what
    they may change is read by what runs: a kept statement or a kept function's body, or an exercise's name
    (`ACTIVATIONS.register("gelu_new", f)` then `gelu_new = ACTIVATIONS.get("gelu_new")`, `_install(SOURCE,
    globals())`, `reg(gelu)` where `reg` fills a table; each was dropped as an action and its exercise scored 0:
    red-team round 19), then what those read, until nothing more is needed. Names made from others (`add =
    T.setdefault`) count as them. And where the exercise's names are still bound by nothing kept, every statement of
    its cell but a loop (`exercises`: cell -> the names). A loop stays under the loop rules (a training run).

    One pass: each statement is read once, and each needed name, once, wakes the statements that change it or what
    was made from it (a chain of 900 statements, each needed by the next, took 204 s while every round re-read them
    all: round 20). The cells' nodes and the links between names count against the analysis's budget; past it,
    nothing more is kept, and the plan says so."""
    budget = _Budget(MAX_STEPS)
    keep: dict[int, set[int]] = {i: set() for i in trees}

    def reads(stmt: ast.AST) -> set[str]:
        return global_uses(stmt if isinstance(stmt, ast.Module) else ast.Module(body=[stmt], type_ignores=[]))

    try:
        for tree in trees.values():
            budget.take(sum(1 for _ in ast.walk(tree)))
        writes: dict = {}
        made_from: dict[str, set[str]] = {}
        for tree in trees.values():
            for stmt in tree.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    writes[stmt.name] = _global_writes(stmt, modules)
            _derivations(tree, modules, made_from, budget)
        derived: dict[str, set[str]] = {}  # a name -> the names made from it: changing one of those changes it
        for name, sources in made_from.items():
            budget.take(1 + len(sources))
            for source in sources:
                derived.setdefault(source, set()).add(name)
        spaces = _namespaces(trees, derived)
        waiting: dict[str, list] = {}  # a name -> the statements that change it
        todo = [name for tree in kept.values() for name in reads(tree)] + list(needed)
        for i, stmts in dropped.items():
            for stmt in stmts:
                if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                    continue
                changes = _may_change(stmt, writes, modules, spaces)
                if changes is None:
                    keep[i].add(id(stmt))
                    todo += reads(stmt)
                    continue
                for name in changes:
                    waiting.setdefault(name, []).append((i, stmt))
        seen: set[str] = set()
        while todo:  # each name once: a needed name wakes what changes it, and what was made from it is needed too
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            budget.take(1)
            todo += derived.get(name, ())
            for i, stmt in waiting.pop(name, ()):
                if id(stmt) not in keep[i]:
                    keep[i].add(id(stmt))
                    todo += reads(stmt)
        bound = set()
        for i, tree in kept.items():
            bound |= binds_and_uses(tree)[0]
            bound |= {n for s in dropped[i] if id(s) in keep[i] for n in binds_and_uses(ast.Module([s], []))[0]}
        for i, names in exercises.items():
            if i in trees and not set(names) <= bound:
                keep[i] |= {id(s) for s in dropped[i] if not isinstance(s, (ast.For, ast.AsyncFor, ast.While))}
    except (_Spent, RecursionError, MemoryError, ValueError) as err:
        why = "budget" if isinstance(err, _Spent) else type(err).__name__
        note = f"the plan kept only definitions: its analysis of which other statements are needed stopped ({why})"
        return {i: frozenset() for i in trees}, note
    return {i: frozenset(ids) for i, ids in keep.items()}, None


def without_deep(tree: ast.Module) -> tuple[ast.Module, list[ast.stmt]]:
    """The cell without the statements nested too deep for the plan's (recursive) analysis, and those statements.
    Each is left out of the judge's run on its own: one such expression made the whole cell, and the analysis of
    every other cell, give up, and an honest registry an exercise read was dropped with it (red-team round 47)."""
    kept, deep = [], []
    for stmt in tree.body:
        try:
            global_uses(ast.Module(body=[stmt], type_ignores=[]))
            ast.unparse(stmt)
            kept.append(stmt)
        except RecursionError:
            deep.append(stmt)
    return ast.Module(body=kept, type_ignores=tree.type_ignores), deep


def defined_names(tree: ast.Module) -> list[str]:
    """Top-level names a cell defines with def/class (an exercise's names: LayerNorm, gelu_new, ...)."""
    return [s.name for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


_BUILTINS = set(dir(builtins))


def module_aliases(trees) -> set[str]:
    """Names bound by `import x` / `import x.y as z` statements: modules, whose methods are not mutations."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def binds_and_uses(tree: ast.Module, modules: frozenset[str] = frozenset()) -> tuple[set[str], set[str]]:
    """Names a cell binds or mutates at top level (a method call on a module, `torch.manual_seed(0)`, is not
    taken as a mutation), and the global names it reads (in its functions and classes too)."""
    binds, uses = set(), set()

    def target_roots(target):
        if isinstance(target, ast.Name):
            binds.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                target_roots(t)
        elif isinstance(target, ast.Starred):
            target_roots(target.value)
        else:
            root = _root_name(target)
            if root:
                binds.add(root)

    def top(stmts):
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                binds.add(stmt.name)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for alias in stmt.names:
                    binds.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    target_roots(t)
            elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
                target_roots(stmt.target)
            elif isinstance(stmt, ast.Delete):
                for t in stmt.targets:
                    target_roots(t)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                func = stmt.value.func
                if isinstance(func, ast.Attribute):  # model.load_state_dict(...), not torch.manual_seed(...)
                    root = _root_name(func)
                    if root and root not in modules:
                        binds.add(root)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                target_roots(stmt.target)
                top(stmt.body)
                top(stmt.orelse)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    if item.optional_vars is not None:
                        target_roots(item.optional_vars)
                top(stmt.body)
            elif isinstance(stmt, (ast.If, ast.While)):
                top(stmt.body)
                top(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                top(stmt.body)
                for handler in stmt.handlers:
                    if handler.name:
                        binds.add(handler.name)
                    top(handler.body)
                top(stmt.orelse)
                top(stmt.finalbody)

    top(tree.body)
    uses = global_uses(tree)
    return binds - _BUILTINS, uses - _BUILTINS


def _only_definitions(tree: ast.Module) -> bool:
    return all(
        isinstance(s, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass))
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        for s in tree.body
    )


def build_plan(source_nb: dict, learner_nb: dict, name: str) -> dict:
    """The plan for one submitted notebook (JSON-serialisable)."""
    notes: list[str] = []
    src_cells = source_nb["cells"]
    # --- the instructor's notebook: given cells, exercises, tests
    trees = []
    for cell in src_cells:
        if cell_kind(cell) != "markdown":
            try:
                trees.append(ast.parse(ipython_to_python(cell_source(cell))))
            except SyntaxError:
                pass
    modules = frozenset(module_aliases(trees))
    given_by_text = {}
    solutions, tests = {}, {}
    exercise = None
    for index, cell in enumerate(src_cells):
        kind = cell_kind(cell)
        if kind == "markdown":
            continue
        meta = nbgrader_meta(cell)
        text = ipython_to_python(cell_source(cell))
        if kind == "given":
            given_by_text.setdefault(same_text(cell_source(cell)), index)
        elif kind == "solution":
            exercise = meta["grade_id"]
            tree = ast.parse(text)
            solutions[exercise] = {
                "index": index,
                "names": defined_names(tree),
                "top_level_code": not _only_definitions(tree),
                "uses": sorted(binds_and_uses(tree)[1]),
            }
        elif kind == "test":
            tests[meta["grade_id"]] = index
    test_texts = {same_text(cell_source(src_cells[t])) for t in tests.values()}

    # --- the learner's notebook: which cell is which
    learner_for = {}  # exercise grade_id -> learner cell index
    added = []  # (anchor source index, learner index)
    mapped = {}  # learner index -> source index
    for index, cell in enumerate(learner_nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id")
        if grade_id in solutions and meta.get("solution"):
            learner_for[grade_id] = index  # the last one wins, as in nbgrader
            mapped[index] = solutions[grade_id]["index"]
        elif grade_id in tests or same_text(cell_source(cell)) in test_texts:
            mapped[index] = tests.get(grade_id)
        elif same_text(cell_source(cell)) in given_by_text:
            mapped[index] = given_by_text[same_text(cell_source(cell))]
    cell_names = {}  # each cell parsed once, however many exercises are looked for

    def names_of(index: int) -> set[str] | None:
        if index not in cell_names:
            try:
                tree = ast.parse(ipython_to_python(cell_source(learner_nb["cells"][index])))
                cell_names[index] = set(defined_names(tree))
            except (SyntaxError, RecursionError, MemoryError, ValueError):
                cell_names[index] = None
        return cell_names[index]

    for ex, sol in solutions.items():
        if ex in learner_for:
            continue
        # nbgrader metadata gone (stripped, or the code pasted into a new cell): find the exercise by its names
        for index, cell in enumerate(learner_nb["cells"]):
            if cell.get("cell_type") != "code" or index in mapped:
                continue
            names = names_of(index)
            if names is None:
                continue
            if sol["names"] and set(sol["names"]) <= names:
                learner_for[ex] = index
        if ex in learner_for:
            mapped[learner_for[ex]] = sol["index"]
            notes.append(f"exercise {ex}: found by name in cell {learner_for[ex]} (its nbgrader metadata is missing)")
        else:
            notes.append(f"exercise {ex}: no cell defines {', '.join(sol['names']) or 'it'}")
    anchor = -1
    for index, cell in enumerate(learner_nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        if index in mapped:
            if mapped[index] is not None:
                anchor = mapped[index]
            continue
        added.append((anchor, index))
    # A cell of the learner's after the last graded test is needed by no test: nbgrader's run leaves it out, and so
    # does the plan (60 cells of 99,000 characters there, kept once the analysis's budget ran out, took 27 s of
    # definitions in every phase: red-team round 27)
    test_sources = set(tests.values())
    last_test = max((i for i, source in mapped.items() if source in test_sources), default=len(learner_nb["cells"]))
    added = [(at, index) for at, index in added if index <= last_test]  # not flagged: a learner's scratch cells

    # --- steps in the instructor's order, learner cells slotted in
    steps = []
    own: set[str] = set()  # the classes and functions the learner's cells define
    data: set[str] = set()  # the names they bind to a literal table (`C = {}`), which any of their cells may fill in
    learner_modules = modules  # the modules any of their cells imports: a loop that computes a table may call them
    for cell in learner_nb["cells"]:
        if cell.get("cell_type") == "code":
            try:
                tree = ast.parse(ipython_to_python(cell_source(cell)))
            except (SyntaxError, RecursionError, MemoryError, ValueError, TypeError):
                continue
            own |= set(defined_names(tree))
            learner_modules |= module_aliases([tree])
            for stmt in tree.body:  # `C = {}`, `C: dict[str, float] = {}`; not `h = train(...)`, whose fills act
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
                table = isinstance(getattr(stmt, "value", None), (ast.Dict, ast.List, ast.Set, ast.Tuple))
                if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and table and all(map(_is_name_target, targets)):
                    data |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}

    # Each planned cell parsed once; then which of the actions it drops are to run all the same (`_needed_actions`)
    planned = {i: ex for ex, i in learner_for.items()} | {i: None for _, i in added}
    parsed: dict[int, ast.Module] = {}
    first: dict[int, ast.Module] = {}
    dropped_first: dict[int, list[ast.stmt]] = {}
    needed = {n for sol in solutions.values() for n in sol["names"]}
    for i, ex in planned.items():
        try:
            parsed[i], deep = without_deep(ast.parse(ipython_to_python(cell_source(learner_nb["cells"][i]))))
            if deep:
                notes.append(
                    f"cell {i}: {len(deep)} statement(s) nested too deep to analyse (line {deep[0].lineno}) were "
                    "left out of the judge's run"
                )
            if ex is not None and solutions[ex]["top_level_code"]:
                needed |= global_uses(parsed.pop(i))
            else:
                first[i], dropped_first[i] = _planned(parsed[i], frozenset(own), frozenset(data), learner_modules)
        except (SyntaxError, RecursionError, MemoryError, ValueError, TypeError):
            parsed.pop(i, None)
    exercise_names = {i: solutions[ex]["names"] for i, ex in planned.items() if ex is not None}
    kept_whole, note = (
        _needed_actions(parsed, first, dropped_first, needed, exercise_names, learner_modules) if parsed else ({}, None)
    )
    if note:
        notes.append(note)

    def learner_step(learner_index: int, ex: str | None):
        text = cell_source(learner_nb["cells"][learner_index])
        filename = f"<learner {name} cell {learner_index}>"
        step = {
            "kind": "learner",
            "cell": learner_index,
            "exercise": ex,
            "filename": filename,
            "code": "",
            "dropped": [],
        }
        try:
            tree = parsed.get(learner_index) or without_deep(ast.parse(ipython_to_python(text)))[0]
            keep_all = ex is not None and solutions[ex]["top_level_code"]
            if not keep_all:
                keep = kept_whole.get(learner_index, frozenset())
                tree, step["dropped"] = definitions_only(tree, frozenset(own), frozenset(data), learner_modules, keep)
            step["defines"] = defined_names(tree)
            step["code"] = ast.unparse(tree)
            binds, uses = binds_and_uses(tree, modules)
        except SyntaxError as err:
            step["error"] = f"SyntaxError: {err.msg} (line {err.lineno})"
            return step
        except (RecursionError, MemoryError, ValueError, TypeError) as err:  # nested too deep for the parser
            step.update(error=f"{type(err).__name__}: the cell could not be parsed", code="")
            return step
        step["binds"], step["uses"] = sorted(binds), sorted(uses)
        return step

    for index, cell in enumerate(src_cells):
        kind = cell_kind(cell)
        if kind == "given":
            text = ipython_to_python(cell_source(cell))
            tree = ast.parse(text)
            binds, uses = binds_and_uses(tree, modules)
            steps.append(
                {
                    "kind": "given",
                    "cell": index,
                    "code": text,
                    "filename": f"<given {name} cell {index}>",
                    "binds": sorted(binds),
                    "uses": sorted(uses),
                    "definitions": _only_definitions(tree),
                }
            )
        elif kind == "solution":
            ex = nbgrader_meta(cell)["grade_id"]
            if ex in learner_for:
                steps.append(learner_step(learner_for[ex], ex))
        for anchor_index, learner_index in added:
            if anchor_index == index:
                steps.append(learner_step(learner_index, None))
    if any(a == -1 for a, _ in added):
        first = [learner_step(i, None) for a, i in added if a == -1]
        steps = first + steps

    return {
        "notebook": name,
        "steps": steps,
        "solutions": {
            k: {"names": v["names"], "uses": v["uses"], "found": k in learner_for} for k, v in solutions.items()
        },
        "notes": notes,
    }
