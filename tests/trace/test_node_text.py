"""Node text on request: with a tokenizer a trace holds the committed tokens' text; every lattice node's and top
candidate's only for a consumer that asks (``stream(..., node_text=True)``: the app's Live, ``dex generate
--trace``)."""

from dex_core import DexDecoder
from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import RoundEvent


def test_nodes_get_text_only_when_asked_and_commits_always():
    model, tok = tiny_model("llama"), tiny_tokenizer()
    decoder = DexDecoder(model, tokenizer=tok, explorers=3, prune="none", trace_top=2)
    prompt = tok.encode("hello world the prime number")
    plain, asked = (
        [e for e in decoder.stream(prompt, 12, node_text=text) if isinstance(e, RoundEvent)]
        for text in (False, True)
    )
    commits = [c for e in plain for c in e.commits]
    assert len(commits) == 12 and all(c.text == tok.decode([c.token]) for c in commits)
    assert all(n.text is None and all(len(t) == 2 for t in n.top) for e in plain for n in e.nodes)
    nodes = [n for e in asked for n in e.nodes]
    assert nodes and all(n.text == tok.decode([n.token]) for n in nodes)
    assert all(t[2] == tok.decode([t[0]]) for n in nodes for t in n.top)
    assert [c.token for e in asked for c in e.commits] == [c.token for c in commits]
