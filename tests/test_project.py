"""Project invariants: README's test command is what CI runs; dex_core stays free of UI imports."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(pip install .+)$", readme.split("## ")[0], flags=re.M)
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci


def test_dex_core_imports_no_ui_libraries():
    for path in (ROOT / "dex_core").glob("*.py"):
        source = path.read_text()
        for lib in ("gradio", "plotly", "networkx"):
            assert not re.search(rf"^\s*(import|from) {lib}\b", source, flags=re.M), (path.name, lib)
