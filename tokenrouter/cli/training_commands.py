"""`tokenrouter label` (which model suffices for each token of a corpus) and `tokenrouter
train-router` (the router of a learned policy, trained on those labels)."""

from __future__ import annotations

import json
import os
import time

from .. import store
from .arguments import LEARNED, UsageError, fraction, model_arg, optional_count, positive_int
from .engine_setup import model_path
from .output import status


def add_parsers(sub) -> None:
    lab = sub.add_parser(
        "label",
        help="label which model suffices for each token of a reference corpus",
        description="Teacher-force every model (smallest first) over a reference corpus (each prompt through "
        "the smallest model's chat template, then its reference response) and record, for every response "
        "token, each model's greedy token and entropy, the smallest model whose greedy token is the largest "
        "model's (the sufficient-compute map) and the small model's features for training a router. Writes "
        "DIR/labels.safetensors and DIR/labels.json and prints a summary: tokens, the share of tokens each "
        "model suffices for, and the share of the estimated FLOPs the hardest 10% of tokens take.",
        epilog="Then: `tokenrouter train-router --policy r2r --labels DIR --out ROUTER_DIR`.",
    )
    lab.add_argument(
        "--model",
        action="append",
        type=model_arg,
        default=[],
        metavar="NAME=PATH",
        help="a model and where it is (a Hugging Face directory, a .gguf file or a store name), repeatable, "
        "smallest first; two or more, sharing one vocabulary. Default: the demo pair, "
        f"small={store.DEFAULT_MODELS['small']} and large={store.DEFAULT_MODELS['large']} (fetched if missing)",
    )
    corpus = {
        "--data": {
            "metavar": "FILE.jsonl",
            "help": 'the corpus: JSON Lines, one {"prompt": text or chat messages, '
            '"response": text} per line; a line without a response gets the largest model\'s own greedy '
            "answer",
        },
        "--python-corpus": {
            "type": positive_int,
            "metavar": "N",
            "help": "the corpus: N functions of this machine's "
            "Python standard library (the prompt asks for the function by name and docstring, "
            "the response is its source); offline and deterministic",
        },
    }
    data = lab.add_mutually_exclusive_group(required=True)
    for flag, options in corpus.items():
        data.add_argument(flag, **options)
    lab.add_argument(
        "--max-tokens-per-example",
        type=positive_int,
        default=256,
        metavar="N",
        help="label at most the first N tokens of each response (default 256)",
    )
    lab.add_argument("--seed", type=int, default=0, help="which examples --python-corpus draws (default 0)")
    lab.add_argument(
        "--dtype",
        choices=("float32", "float64", "bfloat16"),
        default="float32",
        help="the models' compute dtype (default float32); features are stored as float32",
    )
    lab.add_argument("--out", required=True, metavar="DIR", help="directory to write the labels to")
    lab.add_argument("--no-pull", action="store_true", help="fail instead of fetching a store model that is missing")
    optional_count(lab, "--threads", "torch threads (default: all cores)")
    lab.add_argument("--json", action="store_true", help="print the summary as one JSON object")

    tr = sub.add_parser(
        "train-router",
        help="train the router of citer, r2r or collm on labels",
        description="Train a router (a small MLP on the small model's features) on the labels of a model pair "
        "written by `tokenrouter label`, and pick its threshold on held-out examples: for a recall of hard "
        "tokens (those where the small model's greedy token is not the large model's), or for a share of "
        "tokens the large model writes. Prints the held-out AUC, recall, large-model share and threshold, "
        "and writes DIR/router.json and DIR/router.safetensors.",
        epilog='Then: `tokenrouter generate --policy r2r --router DIR "..."` with the same models.',
    )
    tr.add_argument("--policy", choices=LEARNED, required=True, help="the policy whose router to train")
    tr.add_argument("--labels", required=True, metavar="DIR", help="labels written by `tokenrouter label` (two models)")
    tr.add_argument("--out", required=True, metavar="DIR", help="directory to write the router to")
    target = tr.add_mutually_exclusive_group()
    target.add_argument(
        "--recall",
        type=fraction(True, False),
        default=None,
        help="pick the threshold for this recall of hard tokens on the held-out examples, in (0, 1] (default 0.95)",
    )
    target.add_argument(
        "--large-share",
        type=fraction(False, False),
        default=None,
        metavar="X",
        help="pick the threshold so that the large model writes this share of held-out tokens, in [0, 1]",
    )
    optional_count(tr, "--epochs", "training epochs (default: enough for about 500 steps, 3 to 50)")
    tr.add_argument(
        "--seed", type=int, default=0, help="seed of the split, the initialisation and the batches (default 0)"
    )
    tr.add_argument(
        "--heldout",
        type=fraction(True, True),
        default=0.2,
        help="share of the examples held out to pick the threshold and report metrics, in (0, 1) (default 0.2)",
    )
    tr.add_argument("--width", type=positive_int, default=256, help="the router MLP's width (default 256)")
    optional_count(tr, "--threads", "torch threads (default: all cores)")
    tr.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    lab.set_defaults(run=run)
    tr.set_defaults(run=run)


