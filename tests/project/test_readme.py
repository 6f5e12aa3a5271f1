"""README stays a page a newcomer reads in a sitting: short, its links resolve to files of the repository (and
their anchors to headings), and its Python snippets run (on a tiny model standing in for the default one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    # a '#' comment in a code block is no heading
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def broken_links(page: Path) -> list[str]:
    broken = []
    for link in LINK.findall(page.read_text()):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.is_file() or ROOT not in target.parents:
            broken.append(f"{link}: no such file in the repository")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(ROOT)}")
    return broken


def test_readme_fits_in_a_sitting():
    lines = README.read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move detail to a docs/ page"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves_to_a_file_of_the_repository(page):
    assert page != README or len(LINK.findall(page.read_text())) > 10, "README should link its docs pages"
    assert not broken_links(page), broken_links(page)


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A page\n\n## Real heading\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/A.md#real-heading) [gone](docs/B.md) [no](docs/A.md#other) [out](../x.md)")
    assert [b.split(":")[0] for b in broken_links(page)] == ["docs/B.md", "docs/A.md#other", "../x.md"]


def test_the_readme_python_snippets_run(monkeypatch, capsys):
    """Both snippets, in order, in one namespace, as a reader would paste them; ``load_model("default")`` gives a
    tiny float64 model and tokenizer here (the real model's exactness has its own tests)."""
    import dex_core
    from dex_core.testing import tiny_model, tiny_tokenizer

    snippets = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(snippets) == 2, "README's API is two snippets"
    loaded = []
    monkeypatch.setattr(
        dex_core, "load_model", lambda spec: loaded.append(spec) or (tiny_model(), tiny_tokenizer())
    )
    namespace: dict = {}
    for snippet in snippets:
        exec(compile(snippet, str(README), "exec"), namespace)
    assert loaded == ["default"]
    printed = capsys.readouterr().out
    # the stream's text: every committed token, a chain's several included
    streamed = printed.splitlines()[-1]
    tokenizer, tokens = namespace["tokenizer"], namespace["result"].tokens
    assert len(tokens) == 64 and streamed == "".join(tokenizer.decode([token]) for token in tokens)


def test_the_screenshots_show_the_app_as_it_is(monkeypatch):
    """README's pictures were made of this app: the header, every control's default and the palette they recorded
    (``scripts/app_screenshots.py`` writes docs/screenshots/app.json) are the app's now. When this fails, make the
    pictures again with the command in README."""
    import json

    from app.host.settings import AppSettings
    from app.main import build_demo
    from app.ui.page import appearance

    monkeypatch.delenv("SPACE_ID", raising=False)  # a local run, as the script's
    recorded = json.loads((ROOT / "docs" / "screenshots" / "app.json").read_text())
    now = json.loads(json.dumps(appearance(build_demo(AppSettings(model="default", explorers=4)))))
    changed = sorted(k for k in now if recorded.get(k) != now[k])
    assert not changed, f"the app's {', '.join(changed)} changed since README's screenshots were made"
