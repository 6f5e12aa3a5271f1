"""Project invariants: README's test command is what CI runs; imports flow one way (app -> visualize,
dex_core), without cycles or UI libraries in dex_core, and inside dex_core down its layers only; library code reports
through the log callback; files and functions stay small; every module is named in docs/ARCHITECTURE.md."""

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dex_core", "visualize", "app")
MAX_LINES = 400  # shared/STYLE.md: one concept per file, at most 400 lines
# lower -> the project packages and libraries it must never import (app may import the other two)
FORBIDDEN = {
    "dex_core": ("visualize", "app", "gradio", "plotly", "networkx"),
    "visualize": ("app", "dex_core", "torch", "transformers"),
}
VISUALIZE_MAY_IMPORT = "dex_core.trace"  # of dex_core, visualize reads the trace package only (torch-free)
ROOMS = ("dex_core.serving", "dex_core.training", "dex_core.evaluation")  # one layer; never import each other
# dex_core's layers, lowest first (docs/ARCHITECTURE.md): a module imports its own layer or lower ones, never higher
LAYERS = (
    (
        "foundation",
        (
            "dex_core.config",
            "dex_core.values",
            "dex_core.device",
            "dex_core.log",
            "dex_core.flags",
            "dex_core.testing",
            "dex_core.shapes",
            "dex_core.families",
            "dex_core.host_reads",
        ),
    ),
    ("algorithm", ("dex_core.algorithm",)),
    ("data", ("dex_core.data",)),
    ("model", ("dex_core.model",)),
    ("trace", ("dex_core.trace",)),
    ("runtime", ("dex_core.runtime",)),
    ("distributed", ("dex_core.distributed",)),
    ("facade", ("dex_core.decoder",)),
    ("analysis", ("dex_core.analysis",)),
    ("rooms", ROOMS),
    ("entry points", ("dex_core.cli", "dex_core.serving.serve", "dex_core.serving.__main__", "dex_core")),
)
PRINTS = (
    "dex_core/log.py",
    "dex_core/cli.py",
    "dex_core/runtime/console.py",
    "dex_core/serving/torchrun.py",
    "dex_core/serving/serve.py",
    "dex_core/distributed/rank.py",
)  # the log callback, the entry points and the terminal renderer


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages (``pkg/__init__.py`` is ``pkg``)."""
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _project_module(name: str, modules) -> str | None:
    """The deepest project module that ``name`` (a module or a name inside one) lies in, or None."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def _reexports(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package -> {name its ``__init__`` imports from a submodule, or a name of its lazy table (``_FACE``, PEP
    562): that submodule}."""
    out = {}
    for package in PACKAGES:
        tree = ast.parse(modules[package].read_text())
        out[package] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, package, is_package=True)
                for alias in node.names:
                    out[package][alias.asname or alias.name] = source
            elif isinstance(node, ast.Assign) and [getattr(n, "id", None) for n in node.targets] == ["_FACE"]:
                for name, where in ast.literal_eval(node.value).items():  # "module.name", relative
                    out[package][name] = f"{package}.{where.rsplit('.', 1)[0]}"
    return out


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name of a ``from X import ...`` (relative imports resolved)."""
    if not node.level:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports() -> tuple[nx.DiGraph, dict[str, set[str]]]:
    """Every import anywhere in each project file (function-level ones too): the graph between project
    modules, and the top-level names of the outside packages each module imports."""
    modules = module_files()
    reexports = _reexports(modules)
    graph, outside = nx.DiGraph(), {name: set() for name in modules}
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, name, is_package)
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:  # a submodule: from . import serve
                        targets.append(f"{source}.{alias.name}")
                    elif source in reexports and alias.name in reexports[source] and source != name:
                        targets.append(reexports[source][alias.name])  # where the package's X is defined
                    else:
                        targets.append(source)
        for target in targets:
            inside = _project_module(target, modules)
            if inside is None:
                outside[name].add(target.split(".")[0])
            elif inside != name:
                graph.add_edge(name, inside)
    return graph, outside


