"""The algorithm: the depth x position lattice and its FSM, draft chains, the sampling rules. Pure bookkeeping
and maths on tensors: no model, no files, no processes."""
