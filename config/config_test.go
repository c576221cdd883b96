package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/webhook"
	"github.com/outbox-go/outbox/workflows"
)

const full = `
database_url: postgres://app@db:5432/app
schema: outbox
search_attributes: false
temporal:
  address: temporal:7233
  namespace: orders
  task_queue: outbox-orders
relay:
  batch_size: 50
  poll_interval: 500ms
  lease: 20s
topics:
  order.created:
    sink: http
    url: http://inventory:8080/events
    check_url: http://inventory:8080/events/{message_id}
    max_attempts: 6
    initial_interval: 2s
    backoff: 3
    max_interval: 30s
    timeout: 5s
    first_attempt: activity
default:
  url: http://fallback:8080/events
`

func TestParse(t *testing.T) {
	t.Parallel()

	t.Run("Full", func(t *testing.T) {
		t.Parallel()
		c, err := config.Parse(strings.NewReader(full))
		require.NoError(t, err)
		d := c.WithDefaults()
		require.NoError(t, d.Validate())
		require.False(t, d.SearchAttributesEnabled())
		require.Equal(t, "outbox-orders", d.Temporal.TaskQueue)
		require.Equal(t, 500*time.Millisecond, time.Duration(d.Relay.PollInterval))
		require.Equal(t, 16, d.Relay.StartConcurrency)
		require.Equal(t, workflows.Policy{MaxAttempts: 6, InitialInterval: 2 * time.Second, BackoffCoefficient: 3, MaxInterval: 30 * time.Second, SendTimeout: 5 * time.Second, MarkSentTimeout: 10 * time.Minute, FirstAttempt: workflows.FirstAttemptActivity},
			d.Policy("order.created"))
		require.Equal(t, workflows.Policy{}.WithDefaults(), d.Policy("order.unknown"), "the default entry sets no policy")
		_, ok := d.TopicConfig("order.unknown")
		require.True(t, ok)
	})

	t.Run("EnvironmentOverridesFile", func(t *testing.T) {
		t.Parallel()
		c, err := config.Parse(strings.NewReader(full))
		require.NoError(t, err)
		env := map[string]string{"DATABASE_URL": "postgres://other/db", "TEMPORAL_ADDRESS": "t2:7233", "TEMPORAL_NAMESPACE": "ns2", "OUTBOX_TASK_QUEUE": "q2"}
		c.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		require.Equal(t, "postgres://other/db", c.DatabaseURL)
		require.Equal(t, "t2:7233", c.Temporal.Address)
		require.Equal(t, "ns2", c.Temporal.Namespace)
		require.Equal(t, "q2", c.Temporal.TaskQueue)
	})

	t.Run("EmptyFileGivesDefaults", func(t *testing.T) {
		t.Parallel()
		c, err := config.Parse(strings.NewReader(""))
		require.NoError(t, err)
		d := c.WithDefaults()
		require.NoError(t, d.Validate())
		require.True(t, d.SearchAttributesEnabled())
		require.Equal(t, "127.0.0.1:7233", d.Temporal.Address)
		require.Equal(t, "outbox", d.Temporal.TaskQueue)
		_, ok := d.TopicConfig("x")
		require.False(t, ok)
	})

	t.Run("ErrorsNameFieldAndValue", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ yaml, want string }{
			{"relay: {batch_size: 0}\n", ""}, // zero means default
			{"relay: {batch_size: -5}\n", "relay.batch_size: must be between 1 and 10000, got -5"},
			{"relay: {poll_interval: 5}\n", `relay.poll_interval: line 1: want a duration such as "1s" or "1m30s", got "5"`},
			{"relay: {poll_interval: fast}\n", `relay.poll_interval: line 1: want a duration such as "1s" or "1m30s", got "fast"`},
			{"topics:\n  a:\n    url: 'http://x'\n    timeout: [1]\n", `topics["a"].timeout: line 4: want a duration such as "1s" or "1m30s", got a list`},
			{"relay: {lease: 100ms}\n", "relay.lease: must be at least 1s, got 100ms"},
			{"relay: {start_concurrency: 2000}\n", "relay.start_concurrency: must be between 1 and 1000, got 2000"},
			{"relay: {reconcile_interval: 5ms}\n", "relay.reconcile_interval: must be at least 10ms, got 5ms"},
			{"relay: {wakeup: often}\n", `relay.wakeup: must be "poll" or "notify", got "often"`},
			{"topics: {a: {url: 'http://x', max_in_flight: -2}}\n", `topics["a"].max_in_flight: must be at least 1, or -1 for no limit (unset: relay.max_in_flight_per_topic), got -2`},
			{"relay: {max_in_flight_per_topic: -7}\n", `relay.max_in_flight_per_topic: must be at least 1, or -1 for no limit, got -7`},
			{"schema: Bad-Schema\n", `got "Bad-Schema"`},
			// What a process would refuse when it connects or listens, refused here too, so
			// that outbox config check finds it.
			{"database_url: 'postgres://u:s3cr%zzet@127.0.0.1/db'\n", `database_url: cannot parse`},
			{"database_url: 'host=127.0.0.1 port=abc dbname=app'\n", `database_url: cannot parse`},
			{"temporal: {address: 'http://127.0.0.1:7233'}\n", `temporal.address: must be the frontend's gRPC host:port, without http://, got "http://127.0.0.1:7233"`},
			{"temporal: {address: 'temporal'}\n", `temporal.address: must be host:port with a port from 1 to 65535, got "temporal"`},
			{"temporal: {address: 'dns:///temporal-frontend:7233'}\n", ""},
			{"metrics: {address: '127.0.0.1:99999'}\n", `metrics.address: must be host:port with a port from 0 to 65535, got "127.0.0.1:99999"`},
			{"metrics: {address: ':9090'}\n", ""},
			{"topics: {a: {url: 'not a url'}}\n", `topics["a"].url: must be an absolute http or https URL, got "(unparsable URL)"`},
			{"topics: {a: {url: 'http://x', check_url: 'http://x/check'}}\n", `topics["a"].check_url: must contain {message_id}, got "http://x/check"`},
			{"topics: {a: {sink: sqs}}\n", `topics["a"].sink: must be one of http, nats, rabbitmq, kafka, got "sqs"`},
			{"topics: {a: {sink: kafka}}\n", `topics["a"].brokers: must list at least one seed broker (host:port)`},
			{"topics: {a: {sink: kafka, brokers: [k]}}\n", `topics["a"].brokers[0]: must be host:port, got "k"`},
			{"topics: {a: {sink: kafka, url: 'http://k', brokers: ['k:9092']}}\n", `topics["a"].url: is not a setting of sink kafka`},
			{"topics: {a: {sink: kafka, brokers: ['k:9092'], topic: '{nope}'}}\n", `topics["a"].topic: unknown placeholder {nope}`},
			{"topics: {a: {sink: nats}}\n", `topics["a"].url: must be set: the NATS server's URL`},
			{"topics: {a: {sink: nats, url: 'nats://u:hunter2@h:1,amqp://h'}}\n", `topics["a"].url: must be nats://host:port or tls://host:port (several separated by commas), got "nats://h:1,amqp://h"`},
			{"topics: {a: {sink: nats, url: 'nats://h:4222', exchange: x}}\n", `topics["a"].exchange: is a setting of sink rabbitmq, not of sink nats`},
			{"topics: {a: {sink: nats, url: 'nats://h:4222', subject: 'a.{message}'}}\n", `topics["a"].subject: unknown placeholder {message}`},
			{"topics: {a: {sink: rabbitmq, url: 'http://h'}}\n", `topics["a"].url: must be an amqp:// or amqps:// URL with a host, got "http://h"`},
			{"topics: {a: {sink: rabbitmq, url: 'amqp://h', subject: s}}\n", `topics["a"].subject: is a setting of sink nats, not of sink rabbitmq`},
			{"topics: {a: {sink: rabbitmq, url: 'amqp://h', password: hunter2}}\n", `topics["a"].password: must be env:NAME or file:PATH`},
			// A reference's form is checked; the secret is read by the worker only.
			{"topics: {a: {sink: rabbitmq, url: 'amqp://h', username: u, password: 'env:OUTBOX_TEST_UNSET_VARIABLE'}}\n", ""},
			{"topics: {a: {sink: rabbitmq, url: 'amqp://h', username: u, password: 'env:1X'}}\n", `topics["a"].password: env:1X: "1X" is not an environment variable name`},
			{"topics: {a: {url: 'http://x', headers: {Authorization: 'env:'}}}\n", `topics["a"].headers["Authorization"]: must be env:NAME or file:PATH`},
			{"topics: {a: {url: 'http://x', headers: {Authorization: 'env:OUTBOX_TEST_UNSET_VARIABLE'}}}\n", ""},
			{"topics: {a: {sink: rabbitmq, url: 'amqp://h', routing_key: 'k', signing_secrets: ['env:X']}}\n", `topics["a"].signing_secrets: is a setting of sink http, not of sink rabbitmq`},
			{"topics: {a: {url: 'http://x', signing_secrets: [whsec_abc]}}\n", `topics["a"].signing_secrets[0]: must be env:NAME or file:PATH`},
			{"topics: {a: {url: 'http://x', signing_secrets: ['file:/nonexistent/secret']}}\n", ""},
			{"topics: {a: {url: 'https://x', tls: {ca_file: /nonexistent/ca.pem}}}\n", ""},
			{"topics: {a: {url: 'https://x', tls: {cert_file: c.pem}}}\n", `topics["a"].tls: cert_file and key_file go together`},
			{"topics: {a: {url: 'HTTP://x/hook', tls: {server_name: x}}}\n", `topics["a"].tls: is set, but url http://x does not use TLS`},
			{"topics: {a: {url: 'https://x/hook', check_url: 'http://x/{message_id}'}}\n", `topics["a"].check_url: must use https as url does, got http://x`},
			{"topics: {a: {url: 'https://x/hook', check_url: 'https://y/{message_id}', tls: {server_name: x}}}\n", `topics["a"].check_url: must be on url's host x when tls is set, got https://y`},
			{"topics: {a: {url: 'https://user:s3cr%zzet@host/x'}}\n", `topics["a"].url: must be an absolute http or https URL, got "https://host"`},
			{"topics: {a: {sink: kafka, brokers: ['k:9092'], username: u, password: 'env:P'}}\n", `topics["a"].username/password: SASL/PLAIN without tls sends the password in plaintext`},
			{"topics: {a: {sink: kafka, brokers: ['k:9092'], username: u, password: 'env:P', allow_plaintext_auth: true}}\n", ""},
			{"topics: {a: {sink: kafka, brokers: ['k:9092'], username: u, password: 'env:P', tls: {enabled: true}}}\n", ""},
			{"topics: {a: {sink: nats, url: 'nats://h:4222', allow_plaintext_auth: true}}\n", `topics["a"].allow_plaintext_auth: is a setting of sink kafka, not of sink nats`},
			{"topics: {a: {sink: nats, url: 'nats://h:4222', headers: {Nats-Rollup: sub}}}\n", `topics["a"].headers: header "Nats-Rollup": the nats sink reserves Nats-* headers`},
			{"topics: {a: {sink: rabbitmq, url: 'amqp://h', headers: {cc: [q]}}}\n", "cannot unmarshal"},
			{"topics: {a: {sink: rabbitmq, url: 'amqp://h', headers: {CC: q}}}\n", `topics["a"].headers: header "CC": the rabbitmq sink reserves it`},
			{"topics: {a: {sink: rabbitmq, url: 'amqp://h', headers: {X-Team: q, x-delay: '5'}}}\n", `topics["a"].headers: header "x-delay": the rabbitmq sink reserves x-* headers`},
			{"topics: {a: {sink: kafka, brokers: ['k:9092'], headers: {outbox-topic: t}}}\n", `topics["a"].headers: header "outbox-topic": Outbox-* headers are set by the outbox`},
			{"topics: {a: {url: 'http://x', tls: {ca: x}}}\n", "field ca not found"},
			{"topics: {a: {url: 'http://u:p@x/hook?k=secret', tls: {server_name: x}}}\n", `topics["a"].tls: is set, but url http://x does not use TLS: use https://`},
			{"topics: {a: {sink: nats, url: 'nats://h:4222', options: {k: v}}}\n", `topics["a"].options: are for the sinks a worker registers, not for sink nats`},
			{"topics: {a: {sink: kafka, brokers: ['k:9092'], username: u}}\n", `topics["a"].password: must be set with username`},
			{"topics: {a: {sink: nats, url: 'nats://h:4222', headers: {'a b': c}}}\n", `topics["a"].headers: "a b" is not a header name NATS carries`},
			{"topics: {a: {url: 'http://x', max_attempts: 500}}\n", `topics["a"].max_attempts: must be between 1 and 101 (unset: 12), got 500`},
			{"topics: {a: {url: 'http://x', backoff: 0.5}}\n", `topics["a"].backoff: must be at least 1, got 0.5`},
			{"topics: {a: {url: 'http://x', backoff: .inf}}\n", `topics["a"].backoff: must be a finite number of at least 1, got +Inf`},
			{"topics: {a: {url: 'http://x', backoff: .nan}}\n", `topics["a"].backoff: must be a finite number of at least 1, got NaN`},
			{"topics: {a: {url: 'http://x', first_attempt: eager}}\n", `topics["a"].first_attempt must be local or activity, got "eager"`},
			{"topics: {a: {activity: A, task_queue: q, first_attempt: local}}\n", `topics["a"].first_attempt: must be empty for a topic delivered by activity A, got "local"`},
			{"topics: {a: {url: 'http://x', initial_interval: 1m, max_interval: 1s}}\n", `topics["a"].max_interval must be at least initial_interval (1m0s), got 1s`},
			{"topics: {'Bad Topic': {url: 'http://x'}}\n", `topics["Bad Topic"]: topic name must match`},
			{"default: {url: ftp://x}\n", `default.url: must be an absolute http or https URL, got "ftp://x"`},
			{"relay: {batchsize: 5}\n", "field batchsize not found"},
			{"topics: {a: {workflow: W, task_queue: q, signal: paid, workflow_id_reuse: reject_duplicate}}\n", `topics["a"].workflow_id_reuse reject_duplicate cannot go with signal paid`},
			{"topics: {a: {workflow: W, task_queue: q, signal: paid}}\n", ""},
			{"topics: {a: {url: 'http://x', lane: batch}}\n", ""},
			{"topics: {a: {sink: nats, url: 'nats://h:4222', lane: batch, batch: {size: 500, wait: 1s, concurrency: 4}}}\n", ""},
			{"topics: {a: {url: 'http://x', lane: bulk}}\n", `topics["a"].lane: must be message or batch, got "bulk"`},
			{"topics: {a: {activity: A, task_queue: q, lane: batch}}\n", `topics["a"].lane: batch needs a sink in the outbox's worker; activity A delivers one message per attempt`},
			{"topics: {a: {workflow: W, task_queue: q, lane: batch}}\n", `topics["a"].lane: batch needs a sink in the outbox's worker; workflow W is started once per message`},
			{"topics: {a: {url: 'http://x', batch: {size: 10}}}\n", `topics["a"].batch: applies to lane: batch only, and the lane is message`},
			{"topics: {a: {url: 'http://x', lane: batch, batch: {size: 5000}}}\n", `topics["a"].batch.size: must be between 1 and 1000 (unset: 100), got 5000`},
			{"topics: {a: {url: 'http://x', lane: batch, batch: {wait: 1m}}}\n", `topics["a"].batch.wait: must be between 0s and 10s (unset: 200ms), got 1m0s`},
			{"topics: {a: {url: 'http://x', lane: batch, batch: {concurrency: -1}}}\n", `topics["a"].batch.concurrency: must be between 1 and 256 (unset: 16), got -1`},
			{"default: {url: 'http://x', lane: batch}\n", ""},
			{"topics: {a: {nexus: {endpoint: orders, service: s, operation: deliver, check_operation: delivered, timeout: 10s}}}\n", ""},
			{"topics: {a: {nexus: {endpoint: orders, operation: deliver}}}\n", `topics["a"].nexus.service must name the Nexus service behind endpoint orders, got an empty name`},
			{"topics: {a: {nexus: {endpoint: orders, service: s, operation: deliver}, url: 'http://x'}}\n", `topics["a"].url: must be empty for a topic delivered by Nexus operation orders/s/deliver, got "http://x"`},
			{"topics: {a: {nexus: {endpoint: orders, service: s, operation: deliver}, activity: A}}\n", `topics["a"].activity: must be empty for a topic delivered by Nexus operation orders/s/deliver, got "A"`},
			{"topics: {a: {nexus: {endpoint: orders, service: s, operation: deliver}, lane: batch}}\n", `topics["a"].lane: must be empty for a topic delivered by Nexus operation`},
			{"topics: {a: {nexus: {endpoint: e, service: s, operation: o, timeout: -1s}}}\n", `topics["a"].nexus.timeout must be positive, got -1s`},
			{"topics: {a: {nexus: {endpoint: e, service: s, operation: o, tiemout: 1s}}}\n", "field tiemout not found"},
			{"topics: {a: {url: 'http://x', headers: {'X Bad': v}}}\n", `topics["a"].headers["X Bad"]: is not an HTTP header name`},
			{"topics: {a: {url: 'http://x', headers: {X-Key: \"k=secret\\r\\nX-Other: 1\"}}}\n", `topics["a"].headers["X-Key"]: the value holds a control character`},
			{"topics: {a: {sink: nats, url: 'nats://h:4222', subject: 'orders.>'}}\n", `topics["a"].subject: "orders.>" (for topic "a") cannot be published to: a subject cannot contain white space, * or >`},
			{"topics: {a: {sink: nats, url: 'nats://h:4222', subject: 'orders..{ordering_key}'}}\n", `topics["a"].subject: "orders..{ordering_key}" (for topic "a") cannot be published to: a subject cannot have an empty token`},
			{"topics: {a..b: {sink: nats, url: 'nats://h:4222'}}\n", `topics["a..b"].subject: "{topic}" (for topic "a..b") cannot be published to`},
			{"default: {sink: nats, url: 'nats://h:4222', subject: 'events.{topic}'}\ntopics: {a: {url: 'http://x'}}\n", ""},
			// A team's handler uses none of the sinks' keys: one set would be ignored.
			{"topics: {a: {activity: Reserve, task_queue: inv, headers: {X-Tenant: t}}}\n", `topics["a"].headers: is a setting of the outbox's sinks; activity Reserve delivers this topic`},
			{"topics: {a: {workflow: Fulfil, task_queue: f, password: hunter2}}\n", `topics["a"].password: is a setting of the outbox's sinks; workflow Fulfil delivers this topic`},
			{"topics: {a: {activity: Reserve, task_queue: inv, brokers: [nope], routing_key: '{bogus}'}}\n", `topics["a"].routing_key: is a setting of the outbox's sinks`},
			{"topics: {a: {nexus: {endpoint: e, service: s, operation: o}, subject: s}}\n", `topics["a"].subject: is a setting of the outbox's sinks; Nexus operation e/s/o delivers this topic`},
			{"topics: {a: {nexus: {endpoint: e, service: s, operation: o}, workflow_id: 'x-{message_id}'}}\n", `topics["a"].start_to_close/schedule_to_start/workflow_id/workflow_id_reuse/signal: are for a topic delivered by an activity or a workflow, not by Nexus operation`},
			{"codec: {active: k1}\n", `codec.active: names key "k1", but no key is configured: list it under codec.keys (or set OUTBOX_CODEC_KEY)`},
			// A second document would be ignored, its typos and topics with it.
			{"schema: a\n---\nschema: b\nbogus_key: 1\n", "line 2: a second YAML document (after ---); the config is one document"},
			{"schema: a\n---\n", ""},
		} {
			c, err := config.Parse(strings.NewReader(tc.yaml))
			if err == nil {
				d := c.WithDefaults()
				err = d.Validate()
			}
			if tc.want == "" {
				require.NoError(t, err, tc.yaml)
				continue
			}
			require.Error(t, err, tc.yaml)
			require.Contains(t, err.Error(), tc.want, tc.yaml)
			for _, secret := range []string{"s3cr", "hunter2", "hook", "k=secret"} {
				require.NotContains(t, err.Error(), secret, tc.yaml)
			}
		}
	})

	t.Run("NexusTopic", func(t *testing.T) {
		t.Parallel()
		c, err := config.Parse(strings.NewReader("topics: {payments.refund: {timeout: 8s, nexus: {endpoint: payments, service: outbox, operation: refund, check_operation: refunded}}}\n"))
		require.NoError(t, err)
		d := c.WithDefaults()
		require.NoError(t, d.Validate())
		p := d.Policy("payments.refund")
		require.Equal(t, &workflows.NexusHandler{Endpoint: "payments", Service: "outbox", Operation: "refund", CheckOperation: "refunded", Timeout: 8 * time.Second}, p.Nexus)
		// The outbox's worker has no handler to build for it.
		reg, err := d.Registry(nil)
		require.NoError(t, err)
		require.Empty(t, reg.Topics())
		require.NoError(t, reg.Close())
	})

	t.Run("DefaultDeliveredByTeam", func(t *testing.T) {
		t.Parallel()
		for _, entry := range []string{
			"{activity: Reserve, task_queue: inventory}",
			"{workflow: Fulfil, task_queue: fulfilment}",
			"{nexus: {endpoint: payments, service: outbox, operation: refund}}",
		} {
			c, err := config.Parse(strings.NewReader("default: " + entry + "\ntopics: {a: {url: 'http://127.0.0.1:1/hook'}}\n"))
			require.NoError(t, err, entry)
			d := c.WithDefaults()
			require.NoError(t, d.Validate(), entry)
			// An unlisted topic is delivered by the team's handler, not by one built here.
			reg, err := d.Registry(nil)
			require.NoError(t, err, entry)
			require.Equal(t, []string{"a"}, reg.Topics(), entry)
			_, ok := reg.Lookup("unlisted")
			require.False(t, ok, entry)
			require.NoError(t, reg.Close())
		}
	})

	t.Run("KnownExtraSink", func(t *testing.T) {
		t.Parallel()
		c, err := config.Parse(strings.NewReader("topics: {a: {sink: sqs, options: {queue: 'q'}}}\n"))
		require.NoError(t, err)
		d := c.WithDefaults()
		require.NoError(t, d.Validate("sqs"))
		// A built-in kind's key would not reach it.
		c, err = config.Parse(strings.NewReader("topics: {a: {sink: sqs, options: {queue: 'q'}, subject: s, check_url: 'https://x/{message_id}'}}\n"))
		require.NoError(t, err)
		d = c.WithDefaults()
		err = d.Validate("sqs")
		require.ErrorContains(t, err, `topics["a"].subject: is not passed to sink sqs (it gets url, headers, username, password, tls and options)`)
		require.ErrorContains(t, err, `topics["a"].check_url: is not passed to sink sqs`)
	})

	t.Run("BrokerSinks", func(t *testing.T) {
		t.Parallel()
		c, err := config.Parse(strings.NewReader(`
topics:
  order.created: {sink: nats, url: 'nats://127.0.0.1:4222', subject: 'orders.{ordering_key}'}
  order.paid: {sink: rabbitmq, url: 'amqp://127.0.0.1:5672/', exchange: orders, routing_key: '{topic}'}
  order.shipped: {sink: kafka, brokers: ['127.0.0.1:9092', '127.0.0.2:9092'], topic: 'orders.{topic}'}
`))
		require.NoError(t, err)
		d := c.WithDefaults()
		require.NoError(t, d.Validate())
		// Building the handlers makes no connection: a broker is reached when the worker
		// opens them.
		reg, err := d.Registry(nil)
		require.NoError(t, err)
		require.Equal(t, []string{"order.created", "order.paid", "order.shipped"}, reg.Topics())
		require.NoError(t, reg.Close())
	})
}