def run(args, argv) -> int:
    import torch

    from .serve import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    return label(args) if args.command == "label" else train_router(args)


def label(args) -> int:
    from ..training import generate_responses, label, python_corpus, read_jsonl

    given = list(args.model) or list(store.DEFAULT_MODELS.items())
    names = [n for n, _ in given]
    if len(set(names)) != len(names):
        raise UsageError("--model: each NAME may be given once")
    if len(given) < 2:
        raise UsageError("label needs two or more --model NAME=PATH, smallest first")
    # A bad file fails before any pull; lines without a response get the largest model's own.
    examples = read_jsonl(args.data, need_response=False) if args.data is not None else None
    models = {n: model_path(n, w, not args.no_pull) for n, w in given}
    t0 = time.perf_counter()
    if examples is None:
        examples, source = (
            python_corpus(args.python_corpus, args.seed),
            f"python_corpus({args.python_corpus}, seed={args.seed})",
        )
    else:
        source = str(args.data)
        missing = sum(e["response"] is None for e in examples)
        if missing:
            writer, path = list(models.items())[-1]
            status(
                f"{writer} writes the response of {missing} example(s), greedy, "
                f"up to {args.max_tokens_per_example} tokens ..."
            )
            examples = generate_responses(
                path,
                examples,
                args.max_tokens_per_example,
                dtype=args.dtype,
                num_threads=args.threads,
            )
            source += " (responses by the largest model)"
    status(f"labelling {len(examples)} examples with {', '.join(f'{n}={p.name}' for n, p in models.items())} ...")
    labels = label(
        models, examples, max_tokens_per_example=args.max_tokens_per_example, dtype=args.dtype, source=source
    )
    seconds = time.perf_counter() - t0
    out = labels.save(args.out)
    s = labels.meta().summary
    if args.json:
        print(json.dumps({**s, "seconds": round(seconds, 3), "out": str(out)}))
        return 0
    shares = " · ".join(f"{m} {100 * v:.1f}%" for m, v in s["sufficient_share"].items())
    print(f"labelled {s['examples']} examples, {s['tokens']} tokens in {seconds:.1f} s")
    print(f"smallest sufficient model (its greedy token is the largest model's): {shares} of tokens")
    print(
        f"the hardest {100 * s['hardest_fraction']:.0f}% of tokens ({s['hardest_tokens']}) take "
        f"{100 * s['hardest_flops_share']:.1f}% of the estimated FLOPs "
        "(2 x parameters of the sufficient model per token)"
    )
    print(f"saved to {out} (labels.safetensors, labels.json)")
    return 0


def train_router(args) -> int:
    from ..policies import save_router
    from ..training import COMPARISON, Labels, train_router

    labels = Labels.load(args.labels)
    t0 = time.perf_counter()
    net, m = train_router(
        labels,
        args.policy,
        target_recall=args.recall,
        large_share=args.large_share,
        heldout=args.heldout,
        epochs=args.epochs,
        seed=args.seed,
        width=args.width,
    )
    seconds = time.perf_counter() - t0
    out = save_router(net, args.out)
    if args.json:
        print(json.dumps({**m, "policy": args.policy, "seconds": round(seconds, 3), "out": str(out)}))
        return 0
    small, large = labels.model_names
    print(
        f"trained a {args.policy} router for {small} -> {large} on {int(m['tokens_train'])} tokens "
        f"({int(m['tokens_heldout'])} of {int(m['examples_heldout'])} examples held out) in {seconds:.1f} s"
    )
    target = (
        f"target recall {100 * m['target_recall']:g}%"
        if "target_recall" in m
        else f"target large-model share {100 * m['target_large_share']:.0f}%"
    )
    auc = f"{m['auc']:.3f}" if "auc" in m else "- (one class only)"
    print(
        f"held-out: AUC {auc} · recall of hard tokens {100 * m['recall']:.1f}% · large-model share "
        f"{100 * m['large_share']:.1f}% · precision {100 * m['precision']:.1f}% ({target})"
    )
    print(f"threshold {m['threshold']:.6g} ({args.policy} defers a token when {COMPARISON[args.policy]})")
    print(f"saved to {out} (router.json, router.safetensors); serve it with --policy {args.policy} --router {out}")
    return 0
