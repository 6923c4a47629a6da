"""Tokenizer training, saving and loading (file, directory, gs://, hub name)."""

from __future__ import annotations

import json
import os
import random
import socket
import time
import tracemalloc

import pytest
from tokenizers import Tokenizer

from marin_dagster.tokenize.tokenizer import (
    CONFIG_FILE,
    DEFAULT_EOS,
    TOKENIZER_FILE,
    BpeTrainingConfig,
    TokenizerHubUnreachableError,
    TokenizerNotFoundError,
    bytes_per_token,
    describe_tokenizer,
    encode_examples,
    examples_markdown,
    find_eos_id,
    load_tokenizer,
    read_tokenizer_config,
    token_byte_lengths,
    train_bpe,
    train_tokenizer,
)


def test_trained_tokenizer_is_saved_with_its_config(bpe_dir, shakespeare_docs):
    assert sorted(os.listdir(bpe_dir)) == [TOKENIZER_FILE, CONFIG_FILE]
    config = json.loads(open(os.path.join(bpe_dir, CONFIG_FILE)).read())
    assert config["model"] == "byte-level-bpe"
    assert config["vocab_size"] == config["actual_vocab_size"] == 1024
    assert config["special_tokens"] == [DEFAULT_EOS]
    assert config["num_training_documents"] == len(shakespeare_docs) // 2
    tok = load_tokenizer(bpe_dir)
    assert tok.get_vocab_size() == 1024
    assert find_eos_id(tok) == tok.token_to_id(DEFAULT_EOS) == config["eos_id"]
    # Same tokenizer by file path as by directory.
    by_file = load_tokenizer(os.path.join(bpe_dir, TOKENIZER_FILE))
    assert by_file.to_str() == tok.to_str()
    assert read_tokenizer_config(bpe_dir) == config


