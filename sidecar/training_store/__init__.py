"""The training store: finished conversations, per agent, for ``adapters onboard`` to learn from."""
