"""Run-time half of the clean re-check: guards installed in the fresh interpreter before any learner code runs.

Learner code is recognised by the file name it was compiled with (`<learner ...>`). The guards:

- an audit hook (it cannot be removed once added) refuses, from learner code, frame and garbage-collector
  introspection (`sys._getframe`, `inspect.currentframe`, `gc.get_referrers`, `__code__`, `tb_frame` ...),
  `exec`/`compile`, `ctypes`, starting processes, tracing, reading the course's own files (solutions, grader),
  and changing attributes of the classes of torch, harness and TransformerLens;
- the modules of torch, harness, TransformerLens, einops, builtins and math refuse attribute writes while
  learner code is running (`torch.allclose = ...` raises);
- `harness.components` only hands out notebooks before the one being graded;
- a forward pre-hook on every module refuses a TransformerLens module (the reference model, or one a check
  built) or a course component of this notebook being run from inside a learner's module;
- a snapshot of those modules and classes (what each name is bound to, each function's code and defaults) is
  compared after every step, and restored if learner code changed it another way;
- the instructor's objects (the reference model, its activations, tensors) are fingerprinted and must not change
  while learner code runs;
- before a test runs, the classes and functions it tests must come from the learner's notebook (not from
  harness, TransformerLens or the course's answers), may not read the notebook's reference model or
  activations through globals, and no learner class may subclass torch.Tensor;
- torch's own extension points are part of the snapshot: the torch-function and dispatch mode stacks (a
  `TorchFunctionMode` entered and never left) and the global module hooks (`register_module_forward_hook` ...);
- the `forward` of every TransformerLens module refuses to run for a learner module even when called as
  `.forward()` (which skips the pre-hook);
- the calls an exercise forbids (`FORBIDDEN_CALLS`: `torch.nn.functional.layer_norm` in the LayerNorm exercise
  ...) refuse to run from learner code.

Learner code cannot start a thread or a process (the re-check child runs under RLIMIT_NPROC 0, set before any
learner code: `instructor.probe_runner.no_new_tasks`), so everything it runs runs in the one thread these guards
watch. These guards share the process with the learner's code, so each can in principle be outflanked from inside it;
what makes grading safe is the sandbox around the process (`instructor.sandbox`: nothing outside it to reach)
and the grader's checks outside it (the records' token).
"""

from __future__ import annotations

import builtins
import dis
import math
import os
import sys
import types
from pathlib import Path

LEARNER_PREFIX = "<learner "
REPO_ROOT = Path(__file__).resolve().parent.parent
WATCHED_PREFIXES = ("torch", "harness", "transformer_lens", "einops", "jaxtyping", "numpy")
WATCHED_EXACT = {"builtins", "math", "operator", "functools", "instructor", "instructor.guards"}
# torch has some 1,500 modules; these are the ones a check, or a cheat, goes through.
TORCH_WATCHED = {
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.init",
    "torch.nn.modules.module",
    "torch.nn.parameter",
    "torch.testing",
    "torch.testing._comparison",
    "torch.functional",
    "torch._tensor",
    "torch.linalg",
    "torch.special",
    "torch.autograd",
    "torch.autograd.grad_mode",
    "torch.overrides",
    "torch.random",
    "torch.nn.modules.normalization",
    "torch.nn.modules.linear",
    "torch.nn.modules.sparse",
    "torch.nn.modules.activation",
    "torch.nn.modules.container",
    "torch.serialization",
}
INTROSPECTION_EVENTS = {
    "sys._getframe",
    "sys._current_frames",
    "sys._getframemodulename",
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "sys.settrace",
    "sys.setprofile",
    "sys.addaudithook",
    "exec",
    "compile",
    "function.__new__",
    "code.__new__",
    "os.system",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.startfile",
    "subprocess.Popen",
    "socket.connect",
    "socket.bind",
    "object.__getattr__",
    "cpython.PyInterpreterState_Clear",
    "sys.excepthook",
    "sys.unraisablehook",
    "os.putenv",
    "os.unsetenv",
    "os.chdir",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "shutil.rmtree",
}
HELPER_FILES = ("inspect.py", "traceback.py", "linecache.py")
# What Python itself adds to a module or class when honest code uses it: `warnings`' registry, and the slot names
# `copy.copy(cfg)` and pickling cache on the class (a learner copying the course's `Config` lost the exercise).
PYTHONS_OWN_CACHES = {"__warningregistry__", "__slotnames__"}
GLOBAL_HOOKS = (
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_buffer_registration_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
    "_global_forward_pre_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
)
# What an exercise must compute itself: {notebook: {(module, name): why}}. The static scan (instructor.plan) refuses
# these names in the exercise's code; here they refuse to run from learner code however they were reached.
FORBIDDEN_CALLS = {
    "01_layernorm": {
        ("torch.nn.functional", "layer_norm"): "the exercise is to write LayerNorm",
        ("torch.nn", "LayerNorm"): "the exercise is to write LayerNorm",
        ("torch", "layer_norm"): "the exercise is to write LayerNorm",
    },
    "03_attention": {
        ("torch.nn.functional", "scaled_dot_product_attention"): "the exercise is to write attention",
        ("torch.nn", "MultiheadAttention"): "the exercise is to write attention",
        ("torch.nn.functional", "multi_head_attention_forward"): "the exercise is to write attention",
    },
}


