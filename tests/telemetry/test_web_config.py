"""The exporter-toolkit web-config file: what it accepts, and how it refuses bad, hostile or huge files."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import bcrypt
import pytest
from pydantic import ValidationError

from sidecar.errors import ConfigError
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.web_config import MAX_FILE_BYTES, load_web_config
from tests.support.tls import Pki, make_pki

# bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)), fixed: the test ids below contain it, and the
# two pytest-xdist workers must collect the same ids (a fresh salt per import would differ).
HASH = "$2b$04$0vQbtbq2w4ugjQpWe3GxceolUiHiopAr1QRbGMyoqhdA4eAJ51dyK"
assert bcrypt.checkpw(b"s3cret", HASH.encode())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "web.yml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _refused(tmp_path: Path, text: str | bytes, match: str) -> str:
    with pytest.raises(ConfigError, match=match) as info:
        load_web_config(_write(tmp_path, text))
    return str(info.value)


def test_a_full_file_is_read_with_relative_paths_from_its_folder(tmp_path: Path, pki: Pki) -> None:
    for path in (pki.server_cert, pki.server_key, pki.ca):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    config = load_web_config(
        _write(
            tmp_path,
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n"
            "  min_version: TLS13\n"
            f"basic_auth_users:\n  prometheus: '{HASH}'\n"
            "http_server_config:\n  http2: false\n  headers:\n    strict-transport-security: max-age=60\n"
            "    X-Frame-Options: DENY\n",
        )
    )
    assert config.tls is not None
    assert config.tls.cert_file == tmp_path / "server.crt"
    # As the toolkit: a client CA without an explicit client_auth_type demands verified certificates.
    assert config.tls.client_auth_type == "RequireAndVerifyClientCert"
    context = config.tls.ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert config.users == {"prometheus": HASH.encode()}
    assert config.headers == {"Strict-Transport-Security": "max-age=60", "X-Frame-Options": "DENY"}


@pytest.mark.parametrize("text", ["", "   \n", "{}\n", "tls_server_config: {}\n", "tls_server_config:\n"])
def test_an_empty_file_or_tls_section_serves_plain_http(tmp_path: Path, text: str) -> None:
    config = load_web_config(_write(tmp_path, text))
    assert config.tls is None
    assert not config.users
    assert not config.headers


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("- a\n- b\n", "the file: must be a mapping"),
        ("just a string\n", "the file: must be a mapping"),
        ("tls_config: {}\n", r"unknown key\(s\) 'tls_config'"),
        ("basic_auth_users: {}\nrate_limit: {}\n", "unknown key"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  bogus: 1\n", "tls_server_config: unknown key"),
        ("http_server_config:\n  headerz: {}\n", "http_server_config: unknown key"),
        ("tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "cipher_suites"),
        ("tls_server_config:\n  client_allowed_sans: [a]\n", "client_allowed_sans"),
        ("tls_server_config:\n  cert: '-----BEGIN'\n", "inline certificates"),
        ("tls_server_config: [a]\n", "tls_server_config: must be a mapping"),
        ("tls_server_config:\n  cert_file: 42\n  key_file: b\n", "cert_file: must be a string, not int"),
        ("tls_server_config:\n  cert_file: a\n", "key_file is required"),
        ("tls_server_config:\n  key_file: a\n", "cert_file is required"),
        ("tls_server_config:\n  min_version: TLS13\n", "cert_file and key_file are required"),
        ("basic_auth_users: [admin]\n", "basic_auth_users: must be a mapping"),
        ("basic_auth_users: admin\n", "basic_auth_users: must be a mapping"),
        ("basic_auth_users:\n  admin: 12\n", "not a bcrypt hash"),
        (f"basic_auth_users:\n  'a:b': '{HASH}'\n", "no ':' or control character"),
        (f"basic_auth_users:\n  \"a\\u0000b\": '{HASH}'\n", "no ':' or control character"),
        (f"basic_auth_users:\n  12: '{HASH}'\n", "user '12'"),
        (f"basic_auth_users:\n  '{'u' * 300}': '{HASH}'\n", "1-256 characters"),
        ("http_server_config:\n  http2: 'yes'\n", "http2: must be a boolean"),
        ("http_server_config:\n  headers: [a]\n", "headers: must be a mapping"),
        ("http_server_config:\n  headers:\n    Set-Cookie: a=b\n", "'Set-Cookie' cannot be set"),
        ("http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n", "one of nosniff"),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allow-from x\n", "one of deny, sameorigin"),
        ('http_server_config:\n  headers:\n    X-XSS-Protection: "1\\r\\nSet-Cookie: a=b"\n', "printable ASCII"),
        ("http_server_config:\n  headers:\n    X-XSS-Protection: 1\n", "printable ASCII"),
        ("tls_server_config: {cert_file: x, key_file: y, client_auth_type: RequireAnyClientCert}\n", "without verif"),
        ("tls_server_config: {cert_file: x, key_file: y, client_auth_type: RequestClientCert}\n", "without verif"),
        ("tls_server_config: {cert_file: x, key_file: y, client_auth_type: Maybe}\n", "client_auth_type: 'Maybe'"),
        (
            "tls_server_config: {cert_file: x, key_file: y, client_auth_type: RequireAndVerifyClientCert}\n",
            "needs client_ca_file",
        ),
        ("tls_server_config: {cert_file: x, key_file: y, min_version: SSL3}\n", "min_version: 'SSL3'"),
        ("tls_server_config: {cert_file: x, key_file: y, min_version: TLS13, max_version: TLS12}\n", "below"),
        ("a: !!python/object/apply:os.system ['true']\n", "not valid UTF-8 YAML"),
        ("a: [unclosed\n", "not valid UTF-8 YAML"),
        (b"basic_auth_users:\n  \xff\xfe: x\n", "not valid UTF-8 YAML"),
    ],
)
def test_malformed_files_are_refused_naming_the_key(tmp_path: Path, text: str | bytes, match: str) -> None:
    _refused(tmp_path, text, match)


def test_a_plain_password_in_place_of_a_hash_is_never_echoed(tmp_path: Path) -> None:
    message = _refused(tmp_path, "basic_auth_users:\n  admin: hunter2-plaintext\n", "not a bcrypt hash")
    assert "hunter2" not in message


def test_oversized_files_and_too_many_entries_are_refused(tmp_path: Path) -> None:
    _refused(tmp_path, "# " + "x" * MAX_FILE_BYTES + "\n", f"over {MAX_FILE_BYTES} bytes")
    users = "".join(f"  u{i}: '{HASH}'\n" for i in range(1001))
    _refused(tmp_path, "basic_auth_users:\n" + users, "over 1000 users")
    headers = "".join(f"    X-Custom-{i}: a\n" for i in range(17))
    _refused(tmp_path, "http_server_config:\n  headers:\n" + headers, "over 16 headers")
    _refused(tmp_path, f"http_server_config:\n  headers:\n    X-XSS-Protection: '{'a' * 5000}'\n", "at most 4096")


def test_an_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    bomb = "basic_auth_users:\n  " + "\n  ".join(lines) + "\n"
    started = time.monotonic()
    _refused(tmp_path, bomb, "not a bcrypt hash")
    assert time.monotonic() - started < 5.0


def test_unreadable_or_wrong_files_are_refused(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_web_config(tmp_path / "absent.yml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_web_config(tmp_path)  # a directory
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    for cert, key, match in [
        (tmp_path / "absent.crt", pki.server_key, "cannot load cert_file/key_file"),
        (garbage, pki.server_key, "cannot load cert_file/key_file"),
        (pki.server_cert, pki.client_key, "cannot load cert_file/key_file"),  # key of another certificate
    ]:
        _refused(tmp_path, f"tls_server_config: {{cert_file: '{cert}', key_file: '{key}'}}\n", match)
    files = f"cert_file: '{pki.server_cert}', key_file: '{pki.server_key}', client_ca_file: '{garbage}'"
    text = f"tls_server_config: {{{files}}}\n"
    _refused(tmp_path, text, "cannot load client_ca_file")


def test_listener_config_binds_one_port_or_two() -> None:
    single = HttpConfig().bindings()
    assert [(b.name, b.port, b.scrape_routes, b.operator_routes) for b in single] == [("scrape", 9108, True, True)]
    two = HttpConfig(operator={"port": 9109, "host": "127.0.0.1"}).bindings()
    assert [(b.name, b.host, b.port, b.scrape_routes, b.operator_routes) for b in two] == [
        ("scrape", "0.0.0.0", 9108, True, False),
        ("operator", "127.0.0.1", 9109, False, True),
    ]
    assert HttpConfig(operator={"enabled": False}).bindings()[0].operator_routes is False
    assert [b.name for b in HttpConfig(scrape={"enabled": False}, operator={"port": 9109}).bindings()] == ["operator"]
    assert HttpConfig(scrape={"port": 9200}).bindings()[0].port == 9200


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"operator": {"web_config_file": "w.yml"}}, "need http.operator.port"),
        ({"operator": {"host": "127.0.0.1"}}, "need http.operator.port"),
        ({"scrape": {"enabled": False}}, "set http.operator.port"),
        ({"operator": {"port": 9108}}, "is the scrape listener's port"),
        ({"scrape": {"bearer_token_sha256": ["not-a-digest"]}}, "64 lowercase hex"),
        ({"scrape": {"bearer_token_sha256": ["A" * 64]}}, "64 lowercase hex"),
        ({"scrape": {"bearer_token_sha256": ["a" * 64] * 65}}, "at most 64"),
        ({"scrape": {"tls": True}}, "Extra inputs are not permitted"),
        ({"auth_max_failures": 0}, "greater than or equal to 1"),
    ],
)
def test_listener_config_mistakes_say_what_to_change(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        HttpConfig.model_validate(fields)


def test_config_check_reads_the_web_config_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sidecar.cli import main

    web = _write(tmp_path, f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"http:\n  operator:\n    port: 9109\n    web_config_file: {web}\n")
    assert main(["config", "check", "--config", str(config)]) == 0
    web.write_text("basic_auth_users:\n  prometheus: plaintext-password\n")
    assert main(["config", "check", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"web config {web}: basic_auth_users.prometheus: not a bcrypt hash" in err
    assert "plaintext-password" not in err
