"""dex verify: every committed token is the unmodified model's choice or a near-tie of it, per token."""

import json
import re
import shutil
from dataclasses import replace

import huggingface_hub
import pytest
import torch

from dex_core import DexDecoder, DexError, save_trace
from dex_core.algorithm.sampling import Sampler, tie_gap
from dex_core.cli import main
from dex_core.config import GenerationOptions
from dex_core.evaluation import verify
from dex_core.evaluation.verify import Certificate, certify_tokens, verify_trace
from dex_core.runtime.reference import ar_generate, hf_greedy
from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import RoundEvent

PROMPT = [4, 8, 15, 16, 23, 42]
SAMPLED = {"temperature": 0.8, "top_k": 20, "seed": 4}


def _checks_agree_with_the_run(cert: Certificate, tokens: list[int]) -> None:
    assert cert.total == cert.certified == len(tokens) and cert.ok and cert.worst_gap == 0.0
    assert [c.token for c in cert.checks] == [c.top for c in cert.checks] == tokens
    assert [c.position for c in cert.checks] == list(range(len(PROMPT), len(PROMPT) + len(tokens)))
    assert (
        cert.summary() == f"certified: {len(tokens)} of {len(tokens)} tokens within the tie gap (worst gap 0)"
    )


@pytest.mark.parametrize("sampling", [{}, SAMPLED], ids=["greedy", "sampled"])
def test_dex_and_ar_traces_certify_every_token(llama, sampling):
    dex = DexDecoder(llama, explorers=3, prune="none").generate(PROMPT, 24, **sampling)
    _checks_agree_with_the_run(verify_trace(dex.trace, model=llama), dex.tokens)
    ar = ar_generate(llama, PROMPT, 24, **sampling)
    assert ar.trace[0].method == "ar"
    _checks_agree_with_the_run(verify_trace(ar.trace, model=llama), ar.tokens)
    assert ar.tokens == dex.tokens


def test_a_wrong_token_has_the_models_logit_gap_and_taints_nothing_before_it(llama):
    tokens = hf_greedy(llama, PROMPT, 12)
    bad = tokens[:5] + [(tokens[5] + 1) % 96] + tokens[6:]
    cert = certify_tokens(llama, PROMPT, bad)
    with torch.no_grad():
        logits = llama(torch.tensor([PROMPT + bad[:5]])).logits[0, -1]
    first = cert.uncertified[0]
    assert (first.index, first.position, first.token, first.top) == (5, len(PROMPT) + 5, bad[5], tokens[5])
    assert (
        first.gap == pytest.approx(float(logits.max() - logits[bad[5]]), rel=1e-12)
        and first.gap > first.tie_gap
    )
    assert all(c.certified for c in cert.checks[:5]) and cert.worst_gap >= first.gap


def test_a_bfloat16_near_tie_is_certified_and_a_real_miss_is_not():
    model = tiny_model("llama").to(torch.bfloat16)
    tokens = hf_greedy(model, PROMPT, 40)

    def last_row(i):  # the logits certify_tokens sees for token i: the forward over prompt + tokens[:i]
        with torch.no_grad():
            return model(torch.tensor([PROMPT + tokens[:i]])).logits[0, -1].float()

    rows = [last_row(i) for i in range(40)]
    best = [r.topk(2) for r in rows]
    ties = [
        i
        for i, b in enumerate(best)
        if 0 < b.values[0] - b.values[1] <= tie_gap(torch.bfloat16, rows[i].max())
    ]
    assert ties, "this seed's bfloat16 model has near-ties among its first 40 tokens"
    i = ties[0]
    (top, runner_up), margin = best[i].indices.tolist(), float(best[i].values[0] - best[i].values[1])
    cert = certify_tokens(model, PROMPT, tokens[:i] + [runner_up])
    assert cert.dtype == "bfloat16" and cert.ok and cert.total == i + 1
    assert cert.worst_gap == margin > 0 and cert.checks[-1].top == top
    assert cert.checks[-1].tie_gap == tie_gap(torch.bfloat16, rows[i].max())
    far = int(rows[i].argmin())
    assert not certify_tokens(model, PROMPT, tokens[:i] + [far]).ok


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_dex_commits_only_certified_tokens_and_records_each_margin(dtype):
    model = tiny_model("llama", layers=6, vocab=96, seed=2).to(dtype)
    dex = DexDecoder(model, explorers=3, trace_top=3)
    result = dex.generate(PROMPT, 32)
    commits = [c for e in result.trace if isinstance(e, RoundEvent) for c in e.commits]
    assert [c.token for c in commits] == result.tokens and len(commits) == 32
    assert all(c.margin >= 0 and c.near_tie == (c.margin <= c.tie_gap) for c in commits)
    nodes = [n for e in result.trace if isinstance(e, RoundEvent) for n in e.nodes]
    assert all(0 <= p <= 1 for n in nodes for _, p, *_ in n.top)  # masks in reduced precision: no NaN
    cert = verify_trace(result.trace, model=model)
    assert cert.dtype == str(dtype).removeprefix("torch.") and cert.ok and cert.total == 32
    # a commit the engine called clear (margin beyond the gap) is the teacher-forced model's own choice
    clear = [c.index for c in commits if not c.near_tie]
    assert clear and all(cert.checks[i].token == cert.checks[i].top for i in clear)


