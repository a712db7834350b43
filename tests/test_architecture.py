"""The package's layout rules (docs/architecture.md): the import-linter contracts of
pyproject.toml (rules 1–5), and, from the AST of every module, zero import cycles between dkha's
modules counting imports inside functions, no import of another module's private name, imports
between dkha modules only at the top of a file (rule 6), no function over 120 lines, and the size
limits of docs/architecture.md (files, classes, functions; numba-compiled kernels included). Each
check is also run on a package broken on purpose, so that it is seen to fail."""

from __future__ import annotations

import ast
import importlib
import os
import pathlib
import re
import shutil
import subprocess
import sys

from dkha import algorithms, kernels
from dkha.kernels import builtin

ROOT = pathlib.Path(__file__).resolve().parents[1]
LONGEST = 120
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")


# --- import-linter ------------------------------------------------------------------------------


def _lint(root: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True,
                          check=False,
                          text=True, timeout=300)


def test_import_linter_contracts_are_kept():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 7 kept, 0 broken." in proc.stdout


def test_every_module_and_folder_is_on_a_floor():
    """The floors contract names every top-level module and folder of dkha (one left out, as
    ``tiles.py`` was, is free to import anything)."""
    import tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    floors = next(c for c in config["contracts"] if c["id"] == "floors")["layers"]
    named = {m.strip() for layer in floors for m in layer.split(":")}
    present = {f"dkha.{p.stem}" for p in (ROOT / "dkha").iterdir()
               if (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py"))
               or (p.is_dir() and (p / "__init__.py").exists())}
    assert present - named == set()
    assert named - present == set()


#: one forbidden import per rule: (module, the line added, the contract it breaks, the import as
#: import-linter reports it)
FORBIDDEN = [
    ("solvers/batch.py", "import distributed", "Rule 1", "dkha.solvers.batch -> distributed"),
    ("engine/tasks.py", "import dkha.fit.evaluate", "Rule 2",
     "dkha.engine.tasks -> dkha.fit.evaluate"),
    ("data/store.py", "import dkha.engine.cluster", "Rule 3",
     "dkha.data.store -> dkha.engine.cluster"),
    ("fit/kha_stream.py", "import dkha.runs.run", "Rule 4", "dkha.fit.kha_stream -> dkha.runs.run"),
    ("apply/denoise.py", "import dkha.cli.options", "Rule 5",
     "dkha.apply.denoise -> dkha.cli.options"),
    ("estimators/saved.py", "import dkha.engine.cluster", "Rule 7",
     "dkha.estimators.saved -> dkha.engine.cluster"),
]


def test_each_forbidden_import_breaks_its_contract(tmp_path):
    """Not vacuous: a copy of the package with one forbidden import per rule added fails the
    lint, each rule's contract broken by its own import (one copy, one lint run)."""
    shutil.copytree(ROOT / "dkha", tmp_path / "dkha",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for module, line, _, _ in FORBIDDEN:
        path = tmp_path / "dkha" / module
        path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    proc = _lint(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Contracts: 0 kept, 7 broken." in proc.stdout, proc.stdout    # the floors too
    report = proc.stdout.split("Broken contracts")[1]
    # each contract's section: from its name to the next contract's name
    names = {rule: next(ln for ln in report.splitlines() if ln.startswith(rule + ":"))
             for _, _, rule, _ in FORBIDDEN}
    for _, _, rule, edge in FORBIDDEN:
        section = report.split(names[rule], 1)[1]
        others = [section.index(n) for r, n in names.items() if r != rule and n in section]
        section = section[:min(others, default=len(section))]
        assert edge in section, (rule, edge, report)


# --- the structure from the AST -----------------------------------------------------------------


def structure(package: pathlib.Path) -> dict:
    """``cycles`` (lists of modules), ``private`` and ``inner`` (imports of another module's
    private name; imports of a package module inside a function) and ``long`` functions."""
    name = package.name
    modules = {}
    for path in package.rglob("*.py"):
        dotted = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        modules[dotted.removesuffix(".__init__")] = path

    def target(module: str, node) -> list[tuple[str, str | None]]:
        if isinstance(node, ast.Import):
            return [(a.name, None) for a in node.names]
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            if modules[module].name != "__init__.py":
                parts = parts[:-1]
            base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
        return [(base + "." + a.name if base + "." + a.name in modules else base, a.name)
                for a in node.names]

    edges: dict[str, set] = {m: set() for m in modules}
    private, inner, long = [], [], []
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        in_function = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function |= {id(n) for n in ast.walk(fn)}
                n_lines = fn.end_lineno - fn.lineno + 1
                if n_lines > LONGEST:
                    long.append(f"{module}.{fn.name} ({n_lines} lines)")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for dotted, imported in target(module, node):
                if not dotted.startswith(name + ".") and dotted != name:     # another package
                    parts = dotted.split(".") + ([imported] if imported else [])
                    if any(p.startswith("_") and not p.startswith("__") for p in parts):
                        private.append(f"{module} imports {'.'.join(parts)}")
                    continue
                t = dotted
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if not t or t == module:
                    continue
                if id(node) in in_function:
                    inner.append(f"{module} line {node.lineno}: {ast.unparse(node)}")
                if modules[t].name == "__init__.py":   # a package's face: no edge
                    continue
                edges[module].add(t)
                if imported and imported.startswith("_") and not imported.startswith("__"):
                    private.append(f"{module} imports {t}.{imported}")
    return {"cycles": _cycles(edges), "private": private, "inner": inner, "long": long,
            "modules": len(modules), "package": name}


def _cycles(edges: dict[str, set]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root, targets in edges.items():
        if root in index:
            continue
        work = [(root, iter(sorted(targets)))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_cycles_no_private_imports_no_inner_imports_no_long_functions():
    s = structure(ROOT / "dkha")
    assert s["modules"] > 40
    assert s["cycles"] == [], s["cycles"]
    assert s["private"] == [], s["private"]
    assert s["inner"] == [], s["inner"]
    assert s["long"] == [], s["long"]


def test_the_structure_check_sees_what_it_forbids(tmp_path):
    """Not vacuous: a cycle hidden in a function, a private import, an inner import, a long
    function and a long numba kernel are all reported."""
    pkg = tmp_path / "toy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from toy.b import helper\n\n\ndef f():\n    return helper()\n")
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST))
    (pkg / "b.py").write_text(
        "import numba\n\n\ndef helper():\n    from toy.a import f\n    from toy.c import _hidden\n"
        "    return f, _hidden\n\n\ndef long():\n" + body + "    return 0\n\n\n"
        "@numba.njit(cache=True)\ndef kernel():\n" + body + "    return 0\n")
    (pkg / "c.py").write_text("_hidden = 1\nfrom sklearn.base import _fit_context\n"
                              "from sklearn.utils import _param_validation\n")
    s = structure(pkg)
    assert s["cycles"] == [["toy.a", "toy.b"]]
    assert sorted(s["private"]) == ["toy.b imports toy.c._hidden",
                                    "toy.c imports sklearn.base._fit_context",
                                    "toy.c imports sklearn.utils._param_validation"]
    assert len(s["inner"]) == 2
    assert s["long"] == [f"toy.b.long ({LONGEST + 2} lines)", f"toy.b.kernel ({LONGEST + 2} lines)"]


#: the size limits (docs/architecture.md): a file, a class, a function (numba kernels included)
SIZE_LIMITS = {"file": 700, "class": 300, "function": 80}


def oversized(package: pathlib.Path) -> list[str]:
    """Files, classes and functions of ``package`` over :data:`SIZE_LIMITS`."""
    out = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(package).as_posix()
        if text.count("\n") > SIZE_LIMITS["file"]:
            out.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            n = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.ClassDef) and n > SIZE_LIMITS["class"]:
                out.append(f"{name}: class {node.name} {n} lines")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    n > SIZE_LIMITS["function"]:
                out.append(f"{name}: {node.name} {n} lines")
    return out


def test_every_floor_keeps_the_size_limits(tmp_path):
    assert oversized(ROOT / "dkha") == []
    # not vacuous: a long file, a long class, a long function and a long numba kernel are seen
    (tmp_path / "solvers").mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(SIZE_LIMITS["class"]))
    (tmp_path / "solvers" / "big.py").write_text("class Big:\n    def f(self):\n" + body)
    kernel = "".join(f"    x{i} = {i}\n" for i in range(SIZE_LIMITS["function"]))
    (tmp_path / "solvers" / "loops.py").write_text(
        "from numba import njit\n\n\n@njit(cache=True, nogil=True)\ndef kernel():\n" + kernel
        + "    return 0\n" + "\n" * SIZE_LIMITS["file"])
    assert oversized(tmp_path) == [
        f"solvers/big.py: class Big {SIZE_LIMITS['class'] + 2} lines",
        f"solvers/big.py: f {SIZE_LIMITS['class'] + 1} lines",
        f"solvers/loops.py: {SIZE_LIMITS['function'] + 6 + SIZE_LIMITS['file']} lines",
        f"solvers/loops.py: kernel {SIZE_LIMITS['function'] + 2} lines"]


