"""The OpenAI-compatible API (``dex_core.serving.api``) driven by the clients people evaluate and build with, each
against a real server on a tiny float64 model saved to a folder and loaded back: lm-evaluation-harness's
``local-completions`` gives the per-choice log-likelihoods, the accuracy and the generated answers its ``hf`` model
gives on the same weights (a multiple-choice and a generate-until task on local data, ``lm_eval_tasks/``);
LangChain's ``ChatOpenAI`` and LiteLLM get AR's text, whole and streamed, with the usage the tokenizer's counts
imply, and LangChain each answer token's log-probability. The ``clients`` extra installs them (``.ci/run`` does):
elsewhere a test whose client is missing is skipped, in CI it fails. Nothing is fetched: the hub is off and its
caches are in a temporary folder."""

import functools
import importlib
import operator
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
import yaml
from helpers import SERVED, in_ci, serving
from transformers import AutoModelForCausalLM, AutoTokenizer

from dex_core import DexDecoder, ar_generate
from dex_core.testing import tiny_tokenizer

TASKS = Path(__file__).parent / "lm_eval_tasks"
EOS = "w88"  # lm-eval's hf model asks the tokenizer for an EOS (the model itself has none: it never stops early)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ {'system': 'w79', 'user': 'w80', 'assistant': 'w81'}[m['role']] }} "
    "{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w81{% endif %}"
)
MESSAGES = [{"role": "system", "content": "the prime number"}, {"role": "user", "content": "hello world"}]
TOKENS = 12  # new tokens a chat request asks for


def client(module: str):
    """The client library ``module``, imported; the calling test skips where it is missing, except in CI, where
    that fails it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing = f"{module} is not installed: pip install -e '.[clients]' (.ci/run installs it)"
        if in_ci():
            pytest.fail(f"{missing}; CI is set, so the client tests must run, not skip", pytrace=False)
        pytest.skip(missing)


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """The hub off and the Hugging Face caches in a temporary folder for the module's tests (its ``datasets``
    cache the folder's ``datasets``); LiteLLM reads its bundled cost map instead of fetching one at import."""
    home = tmp_path_factory.mktemp("hf-home")
    with pytest.MonkeyPatch.context() as env:
        env.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, when it was imported
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("HF_DATASETS_OFFLINE", "1")
        env.setenv("HF_HOME", str(home))
        env.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
        env.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        yield home


@pytest.fixture(scope="module")
def folder(llama, tmp_path_factory):
    """The session's tiny float64 Llama saved with the tiny tokenizer, given an EOS and a chat template."""
    path = tmp_path_factory.mktemp("tiny-llama-float64")
    llama.save_pretrained(path)
    tokenizer = tiny_tokenizer()
    tokenizer.eos_token, tokenizer.chat_template = EOS, CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def loaded(folder):
    """The saved folder loaded back: (model, tokenizer)."""
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def served(loaded):
    """The API over the loaded model (K = 3), on a free local port: its base URL."""
    model, tokenizer = loaded
    with serving(DexDecoder(model, explorers=3, tokenizer=tokenizer), tokenizer, most_tokens=64) as url:
        yield url


@pytest.fixture(scope="module")
def chat_answer(loaded):
    """AR's answer to ``MESSAGES`` through the chat template as HF renders it: (prompt ids, new tokens, text)."""
    model, tokenizer = loaded
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    tokens = ar_generate(model, ids, TOKENS).tokens
    return ids, tokens, tokenizer.decode(tokens, skip_special_tokens=True)


def task_folder(path):
    """``lm_eval_tasks``' configs written into ``path`` with their data files' paths made absolute (lm-eval reads
    a relative one from the working directory)."""
    for config in TASKS.glob("*.yaml"):
        spec = yaml.safe_load(config.read_text())
        files = spec["dataset_kwargs"]["data_files"]
        spec["dataset_kwargs"]["data_files"] = {split: str(TASKS / name) for split, name in files.items()}
        (path / config.name).write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def evaluations(folder, served, offline, tmp_path_factory):
    """lm-eval's two tasks run by its ``hf`` model on the saved folder and by ``local-completions`` through the
    endpoint (token ids sent, 8 prompts a request): ``{"hf": results, "api": results}``, each with its samples."""
    lm_eval = client("lm_eval")
    import datasets
    from lm_eval.tasks import TaskManager

    configs = task_folder(tmp_path_factory.mktemp("tasks"))
    tasks = TaskManager(include_path=str(configs), include_defaults=False)
    endpoint = {
        "base_url": f"{served}/v1/completions",
        "model": SERVED,
        "tokenizer": folder,
        "tokenizer_backend": "huggingface",
        "tokenized_requests": True,
        "batch_size": 8,
        "max_length": 256,  # the model's positions
        "num_concurrent": 1,
        "max_retries": 1,
    }
    run = functools.partial(
        lm_eval.simple_evaluate, tasks=["dex_choice", "dex_answer"], task_manager=tasks, log_samples=True
    )
    with pytest.MonkeyPatch.context() as env:
        # datasets reads these when it is imported, which may have been before this module's environment
        env.setattr(datasets.config, "HF_DATASETS_CACHE", offline / "datasets")
        env.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        return {
            "hf": run(model="hf", model_args=f"pretrained={folder},dtype=float64,device=cpu"),
            "api": run(
                model="local-completions", model_args=",".join(f"{k}={v}" for k, v in endpoint.items())
            ),
        }


