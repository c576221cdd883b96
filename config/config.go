// Package config reads the outbox's YAML configuration: where the database and Temporal
// are, how the relay and worker run, and for each topic its sink and delivery policy.
//
// A minimal file:
//
//	database_url: postgres://app@db:5432/app
//	temporal:
//	  address: temporal:7233
//	topics:
//	  order.created:
//	    sink: http
//	    url: http://inventory:8080/events
//	    check_url: http://inventory:8080/events/{message_id}
//	    max_attempts: 12
//	    initial_interval: 1s
//	    backoff: 2
//	    max_interval: 1m
//	default:
//	  sink: http
//	  url: http://fallback:8080/events
//
// Environment variables override the file: every key as OUTBOX_<PATH>
// (OUTBOX_RELAY_POLL_INTERVAL=1s), and DATABASE_URL, TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
// OUTBOX_TASK_QUEUE and the Temporal CLI's TEMPORAL_* variables, which win; a profile of
// the Temporal CLI's temporal.toml fills the temporal section's unset keys (see
// [Config.ApplyEnv]).
package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkworker "go.temporal.io/sdk/worker"
	"gopkg.in/yaml.v3"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/httpsink"
	"github.com/outbox-go/outbox/sinks/kafkasink"
	"github.com/outbox-go/outbox/sinks/natssink"
	"github.com/outbox-go/outbox/sinks/rabbitsink"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/webhook"
	"github.com/outbox-go/outbox/workflows"
)

// Config is the whole configuration file.
type Config struct {
	// DatabaseURL names the database and how to reach it; its form chooses the database
	// (see DatabaseKind). PostgreSQL: a libpq URL (postgres://) or key=value form, the
	// standard PG* variables filling what it leaves out. MySQL and MariaDB: a mysql://
	// URL or the Go MySQL driver's DSN (user:password@tcp(host:3306)/app). Overridden
	// by DATABASE_URL.
	DatabaseURL string `yaml:"database_url"`
	// Schema holds the outbox tables on PostgreSQL. Defaults to "public". On MySQL the
	// tables live in the database database_url names, and schema must stay unset.
	Schema string `yaml:"schema"`
	// MaxPayloadBytes limits message payloads. Defaults to 262144 (256 KiB).
	MaxPayloadBytes int `yaml:"max_payload_bytes"`
	// SearchAttributes turns the OutboxTopic, OutboxStatus and OutboxMessageId search
	// attributes on or off. Defaults to true.
	SearchAttributes *bool `yaml:"search_attributes"`

	Temporal  Temporal  `yaml:"temporal"`
	Relay     Relay     `yaml:"relay"`
	Worker    Worker    `yaml:"worker"`
	Retention Retention `yaml:"retention"`
	Metrics   Metrics   `yaml:"metrics"`
	Alerts    Alerts    `yaml:"alerts"`
	// Codec encrypts workflow and activity payloads and failure messages in Temporal's
	// history. Off unless keys are configured (or OUTBOX_CODEC_KEY is set).
	Codec Codec `yaml:"codec"`

	// UIURL is the Temporal Web UI's base URL, for links to a message's workflow.
	// Defaults to http://127.0.0.1:8233.
	UIURL string `yaml:"ui_url"`

	// Topics maps a topic name to its sink and policy.
	Topics map[string]Topic `yaml:"topics"`
	// Default serves topics that Topics does not list. Without it such a topic is a
	// permanent failure: its messages are dead-lettered.
	Default *Topic `yaml:"default"`

	// PolicyAsOf is when the delivery policies of the topics (and of the default entry)
	// last changed. Load sets it to the file's modification time, or to the time of
	// loading when the environment changes a topic's policy (OUTBOX_TOPICS,
	// OUTBOX_DEFAULT_*). When it is set, each relay and worker publishes its policies to
	// the database as it starts and each relay follows the newest published ones (see
	// storedriver.PublishedPolicy): a policy change reaches new runs whichever process
	// reads the changed file first, and a process restarted with an older file follows
	// the newer policies instead of bringing its own back. Zero (a config built in Go
	// that leaves it unset): the process neither publishes nor follows, and its relay
	// freezes its own policies into the runs it starts.
	PolicyAsOf time.Time `yaml:"-"`
	// Path is the file Load read, named beside the policies it publishes; empty for a
	// config built in Go.
	Path string `yaml:"-"`

	lookupEnv func(string) (string, bool) // set by ApplyEnv; os.LookupEnv otherwise
}

// Temporal says where the Temporal frontend is.
type Temporal struct {
	// Address is the frontend's host:port. Defaults to 127.0.0.1:7233. Overridden by
	// TEMPORAL_ADDRESS.
	Address string `yaml:"address"`
	// Namespace defaults to "default". Overridden by TEMPORAL_NAMESPACE.
	Namespace string `yaml:"namespace"`
	// TaskQueue is where the delivery workflows and activities run. Defaults to
	// "outbox". Overridden by OUTBOX_TASK_QUEUE.
	TaskQueue string `yaml:"task_queue"`
	// TLS secures the connection to the frontend. Off unless set (or an API key is set).
	TLS TLS `yaml:"tls"`
	// APIKey authenticates to the frontend (Temporal Cloud, or a server with an
	// authorizer); it turns TLS on unless tls.enabled is false. Overridden by
	// TEMPORAL_API_KEY. Never logged.
	APIKey string `yaml:"api_key"`
	// Authority is the :authority pseudo-header and virtual host of the gRPC connection,
	// when a proxy routes by it. Optional. Overridden by TEMPORAL_CLIENT_AUTHORITY.
	Authority string `yaml:"authority"`
	// GRPCMeta are headers sent with every call to the frontend (a proxy's routing or
	// tenant header). Names are lower-cased, underscores made hyphens. Optional; merged
	// per header over the profile's grpc_meta.
	GRPCMeta map[string]string `yaml:"grpc_meta"`
	// Profile names the profile of the Temporal CLI's config file (temporal.toml, at
	// TEMPORAL_CONFIG_FILE or the CLI's default path) that gives the settings this section
	// leaves unset: address, namespace, api_key, tls, authority and grpc_meta. Defaults
	// to "default", which may be absent; a profile named here or by TEMPORAL_PROFILE
	// (which wins) must exist. Read by [Load], [LoadEnv] and [Config.ApplyEnv].
	Profile string `yaml:"profile"`
}

// Relay tunes the relay.
type Relay struct {
	// BatchSize is the number of rows one claim takes. Defaults to 100.
	BatchSize int `yaml:"batch_size"`
	// Wakeup is how the relay learns of new rows: "poll" (the default) claims every
	// poll_interval and costs the business transactions nothing; "notify" also listens to
	// the table's NOTIFY trigger, which `outbox migrate` then turns on: a wake-up in
	// milliseconds, paid by every enqueuing transaction with PostgreSQL's global notify
	// lock at commit.
	Wakeup string `yaml:"wakeup"`
	// PollInterval is how often the relay looks for due rows without a notification.
	// Defaults to 50ms with wakeup poll, 1s with wakeup notify.
	PollInterval Duration `yaml:"poll_interval"`
	// Lease is how long a claim holds its rows before another relay may take them.
	// Defaults to 30s.
	Lease Duration `yaml:"lease"`
	// StartConcurrency is the number of workflow starts in flight at once. Defaults to 16.
	StartConcurrency int `yaml:"start_concurrency"`
	// ReconcileAfter is how long a row may stay dispatched without change before the
	// relay checks its workflow with Temporal and repairs the row if the workflow is gone
	// or closed without recording it. Defaults to 5m.
	ReconcileAfter Duration `yaml:"reconcile_after"`
	// ReconcileInterval is how often the relay looks for such rows. Defaults to 1m.
	ReconcileInterval Duration `yaml:"reconcile_interval"`
	// MaxInFlightPerTopic is the most messages of one topic handed to Temporal and not
	// yet sent or dead-lettered at once; the relays leave the rest in the table, parked,
	// and hand them over oldest first as the topic's messages finish, so that one topic's
	// backlog cannot delay the others. Keyed messages count but are not held by it.
	// Defaults to 20; -1 sets no limit. See docs/delivery.md.
	MaxInFlightPerTopic int `yaml:"max_in_flight_per_topic"`
}

