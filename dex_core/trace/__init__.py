"""The trace: the events every run yields, each declared once (``events``, with their JSON Schemas: ``schema``), how
a run builds them (``build``), the validator of saved traces (``validate``) and trace files (``files``). Torch-free:
the only interface between ``dex_core`` and the viewers."""
