"""A throwaway PKI for TLS tests, made with the openssl command-line tool: a CA, a server
certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA (P-256 keys,
valid one day). A second, unrelated CA signs a client certificate the first CA does not trust."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path

    def client_context(self, *, with_cert: bool = False, stranger: bool = False) -> ssl.SSLContext:
        """A client context that trusts the CA, optionally presenting the client (or a stranger's) certificate."""
        context = ssl.create_default_context(cafile=self.ca)
        if with_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        if stranger:
            context.load_cert_chain(self.stranger_cert, self.stranger_key)
        return context


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr[-2000:]}")


def _ca(root: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "1", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=root,
    )  # fmt: skip


def _leaf(root: Path, name: str, ca: str, extensions: str) -> None:
    (root / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=root,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=root,
    )  # fmt: skip


def make_pki(root: Path) -> Pki:
    """Write the PKI under ``root``; fails the test with the install hint when openssl is missing."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is not installed: run `bash .ci/setup` (apt-get install openssl)")
    _ca(root, "ca")
    _ca(root, "stranger-ca")
    _leaf(root, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _leaf(root, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _leaf(root, "stranger", "stranger-ca", "extendedKeyUsage=clientAuth\n")
    return Pki(
        ca=root / "ca.crt",
        server_cert=root / "server.crt",
        server_key=root / "server.key",
        client_cert=root / "client.crt",
        client_key=root / "client.key",
        stranger_cert=root / "stranger.crt",
        stranger_key=root / "stranger.key",
    )
