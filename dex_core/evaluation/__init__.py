"""Evaluation: DEX measured and checked. ``dex bench`` and its report (``bench``), the methods it is measured
against (``baselines``), the paper's evaluation (``paper``: ``dex paper``) and per-token certificates against the
unmodified model (``verify``: ``dex verify`` and bench's ``certified`` column). ``verify`` lives here, not beside
the decoder, because it judges a finished run (its trace) by another forward of the model, as bench does every
method; nothing a decode runs calls it.

May import ``analysis``, the facade and everything below them; never ``serving`` or ``training``."""