def test_project_imports_form_no_cycles():
    graph, _ = imports()
    assert graph.has_edge(
        "dex_core.cli", "dex_core.serving.torchrun"
    )  # the walk resolves `from .x import serve`
    cycles = sorted(" -> ".join(c + [c[0]]) for c in nx.simple_cycles(graph))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_imports_flow_down_from_app_to_visualize_and_dex_core_and_never_up():
    graph, _ = imports()
    upward = sorted(
        f"{module} imports {target}"
        for module, target in graph.edges
        if target.split(".")[0] in FORBIDDEN.get(module.split(".")[0], ())
        and not (module.startswith("visualize") and _inside(target, VISUALIZE_MAY_IMPORT))
    )
    assert not upward, "upward imports:\n" + "\n".join(upward)
    assert graph.has_edge("visualize.replay", "dex_core.trace.events")  # the one door visualize uses


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_rooms_never_import_each_other_and_the_app_host_never_imports_its_page():
    graph, _ = imports()
    crossing = sorted(
        f"{m} imports {t}"
        for m, t in graph.edges
        if any(_inside(m, a) and _inside(t, b) for a in ROOMS for b in ROOMS if a != b)
    )
    assert not crossing, "rooms importing each other:\n" + "\n".join(crossing)
    host = sorted(
        f"{m} imports {t}" for m, t in graph.edges if _inside(m, "app.host") and _inside(t, "app.ui")
    )
    assert not host, "the host imports the page:\n" + "\n".join(host)
    assert graph.has_edge("app.ui.live", "app.host.state")  # the walk sees the page asking the host


def crowded_folders(names_by_folder: dict[str, list[str]]) -> list[str]:
    """Folders holding three or more modules whose names share the part before the first underscore (a room
    waiting to be made: shared/STYLE.md, 13)."""
    crowded = []
    for folder, names in sorted(names_by_folder.items()):
        heads = [n.split("_")[0] for n in names if not n.startswith("_")]
        crowded += [f"{folder}: {head}_*" for head in sorted(set(heads)) if heads.count(head) >= 3]
    return crowded


def test_no_folder_holds_three_modules_sharing_a_name_prefix():
    folders = {}
    for path in module_files().values():
        folders.setdefault(path.parent.relative_to(ROOT).as_posix(), []).append(path.stem)
    assert "dex_core/serving" in folders and not crowded_folders(folders), crowded_folders(folders)
    planted = {"dex_core/tools": ["train", "train_data", "train_stage", "plan"]}  # the check can fail
    assert crowded_folders(planted) == ["dex_core/tools: train_*"]


def test_dex_core_imports_no_ui_library_and_visualize_no_model_library():
    _, outside = imports()
    found = sorted(
        f"{module} imports {lib}"
        for module, libs in outside.items()
        for lib in libs
        if lib in FORBIDDEN.get(module.split(".")[0], ())
    )
    assert not found, "\n".join(found)
    assert (
        "torch" in outside["dex_core.runtime.stage"] and "plotly" in outside["visualize.lattice"]
    )  # the walk sees them


def layer(module: str) -> int:
    """The index in ``LAYERS`` of a dex_core module (its longest matching prefix)."""
    found = [
        (len(prefix), i)
        for i, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert found, (
        f"{module} is in no layer of LAYERS (tests/project/test_project.py) and docs/ARCHITECTURE.md"
    )
    return max(found)[1]


def upward(edges) -> list[str]:
    """The imports among ``edges`` (importer, imported) that go up dex_core's layers."""
    return sorted(
        f"{m} ({LAYERS[layer(m)][0]}) imports {t} ({LAYERS[layer(t)][0]})"
        for m, t in edges
        if m.startswith("dex_core") and t.startswith("dex_core") and layer(t) > layer(m)
    )


def test_dex_core_imports_only_its_own_layer_or_lower_ones():
    graph, _ = imports()
    assert not upward(graph.edges), "imports up the layers:\n" + "\n".join(upward(graph.edges))
    planted = list(graph.edges) + [
        ("dex_core.algorithm.lattice", "dex_core.model.view")
    ]  # the check can fail
    assert upward(planted) == ["dex_core.algorithm.lattice (algorithm) imports dex_core.model.view (model)"]


APP_MAY_NOT_IMPORT = (
    "dex_core.model",
    "dex_core.serving",
    "dex_core.training",
    "dex_core.evaluation",
)  # the app asks the library's face (shared/STYLE.md, 14)


def reached_internals(sources: dict[str, str]) -> list[str]:
    """The imports of ``dex_core``'s model internals and rooms among ``sources`` ({app module: its text}), by the
    module names the import statements spell (every statement, function-level ones too: no re-export resolved)."""
    found = set()
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                spelled = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, is_package=False)
                spelled = [
                    base,
                    *(f"{base}.{alias.name}" for alias in node.names),
                ]  # from dex_core import model
            else:
                continue
            for name in spelled:
                inside = next((p for p in APP_MAY_NOT_IMPORT if name == p or name.startswith(p + ".")), None)
                if inside is not None:
                    found.add(f"{module} imports {name}")
                    break
    return sorted(found)


