// Package kafkasink is the outbox's Kafka sink (sink: kafka): it produces each message as
// a record to a Kafka topic and returns when the partition's in-sync replicas have it
// (acks=all).
//
// # Records
//
// The record's key is the message's ordering key, or its message ID when it has none, so
// the default partitioner (a hash of the key, as Kafka's own clients compute it) sends
// every message of one ordering key to one partition, where consumers read them in the
// order the outbox sent them. The value is the payload (JSON); the timestamp is the
// message's creation time; the metadata travels as record headers (see package sinks),
// with Content-Type: application/json.
//
// # Duplicates
//
// The producer is idempotent: the brokers drop a batch the client resends within its
// producer session, so the client's own retries never duplicate a record. A resend by the
// outbox after an ambiguous failure (no acknowledgement before the attempt's deadline) is
// a new record, which may duplicate one the cluster did write: consumers de-duplicate by
// the Outbox-Message-Id header.
//
// The sink never creates topics: a topic that does not exist is reported by Open (when
// the topic is the same for every message) and fails the message permanently.
package kafkasink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/sinks"
)

// DefaultTopic is the topic template when none is configured: the outbox topic's name.
const DefaultTopic = "{topic}"

// UnknownTopicRetries is how many metadata look-ups the client makes for a topic the
// cluster does not know before it fails the records produced to it, so a missing topic
// fails the message instead of holding it until the attempt times out.
const UnknownTopicRetries = 3

// Sink produces a topic's messages to Kafka. It implements delivery.Handler,
// delivery.Opener and io.Closer; its methods are safe for concurrent use.
type Sink struct {
	brokers []string
	topic   sinks.Template
	headers map[string]string
	opts    []kgo.Opt

	mu     sync.RWMutex
	client *kgo.Client
	closed bool
}

// Config is a kafka topic's sink settings: the keys of a topic with sink: kafka.
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Topic is the Kafka topic, a template over {topic}, {message_id} and
	// {ordering_key}. Defaults to "{topic}".
	Topic string
	// Headers are added to every record.
	Headers map[string]string
	// Username and Password authenticate with SASL/PLAIN. Optional.
	Username string
	Password string
	// TLS secures the connections; TLS.Enabled turns it on with the system's roots.
	// Optional.
	TLS sinks.TLSFiles
	// AllowPlaintextAuth lets a password go without TLS. Defaults to false.
	AllowPlaintextAuth bool
}

// New returns the sink of a topic's settings: Brokers (required), Topic (default
// "{topic}"), Headers, Username and Password (SASL/PLAIN), TLS. It checks the settings and
// reads the TLS files, but does not connect; Open does. The outbox topic is not needed:
// each message carries its own.
//
// SASL/PLAIN sends the password as it is: without TLS, anyone on the path can read it, so
// New refuses a username without TLS unless AllowPlaintextAuth is set.
func New(_ string, cfg Config) (delivery.Handler, error) {
	if err := checkBrokers(cfg.Brokers); err != nil {
		return nil, err
	}
	tmpl, err := sinks.ParseTemplate(cmp.Or(cfg.Topic, DefaultTopic))
	if err != nil {
		return nil, fmt.Errorf("topic: %w", err)
	}
	if tmpl.Static() {
		if err := checkTopicName(tmpl.String()); err != nil {
			return nil, fmt.Errorf("topic: %w", err)
		}
	}
	if err := sinks.KafkaReserved.CheckConfig(cfg.Headers); err != nil {
		return nil, err
	}
	s := &Sink{brokers: slices.Clone(cfg.Brokers), topic: tmpl, headers: cfg.Headers}
	s.opts = []kgo.Opt{
		kgo.SeedBrokers(s.brokers...),
		kgo.ClientID("outbox"),
		// Send waits for the acknowledgement, one message of an ordering key at a time:
		// waiting for more records to fill a batch would only delay it. Records of other
		// keys still share a request while one is in flight.
		kgo.ProducerLinger(0),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.UnknownTopicRetries(UnknownTopicRetries),
		// Other retries are bounded by each attempt's context (see Send).
	}
	switch {
	case cfg.Username != "" && cfg.Password != "":
		s.opts = append(s.opts, kgo.SASL(plain.Auth{User: cfg.Username, Pass: cfg.Password}.AsMechanism()))
	case cfg.Username != "":
		return nil, errors.New("password: must be set with username, for SASL/PLAIN")
	case cfg.Password != "":
		return nil, errors.New("username: must be set with password, for SASL/PLAIN")
	}
	if cfg.Username != "" && cfg.TLS.IsZero() && !cfg.AllowPlaintextAuth {
		return nil, errors.New("username/password: SASL/PLAIN without tls sends the password in plaintext: set tls (enabled: true, or ca_file) or, for a broker on localhost or a private link, allow_plaintext_auth: true")
	}
	if !cfg.TLS.IsZero() {
		tlsCfg, err := cfg.TLS.Load()
		if err != nil {
			return nil, err
		}
		s.opts = append(s.opts, kgo.DialTLSConfig(tlsCfg))
	}
	return s, nil
}