def test_a_token_at_the_edge_of_the_top_p_nucleus_is_a_near_tie_and_one_far_outside_is_not():
    model = tiny_model("llama").to(torch.bfloat16)
    tokens = hf_greedy(model, PROMPT, 8)
    position = len(PROMPT) + len(tokens) - 1  # certify the last token under designed options
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + tokens[:-1]])).logits[0, -1].float()
    probs, order = torch.softmax(logits, -1).sort(descending=True)
    edge = int(order[5])  # the nucleus that ends exactly before it leaves it out: top_p = its mass before
    top_p = float(probs[:5].sum())
    for seed in range(500):  # a seed whose noise makes the edge token the draw once it is admitted
        sampler = Sampler(96, 1.0, None, None, seed)
        noisy = logits + sampler.noise([position], logits[None])[0]
        if int(noisy[order[:6]].argmax()) == 5:
            break
    options = GenerationOptions(temperature=1.0, top_p=top_p, seed=seed)
    filtered = Sampler(96, 1.0, None, top_p, seed).scores(logits[None], final=True)[0]
    assert torch.isinf(filtered[edge])  # the plain filter drops it: only the edge rule can certify it
    check = certify_tokens(model, PROMPT, tokens[:-1] + [edge], options).checks[-1]
    assert check.certified and check.gap <= check.tie_gap
    far = int(order[-1])
    far_check = certify_tokens(model, PROMPT, tokens[:-1] + [far], options).checks[-1]
    assert not far_check.certified and far_check.gap == float("inf")


def test_tie_gap_is_four_units_in_the_last_place_and_scales_with_the_dtype():
    gaps = [tie_gap(d, 20.0) for d in (torch.bfloat16, torch.float16, torch.float32, torch.float64)]
    assert gaps == [0.5, 0.0625, 2.0**-17, 2.0**-46]  # 4 x eps x 16 at magnitude 20
    assert tie_gap(torch.bfloat16, -20.0) == 0.5 and tie_gap(torch.bfloat16, 40.0) == 1.0
    assert tie_gap(torch.bfloat16, 20.0, temperature=0.5) == 1.0
    assert tie_gap(torch.float32, torch.tensor([1.0, 3.0])).tolist() == [2.0**-21, 2.0**-20]


def test_sampled_traces_verify_only_on_the_device_type_they_were_made_on(llama):
    events = DexDecoder(llama, explorers=2).generate(PROMPT, 6, **SAMPLED).trace
    moved = [replace(events[0], device="cuda:0")] + events[1:]
    with pytest.raises(DexError, match="made on cuda.*verify it on cuda"):
        verify_trace(moved, model=llama)
    greedy = DexDecoder(llama, explorers=2).generate(PROMPT, 6).trace
    anywhere = [replace(greedy[0], device="cuda:0")] + greedy[1:]
    assert verify_trace(anywhere, model=llama).ok  # greedy: any device
    with pytest.raises(DexError, match="made in bfloat16 but the model given is float64"):
        verify_trace([replace(greedy[0], dtype="bfloat16")] + greedy[1:], model=llama)


