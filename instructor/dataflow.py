"""Which names Python code reads and may change, read from its syntax alone: what the grader's nbgrader run needs to
run of a notebook (`cells_to_run`), and which of a learner's actions the judge's plan keeps (`instructor.plan`).

Nothing here imports nbgrader, so the grader's bounded children that plan a notebook (`grade.write_plans`) start
in milliseconds: importing it there cost 2.5 s a notebook.
"""

from __future__ import annotations

import ast
import builtins

from instructor.course import GIVEN


def _is_grade(cell) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get("grade", False))


_BUILTINS = frozenset(dir(builtins)) - {"__builtins__"}
# A cell that reads one of these may read any name: every cell before it runs.
_DYNAMIC = frozenset(
    "exec eval globals locals vars __import__ get_ipython sys inspect builtins importlib __main__ __builtins__".split()  # noqa: SIM905
)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


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


def cells_to_run(cells: list) -> set[int]:
    """The code cells nbgrader runs: none after the last graded cell (cells run in order, so none can change a
    score); before it, every graded cell, every cell of the learner's, and each of the course's own cells (marked
    `GIVEN` by the normaliser) that may bind or change a name read by a cell that runs after it, or by the body of
    a function or class any running cell defines (it may be called later). The rest are the course's
    demonstrations (a training run, a comparison, a plot), which decide nothing.

    Conservative by design: a cell may change what it binds (walrus targets included), what any call in it is
    given or is called on (`train(model, args)` and `model.eval()` change `model`; a call of a builtin, of a module's
    function or of a method that only reads, `x.mean()`, does not), and whatever a changed name was made from
    (`w = model.weight` then `w.zero_()` changes `model`; `opt.step()` changes what `opt` was made from). A cell that
    sets a module's settings or attributes, writes a file or changes the process (`torch.set_default_dtype`,
    `open(p, "w")`, `os.chdir`) always runs; a seed only changes which numbers are drawn next. A cell with a magic,
    one the parser cannot take, or one that reads names dynamically (`globals()`, `exec`, `sys`, `global`, a star
    import) makes every cell up to the last graded one run, as does a notebook too big to analyse quickly
    (`MAX_CODE_CHARS`, `MAX_STATEMENTS`, `MAX_STEPS`).
    """
    code = [i for i, cell in enumerate(cells) if cell.cell_type == "code"]
    last = max((i for i in code if _is_grade(cells[i])), default=-1)
    everything = {i for i in code if i <= last}
    if sum(len(cells[i].source) for i in everything) > MAX_CODE_CHARS:
        return everything
    trees = {}
    for i in sorted(everything):
        try:  # plain Python only: a magic (`%time f(x)`) holds code as a string, whose names are not seen
            trees[i] = ast.parse(cells[i].source)
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            return everything
    if sum(len(tree.body) for tree in trees.values()) > MAX_STATEMENTS:
        return everything
    try:
        return _live(cells, trees, _Budget(MAX_STEPS))
    except (RecursionError, MemoryError, ValueError, _Spent):  # too deep or too big to analyse: no cell is left out
        return everything


MAX_STATEMENTS = 5000  # a notebook's top-level statements past which every cell runs
# ... and characters of code: reading a cell is linear in its size but slow (a 6 MB list literal took 43 s of the
# nbgrader worker's time before any cell ran, outside any bound); the course's largest notebook has 40,000
MAX_CODE_CHARS = 1_000_000
# Steps of the analysis (links between names recorded, and followed) past which every cell runs. Its cost is not
# linear in the statements: one `(a0, ..., aN) = (b0, ..., bN)` links every name to every other, and each course
# cell that may change a name follows the links; such a cell held an nbgrader worker 171 s, outside the sandbox,
# before any cell ran (red-team round 18). The course's own notebooks take under 1% of this (`tests/`).
MAX_STEPS = 2_000_000


class _Spent(Exception):
    pass


