"""Per-turn scoring on vLLM: completion detection (end tag, exact P(end)) and response trees.

``hooks.ScoringHooks`` is the entry point the stream wires in (a ``ConversationHooks``);
``client.VllmClient`` talks to vLLM; ``completion``, ``tree`` and ``prompts`` hold the method.
"""
