"""The analysis the app and the rooms share, above the facade and below the rooms: EAD readiness (what each
layer already predicts, the rounds and cost a set of depths is expected to take, the best sets: ``ead``), one
answer analysed (``answer``), this machine's measured seconds profile (``profile``), how long a run takes here
(``forecast``), a run's cost per token read from its trace (``run_cost``), the links timed (``collectives``) and
whether a model fits its explorers' devices (``plan``: ``dex plan``; its ``--train`` table is training's)."""