// checkBrokers checks the brokers setting: one or more host:port.
func checkBrokers(brokers []string) error {
	if len(brokers) == 0 {
		return errors.New("brokers: must list at least one seed broker (host:port)")
	}
	for i, b := range brokers {
		host, port, err := net.SplitHostPort(b)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || strings.ContainsAny(host, "@/") || perr != nil || n < 1 || n > 65535 {
			return fmt.Errorf("brokers[%d]: must be host:port, such as kafka-1:9092, got %q", i, redact.Address(b))
		}
	}
	return nil
}

// legalTopic is what Kafka accepts as a topic name.
var legalTopic = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// checkTopicName refuses a name Kafka would refuse, as a template filled with an unusual
// ordering key may produce.
func checkTopicName(name string) error {
	if !legalTopic.MatchString(name) || name == "." || name == ".." {
		return fmt.Errorf("%q is not a valid Kafka topic name: use 1 to 249 of a-z, A-Z, 0-9, '.', '_' and '-'", name)
	}
	return nil
}

// errClosed is the failure of a Send after Close.
var errClosed = errors.New("the kafka sink is closed")

// connect returns the client, creating it first when needed. Creating it does no I/O:
// the client connects to the brokers when a request needs them.
func (s *Sink) connect() (*kgo.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if s.client != nil {
		return s.client, nil
	}
	cl, err := kgo.NewClient(s.opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka brokers %s: %w", strings.Join(s.brokers, ","), err)
	}
	s.client = cl
	return cl, nil
}

// Open connects to the cluster, so a cluster the worker cannot reach (or authenticate
// to) stops its start, and, when the topic is the same for every message, checks that
// the topic exists.
func (s *Sink) Open(ctx context.Context) error {
	cl, err := s.connect()
	if err != nil {
		return err
	}
	if err := cl.Ping(ctx); err != nil {
		failure := fmt.Errorf("connect to kafka brokers %s: %w", strings.Join(s.brokers, ","), err)
		if errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.UnsupportedSaslMechanism) || errors.Is(err, kerr.IllegalSaslState) {
			return delivery.Permanent(failure) // refused credentials: no retry of Open fixes them
		}
		return failure
	}
	if !s.topic.Static() {
		return nil
	}
	err = checkTopic(ctx, cl, s.topic.String())
	if errors.Is(err, errTopicMissing) {
		return delivery.Permanent(err)
	}
	return err
}

// checkTopic asks the cluster for the topic's metadata, without creating it.
// errTopicMissing is wrapped by checkTopic's error when the cluster does not know the
// topic.
var errTopicMissing = errors.New("no such topic")

