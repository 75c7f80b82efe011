#!/bin/sh
# compose.yaml's weir service, in Weir's image: makes what weir.compose.yaml's connectors send
# to (the NATS streams, the Kafka topic, the SQS queue; brokers still starting are waited for),
# then runs weir.
config=/etc/weir/weir.yaml

retry() {  # up to 2 minutes
    n=0
    until "$@"; do
        n=$((n + 1))
        [ "$n" -lt 60 ] || return 1
        sleep 2
    done
}

retry weir nats setup --config "$config" || exit 1
retry weir kafka setup --config "$config" || exit 1
retry python3 -c '
import boto3
sqs = boto3.client("sqs", endpoint_url="http://localstack:4566", region_name="us-east-1",
                   aws_access_key_id="test", aws_secret_access_key="test")
print("events-to-sqs: queue", sqs.create_queue(QueueName="weir-events")["QueueUrl"])
' || exit 1
exec weir run --config "$config"
