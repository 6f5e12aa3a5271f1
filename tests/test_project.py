"""Project invariants: README's test command is what CI runs; imports flow one way (app -> visualize,
dex_core), without cycles or UI libraries in dex_core; files stay small and are named in README's layout."""

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dex_core", "visualize", "app")
MAX_LINES = 400  # shared/STYLE.md: one concept per file, at most 400 lines
# lower -> the project packages and libraries it must never import (app may import the other two)
FORBIDDEN = {"dex_core": ("visualize", "app", "gradio", "plotly", "networkx"),
             "visualize": ("app", "dex_core", "torch", "transformers")}


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
    """Package -> {name its ``__init__`` imports from a submodule: that submodule}."""
    out = {}
    for package in PACKAGES:
        tree = ast.parse(modules[package].read_text())
        out[package] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, package, is_package=True)
                for alias in node.names:
                    out[package][alias.asname or alias.name] = source
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
    assert graph.has_edge("dex_core.cli", "dex_core.serve")  # the walk resolves `from . import serve`
    cycles = sorted(" -> ".join(c + [c[0]]) for c in nx.simple_cycles(graph))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_imports_flow_down_from_app_to_visualize_and_dex_core_and_never_up():
    graph, _ = imports()
    upward = sorted(f"{module} imports {target}" for module, target in graph.edges
                    if target.split(".")[0] in FORBIDDEN.get(module.split(".")[0], ()))
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_dex_core_imports_no_ui_library_and_visualize_no_model_library():
    _, outside = imports()
    found = sorted(f"{module} imports {lib}" for module, libs in outside.items() for lib in libs
                   if lib in FORBIDDEN.get(module.split(".")[0], ()))
    assert not found, "\n".join(found)
    assert "torch" in outside["dex_core.engine"] and "plotly" in outside["visualize.lattice"]  # the walk sees them


def test_every_project_file_is_at_most_400_lines():
    long = {str(path.relative_to(ROOT)): n for path in module_files().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def layout_section() -> str:
    """README's "## Layout" section, up to the next "## " heading."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^## Layout\s*$(.*?)(?=^## )", readme + "\n## ", flags=re.M | re.S)
    assert match, "README.md has no '## Layout' section"
    return match.group(1)


def test_every_project_module_is_named_in_the_readme_layout():
    section = layout_section()
    missing = []
    for path in module_files().values():
        if path.name == "__init__.py":
            continue
        rel = path.relative_to(ROOT).as_posix()
        named = rel in section if rel.startswith("dex_core/") else path.name in section
        if not named:
            missing.append(rel)
    assert not missing, f"not described in README.md's Layout section: {missing}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(pip install .+)$", readme.split("## ")[0], flags=re.M)
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci


def test_browser_tests_fail_in_ci_and_skip_elsewhere_when_chromium_is_missing(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    import pytest
    from conftest import require_chromium

    absent = str(tmp_path / "no-chromium")
    for ci, outcome in (("true", pytest.fail.Exception), ("1", pytest.fail.Exception), ("", pytest.skip.Exception),
                        ("false", pytest.skip.Exception)):
        monkeypatch.setenv("CI", ci)
        with pytest.raises(outcome, match=f"chromium is not installed at {re.escape(absent)}"):
            require_chromium(absent)
    # the suite as CI runs it: a browser test errors before any app or browser starts, and pytest exits non-zero
    env = {**os.environ, "CI": "true", "DEX_CHROMIUM": absent}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "test_browser_traces.py")], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "CI is set, so the browser tests must run, not skip" in proc.stdout
    assert re.search(r"\b1 error\b", proc.stdout) and "skipped" not in proc.stdout, proc.stdout[-2000:]


def test_readme_headings_are_unique():
    headings = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("## ")]
    repeated = sorted({h for h in headings if headings.count(h) > 1})
    assert not repeated, f"README repeats sections: {repeated}"