# --- the configuration, read at the edge ---------------------------------------------------------

#: the floors that read their settings from the request (dkha.config.Settings), never the config
CONFIG_FREE = ("fit", "engine", "solvers", "kernels")


def config_reads(package: pathlib.Path) -> list[str]:
    """Where a module of :data:`CONFIG_FREE` reads the global configuration: ``config.get`` or
    ``dask.config.get`` called, ``dask.config`` or ``dkha.config``'s module imported (only
    its ``Settings`` type may be: the value travels in the request, resolved once at the edge
    by ``dkha.config.settings``)."""
    out = []
    for floor in CONFIG_FREE:
        for path in sorted((package / floor).rglob("*.py")):
            name = path.relative_to(package).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                line = f"{name}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr == "get" and "config" in ast.unparse(node.func.value):
                    out.append(f"{line} calls {ast.unparse(node.func)}")
                elif isinstance(node, ast.Import):
                    out += [f"{line} imports {a.name}" for a in node.names
                            if a.name.startswith("dask.config") or a.name.endswith("dkha.config")]
                elif isinstance(node, ast.ImportFrom):
                    module = node.module or ""
                    names = [a.name for a in node.names]
                    if module.startswith("dask.config") or (module in ("dask", package.name)
                                                            and "config" in names) or \
                            (module == f"{package.name}.config" and names != ["Settings"]):
                        out.append(f"{line} imports {', '.join(names)} from {module}")
    return out


