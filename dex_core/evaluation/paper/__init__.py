"""``dex paper``: the paper's evaluation run on one model (``paper``), what the paper claims beside what the run
shows (``claims``), and its Appendix B: Table 1's profile and the walltime model (``walltime``)."""
