"""The deployment files: the Dockerfile, docker-compose.yml, .env.example, the GCP scripts and
systemd units. There is no container engine or cloud here, so the files are parsed and checked
against the code, and the container's own command line is run against MariaDB.
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import fresh_mysql_database
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SETTING = re.compile(r"MARKET_[A-Z0-9_]*[A-Z0-9]")  # a trailing "_" is a prefix, not a name
SKIPPED_DIRS = {"tests", "build", "dist", "node_modules"}
SERVERS = {"buyer": "MARKET_BUYER_PORT", "seller": "MARKET_SELLER_PORT"}
UNITS = ROOT / "deploy" / "gcp" / "systemd"
INSTALLED_ON_THE_VM = re.compile(
    r"Command (/opt/market/|/usr/local/bin/cloud-sql-proxy)\S* is not executable")


# ---- reading the files ----

def python_files() -> Iterator[Path]:
    """The project's own .py files, tests and hidden folders (.venv) left out."""
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts[:-1]
        if not any(part.startswith(".") or part in SKIPPED_DIRS for part in parts):
            yield path


def settings_read_in_code() -> dict[str, Path]:
    """Every MARKET_* name in a string literal of the code, with a file that has it."""
    found: dict[str, Path] = {}
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in SETTING.findall(node.value):
                    found.setdefault(name, path)
    return found


ENTRY = re.compile(r"(?P<off># ?)?(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)")


def env_example() -> dict[str, tuple[str | None, str]]:
    """.env.example as name -> (value, the comment right above it). A setting without a fixed
    default is listed commented out (`# NAME=example`); its value is None."""
    entries: dict[str, tuple[str | None, str]] = {}
    comment: list[str] = []
    for line in (ROOT / ".env.example").read_text(encoding="utf-8").splitlines():
        entry = ENTRY.fullmatch(line)
        if entry:
            name = entry["name"]
            assert name not in entries, f".env.example lists {name} twice"
            entries[name] = (None if entry["off"] else entry["value"], " ".join(comment).strip())
            comment = []
        elif line.startswith("#"):
            comment.append(line.lstrip("# "))
        else:
            comment = []
    return entries


def env_example_values() -> dict[str, str]:
    """The settings .env.example sets (those not commented out)."""
    return {name: value for name, (value, _) in env_example().items() if value is not None}


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))


def interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default} and $$."""
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, default = match.group("name"), match.group("op"), match.group("default") or ""
        if op == ":-":
            return variables.get(name) or default
        if op == "-":
            return variables.get(name, default)
        return variables.get(name, "")

    return re.sub(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?-)(?P<default>[^}]*))?\}", one, value)


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile as (INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        instructions.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    return instructions


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in dockerfile():
        if keyword == "ENV":
            env.update(pair.split("=", 1) for pair in shlex.split(args))
    return env


def exec_form(keyword: str) -> list[str]:
    """CMD or ENTRYPOINT of the Dockerfile in exec (JSON) form; [] when absent."""
    args = [args for kw, args in dockerfile() if kw == keyword]
    return yaml.safe_load(args[-1]) if args else []


def unit(name: str) -> dict[str, list[str]]:
    """A systemd unit as key -> values (keys may repeat)."""
    keys: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text(encoding="utf-8").splitlines():
        if "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def shell_scripts() -> list[Path]:
    scripts = [*sorted((ROOT / "deploy").rglob("*.sh")), *sorted((ROOT / "scripts").glob("*.sh"))]
    return [*scripts, ROOT / ".ci" / "run"]


def require_tool(name: str) -> str:
    """The tool's path; skip without it, except under CI=true, where it must be there."""
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is not installed (apt-get install -y {name})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true requires {name}: {reason}")
        pytest.skip(reason)
    return path


# ---- .env.example against the code ----

def test_every_setting_read_in_code_is_listed_in_env_example() -> None:
    missing = {name: str(path.relative_to(ROOT)) for name, path in settings_read_in_code().items()
               if name not in env_example()}
    assert not missing, f"read in code but missing from .env.example: {missing}"


def test_every_setting_in_env_example_is_read_somewhere() -> None:
    in_code = settings_read_in_code()
    compose_text = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    unread = [name for name in env_example()
              if name not in in_code and not (not name.startswith("MARKET_") and name in compose_text)]
    assert not unread, f"listed in .env.example but read nowhere: {unread}"


def test_every_setting_in_env_example_has_a_comment_and_its_default() -> None:
    for name, (value, comment) in env_example().items():
        assert comment, f".env.example: {name} has no comment above it"
        assert value or "default" in comment, f".env.example: {name} shows no default"


