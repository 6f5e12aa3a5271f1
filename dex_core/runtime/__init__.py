"""The runtime: the round loop (the paper's Algorithm 1), a run's settings resolved once, requests, results, the
clock, the in-process link, the AR reference and the terminal's view of a run."""
