"""`marin export-hf` of a model an experiment file trained: the folder holds the tokenizer it
was trained with (config.json names its special tokens), and what cannot be done is said."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from tokenizers import Tokenizer, processors

from marin_dagster.execution.instance import ensure_home
from marin_dagster.tokenize import train_tokenizer
from tests.cli.test_cli import in_process, marin
from tests.conftest import REPO, subprocess_env

EXPERIMENT = """
import dataclasses

from assets import Experiment, dataset, tokenized, tokenizer, train_lm
from marin_dagster.levanter import llama_nano

TINY = dataclasses.replace(
    llama_nano, seq_len=32, hidden_dim=16, intermediate_dim=32, num_layers=1
)
notes = dataset("raw/notes", {source!r})
tok = tokenizer("tokenizers/notes", source=notes, vocab_size=300)
ds = tokenized("tokenized/notes", source=notes, tokenizer=tok)
model = train_lm(
    "checkpoints/notes",
    model=TINY,
    datasets={{ds: 1.0}},
    batch_size=2,
    seq_len=32,
    num_train_steps=4,
    checkpoint_every_steps=2,
)

if __name__ == "__main__":
    Experiment("notes", leaves=[model]).materialize()
"""

WORDS = "to be or not that is the question whether tis nobler in mind suffer".split()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Any]:
    """An experiment file's tiny model, trained as a user runs it: `python exp.py`."""
    root = tmp_path_factory.mktemp("export")
    source = root / "notes.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": i, "text": " ".join(WORDS[(i + j) % len(WORDS)] for j in range(60))})
            + "\n"
            for i in range(60)
        )
    )
    exp = root / "exp.py"
    exp.write_text(EXPERIMENT.format(source=str(source)))
    env = {"MARIN_PREFIX": str(root / "data"), "DAGSTER_HOME": ensure_home(str(root / "home"))}
    run = subprocess.run(
        [sys.executable, str(exp)],
        env=subprocess_env(**env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    status = marin("status", "--json", "-f", str(exp), env=env, cwd=str(root))
    rows = {r["asset"]: r for r in json.loads(status.stdout)}
    assert all(r["status"] == "SUCCESS" for r in rows.values()), rows
    return {
        "root": root,
        "exp": str(exp),
        "env": env,
        "output": rows["checkpoints/notes"]["output"],
        "tokenizer": rows["tokenizers/notes"]["output"],
    }


def _json(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def test_a_checkpoint_step_exports_with_its_tokenizer_and_no_orbax_noise(trained, tmp_path):
    out = str(tmp_path / "hf")
    step = os.path.join(trained["output"], "checkpoints", "4")
    done = marin("export-hf", step, out, "-f", trained["exp"], env=trained["env"], cwd=REPO)
    assert done.returncode == 0, done.stderr
    # the train output's own copy of its tokenizer
    assert f"with the tokenizer of {trained['output']}" in done.stdout
    assert "_CHECKPOINT_METADATA" not in done.stderr and "no tokenizer" not in done.stderr

    original = os.path.join(trained["tokenizer"], "tokenizer.json")
    with open(original, "rb") as a, open(os.path.join(out, "tokenizer.json"), "rb") as b:
        assert a.read() == b.read()
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    assert eos is not None
    # What transformers' AutoTokenizer reads: the class, the special tokens, the length.
    assert _json(os.path.join(out, "tokenizer_config.json")) == {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "model_max_length": 32,
    }
    assert _json(os.path.join(out, "special_tokens_map.json")) == {"eos_token": "<|endoftext|>"}
    config = _json(os.path.join(out, "config.json"))
    assert (config["bos_token_id"], config["eos_token_id"]) == (None, eos)
    assert config["vocab_size"] >= tok.get_vocab_size()


def test_an_output_carries_its_tokenizer_and_an_older_one_is_found_by_its_step(
    trained, tmp_path, capsys, monkeypatch
):
    """A train output holds a copy of its tokenizer: no experiment file is needed. One
    written before it did is found through the experiment file's train_lm step, or the
    export says why it has no tokenizer."""
    code, stdout, err = in_process(
        capsys, monkeypatch, "export-hf", trained["output"], str(tmp_path / "hf"),
        env=trained["env"],
    )  # fmt: skip
    assert code == 0 and f"with the tokenizer of {trained['output']}" in stdout, err
    assert "no tokenizer" not in err

    # An output from before the copy, in a prefix of its own (a copy of the whole prefix).
    data = os.path.dirname(os.path.dirname(trained["output"]))
    shutil.copytree(data, tmp_path / "data")
    older = tmp_path / "data" / os.path.relpath(trained["output"], data)
    os.remove(older / "tokenizer.json")
    out = str(tmp_path / "hf-older")
    code, stdout, err = in_process(capsys, monkeypatch, "export-hf", str(older), out,
                                   env=trained["env"])  # fmt: skip
    assert code == 0 and out in stdout, err
    assert (
        "marin export-hf: no tokenizer written (config.json's bos/eos_token_id are null): "
        f"no train_lm step of the code location (marin_dagster.definitions) writes "
        f"{older}; name the experiment file that trained it with -f, or give the "
        "tokenizer with --tokenizer DIR"
    ) in err
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    assert _json(os.path.join(out, "config.json"))["eos_token_id"] is None

    # with the experiment file, its train_lm step names the tokenizer beside the output
    tokenizer = tmp_path / "data" / os.path.relpath(trained["tokenizer"], data)
    export = ("export-hf", str(older), "-f", trained["exp"])
    code, stdout, err = in_process(
        capsys, monkeypatch, *export[:2], str(tmp_path / "hf2"), *export[2:], env=trained["env"]
    )
    assert code == 0 and f"with the tokenizer of {tokenizer}" in stdout, err
    shutil.rmtree(tokenizer)
    code, _, err = in_process(
        capsys, monkeypatch, *export[:2], str(tmp_path / "hf3"), *export[2:], env=trained["env"]
    )
    assert code == 0
    assert "no tokenizer written" in err and "its tokenizer tokenizers/notes (version" in err
    assert f"no tokenizer.json at {tokenizer}; materialize it, or give --tokenizer" in err


def test_a_tokenizer_given_by_hand_with_a_bos_token(trained, tmp_path, capsys, monkeypatch):
    """A template that puts <s> before every encoding: <s> is the BOS config.json names. Its
    <unk> and <pad> are named too: transformers reads them from the config only."""
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5
    saved = train_tokenizer(
        texts,
        str(tmp_path / "tok"),
        vocab_size=280,
        special_tokens=("<s>", "</s>", "<unk>", "<pad>"),
        eos_token="</s>",
    )
    tok = saved.tokenizer
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    tok.model.unk_token = "<unk>"
    tok.save(saved.tokenizer_json)

    out = str(tmp_path / "hf")
    args = ["export-hf", trained["output"], out, "--tokenizer", saved.path]
    code, stdout, err = in_process(capsys, monkeypatch, *args, env=trained["env"])
    assert code == 0 and f"with the tokenizer of {saved.path}" in stdout, err
    config = _json(os.path.join(out, "config.json"))
    assert (config["bos_token_id"], config["eos_token_id"]) == (bos, eos)
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    assert _json(os.path.join(out, "special_tokens_map.json")) == special
    assert special.items() <= _json(os.path.join(out, "tokenizer_config.json")).items()


def test_paths_that_are_not_there_are_named(trained, tmp_path, capsys, monkeypatch):
    nowhere = str(tmp_path / "nowhere")
    code, _, err = in_process(
        capsys, monkeypatch, "export-hf", nowhere, str(tmp_path / "hf"), env=trained["env"]
    )
    assert code == 1
    assert err.startswith(f"marin export-hf: {nowhere} does not exist; give a train output")
    assert not os.path.exists(tmp_path / "hf")

    args = ["export-hf", trained["output"], str(tmp_path / "hf"), "--tokenizer", nowhere]
    code, _, err = in_process(capsys, monkeypatch, *args, env=trained["env"])
    assert code == 1 and f"marin export-hf: no tokenizer at {nowhere}/tokenizer.json" in err
    assert not os.path.exists(tmp_path / "hf")

    big = train_tokenizer(
        [" ".join(f"w{i}x{j}" for j in range(400)) for i in range(400)],
        str(tmp_path / "big"),
        vocab_size=600,
        min_frequency=1,
    )
    args = ["export-hf", trained["output"], str(tmp_path / "hf"), "--tokenizer", big.path]
    code, _, err = in_process(capsys, monkeypatch, *args, env=trained["env"])
    assert code == 1 and "it is not the tokenizer the model was trained with" in err, err


def test_a_model_trained_with_an_eos_of_another_name_exports_it(tmp_path):
    """tokenized(eos_token="<|im_end|>"): the documents the model saw end with <|im_end|>, and
    config.json names it (null, generation would never stop)."""
    import dataclasses

    import dagster as dg

    from assets import dataset, tokenized, tokenizer, train_lm
    from marin_dagster.levanter import llama_nano
    from marin_dagster.levanter.hf import export_hf
    from marin_dagster.tokenize.tokenizer import train_tokenizer
    from resources import local_resources

    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5
    saved = train_tokenizer(texts, str(tmp_path / "tok"), vocab_size=280)
    saved.tokenizer.add_special_tokens(["<|im_end|>"])
    saved.tokenizer.save(str(tmp_path / "im_end.json"))
    im_end = saved.tokenizer.token_to_id("<|im_end|>")
    src = tmp_path / "notes.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))

    raw = dataset("raw/im-end-train", str(src))
    tok = tokenizer("tokenizers/im-end-train", pretrained=str(tmp_path / "im_end.json"))
    ds = tokenized(
        "tokenized/im-end-train", source=raw, tokenizer=tok, validation=0.0, eos_token="<|im_end|>"
    )
    tiny = dataclasses.replace(
        llama_nano, seq_len=16, hidden_dim=16, intermediate_dim=32, num_layers=1
    )
    model = train_lm(
        "checkpoints/im-end", model=tiny, datasets={ds: 1.0}, batch_size=2, num_train_steps=2
    )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw, tok, ds, model],
            instance=instance,
            resources=local_resources(str(tmp_path / "data")),
        )
    assert result.success
    output = result.asset_materializations_for_node(model.op.name)[0].metadata["path"].value
    out = export_hf(output, str(tmp_path / "hf"), tokenizer=output)
    assert _json(os.path.join(out, "config.json"))["eos_token_id"] == im_end
    assert _json(os.path.join(out, "special_tokens_map.json")) == {"eos_token": "<|im_end|>"}
