"""The deployment files: the Dockerfile, docker-compose.yml, .env.example, the GCP scripts and
systemd units. There is no container engine or cloud here, so the files are parsed and checked
against the code, and the container's own command line is run against MariaDB.
"""
from __future__ import annotations

import ast
import json
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
from sqlalchemy import make_url
from support import free_port, fresh_mysql_database, require_tool

ROOT = Path(__file__).resolve().parents[2]
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
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message} (interpolate_strictly
    checks those) and $$."""
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, default = match.group("name"), match.group("op"), match.group("default") or ""
        if op == ":-":
            return variables.get(name) or default
        if op == "-":
            return variables.get(name, default)
        return variables.get(name, "")

    return re.sub(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<default>[^}]*))?\}", one, value)


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
    scripts = [*sorted((ROOT / "deploy").rglob("*.sh")), *sorted((ROOT / "scripts").glob("*.sh")),
               *sorted((ROOT / "simulation").rglob("*.sh"))]
    return [*scripts, ROOT / ".ci" / "run"]


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
    from runtime.config import server_settings

    monkeypatch.chdir(tmp_path)
    for name in env_example():
        monkeypatch.delenv(name, raising=False)
    defaults = [server_settings(role, []) for role in SERVERS], build_parser().parse_args(["serve"])
    for name, value in env_example_values().items():
        monkeypatch.setenv(name, value)
    assert ([server_settings(role, []) for role in SERVERS], build_parser().parse_args(["serve"])) == defaults


def test_a_setting_may_come_from_the_file_its_file_variable_names(tmp_path: Path) -> None:
    secret = tmp_path / "db_url"
    secret.write_text("mysql://market:s3cret@db:3306/market\n")
    code = ("from runtime.config import server_settings; s = server_settings('buyer', []); "
            "print(s.db_url, s.host)")
    env = {"PATH": os.environ.get("PATH", ""), "MARKET_DB_URL": "", "MARKET_DB_URL_FILE": str(secret),
           "MARKET_HOST_FILE": str(secret)}
    result = subprocess.run([sys.executable, "-c", code], env={**env, "MARKET_HOST": "0.0.0.0"}, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout == "mysql://market:s3cret@db:3306/market 0.0.0.0\n", result.stderr  # set wins
    secret.unlink()
    result = subprocess.run([sys.executable, "-c", code], env={**env, "MARKET_HOST": "0.0.0.0"}, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == f"error: MARKET_DB_URL_FILE={secret}: No such file or directory\n"


# ---- the Dockerfile ----

def test_the_image_is_slim_python_runs_as_a_user_and_installs_from_the_lock() -> None:
    instructions = dockerfile()
    keywords = [kw for kw, _ in instructions]
    base = next(args for kw, args in instructions if kw == "FROM").split()[0]
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base), base
    user = [args for kw, args in instructions if kw == "USER"]
    assert user and user[-1] not in ("root", "0"), "the image must run as a non-root user"
    assert keywords.index("USER") < keywords.index("CMD")
    assert [args for kw, args in instructions if kw == "FROM"][-1].split()[-1] == "server"
    installs = [args for kw, args in instructions if kw == "RUN" and "pip install" in args]
    assert installs[0] == ("pip install --require-hashes --no-deps -r /src/requirements/runtime.txt"
                           " -r /src/requirements/build.txt")
    assert installs[1].startswith("pip install --no-deps --no-build-isolation /src"), "setuptools unpinned"
    assert all("--no-deps" in args for args in installs), "nothing unpinned may come in"


def image_install_commands(stage: str) -> list[str]:
    """The Dockerfile's `pip install` RUNs of a stage and the stages it is built FROM."""
    stages: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for keyword, args in dockerfile():
        if keyword == "FROM":
            parent, _, current = args.split()
            stages[current] = (parent, [])
        elif keyword == "RUN" and "pip install" in args:
            stages[current][1].append(args)
    parent, commands = stages[stage]
    return [*(image_install_commands(parent) if parent in stages else []), *commands]


def test_the_image_health_check_asks_healthz_over_http() -> None:
    check = [args for kw, args in dockerfile() if kw == "HEALTHCHECK"]
    assert check and "CMD python -c" in check[-1] and "/healthz" in check[-1]
    assert dockerfile_env().get("MARKET_METRICS_PORT")  # served in the image, where the check asks


def test_the_image_command_is_a_server_of_this_project() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    command = exec_form("ENTRYPOINT") + exec_form("CMD")
    assert command and command[0] in scripts, command


