"""Static half of the clean re-check: which code of a submission runs, in which order, and what is refused.

The re-check re-runs a notebook's graded tests in a fresh interpreter, with the instructor's own code for every
cell that is not an exercise, the learner's *definitions* (imports, functions, classes, plain assignments) for the
exercises and for cells they added, and the course's test cells. This module builds that plan from the solution
notebook and the learner's (normalised) notebook without running anything:

- learner cells are reduced to definitions: top-level statements that do something (calls, `torch.x = ...`,
  loops, `del`) are dropped, so a patch made at top level never reaches the re-check;
- learner code is scanned for constructs a solution never needs and that could reach the grader or the
  reference: frame and garbage-collector introspection, `exec`/`eval`/`compile`, `globals()`, imports of
  `sys`/`inspect`/`gc`/`ctypes`/`transformer_lens`/harness internals, `harness.components`, `__code__`,
  `__globals__`, `__subclasses__` ... A solution cell using one scores 0 for that exercise; a cell the learner
  added that uses one is left out of the re-check;
- an exercise's cell may not name the calls that exercise forbids (`instructor.guards.FORBIDDEN_CALLS`:
  `torch.nn.functional.layer_norm` in the LayerNorm exercise ...): the exercise scores 0, flagged with the call;
- given cells that the tests do not need (plots, prints) are left out to save time (backward slicing on names).

A cell the parser cannot take (a syntax error, an expression nested too deep for it) is reported on that cell;
nothing in a submission stops the plan from being built.
"""

from __future__ import annotations

import ast
import builtins
import copy
import re

from instructor.course import cell_kind, cell_source, nbgrader_meta

# `os`, `pathlib` and `io` are not here: honest code reads an environment variable or names a file with them, and
# what they could do that matters (open the course's files, start a process, signal, change directory) is refused
# where it runs (`instructor.guards`' audit hook, the sandbox, the kernel's process limit), whatever module reached it.
FORBIDDEN_MODULES = {
    "builtins",
    "code",
    "codeop",
    "ctypes",
    "dis",
    "gc",
    "importlib",
    "inspect",
    "marshal",
    "multiprocessing",
    "pdb",
    "bdb",
    "pickle",
    "shutil",
    "signal",
    "socket",
    "subprocess",
    "sys",
    "threading",
    "_thread",
    "traceback",
    "weakref",
    "atexit",
    "faulthandler",
    "tracemalloc",
    "transformer_lens",
    "instructor",
    "nbgrader",
    "unittest",
    "pytest",
    "cffi",
}
# What a learner may import from harness in their own code; the checks, the reference model and the course's own
# components are off limits.
ALLOWED_HARNESS_NAMES = {"Config", "gpt2_encoding", "gpt2_tokenizer"}
FORBIDDEN_NAMES = {
    "exec",
    "eval",
    "compile",
    "__import__",
    "globals",
    "locals",
    "breakpoint",
    "open",
    "input",
    "__builtins__",
    "__builtin__",
    "__loader__",
    "__spec__",
    "get_ipython",
    "components",
    "load_reference_gpt2",
    "component_source",
    "harness",
    "delattr",
}
FORBIDDEN_ATTRS = {
    # frames, code objects and the garbage collector's view of other objects
    "f_back",
    "f_locals",
    "f_globals",
    "f_code",
    "f_builtins",
    "f_trace",
    "tb_frame",
    "tb_next",
    "gi_frame",
    "gi_code",
    "cr_frame",
    "cr_code",
    "ag_frame",
    "ag_code",
    "_getframe",
    "currentframe",
    "__code__",
    "__globals__",
    "__closure__",
    "__func__",
    "__self__",
    "__builtins__",
    "__subclasses__",
    "__bases__",
    "__base__",
    "__mro__",
    "__dict__",
    "__class__",
    "__wrapped__",
    "__getattribute__",
    "__setattr__",
    "__delattr__",
    "__import__",
    "__loader__",
    "__spec__",
    "__torch_function__",
    "__torch_dispatch__",
    "__init_subclass__",
    # ways to modules that are off limits (torch.sys, np.os ...)
    "sys",
    "os",
    "gc",
    "inspect",
    "ctypes",
    "builtins",
    "importlib",
    "traceback",
    "types",
    "subprocess",
    "_C",
    # the course's own answers and the grader
    "components",
    "component_source",
    "load_reference_gpt2",
    "course",
    "checks",
    "_assertions",
    "_loaded",
    "reference",
    "harness",
    "transformer_lens",
    # hooks (on the reference model or on every module) and storage tricks
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_module_forward_hook",
    "register_module_forward_pre_hook",
    "_forward_hooks",
    "_forward_pre_hooks",
    "add_hook",
    "add_perma_hook",
    "hooks",
    "set_",
    "untyped_storage",
    "storage",
    "data_ptr",
}
READABLE_DUNDERS = {"__class__"}  # x.__class__ is type(x): a harmless read on anything (assigning it stays refused)
# `x.__dict__` and `vars(x)` read an object's attributes (`vars(args)`, a dataclass's fields): allowed; changing
# another object through them (`torch.__dict__["allclose"] = ...`, `vars(m).update(...)`) is not, nor reading a
# module's.
DICT_DUNDER = "__dict__"
_MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__", "__ior__"}
# Refused names that a learner may bind as its own (a parameter `input`, a local `components`): then they are its own.
SHADOWABLE_NAMES = {"input", "open", "components", "harness", "load_reference_gpt2", "component_source"}


