"""Per-turn scoring on vLLM: completion detection (end tag, exact P(end)) and response trees.

``hooks.ScoringHooks`` is the entry point the stream wires in (a ``ConversationHooks``: the live
policy of sampling, budgets, debounce and errors); ``scorers.Scorers`` builds what it scores with
(and what offline tools score with directly); ``client.VllmClient`` talks to vLLM; ``completion``,
``tree`` and ``prompts`` hold the method.
"""