// Worker tunes the worker.
type Worker struct {
	// MaxConcurrentActivities caps the activities one worker runs at once, and likewise
	// its local activities (the first attempts of sink topics, and the database steps).
	// Defaults to 200.
	MaxConcurrentActivities int `yaml:"max_concurrent_activities"`
	// MaxSendsPerTopic caps the sends of one topic that one worker runs at once, so that
	// a topic whose downstream hangs cannot take every send slot from the others: a send
	// over it is not made, and its delivery waits and asks again without using an attempt.
	// Defaults to half of MaxConcurrentActivities (100); at most MaxConcurrentActivities,
	// which lets one topic take every slot.
	MaxSendsPerTopic int `yaml:"max_sends_per_topic"`
	// WorkflowTaskPollers and ActivityTaskPollers are the goroutines that poll Temporal
	// for tasks. Defaults to 0, the SDK's default (2 each); otherwise 2 to 1000 (the SDK
	// refuses 1).
	WorkflowTaskPollers int `yaml:"workflow_task_pollers"`
	ActivityTaskPollers int `yaml:"activity_task_pollers"`
	// AutoscalePollers lets the SDK scale both kinds of pollers between 1 and 100 by
	// load, instead of fixed numbers. Defaults to false.
	AutoscalePollers bool `yaml:"autoscale_pollers"`
	// StopTimeout is how long a stopping worker (SIGTERM, a rolling deploy) lets the
	// sends in flight finish, after it stopped taking new tasks, before it cancels them
	// (a cancelled send is an ambiguous failure, checked and resent). Defaults to the
	// longest timeout of the topics this worker sends, plus 5s: 35s with the defaults.
	// Give the process at least this long before it is killed (Kubernetes:
	// terminationGracePeriodSeconds).
	StopTimeout Duration `yaml:"stop_timeout"`
}

// Retention removes old rows in bounded batches. It runs as the Temporal Schedule
// outbox-retention (outbox-retention-<task queue> for a task queue other than outbox,
// workflows.RetentionScheduleFor), which the worker creates when Enabled, and on demand
// with `outbox retention run`.
type Retention struct {
	// Enabled makes the worker create (or update) the schedule. Defaults to false.
	Enabled bool `yaml:"enabled"`
	// SentAfter is the age (since sent_at) after which sent messages are removed.
	// Defaults to 168h (7 days).
	SentAfter Duration `yaml:"sent_after"`
	// DiscardedAfter is the age after which discarded messages and their dead letters
	// are removed. Defaults to 720h (30 days).
	DiscardedAfter Duration `yaml:"discarded_after"`
	// Archive moves the rows to outbox_messages_archive and outbox_dead_letters_archive
	// instead of deleting them. Defaults to false.
	Archive bool `yaml:"archive"`
	// BatchSize is the number of rows one short transaction removes. Defaults to 1000.
	BatchSize int `yaml:"batch_size"`
	// Interval is how often the schedule runs. Defaults to 1h.
	Interval Duration `yaml:"interval"`
}

// PurgeOptions maps the retention settings (after defaults) onto the store's purge
// options, for running retention without Temporal (outbox retention run).
func (r Retention) PurgeOptions() store.PurgeOptions {
	return store.PurgeOptions{
		SentAfter:      time.Duration(r.SentAfter),
		DiscardedAfter: time.Duration(r.DiscardedAfter),
		Archive:        r.Archive,
		Limit:          r.BatchSize,
	}
}

// WorkflowInput maps the retention settings (after defaults) onto the input of the
// OutboxRetention workflow that the retention schedule starts.
func (r Retention) WorkflowInput() workflows.RetentionInput {
	p := r.PurgeOptions()
	return workflows.RetentionInput{SentAfter: p.SentAfter, DiscardedAfter: p.DiscardedAfter, Archive: p.Archive, BatchSize: p.Limit}
}

// Metrics configures the Prometheus endpoint of the worker and the relay.
type Metrics struct {
	// Address serves /metrics, /healthz and /readyz, e.g. "127.0.0.1:9090". Empty turns
	// the endpoint off. Defaults to empty.
	Address string `yaml:"address"`
}

// Alerts configures what happens besides the error log line when a message is
// dead-lettered.
type Alerts struct {
	// WebhookURL receives a POST with the dead letter as JSON for every topic that has no
	// alert_webhook of its own. Optional.
	WebhookURL string `yaml:"webhook_url"`
}

// Topic is one topic's sink and delivery policy.
type Topic struct {
	// Sink names the handler: "http" (the default) is built in; a worker may register
	// others.
	Sink string `yaml:"sink"`
	// URL receives the POSTs of the http sink.
	URL string `yaml:"url"`
	// CheckURL, with {message_id} in it, answers 200 when the downstream already has a
	// message and 404 when it does not (http sink). Optional.
	CheckURL string `yaml:"check_url"`
	// Headers are added to every request of the http sink and to every message of the
	// broker sinks.
	Headers map[string]string `yaml:"headers"`

	// Subject is the NATS subject of sink: nats, a template over {topic}, {message_id}
	// and {ordering_key}. Defaults to "{topic}". The url is the NATS server's
	// (nats://host:4222; several, comma-separated, for a cluster).
	Subject string `yaml:"subject"`
	// Exchange is the RabbitMQ exchange of sink: rabbitmq; empty is the default exchange,
	// which routes by queue name. The url is the broker's (amqp://host:5672/vhost or
	// amqps://).
	Exchange string `yaml:"exchange"`
	// RoutingKey is the routing key of sink: rabbitmq, a template like subject. Defaults
	// to "{topic}".
	RoutingKey string `yaml:"routing_key"`
	// Brokers are the seed brokers (host:port) of sink: kafka.
	Brokers []string `yaml:"brokers"`
	// Topic is the Kafka topic of sink: kafka, a template like subject. Defaults to
	// "{topic}".
	Topic string `yaml:"topic"`
	// Username and Password authenticate to the broker (nats: user and password;
	// rabbitmq: PLAIN; kafka: SASL/PLAIN) instead of credentials in the url. Password is
	// a reference, never the secret itself: env:NAME or file:PATH.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// TLS secures the connection to the http endpoint or the broker: ca_file,
	// cert_file and key_file (PEM, for mutual TLS), server_name. Optional.
	TLS sinks.TLSFiles `yaml:"tls"`
	// SigningSecrets sign the http sink's requests (Standard Webhooks: webhook-id,
	// webhook-timestamp, webhook-signature). Each is a reference, env:NAME or file:PATH, to
	// a secret "whsec_" + base64 of 24 to 64 random bytes; with several, each request
	// carries one signature per secret (for rotation). Optional.
	SigningSecrets []string `yaml:"signing_secrets"`
	// AllowPlaintextAuth lets sink kafka send a SASL/PLAIN password without TLS, where
	// anyone on the path can read it: for a broker on localhost or a private link only.
	// Defaults to false: username and password need tls.
	AllowPlaintextAuth bool `yaml:"allow_plaintext_auth"`

	// MaxAttempts is the number of sends before the message is dead-lettered, unless the
	// row sets max_retry_times. Defaults to 12.
	MaxAttempts int `yaml:"max_attempts"`
	// InitialInterval is the wait after the first failure. Defaults to 1s.
	InitialInterval Duration `yaml:"initial_interval"`
	// Backoff multiplies the wait after each further failure. Defaults to 2.
	Backoff float64 `yaml:"backoff"`
	// MaxInterval caps the wait, Retry-After included. Defaults to 5m.
	MaxInterval Duration `yaml:"max_interval"`
	// Timeout bounds one send. Defaults to 30s.
	Timeout Duration `yaml:"timeout"`
	// MarkSentTimeout bounds the retries of recording a delivered message sent while the
	// database is unreachable; after it the run completes "delivered, not recorded" and
	// reconciliation records the row. Defaults to 10m.
	MarkSentTimeout Duration `yaml:"mark_sent_timeout"`
	// FirstAttempt says how a sink topic's first attempt runs: local (the default) as a
	// local activity in the delivery's first workflow task, which records the message sent
	// in that task (2 Temporal actions for a message delivered at once), or activity as a
	// regular activity like every later attempt. A timeout over 1m sends it as an activity
	// either way. Not for a topic delivered by a team's activity or workflow.
	FirstAttempt string `yaml:"first_attempt"`

	// AlertWebhook receives a POST for each dead letter of this topic, instead of
	// alerts.webhook_url. Optional.
	AlertWebhook string `yaml:"alert_webhook"`

	// Lane says how the topic's messages are handed to Temporal: message (the default),
	// one OutboxDelivery run per message; or batch, batch.size messages at a time to one
	// OutboxBatch run, which sends them together and gives every message that fails a
	// run of its own (docs/delivery.md). For a topic of a sink in the outbox's worker
	// (http, nats, rabbitmq, kafka, or a registered sink), not a team's activity or
	// workflow.
	Lane string `yaml:"lane"`
	// Batch sizes the batch lane's batches: size (messages per batch, default 100, at
	// most 1000), wait (how long a claimed message waits for its batch to fill, default
	// 200ms) and concurrency (how many messages a sink without a batch publish, such as
	// http, sends at once, default 16). Only with lane: batch.
	Batch BatchSettings `yaml:"batch"`

	// Ordering holds this topic's messages back while an earlier message with the same
	// ordering key is undelivered. Defaults to true; messages without a key are never held.
	Ordering *bool `yaml:"ordering"`
	// DeadLetterBlocksKey keeps later messages of a key waiting while a dead message of
	// this topic is not redriven or discarded. False skips the dead message instead.
	// Defaults to true.
	DeadLetterBlocksKey *bool `yaml:"dead_letter_blocks_key"`
	// MaxInFlight is the most messages of this topic handed to Temporal and not yet sent
	// or dead-lettered at once: the relays leave the rest in the table. Defaults to
	// relay.max_in_flight_per_topic, and to no limit for a topic of the batch lane (whose
	// batches would otherwise be cut to the limit); -1 sets no limit. On the default
	// entry it is the limit of the topics not listed, in place of
	// relay.max_in_flight_per_topic.
	MaxInFlight int `yaml:"max_in_flight"`

	// Options holds settings of the sinks a worker registers.
	Options map[string]string `yaml:"options"`

	// Activity delivers the topic with a team's own activity of this type name, on
	// TaskQueue, instead of a sink: the outbox's worker needs no handler for the topic.
	// Its input is a delivery.Message. Optional.
	Activity string `yaml:"activity"`
	// TaskQueue is the task queue of the team's worker that registers Activity.
	TaskQueue string `yaml:"task_queue"`
	// StartToClose bounds one attempt of Activity once started; running out is an
	// ambiguous failure. Defaults to timeout.
	StartToClose Duration `yaml:"start_to_close"`
	// ScheduleToStart bounds the wait for a worker to start an attempt; running out (no
	// worker polling) is a retryable failure. Defaults to 5m.
	ScheduleToStart Duration `yaml:"schedule_to_start"`
	// CheckActivity is the team's check-processed activity on the same task queue:
	// (processed bool, err error) for a delivery.Message. Optional.
	CheckActivity string `yaml:"check_activity"`

	// Nexus delivers the topic as an operation of a team's Nexus service, through a
	// Nexus endpoint whose target is the team's namespace and task queue, with a
	// delivery.Message as its input: one operation per attempt. Optional.
	Nexus NexusSettings `yaml:"nexus"`

	// Workflow delivers the topic by starting a team's workflow of this type name, on
	// TaskQueue, with a delivery.Message as its input. Optional.
	Workflow string `yaml:"workflow"`
	// WorkflowID is the template of the started workflow's ID, over {message_id}, {topic},
	// {ordering_key} and {payload.<field>}: the de-duplication key (two messages that give
	// the same ID start one workflow). Defaults to "{topic}-{message_id}".
	WorkflowID string `yaml:"workflow_id"`
	// WorkflowIDReuse says whether a workflow may start again with the ID of a closed
	// one: reject_duplicate (the default without signal: the second start counts as
	// delivered), allow_duplicate (the default with signal: a new run receives the signal)
	// or allow_duplicate_failed_only. With signal, reject_duplicate is refused: it would
	// deliver the messages after the workflow closed to no one.
	WorkflowIDReuse string `yaml:"workflow_id_reuse"`
	// Signal, when set, signals the workflow (starting it first when it is not running)
	// instead of starting it: signal-with-start, from the outbox's worker. A signal is
	// delivered at least once; the workflow de-duplicates by message ID. Optional.
	Signal string `yaml:"signal"`
}

