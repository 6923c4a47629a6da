"""Values that cannot run are refused when the experiment is defined, naming the asset and
field, instead of failing at run time after upstream steps ran."""

from __future__ import annotations

import dataclasses

import pytest

from assets import (
    Experiment,
    dataset_stats,
    deduplicated,
    evaluate,
    sample_corpus,
    tokenized,
    tokenizer,
    train_lm,
)
from marin_dagster.execution.asset import step_for
from marin_dagster.levanter import llama_nano


@pytest.fixture(scope="module")
def dataset():
    corpus = sample_corpus("raw/cfg")
    return tokenized(
        "tokenized/cfg",
        source=corpus,
        tokenizer=tokenizer("tokenizers/cfg", source=corpus, vocab_size=512),
    )


def _train(dataset, **config):
    config = {"batch_size": 4, "num_train_steps": 10, **config}
    return train_lm("checkpoints/cfg", model=llama_nano, datasets={dataset: 1.0}, **config)


@pytest.mark.parametrize(
    "field, value",
    [
        ("seq_len", 0),
        ("seq_len", -3),
        ("seq_len", 1),
        ("steps_per_eval", 0),
        ("checkpoint_every_steps", -1),
        ("checkpoint_every_steps", 0),
        ("keep", 0),
        ("max_eval_batches", 0),
        ("batch_size", 0),
        ("num_train_steps", 0),
    ],
)
def test_train_lm_refuses_values_that_cannot_run(dataset, field, value):
    with pytest.raises(ValueError) as err:
        _train(dataset, **{field: value})
    message = str(err.value)
    assert message.startswith("train_lm('checkpoints/cfg'): ") and field in message


@pytest.mark.parametrize(
    "field, value, message",
    [
        # each failed later without the field's name, in a comparison or in JAX
        ("seq_len", "128", "seq_len must be an integer or None, got str '128'"),
        ("seed", "1", "seed must be an integer, got str '1'"),
        ("steps_per_eval", "10", "steps_per_eval must be an integer or None, got str '10'"),
        ("keep", 1.5, "keep must be an integer or None, got float 1.5"),
        ("optimizer", {"learning_rate": 0.5}, "optimizer must be an AdamConfig, got dict"),
        ("steps_per_evl", 10, "unknown keyword 'steps_per_evl'; did you mean 'steps_per_eval'?"),
        (
            "learning_rate",
            1e-3,
            "learning_rate is an optimizer setting: pass optimizer=AdamConfig(",
        ),
        ("tokenizer_vocab_size", 99, "unknown keyword 'tokenizer_vocab_size'"),
    ],
)
def test_train_lm_names_the_field_of_a_wrong_value_or_keyword(dataset, field, value, message):
    with pytest.raises((ValueError, TypeError)) as err:
        _train(dataset, **{field: value})
    assert str(err.value).startswith(f"train_lm('checkpoints/cfg'): {message}"), str(err.value)


def test_a_misspelt_required_keyword_is_named_not_called_missing(dataset):
    """`num_train_step=30` was "missing 1 required keyword-only argument: 'num_train_steps'",
    which hid the typo."""
    with pytest.raises(TypeError) as err:
        train_lm(
            "checkpoints/cfg",
            model=llama_nano,
            datasets={dataset: 1.0},
            batch_size=4,
            num_train_step=30,
        )
    assert "unknown keyword 'num_train_step'; did you mean 'num_train_steps'?" in str(err.value)
    with pytest.raises(TypeError, match=r"^train_lm\('checkpoints/cfg'\): num_train_steps= is"):
        train_lm("checkpoints/cfg", model=llama_nano, datasets={dataset: 1.0}, batch_size=4)


def test_adam_config_names_a_field_given_as_text():
    from marin_dagster.levanter import AdamConfig

    for field in ("learning_rate", "weight_decay", "warmup"):
        with pytest.raises(ValueError, match=rf"AdamConfig.{field} must be a number, got str"):
            AdamConfig(**{field: "1e-3"})


