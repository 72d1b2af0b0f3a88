"""ROUGE-1/2/L against known values: worked by hand, the reference package's published example, and
the scores OptimouseQuest published with its dialogues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.tools.simulator.rouge import Score, as_json, lcs_length, rouge, rouge_l_tokens, rouge_n_tokens, tokenize

DATA = Path(__file__).parent / "data" / "optimouse_rouge.json"


def close(score: Score, p: float, r: float, f: float) -> None:
    assert score.precision == pytest.approx(p)
    assert score.recall == pytest.approx(r)
    assert score.fmeasure == pytest.approx(f)


def test_tokenisation_is_the_reference_one() -> None:
    assert tokenize("The Quick, brown-fox's $20 ...jumps!") == ["the", "quick", "brown", "fox", "s", "20", "jumps"]
    assert tokenize("Don't café naïve") == ["don", "t", "caf", "na", "ve"]  # non-ASCII letters split words
    assert tokenize("  \n\t ") == [] and tokenize("") == []


def test_the_reference_packages_published_example() -> None:
    # rouge-score's README: score(target, prediction) of these two sentences gives rouge1 (0.75, 0.667,
    # 0.706) and rougeL (0.625, 0.556, 0.588).
    s = rouge("The quick brown fox jumps over the lazy dog", "The quick brown dog jumps on the log.")
    close(s["rouge1"], 0.75, 6 / 9, 0.7058823529411765)
    close(s["rougeL"], 0.625, 5 / 9, 0.5882352941176471)
    # By hand: target bigrams 8, prediction bigrams 7, shared "the quick" and "quick brown".
    close(s["rouge2"], 2 / 7, 2 / 8, 4 / 15)


def test_by_hand_clipping_and_order() -> None:
    # "the" twice in the prediction, once in the target: counted once (clipped).
    close(rouge_n_tokens(["the", "cat"], ["the", "the", "cat"], 1), 2 / 3, 1.0, 0.8)
    # Reordering keeps unigrams, breaks bigrams and the LCS.
    t, p = tokenize("a b c d"), tokenize("d c b a")
    close(rouge_n_tokens(t, p, 1), 1.0, 1.0, 1.0)
    close(rouge_n_tokens(t, p, 2), 0.0, 0.0, 0.0)
    close(rouge_l_tokens(t, p), 0.25, 0.25, 0.25)
    assert lcs_length(list("ABCBDAB"), list("BDCABA")) == 4  # the textbook LCS example (CLRS)
    assert lcs_length([], ["a"]) == 0


def test_empty_texts_score_zero_without_errors() -> None:
    for s in rouge("", "something").values():
        assert (s.precision, s.recall, s.fmeasure) == (0.0, 0.0, 0.0)
    for s in rouge("something", "").values():
        assert s.fmeasure == 0.0
    assert rouge_n_tokens(["one"], ["one"], 2).fmeasure == 0.0  # no bigram on either side
    with pytest.raises(ValueError, match="at least 1"):
        rouge_n_tokens(["a"], ["a"], 0)
    assert set(as_json(rouge("a", "a"))["rougeL"]) == {"precision", "recall", "fmeasure"}


@pytest.mark.parametrize("index", [0, 1, 2])
def test_optimousequest_published_scores(index: int) -> None:
    example = json.loads(DATA.read_text(encoding="utf-8"))["examples"][index]
    s = rouge(example["problem_statement"], example["final_summary"])
    pub = example["published"]
    for ours, theirs in (("rouge1", "Rouge-1"), ("rouge2", "Rouge-2"), ("rougeL", "Rouge-L")):
        close(s[ours], pub[f"{theirs}: Precision"], pub[f"{theirs}: Recall"], pub[f"{theirs}: F1"])