func TestWorkerOptions(t *testing.T) {
	t.Parallel()
	c, err := config.Parse(strings.NewReader("worker:\n  workflow_task_pollers: 8\n  activity_task_pollers: 16\n"))
	require.NoError(t, err)
	o := c.WithDefaults().Worker.WorkerOptions()
	require.Equal(t, 8, o.MaxConcurrentWorkflowTaskPollers)
	require.Equal(t, 16, o.MaxConcurrentActivityTaskPollers)
	require.Equal(t, config.DefaultMaxActivities, o.MaxConcurrentActivityExecutionSize)
	require.Equal(t, config.DefaultMaxActivities, o.MaxConcurrentLocalActivityExecutionSize, "local first attempts count against the same cap")

	c, err = config.Parse(strings.NewReader("worker:\n  autoscale_pollers: true\n"))
	require.NoError(t, err)
	o = c.WithDefaults().Worker.WorkerOptions()
	require.NotNil(t, o.WorkflowTaskPollerBehavior)
	require.NotNil(t, o.ActivityTaskPollerBehavior)

	for _, bad := range []string{"worker:\n  workflow_task_pollers: 1\n", "worker:\n  autoscale_pollers: true\n  activity_task_pollers: 4\n"} {
		c, err := config.Parse(strings.NewReader(bad))
		require.NoError(t, err)
		d := c.WithDefaults()
		require.ErrorContains(t, d.Validate(), "worker.", bad)
	}
}