def _verify(capsys, *argv):
    code = main(["verify", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out.strip().splitlines(), err


def test_dex_verify_passes_a_real_trace_and_fails_a_corrupted_one(tiny_dir, tmp_path, capsys):
    path = tmp_path / "t.json"
    assert (
        main(
            [
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
                str(path),
            ]
        )
        == 0
    )
    capsys.readouterr()
    code, lines, err = _verify(capsys, path)
    assert code == 0, err
    assert lines[-1] == "certified: 12 of 12 tokens within the tie gap (worst gap 0)" and len(lines) == 2
    assert lines[0].startswith("dex trace, greedy; float32 on cpu")
    doc = json.loads(path.read_text())
    commits = [c for e in doc["events"] if e["event"] == "round" for c in e["commits"]]
    for e in doc["events"]:  # read from JSON, "commit" is a copy of "commits"[0]: one record to corrupt
        if e["event"] == "round" and e["commit"]:
            e["commit"] = e["commits"][0]
    old = commits[4]["token"]
    new = (old + 1) % 96
    commits[4]["token"] = doc["events"][-1]["tokens"][4] = new
    path.write_text(json.dumps(doc))
    code, lines, err = _verify(capsys, path, "--model", tiny_dir, "--device", "cpu")
    assert code == 1, err
    word = lambda t: repr(tiny_tokenizer().decode([t]))  # noqa: E731
    assert lines[0].startswith(
        f"token 4 (position {commits[4]['position']}): {new} {word(new)} is not the model's "
        f"choice {old} {word(old)}: gap "
    )
    last = lines[-1]
    assert (
        last.startswith("certified: ") and last.endswith(")") and " of 12 tokens within the tie gap" in last
    )
    assert int(last.split()[1]) < 12 and float(last.split("worst gap ")[1][:-1]) > 0


def test_dex_verify_refuses_bad_input_with_exit_2(llama, tiny_dir, tmp_path, capsys):
    trace = DexDecoder(llama, explorers=2).generate(PROMPT, 4).trace
    save_trace(tmp_path / "nameless.json", trace)
    (tmp_path / "foreign.json").write_text('{"x": 1}')
    end = trace[-1]
    split = [*trace[:-1], replace(end, tokens=end.tokens[:2] + [(t + 1) % 96 for t in end.tokens[2:]])]
    save_trace(tmp_path / "split.json", split, {"model": str(tiny_dir)})
    for name, message in [
        ("missing.json", "cannot read the trace file"),
        ("foreign.json", "not a DEX trace"),
        ("nameless.json", "does not name its model"),
        ("split.json", "contradicts itself"),
    ]:
        code, lines, err = _verify(capsys, tmp_path / name)
        assert code == 2 and message in err and err.count("dex: error:") == 1 and "Traceback" not in err


def test_a_token_outside_the_models_vocabulary_is_named_as_the_cause(llama):
    trace = DexDecoder(llama, explorers=2).generate(PROMPT, 6).trace
    edited = [
        replace(e, commits=[replace(c, token=96) if c.index == 2 else c for c in e.commits])
        if isinstance(e, RoundEvent)
        else e
        for e in trace
    ]
    edited[-1] = replace(edited[-1], tokens=[96 if i == 2 else t for i, t in enumerate(edited[-1].tokens)])
    outside = "is outside the model's vocabulary of 96 (ids 0 to 95): the trace was made with another model"
    with pytest.raises(DexError, match=re.escape(f"token id 96 (committed token 2) {outside}")):
        verify_trace(edited, model=llama)
    edited[0] = replace(edited[0], prompt=[*PROMPT[:3], 200, *PROMPT[4:]])
    with pytest.raises(DexError, match=re.escape(f"token id 200 (prompt token 3) {outside}")):
        verify_trace(edited, model=llama)


def _hub_cache(tiny_dir, root, repo: str):
    """``root`` as a Hugging Face cache holding ``tiny_dir`` as hub model ``repo`` (its layout: refs, snapshots)."""
    folder = root / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    shutil.copytree(tiny_dir, folder / "snapshots" / commit)


def test_dex_verify_fetches_no_model_that_is_not_present_locally_unless_allowed(
    llama, tiny_dir, tmp_path, capsys, monkeypatch
):
    loads = []

    def load_model(spec, **kwargs):  # stands in for the loader: records the call, downloads nothing
        loads.append((spec, kwargs["local_files_only"]))
        raise DexError("no network in the tests")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    trace = DexDecoder(llama, explorers=2).generate(PROMPT, 4).trace
    save_trace(tmp_path / "stranger.json", trace, {"model": "no-such-org/no-such-model"})
    with monkeypatch.context() as m:
        m.setattr(verify, "load_model", load_model)
        code, _, err = _verify(capsys, tmp_path / "stranger.json")
        assert code == 2 and not loads and err.count("dex: error:") == 1
        assert err.strip() == (
            "dex: error: model 'no-such-org/no-such-model', which the trace names, is not present locally: not "
            f"in the local Hugging Face cache ({tmp_path / 'hub'}). dex verify downloads a model only when "
            "asked, since a trace can name any model: pass --allow-download (allow_download=True) to fetch it, "
            "or --model with a local copy"
        )
        with pytest.raises(DexError, match="which the trace names, is not present locally"):
            verify_trace(tmp_path / "stranger.json")  # the library's default too
        assert not loads
        code, _, err = _verify(capsys, tmp_path / "stranger.json", "--allow-download")
        assert code == 2 and "no network in the tests" in err
        assert loads == [("no-such-org/no-such-model", False)]
    # a hub model the cache holds needs no flag, and its load asks the hub nothing
    _hub_cache(tiny_dir, tmp_path / "hub", "tiny-org/tiny")
    for name in ("model_info", "repo_info"):
        monkeypatch.setattr(huggingface_hub.HfApi, name, lambda *a, **k: pytest.fail("asked the hub"))
    save_trace(tmp_path / "cached.json", trace, {"model": "tiny-org/tiny"})
    code, lines, err = _verify(capsys, tmp_path / "cached.json")
    assert code == 0, err
    assert lines[-1] == "certified: 4 of 4 tokens within the tie gap (worst gap 0)"


def _embedding_sum(model) -> float:
    """The embedding fingerprint a trace records: the first 64 x 64 entries' absolute sum."""
    return float(model.get_input_embeddings().weight.detach()[:64, :64].abs().sum())


def _fingerprint(model) -> str:
    return f"{_embedding_sum(model):.4f}"  # as a refusal prints it


def test_dex_verify_refuses_a_trace_made_by_another_model_in_one_line_naming_both(tiny_dir, tmp_path, capsys):
    made, other = tiny_model("llama"), tiny_model("llama", seed=1)  # one shape, other weights
    other.save_pretrained(tmp_path / "other")
    tiny_tokenizer().save_pretrained(tmp_path / "other")
    capsys.readouterr()  # the save's progress bar
    trace = DexDecoder(made, explorers=2).generate(PROMPT, 6).trace
    assert trace[0].model == {
        "model_type": "llama",
        "num_layers": 6,
        "hidden_size": 48,
        "vocab_size": 96,
        "fingerprint": pytest.approx(_embedding_sum(made), rel=1e-12),
    }
    save_trace(tmp_path / "t.json", trace, {"model": str(tiny_dir)})
    code, out, err = _verify(capsys, tmp_path / "t.json", "--model", tmp_path / "other")
    shape = "llama, 6 layers, hidden 48, vocabulary 96, embedding fingerprint"
    assert code == 2 and out == [] and err.count("\n") == 2  # the load's progress line, then the refusal
    assert err.splitlines()[-1] == (
        f"dex: error: the trace was made by another model: {str(tiny_dir)!r} ({shape} {_fingerprint(made)}), "
        f"not {str(tmp_path / 'other')!r} ({shape} {_fingerprint(other)}); verify it with the model that made "
        f"it (--model {tiny_dir})"
    )
    save_trace(
        tmp_path / "renamed.json", trace, {"model": str(tmp_path / "other")}
    )  # the name is the other's
    code, _, err = _verify(capsys, tmp_path / "renamed.json")
    assert code == 2 and f"{str(tmp_path / 'other')!r} as it loads now ({shape} {_fingerprint(other)})" in err
    with pytest.raises(
        DexError,
        match=re.escape(
            "made by another model: a model (llama, 6 layers, hidden 48, vocabulary 96), not the model given "
            "(qwen3, 6 layers, hidden 48, vocabulary 96); verify it with the model that made it (--model)"
        ),
    ):
        verify_trace(trace, model=tiny_model("qwen3"))


def test_an_older_trace_without_the_models_identity_verifies_and_is_checked_by_its_layers(llama, tmp_path):
    trace = DexDecoder(llama, explorers=2).generate(PROMPT, 6).trace
    old = [replace(trace[0], model=None), *trace[1:]]  # sparse: its record has no "model" key
    save_trace(tmp_path / "old.json", old)
    assert verify_trace(tmp_path / "old.json", model=llama).certified == 6
    with pytest.raises(
        DexError,
        match=re.escape(
            "a model (6 layers), not the model given (llama, 4 layers, hidden 48, vocabulary 96)"
        ),
    ):
        verify_trace(tmp_path / "old.json", model=tiny_model("llama", layers=4))
