"""Inducing adapters: file round trip with model identity, use in DEX, and training."""

import itertools
import json
import re

import pytest
import torch

from dex_core import DexDecoder, DexError, ar_generate
from dex_core.model.adapter_choice import load_adapters, resolve_adapters
from dex_core.model.adapters import (
    DEFAULT_ADAPTERS,
    InducingAdapter,
    new_adapters,
    read_metadata,
    save_adapters,
)
from dex_core.model.named import NAMED, shipped_adapters
from dex_core.testing import tiny_model
from dex_core.training.train import TrainConfig, distill_loss, train_adapters


def test_a_fresh_adapter_starts_near_identity_with_the_paper_parameter_count():
    adapter = InducingAdapter(48, 96)
    h = torch.randn(5, 48)
    assert torch.allclose(adapter(h), h, atol=1e-2)
    assert sum(p.numel() for p in adapter.parameters()) == 4 * 48**2 + 4 * 48 + 1  # App. C.2, m = 2h


def saved_adapters(model, path, std: float, alpha: float, training=None):
    """Adapters at depths 2 and 4 with a visible effect (random W2, open gate), saved to ``path``."""
    adapters = new_adapters(model, [2, 4])
    for a in adapters.values():
        torch.nn.init.normal_(a.down.weight, std=std)
        a.alpha.data.fill_(alpha)
    save_adapters(path, adapters, model, training or {})
    return adapters


def test_adapter_files_round_trip_and_refuse_other_models(tmp_path):
    model = tiny_model("llama")
    path = tmp_path / "a.safetensors"
    adapters = saved_adapters(model, path, std=0.5, alpha=0.7, training={"tokens": 123})
    meta = read_metadata(path)
    assert meta["depths"] == [2, 4] and meta["training"] == {"tokens": 123} and meta["bottleneck"] == 96
    loaded = load_adapters(path, model)
    h = torch.randn(3, 48, dtype=torch.float64)
    assert torch.allclose(loaded[2](h), adapters[2].double()(h), atol=1e-2)
    with pytest.raises(DexError, match="8 layers"):
        load_adapters(path, tiny_model("llama", layers=8))
    with pytest.raises(DexError, match="different weights"):
        load_adapters(path, tiny_model("llama", seed=1))
    with pytest.raises(DexError, match="no adapter file"):
        DexDecoder(model, explorers=3, adapters=tmp_path / "missing.safetensors")


def test_dex_with_an_adapter_file_is_exact_and_uses_the_covered_depths(llama, tmp_path):
    model = llama
    path = tmp_path / "a.safetensors"
    saved_adapters(model, path, std=2.0, alpha=1.0)
    prompt = [4, 9, 16, 25]
    decoder = DexDecoder(model, depths=(2, 3, 6), adapters=path)
    assert sorted(decoder.adapters) == [2]  # depth 4 is not explored here; depth 3 has none
    result = decoder.generate(prompt, 40)
    assert result.tokens == ar_generate(model, prompt, 40).tokens


def test_auto_adapters_are_the_shipped_set_only_for_the_default_model(llama):
    model = llama
    assert resolve_adapters("auto", model) == {} and resolve_adapters("none", model) == {}
    assert DexDecoder(model, explorers=3).adapters == {}  # 'auto' is the default
    with pytest.raises(DexError, match="were trained for a llama model with 30 layers"):
        resolve_adapters("default", model)


def test_auto_and_default_find_the_shipped_file_trained_for_the_model(tmp_path, monkeypatch):
    import dex_core.model.adapter_choice as choice

    model, other = tiny_model("llama"), tiny_model("llama", seed=1)
    saved_adapters(model, tmp_path / "tiny.safetensors", std=0.5, alpha=0.7)
    monkeypatch.setattr(choice, "ASSETS", tmp_path)  # the default model's file stays where it is
    assert choice.shipped_file(model) == tmp_path / "tiny.safetensors" and choice.shipped_file(other) is None
    assert sorted(resolve_adapters("auto", model)) == [2, 4] and resolve_adapters("auto", other) == {}
    assert sorted(load_adapters("default", model)) == [2, 4]
    assert NAMED["default"].adapters == DEFAULT_ADAPTERS == shipped_adapters("default")
    assert shipped_adapters("Qwen/Qwen3-0.6B") is None  # a hub id names no shipped file
    with pytest.raises(DexError, match="were trained for a llama model with 30 layers"):
        resolve_adapters("default", other)