// Secrets are a topic's secrets, read: its password, its signing secrets (raw keys) and
// its headers with the values that are secret references replaced by the secrets.
type Secrets struct {
	Password       string
	SigningSecrets [][]byte
	Headers        map[string]string
}

// Secrets reads the topic's password, signing secrets and the header values that are
// secret references, from the environment or their files. Only the worker, which sends,
// needs them; Validate checks the references' form alone.
func (t Topic) Secrets() (Secrets, error) { return t.readSecrets(os.LookupEnv) }

// readSecrets is Secrets with env: references looked up by lookup.
func (t Topic) readSecrets(lookup func(string) (string, bool)) (Secrets, error) {
	sec := Secrets{Headers: maps.Clone(t.Headers)}
	var errs []error
	if t.Password != "" {
		pw, err := readSecret(t.Password, lookup)
		if err != nil {
			errs = append(errs, fmt.Errorf("password: %w", err))
		}
		sec.Password = string(pw)
	}
	for i, ref := range t.SigningSecrets {
		raw, err := readSecret(ref, lookup)
		if err == nil {
			raw, err = webhook.ParseSecret(string(raw))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("signing_secrets[%d]: %w", i, err))
			continue
		}
		sec.SigningSecrets = append(sec.SigningSecrets, raw)
	}
	for _, name := range slices.Sorted(maps.Keys(t.Headers)) {
		if v := t.Headers[name]; IsSecretRef(v) {
			secret, err := readSecret(v, lookup)
			if err != nil {
				errs = append(errs, fmt.Errorf("headers[%q]: %w", name, err))
				continue
			}
			sec.Headers[name] = string(secret)
		}
	}
	return sec, errors.Join(errs...)
}

// NewSink builds the handler of topic (empty for the default entry) from the topic's
// sink settings and sec, its secrets: the built-in sink its sink: names (http, the
// default, nats, rabbitmq or kafka), each from its own package's Config, or a kind of
// extra. The file's keys map onto each sink's Config here and nowhere else.
func (t Topic) NewSink(topic string, sec Secrets, extra map[string]sinks.Factory) (delivery.Handler, error) {
	switch t.Sink {
	case "", "http":
		return httpsink.New(httpsink.Config{
			URL: t.URL, CheckURL: t.CheckURL, Headers: sec.Headers, TLS: t.TLS, SigningSecrets: sec.SigningSecrets,
		})
	case "nats":
		return natssink.New(topic, natssink.Config{
			URL: t.URL, Subject: t.Subject, Headers: sec.Headers, Username: t.Username, Password: sec.Password,
			TLS: t.TLS, RetrySpan: t.Policy().RetrySpan(),
		})
	case "rabbitmq":
		return rabbitsink.New(topic, rabbitsink.Config{
			URL: t.URL, Exchange: t.Exchange, RoutingKey: t.RoutingKey, Headers: sec.Headers,
			Username: t.Username, Password: sec.Password, TLS: t.TLS,
		})
	case "kafka":
		return kafkasink.New(topic, kafkasink.Config{
			Brokers: t.Brokers, Topic: t.Topic, Headers: sec.Headers, Username: t.Username, Password: sec.Password,
			TLS: t.TLS, AllowPlaintextAuth: t.AllowPlaintextAuth,
		})
	}
	f, ok := extra[t.Sink]
	if !ok {
		return nil, fmt.Errorf("unknown sink %q", t.Sink)
	}
	return f(topic, sinks.Spec{
		Kind: t.Sink, URL: t.URL, Headers: sec.Headers, Username: t.Username, Password: sec.Password,
		TLS: t.TLS, Options: t.Options, RetrySpan: t.Policy().RetrySpan(),
	})
}

// BuiltinSinks are the sink kinds built in, which NewSink builds and Validate checks:
// http (the default), nats, rabbitmq and kafka.
var BuiltinSinks = []string{"http", "nats", "rabbitmq", "kafka"}

