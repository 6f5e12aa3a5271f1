"""The device rule (STYLE.md item 10): every tensor DEX creates names its device.

``DeviceRule`` is a torch function mode that watches the tensor factories (``torch.tensor``, ``zeros``,
``arange`` …; not the ``*_like`` ones, which follow their argument). A call made from ``dex_core`` — directly
or through torch's own Python code such as ``nn.Linear`` — without a ``device=`` (or with ``device=None``)
is a violation: on a GPU it would build on the CPU and meet a CUDA tensor later. Calls made by Hugging Face
or torch on their own behalf are not DEX's and are not judged. On this CPU-only machine the rule is the
only way a missing ``device=`` shows up, so every decoding path below runs under it.
"""

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import dex_core
from dex_core import DexDecoder, DexError, ar_generate, load_model
from dex_core.analysis.ead import layer_matches, matched_stages
from dex_core.evaluation.baselines.speculation import hf_early_exit_generate, self_spec_generate
from dex_core.flags import add_flags, from_args
from dex_core.model.adapter_choice import load_adapters
from dex_core.model.adapters import new_adapters, read_metadata, save_adapters
from dex_core.model.lens import depth_view, layer_candidates
from dex_core.model.load import resolve_device
from dex_core.testing import tiny_model
from dex_core.trace.events import RoundEvent

FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.asarray,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.empty,
    torch.empty_strided,
    torch.arange,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
    torch.linspace,
    torch.logspace,
    torch.eye,
    torch.scalar_tensor,
    torch.tril_indices,
    torch.triu_indices,
}
DEX = str(Path(dex_core.__file__).parent) + os.sep
TORCH = str(Path(torch.__file__).parent) + os.sep
# Where file data becomes tensors: safetensors' own reads land in host memory (memory-mapped), called from its
# native code, so they show up as DEX's; stage_load._place moves them to their device. Not a device slip.
FILE_READS = DEX + "model" + os.sep + "checkpoint.py"
PROMPT = [5, 9, 14, 3, 22]


