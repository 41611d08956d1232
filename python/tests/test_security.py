"""The Python client against a secured local service (`granary run --serve --tls`): a trainer
holding the pipeline's token (as a file or a string) and the CA reads every element; one without
the token is refused; explicit arguments override the environment; bad credentials arguments
fail before anything is dialled, naming the argument or the path."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import granary
from granary.testing import LocalService, serve
from conftest import BATCH, EPOCHS, IMAGES, MANIFEST

#: The environment variables the client reads credentials and the dispatcher from.
CLIENT_ENV = ("GRANARY_DISPATCHER", "GRANARY_TOKEN", "GRANARY_TOKEN_FILE", "GRANARY_TLS_CA")


@pytest.fixture(autouse=True)
def no_client_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with the client's environment variables unset."""
    for name in CLIENT_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def secured(binary: str, demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    folder = tmp_path_factory.mktemp("secured")
    manifest = folder / "pipeline.yaml"
    manifest.write_text(MANIFEST.format(data=demo_data, batch=BATCH, epochs=EPOCHS))
    log = folder / "granary.log"
    try:
        service = serve(binary, manifest, workers=1, options=["--tls"], log=log)
    except RuntimeError as error:
        pytest.fail(str(error))
    try:
        if service.tls_ca is None or service.token_file is None:
            pytest.fail(f"`granary run --serve --tls` named no tls_ca or token_file: {service}")
        yield service
    finally:
        service.stop()


def test_a_trainer_with_the_token_file_and_the_ca_reads_every_element_once(secured):
    per_epoch: dict[int, list[str]] = collections.defaultdict(list)
    with granary.Pipeline(
        secured.pipeline,
        secured.dispatcher,
        job="token-file",
        token_file=secured.token_file,
        tls_ca=Path(secured.tls_ca),
    ) as pipeline:
        for batch in pipeline:
            assert batch["image"].shape == (batch.rows, 32, 32, 3)
            per_epoch[batch.epoch].extend(batch.element_keys)
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, keys in per_epoch.items():
        duplicated = [key for key, count in collections.Counter(keys).items() if count > 1]
        assert not duplicated, f"epoch {epoch}: delivered twice: {duplicated}"
        assert len(keys) == IMAGES, f"epoch {epoch}: {len(keys)} of {IMAGES} elements"


def test_a_trainer_without_the_token_is_refused(secured):
    pipeline = granary.Pipeline(secured.pipeline, secured.dispatcher, job="anonymous", tls_ca=secured.tls_ca)
    with pytest.raises(granary.RequestRefused, match="no credentials") as raised:
        next(pipeline)
    assert raised.value.code == "Unauthenticated"


def test_a_wrong_token_is_refused(secured):
    pipeline = granary.Pipeline(
        secured.pipeline, secured.dispatcher, job="forged", token="gr1.trainer.forged", tls_ca=secured.tls_ca
    )
    with pytest.raises(granary.RequestRefused) as raised:
        next(pipeline)
    assert raised.value.code == "Unauthenticated"


def test_explicit_arguments_override_the_environment(secured, monkeypatch, tmp_path):
    monkeypatch.setenv("GRANARY_TOKEN", "gr1.trainer.wrong")
    monkeypatch.setenv("GRANARY_TLS_CA", str(tmp_path / "no-such-ca.crt"))
    token = Path(secured.token_file).read_text()
    with granary.Pipeline(
        secured.pipeline, secured.dispatcher, job="explicit", token=token, tls_ca=secured.tls_ca
    ) as pipeline:
        assert next(pipeline).rows == BATCH


def test_the_token_file_and_the_ca_come_from_the_environment(secured, monkeypatch):
    monkeypatch.setenv("GRANARY_TOKEN_FILE", secured.token_file)
    monkeypatch.setenv("GRANARY_TLS_CA", secured.tls_ca)
    with granary.Pipeline(secured.pipeline, secured.dispatcher, job="from-env") as pipeline:
        assert next(pipeline).rows == BATCH


def test_token_and_token_file_together_are_refused():
    with pytest.raises(ValueError, match="token and token_file are both given") as raised:
        granary.Pipeline("p", "127.0.0.1:1", token="t", token_file="/dev/null")
    assert isinstance(raised.value, granary.ConfigurationError)


@pytest.mark.parametrize(("arguments", "field"), [({"token": ""}, "token"), ({"tls_ca": 3}, "tls_ca")])
def test_bad_credential_arguments_name_the_field(arguments, field):
    with pytest.raises(granary.ConfigurationError, match=f"^{field}:"):
        granary.Pipeline("p", "127.0.0.1:1", **arguments)


@pytest.mark.parametrize("argument", ["token_file", "tls_ca"])
def test_an_unreadable_file_is_an_error_naming_its_path(argument, tmp_path):
    missing = tmp_path / f"missing-{argument}"
    # Port 1 on loopback: the file is read before anything is dialled.
    pipeline = granary.Pipeline("p", "127.0.0.1:1", **{argument: missing})
    with pytest.raises(granary.ConfigurationError, match=re.escape(str(missing))):
        next(pipeline)


def test_an_empty_token_file_is_an_error_naming_its_path(tmp_path):
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    with pytest.raises(granary.ConfigurationError, match=f"{re.escape(str(empty))}.*is empty"):
        next(granary.Pipeline("p", "127.0.0.1:1", token_file=empty))


def test_the_token_stays_out_of_the_repr():
    pipeline = granary.Pipeline("p", "127.0.0.1:1", token="gr1.trainer.secret")
    assert "secret" not in repr(pipeline)