def own_names(tree: ast.AST) -> set[str]:
    """Every name `tree` binds itself: functions, classes, parameters, assignment and loop targets, `as` names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


# Modules that `setattr`, `vars` and `__dict__` may not reach (a learner's own objects they may), besides those the
# code imports.
MODULE_NAMES = {"torch", "nn", "F", "np", "numpy", "math", "einops", "functools", "jaxtyping", "harness"}


_SUSPICIOUS_STRING = re.compile(r"__(code|globals|closure|builtins|subclasses|dict|class|bases|mro)__|f_back|f_locals")


def _suspicious(text: str) -> bool:
    """A string that names an attribute the scan refuses, as `getattr(x, "__globals__")` would: one word, no
    spaces (a docstring or a message that mentions `__class__` is prose, not a way around the checks)."""
    return not any(c.isspace() for c in text) and bool(_SUSPICIOUS_STRING.search(text))


class Finding(str):
    """A refused construct, as a message naming the line (`lineno`)."""

    lineno: int | None = None


# Cell magics that run their cell's code in the notebook's namespace, as if they were not there: what the cell
# defines is defined (`%%time` over a class made it a string passed to a magic, and the exercise went missing).
TRANSPARENT_CELL_MAGICS = {"time", "capture"}


def ipython_to_python(source: str) -> str:
    """Cell source as plain Python (`%magic` and `!shell` lines become `get_ipython()` calls; the body of a cell
    under `%%time` or `%%capture` is the cell's code)."""
    if not re.search(r"^\s*[%!]|\?\s*$", source, flags=re.MULTILINE):
        return source
    first, _, body = source.lstrip("\n").partition("\n")
    magic = re.match(r"%%(\w+)", first.strip())
    if magic and magic.group(1) in TRANSPARENT_CELL_MAGICS:
        return ipython_to_python(body)
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def forbidden_calls(notebook: str) -> dict[str, str]:
    """{name: the full name of the call} that `notebook`'s exercises forbid."""
    from instructor.guards import FORBIDDEN_CALLS

    names: dict[str, str] = {}
    for module, attr in FORBIDDEN_CALLS.get(notebook, {}):
        names.setdefault(attr, f"{module}.{attr}")  # the first listed: the one a learner would write
    return names


# What an exercise needs that exercise code may not use elsewhere: notebook 08's first exercise is about hooks.
# The ablation and patching exercises are to hook TransformerLens's model: `run_with_hooks`, or as honestly its
# `hooks(...)` context manager or `add_hook` and `reset_hooks`.
_TL_HOOKS = {"hooks", "add_hook"}
EXERCISE_ALLOWS = {
    ("08_interpretability", "cache_activations"): {"register_forward_hook", "register_forward_pre_hook"},
    ("08_interpretability", "mean_ablate_heads"): _TL_HOOKS,
    ("08_interpretability", "patch_resid_pre"): _TL_HOOKS,
}
# Modules a notebook's exercise code may import although others may not: 08's exercises take TransformerLens's
# models and caches (an honest `from transformer_lens import HookedTransformer` for an annotation). Its ready-made
# answers stay refused where they run (`instructor.judge.TL_EXERCISES`).
NOTEBOOK_MODULES = {"08_interpretability": {"transformer_lens"}}


def scan(
    tree: ast.AST,
    forbidden: dict[str, str] | None = None,
    allowed: frozenset[str] = frozenset(),
    modules: frozenset[str] = frozenset(),
) -> list[Finding]:
    """Refused constructs anywhere in `tree`; `forbidden`: the calls the exercise forbids (forbidden_calls);
    `allowed`: attribute names this exercise may use although others may not (EXERCISE_ALLOWS); `modules`: modules
    this notebook's code may import although others may not (NOTEBOOK_MODULES)."""
    findings = []
    forbidden = forbidden or {}
    refused_modules = FORBIDDEN_MODULES - modules
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    module_names = MODULE_NAMES | module_aliases([tree])
    own = own_names(tree)

    def add(node, what):
        finding = Finding(f"line {getattr(node, 'lineno', '?')}: {what}")
        finding.lineno = getattr(node, "lineno", None)
        findings.append(finding)

    def mutated(node) -> bool:
        """Whether the object `node` evaluates to (a `__dict__`, `vars(x)`) is changed where it stands."""
        parent = parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return not isinstance(parent.ctx, ast.Load)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return parent.attr in _MUTATORS
        return isinstance(parent, ast.AugAssign) and parent.target is node

    for node in ast.walk(tree):
        if forbidden:
            named = None
            if isinstance(node, ast.Attribute) and node.attr in forbidden:
                named = node.attr
            elif isinstance(node, ast.Name) and node.id in forbidden and node.id not in own:
                named = node.id  # the library's function, imported by name (the learner's own `layer_norm` may be)
            elif isinstance(node, ast.ImportFrom):
                named = next((a.name for a in node.names if a.name in forbidden), None)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in forbidden:
                named = node.value  # getattr(F, "layer_norm")
            if named:
                add(node, f"uses {forbidden[named]}, which this exercise forbids (write it yourself)")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in refused_modules or alias.name.split(".")[0] == "harness":
                    add(node, f"`import {alias.name}` (not allowed in exercise code)")
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")[0]
            if node.level or module in refused_modules:
                add(node, f"`from {'.' * node.level}{node.module or ''} import ...` (not allowed in exercise code)")
            elif module == "harness":
                bad = [a.name for a in node.names if node.module != "harness" or a.name not in ALLOWED_HARNESS_NAMES]
                if bad:
                    add(
                        node,
                        f"`from {node.module} import {', '.join(bad)}` (only {sorted(ALLOWED_HARNESS_NAMES)} "
                        "may be imported from harness in exercise code)",
                    )
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            if not (node.id in SHADOWABLE_NAMES and node.id in own):
                add(node, f"`{node.id}` (not allowed in exercise code)")
        elif isinstance(node, ast.Name) and node.id == "vars":
            call = parents.get(node)
            one = isinstance(call, ast.Call) and call.func is node and len(call.args) == 1 and not call.keywords
            if not one or isinstance(call.args[0], ast.Starred):
                add(node, "`vars` other than `vars(x)` (not allowed in exercise code)")
            elif mutated(call) or _root_name(call.args[0]) in module_names:
                add(node, "`vars(x)` changed, or of a module (not allowed in exercise code)")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS and node.attr not in allowed:
            reading = isinstance(node.ctx, ast.Load)
            if node.attr == DICT_DUNDER:
                if not reading or mutated(node) or _root_name(node.value) in module_names:
                    add(node, "`.__dict__` changed, or of a module (not allowed in exercise code)")
            elif not (reading and node.attr in READABLE_DUNDERS):
                add(node, f"`.{node.attr}` (not allowed in exercise code)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            target = _root_name(node.args[0]) if node.args else None
            if target is None or target in module_names:
                add(node, "`setattr` on a module, or on what the scan cannot name (not allowed in exercise code)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _suspicious(node.value):
            add(node, f"the string {node.value[:40]!r} (looks like a way around the checks)")
    return findings


def _is_name_target(target: ast.AST) -> bool:
    if isinstance(target, ast.Name):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_is_name_target(t) for t in target.elts)
    return False


def _is_definition(stmt: ast.stmt) -> bool:
    keep = isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass))
    keep |= isinstance(stmt, ast.Assign) and all(_is_name_target(t) for t in stmt.targets)
    keep |= isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    return keep or isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _definitions_in(body: list[ast.stmt], dropped: list[ast.stmt]) -> list[ast.stmt]:
    """The definitions of `body`. An `if`, `try` or `with` that defines something is kept with only its definitions
    (`try: from x import y` / `except ImportError: y = None`, a constant chosen by an `if`): its condition or context
    runs as an assignment's value would; a `try` whose body holds an action is dropped whole. Loops and everything
    else are actions, dropped into `dropped`."""
    kept = []
    for stmt in body:
        if _is_definition(stmt):
            kept.append(stmt)
            continue
        if isinstance(stmt, (ast.If, ast.Try, ast.TryStar, ast.With)):
            inner: list[ast.stmt] = []
            node = copy.copy(stmt)
            fields = ["body", "orelse", "finalbody"]
            for field in fields:
                if hasattr(node, field):
                    part = _definitions_in(getattr(stmt, field), inner)
                    setattr(node, field, part or ([ast.Pass()] if field == "body" else []))
            if isinstance(stmt, (ast.Try, ast.TryStar)) and len(node.body) != len(stmt.body):
                # an action dropped from a `try` body could have raised and sent the code to a handler: without
                # it the definitions after it would run where they never did (`connect(); X = None` under `try`)
                dropped.append(stmt)
                continue
            if isinstance(stmt, (ast.Try, ast.TryStar)):
                node.handlers = [copy.copy(h) for h in stmt.handlers]
                for handler in node.handlers:
                    handler.body = _definitions_in(handler.body, inner) or [ast.Pass()]
            defines = any(
                not isinstance(n, ast.Pass) for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node
            )
            if defines:
                kept.append(ast.fix_missing_locations(ast.copy_location(node, stmt)))
                dropped.extend(inner)
                continue
        dropped.append(stmt)
    return kept