class _Budget:
    """The steps the analysis may still take: it gives up (`_Spent`) rather than run long in the grader's worker."""

    def __init__(self, steps: int):
        self.left = steps

    def take(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise _Spent


def _live(cells: list, trees: dict, budget: _Budget) -> set[int]:
    modules = frozenset(
        (alias.asname or alias.name).split(".")[0]
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    )
    made_from: dict[str, set[str]] = {}  # a name -> the names its value was made from (an alias may share them)
    info = {}  # cell -> (ours, what it may change, its top-level reads, its functions' and classes' reads)
    constants = _constant_names(trees)
    libraries = modules | _library_names(cells, trees) | constants  # what nothing made from them can change
    for i, tree in trees.items():
        dynamic = _dynamic(tree)
        if dynamic == "inside":  # a function that reads or binds names dynamically may run after any cell
            return set(trees)
        _derivations(tree, libraries, made_from, budget)
        ours = cells[i].metadata.get(GIVEN) is True and not _is_grade(cells[i])
        info[i] = (ours, _binds(tree) | (_changes(tree, modules) - constants), *_reads(tree), dynamic is not None)
    runs: set[int] = set()
    while True:  # the least set that needs nothing more: each round only adds cells (their bodies' reads)
        needed = set().union(*(info[i][3] for i in runs))
        now, everything = set(), False
        for i in sorted(info, reverse=True):
            ours, changes, top, inner, dynamic = info[i]
            if not ours or everything or SETTINGS in changes or _with_sources(changes, made_from, budget) & needed:
                now.add(i)
                needed |= top | inner
                everything = everything or dynamic  # it may read anything: every cell before it runs
        if now == runs:
            return runs
        runs = now


def _library_names(cells: list, trees: dict) -> frozenset[str]:
    """Classes the course's own cells import from a library (`from harness import Config`) and no cell binds any
    other way, which what is made from them does not share (`cfg = Config.from_reference(reference)` is an
    instance, as `Config(...)` is). Counted as sources, they made every cell that calls the learner's code on a
    model (a model made from `cfg`) one that may change `Config`, which every later class reads in its annotations:
    07's demonstrations, 10 s of its nbgrader run, all ran (measured). A class by its name (`_class_like`): an
    imported object (`FAST_CONFIG`, a list) stays a source, as an alias can change it (red-team round 52);
    `tests/test_grading.py` checks that every such name the course imports is a class."""
    imported, bound = set(), set()
    for i, tree in trees.items():
        ours = cells[i].metadata.get(GIVEN) is True and not _is_grade(cells[i])
        for node in _top_level(tree):
            if isinstance(node, ast.ImportFrom) and ours:
                imported |= {a.asname or a.name for a in node.names}
        others = [stmt for stmt in tree.body if not isinstance(stmt, ast.ImportFrom)]
        bound |= _binds(ast.Module(body=others, type_ignores=[]))
        if not ours:
            bound |= _binds(tree)
    return frozenset(name for name in imported - bound if _class_like(name))


def _class_like(name: str | None) -> bool:
    """A class's name, by Python's convention (CapWords: `Config`, `GPT2LMHeadModel`), not a constant's (`EOT`,
    `FAST_CONFIG`) nor a function's or module's."""
    return bool(name) and name[0].isupper() and not name.isupper()


def _constant_names(trees: dict) -> frozenset[str]:
    """Names every cell binds only to a number, a string or a tuple of them (`EOT = 50256`): no call changes such a
    value, so a cell that passes it to one (`generate(model, p, n, eos_token_id=EOT)`) does not change it. Counted,
    that made every such demonstration one that changes what the learner's functions read as defaults."""
    constant, other = set(), set()
    for tree in trees.values():
        rest = []
        for stmt in tree.body:
            names = isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets)
            if names and _immutable(stmt.value):
                constant |= {t.id for t in stmt.targets}
                continue
            rest.append(stmt)
        other |= _binds(ast.Module(body=rest, type_ignores=[]))
    return frozenset(constant - other)


def _immutable(value: ast.AST) -> bool:
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
        value = value.operand
    if isinstance(value, ast.Tuple):
        return all(map(_immutable, value.elts))
    return isinstance(value, ast.Constant)


def _with_sources(names: set[str], made_from: dict[str, set[str]], budget: _Budget) -> set[str]:
    out, todo = set(names), list(names)
    while todo:
        sources = made_from.get(todo.pop(), ())
        budget.take(1 + len(sources))
        for source in sources:
            if source not in out:
                out.add(source)
                todo.append(source)
    return out


