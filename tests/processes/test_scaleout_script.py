"""simulation/scaleout.py: its command line, its table, CSV and plot from made-up results, the
standalone configuration it takes from galera.sh, and one tiny real run through servers.sh
(skipped with a reason without haproxy or MariaDB, required under CI=true).
"""
from __future__ import annotations

import csv
import math
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import missing

from simulation.scaleout import (
    CLUSTER,
    SINGLE,
    DatabaseServer,
    Measured,
    admin_url,
    drop_database,
    parse_args,
    ratios,
    standalone_config,
    write_results,
)
from simulation.stats import ALL, OpSummary

ROOT = Path(__file__).resolve().parents[2]


def test_the_defaults_are_those_of_the_issue() -> None:
    args = parse_args([])
    assert (args.processes, args.users, args.calls, args.repeats) == ([1, 2, 4], 10, 200, 3)
    assert args.mix == ["default"]
    assert not args.skip_galera and args.single_url is None and args.out.is_absolute()


def test_options_are_read_and_checked() -> None:
    args = parse_args(["--processes", "4,1,2,2", "-n", "5", "-k", "7", "-r", "1", "--mix", "default,classic",
                       "--skip-galera", "--single-url", "mysql://root@127.0.0.1:3306"])
    assert (args.processes, args.users, args.calls, args.repeats) == ([1, 2, 4], 5, 7, 1)
    assert args.mix == ["default", "classic"] and args.skip_galera
    for bad in (["--processes", "0"], ["--processes", "x"], ["--mix", "nope"], ["-k", "0"],
                ["--database", "a;drop"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def summary(ops_median: float, p99: float, mix: str = "default") -> OpSummary:
    return OpSummary(mix=mix, users=10, op=ALL, runs=3, calls=6000, errors=0, conflicts=4, mean_ms=20.0,
                     p50_ms=15.0, p95_ms=60.0, p99_ms=p99, ops_per_s=ops_median + 5, ops_per_s_sd=12.5,
                     ops_per_s_median=ops_median)


SYNTHETIC = [Measured(f"{SINGLE} (standalone)", 1, summary(200.0, 150.0), 0),
             Measured(f"{SINGLE} (standalone)", 2, summary(300.0, 120.0), 0),
             Measured(CLUSTER, 1, summary(150.0, 180.0), 0),
             Measured(CLUSTER, 2, summary(150.0, 170.0), 2)]
SERVERS = [DatabaseServer(f"{SINGLE} (standalone)", "mysql://root@127.0.0.1:1",
                          {"innodb_flush_log_at_trx_commit": "2",
                           "innodb_buffer_pool_size": str(32 * 2**20)}),
           DatabaseServer(CLUSTER, "mysql://root@127.0.0.1:2", {"innodb_flush_log_at_trx_commit": "2"})]


def test_the_admin_url_is_the_server_alone_on_mysql_connector() -> None:
    url = admin_url("mariadb://root:pw@127.0.0.1:3307/shop?charset=utf8mb4")
    assert url.render_as_string(hide_password=False) == "mysql+mysqlconnector://root:pw@127.0.0.1:3307"


def test_the_ratio_is_cluster_over_single_median_per_process_count() -> None:
    assert ratios(SYNTHETIC) == [(1, "default", 200.0, 150.0, 0.75), (2, "default", 300.0, 150.0, 0.5)]
    assert ratios(SYNTHETIC[:2]) == []


def test_table_csv_and_plot_are_written(tmp_path: Path) -> None:
    paths = write_results(SYNTHETIC, SERVERS, tmp_path, "# Scale-out\n\ntest")
    assert [p.name for p in paths] == ["scaleout.md", "scaleout.csv", "scaleout.png"]
    table = paths[0].read_text()
    assert (f"| 1 | {SINGLE} (standalone) | default | 6000 | 0 | 15.00 | 150.00 | 205.0 ± 12.5 | 200.0 "
            "| consistent |") in table
    assert "| 2 violations |" in table
    assert "| 1 | default | 200.0 | 150.0 | 75.0% | yes |" in table
    assert "| 2 | default | 300.0 | 150.0 | 50.0% | NO |" in table
    assert "innodb_flush_log_at_trx_commit=2, innodb_buffer_pool_size=32M" in table
    assert "**Not like-for-like:** the sides differ in innodb_buffer_pool_size." in table
    with paths[1].open() as rows:
        read = list(csv.DictReader(rows))
    assert [(r["database"], int(r["processes"])) for r in read] == [(m.database, m.processes)
                                                                    for m in SYNTHETIC]
    assert math.isclose(float(read[2]["ops_per_s_median"]), 150.0) and read[3]["violations"] == "2"
    assert paths[2].read_bytes().startswith(b"\x89PNG")


def test_the_standalone_server_gets_a_galera_nodes_settings_without_replication(tmp_path: Path) -> None:
    config = standalone_config(tmp_path, 24000)
    assert "innodb_flush_log_at_trx_commit=2" in config and "innodb_buffer_pool_size=32M" in config
    assert "port=24001" in config and f"datadir={tmp_path}/node1/data" in config
    assert "wsrep" not in config


@pytest.fixture
def short_path() -> Iterator[Path]:
    """A folder of a short path: HAProxy's admin socket under it must fit in 97 characters."""
    folder = Path(tempfile.mkdtemp(prefix="scaleout-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_tiny_run_through_servers_sh_writes_its_results(mysql_server: str, short_path: Path) -> None:
    tmp_path = short_path
    if not shutil.which("haproxy"):
        missing("the scale-out setup", "haproxy is not installed (apt-get install haproxy)")
    name = f"scaleout_test_{secrets.token_hex(4)}"
    server = admin_url(mysql_server).set(drivername="mysql").render_as_string(hide_password=False)
    try:
        done = subprocess.run([sys.executable, "-m", "simulation.scaleout", "-n", "1", "-k", "2", "-r", "1",
                               "--processes", "1", "--skip-galera", "--single-url", server,
                               "--database", name, "--out", str(tmp_path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        drop_database(mysql_server, name)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[1/1] one MariaDB, processes per role 1" in done.stdout and "consistency: OK" in done.stdout
    table = (tmp_path / "scaleout.md").read_text()
    assert f"| 1 | {SINGLE} | default | 4 | 0 |" in table  # 1 + 1 users, 2 calls each
    assert "innodb_flush_log_at_trx_commit=" in table
    assert (tmp_path / "scaleout.png").stat().st_size > 0
    servers_dir = tmp_path / "one-mariadb-1" / "servers"
    assert not list(servers_dir.glob("*.pid")), "servers.sh stop left a process behind"




def test_servers_sh_refuses_a_folder_too_long_for_the_admin_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    script = ROOT / "deploy" / "local" / "servers.sh"
    done = subprocess.run(["bash", str(script), "start", "--dir", str(deep)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "too long for HAProxy's admin socket" in done.stderr and not deep.exists()
