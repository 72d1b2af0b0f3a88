"""LLM-free goal names: c-TF-IDF against the other clusters, phrases, the K-distinct rule, hostile text."""

from __future__ import annotations

import random
import time

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.clustering.algorithm import llm_guided_clustering
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.llm import ClusterNamer, ExtractiveGoalLLM
from sidecar.clustering.model import metric_label
from sidecar.clustering.naming import NO_NAME, goal_name, name_clusters, stem
from tests.clustering.fakes import HashEmbedder

FLIGHTS = [f"Hi, I want to book a flight to city{i} on the {i}th, please" for i in range(12)]
TRAINS = [f"I need a train ticket from town{i} to town{i + 1}" for i in range(12)]
HOTELS = [f"looking for a hotel with free parking for {i} nights" for i in range(12)]


def test_each_cluster_is_named_by_what_sets_it_apart() -> None:
    names = name_clusters([FLIGHTS, TRAINS, HOTELS], min_df=5)
    assert names == ["book flight", "train ticket", "free parking and hotel"]


def test_a_word_every_cluster_uses_never_names_one() -> None:
    groups = [[f"{t} in cambridge" for t in g] for g in (FLIGHTS, TRAINS, HOTELS)]
    assert not any("cambridge" in n for n in name_clusters(groups, min_df=5))


def test_filler_and_stop_words_never_name_a_cluster() -> None:
    polite = [f"hi hello please could you help me, I want and need it, thanks {i}" for i in range(20)]
    assert name_clusters([polite, TRAINS], min_df=5)[0] == NO_NAME
    assert goal_name(polite, TRAINS, min_df=5) == NO_NAME


def test_a_term_needs_min_df_distinct_summaries() -> None:
    # "refund" in 4 distinct summaries: one short of the floor, however typical it is.
    group = [f"refund for order{i}" for i in range(4)] + [f"parcel lost number{i}" for i in range(5)]
    assert goal_name(group, TRAINS, min_df=5) == "parcel lost"
    group.append("refund please for order99")
    assert "refund" in goal_name(group, TRAINS, min_df=5)


def test_one_users_words_pasted_many_times_count_once() -> None:
    pasted = ["Zedson Quarkwell account 55512 wants a callback"] * 40
    assert goal_name(pasted, TRAINS, min_df=2) == NO_NAME
    # The same text with only spacing or case changed is still one summary.
    variants = ["zedson  quarkwell account callback", "ZEDSON QUARKWELL ACCOUNT CALLBACK"] * 10
    assert goal_name(variants, TRAINS, min_df=2) == NO_NAME


def test_a_users_own_name_and_numbers_never_become_a_name() -> None:
    group = [f"book a flight to city{i} for Alice{i}" for i in range(8)] + ["flight for Zed Zedson"]
    name = goal_name(group, ["rent a car", "order a pizza"], min_df=5)
    assert "flight" in name
    assert "zedson" not in name and "alice" not in name and "city" not in name


def test_places_and_people_written_like_names_are_not_goals() -> None:
    group = [f"I need directions from Murray Avenue to Forbes street {i} quickly" for i in range(10)]
    group += [f"directions to the station from stop {i}" for i in range(6)]
    name = goal_name(group, TRAINS, min_df=5)
    assert "directions" in name
    assert "murray" not in name and "forbes" not in name
    # Capitals in Title Case or SHOUTING mark nothing: those words still count.
    shouting = [f"I NEED A REFUND FOR ORDER {i}" for i in range(6)]
    assert "refund" in goal_name(shouting, TRAINS, min_df=5)


def test_phrases_skip_articles_but_not_punctuation() -> None:
    tables = [f"book a table for {i} people at seven" for i in range(6)]
    assert goal_name(tables, TRAINS, min_df=5).startswith("book table")
    split = [f"I will book. Table {i} was wrong" for i in range(6)]
    assert "book table" not in goal_name(split, TRAINS, min_df=5)


def test_plurals_are_one_term_and_never_repeated() -> None:
    group = [f"flights to city{i}" for i in range(5)] + [f"a flight to town{i}" for i in range(5)]
    name = goal_name(group, TRAINS, min_df=6)  # neither spelling alone reaches 6
    assert name in {"flight", "flights"}
    assert stem("flights") == stem("flight") and stem("taxes") == "tax" and stem("bus") == "bus"


def test_empty_and_degenerate_input() -> None:
    assert name_clusters([], min_df=5) == []
    assert name_clusters([[]], min_df=5) == [NO_NAME]
    assert name_clusters([[], FLIGHTS], min_df=5) == [NO_NAME, "book flight"]
    assert goal_name([], [], min_df=5) == NO_NAME
    assert goal_name(["", "   ", "\x00\x01"], [], min_df=1) == NO_NAME
    assert goal_name(["12345 678", "+44 20 7946 0958"], [], min_df=1) == NO_NAME
    assert goal_name(["bob@example.com https://evil.example/x?y=z www.a.b"] * 3, [], min_df=1) == NO_NAME


