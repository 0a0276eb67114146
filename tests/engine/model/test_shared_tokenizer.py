"""Models whose tokenizer files are the same share one tokenizer, each with its own chat template."""

from __future__ import annotations

import json
import shutil
import threading

import anyio
from transformers import AutoTokenizer

from tokenrouter import Engine, ModelSpec, RStitch
from tokenrouter.engine import load_tokenizer
from tokenrouter.engine.model.shared_tokenizer import tokenizer_key

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def _copy_tokenizer(src, dst, template: str | None = None):
    """The tokenizer files of model directory `src` in `dst` (a `ModelSpec.tokenizer` directory)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    if template is not None:
        (dst / "chat_template.jinja").write_text(template)
    return dst


def _fresh(directory):
    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def test_same_files_share_the_vocabulary_and_keep_their_own_templates(tiny_model, tmp_path):
    other = _copy_tokenizer(tiny_model, tmp_path / "other", "{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert tokenizer_key(tiny_model) == tokenizer_key(other)
    first = load_tokenizer(ModelSpec(path=tiny_model))
    second = load_tokenizer(ModelSpec(path=tiny_model, tokenizer=other))
    assert second is not first and second.backend_tokenizer is first.backend_tokenizer
    for tok, directory in ((first, tiny_model), (second, other)):  # each its own template, as loaded alone
        fresh = _fresh(directory)
        assert tok.apply_chat_template(MESSAGES, tokenize=False) == fresh.apply_chat_template(MESSAGES, tokenize=False)
        assert tok.encode("the quick brown fox") == fresh.encode("the quick brown fox")
        assert tok.get_vocab() == fresh.get_vocab() and tok.eos_token_id == fresh.eos_token_id
    assert first.apply_chat_template(MESSAGES, tokenize=False) != second.apply_chat_template(MESSAGES, tokenize=False)


def test_other_files_or_other_template_files_load_their_own(tiny_model, tmp_path):
    first = load_tokenizer(ModelSpec(path=tiny_model))
    changed = _copy_tokenizer(tiny_model, tmp_path / "changed")
    config = json.loads((changed / "tokenizer_config.json").read_text())
    config["model_max_length"] = 77
    (changed / "tokenizer_config.json").write_text(json.dumps(config))
    assert tokenizer_key(changed) != tokenizer_key(tiny_model)
    own = load_tokenizer(ModelSpec(path=tiny_model, tokenizer=changed))
    assert own.backend_tokenizer is not first.backend_tokenizer and own.model_max_length == 77

    legacy = _copy_tokenizer(tiny_model, tmp_path / "legacy")  # a template file transformers resolves its own way
    (legacy / "chat_template.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}"}))
    assert tokenizer_key(legacy) is None
    assert load_tokenizer(ModelSpec(path=tiny_model, tokenizer=legacy)).backend_tokenizer is not first.backend_tokenizer


def test_models_loading_at_once_share(tiny_model, tmp_path):
    models = 3
    dirs = [_copy_tokenizer(tiny_model, tmp_path / f"m{i}") for i in range(models)]
    got = [None] * models

    def load(i):
        got[i] = load_tokenizer(ModelSpec(path=tiny_model, tokenizer=dirs[i]))

    threads = [threading.Thread(target=load, args=(i,)) for i in range(models)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(t.backend_tokenizer) for t in got}) == 1 and len({id(t) for t in got}) == models


def test_a_routed_engine_holds_one_vocabulary(tiny_pair):
    async def main():
        async with Engine(models=tiny_pair, policy=RStitch(tau=0.2, small="small", large="large")) as engine:
            small, large = (engine.info().models[m].tokenizer for m in ("small", "large"))
            assert small.backend_tokenizer is large.backend_tokenizer

    anyio.run(main)
