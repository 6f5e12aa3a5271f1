"""The ``dex`` command: streams text and stats; bad input gives one clear message and exit code 2."""

import json
import subprocess
import sys

import pytest
from helpers import run_cli

from dex_core.cli import main
from dex_core.testing import tiny_tokenizer


def test_generate_streams_text_and_prints_depth_stats(tiny_dir, tmp_path, capsys):
    trace = tmp_path / "t.json"
    code, out, err = run_cli(
        capsys,
        "generate",
        "hello world",
        "--model",
        str(tiny_dir),
        "--no-chat",
        "--max-new-tokens",
        "12",
        "--explorers",
        "3",
        "--trace",
        str(trace),
    )
    assert code == 0, err
    assert "matched stage:" in out
    assert "depths [2, 4, 6] (K=3; uniform split)" in out and "12 tokens" in out
    doc = json.loads(trace.read_text())
    assert doc["format"] == "dex-trace" and doc["events"][-1]["event"] == "end"
    assert len(doc["events"][-1]["tokens"]) == 12
    # whose answer it is, once; each speed figure says what it is (rounds vs AR through the same stages, not tokens/s)
    stats = doc["events"][-1]["stats"]
    assert out.count("answer: the model's own") == 1 and "what greedy AR decoding gives" in out
    assert (
        f"rounds: {stats['depth_speedup']:.2f}× fewer than AR through the same 3 stages "
        f"({stats['rounds_per_token']:.3f} per token vs 3; the depth-side speedup)" in out
    )
    assert "model tokens/s on this machine: " in out and "AR's tokens/s: not measured in this run" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "   "], "the prompt is empty"),
        (["generate", "hello", "--depths", "2,4"], "must end at the model's 6 layers; got [2, 4]"),
        (["generate", "hello", "--depths", "4,2,6"], "strictly increasing"),
        (["generate", "hello", "--depths", "a,b"], "comma-separated integers"),
        (["generate", "hello", "--explorers", "9"], "between 1 and the model's 6 layers"),
        (["generate", "hello", "--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1; got 0"),
        (["generate", "hello", "--max-new-tokens", "300"], "exceeds the model's context window of 256"),
        (["generate", "hello", "--temperature", "-1"], "temperature must be >= 0"),
        (["generate", "hello", "--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["generate", "hello", "--seed", str(2**64)], "seed must be an integer from 0 to 2**64 - 1"),
        (["generate", "hello", "--seed", "-1"], "seed must be an integer from 0 to 2**64 - 1"),
    ],
)
def test_bad_input_exits_2_with_one_clear_message(tiny_dir, capsys, argv, message):
    code, out, err = run_cli(capsys, *argv, "--model", str(tiny_dir), "--no-chat")
    assert code == 2
    assert message in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("dex: error:") and err.count("dex: error:") == 1


def test_unknown_models_are_clear_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(capsys, "generate", "hi", "--model", str(tmp_path / "nope"))
    assert code == 2 and "no such model directory or file" in err
    code, _, err = run_cli(capsys, "generate", "hi", "--model", "no-such-org/no-such-model")
    assert code == 2 and "not in the local Hugging Face cache" in err
    code, _, err = run_cli(capsys, "generate", "hi", "--model", str(tmp_path))
    assert code == 2 and "without config.json" in err


def test_unsupported_architecture_names_the_class(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=2)).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    code, _, err = run_cli(capsys, "generate", "hi", "--model", str(tmp_path), "--no-chat")
    assert code == 2 and "GPT2LMHeadModel" in err and "not supported" in err


