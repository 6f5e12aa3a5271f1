"""Stage-sharded loading: each explorer reads only its own part of a checkpoint (no process holds the whole model,
no weight file is written), the start is bounded by silence, and ``dex plan`` counts what each rank holds."""

import copy
import json
import os
import tempfile
import time

import psutil
import pytest
import torch
from faults import Silent, SlowLoad
from helpers import live_children, started_since
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
)

from dex_core import DexDecoder, DexError, ExplorerError, ar_generate
from dex_core.analysis.plan import EXAMPLE_CONFIGS, model_config, parse_size, plan_ranks
from dex_core.model.adapters import model_identity, new_adapters, save_adapters
from dex_core.model.checkpoint import Checkpoint
from dex_core.model.stage_load import (
    StagePart,
    StateDict,
    checkpoint_identity,
    load_stage,
    part_bytes,
    skeleton,
)
from dex_core.testing import tiny_model, tiny_tokenizer

ROWS = 512  # the light heads' rows in these tests


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A ~32 MB float32 Llama (8 layers, untied head) saved in three safetensors shards with an index, its
    tokenizer, and an adapter file for depths 3 and 6 that stores a token ranking (so light heads need no data
    set); returns (folder, model, adapter file)."""
    folder = tmp_path_factory.mktemp("sharded")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    model.save_pretrained(folder, max_shard_size="12MB")
    tiny_tokenizer(4096).save_pretrained(folder)
    adapters = folder.parent / "adapters.safetensors"
    ranking = torch.randperm(4096, generator=torch.Generator().manual_seed(1))
    save_adapters(adapters, new_adapters(model, [3, 6]), model, {"note": "random"}, ranking)
    return folder, model, adapters


def test_the_checkpoint_is_sharded_as_the_tests_need(sharded):
    folder, _, _ = sharded
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    assert 25e6 < sum(p.stat().st_size for p in folder.glob("*.safetensors")) < 40e6


def test_rows_are_read_in_the_order_asked_and_a_checkpoint_without_safetensors_is_refused(sharded, tmp_path):
    folder, model, _ = sharded
    head = model.lm_head.weight.detach()
    rows = [4095, 7, 8, 9, 0, 100]
    assert torch.equal(Checkpoint(folder).read("lm_head.weight", rows), head[rows])
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(DexError, match="holds no safetensors weights .*save the model with save_pretrained"):
        Checkpoint(tmp_path)


def test_a_model_the_parent_does_not_load_resolves_the_settings_a_loaded_one_does(sharded):
    """What the app keys its explorer groups by: one frozen, hashable ``RunSettings`` per run, the same whether
    the model is loaded or only read from its checkpoint (``UnloadedModel``), and as many as differ."""
    from dex_core import DecoderOptions
    from dex_core.runtime.unloaded import UnloadedModel

    folder, model, adapters = sharded
    unloaded = UnloadedModel.read(str(folder), "float32", "cpu", log=lambda line: None)
    assert all(p.is_meta for p in unloaded.view.model.parameters())  # shapes, no weights
    choices = [
        DecoderOptions(explorers=3, adapters=str(adapters), proposal_vocab=ROWS),
        DecoderOptions(depths=(3, 6, 8), adapters=str(adapters), proposal_vocab=ROWS, prune="none"),
        DecoderOptions(explorers=2, proposal_vocab="full", decs=False),
    ]
    resolved = [unloaded.settings(options) for options in choices]
    loaded = [DexDecoder(model, options, tokenizer=unloaded.tokenizer).settings for options in choices]
    assert resolved == loaded and len(set(resolved)) == 3  # hashable: dict keys
    assert resolved[0].adapters.depths == (3, 6) and len(resolved[0].shortlist) == ROWS
    assert (resolved[1].depth_choice, resolved[1].prune, resolved[2].shortlist) == ("given", None, None)


@pytest.mark.parametrize("tied", [False, True])
def test_each_part_holds_exactly_what_from_pretrained_puts_there(tmp_path, tied):
    model = tiny_model("llama", layers=6, tie_word_embeddings=tied)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).state_dict()
    depths, ids = (2, 4, 6), (5, 3, 90, 17)
    for rank in range(3):
        for rows in (None, ids):
            part = StagePart(depths, rank, rows)
            stage = load_stage(model.config, part, Checkpoint(tmp_path), "cpu", torch.float64)
            got = stage.model.state_dict()
            layers = tuple(f"model.layers.{i}." for i in part.layers)
            for key, value in reference.items():
                held = (
                    key.startswith(layers)
                    or key == "model.norm.weight"
                    or (key == "model.embed_tokens.weight" and rank == 0)
                    or (key == "lm_head.weight" and (rows is None or rank == 2))
                )
                assert torch.equal(got[key], value) if held else got[key].is_meta, (rank, rows, key)
            if rows is not None and rank < 2:
                assert torch.equal(stage.head_rows[0], reference["lm_head.weight"][list(ids)])
                source = "model.embed_tokens.weight" if tied else "lm_head.weight"
                assert stage.read[source] == (None if tied and rank == 0 else len(ids))


def test_fused_expert_weights_are_converted_by_transformers_own_rules(tmp_path):
    # a saved mixture-of-experts checkpoint stores one tensor per expert; the model fuses them: the loader must
    # map keys the way from_pretrained does (WeightConverter), not assume that the names match
    config = Qwen2MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
    )
    Qwen2MoeForCausalLM(config).save_pretrained(tmp_path, max_shard_size="30KB")
    keys = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert (
        "model.layers.2.mlp.experts.3.up_proj.weight" in keys
        and "model.layers.2.mlp.experts.gate_up_proj" not in keys
    )
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).state_dict()
    stage = load_stage(config, StagePart((2, 4), 1), Checkpoint(tmp_path), "cpu", torch.float32)
    got = stage.model.state_dict()
    assert torch.equal(
        got["model.layers.2.mlp.experts.gate_up_proj"], reference["model.layers.2.mlp.experts.gate_up_proj"]
    )
    assert all(
        torch.equal(got[k], v)
        for k, v in reference.items()
        if k.startswith(("model.layers.2.", "model.layers.3."))
    )
    assert (
        sum(k.startswith("model.layers.2.mlp.experts.") for k in stage.read) == 12
    )  # 4 experts x 3 matrices


def test_a_model_built_in_memory_hands_its_parts_over_without_files(tmp_path):
    model = tiny_model("qwen3", tie_word_embeddings=True, head_dim=16)
    part = StagePart((2, 4, 6), 0, (3, 1, 4))
    source = StateDict.from_bytes(StateDict.of(model, part).to_bytes())
    stage = load_stage(model.config, part, source, "cpu", torch.float64)
    assert torch.equal(stage.model.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert torch.equal(stage.head_rows[0], model.lm_head.weight[[3, 1, 4]])


def test_the_parent_reads_the_embeddings_first_rows_for_the_identity(sharded):
    folder, model, _ = sharded
    assert checkpoint_identity(model.config, Checkpoint(folder)) == model_identity(model)


@pytest.mark.slow
@pytest.mark.process
def test_distributed_from_a_checkpoint_the_parent_holds_no_weights_and_each_rank_reads_only_its_keys(
    sharded, monkeypatch, tmp_path
):
    folder, model, adapters = sharded
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the group's private folder goes
    reads = []
    original = Checkpoint.read
    monkeypatch.setattr(
        Checkpoint,
        "read",
        lambda self, key, rows=None: reads.append((key, rows)) or original(self, key, rows),
    )
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", None)  # the parent must not load a model
    options = dict(explorers=3, adapters=str(adapters), proposal_vocab=ROWS, trace_top=2)
    prompts = [[9], [5, 17, 3, 88, 40, 2, 61] * 3]
    # float64 (from a float32 checkpoint), as exactness tests run: a random model's candidates are near-ties
    with DexDecoder.from_pretrained(
        str(folder), backend="distributed", device="cpu", threads=1, dtype="float64", **options
    ) as dist:
        assert dist.model is None and all(p.is_meta for p in dist.view.model.parameters())
        assert reads == [
            ("model.embed_tokens.weight", range(64))
        ]  # the adapters' identity check, nothing else
        files = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert not [p for p in files if p.stat().st_size > 4096], (
            files
        )  # sockets and the rendezvous file only
        index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
        ranking = dist.shortlist.tolist()
        for k, (start, stop) in enumerate([(0, 3), (3, 6), (6, 8)]):
            want = {
                key: None
                for key in index
                if key.startswith(tuple(f"model.layers.{i}." for i in range(start, stop)))
            }
            want |= {"model.norm.weight": None, "lm_head.weight": ROWS if k < 2 else None}
            want |= {"model.embed_tokens.weight": None} if k == 0 else {}
            assert dist.group.loaded[k]["read"] == want, k
        shape = skeleton(model.config, torch.float64)
        planned = [sum(part_bytes(shape, dist.settings.part(k)).values()) for k in range(3)]
        assert [r["bytes"] for r in dist.group.loaded] == planned  # dex plan's count is what the ranks place
        assert len(ranking) == ROWS and dist.group.data_link == ("gloo", False)
        monkeypatch.undo()
        model = copy.deepcopy(model).double()
        sequential = DexDecoder(model, tokenizer=tiny_tokenizer(4096), **options)
        for prompt in prompts:
            got, same = dist.generate(prompt, 24), sequential.generate(prompt, 24)
            assert got.tokens == same.tokens == ar_generate(model, prompt, 24).tokens

            def strip(trace):
                return [{k: v for k, v in e.record().items() if k not in ("timings", "stats")} for e in trace]

            assert strip(got.trace) == strip(
                same.trace
            )  # the same adapters and light heads: the same lattice
        sampled = dist.generate(prompts[1], 16, temperature=0.8, top_p=0.9, seed=5)
        assert sampled.tokens == ar_generate(model, prompts[1], 16, temperature=0.8, top_p=0.9, seed=5).tokens
        pids = dist.group.pids()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


@pytest.mark.slow
@pytest.mark.process
def test_a_rank_that_loads_slowly_but_reports_progress_outlives_start_timeout(sharded):
    folder, model, _ = sharded
    tic = time.monotonic()
    with DexDecoder.from_pretrained(
        str(folder),
        backend="distributed",
        device="cpu",
        threads=1,
        depths=(4, 8),
        adapters={4: SlowLoad(0.1)},
        proposal_vocab="full",
        start_timeout=2.0,
    ) as dex:
        took = time.monotonic() - tic
        assert (
            len(dex.group.loaded[0]["read"]) == 39
        )  # 4 layers x 9, norm, head, embeddings: each 0.1 s late, 3.9 s in all, twice start_timeout
        assert dex.generate([3, 1, 4, 1, 5], 8).tokens == ar_generate(model, [3, 1, 4, 1, 5], 8).tokens
    assert took > 39 * 0.1


@pytest.mark.slow  # waits out start_timeout, then close's grace for the hung rank (5 s)
@pytest.mark.process
def test_a_rank_silent_while_it_loads_is_named_after_start_timeout(sharded):
    folder, _, _ = sharded
    before = live_children()  # the session's shared groups and browser are children too
    tic = time.monotonic()
    with pytest.raises(
        ExplorerError,
        match=r"explorer rank 1 sent nothing for 2 s while loading its part of the "
        r"model \(0 of 16 MB placed\); raise start_timeout",
    ):
        DexDecoder.from_pretrained(
            str(folder),
            backend="distributed",
            device="cpu",
            threads=1,
            depths=(2, 6, 8),
            adapters={6: Silent(120)},
            proposal_vocab="full",
            start_timeout=2.0,
        )
    assert time.monotonic() - tic < 60  # the import of torch, then 2 s of silence: not the 120 s it sleeps
    assert not started_since(before)


LLAMA2_70B = json.loads((EXAMPLE_CONFIGS / "llama-2-70b.json").read_text())  # the shipped example


def test_plan_counts_llama2_70b_layers_by_the_formula_from_its_config(tmp_path, capsys):
    from dex_core.cli import main

    h, i, kv = 8192, 28672, 8192 // 64 * 8
    layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two norms
    config = LlamaConfig(**{k: v for k, v in LLAMA2_70B.items() if k != "model_type"})
    plans = plan_ranks(config, tuple(range(10, 81, 10)), torch.bfloat16, 4096, 8)
    assert [p.weights["layers"] for p in plans] == [10 * layer * 2] * 8 and 17.0e9 < 10 * layer * 2 < 17.2e9
    assert plans[0].weights["embeddings"] == plans[7].weights["head"] == 32000 * h * 2
    # 4096 tokens + twice the tree masks' lattice region (255 nodes + 128 rows: a region of 512): 5120 entries
    assert plans[7].kv == 10 * 2 * 8 * 128 * 5120 * 2
    path = EXAMPLE_CONFIGS / "llama-2-70b.json"
    assert (
        main(
            ["plan", "--config", str(path), "--explorers", "8", "--dtype", "bfloat16", "--gpu-memory", "80GB"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count(" 17.1 GB ") == 8 and out.count(": fits") == 8
    assert main(["plan", "--config", str(path), "--explorers", "4", "--gpu-memory", "24GiB"]) == 1
    out = capsys.readouterr().out
    assert "K=4 explorers in float16" in out and out.count("does NOT fit") == 4  # 34 GB of layers per GPU
    assert (
        main(["plan", "--config", str(path), "--explorers", "8", "--gpus", "4", "--gpu-memory", "80GB"]) == 0
    )
    assert "GPU 3 (ranks 3, 7)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, headline, params",
    [  # the parameter counts the models' cards and safetensors indexes give
        ("llama-2-70b.json", "llama: 80 layers, hidden 8192, vocabulary 32000", 68_976_648_192),
        ("llama-3-8b.json", "llama: 32 layers, hidden 4096, vocabulary 128256", 8_030_261_248),
        ("qwen3-32b.json", "qwen3: 64 layers, hidden 5120, vocabulary 151936", 32_762_123_264),
        ("codellama-34b.json", "llama: 48 layers, hidden 8192, vocabulary 32000", 33_743_970_304),
    ],
)
def test_the_shipped_example_configs_plan_their_models_parameters(name, headline, params, capsys):
    from dex_core.cli import main

    config = model_config(None, str(EXAMPLE_CONFIGS / name))
    plans = plan_ranks(config, (config.num_hidden_layers,), torch.bfloat16, 16, None)
    assert sum(plans[0].weights.values()) == 2 * params  # every weight, in bfloat16
    assert main(["plan", "--config", str(EXAMPLE_CONFIGS / name), "--explorers", "4"]) == 0
    assert capsys.readouterr().out.startswith(headline)


def unreachable_hub(monkeypatch, tmp_path):
    """A hub that refuses connections at once and an empty Hugging Face cache (huggingface_hub's real calls)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


def test_plan_of_a_hub_id_offline_is_one_line_at_once_naming_the_shipped_config(
    monkeypatch, tmp_path, capsys
):
    from dex_core.cli import main

    unreachable_hub(monkeypatch, tmp_path)
    tic = time.monotonic()
    assert main(["plan", "meta-llama/Llama-2-70b-hf"]) == 2
    assert time.monotonic() - tic < 10
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Retrying" not in err
    assert "the Hugging Face hub (http://127.0.0.1:9) cannot be reached" in err
    assert err.strip().endswith(
        f"or plan from a config.json: dex plan --config {EXAMPLE_CONFIGS}/llama-2-70b.json"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["plan", "Qwen/Qwen3-8B"]) == 2
    err = capsys.readouterr().err
    assert "not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in err and err.count("\n") == 1
    assert err.strip().endswith(f"dex plan --config FILE (examples: {EXAMPLE_CONFIGS})")


def test_plan_reads_a_cached_hub_config_without_asking_the_hub(monkeypatch, tmp_path, capsys):
    import huggingface_hub

    from dex_core.cli import main

    unreachable_hub(monkeypatch, tmp_path)
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "config.json").write_text((EXAMPLE_CONFIGS / "qwen3-32b.json").read_text())
    monkeypatch.setattr(
        huggingface_hub, "try_to_load_from_cache", lambda *a, **k: str(snapshot / "config.json")
    )
    assert main(["plan", "Qwen/Qwen3-32B", "--explorers", "2"]) == 0
    assert capsys.readouterr().out.startswith("qwen3: 64 layers, hidden 5120, vocabulary 151936; K=2")


