"""deploy/Dockerfile, linted: no container builder runs on the development and CI machines, so the
rules that matter are checked on the parsed file instead (hadolint's numbers where one applies).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.deploy.chart import DEPLOY, REPO

DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"
TRAINING_STACK = ("torch", "peft", "transformers")
SECRET_NAME = re.compile(r"(?i)(password|passwd|secret|token|api_?key|credential|private_?key)")
SECRET_FILE = re.compile(r"(?i)(^|/)(\.env|id_rsa|id_ed25519|\.netrc|\.npmrc|\.pypirc)$|\.(pem|key|p12)$")


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    name: str
    base: str  # the image, ARGs resolved, or an earlier stage's name
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def instructions(text: str) -> list[Instruction]:
    """Logical instructions: comments and blank lines dropped, continuation lines joined."""
    out: list[Instruction] = []
    pending = ""
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = n
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return out


def _resolve(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


@cache
def stages() -> dict[str, Stage]:
    return parse_stages(DOCKERFILE.read_text())


def parse_stages(text: str) -> dict[str, Stage]:
    global_args: dict[str, str] = {}
    out: dict[str, Stage] = {}
    current: Stage | None = None
    for ins in instructions(text):
        if ins.keyword == "ARG" and current is None:
            name, _, default = ins.args.partition("=")
            global_args[name] = default
        elif ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            assert len(words) == 3 and words[1].upper() == "AS", f"line {ins.line}: every stage is named"
            current = Stage(words[2], _resolve(words[0], global_args))
            out[current.name] = current
        else:
            assert current is not None, f"line {ins.line}: {ins.keyword} before the first FROM"
            current.instructions.append(ins)
    return out


def chain(name: str) -> list[Stage]:
    """A stage and the stages it is built FROM, nearest first."""
    out = []
    stage: Stage | None = stages()[name]
    while stage is not None:
        out.append(stage)
        stage = stages().get(stage.base)
    return out


def sources(name: str) -> set[str]:
    """Every stage whose content can reach ``name``: its FROM chain and COPY --from, transitively."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for stage in chain(current):
            todo.append(stage.name)
            for copy in stage.all("COPY"):
                m = re.search(r"--from=(\S+)", copy.args)
                if m and m.group(1) in stages():
                    todo.append(m.group(1))
    return seen


def runs(names: set[str]) -> str:
    return "\n".join(i.args for n in names for i in stages()[n].all("RUN"))


def test_stages_and_targets() -> None:
    names = list(stages())
    assert {"runtime", "adapters"} <= set(names)
    assert names[-1] == "runtime", "a build without --target must give the runtime image"


def test_base_images_are_pinned() -> None:
    for stage in stages().values():
        if stage.base in stages():
            continue
        image = stage.base
        assert "$" not in image, f"{stage.name}: unresolved {image}"
        pinned_digest = re.search(r"@sha256:[0-9a-f]{64}$", image)
        tag = image.rsplit("/", 1)[-1].partition(":")[2].partition("@")[0]
        pinned_version = re.match(r"\d+\.\d+\.\d+", tag)
        assert pinned_digest or pinned_version, f"{stage.name}: {image} is pinned by neither version nor digest"
        assert tag != "latest"


def test_runtime_has_no_training_stack() -> None:
    runtime = runs(sources("runtime"))
    for package in (*TRAINING_STACK, "[adapters]", "sentence-transformers"):
        assert package not in runtime, f"the runtime image installs {package}"
    assert "pip install --no-cache-dir --no-deps ." in runtime
    assert "--require-hashes --no-deps -r deploy/requirements/runtime.lock" in runtime
    adapters = runs(sources("adapters"))
    assert '".[adapters]"' in adapters
    assert "torch==" in adapters