func checkTopic(ctx context.Context, cl *kgo.Client, name string) error {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(name)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("kafka: look up topic %q: %w", name, err)
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != name {
			continue
		}
		switch err := kerr.ErrorForCode(t.ErrorCode); {
		case err == nil:
			return nil
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			return fmt.Errorf("kafka topic %q does not exist: create it, or change the sink's topic: %w", name, errTopicMissing)
		default:
			return fmt.Errorf("kafka: look up topic %q: %w", name, err)
		}
	}
	return fmt.Errorf("kafka: look up topic %q: the cluster's answer does not list it", name)
}

// Close closes the client. It does not wait for records still buffered: their Send has
// returned (its attempt ended first) or returns an ambiguous failure now. A Send after
// Close fails, to be retried.
func (s *Sink) Close() error {
	s.mu.Lock()
	cl := s.client
	s.client, s.closed = nil, true
	s.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
	return nil
}

// Send produces the message and waits for the acknowledgement of the partition's in-sync
// replicas.
//
// The client retries on its own until shortly before the attempt's context ends (see
// giveUpBefore), so that its failure is reported within the attempt. A record it gave up
// after sending it may have been written: such failures are ambiguous, as is a record
// still in flight when the context ends.
func (s *Sink) Send(ctx context.Context, d delivery.Message) error {
	topic, err := s.topic.Expand(d)
	if err != nil {
		return err
	}
	if err := checkTopicName(topic); err != nil {
		return delivery.Permanent(fmt.Errorf("topic of message %s: %w", d.MessageID, err))
	}
	rec, err := s.record(ctx, topic, d)
	if err != nil {
		return err
	}

	produceCtx, cancel := giveUpBefore(ctx)
	defer cancel()
	done := make(chan error, 1)
	if err := s.produce(produceCtx, rec, func(_ *kgo.Record, err error) { done <- err }); err != nil {
		return err
	}
	select {
	case err := <-done:
		return s.outcome(ctx, topic, err)
	case <-ctx.Done():
		select {
		case err := <-done:
			return s.outcome(ctx, topic, err)
		default:
		}
		return delivery.Ambiguous(fmt.Errorf("kafka produce to topic %q: no acknowledgement before the attempt ended (%w); the record may still be written",
			topic, context.Cause(ctx)))
	}
}

// SendBatch produces msgs together (the batch lane, delivery.BatchHandler): every record
// is handed to the client at once, which writes them in as few produce requests as their
// partitions allow, and the acknowledgements are awaited together. Each message's outcome
// is classified as Send's; a record not acknowledged before the attempt ends is ambiguous.
func (s *Sink) SendBatch(ctx context.Context, msgs []delivery.Message) []error {
	errs := make([]error, len(msgs))
	produceCtx, cancel := giveUpBefore(ctx)
	defer cancel()
	type pending struct {
		i     int
		topic string
		done  chan error
	}
	var waits []pending
	for i, d := range msgs {
		topic, err := s.topic.Expand(d)
		if err != nil {
			errs[i] = err
			continue
		}
		if err := checkTopicName(topic); err != nil {
			errs[i] = delivery.Permanent(fmt.Errorf("topic of message %s: %w", d.MessageID, err))
			continue
		}
		rec, err := s.record(ctx, topic, d)
		if err != nil {
			errs[i] = err
			continue
		}
		done := make(chan error, 1)
		if err := s.produce(produceCtx, rec, func(_ *kgo.Record, err error) { done <- err }); err != nil {
			errs[i] = err
			continue
		}
		waits = append(waits, pending{i, topic, done})
	}
	for _, w := range waits {
		select {
		case err := <-w.done:
			errs[w.i] = s.outcome(ctx, w.topic, err)
		case <-ctx.Done():
			select {
			case err := <-w.done:
				errs[w.i] = s.outcome(ctx, w.topic, err)
			default:
				errs[w.i] = delivery.Ambiguous(fmt.Errorf("kafka produce to topic %q: no acknowledgement before the attempt ended (%w); the record may still be written",
					w.topic, context.Cause(ctx)))
			}
		}
	}
	return errs
}