class GradingViolation(RuntimeError):
    """Raised into learner code that tried something the grader refuses."""


def _is_behaviour(value) -> bool:
    """Whether replacing `value` changes what code does (a function, class, descriptor), not just data."""
    return callable(value) or hasattr(type(value), "__get__") or isinstance(value, types.ModuleType)


def _is_learner_code(code) -> bool:
    return code.co_filename.startswith(LEARNER_PREFIX)


_LIBRARY_DIRS = (os.path.dirname(os.__file__) + os.sep,)


def unwrap(obj):
    """A learner function under library decorators (`@torch.no_grad()`, `functools.wraps`, `functools.lru_cache`
    or `cache`, `functools.partial`): the learner's function. Only library wrappers are looked through."""
    import functools

    for _ in range(8):
        if isinstance(obj, (functools.partial, functools.cached_property)):
            obj = obj.func
            continue
        if not isinstance(obj, types.FunctionType):  # a wrapper written in C (lru_cache's), or not a wrapper
            inner = getattr(obj, "__dict__", {}).get("__wrapped__") if type(obj).__module__ == "functools" else None
            if inner is None:
                return obj
            obj = inner
            continue
        code = obj.__code__
        if _is_learner_code(code):
            return obj
        inner = obj.__dict__.get("__wrapped__")
        library = "site-packages" in code.co_filename or code.co_filename.startswith(_LIBRARY_DIRS)
        if inner is None or not library or "transformer_lens" in code.co_filename:
            return obj
        obj = inner
    return obj