def _top_level(tree: ast.Module):
    """The nodes of a cell that run when it runs: not the bodies of its functions, classes and lambdas."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend([*getattr(node, "decorator_list", []), *getattr(node, "bases", [])])
            continue
        stack.extend(ast.iter_child_nodes(node))


def _binds(tree: ast.Module) -> set[str]:
    """Every name a cell's top-level code binds: assignment, loop, `with`, `except` and walrus targets, `match`
    captures, imports, definitions, `del`."""
    out = set()
    for node in _top_level(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif (
            isinstance(node, ast.ExceptHandler)
            and node.name
            or isinstance(node, (ast.MatchAs, ast.MatchStar))
            and node.name
        ):
            out.add(node.name)
    return out


def _derivations(tree: ast.Module, modules: frozenset[str], made_from: dict[str, set[str]], budget: _Budget) -> None:
    """What each name a cell binds was made from (`w = model.weight`: `w` from `model`; `for r in rows`: `r` from
    `rows`; `d[k] = v`: `d` from `v`), added to `made_from`."""
    for node in _top_level(tree):
        pairs = []
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
            pairs = [(node.target, node.value)]
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            pairs = [(node.target, node.iter)]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            pairs = [(node.optional_vars, node.context_expr)]
        for target, value in pairs:
            sources = _aliased(value) - modules - _BUILTINS
            for n in ast.walk(target):
                name = n.id if isinstance(n, ast.Name) else _root_name(n) if isinstance(n, ast.Subscript) else None
                if name:
                    budget.take(1 + len(sources))
                    made_from.setdefault(name, set()).update(sources - {name})


def _aliased(value: ast.AST) -> set[str]:
    """The names whose objects `value` may share: `model.blocks[0]` and `x.view(...)` share `model`'s and `x`'s (a
    method may return its object or a view of it), `SGD(model.parameters())` and `enumerate(rows)` what they are
    given."""
    if isinstance(value, ast.Name):
        return {value.id}
    if isinstance(value, (ast.Attribute, ast.Subscript, ast.Starred)):
        return _aliased(value.value)
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*map(_aliased, value.elts))
    if isinstance(value, ast.Dict):
        return set().union(*map(_aliased, value.values))
    if isinstance(value, ast.IfExp):
        return _aliased(value.body) | _aliased(value.orelse)
    if isinstance(value, ast.Call):  # its object (a method may return it, or a view), and what it is given (an
        # optimiser keeps the parameters, a wrapper its model)
        given = set().union(*map(_aliased, [*value.args, *(k.value for k in value.keywords)]))
        return given | (_aliased(value.func.value) if isinstance(value.func, ast.Attribute) else set())
    return set()


def _dynamic(tree: ast.Module) -> str | None:
    """Whether a cell may read or bind names by other means than naming them (`globals()`, `import sys`, a `global`
    statement, a star import): "inside" a function or class (which may run after any cell), "top" at top level,
    or None."""
    top = set(map(id, _top_level(tree)))
    found = None
    for node in ast.walk(tree):
        dynamic = (
            isinstance(node, ast.Name)
            and node.id in _DYNAMIC
            or isinstance(node, (ast.Global, ast.Nonlocal))
            or isinstance(node, ast.Import)
            and any(a.name.split(".")[0] in _DYNAMIC for a in node.names)
            or isinstance(node, ast.ImportFrom)
            and ((node.module or "").split(".")[0] in _DYNAMIC or any(a.name == "*" for a in node.names))
        )
        if dynamic and id(node) not in top:
            return "inside"
        found = found or ("top" if dynamic else None)
    return found


def _reads(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Global names a cell reads before it binds them itself (`fig, ax = plt.subplots()` then `ax.plot(...)` does
    not read an earlier cell's `ax`), and every global name its functions and classes read (when they are called,
    which may be after another cell has bound it again). Builtins are left out."""
    bound: set[str] = set()
    top: set[str] = set()
    inner: set[str] = set()
    for stmt in tree.body:
        reads = global_uses(ast.Module(body=[stmt], type_ignores=[]))
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner |= reads
            bound.add(stmt.name)
            continue
        top |= reads - bound
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and _whole(t, n)}
    return top - _BUILTINS, inner - _BUILTINS