class DeviceRule(TorchFunctionMode):
    """Records every factory call that DEX's code makes (``seen``) and those without a device (``missing``),
    as 'file:line torch.name'."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []
        self.missing: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(
                TORCH
            ):  # nn.Linear etc.: its caller
                frame = frame.f_back
            if (
                frame is not None
                and frame.f_code.co_filename.startswith(DEX)
                and not (frame.f_code.co_filename == FILE_READS and func is torch.asarray)
            ):
                where = (
                    f"{Path(frame.f_code.co_filename).relative_to(Path(DEX).parent)}:{frame.f_lineno} "
                    f"torch.{func.__name__}"
                )
                self.seen.append(where)
                if kwargs.get("device") is None:
                    self.missing.append(where)
        return func(*args, **kwargs)


@contextlib.contextmanager
def device_rule(least: int = 1):
    """Run the block under the rule: fail listing each factory call made without a device, and fail when DEX
    made fewer than ``least`` factory calls (so that the check cannot pass by watching nothing)."""
    with DeviceRule() as rule:
        yield rule
    if len(rule.seen) < least:
        pytest.fail(
            f"dex_core made {len(rule.seen)} factory calls here, expected at least {least}: the rule "
            f"watched nothing"
        )
    if rule.missing:
        pytest.fail("tensors created without device=:\n" + "\n".join(sorted(set(rule.missing))))


@pytest.fixture(scope="module")
def model(llama):
    return llama


@pytest.fixture(scope="module")
def adapter_file(model, tmp_path_factory):
    """Adapters at depths 2 and 4 with a visible effect and a token ranking (light heads), saved as a file."""
    path = tmp_path_factory.mktemp("adapters") / "a.safetensors"
    adapters = new_adapters(model, [2, 4])
    for a in adapters.values():
        torch.nn.init.normal_(a.down.weight, std=1.0)
        a.alpha.data.fill_(1.0)
    save_adapters(
        path, adapters, model, {}, ranking=torch.randperm(96, generator=torch.Generator().manual_seed(0))
    )
    return path


def as_dex_code(source: str) -> dict:
    """Run ``source`` as if it were a line of dex_core (its frames carry a dex_core file name)."""
    scope = {"torch": torch}
    exec(compile(source, str(Path(DEX) / "example.py"), "exec"), scope)
    return scope


def test_the_rule_flags_dex_factory_calls_without_a_device_and_only_those():
    for source in (
        "torch.zeros(3)",
        "torch.tensor([1, 2], device=None)",
        "torch.nn.Linear(2, 2)",
        "torch.arange(4, dtype=torch.long)",
    ):
        with DeviceRule() as rule:
            as_dex_code(source)
        assert rule.missing and all(w.startswith("dex_core/example.py:1 torch.") for w in rule.missing), (
            source
        )
    with DeviceRule() as rule:
        as_dex_code(
            "torch.zeros(3, device='cpu'); torch.nn.Linear(2, 2, device='cpu'); torch.zeros_like(torch.ones("
            "2, device='cpu'))"
        )
    assert (
        len(rule.seen) == 4 and rule.missing == []
    )  # zeros, Linear's weight and bias, ones; *_like not watched
    with DeviceRule() as rule:
        torch.zeros(3)  # a call from outside dex_core (this test) is not DEX's
    assert rule.seen == [] and rule.missing == []


def test_adapters_are_built_and_loaded_on_the_models_device(model, adapter_file):
    with device_rule():
        fresh = new_adapters(model, [2, 4], bottleneck=8)
    with device_rule():
        loaded = load_adapters(adapter_file, model)
    assert all(
        p.device == model.device and p.dtype == torch.float32 for a in fresh.values() for p in a.parameters()
    )
    assert all(
        p.device == model.device and p.dtype == model.dtype for a in loaded.values() for p in a.parameters()
    )


@pytest.mark.parametrize(
    "sampling", [{}, {"temperature": 0.9, "top_k": 8, "seed": 3}], ids=["greedy", "seeded"]
)
def test_the_round_loop_names_the_device_of_every_tensor_it_creates(model, adapter_file, sampling):
    with device_rule():
        decoder = DexDecoder(
            model, depths=(2, 4, 6), adapters=adapter_file, proposal_vocab=12, decs=True, trace_top=3
        )
    assert (
        sorted(decoder.adapters) == [2, 4] and decoder.proposal_vocab == 12
    )  # adapters and light heads in use
    with device_rule(least=12):  # every round builds masks and positions: at least one factory call per token
        result = decoder.generate(PROMPT, 12, **sampling)
    assert result.tokens == ar_generate(model, PROMPT, 12, **sampling).tokens


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 3}], ids=["greedy", "seeded"])
def test_the_ar_reference_names_the_device_of_every_tensor_it_creates(model, sampling):
    with device_rule(least=8):  # one input tensor per token at least
        assert len(ar_generate(model, PROMPT, 8, **sampling).tokens) == 8


def test_the_lens_and_ead_name_the_device_of_every_tensor_they_create(model, adapter_file):
    adapters = load_adapters(adapter_file, model)
    tokens = ar_generate(model, PROMPT, 8).tokens
    with device_rule(least=5):
        candidates = layer_candidates(
            model, PROMPT, tokens, adapters, shortlist=torch.arange(12, device="cpu")
        )
        assert layer_matches(model, PROMPT, tokens, adapters)[:, -1].all()
        assert matched_stages(candidates, tokens, (2, 4, 6)).shape == (8,)
        assert len(depth_view(model, PROMPT, tokens, adapters)["prob"]) == 8
    assert candidates.shape == (8, 6, 8)


def test_the_baselines_name_the_device_of_every_tensor_they_create(model, adapter_file):
    adapter = load_adapters(adapter_file, model)[2]
    reference = ar_generate(model, PROMPT, 8).tokens
    with device_rule(least=8):
        assert self_spec_generate(model, PROMPT, 8, 2, 3, adapter)["tokens"] == reference
    with device_rule():
        assert hf_early_exit_generate(model, PROMPT, 8, 2, 3) == reference


def run_cli(capsys, *argv):
    from dex_core.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_model_command_runs_with_device_cpu(tiny_dir, tmp_path, capsys):
    code, out, err = run_cli(
        capsys,
        "generate",
        "hello world",
        "--model",
        tiny_dir,
        "--device",
        "cpu",
        "--no-chat",
        "--max-new-tokens",
        "4",
        "--explorers",
        "2",
    )
    assert code == 0 and "4 tokens" in out and "(float32, cpu)" in err, err  # the load line names the device
    bench = tmp_path / "bench.json"
    code, out, err = run_cli(
        capsys,
        "bench",
        "--quick",
        "--device",
        "cpu",
        "--methods",
        "ar-hf,dex,self-spec",
        "--explorers",
        "2",
        "--out",
        bench,
    )
    report = json.loads(bench.read_text())
    assert code == 0 and report["device"] == "cpu" and report["config"]["device"] == "cpu", err
    assert "on cpu, every method" in out and {r["method"] for r in report["results"]} == {
        "ar-hf",
        "dex",
        "self-spec",
    }
    ead = tmp_path / "ead.json"
    code, _, err = run_cli(
        capsys,
        "ead",
        "--model",
        tiny_dir,
        "--device",
        "cpu",
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
        ead,
    )
    assert code == 0 and json.loads(ead.read_text())["runs"][0]["all"]["tokens"] == 4, err
    adapters = tmp_path / "a.safetensors"
    code, out, err = run_cli(
        capsys,
        "train-adapters",
        "--model",
        tiny_dir,
        "--device",
        "cpu",
        "--out",
        adapters,
        "--depths",
        "2",
        "--tokens",
        "32",
        "--seq-len",
        "16",
        "--no-bf16",
    )
    assert code == 0 and "2 steps" in out and read_metadata(adapters)["training"]["bf16"] is False, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "hi", "--model", "{tiny}", "--no-chat"],
        ["bench", "--quick", "--methods", "ar-hf,dex"],
        [
            "ead",
            "--model",
            "{tiny}",
            "--sets",
            "builtin",
            "--prompts",
            "1",
            "--max-new-tokens",
            "2",
            "--no-best",
        ],
        [
            "train-adapters",
            "--model",
            "{tiny}",
            "--out",
            "{tmp}/a.safetensors",
            "--depths",
            "2",
            "--tokens",
            "16",
        ],
        ["shortlist", "{tmp}/a.safetensors", "--model", "{tiny}"],
    ],
    ids=lambda argv: argv[0],
)
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_device_cuda_without_a_gpu_is_one_clear_error_and_exit_2(tiny_dir, tmp_path, capsys, argv, device):
    argv = [a.format(tiny=tiny_dir, tmp=tmp_path) for a in argv]
    code, out, err = run_cli(capsys, *argv, "--device", device)
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"dex: error: --device {device}: no CUDA device is visible to torch "
        "(torch.cuda.is_available() is False); use --device cpu or auto"
    ]


def test_device_flags_are_checked_and_never_abbreviated(tiny_dir, capsys):
    code, _, err = run_cli(capsys, "generate", "hi", "--model", tiny_dir, "--device", "gpu")
    assert code == 2 and "device must be auto, cpu, cuda or cuda:N (e.g. cuda:1); got 'gpu'" in err
    code, _, err = run_cli(
        capsys, "generate", "hi", "--model", tiny_dir, "--dev", "cpu"
    )  # not --devices, not --device
    assert code == 2 and "unrecognized arguments: --dev" in err


def test_resolve_device_names_what_exists():
    assert (
        resolve_device("auto") == torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else resolve_device("auto") == torch.device("cpu")
    )
    assert resolve_device(" CPU ") == resolve_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(DexError, match=r"cuda:99: .*(torch sees|no CUDA device)"):
        resolve_device("cuda:99")
    for bad in ("cuda:x", "mps", "", None, 0):
        with pytest.raises(DexError, match="device must be auto, cpu, cuda or cuda:N"):
            resolve_device(bad)


def test_the_app_takes_its_device_from_dex_device(tiny_dir, monkeypatch):
    from app.host import state as rt

    assert (
        rt.AppSettings().device == "auto" and rt.AppSettings.from_env({"DEX_DEVICE": "CPU"}).device == "cpu"
    )
    parser = argparse.ArgumentParser()
    add_flags(parser, rt.AppSettings)  # as app/main.py builds its command line
    assert from_args(rt.AppSettings, parser.parse_args(["--device", "cpu"])).device == "cpu"
    with pytest.raises(DexError, match="device must be auto, cpu, cuda or cuda:N"):
        rt.AppSettings.from_env({"DEX_DEVICE": "gpu"})
    asked = []

    def recorded(spec, dtype=None, device="auto", log=None):
        asked.append(device)
        return load_model(spec, dtype=dtype, device=device)

    monkeypatch.setattr(rt, "load_model", recorded)
    runtime = rt.Runtime(rt.AppSettings.from_env({"DEX_MODEL": str(tiny_dir), "DEX_DEVICE": "cpu"}))
    model, _ = runtime.model()
    assert asked == ["cpu"] and model.device == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(DexError, match="--device cuda: no CUDA device is visible to torch"):
            rt.Runtime(rt.AppSettings(model=str(tiny_dir), device="cuda")).model()


@pytest.mark.parametrize(
    "sampling", [{}, {"temperature": 0.9, "top_p": 0.9, "seed": 3}], ids=["greedy", "seeded"]
)
def test_a_round_reads_back_from_the_device_once_with_adapters_light_heads_and_top_candidates(
    model, adapter_file, sampling
):
    from dex_core.host_reads import reads_per_event

    dex = DexDecoder(
        model, depths=(2, 4, 6), adapters=str(adapter_file), proposal_vocab=48, trace_top=5, prune=2
    )
    reads = []
    for event, watch in reads_per_event(dex.stream(PROMPT, 12, **sampling)):
        # tokens, probabilities, margins and top-5 of every explorer together
        if isinstance(event, RoundEvent):
            reads.append(watch.where)
            assert any(node.top for node in event.nodes)  # the top-5 really came back
    assert reads and all(len(r) == 1 and "readback.py" in r[0][1] for r in reads), reads


def test_auto_dtype_is_float32_on_cpu_and_the_checkpoints_half_precision_on_cuda(monkeypatch):
    from types import SimpleNamespace

    from dex_core import DexConfig, DexError
    from dex_core.device import resolve_dtype

    saved = lambda d: SimpleNamespace(dtype=d)  # noqa: E731  (a config that records its weights' dtype)
    assert DexConfig().dtype == "auto" and resolve_dtype("auto", "cpu", saved("bfloat16")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", "cuda", saved("float16")) == torch.float16
    assert resolve_dtype("auto", "cuda", saved(torch.bfloat16)) == torch.bfloat16
    assert (
        resolve_dtype("auto", "cuda", saved("float32")) == torch.bfloat16
    )  # GGUF-converted models are float32
    assert resolve_dtype(None, "cuda", SimpleNamespace()) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", "cuda", saved("float32")) == torch.float16  # a GPU without bfloat16
    assert resolve_dtype("float64", "cuda", saved("float16")) == torch.float64
    with pytest.raises(
        DexError, match="dtype must be one of auto, float32, float64, bfloat16, float16; got 'half'"
    ):
        resolve_dtype("half", "cpu")


def test_an_explorers_part_is_built_naming_the_device_of_every_tensor(tmp_path):
    from dex_core.model.checkpoint import Checkpoint
    from dex_core.model.stage_load import StagePart, checkpoint_identity, load_stage

    model = tiny_model("llama", layers=4)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    with device_rule(least=3):
        for part in (
            StagePart((2, 4), 0, (7, 3, 5)),
            StagePart((2, 4), 1),
        ):  # light head rows; the whole head
            stage = load_stage(model.config, part, Checkpoint(tmp_path), "cpu", torch.float32)
        checkpoint_identity(model.config, Checkpoint(tmp_path))
    assert stage.model.lm_head.weight.device.type == "cpu"


def test_a_float32_run_refuses_once_float32_matmuls_are_set_to_tf32_and_runs_again_at_highest():
    """dex_core/device.py: set_float32_matmul_precision('high') turns on TF32 (oneDNN's on this CPU) for every
    float32 matmul of the process; DEX's float32 promise would break unnoticed, so the run refuses."""
    from dex_core.device import exact_float32_matmuls, float32_matmul_shortcuts

    model, prompt = tiny_model("llama").float(), [1, 5, 9, 14]
    expected = ar_generate(model, prompt, 4).tokens
    try:
        torch.set_float32_matmul_precision("high")
        assert float32_matmul_shortcuts("cpu") == ["mkldnn=tf32"]
        for run in (
            lambda: DexDecoder(model, explorers=2).generate(prompt, max_new_tokens=4),
            lambda: ar_generate(model, prompt, 4),
        ):
            with pytest.raises(
                DexError, match=r"float32 matmuls are set to a lower precision in this process \(mkldnn=tf32"
            ):
                run()
        half = tiny_model("llama").to(torch.bfloat16)
        assert len(DexDecoder(half, explorers=2).generate(prompt, max_new_tokens=4).tokens) == 4  # certified
    finally:
        exact_float32_matmuls()
    assert float32_matmul_shortcuts() == []
    assert DexDecoder(model, explorers=2).generate(prompt, max_new_tokens=4).tokens == expected


def test_a_packed_row_holds_each_value_in_its_named_column():
    from dex_core.runtime.readback import GAP, MARGIN, PROB, TOKEN, PackLayout, pack, unpack

    layout, f = PackLayout(3), torch.float64
    ids, probs = torch.tensor([[5, 6], [7, 8]]), torch.tensor([[0.5, 0.25], [0.75, 0.125]], dtype=f)
    values = (torch.tensor([0.5, 0.75], dtype=f), None, torch.tensor([1e-3, 2e-3], dtype=f))
    rows = pack(2, 3, "cpu", torch.tensor([5, 7]), values, (ids, probs)).tolist()
    assert len(rows[0]) == layout.columns == 10 and rows[1][TOKEN] == 7 and rows[1][PROB] == 0.75
    assert rows[0][GAP] == 1e-3 and rows[0][MARGIN] != rows[0][MARGIN]  # no margin made: NaN
    assert rows[1][layout.ids] == [7, 8, -1] and rows[1][layout.probs][:2] == [0.75, 0.125]
    out = unpack(rows, 3, None, 0.0)
    assert out.tokens == [5, 7] and out.top[1] == [(7, 0.75), (8, 0.125)] and out.margins is None