def test_plan_refuses_bad_sizes_and_a_missing_model(capsys):
    from dex_core.cli import main

    assert parse_size("80GB") == 80e9 and parse_size("24 GiB") == 24 * 2**30 and parse_size("1.5tb") == 1.5e12
    assert main(["plan", "--config", "x.json", "--gpu-memory", "lots"]) == 2
    assert "a memory size is a number with a unit, like 80GB" in capsys.readouterr().err
    assert main(["plan"]) == 2 and "give a model (SPEC) or --config" in capsys.readouterr().err
    assert (
        main(["plan", "--config", os.devnull]) == 2
        and "could not read the model's config" in capsys.readouterr().err
    )


def test_a_hub_id_is_fetched_once_as_safetensors_and_read_like_a_folder(sharded, monkeypatch):
    import huggingface_hub

    from dex_core.model import checkpoint

    folder, _, _ = sharded
    asked = []
    monkeypatch.setattr(checkpoint, "check_hub", lambda repo_id: asked.append(("check", repo_id)))
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo_id, allow_patterns: asked.append((repo_id, allow_patterns)) or str(folder),
    )
    assert checkpoint.locate("some-org/some-model", print) == folder
    assert asked[0] == ("check", "some-org/some-model") and asked[1][0] == "some-org/some-model"
    assert "*.safetensors" in asked[1][1] and not any("bin" in p or "pt" == p[-2:] for p in asked[1][1])
    assert len(Checkpoint(folder).keys()) == 75  # 8 layers x 9, the norm, the embeddings, the head