def build_context(destination: Path) -> Path:
    """A copy of what `docker build .` sends (.dockerignore's names left out)."""
    ignored = [line.strip().removeprefix("**/") for line in
               (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
               if line.strip() and not line.startswith("#")]
    shutil.copytree(ROOT, destination, ignore=shutil.ignore_patterns(*ignored))
    return destination


@pytest.mark.slow
def test_the_servers_image_installs_from_the_lock_without_plots_or_load_tools(tmp_path: Path) -> None:
    """No container engine here: a venv is given the server stage's own pip commands over a
    copy of the build context, then runs a server as the image would."""
    src, venv = build_context(tmp_path / "src"), tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pip = venv / "bin" / "pip"  # this pip, installing into the venv: no copy of pip to install first
    pip.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pip --python "{venv / "bin" / "python"}" "$@"\n')
    pip.chmod(0o755)
    # PIP_COMPILE=0: no .pyc of every module installed (a quarter of pip's time); imports make their own
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "PIP_COMPILE": "0"}
    for command in image_install_commands("server"):
        installed = subprocess.run(["sh", "-c", command.replace("/src", str(src))], env=env, cwd=tmp_path,
                                   capture_output=True, text=True, timeout=600)
        assert installed.returncode == 0, installed.stderr
    python = str(venv / "bin" / "python")
    present = subprocess.run([python, "-c", "import importlib.util as u; print(*(m for m in ("
                              "'matplotlib', 'numpy', 'locust', 'gevent', 'pytest') if u.find_spec(m)))"],
                             capture_output=True, text=True, timeout=60)
    assert present.stdout.strip() == "", "in the servers' image: " + present.stdout
    assert subprocess.run([python, "-c", "import _mysql_connector"], timeout=60).returncode == 0, \
        "the driver's C extension does not load"
    server, port = start([str(venv / "bin" / "market-buyer-server"), "--port", "0", "--db-url",
                          f"sqlite:///{tmp_path / 'market.db'}"], env, tmp_path)
    try:
        check = ["CMD", str(venv / "bin" / "market"), "health", "--ready", "127.0.0.1:1"]
        assert health(check, "1", port) == 0
    finally:
        server.terminate()
        assert server.wait(timeout=30) == 0
    sim = subprocess.run([str(venv / "bin" / "market-sim"), "-n", "1"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=60)
    assert sim.returncode == 2 and "pip install 'marketplace[sim]'" in sim.stderr, sim.stderr


def test_the_simulators_image_adds_the_locked_sim_set() -> None:
    assert image_install_commands("sim")[-1].startswith("pip install --require-hashes --no-deps -r ")
    assert "sim.txt" in image_install_commands("sim")[-1]
    assert compose()["services"]["sim"]["build"]["target"] == "sim"


def test_the_lock_files_pin_every_package_with_hashes_and_keep_the_servers_lean() -> None:
    build = (ROOT / "requirements" / "build.txt").read_text(encoding="utf-8")
    assert re.search(r"^setuptools==\S+ \\\n +--hash=sha256:", build, re.M), "the build backend unlocked"
    for name in ("runtime", "sim", "dev"):
        lock = (ROOT / "requirements" / f"{name}.txt").read_text(encoding="utf-8")
        packages = re.findall(r"^([a-z0-9][\w.-]*)(?:\[[^]]*\])?==([^\s;]+)", lock, re.M)
        assert packages, name
        entries = re.split(r"\n(?=[a-z0-9])", lock.split("\n", 1)[1])
        for entry in entries:
            if "==" in entry:
                assert "--hash=sha256:" in entry, f"{name}.txt: no hash for {entry.split()[0]}"
        pinned = dict(packages)
        assert pinned["mysql-connector-python"] == "9.7.0"
        heavy = {"matplotlib", "numpy", "locust"} & set(pinned)
        assert heavy == {"runtime": set(), "sim": {"matplotlib", "numpy"},
                         "dev": {"matplotlib", "numpy", "locust"}}[name], (name, heavy)


def test_the_image_installs_the_release_from_the_lock_and_checks_every_download() -> None:
    image, build, startup = ((GCP / name).read_text(encoding="utf-8")
                             for name in ("image.sh", "build.sh", "startup.sh"))
    assert '"$REPO/requirements/runtime.txt" "$release/"' in image
    installs = [line for line in build.splitlines() if "pip\" install" in line]
    assert installs == [
        '"$APP/venv/bin/pip" install --quiet --require-hashes --no-deps -r "$release/runtime.txt"',
        '"$APP/venv/bin/pip" install --quiet --no-deps "$release"/*.whl']
    # the proxy against its pinned SHA-256, the release's files against the sums made here
    assert 'echo "$PROXY_SHA256  $proxy" | sha256sum --check --strict' in build
    assert 'sha256sum --check --strict --quiet "$release.sums"' in build
    assert "(cd \"$release\" && sha256sum -- *) >\"$release.sums\"" in image
    downloads = [line for line in build.splitlines() if re.search(r"\bcurl -\w*o\b|wget ", line)]
    assert downloads == ['curl -fsSLo "$proxy" \\']
    # nothing is installed at a server VM's boot
    assert not re.search(r"apt-get|\bpip\b|curl -fsSLo|useradd", startup)


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
    assert service["depends_on"] == {"migrate": {"condition": "service_completed_successfully"},
                                     "tls": {"condition": "service_completed_successfully"}}
    assert service["ports"] == [f"${{{SERVERS[role]}:-{env_example_values()[SERVERS[role]]}}}:{port}"]
    check = service["healthcheck"]["test"]
    assert check[:3] == ["CMD", "python", "-c"] and "/readyz" in check[3]
    assert service["command"][0] == f"market-{role}-server"
    assert service["environment"]["MARKET_HOST"] == "0.0.0.0"
    assert {"path": ".env", "required": False} in service["env_file"]


def test_compose_upgrades_the_schema_once_before_the_servers_start() -> None:
    migrate = compose()["services"]["migrate"]
    assert migrate["command"] == ["market", "db", "upgrade"]  # the database URL from its file
    assert migrate["image"] == compose()["services"]["buyer"]["image"]
    assert migrate["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert migrate["restart"] == "no"


def test_the_vm_upgrades_the_schema_after_the_proxy_and_before_the_servers() -> None:
    startup = (GCP / "startup.sh").read_text(encoding="utf-8")
    proxy = startup.index("systemctl restart cloud-sql-proxy.service")
    upgrade = startup.index('"$APP/venv/bin/market" db upgrade')
    servers = startup.index('systemctl restart "market-$ROLE.service"')
    assert proxy < upgrade < servers
    assert "-p EnvironmentFile=/etc/market/market.env" in startup  # the servers' own settings
    assert "--uid=market" in startup
    assert startup.count("systemctl restart") == 2  # the proxy, then the server: not before it


@pytest.mark.parametrize("service", ["buyer", "seller", "sim", "migrate"])
def test_compose_environment_uses_only_listed_settings(service: str) -> None:
    listed = env_example()
    environment = compose()["services"][service]["environment"]
    names = {name.removesuffix("_FILE") for name in environment}  # NAME_FILE: NAME's value, from a file
    assert names <= set(listed), names - set(listed)
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
    assert command == ["market-sim", "--buyer", f"buyer:{ports['buyer']}",  # the database URL from its file
                       "--seller", f"seller:{ports['seller']}", "--allow-live"]  # it writes: loadtest- names
    assert sim["environment"]["MARKET_DB_URL_FILE"] == sim["configs"][0]["target"]
    assert all("profiles" not in services[name] for name in ("db", *SERVERS))


# ---- the servers, started exactly as the containers start them ----

@pytest.fixture
def deploy_database(mysql_server: str) -> Iterator[str]:
    """A fresh MariaDB database market_deploy_<random>, dropped afterwards."""
    yield from fresh_mysql_database(mysql_server, prefix="market_deploy")


def container_environment(service: dict[str, Any], database_url: str, folder: Path) -> dict[str, str]:
    """What the container sees: the image's ENV, then .env (here .env.example), then the
    compose environment, interpolated from .env.example. The compose `db` service becomes
    the test database (address and account); ports become 0 (free ones), as this machine's
    7001 and 7002 may be taken, where a container has its own; the files mounted in the
    container (the URL's config, the tls volume) are in `folder`."""
    variables = env_example_values()
    env = {**dockerfile_env(), **variables,
           **{key: interpolate(str(value), variables) for key, value in service["environment"].items()}}
    compose_url, url = make_url(db_url_config(variables)), make_url(database_url)
    assert compose_url.host == "db", compose_url
    url_file = folder / "db_url"
    url_file.write_text(url.set(drivername=compose_url.drivername).render_as_string(hide_password=False))
    env["MARKET_DB_URL_FILE"] = str(url_file)
    for name in ("MARKET_TLS_CERT", "MARKET_TLS_KEY", "MARKET_TLS_CA"):  # the tls volume's files
        env[name] = env[name].replace("/app/tls", str(folder / "tls"))
    env.update({setting: "0" for setting in SERVERS.values()})
    if env.get("MARKET_METRICS_PORT"):  # each container has its own 9100: here they need two ports
        env["MARKET_METRICS_PORT"] = str(free_port())
    return {**env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def db_url_config(variables: dict[str, str]) -> str:
    """The servers' database URL as the compose config `db_url` holds it."""
    return interpolate(compose()["configs"]["db_url"]["content"], variables)


def run_tls_service(folder: Path) -> subprocess.CompletedProcess[str]:
    """The compose `tls` service's command, the image's script run from the checkout."""
    command = compose()["services"]["tls"]["command"]
    assert command[:2] == ["market-make-certs", "/app/tls"]
    script = ROOT / "deploy" / "tls" / "make-certs.sh"
    assert ("COPY", f"deploy/tls/make-certs.sh /usr/local/bin/{command[0]}") in dockerfile()
    args = [interpolate(arg, env_example_values()) for arg in command[2:]]
    return subprocess.run(["bash", str(script), str(folder / "tls"), *args], capture_output=True, text=True,
                          timeout=60)


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


def health(check: list[str], container_port: str, port: int, env: dict[str, str] | None = None) -> int:
    """Run a compose health check, the container's port swapped for the real one."""
    command = [arg.replace(f":{container_port}", f":{port}") for arg in check[1:]]
    env = env or {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(command, env=env, capture_output=True, timeout=30).returncode


@pytest.mark.slow
def test_servers_start_with_the_container_command_and_answer_the_health_check(
        deploy_database: str, tmp_path: Path) -> None:
    services = compose()["services"]
    assert run_tls_service(tmp_path).returncode == 0
    running: list[tuple[subprocess.Popen[str], list[str], str, int, dict[str, str]]] = []
    migrate = services["migrate"]
    upgraded = subprocess.run(exec_form("ENTRYPOINT") + migrate["command"], capture_output=True, text=True,
                              env=container_environment(migrate, deploy_database, tmp_path), cwd=tmp_path,
                              timeout=120)
    assert (upgraded.returncode, upgraded.stderr) == (0, "")
    assert upgraded.stdout.startswith("upgraded the database mysql://")
    try:
        for role in SERVERS:
            service = services[role]
            command = exec_form("ENTRYPOINT") + (service.get("command") or exec_form("CMD"))
            env = container_environment(service, deploy_database, tmp_path)
            assert "PASSWORD" not in json.dumps(env).upper().replace('PASSWORD": ""', "")
            proc, port = start(command, env, tmp_path)
            running.append((proc, service["healthcheck"]["test"], service["environment"][SERVERS[role]],
                            port, env))
        for _, check, container_port, port, env in running:  # over HTTP: TLS on, with or without a CA
            assert health(check, container_port, port, env) == 0, "the health check with TLS on"
            assert health(check, container_port, port, {**env, "MARKET_TLS_CA": ""}) == 0
    finally:
        for proc, *_ in running:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc, *_ in running]
    assert codes == [0] * len(SERVERS), "SIGTERM must stop a server with exit 0"
    for _, check, container_port, port, env in running:
        assert health(check, container_port, port, env) != 0, "a stopped server must be unhealthy"


# ---- scripts and systemd units ----

def test_start_and_test_scripts_taking_turns_install_once_each(tmp_path: Path) -> None:
    # before: each install removed the other's stamp, so every switch installed again
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "_venv.sh").write_text((ROOT / "scripts" / "_venv.sh").read_text())
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "requirements").mkdir()
    for locked in ("runtime", "dev", "build"):
        (tmp_path / "requirements" / f"{locked}.txt").write_text(f"# {locked}\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    python = tmp_path / ".venv" / "bin" / "python"  # stands in for pip: records each install
    python.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'installs'}\n")
    python.chmod(0o755)
    (tmp_path / ".venv" / "bin" / "pip").symlink_to(python)  # a venv with pip is whole
    (tmp_path / ".venv" / "bin" / "uv").symlink_to(python)  # as if pip had installed uv

    def venv(extra: str) -> list[str]:
        subprocess.run(["bash", "-c", f"source scripts/_venv.sh {extra}"], cwd=tmp_path, check=True)
        log = tmp_path / "installs"
        return log.read_text().splitlines() if log.exists() else []

    locked = "--require-hashes --no-deps -r requirements/{}.txt -r requirements/build.txt"
    checkout = "--no-deps --no-build-isolation -e ."
    pip, uv = "-m pip install --quiet", "pip install --quiet --python .venv/bin/python"
    # the dev set: pip installs the locked uv, which installs the rest
    assert venv("dev") == [f"{pip} --require-hashes --no-deps -r .venv/uv.txt",
                           f"{uv} {locked.format('dev')}", f"{uv} {checkout}"]
    assert venv("runtime")[3:] == [f"{pip} {locked.format('runtime')}", f"{pip} {checkout}"]
    assert len(venv("dev")) == 5 and len(venv("runtime")) == 5  # both stamps kept
    (tmp_path / "requirements" / "dev.txt").write_text("# dev, refreshed\n")
    assert len(venv("dev")) == 8  # a refreshed lock file installs again
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    assert len(venv("dev")) == 11  # a changed pyproject.toml installs again
    (tmp_path / "wire").mkdir()
    (tmp_path / "wire" / "__init__.py").write_text('__version__ = "1.1.0"\n')
    assert len(venv("dev")) == 14  # so does a version (the package's metadata carries it)
    assert len(venv("dev")) == 14
    (tmp_path / "wire" / "__init__.py").write_text('"""The protocol."""\n__version__ = "1.1.0"\n')
    assert len(venv("dev")) == 14  # the rest of the file is not the metadata's
    assert sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / ".venv").glob(".installed-*")) == ["dev"]


