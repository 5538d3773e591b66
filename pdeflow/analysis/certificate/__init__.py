"""Proofs about S at a point: the Cholesky and dense lower bounds that certify a local minimum."""
