"""The trace: the event records every run yields, their documented schema and the validator of saved traces. The
only interface between ``dex_core`` and the viewers."""
