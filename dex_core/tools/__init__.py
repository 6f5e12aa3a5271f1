"""The tools: dex bench and its report, the depth-selection baselines, readiness (EAD), the seconds profile,
per-token certificates (dex verify), adapter training and dex plan."""