def test_a_half_made_venv_is_made_again(tmp_path: Path) -> None:
    """python3 -m venv without Debian's python3-venv leaves .venv/bin/python and no pip: every
    later start.sh and test.sh failed on it, even once python3-venv was installed."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "_venv.sh").write_text((ROOT / "scripts" / "_venv.sh").read_text())
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "dev.txt").write_text("# dev\n")
    (tmp_path / "requirements" / "build.txt").write_text("# build\n")
    half_made = tmp_path / ".venv" / "bin"
    half_made.mkdir(parents=True)
    (half_made / "python").symlink_to(sys.executable)
    (tmp_path / ".venv" / "left-over").touch()
    python3 = tmp_path / "python3"  # `python3 -m venv .venv`, as with python3-venv missing: no pip
    python3.write_text("#!/bin/sh\nmkdir -p .venv/bin && ln -sf /bin/true .venv/bin/python && exit 1\n")
    python3.chmod(0o755)

    def venv() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", "source scripts/_venv.sh dev"], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, "PYTHON": str(python3)})

    missing = venv()
    assert missing.returncode == 1 and "apt-get install python3-venv" in missing.stderr, missing.stderr
    assert not (tmp_path / ".venv").exists(), "a half-made .venv left to fail the next run the same way"
    # python3-venv installed now: venv makes python and pip (stand-ins that record the install)
    python3.write_text("#!/bin/sh\nmkdir -p .venv/bin && "
                       f"printf '#!/bin/sh\\necho \"$*\" >> {tmp_path}/log\\n'"
                       " > .venv/bin/python && chmod +x .venv/bin/python && ln -s python .venv/bin/pip"
                       " && ln -s python .venv/bin/uv\n")
    half_made.mkdir(parents=True)
    (half_made / "python").symlink_to(sys.executable)
    made = venv()
    assert made.returncode == 0, made.stderr
    log = (tmp_path / "log").read_text()
    assert "-m pip install --quiet --require-hashes --no-deps -r .venv/uv.txt" in log
    assert "--python .venv/bin/python --require-hashes --no-deps -r requirements/dev.txt" in log
    assert "--python .venv/bin/python --no-deps --no-build-isolation -e ." in log


def test_the_servers_containers_get_no_password_in_their_environment_but_a_file() -> None:
    """env_file: .env gives every variable of .env to the servers' containers, MySQL's root
    password too; the shared environment blanks those it does not need, and the database URL,
    which holds the password, is a file."""
    services = compose()["services"]
    names = set(env_example())
    for name in ("buyer", "seller", "sim"):
        environment = services[name]["environment"]
        secrets = {key for key in names if key.startswith("MYSQL_") and "PASSWORD" in key}
        assert secrets and all(environment.get(key) == "" for key in secrets), (name, environment)
        assert environment["MARKET_DB_URL"] == "", ".env's own URL would win over the file"
        assert [(c["source"], c["target"], c["mode"]) for c in services[name]["configs"]] == [
            ("db_url", environment["MARKET_DB_URL_FILE"], 0o400)]
    variables = env_example_values()
    assert make_url(db_url_config(variables)).password == variables["MYSQL_PASSWORD"]


def test_compose_has_no_fallback_password_and_stops_without_one() -> None:
    text = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    uses = re.findall(r"\$\{(\w*PASSWORD\w*)(:?[-?+]?)([^}]*)\}", text)
    assert uses and all(op == ":?" and "set " in message for _, op, message in uses), uses
    assert {name for name, _, _ in uses} == {"MYSQL_ROOT_PASSWORD", "MYSQL_PASSWORD"}
    for name in ("MYSQL_ROOT_PASSWORD", "MYSQL_PASSWORD"):
        with pytest.raises(KeyError):  # compose's ${VAR:?}: missing and empty alike stop it
            interpolate_strictly(text, {**env_example_values(), name: ""})


def interpolate_strictly(value: str, variables: dict[str, str]) -> str:
    """interpolate, with ${VAR:?message} raising KeyError(message) as compose stops."""
    def check(match: re.Match[str]) -> str:
        if not variables.get(match["name"]):
            raise KeyError(match["message"])
        return match.group(0)

    return re.sub(r"\$\{(?P<name>\w+):\?(?P<message>[^}]*)\}", check, value)


def test_mysql_reads_its_passwords_from_secrets_the_compose_file_declares() -> None:
    spec = compose()
    db = spec["services"]["db"]
    assert not {"MYSQL_ROOT_PASSWORD", "MYSQL_PASSWORD"} & set(db["environment"])
    assert db["environment"]["MYSQL_ROOT_PASSWORD_FILE"] == "/run/secrets/mysql_root_password"
    assert db["environment"]["MYSQL_PASSWORD_FILE"] == "/run/secrets/mysql_password"
    assert set(db["secrets"]) == set(spec["secrets"]) == {"mysql_root_password", "mysql_password"}
    assert {s["environment"] for s in spec["secrets"].values()} == {"MYSQL_ROOT_PASSWORD", "MYSQL_PASSWORD"}
    check = " ".join(db["healthcheck"]["test"])
    assert "/run/secrets/mysql_root_password" in check and "--password" not in check


@pytest.mark.parametrize("role", SERVERS)
def test_compose_servers_serve_tls_with_the_certificate_made_at_first_start(role: str) -> None:
    services = compose()["services"]
    environment, tls = services[role]["environment"], services["tls"]
    assert (environment["MARKET_TLS_CERT"], environment["MARKET_TLS_KEY"], environment["MARKET_TLS_CA"]) == (
        "/app/tls/server.pem", "/app/tls/server.key", "/app/tls/ca.pem")
    assert "${TLS_DIR:-tls}:/app/tls:ro" in services[role]["volumes"]
    assert tls["volumes"] == ["${TLS_DIR:-tls}:/app/tls"] and tls["restart"] == "no"
    assert role in tls["command"], "the certificate must name the server the others reach it by"


def test_the_tls_service_makes_a_certificate_once_that_verifies_against_its_ca(tmp_path: Path) -> None:
    made = run_tls_service(tmp_path)
    assert made.returncode == 0, made.stderr
    tls = tmp_path / "tls"
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(tls / "ca.pem"), str(tls / "server.pem")],
                              capture_output=True, text=True, timeout=30)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    names = subprocess.run(["openssl", "x509", "-in", str(tls / "server.pem"), "-noout", "-ext",
                            "subjectAltName"], capture_output=True, text=True, timeout=30).stdout
    for name in ("DNS:localhost", "IP Address:127.0.0.1", "DNS:buyer", "DNS:seller"):
        assert name in names, names
    assert oct((tls / "server.key").stat().st_mode & 0o777) == "0o600"
    assert oct((tls / "ca.key").stat().st_mode & 0o777) == "0o600"
    before = (tls / "server.pem").read_bytes()
    again = run_tls_service(tmp_path)
    assert again.returncode == 0 and "keeping" in again.stdout
    assert (tls / "server.pem").read_bytes() == before, "a second start must keep the certificate"


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


@pytest.mark.parametrize("role", SERVERS)
def test_a_stop_is_given_time_for_a_request_waiting_out_its_lock(role: str) -> None:
    """A stop sends the answers owed for up to send_timeout_s, and a call in hand may wait
    LOCK_WAIT_S for a lock, twice for a login. Before, compose left Docker's 10 s."""
    from db.engine import LOCK_WAIT_S
    from runtime.server import ServerLimits

    needed = ServerLimits().send_timeout_s + 2 * LOCK_WAIT_S
    grace = compose()["services"][role]["stop_grace_period"]
    assert re.fullmatch(r"\d+s", grace) and int(grace[:-1]) > needed
    assert int(unit(f"market-{role}.service")["TimeoutStopSec"][0]) > needed