def test_env_example_values_are_the_defaults_of_the_servers_and_client(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from client.main import build_parser
    from wire.config import server_settings

    monkeypatch.chdir(tmp_path)
    for name in env_example():
        monkeypatch.delenv(name, raising=False)
    defaults = [server_settings(role, []) for role in SERVERS], build_parser().parse_args(["serve"])
    for name, value in env_example_values().items():
        monkeypatch.setenv(name, value)
    assert ([server_settings(role, []) for role in SERVERS], build_parser().parse_args(["serve"])) == defaults


# ---- the Dockerfile ----

def test_the_image_is_slim_python_runs_as_a_user_and_installs_from_pyproject() -> None:
    instructions = dockerfile()
    keywords = [kw for kw, _ in instructions]
    base = next(args for kw, args in instructions if kw == "FROM")
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base), base
    user = [args for kw, args in instructions if kw == "USER"]
    assert user and user[-1] not in ("root", "0"), "the image must run as a non-root user"
    assert keywords.index("USER") < keywords.index("CMD")
    assert any(kw == "COPY" and "pyproject.toml" in args for kw, args in instructions)
    assert any(kw == "RUN" and "pip install" in args for kw, args in instructions)


def test_the_image_health_check_pings_through_market_health() -> None:
    check = [args for kw, args in dockerfile() if kw == "HEALTHCHECK"]
    assert check and "CMD market health 127.0.0.1:" in check[-1].replace('"', "")


def test_the_image_command_is_a_server_of_this_project() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    command = exec_form("ENTRYPOINT") + exec_form("CMD")
    assert command and command[0] in scripts, command


# ---- docker-compose.yml ----

def test_compose_runs_mysql_8_with_a_volume_and_a_tcp_health_check() -> None:
    db = compose()["services"]["db"]
    assert re.fullmatch(r"mysql:8[\d.]*", db["image"])
    assert any(volume.endswith(":/var/lib/mysql") for volume in db["volumes"])
    assert db["volumes"][0].split(":")[0] in compose()["volumes"]
    check = " ".join(db["healthcheck"]["test"])
    assert "mysqladmin ping" in check and "-h 127.0.0.1" in check


def test_compose_mysql_buffer_pool_is_set_from_env_example() -> None:
    command = compose()["services"]["db"]["command"]
    default = env_example_values()["MYSQL_BUFFER_POOL_SIZE"]
    assert command == [f"--innodb-buffer-pool-size=${{MYSQL_BUFFER_POOL_SIZE:-{default}}}"]
    assert re.fullmatch(r"\d+[MG]", default)