def test_core_dependencies_exclude_the_training_stack() -> None:
    """What `pip install .` pulls into the runtime image: the training stack only comes with extras."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    for package in (*TRAINING_STACK, "sentence-transformers"):
        assert not re.search(rf"(^|[\s\"']){re.escape(package)}\b", core), package
    assert all(any(d.startswith(p) for d in project["optional-dependencies"]["adapters"]) for p in TRAINING_STACK)


@pytest.mark.parametrize("target", ["runtime", "adapters"])
def test_final_stages_run_as_a_non_root_user(target: str) -> None:
    users = [i.args for s in reversed(chain(target)) for i in s.all("USER")]
    assert users, f"{target} never sets USER"
    uid = users[-1]
    assert re.fullmatch(r"\d+(:\d+)?", uid), f"{target}: USER {uid} should be numeric (runAsNonRoot can check it)"
    assert int(uid.partition(":")[0]) != 0
    # Nothing after the USER line switches back or needs root.
    last = stages()[target].instructions
    tail = last[max(i for i, ins in enumerate(last) if ins.keyword == "USER") :]
    assert not [i for i in tail if i.keyword == "RUN"], f"{target}: RUN after USER"


def test_no_secrets_in_the_image() -> None:
    for stage in stages().values():
        for ins in stage.instructions:
            if ins.keyword in {"ENV", "ARG"}:
                for name in re.findall(r"(\w+)=", ins.args) or [ins.args.split()[0]]:
                    assert not SECRET_NAME.search(name), f"line {ins.line}: {name} looks like a secret"
            if ins.keyword in {"COPY", "ADD"}:
                for src in [w for w in ins.args.split() if not w.startswith("--")][:-1]:
                    assert not SECRET_FILE.search(src), f"line {ins.line}: copies {src}"
    # The build context starts empty and lets in only what the build needs (no .env, no keys).
    assert "*" in DOCKERIGNORE.read_text().splitlines()


def test_no_add_and_no_latest() -> None:
    """DL3020 (COPY, not ADD) and DL3007 (no latest)."""
    for stage in stages().values():
        assert not stage.all("ADD"), stage.name
        assert ":latest" not in stage.base


def test_pip_and_apt_hygiene() -> None:
    """DL3042 (pip --no-cache-dir); DL3008/DL3009/DL3015 for apt should it ever be used."""
    for stage in stages().values():
        for ins in stage.all("RUN"):
            for cmd in re.split(r"&&|;", ins.args):
                if re.search(r"\bpip\b.*\binstall\b", cmd):
                    assert "--no-cache-dir" in cmd, f"line {ins.line}: {cmd.strip()}"
                if "apt-get install" in cmd:
                    assert "--no-install-recommends" in cmd and "-y" in cmd, f"line {ins.line}"
                    assert "rm -rf /var/lib/apt/lists" in ins.args, f"line {ins.line}"
            assert not re.search(r"(^|&&|;)\s*cd\s", ins.args), f"line {ins.line}: use WORKDIR (DL3003)"
            assert "sudo " not in ins.args, f"line {ins.line}: DL3004"
        for ins in stage.all("WORKDIR"):
            assert ins.args.startswith("/"), f"line {ins.line}: DL3000"


@pytest.mark.parametrize("keyword", ["CMD", "ENTRYPOINT"])
def test_exec_form(keyword: str) -> None:
    """DL3025: JSON form, so signals reach the process (SIGTERM drains and commits)."""
    for target in ("runtime", "adapters"):
        found = [i for s in chain(target) for i in s.all(keyword)]
        assert found, f"{target} has no {keyword}"
        assert isinstance(json.loads(found[0].args), list)


def test_runtime_entrypoint_and_healthcheck() -> None:
    runtime = stages()["runtime"]
    assert json.loads(runtime.all("ENTRYPOINT")[0].args) == ["sidecar"]
    assert json.loads(runtime.all("CMD")[0].args) == ["run", "--config", "/etc/sidecar/sidecar.yaml"]
    checks = runtime.all("HEALTHCHECK")
    assert len(checks) == 1
    options, _, command = checks[0].args.partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    probe = json.loads(command)
    assert "/healthz" in " ".join(probe)
    assert runtime.all("EXPOSE")[0].args == "9108"


def test_copied_sources_exist_and_pass_the_dockerignore() -> None:
    kept = [line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")]
    for stage in stages().values():
        for ins in stage.all("COPY"):
            if "--from=" in ins.args:
                continue
            for src in ins.args.split()[:-1]:
                assert (REPO / src).exists(), f"line {ins.line}: {src} does not exist"
                path = src.rstrip("/")
                assert any(path == k or path.startswith(k + "/") for k in kept), (
                    f"line {ins.line}: the dockerignore drops {src}"
                )


def test_instruction_parser() -> None:
    parsed = instructions("# c\nFROM a:1.2.3 AS x\nRUN one \\\n  # inside\n  two\n\nUSER 1\n")
    assert [(i.keyword, i.args) for i in parsed] == [("FROM", "a:1.2.3 AS x"), ("RUN", "one two"), ("USER", "1")]


def test_documented_as_linted_not_built() -> None:
    readme = (DEPLOY / "README.md").read_text()
    assert "Not built in CI" in readme
    assert Path(__file__).name in readme


OCI_KEYS = ("title", "description", "source", "licenses", "version", "revision")


def _unquote(value: str) -> str:
    return shlex.split(value)[0] if value.strip() else ""


def _expand(value: str, scope: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: scope.get(m.group(1), ""), value)


def labels(text: str, target: str, build_args: dict[str, str] | None = None) -> dict[str, str]:
    """The labels of the image ``target`` of the Dockerfile ``text``, as a builder resolves them:
    a stage sees a global ARG only after declaring it (``ARG NAME``), and --build-arg values
    replace the defaults."""
    passed = build_args or {}
    global_args = {}
    for ins in instructions(text):
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            global_args[name] = _unquote(default)
    parsed = parse_stages(text)
    lineage = []
    stage: Stage | None = parsed[target]
    while stage is not None:
        lineage.append(stage)
        stage = parsed.get(stage.base)
    out: dict[str, str] = {}
    for stage in reversed(lineage):
        scope: dict[str, str] = {}
        for ins in stage.instructions:
            if ins.keyword == "ARG":
                name, sep, default = ins.args.partition("=")
                scope[name] = passed.get(name, _unquote(default) if sep else global_args.get(name, ""))
            elif ins.keyword == "LABEL":
                for pair in shlex.split(ins.args):
                    key, sep, value = pair.partition("=")
                    assert sep, f"line {ins.line}: LABEL {pair} is not key=value"
                    out[key] = _expand(value, scope)
    return out


@pytest.mark.parametrize("target", ["runtime", "adapters"])
def test_oci_labels(target: str) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((REPO / "helm" / "sidecar" / "Chart.yaml").read_text())
    text = DOCKERFILE.read_text()
    oci = {k.removeprefix("org.opencontainers.image."): v for k, v in labels(text, target).items()}
    assert set(OCI_KEYS) <= set(oci), f"{target} lacks {set(OCI_KEYS) - set(oci)}"
    assert all(oci[k] for k in OCI_KEYS if k != "revision"), oci
    assert oci["source"] == chart["home"]
    assert oci["licenses"] == project["license"] == chart["annotations"]["artifacthub.io/license"]
    # The version defaults to the project's; the commit has no default, so no image claims a stale one.
    assert oci["version"] == project["version"] == chart["appVersion"]
    assert oci["revision"] == ""
    commit = "0123456789abcdef0123456789abcdef01234567"
    built = labels(text, target, {"VERSION": "0.2.0rc1", "REVISION": commit})
    assert built["org.opencontainers.image.version"] == "0.2.0rc1"
    assert built["org.opencontainers.image.revision"] == commit
    # Declared after the last layer: a new commit changes the image config, never a layer's cache key.
    stage = stages()[target].instructions
    last_layer = max(i for i, ins in enumerate(stage) if ins.keyword in {"COPY", "RUN"})
    revision_args = [i for i, ins in enumerate(stage) if ins.keyword == "ARG" and ins.args.startswith("REVISION")]
    assert revision_args and min(revision_args) > last_layer


def test_oci_titles_and_descriptions_tell_the_images_apart() -> None:
    text = DOCKERFILE.read_text()
    runtime, adapters = labels(text, "runtime"), labels(text, "adapters")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    title, description = "org.opencontainers.image.title", "org.opencontainers.image.description"
    assert runtime[title] == project["name"] and adapters[title] == f"{project['name']}-adapters"
    assert runtime[description] == project["description"]
    assert adapters[description] != runtime[description]


def test_label_resolution() -> None:
    """As a builder: a global ARG is empty in a stage that does not declare it, a stage's own
    default applies, --build-arg wins, and a later stage inherits its base's labels."""
    text = (
        'ARG VERSION=1.0\nFROM a:1 AS x\nLABEL v="${VERSION}" k=x\n'
        'FROM x AS y\nARG VERSION\nARG NAME="n m"\nLABEL v="${VERSION}" n="$NAME"\n'
    )
    assert labels(text, "x") == {"v": "", "k": "x"}
    assert labels(text, "y") == {"v": "1.0", "k": "x", "n": "n m"}
    assert labels(text, "y", {"VERSION": "2.0", "NAME": 'quo"te'}) == {"v": "2.0", "k": "x", "n": 'quo"te'}
    with pytest.raises(AssertionError, match="not key=value"):
        labels("FROM a:1 AS x\nLABEL justakey\n", "x")