def test_cloud_sql_proxy_unit_runs_as_the_dedicated_user() -> None:
    keys = unit("cloud-sql-proxy.service")
    assert keys["Restart"] == ["on-failure"]
    assert keys["User"] == ["market"]
    assert keys["EnvironmentFile"] == ["/etc/market/market.env"]
    assert "--private-ip" in keys["ExecStart"][0]


def test_systemd_units_pass_systemd_analyze_verify() -> None:
    analyze = require_tool("systemd-analyze", "systemd")
    units = sorted(map(str, UNITS.glob("*.service")))
    result = subprocess.run([analyze, "verify", "--man=no", *units], capture_output=True, text=True,
                            timeout=60)
    # The VM's startup script installs the programs; here they are absent, and that is all
    # verify may complain about.
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and not INSTALLED_ON_THE_VM.search(line)]
    assert not problems, "\n".join(problems)


# ---- the GCP scripts against a fake gcloud ----

GCP = ROOT / "deploy" / "gcp"
FAKE_GCLOUD = '''\
# A fake gcloud: answers from a JSON state, changes it as create and delete would, and logs each
# call (its arguments, stdin when it reads it, the variables that turn gcloud's logs off).
import json, os, sys

args = sys.argv[1:]
state_path = os.environ["FAKE_GCLOUD_STATE"]
with open(state_path) as f:
    state = json.load(f)
words = []  # the command, and the name it acts on
for arg in args:
    if arg.startswith("-"):
        break
    words.append(arg)
command = " ".join(words)
stdin = sys.stdin.read() if "--data-file=-" in args or "--flags-file=-" in args else None
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
    f.write(json.dumps({"args": args, "stdin": stdin, "env": {
        name: os.environ.get(name) for name in
        ("CLOUDSDK_CORE_DISABLE_FILE_LOGGING", "CLOUDSDK_CORE_LOG_HTTP")}}) + "\\n")
resources, secrets, peerings = state["resources"], state["secrets"], state["peerings"]
network = "compute networks " + state["network"]


def done(code=0, lines=()):
    with open(state_path, "w") as f:
        json.dump(state, f)
    sys.stdout.write("".join(line + "\\n" for line in lines))
    sys.exit(code)


if any(command.startswith(refused) for refused in state.get("refuse", [])):
    sys.stderr.write("ERROR: Producer services (e.g. CloudSQL) are still using this connection.\\n")
    done(1)
if command.startswith("compute addresses describe") and "--format=value(address)" in args:
    found = "compute addresses " + words[3] in resources
    done(0, [state.get("address", "203.0.113.7")]) if found else done(1)
if command.startswith("compute images describe-from-family"):
    done(0, [state["image"]]) if "image" in state else done(1)
if "--format=value(status)" in args:
    done(0, [state.get("status", "RUNNING")]) if "compute instances " + words[3] in resources else done(1)
if command.startswith("compute regions describe"):
    done(0, state["regions"][words[3]]) if words[3] in state["regions"] else done(1)
if command.startswith("compute networks peerings delete"):
    if words[4] not in peerings:
        done(1)
    peerings.remove(words[4])
    done()
if command.startswith("services vpc-peerings list"):
    done(0, peerings)
if command.startswith("services vpc-peerings delete"):
    peerings.clear()
    done()
if command.startswith("secrets versions access"):
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--secret="))
    done(0, [secrets[name]]) if name in secrets else done(1)
if command.startswith("secrets versions add"):
    secrets[words[3]] = stdin.rstrip("\\n")
    done()
if command.startswith("sql users list"):
    done(0, state["sql_users"])
if command.startswith(("sql users create", "sql users set-password")):
    state["sql_users"].append(words[3])
    done()
for verb in ("describe", "delete", "create"):
    if verb in words[:-1]:
        i = words.index(verb)
        key = " ".join(words[:i] + words[i + 1:i + 2])
        if verb == "describe":
            if key not in resources:
                done(1)
            done(0, peerings if key == network and "--flatten=peerings" in args else [])
        if verb == "delete":
            if key not in resources or (key == network and peerings):
                done(1)
            resources.remove(key)
        else:
            resources.append(key)
            if words[:2] == ["secrets", "create"]:
                secrets[words[2]] = stdin.rstrip("\\n")
        done()
done()
'''
EVERYTHING = ["compute addresses market-ip", "iam service-accounts market-vm@p.iam.gserviceaccount.com",
              "secrets market-env", "sql instances market-sql",
              "compute firewall-rules market-net-allow-market",
              "compute firewall-rules market-net-allow-health-checks", "compute addresses market-sql-peering",
              "compute networks subnets market-subnet", "compute networks market-net",
              *(f"compute {kind} market-{role}{suffix}" for role in ("buyer", "seller") for kind, suffix in (
                  ("forwarding-rules", ""), ("backend-services", ""), ("instance-groups managed", ""),
                  ("health-checks", "-live"), ("health-checks", "-ready")))]