@pytest.mark.parametrize(
    ("config", "keyword", "meant"),
    [
        ("AdamConfig", "learning_rat", "learning_rate"),
        ("LlamaConfig", "num_layer", "num_layers"),
        ("TrainerSettings", "checkpoint_every", "checkpoint_every_steps"),
        ("ResourceConfig", "replica", "replicas"),
    ],
)
def test_a_config_misspelt_in_an_experiment_file_gets_its_likely_keyword(config, keyword, meant):
    from marin_dagster.iris import ResourceConfig
    from marin_dagster.levanter import AdamConfig, LlamaConfig, TrainerSettings

    cls = {c.__name__: c for c in (AdamConfig, LlamaConfig, TrainerSettings, ResourceConfig)}[
        config
    ]
    with pytest.raises(TypeError, match=rf"^{config}: unknown keyword {keyword!r}") as raised:
        cls(**{keyword: 1})
    if meant:
        assert f"did you mean {meant!r}?" in str(raised.value)
    assert all(f.name in str(raised.value) for f in dataclasses.fields(cls) if f.init)


def test_a_pretrained_tokenizer_file_that_is_not_there_is_refused_when_defined():
    """The dry run listed the tokenizer step to run; the run then failed on the missing file."""
    corpus = sample_corpus("raw/cfg")
    for spec in ("/no/such/tokenizer.json", "./nowhere/tok.json"):
        with pytest.raises(ValueError, match=r"pretrained=.*: no tokenizer.json there"):
            tokenized("tokenized/cfg", source=corpus, tokenizer=spec)


def test_evaluate_refuses_a_split_no_token_cache_has(dataset):
    """ "valid" failed at run time as a cache "never built, or the build did not finish"."""
    with pytest.raises(ValueError, match=r"split: Input should be 'train' or 'validation'"):
        evaluate("eval/cfg", checkpoint=_train(dataset), datasets=[dataset], split="valid")


def test_a_token_cache_without_a_validation_split_is_refused_where_it_is_scored(dataset):
    """tokenized(validation=0) writes no validation split: train_lm dropped it from evals
    without a word, and evaluate failed at run time advising a rebuild that changed nothing.
    Scoring its train split stays allowed."""
    corpus = sample_corpus("raw/cfg")
    no_split = tokenized(
        "tokenized/cfg-v0",
        source=corpus,
        tokenizer=step_for(dataset).upstream["tokenizer"].asset,
        validation=0,
    )
    message = r"tokenized/cfg-v0 has no validation split \(tokenized with validation=0\)"
    with pytest.raises(ValueError, match=rf"^train_lm\('checkpoints/cfg'\): evals: {message}"):
        _train(dataset, evals=[no_split])
    model = _train(dataset)
    with pytest.raises(ValueError, match=rf"^evaluate\('eval/cfg'\): datasets: {message}.*'train'"):
        evaluate("eval/cfg", checkpoint=model, datasets=[no_split])
    evaluate("eval/cfg", checkpoint=model, datasets=[no_split], split="train")
    _train(dataset, evals=[dataset])


def test_one_asset_where_a_list_goes_is_refused_naming_the_argument(dataset):
    """`evals=ds` failed with Python's "'AssetsDefinition' object is not iterable"."""
    from assets import dataset_stats

    model = _train(dataset)
    for define, factory, field in [
        (lambda: _train(dataset, evals=dataset), r"train_lm\('checkpoints/cfg'\)", "evals"),
        (
            lambda: evaluate("eval/cfg", checkpoint=model, datasets=dataset),
            r"evaluate\('eval/cfg'\)",
            "datasets",
        ),
        (
            lambda: dataset_stats("stats/cfg", datasets=dataset),
            r"dataset_stats\('stats/cfg'\)",
            "datasets",
        ),
    ]:
        with pytest.raises(
            TypeError,
            match=rf"^{factory}: {field} takes a list of assets, got one asset \(tokenized/cfg\): "
            rf"put it in brackets, {field}=\[\.\.\.\]",
        ):
            define()
    with pytest.raises(TypeError, match=r"evals takes a list of assets, got a str"):
        _train(dataset, evals="tokenized/cfg")