// Registry builds the handlers of the configured topics and of the default entry, as
// outbox worker does: the built-in sinks (BuiltinSinks) and the kinds extra adds.
// Open the registry to connect its sinks, and close it when the worker stops.
func (c *Config) Registry(extra map[string]sinks.Factory) (*activities.Registry, error) {
	r := activities.NewRegistry()
	lookup := c.lookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	build := func(field, topic string, t Topic) error {
		sec, err := t.readSecrets(lookup)
		if err == nil {
			var h delivery.Handler
			if h, err = t.NewSink(topic, sec, extra); err == nil {
				if topic == "" {
					r.HandleDefault(h)
				} else {
					r.Handle(topic, h)
				}
				return nil
			}
		}
		return prefixLines(field+": ", err)
	}
	var errs []error
	for _, topic := range slices.Sorted(maps.Keys(c.Topics)) {
		t := c.Topics[topic]
		if t.deliveredByTeam() {
			continue // delivered by the team's activity, workflow or operation, not by a handler here
		}
		errs = append(errs, build(fmt.Sprintf("topics[%q]", topic), topic, t))
	}
	if c.Default != nil && !c.Default.deliveredByTeam() {
		errs = append(errs, build("default", "", *c.Default))
	}
	if err := errors.Join(errs...); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// IsSecretRef reports whether a header value is a secret reference (env:NAME or
// file:PATH) rather than the value itself.
func IsSecretRef(v string) bool {
	return strings.HasPrefix(v, "env:") || strings.HasPrefix(v, "file:")
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckSecretRef checks the form of a secret reference without reading it: env:NAME, a
// variable name, or file:PATH. Every command checks the references of the file; only the
// one that uses a secret reads it, so a relay runs without the worker's broker password.
func CheckSecretRef(ref string) error {
	kind, name, _ := strings.Cut(ref, ":")
	switch {
	case kind == "env" && envName.MatchString(name):
		return nil
	case kind == "env" && name != "":
		return fmt.Errorf("env:%s: %q is not an environment variable name (letters, digits and _, not starting with a digit)", name, name)
	case kind == "file" && name != "":
		return nil
	default:
		return errors.New(secretRefForm)
	}
}

const secretRefForm = "must be env:NAME or file:PATH, a reference to the secret (the secret itself never goes in the config file)"

// ReadSecret reads a secret by reference: env:NAME (a variable that must be set and not
// empty) or file:PATH (the file's contents, trailing newline removed). Errors name the
// reference, never the secret.
func ReadSecret(ref string) ([]byte, error) { return readSecret(ref, os.LookupEnv) }

func readSecret(ref string, lookup func(string) (string, bool)) ([]byte, error) {
	kind, name, _ := strings.Cut(ref, ":")
	switch {
	case kind == "env" && name != "":
		v, _ := lookup(name)
		if v == "" {
			return nil, fmt.Errorf("environment variable %s is not set or empty", name)
		}
		return []byte(v), nil
	case kind == "file" && name != "":
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		b = bytes.TrimRight(b, "\r\n")
		if len(b) == 0 {
			return nil, fmt.Errorf("file %s is empty", name)
		}
		return b, nil
	default:
		return nil, errors.New(secretRefForm)
	}
}

// AlertWebhooks returns the dead-letter alert webhooks of c, or nil when none is
// configured. A listed topic's dead letters go to its alert_webhook, else to
// alerts.webhook_url; those of a topic not listed, to default.alert_webhook (default:
// is the entry of such topics, so its webhook wins as a topic's does), else to
// alerts.webhook_url.
func (c *Config) AlertWebhooks() *activities.AlertWebhooks {
	w := &activities.AlertWebhooks{Global: c.Alerts.WebhookURL, Topics: map[string]string{}, Client: &http.Client{Timeout: 10 * time.Second}}
	if c.Default != nil && c.Default.AlertWebhook != "" {
		w.Global = c.Default.AlertWebhook
	}
	configured := w.Global != ""
	for topic, t := range c.Topics {
		// Every listed topic has its entry, empty for none, so that it never falls to
		// Global when that is the default entry's.
		w.Topics[topic] = cmp.Or(t.AlertWebhook, c.Alerts.WebhookURL)
		configured = configured || w.Topics[topic] != ""
	}
	if !configured {
		return nil
	}
	return w
}

// Policy returns the topic's delivery policy, defaults filled.
func (t Topic) Policy() workflows.Policy {
	return workflows.Policy{
		MaxAttempts:        t.MaxAttempts,
		InitialInterval:    time.Duration(t.InitialInterval),
		BackoffCoefficient: t.Backoff,
		MaxInterval:        time.Duration(t.MaxInterval),
		SendTimeout:        time.Duration(t.Timeout),
		MarkSentTimeout:    time.Duration(t.MarkSentTimeout),
		FirstAttempt:       t.FirstAttempt,
		Activity:           t.activityHandler(),
		Workflow:           t.workflowHandler(),
		Nexus:              t.nexusHandler(),
		Batch:              t.batchPolicy(),
	}.WithDefaults()
}

// batchPolicy is the topic's batch lane, or nil for the message lane.
func (t Topic) batchPolicy() *workflows.BatchPolicy {
	if t.Lane != LaneBatch {
		return nil
	}
	return &workflows.BatchPolicy{Size: t.Batch.Size, Wait: time.Duration(t.Batch.Wait), Concurrency: t.Batch.Concurrency}
}

// workflowHandler is the team's workflow that the topic starts, or nil.
func (t Topic) workflowHandler() *workflows.WorkflowHandler {
	if t.Workflow == "" {
		return nil
	}
	return &workflows.WorkflowHandler{Workflow: t.Workflow, TaskQueue: t.TaskQueue, WorkflowID: t.WorkflowID, IDReuse: t.WorkflowIDReuse, Signal: t.Signal}
}

// nexusHandler is the team's Nexus operation that delivers the topic, or nil.
func (t Topic) nexusHandler() *workflows.NexusHandler {
	if !t.Nexus.set() {
		return nil
	}
	n := t.Nexus
	return &workflows.NexusHandler{Endpoint: n.Endpoint, Service: n.Service, Operation: n.Operation, CheckOperation: n.CheckOperation, Timeout: time.Duration(n.Timeout)}
}

// activityHandler is the team's activity that delivers the topic, or nil.
func (t Topic) activityHandler() *workflows.ActivityHandler {
	if t.Activity == "" {
		return nil
	}
	return &workflows.ActivityHandler{
		Activity: t.Activity, TaskQueue: t.TaskQueue, CheckActivity: t.CheckActivity,
		StartToClose: time.Duration(t.StartToClose), ScheduleToStart: time.Duration(t.ScheduleToStart),
	}
}

// BatchSettings are a topic's batch lane settings (Topic.Batch).
type BatchSettings struct {
	// Size is the most messages of one batch. Defaults to 100.
	Size int `yaml:"size"`
	// Wait is the longest a claimed message waits for its batch to fill. Defaults to
	// 200ms.
	Wait Duration `yaml:"wait"`
	// Concurrency is how many messages of a batch a sink without a batch publish sends at
	// once. Defaults to 16.
	Concurrency int `yaml:"concurrency"`
}

func (b BatchSettings) set() bool { return b != BatchSettings{} }

// NexusSettings are a topic's Nexus operation (Topic.Nexus); see package sinks/teamnexus.
type NexusSettings struct {
	// Endpoint is the Nexus endpoint's name (temporal operator nexus endpoint create).
	// Required.
	Endpoint string `yaml:"endpoint"`
	// Service is the Nexus service the handler's worker registers. Required.
	Service string `yaml:"service"`
	// Operation is the operation of Service that delivers the message. Required.
	Operation string `yaml:"operation"`
	// CheckOperation is the operation of Service that answers whether the team already
	// processed the message (a delivery.Message in, a bool out). Optional.
	CheckOperation string `yaml:"check_operation"`
	// Timeout bounds one attempt (the operation's schedule-to-close timeout); running out
	// is an ambiguous failure. Defaults to the topic's timeout.
	Timeout Duration `yaml:"timeout"`
}

func (n NexusSettings) set() bool { return n != NexusSettings{} }

// deliveredByTeam reports whether a team's activity, workflow or Nexus operation delivers
// the topic rather than a sink in the outbox's worker.
func (t Topic) deliveredByTeam() bool { return t.Activity != "" || t.Workflow != "" || t.Nexus.set() }

// Values of Topic.Lane.
const (
	LaneMessage = "message"
	LaneBatch   = "batch"
)

// Duration is a time.Duration written as in Go ("1s", "1m30s").
type Duration time.Duration

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		got := fmt.Sprintf("%q", n.Value)
		switch n.Kind {
		case yaml.SequenceNode:
			got = "a list"
		case yaml.MappingNode:
			got = "a map"
		}
		return &durationError{n.Line, n.Column, got}
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return &durationError{n.Line, n.Column, strconv.Quote(s)}
	}
	*d = Duration(v)
	return nil
}

// durationError is a value that is not a duration, at its place in the file (Parse adds
// the key it is the value of).
type durationError struct {
	line, column int
	got          string // the value, quoted, or what it is ("a list")
}

func (e *durationError) Error() string {
	return fmt.Sprintf("line %d: want a duration such as \"1s\" or \"1m30s\", got %s", e.line, e.got)
}

// keyAt returns the path of the key whose value starts at line and column of the YAML
// document data, as errors name fields (relay.poll_interval, topics["a"].timeout), or ""
// when there is none.
func keyAt(data []byte, line, column int) string {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return ""
	}
	var walk func(n *yaml.Node, path string) string
	walk = func(n *yaml.Node, path string) string {
		if n.Kind != yaml.MappingNode {
			return ""
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := path + "." + k.Value
			switch {
			case path == "":
				p = k.Value
			case path == "topics":
				p = fmt.Sprintf("topics[%q]", k.Value)
			}
			if v.Line == line && v.Column == column {
				return p
			}
			if found := walk(v, p); found != "" {
				return found
			}
		}
		return ""
	}
	return walk(doc.Content[0], "")
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// Defaults.
const (
	DefaultTemporalAddress  = "127.0.0.1:7233"
	DefaultNamespace        = "default"
	DefaultMaxActivities    = 200
	DefaultUIURL            = "http://127.0.0.1:8233"
	DefaultSentRetention    = 7 * 24 * time.Hour
	DefaultDiscardRetention = 30 * 24 * time.Hour
	DefaultRetentionBatch   = store.DefaultPurgeLimit
	DefaultRetentionEvery   = time.Hour
)