class FakeGcloud:
    """deploy/gcp scripts run with a fake gcloud first on PATH, project `p`."""

    def __init__(self, tmp_path: Path, **state: Any) -> None:
        bin_dir = tmp_path / "fake-bin"
        bin_dir.mkdir()
        gcloud = bin_dir / "gcloud"
        gcloud.write_text(f"#!{sys.executable} -IS\n{FAKE_GCLOUD}")  # no site: a fast start
        gcloud.chmod(0o755)
        curl = bin_dir / "curl"  # what `curl https://checkip...` answers: FAKE_CALLER, or a failure
        curl.write_text('#!/bin/sh\n[ -n "$FAKE_CALLER" ] || exit 6\necho "$FAKE_CALLER"\n')
        curl.chmod(0o755)
        self.state_path, self.log_path = tmp_path / "state.json", tmp_path / "calls.jsonl"
        self.state = {"network": "market-net", "peerings": [], "resources": [], "secrets": {},
                      "sql_users": [],
                      "regions": {"us-central1": ["us-central1-c", "us-central1-a", "us-central1-b"],
                                  "europe-west1": ["europe-west1-d", "europe-west1-b", "europe-west1-c"]},
                      **state}
        self.state_path.write_text(json.dumps(self.state))
        self.env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PROJECT": "p",
                    "HOME": str(tmp_path), "FAKE_GCLOUD_STATE": str(self.state_path),
                    "FAKE_GCLOUD_LOG": str(self.log_path)}

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        self.log_path.unlink(missing_ok=True)
        return subprocess.run(["bash", str(GCP / script), *args], env={**self.env, **env}, cwd=ROOT,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    def calls(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines()]

    def commands(self) -> list[str]:
        return [" ".join(call["args"]) for call in self.calls()]

    def current(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())


def test_teardown_deletes_the_network_while_cloud_sql_still_holds_the_peering(tmp_path: Path) -> None:
    # before: `gcloud services vpc-peerings delete`, refused for days after the instance is
    # deleted, stopped the script; the range, subnet and network stayed, and a re-run failed alike
    fake = FakeGcloud(tmp_path, resources=EVERYTHING, peerings=["servicenetworking-googleapis-com"],
                      refuse=["services vpc-peerings delete"])
    result = fake.run("teardown.sh", YES="1")
    assert result.returncode == 0, result.stderr
    assert ("compute networks peerings delete servicenetworking-googleapis-com --network=market-net "
            "--project p --quiet") in fake.commands()
    assert fake.current()["resources"] == [] and fake.current()["peerings"] == []
    again = fake.run("teardown.sh", YES="1")
    assert again.returncode == 0, again.stderr
    assert not [c for c in fake.commands() if " delete " in f" {c} "], "nothing left to delete"


def test_cloudsql_keeps_the_password_off_command_lines_and_out_of_gcloud_log_files(tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path, resources=["sql instances market-sql"])
    result = fake.run("cloudsql.sh")
    assert result.returncode == 0, result.stderr
    settings = fake.current()["secrets"]["market-env"]
    password = re.search(r"^MARKET_DB_URL=mysql://market:(\w+)@127\.0\.0\.1:3306/market$", settings,
                         re.M)[1]
    assert len(password) == 48
    calls = fake.calls()
    assert not [c["args"] for c in calls if password in " ".join(c["args"])], "password on a command line"
    assert password not in result.stdout + result.stderr
    seeing = [c for c in calls if password in (c["stdin"] or "")]
    assert {" ".join(c["args"][:3]) for c in seeing} == {"sql users create", "secrets create market-env"}
    assert all(c["env"] == {"CLOUDSDK_CORE_DISABLE_FILE_LOGGING": "1", "CLOUDSDK_CORE_LOG_HTTP": "false"}
               for c in seeing)
    user = next(c for c in seeing if c["args"][:2] == ["sql", "users"])
    assert "--flags-file=-" in user["args"] and yaml.safe_load(user["stdin"]) == {"--password": password}


def test_cloudsql_rerun_with_other_ports_writes_them_into_the_secret_and_keeps_the_password(
        tmp_path: Path) -> None:
    # before: the secret was written only when created, so the servers kept the old ports while
    # network.sh moved the firewall to the new ones
    fake = FakeGcloud(tmp_path, resources=["sql instances market-sql"])
    assert fake.run("cloudsql.sh").returncode == 0
    state = fake.current()
    first = state["secrets"]["market-env"]
    state["secrets"]["market-env"] = first.replace("MARKET_THREADS=16", "MARKET_THREADS=32")  # an edit
    fake.state_path.write_text(json.dumps(state))
    result = fake.run("cloudsql.sh", BUYER_PORT="8001", SELLER_PORT="8002")
    assert result.returncode == 0, result.stderr
    second = fake.current()["secrets"]["market-env"]
    assert second == (first.replace("MARKET_THREADS=16", "MARKET_THREADS=32")
                      .replace("MARKET_BUYER_PORT=7001", "MARKET_BUYER_PORT=8001")
                      .replace("MARKET_SELLER_PORT=7002", "MARKET_SELLER_PORT=8002"))
    assert not [c for c in fake.commands() if c.startswith("sql users")], "the password was changed"
    assert fake.run("cloudsql.sh", BUYER_PORT="8001", SELLER_PORT="8002").returncode == 0
    assert not [c for c in fake.commands() if c.startswith("secrets versions add")], "nothing changed"


@pytest.mark.parametrize("region, zone", [("europe-west1", "europe-west1-b"),
                                          ("us-central1", "us-central1-a")])
def test_the_default_zone_is_the_first_of_the_region(tmp_path: Path, region: str, zone: str) -> None:
    # before: ZONE was REGION-a, and europe-west1 has no zone a
    fake = FakeGcloud(tmp_path)
    result = subprocess.run(["bash", "-c", f'source {GCP / "config.sh"}; need_zone; echo "$ZONE"'],
                            env={**fake.env, "REGION": region}, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, f"{zone}\n"), result.stderr


def test_a_zone_outside_the_region_stops_network_sh_before_it_creates_anything(tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path)
    result = fake.run("network.sh", REGION="europe-west1", ZONE="europe-west1-a")
    assert result.returncode == 2
    assert "ZONE=europe-west1-a is not a zone of REGION=europe-west1" in result.stderr
    assert not [c for c in fake.commands() if " create" in c], fake.commands()


def test_the_docs_copy_the_settings_secret_only_into_a_private_temporary_file() -> None:
    # before: `> market.env` in the working directory: readable by all, and in a checkout, in
    # git's view and in the Docker build context
    docs = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    copies = re.findall(r"gcloud secrets versions access latest --secret=market-env\s*>\s*(\S+)", docs)
    assert copies == ['"$f"'] and 'f=$(mktemp)' in docs and 'rm -f "$f"' in docs


# ---- deploy/observe: Prometheus and Grafana (compose profile `observe`) ----

def test_compose_observe_profile_scrapes_both_servers_on_their_metrics_port() -> None:
    services = compose()["services"]
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["observe"]
    port = interpolate(str(services["buyer"]["environment"]["MARKET_METRICS_PORT"]), env_example_values())
    scrape = yaml.safe_load((ROOT / "deploy" / "observe" / "prometheus.yml").read_text(encoding="utf-8"))
    targets = {target for job in scrape["scrape_configs"] for group in job["static_configs"]
               for target in group["targets"]}
    assert targets == {f"{role}:{port}" for role in SERVERS}
    for volume in services["prometheus"]["volumes"] + services["grafana"]["volumes"]:
        assert (ROOT / volume.split(":")[0]).is_file(), volume


def test_the_dashboard_and_the_alerts_query_only_metrics_the_servers_export() -> None:
    from prometheus_client import REGISTRY

    import observe.metrics  # noqa: F401  (registers them)

    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    exported = {family.name + suffix for family in REGISTRY.collect()
                for suffix in suffixes.get(family.type, [])}
    dashboard = json.loads((ROOT / "deploy" / "observe" / "grafana" / "market.json").read_text("utf-8"))
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    alerts = yaml.safe_load((ROOT / "deploy" / "observe" / "alerts.yml").read_text(encoding="utf-8"))
    queries += [rule["expr"] for group in alerts["groups"] for rule in group["rules"]]
    queried = {name for query in queries for name in re.findall(r"\bmarket_\w+", query)}
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    assert queried and queried <= exported, queried - exported
    assert not [query for query in queries if "role" in query]  # a label only compose's scrape added
    for shown in ("requests per second", "errors", "latency p99", "connections", "pool"):
        assert shown in titles, shown


# ---- the GCP scripts: who may connect, and TLS ----

def firewall_calls(fake: FakeGcloud) -> list[str]:
    """The calls on the clients' firewall rule (the health checkers' has ranges of its own)."""
    return [c for c in fake.commands() if c.startswith("compute firewall-rules")
            and "market-net-allow-market" in c]


def test_without_client_ranges_only_this_machine_may_reach_the_servers(tmp_path: Path) -> None:
    # before: CLIENT_RANGES defaulted to 0.0.0.0/0, the whole internet
    fake = FakeGcloud(tmp_path)
    result = fake.run("network.sh", FAKE_CALLER="198.51.100.23\n")
    assert result.returncode == 0, result.stderr
    created = [c for c in firewall_calls(fake) if " create " in c]
    assert len(created) == 1 and "--source-ranges=198.51.100.23/32 " in created[0], created
    assert "0.0.0.0/0" not in " ".join(fake.commands())
    assert "only this machine (198.51.100.23/32)" in result.stderr
    health = [c for c in fake.commands() if "firewall-rules create market-net-allow-health-checks" in c]
    assert len(health) == 1 and "--rules=tcp:9100 --source-ranges=35.191.0.0/16," in health[0]


def test_without_client_ranges_or_this_machines_address_nothing_is_created(tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path)
    result = fake.run("network.sh")  # curl fails, and no terminal to ask
    assert result.returncode == 2 and "set CLIENT_RANGES" in result.stderr, result.stderr
    assert not [c for c in fake.commands() if " create " in f" {c} "], fake.commands()


def test_client_ranges_given_are_used_and_a_rerun_without_them_keeps_the_rules(tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path)
    assert fake.run("network.sh", CLIENT_RANGES="203.0.113.0/24,192.0.2.8/32").returncode == 0
    assert "--source-ranges=203.0.113.0/24,192.0.2.8/32 " in [c for c in firewall_calls(fake)
                                                           if " create " in c][0]
    again = fake.run("network.sh", FAKE_CALLER="198.51.100.23", BUYER_PORT="8001")
    assert again.returncode == 0, again.stderr
    updates = [c for c in firewall_calls(fake) if " update " in c]
    assert len(updates) == 1 and "tcp:8001" in updates[0] and "--source-ranges" not in updates[0], updates


def certificate_names(pem: str, tmp_path: Path) -> str:
    path = tmp_path / "check.pem"
    path.write_text(pem + "\n")
    return subprocess.run(["openssl", "x509", "-in", str(path), "-noout", "-ext", "subjectAltName"],
                          capture_output=True, text=True, timeout=30).stdout


def test_tls_sh_puts_a_certificate_naming_the_vms_ip_in_secret_manager(tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path, resources=["compute addresses market-ip"], address="203.0.113.7")
    result = fake.run("tls.sh", TLS_DIR=str(tmp_path / "ca"), TLS_NAMES="market.example.com")
    assert result.returncode == 0, result.stderr
    secrets = fake.current()["secrets"]
    cert, key, ca = (secrets[name] for name in ("market-tls-cert", "market-tls-key", "market-tls-ca"))
    assert ca == (tmp_path / "ca" / "ca.pem").read_text().rstrip("\n") and "PRIVATE KEY" in key
    names = certificate_names(cert, tmp_path)
    assert "IP Address:203.0.113.7" in names and "DNS:market.example.com" in names, names
    (tmp_path / "ca.pem").write_text(ca + "\n")
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"),
                               str(tmp_path / "check.pem")], capture_output=True, text=True, timeout=30)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    calls = fake.calls()
    assert not [c for c in calls if key.splitlines()[1] in " ".join(c["args"])], "the key on a command line"
    seeing = [c for c in calls if key.splitlines()[1] in (c["stdin"] or "")]
    assert len(seeing) == 1 and seeing[0]["env"]["CLOUDSDK_CORE_DISABLE_FILE_LOGGING"] == "1"
    again = fake.run("tls.sh", TLS_DIR=str(tmp_path / "ca"))
    assert again.returncode == 0 and "kept" in again.stdout
    assert not [c for c in fake.commands() if c.startswith("secrets") and "describe" not in c]