def test_tokenizers_that_differ_between_datasets_and_evals_are_said_so(dataset):
    corpus = sample_corpus("raw/cfg")
    other = tokenized(
        "tokenized/cfg-other",
        source=corpus,
        tokenizer=tokenizer("tokenizers/cfg-other", source=corpus, vocab_size=300),
    )
    with pytest.raises(ValueError, match=r"the datasets and evals use 2 different tokenizers"):
        _train(dataset, evals=[other])


def test_train_lm_refuses_a_sequence_longer_than_the_model(dataset):
    with pytest.raises(ValueError, match=r"seq_len=99999 is above the model's maximum"):
        _train(dataset, seq_len=99999)


def test_train_lm_accepts_sane_values(dataset):
    asset = _train(dataset, seq_len=64, steps_per_eval=5, checkpoint_every_steps=5, keep=1)
    assert asset.key.path == ["checkpoints", "cfg_checkpoint"]


def test_evaluate_refuses_zero_batches(dataset):
    with pytest.raises(ValueError, match=r"(?s)^evaluate\('eval/cfg'\): .*max_batches"):
        evaluate("eval/cfg", checkpoint=_train(dataset), datasets=[dataset], max_batches=0)


def test_evaluate_refuses_a_dataset_of_another_tokenizer(dataset):
    """Its ids would mean other words to the model: a loss would come out, of nothing."""
    corpus = sample_corpus("raw/cfg")
    other = tokenized(
        "tokenized/cfg-300",
        source=corpus,
        tokenizer=tokenizer("tokenizers/cfg-300", source=corpus, vocab_size=300),
    )
    model = _train(dataset)
    with pytest.raises(ValueError) as err:
        evaluate("eval/cfg", checkpoint=model, datasets=[dataset, other])
    message = str(err.value)
    assert message.startswith("evaluate('eval/cfg'): tokenized/cfg-300 is tokenized with ")
    assert "tokenizers/cfg-300-" in message and "trained with tokenizers/cfg-" in message
    with pytest.raises(ValueError, match=r"checkpoint must be a train_lm\(...\) asset"):
        evaluate("eval/cfg", checkpoint=dataset, datasets=[dataset])
    with pytest.raises(ValueError, match=r"datasets must be tokenized\(...\) assets"):
        evaluate("eval/cfg", checkpoint=model, datasets=[corpus])


def test_a_model_given_by_name_is_refused_with_the_names_to_import(dataset):
    with pytest.raises(ValueError) as err:
        train_lm("checkpoints/cfg", model="llama_nan", datasets={dataset: 1.0}, batch_size=4,
                 num_train_steps=10)  # fmt: skip
    message = str(err.value)
    assert message.startswith("train_lm('checkpoints/cfg'): model must be a LlamaConfig")
    assert "'llama_nan'" in message and "import llama_nano, llama_150m" in message


