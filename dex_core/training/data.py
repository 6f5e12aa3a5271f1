"""The text adapter training reads: packed token windows of ShareGPT's training split (the first user/assistant
exchange, chat template), with ShareGPT's own answers (``sharegpt``) or the model's own greedy answers to the same
prompts (``onpolicy``). ``training_windows`` is the stream a run reads from its start, or from where a resumed run
left off: the same windows an uninterrupted run reads (ShareGPT; an on-policy stream is drawn afresh, with a seed
moved by the steps done, since replaying it would mean generating its answers again).
"""

from __future__ import annotations

import itertools
import random

import torch

from ..data.sets import sharegpt_split
from ..runtime.request import chat_ids, eos_ids

DATA_SOURCES = ("sharegpt", "onpolicy")
ONPOLICY_PROMPT_CHARS = 600  # user text kept per on-policy prompt: the answer is what is trained on
ONPOLICY_BATCH = 64  # prompts answered per batched greedy generate call


def _pack(sequences, seq_len: int):
    buffer: list[int] = []
    for ids in sequences:
        buffer.extend(ids[: 4 * seq_len])
        while len(buffer) >= seq_len:
            # host data: the training loop moves each batch
            yield torch.tensor(buffer[:seq_len], device="cpu")
            buffer = buffer[seq_len:]


def _shuffled_rows(seed: int, split: str = "train"):
    rows = sharegpt_split(split)
    rng = random.Random(seed)
    while True:
        rng.shuffle(rows)
        yield from rows


def token_windows(
    tokenizer, seq_len: int, seed: int, model=None, data: str = "sharegpt", split: str = "train"
):
    """Endless (seq_len,) windows of the chat-formatted training split (``split='heldout'``: the 2% never
    trained on, for evaluation), packed back to back.

    ``data="onpolicy"`` replaces each human answer by the model's own greedy answer (float32, batched
    generate with left padding, up to ``seq_len`` new tokens) to the prompt's first 600 characters.
    """
    rows = _shuffled_rows(seed, split)
    if data == "sharegpt":
        return _pack(
            (
                chat_ids(
                    tokenizer,
                    [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["answer"]}],
                )
                for r in rows
            ),
            seq_len,
        )
    return _pack(_onpolicy_sequences(model, tokenizer, rows, seq_len), seq_len)


@torch.no_grad()
def _onpolicy_sequences(model, tokenizer, rows, max_new_tokens: int):
    eos = next(iter(eos_ids(model)), None)
    pad = next((t for t in (tokenizer.pad_token_id, eos) if t is not None), 0)
    while True:
        prompts = [
            chat_ids(
                tokenizer,
                [{"role": "user", "content": next(rows)["prompt"][:ONPOLICY_PROMPT_CHARS]}],
                generation_prompt=True,
            )
            for _ in range(ONPOLICY_BATCH)
        ]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        out = model.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad
        )
        for prompt, row in zip(prompts, out[:, width:].tolist()):
            answer = row[: row.index(eos) + 1] if eos in row else row
            yield prompt + answer


def training_windows(tokenizer, seq_len: int, seed: int, data: str, done: int, step: int, model=None):
    """The windows of a run that has read ``done`` windows in ``step`` optimizer steps: ShareGPT's stream of
    ``seed`` past its first ``done`` windows (what an uninterrupted run reads next), or a fresh on-policy stream of
    seed ``seed + step``."""
    if data == "onpolicy":
        return token_windows(tokenizer, seq_len, seed + step, model, data)
    return itertools.islice(token_windows(tokenizer, seq_len, seed, model, data), done, None)