def test_the_app_asks_the_library_face_and_imports_no_model_internals_or_rooms():
    sources = {name: path.read_text() for name, path in module_files().items() if name.startswith("app")}
    assert "dex_core.analysis" in "".join(sources.values())  # the walk reads the app's own imports
    assert not reached_internals(sources), "the app reaches into dex_core:\n" + "\n".join(
        reached_internals(sources)
    )
    planted = {  # the check can fail: a function-level import, a plain import, a submodule named in a from-import
        "app.planted": "def cost():\n    from dex_core.model.cost import ModelCost\n",
        "app.plain": "import dex_core.evaluation.bench\n",
        "app.named": "from dex_core import model, DexDecoder\n",
    }
    assert reached_internals({**sources, **planted}) == [
        "app.named imports dex_core.model",
        "app.plain imports dex_core.evaluation.bench",
        "app.planted imports dex_core.model.cost",
    ]


def test_the_algorithm_imports_no_model_code_and_reads_no_files():
    graph, outside = imports()
    algorithm = [m for m in graph if m.startswith("dex_core.algorithm")]
    assert {t for m in algorithm for t in graph.successors(m)} <= {
        "dex_core.config",
        "dex_core.device",
        "dex_core.shapes",
        *algorithm,
    }
    libraries = set().union(*(outside[m] for m in algorithm))
    assert "torch" in libraries and not libraries & {
        "transformers",
        "safetensors",
        "huggingface_hub",
        "pathlib",
        "json",
        "os",
    }