def test_fit_engine_solvers_kernels_never_read_the_configuration(tmp_path):
    """Every ``dkha.*`` setting is read once at the edge (an estimator's fit, a command, a
    public function of runs/ or apply/: ``dkha.config.settings``) and travels down with the
    request: ``fit_batch(request)`` is a function of its request."""
    assert config_reads(ROOT / "dkha") == []
    # not vacuous: each way of reading it is seen
    pkg = tmp_path / "dkha"
    for floor in CONFIG_FREE:
        (pkg / floor).mkdir(parents=True)
    (pkg / "fit" / "a.py").write_text("from dkha import config\n\nx = config.get('tile-rows')\n")
    (pkg / "engine" / "b.py").write_text("import dask.config\n\ny = dask.config.get('dkha.x')\n")
    (pkg / "solvers" / "c.py").write_text("from dkha.config import Settings, settings\n")
    (pkg / "kernels" / "d.py").write_text("from dask import config\n")
    assert config_reads(pkg) == [
        "fit/a.py:1 imports config from dkha", "fit/a.py:3 calls config.get",
        "engine/b.py:1 imports dask.config", "engine/b.py:3 calls dask.config.get",
        "solvers/c.py:1 imports Settings, settings from dkha.config",
        "kernels/d.py:1 imports config from dask"]


# --- ruff ---------------------------------------------------------------------------------------


def test_ruff_check_passes():
    """``ruff check`` (the rules and line length of pyproject.toml) finds nothing in the
    repository: the package, tests, benchmarks, examples and build backend."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                           "--output-format", "concise", str(ROOT)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# --- no algorithm named outside its registry ----------------------------------------------------

#: string literals that spell an algorithm's name and mean something else: (file, value) → what
NOT_ALGORITHMS = {("fit/kha_stream.py", "kha"): "a pass record's kind (a pass of the KHA family)"}


def _context_names(node: ast.AST, const: ast.AST) -> list[str] | None:
    """The identifiers that say what ``const`` (a literal inside ``node``) is, where ``node``
    decides it: the other operands of a comparison, the option a call or keyword gives, the key
    of a dict entry, the parameter it is the default of, the name an assignment binds; ``None``
    where ``node`` does not decide (look further up)."""
    if isinstance(node, ast.keyword):
        return [node.arg] if node.arg and "algorithm" in node.arg else None
    if isinstance(node, ast.Compare):
        return [getattr(n, "id", getattr(n, "attr", "")) for n in ast.walk(node)]
    if isinstance(node, ast.Call):
        return [a.value for a in node.args if isinstance(a, ast.Constant)
                and isinstance(a.value, str) and len(a.value) < 20] + [ast.unparse(node.func)]
    if isinstance(node, ast.Dict):
        return [k.value for k, v in zip(node.keys, node.values) if v is const
                and isinstance(k, ast.Constant)]
    if isinstance(node, ast.arguments):
        pos = node.posonlyargs + node.args
        pairs = list(zip(pos[len(pos) - len(node.defaults):], node.defaults))
        pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
        return [a.arg for a, d in pairs if d is const]
    if isinstance(node, ast.stmt):
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        return [ast.unparse(t) for t in targets if t is not None]
    return None


def _named_literals(package: pathlib.Path, names, skip):
    """``(file, node, parent)`` for each string literal of ``package`` (files ``skip(file)``
    left out) that spells one of ``names``: docstrings and other lone strings, and comments,
    are left out; ``parent`` maps each node of the file's tree to the node above it."""
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        if skip(name):
            continue
        tree = ast.parse(path.read_text())
        parent, lone = {}, set()
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parent[child] = node
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                lone.add(node.value)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and node not in lone:
                yield name, node, parent