// outcome classifies a produce error. A topic the client reports unknown is confirmed
// missing with a metadata request before the failure is permanent: the client may give a
// batch up as unknown-topic after a request whose answer it lost.
func (s *Sink) outcome(ctx context.Context, topic string, err error) error {
	if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
		s.mu.RLock()
		cl := s.client
		s.mu.RUnlock()
		lookup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if cl == nil || !errors.Is(checkTopic(lookup, cl, topic), errTopicMissing) {
			return delivery.Ambiguous(fmt.Errorf("kafka produce to topic %q: %w", topic, err))
		}
	}
	return classify(topic, err)
}

// produce hands rec to the client. The read lock keeps Close from closing the client
// between the check and the hand-over, so a record the closing client fails was in its
// buffer, maybe on the wire.
func (s *Sink) produce(ctx context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) error {
	if _, err := s.connect(); err != nil {
		return delivery.Retryable(err, 0)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return delivery.Retryable(errClosed, 0)
	}
	s.client.Produce(ctx, rec, promise)
	return nil
}

// record builds the Kafka record of d.
func (s *Sink) record(ctx context.Context, topic string, d delivery.Message) (*kgo.Record, error) {
	key := d.OrderingKey
	if key == "" {
		key = d.MessageID
	}
	h, err := sinks.Headers(ctx, d, s.headers, sinks.KafkaReserved)
	if err != nil {
		return nil, err
	}
	h["Content-Type"] = "application/json"
	headers := make([]kgo.RecordHeader, 0, len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(h[k])})
	}
	return &kgo.Record{
		Topic:     topic,
		Key:       []byte(key),
		Value:     d.Payload,
		Headers:   headers,
		Timestamp: d.CreatedAt,
	}, nil
}

// giveUpBefore returns the context the client produces under: ctx, ending a little before
// ctx's deadline (a fifth of the time left, at most five seconds), so that the client gives
// up a record it never sent while Send can still report so.
func giveUpBefore(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	margin := min(time.Until(deadline)/5, 5*time.Second)
	return context.WithDeadline(ctx, deadline.Add(-margin))
}

// permanentErrs are the broker's answers no retry can fix: the record, the topic or the
// credentials must change first.
var permanentErrs = []error{
	kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.InvalidTimestamp,
	kerr.InvalidTopicException, kerr.PolicyViolation, kerr.UnsupportedForMessageFormat,
	kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed,
	kerr.SaslAuthenticationFailed, kerr.UnsupportedSaslMechanism, kerr.InvalidRequiredAcks,
}

// classify turns the outcome of a produce into a handler error: nil when the replicas
// have the record; otherwise nothing written (retryable), a failure no retry fixes
// (permanent), or written in doubt (ambiguous).
func classify(topic string, err error) error {
	if err == nil {
		return nil
	}
	failure := fmt.Errorf("kafka produce to topic %q: %w", topic, err)
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		// The client looked the topic up UnknownTopicRetries times first; the caller
		// confirms the topic is missing before this is final (see Send).
		return delivery.Permanent(fmt.Errorf("kafka topic %q does not exist: create it, or change the sink's topic (%w)", topic, err))
	case slices.ContainsFunc(permanentErrs, func(p error) bool { return errors.Is(err, p) }):
		return delivery.Permanent(failure)
	case errors.Is(err, kerr.RequestTimedOut), errors.Is(err, kerr.NotEnoughReplicasAfterAppend):
		// The leader may have appended the record before it gave up on the replicas.
		return delivery.Ambiguous(failure)
	case errors.Is(err, kgo.ErrMaxBuffered), errors.Is(err, kgo.ErrAborting):
		// Refused before the record was buffered.
		return delivery.Retryable(failure, 0)
	default:
		// The client gave the record up (a timeout, its retries ran out, a broker error
		// after a request whose answer was lost, the client closed under it): the client
		// cannot always tell whether an earlier request wrote it, so it may have.
		return delivery.Ambiguous(failure)
	}
}
