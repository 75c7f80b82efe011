"""``weir spark stream``: a source's stream into Parquet files partitioned by collection, with
the ``weir`` data source (spark/source.py) on a Structured Streaming query (docs/spark.md).

    weir spark stream --config FILE --source S --out DIR --checkpoint DIR [--available-now]

The checkpoint holds the query's offsets (seqs): run it again with the same checkpoint and it
goes on after the last micro-batch Spark committed, so every message reaches the files once,
also after the driver was killed. ``spark-submit spark/stream.py`` takes the same arguments.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger("weir.spark")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
    p.add_argument("--source", help="the source whose stream is read (default: the only one)")
    p.add_argument("--stream", choices=("events", "records"), default="events")
    p.add_argument("--collections", help="collection patterns, comma-separated (default: all)")
    p.add_argument(
        "--start",
        default="beginning",
        help="where a new query starts: beginning, end, seq:N or an ISO time",
    )
    p.add_argument("--out", required=True, help="the directory of the Parquet files")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    p.add_argument(
        "--name",
        help="the query's name: its committed seq is kept in the store as "
        "the cursor spark:NAME (weir status shows it)",
    )
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    p.add_argument("--partitions", type=int, default=2, help="read tasks a micro-batch")
    p.add_argument("--max-per-trigger", type=int, help="messages a micro-batch at most")
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--available-now",
        action="store_true",
        help="read what the stream holds now, in micro-batches, then stop",
    )
    when.add_argument(
        "--every",
        type=float,
        default=5.0,
        help="seconds between micro-batches of a query that runs until stopped",
    )


def stream_command(args: argparse.Namespace) -> int:
    """Run the query until it stops (``--available-now``) or is stopped."""
    from spark.options import spec_of
    from spark.session import spark_session
    from spark.source import WeirSource

    options = {
        "config": args.config,
        "source": args.source,
        "stream": args.stream,
        "collections": args.collections,
        "start": args.start,
        "name": args.name,
        "partitions": str(args.partitions),
        "maxMessagesPerTrigger": None
        if args.max_per_trigger is None
        else str(args.max_per_trigger),
    }
    options = {key: value for key, value in options.items() if value is not None}
    spec_of(options)  # a wrong option fails here, in one line, before Spark starts
    spark = spark_session(args.master, None, app="weir-stream")
    spark.dataSource.register(WeirSource)
    reader = spark.readStream.format("weir")
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint)
        .partitionBy("collection_id")
    )
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.every} seconds")
    query = writer.start()
    log.info(
        "spark stream: %s stream of %s into %s", args.stream, args.source or "the source", args.out
    )
    try:
        query.awaitTermination()
    except Exception as e:
        raise StreamError(_reason(e)) from e
    return 0


class StreamError(RuntimeError):
    """The query failed; the message is the data source's own when it gave one."""


def _reason(e: Exception) -> str:
    """The data source's message of a failed query (the last ``SourceError:`` line of the
    Python traceback Spark wraps it in), else Spark's first line."""
    lines = [line for line in str(e).splitlines() if "SourceError: " in line]
    if lines:
        return lines[-1].split("SourceError: ", 1)[1]
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """``spark-submit spark/stream.py``: the arguments of ``weir spark stream``."""
    from core.config.settings import WeirSettings
    from core.logs import setup_logging

    parser = argparse.ArgumentParser(prog="weir spark stream", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.config = args.config or WeirSettings().config
    if args.config is None:
        parser.error("give --config FILE (or set WEIR_CONFIG)")
    setup_logging("info")
    return stream_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