// Load reads the file at path (an empty path gives the defaults) and lets the process's
// environment override it, as the outbox command does: see [Config.ApplyEnv] for the
// variables. Validation comes later, when the config is used (app.Open) or by
// [Config.Validate]. [LoadEnv] takes the environment from a function instead; [LoadFile]
// reads the file alone.
func Load(path string) (*Config, error) { return LoadEnv(path, os.LookupEnv) }

// LoadEnv is [Load] with the environment looked up through lookup (os.LookupEnv in a
// program, a map in a test).
func LoadEnv(path string, lookup func(string) (string, bool)) (*Config, error) {
	c, err := LoadFile(path)
	if err != nil {
		return nil, err
	}
	before := c.Policies()
	if err := c.ApplyEnv(lookup); err != nil {
		return nil, err
	}
	if len(c.Policies().Differ(before)) > 0 {
		c.PolicyAsOf = time.Now()
	}
	return c, nil
}

// LoadFile reads the file at path, without the environment; an empty path gives the
// defaults.
func LoadFile(path string) (*Config, error) {
	if path == "" {
		return &Config{}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	defer f.Close()
	c, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c.PolicyAsOf, c.Path = info.ModTime(), path
	return c, nil
}

// Parse reads a YAML configuration. Unknown fields are errors, so a typo does not pass
// silently.
func Parse(r io.Reader) (*Config, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return &c, nil
		}
		if de := (*durationError)(nil); errors.As(err, &de) {
			if key := keyAt(data, de.line, de.column); key != "" {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
		}
		return nil, err
	}
	for {
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		// An empty document (a trailing ---) sets nothing.
		if len(next.Content) > 0 && next.Content[0].Tag != "!!null" {
			return nil, fmt.Errorf("line %d: a second YAML document (after ---); the config is one document", next.Line)
		}
	}
	// A false written in the file is a setting too: it keeps a temporal.toml profile's
	// disable_host_verification out (see applyProfile).
	var keys struct {
		Temporal struct {
			TLS map[string]any `yaml:"tls"`
		} `yaml:"temporal"`
	}
	if yaml.Unmarshal(data, &keys) == nil {
		_, c.Temporal.TLS.skipVerifySet = keys.Temporal.TLS["insecure_skip_verify"]
	}
	return &c, nil
}

// ApplyEnv lets the environment override the file, and fills the temporal section from a
// profile of the Temporal CLI's config file. lookup is os.LookupEnv in a program; every
// variable is read through it. An empty variable counts as unset. From the lowest
// precedence to the highest:
//
//  1. the built-in defaults ([Config.WithDefaults], later);
//  2. the temporal.toml profile, for the temporal section's keys the file and the
//     environment leave unset (see [Temporal.Profile]; the profile is TEMPORAL_PROFILE,
//     else temporal.profile, else "default"; the file TEMPORAL_CONFIG_FILE, else the
//     Temporal CLI's default path, envconfig.DefaultConfigFilePath);
//  3. the file;
//  4. OUTBOX_<PATH>, any key of the file by its YAML path upper-cased with dots as
//     underscores (OUTBOX_RELAY_POLL_INTERVAL=1s, OUTBOX_TEMPORAL_TLS_CA_FILE): a scalar
//     is read as in the file (strings as they are); a map (OUTBOX_TOPICS, a YAML or JSON
//     object) is merged over the file's per entry, an entry replacing the file's; a list
//     (OUTBOX_DEFAULT_BROKERS) replaces the file's;
//  5. the names of their own: DATABASE_URL, OUTBOX_TASK_QUEUE, OUTBOX_CODEC_KEY (base64 of
//     32 bytes, the active codec key) with OUTBOX_CODEC_KEY_ID (its ID, default "env"),
//     and the Temporal CLI's variables: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
//     TEMPORAL_API_KEY, TEMPORAL_CLIENT_AUTHORITY, TEMPORAL_TLS (true or false),
//     TEMPORAL_TLS_CA or TEMPORAL_TLS_SERVER_CA_CERT_PATH, TEMPORAL_TLS_CERT or
//     TEMPORAL_TLS_CLIENT_CERT_PATH, TEMPORAL_TLS_KEY or TEMPORAL_TLS_CLIENT_KEY_PATH, the
//     *_DATA forms of those three (PEM inline), TEMPORAL_TLS_SERVER_NAME and
//     TEMPORAL_TLS_DISABLE_HOST_VERIFICATION.
//
// A value that does not parse, a profile named explicitly that does not exist, and a
// remote codec (TEMPORAL_CODEC_ENDPOINT, or the profile's codec) are errors, all of them
// joined. The env: secret references (broker passwords, signing secrets, header values)
// are read through lookup too, when the worker builds its handlers (Registry).
func (c *Config) ApplyEnv(lookup func(string) (string, bool)) error {
	c.lookupEnv = lookup
	errs := []error{applyPathEnv(c, lookup)}
	set := func(dst *string, name string) {
		if v, ok := lookup(name); ok && v != "" {
			*dst = v
		}
	}
	set(&c.DatabaseURL, "DATABASE_URL")
	set(&c.Temporal.TaskQueue, "OUTBOX_TASK_QUEUE")
	set(&c.Codec.envKey, "OUTBOX_CODEC_KEY")
	set(&c.Codec.envKeyID, "OUTBOX_CODEC_KEY_ID")
	errs = append(errs, c.Temporal.applyEnv(lookup))
	errs = append(errs, c.Temporal.applyProfile(lookup))
	return errors.Join(errs...)
}

// WithDefaults returns a copy with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.Schema = cmp.Or(c.Schema, "public")
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, store.DefaultMaxPayloadBytes)
	if c.SearchAttributes == nil {
		on := true
		c.SearchAttributes = &on
	}
	c.Temporal.Address = cmp.Or(c.Temporal.Address, DefaultTemporalAddress)
	c.Temporal.Namespace = cmp.Or(c.Temporal.Namespace, DefaultNamespace)
	c.Temporal.TaskQueue = cmp.Or(c.Temporal.TaskQueue, workflows.DefaultTaskQueue)
	// The relay's defaults are starter's.
	r := c.Relay.starterConfig().WithDefaults()
	rc := c.Relay.reconcilerConfig().WithDefaults()
	c.Relay = Relay{
		BatchSize: r.BatchSize, Wakeup: string(r.Wakeup), PollInterval: Duration(r.PollInterval), Lease: Duration(r.Lease),
		StartConcurrency: r.StartConcurrency, ReconcileAfter: Duration(rc.After), ReconcileInterval: Duration(rc.Interval),
		MaxInFlightPerTopic: r.MaxInFlightPerTopic,
	}
	c.Worker.MaxConcurrentActivities = cmp.Or(c.Worker.MaxConcurrentActivities, DefaultMaxActivities)
	c.Worker.MaxSendsPerTopic = cmp.Or(c.Worker.MaxSendsPerTopic, max(c.Worker.MaxConcurrentActivities/2, 1))
	c.Worker.StopTimeout = cmp.Or(c.Worker.StopTimeout, Duration(c.longestSendTimeout()+StopMargin))
	c.UIURL = cmp.Or(c.UIURL, DefaultUIURL)
	c.Retention.SentAfter = cmp.Or(c.Retention.SentAfter, Duration(DefaultSentRetention))
	c.Retention.DiscardedAfter = cmp.Or(c.Retention.DiscardedAfter, Duration(DefaultDiscardRetention))
	c.Retention.BatchSize = cmp.Or(c.Retention.BatchSize, DefaultRetentionBatch)
	c.Retention.Interval = cmp.Or(c.Retention.Interval, Duration(DefaultRetentionEvery))
	return c
}

// StopMargin is what the default worker.stop_timeout adds to the longest send timeout: the
// time to record the outcome of a send that ends at its timeout.
const StopMargin = 5 * time.Second

// longestSendTimeout is the longest send timeout of the topics the outbox's worker sends
// (the configured ones, the default entry, the built-in default).
func (c Config) longestSendTimeout() time.Duration {
	longest := c.Policy("").SendTimeout
	for _, t := range c.Topics {
		if t.Activity == "" && !t.Nexus.set() {
			longest = max(longest, t.Policy().SendTimeout)
		}
	}
	return longest
}

// relayKeys maps the field names of starter.Config and starter.ReconcilerConfig to the
// relay: keys of the file.
var relayKeys = map[string]string{
	"BatchSize": "batch_size", "Wakeup": "wakeup", "PollInterval": "poll_interval", "Lease": "lease",
	"StartConcurrency": "start_concurrency", "SweepInterval": "reconcile_interval",
	"MaxInFlightPerTopic": "max_in_flight_per_topic", "After": "reconcile_after", "Interval": "reconcile_interval",
}