def test_training_lowers_the_distillation_loss(tmp_path):
    model = tiny_model("llama").float()
    gen = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 96, (32,), generator=gen) for _ in range(8)]
    cfg = TrainConfig(depths=(2, 4), tokens=32 * 4 * 30, seq_len=32, batch=4, lr=1e-2, bf16=False)
    x = torch.stack(data[:4])
    before = float(distill_loss(model, new_adapters(model, [2, 4]), x, False).detach())
    out = tmp_path / "trained.safetensors"
    facts = train_adapters(model, None, cfg, out, progress=False, windows=itertools.cycle(data))
    trained = load_adapters(out, model)
    after = float(distill_loss(model, {d: a.float() for d, a in trained.items()}, x, False).detach())
    assert facts["steps"] == 30 and facts["tokens"] == 30 * 4 * 32 and after < 0.8 * before
    assert read_metadata(out)["training"]["tokens"] == 30 * 4 * 32


def test_the_top1_term_adds_the_cross_entropy_on_the_teachers_top_token():
    model = tiny_model("llama").float()
    x = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    adapters = new_adapters(model, [3])
    torch.nn.init.normal_(adapters[3].down.weight, std=0.5)
    adapters[3].alpha.data.fill_(0.7)
    with torch.no_grad():
        out = model(x, output_hidden_states=True)
        student = torch.log_softmax(model.lm_head(model.model.norm(adapters[3](out.hidden_states[3]))), -1)
        ce = -student.gather(-1, out.logits.argmax(-1, keepdim=True)).mean()
        kl = distill_loss(model, adapters, x, False)
        assert torch.allclose(distill_loss(model, adapters, x, False, top1=0.5), kl + 0.5 * ce, atol=1e-5)
    assert ce > 0 and kl > 0


def test_the_shortlist_loss_is_the_kl_over_the_shortlists_tokens():
    from dex_core.model.proposal import ProposalHead
    from dex_core.model.view import model_view

    model = tiny_model("gemma2").float()  # soft-capped logits: the shortlist's teacher must finish them too
    x = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(2))
    adapters = new_adapters(model, [2, 3])
    for a in adapters.values():
        torch.nn.init.normal_(a.down.weight, std=0.5)
        a.alpha.data.fill_(0.7)
    view = model_view(model)
    everything = ProposalHead(view, torch.randperm(96, generator=torch.Generator().manual_seed(3)))
    with torch.no_grad():
        full = distill_loss(model, adapters, x, False, top1=0.5)
        assert torch.allclose(distill_loss(model, adapters, x, False, 0.5, everything), full, atol=1e-5)
        ids = torch.tensor([5, 0, 17, 40, 95, 63, 8])
        out = model(x, output_hidden_states=True)
        teacher = torch.log_softmax(out.logits[..., ids], -1)
        kl = sum(
            (teacher.exp() * (teacher - torch.log_softmax(view.head(a(out.hidden_states[d]))[..., ids], -1)))
            .sum(-1)
            .mean()
            for d, a in adapters.items()
        )
        shortlist = distill_loss(model, adapters, x, False, 0.0, ProposalHead(view, ids))
        assert torch.allclose(shortlist, kl / 2, atol=1e-5) and shortlist < full


def test_onpolicy_data_is_the_models_own_greedy_answers():
    from dex_core.runtime.request import chat_ids
    from dex_core.testing import tiny_tokenizer
    from dex_core.training.data import _onpolicy_sequences

    model, tokenizer = tiny_model("llama", layers=3, seed=2), tiny_tokenizer()
    texts = ["hello world w5 w7", "the prime number w12 w3 w40 w41 w9 a", "w1"]
    rows = itertools.cycle([{"prompt": t} for t in texts])
    sequences = _onpolicy_sequences(model, tokenizer, rows, 10)
    for text in texts:  # batched with left padding, each equals its own greedy AR answer
        prompt = chat_ids(tokenizer, [{"role": "user", "content": text}], generation_prompt=True)
        got = next(sequences)
        assert got[: len(prompt)] == prompt and got[len(prompt) :] == ar_generate(model, prompt, 10).tokens


