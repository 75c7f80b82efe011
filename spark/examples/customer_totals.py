"""An aggregate Spark computes from Weir's events stream and sends back out through Weir: the
orders each customer placed and their amount, kept current in an ``http`` source whose
connectors forward it (to NATS, say) as records pushed by an API sync are (docs/spark.md
“The example pipeline”).

    python -m spark.examples.customer_totals --config weir.yaml --source app --into computed \
        --checkpoint /data/customer-totals.ckpt --master 'local[2]' --available-now
    spark-submit --py-files weir.zip spark/examples/customer_totals.py --config weir.yaml …

The orders are the inserts of ``public.orders`` (``customer_id``, ``total``). Each micro-batch's
updated totals are written with the batch writer (``foreachBatch``: a streaming writer of a
Python data source takes appends only), each with its version, the highest seq it counts: a
micro-batch Spark runs again after a failure writes the same versions, which Weir's ingest
skips, so no subscriber gets it twice.
"""

from __future__ import annotations

import argparse
from typing import Any

ORDERS = "customer_id long, total string"  # numeric arrives as text: every digit


def totals_query(spark: Any, config: str, source: str, into: str, checkpoint: str) -> Any:
    """The streaming query's writer, not yet started."""
    from pyspark.sql import functions as F

    from spark.source import WeirSource

    spark.dataSource.register(WeirSource)
    orders = (
        spark.readStream.format("weir")
        .option("config", config)
        .option("source", source)
        .option("collections", "public:orders")
        .option("actions", "insert")
        .option("name", "customer-totals")
        .load()
        .select(F.from_json("record", ORDERS).alias("o"), "seq")
    )
    totals = orders.groupBy("o.customer_id").agg(
        F.count("*").alias("orders"),
        F.sum(F.col("o.total").cast("decimal(38,2)")).alias("amount"),
        F.max("seq").alias("version"),
    )
    rows = totals.select(
        F.lit("computed:customer_totals").alias("collection_id"),
        F.col("customer_id").cast("string").alias("record_id"),
        F.to_json(F.struct("customer_id", "orders", "amount")).alias("data"),
        "version",
    )

    def write(batch: Any, batch_id: int) -> None:  # an aggregate's updates: the batch writer
        batch.write.format("weir").option("config", config).option("source", into).mode(
            "append"
        ).save()

    return (
        rows.writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
    )


def main(argv: list[str] | None = None) -> int:
    from spark.session import spark_session

    p = argparse.ArgumentParser(prog="customer_totals", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="the weir YAML file")
    p.add_argument("--source", required=True, help="the postgres source with public.orders")
    p.add_argument("--into", required=True, help="the http source the totals are written into")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    p.add_argument("--available-now", action="store_true", help="read what is there, then stop")
    args = p.parse_args(argv)
    spark = spark_session(args.master, None, app="weir-customer-totals")
    writer = totals_query(spark, args.config, args.source, args.into, args.checkpoint)
    trigger = {"availableNow": True} if args.available_now else {"processingTime": "5 seconds"}
    writer.trigger(**trigger).start().awaitTermination()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