// starterConfig is the relay: section as a starter.Config, before defaults. The relay
// sweeps for parked rows as often as the reconciler looks for stale ones.
func (r Relay) starterConfig() starter.Config {
	return starter.Config{
		BatchSize: r.BatchSize, Wakeup: starter.Wakeup(r.Wakeup), PollInterval: time.Duration(r.PollInterval),
		Lease: time.Duration(r.Lease), StartConcurrency: r.StartConcurrency, SweepInterval: time.Duration(r.ReconcileInterval),
		MaxInFlightPerTopic: r.MaxInFlightPerTopic,
	}
}

// reconcilerConfig is the relay: section's reconciliation settings, before defaults.
func (r Relay) reconcilerConfig() starter.ReconcilerConfig {
	return starter.ReconcilerConfig{After: time.Duration(r.ReconcileAfter), Interval: time.Duration(r.ReconcileInterval)}
}

// ReconcilerConfig maps the file onto the configuration of the reconciler that runs
// beside each relay (add a Logger and Metrics).
func (c *Config) ReconcilerConfig() starter.ReconcilerConfig { return c.Relay.reconcilerConfig() }

// RelayConfig maps the file onto the relay's configuration: the relay: section, the task
// queue, the search attributes, and the topics' policies and ordering settings. A relay
// embedded in Go gets from it exactly what outbox relay gets (add a Logger and Metrics).
func (c *Config) RelayConfig() starter.Config {
	r := c.Relay.starterConfig()
	r.TaskQueue = c.Temporal.TaskQueue
	r.NoSearchAttributes = !c.SearchAttributesEnabled()
	r.Policy = c.Policy
	r.Ordering = c.OrderingRules()
	if n := c.defaultMaxInFlight(); n != 0 {
		// The default entry's limit is the topics' not listed; a listed topic without a
		// limit of its own keeps relay.max_in_flight_per_topic.
		relay := cmp.Or(r.MaxInFlightPerTopic, starter.DefaultMaxInFlightPerTopic)
		for _, name := range r.Ordering.Listed {
			if _, own := r.Ordering.TopicMaxInFlight[name]; !own {
				if r.Ordering.TopicMaxInFlight == nil {
					r.Ordering.TopicMaxInFlight = map[string]int{}
				}
				r.Ordering.TopicMaxInFlight[name] = relay
			}
		}
		r.MaxInFlightPerTopic = n
	}
	return r
}

// unjoinAll returns the errors errors.Join joined, nested joins flattened.
func unjoinAll(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, unjoinAll(e)...)
	}
	return out
}

// SearchAttributesEnabled reports whether the search attributes are on.
func (c *Config) SearchAttributesEnabled() bool {
	return c.SearchAttributes == nil || *c.SearchAttributes
}

// validPort reports whether port is a TCP port a listener takes: a number from 0 to
// 65535, or a service name the system knows.
func validPort(port string) bool {
	if n, err := strconv.Atoi(port); err == nil {
		return n >= 0 && n <= 65535
	}
	_, err := net.LookupPort("tcp", port)
	return err == nil
}

// checkTemporalAddress checks Temporal's frontend address: host:port, or a gRPC target
// with a resolver scheme (dns:///host:port). An http:// or https:// URL, as the Web UI's
// address is written, is what gRPC cannot dial.
func checkTemporalAddress(addr string) error {
	if scheme, _, ok := strings.Cut(addr, "://"); ok {
		if s := strings.ToLower(scheme); s == "http" || s == "https" {
			return fmt.Errorf("must be the frontend's gRPC host:port, without %s://, got %q (TLS is temporal.tls)", s, addr)
		}
		return nil
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || !validPort(port) || port == "0" {
		return fmt.Errorf("must be host:port with a port from 1 to 65535, got %q", addr)
	}
	return nil
}

// Validate checks c (after WithDefaults) and returns an error naming the first field that
// is wrong and its value. sinks lists the sink names besides "http" that are known.
func (c *Config) Validate(sinks ...string) error {
	var errs []error
	bad := func(field string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{field}, args...)...))
	}
	if _, err := store.New(nil, store.Config{Schema: c.Schema, MaxPayloadBytes: c.MaxPayloadBytes}); err != nil {
		bad("schema/max_payload_bytes", "%v", strings.TrimPrefix(err.Error(), "store config: "))
	}
	if kind, err := DatabaseKind(c.DatabaseURL); err != nil {
		bad("database_url", "%v", err)
	} else if kind == DatabasePostgres {
		// As the processes read it when they connect (pgx hides the password in its error).
		if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
			bad("database_url", "%v", err)
		}
	} else if kind == DatabaseMySQL {
		if c.Schema != "public" {
			bad("schema", "%q applies to PostgreSQL only: on MySQL the outbox tables live in the database that database_url names; leave schema unset", c.Schema)
		}
		if c.Relay.Wakeup == string(starter.WakeupNotify) {
			bad("relay.wakeup", "notify listens to PostgreSQL's NOTIFY, which MySQL does not have: use poll (the default), and relay.poll_interval for how often")
		}
	}
	// The relay's and the reconciler's limits are starter's; their errors name the field,
	// mapped here to its key (reconcile_interval sets two fields: one line for both).
	relayErr := errors.Join(c.Relay.starterConfig().WithDefaults().Validate(), c.Relay.reconcilerConfig().WithDefaults().Validate())
	if relayErr != nil {
		seen := map[string]bool{}
		for _, e := range unjoinAll(relayErr) {
			key, problem := "relay", e.Error()
			var fe *starter.FieldError
			if errors.As(e, &fe) {
				key, problem = "relay."+relayKeys[fe.Field], fe.Problem
			}
			if !seen[key+problem] {
				seen[key+problem] = true
				bad(key, "%s", problem)
			}
		}
	}
	for _, p := range []struct {
		name string
		n    int
	}{{"worker.workflow_task_pollers", c.Worker.WorkflowTaskPollers}, {"worker.activity_task_pollers", c.Worker.ActivityTaskPollers}} {
		if p.n < 0 || p.n == 1 || p.n > 1000 {
			bad(p.name, "must be 0 (the SDK's default) or between 2 and 1000, got %d", p.n)
		}
	}
	if c.Worker.AutoscalePollers && (c.Worker.WorkflowTaskPollers != 0 || c.Worker.ActivityTaskPollers != 0) {
		bad("worker.autoscale_pollers", "cannot be set together with workflow_task_pollers or activity_task_pollers")
	}
	if c.Worker.StopTimeout < 0 || c.Worker.StopTimeout > Duration(time.Hour) {
		bad("worker.stop_timeout", "must be between 0s (the default: the longest topic timeout plus %s) and 1h, got %s", StopMargin, time.Duration(c.Worker.StopTimeout))
	}
	if c.Worker.MaxConcurrentActivities < 1 {
		bad("worker.max_concurrent_activities", "must be at least 1, got %d", c.Worker.MaxConcurrentActivities)
	}
	if c.Worker.MaxSendsPerTopic < 1 || c.Worker.MaxSendsPerTopic > max(c.Worker.MaxConcurrentActivities, 1) {
		bad("worker.max_sends_per_topic", "must be between 1 and worker.max_concurrent_activities (%d), got %d", c.Worker.MaxConcurrentActivities, c.Worker.MaxSendsPerTopic)
	}
	if err := checkURL(c.UIURL); err != nil {
		bad("ui_url", "%v", err)
	}
	if c.Retention.SentAfter < Duration(store.MinRetentionAge) {
		bad("retention.sent_after", "must be at least %s, got %s", store.MinRetentionAge, time.Duration(c.Retention.SentAfter))
	}
	if c.Retention.DiscardedAfter < Duration(store.MinRetentionAge) {
		bad("retention.discarded_after", "must be at least %s, got %s", store.MinRetentionAge, time.Duration(c.Retention.DiscardedAfter))
	}
	if c.Retention.BatchSize < 1 || c.Retention.BatchSize > store.MaxPurgeLimit {
		bad("retention.batch_size", "must be between 1 and %d, got %d", store.MaxPurgeLimit, c.Retention.BatchSize)
	}
	if c.Retention.Interval < Duration(time.Minute) {
		bad("retention.interval", "must be at least 1m, got %s", time.Duration(c.Retention.Interval))
	}
	if c.Metrics.Address != "" {
		if _, port, err := net.SplitHostPort(c.Metrics.Address); err != nil || !validPort(port) {
			bad("metrics.address", "must be host:port with a port from 0 to 65535, got %q", c.Metrics.Address)
		}
	}
	if c.Temporal.Address != "" {
		if err := checkTemporalAddress(c.Temporal.Address); err != nil {
			bad("temporal.address", "%v", err)
		}
	}
	if c.Alerts.WebhookURL != "" {
		if err := checkURL(c.Alerts.WebhookURL); err != nil {
			bad("alerts.webhook_url", "%v", err)
		}
	}
	errs = append(errs, c.Temporal.validateSecurity(), c.Temporal.validateGRPCMeta(), c.Codec.validate())
	names := make([]string, 0, len(c.Topics))
	for name := range c.Topics {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		field := fmt.Sprintf("topics[%q]", name)
		if !store.TopicPattern.MatchString(name) {
			bad(field, "topic name must match %s", store.TopicPattern)
		}
		errs = append(errs, c.Topics[name].validate(field, name, sinks))
	}
	if c.Default != nil {
		errs = append(errs, c.Default.validate("default", "", sinks))
	}
	return errors.Join(errs...)
}