def _whole(target: ast.AST, name: ast.Name) -> bool:
    """Whether `target` rebinds `name` as a whole (`a`, `a, (b, *c)`), not an item or attribute of it (`a[0]`)."""
    if target is name:
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_whole(t, name) for t in target.elts)
    return isinstance(target, ast.Starred) and _whole(target.value, name)


SETTINGS = "<a module's settings>"  # changed: seen by code everywhere (the checks' too), so the cell always runs
# Methods that only read what they are called on (tensors', containers', strings', plots' getters): the rest may
# change it (`zero_()`, `append`, `load_state_dict`, `register_forward_hook`, `step`).
_READS_ONLY = frozenset(  # not `to`, `float`, `cpu`, `sort`: a module's and a list's change what they are called on
    "item tolist numpy mean sum prod softmax log_softmax argmax argmin max min std var norm abs exp log sqrt clone "  # noqa: SIM905
    "detach view reshape flatten unsqueeze squeeze permute transpose t contiguous topk argsort gather index_select "
    "masked_fill where eq ne lt gt le ge all any cumsum split chunk expand expand_as repeat flip roll size dim numel "
    "nonzero unique count index get keys values items format join startswith endswith strip lower upper copy "
    "parameters named_parameters state_dict buffers named_modules modules children to_tokens to_string "
    "to_str_tokens run_with_cache isclose allclose equal".split()
)
# Module functions that write files or change the process or a library's global state, and methods that write
_PROCESS = frozenset(
    "save chdir putenv unsetenv remove unlink rename replace makedirs mkdir rmdir rmtree copy copyfile move "  # noqa: SIM905
    "filterwarnings simplefilter basicConfig system".split()
)
_WRITES = frozenset("write write_text write_bytes writelines touch mkdir unlink rmdir".split())  # noqa: SIM905


def _changes(tree: ast.Module, modules: frozenset[str]) -> set[str]:
    """Names a cell's top-level code may change besides those it binds: what a call there is given (a call of a
    builtin or of a module's function changes no argument) or is called on (a method that only reads changes
    nothing); `SETTINGS` if it sets a module's settings or attributes, writes a file or changes the process."""
    out = set()
    for node in _top_level(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out |= {_root_name(d) for d in node.decorator_list} - modules - {None}  # `@torch.no_grad()`: none
        if isinstance(node, ast.Call):
            func, root = node.func, _root_name(node.func)
            attr = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if root in modules and (attr in _PROCESS or attr.startswith(("set_", "use_"))) or attr in _WRITES:
                out.add(SETTINGS)
            if isinstance(func, ast.Name) and func.id == "open" and _writes(node):
                out.add(SETTINGS)
            pure = (root in modules and not attr.endswith("_")) or attr in _READS_ONLY  # `nn.init.normal_(w)` is not
            pure = pure or isinstance(func, ast.Name) and func.id in _BUILTINS
            if not pure:
                out |= {_root_name(a) for a in [*node.args, *(k.value for k in node.keywords)]} - modules
                if isinstance(func, ast.Attribute):  # what it is called on: `model.eval()` changes `model`;
                    # `Model(cfg).eval()` a new model, made from `cfg` (as `_derivations` has it), not the class;
                    # `mask(4).zero_()` what a function returned, which may be its cached object: the function
                    out |= _aliased(func.value) - modules
                    if not (_class_like(root) and any(isinstance(n, ast.Call) for n in ast.walk(func.value))):
                        out |= {root} - modules
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            if any(not isinstance(t, ast.Name) and _root_name(t) in modules for t in targets):
                out.add(SETTINGS)  # `torch.backends.cudnn.deterministic = True`, `plt.rcParams[k] = v`
            # `model.weight = w`, `table[k] = v`, `del model.scale`: the object they are set on changes
            out |= {_root_name(t) for t in targets if isinstance(t, (ast.Attribute, ast.Subscript))}
    out.discard(None)
    return out


def _writes(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return not isinstance(mode, ast.Constant) or any(c in str(mode.value) for c in "wax+")