def test_training_can_start_from_an_adapter_file(tmp_path):
    model = tiny_model("llama").float()
    start = new_adapters(model, [2, 4])
    for d, a in start.items():
        a.alpha.data.fill_(d / 8)
    path = tmp_path / "start.safetensors"
    save_adapters(path, start, model, {"tokens": 0})
    data = [torch.randint(0, 96, (16,)) for _ in range(2)]
    cfg = TrainConfig(depths=(2, 4), tokens=16, seq_len=16, batch=1, lr=1e-9, bf16=False, init=str(path))
    out = tmp_path / "out.safetensors"
    train_adapters(model, None, cfg, out, progress=False, windows=itertools.cycle(data))
    assert {d: round(float(a.alpha), 3) for d, a in load_adapters(out, model).items()} == {2: 0.25, 4: 0.5}
    cfg = TrainConfig(depths=(1, 3, 5), tokens=16, seq_len=16, batch=1, lr=1e-9, bf16=False, init=str(path))
    train_adapters(
        model, None, cfg, out, progress=False, windows=itertools.cycle(data)
    )  # nearest depth, ties low
    assert {d: round(float(a.alpha), 3) for d, a in load_adapters(out, model).items()} == {
        1: 0.25,
        3: 0.25,
        5: 0.5,
    }
    with pytest.raises(DexError, match="depth 2 .the nearest to 2. has bottleneck 96, not --bottleneck 8"):
        train_adapters(
            model,
            None,
            TrainConfig(depths=(2,), tokens=16, seq_len=16, bottleneck=8, init=str(path)),
            out,
            progress=False,
            windows=itertools.cycle(data),
        )
    with pytest.raises(DexError, match="data must be one of"):
        TrainConfig(data="web")