@pytest.mark.parametrize("role", SERVERS)
def test_compose_servers_wait_for_the_database_and_publish_their_port(role: str) -> None:
    service = compose()["services"][role]
    port = service["environment"][SERVERS[role]]
    assert service["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert service["ports"] == [f"${{{SERVERS[role]}:-{env_example_values()[SERVERS[role]]}}}:{port}"]
    assert service["healthcheck"]["test"] == ["CMD", "market", "health", f"127.0.0.1:{port}"]
    assert service["command"][0] == f"market-{role}-server"
    assert service["environment"]["MARKET_HOST"] == "0.0.0.0"
    assert {"path": ".env", "required": False} in service["env_file"]


@pytest.mark.parametrize("service", ["buyer", "seller", "sim"])
def test_compose_environment_uses_only_listed_settings(service: str) -> None:
    listed = env_example()
    environment = compose()["services"][service]["environment"]
    assert set(environment) <= set(listed), set(environment) - set(listed)
    for value in map(str, environment.values()):
        for name in re.findall(r"\$\{(\w+)", value):
            assert name in listed, f"{service}: ${{{name}}} is not in .env.example"


def test_compose_sim_profile_runs_the_simulator_against_both_servers() -> None:
    services = compose()["services"]
    sim = services["sim"]
    assert sim["profiles"] == ["sim"]
    assert sim["depends_on"] == {role: {"condition": "service_healthy"} for role in SERVERS}
    command = sim["command"]
    ports = {role: services[role]["environment"][setting] for role, setting in SERVERS.items()}
    assert command[:5] == ["market-sim", "--buyer", f"buyer:{ports['buyer']}",
                           "--seller", f"seller:{ports['seller']}"]
    assert command[command.index("--db-url") + 1] == sim["environment"]["MARKET_DB_URL"]
    assert all("profiles" not in services[name] for name in ("db", *SERVERS))


# ---- the servers, started exactly as the containers start them ----

@pytest.fixture
def deploy_database(mysql_server: str) -> Iterator[str]:
    """A fresh MariaDB database market_deploy_<random>, dropped afterwards."""
    yield from fresh_mysql_database(mysql_server, prefix="market_deploy")


def container_environment(service: dict[str, Any], database_url: str) -> dict[str, str]:
    """What the container sees: the image's ENV, then .env (here .env.example), then the
    compose environment, interpolated from .env.example. The compose `db` service becomes
    the test database (address and account); ports become 0 (free ones), as this machine's
    7001 and 7002 may be taken, where a container has its own."""
    variables = env_example_values()
    env = {**dockerfile_env(), **variables,
           **{key: interpolate(str(value), variables) for key, value in service["environment"].items()}}
    compose_url, url = make_url(env["MARKET_DB_URL"]), make_url(database_url)
    assert compose_url.host == "db", compose_url
    env["MARKET_DB_URL"] = url.set(drivername=compose_url.drivername).render_as_string(hide_password=False)
    env.update({setting: "0" for setting in SERVERS.values()})
    return {**env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def start(command: list[str], env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[str], int]:
    """Start a server; wait for its `listening on HOST:PORT` line and return the port."""
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.fullmatch(r"listening on (\S+):(\d+)\n", line)
    if match is None:
        proc.kill()
        pytest.fail(f"{shlex.join(command)} printed {line!r} and exited {proc.wait()}")
    return proc, int(match.group(2))


def health(check: list[str], container_port: str, port: int) -> int:
    """Run a compose health check, the container's port swapped for the real one."""
    command = [arg.replace(f":{container_port}", f":{port}") for arg in check[1:]]
    return subprocess.run(command, env={"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
                          capture_output=True, timeout=30).returncode


@pytest.mark.slow
def test_servers_start_with_the_container_command_and_answer_the_health_check(
        deploy_database: str, tmp_path: Path) -> None:
    services = compose()["services"]
    running: list[tuple[subprocess.Popen[str], list[str], str, int]] = []
    try:
        for role in SERVERS:  # one after the other: the first creates the schema
            service = services[role]
            command = exec_form("ENTRYPOINT") + (service.get("command") or exec_form("CMD"))
            proc, port = start(command, container_environment(service, deploy_database), tmp_path)
            running.append((proc, service["healthcheck"]["test"], service["environment"][SERVERS[role]],
                            port))
        for _, check, container_port, port in running:
            assert health(check, container_port, port) == 0
    finally:
        for proc, *_ in running:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc, *_ in running]
    assert codes == [0] * len(SERVERS), "SIGTERM must stop a server with exit 0"
    for _, check, container_port, port in running:
        assert health(check, container_port, port) != 0, "a stopped server must be unhealthy"


# ---- scripts and systemd units ----

def test_start_and_test_scripts_taking_turns_install_once_each(tmp_path: Path) -> None:
    # before: each install removed the other's stamp, so every switch installed again
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "_venv.sh").write_text((ROOT / "scripts" / "_venv.sh").read_text())
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    python = tmp_path / ".venv" / "bin" / "python"  # stands in for pip: records each install
    python.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'installs'}\n")
    python.chmod(0o755)

    def venv(extra: str) -> list[str]:
        subprocess.run(["bash", "-c", f"source scripts/_venv.sh {extra}"], cwd=tmp_path, check=True)
        log = tmp_path / "installs"
        return [line for line in log.read_text().splitlines() if "-e" in line] if log.exists() else []

    assert venv("dev") == ["-m pip install --quiet -e .[dev]"]
    assert len(venv("runtime")) == 2
    assert len(venv("dev")) == 2 and len(venv("runtime")) == 2  # both stamps kept
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    assert len(venv("dev")) == 3  # a changed pyproject.toml installs again
    assert sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / ".venv").glob(".installed-*")) == ["dev"]


def test_shell_scripts_pass_shellcheck() -> None:
    shellcheck = require_tool("shellcheck")
    result = subprocess.run([shellcheck, "--external-sources", *map(str, shell_scripts())],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_deploy_scripts_are_strict_bash() -> None:
    for script in sorted((ROOT / "deploy").rglob("*.sh")):
        head = script.read_text(encoding="utf-8").splitlines()[:12]
        assert head[0] in ("#!/usr/bin/env bash", "# shellcheck shell=bash"), script
        assert "set -euo pipefail" in head or head[0].startswith("# shellcheck"), script


@pytest.mark.parametrize("role", SERVERS)
def test_server_units_restart_on_failure_and_check_health(role: str) -> None:
    keys = unit(f"market-{role}.service")
    assert keys["Restart"] == ["on-failure"]
    assert keys["User"] == ["market"]
    assert keys["EnvironmentFile"] == ["/etc/market/market.env"]
    assert keys["ExecStart"][0].split()[0].endswith(f"/market-{role}-server")
    assert any("market health" in post for post in keys["ExecStartPost"])
    assert "cloud-sql-proxy.service" in keys["After"][0].split()


def test_cloud_sql_proxy_unit_runs_as_the_dedicated_user() -> None:
    keys = unit("cloud-sql-proxy.service")
    assert keys["Restart"] == ["on-failure"]
    assert keys["User"] == ["market"]
    assert keys["EnvironmentFile"] == ["/etc/market/market.env"]
    assert "--private-ip" in keys["ExecStart"][0]


def test_systemd_units_pass_systemd_analyze_verify() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    units = sorted(map(str, UNITS.glob("*.service")))
    result = subprocess.run([analyze, "verify", "--man=no", *units], capture_output=True, text=True,
                            timeout=60)
    # The VM's startup script installs the programs; here they are absent, and that is all
    # verify may complain about.
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and not INSTALLED_ON_THE_VM.search(line)]
    assert not problems, "\n".join(problems)
