"""tokenizer(...) and tokenized(...) as assets on the real corpus, with a real instance."""

from __future__ import annotations

import dagster as dg
import pytest

from assets import dataset, sample_corpus
from assets.tokenize import tokenized, tokenizer
from marin_dagster import fs
from marin_dagster.tokenize import TokenCache
from marin_dagster.tokenize.tokenizer import load_tokenizer
from resources import local_resources
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource


def _meta(result, asset):
    return {
        k: v.value
        for k, v in result.asset_materializations_for_node(asset.op.name)[0].metadata.items()
    }


def test_tokenizer_and_token_cache_assets(tmp_path, downloads):
    corpus = sample_corpus("raw/shakespeare", num_shards=2)
    tok = tokenizer("tokenizers/shakespeare-bpe", source=corpus, vocab_size=1024)
    ds = tokenized("tokenized/shakespeare", source=corpus, tokenizer=tok, validation=0.1)
    storage = StorageResource(prefix=str(tmp_path / "data"), downloads=downloads)
    resources = {"storage": storage, "zephyr": ZephyrResource(max_workers=2)}
    with dg.instance_for_test() as instance:
        result = dg.materialize([corpus, tok, ds], instance=instance, resources=resources)
        tok_meta, ds_meta = _meta(result, tok), _meta(result, ds)
        assert tok_meta["vocab_size"] == 1024
        assert 1.5 < tok_meta["bytes_per_token"] < 6
        assert "decoded" in tok_meta["examples"]
        assert ds_meta["documents"] == 91
        assert ds_meta["train_documents"] + ds_meta["validation_documents"] == 91
        assert ds_meta["validation_documents"] > 0
        assert ds_meta["dtype"] == "uint16"
        assert ds_meta["tokens"] > 1_000_000
        # progress of the tokenize stage in the run log while it runs, not only the total
        progress = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.step_key == ds.op.name and e.user_message.startswith("zephyr 1/1 ")
        ]
        # two tasks per input shard: its kept documents to train/, its held-out ones to
        # validation/
        assert any("0/4" in m for m in progress) and any("4/4" in m for m in progress), progress
        # ...and the summary counts input shards, naming the cache shards they became (it
        # said "2 shards tokenized" after "4/4", with nothing to tell the two counts apart)
        logs = [e.user_message for e in instance.all_logs(result.run_id)]
        assert any(
            "token cache: 2 of 2 input shards tokenized, 0 already done (cache shards: "
            "2 train, 2 validation)" in m
            for m in logs
        ), [m for m in logs if "token cache" in m]

        cache_path = ds_meta["path"]
        cache = TokenCache.open(cache_path, split="train")
        assert cache.num_tokens == ds_meta["train_tokens"]
        text = load_tokenizer(fs.join(tok_meta["path"], "tokenizer.json")).decode(
            cache[0].tolist(), skip_special_tokens=True
        )
        assert len(text) > 1000

        # nothing changed: both steps skip
        again = dg.materialize([corpus, tok, ds], instance=instance, resources=resources)
        assert _meta(again, ds)["skipped"] is True and _meta(again, tok)["skipped"] is True

        # a new vocabulary is a new tokenizer version, hence a new cache version
        tok2 = tokenizer("tokenizers/shakespeare-bpe", source=corpus, vocab_size=1100)
        ds2 = tokenized("tokenized/shakespeare", source=corpus, tokenizer=tok2, validation=0.1)
        assert ds2.code_versions_by_key[ds2.key] != ds.code_versions_by_key[ds.key]


def test_tokenizer_needs_a_source_or_a_pretrained_one():
    with pytest.raises(ValueError, match="give a source dataset"):
        tokenizer("tokenizers/x")


def test_pretrained_tokenizer_is_versioned_by_its_bytes(tmp_path):
    from marin_dagster.tokenize.tokenizer import new_byte_level_bpe

    path = tmp_path / "tokenizer.json"
    path.write_text(new_byte_level_bpe().to_str())
    first = tokenizer("tokenizers/p", pretrained=str(path))
    path.write_text(new_byte_level_bpe().to_str(pretty=True))
    second = tokenizer("tokenizers/p", pretrained=str(path))
    assert first.code_versions_by_key[first.key] != second.code_versions_by_key[second.key]


