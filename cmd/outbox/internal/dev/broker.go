//go:build !nodev

package dev

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-go/outbox/cmd/outbox/internal/demo"
	"github.com/outbox-go/outbox/internal/redact"
)

// startBroker makes the NATS server at --nats-url usable for the demo's broker topic:
// when nothing answers there and the URL is a local one, it starts nats-server (from PATH
// or /usr/sbin) with JetStream, its store in the dev folder. It then makes sure the demo's
// stream exists and logs each message that arrives on it, so the summary and the log show
// the round trip.
func (s *session) startBroker(ctx context.Context) error {
	nc, err := nats.Connect(s.o.NATSURL, nats.Name("outbox dev"), nats.MaxReconnects(-1))
	if err != nil {
		if err = s.startNATSServer(); err != nil {
			return err
		}
		if nc, err = nats.Connect(s.o.NATSURL, nats.Name("outbox dev"), nats.MaxReconnects(-1)); err != nil {
			return fmt.Errorf("--broker nats: connect to %s: %w", redact.URL(s.o.NATSURL), err)
		}
	}
	s.stops = append(s.stops, nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: demo.DemoStream, Subjects: []string{demo.DemoSubjects}, MaxAge: 24 * time.Hour})
	if err != nil {
		return fmt.Errorf("--broker nats: create the stream %s on %s (is JetStream on? nats-server -js): %w", demo.DemoStream, redact.URL(s.o.NATSURL), err)
	}
	// The demo's consumer: it reads what arrives from now on and logs it.
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		s.logger.Info("Demo NATS consumer: message arrived", "subject", m.Subject(),
			"message_id", m.Headers().Get(jetstream.MsgIDHeader), "payload", string(m.Data()))
	})
	if err != nil {
		return err
	}
	s.stops = append(s.stops, cc.Stop)
	s.show("NATS", "%s  stream %s (%s); watch: nats sub '%s' --server %s",
		redact.URL(s.o.NATSURL), demo.DemoStream, demo.DemoSubjects, demo.DemoSubjects, redact.URL(s.o.NATSURL))
	return nil
}

// startNATSServer starts a private NATS server with JetStream on --nats-url's port, when
// that URL is on this machine and nats-server is installed.
func (s *session) startNATSServer() error {
	host, port, ok := localNATS(s.o.NATSURL)
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server"
	}
	if _, statErr := exec.LookPath(bin); !ok || statErr != nil {
		return fmt.Errorf("--broker nats: no NATS server answers at %s; start one with JetStream (nats-server -js, or apt-get install nats-server) or give its address with --nats-url", redact.URL(s.o.NATSURL))
	}
	dir := filepath.Join(s.o.Dir, "nats")
	cmd := exec.Command(bin, "-a", host, "-p", strconv.Itoa(port), "-js", "-sd", dir, "-l", filepath.Join(s.o.Dir, "nats.log"))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("--broker nats: start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.stops = append(s.stops, func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-exited:
			return errors.New("--broker nats: nats-server exited at start; see " + s.path("nats.log"))
		default:
		}
		if nc, err := nats.Connect(s.o.NATSURL); err == nil {
			nc.Close()
			s.show("NATS server", "pid %d, JetStream store in %s, log %s", cmd.Process.Pid, s.path("nats"), s.path("nats.log"))
			return nil
		}
	}
	return errors.New("--broker nats: nats-server did not answer within 15s; see " + s.path("nats.log"))
}

// localNATS returns the host and port of a nats:// URL on this machine.
func localNATS(raw string) (host string, port int, ok bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "nats" {
		return "", 0, false
	}
	port, err = strconv.Atoi(u.Port())
	host = u.Hostname()
	return host, port, err == nil && (host == "127.0.0.1" || host == "localhost")
}