def _listed(found) -> list[str]:
    """``file:line 'name'`` of ``(file, node)`` pairs, in file and line order."""
    out = sorted((name, node.lineno, node.col_offset, node.value) for name, node in found)
    return [f"{name}:{line} {value!r}" for name, line, _, value in out]


def bare_algorithm_names(package: pathlib.Path, algorithms: tuple[str, ...],
                         default: str) -> list[str]:
    """``file:line 'name'`` for each string literal of ``package`` outside ``algorithms.py``
    that spells an algorithm's name (:func:`_named_literals`; :data:`NOT_ALGORITHMS` left
    out). ``default`` (``auto``) also names a device, a projection site and a noise rule: it
    counts where what decides its meaning (:func:`_context_names`) mentions an algorithm."""
    out = []
    for name, node, parent in _named_literals(package, algorithms,
                                              lambda name: name == "algorithms.py"):
        if (name, node.value) in NOT_ALGORITHMS:
            continue
        if node.value == default:
            up, names = node, None
            while names is None and up in parent:
                up = parent[up]
                names = _context_names(up, node)
            if not any("algorithm" in str(n) for n in names or ()):
                continue
        out.append((name, node))
    return _listed(out)


def test_no_algorithm_is_named_outside_its_registry(tmp_path):
    """Issue 34: what sets an algorithm apart is its spec (:mod:`dkha.algorithms`); nothing
    else spells its name."""
    names = algorithms.names()
    assert bare_algorithm_names(ROOT / "dkha", names, algorithms.AUTO) == []
    # not vacuous: each way of naming one is seen, and what is not one is not
    (tmp_path / "solvers").mkdir()
    (tmp_path / "solvers" / "toy.py").write_text(
        '"""For "kha-smd" only."""\n'                               # a docstring: left out
        'def f(algorithm="auto", device="auto", mu=1):  # "kha"\n'
        '    """Not "kha"."""\n'
        '    if algorithm in ("kha-et", "kha-smd"):\n'
        '        g(algorithm="auto", risk="auto")\n'
        '    x = {"algorithm": "auto", "device": "auto"}\n'
        '    p.add_argument("--algorithm", default="auto", choices=("cpu", "auto"))\n'
        '    p.add_argument("--device", default="auto")\n'
        '    return device == "auto" or str(self.algorithm) != "auto" or path == "krylov"\n')
    assert bare_algorithm_names(tmp_path, names, algorithms.AUTO) == [
        "solvers/toy.py:2 'auto'", "solvers/toy.py:4 'kha-et'", "solvers/toy.py:4 'kha-smd'",
        "solvers/toy.py:5 'auto'", "solvers/toy.py:6 'auto'", "solvers/toy.py:7 'auto'",
        "solvers/toy.py:7 'auto'", "solvers/toy.py:9 'auto'", "solvers/toy.py:9 'krylov'"]


# --- no kernel's name tested outside its registry ------------------------------------------------

#: dkha's own kernels' names and aliases (:mod:`dkha.kernels.builtin`; the callable kernel is
#: made from a function, not by name)
KERNEL_NAMES = (*kernels.KERNELS, *kernels.KERNEL_ALIASES, builtin.CALLABLE.name)
#: literals compared against that spell a kernel's name and mean something else: (file, value)
NOT_KERNELS = {("apply/choose.py", "linear"): "linear patch PCA (a model and its pre-image)",
               ("apply/noise.py", "gaussian"): "a noise model",
               ("tiles/cuda.py", "gaussian"): "the cache key of the gaussian tile's CUDA function"}