func (t Topic) validate(field, topic string, sinks []string) error {
	var errs []error
	bad := func(sub, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: "+format, append([]any{field, sub}, args...)...))
	}
	switch sink := cmp.Or(t.Sink, "http"); {
	case t.Nexus.set():
		// The operation's own settings are checked with the topic's policy, below.
		n := t.nexusHandler()
		for _, k := range []struct{ key, value string }{
			{"activity", t.Activity}, {"workflow", t.Workflow}, {"task_queue", t.TaskQueue}, {"check_activity", t.CheckActivity},
			{"sink", t.Sink}, {"url", t.URL}, {"check_url", t.CheckURL}, {"first_attempt", t.FirstAttempt}, {"lane", t.Lane},
		} {
			if k.value != "" {
				bad(k.key, "must be empty for a topic delivered by Nexus operation %s, got %q", n, k.value)
			}
		}
		for _, key := range t.sinkKeysSet() {
			bad(key, "is a setting of the outbox's sinks; Nexus operation %s delivers this topic", n)
		}
		if t.StartToClose != 0 || t.ScheduleToStart != 0 || t.WorkflowID != "" || t.WorkflowIDReuse != "" || t.Signal != "" {
			bad("start_to_close/schedule_to_start/workflow_id/workflow_id_reuse/signal", "are for a topic delivered by an activity or a workflow, not by Nexus operation %s", n)
		}
	case t.Activity != "" && t.Workflow != "":
		bad("workflow", "must be empty when activity is set (one of them delivers the topic), got %q", t.Workflow)
	case t.Activity != "" || t.Workflow != "":
		by := "activity " + t.Activity
		if t.Workflow != "" {
			by = "workflow " + t.Workflow
		}
		if t.TaskQueue == "" {
			bad("task_queue", "must name the task queue of %s, got an empty name", by)
		}
		for _, k := range []struct{ key, value string }{{"sink", t.Sink}, {"url", t.URL}, {"check_url", t.CheckURL}, {"first_attempt", t.FirstAttempt}} {
			if k.value != "" {
				bad(k.key, "must be empty for a topic delivered by %s, got %q", by, k.value)
			}
		}
		for _, key := range t.sinkKeysSet() {
			bad(key, "is a setting of the outbox's sinks; %s delivers this topic", by)
		}
		if t.Workflow != "" && (t.CheckActivity != "" || t.StartToClose != 0 || t.ScheduleToStart != 0) {
			bad("check_activity/start_to_close/schedule_to_start", "are for a topic delivered by an activity, not by workflow %s", t.Workflow)
		}
		if t.Activity != "" && (t.WorkflowID != "" || t.WorkflowIDReuse != "" || t.Signal != "") {
			bad("workflow_id/workflow_id_reuse/signal", "are for a topic that starts a workflow, not for activity %s", t.Activity)
		}
	case t.TaskQueue != "" || t.CheckActivity != "" || t.StartToClose != 0 || t.ScheduleToStart != 0 || t.WorkflowID != "" || t.WorkflowIDReuse != "" || t.Signal != "":
		bad("activity/workflow", "must name the activity or workflow that task_queue and the other handler keys are for, got neither")
	case slices.Contains(BuiltinSinks, sink):
		if err := t.validateSink(field, topic, sink); err != nil {
			errs = append(errs, err)
		}
	case slices.Contains(sinks, sink):
		// A sink kind a worker registers gets sinks.Spec: the built-in kinds' own keys
		// would not reach it.
		for _, key := range t.sinkKeysSet() {
			if !slices.Contains([]string{"headers", "username", "password", "tls", "options"}, key) {
				bad(key, "is not passed to sink %s (it gets url, headers, username, password, tls and options)", sink)
			}
		}
		if t.CheckURL != "" {
			bad("check_url", "is not passed to sink %s (it gets url, headers, username, password, tls and options)", sink)
		}
	default:
		bad("sink", "must be one of %s, got %q", strings.Join(append(slices.Clone(BuiltinSinks), sinks...), ", "), t.Sink)
	}
	if t.AlertWebhook != "" {
		if err := checkURL(t.AlertWebhook); err != nil {
			bad("alert_webhook", "%v", err)
		}
	}
	switch {
	case t.Lane != "" && t.Lane != LaneMessage && t.Lane != LaneBatch:
		bad("lane", "must be %s or %s, got %q", LaneMessage, LaneBatch, t.Lane)
	case t.Lane == LaneBatch && t.Activity != "":
		bad("lane", "batch needs a sink in the outbox's worker; activity %s delivers one message per attempt: leave lane unset", t.Activity)
	case t.Lane == LaneBatch && t.Workflow != "":
		bad("lane", "batch needs a sink in the outbox's worker; workflow %s is started once per message: leave lane unset", t.Workflow)
	case t.Lane != LaneBatch && t.Batch.set():
		bad("batch", "applies to lane: batch only, and the lane is %s: set lane: batch or remove batch", cmp.Or(t.Lane, LaneMessage))
	}
	if t.MaxInFlight < -1 {
		bad("max_in_flight", "must be at least 1, or -1 for no limit (unset: relay.max_in_flight_per_topic), got %d", t.MaxInFlight)
	}
	if t.Batch.Size < 0 || t.Batch.Size > workflows.MaxBatchSize {
		bad("batch.size", "must be between 1 and %d (unset: %d), got %d", workflows.MaxBatchSize, workflows.DefaultBatchSize, t.Batch.Size)
	}
	if t.Batch.Wait < 0 || time.Duration(t.Batch.Wait) > workflows.MaxBatchWait {
		bad("batch.wait", "must be between 0s and %s (unset: %s), got %s", workflows.MaxBatchWait, workflows.DefaultBatchWait, time.Duration(t.Batch.Wait))
	}
	if t.Batch.Concurrency < 0 || t.Batch.Concurrency > workflows.MaxBatchConcurrency {
		bad("batch.concurrency", "must be between 1 and %d (unset: %d), got %d", workflows.MaxBatchConcurrency, workflows.DefaultBatchConcurrency, t.Batch.Concurrency)
	}
	if t.MaxAttempts < 0 || t.MaxAttempts > workflows.MaxAttemptsLimit {
		bad("max_attempts", "must be between 1 and %d (unset: %d), got %d", workflows.MaxAttemptsLimit, workflows.DefaultMaxAttempts, t.MaxAttempts)
	}
	if math.IsNaN(t.Backoff) || math.IsInf(t.Backoff, 0) {
		bad("backoff", "must be a finite number of at least 1, got %g", t.Backoff)
	} else if t.Backoff != 0 && t.Backoff < 1 {
		bad("backoff", "must be at least 1, got %g", t.Backoff)
	}
	for _, d := range []struct {
		name  string
		value Duration
	}{{"initial_interval", t.InitialInterval}, {"max_interval", t.MaxInterval}, {"timeout", t.Timeout}, {"mark_sent_timeout", t.MarkSentTimeout}, {"start_to_close", t.StartToClose}, {"schedule_to_start", t.ScheduleToStart}} {
		if d.value < 0 {
			bad(d.name, "must be positive, got %s", time.Duration(d.value))
		}
	}
	if len(errs) == 0 {
		if err := t.Policy().Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s.%w", field, err))
		}
	}
	return errors.Join(errs...)
}

// sinkKeysSet names the keys of a sink's settings that are set, besides sink, url and
// check_url: a topic delivered by a team's handler uses none of them.
func (t Topic) sinkKeysSet() []string {
	var set []string
	for _, k := range []struct {
		key string
		set bool
	}{
		{"headers", len(t.Headers) > 0}, {"subject", t.Subject != ""}, {"exchange", t.Exchange != ""},
		{"routing_key", t.RoutingKey != ""}, {"brokers", len(t.Brokers) > 0}, {"topic", t.Topic != ""},
		{"username", t.Username != ""}, {"password", t.Password != ""}, {"tls", !t.TLS.IsZero()},
		{"signing_secrets", len(t.SigningSecrets) > 0}, {"allow_plaintext_auth", t.AllowPlaintextAuth},
		{"options", len(t.Options) > 0},
	} {
		if k.set {
			set = append(set, k.key)
		}
	}
	return set
}

