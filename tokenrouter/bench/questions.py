"""The short and long workloads' prompts: coding and maths questions from templates, with seeded
names and numbers, grown to a drawn length in the served model's tokens.

Templates rather than a dataset: nothing is downloaded, and the same seed gives the same
questions on every machine.
"""

from __future__ import annotations

import random

from .sessions import Session, Sizes, chat_tokens

NAMES = [
    "Alice",
    "Bob",
    "Chen",
    "Dana",
    "Eve",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jamal",
    "Kofi",
    "Lena",
    "Mateo",
    "Nia",
    "Omar",
    "Priya",
]
FUNCTIONS = [
    "parse_log",
    "merge_intervals",
    "top_k",
    "flatten",
    "chunked",
    "dedupe",
    "rolling_mean",
    "count_words",
    "rotate",
    "median",
    "pairs_sum",
    "is_balanced",
]
CODING = [
    "Write a Python function {f}(xs) that returns the {k} largest of {n} integers.",
    "Implement binary search over {n} sorted integers; return the index of {a} or -1.",
    "Write a SQL query for the {k} latest of {n} orders per customer in table {t}.",
    "Fix {f}(xs): it should sum the even numbers, but gives {a} for [{b}, {c}, {k}].",
    "Write a Python class {C} of at most {n} items with push, pop and peek.",
    "Write a function that counts each word in {p}'s {n} notes and returns the top {k}.",
    "Write a function {f}(xs, k) that splits {n} items into chunks of {k}.",
    "Write a regular expression for dates like 2026-0{k}-1{k} in a {n}-line log.",
]
MATHS = [
    "{p} has {a} apples and buys {b} bags of {k} apples. How many apples now?",
    "Solve for x: {a}x + {b} = {c}.",
    "What is the sum of the integers from 1 to {n}? Prove the formula.",
    "Is {c} prime? Explain how you check it.",
    "Find the greatest common divisor of {a} and {c} with Euclid's algorithm.",
    "A train leaves at {k}:00 at {a} km/h; another leaves an hour later at {b} km/h. When does it catch up?",
    "{p} saves {a} dollars a week. How many weeks until {p} has {c} dollars?",
]
DETAILS = {
    "coding": [
        "Handle empty input.",
        "State the time complexity.",
        "Give two test cases.",
        "Use only the standard library.",
        "Add type hints.",
        "Name one edge case.",
    ],
    "maths": ["Explain step by step.", "Check the answer at the end.", "Show your work.", "Explain why it is correct."],
}
EXAMPLE = {"coding": "Test it on these numbers: {}", "maths": "Then do the same for each of: {}"}


def _user_tokens(tokenizer, text: str) -> int:
    return chat_tokens(tokenizer, [{"role": "user", "content": text}])


def _question(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["coding", "maths"])
    template = rng.choice(CODING if kind == "coding" else MATHS)
    text = template.format(
        f=rng.choice(FUNCTIONS),
        p=rng.choice(NAMES),
        C=rng.choice(["Stack", "Deque", "Ring"]) + "Store",
        t=rng.choice(["orders", "sales", "events"]),
        k=rng.randint(2, 9),
        n=rng.randint(10, 999),
        a=rng.randint(2, 99),
        b=rng.randint(2, 99),
        c=rng.randint(100, 9999),
    )
    return kind, text


def question_session(tokenizer, sizes: Sizes, rng: random.Random) -> Session:
    """One coding or maths question of a length drawn from `sizes.prompt_tokens` (chat template
    included): a templated question, up to two requirements, then example values, one at a time,
    until it reaches that length; its output length is drawn from [max_tokens/4, max_tokens].
    (If no question fits under the top of the range, e.g. a chat template with a long default
    system prompt, the shortest of those drawn is used as it is.)"""
    lo, hi = sizes.prompt_tokens
    target = rng.randint(lo, hi)
    shortest = None
    for _ in range(100):
        kind, text = _question(rng)
        n = _user_tokens(tokenizer, text)
        if shortest is None or n < shortest[2]:
            shortest = (kind, text, n)
        if n <= hi:
            break
    else:
        kind, text, n = shortest
    for detail in rng.sample(DETAILS[kind], 2):
        m = _user_tokens(tokenizer, f"{text} {detail}")
        if n >= target or m > hi:
            break
        text, n = f"{text} {detail}", m
    base, values = text, []
    while n < target:
        values.append(str(rng.randint(1, 999)))
        longer = f"{base} {EXAMPLE[kind].format(', '.join(values))}."
        m = _user_tokens(tokenizer, longer)
        if m > hi:
            break
        text, n = longer, m
    out = rng.randint(max(1, sizes.max_tokens // 4), sizes.max_tokens)
    return Session([{"role": "user", "content": text}], [out], prompt_tokens=n)
