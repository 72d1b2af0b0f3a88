"""Onboarding's next step works as printed: the restart command, the default thread count, the paths.

The vLLM test runs the exact CPU command ``adapters onboard`` prints (``serving.serve`` builds it;
onboarding passes it through to its JSON result and report) in a shell, against the suite's vLLM
CPU install, with the committed base and adapter standing in for a newly onboarded one. Only the
port is changed, from vLLM's default 8000 to a free one, so that parallel runs cannot collide.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from adapters.onboarding.cli import bundled_artifacts, default_threads
from adapters.onboarding.onboard import ARTIFACTS
from adapters.serving import serving
from sidecar.tools.local_vllm import vllm_python
from sidecar.tools.ports import free_port

START_TIMEOUT_SECONDS = 420.0


def _commands(adapter: Path) -> tuple[str, str]:
    out = serving.serve(
        vllm_url=None,
        name="new-agent-0123abcd",
        adapter_dir=adapter,
        served_path=None,
        base=ARTIFACTS / "base",
        base_model_name="base",
        rank=8,
    )
    assert out["status"] == "not_requested"
    return out["restart_command"], out["restart_command_gpu"]


def test_cpu_command_uses_the_cpu_builds_interpreter_and_environment(tmp_path: Path) -> None:
    cpu, gpu = _commands(tmp_path / "adapter")
    words = shlex.split(cpu)
    assert words[:3] == ["VLLM_CPU_KVCACHE_SPACE=1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True", "VLLM_NO_USAGE_STATS=1"]
    assert words[3:6] == [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server"]
    assert words[words.index("--model") + 1] == str((ARTIFACTS / "base").resolve())
    assert words[words.index("--lora-modules") + 1] == f"new-agent-0123abcd={tmp_path / 'adapter'}"
    assert "vllm serve" not in cpu  # the CPU wheel's console script fails on its package metadata
    assert gpu.startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve ")
    assert str((ARTIFACTS / "base").resolve()) in gpu


def test_paths_come_from_the_checkout_the_command_runs_from(tmp_path: Path) -> None:
    assert bundled_artifacts(tmp_path) == ARTIFACTS  # not a checkout: the installed package's
    other = tmp_path / "other-clone"
    for part, name in (("base", "config.json"), ("completion", "adapter_config.json")):
        (other / "adapters" / "artifacts" / part).mkdir(parents=True)
        (other / "adapters" / "artifacts" / part / name).write_text("{}")
    assert bundled_artifacts(other) == (other / "adapters" / "artifacts").resolve()


@pytest.mark.parametrize(
    ("usable", "torch_threads", "load", "threads"),
    [
        (2, 2, 0.1, 2),  # an idle machine: every core
        (2, 2, 1.6, 1),  # a 2-core machine running other work: one thread, not two fighting it
        (2, 2, 7.0, 1),  # never fewer than one
        (16, 8, 2.2, 6),  # torch's one per physical core, less what is busy
        (4, 8, 0.0, 4),  # an affinity mask (a container's CPU set) caps it
    ],
)
def test_default_threads_leave_busy_cpus_alone(usable: int, torch_threads: int, load: float, threads: int) -> None:
    got, why = default_threads(torch_threads, usable=usable, load=load)
    assert got == threads
    assert f"load {load:.1f}" in why


@pytest.mark.vllm
@pytest.mark.slow
def test_the_printed_cpu_command_serves_the_new_adapter(tmp_path: Path) -> None:
    adapter = tmp_path / "onboarded" / "adapter"
    shutil.copytree(ARTIFACTS / "completion", adapter)
    cpu, _ = _commands(adapter)
    port = free_port()
    assert cpu.count(" --port 8000") == 1
    command = cpu.replace(" --port 8000", f" --port {port}")
    log_path = tmp_path / "vllm.log"
    # The user's environment, not the launcher's: nothing the printed command leaves out is set here.
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["bash", "-c", command], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        models = _wait_for_models(f"http://127.0.0.1:{port}", proc, log_path)
        assert {"base", "new-agent-0123abcd"} <= models
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "new-agent-0123abcd", "prompt": "hello", "max_tokens": 2, "logprobs": 5},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text[:500]
        assert answer.json()["model"] == "new-agent-0123abcd"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_for_models(root: str, proc: subprocess.Popen[bytes], log_path: Path) -> set[str]:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the printed command exited {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            reply = httpx.get(f"{root}/v1/models", timeout=5)
            if reply.status_code == 200:
                return {m["id"] for m in json.loads(reply.text)["data"]}
        except httpx.HTTPError:
            pass
        time.sleep(2)
    pytest.fail(f"no server after {START_TIMEOUT_SECONDS:.0f} s:\n{log_path.read_text()[-4000:]}")