def test_one_word_clusters() -> None:
    assert goal_name([f"weather {i}" for i in range(5)], TRAINS, min_df=5) == "weather"
    assert goal_name(["weather"] * 50, TRAINS, min_df=5) == NO_NAME  # one distinct summary
    assert goal_name(["ok", "no", "yes"], [], min_df=1) == NO_NAME


def test_non_ascii_is_folded_or_kept_never_broken() -> None:
    cafe = [f"Réserver une table au café numéro {i}" for i in range(3)] + [f"reserver cafe {i}" for i in range(3)]
    name = goal_name(cafe, TRAINS, min_df=5)
    assert "cafe" in name and name.isascii()
    cyrillic = [f"забронировать билет на поезд {i}" for i in range(6)]
    name = goal_name(cyrillic, TRAINS, min_df=5)
    assert "билет" in name or "поезд" in name or "забронировать" in name
    assert metric_label(name, 48)  # whatever the script, the metric value is a valid label
    noise = [f"\u200b\u202e🚆🚆 {i} \ud7ff\ufeff" for i in range(6)]
    assert goal_name(noise, TRAINS, min_df=1) == NO_NAME


def test_huge_summaries_are_bounded_in_time_and_in_name() -> None:
    word_soup = " ".join(f"w{i}ord" for i in range(200_000))  # 1.4 MB of one summary
    group = [word_soup + f" refund {i}" for i in range(50)] + [f"refund {i}" for i in range(5)]
    start = time.perf_counter()
    name = goal_name(group, [word_soup], min_df=5)
    assert time.perf_counter() - start < 5.0
    assert name == "refund"  # only the head of each summary is read; the soup has no repeated term
    assert len(name_clusters([["x" * 100_000] * 10, ["a b c " * 50_000]], min_df=1)[0]) <= 25


def test_names_do_not_depend_on_input_order() -> None:
    groups = [FLIGHTS + HOTELS[:3], TRAINS, HOTELS]
    expected = name_clusters(groups, min_df=5)
    rng = random.Random(7)
    for _ in range(5):
        shuffled = [rng.sample(g, len(g)) for g in groups]
        assert name_clusters(shuffled, min_df=5) == expected
    assert goal_name(FLIGHTS, TRAINS, min_df=5) == goal_name(FLIGHTS[::-1], TRAINS[::-1], min_df=5)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.text(max_size=300), max_size=8), max_size=5), st.integers(1, 6))
# Two clusters with one name: the second gets a distinguishing term after a colon (found by CI).
@example([["0", "AAA ¹¹¹:¹AA ؠAA"], ["AAB", "AAA ¹¹¹:¹AA ؠAA"], ["AA¹"]], 1)
def test_any_text_gets_a_bounded_name(groups: list[list[str]], min_df: int) -> None:
    names = name_clusters(groups, min_df=min_df)
    assert len(names) == len(groups)
    for name in names:
        assert "\n" not in name and "\x00" not in name
        if name == NO_NAME:
            continue
        base, _, extra = name.partition(": ")
        assert 1 <= len(base.split()) <= 5  # two terms of at most two words, joined by "and"
        assert ":" not in base and len(extra.split()) <= 2  # the term that sets equal names apart


async def test_the_extractive_run_names_final_clusters_against_each_other() -> None:
    texts = FLIGHTS * 2 + TRAINS * 2 + HOTELS * 2
    llm = ExtractiveGoalLLM(ClusteringConfig(merge_similarity_threshold=0.99, keyword_min_document_frequency=5))
    assert isinstance(llm, ClusterNamer)
    emb = HashEmbedder(dim=128)
    res = await llm_guided_clustering(texts, emb.embed(texts), llm=llm, embedder=emb, k1=3, seed=0)
    assert sorted(res.labels) == sorted(["book flight", "train ticket", "free parking and hotel"])
    assert np.unique(res.assignments).size == 3


def test_clusters_that_would_share_a_name_are_told_apart() -> None:
    # The same request in both, each with a rarer term of its own (as STAR's trip-directions
    # clusters: the places that set them apart are names, and never name a goal).
    core = [f"get walking directions and opening details {i}" for i in range(14)]
    parking = core + [f"is there parking nearby {i}" for i in range(6)]
    museum = core + [f"which museum entrance {i}" for i in range(6)]
    names = name_clusters([parking, museum, FLIGHTS], min_df=5)
    assert len(set(names)) == 3, names
    assert names[0].split(":")[0] == names[1].split(":")[0], names  # the shared phrase stays first
    assert "parking" in names[0].split(":")[1] and "museum" in names[1].split(":")[1], names