def test_console_script_reports_errors_without_traceback(tiny_dir):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dex_core.cli",
            "generate",
            "hello",
            "--model",
            str(tiny_dir),
            "--depths",
            "1,2,3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "exploration depths must end at the model's 6 layers" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_adapters_none_means_no_adapters_in_generate_ead_and_bench(tiny_dir, tmp_path, capsys):
    code, out, err = run_cli(
        capsys,
        "generate",
        "hello world",
        "--model",
        str(tiny_dir),
        "--no-chat",
        "--max-new-tokens",
        "4",
        "--adapters",
        "none",
    )
    assert code == 0, err
    assert "adapters at none" in out
    ead, bench = tmp_path / "ead.json", tmp_path / "bench.json"
    assert (
        run_cli(
            capsys,
            "ead",
            "--model",
            str(tiny_dir),
            "--adapters",
            "none",
            "--sets",
            "builtin",
            "--prompts",
            "1",
            "--max-new-tokens",
            "4",
            "--explorers",
            "2",
            "--no-best",
            "--out",
            str(ead),
        )[0]
        == 0
    )
    assert json.loads(ead.read_text())["runs"][0]["adapter_depths"] == []
    assert (
        run_cli(
            capsys, "bench", "--quick", "--adapters", "none", "--methods", "ar-hf,dex", "--out", str(bench)
        )[0]
        == 0
    )
    report = json.loads(bench.read_text())
    assert report["adapter_depths"] == [] and all(
        not r["adapters"] for r in report["results"] if r["method"] == "dex"
    )
    assert run_cli(capsys, "bench", "--quick", "--methods", "ar-hf,dex", "--out", str(bench))[0] == 0
    assert json.loads(bench.read_text())["adapter_depths"] == [
        1,
        2,
        3,
        4,
        5,
    ]  # the quick model's own adapters


def test_missing_output_folders_are_refused_before_any_work(tiny_dir, tmp_path, capsys):
    code, _, err = run_cli(
        capsys,
        "generate",
        "hello",
        "--model",
        str(tiny_dir),
        "--no-chat",
        "--trace",
        str(tmp_path / "no" / "t.json"),
    )
    assert code == 2 and "its folder does not exist" in err