def compared_kernel_names(package: pathlib.Path, names: tuple[str, ...]) -> list[str]:
    """``file:line 'name'`` for each string literal of ``package`` outside ``kernels/`` that
    spells a kernel's name (:func:`_named_literals`; :data:`NOT_KERNELS` left out) as an
    operand of a comparison (``==``, ``!=``, ``in``, ...) or an item of a tuple, list or set
    that is one: a decision on a kernel's name, which belongs in its spec. Using a name
    (``make_kernel("gaussian")``, a default) is not one."""
    def compared(node, parent) -> bool:
        up = parent.get(node)
        if isinstance(up, (ast.Tuple, ast.List, ast.Set)):
            up = parent.get(up)
        return isinstance(up, ast.Compare)

    return _listed((name, node) for name, node, parent in _named_literals(
        package, names, lambda name: name.startswith("kernels/"))
        if (name, node.value) not in NOT_KERNELS and compared(node, parent))


def test_no_kernel_name_is_tested_outside_its_registry(tmp_path):
    """Issue 34: what a kernel does differently is a field of its spec
    (:class:`dkha.kernels.KernelSpec`), so a registered kernel gets it; nothing outside
    :mod:`dkha.kernels` decides on a kernel's name."""
    assert compared_kernel_names(ROOT / "dkha", KERNEL_NAMES) == []
    # not vacuous: each way of testing one is seen, and a use of one is not
    (tmp_path / "fit").mkdir()
    (tmp_path / "fit" / "toy.py").write_text(
        '"""Only if kernel == "gaussian"."""\n'                   # a docstring: left out
        'def f(kernel="gaussian", model="linear"):\n'
        '    k = make_kernel("gaussian", sigma=1.0)\n'
        '    if kernel == "rbf" or k.name != "precomputed":\n'
        '        return kernel.lower() in ("poly", "sigmoid") or "laplacian" not in names\n'
        '    return {"cosine": 1}[kernel], model == "linear"\n')
    assert compared_kernel_names(tmp_path, KERNEL_NAMES) == [
        "fit/toy.py:4 'rbf'", "fit/toy.py:4 'precomputed'", "fit/toy.py:5 'poly'",
        "fit/toy.py:5 'sigmoid'", "fit/toy.py:5 'laplacian'", "fit/toy.py:6 'linear'"]


# --- docs/architecture.md names what exists ---------------------------------------------------
#: the first word of a dotted name that is a dkha module path (``fit.coordinator.fit_batch``)
DKHA_ROOTS = {p.stem for p in (ROOT / "dkha").iterdir()
              if (p.suffix == ".py" or p.is_dir()) and not p.name.startswith("_")}


def _resolves(name: str) -> bool:
    """``fit.coordinator.fit_batch``, ``dkha.register_kernel``, ``KernelHebbianPCA._request``
    (an attribute of an importable dkha module, or of the dkha package)."""
    parts = name.removeprefix("dkha.").split(".")
    for i in range(len(parts), -1, -1):
        try:
            obj = importlib.import_module(".".join(["dkha", *parts[:i]]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def stale_names(text: str) -> list[str]:
    """The dotted dkha names and the linked or quoted repository paths of ``text`` (a design
    doc) that do not exist."""
    stale = [p for p in re.findall(r"\]\(\.\./([\w/.-]+?)(?:#[\w-]+)?\)", text)
             if not (ROOT / p).exists()]
    stale += [p for p in re.findall(r"`((?:tests|benchmarks|dkha)/[\w/]+\.py)`", text)
              if not (ROOT / p).exists()]
    spans = re.findall(r"`([^`]+)`", text) + re.findall(r"^ {4}(\S.*)$", text, re.MULTILINE)
    for span in spans:
        for name in re.findall(r"(?<![\w/.-])([a-z_]+(?:\.[A-Za-z_]\w*)+)(?![\w/-])", span):
            if (name.split(".")[0] in DKHA_ROOTS | {"dkha"} and not name.endswith(".py")
                    and not _resolves(name)):
                stale.append(name)
    return sorted(set(stale))


def test_architecture_doc_names_only_what_exists():
    """Every dotted dkha name (``fit.run_dir.write_run``), every linked file and every
    ``tests/…py`` / ``benchmarks/…py`` that docs/architecture.md mentions exists: a rename
    that leaves the doc behind fails here."""
    assert stale_names((ROOT / "docs" / "architecture.md").read_text()) == []
    # not vacuous: a moved function, a missing module and a missing test are each seen
    assert stale_names("`fit.run_dir.write_run`, `fit.coordinator.no_such`, `fit.nowhere.f`, "
                       "`tests/test_nowhere.py`, [x](../dkha/fit/run_dir.py)") == [
        "fit.coordinator.no_such", "fit.nowhere.f", "tests/test_nowhere.py"]
