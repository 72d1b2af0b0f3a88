"""The one OpenAI-compatible endpoint layer: config, error classification, breaker, retry, client.

Scoring (:mod:`sidecar.scoring.client`), the judge and the simulator's agents
(:mod:`sidecar.judge.chat`) and goal clustering (:mod:`sidecar.clustering.llm`) all reach their
model through :class:`~sidecar.llm.endpoint.LlmEndpoint`; no other module builds an ``openai``
client, a breaker or a retry loop (``tests/architecture/test_one_llm_layer.py`` checks it).

* :mod:`sidecar.llm.config`: :class:`LlmEndpointConfig`, which each section's endpoint config
  extends, and :class:`ChatEndpointConfig`.
* :mod:`sidecar.llm.errors`: :func:`classify` (retryable vs permanent) and the two error types.
* :mod:`sidecar.llm.breaker`: :class:`CircuitBreaker`.
* :mod:`sidecar.llm.endpoint`: :func:`openai_client` and :class:`LlmEndpoint` (the bounded retry,
  waiting by :func:`sidecar.retry.backoff_delay`, the sidecar's one jitter policy).

Import the submodules: the config sections import :mod:`sidecar.llm.config` alone, without the SDK.
"""