// sinkKeys are the keys that belong to one built-in sink kind only.
var sinkKeys = map[string][]string{
	"http":     {"check_url", "signing_secrets"},
	"nats":     {"subject"},
	"rabbitmq": {"exchange", "routing_key"},
	"kafka":    {"brokers", "topic"},
}

// validateSink checks the keys of a built-in sink kind.
func (t Topic) validateSink(field, topic, sink string) error {
	var errs []error
	bad := func(sub, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: "+format, append([]any{field, sub}, args...)...))
	}
	set := map[string]bool{
		"check_url": t.CheckURL != "", "signing_secrets": len(t.SigningSecrets) > 0, "subject": t.Subject != "",
		"exchange": t.Exchange != "", "routing_key": t.RoutingKey != "", "brokers": len(t.Brokers) > 0, "topic": t.Topic != "",
	}
	for _, kind := range slices.Sorted(maps.Keys(sinkKeys)) {
		for _, k := range sinkKeys[kind] {
			if kind != sink && set[k] {
				bad(k, "is a setting of sink %s, not of sink %s", kind, sink)
			}
		}
	}
	template := func(key, value string) {
		if _, err := sinks.ParseTemplate(value); err != nil {
			bad(key, "%v", err)
		}
	}
	switch sink {
	case "http":
		if err := checkURL(t.URL); err != nil {
			bad("url", "%v", err)
		}
		if t.CheckURL != "" {
			if err := checkURL(t.CheckURL); err != nil {
				bad("check_url", "%v", err)
			} else if !strings.Contains(t.CheckURL, "{message_id}") {
				bad("check_url", "must contain {message_id}, got %q", t.CheckURL)
			}
		}
		if t.Username != "" || t.Password != "" {
			bad("username/password", "are for the broker sinks; put an http endpoint's credentials in headers")
		}
	case "nats":
		if err := natssink.CheckURL(t.URL); err != nil {
			bad("url", "%v", err)
		}
		template("subject", t.Subject)
	case "rabbitmq":
		if err := rabbitsink.CheckURL(t.URL); err != nil {
			bad("url", "%v", err)
		}
		template("routing_key", t.RoutingKey)
	case "kafka":
		if t.URL != "" {
			bad("url", "is not a setting of sink kafka: list the seed brokers under brokers (host:port)")
		}
		if len(t.Brokers) == 0 {
			bad("brokers", "must list at least one seed broker (host:port)")
		}
		for i, b := range t.Brokers {
			if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
				bad(fmt.Sprintf("brokers[%d]", i), "must be host:port, got %q", redact.Address(b))
			}
		}
		template("topic", t.Topic)
	}
	if len(t.Options) > 0 {
		bad("options", "are for the sinks a worker registers, not for sink %s", sink)
	}
	// The secrets are not read here (a relay or dlq command has no use for them, and
	// need not have them): their references' form is checked, and the worker reads them.
	if t.Password != "" {
		if err := CheckSecretRef(t.Password); err != nil {
			bad("password", "%v", err)
		}
	}
	for i, ref := range t.SigningSecrets {
		if err := CheckSecretRef(ref); err != nil {
			bad(fmt.Sprintf("signing_secrets[%d]", i), "%v", err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(t.Headers)) {
		if v := t.Headers[name]; IsSecretRef(v) {
			if err := CheckSecretRef(v); err != nil {
				bad(fmt.Sprintf("headers[%q]", name), "%v", err)
			}
		}
	}
	if (t.TLS.CertFile == "") != (t.TLS.KeyFile == "") {
		bad("tls", "cert_file and key_file go together, for mutual TLS: set both or neither")
	}
	if sink != "kafka" && t.AllowPlaintextAuth {
		bad("allow_plaintext_auth", "is a setting of sink kafka, not of sink %s", sink)
	}
	if len(errs) == 0 {
		// The sink's own checks, on settings whose secrets stand in unread and whose TLS
		// files are not opened (it connects to nothing): the worker builds the real one.
		sec := Secrets{Headers: maps.Clone(t.Headers)}
		if t.Password != "" {
			sec.Password = "unread"
		}
		for range t.SigningSecrets {
			sec.SigningSecrets = append(sec.SigningSecrets, make([]byte, 32))
		}
		if !t.TLS.IsZero() {
			t.TLS = sinks.TLSFiles{Enabled: true, ServerName: t.TLS.ServerName}
		}
		h, err := t.NewSink(topic, sec, nil)
		if err != nil {
			errs = append(errs, prefixLines(field+".", err))
		} else if c, ok := h.(io.Closer); ok {
			_ = c.Close()
		}
	}
	return errors.Join(errs...)
}

// prefixLines puts prefix before each error that err joins.
func prefixLines(prefix string, err error) error {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			errs = append(errs, fmt.Errorf("%s%w", prefix, e))
		}
		return errors.Join(errs...)
	}
	return fmt.Errorf("%s%w", prefix, err)
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// Only scheme and host: the rest of a URL may be a credential.
		return fmt.Errorf("must be an absolute http or https URL, got %q (shown without user, path or query)", redact.URL(s))
	}
	return nil
}

// TopicConfig returns the configuration that serves topic: its own entry, else the
// default entry. ok is false when neither exists.
func (c *Config) TopicConfig(topic string) (t Topic, ok bool) {
	if t, ok := c.Topics[topic]; ok {
		return t, true
	}
	if c.Default != nil {
		return *c.Default, true
	}
	return Topic{}, false
}

// Policies returns the delivery policy of every topic the config lists, and of every other
// topic (the default entry's, or the built-in defaults): what a relay or a worker
// publishes when PolicyAsOf is set.
func (c *Config) Policies() workflows.Policies {
	p := workflows.Policies{Default: Topic{}.Policy()}
	if c.Default != nil {
		p.Default = c.Default.Policy()
	}
	for name, t := range c.Topics {
		if p.Topics == nil {
			p.Topics = make(map[string]workflows.Policy, len(c.Topics))
		}
		p.Topics[name] = t.Policy()
	}
	return p
}

// Policy returns the delivery policy of topic: its entry's, the default entry's, or the
// built-in defaults.
func (c *Config) Policy(topic string) workflows.Policy {
	t, _ := c.TopicConfig(topic)
	return t.Policy()
}

// defaultMaxInFlight is the default entry's limit of messages in flight (see maxInFlight),
// or 0 when there is no default entry or it sets none.
func (c *Config) defaultMaxInFlight() int {
	if c.Default == nil {
		return 0
	}
	return c.Default.maxInFlight()
}

// maxInFlight is the topic's own limit of messages in flight: its max_in_flight, -1 (none)
// for a topic of the batch lane without one, or 0 (the relay's).
func (t Topic) maxInFlight() int {
	if t.MaxInFlight == 0 && t.Lane == LaneBatch {
		return -1
	}
	return t.MaxInFlight
}

// OrderingRules returns the claim's ordering settings for the configured topics: each
// listed topic's own, and the default entry's (or the built-in defaults) for the rest.
func (c *Config) OrderingRules() store.OrderingRules {
	var r store.OrderingRules
	isFalse := func(b *bool) bool { return b != nil && !*b }
	if c.Default != nil {
		r.DefaultUnordered = isFalse(c.Default.Ordering)
		r.DefaultSkipping = isFalse(c.Default.DeadLetterBlocksKey)
	}
	names := make([]string, 0, len(c.Topics))
	for name := range c.Topics {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t := c.Topics[name]
		r.Listed = append(r.Listed, name)
		if isFalse(t.Ordering) {
			r.Unordered = append(r.Unordered, name)
		}
		if isFalse(t.DeadLetterBlocksKey) {
			r.Skipping = append(r.Skipping, name)
		}
		if n := t.maxInFlight(); n != 0 {
			if r.TopicMaxInFlight == nil {
				r.TopicMaxInFlight = map[string]int{}
			}
			r.TopicMaxInFlight[name] = n
		}
	}
	return r
}

// WorkerOptions returns the SDK worker options the worker section asks for.
func (w Worker) WorkerOptions() sdkworker.Options {
	o := sdkworker.Options{
		WorkerStopTimeout:                  time.Duration(w.StopTimeout),
		MaxConcurrentActivityExecutionSize: w.MaxConcurrentActivities,
		// The first attempts run as local activities: the same cap on the downstream.
		MaxConcurrentLocalActivityExecutionSize: w.MaxConcurrentActivities,
		MaxConcurrentWorkflowTaskPollers:        w.WorkflowTaskPollers,
		MaxConcurrentActivityTaskPollers:        w.ActivityTaskPollers,
	}
	if w.AutoscalePollers {
		o.WorkflowTaskPollerBehavior = sdkworker.NewPollerBehaviorAutoscaling(sdkworker.PollerBehaviorAutoscalingOptions{})
		o.ActivityTaskPollerBehavior = sdkworker.NewPollerBehaviorAutoscaling(sdkworker.PollerBehaviorAutoscalingOptions{})
	}
	return o
}
