"""Tests of the completion scorer, response trees, the vLLM client and the scoring hooks."""
