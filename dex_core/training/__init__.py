"""Training: inducing adapters trained by self-distillation. What a step computes (``distill``: a stage's layers
over windows, the single teacher, a depth's loss); the text it reads (``data``); training in one process
(``train``: ``dex train-adapters``'s config and loop); on the explorers' layout, one stage a rank (``stage``: the job
and one rank's stage, ``pipeline``: micro-batches down the stages and teachers back, ``ranks``: a rank's whole run
and torchrun's launch, ``group``: the ranks this process starts, the CLI's three backends); and what a training
rank holds before it runs (``plan``: ``dex plan --train``).

May import the distributed runtime, the facade, ``analysis`` and everything below them; never ``serving`` or
``evaluation``."""
