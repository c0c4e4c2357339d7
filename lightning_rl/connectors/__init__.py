"""Learner connector pieces: episodes in, a train batch ``{module_id: {column: Tensor}}`` out."""