def test_tls_sh_uploads_your_own_certificate_and_refuses_half_of_one(tmp_path: Path) -> None:
    own = tmp_path / "own"
    subprocess.run(["bash", str(ROOT / "deploy" / "tls" / "make-certs.sh"), str(own), "market.example.com"],
                   check=True, capture_output=True, timeout=60)
    fake = FakeGcloud(tmp_path)
    half = fake.run("tls.sh", TLS_CERT=str(own / "server.pem"))
    assert half.returncode == 2 and "go together" in half.stderr
    result = fake.run("tls.sh", TLS_CERT=str(own / "server.pem"), TLS_KEY=str(own / "server.key"),
                      TLS_CA=str(own / "ca.pem"))
    assert result.returncode == 0, result.stderr
    secrets = fake.current()["secrets"]
    assert secrets["market-tls-cert"] == (own / "server.pem").read_text().rstrip("\n")
    assert secrets["market-tls-key"] == (own / "server.key").read_text().rstrip("\n")


@pytest.mark.parametrize("role", SERVERS)
def test_the_vms_servers_serve_tls_from_the_files_startup_installs(role: str) -> None:
    environment = " ".join(unit(f"market-{role}.service")["Environment"]).split()
    settings = dict(pair.split("=", 1) for pair in environment)
    files = {name: value for name, value in settings.items() if name.startswith("MARKET_TLS_")}
    # the health checks' port, the one config.sh opens to Google's checkers
    config = (GCP / "config.sh").read_text(encoding="utf-8")
    assert f'HEALTH_PORT={settings["MARKET_METRICS_PORT"]} ' in config
    assert settings["MARKET_METRICS_HOST"] == "0.0.0.0" and settings["MARKET_LOG_FORMAT"] == "json"
    tls = "/etc/market/tls"
    assert files == {"MARKET_TLS_CERT": f"{tls}/server.pem", "MARKET_TLS_KEY": f"{tls}/server.key",
                     "MARKET_TLS_CA": f"{tls}/ca.pem"}
    startup = (GCP / "startup.sh").read_text(encoding="utf-8")
    for path in files.values():
        name = path.rsplit("/", 1)[1]
        assert f'"{name}:${{TLS_SECRETS[' in startup, name
    assert '"/etc/market/tls/${pair%%:*}"' in startup
    assert "\"$here/tls.sh\"" in (GCP / "up.sh").read_text(encoding="utf-8")