LOCK = DEPLOY / "requirements" / "runtime.lock"


def _locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, hashes) of the runtime lock."""
    out: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)", line)
        assert m, f"not a pinned, hashed requirement: {line[:120]}"
        out[canonical(m.group(1))] = (m.group(2), re.findall(r"sha256:([0-9a-f]{64})", m.group(3)))
    return out


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_runtime_lock_pins_every_dependency_with_hashes() -> None:
    """Every core dependency of pyproject.toml is pinned in the lock at a version its specifier
    allows, and every pin carries at least one sha256 (pip --require-hashes refuses the rest)."""
    from packaging.requirements import Requirement

    locked = _locked()
    assert locked, "empty lock"
    for name, (_, hashes) in locked.items():
        assert hashes, f"{name} has no hash"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"python_version": "3.11"}):
            continue
        pinned = locked.get(canonical(req.name))
        assert pinned is not None, f"{req.name} is a dependency but not in the lock: regenerate it"
        assert req.specifier.contains(pinned[0], prereleases=True), f"{req.name}=={pinned[0]} breaks {req.specifier}"
    for package in (*TRAINING_STACK, "sentence-transformers"):
        assert canonical(package) not in locked, f"the runtime lock holds {package}"


def test_the_lock_says_how_it_was_made_and_names_no_machine() -> None:
    text = LOCK.read_text()
    assert "pip-compile --generate-hashes" in text
    assert not re.search(r"(?m)^--(extra-)?index-url|^--find-links|file://|/home/|/root/", text)
    assert "deploy/requirements/runtime.lock" in (DEPLOY / "README.md").read_text()


def test_lock_parser_refuses_unpinned_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "runtime.lock"
    bad.write_text("aiohttp>=3 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    monkeypatch.setattr(sys.modules[__name__], "LOCK", bad)
    with pytest.raises(AssertionError, match="not a pinned"):
        _locked()