def test_a_misspelt_keyword_names_the_factory_and_the_likely_field():
    corpus = sample_corpus("raw/cfg")
    with pytest.raises(ValueError) as err:
        tokenizer("tokenizers/cfg", source=corpus, vocab_sise=512)
    assert str(err.value).startswith(
        "tokenizer('tokenizers/cfg'): unknown keyword 'vocab_sise'; did you mean 'vocab_size'?"
    )
    with pytest.raises(ValueError) as err:
        tokenized("tokenized/cfg", source=corpus, tokenizer="gpt2", txt_key="t")
    assert str(err.value).startswith(
        "tokenized('tokenized/cfg'): unknown keyword 'txt_key'; did you mean 'text_key'?"
    )
    with pytest.raises(ValueError, match=r"^sample_corpus\('raw/cfg'\): unknown keyword 'edition'"):
        sample_corpus("raw/cfg", edition="folio")
    with pytest.raises(ValueError, match=r"^tokenizer\('t/x'\): vocab_size: .*integer.*'big'"):
        tokenizer("t/x", source=corpus, vocab_size="big")
    # it failed when the step ran, as "no training text: the source yielded no documents"
    for n in (0, -1):
        with pytest.raises(
            ValueError, match=rf"^tokenizer\('t/x'\): max_documents: .*1 \(got {n}\)"
        ):
            tokenizer("t/x", source=corpus, max_documents=n)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_perm", 0),
        ("num_perm", -1),
        ("seed", -1),
        ("cc_max_iterations", 0),
        ("threshold", 0.0),
        ("ngram", 0),
    ],
)
def test_deduplicated_refuses_values_that_cannot_run(field, value):
    with pytest.raises(ValueError) as err:
        deduplicated("dedup/cfg", source=sample_corpus("raw/cfg"), mode="fuzzy", **{field: value})
    assert str(err.value).startswith("deduplicated('dedup/cfg'): ") and field in str(err.value)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("threshold", "0.7", "threshold must be a float, got a str ('0.7')"),
        ("ngram", 2.5, "ngram must be an int, got a float (2.5)"),
        ("num_shards", True, "num_shards must be an int, got a bool (True)"),
        ("verify", "yes", "verify must be a bool, got a str ('yes')"),
        ("text_key", 3, "text_key must be a str, got an int (3)"),
    ],
)
def test_deduplicated_names_a_value_of_the_wrong_type(field, value, message):
    """threshold="0.7" failed with "'<' not supported between instances of 'float' and 'str'"."""
    with pytest.raises(TypeError) as err:
        deduplicated("dedup/cfg", source=sample_corpus("raw/cfg"), mode="fuzzy", **{field: value})
    assert str(err.value).startswith("deduplicated('dedup/cfg'): ") and message in str(err.value)


@pytest.mark.parametrize("mode", ["exact", "paragraph"])
def test_deduplicated_refuses_fuzzy_settings_in_other_modes(mode):
    """They change nothing but the version, which reran the dedup and all after it."""
    with pytest.raises(ValueError) as err:
        deduplicated("dedup/cfg", source=sample_corpus("raw/cfg"), mode=mode, threshold=0.7)
    assert str(err.value) == (
        f"deduplicated('dedup/cfg'): threshold only applies to mode='fuzzy', not {mode!r}: "
        "remove it, or set mode='fuzzy'"
    )
    # the defaults, given or not, are no setting: the version is that of the bare mode
    plain = deduplicated("dedup/cfg", source=sample_corpus("raw/cfg"), mode=mode)
    given = deduplicated("dedup/cfg", source=sample_corpus("raw/cfg"), mode=mode, threshold=0.8)
    assert plain.code_versions_by_key == given.code_versions_by_key


def test_deduplicated_refuses_max_chars_in_exact_mode():
    """Exact mode hashes every document whole: a limit there would only change the version."""
    with pytest.raises(ValueError) as err:
        deduplicated("dedup/cfg", source=sample_corpus("raw/cfg"), mode="exact", max_chars=50)
    assert str(err.value).startswith("deduplicated('dedup/cfg'): max_chars does nothing in ")
    assert "remove it" in str(err.value)
    paragraph = deduplicated("dedup/cfg", source=sample_corpus("raw/cfg"), mode="paragraph")
    limited = deduplicated(
        "dedup/cfg", source=sample_corpus("raw/cfg"), mode="paragraph", max_chars=50
    )
    assert paragraph.code_versions_by_key != limited.code_versions_by_key


@pytest.mark.parametrize(
    "case, define",
    [
        (
            "deduplicated('dedup/cfg'): source 'raw/cfg'",
            lambda dataset: deduplicated("dedup/cfg", source="raw/cfg"),
        ),
        (
            "tokenized('tokenized/cfg2'): tokenizer 512",
            lambda dataset: tokenized(
                "tokenized/cfg2", source=sample_corpus("raw/cfg"), tokenizer=512
            ),
        ),
        (
            "train_lm('checkpoints/cfg'): dataset 'tokenized/cfg'",
            lambda dataset: train_lm(
                "checkpoints/cfg",
                model=llama_nano,
                datasets={"tokenized/cfg": 1.0},
                batch_size=4,
                num_train_steps=10,
            ),
        ),
        (
            "evaluate('eval/cfg'): checkpoint 'checkpoints/cfg'",
            lambda dataset: evaluate("eval/cfg", checkpoint="checkpoints/cfg", datasets=[dataset]),
        ),
        (
            "dataset_stats('stats/cfg'): dataset 'raw/cfg'",
            lambda dataset: dataset_stats("stats/cfg", datasets=["raw/cfg"]),
        ),
        (
            "Experiment('cfg'): leaf 'tokenized/cfg'",
            lambda dataset: Experiment("cfg", leaves=["tokenized/cfg"]),
        ),
    ],
)
def test_a_name_where_a_step_goes_is_refused_naming_the_argument(dataset, case, define):
    """A step's name or a path given where its asset goes failed with Python's
    `'str' object has no attribute 'key'`, naming neither the factory nor the argument."""
    with pytest.raises(TypeError) as err:
        define(dataset)
    assert str(err.value).startswith(case + " (")
    assert "is not a step: pass what a factory returned" in str(err.value)