// TestRelayConfigIsStarters: the file's relay settings become exactly the starter.Config an
// embedded relay gets, with starter's defaults.
func TestRelayConfigIsStarters(t *testing.T) {
	t.Parallel()
	c, err := config.Parse(strings.NewReader("temporal: {task_queue: orders}\nsearch_attributes: false\nrelay: {batch_size: 7, wakeup: notify}\n"))
	require.NoError(t, err)
	d := c.WithDefaults()
	r := d.RelayConfig()
	require.Equal(t, "orders", r.TaskQueue)
	require.Equal(t, 7, r.BatchSize)
	require.Equal(t, starter.WakeupNotify, r.Wakeup)
	require.Equal(t, starter.NotifyPollIntervalDefault, r.PollInterval)
	require.Equal(t, starter.DefaultLease, r.Lease)
	require.Equal(t, starter.DefaultStartConcurrency, r.StartConcurrency)
	require.Equal(t, starter.DefaultSweepInterval, r.SweepInterval)
	require.Equal(t, starter.ReconcilerConfig{After: starter.ReconcileAfterDefault, Interval: starter.ReconcileIntervalDefault}, d.ReconcilerConfig())
	require.True(t, r.NoSearchAttributes)
	require.Equal(t, r.WithDefaults().BatchSize, r.BatchSize)
	require.Equal(t, starter.DefaultMaxInFlightPerTopic, r.WithDefaults().Ordering.MaxInFlight)

	// The limits of messages in flight: the relay's default, and a topic's own.
	c, err = config.Parse(strings.NewReader("relay: {max_in_flight_per_topic: 40}\ntopics:\n  bulk: {url: 'http://x', max_in_flight: 5}\n  any: {url: 'http://x', max_in_flight: -1}\n  plain: {url: 'http://x'}\n"))
	require.NoError(t, err)
	d = c.WithDefaults()
	require.NoError(t, d.Validate())
	r = d.RelayConfig().WithDefaults()
	require.Equal(t, 40, r.MaxInFlightPerTopic)
	for topic, want := range map[string]int{"bulk": 5, "any": 0, "plain": 40, "unlisted": 40} {
		require.Equal(t, want, r.Ordering.InFlightLimit(topic), topic)
	}
	c, err = config.Parse(strings.NewReader("relay: {max_in_flight_per_topic: -1}\n"))
	require.NoError(t, err)
	d = c.WithDefaults()
	require.Zero(t, d.RelayConfig().WithDefaults().Ordering.InFlightLimit("any"), "-1: no limit")
	// A topic of the batch lane has none unless it sets one; the default entry's limit is
	// the topics' not listed.
	c, err = config.Parse(strings.NewReader("default: {url: 'http://x', max_in_flight: 7}\ntopics:\n  batched: {url: 'http://x', lane: batch}\n  capped: {url: 'http://x', lane: batch, max_in_flight: 300}\n"))
	require.NoError(t, err)
	d = c.WithDefaults()
	require.NoError(t, d.Validate())
	r = d.RelayConfig().WithDefaults()
	for topic, want := range map[string]int{"batched": 0, "capped": 300, "unlisted": 7} {
		require.Equal(t, want, r.Ordering.InFlightLimit(topic), topic)
	}
	// A listed topic without a limit of its own keeps the relay's, whatever the default
	// entry's (its own limit, or none for a default entry of the batch lane).
	for _, def := range []string{"{url: 'http://x', max_in_flight: 2}", "{url: 'http://x', lane: batch}"} {
		c, err = config.Parse(strings.NewReader("relay: {max_in_flight_per_topic: 50}\ndefault: " + def + "\ntopics:\n  orders: {url: 'http://x'}\n  bulk: {url: 'http://x', max_in_flight: 5}\n"))
		require.NoError(t, err)
		d = c.WithDefaults()
		require.NoError(t, d.Validate())
		r = d.RelayConfig().WithDefaults()
		unlisted := 2
		if strings.Contains(def, "batch") {
			unlisted = 0
		}
		for topic, want := range map[string]int{"orders": 50, "bulk": 5, "unlisted": unlisted} {
			require.Equal(t, want, r.Ordering.InFlightLimit(topic), "%s with default: %s", topic, def)
		}
	}
	// Without relay.max_in_flight_per_topic, the listed topic keeps the relay's default.
	c, err = config.Parse(strings.NewReader("default: {url: 'http://x', max_in_flight: 2}\ntopics:\n  orders: {url: 'http://x'}\n"))
	require.NoError(t, err)
	d = c.WithDefaults()
	r = d.RelayConfig().WithDefaults()
	require.Equal(t, starter.DefaultMaxInFlightPerTopic, r.Ordering.InFlightLimit("orders"))
	require.Equal(t, 2, r.Ordering.InFlightLimit("unlisted"))
}