def test_bad_adapter_files_stop_every_command_before_any_work(tiny_dir, tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x07" * 256)
    code, _, err = run_cli(
        capsys,
        "generate",
        "hello",
        "--model",
        str(tmp_path / "no-such-model"),
        "--adapters",
        str(tmp_path / "missing.safetensors"),
    )
    assert code == 2 and "no adapter file at" in err  # refused with the options, before the model loads
    code, _, err = run_cli(
        capsys, "generate", "hello", "--model", str(tiny_dir), "--no-chat", "--adapters", str(bad)
    )
    assert code == 2 and "is not a readable safetensors file" in err and "Traceback" not in err
    code, _, err = run_cli(
        capsys,
        "ead",
        "--model",
        str(tiny_dir),
        "--adapters",
        f"none,{bad}",
        "--sets",
        "builtin",
        "--prompts",
        "1",
        "--max-new-tokens",
        "4",
        "--explorers",
        "2",
        "--no-best",
    )
    assert (
        code == 2 and "is not a readable safetensors file" in err and "1/1" not in err
    )  # no answer generated
    code, _, err = run_cli(capsys, "bench", "--quick", "--adapters", str(tmp_path), "--methods", "ar-hf,dex")
    assert code == 2 and "is a directory, not an adapter file" in err and "warm-up" not in err
    assert err.count("dex: error:") == 1


def broken_model(kind: str, good, tmp_path) -> str:
    """A --model value: a copy of the model directory ``good`` with one file damaged, or a bad name."""
    import shutil

    if kind == "not a hub id!":
        return kind
    if kind == "a 300-character name":
        return "x" * 300
    if kind == "random gguf":
        (tmp_path / "m.gguf").write_bytes(b"GGUF?" * 50)
        return str(tmp_path / "m.gguf")
    dst = shutil.copytree(good, tmp_path / "broken")
    weights, config = dst / "model.safetensors", dst / "config.json"
    if kind == "weights cut in half":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif kind == "weights zeroed":
        weights.write_bytes(bytes(64))
    elif kind == "config not json":
        config.write_text("{oops")
    elif kind == "config disagrees with weights":
        config.write_text(config.read_text().replace('"hidden_size": 48', '"hidden_size": 64'))
    return str(dst)


@pytest.mark.parametrize(
    "kind,message",
    [
        ("weights cut in half", "its files are missing, corrupt or inconsistent"),
        ("weights zeroed", "its files are missing, corrupt or inconsistent"),
        ("config not json", "its files are missing, corrupt or inconsistent"),
        ("config disagrees with weights", "its files are missing, corrupt or inconsistent"),
        ("random gguf", "its files are missing, corrupt or inconsistent"),
        ("not a hub id!", "nor a Hugging Face hub id like 'org/name'"),
        ("a 300-character name", "nor a Hugging Face hub id like 'org/name'"),
    ],
)
def test_broken_model_files_and_malformed_model_names_exit_2(tiny_dir, tmp_path, capsys, kind, message):
    model = broken_model(kind, tiny_dir, tmp_path)
    code, out, err = run_cli(capsys, "generate", "hello", "--model", model, "--no-chat")
    assert code == 2 and message in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("dex: error:") and err.count("dex: error:") == 1


NOISE = ("it/s", "%|", "Loading weights", "Warning", "warning", "deprecat", "[transformers]")


def test_generate_prints_no_third_party_progress_bar_or_warning(tiny_dir):
    """A real ``dex`` process on a model already in place (a warm cache): transformers is imported inside the
    command, so its quiet start comes from the switches set before it loads."""
    argv = ["generate", "hello world", "--model", str(tiny_dir), "--no-chat", "--max-new-tokens", "4"]
    proc = subprocess.run(
        [sys.executable, "-m", "dex_core.cli", *argv], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "4 tokens in" in proc.stdout and "[dex] loading" in proc.stderr  # DEX's own lines stay
    noise = [(n, stream) for n in NOISE for stream in (proc.stdout, proc.stderr) if n in stream]
    assert not noise, proc.stderr


def test_verbose_shows_the_libraries_output_and_the_switches_are_restored_after(tiny_dir, capsys):
    from transformers.utils import logging as tf_logging

    argv = ["generate", "hello", "--model", str(tiny_dir), "--no-chat", "--max-new-tokens", "2"]
    tf_logging.enable_progress_bar()
    verbosity = tf_logging.get_verbosity()
    code, _, err = run_cli(capsys, *argv)
    assert code == 0 and "Loading weights" not in err and "it/s" not in err
    assert tf_logging.is_progress_bar_enabled() and tf_logging.get_verbosity() == verbosity  # as before
    code, _, err = run_cli(capsys, *argv, "--verbose")
    assert code == 0 and "Loading weights" in err  # transformers' own bar, shown on request


def test_every_option_help_states_its_default_at_most_once(monkeypatch):
    """argparse formats each option's help on one line this wide; 'None' is never shown as a default."""
    import argparse

    from dex_core.cli import build_parser

    monkeypatch.setenv("COLUMNS", "2000")
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert len(subparsers) == 9
    for name, sub in subparsers.items():
        text = sub.format_help()
        options = [line for line in text.splitlines() if line.lstrip().startswith("-")]
        assert any(line.lstrip().startswith("--verbose, --no-verbose") for line in options), name
        twice = [line for line in options if line.count("(default") > 1 or "(default: None)" in line]
        assert not twice, f"dex {name}: {twice}"
    threads = subparsers["generate"].format_help()
    assert "(default: cores // K, at least 1)\n" in threads and "--decs, --no-decs" in threads


def test_quiet_libraries_drops_third_party_warnings_and_keeps_dex_own():
    import warnings

    from dex_core.log import quiet_libraries

    def warn(module: str, category=UserWarning) -> None:
        warnings.warn_explicit(f"from {module}", category, f"{module}.py", 1, module=module)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_libraries():
            warn("transformers.generation.utils")
            warn("torch.nn.modules.module")
            warn("dex_core.runtime.request", DeprecationWarning)  # no deprecation shows, whoever issues it
            warn("dex_core.runtime.request")
            warn("dex_core.distributed.placement")
        with quiet_libraries(False):
            warn("transformers.generation.utils")
    assert [str(w.message) for w in seen] == [
        "from dex_core.runtime.request",
        "from dex_core.distributed.placement",
        "from transformers.generation.utils",
    ]


def test_dex_serve_http_refuses_an_address_that_is_not_host_and_port_in_one_line(tiny_dir, capsys):
    assert main(["serve", "--http", "localhost", "--model", str(tiny_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dex: error: --http takes HOST:PORT, e.g. 127.0.0.1:8000; got 'localhost'"]