def _file_like(tmp_path, model, name, metadata=None, tensors=None):
    """A saved adapter file, then ``metadata`` (key: text, None removes it) and ``tensors`` changed."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    good = tmp_path / "good.safetensors"
    saved_adapters(model, good, std=0.5, alpha=0.7)
    with safe_open(str(good), "pt") as fh:
        meta, weights = fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}
    for changes, target in ((metadata or {}, meta), (tensors or {}, weights)):
        for key, value in changes.items():
            if value is None:
                del target[key]
            else:
                target[key] = value if target is weights or isinstance(value, str) else json.dumps(value)
    path = tmp_path / name
    save_file(weights, str(path), metadata=meta)
    return path


@pytest.mark.parametrize(
    "kind,message",
    [
        ("random bytes", "is not a readable safetensors file"),
        ("cut in half", "is not a readable safetensors file"),
        ("empty", "is not a readable safetensors file"),
        ("directory", "is a directory, not an adapter file"),
    ],
)
def test_corrupt_truncated_and_directory_adapter_files_are_clear_errors(llama, tmp_path, kind, message):
    model = llama
    good = tmp_path / "good.safetensors"
    saved_adapters(model, good, std=0.5, alpha=0.7)
    path = tmp_path / "bad.safetensors"
    if kind == "directory":
        path.mkdir()
    else:
        raw = good.read_bytes()
        path.write_bytes(
            {
                "random bytes": torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0))
                .to(torch.uint8)
                .numpy()
                .tobytes(),
                "cut in half": raw[: len(raw) // 2],
                "empty": b"",
            }[kind]
        )
    for attempt in (
        lambda: read_metadata(path),
        lambda: load_adapters(path, model),
        lambda: DexDecoder(model, explorers=3, adapters=path),
    ):
        with pytest.raises(DexError, match=message):
            attempt()


@pytest.mark.parametrize(
    "metadata,message",
    [
        ({"format": None}, "not a DEX adapter file"),
        ({"identity": None}, "metadata lacks 'identity'"),
        ({"training": None}, "metadata lacks 'training'"),
        ({"identity": "{not json"}, "invalid DEX adapter metadata 'identity'"),
        ({"identity": [1, 2]}, "invalid DEX adapter metadata 'identity'"),
        ({"identity": {"model_type": "llama"}}, "'num_layers' is NoneType"),
        ({"depths": "[2, oops]"}, "invalid DEX adapter metadata 'depths'"),
        ({"depths": [4, 2]}, "increasing positive layer counts"),
        ({"depths": [2.5]}, "a depth is float"),
        ({"depths": [2, 6]}, "its model has only 6 layers"),
        ({"bottleneck": "-1"}, "invalid DEX adapter metadata 'bottleneck'"),
        ({"bottleneck": "1e9"}, "invalid DEX adapter metadata 'bottleneck'"),
        (
            {"bottleneck": "1000000000"},
            "has shape [96, 48], not [1000000000, 48]",
        ),  # checked before any allocation
        ({"activation": "nope"}, "unknown activation 'nope'"),
        ({"eps": "nan"}, "invalid DEX adapter metadata 'eps'"),
    ],
)
def test_adapter_files_with_missing_or_invalid_metadata_are_clear_errors(llama, tmp_path, metadata, message):
    model = llama
    path = _file_like(tmp_path, model, "bad.safetensors", metadata=metadata)
    with pytest.raises(DexError, match=re.escape(message)):
        load_adapters(path, model)


@pytest.mark.parametrize(
    "tensors,message",
    [
        ({"2.up.weight": None}, "tensor 2.up.weight is missing"),
        (
            {"4.alpha": None, "4.norm_weight": None},
            "tensor 4.norm_weight is missing; tensor 4.alpha is missing",
        ),
        (
            {"2.up.weight": torch.zeros(3, 3, dtype=torch.float16)},
            "tensor 2.up.weight has shape [3, 3], not [96, 48]",
        ),
        ({"2.alpha": torch.zeros(1, dtype=torch.float16)}, "tensor 2.alpha has shape [1], not []"),
    ],
)
def test_adapter_files_with_missing_or_misshaped_tensors_are_clear_errors(llama, tmp_path, tensors, message):
    model = llama
    path = _file_like(tmp_path, model, "bad.safetensors", tensors=tensors)
    assert read_metadata(path)["depths"] == [2, 4]  # the metadata is fine; the tensors are not
    with pytest.raises(DexError, match=re.escape(message)):
        DexDecoder(model, depths=(2, 4, 6), adapters=path)


def test_foreign_safetensors_files_are_not_taken_for_adapters(llama, tmp_path):
    from safetensors.torch import save_file

    model = llama
    path = tmp_path / "weights.safetensors"
    save_file({"2.up.weight": torch.zeros(96, 48)}, str(path), metadata={"author": "someone else"})
    with pytest.raises(DexError, match="not a DEX adapter file"):
        DexDecoder(model, explorers=3, adapters=path)


def test_adapter_paths_are_checked_when_the_options_are_made(tmp_path):
    from dex_core import DecoderOptions, DexConfig

    with pytest.raises(DexError, match="no adapter file at"):
        DecoderOptions(adapters=tmp_path / "missing.safetensors")
    with pytest.raises(DexError, match="is a directory"):
        DexConfig(adapters=str(tmp_path))
    assert DecoderOptions(adapters=" none ").adapters == "none"


@pytest.mark.parametrize(
    "mapping",
    [
        {"2": InducingAdapter(48, 96)},
        {2.5: InducingAdapter(48, 96)},
        {True: InducingAdapter(48, 96)},
        {2: "not a module"},
    ],
)
def test_adapter_mappings_must_take_int_depths_to_modules(llama, mapping):
    with pytest.raises(DexError, match="takes layer depths"):
        DexDecoder(llama, depths=(2, 4, 6), adapters=mapping)


def test_the_adapter_files_best_set_for_k_is_used_unless_depths_are_given(tmp_path):
    from dex_core.model.adapter_choice import store_best_sets

    model = tiny_model("llama").float()
    path = tmp_path / "best.safetensors"
    save_adapters(path, new_adapters(model, [2, 4]), model, {"tokens": 0})
    assert DexDecoder(model, explorers=2, adapters=str(path)).depths == (3, 6)  # no best sets: uniform
    store_best_sets(path, model, {2: [4, 6], 3: [2, 4, 6]})
    decoder = DexDecoder(model, explorers=2, adapters=str(path))
    assert decoder.depths == (4, 6) and decoder.depth_choice == "best set stored with the adapters"
    assert sorted(decoder.adapters) == [4]
    trace = decoder.generate([3, 5, 7], 3).trace
    assert trace[0].depths == [4, 6] and "best set" in trace[0].depth_choice
    assert DexDecoder(model, explorers=2, depths=(3, 6), adapters=str(path)).depth_choice == "given"
    assert DexDecoder(model, explorers=4, adapters=str(path)).depth_choice == "uniform split"
    assert DexDecoder(model, explorers=2, adapters="none").depths == (3, 6)


def test_an_interrupted_training_saves_its_last_checkpoint_and_the_same_command_resumes(tmp_path):
    model = tiny_model("llama").float()
    data = [torch.randint(0, 96, (16,)) for _ in range(3)]

    def windows(stop_after):
        for i, x in enumerate(itertools.cycle(data)):
            if i == stop_after:
                raise KeyboardInterrupt
            yield x

    cfg = TrainConfig(depths=(2,), tokens=16 * 6, seq_len=16, batch=1, bf16=False, checkpoint_every=2)
    out, ckpt = tmp_path / "a.safetensors", tmp_path / "a.ckpt"
    facts = train_adapters(model, None, cfg, out, ckpt, progress=False, windows=windows(3))
    assert facts["stopped_early"] and facts["steps"] == 2 and facts["planned_steps"] == 6
    assert read_metadata(out)["training"]["steps"] == 2 and ckpt.is_file()
    facts = train_adapters(model, None, cfg, out, ckpt, progress=False, windows=windows(100))
    assert facts["steps"] == 6 and "stopped_early" not in facts


def test_named_depth_grids_resolve_on_the_models_layers_and_train_there(tmp_path):
    from dex_core.model.depth_grids import adapter_depths, parse_adapter_depths

    inner = (4, 5, 6, 8, 9, 10, 12, 13, 15, 18, 19, 20, 22, 23, 24, 25, 26, 27)  # of the splits for K = 2..8
    assert adapter_depths("uniform", 30) == inner
    assert adapter_depths("uniform:2-4", 30) == (8, 10, 15, 20, 23)  # the K = 2, 3, 4 splits' inner depths
    assert adapter_depths("all", 6) == (1, 2, 3, 4, 5) and adapter_depths("4,8", 30) == (4, 8)
    for bad, said in (("uniform:1-3", "K >= 2"), ("uniform:5-3", "range of K"), ("all:2-3", "no range")):
        with pytest.raises(DexError, match=said):
            parse_adapter_depths(bad)
    model = tiny_model("llama").float()  # 6 layers: K = 2 splits at 3, K = 3 at 2, 4 and K = 4 at 2, 3, 5
    cfg = TrainConfig(depths="uniform:2-4", tokens=16 * 2, seq_len=16, batch=1, bf16=False)
    out = tmp_path / "grid.safetensors"
    facts = train_adapters(model, None, cfg, out, progress=False, windows=itertools.cycle([torch.arange(16)]))
    assert facts["depths"] == (2, 3, 4, 5) and sorted(load_adapters(out, model)) == [2, 3, 4, 5]


def test_a_merged_file_keeps_each_depths_adapter_and_bottleneck_and_runs_exact(llama, tmp_path):
    from dex_core.model.adapter_choice import adapter_set, merge_adapters

    model = llama
    wide, narrow = new_adapters(model, [2, 4], bottleneck=16), new_adapters(model, [1, 2, 3], bottleneck=8)
    for d, a in [*wide.items(), *narrow.items()]:
        a.alpha.data.fill_(0.5 + d / 8 + a.up.out_features / 100)  # which file a depth came from is visible
    paths = [tmp_path / "wide.safetensors", tmp_path / "narrow.safetensors"]
    save_adapters(paths[0], wide, model, {"tokens": 1})
    save_adapters(paths[1], narrow, model, {"tokens": 2})
    out = tmp_path / "merged.safetensors"
    assert merge_adapters(out, paths, model) == {2: 0, 4: 0, 1: 1, 3: 1}
    meta = read_metadata(out)
    assert meta["bottlenecks"] == {1: 8, 2: 16, 3: 8, 4: 16}
    assert [p["depths"] for p in meta["training"]["merged"]] == [[2, 4], [1, 3]]
    loaded = load_adapters(out, model)
    assert {d: (a.up.out_features, round(float(a.alpha), 3)) for d, a in loaded.items()} == {
        1: (8, 0.705),
        2: (16, 0.91),
        3: (8, 0.955),
        4: (16, 1.16),
    }
    per_adapter = {m: 48 + 2 * 48 * m + m + 48 + 1 for m in (8, 16)}  # hidden 48: norm, W1, b1, W2, b2, alpha
    assert adapter_set(str(out), model, (1, 3, 6)).size == per_adapter[8]  # the widest adapter kept
    assert adapter_set(str(out), model, (2, 3, 6)).size == per_adapter[16]
    decoder = DexDecoder(model, depths=(1, 2, 3, 6), adapters=str(out), prune="none")
    assert decoder.generate([3, 5, 7], 12).tokens == ar_generate(model, [3, 5, 7], 12).tokens
    bad = _file_like(tmp_path, model, "bad", metadata={"bottlenecks": {"5": 8}})
    with pytest.raises(DexError, match=r"bottlenecks for depths \[5\], where it has no adapter"):
        read_metadata(bad)


def test_the_shipped_file_has_a_best_set_for_every_k_on_its_own_depths():
    """The default model's file (read from its header alone): a set for every K = 2..8, each of K stages ending at
    layer 30 whose inner depths all carry an adapter (a stage without one would explore through the plain lens)."""
    from dex_core.model.adapters import header

    meta = read_metadata(DEFAULT_ADAPTERS)
    best = {int(k): v for k, v in json.loads(header(DEFAULT_ADAPTERS)[0]["best_sets"]).items()}
    assert sorted(best) == list(range(2, 9))
    for K, depths in best.items():
        assert len(depths) == K and depths[-1] == 30 and set(depths[:-1]) <= set(meta["depths"]), (K, depths)
    assert {meta["bottlenecks"][d] for d in (9, 18, 27)} == {1152} and min(
        meta["bottlenecks"].values()
    ) == 288