def test_byte_level_bpe_round_trips_real_text(bpe_dir, shakespeare_docs):
    tok = load_tokenizer(bpe_dir)
    for d in shakespeare_docs[:4]:
        ids = tok.encode(d["text"], add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == d["text"]
    # Bytes it never saw still encode (byte fallback) and decode back.
    odd = "naïve — 東京 🙂"
    assert tok.decode(tok.encode(odd).ids) == odd


def test_token_byte_lengths_add_up_to_the_text(bpe_dir, shakespeare_docs):
    tok = load_tokenizer(bpe_dir)
    lengths = token_byte_lengths(tok)
    assert lengths[find_eos_id(tok)] == 0
    for text in [d["text"] for d in shakespeare_docs[-3:]] + ["naïve — 東京 🙂"]:
        ids = tok.encode(text, add_special_tokens=False).ids + [find_eos_id(tok)]
        assert int(lengths[ids].sum()) == len(text.encode("utf-8"))


def test_metadata_helpers(bpe_dir, shakespeare_docs):
    tok = load_tokenizer(bpe_dir)
    held_out = [d["text"][:3000] for d in shakespeare_docs[-3:]]
    bpt = bytes_per_token(tok, held_out)
    # A trained BPE compresses English well past one byte per token, and a
    # 1024 vocabulary cannot reach a whole word per token.
    assert 1.5 < bpt < 5
    info = describe_tokenizer(tok, held_out, n_examples=2)
    assert info["vocab_size"] == 1024 and info["eos_id"] == find_eos_id(tok)
    examples = encode_examples(tok, held_out, n=2, max_chars=80)
    assert len(examples) == 2
    for ex, text in zip(examples, held_out, strict=False):
        assert ex["text"] == text[:80] and ex["decoded"] == ex["text"]
        assert len(ex["ids"]) == len(ex["tokens"])
    md = examples_markdown(examples)
    assert md.count("- text:") == 2 and "decoded" in md
    with pytest.raises(ValueError, match="non-empty"):
        bytes_per_token(tok, ["", ""])


def test_training_streams_its_input():
    """Training pulls texts batch by batch: Python never holds the corpus."""
    words = [
        "".join(random.Random(i).choices("abcdefghij", k=random.Random(i).randint(2, 8)))
        for i in range(2000)
    ]
    pulled = {"n": 0}

    def texts():
        r = random.Random(0)
        for _ in range(4000):
            pulled["n"] += 1
            yield " ".join(r.choices(words, k=180))

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        tok, info = train_bpe(texts(), BpeTrainingConfig(vocab_size=300, min_frequency=1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pulled["n"] == info["num_training_documents"] == 4000
    corpus = info["num_training_bytes"]
    assert corpus > 4_000_000
    assert peak < corpus / 4, f"peak Python memory {peak} for a {corpus}-byte corpus"
    assert tok.get_vocab_size() == 300


def test_training_options_are_honoured(tmp_path, shakespeare_docs):
    specials = ("<|endoftext|>", "<|pad|>")
    out = train_tokenizer(
        (d["text"][:20000] for d in shakespeare_docs),
        str(tmp_path / "t"),
        vocab_size=400,
        special_tokens=specials,
        min_frequency=5,
        max_documents=3,
    )
    tok = load_tokenizer(str(tmp_path / "t"))
    assert tok.get_vocab_size() == 400
    assert [tok.token_to_id(s) for s in specials] == [0, 1]
    assert out.config["num_training_documents"] == 3
    with pytest.raises(ValueError, match="too small"):
        BpeTrainingConfig(vocab_size=100)
    with pytest.raises(ValueError, match="must be one of special_tokens"):
        BpeTrainingConfig(special_tokens=("<pad>",))
    with pytest.raises(TypeError, match="not str"):
        train_bpe(iter([b"bytes"]), BpeTrainingConfig(vocab_size=300))
    with pytest.raises(ValueError, match="no training text"):
        train_bpe(iter([]), BpeTrainingConfig(vocab_size=300))


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerNotFoundError, match="no tokenizer at .*tokenizer.json"):
        load_tokenizer(str(tmp_path / "nowhere"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        load_tokenizer(str(bad))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hub_name_offline_fails_fast_and_says_what_to_change(monkeypatch):
    # The hub endpoint is a local port nobody listens on: unreachable for sure.
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    with pytest.raises(TokenizerHubUnreachableError) as e:
        load_tokenizer("gpt2")
    assert time.monotonic() - start < 30  # no five rounds of retries
    msg = str(e.value)
    assert "'gpt2'" in msg and "hub is unreachable" in msg
    assert "Set the tokenizer setting to a local path" in msg
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TokenizerHubUnreachableError, match="HF_HUB_OFFLINE is set"):
        load_tokenizer("meta-llama/Llama-3.1-8B")


def test_hub_name_when_the_hub_answers(monkeypatch, tmp_path, bpe_dir):
    """A hub that is reachable: a local HTTP server serving a repo's tokenizer.json as the hub does."""
    import http.server
    import threading

    body = open(os.path.join(bpe_dir, TOKENIZER_FILE), "rb").read()

    class Hub(http.server.BaseHTTPRequestHandler):
        def _send(self, with_body: bool) -> None:
            if not self.path.endswith("/tokenizer.json"):
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", '"abc123"')
            self.send_header("X-Repo-Commit", "0" * 40)
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_HEAD(self):  # noqa: N802
            self._send(False)

        def do_GET(self):  # noqa: N802
            self._send(True)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        # huggingface_hub reads the endpoint at import; point its constant here too.
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setattr(
            constants,
            "HUGGINGFACE_CO_URL_TEMPLATE",
            f"http://127.0.0.1:{server.server_port}" + "/{repo_id}/resolve/{revision}/{filename}",
        )
        tok = load_tokenizer("someone/tiny-bpe")
        assert isinstance(tok, Tokenizer)
        assert tok.get_vocab() == load_tokenizer(bpe_dir).get_vocab()
    finally:
        server.shutdown()


def test_save_and_load_on_gcs(gcs_prefix, shakespeare_docs):
    out = f"{gcs_prefix}/tok"
    saved = train_tokenizer((d["text"][:5000] for d in shakespeare_docs), out, vocab_size=300)
    assert saved.tokenizer_json == f"{out}/{TOKENIZER_FILE}"
    tok = load_tokenizer(out)
    assert tok.to_str() == saved.tokenizer.to_str()
    assert read_tokenizer_config(out)["vocab_size"] == 300


def test_train_from_files_holds_out_documents_for_bytes_per_token(
    tmp_path, shakespeare_shards, shakespeare_records
):
    from marin_dagster.tokenize import train_tokenizer_from_files
    from marin_dagster.tokenize.records import held_out

    out = train_tokenizer_from_files(
        shakespeare_shards,
        str(tmp_path / "t"),
        vocab_size=512,
        held_out_fraction=0.1,
        max_held_out_docs=5,
    )
    expected_held = [r for r in shakespeare_records if held_out(r["id"], 0.1)]
    cfg = json.loads((tmp_path / "t" / CONFIG_FILE).read_text())
    assert cfg == out.config
    assert cfg["num_training_documents"] == len(shakespeare_records) - len(expected_held)
    assert cfg["num_records"] == len(shakespeare_records) and cfg["num_bad"] == 0
    assert cfg["held_out_docs"] == min(5, len(expected_held)) > 0
    tok = load_tokenizer(str(tmp_path / "t"))
    held_texts = [r["text"] for r in expected_held[:5]]
    assert cfg["bytes_per_token"] == pytest.approx(bytes_per_token(tok, held_texts))
    assert [e["decoded"] for e in cfg["examples"]] == [t[:200] for t in held_texts[:3]]