def test_a_vocab_larger_than_the_corpus_supports_is_warned_of(tmp_path):
    src = tmp_path / "notes.jsonl"
    src.write_text("".join(f'{{"text": "note {i}: to be, or not to be"}}\n' for i in range(30)))
    raw = dataset("raw/notes", str(src))
    tok = tokenizer("tokenizers/notes", source=raw, vocab_size=5000)
    resources = local_resources(str(tmp_path / "data"))
    with dg.instance_for_test() as instance:
        result = dg.materialize([raw, tok], instance=instance, resources=resources)
        warnings = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.step_key == tok.op.name and "learned" in e.user_message
        ]
    learned = _meta(result, tok)["vocab_size"]
    assert learned < 5000
    assert len(warnings) == 1
    assert f"vocab_size=5,000 asked, {learned:,} learned" in warnings[0]
    assert "Lower vocab_size" in warnings[0]


def _im_end_tokenizer(path) -> int:
    """A byte-level BPE whose end-of-document token is <|im_end|> (none of the known names)."""
    from marin_dagster.tokenize.tokenizer import new_byte_level_bpe

    tok = new_byte_level_bpe()
    tok.add_tokens(["a", "b"])
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    path.write_text(tok.to_str())
    return tok.token_to_id("<|im_end|>")


def test_tokenized_takes_the_eos_token_of_a_tokenizer_that_names_it_otherwise(tmp_path):
    # The build's error for such a tokenizer says to pass eos_token=...: the factory takes it.
    im_end = _im_end_tokenizer(tmp_path / "tokenizer.json")
    src = tmp_path / "notes.jsonl"
    src.write_text('{"id": "1", "text": "ab ba"}\n{"id": "2", "text": "b a a"}\n')
    raw = dataset("raw/im-end-notes", str(src))
    tok = tokenizer("tokenizers/im-end", pretrained=str(tmp_path / "tokenizer.json"))
    ds = tokenized(
        "tokenized/im-end-notes", source=raw, tokenizer=tok, validation=0.0, eos_token="<|im_end|>"
    )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw, tok, ds], instance=instance, resources=local_resources(str(tmp_path / "data"))
        )
    assert result.success
    cache = TokenCache.open(_meta(result, ds)["path"], split="train")
    assert len(cache) == 2
    assert all(cache[i][-1] == im_end for i in range(2))
    assert cache.eos_id == im_end


def test_a_bpe_trained_with_other_special_tokens_ends_documents_with_its_own_eos(tmp_path):
    # special_tokens without <|endoftext|> failed when the step ran: "eos_token
    # '<|endoftext|>' must be one of special_tokens", a field the factory does not have.
    src = tmp_path / "notes.jsonl"
    src.write_text("".join(f'{{"id": "{i}", "text": "note number {i}"}}\n' for i in range(20)))
    raw = dataset("raw/s-notes", str(src))
    tok = tokenizer("tokenizers/s-bpe", source=raw, vocab_size=300, special_tokens=["<s>", "</s>"])
    ds = tokenized("tokenized/s-notes", source=raw, tokenizer=tok, validation=0.0)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw, tok, ds], instance=instance, resources=local_resources(str(tmp_path / "data"))
        )
    assert result.success
    eos = load_tokenizer(fs.join(_meta(result, tok)["path"], "tokenizer.json")).token_to_id("</s>")
    assert _meta(result, tok)["eos_id"] == eos
    cache = TokenCache.open(_meta(result, ds)["path"], split="train")
    assert len(cache) == 20 and cache[0][-1] == eos


def test_special_tokens_without_an_end_of_document_token_are_refused_when_defined():
    with pytest.raises(ValueError, match=r"tokenizer\('tokenizers/no-eos'\): special_tokens="):
        tokenizer("tokenizers/no-eos", source=sample_corpus("raw/x"), special_tokens=["<pad>"])
