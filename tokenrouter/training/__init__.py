"""Offline work for the learned routers: labelling which model suffices for each token of a
reference corpus (teacher forcing), and training a router on those labels. Nothing here runs at
serving time; the policies load what it writes (`policies/routers.py`)."""

from .corpus import generate_responses, python_corpus, read_jsonl
from .labelling import label
from .labels import Labels
from .router_training import COMPARISON, train_router

__all__ = ["COMPARISON", "Labels", "generate_responses", "label", "python_corpus", "read_jsonl", "train_router"]