def test_train_lm_refuses_a_list_of_datasets(dataset):
    with pytest.raises(TypeError) as err:
        train_lm(
            "checkpoints/cfg",
            model=llama_nano,
            datasets=[dataset],
            batch_size=4,
            num_train_steps=10,
        )
    assert str(err.value) == (
        "train_lm('checkpoints/cfg'): datasets must map tokenized assets to their weights, "
        "e.g. datasets={tokens: 1.0}; got list"
    )


@pytest.mark.parametrize(
    "name, leaves, message",
    [
        ("my experiment!", "ok", "the name becomes the Dagster asset group and the job"),
        ("cfg", "none", "leaves is empty, so its job would build nothing"),
        ("cfg", "one", "leaves must list the steps to build, e.g. `leaves=[tokens]`; got Assets"),
    ],
)
def test_experiment_refuses_what_dagster_would_refuse_at_load(dataset, name, leaves, message):
    """`python exp.py` ran such an experiment while `dagster ... -f exp.py` failed to load it."""
    leaves = {"ok": [dataset], "one": dataset, "none": []}[leaves]
    with pytest.raises((TypeError, ValueError)) as err:
        Experiment(name, leaves=leaves)
    assert str(err.value).startswith(f"Experiment({name!r}): {message}"), str(err.value)
    if name == "my experiment!":
        assert "(e.g. 'my_experiment')" in str(err.value)


def test_names_dagster_reads_as_one_are_refused_naming_both_lines():
    """raw/a-b and raw/a_b are two outputs, but one op name to Dagster ('raw__a_b_raw'): the
    location failed to load with Dagster's "conflicting node definitions", naming no file."""
    first = sample_corpus("raw/a-b")
    second = sample_corpus("raw/a_b")
    with pytest.raises(ValueError) as err:
        Experiment("clash", leaves=[first, second])
    here = __file__
    message = str(err.value)
    assert message.startswith("Experiment('clash'): asset names 'raw/a-b' (at "), message
    assert f"{here}:" in message and "'raw/a_b' (at " in message
    assert "op 'raw__a_b_raw'" in message and message.endswith("rename one of them")
    # across two experiments of one location too
    from assets.location import build_definitions

    with pytest.raises(ValueError, match="are one name to Dagster"):
        build_definitions([Experiment("one", leaves=[first]), Experiment("two", leaves=[second])])


def test_two_datasets_of_one_name_in_a_mixture_are_refused(dataset):
    """The mixture goes by name: the second silently replaced the first."""
    corpus = sample_corpus("raw/cfg")
    other = tokenized(
        "tokenized/cfg",
        source=corpus,
        tokenizer=step_for(dataset).upstream["tokenizer"].asset,
        validation=0.2,
    )
    with pytest.raises(ValueError) as err:
        train_lm(
            "checkpoints/cfg",
            model=llama_nano,
            datasets={dataset: 1.0, other: 3.0},
            batch_size=4,
            num_train_steps=10,
        )
    assert str(err.value).startswith(
        "train_lm('checkpoints/cfg'): asset 'tokenized/cfg' is defined twice with different configs"
    ), str(err.value)
    with pytest.raises(ValueError, match=r"^dataset_stats\('stats/cfg'\): asset 'tokenized/cfg'"):
        dataset_stats("stats/cfg", datasets=[dataset, other])