def test_library_code_reports_through_the_log_callback_and_never_prints():
    printing = sorted(
        str(path.relative_to(ROOT))
        for name, path in module_files().items()
        if name.startswith("dex_core")
        and any(
            isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"
            for n in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert set(printing) <= set(PRINTS), f"print outside the entry points and the log callback: {printing}"


MAX_FUNCTION_LINES, MAX_PARAMETERS = 60, 6  # shared/STYLE.md, item 3


def functions():
    """(file, function node, its lines, its parameters other than self/cls) for every function of the project."""
    for name, path in module_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                params = [x for x in params if x.arg not in ("self", "cls")]
                yield name, node, node.end_lineno - node.lineno + 1, len(params)


def test_no_function_is_over_60_lines_and_none_in_the_algorithm_or_runtime_over_6_parameters():
    long = [f"{m}.{f.name}: {n} lines" for m, f, n, _ in functions() if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
    many = [
        f"{m}.{f.name}: {k} parameters"
        for m, f, _, k in functions()
        if k > MAX_PARAMETERS and m.startswith(("dex_core.algorithm", "dex_core.runtime"))
    ]
    assert not many, (
        f"functions of the algorithm and runtime layers with over {MAX_PARAMETERS} parameters: {many}"
    )


MAX_APP_PARAMETERS = 8  # shared/STYLE.md, item 12: a handler with many inputs takes them as one record


def over_app_parameters(found) -> list[str]:
    """The functions among ``found`` (``functions()``'s rows) of the app with over ``MAX_APP_PARAMETERS``."""
    return [
        f"{m}.{f.name}: {k} parameters"
        for m, f, _, k in found
        if k > MAX_APP_PARAMETERS and m.startswith("app")
    ]


def test_no_function_of_the_app_takes_over_8_parameters():
    found = list(functions())
    assert any(m.startswith("app") for m, *_ in found)  # the walk sees the app
    assert not over_app_parameters(found), (
        f"app functions over {MAX_APP_PARAMETERS} parameters: " + ", ".join(over_app_parameters(found))
    )
    planted = next(ast.walk(ast.parse("def live(a, b, c, d, e, f, g, h, *rest): pass")))  # the check can fail
    assert over_app_parameters([("app.planted", planted.body[0], 1, 9)]) == ["app.planted.live: 9 parameters"]


def test_the_round_loop_fits_one_screen_and_names_the_steps_of_algorithm_1():
    engine = [f for m, f, _, _ in functions() if m == "dex_core.runtime.engine"]
    loop, rest = (next(f for f in engine if f.name == name) for name in ("run_rounds", "decide"))
    text = (ROOT / "dex_core" / "runtime" / "engine.py").read_text()
    source = ast.get_source_segment(text, loop) + ast.get_source_segment(text, rest)  # a round's two halves
    assert loop.end_lineno - loop.lineno + 1 <= 40 and "decide(" in ast.get_source_segment(text, loop)
    for step in (
        "plan_round",
        "decs_masks",
        "explore",
        "exchange",
        "insert",
        "ready",
        "validate_and_commit",
        "collapse",
    ):
        assert f"{step}(" in source, step


def test_every_project_file_is_at_most_400_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in module_files().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_every_project_module_is_named_in_the_architecture_page_and_every_layer_is_drawn():
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    missing = [
        path.relative_to(ROOT).as_posix()
        for path in module_files().values()
        if path.name != "__init__.py" and path.relative_to(ROOT).as_posix() not in page
    ]
    assert not missing, f"not described in docs/ARCHITECTURE.md: {missing}"
    picture = page.split("```")[1].splitlines()[1:]  # the layers, highest first
    assert [line.split("  ")[0].strip() for line in picture] == [name for name, _ in reversed(LAYERS)]
    assert "docs/ARCHITECTURE.md" in (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(pip install .+)$", readme.split("## ")[0], flags=re.M)
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci


def test_browser_tests_fail_in_ci_and_skip_elsewhere_when_chromium_is_missing(tmp_path, monkeypatch):
    import pytest
    from helpers import require_chromium

    absent = str(tmp_path / "no-chromium")
    for ci, outcome in (
        ("true", pytest.fail.Exception),
        ("1", pytest.fail.Exception),
        ("", pytest.skip.Exception),
        ("false", pytest.skip.Exception),
    ):
        monkeypatch.setenv("CI", ci)
        with pytest.raises(outcome, match=f"chromium is not installed at {re.escape(absent)}"):
            require_chromium(absent)
    # every test reaches Chromium through conftest's session fixture, which asks for the check before it starts one
    conftest = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    fixture = next(f for f in conftest.body if isinstance(f, ast.FunctionDef) and f.name == "browser")
    assert [a.arg for a in fixture.args.args] == ["chromium_present"]
    launch = "chromium" + ".launch"  # spelt in two, so that this file does not name it
    launching = sorted(
        path.name
        for path in (ROOT / "tests").rglob("*.py")
        if path.name != "conftest.py" and launch in path.read_text()
    )
    assert not launching, f"tests that start a Chromium of their own: {launching}"


def test_readme_headings_are_unique():
    headings = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("## ")]
    repeated = sorted({h for h in headings if headings.count(h) > 1})
    assert not repeated, f"README repeats sections: {repeated}"


def test_importing_the_package_the_cli_and_a_rank_loads_no_part_of_transformers():
    """docs/ARCHITECTURE.md, Imports: one hoisted ``from transformers import ...`` costs every process seconds."""
    import subprocess
    import sys

    probe = (
        "import sys, dex_core, dex_core.cli, dex_core.distributed.rank, dex_core.serving.serve; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers' or m == 'torch._dynamo'))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    assert loaded == "[]", f"imported at start-up: {loaded}"


def loaded_after(statement: str) -> list[str]:
    """The heavy libraries (torch, transformers, FastAPI) a fresh interpreter holds after ``statement``."""
    import subprocess
    import sys

    probe = (
        f"{statement}; import sys; print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


HEAVY = ("torch", "transformers", "fastapi")


def test_the_trace_package_and_the_viewers_import_neither_torch_nor_fastapi():
    """``import dex_core`` is a lazy face (PEP 562): the trace package's records and validator, the viewers and
    the app's trace worker load no model library; a name of the face loads the part it lives in."""
    modules = sorted(p.stem for p in (ROOT / "dex_core" / "trace").glob("*.py") if p.stem != "__init__")
    assert {"events", "schema", "stats", "build", "files", "validate"} <= set(modules)  # the whole package
    assert loaded_after("import " + ", ".join(f"dex_core.trace.{m}" for m in modules)) == "[]"
    assert loaded_after("import visualize, visualize.timeline, visualize.report") == "[]"
    assert loaded_after("import app.host.trace_worker") == "[]"
    assert loaded_after("from dex_core import DexError, load_trace, TRACE_VERSION") == "[]"
    assert loaded_after("from dex_core import DexDecoder") == "['torch']"  # the check can fail


def test_the_tests_mirror_the_packages_and_share_setup_only_through_fixtures_and_helpers():
    tests = ROOT / "tests"
    assert not sorted(p.name for p in tests.glob("test_*.py")), "tests belong in a folder of their package"
    modules = {p.stem for p in tests.rglob("test_*.py")}
    assert (
        len(modules) == len(list(tests.rglob("test_*.py"))) > 50
    )  # unique names: pytest imports them by name
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [
                f"{path.relative_to(ROOT)} imports {n}" for n in names if n == "conftest" or n in modules
            ]
    assert not found, (
        "a test reaches another test or conftest (use a fixture or tests/helpers.py):\n" + "\n".join(found)
    )
