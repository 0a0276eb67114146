"""The optional step-result fields a policy may ask for in `Policy.requires`: the engine computes
only those a policy names, so one that asks for none costs nothing."""

ENTROPY = "entropy"  # normalized entropy of the next-token distribution
HIDDEN = "hidden"  # the stepping model's last hidden state (what its output head sees)
TOKEN_EMBEDDING = "token_embedding"  # the stepping model's input embedding of the sampled token
VERIFY = "verify"  # the verifier's distributions over the tentative tokens it catches up on (`verify`)
HISTORY = "history"  # each request's tokens so far, prompt included (to propose drafts from, `Route.proposals`)
STEP_FIELDS = frozenset({ENTROPY, HIDDEN, TOKEN_EMBEDDING, VERIFY, HISTORY})
