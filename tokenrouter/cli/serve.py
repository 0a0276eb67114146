"""`tokenrouter generate` (one prompt) and `tokenrouter chat` (an interactive conversation)."""

from __future__ import annotations

import json
import sys
import time

from . import output
from .arguments import UsageError, add_engine_options
from .engine_setup import engine_from_args
from .output import Painter, status, summary, summary_line


def add_parsers(sub) -> None:
    gen = sub.add_parser(
        "generate",
        help="answer one prompt, showing which model wrote each token",
        description="Answer one prompt with token-level routing. On a terminal each model's tokens have "
        "their own colour; a one-line summary follows (tokens per model, hand-offs, tokens/s).",
    )
    gen.add_argument("prompt", help="the prompt; '-' reads it from stdin")
    gen.add_argument("--raw", action="store_true", help="send the prompt as plain text, without the chat template")
    gen.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: text, token ids, the model that wrote each token, what each model computes "
        "in, and the summary",
    )
    add_engine_options(gen)

    chat = sub.add_parser(
        "chat",
        help="an interactive multi-turn chat, streamed",
        description="Chat with the routed models, one turn after another, using the chat template. "
        "Type /reset to forget the conversation, /exit (or Ctrl-D) to leave.",
    )
    add_engine_options(chat)
    gen.set_defaults(run=run)
    chat.set_defaults(run=run)


def run(args, argv) -> int:
    import anyio
    import torch

    quiet_transformers()
    torch.set_num_threads(1)  # the caller's thread only waits; workers set their own threads
    return anyio.run(generate if args.command == "generate" else chat, args)


def quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # per-tensor loading bars; we say "loading" once


def precision_of(model) -> str:
    """What a loaded model (its `ModelInfo`) computes in, and why (its dtype alone where the loader
    did not say)."""
    return model.precision or str(model.dtype).removeprefix("torch.")


def model_lines(engine) -> list[str]:
    """One line per loaded model: what it computes in and why, and what its linear layers run on."""
    info = engine.info()
    return [
        f"  {m}: {precision_of(info.models[m])}; linear: {info.models[m].linear_kernel}" for m in info.policy.models
    ]


def loading_line(info) -> str:
    return f"loading {', '.join(f'{m}={model.spec.path.name}' for m, model in info.models.items())} ..."


def messages(args, text: str) -> list[dict]:
    system = [{"role": "system", "content": args.system}] if args.system else []
    return [*system, {"role": "user", "content": text}]


async def generate(args) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise UsageError("prompt: is empty")
    engine, params = engine_from_args(args)
    info = engine.info()
    names = info.policy.models
    painter = Painter(names, output.use_colour(args) and not args.json)
    t0 = time.perf_counter()
    if not args.json:
        status(painter.dim(loading_line(info)))
    async with engine:
        load_s = time.perf_counter() - t0
        loaded = engine.info().models
        precision = {m: precision_of(loaded[m]) for m in names}
        if not args.json:
            status(painter.dim(f"loaded in {load_s:.1f} s; {info.policy!r}"))
            for line in model_lines(engine):
                status(painter.dim(line))
        request = prompt if args.raw else messages(args, prompt)
        t1 = time.perf_counter()
        out = None
        async for delta in engine.stream(request, params):
            if not args.json:
                print(painter.text(delta.text, delta.model), end="", flush=True)
            out = delta.output
        seconds = time.perf_counter() - t1
        steps_by_threads = {m: st.steps_by_threads for m, st in engine.stats().items()}
    assert out is not None
    s = summary(out, names, seconds)
    if args.json:
        record = {
            "text": out.text,
            "token_ids": out.token_ids,
            "token_models": out.token_models,
            "policy": repr(info.policy),
            "models": {m: str(model.spec.path) for m, model in info.models.items()},
            "precision": precision,
            "summary": {**s, "load_seconds": round(load_s, 3), "steps_by_threads": steps_by_threads},
        }
        if out.error:
            record["error"] = out.error
        print(json.dumps(record, ensure_ascii=False))
    else:
        print()
        print(summary_line(s, painter))
    if out.finish_reason == "error":
        status(f"tokenrouter: error: the request failed: {out.error}")
        return 1
    return 0


async def chat(args) -> int:
    import anyio

    from ..errors import InvalidRequestError

    engine, params = engine_from_args(args)
    interactive = sys.stdin.isatty()
    info = engine.info()
    painter = Painter(info.policy.models, output.use_colour(args))
    status(painter.dim(loading_line(info)))
    async with engine:
        for line in model_lines(engine):
            status(painter.dim(line))
        legend = " ".join(painter.text(m, m) for m in info.policy.models)
        status(painter.dim(f"ready ({legend}{painter.dim('); /reset forgets the conversation, /exit leaves')}"))
        history = [{"role": "system", "content": args.system}] if args.system else []
        while True:
            try:
                line = await anyio.to_thread.run_sync(input, "> " if interactive else "")
            except EOFError:
                break
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                break
            if text == "/reset":
                history = history[:1] if args.system else []
                status(painter.dim("(conversation forgotten)"))
                continue
            turn = [*history, {"role": "user", "content": text}]
            t0 = time.perf_counter()
            out = None
            try:
                async for delta in engine.stream(turn, params):
                    print(painter.text(delta.text, delta.model), end="", flush=True)
                    out = delta.output
            except InvalidRequestError as e:
                status(f"tokenrouter: {e}; /reset to start a new conversation")
                continue
            print()
            assert out is not None
            if out.finish_reason == "error":
                status(f"tokenrouter: error: the request failed: {out.error}")
                continue
            history = [*turn, {"role": "assistant", "content": out.text}]
            print(summary_line(summary(out, info.policy.models, time.perf_counter() - t0), painter), flush=True)
    return 0
