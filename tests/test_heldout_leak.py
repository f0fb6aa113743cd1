"""Evaluation that cannot leak (issue #44): the held-out everyday prompts' topics are held out by the topic split
(edge_spec.train.data), appear in no training prompt, and no committed regenerated answer - the drafters' training data
and the static datastore's text (data/regenerated/<target>) - was generated from a held-out prompt."""

import gzip
import json
from pathlib import Path

import pytest

from edge_spec.train import data as D
from edge_spec.train.pipeline import prompt_key

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "edge_spec" / "assets" / "prompts" / "heldout_everyday.jsonl"


def _topic(prompt: str) -> str:
    for template in D._EVERYDAY_TEMPLATES:
        head, tail = template.split("{topic}")
        if prompt.startswith(head) and prompt.endswith(tail):
            return prompt[len(head):len(prompt) - len(tail)]
    raise AssertionError(f"held-out prompt {prompt!r} follows no everyday template")


def test_heldout_everyday_topics_are_never_trained_on():
    prompts = [json.loads(line)["prompt"] for line in HELDOUT.read_text().splitlines() if line.strip()]
    topics = {_topic(p) for p in prompts}
    assert topics and all(D.is_held_out(t, 10) for t in topics)  # the split puts them on the held-out side
    training = D.everyday_prompts(held_out=False) + D.chat_prompts([], held_out=False, templates_per_topic=8)
    for topic in topics:
        assert not [p for p in training if topic.lower() in p.lower()], topic


def test_no_regenerated_answer_comes_from_a_heldout_prompt():
    folders = sorted((ROOT / "data" / "regenerated").glob("*/target.json"))
    if not folders:
        pytest.skip("no committed regenerated answers (an installed wheel)")
    heldout = D.everyday_prompts(held_out=True) + [json.loads(line)["prompt"] for line in HELDOUT.read_text().splitlines()]
    keys = {prompt_key(p) for p in heldout}
    for stamp in folders:
        for path in sorted(stamp.parent.glob("*.jsonl.gz")):
            with gzip.open(path, "rt") as f:
                seen = {json.loads(line)["key"] for line in f}
            assert not seen & keys, f"{path} holds answers to held-out prompts"
