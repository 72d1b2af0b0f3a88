"""Promotion, refusal and rollback of agents' adapters, live on every replica (docs/adapter-loop.md)."""