def definitions_only(tree: ast.Module) -> tuple[ast.Module, list[str]]:
    """`tree` with only imports, function/class definitions and assignments to plain names (also inside an `if`, a
    `try` or a `with`); and what was dropped."""
    dropped: list[ast.stmt] = []
    kept = _definitions_in(tree.body, dropped)
    notes = [f"line {s.lineno}: `{ast.unparse(s).splitlines()[0][:60]}`" for s in dropped]
    return ast.Module(body=kept, type_ignores=[]), notes


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


def global_uses(tree: ast.Module) -> set[str]:
    """Global names a cell reads: at top level, and inside its functions and classes (not their local names)."""
    import symtable

    def walk(table, out):
        for sym in table.get_symbols():
            if sym.is_referenced() and (table.get_type() == "module" or sym.is_global()):
                out.add(sym.get_name())
        for child in table.get_children():
            walk(child, out)
        return out

    try:
        return walk(symtable.symtable(ast.unparse(tree), "<cell>", "exec"), set())
    except SyntaxError:
        return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def _only_definitions(tree: ast.Module) -> bool:
    return all(
        isinstance(s, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass))
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        for s in tree.body
    )


def _norm(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def build_plan(source_nb: dict, learner_nb: dict, name: str, order: list[str], slice_given: bool = True) -> dict:
    """The re-check plan for one submitted notebook (JSON-serialisable)."""
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
            given_by_text.setdefault(_norm(cell_source(cell)), index)
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
            tests[meta["grade_id"]] = {"index": index, "exercise": exercise, "points": float(meta.get("points", 0))}
    test_texts = {_norm(cell_source(src_cells[t["index"]])) for t in tests.values()}
    exercise_names = sorted({n for s in solutions.values() for n in s["names"]})

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
        elif grade_id in tests or _norm(cell_source(cell)) in test_texts:
            mapped[index] = tests[grade_id]["index"] if grade_id in tests else None
        elif _norm(cell_source(cell)) in given_by_text:
            mapped[index] = given_by_text[_norm(cell_source(cell))]
    for ex, sol in solutions.items():
        if ex in learner_for:
            continue
        # nbgrader metadata gone (stripped, or the code pasted into a new cell): find the exercise by its names
        for index, cell in enumerate(learner_nb["cells"]):
            if cell.get("cell_type") != "code" or index in mapped:
                continue
            try:
                names = defined_names(ast.parse(ipython_to_python(cell_source(cell))))
            except (SyntaxError, RecursionError, MemoryError, ValueError):
                continue
            if sol["names"] and set(sol["names"]) <= set(names):
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

    # --- steps in the instructor's order, learner cells slotted in
    steps = []
    forbidden = forbidden_calls(name)

    def learner_step(learner_index: int, ex: str | None):
        text = cell_source(learner_nb["cells"][learner_index])
        filename = f"<learner {name} cell {learner_index}>"
        step = {
            "kind": "learner",
            "cell": learner_index,
            "exercise": ex,
            "filename": filename,
            "code": "",
            "findings": [],
            "dropped": [],
        }
        try:
            tree = ast.parse(ipython_to_python(text))
            keep_all = ex is not None and solutions[ex]["top_level_code"]
            if not keep_all:
                tree, step["dropped"] = definitions_only(tree)
            allowed = frozenset(EXERCISE_ALLOWS.get((name, ex), ()))
            modules = frozenset(NOTEBOOK_MODULES.get(name, ()))
            findings = scan(tree, forbidden if ex is not None else None, allowed, modules)
            # A refused statement is left out and the rest of the cell runs where it can stand alone: any of a
            # cell of the learner's own (`import sys` beside the helper an exercise uses), an import in an
            # exercise's cell (an unused `import inspect`). Whatever else an exercise's cell is refused for costs
            # the exercise, as code that reaches for the grader would.
            kept, left_out = [], []
            for stmt in tree.body:
                lines = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
                own = [f for f in findings if f.lineno in lines]
                if own and (ex is None or isinstance(stmt, (ast.Import, ast.ImportFrom))):
                    left_out += own
                else:
                    kept.append(stmt)
            tree = ast.Module(body=kept, type_ignores=[])
            step["left_out"] = list(left_out)
            step["findings"] = [f for f in findings if f not in left_out]
            step["defines"] = defined_names(tree)
            step["code"] = ast.unparse(tree)
            binds, uses = binds_and_uses(tree, modules)
        except SyntaxError as err:
            step["error"] = f"SyntaxError: {err.msg} (line {err.lineno})"
            return step
        except (RecursionError, MemoryError, ValueError, TypeError) as err:  # nested too deep for the parser
            step.update(error=f"{type(err).__name__}: the cell could not be parsed", code="", findings=[])
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
        elif kind == "test":
            grade_id = nbgrader_meta(cell)["grade_id"]
            text = ipython_to_python(cell_source(cell))
            _, uses = binds_and_uses(ast.parse(text))
            steps.append(
                {
                    "kind": "test",
                    "cell": index,
                    "grade_id": grade_id,
                    "code": text,
                    "filename": f"<test {name} {grade_id}>",
                    "exercise": tests[grade_id]["exercise"],
                    "points": tests[grade_id]["points"],
                    "uses": sorted(uses),
                    "exercise_names": sorted(uses & set(exercise_names)),
                }
            )
        for anchor_index, learner_index in added:
            if anchor_index == index:
                steps.append(learner_step(learner_index, None))
    if any(a == -1 for a, _ in added):
        first = [learner_step(i, None) for a, i in added if a == -1]
        steps = first + steps

    # --- given cells the tests do not need are skipped
    if slice_given:
        needed = set()
        for step in reversed(steps):
            if step["kind"] == "given":
                if step["definitions"] or needed & set(step["binds"]):
                    needed |= set(step["uses"])
                else:
                    step["skip"] = True
            else:
                needed |= set(step.get("uses", []))
                needed |= set(step.get("binds", []))  # a learner rebinding a given name needs the given one
    protected = sorted({b for s in steps if s["kind"] == "given" for b in s["binds"]} - set(exercise_names))
    return {
        "notebook": name,
        "order": order,
        "steps": steps,
        "tests": tests,
        "solutions": {
            k: {"names": v["names"], "uses": v["uses"], "found": k in learner_for} for k, v in solutions.items()
        },
        "exercise_names": exercise_names,
        "protected": protected,
        "notes": notes,
    }