def paired(evaluations, task: str) -> list[tuple[dict, dict]]:
    """Each doc's sample from the ``hf`` run and from the endpoint's, in doc order."""
    hf, api = (
        sorted(evaluations[k]["samples"][task], key=operator.itemgetter("doc_id")) for k in ("hf", "api")
    )
    return list(zip(hf, api, strict=True))


def metric(evaluations, task: str, name: str) -> tuple[float, float]:
    return tuple(float(evaluations[k]["results"][task][f"{name},none"]) for k in ("hf", "api"))


def test_the_saved_float64_model_loads_back_as_it_was(llama, loaded):
    model, tokenizer = loaded
    assert model.dtype == torch.float64 and tokenizer.eos_token == EOS
    saved = llama.state_dict()
    assert model.state_dict().keys() == saved.keys()
    assert all(torch.equal(value, saved[name]) for name, value in model.state_dict().items())


def test_lm_eval_scores_every_choice_through_the_endpoint_as_its_hf_model_does(evaluations):
    pairs = paired(evaluations, "dex_choice")
    assert len(pairs) == 6
    for hf, api in pairs:
        # resps: one [(log-likelihood, greedy)] a choice
        assert [r[0][0] for r in api["resps"]] == pytest.approx([r[0][0] for r in hf["resps"]], abs=1e-6)
        assert [r[0][1] for r in api["resps"]] == [r[0][1] for r in hf["resps"]]
    # a choice the model would say: its greedy flag is compared too
    assert any(r[0][1] for hf, _ in pairs for r in hf["resps"])
    hf_acc, api_acc = metric(evaluations, "dex_choice", "acc")
    assert hf_acc == api_acc and 0 < hf_acc < 1


def test_lm_eval_generates_through_the_endpoint_the_answers_its_hf_model_generates(evaluations):
    pairs = paired(evaluations, "dex_answer")
    assert len(pairs) == 4
    assert [api["resps"] for _, api in pairs] == [hf["resps"] for hf, _ in pairs]
    assert all(hf["resps"][0][0] for hf, _ in pairs)  # each made some text
    hf_match, api_match = metric(evaluations, "dex_answer", "exact_match")
    assert hf_match == api_match == 0.5


def langchain_chat(url: str, **options):
    """LangChain's ``ChatOpenAI`` on the served model, greedy, ``TOKENS`` new tokens at most."""
    chat_openai = client("langchain_openai").ChatOpenAI
    return chat_openai(
        base_url=f"{url}/v1",
        api_key="unused",
        model=SERVED,
        temperature=0,
        max_tokens=TOKENS,
        max_retries=0,
        timeout=60,
        **options,
    )


def test_langchain_streams_ars_text_with_the_usage_the_tokenizer_counts(served, chat_answer):
    ids, tokens, text = chat_answer
    chat = langchain_chat(served, stream_usage=True)
    streamed = functools.reduce(operator.add, chat.stream(MESSAGES))
    assert streamed.content == text
    assert streamed.usage_metadata["input_tokens"] == len(ids)
    assert streamed.usage_metadata["output_tokens"] == len(tokens) == TOKENS
    assert streamed.usage_metadata["total_tokens"] == len(ids) + len(tokens)
    assert chat.invoke(MESSAGES).content == text


def test_langchain_reads_each_answer_tokens_log_probability_whole_and_streamed(served, loaded, chat_answer):
    model, tokenizer = loaded
    ids, tokens, _ = chat_answer
    with torch.no_grad():  # the model's log-softmax before each of AR's tokens, teacher-forced
        scores = torch.log_softmax(model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1 : -1], dim=-1)
    expected = scores.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    chat = langchain_chat(served, logprobs=True, top_logprobs=2)
    for reply in (chat.invoke(MESSAGES), functools.reduce(operator.add, chat.stream(MESSAGES))):
        entries = reply.response_metadata["logprobs"]["content"]
        assert [e["token"] for e in entries] == [tokenizer.decode([t]) for t in tokens]
        assert [e["logprob"] for e in entries] == pytest.approx(expected, abs=1e-6)
        assert all(e["top_logprobs"][0]["logprob"] == e["logprob"] for e in entries)  # greedy: the likeliest


def test_litellm_gets_ars_text_whole_and_streamed_with_its_usage(served, chat_answer, offline):
    litellm = client("litellm")
    ids, tokens, text = chat_answer
    ask = functools.partial(
        litellm.completion,
        model=f"openai/{SERVED}",
        api_base=f"{served}/v1",
        api_key="unused",
        messages=MESSAGES,
        max_tokens=TOKENS,
        temperature=0,
    )
    whole = ask()
    assert whole.choices[0].message.content == text
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids), len(tokens))
    chunks = list(ask(stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (len(ids), len(tokens))
