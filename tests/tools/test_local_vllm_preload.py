"""The CPU vLLM launcher's LD_PRELOAD of tcmalloc and Intel OpenMP: found, absent, and kept."""

from __future__ import annotations

import time
from pathlib import Path

from sidecar.tools.local_vllm import LocalVllmServer, LocalVllmSpec, ld_preload, preload_libraries


def _venv(root: Path, *, iomp: bool) -> Path:
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.write_text("", encoding="utf-8")
    (root / "lib").mkdir()
    if iomp:
        (root / "lib" / "libiomp5.so").write_bytes(b"\x7fELF")
    return python


def test_both_libraries_found(tmp_path: Path) -> None:
    tcmalloc = tmp_path / "libtcmalloc_minimal.so.4"
    tcmalloc.write_bytes(b"\x7fELF")
    python = _venv(tmp_path / "venv", iomp=True)
    found = preload_libraries(python, [tmp_path / "missing.so", tcmalloc])
    assert found == {"tcmalloc": tcmalloc, "iomp": tmp_path / "venv" / "lib" / "libiomp5.so"}
    assert ld_preload(found) == f"{tcmalloc}:{tmp_path / 'venv' / 'lib' / 'libiomp5.so'}"


def test_absent_libraries_are_left_out(tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv", iomp=False)
    found = preload_libraries(python, [tmp_path / "missing.so", tmp_path])  # a directory is no library
    assert found == {"tcmalloc": None, "iomp": None}
    assert ld_preload(found) == ""
    assert ld_preload(found, "/opt/x.so") == "/opt/x.so"


def test_the_callers_preload_is_kept_once_and_malformed_separators_ignored(tmp_path: Path) -> None:
    lib = tmp_path / "libiomp5.so"
    found: dict[str, Path | None] = {"tcmalloc": None, "iomp": lib}
    assert ld_preload(found, f"::/opt/a.so {lib}  /opt/b.so:") == f"{lib}:/opt/a.so:/opt/b.so"


def test_the_start_log_names_what_was_preloaded_and_what_was_absent(tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv", iomp=True)
    (tmp_path / "venv" / "bin" / "python").write_text(
        '#!/bin/sh\necho "child LD_PRELOAD=$LD_PRELOAD"\n', encoding="utf-8"
    )
    (tmp_path / "venv" / "bin" / "python").chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    server = LocalVllmServer(LocalVllmSpec(model_dir=model), tmp_path / "vllm.log", python=python)
    server.start()
    try:
        _exited(server)
        iomp = tmp_path / "venv" / "lib" / "libiomp5.so"
        assert server.preloaded["iomp"] == iomp
        lines = (tmp_path / "vllm.log").read_text(encoding="utf-8", errors="replace").splitlines()
        assert lines[0].startswith("sidecar launcher: LD_PRELOAD tcmalloc ")
        assert f"iomp {iomp}" in lines[0]
        child = next(line for line in lines if line.startswith("child LD_PRELOAD="))
        assert str(iomp) in child.split("=", 1)[1].split(":")
    finally:
        server.stop()
    off = LocalVllmServer(LocalVllmSpec(model_dir=model, preload=False), tmp_path / "off.log", python=python)
    off.start()
    try:
        _exited(off)
        assert off.preloaded == {}
        assert "sidecar launcher" not in (tmp_path / "off.log").read_text(encoding="utf-8")
        assert "libiomp5" not in (tmp_path / "off.log").read_text(encoding="utf-8")
    finally:
        off.stop()


def _exited(server: LocalVllmServer) -> None:
    deadline = time.monotonic() + 30
    while server.running and time.monotonic() < deadline:
        time.sleep(0.05)