# ---- alert rules ----

def test_the_alert_rules_and_the_scrape_configuration_pass_promtool() -> None:
    promtool = require_tool("promtool", "prometheus")
    observe = ROOT / "deploy" / "observe"
    for check in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"]):
        done = subprocess.run([promtool, *check], cwd=observe, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    rules = yaml.safe_load((observe / "alerts.yml").read_text())["groups"][0]["rules"]
    assert {rule["alert"] for rule in rules} >= {"MarketErrorRate", "MarketLatencyHigh", "MarketSaturated",
                                                  "MarketPaymentFailures", "MarketSettlementBacklog"}


# ---- the GCP scripts: instance groups, load balancers, Cloud SQL's protection, --dry-run ----

READS = ("describe", "list", "get-value", "access", "describe-from-family")


def test_up_dry_run_prints_the_whole_plan_and_changes_nothing(tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path)
    result = subprocess.run(["bash", str(GCP / "up.sh"), "--dry-run"], cwd=ROOT, stdin=subprocess.DEVNULL,
                            env={**fake.env, "CLIENT_RANGES": "203.0.113.0/24", "PROXY_SHA256": "ab" * 32,
                                 "TLS_DIR": str(tmp_path / "tls")},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert all(set(call["args"]) & set(READS) for call in fake.calls()), fake.commands()  # reads alone
    assert fake.current()["resources"] == [] and not (tmp_path / "tls").exists()
    plan = [line for line in result.stdout.splitlines() if line.startswith("would run:")]
    wanted = {
        "gcloud sql instances create": ["--availability-type=REGIONAL", "--enable-bin-log",
                                        "--retained-transaction-log-days=7", "--deletion-protection"],
        "gcloud compute health-checks create http market-buyer-live": ["--port=9100",
                                                                        "--request-path=/healthz"],
        "gcloud compute health-checks create http market-seller-ready": ["--request-path=/readyz"],
        "gcloud compute instance-groups managed create market-buyer": [
            "--size=2", "--health-check=projects/p/regions/us-central1/healthChecks/market-buyer-live"],
        "gcloud compute backend-services create market-seller": [
            "--protocol=TCP", "--health-checks=market-seller-ready", "--connection-draining-timeout=60"],
        "gcloud compute forwarding-rules create market-buyer": ["--ports=7001", "--address=market-ip"],
        "gcloud compute forwarding-rules create market-seller": ["--ports=7002", "--address=market-ip"],
        "gcloud compute instance-templates create market-buyer-": ["--no-address",
                                                                    "--metadata=market-role=buyer"],
        "gcloud compute images create market-": ["--family=market", "--source-disk=market-image-builder"],
        "gcloud compute instances create market-image-builder": [f"proxy-sha256={'ab' * 32}"],
    }
    for command, flags in wanted.items():
        lines = [line for line in plan if command in line]
        assert len(lines) == 1, (command, plan)
        assert all(flag in lines[0] for flag in flags), (flags, lines[0])


def test_the_image_is_not_baked_without_the_proxys_checksum(tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path)
    result = fake.run("image.sh")
    assert result.returncode == 2 and "PROXY_SHA256" in result.stderr
    assert not [c for c in fake.commands() if " create " in f" {c} "]


def test_mig_sh_makes_both_groups_then_rolls_them_onto_a_new_image_without_losing_capacity(
        tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path, resources=["compute addresses market-ip"], image="market-20260101-000000")
    first = fake.run("mig.sh")
    assert first.returncode == 0, first.stderr
    made = fake.current()["resources"]
    for role in ("buyer", "seller"):
        for kind in ("instance-groups managed", "backend-services", "forwarding-rules"):
            assert f"compute {kind} market-{role}" in made
    again = fake.run("mig.sh")  # nothing changed: no new template, and the groups stay on theirs
    assert again.returncode == 0, again.stderr
    assert not [c for c in fake.commands() if "instance-templates create" in c]
    state = fake.current()
    state["image"] = "market-20260102-000000"
    fake.state_path.write_text(json.dumps(state))
    rolled = fake.run("mig.sh")
    assert rolled.returncode == 0, rolled.stderr
    templates = [c for c in fake.commands() if "instance-templates create" in c]
    assert len(templates) == 2 and all("--image=market-20260102-000000" in c for c in templates)
    updates = [c for c in fake.commands() if "rolling-action start-update" in c]
    assert len(updates) == 2
    for update in updates:
        assert "--max-unavailable=0" in update and "--max-surge=3" in update and "--type=proactive" in update
    assert not [c for c in fake.commands() if " delete " in f" {c} "]


def test_cloudsql_brings_an_older_instance_to_high_availability_and_protection(tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path, resources=["sql instances market-sql", "sql databases market",
                                           "secrets market-env"],
                      secrets={"market-env": "MARKET_BUYER_PORT=7001\nMARKET_SELLER_PORT=7002"})
    result = fake.run("cloudsql.sh")
    assert result.returncode == 0, result.stderr
    patches = [c for c in fake.commands() if c.startswith("sql instances patch market-sql")]
    assert len(patches) == 1
    for flag in ("--availability-type=REGIONAL", "--enable-bin-log", "--deletion-protection"):
        assert flag in patches[0]


def test_teardown_lifts_the_databases_deletion_protection_only_to_delete_it(tmp_path: Path) -> None:
    fake = FakeGcloud(tmp_path, resources=["sql instances market-sql"])
    assert fake.run("teardown.sh", YES="1").returncode == 0
    sql = [c for c in fake.commands() if c.startswith("sql instances") and "describe" not in c]
    assert sql == ["sql instances patch market-sql --project p --no-deletion-protection --quiet",
                   "sql instances delete market-sql --project p --quiet"]
