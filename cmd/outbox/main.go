// Command outbox runs the Temporal-native transactional outbox: the schema migration, the
// worker, the relay, and tools to enqueue and inspect messages.
//
//	outbox migrate --config outbox.yaml
//	outbox worker  --config outbox.yaml
//	outbox relay   --config outbox.yaml
//	echo '{"order_id": 7}' | outbox enqueue order.created
//	outbox dev     # everything on one machine, with the Temporal Web UI
//	outbox bench   # end-to-end throughput and latency against the naive shape
//
// Every subcommand reads --config FILE (YAML); DATABASE_URL, TEMPORAL_ADDRESS,
// TEMPORAL_NAMESPACE and OUTBOX_TASK_QUEUE override it.
//
// The binary does not link the Temporal server: dev and bench run the Temporal CLI's
// development server when a temporal command is on PATH, else the outbox's own server
// (cmd/outbox/internal/temporalserver), built with the go command on first use, in a
// child process. Built with the nodev tag (go build -tags nodev), the binary leaves dev and
// bench out: that is the production image's binary.
package main

import "github.com/outbox-go/outbox/cmd/outbox/internal/cli"

func main() { cli.Main(devCommands...) }
