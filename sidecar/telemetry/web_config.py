"""The web-config file of a listener, in the Prometheus exporter-toolkit format (``--web.config.file``).

The same keys and meaning as the toolkit's, so one file serves node_exporter, Prometheus and the
sidecar alike::

    tls_server_config:
      cert_file: /etc/sidecar/tls/tls.crt
      key_file: /etc/sidecar/tls/tls.key
      client_ca_file: /etc/sidecar/tls/ca.crt       # optional: mutual TLS
      client_auth_type: RequireAndVerifyClientCert  # default when client_ca_file is set
      min_version: TLS12                            # the default
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2b$12$...                        # bcrypt hashes (htpasswd -nBC 12 prometheus)

:func:`load_web_config` refuses, with a :class:`~sidecar.errors.ConfigError` that names the key,
any key the toolkit does not define, any value of the wrong type, and the toolkit keys the sidecar
cannot honour (cipher suite and curve lists, ``client_allowed_sans``, inline certificates, and the
two client-auth types that accept a certificate without verifying it, which Python's ``ssl`` module
cannot express and which authenticate nobody). Certificates and keys are loaded here, so an
unreadable or mismatched file stops the process at start rather than at the first handshake. No
cryptography is implemented here: TLS is the ``ssl`` module's, password hashes are ``bcrypt``'s.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from sidecar.errors import ConfigError

# A web-config file is a few lines plus maybe a few hundred users; anything bigger is a mistake or
# an attack on the parser (YAML alias bombs expand in memory, so the size is checked before parsing
# and the parsed tree is bounded too).
MAX_FILE_BYTES: Final = 256 * 1024
MAX_USERS: Final = 1000
MAX_HEADERS: Final = 16
MAX_NAME_CHARS: Final = 256

_TOP_KEYS: Final = frozenset({"tls_server_config", "http_server_config", "basic_auth_users"})
_TLS_KEYS: Final = frozenset(
    {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}
)
# Keys the toolkit defines that the sidecar cannot honour: refused by name rather than ignored.
_TLS_UNSUPPORTED: Final = {
    "cipher_suites": "Python's ssl module takes OpenSSL cipher strings, not Go's suite names",
    "curve_preferences": "Python's ssl module sets one curve, not a preference list",
    "prefer_server_cipher_suites": "the server's order is always preferred",
    "client_allowed_sans": "not supported: restrict clients with client_ca_file",
    "cert": "inline certificates are not supported: use cert_file",
    "key": "inline keys are not supported: use key_file",
}
_HTTP_KEYS: Final = frozenset({"headers", "http2"})
_VERSIONS: Final = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH: Final = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_CLIENT_AUTH_UNVERIFIED: Final = frozenset({"RequestClientCert", "RequireAnyClientCert"})
# The headers the toolkit lets a web-config file set, with the values it accepts (None: any).
_HEADER_VALUES: Final[Mapping[str, frozenset[str] | None]] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": frozenset({"nosniff"}),
    "X-Frame-Options": frozenset({"deny", "sameorigin"}),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
# bcrypt's modular-crypt form: $2a$, $2b$ or $2y$, a two-digit cost, 53 characters of salt+hash.
_BCRYPT_HASH: Final = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
_USER_NAME: Final = re.compile(r"^[^\x00-\x1f\x7f:]{1,256}$")
_HEADER_VALUE: Final = re.compile(r"^[\x20-\x7e]{0,4096}$")


@dataclass(frozen=True, slots=True)
class TlsServerConfig:
    """``tls_server_config``: the paths given and what they mean, already checked."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """A server context with the certificate loaded; ConfigError if a file cannot be used."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = _VERSIONS[self.min_version]
        if self.max_version is not None:
            context.maximum_version = _VERSIONS[self.max_version]
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls_server_config: cannot load cert_file/key_file: {exc}") from exc
        context.verify_mode = _CLIENT_AUTH[self.client_auth_type]
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"tls_server_config: cannot load client_ca_file: {exc}") from exc
        return context


@dataclass(frozen=True, slots=True)
class WebConfig:
    """One listener's web configuration: TLS, basic-auth users (bcrypt hashes) and extra headers."""

    tls: TlsServerConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


