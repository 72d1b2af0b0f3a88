"""The supervised ceiling reference: a classifier trained WITH the completion labels.

TF-IDF over word uni/bi-grams of the rendered conversation's tail, logistic regression, trained on
the train side's full conversations (complete) and their truncated copies (incomplete). It sees
labels the adapter never sees, so it bounds what the tail text alone gives away.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline

from adapters.data.conversations import eval_examples, train_record_conversation
from adapters.data.tokenizer import SPECIAL_TOKENS
from sidecar.transcript.model import Message
from sidecar.transcript.render import render_text

TAIL_CHARS = 1500


def tail_text(messages: Sequence[Message]) -> str:
    return render_text(messages, forbidden=SPECIAL_TOKENS)[-TAIL_CHARS:]


def train_classifier(data_dir: Path, datasets: Sequence[str], seed: int) -> tuple[Pipeline, int]:
    texts: list[str] = []
    labels: list[int] = []
    for name in datasets:
        with (data_dir / name / "train.jsonl").open() as fh:
            for line in fh:
                rec = json.loads(line)
                for ex in eval_examples(train_record_conversation(rec, name), seed + 1):
                    texts.append(tail_text(ex.messages))
                    labels.append(int(ex.complete))
    clf = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, max_features=50000),
        LogisticRegression(max_iter=2000, C=4.0),
    )
    clf.fit(texts, labels)
    return clf, len(texts)
