"""Show that each reliability test fails when its promise is broken.

    .venv/bin/python scripts/check_promises.py [NAME ...]

For every promise of docs/reliability.md, and every policy's rule (tests/policies/test_policy_rules.py),
this applies one small mutation that breaks it to a copy of the source tree, runs the tests that
guard the promise on that copy, and expects them
to FAIL (a run that hangs past the limit counts as failing too). The unmodified tree must pass
the same tests first. Takes about fifteen minutes on two cores; not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 300


@dataclass(frozen=True)
class Mutation:
    name: str
    promise: str
    path: str  # file to change, relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments that must fail once the mutation is in


MUTATIONS = [
    Mutation(
        "abort-keeps-pending-kv",
        "an abort frees the request's KV on every worker, pending copies included",
        "tokenrouter/engine/model_core.py",
        "            owner = seq.status is not SeqStatus.PENDING\n"
        "            self._held.drop(seq)\n"
        "            if owner:\n",
        "            owner = seq.status is not SeqStatus.PENDING\n"
        "            if owner:\n"
        "                self._held.drop(seq)\n",
        ("tests/test_cancellation.py", "-k", "pending_at_peer"),
    ),
    Mutation(
        "leaving-does-not-abort",
        "cancelling the caller's task or leaving a stream aborts the request everywhere",
        "tokenrouter/api/request_tracker.py",
        "                if not proc.worker_done:  # cancelled, or the consumer left: free its KV everywhere\n"
        "                    self.abort_everywhere(proc.req)\n",
        "                pass\n",
        ("tests/test_cancellation.py", "-k", "cancel_task or leave_stream"),
    ),
    Mutation(
        "handoff-after-abort-runs",
        "a hand-off that arrives after its request was aborted is ended, not run",
        "tokenrouter/engine/model_core.py",
        "        if req.aborted or refuse:  # aborted in transit: end it here",
        "        if refuse:",
        ("tests/test_cancellation.py", "-k", "handing_off"),
    ),
    Mutation(
        "close-forgets-requests",
        "closing the engine ends every request in flight",
        "tokenrouter/engine/worker/thread.py",
        '        self.core.end_all("abort" if self.error is None else "error", self.error, out)\n',
        "        pass\n",
        ("tests/test_cancellation.py", "-k", "engine_exit"),
    ),
    Mutation(
        "dead-worker-keeps-peer-kv",
        "a dying worker's requests fail with the cause and free their KV on the other workers",
        "tokenrouter/engine/held_requests.py",
        "            else:\n                self.end(seq, out, reason, error)\n",
        "            else:\n                self.drop(seq)\n"
        "                out.events.append(self.event(seq, finish_reason=reason, error=error))\n",
        ("tests/test_faults.py", "-k", "dead_worker"),
    ),
    Mutation(
        "dead-worker-accepts-requests",
        "with a worker gone, new requests get a clear error at once",
        "tokenrouter/api/input_processor.py",
        "            if not worker.alive:\n                raise EngineNotRunningError(",
        "            if False:\n                raise EngineNotRunningError(",
        ("tests/test_faults.py", "-k", "dead_worker"),
    ),
    Mutation(
        "failed-forward-kills-worker",
        "an exception in a forward fails that batch's requests only",
        "tokenrouter/engine/model_core.py",
        "            except Exception as e:  # a failed forward fails its batch, not the worker\n",
        "            except ZeroDivisionError as e:\n",
        ("tests/test_faults.py", "-k", "failed_forward"),
    ),
    Mutation(
        "output-failure-escapes",
        "a failure while building a request's output fails that request only",
        "tokenrouter/api/request_tracker.py",
        "        except Exception as e:  # e.g. the tokenizer failed to decode: fail this request only\n",
        "        except ZeroDivisionError as e:\n",
        ("tests/test_faults.py", "-k", "building_the_output"),
    ),
    Mutation(
        "stuck-close-strands-callers",
        "closing never hangs: requests on a worker that will not stop are ended",
        "tokenrouter/api/request_tracker.py",
        '            channel.push(WorkerEvent(rid, [], model, finish_reason="abort", error=error))\n',
        "            pass\n",
        ("tests/test_faults.py", "-k", "stuck"),
    ),
    Mutation(
        "ends-twice",
        "every request ends exactly once",
        "tokenrouter/engine/held_requests.py",
        "        out.events.append(self.event(seq, list(tokens), logprobs, finish_reason=reason, error=error))\n",
        "        out.events.append(self.event(seq, list(tokens), logprobs, finish_reason=reason, error=error))\n"
        "        out.events.append(self.event(seq, [], finish_reason=reason, error=error))\n",
        ("tests/test_load.py",),
    ),
    Mutation(
        "abort-keeps-pending-kv-fuzz",
        "random interleavings keep every invariant (here: pools end free)",
        "tokenrouter/engine/model_core.py",
        "            owner = seq.status is not SeqStatus.PENDING\n"
        "            self._held.drop(seq)\n"
        "            if owner:\n",
        "            owner = seq.status is not SeqStatus.PENDING\n"
        "            if owner:\n"
        "                self._held.drop(seq)\n",
        ("tests/test_concurrency.py", "-k", "interleavings"),
    ),
    Mutation(
        "eviction-forgets-to-recompute",
        "under memory pressure, evicted requests recompute and outputs stay the same",
        "tokenrouter/engine/kv/block_manager.py",
        "        seq.block_table = []\n        seq.num_computed = 0\n",
        "        seq.block_table = []\n        seq.num_computed = min(seq.num_computed, 1)\n",
        ("tests/test_load.py", "tests/engine/test_routing.py::test_eviction_of_pending_requests_keeps_outputs"),
    ),
    Mutation(
        "too-big-admitted",
        "a request that cannot fit even alone fails at once, saying what it needs and what the pool holds",
        "tokenrouter/api/input_processor.py",
        "            if need > holds:\n",
        "            if False:\n",
        ("tests/engine/kv/test_kv_pool.py",),
    ),
    Mutation(
        "channel-not-thread-safe",
        "several event loops in several threads can use one engine at once",
        "tokenrouter/api/request_channel.py",
        "            self._call_soon(self._set)\n",
        "            self._set()  # from the worker thread: not safe, and no wake-up\n",
        ("tests/test_concurrency.py", "-k", "several_event_loops"),
    ),
    Mutation(
        "nul-accepted",
        "bad input is refused before it reaches a worker",
        "tokenrouter/api/prompts.py",
        '"\\x00"',
        '"\\x01\\x02"',
        ("tests/api/test_request_input.py",),
    ),
    # ---- the policies' rules (tests/policies/test_policy_rules.py): each comparison at its boundary ----
    Mutation(
        "entropy-wrong-scale",
        "normalized entropy is H / log V",
        "tokenrouter/policies/base.py",
        "    return h / math.log(logits.shape[-1])\n",
        "    return h / math.log(logits.shape[-1] + 1)\n",
        ("tests/policies/test_policy_rules.py", "-k", "entropy"),
    ),
    Mutation(
        "rstitch-strict-boundary",
        "RStitch keeps the small model's token when H <= tau",
        "tokenrouter/policies/rstitch.py",
        "        confident = (result.entropy <= self.tau).cpu()  # one read: the engine takes the answer to the host\n",
        "        confident = (result.entropy < self.tau).cpu()\n",
        ("tests/policies/test_policy_rules.py", "-k", "rstitch"),
    ),
    Mutation(
        "rstitch-large-discards",
        "RStitch's large model keeps every token it writes",
        "tokenrouter/policies/rstitch.py",
        "        return Route(keep=torch.ones_like(confident), next_model=next_model)\n",
        "        return Route(keep=confident, next_model=next_model)\n",
        ("tests/policies/test_policy_rules.py", "-k", "rstitch"),
    ),
    Mutation(
        "escalation-stays-up",
        "after an accepted token, escalation returns control to the smallest model",
        "tokenrouter/policies/escalation.py",
        "        next_model = torch.where(escalate, i + 1, 0)\n",
        "        next_model = torch.where(escalate, i + 1, i)\n",
        ("tests/policies/test_policy_rules.py", "-k", "escalation"),
    ),
    Mutation(
        "escalation-inclusive",
        "escalation escalates when H > tau, not at tau",
        "tokenrouter/policies/escalation.py",
        "        escalate = result.entropy.cpu() > self.taus[i]\n",
        "        escalate = result.entropy.cpu() >= self.taus[i]\n",
        ("tests/policies/test_policy_rules.py", "-k", "escalation"),
    ),
    Mutation(
        "r2r-strict",
        "R2R defers when p >= threshold",
        "tokenrouter/policies/r2r.py",
        "        return p >= threshold\n",
        "        return p > threshold\n",
        ("tests/policies/test_policy_rules.py", "-k", "deferral"),
    ),
    Mutation(
        "collm-inclusive",
        "CoLLM defers when p > threshold",
        "tokenrouter/policies/collm.py",
        "        return p > threshold\n",
        "        return p >= threshold\n",
        ("tests/policies/test_policy_rules.py", "-k", "deferral"),
    ),
    Mutation(
        "citer-flipped",
        "CITER defers when its confidence < threshold",
        "tokenrouter/policies/citer.py",
        "        return p < threshold\n",
        "        return p > threshold\n",
        ("tests/policies/test_policy_rules.py", "-k", "deferral"),
    ),
    Mutation(
        "deferral-large-stays",
        "after the large model's one token, a deferral policy returns to the small model",
        "tokenrouter/policies/deferral.py",
        "            return Route(keep=keep, next_model=torch.zeros(len(result), dtype=torch.long))\n",
        "            return Route(keep=keep, next_model=torch.ones(len(result), dtype=torch.long))\n",
        ("tests/policies/test_policy_rules.py", "-k", "deferral"),
    ),
    Mutation(
        "r2r-features-reordered",
        "R2R's features are the hidden state, the token's embedding, then the top-k log-probabilities",
        "tokenrouter/policies/routers.py",
        "    return torch.cat([hidden, token_embedding.float(), top], dim=-1)\n",
        "    return torch.cat([token_embedding.float(), hidden, top], dim=-1)\n",
        ("tests/policies/test_policy_rules.py", "-k", "router_features"),
    ),
    Mutation(
        "speculative-accepts-every-draft",
        "sampled Speculative accepts a draft with probability min(1, p/q), so its output is the target's distribution",
        "tokenrouter/policies/speculative.py",
        "        accepted = u * q.gather(1, x).squeeze(1).double() < p[:n].gather(1, x).squeeze(1).double()\n",
        "        accepted = torch.ones_like(u, dtype=torch.bool)  # mutation: every draft accepted\n",
        ("tests/policies/test_verifying.py", "-k", "draws_from_the_target"),
    ),
    Mutation(
        "speculative-greedy-accepts-every-draft",
        "greedy Speculative keeps a draft only where the target's argmax agrees",
        "tokenrouter/policies/speculative.py",
        "            accept = torch.where(agree.all(dim=1), num_drafts, (~agree).long().argmax(dim=1))\n",
        "            accept = num_drafts.clone()\n",
        ("tests/policies/test_verifying.py", "-k", "equals_the_large_model_alone and 4"),
    ),
    Mutation(
        "rollback-keeps-the-cached-block",
        "a rolled-back position in a prefix-cached block is copied on write, never written in place",
        "tokenrouter/engine/kv/block_manager.py",
        "            if self.ref_counts[last] > 1 or self.block_keys[last] is not None:\n",
        "            if self.ref_counts[last] > 1:\n",
        ("tests/policies/test_verifying.py", "-k", "never_changes_a_cached_block"),
    ),
    Mutation(
        "check-rows-unpenalized",
        "a verifier's rows of a check are penalized with the tokens before each, "
        "so Speculative is lossless under penalties",
        "tokenrouter/engine/verify.py",
        "        spans = step_logits.process_spans([seqs[i] for i in checks], "
        "[fwd.verify[fwd.sample_rows[i]] for i in checks])\n",
        "        spans = [fwd.verify[fwd.sample_rows[i]] for i in checks]\n",
        ("tests/policies/test_verifying.py", "-k", "penalized_large_model and 2"),
    ),
    Mutation(
        "prompt-logprobs-take-cache-hits",
        "a request asking prompt_logprobs computes every prompt position, a cached prefix or not",
        "tokenrouter/engine/sequence.py",
        "        if self.needs_prompt_logits:\n"
        "            return min(self.first_logit_position, len(self.prompt_logprobs))\n",
        "",
        ("tests/sampling/test_logprobs.py", "-k", "prompt_logprobs"),
    ),
    Mutation(
        "repetition-penalty-skips-the-prompt",
        "repetition_penalty counts prompt and output tokens, as transformers' processor does",
        "tokenrouter/sampling/penalties.py",
        "    in_context.scatter_(1, torch.where(seen, tokens, vocab), True)\n",
        "    in_context.scatter_(1, torch.where(output, tokens, vocab), True)\n",
        ("tests/sampling/test_penalties.py", "-k", "row_by_row"),
    ),
    Mutation(
        "hidden-state-off",
        "the hidden state a policy sees is transformers' last hidden state",
        "tokenrouter/engine/model/runner.py",
        "        self.hidden = args[0]\n",
        "        self.hidden = args[0] * 1.001\n",
        ("tests/policies/test_policy_rules.py", "-k", "hidden_state"),
    ),
    Mutation(
        "one-worker-skips-the-grammar",
        "a constrained request's output follows its grammar whichever model writes",
        "tokenrouter/engine/step_logits.py",
        "        if seq.req.grammar is None:\n",
        '        if seq.req.grammar is None or self.model == "large":\n',
        ("tests/structured/test_structured_output.py", "-k", "always_validates"),
    ),
    Mutation(
        "actor-forgets-abort",
        "with workers in Ray actors, a hand-off that arrives after its request was aborted is ended, not run",
        "tokenrouter/distributed/actor.py",
        "        if (req.request_id, inc) in self.tombstones:\n            req.aborted = True\n",
        "        if (req.request_id, inc) in self.tombstones:\n            pass\n",
        ("tests/distributed/test_distributed_cancellation.py", "-k", "handing_off"),
    ),
    Mutation(
        "lost-actor-ignored",
        "the requests of a Ray actor that is lost end with an error naming it, and nothing hangs",
        "tokenrouter/distributed/losses.py",
        "            if self.closing or name in roster.lost:\n                return\n            log.error",
        "            if True:\n                return\n            log.error",
        ("tests/distributed/test_distributed_faults.py", "-k", "killing"),
    ),
    Mutation(
        "ray-fallback-drops-events",
        "without the direct channels, events reach the caller by Ray calls",
        "tokenrouter/distributed/caller_queue.py",
        "            out, self._ready = self._ready, wire.EventBatch(source=self.source)\n",
        "            out, self._ready = wire.EventBatch(source=self.source), wire.EventBatch(source=self.source)\n",
        ("tests/distributed/test_distributed.py", "-k", "without_the_direct_channels"),
    ),
]


def copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for f in files:
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[bool, str]:
    """(passed, last lines); a run past the limit counts as not passed."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        return False, f"hung past {LIMIT_S} s"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode == 0, lines[-1] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutations to check (default: all)")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    ok = True
    with tempfile.TemporaryDirectory(prefix="tokenrouter-promises-") as tmp:
        for m in chosen:
            tree = Path(tmp) / m.name
            copy_tree(tree)
            passed, tail = run_tests(tree, m.tests)
            if not passed:
                print(f"[BASELINE FAILS] {m.name}: {' '.join(m.tests)}: {tail}")
                ok = False
                continue
            target = tree / m.path
            text = target.read_text()
            if text.count(m.old) != 1:
                print(f"[STALE] {m.name}: the text to mutate is not in {m.path} exactly once")
                ok = False
                continue
            target.write_text(text.replace(m.old, m.new))
            t0 = time.monotonic()
            passed, tail = run_tests(tree, m.tests)
            verdict = "caught" if not passed else "NOT CAUGHT"
            ok &= not passed
            print(f"[{verdict}] {m.name} ({m.promise}): {' '.join(m.tests)} -> {tail} ({time.monotonic() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
