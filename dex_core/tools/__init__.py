"""The tools: dex bench and its report (``bench``), the baselines DEX is measured against (``baselines``), dex paper
(``paper``), per-token certificates (``verify``: dex verify), adapter training (``train``) and dex plan (``plan``).
The analysis they share with the app, EAD and the profile, is the layer below: ``dex_core.analysis``."""