def load_web_config(path: Path) -> WebConfig:
    """Read and check a web-config file; ConfigError naming the file and key when it is invalid."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"web config {path}: cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"web config {path}: over {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
        tree = yaml.safe_load(text) if text.strip() else {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"web config {path}: not valid UTF-8 YAML: {type(exc).__name__}") from exc
    try:
        return parse_web_config(tree, base=path.parent)
    except ConfigError as exc:
        raise ConfigError(f"web config {path}: {exc}") from exc


def parse_web_config(tree: object, *, base: Path) -> WebConfig:
    """Check a parsed web-config tree; relative paths are taken from ``base`` (the file's folder),
    as the toolkit does."""
    top = _mapping(tree, "the file")
    tls = _tls(top.get("tls_server_config"), base)
    users = _users(top.get("basic_auth_users"))
    http = _mapping(top.get("http_server_config") or {}, "http_server_config", _HTTP_KEYS)
    if not isinstance(http.get("http2", True), bool):
        raise ConfigError("http_server_config.http2: must be a boolean")
    headers = _headers(http.get("headers"))
    return WebConfig(tls=tls, users=users, headers=headers)


def _mapping(value: object, where: str, keys: frozenset[str] = _TOP_KEYS) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a mapping, not {type(value).__name__}")
    unknown = [k for k in value if k not in keys]
    if unknown:
        shown = ", ".join(repr(str(k)[:MAX_NAME_CHARS]) for k in unknown[:5])
        raise ConfigError(f"{where}: unknown key(s) {shown}; known: {', '.join(sorted(keys))}")
    return value


def _tls(value: object, base: Path) -> TlsServerConfig | None:
    if isinstance(value, dict):
        for key, why in _TLS_UNSUPPORTED.items():
            if key in value:
                raise ConfigError(f"tls_server_config.{key}: {why}")
    tls = _mapping(value, "tls_server_config", _TLS_KEYS)
    for key, item in tls.items():
        if item is not None and not isinstance(item, str):
            raise ConfigError(f"tls_server_config.{key}: must be a string, not {type(item).__name__}")
    cert, key = tls.get("cert_file") or "", tls.get("key_file") or ""
    if not cert and not key:
        if any(tls.values()):
            raise ConfigError("tls_server_config: cert_file and key_file are required")
        return None  # as the toolkit: an empty section serves plain HTTP
    if not cert or not key:
        raise ConfigError(f"tls_server_config: {'key_file' if cert else 'cert_file'} is required with the other")
    ca = tls.get("client_ca_file") or None
    auth = tls.get("client_auth_type") or ("RequireAndVerifyClientCert" if ca else "NoClientCert")
    if auth in _CLIENT_AUTH_UNVERIFIED:
        raise ConfigError(
            f"tls_server_config.client_auth_type: {auth} accepts a certificate without verifying it; "
            "use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file"
        )
    if auth not in _CLIENT_AUTH:
        raise ConfigError(f"tls_server_config.client_auth_type: {str(auth)[:64]!r}; one of {', '.join(_CLIENT_AUTH)}")
    if auth != "NoClientCert" and ca is None:
        raise ConfigError(f"tls_server_config.client_auth_type: {auth} needs client_ca_file")
    min_version, max_version = _versions(tls)
    config = TlsServerConfig(
        cert_file=base / cert,
        key_file=base / key,
        client_ca_file=base / ca if ca else None,
        client_auth_type=auth,
        min_version=min_version,
        max_version=max_version,
    )
    config.ssl_context()  # a bad certificate, key or CA stops the process now, not at the first handshake
    return config


def _versions(tls: Mapping[str, Any]) -> tuple[str, str | None]:
    min_version, max_version = tls.get("min_version") or "TLS12", tls.get("max_version") or None
    for name, version in (("min_version", min_version), ("max_version", max_version)):
        if version is not None and version not in _VERSIONS:
            raise ConfigError(f"tls_server_config.{name}: {str(version)[:64]!r}; one of {', '.join(_VERSIONS)}")
    if max_version is not None and _VERSIONS[max_version] < _VERSIONS[min_version]:
        raise ConfigError("tls_server_config: max_version is below min_version")
    return min_version, max_version


def _users(value: object) -> dict[str, bytes]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"basic_auth_users: must be a mapping of user to bcrypt hash, not {type(value).__name__}")
    if len(value) > MAX_USERS:
        raise ConfigError(f"basic_auth_users: over {MAX_USERS} users")
    users = {}
    for user, hashed in value.items():
        if not isinstance(user, str) or not _USER_NAME.fullmatch(user):
            raise ConfigError(
                f"basic_auth_users: user {str(user)[:64]!r}: a name of 1-256 characters, no ':' or control character"
            )
        if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed):
            # Never echo the value: it may be a plain password pasted by mistake.
            raise ConfigError(f"basic_auth_users.{user}: not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters)")
        users[user] = hashed.encode("ascii")
    return users


def _headers(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"http_server_config.headers: must be a mapping, not {type(value).__name__}")
    if len(value) > MAX_HEADERS:
        raise ConfigError(f"http_server_config.headers: over {MAX_HEADERS} headers")
    headers = {}
    by_lower = {name.lower(): name for name in _HEADER_VALUES}
    for name, item in value.items():
        canonical = by_lower.get(str(name).lower())
        if canonical is None:
            raise ConfigError(
                f"http_server_config.headers: {str(name)[:64]!r} cannot be set; one of {', '.join(_HEADER_VALUES)}"
            )
        if not isinstance(item, str) or not _HEADER_VALUE.fullmatch(item):
            raise ConfigError(f"http_server_config.headers.{canonical}: printable ASCII, at most 4096 characters")
        allowed = _HEADER_VALUES[canonical]
        if allowed is not None and item.lower() not in allowed:
            raise ConfigError(f"http_server_config.headers.{canonical}: one of {', '.join(sorted(allowed))}")
        headers[canonical] = item
    return headers


__all__ = ["MAX_FILE_BYTES", "TlsServerConfig", "WebConfig", "load_web_config", "parse_web_config"]