// TestAttemptLimitsAgree: a topic's max_attempts and a row's max_retry_times (retries
// after the first attempt) allow the same number of attempts.
func TestAttemptLimitsAgree(t *testing.T) {
	require.Equal(t, store.MaxRetryTimesLimit+1, workflows.MaxAttemptsLimit)
}

// TestSecretsByReference reads signing secrets and a broker password from the environment
// and a file (t.Setenv: not parallel).
func TestSecretsByReference(t *testing.T) {
	dir := t.TempDir()
	secret := webhook.NewSecret()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "old"), []byte(secret+"\n"), 0o600))
	t.Setenv("OUTBOX_TEST_SIGNING_SECRET", webhook.NewSecret())
	t.Setenv("OUTBOX_TEST_BROKER_PASSWORD", "hunter2")
	c, err := config.Parse(strings.NewReader(`
topics:
  a: {url: 'http://x', signing_secrets: ['env:OUTBOX_TEST_SIGNING_SECRET', 'file:` + filepath.Join(dir, "old") + `']}
  b: {sink: rabbitmq, url: 'amqp://h', username: outbox, password: 'env:OUTBOX_TEST_BROKER_PASSWORD'}
`))
	require.NoError(t, err)
	d := c.WithDefaults()
	require.NoError(t, d.Validate())
	a, err := d.Topics["a"].Secrets()
	require.NoError(t, err)
	require.Len(t, a.SigningSecrets, 2)
	key, err := webhook.ParseSecret(secret)
	require.NoError(t, err)
	require.Equal(t, key, a.SigningSecrets[1])
	b, err := d.Topics["b"].Secrets()
	require.NoError(t, err)
	require.Equal(t, "hunter2", b.Password)

	t.Setenv("OUTBOX_TEST_SIGNING_SECRET", "whsec_c2hvcnQ=")
	require.NoError(t, d.Validate(), "validation checks references, not secrets")
	_, err = d.Topics["a"].Secrets()
	require.ErrorContains(t, err, `signing_secrets[0]: a signing secret must hold 24 to 64 bytes, this one holds 5`)
	require.NotContains(t, err.Error(), "c2hvcnQ")
}

