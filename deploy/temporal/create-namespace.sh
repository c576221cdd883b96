#!/bin/sh
# Creates the namespace the outbox uses ($NAMESPACE, default "default") once the Temporal
# frontend answers. Runs in the temporalio/admin-tools image; safe to run again.
set -eu
ns=${NAMESPACE:-default}
tries=0
until temporal operator cluster health --address "$TEMPORAL_ADDRESS" >/dev/null 2>&1; do
	tries=$((tries + 1))
	if [ "$tries" -ge 60 ]; then
		echo "Temporal at $TEMPORAL_ADDRESS is not healthy after 60 tries" >&2
		exit 1
	fi
	sleep 2
done
temporal operator namespace describe --namespace "$ns" --address "$TEMPORAL_ADDRESS" >/dev/null 2>&1 ||
	temporal operator namespace create --namespace "$ns" --retention 72h --address "$TEMPORAL_ADDRESS"
echo "namespace $ns is ready"
