"""The ``dex`` command: streams text and stats; bad input gives one clear message and exit code 2."""

import json
import subprocess
import sys

import pytest
from conftest import tiny_tokenizer

from dex_core.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


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
    assert "rounds/token" in out and "depth-side speedup" in out and "matched stage:" in out
    assert "depths [2, 4, 6] (K=3; uniform split)" in out and "12 tokens" in out
    doc = json.loads(trace.read_text())
    assert doc["format"] == "dex-trace" and doc["events"][-1]["event"] == "end"
    assert len(doc["events"][-1]["tokens"]) == 12


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