// TestSecretsAreReadByTheWorkerOnly: a configuration whose secrets are referenced but not
// set validates (every command can run), and only building the worker's handlers reads
// them, with errors that name the references and never a value.
func TestSecretsAreReadByTheWorkerOnly(t *testing.T) {
	t.Setenv("OUTBOX_TEST_TOKEN", "")
	c, err := config.Parse(strings.NewReader(`
topics:
  a: {url: 'https://x/hook', headers: {Authorization: 'env:OUTBOX_TEST_TOKEN', X-Plain: 'v'}, signing_secrets: ['file:/nonexistent/secret'], tls: {ca_file: /nonexistent/ca.pem}}
  b: {sink: rabbitmq, url: 'amqp://h', username: outbox, password: 'env:OUTBOX_TEST_TOKEN'}
`))
	require.NoError(t, err)
	d := c.WithDefaults()
	require.NoError(t, d.Validate())
	_, err = d.Registry(nil)
	require.Error(t, err)
	for _, want := range []string{
		`topics["a"]: headers["Authorization"]: environment variable OUTBOX_TEST_TOKEN is not set or empty`,
		`topics["a"]: signing_secrets[0]: open /nonexistent/secret`,
		`topics["b"]: password: environment variable OUTBOX_TEST_TOKEN is not set or empty`,
	} {
		require.ErrorContains(t, err, want)
	}

	// Set, the header's reference is replaced by the secret; a literal value stays.
	t.Setenv("OUTBOX_TEST_TOKEN", "Bearer t0ken")
	a, err := d.Topics["a"].Secrets()
	require.Error(t, err, "the signing secret's file is still missing")
	require.Equal(t, "Bearer t0ken", a.Headers["Authorization"])
	require.Equal(t, "v", a.Headers["X-Plain"])
	require.Equal(t, "env:OUTBOX_TEST_TOKEN", d.Topics["a"].Headers["Authorization"], "the configuration keeps the reference")
}

// TestMaxSendsPerTopic: the per-topic send cap defaults to half the worker's activity
// slots, follows max_concurrent_activities, and is refused outside 1..that.
func TestMaxSendsPerTopic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		yaml string
		want int
		err  string
	}{
		{"", 100, ""},
		{"worker: {max_concurrent_activities: 10}\n", 5, ""},
		{"worker: {max_concurrent_activities: 1}\n", 1, ""},
		{"worker: {max_sends_per_topic: 200}\n", 200, ""},
		{"worker: {max_sends_per_topic: 201}\n", 0, "worker.max_sends_per_topic: must be between 1 and worker.max_concurrent_activities (200), got 201"},
		{"worker: {max_sends_per_topic: -1}\n", 0, "worker.max_sends_per_topic: must be between 1 and worker.max_concurrent_activities (200), got -1"},
	} {
		c, err := config.Parse(strings.NewReader("database_url: postgres://localhost/db\n" + tc.yaml))
		require.NoError(t, err, tc.yaml)
		d := c.WithDefaults()
		err = d.Validate()
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.yaml)
			continue
		}
		require.NoError(t, err, tc.yaml)
		require.Equal(t, tc.want, d.Worker.MaxSendsPerTopic, tc.yaml)
	}
}