class Guards:
    def __init__(self, notebook: str, order: list[str]):
        self.notebook = notebook
        self.order = order
        self.index = order.index(notebook) if notebook in order else len(order)
        self.violations: list[str] = []
        self.active = False
        self._busy = False
        self._class_cache: dict[int, bool] = {}
        self.learner_classes: set[int] = set()  # classes a learner cell's `class` statement made
        self._protected_module_cache: dict[int, bool] = {}
        # the course's answers (and the grader's copies of them, and other students' work); the rest is public
        self.protected_paths = [str(REPO_ROOT / "solutions"), str(REPO_ROOT / "grading")]
        self.extra_protected_paths: list[str] = []

    # ------------------------------------------------------------------ helpers
    def record(self, message: str) -> None:
        if message not in self.violations:
            self.violations.append(message)

    def refuse(self, message: str):
        self.record(message)
        raise GradingViolation(f"refused by the grader: {message}")

    def learner_frame_on_stack(self, frame) -> bool:
        while frame is not None:
            if _is_learner_code(frame.f_code):
                return True
            frame = frame.f_back
        return False

    def called_by_learner(self) -> bool:
        """Whether learner code is anywhere on the stack (the checks themselves may use the course's components)."""
        busy, self._busy = self._busy, True
        try:
            return self.learner_frame_on_stack(sys._getframe(2))
        finally:
            self._busy = busy

    def first_non_helper(self, frame):
        while frame is not None and frame.f_code.co_filename.endswith(HELPER_FILES):
            frame = frame.f_back
        return frame

    def solutions_notebook_of(self, code) -> int | None:
        """Index of the course notebook whose component cells compiled `code` (harness.course), else None."""
        name = code.co_filename
        if name.startswith("<solutions/"):
            stem = name[len("<solutions/") :].split(".ipynb")[0]
            if stem in self.order:
                return self.order.index(stem)
        return None

    def is_learner_class(self, cls) -> bool:
        key = id(cls)
        if key in self.learner_classes:
            return True
        if key not in self._class_cache:
            found = False
            for klass in getattr(cls, "__mro__", ()):
                for value in vars(klass).values():
                    func = unwrap(getattr(value, "__func__", value))
                    code = getattr(func, "__code__", None)
                    if code is not None and _is_learner_code(code):
                        found = True
            self._class_cache[key] = found
        return self._class_cache[key]

    def is_protected_module_class(self, cls) -> bool:
        """A TransformerLens module, or a course component of this notebook or a later one."""
        key = id(cls)
        if key not in self._protected_module_cache:
            protected = False
            for klass in cls.__mro__:
                module = getattr(klass, "__module__", "") or ""
                if module.startswith("transformer_lens"):
                    protected = True
                for value in vars(klass).values():
                    code = getattr(value, "__code__", None)
                    nb = self.solutions_notebook_of(code) if code is not None else None
                    if nb is not None and nb >= self.index:
                        protected = True
            self._protected_module_cache[key] = protected
        return self._protected_module_cache[key]

    # ------------------------------------------------------------------ audit hook
    def audit(self, event: str, args: tuple) -> None:
        if not self.active or self._busy:
            return
        watched = (
            event in INTROSPECTION_EVENTS
            or event.startswith("ctypes.")
            or event in ("object.__setattr__", "object.__delattr__", "open")
        )
        if not watched:
            return
        self._busy = True
        try:
            caller = sys._getframe(1)
            if event == "open":
                path = args[0] if args else None
                if isinstance(path, (str, bytes, os.PathLike)):
                    path = os.path.abspath(os.fsdecode(path))
                    roots = self.protected_paths + self.extra_protected_paths
                    inside = any(path == root or path.startswith(root + os.sep) for root in roots)
                    if inside and self.learner_frame_on_stack(caller):
                        self.refuse(f"learner code opened the course's file {path}")
                return
            if event in ("object.__setattr__", "object.__delattr__"):
                obj = args[0] if args else None
                if isinstance(obj, type) and id(obj) in self.watched_types and self.learner_frame_on_stack(caller):
                    name = args[1] if len(args) > 1 else "?"
                    self.refuse(f"learner code changed {obj.__module__}.{obj.__qualname__}.{name}")
                return
            frame = self.first_non_helper(caller)
            if frame is not None and _is_learner_code(frame.f_code):
                what = event if event != "object.__getattr__" else f"reading .{args[1] if len(args) > 1 else '?'}"
                self.refuse(f"learner code used {what}")
        finally:
            self._busy = False

    # ------------------------------------------------------------------ module write guard
    def guard_module(self, module: types.ModuleType) -> None:
        guards = self
        base = type(module)
        if getattr(base, "_tfs_guarded", False):
            return

        def refuse_if_learner(action: str) -> None:
            if guards.active and not guards._busy:
                guards._busy = True
                try:
                    learner = guards.learner_frame_on_stack(sys._getframe(2))  # the caller of the dunder
                finally:
                    guards._busy = False
                if learner:
                    guards.refuse(action)

        def __setattr__(self, name, value):
            # the import system binding a submodule on its package the first time it is imported
            # (`from transformer_lens import utils`) is no assignment of the learner's
            importing = (
                isinstance(value, types.ModuleType)
                and value.__name__ == f"{self.__name__}.{name}"
                and sys.modules.get(value.__name__) is value
            )
            if not importing:
                refuse_if_learner(f"learner code assigned {self.__name__}.{name}")
            base.__setattr__(self, name, value)

        def __delattr__(self, name):
            refuse_if_learner(f"learner code deleted {self.__name__}.{name}")
            base.__delattr__(self, name)

        guarded = type(
            f"Guarded{base.__name__}",
            (base,),
            {"__setattr__": __setattr__, "__delattr__": __delattr__, "_tfs_guarded": True, "__module__": __name__},
        )
        try:
            module.__class__ = guarded
        except TypeError:
            pass

    # ------------------------------------------------------------------ forward hook
    def forward_pre_hook(self, module, args):
        if not self.active or self._busy:
            return
        self._busy = True
        try:
            if not self.is_protected_module_class(type(module)):
                return
            frame = sys._getframe(1)
            while frame is not None:
                code = frame.f_code
                if _is_learner_code(code) and code.co_argcount >= 1:
                    first = frame.f_locals.get(code.co_varnames[0])
                    if isinstance(first, self.torch.nn.Module) and self.is_learner_class(type(first)):
                        kind = type(module).__module__ + "." + type(module).__qualname__
                        self.record(
                            f"a learner module ran {kind} (the reference's own computation) from "
                            f"{type(first).__name__}.{code.co_name}"
                        )
                        raise GradingViolation(f"refused by the grader: your module called the reference's {kind}")
                frame = frame.f_back
        finally:
            self._busy = False
        return

    # ------------------------------------------------------------------ components guard
    def guard_components(self, harness) -> None:
        from harness import course

        original = course.components
        original_source = course.component_source
        guards = self

        def components(upto: str):
            if upto in guards.order and guards.order.index(upto) >= guards.index and guards.called_by_learner():
                guards.refuse(
                    f"harness.components({upto!r}) while grading {guards.notebook} (the course's own "
                    "answers for this notebook)"
                )
            return original(upto)

        def component_source(name: str) -> str:
            if name in guards.order and guards.order.index(name) >= guards.index and guards.called_by_learner():
                guards.refuse(f"harness.course.component_source({name!r}) while grading {guards.notebook}")
            return original_source(name)

        components.__doc__ = original.__doc__
        harness.components = components
        course.components = components
        course.component_source = component_source

    # ------------------------------------------------------------------ snapshot of modules and classes
    def watched_modules(self) -> list[types.ModuleType]:
        out = []
        for name, module in list(sys.modules.items()):
            if not isinstance(module, types.ModuleType):
                continue
            if name.startswith("torch"):
                if name in TORCH_WATCHED:
                    out.append(module)
            elif name in WATCHED_EXACT or name.startswith(WATCHED_PREFIXES[1:]):
                out.append(module)
        return out

    def take_snapshot(self) -> dict:
        """What every watched module and class binds, and each function's code/defaults (by identity)."""
        self._busy = True
        try:
            snap = {}
            types_seen = {}
            for module in self.watched_modules():
                d = module.__dict__
                snap[("m", id(module))] = (module, dict(d))
                for value in list(d.values()):
                    if isinstance(value, type) and (getattr(value, "__module__", "") or "").startswith(
                        ("torch", "harness", "transformer_lens", "einops", "builtins")
                    ):
                        types_seen[id(value)] = value
            import torch

            for cls in (torch.Tensor, torch.nn.Module, torch.nn.Parameter, object, type):
                types_seen[id(cls)] = cls
            for cls in list(types_seen.values()):
                try:
                    snap[("c", id(cls))] = (cls, dict(vars(cls)))
                except TypeError:
                    pass
            funcs = {}
            for _, d in snap.values():
                for value in d.values():
                    if isinstance(value, (classmethod, staticmethod)):
                        value = value.__func__
                    if isinstance(value, types.FunctionType):
                        funcs[id(value)] = (value, value.__code__, value.__defaults__, value.__kwdefaults__)
            snap[("f", 0)] = (None, funcs)
            self.watched_types = set(types_seen)
            return snap
        finally:
            self._busy = False

    def compare_and_restore(self, snap: dict) -> list[str]:
        """What changed since `snap` (restoring it); new module attributes that are modules are not changes."""
        self._busy = True
        changes = []
        try:
            for key, (obj, before) in snap.items():
                if key[0] == "f":
                    for value, code, defaults, kwdefaults in before.values():
                        if (
                            value.__code__ is not code
                            or value.__defaults__ is not defaults
                            or (value.__kwdefaults__ is not kwdefaults)
                        ):
                            changes.append(f"{value.__module__}.{value.__qualname__} had its code or defaults changed")
                            value.__code__, value.__defaults__, value.__kwdefaults__ = code, defaults, kwdefaults
                    continue
                now = obj.__dict__ if key[0] == "m" else vars(obj)
                label = obj.__name__ if key[0] == "m" else f"{obj.__module__}.{obj.__qualname__}"
                strict = label.startswith(("harness", "instructor"))
                for name, value in before.items():
                    if name not in now or now[name] is not value:
                        if not (strict or _is_behaviour(value) or _is_behaviour(now.get(name))):
                            continue  # a counter or a cache (RemovableHandle.next_id ...), not behaviour
                        changes.append(f"{label}.{name} was replaced or deleted")
                        self._restore(obj, key[0], name, value)
                for name in set(now) - set(before):
                    value = now[name]
                    if isinstance(value, types.ModuleType) or name in PYTHONS_OWN_CACHES:
                        continue
                    if not (strict or _is_behaviour(value)) or (key[0] == "m" and name.startswith("_") and not strict):
                        continue  # lazily created private caches
                    changes.append(f"{label}.{name} was added")
                    self._restore(obj, key[0], name, None, delete=True)
        finally:
            self._busy = False
        return changes

    def _restore(self, obj, kind, name, value, delete=False):
        try:
            if kind == "m":
                if delete:
                    obj.__dict__.pop(name, None)
                else:
                    obj.__dict__[name] = value
            elif delete:
                type.__delattr__(obj, name)
            else:
                type.__setattr__(obj, name, value)
        except (TypeError, AttributeError):
            pass

    # ------------------------------------------------------------------ fingerprints of instructor objects
    def fingerprint(self, obj, content: bool = False, depth: int = 0, seen=None):
        torch = self.torch
        seen = set() if seen is None else seen
        if id(obj) in seen or depth > 12:
            return ("seen", id(obj))
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            fp = (
                type(obj).__name__,
                id(obj),
                obj.data_ptr(),
                obj._version,
                tuple(obj.shape),
                tuple(obj.stride()),
                str(obj.dtype),
            )
            if content and obj.numel():
                with torch.no_grad():
                    x = obj.detach().to(torch.float64)
                    fp += (float(x.sum()), float((x * x).sum()))
            return fp
        if isinstance(obj, torch.nn.Module):
            items = []
            for key, value in sorted(vars(obj).items()):
                if key in ("_parameters", "_buffers", "_modules"):
                    items.append(
                        (key, tuple((k, self.fingerprint(v, content, depth + 1, seen)) for k, v in value.items()))
                    )
                elif isinstance(value, dict):
                    items.append((key, tuple((k, id(v)) for k, v in value.items())))
                elif isinstance(value, (list, tuple)):
                    items.append((key, tuple(id(v) for v in value)))
                elif isinstance(value, (bool, int, float, str, type(None))):
                    items.append((key, value))
                else:
                    items.append((key, id(value)))
            return (id(type(obj)), tuple(items))
        if isinstance(obj, dict):
            return ("dict", tuple((str(k), self.fingerprint(v, content, depth + 1, seen)) for k, v in obj.items()))
        if isinstance(obj, (list, tuple)):
            return ("seq", tuple(self.fingerprint(v, content, depth + 1, seen) for v in obj[:10000]))
        cache = getattr(obj, "cache_dict", None)  # TransformerLens ActivationCache
        if isinstance(cache, dict):
            return ("cache", id(type(obj)), self.fingerprint(cache, content, depth + 1, seen))
        return ("obj", id(type(obj)), id(obj))

    @staticmethod
    def is_instructor_data(value, torch) -> bool:
        if isinstance(value, (torch.Tensor, torch.nn.Module)):
            return True
        if isinstance(getattr(value, "cache_dict", None), dict):
            return True
        return (
            isinstance(value, dict)
            and bool(value)
            and all(isinstance(v, torch.Tensor) for v in list(value.values())[:50])
        )

    # ------------------------------------------------------------------ checks before a test
    def code_objects(self, obj, seen=None):
        """Code objects of a learner class or function (methods, nested functions, comprehensions)."""
        seen = set() if seen is None else seen
        out = []
        if isinstance(obj, type):
            for klass in obj.__mro__:
                for value in vars(klass).values():
                    value = unwrap(getattr(value, "__func__", value))
                    if isinstance(value, property):
                        for f in (value.fget, value.fset):
                            if f is not None:
                                out += self.code_objects(f, seen)
                    elif isinstance(value, types.FunctionType):
                        out += self.code_objects(value, seen)
            return out
        code = getattr(unwrap(obj), "__code__", None)
        stack = [code] if isinstance(code, types.CodeType) else []
        while stack:
            code = stack.pop()
            if id(code) in seen or not _is_learner_code(code):
                continue
            seen.add(id(code))
            out.append(code)
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        return out

    def provenance_problem(self, name: str, obj, namespace: dict, data_names: set[str]) -> str | None:
        """Why `obj` (what the test calls `name`) is not the learner's own work, or None."""
        self._busy = True
        try:
            if isinstance(obj, type):
                if not self.is_learner_class(obj):
                    return f"{name} is not a class defined in your notebook"
                for klass in obj.__mro__:
                    module = getattr(klass, "__module__", "") or ""
                    earlier = module.startswith("harness.course.") and (
                        module.removeprefix("harness.course.") in self.order[: self.index]
                    )  # a notebook may build on an earlier one's components (07's KV cache extends 05's model)
                    if module.startswith(("transformer_lens", "harness")) and not earlier:
                        return (
                            f"{name} inherits from {module}.{klass.__qualname__} (the course's or the reference's code)"
                        )
                    for value in vars(klass).values():
                        code = getattr(getattr(value, "__func__", value), "__code__", None)
                        if code is None:
                            continue
                        nb = self.solutions_notebook_of(code)
                        if nb is not None and nb >= self.index:
                            return f"{name} uses the course's own {klass.__qualname__} from {self.order[nb]}"
                        if (
                            code.co_filename.startswith(str(REPO_ROOT / "harness"))
                            or "transformer_lens" in code.co_filename
                        ):
                            return f"{name}.{code.co_name} is the course's or the reference's code"
            elif isinstance(unwrap(obj), types.FunctionType):
                if not _is_learner_code(unwrap(obj).__code__):
                    return f"{name} is not a function defined in your notebook"
            else:
                return f"{name} is a {type(obj).__name__}, not a class or function defined in your notebook"
            # the notebook's reference model / activations must not be read from inside the exercise
            todo, visited = [obj], set()
            while todo:
                item = todo.pop()
                if id(item) in visited:
                    continue
                visited.add(id(item))
                for code in self.code_objects(item):
                    for ins in dis.get_instructions(code):
                        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str):
                            gname = ins.argval
                            if gname in data_names:
                                return (
                                    f"{name} reads the notebook's `{gname}` (the instructor's reference data) "
                                    "from inside the exercise"
                                )
                            value = namespace.get(gname)
                            if (
                                isinstance(value, type)
                                and self.is_learner_class(value)
                                or isinstance(value, types.FunctionType)
                                and _is_learner_code(unwrap(value).__code__)
                            ):
                                todo.append(value)
            return None
        finally:
            self._busy = False

    def tensor_subclass_problem(self) -> str | None:
        torch = self.torch
        self._busy = True
        try:
            todo = list(torch.Tensor.__subclasses__())
            while todo:
                cls = todo.pop()
                if self.is_learner_class(cls):
                    return f"{cls.__name__} subclasses torch.Tensor (tensor subclasses are not allowed)"
                todo += cls.__subclasses__()
            return None
        finally:
            self._busy = False

    # ------------------------------------------------------------------ extension points, threads, forbidden calls
    def extension_state(self) -> tuple:
        """torch's mode stacks and global module hooks: none of them is a module attribute being rebound."""
        torch = self.torch
        module = torch.nn.modules.module
        hooks = tuple((name, tuple((k, id(v)) for k, v in getattr(module, name, {}).items())) for name in GLOBAL_HOOKS)
        return (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack(), hooks)

    def restore_extension_state(self, state: tuple) -> list[str]:
        torch = self.torch
        now = self.extension_state()
        if now == state:
            return []
        changes = []
        functions, dispatch, hooks = state
        while torch._C._len_torch_function_stack() > functions:
            changes.append("a TorchFunctionMode was left active")
            torch._C._pop_torch_function_stack()
        while torch._C._len_torch_dispatch_stack() > dispatch:
            changes.append("a TorchDispatchMode was left active")
            torch._C._pop_torch_dispatch_stack()
        module = torch.nn.modules.module
        for name, before in hooks:
            table = getattr(module, name, None)
            if table is None:
                continue
            keep = {k for k, _ in before}
            for key in [k for k in table if k not in keep]:
                changes.append(f"a global module hook was registered (torch.nn.modules.module.{name})")
                del table[key]
        return sorted(set(changes))

    def guard_forwards(self) -> None:
        """Every TransformerLens module's forward runs the pre-hook's check itself (`.forward()` skips hooks)."""
        torch = self.torch
        guards = self
        for name, module in list(sys.modules.items()):
            if not name.startswith("transformer_lens") or not isinstance(module, types.ModuleType):
                continue
            for cls in list(vars(module).values()):
                if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module) and "forward" in vars(cls)):
                    continue
                forward = vars(cls)["forward"]
                if getattr(forward, "_tfs_guarded", False):
                    continue

                def guarded(self, *args, __forward=forward, **kwargs):
                    guards.forward_pre_hook(self, args)
                    return __forward(self, *args, **kwargs)

                guarded._tfs_guarded = True
                guarded.__wrapped__ = forward
                guarded.__name__ = "forward"
                type.__setattr__(cls, "forward", guarded)

    def guard_forbidden_calls(self) -> None:
        guards = self
        for (module_name, attr), why in FORBIDDEN_CALLS.get(self.notebook, {}).items():
            module = sys.modules.get(module_name)
            original = getattr(module, attr, None) if module is not None else None
            if original is None:
                continue
            label = f"{module_name}.{attr}"
            if isinstance(original, type):

                def init(self, *args, __label=label, __why=why, __init=original.__init__, **kwargs):
                    if guards.active and not guards._busy and guards.called_by_learner():
                        guards.refuse(f"learner code used {__label}, which this exercise forbids ({__why})")
                    return __init(self, *args, **kwargs)

                type.__setattr__(original, "__init__", init)
                continue

            def wrapper(*args, __label=label, __why=why, __original=original, **kwargs):
                if guards.active and not guards._busy and guards.called_by_learner():
                    guards.refuse(f"learner code used {__label}, which this exercise forbids ({__why})")
                return __original(*args, **kwargs)

            wrapper.__name__ = getattr(original, "__name__", attr)
            wrapper.__doc__ = getattr(original, "__doc__", None)
            module.__dict__[attr] = wrapper

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        import torch

        import harness

        self.torch = torch
        self.harness = harness
        self.guard_components(harness)
        for module in self.watched_modules():
            if module is not builtins and module.__name__ not in ("instructor.guards",):
                self.guard_module(module)
        self.guard_module(builtins)
        self.guard_module(math)
        torch.nn.modules.module.register_module_forward_pre_hook(self.forward_pre_hook)
        self.guard_forwards()
        self.guard_forbidden_calls()
        sys.addaudithook(self.audit)
