"""PySpark's worker daemon for local masters, importing PySpark from its installed package.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on its Python workers' path. Python
cannot cache bytecode for modules imported from a zip, so every worker process compiled
``pyspark.worker`` and what it imports from source: 1.2-1.4 s of CPU a process, against
~0.2 s from the installed package's cached bytecode. ``spark_session`` (spark/session.py)
picks this daemon (``spark.python.daemon.module``) only when the JVM is the installed
pyspark's own, so the zip and the package are the same code.
"""

import os
import sys


def _spark_zip(entry: str) -> bool:
    name = os.path.basename(entry)
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith(".zip"))


sys.path.sort(key=_spark_zip)  # stable: the zips go last, nothing else moves

from pyspark import daemon  # noqa: E402  (after the path is set)

if __name__ == "__main__":
    daemon.manager()
